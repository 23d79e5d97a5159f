//! The PostgreSQL journal's day partitions: `journal` and `admin_log` are
//! partitioned by range on their time column, one partition per UTC day
//! (`journal_d20261206`, `admin_log_d20261206`). The store's maintenance
//! creates today's and the next [`AHEAD_DAYS`] days' partitions ahead and
//! retention detaches (`CONCURRENTLY`) and drops whole days, so neither
//! takes a lock the writer's inserts wait for (docs/journal.md,
//! "Retention").

use tokio_postgres::Client;

/// One UTC day, in milliseconds.
pub(super) const DAY_MS: i64 = 86_400_000;

/// Partitions made ahead of today: rows of the next days find theirs even
/// if the maintenance is away for a while.
pub(super) const AHEAD_DAYS: i64 = 2;

/// The partitioned tables and the column they are partitioned on.
pub(super) const TABLES: [(&str, &str); 2] = [("journal", "t_in"), ("admin_log", "at")];

/// Serialises partition creation among instances ("isopartn").
const PARTS_LOCK: i64 = 0x6973_6f70_6172_746e;

/// Migration 6: the journal and admin log become partitioned by day. Rows
/// already there are moved into a partition per day they hold (ids kept),
/// in the migration's transaction; the unpartitioned tables are dropped.
pub(super) const MIGRATION_6: &str = "
    ALTER TABLE journal RENAME TO journal_unparted;
    ALTER INDEX journal_pkey RENAME TO journal_unparted_pkey;
    ALTER INDEX journal_t_in RENAME TO journal_unparted_t_in;
    ALTER INDEX journal_f37 RENAME TO journal_unparted_f37;
    ALTER INDEX journal_f37_out RENAME TO journal_unparted_f37_out;
    ALTER INDEX journal_f41 RENAME TO journal_unparted_f41;
    ALTER TABLE admin_log RENAME TO admin_log_unparted;
    ALTER INDEX admin_log_pkey RENAME TO admin_log_unparted_pkey;
    ALTER INDEX admin_log_at RENAME TO admin_log_unparted_at;
    CREATE SEQUENCE journal_ids;
    CREATE TABLE journal (
        id BIGINT NOT NULL DEFAULT nextval('journal_ids'),
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
    ) PARTITION BY RANGE (t_in);
    ALTER SEQUENCE journal_ids OWNED BY journal.id;
    CREATE INDEX journal_t_in ON journal (t_in);
    CREATE INDEX journal_f37 ON journal (f37_in);
    CREATE INDEX journal_f37_out ON journal (f37_out) WHERE f37_out IS DISTINCT FROM f37_in;
    CREATE INDEX journal_f41 ON journal (f41, f11);
    CREATE SEQUENCE admin_log_ids;
    CREATE TABLE admin_log (
        id BIGINT NOT NULL DEFAULT nextval('admin_log_ids'),
        at BIGINT NOT NULL,
        peer TEXT NOT NULL,
        action TEXT NOT NULL,
        method TEXT NOT NULL,
        path TEXT NOT NULL,
        status BIGINT NOT NULL,
        outcome TEXT NOT NULL
    ) PARTITION BY RANGE (at);
    ALTER SEQUENCE admin_log_ids OWNED BY admin_log.id;
    CREATE INDEX admin_log_at ON admin_log (at);
    DO $$
    DECLARE
        d BIGINT;
    BEGIN
        FOR d IN SELECT DISTINCT t_in / 86400000 FROM journal_unparted LOOP
            EXECUTE format('CREATE TABLE %I PARTITION OF journal FOR VALUES FROM (%s) TO (%s)',
                'journal_d' || to_char(to_timestamp(d * 86400) AT TIME ZONE 'UTC', 'YYYYMMDD'),
                d * 86400000, (d + 1) * 86400000);
        END LOOP;
        FOR d IN SELECT DISTINCT at / 86400000 FROM admin_log_unparted LOOP
            EXECUTE format('CREATE TABLE %I PARTITION OF admin_log FOR VALUES FROM (%s) TO (%s)',
                'admin_log_d' || to_char(to_timestamp(d * 86400) AT TIME ZONE 'UTC', 'YYYYMMDD'),
                d * 86400000, (d + 1) * 86400000);
        END LOOP;
    END $$;
    INSERT INTO journal SELECT * FROM journal_unparted;
    INSERT INTO admin_log SELECT * FROM admin_log_unparted;
    SELECT setval('journal_ids', COALESCE((SELECT max(id) FROM journal_unparted), 0) + 1, false);
    SELECT setval('admin_log_ids', COALESCE((SELECT max(id) FROM admin_log_unparted), 0) + 1, false);
    DROP TABLE journal_unparted;
    DROP TABLE admin_log_unparted;";

/// The oldest server the partitions work on: `DETACH PARTITION ...
/// CONCURRENTLY` is PostgreSQL 14's.
pub(super) const MIN_SERVER: i32 = 140_000;

/// The UTC day of `ms` (days since 1970-01-01).
pub(super) fn day_of(ms: i64) -> i64 {
    ms.div_euclid(DAY_MS)
}

/// `table`'s partition for `day`: `journal_d20261206`.
pub(super) fn name(table: &str, day: i64) -> String {
    let (y, m, d) = civil(day);
    format!("{table}_d{y:04}{m:02}{d:02}")
}

/// The civil date of a day number (H. Hinnant's algorithm).
fn civil(day: i64) -> (i64, i64, i64) {
    let z = day + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Makes the partitions of today and the next [`AHEAD_DAYS`] days that do
/// not exist yet. Each is made apart and attached (`ATTACH PARTITION` takes
/// a lock the inserts into the other partitions do not wait for), under an
/// advisory lock so instances do not race. Returns how many were made.
pub(super) async fn ensure(client: &mut Client, now: i64) -> Result<usize, tokio_postgres::Error> {
    let today = day_of(now);
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&PARTS_LOCK])
        .await?;
    let mut made = 0;
    for (table, column) in TABLES {
        let existing: Vec<String> = tx
            .query(
                "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
                 WHERE i.inhparent = $1::text::regclass",
                &[&table],
            )
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        for day in today..=today + AHEAD_DAYS {
            let part = name(table, day);
            if existing.contains(&part) {
                continue;
            }
            let (lo, hi) = (day * DAY_MS, (day + 1) * DAY_MS);
            tx.batch_execute(&format!(
                "CREATE TABLE {part} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
                 ALTER TABLE {part} ADD CONSTRAINT {part}_day CHECK ({column} >= {lo} AND {column} < {hi});
                 ALTER TABLE {table} ATTACH PARTITION {part} FOR VALUES FROM ({lo}) TO ({hi});"
            ))
            .await?;
            made += 1;
        }
    }
    tx.commit().await?;
    Ok(made)
}

/// A day partition (or one left detached by a cut-off retention) older
/// than the cutoff.
struct Old {
    name: String,
    attached: bool,
    pending: bool,
    rows: i64,
}

/// Drops the day partitions of `table` whose whole day is before `before`:
/// `DETACH PARTITION ... CONCURRENTLY` (which waits for the queries reading
/// the day, never makes the inserts wait), then `DROP TABLE` of what is no
/// longer part of the table. A detach cut off half-way is finished first
/// (`FINALIZE`). Runs outside any transaction (the concurrent detach must).
/// Returns the rows dropped, as PostgreSQL's statistics count them (an
/// estimate once the day was analysed, counted when it never was).
pub(super) async fn drop_before(
    client: &Client,
    table: &str,
    before: i64,
) -> Result<u64, tokio_postgres::Error> {
    let cutoff = name(table, day_of(before));
    let pattern = format!("^{table}_d[0-9]{{8}}$");
    let rows = client
        .query(
            "SELECT c.relname::text, c.relispartition, \
               COALESCE((SELECT i.inhdetachpending FROM pg_inherits i WHERE i.inhrelid = c.oid), false), \
               c.reltuples::bigint \
             FROM pg_class c WHERE c.relkind = 'r' AND c.relname ~ $1 \
               AND c.relnamespace = current_schema()::regnamespace AND c.relname::text < $2 \
             ORDER BY c.relname",
            &[&pattern, &cutoff],
        )
        .await?;
    let old = rows
        .iter()
        .map(|r| {
            Ok(Old {
                name: r.try_get(0)?,
                attached: r.try_get(1)?,
                pending: r.try_get(2)?,
                rows: r.try_get(3)?,
            })
        })
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
    let mut dropped = 0u64;
    for part in old {
        // PostgreSQL's estimate once the day was analysed (autovacuum does
        // within a minute of a day's first 50 rows); counted when it never
        // was (0 or -1: nothing to go by), which only a small day is.
        let rows = if part.rows > 0 {
            part.rows
        } else {
            client
                .query_one(&format!("SELECT count(*) FROM {}", part.name), &[])
                .await?
                .try_get(0)?
        };
        if part.pending {
            client
                .batch_execute(&format!(
                    "ALTER TABLE {table} DETACH PARTITION {} FINALIZE",
                    part.name
                ))
                .await?;
        } else if part.attached {
            client
                .batch_execute(&format!(
                    "ALTER TABLE {table} DETACH PARTITION {} CONCURRENTLY",
                    part.name
                ))
                .await?;
        }
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {}", part.name))
            .await?;
        dropped += u64::try_from(rows).unwrap_or(0);
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_named_by_their_utc_day() {
        assert_eq!(name("journal", 0), "journal_d19700101");
        // 2026-12-06 00:00:00 UTC and its last millisecond.
        let day = day_of(1_796_515_200_000);
        assert_eq!(name("journal", day), "journal_d20261206");
        assert_eq!(day_of(1_796_515_200_000 + DAY_MS - 1), day);
        assert_eq!(name("admin_log", day + 26), "admin_log_d20270101");
        assert_eq!(
            name("journal", day_of(951_782_400_000)),
            "journal_d20000229"
        );
    }
}
