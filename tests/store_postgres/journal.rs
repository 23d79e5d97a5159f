//! The journal on PostgreSQL: day partitions, retention that drops a day
//! while traffic runs without a pause, partitioning an old table on open,
//! and the disk guard's `max_size`.

use super::*;

/// `table`'s partition for `day` (days since 1970-01-01, UTC), made by
/// hand as the store would have made it that day.
async fn make_day(admin: &tokio_postgres::Client, table: &str, day: i64) {
    let (lo, hi) = (day * DAY_MS, (day + 1) * DAY_MS);
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN EXECUTE format('CREATE TABLE %I PARTITION OF {table} \
             FOR VALUES FROM ({lo}) TO ({hi})', '{table}_d' || \
             to_char(to_timestamp({day}::bigint * 86400) AT TIME ZONE 'UTC', 'YYYYMMDD')); END $$"
        ))
        .await
        .expect("make a day's partition");
}

/// `n` journal rows on `day`, and one admin row, written straight into the
/// tables.
async fn fill_day(admin: &tokio_postgres::Client, day: i64, n: i64) {
    admin
        .execute(
            "INSERT INTO journal (t_in, t_out, service, front, link, origin, mti, f11, f37_in, \
             answered_by, outcome, late, duplicate, repeat, unroutable) \
             SELECT $1::bigint + g, $1::bigint + g + 3, 'pos', 'listen', 'client#1', 'front', '0200', \
             lpad((g % 1000000)::text, 6, '0'), lpad(g::text, 12, '0'), 'node', 'answered', \
             0, 0, 0, 0 FROM generate_series(0::bigint, $2::bigint - 1) g",
            &[&(day * DAY_MS), &n],
        )
        .await
        .expect("fill the day");
    admin
        .execute(
            "INSERT INTO admin_log (at, peer, action, method, path, status, outcome) \
             VALUES ($1, '127.0.0.1:5', 'drain', 'POST', '/x', 200, 'ok')",
            &[&(day * DAY_MS + 5)],
        )
        .await
        .expect("an admin row");
}

async fn partitions(admin: &tokio_postgres::Client, table: &str) -> Vec<String> {
    admin
        .query(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = $1::text::regclass ORDER BY 1",
            &[&table],
        )
        .await
        .expect("partitions")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn journal_row(t_in: i64, seq: u32) -> isoswitch::store::journal::NewRow {
    let row = isoswitch::store::journal::JournalRow {
        t_in,
        t_out: t_in + 1,
        service: "pos".into(),
        front: "listen".into(),
        link: "client#1".into(),
        origin: "front".into(),
        mti: "0200".into(),
        f11: Some(format!("{:06}", seq % 1_000_000)),
        answered_by: "node".into(),
        outcome: "answered".into(),
        ..Default::default()
    };
    isoswitch::store::journal::NewRow::from(&row)
}

/// Each store call's start and how long it took, while `until` is not
/// set: SAF puts (synced commits, as the message path's reversals are) or
/// journal batches of 16 rows (the journal writer's), one call at a time.
async fn traffic(
    store: Store,
    until: Arc<std::sync::atomic::AtomicBool>,
    journal: bool,
) -> Vec<(std::time::Instant, Duration)> {
    use std::sync::atomic::Ordering;
    let mut calls = Vec::new();
    let mut n = 0u32;
    while !until.load(Ordering::Relaxed) {
        let started = std::time::Instant::now();
        if journal {
            let now = isoswitch::store::now_millis();
            let rows = (0..16).map(|i| journal_row(now, n * 16 + i)).collect();
            store.journal_put(rows, vec![]).await.expect("journal put");
        } else {
            store.saf_put(entry("cups", n, T0)).await.expect("saf put");
        }
        calls.push((started, started.elapsed()));
        n += 1;
        // Pacing, not a wait: a steady stream of calls.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    calls
}

/// Samples, about every millisecond until `done`, whether the store's
/// connections (application `isoswitch`, other than the maintenance's
/// own, which runs the drop) wait on a lock; the longest such stretch and
/// the samples taken (counted in `sampled` as they are).
async fn lock_waits(
    url: String,
    done: Arc<std::sync::atomic::AtomicBool>,
    sampled: Arc<std::sync::atomic::AtomicU32>,
) -> (Duration, u32) {
    let admin = admin(&url).await;
    let mut longest = Duration::ZERO;
    let mut since: Option<std::time::Instant> = None;
    let mut samples = 0;
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND application_name = 'isoswitch' AND wait_event_type = 'Lock' \
                 AND query NOT ILIKE '%PARTITION%' AND query NOT ILIKE 'DROP TABLE%'",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        samples += 1;
        sampled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match (waiting > 0, since) {
            (true, None) => since = Some(std::time::Instant::now()),
            (false, Some(t)) => {
                longest = longest.max(t.elapsed());
                since = None;
            }
            _ => {}
        }
        // Pacing, not a wait: a sample about every millisecond.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if let Some(t) = since {
        longest = longest.max(t.elapsed());
    }
    (longest, samples)
}

/// The longest any of `calls` waited within `from..to`: from when it
/// started, or from `from` for one already under way (a call stuck before
/// the window opened is not the window's doing), until it ended.
fn longest_within(
    calls: &[(std::time::Instant, Duration)],
    from: std::time::Instant,
    to: std::time::Instant,
) -> Duration {
    calls
        .iter()
        .filter(|(at, took)| *at < to && *at + *took > from)
        .map(|(at, took)| *at + *took - (*at).max(from))
        .max()
        .unwrap_or_default()
}

/// Issue 41's done-when: retention drops whole days of the journal and the
/// admin log while SAF and journal writes go on, and none of them waits
/// more than 10 ms for it. Two old days of 100,000 rows each go; today's
/// and the partitions made ahead stay.
#[tokio::test]
async fn retention_drops_a_day_while_traffic_runs_without_a_pause() {
    use std::sync::atomic::{AtomicBool, Ordering};
    limited(async {
        let (_server, url) = fresh("retain").await;
        let admin = admin(&url).await;
        // What is measured is what the drop adds (a lock the writer would
        // wait for), not this machine's WAL flushes: 8-14 ms a synced
        // commit here with nothing dropped, on 2 cores shared with builds.
        admin
            .batch_execute(
                "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = off', \
                 current_database()); END $$",
            )
            .await
            .expect("commits without waiting for the flush");
        let store = open(&url).await;
        let today = isoswitch::store::now_millis().div_euclid(DAY_MS);
        // Made ahead at open: today and the next two days.
        let ahead = partitions(&admin, "journal").await;
        assert_eq!(ahead.len(), 3, "{ahead:?}");
        assert_eq!(partitions(&admin, "admin_log").await.len(), 3);
        for day in [today - 3, today - 2] {
            make_day(&admin, "journal", day).await;
            make_day(&admin, "admin_log", day).await;
            fill_day(&admin, day, 100_000).await;
        }
        // The last day ahead gone: retention's pass makes it again (an
        // ATTACH) under the same traffic and watch.
        for table in ["journal", "admin_log"] {
            let last = partitions(&admin, table).await.pop().expect("a day ahead");
            admin
                .batch_execute(&format!(
                    "ALTER TABLE {table} DETACH PARTITION {last}; DROP TABLE {last}"
                ))
                .await
                .expect("drop the last day ahead");
        }
        // As autovacuum would have, long before a day is old enough to go.
        admin
            .batch_execute("ANALYZE journal")
            .await
            .expect("analyze");
        // Traffic first, alone: what a call takes without a drop.
        let stop = Arc::new(AtomicBool::new(false));
        let saf = tokio::spawn(traffic(store.clone(), Arc::clone(&stop), false));
        let rows = tokio::spawn(traffic(store.clone(), Arc::clone(&stop), true));
        // A measuring window, not a wait: the calls before the drop are
        // the baseline printed below.
        tokio::time::sleep(Duration::from_millis(500)).await;
        // The drop, under traffic: everything before yesterday, while the
        // store's writer is watched for any wait on a lock.
        let watching = Arc::new(AtomicBool::new(false));
        let sampled = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let watch = tokio::spawn(lock_waits(
            url.clone(),
            Arc::clone(&watching),
            Arc::clone(&sampled),
        ));
        // The watch under way (a few samples taken) before the drop.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while sampled.load(Ordering::Relaxed) < 3 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the lock watch never took a sample"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let from = std::time::Instant::now();
        let dropped = store
            .journal_purge((today - 1) * DAY_MS, 500)
            .await
            .expect("retention");
        let to = std::time::Instant::now();
        watching.store(true, Ordering::Relaxed);
        let (waited, samples) = watch.await.expect("watch");
        // A measuring window, not a wait: traffic goes on past the drop.
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        let saf = saf.await.expect("saf traffic");
        let rows = rows.await.expect("journal traffic");
        let start = saf[0].0.min(rows[0].0);
        let before = |calls: &[(std::time::Instant, Duration)]| longest_within(calls, start, from);
        let during = |calls: &[(std::time::Instant, Duration)]| longest_within(calls, from, to);
        // The usual call: the median before the drop (the writer's own
        // work and commit, with nothing dropped), for the printout.
        let usual = |calls: &[(std::time::Instant, Duration)]| {
            let mut took: Vec<Duration> = calls
                .iter()
                .filter(|(at, _)| *at < from)
                .map(|(_, t)| *t)
                .collect();
            took.sort();
            took.get(took.len() / 2).copied().unwrap_or_default()
        };
        eprintln!(
            "dropped {dropped} rows in {:?}; writer seen waiting on a lock for {waited:?} \
             ({samples} samples); SAF puts: longest {:?} during the drop, usual {:?}, \
             longest before {:?}, {} calls; journal batches: {:?}, {:?}, {:?}, {}",
            to - from,
            during(&saf),
            usual(&saf),
            before(&saf),
            saf.len(),
            during(&rows),
            usual(&rows),
            before(&rows),
            rows.len()
        );
        // PostgreSQL's statistics count a dropped day's rows (an estimate:
        // the days were analysed).
        assert!((180_000..=220_000).contains(&dropped), "dropped {dropped}");
        assert!(saf.len() > 50 && rows.len() > 50, "traffic ran");
        assert!(samples >= 3, "the writer was watched: {samples} samples");
        assert_eq!(waited, Duration::ZERO, "the writer waited on a lock");
        // How long the calls took during the drop is printed above, not
        // asserted: on a shared machine a call's time says more about the
        // neighbours than about the drop. What the drop must never do is
        // make the writer wait on a lock, and that is asserted.
        // The old days are gone, tables and all; today's rows stayed, and
        // the days ahead are there again.
        assert_eq!(partitions(&admin, "journal").await, ahead);
        // The admin audit keeps its own retention: the journal's leaves it.
        assert_eq!(partitions(&admin, "admin_log").await.len(), 5);
        let audit = store
            .admin_purge((today - 1) * DAY_MS, 500)
            .await
            .expect("audit retention");
        assert!(audit > 0, "the old days' admin rows went");
        assert_eq!(partitions(&admin, "admin_log").await.len(), 3);
        let left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_class WHERE relname ~ '_d[0-9]{8}$'",
                &[],
            )
            .await
            .expect("tables")
            .get(0);
        assert_eq!(left, 6, "no detached day left behind");
        let kept: i64 = admin
            .query_one("SELECT count(*) FROM journal", &[])
            .await
            .expect("count")
            .get(0);
        assert_eq!(kept, rows.len() as i64 * 16);
        // What the journal takes is the sum of its days.
        let space = store.journal_space().await.expect("space");
        assert!(space.used > 0, "{space:?}");
        assert!(
            space.oldest.is_some_and(|t| t >= today * DAY_MS),
            "{space:?}"
        );
        // Nothing more to drop: the next call finds nothing.
        let again = store.journal_purge((today - 1) * DAY_MS, 500).await;
        assert_eq!(again.expect("retention again"), 0);
        store.close().await.expect("close");
    })
    .await;
}

/// A database at schema 5 (one unpartitioned journal) is partitioned by
/// day when this build opens it: every row kept in its day, ids too, and
/// new rows numbered after them.
#[tokio::test]
async fn an_unpartitioned_journal_is_partitioned_on_open() {
    limited(async {
        let (_server, url) = fresh("parting").await;
        open(&url).await.close().await.expect("close");
        let admin = admin(&url).await;
        // Back to schema 5's tables, with rows on two days.
        admin
            .batch_execute(
                "DROP TABLE journal; DROP TABLE admin_log;
                 ALTER TABLE saf DROP COLUMN original;
                 CREATE TABLE journal (
                    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                    t_in BIGINT NOT NULL, t_out BIGINT NOT NULL, service TEXT NOT NULL,
                    front TEXT NOT NULL, link TEXT NOT NULL, node TEXT,
                    origin TEXT NOT NULL CHECK (origin IN ('front', 'node')),
                    mti TEXT NOT NULL, mti_out TEXT, f11 TEXT, f7 TEXT, f37_in TEXT,
                    f37_out TEXT, f41 TEXT, f42 TEXT, f32 TEXT, f33 TEXT, pan TEXT, f4 TEXT,
                    f49 TEXT, f39 TEXT,
                    answered_by TEXT NOT NULL CHECK (answered_by IN ('node', 'peer', 'switch', 'none')),
                    reason TEXT, outcome TEXT NOT NULL, latency_us BIGINT,
                    late SMALLINT NOT NULL, duplicate SMALLINT NOT NULL, repeat SMALLINT NOT NULL,
                    unroutable SMALLINT NOT NULL, bad TEXT, reversal_id BIGINT);
                 CREATE INDEX journal_t_in ON journal (t_in);
                 CREATE INDEX journal_f37 ON journal (f37_in);
                 CREATE INDEX journal_f37_out ON journal (f37_out) WHERE f37_out IS DISTINCT FROM f37_in;
                 CREATE INDEX journal_f41 ON journal (f41, f11);
                 CREATE TABLE admin_log (
                    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                    at BIGINT NOT NULL, peer TEXT NOT NULL, action TEXT NOT NULL,
                    method TEXT NOT NULL, path TEXT NOT NULL, status BIGINT NOT NULL,
                    outcome TEXT NOT NULL);
                 CREATE INDEX admin_log_at ON admin_log (at);
                 UPDATE meta SET value = '5' WHERE key = 'schema_version';"
            )
            .await
            .expect("schema 5");
        let today = isoswitch::store::now_millis().div_euclid(DAY_MS);
        fill_day(&admin, today - 1, 700).await;
        fill_day(&admin, today, 300).await;
        admin
            .batch_execute("DELETE FROM journal WHERE id = 1")
            .await
            .expect("a gap in the ids");
        let store = open(&url).await;
        let version = isoswitch::store::SCHEMA_VERSION.to_string();
        assert_eq!(
            store.meta_get("schema_version").await.expect("meta").as_deref(),
            Some(version.as_str())
        );
        let kinds: Vec<(String, bool)> = admin
            .query(
                "SELECT c.relname::text, p.partrelid IS NOT NULL FROM pg_class c \
                 LEFT JOIN pg_partitioned_table p ON p.partrelid = c.oid \
                 WHERE c.relname IN ('journal', 'admin_log') ORDER BY 1",
                &[],
            )
            .await
            .expect("tables")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(
            kinds,
            [("admin_log".into(), true), ("journal".into(), true)]
        );
        // Yesterday's partition from its rows, today's and two ahead.
        assert_eq!(partitions(&admin, "journal").await.len(), 4);
        assert_eq!(partitions(&admin, "admin_log").await.len(), 4);
        let (n, lo, hi): (i64, i64, i64) = admin
            .query_one("SELECT count(*), min(id), max(id) FROM journal", &[])
            .await
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .expect("rows");
        assert_eq!((n, lo, hi), (999, 2, 1000));
        let now = isoswitch::store::now_millis();
        store
            .journal_put(vec![journal_row(now, 1)], vec![])
            .await
            .expect("a new row");
        let newest: i64 = admin
            .query_one("SELECT max(id) FROM journal", &[])
            .await
            .expect("max")
            .get(0);
        assert_eq!(newest, 1001);
        // Retention now drops yesterday as a whole.
        let dropped = store
            .journal_purge(today * DAY_MS, 500)
            .await
            .expect("retention");
        assert_eq!(dropped, 699, "699 journal rows (id 1 went)");
        assert_eq!(partitions(&admin, "journal").await.len(), 3);
        // The admin audit has its own retention, dropping whole days too.
        let audit = store
            .admin_purge(today * DAY_MS, 500)
            .await
            .expect("audit retention");
        assert_eq!(audit, 1, "the admin row");
        assert_eq!(partitions(&admin, "admin_log").await.len(), 3);
        store.close().await.expect("close");
    })
    .await;
}

/// Issue 41: `journal.max_size` holds on PostgreSQL too. Past it, the disk
/// guard drops the journal's oldest day partitions, then, with only
/// today's left, pauses the journal (rows not written, counted) while SAF
/// entries are still stored and delivered; it resumes by itself once the
/// rows go (today's partition emptied).
#[tokio::test]
async fn the_disk_guard_holds_max_size_on_postgres() {
    use isoswitch::config::journal::JournalConfig;
    use isoswitch::config::space::SpaceLimit;
    use isoswitch::journal::guard::Guard;
    use std::sync::atomic::Ordering;
    limited(async {
        let (_server, url) = fresh("guard").await;
        let admin = admin(&url).await;
        let store = open(&url).await;
        let today = isoswitch::store::now_millis().div_euclid(DAY_MS);
        // What the journal's empty partitions take: the floor max_size
        // stays above.
        let empty = store.journal_space().await.expect("space").used;
        for day in [today - 3, today - 2] {
            make_day(&admin, "journal", day).await;
            make_day(&admin, "admin_log", day).await;
            fill_day(&admin, day, 20_000).await;
        }
        // Today's rows alone take more than max_size.
        fill_day(&admin, today, 20_000).await;
        let max_size = empty + (1 << 20);
        let full = store.journal_space().await.expect("space").used;
        assert!(full > 3 * max_size, "{full} bytes against {max_size}");
        let (journal, rx) = isoswitch::journal::Journal::channel(64);
        let counters = Arc::clone(&journal.counters);
        let stop = tokio_util::sync::CancellationToken::new();
        let guard = Guard {
            store: store.clone(),
            path: None,
            probe: Arc::new(isoswitch::store::disk::Statvfs),
            cfg: JournalConfig {
                max_size: Some(SpaceLimit::Bytes(max_size)),
                ..JournalConfig::default()
            },
            counters: Arc::clone(&counters),
            every: Duration::from_millis(50),
            stop: stop.clone(),
        };
        let guarding = tokio::spawn(guard.run());
        let writer = isoswitch::journal::writer::WriterTask {
            rx: Arc::new(tokio::sync::Mutex::new(rx)),
            store: store.clone(),
            counters: Arc::clone(&counters),
            batch_interval: Duration::from_millis(10),
            stop: stop.clone(),
        };
        let writing = tokio::spawn(writer.run());
        while !counters.paused.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The old days went first, whole; today's and the days ahead stay.
        let days = partitions(&admin, "journal").await;
        assert_eq!(days.len(), 3, "{days:?}");
        assert!(counters.purged.load(Ordering::Relaxed) > 0);
        let space = store.journal_space().await.expect("space");
        assert!(
            space.oldest.is_some_and(|t| t >= today * DAY_MS),
            "{space:?}"
        );
        // Paused: a row offered is not written, counted as such.
        let (rows, paused_rows) = (counters.written.load(Ordering::Relaxed), 1);
        journal.admin(isoswitch::journal::AdminRow {
            at: isoswitch::store::now_millis(),
            peer: "127.0.0.1:5".into(),
            action: "drain".into(),
            method: "POST".into(),
            path: "/x".into(),
            status: 200,
            outcome: "ok".into(),
            ..Default::default()
        });
        while counters.paused_rows.load(Ordering::Relaxed) < paused_rows {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(counters.written.load(Ordering::Relaxed), rows);
        // SAF is not the journal: its entries are stored and delivered.
        let id = store.saf_put(entry("cups", 1, T0)).await.expect("saf put");
        let claimed = store.saf_claim("A", T0, 10, LEASE).await.expect("claim");
        assert_eq!(claimed.len(), 1);
        store
            .saf_delivered(id, "A", T0 + 1_000, "0230 rc=00")
            .await
            .expect("delivered");
        // The rows go: the journal resumes by itself.
        let today_part = days.first().expect("today's partition").clone();
        admin
            .batch_execute(&format!("TRUNCATE {today_part}"))
            .await
            .expect("today's rows go");
        while counters.paused.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
        guarding.await.expect("guard");
        writing.await.expect("writer");
        store.close().await.expect("close");
    })
    .await;
}
