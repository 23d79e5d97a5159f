//! The bookkeeping of a OneConnect pool, without I/O: per node, how many
//! connections are open, which of them are idle (and since when), and the cap.
//! Each connection carries one request at a time, so a connection is either
//! idle (in the pool, reusable) or leased (carrying exactly one request).
//!
//! `C` is whatever the I/O layer keeps for an idle connection (its socket);
//! this module only moves it between the idle list and a lease.

use std::time::{Duration, Instant};

/// What a lease on a node gives.
#[derive(Debug, PartialEq, Eq)]
pub enum Lease<C> {
    /// An idle connection, now leased: reuse it.
    Reuse(C),
    /// No idle connection but room for one more: open it. The slot is already
    /// counted: a connect that fails frees it with
    /// [`OneConnectSlots::closed`], a connection done with its request goes
    /// idle with [`OneConnectSlots::release`].
    Open,
}

#[derive(Debug)]
struct NodeSlots<C> {
    /// Connections open or being opened, leased or idle.
    open: usize,
    /// Idle connections, the most recently used last.
    idle: Vec<(C, Instant)>,
}

/// Per-node connection slots of a OneConnect pool.
#[derive(Debug)]
pub struct OneConnectSlots<C> {
    max_per_node: usize,
    nodes: Vec<NodeSlots<C>>,
}

impl<C> OneConnectSlots<C> {
    pub fn new(nodes: usize, max_per_node: usize) -> Self {
        OneConnectSlots {
            max_per_node,
            nodes: (0..nodes)
                .map(|_| NodeSlots {
                    open: 0,
                    idle: Vec::new(),
                })
                .collect(),
        }
    }

    /// True if a lease on `node` would succeed now.
    pub fn has_room(&self, node: usize) -> bool {
        self.nodes
            .get(node)
            .is_some_and(|n| !n.idle.is_empty() || n.open < self.max_per_node)
    }

    /// Leases a connection of `node`: the most recently used idle one (so that
    /// a surplus of idle connections ages out), else a new slot if under the
    /// cap. `None` when every connection is busy and the cap is reached.
    pub fn lease(&mut self, node: usize) -> Option<Lease<C>> {
        let max = self.max_per_node;
        let n = self.nodes.get_mut(node)?;
        if let Some((c, _)) = n.idle.pop() {
            return Some(Lease::Reuse(c));
        }
        if n.open < max {
            n.open += 1;
            return Some(Lease::Open);
        }
        None
    }

    /// A leased connection finished its request cleanly: back to idle.
    pub fn release(&mut self, node: usize, conn: C, now: Instant) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.idle.push((conn, now));
        }
    }

    /// A leased connection (or a slot being opened) is gone: closed after a
    /// deadline, an error, or a failed connect. Frees its slot.
    pub fn closed(&mut self, node: usize) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.open = n.open.saturating_sub(1);
        }
    }

    /// Takes out every connection idle since before `now - idle_timeout`, for
    /// the caller to close. Their slots are freed.
    pub fn expire_idle(&mut self, now: Instant, idle_timeout: Duration, out: &mut Vec<C>) {
        for n in &mut self.nodes {
            let before = out.len();
            let mut i = 0;
            while i < n.idle.len() {
                if now.saturating_duration_since(n.idle[i].1) >= idle_timeout {
                    out.push(n.idle.remove(i).0);
                } else {
                    i += 1;
                }
            }
            n.open = n.open.saturating_sub(out.len() - before);
        }
    }

    /// Takes out every idle connection (shutdown); their slots are freed.
    pub fn drain_idle(&mut self, out: &mut Vec<C>) {
        for n in &mut self.nodes {
            n.open = n.open.saturating_sub(n.idle.len());
            out.extend(n.idle.drain(..).map(|(c, _)| c));
        }
    }

    /// Connections of `node` open (leased or idle).
    pub fn open(&self, node: usize) -> usize {
        self.nodes.get(node).map_or(0, |n| n.open)
    }

    /// Connections of `node` idle in the pool.
    pub fn idle(&self, node: usize) -> usize {
        self.nodes.get(node).map_or(0, |n| n.idle.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_up_to_the_cap_then_refuses_until_released() {
        let t0 = Instant::now();
        let mut s: OneConnectSlots<u32> = OneConnectSlots::new(2, 2);
        assert_eq!(s.lease(0), Some(Lease::Open));
        assert_eq!(s.lease(0), Some(Lease::Open));
        assert!(!s.has_room(0));
        assert_eq!(s.lease(0), None);
        assert!(s.has_room(1), "another node's cap is its own");
        s.release(0, 7, t0);
        assert!(s.has_room(0));
        assert_eq!(s.lease(0), Some(Lease::Reuse(7)));
        assert_eq!(s.open(0), 2);
        assert_eq!(s.lease(9), None, "no such node");
    }

    #[test]
    fn reuses_the_most_recently_used_idle_connection() {
        let t0 = Instant::now();
        let mut s: OneConnectSlots<u32> = OneConnectSlots::new(1, 3);
        for _ in 0..2 {
            assert_eq!(s.lease(0), Some(Lease::Open));
        }
        s.release(0, 1, t0);
        s.release(0, 2, t0 + Duration::from_millis(1));
        assert_eq!(s.lease(0), Some(Lease::Reuse(2)));
        assert_eq!(s.idle(0), 1);
    }

    #[test]
    fn a_closed_connection_frees_its_slot() {
        let mut s: OneConnectSlots<u32> = OneConnectSlots::new(1, 1);
        assert_eq!(s.lease(0), Some(Lease::Open));
        assert_eq!(s.lease(0), None);
        s.closed(0);
        assert_eq!(s.open(0), 0);
        assert_eq!(s.lease(0), Some(Lease::Open));
    }

    #[test]
    fn idle_connections_expire_and_free_their_slots() {
        let t0 = Instant::now();
        let idle = Duration::from_secs(30);
        let mut s: OneConnectSlots<u32> = OneConnectSlots::new(2, 2);
        for node in 0..2 {
            assert_eq!(s.lease(node), Some(Lease::Open));
            assert_eq!(s.lease(node), Some(Lease::Open));
        }
        s.release(0, 1, t0);
        s.release(0, 2, t0 + Duration::from_secs(20));
        s.release(1, 3, t0 + Duration::from_secs(5));
        let mut out = Vec::new();
        s.expire_idle(t0 + Duration::from_secs(29), idle, &mut out);
        assert!(out.is_empty());
        s.expire_idle(t0 + Duration::from_secs(36), idle, &mut out);
        out.sort_unstable();
        assert_eq!(out, vec![1, 3]);
        assert_eq!((s.open(0), s.idle(0)), (1, 1));
        assert_eq!((s.open(1), s.idle(1)), (1, 0), "node 1's leased one stays");
        out.clear();
        s.drain_idle(&mut out);
        assert_eq!(out, vec![2]);
        assert_eq!(s.open(0), 0);
    }
}
