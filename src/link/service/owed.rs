//! What the switch owes after it answered for a node (docs/integrity.md):
//!
//! - every request it answered itself (a decline at the deadline, a lost
//!   node connection) or let expire in silence is remembered for
//!   `late_window`, with the node it went to;
//! - a late answer that approves is reversed: a reversal advice (0420) built
//!   from the dialect's template is stored durably and delivered, to the node
//!   that approved (or to the peer, for a node's own request the peer
//!   approved late), repeated as 0421 until acknowledged. Never for a
//!   decline, never twice, never for an answer in time;
//! - an advice in `store-and-forward` mode is acknowledged only once it is
//!   stored and synced, then delivered to a node from the queue, and the
//!   answer to an owed message completes its store entry, a missing one
//!   schedules the next attempt ([`entries`]).
//!
//! Nothing here waits on the message path: the store's acknowledgement is
//! awaited by a task of its own.

use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;

use super::SafOutbox;
use super::journaled::Seen;
use super::{Origin, Pending, Service, summary};
use crate::config::LateApproval;
use crate::iso8583::{Decoded, Message, SafAnswerClass};
use crate::journal::{AnsweredBy, Exchange, Journal, Link};
use crate::link::io::writer::Outbound;
use crate::route::integrity::{self, Late, LateEntry, Said};
use crate::route::{Checked, CorrelationKey, DeclineReason};
mod entries;

pub(crate) use entries::{record_attempt, record_dead};

use crate::store::{
    AfterFailure, Direction, NewSafEntry, SafId, SafKeys, SafKind, Store, saf::now_millis,
};

/// Where a late answer came from, and so where its reversal goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerFrom {
    /// A node answered a request from the front (or from the peer).
    Node,
    /// The peer answered a node's own request.
    Peer,
}

/// Why the switch reverses a request.
#[derive(Clone, Copy, Debug)]
pub(super) enum Cause {
    /// The host's answer came after the switch answered for it, and approved.
    LateApproval,
    /// The switch answered for the host (for this reason) with the outcome
    /// unknown.
    Timeout(DeclineReason),
    /// The host approved in time, and the answer could not be delivered.
    Undelivered,
}

/// How long a reversal the store cannot take now is offered again, at
/// least: a store queue full for a moment, or a PostgreSQL failover, must
/// not lose it.
const MIN_STORE_RETRY: std::time::Duration = std::time::Duration::from_secs(60);

/// One reversal on its way into the store: offered again with backoff while
/// the store is full or away (up to the late window), counted as reversed
/// once committed, as unreversed (and logged for reconciliation) if it never
/// is.
struct StoreReversal {
    cause: Cause,
    /// Where its store id goes once stored (the late book's entry).
    stored_as: std::sync::Arc<std::sync::OnceLock<i64>>,
    store: Store,
    wake: std::sync::Arc<tokio::sync::Notify>,
    counters: std::sync::Arc<super::IntegrityCounters>,
    service: String,
    what: String,
    give_up_after: std::time::Duration,
    /// The late approval's journal row, recorded with the reversal's id.
    exchange: Option<(Journal, Exchange)>,
}

/// Counts a reversal in [`super::IntegrityCounters::reversals_awaiting_store`]
/// while its task lives, however it ends.
struct Awaiting(std::sync::Arc<super::IntegrityCounters>);

impl Awaiting {
    fn new(counters: &std::sync::Arc<super::IntegrityCounters>) -> Awaiting {
        counters
            .reversals_awaiting_store
            .fetch_add(1, Ordering::Relaxed);
        Awaiting(std::sync::Arc::clone(counters))
    }
}

impl Drop for Awaiting {
    fn drop(&mut self) {
        self.0
            .reversals_awaiting_store
            .fetch_sub(1, Ordering::Relaxed);
    }
}

impl StoreReversal {
    async fn run(self, entry: NewSafEntry) {
        let _awaiting = Awaiting::new(&self.counters);
        let deadline = tokio::time::Instant::now() + self.give_up_after;
        let mut wait = std::time::Duration::from_millis(100);
        let mut warned = false;
        loop {
            let stored = match self.store.saf_submit(entry.clone()) {
                Ok(ack) => ack.await,
                Err(e) => Err(e),
            };
            let (service, what) = (&self.service, &self.what);
            let e = match stored {
                Ok(id) => {
                    // Counted once durable: "reversed" means owed in the store.
                    let counter = match self.cause {
                        Cause::LateApproval => &self.counters.late_reversed,
                        Cause::Timeout(_) => &self.counters.timeout_reversals,
                        Cause::Undelivered => &self.counters.undelivered_reversed,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    let _ = self.stored_as.set(id.0);
                    tracing::info!(service, %id, message = %what, cause = ?self.cause, "reversal stored");
                    self.wake.notify_one();
                    if let Some((journal, mut ex)) = self.exchange {
                        ex.reversal_id = Some(id.0);
                        journal.exchange(ex);
                    }
                    return;
                }
                Err(e) => e,
            };
            if !worth_retrying(&e) || tokio::time::Instant::now() + wait > deadline {
                self.counters
                    .late_unreversed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(service, error = %e, message = %what, "late approval NOT reversed: the reversal could not be stored; reconcile by hand");
                if let Some((journal, ex)) = self.exchange {
                    journal.exchange(ex);
                }
                return;
            }
            if !warned {
                tracing::warn!(service, error = %e, message = %what, "late approval: the store cannot take its reversal now; offering it again");
                warned = true;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(std::time::Duration::from_secs(5));
        }
    }
}

/// A store error that may pass: a full queue, a database away or failing
/// over. Not a closed store (the switch is stopping) or a bad entry.
fn worth_retrying(e: &crate::store::StoreError) -> bool {
    use crate::store::StoreError as E;
    matches!(
        e,
        E::QueueFull { .. }
            | E::Unavailable { .. }
            | E::Postgres { .. }
            | E::Sqlite { .. }
            | E::Io { .. }
    )
}

/// A copy of a journal exchange (the bytes are shared, not copied).
fn copy(ex: &Exchange) -> Exchange {
    Exchange {
        spec: std::sync::Arc::clone(&ex.spec),
        service: std::sync::Arc::clone(&ex.service),
        request: ex.request.clone(),
        response: ex.response.clone(),
        ..*ex
    }
}

/// What the switch owes for a service's requests, as a view of the
/// service (as [`super::peer::Peer`] is of its peer side): late answers,
/// timeout and undelivered reversals, stored advices and their answers.
#[derive(Clone, Copy)]
pub(crate) struct Owed<'a> {
    svc: &'a Service,
}

impl Service {
    /// What the switch owes for this service's requests.
    pub(crate) fn owed(&self) -> Owed<'_> {
        Owed { svc: self }
    }
}

impl Owed<'_> {
    /// The request of `p` got no answer from its node: the switch answered it
    /// (`silent`: let it expire). Remembered for late answers and repeats.
    pub(super) fn answered_for_node(
        &self,
        key: &CorrelationKey,
        p: &Pending,
        reason: DeclineReason,
        silent: bool,
        now: Instant,
    ) {
        let svc = self.svc;
        if p.facts.binds_its_repeats() {
            svc.made.repeats.record(key, p.node, now);
        }
        if !p.facts.is_approvable() {
            return;
        }
        // Read once more, only now: its F37 as sent, its F3, and the fields
        // its reversal copies.
        let Ok(checked) = svc.check(p.request.clone()) else {
            return;
        };
        let said = if silent {
            Said::Silent
        } else {
            Said::Declined(reason)
        };
        let msg = &checked.msg;
        let mut entry = LateEntry::new(self.as_sent(p, &checked), p.node, said, now);
        if let Some(direction) = self.timeout_reversal_to(p, msg, silent) {
            self.owe_reversal(&entry, direction, (Cause::Timeout(reason), msg), None);
            entry = entry.with_timeout_reversal();
        }
        svc.made.late.record(*key, entry);
    }

    /// Where a timeout reversal of `p`'s request goes, if it gets one: the host
    /// may have approved what the switch declined (or let expire), so the
    /// acquirer reverses it at once (UnionPay's reason 98 exists for this). Not
    /// with `timeout_reversal = false` or `late_approval = "log"`, not without a
    /// store, not for a request that moves no money (`no_reversal_f3`). Not
    /// for a node's own request the switch let expire in silence: in a pair the
    /// peer may have answered it through the other instance, to the node, which
    /// as the acquirer owns its outcome; the switch reverses it only once it
    /// told the node "declined".
    fn timeout_reversal_to(
        &self,
        p: &Pending,
        request: &Message<'_>,
        silent: bool,
    ) -> Option<Direction> {
        let svc = self.svc;
        if !self.timeout_reversals_on()
            || !integrity::moves_money(request, &svc.spec().integrity().no_reversal_f3)
        {
            return None;
        }
        match p.origin {
            Origin::Node if silent => None,
            Origin::Node => Some(Direction::ToPeer),
            Origin::Client { .. } | Origin::Peer => self.toward_node(p.node),
            Origin::Check(_) | Origin::Owed { .. } => None,
        }
    }

    /// Whether the switch stores timeout reversals: `timeout_reversal`, with
    /// `late_approval = "reverse"` and a store.
    pub(super) fn timeout_reversals_on(&self) -> bool {
        let svc = self.svc;
        let integrity = &svc.made.integrity;
        integrity.timeout_reversal
            && integrity.late_approval == LateApproval::Reverse
            && svc.made.saf().is_some()
    }

    /// Where a reversal to node `node` goes, while the node is configured.
    pub(super) fn toward_node(&self, node: usize) -> Option<Direction> {
        let svc = self.svc;
        svc.pool
            .node(node)
            .map(|n| Direction::ToNode(n.id.to_string()))
    }

    /// `request` from a client as node `node` got it: with the F37 stamp the
    /// switch wrote, if any.
    pub(super) fn stamped(&self, request: &Bytes, node: usize) -> Bytes {
        let svc = self.svc;
        let Ok(checked) = svc.check(request.clone()) else {
            return request.clone();
        };
        match svc.stamp_patch(&checked, node) {
            Ok(patch) if !patch.is_empty() => Bytes::from(patch.applied_to(request)),
            _ => request.clone(),
        }
    }

    /// The request of `p` as its node (or the peer) got it: with the F37 stamp
    /// the switch wrote, so that its reversal names it the same way.
    fn as_sent(&self, p: &Pending, checked: &Checked<'_>) -> Bytes {
        let svc = self.svc;
        let patch = match (&p.origin, &svc.config.front) {
            (Origin::Node, crate::config::FrontConfig::Simplex(f))
                if f.stamp_by == crate::config::StampBy::Switch =>
            {
                svc.f37_patch(checked, p.node)
            }
            (Origin::Node, crate::config::FrontConfig::Connect(f))
                if f.stamp_by == crate::config::StampBy::Switch =>
            {
                svc.f37_patch(checked, p.node)
            }
            (Origin::Node, _) => return p.request.clone(),
            _ => svc.stamp_patch(checked, p.node),
        };
        match patch {
            Ok(patch) if !patch.is_empty() => Bytes::from(patch.applied_to(&p.request)),
            _ => p.request.clone(),
        }
    }

    /// A response that found no request in flight. True if it was the late
    /// answer to a request the switch answered for its node (handled here:
    /// reversed, logged or counted); false if the book does not know it.
    pub(super) fn late_answer(
        &self,
        key: &CorrelationKey,
        msg: &Message<'_>,
        from: AnswerFrom,
        now: Instant,
    ) -> bool {
        let svc = self.svc;
        let approves = integrity::approves(msg, &svc.made.approval_codes);
        let reverse = approves && svc.made.integrity.late_approval == LateApproval::Reverse;
        let c = &svc.made.counters;
        let late = svc.made.late.late(key, now, reverse);
        let (request, node) = match &late {
            Late::Found(entry) | Late::Covered(entry) => (&entry.request, Some(entry.node)),
            _ => (msg.payload(), None),
        };
        // A balance inquiry's approval moves no money: nothing to reverse.
        let moves_money = match &late {
            Late::Found(entry) => Message::parse(svc.spec(), entry.request.clone())
                .map_or(true, |m| {
                    integrity::moves_money(&m, &svc.spec().integrity().no_reversal_f3)
                }),
            _ => true,
        };
        let link = match from {
            AnswerFrom::Node => Link::Unknown,
            AnswerFrom::Peer => Link::Node,
        };
        let by = match from {
            AnswerFrom::Node => AnsweredBy::Node,
            AnswerFrom::Peer => AnsweredBy::Peer,
        };
        let seen = Seen::new(link, request, by);
        let seen = Seen {
            node,
            response: Some(msg.payload().clone()),
            late: true,
            ..seen
        };
        let reversing = matches!(late, Late::Found(_)) && approves && reverse && moves_money;
        let exchange = match &late {
            // Recorded once its reversal is stored, with the reversal's id.
            _ if reversing => svc.exchange_of(seen, now).map(|(j, ex)| (j.clone(), ex)),
            // Recorded now, with its timeout reversal's id (known once stored).
            Late::Covered(entry) if approves => {
                if let Some((journal, mut ex)) = svc.exchange_of(seen, now) {
                    ex.reversal_id = entry.reversal_id.get().copied();
                    journal.exchange(ex);
                }
                None
            }
            Late::NotRemembered => None,
            _ => {
                svc.note(seen, now);
                None
            }
        };
        match late {
            Late::NotRemembered => false,
            Late::AlreadyReversed => {
                c.late_again.fetch_add(1, Ordering::Relaxed);
                true
            }
            Late::Covered(entry) if !approves => {
                // The host declined after all: the timeout reversal stored for
                // it has nothing to reverse. Cancelled while no attempt is out.
                c.late_declines.fetch_add(1, Ordering::Relaxed);
                self.cancel_timeout_reversal(&entry, msg);
                true
            }
            Late::Found(_) if !approves => {
                c.late_declines.fetch_add(1, Ordering::Relaxed);
                true
            }
            Late::Covered(entry) => {
                // Its timeout reversal, stored as the switch answered, reverses
                // it: counted as reversed, never a second chain. Stored before
                // any answer, it learns now what was approved (F38, the amount),
                // if it is still waiting to be delivered.
                c.late_reversed.fetch_add(1, Ordering::Relaxed);
                tracing::info!(service = svc.name(), message = %summary(msg), "late approval: its timeout reversal is already owed");
                self.complete_timeout_reversal(&entry, msg);
                true
            }
            Late::Found(_) if !moves_money => {
                c.late_not_monetary.fetch_add(1, Ordering::Relaxed);
                tracing::info!(service = svc.name(), message = %summary(msg), "late approval of a request that moves no money (integrity.no_reversal_f3): not reversed");
                true
            }
            Late::Found(entry) if !reverse => {
                c.late_logged.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(service = svc.name(), message = %summary(msg), said = ?entry.said, "late approval of a request the switch answered: logged, not reversed (late_approval = \"log\")");
                true
            }
            Late::Found(entry) => {
                let direction = match from {
                    AnswerFrom::Node => self.toward_node(entry.node),
                    AnswerFrom::Peer => Some(Direction::ToPeer),
                };
                match direction {
                    Some(d) => self.owe_reversal(&entry, d, (Cause::LateApproval, msg), exchange),
                    None => {
                        self.unreversed(msg, "its node is gone");
                        if let Some((journal, ex)) = exchange {
                            journal.exchange(ex);
                        }
                    }
                }
                true
            }
        }
    }

    /// Completes the timeout reversal of `entry` with what the host's late
    /// `approval` says (the dialect's `answer_fields`, `replacement_amounts`),
    /// in the store, while the reversal is still there to deliver. A task of
    /// its own: the store's read and write are never awaited on the message
    /// path.
    fn complete_timeout_reversal(&self, entry: &LateEntry, approval: &Message<'_>) {
        let svc = self.svc;
        let (Some(outbox), Some(&id)) = (svc.made.saf(), entry.reversal_id.get()) else {
            return;
        };
        let spec = std::sync::Arc::clone(svc.spec());
        let Ok(approval) = spec.decode(approval.payload()) else {
            return;
        };
        let store = outbox.store.clone();
        let service = svc.name().to_string();
        tokio::spawn(async move {
            let amend = |stored: &[u8]| {
                let mut rev = spec.decode(stored).ok()?;
                let before = rev.clone();
                integrity::with_answer(&spec, &mut rev, &approval);
                (rev != before).then(|| spec.encode(&rev).ok()).flatten()
            };
            match store.saf_amend(SafId(id), amend).await {
                Ok(true) => {
                    tracing::info!(service, id = %SafId(id), "timeout reversal completed with the late approval's F38 and amount")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(service, id = %SafId(id), error = %e, "timeout reversal not completed with the late approval's F38: delivered as stored")
                }
            }
        });
    }

    /// How long a reversal waits in the store before its first attempt: a
    /// timeout reversal waits `timeout_reversal_hold` for the host's late
    /// answer, which completes it (an approval's F38 and amount) or cancels it
    /// (a decline); a reversal of an approval read is sent at once.
    fn hold_of(&self, cause: Cause) -> i64 {
        let svc = self.svc;
        match cause {
            Cause::Timeout(_) => {
                let hold = svc.made.integrity.timeout_reversal_hold;
                i64::try_from(hold.as_millis()).unwrap_or(i64::MAX)
            }
            Cause::LateApproval | Cause::Undelivered => 0,
        }
    }

    /// Cancels the timeout reversal of `entry`: the host's late answer
    /// declined its original, so there is nothing to reverse. Recorded, not
    /// sent (dropped, with the host's code as the reason). One whose attempt is
    /// out already is left to its answer: a host answers the reversal of a
    /// declined original "not found", which completes it flagged for
    /// reconciliation. A task of its own, as for the store's other writes.
    fn cancel_timeout_reversal(&self, entry: &LateEntry, decline: &Message<'_>) {
        let svc = self.svc;
        let Some(outbox) = svc.made.saf() else {
            return;
        };
        let Some(&id) = entry.reversal_id.get() else {
            // Not stored yet (its store write is still under way): it goes out
            // and the host's "not found" completes it, flagged.
            tracing::info!(service = svc.name(), message = %summary(decline), "late decline: its timeout reversal is not stored yet; it is sent, and flagged when the host says it has no original");
            return;
        };
        let f39 = decline
            .field(39)
            .ok()
            .flatten()
            .map(|f| f.show().to_string())
            .unwrap_or_default();
        let reason = format!(
            "cancelled: the host declined the original late ({} F39 {f39})",
            decline.mti()
        );
        let store = outbox.store.clone();
        let cancelled = std::sync::Arc::clone(&svc.made.counters.timeout_reversals_cancelled);
        let service = svc.name().to_string();
        tokio::spawn(async move {
            match store.saf_cancel(SafId(id), now_millis(), &reason).await {
                Ok(true) => {
                    cancelled.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(service, id = %SafId(id), %reason, "timeout reversal cancelled before delivery");
                }
                Ok(false) => {
                    tracing::info!(service, id = %SafId(id), "late decline: its timeout reversal is out already; the host's answer completes it")
                }
                Err(e) => {
                    tracing::warn!(service, id = %SafId(id), error = %e, "late decline: its timeout reversal could not be cancelled; it is sent")
                }
            }
        });
    }

    /// Builds the reversal of `entry`'s request and hands it to the store; once
    /// stored, the delivery loop sends it.
    pub(super) fn owe_reversal(
        &self,
        entry: &LateEntry,
        direction: Direction,
        (cause, answer): (Cause, &Message<'_>),
        exchange: Option<(Journal, Exchange)>,
    ) {
        let svc = self.svc;
        let stored_as = std::sync::Arc::clone(&entry.reversal_id);
        let unreversed = |answer, why| {
            self.unreversed(answer, why);
            if let Some((journal, ex)) = exchange.as_ref() {
                journal.exchange(copy(ex));
            }
        };
        let Some(outbox) = svc.made.saf() else {
            return unreversed(answer, "no store (set data_dir or [store])");
        };
        let built = svc
            .spec()
            .decode(&entry.request)
            .map_err(|e| e.to_string())
            .and_then(|original| {
                let mut rev =
                    integrity::reversal(svc.spec(), &original).map_err(|e| e.to_string())?;
                // An approval's reversal names what was approved: its F38, and
                // the amount approved where it differs from the amount asked.
                if matches!(cause, Cause::LateApproval | Cause::Undelivered) {
                    let approval = svc.spec().decode(answer.payload());
                    if let Ok(approval) = approval {
                        integrity::with_answer(svc.spec(), &mut rev, &approval);
                    }
                }
                let payload = svc.spec().encode(&rev).map_err(|e| e.to_string())?;
                Ok((rev, payload))
            });
        let (rev, payload) = match built {
            Ok(b) => b,
            Err(e) => return unreversed(answer, &e),
        };
        let now = now_millis();
        let entry = NewSafEntry {
            service: svc.name().to_string(),
            direction,
            kind: SafKind::Reversal,
            mti: rev.mti.as_str().to_string(),
            payload,
            keys: self.keys_of(&rev),
            created_at: now,
            expires_at: outbox.policy.expires_at(now),
            first_attempt_at: now.saturating_add(self.hold_of(cause)),
        };
        // Logged (masked) before the store has it: if the process dies before
        // the commit, this line is what the reconciliation starts from.
        match cause {
            Cause::LateApproval => {
                tracing::warn!(service = svc.name(), message = %summary(answer), "late approval: reversing it");
            }
            Cause::Timeout(reason) => {
                tracing::info!(service = svc.name(), message = %summary(answer), reason = reason.as_str(), "outcome unknown at the host: a timeout reversal");
            }
            Cause::Undelivered => {
                tracing::warn!(service = svc.name(), message = %summary(answer), "approval in time that the client never got: reversing it");
            }
        }
        let task = StoreReversal {
            cause,
            stored_as,
            store: outbox.store.clone(),
            wake: std::sync::Arc::clone(&outbox.wake),
            counters: std::sync::Arc::clone(&svc.made.counters),
            service: svc.name().to_string(),
            what: summary(answer).to_string(),
            give_up_after: svc.made.integrity.late_window.max(MIN_STORE_RETRY),
            exchange,
        };
        tokio::spawn(task.run(entry));
    }

    /// A late approval the switch could not reverse: counted and logged
    /// (masked) at ERROR for reconciliation.
    pub(super) fn unreversed(&self, answer: &Message<'_>, why: &str) {
        let svc = self.svc;
        svc.made
            .counters
            .late_unreversed
            .fetch_add(1, Ordering::Relaxed);
        tracing::error!(service = svc.name(), message = %summary(answer), why, "late approval NOT reversed: reconcile by hand");
    }

    /// The listing keys of an owed message: F11, F37, F7 and the PAN masked as
    /// the spec masks it (first 6 and last 4 at most). Nothing else.
    fn keys_of(&self, d: &Decoded) -> SafKeys {
        let svc = self.svc;
        let text = |id: u16| d.get(id).and_then(|v| v.as_text()).map(str::to_string);
        let pan = svc
            .spec()
            .field(2)
            .and_then(|def| d.get(2).map(|v| v.show(def).to_string()));
        SafKeys {
            f11: text(11),
            f37: text(37),
            f7: text(7),
            pan_masked: pan,
            original: integrity::original_key(d),
        }
    }
}
