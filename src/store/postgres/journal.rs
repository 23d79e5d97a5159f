//! The PostgreSQL backend's journal: a batch's inserts pipelined on the
//! prepared multi-row inserts, queries, the report pass (streamed, so a
//! day's rows are never all in memory) and the journal's size. Retention
//! drops whole days on the maintenance's connection (`maintain.rs`), never
//! in the writer's transactions.

use futures_util::{StreamExt, future::join_all, pin_mut};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use super::Postgres;
use crate::store::backend::{JournalOps, OpResult};
use crate::store::disk::JournalSpace;
use crate::store::error::StoreError;
use crate::store::journal::insert::{INSERT_ARITY, INSERT_CHUNKS, chunks, insert_rows};
use crate::store::journal::{
    self as j, ADMIN_INSERT, Dialect, JournalFilter, NewRow, Param, REPORT_SQL,
};
use crate::store::journal_report::{Report, ReportBuilder};
use crate::store::rows::{AdminRow, JournalRow, ReportInput};
use crate::store::saf::UnixMillis;

type PgResult<T> = Result<T, tokio_postgres::Error>;

/// The journal's statements, prepared once per connection.
pub(super) struct Statements {
    /// The multi-row inserts, one per size of `INSERT_CHUNKS`, in its order.
    inserts: Vec<(usize, Statement)>,
    admin_insert: Statement,
}

impl Statements {
    pub(super) async fn prepare(c: &Client) -> PgResult<Self> {
        let mut inserts = Vec::new();
        for size in INSERT_CHUNKS {
            inserts.push((size, c.prepare(&insert_rows(size, '$')).await?));
        }
        Ok(Statements {
            inserts,
            admin_insert: c.prepare(ADMIN_INSERT).await?,
        })
    }
}

impl JournalOps for Postgres<'_> {
    async fn journal_put(&self, rows: &[NewRow], admin: &[AdminRow]) -> PgResult<u64> {
        put(self, rows, admin).await
    }

    async fn journal_query(&self, filter: &JournalFilter) -> PgResult<Vec<JournalRow>> {
        query(self, filter).await
    }

    async fn admin_query(
        &self,
        since: Option<UnixMillis>,
        limit: usize,
    ) -> PgResult<Vec<AdminRow>> {
        admin_query(self, since, limit).await
    }

    // The writer routes retention to the maintenance (it drops whole days):
    // one in a batch is a bug.
    async fn journal_purge(&self, _: UnixMillis, _: usize) -> OpResult<u64, tokio_postgres::Error> {
        Ok(Err(purge_in_batch()))
    }

    async fn admin_purge(&self, _: UnixMillis, _: usize) -> OpResult<u64, tokio_postgres::Error> {
        Ok(Err(purge_in_batch()))
    }

    async fn journal_report(&self, since: UnixMillis, until: UnixMillis) -> PgResult<Report> {
        report(self, since, until).await
    }

    async fn journal_space(&self) -> PgResult<JournalSpace> {
        space(self).await
    }
}

fn purge_in_batch() -> StoreError {
    StoreError::WrongAnswer {
        op: "journal_purge",
        got: "a purge in a batch".into(),
    }
}

fn flag(b: bool) -> i16 {
    i16::from(b)
}

async fn put(pg: &Postgres<'_>, rows: &[NewRow], admin: &[AdminRow]) -> PgResult<u64> {
    let (tx, st) = (pg.tx, &pg.st.journal);
    // The service and the flags as the columns take them, held for the
    // borrows.
    let held: Vec<(&str, [i16; 4])> = rows
        .iter()
        .map(|r| {
            let flags = [r.late, r.duplicate, r.repeat, r.unroutable].map(flag);
            (r.service(), flags)
        })
        .collect();
    let mut inserts = Vec::new();
    let mut at = 0;
    for chunk in chunks(rows) {
        let Some((_, statement)) = st.inserts.iter().find(|(n, _)| *n == chunk.len()) else {
            continue;
        };
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(chunk.len() * INSERT_ARITY);
        for (r, h) in chunk.iter().zip(&held[at..]) {
            push_row(&mut params, r, h);
        }
        at += chunk.len();
        inserts.push(async move { tx.execute(statement, &params).await });
    }
    let admins = admin.iter().map(|a| async move {
        let params: [&(dyn ToSql + Sync); 7] = [
            &a.at, &a.peer, &a.action, &a.method, &a.path, &a.status, &a.outcome,
        ];
        tx.execute(&st.admin_insert, &params).await
    });
    let mut n = 0;
    for done in join_all(inserts).await {
        n += done?;
    }
    for done in join_all(admins).await {
        n += done?;
    }
    Ok(n)
}

/// `r`'s values in [`crate::store::journal::insert::INSERT_COLUMNS`]' order.
fn push_row<'a>(
    params: &mut Vec<&'a (dyn ToSql + Sync)>,
    r: &'a NewRow,
    (service, flags): &'a (&'a str, [i16; 4]),
) {
    params.push(&r.t_in);
    params.push(&r.t_out);
    params.push(service);
    let texts: [&'a (dyn ToSql + Sync); 19] = [
        &r.front,
        &r.link,
        &r.node,
        &r.origin,
        &r.mti,
        &r.mti_out,
        &r.f11,
        &r.f7,
        &r.f37_in,
        &r.f37_out,
        &r.f41,
        &r.f42,
        &r.f32,
        &r.f33,
        &r.pan,
        &r.f4,
        &r.f49,
        &r.f39,
        &r.answered_by,
    ];
    params.extend(texts);
    params.push(&r.reason);
    params.push(&r.outcome);
    params.push(&r.latency_us);
    for f in flags {
        params.push(f);
    }
    params.push(&r.bad);
    params.push(&r.reversal_id);
}

fn bind(params: &[Param]) -> Vec<Box<dyn ToSql + Sync + Send>> {
    params
        .iter()
        .map(|p| -> Box<dyn ToSql + Sync + Send> {
            match p {
                Param::Int(i) => Box::new(*i),
                Param::Text(t) => Box::new(t.clone()),
            }
        })
        .collect()
}

fn refs(boxed: &[Box<dyn ToSql + Sync + Send>]) -> Vec<&(dyn ToSql + Sync)> {
    boxed
        .iter()
        .map(|b| b.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

async fn query(pg: &Postgres<'_>, filter: &JournalFilter) -> PgResult<Vec<JournalRow>> {
    let (sql, params) = j::select(filter, Dialect::Postgres);
    let boxed = bind(&params);
    let rows = pg.tx.query(&sql, &refs(&boxed)).await?;
    let rows = rows
        .iter()
        .map(|r| {
            Ok(JournalRow {
                id: r.try_get(0)?,
                t_in: r.try_get(1)?,
                t_out: r.try_get(2)?,
                service: r.try_get(3)?,
                front: r.try_get(4)?,
                link: r.try_get(5)?,
                node: r.try_get(6)?,
                origin: r.try_get(7)?,
                mti: r.try_get(8)?,
                mti_out: r.try_get(9)?,
                f11: r.try_get(10)?,
                f7: r.try_get(11)?,
                f37_in: r.try_get(12)?,
                f37_out: r.try_get(13)?,
                f41: r.try_get(14)?,
                f42: r.try_get(15)?,
                f32: r.try_get(16)?,
                f33: r.try_get(17)?,
                pan: r.try_get(18)?,
                f4: r.try_get(19)?,
                f49: r.try_get(20)?,
                f39: r.try_get(21)?,
                answered_by: r.try_get(22)?,
                reason: r.try_get(23)?,
                outcome: r.try_get(24)?,
                latency_us: r.try_get(25)?,
                late: r.try_get::<_, i16>(26)? != 0,
                duplicate: r.try_get::<_, i16>(27)? != 0,
                repeat: r.try_get::<_, i16>(28)? != 0,
                unroutable: r.try_get::<_, i16>(29)? != 0,
                bad: r.try_get(30)?,
                reversal_id: r.try_get(31)?,
                reversal_state: r.try_get(32)?,
                reversal_answer: r.try_get(33)?,
            })
        })
        .collect::<PgResult<Vec<_>>>()?;
    Ok(rows)
}

async fn admin_query(
    pg: &Postgres<'_>,
    since: Option<UnixMillis>,
    limit: usize,
) -> PgResult<Vec<AdminRow>> {
    let (sql, params) = j::select_admin(since, limit);
    let boxed = bind(&params);
    let rows = pg.tx.query(&sql, &refs(&boxed)).await?;
    let rows = rows
        .iter()
        .map(|r| {
            Ok(AdminRow {
                id: r.try_get(0)?,
                at: r.try_get(1)?,
                peer: r.try_get(2)?,
                action: r.try_get(3)?,
                method: r.try_get(4)?,
                path: r.try_get(5)?,
                status: r.try_get(6)?,
                outcome: r.try_get(7)?,
            })
        })
        .collect::<PgResult<Vec<_>>>()?;
    Ok(rows)
}

/// The journal's tables and indexes on the server, as PostgreSQL counts
/// them (a deleted row's space is reused, not returned: `reusable` is not
/// known here and stays 0).
async fn space(pg: &Postgres<'_>) -> PgResult<JournalSpace> {
    let row = pg
        .tx
        .query_one(
            "SELECT ((SELECT COALESCE(sum(pg_total_relation_size(relid)), 0) \
               FROM pg_partition_tree('journal')) \
             + (SELECT COALESCE(sum(pg_total_relation_size(relid)), 0) \
               FROM pg_partition_tree('admin_log')))::BIGINT, \
             (SELECT min(t_in) FROM journal)",
            &[],
        )
        .await?;
    let used: i64 = row.try_get(0)?;
    Ok(JournalSpace {
        used: u64::try_from(used).unwrap_or(0),
        reusable: 0,
        oldest: row.try_get(1)?,
    })
}

async fn report(pg: &Postgres<'_>, since: UnixMillis, until: UnixMillis) -> PgResult<Report> {
    let params: [&(dyn ToSql + Sync); 2] = [&since, &until];
    let stream = pg.tx.query_raw(REPORT_SQL, params).await?;
    pin_mut!(stream);
    let mut builder = ReportBuilder::new(since, until);
    while let Some(r) = stream.next().await {
        let r = r?;
        builder.add(ReportInput {
            service: r.try_get(0)?,
            node: r.try_get(1)?,
            outcome: r.try_get(2)?,
            reason: r.try_get(3)?,
            late: r.try_get::<_, i16>(4)? != 0,
            reversal_id: r.try_get(5)?,
            reversal_state: r.try_get(6)?,
            latency_us: r.try_get(7)?,
            t_in: r.try_get(8)?,
        });
    }
    Ok(builder.finish())
}
