//! Masking the bytes a capture keeps. Unlike [`crate::iso8583::Shown`], which
//! masks for display, this rewrites the wire bytes in place and keeps every
//! length, so the capture still frames and parses: digits become a fixed digit
//! (the PAN keeps its first 6 and last 4), letters a fixed letter, binary data
//! zero bytes. Separators (`=`, `^`, BCD `D`) and pad nibbles are kept.

use std::ops::Range;

use crate::iso8583::{
    Align, Bitmap, Data, FieldDef, IsoError, Layout, Mask, Spec, Step, Unit, field_span,
    is_sensitive, mask_of,
};

/// The digit every masked digit becomes.
const DIGIT: u8 = b'0';
/// The letter every masked letter becomes.
const LETTER: u8 = b'X';
/// Shortest PAN that keeps its first 6 and last 4 digits; shorter ones are masked whole.
const PAN_MIN: usize = 13;

/// Whether a capture masks field `def`: exactly the fields display masks
/// ([`is_sensitive`]), so a capture never keeps what `decode` would hide.
pub fn is_masked(def: &FieldDef) -> bool {
    is_sensitive(def)
}

/// Which fields of a spec a capture masks, by field ID: worked out once per
/// spec rather than by a look-up per field of every message (the look-ups
/// were most of what masking cost at 10k requests/s).
#[derive(Clone, Debug)]
pub struct MaskedFields {
    bits: [u64; 4],
    /// The same fields laid out as a message's bitmap, to find the last one
    /// a message carries with a few word operations.
    as_bitmap: Bitmap,
}

impl MaskedFields {
    pub fn of(spec: &Spec) -> MaskedFields {
        let mut bits = [0u64; 4];
        let mut as_bitmap = Bitmap::default();
        for id in 0..256u16 {
            if spec.field(id).is_some_and(is_masked) {
                bits[usize::from(id / 64)] |= 1 << (id % 64);
                as_bitmap.set(id);
            }
        }
        MaskedFields { bits, as_bitmap }
    }

    pub fn contains(&self, id: u16) -> bool {
        self.bits
            .get(usize::from(id / 64))
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }

    /// The highest-numbered masked field among `present`.
    fn last_in(&self, present: &Bitmap) -> Option<u16> {
        (0..3usize).rev().find_map(|w| {
            let both = present.0[w] & self.as_bitmap.0[w];
            // Bit 63 of word `w` is field `64 w + 1`.
            (both != 0).then(|| (w * 64 + 64 - both.trailing_zeros() as usize) as u16)
        })
    }
}

/// Masked fields a message of the shipped specs carries at most: their
/// spans are kept on the stack (more go to a `Vec`).
const SPANS_INLINE: usize = 16;

/// Masks the sensitive fields of one message payload (a frame without its
/// length prefix) in place. Returns how many fields were masked. A payload the
/// spec cannot read is an error: the caller must not keep it as it is.
pub fn mask_payload(spec: &Spec, payload: &mut [u8]) -> Result<usize, IsoError> {
    mask_payload_with(spec, &MaskedFields::of(spec), payload)
}

/// [`mask_payload`] with the spec's masked fields worked out beforehand.
pub fn mask_payload_with(
    spec: &Spec,
    masked: &MaskedFields,
    payload: &mut [u8],
) -> Result<usize, IsoError> {
    let layout = spec.layout(payload)?;
    // The last field to mask: the walk over the fields stops there, and a
    // message with none (most node answers) is not walked at all.
    let Some(last) = masked.last_in(&layout.present) else {
        return Ok(0);
    };
    if let Some(n) = mask_fast(spec, masked, &layout, payload, last) {
        return Ok(n);
    }
    // Something is wrong with this message: the checked walk finds what
    // (and the caller blanks it), or masks what the fast walk would not
    // vouch for.
    let mut spans = Spans::new();
    find_checked(spec, masked, &layout, payload, last, &mut spans)?;
    Ok(spans.mask(payload))
}

/// [`mask_payload`] by the checked walk alone, without the fast step-table
/// walk: what the fast walk must agree with wherever this succeeds (the
/// proptests below and the `mask` fuzz target compare the two).
#[doc(hidden)]
pub fn mask_payload_checked(spec: &Spec, payload: &mut [u8]) -> Result<usize, IsoError> {
    let masked = MaskedFields::of(spec);
    let layout = spec.layout(payload)?;
    let Some(last) = masked.last_in(&layout.present) else {
        return Ok(0);
    };
    let mut spans = Spans::new();
    find_checked(spec, &masked, &layout, payload, last, &mut spans)?;
    Ok(spans.mask(payload))
}

/// The masked fields found in one message: `(definition, data range,
/// units)`, on the stack up to [`SPANS_INLINE`].
struct Spans<'s> {
    inline: [Option<(&'s FieldDef, Range<usize>, usize)>; SPANS_INLINE],
    more: Vec<(&'s FieldDef, Range<usize>, usize)>,
    n: usize,
}

impl<'s> Spans<'s> {
    fn new() -> Spans<'s> {
        Spans {
            inline: [const { None }; SPANS_INLINE],
            more: Vec::new(),
            n: 0,
        }
    }

    fn push(&mut self, def: &'s FieldDef, data: Range<usize>, units: usize) {
        let found = (def, data, units);
        match self.inline.get_mut(self.n) {
            Some(slot) => *slot = Some(found),
            None => self.more.push(found),
        }
        self.n += 1;
    }

    /// Masks every span found; returns how many.
    fn mask(self, payload: &mut [u8]) -> usize {
        for (def, range, units) in self.inline.into_iter().flatten().chain(self.more) {
            if let Some(data) = payload.get_mut(range) {
                mask_field(def, data, units);
            }
        }
        self.n
    }
}

/// Masks the fields up to `last`, crossing the fields before them in the
/// fewest steps (as [`crate::iso8583::Message::index`] does): a fixed field
/// moves the offset by its length from the spec's step table, with no
/// definition read and no bounds check (the offset only grows, so one check
/// that the last field crossed ends inside the payload covers them all); a
/// variable field reads its prefix, checked. Each masked field is masked as
/// it is crossed (masking changes data, never a length prefix), with no
/// list of spans kept. `None` on anything the checked walk
/// ([`find_checked`]) would refuse, perhaps with some fields masked already
/// (the caller then walks again, checked: masking twice is masking once);
/// otherwise it masks what the checked walk finds and returns how many.
fn mask_fast(
    spec: &Spec,
    masked: &MaskedFields,
    layout: &Layout,
    payload: &mut [u8],
    last: u16,
) -> Option<usize> {
    let mut at = layout.fields_at;
    let mut n = 0;
    for w in 0..3 {
        let mut bits = layout.present.0[w];
        while bits != 0 {
            let lz = bits.leading_zeros();
            let bit = 1u64 << (63 - lz);
            bits &= !bit;
            let id = (w as u32 * 64 + lz + 1) as u16;
            let (data, end, units) = match spec.step(id) {
                Step::UNDEFINED => return None,
                Step::VARIABLE => {
                    let span = field_span(spec.field(id)?, payload, at).ok()?;
                    (span.data, span.end, Some(span.units))
                }
                fixed => (at, at.checked_add(fixed as usize)?, None),
            };
            at = end;
            // The masked fields laid out as the bitmap: one AND per field.
            if masked.as_bitmap.0[w] & bit != 0 {
                let def = spec.field(id)?;
                // A fixed field's units are its length (as `Spec::walk` says);
                // one past the payload's end is refused here.
                mask_field(
                    def,
                    payload.get_mut(data..end)?,
                    units.unwrap_or(def.length),
                );
                n += 1;
                if id >= last {
                    // Every field crossed ends at or before `at`.
                    return (at <= payload.len()).then_some(n);
                }
            }
        }
    }
    (at <= payload.len()).then_some(n)
}

/// The masked fields up to `last`, each field checked as it is crossed
/// ([`Spec::walk`]): the walk that names what is wrong with a message.
fn find_checked<'s>(
    spec: &'s Spec,
    masked: &MaskedFields,
    layout: &Layout,
    payload: &[u8],
    last: u16,
    spans: &mut Spans<'s>,
) -> Result<(), IsoError> {
    spec.walk(layout, payload, |def, span| {
        if masked.contains(def.id) {
            spans.push(def, span.data..span.end, span.units);
        }
        def.id < last
    })
}

/// Replaces every byte after the length prefix with a masked form when the
/// message cannot be read: the body is zeroed, the MTI-less payload kept only
/// in length. Used for frames the spec rejects.
pub fn blank_payload(payload: &mut [u8]) {
    payload.fill(0);
}

fn mask_field(def: &FieldDef, data: &mut [u8], units: usize) {
    let keep_pan = mask_of(def) == Mask::Pan;
    match def.data {
        Data::Binary => data.fill(0),
        Data::Ascii => mask_chars(data, keep_pan, |b| match b {
            b'0'..=b'9' => DIGIT,
            b'A'..=b'Z' | b'a'..=b'z' => LETTER,
            _ => b,
        }),
        Data::Ebcdic => mask_chars(data, keep_pan, |b| match b {
            0xF0..=0xF9 => 0xF0,
            0xC1..=0xC9 | 0xD1..=0xD9 | 0xE2..=0xE9 | 0x81..=0x89 | 0x91..=0x99 | 0xA2..=0xA9 => {
                0xE7 // EBCDIC 'X'
            }
            _ => b,
        }),
        Data::Bcd => mask_bcd(def, data, units, keep_pan),
    }
}

/// Masks one-byte characters (`masked` maps each byte to what it becomes,
/// itself when kept); a PAN keeps its first 6 and last 4 characters. The
/// kept ends are cut off the slice rather than tested byte by byte, and the
/// mapping is a select per byte, not a branch: this runs over every masked
/// byte of every captured message.
fn mask_chars(data: &mut [u8], keep_pan: bool, masked: impl Fn(u8) -> u8) {
    let n = data.len();
    let middle = if keep_pan && n >= PAN_MIN {
        &mut data[6..n - 4]
    } else {
        data
    };
    for b in middle {
        *b = masked(*b);
    }
}

/// Masks packed digits nibble by nibble, skipping the pad nibble and keeping
/// non-digit nibbles (the track 2 separator `D`).
fn mask_bcd(def: &FieldDef, data: &mut [u8], units: usize, keep_pan: bool) {
    let nibbles = data.len() * 2;
    // Counted in bytes, a BCD field is two digits a byte with no pad nibble
    // (as the codec reads it); `units` is then its bytes, not its digits.
    let digits = match def.unit {
        Unit::Digits => units.min(nibbles),
        Unit::Bytes | Unit::Bits => nibbles,
    };
    let lead = if def.align == Align::Right {
        nibbles - digits
    } else {
        0
    };
    for d in 0..digits {
        if keep_pan && digits >= PAN_MIN && (d < 6 || d >= digits - 4) {
            continue;
        }
        let at = lead + d;
        let byte = &mut data[at / 2];
        let (shift, keep) = if at % 2 == 0 { (4, 0x0F) } else { (0, 0xF0) };
        let nibble = (*byte >> shift) & 0x0F;
        if nibble <= 9 {
            *byte = (*byte & keep) | ((DIGIT - b'0') << shift);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iso8583::{Decoded, Value};

    fn sample(spec: &Spec) -> Vec<u8> {
        let mut d = Decoded::new(
            crate::iso8583::samples::envelope(spec),
            "0200".parse().unwrap(),
        );
        d.set_text(2, "6228480012345678901");
        d.set_text(3, "000000");
        d.set_text(11, "000123");
        if let Some(def) = spec.field(35) {
            let sep = if def.data == Data::Bcd { "D" } else { "=" };
            d.set_text(35, format!("6228480012345678901{sep}25121011234567"));
        }
        d.set(52, Value::binary(vec![0xAB; 8]));
        let mut out = Vec::new();
        // Some specs need envelope fields: fall back to their sample builder.
        match spec.encode_into(&d, &mut out) {
            Ok(()) => out,
            Err(_) => Vec::new(),
        }
    }

    #[test]
    fn the_last_masked_field_present_is_found_by_words_as_by_the_fields() {
        for name in ["iso87ascii", "cups", "visa-base1"] {
            let spec = Spec::builtin(name).unwrap();
            let masked = MaskedFields::of(&spec);
            for ids in [
                &[3u16, 4, 11][..],
                &[2, 3, 11],
                &[2, 35, 52, 64],
                &[2, 55, 70, 128],
                &[96, 100],
                &[1, 64, 65, 128, 129, 192],
                &[],
            ] {
                let mut present = Bitmap::default();
                ids.iter().for_each(|&id| present.set(id));
                let slow = present.iter().filter(|&id| masked.contains(id)).last();
                assert_eq!(masked.last_in(&present), slow, "{name} {ids:?}");
            }
        }
    }

    #[test]
    fn masks_pan_track_and_pin_keeping_lengths() {
        for name in ["iso87ascii", "iso87binary", "visa-base1", "cups", "cup-pos"] {
            let spec = Spec::builtin(name).unwrap();
            let mut wire = sample(&spec);
            assert!(!wire.is_empty(), "{name}: sample encodes");
            let before = spec.decode(&wire).unwrap();
            let n = mask_payload(&spec, &mut wire).unwrap();
            assert_eq!(n, 3, "{name}");
            let after = spec.decode(&wire).unwrap();
            let pan = after.get(2).and_then(Value::as_text).unwrap();
            assert_eq!(pan, "6228480000000008901", "{name}");
            let t2 = after.get(35).and_then(Value::as_text).unwrap();
            assert_eq!(t2.len(), 34, "{name}");
            assert!(!t2.contains("12345678"), "{name}: {t2}");
            assert!(t2.contains(['=', 'D']), "{name}: separator kept: {t2}");
            assert_eq!(
                after.get(52).and_then(Value::as_binary),
                Some(&[0u8; 8][..])
            );
            assert_eq!(after.get(11), before.get(11), "{name}: others untouched");
        }
    }

    #[test]
    fn masked_fields_are_the_always_masked_and_the_sensitive() {
        let spec = Spec::builtin("cups").unwrap();
        let m = MaskedFields::of(&spec);
        for id in 0..256u16 {
            assert_eq!(
                m.contains(id),
                spec.field(id).is_some_and(is_masked),
                "field {id}"
            );
        }
        assert!(m.contains(2) && m.contains(52) && !m.contains(11));
        assert!(!m.contains(u16::MAX));
    }

    /// The masking as it was before the fast walk: every field checked as
    /// it is crossed.
    fn mask_checked_only(spec: &Spec, payload: &mut [u8]) -> Result<usize, IsoError> {
        mask_payload_checked(spec, payload)
    }

    /// Every builtin spec's sample messages, framed payloads without prefix.
    fn samples_of_every_spec() -> Vec<(Spec, Vec<u8>)> {
        let mut out = Vec::new();
        for name in Spec::builtin_names() {
            let spec = Spec::builtin(name).unwrap();
            let mut payloads = vec![sample(&spec)];
            payloads.extend(crate::iso8583::samples::purchase_payload(&spec));
            payloads.extend(spec.encode(&crate::iso8583::samples::echo(&spec)));
            for p in payloads.into_iter().filter(|p| !p.is_empty()) {
                out.push((spec.clone(), p));
            }
        }
        out
    }

    #[test]
    fn the_fast_walk_masks_every_sample_as_the_checked_walk() {
        let all = samples_of_every_spec();
        assert!(all.len() >= 10, "samples of every spec: {}", all.len());
        for (spec, p) in all {
            let (mut fast, mut slow) = (p.clone(), p.clone());
            let masked = MaskedFields::of(&spec);
            let n = mask_payload_with(&spec, &masked, &mut fast).unwrap();
            assert_eq!(
                Ok(n),
                mask_checked_only(&spec, &mut slow),
                "{}",
                spec.name()
            );
            assert_eq!(fast, slow, "{}", spec.name());
            // And the fast walk itself vouched for it (no fall-back).
            let layout = spec.layout(&p).unwrap();
            let Some(last) = masked.last_in(&layout.present) else {
                assert_eq!(n, 0, "{}: nothing to mask", spec.name());
                continue;
            };
            let mut again = p.clone();
            assert_eq!(
                mask_fast(&spec, &masked, &layout, &mut again, last),
                Some(n),
                "{}",
                spec.name()
            );
            assert_eq!(again, slow, "{}", spec.name());
        }
    }

    proptest::proptest! {
        /// Mangled messages (bytes changed, cut short, bytes added): the
        /// fast walk masks exactly what the checked walk masks, and refuses
        /// exactly what it refuses (a refused payload is blanked whole by
        /// the writer, so what masking left in it does not matter).
        #[test]
        fn the_fast_walk_masks_mangled_messages_as_the_checked_walk(
            which in 0usize..64,
            changes in proptest::collection::vec((0usize..4096, proptest::num::u8::ANY), 0..4),
            keep in proptest::option::of(0usize..4096),
            extra in proptest::collection::vec(proptest::num::u8::ANY, 0..8),
        ) {
            let all = samples_of_every_spec();
            let (spec, mut p) = all[which % all.len()].clone();
            for (at, b) in changes {
                let n = p.len();
                p[at % n] = b;
            }
            if let Some(k) = keep {
                p.truncate(k % (p.len() + 1));
            }
            p.extend(extra);
            let (mut fast, mut slow) = (p.clone(), p);
            let a = mask_payload_with(&spec, &MaskedFields::of(&spec), &mut fast).map_err(|e| e.to_string());
            let b = mask_checked_only(&spec, &mut slow).map_err(|e| e.to_string());
            let ok = a.is_ok();
            proptest::prop_assert_eq!(a, b);
            if ok {
                proptest::prop_assert_eq!(fast, slow);
            }
        }
    }

    proptest::proptest! {
        /// Characters are masked as they were byte by byte: digits to `0`,
        /// letters to `X` (EBCDIC alike), all else kept, and a PAN of 13+
        /// characters keeps its first 6 and last 4.
        #[test]
        fn characters_mask_as_byte_by_byte(
            data in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
            keep_pan: bool,
        ) {
            let n = data.len();
            let kept = |i: usize| keep_pan && n >= PAN_MIN && (i < 6 || i >= n - 4);
            let mut ascii = data.clone();
            mask_chars(&mut ascii, keep_pan, |b| match b {
                b'0'..=b'9' => DIGIT,
                b'A'..=b'Z' | b'a'..=b'z' => LETTER,
                _ => b,
            });
            for (i, (&was, &now)) in data.iter().zip(&ascii).enumerate() {
                let expected = if kept(i) {
                    was
                } else if was.is_ascii_digit() {
                    b'0'
                } else if was.is_ascii_alphabetic() {
                    b'X'
                } else {
                    was
                };
                proptest::prop_assert_eq!(now, expected, "byte {}", i);
            }
        }
    }

    #[test]
    fn bcd_counted_in_bytes_is_masked_in_every_digit() {
        // cup-pos with track 2 counted in bytes (a custom spec may say so).
        let toml = include_str!("../../specs/cup-pos.toml").replace(
            "id = 35\nname = \"Track 2 data\"\nformat = \"llvar\"\nlength = 37\ndata = \"bcd\"\nalign = \"left\"\npad = \"F\"",
            "id = 35\nname = \"Track 2 data\"\nformat = \"llvar\"\nlength = 19\ndata = \"bcd\"\nunit = \"bytes\"",
        );
        let spec = Spec::from_toml(&toml).unwrap();
        assert_eq!(spec.field(35).unwrap().unit, Unit::Bytes);
        let mut d = Decoded::new(
            crate::iso8583::samples::envelope(&spec),
            "0200".parse().unwrap(),
        );
        d.set_text(3, "000000");
        d.set_text(11, "000123");
        d.set_text(35, "6228480012345678901D2512101123456789");
        let mut wire = spec.encode(&d).unwrap();
        assert_eq!(mask_payload(&spec, &mut wire), Ok(1));
        let after = spec.decode(&wire).unwrap();
        let t2 = after.get(35).and_then(Value::as_text).unwrap();
        assert_eq!(t2, "0000000000000000000D0000000000000000");
    }

    #[test]
    fn unreadable_payload_is_an_error() {
        let spec = Spec::builtin("iso87ascii").unwrap();
        let mut junk = b"02".to_vec();
        assert!(mask_payload(&spec, &mut junk).is_err());
    }
}
