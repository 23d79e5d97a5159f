//! Length prefixes: nom parsers and encoders for every prefix the switch speaks.
//!
//! A prefix is parsed with nom's *streaming* parsers, so a short input is
//! "incomplete" (more bytes needed), never an error. Every prefix is checked
//! against a configurable maximum frame length before anyone reserves memory for
//! the frame.
//!
//! Offsets in the errors are relative to the first byte of the prefix; the codec
//! shifts them to stream offsets.
//!
//! | prefix | bytes | meaning |
//! |---|---|---|
//! | `binary2` | 2 | big-endian length of what follows (POS `LL`) |
//! | `binary2-inclusive` | 2 | big-endian length counting the 2 prefix bytes |
//! | `bcd2` | 2 | 4 BCD digits, 0..=9999 |
//! | `ascii4` | 4 | 4 ASCII decimal digits (CUPS `LLLL`) |
//! | `binary4` | 4 | big-endian length of what follows |
//! | `visa4` | 4 | big-endian 2-byte length of what follows, then `00 00`; upper nibble 2 in byte 2 marks session control |

use crate::EnvelopeReason;
use bytes::BufMut;
use nom::IResult;
use nom::bytes::streaming::take;
use nom::error::{ErrorKind, ParseError};
use nom::number::streaming::{be_u8, be_u16, be_u32};
use serde::{Deserialize, Serialize};

use super::{Frame, WireError};

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

/// What a length prefix says about the frame behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameHeader {
    /// Bytes after the prefix (the prefix itself is never counted here, even for
    /// `binary2-inclusive`).
    pub payload_len: usize,
    /// A VISA session-control frame (upper nibble 2 in prefix byte 2).
    pub session_control: bool,
}

impl FrameHeader {
    /// The frame this header announces, given its payload. A session-control
    /// frame stays [`Frame::SessionControl`] even when empty (the flag carries the
    /// meaning); otherwise an empty payload is a [`Frame::KeepAlive`].
    pub fn frame(self, payload: bytes::Bytes) -> Frame {
        if self.session_control {
            Frame::SessionControl(payload)
        } else if self.payload_len == 0 {
            Frame::KeepAlive
        } else {
            Frame::Message(payload)
        }
    }
}

/// Upper nibble of VISA prefix byte 2 that marks a session-control frame.
const VISA_SESSION_CONTROL: u8 = 0x2;

impl LengthPrefix {
    /// Every prefix, for tests and tools.
    pub const ALL: [LengthPrefix; 6] = [
        LengthPrefix::Binary2,
        LengthPrefix::Binary2Inclusive,
        LengthPrefix::Bcd2,
        LengthPrefix::Ascii4,
        LengthPrefix::Binary4,
        LengthPrefix::Visa4,
    ];

    /// Bytes the prefix itself takes.
    #[allow(
        clippy::len_without_is_empty,
        reason = "a prefix always takes bytes; `len` is its size on the wire"
    )]
    pub const fn len(self) -> usize {
        match self {
            LengthPrefix::Binary2 | LengthPrefix::Binary2Inclusive | LengthPrefix::Bcd2 => 2,
            LengthPrefix::Ascii4 | LengthPrefix::Binary4 | LengthPrefix::Visa4 => 4,
        }
    }

    /// The longest payload (bytes after the prefix) this prefix can announce.
    pub const fn max_payload(self) -> usize {
        match self {
            LengthPrefix::Binary2 | LengthPrefix::Visa4 => u16::MAX as usize,
            LengthPrefix::Binary2Inclusive => u16::MAX as usize - 2,
            LengthPrefix::Bcd2 | LengthPrefix::Ascii4 => 9999,
            LengthPrefix::Binary4 => {
                if usize::BITS >= u32::BITS {
                    u32::MAX as usize
                } else {
                    usize::MAX
                }
            }
        }
    }

    /// Whether this prefix can mark a session-control frame (only `visa4`).
    pub const fn has_session_control(self) -> bool {
        matches!(self, LengthPrefix::Visa4)
    }

    /// The name used in config files (`binary2`, `visa4`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            LengthPrefix::Binary2 => "binary2",
            LengthPrefix::Binary2Inclusive => "binary2-inclusive",
            LengthPrefix::Bcd2 => "bcd2",
            LengthPrefix::Ascii4 => "ascii4",
            LengthPrefix::Binary4 => "binary4",
            LengthPrefix::Visa4 => "visa4",
        }
    }

    /// Writes the prefix for a message (or, with 0, a keep-alive) of `payload_len`
    /// bytes. Writes nothing and returns [`WireError::FrameTooLong`] (offset 0)
    /// when the length does not fit the prefix.
    pub fn encode(self, payload_len: usize, out: &mut impl BufMut) -> Result<(), WireError> {
        let len = self.checked_len(payload_len)?;
        match self {
            LengthPrefix::Binary2 => out.put_u16(len as u16),
            LengthPrefix::Binary2Inclusive => out.put_u16(len as u16 + 2),
            LengthPrefix::Bcd2 => out.put_slice(&bcd2(len as u16)),
            LengthPrefix::Ascii4 => out.put_slice(&ascii4(len as u16)),
            LengthPrefix::Binary4 => out.put_u32(len),
            LengthPrefix::Visa4 => {
                out.put_u16(len as u16);
                out.put_u16(0);
            }
        }
        Ok(())
    }

    /// Writes a VISA session-control prefix (`LL LL 20 00`) for a payload of
    /// `payload_len` bytes. Errors like [`LengthPrefix::encode`].
    pub fn encode_visa_session_control(
        payload_len: usize,
        out: &mut impl BufMut,
    ) -> Result<(), WireError> {
        let len = LengthPrefix::Visa4.checked_len(payload_len)?;
        out.put_u16(len as u16);
        out.put_u8(VISA_SESSION_CONTROL << 4);
        out.put_u8(0);
        Ok(())
    }

    /// `payload_len` as a `u32` no greater than [`LengthPrefix::max_payload`].
    fn checked_len(self, payload_len: usize) -> Result<u32, WireError> {
        let max = self.max_payload();
        match u32::try_from(payload_len) {
            Ok(len) if payload_len <= max => Ok(len),
            _ => Err(WireError::FrameTooLong {
                offset: 0,
                len: payload_len,
                max,
            }),
        }
    }

    /// Parses the prefix at the start of `input`. `Ok(None)` means more bytes are
    /// needed; nothing is consumed either way (the caller advances by
    /// [`LengthPrefix::len`]). A prefix announcing more than `max_frame` payload
    /// bytes is [`WireError::FrameTooLong`]: check it before reserving memory.
    pub fn parse_header(
        self,
        input: &[u8],
        max_frame: usize,
    ) -> Result<Option<FrameHeader>, WireError> {
        match self.parser(max_frame)(input) {
            Ok((_, header)) => Ok(Some(header)),
            Err(nom::Err::Incomplete(_)) => Ok(None),
            Err(nom::Err::Error(e) | nom::Err::Failure(e)) => Err(e),
        }
    }

    /// The nom parser for this prefix (streaming: short input is
    /// `Incomplete`), with the `max_frame` check. Error offsets are relative to
    /// the start of the prefix.
    pub fn parser(
        self,
        max_frame: usize,
    ) -> impl Fn(&[u8]) -> IResult<&[u8], FrameHeader, WireError> {
        move |input| {
            let (rest, header) = match self {
                LengthPrefix::Binary2 => binary2(input),
                LengthPrefix::Binary2Inclusive => binary2_inclusive(input),
                LengthPrefix::Bcd2 => bcd2_len(input),
                LengthPrefix::Ascii4 => ascii4_len(input),
                LengthPrefix::Binary4 => binary4(input),
                LengthPrefix::Visa4 => visa4(input),
            }?;
            if header.payload_len > max_frame {
                return Err(nom::Err::Failure(WireError::FrameTooLong {
                    offset: 0,
                    len: header.payload_len,
                    max: max_frame,
                }));
            }
            Ok((rest, header))
        }
    }
}

impl std::fmt::Display for LengthPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One whole frame found at the start of a buffer by [`split_frame`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitFrame<'a> {
    pub header: FrameHeader,
    /// The bytes after the prefix.
    pub payload: &'a [u8],
    /// Bytes the whole frame takes: prefix + payload.
    pub consumed: usize,
}

impl SplitFrame<'_> {
    /// The frame, with its payload copied (for tools and tests; the codec does
    /// not copy).
    pub fn to_frame(&self) -> Frame {
        self.header
            .frame(bytes::Bytes::copy_from_slice(self.payload))
    }
}

/// One whole frame at the start of a buffer. `Ok(None)` when `input` does not
/// hold the whole frame yet; errors as [`LengthPrefix::parse_header`].
pub fn split_frame(
    prefix: LengthPrefix,
    input: &[u8],
    max_frame: usize,
) -> Result<Option<SplitFrame<'_>>, WireError> {
    let Some(header) = prefix.parse_header(input, max_frame)? else {
        return Ok(None);
    };
    let start = prefix.len();
    let end = start
        .checked_add(header.payload_len)
        .ok_or(WireError::FrameTooLong {
            offset: 0,
            len: header.payload_len,
            max: max_frame,
        })?;
    Ok(input.get(start..end).map(|payload| SplitFrame {
        header,
        payload,
        consumed: end,
    }))
}

// nom needs to build an error from its own error kinds; the streaming `take` and
// number parsers used here and by the envelope parts (crates/wire/src/part.rs) only
// ever report `Incomplete`, so this is a fallback; every real error is typed.
impl ParseError<&[u8]> for WireError {
    fn from_error_kind(_input: &[u8], kind: ErrorKind) -> Self {
        WireError::BadEnvelope {
            what: "length prefix",
            offset: 0,
            reason: EnvelopeReason::Nom(kind),
        }
    }

    fn append(_input: &[u8], _kind: ErrorKind, other: Self) -> Self {
        other
    }
}

type PResult<'a> = IResult<&'a [u8], FrameHeader, WireError>;

fn message(payload_len: usize) -> FrameHeader {
    FrameHeader {
        payload_len,
        session_control: false,
    }
}

fn binary2(input: &[u8]) -> PResult<'_> {
    let (rest, len) = be_u16(input)?;
    Ok((rest, message(usize::from(len))))
}

fn binary2_inclusive(input: &[u8]) -> PResult<'_> {
    let (rest, len) = be_u16(input)?;
    match usize::from(len).checked_sub(2) {
        Some(payload_len) => Ok((rest, message(payload_len))),
        None => Err(nom::Err::Failure(WireError::PrefixTooShort {
            offset: 0,
            len: usize::from(len),
        })),
    }
}

fn binary4(input: &[u8]) -> PResult<'_> {
    let (rest, len) = be_u32(input)?;
    // On a 16-bit target a length that does not fit is simply too long.
    let payload_len = usize::try_from(len).unwrap_or(usize::MAX);
    Ok((rest, message(payload_len)))
}

fn bcd2_len(input: &[u8]) -> PResult<'_> {
    let (rest, digits) = take(2usize)(input)?;
    let mut len = 0usize;
    for (offset, &byte) in digits.iter().enumerate() {
        for nibble in [byte >> 4, byte & 0x0F] {
            if nibble > 9 {
                return Err(nom::Err::Failure(WireError::BadPrefixDigit {
                    offset,
                    byte,
                    encoding: "BCD",
                }));
            }
            len = len * 10 + usize::from(nibble);
        }
    }
    Ok((rest, message(len)))
}

fn ascii4_len(input: &[u8]) -> PResult<'_> {
    let (rest, digits) = take(4usize)(input)?;
    let mut len = 0usize;
    for (offset, &byte) in digits.iter().enumerate() {
        if !byte.is_ascii_digit() {
            return Err(nom::Err::Failure(WireError::BadPrefixDigit {
                offset,
                byte,
                encoding: "ASCII decimal",
            }));
        }
        len = len * 10 + usize::from(byte - b'0');
    }
    Ok((rest, message(len)))
}

fn visa4(input: &[u8]) -> PResult<'_> {
    let (rest, len) = be_u16(input)?;
    let (rest, flags) = be_u8(rest)?;
    let (rest, reserved) = be_u8(rest)?;
    let session_control = flags >> 4 == VISA_SESSION_CONTROL;
    // A session-control frame may use the rest of bytes 2 and 3; a plain frame
    // must have them zero, or the stream cannot be trusted.
    if !session_control {
        if flags != 0 {
            return Err(nom::Err::Failure(WireError::BadPrefixReserved {
                offset: 2,
                byte: flags,
            }));
        }
        if reserved != 0 {
            return Err(nom::Err::Failure(WireError::BadPrefixReserved {
                offset: 3,
                byte: reserved,
            }));
        }
    }
    Ok((
        rest,
        FrameHeader {
            payload_len: usize::from(len),
            session_control,
        },
    ))
}

/// 0..=9999 as 4 BCD digits in 2 bytes.
fn bcd2(len: u16) -> [u8; 2] {
    let [d0, d1, d2, d3] = decimal4(len);
    [(d0 << 4) | d1, (d2 << 4) | d3]
}

/// 0..=9999 as 4 ASCII digits.
fn ascii4(len: u16) -> [u8; 4] {
    decimal4(len).map(|d| b'0' + d)
}

/// The 4 decimal digits of 0..=9999, most significant first.
fn decimal4(len: u16) -> [u8; 4] {
    let digit = |div: u16| (len / div % 10) as u8;
    [digit(1000), digit(100), digit(10), digit(1)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    const MAX: usize = 1 << 20;

    fn header(payload_len: usize) -> Option<FrameHeader> {
        Some(message(payload_len))
    }

    fn encoded(prefix: LengthPrefix, len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        prefix.encode(len, &mut out).unwrap();
        out
    }

    #[test]
    fn lengths_and_names() {
        for p in LengthPrefix::ALL {
            assert_eq!(encoded(p, 0).len(), p.len());
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{}\"", p.name()));
            assert_eq!(serde_json::from_str::<LengthPrefix>(&json).unwrap(), p);
        }
    }

    #[test]
    fn keep_alive_prefixes() {
        use LengthPrefix::*;
        assert_eq!(encoded(Binary2, 0), [0, 0]);
        assert_eq!(encoded(Binary2Inclusive, 0), [0, 2]);
        assert_eq!(encoded(Bcd2, 0), [0, 0]);
        assert_eq!(encoded(Ascii4, 0), b"0000");
        assert_eq!(encoded(Binary4, 0), [0, 0, 0, 0]);
        assert_eq!(encoded(Visa4, 0), [0, 0, 0, 0]);
    }

    #[test]
    fn binary2() {
        let p = LengthPrefix::Binary2;
        assert_eq!(p.parse_header(&[0x01, 0x2C, 0xAA], MAX), Ok(header(300)));
        assert_eq!(p.parse_header(&[0xFF, 0xFF], MAX), Ok(header(65535)));
        assert_eq!(p.parse_header(&[0x00, 0x00], MAX), Ok(header(0)));
        assert_eq!(encoded(p, 300), [0x01, 0x2C]);
        assert_eq!(encoded(p, 65535), [0xFF, 0xFF]);
        assert!(matches!(
            p.encode(65536, &mut Vec::new()),
            Err(WireError::FrameTooLong {
                len: 65536,
                max: 65535,
                ..
            })
        ));
    }

    #[test]
    fn binary2_inclusive() {
        let p = LengthPrefix::Binary2Inclusive;
        assert_eq!(p.parse_header(&[0x01, 0x2E], MAX), Ok(header(300)));
        assert_eq!(p.parse_header(&[0x00, 0x02], MAX), Ok(header(0)));
        assert_eq!(p.parse_header(&[0xFF, 0xFF], MAX), Ok(header(65533)));
        for short in [0u8, 1] {
            assert_eq!(
                p.parse_header(&[0x00, short], MAX),
                Err(WireError::PrefixTooShort {
                    offset: 0,
                    len: usize::from(short)
                })
            );
        }
        assert_eq!(encoded(p, 300), [0x01, 0x2E]);
        assert_eq!(encoded(p, 65533), [0xFF, 0xFF]);
        assert!(p.encode(65534, &mut Vec::new()).is_err());
    }

    #[test]
    fn bcd2() {
        let p = LengthPrefix::Bcd2;
        assert_eq!(p.parse_header(&[0x01, 0x23], MAX), Ok(header(123)));
        assert_eq!(p.parse_header(&[0x99, 0x99], MAX), Ok(header(9999)));
        assert_eq!(p.parse_header(&[0x00, 0x00], MAX), Ok(header(0)));
        assert_eq!(
            p.parse_header(&[0x1A, 0x00], MAX),
            Err(WireError::BadPrefixDigit {
                offset: 0,
                byte: 0x1A,
                encoding: "BCD"
            })
        );
        assert_eq!(
            p.parse_header(&[0x00, 0xF0], MAX),
            Err(WireError::BadPrefixDigit {
                offset: 1,
                byte: 0xF0,
                encoding: "BCD"
            })
        );
        assert_eq!(encoded(p, 123), [0x01, 0x23]);
        assert_eq!(encoded(p, 9999), [0x99, 0x99]);
        assert!(p.encode(10000, &mut Vec::new()).is_err());
    }

    #[test]
    fn ascii4() {
        let p = LengthPrefix::Ascii4;
        assert_eq!(p.parse_header(b"0123", MAX), Ok(header(123)));
        assert_eq!(p.parse_header(b"9999", MAX), Ok(header(9999)));
        assert_eq!(p.parse_header(b"0000", MAX), Ok(header(0)));
        assert_eq!(
            p.parse_header(b"01 3", MAX),
            Err(WireError::BadPrefixDigit {
                offset: 2,
                byte: b' ',
                encoding: "ASCII decimal"
            })
        );
        assert!(matches!(
            p.parse_header(b"-123", MAX),
            Err(WireError::BadPrefixDigit { offset: 0, .. })
        ));
        assert_eq!(encoded(p, 7), b"0007");
        assert_eq!(encoded(p, 9999), b"9999");
        assert!(matches!(
            p.encode(10000, &mut Vec::new()),
            Err(WireError::FrameTooLong {
                len: 10000,
                max: 9999,
                ..
            })
        ));
    }

    #[test]
    fn binary4() {
        let p = LengthPrefix::Binary4;
        assert_eq!(p.parse_header(&[0, 0, 0x13, 0x88], MAX), Ok(header(5000)));
        assert_eq!(
            p.parse_header(&[0xFF, 0xFF, 0xFF, 0xFF], MAX),
            Err(WireError::FrameTooLong {
                offset: 0,
                len: u32::MAX as usize,
                max: MAX
            })
        );
        assert_eq!(encoded(p, 5000), [0, 0, 0x13, 0x88]);
        assert_eq!(encoded(p, u32::MAX as usize), [0xFF; 4]);
        #[cfg(target_pointer_width = "64")]
        assert!(p.encode(u32::MAX as usize + 1, &mut Vec::new()).is_err());
    }

    #[test]
    fn visa4() {
        let p = LengthPrefix::Visa4;
        assert_eq!(p.parse_header(&[0x00, 0x64, 0, 0], MAX), Ok(header(100)));
        assert_eq!(p.parse_header(&[0xFF, 0xFF, 0, 0], MAX), Ok(header(65535)));
        assert_eq!(encoded(p, 100), [0x00, 0x64, 0, 0]);
        assert_eq!(
            p.parse_header(&[0x00, 0x64, 0x10, 0], MAX),
            Err(WireError::BadPrefixReserved {
                offset: 2,
                byte: 0x10
            })
        );
        assert_eq!(
            p.parse_header(&[0x00, 0x64, 0, 0x01], MAX),
            Err(WireError::BadPrefixReserved {
                offset: 3,
                byte: 0x01
            })
        );
        assert!(p.encode(65536, &mut Vec::new()).is_err());
    }

    #[test]
    fn visa4_session_control() {
        let p = LengthPrefix::Visa4;
        let sc = |payload_len| {
            Some(FrameHeader {
                payload_len,
                session_control: true,
            })
        };
        assert_eq!(p.parse_header(&[0x00, 0x08, 0x20, 0x00], MAX), Ok(sc(8)));
        // The lower nibble and byte 3 are not checked on a session-control frame.
        assert_eq!(p.parse_header(&[0x00, 0x08, 0x2F, 0x55], MAX), Ok(sc(8)));
        let mut out = Vec::new();
        LengthPrefix::encode_visa_session_control(8, &mut out).unwrap();
        assert_eq!(out, [0x00, 0x08, 0x20, 0x00]);
        assert_eq!(p.parse_header(&out, MAX), Ok(sc(8)));
        assert!(LengthPrefix::encode_visa_session_control(65536, &mut out).is_err());
        assert!(p.has_session_control());
        assert!(!LengthPrefix::Ascii4.has_session_control());
    }

    #[test]
    fn short_input_needs_more() {
        for p in LengthPrefix::ALL {
            let full = encoded(p, 10);
            for cut in 0..full.len() {
                assert_eq!(p.parse_header(&full[..cut], MAX), Ok(None), "{p} {cut}");
            }
        }
    }

    #[test]
    fn max_frame_is_enforced_at_the_prefix() {
        for p in LengthPrefix::ALL {
            let prefix = encoded(p, 101);
            assert_eq!(p.parse_header(&prefix, 101), Ok(header(101)));
            assert_eq!(
                p.parse_header(&prefix, 100),
                Err(WireError::FrameTooLong {
                    offset: 0,
                    len: 101,
                    max: 100
                }),
                "{p}"
            );
        }
    }

    #[test]
    fn every_value_round_trips() {
        for p in LengthPrefix::ALL {
            let top = p.max_payload().min(70_000);
            for len in (0..=top).step_by(7).chain([top]) {
                let prefix = encoded(p, len);
                assert_eq!(
                    p.parse_header(&prefix, usize::MAX),
                    Ok(header(len)),
                    "{p} {len}"
                );
            }
        }
    }

    #[test]
    fn split_frame_whole_buffer() {
        let p = LengthPrefix::Ascii4;
        let buf = b"0003abc0000rest";
        let first = split_frame(p, buf, MAX).unwrap().unwrap();
        assert_eq!(
            (first.header, first.payload, first.consumed),
            (message(3), &b"abc"[..], 7)
        );
        assert_eq!(first.to_frame(), Frame::Message("abc".into()));
        let second = split_frame(p, &buf[first.consumed..], MAX)
            .unwrap()
            .unwrap();
        assert_eq!((second.payload, second.consumed), (&b""[..], 4));
        assert_eq!(second.to_frame(), Frame::KeepAlive);
        assert_eq!(second.header.frame(Bytes::new()), Frame::KeepAlive);
        assert_eq!(split_frame(p, b"0005abc", MAX), Ok(None));
        assert!(split_frame(p, b"00x5abc", MAX).is_err());
    }

    #[test]
    fn composes_with_nom() {
        let p = LengthPrefix::Binary2;
        let (rest, h) = p.parser(MAX)(&[0x00, 0x02, 0xAB, 0xCD]).unwrap();
        assert_eq!((rest, h), (&[0xAB, 0xCD][..], message(2)));
        assert!(matches!(
            p.parser(MAX)(&[0x00]),
            Err(nom::Err::Incomplete(_))
        ));
    }
}
