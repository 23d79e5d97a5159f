//! Requests the switch ends itself, without the node's answer: at their
//! deadline, with a node connection that died, with a node forced offline,
//! at the end of a graceful stop. Each goes through `Service::fail`, which
//! answers for the node (`Service::decline`, also the answer to a request
//! no node could take) or stays silent, and remembers what the switch owes
//! for it. All of it is here; the request's way out and the answer's way
//! back stay in `service.rs`.

use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;

use super::facts::{Answerable, answerable_kind};
use super::{Origin, Pending, Service, undelivered};
use crate::iso8583::{Message, Mti};
use crate::journal::{AnsweredBy, Link};
use crate::link::log_limit::{LogKind, LogPeer};
use crate::route::OnTimeout;
use crate::route::{Checked, CorrelationKey, DeclineReason};

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

/// How the switch answers for a node: the decline (or silence) and what
/// it remembers for the host's late answer.
impl Service {
    /// A request that will get no node response: the switch answers for the
    /// node (or stays silent, `on_timeout = "silent"`) and remembers it, so
    /// that a late approval is reversed. A health check's waiter just sees
    /// its sender dropped (a failed check); an owed message waits for its
    /// next attempt.
    pub(super) fn fail(
        &self,
        key: &CorrelationKey,
        mut p: Pending,
        reason: DeclineReason,
        now: Instant,
    ) {
        // Answered by the switch: the correlation table left its key
        // answered, and a duplicate of it is declined.
        let waiting = p.same.waiting.take();
        match p.origin {
            Origin::Check(_) => return,
            Origin::Owed {
                id,
                attempt,
                expires_at,
                ..
            } => return self.owed().attempt_failed(id, attempt, expires_at, reason),
            Origin::Node => {}
            Origin::Client { .. } | Origin::Peer => {
                if reason.counts_against_node() {
                    let waited = now.saturating_duration_since(p.sent_at);
                    self.pool.finished(p.node, false, waited, now);
                } else {
                    self.pool.finished_without_verdict(p.node);
                }
            }
        }
        let silent = reason == DeclineReason::Timeout && p.on_timeout == OnTimeout::Silent;
        self.owed().answered_for_node(key, &p, reason, silent, now);
        let sent = Some((p.node, p.sent_at));
        if silent || matches!(p.origin, Origin::Node) {
            // Nothing goes to a client: the exchange ends here.
            self.note_ended(&p, reason, silent, now);
        }
        if silent {
            self.made
                .counters
                .silent_timeouts
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        for origin in waiting.map(|w| *w).into_iter().flatten() {
            self.made
                .counters
                .duplicates_waited
                .fetch_add(1, Ordering::Relaxed);
            self.decline_noted(origin, (&p.request, Some(p.facts.mti)), reason, sent, now);
        }
        if matches!(p.origin, Origin::Node) {
            if let Some(peer) = self.peer() {
                peer.decline_to_node_request(p.node, &p.request, reason);
            }
            return;
        }
        let asked = (&p.request, Some(p.facts.mti));
        self.decline_noted(p.origin, asked, reason, sent, now);
    }

    /// The TPDU edit for a response to `request`, by the service's policy.
    /// Counts an answer that found no way out; whether to log it (at most
    /// a few lines a second, the rest summed up).
    pub(super) fn undeliverable(&self, now: Instant) -> bool {
        self.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
        self.links
            .log_limit
            .allow(LogKind::Undeliverable, LogPeer::Service, now)
    }

    /// Answers `origin` with a switch-made response to `request`, a
    /// message not checked (a bad one, or one the front holds only as
    /// bytes). Returns whether an answer was built and queued.
    pub(crate) fn decline(&self, origin: Origin, request: &Bytes, reason: DeclineReason) -> bool {
        let mti = Message::parse(self.spec(), request.clone())
            .ok()
            .map(|m| m.mti());
        self.decline_noted(origin, (request, mti), reason, None, Instant::now())
    }

    /// [`Service::decline`] of a checked request: its MTI is known.
    pub(crate) fn decline_checked(
        &self,
        origin: Origin,
        req: &Checked<'_>,
        reason: DeclineReason,
    ) -> bool {
        let asked = (req.msg.payload(), Some(req.msg.mti()));
        self.decline_noted(origin, asked, reason, None, Instant::now())
    }

    /// [`Service::decline`] of a request that was in flight to a node since
    /// a time (`sent`), for the journal.
    pub(super) fn decline_noted(
        &self,
        origin: Origin,
        (request, mti): (&Bytes, Option<Mti>),
        reason: DeclineReason,
        sent: Option<(usize, Instant)>,
        now: Instant,
    ) -> bool {
        let Some(link) = origin.journal_link().filter(|l| *l != Link::Node) else {
            // A health check's waiter sees its sender dropped: a failed
            // check; owed messages and node requests have no one to answer.
            return false;
        };
        let note = |by, response| self.note_decline(link, request, sent, (by, response), now);
        if !self.may_answer(mti) {
            note(AnsweredBy::Withheld(reason), None);
            return false;
        }
        let code = self.live().decline_code(reason);
        let resp = match crate::link::decline::build(self.spec(), request, code) {
            Ok(resp) => resp,
            Err(e) => {
                // Only a request too broken to read its MTI gets here: every
                // request routed passed validation first.
                self.counters.undeclinable.fetch_add(1, Ordering::Relaxed);
                if self
                    .links
                    .log_limit
                    .allow(LogKind::BadMessage, LogPeer::Service, Instant::now())
                {
                    tracing::warn!(service = self.name(), error = %e, ?reason, "cannot build a decline");
                }
                note(AnsweredBy::Nobody("undeclinable"), None);
                return false;
            }
        };
        note(AnsweredBy::Switch(reason), Some(resp.clone()));
        self.counters.declined[reason as usize].fetch_add(1, Ordering::Relaxed);
        // A client that cannot take it is counted; the peer's links hold
        // what waits for them, and count their own drops.
        let client = matches!(origin, Origin::Client { .. });
        let sent = origin.answer(self, request, resp);
        if !sent && client {
            self.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }

    /// Whether a switch-made answer to a request with this MTI may go out at
    /// all: never with `switch_made = "silent"`, never to a reversal request
    /// (0400) or to an advice the switch did not stored ([`answerable_kind`]):
    /// the sender repeats them.
    pub(super) fn may_answer(&self, mti: Option<Mti>) -> bool {
        let svc = self;
        let c = &svc.made.counters;
        if svc.made.integrity.switch_made == crate::config::SwitchMadePolicy::Silent {
            c.switch_made_withheld.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // An advice gets here in `forward` mode, and in `store-and-forward`
        // mode when it could not be stored without its sensitive
        // authentication data.
        let counter = match answerable_kind(mti) {
            Answerable::Yes => return true,
            Answerable::NotAReversalRequest => &c.reversals_unanswered,
            Answerable::NotAnAdvice => &c.advices_unanswered,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        false
    }
}
