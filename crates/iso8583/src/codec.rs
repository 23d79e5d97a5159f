//! Field-level codecs: EBCDIC, BCD nibbles, length prefixes, and the packing of
//! logical values into wire bytes. Everything here works on slices and never
//! allocates, so that the view, the patchers and the encoder can share it.

use super::error::{IsoError, ValueReason};
use super::spec::{Align, Data, FieldDef, LengthEncoding, Unit};

/// EBCDIC (code page 037) and Latin-1, one byte each way. The mapping is a
/// bijection, so every EBCDIC byte round-trips through text.
pub mod ebcdic {
    /// EBCDIC byte → Latin-1 code point.
    pub static TO_LATIN1: [u8; 256] = [
        0x00, 0x01, 0x02, 0x03, 0x9C, 0x09, 0x86, 0x7F, 0x97, 0x8D, 0x8E, 0x0B, 0x0C, 0x0D, 0x0E,
        0x0F, 0x10, 0x11, 0x12, 0x13, 0x9D, 0x85, 0x08, 0x87, 0x18, 0x19, 0x92, 0x8F, 0x1C, 0x1D,
        0x1E, 0x1F, 0x80, 0x81, 0x82, 0x83, 0x84, 0x0A, 0x17, 0x1B, 0x88, 0x89, 0x8A, 0x8B, 0x8C,
        0x05, 0x06, 0x07, 0x90, 0x91, 0x16, 0x93, 0x94, 0x95, 0x96, 0x04, 0x98, 0x99, 0x9A, 0x9B,
        0x14, 0x15, 0x9E, 0x1A, 0x20, 0xA0, 0xE2, 0xE4, 0xE0, 0xE1, 0xE3, 0xE5, 0xE7, 0xF1, 0xA2,
        0x2E, 0x3C, 0x28, 0x2B, 0x7C, 0x26, 0xE9, 0xEA, 0xEB, 0xE8, 0xED, 0xEE, 0xEF, 0xEC, 0xDF,
        0x21, 0x24, 0x2A, 0x29, 0x3B, 0xAC, 0x2D, 0x2F, 0xC2, 0xC4, 0xC0, 0xC1, 0xC3, 0xC5, 0xC7,
        0xD1, 0xA6, 0x2C, 0x25, 0x5F, 0x3E, 0x3F, 0xF8, 0xC9, 0xCA, 0xCB, 0xC8, 0xCD, 0xCE, 0xCF,
        0xCC, 0x60, 0x3A, 0x23, 0x40, 0x27, 0x3D, 0x22, 0xD8, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66,
        0x67, 0x68, 0x69, 0xAB, 0xBB, 0xF0, 0xFD, 0xFE, 0xB1, 0xB0, 0x6A, 0x6B, 0x6C, 0x6D, 0x6E,
        0x6F, 0x70, 0x71, 0x72, 0xAA, 0xBA, 0xE6, 0xB8, 0xC6, 0xA4, 0xB5, 0x7E, 0x73, 0x74, 0x75,
        0x76, 0x77, 0x78, 0x79, 0x7A, 0xA1, 0xBF, 0xD0, 0xDD, 0xDE, 0xAE, 0x5E, 0xA3, 0xA5, 0xB7,
        0xA9, 0xA7, 0xB6, 0xBC, 0xBD, 0xBE, 0x5B, 0x5D, 0xAF, 0xA8, 0xB4, 0xD7, 0x7B, 0x41, 0x42,
        0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0xAD, 0xF4, 0xF6, 0xF2, 0xF3, 0xF5, 0x7D, 0x4A,
        0x4B, 0x4C, 0x4D, 0x4E, 0x4F, 0x50, 0x51, 0x52, 0xB9, 0xFB, 0xFC, 0xF9, 0xFA, 0xFF, 0x5C,
        0xF7, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5A, 0xB2, 0xD4, 0xD6, 0xD2, 0xD3, 0xD5,
        0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0xB3, 0xDB, 0xDC, 0xD9, 0xDA,
        0x9F,
    ];

    /// Latin-1 code point → EBCDIC byte.
    pub static FROM_LATIN1: [u8; 256] = invert(&TO_LATIN1);

    const fn invert(t: &[u8; 256]) -> [u8; 256] {
        let mut out = [0u8; 256];
        let mut i = 0;
        while i < 256 {
            out[t[i] as usize] = i as u8;
            i += 1;
        }
        out
    }

    /// One EBCDIC byte as Latin-1 (ASCII for the printable ASCII range).
    #[inline]
    pub fn to_ascii(b: u8) -> u8 {
        TO_LATIN1[b as usize]
    }

    /// One Latin-1 (ASCII) byte as EBCDIC.
    #[inline]
    pub fn from_ascii(b: u8) -> u8 {
        FROM_LATIN1[b as usize]
    }
}

/// Upper-case hex digit of a nibble.
#[inline]
pub(crate) fn hex_digit(n: u8) -> u8 {
    b"0123456789ABCDEF"[(n & 0xF) as usize]
}

/// Value of a hex digit (either case).
#[inline]
pub(crate) fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// Reads the length prefix of variable field `def` at `at`: the value, in the
/// field's units. Checks the digits and the maximum; not the bytes that follow.
#[inline]
pub(crate) fn read_prefix(def: &FieldDef, buf: &[u8], at: usize) -> Result<usize, IsoError> {
    let Some(enc) = def.length_encoding else {
        return Ok(def.length);
    };
    let n = def.prefix_len;
    let bytes = buf
        .get(at..)
        .and_then(|b| b.get(..n))
        .ok_or(IsoError::FieldTruncated {
            id: def.id,
            offset: at,
            need: n,
            have: buf.len().saturating_sub(at),
        })?;
    let bad_digit = |i: usize, byte: u8| IsoError::BadLengthDigit {
        id: def.id,
        offset: at + i,
        format: def.format.label(),
        byte,
        encoding: enc.label(),
    };
    let mut len = 0usize;
    match enc {
        LengthEncoding::Ascii => {
            for (i, &b) in bytes.iter().enumerate() {
                if !b.is_ascii_digit() {
                    return Err(bad_digit(i, b));
                }
                len = len * 10 + (b - b'0') as usize;
            }
        }
        LengthEncoding::Ebcdic => {
            for (i, &b) in bytes.iter().enumerate() {
                if !(0xF0..=0xF9).contains(&b) {
                    return Err(bad_digit(i, b));
                }
                len = len * 10 + (b - 0xF0) as usize;
            }
        }
        LengthEncoding::Bcd => {
            for (i, &b) in bytes.iter().enumerate() {
                let (hi, lo) = (b >> 4, b & 0xF);
                if hi > 9 || lo > 9 {
                    return Err(bad_digit(i, b));
                }
                len = len * 100 + (hi * 10 + lo) as usize;
            }
        }
        LengthEncoding::Binary => {
            for &b in bytes {
                len = (len << 8) | b as usize;
            }
        }
    }
    if len > def.length {
        return Err(IsoError::LengthTooLong {
            id: def.id,
            offset: at,
            format: def.format.label(),
            len,
            max: def.length,
        });
    }
    Ok(len)
}

/// Writes the length prefix of variable field `def` for `len` units into `dst`
/// (exactly `def.prefix_len` bytes). `len` must not exceed `def.length`.
pub(crate) fn write_prefix(def: &FieldDef, len: usize, dst: &mut [u8]) {
    let Some(enc) = def.length_encoding else {
        return;
    };
    let mut v = len;
    match enc {
        LengthEncoding::Ascii | LengthEncoding::Ebcdic => {
            let zero = if enc == LengthEncoding::Ascii {
                b'0'
            } else {
                0xF0
            };
            for b in dst.iter_mut().rev() {
                *b = zero + (v % 10) as u8;
                v /= 10;
            }
        }
        LengthEncoding::Bcd => {
            for b in dst.iter_mut().rev() {
                let two = v % 100;
                *b = (((two / 10) << 4) | (two % 10)) as u8;
                v /= 100;
            }
        }
        LengthEncoding::Binary => {
            for b in dst.iter_mut().rev() {
                *b = (v & 0xFF) as u8;
                v >>= 8;
            }
        }
    }
}

/// Where one field lies in a payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Start of the field (its length prefix, if any).
    pub start: usize,
    /// Start of its data.
    pub data: usize,
    /// End of its data (= start of the next field).
    pub end: usize,
    /// Its length in the field's units.
    pub units: usize,
}

/// Finds the extent of field `def` starting at `at`, reading only its length prefix.
///
/// A fixed field that fits is answered inline (most fields on the routing path
/// are fixed); variable fields and every error go through [`span_var`], so the
/// large `Result` it builds stays out of the hot loop.
#[inline(always)]
pub fn span(def: &FieldDef, buf: &[u8], at: usize) -> Result<Span, IsoError> {
    if def.length_encoding.is_none() {
        let end = at.saturating_add(def.fixed_len);
        if end <= buf.len() {
            return Ok(Span {
                start: at,
                data: at,
                end,
                units: def.length,
            });
        }
    }
    span_var(def, buf, at)
}

/// [`span`] for variable fields, and for every error.
#[inline(never)]
fn span_var(def: &FieldDef, buf: &[u8], at: usize) -> Result<Span, IsoError> {
    let (units, data, wire) = if def.length_encoding.is_none() {
        (def.length, at, def.fixed_len)
    } else {
        let units = read_prefix(def, buf, at)?;
        let data = at + def.prefix_len;
        let wire = def.wire_len(units).ok_or(IsoError::PartialByte {
            id: def.id,
            offset: at,
            len: units,
        })?;
        (units, data, wire)
    };
    let end = data + wire;
    if end > buf.len() {
        return Err(IsoError::FieldTruncated {
            id: def.id,
            offset: data,
            need: wire,
            have: buf.len().saturating_sub(data),
        });
    }
    Ok(Span {
        start: at,
        data,
        end,
        units,
    })
}

/// Number of units a logical value of `len` bytes has (text characters, BCD
/// digits, binary bytes), or an error naming why it cannot be a value of `def`.
pub(crate) fn units_of(def: &FieldDef, len: usize) -> Result<usize, IsoError> {
    match (def.data, def.unit) {
        (Data::Bcd, Unit::Bytes) if !len.is_multiple_of(2) => Err(IsoError::BadValue {
            id: def.id,
            reason: ValueReason::HexDigitsNotWholeBytes(len),
        }),
        (Data::Bcd, Unit::Bytes) => Ok(len / 2),
        (Data::Binary, Unit::Bits) => Ok(len * 8),
        _ => Ok(len),
    }
}

/// Checks that `units` fits `def` (exactly for fixed, at most for variable).
pub(crate) fn check_units(def: &FieldDef, units: usize) -> Result<(), IsoError> {
    let ok = if def.is_fixed() {
        units == def.length
    } else {
        units <= def.length
    };
    if ok {
        return Ok(());
    }
    let reason = if def.is_fixed() {
        ValueReason::NotFixedLength {
            units,
            length: def.length,
        }
    } else {
        ValueReason::TooLong {
            units,
            max: def.length,
        }
    };
    Err(IsoError::BadValue { id: def.id, reason })
}

/// Packs a logical value (Latin-1 text, BCD hex digits, or raw bytes) of `units`
/// units into `dst`, which must be exactly the field's data width.
pub(crate) fn pack(
    def: &FieldDef,
    logical: &[u8],
    units: usize,
    dst: &mut [u8],
) -> Result<(), IsoError> {
    match def.data {
        Data::Ascii | Data::Binary => dst.copy_from_slice(logical),
        Data::Ebcdic => {
            for (d, &s) in dst.iter_mut().zip(logical) {
                *d = ebcdic::from_ascii(s);
            }
        }
        Data::Bcd => {
            // Nibble stream: optional leading pad, the digits, optional trailing pad.
            let odd = def.unit == Unit::Digits && units % 2 == 1;
            let lead = odd && def.align == Align::Right;
            let nib = |i: usize| -> Result<u8, IsoError> {
                let j = if lead { i.wrapping_sub(1) } else { i };
                match logical.get(j) {
                    Some(&c) => hex_value(c).ok_or_else(|| IsoError::BadValue {
                        id: def.id,
                        reason: ValueReason::NotBcd(j + 1),
                    }),
                    None => Ok(def.pad),
                }
            };
            for (k, d) in dst.iter_mut().enumerate() {
                *d = (nib(2 * k)? << 4) | nib(2 * k + 1)?;
            }
        }
    }
    Ok(())
}

/// The logical bytes of a field's data, one at a time, without allocating:
/// Latin-1 text for ASCII / EBCDIC, hex digits for BCD (pad removed), raw bytes
/// for binary.
pub(crate) fn logical<'a>(def: &FieldDef, data: &'a [u8], units: usize) -> Logical<'a> {
    let (skip, count) = match (def.data, def.unit) {
        (Data::Bcd, Unit::Digits) => {
            let odd = units % 2 == 1 && units <= 2 * data.len();
            let skip = usize::from(odd && def.align == Align::Right);
            (skip, units.min(2 * data.len()))
        }
        (Data::Bcd, _) => (0, 2 * data.len()),
        _ => (0, data.len()),
    };
    Logical {
        data,
        kind: def.data,
        pos: skip,
        end: skip + count,
    }
}

/// Iterator returned by [`logical`].
#[derive(Clone)]
pub(crate) struct Logical<'a> {
    data: &'a [u8],
    kind: Data,
    pos: usize,
    end: usize,
}

impl Iterator for Logical<'_> {
    type Item = u8;

    #[inline]
    fn next(&mut self) -> Option<u8> {
        if self.pos >= self.end {
            return None;
        }
        let i = self.pos;
        self.pos += 1;
        match self.kind {
            Data::Bcd => {
                let b = *self.data.get(i / 2)?;
                Some(hex_digit(if i.is_multiple_of(2) { b >> 4 } else { b }))
            }
            Data::Ebcdic => self.data.get(i).map(|&b| ebcdic::to_ascii(b)),
            Data::Ascii | Data::Binary => self.data.get(i).copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end.saturating_sub(self.pos);
        (n, Some(n))
    }
}

impl ExactSizeIterator for Logical<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Format, Mask};

    fn def(format: Format, length: usize, data: Data, unit: Unit) -> FieldDef {
        let enc = (format != Format::Fixed).then_some(LengthEncoding::Ascii);
        let mut d = FieldDef {
            id: 2,
            name: "t".into(),
            format,
            length,
            unit,
            data,
            align: Align::Right,
            pad: 0,
            length_encoding: enc,
            sensitive: false,
            mask: Mask::Full,
            subelements: None,
            prefix_len: format.digits(),
            fixed_len: 0,
        };
        if format == Format::Fixed {
            d.fixed_len = d.wire_len(length).unwrap();
        }
        d
    }

    fn roundtrip(d: &FieldDef, text: &[u8]) -> Vec<u8> {
        let units = units_of(d, text.len()).unwrap();
        let mut wire = vec![0u8; d.wire_len(units).unwrap()];
        pack(d, text, units, &mut wire).unwrap();
        let back: Vec<u8> = logical(d, &wire, units).collect();
        assert_eq!(back, text.to_ascii_uppercase());
        wire
    }

    #[test]
    fn ebcdic_is_a_bijection_and_maps_digits_and_letters() {
        for b in 0..=255u8 {
            assert_eq!(ebcdic::from_ascii(ebcdic::to_ascii(b)), b);
        }
        assert_eq!(ebcdic::from_ascii(b'0'), 0xF0);
        assert_eq!(ebcdic::from_ascii(b'A'), 0xC1);
        assert_eq!(ebcdic::from_ascii(b' '), 0x40);
        let d = def(Format::Fixed, 3, Data::Ebcdic, Unit::Bytes);
        assert_eq!(roundtrip(&d, b"A1 "), [0xC1, 0xF1, 0x40]);
    }

    #[test]
    fn bcd_right_and_left_odd_and_even() {
        let mut d = def(Format::Fixed, 3, Data::Bcd, Unit::Digits);
        assert_eq!(roundtrip(&d, b"840"), [0x08, 0x40]);
        d.align = Align::Left;
        assert_eq!(roundtrip(&d, b"051"), [0x05, 0x10]);
        d.pad = 0xF;
        assert_eq!(roundtrip(&d, b"051"), [0x05, 0x1F]);
        let d = def(Format::Fixed, 4, Data::Bcd, Unit::Digits);
        assert_eq!(roundtrip(&d, b"1202"), [0x12, 0x02]);
        // Track 2: D as separator, hex nibbles kept.
        let mut d = def(Format::Llvar, 37, Data::Bcd, Unit::Digits);
        d.align = Align::Left;
        d.pad = 0xF;
        assert_eq!(roundtrip(&d, b"62D2812"), [0x62, 0xD2, 0x81, 0x2F]);
        assert_eq!(roundtrip(&d, b"62d2"), [0x62, 0xD2]);
    }

    #[test]
    fn bcd_rejects_non_hex_digits() {
        let d = def(Format::Fixed, 2, Data::Bcd, Unit::Digits);
        let mut wire = [0u8; 1];
        let e = pack(&d, b"1=", 2, &mut wire).unwrap_err();
        assert!(e.to_string().contains("BCD digit 2"), "{e}");
    }

    #[test]
    fn bcd_counted_in_bytes_and_binary_in_bits() {
        let d = def(Format::Llvar, 10, Data::Bcd, Unit::Bytes);
        assert_eq!(units_of(&d, 4).unwrap(), 2);
        assert!(units_of(&d, 3).is_err());
        assert_eq!(roundtrip(&d, b"12AB"), [0x12, 0xAB]);
        let d = def(Format::Fixed, 64, Data::Binary, Unit::Bits);
        assert_eq!(d.fixed_len, 8);
        assert_eq!(units_of(&d, 8).unwrap(), 64);
    }

    #[test]
    fn prefixes_in_every_encoding() {
        let cases: [(Format, LengthEncoding, usize, &[u8]); 9] = [
            (Format::Llvar, LengthEncoding::Ascii, 37, b"37"),
            (Format::Lllvar, LengthEncoding::Ascii, 104, b"104"),
            (Format::Llllvar, LengthEncoding::Ascii, 1234, b"1234"),
            (Format::Llvar, LengthEncoding::Ebcdic, 19, &[0xF1, 0xF9]),
            (Format::Llvar, LengthEncoding::Bcd, 19, &[0x19]),
            (Format::Lllvar, LengthEncoding::Bcd, 104, &[0x01, 0x04]),
            (Format::Llllvar, LengthEncoding::Bcd, 1234, &[0x12, 0x34]),
            (Format::Llvar, LengthEncoding::Binary, 200, &[200]),
            (Format::Lllvar, LengthEncoding::Binary, 999, &[0x03, 0xE7]),
        ];
        for (format, enc, len, wire) in cases {
            let mut d = def(format, 9999, Data::Ascii, Unit::Bytes);
            d.length_encoding = Some(enc);
            d.prefix_len = wire.len();
            let mut out = vec![0u8; wire.len()];
            write_prefix(&d, len, &mut out);
            assert_eq!(out, wire, "{format:?} {enc:?}");
            assert_eq!(read_prefix(&d, wire, 0).unwrap(), len);
        }
    }

    #[test]
    fn prefix_errors_name_field_and_offset() {
        let mut d = def(Format::Llvar, 37, Data::Ascii, Unit::Bytes);
        d.id = 35;
        let buf = b"xxxxx41";
        assert_eq!(
            read_prefix(&d, buf, 5).unwrap_err().to_string(),
            "field 35 at offset 5: LL length 41 exceeds max 37"
        );
        let e = read_prefix(&d, b"4x", 0).unwrap_err();
        assert!(matches!(
            e,
            IsoError::BadLengthDigit {
                offset: 1,
                byte: b'x',
                ..
            }
        ));
        let e = read_prefix(&d, b"4", 0).unwrap_err();
        assert!(matches!(
            e,
            IsoError::FieldTruncated {
                need: 2,
                have: 1,
                ..
            }
        ));
        let e = span(&d, b"05abc", 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "field 35 at offset 2: truncated (need 5 bytes, have 3)"
        );
        d.length_encoding = Some(LengthEncoding::Bcd);
        d.prefix_len = 1;
        assert!(matches!(
            read_prefix(&d, &[0x1A], 0),
            Err(IsoError::BadLengthDigit { .. })
        ));
    }

    /// Every prefix encoding and format, with small maxima so that both
    /// "too long" and "fits" happen on random bytes.
    fn walk_defs() -> Vec<FieldDef> {
        let mut defs = Vec::new();
        for (format, max) in [
            (Format::Llvar, 19),
            (Format::Lllvar, 120),
            (Format::Llllvar, 999),
        ] {
            for enc in [
                LengthEncoding::Ascii,
                LengthEncoding::Ebcdic,
                LengthEncoding::Bcd,
                LengthEncoding::Binary,
            ] {
                for (data, unit) in [
                    (Data::Ascii, Unit::Bytes),
                    (Data::Bcd, Unit::Digits),
                    (Data::Binary, Unit::Bits),
                ] {
                    let mut d = def(format, max, data, unit);
                    d.length_encoding = Some(enc);
                    let digits = format.digits();
                    d.prefix_len = match enc {
                        LengthEncoding::Ascii | LengthEncoding::Ebcdic => digits,
                        LengthEncoding::Bcd => digits.div_ceil(2),
                        LengthEncoding::Binary => 1 + usize::from(digits > 2),
                    };
                    defs.push(d);
                }
            }
        }
        defs.push(def(Format::Fixed, 6, Data::Bcd, Unit::Digits));
        defs.push(def(Format::Fixed, 12, Data::Ascii, Unit::Bytes));
        defs.push(def(Format::Fixed, 64, Data::Binary, Unit::Bits));
        defs
    }

    #[test]
    fn nom_form_reads_known_prefixes_like_the_hand_form() {
        for d in walk_defs() {
            for buf in [
                &b"0512345"[..],
                b"\xF0\xF5abcde",
                b"\x05abcde",
                b"",
                b"9",
                b"x1abc",
            ] {
                for at in 0..=buf.len() {
                    assert_eq!(
                        super::super::nom_form::span(&d, buf, at),
                        span(&d, buf, at),
                        "{:?} {:?} at {at} of {buf:?}",
                        d.format,
                        d.length_encoding
                    );
                }
            }
        }
    }

    proptest::proptest! {
        /// The nom form of the field read gives the hand form's answer, value
        /// or typed error, on any bytes at any offset.
        #[test]
        fn nom_form_agrees_with_hand_form(
            buf in proptest::collection::vec(proptest::prop_oneof![
                proptest::strategy::Just(b'0'),
                proptest::strategy::Just(0xF1u8),
                proptest::strategy::Just(0x01u8),
                proptest::num::u8::ANY,
            ], 0..40),
            at in 0usize..42,
        ) {
            for d in walk_defs() {
                proptest::prop_assert_eq!(super::super::nom_form::span(&d, &buf, at), span(&d, &buf, at));
            }
        }
    }
}
