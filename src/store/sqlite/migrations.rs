//! The SQLite schema: one migration per schema version, applied on open in
//! one transaction, and the rewrite of the list CHECKs that SQLite would
//! otherwise evaluate through a temporary b-tree on every row written.

use rusqlite::{Connection, Transaction, TransactionBehavior, params};

use super::meta;
use crate::store::error::StoreError;
use crate::store::schema::{self, VERSION_KEY};

/// The migrations, one per schema version (index 0 brings a database to 1).
pub(super) const MIGRATIONS: &[&str] = &[
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

pub(super) enum Migration {
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
pub(super) fn migrate(conn: &mut Connection) -> Result<(), Migration> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    )?;
    let stored = meta::get(&tx, VERSION_KEY)?;
    let version = schema::parse_version(stored).map_err(Migration::Store)?;
    let from = usize::try_from(version).unwrap_or(usize::MAX);
    for sql in MIGRATIONS.iter().skip(from) {
        tx.execute_batch(sql)?;
    }
    inline_list_checks(&tx)?;
    meta::put(&tx, VERSION_KEY, &schema::SCHEMA_VERSION.to_string())?;
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
pub(super) const LIST_CHECKS: &[(&str, &str, &[&str])] = &[
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
pub(super) fn list_check_texts(column: &str, values: &[&str]) -> (String, String) {
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
