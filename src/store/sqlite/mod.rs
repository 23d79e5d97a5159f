//! The SQLite backend: one file, WAL journal, `synchronous=FULL`, written by
//! one dedicated thread (never a tokio worker), so a commit's fsync never
//! stalls the message path.
//!
//! Each batch runs in one transaction, through [`Sqlite`], the backend seam
//! (`store/backend.rs`) over that transaction: its operations are in
//! `saf.rs`, `journal.rs` (with `insert.rs`, the journal's bound inserts)
//! and `meta.rs`; the file's checks in `file.rs`, the schema in
//! `migrations.rs`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};

use super::backend::{self, Driver};
use super::error::StoreError;
use super::writer::{self, Answer, Counters, Inbox, Outcome, Request};

mod file;
mod insert;
mod journal;
mod meta;
mod migrations;
mod saf;

use insert::RowInserts;
use migrations::{Migration, migrate};

/// How long the writer waits for another process's write lock (a second
/// instance on the same file, or an operator's sqlite3 shell).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The SQLite backend inside one batch's transaction: what every op of the
/// batch runs on.
pub(crate) struct Sqlite<'a> {
    tx: &'a Transaction<'a>,
    /// The journal's multi-row inserts, prepared once per connection.
    inserts: &'a RowInserts<'a>,
}

impl Driver for Sqlite<'_> {
    type Error = rusqlite::Error;
}

/// The answer of an operation of [`Sqlite`]: ready at its first poll, since
/// the driver blocks (on the writer's own thread) and nothing in it waits.
/// A future that did wait would be a bug here, answered as one, not a hang.
fn now<T>(op: impl Future<Output = rusqlite::Result<T>>) -> rusqlite::Result<T> {
    op.now_or_never().unwrap_or_else(|| {
        Err(rusqlite::Error::ToSqlConversionFailure(Box::new(
            std::io::Error::other("an SQLite store operation waited (a bug)"),
        )))
    })
}

fn sql_error(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
    move |e| StoreError::Sqlite {
        path: path.to_path_buf(),
        source: Arc::new(e),
    }
}

/// Creates or checks the file, opens it, brings the schema up to date and
/// starts the writer thread. Blocking: call it off the tokio workers.
pub(crate) fn open(path: &Path, inbox: Inbox, counters: Arc<Counters>) -> Result<(), StoreError> {
    file::prepare_file(path)?;
    let mut conn = connect(path)?;
    migrate(&mut conn).map_err(|e| match e {
        Migration::Sql(e) => sql_error(path)(e),
        Migration::Store(e) => e,
    })?;
    let writer = Writer {
        path: path.to_path_buf(),
        conn,
        counters,
        synced: std::cell::Cell::new(true),
    };
    std::thread::Builder::new()
        .name("isoswitch-store".into())
        .spawn(move || writer.run(inbox))
        .map_err(|e| StoreError::io(path, e))?;
    Ok(())
}

fn connect(path: &Path) -> Result<Connection, StoreError> {
    let e = sql_error(path);
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_NOFOLLOW;
    let conn = Connection::open_with_flags(path, flags).map_err(&e)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(&e)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(&e)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::unsafe_file(
            path,
            format!("journal mode stays `{mode}`, not wal"),
        ));
    }
    // FULL: the WAL is synced at every commit, so an acknowledged put
    // survives power loss, not just a crash of the process.
    // secure_delete: a deleted row (journal retention, a pruned SAF entry)
    // and a delivered entry's payload, set to NULL, are overwritten with
    // zeros in the file, not left in free pages with their PAN bytes
    // (docs/store.md).
    // temp_store = MEMORY: a statement that writes several b-trees and may
    // stop midway on a constraint keeps a statement journal (the pages it
    // changes, to undo the statement alone). The journal's inserts did, until
    // they became `INSERT OR FAIL` (journal/insert.rs); in a temp file that was
    // a pwrite per page, 21% of the switch's samples with the journal on at
    // 10k req/s. The SAF's statements still may; in memory it is a copy,
    // freed when the statement ends, and nothing durable moves there.
    conn.execute_batch(
        "PRAGMA synchronous = FULL; PRAGMA secure_delete = ON; PRAGMA temp_store = MEMORY;",
    )
    .map_err(&e)?;
    Ok(conn)
}

struct Writer {
    path: PathBuf,
    conn: Connection,
    counters: Arc<Counters>,
    /// `synchronous` is FULL (else NORMAL: the journal's own batches).
    synced: std::cell::Cell<bool>,
}

impl Writer {
    fn run(self, mut inbox: Inbox) {
        let closer = {
            let inserts = RowInserts::new(&self.conn);
            loop {
                let Some(mut batch) = inbox.next_blocking() else {
                    break None;
                };
                let closer = writer::take_close(&mut batch);
                self.run_batch(batch, &inserts);
                if closer.is_some() {
                    break closer;
                }
            }
            // The statements are finalized here, before the connection.
        };
        // Close the file before saying so: a caller may reopen it next.
        drop(self);
        if let Some(closer) = closer {
            closer.answer(Ok(Outcome::Done));
        }
    }

    /// One transaction for the whole batch; answers go out after the commit.
    /// A statement failing on its request's own data is retried alone so it
    /// fails only that request; any other failure fails the batch.
    fn run_batch(&self, batch: Vec<Request>, inserts: &RowInserts<'_>) {
        if batch.is_empty() {
            return;
        }
        match self.transact(&batch, inserts) {
            Ok(answers) => {
                for (request, answer) in batch.into_iter().zip(answers) {
                    request.answer(answer);
                }
            }
            Err(Failed::Request(_)) if batch.len() > 1 => {
                for request in batch {
                    self.run_batch(vec![request], inserts);
                }
            }
            Err(Failed::Request(e) | Failed::Batch(e)) => {
                let e = sql_error(&self.path)(e);
                for request in batch {
                    request.answer(Err(e.clone()));
                }
            }
        }
    }

    fn transact(&self, batch: &[Request], inserts: &RowInserts<'_>) -> Result<Vec<Answer>, Failed> {
        // IMMEDIATE takes the write lock up front: a second process on the
        // same file waits (busy timeout) instead of failing mid-batch.
        // A batch that only reads takes no write lock (WAL readers never
        // block the writer of another process, nor it them).
        let behavior = if batch.iter().all(|r| r.op.reads_only()) {
            TransactionBehavior::Deferred
        } else {
            TransactionBehavior::Immediate
        };
        // FULL syncs the WAL at this commit, and with it every frame an
        // unsynced (NORMAL) journal batch wrote before.
        let sync = batch.iter().any(|r| r.op.needs_sync());
        if sync != self.synced.get() {
            let pragma = if sync {
                "PRAGMA synchronous = FULL;"
            } else {
                "PRAGMA synchronous = NORMAL;"
            };
            self.conn.execute_batch(pragma).map_err(Failed::Batch)?;
            self.synced.set(sync);
        }
        let tx = Transaction::new_unchecked(&self.conn, behavior).map_err(Failed::Batch)?;
        let mut answers = Vec::with_capacity(batch.len());
        let sqlite = Sqlite { tx: &tx, inserts };
        for request in batch {
            let answer = now(backend::apply(&sqlite, &request.op));
            answers.push(answer.map_err(Failed::classify)?);
        }
        tx.commit().map_err(Failed::Batch)?;
        self.counters.committed();
        Ok(answers)
    }
}

enum Failed {
    /// The failure lies with one request's data (a constraint).
    Request(rusqlite::Error),
    /// The database as a whole failed (I/O, full disk, lock timeout).
    Batch(rusqlite::Error),
}

impl Failed {
    fn classify(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::ConstraintViolation) => Failed::Request(e),
            _ => Failed::Batch(e),
        }
    }
}

#[cfg(test)]
mod tests;
