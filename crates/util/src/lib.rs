//! Small pure helpers every layer shares: the one pseudo-random generator
//! ([`rng`]), the one duration grammar ([`duration`]) and the one rule for
//! operator-given names ([`name`]). No I/O, no
//! dependency on any other module of the crate, so `wire`, `route`, `link`,
//! `ops`, `sim` and `cli` can all use them without an arrow pointing up.

#![forbid(unsafe_code)]

pub mod duration;
pub mod name;
pub mod rng;

pub use rng::Rng;
