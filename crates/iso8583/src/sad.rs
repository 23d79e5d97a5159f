//! Sensitive authentication data (PCI DSS 3.3.1): what no switch may keep
//! after authorization, encrypted or not. Before the switch stores a
//! message it owes (an advice it acknowledged, a reversal), the message is
//! cut down to what a host needs to book it:
//!
//! - the track fields F35 (track 2), F36 (track 3) and F45 (track 1), and
//!   the PIN block F52, are removed;
//! - F55's EMV data keeps every tag but the track-equivalent and PIN ones
//!   ([`SAD_EMV_TAGS`]): tag 56 and 9F6B (track 1 / track 2 data), 57
//!   (track 2 equivalent), 9F1F and 9F20 (track 1 / track 2 discretionary
//!   data), 99 (transaction PIN data). The cryptogram and its inputs
//!   (9F26, 9F10, 9F36, 95, ...) stay: an issuer books an advice by them,
//!   and they are not SAD.
//!
//! - a field the spec splits into subelements (Mastercard's DE 48) loses
//!   the subelements the spec flags `sensitive`: the card verification
//!   code (CVC 2, subelement 92), the cardholder authentication value, key
//!   material ([`strip_sensitive_subelements`]).
//!
//! A message whose PAN is only in its track data (no F2), whose F55 is not
//! BER-TLV, or whose subelements do not follow their layout, cannot be cut
//! down without losing what the host needs: it is refused, and the switch
//! forwards it instead of storing it (never acknowledging it itself).

use thiserror::Error;

use super::decoded::{Decoded, Value};
use super::spec::{Spec, SubelementError};

/// Fields that are sensitive authentication data as a whole.
pub const SAD_FIELDS: [u16; 4] = [35, 36, 45, 52];

/// The field that carries EMV (ICC) data as BER-TLV.
pub const EMV_FIELD: u16 = 55;

/// EMV tags that are sensitive authentication data: track-equivalent data
/// and PIN data.
pub const SAD_EMV_TAGS: [u32; 6] = [0x56, 0x57, 0x99, 0x9F1F, 0x9F20, 0x9F6B];

/// Why a message cannot be kept without its sensitive authentication data.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum SadError {
    /// The PAN is in the track data only: removing it would leave the host
    /// no card to book.
    #[error("F{track} carries the only PAN (no F2): it cannot be stored without it")]
    PanOnlyInTrack { track: u16 },
    /// F55 is not BER-TLV (or not binary): its sensitive tags cannot be
    /// found to be removed.
    #[error("F55: {reason} at byte {offset}: its sensitive EMV tags cannot be removed")]
    BadEmv { offset: usize, reason: &'static str },
    /// A field with sensitive subelements does not follow its layout: they
    /// cannot be found to be removed.
    #[error("{0}: its sensitive subelements cannot be removed")]
    BadSubelements(#[from] SubelementError),
}

/// What [`strip_sad`] took out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stripped {
    /// Fields removed whole, ascending.
    pub fields: Vec<u16>,
    /// EMV tags removed from F55, in message order.
    pub emv_tags: Vec<u32>,
}

impl Stripped {
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty() && self.emv_tags.is_empty()
    }
}

/// Removes the sensitive authentication data from `d` (see the module
/// notes); on an error `d` is unchanged.
pub fn strip_sad(d: &mut Decoded) -> Result<Stripped, SadError> {
    if !d.has(2)
        && let Some(track) = [35, 45].into_iter().find(|&id| d.has(id))
    {
        return Err(SadError::PanOnlyInTrack { track });
    }
    let emv = match d.get(EMV_FIELD) {
        None => None,
        Some(Value::Binary(tlv)) => Some(without_sad_tags(tlv)?),
        Some(Value::Text(_)) => {
            return Err(SadError::BadEmv {
                offset: 0,
                reason: "text, not binary BER-TLV",
            });
        }
    };
    let mut out = Stripped::default();
    for id in SAD_FIELDS {
        if d.remove(id).is_some() {
            out.fields.push(id);
        }
    }
    if let Some((kept, removed)) = emv {
        if !removed.is_empty() {
            d.set(EMV_FIELD, Value::Binary(kept));
        }
        out.emv_tags = removed;
    }
    Ok(out)
}

/// Removes from `d` every subelement its spec flags `sensitive`, in each
/// field the spec splits into subelements; returns `(field, tag)` of each
/// removed. The rest of the field is kept as it was, in order (the lead,
/// then the other subelements with their tags and lengths). On an error
/// `d` is unchanged.
pub fn strip_sensitive_subelements(
    spec: &Spec,
    d: &mut Decoded,
) -> Result<Vec<(u16, String)>, SadError> {
    let mut changed = Vec::new();
    let mut removed = Vec::new();
    for def in spec.fields() {
        let Some(layout) = def.subelements.as_ref().filter(|l| !l.sensitive.is_empty()) else {
            continue;
        };
        let Some(Value::Text(text)) = d.get(def.id) else {
            continue;
        };
        let parts = layout.parse(def.id, text)?;
        let mut kept = String::with_capacity(text.len());
        let mut cut = false;
        for part in &parts {
            match part.tag {
                Some(tag) if layout.is_sensitive(tag) => {
                    removed.push((def.id, tag.to_string()));
                    cut = true;
                }
                Some(tag) => {
                    let width = layout.length;
                    kept.push_str(tag);
                    kept.push_str(&format!("{:0width$}", part.value.len()));
                    kept.push_str(part.value);
                }
                None => kept.push_str(part.value),
            }
        }
        if cut {
            changed.push((def.id, kept));
        }
    }
    for (id, text) in changed {
        d.set(id, Value::Text(text));
    }
    Ok(removed)
}

/// The TLV objects of `tlv` without the [`SAD_EMV_TAGS`], and the tags
/// removed. Only the top level is walked: the SAD tags are primitive and
/// sent at the top level of F55.
fn without_sad_tags(tlv: &[u8]) -> Result<(Vec<u8>, Vec<u32>), SadError> {
    let mut kept = Vec::with_capacity(tlv.len());
    let mut removed = Vec::new();
    let mut at = 0;
    while at < tlv.len() {
        // Padding between objects (00 or FF) is allowed by EMV Book 3.
        if matches!(tlv[at], 0x00 | 0xFF) {
            kept.push(tlv[at]);
            at += 1;
            continue;
        }
        let (tag, end) = tlv_object(tlv, at)?;
        if SAD_EMV_TAGS.contains(&tag) {
            removed.push(tag);
        } else {
            kept.extend_from_slice(&tlv[at..end]);
        }
        at = end;
    }
    Ok((kept, removed))
}

/// The tag of the BER-TLV object at `at` and where the object ends.
fn tlv_object(tlv: &[u8], at: usize) -> Result<(u32, usize), SadError> {
    let bad = |offset, reason| SadError::BadEmv { offset, reason };
    let byte = |i: usize| tlv.get(i).copied().ok_or(bad(i, "truncated"));
    let mut i = at;
    let first = byte(i)?;
    let mut tag = u32::from(first);
    i += 1;
    if first & 0x1F == 0x1F {
        // Subsequent tag bytes while bit 8 is set; EMV tags are at most 3
        // bytes.
        loop {
            let b = byte(i)?;
            tag = (tag << 8) | u32::from(b);
            i += 1;
            if b & 0x80 == 0 {
                break;
            }
            if i - at >= 3 {
                return Err(bad(i, "tag longer than 3 bytes"));
            }
        }
    }
    let len_byte = byte(i)?;
    i += 1;
    let len = match len_byte {
        0..=0x7F => usize::from(len_byte),
        0x81 => {
            let n = usize::from(byte(i)?);
            i += 1;
            n
        }
        0x82 => {
            let n = usize::from(byte(i)?) << 8 | usize::from(byte(i + 1)?);
            i += 2;
            n
        }
        _ => return Err(bad(i - 1, "length form not 1 to 3 bytes")),
    };
    let end = i.checked_add(len).filter(|&e| e <= tlv.len());
    end.map(|e| (tag, e))
        .ok_or(bad(i, "value runs past the field"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Mti, Spec, samples};

    fn d() -> Decoded {
        Decoded::new(Vec::new(), Mti::new(*b"0220").unwrap())
    }

    #[test]
    fn track_pin_and_emv_track_equivalents_go_the_cryptogram_stays() {
        let mut m = d();
        m.set_text(2, "6212345678901234");
        m.set_text(35, "6212345678901234=28121010000012345678");
        m.set_text(52, "0123456789ABCDEF");
        let emv = [
            &[0x9F, 0x26, 0x02, 0xAA, 0xBB][..], // cryptogram: kept
            &[0x57, 0x03, 0x62, 0x12, 0xD2],     // track 2 equivalent
            &[0x9F, 0x1F, 0x02, 0x31, 0x32],     // track 1 discretionary
            &[0x5F, 0x34, 0x01, 0x01],           // PAN sequence: kept
            &[0x99, 0x81, 0x02, 0x12, 0x34],     // PIN data, long form
        ]
        .concat();
        m.set_binary(55, emv);
        let out = strip_sad(&mut m).unwrap();
        assert_eq!(out.fields, [35, 52]);
        assert_eq!(out.emv_tags, [0x57, 0x9F1F, 0x99]);
        assert!(m.has(2) && !m.has(35) && !m.has(52));
        let kept = [0x9F, 0x26, 0x02, 0xAA, 0xBB, 0x5F, 0x34, 0x01, 0x01];
        assert_eq!(m.get(55).and_then(Value::as_binary), Some(&kept[..]));
    }

    #[test]
    fn a_pan_only_in_the_track_or_emv_that_is_not_tlv_is_refused_unchanged() {
        let mut m = d();
        m.set_text(35, "6212345678901234=2812");
        assert_eq!(
            strip_sad(&mut m),
            Err(SadError::PanOnlyInTrack { track: 35 })
        );
        assert!(m.has(35));
        for bad in [
            &[0x9F][..],
            &[0x57, 0x05, 0x01],
            &[0x9F, 0x81, 0x81, 0x81, 0x01],
            &[0x57, 0x84, 0, 0, 0, 1],
        ] {
            let mut m = d();
            m.set_text(2, "6212345678901234");
            m.set_text(52, "0123456789ABCDEF");
            m.set_binary(55, bad.to_vec());
            assert!(
                matches!(strip_sad(&mut m), Err(SadError::BadEmv { .. })),
                "{bad:02X?}"
            );
            assert!(m.has(52), "unchanged on error");
        }
    }

    #[test]
    fn the_sample_purchase_keeps_only_what_a_host_books() {
        for name in ["cups", "cup-pos", "visa-base1", "iso87binary"] {
            let spec = Spec::builtin(name).unwrap();
            let mut m = samples::purchase(&spec);
            let had_track = m.has(35);
            let out = strip_sad(&mut m).unwrap();
            assert_eq!(out.fields.contains(&35), had_track, "{name}");
            for id in SAD_FIELDS {
                assert!(!m.has(id), "{name}: F{id}");
            }
            assert!(spec.encode(&m).is_ok(), "{name}: still encodes");
        }
    }
}

#[cfg(test)]
mod spec_tests {
    use crate::Spec;

    /// Mastercard's DE 48 keeps its category code and its other
    /// subelements; the CVC 2 (92) and the authentication value (43) go.
    #[test]
    fn sensitive_subelements_leave_a_stored_message_and_the_rest_stays() {
        let spec = Spec::builtin("mastercard").expect("mastercard");
        let mut d = crate::Decoded::new(Vec::new(), "0120".parse().expect("mti"));
        d.set_text(48, "R2002CV9203123430800000000");
        let removed = super::strip_sensitive_subelements(&spec, &mut d).expect("strips");
        assert_eq!(removed, [(48, "92".to_string()), (48, "43".to_string())]);
        assert_eq!(d.get(48).and_then(|v| v.as_text()), Some("R2002CV"));
        // Nothing sensitive: the field as it was.
        let mut plain = crate::Decoded::new(Vec::new(), "0120".parse().expect("mti"));
        plain.set_text(48, "R2002CV");
        assert!(
            super::strip_sensitive_subelements(&spec, &mut plain)
                .expect("ok")
                .is_empty()
        );
        assert_eq!(plain.get(48).and_then(|v| v.as_text()), Some("R2002CV"));
        // A DE 48 that does not follow its layout cannot be cleaned: refused.
        let mut bad = crate::Decoded::new(Vec::new(), "0120".parse().expect("mti"));
        bad.set_text(48, "R92");
        assert!(super::strip_sensitive_subelements(&spec, &mut bad).is_err());
        assert_eq!(bad.get(48).and_then(|v| v.as_text()), Some("R92"));
    }

    /// A spec cannot put sensitive authentication data back into the
    /// reversal it makes the switch store.
    #[test]
    fn a_reversal_template_with_track_pin_or_emv_data_is_refused_naming_the_key() {
        let base = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../specs/cups.toml"
        ))
        .expect("cups.toml");
        for id in [35, 36, 45, 52, 55] {
            let text = base.replacen(
                "reversal_fields = [2, ",
                &format!("reversal_fields = [{id}, 2, "),
                1,
            );
            assert_ne!(text, base, "the template was edited");
            let e = Spec::from_toml(&text).map(|_| ()).unwrap_err().to_string();
            assert!(
                e.contains("integrity.reversal_fields") && e.contains(&format!("F{id}")),
                "{e}"
            );
            let text = base.replacen(
                "answer_fields = [4, 38]",
                &format!("answer_fields = [4, {id}, 38]"),
                1,
            );
            assert_ne!(text, base, "the template was edited");
            let e = Spec::from_toml(&text).map(|_| ()).unwrap_err().to_string();
            assert!(
                e.contains("integrity.answer_fields") && e.contains(&format!("F{id}")),
                "{e}"
            );
        }
    }
}
