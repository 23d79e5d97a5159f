//! Pure routing logic (being built).

pub mod balancer;
pub mod correlator;
pub mod decline;
mod duration;
pub mod health;
pub mod node;
pub mod rng;
pub mod rules;
pub mod stamp;
