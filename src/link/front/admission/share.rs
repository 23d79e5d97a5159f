//! Fair shares of a service's in-flight requests: one client must never be
//! able to fill the correlation table alone, so each connection, and all
//! connections from one source IP together, may have only so many requests
//! in flight. A request takes an [`InFlightSlot`] from both limits before it
//! is routed; the slot travels with the request and gives its place back
//! when dropped, however the request ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Requests in flight against a limit, shared by whoever counts against it.
#[derive(Debug)]
pub struct InFlightLimit {
    now: AtomicUsize,
    max: usize,
}

impl crate::link::io::conns::InFlightCount for InFlightLimit {
    fn current(&self) -> usize {
        InFlightLimit::current(self)
    }
}

impl InFlightLimit {
    pub fn new(max: usize) -> Arc<InFlightLimit> {
        Arc::new(InFlightLimit {
            now: AtomicUsize::new(0),
            max,
        })
    }

    /// Requests in flight now.
    pub fn current(&self) -> usize {
        self.now.load(Ordering::Relaxed)
    }

    /// Takes one place, unless the limit is reached.
    fn take(&self) -> bool {
        self.now
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }

    fn give_back(&self) {
        let _ = self
            .now
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

/// One request's place under its connection's and its source's limits;
/// given back when dropped.
#[derive(Debug)]
pub struct InFlightSlot {
    conn: Arc<InFlightLimit>,
    source: Arc<InFlightLimit>,
}

impl InFlightSlot {
    /// A place under both limits, or `None` when either is reached (a place
    /// taken from the first is given back).
    pub fn take(conn: &Arc<InFlightLimit>, source: &Arc<InFlightLimit>) -> Option<InFlightSlot> {
        if !conn.take() {
            return None;
        }
        if !source.take() {
            conn.give_back();
            return None;
        }
        Some(InFlightSlot {
            conn: Arc::clone(conn),
            source: Arc::clone(source),
        })
    }
}

impl Drop for InFlightSlot {
    fn drop(&mut self) {
        self.conn.give_back();
        self.source.give_back();
    }
}
