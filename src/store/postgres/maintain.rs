//! The PostgreSQL store's maintenance: a task of the writer's, on a
//! connection of its own, that makes the journal's day partitions ahead
//! (at once, then every [`ENSURE_EVERY`]) and runs retention's purges by
//! dropping whole days. Nothing it does runs on the writer's connection or
//! in its transactions, so SAF and journal writes never wait for it
//! (docs/journal.md, "Retention").
//!
//! Owned by the writer: dropped (and so stopped) with it, and started
//! again by the writer when it finds it gone.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::Client;

use super::parts;
use super::{connect, describe, pg_error, unavailable};
use crate::store::config::PgTarget;
use crate::store::error::StoreError;
use crate::store::writer::{Op, Outcome, Request};

/// How often the partitions ahead are checked for (and made).
const ENSURE_EVERY: Duration = Duration::from_secs(60);

/// Serialises retention among instances ("isoretai"): one drops a day,
/// the others find it gone.
const RETAIN_LOCK: i64 = 0x6973_6f72_6574_6169;

/// Purges waiting for the maintenance at most (retention sends one at a
/// time; more is a caller gone astray, refused at once).
const QUEUE: usize = 16;

pub(super) struct Maintenance {
    target: PgTarget,
    tx: mpsc::Sender<Request>,
    task: JoinHandle<()>,
}

impl Maintenance {
    pub(super) fn start(target: PgTarget) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let task = tokio::spawn(run(target.clone(), rx));
        Maintenance { target, tx, task }
    }

    /// Hands a purge to the maintenance (started again first if it died);
    /// answers at once when it cannot take it.
    pub(super) fn submit(&mut self, request: Request) {
        if self.task.is_finished() {
            tracing::warn!(store = %self.target.redacted, "postgres maintenance stopped; starting it again");
            *self = Maintenance::start(self.target.clone());
        }
        if let Err(e) = self.tx.try_send(request) {
            let request = match e {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r,
            };
            request.answer(Err(StoreError::QueueFull { capacity: QUEUE }));
        }
    }
}

impl Drop for Maintenance {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(target: PgTarget, mut rx: mpsc::Receiver<Request>) {
    let mut client: Option<Client> = None;
    let mut tick = tokio::time::interval(ENSURE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = ensure(&target, &mut client).await {
                    tracing::warn!(store = %target.redacted, error = %e, "journal partitions ahead not made; will try again");
                }
            }
            request = rx.recv() => {
                let Some(request) = request else { return };
                let answer = match request.op {
                    Op::JournalPurge { before, .. } => purge(&target, &mut client, "journal", before).await,
                    // The admin audit keeps its own retention (admin.audit_retain).
                    Op::AdminPurge { before, .. } => purge(&target, &mut client, "admin_log", before).await,
                    _ => Err(StoreError::WrongAnswer { op: "maintenance", got: "not a purge".into() }),
                };
                request.answer(answer.map(Outcome::Changed));
            }
        }
    }
}

/// The maintenance's connection, made when there is none (or it closed).
async fn live<'a>(
    target: &PgTarget,
    slot: &'a mut Option<Client>,
) -> Result<&'a mut Client, StoreError> {
    if slot.as_ref().is_none_or(Client::is_closed) {
        *slot = None;
        let client = connect(target)
            .await
            .map_err(|e| unavailable(target, describe(&e)))?;
        *slot = Some(client);
    }
    slot.as_mut()
        .ok_or_else(|| unavailable(target, "not connected".into()))
}

async fn ensure(target: &PgTarget, slot: &mut Option<Client>) -> Result<usize, StoreError> {
    let client = live(target, slot).await?;
    let made = parts::ensure(client, crate::store::now_millis())
        .await
        .map_err(pg_error(target))?;
    if made > 0 {
        tracing::info!(store = %target.redacted, made, "journal day partitions made ahead");
    }
    Ok(made)
}

/// Retention: the partitions ahead first (a purge is a good moment to
/// check), then every whole day of `table` (the journal, or the admin
/// audit on its own retention) before `before`.
async fn purge(
    target: &PgTarget,
    slot: &mut Option<Client>,
    table: &str,
    before: i64,
) -> Result<u64, StoreError> {
    ensure(target, slot).await?;
    let client = live(target, slot).await?;
    let locked: bool = client
        .query_one("SELECT pg_try_advisory_lock($1)", &[&RETAIN_LOCK])
        .await
        .and_then(|r| r.try_get(0))
        .map_err(pg_error(target))?;
    if !locked {
        // Another instance is dropping these days right now.
        return Ok(0);
    }
    let dropped = parts::drop_before(client, table, before)
        .await
        .map_err(pg_error(target));
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&RETAIN_LOCK])
        .await
        .map_err(pg_error(target))?;
    dropped
}
