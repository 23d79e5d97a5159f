//! The switch's side of capture: a handle per service, a tap per connection,
//! and an I/O wrapper that copies what each half of a connection actually read
//! or wrote into a bounded queue. Nothing here waits: a full queue drops the
//! event and counts it (`ServiceCounters::capture_dropped`).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::link::Service;

/// What the connection taps tell the capture writer.
#[derive(Debug)]
pub enum Event {
    /// A connection opened: `client` is the end that connected.
    Open {
        conn: u64,
        client: SocketAddr,
        server: SocketAddr,
        at: SystemTime,
    },
    /// Bytes one end sent, at `offset` in its direction of the stream (so a
    /// dropped event shows as a gap rather than shifting what follows).
    Data {
        conn: u64,
        from_client: bool,
        offset: u64,
        bytes: Bytes,
        at: SystemTime,
    },
    Close {
        conn: u64,
        at: SystemTime,
    },
}

/// A service's capture: the queue to its writer task. `Service::capture` is
/// `None` when capture is off, and then no connection gets a tap.
#[derive(Debug)]
pub struct Capture {
    tx: mpsc::Sender<Event>,
    next_conn: AtomicU64,
}

impl Capture {
    /// A handle and the receiving end for [`super::writer::run`].
    pub fn channel(queue: usize) -> (Capture, mpsc::Receiver<Event>) {
        let (tx, rx) = mpsc::channel(queue.max(1));
        (
            Capture {
                tx,
                next_conn: AtomicU64::new(1),
            },
            rx,
        )
    }
}

/// Which end opened a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opened {
    /// The peer connected to the switch (clients, simplex in links).
    ByPeer,
    /// The switch connected (node connections, out links, connect links).
    BySwitch,
}

/// One connection's tap, shared by its reading and writing halves. Dropping
/// the last clone records the close.
#[derive(Clone)]
pub struct ConnTap(Arc<TapInner>);

impl std::fmt::Debug for ConnTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnTap")
            .field("conn", &self.0.conn)
            .field("opened", &self.0.opened)
            .finish()
    }
}

struct TapInner {
    service: Arc<Service>,
    conn: u64,
    opened: Opened,
    /// The open event was dropped: the writer does not know this connection.
    lost: AtomicBool,
}

impl Service {
    /// A tap for a new connection, or `None` when this service does not capture.
    pub fn capture_tap(self: &Arc<Self>, stream: &TcpStream, opened: Opened) -> Option<ConnTap> {
        let capture = self.capture.as_ref()?;
        let (local, peer) = (stream.local_addr().ok()?, stream.peer_addr().ok()?);
        let (client, server) = match opened {
            Opened::ByPeer => (peer, local),
            Opened::BySwitch => (local, peer),
        };
        let conn = capture.next_conn.fetch_add(1, Ordering::Relaxed);
        let tap = ConnTap(Arc::new(TapInner {
            service: Arc::clone(self),
            conn,
            opened,
            lost: AtomicBool::new(false),
        }));
        let at = SystemTime::now();
        if !tap.send(Event::Open {
            conn,
            client,
            server,
            at,
        }) {
            tap.0.lost.store(true, Ordering::Relaxed);
        }
        Some(tap)
    }
}

impl ConnTap {
    fn send(&self, ev: Event) -> bool {
        let Some(capture) = self.0.service.capture.as_ref() else {
            return false;
        };
        match capture.tx.try_send(ev) {
            Ok(()) => true,
            Err(_) => {
                self.0
                    .service
                    .counters
                    .capture_dropped
                    .fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    fn record(&self, from_client: bool, offset: u64, bytes: Bytes) {
        if self.0.lost.load(Ordering::Relaxed) {
            self.0
                .service
                .counters
                .capture_dropped
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.send(Event::Data {
            conn: self.0.conn,
            from_client,
            offset,
            bytes,
            at: SystemTime::now(),
        });
    }
}

impl Drop for TapInner {
    fn drop(&mut self) {
        if self.lost.load(Ordering::Relaxed) {
            return;
        }
        let Some(capture) = self.service.capture.as_ref() else {
            return;
        };
        let ev = Event::Close {
            conn: self.conn,
            at: SystemTime::now(),
        };
        // A close must not be lost (the writer would keep the connection open
        // forever): when the queue is full, wait for room off the path.
        if let Err(mpsc::error::TrySendError::Full(ev)) = capture.tx.try_send(ev)
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let tx = capture.tx.clone();
            rt.spawn(async move {
                let _ = tx.send(ev).await;
            });
        }
    }
}

/// One half of a connection (or the whole stream) with an optional tap: with
/// `None` it only forwards to the inner reader/writer.
#[derive(Debug)]
pub struct Tapped<T> {
    inner: T,
    tap: Option<DirTap>,
}

#[derive(Debug)]
struct DirTap {
    conn: ConnTap,
    /// What this half reads (or writes) comes from the client.
    from_client: bool,
    offset: u64,
    /// Where the copies for the writer are cut from (see [`DirTap::stage`]).
    staging: BytesMut,
    /// Size of the next staging block.
    block: usize,
}

/// Staging blocks: the first of a direction, and the largest.
const STAGING_MIN: usize = 2 * 1024;
const STAGING_MAX: usize = 64 * 1024;

impl DirTap {
    /// A copy of `bytes` for the writer, cut from this direction's staging
    /// block rather than allocated on its own: a copy per read or write,
    /// allocated here and freed on the writer's thread, kept the allocator
    /// taking fresh (zeroed) pages at 10k requests/s. Once the writer has
    /// dropped every copy cut from a block, the block is reused in place; a
    /// direction whose block is still in use gets a new one twice as large
    /// (up to 64 KiB), so a busy link needs few.
    fn stage(&mut self, bytes: &[u8]) -> Bytes {
        if self.staging.capacity() < bytes.len() && !self.staging.try_reclaim(bytes.len()) {
            self.block = (self.block * 2).clamp(STAGING_MIN, STAGING_MAX);
            self.staging = BytesMut::with_capacity(self.block.max(bytes.len()));
        }
        self.staging.extend_from_slice(bytes);
        self.staging.split().freeze()
    }
}

impl<T> Tapped<T> {
    /// The reading half of a connection: what it reads comes from the peer.
    pub fn reader(inner: T, tap: &Option<ConnTap>) -> Tapped<T> {
        Tapped::new(inner, tap, |o| o == Opened::ByPeer)
    }

    /// The writing half: what it writes comes from the switch.
    pub fn writer(inner: T, tap: &Option<ConnTap>) -> Tapped<T> {
        Tapped::new(inner, tap, |o| o == Opened::BySwitch)
    }

    fn new(inner: T, tap: &Option<ConnTap>, from_client: impl Fn(Opened) -> bool) -> Tapped<T> {
        Tapped {
            inner,
            tap: tap.as_ref().map(|t| DirTap {
                from_client: from_client(t.0.opened),
                conn: t.clone(),
                offset: 0,
                staging: BytesMut::new(),
                block: 0,
            }),
        }
    }

    fn note(&mut self, bytes: &[u8]) {
        if let Some(t) = self.tap.as_mut()
            && !bytes.is_empty()
        {
            let copy = t.stage(bytes);
            t.conn.record(t.from_client, t.offset, copy);
            t.offset += bytes.len() as u64;
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tapped<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let res = Pin::new(&mut this.inner).poll_read(cx, buf);
        if this.tap.is_some() && matches!(res, Poll::Ready(Ok(()))) {
            let filled = &buf.filled()[before..];
            this.note(filled);
        }
        res
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tapped<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let res = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = res
            && this.tap.is_some()
        {
            this.note(&buf[..n.min(buf.len())]);
        }
        res
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
