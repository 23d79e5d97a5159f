//! Picking a node for a request: the balancer's choice over the published
//! snapshots, panic routing, the first-usable pick of key exchange, and the
//! [`Picked`] guard that gives a pick back unless it is handed on.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{ConnHandle, Node, NodePool};
use crate::route::outlier;
use crate::route::{Algorithm, NodeSnapshot, NodeView};

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
        // Counted as sent only now: a pick given back (a duplicate answered
        // from the table, a full queue, a pick made only to name a node)
        // never reached the node.
        if let Some(n) = self.pool.slot(node) {
            n.counters.sent.fetch_add(1, Ordering::Relaxed);
        }
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

impl NodePool {
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

    /// Counts a request outstanding on `node`, until the pick is given back
    /// or handed on ([`Picked::in_flight`] counts it sent).
    fn picked(&self, node: &Node, index: usize) -> Picked<'_> {
        node.outstanding.fetch_add(1, Ordering::Relaxed);
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
        let none_eligible = outlier::none_eligible(&s.views);
        if picked.is_none() && self.outlier.load().panic_applies(&s.views) {
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
    pub(super) fn latency_matters(&self) -> bool {
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
    /// request outstanding on the node picked.
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
}
