//! Operations: configuration, running services, stats.

pub mod admin;
/// The config layer lives below `link/` (`crate::config`); this path stays for
/// callers that name it here.
pub use crate::config;
pub mod control;
pub mod metrics;
pub mod page;
pub mod reload;
pub mod run;
/// Task supervision lives in `link` (its tasks are link tasks); this path stays.
pub use crate::link::supervisor;
