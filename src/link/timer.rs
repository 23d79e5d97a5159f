//! The two read timeouts of a link: a frame started must finish within the
//! partial-frame timeout (a slow-loris or a stalled peer cannot hold a buffer
//! and everything behind it), and a link with no frame at all for the idle
//! timeout is closed (keep-alives are frames, so they keep it open).
//!
//! A timeout around one `next()` cannot see a frame that starts while it
//! waits, so readers tick instead: between frames, [`ReadTimer::check`] looks
//! at whether the codec holds part of a frame and for how long.

use std::time::{Duration, Instant};

use tokio_util::codec::FramedRead;

use crate::wire::FrameCodec;

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

/// Whether a framed reader holds part of a frame (a prefix read, or bytes buffered).
pub fn in_frame<R>(frames: &FramedRead<R, FrameCodec>) -> bool {
    frames.decoder().in_frame() || !frames.read_buffer().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

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
