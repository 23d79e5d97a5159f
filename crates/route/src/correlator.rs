//! The correlation table: which request is waiting for which response.
//!
//! Every request the switch forwards is remembered under a [`CorrelationKey`]
//! built from the fields its response echoes (TPDU address pair + F41 + F11
//! for POS, F7 + F11 + F32 + F33 for host links), with a value of the
//! caller's choosing (its origin), the connection that carried it to the node
//! (`via`), and a deadline. Each entry leaves the table exactly once:
//!
//! - [`Correlator::take`]: the response came; deliver it.
//! - [`Correlator::expire`]: the deadline passed; decline (timeout).
//! - [`Correlator::take_via`]: the connection that carried it died; decline.
//! - [`Correlator::cancel`] / [`Correlator::drain`]: the switch declines it.
//!
//! **Duplicate policy**: an in-flight key is never overwritten. Inserting it
//! again fails with [`CorrelateError::Duplicate`] and the caller declines the
//! new request ("94", duplicate transmission); the first one keeps waiting.
//! A key that is *not* in flight may be inserted again at any time (STANs wrap).
//!
//! **Answered keys** (a table that keeps answers, [`Shards::with_keeping`]):
//! a request registered with a fingerprint ([`Shards::register`]) does not
//! leave the table when it is answered, or when the switch answers it (a
//! deadline, a lost connection, a drain): its entry becomes an answered
//! one for `duplicate_window`, found by the same index under the same lock.
//! So the duplicate check of a new request is the probe that registers it,
//! and recording an answer is a change of the entry it leaves, not a second
//! table's insert (docs/integrity.md, "Duplicates";
//! [`crate::integrity::DuplicateBook`]). A request of an answered key with
//! another fingerprint (another transaction: STANs wrap) takes the key over,
//! and the answer it hid comes back if it leaves unanswered.
//!
//! **Capacity**: at `capacity` entries, insert fails with
//! [`CorrelateError::Full`] and the caller declines. The table never grows.
//!
//! **Late vs unknown**: keys that left by a switch decline (expired, node
//! lost, cancelled) are remembered for `recent_ttl`, at most
//! `recent_capacity` of them (oldest forgotten first), so a response for one
//! is classed [`Miss::Late`] (the origin already got its decline: drop it)
//! rather than [`Miss::Unknown`].
//!
//! The deadline is enforced by [`expire`](Correlator::expire) only: a response
//! that arrives after the deadline but before the sweep is still delivered
//! (the origin got no decline yet, so it is still exactly one answer).
//!
//! Costs: insert, take and cancel are O(1) (a hash map into a slab whose
//! entries are linked in deadline order); expire is O(expired); take_via is
//! O(n), as a connection dying is rare next to messages. None of them
//! allocates once the table has grown to its peak. [`Shards`] splits a
//! table into independently locked shards for the per-message path.

use std::collections::{HashMap, VecDeque};

use hashbrown::HashTable;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::integrity::duplicates::{ANSWERED, Answers, Keeping, duplicate};
use crate::integrity::{Duplicate, Identity};

/// Longest encoded key, in bytes (each part costs its length plus one).
pub const KEY_MAX: usize = 64;

/// A correlation key: length-prefixed parts, stored inline (no allocation).
#[derive(Clone, Copy)]
pub struct CorrelationKey {
    len: u8,
    bytes: [u8; KEY_MAX],
}

impl CorrelationKey {
    /// Starts a key; add parts with [`KeyBuilder::push`].
    pub fn builder() -> KeyBuilder {
        KeyBuilder {
            key: CorrelationKey {
                len: 0,
                bytes: [0; KEY_MAX],
            },
            overflow: false,
        }
    }

    /// The encoded key: each part as one length byte then its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl PartialEq for CorrelationKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for CorrelationKey {}

impl Hash for CorrelationKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl fmt::Debug for CorrelationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Parts joined by `|`. Keys hold routing fields (ids, STAN, dates),
        // never card data, so they may be shown.
        f.write_str("CorrelationKey(")?;
        let mut rest = self.as_bytes();
        let mut first = true;
        while let Some((&n, tail)) = rest.split_first() {
            let n = usize::from(n).min(tail.len());
            if !first {
                f.write_str("|")?;
            }
            write!(f, "{}", tail[..n].escape_ascii())?;
            rest = &tail[n..];
            first = false;
        }
        f.write_str(")")
    }
}

/// Builds a [`CorrelationKey`] part by part. Each part is length-prefixed, so
/// `("12", "3")` and `("1", "23")` are different keys.
#[derive(Clone, Copy, Debug)]
pub struct KeyBuilder {
    key: CorrelationKey,
    overflow: bool,
}

/// The parts do not fit in [`KEY_MAX`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[error("correlation key parts exceed {KEY_MAX} bytes")]
pub struct KeyTooLong;

impl KeyBuilder {
    /// Appends one part (may be empty, e.g. an absent optional field).
    pub fn push(mut self, part: &[u8]) -> Self {
        self.append(part);
        self
    }

    /// [`KeyBuilder::push`] in place: the per-request key is built where it
    /// lies instead of moving its 66 bytes once per part.
    #[inline]
    pub fn append(&mut self, part: &[u8]) {
        let at = usize::from(self.key.len);
        let end = at + 1 + part.len();
        if self.overflow || end > KEY_MAX {
            self.overflow = true;
            return;
        }
        // end <= 64, so part.len() < 64 fits a byte.
        self.key.bytes[at] = part.len() as u8;
        self.key.bytes[at + 1..end].copy_from_slice(part);
        self.key.len = end as u8;
    }

    pub fn build(self) -> Result<CorrelationKey, KeyTooLong> {
        if self.overflow {
            Err(KeyTooLong)
        } else {
            Ok(self.key)
        }
    }
}

/// Settings of a correlation table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CorrelatorConfig {
    /// Most requests in flight at once.
    pub capacity: usize,
    /// Most recently declined keys remembered (0: classify every miss Unknown).
    pub recent_capacity: usize,
    /// How long a declined key is remembered.
    #[serde(with = "super::duration")]
    pub recent_ttl: Duration,
}

impl Default for CorrelatorConfig {
    fn default() -> Self {
        Self {
            capacity: 65_536,
            recent_capacity: 65_536,
            recent_ttl: Duration::from_secs(120),
        }
    }
}

/// Why an insert was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum CorrelateError {
    /// The key is already in flight; the new request must be declined ("94").
    #[error("duplicate key in flight")]
    Duplicate,
    /// The table is at capacity; the new request must be declined.
    #[error("correlation table full")]
    Full,
}

/// A refused insert gives the value back so the caller can decline with it.
#[derive(Debug, PartialEq, Eq)]
pub struct Rejected<V> {
    pub error: CorrelateError,
    pub value: V,
}

/// A response whose key is not in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// The request was declined by the switch recently: drop the response.
    Late,
    /// Never seen, or declined too long ago to remember.
    Unknown,
}

/// Counters since the table was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CorrelatorStats {
    pub inserted: u64,
    pub answered: u64,
    pub expired: u64,
    /// Left by [`Correlator::take_via`].
    pub node_lost: u64,
    /// Left by [`Correlator::cancel`] or [`Correlator::drain`].
    pub cancelled: u64,
    pub duplicates: u64,
    pub full: u64,
    pub late: u64,
    pub unknown: u64,
}

/// One request in flight: a slab slot, linked into the table's deadline
/// list (earliest first) by slot index.
#[derive(Debug)]
struct Entry<V> {
    key: CorrelationKey,
    value: V,
    via: u64,
    deadline: Instant,
    prev: u32,
    next: u32,
    /// What its answer is kept under for duplicates; 0: not kept.
    fingerprint: u64,
    /// The tag of the answered entry of the same key this request took
    /// the index's place of (another transaction); 0: none.
    hid: u32,
}

/// "No slot" in the deadline list's links.
const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct Recent {
    until: Instant,
    seq: u64,
    key: CorrelationKey,
}

/// A bounded table of requests in flight (and, keeping answers, of the
/// keys answered within `duplicate_window`). See the module doc.
///
/// Entries live in a slab (a `Vec` of slots with a free list) indexed by a
/// hash map from key to slot, and are linked in deadline order. Deadlines
/// come from one service timeout, so they arrive in order and an insert links
/// at the tail in O(1) (an earlier deadline, after a reload shortened the
/// timeout or for a health check, walks back from the tail). Once the slab
/// and map have grown to the peak in flight, insert, take and expire
/// allocate nothing.
#[derive(Debug)]
pub struct Correlator<V> {
    cfg: CorrelatorConfig,
    /// Slots by their key's hash; the key itself lives once, in the slab.
    /// Hashed with `hasher`, which a sharded table shares across its shards
    /// so a key is hashed once per operation (the shard and the slot). An
    /// answered key's value is its tag in `answers` (the [`ANSWERED`] bit
    /// set, above every slot number).
    index: HashTable<u32>,
    hasher: KeyHasher,
    slab: Vec<Option<Entry<V>>>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
    /// Recently declined keys → (remembered until, seq of their record).
    recent: HashMap<CorrelationKey, (Instant, u64), KeyHasher>,
    /// The same records in the order they were made (= order of `until`).
    recent_order: VecDeque<Recent>,
    seq: u64,
    stats: CorrelatorStats,
    scratch: Vec<u32>,
    /// The answered keys, oldest first, and their answers to replay.
    answers: Answers,
    /// How answers are kept (shared by a sharded table's shards); none:
    /// a request leaves the table with its answer.
    keeping: Option<Arc<Keeping>>,
}

/// Keys are hashed with foldhash: fast on short byte strings, and seeded per
/// process, so a peer cannot aim keys at one bucket.
pub type KeyHasher = foldhash::fast::RandomState;

/// The hash of the key in `slot` (or of the answered key tagged so), for
/// the index to move it when it grows.
fn rehash<V>(slab: &[Option<Entry<V>>], answers: &Answers, hasher: &KeyHasher, slot: u32) -> u64 {
    use std::hash::BuildHasher;
    if slot & ANSWERED != 0 {
        return answers.hash(slot).unwrap_or(0);
    }
    slab.get(slot as usize)
        .and_then(Option::as_ref)
        .map_or(0, |e| hasher.hash_one(e.key))
}

/// What the index keeps for a request leaving the table, `bucket` its
/// entry: the key answered (its tag, returned), when the answer is
/// `kept` and the request has a fingerprint and there is room; else the
/// answered entry the request had hidden, if still held; else nothing.
#[allow(clippy::too_many_arguments)]
fn settle(
    mut bucket: hashbrown::hash_table::OccupiedEntry<'_, u32>,
    (fingerprint, hid): (u64, u32),
    answers: &mut Answers,
    keeping: Option<&Keeping>,
    hash: u64,
    now: Instant,
    kept: bool,
) -> Option<u32> {
    // A fingerprint is only made with the check on.
    if kept
        && fingerprint != 0
        && let Some(k) = keeping
        && k.take_place()
    {
        let tag = answers.push(hash, fingerprint, now, bucket.bucket_index());
        *bucket.get_mut() = tag;
        return Some(tag);
    }
    if hid != 0 && answers.holds(hid, hash) {
        *bucket.get_mut() = hid;
    } else {
        bucket.remove();
    }
    None
}

/// Capacity reserved up front; beyond it the maps grow on demand.
const PREALLOCATE_MAX: usize = 1 << 16;

impl<V> Correlator<V> {
    pub fn new(cfg: CorrelatorConfig) -> Self {
        Self::with_reserve(
            cfg,
            cfg.capacity.min(PREALLOCATE_MAX),
            cfg.recent_capacity.min(PREALLOCATE_MAX),
            KeyHasher::default(),
            None,
        )
    }

    /// A table that reserves room for `pre` entries and `recent_pre`
    /// recently declined keys up front (a shard reserves its share), and
    /// its share of the answers `keeping` holds.
    fn with_reserve(
        cfg: CorrelatorConfig,
        pre: usize,
        recent_pre: usize,
        hasher: KeyHasher,
        keeping: Option<Arc<Keeping>>,
    ) -> Self {
        let answers_pre = keeping
            .as_deref()
            .filter(|k| k.is_on())
            .map_or(0, |k| k.capacity().min(PREALLOCATE_MAX).div_ceil(SHARDS));
        Self {
            cfg,
            index: HashTable::with_capacity(pre + answers_pre),
            hasher,
            slab: Vec::with_capacity(pre),
            free: Vec::with_capacity(pre),
            head: NIL,
            tail: NIL,
            recent: HashMap::with_capacity_and_hasher(recent_pre, KeyHasher::default()),
            recent_order: VecDeque::with_capacity(recent_pre),
            seq: 0,
            stats: CorrelatorStats::default(),
            scratch: Vec::new(),
            answers: Answers::with_capacity(answers_pre),
            keeping,
        }
    }

    pub fn config(&self) -> &CorrelatorConfig {
        &self.cfg
    }

    /// New limits (config reload). Entries already in flight are kept even
    /// if they exceed a lower capacity; new ones wait until there is room.
    pub fn set_config(&mut self, cfg: CorrelatorConfig) {
        self.cfg = cfg;
        while self.recent_order.len() > cfg.recent_capacity {
            self.forget_oldest_recent();
        }
    }

    /// Requests in flight.
    pub fn len(&self) -> usize {
        self.slab.len() - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Answered keys held for duplicates.
    pub fn answered(&self) -> usize {
        self.answers.len()
    }

    pub fn stats(&self) -> CorrelatorStats {
        self.stats
    }

    pub fn contains(&self, key: &CorrelationKey) -> bool {
        self.find(self.hash(key), key).is_some()
    }

    /// The connection an in-flight request went out on.
    pub fn via(&self, key: &CorrelationKey) -> Option<u64> {
        let slot = self.find(self.hash(key), key)?;
        self.entry(slot).map(|e| e.via)
    }

    fn hash(&self, key: &CorrelationKey) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(key)
    }

    /// The slot holding `key` in flight, whose hash is `hash`.
    fn find(&self, hash: u64, key: &CorrelationKey) -> Option<u32> {
        let slab = &self.slab;
        self.index
            .find(hash, |&slot| holds(slab, slot, key))
            .copied()
    }

    /// The slot holding `key` in flight, else the tag of its answered
    /// entry (a key hashed `hash`): in one probe, the request in flight
    /// first (an answered entry is known by its hash alone, so another key
    /// of the same hash may have one).
    #[inline]
    fn find_any(&self, hash: u64, key: &CorrelationKey) -> (Option<u32>, Option<u32>) {
        let (slab, answers) = (&self.slab, &self.answers);
        let mut answered = None;
        let slot = self
            .index
            .find(hash, |&v| {
                if v & ANSWERED == 0 {
                    return holds(slab, v, key);
                }
                if answered.is_none() && answers.holds(v, hash) {
                    answered = Some(v);
                }
                false
            })
            .copied();
        (slot, answered)
    }

    /// What the table knows of a request of `key` (hashed `hash`) known as
    /// `id`, answered within the window: the answered entry of its key, or
    /// the one a request of another transaction in flight hid.
    /// A replayed answer is marked so, under the same lock: an answer
    /// withheld later (its first sender gone) is known to have reached a
    /// terminal all the same ([`Shards::withhold`]).
    fn seen_hashed(
        &mut self,
        hash: u64,
        key: &CorrelationKey,
        id: Identity,
        now: Instant,
    ) -> Option<Duplicate> {
        let k = self.keeping.as_deref()?;
        if id.is_none() || !k.is_on() {
            return None;
        }
        let tag = self.answered_tag(hash, key)?;
        let seen = self
            .answers
            .seen(tag, id.fingerprint(), key.as_bytes(), now, k.window())?;
        let seen = duplicate(seen, &k.counters);
        if matches!(seen, Duplicate::Replay(_)) {
            self.answers.mark_replayed(tag);
        }
        Some(seen)
    }

    /// Lets `f` change the value of the request in flight under `key`;
    /// `None` when there is none.
    pub fn with_mut<R>(&mut self, key: &CorrelationKey, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let hash = self.hash(key);
        self.with_mut_hashed(hash, key, f)
    }

    fn with_mut_hashed<R>(
        &mut self,
        hash: u64,
        key: &CorrelationKey,
        f: impl FnOnce(&mut V) -> R,
    ) -> Option<R> {
        let slot = self.find(hash, key)?;
        let entry = self.slab.get_mut(slot as usize)?.as_mut()?;
        Some(f(&mut entry.value))
    }

    /// The earliest deadline in the table: when to call [`expire`](Self::expire) next.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.entry(self.head).map(|e| e.deadline)
    }

    /// Remembers a request sent on connection `via`, to be answered by
    /// `deadline`. Refuses an in-flight key ([`CorrelateError::Duplicate`],
    /// checked first) and a full table ([`CorrelateError::Full`]), giving the
    /// value back.
    pub fn insert(
        &mut self,
        key: CorrelationKey,
        value: V,
        via: u64,
        deadline: Instant,
    ) -> Result<(), Rejected<V>> {
        self.register(key, (Identity::NONE, None), value, via, deadline)
    }

    /// [`Correlator::insert`] of a request known as `id` for duplicates,
    /// whose answer the table keeps (a table that keeps answers). With
    /// `look` (the time now), the same transaction answered within the
    /// window is refused too, as [`CorrelateError::Duplicate`]:
    /// [`Shards::seen`] says what it gets.
    fn register(
        &mut self,
        key: CorrelationKey,
        (id, look): (Identity, Option<Instant>),
        value: V,
        via: u64,
        deadline: Instant,
    ) -> Result<(), Rejected<V>> {
        let hash = self.hash(&key);
        let entry = (key, id.fingerprint(), look);
        self.insert_if(hash, entry, value, via, deadline, |table| {
            table.len() < table.cfg.capacity
        })
    }

    /// [`Correlator::register`], with the capacity decided by `room`,
    /// asked once the key is known not to be in flight (a sharded table
    /// counts its capacity across shards).
    fn insert_if(
        &mut self,
        hash: u64,
        (key, fingerprint, look): (CorrelationKey, u64, Option<Instant>),
        value: V,
        via: u64,
        deadline: Instant,
        room: impl FnOnce(&Self) -> bool,
    ) -> Result<(), Rejected<V>> {
        let (in_flight, answered) = self.find_any(hash, &key);
        let same = |tag| {
            let now = look?;
            // Nearly always another transaction (STANs wrap): told by the
            // fingerprint alone.
            if fingerprint == 0 || self.answers.fingerprint(tag) != Some(fingerprint) {
                return None;
            }
            let window = self.keeping.as_deref()?.window();
            self.answers
                .seen(tag, fingerprint, key.as_bytes(), now, window)
        };
        if in_flight.is_some() || answered.and_then(same).is_some() {
            self.stats.duplicates += 1;
            return Err(Rejected {
                error: CorrelateError::Duplicate,
                value,
            });
        }
        if self.slab.len() >= ANSWERED as usize || !room(self) {
            self.stats.full += 1;
            return Err(Rejected {
                error: CorrelateError::Full,
                value,
            });
        }
        let entry = Entry {
            key,
            value,
            via,
            deadline,
            prev: NIL,
            next: NIL,
            fingerprint,
            hid: answered.unwrap_or(0),
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slab[slot as usize] = Some(entry);
                slot
            }
            None => {
                self.slab.push(Some(entry));
                (self.slab.len() - 1) as u32
            }
        };
        self.link_by_deadline(slot, deadline);
        // The key's answered entry (another transaction's) gives its
        // place up, and comes back if this one leaves unanswered.
        let hid = answered.and_then(|tag| self.answers.bucket(&self.index, tag));
        match hid.and_then(|bucket| self.index.get_bucket_mut(bucket)) {
            Some(v) => *v = slot,
            None => {
                let (slab, answers, hasher) = (&self.slab, &self.answers, &self.hasher);
                self.index
                    .insert_unique(hash, slot, |&s| rehash(slab, answers, hasher, s));
            }
        }
        self.stats.inserted += 1;
        Ok(())
    }

    /// A response arrived for `key`: removes and returns its request's value,
    /// or says whether the key is [`Miss::Late`] or [`Miss::Unknown`].
    pub fn take(&mut self, key: &CorrelationKey, now: Instant) -> Result<V, Miss> {
        self.take_hashed(self.hash(key), key, now)
    }

    fn take_hashed(&mut self, hash: u64, key: &CorrelationKey, now: Instant) -> Result<V, Miss> {
        self.take_answered(hash, key, &[], now)
    }

    /// [`Correlator::take`] in one probe, of a request answered `answer`
    /// (empty: nothing to replay): with a fingerprint, it leaves its key
    /// answered, and the answer kept to replay.
    fn take_answered(
        &mut self,
        hash: u64,
        key: &CorrelationKey,
        answer: &[u8],
        now: Instant,
    ) -> Result<V, Miss> {
        let slab = &self.slab;
        if let Ok(bucket) = self.index.find_entry(hash, |&slot| holds(slab, slot, key)) {
            let slot = *bucket.get();
            let taken = self.slab.get_mut(slot as usize).and_then(Option::take);
            let Some(e) = taken else {
                // Not so: `holds` found it in the slab.
                bucket.remove();
                return Err(Miss::Unknown);
            };
            let keeping = self.keeping.as_deref();
            let ids = (e.fingerprint, e.hid);
            let tag = settle(bucket, ids, &mut self.answers, keeping, hash, now, true);
            if let (Some(_), Some(k)) = (tag, keeping) {
                self.answers.keep_last(key.as_bytes(), answer, k);
            }
            self.unlink(&e);
            self.free.push(slot);
            self.stats.answered += 1;
            return Ok(e.value);
        }
        match self.recent.get(key) {
            Some(&(until, _)) if now < until => {
                self.stats.late += 1;
                Err(Miss::Late)
            }
            _ => {
                self.stats.unknown += 1;
                Err(Miss::Unknown)
            }
        }
    }

    /// The switch declines `key` itself (e.g. its origin went away, or a
    /// node was disabled): removes it and remembers it as recently declined.
    pub fn cancel(&mut self, key: &CorrelationKey, now: Instant) -> Option<V> {
        self.cancel_hashed(self.hash(key), key, now)
    }

    fn cancel_hashed(&mut self, hash: u64, key: &CorrelationKey, now: Instant) -> Option<V> {
        let slot = self.find(hash, key)?;
        let value = self.leave(hash, slot, false, now)?.value;
        self.stats.cancelled += 1;
        self.remember(*key, now);
        Some(value)
    }

    /// Moves every entry whose deadline is at or before `now` to `out`,
    /// earliest deadline first (ties in insertion order). Returns how many.
    /// Keys answered longer ago than the window are forgotten too.
    pub fn expire(&mut self, now: Instant, out: &mut Vec<(CorrelationKey, V)>) -> usize {
        self.purge_recent(now);
        self.forget_answers(now);
        let mut n = 0;
        while self.entry(self.head).is_some_and(|e| e.deadline <= now) {
            let Some(e) = self.remove_slot(self.head, now) else {
                break;
            };
            out.push((e.key, e.value));
            self.stats.expired += 1;
            self.remember(e.key, now);
            n += 1;
        }
        n
    }

    /// Moves every entry carried by connection `via` (which died) to `out`,
    /// earliest deadline first. Returns how many.
    pub fn take_via(
        &mut self,
        via: u64,
        now: Instant,
        out: &mut Vec<(CorrelationKey, V)>,
    ) -> usize {
        // Walking the deadline list gives the caller a deterministic order:
        // by deadline, then age.
        let mut slots = std::mem::take(&mut self.scratch);
        slots.clear();
        let mut at = self.head;
        while let Some(e) = self.entry(at) {
            if e.via == via {
                slots.push(at);
            }
            at = e.next;
        }
        for &slot in &slots {
            if let Some(e) = self.remove_slot(slot, now) {
                out.push((e.key, e.value));
                self.stats.node_lost += 1;
                self.remember(e.key, now);
            }
        }
        let n = slots.len();
        self.scratch = slots;
        n
    }

    /// Moves every entry to `out` (shutdown), earliest deadline first.
    pub fn drain(&mut self, now: Instant, out: &mut Vec<(CorrelationKey, V)>) -> usize {
        let mut n = 0;
        while let Some(e) = self.remove_slot(self.head, now) {
            out.push((e.key, e.value));
            self.stats.cancelled += 1;
            self.remember(e.key, now);
            n += 1;
        }
        n
    }

    fn next_seq(&mut self) -> u64 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn entry(&self, slot: u32) -> Option<&Entry<V>> {
        self.slab.get(slot as usize).and_then(Option::as_ref)
    }

    fn entry_mut(&mut self, slot: u32) -> Option<&mut Entry<V>> {
        self.slab.get_mut(slot as usize).and_then(Option::as_mut)
    }

    /// Links `slot` after the last entry whose deadline is not later than
    /// `deadline` (ties keep insertion order).
    fn link_by_deadline(&mut self, slot: u32, deadline: Instant) {
        let mut after = self.tail;
        while let Some(e) = self.entry(after) {
            if e.deadline <= deadline {
                break;
            }
            after = e.prev;
        }
        let next = match self.entry_mut(after) {
            Some(prev) => std::mem::replace(&mut prev.next, slot),
            None => std::mem::replace(&mut self.head, slot),
        };
        match self.entry_mut(next) {
            Some(n) => n.prev = slot,
            None => self.tail = slot,
        }
        if let Some(e) = self.entry_mut(slot) {
            e.prev = after;
            e.next = next;
        }
    }

    /// Unlinks and frees `slot`, the switch answering it: its key is left
    /// answered when it has a fingerprint (a duplicate is declined).
    fn remove_slot(&mut self, slot: u32, now: Instant) -> Option<Entry<V>> {
        let hash = self.hash(&self.entry(slot)?.key);
        self.leave(hash, slot, true, now)
    }

    /// Unlinks and frees `slot`, of a key hashed `hash`: its key answered
    /// when `kept` (see [`settle`]), else forgotten.
    fn leave(&mut self, hash: u64, slot: u32, kept: bool, now: Instant) -> Option<Entry<V>> {
        let e = self.slab.get_mut(slot as usize)?.take()?;
        self.unlink(&e);
        if let Ok(bucket) = self.index.find_entry(hash, |&s| s == slot) {
            let keeping = self.keeping.as_deref();
            let ids = (e.fingerprint, e.hid);
            settle(bucket, ids, &mut self.answers, keeping, hash, now, kept);
        }
        self.free.push(slot);
        Some(e)
    }

    /// Takes `e`, just out of its slot, out of the deadline list.
    fn unlink(&mut self, e: &Entry<V>) {
        match self.entry_mut(e.prev) {
            Some(p) => p.next = e.next,
            None => self.head = e.next,
        }
        match self.entry_mut(e.next) {
            Some(n) => n.prev = e.prev,
            None => self.tail = e.prev,
        }
    }

    /// Forgets the keys answered longer ago than the window.
    fn forget_answers(&mut self, now: Instant) {
        let Some(k) = self.keeping.as_deref() else {
            return;
        };
        let gone = self.answers.expire(now, k.window(), &mut self.index);
        k.give_back(gone);
    }

    /// The tag of the answered entry of `key` (hashed `hash`): its own,
    /// or the one a request of another transaction in flight hid.
    fn answered_tag(&self, hash: u64, key: &CorrelationKey) -> Option<u32> {
        match self.find_any(hash, key) {
            (Some(slot), _) => Some(self.entry(slot)?.hid).filter(|&t| t != 0),
            (None, answered) => answered,
        }
    }

    /// The answer kept for the request of `key` known as `id` is not to
    /// be replayed: its sender never got it.
    /// Whether a duplicate was sent it before.
    fn withhold_hashed(&mut self, hash: u64, key: &CorrelationKey, id: Identity) -> bool {
        self.answered_tag(hash, key)
            .is_some_and(|tag| self.answers.withhold(tag, id.fingerprint()))
    }

    fn remember(&mut self, key: CorrelationKey, now: Instant) {
        if self.cfg.recent_capacity == 0 {
            return;
        }
        self.purge_recent(now);
        while self.recent_order.len() >= self.cfg.recent_capacity {
            self.forget_oldest_recent();
        }
        let until = now.checked_add(self.cfg.recent_ttl).unwrap_or(now);
        let seq = self.next_seq();
        self.recent.insert(key, (until, seq));
        self.recent_order.push_back(Recent { until, seq, key });
    }

    fn purge_recent(&mut self, now: Instant) {
        while self.recent_order.front().is_some_and(|r| r.until <= now) {
            self.forget_oldest_recent();
        }
    }

    fn forget_oldest_recent(&mut self) {
        if let Some(r) = self.recent_order.pop_front() {
            // Only if no newer record of the same key replaced this one.
            if self
                .recent
                .get(&r.key)
                .is_some_and(|&(_, seq)| seq == r.seq)
            {
                self.recent.remove(&r.key);
            }
        }
    }
}

/// Whether `slot` is a request in flight of `key` (an answered key's tag
/// is above every slot: it is no slot of the slab).
fn holds<V>(slab: &[Option<Entry<V>>], slot: u32, key: &CorrelationKey) -> bool {
    slab.get(slot as usize)
        .and_then(Option::as_ref)
        .is_some_and(|e| e.key == *key)
}

/// A correlation table split into shards, each a [`Correlator`] under its own
/// lock, picked by the key's hash: requests on different shards never wait
/// for each other, and no lock is held for more than one table operation.
/// The capacity is the service's, shared by all shards (an atomic count);
/// each shard remembers its share of recently declined keys.
#[derive(Debug)]
pub struct Shards<V> {
    shards: Box<[std::sync::Mutex<Correlator<V>>]>,
    hasher: KeyHasher,
    in_flight: AtomicUsize,
    capacity: AtomicUsize,
    keeping: Option<Arc<Keeping>>,
}

/// Shards per table: a power of two, several per core of the machines this
/// runs on, so two workers rarely meet on one lock.
pub const SHARDS: usize = 16;

impl<V> Shards<V> {
    pub fn new(cfg: CorrelatorConfig) -> Self {
        Self::with(cfg, None)
    }

    /// A table that keeps answers as `keeping` says: each shard its share
    /// of the answered keys and of the ring (see the module doc).
    pub fn with_keeping(cfg: CorrelatorConfig, keeping: Arc<Keeping>) -> Self {
        Self::with(cfg, Some(keeping))
    }

    fn with(cfg: CorrelatorConfig, keeping: Option<Arc<Keeping>>) -> Self {
        // Each shard reserves its share of the table, not all of it.
        let pre = cfg.capacity.min(PREALLOCATE_MAX).div_ceil(SHARDS);
        let recent_pre = cfg.recent_capacity.min(PREALLOCATE_MAX).div_ceil(SHARDS);
        let hasher = KeyHasher::default();
        let shards = (0..SHARDS)
            .map(|_| {
                let shard = Correlator::with_reserve(
                    Self::shard_config(cfg),
                    pre,
                    recent_pre,
                    hasher.clone(),
                    keeping.clone(),
                );
                std::sync::Mutex::new(shard)
            })
            .collect();
        Self {
            shards,
            hasher,
            in_flight: AtomicUsize::new(0),
            capacity: AtomicUsize::new(cfg.capacity),
            keeping,
        }
    }

    /// How the table keeps answers; none: it does not.
    pub fn keeping(&self) -> Option<&Arc<Keeping>> {
        self.keeping.as_ref()
    }

    /// A shard's own settings: capacity is enforced across shards, so each
    /// shard may hold all of it; the recent set is split.
    fn shard_config(cfg: CorrelatorConfig) -> CorrelatorConfig {
        CorrelatorConfig {
            capacity: cfg.capacity,
            recent_capacity: cfg.recent_capacity.div_ceil(SHARDS),
            recent_ttl: cfg.recent_ttl,
        }
    }

    /// The shard of `key`, and the key's hash, which the shard's index
    /// uses too (the shards share the hasher): one hash per operation.
    fn shard(&self, key: &CorrelationKey) -> (std::sync::MutexGuard<'_, Correlator<V>>, u64) {
        use std::hash::BuildHasher;
        let hash = self.hasher.hash_one(key);
        (self.shard_of(hash), hash)
    }

    /// The shard of a key hashed `hash`, locked.
    fn shard_of(&self, hash: u64) -> std::sync::MutexGuard<'_, Correlator<V>> {
        // Bits the shard's index leaves alone pick the shard: hashbrown takes
        // buckets from the low bits and its tags from the top seven.
        let i = (hash >> 40) as usize & (SHARDS - 1);
        lock(&self.shards[i])
    }

    /// New limits (config reload); see [`Correlator::set_config`].
    pub fn set_config(&self, cfg: CorrelatorConfig) {
        self.capacity.store(cfg.capacity, Ordering::Relaxed);
        for s in &self.shards {
            lock(s).set_config(Self::shard_config(cfg));
        }
    }

    /// Requests in flight.
    pub fn len(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shards' counters, summed.
    pub fn stats(&self) -> CorrelatorStats {
        self.shards
            .iter()
            .fold(CorrelatorStats::default(), |acc, s| {
                let s = lock(s).stats();
                CorrelatorStats {
                    inserted: acc.inserted + s.inserted,
                    answered: acc.answered + s.answered,
                    expired: acc.expired + s.expired,
                    node_lost: acc.node_lost + s.node_lost,
                    cancelled: acc.cancelled + s.cancelled,
                    duplicates: acc.duplicates + s.duplicates,
                    full: acc.full + s.full,
                    late: acc.late + s.late,
                    unknown: acc.unknown + s.unknown,
                }
            })
    }

    /// See [`Correlator::insert`]; the capacity counts every shard.
    pub fn insert(
        &self,
        key: CorrelationKey,
        value: V,
        via: u64,
        deadline: Instant,
    ) -> Result<(), Rejected<V>> {
        self.register(key, (Identity::NONE, None), value, via, deadline)
    }

    /// See [`Correlator::register`]: one hash, one lock and one probe for
    /// the request in flight, its key's answer within the window (with
    /// `look`, the time now) and its place. The capacity counts every
    /// shard.
    pub fn register(
        &self,
        key: CorrelationKey,
        (id, look): (Identity, Option<Instant>),
        value: V,
        via: u64,
        deadline: Instant,
    ) -> Result<(), Rejected<V>> {
        let cap = self.capacity.load(Ordering::Relaxed);
        let (mut shard, hash) = self.shard(&key);
        let entry = (key, id.fingerprint(), look);
        shard.insert_if(hash, entry, value, via, deadline, |_| {
            // Taken here, under the shard's lock, once the key is known new;
            // given back by whatever takes the entry out.
            if self.in_flight.fetch_add(1, Ordering::AcqRel) < cap {
                return true;
            }
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            false
        })
    }

    /// See [`Correlator::with_mut`].
    pub fn with_mut<R>(&self, key: &CorrelationKey, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let (mut shard, hash) = self.shard(key);
        shard.with_mut_hashed(hash, key, f)
    }

    /// See [`Correlator::take`].
    pub fn take(&self, key: &CorrelationKey, now: Instant) -> Result<V, Miss> {
        self.take_answered(key, &[], now)
    }

    /// [`Shards::take`] of a request answered `answer`: a request
    /// registered with a fingerprint leaves its key answered, and the
    /// answer is kept to replay to its duplicates, in the same lock (when
    /// the ring can hold it: else they are declined 94). An answer its
    /// sender does not get is withheld right after ([`Shards::withhold`]).
    pub fn take_answered(
        &self,
        key: &CorrelationKey,
        answer: &[u8],
        now: Instant,
    ) -> Result<V, Miss> {
        let (mut shard, hash) = self.shard(key);
        let taken = shard.take_answered(hash, key, answer, now);
        drop(shard);
        if taken.is_ok() {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        taken
    }

    /// The answer kept for the request of `key` known as `id` is never
    /// replayed: its sender did not get it (the client gone, its queue
    /// full, its socket closing). Its duplicates are declined 94. Returns
    /// whether a duplicate was sent it first (from another connection, in
    /// the moment between the answer's take and this): then a terminal has
    /// the answer, and the caller must not treat it as undelivered.
    pub fn withhold(&self, key: &CorrelationKey, id: Identity) -> bool {
        let (mut shard, hash) = self.shard(key);
        shard.withhold_hashed(hash, key, id)
    }

    /// What a request of `key` known as `id` gets as a duplicate: the
    /// answer of the same transaction within the window (its key answered,
    /// or hidden by another transaction of the key in flight); `None`: it
    /// is no duplicate.
    pub fn seen(&self, key: &CorrelationKey, id: Identity, now: Instant) -> Option<Duplicate> {
        let (mut shard, hash) = self.shard(key);
        shard.seen_hashed(hash, key, id, now)
    }

    /// Answered keys held for duplicates.
    pub fn answered(&self) -> usize {
        self.keeping.as_deref().map_or(0, Keeping::held)
    }

    /// See [`Correlator::cancel`].
    pub fn cancel(&self, key: &CorrelationKey, now: Instant) -> Option<V> {
        let (mut shard, hash) = self.shard(key);
        let taken = shard.cancel_hashed(hash, key, now);
        drop(shard);
        if taken.is_some() {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        taken
    }

    /// See [`Correlator::expire`]: shard by shard, each in deadline order.
    pub fn expire(&self, now: Instant, out: &mut Vec<(CorrelationKey, V)>) -> usize {
        self.each(out, |s, out| s.expire(now, out))
    }

    /// See [`Correlator::take_via`].
    pub fn take_via(&self, via: u64, now: Instant, out: &mut Vec<(CorrelationKey, V)>) -> usize {
        self.each(out, |s, out| s.take_via(via, now, out))
    }

    /// See [`Correlator::drain`].
    pub fn drain(&self, now: Instant, out: &mut Vec<(CorrelationKey, V)>) -> usize {
        self.each(out, |s, out| s.drain(now, out))
    }

    /// The earliest deadline of any shard.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.shards
            .iter()
            .filter_map(|s| lock(s).next_deadline())
            .min()
    }

    fn each(
        &self,
        out: &mut Vec<(CorrelationKey, V)>,
        mut f: impl FnMut(&mut Correlator<V>, &mut Vec<(CorrelationKey, V)>) -> usize,
    ) -> usize {
        let mut n = 0;
        for s in &self.shards {
            n += f(&mut lock(s), out);
        }
        self.in_flight.fetch_sub(n, Ordering::AcqRel);
        n
    }
}

/// A poisoned shard is still consistent: every operation on it completes or
/// does nothing before anything that could panic.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
