//! A field's text in a journal row, as `show` writes it (masked when
//! sensitive, binary as hex, control characters escaped), made without
//! `Display`'s character-at-a-time formatting where the field is plain
//! printable text, and the PAN masked byte by byte by the one masking
//! rule. Used where a row's texts are made: by the journal's writer for
//! fields the path copied raw, and on the path for the few it cannot.

use std::fmt::Write as _;

use crate::iso8583::{Data, FieldRef, is_sensitive};
use crate::store::journal::Short;

/// `field`'s masked text into `out`: as `show` writes it (masked when
/// sensitive, binary as hex, control characters escaped). A plain field of
/// printable ASCII, nearly every one, is copied as it is without going
/// through `Display` a character at a time (the same text).
pub(super) fn shown<const N: usize>(out: &mut Short<N>, field: Option<FieldRef<'_>>) {
    let Some(f) = field else { return };
    let def = f.def();
    if def.id == 2
        && def.data != Data::Binary
        && let Some(masked) = masked_pan(f.logical())
    {
        *out = masked;
        return;
    }
    if !is_sensitive(def) && def.data != Data::Binary {
        // ASCII data is its own logical text: checked and copied as a slice.
        let plain = if def.data == Data::Ascii {
            Short::printable_slice(f.data())
        } else {
            Short::printable(f.logical())
        };
        if let Some(plain) = plain {
            *out = plain;
            return;
        }
    }
    *out = Short::empty();
    let _ = write!(out, "{}", f.show());
}

/// Shortest PAN `show` masks as first 6 + last 4 (a shorter one is shown
/// as `[masked n chars]`, left to `show`).
const PAN_MIN: usize = 13;

/// A text PAN masked byte by byte as `show` masks it (the one rule,
/// `iso8583::mask`: first 6 and last 4 kept where alphanumeric, `*` for
/// every other character), without `Display`'s character-at-a-time
/// formatting; the test `the_fast_pan_mask_is_shows_mask` holds the two
/// equal.
pub(super) fn masked_pan<const N: usize>(
    pan: impl ExactSizeIterator<Item = u8>,
) -> Option<Short<N>> {
    let n = pan.len();
    if n < PAN_MIN {
        return None;
    }
    Short::printable(pan.enumerate().map(|(i, b)| {
        let clear = (i < 6 || i >= n - 4) && b.is_ascii_alphanumeric();
        if clear { b } else { b'*' }
    }))
}
