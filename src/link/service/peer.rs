//! The peer side of a simplex or duplex front (UnionPay, VISA): the nodes'
//! own requests go out to the peer stamped with their node ID, the peer's
//! responses come back to the node their F37 stamp names, and the peer's
//! network management is answered by the switch.

use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;

use super::{Checked, Origin, Service, summary};
use crate::config::{FrontConfig, StampBy};
use crate::iso8583::Message;
use crate::link::log_limit::{LogKind, LogPeer};
use crate::link::outlinks::NmKind;
use crate::link::writer::{Outbound, Patch};
use crate::route::DeclineReason;

impl Service {
    /// Queues an answer for the peer of a simplex front on any out link that
    /// is up. Returns whether it was queued.
    pub(super) fn to_peer(&self, out: Outbound) -> bool {
        let now = Instant::now();
        let sent = self
            .out_links
            .as_ref()
            .is_some_and(|l| l.answer(out, now).is_ok());
        if !sent && self.undeliverable(now) {
            tracing::warn!(
                service = self.name(),
                "no usable out link: answer to the peer dropped"
            );
        }
        sent
    }

    /// A request a node originated (e.g. an acquirer 0200 to UnionPay): stamp its
    /// F37 with the node's ID (or check the node's own stamp) and send it on an
    /// out link. With no signed-on out link it waits for one (until its
    /// deadline); only with the waiting queue full does the node get a decline.
    pub(super) fn forward_node_request(&self, node: usize, req: &Checked<'_>) {
        let msg = &req.msg;
        let stamp_by = match &self.config.front {
            FrontConfig::Simplex(f) => f.stamp_by,
            FrontConfig::Connect(f) => f.stamp_by,
            FrontConfig::Listen(_) => return,
        };
        let patch = match stamp_by {
            StampBy::Switch => match self.f37_patch(req, node) {
                Ok(p) => p,
                Err(e) => {
                    self.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(service = self.name(), node, error = %e, message = %summary(msg), "node request cannot be stamped; declined");
                    self.decline_to_node(node, msg, DeclineReason::NoHealthyNode);
                    return;
                }
            },
            StampBy::Node => {
                let stamped = self.stamped_node(req);
                if stamped != Some(node) {
                    self.counters
                        .stamp_mismatches
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(service = self.name(), node, ?stamped, message = %summary(msg), "F37 stamp does not name the sending node");
                }
                Patch::default()
            }
        };
        let sent = self.out_links.as_ref().is_some_and(|l| {
            l.send(
                Outbound::Message(msg.payload().clone(), patch),
                Instant::now(),
            )
            .is_ok()
        });
        if sent {
            self.counters.node_requests.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters
                .node_requests_unsent
                .fetch_add(1, Ordering::Relaxed);
            self.decline_to_node(node, msg, DeclineReason::QueueFull);
        }
    }

    /// Answers a node's own request with a switch-made decline on one of its
    /// connections, so the node is not left waiting for its timeout.
    fn decline_to_node(&self, node: usize, msg: &Message<'_>, reason: DeclineReason) {
        self.counters.declined[reason as usize].fetch_add(1, Ordering::Relaxed);
        let code = self.decline_code(reason);
        let conn = self.pool.node(node).and_then(|n| n.live_conn());
        match (
            crate::link::decline::build(&self.spec, msg.payload(), code),
            conn,
        ) {
            (Ok(resp), Some(conn)) => {
                let _ = conn.tx.try_send(Outbound::message(resp));
            }
            _ => {
                self.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The node named by a message's F37 stamp.
    fn stamped_node(&self, checked: &Checked<'_>) -> Option<usize> {
        let f37 = checked.field(37)?;
        let (text, len) = crate::route::router::f37_text(&f37);
        self.stamps.as_ref()?.node_of(&text[..len])
    }

    /// A frame from an in link of a simplex front.
    pub fn on_peer_frame(&self, payload: Bytes, now: Instant) {
        let checked = match self.check(payload.clone()) {
            Ok(c) => c,
            Err(e) => {
                self.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
                if self
                    .log_limit
                    .allow(LogKind::BadMessage, LogPeer::Service, now)
                {
                    tracing::warn!(service = self.name(), error = %e, "bad message from the peer");
                }
                // A request is answered with the format-error decline where
                // it can be read that far; anything else is dropped.
                let is_request =
                    Message::parse(&self.spec, payload.clone()).is_ok_and(|m| m.mti().is_request());
                if is_request {
                    self.decline(Origin::Peer, &payload, DeclineReason::BadMessage);
                }
                return;
            }
        };
        let mti = checked.msg.mti();
        if mti.is_response() {
            if mti.is_network_management() && self.network_answer(&checked) {
                return;
            }
            self.route_by_stamp(&checked);
            return;
        }
        if mti.is_network_management() && self.answers_network_management() {
            self.answer_network_request(&checked.msg);
            return;
        }
        if let Err(e) = self.router.check_routable(&checked) {
            self.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
            if self
                .log_limit
                .allow(LogKind::BadMessage, LogPeer::Service, now)
            {
                tracing::warn!(service = self.name(), error = %e, "bad request from the peer: declined");
            }
            self.decline(Origin::Peer, &payload, DeclineReason::BadMessage);
            return;
        }
        self.accept_request(&checked, Origin::Peer, now);
    }

    fn answers_network_management(&self) -> bool {
        self.config.front.answers_network_management()
    }

    /// The peer's response to a node's request: to the node its F37 stamp names,
    /// on any of that node's connections. Stateless: any switch instance
    /// connected to the node can route it.
    fn route_by_stamp(&self, checked: &Checked<'_>) {
        let msg = &checked.msg;
        let conn = self
            .stamped_node(checked)
            .and_then(|node| self.pool.node(node))
            .and_then(|n| n.live_conn());
        let sent = conn.is_some_and(|c| {
            c.tx.try_send(Outbound::message(msg.payload().clone()))
                .is_ok()
        });
        if sent {
            self.counters.peer_responses.fetch_add(1, Ordering::Relaxed);
        } else {
            // Policy: drop (the node times its request out itself).
            self.counters
                .unroutable_responses
                .fetch_add(1, Ordering::Relaxed);
            if self
                .log_limit
                .allow(LogKind::StrayResponse, LogPeer::Service, Instant::now())
            {
                tracing::warn!(service = self.name(), message = %summary(msg), "peer response names no live node; dropped");
            }
        }
    }

    /// The peer's 0820 (sign-on, echo, cut-over, key reset): answered 0830 F39 00
    /// by the switch on an out link, header IDs swapped.
    fn answer_network_request(&self, msg: &Message<'_>) {
        let resp = msg.decode().and_then(|req| {
            let mut r = self.spec.respond(&req, "00")?;
            // Network management answers also carry the request's security
            // control information (F53), as an 0830 does.
            if let Some(f53) = req.get(53) {
                r.set(53, f53.clone());
            }
            self.spec.encode(&r)
        });
        match resp {
            Ok(bytes) => {
                self.counters
                    .network_answered
                    .fetch_add(1, Ordering::Relaxed);
                self.to_peer(Outbound::message(Bytes::from(bytes)));
            }
            Err(e) => {
                self.counters.bad_messages.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(service = self.name(), error = %e, message = %summary(msg), "cannot answer network management");
            }
        }
    }

    /// An 0830 to a switch-made 0820 (sign-on, echo); false if it is not ours.
    fn network_answer(&self, checked: &Checked<'_>) -> bool {
        let Some(links) = &self.out_links else {
            return false;
        };
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
        let net = self.spec.network();
        let sign_on = net.sign_on_f70.as_deref().unwrap_or("001").as_bytes();
        let echo = net.echo_f70.as_deref().unwrap_or("301").as_bytes();
        links.nm_answered(stan, &text(70), text(39) == b"00", sign_on, echo)
    }

    /// A switch-made network-management request (sign-on, sign-off or echo
    /// test) from the service's template, sent now.
    pub fn network_request(
        &self,
        kind: NmKind,
        stan: u32,
    ) -> Result<Bytes, crate::iso8583::IsoError> {
        self.network
            .build(&self.spec, kind, stan, std::time::SystemTime::now())
    }

    /// Logs (masked) and drops a frame the peer sent on a write-only out link.
    pub fn log_unexpected_on_out_link(&self, link: usize, payload: Bytes) {
        self.counters.unexpected.fetch_add(1, Ordering::Relaxed);
        let what =
            Message::parse(&self.spec, payload).map_or_else(|e| e.to_string(), |m| summary(&m));
        tracing::warn!(service = self.name(), link, message = %what, "frame on a write-only out link; not routed");
    }
}
