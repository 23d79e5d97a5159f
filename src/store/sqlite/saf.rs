//! The SQLite backend's store-and-forward queue: the `saf` table's
//! statements (prepared once per connection, through rusqlite's cache), and
//! how a refused state change says why.

use rusqlite::{OptionalExtension, params};

use super::Sqlite;
use crate::store::backend::{OpResult, SafOps};
use crate::store::rows::{ClaimedSaf, RawClaim, RawSafRow, SafRow, StoredPayload};
use crate::store::saf::{NewSafEntry, SafFilter, SafId, SafOwed, SafStats, UnixMillis, clip};
use crate::store::schema::{self, CLAIM_COLUMNS, Change, IN_ORDER, ROW_COLUMNS};

type Sql<T> = rusqlite::Result<T>;

impl SafOps for Sqlite<'_> {
    async fn saf_put(&self, e: &NewSafEntry) -> Sql<SafId> {
        let (direction, node) = e.direction.to_columns();
        let id: i64 = self
            .tx
            .prepare_cached(
                "INSERT INTO saf (service, direction, node_id, kind, mti, payload, f11, f37, f7, \
                 pan_masked, created_at, expires_at, next_attempt_at, state, original) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, 'pending', ?14) \
                 RETURNING id",
            )?
            .query_row(
                params![
                    e.service,
                    direction,
                    node,
                    e.kind.as_str(),
                    e.mti,
                    e.payload,
                    e.keys.f11,
                    e.keys.f37,
                    e.keys.f7,
                    e.keys.pan_masked,
                    e.created_at,
                    e.expires_at,
                    e.first_attempt_at,
                    e.keys.original
                ],
                |r| r.get(0),
            )?;
        Ok(SafId(id))
    }

    async fn saf_claim(
        &self,
        owner: &str,
        now: UnixMillis,
        max: usize,
        lease_until: UnixMillis,
    ) -> OpResult<Vec<ClaimedSaf>, rusqlite::Error> {
        let mut st = self.tx.prepare_cached(&claim_sql(max))?;
        let raw = st
            .query_map(params![owner, lease_until, now], |r| {
                Ok(RawClaim {
                    id: r.get(0)?,
                    service: r.get(1)?,
                    direction: r.get(2)?,
                    node_id: r.get(3)?,
                    kind: r.get(4)?,
                    mti: r.get(5)?,
                    payload: r.get(6)?,
                    attempts: r.get(7)?,
                    created_at: r.get(8)?,
                    expires_at: r.get(9)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(schema::claims_in_order(raw, lease_until))
    }

    async fn saf_attempted(
        &self,
        id: SafId,
        owner: &str,
        next_attempt_at: UnixMillis,
        error: &str,
    ) -> OpResult<(), rusqlite::Error> {
        self.change(
            Change::Attempted,
            id,
            owner,
            "UPDATE saf SET next_attempt_at = ?2, last_error = ?3, lease_owner = NULL, \
             lease_until = NULL WHERE id = ?1 AND state = 'pending' AND lease_owner = ?4",
            params![id.0, next_attempt_at, clip(error), owner],
        )
    }

    async fn saf_delivered(
        &self,
        id: SafId,
        owner: &str,
        now: UnixMillis,
        answer: &str,
        reason: Option<&str>,
    ) -> OpResult<(), rusqlite::Error> {
        self.change(
            Change::Delivered,
            id,
            owner,
            "UPDATE saf SET state = 'delivered', completed_at = ?2, answer = ?3, completed_by = ?4, \
             reason = ?5, payload = NULL, lease_owner = NULL, lease_until = NULL \
             WHERE id = ?1 AND state = 'pending'",
            params![id.0, now, clip(answer), owner, reason.map(clip)],
        )
    }

    async fn saf_dead(
        &self,
        id: SafId,
        now: UnixMillis,
        reason: &str,
    ) -> OpResult<(), rusqlite::Error> {
        self.change(
            Change::Dead,
            id,
            "",
            "UPDATE saf SET state = 'dead', completed_at = ?2, reason = ?3, lease_owner = NULL, \
             lease_until = NULL WHERE id = ?1 AND state = 'pending'",
            params![id.0, now, clip(reason)],
        )
    }

    async fn saf_retry_now(&self, id: SafId, now: UnixMillis) -> OpResult<(), rusqlite::Error> {
        self.change(
            Change::RetryNow,
            id,
            "",
            // A dead letter gets its max age again, from now.
            "UPDATE saf SET next_attempt_at = ?2, \
             expires_at = CASE WHEN state = 'dead' THEN ?2 + (expires_at - created_at) ELSE expires_at END, \
             state = 'pending', completed_at = NULL, reason = NULL \
             WHERE id = ?1 AND state IN ('pending', 'dead')",
            params![id.0, now],
        )
    }

    async fn saf_drop(
        &self,
        id: SafId,
        now: UnixMillis,
        reason: &str,
    ) -> OpResult<(), rusqlite::Error> {
        self.change(
            Change::Drop,
            id,
            "",
            "UPDATE saf SET state = 'dropped', completed_at = ?2, reason = ?3, payload = NULL, \
             lease_owner = NULL, lease_until = NULL WHERE id = ?1 AND state IN ('pending', 'dead')",
            params![id.0, now, clip(reason)],
        )
    }

    async fn saf_cancel(&self, id: SafId, now: UnixMillis, reason: &str) -> Sql<u64> {
        let n = self
            .tx
            .prepare_cached(
                "UPDATE saf SET state = 'dropped', completed_at = ?2, reason = ?3, \
                 payload = NULL, lease_owner = NULL, lease_until = NULL \
                 WHERE id = ?1 AND state = 'pending' AND (lease_until IS NULL OR lease_until <= ?2)",
            )?
            .execute(params![id.0, now, clip(reason)])?;
        Ok(n as u64)
    }

    async fn saf_pin(&self, id: SafId, owner: &str, node: &str) -> Sql<u64> {
        let n = self
            .tx
            .prepare_cached(
                "UPDATE saf SET direction = 'to_node', node_id = ?3 \
                 WHERE id = ?1 AND state = 'pending' AND lease_owner = ?2 \
                 AND direction = 'to_any_node'",
            )?
            .execute(params![id.0, owner, clip(node)])?;
        Ok(n as u64)
    }

    async fn saf_release_leases(&self, owner: &str) -> Sql<u64> {
        let released = self.tx.execute(
            "UPDATE saf SET lease_owner = NULL, lease_until = NULL \
             WHERE state = 'pending' AND lease_owner = ?1",
            params![owner],
        )?;
        Ok(released as u64)
    }

    async fn saf_prune(&self, before: UnixMillis, limit: usize) -> Sql<u64> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let pruned = self.tx.execute(
            "DELETE FROM saf WHERE id IN (SELECT id FROM saf \
             WHERE state IN ('delivered', 'dropped') AND completed_at < ?1 \
             ORDER BY completed_at LIMIT ?2)",
            params![before, limit],
        )?;
        Ok(pruned as u64)
    }

    async fn saf_payloads(
        &self,
        after: SafId,
        limit: usize,
    ) -> OpResult<Vec<StoredPayload>, rusqlite::Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut st = self.tx.prepare_cached(
            "SELECT id, service, kind, mti, created_at, payload FROM saf \
             WHERE id > ?1 AND payload IS NOT NULL ORDER BY id LIMIT ?2",
        )?;
        let raw = st
            .query_map(params![after.0, limit], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, Vec<u8>>(5)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(schema::stored_payloads(raw))
    }

    async fn saf_reseal(&self, id: SafId, old: &[u8], new: &[u8]) -> Sql<u64> {
        let n = self.tx.execute(
            "UPDATE saf SET payload = ?2 WHERE id = ?1 AND payload = ?3",
            params![id.0, new, old],
        )?;
        Ok(n as u64)
    }

    async fn saf_list(&self, filter: &SafFilter) -> OpResult<Vec<SafRow>, rusqlite::Error> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let mut st = self.tx.prepare_cached(&format!(
            "SELECT {ROW_COLUMNS} FROM saf WHERE (?1 IS NULL OR state = ?1) \
             AND (?2 IS NULL OR service = ?2) ORDER BY id DESC LIMIT ?3"
        ))?;
        let raw = st
            .query_map(
                params![filter.state.map(|s| s.as_str()), filter.service, limit],
                raw_row,
            )?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(raw.into_iter().map(RawSafRow::into_row).collect())
    }

    async fn saf_stats(&self, now: UnixMillis) -> OpResult<SafStats, rusqlite::Error> {
        let mut st = self.tx.prepare_cached(
            "SELECT state, COUNT(*), \
             SUM(CASE WHEN lease_until > ?1 THEN 1 ELSE 0 END), \
             MIN(created_at), SUM(CASE WHEN attempts > 1 THEN attempts - 1 ELSE 0 END) \
             FROM saf GROUP BY state",
        )?;
        let groups = st
            .query_map(params![now], |r| {
                Ok(schema::StateGroup {
                    state: r.get(0)?,
                    count: r.get(1)?,
                    leased: r.get(2)?,
                    oldest: r.get(3)?,
                    repeats: r.get(4)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(schema::stats(groups, now))
    }

    async fn saf_owed(&self, now: UnixMillis) -> OpResult<Vec<SafOwed>, rusqlite::Error> {
        let mut st = self
            .tx
            .prepare_cached(&schema::OWED_SQL.replace("$1", "?1"))?;
        let groups = st
            .query_map(params![now], |r| {
                Ok(schema::OwedGroup {
                    service: r.get(0)?,
                    kind: r.get(1)?,
                    state: r.get(2)?,
                    count: r.get(3)?,
                    leased: r.get(4)?,
                    oldest: r.get(5)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(schema::owed(groups, now))
    }

    async fn saf_owed_to_peer(
        &self,
        service: &str,
        f11: &str,
        f7: &str,
        f37: &str,
    ) -> Sql<Option<SafId>> {
        let id: Option<i64> = self
            .tx
            .query_row(
                "SELECT id FROM saf WHERE state = 'pending' AND service = ?1 \
                 AND direction = 'to_peer' AND f11 = ?2 AND f7 = ?3 AND f37 = ?4 \
                 ORDER BY id LIMIT 1",
                params![service, f11, f7, f37],
                |r| r.get(0),
            )
            .optional()?;
        Ok(id.map(SafId))
    }
}

impl Sqlite<'_> {
    /// Runs a state change; when it touches no row, says why.
    fn change(
        &self,
        change: Change,
        id: SafId,
        owner: &str,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> OpResult<(), rusqlite::Error> {
        if self.tx.prepare_cached(sql)?.execute(params)? > 0 {
            return Ok(Ok(()));
        }
        let found = self
            .tx
            .prepare_cached("SELECT state, lease_owner FROM saf WHERE id = ?1")?
            .query_row(params![id.0], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        Ok(schema::refusal(change, id, owner, found))
    }
}

fn raw_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawSafRow> {
    Ok(RawSafRow {
        id: r.get(0)?,
        service: r.get(1)?,
        direction: r.get(2)?,
        node_id: r.get(3)?,
        kind: r.get(4)?,
        mti: r.get(5)?,
        f11: r.get(6)?,
        f37: r.get(7)?,
        f7: r.get(8)?,
        pan_masked: r.get(9)?,
        original: r.get(10)?,
        state: r.get(11)?,
        created_at: r.get(12)?,
        expires_at: r.get(13)?,
        attempts: r.get(14)?,
        next_attempt_at: r.get(15)?,
        last_error: r.get(16)?,
        lease_owner: r.get(17)?,
        lease_until: r.get(18)?,
        completed_at: r.get(19)?,
        completed_by: r.get(20)?,
        answer: r.get(21)?,
        reason: r.get(22)?,
    })
}

/// The claim's statement for batches of `max`. The limit is written into
/// the text, not bound: SQLite re-prepares a statement whose bound `LIMIT`
/// may change its plan at every step where the value could differ (about
/// 370,000 instructions a claim, twice a second on an idle switch), while a
/// cached statement with a constant limit is prepared once.
pub(super) fn claim_sql(max: usize) -> String {
    format!(
        "UPDATE saf SET lease_owner = ?1, lease_until = ?2, attempts = attempts + 1 \
         WHERE id IN (SELECT id FROM saf AS s WHERE state = 'pending' AND next_attempt_at <= ?3 \
           AND (lease_until IS NULL OR lease_until <= ?3) AND {IN_ORDER} \
           ORDER BY next_attempt_at, id LIMIT {max}) \
         RETURNING {CLAIM_COLUMNS}"
    )
}
