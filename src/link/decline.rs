//! Switch-made declines, built from a request. Built through a full decode
//! and encode: a decline is rare, so clarity wins over zero-copy here. (The
//! simulators answer with their own builder, `sim::answer`, never this one.)

use bytes::Bytes;

use crate::iso8583::{IsoError, Spec};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iso8583::{Message, samples};

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
}
