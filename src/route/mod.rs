//! Pure routing logic (being built).

mod duration;
pub mod health;
pub mod node;
pub mod rng;
