//! What precedes the MTI in a frame: an optional TPDU, then an optional scheme
//! header (`header/`: CUPS, POS or VISA), and for rejects the original header.

use serde::{Deserialize, Serialize};

use super::part::WireResult;
use super::visa::VisaReject;
use super::{Tpdu, WireError, tpdu};
use crate::header::Parts;
pub use crate::header::{Header, HeaderKind};

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
        tpdu + self.header.header_len()
    }

    /// Offset of the scheme header in the payload (after the TPDU, if any).
    pub fn header_offset(&self) -> usize {
        if self.tpdu { Tpdu::LEN } else { 0 }
    }

    /// Parses the envelope at the start of a frame payload (a whole frame:
    /// a short payload is [`WireError::Truncated`] naming the part). Error
    /// offsets are relative to the payload.
    pub fn parse(&self, payload: &[u8]) -> Result<Envelope, WireError> {
        match envelope::<true>(*self, payload) {
            Ok((_, env)) => Ok(env),
            Err(nom::Err::Error(e) | nom::Err::Failure(e)) => Err(e),
            // Complete mode turns every `Incomplete` into `Truncated`.
            Err(nom::Err::Incomplete(_)) => Err(WireError::truncated(
                "envelope",
                0,
                self.fixed_len(),
                payload.len(),
            )),
        }
    }

    /// The streaming nom parser for this envelope, for input that may end
    /// early (a frame still arriving): `Incomplete` until every part is in,
    /// the same value or error as [`EnvelopeSpec::parse`] once it is. The rest
    /// it returns starts at the MTI; error offsets count from the start.
    pub fn parser(self) -> impl Fn(&[u8]) -> WireResult<'_, Envelope> {
        move |input| envelope::<false>(self, input)
    }
}

/// The envelope of `spec` at the start of `payload`, part by part. `COMPLETE`
/// picks the mode: a short part is `Truncated` (whole frame) or `Incomplete`
/// (streaming). Error offsets are shifted to count from the start of `payload`.
fn envelope<const COMPLETE: bool>(spec: EnvelopeSpec, payload: &[u8]) -> WireResult<'_, Envelope> {
    let parts = Parts::<COMPLETE>::new(payload);
    let mut input = payload;
    let tpdu = if spec.tpdu {
        let (rest, t) = parts.read("TPDU", Tpdu::LEN, tpdu::tpdu, input)?;
        input = rest;
        Some(t)
    } else {
        None
    };
    let mut envelope = Envelope {
        tpdu,
        header: None,
        rejected: None,
        body_offset: 0,
    };
    // The header and its reject form are the header's own (`header/`).
    let (rest, ()) =
        spec.header
            .envelope_part(parts, input, &mut envelope.header, &mut envelope.rejected)?;
    envelope.body_offset = payload.len() - rest.len();
    Ok((rest, envelope))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CupsHeader, VisaHeader};

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
        outer.set_reject_code(crate::cups::reject::BAD_DESTINATION_ID);
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
        let mut rng = isoswitch_util::Rng::new(0x1234_5678);
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

    const CUPS: EnvelopeSpec = EnvelopeSpec {
        tpdu: false,
        header: HeaderKind::Cups,
    };
    const VISA: EnvelopeSpec = EnvelopeSpec {
        tpdu: false,
        header: HeaderKind::Visa,
    };

    /// The payload of a one-frame fixture (hex text, `#` comments), without its
    /// `prefix_len`-byte length prefix.
    fn fixture_payload(hex: &str, prefix_len: usize) -> Vec<u8> {
        let bytes: Vec<u8> = hex
            .lines()
            .filter(|l| !l.starts_with('#'))
            .flat_map(str::split_whitespace)
            .map(|b| u8::from_str_radix(b, 16).expect("fixture hex"))
            .collect();
        bytes[prefix_len..].to_vec()
    }

    /// The streaming parser on every cut of `payload`: Incomplete, or what the
    /// whole-frame parser gives; and the whole-frame parser on every cut: the
    /// same envelope once it is all there, `Truncated` before.
    fn check_both_modes(spec: EnvelopeSpec, payload: &[u8]) -> Result<Envelope, WireError> {
        let parser = spec.parser();
        let streamed = crate::part::split::check_every_split(&parser, payload);
        let whole = spec.parse(payload);
        match (&streamed, &whole) {
            (Ok((rest, env)), Ok(w)) => {
                assert_eq!(env, w);
                assert_eq!(payload.len() - rest.len(), w.body_offset);
            }
            (Err(nom::Err::Failure(e)), Err(w)) => assert_eq!(e, w),
            (Err(nom::Err::Incomplete(_)), Err(WireError::Truncated { .. })) => {}
            _ => panic!("streaming {streamed:?} but whole-frame {whole:?}"),
        }
        whole
    }

    #[test]
    fn fixtures_parse_the_same_cut_anywhere() {
        let cases: [(EnvelopeSpec, &str, usize, usize); 6] = [
            (
                CUPS,
                include_str!("../../../fixtures/cups/purchase-request.hex"),
                4,
                46,
            ),
            (
                CUPS,
                include_str!("../../../fixtures/cups/reject.hex"),
                4,
                92,
            ),
            (
                POS,
                include_str!("../../../fixtures/cup-pos/purchase-request.hex"),
                2,
                11,
            ),
            (
                VISA,
                include_str!("../../../fixtures/visa-base1/purchase-request.hex"),
                4,
                22,
            ),
            (
                VISA,
                include_str!("../../../fixtures/visa-base1/purchase-response.hex"),
                4,
                22,
            ),
            (
                VISA,
                include_str!("../../../fixtures/visa-base1/reject.hex"),
                4,
                48,
            ),
        ];
        for (spec, hex, prefix_len, body_offset) in cases {
            let payload = fixture_payload(hex, prefix_len);
            let env = check_both_modes(spec, &payload).unwrap();
            assert_eq!(env.body_offset, body_offset, "{spec:?}");
        }
    }

    /// The VISA reject: header with bit 0x80 of byte 1, a 2-byte bitmap
    /// and 2-byte reject code, then the original 22-byte header, then the body.
    #[test]
    fn visa_reject_fixture_has_both_headers() {
        let payload = fixture_payload(include_str!("../../../fixtures/visa-base1/reject.hex"), 4);
        let env = VISA.parse(&payload).unwrap();
        let Some(Header::Visa(outer)) = env.header else {
            panic!("no VISA header: {env:?}");
        };
        assert!(outer.is_reject());
        let rejected = env.rejected.unwrap();
        let code = rejected.visa.unwrap();
        assert_eq!(code.bitmap, [0x80, 0x00]);
        assert_eq!(code.code, [0x00, 0x07]);
        let Header::Visa(original) = rejected.original else {
            panic!("original is not a VISA header");
        };
        assert!(!original.is_reject());
        // The reject goes back to whoever sent the original.
        assert_eq!(outer.destination_id(), original.source_id());
        assert_eq!(
            &payload[env.body_offset..env.body_offset + 2],
            &[0x02, 0x00]
        );
        // Whole-frame cuts name the part they stop in.
        let cut = |k: usize| VISA.parse(&payload[..k]).unwrap_err();
        assert_eq!(cut(10), WireError::truncated("VISA header", 0, 22, 10));
        assert_eq!(cut(24), WireError::truncated("VISA reject code", 22, 4, 2));
        assert_eq!(cut(40), WireError::truncated("VISA header", 26, 22, 14));
    }

    /// The 0x1A form (header length counting the bitmap and code) is a reject
    /// too, and parses to the same parts.
    #[test]
    fn visa_reject_counted_header_length_form() {
        let payload = fixture_payload(include_str!("../../../fixtures/visa-base1/reject.hex"), 4);
        let mut counted = payload.clone();
        counted[0] = 0x1A;
        counted[1] &= !0x80;
        let a = check_both_modes(VISA, &payload).unwrap();
        let b = check_both_modes(VISA, &counted).unwrap();
        assert_eq!(a.rejected, b.rejected);
        assert_eq!(a.body_offset, b.body_offset);
    }

    fn biased_bytes() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        // Bytes that make headers look valid, so the reject paths are reached.
        let byte = prop_oneof![
            Just(0x2Eu8),
            Just(0x16),
            Just(0x1A),
            Just(0x60),
            Just(0x80),
            Just(b'0'),
            any::<u8>(),
        ];
        proptest::collection::vec(byte, 0..120)
    }

    proptest::proptest! {
        /// Whatever the bytes, the streaming parser cut anywhere never
        /// disagrees with the whole-frame parser, and neither panics.
        #[test]
        fn streaming_agrees_with_whole_frame(bytes in biased_bytes()) {
            let specs = [
                POS,
                CUPS,
                VISA,
                EnvelopeSpec { tpdu: true, header: HeaderKind::Visa },
                EnvelopeSpec { tpdu: true, header: HeaderKind::None },
                EnvelopeSpec::default(),
            ];
            for spec in specs {
                let _ = check_both_modes(spec, &bytes);
            }
        }

        /// A built CUPS reject (reject header, original header, body) round
        /// trips through the envelope parser, cut anywhere.
        #[test]
        fn cups_reject_round_trips(
            code in proptest::sample::select(vec![
                crate::cups::reject::BAD_HEADER_LENGTH,
                crate::cups::reject::BAD_VERSION,
                crate::cups::reject::BAD_TOTAL_LENGTH,
                crate::cups::reject::BAD_DESTINATION_ID,
                crate::cups::reject::BAD_SOURCE_ID,
            ]),
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..16),
        ) {
            let mut outer = CupsHeader::new("00010000", "03105840", 92 + body.len());
            outer.set_reject_code(code);
            let inner = CupsHeader::new("03105840", "00010000", 46 + body.len());
            let mut payload = outer.0.to_vec();
            payload.extend_from_slice(&inner.0);
            payload.extend_from_slice(&body);
            let env = check_both_modes(CUPS, &payload).unwrap();
            proptest::prop_assert_eq!(env.header, Some(Header::Cups(outer)));
            proptest::prop_assert_eq!(env.rejected.map(|r| r.original), Some(Header::Cups(inner)));
            proptest::prop_assert_eq!(env.body_offset, 92);
        }
    }
}
