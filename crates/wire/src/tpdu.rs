//! The 5-byte TPDU that precedes POS messages: ID `0x60`, destination, source.

use super::WireError;
use super::part::{WireResult, array, bad, whole};
use crate::EnvelopeReason;

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

    /// Parses the first five bytes of `input` (a whole frame payload): a short
    /// input is [`WireError::Truncated`]. The complete-mode form of [`tpdu`].
    pub fn parse(input: &[u8]) -> Result<Tpdu, WireError> {
        whole("TPDU", Self::LEN, tpdu, input)
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
        if let Some([_, d0, d1, s0, s1]) = buf.get_mut(..Self::LEN) {
            // Two 2-byte swaps: `rotate_left` on 4 bytes is a generic loop.
            std::mem::swap(d0, s0);
            std::mem::swap(d1, s1);
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

/// nom parser (streaming) for a TPDU at the start of `input`: `Incomplete`
/// until all five bytes are there, then the ID byte is checked (a failure at
/// offset 0 naming it). Nothing is judged before the whole TPDU is in, so a
/// prefix of any input is `Incomplete`, never an error the whole would not give.
#[inline]
pub fn tpdu(input: &[u8]) -> WireResult<'_, Tpdu> {
    let (rest, raw) = array::<{ Tpdu::LEN }>(input)?;
    if raw[0] != Tpdu::ID {
        return Err(bad(
            "TPDU",
            0,
            EnvelopeReason::IdByte {
                found: raw[0],
                expected: Tpdu::ID,
            },
        ));
    }
    Ok((rest, Tpdu::from_bytes(raw)))
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

    #[test]
    fn streaming_tpdu_split_everywhere() {
        use crate::part::split::check_every_split;
        let ok = [0x60, 0x12, 0x3A, 0xB0, 0x01, 0x02, 0x00];
        let (rest, t) = check_every_split(tpdu, &ok).unwrap();
        assert_eq!(rest, &[0x02, 0x00]);
        assert_eq!(t.to_bytes(), ok[..5]);
        // A wrong ID is judged only once the whole TPDU is in.
        assert_eq!(
            tpdu(&[0x61, 0, 0]),
            Err(nom::Err::Incomplete(nom::Needed::new(2)))
        );
        let bad = check_every_split(tpdu, &[0x61, 0, 0, 0, 0, 9]).unwrap_err();
        assert!(matches!(
            bad,
            nom::Err::Failure(WireError::BadEnvelope {
                what: "TPDU",
                offset: 0,
                ..
            })
        ));
        // The whole-frame form: the same value, or Truncated naming the TPDU.
        for k in 0..5 {
            assert_eq!(
                Tpdu::parse(&ok[..k]),
                Err(WireError::truncated("TPDU", 0, 5, k))
            );
        }
        assert_eq!(Tpdu::parse(&ok), Ok(t));
    }

    proptest::proptest! {
        #[test]
        fn round_trips(destination: [u8; 2], source: [u8; 2], tail: Vec<u8>) {
            let t = Tpdu { id: Tpdu::ID, destination, source };
            let mut wire = t.to_bytes().to_vec();
            wire.extend_from_slice(&tail);
            proptest::prop_assert_eq!(Tpdu::parse(&wire), Ok(t));
            let (rest, parsed) = tpdu(&wire).unwrap();
            proptest::prop_assert_eq!(parsed, t);
            proptest::prop_assert_eq!(rest, &tail[..]);
            let mut swapped = wire.clone();
            Tpdu::swap_in_place(&mut swapped);
            proptest::prop_assert_eq!(Tpdu::parse(&swapped), Ok(t.swapped()));
            proptest::prop_assert_eq!(&swapped[5..], &tail[..]);
        }

        #[test]
        fn any_bytes_split_anywhere(bytes in proptest::collection::vec(
            proptest::prop_oneof![proptest::strategy::Just(0x60u8), proptest::num::u8::ANY], 0..12)) {
            let _ = crate::part::split::check_every_split(tpdu, &bytes);
        }
    }
}
