//! isoswitch: a protocol-aware switch for ISO 8583 links.
//!
//! Layers, dependencies pointing downward only (tests/layers.rs fails on a
//! module cycle). The four pure ones are crates of their own under
//! `crates/` (no tokio, no I/O: the compiler holds them to it), re-exported
//! here under their module names:
//!
//! - [`wire`]: pure nom parsers for length prefixes, frames and envelopes (TPDU,
//!   CUPS / POS / VISA headers); the tokio-util codec on top is this crate's.
//! - [`iso8583`]: pure spec-driven message layer: specs from `specs/*.toml`, a
//!   zero-copy [`iso8583::Message`] view, full decode/encode and masking
//!   (spec files are read here: [`iso8583::SpecFiles`]).
//! - [`route`]: pure routing logic: balancers, node health, correlation.
//! - [`config`]: the config file's types, loading and validation (pure data;
//!   `link` reads it, so it sits below `link`).
//! - [`link`]: tokio I/O: fronts, node connections, writer tasks, health checks.
//! - [`ops`]: running services: supervisor, admin API, metrics, reload.
//! - [`store`]: the durable store (store-and-forward queue, `meta`), SQLite or
//!   PostgreSQL, written by one group-committing writer.
//! - [`journal`]: the transaction journal: what the message path hands it,
//!   the masked row built off the path, its writer and retention tasks.
//! - `sim`: simulators (channel node, POS network controller, load generator),
//!   with the `tools` feature only (on by default; not in the production build).
//! - [`cli`]: the `isoswitch` command line.
//! - [`util`]: the one PRNG and the one duration grammar, below every layer.

pub mod capture;
pub mod cli;
pub mod config;
mod entropy;
mod framing;
// The fuzz targets' entry points and the in-process rig are test tools: not
// in the production build.
#[cfg(feature = "tools")]
#[doc(hidden)]
pub mod fuzzing;
pub mod journal;
pub mod link;
pub mod ops;
#[cfg(feature = "tools")]
pub mod sim;
mod spec_files;
pub mod store;
pub mod tls;

/// Bytes on the wire: the `isoswitch-wire` crate, and the tokio-util codec
/// the links read and write frames with.
pub mod wire {
    pub use crate::framing::FrameCodec;
    pub use isoswitch_wire::*;
}

/// ISO 8583 messages and specs: the `isoswitch-iso8583` crate, and specs
/// read from files ([`iso8583::SpecFiles`]).
pub mod iso8583 {
    pub use crate::spec_files::SpecFiles;
    pub use isoswitch_iso8583::*;
}

/// Routing decisions: the `isoswitch-route` crate.
pub mod route {
    pub use isoswitch_route::*;
}

/// Durations, names, the PRNG: the `isoswitch-util` crate, and seeds from
/// the clock for processes.
pub mod util {
    pub use isoswitch_util::*;
    /// The PRNG (`isoswitch-util`), and [`rng::entropy_seed`] from the clock.
    pub mod rng {
        pub use crate::entropy::{entropy_seed, rng_from_entropy};
        pub use isoswitch_util::rng::*;
    }
}
