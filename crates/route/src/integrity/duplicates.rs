//! What each request was answered, for `duplicate_window`, so that the same
//! request sent again (a terminal or network that retransmits without
//! marking it a repeat) is answered as it was the first time, or declined
//! 94, and never reaches a host a second time to be approved twice.
//!
//! A request is the same when its correlation key and its fingerprint (a
//! hash of the configured fields the key does not hold already: F7, F11,
//! F32, F33, F41 by default) are. The fingerprint is taken once, when the
//! request comes in, and kept with it while it is in flight.
//!
//! A service keeps its answers in its correlation table
//! ([`Shards`](crate::correlator::Shards)), where the request waited for
//! them: one key, one entry, in flight then answered. So looking a request
//! up is the probe that registers it, and recording its answer is a change
//! of the entry it leaves (see the correlator). [`Answers`] is that part of
//! a table's shard: the answered entries, oldest first, and the answer
//! bytes to replay. [`DuplicateBook`] says what a request is known by
//! (its fingerprint) and how answers are kept ([`Keeping`]).
//!
//! The answers are kept in a byte ring per shard, allocated on the first
//! answer and never grown: memory is bounded by `replay_bytes`, and an
//! answer overwritten before its window ends can no longer be replayed (the
//! duplicate is declined instead, and counted). The ring keeps the whole
//! correlation key before each answer: an answer is replayed only to a
//! request of that very key, never on the strength of a hash alone.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hashbrown::HashTable;

/// Shards of the duplicate book: as many as a correlation table's, each
/// with its share of the ring ([`Keeping`]).
const SHARDS: usize = crate::correlator::SHARDS;

/// What the book knows of a request seen before.
#[derive(Debug, PartialEq, Eq)]
pub enum Duplicate {
    /// The answer it got, to send again.
    Replay(Vec<u8>),
    /// Answered, but not by a node (the switch declined it or let it
    /// expire), or its answer is no longer held: declined as a duplicate.
    Answered,
}

/// What makes a request the same transaction as another, beside its
/// correlation key: its fingerprint. [`Identity::NONE`] for a request that
/// has no duplicates (not approvable, or the check is off).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// Never 0 for a request the book knows; 0: none.
    fingerprint: u64,
}

impl Identity {
    pub const NONE: Identity = Identity { fingerprint: 0 };

    pub fn is_none(&self) -> bool {
        self.fingerprint == 0
    }

    /// The fingerprint (0: none).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }
}

/// Counters of the duplicate book, readable at any time.
#[derive(Debug, Default)]
pub struct DuplicateCounters {
    /// Answers forgotten before their window for room (the table full).
    pub overflow: AtomicU64,
    /// Answers too long to keep for replay (over a quarter of a shard's ring).
    pub too_long: AtomicU64,
    /// Duplicates found whose answer had been overwritten in the ring.
    pub overwritten: AtomicU64,
}

/// How answers are kept, shared by the shards of one table: the window,
/// the most answers held and the ring's size, and how many are held now.
#[derive(Debug)]
pub struct Keeping {
    window: Duration,
    /// `window` is not zero (asked per request).
    on: bool,
    capacity: usize,
    /// Each shard's share of `capacity`.
    shard_capacity: usize,
    /// Ring bytes per shard; 0: nothing is replayed.
    ring_bytes: usize,
    held: AtomicUsize,
    pub counters: Arc<DuplicateCounters>,
}

impl Keeping {
    /// Answers of `window` (zero: none kept), at most `capacity` of them,
    /// and `replay_bytes` of answers to replay across `shards` shards.
    pub fn new(window: Duration, capacity: usize, replay_bytes: usize, shards: usize) -> Keeping {
        Keeping {
            window,
            on: !window.is_zero(),
            // A tag numbers entries in 31 bits.
            capacity: capacity.min(1 << 30),
            shard_capacity: capacity.min(1 << 30).div_ceil(shards.max(1)),
            ring_bytes: replay_bytes / shards.max(1),
            held: AtomicUsize::new(0),
            counters: Arc::default(),
        }
    }

    #[inline]
    pub fn is_on(&self) -> bool {
        self.on
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    /// The most answers held at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Answers held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Each shard's share of the answers held: past it, a shard forgets
    /// its oldest.
    pub(crate) fn shard_capacity(&self) -> usize {
        self.shard_capacity
    }

    /// One more answer held.
    pub(crate) fn count_kept(&self) {
        self.held.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` answers forgotten before their window, for room (counted).
    pub(crate) fn forgot_early(&self, n: usize) {
        self.give_back(n);
        self.counters
            .overflow
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `n` answers forgotten.
    pub(crate) fn give_back(&self, n: usize) {
        if n > 0 {
            self.held.fetch_sub(n, Ordering::Relaxed);
        }
    }
}

/// The tag of an answered entry in a table's index, where a request in
/// flight is its slot number (below this bit): the entry's number, 31
/// bits, wrapping.
pub(crate) const ANSWERED: u32 = 1 << 31;
const NUMBER: u32 = ANSWERED - 1;

/// One answered request.
#[derive(Clone, Copy, Debug)]
struct Answer {
    /// Its key's hash, as the table's index has it.
    hash: u64,
    fingerprint: u64,
    at: Instant,
    /// Where its key and answer start in the ring, counted from the ring's
    /// first byte ever written.
    ring_at: u64,
    /// Length of the answer in the ring; 0 when there is none to replay.
    len: u32,
    /// Where the index held it last (a bucket number, good until the index
    /// grows): found again without a probe.
    bucket: u32,
    /// Length of the key before it in the ring (0: none kept).
    key_len: u8,
    /// A duplicate was sent its answer: the sender's terminal has it.
    replayed: bool,
}

/// What an answered entry says of a request with its fingerprint.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Seen<'a> {
    /// Its answer, to replay.
    Replay(&'a [u8]),
    /// Answered by the switch, or nothing kept to replay.
    Answered,
    /// Its answer was written over in the ring.
    Overwritten,
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
    /// Copies `key` then `data` in, together; where they start, or `None`
    /// when they cannot be kept.
    fn put(&mut self, key: &[u8], data: &[u8], capacity: usize) -> Option<u64> {
        let len = key.len() + data.len();
        if data.is_empty() || len > capacity / 4 {
            return None;
        }
        if self.bytes.len() != capacity {
            // Zeroed pages cost no memory until written.
            self.bytes = vec![0; capacity];
        }
        let cap = capacity as u64;
        let mut off = (self.head % cap) as usize;
        if off + len > capacity {
            // No answer wraps: the tail of the ring is skipped.
            self.head += cap - off as u64;
            off = 0;
        }
        let at = self.head;
        let (k, d) = self.bytes[off..off + len].split_at_mut(key.len());
        k.copy_from_slice(key);
        d.copy_from_slice(data);
        self.head += len as u64;
        Some(at)
    }

    /// The bytes written at `at`, unless written over since.
    fn get(&self, at: u64, len: usize) -> Option<&[u8]> {
        let cap = self.bytes.len() as u64;
        if cap == 0 || self.head > at + cap {
            return None;
        }
        let off = (at % cap) as usize;
        self.bytes.get(off..off + len)
    }
}

/// The answered entries of one shard, oldest first, and its ring. Found
/// through the shard's index by their tags ([`ANSWERED`] and a number).
#[derive(Debug, Default)]
pub(crate) struct Answers {
    entries: VecDeque<Answer>,
    /// The number of `entries[0]`.
    first: u32,
    ring: Ring,
}

impl Answers {
    /// Room for `n` entries without growing.
    pub(crate) fn with_capacity(n: usize) -> Answers {
        Answers {
            entries: VecDeque::with_capacity(n),
            ..Answers::default()
        }
    }

    #[inline]
    fn get(&self, tag: u32) -> Option<&Answer> {
        if tag & ANSWERED == 0 {
            return None;
        }
        let i = (tag & NUMBER).wrapping_sub(self.first) & NUMBER;
        self.entries.get(i as usize)
    }

    /// The key hash of the entry tagged `tag`, if it is still held.
    #[inline]
    pub(crate) fn hash(&self, tag: u32) -> Option<u64> {
        self.get(tag).map(|a| a.hash)
    }

    /// The fingerprint of the entry tagged `tag`, if it is still held.
    #[inline]
    pub(crate) fn fingerprint(&self, tag: u32) -> Option<u64> {
        self.get(tag).map(|a| a.fingerprint)
    }

    /// Whether `tag` names an entry still held, of a key hashed `hash`.
    #[inline]
    pub(crate) fn holds(&self, tag: u32, hash: u64) -> bool {
        self.hash(tag) == Some(hash)
    }

    /// A new answered entry (nothing to replay yet), in the index's
    /// `bucket`; its tag. The caller took its place
    /// ([`Keeping::count_kept`]).
    pub(crate) fn push(&mut self, hash: u64, fingerprint: u64, at: Instant, bucket: usize) -> u32 {
        let tag = ANSWERED | (self.first.wrapping_add(self.entries.len() as u32) & NUMBER);
        self.entries.push_back(Answer {
            hash,
            fingerprint,
            at,
            ring_at: 0,
            len: 0,
            bucket: u32::try_from(bucket).unwrap_or(u32::MAX),
            key_len: 0,
            replayed: false,
        });
        tag
    }

    /// The index's bucket of the entry tagged `tag`, found without a
    /// probe when the index has not grown since it was put there; else
    /// found by its hash.
    pub(crate) fn bucket(&self, index: &HashTable<u32>, tag: u32) -> Option<usize> {
        let a = self.get(tag)?;
        let at = a.bucket as usize;
        if index.get_bucket(at) == Some(&tag) {
            return Some(at);
        }
        index.find_bucket_index(a.hash, |&v| v == tag)
    }

    fn get_mut(&mut self, tag: u32) -> Option<&mut Answer> {
        if tag & ANSWERED == 0 {
            return None;
        }
        let i = (tag & NUMBER).wrapping_sub(self.first) & NUMBER;
        self.entries.get_mut(i as usize)
    }

    /// Keeps `answer` (and the `key` it answers, at most 255 bytes) to
    /// replay for the entry just pushed.
    pub(crate) fn keep_last(&mut self, key: &[u8], answer: &[u8], keeping: &Keeping) {
        if keeping.ring_bytes == 0 || answer.is_empty() {
            return;
        }
        let key = if key.len() <= usize::from(u8::MAX) {
            key
        } else {
            &[]
        };
        let Some(at) = self.ring.put(key, answer, keeping.ring_bytes) else {
            keeping.counters.too_long.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if let Some(a) = self.entries.back_mut() {
            a.ring_at = at;
            // At most a quarter of the ring.
            a.len = answer.len() as u32;
            a.key_len = key.len() as u8;
        }
    }

    /// The entry tagged `tag`, of a request with `fingerprint`, has no
    /// answer to replay (any more). Whether a duplicate was sent it before.
    pub(crate) fn withhold(&mut self, tag: u32, fingerprint: u64) -> bool {
        match self.get_mut(tag).filter(|a| a.fingerprint == fingerprint) {
            Some(a) => {
                a.len = 0;
                a.replayed
            }
            None => false,
        }
    }

    /// A duplicate is being sent the answer of the entry tagged `tag`.
    pub(crate) fn mark_replayed(&mut self, tag: u32) {
        if let Some(a) = self.get_mut(tag) {
            a.replayed = true;
        }
    }

    /// What the entry tagged `tag` says of a request of `key` with
    /// `fingerprint` at `now`: `None` when it is another transaction (its
    /// fingerprint, its key where the ring kept it) or past the window.
    pub(crate) fn seen(
        &self,
        tag: u32,
        fingerprint: u64,
        key: &[u8],
        now: Instant,
        window: Duration,
    ) -> Option<Seen<'_>> {
        let a = self.get(tag)?;
        // A key seen before is nearly always another transaction: the
        // fingerprint first, the clock only for the same one.
        if a.fingerprint != fingerprint || now.saturating_duration_since(a.at) > window {
            return None;
        }
        if a.len == 0 {
            return Some(Seen::Answered);
        }
        let kept = usize::from(a.key_len);
        let Some(bytes) = self.ring.get(a.ring_at, kept + a.len as usize) else {
            return Some(Seen::Overwritten);
        };
        let (their_key, answer) = bytes.split_at(kept);
        if kept > 0 && their_key != key {
            // Another key of the same hash.
            return None;
        }
        Some(Seen::Replay(answer))
    }

    /// Forgets the entries answered more than `window` before `now`,
    /// oldest first, and takes them out of `index` (where it still has
    /// them). Returns how many went.
    pub(crate) fn expire(
        &mut self,
        now: Instant,
        window: Duration,
        index: &mut HashTable<u32>,
    ) -> usize {
        let mut gone = 0;
        while let Some(a) = self.entries.front() {
            if now.saturating_duration_since(a.at) <= window {
                break;
            }
            self.forget_first(index);
            gone += 1;
        }
        gone
    }

    /// Forgets the oldest entries until `keep` are left, and takes them out
    /// of `index`. Returns how many went.
    pub(crate) fn forget_oldest(&mut self, keep: usize, index: &mut HashTable<u32>) -> usize {
        let gone = self.entries.len().saturating_sub(keep);
        for _ in 0..gone {
            self.forget_first(index);
        }
        gone
    }

    /// Forgets the oldest entry (there is one), and takes it out of `index`
    /// where it still has it.
    fn forget_first(&mut self, index: &mut HashTable<u32>) {
        let tag = ANSWERED | self.first;
        if let Some(bucket) = self.bucket(index, tag)
            && let Ok(e) = index.get_bucket_entry(bucket)
        {
            e.remove();
        }
        self.entries.pop_front();
        self.first = self.first.wrapping_add(1) & NUMBER;
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// What a request is known by for its duplicates
/// ([`DuplicateBook::fingerprint`]), and how a correlation table keeps
/// their answers ([`Keeping`]).
#[derive(Debug)]
pub struct DuplicateBook {
    /// The fingerprint, seeded apart from a table's key hash.
    fingerprints: foldhash::fast::RandomState,
    keeping: Arc<Keeping>,
    /// The identifying fields the correlation key does not hold.
    fields: Vec<u16>,
    pub counters: Arc<DuplicateCounters>,
}

impl DuplicateBook {
    /// A book of `window` (zero: off) holding at most `capacity` requests
    /// and `replay_bytes` of answers in all (zero: duplicates are declined,
    /// never replayed).
    pub fn new(window: Duration, capacity: usize, replay_bytes: usize) -> DuplicateBook {
        let keeping = Arc::new(Keeping::new(window, capacity, replay_bytes, SHARDS));
        DuplicateBook {
            fingerprints: foldhash::fast::RandomState::default(),
            counters: Arc::clone(&keeping.counters),
            keeping,
            fields: Vec::new(),
        }
    }

    pub fn is_on(&self) -> bool {
        self.keeping.is_on()
    }

    /// How this book keeps answers, for a correlation table that keeps
    /// them in its stead ([`Shards::keeping`](crate::correlator::Shards::keeping)).
    pub fn keeping(&self) -> &Arc<Keeping> {
        &self.keeping
    }

    /// The fields that tell two requests apart beyond their correlation
    /// key (`duplicate_fields` less the key's own), set once at start.
    pub fn tell_apart_by(&mut self, fields: Vec<u16>) {
        self.fields = fields;
    }

    /// The fields [`DuplicateBook::fingerprint`] reads beside the key.
    pub fn fields(&self) -> &[u16] {
        &self.fields
    }

    /// What a request is known by in a correlation table that keeps its
    /// answers (which finds it by its whole key): the fingerprint of
    /// `parts`, the bytes of the identifying fields the key does not hold,
    /// in order (an absent field as an empty part). Each `write` folds its
    /// length in (foldhash rotates by it), so the parts need no length
    /// beside them: an empty part is a step of its own, and no two splits of
    /// the same bytes hash alike. The caller asks only with the check on
    /// ([`DuplicateBook::is_on`]).
    pub fn fingerprint<'a>(&self, parts: impl IntoIterator<Item = &'a [u8]>) -> Identity {
        let mut h = self.fingerprints.build_hasher();
        for part in parts {
            h.write(part);
        }
        Identity {
            fingerprint: h.finish() | 1,
        }
    }
}

/// What a duplicate gets, from what its answered entry says.
pub(crate) fn duplicate(seen: Seen<'_>, counters: &DuplicateCounters) -> Duplicate {
    match seen {
        Seen::Replay(bytes) => Duplicate::Replay(bytes.to_vec()),
        Seen::Answered => Duplicate::Answered,
        Seen::Overwritten => {
            counters.overwritten.fetch_add(1, Ordering::Relaxed);
            Duplicate::Answered
        }
    }
}
