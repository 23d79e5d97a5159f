//! What both backends share about the tables: the schema version, the column
//! lists, what rows as read (`rows.rs`) become, and how a refused update is
//! explained. The DDL itself is per backend (types differ); see
//! docs/store.md for the tables.

use std::collections::BTreeMap;

use super::error::StoreError;
use super::rows::{ClaimedSaf, RawClaim, RawPayload, StoredPayload};
use super::saf::{SafId, SafKind, SafOwed, SafState, SafStats, UnixMillis};

/// The schema version this build writes; `meta.schema_version` holds the
/// version a database is at. Each backend has exactly this many migrations.
pub const SCHEMA_VERSION: i64 = 7;

/// The `meta` key holding the schema version.
pub const VERSION_KEY: &str = "schema_version";

/// The columns of a listed row, in [`super::rows::RawSafRow`]'s order.
pub const ROW_COLUMNS: &str = "id, service, direction, node_id, kind, mti, f11, f37, f7, \
     pan_masked, original, state, created_at, expires_at, attempts, next_attempt_at, last_error, \
     lease_owner, lease_until, completed_at, completed_by, answer, reason";

/// A claim's condition on a due row `s`: no earlier pending entry of its
/// service names the same original. A terminal's 0420 waits while its 0220
/// is still owed, whatever their retry times; so does the switch's timeout
/// reversal behind an advice of the same sale. Rows without an original
/// are never held back.
pub const IN_ORDER: &str = "(s.original IS NULL OR NOT EXISTS (SELECT 1 FROM saf AS e \
     WHERE e.service = s.service AND e.original = s.original AND e.state = 'pending' \
     AND e.id < s.id))";

/// The columns a claim returns, in [`RawClaim`]'s order.
pub const CLAIM_COLUMNS: &str =
    "id, service, direction, node_id, kind, mti, payload, attempts, created_at, expires_at";

/// Claims oldest first (the drivers return updated rows in no set order).
pub fn claims_in_order(
    raw: Vec<RawClaim>,
    lease_until: UnixMillis,
) -> Result<Vec<ClaimedSaf>, StoreError> {
    let mut claimed = raw
        .into_iter()
        .map(|r| r.into_claimed(lease_until))
        .collect::<Result<Vec<_>, _>>()?;
    claimed.sort_by_key(|c| c.id);
    Ok(claimed)
}

/// `SafPayloads` rows, their kind parsed.
pub fn stored_payloads(raw: Vec<RawPayload>) -> Result<Vec<StoredPayload>, StoreError> {
    raw.into_iter()
        .map(|(id, service, kind, mti, created_at, payload)| {
            Ok(StoredPayload {
                id: SafId(id),
                service,
                kind: kind.parse()?,
                mti,
                created_at,
                payload,
            })
        })
        .collect()
}

/// The state changes an update may refuse, and what each needs.
#[derive(Clone, Copy, Debug)]
pub enum Change {
    /// A failed attempt reported by the lease owner.
    Attempted,
    Delivered,
    Dead,
    RetryNow,
    Drop,
}

/// Why an update touched no row, from the entry's state and owner as they
/// are now (`None`: no such entry).
pub fn refusal(
    change: Change,
    id: SafId,
    owner: &str,
    found: Option<(String, Option<String>)>,
) -> Result<(), StoreError> {
    let Some((state, _lease_owner)) = found else {
        return Err(StoreError::NotFound { id });
    };
    let state: SafState = state.parse()?;
    let (action, needs) = match change {
        // Whatever happened since (another owner took it, an operator
        // dropped it), this owner's report no longer applies.
        Change::Attempted => {
            return Err(StoreError::LeaseLost {
                id,
                owner: owner.to_string(),
            });
        }
        // The same delivery reported twice (by two owners after a lease
        // ran out) is one delivery.
        Change::Delivered if state == SafState::Delivered => return Ok(()),
        Change::Delivered => ("saf_delivered", "pending"),
        Change::Dead => ("saf_dead", "pending"),
        Change::RetryNow => ("saf_retry_now", "pending or dead"),
        Change::Drop => ("saf_drop", "pending or dead"),
    };
    Err(StoreError::WrongState {
        id,
        state,
        action,
        needs,
    })
}

/// One `GROUP BY state` row of the stats query.
pub struct StateGroup {
    pub state: String,
    pub count: i64,
    /// Rows whose lease runs past now.
    pub leased: i64,
    pub oldest: Option<i64>,
    /// Attempts after the first.
    pub repeats: i64,
}

pub fn stats(groups: Vec<StateGroup>, now: UnixMillis) -> Result<SafStats, StoreError> {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let mut stats = SafStats::default();
    for g in groups {
        stats.repeats_sent += count(g.repeats);
        match g.state.parse()? {
            SafState::Pending => {
                stats.pending = count(g.count);
                stats.in_flight = count(g.leased);
                stats.oldest_pending_age_ms = g.oldest.map(|t| now.saturating_sub(t).max(0));
            }
            SafState::Delivered => stats.delivered = count(g.count),
            SafState::Dead => stats.dead = count(g.count),
            SafState::Dropped => stats.dropped = count(g.count),
        }
    }
    Ok(stats)
}

/// The owed-entries query, on both backends (`$1`/`?1` is now): pending and
/// dead rows only, so the `saf_state` index bounds it by what is owed.
pub const OWED_SQL: &str = "SELECT service, kind, state, COUNT(*), \
     SUM(CASE WHEN lease_until > $1 THEN 1 ELSE 0 END), MIN(created_at) \
     FROM saf WHERE state IN ('pending', 'dead') GROUP BY service, kind, state";

/// One row of [`OWED_SQL`].
pub struct OwedGroup {
    pub service: String,
    pub kind: String,
    pub state: String,
    pub count: i64,
    /// Rows whose lease runs past now.
    pub leased: i64,
    pub oldest: Option<i64>,
}

/// [`OWED_SQL`]'s rows as one [`SafOwed`] per service and kind, in service
/// then kind order.
pub fn owed(groups: Vec<OwedGroup>, now: UnixMillis) -> Result<Vec<SafOwed>, StoreError> {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let mut by: BTreeMap<(String, &'static str), SafOwed> = BTreeMap::new();
    for g in groups {
        let kind: SafKind = g.kind.parse()?;
        let state: SafState = g.state.parse()?;
        let owed = by
            .entry((g.service.clone(), kind.as_str()))
            .or_insert_with(|| SafOwed {
                service: g.service,
                kind,
                pending: 0,
                in_flight: 0,
                oldest_pending_age_ms: None,
                dead: 0,
            });
        match state {
            SafState::Pending => {
                owed.pending += count(g.count);
                owed.in_flight += count(g.leased);
                let age = g.oldest.map(|t| now.saturating_sub(t).max(0));
                owed.oldest_pending_age_ms = owed.oldest_pending_age_ms.max(age);
            }
            SafState::Dead => owed.dead += count(g.count),
            other => {
                return Err(StoreError::Corrupt {
                    column: "saf.state",
                    value: format!("{other} in the owed query"),
                });
            }
        }
    }
    Ok(by.into_values().collect())
}

/// Reads the version stored in `meta` (absent: a new database).
pub fn parse_version(value: Option<String>) -> Result<i64, StoreError> {
    let Some(value) = value else { return Ok(0) };
    let version = value
        .trim()
        .parse::<i64>()
        .map_err(|_| StoreError::BadMeta {
            key: VERSION_KEY.to_string(),
            value: value.clone(),
        })?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found: version,
            known: SCHEMA_VERSION,
        });
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_and_a_newer_one_is_refused() {
        assert_eq!(parse_version(None).ok(), Some(0));
        assert_eq!(parse_version(Some("1".into())).ok(), Some(1));
        assert!(matches!(
            parse_version(Some("x".into())),
            Err(StoreError::BadMeta { .. })
        ));
        assert!(matches!(
            parse_version(Some((SCHEMA_VERSION + 1).to_string())),
            Err(StoreError::SchemaTooNew { .. })
        ));
    }

    #[test]
    fn refusals_say_why() {
        let id = SafId(7);
        assert!(matches!(
            refusal(Change::Dead, id, "a", None),
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            refusal(
                Change::Attempted,
                id,
                "a",
                Some(("pending".into(), Some("b".into())))
            ),
            Err(StoreError::LeaseLost { .. })
        ));
        assert!(matches!(
            refusal(Change::Delivered, id, "a", Some(("delivered".into(), None))),
            Ok(())
        ));
        assert!(matches!(
            refusal(Change::Drop, id, "a", Some(("delivered".into(), None))),
            Err(StoreError::WrongState {
                state: SafState::Delivered,
                ..
            })
        ));
    }

    fn group(service: &str, kind: &str, state: &str, count: i64, oldest: i64) -> OwedGroup {
        OwedGroup {
            service: service.into(),
            kind: kind.into(),
            state: state.into(),
            count,
            leased: 1,
            oldest: Some(oldest),
        }
    }

    #[test]
    fn owed_entries_are_grouped_by_service_and_kind() {
        let groups = vec![
            group("pos", "reversal", "pending", 3, 1_000),
            group("pos", "reversal", "dead", 1, 500),
            group("pos", "advice", "dead", 4, 200),
            group("atm", "reversal", "pending", 2, 4_000),
        ];
        let by = owed(groups, 5_000).expect("owed");
        let keys: Vec<_> = by.iter().map(|g| (g.service.as_str(), g.kind)).collect();
        assert_eq!(
            keys,
            [
                ("atm", SafKind::Reversal),
                ("pos", SafKind::Advice),
                ("pos", SafKind::Reversal)
            ]
        );
        let pos_rev = &by[2];
        assert_eq!(
            (pos_rev.pending, pos_rev.dead, pos_rev.in_flight),
            (3, 1, 1)
        );
        assert_eq!(pos_rev.oldest_pending_age_ms, Some(4_000));
        assert_eq!((by[1].dead, by[1].oldest_pending_age_ms), (4, None));
        assert!(owed(vec![group("pos", "gift", "pending", 1, 0)], 0).is_err());
        assert!(owed(vec![group("pos", "advice", "delivered", 1, 0)], 0).is_err());
    }
}
