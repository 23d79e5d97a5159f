//! The PostgreSQL backend's SQL: migrations, the statements it prepares
//! once per connection, and how each op runs inside a batch's transaction.

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement, Transaction};

use crate::store::saf::{SafId, clip};
use crate::store::schema::{self, CLAIM_COLUMNS, Change, IN_ORDER, ROW_COLUMNS, RawClaim, RawRow};
use crate::store::writer::{Answer, Op, Outcome};

#[path = "journal.rs"]
mod journal;

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
    super::parts::MIGRATION_6,
    // 7: the original transaction an entry is about (SQLite's migration 7).
    "ALTER TABLE saf ADD COLUMN original TEXT;
    CREATE INDEX saf_original ON saf (service, original, id) WHERE state = 'pending';",
];

pub(super) const META_PUT: &str = "INSERT INTO meta (key, value) VALUES ($1, $2) \
     ON CONFLICT (key) DO UPDATE SET value = excluded.value";

/// Every statement, prepared once per connection.
pub(super) struct Statements {
    put: Statement,
    claim: Statement,
    attempted: Statement,
    delivered: Statement,
    dead: Statement,
    retry_now: Statement,
    drop: Statement,
    cancel: Statement,
    pin: Statement,
    release_leases: Statement,
    prune: Statement,
    state_of: Statement,
    list: Statement,
    stats: Statement,
    owed: Statement,
    meta_get: Statement,
    meta_put: Statement,
    /// The multi-row inserts, one per size of `INSERT_CHUNKS`, in its order.
    pub(super) journal_inserts: Vec<(usize, Statement)>,
    pub(super) admin_insert: Statement,
}

impl Statements {
    pub(super) async fn prepare(c: &Client) -> Result<Self, tokio_postgres::Error> {
        Ok(Statements {
            put: c
                .prepare(
                    "INSERT INTO saf (service, direction, node_id, kind, mti, payload, f11, f37, f7, \
                     pan_masked, created_at, expires_at, next_attempt_at, state, original) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, 'pending', $14) \
                     RETURNING id",
                )
                .await?,
            // SKIP LOCKED: rows another instance is claiming right now are
            // passed over, not waited for; the lease then keeps them out of
            // every claim until it runs out.
            claim: c
                .prepare(&format!(
                    "UPDATE saf SET lease_owner = $1, lease_until = $2, attempts = attempts + 1 \
                     WHERE id IN (SELECT id FROM saf AS s WHERE state = 'pending' \
                       AND next_attempt_at <= $3 AND (lease_until IS NULL OR lease_until <= $3) \
                       AND {IN_ORDER} \
                       ORDER BY next_attempt_at, id LIMIT $4 FOR UPDATE SKIP LOCKED) \
                     RETURNING {CLAIM_COLUMNS}"
                ))
                .await?,
            attempted: c
                .prepare(
                    "UPDATE saf SET next_attempt_at = $2, last_error = $3, lease_owner = NULL, \
                     lease_until = NULL WHERE id = $1 AND state = 'pending' AND lease_owner = $4",
                )
                .await?,
            delivered: c
                .prepare(
                    "UPDATE saf SET state = 'delivered', completed_at = $2, answer = $3, \
                     completed_by = $4, reason = $5, payload = NULL, lease_owner = NULL, \
                     lease_until = NULL WHERE id = $1 AND state = 'pending'",
                )
                .await?,
            dead: c
                .prepare(
                    "UPDATE saf SET state = 'dead', completed_at = $2, reason = $3, \
                     lease_owner = NULL, lease_until = NULL WHERE id = $1 AND state = 'pending'",
                )
                .await?,
            retry_now: c
                .prepare(
                    "UPDATE saf SET next_attempt_at = $2, \
                     expires_at = CASE WHEN state = 'dead' THEN $2 + (expires_at - created_at) \
                       ELSE expires_at END, \
                     state = 'pending', completed_at = NULL, reason = NULL \
                     WHERE id = $1 AND state IN ('pending', 'dead')",
                )
                .await?,
            drop: c
                .prepare(
                    "UPDATE saf SET state = 'dropped', completed_at = $2, reason = $3, \
                     payload = NULL, lease_owner = NULL, lease_until = NULL \
                     WHERE id = $1 AND state IN ('pending', 'dead')",
                )
                .await?,
            cancel: c
                .prepare(
                    "UPDATE saf SET state = 'dropped', completed_at = $2, reason = $3, \
                     payload = NULL, lease_owner = NULL, lease_until = NULL \
                     WHERE id = $1 AND state = 'pending' AND (lease_until IS NULL OR lease_until <= $2)",
                )
                .await?,
            pin: c
                .prepare(
                    "UPDATE saf SET direction = 'to_node', node_id = $3 \
                     WHERE id = $1 AND state = 'pending' AND lease_owner = $2 \
                     AND direction = 'to_any_node'",
                )
                .await?,
            release_leases: c
                .prepare(
                    "UPDATE saf SET lease_owner = NULL, lease_until = NULL \
                     WHERE state = 'pending' AND lease_owner = $1",
                )
                .await?,
            // SKIP LOCKED: two instances pruning together take different
            // rows instead of waiting for each other.
            prune: c
                .prepare(
                    "DELETE FROM saf WHERE id IN (SELECT id FROM saf \
                     WHERE state IN ('delivered', 'dropped') AND completed_at < $1 \
                     ORDER BY completed_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
                )
                .await?,
            state_of: c
                .prepare("SELECT state, lease_owner FROM saf WHERE id = $1")
                .await?,
            list: c
                .prepare(&format!(
                    "SELECT {ROW_COLUMNS} FROM saf WHERE ($1::text IS NULL OR state = $1) \
                     AND ($2::text IS NULL OR service = $2) ORDER BY id DESC LIMIT $3"
                ))
                .await?,
            stats: c
                .prepare(
                    "SELECT state, COUNT(*), \
                     SUM(CASE WHEN lease_until > $1 THEN 1 ELSE 0 END), \
                     MIN(created_at), SUM(CASE WHEN attempts > 1 THEN attempts - 1 ELSE 0 END) \
                     FROM saf GROUP BY state",
                )
                .await?,
            owed: c.prepare(schema::OWED_SQL).await?,
            meta_get: c
                .prepare("SELECT value FROM meta WHERE key = $1")
                .await?,
            meta_put: c.prepare(META_PUT).await?,
            journal_inserts: {
                let mut inserts = Vec::new();
                for size in crate::store::journal::insert::INSERT_CHUNKS {
                    let sql = crate::store::journal::insert::insert_rows(size, '$');
                    inserts.push((size, c.prepare(&sql).await?));
                }
                inserts
            },
            admin_insert: c
                .prepare(crate::store::journal::ADMIN_INSERT)
                .await?,
        })
    }
}

/// Runs one op inside the batch's transaction. The outer error aborts the
/// transaction; the inner one is the op's own answer.
pub(super) async fn apply(
    tx: &Transaction<'_>,
    st: &Statements,
    op: &Op,
) -> Result<Answer, tokio_postgres::Error> {
    Ok(match op {
        Op::SafPut(e) => {
            let (direction, node) = e.direction.to_columns();
            let row = tx
                .query_one(
                    &st.put,
                    &[
                        &e.service,
                        &direction,
                        &node,
                        &e.kind.as_str(),
                        &e.mti,
                        &e.payload,
                        &e.keys.f11,
                        &e.keys.f37,
                        &e.keys.f7,
                        &e.keys.pan_masked,
                        &e.created_at,
                        &e.expires_at,
                        &e.first_attempt_at,
                        &e.keys.original,
                    ],
                )
                .await?;
            Ok(Outcome::Id(SafId(row.try_get(0)?)))
        }
        Op::SafClaim {
            owner,
            now,
            max,
            lease_until,
        } => {
            let max = i64::try_from(*max).unwrap_or(i64::MAX);
            let rows = tx
                .query(&st.claim, &[owner, lease_until, now, &max])
                .await?;
            let raw = rows
                .iter()
                .map(|r| {
                    Ok(RawClaim {
                        id: r.try_get(0)?,
                        service: r.try_get(1)?,
                        direction: r.try_get(2)?,
                        node_id: r.try_get(3)?,
                        kind: r.try_get(4)?,
                        mti: r.try_get(5)?,
                        payload: r.try_get(6)?,
                        attempts: i64::from(r.try_get::<_, i32>(7)?),
                        created_at: r.try_get(8)?,
                        expires_at: r.try_get(9)?,
                    })
                })
                .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
            schema::claims_in_order(raw, *lease_until).map(Outcome::Claimed)
        }
        Op::SafAttempted {
            id,
            owner,
            next_attempt_at,
            error,
        } => {
            let params: [&(dyn ToSql + Sync); 4] = [&id.0, next_attempt_at, &clip(error), owner];
            change(
                tx,
                st,
                Change::Attempted,
                *id,
                owner,
                &st.attempted,
                &params,
            )
            .await?
        }
        Op::SafDelivered {
            id,
            owner,
            now,
            answer,
            reason,
        } => {
            let reason = reason.as_deref().map(clip);
            let params: [&(dyn ToSql + Sync); 5] = [&id.0, now, &clip(answer), owner, &reason];
            change(
                tx,
                st,
                Change::Delivered,
                *id,
                owner,
                &st.delivered,
                &params,
            )
            .await?
        }
        Op::SafDead { id, now, reason } => {
            let params: [&(dyn ToSql + Sync); 3] = [&id.0, now, &clip(reason)];
            change(tx, st, Change::Dead, *id, "", &st.dead, &params).await?
        }
        Op::SafRetryNow { id, now } => {
            change(
                tx,
                st,
                Change::RetryNow,
                *id,
                "",
                &st.retry_now,
                &[&id.0, now],
            )
            .await?
        }
        Op::SafDrop { id, now, reason } => {
            let params: [&(dyn ToSql + Sync); 3] = [&id.0, now, &clip(reason)];
            change(tx, st, Change::Drop, *id, "", &st.drop, &params).await?
        }
        Op::SafCancel { id, now, reason } => {
            let params: [&(dyn ToSql + Sync); 3] = [&id.0, now, &clip(reason)];
            Ok(Outcome::Changed(tx.execute(&st.cancel, &params).await?))
        }
        Op::SafPin { id, owner, node } => {
            let params: [&(dyn ToSql + Sync); 3] = [&id.0, owner, &clip(node)];
            Ok(Outcome::Changed(tx.execute(&st.pin, &params).await?))
        }
        Op::SafReleaseLeases { owner } => {
            let released = tx.execute(&st.release_leases, &[owner]).await?;
            Ok(Outcome::Changed(released))
        }
        Op::SafPrune { before, limit } => {
            let limit = i64::try_from(*limit).unwrap_or(i64::MAX);
            let pruned = tx.execute(&st.prune, &[before, &limit]).await?;
            Ok(Outcome::Changed(pruned))
        }
        Op::SafPayloads { after, limit } => {
            let limit = i64::try_from(*limit).unwrap_or(i64::MAX);
            let rows = tx
                .query(
                    "SELECT id, service, kind, mti, created_at, payload FROM saf \
                     WHERE id > $1 AND payload IS NOT NULL ORDER BY id LIMIT $2",
                    &[&after.0, &limit],
                )
                .await?;
            let raw = rows
                .iter()
                .map(|r| {
                    Ok((
                        r.try_get::<_, i64>(0)?,
                        r.try_get::<_, String>(1)?,
                        r.try_get::<_, String>(2)?,
                        r.try_get::<_, String>(3)?,
                        r.try_get::<_, i64>(4)?,
                        r.try_get::<_, Vec<u8>>(5)?,
                    ))
                })
                .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
            schema::stored_payloads(raw).map(Outcome::Payloads)
        }
        Op::SafReseal { id, old, new } => {
            let n = tx
                .execute(
                    "UPDATE saf SET payload = $2 WHERE id = $1 AND payload = $3",
                    &[&id.0, new, old],
                )
                .await?;
            Ok(Outcome::Changed(n))
        }
        Op::SafList(filter) => {
            let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
            let state = filter.state.map(|s| s.as_str());
            let rows = tx
                .query(&st.list, &[&state, &filter.service, &limit])
                .await?;
            let raw = rows
                .iter()
                .map(raw_row)
                .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
            raw.into_iter()
                .map(RawRow::into_row)
                .collect::<Result<Vec<_>, _>>()
                .map(Outcome::Rows)
        }
        Op::SafStats { now } => {
            let rows = tx.query(&st.stats, &[now]).await?;
            let groups = rows
                .iter()
                .map(|r| {
                    Ok(schema::StateGroup {
                        state: r.try_get(0)?,
                        count: r.try_get(1)?,
                        leased: r.try_get(2)?,
                        oldest: r.try_get(3)?,
                        repeats: r.try_get(4)?,
                    })
                })
                .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
            schema::stats(groups, *now).map(Outcome::Stats)
        }
        Op::SafOwed { now } => {
            let rows = tx.query(&st.owed, &[now]).await?;
            let groups = rows
                .iter()
                .map(|r| {
                    Ok(schema::OwedGroup {
                        service: r.try_get(0)?,
                        kind: r.try_get(1)?,
                        state: r.try_get(2)?,
                        count: r.try_get(3)?,
                        leased: r.try_get(4)?,
                        oldest: r.try_get(5)?,
                    })
                })
                .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
            schema::owed(groups, *now).map(Outcome::Owed)
        }
        // Rare (an answer that reached another instance than its
        // sender's): not worth a prepared statement of its own.
        Op::SafOwedToPeer {
            service,
            f11,
            f7,
            f37,
        } => {
            let row = tx
                .query_opt(
                    "SELECT id FROM saf WHERE state = 'pending' AND service = $1 \
                     AND direction = 'to_peer' AND f11 = $2 AND f7 = $3 AND f37 = $4 \
                     ORDER BY id LIMIT 1",
                    &[service, f11, f7, f37],
                )
                .await?;
            let id: Option<i64> = row.map(|r| r.try_get(0)).transpose()?;
            Ok(id.map_or(Outcome::Done, |id| Outcome::Id(SafId(id))))
        }
        Op::MetaGet(key) => {
            let row = tx.query_opt(&st.meta_get, &[key]).await?;
            Ok(Outcome::Meta(row.map(|r| r.try_get(0)).transpose()?))
        }
        Op::MetaPut(key, value) => {
            tx.execute(&st.meta_put, &[key, value]).await?;
            Ok(Outcome::Done)
        }
        Op::JournalPut { rows, admin } => journal::put(tx, st, rows, admin).await?,
        Op::JournalQuery(filter) => journal::query(tx, filter).await?,
        Op::AdminQuery { since, limit } => journal::admin_query(tx, *since, *limit).await?,
        // Routed to the maintenance by the writer (retention drops days).
        Op::JournalPurge { .. } | Op::AdminPurge { .. } => {
            Err(crate::store::StoreError::WrongAnswer {
                op: "journal_purge",
                got: "a purge in a batch".into(),
            })
        }
        Op::JournalReport { since, until } => journal::report(tx, *since, *until).await?,
        Op::JournalSpace => journal::space(tx).await?,
        Op::Close => Ok(Outcome::Done),
    })
}

fn raw_row(r: &tokio_postgres::Row) -> Result<RawRow, tokio_postgres::Error> {
    Ok(RawRow {
        id: r.try_get(0)?,
        service: r.try_get(1)?,
        direction: r.try_get(2)?,
        node_id: r.try_get(3)?,
        kind: r.try_get(4)?,
        mti: r.try_get(5)?,
        f11: r.try_get(6)?,
        f37: r.try_get(7)?,
        f7: r.try_get(8)?,
        pan_masked: r.try_get(9)?,
        original: r.try_get(10)?,
        state: r.try_get(11)?,
        created_at: r.try_get(12)?,
        expires_at: r.try_get(13)?,
        attempts: i64::from(r.try_get::<_, i32>(14)?),
        next_attempt_at: r.try_get(15)?,
        last_error: r.try_get(16)?,
        lease_owner: r.try_get(17)?,
        lease_until: r.try_get(18)?,
        completed_at: r.try_get(19)?,
        completed_by: r.try_get(20)?,
        answer: r.try_get(21)?,
        reason: r.try_get(22)?,
    })
}

/// Runs a state change; when it touches no row, says why.
async fn change(
    tx: &Transaction<'_>,
    st: &Statements,
    change: Change,
    id: SafId,
    owner: &str,
    statement: &Statement,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Answer, tokio_postgres::Error> {
    if tx.execute(statement, params).await? > 0 {
        return Ok(Ok(Outcome::Done));
    }
    let found = tx
        .query_opt(&st.state_of, &[&id.0])
        .await?
        .map(|r| Ok::<_, tokio_postgres::Error>((r.try_get(0)?, r.try_get(1)?)))
        .transpose()?;
    Ok(schema::refusal(change, id, owner, found))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn there_is_one_migration_per_schema_version() {
        assert_eq!(MIGRATIONS.len() as i64, schema::SCHEMA_VERSION);
    }
}
