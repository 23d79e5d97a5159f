//! The 46-byte header of the UnionPay inter-institution link (CUPS).
//!
//! | offset | len | field |
//! |---|---|---|
//! | 0 | 1 | header length, binary 0x2E |
//! | 1 | 1 | flag + version: high bit = test, low 7 bits = version (1 or 2) |
//! | 2 | 4 | total message length, ASCII digits (same value as `LLLL`) |
//! | 6 | 11 | destination ID, ASCII, space padded |
//! | 17 | 11 | source ID |
//! | 28 | 3 | reserved (binary zeros, some peers send ASCII `000`) |
//! | 31 | 1 | batch number |
//! | 32 | 8 | transaction info, ASCII `00000000` |
//! | 40 | 1 | user info |
//! | 41 | 5 | reject code, ASCII `00000` = accepted |

use super::WireError;
use super::describe::{Hex, flag, hex_byte};
use super::fresh::{Fresh, FreshError, Setting};
use super::part::{WireResult, array, bad, whole};
use super::{Description, IdFields, Parts, SchemeHeader, TotalTooLong};
use crate::EnvelopeReason;
use crate::envelope::Rejected;

/// Reject codes UnionPay puts in a rejected message's header.
pub mod reject {
    pub const ACCEPTED: [u8; 5] = *b"00000";
    pub const BAD_HEADER_LENGTH: [u8; 5] = *b"00015";
    pub const BAD_VERSION: [u8; 5] = *b"00025";
    pub const BAD_TOTAL_LENGTH: [u8; 5] = *b"00035";
    pub const BAD_DESTINATION_ID: [u8; 5] = *b"00045";
    pub const BAD_SOURCE_ID: [u8; 5] = *b"00055";

    /// What a reject code means, as `decode` shows it.
    pub fn reason(code: [u8; 5]) -> &'static str {
        match code {
            ACCEPTED => "accepted",
            BAD_HEADER_LENGTH => "rejected: bad header length",
            BAD_VERSION => "rejected: bad version",
            BAD_TOTAL_LENGTH => "rejected: total length out of range",
            BAD_DESTINATION_ID => "rejected: bad destination ID",
            BAD_SOURCE_ID => "rejected: bad source ID",
            _ => "rejected",
        }
    }
}

/// A CUPS header, kept as its 46 raw bytes so it can be forwarded unchanged.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CupsHeader(pub [u8; CupsHeader::LEN]);

/// Largest body a CUPS message may carry after its header.
pub const MAX_BODY: usize = 1892;

const TOTAL_LEN: std::ops::Range<usize> = 2..6;
const DESTINATION: std::ops::Range<usize> = 6..17;
const SOURCE: std::ops::Range<usize> = 17..28;
const REJECT: std::ops::Range<usize> = 41..46;

impl CupsHeader {
    pub const LEN: usize = 46;

    /// Parses the first 46 bytes of `input` (a whole frame payload): a short
    /// input is [`WireError::Truncated`]. The complete-mode form of [`header`].
    /// Only the header-length byte is checked here, because without it the body
    /// cannot be found; everything else is for [`CupsHeader::check`] so that a
    /// bad header can be answered with a reject.
    pub fn parse(input: &[u8]) -> Result<CupsHeader, WireError> {
        whole("CUPS header", Self::LEN, header, input)
    }

    /// A fresh header as the switch emits it: version 2, not a test message,
    /// reserved binary zeros, transaction info `00000000`, accepted.
    pub fn new(destination: &str, source: &str, total_length: usize) -> CupsHeader {
        let mut raw = [0u8; Self::LEN];
        raw[0] = Self::LEN as u8;
        raw[1] = 0x02;
        raw[32..40].copy_from_slice(b"00000000");
        raw[REJECT].copy_from_slice(&reject::ACCEPTED);
        let mut h = CupsHeader(raw);
        h.set_destination_id(destination);
        h.set_source_id(source);
        h.set_total_length(total_length);
        h
    }

    pub fn flag_version(&self) -> u8 {
        self.0[1]
    }

    /// High bit of the flag byte: a test message.
    pub fn is_test(&self) -> bool {
        self.0[1] & 0x80 != 0
    }

    /// Low seven bits of the flag byte: 1 or 2 on a valid header.
    pub fn version(&self) -> u8 {
        self.0[1] & 0x7F
    }

    /// The total length field, if it holds four ASCII digits.
    pub fn total_length(&self) -> Option<usize> {
        ascii_number(&self.0[TOTAL_LEN])
    }

    pub fn destination_id_raw(&self) -> &[u8] {
        &self.0[DESTINATION]
    }

    pub fn source_id_raw(&self) -> &[u8] {
        &self.0[SOURCE]
    }

    /// Destination institution ID without its space padding.
    pub fn destination_id(&self) -> &str {
        trimmed_id(&self.0[DESTINATION])
    }

    /// Source institution ID without its space padding.
    pub fn source_id(&self) -> &str {
        trimmed_id(&self.0[SOURCE])
    }

    pub fn batch_number(&self) -> u8 {
        self.0[31]
    }

    pub fn transaction_info(&self) -> &[u8] {
        &self.0[32..40]
    }

    pub fn user_info(&self) -> u8 {
        self.0[40]
    }

    pub fn reject_code(&self) -> [u8; 5] {
        let mut code = [0u8; 5];
        code.copy_from_slice(&self.0[REJECT]);
        code
    }

    /// A non-zero reject code: the original header follows this one.
    pub fn is_reject(&self) -> bool {
        self.0[REJECT] != reject::ACCEPTED
    }

    pub fn set_total_length(&mut self, len: usize) {
        super::write_ascii_decimal(&mut self.0[TOTAL_LEN], len as u64);
    }

    pub fn set_destination_id(&mut self, id: &str) {
        write_id(&mut self.0[DESTINATION], id);
    }

    pub fn set_source_id(&mut self, id: &str) {
        write_id(&mut self.0[SOURCE], id);
    }

    pub fn set_reject_code(&mut self, code: [u8; 5]) {
        self.0[REJECT].copy_from_slice(&code);
    }

    /// The header a response carries: destination and source IDs swapped.
    pub fn swapped(mut self) -> CupsHeader {
        Self::swap_ids_in_place(&mut self.0);
        self
    }

    /// Swaps the IDs of a header at the start of `buf` (no-op on a short buffer).
    pub fn swap_ids_in_place(buf: &mut [u8]) {
        <Self as SchemeHeader>::swap_ids_in(buf);
    }

    /// Rewrites the total length of a header at the start of `buf`.
    pub fn set_total_length_in_place(buf: &mut [u8], len: usize) {
        if buf.len() >= Self::LEN {
            super::write_ascii_decimal(&mut buf[TOTAL_LEN], len as u64);
        }
    }

    /// Validates the header against the frame it came in (`frame_len` = the value
    /// of `LLLL`) and returns the reject code UnionPay would give, if any.
    pub fn check(&self, frame_len: usize) -> Option<[u8; 5]> {
        if self.0[0] as usize != Self::LEN {
            return Some(reject::BAD_HEADER_LENGTH);
        }
        if !matches!(self.version(), 1 | 2) {
            return Some(reject::BAD_VERSION);
        }
        match self.total_length() {
            Some(n) if n == frame_len && (Self::LEN..=Self::LEN + MAX_BODY).contains(&n) => {}
            _ => return Some(reject::BAD_TOTAL_LENGTH),
        }
        if !valid_id(&self.0[DESTINATION]) {
            return Some(reject::BAD_DESTINATION_ID);
        }
        if !valid_id(&self.0[SOURCE]) {
            return Some(reject::BAD_SOURCE_ID);
        }
        None
    }
}

/// nom parser (streaming) for a CUPS header: `Incomplete` until all 46 bytes
/// are there, then the header-length byte must be 46 (a failure at offset 0
/// naming it). The other fields are checked by [`CupsHeader::check`].
#[inline]
pub fn header(input: &[u8]) -> WireResult<'_, CupsHeader> {
    let (rest, raw) = array::<{ CupsHeader::LEN }>(input)?;
    if usize::from(raw[0]) != CupsHeader::LEN {
        return Err(bad(
            "CUPS header length",
            0,
            EnvelopeReason::Length {
                found: raw[0],
                expected: CupsHeader::LEN as u8,
            },
        ));
    }
    Ok((rest, CupsHeader(raw)))
}

impl SchemeHeader for CupsHeader {
    const LEN: usize = 46;
    const PART: &'static str = "CUPS header";
    const IDS: Option<IdFields> = Some(IdFields {
        destination: DESTINATION.start,
        source: SOURCE.start,
        len: DESTINATION.end - DESTINATION.start,
    });

    #[inline(always)]
    fn header(input: &[u8]) -> WireResult<'_, Self> {
        header(input)
    }

    /// A reject (non-zero reject code) carries the original header before the body.
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
        let (rest, original) = parts.read(Self::PART, Self::LEN, header, rest)?;
        *rejected = Some(Rejected {
            visa: None,
            original: original.into(),
        });
        Ok((rest, h))
    }

    fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The institution IDs of the link (the peer's as destination); empty
    /// when not set, as UnionPay's own echoes are.
    fn fresh(settings: &Fresh<'_>) -> Result<Self, FreshError> {
        let destination = settings.destination_id.unwrap_or_default();
        let source = settings.source_id.unwrap_or_default();
        for (setting, id) in [
            (Setting::DestinationId, destination),
            (Setting::SourceId, source),
        ] {
            if id.len() > DESTINATION.end - DESTINATION.start || !id.is_ascii() {
                return Err(FreshError::new(
                    setting,
                    id,
                    "a CUPS institution ID (up to 11 ASCII characters)",
                ));
            }
        }
        Ok(CupsHeader::new(destination, source, 0))
    }

    fn sample() -> Self {
        CupsHeader::new("00010000", "03105840", 0)
    }

    #[inline]
    fn set_total_length_in(buf: &mut [u8], total: usize) -> Result<(), TotalTooLong> {
        Self::set_total_length_in_place(buf, total);
        Ok(())
    }

    fn describe(&self, frame_len: Option<usize>) -> Description {
        let h = self;
        let code = h.reject_code();
        let lossy = String::from_utf8_lossy;
        let mut d = Description::new(Self::PART, "46 bytes");
        d.row("header length", h.0[0])
            .row(
                "flag/version",
                format_args!(
                    "{:#04x}  version {}, {}",
                    h.flag_version(),
                    h.version(),
                    if h.is_test() { "test" } else { "production" }
                ),
            )
            .row("total length", lossy(&h.0[TOTAL_LEN]))
            .row("destination ID", h.destination_id())
            .row("source ID", h.source_id())
            .row("reserved", Hex(&h.0[28..31]))
            .row("batch number", flag(h.batch_number()))
            .row("transaction info", lossy(h.transaction_info()))
            .row("user info", flag(h.user_info()))
            .row(
                "reject code",
                format_args!("{}  {}", lossy(&code), reject::reason(code)),
            );
        if let Some(len) = frame_len
            && let Some(code) = h.check(len)
        {
            d.row(
                "! check",
                format_args!(
                    "UnionPay would reject this header: {} {}",
                    lossy(&code),
                    reject::reason(code)
                ),
            );
        }
        d.key("header_length", h.0[0])
            .key("flag_version", hex_byte(h.flag_version()))
            .key("version", h.version())
            .key("test", h.is_test())
            .key("total_length", lossy(&h.0[TOTAL_LEN]))
            .key("destination_id", h.destination_id())
            .key("source_id", h.source_id())
            .key("reserved", Hex(&h.0[28..31]).to_string())
            .key("batch_number", hex_byte(h.batch_number()))
            .key("transaction_info", lossy(h.transaction_info()))
            .key("user_info", hex_byte(h.user_info()))
            .key("reject_code", lossy(&code));
        d
    }
}

impl std::fmt::Debug for CupsHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CupsHeader")
            .field(
                "flag_version",
                &format_args!("{:#04x}", self.flag_version()),
            )
            .field("total_length", &self.total_length())
            .field("destination_id", &self.destination_id())
            .field("source_id", &self.source_id())
            .field("batch_number", &self.batch_number())
            .field("reject_code", &String::from_utf8_lossy(&self.0[REJECT]))
            .finish()
    }
}

fn ascii_number(digits: &[u8]) -> Option<usize> {
    digits.iter().try_fold(0usize, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + usize::from(d - b'0'))
    })
}

fn write_id(dst: &mut [u8], id: &str) {
    dst.fill(b' ');
    let n = id.len().min(dst.len());
    dst[..n].copy_from_slice(&id.as_bytes()[..n]);
}

/// An institution ID: at least one digit, left-justified, space padded.
fn valid_id(raw: &[u8]) -> bool {
    let trimmed = raw.trim_ascii_end();
    !trimmed.is_empty() && trimmed.iter().all(u8::is_ascii_digit)
}

fn trimmed_id(raw: &[u8]) -> &str {
    std::str::from_utf8(raw).map(str::trim_end).unwrap_or("?")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> CupsHeader {
        CupsHeader::new("00010000", "03105840", 146)
    }

    #[test]
    fn new_header_has_documented_layout() {
        let h = sample();
        assert_eq!(h.0[0], 0x2E);
        assert_eq!(h.0[1], 0x02);
        assert_eq!(&h.0[2..6], b"0146");
        assert_eq!(&h.0[6..17], b"00010000   ");
        assert_eq!(&h.0[17..28], b"03105840   ");
        assert_eq!(&h.0[28..32], &[0, 0, 0, 0]);
        assert_eq!(&h.0[32..40], b"00000000");
        assert_eq!(&h.0[41..46], b"00000");
        assert_eq!(CupsHeader::parse(&h.0).unwrap(), h);
        assert_eq!(h.check(146), None);
    }

    #[test]
    fn swap_exchanges_ids_only() {
        let h = sample().swapped();
        assert_eq!(h.destination_id(), "03105840");
        assert_eq!(h.source_id(), "00010000");
        assert_eq!(h.total_length(), Some(146));
    }

    #[test]
    fn check_gives_unionpay_reject_codes() {
        let h = sample();
        assert_eq!(h.check(147), Some(reject::BAD_TOTAL_LENGTH));
        let mut bad_version = h;
        bad_version.0[1] = 0x83;
        assert_eq!(bad_version.check(146), Some(reject::BAD_VERSION));
        let mut test_flag = h;
        test_flag.0[1] = 0x81;
        assert!(test_flag.is_test());
        assert_eq!(test_flag.check(146), None);
        let mut bad_dest = h;
        bad_dest.set_destination_id("ABC");
        assert_eq!(bad_dest.check(146), Some(reject::BAD_DESTINATION_ID));
        let mut bad_src = h;
        bad_src.set_source_id("");
        assert_eq!(bad_src.check(146), Some(reject::BAD_SOURCE_ID));
        let too_long = CupsHeader::new("1", "2", 46 + MAX_BODY + 1);
        assert_eq!(
            too_long.check(46 + MAX_BODY + 1),
            Some(reject::BAD_TOTAL_LENGTH)
        );
    }

    #[test]
    fn ascii_reserved_bytes_are_accepted() {
        let mut h = sample();
        h.0[28..31].copy_from_slice(b"000");
        h.0[31] = 0x01;
        assert_eq!(h.check(146), None);
    }

    #[test]
    fn parse_rejects_wrong_header_length_and_truncation() {
        let mut raw = sample().0;
        raw[0] = 45;
        assert!(matches!(
            CupsHeader::parse(&raw),
            Err(WireError::BadEnvelope { offset: 0, .. })
        ));
        assert!(matches!(
            CupsHeader::parse(&raw[..10]),
            Err(WireError::Truncated {
                need: 46,
                have: 10,
                ..
            })
        ));
    }

    #[test]
    fn in_place_edits() {
        let mut buf = sample().0.to_vec();
        buf.extend_from_slice(b"0200");
        CupsHeader::swap_ids_in_place(&mut buf);
        CupsHeader::set_total_length_in_place(&mut buf, 1234);
        let h = CupsHeader::parse(&buf).unwrap();
        assert_eq!(h.source_id(), "00010000");
        assert_eq!(h.total_length(), Some(1234));
        assert_eq!(&buf[46..], b"0200");
    }

    #[test]
    fn streaming_header_split_everywhere() {
        use crate::part::split::check_every_split;
        let mut wire = sample().0.to_vec();
        wire.extend_from_slice(b"0200");
        let (rest, h) = check_every_split(header, &wire).unwrap();
        assert_eq!(rest, b"0200");
        assert_eq!(h, sample());
        // A wrong header length is judged once all 46 bytes are in, at offset 0.
        wire[0] = 0x2F;
        let err = check_every_split(header, &wire).unwrap_err();
        assert!(matches!(
            err,
            nom::Err::Failure(WireError::BadEnvelope {
                what: "CUPS header length",
                offset: 0,
                ..
            })
        ));
        assert_eq!(
            header(&wire[..45]),
            Err(nom::Err::Incomplete(nom::Needed::new(1)))
        );
    }

    /// Institution IDs as UnionPay writes them: 1 to 11 digits.
    fn id() -> impl Strategy<Value = String> {
        "[0-9]{1,11}"
    }

    proptest! {
        #[test]
        fn built_headers_round_trip(
            destination in id(),
            source in id(),
            total in CupsHeader::LEN..=CupsHeader::LEN + MAX_BODY,
            body: Vec<u8>,
        ) {
            let h = CupsHeader::new(&destination, &source, total);
            let mut wire = h.0.to_vec();
            wire.extend_from_slice(&body);
            let parsed = CupsHeader::parse(&wire).unwrap();
            prop_assert_eq!(parsed, h);
            prop_assert_eq!(parsed.destination_id(), destination.as_str());
            prop_assert_eq!(parsed.source_id(), source.as_str());
            prop_assert_eq!(parsed.total_length(), Some(total));
            prop_assert_eq!(parsed.check(total), None);
            let (rest, streamed) = header(&wire).unwrap();
            prop_assert_eq!(streamed, h);
            prop_assert_eq!(rest, &body[..]);
        }

        /// Any 45 bytes after a 0x2E length byte are a header, kept byte for byte.
        #[test]
        fn raw_headers_round_trip(tail in proptest::collection::vec(any::<u8>(), 45)) {
            let mut raw = [0u8; CupsHeader::LEN];
            raw[0] = 0x2E;
            raw[1..].copy_from_slice(&tail);
            prop_assert_eq!(CupsHeader::parse(&raw), Ok(CupsHeader(raw)));
        }
    }
}
