//! `[service.back]`: the node pool behind a service, its nodes and their
//! health checks. Types only; the checks across sections are in `validate`.

use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::{defaults, host_port, reason, strict, tls};
use crate::route::{Algorithm, HealthConfig, RuleConfig};
use crate::util::duration;

/// The node pool behind a service.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackConfig {
    /// Duplex connections kept to each node, shared by all clients.
    #[serde(default = "defaults::connections_per_node")]
    pub connections_per_node: usize,
    /// `round-robin`, `weighted`, `least-outstanding`, `peak-ewma` or `sticky`.
    #[serde(default)]
    pub algorithm: Algorithm,
    /// The field whose value the `sticky` algorithm hashes (F41, terminal ID).
    #[serde(default = "defaults::sticky_field")]
    pub sticky_field: u16,
    /// Priority groups: use the highest group with at least this many eligible nodes.
    #[serde(default = "defaults::min_active")]
    pub min_active: usize,
    /// Messages queued for writing on one node connection before requests are
    /// declined with the queue-full code.
    #[serde(default = "defaults::write_queue")]
    pub write_queue: usize,
    #[serde(default = "defaults::connect_timeout", with = "duration")]
    pub connect_timeout: Duration,
    /// A node that starts a frame must finish it within this, or its
    /// connection is closed (and what it carried declined).
    #[serde(default = "defaults::partial_frame_timeout", with = "duration")]
    pub partial_frame_timeout: Duration,
    /// Reconnect backoff: starts here, doubles with jitter, up to `reconnect_max`.
    #[serde(default = "defaults::reconnect_min", with = "duration")]
    pub reconnect_min: Duration,
    #[serde(default = "defaults::reconnect_max", with = "duration")]
    pub reconnect_max: Duration,
    #[serde(default, deserialize_with = "HealthCheckConfig::deserialize_strict")]
    pub health: HealthCheckConfig,
    /// Directed routing: the first rule a request matches restricts its nodes.
    #[serde(default, rename = "rule")]
    pub rules: Vec<RuleConfig>,
    #[serde(rename = "node")]
    pub nodes: Vec<NodeConfig>,
    /// Where a node added through the admin API may be: CIDRs. Empty (the
    /// default): the configured nodes' own addresses (each a /32 or /128),
    /// so an operator's token cannot send card data to a new host; a
    /// network is opened here, under change control. See
    /// [`BackConfig::allowed_networks`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_networks: Vec<IpNet>,
    /// `[service.back.tls]`: node links speak TLS (docs/tls.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<tls::TlsClient>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Short ID, also the F37 stamp.
    pub id: String,
    #[serde(with = "host_port")]
    pub address: SocketAddr,
    #[serde(default = "defaults::weight")]
    pub weight: u32,
    /// Higher is preferred.
    #[serde(default)]
    pub priority: u32,
    /// `enabled`, `drain` or `disabled`.
    #[serde(default)]
    pub admin: crate::route::AdminState,
}

/// Active health checks and passive ejection. A flattened struct cannot use
/// `deny_unknown_fields` (serde hands it only the keys it knows: typos were
/// ignored), so `BackConfig` reads this through
/// `HealthCheckConfig::deserialize_strict`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct HealthCheckConfig {
    #[serde(default)]
    pub check: CheckKind,
    #[serde(default = "defaults::check_interval", with = "duration")]
    pub interval: Duration,
    #[serde(default = "defaults::check_timeout", with = "duration")]
    pub timeout: Duration,
    /// Thresholds, ejection and slow start.
    #[serde(flatten)]
    pub state: HealthConfig,
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        HealthCheckConfig {
            check: CheckKind::default(),
            interval: defaults::check_interval(),
            timeout: defaults::check_timeout(),
            state: HealthConfig::default(),
        }
    }
}

impl HealthCheckConfig {
    /// Refuses keys neither this struct nor [`HealthConfig`] prints, then reads
    /// the [`HealthConfig`] keys apart: through `flatten` serde would buffer
    /// them, losing the key of an error and the conversion of an environment
    /// override ("7") to a number. Keys added to either struct need nothing here.
    fn deserialize_strict<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = config::Value::deserialize(d)?;
        strict::check_keys::<Self, D::Error>(&value)?;
        let table = value
            .into_table()
            .map_err(|e| D::Error::custom(reason(&e)))?;
        let state_keys = strict::keys_of::<HealthConfig, D::Error>()?;
        let (state, own): (config::Map<_, _>, config::Map<_, _>) =
            table.into_iter().partition(|(k, _)| state_keys.contains(k));
        let mut cfg: HealthCheckConfig = strict::inner(config::Value::new(None, own))?;
        cfg.state = strict::inner(config::Value::new(None, state))?;
        Ok(cfg)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckKind {
    /// A TCP connect to the node's address.
    Tcp,
    /// The spec's echo test over a node connection, answered within the timeout.
    #[default]
    Echo,
    /// No active checks: connection state and passive ejection only.
    None,
}
