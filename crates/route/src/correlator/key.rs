//! The correlation key: the fields a response echoes, length-prefixed
//! and stored inline, and how it is hashed.

use std::fmt;
use std::hash::{Hash, Hasher};

use thiserror::Error;

/// Longest encoded key, in bytes (each part costs its length plus one).
pub const KEY_MAX: usize = 64;

/// A correlation key: length-prefixed parts, stored inline (no allocation).
#[derive(Clone, Copy)]
pub struct CorrelationKey {
    len: u8,
    bytes: [u8; KEY_MAX],
}

impl CorrelationKey {
    /// Starts a key; add parts with [`KeyBuilder::push`].
    pub fn builder() -> KeyBuilder {
        KeyBuilder {
            key: CorrelationKey {
                len: 0,
                bytes: [0; KEY_MAX],
            },
            overflow: false,
        }
    }

    /// The encoded key: each part as one length byte then its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl PartialEq for CorrelationKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for CorrelationKey {}

impl Hash for CorrelationKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The bytes alone, without the slice's length before them (equal
        // keys are equal bytes, so they still hash alike): foldhash's
        // `write` mixes the length in itself, and one step less per hash.
        state.write(self.as_bytes());
    }
}

impl fmt::Debug for CorrelationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Parts joined by `|`. Keys hold routing fields (ids, STAN, dates),
        // never card data, so they may be shown.
        f.write_str("CorrelationKey(")?;
        let mut rest = self.as_bytes();
        let mut first = true;
        while let Some((&n, tail)) = rest.split_first() {
            let n = usize::from(n).min(tail.len());
            if !first {
                f.write_str("|")?;
            }
            write!(f, "{}", tail[..n].escape_ascii())?;
            rest = &tail[n..];
            first = false;
        }
        f.write_str(")")
    }
}

/// Builds a [`CorrelationKey`] part by part. Each part is length-prefixed, so
/// `("12", "3")` and `("1", "23")` are different keys.
#[derive(Clone, Copy, Debug)]
pub struct KeyBuilder {
    key: CorrelationKey,
    overflow: bool,
}

/// The parts do not fit in [`KEY_MAX`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[error("correlation key parts exceed {KEY_MAX} bytes")]
pub struct KeyTooLong;

impl KeyBuilder {
    /// Appends one part (may be empty, e.g. an absent optional field).
    pub fn push(mut self, part: &[u8]) -> Self {
        self.append(part);
        self
    }

    /// [`KeyBuilder::push`] in place: the per-request key is built where it
    /// lies instead of moving its 66 bytes once per part.
    #[inline]
    pub fn append(&mut self, part: &[u8]) {
        let at = usize::from(self.key.len);
        let end = at + 1 + part.len();
        if self.overflow || end > KEY_MAX {
            self.overflow = true;
            return;
        }
        // end <= 64, so part.len() < 64 fits a byte.
        self.key.bytes[at] = part.len() as u8;
        copy_part(&mut self.key.bytes[at + 1..end], part);
        self.key.len = end as u8;
    }

    pub fn build(self) -> Result<CorrelationKey, KeyTooLong> {
        if self.overflow {
            Err(KeyTooLong)
        } else {
            Ok(self.key)
        }
    }
}

/// `dst.copy_from_slice(src)` (the two are as long) for the short parts a
/// key is made of, as two overlapping fixed-size moves instead of a call to
/// `memcpy` for a few bytes: a key is built twice per exchange, part by part.
#[inline(always)]
fn copy_part(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    if dst.len() != n {
        // Not so by construction; `copy_from_slice` would panic, this copies
        // what fits.
        let n = n.min(dst.len());
        dst[..n].copy_from_slice(&src[..n]);
        return;
    }
    match n {
        0 => {}
        1..=3 => {
            dst[0] = src[0];
            dst[n / 2] = src[n / 2];
            dst[n - 1] = src[n - 1];
        }
        4..=7 => {
            dst[..4].copy_from_slice(&src[..4]);
            dst[n - 4..n].copy_from_slice(&src[n - 4..n]);
        }
        8..=16 => {
            dst[..8].copy_from_slice(&src[..8]);
            dst[n - 8..n].copy_from_slice(&src[n - 8..n]);
        }
        _ => dst.copy_from_slice(src),
    }
}

/// Keys are hashed with foldhash: fast on short byte strings, and seeded per
/// process, so a peer cannot aim keys at one bucket.
pub type KeyHasher = foldhash::fast::RandomState;
