//! An answer's way back: a node's frame checked, its correlator entry
//! taken (exactly once), and the answer handed to whoever asked (a client,
//! the peer, a node's own request, a health check, the store for an owed
//! message); an answer that finds no entry is a late one (reversed if it
//! approves) or a stray.

use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;

use super::owed::AnswerFrom;
use super::{Origin, Pending, Service, summary, undelivered};
use crate::iso8583::Message;
use crate::journal::{AnsweredBy, Link};
use crate::link::io::writer::Outbound;
use crate::link::log_limit::{LogKind, LogPeer};
use crate::route::{Checked, CorrelationKey, Miss};

impl Service {
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
    pub(super) fn on_node_message(&self, node: usize, checked: &Checked<'_>, now: Instant) {
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
                if self.owed().late_answer(&key, msg, AnswerFrom::Node, now) {
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
            facts,
            node,
            sent_at,
            same,
            ..
        } = p;
        // What the journal's row reads the request by.
        let asked = (&request, facts.journal_at);
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
            } => {
                return self
                    .owed()
                    .answered((id, kind, attempt, expires_at), response);
            }
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
                let had = sent || self.withhold_same(key, &same);
                self.answer_same(same, (&request, facts.mti), response.payload(), had, now);
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
        let got = delivered && !uncertain;
        // An answer its sender may not have is withheld from duplicates at
        // once; one a duplicate from another connection was sent first (in
        // the moment since the take) reached the terminal all the same.
        let replayed = !got && self.withhold_same(key, &same);
        if replayed {
            tracing::info!(
                service = self.name(),
                conn,
                "answer not delivered to its sender, but a duplicate was sent it: not reversed"
            );
        } else if !delivered {
            undelivered::undelivered(self, key, (node, &request), response, now);
        } else if uncertain {
            undelivered::delivered_uncertain(self, key, (node, &request), response, tx, now);
        }
        let had = got || replayed;
        self.answer_same(same, (&request, facts.mti), response.payload(), had, now);
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
    pub(super) fn answered(
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
