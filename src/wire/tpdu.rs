//! The 5-byte TPDU that precedes POS messages: ID `0x60`, destination, source.

use super::WireError;

/// Transport protocol data unit: `60 DDDD SSSS`. The addresses are NII values that
/// are usually BCD but may hold hex digits A-F, so they are kept as raw bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tpdu {
    pub id: u8,
    pub destination: [u8; 2],
    pub source: [u8; 2],
}

impl Tpdu {
    pub const LEN: usize = 5;
    /// The ID byte of a transport TPDU.
    pub const ID: u8 = 0x60;

    /// Parses the first five bytes of `input`.
    pub fn parse(input: &[u8]) -> Result<Tpdu, WireError> {
        let bytes: &[u8; 5] = input
            .get(..Self::LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| WireError::truncated("TPDU", 0, Self::LEN, input.len()))?;
        if bytes[0] != Self::ID {
            return Err(WireError::BadEnvelope {
                what: "TPDU",
                offset: 0,
                reason: format!("ID byte is {:#04x}, expected 0x60", bytes[0]),
            });
        }
        Ok(Tpdu::from_bytes(*bytes))
    }

    pub fn from_bytes(b: [u8; 5]) -> Tpdu {
        Tpdu {
            id: b[0],
            destination: [b[1], b[2]],
            source: [b[3], b[4]],
        }
    }

    pub fn to_bytes(self) -> [u8; 5] {
        let [d0, d1] = self.destination;
        let [s0, s1] = self.source;
        [self.id, d0, d1, s0, s1]
    }

    /// The TPDU a response carries: destination and source swapped.
    pub fn swapped(self) -> Tpdu {
        Tpdu {
            id: self.id,
            destination: self.source,
            source: self.destination,
        }
    }

    /// Swaps destination and source in place in a buffer that starts with a TPDU.
    /// Does nothing if the buffer is shorter than a TPDU.
    pub fn swap_in_place(buf: &mut [u8]) {
        if buf.len() >= Self::LEN {
            buf[1..5].rotate_left(2);
        }
    }

    /// The address pair as one number (destination, source), for correlation keys.
    pub fn address_pair(self) -> u32 {
        u32::from_be_bytes([
            self.destination[0],
            self.destination[1],
            self.source[0],
            self.source[1],
        ])
    }
}

impl std::fmt::Display for Tpdu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.to_bytes() {
            write!(f, "{b:02X}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_swaps() {
        let t = Tpdu::parse(&[0x60, 0x00, 0x03, 0x00, 0x00, 0xAA]).unwrap();
        assert_eq!(t.destination, [0x00, 0x03]);
        assert_eq!(t.source, [0x00, 0x00]);
        assert_eq!(t.swapped().to_bytes(), [0x60, 0x00, 0x00, 0x00, 0x03]);
        assert_eq!(t.to_string(), "6000030000");
    }

    #[test]
    fn swap_in_place_matches_swapped() {
        let mut buf = [0x60, 0x12, 0x3A, 0xB0, 0x01, 0x99];
        let before = Tpdu::parse(&buf).unwrap();
        Tpdu::swap_in_place(&mut buf);
        assert_eq!(Tpdu::parse(&buf).unwrap(), before.swapped());
        assert_eq!(buf[5], 0x99);
    }

    #[test]
    fn rejects_wrong_id_and_short_input() {
        assert!(matches!(
            Tpdu::parse(&[0x61, 0, 0, 0, 0]),
            Err(WireError::BadEnvelope { offset: 0, .. })
        ));
        assert!(matches!(
            Tpdu::parse(&[0x60, 0]),
            Err(WireError::Truncated {
                need: 5,
                have: 2,
                ..
            })
        ));
    }
}
