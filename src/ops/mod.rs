//! Operations: configuration, running services, stats.

pub mod admin;
pub mod config;
pub mod control;
pub mod metrics;
pub mod page;
pub mod reload;
pub mod run;
pub mod supervisor;
