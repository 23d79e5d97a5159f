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
//! A reject carries a 2-byte bitmap and a 2-byte reject code after the header,
//! then the original 22-byte header, then the original body.

use super::WireError;

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

    pub fn parse(input: &[u8]) -> Result<VisaHeader, WireError> {
        let raw: [u8; Self::LEN] = input
            .get(..Self::LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| WireError::truncated("VISA header", 0, Self::LEN, input.len()))?;
        if raw[0] as usize != Self::LEN && raw[0] != REJECT_HEADER_LEN {
            return Err(WireError::BadEnvelope {
                what: "VISA header length",
                offset: 0,
                reason: format!("is {:#04x}, expected 0x16 or 0x1A", raw[0]),
            });
        }
        Ok(VisaHeader(raw))
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
        if buf.len() >= Self::LEN {
            let (dst, src) = buf[5..11].split_at_mut(3);
            dst.swap_with_slice(src);
        }
    }

    /// Rewrites the total length of a header at the start of `buf`.
    pub fn set_total_length_in_place(buf: &mut [u8], len: u16) {
        if buf.len() >= Self::LEN {
            buf[3..5].copy_from_slice(&len.to_be_bytes());
        }
    }
}

impl VisaReject {
    pub fn parse(input: &[u8]) -> Result<VisaReject, WireError> {
        match input {
            [b0, b1, c0, c1, ..] => Ok(VisaReject {
                bitmap: [*b0, *b1],
                code: [*c0, *c1],
            }),
            _ => Err(WireError::truncated("VISA reject code", 0, 4, input.len())),
        }
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
}
