//! How the whole-message index crosses each field of a spec: a table
//! precomputed from the field definitions, read one entry per field.

use super::*;

/// How the whole-message index crosses one field, precomputed from its
/// definition so that the walk reads one 16-byte entry per field and never
/// branches on an encoding: a variable field's prefix is read through its
/// encoding's digit table ([`PREFIX_VALUE`]), its units turned into bytes
/// by `(units + round) >> shift`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cross {
    /// Bytes of the length prefix (0: a fixed field, or no field).
    pub(crate) prefix: u8,
    /// Which of [`PREFIX_VALUE`]'s tables reads the prefix.
    pub(crate) table: u8,
    /// Units to bytes: `(units + round) >> shift` (BCD digits 1, 1; bits 0, 3).
    pub(crate) round: u8,
    pub(crate) shift: u8,
    /// A unit count with any of these bits set is not a whole number of
    /// bytes (bits: 7).
    pub(crate) whole: u16,
    /// What each prefix byte multiplies the length read so far by (10,
    /// 100 or 256).
    pub(crate) base: u16,
    /// A fixed field's length, a variable field's maximum, in its units.
    pub(crate) units: u32,
    /// A fixed field's bytes; `u32::MAX` for no field, which takes the
    /// walk past the end of any payload the index accepts.
    pub(crate) fixed: u32,
}

/// A byte that is not a digit of its prefix encoding.
pub(crate) const NOT_A_DIGIT: u16 = u16::MAX;

/// The value of one prefix byte, per length encoding (the index is
/// [`Cross::table`]): ASCII and EBCDIC digits 0..=9, a BCD byte two digits
/// 0..=99, a binary byte itself; [`NOT_A_DIGIT`] for anything else.
pub(crate) static PREFIX_VALUE: [[u16; 256]; 4] = prefix_values();

const fn prefix_values() -> [[u16; 256]; 4] {
    let mut t = [[NOT_A_DIGIT; 256]; 4];
    let mut b = 0usize;
    while b < 256 {
        let v = b as u16;
        if v >= b'0' as u16 && v <= b'9' as u16 {
            t[0][b] = v - b'0' as u16;
        }
        if v >= 0xF0 && v <= 0xF9 {
            t[1][b] = v - 0xF0;
        }
        let (hi, lo) = (v >> 4, v & 0xF);
        if hi <= 9 && lo <= 9 {
            t[2][b] = hi * 10 + lo;
        }
        t[3][b] = v;
        b += 1;
    }
    t
}

impl Cross {
    /// No field of that id: crossing it goes past any payload's end.
    pub(super) const UNDEFINED: Cross = Cross {
        prefix: 0,
        table: 0,
        round: 0,
        shift: 0,
        whole: 0,
        base: 0,
        units: 0,
        fixed: u32::MAX,
    };

    pub(super) fn of(d: &FieldDef) -> Cross {
        // Validated at load: a length fits 16 bits, so every count here fits.
        let units = u32::try_from(d.length).unwrap_or(u32::MAX);
        let (round, shift, whole) = match (d.data, d.unit) {
            (Data::Bcd, Unit::Digits) => (1, 1, 0),
            (_, Unit::Bits) => (0, 3, 7),
            _ => (0, 0, 0),
        };
        let Some(enc) = d.length_encoding else {
            return Cross {
                units,
                fixed: u32::try_from(d.fixed_len).unwrap_or(u32::MAX),
                ..Cross::default()
            };
        };
        let (table, base) = match enc {
            LengthEncoding::Ascii => (0, 10),
            LengthEncoding::Ebcdic => (1, 10),
            LengthEncoding::Bcd => (2, 100),
            LengthEncoding::Binary => (3, 256),
        };
        Cross {
            // At most 4 (`FieldDef::prefix_bytes`).
            prefix: d.prefix_len as u8,
            table,
            round,
            shift,
            whole,
            base,
            units,
            fixed: 0,
        }
    }
}
