//! The 6-byte BCD header of UnionPay POS terminal messages (after the TPDU).

use super::WireError;
use super::part::{WireResult, array, whole};

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
