//! The PostgreSQL backend: one connection per instance, owned by a writer
//! task that commits batches; several instances share the tables, and claims
//! use `FOR UPDATE SKIP LOCKED` so each entry has one owner at a time.
//!
//! Outage: when the connection is lost the writer answers every request at
//! once with [`StoreError::Unavailable`] and reconnects in the background
//! with backoff. A request whose commit was cut off may or may not have been
//! applied: callers keep what they owe in memory and put it again (SAF is
//! at-least-once; a second copy of an entry is a repeat the host absorbs).
//! TLS (verify-full) when the target has a connector (`super::pg_tls`).
//!
//! Each batch runs in one transaction, through [`Postgres`], the backend
//! seam (`store/backend.rs`) over that transaction: its operations are in
//! `saf.rs`, `journal.rs` and `meta.rs`, each with the statements it
//! prepares; the schema in `migrations.rs`; the journal's day partitions
//! and their upkeep in `parts.rs` and `maintain.rs`.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::oneshot;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, NoTls, Socket, Transaction};

use super::backend::{self, Driver};
use super::config::PgTarget;
use super::error::StoreError;
use super::writer::{self, Answer, Counters, Inbox, Op, Outcome, Request};

mod journal;
mod maintain;
mod meta;
mod migrations;
mod parts;
mod saf;

use maintain::Maintenance;
use migrations::{Migration, migrate};

/// The PostgreSQL backend inside one batch's transaction: what every op of
/// the batch runs on, its statements pipelined.
pub(crate) struct Postgres<'a> {
    tx: &'a Transaction<'a>,
    st: &'a Statements,
}

impl Driver for Postgres<'_> {
    type Error = tokio_postgres::Error;
}

/// Every statement, prepared once per connection, by concept.
struct Statements {
    saf: saf::Statements,
    journal: journal::Statements,
    meta: meta::Statements,
}

impl Statements {
    async fn prepare(c: &Client) -> Result<Self, tokio_postgres::Error> {
        Ok(Statements {
            saf: saf::Statements::prepare(c).await?,
            journal: journal::Statements::prepare(c).await?,
            meta: meta::Statements::prepare(c).await?,
        })
    }
}

const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Whether an error means the server or connection is gone: closed, a
/// connection exception (08) or operator intervention (57: shutdown,
/// terminated backend); or that this server no longer takes writes (25006:
/// a standby, or a primary demoted under us), so that the store reconnects
/// and finds the primary among the URL's hosts.
fn is_outage(e: &tokio_postgres::Error) -> bool {
    e.is_closed()
        || e.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION)
        || matches!(e.code().map(|c| &c.code()[..2]), Some("08" | "57"))
}

fn pg_error(target: &PgTarget) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
    move |e| {
        if is_outage(&e) {
            unavailable(target, describe(&e))
        } else {
            StoreError::Postgres {
                url: target.redacted.clone(),
                detail: describe(&e),
            }
        }
    }
}

/// The server's message and code when it sent one (never its DETAIL, which
/// may quote a row), else the driver's text.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        // The driver's text and its causes: "error performing TLS
        // handshake" alone would not say the certificate was refused.
        None => {
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                text.push_str(": ");
                text.push_str(&c.to_string());
                cause = c.source();
            }
            text
        }
    }
}

fn unavailable(target: &PgTarget, reason: String) -> StoreError {
    StoreError::Unavailable {
        url: target.redacted.clone(),
        reason,
    }
}

/// Connects, migrates and starts the writer. Fails if the server cannot be
/// reached now: a switch starts with its store or not at all.
pub(crate) async fn open(
    target: PgTarget,
    inbox: Inbox,
    counters: Arc<Counters>,
) -> Result<(), StoreError> {
    // The server refusing us (password, database) is an error of its own;
    // anything else means it cannot be reached now.
    let mut client = connect(&target).await.map_err(|e| match e.as_db_error() {
        Some(_) => pg_error(&target)(e),
        None => unavailable(&target, describe(&e)),
    })?;
    migrate(&mut client).await.map_err(|e| match e {
        Migration::Sql(e) => pg_error(&target)(e),
        Migration::Store(e) => e,
        Migration::TooOld(version) => StoreError::Postgres {
            url: target.redacted.clone(),
            detail: format!(
                "server version {version} is older than 14: the journal's day partitions need \
                 DETACH PARTITION CONCURRENTLY (PostgreSQL 14 or newer); upgrade the server, or \
                 use the SQLite store (store.url unset)"
            ),
        },
    })?;
    // Today's partitions and the next days' exist before the first row.
    parts::ensure(&mut client, super::now_millis())
        .await
        .map_err(pg_error(&target))?;
    let statements = Statements::prepare(&client)
        .await
        .map_err(pg_error(&target))?;
    let writer = Writer {
        maintenance: Maintenance::start(target.clone()),
        target,
        live: Some(Live { client, statements }),
        reconnecting: None,
        counters,
    };
    tokio::spawn(writer.run(inbox));
    Ok(())
}

async fn connect(target: &PgTarget) -> Result<Client, tokio_postgres::Error> {
    match &target.tls {
        Some(tls) => connect_with(target, tls.clone()).await,
        None => connect_with(target, NoTls).await,
    }
}

async fn connect_with<T>(target: &PgTarget, tls: T) -> Result<Client, tokio_postgres::Error>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, connection) = target.config.connect(tls).await?;
    let url = target.redacted.clone();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(store = %url, error = %describe(&e), "postgres connection lost");
        }
    });
    Ok(client)
}

struct Live {
    client: Client,
    statements: Statements,
}

struct Writer {
    target: PgTarget,
    live: Option<Live>,
    /// A background reconnect under way, answering with the new connection.
    reconnecting: Option<oneshot::Receiver<Live>>,
    counters: Arc<Counters>,
    /// Partitions ahead and retention, on a connection of their own.
    maintenance: Maintenance,
}

impl Writer {
    async fn run(mut self, mut inbox: Inbox) {
        loop {
            let mut batch = tokio::select! {
                batch = inbox.next() => match batch {
                    Some(batch) => batch,
                    None => return,
                },
                live = reconnected(&mut self.reconnecting) => {
                    tracing::info!(store = %self.target.redacted, "postgres connection restored");
                    self.live = Some(live);
                    continue;
                }
            };
            let closer = writer::take_close(&mut batch);
            // Retention drops whole days on the maintenance's connection,
            // never in this writer's transactions.
            let (purges, batch): (Vec<_>, Vec<_>) = batch
                .into_iter()
                .partition(|r| matches!(r.op, Op::JournalPurge { .. } | Op::AdminPurge { .. }));
            for purge in purges {
                self.maintenance.submit(purge);
            }
            self.run_batch(batch).await;
            if let Some(closer) = closer {
                drop(self);
                closer.answer(Ok(Outcome::Done));
                return;
            }
        }
    }

    /// One transaction for the whole batch; answers go out after the commit.
    /// A statement failing on its request's own data is retried alone so it
    /// fails only that request.
    async fn run_batch(&mut self, batch: Vec<Request>) {
        if batch.is_empty() {
            return;
        }
        match self.transact(&batch).await {
            Ok(answers) => answer_all(batch, answers),
            Err(Failed::Request(_)) if batch.len() > 1 => {
                for request in batch {
                    self.run_alone(request).await;
                }
            }
            Err(failed) => {
                let e = self.failure(failed);
                for request in batch {
                    request.answer(Err(e.clone()));
                }
            }
        }
    }

    async fn run_alone(&mut self, request: Request) {
        let batch = vec![request];
        match self.transact(&batch).await {
            Ok(answers) => answer_all(batch, answers),
            Err(failed) => {
                let e = self.failure(failed);
                for request in batch {
                    request.answer(Err(e.clone()));
                }
            }
        }
    }

    async fn transact(&mut self, batch: &[Request]) -> Result<Vec<Answer>, Failed> {
        let Some(live) = self.live.as_mut().filter(|l| !l.client.is_closed()) else {
            return Err(Failed::Down);
        };
        let tx = live.client.transaction().await.map_err(Failed::Batch)?;
        // The journal's own batches commit without waiting for the server's
        // WAL flush (as SQLite's commit them without a sync).
        if !batch.iter().any(|r| r.op.needs_sync()) {
            tx.batch_execute("SET LOCAL synchronous_commit = off")
                .await
                .map_err(Failed::Batch)?;
        }
        // Pipelined: each op's statements go out without waiting for the
        // previous op's answer, so a batch costs about one round trip plus
        // the commit, not one per op. The ops of a batch come from callers
        // that did not wait on each other, so any order among them is one
        // they could have had anyway.
        let pg = Postgres {
            tx: &tx,
            st: &live.statements,
        };
        let results = join_all(batch.iter().map(|request| backend::apply(&pg, &request.op))).await;
        let mut answers = Vec::with_capacity(batch.len());
        let mut errors = Vec::new();
        for result in results {
            match result {
                Ok(answer) => answers.push(answer),
                Err(e) => errors.push(e),
            }
        }
        if let Some(e) = first_cause(errors) {
            return Err(Failed::classify(e));
        }
        tx.commit().await.map_err(Failed::Batch)?;
        self.counters.committed();
        Ok(answers)
    }

    /// The error for a failed transaction; a lost connection starts a
    /// reconnect.
    fn failure(&mut self, failed: Failed) -> StoreError {
        let e = match failed {
            Failed::Down => None,
            Failed::Request(e) | Failed::Batch(e) => Some(e),
        };
        let lost = e.as_ref().is_none_or(is_outage);
        if lost {
            self.live = None;
            if self.reconnecting.is_none() {
                tracing::warn!(store = %self.target.redacted, "postgres unavailable; reconnecting");
                self.reconnecting = Some(reconnect(self.target.clone()));
            }
        }
        match e {
            Some(e) => pg_error(&self.target)(e),
            None => unavailable(&self.target, "not connected (reconnecting)".to_string()),
        }
    }
}

/// Of the errors of a pipelined batch, the one that aborted it: the others
/// only say the transaction was already aborted (25P02).
fn first_cause(errors: Vec<tokio_postgres::Error>) -> Option<tokio_postgres::Error> {
    let aborted =
        |e: &tokio_postgres::Error| e.code() == Some(&SqlState::IN_FAILED_SQL_TRANSACTION);
    let mut errors = errors.into_iter();
    let first = errors.next()?;
    if !aborted(&first) {
        return Some(first);
    }
    Some(errors.find(|e| !aborted(e)).unwrap_or(first))
}

fn answer_all(batch: Vec<Request>, answers: Vec<Answer>) {
    for (request, answer) in batch.into_iter().zip(answers) {
        request.answer(answer);
    }
}

/// Waits for the background reconnect, if one is under way.
async fn reconnected(slot: &mut Option<oneshot::Receiver<Live>>) -> Live {
    if let Some(rx) = slot.as_mut()
        && let Ok(live) = rx.await
    {
        *slot = None;
        return live;
    }
    *slot = None;
    std::future::pending().await
}

/// Reconnects in the background, backing off from 100 ms to 5 s; gives up
/// when the writer is gone.
fn reconnect(target: PgTarget) -> oneshot::Receiver<Live> {
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut wait = RECONNECT_MIN;
        while !tx.is_closed() {
            tokio::time::sleep(wait).await;
            match connect(&target).await {
                Ok(client) => match Statements::prepare(&client).await {
                    Ok(statements) => {
                        let _ = tx.send(Live { client, statements });
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(store = %target.redacted, error = %describe(&e), "postgres reconnect")
                    }
                },
                // With several hosts, why the last one failed: refused, a
                // standby (read-write wanted), a certificate.
                Err(e) => {
                    tracing::warn!(store = %target.redacted, error = %describe(&e), "postgres reconnect")
                }
            }
            wait = (wait * 2).min(RECONNECT_MAX);
        }
    });
    rx
}

enum Failed {
    /// No connection.
    Down,
    /// The failure lies with one request's data (a constraint, a bad value).
    Request(tokio_postgres::Error),
    /// The database or connection failed, or the commit did.
    Batch(tokio_postgres::Error),
}

impl Failed {
    fn classify(e: tokio_postgres::Error) -> Self {
        let class = e.code().map(|c| &c.code()[..2]);
        match class {
            Some("22" | "23") => Failed::Request(e),
            _ => Failed::Batch(e),
        }
    }
}
