//! The man pages and shell completions the Debian package ships, generated
//! from the `isoswitch` command line itself (clap), so they never drift from
//! `--help`. `scripts/package.sh` runs it:
//!
//! ```sh
//! cargo run --example package_docs -- target/package-docs
//! ```
//!
//! It writes `man/isoswitch.1` (with FILES and ENVIRONMENT for the packaged
//! layout) and one page per subcommand (`isoswitch-run.1`, ...), and
//! `completions/` for bash, zsh and fish.
//!
//! Why an example and not a hidden `isoswitch manpage` subcommand: the
//! generators (clap_mangen, clap_complete) stay dev-dependencies, out of the
//! switch that runs in production, and CI's `cargo build --all-targets`
//! already builds this example, so packaging costs no extra compile.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

/// What the package lays out that `--help` cannot say.
const FILES_AND_ENVIRONMENT: &str = r#".SH FILES
.TP
\fI/etc/isoswitch/isoswitch.toml\fR
The configuration (a conffile). Every key is described in
\fI/usr/share/doc/isoswitch/config.md\fR.
.TP
\fI/etc/isoswitch/admin-token\fR
The admin API token, root's only (mode 0600), made at install; systemd hands it to the
switch as the credential \fBadmin-token\fR.
.TP
\fI/var/lib/isoswitch\fR
The data directory (mode 0700, user isoswitch): runtime node changes made through the
admin API, kept across reloads and restarts.
.TP
\fI/usr/lib/systemd/system/isoswitch.service\fR
The unit: \fBsystemctl enable \-\-now isoswitch\fR starts it, \fBsystemctl reload isoswitch\fR
re\-reads the configuration.
.SH ENVIRONMENT
.TP
\fBISOSWITCH_LOG\fR
Log filter: error, warn, info (default), debug.
.TP
\fBISOSWITCH_LOG_FORMAT\fR
\fBjson\fR for one JSON object a line; text otherwise.
.TP
\fBISOSWITCH_ADMIN_TOKEN\fR
The admin token when the configuration names no token_file and no credential is given;
also what \fBisoswitch ctl\fR sends.
.TP
\fBISOSWITCH__\fIKEY\fB__\fIPATH\fR
Overrides one configuration key, e.g. \fBISOSWITCH__SERVICE__0__TIMEOUTS__REQUEST=5s\fR.
.TP
\fBSTATE_DIRECTORY\fR
The data directory when neither \fB\-\-data\-dir\fR nor data_dir is given (set by systemd's
StateDirectory=).
.SH SEE ALSO
\fBsystemctl\fR(1), \fBjournalctl\fR(1)
"#;

fn main() -> ExitCode {
    let Some(out) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: package_docs OUT_DIR");
        return ExitCode::FAILURE;
    };
    match generate(&out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("package_docs: {}: {e}", out.display());
            ExitCode::FAILURE
        }
    }
}

fn generate(out: &Path) -> std::io::Result<()> {
    let cmd = isoswitch::cli::Cli::command();
    let man = out.join("man");
    std::fs::create_dir_all(&man)?;
    // A page per subcommand (isoswitch-run.1, isoswitch-sim-node.1, ...) ...
    clap_mangen::generate_to(cmd.clone(), &man)?;
    // ... and the main page again, with the packaged files and the environment.
    // (No `help` subcommand there: it has no page of its own.)
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone().disable_help_subcommand(true)).render(&mut page)?;
    page.extend_from_slice(FILES_AND_ENVIRONMENT.as_bytes());
    std::fs::File::create(man.join("isoswitch.1"))?.write_all(&page)?;

    let completions = out.join("completions");
    std::fs::create_dir_all(&completions)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd.clone(), "isoswitch", &completions)?;
    }
    Ok(())
}
