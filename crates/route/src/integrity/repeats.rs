//! [`RepeatBook`]: which node each request went to, so that a repeat goes
//! where its original went.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::BookCounters;
use crate::correlator::CorrelationKey;
use crate::generations::{Clock, Generations, generation_of, millis};

/// Which node each request went to, by a hash of its correlation key, for
/// `window`, in [`REPEAT_SHARDS`] locked shards of generations (see
/// [`crate::generations`]: where a sweep of one big table held its locks
/// for milliseconds once a second, a generation is dropped whole). An entry
/// lives between `window` and `window + window / GENERATIONS`;
/// [`RepeatBook::node_of`] answers by the exact window.
#[derive(Debug)]
pub struct RepeatBook {
    shards: Box<[std::sync::Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
    clock: Clock,
    window: Duration,
    /// `window` and a generation's length, in milliseconds.
    window_ms: u64,
    generation: u64,
    capacity: usize,
    /// Entries in every generation of every shard, so the capacity check
    /// does not lock every shard.
    held: AtomicUsize,
    pub counters: BookCounters,
}

/// One shard: node and milliseconds since the generation's start, by key
/// hash.
type Shard = Generations<(u32, u32)>;

/// Shards of the repeat book: worker threads recording at once rarely meet
/// on one lock.
pub const REPEAT_SHARDS: usize = 16;

impl RepeatBook {
    pub fn new(window: Duration, capacity: usize) -> RepeatBook {
        RepeatBook {
            shards: (0..REPEAT_SHARDS).map(|_| Default::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
            clock: Clock::new(),
            window,
            window_ms: millis(window),
            generation: generation_of(window),
            capacity,
            held: AtomicUsize::new(0),
            counters: BookCounters::default(),
        }
    }

    pub fn is_on(&self) -> bool {
        !self.window.is_zero()
    }

    fn shard(&self, hash: u64) -> std::sync::MutexGuard<'_, Shard> {
        // The top bits: hashbrown places by the low ones.
        let i = (hash >> 60) as usize % self.shards.len();
        // A panic elsewhere while a shard was held leaves plain data behind.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The request of `key` went to `node` (it was answered, by the node or
    /// by the switch).
    pub fn record(&self, key: &CorrelationKey, node: usize, now: Instant) {
        if !self.is_on() {
            return;
        }
        let hash = self.hasher.hash_one(key);
        let node = u32::try_from(node).unwrap_or(u32::MAX);
        let t = self.clock.ms(now);
        let mut shard = self.shard(hash);
        let gone = shard.expire(t, self.window_ms, self.generation);
        self.held.fetch_sub(gone, Ordering::Relaxed);
        let g = shard.current(t, self.generation);
        let full = self.held.load(Ordering::Relaxed) >= self.capacity;
        if full && !g.entries.contains_key(&hash) {
            self.counters.overflow.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let ms = g.ms_at(t);
        if g.entries.insert(hash, (node, ms)).is_none() {
            self.held.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The node the original of a repeat went to, if within the window.
    pub fn node_of(&self, key: &CorrelationKey, now: Instant) -> Option<usize> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        let (g, &(node, ms)) = shard.newest(hash)?;
        let t = self.clock.ms(now);
        (t.saturating_sub(g.at(ms)) <= self.window_ms).then_some(node as usize)
    }

    /// Drops the generations past the window in every shard (a shard also
    /// does it when it records). Returns how many entries went.
    pub fn sweep(&self, now: Instant) -> usize {
        let t = self.clock.ms(now);
        let mut gone = 0;
        for i in 0..self.shards.len() {
            let mut shard = self.shards[i].lock().unwrap_or_else(|e| e.into_inner());
            gone += shard.expire(t, self.window_ms, self.generation);
        }
        self.held.fetch_sub(gone, Ordering::Relaxed);
        gone
    }

    pub fn len(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> CorrelationKey {
        CorrelationKey::builder().push(&[n]).build().unwrap()
    }

    fn key_n(n: u64) -> CorrelationKey {
        CorrelationKey::builder()
            .push(&n.to_le_bytes())
            .build()
            .unwrap()
    }

    #[test]
    fn repeats_find_their_node_within_the_window() {
        let t0 = Instant::now();
        let book = RepeatBook::new(Duration::from_secs(30), 100);
        book.record(&key(1), 3, t0);
        assert_eq!(book.node_of(&key(1), t0 + Duration::from_secs(30)), Some(3));
        assert_eq!(book.node_of(&key(1), t0 + Duration::from_secs(31)), None);
        assert_eq!(book.node_of(&key(9), t0), None);
        // Forgotten with its generation, within window / GENERATIONS after
        // the window.
        assert_eq!(book.sweep(t0 + Duration::from_secs(31)), 0);
        assert_eq!(book.sweep(t0 + Duration::from_millis(33_751)), 1);
        assert!(book.is_empty());
        let off = RepeatBook::new(Duration::ZERO, 100);
        off.record(&key(1), 3, t0);
        assert!(off.is_empty());
    }

    #[test]
    fn a_request_recorded_again_answers_with_its_latest_node() {
        let t0 = Instant::now();
        let book = RepeatBook::new(Duration::from_secs(8), 100);
        book.record(&key(1), 1, t0);
        let later = t0 + Duration::from_secs(5);
        book.record(&key(1), 2, later);
        assert_eq!(book.node_of(&key(1), later), Some(2));
        // The first generation goes; the second still knows the request.
        let t = t0 + Duration::from_millis(9_001);
        assert_eq!(book.sweep(t), 1);
        assert_eq!(book.node_of(&key(1), t), Some(2));
        assert_eq!(book.len(), 1);
    }

    #[test]
    fn the_repeat_book_reuses_its_tables_and_counts_what_it_holds() {
        let t0 = Instant::now();
        let window = Duration::from_secs(8);
        let book = RepeatBook::new(window, 1_000_000);
        // A steady stream over five windows: the book holds at most a
        // window, a generation and the time since the last sweep of it (a
        // shard that records nothing drops its generations at the sweep):
        // 10 s of 100 a second.
        for ms in (0..40_000u64).step_by(10) {
            let now = t0 + Duration::from_millis(ms);
            book.record(&key_n(ms), 1, now);
            if ms % 1000 == 0 {
                book.sweep(now);
            }
            assert!(book.len() <= 1001, "{} held at {ms} ms", book.len());
        }
        assert!(book.len() >= 800, "the last window is still known");
        // Its count of what it holds never drifted: all gone means zero.
        book.sweep(t0 + Duration::from_secs(60));
        assert!(book.is_empty(), "{} left", book.len());
        let spares = book
            .shards
            .iter()
            .filter(|s| s.lock().unwrap().spare.is_some())
            .count();
        assert!(spares > 0, "dropped generations left their tables to reuse");
    }

    #[test]
    fn a_full_repeat_book_refuses_new_requests_and_counts_them() {
        let t0 = Instant::now();
        let book = RepeatBook::new(Duration::from_secs(30), 2);
        book.record(&key(1), 1, t0);
        book.record(&key(2), 1, t0);
        book.record(&key(3), 1, t0);
        assert_eq!(book.node_of(&key(3), t0), None);
        assert_eq!(book.counters.overflow.load(Ordering::Relaxed), 1);
        book.record(&key(1), 4, t0);
        assert_eq!(
            book.node_of(&key(1), t0),
            Some(4),
            "a known request is updated"
        );
    }
}
