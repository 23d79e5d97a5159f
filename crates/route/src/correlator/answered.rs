//! Answered keys: a request that leaves the table with a fingerprint
//! stays in its index as an answered entry for `duplicate_window`, so its
//! duplicates are found by the probe that registers them (the module doc
//! of [`super`]; the entries and their answers: [`Answers`]).

use std::time::Instant;

use super::{CorrelationKey, Correlator, holds};
use crate::integrity::duplicates::{ANSWERED, Answers, Keeping, duplicate};
use crate::integrity::{Duplicate, Identity};

/// What the index keeps for a request leaving the table, `bucket` its
/// entry: the key answered (its tag, returned), when the answer is
/// `kept` and the request has a fingerprint and there is room; else the
/// answered entry the request had hidden, if still held; else nothing.
#[allow(clippy::too_many_arguments)]
pub(super) fn settle(
    mut bucket: hashbrown::hash_table::OccupiedEntry<'_, u32>,
    (fingerprint, hid): (u64, u32),
    answers: &mut Answers,
    keeping: Option<&Keeping>,
    hash: u64,
    now: Instant,
    kept: bool,
) -> Option<u32> {
    // A fingerprint is only made with the check on.
    // A full shard makes room after (`Correlator::trim_answers`): the
    // newest answer is always kept.
    if kept
        && fingerprint != 0
        && let Some(k) = keeping
    {
        k.count_kept();
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

impl<V> Correlator<V> {
    /// The slot holding `key` in flight, else the tag of its answered
    /// entry (a key hashed `hash`): in one probe, the request in flight
    /// first (an answered entry is known by its hash alone, so another key
    /// of the same hash may have one).
    #[inline]
    pub(super) fn find_any(&self, hash: u64, key: &CorrelationKey) -> (Option<u32>, Option<u32>) {
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
    pub(super) fn seen_hashed(
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

    /// The tag of the answered entry of `key` (hashed `hash`): its own,
    /// or the one a request of another transaction in flight hid.
    pub(super) fn answered_tag(&self, hash: u64, key: &CorrelationKey) -> Option<u32> {
        match self.find_any(hash, key) {
            (Some(slot), _) => Some(self.entry(slot)?.hid).filter(|&t| t != 0),
            (None, answered) => answered,
        }
    }

    /// The answer kept for the request of `key` known as `id` is not to
    /// be replayed: its sender never got it.
    /// Whether a duplicate was sent it before.
    pub(super) fn withhold_hashed(
        &mut self,
        hash: u64,
        key: &CorrelationKey,
        id: Identity,
    ) -> bool {
        self.answered_tag(hash, key)
            .is_some_and(|tag| self.answers.withhold(tag, id.fingerprint()))
    }

    /// A shard past its share of answers forgets its oldest: duplicates
    /// come for the newest (a terminal or a network resends within
    /// seconds), so a table at its capacity keeps those, never refuses
    /// them. Counted (`overflow`).
    #[inline]
    pub(super) fn trim_answers(&mut self) {
        let Some(k) = self.keeping.as_deref() else {
            return;
        };
        if self.answers.len() <= k.shard_capacity() {
            return;
        }
        let gone = self
            .answers
            .forget_oldest(k.shard_capacity(), &mut self.index);
        k.forgot_early(gone);
    }

    /// Forgets the keys answered longer ago than the window.
    pub(super) fn forget_answers(&mut self, now: Instant) {
        let Some(k) = self.keeping.as_deref() else {
            return;
        };
        let gone = self.answers.expire(now, k.window(), &mut self.index);
        k.give_back(gone);
    }
}
