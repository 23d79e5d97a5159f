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

mod owner;
mod write;
pub use owner::LinkWriter;
use owner::{Owner, WriterGone};
use write::run_direct_writer;

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
mod tests;
