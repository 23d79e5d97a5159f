//! The service configuration: TOML through the `config` crate, with environment
//! overrides (`ISOSWITCH__SERVICE__0__BACK__NODE__1__WEIGHT=3` style), validated
//! at load with errors that name the key.

use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::iso8583::Spec;
use crate::iso8583::SpecFiles;
use crate::route::{DeclineCodes, F37Stamp, NODE_ID_MAX, NodeId, RuleSet};
pub use crate::route::{KeyPart, TpduPolicy, default_key};
use crate::util::{duration, name};

pub mod admin;
mod back;
mod capture;
mod defaults;
pub mod descriptors;
mod env;
mod front;
pub mod host_port;
pub mod integrity;
pub mod journal;
mod reason;
pub use reason::Reason;
pub mod space;
pub mod strict;
#[cfg(test)]
mod tests;
pub mod tls;
mod validate;

pub use admin::AdminConfig;
pub use back::{BackConfig, CheckKind, HealthCheckConfig, NodeConfig};
pub use capture::{CLEAR_NEEDS_TOOLS, CaptureConfig};
pub use env::{EnvOverride, env_overrides};
use env::{blame, reason};
pub use front::{
    BadMessagePolicy, ConnectFront, FrontConfig, LinkSet, ListenFront, ListenMode,
    OneConnectConfig, SignOn, SimplexFront, StampBy,
};
pub use validate::unswitchable;

pub use integrity::{
    Advices, DuplicateAction, IntegrityConfig, LateApproval, SwitchMadePolicy, TimeoutConfig,
    TimeoutRule,
};

/// Everything `isoswitch run` needs.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Services, each joining one front to one back.
    #[serde(rename = "service", default)]
    pub services: Vec<ServiceConfig>,
    /// The admin HTTP listener (API, metrics, status page); off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin: Option<AdminConfig>,
    /// Where the switch keeps what outlives a run (the operators' runtime
    /// node changes). `isoswitch run` falls back to `$STATE_DIRECTORY`, then
    /// `./isoswitch-data` (`ops::data_dir`); a switch started in process
    /// without one keeps nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// `[store]`: where what the switch owes is kept (SQLite in the data dir
    /// by default, PostgreSQL for a pair of instances; docs/store.md).
    #[serde(default)]
    pub store: crate::store::StoreConfig,
    /// `[journal]`: the transaction journal in the store (docs/journal.md).
    #[serde(default)]
    pub journal: journal::JournalConfig,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    pub name: String,
    /// A built-in spec name (`cups`, `cup-pos`, ...) or a path to a spec TOML file.
    pub spec: String,
    pub front: FrontConfig,
    pub back: BackConfig,
    #[serde(default)]
    pub correlation: CorrelationConfig,
    #[serde(default)]
    pub timeouts: TimeoutConfig,
    /// `[service.integrity]`: late approvals, advices, repeats, and whether
    /// the switch may answer for a node at all.
    #[serde(default)]
    pub integrity: IntegrityConfig,
    /// F39 codes of switch-made responses, per reason.
    #[serde(default)]
    pub declines: DeclineCodes,
    /// Stamp the node ID into F37 of requests sent to nodes (and route on it).
    #[serde(default)]
    pub f37_stamp: Option<F37Stamp>,
    /// MTIs (patterns like `02x0`) of the requests this service routes; any
    /// other request fails ingress validation. Empty = every request MTI.
    #[serde(default)]
    pub accept_mti: Vec<String>,
    /// The template of the switch's own network-management requests (node
    /// echo checks; sign-on, sign-off and echo on peer links).
    #[serde(default)]
    pub network: NetworkConfig,
    /// `[service.capture]`: pcapng capture of this service's connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<CaptureConfig>,
}

/// `[service.network]`: what the switch's own network-management requests
/// carry. F7 (now, UTC), F11 (the service's next STAN) and F70 (per dialect)
/// are made per message.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkConfig {
    /// Request MTI (e.g. `0800`, `0820`); default: the spec's echo MTI.
    #[serde(default)]
    pub mti: Option<String>,
    /// TPDU (10 hex digits, `60` first) for dialects with one; default `6000000000`.
    #[serde(default)]
    pub tpdu: Option<String>,
    /// POS header (12 hex digits); default `603100310730`.
    #[serde(default)]
    pub pos_header: Option<String>,
    /// Header destination ID: CUPS institution (≤ 11 characters; default the
    /// simplex front's `peer_id`) or VISA station (6 digits; default `000000`).
    #[serde(default)]
    pub destination_id: Option<String>,
    /// Header source ID (default: the simplex front's `member_id`, or `000000`).
    #[serde(default)]
    pub source_id: Option<String>,
    /// Fixed fields by number (`F33 = "03105840"`), text form.
    #[serde(default)]
    pub fields: std::collections::BTreeMap<String, String>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CorrelationConfig {
    /// Parts of the key that ties a response to its request: `tpdu` (the TPDU
    /// address pair, in either order) or a field number. Empty = the spec's default.
    #[serde(default)]
    pub key: Vec<KeyPart>,
    /// TPDU of responses sent to clients.
    #[serde(default)]
    pub tpdu_on_response: TpduPolicy,
    /// Requests in flight per service; past it new requests are declined.
    #[serde(default = "defaults::max_in_flight")]
    pub max_in_flight: usize,
}

impl Default for CorrelationConfig {
    fn default() -> Self {
        CorrelationConfig {
            key: Vec::new(),
            tpdu_on_response: TpduPolicy::default(),
            max_in_flight: defaults::max_in_flight(),
        }
    }
}

/// A configuration that cannot be used, naming the key.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read configuration: {0}")]
    Load(#[from] config::ConfigError),
    // The reason is boxed: a config error is returned through every check
    // and wrapped by the commands that load one (clippy's
    // result_large_err), and it is only ever made once.
    #[error("{key}: {reason}")]
    Invalid { key: String, reason: Box<Reason> },
    /// A value set by an environment variable, named first.
    #[error("{var} (sets {key}): {reason}")]
    Env {
        var: String,
        key: String,
        reason: Box<Reason>,
    },
}

fn invalid(key: impl Into<String>, reason: impl Into<Reason>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: Box::new(reason.into()),
    }
}

/// Environment variables with this prefix override file keys: `__` separates
/// levels, e.g. `ISOSWITCH__SERVICE__0__TIMEOUTS__REQUEST=5s`.
pub const ENV_PREFIX: &str = "ISOSWITCH";

/// The embedded default configuration (`src/ops/default.toml`).
pub const DEFAULT_TOML: &str = include_str!("ops/default.toml");
