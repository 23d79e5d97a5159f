//! The 22-byte VISA BASE I header (and its reject variant).
//!
//! | offset | len | field |
//! |---|---|---|
//! | 0 | 1 | header length, 0x16 (0x1A when a reject bitmap + code are counted) |
//! | 1 | 1 | header format 0x01; bit 0x80 marks a reject |
//! | 2 | 1 | text format 0x02 |
//! | 3 | 2 | total length, binary, header included |
//! | 5 | 3 | destination station ID, BCD |
//! | 8 | 3 | source station ID, BCD |
//! | 11 | 1 | round-trip control |
//! | 12 | 2 | BASE I flags |
//! | 14 | 3 | message status flags |
//! | 17 | 1 | batch number |
//! | 18 | 3 | reserved |
//! | 21 | 1 | user info |
//!
//! A reject is marked by bit 0x80 of the header format byte, or by a header
//! length of 0x1A that counts the 2-byte reject bitmap and 2-byte reject code
//! (jPOS's `BASE1Header` form); both are accepted. After the reject header come
//! the bitmap and code, then the original 22-byte header, then the original
//! body:
//!
//! | offset | len | part |
//! |---|---|---|
//! | 0 | 22 | reject header ([`header`]) |
//! | 22 | 2 | reject bitmap ([`reject_code`]) |
//! | 24 | 2 | reject code |
//! | 26 | 22 | original header ([`rejected`] parses bitmap, code and this) |
//! | 48 | … | original body (MTI first) |

use super::WireError;
use super::describe::{Hex, flag, hex_byte};
use super::fresh::{Fresh, FreshError, Setting, hex_bytes};
use super::part::{WireResult, array, bad, whole};
use super::{Description, IdFields, Parts, SchemeHeader, TotalTooLong};
use crate::EnvelopeReason;
use crate::envelope::Rejected;

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct VisaHeader(pub [u8; VisaHeader::LEN]);

/// The bitmap and reject code of a rejected VISA message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VisaReject {
    pub bitmap: [u8; 2],
    pub code: [u8; 2],
}

const REJECT_FLAG: u8 = 0x80;
/// Header length byte of the reject form that counts bitmap and code.
const REJECT_HEADER_LEN: u8 = 0x1A;

impl VisaHeader {
    pub const LEN: usize = 22;
    /// Header + bitmap + reject code.
    pub const REJECT_PART_LEN: usize = 4;

    /// Parses the first 22 bytes of `input` (a whole frame payload): a short
    /// input is [`WireError::Truncated`]. The complete-mode form of [`header`].
    pub fn parse(input: &[u8]) -> Result<VisaHeader, WireError> {
        whole("VISA header", Self::LEN, header, input)
    }

    /// A fresh header: format 0x01, text format 0x02, all flags zero.
    pub fn new(destination: [u8; 3], source: [u8; 3], total_length: u16) -> VisaHeader {
        let mut raw = [0u8; Self::LEN];
        raw[0] = Self::LEN as u8;
        raw[1] = 0x01;
        raw[2] = 0x02;
        raw[3..5].copy_from_slice(&total_length.to_be_bytes());
        raw[5..8].copy_from_slice(&destination);
        raw[8..11].copy_from_slice(&source);
        VisaHeader(raw)
    }

    pub fn header_format(&self) -> u8 {
        self.0[1]
    }

    pub fn text_format(&self) -> u8 {
        self.0[2]
    }

    /// Total length, header included.
    pub fn total_length(&self) -> u16 {
        u16::from_be_bytes([self.0[3], self.0[4]])
    }

    pub fn destination_id(&self) -> [u8; 3] {
        [self.0[5], self.0[6], self.0[7]]
    }

    pub fn source_id(&self) -> [u8; 3] {
        [self.0[8], self.0[9], self.0[10]]
    }

    pub fn round_trip_control(&self) -> u8 {
        self.0[11]
    }

    pub fn base1_flags(&self) -> [u8; 2] {
        [self.0[12], self.0[13]]
    }

    pub fn message_status_flags(&self) -> [u8; 3] {
        [self.0[14], self.0[15], self.0[16]]
    }

    pub fn batch_number(&self) -> u8 {
        self.0[17]
    }

    pub fn user_info(&self) -> u8 {
        self.0[21]
    }

    /// A reject: the format byte's 0x80 bit, or the 0x1A header length that
    /// counts the reject bitmap and code (both forms are seen).
    pub fn is_reject(&self) -> bool {
        self.0[1] & REJECT_FLAG != 0 || self.0[0] == REJECT_HEADER_LEN
    }

    /// Marks the header as a reject (the form the switch emits: format bit 0x80).
    pub fn set_reject(&mut self) {
        self.0[1] |= REJECT_FLAG;
    }

    pub fn set_total_length(&mut self, len: u16) {
        self.0[3..5].copy_from_slice(&len.to_be_bytes());
    }

    /// The header a response carries: station IDs swapped.
    pub fn swapped(mut self) -> VisaHeader {
        Self::swap_ids_in_place(&mut self.0);
        self
    }

    /// Swaps the station IDs of a header at the start of `buf`.
    pub fn swap_ids_in_place(buf: &mut [u8]) {
        <Self as SchemeHeader>::swap_ids_in(buf);
    }

    /// Rewrites the total length of a header at the start of `buf`.
    pub fn set_total_length_in_place(buf: &mut [u8], len: u16) {
        if buf.len() >= Self::LEN {
            buf[3..5].copy_from_slice(&len.to_be_bytes());
        }
    }
}

impl VisaReject {
    /// Parses the reject bitmap and code at the start of `input` (whole-buffer
    /// form of [`reject_code`]): a short input is [`WireError::Truncated`].
    pub fn parse(input: &[u8]) -> Result<VisaReject, WireError> {
        whole(
            "VISA reject code",
            VisaHeader::REJECT_PART_LEN,
            reject_code,
            input,
        )
    }
}

/// nom parser (streaming) for a VISA header: `Incomplete` until all 22 bytes
/// are there, then the header-length byte must be 0x16 or 0x1A (a failure at
/// offset 0 naming it).
#[inline]
pub fn header(input: &[u8]) -> WireResult<'_, VisaHeader> {
    let (rest, raw) = array::<{ VisaHeader::LEN }>(input)?;
    if usize::from(raw[0]) != VisaHeader::LEN && raw[0] != REJECT_HEADER_LEN {
        return Err(bad(
            "VISA header length",
            0,
            EnvelopeReason::LengthEither {
                found: raw[0],
                short: VisaHeader::LEN as u8,
                long: REJECT_HEADER_LEN,
            },
        ));
    }
    Ok((rest, VisaHeader(raw)))
}

/// nom parser (streaming) for the reject bitmap and reject code that follow a
/// reject header. Any four bytes are accepted: they are reported, not judged.
#[inline]
pub fn reject_code(input: &[u8]) -> WireResult<'_, VisaReject> {
    let (rest, [b0, b1, c0, c1]) = array::<{ VisaHeader::REJECT_PART_LEN }>(input)?;
    Ok((
        rest,
        VisaReject {
            bitmap: [b0, b1],
            code: [c0, c1],
        },
    ))
}

/// nom parser (streaming) for everything between a reject header and the
/// original body: the reject bitmap and code, then the original 22-byte header.
/// Error offsets count from the start of `input` (the original header's
/// length byte is offset 4).
#[inline]
pub fn rejected(input: &[u8]) -> WireResult<'_, (VisaReject, VisaHeader)> {
    let (rest, code) = reject_code(input)?;
    let (rest, original) =
        header(rest).map_err(|e| e.map(|e| e.shifted(VisaHeader::REJECT_PART_LEN)))?;
    Ok((rest, (code, original)))
}

impl SchemeHeader for VisaHeader {
    const LEN: usize = 22;
    const PART: &'static str = "VISA header";
    const IDS: Option<IdFields> = Some(IdFields {
        destination: 5,
        source: 8,
        len: 3,
    });

    #[inline(always)]
    fn header(input: &[u8]) -> WireResult<'_, Self> {
        header(input)
    }

    /// A reject carries its bitmap and code, then the original header,
    /// before the body.
    #[inline(always)]
    fn envelope_part<'a, const COMPLETE: bool>(
        parts: Parts<'a, COMPLETE>,
        input: &'a [u8],
        rejected: &mut Option<Rejected>,
    ) -> WireResult<'a, Self> {
        let (rest, h) = parts.read(Self::PART, Self::LEN, header, input)?;
        if !h.is_reject() {
            return Ok((rest, h));
        }
        let (rest, code) =
            parts.read("VISA reject code", Self::REJECT_PART_LEN, reject_code, rest)?;
        let (rest, original) = parts.read(Self::PART, Self::LEN, header, rest)?;
        *rejected = Some(Rejected {
            visa: Some(code),
            original: original.into(),
        });
        Ok((rest, h))
    }

    fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The configured station IDs (6 digits each), or `000000`.
    fn fresh(settings: &Fresh<'_>) -> Result<Self, FreshError> {
        let station = |setting, id: Option<&str>| {
            let text = id.unwrap_or("000000");
            text.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| hex_bytes::<3>(text))
                .flatten()
                .ok_or_else(|| FreshError::new(setting, text, "a VISA station ID (6 digits)"))
        };
        let destination = station(Setting::DestinationId, settings.destination_id)?;
        let source = station(Setting::SourceId, settings.source_id)?;
        Ok(VisaHeader::new(destination, source, 0))
    }

    fn sample() -> Self {
        VisaHeader::new([0x00, 0x00, 0x01], [0x45, 0x67, 0x89], 0)
    }

    /// Two bytes, binary: a longer message cannot be sent.
    #[inline]
    fn set_total_length_in(buf: &mut [u8], total: usize) -> Result<(), TotalTooLong> {
        let len = u16::try_from(total).map_err(|_| TotalTooLong {
            total,
            max: usize::from(u16::MAX),
        })?;
        Self::set_total_length_in_place(buf, len);
        Ok(())
    }

    fn describe(&self, frame_len: Option<usize>) -> Description {
        let h = self;
        let mut d = Description::new(Self::PART, "22 bytes");
        d.row("header length", flag(h.0[0]))
            .row(
                "header format",
                format_args!(
                    "{:#04x}{}",
                    h.header_format(),
                    if h.is_reject() { "  reject" } else { "" }
                ),
            )
            .row("text format", flag(h.text_format()))
            .row("total length", h.total_length())
            .row("destination ID", Hex(&h.destination_id()))
            .row("source ID", Hex(&h.source_id()))
            .row("round-trip control", flag(h.round_trip_control()))
            .row("BASE I flags", Hex(&h.base1_flags()))
            .row("message status", Hex(&h.message_status_flags()))
            .row("batch number", flag(h.batch_number()))
            .row("reserved", Hex(&h.0[18..21]))
            .row("user info", flag(h.user_info()));
        if let Some(len) = frame_len
            && !h.is_reject()
            && usize::from(h.total_length()) != len
        {
            d.row(
                "! check",
                format_args!(
                    "total length {} does not match the frame ({len} bytes)",
                    h.total_length()
                ),
            );
        }
        d.key("header_length", h.0[0])
            .key("header_format", hex_byte(h.header_format()))
            .key("text_format", hex_byte(h.text_format()))
            .key("total_length", h.total_length())
            .key("destination_id", Hex(&h.destination_id()).to_string())
            .key("source_id", Hex(&h.source_id()).to_string())
            .key("round_trip_control", hex_byte(h.round_trip_control()))
            .key("base1_flags", Hex(&h.base1_flags()).to_string())
            .key(
                "message_status_flags",
                Hex(&h.message_status_flags()).to_string(),
            )
            .key("batch_number", hex_byte(h.batch_number()))
            .key("reserved", Hex(&h.0[18..21]).to_string())
            .key("user_info", hex_byte(h.user_info()))
            .key("is_reject", h.is_reject());
        d
    }
}

impl std::fmt::Debug for VisaHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02X}")).collect::<String>();
        f.debug_struct("VisaHeader")
            .field(
                "header_format",
                &format_args!("{:#04x}", self.header_format()),
            )
            .field("total_length", &self.total_length())
            .field("destination_id", &hex(&self.destination_id()))
            .field("source_id", &hex(&self.source_id()))
            .field("reject", &self.is_reject())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_and_swap() {
        let h = VisaHeader::new([0x00, 0x00, 0x00], [0x45, 0x67, 0x89], 80);
        assert_eq!(&h.0[..5], &[0x16, 0x01, 0x02, 0x00, 0x50]);
        let s = h.swapped();
        assert_eq!(s.destination_id(), [0x45, 0x67, 0x89]);
        assert_eq!(s.source_id(), [0, 0, 0]);
        assert_eq!(VisaHeader::parse(&s.0).unwrap(), s);
        assert!(!h.is_reject());
    }

    #[test]
    fn reject_forms() {
        let mut h = VisaHeader::new([1, 2, 3], [4, 5, 6], 100);
        h.set_reject();
        assert!(h.is_reject());
        let mut counted = VisaHeader::new([1, 2, 3], [4, 5, 6], 100);
        counted.0[0] = 0x1A;
        assert!(VisaHeader::parse(&counted.0).unwrap().is_reject());
        let r = VisaReject::parse(&[0x80, 0x00, 0x00, 0x12]).unwrap();
        assert_eq!(r.code, [0x00, 0x12]);
        assert!(VisaReject::parse(&[1, 2]).is_err());
    }

    #[test]
    fn bad_length_byte() {
        let mut raw = [0u8; 22];
        raw[0] = 0x17;
        assert!(matches!(
            VisaHeader::parse(&raw),
            Err(WireError::BadEnvelope { .. })
        ));
    }

    #[test]
    fn streaming_header_split_everywhere() {
        use crate::part::split::check_every_split;
        let h = VisaHeader::new([0, 0, 1], [0x45, 0x67, 0x89], 80);
        let mut wire = h.0.to_vec();
        wire.extend_from_slice(&[0x02, 0x00]);
        let (rest, parsed) = check_every_split(header, &wire).unwrap();
        assert_eq!((rest, parsed), (&[0x02u8, 0x00][..], h));
        wire[0] = 0x17;
        assert!(matches!(
            check_every_split(header, &wire),
            Err(nom::Err::Failure(WireError::BadEnvelope {
                what: "VISA header length",
                offset: 0,
                ..
            }))
        ));
    }

    /// The reject form: reject header, bitmap + code, then a second 22-byte
    /// header (the original), then the original body.
    fn reject_wire(outer: VisaHeader, code: [u8; 4], inner: VisaHeader, body: &[u8]) -> Vec<u8> {
        let mut wire = outer.0.to_vec();
        wire.extend_from_slice(&code);
        wire.extend_from_slice(&inner.0);
        wire.extend_from_slice(body);
        wire
    }

    #[test]
    fn rejected_part_split_everywhere() {
        use crate::part::split::check_every_split;
        let inner = VisaHeader::new([0, 0, 2], [0, 0, 1], 30);
        let mut wire = [0x80, 0x00, 0x00, 0x07].to_vec();
        wire.extend_from_slice(&inner.0);
        wire.extend_from_slice(&[0x02, 0x00]);
        let (rest, (code, original)) = check_every_split(rejected, &wire).unwrap();
        assert_eq!(code.bitmap, [0x80, 0x00]);
        assert_eq!(code.code, [0x00, 0x07]);
        assert_eq!(original, inner);
        assert_eq!(rest, &[0x02, 0x00]);
        // A bad original header is reported at its own offset (4).
        wire[4] = 0x99;
        assert!(matches!(
            check_every_split(rejected, &wire),
            Err(nom::Err::Failure(WireError::BadEnvelope { offset: 4, .. }))
        ));
        // Whole-buffer form of the bitmap + code.
        assert_eq!(
            VisaReject::parse(&wire[..3]),
            Err(WireError::truncated("VISA reject code", 0, 4, 3))
        );
    }

    proptest! {
        #[test]
        fn headers_round_trip(
            destination: [u8; 3],
            source: [u8; 3],
            total: u16,
            rest in proptest::collection::vec(any::<u8>(), 11),
            counted in any::<bool>(),
        ) {
            let mut h = VisaHeader::new(destination, source, total);
            h.0[11..].copy_from_slice(&rest);
            if counted {
                h.0[0] = REJECT_HEADER_LEN;
            }
            let parsed = VisaHeader::parse(&h.0).unwrap();
            prop_assert_eq!(parsed, h);
            prop_assert_eq!(parsed.destination_id(), destination);
            prop_assert_eq!(parsed.source_id(), source);
            prop_assert_eq!(parsed.total_length(), total);
            prop_assert_eq!(parsed.swapped().swapped(), h);
        }

        /// Both reject forms (format bit 0x80, or header length 0x1A) carry
        /// the bitmap + code and the original header, split anywhere.
        #[test]
        fn reject_form_round_trips(
            station: [u8; 3],
            code: [u8; 4],
            counted in any::<bool>(),
            body in proptest::collection::vec(any::<u8>(), 0..8),
        ) {
            let mut outer = VisaHeader::new(station, [0, 0, 1], 48 + body.len() as u16);
            if counted {
                outer.0[0] = REJECT_HEADER_LEN;
            } else {
                outer.set_reject();
            }
            let inner = VisaHeader::new([0, 0, 1], station, 22 + body.len() as u16);
            let wire = reject_wire(outer, code, inner, &body);
            let (rest, h) = header(&wire).unwrap();
            prop_assert!(h.is_reject());
            let (rest, (reject, original)) =
                crate::part::split::check_every_split(rejected, rest).unwrap();
            prop_assert_eq!(reject.bitmap, [code[0], code[1]]);
            prop_assert_eq!(reject.code, [code[2], code[3]]);
            prop_assert_eq!(original, inner);
            prop_assert_eq!(rest, &body[..]);
        }
    }
}
