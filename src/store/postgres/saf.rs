//! The PostgreSQL backend's store-and-forward queue: the `saf` table's
//! statements, prepared once per connection, and how a refused state
//! change says why. Claims and prunes `SKIP LOCKED`, so instances sharing
//! the table pass over each other's rows instead of waiting on them.

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use super::Postgres;
use crate::store::backend::{OpResult, SafOps};
use crate::store::rows::{ClaimedSaf, RawClaim, RawSafRow, SafRow, StoredPayload};
use crate::store::saf::{NewSafEntry, SafFilter, SafId, SafOwed, SafStats, UnixMillis, clip};
use crate::store::schema::{self, CLAIM_COLUMNS, Change, IN_ORDER, ROW_COLUMNS};

type PgResult<T> = Result<T, tokio_postgres::Error>;

/// The queue's statements, prepared once per connection.
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
}

impl Statements {
    pub(super) async fn prepare(c: &Client) -> PgResult<Self> {
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
        })
    }
}

impl SafOps for Postgres<'_> {
    async fn saf_put(&self, e: &NewSafEntry) -> PgResult<SafId> {
        let (direction, node) = e.direction.to_columns();
        let row = self
            .tx
            .query_one(
                &self.st.saf.put,
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
        Ok(SafId(row.try_get(0)?))
    }

    async fn saf_claim(
        &self,
        owner: &str,
        now: UnixMillis,
        max: usize,
        lease_until: UnixMillis,
    ) -> OpResult<Vec<ClaimedSaf>, tokio_postgres::Error> {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let rows = self
            .tx
            .query(&self.st.saf.claim, &[&owner, &lease_until, &now, &max])
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
            .collect::<PgResult<Vec<_>>>()?;
        Ok(schema::claims_in_order(raw, lease_until))
    }

    async fn saf_attempted(
        &self,
        id: SafId,
        owner: &str,
        next_attempt_at: UnixMillis,
        error: &str,
    ) -> OpResult<(), tokio_postgres::Error> {
        let params: [&(dyn ToSql + Sync); 4] = [&id.0, &next_attempt_at, &clip(error), &owner];
        let st = &self.st.saf.attempted;
        self.change(Change::Attempted, id, owner, st, &params).await
    }

    async fn saf_delivered(
        &self,
        id: SafId,
        owner: &str,
        now: UnixMillis,
        answer: &str,
        reason: Option<&str>,
    ) -> OpResult<(), tokio_postgres::Error> {
        let reason = reason.map(clip);
        let params: [&(dyn ToSql + Sync); 5] = [&id.0, &now, &clip(answer), &owner, &reason];
        let st = &self.st.saf.delivered;
        self.change(Change::Delivered, id, owner, st, &params).await
    }

    async fn saf_dead(
        &self,
        id: SafId,
        now: UnixMillis,
        reason: &str,
    ) -> OpResult<(), tokio_postgres::Error> {
        let params: [&(dyn ToSql + Sync); 3] = [&id.0, &now, &clip(reason)];
        let st = &self.st.saf.dead;
        self.change(Change::Dead, id, "", st, &params).await
    }

    async fn saf_retry_now(
        &self,
        id: SafId,
        now: UnixMillis,
    ) -> OpResult<(), tokio_postgres::Error> {
        let st = &self.st.saf.retry_now;
        self.change(Change::RetryNow, id, "", st, &[&id.0, &now])
            .await
    }

    async fn saf_drop(
        &self,
        id: SafId,
        now: UnixMillis,
        reason: &str,
    ) -> OpResult<(), tokio_postgres::Error> {
        let params: [&(dyn ToSql + Sync); 3] = [&id.0, &now, &clip(reason)];
        let st = &self.st.saf.drop;
        self.change(Change::Drop, id, "", st, &params).await
    }

    async fn saf_cancel(&self, id: SafId, now: UnixMillis, reason: &str) -> PgResult<u64> {
        let params: [&(dyn ToSql + Sync); 3] = [&id.0, &now, &clip(reason)];
        self.tx.execute(&self.st.saf.cancel, &params).await
    }

    async fn saf_pin(&self, id: SafId, owner: &str, node: &str) -> PgResult<u64> {
        let params: [&(dyn ToSql + Sync); 3] = [&id.0, &owner, &clip(node)];
        self.tx.execute(&self.st.saf.pin, &params).await
    }

    async fn saf_release_leases(&self, owner: &str) -> PgResult<u64> {
        self.tx
            .execute(&self.st.saf.release_leases, &[&owner])
            .await
    }

    async fn saf_prune(&self, before: UnixMillis, limit: usize) -> PgResult<u64> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.tx
            .execute(&self.st.saf.prune, &[&before, &limit])
            .await
    }

    async fn saf_payloads(
        &self,
        after: SafId,
        limit: usize,
    ) -> OpResult<Vec<StoredPayload>, tokio_postgres::Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .tx
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
            .collect::<PgResult<Vec<_>>>()?;
        Ok(schema::stored_payloads(raw))
    }

    async fn saf_reseal(&self, id: SafId, old: &[u8], new: &[u8]) -> PgResult<u64> {
        self.tx
            .execute(
                "UPDATE saf SET payload = $2 WHERE id = $1 AND payload = $3",
                &[&id.0, &new, &old],
            )
            .await
    }

    async fn saf_list(&self, filter: &SafFilter) -> OpResult<Vec<SafRow>, tokio_postgres::Error> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let state = filter.state.map(|s| s.as_str());
        let rows = self
            .tx
            .query(&self.st.saf.list, &[&state, &filter.service, &limit])
            .await?;
        let raw = rows.iter().map(raw_row).collect::<PgResult<Vec<_>>>()?;
        Ok(raw.into_iter().map(RawSafRow::into_row).collect())
    }

    async fn saf_stats(&self, now: UnixMillis) -> OpResult<SafStats, tokio_postgres::Error> {
        let rows = self.tx.query(&self.st.saf.stats, &[&now]).await?;
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
            .collect::<PgResult<Vec<_>>>()?;
        Ok(schema::stats(groups, now))
    }

    async fn saf_owed(&self, now: UnixMillis) -> OpResult<Vec<SafOwed>, tokio_postgres::Error> {
        let rows = self.tx.query(&self.st.saf.owed, &[&now]).await?;
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
            .collect::<PgResult<Vec<_>>>()?;
        Ok(schema::owed(groups, now))
    }

    // Rare (an answer that reached another instance than its sender's):
    // not worth a prepared statement of its own.
    async fn saf_owed_to_peer(
        &self,
        service: &str,
        f11: &str,
        f7: &str,
        f37: &str,
    ) -> PgResult<Option<SafId>> {
        let row = self
            .tx
            .query_opt(
                "SELECT id FROM saf WHERE state = 'pending' AND service = $1 \
                 AND direction = 'to_peer' AND f11 = $2 AND f7 = $3 AND f37 = $4 \
                 ORDER BY id LIMIT 1",
                &[&service, &f11, &f7, &f37],
            )
            .await?;
        let id: Option<i64> = row.map(|r| r.try_get(0)).transpose()?;
        Ok(id.map(SafId))
    }
}

impl Postgres<'_> {
    /// Runs a state change; when it touches no row, says why.
    async fn change(
        &self,
        change: Change,
        id: SafId,
        owner: &str,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> OpResult<(), tokio_postgres::Error> {
        if self.tx.execute(statement, params).await? > 0 {
            return Ok(Ok(()));
        }
        let found = self
            .tx
            .query_opt(&self.st.saf.state_of, &[&id.0])
            .await?
            .map(|r| Ok::<_, tokio_postgres::Error>((r.try_get(0)?, r.try_get(1)?)))
            .transpose()?;
        Ok(schema::refusal(change, id, owner, found))
    }
}

fn raw_row(r: &tokio_postgres::Row) -> PgResult<RawSafRow> {
    Ok(RawSafRow {
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
