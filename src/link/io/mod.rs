//! A link's bytes, whoever is at the other end: framed reads without a
//! held buffer, the read timers, the writer task and the direct write path,
//! the TLS step and the connection table. Tokio, but nothing here knows the
//! `Service`: these are the pieces a front or a back is built from.

pub mod conns;
pub mod direct;
pub mod frames;
pub mod secure;
pub mod timer;
pub mod writer;
