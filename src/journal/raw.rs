//! A journal row as the message path leaves it ([`RawRow`]): the fields a
//! row keeps as they lie on the wire (length prefix and data, copied from
//! where the router found them), the PAN already masked, and the
//! exchange's facts as the switch knows them (enums, numbers, names).
//! The journal's writer makes it a [`NewRow`] of texts ([`RawRow::row`]),
//! off the message path: turning fields into text, the fixed words and the
//! row's assembly were about 4,000 of the 5,700 instructions a row cost
//! the message path (`PATH_JOURNAL=1 scripts/path-ir.sh`, docs/bench/journal.md).
//!
//! Only the fields of [`super::row::READ`] are ever copied, and of those the
//! PAN (F2) never as it is: it is masked on the message path, so the clear
//! PAN never leaves it. A field a custom spec flags sensitive is masked
//! there too (its text is made there, as `show` writes it).

use std::sync::Arc;

use super::text::shown;
use super::{AnsweredBy, BadOutcome, Link};
use crate::iso8583::{Mti, Spec};
use crate::route::{DeclineReason, NodeId};
use crate::store::journal::{NewRow, Short};

/// What a [`Raw`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The field is absent: NULL.
    Absent,
    /// The field as it lies on the wire: its length prefix and data.
    Wire,
    /// The field's text, made on the message path (masked): one too long
    /// to copy as it lies, or one the spec flags sensitive.
    Text,
}

/// One field of a row, in `M` inline bytes.
#[derive(Clone, Copy)]
pub struct Raw<const M: usize> {
    kind: Kind,
    len: u8,
    buf: [u8; M],
}

impl<const M: usize> Raw<M> {
    pub const ABSENT: Raw<M> = Raw {
        kind: Kind::Absent,
        len: 0,
        buf: [0; M],
    };

    pub fn is_absent(&self) -> bool {
        self.kind == Kind::Absent
    }

    fn holding(kind: Kind, bytes: &[u8]) -> Raw<M> {
        let mut raw = Raw {
            kind,
            ..Raw::ABSENT
        };
        let n = bytes.len().min(M);
        if let (Some(to), Some(from)) = (raw.buf.get_mut(..n), bytes.get(..n)) {
            to.copy_from_slice(from);
            // n <= M, and every M here is under 256.
            raw.len = u8::try_from(n).unwrap_or(0);
        }
        raw
    }

    fn bytes(&self) -> &[u8] {
        self.buf.get(..usize::from(self.len)).unwrap_or_default()
    }

    /// Field `id` of `spec` as it lies (`wire`: its length prefix and
    /// data), on the message path: copied when it fits and is not
    /// sensitive, else its masked text made here.
    pub fn take(spec: &Spec, id: u16, wire: Option<&[u8]>) -> Raw<M> {
        let Some(wire) = wire else {
            return Raw::ABSENT;
        };
        if wire.len() <= M
            && spec
                .field(id)
                .is_some_and(|def| !crate::iso8583::is_sensitive(def))
        {
            return Raw::holding(Kind::Wire, wire);
        }
        let mut text = Short::<M>::NULL;
        shown(&mut text, spec.field_at(wire, id, 0));
        match text.bytes() {
            Some(bytes) => Raw::holding(Kind::Text, bytes),
            None => Raw::ABSENT,
        }
    }

    /// The field's text as the row keeps it (clipped to `N`): what
    /// `shown` makes of the field the bytes are.
    pub(super) fn text<const N: usize>(&self, spec: &Spec, id: u16) -> Short<N> {
        match self.kind {
            Kind::Absent => Short::NULL,
            // Made by a `Short` of at least `N` bytes: UTF-8.
            Kind::Text => Short::new(std::str::from_utf8(self.bytes()).unwrap_or_default()),
            Kind::Wire => {
                let mut text = Short::NULL;
                shown(&mut text, spec.field_at(self.bytes(), id, 0));
                text
            }
        }
    }
}

/// The fields a row keeps, each as its message had it: the request's,
/// or (where the request lacks one) the answer's; F37 of both, F39 of
/// the answer. Each holds its column's width: a field that takes no more
/// (length prefix included), nearly every one, is copied as it lies; a
/// longer one's text is made on the message path, clipped as the column
/// clips it.
#[derive(Clone, Copy)]
pub struct Fields {
    pub mti: Option<Mti>,
    pub mti_out: Option<Mti>,
    /// Masked on the message path.
    pub pan: Short<24>,
    pub f4: Raw<16>,
    pub f7: Raw<12>,
    pub f11: Raw<12>,
    pub f32: Raw<16>,
    pub f33: Raw<16>,
    pub f37_in: Raw<16>,
    pub f37_out: Raw<16>,
    pub f39: Raw<8>,
    pub f41: Raw<16>,
    pub f42: Raw<24>,
    pub f49: Raw<8>,
}

impl Fields {
    pub const ABSENT: Fields = Fields {
        mti: None,
        mti_out: None,
        pan: Short::NULL,
        f4: Raw::ABSENT,
        f7: Raw::ABSENT,
        f11: Raw::ABSENT,
        f32: Raw::ABSENT,
        f33: Raw::ABSENT,
        f37_in: Raw::ABSENT,
        f37_out: Raw::ABSENT,
        f39: Raw::ABSENT,
        f41: Raw::ABSENT,
        f42: Raw::ABSENT,
        f49: Raw::ABSENT,
    };
}

/// One exchange on its way to the journal's writer. Its `Debug` shows no
/// field's value.
pub struct RawRow {
    pub spec: Arc<Spec>,
    pub service: Arc<str>,
    pub front: &'static str,
    pub link: Link,
    pub node: Option<NodeId>,
    pub from_node: bool,
    pub t_in: i64,
    pub t_out: i64,
    pub latency_us: Option<u64>,
    pub answered_by: AnsweredBy,
    pub late: bool,
    pub reversal_id: Option<i64>,
    pub bad: Option<BadOutcome>,
    pub fields: Fields,
}

impl std::fmt::Debug for RawRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawRow")
            .field("service", &self.service)
            .field("link", &self.link)
            .field("t_in", &self.t_in)
            .field("answered_by", &self.answered_by)
            .finish_non_exhaustive()
    }
}

impl RawRow {
    /// The row's texts, on the journal's writer: the same row the message
    /// path used to make (the tests in `row` compare them).
    pub fn row(&self) -> NewRow {
        let spec: &Spec = &self.spec;
        let f = &self.fields;
        let repeat = f
            .mti
            .and_then(|m| m.as_str().as_bytes().get(3).copied())
            .is_some_and(|d| d.is_ascii_digit() && (d - b'0') % 2 == 1);
        let duplicate = self.answered_by == AnsweredBy::Switch(DeclineReason::Duplicate);
        let unroutable = self.answered_by == AnsweredBy::Switch(DeclineReason::NoHealthyNode);
        NewRow {
            t_in: self.t_in,
            t_out: self.t_out,
            service: Some(Arc::clone(&self.service)),
            front: Short::new(self.front),
            link: link_text(self.link),
            node: Short::opt(self.node.as_ref().map(|n| n.as_str())),
            origin: Short::new(if self.from_node { "node" } else { "front" }),
            mti: Short::new(f.mti.as_ref().map_or("????", Mti::as_str)),
            mti_out: Short::opt(f.mti_out.as_ref().map(Mti::as_str)),
            f11: f.f11.text(spec, 11),
            f7: f.f7.text(spec, 7),
            f37_in: f.f37_in.text(spec, 37),
            f37_out: f.f37_out.text(spec, 37),
            f41: f.f41.text(spec, 41),
            f42: f.f42.text(spec, 42),
            f32: f.f32.text(spec, 32),
            f33: f.f33.text(spec, 33),
            pan: f.pan,
            f4: f.f4.text(spec, 4),
            f49: f.f49.text(spec, 49),
            f39: f.f39.text(spec, 39),
            answered_by: Short::new(self.answered_by.who()),
            reason: Short::opt(self.answered_by.reason()),
            outcome: Short::new(outcome(self, duplicate, unroutable)),
            latency_us: self
                .latency_us
                .map(|us| i64::try_from(us).unwrap_or(i64::MAX)),
            late: self.late,
            duplicate,
            repeat,
            unroutable,
            bad: Short::opt(self.bad.map(|b| b.as_str())),
            reversal_id: self.reversal_id,
        }
    }
}

pub(super) fn link_text(link: Link) -> Short<24> {
    match link {
        // "client#" and the number's digits, without `write!`'s formatting
        // machinery: itoa writes only the digits the number has.
        Link::Client(conn) => {
            let mut digits = itoa::Buffer::new();
            let text = b"client#"
                .iter()
                .chain(digits.format(conn).as_bytes())
                .copied();
            Short::printable(text).unwrap_or_else(|| Short::new("client#?"))
        }
        Link::Peer => Short::new("peer"),
        Link::Node => Short::new("node"),
        Link::Unknown => Short::new("-"),
    }
}

/// The one word a report counts the exchange under.
pub(super) fn outcome(ex: &RawRow, duplicate: bool, unroutable: bool) -> &'static str {
    if ex.late {
        "late"
    } else if ex.bad.is_some() {
        "bad"
    } else if duplicate {
        "duplicate"
    } else if unroutable {
        "unroutable"
    } else {
        match ex.answered_by {
            AnsweredBy::Node | AnsweredBy::Peer => "answered",
            AnsweredBy::Switch(_) => "switch-made",
            AnsweredBy::Stored => "stored",
            AnsweredBy::Withheld(_) | AnsweredBy::Nobody(_) => "unanswered",
        }
    }
}
