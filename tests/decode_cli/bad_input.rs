//! Bad input

use std::path::PathBuf;

use isoswitch::iso8583::Spec;

use crate::{binary::*, fixtures::*};

pub(crate) fn fails(args: &[&str], stdin: Option<&[u8]>) -> (String, String) {
    let out = isoswitch(args, stdin);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    (stdout(&out), err)
}

pub(crate) fn fixture_bytes(spec: &str, name: &str) -> Vec<u8> {
    fixtures()
        .into_iter()
        .find(|f| f.spec == spec && f.name == name)
        .expect("fixture")
        .bytes()
        .0
}

#[test]
pub(crate) fn garbage_hex_names_the_offset() {
    let (_, err) = fails(&["decode", "--spec", "cups", "--hex", "00 2G 11"], None);
    assert!(err.contains("offset 4") && err.contains("0x47"), "{err}");
    let (_, err) = fails(&["decode", "--spec", "cups", "--hex", "303"], None);
    assert!(err.contains("odd number of hex digits"), "{err}");
    let (_, err) = fails(&["decode", "--spec", "cups", "--hex", "# nothing"], None);
    assert!(err.contains("no input"), "{err}");
}

#[test]
pub(crate) fn truncated_frame_names_frame_and_offset() {
    let mut bytes = fixture_bytes("cups", "purchase-request");
    let whole = bytes.len();
    bytes.truncate(whole - 5);
    let (out, err) = fails(&["decode", "--spec", "cups", "--hex", &hex(&bytes)], None);
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains(&format!(
            "frame 1 at offset 0: frame truncated at offset 0: need {whole} bytes, have {}",
            whole - 5
        )),
        "{err}"
    );

    // A good frame, then a cut prefix: the first is shown, the error names the second.
    let mut bytes = fixture_bytes("cup-pos", "purchase-request");
    let first = bytes.len();
    bytes.push(0x01);
    let (out, err) = fails(
        &["decode", "--spec", "cup-pos", "--hex", &hex(&bytes)],
        None,
    );
    assert!(out.contains("frame 1") && out.contains(PAN_MASKED), "{out}");
    assert!(
        err.contains(&format!(
            "frame 2 at offset {first}: length prefix truncated at offset {first}: need 2 bytes, have 1"
        )),
        "{err}"
    );
}

#[test]
pub(crate) fn non_digit_ascii_prefix_is_an_error() {
    let mut bytes = fixture_bytes("cups", "purchase-request");
    let first = bytes.len();
    bytes.extend_from_slice(b"00x1rest");
    let (out, err) = fails(&["decode", "--spec", "cups", "--hex", &hex(&bytes)], None);
    assert!(out.contains(&kv("MTI", "0200")), "{out}");
    assert!(
        err.contains(&format!(
            "frame 2 at offset {first}: length prefix at offset {}: byte 0x78 is not a ASCII decimal digit",
            first + 2
        )),
        "{err}"
    );
}

#[test]
pub(crate) fn oversize_frame_is_an_error() {
    let (_, err) = fails(&["decode", "--spec", "cups", "--hex", "39393939"], None);
    assert!(
        err.contains("frame length 9999 exceeds maximum 1938"),
        "{err}"
    );
    let (_, err) = fails(&["decode", "--spec", "cup-pos", "--hex", "FFFF00"], None);
    assert!(
        err.contains("frame length 65535 exceeds maximum 4096"),
        "{err}"
    );
    let (_, err) = fails(
        &["decode", "--spec", "visa-base1", "--hex", "0010 0100"],
        None,
    );
    assert!(err.contains("reserved byte is 0x01"), "{err}");
}

#[test]
pub(crate) fn undecodable_field_names_field_and_offsets() {
    let spec = Spec::builtin("cups").expect("cups");
    let mut bytes = fixture_bytes("cups", "purchase-request");
    let layout = spec.layout(&bytes[4..]).expect("layout");
    // F2's LL prefix is the first thing after the bitmaps.
    let f2 = layout.fields_at;
    bytes[4 + f2 + 1] = b'x';
    // A good frame after the bad one is still decoded.
    bytes.extend(fixture_bytes("cups", "echo-test"));
    let (out, err) = fails(&["decode", "--spec", "cups", "--hex", &hex(&bytes)], None);
    assert!(
        err.contains(&format!(
            "frame 1 at offset 0 (payload at 4): field 2 at offset {}: LL length byte 0x78 is not a ASCII digit; stream offset {}",
            f2 + 1,
            4 + f2 + 1
        )),
        "{err}"
    );
    assert!(out.contains("frame 2") && out.contains("0820"), "{out}");
    assert_no_secrets("bad field", &out);
    assert_no_secrets("bad field", &err);

    // JSON: the bad message prints nothing, the good one its line.
    let (out, _) = fails(
        &["decode", "--spec", "cups", "--json", "--hex", &hex(&bytes)],
        None,
    );
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["mti"], "0820");
}

#[test]
pub(crate) fn trailing_bytes_and_bad_envelope_are_errors() {
    // A POS frame whose length covers one byte more than the fields.
    let spec = Spec::builtin("cup-pos").expect("cup-pos");
    let mut payload = spec.encode(&purchase(&spec)).expect("encode");
    payload.push(0xEE);
    let mut bytes = Vec::new();
    spec.framing()
        .prefix
        .encode(payload.len(), &mut bytes)
        .expect("prefix");
    bytes.extend_from_slice(&payload);
    let (_, err) = fails(
        &["decode", "--spec", "cup-pos", "--hex", &hex(&bytes)],
        None,
    );
    assert!(err.contains("1 bytes after the last field"), "{err}");

    // A TPDU with the wrong ID byte.
    let (_, err) = fails(
        &["decode", "--spec", "cup-pos", "--hex", "0006 6100030000 00"],
        None,
    );
    assert!(
        err.contains("envelope: TPDU at offset 0: ID byte is 0x61"),
        "{err}"
    );
}

#[test]
pub(crate) fn unknown_spec_and_missing_file_fail_cleanly() {
    let (_, err) = fails(&["decode", "--spec", "nope", "--hex", "0000"], None);
    assert!(err.contains("nope"), "{err}");
    let (_, err) = fails(&["decode", "--spec", "cups", "/no/such/file.hex"], None);
    assert!(err.contains("/no/such/file.hex"), "{err}");
}

/// A custom spec that forgets `sensitive` on every field (a copy of
/// iso87ascii without the flags) still gets PAN, track 2 and the PIN block
/// masked, with a warning naming what the spec leaves unflagged; `--reveal`
/// stays the only way to see them.
#[test]
pub(crate) fn a_spec_without_sensitive_flags_still_masks_card_data() {
    let builtin = include_str!("../../specs/iso87ascii.toml");
    let unflagged: String = builtin
        .lines()
        .filter(|l| !l.starts_with("sensitive") && !l.starts_with("mask"))
        .map(|l| format!("{l}\n"))
        .collect();
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("unflagged-{}.toml", std::process::id()));
    std::fs::write(&path, unflagged).expect("write the spec");
    let spec = Spec::builtin("iso87ascii").expect("builtin");
    let payload = spec.encode(&purchase(&spec)).expect("encode");
    let mut framed = Vec::new();
    spec.framing()
        .prefix
        .encode(payload.len(), &mut framed)
        .expect("prefix");
    framed.extend_from_slice(&payload);
    let hex: String = framed.iter().map(|b| format!("{b:02X}")).collect();
    let spec_arg = path.to_str().expect("utf-8 path");
    let track2 = "6222021234567890123D2812101123456789";
    for json in [false, true] {
        let mut args = vec!["decode", "--spec", spec_arg, "--hex", &hex];
        if json {
            args.push("--json");
        }
        let out = isoswitch(&args, None);
        assert!(out.status.success(), "{}", stderr(&out));
        let shown = stdout(&out);
        for secret in [PAN, track2, "2812101123456789", PIN_HEX] {
            assert!(!shown.contains(secret), "{secret} in clear:\n{shown}");
        }
        assert!(
            shown.contains(PAN_MASKED),
            "the PAN masked as a PAN:\n{shown}"
        );
        let warning = stderr(&out);
        for id in ["F2", "F35", "F52"] {
            assert!(warning.contains(id), "warns about {id}: {warning}");
        }
        args.push("--reveal");
        let revealed = stdout(&isoswitch(&args, None));
        for secret in [PAN, track2, PIN_HEX] {
            assert!(
                revealed.contains(secret),
                "--reveal shows {secret}:\n{revealed}"
            );
        }
    }
    let _ = std::fs::remove_file(&path);
}
