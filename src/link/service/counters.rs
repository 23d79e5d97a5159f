//! A service's counters, readable at any time (the admin API and /metrics
//! read them; the message path only adds). The peer side of simplex and
//! duplex fronts and the OneConnect pool keep theirs apart.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::route::DeclineReason;

/// Service-wide counters.
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
    /// Client connections refused at accept, by [`Refusal`] (its index).
    pub clients_refused: [AtomicU64; Refusal::ALL.len()],
    pub keep_alives: AtomicU64,
    /// Simplex and duplex fronts: the peer side's own.
    pub peer: PeerCounters,
    /// `listen` fronts in `oneconnect` mode: the pool's own counters.
    pub oneconnect: crate::link::back::oneconnect_pool::OneConnectCounters,
}

impl ServiceCounters {
    pub fn declined(&self, reason: DeclineReason) -> u64 {
        self.declined[reason as usize].load(Ordering::Relaxed)
    }

    pub fn refused(&self, why: Refusal) -> u64 {
        self.clients_refused[why as usize].load(Ordering::Relaxed)
    }

    pub fn refused_total(&self) -> u64 {
        Refusal::ALL.iter().map(|&why| self.refused(why)).sum()
    }

    pub fn declined_total(&self) -> u64 {
        self.declined
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

/// The peer side of simplex and duplex fronts: node-originated requests,
/// the peer's responses and network management.
#[derive(Debug, Default)]
pub struct PeerCounters {
    /// Node-originated requests sent to the peer.
    pub node_requests: AtomicU64,
    /// Node-originated requests refused at once because no out link could
    /// take them and the waiting queue was full (declined to the node).
    pub node_requests_unsent: AtomicU64,
    /// Node-originated requests dropped because no out link was signed on
    /// (with room) before their deadline (`timeouts.request`).
    pub node_requests_expired: AtomicU64,
    /// Node-stamped F37 that did not name the sending node.
    pub stamp_mismatches: AtomicU64,
    /// Peer responses routed to a node by their F37 stamp.
    pub peer_responses: AtomicU64,
    /// Peer responses whose stamp names no node, or a node that is down.
    pub unroutable_responses: AtomicU64,
    /// The peer's network management answered by the switch.
    pub network_answered: AtomicU64,
    /// The peer's key exchange and cut-over sent to a key node.
    pub key_exchange_to_nodes: AtomicU64,
    /// The peer's key exchange and cut-over that reached no key node
    /// (declined, or unanswered under `switch_made = "silent"`).
    pub key_exchange_unsent: AtomicU64,
    /// Nodes' own key exchange and cut-over sent to the peer.
    pub node_key_exchange: AtomicU64,
}

/// Why a client was refused at accept: accepted, then closed at once,
/// counted by reason (`isoswitch_service_connections_refused{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its source is not in the front's `allow` list.
    NotAllowed,
    /// The front holds `max_connections` already.
    TooMany,
    /// Its source holds `max_per_source` already.
    TooManyFromSource,
    /// The switch is shutting down.
    Shutdown,
    /// The process's client descriptor budget is spent: what is left of the
    /// open-file limit belongs to node links, peer links, admin and files.
    Descriptors,
}

impl Refusal {
    pub const ALL: [Refusal; 5] = [
        Refusal::NotAllowed,
        Refusal::TooMany,
        Refusal::TooManyFromSource,
        Refusal::Shutdown,
        Refusal::Descriptors,
    ];

    /// The `reason` label of the metric and the key in the status.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NotAllowed => "not_allowed",
            Refusal::TooMany => "max_connections",
            Refusal::TooManyFromSource => "max_per_source",
            Refusal::Shutdown => "shutdown",
            Refusal::Descriptors => "descriptors",
        }
    }
}
