//! The SQLite backend's journal statements: batched inserts (bound in
//! place, `sqlite_insert.rs`), queries, bounded purges and the report pass.

use rusqlite::{Transaction, params, params_from_iter};

use super::RowInserts;
use crate::store::journal::{
    self as j, ADMIN_INSERT, AdminRow, Dialect, JournalFilter, JournalRow, NewRow, PURGE_ADMIN,
    PURGE_JOURNAL, Param, REPORT_SQL, ReportInput, sqlite_placeholders,
};
use crate::store::journal_new::chunks;
use crate::store::journal_report::ReportBuilder;
use crate::store::saf::UnixMillis;
use crate::store::writer::{Answer, Outcome};

pub(super) fn put(
    tx: &Transaction<'_>,
    inserts: &RowInserts<'_>,
    rows: &[NewRow],
    admin: &[AdminRow],
) -> rusqlite::Result<Answer> {
    let mut n = 0u64;
    for chunk in chunks(rows) {
        n += inserts.insert(chunk)?;
    }
    if !admin.is_empty() {
        let mut st = tx.prepare_cached(&sqlite_placeholders(ADMIN_INSERT))?;
        for a in admin {
            st.execute(params![
                a.at, a.peer, a.action, a.method, a.path, a.status, a.outcome
            ])?;
            n += 1;
        }
    }
    Ok(Ok(Outcome::Changed(n)))
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

pub(super) fn query(tx: &Transaction<'_>, filter: &JournalFilter) -> rusqlite::Result<Answer> {
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
    Ok(Ok(Outcome::JournalRows(rows)))
}

pub(super) fn admin_query(
    tx: &Transaction<'_>,
    since: Option<UnixMillis>,
    limit: usize,
) -> rusqlite::Result<Answer> {
    let (sql, params) = j::select_admin(since, limit);
    let mut st = tx.prepare_cached(&sqlite_placeholders(&sql))?;
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
    Ok(Ok(Outcome::AdminRows(rows)))
}

pub(super) fn purge(
    tx: &Transaction<'_>,
    before: UnixMillis,
    limit: usize,
) -> rusqlite::Result<Answer> {
    let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
    let mut n = 0u64;
    for sql in [PURGE_JOURNAL, PURGE_ADMIN] {
        n += tx
            .prepare_cached(&sqlite_placeholders(sql))?
            .execute(params![before, limit])? as u64;
    }
    Ok(Ok(Outcome::Changed(n)))
}

pub(super) fn report(
    tx: &Transaction<'_>,
    since: UnixMillis,
    until: UnixMillis,
) -> rusqlite::Result<Answer> {
    let mut st = tx.prepare_cached(&sqlite_placeholders(REPORT_SQL))?;
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
    Ok(Ok(Outcome::Report(Box::new(builder.finish()))))
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
