//! One channel node of a pool (its connections, counters and health state)
//! and the views of nodes the rest of the switch reads.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;

use super::NodeCounters;
use crate::config::NodeConfig;
use crate::link::io::direct::LinkTx;
use crate::route::{AdminState, EwmaCell, NodeId, NodeState};

/// A live connection to a node: where to queue frames for it.
#[derive(Clone, Debug)]
pub struct ConnHandle {
    /// Unique across the process: the correlator tags requests with it so that
    /// a dying connection declines exactly its own in-flight requests.
    pub id: u64,
    pub tx: LinkTx,
}

/// One channel node: its config, its connections and its counters.
#[derive(Debug)]
pub struct Node {
    pub config: NodeConfig,
    pub id: NodeId,
    /// Read on every pick, written on connect and disconnect.
    pub(super) conns: Vec<ArcSwapOption<ConnHandle>>,
    pub(super) next_conn: AtomicUsize,
    /// Requests sent and not yet answered, declined or released.
    pub(super) outstanding: AtomicUsize,
    pub counters: NodeCounters,
    /// Removed at runtime: a tombstone that keeps its index (correlator
    /// entries and stamps hold indices) and is never picked again.
    pub(super) removed: AtomicBool,
    /// This node's health runs and latency estimate, for its own writers
    /// (answers, checks, admin, connection changes). The state's own
    /// outstanding count is unused: `outstanding` above is the count.
    pub(super) writer: Mutex<NodeState>,
    /// The latency estimate as picks read it, published under `writer`.
    pub(super) latency: EwmaCell,
    /// An ejection whose end is still to be logged (see
    /// [`NodePool::note_ejection_end`]).
    pub(super) ejection_end_due: AtomicBool,
}

/// The nodes of a pool, tombstones included (index = node index).
#[derive(Clone, Copy)]
pub struct NodeList<'a> {
    pub(super) slots: &'a [OnceLock<Node>],
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
    /// One word for people: `removed`, `forced-offline`, `disabled`, `draining`, `down`,
    /// `ejected`, `up`.
    pub fn state(&self) -> &'static str {
        if self.removed {
            "removed"
        } else if self.admin == AdminState::ForcedOffline {
            "forced-offline"
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
    pub(super) fn new(
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

    pub(super) fn lock_writer(&self) -> MutexGuard<'_, NodeState> {
        // A panic while holding the lock cannot leave the state half-written in a
        // way that matters more than stopping routing would, so keep going.
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One request fewer outstanding (never below zero).
    pub(super) fn release(&self) {
        let _ = self
            .outstanding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
    }

    pub(super) fn outstanding_u32(&self) -> u32 {
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
