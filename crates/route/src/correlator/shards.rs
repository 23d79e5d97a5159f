//! The correlation table in shards, each under its own lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::{
    CorrelationKey, Correlator, CorrelatorConfig, CorrelatorStats, KeyHasher, Miss,
    PREALLOCATE_MAX, Rejected,
};
use crate::integrity::duplicates::Keeping;
use crate::integrity::{Duplicate, Identity};

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
        lock(&self.shards[shard_number(hash)])
    }

    /// The number of the shard that holds `key` (for tests that fill one).
    #[cfg(test)]
    pub(super) fn shard_number_of(&self, key: &CorrelationKey) -> usize {
        use std::hash::BuildHasher;
        shard_number(self.hasher.hash_one(key))
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

/// The shard of a key hashed `hash`: bits the shard's index leaves alone
/// pick it (hashbrown takes buckets from the low bits and its tags from
/// the top seven).
fn shard_number(hash: u64) -> usize {
    (hash >> 40) as usize & (SHARDS - 1)
}
