//! Pure routing logic (being built).

pub mod balancer;
pub mod correlator;
mod duration;
pub mod health;
pub mod node;
pub mod rng;
pub mod rules;
