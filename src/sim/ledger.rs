//! The books a simulated peer keeps of a financial switch's store-and-forward
//! traffic, to say afterwards whether the switch did right: which approvals
//! it answered late, which of those the switch reversed (and what else it
//! reversed), the advices and repeats it delivered, and the key exchanges it
//! passed on. Shared by `sim node` and `sim cups`, which count the same way.
//!
//! Every table is bounded ([`MAX_TRACKED`] transactions); what arrives past
//! that is counted as `untracked` rather than remembered.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use crate::iso8583::Mti;
use crate::sim::original::OriginalKey;
use crate::sim::peer::lock;
use crate::util::Rng;

/// Transactions each book remembers at most.
pub const MAX_TRACKED: usize = 1_000_000;
/// Distinct codes (F70, F39 values) counted at most.
const MAX_CODES: usize = 1_000;

/// A share of approvals answered late: past the switch's timeout, so that
/// the switch has declined on the peer's behalf and must reverse them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LateApprovals {
    /// Share of approvals (0..=1) answered late.
    pub share: f64,
    /// How much later than the normal delay.
    pub by: Duration,
}

impl LateApprovals {
    /// The extra wait for one approval: `Some(by)` for the late share.
    pub fn draw(&self, rng: &mut Rng) -> Option<Duration> {
        (self.share > 0.0 && rng.chance(self.share)).then_some(self.by)
    }
}

/// Whether `mti` is an approvable request: an authorisation or financial
/// request (class 1 or 2, function 0: `0100`, `0200` and their repeats).
pub fn is_approvable(mti: Mti) -> bool {
    matches!(mti.class(), 1 | 2) && mti.function() == 0
}

/// A balance or available-funds inquiry (F3 starting `31` or `30`, read as
/// text): it moves no money, so nothing of it is ever reversed.
pub fn is_inquiry(msg: &crate::iso8583::Message<'_>) -> bool {
    match msg.field(3) {
        Ok(Some(f3)) => {
            let text: Vec<u8> = f3.logical().take(2).collect();
            text == b"30" || text == b"31"
        }
        _ => false,
    }
}

/// A reversal or its repeat: `0420`, `0421`.
pub fn is_reversal(mti: Mti) -> bool {
    mti.class() == 4 && mti.function() == 2
}

/// A reversal in `spec`'s dialect: [`is_reversal`], or the dialect's own
/// reversal MTI and its repeat where that is a request (Mastercard's
/// acquirer Reversal Request `0400` / `0401`).
pub fn is_reversal_in(spec: &crate::iso8583::Spec, mti: Mti) -> bool {
    let own = spec.integrity().reversal_mti;
    is_reversal(mti) || (mti.class() == 4 && own.class() == 4 && mti.function() == own.function())
}

/// An advice or its repeat: `0120`, `0121`, `0220`, `0221`.
pub fn is_advice(mti: Mti) -> bool {
    matches!(mti.class(), 1 | 2) && mti.function() == 2
}

/// A network-management F70 of key management: `1xx` (`101` key reset,
/// `16x` key exchange).
pub fn is_key_management(f70: &[u8]) -> bool {
    f70.len() == 3 && f70[0] == b'1' && f70.iter().all(u8::is_ascii_digit)
}

/// A request repeated: `0101`, `0201`, `0401`.
pub fn is_repeated_request(mti: Mti) -> bool {
    mti.function() == 0 && mti.is_repeat() && mti.class() != 8
}

/// What a peer saw of reversals, per message and per chain (all the
/// reversal messages for one original).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReversalReport {
    /// Approvals the peer sent late (the switch should reverse each).
    pub late_approvals: u64,
    /// `0420`s received.
    pub received: u64,
    /// `0421`s (repeats) received.
    pub repeats: u64,
    /// Reversal messages left unanswered on purpose (`ignore_reversals`).
    pub ignored: u64,
    /// `0430`s written.
    pub answered: u64,
    /// Distinct originals reversed.
    pub chains: u64,
    /// Chains whose original was one of the peer's late approvals.
    pub chains_late: u64,
    /// Chains for something the peer did not approve late: declined,
    /// answered in time, or unknown. Zero from a correct switch.
    pub chains_not_late: u64,
    /// A second `0420` (not `0421`) for an original already reversed.
    pub duplicate_chains: u64,
    /// Late approvals never reversed (at the time of the report).
    pub late_never_reversed: u64,
    /// Reversals whose F90 does not name an original (answered F39 `30`).
    pub unreadable: u64,
    /// Approvable requests the peer left unanswered on purpose: their
    /// outcome is unknown to the switch, which should reverse each (a
    /// timeout reversal).
    pub unanswered: u64,
    /// Chains for those.
    pub chains_unanswered: u64,
    /// Those never reversed (at the time of the report).
    pub unanswered_never_reversed: u64,
    /// Late approvals or chains past [`MAX_TRACKED`], not remembered.
    pub untracked: u64,
    /// Reversal messages answered for a partial approval that name it: its
    /// F38, and the amount approved (F95's first 12 digits where the
    /// reversal carries F95, else F4).
    pub named_approval: u64,
    /// ...that do not: another F38 or none, or the amount asked.
    pub misnamed_approval: u64,
}

/// What a peer approved of a transaction, as its reversal must name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Approval {
    /// F38, the approval code.
    pub f38: String,
    /// The amount approved, 12 digits.
    pub amount: String,
}

/// What a peer does with a reversal message ([`ReversalBook::take`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// One of the first of its chain, left unanswered on purpose.
    Ignored,
    /// Answered: its turn among the answered messages of its chain, from 1.
    Answer(u32),
    /// Its F90 names no original: answered F39 `30` (format error).
    Unreadable,
}

/// The reversal book: late approvals, and the chains of reversals that come
/// for them (or for anything else).
#[derive(Debug, Default)]
pub struct ReversalBook {
    inner: Mutex<Reversals>,
}

#[derive(Debug, Default)]
struct Reversals {
    late: HashSet<OriginalKey>,
    /// Approvable requests left unanswered on purpose.
    unanswered: HashSet<OriginalKey>,
    /// Reversal messages seen per original.
    chains: HashMap<OriginalKey, u32>,
    /// What was approved of the partial approvals sent late.
    approvals: HashMap<OriginalKey, Approval>,
    counts: ReversalReport,
}

impl ReversalBook {
    /// Whether another late approval can be remembered: decided before the
    /// approval is held back, so that none is made late unrecorded.
    pub fn has_room(&self) -> bool {
        lock(&self.inner).late.len() < MAX_TRACKED
    }

    /// A late approval of `original`, recorded as it is sent (before the
    /// switch can have it, so before any reversal of it can come).
    pub fn approved_late(&self, original: OriginalKey) {
        let mut b = lock(&self.inner);
        b.counts.late_approvals += 1;
        if b.late.len() < MAX_TRACKED {
            b.late.insert(original);
        } else {
            b.counts.untracked += 1;
        }
    }

    /// What a late approval of `original` approved (a partial one): its
    /// reversal must say so.
    pub fn approved_as(&self, original: OriginalKey, approval: Approval) {
        let mut b = lock(&self.inner);
        if b.approvals.len() < MAX_TRACKED {
            b.approvals.insert(original, approval);
        }
    }

    /// An approvable request left unanswered on purpose: the switch does
    /// not know its outcome, so it owes a timeout reversal.
    pub fn not_answered(&self, original: OriginalKey) {
        let mut b = lock(&self.inner);
        b.counts.unanswered += 1;
        if b.unanswered.len() < MAX_TRACKED {
            b.unanswered.insert(original);
        } else {
            b.counts.untracked += 1;
        }
    }

    /// A reversal (`repeat`: an `0421`) of `original`: counted in its
    /// chain. Returns its place in the chain, 1 for the first message.
    pub fn reversal(&self, original: OriginalKey, repeat: bool) -> u32 {
        let mut guard = lock(&self.inner);
        let b = &mut *guard;
        if repeat {
            b.counts.repeats += 1;
        } else {
            b.counts.received += 1;
        }
        if let Some(seen) = b.chains.get_mut(&original) {
            *seen = seen.saturating_add(1);
            if !repeat {
                b.counts.duplicate_chains += 1;
            }
            return *seen;
        }
        // Late or not is told at the report: a timeout reversal comes as
        // the switch gives up, before the late approval it covers leaves.
        b.counts.chains += 1;
        if b.chains.len() < MAX_TRACKED {
            b.chains.insert(original, 1);
        } else {
            b.counts.untracked += 1;
        }
        1
    }

    /// A reversal message (`0420`/`0421`) a peer got, booked in its chain
    /// by its own reading of F90: left unanswered while it is one of the
    /// first `ignore` of its chain, else answered (its turn among the
    /// answered ones, from 1); a reversal that names no original is
    /// counted and answered F39 `30`.
    pub fn take(&self, msg: &crate::iso8583::Message<'_>, ignore: u32) -> Taken {
        let Ok(original) = OriginalKey::of_reversal(msg) else {
            self.unreadable();
            return Taken::Unreadable;
        };
        let place = self.reversal(original.clone(), msg.mti().is_repeat());
        if place <= ignore {
            self.ignored();
            return Taken::Ignored;
        }
        self.check_approval(&original, msg);
        Taken::Answer(place - ignore)
    }

    /// Whether a reversal of a partial approval names what was approved,
    /// by this peer's reading: F38, and F95's amount if it has F95, else F4.
    fn check_approval(&self, original: &OriginalKey, msg: &crate::iso8583::Message<'_>) {
        let text = |id| -> Option<String> {
            let f = msg.field(id).ok()??;
            Some(f.logical().map(char::from).collect())
        };
        let mut b = lock(&self.inner);
        let Some(approval) = b.approvals.get(original) else {
            return;
        };
        let amount = match text(95) {
            Some(f95) => f95.get(..12).map(str::to_owned),
            None => text(4),
        };
        let named = text(38).as_deref() == Some(approval.f38.as_str())
            && amount.as_deref() == Some(approval.amount.as_str());
        if named {
            b.counts.named_approval += 1;
        } else {
            b.counts.misnamed_approval += 1;
        }
    }

    /// A reversal whose F90 names no original.
    pub fn unreadable(&self) {
        lock(&self.inner).counts.unreadable += 1;
    }

    /// A reversal message left unanswered on purpose.
    pub fn ignored(&self) {
        lock(&self.inner).counts.ignored += 1;
    }

    /// An `0430` written.
    pub fn answered(&self) {
        lock(&self.inner).counts.answered += 1;
    }

    /// The counts now: the late approvals not (yet) reversed, and each
    /// chain as late or not by what the peer approved late by now.
    pub fn report(&self) -> ReversalReport {
        let b = lock(&self.inner);
        let reversed = |set: &HashSet<OriginalKey>| {
            set.iter().filter(|k| b.chains.contains_key(*k)).count() as u64
        };
        let (late, unanswered) = (reversed(&b.late), reversed(&b.unanswered));
        let tracked = b.chains.len() as u64;
        ReversalReport {
            late_never_reversed: b.late.len() as u64 - late,
            chains_late: late,
            unanswered_never_reversed: b.unanswered.len() as u64 - unanswered,
            chains_unanswered: unanswered,
            chains_not_late: tracked.saturating_sub(late + unanswered),
            ..b.counts.clone()
        }
    }
}

impl std::fmt::Display for ReversalReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "late {} never reversed {} | reversals {} repeats {} ignored {} answered {} \
             chains {} (late {} not late {} duplicate {}) unreadable {}",
            self.late_approvals,
            self.late_never_reversed,
            self.received,
            self.repeats,
            self.ignored,
            self.answered,
            self.chains,
            self.chains_late,
            self.chains_not_late,
            self.duplicate_chains,
            self.unreadable,
        )
    }
}

/// What a peer saw of advices: delivered at least once, so duplicates are
/// allowed, but counted.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct AdviceReport {
    /// Advices (`0120`, `0220`) received.
    pub received: u64,
    /// Their repeats (`0121`, `0221`).
    pub repeats: u64,
    /// Advice messages for a transaction already seen (a repeat of one
    /// already acknowledged, or the same advice twice).
    pub duplicates: u64,
    /// Distinct transactions advised.
    pub distinct: u64,
    /// Acknowledgements (`0130`, `0230`) written.
    pub answered: u64,
    /// Advices past [`MAX_TRACKED`], not remembered.
    pub untracked: u64,
    /// Advice messages left unacknowledged on purpose
    /// (`ignore_advice_originals`).
    pub ignored: u64,
}

/// The advice book.
#[derive(Debug, Default)]
pub struct AdviceBook {
    inner: Mutex<Advices>,
}

#[derive(Debug, Default)]
struct Advices {
    /// Messages seen per transaction.
    seen: HashMap<OriginalKey, u32>,
    /// Transactions acknowledged (booked): an ignored message is as if lost.
    booked: HashSet<OriginalKey>,
    counts: AdviceReport,
}

impl AdviceBook {
    /// An advice (`repeat`: `0121` / `0221`) for `original`. Returns its
    /// place among that transaction's advice messages, 1 for the first.
    pub fn advice(&self, original: OriginalKey, repeat: bool) -> u32 {
        let mut guard = lock(&self.inner);
        let b = &mut *guard;
        if repeat {
            b.counts.repeats += 1;
        } else {
            b.counts.received += 1;
        }
        if let Some(seen) = b.seen.get_mut(&original) {
            b.counts.duplicates += 1;
            *seen = seen.saturating_add(1);
            *seen
        } else if b.seen.len() < MAX_TRACKED {
            b.seen.insert(original, 1);
            b.counts.distinct += 1;
            1
        } else {
            b.counts.untracked += 1;
            1
        }
    }

    /// Advice `original` acknowledged: booked at this host.
    pub fn book(&self, original: OriginalKey) {
        let mut b = lock(&self.inner);
        if b.booked.len() < MAX_TRACKED {
            b.booked.insert(original);
        }
    }

    /// Whether advice `original` is booked here.
    pub fn has_booked(&self, original: &OriginalKey) -> bool {
        lock(&self.inner).booked.contains(original)
    }

    /// An advice message left unacknowledged on purpose.
    pub fn ignored(&self) {
        lock(&self.inner).counts.ignored += 1;
    }

    pub fn answered(&self) {
        lock(&self.inner).counts.answered += 1;
    }

    pub fn report(&self) -> AdviceReport {
        lock(&self.inner).counts.clone()
    }
}

impl std::fmt::Display for AdviceReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "advices {} repeats {} duplicates {} distinct {} answered {}",
            self.received, self.repeats, self.duplicates, self.distinct, self.answered
        )
    }
}

/// Counts by a short code (F70 values, F39 values), at most [`MAX_CODES`]
/// distinct ones; the rest are counted under `other`.
#[derive(Debug, Default)]
pub struct CodeCounts {
    inner: Mutex<BTreeMap<String, u64>>,
}

impl CodeCounts {
    pub fn add(&self, code: &[u8]) {
        let mut m = lock(&self.inner);
        let code = String::from_utf8_lossy(code).into_owned();
        let code = if m.len() < MAX_CODES || m.contains_key(&code) {
            code
        } else {
            "other".to_string()
        };
        *m.entry(code).or_default() += 1;
    }

    pub fn get(&self, code: &str) -> u64 {
        lock(&self.inner).get(code).copied().unwrap_or(0)
    }

    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        lock(&self.inner).clone()
    }
}

/// The transactions a peer answered lately, to tell a repeat (`0201`) of
/// one it answered from a repeat of one it never saw. Remembers the last
/// `capacity` only: a repeat comes within a timeout or two of its first.
#[derive(Debug)]
pub struct Answered {
    inner: Mutex<(HashSet<OriginalKey>, VecDeque<OriginalKey>)>,
    capacity: usize,
}

impl Answered {
    pub fn new(capacity: usize) -> Answered {
        Answered {
            inner: Mutex::new((HashSet::new(), VecDeque::new())),
            capacity,
        }
    }

    pub fn remember(&self, key: OriginalKey) {
        let mut guard = lock(&self.inner);
        let (set, order) = &mut *guard;
        if set.insert(key.clone()) {
            order.push_back(key);
        }
        while order.len() > self.capacity {
            if let Some(old) = order.pop_front() {
                set.remove(&old);
            }
        }
    }

    pub fn contains(&self, key: &OriginalKey) -> bool {
        lock(&self.inner).0.contains(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iso8583::{Message, Spec, samples};
    use bytes::Bytes;

    /// Keys of the sample purchase with STANs `stans`.
    fn keys(stans: &[&str]) -> Vec<OriginalKey> {
        let spec = Spec::builtin("cups").unwrap();
        stans
            .iter()
            .map(|s| {
                let mut d = samples::purchase(&spec);
                d.set_text(11, *s);
                let msg = Message::parse(&spec, Bytes::from(spec.encode(&d).unwrap())).unwrap();
                OriginalKey::of_message(&msg).unwrap()
            })
            .collect()
    }

    #[test]
    fn chains_are_told_apart_by_their_original() {
        let k = keys(&["000001", "000002", "000003"]);
        let book = ReversalBook::default();
        book.approved_late(k[0].clone());
        book.approved_late(k[1].clone());
        assert_eq!(book.reversal(k[0].clone(), false), 1);
        assert_eq!(book.reversal(k[0].clone(), true), 2);
        assert_eq!(book.reversal(k[0].clone(), true), 3);
        // A reversal of what was answered in time.
        assert_eq!(book.reversal(k[2].clone(), false), 1);
        // A second 0420 for the same original.
        assert_eq!(book.reversal(k[2].clone(), false), 2);
        let r = book.report();
        assert_eq!((r.received, r.repeats), (3, 2));
        assert_eq!((r.chains, r.chains_late, r.chains_not_late), (2, 1, 1));
        assert_eq!(r.duplicate_chains, 1);
        assert_eq!((r.late_approvals, r.late_never_reversed), (2, 1));
    }

    #[test]
    fn advices_count_repeats_and_duplicates() {
        let k = keys(&["000001", "000002"]);
        let book = AdviceBook::default();
        book.advice(k[0].clone(), false);
        book.advice(k[0].clone(), true);
        book.advice(k[1].clone(), true);
        let r = book.report();
        assert_eq!(
            (r.received, r.repeats, r.duplicates, r.distinct),
            (1, 2, 1, 2)
        );
    }

    #[test]
    fn answered_forgets_the_oldest() {
        let k = keys(&["000001", "000002", "000003"]);
        let a = Answered::new(2);
        for key in &k {
            a.remember(key.clone());
        }
        assert!(!a.contains(&k[0]));
        assert!(a.contains(&k[1]) && a.contains(&k[2]));
    }

    #[test]
    fn codes_are_bounded() {
        let c = CodeCounts::default();
        for i in 0..(MAX_CODES + 5) {
            c.add(format!("{i:04}").as_bytes());
        }
        c.add(b"0001");
        assert_eq!(c.get("0001"), 2);
        assert_eq!(c.get("other"), 5);
    }

    #[test]
    fn mti_kinds() {
        let m = |s: &str| s.parse::<Mti>().unwrap();
        assert!(is_approvable(m("0200")) && is_approvable(m("0101")));
        assert!(!is_approvable(m("0220")) && !is_approvable(m("0400")));
        assert!(is_reversal(m("0420")) && is_reversal(m("0421")) && !is_reversal(m("0400")));
        assert!(is_advice(m("0221")) && !is_advice(m("0420")));
        assert!(is_repeated_request(m("0401")) && !is_repeated_request(m("0200")));
        assert!(!is_repeated_request(m("0801")));
        assert!(is_key_management(b"101") && is_key_management(b"162"));
        assert!(!is_key_management(b"301") && !is_key_management(b"1x1"));
    }
}
