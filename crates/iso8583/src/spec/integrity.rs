//! `[integrity]` of a spec: how the switch builds what it owes a host in
//! this dialect (the reversal advice, which F39 codes approve), how it
//! takes a host's answer to it, and which requests move no money; parsed
//! and checked against the fields the spec defines.

use serde::Deserialize;

use super::MAX_FIELD;
use crate::error::{KeyError, KeyReason};
use crate::mti::Mti;

/// `[integrity]`: how the switch builds the messages it owes a host in this
/// dialect: the reversal advice it sends for a late approval, and which F39
/// codes approve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Integrity {
    /// MTI of a reversal advice (e.g. 0420; its repeats end in 1: 0421).
    pub reversal_mti: Mti,
    /// Fields copied from the original request into the reversal, where the
    /// original has them (ascending).
    pub reversal_fields: Vec<u16>,
    /// F39 of the reversal: why the switch reverses (a late answer).
    pub reversal_reason: String,
    /// The field that carries the original data elements (F90: original MTI,
    /// F11, F7, F32, F33), or none in a dialect without it.
    pub original_data: Option<u16>,
    /// F39 codes that approve (default `00` approved, `08` honour with
    /// identification, `10` partial, `11` VIP, `16` approved with a track 3
    /// update).
    pub approval_codes: Vec<String>,
    /// F70 codes of network management that belongs to the institution, not
    /// to the link: key exchange and cut-over. On simplex and duplex fronts
    /// these go to the service's key node and its answer back to the peer;
    /// every other code (sign-on, sign-off, echo test) is the link's own and
    /// the switch answers it. Default: [`INSTITUTION_F70`].
    pub institution_f70: Vec<String>,
    /// How a host's answer to a message the switch owes (its reversal, an
    /// advice it stored) is taken, by F39: see [`SafAnswerClass`].
    pub saf_answers: SafAnswerCodes,
    /// F3 (processing code) prefixes of requests that move no money: never
    /// reversed (a balance inquiry's late approval only confuses the host).
    /// Default: `30` (available funds inquiry), `31` (balance inquiry).
    pub no_reversal_f3: Vec<String>,
    /// Fields the reversal of an approval takes from the host's answer
    /// when it has them, over the original's: F38, the approval code the
    /// issuer matches a reversal on (default), and in dialects whose hosts
    /// reverse the amount they approved, F4.
    pub answer_fields: Vec<u16>,
    /// The field that carries the amount actually approved when an answer
    /// approved less than was asked (a partial approval, F39 10): F95,
    /// "replacement amounts", its first 12 digits the answered F4, while
    /// F4 keeps the amount asked. None: the dialect reverses by F4 alone.
    pub replacement_amounts: Option<u16>,
    /// What a repeat of an owed message (0421, 0221) carries in F11 and F7.
    pub repeat_keys: RepeatKeys,
}

/// F11 and F7 of a repeat the switch sends for what it owes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RepeatKeys {
    /// The first attempt's F11 and F7: a host recognises the repeat by
    /// them (ISO 8583's repeat; UnionPay, VISA).
    #[default]
    Keep,
    /// A fresh STAN from the switch's own sequence and F7 = the time of
    /// this attempt, for hosts that want every message unique by F11 and
    /// F7 within their clock window, and match the repeat by F90.
    Fresh,
}

/// What a host's answer to an owed message does to its store entry, by F39.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SafAnswerClass {
    /// The host took it: the entry is delivered.
    Done,
    /// The host took it but says something a reconciliation team must look
    /// at ("original not found", "duplicate"): delivered, flagged.
    Reconcile,
    /// The host could not take it now (system error, MAC or format error,
    /// no F39 at all): tried again, as an unanswered attempt.
    Retry,
    /// The host refused it: a dead letter for an operator.
    Dead,
}

/// The F39 codes of each [`SafAnswerClass`]; a code in none is
/// [`SafAnswerClass::Dead`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SafAnswerCodes {
    pub done: Vec<String>,
    pub reconcile: Vec<String>,
    pub retry: Vec<String>,
}

impl Default for SafAnswerCodes {
    fn default() -> Self {
        let v = |codes: &[&str]| codes.iter().map(|c| (*c).to_string()).collect();
        SafAnswerCodes {
            done: v(&["00"]),
            // 25: unable to locate the original; 94: a duplicate (already
            // reversed or booked).
            reconcile: v(&["25", "94"]),
            // 19 re-enter, 30 format error, 68 too late, 91 issuer or
            // switch inoperative, 92 no route, 96 system malfunction, 98
            // (UnionPay) no answer from the issuer, A0 (UnionPay) MAC
            // failure.
            retry: v(&["19", "30", "68", "91", "92", "96", "98", "A0"]),
        }
    }
}

/// The institution's network management codes when a spec names none: key
/// reset (101), key exchange by key kind (161-164) and cut-over (201). A
/// switch that answered these itself would keep the new working key from
/// every host, and every MAC and PIN block after it would fail.
pub const INSTITUTION_F70: [&str; 6] = ["101", "161", "162", "163", "164", "201"];

/// 0420, the reversal advice, checked at compile time.
const REVERSAL_ADVICE: Mti = match Mti::new(*b"0420") {
    Some(m) => m,
    None => panic!("0420 is four digits"),
};

impl Default for Integrity {
    fn default() -> Self {
        Integrity {
            reversal_mti: REVERSAL_ADVICE,
            reversal_fields: vec![2, 3, 4, 7, 11, 12, 13, 22, 25, 32, 33, 37, 41, 42, 49],
            reversal_reason: "68".into(),
            original_data: Some(90),
            approval_codes: ["00", "08", "10", "11", "16"].map(String::from).to_vec(),
            institution_f70: INSTITUTION_F70.iter().map(|c| (*c).into()).collect(),
            saf_answers: SafAnswerCodes::default(),
            no_reversal_f3: vec!["30".into(), "31".into()],
            answer_fields: vec![38],
            replacement_amounts: None,
            repeat_keys: RepeatKeys::Keep,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct IntegrityFile {
    reversal_mti: Option<String>,
    reversal_fields: Option<Vec<u16>>,
    reversal_reason: Option<String>,
    original_data: Option<u16>,
    pub(super) approval_codes: Option<Vec<String>>,
    institution_f70: Option<Vec<String>>,
    saf_done: Option<Vec<String>>,
    saf_reconcile: Option<Vec<String>>,
    saf_retry: Option<Vec<String>>,
    no_reversal_f3: Option<Vec<String>>,
    answer_fields: Option<Vec<u16>>,
    replacement_amounts: Option<u16>,
    repeat_keys: Option<RepeatKeys>,
}

/// `[integrity]` checked against the fields the spec defines; absent keys
/// take [`Integrity::default`]'s values.
pub(super) fn validate_integrity(
    file: &IntegrityFile,
    slot: &[u8; MAX_FIELD as usize + 1],
) -> Result<Integrity, KeyError> {
    let bad = |key: &'static str, reason: KeyReason| KeyError { key, reason };
    let defined = |id: u16| slot.get(id as usize).copied().unwrap_or(0) != 0;
    let mut out = Integrity::default();
    if let Some(text) = &file.reversal_mti {
        let mti: Mti = text
            .parse()
            .map_err(|_| bad("integrity.reversal_mti", KeyReason::NotAnMti(text.clone())))?;
        if mti.class() != 4 || !mti.is_request() {
            return Err(bad("integrity.reversal_mti", KeyReason::NotAReversal(mti)));
        }
        out.reversal_mti = mti;
    }
    if let Some(fields) = &file.reversal_fields {
        // A reversal is stored until delivered: it must never carry
        // sensitive authentication data (docs/store.md).
        if let Some(id) = fields
            .iter()
            .find(|id| crate::sad::SAD_FIELDS.contains(id) || **id == crate::sad::EMV_FIELD)
        {
            return Err(bad(
                "integrity.reversal_fields",
                KeyReason::SensitiveField(*id),
            ));
        }
        let mut fields = fields.clone();
        fields.sort_unstable();
        fields.dedup();
        out.reversal_fields = fields;
    }
    // A field this dialect does not define is simply never copied.
    out.reversal_fields.retain(|&id| defined(id));
    if let Some(reason) = &file.reversal_reason {
        if reason.len() != 2 || !reason.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(bad(
                "integrity.reversal_reason",
                KeyReason::NotAResponseCode(reason.clone()),
            ));
        }
        out.reversal_reason = reason.clone();
    }
    match file.original_data {
        Some(0) => out.original_data = None,
        Some(id) if !defined(id) => {
            return Err(bad(
                "integrity.original_data",
                KeyReason::FieldUndefined(id),
            ));
        }
        Some(id) => out.original_data = Some(id),
        None => out.original_data = out.original_data.filter(|&id| defined(id)),
    }
    if let Some(codes) = &file.approval_codes {
        out.approval_codes = response_codes("integrity.approval_codes", codes)?;
    }
    let classes = [
        (
            "integrity.saf_done",
            &file.saf_done,
            &mut out.saf_answers.done,
        ),
        (
            "integrity.saf_reconcile",
            &file.saf_reconcile,
            &mut out.saf_answers.reconcile,
        ),
        (
            "integrity.saf_retry",
            &file.saf_retry,
            &mut out.saf_answers.retry,
        ),
    ];
    for (key, given, codes) in classes {
        if let Some(given) = given {
            *codes = response_codes(key, given)?;
        }
    }
    let a = &out.saf_answers;
    if let Some(c) = a.done.iter().chain(&a.reconcile).find(|c| {
        a.done
            .iter()
            .chain(&a.reconcile)
            .chain(&a.retry)
            .filter(|d| d == c)
            .count()
            > 1
    }) {
        return Err(bad(
            "integrity.saf_done",
            KeyReason::InSeveralClasses(c.clone()),
        ));
    }
    if let Some(prefixes) = &file.no_reversal_f3 {
        if let Some(bad) = prefixes
            .iter()
            .find(|p| !(1..=6).contains(&p.len()) || !p.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(KeyError {
                key: "integrity.no_reversal_f3",
                reason: KeyReason::NotAProcessingCode(bad.clone()),
            });
        }
        out.no_reversal_f3 = prefixes.clone();
    }
    let a = &out.saf_answers;
    if a.done.is_empty() {
        return Err(bad("integrity.saf_done", KeyReason::NoDoneCode));
    }
    if let Some(fields) = &file.answer_fields {
        if let Some(id) = fields.iter().find(|id| {
            crate::sad::SAD_FIELDS.contains(id) || **id == crate::sad::EMV_FIELD || !defined(**id)
        }) {
            return Err(bad(
                "integrity.answer_fields",
                KeyReason::NotAnAnswerField(*id),
            ));
        }
        let mut fields = fields.clone();
        fields.sort_unstable();
        fields.dedup();
        out.answer_fields = fields;
    }
    out.answer_fields.retain(|&id| defined(id));
    match file.replacement_amounts {
        Some(0) | None => {}
        Some(id) if !defined(id) || !defined(4) => {
            return Err(bad(
                "integrity.replacement_amounts",
                KeyReason::ReplacementUndefined(id),
            ));
        }
        Some(id) => out.replacement_amounts = Some(id),
    }
    if let Some(keys) = file.repeat_keys {
        if keys == RepeatKeys::Fresh && !(defined(7) && defined(11)) {
            return Err(bad("integrity.repeat_keys", KeyReason::FreshWithoutKeys));
        }
        out.repeat_keys = keys;
    }
    if let Some(codes) = &file.institution_f70 {
        if let Some(bad) = codes
            .iter()
            .find(|c| !(1..=4).contains(&c.len()) || !c.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(KeyError {
                key: "integrity.institution_f70",
                reason: KeyReason::NotAnF70Code(bad.clone()),
            });
        }
        out.institution_f70 = codes.clone();
    }
    Ok(out)
}

/// 2-character response codes, as `key` lists them.
fn response_codes(key: &'static str, codes: &[String]) -> Result<Vec<String>, KeyError> {
    match codes
        .iter()
        .find(|c| c.len() != 2 || !c.bytes().all(|b| b.is_ascii_alphanumeric()))
    {
        Some(bad) => Err(KeyError {
            key,
            reason: KeyReason::NotAResponseCode(bad.clone()),
        }),
        None => Ok(codes.to_vec()),
    }
}
