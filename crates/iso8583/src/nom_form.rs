//! The same field reads as `codec::read_prefix` and `codec::span`, written with nom's
//! primitives (`take`, `be_u8` / `be_u16`, `fold_many_m_n` over `satisfy` /
//! `verify`). Same results, same typed errors; kept so `benches/codec.rs` can
//! time both walks in one run (`field_walk/*`), which is what decided that the
//! switch walks with the hand-written form (numbers in BENCHMARKS.md).

use nom::IResult;
use nom::bytes::complete::take;
use nom::character::complete::satisfy;
use nom::combinator::verify;
use nom::error::Error;
use nom::multi::fold_many_m_n;
use nom::number::complete::{be_u8, be_u16};

use super::codec::Span;
use super::error::IsoError;
use super::message::Message;
use super::spec::{FieldDef, LengthEncoding};

type Res<'a, T> = IResult<&'a [u8], T, Error<&'a [u8]>>;

/// [`Message::validate`] walked with the nom form of the field reads: the
/// end of the last field, or the first field error. For the benchmark and
/// the tests that hold both forms to the same answers.
pub fn validate(msg: &Message<'_>) -> Result<usize, IsoError> {
    let (spec, layout, payload) = (msg.spec(), msg.layout(), &msg.payload()[..]);
    let mut at = layout.fields_at;
    for w in 0..3 {
        let mut bits = layout.present.0[w];
        while bits != 0 {
            let lz = bits.leading_zeros();
            bits &= !(1u64 << (63 - lz));
            let id = (w as u32 * 64 + lz + 1) as u16;
            let def = spec
                .field(id)
                .ok_or(IsoError::UndefinedField { id, offset: at })?;
            at = span(def, payload, at)?.end;
        }
    }
    Ok(at)
}

/// `codec::span` with nom: the fixed fast path inline, the rest out of line.
#[inline(always)]
pub(crate) fn span(def: &FieldDef, buf: &[u8], at: usize) -> Result<Span, IsoError> {
    if def.length_encoding.is_none() {
        let input = buf.get(at..).unwrap_or_default();
        if let Ok((_, _)) = take::<_, _, ()>(def.fixed_len)(input) {
            return Ok(Span {
                start: at,
                data: at,
                end: at + def.fixed_len,
                units: def.length,
            });
        }
    }
    span_var(def, buf, at)
}

#[inline(never)]
fn span_var(def: &FieldDef, buf: &[u8], at: usize) -> Result<Span, IsoError> {
    let input = buf.get(at..).unwrap_or_default();
    let (after, units, wire) = match def.length_encoding {
        None => (input, def.length, def.fixed_len),
        Some(enc) => {
            let (after, units) = read_prefix(def, enc, input, at)?;
            let wire = def.wire_len(units).ok_or(IsoError::PartialByte {
                id: def.id,
                offset: at,
                len: units,
            })?;
            (after, units, wire)
        }
    };
    let data = at + (input.len() - after.len());
    take::<_, _, ()>(wire)(after).map_err(|_| IsoError::FieldTruncated {
        id: def.id,
        offset: data,
        need: wire,
        have: after.len(),
    })?;
    Ok(Span {
        start: at,
        data,
        end: data + wire,
        units,
    })
}

/// `codec::read_prefix` with nom, on `input` = the buffer from `at` on.
/// Returns the input after the prefix and the length in units.
fn read_prefix<'a>(
    def: &FieldDef,
    enc: LengthEncoding,
    input: &'a [u8],
    at: usize,
) -> Result<(&'a [u8], usize), IsoError> {
    let n = def.prefix_len;
    let (after, digits) = take::<_, _, ()>(n)(input).map_err(|_| IsoError::FieldTruncated {
        id: def.id,
        offset: at,
        need: n,
        have: input.len(),
    })?;
    let parsed: Res<'_, usize> = match enc {
        LengthEncoding::Ascii => fold_many_m_n(
            n,
            n,
            satisfy(|c| c.is_ascii_digit()),
            || 0usize,
            |len, c| len * 10 + (c as usize - '0' as usize),
        )(digits),
        LengthEncoding::Ebcdic => fold_many_m_n(
            n,
            n,
            verify(be_u8, |b: &u8| (0xF0..=0xF9).contains(b)),
            || 0usize,
            |len, b| len * 10 + usize::from(b - 0xF0),
        )(digits),
        LengthEncoding::Bcd => fold_many_m_n(
            n,
            n,
            verify(be_u8, |b: &u8| b >> 4 <= 9 && b & 0xF <= 9),
            || 0usize,
            |len, b| len * 100 + usize::from((b >> 4) * 10 + (b & 0xF)),
        )(digits),
        LengthEncoding::Binary if n == 1 => be_u8(digits).map(|(r, v)| (r, usize::from(v))),
        LengthEncoding::Binary if n == 2 => be_u16(digits).map(|(r, v)| (r, usize::from(v))),
        LengthEncoding::Binary => {
            fold_many_m_n(n, n, be_u8, || 0usize, |len, b| (len << 8) | usize::from(b))(digits)
        }
    };
    let len = match parsed {
        Ok((_, len)) => len,
        Err(nom::Err::Error(e) | nom::Err::Failure(e)) => {
            // nom's error holds the input where it stopped: the bad digit.
            let i = n - e.input.len().min(n);
            return Err(IsoError::BadLengthDigit {
                id: def.id,
                offset: at + i,
                format: def.format.label(),
                byte: digits.get(i).copied().unwrap_or_default(),
                encoding: enc.label(),
            });
        }
        Err(nom::Err::Incomplete(_)) => {
            return Err(IsoError::FieldTruncated {
                id: def.id,
                offset: at,
                need: n,
                have: input.len(),
            });
        }
    };
    if len > def.length {
        return Err(IsoError::LengthTooLong {
            id: def.id,
            offset: at,
            format: def.format.label(),
            len,
            max: def.length,
        });
    }
    Ok((after, len))
}
