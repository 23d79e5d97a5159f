//! The node side of a service: the pool of nodes and their balancing
//! state, the connections kept to each node, their health checks, and the
//! OneConnect pool's per-request connections.

pub mod health;
pub mod node;
pub mod oneconnect_pool;
pub mod pool;
