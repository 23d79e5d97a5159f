//! Switch-made answers: why the switch declined a request, and which F39
//! response code says so.
//!
//! Defaults (override per service in config):
//!
//! | reason | F39 | meaning |
//! |---|---|---|
//! | `timeout` | `68` | response received too late: the issuer may have acted, so this is the code that tells the acquirer to reverse |
//! | `node_lost` | `91` | issuer or switch inoperative: the node's connection died with the request in flight |
//! | `no_healthy_node` | `91` | no node could take it |
//! | `queue_full` | `96` | system malfunction: a switch limit was hit |
//! | `duplicate` | `94` | duplicate transmission: the same key is already in flight |
//! | `shutdown` | `91` | the switch is stopping |
//! | `bad_message` | `30` | format error: the request failed ingress validation |

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::correlator::CorrelateError;

/// Why the switch answered a request itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeclineReason {
    /// No response by the deadline.
    Timeout,
    /// The node's connection died with the request in flight.
    NodeLost,
    /// No node was eligible for the request.
    NoHealthyNode,
    /// A queue or the correlation table was full.
    QueueFull,
    /// The request's correlation key was already in flight.
    Duplicate,
    /// The switch is shutting down.
    Shutdown,
    /// The request failed ingress validation (format error).
    BadMessage,
}

impl DeclineReason {
    pub const ALL: [DeclineReason; 7] = [
        DeclineReason::Timeout,
        DeclineReason::NodeLost,
        DeclineReason::NoHealthyNode,
        DeclineReason::QueueFull,
        DeclineReason::Duplicate,
        DeclineReason::Shutdown,
        DeclineReason::BadMessage,
    ];

    /// Does a decline for this reason say something about the node's health?
    /// Only a node's own fault does: a request it accepted and never answered.
    /// Shutdown, admin drain or disable, a connection that went away (the
    /// connection state already tells), a request that failed validation and
    /// the switch's own limits are not the node's fault.
    pub fn counts_against_node(self) -> bool {
        matches!(self, DeclineReason::Timeout)
    }

    /// A stable name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            DeclineReason::Timeout => "timeout",
            DeclineReason::NodeLost => "node-lost",
            DeclineReason::NoHealthyNode => "no-healthy-node",
            DeclineReason::QueueFull => "queue-full",
            DeclineReason::Duplicate => "duplicate",
            DeclineReason::Shutdown => "shutdown",
            DeclineReason::BadMessage => "bad-message",
        }
    }
}

impl fmt::Display for DeclineReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<CorrelateError> for DeclineReason {
    fn from(e: CorrelateError) -> Self {
        match e {
            CorrelateError::Duplicate => DeclineReason::Duplicate,
            CorrelateError::Full => DeclineReason::QueueFull,
        }
    }
}

/// An F39 response code: two ASCII letters or digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct ResponseCode([u8; 2]);

/// Text that is not a response code.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("response code `{0}` must be 2 ASCII letters or digits")]
pub struct BadResponseCode(String);

impl ResponseCode {
    pub fn new(code: &[u8]) -> Result<Self, BadResponseCode> {
        match code {
            &[a, b] if a.is_ascii_alphanumeric() && b.is_ascii_alphanumeric() => Ok(Self([a, b])),
            _ => Err(BadResponseCode(code.escape_ascii().to_string())),
        }
    }

    pub fn bytes(self) -> [u8; 2] {
        self.0
    }

    const fn of(code: &[u8; 2]) -> Self {
        Self(*code)
    }
}

impl TryFrom<String> for ResponseCode {
    type Error = BadResponseCode;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s.as_bytes())
    }
}

impl From<ResponseCode> for String {
    fn from(c: ResponseCode) -> String {
        c.0.iter().map(|&b| char::from(b)).collect()
    }
}

impl fmt::Debug for ResponseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResponseCode({})", self.0.escape_ascii())
    }
}

impl fmt::Display for ResponseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.escape_ascii())
    }
}

/// The F39 code of each [`DeclineReason`] for one service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeclineCodes {
    pub timeout: ResponseCode,
    pub node_lost: ResponseCode,
    pub no_healthy_node: ResponseCode,
    pub queue_full: ResponseCode,
    pub duplicate: ResponseCode,
    pub shutdown: ResponseCode,
    pub bad_message: ResponseCode,
}

impl Default for DeclineCodes {
    fn default() -> Self {
        Self {
            timeout: ResponseCode::of(b"68"),
            node_lost: ResponseCode::of(b"91"),
            no_healthy_node: ResponseCode::of(b"91"),
            queue_full: ResponseCode::of(b"96"),
            duplicate: ResponseCode::of(b"94"),
            shutdown: ResponseCode::of(b"91"),
            bad_message: ResponseCode::of(b"30"),
        }
    }
}

impl DeclineCodes {
    /// The F39 bytes to put in the switch-made response.
    pub fn code(&self, reason: DeclineReason) -> [u8; 2] {
        let c = match reason {
            DeclineReason::Timeout => self.timeout,
            DeclineReason::NodeLost => self.node_lost,
            DeclineReason::NoHealthyNode => self.no_healthy_node,
            DeclineReason::QueueFull => self.queue_full,
            DeclineReason::Duplicate => self.duplicate,
            DeclineReason::Shutdown => self.shutdown,
            DeclineReason::BadMessage => self.bad_message,
        };
        c.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let d = DeclineCodes::default();
        let got: Vec<[u8; 2]> = DeclineReason::ALL.iter().map(|&r| d.code(r)).collect();
        assert_eq!(
            got,
            [*b"68", *b"91", *b"91", *b"96", *b"94", *b"91", *b"30"]
        );
    }

    #[test]
    fn config_overrides_and_checks() {
        let d: DeclineCodes = toml::from_str("timeout = \"91\"\nqueue_full = \"N0\"").unwrap();
        assert_eq!(d.code(DeclineReason::Timeout), *b"91");
        assert_eq!(d.code(DeclineReason::QueueFull), *b"N0");
        assert_eq!(d.code(DeclineReason::Duplicate), *b"94");
        for bad in ["9", "911", "9 ", "é1"] {
            let text = format!("timeout = \"{bad}\"");
            assert!(toml::from_str::<DeclineCodes>(&text).is_err(), "{bad}");
        }
        assert!(toml::from_str::<DeclineCodes>("timeout_code = \"91\"").is_err());
        let round = toml::to_string(&d).unwrap();
        assert_eq!(toml::from_str::<DeclineCodes>(&round).unwrap(), d);
    }

    #[test]
    fn correlate_errors_map_to_reasons() {
        assert_eq!(
            DeclineReason::from(CorrelateError::Duplicate),
            DeclineReason::Duplicate
        );
        assert_eq!(
            DeclineReason::from(CorrelateError::Full),
            DeclineReason::QueueFull
        );
        assert_eq!(DeclineReason::NoHealthyNode.to_string(), "no-healthy-node");
        assert_eq!(ResponseCode::new(b"05").unwrap().to_string(), "05");
    }
}
