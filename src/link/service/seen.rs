//! Requests seen before: a repeat or a terminal's reversal goes to the
//! node of its original; the same transaction sent again (a duplicate) is
//! answered from the duplicate book, or waits for the one in flight, and
//! never reaches a host twice (docs/integrity.md, "Duplicates").

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

    /// What the duplicate book knows a request of `key` by, when it may
    /// have duplicates: an approvable one (0100, 0200 and their repeats);
    /// [`Identity::NONE`] for the rest, or with duplicates off. Its fields
    /// are read off the router's index; those in the key, from the key.
    pub(super) fn identity_of(&self, req: &Checked<'_>, key: &CorrelationKey) -> Identity {
        let book = &self.made.duplicates;
        if !book.is_on() || !crate::route::integrity::is_approvable(req.msg.mti()) {
            return Identity::NONE;
        }
        let parts = book
            .fields()
            .iter()
            .map(|&id| req.field(id).map_or(&[][..], |f| f.data()));
        book.identify(key, parts)
    }

    /// A request answered before, within `duplicate_window`, gets that
    /// answer again (or 94) and never reaches a node (one still in flight:
    /// see [`Service::wait_for_same`]). The origin comes back when the
    /// request is new, or a repeat (which goes by its own rules).
    pub(super) fn same_as_before(
        &self,
        req: &Checked<'_>,
        identity: Identity,
        origin: Origin,
        now: Instant,
    ) -> Option<Origin> {
        if identity.is_none() || req.msg.mti().is_repeat() || !origin.takes_switch_answers() {
            return Some(origin);
        }
        let c = &self.made.counters;
        let request = req.msg.payload();
        let Some(seen) = self.made.duplicates.find(identity, now) else {
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

    /// The node's answer to a request also goes to the duplicates and
    /// repeats that waited for it, and is kept for later duplicates. An
    /// answer its sender never got (or may not have got) is kept as the
    /// switch's, and those that waited are declined as duplicates: the
    /// approval is being reversed, so no terminal may show it approved.
    pub(super) fn answer_same(
        &self,
        same: SameRequest,
        (request, mti): (&Bytes, Mti),
        response: &Bytes,
        delivered: bool,
        now: Instant,
    ) {
        if same.identity.is_none() {
            return;
        }
        let kept: &[u8] = if delivered { response } else { &[] };
        self.made.duplicates.record(same.identity, kept, now);
        let Some(waiting) = same.waiting else {
            return;
        };
        for origin in *waiting {
            self.made
                .counters
                .duplicates_waited
                .fetch_add(1, Ordering::Relaxed);
            if delivered {
                self.replay(origin, request, response.clone(), now);
            } else {
                let asked = (request, Some(mti));
                self.decline_noted(origin, asked, DeclineReason::Duplicate, None, now);
            }
        }
    }
}
