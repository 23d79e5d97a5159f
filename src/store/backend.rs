//! The seam between the store's writer and its two backends: what a backend
//! does inside one batch's transaction, for each operation of the store
//! ([`SafOps`], [`JournalOps`], [`MetaOps`]), and the one place an [`Op`]
//! becomes a call of it ([`apply`]).
//!
//! A backend is the view of one open transaction (`sqlite::Sqlite`,
//! `postgres::Postgres`); each writer makes one per batch and runs every
//! request of the batch through [`apply`], so no code matches on which
//! backend it is per operation, and each backend's files hold its SQL by
//! concept (`saf.rs`, `journal.rs`, `meta.rs`).
//!
//! The operations are `async`: PostgreSQL pipelines a batch's statements
//! and awaits their answers. SQLite's never wait (the driver is blocking,
//! on the writer's own thread), so its writer polls each once and has the
//! answer (`sqlite::now`). Dispatch is static: no boxing, no allocation of
//! its own per request.
//!
//! Two layers of failure: the outer `Self::Error` is the driver's, and
//! aborts the batch's transaction (the writer decides whether it lies with
//! one request); the inner [`StoreError`] is the request's own answer (an
//! entry no longer in the state asked for, a stored value it cannot read).

use super::disk::JournalSpace;
use super::error::StoreError;
use super::journal::{JournalFilter, NewRow};
use super::journal_report::Report;
use super::rows::{AdminRow, JournalRow};
use super::rows::{ClaimedSaf, SafRow, StoredPayload};
use super::saf::{NewSafEntry, SafFilter, SafId, SafOwed, SafStats, UnixMillis};
use super::writer::{Answer, Op, Outcome};

/// An operation's two layers of failure: the driver's (outer), the
/// request's own (inner).
pub(crate) type OpResult<T, E> = Result<Result<T, StoreError>, E>;

/// What every operation of a backend fails with when the driver does.
pub(crate) trait Driver {
    type Error;
}

/// The store-and-forward queue (docs/store.md): each method is the
/// [`Op`] of the same name, see there and on [`super::Store`].
pub(crate) trait SafOps: Driver {
    async fn saf_put(&self, entry: &NewSafEntry) -> Result<SafId, Self::Error>;
    async fn saf_claim(
        &self,
        owner: &str,
        now: UnixMillis,
        max: usize,
        lease_until: UnixMillis,
    ) -> OpResult<Vec<ClaimedSaf>, Self::Error>;
    async fn saf_attempted(
        &self,
        id: SafId,
        owner: &str,
        next_attempt_at: UnixMillis,
        error: &str,
    ) -> OpResult<(), Self::Error>;
    async fn saf_delivered(
        &self,
        id: SafId,
        owner: &str,
        now: UnixMillis,
        answer: &str,
        reason: Option<&str>,
    ) -> OpResult<(), Self::Error>;
    async fn saf_dead(&self, id: SafId, now: UnixMillis, reason: &str)
    -> OpResult<(), Self::Error>;
    async fn saf_retry_now(&self, id: SafId, now: UnixMillis) -> OpResult<(), Self::Error>;
    async fn saf_drop(&self, id: SafId, now: UnixMillis, reason: &str)
    -> OpResult<(), Self::Error>;
    /// Rows changed: 0 when an attempt holds the entry or it is done.
    async fn saf_cancel(
        &self,
        id: SafId,
        now: UnixMillis,
        reason: &str,
    ) -> Result<u64, Self::Error>;
    async fn saf_pin(&self, id: SafId, owner: &str, node: &str) -> Result<u64, Self::Error>;
    async fn saf_release_leases(&self, owner: &str) -> Result<u64, Self::Error>;
    async fn saf_prune(&self, before: UnixMillis, limit: usize) -> Result<u64, Self::Error>;
    async fn saf_payloads(
        &self,
        after: SafId,
        limit: usize,
    ) -> OpResult<Vec<StoredPayload>, Self::Error>;
    async fn saf_reseal(&self, id: SafId, old: &[u8], new: &[u8]) -> Result<u64, Self::Error>;
    async fn saf_list(&self, filter: &SafFilter) -> OpResult<Vec<SafRow>, Self::Error>;
    async fn saf_stats(&self, now: UnixMillis) -> OpResult<SafStats, Self::Error>;
    async fn saf_owed(&self, now: UnixMillis) -> OpResult<Vec<SafOwed>, Self::Error>;
    async fn saf_owed_to_peer(
        &self,
        service: &str,
        f11: &str,
        f7: &str,
        f37: &str,
    ) -> Result<Option<SafId>, Self::Error>;
}

/// The journal of exchanges and the admin audit (docs/journal.md).
pub(crate) trait JournalOps: Driver {
    /// Rows inserted, journal and admin together.
    async fn journal_put(&self, rows: &[NewRow], admin: &[AdminRow]) -> Result<u64, Self::Error>;
    async fn journal_query(&self, filter: &JournalFilter) -> Result<Vec<JournalRow>, Self::Error>;
    async fn admin_query(
        &self,
        since: Option<UnixMillis>,
        limit: usize,
    ) -> Result<Vec<AdminRow>, Self::Error>;
    /// Retention: rows deleted. A backend whose retention runs outside the
    /// writer's transactions refuses it here.
    async fn journal_purge(&self, before: UnixMillis, limit: usize) -> OpResult<u64, Self::Error>;
    async fn admin_purge(&self, before: UnixMillis, limit: usize) -> OpResult<u64, Self::Error>;
    async fn journal_report(
        &self,
        since: UnixMillis,
        until: UnixMillis,
    ) -> Result<Report, Self::Error>;
    async fn journal_space(&self) -> Result<JournalSpace, Self::Error>;
}

/// The `meta` key-value table.
pub(crate) trait MetaOps: Driver {
    async fn meta_get(&self, key: &str) -> Result<Option<String>, Self::Error>;
    async fn meta_put(&self, key: &str, value: &str) -> Result<(), Self::Error>;
}

/// A backend: every operation of the store, over one driver.
pub(crate) trait Backend: SafOps + JournalOps + MetaOps {}

impl<B: SafOps + JournalOps + MetaOps> Backend for B {}

/// Runs one op inside the batch's transaction `b`. The outer error aborts
/// the transaction; the inner one is the op's own answer.
pub(crate) async fn apply<B: Backend>(b: &B, op: &Op) -> Result<Answer, B::Error> {
    Ok(match op {
        Op::SafPut(entry) => Ok(Outcome::Id(b.saf_put(entry).await?)),
        Op::SafClaim {
            owner,
            now,
            max,
            lease_until,
        } => b
            .saf_claim(owner, *now, *max, *lease_until)
            .await?
            .map(Outcome::Claimed),
        Op::SafAttempted {
            id,
            owner,
            next_attempt_at,
            error,
        } => done(b.saf_attempted(*id, owner, *next_attempt_at, error).await?),
        Op::SafDelivered {
            id,
            owner,
            now,
            answer,
            reason,
        } => done(
            b.saf_delivered(*id, owner, *now, answer, reason.as_deref())
                .await?,
        ),
        Op::SafDead { id, now, reason } => done(b.saf_dead(*id, *now, reason).await?),
        Op::SafRetryNow { id, now } => done(b.saf_retry_now(*id, *now).await?),
        Op::SafDrop { id, now, reason } => done(b.saf_drop(*id, *now, reason).await?),
        Op::SafCancel { id, now, reason } => {
            Ok(Outcome::Changed(b.saf_cancel(*id, *now, reason).await?))
        }
        Op::SafPin { id, owner, node } => Ok(Outcome::Changed(b.saf_pin(*id, owner, node).await?)),
        Op::SafReleaseLeases { owner } => Ok(Outcome::Changed(b.saf_release_leases(owner).await?)),
        Op::SafPrune { before, limit } => Ok(Outcome::Changed(b.saf_prune(*before, *limit).await?)),
        Op::SafPayloads { after, limit } => {
            b.saf_payloads(*after, *limit).await?.map(Outcome::Payloads)
        }
        Op::SafReseal { id, old, new } => Ok(Outcome::Changed(b.saf_reseal(*id, old, new).await?)),
        Op::SafList(filter) => b.saf_list(filter).await?.map(Outcome::Rows),
        Op::SafStats { now } => b.saf_stats(*now).await?.map(Outcome::Stats),
        Op::SafOwed { now } => b.saf_owed(*now).await?.map(Outcome::Owed),
        Op::SafOwedToPeer {
            service,
            f11,
            f7,
            f37,
        } => Ok(b
            .saf_owed_to_peer(service, f11, f7, f37)
            .await?
            .map_or(Outcome::Done, Outcome::Id)),
        Op::MetaGet(key) => Ok(Outcome::Meta(b.meta_get(key).await?)),
        Op::MetaPut(key, value) => {
            b.meta_put(key, value).await?;
            Ok(Outcome::Done)
        }
        Op::JournalPut { rows, admin } => Ok(Outcome::Changed(b.journal_put(rows, admin).await?)),
        Op::JournalQuery(filter) => Ok(Outcome::JournalRows(b.journal_query(filter).await?)),
        Op::AdminQuery { since, limit } => {
            Ok(Outcome::AdminRows(b.admin_query(*since, *limit).await?))
        }
        Op::JournalPurge { before, limit } => b
            .journal_purge(*before, *limit)
            .await?
            .map(Outcome::Changed),
        Op::AdminPurge { before, limit } => {
            b.admin_purge(*before, *limit).await?.map(Outcome::Changed)
        }
        Op::JournalReport { since, until } => Ok(Outcome::Report(Box::new(
            b.journal_report(*since, *until).await?,
        ))),
        Op::JournalSpace => Ok(Outcome::Space(b.journal_space().await?)),
        Op::Close => Ok(Outcome::Done),
    })
}

fn done(changed: Result<(), StoreError>) -> Answer {
    changed.map(|()| Outcome::Done)
}
