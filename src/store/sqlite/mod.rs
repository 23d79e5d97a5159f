//! The SQLite backend: one file, WAL journal, `synchronous=FULL`, written by
//! one dedicated thread (never a tokio worker), so a commit's fsync never
//! stalls the message path.
//!
//! The file is created 0600 here, before SQLite opens it, and refused if it
//! (or a leftover -wal / -shm / -journal) is a symbolic link, not a regular
//! file, not ours, or readable by group or others: SQLite gives the -wal and
//! -shm it creates the database file's mode.

use std::fs::{DirBuilder, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{
    Connection, OpenFlags, OptionalExtension, Transaction, TransactionBehavior, params,
};

use super::error::StoreError;
use super::saf::{SafId, clip};
use super::schema::{
    self, CLAIM_COLUMNS, Change, IN_ORDER, ROW_COLUMNS, RawClaim, RawRow, VERSION_KEY,
};
use super::writer::{self, Answer, Counters, Inbox, Op, Outcome, Request};

mod insert;
mod journal;

use insert::RowInserts;

/// How long the writer waits for another process's write lock (a second
/// instance on the same file, or an operator's sqlite3 shell).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The migrations, one per schema version (index 0 brings a database to 1).
const MIGRATIONS: &[&str] = &[
    // 1: the store-and-forward queue.
    "CREATE TABLE saf (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        service TEXT NOT NULL,
        direction TEXT NOT NULL CHECK (direction IN ('to_node', 'to_peer', 'to_any_node')),
        node_id TEXT,
        kind TEXT NOT NULL CHECK (kind IN ('reversal', 'advice')),
        mti TEXT NOT NULL,
        payload BLOB,
        f11 TEXT,
        f37 TEXT,
        f7 TEXT,
        pan_masked TEXT,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at INTEGER NOT NULL,
        last_error TEXT,
        state TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'dead', 'dropped')),
        lease_owner TEXT,
        lease_until INTEGER,
        completed_at INTEGER,
        completed_by TEXT,
        answer TEXT,
        reason TEXT
    );
    CREATE INDEX saf_due ON saf (next_attempt_at, id) WHERE state = 'pending';
    CREATE INDEX saf_state ON saf (state, service, id);",
    // 2: what pruning completed entries reads (oldest first), without
    // scanning the pending ones or the history it keeps.
    "CREATE INDEX saf_done ON saf (completed_at) WHERE state IN ('delivered', 'dropped');",
    // 3: the journal of exchanges and admin actions (docs/journal.md).
    "CREATE TABLE journal (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        t_in INTEGER NOT NULL,
        t_out INTEGER NOT NULL,
        service TEXT NOT NULL,
        front TEXT NOT NULL,
        link TEXT NOT NULL,
        node TEXT,
        origin TEXT NOT NULL CHECK (origin IN ('front', 'node')),
        mti TEXT NOT NULL,
        mti_out TEXT,
        f11 TEXT,
        f7 TEXT,
        f37_in TEXT,
        f37_out TEXT,
        f41 TEXT,
        f42 TEXT,
        f32 TEXT,
        f33 TEXT,
        pan TEXT,
        f4 TEXT,
        f49 TEXT,
        f39 TEXT,
        answered_by TEXT NOT NULL CHECK (answered_by IN ('node', 'peer', 'switch', 'none')),
        reason TEXT,
        outcome TEXT NOT NULL,
        latency_us INTEGER,
        late INTEGER NOT NULL,
        duplicate INTEGER NOT NULL,
        repeat INTEGER NOT NULL,
        unroutable INTEGER NOT NULL,
        bad TEXT,
        reversal_id INTEGER
    );
    CREATE INDEX journal_t_in ON journal (t_in);
    CREATE INDEX journal_f37 ON journal (f37_in);
    CREATE INDEX journal_f37_out ON journal (f37_out);
    CREATE INDEX journal_f11 ON journal (f11, t_in);
    CREATE INDEX journal_f41 ON journal (f41, t_in);
    CREATE TABLE admin_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at INTEGER NOT NULL,
        peer TEXT NOT NULL,
        action TEXT NOT NULL,
        method TEXT NOT NULL,
        path TEXT NOT NULL,
        status INTEGER NOT NULL,
        outcome TEXT NOT NULL
    );
    CREATE INDEX admin_log_at ON admin_log (at);",
    // 4: fewer journal indexes, each one more insert per row: F37 as
    // answered only where it differs from F37 as received (the query
    // repeats the condition), F11 under F41 (a terminal, or a terminal's
    // STAN; a STAN alone is read within a time range).
    "DROP INDEX journal_f37_out;
    DROP INDEX journal_f11;
    DROP INDEX journal_f41;
    CREATE INDEX journal_f37_out ON journal (f37_out) WHERE f37_out IS NOT f37_in;
    CREATE INDEX journal_f41 ON journal (f41, f11);",
    // 5: the journal in parts of PART_ROWS rows (sqlite/insert.rs), each
    // key index led by the part: a batch's keys (random RRNs, many
    // terminals) land in the newest part's few index pages instead of all
    // over b-trees as large as the table, whose every touched page the WAL
    // wrote again at each commit. `journal_part` says which times a part
    // holds, so a query seeks its key once per part in range. Rows already
    // there get parts by id; 2048 is PART_ROWS as of this migration (a
    // migration is never edited, so it stays a literal).
    "DROP INDEX journal_f37;
    DROP INDEX journal_f37_out;
    DROP INDEX journal_f41;
    ALTER TABLE journal ADD COLUMN part INTEGER NOT NULL DEFAULT 0;
    UPDATE journal SET part = id / 2048;
    CREATE INDEX journal_f37 ON journal (part, f37_in);
    CREATE INDEX journal_f37_out ON journal (part, f37_out) WHERE f37_out IS NOT f37_in;
    CREATE INDEX journal_f41 ON journal (part, f41, f11);
    CREATE TABLE journal_part (
        part INTEGER PRIMARY KEY,
        t_min INTEGER NOT NULL,
        t_max INTEGER NOT NULL,
        rows INTEGER NOT NULL
    );
    INSERT INTO journal_part (part, t_min, t_max, rows)
        SELECT part, min(t_in), max(t_in), count(*) FROM journal GROUP BY part;",
    // 6: PostgreSQL's day partitions (its migration 6); SQLite keeps its
    // parts (migration 5).
    "SELECT 1;",
    // 7: the original transaction an entry is about, so that entries for
    // the same original go out in the order stored (a terminal's 0220
    // before its 0420), and what a claim reads to hold a later one back.
    "ALTER TABLE saf ADD COLUMN original TEXT;
    CREATE INDEX saf_original ON saf (service, original, id) WHERE state = 'pending';",
];

fn sql_error(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
    move |e| StoreError::Sqlite {
        path: path.to_path_buf(),
        source: Arc::new(e),
    }
}

/// Creates or checks the file, opens it, brings the schema up to date and
/// starts the writer thread. Blocking: call it off the tokio workers.
pub(crate) fn open(path: &Path, inbox: Inbox, counters: Arc<Counters>) -> Result<(), StoreError> {
    prepare_file(path)?;
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

/// Makes sure the database file exists, 0600 and ours, before SQLite sees it.
fn prepare_file(path: &Path) -> Result<(), StoreError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| StoreError::io(dir, e))?;
    }
    // O_CREAT|O_EXCL never follows a symbolic link; O_NOFOLLOW covers the
    // rest. An existing file is checked below.
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(StoreError::io(path, e)),
    }
    check_private(path, true)?;
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        check_private(Path::new(&side), false)?;
    }
    Ok(())
}

/// Refuses a file that is a link, not a regular file, not ours, or open to
/// group or others.
fn check_private(path: &Path, must_exist: bool) -> Result<(), StoreError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound && !must_exist => return Ok(()),
        Err(e) => return Err(StoreError::io(path, e)),
    };
    if meta.file_type().is_symlink() {
        return Err(StoreError::unsafe_file(path, "is a symbolic link"));
    }
    if !meta.is_file() {
        return Err(StoreError::unsafe_file(path, "is not a regular file"));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(StoreError::unsafe_file(
            path,
            format!(
                "is owned by uid {}, not this process's uid {me}",
                meta.uid()
            ),
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(StoreError::unsafe_file(
            path,
            format!("has mode {mode:04o}: group or others may read it (chmod 600)"),
        ));
    }
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

enum Migration {
    Sql(rusqlite::Error),
    Store(StoreError),
}

impl From<rusqlite::Error> for Migration {
    fn from(e: rusqlite::Error) -> Self {
        Migration::Sql(e)
    }
}

/// Applies the migrations the file lacks, in one transaction that also
/// records the new version (an instance opening the same file at the same
/// time waits for the write lock).
fn migrate(conn: &mut Connection) -> Result<(), Migration> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    )?;
    let stored = meta_get(&tx, VERSION_KEY)?;
    let version = schema::parse_version(stored).map_err(Migration::Store)?;
    let from = usize::try_from(version).unwrap_or(usize::MAX);
    for sql in MIGRATIONS.iter().skip(from) {
        tx.execute_batch(sql)?;
    }
    inline_list_checks(&tx)?;
    meta_put(&tx, VERSION_KEY, &schema::SCHEMA_VERSION.to_string())?;
    tx.commit()?;
    Ok(())
}

/// The CHECKs the migrations wrote as `column IN (...)` with more than two
/// values: (table, column, values).
///
/// SQLite inlines an IN list of up to two constants as comparisons, but
/// for a longer one it fills a temporary b-tree with the list and probes
/// it, and in a CHECK it does so again for every row written: for the
/// journal's `answered_by` that was four b-tree inserts, a clear and a
/// probe a row: 5,871 of the store thread's 33,069 instructions a journal
/// row (BENCHMARKS.md, "Journal cost").
const LIST_CHECKS: &[(&str, &str, &[&str])] = &[
    ("saf", "direction", &["to_node", "to_peer", "to_any_node"]),
    ("saf", "state", &["pending", "delivered", "dead", "dropped"]),
    (
        "journal",
        "answered_by",
        &["node", "peer", "switch", "none"],
    ),
];

/// A check's text as the migrations wrote it, and the same check as a
/// chain of comparisons SQLite evaluates in place.
fn list_check_texts(column: &str, values: &[&str]) -> (String, String) {
    let quoted: Vec<String> = values.iter().map(|v| format!("'{v}'")).collect();
    let as_list = format!("CHECK ({column} IN ({}))", quoted.join(", "));
    let compared: Vec<String> = quoted.iter().map(|v| format!("{column} = {v}")).collect();
    let as_or = format!("CHECK ({})", compared.join(" OR "));
    (as_list, as_or)
}

/// Rewrites each of [`LIST_CHECKS`] still written as a list into its
/// comparisons, in the migration's transaction; a file already rewritten
/// is left as it is.
///
/// This is SQLite's documented way to change a constraint without
/// rebuilding the table (lang_altertable.html, "Making Other Kinds Of
/// Table Schema Changes"): edit the table's text in `sqlite_schema` and
/// bump `schema_version` so every connection reparses it. It is safe here
/// because the new check accepts exactly the values the old one did, so no
/// stored row can violate it. It is not a schema version: the file stays
/// openable by a build from before it, which reads either text the same.
fn inline_list_checks(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    let mut edits = Vec::new();
    for &(table, column, values) in LIST_CHECKS {
        let (as_list, as_or) = list_check_texts(column, values);
        let listed: bool = tx.query_row(
            "SELECT count(*) > 0 FROM sqlite_schema \
             WHERE type = 'table' AND name = ?1 AND instr(sql, ?2) > 0",
            params![table, as_list],
            |r| r.get(0),
        )?;
        if listed {
            edits.push((table, as_list, as_or));
        }
    }
    if edits.is_empty() {
        return Ok(());
    }
    let version: i64 = tx.query_row("PRAGMA schema_version", [], |r| r.get(0))?;
    tx.execute_batch("PRAGMA writable_schema = ON")?;
    let edited = edits
        .iter()
        .try_for_each(|(table, as_list, as_or)| {
            tx.execute(
                "UPDATE sqlite_schema SET sql = replace(sql, ?1, ?2) \
                 WHERE type = 'table' AND name = ?3",
                params![as_list, as_or, table],
            )
            .map(drop)
        })
        .and_then(|()| tx.execute_batch(&format!("PRAGMA schema_version = {}", version + 1)));
    // Off whatever happened: with it on, SQLite overlooks a schema it
    // cannot parse.
    let closed = tx.execute_batch("PRAGMA writable_schema = OFF");
    edited.and(closed)?;
    // The next statement reparses every table's text: one SQLite cannot
    // parse fails here, and the migration's transaction undoes the edit.
    tx.query_row("SELECT count(*) FROM sqlite_schema", [], |r| {
        r.get::<_, i64>(0)
    })?;
    Ok(())
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
        for request in batch {
            answers.push(apply(&tx, inserts, &request.op).map_err(Failed::classify)?);
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

/// Runs one op inside the batch's transaction. The outer error aborts the
/// transaction; the inner one is the op's own answer.
fn apply(
    tx: &Transaction<'_>,
    inserts: &RowInserts<'_>,
    op: &Op,
) -> Result<Answer, rusqlite::Error> {
    Ok(match op {
        Op::SafPut(e) => {
            let (direction, node) = e.direction.to_columns();
            let id: i64 = tx
                .prepare_cached(
                    "INSERT INTO saf (service, direction, node_id, kind, mti, payload, f11, f37, f7, \
                     pan_masked, created_at, expires_at, next_attempt_at, state, original) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, 'pending', ?14) \
                     RETURNING id",
                )?
                .query_row(
                    params![
                        e.service,
                        direction,
                        node,
                        e.kind.as_str(),
                        e.mti,
                        e.payload,
                        e.keys.f11,
                        e.keys.f37,
                        e.keys.f7,
                        e.keys.pan_masked,
                        e.created_at,
                        e.expires_at,
                        e.first_attempt_at,
                        e.keys.original
                    ],
                    |r| r.get(0),
                )?;
            Ok(Outcome::Id(SafId(id)))
        }
        Op::SafClaim {
            owner,
            now,
            max,
            lease_until,
        } => {
            let max = i64::try_from(*max).unwrap_or(i64::MAX);
            let mut st = tx.prepare_cached(&format!(
                "UPDATE saf SET lease_owner = ?1, lease_until = ?2, attempts = attempts + 1 \
                 WHERE id IN (SELECT id FROM saf AS s WHERE state = 'pending' AND next_attempt_at <= ?3 \
                   AND (lease_until IS NULL OR lease_until <= ?3) AND {IN_ORDER} \
                   ORDER BY next_attempt_at, id LIMIT ?4) \
                 RETURNING {CLAIM_COLUMNS}"
            ))?;
            let raw = st
                .query_map(params![owner, lease_until, now, max], |r| {
                    Ok(RawClaim {
                        id: r.get(0)?,
                        service: r.get(1)?,
                        direction: r.get(2)?,
                        node_id: r.get(3)?,
                        kind: r.get(4)?,
                        mti: r.get(5)?,
                        payload: r.get(6)?,
                        attempts: r.get(7)?,
                        created_at: r.get(8)?,
                        expires_at: r.get(9)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            schema::claims_in_order(raw, *lease_until).map(Outcome::Claimed)
        }
        Op::SafAttempted {
            id,
            owner,
            next_attempt_at,
            error,
        } => change(
            tx,
            Change::Attempted,
            *id,
            owner,
            "UPDATE saf SET next_attempt_at = ?2, last_error = ?3, lease_owner = NULL, \
             lease_until = NULL WHERE id = ?1 AND state = 'pending' AND lease_owner = ?4",
            params![id.0, next_attempt_at, clip(error), owner],
        )?,
        Op::SafDelivered {
            id,
            owner,
            now,
            answer,
            reason,
        } => change(
            tx,
            Change::Delivered,
            *id,
            owner,
            "UPDATE saf SET state = 'delivered', completed_at = ?2, answer = ?3, completed_by = ?4, \
             reason = ?5, payload = NULL, lease_owner = NULL, lease_until = NULL \
             WHERE id = ?1 AND state = 'pending'",
            params![id.0, now, clip(answer), owner, reason.as_deref().map(clip)],
        )?,
        Op::SafDead { id, now, reason } => change(
            tx,
            Change::Dead,
            *id,
            "",
            "UPDATE saf SET state = 'dead', completed_at = ?2, reason = ?3, lease_owner = NULL, \
             lease_until = NULL WHERE id = ?1 AND state = 'pending'",
            params![id.0, now, clip(reason)],
        )?,
        Op::SafRetryNow { id, now } => change(
            tx,
            Change::RetryNow,
            *id,
            "",
            // A dead letter gets its max age again, from now.
            "UPDATE saf SET next_attempt_at = ?2, \
             expires_at = CASE WHEN state = 'dead' THEN ?2 + (expires_at - created_at) ELSE expires_at END, \
             state = 'pending', completed_at = NULL, reason = NULL \
             WHERE id = ?1 AND state IN ('pending', 'dead')",
            params![id.0, now],
        )?,
        Op::SafDrop { id, now, reason } => change(
            tx,
            Change::Drop,
            *id,
            "",
            "UPDATE saf SET state = 'dropped', completed_at = ?2, reason = ?3, payload = NULL, \
             lease_owner = NULL, lease_until = NULL WHERE id = ?1 AND state IN ('pending', 'dead')",
            params![id.0, now, clip(reason)],
        )?,
        Op::SafCancel { id, now, reason } => {
            let n = tx
                .prepare_cached(
                    "UPDATE saf SET state = 'dropped', completed_at = ?2, reason = ?3, \
                     payload = NULL, lease_owner = NULL, lease_until = NULL \
                     WHERE id = ?1 AND state = 'pending' AND (lease_until IS NULL OR lease_until <= ?2)",
                )?
                .execute(params![id.0, now, clip(reason)])?;
            Ok(Outcome::Changed(n as u64))
        }
        Op::SafPin { id, owner, node } => {
            let n = tx
                .prepare_cached(
                    "UPDATE saf SET direction = 'to_node', node_id = ?3 \
                     WHERE id = ?1 AND state = 'pending' AND lease_owner = ?2 \
                     AND direction = 'to_any_node'",
                )?
                .execute(params![id.0, owner, clip(node)])?;
            Ok(Outcome::Changed(n as u64))
        }
        Op::SafReleaseLeases { owner } => {
            let released = tx.execute(
                "UPDATE saf SET lease_owner = NULL, lease_until = NULL \
                 WHERE state = 'pending' AND lease_owner = ?1",
                params![owner],
            )?;
            Ok(Outcome::Changed(released as u64))
        }
        Op::SafPrune { before, limit } => {
            let limit = i64::try_from(*limit).unwrap_or(i64::MAX);
            let pruned = tx.execute(
                "DELETE FROM saf WHERE id IN (SELECT id FROM saf \
                 WHERE state IN ('delivered', 'dropped') AND completed_at < ?1 \
                 ORDER BY completed_at LIMIT ?2)",
                params![before, limit],
            )?;
            Ok(Outcome::Changed(pruned as u64))
        }
        Op::SafPayloads { after, limit } => {
            let limit = i64::try_from(*limit).unwrap_or(i64::MAX);
            let mut st = tx.prepare_cached(
                "SELECT id, service, kind, mti, created_at, payload FROM saf \
                 WHERE id > ?1 AND payload IS NOT NULL ORDER BY id LIMIT ?2",
            )?;
            let raw = st
                .query_map(params![after.0, limit], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)?,
                        r.get::<_, Vec<u8>>(5)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            schema::stored_payloads(raw).map(Outcome::Payloads)
        }
        Op::SafReseal { id, old, new } => {
            let n = tx.execute(
                "UPDATE saf SET payload = ?2 WHERE id = ?1 AND payload = ?3",
                params![id.0, new, old],
            )?;
            Ok(Outcome::Changed(n as u64))
        }
        Op::SafList(filter) => {
            let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
            let mut st = tx.prepare_cached(&format!(
                "SELECT {ROW_COLUMNS} FROM saf WHERE (?1 IS NULL OR state = ?1) \
                 AND (?2 IS NULL OR service = ?2) ORDER BY id DESC LIMIT ?3"
            ))?;
            let raw = st
                .query_map(
                    params![filter.state.map(|s| s.as_str()), filter.service, limit],
                    raw_row,
                )?
                .collect::<Result<Vec<_>, _>>()?;
            raw.into_iter()
                .map(RawRow::into_row)
                .collect::<Result<Vec<_>, _>>()
                .map(Outcome::Rows)
        }
        Op::SafStats { now } => {
            let mut st = tx.prepare_cached(
                "SELECT state, COUNT(*), \
                 SUM(CASE WHEN lease_until > ?1 THEN 1 ELSE 0 END), \
                 MIN(created_at), SUM(CASE WHEN attempts > 1 THEN attempts - 1 ELSE 0 END) \
                 FROM saf GROUP BY state",
            )?;
            let groups = st
                .query_map(params![now], |r| {
                    Ok(schema::StateGroup {
                        state: r.get(0)?,
                        count: r.get(1)?,
                        leased: r.get(2)?,
                        oldest: r.get(3)?,
                        repeats: r.get(4)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            schema::stats(groups, *now).map(Outcome::Stats)
        }
        Op::SafOwed { now } => {
            let mut st = tx.prepare_cached(&schema::OWED_SQL.replace("$1", "?1"))?;
            let groups = st
                .query_map(params![now], |r| {
                    Ok(schema::OwedGroup {
                        service: r.get(0)?,
                        kind: r.get(1)?,
                        state: r.get(2)?,
                        count: r.get(3)?,
                        leased: r.get(4)?,
                        oldest: r.get(5)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            schema::owed(groups, *now).map(Outcome::Owed)
        }
        Op::SafOwedToPeer {
            service,
            f11,
            f7,
            f37,
        } => {
            let id: Option<i64> = tx
                .query_row(
                    "SELECT id FROM saf WHERE state = 'pending' AND service = ?1 \
                     AND direction = 'to_peer' AND f11 = ?2 AND f7 = ?3 AND f37 = ?4 \
                     ORDER BY id LIMIT 1",
                    params![service, f11, f7, f37],
                    |r| r.get(0),
                )
                .optional()?;
            Ok(id.map_or(Outcome::Done, |id| Outcome::Id(SafId(id))))
        }
        Op::MetaGet(key) => Ok(Outcome::Meta(meta_get(tx, key)?)),
        Op::MetaPut(key, value) => {
            meta_put(tx, key, value)?;
            Ok(Outcome::Done)
        }
        Op::JournalPut { rows, admin } => journal::put(tx, inserts, rows, admin)?,
        Op::JournalQuery(filter) => journal::query(tx, filter)?,
        Op::AdminQuery { since, limit } => journal::admin_query(tx, *since, *limit)?,
        Op::JournalPurge { before, limit } => journal::purge(tx, *before, *limit)?,
        Op::AdminPurge { before, limit } => journal::admin_purge(tx, *before, *limit)?,
        Op::JournalReport { since, until } => journal::report(tx, *since, *until)?,
        Op::JournalSpace => journal::space(tx)?,
        Op::Close => Ok(Outcome::Done),
    })
}

fn raw_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
    Ok(RawRow {
        id: r.get(0)?,
        service: r.get(1)?,
        direction: r.get(2)?,
        node_id: r.get(3)?,
        kind: r.get(4)?,
        mti: r.get(5)?,
        f11: r.get(6)?,
        f37: r.get(7)?,
        f7: r.get(8)?,
        pan_masked: r.get(9)?,
        original: r.get(10)?,
        state: r.get(11)?,
        created_at: r.get(12)?,
        expires_at: r.get(13)?,
        attempts: r.get(14)?,
        next_attempt_at: r.get(15)?,
        last_error: r.get(16)?,
        lease_owner: r.get(17)?,
        lease_until: r.get(18)?,
        completed_at: r.get(19)?,
        completed_by: r.get(20)?,
        answer: r.get(21)?,
        reason: r.get(22)?,
    })
}

/// Runs a state change; when it touches no row, says why.
fn change(
    tx: &Transaction<'_>,
    change: Change,
    id: SafId,
    owner: &str,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Answer, rusqlite::Error> {
    if tx.prepare_cached(sql)?.execute(params)? > 0 {
        return Ok(Ok(Outcome::Done));
    }
    let found = tx
        .prepare_cached("SELECT state, lease_owner FROM saf WHERE id = ?1")?
        .query_row(params![id.0], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(schema::refusal(change, id, owner, found))
}

fn meta_get(conn: &Connection, key: &str) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT value FROM meta WHERE key = ?1")?
        .query_row(params![key], |r| r.get(0))
        .optional()
}

fn meta_put(conn: &Connection, key: &str, value: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO meta (key, value) VALUES (?1, ?2) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![key, value])?;
    Ok(())
}

#[cfg(test)]
mod tests;
