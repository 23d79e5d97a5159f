//! The 6-byte BCD header of UnionPay POS terminal messages (after the TPDU).

use super::WireError;
use super::describe::{Hex, hex_byte};
use super::fresh::{Fresh, FreshError, Setting, hex_bytes};
use super::part::{WireResult, array, whole};
use super::{Description, IdFields, SchemeHeader};

/// POS application header, e.g. `60 31 00 31 07 30`: application type (`60`, `61`
/// for IC), software version, terminal status, processing requirement, software
/// sub-version. Kept raw: the switch forwards it unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PosHeader(pub [u8; 6]);

impl PosHeader {
    pub const LEN: usize = 6;

    /// Parses the first six bytes of `input` (a whole frame payload after the
    /// TPDU): a short input is [`WireError::Truncated`]. The complete-mode form
    /// of [`header`].
    pub fn parse(input: &[u8]) -> Result<PosHeader, WireError> {
        whole("POS header", Self::LEN, header, input)
    }

    /// Application type: `0x60` for magnetic stripe, `0x61` for IC applications.
    pub fn application_type(&self) -> u8 {
        self.0[0]
    }

    pub fn software_version(&self) -> u8 {
        self.0[1]
    }

    pub fn terminal_status(&self) -> u8 {
        self.0[2]
    }

    pub fn processing_requirement(&self) -> u8 {
        self.0[3]
    }

    /// Software sub-version: the last two bytes.
    pub fn software_subversion(&self) -> [u8; 2] {
        [self.0[4], self.0[5]]
    }

    /// What the application type says, as `decode` shows it.
    pub fn application(&self) -> &'static str {
        match self.application_type() {
            0x60 => "magnetic stripe",
            0x61 => "IC",
            _ => "",
        }
    }
}

/// No IDs and no total length: the switch copies a POS header as it came.
impl SchemeHeader for PosHeader {
    const LEN: usize = 6;
    const PART: &'static str = "POS header";
    const IDS: Option<IdFields> = None;

    #[inline(always)]
    fn header(input: &[u8]) -> WireResult<'_, Self> {
        header(input)
    }

    fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The configured header as hex, or a magnetic-stripe application's.
    fn fresh(settings: &Fresh<'_>) -> Result<Self, FreshError> {
        let text = settings.header_hex.unwrap_or("603100310730");
        hex_bytes::<{ PosHeader::LEN }>(text)
            .map(PosHeader)
            .ok_or_else(|| FreshError::new(Setting::HeaderHex, text, "a POS header: 12 hex digits"))
    }

    fn sample() -> Self {
        PosHeader([0x60, 0x31, 0x00, 0x31, 0x07, 0x30])
    }

    fn describe(&self, _frame_len: Option<usize>) -> Description {
        let h = self;
        let mut d = Description::new(Self::PART, h);
        d.row(
            "application type",
            format_args!("{:02X}  {}", h.application_type(), h.application()),
        )
        .row("software version", hex_byte(h.software_version()))
        .row("terminal status", hex_byte(h.terminal_status()))
        .row("processing req.", hex_byte(h.processing_requirement()))
        .row("software subversion", Hex(&h.software_subversion()));
        d.key("raw", h.to_string())
            .key("application_type", hex_byte(h.application_type()))
            .key("software_version", hex_byte(h.software_version()))
            .key("terminal_status", hex_byte(h.terminal_status()))
            .key(
                "processing_requirement",
                hex_byte(h.processing_requirement()),
            )
            .key(
                "software_subversion",
                Hex(&h.software_subversion()).to_string(),
            );
        d
    }
}

/// nom parser (streaming) for a POS header: `Incomplete` until all six bytes
/// are there. Any six bytes are a header (the switch forwards it unchanged).
#[inline]
pub fn header(input: &[u8]) -> WireResult<'_, PosHeader> {
    let (rest, raw) = array::<{ PosHeader::LEN }>(input)?;
    Ok((rest, PosHeader(raw)))
}

impl std::fmt::Display for PosHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02X}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields() {
        let h = PosHeader::parse(&[0x60, 0x31, 0x00, 0x31, 0x07, 0x30]).unwrap();
        assert_eq!(h.application_type(), 0x60);
        assert_eq!(h.software_version(), 0x31);
        assert_eq!(h.processing_requirement(), 0x31);
        assert_eq!(h.software_subversion(), [0x07, 0x30]);
        assert_eq!(h.to_string(), "603100310730");
    }

    #[test]
    fn short_input_is_truncated() {
        assert!(matches!(
            PosHeader::parse(&[0x60; 5]),
            Err(WireError::Truncated {
                need: 6,
                have: 5,
                ..
            })
        ));
    }

    #[test]
    fn streaming_header_split_everywhere() {
        use crate::part::split::check_every_split;
        let wire = [0x60, 0x31, 0x00, 0x31, 0x07, 0x30, 0x02, 0x00];
        let (rest, h) = check_every_split(header, &wire).unwrap();
        assert_eq!(rest, &[0x02, 0x00]);
        assert_eq!(PosHeader::parse(&wire), Ok(h));
    }
}
