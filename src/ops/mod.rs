//! Operations: configuration, running services, stats.

pub mod config;
pub mod run;
