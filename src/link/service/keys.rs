//! Network management that belongs to the institution (key exchange,
//! cut-over: the spec's `[integrity] institution_f70`) on simplex and duplex
//! fronts. The peer's goes to the service's key node, never balanced, and
//! the node's answer goes back to the peer like any answer; a node's own goes
//! out to the peer, and the peer's answer comes back to that node by F11 +
//! F7 + F70 ([`node_nm_key`]), since it carries no F37 to stamp.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Checked, Origin, Pending, Service};
use crate::link::io::writer::{Outbound, Patch};
use crate::link::netmgmt::{NmScope, node_nm_key, scope};
use crate::route::{CorrelateError, DeclineReason};

/// The network management of a simplex or duplex service, as one piece:
/// what is the link's and what is the institution's, and where each goes.
pub(super) struct NetworkManagement<'s> {
    svc: &'s Service,
}

impl Service {
    pub(super) fn netmgmt(&self) -> NetworkManagement<'_> {
        NetworkManagement { svc: self }
    }
}

impl NetworkManagement<'_> {
    /// Whose a network-management message is, by the dialect's list.
    pub(super) fn scope(&self, checked: &Checked<'_>) -> NmScope {
        scope(&checked.msg, self.svc.made.link_f70.as_ref())
    }

    /// The nodes that may hold the institution's keys, in order of
    /// preference: `integrity.key_nodes`, or every node as `[service.back]`
    /// lists them. IDs are looked up per message (they are rare), so nodes
    /// added or removed at runtime count as they are.
    fn key_node_order(&self) -> Vec<usize> {
        let ids = &self.svc.made.integrity.key_nodes;
        if ids.is_empty() {
            return (0..self.svc.pool.nodes().len()).collect();
        }
        ids.iter()
            .filter_map(|id| self.svc.pool.index_of(id.as_bytes()))
            .collect()
    }

    /// The peer's key exchange or cut-over: to the first key node that is
    /// up, its answer back to the peer. With none up the switch declines it
    /// (`declines.no_healthy_node`, F39 91 by default) so the peer retries
    /// later, or stays silent under `integrity.switch_made = "silent"`: it
    /// never answers 00 for a key no host has.
    pub(super) fn to_key_node(&self, req: &Checked<'_>, now: Instant) {
        let key = match self.svc.router.key_of(req) {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(service = self.svc.name(), error = %e, "correlation key too long: declined");
                self.svc
                    .decline_checked(Origin::Peer, req, DeclineReason::BadMessage);
                return;
            }
        };
        self.svc.counters.requests.fetch_add(1, Ordering::Relaxed);
        let peer = &self.svc.counters.peer;
        let sent = if self.svc.links.is_draining() {
            Err((Origin::Peer, DeclineReason::Shutdown))
        } else {
            match self.svc.pool.pick_first(self.key_node_order(), now) {
                Ok((picked, conn)) => self.svc.send_picked(
                    req,
                    (key, Default::default()),
                    Origin::Peer,
                    picked,
                    conn,
                    now,
                ),
                Err(_) => Err((Origin::Peer, DeclineReason::NoHealthyNode)),
            }
        };
        match sent {
            Ok(()) => {
                peer.key_exchange_to_nodes.fetch_add(1, Ordering::Relaxed);
            }
            Err((origin, reason)) => {
                peer.key_exchange_unsent.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(service = self.svc.name(), ?reason, message = %super::summary(&req.msg), "institution network management reached no key node");
                self.svc.decline_checked(origin, req, reason);
            }
        }
    }

    /// A node's own link-level network management (echo test, sign-on):
    /// its link ends at the switch, which answers it (F39 00). The peer's
    /// links are the switch's business, not the node's.
    pub(super) fn answer_node_link(&self, node: usize, req: &Checked<'_>) {
        let spec = self.svc.spec();
        let resp = req.msg.decode().and_then(|d| {
            let r = spec.respond(&d, "00")?;
            spec.encode(&r)
        });
        let conn = self.svc.pool.node(node).and_then(|n| n.live_conn());
        let sent = match (resp, conn) {
            (Ok(bytes), Some(conn)) => conn
                .tx
                .try_send(Outbound::message(bytes::Bytes::from(bytes)))
                .is_ok(),
            _ => false,
        };
        if !sent {
            self.svc
                .counters
                .undeliverable
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A node's own key exchange or cut-over for the peer: sent unstamped
    /// on a signed-on out link and remembered by F11 + F7 + F70 until its
    /// deadline, so that the peer's answer comes back to this node. One the
    /// switch cannot keep track of (no F11 or F7, a STAN and time another
    /// node's request holds, a full table) is declined to the node at once.
    pub(super) fn forward_from_node(&self, node: usize, req: &Checked<'_>, now: Instant) {
        let Some(key) = node_nm_key(&req.msg) else {
            self.svc
                .counters
                .bad_messages
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(service = self.svc.name(), node, message = %super::summary(&req.msg), "node network management without F11 or F7: declined");
            return self.decline_to_node(node, req, DeclineReason::BadMessage);
        };
        let payload = req.msg.payload().clone();
        let timeout = self.svc.live().node_timeouts.of(&req.msg.mti().digits());
        let pending = Pending {
            origin: Origin::Node,
            request: payload.clone(),
            facts: self.svc.facts_of(req),
            node,
            sent_at: now,
            on_timeout: timeout.action,
            same: Default::default(),
        };
        if let Err(rejected) = self
            .svc
            .in_flight
            .insert(key, pending, 0, now + timeout.after)
        {
            let reason = match rejected.error {
                CorrelateError::Duplicate => DeclineReason::Duplicate,
                CorrelateError::Full => DeclineReason::QueueFull,
            };
            return self.decline_to_node(node, req, reason);
        }
        let Some(out_links) = self.svc.side.out_links() else {
            self.svc.in_flight.cancel(&key, now);
            return self.decline_to_node(node, req, DeclineReason::NoHealthyNode);
        };
        let peer = &self.svc.counters.peer;
        if out_links
            .send(Outbound::Message(payload, Patch::default()), now)
            .is_ok()
        {
            peer.node_key_exchange.fetch_add(1, Ordering::Relaxed);
        } else {
            self.svc.in_flight.cancel(&key, now);
            peer.node_requests_unsent.fetch_add(1, Ordering::Relaxed);
            self.decline_to_node(node, req, DeclineReason::QueueFull);
        }
    }

    fn decline_to_node(&self, node: usize, req: &Checked<'_>, reason: DeclineReason) {
        if let Some(peer) = self.svc.peer() {
            peer.decline_to_node_request(node, req.msg.payload(), reason);
        }
    }

    /// The peer's answer to a node's own network management: to that node,
    /// matched by F11 + F7 + F70. False if it answers none this instance
    /// sent.
    pub(super) fn answer_to_node(&self, checked: &Checked<'_>, now: Instant) -> bool {
        let Some(key) = node_nm_key(&checked.msg) else {
            return false;
        };
        match self.svc.in_flight.take(&key, now) {
            Ok(p) => {
                self.svc.deliver(&key, p, checked, now);
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(integrity: &str) -> Service {
        let toml = format!(
            "[[service]]\nname = \"up\"\nspec = \"cups\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
             [service.front]\nkind = \"simplex\"\nconnect = \"127.0.0.1:9\"\nlisten = \"127.0.0.1:0\"\nlinks = 2\n\
             member_id = \"03105840\"\npeer_id = \"00010000\"\n\
             [service.integrity]\n{integrity}\n\
             [[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:9\"\n\
             [[service.back.node]]\nid = \"02\"\naddress = \"127.0.0.1:9\"\n\
             [[service.back.node]]\nid = \"03\"\naddress = \"127.0.0.1:9\"\n"
        );
        let cfg = crate::config::Config::from_toml(&toml).unwrap();
        let spec = crate::iso8583::Spec::builtin("cups").unwrap();
        Service::new(cfg.services[0].clone(), spec, Instant::now()).unwrap()
    }

    #[test]
    fn key_nodes_in_their_order_or_every_node_in_the_configs() {
        assert_eq!(service("").netmgmt().key_node_order(), [0, 1, 2]);
        assert_eq!(
            service("key_nodes = [\"03\", \"01\"]")
                .netmgmt()
                .key_node_order(),
            [2, 0]
        );
    }

    #[test]
    fn an_unknown_key_node_is_refused_at_load_naming_the_key() {
        let toml = "[[service]]\nname = \"up\"\nspec = \"cups\"\nf37_stamp = { offset = 10, width = 2 }\n\
             [service.front]\nkind = \"simplex\"\nconnect = \"127.0.0.1:9\"\nlisten = \"127.0.0.1:0\"\nlinks = 2\n\
             member_id = \"03105840\"\npeer_id = \"00010000\"\n\
             [service.integrity]\nkey_nodes = [\"07\"]\n\
             [[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:9\"\n";
        let err = crate::config::Config::from_toml(toml)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("service[0].integrity.key_nodes[0]") && err.contains("`07`"),
            "{err}"
        );
    }
}
