//! What a client must pass before its request is taken: a descriptor from
//! the process's budget, a place under its fair share of the service's
//! requests in flight, and the client descriptor its answers go back by.

pub mod budget;
pub mod client;
pub mod share;
