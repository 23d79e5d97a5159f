//! Fuzz harnesses, shared by the cargo-fuzz targets in `fuzz/` and by the
//! regression test that replays every crash they found
//! (`tests/fuzz_regressions.rs`, `fixtures/fuzz-regressions/`). Each takes
//! arbitrary bytes and panics only when the code under test breaks a promise:
//! a panic, or an invariant below.

use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use tokio_util::codec::Decoder;

use crate::capture::mask::{MaskedFields, mask_payload_checked, mask_payload_with};
use crate::capture::read::{self, CapturedFrame, Connection, FrameCut, Stream};
use crate::iso8583::{Align, Data, FieldDef, Message, Spec, Unit};
use crate::wire::Frame;
use crate::wire::{FrameCodec, HeaderKind, LengthPrefix, Tpdu};

/// A harness: arbitrary bytes in, a panic only for a broken promise.
pub type Harness = fn(&[u8]);

/// The fuzz targets, by name (the file names under `fuzz/fuzz_targets/`).
pub const TARGETS: [(&str, Harness); 8] = [
    ("frame_decoder", frame_decoder),
    ("headers", headers),
    ("message", message),
    ("decline", decline),
    ("config", config),
    ("pcap", pcap),
    ("mask", mask),
    ("service", service),
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

/// TPDU, every scheme header the wire crate lists, and each builtin spec's
/// envelope, parsed from the same bytes. Invariants: swapping a TPDU or a
/// header's IDs twice is the identity; a parsed header gives back its bytes;
/// describing it for `decode` (every field, and CUPS's check) returns.
pub fn headers(data: &[u8]) {
    if let Ok(t) = Tpdu::parse(data) {
        assert_eq!(t.swapped().swapped(), t);
        assert_eq!(Tpdu::from_bytes(t.to_bytes()), t);
    }
    for &kind in HeaderKind::HEADERS {
        if let Ok(Some(h)) = kind.parse(data) {
            let bytes = h.as_bytes();
            assert_eq!(bytes, &data[..bytes.len()]);
            let _ = h.describe(Some(data.len()));
            let mut turned = bytes.to_vec();
            kind.swap_ids_in(&mut turned);
            kind.swap_ids_in(&mut turned);
            assert_eq!(turned, bytes);
        }
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

/// The input as a pcap or pcapng file (`isoswitch decode --pcap`, `isoswitch
/// replay`): read, grouped into connections, reassembled, and cut into frames
/// under every builtin spec and under the guessed one. Invariants: every
/// packet is a segment or skipped; reassembly's marks, gaps and frames lie
/// within their stream, frames follow each other without a hole and hold the
/// stream's bytes; the timeline holds every frame, in time order.
pub fn pcap(data: &[u8]) {
    let Ok(packets) = read::read_bytes("fuzz", data) else {
        return;
    };
    assert_eq!(
        packets.segments.len() + packets.skipped,
        packets.packets,
        "every packet is a segment or skipped"
    );
    let conns = read::connections(&packets.segments);
    let mut carried = 0usize;
    for (i, c) in conns.iter().enumerate() {
        assert_eq!(c.number, i + 1, "connections are numbered 1, 2, ...");
        for s in [&c.to_server, &c.to_client] {
            check_stream(s);
            carried += s.bytes.len();
        }
    }
    let sent: usize = packets.segments.iter().map(|s| s.payload.len()).sum();
    assert!(
        carried <= sent,
        "reassembly made up {} bytes",
        carried - sent
    );
    for spec in specs() {
        check_frames(spec, &conns);
    }
    if let Some(spec) = read::guess_spec(&conns) {
        check_frames(&spec, &conns);
    }
}

/// A reassembled direction: marks in order and within the bytes, the gap (if
/// any) at the end of the bytes, `time_at` answers for every offset.
fn check_stream(s: &Stream) {
    let len = s.bytes.len();
    assert!(
        s.marks.windows(2).all(|w| w[0].0 <= w[1].0),
        "marks out of order: {:?}",
        s.marks
    );
    assert!(
        s.marks.iter().all(|&(end, _)| end <= len),
        "a mark past the {len} bytes: {:?}",
        s.marks
    );
    assert!(s.gaps.len() <= 1, "reassembly stops at the first gap");
    if let Some(&(offset, missing)) = s.gaps.first() {
        assert_eq!(offset, len, "the gap is where the bytes stop");
        assert!(missing > 0, "an empty gap");
    }
    for end in [0, 1, len / 2, len, len + 1] {
        let _ = s.time_at(end);
    }
}

/// Frames of every direction under `spec`, and the timeline.
fn check_frames(spec: &Spec, conns: &[Connection]) {
    let mut total = 0;
    for c in conns {
        for s in [&c.to_server, &c.to_client] {
            let (frames, cut) = read::frames(spec, s);
            check_cut(spec, s, &frames, cut.as_ref());
            total += frames.len();
        }
    }
    let (timeline, problems) = read::timeline(spec, conns);
    assert_eq!(
        timeline.len(),
        total,
        "{}: the timeline loses frames",
        spec.name()
    );
    assert!(
        timeline.windows(2).all(|w| w[0].at <= w[1].at),
        "{}: the timeline is out of time order",
        spec.name()
    );
    assert!(timeline.iter().all(|f| f.conn < conns.len()));
    assert!(problems.iter().all(|p| p.conn < conns.len()));
}

/// Frames start at 0, each where the one before ended, and hold the stream's
/// bytes after their prefix; the cut (if any) is where the last one ended.
fn check_cut(spec: &Spec, s: &Stream, frames: &[CapturedFrame], cut: Option<&FrameCut>) {
    let name = spec.name();
    let prefix = spec.framing().prefix.len();
    let mut at = 0;
    for f in frames {
        assert_eq!(
            f.offset, at,
            "{name}: a frame does not follow the one before"
        );
        let payload: &[u8] = match &f.frame {
            Frame::KeepAlive => &[],
            Frame::SessionControl(p) | Frame::Message(p) => p,
        };
        let end = at + prefix + payload.len();
        assert!(
            end <= s.bytes.len(),
            "{name}: frame at {at} ends at {end}, past the {} bytes",
            s.bytes.len()
        );
        assert_eq!(
            &s.bytes[at + prefix..end],
            payload,
            "{name}: frame at {at} is not the stream's bytes"
        );
        at = end;
    }
    match cut {
        None => assert_eq!(at, s.bytes.len(), "{name}: frames stop early without a cut"),
        Some(FrameCut::Truncated { offset, left }) => {
            assert_eq!(*offset, at, "{name}: the cut is not where the frames end");
            assert_eq!(offset + left, s.bytes.len(), "{name}: the cut's length");
            assert!(*left > 0);
        }
        Some(FrameCut::Untrusted(_)) => assert!(at < s.bytes.len(), "{name}: a cut past the end"),
    }
}

/// Byte 0 picks the spec, the rest is a frame payload as the capture writer
/// masks it (envelope + message, no length prefix). Invariants: the length
/// never changes; the fast walk masks exactly as the checked walk and fails
/// where it fails; a message that parses whole is masked, and no byte of a
/// masked field (by the spec's field table) is left in clear.
pub fn mask(data: &[u8]) {
    let Some((spec, payload)) = pick_spec(data) else {
        return;
    };
    let (mut fast, mut checked) = (payload.to_vec(), payload.to_vec());
    let name = spec.name();
    let a = mask_payload_with(spec, &MaskedFields::of(spec), &mut fast).map_err(|e| e.to_string());
    let b = mask_payload_checked(spec, &mut checked).map_err(|e| e.to_string());
    assert_eq!(
        fast.len(),
        payload.len(),
        "{name}: masking changed the length"
    );
    assert_eq!(
        checked.len(),
        payload.len(),
        "{name}: masking changed the length"
    );
    assert_eq!(a, b, "{name}: the fast walk and the checked walk disagree");
    if b.is_ok() {
        assert_eq!(fast, checked, "{name}: the fast walk masks other bytes");
    }
    let Ok(msg) = Message::parse(spec, Bytes::copy_from_slice(payload)) else {
        return;
    };
    if msg.validate().is_err() {
        return;
    }
    assert!(
        a.is_ok(),
        "{name}: a message that parses is not masked: {a:?}"
    );
    for id in msg.present().iter() {
        let Ok(Some(field)) = msg.field(id) else {
            panic!("{name}: field {id} of a valid message is not found");
        };
        let def = field.def();
        if crate::iso8583::is_sensitive(def) {
            let after = &fast[field.range()];
            assert!(
                masked_in_full(def, field.data(), after, field.units()),
                "{name}: field {id} is left in clear: {:02x?} -> {:02x?}",
                field.data(),
                after
            );
        }
    }
}

/// Whether `after` (field `def` as masked, from `before`) keeps nothing in
/// clear but what the masking rules allow: separators and pad nibbles, and a
/// PAN's first 6 and last 4 digits.
fn masked_in_full(def: &FieldDef, before: &[u8], after: &[u8], units: usize) -> bool {
    if before.len() != after.len() {
        return false;
    }
    let keep_pan = crate::iso8583::mask_of(def) == crate::iso8583::Mask::Pan;
    let n = after.len();
    let kept = |i: usize, count: usize| keep_pan && count >= 13 && (i < 6 || i >= count - 4);
    match def.data {
        Data::Binary => after.iter().all(|&b| b == 0),
        Data::Ascii => after.iter().enumerate().all(|(i, &b)| {
            kept(i, n) || !(b.is_ascii_alphanumeric() && b != b'0' && b != b'X')
        }),
        Data::Ebcdic => after.iter().enumerate().all(|(i, &b)| {
            let digit = (0xF1..=0xF9).contains(&b);
            let letter = matches!(b, 0xC1..=0xC9 | 0xD1..=0xD9 | 0xE2..=0xE9 | 0x81..=0x89 | 0x91..=0x99 | 0xA2..=0xA9);
            kept(i, n) || !(digit || (letter && b != 0xE7))
        }),
        Data::Bcd => {
            let nibbles = n * 2;
            let digits = match def.unit {
                Unit::Digits => units.min(nibbles),
                _ => nibbles,
            };
            let lead = if def.align == Align::Right { nibbles - digits } else { 0 };
            (0..digits).all(|d| {
                let at = lead + d;
                let nibble = (after[at / 2] >> if at % 2 == 0 { 4 } else { 0 }) & 0x0F;
                kept(d, digits) || nibble == 0 || nibble > 9
            })
        }
    }
}

fn pick_spec(data: &[u8]) -> Option<(&'static Spec, &[u8])> {
    let (sel, rest) = data.split_first()?;
    Some((&specs()[usize::from(*sel) % specs().len()], rest))
}

/// The dialects the `service` target drives the switch in, with the node ID
/// stamped into F37 or not.
const SERVICE_SPECS: [(&str, bool); 5] = [
    ("cups", true),
    ("cups", false),
    ("cup-pos", false),
    ("visa-base1", true),
    ("iso87ascii", false),
];

/// The switch's real per-message path ([`crate::link::inproc::Rig`]: a real
/// `Service`, its node links channels) driven by a script. Byte 0 picks the
/// dialect; then steps of `[op, len, bytes...]` (`len` one byte):
///
/// - `op % 3 == 0`: `bytes` as a client request payload;
/// - `op % 3 == 1`: a valid purchase with `bytes` XORed over it from offset
///   `bytes[0]` (mostly well formed, wrong in a few places);
/// - `op % 3 == 2`: `bytes` as a payload from node `op / 3 % 3`.
///
/// Invariants: no panic; no request gets more than one frame back; and, in a
/// script with no node frames of its own, every request the switch forwarded
/// gets exactly one frame back once its node echoes it.
pub fn service(data: &[u8]) {
    use crate::link::inproc::{Rig, frame, service_toml};
    let Some((pick, mut script)) = data.split_first() else {
        return;
    };
    let (spec, stamp) = SERVICE_SPECS[usize::from(*pick) % SERVICE_SPECS.len()];
    let Ok(mut rig) = Rig::new(&service_toml(spec, stamp)) else {
        panic!("the {spec} rig builds");
    };
    let prefix = rig.service.spec().framing().prefix;
    let purchase = rig
        .service
        .spec()
        .encode(&crate::iso8583::samples::purchase(rig.service.spec()))
        .unwrap_or_default();
    let (mut requests, mut to_client, mut node_frames) = (0usize, 0usize, 0usize);
    let mut forwarded: Vec<(usize, Vec<u8>)> = Vec::new();
    while let [op, len, rest @ ..] = script {
        let (op, len) = (*op, usize::from(*len).min(rest.len()));
        let (bytes, next) = rest.split_at(len);
        script = next;
        let payload = match op % 3 {
            0 => bytes.to_vec(),
            1 => mangled(&purchase, bytes),
            _ => {
                node_frames += 1;
                let node = usize::from(op / 3) % 3;
                if let Ok(f) = frame(prefix, bytes) {
                    // `response` takes the client's frame off its queue.
                    to_client += usize::from(rig.response(node, &f).is_ok());
                }
                to_client += drain_client(&mut rig);
                continue;
            }
        };
        let Ok(f) = frame(prefix, &payload) else {
            continue;
        };
        requests += 1;
        if let Ok(Some((node, out))) = rig.request(&f) {
            forwarded.push((node, out.to_vec()));
        }
        to_client += drain_client(&mut rig);
    }
    for (node, out) in &forwarded {
        let Ok(answer) = rig.answer_frame(out) else {
            panic!("a forwarded request parses as its node receives it");
        };
        let answered = rig.response(*node, &answer).is_ok();
        to_client += usize::from(answered) + drain_client(&mut rig);
        assert!(
            answered || node_frames > 0,
            "{spec}: a forwarded request's echo reached no client"
        );
    }
    assert!(
        to_client <= requests,
        "{spec}: {to_client} frames to the client for {requests} requests"
    );
}

/// `base` with `bytes[1..]` XORed over it from offset `bytes[0]`.
fn mangled(base: &[u8], bytes: &[u8]) -> Vec<u8> {
    let mut out = base.to_vec();
    if let [at, xor @ ..] = bytes {
        for (b, x) in out.iter_mut().skip(usize::from(*at)).zip(xor) {
            *b ^= x;
        }
    }
    out
}

/// Frames still queued for the client, drained and counted.
fn drain_client(rig: &mut crate::link::inproc::Rig) -> usize {
    let mut n = 0;
    while let Ok(Some(_)) = rig.client_bytes() {
        n += 1;
    }
    n
}
