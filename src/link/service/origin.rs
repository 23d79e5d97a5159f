//! Who asked: where the answer to a request goes, and what each kind of
//! asker is owed when its request ends: a client or the peer an answer on
//! its link, a node's own request the peer's answer, a health check its
//! echo, an owed message the store's record of its attempt.

use bytes::Bytes;
use tokio::sync::oneshot;

use super::Service;
use crate::journal::Link;
use crate::link::front::admission::client::InFlightSlot;
use crate::link::io::direct::LinkTx;
use crate::link::io::writer::Outbound;

/// Where the answer to a request goes.
#[derive(Debug)]
pub enum Origin {
    /// A front connection: its writer queue, its ID (for logs) and the
    /// request's place under the client's in-flight share (given back when
    /// the request leaves the correlator, however it leaves).
    Client {
        conn: u64,
        tx: LinkTx,
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

impl Origin {
    /// The link the journal names for this exchange; `None` for the
    /// switch's own messages (a health check, an owed message), which are
    /// not exchanges of a client.
    pub fn journal_link(&self) -> Option<Link> {
        match self {
            Origin::Client { conn, .. } => Some(Link::Client(*conn)),
            Origin::Peer => Some(Link::Peer),
            Origin::Node => Some(Link::Node),
            Origin::Check(_) | Origin::Owed { .. } => None,
        }
    }

    /// Whether a switch-made answer has anyone to go to: a client or the
    /// peer. A node's own request is declined through the peer side; a
    /// health check and an owed message have no one to answer.
    pub fn takes_switch_answers(&self) -> bool {
        matches!(self, Origin::Client { .. } | Origin::Peer)
    }

    /// Sends `answer` to `request`'s asker: on the client's link (its
    /// TPDU turned around as the service's policy says) or on any of the
    /// peer's links. Returns whether it was queued; the switch's own
    /// messages take no answer this way.
    pub(super) fn answer(self, svc: &Service, request: &Bytes, answer: Bytes) -> bool {
        match self {
            Origin::Client { tx, slot, .. } => {
                // The client's place is free before it can read this answer,
                // or its next request (sent on reading it) finds it taken.
                drop(slot);
                let patch = svc.router.response_tpdu_patch(request);
                tx.try_send(Outbound::Message(answer, patch)).is_ok()
            }
            Origin::Peer => svc
                .peer()
                .is_some_and(|p| p.answer(Outbound::message(answer))),
            Origin::Check(_) | Origin::Owed { .. } | Origin::Node => false,
        }
    }
}
