//! The TLS step of a link's setup, when its kind has a `tls` table: the
//! handshake, its failure counted and logged, what it negotiated shown in
//! the connection table. Without a table the TCP stream passes as it is.

use std::net::SocketAddr;

use tokio::net::TcpStream;

use super::conns::ConnEntry;
use crate::link::log_limit::LogLimit;
use crate::tls::{ClientSide, Failure, Handshakes, LinkStream, ServerSide, Side, TlsInfo};

/// Where a service's handshakes are counted and their failures logged: all
/// this step needs of the service.
#[derive(Clone, Copy)]
pub struct HandshakeBook<'a> {
    pub service: &'a str,
    pub handshakes: &'a Handshakes,
    pub log_limit: &'a LogLimit,
}

/// The server handshake of an accepted link; `None` when it failed (counted
/// and logged: the caller just closes).
pub(in crate::link) async fn accept(
    book: HandshakeBook<'_>,
    side: Option<&ServerSide>,
    tcp: TcpStream,
    peer: SocketAddr,
    entry: Option<&ConnEntry>,
) -> Option<LinkStream> {
    let Some(side) = side else {
        return Some(LinkStream::Plain(tcp));
    };
    // Boxed: the handshake's future is large, and inline it would sit in
    // every plain client's task too (an async fn is as big as its largest
    // await).
    match Box::pin(side.accept(tcp)).await {
        Ok(s) => {
            book.handshakes.succeeded(Side::Accept);
            if let Some(e) = entry {
                e.set_tls(TlsInfo::of(&s));
            }
            Some(LinkStream::Tls(Box::new(s)))
        }
        Err(why) => {
            handshake_failed(
                book.service,
                book.handshakes,
                book.log_limit,
                Side::Accept,
                peer,
                why,
            );
            None
        }
    }
}

/// The client handshake of a link the switch opened. A failure is counted
/// here; the caller logs it with its other connect failures.
pub(in crate::link) async fn connect(
    book: HandshakeBook<'_>,
    side: Option<&ClientSide>,
    tcp: TcpStream,
    addr: SocketAddr,
) -> Result<LinkStream, Failure> {
    let Some(side) = side else {
        return Ok(LinkStream::Plain(tcp));
    };
    match side.connect(tcp, addr).await {
        Ok(s) => {
            book.handshakes.succeeded(Side::Connect);
            Ok(LinkStream::Tls(Box::new(s)))
        }
        Err(why) => {
            book.handshakes.failed(Side::Connect, why);
            Err(why)
        }
    }
}

/// Shows a connected link's TLS in its connection table entry.
pub(in crate::link) fn show(stream: &LinkStream, entry: Option<&ConnEntry>) {
    if let (LinkStream::Tls(s), Some(e)) = (stream, entry) {
        e.set_tls(TlsInfo::of(s));
    }
}

/// Counts a failed handshake and logs it, rate-limited per peer IP.
pub fn handshake_failed(
    service: &str,
    handshakes: &Handshakes,
    log_limit: &LogLimit,
    side: Side,
    peer: SocketAddr,
    why: Failure,
) {
    use crate::link::log_limit::{LogKind, LogPeer};
    handshakes.failed(side, why);
    if log_limit.allow(
        LogKind::TlsHandshake,
        LogPeer::Ip(peer.ip()),
        std::time::Instant::now(),
    ) {
        tracing::warn!(
            service,
            %peer,
            side = side.as_str(),
            reason = why.as_str(),
            "TLS handshake failed"
        );
    }
}
