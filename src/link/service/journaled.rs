//! What the service tells the journal (`crate::journal`): one call per
//! exchange as it completes. The request and answer go as they are
//! (reference-counted bytes); `Journal::exchange` makes them a fixed-size
//! masked row there and then (one pass over each message, no allocation)
//! and lets the buffers go, and the journal's writer task inserts the rows
//! in batches.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::{Pending, Service};
use crate::config::FrontConfig;
use crate::journal::row::{self, RequestAt};
use crate::journal::{AnsweredBy, BadOutcome, Exchange, Journal, Link};
use crate::route::{Checked, DeclineReason};

/// The journal as one service sees it: the handle and what every row of the
/// service shares.
pub struct JournalTap {
    pub journal: Journal,
    service: Arc<str>,
    front: &'static str,
    /// The router indexes every field a row reads ([`row::READ`]), so a
    /// request in flight keeps where they lie ([`RequestAt`]).
    indexed: bool,
}

impl JournalTap {
    pub fn new(journal: Journal, service: &Service, indexed: bool) -> JournalTap {
        let front = match &service.config.front {
            FrontConfig::Listen(_) if service.side.oneconnect().is_some() => "oneconnect",
            FrontConfig::Listen(_) => "listen",
            FrontConfig::Simplex(_) => "simplex",
            FrontConfig::Connect(_) => "connect",
        };
        JournalTap {
            journal,
            service: service.name().into(),
            front,
            indexed,
        }
    }
}

/// One completed exchange, as the service knows it.
pub(crate) struct Seen<'a> {
    pub link: Link,
    pub from_node: bool,
    pub node: Option<usize>,
    /// When the request came in (when it was sent on, for one in flight);
    /// `None`: answered at once.
    pub since: Option<Instant>,
    pub request: &'a Bytes,
    /// Where the router found the request's journal fields, if kept.
    pub request_at: Option<RequestAt>,
    pub response: Option<Bytes>,
    pub by: AnsweredBy,
    pub late: bool,
    pub reversal_id: Option<i64>,
    pub bad: Option<BadOutcome>,
}

impl<'a> Seen<'a> {
    pub fn new(link: Link, request: &'a Bytes, by: AnsweredBy) -> Seen<'a> {
        Seen {
            link,
            from_node: matches!(link, Link::Node),
            node: None,
            since: None,
            request,
            request_at: None,
            response: None,
            by,
            late: false,
            reversal_id: None,
            bad: None,
        }
    }
}

fn unix_millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Service {
    /// Gives the service its journal (once, at start, before the first
    /// message: the router then indexes the fields a row reads as it checks
    /// each message, for the price of recording them).
    pub fn set_journal(&mut self, journal: Journal) -> bool {
        let indexed = self.router.index_also(&row::READ);
        if !indexed {
            tracing::info!(
                service = self.name(),
                "routing reads too many fields to index the journal's too: each row reads its request again"
            );
        }
        let tap = JournalTap::new(journal, self, indexed);
        self.journal.set(tap).is_ok()
    }

    /// Where `req`'s journal fields lie, to keep while it is in flight;
    /// `None` without a journal, or when the router does not index them.
    pub(super) fn journal_at(&self, req: &Checked<'_>) -> Option<RequestAt> {
        self.journal
            .get()
            .filter(|tap| tap.indexed)
            .and_then(|_| RequestAt::of(req))
    }

    /// What a request in flight keeps of what accepting it learnt.
    pub(super) fn facts_of(&self, req: &Checked<'_>) -> super::RequestFacts {
        super::RequestFacts::of(req, self.journal_at(req))
    }

    /// The service's journal, if it has one.
    pub fn journal(&self) -> Option<&Journal> {
        self.journal.get().map(|t| &t.journal)
    }

    /// A request answered by the node (or the peer) it was sent to at
    /// `sent.1`.
    pub(super) fn note_answer(
        &self,
        link: Link,
        by: AnsweredBy,
        sent: (usize, Instant),
        (request, request_at): (&Bytes, Option<RequestAt>),
        response: &Checked<'_>,
        now: Instant,
    ) {
        // The common case (no journal) touches nothing of the response.
        if self.journal.get().is_none() {
            return;
        }
        let seen = Seen::new(link, request, by);
        let seen = Seen {
            node: Some(sent.0),
            since: Some(sent.1),
            request_at,
            ..seen
        };
        // The answer is read off the router's parse and index of it, not
        // parsed again.
        if let Some((journal, exchange)) = self.exchange_of(seen, now) {
            journal.answered(exchange, response);
        }
    }

    /// A request that failed validation and got no answer (dropped, or its
    /// connection closed).
    pub(super) fn note_bad(&self, conn: u64, payload: &Bytes, bad: BadOutcome, now: Instant) {
        let seen = Seen::new(
            Link::Client(conn),
            payload,
            AnsweredBy::Nobody(bad.as_str()),
        );
        self.note(
            Seen {
                bad: Some(bad),
                ..seen
            },
            now,
        );
    }

    /// A request in flight that ends without a decline to a client: let
    /// expire in silence, or a node's own (declined to the node).
    pub(super) fn note_ended(
        &self,
        p: &Pending,
        reason: DeclineReason,
        silent: bool,
        now: Instant,
    ) {
        let by = if silent {
            AnsweredBy::Withheld(reason)
        } else {
            AnsweredBy::Switch(reason)
        };
        if let Some(link) = p.origin.journal_link() {
            let seen = Seen::new(link, &p.request, by);
            let seen = Seen {
                node: Some(p.node),
                since: Some(p.sent_at),
                ..seen
            };
            self.note(seen, now);
        }
    }

    /// The switch's answer to a client or the peer (`response`: the
    /// decline sent, if any), for a request in flight since `sent`.
    pub(super) fn note_decline(
        &self,
        link: Link,
        request: &Bytes,
        sent: Option<(usize, Instant)>,
        (by, response): (AnsweredBy, Option<Bytes>),
        now: Instant,
    ) {
        let bad = matches!(
            by,
            AnsweredBy::Switch(DeclineReason::BadMessage)
                | AnsweredBy::Withheld(DeclineReason::BadMessage)
        )
        .then_some(BadOutcome::Declined);
        let seen = Seen::new(link, request, by);
        let seen = Seen {
            node: sent.map(|s| s.0),
            since: sent.map(|s| s.1),
            response,
            bad,
            ..seen
        };
        self.note(seen, now);
    }

    /// Records a completed exchange; nothing without a journal.
    pub(crate) fn note(&self, seen: Seen<'_>, now: Instant) {
        if let Some((journal, exchange)) = self.exchange_of(seen, now) {
            journal.exchange(exchange);
        }
    }

    /// The exchange `seen` describes, for a caller that records it later
    /// (a late approval, once its reversal is stored); `None` without a
    /// journal.
    pub(crate) fn exchange_of(&self, seen: Seen<'_>, now: Instant) -> Option<(&Journal, Exchange)> {
        let tap = self.journal.get()?;
        let waited = seen
            .since
            .map(|t| now.saturating_duration_since(t))
            .unwrap_or(Duration::ZERO);
        let wall = SystemTime::now();
        let t_out = unix_millis(wall);
        let t_in = unix_millis(wall.checked_sub(waited).unwrap_or(wall));
        let node = seen.node.and_then(|n| self.pool.node(n)).map(|n| n.id);
        let exchange = Exchange {
            spec: Arc::clone(self.spec()),
            service: Arc::clone(&tap.service),
            front: tap.front,
            link: seen.link,
            node,
            from_node: seen.from_node,
            t_in,
            t_out,
            latency_us: seen
                .since
                .map(|_| u64::try_from(waited.as_micros()).unwrap_or(u64::MAX)),
            request: seen.request.clone(),
            request_at: seen.request_at,
            response: seen.response,
            answered_by: seen.by,
            late: seen.late,
            reversal_id: seen.reversal_id,
            bad: seen.bad,
        };
        Some((&tap.journal, exchange))
    }
}
