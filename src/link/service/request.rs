//! A request's way out: from a front's client (or the peer, or a node's
//! own request on a link set) through admission, the integrity checks
//! (stored advices, repeats of reversed originals, duplicates), the pick of
//! a node and the correlator's entry, to the node's connection. A request
//! that cannot go is declined here; one that went ends in `answer.rs` or
//! `ending.rs`.

use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{Origin, Pending, SameRequest, Service, summary};
use crate::config::{Advices, BadMessagePolicy, FrontConfig};
use crate::journal::BadOutcome;
use crate::link::back::pool::{ConnHandle, PickError, Picked};
use crate::link::front::admission::client::ClientLink;
use crate::link::io::writer::{Outbound, Patch};
use crate::link::log_limit::{LogKind, LogPeer};
use crate::route::integrity::Identity;
use crate::route::{Checked, CorrelateError, CorrelationKey, DeclineReason, Invalid, StampError};

impl Service {
    /// A message payload from a front client. Returns false when the client
    /// must be closed (a bad request under the `close` policy).
    pub fn on_request(&self, client: &ClientLink, payload: Bytes, now: Instant) -> bool {
        let routed = self.router.with_request(payload.clone(), |checked| {
            self.route_request(client, checked, now)
        });
        match routed {
            Ok(keep) => keep,
            Err(why) => self.bad_request(client, &payload, &why, now),
        }
    }

    /// A valid request from a client: within its fair share, accepted.
    pub(super) fn route_request(
        &self,
        client: &ClientLink,
        checked: &Checked<'_>,
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
            self.decline_checked(origin, checked, DeclineReason::QueueFull);
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
    pub(super) fn accept_request(&self, req: &Checked<'_>, origin: Origin, now: Instant) {
        let key = match self.router.key_of(req) {
            Ok(k) => k,
            Err(e) => {
                // Validation found every field; only a key too long for the
                // table is left, and that request is declined, not forwarded.
                tracing::warn!(service = self.name(), error = %e, "correlation key too long: declined");
                self.decline_checked(origin, req, DeclineReason::BadMessage);
                return;
            }
        };
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        if self.links.is_draining() {
            self.decline_checked(origin, req, DeclineReason::Shutdown);
            return;
        }
        let mti = req.msg.mti();
        let origin = if self.made.integrity.advices == Advices::StoreAndForward
            && crate::route::integrity::is_advice(mti)
            && mti.class() != 8
        {
            // Back when it cannot be stored without sensitive
            // authentication data: then it is forwarded, as in forward mode.
            match self.owed().store_advice(req, origin) {
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
            self.decline_checked(origin, req, DeclineReason::Timeout);
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
                // (registering it found the answer; or no node could take it).
                if let Some(origin) = self.same_as_before(req, &key, identity, origin, now) {
                    self.decline_checked(origin, req, reason);
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
    pub(super) fn dispatch(
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
                            .ok_or(PickError::NoHealthyNode)?;
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
    pub(super) fn send_picked(
        &self,
        req: &Checked<'_>,
        (key, identity): (CorrelationKey, Identity),
        origin: Origin,
        picked: Picked<'_>,
        conn: ConnHandle,
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
            facts: self.facts_of(req),
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

    pub(super) fn f37_patch(&self, req: &Checked<'_>, node: usize) -> Result<Patch, StampError> {
        let node = self.pool.node(node).ok_or(StampError::UnknownNode(node))?;
        self.router.f37_patch(req, &node.id)
    }
}
