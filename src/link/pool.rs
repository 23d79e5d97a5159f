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

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, ArcSwapOption};
use tokio::sync::mpsc;

use super::writer::Outbound;
use crate::config::{BackConfig, NodeConfig};
use crate::route::{
    AdminState, Algorithm, BalancerConfig, EwmaCell, EwmaConfig, NodeId, NodeSnapshot, NodeState,
    NodeView, RuleSet, SharedBalancer, Transition,
};

/// A live connection to a node: where to queue frames for it.
#[derive(Clone, Debug)]
pub struct ConnHandle {
    /// Unique across the process: the correlator tags requests with it so that
    /// a dying connection declines exactly its own in-flight requests.
    pub id: u64,
    pub tx: mpsc::Sender<Outbound>,
}

/// Per-node traffic counters.
#[derive(Debug, Default)]
pub struct NodeCounters {
    pub sent: AtomicU64,
    pub answered: AtomicU64,
    pub declined: AtomicU64,
    pub connects: AtomicU64,
    pub disconnects: AtomicU64,
    /// Ejections due but refused by the pool's `max_ejection_percent`.
    pub ejections_capped: AtomicU64,
    /// Connect attempts that failed or timed out.
    pub connect_failures: AtomicU64,
    /// Answer latency of the requests this node answered.
    pub latency: LatencyHistogram,
}

/// Upper bounds (seconds) of the per-node latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// A latency histogram of plain atomics: recording takes no lock, so it can
/// sit on the per-response path. Read by `/metrics`.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Non-cumulative counts per bucket of [`LATENCY_BUCKETS`], then +Inf.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

impl LatencyHistogram {
    pub fn observe(&self, latency: Duration) {
        let secs = latency.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Sum in seconds, count, and cumulative `(upper bound, count)` pairs
    /// (the last bound is +Inf), as Prometheus wants them.
    pub fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let mut cumulative = 0;
        let mut out = Vec::with_capacity(self.buckets.len());
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b.load(Ordering::Relaxed);
            let le = LATENCY_BUCKETS.get(i).copied().unwrap_or(f64::INFINITY);
            out.push((le, cumulative));
        }
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        (sum, cumulative, out)
    }
}

/// One channel node: its config, its connections and its counters.
#[derive(Debug)]
pub struct Node {
    pub config: NodeConfig,
    pub id: NodeId,
    /// Read on every pick, written on connect and disconnect.
    conns: Vec<ArcSwapOption<ConnHandle>>,
    next_conn: AtomicUsize,
    /// Requests sent and not yet answered, declined or released.
    outstanding: AtomicUsize,
    pub counters: NodeCounters,
    /// Removed at runtime: a tombstone that keeps its index (correlator
    /// entries and stamps hold indices) and is never picked again.
    removed: AtomicBool,
    /// This node's health runs and latency estimate, for its own writers
    /// (answers, checks, admin, connection changes). The state's own
    /// outstanding count is unused: `outstanding` above is the count.
    writer: Mutex<NodeState>,
    /// The latency estimate as picks read it, published under `writer`.
    latency: EwmaCell,
    /// An ejection whose end is still to be logged (see
    /// [`NodePool::note_ejection_end`]).
    ejection_end_due: AtomicBool,
}

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
    max_ejection_percent: u32,
    panic_mode: bool,
    panic_picks: AtomicU64,
    in_panic: std::sync::atomic::AtomicBool,
}

/// The nodes of a pool, tombstones included (index = node index).
#[derive(Clone, Copy)]
pub struct NodeList<'a> {
    slots: &'a [OnceLock<Node>],
}

impl<'a> NodeList<'a> {
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn get(&self, index: usize) -> Option<&'a Node> {
        self.slots.get(index).and_then(OnceLock::get)
    }

    pub fn iter(&self) -> impl Iterator<Item = &'a Node> + 'a {
        self.slots.iter().filter_map(OnceLock::get)
    }
}

impl<'a> IntoIterator for NodeList<'a> {
    type Item = &'a Node;
    type IntoIter = std::iter::FilterMap<
        std::slice::Iter<'a, OnceLock<Node>>,
        fn(&'a OnceLock<Node>) -> Option<&'a Node>,
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.slots.iter().filter_map(OnceLock::get)
    }
}

impl std::ops::Index<usize> for NodeList<'_> {
    type Output = Node;
    fn index(&self, index: usize) -> &Node {
        match self.get(index) {
            Some(n) => n,
            None => panic!("node index {index} out of range"),
        }
    }
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

/// A node picked for one request, counted outstanding on it. Dropped, it
/// gives the count back: every way a request can fail to leave (no stamp, a
/// full table, a full queue) releases its pick without a line of its own.
/// A request that leaves hands the pick to its in-flight entry
/// ([`Picked::in_flight`]), or finishes it ([`Picked::finished`]).
#[must_use = "a pick dropped at once is given back"]
pub struct Picked<'p> {
    pool: &'p NodePool,
    node: usize,
}

impl Picked<'_> {
    /// The node's index in the pool.
    pub fn node(&self) -> usize {
        self.node
    }

    /// The request is in flight: its entry (in the correlator) now owns the
    /// outstanding count, and whoever takes the entry out finishes it.
    pub fn in_flight(self) -> usize {
        let node = self.node;
        std::mem::forget(self);
        node
    }

    /// The request ended: see [`NodePool::finished`].
    pub fn finished(self, ok: bool, latency: Duration, now: Instant) {
        let (pool, node) = (self.pool, self.in_flight());
        pool.finished(node, ok, latency, now);
    }
}

impl Drop for Picked<'_> {
    fn drop(&mut self) {
        self.pool.released(self.node);
    }
}

/// Why no node could take a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PickError {
    /// No eligible node (all down, ejected, drained or disabled).
    NoHealthyNode,
}

/// Per-thread scratch of a pick: the nodes' views, the candidates, the rule
/// subset. Kept per worker thread so a pick allocates nothing once warm and
/// shares no buffer with other threads.
#[derive(Default)]
struct PickScratch {
    views: Vec<NodeView>,
    candidates: Vec<usize>,
    allowed: Vec<usize>,
}

thread_local! {
    static SCRATCH: Cell<PickScratch> = const {
        Cell::new(PickScratch {
            views: Vec::new(),
            candidates: Vec::new(),
            allowed: Vec::new(),
        })
    };
}

/// Runs `f` with this thread's pick scratch. Re-entered (a closure of a pick
/// that picks), the inner call gets fresh buffers.
fn with_scratch<R>(f: impl FnOnce(&mut PickScratch) -> R) -> R {
    let mut scratch = SCRATCH.try_with(Cell::take).unwrap_or_default();
    let r = f(&mut scratch);
    let _ = SCRATCH.try_with(|c| c.set(scratch));
    r
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
            max_ejection_percent: back.health.state.max_ejection_percent,
            panic_mode: back.health.state.panic_mode,
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

    /// Picks a node for a request and one of its live connections, and counts
    /// the request as outstanding on it until the [`Picked`] is given back or
    /// handed on. `field` looks up request fields (text form) for directed
    /// rules.
    pub fn pick<'f>(
        &self,
        mti: &[u8; 4],
        field: impl Fn(u16) -> Option<&'f [u8]>,
        sticky_key: Option<&[u8]>,
        now: Instant,
    ) -> Result<(Picked<'_>, ConnHandle), PickError> {
        let subset = self.rules.select(mti, field);
        let index = with_scratch(|s| self.choose(subset, sticky_key, now, s))
            .ok_or(PickError::NoHealthyNode)?;
        let node = self.slot(index).ok_or(PickError::NoHealthyNode)?;
        let conn = node.live_conn().ok_or(PickError::NoHealthyNode)?;
        Ok((self.picked(node, index), conn))
    }

    /// Counts a request outstanding on (and sent to) `node`, until the pick
    /// is given back or handed on.
    fn picked(&self, node: &Node, index: usize) -> Picked<'_> {
        node.outstanding.fetch_add(1, Ordering::Relaxed);
        node.counters.sent.fetch_add(1, Ordering::Relaxed);
        Picked {
            pool: self,
            node: index,
        }
    }

    /// The balancer's choice among the published nodes (within `subset`),
    /// falling back to panic routing when no node is eligible.
    fn choose(
        &self,
        subset: Option<&[usize]>,
        key: Option<&[u8]>,
        now: Instant,
        s: &mut PickScratch,
    ) -> Option<usize> {
        let routes = self.routes.load();
        self.fill_views(&routes, now, &mut s.views, false);
        let mut picked = match subset {
            Some(allowed) => self
                .balancer
                .pick_in(&s.views, allowed, key, &mut s.candidates),
            None => self.balancer.pick(&s.views, key, &mut s.candidates),
        };
        let none_eligible = !s.views.iter().any(|v| v.eligible);
        if picked.is_none() && none_eligible && self.panic_mode {
            // Every node failed its checks or was ejected at once: that says
            // more about the checks than about the nodes. Keep routing to the
            // nodes still connected rather than decline everything.
            self.fill_views(&routes, now, &mut s.views, true);
            picked = match subset {
                Some(allowed) => self
                    .balancer
                    .pick_in(&s.views, allowed, key, &mut s.candidates),
                None => self.balancer.pick(&s.views, key, &mut s.candidates),
            };
            if picked.is_some() {
                self.panic_picks.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.note_panic(none_eligible && picked.is_some());
        picked
    }

    /// The balancer's views of every published node at `now` (`panic`: as
    /// panic routing sees them). Latency is read only where the algorithm
    /// uses it.
    fn fill_views(
        &self,
        routes: &[NodeSnapshot],
        now: Instant,
        views: &mut Vec<NodeView>,
        panic: bool,
    ) {
        let latency_matters = self.latency_matters();
        views.clear();
        for (i, snapshot) in routes.iter().enumerate() {
            let (outstanding, latency) = match self.slot(i) {
                Some(n) => {
                    self.note_ejection_end(n, snapshot, now);
                    let latency = if latency_matters {
                        n.latency.get(now)
                    } else {
                        Duration::ZERO
                    };
                    (n.outstanding_u32(), latency)
                }
                // A snapshot is published only after its slot is filled.
                None => (0, Duration::ZERO),
            };
            views.push(if panic {
                snapshot.panic_view(outstanding, latency, now)
            } else {
                snapshot.view(outstanding, latency, now)
            });
        }
    }

    /// Does the pool's algorithm read the latency estimate? Only peak EWMA
    /// does: other pools neither publish it per answer nor read it per pick
    /// (the status API reads it under the node's lock).
    fn latency_matters(&self) -> bool {
        self.balancer.config().algorithm == Algorithm::PeakEwma
    }

    /// Logs the end of a node's ejection once, from the first pick that sees
    /// its time passed. (Eligibility does not wait for this: the pick computes
    /// it from the snapshot.)
    fn note_ejection_end(&self, n: &Node, snapshot: &NodeSnapshot, now: Instant) {
        let over = snapshot
            .standing
            .ejected_until
            .is_some_and(|until| now >= until);
        if over
            && n.ejection_end_due.load(Ordering::Relaxed)
            && n.ejection_end_due.swap(false, Ordering::Relaxed)
        {
            let t = n.lock_writer().health_mut().poll(now);
            self.log_transition(n, t);
        }
    }

    /// The first node of `order` that is eligible now and has a live
    /// connection, picked as [`NodePool::pick`] does. Not balanced: what
    /// must land on one host while it is up (the institution's keys) goes
    /// to the same node every time.
    pub fn pick_first(
        &self,
        order: impl IntoIterator<Item = usize>,
        now: Instant,
    ) -> Result<(Picked<'_>, ConnHandle), PickError> {
        let routes = self.routes.load();
        order
            .into_iter()
            .filter(|&i| routes.get(i).is_some_and(|s| s.standing.eligible(now)))
            .find_map(|i| {
                let node = self.slot(i).filter(|n| !n.is_removed())?;
                let conn = node.live_conn()?;
                Some((self.picked(node, i), conn))
            })
            .ok_or(PickError::NoHealthyNode)
    }

    /// As [`NodePool::pick`], among the nodes `usable` accepts, without asking
    /// for a live connection (a OneConnect pool opens its own). Counts the
    /// request as sent and outstanding on the node picked.
    pub fn pick_where<'f>(
        &self,
        mti: &[u8; 4],
        field: impl Fn(u16) -> Option<&'f [u8]>,
        sticky_key: Option<&[u8]>,
        now: Instant,
        usable: impl Fn(usize) -> bool,
    ) -> Result<Picked<'_>, PickError> {
        let subset = self.rules.select(mti, field);
        let index = with_scratch(|s| {
            s.allowed.clear();
            match subset {
                Some(subset) => s
                    .allowed
                    .extend(subset.iter().copied().filter(|&i| usable(i))),
                None => s
                    .allowed
                    .extend((0..self.nodes().len()).filter(|&i| usable(i))),
            }
            let routes = self.routes.load();
            self.fill_views(&routes, now, &mut s.views, false);
            self.balancer
                .pick_in(&s.views, &s.allowed, sticky_key, &mut s.candidates)
        })
        .ok_or(PickError::NoHealthyNode)?;
        let node = self.slot(index).ok_or(PickError::NoHealthyNode)?;
        Ok(self.picked(node, index))
    }

    /// True if some node that `usable` accepts (within the rules' subset for
    /// this request) is eligible now. Picks nothing.
    pub fn any_eligible<'f>(
        &self,
        mti: &[u8; 4],
        field: impl Fn(u16) -> Option<&'f [u8]>,
        now: Instant,
        usable: impl Fn(usize) -> bool,
    ) -> bool {
        let subset = self.rules.select(mti, field);
        let routes = self.routes.load();
        let ok = |i: usize| usable(i) && routes.get(i).is_some_and(|s| s.standing.eligible(now));
        match subset {
            Some(s) => s.iter().any(|&i| ok(i)),
            None => (0..routes.len()).any(ok),
        }
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

    /// Whether one more node may be ejected: fewer than `max_ejection_percent`
    /// of the pool is ejected now (one node always may be). Called under the
    /// publishing lock, so it reads the latest snapshots.
    fn may_eject_another(&self, now: Instant) -> bool {
        let routes = self.routes.load();
        // Removed nodes (tombstones) are not part of the pool any more.
        let (mut members, mut ejected) = (0usize, 0usize);
        for (i, s) in routes.iter().enumerate() {
            if self.slot(i).is_some_and(|node| !node.is_removed()) {
                members += 1;
                ejected += usize::from(s.standing.ejected(now));
            }
        }
        let cap = (members * self.max_ejection_percent as usize / 100).max(1);
        ejected < cap
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

/// A node as the status API and metrics show it.
#[derive(Clone, Copy, Debug)]
pub struct NodeStatus {
    pub admin: AdminState,
    pub weight: u32,
    pub effective_weight: u32,
    pub priority: u32,
    pub connected: bool,
    pub check_up: bool,
    pub ejected: bool,
    pub eligible: bool,
    /// The peak-EWMA latency estimate.
    pub latency: Duration,
    pub removed: bool,
}

impl NodeStatus {
    /// One word for people: `removed`, `disabled`, `draining`, `down`,
    /// `ejected`, `up`.
    pub fn state(&self) -> &'static str {
        if self.removed {
            "removed"
        } else if self.admin == AdminState::Disabled {
            "disabled"
        } else if self.admin == AdminState::Drain {
            "draining"
        } else if !self.connected || !self.check_up {
            "down"
        } else if self.ejected {
            "ejected"
        } else {
            "up"
        }
    }
}

impl Node {
    fn new(
        config: NodeConfig,
        id: NodeId,
        connections: usize,
        state: NodeState,
        epoch: Instant,
    ) -> Node {
        Node {
            config,
            id,
            conns: (0..connections).map(|_| ArcSwapOption::empty()).collect(),
            next_conn: AtomicUsize::new(0),
            outstanding: AtomicUsize::new(0),
            counters: NodeCounters::default(),
            removed: AtomicBool::new(false),
            latency: EwmaCell::new(state.ewma(), epoch),
            writer: Mutex::new(state),
            ejection_end_due: AtomicBool::new(false),
        }
    }

    fn lock_writer(&self) -> MutexGuard<'_, NodeState> {
        // A panic while holding the lock cannot leave the state half-written in a
        // way that matters more than stopping routing would, so keep going.
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One request fewer outstanding (never below zero).
    fn release(&self) {
        let _ = self
            .outstanding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
    }

    fn outstanding_u32(&self) -> u32 {
        u32::try_from(self.outstanding.load(Ordering::Relaxed)).unwrap_or(u32::MAX)
    }

    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// Round robin over this node's live connections.
    pub fn live_conn(&self) -> Option<ConnHandle> {
        let k = self.conns.len();
        let start = self.next_conn.fetch_add(1, Ordering::Relaxed);
        (0..k).find_map(|i| {
            let slot = &self.conns[(start + i) % k];
            slot.load().as_deref().cloned()
        })
    }

    /// IDs of the connections currently up.
    pub fn live_conn_ids(&self) -> Vec<u64> {
        self.conns
            .iter()
            .filter_map(|s| s.load().as_ref().map(|c| c.id))
            .collect()
    }

    /// Connections currently up.
    pub fn live_conns(&self) -> usize {
        self.conns.iter().filter(|s| s.load().is_some()).count()
    }

    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;

    use super::*;
    use crate::route::HealthConfig;

    const MTI: &[u8; 4] = b"0200";

    fn no_fields(_: u16) -> Option<&'static [u8]> {
        None
    }

    /// A pool of nodes `01`, `02`, ... with these weights, each with one
    /// connection up (a channel nothing reads: picks only clone its sender).
    fn connected_pool(
        algorithm: &str,
        weights: &[u32],
        health: HealthConfig,
        t0: Instant,
    ) -> (NodePool, Vec<mpsc::Receiver<Outbound>>) {
        let mut text = format!("algorithm = \"{algorithm}\"\nconnections_per_node = 1\n");
        for (i, w) in weights.iter().enumerate() {
            text += &format!(
                "[[node]]\nid = \"{:02}\"\naddress = \"127.0.0.1:{}\"\nweight = {w}\n",
                i + 1,
                9000 + i
            );
        }
        let mut back: BackConfig = toml::from_str(&text).unwrap();
        back.health.state = health;
        let pool = NodePool::new("test", &back, t0).unwrap();
        let receivers = (0..weights.len()).map(|i| connect(&pool, i, t0)).collect();
        (pool, receivers)
    }

    fn connect(pool: &NodePool, node: usize, now: Instant) -> mpsc::Receiver<Outbound> {
        let (tx, rx) = mpsc::channel(1);
        let id = 100 + node as u64;
        pool.set_conn(node, 0, Some(ConnHandle { id, tx }), now);
        rx
    }

    fn pick(pool: &NodePool, now: Instant) -> Option<usize> {
        pool.pick(MTI, no_fields, None, now)
            .ok()
            .map(|(picked, _)| picked.in_flight())
    }

    /// `threads` threads pick `rounds` × `batch` times each, holding `batch`
    /// requests in flight and then finishing them (answered, declined without
    /// verdict, released, in turn). Picks per node.
    fn pick_and_finish_from_threads(
        pool: &NodePool,
        now: Instant,
        threads: usize,
        rounds: usize,
        batch: usize,
    ) -> Vec<usize> {
        let n = pool.nodes().len();
        let per: Vec<Vec<usize>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(move || {
                        let mut counts = vec![0; n];
                        let mut held = Vec::with_capacity(batch);
                        for _ in 0..rounds {
                            held.extend((0..batch).map(|_| pick(pool, now).unwrap()));
                            for (k, i) in held.drain(..).enumerate() {
                                counts[i] += 1;
                                match k % 3 {
                                    0 => pool.finished(i, true, Duration::from_millis(2), now),
                                    1 => pool.finished_without_verdict(i),
                                    _ => pool.released(i),
                                }
                            }
                        }
                        counts
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        (0..n).map(|i| per.iter().map(|c| c[i]).sum()).collect()
    }

    #[test]
    fn picks_from_threads_rotate_exactly_and_outstanding_returns_to_zero() {
        let t0 = Instant::now();
        let (pool, _rx) = connected_pool("round-robin", &[1, 1, 1], HealthConfig::default(), t0);
        assert!(pool.set_admin(1, AdminState::Disabled, t0));
        let counts = pick_and_finish_from_threads(&pool, t0, 4, 30, 100);
        assert_eq!(
            counts,
            [6000, 0, 6000],
            "never the disabled node; exact split"
        );
        for (i, &picked) in counts.iter().enumerate() {
            assert_eq!(pool.outstanding(i), 0, "node {i}");
            let c = &pool.node(i).unwrap().counters;
            assert_eq!(c.sent.load(Ordering::Relaxed), picked as u64);
        }
    }

    #[test]
    fn a_pick_is_given_back_unless_handed_on() {
        let t0 = Instant::now();
        let (pool, _rx) = connected_pool("round-robin", &[1], HealthConfig::default(), t0);
        let (picked, _conn) = pool.pick(MTI, no_fields, None, t0).unwrap();
        assert_eq!(pool.outstanding(0), 1);
        drop(picked);
        assert_eq!(pool.outstanding(0), 0, "dropped: given back");
        let (picked, _conn) = pool.pick(MTI, no_fields, None, t0).unwrap();
        let node = picked.in_flight();
        assert_eq!(pool.outstanding(node), 1, "in flight: the entry owns it");
        pool.finished(node, true, Duration::from_millis(1), t0);
        let picked = pool.pick_where(MTI, no_fields, None, t0, |_| true).unwrap();
        picked.finished(false, Duration::ZERO, t0);
        assert_eq!(pool.outstanding(0), 0);
        let c = &pool.node(0).unwrap().counters;
        assert_eq!(c.sent.load(Ordering::Relaxed), 3);
        assert_eq!(c.answered.load(Ordering::Relaxed), 1);
        assert_eq!(c.declined.load(Ordering::Relaxed), 1);
    }

    /// The key node: always the first usable one of the order, never
    /// balanced; the next only while it is down, disabled or unconnected.
    #[test]
    fn pick_first_takes_the_first_usable_node_every_time() {
        let t0 = Instant::now();
        let (pool, _rx) = connected_pool("round-robin", &[1, 1, 1], HealthConfig::default(), t0);
        let first = |order: &[usize]| {
            pool.pick_first(order.iter().copied(), t0)
                .ok()
                .map(|(p, _)| p.node())
        };
        for _ in 0..5 {
            assert_eq!(first(&[1, 0, 2]), Some(1));
        }
        assert_eq!(pool.outstanding(1), 0, "each pick dropped: given back");
        assert!(pool.set_admin(1, AdminState::Disabled, t0));
        assert_eq!(first(&[1, 0, 2]), Some(0), "the next while 1 is disabled");
        pool.set_conn(0, 0, None, t0);
        assert_eq!(first(&[1, 0, 2]), Some(2), "0 has no connection");
        assert_eq!(first(&[1, 0]), None, "none of these is usable");
        assert_eq!(first(&[7]), None, "no such node");
        assert!(pool.set_admin(1, AdminState::Enabled, t0));
        assert_eq!(first(&[1, 0, 2]), Some(1), "back to the first");
    }

    #[test]
    fn weighted_picks_from_threads_follow_the_weights() {
        let t0 = Instant::now();
        let (pool, _rx) = connected_pool("weighted", &[5, 1, 1], HealthConfig::default(), t0);
        let counts = pick_and_finish_from_threads(&pool, t0, 4, 10, 700);
        for (got, want) in counts.iter().zip([20_000usize, 4000, 4000]) {
            assert!(got.abs_diff(want) <= 100, "{counts:?}");
        }
        assert!((0..3).all(|i| pool.outstanding(i) == 0));
    }

    #[test]
    fn least_outstanding_from_threads_sees_the_live_counts() {
        let t0 = Instant::now();
        let (pool, _rx) =
            connected_pool("least-outstanding", &[1, 1, 1], HealthConfig::default(), t0);
        // Requests held open on node 0 steer the picks away from it.
        for _ in 0..50 {
            let picked = pool
                .pick_where(MTI, no_fields, None, t0, |i| i == 0)
                .unwrap();
            assert_eq!(picked.in_flight(), 0);
        }
        let counts = pick_and_finish_from_threads(&pool, t0, 4, 10, 10);
        assert!(counts[0] < counts[1] / 4, "{counts:?}");
        for _ in 0..50 {
            pool.released(0);
        }
        assert!((0..3).all(|i| pool.outstanding(i) == 0));
    }

    #[test]
    fn peak_ewma_reads_the_latency_answers_publish() {
        let t0 = Instant::now();
        let (pool, _rx) = connected_pool("peak-ewma", &[1, 1], HealthConfig::default(), t0);
        for _ in 0..5 {
            pool.finished(0, true, Duration::from_millis(500), t0);
            pool.finished(1, true, Duration::from_millis(1), t0);
        }
        // Two nodes: both are always the two choices; the fast one wins.
        for _ in 0..100 {
            let i = pick(&pool, t0).unwrap();
            assert_eq!(i, 1);
            pool.released(i);
        }
        let s = pool.status(0, t0).unwrap();
        assert_eq!(s.latency, Duration::from_millis(500));
    }

    #[test]
    fn an_ejection_ends_and_the_ramp_climbs_by_time_alone() {
        let health = HealthConfig {
            ejection_threshold: 2,
            base_ejection: Duration::from_secs(5),
            slow_start: Duration::from_secs(10),
            max_ejection_percent: 100,
            ..HealthConfig::default()
        };
        let t0 = Instant::now();
        let (pool, _rx) = connected_pool("round-robin", &[1, 1], health, t0);
        pool.finished(0, false, Duration::from_secs(1), t0);
        assert!(pool.eligible(0, t0));
        pool.finished(0, false, Duration::from_secs(1), t0);
        assert!(!pool.eligible(0, t0), "two timeouts eject it");
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!((0..100).all(|_| pick(&pool, at(4)) == Some(1)));
        // No writer ran since: the pick alone sees the ejection over, and the
        // node ramping up from 10% of its share.
        assert!(pool.eligible(0, at(5)));
        let share = |now: Instant| {
            (0..2000).filter(|_| pick(&pool, now) == Some(0)).count() as f64 / 2000.0
        };
        let early = share(at(5));
        assert!(early > 0.02 && early < 0.2, "{early}");
        let late = share(at(12));
        assert!(late > early && late < 0.5, "{late}");
        assert_eq!(share(at(15)), 0.5, "ramp over: an exact rotation");
        let s = pool.status(0, at(15)).unwrap();
        assert_eq!((s.state(), s.eligible), ("up", true));
    }

    #[test]
    fn the_ejection_cap_holds_when_nodes_fail_at_once() {
        let health = HealthConfig {
            ejection_threshold: 1,
            max_ejection_percent: 50,
            ..HealthConfig::default()
        };
        let t0 = Instant::now();
        for _ in 0..20 {
            let (pool, _rx) = connected_pool("round-robin", &[1, 1, 1, 1], health, t0);
            let start = Barrier::new(4);
            std::thread::scope(|s| {
                for i in 0..4 {
                    let (pool, start) = (&pool, &start);
                    s.spawn(move || {
                        start.wait();
                        pool.finished(i, false, Duration::from_secs(1), t0);
                    });
                }
            });
            let ejected = (0..4).filter(|&i| !pool.eligible(i, t0)).count();
            let capped: u64 = pool
                .nodes()
                .iter()
                .map(|n| n.counters.ejections_capped.load(Ordering::Relaxed))
                .sum();
            assert_eq!((ejected, capped), (2, 2), "half of four, however they race");
        }
    }

    #[test]
    fn a_node_added_at_runtime_joins_the_rotation() {
        let t0 = Instant::now();
        let (pool, _rx) = connected_pool("round-robin", &[1, 1], HealthConfig::default(), t0);
        let cfg: NodeConfig = toml::from_str("id = \"03\"\naddress = \"127.0.0.1:9100\"").unwrap();
        let index = pool.add_node(cfg.clone(), t0).unwrap();
        assert_eq!(index, 2);
        assert_eq!(
            pool.add_node(cfg, t0),
            Err(NodeChangeError::Exists("03".into()))
        );
        assert!(!pool.eligible(2, t0), "not connected yet");
        assert!((0..20).all(|_| pick(&pool, t0) != Some(2)));
        let _rx2 = connect(&pool, 2, t0);
        let mut counts = [0; 3];
        for _ in 0..300 {
            counts[pick(&pool, t0).unwrap()] += 1;
        }
        assert_eq!(counts, [100, 100, 100]);
        pool.remove_node(2, t0).unwrap();
        assert!((0..20).all(|_| pick(&pool, t0) != Some(2)));
    }

    #[test]
    fn panic_mode_routes_to_connected_nodes_when_none_is_eligible() {
        let health = HealthConfig {
            fall: 1,
            ..HealthConfig::default()
        };
        let t0 = Instant::now();
        let (pool, _rx) = connected_pool("round-robin", &[1, 1], health, t0);
        pool.record_check(0, false, t0);
        pool.record_check(1, false, t0);
        assert!(!pool.in_panic());
        assert!(pick(&pool, t0).is_some());
        assert!(pool.in_panic());
        assert_eq!(pool.panic_picks(), 1);
        pool.record_check(1, true, t0);
        pool.record_check(1, true, t0);
        assert_eq!(pick(&pool, t0), Some(1));
        assert!(!pool.in_panic());
    }
}
