//! Fuzz harnesses, shared by the cargo-fuzz targets in `fuzz/` and by the
//! regression test that replays every crash they found
//! (`tests/fuzz_regressions.rs`, `fixtures/fuzz-regressions/`). Each takes
//! arbitrary bytes and panics only when the code under test breaks a promise:
//! a panic, or an invariant below.

use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use tokio_util::codec::Decoder;

use crate::iso8583::{Message, Spec};
use crate::wire::{CupsHeader, FrameCodec, LengthPrefix, Tpdu, VisaHeader};

/// A harness: arbitrary bytes in, a panic only for a broken promise.
pub type Harness = fn(&[u8]);

/// The fuzz targets, by name (the file names under `fuzz/fuzz_targets/`).
pub const TARGETS: [(&str, Harness); 5] = [
    ("frame_decoder", frame_decoder),
    ("headers", headers),
    ("message", message),
    ("decline", decline),
    ("config", config),
];

const PREFIXES: [LengthPrefix; 6] = [
    LengthPrefix::Binary2,
    LengthPrefix::Binary2Inclusive,
    LengthPrefix::Bcd2,
    LengthPrefix::Ascii4,
    LengthPrefix::Binary4,
    LengthPrefix::Visa4,
];

/// The builtin specs, loaded once per process.
pub fn specs() -> &'static [Spec] {
    static SPECS: OnceLock<Vec<Spec>> = OnceLock::new();
    SPECS.get_or_init(|| Spec::builtin_names().filter_map(Spec::builtin).collect())
}

/// Byte 0 picks the length prefix, bytes 1-2 the frame limit, the rest is the
/// stream. Invariant: the frames (or the error) are the same whether the
/// stream arrives at once or one byte at a time.
pub fn frame_decoder(data: &[u8]) {
    let [kind, hi, lo, stream @ ..] = data else {
        return;
    };
    let prefix = PREFIXES[usize::from(*kind) % PREFIXES.len()];
    let max_frame = usize::from(u16::from_be_bytes([*hi, *lo]) % 9000);
    let whole = decode_stream(prefix, max_frame, stream, stream.len().max(1));
    let bytewise = decode_stream(prefix, max_frame, stream, 1);
    assert_eq!(
        whole, bytewise,
        "{prefix}: frames depend on how the stream is split"
    );
}

/// Frames decoded from `stream` fed `chunk` bytes at a time, then the error or
/// the end of stream, as text.
fn decode_stream(
    prefix: LengthPrefix,
    max_frame: usize,
    stream: &[u8],
    chunk: usize,
) -> Vec<String> {
    let mut codec = FrameCodec::new(prefix, max_frame);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for piece in stream.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => out.push(format!("{frame:?}")),
                Ok(None) => break,
                Err(e) => {
                    out.push(format!("error {e}"));
                    return out;
                }
            }
        }
    }
    match codec.decode_eof(&mut buf) {
        Ok(Some(frame)) => out.push(format!("{frame:?}")),
        Ok(None) => {}
        Err(e) => out.push(format!("eof {e}")),
    }
    out
}

/// TPDU, CUPS and VISA headers, and each builtin spec's envelope, parsed from
/// the same bytes. Invariants: swapping a TPDU twice is the identity; a parsed
/// header gives back its bytes.
pub fn headers(data: &[u8]) {
    if let Ok(t) = Tpdu::parse(data) {
        assert_eq!(t.swapped().swapped(), t);
        assert_eq!(Tpdu::from_bytes(t.to_bytes()), t);
    }
    if let Ok(h) = CupsHeader::parse(data) {
        let _ = h.check(data.len());
        let _ = (
            h.total_length(),
            h.destination_id(),
            h.source_id(),
            h.is_reject(),
        );
        assert_eq!(h.swapped().swapped(), h);
    }
    if let Ok(h) = VisaHeader::parse(data) {
        let _ = (h.total_length(), h.destination_id(), h.source_id());
        assert_eq!(&h.0[..], &data[..VisaHeader::LEN]);
    }
    for spec in specs() {
        let _ = spec.envelope().parse(data);
    }
}

/// Byte 0 picks the spec, the rest is a frame payload. Invariants: `parse`,
/// every field lookup, `validate` and `decode` return, never panic; a decoded
/// message encodes, and the encoding decodes to the same message.
pub fn message(data: &[u8]) {
    let Some((spec, payload)) = pick_spec(data) else {
        return;
    };
    let Ok(msg) = Message::parse(spec, Bytes::copy_from_slice(payload)) else {
        return;
    };
    for id in 2..=crate::iso8583::MAX_FIELD {
        let _ = msg.field(id);
    }
    let _ = msg.validate();
    let Ok(decoded) = msg.decode() else {
        return;
    };
    let encoded = spec
        .encode(&decoded)
        .unwrap_or_else(|e| panic!("{}: a decoded message does not encode: {e}", spec.name()));
    let again = Message::parse(spec, Bytes::from(encoded))
        .and_then(|m| m.decode())
        .unwrap_or_else(|e| panic!("{}: an encoded message does not decode: {e}", spec.name()));
    assert_eq!(again.mti, decoded.mti, "{}", spec.name());
    assert_eq!(again.fields, decoded.fields, "{}", spec.name());
}

/// Byte 0 picks the spec, bytes 1-2 are the F39 code, the rest the request.
/// Invariant: a decline that builds parses as a message of the spec.
pub fn decline(data: &[u8]) {
    let [sel, c1, c2, request @ ..] = data else {
        return;
    };
    let spec = &specs()[usize::from(*sel) % specs().len()];
    let request = Bytes::copy_from_slice(request);
    if let Ok(resp) = crate::link::decline::build(spec, &request, [*c1, *c2]) {
        Message::parse(spec, resp)
            .unwrap_or_else(|e| panic!("{}: a built decline does not parse: {e}", spec.name()));
    }
}

/// The input as a config file, without the environment and without name
/// resolution (no DNS from a fuzzer). Invariant: what `check` prints of a
/// valid config loads back.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    crate::config::host_port::resolve_ip_only();
    let Ok(cfg) = crate::config::Config::from_toml_with_env(text, std::iter::empty()) else {
        return;
    };
    let printed = toml::to_string_pretty(&cfg.effective()).expect("a valid config prints");
    if let Err(e) = crate::config::Config::from_toml_with_env(&printed, std::iter::empty()) {
        panic!("check prints a config that does not load: {e}\n{printed}");
    }
}

fn pick_spec(data: &[u8]) -> Option<(&'static Spec, &[u8])> {
    let (sel, rest) = data.split_first()?;
    Some((&specs()[usize::from(*sel) % specs().len()], rest))
}
