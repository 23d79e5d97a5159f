//! The node pool of a service: K shared duplex connections per channel node,
//! health state and the balancer that picks a node for each request.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::writer::Outbound;
use crate::ops::config::{BackConfig, NodeConfig};
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
}

/// What the balancer needs under one lock: health per node and the algorithm.
struct PoolState {
    nodes: Vec<NodeState>,
    balancer: Balancer,
    views: Vec<NodeView>,
}

pub struct NodePool {
    /// The service's name, for logs.
    service: String,
    nodes: Vec<Node>,
    state: Mutex<PoolState>,
    rules: RuleSet,
    max_ejection_percent: u32,
    panic_mode: bool,
    panic_picks: AtomicU64,
    in_panic: std::sync::atomic::AtomicBool,
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
        let mut nodes = Vec::with_capacity(back.nodes.len());
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
            nodes.push(Node {
                config: cfg.clone(),
                id,
                conns: (0..back.connections_per_node)
                    .map(|_| Mutex::new(None))
                    .collect(),
                next_conn: AtomicUsize::new(0),
                outstanding: AtomicUsize::new(0),
                counters: NodeCounters::default(),
            });
        }
        let rules = RuleSet::compile(&back.rules, &ids).map_err(|e| e.to_string())?;
        let balancer = Balancer::with_capacity(
            BalancerConfig {
                algorithm: back.algorithm,
                min_active: back.min_active,
            },
            seed(),
            nodes.len(),
        );
        let views = Vec::with_capacity(nodes.len());
        Ok(NodePool {
            service: service.to_string(),
            nodes,
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

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, index: usize) -> Option<&Node> {
        self.nodes.get(index)
    }

    pub fn index_of(&self, id: &[u8]) -> Option<usize> {
        self.nodes.iter().position(|n| n.id.as_bytes() == id)
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
        let node = self.nodes.get(index).ok_or(PickError::NoHealthyNode)?;
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
            None => (0..self.nodes.len()).filter(|&i| usable(i)).collect(),
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
        let node = self.nodes.get(index).ok_or(PickError::NoHealthyNode)?;
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
            None => (0..self.nodes.len()).any(ok),
        }
    }

    /// Marks `node` reachable or not without a kept connection: a OneConnect
    /// pool opens connections on demand, so a node counts as connected until
    /// a connect to it fails, and again once one succeeds.
    pub fn set_reachable(&self, node: usize, reachable: bool, now: Instant) {
        let Some(n) = self.nodes.get(node) else {
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
        let Some(n) = self.nodes.get(node) else {
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
        let Some(n) = self.nodes.get(node) else {
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
        let ejected = nodes.iter().filter(|n| n.health().ejected(now)).count();
        let cap = (nodes.len() * self.max_ejection_percent as usize / 100).max(1);
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
        let Some(n) = self.nodes.get(node) else {
            return;
        };
        let _ = n
            .outstanding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        self.lock_state().nodes[node].released();
    }

    /// An active check of `node` finished.
    pub fn record_check(&self, node: usize, ok: bool, now: Instant) {
        let Some(n) = self.nodes.get(node) else {
            return;
        };
        let t = self.lock_state().nodes[node]
            .health_mut()
            .record_check(ok, now);
        self.log_transition(n, t);
    }

    /// Sets a node's administrative state (config now, admin API later).
    pub fn set_admin(&self, node: usize, admin: AdminState, now: Instant) -> bool {
        let Some(n) = self.nodes.get(node) else {
            return false;
        };
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
        self.nodes
            .get(node)
            .map_or(0, |n| n.outstanding.load(Ordering::Relaxed))
    }

    /// Installs or clears the handle of connection `slot` of `node`.
    pub fn set_conn(&self, node: usize, slot: usize, conn: Option<ConnHandle>, now: Instant) {
        let Some(n) = self.nodes.get(node) else {
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

impl Node {
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

fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0x5EED, |d| d.as_nanos() as u64)
}
