//! The SQLite backend's journal: batched inserts (bound in place,
//! `sqlite/insert.rs`), queries, bounded purges, the report pass and the
//! journal's share of the file.

use rusqlite::{Transaction, params, params_from_iter};

use super::Sqlite;
use crate::store::backend::{JournalOps, OpResult};
use crate::store::disk::JournalSpace;
use crate::store::journal::{
    self as j, ADMIN_INSERT, Dialect, JournalFilter, NewRow, PURGE_ADMIN, PURGE_JOURNAL,
    PURGE_PARTS, Param, REPORT_SQL, sqlite_placeholders,
};
use crate::store::journal_report::{Report, ReportBuilder};
use crate::store::rows::{AdminRow, JournalRow, ReportInput};
use crate::store::saf::UnixMillis;

impl JournalOps for Sqlite<'_> {
    async fn journal_put(&self, rows: &[NewRow], admin: &[AdminRow]) -> rusqlite::Result<u64> {
        let mut n = self.inserts.put(rows)?;
        if !admin.is_empty() {
            let mut st = self.tx.prepare_cached(&sqlite_placeholders(ADMIN_INSERT))?;
            for a in admin {
                st.execute(params![
                    a.at, a.peer, a.action, a.method, a.path, a.status, a.outcome
                ])?;
                n += 1;
            }
        }
        Ok(n)
    }

    async fn journal_query(&self, filter: &JournalFilter) -> rusqlite::Result<Vec<JournalRow>> {
        query(self.tx, filter)
    }

    async fn admin_query(
        &self,
        since: Option<UnixMillis>,
        limit: usize,
    ) -> rusqlite::Result<Vec<AdminRow>> {
        let (sql, params) = j::select_admin(since, limit);
        let mut st = self.tx.prepare_cached(&sqlite_placeholders(&sql))?;
        let rows = st
            .query_map(params_from_iter(bind(&params)), |r| {
                Ok(AdminRow {
                    id: r.get(0)?,
                    at: r.get(1)?,
                    peer: r.get(2)?,
                    action: r.get(3)?,
                    method: r.get(4)?,
                    path: r.get(5)?,
                    status: r.get(6)?,
                    outcome: r.get(7)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    async fn journal_purge(
        &self,
        before: UnixMillis,
        limit: usize,
    ) -> OpResult<u64, rusqlite::Error> {
        purge(self.tx, before, limit).map(Ok)
    }

    /// The admin audit's retention: at most `limit` rows older than `before`.
    async fn admin_purge(
        &self,
        before: UnixMillis,
        limit: usize,
    ) -> OpResult<u64, rusqlite::Error> {
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        let n = self
            .tx
            .prepare_cached(&sqlite_placeholders(PURGE_ADMIN))?
            .execute(params![before, limit])? as u64;
        Ok(Ok(n))
    }

    async fn journal_report(
        &self,
        since: UnixMillis,
        until: UnixMillis,
    ) -> rusqlite::Result<Report> {
        let mut st = self.tx.prepare_cached(&sqlite_placeholders(REPORT_SQL))?;
        let mut rows = st.query(params![since, until])?;
        let mut builder = ReportBuilder::new(since, until);
        while let Some(r) = rows.next()? {
            builder.add(ReportInput {
                service: r.get(0)?,
                node: r.get(1)?,
                outcome: r.get(2)?,
                reason: r.get(3)?,
                late: r.get(4)?,
                reversal_id: r.get(5)?,
                reversal_state: r.get(6)?,
                latency_us: r.get(7)?,
                t_in: r.get(8)?,
            });
        }
        Ok(builder.finish())
    }

    /// The journal's share of the file: the pages in use less those of
    /// every other b-tree (SAF, meta, the admin audit, which keeps its own
    /// retention: `dbstat` walks only the b-tree it is asked for, and those
    /// are small while SAF is healthy), and the file's free pages.
    async fn journal_space(&self) -> rusqlite::Result<JournalSpace> {
        let tx = self.tx;
        let pragma = |name: &str| -> rusqlite::Result<u64> {
            let n: i64 = tx.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let page = pragma("page_size")?;
        let in_use = pragma("page_count")?.saturating_sub(pragma("freelist_count")?);
        let others: Vec<String> = tx
            .prepare_cached(
                "SELECT name FROM sqlite_schema WHERE rootpage > 0 \
                 AND tbl_name NOT IN ('journal', 'journal_part')",
            )?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        // Page 1, the schema, is nobody's in particular.
        let mut other_bytes = page;
        let mut st = tx.prepare_cached(
            "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = ?1 AND aggregate = 1",
        )?;
        for name in &others {
            let n: i64 = st.query_row(params![name], |r| r.get(0))?;
            other_bytes += u64::try_from(n).unwrap_or(0);
        }
        let oldest: Option<i64> =
            tx.query_row("SELECT min(t_in) FROM journal", [], |r| r.get(0))?;
        Ok(JournalSpace {
            used: (in_use * page).saturating_sub(other_bytes),
            reusable: pragma("freelist_count")? * page,
            oldest,
        })
    }
}

fn bind(params: &[Param]) -> Vec<rusqlite::types::Value> {
    params
        .iter()
        .map(|p| match p {
            Param::Int(i) => rusqlite::types::Value::Integer(*i),
            Param::Text(t) => rusqlite::types::Value::Text(t.clone()),
        })
        .collect()
}

fn query(tx: &Transaction<'_>, filter: &JournalFilter) -> rusqlite::Result<Vec<JournalRow>> {
    let (sql, params) = j::select(filter, Dialect::Sqlite);
    let mut st = tx.prepare_cached(&sqlite_placeholders(&sql))?;
    let rows = st
        .query_map(params_from_iter(bind(&params)), |r| {
            Ok(JournalRow {
                id: r.get(0)?,
                t_in: r.get(1)?,
                t_out: r.get(2)?,
                service: r.get(3)?,
                front: r.get(4)?,
                link: r.get(5)?,
                node: r.get(6)?,
                origin: r.get(7)?,
                mti: r.get(8)?,
                mti_out: r.get(9)?,
                f11: r.get(10)?,
                f7: r.get(11)?,
                f37_in: r.get(12)?,
                f37_out: r.get(13)?,
                f41: r.get(14)?,
                f42: r.get(15)?,
                f32: r.get(16)?,
                f33: r.get(17)?,
                pan: r.get(18)?,
                f4: r.get(19)?,
                f49: r.get(20)?,
                f39: r.get(21)?,
                answered_by: r.get(22)?,
                reason: r.get(23)?,
                outcome: r.get(24)?,
                latency_us: r.get(25)?,
                late: r.get(26)?,
                duplicate: r.get(27)?,
                repeat: r.get(28)?,
                unroutable: r.get(29)?,
                bad: r.get(30)?,
                reversal_id: r.get(31)?,
                reversal_state: r.get(32)?,
                reversal_answer: r.get(33)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// At most `limit` journal rows older than `before`, and the parts they
/// leave empty.
fn purge(tx: &Transaction<'_>, before: UnixMillis, limit: usize) -> rusqlite::Result<u64> {
    let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
    let n = tx
        .prepare_cached(&sqlite_placeholders(PURGE_JOURNAL))?
        .execute(params![before, limit])? as u64;
    // Not counted: a part's record, not a row of the journal.
    tx.prepare_cached(&sqlite_placeholders(PURGE_PARTS))?
        .execute(params![before])?;
    Ok(n)
}

#[cfg(test)]
mod parts {
    use rusqlite::{Connection, TransactionBehavior};

    use super::super::RowInserts;
    use super::super::migrations::{MIGRATIONS, migrate};
    use crate::store::journal::{
        self as j, Dialect, JournalFilter, JournalRow, NewRow, sqlite_placeholders,
    };

    const BASE: i64 = 1_700_000_000_000;

    /// Row `i`: its own RRN, stamped on the way out for even `i`; one of
    /// 100 terminals; STAN = `i`.
    fn row(i: i64) -> JournalRow {
        let rrn = format!("{i:012}");
        JournalRow {
            t_in: BASE + i,
            t_out: BASE + i + 3,
            service: "pos".into(),
            front: "listen".into(),
            link: "client#1".into(),
            origin: "front".into(),
            mti: "0200".into(),
            f11: Some(format!("{:06}", i % 1_000_000)),
            f37_out: Some(if i % 2 == 0 {
                format!("S{}", &rrn[1..])
            } else {
                rrn.clone()
            }),
            f37_in: Some(rrn),
            f41: Some(format!("T{:07}", i % 100)),
            answered_by: "node".into(),
            outcome: "answered".into(),
            ..JournalRow::default()
        }
    }

    /// 12,500 rows in batches of 500: five parts.
    fn filled() -> Connection {
        let mut conn = Connection::open_in_memory().expect("open");
        assert!(migrate(&mut conn).is_ok(), "migrate");
        let inserts = RowInserts::new(&conn);
        for b in 0..25 {
            let rows: Vec<NewRow> = (b * 500..(b + 1) * 500)
                .map(|i| NewRow::from(&row(i)))
                .collect();
            inserts.put(&rows).expect("put");
        }
        drop(inserts);
        conn
    }

    fn query(conn: &mut Connection, filter: &JournalFilter) -> Vec<i64> {
        let tx = conn.transaction().expect("tx");
        let rows = super::query(&tx, filter).expect("query");
        rows.iter().map(|r| r.t_in - BASE).collect()
    }

    fn plan(conn: &Connection, filter: &JournalFilter) -> String {
        let (sql, params) = j::select(filter, Dialect::Sqlite);
        let mut st = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", sqlite_placeholders(&sql)))
            .expect("prepare");
        let rows = st
            .query_map(rusqlite::params_from_iter(super::bind(&params)), |r| {
                r.get::<_, String>(3)
            })
            .expect("plan")
            .collect::<Result<Vec<_>, _>>()
            .expect("plan rows");
        rows.join("; ")
    }

    fn filter() -> JournalFilter {
        JournalFilter {
            limit: 100_000,
            ..JournalFilter::default()
        }
    }

    #[test]
    fn queries_by_key_find_every_row_in_every_part_through_the_indexes() {
        let mut conn = filled();
        let parts: i64 = conn
            .query_row("SELECT count(*) FROM journal_part", [], |r| r.get(0))
            .expect("parts");
        assert_eq!(parts, 5);
        let all: Vec<JournalRow> = (0..12_500).map(row).collect();
        let expect = |keep: &dyn Fn(&JournalRow) -> bool| -> Vec<i64> {
            all.iter()
                .filter(|r| keep(r))
                .map(|r| r.t_in - BASE)
                .collect()
        };
        for (name, f, want) in [
            (
                "rrn as received",
                JournalFilter {
                    rrn: Some("000000007777".into()),
                    ..filter()
                },
                vec![7_777],
            ),
            (
                "rrn as stamped",
                JournalFilter {
                    rrn: Some("S00000008888".into()),
                    ..filter()
                },
                vec![8_888],
            ),
            (
                "terminal",
                JournalFilter {
                    terminal: Some("T0000042".into()),
                    ..filter()
                },
                expect(&|r| r.f41.as_deref() == Some("T0000042")),
            ),
            (
                "terminal and STAN",
                JournalFilter {
                    terminal: Some("T0000042".into()),
                    stan: Some("010042".into()),
                    ..filter()
                },
                vec![10_042],
            ),
            (
                "terminal within a time range across a part boundary",
                JournalFilter {
                    terminal: Some("T0000007".into()),
                    since: Some(BASE + 2_000),
                    until: Some(BASE + 6_000),
                    ..filter()
                },
                expect(&|r| {
                    r.f41.as_deref() == Some("T0000007")
                        && (BASE + 2_000..BASE + 6_000).contains(&r.t_in)
                }),
            ),
        ] {
            assert!(!want.is_empty());
            assert_eq!(query(&mut conn, &f), want, "{name}");
            let plan = plan(&conn, &f);
            assert!(plan.contains("SCAN p"), "{name}: {plan}");
            assert!(!plan.contains("SCAN j"), "{name} scans the journal: {plan}");
            let indexes: &[&str] = if f.rrn.is_some() {
                &[
                    "journal_f37 (part=? AND f37_in=?)",
                    "journal_f37_out (part=? AND f37_out=?)",
                ]
            } else {
                &["journal_f41 (part=? AND f41=?"]
            };
            for index in indexes {
                assert!(plan.contains(index), "{name}: {plan}");
            }
        }
    }

    /// A database at schema 4 (no parts) gets its rows parted by id, and
    /// queries by key find them.
    #[test]
    fn a_version_4_journal_is_parted_on_open() {
        let mut conn = Connection::open_in_memory().expect("open");
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("tx");
        tx.execute_batch("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);")
            .expect("meta");
        for sql in &MIGRATIONS[..4] {
            tx.execute_batch(sql).expect("migration");
        }
        tx.execute("INSERT INTO meta VALUES ('schema_version', '4')", [])
            .expect("version");
        for i in 0..5_000i64 {
            tx.execute(
                "INSERT INTO journal (t_in, t_out, service, front, link, origin, mti, \
                 f37_in, f41, f11, answered_by, outcome, late, duplicate, repeat, unroutable) \
                 VALUES (?1, ?1, 'pos', 'listen', 'client#1', 'front', '0200', ?2, 'T1', ?3, \
                 'node', 'answered', 0, 0, 0, 0)",
                rusqlite::params![BASE + i, format!("{i:012}"), format!("{i:06}")],
            )
            .expect("old row");
        }
        tx.commit().expect("commit");
        assert!(migrate(&mut conn).is_ok(), "migrate 4 -> 5");
        let parts: Vec<(i64, i64)> = conn
            .prepare("SELECT part, rows FROM journal_part ORDER BY part")
            .expect("prepare")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("parts")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(parts, [(0, 2_047), (1, 2_048), (2, 905)]);
        let f = JournalFilter {
            rrn: Some("000000004321".into()),
            ..filter()
        };
        assert_eq!(query(&mut conn, &f), [4_321]);
        let f = JournalFilter {
            terminal: Some("T1".into()),
            stan: Some("000007".into()),
            ..filter()
        };
        assert_eq!(query(&mut conn, &f), [7]);
        // New rows go on after the migrated ones.
        let inserts = RowInserts::new(&conn);
        inserts.put(&[NewRow::from(&row(9_999))]).expect("put");
        drop(inserts);
        let newest: (i64, i64) = conn
            .query_row(
                "SELECT part, rows FROM journal_part ORDER BY part DESC LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("newest");
        assert_eq!(newest, (2, 906));
    }

    /// Retention forgets a part once its rows are gone, not before.
    #[test]
    fn purging_old_rows_forgets_their_parts() {
        let mut conn = filled();
        let parts = |conn: &Connection| -> Vec<i64> {
            conn.prepare("SELECT part FROM journal_part ORDER BY part")
                .expect("prepare")
                .query_map([], |r| r.get(0))
                .expect("parts")
                .collect::<Result<_, _>>()
                .expect("rows")
        };
        // Part 0 holds t_in 0..2,500 and part 1 2,500..5,000: a cutoff at
        // 3,000 empties part 0 only, and only once its rows are gone.
        let tx = conn.transaction().expect("tx");
        let purged = super::purge(&tx, BASE + 3_000, 1_000).expect("purge");
        assert_eq!(purged, 1_000);
        tx.commit().expect("commit");
        assert_eq!(parts(&conn), [0, 1, 2, 3, 4], "part 0 still has rows");
        let tx = conn.transaction().expect("tx");
        let purged = super::purge(&tx, BASE + 3_000, 10_000).expect("purge");
        assert_eq!(purged, 2_000);
        tx.commit().expect("commit");
        assert_eq!(parts(&conn), [1, 2, 3, 4]);
        let f = JournalFilter {
            terminal: Some("T0000001".into()),
            ..filter()
        };
        let got = query(&mut conn, &f);
        assert_eq!(got.first(), Some(&3_001));
        assert_eq!(got.len(), 95);
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Instant;

    use crate::store::journal::{JournalRow, NewRow};
    use crate::store::{Store, StoreConfig, now_millis};

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("isoswitch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn row(t_in: i64, f11: &str, f37: Option<&str>) -> JournalRow {
        JournalRow {
            t_in,
            t_out: t_in + 3,
            service: "pos".into(),
            front: "listen".into(),
            link: "client#1".into(),
            node: Some("01".into()),
            origin: "front".into(),
            mti: "0200".into(),
            f11: Some(f11.into()),
            f37_in: f37.map(str::to_string),
            f41: Some("TERM0001".into()),
            pan: Some("622202*********0123".into()),
            answered_by: "node".into(),
            outcome: "answered".into(),
            latency_us: Some(3_000),
            ..JournalRow::default()
        }
    }

    /// A journal batch with a refused row, past a first 64-row statement
    /// that succeeded, lands none of its rows: the insert stops at the row
    /// (`OR FAIL`) and the writer rolls the transaction back. A batch sent
    /// beside it lands whole.
    #[tokio::test]
    async fn a_batch_with_a_refused_row_lands_none_of_its_rows() {
        let d = dir("journal-refused");
        let store = Store::open(&StoreConfig::default(), &d)
            .await
            .expect("open");
        let base = now_millis();
        let batch = |from: i64, bad: Option<i64>| -> Vec<NewRow> {
            (from..from + 70)
                .map(|i| {
                    let mut r = row(base + i, &format!("{i:06}"), None);
                    if Some(i) == bad {
                        r.answered_by = "bogus".into();
                    }
                    NewRow::from(&r)
                })
                .collect()
        };
        let (refused, landed) = tokio::join!(
            store.journal_put(batch(0, Some(66)), Vec::new()),
            store.journal_put(batch(100, None), Vec::new()),
        );
        assert!(refused.is_err(), "{refused:?}");
        assert_eq!(landed.expect("the good batch"), 70);
        let rows = store
            .journal_query(crate::store::journal::JournalFilter {
                limit: 1_000,
                ..Default::default()
            })
            .await
            .expect("query");
        let mut stans: Vec<String> = rows.into_iter().filter_map(|r| r.f11).collect();
        stans.sort();
        let want: Vec<String> = (100..170).map(|i| format!("{i:06}")).collect();
        assert_eq!(stans, want);
        store.close().await.expect("close");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The write lock one retention batch holds, on a table of a million
    /// rows: `cargo test --lib retention_batch_lock -- --ignored
    /// --nocapture` (numbers in docs/journal.md).
    #[tokio::test]
    #[ignore = "a measurement: run by hand"]
    async fn retention_batch_lock() {
        let d = dir("journal-purge");
        let store = Store::open(&StoreConfig::default(), &d)
            .await
            .expect("open");
        let base = now_millis() - 10_000_000;
        let total = 1_000_000;
        let started = Instant::now();
        for chunk in 0..(total / 5_000) {
            let rows = (0..5_000)
                .map(|i| {
                    NewRow::from(&row(
                        base + i64::from(chunk * 5_000 + i) * 10,
                        "000001",
                        Some("123456789012"),
                    ))
                })
                .collect();
            store.journal_put(rows, Vec::new()).await.expect("put");
        }
        eprintln!("inserted {total} rows in {:?}", started.elapsed());
        let cutoff = base + i64::from(total) * 5; // half the table is old
        for batch in [250, 500, 1000, 2000] {
            let mut times = Vec::new();
            for _ in 0..15 {
                let t = Instant::now();
                let n = store.journal_purge(cutoff, batch).await.expect("purge");
                times.push(t.elapsed());
                assert_eq!(n, batch as u64);
            }
            times.sort();
            eprintln!(
                "purge of {batch} rows: min {:?} median {:?} max {:?}",
                times[0],
                times[times.len() / 2],
                times[times.len() - 1]
            );
        }
        store.close().await.expect("close");
        let _ = std::fs::remove_dir_all(&d);
    }
}
