//! What flows between a [`super::Store`] handle and its backend's single
//! writer: one [`Op`] per request, answered on its own oneshot once the
//! transaction holding it has committed.
//!
//! Group commit: the writer takes the first waiting request, then whatever
//! else is already queued (up to `store.batch`), and runs them all in one
//! transaction, so one sync covers the batch. Requests arriving meanwhile
//! form the next batch.
//!
//! The ops are the store's vocabulary, shared by both backends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};

use super::error::StoreError;
use super::journal::{AdminRow, JournalFilter, JournalRow, NewRow};
use super::journal_report::Report;
use super::rows::{ClaimedSaf, SafRow, StoredPayload};
use super::saf::{NewSafEntry, SafFilter, SafId, SafOwed, SafStats, UnixMillis};

/// One operation of the store.
#[derive(Debug)]
pub(crate) enum Op {
    SafPut(NewSafEntry),
    SafClaim {
        owner: String,
        now: UnixMillis,
        max: usize,
        lease_until: UnixMillis,
    },
    SafAttempted {
        id: SafId,
        owner: String,
        next_attempt_at: UnixMillis,
        error: String,
    },
    SafDelivered {
        id: SafId,
        owner: String,
        now: UnixMillis,
        answer: String,
        /// Why a reconciliation team should look at it (the host took it
        /// with a code such as 25 "original not found"); none when plain.
        reason: Option<String>,
    },
    SafDead {
        id: SafId,
        now: UnixMillis,
        reason: String,
    },
    /// The pending entry a peer's answer names: `service`'s oldest pending
    /// entry to the peer with these F11, F7 and F37.
    SafOwedToPeer {
        service: String,
        f11: String,
        f7: String,
        f37: String,
    },
    SafRetryNow {
        id: SafId,
        now: UnixMillis,
    },
    SafDrop {
        id: SafId,
        now: UnixMillis,
        reason: String,
    },
    /// Drops a pending entry no attempt holds now (a timeout reversal whose
    /// original the host declined late): never sent, kept as a record with
    /// `reason`. `Changed(0)` when an attempt is out (its answer completes
    /// the entry) or the entry is no longer pending.
    SafCancel {
        id: SafId,
        now: UnixMillis,
        reason: String,
    },
    /// Fixes the node of an entry for any node (a client's advice) to the
    /// one its first attempt chose, while `owner` holds its lease: every
    /// repeat goes to the host that may have booked the first.
    SafPin {
        id: SafId,
        owner: String,
        node: String,
    },
    /// Clears every lease `owner` holds: its process is gone (a restart of
    /// the same instance), so no attempt of it is still waiting.
    SafReleaseLeases {
        owner: String,
    },
    /// Delete at most `limit` delivered or dropped entries completed before
    /// `before`.
    SafPrune {
        before: UnixMillis,
        limit: usize,
    },
    SafList(SafFilter),
    SafStats {
        now: UnixMillis,
    },
    SafOwed {
        now: UnixMillis,
    },
    MetaGet(String),
    MetaPut(String, String),
    /// Journal rows and admin rows, inserted with prepared statements.
    JournalPut {
        rows: Vec<NewRow>,
        admin: Vec<AdminRow>,
    },
    JournalQuery(JournalFilter),
    AdminQuery {
        since: Option<UnixMillis>,
        limit: usize,
    },
    /// Deletes at most `limit` rows older than `before` from each of the
    /// journal and the completed SAF records.
    JournalPurge {
        before: UnixMillis,
        limit: usize,
    },
    /// Deletes at most `limit` admin audit rows older than `before`: the
    /// audit has a retention of its own (`admin.audit_retain`).
    AdminPurge {
        before: UnixMillis,
        limit: usize,
    },
    JournalReport {
        since: UnixMillis,
        until: UnixMillis,
    },
    /// What the journal takes of the store, for the disk guard.
    JournalSpace,
    /// Entries that keep a payload (pending and dead ones), ascending from
    /// after `after`, at most `limit`: what `store rekey` walks.
    SafPayloads {
        after: SafId,
        limit: usize,
    },
    /// Replaces an entry's payload, only if it is still `old` (a delivery
    /// that cleared it meanwhile wins).
    SafReseal {
        id: SafId,
        old: Vec<u8>,
        new: Vec<u8>,
    },
    /// Finish the queue ahead of it, then close the database.
    Close,
}

/// What an op produced.
#[derive(Debug)]
pub(crate) enum Outcome {
    Id(SafId),
    /// Rows an op changed.
    Changed(u64),
    Claimed(Vec<ClaimedSaf>),
    Done,
    Rows(Vec<SafRow>),
    Stats(SafStats),
    Owed(Vec<SafOwed>),
    Meta(Option<String>),
    JournalRows(Vec<JournalRow>),
    AdminRows(Vec<AdminRow>),
    Report(Box<Report>),
    Space(super::disk::JournalSpace),
    Payloads(Vec<StoredPayload>),
}

impl Op {
    /// Whether the op's commit must reach the disk before it is answered:
    /// everything but the journal's own writes (and reads). A batch of
    /// journal rows only may commit without a sync of its own: a process
    /// crash loses none of it, and the next synced commit (any SAF change,
    /// a checkpoint) makes it durable against power loss too
    /// (docs/journal.md).
    pub fn needs_sync(&self) -> bool {
        !(self.reads_only()
            || matches!(
                self,
                Op::JournalPut { .. } | Op::JournalPurge { .. } | Op::AdminPurge { .. }
            ))
    }

    /// Whether the op only reads: a batch of such ops needs no write lock
    /// (SQLite), so a long query never holds up the switch's writes.
    pub fn reads_only(&self) -> bool {
        matches!(
            self,
            Op::SafList(_)
                | Op::SafOwedToPeer { .. }
                | Op::SafStats { .. }
                | Op::SafOwed { .. }
                | Op::MetaGet(_)
                | Op::JournalQuery(_)
                | Op::AdminQuery { .. }
                | Op::JournalReport { .. }
                | Op::JournalSpace
                | Op::SafPayloads { .. }
        )
    }
}

pub(crate) type Answer = Result<Outcome, StoreError>;

pub(crate) struct Request {
    pub op: Op,
    pub reply: oneshot::Sender<Answer>,
}

impl Request {
    /// Sends the answer; a caller that stopped waiting is no error.
    pub fn answer(self, answer: Answer) {
        let _ = self.reply.send(answer);
    }
}

/// Counters shared by a store's handles and its writer.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    commits: AtomicU64,
}

impl Counters {
    pub fn committed(&self) {
        self.commits.fetch_add(1, Ordering::Relaxed);
    }
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }
}

/// The writer's end of the queue.
pub(crate) struct Inbox {
    rx: mpsc::Receiver<Request>,
    batch: usize,
}

pub(crate) fn queue(capacity: usize, batch: usize) -> (mpsc::Sender<Request>, Inbox) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (
        tx,
        Inbox {
            rx,
            batch: batch.max(1),
        },
    )
}

impl Inbox {
    /// The next batch, waiting on a plain thread; `None` once every handle
    /// is gone.
    pub fn next_blocking(&mut self) -> Option<Vec<Request>> {
        let first = self.rx.blocking_recv()?;
        Some(self.fill(first))
    }

    /// The next batch, waiting as a task; `None` once every handle is gone.
    pub async fn next(&mut self) -> Option<Vec<Request>> {
        let first = self.rx.recv().await?;
        Some(self.fill(first))
    }

    /// The first request and what else is queued already; a batch ends at a
    /// `Close`, so nothing queued behind it runs.
    fn fill(&mut self, first: Request) -> Vec<Request> {
        let mut batch = vec![first];
        while batch.len() < self.batch
            && !matches!(batch.last(), Some(r) if matches!(r.op, Op::Close))
        {
            match self.rx.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        batch
    }
}

/// The `Close` that ends a batch, taken out of it: the writer runs the rest,
/// then stops and answers it.
pub(crate) fn take_close(batch: &mut Vec<Request>) -> Option<Request> {
    if batch.last().is_some_and(|r| matches!(r.op, Op::Close)) {
        batch.pop()
    } else {
        None
    }
}

/// The shared front of every backend: the queue's sending end and counters.
#[derive(Clone)]
pub(crate) struct Handle {
    tx: mpsc::Sender<Request>,
    capacity: usize,
    pub counters: Arc<Counters>,
}

impl Handle {
    pub fn new(tx: mpsc::Sender<Request>, capacity: usize, counters: Arc<Counters>) -> Self {
        Handle {
            tx,
            capacity,
            counters,
        }
    }

    /// Requests waiting in the queue (not yet taken by the writer).
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Queues `op` if there is room now; the answer comes on the receiver.
    pub fn submit(&self, op: Op) -> Result<oneshot::Receiver<Answer>, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .try_send(Request { op, reply })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => StoreError::QueueFull {
                    capacity: self.capacity,
                },
                mpsc::error::TrySendError::Closed(_) => StoreError::Closed,
            })?;
        Ok(rx)
    }

    /// Queues `op`, waiting for room, and waits for its answer.
    pub async fn call(&self, op: Op) -> Answer {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request { op, reply })
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }
}

/// A request's outcome of the wrong kind: a bug in a backend.
pub(crate) fn mismatch(op: &'static str, got: &Outcome) -> StoreError {
    StoreError::WrongAnswer {
        op,
        got: format!("{got:?}"),
    }
}
