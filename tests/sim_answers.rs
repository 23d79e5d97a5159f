//! The simulators' answers, pinned byte for byte.
//!
//! The simulators are the switch's test oracles and build their answers with
//! their own code (`src/sim/answer.rs`, `src/sim/writer.rs`), not the switch's
//! decline or writer code. These tests hold that code to known bytes: for
//! every built-in spec, the answer to each request fixture
//! (`fixtures/<spec>/*.hex`) must equal `fixtures/sim-answers/<spec>/*.hex`,
//! both as built in process and as a real `sim node` writes it on a socket.
//! A change of the answers is then a deliberate one, reviewed with
//! `isoswitch decode` and blessed:
//!
//! ```sh
//! ISOSWITCH_BLESS=1 cargo test --test sim_answers
//! ```
//!
//! A second test is the CI guard for that separation: no file under
//! `src/sim/` may import the switch's `link`, `route` or `ops` modules, nor
//! call the helpers the switch builds its own answers with.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use isoswitch::iso8583::{Message, Spec};
use isoswitch::sim::node::{NodeSim, NodeSimConfig};
use isoswitch::wire::{Frame, FrameCodec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Decoder;

const SPECS: [&str; 6] = [
    "cups",
    "cup-pos",
    "visa-base1",
    "mastercard",
    "iso87ascii",
    "iso87binary",
];
const REQUESTS: [&str; 4] = ["purchase-request", "large", "sign-on", "echo-test"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn bless() -> bool {
    std::env::var_os("ISOSWITCH_BLESS").is_some()
}

/// Bytes of a hex fixture (`#` lines are comments).
fn read_hex(path: &Path) -> Vec<u8> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let digits: Vec<u8> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.bytes().filter(u8::is_ascii_hexdigit))
        .collect();
    assert!(
        digits.len().is_multiple_of(2),
        "{}: odd hex",
        path.display()
    );
    digits
        .chunks(2)
        .map(|p| {
            let s = std::str::from_utf8(p).expect("ascii");
            u8::from_str_radix(s, 16).expect("hex")
        })
        .collect()
}

fn write_hex(path: &Path, what: &str, bytes: &[u8]) {
    let mut text = format!(
        "# {what}\n# {} bytes, framed; rebuild: ISOSWITCH_BLESS=1 cargo test --test sim_answers\n",
        bytes.len()
    );
    for row in bytes.chunks(16) {
        let line: Vec<String> = row.iter().map(|b| format!("{b:02X}")).collect();
        text.push_str(&line.join(" "));
        text.push('\n');
    }
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, text).expect("write fixture");
}

/// The single frame's payload in `framed`.
fn payload(spec: &Spec, framed: &[u8]) -> Bytes {
    let f = spec.framing();
    let mut codec = FrameCodec::new(f.prefix, f.max_frame);
    let mut buf = BytesMut::from(framed);
    match codec.decode(&mut buf) {
        Ok(Some(Frame::Message(p))) if buf.is_empty() => p,
        other => panic!("not one message frame: {other:?}"),
    }
}

fn framed(spec: &Spec, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    spec.framing()
        .prefix
        .encode(payload.len(), &mut out)
        .expect("fits");
    out.extend_from_slice(payload);
    out.to_vec()
}

/// One pinned answer: the request fixture, who answers, the expected file.
struct Case {
    spec: &'static str,
    request: PathBuf,
    expected: PathBuf,
    /// `node` (sim node, any spec) or `issuer` (the network simulator's
    /// issuer answer: VISA, Mastercard).
    who: &'static str,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for spec in SPECS {
        for name in REQUESTS {
            let request = root()
                .join("fixtures")
                .join(spec)
                .join(format!("{name}.hex"));
            if !request.exists() {
                continue;
            }
            let dir = root().join("fixtures/sim-answers").join(spec);
            out.push(Case {
                spec,
                request: request.clone(),
                expected: dir.join(format!("{name}.node.hex")),
                who: "node",
            });
            if spec == "visa-base1" || spec == "mastercard" {
                out.push(Case {
                    spec,
                    request,
                    expected: dir.join(format!("{name}.issuer.hex")),
                    who: "issuer",
                });
            }
        }
    }
    out
}

fn answer_in_process(case: &Case) -> Vec<u8> {
    let spec = Spec::builtin(case.spec).expect("builtin spec");
    let req = payload(&spec, &read_hex(&case.request));
    let msg = Message::parse(&spec, req).expect("request fixture parses");
    let answer = match case.who {
        "issuer" => isoswitch::sim::visa::answer(&spec, &msg, "00"),
        _ => isoswitch::sim::answer::answer(&spec, &msg, "00"),
    }
    .expect("a request is answered");
    framed(&spec, &answer)
}

#[test]
fn sim_answers_match_their_fixtures() {
    let mut differ = Vec::new();
    let cases = cases();
    assert!(
        cases.len() >= 15,
        "every spec's request fixtures: {}",
        cases.len()
    );
    for case in &cases {
        let got = answer_in_process(case);
        if bless() {
            let what = format!(
                "sim {} answer to {}/{} (F39 00)",
                case.who,
                case.spec,
                case.request
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or("?")
            );
            write_hex(&case.expected, &what, &got);
            continue;
        }
        if !case.expected.exists() || read_hex(&case.expected) != got {
            differ.push(case.expected.display().to_string());
        }
    }
    assert!(
        differ.is_empty(),
        "simulator answers differ from their fixtures: {differ:?}\n\
         review with `isoswitch decode`, then ISOSWITCH_BLESS=1 cargo test --test sim_answers"
    );
}

/// What a running `sim node` writes on its socket for each request fixture is
/// the pinned answer, prefix included: the answer builder and the writer.
#[tokio::test]
async fn sim_node_writes_the_pinned_answers() {
    if bless() {
        return;
    }
    tokio::time::timeout(Duration::from_secs(30), async {
        for case in cases().iter().filter(|c| c.who == "node") {
            let spec = Arc::new(Spec::builtin(case.spec).expect("builtin spec"));
            let node = NodeSim::start(
                "127.0.0.1:0".parse().expect("addr"),
                Arc::clone(&spec),
                NodeSimConfig::new("01"),
            )
            .await
            .expect("node starts");
            let mut conn = TcpStream::connect(node.addr).await.expect("connect");
            conn.write_all(&read_hex(&case.request))
                .await
                .expect("send");
            let want = read_hex(&case.expected);
            let mut got = vec![0u8; want.len()];
            conn.read_exact(&mut got).await.expect("an answer");
            assert_eq!(got, want, "{}", case.expected.display());
            node.stop().await;
        }
    })
    .await
    .expect("within 30 s");
}

/// Imports of the switch that no simulator may have: the switch's I/O, its
/// routing and decline code, and its configuration.
const FORBIDDEN_MODULES: [&str; 3] = ["link", "route", "ops"];
/// Helpers the switch builds its own answers with; the simulators have their
/// own (`sim::answer`).
const FORBIDDEN_CALLS: [&str; 6] = [
    ".respond(",
    "swap_envelope",
    "swap_ids_in_place",
    "swap_in_place",
    ".swapped()",
    ".response()",
];

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read src/sim").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The violations in one file's text: `line: what`.
fn violations(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    // Grouped imports (`use crate::{link::x, ...}`) span lines: check the
    // text of each `use crate::{...}` as a whole too.
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for m in FORBIDDEN_MODULES {
            for path in [format!("crate::{m}"), format!("isoswitch::{m}")] {
                if code.contains(&format!("{path}::")) || code.contains(&format!("{path};")) {
                    out.push(format!("line {}: `{path}`", n + 1));
                }
            }
        }
        for call in FORBIDDEN_CALLS {
            if code.contains(call) {
                out.push(format!("line {}: `{call}`", n + 1));
            }
        }
    }
    let mut rest = text;
    while let Some(at) = rest.find("crate::{") {
        let group = &rest[at..];
        let end = group.find("};").unwrap_or(group.len());
        for m in FORBIDDEN_MODULES {
            let g = &group[..end];
            let hit = g
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .any(|w| w == m);
            if hit {
                out.push(format!("`use crate::{{...{m}...}}`"));
            }
        }
        rest = &group[end.min(group.len())..];
        if end == 0 {
            break;
        }
    }
    out
}

#[test]
fn simulators_do_not_use_the_switch_code() {
    let dir = root().join("src/sim");
    let files = rust_files(&dir);
    assert!(files.len() >= 8, "found the simulators: {files:?}");
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        for v in violations(&text) {
            found.push(format!("{}: {v}", file.display()));
        }
    }
    assert!(
        found.is_empty(),
        "simulators must build their answers with their own code (src/sim/answer.rs, \
         src/sim/writer.rs), not the switch's: {found:#?}"
    );
}

#[test]
fn the_guard_catches_what_it_should() {
    assert!(violations("use crate::iso8583::Spec;\nuse crate::util::Rng;\n").is_empty());
    assert_eq!(
        violations("use crate::link::io::writer::run_writer;").len(),
        1
    );
    assert_eq!(violations("let r = crate::route::decline::x();").len(), 1);
    assert_eq!(
        violations("use crate::{iso8583::Spec,\n    link::io::writer};").len(),
        1
    );
    assert_eq!(violations("let m = mti.response();").len(), 1);
    assert_eq!(violations("spec.swap_envelope(&mut env);").len(), 1);
    assert!(violations("// crate::link:: in a comment").is_empty());
}
