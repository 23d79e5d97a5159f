//! The node pool of a service: K shared duplex connections per channel node,
//! health state and the balancer that picks a node for each request.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::writer::Outbound;
use crate::config::{BackConfig, NodeConfig};
use crate::route::{
    AdminState, Balancer, BalancerConfig, EwmaConfig, NodeId, NodeState, NodeView, RuleSet,
    Transition,
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
    conns: Vec<Mutex<Option<ConnHandle>>>,
    next_conn: AtomicUsize,
    /// Mirrors the balancer's count, readable without the pool lock.
    outstanding: AtomicUsize,
    pub counters: NodeCounters,
    /// Removed at runtime: a tombstone that keeps its index (correlator
    /// entries and stamps hold indices) and is never picked again.
    removed: AtomicBool,
}

/// What the balancer needs under one lock: health per node and the algorithm.
struct PoolState {
    nodes: Vec<NodeState>,
    balancer: Balancer,
    views: Vec<NodeView>,
}

/// Node slots beyond the configured nodes, for nodes added at runtime.
/// Removed nodes stay as tombstones (indices are never reused), so this also
/// bounds how many adds one process can take; a restart compacts.
pub const SPARE_NODE_SLOTS: usize = 64;

/// The nodes of a pool live in a slot table sized once at start (configured
/// nodes + [`SPARE_NODE_SLOTS`]): a slot is filled once and never moves, so
/// `&Node` and node indices stay valid while nodes are added at runtime and
/// the per-request path reads them without a lock. (An `ArcSwap` of the node
/// list would also be lock-free, but every reader would hold a guard instead
/// of a plain reference, and every index user would have to re-check it.)
pub struct NodePool {
    /// The service's name, for logs.
    service: String,
    slots: Box<[OnceLock<Node>]>,
    /// Filled slots: `slots[..len]` are all set.
    len: AtomicUsize,
    /// Serialises adds (rare, operator-driven).
    adding: Mutex<()>,
    connections_per_node: usize,
    state: Mutex<PoolState>,
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

/// Why no node could take a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PickError {
    /// No eligible node (all down, ejected, drained or disabled).
    NoHealthyNode,
}

impl NodePool {
    pub fn new(service: &str, back: &BackConfig, now: Instant) -> Result<NodePool, String> {
        let ids = back.node_ids().map_err(|e| e.to_string())?;
        let mut nodes = Vec::with_capacity(back.nodes.len() + SPARE_NODE_SLOTS);
        let mut states = Vec::with_capacity(back.nodes.len());
        for (cfg, id) in back.nodes.iter().zip(ids.iter().copied()) {
            let mut state = NodeState::new(
                id,
                cfg.weight,
                cfg.priority,
                back.health.state,
                EwmaConfig::default(),
            );
            let _ = state.health_mut().set_admin(cfg.admin, now);
            states.push(state);
            nodes.push(Node::new(cfg.clone(), id, back.connections_per_node));
        }
        let rules = RuleSet::compile(&back.rules, &ids).map_err(|e| e.to_string())?;
        let balancer = Balancer::with_capacity(
            BalancerConfig {
                algorithm: back.algorithm,
                min_active: back.min_active,
            },
            crate::util::rng::entropy_seed(),
            nodes.len(),
        );
        let views = Vec::with_capacity(nodes.len());
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
            state: Mutex::new(PoolState {
                nodes: states,
                balancer,
                views,
            }),
            rules,
            max_ejection_percent: back.health.state.max_ejection_percent,
            panic_mode: back.health.state.panic_mode,
            panic_picks: AtomicU64::new(0),
            in_panic: std::sync::atomic::AtomicBool::new(false),
        })
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
        let mut state = {
            let st = self.lock_state();
            let health = st.nodes.first().map(|n| *n.health().config());
            drop(st);
            NodeState::new(
                id,
                cfg.weight,
                cfg.priority,
                health.unwrap_or_default(),
                EwmaConfig::default(),
            )
        };
        let _ = state.health_mut().set_admin(cfg.admin, now);
        let _ = slot.set(Node::new(cfg, id, self.connections_per_node));
        // The balancer sees the node only once its state is in: a pick can
        // never name a slot that is not filled.
        let mut st = self.lock_state();
        st.nodes.push(state);
        self.len.store(index + 1, Ordering::Release);
        drop(st);
        tracing::info!(service = %self.service, node = %id, index, "node added");
        Ok(index)
    }

    /// Marks a node removed: disabled for good, never picked again. The
    /// caller has drained it and stops its connections.
    pub fn remove_node(&self, index: usize, now: Instant) -> Result<(), NodeChangeError> {
        let n = self
            .node(index)
            .ok_or_else(|| NodeChangeError::NoSuchNode(index.to_string()))?;
        let _ = self.lock_state().nodes[index]
            .health_mut()
            .set_admin(AdminState::Disabled, now);
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
        if self.node(index).is_none() {
            return false;
        }
        self.lock_state().nodes[index].reconfigure(weight, priority);
        true
    }

    /// New health thresholds for every node (config reload); states are kept.
    pub fn set_health_config(&self, cfg: crate::route::HealthConfig) {
        for n in &mut self.lock_state().nodes {
            n.health_mut().set_config(cfg);
        }
    }

    /// What the status API shows of one node, read under the pool lock once.
    pub fn status(&self, index: usize, now: Instant) -> Option<NodeStatus> {
        let node = self.node(index)?;
        let st = self.lock_state();
        let s = st.nodes.get(index)?;
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
    /// the request as outstanding on it. `field` looks up request fields (text
    /// form) for directed rules.
    pub fn pick<'f>(
        &self,
        mti: &[u8; 4],
        field: impl Fn(u16) -> Option<&'f [u8]>,
        sticky_key: Option<&[u8]>,
        now: Instant,
    ) -> Result<(usize, ConnHandle), PickError> {
        let subset = self.rules.select(mti, field);
        let mut state = self.lock_state();
        let PoolState {
            nodes,
            balancer,
            views,
        } = &mut *state;
        views.clear();
        views.extend(nodes.iter_mut().map(|n| {
            let _ = n.health_mut().poll(now);
            n.view(now)
        }));
        let mut picked = match subset {
            Some(allowed) => balancer.pick_in(views, allowed, sticky_key),
            None => balancer.pick(views, sticky_key),
        };
        let none_eligible = !views.iter().any(|v| v.eligible);
        if picked.is_none() && none_eligible && self.panic_mode {
            // Every node failed its checks or was ejected at once: that says
            // more about the checks than about the nodes. Keep routing to the
            // nodes still connected rather than decline everything.
            views.clear();
            views.extend(nodes.iter().map(|n| n.panic_view(now)));
            picked = match subset {
                Some(allowed) => balancer.pick_in(views, allowed, sticky_key),
                None => balancer.pick(views, sticky_key),
            };
            if picked.is_some() {
                self.panic_picks.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.note_panic(none_eligible && picked.is_some());
        let index = picked.ok_or(PickError::NoHealthyNode)?;
        let node = self.node(index).ok_or(PickError::NoHealthyNode)?;
        let conn = node.live_conn().ok_or(PickError::NoHealthyNode)?;
        nodes[index].dispatched();
        drop(state);
        node.outstanding.fetch_add(1, Ordering::Relaxed);
        node.counters.sent.fetch_add(1, Ordering::Relaxed);
        Ok((index, conn))
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
    ) -> Result<usize, PickError> {
        let allowed: Vec<usize> = match self.rules.select(mti, field) {
            Some(subset) => subset.iter().copied().filter(|&i| usable(i)).collect(),
            None => (0..self.nodes().len()).filter(|&i| usable(i)).collect(),
        };
        let mut state = self.lock_state();
        let PoolState {
            nodes,
            balancer,
            views,
        } = &mut *state;
        views.clear();
        views.extend(nodes.iter_mut().map(|n| {
            let _ = n.health_mut().poll(now);
            n.view(now)
        }));
        let index = balancer
            .pick_in(views, &allowed, sticky_key)
            .ok_or(PickError::NoHealthyNode)?;
        let node = self.node(index).ok_or(PickError::NoHealthyNode)?;
        nodes[index].dispatched();
        drop(state);
        node.outstanding.fetch_add(1, Ordering::Relaxed);
        node.counters.sent.fetch_add(1, Ordering::Relaxed);
        Ok(index)
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
        let state = self.lock_state();
        let ok =
            |i: usize| usable(i) && state.nodes.get(i).is_some_and(|n| n.health().eligible(now));
        match subset {
            Some(s) => s.iter().any(|&i| ok(i)),
            None => (0..self.nodes().len()).any(ok),
        }
    }

    /// Marks `node` reachable or not without a kept connection: a OneConnect
    /// pool opens connections on demand, so a node counts as connected until
    /// a connect to it fails, and again once one succeeds.
    pub fn set_reachable(&self, node: usize, reachable: bool, now: Instant) {
        let Some(n) = self.node(node) else {
            return;
        };
        let t = self.lock_state().nodes[node]
            .health_mut()
            .set_connected(reachable, now);
        self.log_transition(n, t);
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        // A panic while holding the lock cannot leave the state half-written in a
        // way that matters more than stopping routing would, so keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request to `node` ended: answered (`ok`), or declined for lack of an
    /// answer it owed (a timeout), which counts against its health. Passive
    /// ejection stops at the pool's `max_ejection_percent`.
    pub fn finished(&self, node: usize, ok: bool, latency: Duration, now: Instant) {
        let Some(n) = self.node(node) else {
            return;
        };
        let _ = n
            .outstanding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        let counter = if ok {
            &n.counters.answered
        } else {
            &n.counters.declined
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if ok {
            n.counters.latency.observe(latency);
        }
        let mut state = self.lock_state();
        let may_eject = ok || self.may_eject_another(&state.nodes, now);
        let t = state.nodes[node].record_outcome(ok, latency, now, may_eject);
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
        let _ = n
            .outstanding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        n.counters.declined.fetch_add(1, Ordering::Relaxed);
        self.lock_state().nodes[node].released();
    }

    /// Whether one more node may be ejected: fewer than `max_ejection_percent`
    /// of the pool is ejected now (one node always may be).
    fn may_eject_another(&self, nodes: &[NodeState], now: Instant) -> bool {
        // Removed nodes (tombstones) are not part of the pool any more.
        let (mut members, mut ejected) = (0usize, 0usize);
        for (i, n) in nodes.iter().enumerate() {
            if self.node(i).is_some_and(|node| !node.is_removed()) {
                members += 1;
                ejected += usize::from(n.health().ejected(now));
            }
        }
        let cap = (members * self.max_ejection_percent as usize / 100).max(1);
        ejected < cap
    }

    /// Logs entering and leaving panic routing, once each.
    fn note_panic(&self, in_panic: bool) {
        if self.in_panic.swap(in_panic, Ordering::Relaxed) != in_panic {
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
        let Some(n) = self.node(node) else {
            return;
        };
        let _ = n
            .outstanding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        self.lock_state().nodes[node].released();
    }

    /// An active check of `node` finished.
    pub fn record_check(&self, node: usize, ok: bool, now: Instant) {
        let Some(n) = self.node(node) else {
            return;
        };
        let t = self.lock_state().nodes[node]
            .health_mut()
            .record_check(ok, now);
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
        let t = self.lock_state().nodes[node]
            .health_mut()
            .set_admin(admin, now);
        self.log_transition(n, t);
        true
    }

    pub fn eligible(&self, node: usize, now: Instant) -> bool {
        self.lock_state()
            .nodes
            .get(node)
            .is_some_and(|n| n.health().eligible(now))
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
            *s.lock().unwrap_or_else(|p| p.into_inner()) = conn;
        }
        let connected = n.live_conns() > 0;
        let t = self.lock_state().nodes[node]
            .health_mut()
            .set_connected(connected, now);
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
    fn new(config: NodeConfig, id: NodeId, connections: usize) -> Node {
        Node {
            config,
            id,
            conns: (0..connections).map(|_| Mutex::new(None)).collect(),
            next_conn: AtomicUsize::new(0),
            outstanding: AtomicUsize::new(0),
            counters: NodeCounters::default(),
            removed: AtomicBool::new(false),
        }
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
            slot.lock().unwrap_or_else(|p| p.into_inner()).clone()
        })
    }

    /// IDs of the connections currently up.
    pub fn live_conn_ids(&self) -> Vec<u64> {
        self.conns
            .iter()
            .filter_map(|s| {
                s.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .map(|c| c.id)
            })
            .collect()
    }

    /// Connections currently up.
    pub fn live_conns(&self) -> usize {
        self.conns
            .iter()
            .filter(|s| s.lock().unwrap_or_else(|p| p.into_inner()).is_some())
            .count()
    }

    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }
}
