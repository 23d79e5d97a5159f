//! The out links of a simplex or connect front, and the sign-on gate: which
//! link may carry what, frames parked until a link signs on, and each link's
//! counters. Pure bookkeeping shared by the link tasks (`simplex.rs`) and the
//! service's routing (`service.rs`): it knows neither.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::config::SignOn;
use crate::link::io::writer::{Outbound, WriterItem};
/// Where a link stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkState {
    Connecting = 0,
    Up = 1,
    SignedOn = 2,
    Down = 3,
}

impl LinkState {
    /// A stable name for metric labels and the status API.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Connecting => "connecting",
            LinkState::Up => "up",
            LinkState::SignedOn => "signed-on",
            LinkState::Down => "down",
        }
    }

    pub(in crate::link) fn from_u8(v: u8) -> LinkState {
        match v {
            1 => LinkState::Up,
            2 => LinkState::SignedOn,
            3 => LinkState::Down,
            _ => LinkState::Connecting,
        }
    }
}

/// Counters and state of one out link.
#[derive(Debug, Default)]
pub struct OutLinkStats {
    state: std::sync::atomic::AtomicU8,
    pub connects: AtomicU64,
    pub frames_out: AtomicU64,
    pub keepalives_out: AtomicU64,
    /// Frames the peer sent on a write-only link (logged, never routed).
    pub unexpected_in: AtomicU64,
    /// Milliseconds since the front started, at the last frame written.
    last_sent_ms: AtomicU64,
}

impl OutLinkStats {
    pub fn state(&self) -> LinkState {
        LinkState::from_u8(self.state.load(Ordering::Relaxed))
    }

    pub(in crate::link) fn set_state(&self, s: LinkState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }
}

/// In-link counters.
#[derive(Debug, Default)]
pub struct InLinkStats {
    pub accepted: AtomicU64,
    pub refused: AtomicU64,
    pub open: AtomicUsize,
    pub frames_in: AtomicU64,
    pub keepalives_in: AtomicU64,
    pub closed_silent: AtomicU64,
}

/// One out link's connection as senders see it: its writer queue, whether this
/// connection (not an earlier one) is signed on, and which connection it is.
#[derive(Default)]
pub(in crate::link) struct Slot {
    tx: Option<mpsc::Sender<LinkFrame>>,
    signed_on: bool,
    /// Bumped on every new connection, so an 0830 to a sign-on sent on an
    /// earlier connection of this link cannot sign the new one on.
    generation: u64,
}

/// What a frame waiting for a signed-on out link is, for counting it when its
/// deadline passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carry {
    /// An answer to the peer (a response, a decline, an 0830).
    Answer,
    /// A node's own request for the peer.
    Request,
}

/// A frame on its way out, on a link's writer queue or waiting for a usable
/// link: when it started on its way (its deadline runs from then, across
/// link deaths) and what it carries (`None`: this connection's own network
/// management or keep-alive, dropped with the connection).
#[derive(Debug)]
pub struct LinkFrame {
    pub(in crate::link) since: Instant,
    pub(in crate::link) carry: Option<Carry>,
    pub(in crate::link) out: Outbound,
}

impl WriterItem for LinkFrame {
    fn outbound(&self) -> &Outbound {
        &self.out
    }
}

impl LinkFrame {
    pub(in crate::link) fn own(out: Outbound) -> LinkFrame {
        LinkFrame {
            since: Instant::now(),
            carry: None,
            out,
        }
    }
}

/// What one pass over the waiting frames did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flushed {
    pub sent: u64,
    /// Answers whose deadline passed while waiting (dropped: the peer has
    /// timed its request out).
    pub answers_expired: u64,
    /// Node requests whose deadline passed while waiting (dropped: the node
    /// has timed them out).
    pub requests_expired: u64,
}

impl Flushed {
    pub(in crate::link) fn count_expired(&mut self, carry: Option<Carry>) {
        match carry {
            Some(Carry::Request) => self.requests_expired += 1,
            Some(Carry::Answer) | None => self.answers_expired += 1,
        }
    }
}

/// The out links of a simplex front: a pool any outbound frame can use.
///
/// The sign-on gate: nothing but the link's own sign-on 0820 is queued on a
/// link before the peer's 0830 to that sign-on, sent on that same connection,
/// has arrived. Frames with no signed-on link (new, moved off a dead link, or
/// behind full queues) wait in one bounded FIFO until a link signs on or
/// drains, or until their deadline passes.
pub struct OutLinks {
    slots: Vec<Mutex<Slot>>,
    pub stats: Vec<OutLinkStats>,
    pub(in crate::link) group_signed_on: AtomicBool,
    sign_on: SignOn,
    next: AtomicUsize,
    epoch: Instant,
    /// Sign-ons and echoes waiting for their 0830, by STAN: the out link that
    /// sent them and its connection (the answer arrives on an in link).
    pending_nm: Mutex<HashMap<u32, (usize, u64)>>,
    pub in_stats: InLinkStats,
    pub sign_ons_acknowledged: AtomicU64,
    pub echoes_acknowledged: AtomicU64,
    /// Frames waiting for a usable out link, oldest first.
    waiting: Mutex<VecDeque<LinkFrame>>,
    /// How long a waiting frame is worth sending (the request timeout).
    park_for: Duration,
    /// Waiting frames sent once a link could take them.
    pub parked_sent: AtomicU64,
    /// Waiting answers dropped at their deadline.
    pub parked_dropped: AtomicU64,
    /// Frames refused because the waiting queue was full.
    pub park_refused: AtomicU64,
}

/// Frames waiting for a usable out link, at most.
pub const PARK_CAPACITY: usize = 10_000;

/// No out link could take a frame, and the waiting queue is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoOutLink;

/// Where a queued frame went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    /// On this out link's writer queue.
    Link(usize),
    /// Waiting for a usable out link.
    Waiting,
}

impl OutLinks {
    pub fn new(links: usize, sign_on: SignOn, park_for: Duration, epoch: Instant) -> OutLinks {
        OutLinks {
            slots: (0..links).map(|_| Mutex::new(Slot::default())).collect(),
            stats: (0..links).map(|_| OutLinkStats::default()).collect(),
            group_signed_on: AtomicBool::new(false),
            sign_on,
            next: AtomicUsize::new(0),
            epoch,
            pending_nm: Mutex::new(HashMap::new()),
            in_stats: InLinkStats::default(),
            sign_ons_acknowledged: AtomicU64::new(0),
            echoes_acknowledged: AtomicU64::new(0),
            waiting: Mutex::new(VecDeque::new()),
            park_for,
            parked_sent: AtomicU64::new(0),
            parked_dropped: AtomicU64::new(0),
            park_refused: AtomicU64::new(0),
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub(in crate::link) fn slot(&self, link: usize) -> Option<std::sync::MutexGuard<'_, Slot>> {
        Some(
            self.slots
                .get(link)?
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// Out links up (connected), and up and allowed to carry traffic.
    pub fn up(&self) -> (usize, usize) {
        let up = (0..self.len()).filter(|&i| self.is_up(i)).count();
        let usable = (0..self.len()).filter(|&i| self.usable(i)).count();
        (up, usable)
    }

    /// Frames waiting for a usable out link now.
    pub fn waiting(&self) -> usize {
        self.lock_waiting().len()
    }

    pub(in crate::link) fn is_up(&self, link: usize) -> bool {
        self.slot(link).is_some_and(|s| s.tx.is_some())
    }

    /// Whether the connection in `slot` may carry traffic (caller holds its lock).
    pub(in crate::link) fn slot_usable(&self, slot: &Slot) -> bool {
        slot.tx.is_some()
            && match self.sign_on {
                SignOn::None => true,
                SignOn::PerLink => slot.signed_on,
                SignOn::PerGroup => self.group_signed_on.load(Ordering::Acquire),
            }
    }

    pub(in crate::link) fn signed_on(&self, link: usize) -> bool {
        self.slot(link).is_some_and(|s| match self.sign_on {
            SignOn::None => true,
            SignOn::PerLink => s.signed_on,
            SignOn::PerGroup => self.group_signed_on.load(Ordering::Acquire),
        })
    }

    pub(in crate::link) fn usable(&self, link: usize) -> bool {
        self.slot(link).is_some_and(|s| self.slot_usable(&s))
    }

    /// Queues a node's request for the peer on the next usable (up and signed
    /// on) out link, round robin; with none, it waits (see [`OutLinks::flush`]).
    pub fn send(&self, out: Outbound, now: Instant) -> Result<Queued, NoOutLink> {
        self.queue(out, Carry::Request, now)
    }

    /// Queues an answer to the peer (a response, a decline, an 0830) like a
    /// request: only a signed-on link carries it, as the peer refuses any frame
    /// on a link before that link's sign-on. With none, it waits.
    pub fn answer(&self, out: Outbound, now: Instant) -> Result<Queued, NoOutLink> {
        self.queue(out, Carry::Answer, now)
    }

    pub(in crate::link) fn queue(
        &self,
        out: Outbound,
        carry: Carry,
        now: Instant,
    ) -> Result<Queued, NoOutLink> {
        self.queue_frame(LinkFrame {
            since: now,
            carry: Some(carry),
            out,
        })
    }

    pub(in crate::link) fn queue_frame(&self, frame: LinkFrame) -> Result<Queued, NoOutLink> {
        // Frames already waiting go first.
        let frame = if self.lock_waiting().is_empty() {
            match self.send_usable(frame) {
                Ok(link) => return Ok(Queued::Link(link)),
                Err(frame) => frame,
            }
        } else {
            frame
        };
        self.wait(frame)
    }

    /// Parks a frame no usable link took, then flushes: a link may have
    /// signed on (and flushed) between the failed send and the park, and
    /// without this second look the frame would wait for the next sign-on.
    pub(in crate::link) fn wait(&self, frame: LinkFrame) -> Result<Queued, NoOutLink> {
        self.park(frame)?;
        self.flush(Instant::now(), false);
        Ok(Queued::Waiting)
    }

    pub(in crate::link) fn park(&self, frame: LinkFrame) -> Result<(), NoOutLink> {
        let mut waiting = self.lock_waiting();
        if waiting.len() >= PARK_CAPACITY {
            self.park_refused.fetch_add(1, Ordering::Relaxed);
            return Err(NoOutLink);
        }
        waiting.push_back(frame);
        Ok(())
    }

    /// Whether a frame's deadline has passed.
    pub(in crate::link) fn stale(&self, frame: &LinkFrame, now: Instant) -> bool {
        now.saturating_duration_since(frame.since) > self.park_for
    }

    pub(in crate::link) fn lock_waiting(&self) -> std::sync::MutexGuard<'_, VecDeque<LinkFrame>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends waiting frames, oldest first, while a usable link has room; what
    /// does not fit keeps waiting (never dropped for want of room). With
    /// `expire`, frames past their deadline are dropped and counted; without,
    /// a stale frame stops the pass (never sent; the sweeper drops it).
    pub fn flush(&self, now: Instant, expire: bool) -> Flushed {
        let mut done = Flushed::default();
        let mut waiting = self.lock_waiting();
        if expire {
            waiting.retain(|w| {
                let stale = self.stale(w, now);
                if stale {
                    done.count_expired(w.carry);
                }
                !stale
            });
        }
        while let Some(w) = waiting.pop_front() {
            if self.stale(&w, now) {
                waiting.push_front(w);
                break;
            }
            match self.send_usable(w) {
                Ok(_) => done.sent += 1,
                Err(w) => {
                    waiting.push_front(w);
                    break;
                }
            }
        }
        drop(waiting);
        self.parked_sent.fetch_add(done.sent, Ordering::Relaxed);
        self.parked_dropped
            .fetch_add(done.answers_expired, Ordering::Relaxed);
        done
    }

    /// Queues `out` on the next usable link with room; the check and the queueing
    /// happen under the link's lock, so a link that dies and reconnects in
    /// between cannot receive it unsigned.
    pub(in crate::link) fn send_usable(&self, mut out: LinkFrame) -> Result<usize, LinkFrame> {
        let n = self.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            let link = (start + i) % n;
            let Some(slot) = self.slot(link) else {
                continue;
            };
            if !self.slot_usable(&slot) {
                continue;
            }
            let Some(tx) = &slot.tx else { continue };
            match tx.try_send(out) {
                Ok(()) => {
                    drop(slot);
                    self.sent_on(link);
                    return Ok(link);
                }
                Err(mpsc::error::TrySendError::Full(o) | mpsc::error::TrySendError::Closed(o)) => {
                    out = o;
                }
            }
        }
        Err(out)
    }

    /// Queues a frame on one given link, signed on or not: only the link's own
    /// sign-on goes this way. Returns the connection's generation.
    pub(in crate::link) fn send_on(&self, link: usize, out: Outbound) -> Option<u64> {
        self.queue_on(link, out, false)
    }

    /// Queues a frame on one given link only if it is signed on (echoes,
    /// keep-alives, sign-off). Returns the connection's generation.
    pub(in crate::link) fn send_signed_on(&self, link: usize, out: Outbound) -> Option<u64> {
        self.queue_on(link, out, true)
    }

    /// Both of the above: the sign-on test and the send under one look at the
    /// slot, so the link cannot change between them.
    fn queue_on(&self, link: usize, out: Outbound, signed_on_only: bool) -> Option<u64> {
        let slot = self.slot(link)?;
        if signed_on_only && !self.slot_usable(&slot) {
            return None;
        }
        let ok = slot
            .tx
            .as_ref()
            .is_some_and(|tx| tx.try_send(LinkFrame::own(out)).is_ok());
        let generation = slot.generation;
        drop(slot);
        ok.then(|| {
            self.sent_on(link);
            generation
        })
    }

    pub(in crate::link) fn sent_on(&self, link: usize) {
        if let Some(s) = self.stats.get(link) {
            s.frames_out.fetch_add(1, Ordering::Relaxed);
            s.last_sent_ms.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    pub(in crate::link) fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(in crate::link) fn idle_for(&self, link: usize) -> Duration {
        let last = self
            .stats
            .get(link)
            .map_or(0, |s| s.last_sent_ms.load(Ordering::Relaxed));
        Duration::from_millis(self.now_ms().saturating_sub(last))
    }

    pub(in crate::link) fn set_link(&self, link: usize, tx: Option<mpsc::Sender<LinkFrame>>) {
        let up = tx.is_some();
        {
            let Some(mut slot) = self.slot(link) else {
                return;
            };
            slot.tx = tx;
            slot.signed_on = false;
            if up {
                slot.generation += 1;
            }
        }
        if let Some(st) = self.stats.get(link) {
            st.set_state(if up { LinkState::Up } else { LinkState::Down });
            if up {
                st.connects.fetch_add(1, Ordering::Relaxed);
                st.last_sent_ms.store(self.now_ms(), Ordering::Relaxed);
            }
        }
        if !up && self.sign_on == SignOn::PerGroup && self.up().0 == 0 {
            self.group_signed_on.store(false, Ordering::Release);
        }
    }

    /// Remembers a switch-made network management request sent on `link`'s
    /// connection `generation`.
    pub(in crate::link) fn expect_nm_answer(&self, stan: u32, link: usize, generation: u64) {
        let mut p = self.pending_nm.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: a peer that never answers cannot grow this without limit.
        if p.len() >= 4096 {
            p.clear();
        }
        p.insert(stan, (link, generation));
    }

    /// The peer answered a switch-made 0820: a sign-on marks its link (or the
    /// group) signed on, if the connection that sent it is still the link's,
    /// and sends what waits for a signed-on link.
    pub fn nm_answered(
        &self,
        stan: u32,
        f70: &[u8],
        approved: bool,
        sign_on_f70: &[u8],
        echo_f70: &[u8],
    ) -> bool {
        let sent = self
            .pending_nm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&stan);
        let Some((link, generation)) = sent else {
            return false;
        };
        if f70 == sign_on_f70 && approved {
            self.sign_ons_acknowledged.fetch_add(1, Ordering::Relaxed);
            if self.mark_signed_on(link, generation) {
                self.flush(Instant::now(), false);
            }
        } else if f70 == echo_f70 {
            self.echoes_acknowledged.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Marks connection `generation` of `link` signed on; false if that
    /// connection is gone (its 0830 came too late to count).
    pub(in crate::link) fn mark_signed_on(&self, link: usize, generation: u64) -> bool {
        {
            let Some(mut slot) = self.slot(link) else {
                return false;
            };
            if slot.generation != generation || slot.tx.is_none() {
                return false;
            }
            slot.signed_on = true;
            if self.sign_on == SignOn::PerGroup {
                self.group_signed_on.store(true, Ordering::Release);
            }
        }
        if let Some(st) = self.stats.get(link) {
            st.set_state(LinkState::SignedOn);
        }
        true
    }
}

/// Switch-made network management on out links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NmKind {
    SignOn,
    SignOff,
    Echo,
}

#[cfg(test)]
mod tests;
