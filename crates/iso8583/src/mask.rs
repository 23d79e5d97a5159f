//! Showing field values without leaking secrets: a sensitive field is masked per
//! its spec (PAN: first 6 + last 4; anything else: its length only) unless the
//! caller explicitly asks to reveal it.
//!
//! Which fields are sensitive is one rule, [`is_sensitive`], for everything
//! that shows or keeps field data: display (`decode`, logs) and capture
//! masking alike. A spec can add fields to it, never take any away.

use std::fmt;

use super::codec;
use super::spec::{Data, FieldDef, Mask, Spec};

/// Fields sensitive whatever a spec says: PAN (F2), track 2, 3 and 1 data
/// (F35, F36, F45), PIN block (F52), EMV data (F55), MACs (F64, F128).
pub const ALWAYS_SENSITIVE: [u16; 8] = [2, 35, 36, 45, 52, 55, 64, 128];

/// Whether `def` is masked unless revealed: flagged `sensitive` by its spec,
/// or one of [`ALWAYS_SENSITIVE`] (a custom spec that forgets the flag on its
/// PAN still masks it).
pub fn is_sensitive(def: &FieldDef) -> bool {
    def.sensitive || ALWAYS_SENSITIVE.contains(&def.id)
}

/// How a sensitive field is masked: its spec's `mask`, and the PAN (F2)
/// always as a PAN (first 6 and last 4 in clear).
pub fn mask_of(def: &FieldDef) -> Mask {
    if def.id == 2 { Mask::Pan } else { def.mask }
}

/// The fields of [`ALWAYS_SENSITIVE`] that `spec` defines without the
/// `sensitive` flag (masked all the same; worth a warning to its author).
pub fn unflagged_sensitive(spec: &Spec) -> Vec<u16> {
    ALWAYS_SENSITIVE
        .into_iter()
        .filter(|&id| spec.field(id).is_some_and(|d| !d.sensitive))
        .collect()
}

/// A field value ready for display, masked unless [`Shown::reveal`] was called.
#[derive(Clone, Copy)]
pub struct Shown<'a> {
    def: &'a FieldDef,
    source: Source<'a>,
    reveal: bool,
}

#[derive(Clone, Copy)]
enum Source<'a> {
    /// Wire bytes of the field's data.
    Raw {
        data: &'a [u8],
        units: usize,
    },
    Text(&'a str),
    Binary(&'a [u8]),
}

impl<'a> Shown<'a> {
    pub(crate) fn raw(def: &'a FieldDef, data: &'a [u8], units: usize) -> Shown<'a> {
        Shown {
            def,
            source: Source::Raw { data, units },
            reveal: false,
        }
    }

    pub(crate) fn text(def: &'a FieldDef, text: &'a str) -> Shown<'a> {
        Shown {
            def,
            source: Source::Text(text),
            reveal: false,
        }
    }

    pub(crate) fn binary(def: &'a FieldDef, bytes: &'a [u8]) -> Shown<'a> {
        Shown {
            def,
            source: Source::Binary(bytes),
            reveal: false,
        }
    }

    /// Show sensitive data in clear. For test systems and explicit operator
    /// requests only.
    pub fn reveal(self) -> Shown<'a> {
        self.revealed(true)
    }

    /// Reveal or not, as a flag says (e.g. a CLI `--reveal`).
    pub fn revealed(mut self, reveal: bool) -> Shown<'a> {
        self.reveal = reveal;
        self
    }
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let masked = is_sensitive(self.def) && !self.reveal;
        let mask = mask_of(self.def);
        match self.source {
            Source::Binary(bytes) => write_binary(f, bytes, masked),
            Source::Raw { data, .. } if self.def.data == Data::Binary => {
                write_binary(f, data, masked)
            }
            Source::Raw { data, units } => {
                let it = codec::logical(self.def, data, units).map(char::from);
                write_text(f, it, masked, mask)
            }
            Source::Text(s) => write_text(f, s.chars(), masked, mask),
        }
    }
}

impl fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

fn write_binary(f: &mut fmt::Formatter<'_>, bytes: &[u8], masked: bool) -> fmt::Result {
    if masked {
        return write!(f, "[masked {} bytes]", bytes.len());
    }
    for b in bytes {
        write!(f, "{b:02X}")?;
    }
    Ok(())
}

/// Shortest PAN shown as first 6 + last 4; shorter ones are masked fully.
const PAN_MIN: usize = 13;

fn write_text<I>(f: &mut fmt::Formatter<'_>, chars: I, masked: bool, mask: Mask) -> fmt::Result
where
    I: Iterator<Item = char> + Clone,
{
    use fmt::Write;
    let n = chars.clone().count();
    if !masked {
        for c in chars {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_char(c)?;
            }
        }
        return Ok(());
    }
    match mask {
        Mask::Pan if n >= PAN_MIN => {
            for (i, c) in chars.enumerate() {
                let clear = (i < 6 || i >= n - 4) && c.is_ascii_alphanumeric();
                f.write_char(if clear { c } else { '*' })?;
            }
            Ok(())
        }
        Mask::Pan | Mask::Full => write!(f, "[masked {n} chars]"),
    }
}
