//! The tables behind the book that remembers every request for a window
//! ([`RepeatBook`](crate::integrity::RepeatBook); the answers duplicates
//! get are kept in the correlation table instead, one entry per key:
//! [`crate::integrity::DuplicateBook`]).
//!
//! Kept in generations, each `window / GENERATIONS` long: a record goes into
//! the newest generation, and a generation whose newest entry is older than
//! the window is dropped whole (its table cleared and kept for the next
//! generation opened). So a record touches a small, recent table that stays
//! in cache, instead of one table of every request of the window (a million
//! entries at 30 s of 30,000 a second, a cache miss each), forgetting costs
//! nothing per entry, and in a steady stream nothing is allocated. An entry
//! lives between `window` and `window + window / GENERATIONS`; lookups
//! answer by the exact window.
//!
//! Times are whole milliseconds on the book's [`Clock`]: a book turns the
//! caller's `Instant` into one number once per call, where comparing
//! `Instant`s costs a `timespec` subtraction each (three or four a record,
//! about a tenth of what the duplicate check cost the message path;
//! `scripts/path-ir.sh`).

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

/// Generations per window.
pub const GENERATIONS: u32 = 8;

/// A book's time: milliseconds since an epoch before any instant a caller
/// hands in.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    epoch: Instant,
}

impl Clock {
    pub(crate) fn new() -> Clock {
        let now = Instant::now();
        // Callers take `now` before they call, and tests build their
        // instants before the book: the epoch lies well before either, as
        // far back as the monotonic clock goes.
        let epoch = [86_400, 3_600, 60, 1]
            .iter()
            .find_map(|&s| now.checked_sub(Duration::from_secs(s)))
            .unwrap_or(now);
        Clock { epoch }
    }

    /// `now` in milliseconds on this clock (an instant before the epoch
    /// counts as the epoch).
    pub(crate) fn ms(&self, now: Instant) -> u64 {
        millis(now.saturating_duration_since(self.epoch))
    }
}

/// A duration in whole milliseconds (saturating: `u64` milliseconds are
/// half a billion years).
pub(crate) fn millis(d: Duration) -> u64 {
    // `as_millis` in u128, saturated to u64, in u64 steps.
    d.as_secs()
        .saturating_mul(1000)
        .saturating_add(u64::from(d.subsec_millis()))
}

/// One shard's generations, oldest first.
#[derive(Debug)]
pub(crate) struct Generations<V> {
    pub(crate) ring: VecDeque<Generation<V>>,
    /// The table of the last generation dropped, cleared, for the next one
    /// opened: in a steady stream the book allocates nothing.
    pub(crate) spare: Option<Generation<V>>,
}

impl<V> Default for Generations<V> {
    fn default() -> Self {
        Generations {
            ring: VecDeque::new(),
            spare: None,
        }
    }
}

/// The records of one stretch of time, by key hash.
#[derive(Debug)]
pub(crate) struct Generation<V> {
    /// Milliseconds on the book's clock.
    pub(crate) start: u64,
    pub(crate) entries: hashbrown::HashMap<u64, V, KeyIsHash>,
}

impl<V> Generation<V> {
    /// Milliseconds from the generation's start to `t`, as kept per entry.
    pub(crate) fn ms_at(&self, t: u64) -> u32 {
        u32::try_from(t.saturating_sub(self.start)).unwrap_or(u32::MAX)
    }

    /// The time an entry recorded `ms` after the start stands for.
    pub(crate) fn at(&self, ms: u32) -> u64 {
        self.start.saturating_add(u64::from(ms))
    }
}

/// The length of one generation of `window`, in milliseconds.
pub(crate) fn generation_of(window: Duration) -> u64 {
    millis(window / GENERATIONS).max(1)
}

impl<V> Generations<V> {
    /// Drops the generations wholly past the window (`window` ms) at `t`;
    /// returns the entries dropped.
    pub(crate) fn expire(&mut self, t: u64, window: u64, generation: u64) -> usize {
        let mut gone = 0;
        while let Some(oldest) = self.ring.front() {
            let newest_entry = oldest.start.saturating_add(generation);
            if t.saturating_sub(newest_entry) <= window {
                break;
            }
            if let Some(mut g) = self.ring.pop_front() {
                gone += g.entries.len();
                g.entries.clear();
                self.spare = Some(g);
            }
        }
        gone
    }

    /// The generation a record at `t` goes into, opened if needed.
    pub(crate) fn current(&mut self, t: u64, generation: u64) -> &mut Generation<V> {
        let open = self
            .ring
            .back()
            .is_none_or(|g| t.saturating_sub(g.start) >= generation);
        if open {
            let g = match self.spare.take() {
                Some(mut g) => {
                    g.start = t;
                    g
                }
                None => Generation {
                    start: t,
                    entries: hashbrown::HashMap::with_hasher(KeyIsHash),
                },
            };
            self.ring.push_back(g);
        }
        let last = self.ring.len() - 1;
        &mut self.ring[last]
    }

    /// The newest record of `hash` and its generation: a request recorded
    /// again lives in a later generation.
    pub(crate) fn newest(&self, hash: u64) -> Option<(&Generation<V>, &V)> {
        self.ring
            .iter()
            .rev()
            .find_map(|g| g.entries.get(&hash).map(|v| (g, v)))
    }
}

/// The keys are already foldhash hashes: used as they are.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KeyIsHash;

impl BuildHasher for KeyIsHash {
    type Hasher = PassThrough;
    fn build_hasher(&self) -> PassThrough {
        PassThrough(0)
    }
}

#[derive(Debug)]
pub(crate) struct PassThrough(u64);

impl std::hash::Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed; fold anything else in, to stay correct.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}
