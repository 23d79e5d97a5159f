//! When the switch answers for a node, what it owes afterwards. Pure: the
//! books take the time they are given, and the reversal is built from the
//! spec's `[integrity]` template.
//!
//! - [`LateBook`]: the requests the switch answered itself (a decline at the
//!   deadline, a node connection lost) or let expire in silence, remembered
//!   for `late_window`. A node's approval that arrives after that is found
//!   here and reversed, once: never a decline, never twice, and nothing for
//!   an answer in time (an answer in time never misses the correlator).
//! - [`RepeatBook`]: which node each request went to, for `repeat_window`,
//!   so a repeat (0201, 0401, 0421) goes to the node that has the original
//!   and never to another one as a new transaction.
//! - [`reversal`]: the reversal advice of a request, from the dialect's
//!   template: its identifying fields, F39 = the dialect's reason code, and
//!   F90, the original data elements (MTI, F11, F7, F32, F33).
//!
//! Both books are bounded: past `capacity` a new record is refused and
//! counted, so a flood of timeouts costs memory up to a limit and no more.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;

use super::correlator::CorrelationKey;
use super::decline::DeclineReason;
use isoswitch_iso8583::{Decoded, FieldCodes, IsoError, Message, Mti, SafAnswerClass, Spec};

pub(crate) mod duplicates;
mod original;
mod repeats;
pub use crate::generations::GENERATIONS;
pub use duplicates::{Duplicate, DuplicateBook, DuplicateCounters, Identity, Keeping};
pub use original::original_key;
pub use repeats::{REPEAT_SHARDS, RepeatBook};

/// An authorization or financial request (0100, 0200 and their repeats):
/// the messages whose approval moves money and so can need reversing.
pub fn is_approvable(mti: Mti) -> bool {
    matches!(mti.class(), 1 | 2) && mti.function() == 0
}

/// Whether `request` moves money: not when its F3 (processing code, read
/// as text) starts with one of the dialect's `no_reversal_f3` (a balance
/// inquiry), whose approval nobody reverses. A request without F3 moves
/// money, as far as the switch can tell.
pub fn moves_money(request: &Message<'_>, no_reversal_f3: &[String]) -> bool {
    let Ok(Some(f3)) = request.field(3) else {
        return true;
    };
    !no_reversal_f3.iter().any(|p| {
        let text = f3.logical();
        text.len() >= p.len() && text.zip(p.bytes()).all(|(a, b)| a == b)
    })
}

/// An advice (0120, 0220, 0420 and their repeats): the sender tells, and
/// many senders take any 0x30 as the acknowledgement and never repeat.
pub fn is_advice(mti: Mti) -> bool {
    mti.function() == 2
}

/// Does `response` approve, by the dialect's (or the service's) approval
/// codes, packed for its spec's F39 ([`Spec::field_codes`]): compared as
/// the text `decode` shows, so an EBCDIC `F0 F0` is "00". A response
/// without a readable F39 does not approve.
pub fn approves(response: &Message<'_>, codes: &FieldCodes) -> bool {
    codes.in_message(response)
}

/// The F39 codes of a dialect's [`SafAnswerClass`]es, packed for its F39:
/// how a host's answer to an owed message is taken.
#[derive(Clone, Debug)]
pub struct SafAnswers {
    done: FieldCodes,
    reconcile: FieldCodes,
    retry: FieldCodes,
}

impl SafAnswers {
    /// The spec's classes, packed for its F39.
    pub fn of(spec: &Spec) -> Result<SafAnswers, IsoError> {
        let a = &spec.integrity().saf_answers;
        Ok(SafAnswers {
            done: spec.field_codes(39, &a.done)?,
            reconcile: spec.field_codes(39, &a.reconcile)?,
            retry: spec.field_codes(39, &a.retry)?,
        })
    }

    /// What `answer` does to the entry it answers: an answer without a
    /// readable F39 is tried again; a code in no class is a refusal.
    pub fn class(&self, answer: &Message<'_>) -> SafAnswerClass {
        let Ok(Some(f39)) = answer.field(39) else {
            return SafAnswerClass::Retry;
        };
        if self.done.matches(&f39) {
            SafAnswerClass::Done
        } else if self.reconcile.matches(&f39) {
            SafAnswerClass::Reconcile
        } else if self.retry.matches(&f39) {
            SafAnswerClass::Retry
        } else {
            SafAnswerClass::Dead
        }
    }
}

/// What the switch did about a request it answered for its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Said {
    /// It declined it, for this reason.
    Declined(DeclineReason),
    /// It let the deadline pass without a word (`on_timeout = "silent"`).
    Silent,
    /// The node approved in time, but its answer could not be delivered
    /// (the client gone, its queue full): the terminal never saw it.
    Undelivered,
}

/// A request the switch answered for its node.
#[derive(Clone, Debug)]
pub struct LateEntry {
    /// The request as the node got it.
    pub request: Bytes,
    /// The node it went to.
    pub node: usize,
    pub said: Said,
    pub at: Instant,
    /// What is owed for it already: never a second reversal.
    owed: Owed,
    /// The store id of its timeout reversal, once stored: what a late
    /// approval that attaches to it is journaled with.
    pub reversal_id: std::sync::Arc<std::sync::OnceLock<i64>>,
}

/// The reversal owed for a remembered request, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owed {
    Nothing,
    /// A timeout reversal, stored when the switch answered for the node:
    /// a late answer attaches to it.
    TimeoutReversal,
    /// A reversal of a late approval (or a late approval attached to the
    /// timeout reversal).
    Reversed,
}

impl LateEntry {
    pub fn new(request: Bytes, node: usize, said: Said, at: Instant) -> LateEntry {
        LateEntry {
            request,
            node,
            said,
            at,
            owed: Owed::Nothing,
            reversal_id: std::sync::Arc::default(),
        }
    }

    /// A reversal is owed for it already (a timeout reversal, stored as the
    /// switch answered; an undelivered approval's): a late answer attaches.
    pub fn with_timeout_reversal(self) -> LateEntry {
        LateEntry {
            owed: Owed::TimeoutReversal,
            ..self
        }
    }
}

/// What a late response finds in the book.
#[derive(Debug)]
pub enum Late {
    /// Not a request the switch answered (or answered too long ago).
    NotRemembered,
    /// Remembered, and already reversed by an earlier late answer.
    AlreadyReversed,
    /// Remembered: the request and what the switch said. The book now
    /// counts it as reversed if the caller reverses it.
    Found(LateEntry),
    /// Remembered, with a timeout reversal already owed: the late answer
    /// attaches to it (an approval is reversed by it, never by a second).
    Covered(LateEntry),
}

/// Counters of a book, readable at any time.
#[derive(Debug, Default)]
pub struct BookCounters {
    /// Records refused because the book was full.
    pub overflow: AtomicU64,
}

/// Requests the switch answered for its node, by correlation key, for
/// `window`.
#[derive(Debug)]
pub struct LateBook {
    entries: DashMap<CorrelationKey, LateEntry>,
    /// `entries.len()` without visiting every shard: the message path asks
    /// whether the book is empty for each request it forwards.
    held: std::sync::atomic::AtomicUsize,
    window: Duration,
    capacity: usize,
    pub counters: BookCounters,
}

impl LateBook {
    pub fn new(window: Duration, capacity: usize) -> LateBook {
        LateBook {
            entries: DashMap::new(),
            held: std::sync::atomic::AtomicUsize::new(0),
            window,
            capacity,
            counters: BookCounters::default(),
        }
    }

    /// Remembers a request the switch answered (or let expire). False when
    /// the book is full (counted).
    pub fn record(&self, key: CorrelationKey, entry: LateEntry) -> bool {
        if self.window.is_zero() {
            return false;
        }
        if self.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.counters.overflow.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        if self.entries.insert(key, entry).is_none() {
            self.held.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// A response that found no request in flight: was it one the switch
    /// answered for its node? With `reverse`, a found entry is marked so
    /// that no later answer reverses it again.
    pub fn late(&self, key: &CorrelationKey, now: Instant, reverse: bool) -> Late {
        let Some(mut e) = self.entries.get_mut(key) else {
            return Late::NotRemembered;
        };
        if now.saturating_duration_since(e.at) > self.window {
            return Late::NotRemembered;
        }
        match (e.owed, reverse) {
            (Owed::Reversed, _) => Late::AlreadyReversed,
            (Owed::TimeoutReversal, true) => {
                e.owed = Owed::Reversed;
                Late::Covered(e.clone())
            }
            (Owed::TimeoutReversal, false) => Late::Covered(e.clone()),
            (Owed::Nothing, true) => {
                e.owed = Owed::Reversed;
                Late::Found(e.clone())
            }
            (Owed::Nothing, false) => Late::Found(e.clone()),
        }
    }

    /// Whether a reversal is owed for the request `key` names (a timeout
    /// reversal, or a late approval's): its repeat must not be approved.
    pub fn reversal_owed(&self, key: &CorrelationKey, now: Instant) -> bool {
        self.entries.get(key).is_some_and(|e| {
            e.owed != Owed::Nothing && now.saturating_duration_since(e.at) <= self.window
        })
    }

    /// A request under `key` went to a node again (the repeat of one the
    /// switch answered for): the answer the sender gets from now on is the
    /// node's, relayed; whichever of the node's answers comes first is
    /// matched to the request in flight, so none that comes after may be
    /// taken for a late answer to the original. True if one was forgotten.
    pub fn forget(&self, key: &CorrelationKey) -> bool {
        if self.held.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let gone = self.entries.remove(key).is_some();
        if gone {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
        gone
    }

    /// Forgets what is older than the window. Returns how many went.
    pub fn sweep(&self, now: Instant) -> usize {
        let mut gone = 0;
        self.entries.retain(|_, e| {
            let keep = now.saturating_duration_since(e.at) <= self.window;
            gone += usize::from(!keep);
            keep
        });
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

/// Why a reversal cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ReversalError {
    #[error(transparent)]
    Iso(#[from] IsoError),
    #[error("the original is a {0}, not a request")]
    NotARequest(Mti),
}

/// The reversal advice of `original` (a request as the node got it), by the
/// dialect's `[integrity]` template: the reversal MTI (0420), the same
/// envelope (it goes where the original went), the template's fields where
/// the original has them, F39 = the dialect's reason and F90 = the original
/// data elements. Its repeats differ only in the MTI's last digit.
pub fn reversal(spec: &Spec, original: &Decoded) -> Result<Decoded, ReversalError> {
    if !original.mti.is_request() {
        return Err(ReversalError::NotARequest(original.mti));
    }
    let t = spec.integrity();
    let mut out = Decoded::new(original.envelope.clone(), t.reversal_mti);
    out.bitmaps = original.bitmaps;
    for &id in &t.reversal_fields {
        if let Some(v) = original.get(id) {
            out.set(id, v.clone());
        }
    }
    if spec.field(39).is_none() {
        return Err(IsoError::NoSuchField { id: 39 }.into());
    }
    out.set_text(39, t.reversal_reason.clone());
    if let Some(id) = t.original_data {
        out.set_text(id, original_data_elements(original));
    }
    Ok(out)
}

/// What the reversal of an approval takes from the host's `answer`, by the
/// dialect's template: its `answer_fields` (F38, the approval code issuers
/// match a reversal on; F4 where hosts reverse the amount they approved),
/// and, when the answer approved another amount than was asked (a partial
/// approval) in a dialect with `replacement_amounts`, that field (F95) with
/// the amount approved while F4 keeps the amount asked. A timeout reversal
/// has no answer to take them from.
pub fn with_answer(spec: &Spec, reversal: &mut Decoded, answer: &Decoded) {
    let t = spec.integrity();
    let asked = reversal.get(4).and_then(|v| v.as_text()).map(str::to_owned);
    for &id in &t.answer_fields {
        if let Some(v) = answer.get(id) {
            reversal.set(id, v.clone());
        }
    }
    let Some(field) = t.replacement_amounts else {
        return;
    };
    let approved = answer.get(4).and_then(|v| v.as_text());
    if let (Some(asked), Some(approved)) = (asked.as_deref(), approved)
        && asked != approved
    {
        // n12 actual amount, n12 actual settlement amount, x+n8 twice
        // (fees): only the amount is known.
        let digits: String = approved.chars().filter(char::is_ascii_digit).collect();
        let digits = &digits[digits.len().saturating_sub(12)..];
        reversal.set_text(
            field,
            format!("{digits:0>12}000000000000C00000000C00000000"),
        );
    }
}

/// F90, "original data elements", n42: the original's MTI (4 digits), F11
/// (6), F7 (10, zeros when absent), F32 and F33 (11 each, right-justified
/// and zero-filled, zeros when absent).
pub fn original_data_elements(original: &Decoded) -> String {
    let digits = |id: u16, width: usize| -> String {
        let text: String = original
            .get(id)
            .and_then(|v| v.as_text())
            .unwrap_or("")
            .chars()
            .filter(char::is_ascii_digit)
            .collect();
        let text = &text[text.len().saturating_sub(width)..];
        format!("{text:0>width$}")
    };
    // The original, not its repeat: a 0201 that timed out names the 0200
    // (the last digit's repeat bit cleared), which is what an issuer books.
    let mti = original.mti.as_str();
    let (head, last) = mti.split_at(3);
    let last = last.bytes().next().map_or('0', |d| char::from(d & !1));
    format!(
        "{head}{last}{}{}{}{}",
        digits(11, 6),
        digits(7, 10),
        digits(32, 11),
        digits(33, 11)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use isoswitch_iso8583::{Message, samples};

    fn key(n: u8) -> CorrelationKey {
        CorrelationKey::builder().push(&[n]).build().unwrap()
    }

    #[test]
    fn a_late_approval_is_reversed_once_and_forgotten_after_the_window() {
        let t0 = Instant::now();
        let book = LateBook::new(Duration::from_secs(300), 10);
        let entry = LateEntry::new(Bytes::from_static(b"x"), 2, Said::Silent, t0);
        assert!(book.record(key(1), entry));
        assert!(matches!(book.late(&key(2), t0, true), Late::NotRemembered));
        match book.late(&key(1), t0 + Duration::from_secs(1), true) {
            Late::Found(e) => assert_eq!((e.node, e.said), (2, Said::Silent)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            book.late(&key(1), t0 + Duration::from_secs(2), true),
            Late::AlreadyReversed
        ));
        assert_eq!(book.sweep(t0 + Duration::from_secs(301)), 1);
        assert!(book.is_empty());
    }

    #[test]
    fn a_late_answer_attaches_to_the_timeout_reversal() {
        let t0 = Instant::now();
        let book = LateBook::new(Duration::from_secs(300), 10);
        let e = LateEntry::new(Bytes::new(), 1, Said::Silent, t0).with_timeout_reversal();
        assert!(book.record(key(1), e));
        assert!(book.reversal_owed(&key(1), t0));
        assert!(!book.reversal_owed(&key(2), t0));
        // A late decline finds it, and changes nothing.
        assert!(matches!(book.late(&key(1), t0, false), Late::Covered(_)));
        // A late approval attaches, once.
        assert!(matches!(book.late(&key(1), t0, true), Late::Covered(_)));
        assert!(matches!(
            book.late(&key(1), t0, true),
            Late::AlreadyReversed
        ));
        // A plain entry owes nothing until a late approval.
        assert!(book.record(key(2), LateEntry::new(Bytes::new(), 1, Said::Silent, t0)));
        assert!(!book.reversal_owed(&key(2), t0));
        assert!(matches!(book.late(&key(2), t0, true), Late::Found(_)));
        assert!(book.reversal_owed(&key(2), t0));
        assert!(
            !book.reversal_owed(&key(2), t0 + Duration::from_secs(301)),
            "past the window"
        );
    }

    #[test]
    fn a_request_sent_again_is_forgotten() {
        let t0 = Instant::now();
        let book = LateBook::new(Duration::from_secs(300), 10);
        assert!(!book.forget(&key(1)), "nothing held");
        let e = || LateEntry::new(Bytes::new(), 0, Said::Silent, t0);
        assert!(book.record(key(1), e()));
        assert!(book.record(key(1), e()));
        assert!(book.record(key(2), e()));
        assert_eq!(book.len(), 2);
        assert!(book.forget(&key(1)));
        assert!(matches!(book.late(&key(1), t0, true), Late::NotRemembered));
        assert_eq!(book.len(), 1);
        assert_eq!(book.sweep(t0 + Duration::from_secs(301)), 1);
        assert!(book.is_empty());
    }

    #[test]
    fn a_full_book_refuses_and_counts() {
        let t0 = Instant::now();
        let book = LateBook::new(Duration::from_secs(300), 1);
        let e = || LateEntry::new(Bytes::new(), 0, Said::Declined(DeclineReason::Timeout), t0);
        assert!(book.record(key(1), e()));
        assert!(!book.record(key(2), e()));
        assert!(book.record(key(1), e()), "the same key replaces");
        assert_eq!(book.counters.overflow.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn an_approval_reversal_names_what_was_approved() {
        // A partial approval: 1000.00 asked, 500.00 approved, F38 AB1234.
        for (name, f4, f95) in [
            ("cups", "000000050000", None),
            ("cup-pos", "000000050000", None),
            (
                "visa-base1",
                "000000100000",
                Some("000000050000000000000000C00000000C00000000"),
            ),
        ] {
            let spec = Spec::builtin(name).unwrap();
            let mut original = samples::purchase(&spec);
            original.set_text(4, "000000100000");
            let mut answer = original.clone();
            answer.set_text(4, "000000050000");
            answer.set_text(38, "AB1234");
            answer.set_text(39, "10");
            let mut rev = reversal(&spec, &original).unwrap();
            with_answer(&spec, &mut rev, &answer);
            let text = |id| rev.get(id).and_then(|v| v.as_text()).map(str::to_owned);
            assert_eq!(text(38).as_deref(), Some("AB1234"), "{name}");
            assert_eq!(text(4).as_deref(), Some(f4), "{name}");
            assert_eq!(text(95).as_deref(), f95, "{name}");
            assert!(spec.encode(&rev).is_ok(), "{name}");
            // Approved in full: nothing replaces the amount.
            let mut rev = reversal(&spec, &original).unwrap();
            with_answer(&spec, &mut rev, &original);
            assert_eq!(rev.get(95), None, "{name}");
        }
    }

    #[test]
    fn the_reversal_names_its_original_in_f90() {
        let spec = Spec::builtin("cups").unwrap();
        let mut d = samples::purchase(&spec);
        d.set_text(11, "123456");
        d.set_text(7, "1204101112");
        d.set_text(32, "12345678");
        d.set_text(33, "87654321");
        let rev = reversal(&spec, &d).unwrap();
        assert_eq!(rev.mti.as_str(), "0420");
        assert_eq!(rev.get(39).and_then(|v| v.as_text()), Some("98"));
        assert_eq!(
            rev.get(90).and_then(|v| v.as_text()),
            Some("020012345612041011120001234567800087654321")
        );
        for id in [2, 4, 11, 37, 41] {
            assert_eq!(rev.get(id), d.get(id), "F{id} copied");
        }
        for id in [35, 52, 55] {
            assert!(!rev.has(id), "F{id} never in a reversal");
        }
        let bytes = spec.encode(&rev).unwrap();
        let msg = Message::parse(&spec, Bytes::from(bytes)).unwrap();
        assert!(msg.validate().is_ok());
        assert_eq!(original_data_elements(&d).len(), 42);
    }

    #[test]
    fn the_reversal_of_a_repeat_names_the_original_mti() {
        let spec = Spec::builtin("cups").unwrap();
        for (mti, named) in [
            ("0201", "0200"),
            ("0200", "0200"),
            ("0101", "0100"),
            ("0203", "0202"),
        ] {
            let mut d = samples::purchase(&spec);
            d.mti = mti.parse().unwrap();
            assert!(original_data_elements(&d).starts_with(named), "{mti}");
        }
    }

    #[test]
    fn classes_of_messages() {
        let m = |s: &str| s.parse::<Mti>().unwrap();
        assert!(is_approvable(m("0100")) && is_approvable(m("0201")));
        assert!(!is_approvable(m("0420")) && !is_approvable(m("0220")));
        assert!(is_advice(m("0220")) && is_advice(m("0421")) && !is_advice(m("0200")));
    }

    #[test]
    fn a_balance_inquiry_moves_no_money() {
        for name in ["cups", "cup-pos", "visa-base1", "iso87binary"] {
            let spec = Spec::builtin(name).unwrap();
            let no = &spec.integrity().no_reversal_f3;
            for (f3, want) in [
                ("000000", true),
                ("310000", false),
                ("300000", false),
                ("200000", true),
            ] {
                let mut d = samples::purchase(&spec);
                d.set_text(3, f3);
                let bytes = Bytes::from(spec.encode(&d).unwrap());
                let msg = Message::parse(&spec, bytes).unwrap();
                assert_eq!(moves_money(&msg, no), want, "{name}: F3 {f3}");
            }
        }
    }

    /// A host's answer to a reversal, by its F39 text in every dialect.
    #[test]
    fn saf_answers_sort_by_class() {
        for name in ["cups", "cup-pos", "visa-base1", "iso87binary"] {
            let spec = Spec::builtin(name).unwrap();
            let classes = SafAnswers::of(&spec).unwrap();
            let mut d = samples::purchase(&spec);
            d.mti = "0430".parse().unwrap();
            for (f39, want) in [
                (Some("00"), SafAnswerClass::Done),
                (Some("25"), SafAnswerClass::Reconcile),
                (Some("96"), SafAnswerClass::Retry),
                (Some("91"), SafAnswerClass::Retry),
                (None, SafAnswerClass::Retry),
                (Some("12"), SafAnswerClass::Dead),
                (Some("05"), SafAnswerClass::Dead),
            ] {
                match f39 {
                    Some(c) => drop(d.set_text(39, c)),
                    None => drop(d.remove(39)),
                }
                let bytes = Bytes::from(spec.encode(&d).unwrap());
                let msg = Message::parse(&spec, bytes).unwrap();
                assert_eq!(classes.class(&msg), want, "{name}: {f39:?}");
            }
        }
    }

    /// The defect VISA found: an EBCDIC F39 "00" (`F0 F0`) never approved
    /// when codes were compared as ASCII bytes.
    #[test]
    fn approval_is_read_as_text_in_every_dialect() {
        for name in ["cups", "cup-pos", "visa-base1", "iso87binary"] {
            let spec = Spec::builtin(name).unwrap();
            let codes = spec
                .field_codes(39, &spec.integrity().approval_codes)
                .unwrap();
            for (f39, want) in [
                ("00", true),
                ("08", true),
                ("10", true),
                ("11", true),
                ("16", true),
                ("05", false),
                ("68", false),
            ] {
                let mut d = samples::purchase(&spec);
                d.mti = "0210".parse().unwrap();
                d.set_text(39, f39);
                let bytes = Bytes::from(spec.encode(&d).unwrap());
                let msg = Message::parse(&spec, bytes).unwrap();
                assert_eq!(approves(&msg, &codes), want, "{name}: F39 {f39}");
            }
        }
    }
}
