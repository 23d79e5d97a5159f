//! A running service: the routing decisions of `route/` applied to live links.
//! Front readers hand requests to [`Service::on_request`]; node readers hand
//! responses to [`Service::on_node_frame`]; a sweeper declines what expires.
//! Every request accepted from a front gets exactly one answer: the correlator
//! hands each entry out once, to a response, a timeout or a dead connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::client::{ClientLink, InFlightSlot};
use super::log_limit::{LogKind, LogLimit, LogPeer};
use super::netmgmt::NetworkTemplate;
use super::outlinks::{NmKind, OutLinks};
use super::pool::NodePool;
use super::writer::{Outbound, Patch};
use crate::config::{BadMessagePolicy, FrontConfig, ServiceConfig};
use crate::iso8583::{Message, Spec};
use crate::route::{
    Algorithm, CorrelateError, CorrelationKey, CorrelatorConfig, DeclineReason, KeyError, Miss,
    Router, RouterConfig, Shards, StampTable,
};

/// Warnings of one kind about one peer written per second; the rest are
/// counted and summed up in one line.
const LOG_LINES_PER_SECOND: u32 = 5;

/// The peer side of simplex and duplex fronts.
mod peer;

/// Where the answer to a request goes.
#[derive(Debug)]
pub enum Origin {
    /// A front connection: its writer queue, its ID (for logs) and the
    /// request's place under the client's in-flight share (given back when
    /// the request leaves the correlator, however it leaves).
    Client {
        conn: u64,
        tx: mpsc::Sender<Outbound>,
        slot: Option<InFlightSlot>,
    },
    /// The peer of a simplex front: the answer leaves on any live out link.
    Peer,
    /// A switch-made health check waiting for its echo response.
    Check(oneshot::Sender<()>),
}

/// A request in flight, as the correlator keeps it.
#[derive(Debug)]
pub struct Pending {
    pub origin: Origin,
    /// The request as received, to build a decline from.
    pub request: Bytes,
    pub node: usize,
    pub sent_at: Instant,
}

/// Service-wide counters, readable at any time.
#[derive(Debug, Default)]
pub struct ServiceCounters {
    pub requests: AtomicU64,
    pub answered: AtomicU64,
    pub declined: [AtomicU64; DeclineReason::ALL.len()],
    pub late_responses: AtomicU64,
    pub unknown_responses: AtomicU64,
    /// Messages that failed ingress validation (from clients, nodes or the peer).
    pub bad_messages: AtomicU64,
    /// Bad requests from clients answered with the bad-message decline.
    pub bad_declined: AtomicU64,
    /// Bad requests from clients dropped (by policy, or too broken to answer).
    pub bad_dropped: AtomicU64,
    /// Client connections closed for a bad request (`on_bad_message = "close"`).
    pub bad_closed: AtomicU64,
    /// Requests declined because their client was over its in-flight share.
    pub over_share: AtomicU64,
    /// Declines that could not be built (the request was too broken).
    pub undeclinable: AtomicU64,
    pub bad_frames: AtomicU64,
    pub undeliverable: AtomicU64,
    pub unexpected: AtomicU64,
    pub clients_accepted: AtomicU64,
    /// Client connections that ended (for any reason).
    pub clients_closed: AtomicU64,
    pub clients_refused: AtomicU64,
    pub keep_alives: AtomicU64,
    /// Simplex: node-originated requests sent to the peer.
    pub node_requests: AtomicU64,
    /// Simplex: node-originated requests refused at once because no out link
    /// could take them and the waiting queue was full (declined to the node).
    pub node_requests_unsent: AtomicU64,
    /// Simplex: node-originated requests dropped because no out link was
    /// signed on (with room) before their deadline (`timeouts.request`).
    pub node_requests_expired: AtomicU64,
    /// Simplex: node-stamped F37 that did not name the sending node.
    pub stamp_mismatches: AtomicU64,
    /// Simplex: peer responses routed to a node by their F37 stamp.
    pub peer_responses: AtomicU64,
    /// Simplex: peer responses whose stamp names no node, or a node that is down.
    pub unroutable_responses: AtomicU64,
    /// Simplex: the peer's network management answered by the switch.
    pub network_answered: AtomicU64,
    /// `listen` fronts in `oneconnect` mode: the pool's own counters.
    pub oneconnect: super::oneconnect_pool::OneConnectCounters,
    /// Capture events dropped because the capture writer's queue was full
    /// (the capture then shows a gap; the message path never waits).
    pub capture_dropped: AtomicU64,
}

impl ServiceCounters {
    pub fn declined(&self, reason: DeclineReason) -> u64 {
        self.declined[reason as usize].load(Ordering::Relaxed)
    }

    pub fn declined_total(&self) -> u64 {
        self.declined
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

pub use crate::route::{Checked, Invalid};

pub struct Service {
    pub config: ServiceConfig,
    pub spec: Arc<Spec>,
    pub pool: NodePool,
    correlator: Shards<Pending>,
    /// Validation, correlation keys, stamps: the service's routing decisions.
    pub router: Router,
    /// Rate limits of per-message warnings.
    pub log_limit: LogLimit,
    /// The request timeout in nanoseconds, read per request; a reload changes
    /// it for the requests that come after.
    request_timeout_ns: AtomicU64,
    /// The F39 codes of switch-made answers; a reload changes them. Read only
    /// when the switch declines.
    decline_codes: Mutex<crate::route::DeclineCodes>,
    /// A listen front's connection and in-flight limits, as last reloaded;
    /// read once per accepted connection.
    listen_limits: Mutex<Option<ListenLimits>>,
    /// Active health checks' interval and timeout, as last reloaded; read
    /// once per check.
    check_timing: Mutex<(Duration, Duration)>,
    /// The switch's own network-management requests.
    network: NetworkTemplate,
    pub counters: ServiceCounters,
    next_conn_id: AtomicU64,
    next_stan: AtomicU64,
    /// Shutting down: new requests are declined, answers still flow.
    draining: std::sync::atomic::AtomicBool,
    /// Simplex fronts: the out links every outbound frame can use.
    pub out_links: Option<Arc<OutLinks>>,
    /// The F37 node stamps, when configured.
    stamps: Option<StampTable>,
    /// `listen` fronts in `oneconnect` mode: the node connection pool.
    pub oneconnect: Option<Arc<super::oneconnect_pool::OneConnect>>,
    /// Live connections, for the admin API's connection table.
    pub conns: Arc<super::conns::ConnTable>,
    /// pcapng capture of this service's connections, when on (set before the
    /// service starts; connections take taps with `Service::capture_tap`, in
    /// `capture/tap.rs`).
    pub capture: Option<crate::capture::Capture>,
}

impl Service {
    pub fn new(config: ServiceConfig, spec: Spec, now: Instant) -> Result<Service, String> {
        let pool = NodePool::new(&config.name, &config.back, now)?;
        let correlator = Shards::new(CorrelatorConfig {
            capacity: config.correlation.max_in_flight,
            ..CorrelatorConfig::default()
        });
        let spec = Arc::new(spec);
        let router = Router::new(
            RouterConfig {
                key: config.correlation.key.clone(),
                rule_fields: config
                    .back
                    .rules
                    .iter()
                    .flat_map(|r| r.fields.iter().map(|f| f.field))
                    .collect(),
                accept_mti: config.accept_mti.clone(),
                f37_stamp: config.f37_stamp,
                tpdu_on_response: config.correlation.tpdu_on_response,
                sticky_field: (config.back.algorithm == Algorithm::Sticky)
                    .then_some(config.back.sticky_field),
            },
            Arc::clone(&spec),
        )
        .map_err(|e| e.to_string())?;
        let stamps = match &config.f37_stamp {
            Some(stamp) => {
                let ids = config.back.node_ids().map_err(|e| e.to_string())?;
                Some(StampTable::new(*stamp, &ids).map_err(|e| e.to_string())?)
            }
            None => None,
        };
        let out_links = config.front.link_set().map(|set| {
            Arc::new(OutLinks::new(
                set.links,
                set.sign_on,
                config.timeouts.request,
                now,
            ))
        });
        let network = NetworkTemplate::for_service(&config, &spec).map_err(|e| e.to_string())?;
        let oneconnect = super::oneconnect_pool::OneConnect::for_service(&config)?;
        let request_timeout_ns = AtomicU64::new(duration_ns(config.timeouts.request));
        let decline_codes = Mutex::new(config.declines);
        let listen_limits = Mutex::new(match &config.front {
            FrontConfig::Listen(l) => Some(ListenLimits::of(l)),
            _ => None,
        });
        let check_timing = Mutex::new((config.back.health.interval, config.back.health.timeout));
        Ok(Service {
            check_timing,
            listen_limits,
            request_timeout_ns,
            decline_codes,
            oneconnect,
            network,
            router,
            log_limit: LogLimit::new(LOG_LINES_PER_SECOND),
            config,
            spec,
            pool,
            correlator,
            counters: ServiceCounters::default(),
            next_conn_id: AtomicU64::new(1),
            // Each instance starts its STANs somewhere else: two instances
            // behind one address sign on to the same peer, and a sign-on
            // answer that reaches the other instance must not match one of
            // its own (docs/ha.md).
            next_stan: AtomicU64::new(crate::util::rng::entropy_seed() % 999_999),
            draining: std::sync::atomic::AtomicBool::new(false),
            out_links,
            stamps,
            conns: Arc::default(),
            capture: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// How long a request waits for its node's answer before it is declined
    /// (`timeouts.request`, as last reloaded).
    pub fn request_timeout(&self) -> Duration {
        Duration::from_nanos(self.request_timeout_ns.load(Ordering::Relaxed))
    }

    /// The F39 code of a switch-made answer (`declines`, as last reloaded).
    pub fn decline_code(&self, reason: DeclineReason) -> [u8; 2] {
        self.decline_codes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .code(reason)
    }

    /// `front` with its limits as last reloaded (connections in total and
    /// per source, in-flight shares): a new connection is admitted and given
    /// its share by these.
    pub fn listen_limits(&self, front: &crate::config::ListenFront) -> crate::config::ListenFront {
        let mut front = front.clone();
        if let Some(l) = *self.listen_limits.lock().unwrap_or_else(|p| p.into_inner()) {
            l.apply(&mut front);
        }
        front
    }

    /// The interval and timeout of active health checks, as last reloaded.
    pub fn check_timing(&self) -> (Duration, Duration) {
        *self.check_timing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies reloaded health-check timing and the service's in-flight cap
    /// (`correlation.max_in_flight`: requests in flight past a lower cap are
    /// kept; new ones are declined until there is room).
    pub fn set_checks_and_cap(&self, interval: Duration, timeout: Duration, max_in_flight: usize) {
        *self.check_timing.lock().unwrap_or_else(|p| p.into_inner()) = (interval, timeout);
        self.correlator.set_config(CorrelatorConfig {
            capacity: max_in_flight,
            ..CorrelatorConfig::default()
        });
    }

    /// Applies a reloaded listen front's limits to connections accepted from
    /// now on (those open keep the share they were given).
    pub fn set_listen_limits(&self, front: &crate::config::ListenFront) {
        *self.listen_limits.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(ListenLimits::of(front));
    }

    /// Applies reloaded `timeouts` and `declines`: requests already in flight
    /// keep the deadline they were given; what comes next uses the new ones.
    pub fn set_live(
        &self,
        timeouts: &crate::config::TimeoutConfig,
        declines: crate::route::DeclineCodes,
    ) {
        self.request_timeout_ns
            .store(duration_ns(timeouts.request), Ordering::Relaxed);
        *self.decline_codes.lock().unwrap_or_else(|p| p.into_inner()) = declines;
    }

    /// A process-unique connection ID.
    pub fn next_conn_id(&self) -> u64 {
        self.next_conn_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Starts a graceful shutdown: from now on new requests get the `shutdown`
    /// decline at once, while those in flight still get their node's answer.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Declines every request still in flight with the `shutdown` code (the
    /// end of a graceful shutdown). Returns how many.
    pub fn decline_all(&self, now: Instant) -> usize {
        let mut left = Vec::new();
        self.correlator.drain(now, &mut left);
        let n = left.len();
        for (_, p) in left {
            self.fail(p, DeclineReason::Shutdown, now);
        }
        n
    }

    /// A STAN for a switch-made message.
    pub fn next_stan(&self) -> u32 {
        (self.next_stan.fetch_add(1, Ordering::Relaxed) % 999_999 + 1) as u32
    }

    pub fn in_flight(&self) -> usize {
        self.correlator.len() + self.oneconnect.as_ref().map_or(0, |oc| oc.in_flight())
    }

    /// Checks a message in full against the service's spec and finds its
    /// routing fields, in one pass (see [`Router::check`]).
    pub fn check<'s>(&'s self, payload: Bytes) -> Result<Checked<'s>, Invalid> {
        self.router.check(payload)
    }

    /// A message payload from a front client. Returns false when the client
    /// must be closed (a bad request under the `close` policy).
    pub fn on_request(&self, client: &ClientLink, payload: Bytes, now: Instant) -> bool {
        let routed = self.router.with_request(payload.clone(), |checked| {
            self.route_request(client, checked, &payload, now)
        });
        match routed {
            Ok(keep) => keep,
            Err(why) => self.bad_request(client, &payload, &why, now),
        }
    }

    /// A valid request from a client: within its fair share, accepted.
    fn route_request(
        &self,
        client: &ClientLink,
        checked: &Checked<'_>,
        payload: &Bytes,
        now: Instant,
    ) -> bool {
        let Some(slot) = client.take_slot() else {
            // Over its fair share: this client alone must not fill the table.
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            self.counters.over_share.fetch_add(1, Ordering::Relaxed);
            if self
                .log_limit
                .allow(LogKind::OverShare, LogPeer::Ip(client.peer.ip()), now)
            {
                tracing::warn!(service = self.name(), conn = client.conn, peer = %client.peer, in_flight = client.in_flight.current(), "client over its in-flight share: declined");
            }
            let origin = Origin::Client {
                conn: client.conn,
                tx: client.tx.clone(),
                slot: None,
            };
            self.decline(origin, payload, DeclineReason::QueueFull);
            return true;
        };
        let origin = Origin::Client {
            conn: client.conn,
            tx: client.tx.clone(),
            slot: Some(slot),
        };
        self.accept_request(checked, origin, now);
        true
    }

    /// A request from a front that passed validation: balanced to a node, or
    /// declined.
    fn accept_request(&self, req: &Checked<'_>, origin: Origin, now: Instant) {
        let key = match self.key_of(req) {
            Ok(k) => k,
            Err(e) => {
                // Validation found every field; only a key too long for the
                // table is left, and that request is declined, not forwarded.
                tracing::warn!(service = self.name(), error = %e, "correlation key too long: declined");
                self.decline(origin, req.msg.payload(), DeclineReason::BadMessage);
                return;
            }
        };
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        if self.is_draining() {
            self.decline(origin, req.msg.payload(), DeclineReason::Shutdown);
            return;
        }
        if let Err((origin, reason)) = self.dispatch(req, key, origin, now) {
            self.decline(origin, req.msg.payload(), reason);
        }
    }

    /// A request from a client that failed validation: counted, logged
    /// (masked, rate-limited) and handled by the front's `on_bad_message`
    /// policy. Never forwarded. Returns false when the client must be closed.
    fn bad_request(
        &self,
        client: &ClientLink,
        payload: &Bytes,
        why: &Invalid,
        now: Instant,
    ) -> bool {
        self.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
        let policy = match &self.config.front {
            FrontConfig::Listen(l) => l.on_bad_message,
            // A peer's link is shared by everything the peer sends: never
            // close it for one bad message.
            FrontConfig::Simplex(_) | FrontConfig::Connect(_) => BadMessagePolicy::Decline,
        };
        if self
            .log_limit
            .allow(LogKind::BadMessage, LogPeer::Ip(client.peer.ip()), now)
        {
            tracing::warn!(service = self.name(), conn = client.conn, peer = %client.peer, error = %why, policy = ?policy, "bad request from client");
        }
        match policy {
            BadMessagePolicy::Decline => {
                let origin = Origin::Client {
                    conn: client.conn,
                    tx: client.tx.clone(),
                    slot: None,
                };
                if self.decline(origin, payload, DeclineReason::BadMessage) {
                    self.counters.bad_declined.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.counters.bad_dropped.fetch_add(1, Ordering::Relaxed);
                }
                true
            }
            BadMessagePolicy::Drop => {
                self.counters.bad_dropped.fetch_add(1, Ordering::Relaxed);
                true
            }
            BadMessagePolicy::Close => {
                self.counters.bad_closed.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Picks a node, registers the request, queues it. On failure the origin comes
    /// back so the caller can decline.
    fn dispatch(
        &self,
        req: &Checked<'_>,
        key: CorrelationKey,
        origin: Origin,
        now: Instant,
    ) -> Result<(), (Origin, DeclineReason)> {
        let refuse = |origin, reason| Err((origin, reason));
        let msg = &req.msg;
        let mti = msg.mti().digits();
        let texts = self.router.rule_texts(req);
        let sticky = self.router.sticky_key(req);
        let (node, conn) = match self.pool.pick(&mti, |id| texts.get(id), sticky, now) {
            Ok(p) => p,
            Err(_) => return refuse(origin, DeclineReason::NoHealthyNode),
        };
        let patch = match self.stamp_patch(req, node) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(service = self.name(), error = %e, "F37 stamp failed");
                return refuse(origin, DeclineReason::NoHealthyNode);
            }
        };
        let deadline = now + self.request_timeout();
        let pending = Pending {
            origin,
            request: msg.payload().clone(),
            node,
            sent_at: now,
        };
        // Register before sending, so a fast response always finds its entry.
        if let Err(rejected) = self.correlator.insert(key, pending, conn.id, deadline) {
            self.pool.released(node);
            let reason = match rejected.error {
                CorrelateError::Duplicate => DeclineReason::Duplicate,
                CorrelateError::Full => DeclineReason::QueueFull,
            };
            return refuse(rejected.value.origin, reason);
        }
        match conn
            .tx
            .try_send(Outbound::Message(msg.payload().clone(), patch))
        {
            Ok(()) => Ok(()),
            Err(e) => {
                let reason = match e {
                    mpsc::error::TrySendError::Full(_) => DeclineReason::QueueFull,
                    mpsc::error::TrySendError::Closed(_) => DeclineReason::NodeLost,
                };
                // Take it back; if it is already gone, someone else answered it.
                let taken = self.correlator.cancel(&key, now);
                match taken {
                    Some(p) => {
                        self.pool.released(node);
                        refuse(p.origin, reason)
                    }
                    None => Ok(()),
                }
            }
        }
    }

    /// The F37 stamp of a request going to `node`. On a simplex front only
    /// node-originated requests are stamped: the peer's own requests keep their
    /// F37, which the peer matches its responses on.
    fn stamp_patch(&self, req: &Checked<'_>, node: usize) -> Result<Patch, String> {
        if !matches!(self.config.front, FrontConfig::Listen(_)) {
            return Ok(Patch::default());
        }
        self.f37_patch(req, node)
    }

    fn f37_patch(&self, req: &Checked<'_>, node: usize) -> Result<Patch, String> {
        let node = self.pool.node(node).ok_or("no such node")?;
        self.router.f37_patch(req, &node.id)
    }

    /// The correlation key of a request or response.
    fn key_of(&self, checked: &Checked<'_>) -> Result<CorrelationKey, KeyError> {
        self.router.key_of(checked)
    }

    /// A frame from a node connection.
    pub fn on_node_frame(&self, node: usize, conn: u64, payload: Bytes, now: Instant) {
        let checked = self
            .router
            .with_checked(payload, |checked| self.on_node_message(node, checked, now));
        match checked {
            Ok(()) => {}
            Err(e) => {
                // A response the client could not parse either: dropped, and
                // its request times out (the node's own fault).
                self.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
                if self
                    .log_limit
                    .allow(LogKind::BadMessage, LogPeer::Node(node), now)
                {
                    tracing::warn!(service = self.name(), node, conn, error = %e, "bad message from node; dropped");
                }
            }
        }
    }

    /// A valid message from a node: a response to route back, or (on a
    /// simplex service) a request of the node's own for the peer.
    fn on_node_message(&self, node: usize, checked: &Checked<'_>, now: Instant) {
        let msg = &checked.msg;
        if msg.mti().is_request() {
            if self.out_links.is_some() {
                self.forward_node_request(node, checked);
            } else {
                self.counters.unexpected.fetch_add(1, Ordering::Relaxed);
                if self
                    .log_limit
                    .allow(LogKind::StrayResponse, LogPeer::Node(node), now)
                {
                    tracing::warn!(service = self.name(), node, mti = %msg.mti(), "node-originated request on a listen service; dropped");
                }
            }
            return;
        }
        let key = match self.key_of(checked) {
            Ok(k) => k,
            Err(e) => {
                self.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
                if self
                    .log_limit
                    .allow(LogKind::BadMessage, LogPeer::Node(node), now)
                {
                    tracing::warn!(service = self.name(), node, error = %e, "response key too long; dropped");
                }
                return;
            }
        };
        let taken = self.correlator.take(&key, now);
        match taken {
            Ok(p) => self.deliver(p, msg, now),
            Err(miss) => {
                let counter = match miss {
                    Miss::Late => &self.counters.late_responses,
                    Miss::Unknown => &self.counters.unknown_responses,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if self
                    .log_limit
                    .allow(LogKind::StrayResponse, LogPeer::Node(node), now)
                {
                    let why = match miss {
                        Miss::Late => "late response dropped: its request was already declined",
                        Miss::Unknown => "response matches no request; dropped",
                    };
                    tracing::warn!(service = self.name(), node, mti = %msg.mti(), message = %summary(msg), "{why}");
                }
            }
        }
    }

    fn deliver(&self, p: Pending, response: &Message<'_>, now: Instant) {
        let (conn, tx) = match p.origin {
            Origin::Check(waiter) => {
                let _ = waiter.send(());
                return;
            }
            Origin::Client { conn, tx, .. } => (conn, tx),
            Origin::Peer => {
                let latency = now.saturating_duration_since(p.sent_at);
                self.pool.finished(p.node, true, latency, now);
                self.counters.answered.fetch_add(1, Ordering::Relaxed);
                self.to_peer(Outbound::message(response.payload().clone()));
                return;
            }
        };
        let latency = now.saturating_duration_since(p.sent_at);
        self.pool.finished(p.node, true, latency, now);
        self.counters.answered.fetch_add(1, Ordering::Relaxed);
        let patch = self.response_tpdu_patch(&p.request);
        let out = Outbound::Message(response.payload().clone(), patch);
        if tx.try_send(out).is_err() && self.undeliverable(now) {
            tracing::warn!(
                service = self.name(),
                conn,
                "client gone or not reading: response dropped"
            );
        }
    }

    /// A request that will get no node response: decline it (a health check's
    /// waiter just sees its sender dropped, a failed check).
    fn fail(&self, p: Pending, reason: DeclineReason, now: Instant) {
        if matches!(p.origin, Origin::Check(_)) {
            return;
        }
        if reason.counts_against_node() {
            let waited = now.saturating_duration_since(p.sent_at);
            self.pool.finished(p.node, false, waited, now);
        } else {
            self.pool.finished_without_verdict(p.node);
        }
        self.decline(p.origin, &p.request, reason);
    }

    /// The TPDU edit for a response to `request`, by the service's policy.
    /// Counts an answer that found no way out; whether to log it (at most
    /// a few lines a second, the rest summed up).
    fn undeliverable(&self, now: Instant) -> bool {
        self.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
        self.log_limit
            .allow(LogKind::Undeliverable, LogPeer::Service, now)
    }

    fn response_tpdu_patch(&self, request: &[u8]) -> Patch {
        self.router.response_tpdu_patch(request)
    }

    /// Answers `origin` with a switch-made response to `request`. Returns
    /// whether an answer was built and queued.
    fn decline(&self, origin: Origin, request: &Bytes, reason: DeclineReason) -> bool {
        if matches!(origin, Origin::Check(_)) {
            // A health check's waiter sees its sender dropped: a failed check.
            return false;
        }
        let code = self.decline_code(reason);
        let resp = match crate::link::decline::build(&self.spec, request, code) {
            Ok(resp) => resp,
            Err(e) => {
                // Only a request too broken to read its MTI gets here: every
                // request routed passed validation first.
                self.counters.undeclinable.fetch_add(1, Ordering::Relaxed);
                if self
                    .log_limit
                    .allow(LogKind::BadMessage, LogPeer::Service, Instant::now())
                {
                    tracing::warn!(service = self.name(), error = %e, ?reason, "cannot build a decline");
                }
                return false;
            }
        };
        self.counters.declined[reason as usize].fetch_add(1, Ordering::Relaxed);
        match origin {
            Origin::Client { tx, .. } => {
                let patch = self.response_tpdu_patch(request);
                if tx.try_send(Outbound::Message(resp, patch)).is_err() {
                    self.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
                true
            }
            Origin::Peer => self.to_peer(Outbound::message(resp)),
            Origin::Check(_) => false,
        }
    }

    /// Declines every request whose deadline has passed. Returns how many.
    pub fn expire(&self, now: Instant, scratch: &mut Vec<(CorrelationKey, Pending)>) -> usize {
        scratch.clear();
        self.correlator.expire(now, scratch);
        let n = scratch.len();
        for (_, p) in scratch.drain(..) {
            self.fail(p, DeclineReason::Timeout, now);
        }
        n
    }

    /// A node connection died: decline what it carried.
    pub fn connection_lost(&self, conn: u64, now: Instant) -> usize {
        let mut lost = Vec::new();
        self.correlator.take_via(conn, now, &mut lost);
        let n = lost.len();
        for (_, p) in lost {
            self.fail(p, DeclineReason::NodeLost, now);
        }
        n
    }

    /// Sets a node's administrative state: `drain` lets its in-flight requests
    /// finish; `disabled` also declines them at once (reason `shutdown`). The
    /// connections stay up so that re-enabling is immediate. The admin API
    /// calls this.
    pub fn set_node_admin(
        &self,
        node: usize,
        admin: crate::route::AdminState,
        now: Instant,
    ) -> bool {
        if !self.pool.set_admin(node, admin, now) {
            return false;
        }
        if admin == crate::route::AdminState::Disabled
            && let Some(n) = self.pool.node(node)
        {
            let mut gone = Vec::new();
            for conn in n.live_conn_ids() {
                self.correlator.take_via(conn, now, &mut gone);
            }
            for (_, p) in gone {
                self.fail(p, DeclineReason::Shutdown, now);
            }
        }
        true
    }

    /// Sends an echo test to `node` over one of its connections and registers it
    /// like a request. The receiver fires when the echo response arrives; it is
    /// dropped on timeout or connection loss.
    pub fn send_echo(
        &self,
        node: usize,
        now: Instant,
        timeout: Duration,
    ) -> Option<oneshot::Receiver<()>> {
        let conn = self.pool.node(node)?.live_conn()?;
        let payload = self.network_request(NmKind::Echo, self.next_stan()).ok()?;
        let checked = self.check(payload.clone()).ok()?;
        let key = self.key_of(&checked).ok()?;
        let (tx, rx) = oneshot::channel();
        let pending = Pending {
            origin: Origin::Check(tx),
            request: payload.clone(),
            node,
            sent_at: now,
        };
        self.correlator
            .insert(key, pending, conn.id, now + timeout)
            .ok()?;
        conn.tx.try_send(Outbound::message(payload)).ok()?;
        Some(rx)
    }
}

/// What the OneConnect pool (`link/oneconnect.rs`) uses of the per-message
/// path, so that it validates, answers, declines and picks exactly as the
/// keyed path does.
impl Service {
    /// Ingress validation of a OneConnect request: no key field is required,
    /// since the answer is whatever the request's pool connection carries next.
    pub(crate) fn oc_check_request(&self, payload: Bytes) -> Result<(), Invalid> {
        let checked = self.check(payload)?;
        let mti = checked.msg.mti();
        if !mti.is_request() {
            return Err(Invalid::NotARequest(mti));
        }
        self.router.check_accepted(&checked)
    }

    pub(crate) fn oc_bad_request(
        &self,
        client: &ClientLink,
        payload: &Bytes,
        why: &Invalid,
        now: Instant,
    ) -> bool {
        self.bad_request(client, payload, why, now)
    }

    pub(crate) fn oc_decline(&self, origin: Origin, request: &Bytes, reason: DeclineReason) {
        self.decline(origin, request, reason);
    }

    pub(crate) fn oc_response_patch(&self, request: &[u8]) -> Patch {
        self.response_tpdu_patch(request)
    }

    pub(crate) fn oc_stamp_patch(&self, req: &Checked<'_>, node: usize) -> Result<Patch, String> {
        self.stamp_patch(req, node)
    }

    /// Picks a node for `req` (rules, sticky key, algorithm) among those
    /// `usable` accepts.
    pub(crate) fn oc_pick(
        &self,
        req: &Checked<'_>,
        now: Instant,
        usable: impl Fn(usize) -> bool,
    ) -> Result<usize, super::pool::PickError> {
        let mti = req.msg.mti().digits();
        let texts = self.router.rule_texts(req);
        let sticky = self.router.sticky_key(req);
        self.pool
            .pick_where(&mti, |id| texts.get(id), sticky, now, usable)
    }

    /// True if some node `usable` accepts could take `req` now.
    pub(crate) fn oc_any_eligible(
        &self,
        req: &Checked<'_>,
        now: Instant,
        usable: impl Fn(usize) -> bool,
    ) -> bool {
        let mti = req.msg.mti().digits();
        let texts = self.router.rule_texts(req);
        self.pool
            .any_eligible(&mti, |id| texts.get(id), now, usable)
    }
}

/// MTI and the non-secret key fields of a message, for logs.
fn summary(msg: &Message<'_>) -> String {
    let text = |id: u16| {
        msg.field(id)
            .ok()
            .flatten()
            .map(|f| f.show().to_string())
            .unwrap_or_else(|| "-".into())
    };
    format!(
        "{} F11={} F37={} F41={}",
        msg.mti(),
        text(11),
        text(37),
        text(41)
    )
}

/// The limits of a listen front that a reload may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenLimits {
    pub max_connections: usize,
    pub max_per_source: usize,
    pub max_in_flight_per_connection: usize,
    pub max_in_flight_per_source: usize,
}

impl ListenLimits {
    /// The keys of `[service.front]` these are (reload compares the rest).
    pub const KEYS: [&'static str; 4] = [
        "max_connections",
        "max_per_source",
        "max_in_flight_per_connection",
        "max_in_flight_per_source",
    ];

    fn of(f: &crate::config::ListenFront) -> ListenLimits {
        ListenLimits {
            max_connections: f.max_connections,
            max_per_source: f.max_per_source,
            max_in_flight_per_connection: f.max_in_flight_per_connection,
            max_in_flight_per_source: f.max_in_flight_per_source,
        }
    }

    fn apply(self, f: &mut crate::config::ListenFront) {
        f.max_connections = self.max_connections;
        f.max_per_source = self.max_per_source;
        f.max_in_flight_per_connection = self.max_in_flight_per_connection;
        f.max_in_flight_per_source = self.max_in_flight_per_source;
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixed part of a request in flight, as docs/config.md states it
    /// (memory per request in flight): a key in the table and in the deadline
    /// index, the pending state and its origin. The request's bytes come on top.
    #[test]
    fn instances_start_their_stans_apart() {
        let toml = "[[service]]\nname = \"up\"\nspec = \"cups\"\n\
             [service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:0\"\n\
             [[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:9\"\n";
        let cfg = crate::config::Config::from_toml(toml).expect("config");
        let firsts: Vec<u32> = (0..3)
            .map(|_| {
                let spec = Spec::builtin("cups").expect("cups");
                let svc =
                    Service::new(cfg.services[0].clone(), spec, Instant::now()).expect("service");
                let stan = svc.next_stan();
                assert!((1..=999_999).contains(&stan));
                assert_eq!(svc.next_stan(), stan % 999_999 + 1, "then one by one");
                stan
            })
            .collect();
        assert!(
            firsts.windows(2).any(|w| w[0] != w[1]),
            "three instances of one config start at the same STAN: {firsts:?}"
        );
    }

    #[test]
    fn fixed_memory_per_request_in_flight_is_as_documented() {
        let key = std::mem::size_of::<CorrelationKey>();
        let pending = std::mem::size_of::<Pending>();
        assert!(key <= 72, "key {key} bytes");
        // Table entry (key + pending + deadline + tag) and index entry (key +
        // deadline + sequence), before the maps' own overhead.
        let fixed = key + pending + 32 + key + 24;
        assert!(fixed <= 400, "{fixed} bytes before map overhead");
    }
}
