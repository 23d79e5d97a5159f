//! The peer side of a simplex or duplex front (UnionPay, VISA) at work: the
//! nodes' own requests go out to the peer stamped with their node ID, the
//! peer's responses come back to the node their F37 stamp names, and the
//! peer's link-level network management is answered by the switch (its key
//! exchange and cut-over go to a key node: `keys.rs`).

use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;

use super::side::PeerSide;
use super::{Checked, Origin, Service, summary};
use crate::config::{FrontConfig, StampBy};
use crate::iso8583::Message;
use crate::link::io::writer::{Outbound, Patch};
use crate::link::log_limit::{LogKind, LogPeer};
use crate::link::netmgmt::NmScope;
use crate::route::DeclineReason;

/// A service's peer side, with the service it routes for: what a simplex or
/// duplex link hands its frames to.
#[derive(Clone, Copy)]
pub struct Peer<'a> {
    svc: &'a Service,
    side: &'a PeerSide,
}

impl Service {
    /// The peer side of a simplex or duplex front; `None` on a listen front.
    pub fn peer(&self) -> Option<Peer<'_>> {
        match &self.side {
            super::FrontSide::Peer(side) => Some(Peer { svc: self, side }),
            _ => None,
        }
    }
}

impl Peer<'_> {
    /// Queues an answer for the peer on any out link that is up. Returns
    /// whether it was queued.
    pub(super) fn answer(&self, out: Outbound) -> bool {
        let now = Instant::now();
        let sent = self.side.out_links.answer(out, now).is_ok();
        if !sent && self.svc.undeliverable(now) {
            tracing::warn!(
                service = self.svc.name(),
                "no usable out link: answer to the peer dropped"
            );
        }
        sent
    }

    /// A request a node originated (e.g. an acquirer 0200 to UnionPay): stamp its
    /// F37 with the node's ID (or check the node's own stamp) and send it on an
    /// out link. With no signed-on out link it waits for one (until its
    /// deadline); only with the waiting queue full does the node get a decline.
    pub(super) fn forward_node_request(&self, node: usize, req: &Checked<'_>, now: Instant) {
        let svc = self.svc;
        let msg = &req.msg;
        if msg.mti().is_network_management() {
            // No F37 to stamp: the link's own is answered here, the
            // institution's goes out and comes back by F11 + F7 + F70.
            return match svc.netmgmt().scope(req) {
                NmScope::Link => svc.netmgmt().answer_node_link(node, req),
                NmScope::Institution => svc.netmgmt().forward_from_node(node, req, now),
            };
        }
        let stamp_by = match &svc.config.front {
            FrontConfig::Simplex(f) => f.stamp_by,
            FrontConfig::Connect(f) => f.stamp_by,
            FrontConfig::Listen(_) => return,
        };
        let patch = match stamp_by {
            StampBy::Switch => match svc.f37_patch(req, node) {
                Ok(p) => p,
                Err(e) => {
                    svc.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(service = svc.name(), node, error = %e, message = %summary(msg), "node request cannot be stamped; declined");
                    self.decline_to_node(node, msg, DeclineReason::NoHealthyNode);
                    return;
                }
            },
            StampBy::Node => {
                let stamped = self.stamped_node(req);
                if stamped != Some(node) {
                    svc.counters
                        .peer
                        .stamp_mismatches
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(service = svc.name(), node, ?stamped, message = %summary(msg), "F37 stamp does not name the sending node");
                }
                Patch::default()
            }
        };
        let tracked = self.track_node_request(node, req, now);
        let sent = self
            .side
            .out_links
            .send(Outbound::Message(msg.payload().clone(), patch), now)
            .is_ok();
        if !sent && let Some(key) = tracked {
            svc.in_flight.cancel(&key, now);
        }
        if sent {
            svc.counters
                .peer
                .node_requests
                .fetch_add(1, Ordering::Relaxed);
        } else {
            svc.counters
                .peer
                .node_requests_unsent
                .fetch_add(1, Ordering::Relaxed);
            self.decline_to_node(node, msg, DeclineReason::QueueFull);
        }
    }

    /// Remembers a node's own request until its deadline (`timeouts`, with
    /// `node_on_timeout`), so that the switch knows it timed out and can
    /// reverse a late approval from the peer. Not tied to a node connection:
    /// the answer goes back on any of the node's connections. Untracked (the
    /// F37 stamp still routes its answer) when its key cannot be kept.
    fn track_node_request(
        &self,
        node: usize,
        req: &Checked<'_>,
        now: Instant,
    ) -> Option<crate::route::CorrelationKey> {
        let svc = self.svc;
        let key = svc.router.key_of(req).ok()?;
        let timeout = svc.live().node_timeouts.of(&req.msg.mti().digits());
        let pending = super::Pending {
            origin: Origin::Node,
            request: req.msg.payload().clone(),
            facts: svc.facts_of(req),
            node,
            sent_at: now,
            on_timeout: timeout.action,
            same: Default::default(),
        };
        svc.in_flight
            .insert(key, pending, 0, now + timeout.after)
            .ok()
            .map(|()| key)
    }

    /// The peer's answer to a node's own request, to that node on any of
    /// its connections.
    pub(super) fn answer_node(&self, node: usize, response: &Message<'_>) {
        let svc = self.svc;
        let conn = svc.pool.node(node).and_then(|n| n.live_conn());
        let sent = conn.is_some_and(|c| {
            c.tx.try_send(Outbound::message(response.payload().clone()))
                .is_ok()
        });
        let counter = if sent {
            &svc.counters.peer.peer_responses
        } else {
            &svc.counters.peer.unroutable_responses
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A node's own request that timed out (or lost its node connection),
    /// declined to the node.
    pub(super) fn decline_to_node_request(
        &self,
        node: usize,
        request: &Bytes,
        reason: DeclineReason,
    ) {
        if let Ok(msg) = Message::parse(self.svc.spec(), request.clone()) {
            self.decline_to_node(node, &msg, reason);
        }
    }

    /// Answers a node's own request with a switch-made decline on one of its
    /// connections, so the node is not left waiting for its timeout.
    fn decline_to_node(&self, node: usize, msg: &Message<'_>, reason: DeclineReason) {
        let svc = self.svc;
        if !svc.may_answer(Some(msg.mti())) {
            return;
        }
        svc.counters.declined[reason as usize].fetch_add(1, Ordering::Relaxed);
        let code = svc.live().decline_code(reason);
        let conn = svc.pool.node(node).and_then(|n| n.live_conn());
        match (
            crate::link::decline::build(svc.spec(), msg.payload(), code),
            conn,
        ) {
            (Ok(resp), Some(conn)) => {
                let _ = conn.tx.try_send(Outbound::message(resp));
            }
            _ => {
                svc.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The node named by a message's F37 stamp.
    fn stamped_node(&self, checked: &Checked<'_>) -> Option<usize> {
        let f37 = checked.field(37)?;
        let (text, len) = crate::route::router::f37_text(&f37);
        self.side.stamps.as_ref()?.node_of(&text[..len])
    }

    /// A frame from an in link of a simplex front, or from a duplex link.
    pub fn on_frame(&self, payload: Bytes, now: Instant) {
        let svc = self.svc;
        let checked = match svc.check(payload.clone()) {
            Ok(c) => c,
            Err(e) => {
                svc.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
                if svc
                    .links
                    .log_limit
                    .allow(LogKind::BadMessage, LogPeer::Service, now)
                {
                    tracing::warn!(service = svc.name(), error = %e, "bad message from the peer");
                }
                // A request is answered with the format-error decline where
                // it can be read that far; anything else is dropped.
                let is_request =
                    Message::parse(svc.spec(), payload.clone()).is_ok_and(|m| m.mti().is_request());
                if is_request {
                    svc.decline(Origin::Peer, &payload, DeclineReason::BadMessage);
                }
                return;
            }
        };
        let mti = checked.msg.mti();
        if mti.is_response() {
            // A node's own first: a switch-made 0820 is matched by STAN
            // alone, and a node's STAN may equal one.
            if mti.is_network_management()
                && (svc.netmgmt().answer_to_node(&checked, now) || self.network_answer(&checked))
            {
                return;
            }
            self.on_response(&checked, now);
            return;
        }
        if mti.is_network_management() {
            // Key exchange and cut-over are the institution's: a host must
            // see them. The link's own the switch answers (unless told not
            // to: then they are balanced like any request).
            match svc.netmgmt().scope(&checked) {
                NmScope::Institution => return svc.netmgmt().to_key_node(&checked, now),
                NmScope::Link if svc.config.front.answers_network_management() => {
                    return self.answer_network_request(&checked.msg);
                }
                NmScope::Link => {}
            }
        }
        if let Err(e) = svc.router.check_routable(&checked) {
            svc.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
            if svc
                .links
                .log_limit
                .allow(LogKind::BadMessage, LogPeer::Service, now)
            {
                tracing::warn!(service = svc.name(), error = %e, "bad request from the peer: declined");
            }
            svc.decline(Origin::Peer, &payload, DeclineReason::BadMessage);
            return;
        }
        svc.accept_request(&checked, Origin::Peer, now);
    }

    /// A response from the peer: to the entry it answers in the correlation
    /// table (a node's own request this instance sent, an owed reversal);
    /// else, if it is the late answer to a node request this instance timed
    /// out, reversed when it approves; else routed by its F37 stamp, as any
    /// instance can (the request may have left through another one).
    fn on_response(&self, checked: &Checked<'_>, now: Instant) {
        let svc = self.svc;
        if let Ok(key) = svc.router.key_of(checked) {
            match svc.in_flight.take(&key, now) {
                Ok(p) => return svc.deliver(&key, p, checked, now),
                Err(_) => {
                    let from = super::owed::AnswerFrom::Peer;
                    if svc.owed().late_answer(&key, &checked.msg, from, now) {
                        return;
                    }
                    complete_owed_elsewhere(svc, &checked.msg);
                }
            }
        }
        self.route_by_stamp(checked);
    }

    /// The peer's response to a node's request: to the node its F37 stamp names,
    /// on any of that node's connections. Stateless: any switch instance
    /// connected to the node can route it.
    fn route_by_stamp(&self, checked: &Checked<'_>) {
        let svc = self.svc;
        let msg = &checked.msg;
        let conn = self
            .stamped_node(checked)
            .and_then(|node| svc.pool.node(node))
            .and_then(|n| n.live_conn());
        let sent = conn.is_some_and(|c| {
            c.tx.try_send(Outbound::message(msg.payload().clone()))
                .is_ok()
        });
        if sent {
            svc.counters
                .peer
                .peer_responses
                .fetch_add(1, Ordering::Relaxed);
        } else {
            // Policy: drop (the node times its request out itself).
            svc.counters
                .peer
                .unroutable_responses
                .fetch_add(1, Ordering::Relaxed);
            if svc
                .links
                .log_limit
                .allow(LogKind::StrayResponse, LogPeer::Service, Instant::now())
            {
                tracing::warn!(service = svc.name(), message = %summary(msg), "peer response names no live node; dropped");
            }
        }
    }

    /// The peer's link-level 0820 (sign-on, sign-off, echo): answered 0830
    /// F39 00 by the switch on an out link, header IDs swapped.
    fn answer_network_request(&self, msg: &Message<'_>) {
        let svc = self.svc;
        let spec = svc.spec();
        let resp = msg.decode().and_then(|req| {
            let mut r = spec.respond(&req, "00")?;
            // Network management answers also carry the request's security
            // control information (F53), as an 0830 does.
            if let Some(f53) = req.get(53) {
                r.set(53, f53.clone());
            }
            spec.encode(&r)
        });
        match resp {
            Ok(bytes) => {
                svc.counters
                    .peer
                    .network_answered
                    .fetch_add(1, Ordering::Relaxed);
                self.answer(Outbound::message(Bytes::from(bytes)));
            }
            Err(e) => {
                svc.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(service = svc.name(), error = %e, message = %summary(msg), "cannot answer network management");
            }
        }
    }

    /// An 0830 to a switch-made 0820 (sign-on, echo); false if it is not ours.
    fn network_answer(&self, checked: &Checked<'_>) -> bool {
        let links = &self.side.out_links;
        let text = |id| -> Vec<u8> {
            checked
                .field(id)
                .map(|f| f.logical().collect())
                .unwrap_or_default()
        };
        let stan = text(11).iter().try_fold(0u32, |n, &d| {
            d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0'))
        });
        let Some(stan) = stan else { return false };
        let net = self.svc.spec().network();
        let sign_on = net.sign_on_f70.as_deref().unwrap_or("001").as_bytes();
        let echo = net.echo_f70.as_deref().unwrap_or("301").as_bytes();
        links.nm_answered(stan, &text(70), text(39) == b"00", sign_on, echo)
    }

    /// Logs (masked) and drops a frame the peer sent on a write-only out link.
    pub fn log_unexpected_on_out_link(&self, link: usize, payload: Bytes) {
        let svc = self.svc;
        svc.counters.unexpected.fetch_add(1, Ordering::Relaxed);
        let what =
            Message::parse(svc.spec(), payload).map_or_else(|e| e.to_string(), |m| summary(&m));
        tracing::warn!(service = svc.name(), link, message = %what, "frame on a write-only out link; not routed");
    }
}

/// The peer's answer (0430) to an owed reversal this instance is not
/// waiting for: another instance sent it and the peer answered on one of
/// this instance's in links, or this instance stopped waiting. The shared
/// store knows the entry by the reversal's F11, F7 and F37 (which the
/// answer echoes): a "done" or "reconcile" answer completes it here, so its
/// sender does not repeat it (docs/ha.md, "Answers on the wrong
/// instance"). A "retry" or a refusal is left to the sender, whose own
/// attempt then times out. Off the message path: a task; the answer is
/// routed by its stamp as before.
fn complete_owed_elsewhere(svc: &Service, msg: &Message<'_>) {
    use crate::iso8583::SafAnswerClass;
    let mti = msg.mti();
    if mti.class() != 4 || mti.function() != 3 {
        return;
    }
    let Some(outbox) = svc.made.saf() else {
        return;
    };
    let f39 = msg
        .field(39)
        .ok()
        .flatten()
        .map(|f| f.show().to_string())
        .unwrap_or_default();
    let flag = match svc.made.saf_answers.class(msg) {
        SafAnswerClass::Done => None,
        SafAnswerClass::Reconcile => Some(format!("reconcile: the host answered {f39}")),
        SafAnswerClass::Retry | SafAnswerClass::Dead => return,
    };
    let Ok(d) = msg.decode() else {
        return;
    };
    let text = |id: u16| d.get(id).and_then(|v| v.as_text()).map(str::to_string);
    let (Some(f11), Some(f7), Some(f37)) = (text(11), text(7), text(37)) else {
        return;
    };
    let said = format!("{mti} F39 {f39}");
    let store = outbox.store.clone();
    let owner = outbox.owner.clone();
    let service = svc.name().to_string();
    let counters = std::sync::Arc::clone(&svc.made.counters);
    tokio::spawn(async move {
        let id = match store.saf_owed_to_peer(&service, &f11, &f7, &f37).await {
            Ok(Some(id)) => id,
            // A node's own reversal, or one already completed.
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(service, error = %e, "a reversal's answer from the peer could not be looked up in the store: its sender repeats it");
                return;
            }
        };
        let now = crate::store::saf::now_millis();
        match store
            .saf_completed(id, &owner, now, &said, flag.as_deref())
            .await
        {
            Ok(()) => {
                counters
                    .reversals_acknowledged
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(service, %id, answer = %said, "owed reversal answered on this instance: completed through the store");
            }
            Err(e) => {
                tracing::warn!(service, %id, error = %e, "owed reversal answered, but the store did not record it: its sender repeats it");
            }
        }
    });
}
