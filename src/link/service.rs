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

use super::pool::NodePool;
use super::writer::{Outbound, Patch};
use crate::iso8583::{Message, Spec};
use crate::ops::config::{KeyPart, ServiceConfig, TpduPolicy};
use crate::route::{
    Algorithm, CorrelateError, CorrelationKey, Correlator, CorrelatorConfig, DeclineReason, Miss,
};
use crate::wire::Tpdu;

/// Where the answer to a request goes.
#[derive(Debug)]
pub enum Origin {
    /// A front connection: its writer queue and its ID (for logs).
    Client {
        conn: u64,
        tx: mpsc::Sender<Outbound>,
    },
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
    pub bad_messages: AtomicU64,
    pub bad_frames: AtomicU64,
    pub undeliverable: AtomicU64,
    pub unexpected: AtomicU64,
    pub clients_accepted: AtomicU64,
    pub clients_refused: AtomicU64,
    pub keep_alives: AtomicU64,
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

pub struct Service {
    pub config: ServiceConfig,
    pub spec: Arc<Spec>,
    pub pool: NodePool,
    correlator: Mutex<Correlator<Pending>>,
    key_parts: Vec<KeyPart>,
    /// Fields the directed rules look at (their text forms are needed per request).
    rule_fields: Vec<u16>,
    pub counters: ServiceCounters,
    next_conn_id: AtomicU64,
    started: Instant,
}

/// A request that could not be routed: the reason and the request itself.
struct Refusal {
    reason: DeclineReason,
}

impl Service {
    pub fn new(config: ServiceConfig, spec: Spec, now: Instant) -> Result<Service, String> {
        let pool = NodePool::new(&config.back, now)?;
        let key_parts = if config.correlation.key.is_empty() {
            default_key(&spec)
        } else {
            config.correlation.key.clone()
        };
        let correlator = Correlator::new(CorrelatorConfig {
            capacity: config.correlation.max_in_flight,
            ..CorrelatorConfig::default()
        });
        let mut rule_fields: Vec<u16> = config
            .back
            .rules
            .iter()
            .flat_map(|r| r.fields.iter().map(|f| f.field))
            .collect();
        rule_fields.sort_unstable();
        rule_fields.dedup();
        if rule_fields.len() > FieldTexts::MAX {
            return Err(format!(
                "directed rules look at {} distinct fields; at most {} are supported",
                rule_fields.len(),
                FieldTexts::MAX
            ));
        }
        Ok(Service {
            rule_fields,
            config,
            spec: Arc::new(spec),
            pool,
            correlator: Mutex::new(correlator),
            key_parts,
            counters: ServiceCounters::default(),
            next_conn_id: AtomicU64::new(1),
            started: now,
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn uptime(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.started)
    }

    /// A process-unique connection ID.
    pub fn next_conn_id(&self) -> u64 {
        self.next_conn_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn in_flight(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Correlator<Pending>> {
        self.correlator.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A message payload from a front client. Returns false when the client
    /// must be closed (a bad message under the `close` policy).
    pub fn on_request(
        &self,
        conn: u64,
        tx: &mpsc::Sender<Outbound>,
        payload: Bytes,
        now: Instant,
    ) -> bool {
        let msg = match Message::parse(&self.spec, payload.clone()) {
            Ok(m) => m,
            Err(e) => return self.bad_message(conn, &e),
        };
        if !msg.mti().is_request() {
            self.counters.unexpected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(service = self.name(), conn, mti = %msg.mti(), "a client sent a non-request; dropped");
            return true;
        }
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let key = match self.key_of(&msg) {
            Ok(k) => k,
            Err(e) => return self.bad_message(conn, &e),
        };
        let origin = Origin::Client {
            conn,
            tx: tx.clone(),
        };
        if let Err((origin, refusal)) = self.dispatch(&msg, key, origin, now) {
            self.decline(origin, &payload, refusal.reason);
        }
        true
    }

    fn bad_message(&self, conn: u64, err: &dyn std::fmt::Display) -> bool {
        self.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(service = self.name(), conn, error = %err, "unparsable message from client");
        self.config_bad_message_keeps_client()
    }

    fn config_bad_message_keeps_client(&self) -> bool {
        match &self.config.front {
            crate::ops::config::FrontConfig::Listen(l) => {
                l.on_bad_message == crate::ops::config::BadMessagePolicy::Drop
            }
        }
    }

    /// Picks a node, registers the request, queues it. On failure the origin comes
    /// back so the caller can decline.
    fn dispatch(
        &self,
        msg: &Message<'_>,
        key: CorrelationKey,
        origin: Origin,
        now: Instant,
    ) -> Result<(), (Origin, Refusal)> {
        let refuse = |origin, reason| Err((origin, Refusal { reason }));
        let mti = msg.mti().digits();
        let texts = FieldTexts::of(msg, &self.rule_fields);
        let sticky = self.sticky_key(msg);
        let (node, conn) = match self.pool.pick(&mti, |id| texts.get(id), sticky, now) {
            Ok(p) => p,
            Err(_) => return refuse(origin, DeclineReason::NoHealthyNode),
        };
        let patch = match self.stamp_patch(msg, node) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(service = self.name(), error = %e, "F37 stamp failed");
                return refuse(origin, DeclineReason::NoHealthyNode);
            }
        };
        let deadline = now + self.config.timeouts.request;
        let pending = Pending {
            origin,
            request: msg.payload().clone(),
            node,
            sent_at: now,
        };
        // Register before sending, so a fast response always finds its entry.
        if let Err(rejected) = self.lock().insert(key, pending, conn.id, deadline) {
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
                let taken = self.lock().cancel(&key, now);
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

    fn sticky_key<'m>(&self, msg: &'m Message<'_>) -> Option<&'m [u8]> {
        if self.config.back.algorithm != Algorithm::Sticky {
            return None;
        }
        let id = self.config.back.sticky_field;
        msg.field(id).ok().flatten().map(|f| f.data())
    }

    fn stamp_patch(&self, msg: &Message<'_>, node: usize) -> Result<Patch, String> {
        let mut patch = Patch::default();
        let Some(stamp) = &self.config.f37_stamp else {
            return Ok(patch);
        };
        let f37 = msg
            .field(37)
            .map_err(|e| e.to_string())?
            .ok_or("request has no F37 to stamp")?;
        let mut window = [0u8; 12];
        let len = f37.data().len().min(window.len());
        window[..len].copy_from_slice(&f37.data()[..len]);
        let id = &self.pool.nodes()[node].id;
        stamp
            .stamp(&mut window[..len], id)
            .map_err(|e| e.to_string())?;
        patch
            .overwrite(f37.range().start, &window[..len])
            .map_err(|e| e.to_string())?;
        Ok(patch)
    }

    /// The correlation key of a request or response.
    fn key_of(&self, msg: &Message<'_>) -> Result<CorrelationKey, String> {
        // The message class (first two MTI digits) keeps a reversal or a network
        // message apart from a purchase that shares its key fields.
        let mti = msg.mti().digits();
        let mut b = CorrelationKey::builder().push(&mti[..2]);
        for part in &self.key_parts {
            match part {
                KeyPart::Tpdu => {
                    let t = msg.tpdu().ok_or("no TPDU for the correlation key")?;
                    // Order-insensitive, so swapped and echoed TPDUs both match.
                    let (a, c) = (t.destination, t.source);
                    let (lo, hi) = if a <= c { (a, c) } else { (c, a) };
                    b = b.push(&lo).push(&hi);
                }
                KeyPart::Field(id) => {
                    let f = msg.field(*id).map_err(|e| e.to_string())?;
                    b = b.push(f.map_or(&[][..], |f| f.data()));
                }
            }
        }
        b.build().map_err(|e| e.to_string())
    }

    /// A frame from a node connection.
    pub fn on_node_frame(&self, node: usize, conn: u64, payload: Bytes, now: Instant) {
        let msg = match Message::parse(&self.spec, payload.clone()) {
            Ok(m) => m,
            Err(e) => {
                self.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(service = self.name(), node, conn, error = %e, "unparsable message from node");
                return;
            }
        };
        if msg.mti().is_request() {
            self.counters.unexpected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(service = self.name(), node, mti = %msg.mti(), "node-originated request on a listen service; dropped");
            return;
        }
        let key = match self.key_of(&msg) {
            Ok(k) => k,
            Err(e) => {
                self.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(service = self.name(), node, error = %e, "response without its key fields");
                return;
            }
        };
        let taken = self.lock().take(&key, now);
        match taken {
            Ok(p) => self.deliver(p, &msg, now),
            Err(Miss::Late) => {
                self.counters.late_responses.fetch_add(1, Ordering::Relaxed);
                tracing::info!(service = self.name(), node, mti = %msg.mti(), message = %summary(&msg), "late response dropped: its request was already declined");
            }
            Err(Miss::Unknown) => {
                self.counters
                    .unknown_responses
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(service = self.name(), node, mti = %msg.mti(), message = %summary(&msg), "response matches no request; dropped");
            }
        }
    }

    fn deliver(&self, p: Pending, response: &Message<'_>, now: Instant) {
        let (conn, tx) = match p.origin {
            Origin::Check(waiter) => {
                let _ = waiter.send(());
                return;
            }
            Origin::Client { conn, tx } => (conn, tx),
        };
        let latency = now.saturating_duration_since(p.sent_at);
        self.pool.finished(p.node, true, latency, now);
        self.counters.answered.fetch_add(1, Ordering::Relaxed);
        let patch = self.response_tpdu_patch(&p.request);
        let out = Outbound::Message(response.payload().clone(), patch);
        if tx.try_send(out).is_err() {
            self.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
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
        let waited = now.saturating_duration_since(p.sent_at);
        self.pool.finished(p.node, false, waited, now);
        self.decline(p.origin, &p.request, reason);
    }

    /// The TPDU edit for a response to `request`, by the service's policy.
    fn response_tpdu_patch(&self, request: &[u8]) -> Patch {
        let mut patch = Patch::default();
        if !self.spec.envelope().tpdu {
            return patch;
        }
        let Ok(t) = Tpdu::parse(request) else {
            return patch;
        };
        let tpdu = match self.config.correlation.tpdu_on_response {
            TpduPolicy::Swap => t.swapped(),
            TpduPolicy::Echo => t,
            TpduPolicy::Node => return patch,
        };
        // Offset 0 and five bytes always fit a patch slot.
        let _ = patch.overwrite(0, &tpdu.to_bytes());
        patch
    }

    /// Answers `origin` with a switch-made response to `request`.
    fn decline(&self, origin: Origin, request: &Bytes, reason: DeclineReason) {
        self.counters.declined[reason as usize].fetch_add(1, Ordering::Relaxed);
        let Origin::Client { conn, tx } = origin else {
            return; // A health check's waiter sees its sender dropped: a failed check.
        };
        let code = self.config.declines.code(reason);
        match crate::link::decline::build(&self.spec, request, code) {
            Ok(resp) => {
                let patch = self.response_tpdu_patch(request);
                if tx.try_send(Outbound::Message(resp, patch)).is_err() {
                    self.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                self.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
                tracing::error!(service = self.name(), conn, error = %e, ?reason, "cannot build a decline");
            }
        }
    }

    /// Declines every request whose deadline has passed. Returns how many.
    pub fn expire(&self, now: Instant, scratch: &mut Vec<(CorrelationKey, Pending)>) -> usize {
        scratch.clear();
        self.lock().expire(now, scratch);
        let n = scratch.len();
        for (_, p) in scratch.drain(..) {
            self.fail(p, DeclineReason::Timeout, now);
        }
        n
    }

    /// A node connection died: decline what it carried.
    pub fn connection_lost(&self, conn: u64, now: Instant) -> usize {
        let mut lost = Vec::new();
        self.lock().take_via(conn, now, &mut lost);
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
                self.lock().take_via(conn, now, &mut gone);
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
        let stan = (self.next_conn_id() % 1_000_000) as u32;
        let payload = crate::link::decline::echo_request(&self.spec, stan).ok()?;
        let msg = Message::parse(&self.spec, payload.clone()).ok()?;
        let key = self.key_of(&msg).ok()?;
        let (tx, rx) = oneshot::channel();
        let pending = Pending {
            origin: Origin::Check(tx),
            request: payload.clone(),
            node,
            sent_at: now,
        };
        self.lock()
            .insert(key, pending, conn.id, now + timeout)
            .ok()?;
        conn.tx.try_send(Outbound::message(payload)).ok()?;
        Some(rx)
    }
}

/// The key that ties a response to its request when the config names none.
pub fn default_key(spec: &Spec) -> Vec<KeyPart> {
    let has = |id| spec.field(id).is_some();
    if spec.envelope().tpdu {
        // POS through a NAC: many NACs and uplinks share TPDU addresses, so the
        // terminal ID and STAN make the key unique.
        vec![KeyPart::Tpdu, KeyPart::Field(41), KeyPart::Field(11)]
    } else if has(32) && has(33) {
        // UnionPay: a request and its response share F7 + F11 + F32 + F33.
        vec![
            KeyPart::Field(7),
            KeyPart::Field(11),
            KeyPart::Field(32),
            KeyPart::Field(33),
        ]
    } else {
        vec![KeyPart::Field(11), KeyPart::Field(41)]
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

/// The text forms (ASCII digits for BCD, Latin-1 text) of the few fields that
/// directed rules compare with prefixes, decoded onto the stack: no allocation
/// per request.
struct FieldTexts {
    ids: [u16; FieldTexts::MAX],
    texts: [[u8; FieldTexts::TEXT]; FieldTexts::MAX],
    lens: [usize; FieldTexts::MAX],
    n: usize,
}

impl FieldTexts {
    const MAX: usize = 8;
    /// Rule prefixes are short; longer values are compared on their first bytes.
    const TEXT: usize = 32;

    fn of(msg: &Message<'_>, ids: &[u16]) -> FieldTexts {
        let mut t = FieldTexts {
            ids: [0; Self::MAX],
            texts: [[0; Self::TEXT]; Self::MAX],
            lens: [0; Self::MAX],
            n: 0,
        };
        for &id in ids.iter().take(Self::MAX) {
            let Ok(Some(f)) = msg.field(id) else { continue };
            let slot = t.n;
            t.ids[slot] = id;
            for (dst, b) in t.texts[slot].iter_mut().zip(f.logical()) {
                *dst = b;
                t.lens[slot] += 1;
            }
            t.n += 1;
        }
        t
    }

    fn get(&self, id: u16) -> Option<&[u8]> {
        let i = self.ids[..self.n].iter().position(|&x| x == id)?;
        Some(&self.texts[i][..self.lens[i]])
    }
}
