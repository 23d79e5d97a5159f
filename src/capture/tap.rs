//! The switch's side of capture: a handle per service, a tap per connection,
//! and an I/O wrapper that copies what each half of a connection actually read
//! or wrote. Nothing here waits and nothing here wakes the writer per read or
//! write: each copy is appended, with its stream offset and time, to the
//! connection's [`Staged`] batch (a short uncontended lock), and only the first
//! copy into an empty batch queues a `Ready` for the writer, which takes the
//! whole batch on its next pass (every 20 ms). A batch over its bound drops
//! the copy and counts it ([`Capture::dropped`]); the offsets
//! make the drop a gap in the capture.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::SystemTime;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// What the connection taps tell the capture writer.
#[derive(Debug)]
pub enum Event {
    /// A connection opened: `client` is the end that connected. `staged` is
    /// where its taps leave what they copy (`None`: only `Data` events).
    Open {
        conn: u64,
        client: SocketAddr,
        server: SocketAddr,
        at: SystemTime,
        staged: Option<Arc<Staged>>,
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
    /// The connection's [`Staged`] batch has copies waiting.
    Ready { conn: u64 },
    /// The connection closed: what is still staged is written first.
    Close { conn: u64, at: SystemTime },
}

/// One read or write in a [`StagedDir`]: its place in the direction's
/// stream, its size and when it happened (each becomes one packet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub offset: u64,
    pub len: u32,
    pub at: SystemTime,
}

/// The copies of one direction waiting for the writer: the segments' bytes
/// back to back.
#[derive(Debug, Default)]
pub struct StagedDir {
    pub bytes: Vec<u8>,
    pub segments: Vec<Segment>,
}

impl StagedDir {
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.segments.clear();
    }
}

/// A batch taken from a connection: `dirs[1]` from the client, `dirs[0]`
/// from the server.
#[derive(Debug, Default)]
pub struct Batch {
    pub dirs: [StagedDir; 2],
}

/// Most bytes one direction of a connection keeps for the writer (the most
/// reads/writes it keeps is the capture's `queue`): past either, copies are
/// dropped (and counted) until the writer takes the batch. At 10k requests/s
/// a busy node connection stages about 5 KB between two passes of the
/// writer, so this covers a writer held up for seconds (a stalled disk)
/// without holding unbounded memory.
pub const STAGED_MAX_BYTES: usize = 4 << 20;
/// Largest storage a direction keeps between two takes: a connection with
/// more between two passes of the writer grows it again.
const SPARE_MAX_BYTES: usize = 256 * 1024;
const SPARE_MAX_SEGMENTS: usize = 4096;

/// One connection's copies waiting for the writer, shared by the
/// connection's two halves (which append) and the writer (which takes).
#[derive(Debug)]
pub struct Staged {
    inner: Mutex<StagedInner>,
    /// Most reads/writes kept per direction.
    max_segments: usize,
}

#[derive(Debug, Default)]
struct StagedInner {
    batch: Batch,
    /// The storage the writer gave back after its last take: the next take
    /// swaps it in, so each connection fills the same two buffers in turn
    /// (storage grown on a connection's thread and freed on the writer's kept
    /// the allocator faulting in fresh pages).
    spare: Option<Batch>,
    /// A `Ready` for this connection is queued and the writer has not taken
    /// the batch yet: further copies need no other.
    ready_queued: bool,
}

/// What [`Staged::push`] did with a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Appended; the writer already knows there is something to take.
    Appended,
    /// Appended to an empty batch: the caller queues a `Ready`.
    NeedsReady,
    /// The batch is at its bound: not kept.
    Full,
}

impl Staged {
    /// An empty batch keeping at most `max_segments` reads/writes per direction.
    pub fn new(max_segments: usize) -> Staged {
        Staged {
            inner: Mutex::default(),
            max_segments: max_segments.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StagedInner> {
        // Nothing panics while holding the lock; a poisoned one holds
        // consistent data all the same.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends the copy of one read or write.
    pub fn push(&self, from_client: bool, offset: u64, bytes: &[u8], at: SystemTime) -> Pushed {
        let mut s = self.lock();
        let d = &mut s.batch.dirs[usize::from(from_client)];
        if d.bytes.len() + bytes.len() > STAGED_MAX_BYTES || d.segments.len() >= self.max_segments {
            return Pushed::Full;
        }
        d.bytes.extend_from_slice(bytes);
        d.segments.push(Segment {
            offset,
            len: bytes.len() as u32,
            at,
        });
        if s.ready_queued {
            Pushed::Appended
        } else {
            s.ready_queued = true;
            Pushed::NeedsReady
        }
    }

    /// The `Ready` could not be queued: the next copy tries again (and a
    /// close takes whatever is left).
    fn ready_lost(&self) {
        self.lock().ready_queued = false;
    }

    /// Takes what is staged; the connection goes on filling the storage
    /// given back last ([`Staged::give_back`]).
    pub fn take(&self) -> Batch {
        let mut s = self.lock();
        let fresh = s.spare.take().unwrap_or_default();
        s.ready_queued = false;
        std::mem::replace(&mut s.batch, fresh)
    }

    /// Hands a taken batch's storage back, emptied, for the next take (one
    /// grown past what a busy connection needs is let go).
    pub fn give_back(&self, mut batch: Batch) {
        for d in &mut batch.dirs {
            d.clear();
            if d.bytes.capacity() > SPARE_MAX_BYTES {
                d.bytes = Vec::new();
            }
            if d.segments.capacity() > SPARE_MAX_SEGMENTS {
                d.segments = Vec::new();
            }
        }
        self.lock().spare = Some(batch);
    }
}

/// A service's capture: the queue to its writer task, and what the taps
/// could not hand it. A service without capture has none, and then no
/// connection gets a tap. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Capture(Arc<CaptureShared>);

#[derive(Debug)]
struct CaptureShared {
    tx: mpsc::Sender<Event>,
    next_conn: AtomicU64,
    /// The queue's size, also the most reads/writes a connection's direction
    /// stages for the writer.
    queue: usize,
    /// Events dropped because the writer's queue or a batch was full (the
    /// capture then shows a gap; the message path never waits).
    dropped: AtomicU64,
}

impl Capture {
    /// A handle and the receiving end for [`super::writer::run`].
    pub fn channel(queue: usize) -> (Capture, mpsc::Receiver<Event>) {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let shared = CaptureShared {
            tx,
            next_conn: AtomicU64::new(1),
            queue: queue.max(1),
            dropped: AtomicU64::new(0),
        };
        (Capture(Arc::new(shared)), rx)
    }

    /// Capture events dropped so far.
    pub fn dropped(&self) -> u64 {
        self.0.dropped.load(Ordering::Relaxed)
    }

    /// Counts events the writer could not take (it counts its own losses here
    /// too, so that one number says what the capture is missing).
    pub fn count_dropped(&self, n: u64) {
        self.0.dropped.fetch_add(n, Ordering::Relaxed);
    }

    /// A tap for a new connection (`None` when its addresses cannot be read).
    pub fn tap(&self, stream: &TcpStream, opened: Opened) -> Option<ConnTap> {
        let (local, peer) = (stream.local_addr().ok()?, stream.peer_addr().ok()?);
        let (client, server) = match opened {
            Opened::ByPeer => (peer, local),
            Opened::BySwitch => (local, peer),
        };
        let conn = self.0.next_conn.fetch_add(1, Ordering::Relaxed);
        let staged = Arc::new(Staged::new(self.0.queue));
        let tap = ConnTap(Arc::new(TapInner {
            capture: Arc::clone(&self.0),
            conn,
            opened,
            lost: AtomicBool::new(false),
            staged: Arc::clone(&staged),
        }));
        let at = SystemTime::now();
        if !tap.send(Event::Open {
            conn,
            client,
            server,
            at,
            staged: Some(staged),
        }) {
            tap.0.lost.store(true, Ordering::Relaxed);
        }
        Some(tap)
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
    capture: Arc<CaptureShared>,
    conn: u64,
    opened: Opened,
    /// The open event was dropped: the writer does not know this connection.
    lost: AtomicBool,
    staged: Arc<Staged>,
}

impl ConnTap {
    fn send(&self, ev: Event) -> bool {
        match self.0.capture.tx.try_send(ev) {
            Ok(()) => true,
            Err(_) => {
                self.dropped();
                false
            }
        }
    }

    fn dropped(&self) {
        self.0.capture.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Stages the copy of one read or write; queues a `Ready` only for the
    /// first copy since the writer last took the batch.
    fn record(&self, from_client: bool, offset: u64, bytes: &[u8]) {
        if self.0.lost.load(Ordering::Relaxed) {
            self.dropped();
            return;
        }
        let at = SystemTime::now();
        match self.0.staged.push(from_client, offset, bytes, at) {
            Pushed::Appended => {}
            Pushed::Full => self.dropped(),
            Pushed::NeedsReady => {
                let capture = &self.0.capture;
                // A full queue loses no data here: the copy stays staged and
                // the next one (or the close) brings it to the writer.
                if capture
                    .tx
                    .try_send(Event::Ready { conn: self.0.conn })
                    .is_err()
                {
                    self.0.staged.ready_lost();
                }
            }
        }
    }
}

impl Drop for TapInner {
    fn drop(&mut self) {
        if self.lost.load(Ordering::Relaxed) {
            return;
        }
        let capture = &self.capture;
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
            }),
        }
    }

    fn note(&mut self, bytes: &[u8]) {
        if let Some(t) = self.tap.as_mut()
            && !bytes.is_empty()
        {
            t.conn.record(t.from_client, t.offset, bytes);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn a_batch_asks_for_one_ready_until_the_writer_takes_it() {
        let s = Staged::new(8);
        assert_eq!(s.push(true, 0, b"abc", at(1)), Pushed::NeedsReady);
        assert_eq!(s.push(true, 3, b"de", at(2)), Pushed::Appended);
        assert_eq!(s.push(false, 0, b"X", at(3)), Pushed::Appended);
        let b = s.take();
        let client = &b.dirs[1];
        assert_eq!(client.bytes, b"abcde", "copies back to back");
        assert_eq!(
            client.segments,
            vec![
                Segment {
                    offset: 0,
                    len: 3,
                    at: at(1)
                },
                Segment {
                    offset: 3,
                    len: 2,
                    at: at(2)
                },
            ],
            "each read keeps its offset, size and time"
        );
        assert_eq!(b.dirs[0].bytes, b"X");
        let storage = b.dirs[1].bytes.as_ptr();
        s.give_back(b);
        s.take();
        assert_eq!(
            s.push(true, 5, b"f", at(4)),
            Pushed::NeedsReady,
            "a new batch"
        );
        let b = s.take();
        assert_eq!(b.dirs[1].bytes, b"f", "the storage given back, emptied");
        assert_eq!(b.dirs[1].bytes.as_ptr(), storage, "and reused");
        assert!(b.dirs[0].is_empty());
    }

    #[test]
    fn a_full_batch_refuses_copies_until_taken() {
        let s = Staged::new(2);
        assert_eq!(s.push(true, 0, b"a", at(1)), Pushed::NeedsReady);
        assert_eq!(s.push(true, 1, b"b", at(2)), Pushed::Appended);
        assert_eq!(s.push(true, 2, b"c", at(3)), Pushed::Full);
        assert_eq!(
            s.push(false, 0, b"z", at(3)),
            Pushed::Appended,
            "per direction"
        );
        let big = vec![0u8; STAGED_MAX_BYTES];
        assert_eq!(s.push(false, 1, &big, at(4)), Pushed::Full, "bytes bound");
        let b = s.take();
        assert_eq!(b.dirs[1].segments.len(), 2);
        assert_eq!(s.push(true, 3, b"d", at(5)), Pushed::NeedsReady);
    }

    /// A service with capture on (queue of `queue`), its queue's receiving
    /// end, and a connection's tap with a client stream to drive it.
    async fn tapped_service(
        queue: usize,
    ) -> (
        Capture,
        mpsc::Receiver<Event>,
        ConnTap,
        (TcpStream, tokio::net::TcpListener),
    ) {
        let (svc, rx) = Capture::channel(queue);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let tap = svc.tap(&client, Opened::BySwitch).unwrap();
        (svc, rx, tap, (client, listener))
    }

    fn dropped(svc: &Capture) -> u64 {
        svc.dropped()
    }

    #[tokio::test]
    async fn a_full_queue_keeps_the_copy_staged_for_the_next_ready() {
        tokio::time::timeout(Duration::from_secs(10), async {
            let (svc, mut rx, tap, (stream, _listener)) = tapped_service(2).await;
            // A second connection's open fills the queue of two.
            let _other = svc.tap(&stream, Opened::ByPeer).unwrap();
            let (inner, mut peer) = tokio::io::duplex(64);
            let mut w = Tapped::writer(inner, &Some(tap.clone()));
            // The first write's `Ready` finds the queue full.
            w.write_all(b"one").await.unwrap();
            assert!(matches!(rx.try_recv(), Ok(Event::Open { .. })));
            assert!(matches!(rx.try_recv(), Ok(Event::Open { .. })));
            assert!(rx.try_recv().is_err(), "no room was left for the ready");
            w.write_all(b"two").await.unwrap();
            let Ok(Event::Ready { conn }) = rx.try_recv() else {
                panic!("the next write asks again")
            };
            assert_eq!(conn, tap.0.conn);
            let b = tap.0.staged.take();
            assert_eq!(b.dirs[1].bytes, b"onetwo", "nothing was lost");
            assert_eq!(dropped(&svc), 0);
            let mut got = [0u8; 6];
            peer.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"onetwo", "the bytes themselves went through");
        })
        .await
        .expect("test timed out");
    }

    #[tokio::test]
    async fn a_full_batch_counts_the_drop_and_leaves_a_gap() {
        tokio::time::timeout(Duration::from_secs(10), async {
            let (svc, mut rx, tap, _stream) = tapped_service(2).await;
            let (inner, _peer) = tokio::io::duplex(64);
            let mut w = Tapped::writer(inner, &Some(tap.clone()));
            for chunk in [&b"aa"[..], b"bbb", b"c", b"dddd"] {
                w.write_all(chunk).await.unwrap();
            }
            assert_eq!(dropped(&svc), 2, "two writes past a batch of two");
            let b = tap.0.staged.take();
            w.write_all(b"ee").await.unwrap();
            let after = tap.0.staged.take();
            let offsets: Vec<u64> = b.dirs[1].segments.iter().map(|s| s.offset).collect();
            assert_eq!(offsets, [0, 2]);
            assert_eq!(
                after.dirs[1].segments[0].offset, 10,
                "the dropped bytes (c, dddd) are a gap, not a shift"
            );
            assert!(matches!(rx.try_recv(), Ok(Event::Open { .. })));
            assert!(matches!(rx.try_recv(), Ok(Event::Ready { .. })));
        })
        .await
        .expect("test timed out");
    }

    #[tokio::test]
    async fn the_close_comes_after_the_staged_copies() {
        tokio::time::timeout(Duration::from_secs(10), async {
            let (_svc, mut rx, tap, _stream) = tapped_service(16).await;
            let staged = Arc::clone(&tap.0.staged);
            let (inner, _peer) = tokio::io::duplex(64);
            let mut w = Tapped::writer(inner, &Some(tap));
            w.write_all(b"last words").await.unwrap();
            drop(w);
            let kinds: Vec<&str> = std::iter::from_fn(|| rx.try_recv().ok())
                .map(|e| match e {
                    Event::Open { .. } => "open",
                    Event::Ready { .. } => "ready",
                    Event::Close { .. } => "close",
                    Event::Data { .. } => "data",
                })
                .collect();
            assert_eq!(kinds, ["open", "ready", "close"]);
            let b = staged.take();
            assert_eq!(b.dirs[1].bytes, b"last words", "still there for the close");
        })
        .await
        .expect("test timed out");
    }
}
