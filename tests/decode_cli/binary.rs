//! Running the binary

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use isoswitch::iso8583::{Decoded, Spec, Value};
use isoswitch::wire::HeaderKind;

use crate::fixtures::*;

pub(crate) fn isoswitch(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_isoswitch"));
    cmd.args(args)
        .env_remove("ISOSWITCH_LOG")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run isoswitch");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input).expect("write stdin");
    }
    child.wait_with_output().expect("isoswitch output")
}

/// A key/value line of the text dissection, at the top level of a frame.
pub(crate) fn kv(key: &str, value: impl std::fmt::Display) -> String {
    format!("  {key:<22}{value}")
}

pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub(crate) fn decode_fixture(f: &Fixture, extra: &[&str]) -> Output {
    let path = f.path();
    let mut args = vec![
        "decode",
        "--spec",
        f.spec,
        path.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(extra);
    let out = isoswitch(&args, None);
    assert!(
        out.status.success(),
        "{}/{} {extra:?}: {:?}\nstderr: {}",
        f.spec,
        f.name,
        out.status,
        stderr(&out)
    );
    assert!(
        out.stderr.is_empty(),
        "{}/{}: {}",
        f.spec,
        f.name,
        stderr(&out)
    );
    out
}

pub(crate) fn assert_no_secrets(what: &str, s: &str) {
    for secret in [PAN, PIN_HEX, MAC_HEX, EMV_HEX] {
        assert!(!s.contains(secret), "{what}: {secret} in clear:\n{s}");
    }
}

#[test]
pub(crate) fn every_fixture_decodes_as_text() {
    for f in fixtures() {
        let spec = f.spec();
        let what = format!("{}/{}", f.spec, f.name);
        let out = stdout(&decode_fixture(&f, &[]));
        assert_no_secrets(&what, &out);
        let frames = out.lines().filter(|l| l.starts_with("frame ")).count();
        assert_eq!(frames, f.frames.len(), "{what}:\n{out}");
        let keep_alives = f
            .frames
            .iter()
            .filter(|x| matches!(x, Frame::KeepAlive))
            .count();
        assert_eq!(out.matches("keep-alive").count(), keep_alives, "{what}");
        for d in f.messages() {
            assert!(out.contains(&kv("MTI", d.mti)), "{what}:\n{out}");
            for (id, _) in &d.fields {
                // Long names are cut to fit the column.
                let name: String = spec
                    .field(*id)
                    .expect("defined")
                    .name
                    .chars()
                    .take(40)
                    .collect();
                assert!(out.contains(&format!("F{id} ")), "{what}: F{id}");
                assert!(out.contains(name.as_str()), "{what}: {name}");
            }
            if d.has(2) {
                assert!(out.contains(PAN_MASKED), "{what}: masked PAN");
            }
            if d.has(11) {
                assert!(out.contains("123456"), "{what}: STAN");
            }
        }
        let header = match spec.envelope().header {
            HeaderKind::None => None,
            HeaderKind::Cups => Some("CUPS header"),
            HeaderKind::Pos => Some("POS header"),
            HeaderKind::Visa => Some("VISA header"),
        };
        if let Some(h) = header {
            let n = out.matches(h).count();
            assert_eq!(n > 0, f.messages().next().is_some(), "{what}: {h}");
        }
        if spec.envelope().tpdu && f.messages().next().is_some() {
            assert!(out.contains("TPDU"), "{what}");
        }
    }
}

#[test]
pub(crate) fn reveal_shows_secrets_in_clear() {
    for f in fixtures() {
        if !f.messages().any(|d| d.has(2)) {
            continue;
        }
        let out = stdout(&decode_fixture(&f, &["--reveal"]));
        assert!(out.contains(PAN), "{}/{}", f.spec, f.name);
    }
}

/// The JSON a message should give: every field as the encoder got it (binary as
/// upper-case hex), masked unless `reveal`.
pub(crate) fn expected_fields(spec: &Spec, d: &Decoded, reveal: bool) -> BTreeMap<String, String> {
    d.fields
        .iter()
        .map(|(id, v)| {
            let def = spec.field(*id).expect("defined");
            let s = if isoswitch::iso8583::is_sensitive(def) && !reveal {
                v.show(def).to_string()
            } else {
                match v {
                    Value::Text(t) => t.clone(),
                    Value::Binary(b) => b.iter().map(|x| format!("{x:02X}")).collect(),
                }
            };
            (id.to_string(), s)
        })
        .collect()
}

pub(crate) fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
pub(crate) fn every_fixture_decodes_as_json() {
    for f in fixtures() {
        let spec = f.spec();
        let what = format!("{}/{}", f.spec, f.name);
        for reveal in [false, true] {
            let args: &[&str] = if reveal {
                &["--json", "--reveal"]
            } else {
                &["--json"]
            };
            let out = stdout(&decode_fixture(&f, args));
            if !reveal {
                assert_no_secrets(&what, &out);
            }
            let lines = json_lines(&out);
            let messages: Vec<&Decoded> = f.messages().collect();
            assert_eq!(lines.len(), messages.len(), "{what}: one line per message");
            for ((line, raw), d) in lines.iter().zip(out.lines()).zip(messages) {
                assert_eq!(line["mti"], d.mti.to_string(), "{what}");
                match spec.envelope().tpdu {
                    true => assert_eq!(line["tpdu"], hex(&d.envelope[..5]), "{what}"),
                    false => assert!(line["tpdu"].is_null(), "{what}"),
                }
                let header = &line["header"];
                match spec.envelope().header {
                    HeaderKind::None => assert!(header.is_null(), "{what}"),
                    _ => assert!(header["kind"].is_string(), "{what}: {header}"),
                }
                let fields: BTreeMap<String, String> = line["fields"]
                    .as_object()
                    .expect("fields object")
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().expect("string value").to_string()))
                    .collect();
                assert_eq!(
                    fields,
                    expected_fields(&spec, d, reveal),
                    "{what} reveal={reveal}"
                );
                // Field keys in ascending numeric order on the line itself.
                let at: Vec<usize> = d
                    .fields
                    .iter()
                    .map(|(id, _)| raw.find(&format!("\"{id}\":")).expect("key"))
                    .collect();
                assert!(at.windows(2).all(|w| w[0] < w[1]), "{what}: key order");
            }
        }
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02X}")).collect()
}

#[test]
pub(crate) fn json_headers_name_their_parts() {
    let f = fixtures()
        .into_iter()
        .find(|f| f.spec == "cups" && f.name == "reject")
        .expect("cups reject");
    let line = &json_lines(&stdout(&decode_fixture(&f, &["--json"])))[0];
    let h = &line["header"];
    assert_eq!(h["kind"], "cups");
    assert_eq!(h["reject_code"], "00045");
    assert_eq!(h["destination_id"], "03105840");
    assert_eq!(h["original"]["destination_id"], "00019999");
    assert_eq!(h["original"]["reject_code"], "00000");

    let text = stdout(&decode_fixture(&f, &[]));
    assert!(
        text.contains("00045  rejected: bad destination ID"),
        "{text}"
    );
    assert!(text.contains("original header"), "{text}");

    let f = fixtures()
        .into_iter()
        .find(|f| f.spec == "visa-base1" && f.name == "reject")
        .expect("visa reject");
    let line = &json_lines(&stdout(&decode_fixture(&f, &["--json"])))[0];
    assert_eq!(line["header"]["reject"]["code"], "0007");
    assert_eq!(line["header"]["original"]["destination_id"], "000001");
    let text = stdout(&decode_fixture(&f, &[]));
    assert!(text.contains("reject code 0007"), "{text}");

    let f = fixtures()
        .into_iter()
        .find(|f| f.spec == "cup-pos" && f.name == "purchase-request")
        .expect("pos");
    let line = &json_lines(&stdout(&decode_fixture(&f, &["--json"])))[0];
    assert_eq!(line["tpdu"], "6000030000");
    assert_eq!(line["header"]["raw"], "603100310730");
}

#[test]
pub(crate) fn readme_command_works() {
    // Tests run from the crate root, as the README's command does.
    let out = isoswitch(
        &[
            "decode",
            "--spec",
            "cup-pos",
            "fixtures/cup-pos/purchase-request.hex",
        ],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("0200  1987 financial request, from acquirer"),
        "{text}"
    );
    assert!(text.contains(&kv("TPDU", "6000030000")), "{text}");
    assert!(text.contains(PAN_MASKED), "{text}");
    assert!(text.contains("Track 2 data"), "{text}");
    assert!(text.contains("[masked 36 chars]"), "track 2 masked: {text}");
    assert!(text.contains("[masked 8 bytes]"), "PIN masked: {text}");
}

#[test]
pub(crate) fn hex_argument_and_stdin() {
    let f = fixtures()
        .into_iter()
        .find(|f| f.spec == "cups" && f.name == "stream")
        .expect("cups stream");
    let (bytes, _) = f.bytes();
    let spaced: String = bytes
        .chunks(7)
        .map(|c| format!("{}\n ", hex(c).to_lowercase()))
        .collect();
    let by_file = stdout(&decode_fixture(&f, &[]));

    let out = isoswitch(&["decode", "--spec", "cups", "--hex", &spaced], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), by_file);

    let hex_text = std::fs::read(f.path()).expect("fixture");
    for args in [
        &["decode", "--spec", "cups", "-"][..],
        &["decode", "--spec", "cups"][..],
    ] {
        let out = isoswitch(args, Some(&hex_text));
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), by_file, "{args:?}");
    }
    // Raw bytes on stdin.
    let out = isoswitch(&["decode", "--spec", "cups", "-"], Some(&bytes));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), by_file);
    // A raw file that happens to look like hex needs --raw: "0000" is a CUPS
    // keep-alive as raw bytes, and two zero bytes as hex.
    let out = isoswitch(&["decode", "--spec", "cups", "--raw", "-"], Some(b"0000"));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("keep-alive"));
}

#[test]
pub(crate) fn visa_session_control_is_shown_not_decoded() {
    let out = isoswitch(
        &["decode", "--spec", "visa-base1", "--hex", "00022000 0102"],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("session control"), "{text}");
    assert!(text.contains(&kv("payload", "0102")), "{text}");
    let out = isoswitch(
        &[
            "decode",
            "--spec",
            "visa-base1",
            "--json",
            "--hex",
            "00022000 0102",
        ],
        None,
    );
    assert!(out.status.success() && out.stdout.is_empty());
}

/// Mastercard's DE 48 is shown by its parts: the category code and each
/// subelement named, the CVC 2 masked unless revealed; a DE 48 off the
/// layout is shown whole, with where it broke.
#[test]
pub(crate) fn mastercard_de48_is_shown_by_subelements() {
    let path = fixtures_dir().join("mastercard/purchase-request.hex");
    let path = path.to_str().expect("utf-8 path");
    let out = isoswitch(&["decode", "--spec", "mastercard", path], None);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    let line = |label: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no {label} line in\n{text}"))
            .to_string()
    };
    assert!(line("lead").ends_with(" R"), "{text}");
    assert!(
        line("SE 87").contains("Card validation code result"),
        "{text}"
    );
    assert!(line("SE 92").ends_with("[masked 3 chars]"), "{text}");

    let revealed = stdout(&isoswitch(
        &["decode", "--spec", "mastercard", "--reveal", path],
        None,
    ));
    assert!(
        revealed
            .lines()
            .any(|l| l.trim_start().starts_with("SE 92") && l.ends_with(" 123")),
        "{revealed}"
    );

    let spec = Spec::builtin("mastercard").expect("mastercard");
    let mut off = mastercard_0100(&spec);
    off.set_text(48, "R92991");
    let payload = spec.encode(&off).expect("encodes");
    let mut framed = (payload.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&payload);
    let out = isoswitch(
        &["decode", "--spec", "mastercard", "--raw", "-"],
        Some(&framed),
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        text.contains("not split into subelements: field 48 subelements at offset 5"),
        "{text}"
    );
}
