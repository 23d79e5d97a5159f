//! In process: no input makes the decoder panic

use isoswitch::cli::decode::{self, Options};
use isoswitch::iso8583::{Data, Spec};
use proptest::prelude::*;

use crate::fixtures::*;

pub(crate) fn run_in_process(spec: &Spec, input: &[u8], opts: Options) -> (String, String) {
    let mut out = Vec::new();
    let mut errs = Vec::new();
    let summary = decode::decode_stream(spec, input, opts, &mut out, &mut errs).expect("io");
    assert_eq!(summary.errors == 0, errs.is_empty());
    (
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&errs).into_owned(),
    )
}

#[test]
pub(crate) fn hex_detection() {
    assert!(decode::looks_like_hex(
        b"# a comment\n00 1A\n\tff # trailing\n"
    ));
    assert!(decode::looks_like_hex(b"abc"));
    assert!(!decode::looks_like_hex(b"0200\x2e"));
    assert!(!decode::looks_like_hex(b"00 zz"));
    assert_eq!(decode::parse_hex(b"# x\n0a 1B\n").unwrap(), [0x0A, 0x1B]);
    assert!(decode::parse_hex(b"abc").is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..600)) {
        for name in Spec::builtin_names() {
            let spec = Spec::builtin(name).expect("builtin");
            for opts in [Options::default(), Options { json: true, reveal: false }] {
                run_in_process(&spec, &input, opts);
            }
        }
    }

    #[test]
    fn mutated_fixtures_never_panic(
        pick in any::<prop::sample::Index>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let all = fixtures();
        let f = &all[pick.index(all.len())];
        let spec = f.spec();
        let (mut bytes, _) = f.bytes();
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        if cut.index(4) == 0 {
            let n = cut.index(bytes.len());
            bytes.truncate(n);
        }
        for json in [false, true] {
            run_in_process(&spec, &bytes, Options { json, reveal: false });
        }
    }
}

#[test]
pub(crate) fn decoded_fixture_matches_definition() {
    // The decoder sees what the encoder wrote: a cross-check through Spec::decode.
    for f in fixtures() {
        let spec = f.spec();
        let (bytes, lens) = f.bytes();
        let mut at = 0;
        for (frame, len) in f.frames.iter().zip(lens) {
            let payload = &bytes[at + spec.framing().prefix.len()..][..len];
            at += spec.framing().prefix.len() + len;
            if let Frame::Message(d) = frame {
                let back = spec.decode(payload).expect("decodes");
                assert_eq!(back.mti, d.mti);
                assert_eq!(back.fields.len(), d.fields.len());
                for ((id, v), (id2, v2)) in back.fields.iter().zip(&d.fields) {
                    assert_eq!(id, id2);
                    let def = spec.field(*id).expect("def");
                    if def.data == Data::Binary {
                        assert_eq!(v, v2, "{}/{} F{id}", f.spec, f.name);
                    }
                }
            }
        }
    }
}
