//! Codec benchmarks: the per-message work on the switch's routing path (frame
//! cut, routing view, F37 stamp, TPDU swap) and the full decode / encode used by
//! tools. Numbers and the command that produced them: `BENCHMARKS.md`.
//!
//! Targets: routing view ≤ 200 ns, stamp ≤ 50 ns, full decode of a ~20-field
//! message ≤ 2 µs.

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use isoswitch::iso8583::{Bitmap, Data, Decoded, Message, Spec, Unit, Value, samples, stamp};
use isoswitch::wire::{Frame, FrameCodec, Tpdu};
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

criterion_group!(
    benches,
    frame_decode,
    routing_view,
    validate_index,
    stamp_f37,
    tpdu_swap,
    full_codec
);
criterion_main!(benches);
