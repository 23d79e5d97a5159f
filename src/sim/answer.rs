//! How a simulated peer answers a request: the simulators' own response
//! builder.
//!
//! The simulators are the test oracles of the switch, so they must not answer
//! with the switch's code: a bug in the switch's decline or envelope handling
//! would then sit in the peer that is meant to catch it. Everything that makes
//! a response a response is written here from the wire formats (the
//! specs and `docs/specs.md`), not taken from `link/` or `route/`, nor from the helpers the
//! switch's declines use (`Spec::respond`, `Spec::swap_envelope`,
//! `Mti::response`, the header types' swap functions): the response MTI, which
//! fields come back, F39, and the envelope turned around (TPDU addresses, CUPS
//! and VISA station IDs). The `iso8583` layer is used only to read the request
//! into fields and to encode the answer's fields.
//!
//! `tests/sim_answers.rs` pins these answers, byte for byte, against
//! `fixtures/sim-answers/`.

use bytes::Bytes;

use crate::iso8583::{Decoded, IsoError, Message, Mti, Spec};
use crate::wire::EnvelopeSpec;

/// Fields a peer never sends back: track data (35, 36, 45), the PIN block
/// (52), EMV data (55) and MACs (64, 96, 128) stay with the acquirer.
pub const NOT_ECHOED: [u16; 8] = [35, 36, 45, 52, 55, 64, 96, 128];

/// The TPDU: ID byte, destination address (2 bytes), source address (2 bytes).
const TPDU_LEN: usize = 5;
const TPDU_DEST: usize = 1;
const TPDU_ADDR_LEN: usize = 2;

/// The MTI of the answer to `request`, or `None` if `request` is itself an
/// answer. ISO 8583's third digit is the message function: even for a request
/// or advice (0, 2, 4...), odd for its response, one more. The fourth digit is
/// the origin; a repeat (odd origin: 0201, 0421) is answered as the original
/// (0210, 0430), so the low bit is cleared.
pub fn response_mti(request: Mti) -> Option<Mti> {
    let [version, class, function, origin] = request.digits();
    let f = function - b'0';
    if f % 2 == 1 {
        return None;
    }
    let o = origin - b'0';
    Mti::new([version, class, b'0' + f + 1, b'0' + (o - o % 2)])
}

/// Turns a request's envelope (the raw bytes before the MTI) into its
/// answer's, in place: the TPDU's destination and source addresses trade
/// places, as do a CUPS or VISA header's destination and source IDs. A POS
/// application header is sent back as it came. Bytes missing from a short
/// envelope are left alone.
pub fn turn_envelope(env: EnvelopeSpec, raw: &mut [u8]) {
    let header_at = if env.tpdu {
        swap_adjacent(raw, TPDU_DEST, TPDU_ADDR_LEN);
        TPDU_LEN
    } else {
        0
    };
    let Some(header) = raw.get_mut(header_at..) else {
        return;
    };
    // Where the IDs are is the header's wire format (its file under
    // `crates/wire/src/header/`); turning them around is this file's own code.
    if let Some(ids) = env.header.ids() {
        swap_apart(header, ids.destination, ids.source, ids.len);
    }
}

/// Swaps `buf[at..at+len]` with `buf[at+len..at+2*len]`, if both are there.
fn swap_adjacent(buf: &mut [u8], at: usize, len: usize) {
    swap_apart(buf, at, at + len, len);
}

/// Swaps `buf[a..a+len]` with `buf[b..b+len]` (`a + len <= b`), if both are there.
fn swap_apart(buf: &mut [u8], a: usize, b: usize, len: usize) {
    if a + len <= b
        && let Some(span) = buf.get_mut(a..b + len)
    {
        let (first, second) = span.split_at_mut(b - a);
        first[..len].swap_with_slice(&mut second[..len]);
    }
}

/// The answer to `request` as fields, before encoding: the answer's MTI and
/// envelope, every request field but [`NOT_ECHOED`] (a channel node copies
/// the request back), and F39 = `code`. Callers may adjust it (VISA's issuer
/// adds F38) before [`Spec::encode`].
pub fn response_fields(
    spec: &Spec,
    request: &Message<'_>,
    code: &str,
) -> Result<Decoded, IsoError> {
    let req = request.decode()?;
    let mti = response_mti(req.mti).ok_or(IsoError::NotARequest { mti: req.mti })?;
    let mut envelope = req.envelope;
    turn_envelope(spec.envelope(), &mut envelope);
    let mut out = Decoded::new(envelope, mti);
    for (id, value) in req.fields {
        if !NOT_ECHOED.contains(&id) && id != 39 {
            out.set(id, value);
        }
    }
    if spec.field(39).is_none() {
        return Err(IsoError::NoSuchField { id: 39 });
    }
    out.set_text(39, code);
    Ok(out)
}

/// A channel node's answer to `request`, encoded: [`response_fields`] as
/// bytes (envelope + MTI + bitmaps + fields, no length prefix).
pub fn answer(spec: &Spec, request: &Message<'_>, code: &str) -> Result<Bytes, IsoError> {
    let fields = response_fields(spec, request, code)?;
    spec.encode(&fields).map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iso8583::samples;
    use crate::wire::HeaderKind;

    fn mti(s: &str) -> Mti {
        s.parse().unwrap()
    }

    #[test]
    fn response_mti_table() {
        for (req, resp) in [
            ("0100", "0110"),
            ("0200", "0210"),
            ("0201", "0210"),
            ("0220", "0230"),
            ("0221", "0230"),
            ("0400", "0410"),
            ("0420", "0430"),
            ("0421", "0430"),
            ("0800", "0810"),
            ("0820", "0830"),
            ("0203", "0212"),
            ("1200", "1210"),
        ] {
            assert_eq!(response_mti(mti(req)), Some(mti(resp)), "{req}");
        }
        for answer in ["0110", "0210", "0430", "0810", "0830"] {
            assert_eq!(response_mti(mti(answer)), None, "{answer}");
        }
    }

    #[test]
    fn tpdu_addresses_trade_places() {
        let env = EnvelopeSpec {
            tpdu: true,
            header: HeaderKind::Pos,
        };
        let mut raw = [
            0x60, 0x00, 0x03, 0x80, 0x01, 0x60, 0x31, 0x00, 0x31, 0x07, 0x30,
        ];
        turn_envelope(env, &mut raw);
        assert_eq!(
            raw,
            [
                0x60, 0x80, 0x01, 0x00, 0x03, 0x60, 0x31, 0x00, 0x31, 0x07, 0x30
            ]
        );
    }

    #[test]
    fn cups_ids_trade_places() {
        let env = EnvelopeSpec {
            tpdu: false,
            header: HeaderKind::Cups,
        };
        let mut raw = Vec::new();
        raw.extend_from_slice(&[0x2E, 0x02]);
        raw.extend_from_slice(b"0339");
        raw.extend_from_slice(b"00010000   ");
        raw.extend_from_slice(b"03105840   ");
        raw.extend_from_slice(&[0, 0, 0, 0]);
        raw.extend_from_slice(b"00000000");
        raw.push(0);
        raw.extend_from_slice(b"00000");
        assert_eq!(raw.len(), 46);
        let before = raw.clone();
        turn_envelope(env, &mut raw);
        assert_eq!(&raw[6..17], b"03105840   ");
        assert_eq!(&raw[17..28], b"00010000   ");
        assert_eq!(raw[..6], before[..6]);
        assert_eq!(raw[28..], before[28..]);
    }

    #[test]
    fn visa_ids_trade_places_and_short_envelopes_are_left() {
        let env = EnvelopeSpec {
            tpdu: false,
            header: HeaderKind::Visa,
        };
        let mut raw = [0u8; 22];
        raw[5..8].copy_from_slice(&[0x12, 0x34, 0x56]);
        raw[8..11].copy_from_slice(&[0x65, 0x43, 0x21]);
        turn_envelope(env, &mut raw);
        assert_eq!(raw[5..11], [0x65, 0x43, 0x21, 0x12, 0x34, 0x56]);
        let mut short = [1u8, 2, 3, 4, 5, 6, 7, 8, 9];
        turn_envelope(env, &mut short);
        assert_eq!(short, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
    }

    #[test]
    fn answer_echoes_all_but_secrets() {
        let (spec, payload) = samples::cups_0200();
        let req = Message::parse(&spec, Bytes::from(payload)).unwrap();
        let resp = Message::parse(&spec, answer(&spec, &req, "05").unwrap()).unwrap();
        assert_eq!(resp.mti().as_str(), "0210");
        assert!(resp.field(39).unwrap().unwrap().eq_logical(b"05"));
        for id in [2, 3, 4, 7, 11, 32, 33, 37, 41] {
            assert_eq!(
                resp.field(id).unwrap().map(|f| f.data().to_vec()),
                req.field(id).unwrap().map(|f| f.data().to_vec()),
                "F{id} echoed"
            );
        }
        for id in NOT_ECHOED {
            assert!(!resp.has_field(id), "F{id} not echoed");
        }
    }

    #[test]
    fn an_answer_is_not_answered() {
        let (spec, payload) = samples::cups_0200();
        let req = Message::parse(&spec, Bytes::from(payload)).unwrap();
        let resp = Message::parse(&spec, answer(&spec, &req, "00").unwrap()).unwrap();
        assert!(matches!(
            answer(&spec, &resp, "00"),
            Err(IsoError::NotARequest { .. })
        ));
    }
}
