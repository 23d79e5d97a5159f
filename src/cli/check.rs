//! `isoswitch check`: validate a config (file and environment overrides), print
//! it as the switch would run it, and warn about limits the host cannot give.

use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;
use crate::config::descriptors::{DescriptorNeed, open_file_limit};

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
    // `run` raises the soft limit to the hard one: the hard one is the limit
    // it will run under (here, as LimitNOFILE gives it under systemd).
    match open_file_limit() {
        Ok((_soft, hard)) => {
            if let Some(warning) = DescriptorNeed::of(&cfg).warning(hard) {
                eprintln!("warning: {warning}");
            }
        }
        Err(e) => eprintln!("warning: cannot read the open-file limit: {e}"),
    }
    ExitCode::SUCCESS
}
