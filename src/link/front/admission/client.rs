//! A client connection of a `listen` front as the service sees it: where its
//! answers go, and its fair share of the service's in-flight requests.
//!
//! One client must never be able to fill the service's correlation table
//! alone: each connection, and all connections from one source IP together,
//! may have only so many requests in flight. A request takes an
//! [`InFlightSlot`] from both counters before it is routed; the slot travels
//! with the request in the correlator and gives its place back when dropped,
//! however the request ends (answered, declined, expired, cancelled).

use std::net::SocketAddr;
use std::sync::Arc;

pub use super::share::{InFlightLimit, InFlightSlot};
pub use crate::link::io::direct::LinkTx;

/// A client connection, handed to [`Service::on_request`](super::Service::on_request)
/// with each of its requests.
#[derive(Clone, Debug)]
pub struct ClientLink {
    /// Process-unique connection ID (for logs and the connection table).
    pub conn: u64,
    /// The client's address, v4-mapped IPv6 turned into IPv4.
    pub peer: SocketAddr,
    /// Where the connection's answers go.
    pub tx: LinkTx,
    /// This connection's in-flight limit.
    pub in_flight: Arc<InFlightLimit>,
    /// The in-flight limit shared by every connection from the same source IP.
    pub source_in_flight: Arc<InFlightLimit>,
}

impl ClientLink {
    /// A place for one more request in flight, or `None` when this connection
    /// or its source is at its limit.
    pub fn take_slot(&self) -> Option<InFlightSlot> {
        InFlightSlot::take(&self.in_flight, &self.source_in_flight)
    }
}

/// The address a client is known by: an IPv4 client on a dual-stack (`[::]`)
/// listener arrives as a v4-mapped IPv6 address (`::ffff:a.b.c.d`); allow
/// lists, per-source limits and logs must see it as the IPv4 address it is.
pub fn canonical_peer(peer: SocketAddr) -> SocketAddr {
    SocketAddr::new(peer.ip().to_canonical(), peer.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(conn_max: usize, source: &Arc<InFlightLimit>) -> ClientLink {
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        ClientLink {
            conn: 1,
            peer: "127.0.0.1:1".parse().unwrap(),
            tx: tx.into(),
            in_flight: InFlightLimit::new(conn_max),
            source_in_flight: Arc::clone(source),
        }
    }

    #[test]
    fn slots_respect_both_limits_and_come_back_on_drop() {
        let source = InFlightLimit::new(3);
        let a = link(2, &source);
        let b = link(2, &source);
        let a1 = a.take_slot().unwrap();
        let _a2 = a.take_slot().unwrap();
        assert!(a.take_slot().is_none(), "connection limit");
        let _b1 = b.take_slot().unwrap();
        assert!(b.take_slot().is_none(), "source limit, though b has room");
        assert_eq!(
            b.in_flight.current(),
            1,
            "a refused take gives its place back"
        );
        drop(a1);
        assert_eq!((a.in_flight.current(), source.current()), (1, 2));
        assert!(b.take_slot().is_some());
    }

    #[test]
    fn v4_mapped_peers_are_ipv4() {
        let mapped: SocketAddr = "[::ffff:10.1.2.3]:4000".parse().unwrap();
        assert_eq!(canonical_peer(mapped), "10.1.2.3:4000".parse().unwrap());
        let v6: SocketAddr = "[2001:db8::1]:4000".parse().unwrap();
        assert_eq!(canonical_peer(v6), v6);
    }
}
