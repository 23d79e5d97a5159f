//! The rows the store reads back, in one place: what both backends make of
//! a row of `saf`, `journal` and `admin_log`, and what the store's readers
//! take (the SAF delivery loop, the admin API and its listings, the
//! journal's queries and its report). The raw forms (`RawSafRow`,
//! `RawClaim`, `RawPayload`) are a `saf` row as either driver reads it,
//! before its text columns become types; the rows on their way in are
//! [`super::saf::NewSafEntry`] and [`super::journal::NewRow`].

use std::fmt;

use serde::Serialize;

use super::error::StoreError;
use super::saf::{Direction, SafKeys, SafKind, UnixMillis};
use super::state::{SafId, SafState};

/// An entry as listed (everything but the payload).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SafRow {
    pub id: SafId,
    pub service: String,
    pub direction: Direction,
    pub kind: SafKind,
    pub mti: String,
    pub keys: SafKeys,
    pub state: SafState,
    pub created_at: UnixMillis,
    pub expires_at: UnixMillis,
    /// Attempts started (leases taken).
    pub attempts: u32,
    pub next_attempt_at: UnixMillis,
    pub last_error: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<UnixMillis>,
    pub completed_at: Option<UnixMillis>,
    /// The owner that recorded the delivery.
    pub completed_by: Option<String>,
    /// The host's answer, summarised by the caller (delivered entries).
    pub answer: Option<String>,
    /// Why the entry is dead or dropped.
    pub reason: Option<String>,
}

/// An entry leased to one owner for one delivery attempt.
#[derive(Clone, PartialEq, Eq)]
pub struct ClaimedSaf {
    pub id: SafId,
    pub service: String,
    pub direction: Direction,
    pub kind: SafKind,
    /// The MTI as first sent; see [`super::policy::repeat_mti`] for attempt > 1.
    pub mti: String,
    pub payload: Vec<u8>,
    /// This attempt's number, from 1. Counted when the lease is taken, before
    /// anything is sent, so an instance that dies between sending and
    /// recording never makes the next instance send a second original: any
    /// attempt after the first goes out as a repeat.
    pub attempt: u32,
    pub created_at: UnixMillis,
    pub expires_at: UnixMillis,
    pub lease_until: UnixMillis,
}

// The payload holds the whole message, PAN included: Debug shows its length.
impl fmt::Debug for ClaimedSaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimedSaf")
            .field("id", &self.id)
            .field("service", &self.service)
            .field("direction", &self.direction)
            .field("mti", &self.mti)
            .field("payload_len", &self.payload.len())
            .field("attempt", &self.attempt)
            .field("lease_until", &self.lease_until)
            .finish_non_exhaustive()
    }
}

/// An entry's payload as stored, with what its seal is bound to.
#[derive(Clone, Debug)]
pub(crate) struct StoredPayload {
    pub id: SafId,
    pub service: String,
    pub kind: SafKind,
    pub mti: String,
    pub created_at: UnixMillis,
    pub payload: Vec<u8>,
}

/// One exchange, as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct JournalRow {
    /// Set by the store; 0 on a row not yet stored.
    pub id: i64,
    pub t_in: UnixMillis,
    pub t_out: UnixMillis,
    pub service: String,
    pub front: String,
    /// `client#N`, `peer` or `node`.
    pub link: String,
    pub node: Option<String>,
    /// `front` (a client's or the peer's request) or `node` (a node's own).
    pub origin: String,
    pub mti: String,
    pub mti_out: Option<String>,
    pub f11: Option<String>,
    pub f7: Option<String>,
    /// F37 as received and as answered (the node's answer carries the
    /// switch's stamp when it stamps).
    pub f37_in: Option<String>,
    pub f37_out: Option<String>,
    pub f41: Option<String>,
    pub f42: Option<String>,
    pub f32: Option<String>,
    pub f33: Option<String>,
    /// First 6 and last 4 at most.
    pub pan: Option<String>,
    pub f4: Option<String>,
    pub f49: Option<String>,
    pub f39: Option<String>,
    /// `node`, `peer`, `switch` or `none`.
    pub answered_by: String,
    /// Why the switch answered (or nobody did).
    pub reason: Option<String>,
    /// `answered`, `switch-made`, `duplicate`, `unroutable`, `bad`, `late`,
    /// `unanswered`.
    pub outcome: String,
    pub latency_us: Option<i64>,
    pub late: bool,
    pub duplicate: bool,
    pub repeat: bool,
    pub unroutable: bool,
    /// `declined`, `dropped` or `closed` for a request that failed
    /// validation.
    pub bad: Option<String>,
    /// The `saf` row of the reversal a late approval was given.
    pub reversal_id: Option<i64>,
    /// Read only: that reversal's state (`pending`, `delivered`, `dead`,
    /// `dropped`) and the host's answer to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reversal_state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reversal_answer: Option<String>,
}

/// One admin action, or a refused token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AdminRow {
    pub id: i64,
    pub at: UnixMillis,
    /// The client's address, `-` when unknown.
    pub peer: String,
    /// `drain`, `disable`, `enable`, `add`, `remove`, `reload`, `saf-retry`,
    /// `saf-drop`, `token-refused`, or the method and path.
    pub action: String,
    pub method: String,
    pub path: String,
    /// The HTTP status answered.
    pub status: i64,
    /// What the change did or why it was refused.
    pub outcome: String,
}

/// One row of the report pass ([`super::journal::REPORT_SQL`]).
#[derive(Clone, Debug)]
pub struct ReportInput {
    pub service: String,
    pub node: Option<String>,
    pub outcome: String,
    pub reason: Option<String>,
    pub late: bool,
    pub reversal_id: Option<i64>,
    pub reversal_state: Option<String>,
    pub latency_us: Option<i64>,
    pub t_in: UnixMillis,
}

/// A `saf` row as the driver reads it (listed).
pub(crate) struct RawSafRow {
    pub id: i64,
    pub service: String,
    pub direction: String,
    pub node_id: Option<String>,
    pub kind: String,
    pub mti: String,
    pub f11: Option<String>,
    pub f37: Option<String>,
    pub f7: Option<String>,
    pub pan_masked: Option<String>,
    pub original: Option<String>,
    pub state: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub attempts: i64,
    pub next_attempt_at: i64,
    pub last_error: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<i64>,
    pub completed_at: Option<i64>,
    pub completed_by: Option<String>,
    pub answer: Option<String>,
    pub reason: Option<String>,
}

fn attempts(n: i64) -> Result<u32, StoreError> {
    u32::try_from(n).map_err(|_| StoreError::Corrupt {
        column: "saf.attempts",
        value: n.to_string(),
    })
}

impl RawSafRow {
    pub fn into_row(self) -> Result<SafRow, StoreError> {
        Ok(SafRow {
            id: SafId(self.id),
            service: self.service,
            direction: Direction::from_columns(&self.direction, self.node_id)?,
            kind: self.kind.parse()?,
            mti: self.mti,
            keys: SafKeys {
                f11: self.f11,
                f37: self.f37,
                f7: self.f7,
                pan_masked: self.pan_masked,
                original: self.original,
            },
            state: self.state.parse()?,
            created_at: self.created_at,
            expires_at: self.expires_at,
            attempts: attempts(self.attempts)?,
            next_attempt_at: self.next_attempt_at,
            last_error: self.last_error,
            lease_owner: self.lease_owner,
            lease_until: self.lease_until,
            completed_at: self.completed_at,
            completed_by: self.completed_by,
            answer: self.answer,
            reason: self.reason,
        })
    }
}

/// A claimed row as the driver reads it.
pub(crate) struct RawClaim {
    pub id: i64,
    pub service: String,
    pub direction: String,
    pub node_id: Option<String>,
    pub kind: String,
    pub mti: String,
    pub payload: Option<Vec<u8>>,
    pub attempts: i64,
    pub created_at: i64,
    pub expires_at: i64,
}

impl RawClaim {
    pub fn into_claimed(self, lease_until: UnixMillis) -> Result<ClaimedSaf, StoreError> {
        Ok(ClaimedSaf {
            id: SafId(self.id),
            service: self.service,
            direction: Direction::from_columns(&self.direction, self.node_id)?,
            kind: self.kind.parse()?,
            mti: self.mti,
            // Only completed rows lose their payload; a pending one without
            // it cannot be delivered.
            payload: self.payload.ok_or(StoreError::Corrupt {
                column: "saf.payload",
                value: format!("missing on pending entry {}", SafId(self.id)),
            })?,
            attempt: attempts(self.attempts)?,
            created_at: self.created_at,
            expires_at: self.expires_at,
            lease_until,
        })
    }
}

/// One row of `SafPayloads` as the drivers read it: id, service, kind,
/// MTI, created_at, payload.
pub(crate) type RawPayload = (i64, String, String, String, i64, Vec<u8>);
