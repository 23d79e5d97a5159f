//! The service configuration: TOML through the `config` crate, with environment
//! overrides (`ISOSWITCH__SERVICE__0__BACK__NODE__1__WEIGHT=3` style), validated
//! at load with errors that name the key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::iso8583::Spec;
use crate::iso8583::SpecFiles;
use crate::route::{
    Algorithm, DeclineCodes, F37Stamp, HealthConfig, NODE_ID_MAX, NodeId, RuleConfig, RuleSet,
};
pub use crate::route::{KeyPart, TpduPolicy, default_key};
use crate::util::{duration, name};

pub mod admin;
mod defaults;
pub mod descriptors;
mod env;
pub mod host_port;
pub mod integrity;
pub mod journal;
pub mod space;
pub mod strict;
#[cfg(test)]
mod tests;
pub mod tls;
mod validate;

pub use admin::AdminConfig;
pub use env::{EnvOverride, env_overrides};
use env::{blame, reason};
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

/// `[service.capture]`: what the switch captures of a service and where.
/// See docs/capture.md.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureConfig {
    /// Directory of the pcapng files (created if missing).
    pub directory: std::path::PathBuf,
    #[serde(default = "defaults::capture_enabled")]
    pub enabled: bool,
    /// A file is closed and the next one opened past this size.
    #[serde(default = "defaults::capture_max_file_bytes")]
    pub max_file_bytes: u64,
    /// The oldest files are deleted past this many...
    #[serde(default = "defaults::capture_max_files")]
    pub max_files: usize,
    /// ...or past this many bytes in all.
    #[serde(default = "defaults::capture_max_total_bytes")]
    pub max_total_bytes: u64,
    /// The free space left on the directory's filesystem (none: 10%); under
    /// it the oldest files go, then the capture pauses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_free: Option<space::SpaceLimit>,
    /// Keep PAN, track data, PIN blocks, EMV data and MACs in clear (test
    /// systems only: logged as a warning at start). Only in builds with the
    /// `tools` feature: the production build refuses it ([`CLEAR_NEEDS_TOOLS`]).
    #[serde(default)]
    pub clear: bool,
    /// Notices queued for the writer, and reads/writes a connection direction
    /// stages between two passes of it; past either, copies are dropped and
    /// counted.
    #[serde(default = "defaults::capture_queue")]
    pub queue: usize,
}

/// Why `capture.clear` (and `run --capture-clear`) is refused by a build
/// without the `tools` feature: the production switch never writes card data
/// in clear, whatever its configuration says.
pub const CLEAR_NEEDS_TOOLS: &str = "captures in clear (card data unmasked) are only in builds with the `tools` feature, for test systems; this build (the production one) masks every capture: remove the key";

impl CaptureConfig {
    /// A capture into `directory` with every other setting at its default
    /// (`run --capture DIR`).
    pub fn in_directory(directory: std::path::PathBuf) -> CaptureConfig {
        CaptureConfig {
            directory,
            enabled: true,
            max_file_bytes: defaults::capture_max_file_bytes(),
            max_files: defaults::capture_max_files(),
            max_total_bytes: defaults::capture_max_total_bytes(),
            min_free: None,
            clear: false,
            queue: defaults::capture_queue(),
        }
    }

    /// `run --capture DIR [--capture-clear]`: every service captures into
    /// `directory`, keeping its own `[service.capture]` limits if it has them.
    pub fn apply_to_all(config: &mut Config, directory: &std::path::Path, clear: bool) {
        for svc in &mut config.services {
            let mut c = svc
                .capture
                .take()
                .unwrap_or_else(|| CaptureConfig::in_directory(directory.to_path_buf()));
            c.directory = directory.to_path_buf();
            c.enabled = true;
            c.clear = clear;
            svc.capture = Some(c);
        }
    }

    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.clear && !cfg!(feature = "tools") {
            return Err(invalid(format!("{key}.clear"), CLEAR_NEEDS_TOOLS));
        }
        if self.max_file_bytes < 4096 {
            return Err(invalid(
                format!("{key}.max_file_bytes"),
                "must be at least 4096",
            ));
        }
        if self.max_files == 0 {
            return Err(invalid(format!("{key}.max_files"), "must be at least 1"));
        }
        if self.max_total_bytes < self.max_file_bytes {
            return Err(invalid(
                format!("{key}.max_total_bytes"),
                "must be at least max_file_bytes",
            ));
        }
        if self.queue == 0 {
            return Err(invalid(format!("{key}.queue"), "must be at least 1"));
        }
        if matches!(self.min_free, Some(space::SpaceLimit::Percent(p)) if p >= 10_000) {
            return Err(invalid(
                format!("{key}.min_free"),
                "must be less than 100% (the capture would never write)",
            ));
        }
        Ok(())
    }
}

/// Where the service's clients come from. Read by hand (below) rather than as
/// a serde internally tagged enum, which buffers the table and so loses the
/// path of errors inside it.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FrontConfig {
    /// Clients connect to the switch; duplex, many requests in flight per connection.
    Listen(ListenFront),
    /// UnionPay's split simplex links: the switch connects N out links and only
    /// writes on them; the peer connects N in links and only writes on them.
    Simplex(SimplexFront),
    /// Duplex links the switch connects to the peer (VISA): both directions on
    /// every link, and the peer may answer on any of them.
    Connect(ConnectFront),
}

impl<'de> Deserialize<'de> for FrontConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = config::Value::deserialize(d)?
            .into_table()
            .map_err(|e| D::Error::custom(reason(&e)))?;
        let kind = table
            .remove("kind")
            .ok_or_else(|| D::Error::missing_field("kind"))?
            .into_string()
            .map_err(|e| D::Error::custom(format!("kind: {}", reason(&e))))?;
        let rest = config::Value::new(None, table);
        match kind.as_str() {
            "listen" => strict::inner(rest).map(FrontConfig::Listen),
            "simplex" => strict::inner(rest).map(FrontConfig::Simplex),
            "connect" => strict::inner(rest).map(FrontConfig::Connect),
            other => Err(D::Error::unknown_variant(
                other,
                &["listen", "simplex", "connect"],
            )),
        }
    }
}

/// The `connect` front: N duplex links from the switch to the peer.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectFront {
    /// The peer's address (`host:port`, resolved at load).
    #[serde(with = "host_port")]
    pub connect: SocketAddr,
    /// Duplex links kept up.
    pub links: usize,
    /// Send a keep-alive (a zero-length frame) on a link idle this long.
    #[serde(default = "defaults::keepalive_idle", with = "duration")]
    pub keepalive_idle: Duration,
    #[serde(default = "defaults::partial_frame_timeout", with = "duration")]
    pub partial_frame_timeout: Duration,
    #[serde(default = "defaults::connect_timeout", with = "duration")]
    pub connect_timeout: Duration,
    #[serde(default = "defaults::reconnect_min", with = "duration")]
    pub reconnect_min: Duration,
    #[serde(default = "defaults::reconnect_max", with = "duration")]
    pub reconnect_max: Duration,
    #[serde(default)]
    pub rebuild_group: bool,
    /// Sign-on on each link as it comes up; VISA links usually need none.
    #[serde(default = "defaults::no_sign_on")]
    pub sign_on: SignOn,
    #[serde(default = "defaults::sign_on_retry", with = "duration")]
    pub sign_on_retry: Duration,
    #[serde(default = "defaults::echo_interval", with = "duration")]
    pub echo_interval: Duration,
    #[serde(default = "defaults::yes")]
    pub answer_network_management: bool,
    #[serde(default)]
    pub stamp_by: StampBy,
    #[serde(default = "defaults::write_queue")]
    pub write_queue: usize,
    /// `[service.front.tls]`: the links speak TLS (docs/tls.md). Boxed, as
    /// are the simplex front's: the front enum stays small.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Box<tls::TlsClient>>,
}

/// What the link-set machinery needs of a `simplex` or `connect` front.
#[derive(Clone, Debug)]
pub struct LinkSet {
    pub connect: SocketAddr,
    pub links: usize,
    pub keepalive_idle: Duration,
    pub partial_frame_timeout: Duration,
    pub connect_timeout: Duration,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    pub rebuild_group: bool,
    pub sign_on: SignOn,
    pub sign_on_retry: Duration,
    pub echo_interval: Duration,
    pub write_queue: usize,
    /// Links carry the peer's frames too (connect), not only ours (simplex).
    pub duplex: bool,
    /// The links the switch connects speak TLS.
    pub tls: Option<Box<tls::TlsClient>>,
}

impl FrontConfig {
    /// The link set of a `simplex` or `connect` front.
    pub fn link_set(&self) -> Option<LinkSet> {
        // Both fronts name these keys alike.
        macro_rules! link_set {
            ($f:expr, $duplex:expr) => {
                LinkSet {
                    connect: $f.connect,
                    links: $f.links,
                    keepalive_idle: $f.keepalive_idle,
                    partial_frame_timeout: $f.partial_frame_timeout,
                    connect_timeout: $f.connect_timeout,
                    reconnect_min: $f.reconnect_min,
                    reconnect_max: $f.reconnect_max,
                    rebuild_group: $f.rebuild_group,
                    sign_on: $f.sign_on,
                    sign_on_retry: $f.sign_on_retry,
                    echo_interval: $f.echo_interval,
                    write_queue: $f.write_queue,
                    duplex: $duplex,
                    tls: $f.tls.clone(),
                }
            };
        }
        match self {
            FrontConfig::Listen(_) => None,
            FrontConfig::Simplex(f) => Some(link_set!(f, false)),
            FrontConfig::Connect(f) => Some(link_set!(f, true)),
        }
    }

    /// Whether the switch answers the peer's network management itself.
    pub fn answers_network_management(&self) -> bool {
        match self {
            FrontConfig::Listen(_) => false,
            FrontConfig::Simplex(f) => f.answer_network_management,
            FrontConfig::Connect(f) => f.answer_network_management,
        }
    }

    /// Who stamps F37 of node-originated requests (link-set fronts only).
    pub fn stamp_by(&self) -> Option<StampBy> {
        match self {
            FrontConfig::Listen(_) => None,
            FrontConfig::Simplex(f) => Some(f.stamp_by),
            FrontConfig::Connect(f) => Some(f.stamp_by),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SimplexFront {
    /// The peer's address the out links connect to.
    #[serde(with = "host_port")]
    pub connect: SocketAddr,
    /// Where the peer's in links connect.
    #[serde(with = "host_port")]
    pub listen: SocketAddr,
    /// Out links kept up (8 for a large member, 2 for a small one).
    pub links: usize,
    /// In links accepted at once; default `links`.
    #[serde(default)]
    pub max_in_links: Option<usize>,
    /// Peer networks allowed to open in links; empty allows any.
    #[serde(default)]
    pub allow: Vec<IpNet>,
    /// Send a keep-alive (`0000`) on an out link idle this long.
    #[serde(default = "defaults::keepalive_idle", with = "duration")]
    pub keepalive_idle: Duration,
    /// Close an in link silent (not even a keep-alive) this long.
    #[serde(default = "defaults::in_link_silence", with = "duration")]
    pub in_link_silence: Duration,
    #[serde(default = "defaults::partial_frame_timeout", with = "duration")]
    pub partial_frame_timeout: Duration,
    #[serde(default = "defaults::connect_timeout", with = "duration")]
    pub connect_timeout: Duration,
    #[serde(default = "defaults::reconnect_min", with = "duration")]
    pub reconnect_min: Duration,
    #[serde(default = "defaults::reconnect_max", with = "duration")]
    pub reconnect_max: Duration,
    /// When one out link breaks, close and rebuild every out link (some
    /// operators treat the links as a group).
    #[serde(default)]
    pub rebuild_group: bool,
    /// Sign on (0820 F70 001) when out links come up: per link, once per
    /// group, or not at all. A link carries traffic only once signed on.
    #[serde(default)]
    pub sign_on: SignOn,
    /// Resend an unanswered sign-on after this long.
    #[serde(default = "defaults::sign_on_retry", with = "duration")]
    pub sign_on_retry: Duration,
    /// Send an echo test (0820 F70 301) on each out link this often; 0 = never.
    #[serde(default = "defaults::echo_interval", with = "duration")]
    pub echo_interval: Duration,
    /// Answer the peer's network management (0820/0800) on an out link without
    /// the nodes; false forwards it to the nodes like any request.
    #[serde(default = "defaults::yes")]
    pub answer_network_management: bool,
    /// Who stamps F37 of node-originated requests: the `switch` (default) or the
    /// `node` itself (the switch checks the stamp names the sending node).
    #[serde(default)]
    pub stamp_by: StampBy,
    /// Our institution ID: source of switch-made network management messages.
    pub member_id: String,
    /// The peer's institution ID: their destination.
    pub peer_id: String,
    /// Frames queued per out link before new requests are declined.
    #[serde(default = "defaults::write_queue")]
    pub write_queue: usize,
    /// `[service.front.tls]`: out links speak TLS (docs/tls.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Box<tls::TlsClient>>,
    /// `[service.front.in_tls]`: in links speak TLS (docs/tls.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_tls: Option<Box<tls::TlsServer>>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SignOn {
    /// Each out link signs on by itself when it comes up.
    #[default]
    PerLink,
    /// One sign-on when the first out link of the group comes up.
    PerGroup,
    /// No sign-on: links carry traffic as soon as they are up.
    None,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StampBy {
    #[default]
    Switch,
    Node,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenFront {
    #[serde(with = "host_port")]
    pub listen: SocketAddr,
    /// Client connections open at once; the next one is closed at accept.
    #[serde(default = "defaults::max_connections")]
    pub max_connections: usize,
    /// Client connections open at once from one source IP.
    #[serde(default = "defaults::max_per_source")]
    pub max_per_source: usize,
    /// Source networks allowed to connect; empty allows any.
    #[serde(default)]
    pub allow: Vec<IpNet>,
    /// A client link silent this long is closed; keep-alives reset it. 0 = never.
    #[serde(default = "defaults::idle_timeout", with = "duration")]
    pub idle_timeout: Duration,
    /// A frame started but not finished within this time closes the link.
    #[serde(default = "defaults::partial_frame_timeout", with = "duration")]
    pub partial_frame_timeout: Duration,
    /// What to do with a request that fails ingress validation (a frame whose
    /// length prefix is fine but whose message is not, or an MTI the service
    /// does not accept).
    #[serde(default)]
    pub on_bad_message: BadMessagePolicy,
    /// Requests one client connection may have in flight; past it its new
    /// requests are declined with the queue-full code at once, so that one
    /// client can never fill the service's correlation table alone.
    #[serde(default = "defaults::max_in_flight_per_connection")]
    pub max_in_flight_per_connection: usize,
    /// Requests all connections from one source IP may have in flight together.
    #[serde(default = "defaults::max_in_flight_per_source")]
    pub max_in_flight_per_source: usize,
    /// Messages queued for writing to one client before new requests from it are
    /// declined.
    #[serde(default = "defaults::write_queue")]
    pub write_queue: usize,
    /// How node connections carry this front's requests: `multiplex` (many in
    /// flight per connection, answers matched by key) or `oneconnect`.
    #[serde(default)]
    pub mode: ListenMode,
    /// The `oneconnect` pool's settings (used only in that mode).
    #[serde(default)]
    pub oneconnect: OneConnectConfig,
    /// `[service.front.tls]`: clients speak TLS (docs/tls.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<tls::TlsServer>,
}

/// How a `listen` front's requests use the node connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ListenMode {
    /// K shared connections per node, many requests in flight on each, each
    /// response matched to its request by the correlation key.
    #[default]
    Multiplex,
    /// F5's OneConnect: a pool of up to `connections_per_node` connections per
    /// node, each carrying one request at a time, so the response needs no
    /// key (for nodes that echo no usable key field).
    Oneconnect,
}

/// The `oneconnect` pool of a `listen` front.
#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OneConnectConfig {
    /// A pooled node connection unused this long is closed.
    #[serde(default = "defaults::oneconnect_idle", with = "duration")]
    pub idle_timeout: Duration,
}

impl Default for OneConnectConfig {
    fn default() -> Self {
        OneConnectConfig {
            idle_timeout: defaults::oneconnect_idle(),
        }
    }
}

/// A request that fails ingress validation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BadMessagePolicy {
    /// Answer it with a response built from what could be read (MTI + 10,
    /// TPDU swapped, echoed key fields, F39 = `declines.bad_message`); a
    /// request too broken to answer is dropped. The connection stays.
    #[default]
    Decline,
    /// Log (masked), count and close that client's connection.
    Close,
    /// Log (masked), count and drop the frame; the connection stays.
    Drop,
}

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
    #[error("{key}: {reason}")]
    Invalid { key: String, reason: String },
    /// A value set by an environment variable, named first.
    #[error("{var} (sets {key}): {reason}")]
    Env {
        var: String,
        key: String,
        reason: String,
    },
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// Environment variables with this prefix override file keys: `__` separates
/// levels, e.g. `ISOSWITCH__SERVICE__0__TIMEOUTS__REQUEST=5s`.
pub const ENV_PREFIX: &str = "ISOSWITCH";

/// The embedded default configuration (`src/ops/default.toml`).
pub const DEFAULT_TOML: &str = include_str!("ops/default.toml");
