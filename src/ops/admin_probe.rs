//! Admission to the admin listener, so that slow clients cannot starve the
//! probes (`/healthz`, `/readyz`) a service manager or an orchestrator
//! restarts the switch on.
//!
//! Every connection is accepted at once (none waits in the kernel's
//! backlog behind slow ones) and sorted:
//!
//! - **served** in full (HTTP/1.1, keep-alive, every endpoint) while fewer
//!   than `admin.max_connections` are, and its peer address holds fewer than
//!   `admin.max_connections_per_peer` of them: one address cannot take every
//!   slot from the operator and the scraper;
//! - else into one of `admin.probe_slots` **probe slots**: only the request
//!   line is read, within `admin.probe_timeout`; a GET or HEAD of `/healthz`
//!   or `/readyz` is then served (its headers within what is left of that
//!   deadline), anything else is answered 503 with `Retry-After` at once;
//! - while every probe slot is taken, the loop waits for one (the kernel's
//!   backlog holds the connections meanwhile). A client that has sent its
//!   request line (a slow-loris trickling headers) leaves its probe slot at
//!   once with its 503; one that sends nothing leaves it after
//!   `probe_timeout`, or after [`UNDER_PRESSURE`] once connections wait.
//!
//! The descriptors the admin can hold stay bounded: `max_connections` +
//! `probe_slots` + the one being accepted.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Headers on every admin answer: kept by no cache, shown in no frame
/// (the router adds them to its answers, the gate to its 503).
pub const ALWAYS: [(&str, &str); 5] = [
    ("cache-control", "no-store"),
    ("x-frame-options", "DENY"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    (
        "content-security-policy",
        "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
];

/// The paths a probe slot serves.
pub const PROBES: [&str; 2] = ["/healthz", "/readyz"];
/// The longest request line a probe slot reads (a probe's is ~30 bytes).
const MAX_LINE: usize = 1024;

/// While connections wait for a probe slot, one held this long without a
/// request line is given up (a probe's request line comes with its
/// connection).
pub const UNDER_PRESSURE: Duration = Duration::from_millis(50);

/// A served connection's hold on the cap and on its peer's share.
pub struct ServedSlot {
    _slot: OwnedSemaphorePermit,
    _peer: PeerShare,
}

/// The admin's slots: served connections, probe slots, and what each peer
/// address holds of the served ones.
pub struct Admission {
    served: Arc<Semaphore>,
    probes: Arc<Semaphore>,
    /// 503s given [`LINGER`] to be read.
    lingering: Arc<Semaphore>,
    peers: Arc<PeerBook>,
    /// Woken while connections wait for a probe slot.
    pressure: Arc<Notify>,
}

impl Admission {
    pub fn new(max_connections: usize, per_peer: usize, probe_slots: usize) -> Admission {
        Admission {
            served: Arc::new(Semaphore::new(max_connections)),
            probes: Arc::new(Semaphore::new(probe_slots)),
            lingering: Arc::new(Semaphore::new(crate::config::AdminConfig::LINGERING)),
            peers: Arc::new(PeerBook {
                cap: per_peer,
                held: Mutex::new(HashMap::new()),
            }),
            pressure: Arc::new(Notify::new()),
        }
    }

    /// A served slot for a connection from `peer`, if one is free and the
    /// peer has its share left; never waits.
    pub fn serve(&self, peer: IpAddr) -> Option<ServedSlot> {
        let share = PeerBook::take(&self.peers, peer)?;
        let slot = Arc::clone(&self.served).try_acquire_owned().ok()?;
        Some(ServedSlot {
            _slot: slot,
            _peer: share,
        })
    }

    /// A probe slot, waiting for one if need be; while it waits, the
    /// holders that have sent nothing for [`UNDER_PRESSURE`] are told to
    /// give theirs up. `None` once the slots are closed.
    pub async fn probe_slot(&self) -> Option<ProbeSlot> {
        if let Ok(slot) = Arc::clone(&self.probes).try_acquire_owned() {
            return Some(self.probe_of(slot));
        }
        let waited = Arc::clone(&self.probes).acquire_owned();
        tokio::pin!(waited);
        loop {
            self.pressure.notify_waiters();
            tokio::select! {
                slot = &mut waited => return slot.ok().map(|s| self.probe_of(s)),
                _ = tokio::time::sleep(UNDER_PRESSURE / 2) => {}
            }
        }
    }

    fn probe_of(&self, slot: OwnedSemaphorePermit) -> ProbeSlot {
        ProbeSlot {
            _slot: slot,
            pressure: Arc::clone(&self.pressure),
            lingering: Arc::clone(&self.lingering),
        }
    }
}

/// A probe slot's hold; given back on drop.
pub struct ProbeSlot {
    _slot: OwnedSemaphorePermit,
    pressure: Arc<Notify>,
    lingering: Arc<Semaphore>,
}

impl ProbeSlot {
    /// Ends once connections wait for a probe slot and this one has been
    /// held [`UNDER_PRESSURE`] (from `since`).
    pub async fn wanted(&self, since: Instant) {
        tokio::time::sleep_until(since + UNDER_PRESSURE).await;
        self.pressure.notified().await;
    }

    /// Gives the slot back and lets the client read its 503 for at most
    /// [`LINGER`], if fewer than `AdminConfig::LINGERING` do; else closes
    /// at once.
    pub async fn release_and_linger<S: AsyncRead + Unpin>(self, stream: S) {
        let lingering = Arc::clone(&self.lingering);
        drop(self);
        if let Ok(_permit) = lingering.try_acquire_owned() {
            linger(stream).await;
        }
    }
}

/// Served connections per peer address, at most `cap` each. Holds an entry
/// only for addresses with a connection served (at most `max_connections`).
struct PeerBook {
    cap: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

impl PeerBook {
    fn take(book: &Arc<PeerBook>, peer: IpAddr) -> Option<PeerShare> {
        let mut held = book.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(peer).or_insert(0);
        if *n >= book.cap {
            return None;
        }
        *n += 1;
        Some(PeerShare {
            book: Arc::clone(book),
            peer,
        })
    }
}

/// One served connection of a peer; given back on drop.
struct PeerShare {
    book: Arc<PeerBook>,
    peer: IpAddr,
}

impl Drop for PeerShare {
    fn drop(&mut self) {
        let mut held = self.book.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.peer);
            }
        }
    }
}

/// What a probe slot read: the bytes (to be read again by the HTTP server)
/// and whether the request line asks for a probe.
pub struct RequestLine {
    pub bytes: Vec<u8>,
    pub probe: bool,
}

/// Reads up to the end of the request line (at most [`MAX_LINE`] bytes).
/// `None` if the client closed or sent too long a line; the caller bounds
/// the wait.
pub async fn read_request_line<S: AsyncRead + Unpin>(stream: &mut S) -> Option<RequestLine> {
    let mut bytes = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    loop {
        if let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            let probe = is_probe(&bytes[..end]);
            return Some(RequestLine { bytes, probe });
        }
        if bytes.len() >= MAX_LINE {
            return None;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
}

/// `GET /healthz HTTP/1.1` and the like (HEAD too, a query allowed).
fn is_probe(line: &[u8]) -> bool {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let path = target.split(|&b| b == b'?').next().unwrap_or(target);
    matches!(method, b"GET" | b"HEAD")
        && version.starts_with(b"HTTP/1.")
        && PROBES.iter().any(|p| p.as_bytes() == path)
}

/// The answer past the cap to anything but a probe.
pub fn busy_answer() -> Vec<u8> {
    let body = "{\"error\":\"the admin listener is at admin.max_connections (or this \
                address at admin.max_connections_per_peer): only /healthz and /readyz \
                are answered; retry\"}";
    let mut head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in &ALWAYS {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(body);
    head.into_bytes()
}

/// Answers 503 and shuts our end, by `deadline`. `Some(stream)` once the
/// answer is out: the caller may [`linger`] on it.
pub async fn answer_busy<S: AsyncWrite + Unpin>(mut stream: S, deadline: Instant) -> Option<S> {
    let sent = tokio::time::timeout_at(deadline, async {
        stream.write_all(&busy_answer()).await?;
        stream.shutdown().await
    })
    .await;
    matches!(sent, Ok(Ok(()))).then_some(stream)
}

/// Reads away what the client still sends until it closes, for at most
/// [`LINGER`]: closing with unread bytes would reset the connection, and
/// the reset could lose the answer before the client reads it.
pub async fn linger<S: AsyncRead + Unpin>(mut stream: S) {
    let _ = tokio::time::timeout(LINGER, async {
        let mut scratch = [0u8; 512];
        while stream.read(&mut scratch).await? > 0 {}
        Ok::<_, io::Error>(())
    })
    .await;
}

/// How long a 503 past the caps waits for its client to close.
pub const LINGER: Duration = Duration::from_millis(100);

/// A stream whose first bytes are `prefix` (what the probe slot read), then
/// the stream's own.
pub struct Prefixed<S> {
    prefix: Vec<u8>,
    at: usize,
    stream: S,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: Vec<u8>, stream: S) -> Prefixed<S> {
        Prefixed {
            prefix,
            at: 0,
            stream,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(rest) = this.prefix.get(this.at..)
            && !rest.is_empty()
        {
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_get_or_head_of_a_probe_path_is_a_probe() {
        for line in [
            &b"GET /healthz HTTP/1.1\r"[..],
            b"HEAD /readyz HTTP/1.0",
            b"GET /readyz?verbose=1 HTTP/1.1\r",
        ] {
            assert!(is_probe(line), "{}", String::from_utf8_lossy(line));
        }
        for line in [
            &b"GET /metrics HTTP/1.1\r"[..],
            b"POST /healthz HTTP/1.1\r",
            b"GET /healthzz HTTP/1.1\r",
            b"GET /healthz\r",
            b"GET  /healthz HTTP/1.1\r",
            b"GET /healthz HTTP/2.0\r",
            b"",
        ] {
            assert!(!is_probe(line), "{}", String::from_utf8_lossy(line));
        }
    }

    #[tokio::test]
    async fn a_peer_holds_at_most_its_share_and_gets_it_back() {
        let a = Admission::new(4, 2, 1);
        let (one, two) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = a.serve(one);
        let second = a.serve(one);
        assert!(first.is_some() && second.is_some());
        assert!(a.serve(one).is_none(), "past its share");
        let other = a.serve(two);
        assert!(other.is_some(), "another peer");
        drop(first);
        assert!(a.serve(one).is_some(), "given back");
        assert!(a.peers.held.lock().unwrap().len() <= 2);
    }

    #[tokio::test]
    async fn past_the_cap_no_peer_is_served_and_its_share_is_given_back() {
        let a = Admission::new(1, 1, 2);
        let _held = a.serve("10.0.0.1".parse().unwrap());
        assert!(a.serve("10.0.0.2".parse().unwrap()).is_none());
        let book = a.peers.held.lock().unwrap();
        assert!(!book.contains_key(&"10.0.0.2".parse().unwrap()));
    }

    /// With every probe slot held, the one waiting tells the holders that
    /// have sent nothing for a while to give theirs up.
    #[tokio::test(start_paused = true)]
    async fn a_wait_for_a_probe_slot_presses_idle_holders() {
        let a = Arc::new(Admission::new(1, 1, 1));
        let held = a.probe_slot().await.unwrap();
        let since = Instant::now();
        let waiting = tokio::spawn({
            let a = Arc::clone(&a);
            async move { a.probe_slot().await.is_some() }
        });
        tokio::time::timeout(UNDER_PRESSURE * 4, held.wanted(since))
            .await
            .expect("pressed within a few UNDER_PRESSURE");
        assert!(since.elapsed() >= UNDER_PRESSURE);
        drop(held);
        assert!(waiting.await.unwrap(), "the waiter gets the slot");
    }

    #[tokio::test]
    async fn a_request_line_is_read_and_replayed_whole() {
        let (mut client, mut server) = tokio::io::duplex(4096);
        client
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let line = read_request_line(&mut server).await.unwrap();
        assert!(line.probe);
        let mut replay = Prefixed::new(line.bytes, server);
        drop(client);
        let mut all = Vec::new();
        replay.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
    }

    #[tokio::test]
    async fn a_line_too_long_or_a_closed_client_is_no_request() {
        let (mut client, mut server) = tokio::io::duplex(8192);
        client.write_all(&[b'a'; MAX_LINE + 10]).await.unwrap();
        assert!(read_request_line(&mut server).await.is_none());
        let (client, mut server) = tokio::io::duplex(64);
        drop(client);
        assert!(read_request_line(&mut server).await.is_none());
    }

    #[test]
    fn the_busy_answer_is_a_503_that_closes() {
        let text = String::from_utf8(busy_answer()).unwrap();
        assert!(text.starts_with("HTTP/1.1 503 "));
        assert!(text.contains("connection: close\r\n"));
        assert!(text.contains("cache-control: no-store\r\n"));
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}\r\n", body.len())));
    }
}
