//! Requests seen before: a repeat or a terminal's reversal goes to the
//! node of its original; the same transaction sent again (a duplicate) is
//! answered with the answer the correlation table kept for its key, or
//! waits for the one in flight, and never reaches a host twice
//! (docs/integrity.md, "Duplicates").

use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;

use super::{Origin, Pending, Service, summary};
use crate::iso8583::Mti;
use crate::journal::AnsweredBy;
use crate::route::integrity::{Duplicate, Identity};
use crate::route::{Checked, CorrelationKey, DeclineReason};

/// What the duplicate book knows a request by ([`Identity::NONE`]: it has
/// no duplicates: not approvable, or duplicates are off), and the senders
/// of its duplicates and repeats that arrived while it was in flight: each
/// gets its answer too.
#[derive(Debug, Default)]
pub struct SameRequest {
    pub identity: Identity,
    pub waiting: Option<Box<Vec<Origin>>>,
}

impl Service {
    /// The node that answered the original of a reversal from the front,
    /// while the repeat book remembers it: looked up under the original's
    /// key (its MTI class from F90 when the reversal carries one, else a
    /// purchase's or an authorization's), since a terminal's 0400 carries
    /// its original's STAN and terminal ID.
    pub(super) fn original_node(&self, req: &Checked<'_>, now: Instant) -> Option<usize> {
        let from_f90 = req.msg.field(90).ok().flatten().and_then(|f| {
            let mut digits = f.logical();
            Some([digits.next()?, digits.next()?])
        });
        let named;
        let classes: &[[u8; 2]] = match from_f90 {
            Some(class) => {
                named = [class];
                &named
            }
            None => &[*b"02", *b"01"],
        };
        classes.iter().find_map(|&class| {
            let key = self.router.key_as(req, class).ok()?;
            self.made.repeats.node_of(&key, now)
        })
    }

    /// What the duplicate book knows a request by, when it may have
    /// duplicates: an approvable one (0100, 0200 and their repeats);
    /// [`Identity::NONE`] for the rest, or with duplicates off. It is the
    /// fingerprint of the identifying fields its correlation key lacks,
    /// read off the router's index: the correlation table, which keeps the
    /// answers, knows the request by its whole key.
    pub(super) fn identity_of(&self, req: &Checked<'_>) -> Identity {
        let book = &self.made.duplicates;
        if !book.is_on() || !crate::route::integrity::is_approvable(req.msg.mti()) {
            return Identity::NONE;
        }
        let parts = book
            .fields()
            .iter()
            .map(|&id| req.field_data(id).unwrap_or_default());
        book.fingerprint(parts)
    }

    /// How a request known as `identity` registers in the correlation
    /// table: its identity, and whether the table looks for the same
    /// transaction answered before (the time now): for a new request from
    /// a client or the peer. A repeat goes by its own rules (to the host);
    /// its answer is kept all the same.
    pub(super) fn looked_up(
        &self,
        req: &Checked<'_>,
        identity: Identity,
        origin: &Origin,
        now: Instant,
    ) -> (Identity, Option<Instant>) {
        let look =
            !identity.is_none() && !req.msg.mti().is_repeat() && origin.takes_switch_answers();
        (identity, look.then_some(now))
    }

    /// A request refused (its registration found the same transaction
    /// answered within `duplicate_window`, or no node could take it) gets
    /// the answer the first got again (or 94), and never reaches a node
    /// (one still in flight: see [`Service::wait_for_same`]). The origin
    /// comes back when it is no duplicate, or a repeat (which goes by its
    /// own rules).
    pub(super) fn same_as_before(
        &self,
        req: &Checked<'_>,
        key: &CorrelationKey,
        identity: Identity,
        origin: Origin,
        now: Instant,
    ) -> Option<Origin> {
        if let (_, None) = self.looked_up(req, identity, &origin, now) {
            return Some(origin);
        }
        let c = &self.made.counters;
        let request = req.msg.payload();
        let Some(seen) = self.in_flight.seen(key, identity, now) else {
            return Some(origin);
        };
        match seen {
            Duplicate::Replay(answer) => {
                c.duplicates_replayed.fetch_add(1, Ordering::Relaxed);
                tracing::info!(service = self.name(), message = %summary(&req.msg), "duplicate of a request answered before: its answer sent again, not relayed");
                self.replay(origin, request, Bytes::from(answer), now);
            }
            Duplicate::Answered => {
                c.duplicates_declined.fetch_add(1, Ordering::Relaxed);
                tracing::info!(service = self.name(), message = %summary(&req.msg), "duplicate of a request answered before: declined, not relayed");
                self.decline_checked(origin, req, DeclineReason::Duplicate);
            }
        }
        None
    }

    /// A request refused registration because its key is in flight: when
    /// it is the same transaction (a duplicate, or a repeat sent before the
    /// answer came), its sender waits for that answer instead of a 94.
    /// Gives the request back otherwise.
    pub(super) fn wait_for_same(&self, key: &CorrelationKey, p: Pending) -> Option<Pending> {
        let identity = p.same.identity;
        if identity.is_none() || !p.origin.takes_switch_answers() {
            return Some(p);
        }
        let mut p = Some(p);
        self.in_flight.with_mut(key, |first| {
            if first.same.identity != identity {
                return;
            }
            if let Some(p) = p.take() {
                let waiting = first.same.waiting.get_or_insert_with(Default::default);
                waiting.push(p.origin);
            }
        });
        // Taken only by a request in flight with the same identity.
        p
    }

    /// Sends a duplicate the answer its first sending got, and journals it.
    pub(super) fn replay(&self, origin: Origin, request: &Bytes, answer: Bytes, now: Instant) {
        let Some(link) = origin.journal_link() else {
            return;
        };
        self.note_decline(
            link,
            request,
            None,
            (
                AnsweredBy::Switch(DeclineReason::Duplicate),
                Some(answer.clone()),
            ),
            now,
        );
        // Only a client or the peer asks twice; the switch's own messages
        // take no answer and count nothing here.
        let asker = origin.takes_switch_answers();
        let sent = origin.answer(self, request, answer);
        if asker && !sent {
            self.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The answer kept for a request's duplicates is withheld: its sender
    /// may not have it. Whether a duplicate was sent it first (then a
    /// terminal has it, and it is no undelivered answer).
    pub(super) fn withhold_same(&self, key: &CorrelationKey, same: &SameRequest) -> bool {
        !same.identity.is_none() && self.in_flight.withhold(key, same.identity)
    }

    /// The node's answer to a request also goes to the duplicates and
    /// repeats that waited for it (the correlation table kept it for later
    /// duplicates when it took the request). An answer no terminal got
    /// (`had` false: its sender gone, the answer withheld by
    /// [`Service::withhold_same`]) is declined to those that waited, as
    /// duplicates: the approval is being reversed, so no terminal may show
    /// it approved.
    pub(super) fn answer_same(
        &self,
        same: SameRequest,
        (request, mti): (&Bytes, Mti),
        response: &Bytes,
        had: bool,
        now: Instant,
    ) {
        let Some(waiting) = same.waiting else {
            return;
        };
        for origin in *waiting {
            self.made
                .counters
                .duplicates_waited
                .fetch_add(1, Ordering::Relaxed);
            if had {
                self.replay(origin, request, response.clone(), now);
            } else {
                let asked = (request, Some(mti));
                self.decline_noted(origin, asked, DeclineReason::Duplicate, None, now);
            }
        }
    }
}
