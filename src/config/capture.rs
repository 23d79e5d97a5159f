//! `[service.capture]`: what the switch captures of a service and where,
//! and the checks of that section alone (docs/capture.md).

use serde::{Deserialize, Serialize};

use super::{Config, ConfigError, defaults, invalid, space};

/// `[service.capture]`: what the switch captures of a service and where.
/// See docs/capture.md.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureConfig {
    /// Directory of the pcapng files (created if missing).
    pub directory: std::path::PathBuf,
    #[serde(default = "defaults::capture_enabled")]
    pub enabled: bool,
    /// A file is closed and the next one opened past this size.
    #[serde(default = "defaults::capture_max_file_bytes")]
    pub max_file_bytes: u64,
    /// The oldest files are deleted past this many...
    #[serde(default = "defaults::capture_max_files")]
    pub max_files: usize,
    /// ...or past this many bytes in all.
    #[serde(default = "defaults::capture_max_total_bytes")]
    pub max_total_bytes: u64,
    /// The free space left on the directory's filesystem (none: 10%); under
    /// it the oldest files go, then the capture pauses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_free: Option<space::SpaceLimit>,
    /// Keep PAN, track data, PIN blocks, EMV data and MACs in clear (test
    /// systems only: logged as a warning at start). Only in builds with the
    /// `tools` feature: the production build refuses it ([`CLEAR_NEEDS_TOOLS`]).
    #[serde(default)]
    pub clear: bool,
    /// Notices queued for the writer, and reads/writes a connection direction
    /// stages between two passes of it; past either, copies are dropped and
    /// counted.
    #[serde(default = "defaults::capture_queue")]
    pub queue: usize,
}

/// Why `capture.clear` (and `run --capture-clear`) is refused by a build
/// without the `tools` feature: the production switch never writes card data
/// in clear, whatever its configuration says.
pub const CLEAR_NEEDS_TOOLS: &str = "captures in clear (card data unmasked) are only in builds with the `tools` feature, for test systems; this build (the production one) masks every capture: remove the key";

impl CaptureConfig {
    /// A capture into `directory` with every other setting at its default
    /// (`run --capture DIR`).
    pub fn in_directory(directory: std::path::PathBuf) -> CaptureConfig {
        CaptureConfig {
            directory,
            enabled: true,
            max_file_bytes: defaults::capture_max_file_bytes(),
            max_files: defaults::capture_max_files(),
            max_total_bytes: defaults::capture_max_total_bytes(),
            min_free: None,
            clear: false,
            queue: defaults::capture_queue(),
        }
    }

    /// `run --capture DIR [--capture-clear]`: every service captures into
    /// `directory`, keeping its own `[service.capture]` limits if it has them.
    pub fn apply_to_all(config: &mut Config, directory: &std::path::Path, clear: bool) {
        for svc in &mut config.services {
            let mut c = svc
                .capture
                .take()
                .unwrap_or_else(|| CaptureConfig::in_directory(directory.to_path_buf()));
            c.directory = directory.to_path_buf();
            c.enabled = true;
            c.clear = clear;
            svc.capture = Some(c);
        }
    }

    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.clear && !cfg!(feature = "tools") {
            return Err(invalid(format!("{key}.clear"), CLEAR_NEEDS_TOOLS));
        }
        if self.max_file_bytes < 4096 {
            return Err(invalid(
                format!("{key}.max_file_bytes"),
                "must be at least 4096",
            ));
        }
        if self.max_files == 0 {
            return Err(invalid(format!("{key}.max_files"), "must be at least 1"));
        }
        if self.max_total_bytes < self.max_file_bytes {
            return Err(invalid(
                format!("{key}.max_total_bytes"),
                "must be at least max_file_bytes",
            ));
        }
        if self.queue == 0 {
            return Err(invalid(format!("{key}.queue"), "must be at least 1"));
        }
        if matches!(self.min_free, Some(space::SpaceLimit::Percent(p)) if p >= 10_000) {
            return Err(invalid(
                format!("{key}.min_free"),
                "must be less than 100% (the capture would never write)",
            ));
        }
        Ok(())
    }
}
