//! What the demo leaves on disk: its log file, its token and config files
//! and its data directory, each created private to the user. The scenario
//! that runs over them is in [`super`].

use crate::config::Config;

/// Where the switch's log goes during the demo: `isoswitch-demo-PID-SALT.log`
/// in the temp directory, a new file private to the user (its lines are
/// masked, but they are the switch's; never one someone else left there),
/// kept for reading afterwards. Logging is set up for the demo's life and
/// flushed when this is dropped.
pub(super) struct DemoLog {
    pub(super) path: std::path::PathBuf,
    _flush: tracing_appender::non_blocking::WorkerGuard,
}

impl DemoLog {
    pub(super) fn create() -> Result<DemoLog, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let salt = crate::util::rng::entropy_seed() & 0xff_ffff;
        let path = std::env::temp_dir().join(format!(
            "isoswitch-demo-{}-{salt:06x}.log",
            std::process::id()
        ));
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        // INFO by default: the file tells the whole story (sign-ons, drains,
        // the reload), which the screen only summarises.
        let flush = crate::cli::init_logging("info", file, false);
        Ok(DemoLog {
            path,
            _flush: flush,
        })
    }
}

/// The demo's token and config files (the config is what reload reads) and
/// its data directory, fresh for every demo (a demo never inherits the
/// runtime changes of another), removed when the demo ends.
pub(super) struct DemoFiles {
    pub(super) token: std::path::PathBuf,
    pub(super) token_text: String,
    pub(super) config: std::path::PathBuf,
    pub(super) data_dir: std::path::PathBuf,
}

/// Creates `path` for its owner alone (the switch refuses a token others
/// may read) and writes `text` into it.
fn write_owner_only(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?
        .write_all(text.as_bytes())
}

impl DemoFiles {
    pub(super) fn new() -> Result<DemoFiles, String> {
        let dir = std::env::temp_dir();
        let pid = std::process::id();
        let salt = crate::util::rng::entropy_seed();
        // A demo token, not a secret worth a CSPRNG: the listener is loopback.
        let token_text = format!("demo-{pid:x}-{salt:016x}");
        let token = dir.join(format!("isoswitch-demo-{pid}.token"));
        write_owner_only(&token, &token_text).map_err(|e| format!("{}: {e}", token.display()))?;
        // Its own salt: the name is visible to anyone who lists the temp dir.
        let data_dir = dir.join(format!(
            "isoswitch-demo-{pid}-{:016x}",
            crate::util::rng::entropy_seed()
        ));
        Ok(DemoFiles {
            token,
            token_text,
            config: dir.join(format!("isoswitch-demo-{pid}.toml")),
            data_dir,
        })
    }

    pub(super) fn write_config(&self, cfg: &Config) -> Result<(), String> {
        let text = toml::to_string_pretty(cfg).map_err(|e| e.to_string())?;
        std::fs::write(&self.config, text).map_err(|e| format!("{}: {e}", self.config.display()))
    }
}

impl Drop for DemoFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.token);
        let _ = std::fs::remove_file(&self.config);
        // The data dir stays: its journal is the demo's record.
    }
}
