//! The PostgreSQL backend's journal statements: a batch's inserts pipelined
//! on the prepared insert, queries, bounded purges and the report pass
//! (streamed, so a day's rows are never all in memory).

use futures_util::{StreamExt, future::join_all, pin_mut};
use tokio_postgres::Transaction;
use tokio_postgres::types::ToSql;

use super::Statements;
use crate::store::journal::insert::{INSERT_ARITY, chunks};
use crate::store::journal::{
    self as j, AdminRow, Dialect, JournalFilter, JournalRow, NewRow, Param, REPORT_SQL, ReportInput,
};
use crate::store::journal_report::ReportBuilder;
use crate::store::saf::UnixMillis;
use crate::store::writer::{Answer, Outcome};

type PgResult<T> = Result<T, tokio_postgres::Error>;

fn flag(b: bool) -> i16 {
    i16::from(b)
}

pub(super) async fn put(
    tx: &Transaction<'_>,
    st: &Statements,
    rows: &[NewRow],
    admin: &[AdminRow],
) -> PgResult<Answer> {
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
        let Some((_, statement)) = st.journal_inserts.iter().find(|(n, _)| *n == chunk.len())
        else {
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
    Ok(Ok(Outcome::Changed(n)))
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

pub(super) async fn query(tx: &Transaction<'_>, filter: &JournalFilter) -> PgResult<Answer> {
    let (sql, params) = j::select(filter, Dialect::Postgres);
    let boxed = bind(&params);
    let rows = tx.query(&sql, &refs(&boxed)).await?;
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
    Ok(Ok(Outcome::JournalRows(rows)))
}

pub(super) async fn admin_query(
    tx: &Transaction<'_>,
    since: Option<UnixMillis>,
    limit: usize,
) -> PgResult<Answer> {
    let (sql, params) = j::select_admin(since, limit);
    let boxed = bind(&params);
    let rows = tx.query(&sql, &refs(&boxed)).await?;
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
    Ok(Ok(Outcome::AdminRows(rows)))
}

/// The journal's tables and indexes on the server, as PostgreSQL counts
/// them (a deleted row's space is reused, not returned: `reusable` is not
/// known here and stays 0).
pub(super) async fn space(tx: &Transaction<'_>) -> PgResult<Answer> {
    let row = tx
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
    Ok(Ok(Outcome::Space(crate::store::disk::JournalSpace {
        used: u64::try_from(used).unwrap_or(0),
        reusable: 0,
        oldest: row.try_get(1)?,
    })))
}

pub(super) async fn report(
    tx: &Transaction<'_>,
    since: UnixMillis,
    until: UnixMillis,
) -> PgResult<Answer> {
    let params: [&(dyn ToSql + Sync); 2] = [&since, &until];
    let stream = tx.query_raw(REPORT_SQL, params).await?;
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
    Ok(Ok(Outcome::Report(Box::new(builder.finish()))))
}
