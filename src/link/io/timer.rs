//! The two read timeouts of a link: a frame started must finish within the
//! partial-frame timeout (a slow-loris or a stalled peer cannot hold a buffer
//! and everything behind it), and a link with no frame at all for the idle
//! timeout is closed (keep-alives are frames, so they keep it open).
//!
//! A timeout around one `next()` cannot see a frame that starts while it
//! waits. Links with few connections (node and peer links) tick instead:
//! between frames, [`ReadTimer::check`] looks at whether the codec holds part
//! of a frame and for how long. A client front holds thousands of quiet
//! terminals, and a tick of each (every half second with the default 5 s
//! partial-frame timeout) woke 16,000 tasks a second at 8,000 clients, more
//! than the traffic did: clients read through [`TimedFrames`], whose one
//! timer fires only when a deadline can have passed.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::io::AsyncRead;
use tokio::time::Sleep;

use super::frames::{Buffered, LeanFrames};
use crate::wire::{Frame, FrameError};

/// How far ahead the timer is set when no deadline applies (no idle timeout,
/// no frame started): it then wakes once a day to look again.
const NO_DEADLINE: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug)]
pub struct ReadTimer {
    idle: Duration,
    partial: Duration,
    last_frame: Instant,
    partial_since: Option<Instant>,
}

/// Why a link was closed by its read timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadTimeout {
    PartialFrame,
    Idle,
}

impl ReadTimeout {
    pub fn as_str(self) -> &'static str {
        match self {
            ReadTimeout::PartialFrame => "partial frame timeout",
            ReadTimeout::Idle => "idle timeout",
        }
    }
}

impl ReadTimer {
    /// `idle` zero = no idle timeout.
    pub fn new(idle: Duration, partial: Duration, now: Instant) -> ReadTimer {
        ReadTimer {
            idle,
            partial,
            last_frame: now,
            partial_since: None,
        }
    }

    /// How often to [`check`](ReadTimer::check): a tenth of the shorter
    /// timeout, between 5 ms and 1 s.
    pub fn tick_period(&self) -> Duration {
        let shortest = if self.idle.is_zero() {
            self.partial
        } else {
            self.idle.min(self.partial)
        };
        (shortest / 10).clamp(Duration::from_millis(5), Duration::from_secs(1))
    }

    /// A whole frame arrived.
    pub fn frame(&mut self, now: Instant) {
        self.last_frame = now;
        self.partial_since = None;
    }

    /// Whether a timeout has passed, given whether the codec holds part of a frame.
    pub fn check(&mut self, in_frame: bool, now: Instant) -> Option<ReadTimeout> {
        if in_frame {
            let since = *self.partial_since.get_or_insert(now);
            return (now.saturating_duration_since(since) >= self.partial)
                .then_some(ReadTimeout::PartialFrame);
        }
        self.partial_since = None;
        let idle_for = now.saturating_duration_since(self.last_frame);
        (!self.idle.is_zero() && idle_for >= self.idle).then_some(ReadTimeout::Idle)
    }
}

impl ReadTimer {
    /// When a timeout can next pass, as things stand: the started frame's,
    /// else the idle one (none if idle is off).
    pub fn deadline(&self) -> Option<Instant> {
        match self.partial_since {
            Some(since) => Some(since + self.partial),
            None => (!self.idle.is_zero()).then(|| self.last_frame + self.idle),
        }
    }
}

/// What a [`TimedFrames`] read gave.
#[derive(Debug)]
pub enum Read {
    /// The reader's next item (`None`: the peer closed its side).
    Frame(Option<Result<Frame, FrameError>>),
    /// A read timeout passed.
    TimedOut(ReadTimeout),
}

/// A framed reader and its read timer, with one timer for both timeouts,
/// set lazily: a frame moves the idle deadline later without touching the
/// timer, and when the timer fires early it is set again to the deadline as
/// it is then. It is brought earlier only when a frame starts (bytes of a
/// frame left in the buffer), which a read-ready wake shows at once. So a
/// quiet client wakes once an idle timeout, not once a tick.
pub struct TimedFrames<R> {
    frames: LeanFrames<R>,
    timer: ReadTimer,
    /// Boxed: `Sleep` cannot move once polled, and the client's task keeps
    /// this beside the rest of its state.
    sleep: Pin<Box<Sleep>>,
    /// Times the timer fired (a test shows a quiet link wakes only at its
    /// deadlines).
    fires: u32,
}

impl<R: AsyncRead + Unpin> TimedFrames<R> {
    pub fn new(frames: LeanFrames<R>, timer: ReadTimer, now: Instant) -> Self {
        let at = timer.deadline().unwrap_or(now + NO_DEADLINE);
        TimedFrames {
            frames,
            timer,
            sleep: Box::pin(tokio::time::sleep_until(at.into())),
            fires: 0,
        }
    }

    /// The next frame, or the timeout that ends the link.
    pub async fn next(&mut self) -> Read {
        std::future::poll_fn(|cx| self.poll_read(cx)).await
    }

    /// The framed reader, to look into its buffer.
    pub fn framed(&self) -> &LeanFrames<R> {
        &self.frames
    }

    /// A whole frame arrived at `now` (the caller reads the clock once per
    /// frame for its own timing too).
    pub fn frame(&mut self, now: Instant) {
        self.timer.frame(now);
    }

    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Read> {
        if let Poll::Ready(item) = self.frames.poll_next_unpin(cx) {
            return Poll::Ready(Read::Frame(item));
        }
        // Nothing whole yet. Bytes of a frame in the buffer start its clock.
        let partial = in_frame(&self.frames);
        if partial != self.timer.partial_since.is_some() {
            self.timer.partial_since = partial.then(clock);
            if let Some(at) = self.timer.deadline()
                && at < self.sleep.deadline().into_std()
            {
                self.sleep.as_mut().reset(at.into());
            }
        }
        loop {
            ready!(self.sleep.as_mut().poll(cx));
            self.fires = self.fires.saturating_add(1);
            let now = clock();
            if let Some(t) = self.timer.check(partial, now) {
                return Poll::Ready(Read::TimedOut(t));
            }
            // At least a millisecond on: a deadline the timer thinks past
            // must not spin this loop.
            let at = self.timer.deadline().unwrap_or(now + NO_DEADLINE);
            let at = at.max(now + Duration::from_millis(1));
            self.sleep.as_mut().reset(at.into());
        }
    }
}

/// The timer's clock: the same as `Instant::now()` in a build, and tokio's
/// paused clock in the unit tests, which move time by the timers.
fn clock() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Whether a framed reader holds part of a frame (a prefix read, or bytes buffered).
pub fn in_frame(frames: &impl Buffered) -> bool {
    frames.decoder().in_frame() || !frames.read_buffer().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::LengthPrefix;
    use tokio::io::{AsyncWriteExt, DuplexStream};

    fn timed(idle: Duration, partial: Duration) -> (TimedFrames<DuplexStream>, DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(1024);
        let frames = LeanFrames::new(
            ours,
            crate::wire::FrameCodec::new(LengthPrefix::Binary2, 4096),
        );
        let now = clock();
        (
            TimedFrames::new(frames, ReadTimer::new(idle, partial, now), now),
            theirs,
        )
    }

    /// Reads until something other than a frame, counting the frames.
    async fn until_not_a_frame(t: &mut TimedFrames<DuplexStream>) -> (usize, Read) {
        let mut n = 0;
        loop {
            match t.next().await {
                Read::Frame(Some(Ok(_))) => {
                    n += 1;
                    t.frame(clock());
                }
                other => return (n, other),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_client_times_out_idle_once_and_frames_move_the_deadline() {
        let (mut t, mut peer) = timed(Duration::from_secs(300), Duration::from_secs(5));
        let t0 = clock();
        let writer = tokio::spawn(async move {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_secs(200)).await;
                peer.write_all(&[0, 0]).await.unwrap(); // a keep-alive
            }
            peer
        });
        let (frames, read) = until_not_a_frame(&mut t).await;
        assert_eq!(frames, 3);
        assert!(
            matches!(read, Read::TimedOut(ReadTimeout::Idle)),
            "{read:?}"
        );
        // The last frame at 600 s, idle 300 s after it (the paused clock
        // jumps from timer to timer, so this is exact).
        assert_eq!(clock() - t0, Duration::from_secs(900));
        // Woken at 300, 500 and 700 s (each time to find the deadline
        // moved by a frame) and at 900 s: not every half second.
        assert_eq!(t.fires, 4);
        drop(writer.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_started_frame_times_out_from_its_first_bytes_not_the_idle_deadline() {
        let (mut t, mut peer) = timed(Duration::from_secs(300), Duration::from_secs(5));
        let t0 = clock();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            peer.write_all(&[0, 10, b'0', b'2']).await.unwrap(); // 10 announced, 2 sent
            peer
        });
        let (frames, read) = until_not_a_frame(&mut t).await;
        assert_eq!(frames, 0);
        assert!(
            matches!(read, Read::TimedOut(ReadTimeout::PartialFrame)),
            "{read:?}"
        );
        assert_eq!(clock() - t0, Duration::from_secs(15));
        drop(writer.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_finished_in_time_clears_its_clock() {
        let (mut t, mut peer) = timed(Duration::ZERO, Duration::from_secs(5));
        let writer = tokio::spawn(async move {
            peer.write_all(&[0, 4, b'0', b'8']).await.unwrap();
            tokio::time::sleep(Duration::from_secs(4)).await;
            peer.write_all(b"00").await.unwrap();
            // No idle timeout: a silent peer is kept, until it closes.
            tokio::time::sleep(Duration::from_secs(3 * 24 * 3600)).await;
            drop(peer);
        });
        let (frames, read) = until_not_a_frame(&mut t).await;
        assert_eq!(frames, 1);
        assert!(
            matches!(read, Read::Frame(None)),
            "closed by the peer: {read:?}"
        );
        writer.await.unwrap();
    }

    #[test]
    fn partial_frame_times_out_from_when_it_was_seen() {
        let t0 = Instant::now();
        let mut t = ReadTimer::new(Duration::from_secs(10), Duration::from_millis(200), t0);
        assert_eq!(t.check(true, t0 + Duration::from_millis(100)), None);
        assert_eq!(
            t.check(true, t0 + Duration::from_millis(250)),
            None,
            "200 ms from first seen"
        );
        assert_eq!(
            t.check(true, t0 + Duration::from_millis(301)),
            Some(ReadTimeout::PartialFrame)
        );
        t.frame(t0 + Duration::from_millis(310));
        assert_eq!(
            t.check(true, t0 + Duration::from_millis(400)),
            None,
            "a new frame starts afresh"
        );
    }

    #[test]
    fn idle_counts_from_the_last_frame_and_zero_disables_it() {
        let t0 = Instant::now();
        let mut t = ReadTimer::new(Duration::from_secs(1), Duration::from_secs(5), t0);
        t.frame(t0 + Duration::from_millis(900));
        assert_eq!(t.check(false, t0 + Duration::from_millis(1500)), None);
        assert_eq!(
            t.check(false, t0 + Duration::from_millis(1900)),
            Some(ReadTimeout::Idle)
        );
        let mut never = ReadTimer::new(Duration::ZERO, Duration::from_secs(5), t0);
        assert_eq!(never.check(false, t0 + Duration::from_secs(3600)), None);
        assert_eq!(never.tick_period(), Duration::from_millis(500));
    }
}
