//! Store-and-forward entries: the messages the switch owes someone (reversal
//! advices for late approvals, client advices it acknowledged) and their
//! delivery record.
//!
//! An entry is `pending` until it is `delivered` (the host answered), `dead`
//! (parked as a dead letter: past its max age or attempts; an operator can
//! retry it) or `dropped` (an operator gave it up). Completed rows stay as a
//! compact record (no payload) so the journal can link a reversal to its
//! original exchange.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::error::StoreError;
pub use super::state::{SafId, SafState};

/// Unix time in milliseconds: what every time column holds, so SQLite and
/// PostgreSQL agree and any instance can read another's rows.
pub type UnixMillis = i64;

/// Now, as the store's columns count time.
pub fn now_millis() -> UnixMillis {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// Who the entry goes to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "to", content = "node")]
pub enum Direction {
    /// A channel node of the service, by node id.
    ToNode(String),
    /// The service's peer (UnionPay, VISA, a POS network controller).
    ToPeer,
    /// Any node of the service that can take it (a client's advice: any
    /// host of the service may book it).
    ToAnyNode,
}

/// Why the switch owes the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SafKind {
    /// A reversal advice (0420, repeated as 0421) for a late approval.
    Reversal,
    /// A client advice (0120 / 0220 / 0420) acknowledged in store-and-forward mode.
    Advice,
}

/// Identifying fields for listings, masked by the caller and stored as given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SafKeys {
    /// F11, the STAN.
    pub f11: Option<String>,
    /// F37, the retrieval reference number.
    pub f37: Option<String>,
    /// F7, transmission date and time.
    pub f7: Option<String>,
    /// The PAN masked to its first 6 and last 4 digits at most.
    pub pan_masked: Option<String>,
    /// The original transaction the message is about (terminal, STAN,
    /// transmission time, acquirer: `F41/F11/F7/F32`, from F90 for a
    /// reversal that names it). Entries with the same original are
    /// delivered in the order stored. No card data.
    pub original: Option<String>,
}

/// An entry to store, before it has an id.
#[derive(Clone, PartialEq, Eq)]
pub struct NewSafEntry {
    pub service: String,
    pub direction: Direction,
    pub kind: SafKind,
    /// The MTI of the first send (`0420`, `0120`, `0220`), 4 digits.
    pub mti: String,
    /// The message as first sent, without framing.
    pub payload: Vec<u8>,
    pub keys: SafKeys,
    pub created_at: UnixMillis,
    /// The max-age deadline: no attempt starts after it.
    pub expires_at: UnixMillis,
    /// When the first attempt is due (usually `created_at`).
    pub first_attempt_at: UnixMillis,
}

/// Which entries [`super::Store::saf_list`] returns, newest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SafFilter {
    pub state: Option<SafState>,
    pub service: Option<String>,
    pub limit: usize,
}

/// The SAF queue at a glance.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SafStats {
    /// Entries still owed.
    pub pending: u64,
    /// Of those, leased to an owner right now.
    pub in_flight: u64,
    /// Age of the oldest pending entry.
    pub oldest_pending_age_ms: Option<i64>,
    pub delivered: u64,
    /// Attempts after the first, over every entry kept.
    pub repeats_sent: u64,
    /// Dead letters, waiting for an operator.
    pub dead: u64,
    pub dropped: u64,
}

/// What is still owed for one service and kind: pending entries and dead
/// letters (what the metrics show each second). Read with an index on the
/// state, so its cost follows the entries owed, not the history kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SafOwed {
    pub service: String,
    pub kind: SafKind,
    /// Entries still owed.
    pub pending: u64,
    /// Of those, leased to an owner right now.
    pub in_flight: u64,
    /// Age of the oldest pending entry.
    pub oldest_pending_age_ms: Option<i64>,
    /// Dead letters, waiting for an operator.
    pub dead: u64,
}

/// Longest text kept in a key or reason column: listings stay compact.
const MAX_TEXT: usize = 256;

/// The last millisecond of year 9999: times past it (or before 1970) are
/// refused, so no time arithmetic in SQL can overflow.
pub const MAX_TIME: UnixMillis = 253_402_300_799_999;

/// Refuses a time outside 1970..=9999, naming the argument.
pub(crate) fn check_time(field: &'static str, t: UnixMillis) -> Result<(), StoreError> {
    if (0..=MAX_TIME).contains(&t) {
        return Ok(());
    }
    Err(StoreError::InvalidEntry {
        field,
        reason: format!("{t} is not a Unix time in milliseconds between 1970 and 9999"),
    })
}

impl NewSafEntry {
    /// Refuses what the store would hold wrongly: a bad MTI, an empty
    /// payload, a PAN that is not masked, a deadline before creation.
    pub fn validate(&self) -> Result<(), StoreError> {
        let bad = |field, reason: &str| {
            Err(StoreError::InvalidEntry {
                field,
                reason: reason.to_string(),
            })
        };
        if self.service.is_empty() {
            return bad("service", "empty");
        }
        for (field, t) in [
            ("created_at", self.created_at),
            ("expires_at", self.expires_at),
            ("first_attempt_at", self.first_attempt_at),
        ] {
            check_time(field, t)?;
        }
        if let Direction::ToNode(node) = &self.direction
            && node.is_empty()
        {
            return bad("direction", "empty node id");
        }
        if self.mti.len() != 4 || !self.mti.bytes().all(|b| b.is_ascii_digit()) {
            return bad("mti", "not 4 digits");
        }
        if self.payload.is_empty() {
            return bad("payload", "empty");
        }
        if self.expires_at < self.created_at {
            return bad("expires_at", "before created_at");
        }
        let keys = [
            ("f11", &self.keys.f11),
            ("f37", &self.keys.f37),
            ("f7", &self.keys.f7),
            ("pan_masked", &self.keys.pan_masked),
            ("original", &self.keys.original),
        ];
        let node = match &self.direction {
            Direction::ToNode(node) => Some(node.clone()),
            Direction::ToPeer | Direction::ToAnyNode => None,
        };
        let texts = [("service", Some(self.service.clone())), ("direction", node)];
        for (field, value) in keys.into_iter().chain(texts.iter().map(|(f, v)| (*f, v))) {
            if value.as_ref().is_some_and(|v| v.len() > MAX_TEXT) {
                return bad(field, "too long");
            }
            // PostgreSQL text cannot hold NUL; SQLite could: refuse it on both.
            if value.as_ref().is_some_and(|v| v.contains('\0')) {
                return bad(field, "contains a NUL character");
            }
        }
        // First 6 and last 4 is all a listing may show (PCI DSS 3.4).
        if let Some(pan) = &self.keys.pan_masked
            && pan.bytes().filter(u8::is_ascii_digit).count() > 10
        {
            return bad(
                "pan_masked",
                "shows more than the first 6 and last 4 digits",
            );
        }
        Ok(())
    }
}

/// Text from callers (errors, reasons, answers) cut to the column limit,
/// NUL (which PostgreSQL text cannot hold) shown as U+FFFD.
pub(crate) fn clip(text: &str) -> String {
    let cut = match text.char_indices().nth(MAX_TEXT) {
        Some((at, _)) => &text[..at],
        None => text,
    };
    cut.replace('\0', "\u{FFFD}")
}

// The payload holds the whole message, PAN included: Debug shows its length.
impl fmt::Debug for NewSafEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewSafEntry")
            .field("service", &self.service)
            .field("direction", &self.direction)
            .field("kind", &self.kind)
            .field("mti", &self.mti)
            .field("payload_len", &self.payload.len())
            .field("keys", &self.keys)
            .field("created_at", &self.created_at)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// The text forms the columns hold.
macro_rules! column_text {
    ($ty:ty, $column:literal, $($variant:path => $text:literal),+) => {
        impl $ty {
            pub fn as_str(self) -> &'static str {
                match self { $($variant => $text),+ }
            }
        }
        impl FromStr for $ty {
            type Err = StoreError;
            fn from_str(s: &str) -> Result<Self, StoreError> {
                match s {
                    $($text => Ok($variant),)+
                    other => Err(StoreError::Corrupt { column: $column, value: other.to_string() }),
                }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

column_text!(SafState, "saf.state",
    SafState::Pending => "pending",
    SafState::Delivered => "delivered",
    SafState::Dead => "dead",
    SafState::Dropped => "dropped");

column_text!(SafKind, "saf.kind",
    SafKind::Reversal => "reversal",
    SafKind::Advice => "advice");

impl Direction {
    /// The `direction` and `node_id` columns.
    pub(crate) fn to_columns(&self) -> (&'static str, Option<&str>) {
        match self {
            Direction::ToNode(node) => ("to_node", Some(node)),
            Direction::ToPeer => ("to_peer", None),
            Direction::ToAnyNode => ("to_any_node", None),
        }
    }

    pub(crate) fn from_columns(direction: &str, node: Option<String>) -> Result<Self, StoreError> {
        match (direction, node) {
            ("to_node", Some(node)) => Ok(Direction::ToNode(node)),
            ("to_peer", None) => Ok(Direction::ToPeer),
            ("to_any_node", None) => Ok(Direction::ToAnyNode),
            (other, _) => Err(StoreError::Corrupt {
                column: "saf.direction",
                value: other.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> NewSafEntry {
        NewSafEntry {
            service: "cups".into(),
            direction: Direction::ToPeer,
            kind: SafKind::Reversal,
            mti: "0420".into(),
            payload: vec![1, 2, 3],
            keys: SafKeys {
                pan_masked: Some("623456******1234".into()),
                ..SafKeys::default()
            },
            created_at: 1_000,
            expires_at: 2_000,
            first_attempt_at: 1_000,
        }
    }

    fn refused_field(e: NewSafEntry) -> &'static str {
        match e.validate() {
            Err(StoreError::InvalidEntry { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_masked_entry_passes() {
        assert!(entry().validate().is_ok());
    }

    #[test]
    fn a_full_pan_is_refused() {
        let mut e = entry();
        e.keys.pan_masked = Some("6234567890121234".into());
        assert_eq!(refused_field(e), "pan_masked");
    }

    #[test]
    fn bad_mti_and_empty_payload_and_deadline_are_refused() {
        let mut e = entry();
        e.mti = "042".into();
        assert_eq!(refused_field(e), "mti");
        let mut e = entry();
        e.payload.clear();
        assert_eq!(refused_field(e), "payload");
        let mut e = entry();
        e.expires_at = 999;
        assert_eq!(refused_field(e), "expires_at");
        let mut e = entry();
        e.direction = Direction::ToNode(String::new());
        assert_eq!(refused_field(e), "direction");
    }

    #[test]
    fn debug_never_shows_the_payload() {
        let mut e = entry();
        e.payload = b"4761739001010119".to_vec();
        let shown = format!("{e:?}");
        let bytes = format!("{:?}", e.payload);
        assert!(!shown.contains(&bytes[1..bytes.len() - 1]), "{shown}");
        assert!(shown.contains("payload_len: 16"), "{shown}");
    }

    #[test]
    fn clip_cuts_on_a_char_boundary() {
        let long = "é".repeat(MAX_TEXT + 5);
        assert_eq!(clip(&long).chars().count(), MAX_TEXT);
        assert_eq!(clip("short"), "short");
        assert_eq!(clip("a\0b"), "a\u{FFFD}b");
    }

    #[test]
    fn nul_and_impossible_times_are_refused() {
        let mut e = entry();
        e.service = "cu\0ps".into();
        assert_eq!(refused_field(e), "service");
        let mut e = entry();
        e.keys.f37 = Some("12\0".into());
        assert_eq!(refused_field(e), "f37");
        let mut e = entry();
        e.expires_at = MAX_TIME + 1;
        assert_eq!(refused_field(e), "expires_at");
        let mut e = entry();
        e.created_at = -1;
        assert_eq!(refused_field(e), "created_at");
        assert!(check_time("now", MAX_TIME).is_ok());
    }

    #[test]
    fn column_text_round_trips() {
        for s in [
            SafState::Pending,
            SafState::Delivered,
            SafState::Dead,
            SafState::Dropped,
        ] {
            assert_eq!(s.as_str().parse::<SafState>().ok(), Some(s));
        }
        assert!("lost".parse::<SafState>().is_err());
        assert_eq!(
            Direction::from_columns("to_node", Some("02".into())).ok(),
            Some(Direction::ToNode("02".into()))
        );
        assert!(Direction::from_columns("to_node", None).is_err());
    }
}
