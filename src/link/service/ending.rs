//! Requests the switch ends itself, without the node's answer: at their
//! deadline, with a node connection that died, with a node forced offline,
//! at the end of a graceful stop. Each goes through `Service::fail`, which
//! answers for the node (or stays silent) and remembers what the switch
//! owes for it.

use std::time::Instant;

use super::{Pending, Service, undelivered};
use crate::route::{CorrelationKey, DeclineReason};

impl Service {
    /// Declines every request still in flight with the `shutdown` code (the
    /// end of a graceful shutdown). Returns how many.
    pub fn decline_all(&self, now: Instant) -> usize {
        let mut left = Vec::new();
        self.in_flight.drain(now, &mut left);
        let n = left.len();
        for (key, p) in left {
            self.fail(&key, p, DeclineReason::Shutdown, now);
        }
        n
    }

    /// Declines every request whose deadline has passed. Returns how many.
    pub fn expire(&self, now: Instant, scratch: &mut Vec<(CorrelationKey, Pending)>) -> usize {
        undelivered::check_uncertain(self, now);
        scratch.clear();
        self.in_flight.expire(now, scratch);
        let n = scratch.len();
        for (key, p) in scratch.drain(..) {
            self.fail(&key, p, DeclineReason::Timeout, now);
        }
        n
    }

    /// A node connection died: decline what it carried.
    pub fn connection_lost(&self, conn: u64, now: Instant) -> usize {
        let mut lost = Vec::new();
        self.in_flight.take_via(conn, now, &mut lost);
        let n = lost.len();
        for (key, p) in lost {
            self.fail(&key, p, DeclineReason::NodeLost, now);
        }
        n
    }

    /// Sets a node's administrative state: `drain` and `disabled` let its
    /// in-flight requests finish up to their deadlines (F5's "disabled":
    /// an approval in time is never turned into a decline); `forced-offline`
    /// declines them at once (reason `shutdown`), and each one whose outcome
    /// the host may have decided gets its timeout reversal. The connections
    /// stay up so that re-enabling is immediate. The admin API calls this.
    pub fn set_node_admin(
        &self,
        node: usize,
        admin: crate::route::AdminState,
        now: Instant,
    ) -> bool {
        if !self.pool.set_admin(node, admin, now) {
            return false;
        }
        if !admin.keeps_in_flight()
            && let Some(n) = self.pool.node(node)
        {
            let mut gone = Vec::new();
            for conn in n.live_conn_ids() {
                self.in_flight.take_via(conn, now, &mut gone);
            }
            for (key, p) in gone {
                self.fail(&key, p, DeclineReason::Shutdown, now);
            }
        }
        true
    }
}
