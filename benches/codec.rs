//! Codec benchmarks: the per-message work on the switch's routing path (frame
//! cut, routing view, F37 stamp, TPDU swap) and the full decode / encode used by
//! tools. Numbers and the command that produced them: `BENCHMARKS.md`.
//!
//! Targets: routing view ≤ 200 ns, stamp ≤ 50 ns, full decode of a ~20-field
//! message ≤ 2 µs.

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use isoswitch::iso8583::{
    Bitmap, Data, Decoded, Message, Spec, Unit, Value, samples, stamp, validate_nom_form,
};
use isoswitch::wire::envelope::Rejected;
use isoswitch::wire::visa::VisaReject;
use isoswitch::wire::{
    CupsHeader, Envelope, EnvelopeSpec, Frame, FrameCodec, Header, HeaderKind, Tpdu, VisaHeader,
};
use tokio_util::codec::{Decoder, Encoder};

/// Frames in the stream the frame-decode bench cuts.
const FRAMES: usize = 1000;

fn frame_decode(c: &mut Criterion) {
    let (spec, payload) = samples::cups_0200();
    let framing = spec.framing();
    let mut stream = BytesMut::new();
    let mut enc = FrameCodec::new(framing.prefix, framing.max_frame);
    let payload = Bytes::from(payload);
    for i in 0..FRAMES {
        // One keep-alive every 100 frames, as on an idle-ish link.
        let frame = if i % 100 == 99 {
            Frame::KeepAlive
        } else {
            Frame::Message(payload.clone())
        };
        enc.encode(frame, &mut stream).expect("encodes");
    }

    let mut g = c.benchmark_group("frame_decode");
    g.throughput(Throughput::Elements(FRAMES as u64));
    g.bench_function("cups_stream_1000_frames", |b| {
        b.iter_batched(
            || stream.clone(),
            |mut buf| {
                let mut codec = FrameCodec::new(framing.prefix, framing.max_frame);
                let mut n = 0usize;
                while let Some(frame) = codec.decode(&mut buf).expect("valid stream") {
                    black_box(&frame);
                    n += 1;
                }
                assert_eq!(n, FRAMES);
                buf
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn routing_view(c: &mut Criterion) {
    let mut g = c.benchmark_group("routing_view");
    for (name, (spec, payload)) in [
        ("cups_0200", samples::cups_0200()),
        ("pos_0200", samples::pos_0200()),
    ] {
        let bytes = Bytes::from(payload);
        g.bench_function(name, |b| {
            b.iter(|| {
                let msg = Message::parse(&spec, black_box(&bytes).clone()).expect("parses");
                black_box(msg.routing_view().expect("view"))
            })
        });
    }
    g.finish();
}

/// Ingress validation as the switch runs it: parse, then one pass over every
/// field that checks the whole message and records the fields routing reads
/// (key fields, F37, F39, F41, F70). Compare with `routing_view`, which stops
/// after the last routing field and checks nothing past it.
fn validate_index(c: &mut Criterion) {
    let mut g = c.benchmark_group("validate_index");
    let mut wanted = Bitmap::default();
    for id in [7, 11, 32, 33, 37, 39, 41, 70] {
        wanted.set(id);
    }
    for (name, (spec, payload)) in [
        ("cups_0200", samples::cups_0200()),
        ("pos_0200", samples::pos_0200()),
    ] {
        let bytes = Bytes::from(payload);
        g.bench_function(name, |b| {
            b.iter(|| {
                let msg = Message::parse(&spec, black_box(&bytes).clone()).expect("parses");
                black_box(msg.index(&wanted).expect("valid"))
            })
        });
        // What the switch did before: no validation, one walk from the first
        // field per key part and for the F37 stamp (CUPS: F7, F11, F32, F33,
        // F37; POS: F41, F11, F37).
        let parts: &[u16] = if spec.envelope().tpdu {
            &[41, 11, 37]
        } else {
            &[7, 11, 32, 33, 37]
        };
        g.bench_function(format!("{name}_walk_per_field"), |b| {
            b.iter(|| {
                let msg = Message::parse(&spec, black_box(&bytes).clone()).expect("parses");
                for &id in parts {
                    black_box(msg.field(id).expect("walks").map(|f| f.data().len()));
                }
            })
        });
    }
    g.finish();
}

fn stamp_f37(c: &mut Criterion) {
    let (spec, payload) = samples::cups_0200();
    let f37 = spec
        .routing_view(&payload)
        .expect("view")
        .f37
        .expect("F37 present");
    let mut buf = payload.clone();
    let mut g = c.benchmark_group("stamp");
    g.bench_function("cups_f37_stamp_f37", |b| {
        b.iter(|| {
            spec.stamp_f37(black_box(&mut buf), black_box(f37.clone()), 8, b"N1")
                .expect("stamps")
        })
    });
    g.bench_function("cups_f37_raw_stamp", |b| {
        b.iter(|| stamp(black_box(&mut buf), black_box(f37.clone()), 10, b"07").expect("stamps"))
    });
    g.finish();
}

fn tpdu_swap(c: &mut Criterion) {
    let (spec, payload) = samples::pos_0200();
    let mut buf = payload.clone();
    let mut g = c.benchmark_group("tpdu_swap");
    g.bench_function("pos_spec_swap_tpdu", |b| {
        b.iter(|| spec.swap_tpdu(black_box(&mut buf)))
    });
    g.bench_function("pos_swap_in_place", |b| {
        b.iter(|| Tpdu::swap_in_place(black_box(&mut buf)))
    });
    // What `swap_in_place` did before, for the same-run comparison.
    g.bench_function("pos_rotate_left_before", |b| {
        b.iter(|| black_box(&mut buf)[1..5].rotate_left(2))
    });
    g.finish();
}

/// An iso87ascii message with every field 2..=64 present: the shape of the
/// "64-field message" the moov-io and jPOS numbers are quoted for.
fn sixty_four_fields(spec: &Spec) -> Decoded {
    let mut d = Decoded::new(Vec::new(), "0200".parse().expect("MTI"));
    for id in 2..=64u16 {
        let Some(def) = spec.field(id) else { continue };
        let units = if def.is_fixed() {
            def.length
        } else {
            def.length.min(12)
        };
        let value = match (def.data, def.unit) {
            (Data::Binary, Unit::Bits) => Value::Binary(vec![0x5A; units / 8]),
            (Data::Binary, _) => Value::Binary(vec![0x5A; units]),
            (Data::Bcd, Unit::Bytes) => Value::text("12".repeat(units)),
            _ => Value::Text(
                (0..units)
                    .map(|i| char::from(b'0' + (i % 10) as u8))
                    .collect(),
            ),
        };
        d.set(id, value);
    }
    d
}

fn full_codec(c: &mut Criterion) {
    let (spec, payload) = samples::cups_0200();
    let decoded = spec.decode(&payload).expect("decodes");
    let mut g = c.benchmark_group("full");
    g.bench_function("decode_cups_0200_24_fields", |b| {
        b.iter(|| spec.decode(black_box(&payload)).expect("decodes"))
    });
    g.bench_function("encode_cups_0200_24_fields", |b| {
        b.iter(|| spec.encode(black_box(&decoded)).expect("encodes"))
    });

    let iso = Spec::builtin("iso87ascii").expect("iso87ascii");
    let wide = sixty_four_fields(&iso);
    let wide_payload = iso.encode(&wide).expect("64 fields encode");
    g.bench_function("decode_iso87ascii_63_fields", |b| {
        b.iter(|| iso.decode(black_box(&wide_payload)).expect("decodes"))
    });
    g.bench_function("encode_iso87ascii_63_fields", |b| {
        b.iter(|| iso.encode(black_box(&wide)).expect("encodes"))
    });
    g.finish();
}

/// The payload (prefix cut off) of a one-frame fixture file.
fn fixture_payload(hex: &str, prefix_len: usize) -> Vec<u8> {
    let bytes: Vec<u8> = hex
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(str::split_whitespace)
        .map(|b| u8::from_str_radix(b, 16).expect("fixture hex"))
        .collect();
    bytes[prefix_len..].to_vec()
}

/// The envelope parsers: each header as nom parses it (`*/nom`), next to the
/// hand slicing it replaced (`*/hand`, copied below as it was) in the same run.
fn header_parse(c: &mut Criterion) {
    let (_, cups) = samples::cups_0200();
    let (_, pos) = samples::pos_0200();
    let visa_spec = Spec::builtin("visa-base1").expect("visa-base1");
    let visa = samples::purchase_payload(&visa_spec).expect("VISA sample");
    let visa_reject = fixture_payload(include_str!("../fixtures/visa-base1/reject.hex"), 4);
    let cups_reject = fixture_payload(include_str!("../fixtures/cups/reject.hex"), 4);
    let spec = |header| EnvelopeSpec {
        tpdu: false,
        header,
    };
    let pos_env = EnvelopeSpec {
        tpdu: true,
        header: HeaderKind::Pos,
    };

    let mut g = c.benchmark_group("header_parse");
    g.bench_function("tpdu/nom", |b| b.iter(|| Tpdu::parse(black_box(&pos))));
    g.bench_function("tpdu/hand", |b| b.iter(|| hand::tpdu(black_box(&pos))));
    g.bench_function("cups/nom", |b| {
        b.iter(|| CupsHeader::parse(black_box(&cups)))
    });
    g.bench_function("cups/hand", |b| b.iter(|| hand::cups(black_box(&cups))));
    g.bench_function("visa/nom", |b| {
        b.iter(|| VisaHeader::parse(black_box(&visa)))
    });
    g.bench_function("visa/hand", |b| b.iter(|| hand::visa(black_box(&visa))));
    for (name, env, payload) in [
        ("envelope_pos", pos_env, &pos),
        ("envelope_cups", spec(HeaderKind::Cups), &cups),
        ("envelope_cups_reject", spec(HeaderKind::Cups), &cups_reject),
        ("envelope_visa", spec(HeaderKind::Visa), &visa),
        ("envelope_visa_reject", spec(HeaderKind::Visa), &visa_reject),
    ] {
        assert_eq!(env.parse(payload), hand::envelope(env, payload), "{name}");
        g.bench_function(format!("{name}/nom"), |b| {
            b.iter(|| env.parse(black_box(payload)))
        });
        g.bench_function(format!("{name}/hand"), |b| {
            b.iter(|| hand::envelope(env, black_box(payload)))
        });
    }
    g.finish();
}

/// The field walk over every field of a message, with the hand-written reads
/// the switch uses (`Message::validate`) and with the same reads written with
/// nom's primitives, in the same run.
fn field_walk(c: &mut Criterion) {
    let mut g = c.benchmark_group("field_walk");
    let iso = Spec::builtin("iso87ascii").expect("iso87ascii");
    let wide = iso
        .encode(&sixty_four_fields(&iso))
        .expect("64 fields encode");
    let visa_spec = Spec::builtin("visa-base1").expect("visa-base1");
    let visa = samples::purchase_payload(&visa_spec).expect("VISA sample");
    let (cups_spec, cups) = samples::cups_0200();
    let (pos_spec, pos) = samples::pos_0200();
    for (name, spec, payload) in [
        ("cups_0200", &cups_spec, cups),
        ("pos_0200", &pos_spec, pos),
        ("visa_0200", &visa_spec, visa),
        ("iso87ascii_63_fields", &iso, wide),
    ] {
        let msg = Message::parse(spec, Bytes::from(payload)).expect("parses");
        assert_eq!(msg.validate(), validate_nom_form(&msg), "{name}");
        g.bench_function(format!("{name}/hand"), |b| {
            b.iter(|| black_box(&msg).validate())
        });
        g.bench_function(format!("{name}/nom"), |b| {
            b.iter(|| validate_nom_form(black_box(&msg)))
        });
    }
    g.finish();
}

/// The header parsing as it was before the nom parsers (`git show
/// 736f614:crates/wire/src/`), kept here only as the benchmark's reference. The
/// entry points are `inline(never)`, as the library's are to this crate, so
/// both sides pay one call.
mod hand {
    use super::*;
    use isoswitch::wire::{EnvelopeReason, PosHeader, WireError};

    fn truncated(what: &'static str, need: usize, have: usize) -> WireError {
        WireError::Truncated {
            what,
            offset: 0,
            need,
            have,
        }
    }

    #[inline(never)]
    pub fn tpdu(input: &[u8]) -> Result<Tpdu, WireError> {
        let bytes: &[u8; 5] = input
            .get(..Tpdu::LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| truncated("TPDU", Tpdu::LEN, input.len()))?;
        if bytes[0] != Tpdu::ID {
            return Err(WireError::BadEnvelope {
                what: "TPDU",
                offset: 0,
                reason: EnvelopeReason::IdByte {
                    found: bytes[0],
                    expected: Tpdu::ID,
                },
            });
        }
        Ok(Tpdu::from_bytes(*bytes))
    }

    pub fn pos(input: &[u8]) -> Result<PosHeader, WireError> {
        let bytes: [u8; 6] = input
            .get(..PosHeader::LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| truncated("POS header", PosHeader::LEN, input.len()))?;
        Ok(PosHeader(bytes))
    }

    #[inline(never)]
    pub fn cups(input: &[u8]) -> Result<CupsHeader, WireError> {
        let raw: [u8; CupsHeader::LEN] = input
            .get(..CupsHeader::LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| truncated("CUPS header", CupsHeader::LEN, input.len()))?;
        if raw[0] as usize != CupsHeader::LEN {
            return Err(WireError::BadEnvelope {
                what: "CUPS header length",
                offset: 0,
                reason: EnvelopeReason::Length {
                    found: raw[0],
                    expected: 46,
                },
            });
        }
        Ok(CupsHeader(raw))
    }

    #[inline(never)]
    pub fn visa(input: &[u8]) -> Result<VisaHeader, WireError> {
        let raw: [u8; VisaHeader::LEN] = input
            .get(..VisaHeader::LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| truncated("VISA header", VisaHeader::LEN, input.len()))?;
        if raw[0] as usize != VisaHeader::LEN && raw[0] != 0x1A {
            return Err(WireError::BadEnvelope {
                what: "VISA header length",
                offset: 0,
                reason: EnvelopeReason::LengthEither {
                    found: raw[0],
                    short: 0x16,
                    long: 0x1A,
                },
            });
        }
        Ok(VisaHeader(raw))
    }

    fn visa_reject(input: &[u8]) -> Result<VisaReject, WireError> {
        match input {
            [b0, b1, c0, c1, ..] => Ok(VisaReject {
                bitmap: [*b0, *b1],
                code: [*c0, *c1],
            }),
            _ => Err(truncated("VISA reject code", 4, input.len())),
        }
    }

    #[inline(never)]
    pub fn envelope(spec: EnvelopeSpec, payload: &[u8]) -> Result<Envelope, WireError> {
        let mut at = 0;
        let tpdu = if spec.tpdu {
            let t = tpdu(payload)?;
            at += Tpdu::LEN;
            Some(t)
        } else {
            None
        };
        let rest = payload.get(at..).unwrap_or_default();
        let shift = |e: WireError| e.shifted(at);
        let (header, rejected, len) = match spec.header {
            HeaderKind::Pos => (Some(Header::Pos(pos(rest).map_err(shift)?)), None, 6),
            HeaderKind::Cups => {
                let h = cups(rest).map_err(shift)?;
                if !h.is_reject() {
                    (Some(Header::Cups(h)), None, CupsHeader::LEN)
                } else {
                    let original = cups(&rest[CupsHeader::LEN..])
                        .map_err(|e| e.shifted(at + CupsHeader::LEN))?;
                    let rejected = Rejected {
                        visa: None,
                        original: Header::Cups(original),
                    };
                    (Some(Header::Cups(h)), Some(rejected), 2 * CupsHeader::LEN)
                }
            }
            HeaderKind::Visa => {
                let h = visa(rest).map_err(shift)?;
                if !h.is_reject() {
                    (Some(Header::Visa(h)), None, VisaHeader::LEN)
                } else {
                    let code_at = VisaHeader::LEN;
                    let code =
                        visa_reject(&rest[code_at..]).map_err(|e| e.shifted(at + code_at))?;
                    let original_at = code_at + VisaHeader::REJECT_PART_LEN;
                    let original =
                        visa(&rest[original_at..]).map_err(|e| e.shifted(at + original_at))?;
                    let rejected = Rejected {
                        visa: Some(code),
                        original: Header::Visa(original),
                    };
                    (
                        Some(Header::Visa(h)),
                        Some(rejected),
                        original_at + VisaHeader::LEN,
                    )
                }
            }
            // No header; and a header newer than this reference (the bench
            // compares only the kinds above), so adding one to the wire
            // crate's registry needs nothing here.
            _ => (None, None, 0),
        };
        Ok(Envelope {
            tpdu,
            header,
            rejected,
            body_offset: at + len,
        })
    }
}

criterion_group!(
    benches,
    frame_decode,
    routing_view,
    validate_index,
    header_parse,
    field_walk,
    stamp_f37,
    tpdu_swap,
    full_codec
);
criterion_main!(benches);
