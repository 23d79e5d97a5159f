//! Texts of one field, given by a config or a spec (approval codes, F70
//! network-management codes), compared with a message's field on the
//! message path without decoding it.
//!
//! A text means the field's text form, the one `decode` and the journal
//! show: "00" in F39 is `30 30` on an ASCII dialect and `F0 F0` on an EBCDIC
//! one (VISA BASE I); "301" in a BCD F70 is `03 01` or `30 1F` by its pad.
//! Each text is packed into the field's wire form once, by the spec, when
//! the set is built; a match is then a compare of the field's data bytes,
//! with the one pad nibble of an odd-length BCD value left out (any pad is
//! accepted on input, as [`FieldRef::logical`] does).

use super::codec;
use super::error::{IsoError, ValueReason};
use super::message::FieldRef;
use super::spec::{Align, Data, Spec, Unit};

/// Texts of field `id` of one spec, each in its wire form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldCodes {
    id: u16,
    codes: Vec<Packed>,
}

/// One text as the field carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Packed {
    /// The value's length in the field's units (digits, characters, bytes).
    units: usize,
    /// The field's data bytes for it, pad nibble included.
    wire: Box<[u8]>,
    /// Where an odd-length BCD value's pad nibble is, ignored in a compare.
    pad: Pad,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pad {
    None,
    /// The high nibble of the first byte (right-aligned digits).
    FirstHigh,
    /// The low nibble of the last byte (left-aligned digits).
    LastLow,
}

impl Spec {
    /// `texts` as values of field `id` of this spec, packed once for
    /// [`FieldCodes::matches`]. Fails, naming the field, when the spec has
    /// no field `id` or a text cannot be a value of it (a letter in a BCD
    /// field, a length a fixed field does not have).
    pub fn field_codes<S: AsRef<str>>(&self, id: u16, texts: &[S]) -> Result<FieldCodes, IsoError> {
        let def = self.field(id).ok_or(IsoError::NoSuchField { id })?;
        let mut codes = Vec::with_capacity(texts.len());
        for text in texts {
            let logical = text.as_ref().as_bytes();
            let units = codec::units_of(def, logical.len())?;
            codec::check_units(def, units)?;
            let width = def.wire_len(units).ok_or(IsoError::BadValue {
                id,
                reason: ValueReason::BitsNotWholeBytes(units),
            })?;
            let mut wire = vec![0u8; width].into_boxed_slice();
            codec::pack(def, logical, units, &mut wire)?;
            let odd_bcd = def.data == Data::Bcd && def.unit == Unit::Digits && units % 2 == 1;
            let pad = match (odd_bcd, def.align) {
                (false, _) => Pad::None,
                (true, Align::Right) => Pad::FirstHigh,
                (true, Align::Left) => Pad::LastLow,
            };
            codes.push(Packed { units, wire, pad });
        }
        Ok(FieldCodes { id, codes })
    }
}

impl FieldCodes {
    /// The field these codes are values of.
    pub fn field(&self) -> u16 {
        self.id
    }

    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    /// Whether `field` (of the spec the set was built for) holds one of the
    /// texts. A field of another number never matches.
    #[inline]
    pub fn matches(&self, field: &FieldRef<'_>) -> bool {
        field.def().id == self.id && self.codes.iter().any(|c| c.is(field.data(), field.units()))
    }

    /// Whether field `id` of `msg`'s parse is one of the texts: `false` when
    /// the field is absent or cannot be read.
    pub fn in_message(&self, msg: &super::Message<'_>) -> bool {
        matches!(msg.field(self.id), Ok(Some(f)) if self.matches(&f))
    }
}

impl Packed {
    #[inline]
    fn is(&self, data: &[u8], units: usize) -> bool {
        if units != self.units || data.len() != self.wire.len() {
            return false;
        }
        match self.pad {
            Pad::None => data == &*self.wire,
            Pad::FirstHigh => data[0] & 0x0F == self.wire[0] & 0x0F && data[1..] == self.wire[1..],
            Pad::LastLow => {
                let n = data.len() - 1;
                data[n] & 0xF0 == self.wire[n] & 0xF0 && data[..n] == self.wire[..n]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use crate::{Decoded, Message, Spec};

    const HEAD: &str = "name = \"t\"\n[framing]\nprefix = \"binary2\"\nmax_frame = 4000\n\
        [mti]\nencoding = \"ascii\"\n[bitmap]\nencoding = \"binary\"\nsecondary = true\n";

    /// A spec whose F39 is `f39` (a `[[field]]` body) and F70 `f70`.
    fn spec(f39: &str, f70: &str) -> Spec {
        let text = format!(
            "{HEAD}[[field]]\nid = 11\nname = \"STAN\"\nformat = \"fixed\"\nlength = 6\ndata = \"ascii\"\n\
             [[field]]\nid = 39\nname = \"Response code\"\n{f39}\n\
             [[field]]\nid = 70\nname = \"NM code\"\n{f70}\n"
        );
        Spec::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    /// A 0810 with F39 and F70 set as texts, encoded by the spec, parsed.
    fn message(spec: &Spec, f39: &str, f70: &str) -> Message<'static> {
        let mut d = Decoded::new(Vec::new(), "0810".parse().unwrap());
        d.set_text(11, "000001");
        d.set_text(39, f39);
        d.set_text(70, f70);
        let bytes = spec.encode(&d).unwrap();
        // The parse borrows the spec: tests leak one per case.
        let spec: &'static Spec = Box::leak(Box::new(spec.clone()));
        Message::parse(spec, Bytes::from(bytes)).unwrap()
    }

    fn approves(spec: &Spec, f39: &str) -> bool {
        let codes = spec.field_codes(39, &["00", "10", "11"]).unwrap();
        codes.in_message(&message(spec, f39, "301"))
    }

    #[test]
    fn approval_codes_match_in_ascii_ebcdic_and_bcd() {
        let fixed = "format = \"fixed\"\nlength = 2\n";
        let f70 = "format = \"fixed\"\nlength = 3\ndata = \"bcd\"";
        for data in ["ascii", "ebcdic", "bcd"] {
            let s = spec(&format!("{fixed}data = \"{data}\""), f70);
            for yes in ["00", "10", "11"] {
                assert!(approves(&s, yes), "{data}: {yes} approves");
            }
            for no in ["05", "01", "68", "91"] {
                assert!(!approves(&s, no), "{data}: {no} does not");
            }
        }
        // The wire forms differ; only the texts agree.
        let ebcdic = spec(&format!("{fixed}data = \"ebcdic\""), f70);
        let m = message(&ebcdic, "00", "301");
        assert_eq!(m.field(39).unwrap().unwrap().data(), [0xF0, 0xF0]);
    }

    #[test]
    fn odd_bcd_codes_match_whatever_the_pad() {
        for (align, pad) in [("right", "0"), ("right", "F"), ("left", "F"), ("left", "0")] {
            let f70 = format!(
                "format = \"fixed\"\nlength = 3\ndata = \"bcd\"\nalign = \"{align}\"\npad = \"{pad}\""
            );
            let s = spec("format = \"fixed\"\nlength = 2\ndata = \"ascii\"", &f70);
            let codes = s.field_codes(70, &["101", "161"]).unwrap();
            let m = message(&s, "00", "101");
            let f = m.field(70).unwrap().unwrap();
            assert!(codes.matches(&f), "{align}/{pad}");
            assert!(!codes.matches(&message(&s, "00", "301").field(70).unwrap().unwrap()));
            // Another sender's pad nibble: still "101".
            let mut bytes = m.payload().to_vec();
            let r = f.range();
            let at = if align == "right" { r.start } else { r.end - 1 };
            bytes[at] ^= if align == "right" { 0xA0 } else { 0x0A };
            let s2: &'static Spec = Box::leak(Box::new(s.clone()));
            let other = Message::parse(s2, Bytes::from(bytes)).unwrap();
            let f = other.field(70).unwrap().unwrap();
            assert!(f.eq_logical(b"101") && codes.matches(&f), "{align}/{pad}");
        }
    }

    #[test]
    fn variable_fields_compare_length_and_value() {
        let s = spec(
            "format = \"fixed\"\nlength = 2\ndata = \"ascii\"",
            "format = \"llvar\"\nlength = 4\ndata = \"ebcdic\"\nlength_encoding = \"ascii\"",
        );
        let codes = s.field_codes(70, &["30", "301"]).unwrap();
        for (f70, want) in [("301", true), ("30", true), ("3", false), ("3010", false)] {
            let m = message(&s, "00", f70);
            assert_eq!(codes.in_message(&m), want, "{f70}");
        }
    }

    #[test]
    fn a_text_the_field_cannot_hold_is_refused_naming_the_field() {
        let s = spec(
            "format = \"fixed\"\nlength = 2\ndata = \"bcd\"",
            "format = \"fixed\"\nlength = 3\ndata = \"bcd\"",
        );
        let e = s.field_codes(39, &["0"]).unwrap_err().to_string();
        assert!(e.contains("39"), "{e}");
        assert!(s.field_codes(39, &["Z1"]).is_err());
        assert!(s.field_codes(48, &["00"]).is_err(), "no such field");
        // Another field's number never matches.
        let codes = s.field_codes(39, &["00"]).unwrap();
        let m = message(&s, "00", "001");
        assert!(!codes.matches(&m.field(70).unwrap().unwrap()));
    }
}
