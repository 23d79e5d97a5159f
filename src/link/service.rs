//! A running service: the routing decisions of `route/` applied to live links.
//! Front readers hand requests to [`Service::on_request`]; node readers hand
//! responses to [`Service::on_node_frame`]; a sweeper declines what expires.
//! Every request accepted from a front gets exactly one answer: the correlator
//! hands each entry out once, to a response, a timeout or a dead connection.
//!
//! The service is the routing core; around it, each in a file of its own:
//! [`LiveSettings`] (what a reload changes, swapped whole), [`FrontSide`]
//! (what the front kind adds: the OneConnect pool, or the [`peer`] side of a
//! simplex or duplex front), [`Links`] (its connections and what admits
//! them), [`SwitchMade`] (the switch's own messages) and [`ServiceCounters`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use arc_swap::ArcSwap;
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::client::{ClientLink, InFlightSlot};
use super::log_limit::{LogKind, LogPeer};
use super::netmgmt::{NetworkTemplate, TemplateError};
use super::pool::NodePool;
use super::writer::{Outbound, Patch};
use crate::config::{Advices, BadMessagePolicy, ConfigError, FrontConfig, ServiceConfig};
use crate::iso8583::{Message, Spec};
use crate::route::Router;
use crate::route::integrity::Identity;
use crate::route::{
    Algorithm, CorrelateError, CorrelationKey, CorrelatorConfig, DeclineReason, Miss, OnTimeout,
    RouterConfig, RouterError, Shards, StampError,
};

mod counters;
mod ending;
mod journaled;
mod keys;
mod links;
mod live;
mod made;
mod owed;
pub mod peer;
mod seen;
mod side;
mod undelivered;

use crate::journal::row::RequestAt;
use crate::journal::{AnsweredBy, BadOutcome, Link};
pub use counters::{PeerCounters, Refusal, ServiceCounters};
pub use journaled::JournalTap;
use journaled::link_of;
pub use links::Links;
pub use live::{ListenLimits, LiveSettings};
pub use made::{IntegrityCounters, SafOutbox, SwitchMade};
pub use owed::AnswerFrom;
pub(crate) use owed::{answered as owed_answered, attempt_failed as owed_attempt_failed};
pub(crate) use owed::{record_attempt, record_dead};
pub use seen::SameRequest;
pub use side::{FrontSide, PeerSide};
pub(crate) use undelivered::{oneconnect_undelivered, oneconnect_unknown};

/// Why a service cannot be built from its config; each names its key.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Router(#[from] RouterError),
    #[error(transparent)]
    Stamp(#[from] StampError),
    #[error(transparent)]
    Network(#[from] TemplateError),
    #[error(transparent)]
    Pool(#[from] super::pool::PoolError),
    #[error(transparent)]
    OneConnect(#[from] super::oneconnect_pool::IdleTimeoutZero),
    /// The duplicate check's fields do not fit the field index beside
    /// routing's.
    #[error(
        "integrity.duplicate_fields: with the correlation key, rules and routing, more fields than one pass can index"
    )]
    TooManyFields,
    /// An approval code that is not a value of the spec's F39.
    #[error("integrity.approval_codes: {0}")]
    ApprovalCodes(#[from] crate::iso8583::IsoError),
}

/// Where the answer to a request goes.
#[derive(Debug)]
pub enum Origin {
    /// A front connection: its writer queue, its ID (for logs) and the
    /// request's place under the client's in-flight share (given back when
    /// the request leaves the correlator, however it leaves).
    Client {
        conn: u64,
        tx: super::direct::LinkTx,
        slot: Option<InFlightSlot>,
    },
    /// The peer of a simplex front: the answer leaves on any live out link.
    Peer,
    /// A switch-made health check waiting for its echo response.
    Check(oneshot::Sender<()>),
    /// A message the switch owes (a reversal, a stored advice), sent from the
    /// store-and-forward queue: its answer completes the store entry.
    Owed {
        id: crate::store::SafId,
        /// The switch's own reversal or a stored client advice: its answer
        /// is counted as what the entry is, whatever the answer's MTI (a
        /// stored 0420 reversal advice is an advice delivered).
        kind: crate::store::SafKind,
        attempt: u32,
        expires_at: i64,
    },
    /// A node's own request to the peer (simplex and duplex fronts): the
    /// peer's answer goes back to that node.
    Node,
}

/// A request in flight, as the correlator keeps it.
#[derive(Debug)]
pub struct Pending {
    pub origin: Origin,
    /// The request as received, to build a decline from.
    pub request: Bytes,
    /// Where its journal fields lie, for its row (journaled services).
    pub journal_at: Option<RequestAt>,
    pub node: usize,
    pub sent_at: Instant,
    /// What the switch does if no answer comes by the deadline.
    pub on_timeout: OnTimeout,
    /// What makes it the same as another request, and who else waits for
    /// its answer.
    pub same: SameRequest,
}

pub use crate::route::{Checked, Invalid};

pub struct Service {
    pub config: ServiceConfig,
    pub pool: NodePool,
    /// Validation, correlation keys, stamps: the service's routing decisions.
    pub router: Router,
    /// Requests in flight, by correlation key.
    pub(crate) in_flight: Shards<Pending>,
    /// What a reload changes, read per request without a lock.
    live: ArcSwap<LiveSettings>,
    /// What the front kind adds: the OneConnect pool or the peer side.
    pub side: FrontSide,
    /// The service's connections and what admits them.
    pub links: Links,
    /// The switch's own messages.
    pub made: SwitchMade,
    pub counters: ServiceCounters,
    /// Where completed exchanges are recorded; none without a store.
    journal: std::sync::OnceLock<JournalTap>,
}

impl Service {
    pub fn new(config: ServiceConfig, spec: Spec, now: Instant) -> Result<Service, ServiceError> {
        let pool = NodePool::new(&config.name, &config.back, now)?;
        let spec = Arc::new(spec);
        let mut router = Router::new(
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
        )?;
        // The duplicate check reads its fields from the index validation
        // builds, in the same pass.
        let duplicates = &config.integrity;
        if !duplicates.duplicate_window.is_zero()
            && !router.index_also(&duplicates.duplicate_fields)
        {
            return Err(ServiceError::TooManyFields);
        }
        let mut made = SwitchMade::new(
            NetworkTemplate::for_service(&config, &spec)?,
            &config,
            &spec,
        )?;
        // The key holds its fields' bytes already (the router's key: the
        // configured one, else the dialect's): the fingerprint reads the rest.
        let key = match &config.correlation.key {
            k if k.is_empty() => crate::route::default_key(&spec),
            k => k.clone(),
        };
        let beside_key = duplicates.duplicate_fields.iter().copied();
        let beside_key = beside_key.filter(|&id| !key.contains(&crate::route::KeyPart::Field(id)));
        made.duplicates.tell_apart_by(beside_key.collect());
        // The correlation table keeps the answers duplicates get.
        let in_flight = Shards::with_keeping(
            CorrelatorConfig {
                capacity: config.correlation.max_in_flight,
                ..CorrelatorConfig::default()
            },
            Arc::clone(made.duplicates.keeping()),
        );
        Ok(Service {
            side: FrontSide::for_service(&config, now)?,
            live: ArcSwap::from_pointee(LiveSettings::of(&config)?),
            made,
            router,
            links: Links::default(),
            config,
            pool,
            in_flight,
            counters: ServiceCounters::default(),
            journal: std::sync::OnceLock::new(),
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The service's dialect.
    pub fn spec(&self) -> &Arc<Spec> {
        self.router.spec()
    }

    /// The settings a reload changes, as they are now.
    pub fn live(&self) -> arc_swap::Guard<Arc<LiveSettings>> {
        self.live.load()
    }

    /// Applies a reloaded config's live part: requests already in flight
    /// keep the deadline they were given, connections already open the share
    /// they were given; what comes next uses the new settings. A lower
    /// `correlation.max_in_flight` keeps the requests in flight past it and
    /// declines new ones until there is room.
    pub fn reload_live(&self, config: &ServiceConfig) -> Result<(), ConfigError> {
        self.live.store(Arc::new(LiveSettings::of(config)?));
        self.in_flight.set_config(CorrelatorConfig {
            capacity: config.correlation.max_in_flight,
            ..CorrelatorConfig::default()
        });
        Ok(())
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len() + self.side.oneconnect().map_or(0, |oc| oc.in_flight())
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
                .links
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
        let key = match self.router.key_of(req) {
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
        if self.links.is_draining() {
            self.decline(origin, req.msg.payload(), DeclineReason::Shutdown);
            return;
        }
        let mti = req.msg.mti();
        let origin = if self.made.integrity.advices == Advices::StoreAndForward
            && crate::route::integrity::is_advice(mti)
            && mti.class() != 8
        {
            // Back when it cannot be stored without sensitive
            // authentication data: then it is forwarded, as in forward mode.
            match owed::store_advice(self, req, origin) {
                Ok(()) => return,
                Err(origin) => origin,
            }
        } else {
            origin
        };
        // A repeat of an original the switch has reversed (a timeout
        // reversal, or a late approval's) is never relayed: the host's
        // approval of it would leave the ledger reversed and the terminal
        // approved.
        if mti.is_repeat()
            && crate::route::integrity::is_approvable(mti)
            && self.made.late.reversal_owed(&key, now)
        {
            self.made
                .counters
                .repeats_of_reversed
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(service = self.name(), message = %summary(&req.msg), "repeat of a request the switch reversed: declined, not relayed");
            self.decline(origin, req.msg.payload(), DeclineReason::Timeout);
            return;
        }
        let identity = self.identity_of(req);
        // A repeat goes where its original went, never to another node; a
        // terminal's reversal goes to the node that answered its purchase.
        let mut only = mti
            .is_repeat()
            .then(|| self.made.repeats.node_of(&key, now))
            .flatten();
        if only.is_none() && mti.class() == 4 {
            only = self.original_node(req, now);
        }
        match self.dispatch(req, (key, identity), origin, only, now) {
            Ok(()) => {
                // Only once it is at the node: a repeat declined here leaves
                // the original's answer still owed by the node.
                self.made.late.forget(&key);
            }
            Err((origin, reason)) => {
                // A duplicate of a request answered before gets that answer
                // (registering it found the answer: or no node could take it).
                if let Some(origin) = self.same_as_before(req, &key, identity, origin, now) {
                    self.decline(origin, req.msg.payload(), reason);
                }
            }
        }
    }

    /// A request from a client that failed validation: counted, logged
    /// (masked, rate-limited) and handled by the front's `on_bad_message`
    /// policy. Never forwarded. Returns false when the client must be closed.
    pub(crate) fn bad_request(
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
            .links
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
                self.note_bad(client.conn, payload, BadOutcome::Dropped, now);
                true
            }
            BadMessagePolicy::Close => {
                self.counters.bad_closed.fetch_add(1, Ordering::Relaxed);
                self.note_bad(client.conn, payload, BadOutcome::Closed, now);
                false
            }
        }
    }

    /// Picks a node, registers the request, queues it. On failure the origin comes
    /// back so the caller can decline.
    fn dispatch(
        &self,
        req: &Checked<'_>,
        key: (CorrelationKey, Identity),
        origin: Origin,
        only: Option<usize>,
        now: Instant,
    ) -> Result<(), (Origin, DeclineReason)> {
        let refuse = |origin, reason| Err((origin, reason));
        let msg = &req.msg;
        let mti = msg.mti().digits();
        let texts = self.router.rule_texts(req);
        let sticky = self.router.sticky_key(req);
        // Every early return below drops `picked`, which gives the node's
        // outstanding count back; only a request that left keeps it.
        let picked = match only {
            None => self.pool.pick(&mti, |id| texts.get(id), sticky, now),
            Some(node) => {
                let picked = self
                    .pool
                    .pick_where(&mti, |id| texts.get(id), sticky, now, |n| n == node)
                    .and_then(|picked| {
                        let conn = self
                            .pool
                            .node(picked.node())
                            .and_then(|n| n.live_conn())
                            .ok_or(super::pool::PickError::NoHealthyNode)?;
                        Ok((picked, conn))
                    });
                let counter = match picked {
                    Ok(_) => &self.made.counters.repeats_same_node,
                    Err(_) => &self.made.counters.repeats_node_gone,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                picked
            }
        };
        let (picked, conn) = match picked {
            Ok(p) => p,
            Err(_) => return refuse(origin, DeclineReason::NoHealthyNode),
        };
        self.send_picked(req, key, origin, picked, conn, now)
    }

    /// Registers a request for the node picked and queues it on `conn`. On
    /// failure the origin comes back so the caller can decline.
    fn send_picked(
        &self,
        req: &Checked<'_>,
        (key, identity): (CorrelationKey, Identity),
        origin: Origin,
        picked: super::pool::Picked<'_>,
        conn: super::pool::ConnHandle,
        now: Instant,
    ) -> Result<(), (Origin, DeclineReason)> {
        let refuse = |origin, reason| Err((origin, reason));
        let msg = &req.msg;
        let mti = msg.mti().digits();
        let node = picked.node();
        let patch = match self.stamp_patch(req, node) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(service = self.name(), error = %e, "F37 stamp failed");
                return refuse(origin, DeclineReason::NoHealthyNode);
            }
        };
        let timeout = self.live().timeouts.of(&mti);
        let deadline = now + timeout.after;
        let pending = Pending {
            origin,
            request: msg.payload().clone(),
            journal_at: self.journal_at(req),
            node,
            sent_at: now,
            on_timeout: timeout.action,
            same: SameRequest {
                identity,
                waiting: None,
            },
        };
        let same = self.looked_up(req, identity, &pending.origin, now);
        // Register before sending, so a fast response always finds its entry.
        if let Err(rejected) = self
            .in_flight
            .register(key, same, pending, conn.id, deadline)
        {
            let p = match rejected.error {
                CorrelateError::Duplicate => match self.wait_for_same(&key, rejected.value) {
                    None => return Ok(()),
                    Some(p) => p,
                },
                CorrelateError::Full => {
                    return refuse(rejected.value.origin, DeclineReason::QueueFull);
                }
            };
            return refuse(p.origin, DeclineReason::Duplicate);
        }
        match conn
            .tx
            .try_send(Outbound::Message(msg.payload().clone(), patch))
        {
            Ok(()) => {
                picked.in_flight();
                Ok(())
            }
            Err(e) => {
                let reason = match e {
                    mpsc::error::TrySendError::Full(_) => DeclineReason::QueueFull,
                    mpsc::error::TrySendError::Closed(_) => DeclineReason::NodeLost,
                };
                // Take it back; if it is already gone, someone else ended it
                // (a timeout, a lost connection) and finished the pick.
                match self.in_flight.cancel(&key, now) {
                    Some(p) => refuse(p.origin, reason),
                    None => {
                        picked.in_flight();
                        Ok(())
                    }
                }
            }
        }
    }

    /// The F37 stamp of a request going to `node`. On a simplex front only
    /// node-originated requests are stamped: the peer's own requests keep their
    /// F37, which the peer matches its responses on.
    pub(crate) fn stamp_patch(&self, req: &Checked<'_>, node: usize) -> Result<Patch, StampError> {
        if !matches!(self.config.front, FrontConfig::Listen(_)) {
            return Ok(Patch::default());
        }
        self.f37_patch(req, node)
    }

    fn f37_patch(&self, req: &Checked<'_>, node: usize) -> Result<Patch, StampError> {
        let node = self.pool.node(node).ok_or(StampError::UnknownNode(node))?;
        self.router.f37_patch(req, &node.id)
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
                    .links
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
            if let Some(peer) = self.peer() {
                peer.forward_node_request(node, checked, now);
            } else {
                self.counters.unexpected.fetch_add(1, Ordering::Relaxed);
                if self
                    .links
                    .log_limit
                    .allow(LogKind::StrayResponse, LogPeer::Node(node), now)
                {
                    tracing::warn!(service = self.name(), node, mti = %msg.mti(), "node-originated request on a listen service; dropped");
                }
            }
            return;
        }
        let key = match self.router.key_of(checked) {
            Ok(k) => k,
            Err(e) => {
                self.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
                if self
                    .links
                    .log_limit
                    .allow(LogKind::BadMessage, LogPeer::Node(node), now)
                {
                    tracing::warn!(service = self.name(), node, error = %e, "response key too long; dropped");
                }
                return;
            }
        };
        // An answer to a request with duplicates is kept for them.
        let taken = self.in_flight.take_answered(&key, msg.payload(), now);
        match taken {
            Ok(p) => self.deliver(&key, p, checked, now),
            Err(miss) => {
                let counter = match miss {
                    Miss::Late => &self.counters.late_responses,
                    Miss::Unknown => &self.counters.unknown_responses,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                // The late answer to a request the switch answered for this
                // node: reversed if it approves (docs/integrity.md).
                if owed::late_answer(self, &key, msg, AnswerFrom::Node, now) {
                    return;
                }
                if self
                    .links
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

    /// The answer to an entry taken from the correlation table: to the client
    /// or peer that asked, to the node whose own request it answers, or to
    /// the store (an owed message, now acknowledged).
    pub(crate) fn deliver(
        &self,
        key: &CorrelationKey,
        p: Pending,
        checked: &Checked<'_>,
        now: Instant,
    ) {
        let response = &checked.msg;
        let Pending {
            origin,
            request,
            journal_at,
            node,
            sent_at,
            same,
            ..
        } = p;
        // What the journal's row reads the request by.
        let asked = (&request, journal_at);
        let (conn, tx) = match origin {
            Origin::Check(waiter) => {
                let _ = waiter.send(());
                return;
            }
            Origin::Owed {
                id,
                kind,
                attempt,
                expires_at,
            } => return owed::answered(self, (id, kind, attempt, expires_at), response),
            Origin::Node => {
                if let Some(peer) = self.peer() {
                    peer.answer_node(node, response);
                }
                let (link, by) = (Link::Node, AnsweredBy::Peer);
                return self.note_answer(link, by, (node, sent_at), asked, checked, now);
            }
            Origin::Client { conn, tx, slot } => {
                // The client's place is free before it can read this answer,
                // or its next request (sent on reading it) finds it taken.
                drop(slot);
                (conn, tx)
            }
            Origin::Peer => {
                self.answered(key, node, sent_at, response, now);
                let (link, by) = (Link::Peer, AnsweredBy::Node);
                self.note_answer(link, by, (node, sent_at), asked, checked, now);
                let sent = self
                    .peer()
                    .is_some_and(|peer| peer.answer(Outbound::message(response.payload().clone())));
                self.answer_same(key, same, &request, response.payload(), sent, now);
                return;
            }
        };
        self.answered(key, node, sent_at, response, now);
        let (link, by) = (Link::Client(conn), AnsweredBy::Node);
        self.note_answer(link, by, (node, sent_at), asked, checked, now);
        let patch = self.router.response_tpdu_patch(&request);
        let out = Outbound::Message(response.payload().clone(), patch);
        let delivered = tx.try_send(out).is_ok();
        // Written to a client that closed its sending side: read only if it
        // is still there (a half-close); checked for a reset shortly.
        let uncertain = delivered && tx.peer_closed();
        if !delivered {
            undelivered::undelivered(self, key, (node, &request), response, now);
        } else if uncertain {
            undelivered::delivered_uncertain(self, key, (node, &request), response, tx, now);
        }
        self.answer_same(
            key,
            same,
            &request,
            response.payload(),
            delivered && !uncertain,
            now,
        );
        if !delivered && self.undeliverable(now) {
            tracing::warn!(
                service = self.name(),
                conn,
                "client gone or not reading: response dropped"
            );
        }
    }

    /// A node answered in time: its health, the counters, and the node a
    /// repeat of this request will go to.
    fn answered(
        &self,
        key: &CorrelationKey,
        node: usize,
        sent_at: Instant,
        response: &Message<'_>,
        now: Instant,
    ) {
        let latency = now.saturating_duration_since(sent_at);
        self.pool.finished(node, true, latency, now);
        self.counters.answered.fetch_add(1, Ordering::Relaxed);
        if matches!(response.mti().class(), 1 | 2 | 4) {
            self.made.repeats.record(key, node, now);
        }
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

#[cfg(test)]
mod tests;
