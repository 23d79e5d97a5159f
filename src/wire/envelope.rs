//! What precedes the MTI in a frame: an optional TPDU, then an optional scheme
//! header (CUPS, POS or VISA), and for rejects the original header.

use serde::{Deserialize, Serialize};

use super::visa::VisaReject;
use super::{CupsHeader, PosHeader, Tpdu, VisaHeader, WireError};

/// Which scheme header follows the length prefix (and TPDU, if any).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HeaderKind {
    #[default]
    None,
    /// UnionPay inter-institution 46-byte header.
    Cups,
    /// UnionPay POS 6-byte BCD application header.
    Pos,
    /// VISA BASE I 22-byte header.
    Visa,
}

/// The envelope a dialect uses, as written in the `[envelope]` table of a spec.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeSpec {
    /// A 5-byte TPDU comes first.
    #[serde(default)]
    pub tpdu: bool,
    /// Then this header.
    #[serde(default)]
    pub header: HeaderKind,
}

/// A parsed scheme header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Header {
    Cups(CupsHeader),
    Pos(PosHeader),
    Visa(VisaHeader),
}

/// What a rejected message carries between its header and the original body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rejected {
    /// VISA only: the reject bitmap and code (CUPS keeps its code in the header).
    pub visa: Option<VisaReject>,
    /// The header of the message that was rejected.
    pub original: Header,
}

/// The parsed envelope of one frame payload. Copy-only: parsing allocates nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Envelope {
    pub tpdu: Option<Tpdu>,
    pub header: Option<Header>,
    pub rejected: Option<Rejected>,
    /// Offset of the MTI in the payload.
    pub body_offset: usize,
}

impl EnvelopeSpec {
    /// Bytes before the MTI of a message that is not a reject.
    pub fn fixed_len(&self) -> usize {
        let tpdu = if self.tpdu { Tpdu::LEN } else { 0 };
        tpdu + match self.header {
            HeaderKind::None => 0,
            HeaderKind::Cups => CupsHeader::LEN,
            HeaderKind::Pos => PosHeader::LEN,
            HeaderKind::Visa => VisaHeader::LEN,
        }
    }

    /// Offset of the scheme header in the payload (after the TPDU, if any).
    pub fn header_offset(&self) -> usize {
        if self.tpdu { Tpdu::LEN } else { 0 }
    }

    /// Parses the envelope at the start of a frame payload. Error offsets are
    /// relative to the payload.
    pub fn parse(&self, payload: &[u8]) -> Result<Envelope, WireError> {
        let mut at = 0;
        let tpdu = if self.tpdu {
            let t = Tpdu::parse(payload)?;
            at += Tpdu::LEN;
            Some(t)
        } else {
            None
        };
        let (header, rejected, len) = parse_header(self.header, payload, at)?;
        Ok(Envelope {
            tpdu,
            header,
            rejected,
            body_offset: at + len,
        })
    }
}

fn parse_header(
    kind: HeaderKind,
    payload: &[u8],
    at: usize,
) -> Result<(Option<Header>, Option<Rejected>, usize), WireError> {
    let rest = payload.get(at..).unwrap_or_default();
    let shift = |e: WireError| e.shifted(at);
    match kind {
        HeaderKind::None => Ok((None, None, 0)),
        HeaderKind::Pos => {
            let h = PosHeader::parse(rest).map_err(shift)?;
            Ok((Some(Header::Pos(h)), None, PosHeader::LEN))
        }
        HeaderKind::Cups => {
            let h = CupsHeader::parse(rest).map_err(shift)?;
            if !h.is_reject() {
                return Ok((Some(Header::Cups(h)), None, CupsHeader::LEN));
            }
            let original = CupsHeader::parse(&rest[CupsHeader::LEN..])
                .map_err(|e| e.shifted(at + CupsHeader::LEN))?;
            let rejected = Rejected {
                visa: None,
                original: Header::Cups(original),
            };
            Ok((Some(Header::Cups(h)), Some(rejected), 2 * CupsHeader::LEN))
        }
        HeaderKind::Visa => {
            let h = VisaHeader::parse(rest).map_err(shift)?;
            if !h.is_reject() {
                return Ok((Some(Header::Visa(h)), None, VisaHeader::LEN));
            }
            let code_at = VisaHeader::LEN;
            let code = VisaReject::parse(&rest[code_at..]).map_err(|e| e.shifted(at + code_at))?;
            let original_at = code_at + VisaHeader::REJECT_PART_LEN;
            let original =
                VisaHeader::parse(&rest[original_at..]).map_err(|e| e.shifted(at + original_at))?;
            let rejected = Rejected {
                visa: Some(code),
                original: Header::Visa(original),
            };
            Ok((
                Some(Header::Visa(h)),
                Some(rejected),
                original_at + VisaHeader::LEN,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POS: EnvelopeSpec = EnvelopeSpec {
        tpdu: true,
        header: HeaderKind::Pos,
    };

    #[test]
    fn pos_envelope_is_tpdu_then_header() {
        let payload = [
            0x60, 0x00, 0x03, 0x00, 0x00, 0x60, 0x31, 0x00, 0x31, 0x07, 0x30, 0x02, 0x00,
        ];
        let env = POS.parse(&payload).unwrap();
        assert_eq!(env.body_offset, 11);
        assert_eq!(POS.fixed_len(), 11);
        assert_eq!(env.tpdu.unwrap().destination, [0x00, 0x03]);
        assert!(matches!(env.header, Some(Header::Pos(_))));
    }

    #[test]
    fn truncated_header_reports_offset_after_tpdu() {
        let err = POS.parse(&[0x60, 0, 3, 0, 0, 0x60]).unwrap_err();
        assert_eq!(
            err,
            WireError::Truncated {
                what: "POS header",
                offset: 5,
                need: 6,
                have: 1
            }
        );
    }

    #[test]
    fn cups_reject_carries_original_header() {
        let spec = EnvelopeSpec {
            tpdu: false,
            header: HeaderKind::Cups,
        };
        let mut outer = CupsHeader::new("00010000", "03105840", 96);
        outer.set_reject_code(crate::wire::cups::reject::BAD_DESTINATION_ID);
        let inner = CupsHeader::new("0001", "03105840", 50);
        let mut payload = outer.0.to_vec();
        payload.extend_from_slice(&inner.0);
        payload.extend_from_slice(b"0200");
        let env = spec.parse(&payload).unwrap();
        assert_eq!(env.body_offset, 92);
        assert_eq!(env.rejected.unwrap().original, Header::Cups(inner));
        let err = spec.parse(&payload[..60]).unwrap_err();
        assert_eq!(err.offset(), 46);
    }

    #[test]
    fn visa_reject_carries_code_and_original_header() {
        let spec = EnvelopeSpec {
            tpdu: false,
            header: HeaderKind::Visa,
        };
        let mut outer = VisaHeader::new([0, 0, 1], [0, 0, 2], 60);
        outer.set_reject();
        let inner = VisaHeader::new([0, 0, 2], [0, 0, 1], 30);
        let mut payload = outer.0.to_vec();
        payload.extend_from_slice(&[0x80, 0x00, 0x00, 0x07]);
        payload.extend_from_slice(&inner.0);
        payload.extend_from_slice(&[0x01, 0x00]);
        let env = spec.parse(&payload).unwrap();
        assert_eq!(env.body_offset, 48);
        let rejected = env.rejected.unwrap();
        assert_eq!(rejected.visa.unwrap().code, [0x00, 0x07]);
        assert_eq!(rejected.original, Header::Visa(inner));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let specs = [
            POS,
            EnvelopeSpec {
                tpdu: false,
                header: HeaderKind::Cups,
            },
            EnvelopeSpec {
                tpdu: true,
                header: HeaderKind::Visa,
            },
        ];
        let mut rng = crate::util::Rng::new(0x1234_5678);
        for len in 0..200 {
            let buf: Vec<u8> = (0..len)
                .map(|_| {
                    let r = rng.next_u64();
                    // Bias towards the bytes that make headers look valid.
                    match r >> 61 {
                        0 => 0x2E,
                        1 => 0x16,
                        2 => 0x60,
                        3 => 0x80,
                        _ => r as u8,
                    }
                })
                .collect();
            for spec in &specs {
                let _ = spec.parse(&buf);
            }
        }
    }
}
