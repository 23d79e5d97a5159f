//! Switch-made messages: declines built from a request, responses of the
//! simulated node, and echo tests. Built through a full decode and encode: these
//! are rare (a decline) or not on the switch's path (simulators), so clarity wins
//! over zero-copy here.

use bytes::Bytes;

use crate::iso8583::{IsoError, Message, Spec};

/// Fields a simulated node never copies into a response: track data, PIN
/// block, EMV data and MACs do not travel back to the acquirer.
const NOT_ECHOED: [u16; 8] = [35, 36, 45, 52, 55, 64, 96, 128];

/// A switch-made response to `request`: response MTI, envelope turned around,
/// the spec's echo fields copied, F39 = `code`. A malformed request is
/// answered with what could be read of it (its envelope, MTI and the fields
/// before the first broken one); only one whose MTI cannot be read, or that is
/// not a request, cannot be answered.
pub fn build(spec: &Spec, request: &Bytes, code: [u8; 2]) -> Result<Bytes, IsoError> {
    let req = spec.decode_readable(request)?;
    let code = std::str::from_utf8(&code).unwrap_or("96");
    let resp = spec.respond(&req, code)?;
    Ok(Bytes::from(spec.encode(&resp)?))
}

/// A node's response to `request`: everything [`build`] does, plus every other
/// request field but the secret ones, as a channel node answers.
pub fn respond(spec: &Spec, request: &Message<'_>, code: &str) -> Result<Bytes, IsoError> {
    let req = request.decode()?;
    let mut resp = spec.respond(&req, code)?;
    for (id, value) in &req.fields {
        if !NOT_ECHOED.contains(id) && !resp.has(*id) {
            resp.set(*id, value.clone());
        }
    }
    Ok(Bytes::from(spec.encode(&resp)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iso8583::samples;

    #[test]
    fn decline_turns_the_request_around() {
        let (spec, payload) = samples::pos_0200();
        let resp = build(&spec, &Bytes::from(payload.clone()), *b"91").unwrap();
        let msg = Message::parse(&spec, resp).unwrap();
        assert_eq!(msg.mti().as_str(), "0210");
        assert_eq!(msg.field(39).unwrap().unwrap().data(), b"91");
        let req = Message::parse(&spec, Bytes::from(payload)).unwrap();
        assert_eq!(msg.tpdu(), req.tpdu().map(|t| t.swapped()));
        assert_eq!(
            msg.field(11).unwrap().unwrap().data(),
            req.field(11).unwrap().unwrap().data()
        );
        assert!(msg.field(35).unwrap().is_none(), "track 2 is not echoed");
    }

    #[test]
    fn node_response_echoes_all_but_secrets() {
        let (spec, payload) = samples::cups_0200();
        let req = Message::parse(&spec, Bytes::from(payload)).unwrap();
        let resp = Message::parse(&spec, respond(&spec, &req, "00").unwrap()).unwrap();
        assert_eq!(resp.mti().as_str(), "0210");
        for id in [2, 3, 4, 7, 11, 32, 33, 37, 41] {
            assert!(resp.has_field(id), "F{id} echoed");
        }
        for id in [35, 52, 128] {
            assert!(!resp.has_field(id), "F{id} not echoed");
        }
    }
}
