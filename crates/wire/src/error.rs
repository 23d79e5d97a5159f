use thiserror::Error;

/// Why bytes on the wire could not be trusted. Every variant names the offset (from
/// the start of the buffer the parser was given) so a log line can point at it.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum WireError {
    /// Not enough bytes for `what`; only returned by whole-buffer parsers (the
    /// incremental codec waits for more input instead).
    #[error("{what} truncated at offset {offset}: need {need} bytes, have {have}")]
    Truncated {
        what: &'static str,
        offset: usize,
        need: usize,
        have: usize,
    },
    /// A length prefix holds a byte that is not a digit of its encoding.
    #[error("length prefix at offset {offset}: byte {byte:#04x} is not a {encoding} digit")]
    BadPrefixDigit {
        offset: usize,
        byte: u8,
        encoding: &'static str,
    },
    /// A length prefix announces more than the configured maximum frame length.
    #[error("length prefix at offset {offset}: frame length {len} exceeds maximum {max}")]
    FrameTooLong {
        offset: usize,
        len: usize,
        max: usize,
    },
    /// A length prefix whose reserved bytes are not zero (VISA: the two bytes after
    /// the length must be `00 00` unless they mark a session-control frame).
    #[error("length prefix at offset {offset}: reserved byte is {byte:#04x}, expected 0x00")]
    BadPrefixReserved { offset: usize, byte: u8 },
    /// A length prefix that counts itself announces less than its own size.
    #[error("length prefix at offset {offset}: inclusive length {len} is shorter than the prefix")]
    PrefixTooShort { offset: usize, len: usize },
    /// A field of an envelope (TPDU, CUPS / POS / VISA header) is malformed.
    #[error("{what} at offset {offset}: {reason}")]
    BadEnvelope {
        what: &'static str,
        offset: usize,
        reason: EnvelopeReason,
    },
}

/// Why an envelope's field is malformed ([`WireError::BadEnvelope`]):
/// the byte found and what the envelope needs there.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum EnvelopeReason {
    /// A header's length byte other than its length.
    #[error("is {found}, expected {expected}")]
    Length { found: u8, expected: u8 },
    /// A header's length byte that is neither of its two lengths (VISA's,
    /// without and with its reject part).
    #[error("is {found:#04x}, expected {short:#04x} or {long:#04x}")]
    LengthEither { found: u8, short: u8, long: u8 },
    /// An identifying byte other than the one the field starts with (the
    /// TPDU's 0x60).
    #[error("ID byte is {found:#04x}, expected {expected:#04x}")]
    IdByte { found: u8, expected: u8 },
    /// nom's own error kind: a fallback, since the parsers here report only
    /// `Incomplete` or a typed failure.
    #[error("nom {}", .0.description())]
    Nom(nom::error::ErrorKind),
}

impl WireError {
    /// The offset the error concerns, relative to the buffer handed to the parser.
    pub fn offset(&self) -> usize {
        match self {
            WireError::Truncated { offset, .. }
            | WireError::BadPrefixDigit { offset, .. }
            | WireError::FrameTooLong { offset, .. }
            | WireError::BadPrefixReserved { offset, .. }
            | WireError::PrefixTooShort { offset, .. }
            | WireError::BadEnvelope { offset, .. } => *offset,
        }
    }

    /// The same error with its offset moved by `base`, for a parser that was handed
    /// a slice starting `base` bytes into a larger buffer (or stream). Saturates
    /// rather than overflowing.
    pub fn shifted(mut self, base: usize) -> Self {
        match &mut self {
            WireError::Truncated { offset, .. }
            | WireError::BadPrefixDigit { offset, .. }
            | WireError::FrameTooLong { offset, .. }
            | WireError::BadPrefixReserved { offset, .. }
            | WireError::PrefixTooShort { offset, .. }
            | WireError::BadEnvelope { offset, .. } => *offset = offset.saturating_add(base),
        }
        self
    }

    pub(crate) fn truncated(what: &'static str, offset: usize, need: usize, have: usize) -> Self {
        WireError::Truncated {
            what,
            offset,
            need,
            have,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reasons read as the text they replaced (operators' logs and
    /// `isoswitch decode` show them).
    #[test]
    fn envelope_reasons_say_what_was_found_and_expected() {
        let shown = |what, reason| {
            WireError::BadEnvelope {
                what,
                offset: 0,
                reason,
            }
            .to_string()
        };
        assert_eq!(
            shown(
                "TPDU",
                EnvelopeReason::IdByte {
                    found: 0x61,
                    expected: 0x60
                }
            ),
            "TPDU at offset 0: ID byte is 0x61, expected 0x60"
        );
        assert_eq!(
            shown(
                "CUPS header length",
                EnvelopeReason::Length {
                    found: 47,
                    expected: 46
                }
            ),
            "CUPS header length at offset 0: is 47, expected 46"
        );
        let visa = EnvelopeReason::LengthEither {
            found: 0x17,
            short: 0x16,
            long: 0x1A,
        };
        assert_eq!(
            shown("VISA header length", visa),
            "VISA header length at offset 0: is 0x17, expected 0x16 or 0x1a"
        );
    }
}
