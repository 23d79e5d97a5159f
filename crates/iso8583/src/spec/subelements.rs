//! `[field.subelements]`: a text field that carries tag-length-value
//! subelements (Mastercard's DE 48: a transaction category code, then
//! subelements of a 2-digit tag, a 2-digit length and the data). The codec
//! carries such a field whole, as its `data` says; the layout is for the
//! tools that show it (`decode`), so a field whose content does not follow
//! it is still a valid field: [`Subelements::parse`] says why, and the
//! caller shows the field unsplit.

use std::collections::BTreeMap;

use serde::Deserialize;
use thiserror::Error;

/// How the subelements are laid out. One layout so far; a nested or
/// BER-TLV layout would be another variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SubelementLayout {
    /// Decimal tag of `tag` characters, decimal length of `length`
    /// characters, then that many characters of data; repeated to the end.
    Tlv,
}

/// `[field.subelements]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SubelementsFile {
    layout: SubelementLayout,
    #[serde(default)]
    lead: usize,
    lead_name: Option<String>,
    tag: usize,
    length: usize,
    #[serde(default)]
    names: BTreeMap<String, String>,
    #[serde(default)]
    sensitive: Vec<String>,
}

/// A validated subelement layout of one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subelements {
    pub layout: SubelementLayout,
    /// Characters before the first subelement (DE 48's transaction
    /// category code), shown as one part named `lead_name`.
    pub lead: usize,
    pub lead_name: String,
    /// Characters of each tag.
    pub tag: usize,
    /// Characters of each length (decimal digits).
    pub length: usize,
    /// Names of known tags, for display; an unnamed tag is still shown.
    pub names: BTreeMap<String, String>,
    /// Tags whose data is masked unless revealed (card verification codes,
    /// key material), whatever the field's own flag.
    pub sensitive: Vec<String>,
}

/// One part of a field split by its [`Subelements`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subelement<'a> {
    /// The tag, or `None` for the lead.
    pub tag: Option<&'a str>,
    /// Offset of the part (its tag, or the lead) in the field's characters.
    pub offset: usize,
    pub value: &'a str,
}

/// Why a field's content does not follow its subelement layout. Names the
/// field, the offset in its characters and never the content.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum SubelementError {
    #[error("field {field} subelements at offset {offset}: {need} characters needed, {have} left")]
    Truncated {
        field: u16,
        offset: usize,
        need: usize,
        have: usize,
    },
    #[error("field {field} subelements at offset {offset}: the length is not {digits} digits")]
    BadLength {
        field: u16,
        offset: usize,
        digits: usize,
    },
    #[error("field {field} subelements at offset {offset}: the tag is not {digits} digits")]
    BadTag {
        field: u16,
        offset: usize,
        digits: usize,
    },
}

/// A `[field.subelements]` table that cannot describe the field; each
/// variant names the key at fault. The spec loader adds the field and spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("{key} = {digits}: must be 1 to {MAX_DIGITS} digits")]
    Digits { key: &'static str, digits: usize },
    #[error("lead = {lead} leaves no room for subelements in a field of {field_length}")]
    LeadTooLong { lead: usize, field_length: usize },
    #[error("tag {tag:?} is not {digits} digits")]
    BadTag { tag: String, digits: usize },
    #[error("lead_name needs lead")]
    LeadNameWithoutLead,
}

/// Widest tag or length a layout may give (4 digits: a length up to 9999).
const MAX_DIGITS: usize = 4;

impl Subelements {
    /// Validates `[field.subelements]` of a field of `field_length`
    /// characters; the error is the reason, for the caller to name the key.
    pub(super) fn validate(
        file: SubelementsFile,
        field_length: usize,
    ) -> Result<Subelements, LayoutError> {
        for (key, digits) in [("tag", file.tag), ("length", file.length)] {
            if digits == 0 || digits > MAX_DIGITS {
                return Err(LayoutError::Digits { key, digits });
            }
        }
        if file.lead >= field_length {
            return Err(LayoutError::LeadTooLong {
                lead: file.lead,
                field_length,
            });
        }
        let tag_ok = |t: &String| t.len() == file.tag && t.bytes().all(|b| b.is_ascii_digit());
        for t in file.names.keys().chain(&file.sensitive) {
            if !tag_ok(t) {
                return Err(LayoutError::BadTag {
                    tag: t.clone(),
                    digits: file.tag,
                });
            }
        }
        if file.lead == 0 && file.lead_name.is_some() {
            return Err(LayoutError::LeadNameWithoutLead);
        }
        Ok(Subelements {
            layout: file.layout,
            lead: file.lead,
            lead_name: file.lead_name.unwrap_or_else(|| "Lead".into()),
            tag: file.tag,
            length: file.length,
            names: file.names,
            sensitive: file.sensitive,
        })
    }

    /// The name of `tag`, if the spec gives one.
    pub fn name(&self, tag: &str) -> Option<&str> {
        self.names.get(tag).map(String::as_str)
    }

    /// Whether `tag`'s data is masked unless revealed.
    pub fn is_sensitive(&self, tag: &str) -> bool {
        self.sensitive.iter().any(|t| t == tag)
    }

    /// Splits the characters of field `field` into its lead and
    /// subelements, in order. Never panics: a content that does not follow
    /// the layout is an error naming the offset.
    pub fn parse<'a>(
        &self,
        field: u16,
        text: &'a str,
    ) -> Result<Vec<Subelement<'a>>, SubelementError> {
        let SubelementLayout::Tlv = self.layout;
        let mut parts = Vec::new();
        let take = |at: usize, n: usize| -> Result<&'a str, SubelementError> {
            text.get(at..at + n).ok_or(SubelementError::Truncated {
                field,
                offset: at,
                need: n,
                have: text.len().saturating_sub(at),
            })
        };
        if self.lead > 0 {
            parts.push(Subelement {
                tag: None,
                offset: 0,
                value: take(0, self.lead)?,
            });
        }
        let mut at = self.lead;
        while at < text.len() {
            let tag = take(at, self.tag)?;
            if !tag.bytes().all(|b| b.is_ascii_digit()) {
                return Err(SubelementError::BadTag {
                    field,
                    offset: at,
                    digits: self.tag,
                });
            }
            let len_at = at + self.tag;
            let len_text = take(len_at, self.length)?;
            let len = digits(len_text).ok_or(SubelementError::BadLength {
                field,
                offset: len_at,
                digits: self.length,
            })?;
            let value = take(len_at + self.length, len)?;
            parts.push(Subelement {
                tag: Some(tag),
                offset: at,
                value,
            });
            at = len_at + self.length + len;
        }
        Ok(parts)
    }
}

/// The value of a string of decimal digits (at most [`MAX_DIGITS`]).
fn digits(s: &str) -> Option<usize> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn de48() -> Subelements {
        let file: SubelementsFile = toml::from_str(
            r#"
            layout = "tlv"
            lead = 1
            lead_name = "Transaction category code"
            tag = 2
            length = 2
            names = { "92" = "CVC 2" }
            sensitive = ["92"]
            "#,
        )
        .expect("toml");
        Subelements::validate(file, 999).expect("valid")
    }

    #[test]
    fn splits_the_lead_and_each_subelement() {
        let parts = de48().parse(48, "R9203123870111000").expect("parses");
        let shown: Vec<_> = parts.iter().map(|p| (p.tag, p.offset, p.value)).collect();
        assert_eq!(
            shown,
            [
                (None, 0, "R"),
                (Some("92"), 1, "123"),
                (Some("87"), 8, "1"),
                (Some("10"), 13, ""),
            ]
        );
    }

    #[test]
    fn a_content_off_the_layout_is_an_error_naming_the_offset() {
        let s = de48();
        assert_eq!(
            s.parse(48, "R9205123"),
            Err(SubelementError::Truncated {
                field: 48,
                offset: 5,
                need: 5,
                have: 3
            })
        );
        assert_eq!(
            s.parse(48, "RX203123"),
            Err(SubelementError::BadTag {
                field: 48,
                offset: 1,
                digits: 2
            })
        );
        assert_eq!(
            s.parse(48, "R92A3123"),
            Err(SubelementError::BadLength {
                field: 48,
                offset: 3,
                digits: 2
            })
        );
        // Multi-byte characters (Latin-1 above 0x7F) never split a slice.
        assert!(s.parse(48, "R92é").is_err());
        assert!(s.parse(48, "").is_err());
    }

    #[test]
    fn validation_names_what_is_wrong() {
        let bad = |text: &str| {
            let file: SubelementsFile = toml::from_str(text).expect("toml");
            Subelements::validate(file, 10)
                .expect_err("invalid")
                .to_string()
        };
        assert!(bad("layout = \"tlv\"\ntag = 0\nlength = 2").contains("tag"));
        assert!(bad("layout = \"tlv\"\ntag = 2\nlength = 5").contains("length"));
        assert!(bad("layout = \"tlv\"\nlead = 10\ntag = 2\nlength = 2").contains("lead"));
        assert!(
            bad("layout = \"tlv\"\ntag = 2\nlength = 2\nsensitive = [\"9\"]").contains("\"9\"")
        );
    }
}
