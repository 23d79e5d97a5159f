//! `isoswitch check`: validate a config (file and environment overrides), print
//! it as the switch would run it, and warn about limits the host cannot give.

use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;

/// Loads, validates and prints `path`; warnings go to stderr.
pub fn run(path: &Path) -> ExitCode {
    let cfg = match Config::load(path) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("isoswitch: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    match toml::to_string_pretty(&cfg.effective()) {
        Ok(text) => println!("{text}"),
        Err(e) => {
            eprintln!("isoswitch: cannot print the config: {e}");
            return ExitCode::FAILURE;
        }
    }
    match rlimit::getrlimit(rlimit::Resource::NOFILE) {
        Ok((soft, _hard)) => {
            if let Some(warning) = cfg.open_files_warning(soft) {
                eprintln!("warning: {warning}");
            }
        }
        Err(e) => eprintln!("warning: cannot read the open-file limit: {e}"),
    }
    ExitCode::SUCCESS
}
