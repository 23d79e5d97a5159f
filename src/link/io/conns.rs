//! The connection table (F5's `b conn`): every live client link, node link
//! and peer link of a service, with its addresses, age and traffic. Link tasks
//! register when a connection starts and hold a [`Registered`] guard that
//! unregisters it when the task ends, however it ends. Per-message cost: one
//! relaxed atomic add and one store.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncRead, ReadBuf};

/// A link's requests in flight, as its front counts them (a client's fair
/// share): the table shows the count without knowing the front.
pub trait InFlightCount: Send + Sync + std::fmt::Debug {
    fn current(&self) -> usize;
}

/// What a connection is to the switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConnKind {
    /// A client of a listen front (a NAC uplink, an app).
    Client,
    /// One of the K shared connections to a channel node.
    Node,
    /// A link the switch opened to the peer (simplex out link, VISA link).
    OutLink,
    /// A link the peer opened to the switch (simplex in link).
    InLink,
}

/// One live connection. Counters are atomics: its reader counts what comes
/// in; what goes out is counted by whichever task writes it (its writer task,
/// or a sender writing on an idle link, `direct.rs`).
#[derive(Debug)]
pub struct ConnEntry {
    pub id: u64,
    pub kind: ConnKind,
    /// The node ID, for node links.
    pub node: Option<String>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub opened: Instant,
    messages_in: AtomicU64,
    /// Milliseconds after `opened` of the last frame received.
    last_in_ms: AtomicU64,
    messages_out: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    /// A client's in-flight share, for the table's in-flight column.
    in_flight: OnceLock<Arc<dyn InFlightCount>>,
    /// The service's totals, which outlive the connection.
    totals: Arc<Traffic>,
    /// What TLS negotiated, on a TLS link. Boxed: inline, its three
    /// strings would sit in every plain client's entry too.
    tls: OnceLock<Box<crate::tls::TlsInfo>>,
}

/// Bytes and messages a service moved, over every connection it ever had.
#[derive(Debug, Default)]
pub struct Traffic {
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
}

impl ConnEntry {
    /// A frame arrived on this connection.
    pub fn received(&self) {
        self.messages_in.fetch_add(1, Ordering::Relaxed);
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_in_ms.store(ms, Ordering::Relaxed);
    }

    pub fn messages_in(&self) -> u64 {
        self.messages_in.load(Ordering::Relaxed)
    }

    /// The writer sent `messages` frames in `bytes` bytes.
    pub fn wrote(&self, messages: u64, bytes: u64) {
        self.messages_out.fetch_add(messages, Ordering::Relaxed);
        self.bytes_out.fetch_add(bytes, Ordering::Relaxed);
        self.totals.bytes_out.fetch_add(bytes, Ordering::Relaxed);
    }

    fn read_bytes(&self, bytes: u64) {
        self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
        self.totals.bytes_in.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn messages_out(&self) -> u64 {
        self.messages_out.load(Ordering::Relaxed)
    }

    pub fn bytes_in(&self) -> u64 {
        self.bytes_in.load(Ordering::Relaxed)
    }

    pub fn bytes_out(&self) -> u64 {
        self.bytes_out.load(Ordering::Relaxed)
    }

    /// Shows a client connection's in-flight share in the table.
    pub fn track_in_flight(&self, count: Arc<dyn InFlightCount>) {
        let _ = self.in_flight.set(count);
    }

    /// Records what the link's TLS handshake negotiated.
    pub fn set_tls(&self, info: crate::tls::TlsInfo) {
        let _ = self.tls.set(Box::new(info));
    }

    /// What TLS negotiated; `None` on a plain link.
    pub fn tls(&self) -> Option<&crate::tls::TlsInfo> {
        self.tls.get().map(|info| &**info)
    }

    /// Requests in flight from this client (`None` for other links).
    pub fn in_flight(&self) -> Option<usize> {
        self.in_flight.get().map(|l| l.current())
    }

    /// Time since the last frame received (since the connection opened if none).
    pub fn idle(&self, now: Instant) -> Duration {
        let last = self.opened + Duration::from_millis(self.last_in_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(last)
    }
}

/// The live connections of one service.
#[derive(Debug, Default)]
pub struct ConnTable {
    live: Mutex<HashMap<u64, Arc<ConnEntry>>>,
    /// Bytes in and out over every connection, past and present.
    pub traffic: Arc<Traffic>,
}

/// Keeps a connection in its table while alive; unregisters it on drop.
#[derive(Debug)]
pub struct Registered {
    table: Arc<ConnTable>,
    pub entry: Arc<ConnEntry>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.table.lock().remove(&self.entry.id);
    }
}

impl ConnTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ConnEntry>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers connection `id` until the returned guard drops.
    pub fn register(
        self: &Arc<Self>,
        id: u64,
        kind: ConnKind,
        node: Option<String>,
        peer: SocketAddr,
        local: SocketAddr,
    ) -> Registered {
        let entry = Arc::new(ConnEntry {
            id,
            kind,
            node,
            peer,
            local,
            opened: Instant::now(),
            messages_in: AtomicU64::new(0),
            last_in_ms: AtomicU64::new(0),
            messages_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            in_flight: OnceLock::new(),
            totals: Arc::clone(&self.traffic),
            tls: OnceLock::new(),
        });
        self.lock().insert(id, Arc::clone(&entry));
        Registered {
            table: Arc::clone(self),
            entry,
        }
    }

    /// The live connections, by ID.
    pub fn snapshot(&self) -> Vec<Arc<ConnEntry>> {
        let mut all: Vec<_> = self.lock().values().cloned().collect();
        all.sort_by_key(|e| e.id);
        all
    }

    pub fn count(&self, kind: ConnKind) -> usize {
        self.lock().values().filter(|e| e.kind == kind).count()
    }
}

/// A read half that counts the bytes it reads into its connection's entry.
pub struct Counted<R> {
    inner: R,
    entry: Option<Arc<ConnEntry>>,
}

impl<R> Counted<R> {
    pub fn new(inner: R, entry: Option<Arc<ConnEntry>>) -> Counted<R> {
        Counted { inner, entry }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Counted<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(entry)) = (&polled, &self.entry) {
            entry.read_bytes((buf.filled().len() - before) as u64);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_unregisters_on_drop() {
        let t = Arc::new(ConnTable::default());
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let g1 = t.register(1, ConnKind::Client, None, a, a);
        let g2 = t.register(2, ConnKind::Node, Some("01".into()), a, a);
        g1.entry.received();
        assert_eq!(t.snapshot().len(), 2);
        assert_eq!(t.snapshot()[0].messages_in(), 1);
        assert_eq!(t.count(ConnKind::Node), 1);
        drop(g1);
        assert_eq!(t.snapshot().iter().map(|e| e.id).collect::<Vec<_>>(), [2]);
        drop(g2);
        assert!(t.snapshot().is_empty());
    }
}
