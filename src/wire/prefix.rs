//! Length prefixes (to be completed by the wire-framing work).

use serde::{Deserialize, Serialize};

/// How a frame's length is written in front of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LengthPrefix {
    /// 2 bytes binary big-endian: length of what follows (POS `LL`).
    Binary2,
    /// 2 bytes binary big-endian counting the prefix itself.
    Binary2Inclusive,
    /// 2 bytes BCD, 0..=9999.
    Bcd2,
    /// 4 ASCII decimal digits (CUPS `LLLL`).
    Ascii4,
    /// 4 bytes binary big-endian.
    Binary4,
    /// VISA: 2 bytes binary length of what follows, then `00 00`.
    Visa4,
}
