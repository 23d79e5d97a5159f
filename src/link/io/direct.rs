//! A link's sender: the task that has a frame for an idle link writes it
//! itself, and the link's writer task takes over only while frames wait.
//!
//! Today's shape was a bounded queue to a writer task per connection: every
//! request a client's task read was queued for its node link's writer, which
//! woke, yielded once and wrote; the answer went back the same way. On a link
//! with nothing queued and no write in progress that costs two task wakeups
//! per message and the time the woken writer waits for its turn. Here the
//! sender, holding the link's lock, writes the frame with a non-blocking
//! `try_write`:
//!
//! - **All of it written:** done; no task is woken.
//! - **Part of it, or nothing (the socket buffer is full):** the remainder is
//!   left in the link's `pending` bytes, the link is marked busy and its
//!   writer task woken. While busy, every sender queues, as before; the
//!   writer writes the remainder first, then the queue (coalescing bursts as
//!   [`super::writer::run_coalescing_writer`] does), and hands the link back
//!   (not busy) only when, under the lock, the queue is empty.
//!
//! - **A loaded link** (the writer's waits gain frames: ready readers queue
//!   more for it) hands every frame to the writer, which coalesces them as
//!   before: on loopback one write per frame costs more CPU than the wakeups
//!   it saves. One idle frame in [`PROBE_EVERY`] goes through the writer, to
//!   notice the load coming back; [`FUTILE_WAITS`] waits in a row that gain
//!   nothing turn the link back to direct writes.
//! - **A burst one reader read at once** ([`corked`]) leaves in one write per
//!   link at its last frame.
//!
//! So the bytes of two frames never interleave, and frames leave in the
//! order their senders took the lock. Only plain TCP links without a capture
//! tap take this path: a TLS session needs its writer's `&mut`, and a tap
//! records what its writer half writes; those links keep the queue alone.
//!
//! The queue of a direct link is a `VecDeque` under the same lock, not a
//! channel: senders take the lock anyway, and a tokio channel allocates a
//! block of 32 slots (about 3 KB of `Outbound`s) per link up front. Here an
//! idle link's queue holds no storage, which is most of a front's thousands
//! of quiet terminals.
//!
//! For the same reason a client link's writer task exists only while the
//! link is busy: the sender that hands the link over spawns it, and it ends
//! when it hands the link back (a task is half a kilobyte, most of it idle
//! on a quiet terminal). It stays while the link is coalescing (loaded), and
//! always on a *resident* link (node links: few, busy, where a spawn per
//! probe would be an allocation on the message path). The link's owner
//! keeps a [`LinkWriter`]: it learns of a failed write from it, and ends the
//! link with it ([`LinkWriter::finish`], [`LinkWriter::abort`]).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Buf, BytesMut};
use futures_util::task::AtomicWaker;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

use super::conns::ConnEntry;
use super::frames::Buffered;
use super::writer::{BATCH_BYTES, Outbound, encode_into, push, settle};
use crate::capture::{ConnTap, Tapped};
use crate::tls::LinkWrite;
use crate::wire::LengthPrefix;

/// Where a link's frames go: its writer's queue, and on a plain link the
/// socket itself when the link is idle. Cloned by everything that answers on
/// the link; the writer task ends once every clone is gone.
#[derive(Debug)]
pub struct LinkTx(Route);

#[derive(Debug)]
enum Route {
    /// A TLS or tapped link: every frame through the writer's channel.
    Queue(mpsc::Sender<Outbound>),
    /// A plain link (one of [`Direct::senders`]).
    Direct(Arc<Direct>),
}

impl From<mpsc::Sender<Outbound>> for LinkTx {
    /// A link whose frames all go through the queue.
    fn from(tx: mpsc::Sender<Outbound>) -> LinkTx {
        LinkTx(Route::Queue(tx))
    }
}

impl Clone for LinkTx {
    fn clone(&self) -> LinkTx {
        match &self.0 {
            Route::Queue(tx) => LinkTx(Route::Queue(tx.clone())),
            Route::Direct(d) => {
                // As `Arc`'s own count: a new clone comes from a live one.
                d.senders.fetch_add(1, Ordering::Relaxed);
                LinkTx(Route::Direct(Arc::clone(d)))
            }
        }
    }
}

impl Drop for LinkTx {
    fn drop(&mut self) {
        if let Route::Direct(d) = &self.0
            && d.senders.fetch_sub(1, Ordering::AcqRel) == 1
        {
            // The last one: what is left is written (by the writer, or by
            // the thread that corked it), then the owner may end the link.
            d.wake.notify_one();
            d.owner.wake();
        }
    }
}

/// What a plain link's senders and its writer task share.
#[derive(Debug)]
struct Direct {
    sock: OwnedWriteHalf,
    prefix: LengthPrefix,
    state: Mutex<DirectState>,
    /// Wakes a writer task that waits for the link (a resident or coalescing
    /// one) when a sender leaves it a remainder, queues a probe, or was the
    /// last one.
    wake: Notify,
    /// The link's owner ([`LinkWriter`]): woken when a write failed, and
    /// when the last sender is gone and all is written. Never on a frame.
    owner: AtomicWaker,
    /// Where a sender spawns the writer task (it may run off the runtime).
    runtime: tokio::runtime::Handle,
    /// The writer task stays when it hands the link back (node links);
    /// otherwise it ends unless the link is coalescing.
    resident: bool,
    conn: Option<Arc<ConnEntry>>,
    /// [`PROBE_EVERY`] (tests that fill a socket by direct writes turn
    /// probes off).
    probe_every: u32,
    /// The most frames [`DirectState::queue`] holds (the link's
    /// `write_queue`): a sender past it gets `Full`, as from a channel.
    capacity: usize,
    /// Live [`LinkTx`] clones: the owner may end the link once none is left
    /// and everything they sent is written.
    senders: AtomicUsize,
    /// The link has ended (its owner ended it, or a write failed): nothing
    /// goes out.
    ended: AtomicBool,
    /// The peer closed its sending side: what is written now may never be
    /// read (see [`LinkTx::peer_closed`]).
    peer_closed: AtomicBool,
}

#[derive(Debug)]
struct DirectState {
    /// The writer task owns the socket: senders queue.
    busy: bool,
    /// The unwritten end of a frame a sender began; written before anything
    /// queued. Empty (no storage) on an idle link.
    pending: BytesMut,
    /// A sender's write failed: the writer task ends with this error.
    failed: Option<io::ErrorKind>,
    /// The writer's last waits gained frames (the link is loaded): senders
    /// hand every frame to the writer, which coalesces what the ready
    /// readers queue into one write, as the queue-only writer does. One
    /// write per frame would cost more CPU than the wakeups it saves there.
    coalescing: bool,
    /// The writer's waits in a row that gained no frame (kept here, across
    /// writer tasks); [`FUTILE_WAITS`] of them end coalescing. A new link
    /// starts direct.
    futile: u32,
    /// Frames written directly since one last went through the writer: one
    /// in [`PROBE_EVERY`] does, so the writer notices the load coming back.
    since_probe: u32,
    /// The writer task, while there is one (see the module doc).
    writer: Option<JoinHandle<()>>,
    /// Frames for the writer, queued while it owns the link (and probes).
    /// Given back when it is handed back with more than [`IDLE_QUEUE`]
    /// slots.
    queue: VecDeque<Outbound>,
}

impl Default for DirectState {
    fn default() -> DirectState {
        DirectState {
            busy: false,
            pending: BytesMut::new(),
            failed: None,
            coalescing: false,
            futile: FUTILE_WAITS,
            since_probe: 0,
            writer: None,
            queue: VecDeque::new(),
        }
    }
}

/// A queue or batch holding more slots than this gives them back when the
/// link goes idle (as the write buffer's [`settle`] does with its bytes).
const IDLE_QUEUE: usize = 8;

/// A writer whose last this many waits in a row gained no frame hands its
/// link back to direct writes (as [`super::writer`]'s pacing stops waiting).
const FUTILE_WAITS: u32 = 8;
/// One frame in this many of an idle link's goes through the writer, whose
/// wait measures whether coalescing would gain.
const PROBE_EVERY: u32 = 16;

thread_local! {
    /// Where a sender encodes its frame before `try_write`: one per worker
    /// thread, not one per link (a front holds thousands of quiet links).
    static SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::new());
    /// This thread's reader is handling a frame with another whole frame
    /// behind it in its read buffer: what it sends waits in each link's
    /// `pending` until the last frame of the burst ([`corked`]).
    static CORKING: Cell<bool> = const { Cell::new(false) };
    /// The links this thread left corked bytes on.
    static CORKED: RefCell<Vec<Arc<Direct>>> = const { RefCell::new(Vec::new()) };
}

/// Runs a reader's handling of one frame. With `more` (another whole frame
/// is already read), what it sends on idle links is held back and leaves
/// with what the next frames send, one write per link; without, everything
/// this thread held back is written now. So a lone frame goes straight out
/// and a burst read at once costs one write per link, not one per frame.
pub fn corked<R>(more: bool, handle: impl FnOnce() -> R) -> R {
    CORKING.set(more);
    let r = handle();
    CORKING.set(false);
    if !more {
        flush_corked();
    }
    r
}

/// Writes what this thread held back (see [`corked`]). A reader calls it
/// when it stops, whatever frame it was in.
pub fn flush_corked() {
    CORKING.set(false);
    while let Some(d) = CORKED.with(|c| c.borrow_mut().pop()) {
        let mut st = d.lock();
        d.flush(&mut st);
    }
}

/// Whether a reader's buffer already holds the whole next frame (so the
/// frame it handles now is not the last of what it read).
pub fn frame_ready(frames: &impl Buffered) -> bool {
    let codec = frames.decoder();
    if codec.in_frame() {
        return false;
    }
    let (prefix, buf) = (codec.prefix(), frames.read_buffer());
    match prefix.parse_header(buf, codec.max_frame()) {
        Ok(Some(h)) => buf.len() - prefix.len() >= h.payload_len,
        _ => false,
    }
}

impl LinkTx {
    /// Sends a frame, or says why not, as `mpsc::Sender::try_send` does: a
    /// full queue while the link is busy, or a link whose writer has ended.
    pub fn try_send(&self, item: Outbound) -> Result<(), TrySendError<Outbound>> {
        match &self.0 {
            Route::Queue(tx) => tx.try_send(item),
            Route::Direct(d) => d.send(item),
        }
    }

    /// The peer closed its sending side (its reader saw the end of the
    /// stream). It may still read (a half-close), or be gone: an answer
    /// written now is checked afterwards with [`LinkTx::peer_reset`].
    pub fn mark_peer_closed(&self) {
        if let Route::Direct(d) = &self.0 {
            d.peer_closed.store(true, Ordering::Release);
        }
    }

    /// Whether the peer has closed its sending side (plain links only: a
    /// TLS or tapped link's socket is its writer's alone).
    pub fn peer_closed(&self) -> bool {
        match &self.0 {
            Route::Direct(d) => d.peer_closed.load(Ordering::Acquire),
            Route::Queue(_) => false,
        }
    }

    /// Whether the peer reset the connection: a peer that closed the
    /// socket whole answers what is written to it with a reset, one that
    /// only shut its sending side down takes it. Read from the socket's
    /// pending error; `false` when there is none (or no socket to ask).
    pub fn peer_reset(&self) -> bool {
        match &self.0 {
            Route::Direct(d) => {
                let sock: &tokio::net::TcpStream = d.sock.as_ref();
                d.lock().failed.is_some() || matches!(sock.take_error(), Ok(Some(_)))
            }
            Route::Queue(_) => false,
        }
    }

    /// Whether the link's writer has ended (no frame can go out any more).
    pub fn is_closed(&self) -> bool {
        match &self.0 {
            Route::Queue(tx) => tx.is_closed(),
            Route::Direct(d) => d.ended.load(Ordering::Acquire),
        }
    }

    /// The shared state of a direct link (tests).
    #[cfg(test)]
    fn direct(&self) -> &Direct {
        match &self.0 {
            Route::Direct(d) => d,
            Route::Queue(_) => panic!("not a direct link"),
        }
    }

    /// Whether the link's writer task owns it now (tests).
    #[cfg(test)]
    fn is_busy(&self) -> bool {
        self.direct().lock().busy
    }
}

impl Direct {
    fn lock(&self) -> MutexGuard<'_, DirectState> {
        // Nothing panics under the lock; a poisoned one holds consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the bytes held back on an idle link; what the socket does not
    /// take is left to the writer task, which then owns the link.
    fn flush(self: &Arc<Self>, st: &mut DirectState) {
        if st.busy || st.pending.is_empty() {
            return;
        }
        match self.sock.try_write(&st.pending) {
            Ok(n) if n == st.pending.len() => {
                settle(&mut st.pending, true);
                if self.senders.load(Ordering::Acquire) == 0 {
                    // The last bytes of a link whose senders are all gone.
                    self.owner.wake();
                }
            }
            Ok(n) => {
                st.pending.advance(n);
                self.hand_over(st);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.hand_over(st),
            Err(e) => {
                st.failed = Some(e.kind());
                self.hand_over(st);
            }
        }
    }

    /// Marks the link busy and has its writer task take it over: wakes the
    /// one waiting, or spawns one.
    fn hand_over(self: &Arc<Self>, st: &mut DirectState) {
        st.busy = true;
        if st.writer.is_some() {
            self.wake.notify_one();
        } else {
            let writer = run_direct_writer(Arc::clone(self));
            st.writer = Some(self.runtime.spawn(writer));
        }
    }

    /// Queues a frame for the writer, or gives it back if the queue is full.
    fn enqueue(&self, st: &mut DirectState, item: Outbound) -> Result<(), TrySendError<Outbound>> {
        if st.queue.len() >= self.capacity {
            return Err(TrySendError::Full(item));
        }
        st.queue.push_back(item);
        Ok(())
    }

    fn send(self: &Arc<Self>, item: Outbound) -> Result<(), TrySendError<Outbound>> {
        let mut st = self.lock();
        if self.ended.load(Ordering::Acquire) || st.failed.is_some() {
            // A failed link ends as its writer task does: nothing more goes
            // out, and the sender must know it.
            return Err(TrySendError::Closed(item));
        }
        if st.busy {
            // Queued under the lock, so the writer's check that the queue is
            // empty before it hands the link back cannot miss this frame.
            return self.enqueue(&mut st, item);
        }
        st.since_probe += 1;
        if st.coalescing || st.since_probe >= self.probe_every {
            // Through the writer: it writes the bytes held back (if any)
            // first, then this frame with whatever the ready readers queue.
            st.since_probe = 0;
            self.enqueue(&mut st, item)?;
            self.hand_over(&mut st);
            return Ok(());
        }
        let corking = CORKING.get();
        if corking || !st.pending.is_empty() {
            // Behind bytes held back (by this thread or another): append, and
            // write them all unless this thread is still in its burst.
            let was_empty = st.pending.is_empty();
            let start = st.pending.len();
            if let Err(e) = encode_into(self.prefix, &item, &mut st.pending) {
                tracing::warn!(error = %e, "outbound frame dropped: it does not fit the length prefix");
                return Ok(());
            }
            if let Some(conn) = &self.conn {
                conn.wrote(1, (st.pending.len() - start) as u64);
            }
            if !corking {
                self.flush(&mut st);
            } else if was_empty {
                CORKED.with(|c| c.borrow_mut().push(Arc::clone(self)));
            }
            return Ok(());
        }
        SCRATCH.with(|scratch| {
            let mut buf = scratch.borrow_mut();
            buf.clear();
            if let Err(e) = encode_into(self.prefix, &item, &mut buf) {
                // As the writer does: a frame the prefix cannot carry is dropped.
                tracing::warn!(error = %e, "outbound frame dropped: it does not fit the length prefix");
                return Ok(());
            }
            let written = match self.sock.try_write(&buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) => {
                    st.failed = Some(e.kind());
                    self.hand_over(&mut st);
                    return Err(TrySendError::Closed(item));
                }
            };
            if let Some(conn) = &self.conn {
                conn.wrote(1, buf.len() as u64);
            }
            if written < buf.len() {
                st.pending.extend_from_slice(&buf[written..]);
                self.hand_over(&mut st);
            }
            Ok(())
        })
    }
}

/// Whether a link's writer task stays when the link goes idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residence {
    /// Only while the link is busy (client links: thousands, mostly quiet).
    WhileBusy,
    /// For the link's life (node links: few and busy).
    Resident,
}

/// Sets up the writing side of a link's write half. A plain link without a
/// capture tap gets the direct path (and a writer task only as
/// `residence` says); any other keeps its queue and a writer task for its
/// life ([`super::writer::run_coalescing_writer`]).
pub fn start_writer(
    write: LinkWrite,
    tap: &Option<ConnTap>,
    prefix: LengthPrefix,
    queue: usize,
    conn: Option<Arc<ConnEntry>>,
    residence: Residence,
) -> (LinkTx, LinkWriter) {
    match (write, tap) {
        (LinkWrite::Plain(sock), None) => {
            let resident = residence == Residence::Resident;
            let (tx, d) = direct_link(sock, prefix, queue, conn, PROBE_EVERY, resident);
            (tx, LinkWriter(Owner::Direct(d)))
        }
        (write, tap) => {
            let (tx, rx) = mpsc::channel(queue.max(1));
            let write = Tapped::writer(write, tap);
            let task = tokio::spawn(super::writer::run_coalescing_writer(
                write, prefix, rx, conn,
            ));
            (tx.into(), LinkWriter(Owner::Task(task)))
        }
    }
}

fn direct_link(
    sock: OwnedWriteHalf,
    prefix: LengthPrefix,
    queue: usize,
    conn: Option<Arc<ConnEntry>>,
    probe_every: u32,
    resident: bool,
) -> (LinkTx, Arc<Direct>) {
    let direct = Arc::new(Direct {
        sock,
        prefix,
        state: Mutex::default(),
        wake: Notify::new(),
        owner: AtomicWaker::new(),
        runtime: tokio::runtime::Handle::current(),
        resident,
        conn,
        probe_every,
        capacity: queue.max(1),
        senders: AtomicUsize::new(1),
        ended: AtomicBool::new(false),
        peer_closed: AtomicBool::new(false),
    });
    (LinkTx(Route::Direct(Arc::clone(&direct))), direct)
}

/// What a link's owner (the task that reads it) keeps of its writing side:
/// awaited, it ends when the link can write no more (a write failed, or
/// the writer task ended); [`LinkWriter::finish`] and [`LinkWriter::abort`]
/// end the link.
#[derive(Debug)]
pub struct LinkWriter(Owner);

#[derive(Debug)]
enum Owner {
    /// A queue link's writer task.
    Task(JoinHandle<io::Result<()>>),
    /// A direct link, whose writer task comes and goes.
    Direct(Arc<Direct>),
}

impl Future for LinkWriter {
    type Output = io::Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            Owner::Task(task) => Pin::new(task)
                .poll(cx)
                .map(|joined| joined.unwrap_or_else(|e| Err(io::Error::other(e)))),
            Owner::Direct(d) => {
                d.owner.register(cx.waker());
                if !d.ended.load(Ordering::Acquire) {
                    return Poll::Pending;
                }
                Poll::Ready(match d.lock().failed {
                    Some(kind) => Err(kind.into()),
                    None => Ok(()),
                })
            }
        }
    }
}

impl LinkWriter {
    /// Whether the link can write no more.
    pub fn is_finished(&self) -> bool {
        match &self.0 {
            Owner::Task(task) => task.is_finished(),
            Owner::Direct(d) => d.ended.load(Ordering::Acquire),
        }
    }

    /// Lets what the link's senders sent go out: waits, at most `linger`,
    /// until every sender is gone and all of it is written (or a write
    /// failed), then ends the link.
    pub async fn finish(&mut self, linger: std::time::Duration) {
        let drained = std::future::poll_fn(|cx| match &mut self.0 {
            Owner::Task(task) => Pin::new(task).poll(cx).map(drop),
            Owner::Direct(d) => {
                d.owner.register(cx.waker());
                if d.drained() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }
        });
        let _ = tokio::time::timeout(linger, drained).await;
        self.abort();
    }

    /// Ends the link now: nothing more goes out, and a writer task still
    /// writing is stopped.
    pub fn abort(&self) {
        match &self.0 {
            Owner::Task(task) => task.abort(),
            Owner::Direct(d) => {
                d.ended.store(true, Ordering::Release);
                // Taken under the lock, aborted outside it: the task's guard
                // takes the lock when it is dropped.
                let writer = d.lock().writer.take();
                if let Some(writer) = writer {
                    writer.abort();
                }
            }
        }
    }
}

impl Direct {
    /// Every sender is gone and all they sent is written, or the link
    /// ended: its owner has nothing left to wait for.
    fn drained(&self) -> bool {
        if self.ended.load(Ordering::Acquire) {
            return true;
        }
        let st = self.lock();
        st.failed.is_some()
            || (self.senders.load(Ordering::Acquire) == 0
                && !st.busy
                && st.pending.is_empty()
                && st.queue.is_empty())
    }
}

/// The end of a writer task, however it ends: a write that failed ends the
/// link (senders get `Closed`, as from a channel), and so does a task
/// stopped before it handed the link back (aborted, or its runtime gone).
struct WriterGone {
    d: Arc<Direct>,
    /// It handed the link back (or left it idle) and cleared its handle.
    returned: bool,
}

impl WriterGone {
    /// The task handed the link back itself: nothing to end.
    fn returned(&mut self) {
        self.returned = true;
    }
}

impl Drop for WriterGone {
    fn drop(&mut self) {
        if self.returned {
            return;
        }
        self.d.ended.store(true, Ordering::Release);
        self.d.lock().writer = None;
        self.d.owner.wake();
    }
}

/// Moves what senders queued behind what the writer has not encoded yet.
fn take_queue(st: &mut DirectState, batch: &mut VecDeque<Outbound>) {
    if batch.is_empty() {
        std::mem::swap(&mut st.queue, batch);
    } else {
        batch.extend(st.queue.drain(..));
    }
}

/// Encodes frames from `batch` into `buf` up to [`BATCH_BYTES`]; the rest
/// waits for the next write. Returns how many.
fn encode_batch(prefix: LengthPrefix, batch: &mut VecDeque<Outbound>, buf: &mut BytesMut) -> u64 {
    let mut frames = 0;
    while buf.len() < BATCH_BYTES {
        let Some(item) = batch.pop_front() else { break };
        push(prefix, &item, buf);
        frames += 1;
    }
    frames
}

/// Gives back a queue's slots once it is empty and larger than an idle
/// link needs.
fn settle_queue(q: &mut VecDeque<Outbound>) {
    if q.is_empty() && q.capacity() > IDLE_QUEUE {
        *q = VecDeque::new();
    }
}

/// The writer task of a direct link, spawned by the sender that handed it
/// the link: writes the remainder and what queues behind it, and hands the
/// link back once the queue is empty. Then it ends, unless the link is
/// resident or coalescing: such a writer waits to be handed the link
/// again. A failed write ends the link.
fn run_direct_writer(d: Arc<Direct>) -> impl Future<Output = ()> {
    // Made before the task's first poll: a task aborted before it ran drops
    // its future, and with it this guard.
    let mut gone = WriterGone {
        d: Arc::clone(&d),
        returned: false,
    };
    async move {
        match write_direct(&d).await {
            // The guard ends the link as the task ends.
            Err(e) => _ = d.lock().failed.get_or_insert(e.kind()),
            Ok(()) => gone.returned(),
        }
    }
}

/// Runs a direct link's busy periods; `Ok` once it handed the link back
/// and its handle is cleared (the task then ends).
async fn write_direct(d: &Direct) -> io::Result<()> {
    let mut buf = BytesMut::new();
    // Frames taken from the queue and not yet encoded (a batch past
    // BATCH_BYTES leaves the rest for the next write).
    let mut batch = VecDeque::new();
    loop {
        loop {
            // The remainder a sender began goes before anything queued: those
            // frames were queued after it marked the link busy.
            let (counted, closing, mut futile) = {
                let mut st = d.lock();
                if let Some(kind) = st.failed {
                    return Err(kind.into());
                }
                let closing = d.senders.load(Ordering::Acquire) == 0;
                if !st.busy {
                    // A waiting writer's stale wake-up: the link is idle, its
                    // held-back bytes (if any) are its senders' to write.
                    // Unless every sender is gone: then they are this task's.
                    if closing && st.pending.is_empty() {
                        st.writer = None;
                        return Ok(());
                    }
                    if !closing {
                        break;
                    }
                    st.busy = true;
                }
                buf.extend_from_slice(&st.pending);
                settle(&mut st.pending, true);
                take_queue(&mut st, &mut batch);
                (buf.len(), closing, st.futile)
            };
            let mut frames = encode_batch(d.prefix, &mut batch, &mut buf);
            if frames > 0 && buf.len() < BATCH_BYTES && !closing {
                // A frame handed over on a loaded link, or a probe: let the
                // ready readers run first; what they queue joins this write.
                tokio::task::yield_now().await;
                take_queue(&mut d.lock(), &mut batch);
                let gained = encode_batch(d.prefix, &mut batch, &mut buf);
                futile = if gained > 0 {
                    0
                } else {
                    futile.saturating_add(1)
                };
                frames += gained;
            }
            write_all(&d.sock, &buf).await?;
            if let Some(conn) = &d.conn {
                conn.wrote(frames, (buf.len() - counted) as u64);
            }
            let mut st = d.lock();
            st.futile = futile;
            if !st.pending.is_empty()
                || st.failed.is_some()
                || !st.queue.is_empty()
                || !batch.is_empty()
            {
                // More to write: queued meanwhile, left past the batch, or
                // handed over again (the link was idle when this wake began:
                // a stale wake-up).
                drop(st);
                settle(&mut buf, false);
                continue;
            }
            st.busy = false;
            st.coalescing = futile < FUTILE_WAITS;
            settle_queue(&mut st.queue);
            let stays = !closing && (d.resident || st.coalescing);
            if !stays {
                // Handed back under the lock with the handle cleared: the
                // next hand-over spawns a new writer.
                st.writer = None;
            }
            drop(st);
            if closing || d.senders.load(Ordering::Acquire) == 0 {
                d.owner.wake();
            }
            if !stays {
                return Ok(());
            }
            settle_queue(&mut batch);
            settle(&mut buf, true);
            break;
        }
        d.wake.notified().await;
    }
}

/// Writes all of `buf`, waiting for the socket to take more when it is full.
async fn write_all(sock: &OwnedWriteHalf, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match sock.try_write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => sock.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The sizes of a direct link's parts (`front::listen`'s `per_client_sizes`).
#[cfg(test)]
pub(crate) fn sizes() -> Vec<(&'static str, usize)> {
    use std::mem::size_of;
    fn future_size<A, F: Future>(_: fn(A) -> F) -> usize {
        size_of::<F>()
    }
    let writer = future_size(run_direct_writer);
    vec![
        ("direct writer task's future", writer),
        ("  its task cell", (writer + 104).div_ceil(128) * 128),
        (
            "Direct (in an Arc: socket half, lock, queue)",
            size_of::<Direct>(),
        ),
        ("  DirectState", size_of::<DirectState>()),
        ("  Notify", size_of::<Notify>()),
        ("Outbound (a queue slot)", size_of::<Outbound>()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    /// A frame whose every byte is its number, so that the reader can tell
    /// frames apart and see any interleaving.
    fn frame(n: u8, len: usize) -> Outbound {
        Outbound::message(Bytes::from(vec![n; len]))
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    /// Reads every frame (Binary2 prefix) until the peer closes: each one's
    /// number, checking that all its bytes carry it.
    async fn read_frames(mut peer: TcpStream) -> Vec<u8> {
        let mut all = Vec::new();
        peer.read_to_end(&mut all).await.unwrap();
        let mut seen = Vec::new();
        let mut rest = &all[..];
        while !rest.is_empty() {
            let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
            let body = &rest[2..2 + len];
            assert!(body.iter().all(|b| *b == body[0]), "frames interleaved");
            seen.push(body[0]);
            rest = &rest[2 + len..];
        }
        seen
    }

    /// A direct (client) link over `sock` whose idle frames are never probes.
    fn start(sock: TcpStream, queue: usize) -> (LinkTx, LinkWriter, TcpStreamHalf) {
        start_probing(sock, queue, u32::MAX)
    }

    fn start_probing(
        sock: TcpStream,
        queue: usize,
        probe_every: u32,
    ) -> (LinkTx, LinkWriter, TcpStreamHalf) {
        let (read, write) = sock.into_split();
        let (tx, d) = direct_link(
            write,
            LengthPrefix::Binary2,
            queue,
            None,
            probe_every,
            false,
        );
        (tx, LinkWriter(Owner::Direct(d)), read)
    }

    /// Waits until everything sent is written and every sender is gone,
    /// checks no write failed, and ends the link (its socket closes once
    /// nothing holds it).
    async fn finished(mut writer: LinkWriter) {
        writer.finish(std::time::Duration::from_secs(60)).await;
        if let Owner::Direct(d) = &writer.0 {
            assert_eq!(d.lock().failed, None);
        }
    }

    /// Whether the link has a writer task now.
    fn has_writer(tx: &LinkTx) -> bool {
        tx.direct().lock().writer.is_some()
    }

    type TcpStreamHalf = tokio::net::tcp::OwnedReadHalf;

    /// Fills the socket of a link whose peer does not read: the sender
    /// writes 60,000-byte frames directly until a write is short and the
    /// writer takes the link. Returns how many frames were sent.
    fn fill(tx: &LinkTx) -> u8 {
        let mut sent = 0u8;
        while !tx.is_busy() {
            assert!(sent < 250, "the socket never filled");
            tx.try_send(frame(sent, 60_000)).unwrap();
            sent += 1;
        }
        sent
    }

    #[tokio::test]
    async fn an_idle_link_is_written_by_the_sender_with_no_wakeup() {
        let (ours, peer) = pair().await;
        let (tx, writer, _read) = start(ours, 4);
        for n in 0..3 {
            tx.try_send(frame(n, 10)).unwrap();
            assert!(!tx.is_busy(), "written at once: the writer stays idle");
            assert!(!has_writer(&tx), "and no writer task exists");
        }
        drop(tx);
        finished(writer).await;
        assert_eq!(read_frames(peer).await, [0, 1, 2]);
    }

    /// The peer does not read, so the socket fills: a frame is written in
    /// part, the rest of it and every frame after it must follow in order,
    /// including those queued while the writer is inside a blocked write.
    #[tokio::test]
    async fn a_remainder_and_frames_queued_behind_a_write_keep_their_order() {
        let (ours, peer) = pair().await;
        let (tx, writer, _read) = start(ours, 64);
        let len = 60_000;
        let mut sent = fill(&tx);
        // Busy: these queue behind the remainder.
        for _ in 0..2 {
            tx.try_send(frame(sent, len)).unwrap();
            sent += 1;
        }
        // Let the writer start its (blocked) write, then queue more behind it.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(tx.is_busy(), "the peer still does not read");
        for _ in 0..3 {
            tx.try_send(frame(sent, len)).unwrap();
            sent += 1;
        }
        drop(tx);
        let reading = tokio::spawn(read_frames(peer));
        finished(writer).await;
        let seen = reading.await.unwrap();
        assert_eq!(seen, (0..sent).collect::<Vec<u8>>());
    }

    #[tokio::test]
    async fn once_the_queue_is_drained_the_link_is_handed_back() {
        let (ours, peer) = pair().await;
        let (tx, writer, _read) = start(ours, 64);
        let mut sent = fill(&tx);
        let reading = tokio::spawn(read_frames(peer));
        // The writer drains everything and hands the link back.
        while tx.is_busy() {
            tokio::task::yield_now().await;
        }
        tx.try_send(frame(sent, 5)).unwrap();
        sent += 1;
        drop(tx);
        finished(writer).await;
        assert_eq!(reading.await.unwrap(), (0..sent).collect::<Vec<u8>>());
    }

    /// Thousands of quiet terminals each have a link: once a busy one is
    /// handed back it holds no queue slots (a channel held 32 from the start).
    #[tokio::test]
    async fn a_link_handed_back_gives_its_queue_slots_back() {
        let (ours, peer) = pair().await;
        let (tx, writer, _read) = start(ours, 64);
        assert_eq!(tx.direct().lock().queue.capacity(), 0, "a new link");
        let mut sent = fill(&tx);
        for _ in 0..40 {
            tx.try_send(frame(sent, 10)).unwrap();
            sent += 1;
        }
        assert!(tx.direct().lock().queue.capacity() >= 40);
        let reading = tokio::spawn(read_frames(peer));
        while tx.is_busy() {
            tokio::task::yield_now().await;
        }
        assert_eq!(tx.direct().lock().queue.capacity(), 0, "given back");
        drop(tx);
        finished(writer).await;
        assert_eq!(reading.await.unwrap(), (0..sent).collect::<Vec<u8>>());
    }

    /// A quiet terminal's link holds no task: the writer is spawned when the
    /// socket fills and ends once it has handed the link back. A resident
    /// (node) link's stays.
    #[tokio::test]
    async fn a_client_link_has_a_writer_task_only_while_busy() {
        for resident in [false, true] {
            let (ours, peer) = pair().await;
            let (_read, write) = ours.into_split();
            let (tx, d) = direct_link(write, LengthPrefix::Binary2, 64, None, u32::MAX, resident);
            let writer = LinkWriter(Owner::Direct(d));
            assert!(!has_writer(&tx), "a new link");
            let mut sent = fill(&tx);
            assert!(has_writer(&tx), "busy: spawned");
            let reading = tokio::spawn(read_frames(peer));
            while tx.is_busy() {
                tokio::task::yield_now().await;
            }
            assert_eq!(has_writer(&tx), resident, "handed back");
            // Busy again: a new writer (or the same one) takes it.
            let before = sent;
            sent += fill(&tx);
            assert!(sent > before);
            drop(tx);
            finished(writer).await;
            let got = reading.await.unwrap();
            assert_eq!(got.len(), usize::from(sent));
        }
    }

    /// Requests in flight hold the link's senders: its owner waits for them
    /// (a half-closed client's answers) at most its linger, then ends the
    /// link, so that an answer after it is refused (and reversed as
    /// undelivered by the service).
    #[tokio::test]
    async fn finish_ends_the_link_at_its_linger_while_a_sender_lives() {
        let (ours, peer) = pair().await;
        let (tx, mut writer, _read) = start(ours, 4);
        let in_flight = tx.clone();
        drop(tx);
        writer.finish(std::time::Duration::from_millis(50)).await;
        assert!(writer.is_finished());
        assert!(matches!(
            in_flight.try_send(frame(1, 10)),
            Err(TrySendError::Closed(_))
        ));
        drop((in_flight, writer));
        assert_eq!(read_frames(peer).await, Vec::<u8>::new());
    }

    /// ... and no longer than until the last of them is gone with all it
    /// sent written.
    #[tokio::test]
    async fn finish_returns_once_the_last_sender_is_gone_and_all_is_written() {
        let (ours, peer) = pair().await;
        let (tx, writer, _read) = start(ours, 4);
        let in_flight = tx.clone();
        drop(tx);
        let answer = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            in_flight.try_send(frame(1, 10)).unwrap();
        });
        // The linger is a minute: only the drained link ends it this soon.
        tokio::time::timeout(std::time::Duration::from_secs(10), finished(writer))
            .await
            .expect("finish returned when the last sender went");
        answer.await.unwrap();
        assert_eq!(read_frames(peer).await, [1]);
    }

    #[tokio::test]
    async fn a_busy_link_refuses_frames_past_its_queue() {
        let (ours, _peer) = pair().await;
        let (tx, _writer, _read) = start(ours, 1);
        let sent = fill(&tx);
        tx.try_send(frame(sent, 10)).unwrap();
        assert!(matches!(
            tx.try_send(frame(sent + 1, 10)),
            Err(TrySendError::Full(_))
        ));
    }

    /// A probe whose wait gains a frame turns the link to coalescing (every
    /// frame through the writer); waits that gain nothing turn it back.
    #[tokio::test]
    async fn a_probe_that_gains_turns_the_link_to_coalescing_and_back() {
        let (ours, peer) = pair().await;
        let (tx, writer, _read) = start_probing(ours, 16, 2);
        let coalescing = |tx: &LinkTx| tx.direct().lock().coalescing;
        tx.try_send(frame(0, 10)).unwrap();
        assert!(!tx.is_busy(), "written directly");
        tx.try_send(frame(1, 10)).unwrap();
        assert!(tx.is_busy(), "a probe: through the writer");
        // The writer takes the probe and waits; meanwhile another frame.
        tokio::task::yield_now().await;
        tx.try_send(frame(2, 10)).unwrap();
        while tx.is_busy() {
            tokio::task::yield_now().await;
        }
        assert!(coalescing(&tx), "the wait gained a frame");
        let mut n = 3;
        while coalescing(&tx) {
            assert!(n < 3 + 2 * FUTILE_WAITS as u8, "never turned back");
            tx.try_send(frame(n, 10)).unwrap();
            n += 1;
            while tx.is_busy() {
                tokio::task::yield_now().await;
            }
        }
        drop(tx);
        finished(writer).await;
        assert_eq!(read_frames(peer).await, (0..n).collect::<Vec<u8>>());
    }

    /// Nothing has arrived at `peer` yet.
    fn nothing_arrived(peer: &TcpStream) -> bool {
        let mut byte = [0u8; 1];
        matches!(peer.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    #[tokio::test]
    async fn a_burst_is_held_back_until_its_last_frame_and_keeps_its_order() {
        let (ours, peer) = pair().await;
        let (tx, writer, _read) = start(ours, 4);
        corked(true, || tx.try_send(frame(0, 10))).unwrap();
        corked(true, || tx.try_send(frame(1, 10))).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(nothing_arrived(&peer), "held back while the burst lasts");
        corked(false, || tx.try_send(frame(2, 10))).unwrap();
        assert!(!tx.is_busy());
        drop(tx);
        finished(writer).await;
        assert_eq!(read_frames(peer).await, [0, 1, 2]);
    }

    #[tokio::test]
    async fn a_sender_outside_the_burst_writes_the_held_back_bytes_first() {
        let (ours, peer) = pair().await;
        let (tx, writer, _read) = start(ours, 4);
        corked(true, || tx.try_send(frame(0, 10))).unwrap();
        // Another task (here on the same thread, outside any burst) sends:
        // frame 0 must not be overtaken.
        tx.try_send(frame(1, 10)).unwrap();
        flush_corked();
        tx.try_send(frame(2, 10)).unwrap();
        drop(tx);
        finished(writer).await;
        assert_eq!(read_frames(peer).await, [0, 1, 2]);
    }

    #[tokio::test]
    async fn held_back_bytes_reach_the_peer_when_every_sender_is_gone() {
        let (ours, peer) = pair().await;
        let (tx, writer, _read) = start(ours, 4);
        corked(true, || tx.try_send(frame(7, 10))).unwrap();
        drop(tx);
        // The writer may end first; the bytes are still written by the flush.
        flush_corked();
        finished(writer).await;
        assert_eq!(read_frames(peer).await, [7]);
    }

    #[tokio::test]
    async fn frame_ready_sees_a_whole_next_frame_only() {
        use crate::wire::FrameCodec;
        use futures_util::StreamExt;
        use tokio_util::codec::FramedRead;
        let codec = || FrameCodec::new(LengthPrefix::Binary2, 1000);
        // Two whole frames, then two bytes of a third.
        let bytes: &[u8] = b"\x00\x02ab\x00\x01c\x00\x05de";
        let mut frames = FramedRead::new(bytes, codec());
        frames.next().await.unwrap().unwrap();
        assert!(frame_ready(&frames), "the second frame is read already");
        frames.next().await.unwrap().unwrap();
        assert!(!frame_ready(&frames), "the third is partial");
        let mut alone = FramedRead::new(&b"\x00\x01x"[..], codec());
        alone.next().await.unwrap().unwrap();
        assert!(!frame_ready(&alone));
    }

    #[tokio::test]
    async fn a_link_whose_writer_ended_refuses_frames() {
        let (ours, _peer) = pair().await;
        let (tx, writer, _read) = start(ours, 4);
        writer.abort();
        assert!(writer.is_finished());
        assert!(matches!(
            tx.try_send(frame(0, 10)),
            Err(TrySendError::Closed(_))
        ));
    }
}
