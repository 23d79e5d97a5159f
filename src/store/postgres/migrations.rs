//! The PostgreSQL schema: one migration per schema version, applied on
//! open in one transaction, under an advisory lock so that instances
//! starting together do not race.

use tokio_postgres::Client;

use super::meta::META_PUT;
use super::parts;
use crate::store::error::StoreError;
use crate::store::schema::{self, VERSION_KEY};

/// Serialises migrations of instances starting together ("isoswitc").
const MIGRATION_LOCK: i64 = 0x6973_6f73_7769_7463;

/// The migrations, one per schema version (index 0 brings a database to 1).
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: the store-and-forward queue.
    "CREATE TABLE saf (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        service TEXT NOT NULL,
        direction TEXT NOT NULL CHECK (direction IN ('to_node', 'to_peer', 'to_any_node')),
        node_id TEXT,
        kind TEXT NOT NULL CHECK (kind IN ('reversal', 'advice')),
        mti TEXT NOT NULL,
        payload BYTEA,
        f11 TEXT,
        f37 TEXT,
        f7 TEXT,
        pan_masked TEXT,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at BIGINT NOT NULL,
        last_error TEXT,
        state TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'dead', 'dropped')),
        lease_owner TEXT,
        lease_until BIGINT,
        completed_at BIGINT,
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
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        t_in BIGINT NOT NULL,
        t_out BIGINT NOT NULL,
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
        latency_us BIGINT,
        late SMALLINT NOT NULL,
        duplicate SMALLINT NOT NULL,
        repeat SMALLINT NOT NULL,
        unroutable SMALLINT NOT NULL,
        bad TEXT,
        reversal_id BIGINT
    );
    CREATE INDEX journal_t_in ON journal (t_in);
    CREATE INDEX journal_f37 ON journal (f37_in);
    CREATE INDEX journal_f37_out ON journal (f37_out);
    CREATE INDEX journal_f11 ON journal (f11, t_in);
    CREATE INDEX journal_f41 ON journal (f41, t_in);
    CREATE TABLE admin_log (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at BIGINT NOT NULL,
        peer TEXT NOT NULL,
        action TEXT NOT NULL,
        method TEXT NOT NULL,
        path TEXT NOT NULL,
        status BIGINT NOT NULL,
        outcome TEXT NOT NULL
    );
    CREATE INDEX admin_log_at ON admin_log (at);",
    // 4: fewer journal indexes (as SQLite's migration 4 says why).
    "DROP INDEX journal_f37_out;
    DROP INDEX journal_f11;
    DROP INDEX journal_f41;
    CREATE INDEX journal_f37_out ON journal (f37_out) WHERE f37_out IS DISTINCT FROM f37_in;
    CREATE INDEX journal_f41 ON journal (f41, f11);",
    // 5: SQLite's journal parts (its migration 5). PostgreSQL keeps one
    // table and its indexes; the partitioning it would want is its own.
    "SELECT 1;",
    // 6: the journal and admin log partitioned by day (parts.rs).
    parts::MIGRATION_6,
    // 7: the original transaction an entry is about (SQLite's migration 7).
    "ALTER TABLE saf ADD COLUMN original TEXT;
    CREATE INDEX saf_original ON saf (service, original, id) WHERE state = 'pending';",
];

pub(super) enum Migration {
    Sql(tokio_postgres::Error),
    Store(StoreError),
    /// The server's `server_version_num`, too old for the partitions.
    TooOld(i32),
}

impl From<tokio_postgres::Error> for Migration {
    fn from(e: tokio_postgres::Error) -> Self {
        Migration::Sql(e)
    }
}

/// Applies the migrations the database lacks in one transaction, under an
/// advisory lock so two instances starting together do not race.
pub(super) async fn migrate(client: &mut Client) -> Result<(), Migration> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        .await?;
    let stored: Option<String> = tx
        .query_opt("SELECT value FROM meta WHERE key = $1", &[&VERSION_KEY])
        .await?
        .map(|row| row.get(0));
    let version = schema::parse_version(stored).map_err(Migration::Store)?;
    let server: i32 = tx
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await?
        .try_get(0)?;
    if server < parts::MIN_SERVER {
        return Err(Migration::TooOld(server));
    }
    let from = usize::try_from(version).unwrap_or(usize::MAX);
    for sql in MIGRATIONS.iter().skip(from) {
        tx.batch_execute(sql).await?;
    }
    tx.execute(
        META_PUT,
        &[&VERSION_KEY, &schema::SCHEMA_VERSION.to_string()],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn there_is_one_migration_per_schema_version() {
        assert_eq!(MIGRATIONS.len() as i64, schema::SCHEMA_VERSION);
    }
}
