//! Operations: configuration, running services, stats.

pub mod admin;
pub mod admin_audit;
pub mod admin_auth;
pub mod admin_journal;
pub mod admin_probe;
pub mod admin_serve;
pub mod control;
pub mod data_dir;
pub mod metrics;
pub mod page;
pub mod reload;
pub mod run;
pub mod runtime_state;
pub mod saf;
pub mod status;
