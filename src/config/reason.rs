//! Why a configured value is refused: the reason half of
//! [`ConfigError::Invalid`](super::ConfigError::Invalid) (the key is the
//! other). Typed so that a check states its rule once, a value that breaks
//! it is kept as the value, and an error from the layer that refused it
//! (the spec, the routing rules, TLS) stays that error, as its source.
//!
//! Two kinds are still text, on purpose: [`Reason::Rule`], a rule stated
//! where it is checked (a `&'static str`, fixed at compile time), and
//! [`Reason::Parse`], the deserializer's own message (serde and the
//! `config` crate word it; the switch only moves the path it starts with
//! onto the key).

use std::net::SocketAddr;

use thiserror::Error;

use crate::iso8583::{IsoError, SpecError};
use crate::route::timeouts::BadPattern;
use crate::route::{HealthConfigError, NODE_ID_MAX, NodeIdError, RuleError, StampError};
use crate::util::name;

use super::tls::TlsError;

/// Why the value at a config key cannot be used.
#[derive(Debug, Error)]
pub enum Reason {
    /// A rule stated at its check (`must be > 0`, `needs client_ca ...`).
    #[error("{0}")]
    Rule(&'static str),
    /// The deserializer's message (a type error, an unknown key, a value
    /// that does not parse), free text from serde or the `config` crate.
    #[error("{0}")]
    Parse(String),
    #[error("`{}`: must be {}", .0.escape_debug(), name::NAME_RULE)]
    BadName(String),
    #[error("duplicate service name `{0}`")]
    DuplicateService(String),
    #[error(
        "`{}`: must be 1 to {NODE_ID_MAX} characters, each a letter, a digit, `_`, `.` or `-`",
        .0.escape_debug()
    )]
    BadNodeId(String),
    #[error("duplicate node id `{0}`")]
    DuplicateNode(String),
    #[error("{address} is outside {back}.allowed_networks")]
    OutsideNetworks { address: SocketAddr, back: String },
    #[error("`{}` is not the ID of a node in [service.back]", .0.escape_debug())]
    UnknownNode(String),
    #[error("`{}` is listed twice", .0.escape_debug())]
    ListedTwice(String),
    #[error("`{}` is not a 2-character response code", .0.escape_debug())]
    NotAResponseCode(String),
    #[error("{0} is not a data field (2..=128)")]
    NotADataField(u16),
    #[error("`{0}` is not an MTI pattern: four digits or `x`, such as `02x0`")]
    NotAnMtiPattern(String),
    #[error("`{}` cannot be opened: only GET on {openable} can go without the token", .path.escape_debug())]
    NotOpenable { path: String, openable: String },
    /// `advices = "store-and-forward"` on a front that cannot acknowledge
    /// a stored advice: why not.
    #[error("`store-and-forward`: {0}")]
    CannotStoreAdvices(&'static str),
    #[error("spec `{spec}` has no field {id}")]
    SpecLacksField { spec: String, id: u16 },
    #[error("spec `{0}` has no TPDU")]
    SpecLacksTpdu(String),
    #[error("not values of spec `{spec}`'s F39: {source}")]
    NotF39Values {
        spec: String,
        #[source]
        source: IsoError,
    },
    /// The spec serves decode only: its F39 is not two characters.
    #[error(
        "`{spec}`: F39 is {}{length} characters; the switch answers and reads 2-character response codes, so this spec serves decode, capture and replay only",
        if *.fixed { "" } else { "up to " }
    )]
    F39NotTwo {
        spec: String,
        fixed: bool,
        length: usize,
    },
    #[error("`{0}` has no F39: the switch could not decline or read an answer")]
    NoF39(String),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    NodeId(#[from] NodeIdError),
    #[error(transparent)]
    Rules(#[from] RuleError),
    #[error(transparent)]
    Health(#[from] HealthConfigError),
    #[error(transparent)]
    Stamp(#[from] StampError),
    #[error(transparent)]
    MtiPattern(#[from] BadPattern),
    /// A TLS table refused (the key is the error's own).
    #[error("{}", .0.reason())]
    Tls(#[source] TlsError),
    /// An environment variable's index past the end of the list it sets.
    #[error("index {index} is past the {len} configured")]
    PastTheList { index: usize, len: usize },
    /// An environment variable's numeric level on a key that is no list.
    #[error("`{0}` indexes a list, and this key is not one")]
    NotAList(String),
}

impl From<&'static str> for Reason {
    fn from(rule: &'static str) -> Self {
        Reason::Rule(rule)
    }
}

impl From<TlsError> for Reason {
    fn from(e: TlsError) -> Self {
        Reason::Tls(e)
    }
}
