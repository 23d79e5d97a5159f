//! The durable store: messages the switch owes someone (store-and-forward,
//! SAF), the journal of exchanges and admin actions, and a small `meta`
//! key-value table.
//!
//! One [`Store`] handle (cheap to clone) fronts one of two backends, SQLite
//! in the data dir or PostgreSQL shared by several instances. Either way a
//! single writer (a thread for SQLite, a task for PostgreSQL) takes requests
//! from a bounded queue and commits them in batches (group commit): a
//! request's answer comes after the transaction holding it has committed and
//! synced. Callers on the message path never touch the disk: they queue and
//! await an answer, and a full queue is [`StoreError::QueueFull`] at once.
//! Both writers run each request through one seam (`backend.rs`), which
//! each backend implements in the same files (`sqlite/`, `postgres/`:
//! `saf.rs`, `journal.rs`, `meta.rs`); the rows read back are in
//! [`rows`].
//!
//! At-least-once, from the store's side: an entry acknowledged by
//! [`Store::saf_put`] is on disk; [`Store::saf_claim`] leases due entries to
//! one owner at a time (an expired lease lets another instance take them);
//! an entry stays pending until someone records it delivered, dead or
//! dropped. See docs/store.md.

mod backend;
pub mod config;
pub mod disk;
pub mod error;
pub mod journal;
pub mod journal_report;
pub mod pg_tls;
pub mod policy;
mod postgres;
pub mod rows;
pub mod saf;
mod schema;
pub mod seal;
mod sqlite;
mod state;
mod writer;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::oneshot;

pub use config::{Location, PgTarget, StoreConfig};
pub use error::StoreError;
pub use policy::{AfterFailure, MtiError, SafPolicy, repeat_mti};
pub use rows::{ClaimedSaf, SafRow};
pub use saf::{
    Direction, NewSafEntry, SafFilter, SafId, SafKeys, SafKind, SafOwed, SafState, SafStats,
    UnixMillis, now_millis,
};
pub use schema::SCHEMA_VERSION;

use saf::check_time;
use writer::{Answer, Counters, Handle, Op, Outcome, mismatch};

/// What [`Store::saf_rekey`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Rekeyed {
    /// The key id every payload is now sealed under.
    pub key: u32,
    /// Payloads sealed again under it.
    pub resealed: u64,
    /// Payloads already under it.
    pub current: u64,
    /// Payloads delivered or dropped while the rekey ran (nothing to do).
    pub gone: u64,
    /// Payloads no key of the key file opens: left as they are.
    pub unopenable: u64,
}

/// A handle on the open store; clones share the one writer.
#[derive(Clone)]
pub struct Store {
    handle: Handle,
    location: Arc<Location>,
    /// What SAF payloads are sealed and opened with.
    keys: Arc<seal::Keyring>,
}

/// The answer to a queued [`Store::saf_submit`]: resolves once the entry is
/// committed and synced.
#[must_use = "the entry is only durable once this resolves to Ok"]
pub struct SafAck {
    rx: oneshot::Receiver<Answer>,
}

impl Future for SafAck {
    type Output = Result<SafId, StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx).poll(cx).map(|answer| match answer {
            Ok(Ok(Outcome::Id(id))) => Ok(id),
            Ok(Ok(other)) => Err(mismatch("saf_put", &other)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Closed),
        })
    }
}

impl Store {
    /// Opens (creating if needed) the store `cfg` names, resolving a SQLite
    /// path against `data_dir`, and applies any migration it lacks.
    pub async fn open(cfg: &StoreConfig, data_dir: &Path) -> Result<Store, StoreError> {
        cfg.validate(data_dir)?;
        let location = cfg.location(data_dir)?;
        let key_path = cfg.key_path(data_dir);
        let dir = data_dir.to_path_buf();
        // Reading or making the key file touches the disk: not on a worker.
        let keys = tokio::task::spawn_blocking(move || {
            seal::Keyring::for_store(key_path.as_deref(), &dir)
        })
        .await
        .map_err(|_| StoreError::Closed)??;
        let (tx, inbox) = writer::queue(cfg.queue, cfg.batch);
        let counters = Arc::new(Counters::default());
        match &location {
            Location::Sqlite(path) => {
                let path = path.clone();
                let counters = Arc::clone(&counters);
                // Creating the file and migrating touch the disk: not on a
                // tokio worker.
                tokio::task::spawn_blocking(move || sqlite::open(&path, inbox, counters))
                    .await
                    .map_err(|_| StoreError::Closed)??;
            }
            Location::Postgres(target) => {
                postgres::open(PgTarget::clone(target), inbox, Arc::clone(&counters)).await?;
            }
        }
        Ok(Store {
            handle: Handle::new(tx, cfg.queue, counters),
            location: Arc::new(location),
            keys: Arc::new(keys),
        })
    }

    /// Where the store is, fit for a log line (no password).
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// Requests waiting for the writer right now (not yet in a batch): the
    /// queue depth a gauge shows, out of `store.queue`.
    pub fn queued(&self) -> usize {
        self.handle.queued()
    }

    /// Transactions committed by this handle's writer since open (group
    /// commit makes it smaller than the requests served).
    pub fn commits(&self) -> u64 {
        self.handle.counters.commits()
    }

    /// Queues an entry without waiting: [`StoreError::QueueFull`] at once if
    /// the writer is behind, else an ack that resolves once the entry is
    /// durable. What the message path calls.
    pub fn saf_submit(&self, mut entry: NewSafEntry) -> Result<SafAck, StoreError> {
        entry.validate()?;
        let row = seal::RowBinding {
            service: &entry.service,
            kind: entry.kind,
            mti: &entry.mti,
            created_at: entry.created_at,
        };
        entry.payload = self.keys.seal(row, &entry.payload)?;
        let rx = self.handle.submit(Op::SafPut(entry))?;
        Ok(SafAck { rx })
    }

    /// Stores an entry; returns once it is committed and synced.
    pub async fn saf_put(&self, entry: NewSafEntry) -> Result<SafId, StoreError> {
        self.saf_submit(entry)?.await
    }

    /// Leases up to `max` due entries (pending, `next_attempt_at <= now`, no
    /// live lease) to `owner` until `now + lease`, oldest first, counting the
    /// attempt each is leased for. An entry is leased to one owner at a time.
    pub async fn saf_claim(
        &self,
        owner: &str,
        now: UnixMillis,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<ClaimedSaf>, StoreError> {
        check_owner(owner)?;
        check_time("now", now)?;
        let lease_until = now.saturating_add(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX));
        check_time("lease", lease_until)?;
        let op = Op::SafClaim {
            owner: owner.to_string(),
            now,
            max,
            lease_until,
        };
        let claimed = match self.handle.call(op).await? {
            Outcome::Claimed(claimed) => claimed,
            other => return Err(mismatch("saf_claim", &other)),
        };
        let mut opened = Vec::with_capacity(claimed.len());
        for mut c in claimed {
            let row = seal::RowBinding {
                service: &c.service,
                kind: c.kind,
                mti: &c.mti,
                created_at: c.created_at,
            };
            match self.keys.open(row, &c.payload) {
                Ok(plain) => {
                    c.payload = plain;
                    opened.push(c);
                }
                Err(e) => {
                    // Never delivered as it is, never left to block the
                    // queue: a dead letter an operator sees, with why.
                    let reason = format!("cannot be opened: {e}");
                    tracing::error!(id = %c.id, service = %c.service, %reason, "store-and-forward: entry parked as a dead letter");
                    self.saf_dead(c.id, now, &reason).await?;
                }
            }
        }
        Ok(opened)
    }

    /// The key file the store seals with.
    pub fn key_file(&self) -> &Path {
        self.keys.path()
    }

    /// Seals again, under the key file's first key, every payload kept
    /// under another key or in clear (written before sealing): what
    /// `isoswitch store rekey` runs after a new key is put first. A payload
    /// no key opens is left as it is and counted. Safe beside a running
    /// switch: a payload delivered meanwhile is not written back.
    pub async fn saf_rekey(&self) -> Result<Rekeyed, StoreError> {
        let mut out = Rekeyed {
            key: self.keys.sealing_key(),
            ..Rekeyed::default()
        };
        let mut after = SafId(0);
        loop {
            let page = match self
                .handle
                .call(Op::SafPayloads { after, limit: 500 })
                .await?
            {
                Outcome::Payloads(p) => p,
                other => return Err(mismatch("saf_payloads", &other)),
            };
            let Some(last) = page.last() else {
                return Ok(out);
            };
            after = last.id;
            for p in page {
                self.reseal(p, &mut out).await?;
            }
        }
    }

    /// Rewrites the message entry `id` holds, while it still holds one
    /// (not delivered): `amend` gets it in clear and gives the new one, or
    /// `None` to leave it. Sealed again under the first key. Returns whether
    /// it changed. A timeout reversal stored before any answer is completed
    /// this way with what the host's late approval says (its F38, the
    /// amount it approved).
    pub async fn saf_amend(
        &self,
        id: SafId,
        amend: impl FnOnce(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<bool, StoreError> {
        let after = SafId(id.0.saturating_sub(1));
        let page = match self
            .handle
            .call(Op::SafPayloads { after, limit: 1 })
            .await?
        {
            Outcome::Payloads(p) => p,
            other => return Err(mismatch("saf_payloads", &other)),
        };
        let Some(p) = page.into_iter().next().filter(|p| p.id == id) else {
            return Ok(false);
        };
        let row = seal::RowBinding {
            service: &p.service,
            kind: p.kind,
            mti: &p.mti,
            created_at: p.created_at,
        };
        let plain = self.keys.open(row, &p.payload)?;
        let Some(changed) = amend(&plain) else {
            return Ok(false);
        };
        let new = self.keys.seal(row, &changed)?;
        let op = Op::SafReseal {
            id,
            old: p.payload,
            new,
        };
        match self.handle.call(op).await? {
            Outcome::Changed(n) => Ok(n == 1),
            other => Err(mismatch("saf_reseal", &other)),
        }
    }

    async fn reseal(&self, p: rows::StoredPayload, out: &mut Rekeyed) -> Result<(), StoreError> {
        if seal::sealing(&p.payload) == seal::Sealing::Key(out.key) {
            out.current += 1;
            return Ok(());
        }
        let row = seal::RowBinding {
            service: &p.service,
            kind: p.kind,
            mti: &p.mti,
            created_at: p.created_at,
        };
        let plain = match self.keys.open(row, &p.payload) {
            Ok(plain) => plain,
            Err(e) => {
                tracing::error!(id = %p.id, error = %e, "store rekey: payload left as it is");
                out.unopenable += 1;
                return Ok(());
            }
        };
        let new = self.keys.seal(row, &plain)?;
        let op = Op::SafReseal {
            id: p.id,
            old: p.payload,
            new,
        };
        match self.handle.call(op).await? {
            Outcome::Changed(1) => out.resealed += 1,
            Outcome::Changed(_) => out.gone += 1,
            other => return Err(mismatch("saf_reseal", &other)),
        }
        Ok(())
    }

    /// Records a failed attempt by the lease owner and when to try next;
    /// releases the lease. [`StoreError::LeaseLost`] if the entry moved on.
    pub async fn saf_attempted(
        &self,
        id: SafId,
        owner: &str,
        next_attempt_at: UnixMillis,
        error: &str,
    ) -> Result<(), StoreError> {
        check_time("next_attempt_at", next_attempt_at)?;
        self.done(
            "saf_attempted",
            Op::SafAttempted {
                id,
                owner: owner.to_string(),
                next_attempt_at,
                error: error.to_string(),
            },
        )
        .await
    }

    /// Records the delivery (the host answered, `answer` summarises it): the
    /// row stays as a compact record without its payload. Whoever holds the
    /// lease, a delivery is a fact; reporting it twice is not an error.
    pub async fn saf_delivered(
        &self,
        id: SafId,
        owner: &str,
        now: UnixMillis,
        answer: &str,
    ) -> Result<(), StoreError> {
        self.saf_completed(id, owner, now, answer, None).await
    }

    /// [`Store::saf_delivered`], flagged for reconciliation with `flag`
    /// (kept in `reason`) when the host took it with a code a
    /// reconciliation team must look at; `None` is a plain delivery.
    pub async fn saf_completed(
        &self,
        id: SafId,
        owner: &str,
        now: UnixMillis,
        answer: &str,
        flag: Option<&str>,
    ) -> Result<(), StoreError> {
        check_time("now", now)?;
        self.done(
            "saf_delivered",
            Op::SafDelivered {
                id,
                owner: owner.to_string(),
                now,
                answer: answer.to_string(),
                reason: flag.map(str::to_string),
            },
        )
        .await
    }

    /// The pending entry to the peer of `service` that the peer's answer
    /// with these F11, F7 and F37 completes (the oldest, if several), on
    /// whichever instance sent it: an answer that reached another instance
    /// than the sender (docs/ha.md, "Answers on the wrong instance").
    pub async fn saf_owed_to_peer(
        &self,
        service: &str,
        f11: &str,
        f7: &str,
        f37: &str,
    ) -> Result<Option<SafId>, StoreError> {
        let op = Op::SafOwedToPeer {
            service: service.to_string(),
            f11: f11.to_string(),
            f7: f7.to_string(),
            f37: f37.to_string(),
        };
        match self.handle.call(op).await? {
            Outcome::Id(id) => Ok(Some(id)),
            Outcome::Done => Ok(None),
            other => Err(mismatch("saf_owed_to_peer", &other)),
        }
    }

    /// Parks a pending entry as a dead letter (payload kept, for a retry).
    pub async fn saf_dead(
        &self,
        id: SafId,
        now: UnixMillis,
        reason: &str,
    ) -> Result<(), StoreError> {
        check_time("now", now)?;
        let reason = reason.to_string();
        self.done("saf_dead", Op::SafDead { id, now, reason }).await
    }

    /// Operator: makes a pending or dead entry due now; a dead letter comes
    /// back pending with its max age counted again from now.
    pub async fn saf_retry_now(&self, id: SafId, now: UnixMillis) -> Result<(), StoreError> {
        check_time("now", now)?;
        self.done("saf_retry_now", Op::SafRetryNow { id, now })
            .await
    }

    /// Operator: gives up a pending or dead entry, recording why; the row
    /// stays without its payload.
    pub async fn saf_drop(
        &self,
        id: SafId,
        now: UnixMillis,
        reason: &str,
    ) -> Result<(), StoreError> {
        check_time("now", now)?;
        let reason = reason.to_string();
        self.done("saf_drop", Op::SafDrop { id, now, reason }).await
    }

    /// Cancels pending entry `id` unless an attempt of it is out now: the
    /// host declined its original after all (a late decline), so the
    /// timeout reversal owed for it must not go. True if cancelled; false
    /// if an attempt holds it (its answer completes it: a reversal of a
    /// declined original is answered "not found") or it is done already.
    pub async fn saf_cancel(
        &self,
        id: SafId,
        now: UnixMillis,
        reason: &str,
    ) -> Result<bool, StoreError> {
        check_time("now", now)?;
        let reason = reason.to_string();
        match self.handle.call(Op::SafCancel { id, now, reason }).await? {
            Outcome::Changed(n) => Ok(n == 1),
            other => Err(mismatch("saf_cancel", &other)),
        }
    }

    /// Sends every later attempt of entry `id` (for any node) to `node`,
    /// the one its first attempt chose, while `owner` holds its lease.
    /// False if the entry is no longer this owner's or already has a node.
    pub async fn saf_pin(&self, id: SafId, owner: &str, node: &str) -> Result<bool, StoreError> {
        check_owner(owner)?;
        let op = Op::SafPin {
            id,
            owner: owner.to_string(),
            node: node.to_string(),
        };
        match self.handle.call(op).await? {
            Outcome::Changed(n) => Ok(n == 1),
            other => Err(mismatch("saf_pin", &other)),
        }
    }

    /// Clears the leases `owner` holds, so that its entries are due again
    /// at once rather than when the leases run out. Only for an instance
    /// starting: a process of the same name that died (kill -9) left them,
    /// and no attempt of it can still be waiting. Returns how many.
    pub async fn saf_release_leases(&self, owner: &str) -> Result<u64, StoreError> {
        check_owner(owner)?;
        let op = Op::SafReleaseLeases {
            owner: owner.to_string(),
        };
        match self.handle.call(op).await? {
            Outcome::Changed(n) => Ok(n),
            other => Err(mismatch("saf_release_leases", &other)),
        }
    }

    /// Deletes at most `limit` entries delivered or dropped before `before`,
    /// oldest first; returns how many. Pending entries and dead letters are
    /// never pruned (a dead letter goes once an operator drops it). Small
    /// batches: each is one short transaction, so the writer's other
    /// requests wait at most one batch.
    pub async fn saf_prune(&self, before: UnixMillis, limit: usize) -> Result<u64, StoreError> {
        check_time("before", before)?;
        match self.handle.call(Op::SafPrune { before, limit }).await? {
            Outcome::Changed(n) => Ok(n),
            other => Err(mismatch("saf_prune", &other)),
        }
    }

    /// Entries matching `filter`, newest first, without payloads.
    pub async fn saf_list(&self, filter: SafFilter) -> Result<Vec<SafRow>, StoreError> {
        match self.handle.call(Op::SafList(filter)).await? {
            Outcome::Rows(rows) => Ok(rows),
            other => Err(mismatch("saf_list", &other)),
        }
    }

    /// The queue's depth, oldest pending age, deliveries, repeats and dead
    /// letters, as of `now`.
    pub async fn saf_stats(&self, now: UnixMillis) -> Result<SafStats, StoreError> {
        check_time("now", now)?;
        match self.handle.call(Op::SafStats { now }).await? {
            Outcome::Stats(stats) => Ok(stats),
            other => Err(mismatch("saf_stats", &other)),
        }
    }

    /// What is owed, per service and kind: pending entries (in flight, the
    /// oldest's age) and dead letters, as of `now`. Unlike
    /// [`Store::saf_stats`] it reads only pending and dead rows (an index
    /// range), so it stays cheap however much history is kept: what the
    /// metrics sample every second.
    pub async fn saf_owed_by(&self, now: UnixMillis) -> Result<Vec<SafOwed>, StoreError> {
        check_time("now", now)?;
        match self.handle.call(Op::SafOwed { now }).await? {
            Outcome::Owed(owed) => Ok(owed),
            other => Err(mismatch("saf_owed_by", &other)),
        }
    }

    /// A value of the `meta` table.
    pub async fn meta_get(&self, key: &str) -> Result<Option<String>, StoreError> {
        match self.handle.call(Op::MetaGet(key.to_string())).await? {
            Outcome::Meta(value) => Ok(value),
            other => Err(mismatch("meta_get", &other)),
        }
    }

    /// Sets a `meta` value (small runtime records; `schema_version` is the
    /// store's own).
    pub async fn meta_put(&self, key: &str, value: &str) -> Result<(), StoreError> {
        let op = Op::MetaPut(key.to_string(), value.to_string());
        self.done("meta_put", op).await
    }

    /// Inserts journal and admin rows in one transaction; returns once
    /// committed. Waits for room in the queue: only the journal writer task
    /// calls it, never the message path.
    pub async fn journal_put(
        &self,
        rows: Vec<journal::NewRow>,
        admin: Vec<journal::AdminRow>,
    ) -> Result<u64, StoreError> {
        match self.handle.call(Op::JournalPut { rows, admin }).await? {
            Outcome::Changed(n) => Ok(n),
            other => Err(mismatch("journal_put", &other)),
        }
    }

    /// The journal rows `filter` selects, each with its reversal's state.
    pub async fn journal_query(
        &self,
        filter: journal::JournalFilter,
    ) -> Result<Vec<journal::JournalRow>, StoreError> {
        match self.handle.call(Op::JournalQuery(filter)).await? {
            Outcome::JournalRows(rows) => Ok(rows),
            other => Err(mismatch("journal_query", &other)),
        }
    }

    /// Admin actions since `since`, newest first.
    pub async fn admin_query(
        &self,
        since: Option<UnixMillis>,
        limit: usize,
    ) -> Result<Vec<journal::AdminRow>, StoreError> {
        match self.handle.call(Op::AdminQuery { since, limit }).await? {
            Outcome::AdminRows(rows) => Ok(rows),
            other => Err(mismatch("admin_query", &other)),
        }
    }

    /// Deletes at most `limit` journal rows and completed SAF records each,
    /// older than `before`, in one short transaction. Returns how many went.
    /// The admin audit keeps its own retention ([`Store::admin_purge`]).
    pub async fn journal_purge(&self, before: UnixMillis, limit: usize) -> Result<u64, StoreError> {
        check_time("before", before)?;
        match self.handle.call(Op::JournalPurge { before, limit }).await? {
            Outcome::Changed(n) => Ok(n),
            other => Err(mismatch("journal_purge", &other)),
        }
    }

    /// What the journal takes of the store (the disk guard's reading, on
    /// the store's own writer: never the message path's).
    pub async fn journal_space(&self) -> Result<disk::JournalSpace, StoreError> {
        match self.handle.call(Op::JournalSpace).await? {
            Outcome::Space(s) => Ok(s),
            other => Err(mismatch("journal_space", &other)),
        }
    }

    /// Deletes at most `limit` admin audit rows older than `before`, in one
    /// short transaction. Returns how many went.
    pub async fn admin_purge(&self, before: UnixMillis, limit: usize) -> Result<u64, StoreError> {
        check_time("before", before)?;
        match self.handle.call(Op::AdminPurge { before, limit }).await? {
            Outcome::Changed(n) => Ok(n),
            other => Err(mismatch("admin_purge", &other)),
        }
    }

    /// The reconciliation report of the rows in `[since, until)`.
    pub async fn journal_report(
        &self,
        since: UnixMillis,
        until: UnixMillis,
    ) -> Result<journal_report::Report, StoreError> {
        match self.handle.call(Op::JournalReport { since, until }).await? {
            Outcome::Report(report) => Ok(*report),
            other => Err(mismatch("journal_report", &other)),
        }
    }

    /// Finishes what is queued, closes the database and stops the writer;
    /// other handles then get [`StoreError::Closed`].
    pub async fn close(self) -> Result<(), StoreError> {
        self.done("close", Op::Close).await
    }

    async fn done(&self, name: &'static str, op: Op) -> Result<(), StoreError> {
        match self.handle.call(op).await? {
            Outcome::Done => Ok(()),
            other => Err(mismatch(name, &other)),
        }
    }
}

fn check_owner(owner: &str) -> Result<(), StoreError> {
    if owner.is_empty() {
        return Err(StoreError::InvalidEntry {
            field: "owner",
            reason: "empty".to_string(),
        });
    }
    Ok(())
}
