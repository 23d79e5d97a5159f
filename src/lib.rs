//! isoswitch: a protocol-aware switch for ISO 8583 links.
//!
//! Layers, dependencies pointing downward only (tests/layers.rs fails on a
//! module cycle):
//!
//! - [`wire`]: pure nom parsers for length prefixes, frames and envelopes (TPDU,
//!   CUPS / POS / VISA headers), plus a tokio-util codec on top.
//! - [`iso8583`]: pure spec-driven message layer: specs from `specs/*.toml`, a
//!   zero-copy [`iso8583::Message`] view, full decode/encode and masking.
//! - [`route`]: pure routing logic: balancers, node health, correlation.
//! - [`config`]: the config file's types, loading and validation (pure data;
//!   `link` reads it, so it sits below `link`).
//! - [`link`]: tokio I/O: fronts, node connections, writer tasks, health checks.
//! - [`ops`]: running services: supervisor, admin API, metrics, reload.
//! - [`store`]: the durable store (store-and-forward queue, `meta`), SQLite or
//!   PostgreSQL, written by one group-committing writer.
//! - [`journal`]: the transaction journal: what the message path hands it,
//!   the masked row built off the path, its writer and retention tasks.
//! - [`sim`]: simulators (channel node, POS network controller, load generator).
//! - [`cli`]: the `isoswitch` command line.
//! - [`util`]: the one PRNG and the one duration grammar, below every layer.

pub mod capture;
pub mod cli;
pub mod config;
#[doc(hidden)]
pub mod fuzzing;
pub mod iso8583;
pub mod journal;
pub mod link;
pub mod ops;
pub mod route;
pub mod sim;
pub mod store;
pub mod util;
pub mod wire;
