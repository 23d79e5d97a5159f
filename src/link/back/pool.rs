//! The node pool of a service: K shared duplex connections per channel node,
//! health state and the balancer that picks a node for each request.
//!
//! Every request picks and every answer records its outcome, from whichever
//! worker thread runs them, so neither takes a pool-wide lock:
//!
//! - **What a pick reads** is published: one [`NodeSnapshot`] per node (id,
//!   priority, admin, connection, checks, ejection end, slow-start start) in
//!   an `ArcSwap`, republished by the rare writers (connects, checks, admin,
//!   ejections, reloads, runtime adds). An ejection running out and a ramp
//!   climbing need no writer: the pick computes them from the snapshot and
//!   `now`. Requests outstanding are one atomic per node, the latency
//!   estimate an [`EwmaCell`] per node, the balancer's state atomics
//!   ([`SharedBalancer`]).
//! - **What an answer writes** is its own node's: health runs and the latency
//!   estimate sit under a per-node lock, so answers from different nodes never
//!   meet. Only an answer that ejects its node (rare by design) takes the
//!   pool's publishing lock, which makes the `max_ejection_percent` check and
//!   the ejection one step.
//!
//! Lock order, where two are held: a node's writer lock, then the pool's
//! publishing lock. Neither is held across an await.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::config::{BackConfig, NodeConfig};
use crate::route::OutlierPolicy;
use crate::route::{
    AdminState, BalancerConfig, EwmaConfig, NodeId, NodeSnapshot, NodeState, RuleSet,
    SharedBalancer, Transition,
};

mod counters;
mod node;
mod pick;
#[cfg(test)]
mod tests;

pub use counters::{LATENCY_BUCKETS, LatencyHistogram, NodeCounters};
pub use node::{ConnHandle, Node, NodeList, NodeStatus};
pub use pick::{PickError, Picked};

/// Node slots beyond the configured nodes, for nodes added at runtime.
/// Removed nodes stay as tombstones (indices are never reused), so this also
/// bounds how many adds one process can take; a restart compacts.
pub const SPARE_NODE_SLOTS: usize = 64;

/// The nodes of a pool live in a slot table sized once at start (configured
/// nodes + [`SPARE_NODE_SLOTS`]): a slot is filled once and never moves, so
/// `&Node` and node indices stay valid while nodes are added at runtime and
/// the per-request path reads them without a lock. What changes about a node
/// is published apart (its `routes`).
pub struct NodePool {
    /// The service's name, for logs.
    service: String,
    slots: Box<[OnceLock<Node>]>,
    /// Filled slots: `slots[..len]` are all set.
    len: AtomicUsize,
    /// Serialises adds (rare, operator-driven).
    adding: Mutex<()>,
    connections_per_node: usize,
    /// What every pick reads of every node, index = node index; as long as
    /// `len`. Replaced whole, under `publishing`, when a node's snapshot
    /// changes.
    routes: ArcSwap<Vec<NodeSnapshot>>,
    /// Serialises republishing `routes`, and makes the ejection cap check and
    /// the ejection one step. Taken by rare writers only.
    publishing: Mutex<()>,
    balancer: SharedBalancer,
    /// Time origin of the nodes' latency cells.
    epoch: Instant,
    rules: RuleSet,
    /// The ejection cap and panic mode (`route::outlier`), replaced whole on
    /// reload; read under the publishing lock (ejections) and by picks that
    /// found no node.
    outlier: ArcSwap<OutlierPolicy>,
    panic_picks: AtomicU64,
    in_panic: std::sync::atomic::AtomicBool,
}

/// Why a node cannot be added or removed at runtime.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodeChangeError {
    #[error("node `{0}` already exists")]
    Exists(String),
    #[error("no node `{0}`")]
    NoSuchNode(String),
    #[error("id: {0}")]
    BadId(String),
    #[error("no free node slot ({SPARE_NODE_SLOTS} runtime adds per process); restart needed")]
    NoSlot,
}

/// Why a node pool cannot be built from `[service.back]`.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Nodes(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Rules(#[from] crate::route::RuleError),
}

impl NodePool {
    pub fn new(service: &str, back: &BackConfig, now: Instant) -> Result<NodePool, PoolError> {
        let ids = back.node_ids()?;
        let rules = RuleSet::compile(&back.rules, &ids)?;
        let capacity = back.nodes.len() + SPARE_NODE_SLOTS;
        let mut nodes = Vec::with_capacity(capacity);
        let mut routes = Vec::with_capacity(capacity);
        for (cfg, id) in back.nodes.iter().zip(ids.iter().copied()) {
            let state = Self::node_state(id, cfg, back.health.state, now);
            routes.push(state.snapshot());
            nodes.push(Node::new(
                cfg.clone(),
                id,
                back.connections_per_node,
                state,
                now,
            ));
        }
        let balancer = SharedBalancer::new(
            BalancerConfig {
                algorithm: back.algorithm,
                min_active: back.min_active,
            },
            crate::util::rng::entropy_seed(),
            capacity,
        );
        let len = nodes.len();
        let slots: Box<[OnceLock<Node>]> = nodes
            .into_iter()
            .map(OnceLock::from)
            .chain((0..SPARE_NODE_SLOTS).map(|_| OnceLock::new()))
            .collect();
        Ok(NodePool {
            service: service.to_string(),
            slots,
            len: AtomicUsize::new(len),
            adding: Mutex::new(()),
            connections_per_node: back.connections_per_node,
            routes: ArcSwap::from_pointee(routes),
            publishing: Mutex::new(()),
            balancer,
            epoch: now,
            rules,
            outlier: ArcSwap::from_pointee(OutlierPolicy::of(&back.health.state)),
            panic_picks: AtomicU64::new(0),
            in_panic: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// A node's state as configured, before any connection.
    fn node_state(
        id: NodeId,
        cfg: &NodeConfig,
        health: crate::route::HealthConfig,
        now: Instant,
    ) -> NodeState {
        let mut state = NodeState::new(id, cfg.weight, cfg.priority, health, EwmaConfig::default());
        let _ = state.health_mut().set_admin(cfg.admin, now);
        state
    }

    /// Every node, tombstones of removed nodes included (index = node index).
    pub fn nodes(&self) -> NodeList<'_> {
        let len = self.len.load(Ordering::Acquire).min(self.slots.len());
        NodeList {
            slots: &self.slots[..len],
        }
    }

    pub fn node(&self, index: usize) -> Option<&Node> {
        self.nodes().get(index)
    }

    /// A filled slot, whether or not `len` shows it yet (a pick may read a
    /// published snapshot that already has it).
    fn slot(&self, index: usize) -> Option<&Node> {
        self.slots.get(index).and_then(OnceLock::get)
    }

    /// The index of the live (not removed) node with this ID.
    pub fn index_of(&self, id: &[u8]) -> Option<usize> {
        let nodes = self.nodes();
        (0..nodes.len()).rev().find(|&i| {
            nodes
                .get(i)
                .is_some_and(|n| n.id.as_bytes() == id && !n.is_removed())
        })
    }

    /// Adds a node at runtime: appended in a fresh slot (existing indices do
    /// not move), enabled through slow start. Returns its index; the caller
    /// starts its connections.
    pub fn add_node(&self, cfg: NodeConfig, now: Instant) -> Result<usize, NodeChangeError> {
        let id: NodeId = cfg
            .id
            .parse()
            .map_err(|e: crate::route::NodeIdError| NodeChangeError::BadId(e.to_string()))?;
        let _adding = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        if self.index_of(id.as_bytes()).is_some() {
            return Err(NodeChangeError::Exists(cfg.id));
        }
        let index = self.len.load(Ordering::Acquire);
        let slot = self.slots.get(index).ok_or(NodeChangeError::NoSlot)?;
        let health = self
            .node(0)
            .map(|n| *n.lock_writer().health().config())
            .unwrap_or_default();
        let state = Self::node_state(id, &cfg, health, now);
        let snapshot = state.snapshot();
        let _ = slot.set(Node::new(
            cfg,
            id,
            self.connections_per_node,
            state,
            self.epoch,
        ));
        // The balancer sees the node only once its slot is filled: a pick can
        // never name a slot that is not.
        let _publishing = self.lock_publishing();
        let mut routes = Vec::with_capacity(self.slots.len());
        routes.extend_from_slice(&self.routes.load());
        routes.push(snapshot);
        self.len.store(index + 1, Ordering::Release);
        self.routes.store(Arc::new(routes));
        drop(_publishing);
        tracing::info!(service = %self.service, node = %id, index, "node added");
        Ok(index)
    }

    /// Marks a node removed: disabled for good, never picked again. The
    /// caller has drained it and stops its connections.
    pub fn remove_node(&self, index: usize, now: Instant) -> Result<(), NodeChangeError> {
        let n = self
            .node(index)
            .ok_or_else(|| NodeChangeError::NoSuchNode(index.to_string()))?;
        let _ = self.update(index, n, |s| {
            s.health_mut().set_admin(AdminState::Disabled, now)
        });
        n.removed.store(true, Ordering::Release);
        tracing::info!(service = %self.service, node = %n.config.id, index, "node removed");
        Ok(())
    }

    /// Marks a node removed while it drains: its ID is free for a new node
    /// (an address change), it is never picked, and its in-flight requests
    /// still finish. [`NodePool::remove_node`] completes the removal.
    pub fn remove_node_later(&self, index: usize) -> Result<(), NodeChangeError> {
        let n = self
            .node(index)
            .ok_or_else(|| NodeChangeError::NoSuchNode(index.to_string()))?;
        n.removed.store(true, Ordering::Release);
        Ok(())
    }

    /// Weight and priority of a node (config reload).
    pub fn reconfigure(&self, index: usize, weight: u32, priority: u32) -> bool {
        let Some(n) = self.node(index) else {
            return false;
        };
        let _ = self.update(index, n, |s| {
            s.reconfigure(weight, priority);
            Transition::Unchanged
        });
        true
    }

    /// New health thresholds for every node (config reload); states are kept.
    pub fn set_health_config(&self, cfg: crate::route::HealthConfig) {
        self.outlier.store(Arc::new(OutlierPolicy::of(&cfg)));
        for (index, n) in self.nodes().iter().enumerate() {
            let _ = self.update(index, n, |s| {
                s.health_mut().set_config(cfg);
                Transition::Unchanged
            });
        }
    }

    /// What the status API shows of one node, read under its lock once.
    pub fn status(&self, index: usize, now: Instant) -> Option<NodeStatus> {
        let node = self.node(index)?;
        let s = node.lock_writer();
        let h = s.health();
        Some(NodeStatus {
            admin: h.admin(),
            weight: h.weight(),
            effective_weight: h.effective_weight(now),
            priority: s.priority(),
            connected: h.connected(),
            check_up: h.check_up(),
            ejected: h.ejected(now),
            eligible: h.eligible(now),
            latency: s.latency(now),
            removed: node.is_removed(),
        })
    }

    /// Marks `node` reachable or not without a kept connection: a OneConnect
    /// pool opens connections on demand, so a node counts as connected until
    /// a connect to it fails, and again once one succeeds.
    pub fn set_reachable(&self, node: usize, reachable: bool, now: Instant) {
        let Some(n) = self.node(node) else {
            return;
        };
        let t = self.update(node, n, |s| s.health_mut().set_connected(reachable, now));
        self.log_transition(n, t);
    }

    fn lock_publishing(&self) -> MutexGuard<'_, ()> {
        // It guards no data of its own: a panic elsewhere cannot leave it
        // inconsistent.
        self.publishing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes node `index`'s state under its lock and republishes its
    /// snapshot if that changed. For the rare writers.
    fn update(
        &self,
        index: usize,
        n: &Node,
        change: impl FnOnce(&mut NodeState) -> Transition,
    ) -> Transition {
        let mut state = n.lock_writer();
        let t = change(&mut state);
        let _publishing = self.lock_publishing();
        self.publish(index, state.snapshot());
        t
    }

    /// Makes `snapshot` what picks read of node `index`. Called with the
    /// node's lock and the publishing lock held, so snapshots land in the
    /// order of the changes.
    fn publish(&self, index: usize, snapshot: NodeSnapshot) {
        let current = self.routes.load();
        if current.get(index).is_none_or(|s| *s == snapshot) {
            return;
        }
        let mut routes = Vec::with_capacity(self.slots.len());
        routes.extend_from_slice(&current);
        routes[index] = snapshot;
        self.routes.store(Arc::new(routes));
    }

    /// A request to `node` ended: answered (`ok`), or declined for lack of an
    /// answer it owed (a timeout), which counts against its health. Passive
    /// ejection stops at the pool's `max_ejection_percent`.
    pub fn finished(&self, node: usize, ok: bool, latency: Duration, now: Instant) {
        let Some(n) = self.node(node) else {
            return;
        };
        n.release();
        let counter = if ok {
            &n.counters.answered
        } else {
            &n.counters.declined
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if ok {
            n.counters.latency.observe(latency);
        }
        let mut state = n.lock_writer();
        let t = if state.health().would_eject(ok, now) {
            // The cap check and the ejection in one step: two nodes failing
            // at once cannot both pass a cap that has room for one.
            let _publishing = self.lock_publishing();
            let may_eject = self.may_eject_another(now);
            let t = state.record_outcome(ok, latency, now, may_eject);
            if matches!(t, Transition::Ejected { .. }) {
                n.ejection_end_due.store(true, Ordering::Relaxed);
            }
            self.publish(node, state.snapshot());
            t
        } else {
            // Neither an answer nor a failure short of the threshold changes
            // what picks read, but the latency estimate.
            state.record_outcome(ok, latency, now, true)
        };
        if self.latency_matters() {
            n.latency.publish(state.ewma());
        }
        drop(state);
        if t == Transition::EjectionCapped {
            n.counters.ejections_capped.fetch_add(1, Ordering::Relaxed);
        }
        self.log_transition(n, t);
    }

    /// A request to `node` was declined for a reason that is not the node's
    /// fault (shutdown, admin disable, its connection went away): counted as
    /// declined, no verdict on its health.
    pub fn finished_without_verdict(&self, node: usize) {
        let Some(n) = self.node(node) else {
            return;
        };
        n.release();
        n.counters.declined.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether one more node may be ejected now ([`OutlierPolicy`]). Called
    /// under the publishing lock, so it reads the latest snapshots.
    fn may_eject_another(&self, now: Instant) -> bool {
        let routes = self.routes.load();
        // Removed nodes (tombstones) are not part of the pool any more.
        let members = routes
            .iter()
            .enumerate()
            .filter(|(i, _)| self.slot(*i).is_some_and(|node| !node.is_removed()))
            .map(|(_, s)| s);
        self.outlier.load().may_eject_another(members, now)
    }

    /// Logs entering and leaving panic routing, once each. Reads before it
    /// writes, so picks in steady state do not all write one cache line.
    fn note_panic(&self, in_panic: bool) {
        if self.in_panic.load(Ordering::Relaxed) != in_panic
            && self.in_panic.swap(in_panic, Ordering::Relaxed) != in_panic
        {
            if in_panic {
                tracing::warn!(service = %self.service, "no node is healthy: panic mode routes to every connected node");
            } else {
                tracing::info!(service = %self.service, "panic mode over: a node is healthy again");
            }
        }
    }

    /// Requests routed while no node was healthy (panic mode).
    pub fn panic_picks(&self) -> u64 {
        self.panic_picks.load(Ordering::Relaxed)
    }

    /// Is the pool routing in panic mode now?
    pub fn in_panic(&self) -> bool {
        self.in_panic.load(Ordering::Relaxed)
    }

    fn log_transition(&self, node: &Node, t: Transition) {
        if t != Transition::Unchanged {
            tracing::info!(service = %self.service, node = %node.config.id, transition = ?t, "node health changed");
        }
    }

    /// A request picked for `node` never left (its queue was full or closed): no
    /// verdict on the node's health.
    pub fn released(&self, node: usize) {
        if let Some(n) = self.node(node) {
            n.release();
        }
    }

    /// An active check of `node` finished.
    pub fn record_check(&self, node: usize, ok: bool, now: Instant) {
        let Some(n) = self.node(node) else {
            return;
        };
        let t = self.update(node, n, |s| s.health_mut().record_check(ok, now));
        self.log_transition(n, t);
    }

    /// Sets a node's administrative state (config now, admin API later).
    pub fn set_admin(&self, node: usize, admin: AdminState, now: Instant) -> bool {
        let Some(n) = self.node(node) else {
            return false;
        };
        // A removed node can only go (stay) disabled.
        if n.is_removed() && admin != AdminState::Disabled {
            return false;
        }
        let t = self.update(node, n, |s| s.health_mut().set_admin(admin, now));
        self.log_transition(n, t);
        true
    }

    pub fn eligible(&self, node: usize, now: Instant) -> bool {
        self.routes
            .load()
            .get(node)
            .is_some_and(|s| s.standing.eligible(now))
    }

    pub fn outstanding(&self, node: usize) -> usize {
        self.node(node)
            .map_or(0, |n| n.outstanding.load(Ordering::Relaxed))
    }

    /// Installs or clears the handle of connection `slot` of `node`.
    pub fn set_conn(&self, node: usize, slot: usize, conn: Option<ConnHandle>, now: Instant) {
        let Some(n) = self.node(node) else {
            return;
        };
        if let Some(s) = n.conns.get(slot) {
            s.store(conn.map(Arc::new));
        }
        // Counted under the node's lock: of two connections changing at once,
        // the later to get the lock sees both.
        let t = self.update(node, n, |s| {
            s.health_mut().set_connected(n.live_conns() > 0, now)
        });
        self.log_transition(n, t);
    }
}
