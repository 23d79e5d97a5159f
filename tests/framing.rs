//! Framing through the public API: any split of a stream yields the same frames,
//! bad input never panics, limits hold.

use bytes::{Bytes, BytesMut};
use isoswitch::wire::prefix::{FrameHeader, split_frame};
use isoswitch::wire::{Frame, FrameCodec, FrameError, LengthPrefix, WireError};
use proptest::prelude::*;
use tokio_util::codec::{Decoder, Encoder};

const MAX: usize = 64 * 1024;

fn encode_all(prefix: LengthPrefix, frames: &[Frame]) -> BytesMut {
    let mut codec = FrameCodec::new(prefix, MAX);
    let mut out = BytesMut::new();
    for f in frames {
        codec.encode(f.clone(), &mut out).expect("encodable frame");
    }
    out
}

/// Feeds `stream` to a fresh decoder in chunks of the given sizes (cycling), then
/// signals EOF. Returns every frame, or the first error.
fn decode_chunked(
    prefix: LengthPrefix,
    max_frame: usize,
    stream: &[u8],
    chunks: &[usize],
) -> Result<Vec<Frame>, FrameError> {
    let mut codec = FrameCodec::new(prefix, max_frame);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut rest = stream;
    let mut sizes = chunks.iter().copied().filter(|&n| n > 0).cycle();
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(rest.len()).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        buf.extend_from_slice(chunk);
        while let Some(f) = codec.decode(&mut buf)? {
            frames.push(f);
        }
    }
    while let Some(f) = codec.decode_eof(&mut buf)? {
        frames.push(f);
    }
    Ok(frames)
}

/// Feeds `stream` split at the given points.
fn decode_split_at(prefix: LengthPrefix, stream: &[u8], points: &[usize]) -> Vec<Frame> {
    let mut sizes = Vec::new();
    let mut last = 0;
    for &p in points {
        sizes.push(p - last);
        last = p;
    }
    sizes.push(stream.len() - last);
    // A zero-sized chunk is skipped by decode_chunked; the split is the same.
    if sizes.iter().all(|&n| n == 0) {
        sizes = vec![1];
    }
    decode_chunked(prefix, MAX, stream, &sizes).expect("valid stream")
}

fn frame_strategy(prefix: LengthPrefix) -> BoxedStrategy<Frame> {
    let top = prefix.max_payload().min(3000);
    let message = prop::collection::vec(any::<u8>(), 1..=top)
        .prop_map(|v| Frame::Message(Bytes::from(v)))
        .boxed();
    if prefix.has_session_control() {
        prop_oneof![
            1 => Just(Frame::KeepAlive),
            4 => message,
            1 => prop::collection::vec(any::<u8>(), 0..64)
                .prop_map(|v| Frame::SessionControl(Bytes::from(v))),
        ]
        .boxed()
    } else {
        prop_oneof![1 => Just(Frame::KeepAlive), 4 => message].boxed()
    }
}

fn any_prefix() -> impl Strategy<Value = LengthPrefix> {
    prop::sample::select(LengthPrefix::ALL.to_vec())
}

proptest! {
    #[test]
    fn encode_then_decode_with_any_chunking(
        (prefix, frames) in any_prefix().prop_flat_map(|p| {
            (Just(p), prop::collection::vec(frame_strategy(p), 0..12))
        }),
        chunks in prop::collection::vec(1usize..2000, 1..16),
    ) {
        let stream = encode_all(prefix, &frames);
        let decoded = decode_chunked(prefix, MAX, &stream, &chunks).expect("valid stream");
        prop_assert_eq!(decoded, frames);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_prefix_parsers(
        input in prop::collection::vec(any::<u8>(), 0..16),
        max_frame in prop_oneof![Just(0usize), 0usize..20_000, Just(usize::MAX)],
    ) {
        for prefix in LengthPrefix::ALL {
            let header = prefix.parse_header(&input, max_frame);
            if let Ok(Some(FrameHeader { payload_len, .. })) = header {
                prop_assert!(payload_len <= max_frame);
                prop_assert!(input.len() >= prefix.len());
            }
            let _ = split_frame(prefix, &input, max_frame);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(
        input in prop::collection::vec(any::<u8>(), 0..512),
        chunks in prop::collection::vec(1usize..64, 1..8),
        max_frame in 0usize..1024,
    ) {
        for prefix in LengthPrefix::ALL {
            if let Ok(frames) = decode_chunked(prefix, max_frame, &input, &chunks) {
                // Whatever was cut covers the input exactly, and re-encodes to it
                // (except VISA session-control prefixes, whose flag bits other
                // than the marker are not kept).
                let again = encode_all(prefix, &frames);
                prop_assert_eq!(again.len(), input.len());
                if !frames.iter().any(|f| matches!(f, Frame::SessionControl(_))) {
                    prop_assert_eq!(&again[..], &input[..]);
                }
            }
        }
    }
}

fn three_frames(prefix: LengthPrefix) -> Vec<Frame> {
    let mut frames = vec![
        Frame::Message(Bytes::from_static(b"0800 sign on")),
        Frame::KeepAlive,
        Frame::Message(Bytes::from(
            (0..=255u8).cycle().take(300).collect::<Vec<_>>(),
        )),
    ];
    if prefix.has_session_control() {
        frames.insert(1, Frame::SessionControl(Bytes::from_static(b"\x01")));
    }
    frames
}

#[test]
fn every_split_point_yields_the_same_frames() {
    for prefix in LengthPrefix::ALL {
        let frames = three_frames(prefix);
        let stream = encode_all(prefix, &frames);
        for at in 0..=stream.len() {
            assert_eq!(
                decode_split_at(prefix, &stream, &[at]),
                frames,
                "{prefix} split at {at}"
            );
        }
        assert_eq!(
            decode_chunked(prefix, MAX, &stream, &[1]).unwrap(),
            frames,
            "{prefix} one byte at a time"
        );
        assert_eq!(
            decode_chunked(prefix, MAX, &stream, &[stream.len()]).unwrap(),
            frames,
            "{prefix} all in one read"
        );
    }
}

#[test]
fn every_pair_of_split_points_yields_the_same_frames() {
    for prefix in LengthPrefix::ALL {
        let frames = vec![
            Frame::Message(Bytes::from_static(b"abc")),
            Frame::KeepAlive,
            Frame::Message(Bytes::from_static(b"0810 response")),
        ];
        let stream = encode_all(prefix, &frames);
        for a in 0..=stream.len() {
            for b in a..=stream.len() {
                assert_eq!(
                    decode_split_at(prefix, &stream, &[a, b]),
                    frames,
                    "{prefix} split at {a}, {b}"
                );
            }
        }
    }
}

/// A message larger than one 1460-byte TCP segment arrives in MTU-sized reads
/// over a real async pipe and comes out whole.
#[tokio::test]
async fn message_over_one_mtu_reassembles() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const MTU: usize = 1460;

    for prefix in LengthPrefix::ALL {
        let big = Bytes::from((0..5000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        let frames = vec![
            Frame::Message(Bytes::from_static(b"small")),
            Frame::Message(big.clone()),
            Frame::KeepAlive,
            Frame::Message(big),
        ];
        let stream = encode_all(prefix, &frames).freeze();

        let (mut client, mut server) = tokio::io::duplex(MTU);
        let writer = tokio::spawn(async move {
            for segment in stream.chunks(MTU) {
                client.write_all(segment).await.expect("write");
            }
            client.shutdown().await.expect("shutdown");
        });

        let mut codec = FrameCodec::new(prefix, 8 * 1024);
        let mut buf = BytesMut::new();
        let mut decoded = Vec::new();
        loop {
            let n = server.read_buf(&mut buf).await.expect("read");
            assert!(n <= MTU);
            if n == 0 {
                while let Some(f) = codec.decode_eof(&mut buf).expect("clean eof") {
                    decoded.push(f);
                }
                break;
            }
            while let Some(f) = codec.decode(&mut buf).expect("valid stream") {
                decoded.push(f);
            }
        }
        writer.await.expect("writer");
        assert_eq!(decoded, frames, "{prefix}");
    }
}

#[test]
fn max_frame_violation_errors_without_a_huge_buffer() {
    let cases: [(LengthPrefix, &[u8]); 6] = [
        (LengthPrefix::Binary4, &[0xFF, 0xFF, 0xFF, 0xFF]),
        (LengthPrefix::Binary4, &[0x7F, 0x00, 0x00, 0x00]),
        (LengthPrefix::Binary2, &[0xFF, 0xFF]),
        (LengthPrefix::Binary2Inclusive, &[0xFF, 0xFF]),
        (LengthPrefix::Ascii4, b"9999"),
        (LengthPrefix::Visa4, &[0xFF, 0xFF, 0x00, 0x00]),
    ];
    let max_frame = 1000;
    for (prefix, bytes) in cases {
        let mut codec = FrameCodec::new(prefix, max_frame);
        let mut buf = BytesMut::with_capacity(64);
        buf.extend_from_slice(bytes);
        let err = codec.decode(&mut buf).expect_err("too long");
        assert!(
            matches!(
                err,
                FrameError::Wire(WireError::FrameTooLong {
                    offset: 0,
                    max: 1000,
                    ..
                })
            ),
            "{prefix}: {err:?}"
        );
        assert!(
            buf.capacity() < max_frame,
            "{prefix} reserved {}",
            buf.capacity()
        );
        assert!(!codec.in_frame());
    }
    // At the limit exactly, the codec reserves the frame and no more.
    let mut codec = FrameCodec::new(LengthPrefix::Ascii4, max_frame);
    let mut buf = BytesMut::from(&b"1000"[..]);
    assert_eq!(codec.decode(&mut buf).unwrap(), None);
    assert!(buf.capacity() >= max_frame && buf.capacity() < 4 * max_frame);
}

#[test]
fn a_bad_prefix_mid_stream_names_its_stream_offset() {
    let mut stream = encode_all(
        LengthPrefix::Ascii4,
        &[
            Frame::Message(Bytes::from_static(b"hello")),
            Frame::KeepAlive,
        ],
    );
    stream.extend_from_slice(b"00A1");
    let err = decode_chunked(LengthPrefix::Ascii4, MAX, &stream, &[3]).unwrap_err();
    assert!(
        matches!(
            err,
            FrameError::Wire(WireError::BadPrefixDigit {
                offset: 15,
                byte: b'A',
                ..
            })
        ),
        "{err:?}"
    );
}

#[test]
fn partial_frame_at_eof_is_truncated() {
    let stream = encode_all(
        LengthPrefix::Binary2,
        &[Frame::Message(Bytes::from_static(b"hello"))],
    );
    for cut in 1..stream.len() {
        let err = decode_chunked(LengthPrefix::Binary2, MAX, &stream[..cut], &[2]).unwrap_err();
        assert!(
            matches!(
                err,
                FrameError::Wire(WireError::Truncated { offset: 0, .. })
            ),
            "cut at {cut}: {err:?}"
        );
    }
}
