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
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::integrity::Identity;
use crate::integrity::duplicates::{ANSWERED, Answers, Keeping};

mod answered;
mod key;
mod shards;
use answered::settle;
pub use key::{CorrelationKey, KEY_MAX, KeyBuilder, KeyHasher, KeyTooLong};
pub use shards::{SHARDS, Shards};

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
            // The links and ids are read where the entry lies, and only its
            // value leaves the slab (the whole entry, key and all, was one
            // copy more per answer).
            let cell = self.slab.get_mut(slot as usize);
            let Some((ids, links, value)) = cell.and_then(|cell| {
                let e = cell.as_ref()?;
                let ids = (e.fingerprint, e.hid);
                let links = (e.prev, e.next);
                Some((ids, links, cell.take()?.value))
            }) else {
                // Not so: `holds` found it in the slab.
                bucket.remove();
                return Err(Miss::Unknown);
            };
            let keeping = self.keeping.as_deref();
            let tag = settle(bucket, ids, &mut self.answers, keeping, hash, now, true);
            if let (Some(_), Some(k)) = (tag, keeping) {
                self.answers.keep_last(key.as_bytes(), answer, k);
                self.trim_answers();
            }
            self.unlink_links(links);
            self.free.push(slot);
            self.stats.answered += 1;
            return Ok(value);
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
            if settle(bucket, ids, &mut self.answers, keeping, hash, now, kept).is_some() {
                self.trim_answers();
            }
        }
        self.free.push(slot);
        Some(e)
    }

    /// Takes `e`, just out of its slot, out of the deadline list.
    fn unlink(&mut self, e: &Entry<V>) {
        self.unlink_links((e.prev, e.next));
    }

    /// [`Correlator::unlink`] of the entry whose links are `(prev, next)`.
    fn unlink_links(&mut self, (prev, next): (u32, u32)) {
        match self.entry_mut(prev) {
            Some(p) => p.next = next,
            None => self.head = next,
        }
        match self.entry_mut(next) {
            Some(n) => n.prev = prev,
            None => self.tail = prev,
        }
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

#[cfg(test)]
mod tests;
