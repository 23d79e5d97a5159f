//! Small pure helpers every layer shares: the one pseudo-random generator
//! ([`rng`]) and the one duration grammar ([`duration`]). No I/O, no
//! dependency on any other module of the crate, so `wire`, `route`, `link`,
//! `ops`, `sim` and `cli` can all use them without an arrow pointing up.

pub mod duration;
pub mod rng;

pub use rng::Rng;
