//! Replays every input the fuzzers found a crash with
//! (`fixtures/fuzz-regressions/<target>/`, one raw file each) through the same
//! harness (`isoswitch::fuzzing`), every fixture frame stream through the
//! frame, message and mask harnesses and every fixture capture through the
//! pcap harness, so a fixed crash stays fixed under plain
//! `cargo test`.

use std::path::Path;

use isoswitch::fuzzing;

fn regressions(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/fuzz-regressions")
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<u8>)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().is_file())
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).unwrap())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn every_fuzz_regression_replays_clean() {
    let mut replayed = 0;
    for (target, harness) in fuzzing::TARGETS {
        for (name, input) in regressions(target) {
            let run = std::panic::catch_unwind(|| harness(&input));
            assert!(run.is_ok(), "{target}/{name} crashes again");
            replayed += 1;
        }
    }
    // Every directory under fixtures/fuzz-regressions names a target.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fuzz-regressions");
    for dir in std::fs::read_dir(root).unwrap().filter_map(Result::ok) {
        if dir.path().is_dir() {
            let name = dir.file_name().to_string_lossy().into_owned();
            assert!(
                fuzzing::TARGETS.iter().any(|(t, _)| *t == name),
                "fixtures/fuzz-regressions/{name} is no fuzz target"
            );
        }
    }
    eprintln!("replayed {replayed} fuzz regressions");
}

/// The fixtures as the frame decoder and message harnesses see them: their
/// invariants (split-anywhere framing, decode-encode-decode) hold on real data.
#[test]
fn fixtures_pass_the_fuzz_harnesses() {
    let names: Vec<&str> = isoswitch::iso8583::Spec::builtin_names().collect();
    let prefix_index = |spec: &isoswitch::iso8583::Spec| -> u8 {
        use isoswitch::wire::LengthPrefix::*;
        let order = [Binary2, Binary2Inclusive, Bcd2, Ascii4, Binary4, Visa4];
        order
            .iter()
            .position(|p| *p == spec.framing().prefix)
            .unwrap() as u8
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut checked = 0;
    for (index, name) in names.iter().enumerate() {
        let spec = isoswitch::iso8583::Spec::builtin(name).unwrap();
        let Ok(entries) = std::fs::read_dir(root.join(name)) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let text = std::fs::read_to_string(entry.path()).unwrap();
            let hex: String = text
                .lines()
                .map(|l| l.split('#').next().unwrap_or(""))
                .collect::<String>()
                .split_whitespace()
                .collect();
            let stream: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            let mut input = vec![prefix_index(&spec), 0x10, 0x00];
            input.extend_from_slice(&stream);
            fuzzing::frame_decoder(&input);
            let prefix = spec.framing().prefix;
            if let Ok(Some(frame)) =
                isoswitch::wire::prefix::split_frame(prefix, &stream, spec.framing().max_frame)
            {
                let mut input = vec![index as u8];
                input.extend_from_slice(frame.payload);
                fuzzing::message(&input);
                fuzzing::mask(&input);
                fuzzing::headers(frame.payload);
            }
            checked += 1;
        }
    }
    assert!(checked >= 30, "only {checked} fixtures found");
}

/// The fixture captures as the pcap harness sees them: reassembly, framing
/// and timeline invariants hold on real captures.
#[test]
fn fixture_captures_pass_the_pcap_harness() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/captures");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap().filter_map(Result::ok) {
        let path = entry.path();
        let ext = path.extension().and_then(|e| e.to_str());
        if matches!(ext, Some("pcap" | "pcapng")) {
            let data = std::fs::read(&path).unwrap();
            assert!(
                isoswitch::capture::read::read_bytes("fixture", &data).is_ok(),
                "{} reads",
                path.display()
            );
            fuzzing::pcap(&data);
            checked += 1;
        }
    }
    assert!(checked >= 6, "only {checked} captures found");
}

/// The switch's path as the `service` harness drives it, on scripts whose
/// outcome is known: valid purchases are forwarded and each echo answered
/// once (the harness checks), a duplicate and a mangled request are
/// declined or dropped, a stray node frame reaches no client. Each dialect.
#[test]
fn scripts_pass_the_service_harness() {
    for dialect in 0u8..5 {
        // Three purchases (the second and third repeat the first's key),
        // one with a byte of its MTI flipped, one stray node frame.
        let script = [
            dialect, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 3, 0, 0, 0x40, 2, 3, b'0', b'2', b'1', 0, 2,
            0xFF, 0xFF,
        ];
        fuzzing::service(&script);
        // Nothing but garbage requests.
        fuzzing::service(&[dialect, 0, 4, 1, 2, 3, 4, 0, 0]);
    }
}
