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

pub mod descriptors;
pub mod integrity;
pub mod journal;
pub mod tls;

pub use integrity::{
    Advices, IntegrityConfig, LateApproval, SwitchMadePolicy, TimeoutConfig, TimeoutRule,
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

/// `[admin]`: the admin HTTP listener. See docs/config.md.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Where the admin API listens; loopback by default.
    #[serde(default = "defaults::admin_listen")]
    pub listen: SocketAddr,
    /// A file holding the bearer token (first line). Without it the token
    /// comes from `ISOSWITCH_ADMIN_TOKEN`; with neither the switch refuses to
    /// start the listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Read-only paths served to GET without the token (for probes and
    /// scrapers): only [`AdminConfig::OPENABLE`] can be listed.
    #[serde(default = "defaults::admin_open_paths")]
    pub open_paths: Vec<String>,
    /// Admin connections served at once; past it the listener stops
    /// accepting (the kernel's backlog holds the rest). Also the admin's
    /// share of the switch's file descriptors.
    #[serde(default = "defaults::admin_max_connections")]
    pub max_connections: usize,
    /// Time a client has to send a request's headers, counted from the
    /// connection's start or the previous answer: also the idle limit of a
    /// kept-alive connection.
    #[serde(default = "defaults::admin_header_timeout", with = "duration")]
    pub header_timeout: Duration,
    /// Time for a whole request: its body, the work, and the client taking
    /// the answer (a client that stops reading is cut after it).
    #[serde(default = "defaults::admin_request_timeout", with = "duration")]
    pub request_timeout: Duration,
    /// Requests on one kept-alive connection; the last answer closes it.
    #[serde(default = "defaults::admin_max_requests_per_connection")]
    pub max_requests_per_connection: usize,
    /// `[admin.tls]`: serve HTTPS (docs/tls.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<tls::TlsServer>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: defaults::admin_listen(),
            token_file: None,
            open_paths: defaults::admin_open_paths(),
            max_connections: defaults::admin_max_connections(),
            header_timeout: defaults::admin_header_timeout(),
            request_timeout: defaults::admin_request_timeout(),
            max_requests_per_connection: defaults::admin_max_requests_per_connection(),
            tls: None,
        }
    }
}

impl AdminConfig {
    /// The paths `open_paths` may list: read-only ones. Nothing that changes
    /// the switch can be opened, and even these need the token for anything
    /// but GET.
    pub const OPENABLE: [&'static str; 4] = ["/healthz", "/readyz", "/metrics", "/"];

    fn validate(&self) -> Result<(), ConfigError> {
        for (i, path) in self.open_paths.iter().enumerate() {
            if !Self::OPENABLE.contains(&path.as_str()) {
                return Err(invalid(
                    format!("admin.open_paths[{i}]"),
                    format!(
                        "`{}` cannot be opened: only GET on {} can go without the token",
                        path.escape_debug(),
                        Self::OPENABLE.join(", ")
                    ),
                ));
            }
        }
        if !(1..=65_536).contains(&self.max_connections) {
            return Err(invalid("admin.max_connections", "must be within 1..=65536"));
        }
        if self.max_requests_per_connection == 0 {
            return Err(invalid("admin.max_requests_per_connection", "must be > 0"));
        }
        if self.header_timeout.is_zero() {
            return Err(invalid("admin.header_timeout", "must be > 0"));
        }
        if self.request_timeout.is_zero() {
            return Err(invalid("admin.request_timeout", "must be > 0"));
        }
        Ok(())
    }
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
    /// Keep PAN, track data, PIN blocks, EMV data and MACs in clear (test
    /// systems only: logged as a warning at start).
    #[serde(default)]
    pub clear: bool,
    /// Notices queued for the writer, and reads/writes a connection direction
    /// stages between two passes of it; past either, copies are dropped and
    /// counted.
    #[serde(default = "defaults::capture_queue")]
    pub queue: usize,
}

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

mod defaults {
    use std::time::Duration;

    pub fn admin_listen() -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], 9090))
    }

    pub fn admin_open_paths() -> Vec<String> {
        vec!["/healthz".into(), "/readyz".into(), "/metrics".into()]
    }
    pub fn admin_max_connections() -> usize {
        64
    }
    pub fn admin_header_timeout() -> Duration {
        Duration::from_secs(5)
    }
    pub fn admin_request_timeout() -> Duration {
        Duration::from_secs(30)
    }
    pub fn admin_max_requests_per_connection() -> usize {
        100
    }
    pub fn capture_enabled() -> bool {
        true
    }
    pub fn capture_max_file_bytes() -> u64 {
        64 << 20
    }
    pub fn capture_max_files() -> usize {
        16
    }
    pub fn capture_max_total_bytes() -> u64 {
        1 << 30
    }
    pub fn capture_queue() -> usize {
        65_536
    }

    pub fn max_connections() -> usize {
        1024
    }
    pub fn max_per_source() -> usize {
        64
    }
    pub fn idle_timeout() -> Duration {
        Duration::from_secs(300)
    }
    pub fn partial_frame_timeout() -> Duration {
        Duration::from_secs(5)
    }
    pub fn write_queue() -> usize {
        4096
    }
    pub fn oneconnect_idle() -> Duration {
        Duration::from_secs(30)
    }
    pub fn connections_per_node() -> usize {
        2
    }
    pub fn min_active() -> usize {
        1
    }
    pub fn sticky_field() -> u16 {
        41
    }
    pub fn connect_timeout() -> Duration {
        Duration::from_secs(2)
    }
    pub fn reconnect_min() -> Duration {
        Duration::from_millis(100)
    }
    pub fn reconnect_max() -> Duration {
        Duration::from_secs(10)
    }
    pub fn weight() -> u32 {
        1
    }
    pub fn check_interval() -> Duration {
        Duration::from_secs(2)
    }
    pub fn check_timeout() -> Duration {
        Duration::from_secs(1)
    }
    pub fn max_in_flight() -> usize {
        100_000
    }
    pub fn max_in_flight_per_connection() -> usize {
        1_000
    }
    pub fn max_in_flight_per_source() -> usize {
        10_000
    }
    pub fn keepalive_idle() -> Duration {
        Duration::from_secs(30)
    }
    pub fn in_link_silence() -> Duration {
        Duration::from_secs(90)
    }
    pub fn sign_on_retry() -> Duration {
        Duration::from_secs(5)
    }
    pub fn echo_interval() -> Duration {
        Duration::from_secs(60)
    }
    pub fn yes() -> bool {
        true
    }
    pub fn no_sign_on() -> super::SignOn {
        super::SignOn::None
    }
}

/// One `ISOSWITCH__...` variable, resolved to the key it sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvOverride {
    /// The variable's name, for errors.
    pub var: String,
    /// The key it sets, as errors print keys: `service[0].back.node[1].weight`.
    pub key: String,
    /// The value, always as a string: serde converts it to the key's type, so
    /// `01` stays `"01"` for a string key and is 1 for a number.
    pub value: String,
}

/// Resolves `ISOSWITCH__A__0__B=value` variables against the file's tree.
/// Levels are separated by `__` and lower-cased; a number indexes a list
/// (`SERVICE__0` is the first service), which must exist in the file.
pub fn env_overrides(
    tree: &serde_json::Value,
    vars: impl Iterator<Item = (String, String)>,
) -> Result<Vec<EnvOverride>, ConfigError> {
    let prefix = format!("{ENV_PREFIX}__");
    let mut out = Vec::new();
    for (var, value) in vars {
        let Some(path) = var.strip_prefix(&prefix) else {
            continue;
        };
        let mut key = String::new();
        let mut at = Some(tree);
        for seg in path.split("__").map(str::to_ascii_lowercase) {
            let index = seg.parse::<usize>().ok();
            match (at, index) {
                (Some(serde_json::Value::Array(items)), Some(i)) => {
                    if i >= items.len() {
                        return Err(ConfigError::Env {
                            var,
                            key,
                            reason: format!("index {i} is past the {} configured", items.len()),
                        });
                    }
                    key.push_str(&format!("[{i}]"));
                    at = items.get(i);
                }
                (_, Some(_)) => {
                    return Err(ConfigError::Env {
                        var,
                        key,
                        reason: format!("`{seg}` indexes a list, and this key is not one"),
                    });
                }
                (_, None) if seg.is_empty() => {
                    return Err(invalid(var, "empty level (`___` or a trailing `__`)"));
                }
                (_, None) => {
                    if !key.is_empty() {
                        key.push('.');
                    }
                    key.push_str(&seg);
                    at = at.and_then(|v| v.get(&seg));
                }
            }
        }
        out.push(EnvOverride { var, key, value });
    }
    Ok(out)
}

/// The message of a `config` crate error without the key and origin it
/// appends (serde_path_to_error names the key, and names it right).
fn reason(e: &config::ConfigError) -> String {
    match e {
        config::ConfigError::At { error, .. } => reason(error),
        config::ConfigError::Type {
            unexpected,
            expected,
            ..
        } => format!("invalid type: {unexpected}, expected {expected}"),
        other => other.to_string(),
    }
}

/// Moves the `path: ` a nested deserializer put before `reason` onto `key`:
/// `service[0].front` + `allow[0]: bad` = `service[0].front.allow[0]` + `bad`.
fn join_path(mut key: String, mut reason: String) -> (String, String) {
    let is_path = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.[]".contains(&b))
    };
    while let Some((head, rest)) = reason.split_once(": ") {
        if !is_path(head) {
            break;
        }
        if head != "." {
            if !head.starts_with('[') && !key.is_empty() {
                key.push('.');
            }
            key.push_str(head);
        }
        reason = rest.to_string();
    }
    (key, reason)
}

/// Blames an error at `key` on the variable that set it (or a table above
/// it), else on the file.
fn blame(overrides: &[EnvOverride], key: String, reason: String) -> ConfigError {
    let (key, reason) = join_path(key, reason);
    let covers = |o: &&EnvOverride| {
        let under = |outer: &str, inner: &str| {
            inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        };
        // The key itself or a table inside it, or an unknown key it added.
        under(&o.key, &key)
            || (under(&key, &o.key)
                && o.key
                    .rsplit('.')
                    .next()
                    .is_some_and(|leaf| reason.contains(&format!("`{leaf}`"))))
    };
    match overrides.iter().rev().find(covers) {
        Some(o) => ConfigError::Env {
            var: o.var.clone(),
            key,
            reason,
        },
        None => ConfigError::Invalid { key, reason },
    }
}

/// Serde for `host:port` keys: an IP address, or a host name resolved when the
/// configuration is loaded (the first address the resolver gives).
pub mod host_port {
    use std::net::{SocketAddr, ToSocketAddrs};
    use std::sync::atomic::{AtomicBool, Ordering};

    use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
        let text = String::deserialize(d)?;
        resolve(&text).map_err(D::Error::custom)
    }

    pub fn serialize<S: Serializer>(addr: &SocketAddr, s: S) -> Result<S::Ok, S::Error> {
        addr.serialize(s)
    }

    static IP_ONLY: AtomicBool = AtomicBool::new(false);

    /// Refuses host names from now on in this process (the config fuzzer must
    /// not send DNS queries).
    pub fn resolve_ip_only() {
        IP_ONLY.store(true, Ordering::Relaxed);
    }

    /// Why an address does not read as `host:port`; each names the text.
    #[derive(Debug, thiserror::Error)]
    pub enum AddrError {
        #[error("`{0}` is not host:port")]
        NotHostPort(String),
        #[error("`{text}`: port `{port}` is not 0..=65535")]
        Port { text: String, port: String },
        #[error("`{0}` has no host")]
        NoHost(String),
        #[error("`{0}`: host names are not resolved here")]
        NamesOff(String),
        #[error("cannot resolve `{host}`: {source}")]
        Resolve {
            host: String,
            source: std::io::Error,
        },
        #[error("`{0}` resolves to no address")]
        NoAddress(String),
    }

    /// `127.0.0.1:7001`, `[::1]:7001` or `localhost:7001`.
    pub fn resolve(text: &str) -> Result<SocketAddr, AddrError> {
        if let Ok(addr) = text.parse() {
            return Ok(addr);
        }
        let Some((host, port)) = text.rsplit_once(':') else {
            return Err(AddrError::NotHostPort(text.to_string()));
        };
        let port: u16 = port.parse().map_err(|_| AddrError::Port {
            text: text.to_string(),
            port: port.to_string(),
        })?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(AddrError::NoHost(text.to_string()));
        }
        if IP_ONLY.load(Ordering::Relaxed) {
            return Err(AddrError::NamesOff(text.to_string()));
        }
        let mut addrs = (host, port)
            .to_socket_addrs()
            .map_err(|source| AddrError::Resolve {
                host: host.to_string(),
                source,
            })?;
        addrs
            .next()
            .ok_or_else(|| AddrError::NoAddress(host.to_string()))
    }
}

/// Helpers for tables serde's derive cannot read with full key paths.
pub mod strict {
    use serde::{Serialize, de::DeserializeOwned, de::Error};

    /// The keys `T`'s default prints: the keys it knows.
    pub fn keys_of<T: Serialize + Default, E: Error>() -> Result<Vec<String>, E> {
        let known = serde_json::to_value(T::default()).map_err(E::custom)?;
        Ok(known
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default())
    }

    /// Refuses a table key that `T` does not know.
    pub fn check_keys<T: Serialize + Default, E: Error>(value: &config::Value) -> Result<(), E> {
        let mut known = keys_of::<T, E>()?;
        known.sort_unstable();
        if let Ok(table) = value.clone().into_table()
            && let Some(unknown) = table.keys().find(|k| !known.contains(k))
        {
            return Err(E::custom(format!(
                "unknown field `{unknown}`, expected one of `{}`",
                known.join("`, `")
            )));
        }
        Ok(())
    }

    /// Deserializes `value` as `T`, naming the key inside it that is wrong as
    /// `path: reason` (joined to the outer key by `join_path`).
    pub fn inner<T: DeserializeOwned, E: Error>(value: config::Value) -> Result<T, E> {
        serde_path_to_error::deserialize(value)
            .map_err(|e| E::custom(format!("{}: {}", e.path(), super::reason(e.inner()))))
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

impl Config {
    /// The embedded default: a POS service and a UnionPay service in front of
    /// three channel nodes on 127.0.0.1 (what the demo runs).
    pub fn embedded_default() -> Result<Config, ConfigError> {
        Self::from_toml(DEFAULT_TOML)
    }

    /// Loads a TOML file, applies environment overrides, and validates.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let source = config::File::from(path).format(config::FileFormat::Toml);
        Self::build(source, std::env::vars())
    }

    /// Parses TOML text (e.g. the embedded demo config), with environment
    /// overrides, and validates.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Self::from_toml_with_env(text, std::env::vars())
    }

    /// [`Config::from_toml`] with the environment given (for tests).
    pub fn from_toml_with_env(
        text: &str,
        vars: impl Iterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        Self::build(config::File::from_str(text, config::FileFormat::Toml), vars)
    }

    fn build<S>(
        source: S,
        vars: impl Iterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError>
    where
        S: config::Source + Send + Sync + 'static,
    {
        let file = config::Config::builder().add_source(source).build()?;
        let tree: serde_json::Value = file.clone().try_deserialize()?;
        let overrides = env_overrides(&tree, vars)?;
        let mut merged = config::Config::builder().add_source(file);
        for o in &overrides {
            merged = merged
                .set_override(o.key.as_str(), o.value.as_str())
                .map_err(|e| blame(&overrides, o.key.clone(), e.to_string()))?;
        }
        let merged = merged.build()?;
        // serde_path_to_error names the key of every type error: durations,
        // addresses, CIDRs, codes, enums and unknown keys alike.
        let cfg: Config = serde_path_to_error::deserialize(merged).map_err(|e| {
            let key = e.path().to_string();
            blame(&overrides, key, reason(e.inner()))
        })?;
        cfg.validate().map_err(|e| match e {
            ConfigError::Invalid { key, reason } => blame(&overrides, key, reason),
            other => other,
        })?;
        Ok(cfg)
    }

    /// The configuration as the switch runs it: every default filled in,
    /// including those resolved later (`correlation.key` from the spec,
    /// `max_in_links` from `links`), for `isoswitch check` to print.
    pub fn effective(&self) -> Config {
        let mut cfg = self.clone();
        for svc in &mut cfg.services {
            if svc.correlation.key.is_empty()
                && let Ok(spec) = svc.load_spec()
            {
                svc.correlation.key = default_key(&spec);
            }
            if let FrontConfig::Simplex(f) = &mut svc.front {
                f.max_in_links = Some(f.max_in_links());
            }
        }
        cfg
    }

    /// Checks what serde cannot: references between keys, ranges, uniqueness.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.services.is_empty() {
            return Err(invalid("service", "no service is configured"));
        }
        if let Some(admin) = &self.admin {
            admin.validate()?;
        }
        self.journal.validate()?;
        let mut names = std::collections::HashSet::new();
        for (i, svc) in self.services.iter().enumerate() {
            let key = format!("service[{i}]");
            if !names.insert(svc.name.as_str()) {
                return Err(invalid(
                    format!("{key}.name"),
                    format!("duplicate service name `{}`", svc.name),
                ));
            }
            svc.validate(&key)?;
        }
        tls::validate(self).map_err(|e| invalid(e.key(), e.reason()))?;
        Ok(())
    }
}

/// Why the switch cannot carry `spec` on a service, if it cannot: its declines,
/// reversals and approval checks write and read F39 as a 2-character
/// response code (ISO 8583:1987). A dialect with a 3-digit action code
/// (ISO 8583:1993, `iso93binary`) is for `decode`, captures and replay
/// only, until response codes of other widths are supported.
pub fn unswitchable(spec: &Spec) -> Option<String> {
    match spec.field(39) {
        Some(f) if f.is_fixed() && f.length == 2 => None,
        Some(f) => Some(format!(
            "`{}`: F39 is {}{} characters; the switch answers and reads 2-character response codes, so this spec serves decode, capture and replay only",
            spec.name(),
            if f.is_fixed() { "" } else { "up to " },
            f.length
        )),
        None => Some(format!(
            "`{}` has no F39: the switch could not decline or read an answer",
            spec.name()
        )),
    }
}

impl ServiceConfig {
    /// Resolves the service's spec (built-in name or file path).
    pub fn load_spec(&self) -> Result<Spec, ConfigError> {
        Spec::resolve(&self.spec).map_err(|e| invalid("spec", e.to_string()))
    }

    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if !name::is_safe_name(self.name.as_bytes(), name::NAME_MAX) {
            return Err(invalid(
                format!("{key}.name"),
                format!(
                    "`{}`: must be {}",
                    self.name.escape_debug(),
                    name::NAME_RULE
                ),
            ));
        }
        let spec = self
            .load_spec()
            .map_err(|e| invalid(format!("{key}.spec"), e.to_string()))?;
        if let Some(why) = unswitchable(&spec) {
            return Err(invalid(format!("{key}.spec"), why));
        }
        self.back.validate(&format!("{key}.back"))?;
        if let Some(c) = &self.capture {
            c.validate(&format!("{key}.capture"))?;
        }
        for (j, part) in self.correlation.key.iter().enumerate() {
            if let KeyPart::Field(id) = part
                && spec.field(*id).is_none()
            {
                return Err(invalid(
                    format!("{key}.correlation.key[{j}]"),
                    format!("spec `{}` has no field {id}", self.spec),
                ));
            }
            if *part == KeyPart::Tpdu && !spec.envelope().tpdu {
                return Err(invalid(
                    format!("{key}.correlation.key[{j}]"),
                    format!("spec `{}` has no TPDU", self.spec),
                ));
            }
        }
        self.timeouts.validate(&format!("{key}.timeouts"))?;
        let node_ids: Vec<&str> = self.back.nodes.iter().map(|n| n.id.as_str()).collect();
        self.integrity
            .validate(&format!("{key}.integrity"), &node_ids)?;
        self.advices_can_be_stored(key)?;
        for (j, text) in self.accept_mti.iter().enumerate() {
            if crate::route::MtiPattern::parse(text).is_none() {
                return Err(invalid(
                    format!("{key}.accept_mti[{j}]"),
                    format!("`{text}` is not an MTI pattern: four digits or `x`, such as `02x0`"),
                ));
            }
        }
        if self.correlation.max_in_flight == 0 {
            return Err(invalid(
                format!("{key}.correlation.max_in_flight"),
                "must be > 0 (0 declines every request)",
            ));
        }
        if let Some(stamp) = &self.f37_stamp {
            stamp
                .validate(&self.back.node_ids()?)
                .map_err(|e| invalid(format!("{key}.f37_stamp"), e.to_string()))?;
        }
        self.validate_front(key, &spec)
    }

    /// `advices = "store-and-forward"` needs a front the switch can
    /// acknowledge an advice on once it is stored: a `listen` front
    /// multiplexing its node connections. On a peer's links the
    /// acknowledgement would have to go out on an out link, and OneConnect
    /// carries no store; the sender would repeat forever, each repeat stored
    /// again. Refused rather than silently broken.
    fn advices_can_be_stored(&self, key: &str) -> Result<(), ConfigError> {
        if self.integrity.advices != crate::config::Advices::StoreAndForward {
            return Ok(());
        }
        let why = match &self.front {
            FrontConfig::Listen(l) if l.mode == ListenMode::Multiplex => return Ok(()),
            FrontConfig::Listen(_) => "a `oneconnect` front does not store advices",
            FrontConfig::Simplex(_) | FrontConfig::Connect(_) => {
                "the switch cannot acknowledge a peer's advice on its links; the peer's advices go to the nodes (`forward`)"
            }
        };
        Err(invalid(
            format!("{key}.integrity.advices"),
            format!("`store-and-forward`: {why}"),
        ))
    }

    fn validate_front(&self, key: &str, spec: &Spec) -> Result<(), ConfigError> {
        match &self.front {
            FrontConfig::Listen(l) => l.validate(&format!("{key}.front")),
            FrontConfig::Simplex(_) | FrontConfig::Connect(_) => {
                if self.f37_stamp.is_none() {
                    return Err(invalid(
                        format!("{key}.f37_stamp"),
                        "this front routes responses by the F37 node stamp: set { offset, width }",
                    ));
                }
                if spec.field(37).is_none() {
                    return Err(invalid(
                        format!("{key}.spec"),
                        "this front needs F37 in the spec",
                    ));
                }
                let front_key = format!("{key}.front");
                if let FrontConfig::Simplex(f) = &self.front {
                    f.validate(&front_key)?;
                }
                self.front
                    .link_set()
                    .map_or(Ok(()), |set| set.validate(&front_key))
            }
        }
    }
}

impl LinkSet {
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if !(1..=64).contains(&self.links) {
            return Err(invalid(format!("{key}.links"), "must be within 1..=64"));
        }
        for (k, v) in [
            ("keepalive_idle", self.keepalive_idle),
            ("partial_frame_timeout", self.partial_frame_timeout),
            ("reconnect_min", self.reconnect_min),
            ("sign_on_retry", self.sign_on_retry),
        ] {
            if v.is_zero() {
                return Err(invalid(format!("{key}.{k}"), "must be > 0"));
            }
        }
        if self.reconnect_max < self.reconnect_min {
            return Err(invalid(
                format!("{key}.reconnect_max"),
                "must be >= reconnect_min",
            ));
        }
        if self.write_queue == 0 {
            return Err(invalid(format!("{key}.write_queue"), "must be > 0"));
        }
        Ok(())
    }
}

impl SimplexFront {
    pub fn max_in_links(&self) -> usize {
        self.max_in_links.unwrap_or(self.links)
    }

    /// What only a simplex front has; the link set is checked by [`LinkSet`].
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.max_in_links() == 0 {
            return Err(invalid(format!("{key}.max_in_links"), "must be > 0"));
        }
        if self.in_link_silence.is_zero() {
            return Err(invalid(format!("{key}.in_link_silence"), "must be > 0"));
        }
        for (k, id) in [("member_id", &self.member_id), ("peer_id", &self.peer_id)] {
            if id.is_empty() || id.len() > 11 || !id.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid(format!("{key}.{k}"), "1 to 11 digits"));
            }
        }
        Ok(())
    }
}

impl ListenFront {
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.max_connections == 0 {
            return Err(invalid(format!("{key}.max_connections"), "must be > 0"));
        }
        if self.max_per_source == 0 {
            return Err(invalid(format!("{key}.max_per_source"), "must be > 0"));
        }
        for (k, v) in [
            (
                "max_in_flight_per_connection",
                self.max_in_flight_per_connection,
            ),
            ("max_in_flight_per_source", self.max_in_flight_per_source),
        ] {
            if v == 0 {
                return Err(invalid(
                    format!("{key}.{k}"),
                    "must be > 0: 0 would decline every request",
                ));
            }
        }
        if self.write_queue == 0 {
            return Err(invalid(format!("{key}.write_queue"), "must be > 0"));
        }
        if self.partial_frame_timeout.is_zero() {
            return Err(invalid(
                format!("{key}.partial_frame_timeout"),
                "must be > 0",
            ));
        }
        Ok(())
    }
}

impl BackConfig {
    /// The node IDs, parsed; an invalid one is named by its index.
    pub fn node_ids(&self) -> Result<Vec<NodeId>, ConfigError> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                n.id.parse::<NodeId>()
                    .map_err(|e| invalid(format!("back.node[{i}].id"), e.to_string()))
            })
            .collect()
    }

    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.nodes.is_empty() {
            return Err(invalid(
                format!("{key}.node"),
                "a back needs at least one node",
            ));
        }
        if !(1..=64).contains(&self.connections_per_node) {
            return Err(invalid(
                format!("{key}.connections_per_node"),
                "must be within 1..=64",
            ));
        }
        if self.write_queue == 0 {
            return Err(invalid(format!("{key}.write_queue"), "must be > 0"));
        }
        if self.partial_frame_timeout.is_zero() {
            return Err(invalid(
                format!("{key}.partial_frame_timeout"),
                "must be > 0",
            ));
        }
        if self.reconnect_min.is_zero() || self.reconnect_max < self.reconnect_min {
            return Err(invalid(
                format!("{key}.reconnect_max"),
                "need 0 < reconnect_min <= reconnect_max",
            ));
        }
        let mut ids = std::collections::HashSet::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let nkey = format!("{key}.node[{i}]");
            if !name::is_safe_name(node.id.as_bytes(), NODE_ID_MAX) {
                return Err(invalid(
                    format!("{nkey}.id"),
                    format!(
                        "`{}`: must be 1 to {NODE_ID_MAX} characters, each a letter, a digit, `_`, `.` or `-`",
                        node.id.escape_debug()
                    ),
                ));
            }
            if !ids.insert(node.id.as_str()) {
                return Err(invalid(
                    format!("{nkey}.id"),
                    format!("duplicate node id `{}`", node.id),
                ));
            }
            if node.weight == 0 {
                return Err(invalid(
                    format!("{nkey}.weight"),
                    "must be > 0 (use admin = \"disabled\")",
                ));
            }
        }
        let ids = self.node_ids()?;
        RuleSet::compile(&self.rules, &ids)
            .map_err(|e| invalid(format!("{key}.rule"), e.to_string()))?;
        self.health
            .state
            .validate()
            .map_err(|e| invalid(format!("{key}.health"), e.to_string()))?;
        if self.health.timeout.is_zero() || self.health.interval.is_zero() {
            return Err(invalid(
                format!("{key}.health"),
                "interval and timeout must be > 0",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[[service]]
name = "pos"
spec = "cup-pos"
[service.front]
kind = "listen"
listen = "127.0.0.1:6000"
[service.back]
[[service.back.node]]
id = "01"
address = "127.0.0.1:7001"
"#;

    fn error_of(toml: &str) -> String {
        match Config::from_toml(toml) {
            Ok(_) => panic!("accepted:\n{toml}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn embedded_default_is_valid() {
        let cfg = Config::embedded_default().unwrap();
        assert_eq!(cfg.services.len(), 4);
        assert!(matches!(cfg.services[1].front, FrontConfig::Simplex(_)));
        assert!(matches!(cfg.services[2].front, FrontConfig::Connect(_)));
        assert!(
            matches!(&cfg.services[3].front, FrontConfig::Listen(l) if l.mode == ListenMode::Oneconnect)
        );
    }

    #[test]
    fn defaults_fill_in() {
        let cfg = Config::from_toml(MINIMAL).unwrap();
        let svc = &cfg.services[0];
        assert_eq!(svc.back.connections_per_node, 2);
        assert_eq!(svc.timeouts.request, Duration::from_secs(3));
        assert_eq!(svc.correlation.tpdu_on_response, TpduPolicy::Swap);
        let FrontConfig::Listen(l) = &svc.front else {
            panic!("listen front")
        };
        assert_eq!(l.max_per_source, 64);
    }

    #[test]
    fn errors_name_the_key() {
        let dup =
            format!("{MINIMAL}[[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:7002\"\n");
        assert_eq!(
            error_of(&dup),
            "service[0].back.node[1].id: duplicate node id `01`"
        );
        let bad_key = MINIMAL.replace("[service.back]", "[service.back]\nconnections_per_node = 0");
        assert!(error_of(&bad_key).starts_with("service[0].back.connections_per_node"));
        let no_field = format!("{MINIMAL}[service.correlation]\nkey = [\"F41\", \"F150\"]\n");
        assert!(error_of(&no_field).contains("service[0].correlation.key[1]"));
        let bad_part = format!("{MINIMAL}[service.correlation]\nkey = [\"nonsense\"]\n");
        assert!(error_of(&bad_part).contains("not a key part"));
        let unknown_spec = MINIMAL.replace("cup-pos", "no-such-spec");
        assert!(error_of(&unknown_spec).starts_with("service[0].spec"));
        let unknown_key =
            MINIMAL.replace("[service.back]", "[service.back]\nconections_per_node = 2");
        assert!(error_of(&unknown_key).contains("conections_per_node"));
    }

    /// Names go unescaped into metrics labels, logs and URLs: a quote or
    /// label syntax in one is refused at load, wherever it came from.
    #[test]
    fn names_outside_the_safe_alphabet_are_refused_with_the_key() {
        let node = |id: &str| {
            format!(
                "{MINIMAL}[[service.back.node]]\nid = {}\naddress = \"127.0.0.1:7002\"\n",
                toml::Value::String(id.into())
            )
        };
        for bad in ["x\",y=\"z", "\"", "a b", "n/1", "123456789"] {
            let err = error_of(&node(bad));
            assert!(
                err.starts_with("service[0].back.node[1].id: ")
                    && err.contains("a letter, a digit"),
                "{bad:?}: {err}"
            );
        }
        for bad in ["x\",y=\"z", "po\"s", "", &"s".repeat(33)] {
            let toml = MINIMAL.replace(
                "name = \"pos\"",
                &format!("name = {}", toml::Value::String(bad.into())),
            );
            let err = error_of(&toml);
            assert!(err.starts_with("service[0].name: "), "{bad:?}: {err}");
        }
        let odd = MINIMAL
            .replace("name = \"pos\"", "name = \"pos.east-1_a\"")
            .replace("id = \"01\"", "id = \"n.1_a-b\"");
        assert!(Config::from_toml(&odd).is_ok(), "`.`, `-` and `_` are fine");
        let env = env_error_of(
            MINIMAL,
            &[("ISOSWITCH__SERVICE__0__BACK__NODE__0__ID", "x\",y=\"z")],
        );
        assert!(
            env.contains("ISOSWITCH__SERVICE__0__BACK__NODE__0__ID")
                && env.contains("service[0].back.node[0].id"),
            "{env}"
        );
    }

    #[test]
    fn simplex_needs_an_f37_stamp_that_fits_the_node_ids() {
        let simplex = r#"
[[service]]
name = "up"
spec = "cups"
[service.front]
kind = "simplex"
connect = "127.0.0.1:9001"
listen = "127.0.0.1:9101"
links = 2
member_id = "03105840"
peer_id = "00010000"
[service.back]
[[service.back.node]]
id = "001"
address = "127.0.0.1:7001"
"#;
        assert!(error_of(simplex).starts_with("service[0].f37_stamp"));
        let narrow = simplex.replace(
            "name = \"up\"",
            "name = \"up\"\nf37_stamp = { offset = 10, width = 2 }",
        );
        assert!(
            error_of(&narrow).starts_with("service[0].f37_stamp"),
            "{}",
            error_of(&narrow)
        );
        let fits = narrow.replace("id = \"001\"", "id = \"01\"");
        assert!(Config::from_toml(&fits).is_ok());
    }

    fn env(vars: &[(&str, &str)]) -> impl Iterator<Item = (String, String)> {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>()
            .into_iter()
    }

    fn env_error_of(toml: &str, vars: &[(&str, &str)]) -> String {
        match Config::from_toml_with_env(toml, env(vars)) {
            Ok(_) => panic!("accepted {vars:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn environment_overrides_reach_into_lists() {
        let vars = [
            ("ISOSWITCH__SERVICE__0__TIMEOUTS__REQUEST", "5s"),
            ("ISOSWITCH__SERVICE__0__BACK__NODE__0__WEIGHT", "3"),
            ("ISOSWITCH__SERVICE__0__BACK__CONNECTIONS_PER_NODE", "4"),
            ("ISOSWITCH__SERVICE__0__BACK__HEALTH__RISE", "7"),
            ("OTHER__THING", "ignored"),
        ];
        let cfg = Config::from_toml_with_env(MINIMAL, env(&vars)).unwrap();
        let svc = &cfg.services[0];
        assert_eq!(svc.timeouts.request, Duration::from_secs(5));
        assert_eq!(svc.back.nodes[0].weight, 3);
        assert_eq!(svc.back.connections_per_node, 4);
        assert_eq!(svc.back.health.state.rise, 7);

        let err = env_error_of(MINIMAL, &[("ISOSWITCH__SERVICE__3__NAME", "x")]);
        assert!(
            err.contains("ISOSWITCH__SERVICE__3__NAME") && err.contains("index 3"),
            "{err}"
        );
    }

    #[test]
    fn environment_strings_stay_strings() {
        let vars = [
            ("ISOSWITCH__SERVICE__0__BACK__NODE__0__ID", "01"),
            ("ISOSWITCH__SERVICE__0__NAME", "007"),
            ("ISOSWITCH__SERVICE__0__DECLINES__TIMEOUT", "05"),
        ];
        let cfg = Config::from_toml_with_env(MINIMAL, env(&vars)).unwrap();
        let svc = &cfg.services[0];
        assert_eq!(svc.back.nodes[0].id, "01");
        assert_eq!(svc.name, "007");
        assert_eq!(
            svc.declines.code(crate::route::DeclineReason::Timeout),
            *b"05"
        );
    }

    #[test]
    fn environment_errors_name_the_variable() {
        let err = env_error_of(
            MINIMAL,
            &[("ISOSWITCH__SERVICE__0__TIMEOUTS__REQUEST", "soon")],
        );
        assert!(
            err.starts_with(
                "ISOSWITCH__SERVICE__0__TIMEOUTS__REQUEST (sets service[0].timeouts.request)"
            ),
            "{err}"
        );
        let err = env_error_of(
            MINIMAL,
            &[("ISOSWITCH__SERVICE__0__CORRELATION__MAX_IN_FLIGHT", "0")],
        );
        assert!(
            err.starts_with("ISOSWITCH__SERVICE__0__CORRELATION__MAX_IN_FLIGHT"),
            "{err}"
        );
        let err = env_error_of(
            MINIMAL,
            &[("ISOSWITCH__SERVICE__0__BACK__HEALTH__RYSE", "2")],
        );
        assert!(
            err.starts_with("ISOSWITCH__SERVICE__0__BACK__HEALTH__RYSE") && err.contains("ryse"),
            "{err}"
        );
        // An error the file makes still blames the file's key.
        let bad_file = MINIMAL.replace("127.0.0.1:7001", "127.0.0.1:70000");
        let err = env_error_of(&bad_file, &[("ISOSWITCH__SERVICE__0__NAME", "x")]);
        assert!(err.starts_with("service[0].back.node[0].address"), "{err}");
    }

    #[test]
    fn unknown_keys_are_refused_at_every_level() {
        let at = |table: &str, key: &str| -> String {
            let toml = if table.is_empty() {
                format!("{key} = 1\n{MINIMAL}")
            } else if MINIMAL.contains(&format!("{table}\n")) {
                MINIMAL.replace(&format!("{table}\n"), &format!("{table}\n{key} = 1\n"))
            } else {
                format!("{MINIMAL}{table}\n{key} = 1\n")
            };
            error_of(&toml)
        };
        for (table, path) in [
            ("", ""),
            ("[[service]]", "service[0]"),
            ("[service.front]", "service[0].front"),
            ("[service.back]", "service[0].back"),
            ("[[service.back.node]]", "service[0].back.node[0]"),
            ("[service.back.health]", "service[0].back.health"),
            ("[service.correlation]", "service[0].correlation"),
            ("[service.timeouts]", "service[0].timeouts"),
            ("[service.declines]", "service[0].declines"),
        ] {
            let err = at(table, "typo_key");
            assert!(
                err.starts_with(path) && err.contains("typo_key"),
                "{table}: {err}"
            );
        }
    }

    #[test]
    fn typed_values_name_their_key() {
        let cases = [
            (
                MINIMAL.replace(
                    "[service.back]",
                    "[service.timeouts]\nrequest = \"3 parsecs\"\n[service.back]",
                ),
                "service[0].timeouts.request",
            ),
            (
                MINIMAL.replace(
                    "kind = \"listen\"",
                    "kind = \"listen\"\nallow = [\"10.0.0.0/33\"]",
                ),
                "service[0].front.allow[0]",
            ),
            (
                MINIMAL.replace("127.0.0.1:7001", "127.0.0.1"),
                "service[0].back.node[0].address",
            ),
            (
                MINIMAL.replace("127.0.0.1:6000", "localhost:port"),
                "service[0].front.listen",
            ),
            (
                format!("{MINIMAL}[service.declines]\ntimeout = \"911\"\n"),
                "service[0].declines.timeout",
            ),
            (
                MINIMAL.replace("[service.back]", "[service.back]\nalgorithm = \"fastest\""),
                "service[0].back.algorithm",
            ),
            (
                MINIMAL.replace(
                    "kind = \"listen\"",
                    "kind = \"listen\"\non_bad_message = \"explode\"",
                ),
                "service[0].front.on_bad_message",
            ),
            (
                MINIMAL.replace(
                    "kind = \"listen\"",
                    "kind = \"listen\"\nmax_connections = \"many\"",
                ),
                "service[0].front.max_connections",
            ),
        ];
        for (toml, key) in cases {
            let err = error_of(&toml);
            assert!(err.starts_with(key), "{key}: {err}");
        }
        let bad_health = format!("{MINIMAL}[service.back.health]\nbase_ejection = \"often\"\n");
        let err = error_of(&bad_health);
        assert!(
            err.starts_with("service[0].back.health") && err.contains("base_ejection"),
            "{err}"
        );
    }

    #[test]
    fn host_names_are_resolved_at_load() {
        let named = MINIMAL.replace("127.0.0.1:7001", "localhost:7001");
        let cfg = Config::from_toml_with_env(&named, env(&[])).unwrap();
        let addr = cfg.services[0].back.nodes[0].address;
        assert!(addr.ip().is_loopback() && addr.port() == 7001, "{addr}");
        assert_eq!(
            host_port::resolve("[::1]:7001").unwrap(),
            "[::1]:7001".parse().unwrap()
        );
        assert!(
            host_port::resolve("localhost:65536")
                .unwrap_err()
                .to_string()
                .contains("port")
        );
        assert!(
            host_port::resolve(":7001")
                .unwrap_err()
                .to_string()
                .contains("no host")
        );
    }

    #[test]
    fn limits_that_refuse_everything_are_refused() {
        for (table, key, path) in [
            (
                "[service.correlation]",
                "max_in_flight",
                "service[0].correlation.max_in_flight",
            ),
            (
                "[service.back]",
                "write_queue",
                "service[0].back.write_queue",
            ),
            (
                "[service.back]",
                "connections_per_node",
                "service[0].back.connections_per_node",
            ),
            (
                "[service.front]",
                "max_connections",
                "service[0].front.max_connections",
            ),
            (
                "[service.front]",
                "max_per_source",
                "service[0].front.max_per_source",
            ),
            (
                "[service.front]",
                "write_queue",
                "service[0].front.write_queue",
            ),
        ] {
            let toml = if MINIMAL.contains(&format!("{table}\n")) {
                MINIMAL.replace(&format!("{table}\n"), &format!("{table}\n{key} = 0\n"))
            } else {
                format!("{MINIMAL}{table}\n{key} = 0\n")
            };
            let err = error_of(&toml);
            assert!(err.starts_with(path), "{key}: {err}");
        }
    }

    #[test]
    fn effective_config_prints_every_default() {
        let simplex = r#"
[[service]]
name = "up"
spec = "cups"
f37_stamp = { offset = 10, width = 2 }
[service.front]
kind = "simplex"
connect = "127.0.0.1:9001"
listen = "127.0.0.1:9101"
links = 3
member_id = "03105840"
peer_id = "00010000"
[service.back]
[[service.back.node]]
id = "01"
address = "127.0.0.1:7001"
"#;
        let cfg = Config::from_toml_with_env(simplex, env(&[])).unwrap();
        let text = toml::to_string_pretty(&cfg.effective()).unwrap();
        assert!(text.contains("max_in_links = 3"), "{text}");
        assert!(text.contains("\"F7\""), "{text}");
        for key in [
            "max_in_flight",
            "tpdu_on_response",
            "ejection_threshold",
            "slow_start",
        ] {
            assert!(text.contains(key), "{key} missing:\n{text}");
        }
        // What check prints loads back to the same configuration.
        let again = Config::from_toml_with_env(&text, env(&[])).unwrap();
        assert_eq!(toml::to_string_pretty(&again).unwrap(), text);
        // The switch cannot acknowledge a peer's advice: refused by key.
        let stored = simplex.replace(
            "[service.back]\n",
            "[service.integrity]\nadvices = \"store-and-forward\"\n[service.back]\n",
        );
        let err = Config::from_toml_with_env(&stored, env(&[])).unwrap_err();
        assert!(err.to_string().contains("integrity.advices"), "{err}");
    }

    /// Only read-only paths can be opened: a path that changes the switch in
    /// `open_paths` is refused at load, named by its index.
    #[test]
    fn only_read_only_paths_can_be_opened() {
        let with = |admin: &str| format!("[admin]\n{admin}\n{MINIMAL}");
        let err = error_of(&with(
            "open_paths = [\"/healthz\", \"/metrics\", \"/api/v1/reload\"]",
        ));
        assert!(
            err.starts_with("admin.open_paths[2]: `/api/v1/reload` cannot be opened"),
            "{err}"
        );
        let err = error_of(&with(
            "open_paths = [\"/api/v1/services/pos/nodes/01/disable\"]",
        ));
        assert!(err.starts_with("admin.open_paths[0]: "), "{err}");
        for bad in [
            "max_connections = 0",
            "header_timeout = \"0s\"",
            "request_timeout = \"0s\"",
            "max_requests_per_connection = 0",
        ] {
            let key = bad.split(' ').next().unwrap_or_default();
            let err = error_of(&with(bad));
            assert!(err.starts_with(&format!("admin.{key}: ")), "{err}");
        }
        let cfg = Config::from_toml_with_env(&with("open_paths = [\"/\"]"), env(&[])).unwrap();
        assert_eq!(cfg.admin.unwrap().open_paths, ["/"]);
        let cfg = Config::from_toml_with_env(&with(""), env(&[])).unwrap();
        let admin = cfg.admin.clone().unwrap();
        assert_eq!(admin, AdminConfig::default());
        assert_eq!(admin.open_paths, ["/healthz", "/readyz", "/metrics"]);
        assert_eq!(admin.max_connections, 64);
    }

    #[test]
    fn key_parts_parse_both_forms() {
        assert_eq!(KeyPart::try_from("tpdu".to_string()), Ok(KeyPart::Tpdu));
        assert_eq!(KeyPart::try_from("F41".to_string()), Ok(KeyPart::Field(41)));
        assert_eq!(KeyPart::try_from("11".to_string()), Ok(KeyPart::Field(11)));
        assert!(KeyPart::try_from("F1".to_string()).is_err());
        assert_eq!(String::from(KeyPart::Field(7)), "F7");
    }

    #[test]
    fn a_spec_with_a_3_digit_action_code_is_refused_on_a_service() {
        let toml = "[[service]]\nname = \"iso93\"\nspec = \"iso93binary\"\n\
                    [service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:0\"\n\
                    [[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:9\"\n";
        let e = Config::from_toml(toml).unwrap_err().to_string();
        assert!(e.starts_with("service[0].spec:"), "{e}");
        assert!(e.contains("F39 is 3 characters"), "{e}");
    }
}
