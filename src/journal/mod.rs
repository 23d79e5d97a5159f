//! The transaction journal: one masked row per exchange, and one per admin
//! action, in the store (docs/journal.md).
//!
//! The message path hands a [`Journal`] an [`Exchange`]: the request and
//! answer as they already are (reference-counted [`Bytes`]) with who
//! answered and when. [`row`] takes what a row keeps there and then: the
//! fields copied as they lie, from where the router found them, the PAN
//! masked by the one masking rule (`iso8583::mask`), into a fixed-size
//! [`raw::RawRow`], no allocation; the messages' buffers go back to their
//! connections at once. `try_send` on a bounded queue: a full queue drops
//! the row and counts it, it never waits. The journal writer task
//! ([`writer`]) wakes once per `journal.batch_interval`, makes the rows'
//! texts ([`raw::RawRow::row`], off the message path) and inserts what
//! came in one transaction, a few multi-row statements. Rows never hold
//! track data, PIN blocks, EMV data, MACs or key material: the row taker
//! reads a fixed list of fields and nothing else.

pub mod chart;
pub mod guard;
pub mod params;
pub mod raw;
pub mod report;
pub mod row;
mod text;
pub mod writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::iso8583::Spec;
use crate::route::{DeclineReason, NodeId};

pub use crate::store::journal::{AdminRow, JournalFilter, JournalRow, NewRow, OutcomeFilter};

/// One exchange as the message path saw it; the writer makes it a row.
/// It holds the messages whole (PAN and all) until then: its `Debug` shows
/// their lengths only.
pub struct Exchange {
    pub spec: Arc<Spec>,
    pub service: Arc<str>,
    /// The front kind: `listen`, `oneconnect`, `simplex`, `connect`.
    pub front: &'static str,
    pub link: Link,
    /// The node the request went to (or came from, for a node's own).
    pub node: Option<NodeId>,
    /// Who started it: the front (a client, the peer) or a node.
    pub from_node: bool,
    /// Unix milliseconds: when the request came in and the answer went out.
    pub t_in: i64,
    pub t_out: i64,
    /// Microseconds from request in to answer out, when measured.
    pub latency_us: Option<u64>,
    /// The request as received.
    pub request: Bytes,
    /// Where the router found the request's journal fields, when it did
    /// (a request answered in flight); else the row walks the request.
    pub request_at: Option<row::RequestAt>,
    /// The answer as sent (a node's, the peer's or the switch's), if any.
    pub response: Option<Bytes>,
    pub answered_by: AnsweredBy,
    /// A node's answer that came after the switch had answered for it.
    pub late: bool,
    /// The store id of the reversal a late approval was given.
    pub reversal_id: Option<i64>,
    /// A request that failed validation, and what the front did with it.
    pub bad: Option<BadOutcome>,
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("service", &self.service)
            .field("link", &self.link)
            .field("node", &self.node.map(|n| n.to_string()))
            .field("request_len", &self.request.len())
            .field("response_len", &self.response.as_ref().map(Bytes::len))
            .field("answered_by", &self.answered_by)
            .field("late", &self.late)
            .finish_non_exhaustive()
    }
}

/// The link a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// A front client connection, by its connection number.
    Client(u64),
    /// The peer of a simplex or duplex front.
    Peer,
    /// A node's link (a node's own request).
    Node,
    /// Not known any more (a late answer: the switch answered its request
    /// long ago).
    Unknown,
}

impl Link {
    pub fn text(self) -> String {
        match self {
            Link::Client(conn) => format!("client#{conn}"),
            Link::Peer => "peer".to_string(),
            Link::Node => "node".to_string(),
            Link::Unknown => "-".to_string(),
        }
    }
}

/// Who answered an exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnsweredBy {
    /// The node it went to.
    Node,
    /// The peer (a node's own request on a simplex or duplex front).
    Peer,
    /// The switch, for the node, with why.
    Switch(DeclineReason),
    /// The switch, having stored an advice durably for delivery to a node
    /// later (`advices = "store-and-forward"`).
    Stored,
    /// Nobody: the switch would have answered for this reason but stays
    /// silent (`switch_made = "silent"`, `on_timeout = "silent"`).
    Withheld(DeclineReason),
    /// Nobody, and the switch had no answer to give: a bad request dropped
    /// or its connection closed, or no decline could be built.
    Nobody(&'static str),
}

impl AnsweredBy {
    /// The `answered_by` column.
    pub fn who(self) -> &'static str {
        match self {
            AnsweredBy::Node => "node",
            AnsweredBy::Peer => "peer",
            AnsweredBy::Switch(_) | AnsweredBy::Stored => "switch",
            AnsweredBy::Withheld(_) | AnsweredBy::Nobody(_) => "none",
        }
    }

    /// The `reason` column.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            AnsweredBy::Node | AnsweredBy::Peer => None,
            AnsweredBy::Switch(r) | AnsweredBy::Withheld(r) => Some(r.as_str()),
            AnsweredBy::Stored => Some("stored"),
            AnsweredBy::Nobody(why) => Some(why),
        }
    }
}

/// What a front did with a request that failed validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadOutcome {
    Declined,
    Dropped,
    Closed,
}

impl BadOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            BadOutcome::Declined => "declined",
            BadOutcome::Dropped => "dropped",
            BadOutcome::Closed => "closed",
        }
    }
}

/// What goes on the journal's queue.
#[derive(Debug)]
// A row is moved through the queue as it is: boxing it would cost the
// message path an allocation per exchange, for the rare admin row's sake.
#[allow(clippy::large_enum_variant)]
pub enum Entry {
    /// An exchange as the message path took it: the writer makes its
    /// texts ([`raw::RawRow::row`]).
    Exchange(raw::RawRow),
    /// A row already made.
    Row(NewRow),
    Admin(AdminRow),
}

/// The journal's counters, for metrics and the status page.
#[derive(Debug, Default)]
pub struct JournalCounters {
    /// Entries refused by a full queue (the writer was behind): lost.
    pub dropped: AtomicU64,
    /// Exchange rows committed.
    pub written: AtomicU64,
    /// Admin rows committed.
    pub admin_written: AtomicU64,
    /// Rows lost to a failed insert (the store refused the batch).
    pub failed: AtomicU64,
    /// Rows deleted by retention, and by the disk guard (its oldest days).
    pub purged: AtomicU64,
    /// The disk guard paused the journal: past `journal.max_size` or
    /// `journal.min_free` with only today's rows left ([`guard`]).
    pub paused: AtomicBool,
    /// Entries not written because the journal was paused: lost.
    pub paused_rows: AtomicU64,
    /// Today's exceptions (rows whose outcome is not `answered`), by
    /// outcome, as this instance wrote them: the status page's counts.
    pub today: std::sync::Mutex<Today>,
}

/// Exceptions written since midnight UTC (or since start), by outcome.
#[derive(Debug, Default, Clone)]
pub struct Today {
    /// Days since the Unix epoch.
    pub day: i64,
    pub by_outcome: std::collections::BTreeMap<String, u64>,
}

impl JournalCounters {
    /// Counts a written row's outcome under its day; a new day starts over.
    pub fn count_today(&self, t_in: i64, outcome: &str) {
        if outcome == "answered" {
            return;
        }
        let day = t_in.div_euclid(86_400_000);
        let mut today = self.today.lock().unwrap_or_else(|p| p.into_inner());
        if day > today.day {
            *today = Today {
                day,
                ..Today::default()
            };
        }
        if day == today.day {
            *today.by_outcome.entry(outcome.to_string()).or_default() += 1;
        }
    }

    /// Today's exceptions as of `now_ms` (empty once the day has passed).
    pub fn today(&self, now_ms: i64) -> std::collections::BTreeMap<String, u64> {
        let today = self.today.lock().unwrap_or_else(|p| p.into_inner());
        if today.day == now_ms.div_euclid(86_400_000) {
            today.by_outcome.clone()
        } else {
            Default::default()
        }
    }
}

/// The message path's end of the journal. Cheap to clone.
#[derive(Clone)]
pub struct Journal {
    tx: mpsc::Sender<Entry>,
    pub counters: Arc<JournalCounters>,
    /// The store the rows go to, for the readers (admin API, status page).
    pub store: Option<crate::store::Store>,
}

impl Journal {
    /// A journal and the receiving end its writer drains.
    pub fn channel(queue: usize) -> (Journal, mpsc::Receiver<Entry>) {
        let (tx, rx) = mpsc::channel(queue.max(1));
        (
            Journal {
                tx,
                counters: Arc::default(),
                store: None,
            },
            rx,
        )
    }

    /// Makes `exchange` a row and queues it; never waits. A full queue
    /// drops it, counted. An echo test makes no row.
    pub fn exchange(&self, exchange: Exchange) {
        if let Some(row) = row::take(exchange) {
            self.offer(Entry::Exchange(row));
        }
    }

    /// [`Journal::exchange`] for an answer the router has already parsed
    /// and indexed (`exchange.response` is not read): the row takes the
    /// answer's fields from that parse.
    pub fn answered(&self, exchange: Exchange, response: &crate::route::Checked<'_>) {
        if let Some(row) = row::take_answered(exchange, response) {
            self.offer(Entry::Exchange(row));
        }
    }

    /// Queues an admin action; never waits. A full queue drops it, counted.
    pub fn admin(&self, row: AdminRow) {
        self.offer(Entry::Admin(row));
    }

    fn offer(&self, entry: Entry) {
        if self.tx.try_send(entry).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Entries waiting for the writer.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    pub fn capacity(&self) -> usize {
        self.tx.max_capacity()
    }
}

/// Unix milliseconds now.
pub fn now_millis() -> i64 {
    crate::store::saf::now_millis()
}
