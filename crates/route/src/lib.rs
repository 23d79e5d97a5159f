//! Routing decisions, as pure logic: no sockets, no tasks, no clock of its
//! own (every time is an [`Instant`](std::time::Instant) passed in), no global
//! state, and no randomness but a seeded [`Rng`]. Everything here is
//! unit-tested in microseconds; `link/` does the I/O and asks this module
//! where each message goes.
//!
//! The pieces, in the order a request meets them:
//!
//! - [`rules`]: a [`RuleSet`] may restrict a message (by MTI pattern and field
//!   prefixes) to a subset of the pool's nodes. First match wins; a match binds.
//! - [`node`] and [`health`]: per node, a [`NodeState`] tracks weight,
//!   priority, requests outstanding, [`PeakEwma`] latency and [`Health`]
//!   (admin `Enabled | Drain | Disabled`, connection, active rise/fall checks,
//!   passive ejection with doubling back-off, slow start). A [`NodeView`] is
//!   its `Copy` snapshot at one instant.
//! - [`balancer`]: a [`Balancer`] picks one pickable node among the views
//!   (within the rule's subset), honouring priority groups, by the pool's
//!   [`Algorithm`]: round robin, smooth weighted, least outstanding,
//!   peak-EWMA power of two choices, or sticky rendezvous hashing.
//!   A [`SharedBalancer`] is the same balancer for many threads at once: its
//!   state is atomics, and each node's rarely changing part is a published
//!   [`NodeSnapshot`] (its latency an [`EwmaCell`]), so a pool's picks and
//!   answers take no pool-wide lock (`link::pool`).
//! - [`stamp`]: for UnionPay/VISA links, an [`F37Stamp`] writes the node id
//!   into F37 so any instance can route the answer back ([`StampTable`]).
//! - [`correlator`]: the [`Correlator`] remembers each request in flight under
//!   a [`CorrelationKey`] until it leaves exactly once: answered, expired,
//!   lost with its connection, or cancelled. It refuses in-flight duplicates
//!   and never grows past its capacity, and tells a late response from an
//!   unknown one.
//! - [`decline`]: when the switch answers itself, a [`DeclineReason`] and the
//!   service's [`DeclineCodes`] give the F39 code.
//!
//! A request's life, in calls:
//!
//! ```
//! use std::time::{Duration, Instant};
//! use isoswitch_route::*;
//!
//! let now = Instant::now();
//! let ids: Vec<NodeId> = ["01", "02"].iter().map(|s| s.parse().unwrap()).collect();
//! let mut nodes: Vec<NodeState> = ids
//!     .iter()
//!     .map(|&id| NodeState::new(id, 1, 0, HealthConfig::default(), EwmaConfig::default()))
//!     .collect();
//! for n in &mut nodes {
//!     let _ = n.health_mut().set_connected(true, now);
//! }
//! let mut balancer = Balancer::with_capacity(BalancerConfig::default(), 42, nodes.len());
//! let mut table: Correlator<&str> = Correlator::new(CorrelatorConfig::default());
//! let codes = DeclineCodes::default();
//!
//! // Request in: pick, remember, send.
//! let mut views = Vec::with_capacity(nodes.len());
//! views.extend(nodes.iter().map(|n| n.view(now)));
//! let node = balancer.pick(&views, None).expect("a node is up");
//! let key = CorrelationKey::builder().push(b"TERM0001").push(b"000123").build()?;
//! match table.insert(key, "origin link 7", 1000 + node as u64, now + Duration::from_secs(30)) {
//!     Ok(()) => nodes[node].dispatched(),
//!     Err(r) => assert_eq!(codes.code(r.error.into()), *b"94"),
//! }
//!
//! // Response in: find the origin, record the outcome.
//! let later = now + Duration::from_millis(40);
//! assert_eq!(table.take(&key, later), Ok("origin link 7"));
//! let _ = nodes[node].record_response(true, Duration::from_millis(40), later);
//! # Ok::<(), KeyTooLong>(())
//! ```

#![forbid(unsafe_code)]

pub mod balancer;
pub mod correlator;
pub mod decline;
mod generations;
// Config durations in this layer use the crate's one grammar.
use isoswitch_util::duration;
pub mod health;
pub mod integrity;
pub mod node;
pub mod oneconnect;
pub mod outlier;
pub use isoswitch_util::rng;
pub mod router;
pub mod rules;
pub mod stamp;
pub mod timeouts;

pub use balancer::{Algorithm, Balancer, BalancerConfig, SharedBalancer};
pub use correlator::{
    CorrelateError, CorrelationKey, Correlator, CorrelatorConfig, CorrelatorStats, KeyBuilder,
    KeyHasher, KeyTooLong, Miss, Rejected, SHARDS, Shards,
};
pub use decline::{DeclineCodes, DeclineReason, ResponseCode};
pub use health::{AdminState, Health, HealthConfig, HealthConfigError, Standing, Transition};
pub use node::{
    EwmaCell, EwmaConfig, NODE_ID_MAX, NodeId, NodeIdError, NodeSnapshot, NodeState, NodeView,
    PeakEwma,
};
pub use outlier::OutlierPolicy;
pub use rng::Rng;
pub use router::{
    Checked, FieldTexts, Invalid, KeyError, KeyPart, Router, RouterConfig, RouterError, TpduPolicy,
    default_key,
};
pub use rules::{FieldPrefix, MtiPattern, RuleConfig, RuleError, RuleSet};
pub use stamp::{F37Stamp, StampError, StampTable};
pub use timeouts::{OnTimeout, Timeout, TimeoutPolicy};

#[cfg(test)]
mod tests;
