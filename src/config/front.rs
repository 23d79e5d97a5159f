//! `[service.front]`: where a service's clients come from (a listen front,
//! UnionPay's simplex links, duplex links the switch connects), each with
//! its own settings. Types only; the checks across sections are in `validate`.

use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::{defaults, host_port, reason, strict, tls};
use crate::util::duration;

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
