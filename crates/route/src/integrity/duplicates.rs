//! [`DuplicateBook`]: what each request was answered, for
//! `duplicate_window`, so that the same request sent again (a terminal or
//! network that retransmits without marking it a repeat) is answered as it
//! was the first time, or declined 94, and never reaches a host a second
//! time to be approved twice.
//!
//! A request is the same when its correlation key and its fingerprint (a
//! hash of the key and of the configured fields the key does not hold
//! already: F7, F11, F32, F33, F41 by default) are. Both hashes are taken
//! once, when the request comes in ([`DuplicateBook::identify`]), and kept
//! with it while it is in flight, so its answer is recorded without
//! hashing again. The answers are kept in a byte ring per shard, allocated
//! on the first answer and never grown: memory is bounded by
//! `replay_bytes`, and an answer overwritten before its window ends can no
//! longer be replayed (the duplicate is declined instead, and counted).

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::correlator::CorrelationKey;
use crate::generations::{Clock, Generations, generation_of, millis};

/// Shards of the duplicate book (as for the repeat book).
const SHARDS: usize = 16;

/// What the book knows of a request seen before.
#[derive(Debug, PartialEq, Eq)]
pub enum Duplicate {
    /// The answer it got, to send again.
    Replay(Vec<u8>),
    /// Answered, but not by a node (the switch declined it or let it
    /// expire), or its answer is no longer held: declined as a duplicate.
    Answered,
}

/// What makes a request the same transaction as another, as the book
/// tells them apart: the hash of its correlation key (where the book keeps
/// it) and its fingerprint. [`Identity::NONE`] for a request that has no
/// duplicates (not approvable, or the check is off).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    place: u64,
    /// Never 0 for a request the book knows; 0: none.
    fingerprint: u64,
}

impl Identity {
    pub const NONE: Identity = Identity {
        place: 0,
        fingerprint: 0,
    };

    pub fn is_none(&self) -> bool {
        self.fingerprint == 0
    }
}

/// Counters of the duplicate book, readable at any time.
#[derive(Debug, Default)]
pub struct DuplicateCounters {
    /// Records refused because the book was full.
    pub overflow: AtomicU64,
    /// Answers too long to keep for replay (over a quarter of a shard's ring).
    pub too_long: AtomicU64,
    /// Duplicates found whose answer had been overwritten in the ring.
    pub overwritten: AtomicU64,
}

/// One answered request, in its generation's table.
#[derive(Clone, Copy, Debug)]
struct Answered {
    fingerprint: u64,
    /// Milliseconds after its generation's start.
    ms: u32,
    /// Length of the answer in the ring; 0 when there is none to replay.
    len: u32,
    /// Where the answer starts in the ring, counted from the ring's first
    /// byte ever written.
    at: u64,
}

/// Answers to replay: a fixed ring of bytes, overwritten oldest first.
#[derive(Debug, Default)]
struct Ring {
    bytes: Vec<u8>,
    /// Bytes written since the start (where the next answer goes, modulo
    /// the ring's size).
    head: u64,
}

impl Ring {
    /// Copies `data` in; where it starts, or `None` when it cannot be kept.
    fn put(&mut self, data: &[u8], capacity: usize) -> Option<u64> {
        if data.is_empty() || data.len() > capacity / 4 {
            return None;
        }
        if self.bytes.len() != capacity {
            // Zeroed pages cost no memory until written.
            self.bytes = vec![0; capacity];
        }
        let cap = capacity as u64;
        let mut off = (self.head % cap) as usize;
        if off + data.len() > capacity {
            // No answer wraps: the tail of the ring is skipped.
            self.head += cap - off as u64;
            off = 0;
        }
        let at = self.head;
        self.bytes[off..off + data.len()].copy_from_slice(data);
        self.head += data.len() as u64;
        Some(at)
    }

    /// The answer written at `at`, unless written over since.
    fn get(&self, at: u64, len: u32) -> Option<&[u8]> {
        let cap = self.bytes.len() as u64;
        if cap == 0 || self.head > at + cap {
            return None;
        }
        let off = (at % cap) as usize;
        self.bytes.get(off..off + len as usize)
    }
}

#[derive(Debug, Default)]
struct Shard {
    generations: Generations<Answered>,
    ring: Ring,
}

/// The answers of the last `window`, by correlation key (see the module).
#[derive(Debug)]
pub struct DuplicateBook {
    shards: Box<[std::sync::Mutex<Shard>]>,
    /// Where a key lies (shard and table).
    hasher: foldhash::fast::RandomState,
    /// The fingerprint, seeded apart from `hasher`: two requests whose keys
    /// share a place are still told apart by their whole key.
    fingerprints: foldhash::fast::RandomState,
    clock: Clock,
    window: Duration,
    /// `window` and a generation's length, in milliseconds.
    window_ms: u64,
    generation: u64,
    capacity: usize,
    /// Ring bytes per shard; 0: nothing is replayed.
    ring_bytes: usize,
    /// The identifying fields the correlation key does not hold.
    fields: Vec<u16>,
    held: AtomicUsize,
    pub counters: DuplicateCounters,
}

impl DuplicateBook {
    /// A book of `window` (zero: off) holding at most `capacity` requests
    /// and `replay_bytes` of answers in all (zero: duplicates are declined,
    /// never replayed).
    pub fn new(window: Duration, capacity: usize, replay_bytes: usize) -> DuplicateBook {
        DuplicateBook {
            shards: (0..SHARDS).map(|_| Default::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
            fingerprints: foldhash::fast::RandomState::default(),
            clock: Clock::new(),
            window,
            window_ms: millis(window),
            generation: generation_of(window),
            capacity,
            ring_bytes: replay_bytes / SHARDS,
            fields: Vec::new(),
            held: AtomicUsize::new(0),
            counters: DuplicateCounters::default(),
        }
    }

    pub fn is_on(&self) -> bool {
        !self.window.is_zero()
    }

    /// The fields that tell two requests apart beyond their correlation
    /// key (`duplicate_fields` less the key's own), set once at start.
    pub fn tell_apart_by(&mut self, fields: Vec<u16>) {
        self.fields = fields;
    }

    /// The fields [`DuplicateBook::identify`] reads beside the key.
    pub fn fields(&self) -> &[u16] {
        &self.fields
    }

    /// What the request of `key` is known by: its key's place and its
    /// fingerprint, a hash of the key and of `parts`, the bytes of the
    /// identifying fields the key does not hold, in order (an absent field
    /// as an empty part). Fields already in the key are not read twice:
    /// the key holds their bytes. [`Identity::NONE`] with the check off.
    pub fn identify<'a>(
        &self,
        key: &CorrelationKey,
        parts: impl IntoIterator<Item = &'a [u8]>,
    ) -> Identity {
        if !self.is_on() {
            return Identity::NONE;
        }
        let key = key.as_bytes();
        let mut h = self.fingerprints.build_hasher();
        h.write(key);
        for part in parts {
            h.write_usize(part.len());
            h.write(part);
        }
        Identity {
            place: self.hasher.hash_one(key),
            fingerprint: h.finish() | 1,
        }
    }

    /// The shard of a key's place, locked.
    fn shard(&self, place: u64) -> std::sync::MutexGuard<'_, Shard> {
        // The top bits: hashbrown places by the low ones.
        let i = (place >> 60) as usize % SHARDS;
        // A panic elsewhere while a shard was held leaves plain data behind.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The request known as `id` was answered with `answer` (empty: by the
    /// switch, nothing to replay).
    pub fn record(&self, id: Identity, answer: &[u8], now: Instant) {
        if id.is_none() || !self.is_on() {
            return;
        }
        let t = self.clock.ms(now);
        let mut shard = self.shard(id.place);
        let shard = &mut *shard;
        let gone = shard.generations.expire(t, self.window_ms, self.generation);
        if gone > 0 {
            self.held.fetch_sub(gone, Ordering::Relaxed);
        }
        let full = self.held.load(Ordering::Relaxed) >= self.capacity;
        let g = shard.generations.current(t, self.generation);
        if full && !g.entries.contains_key(&id.place) {
            self.counters.overflow.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let kept = if self.ring_bytes == 0 || answer.is_empty() {
            None
        } else {
            let at = shard.ring.put(answer, self.ring_bytes);
            if at.is_none() {
                self.counters.too_long.fetch_add(1, Ordering::Relaxed);
            }
            at
        };
        let entry = Answered {
            fingerprint: id.fingerprint,
            ms: g.ms_at(t),
            len: kept.map_or(0, |_| u32::try_from(answer.len()).unwrap_or(0)),
            at: kept.unwrap_or(0),
        };
        if g.entries.insert(id.place, entry).is_none() {
            self.held.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether the request known as `id` was answered within the window,
    /// and what to answer it now.
    pub fn find(&self, id: Identity, now: Instant) -> Option<Duplicate> {
        if id.is_none() || !self.is_on() {
            return None;
        }
        let shard = self.shard(id.place);
        let (g, a) = shard.generations.newest(id.place)?;
        // A key seen before is nearly always another transaction: the
        // fingerprint first, the clock only for the same one.
        if a.fingerprint != id.fingerprint
            || self.clock.ms(now).saturating_sub(g.at(a.ms)) > self.window_ms
        {
            return None;
        }
        if a.len == 0 {
            return Some(Duplicate::Answered);
        }
        match shard.ring.get(a.at, a.len) {
            Some(bytes) => Some(Duplicate::Replay(bytes.to_vec())),
            None => {
                self.counters.overwritten.fetch_add(1, Ordering::Relaxed);
                Some(Duplicate::Answered)
            }
        }
    }

    /// Drops the generations past the window in every shard. Returns how
    /// many entries went.
    pub fn sweep(&self, now: Instant) -> usize {
        let t = self.clock.ms(now);
        let mut gone = 0;
        for s in self.shards.iter() {
            let mut shard = s.lock().unwrap_or_else(|e| e.into_inner());
            gone += shard.generations.expire(t, self.window_ms, self.generation);
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

    #[test]
    fn the_same_request_gets_its_first_answer_within_the_window() {
        let t0 = Instant::now();
        let book = DuplicateBook::new(Duration::from_secs(300), 100, 1 << 20);
        let fields = |f7: &'static [u8]| [f7, b"000001", b"", b"TERM0001"];
        let first = |k| book.identify(&key(k), fields(b"1206101112"));
        let other = book.identify(&key(1), fields(b"1206101113"));
        assert_ne!(first(1), other, "another F7: another transaction");
        book.record(first(1), b"0210-approved", t0);
        let later = t0 + Duration::from_secs(300);
        assert_eq!(
            book.find(first(1), later),
            Some(Duplicate::Replay(b"0210-approved".to_vec()))
        );
        assert_eq!(book.find(other, later), None);
        assert_eq!(book.find(first(2), later), None);
        assert_eq!(book.find(first(1), later + Duration::from_millis(1)), None);
        // Answered by the switch: a duplicate is declined, nothing replayed.
        book.record(first(3), b"", t0);
        assert_eq!(book.find(first(3), t0), Some(Duplicate::Answered));
        let off = DuplicateBook::new(Duration::ZERO, 100, 1 << 20);
        let none = off.identify(&key(1), fields(b"1206101112"));
        assert!(none.is_none(), "no identity with the check off");
        off.record(none, b"x", t0);
        assert_eq!(off.find(none, t0), None);
    }

    #[test]
    fn an_answer_written_over_is_declined_not_replayed() {
        let t0 = Instant::now();
        // 64 bytes a shard: an answer of 16 bytes at most.
        let book = DuplicateBook::new(Duration::from_secs(300), 100, 64 * SHARDS);
        let id = |k: &CorrelationKey| book.identify(k, [&b"a"[..]]);
        let shard_of = |k: &CorrelationKey| (id(k).place >> 60) as usize % SHARDS;
        book.record(id(&key(1)), &[7; 16], t0);
        assert_eq!(
            book.find(id(&key(1)), t0),
            Some(Duplicate::Replay(vec![7; 16]))
        );
        // Ten more answers through key 1's shard wrap its ring.
        let shard = shard_of(&key(1));
        let others = (1000u32..)
            .map(|n| {
                CorrelationKey::builder()
                    .push(&n.to_le_bytes())
                    .build()
                    .unwrap()
            })
            .filter(|k| shard_of(k) == shard)
            .take(10);
        for (n, k) in others.enumerate() {
            book.record(id(&k), &[n as u8; 16], t0);
        }
        assert_eq!(book.find(id(&key(1)), t0), Some(Duplicate::Answered));
        assert_eq!(book.counters.overwritten.load(Ordering::Relaxed), 1);
        book.record(id(&key(2)), &[1; 17], t0);
        assert_eq!(book.find(id(&key(2)), t0), Some(Duplicate::Answered));
        assert_eq!(book.counters.too_long.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_full_book_refuses_new_requests_and_forgets_with_its_generations() {
        let t0 = Instant::now();
        let book = DuplicateBook::new(Duration::from_secs(8), 2, 1 << 16);
        for n in 1..=3 {
            book.record(book.identify(&key(n), [&b"a"[..]]), b"x", t0);
        }
        assert_eq!(book.len(), 2);
        assert_eq!(book.counters.overflow.load(Ordering::Relaxed), 1);
        assert_eq!(book.sweep(t0 + Duration::from_secs(10)), 2);
        assert!(book.is_empty());
    }
}
