//! Tests of the message view, decode/encode and masking across the builtin specs.

use bytes::Bytes;

use super::*;

fn spec(name: &str) -> Spec {
    Spec::builtin(name).unwrap()
}

fn parse<'s>(spec: &'s Spec, payload: &[u8]) -> Message<'s> {
    Message::parse(spec, Bytes::copy_from_slice(payload)).unwrap()
}

fn logical(f: &FieldRef<'_>) -> Vec<u8> {
    f.logical().collect()
}

#[test]
fn cups_view_finds_fields_and_routing_ranges() {
    let (spec, payload) = samples::cups_0200();
    let msg = parse(&spec, &payload);
    assert_eq!(msg.mti().to_string(), "0200");
    assert_eq!(msg.envelope().body_offset, 46);
    assert_eq!(&payload[2..6], format!("{:04}", payload.len()).as_bytes());
    assert!(msg.has_field(2) && msg.has_field(128) && !msg.has_field(1));
    let f37 = msg.field(37).unwrap().unwrap();
    assert_eq!(f37.data(), b"123456789012");
    assert_eq!(&payload[f37.range()], b"123456789012");
    let f2 = msg.field(2).unwrap().unwrap();
    assert_eq!(f2.units(), 19);
    assert_eq!(&payload[f2.prefix_at()..f2.range().start], b"19");
    assert!(msg.field(39).unwrap().is_none());

    let view = msg.routing_view().unwrap();
    assert_eq!(view.mti, Some(msg.mti()));
    assert_eq!(view.tpdu, None);
    for (id, r) in [
        (7, &view.f7),
        (11, &view.f11),
        (32, &view.f32),
        (33, &view.f33),
        (37, &view.f37),
        (41, &view.f41),
    ] {
        assert_eq!(
            r.clone(),
            Some(msg.field(id).unwrap().unwrap().range()),
            "F{id}"
        );
    }
    assert_eq!(view.f39, None);
    assert_eq!(view.f70, None);
    assert_eq!(spec.routing_view(&payload).unwrap(), view);
    assert_eq!(msg.validate().unwrap(), payload.len());
}

#[test]
fn pos_view_reads_bcd_mti_tpdu_and_bcd_fields() {
    let (spec, payload) = samples::pos_0200();
    assert_eq!(
        &payload[..11],
        &[0x60, 0, 3, 0, 0, 0x60, 0x31, 0, 0x31, 7, 0x30]
    );
    assert_eq!(&payload[11..13], &[0x02, 0x00]);
    let msg = parse(&spec, &payload);
    assert_eq!(msg.mti().to_string(), "0200");
    let f2 = msg.field(2).unwrap().unwrap();
    assert_eq!(payload[f2.prefix_at()], 0x19);
    assert_eq!(
        f2.data(),
        &[0x62, 0x22, 0x02, 0x12, 0x34, 0x56, 0x78, 0x90, 0x12, 0x3F]
    );
    assert_eq!(logical(&f2), b"6222021234567890123");
    let f35 = msg.field(35).unwrap().unwrap();
    assert_eq!(logical(&f35), b"6222021234567890123D2812101123456789");
    let f36 = msg.field(36).unwrap().unwrap();
    assert_eq!(payload[f36.prefix_at()..f36.prefix_at() + 2], [0x00, 0x72]);
    // F22 left-aligned, F23 right-aligned.
    assert_eq!(msg.field(22).unwrap().unwrap().data(), &[0x05, 0x10]);
    assert_eq!(msg.field(23).unwrap().unwrap().data(), &[0x00, 0x01]);
    assert_eq!(msg.field(41).unwrap().unwrap().data(), b"12345678");
    assert_eq!(msg.field(55).unwrap().unwrap().data().len(), 32);
    let view = msg.routing_view().unwrap();
    assert_eq!(view.tpdu.unwrap().destination, [0x00, 0x03]);
    assert_eq!(&payload[view.f11.unwrap()], &[0x12, 0x34, 0x56]);
    assert_eq!(&payload[view.f41.unwrap()], b"12345678");
}

#[test]
fn visa_text_is_ebcdic_and_stamp_translates() {
    let spec = spec("visa-base1");
    let mut payload = samples::purchase_payload(&spec).unwrap();
    let view = spec.routing_view(&payload).unwrap();
    let f37 = view.f37.clone().unwrap();
    assert_eq!(payload[f37.start], 0xF1); // '1'
    spec.stamp_f37(&mut payload, f37.clone(), 8, b"N7").unwrap();
    let mut out = [0u8; 2];
    assert_eq!(
        spec.read_f37_stamp(&payload, f37.clone(), 8, &mut out),
        Some(&b"N7"[..])
    );
    assert_eq!(&payload[f37.start + 8..f37.start + 10], &[0xD5, 0xF7]);
    let d = spec.decode(&payload).unwrap();
    assert_eq!(d.get(37).unwrap().as_text(), Some("12345678N712"));
    // VISA header total length = the whole payload.
    assert_eq!(
        u16::from_be_bytes([payload[3], payload[4]]) as usize,
        payload.len()
    );
}

#[test]
fn hex_bitmap_is_upper_case_out_and_either_case_in() {
    let spec = spec("iso87ascii");
    let mut payload = samples::purchase_payload(&spec).unwrap();
    assert_eq!(&payload[4..20], b"F23C4481A8E09810");
    let msg = parse(&spec, &payload);
    let mut before = msg.decode().unwrap();
    payload[4..20].make_ascii_lowercase();
    let after = spec.decode(&payload).unwrap();
    before.bitmaps = after.bitmaps;
    assert_eq!(before, after);
    payload[5] = b'G';
    assert_eq!(
        spec.layout(&payload).unwrap_err().to_string(),
        "bitmap at offset 5: byte 0x47 is not a hex digit"
    );
}

const TERTIARY: &str = r#"
name = "tertiary"
[framing]
prefix = "binary2"
max_frame = 4000
[mti]
encoding = "ebcdic"
[bitmap]
encoding = "binary"
tertiary = true
[defaults]
length_encoding = "ebcdic"
[[field]]
id = 2
name = "PAN"
format = "llvar"
length = 19
data = "ebcdic"
sensitive = true
mask = "pan"
[[field]]
id = 70
name = "NMIC"
format = "fixed"
length = 3
data = "bcd"
[[field]]
id = 150
name = "Tertiary thing"
format = "lllvar"
length = 300
data = "binary"
"#;

#[test]
fn tertiary_bitmap_roundtrips() {
    let spec = Spec::from_toml(TERTIARY).unwrap();
    let mut d = Decoded::new(vec![], "0800".parse().unwrap());
    d.set_text(70, "301");
    d.set_binary(150, vec![1, 2, 3]);
    d.set_text(2, "4000123412341234");
    let payload = spec.encode(&d).unwrap();
    assert_eq!(&payload[..4], &[0xF0, 0xF8, 0xF0, 0xF0]);
    assert_eq!(payload[4], 0xC0); // bit 1 (secondary) + bit 2
    assert_eq!(payload[12], 0x84); // bit 65 (tertiary) + bit 70
    let msg = parse(&spec, &payload);
    assert_eq!(msg.layout().bitmaps, 3);
    assert!(msg.has_field(150) && !msg.has_field(65) && !msg.has_field(1));
    assert_eq!(msg.field(150).unwrap().unwrap().data(), &[1, 2, 3]);
    let back = msg.decode().unwrap();
    assert_eq!(back.fields, d.fields);
    assert_eq!(spec.encode(&back).unwrap(), payload);
    // No tertiary fields: two bitmaps only; asking for three keeps three.
    d.remove(150);
    assert_eq!(spec.layout(&spec.encode(&d).unwrap()).unwrap().bitmaps, 2);
    d.bitmaps = 3;
    let p3 = spec.encode(&d).unwrap();
    assert_eq!(spec.decode(&p3).unwrap(), d);
}

#[test]
fn every_builtin_sample_roundtrips() {
    for name in Spec::builtin_names() {
        let spec = spec(name);
        let d = samples::purchase(&spec);
        let payload = spec.encode(&d).unwrap();
        let back = spec.decode(&payload).unwrap();
        assert_eq!(back.fields, d.fields, "{name}");
        assert_eq!(spec.encode(&back).unwrap(), payload, "{name}");
        let echo = spec.encode(&samples::echo(&spec)).unwrap();
        let msg = parse(&spec, &echo);
        assert!(msg.mti().is_network_management(), "{name}");
    }
}

/// A field read again where the index says it starts is the field the
/// index gives, on every builtin spec; a start the index did not record
/// gives whatever lies there, or nothing, and never panics.
#[test]
fn a_field_read_at_its_recorded_start_is_the_indexed_field() {
    for name in Spec::builtin_names() {
        let spec = spec(name);
        let payload = Bytes::from(samples::purchase_payload(&spec).unwrap());
        let msg = Message::parse(&spec, payload.clone()).unwrap();
        let index = msg.index(&Bitmap([u64::MAX; 3])).unwrap();
        let mut seen = 0;
        for id in 1..=192u16 {
            let start = index.starts().find(|&(i, _)| i == id).map(|(_, at)| at);
            let Some(indexed) = msg.indexed(&index, id) else {
                assert_eq!(start, None, "{name} F{id}");
                continue;
            };
            let at = start.expect("an indexed field has a start");
            let again = spec.field_at(&payload, id, at).expect("read again");
            assert_eq!(logical(&again), logical(&indexed), "{name} F{id}");
            assert_eq!(
                (again.range(), again.prefix_at(), again.units()),
                (indexed.range(), indexed.prefix_at(), indexed.units()),
                "{name} F{id}"
            );
            seen += 1;
        }
        assert!(seen > 5, "{name}: {seen} fields");
        assert_eq!(index.starts().count(), seen, "{name}");
        for at in 0..payload.len() + 3 {
            for id in [2, 35, 55, 128, 0, 193] {
                let _ = spec.field_at(&payload, id, at);
            }
        }
    }
}

#[test]
fn patch_fixed_checks_width_and_encoding() {
    let (spec, mut payload) = samples::pos_0200();
    let f11 = spec.field(11).unwrap();
    let r = spec.routing_view(&payload).unwrap().f11.unwrap();
    patch_fixed(&mut payload, f11, r.clone(), b"654321").unwrap();
    assert_eq!(&payload[r.clone()], &[0x65, 0x43, 0x21]);
    let e = patch_fixed(&mut payload, f11, r.clone(), b"65432").unwrap_err();
    assert_eq!(e.to_string(), "field 11: length 5, fixed length is 6");
    let e = patch_fixed(&mut payload, f11, r.clone(), b"65432=").unwrap_err();
    assert_eq!(
        e,
        IsoError::BadValue {
            id: 11,
            reason: crate::ValueReason::NotBcd(6)
        }
    );
    let e = patch_fixed(&mut payload, f11, r.start..r.end + 1, b"654321").unwrap_err();
    assert!(matches!(e, IsoError::BadRange { id: 11, .. }));
    let e = patch_fixed(&mut payload, spec.field(2).unwrap(), r.clone(), b"1").unwrap_err();
    assert_eq!(e, IsoError::NotFixed { id: 2 });
    let len = payload.len();
    let e = patch_fixed(&mut payload, f11, len..len + 3, b"654321").unwrap_err();
    assert!(matches!(e, IsoError::BadRange { .. }));
}

#[test]
fn stamp_writes_inside_f37_only() {
    let (spec, mut payload) = samples::cups_0200();
    let f37 = spec.routing_view(&payload).unwrap().f37.unwrap();
    stamp(&mut payload, f37.clone(), 10, b"07").unwrap();
    assert_eq!(&payload[f37.clone()], b"123456789007");
    assert!(stamp(&mut payload, f37.clone(), 11, b"07").is_err());
    assert!(stamp(&mut payload, f37.clone(), usize::MAX, b"07").is_err());
    let len = payload.len();
    assert!(stamp(&mut payload, len..len + 12, 0, b"07").is_err());
    spec.stamp_f37(&mut payload, f37.clone(), 0, b"AB").unwrap();
    assert_eq!(&payload[f37], b"AB3456789007");
}

#[test]
fn swap_envelope_turns_requests_around() {
    let (spec, mut payload) = samples::pos_0200();
    assert!(spec.swap_tpdu(&mut payload));
    assert_eq!(&payload[..5], &[0x60, 0, 0, 0, 3]);
    spec.swap_envelope(&mut payload);
    assert_eq!(&payload[..5], &[0x60, 0, 3, 0, 0]);
    let (spec, mut payload) = samples::cups_0200();
    assert!(!spec.swap_tpdu(&mut payload));
    spec.swap_envelope(&mut payload);
    assert_eq!(&payload[6..17], b"03105840   ");
}

#[test]
fn respond_builds_a_decline_from_a_request() {
    let (spec, payload) = samples::cups_0200();
    let req = spec.decode(&payload).unwrap();
    let resp = spec.respond(&req, "96").unwrap();
    assert_eq!(resp.mti.to_string(), "0210");
    assert_eq!(resp.get(39).unwrap().as_text(), Some("96"));
    assert_eq!(resp.get(11), req.get(11));
    assert_eq!(resp.get(37), req.get(37));
    assert!(resp.get(35).is_none() && resp.get(52).is_none());
    let bytes = spec.encode(&resp).unwrap();
    let msg = parse(&spec, &bytes);
    assert_eq!(&bytes[6..17], b"03105840   ");
    assert_eq!(&bytes[2..6], format!("{:04}", bytes.len()).as_bytes());
    assert_eq!(
        msg.routing_view().unwrap().f39.map(|r| &bytes[r]),
        Some(&b"96"[..])
    );
    assert!(matches!(
        spec.respond(&resp, "96"),
        Err(IsoError::NotARequest { .. })
    ));
}

#[test]
fn errors_name_field_and_offset() {
    let (spec, payload) = samples::cups_0200();
    assert_eq!(
        spec.layout(&payload[..50]).unwrap_err().to_string(),
        "bitmap at offset 50: truncated (need 8 bytes, have 0)"
    );
    let mut bad = payload.clone();
    bad[47] = b'X';
    assert_eq!(
        spec.layout(&bad).unwrap_err().to_string(),
        "MTI at offset 47: byte 0x58 is not a ASCII digit"
    );
    assert!(matches!(
        spec.layout(&payload[..10]),
        Err(IsoError::Envelope(_))
    ));
    // F2's LL says 41 > 19.
    let msg = parse(&spec, &payload);
    let f2 = msg.field(2).unwrap().unwrap();
    let mut bad = payload.clone();
    bad[f2.prefix_at()..f2.prefix_at() + 2].copy_from_slice(b"41");
    let msg = parse(&spec, &bad);
    assert_eq!(
        msg.field(37).unwrap_err().to_string(),
        format!(
            "field 2 at offset {}: LL length 41 exceeds max 19",
            f2.prefix_at()
        )
    );
    assert!(msg.field(2).is_err() && msg.routing_view().is_err() && msg.decode().is_err());
    // Truncated field data, trailing bytes.
    let short = &payload[..payload.len() - 3];
    assert!(matches!(
        spec.decode(short),
        Err(IsoError::FieldTruncated { id: 128, .. })
    ));
    let mut long = payload.clone();
    long.push(0);
    assert_eq!(
        spec.decode(&long).unwrap_err(),
        IsoError::TrailingBytes {
            offset: payload.len(),
            len: 1
        }
    );
}

#[test]
fn undefined_fields_and_bad_values_are_errors() {
    let spec = Spec::from_toml(TERTIARY).unwrap();
    let mut d = Decoded::new(vec![], "0800".parse().unwrap());
    d.set_text(3, "000000");
    assert_eq!(
        spec.encode(&d).unwrap_err(),
        IsoError::NoSuchField { id: 3 }
    );
    let mut payload = spec.encode(&Decoded::new(vec![], d.mti)).unwrap();
    payload[4] |= 0x20; // bit 3: not in the spec
    let msg = parse(&spec, &payload);
    assert!(matches!(
        msg.field(70),
        Ok(None) | Err(IsoError::UndefinedField { id: 3, .. })
    ));
    assert!(matches!(
        msg.decode(),
        Err(IsoError::UndefinedField { id: 3, .. })
    ));

    let mut d = Decoded::new(vec![], d.mti);
    d.set_binary(2, vec![1]);
    assert!(
        spec.encode(&d)
            .unwrap_err()
            .to_string()
            .contains("binary value")
    );
    d.set_text(2, "12345678901234567890");
    assert_eq!(
        spec.encode(&d).unwrap_err().to_string(),
        "field 2: length 20 exceeds max 19"
    );
    d.set_text(2, "中");
    assert!(spec.encode(&d).unwrap_err().to_string().contains("Latin-1"));
    d.fields = vec![(70, Value::text("301")), (2, Value::text("1"))];
    assert_eq!(spec.encode(&d).unwrap_err(), IsoError::FieldOrder { id: 2 });
}

#[test]
fn masking_hides_secrets_unless_revealed() {
    let (spec, payload) = samples::cups_0200();
    let msg = parse(&spec, &payload);
    let f2 = msg.field(2).unwrap().unwrap();
    assert_eq!(f2.to_string(), "622202*********0123");
    assert_eq!(f2.show().reveal().to_string(), "6222021234567890123");
    assert!(!format!("{f2:?}").contains("6222021234567890123"));
    let f35 = msg.field(35).unwrap().unwrap();
    assert_eq!(f35.to_string(), "[masked 36 chars]");
    let f52 = msg.field(52).unwrap().unwrap();
    assert_eq!(f52.to_string(), "[masked 8 bytes]");
    assert_eq!(f52.show().reveal().to_string(), "123456789ABCDEF0");
    assert_eq!(msg.field(37).unwrap().unwrap().to_string(), "123456789012");

    let d = msg.decode().unwrap();
    let shown = d.show(&spec).to_string();
    assert!(shown.contains("622202*********0123"), "{shown}");
    assert!(!shown.contains("6222021234567890123"), "{shown}");
    assert!(!shown.contains("D2812"), "{shown}");
    assert!(
        d.show(&spec)
            .reveal()
            .to_string()
            .contains("6222021234567890123")
    );
    let debug = format!("{d:?} {msg:?} {:?}", msg.routing_view().unwrap());
    assert!(
        !debug.contains("6222021234567890123") && !debug.contains("2812101"),
        "{debug}"
    );
    assert_eq!(format!("{:?}", d.get(2).unwrap()), "Text([19 chars])");

    // A short PAN is masked fully; BCD PAN from the POS dialect masks the same way.
    let def = spec.field(2).unwrap();
    assert_eq!(
        Value::text("123456789012").show(def).to_string(),
        "[masked 12 chars]"
    );
    let (pos, p) = samples::pos_0200();
    let f2 = parse(&pos, &p).field(2).unwrap().unwrap().to_string();
    assert_eq!(f2, "622202*********0123");
}

/// A spec that flags nothing sensitive still masks PAN, track data, PIN
/// block, EMV data and MACs, the PAN as a PAN: one rule, whatever the spec.
#[test]
fn always_sensitive_fields_are_masked_whatever_the_spec_says() {
    let mut spec = samples::cups_0200().0;
    let flagged = spec.fields().iter().filter(|d| d.sensitive).count();
    assert!(flagged > 0);
    let unflag = |def: &FieldDef| FieldDef {
        sensitive: false,
        mask: crate::Mask::Full,
        ..def.clone()
    };
    let f2 = unflag(spec.field(2).unwrap());
    let f35 = unflag(spec.field(35).unwrap());
    let f14 = unflag(spec.field(14).unwrap());
    assert_eq!(
        Value::text("6222021234567890123").show(&f2).to_string(),
        "622202*********0123"
    );
    assert_eq!(
        Value::text("6222021234567890123D2812")
            .show(&f35)
            .to_string(),
        "[masked 24 chars]"
    );
    assert_eq!(
        Value::text("2812").show(&f14).to_string(),
        "2812",
        "a spec's choice"
    );
    assert!(crate::is_sensitive(&f2) && !crate::is_sensitive(&f14));
    assert!(crate::unflagged_sensitive(&spec).is_empty());
    spec = Spec::from_toml(
        &include_str!("../../../specs/iso87ascii.toml")
            .replace("sensitive = true\n", "")
            .replace("mask = \"pan\"\n", "")
            .replace("mask = \"full\"\n", ""),
    )
    .unwrap();
    assert_eq!(crate::unflagged_sensitive(&spec), crate::ALWAYS_SENSITIVE);
}

#[test]
fn decoded_setters_keep_order() {
    let mut d = Decoded::new(vec![], "0200".parse().unwrap());
    d.set_text(41, "a");
    d.set_text(2, "b");
    d.set_text(11, "c");
    assert_eq!(d.set_text(11, "d"), Some(Value::text("c")));
    assert_eq!(
        d.fields.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        [2, 11, 41]
    );
    assert_eq!(d.remove(2), Some(Value::text("b")));
    assert!(!d.has(2) && d.has(41));
    d.retain(|id| id != 41);
    assert_eq!(d.fields.len(), 1);
}

proptest::proptest! {
    /// The index's fast path (the spec's crossing table, one bounds check at
    /// the end) accepts exactly what the careful walk accepts, and
    /// finds the same spans, on every builtin spec's purchase mangled at
    /// random: truncated, a byte changed, bytes inserted.
    #[test]
    fn fast_index_agrees_with_checked_walk(
        which in 0usize..7,
        cut in proptest::prelude::any::<proptest::sample::Index>(),
        at in proptest::prelude::any::<proptest::sample::Index>(),
        byte in proptest::prelude::any::<u8>(),
        how in 0u8..4,
        wanted in proptest::prelude::any::<[u64; 3]>(),
    ) {
        let name = [
            "cups", "cup-pos", "visa-base1", "iso87ascii", "iso87binary", "iso93binary", "mastercard",
        ][which];
        let spec = spec(name);
        let mut payload = samples::purchase_payload(&spec).unwrap();
        match how {
            0 => payload.truncate(cut.index(payload.len() + 1)),
            1 => { let i = at.index(payload.len()); payload[i] = byte; }
            2 => { let i = at.index(payload.len() + 1); payload.insert(i, byte); }
            _ => {}
        }
        let wanted = Bitmap(wanted);
        if let Ok(msg) = Message::parse(&spec, Bytes::from(payload)) {
            // Start from a used index: the fast walk must not read stale entries.
            let mut fast = msg.index_checked(&Bitmap([u64::MAX; 3])).unwrap_or_default();
            let ok = msg.index_fast(&wanted, &mut fast).is_some();
            let checked = msg.index_checked(&wanted).ok();
            proptest::prop_assert_eq!(ok, checked.is_some());
            if let Some(checked) = checked {
                for id in 1..=192u16 {
                    proptest::prop_assert_eq!(fast.span(id), checked.span(id));
                }
                proptest::prop_assert_eq!(fast.end(), checked.end());
            }
        }
    }
}
