//! Tests of `spec`.

use super::*;

const HEAD: &str = r#"
name = "t"
[framing]
prefix = "ascii4"
max_frame = 2000
[mti]
encoding = "ascii"
[bitmap]
encoding = "binary"
"#;

fn with_fields(fields: &str) -> Result<Spec, SpecError> {
    Spec::from_toml(&format!("{HEAD}{fields}"))
}

#[test]
fn every_builtin_loads() {
    let names: Vec<_> = Spec::builtin_names().collect();
    assert_eq!(names.len(), 7);
    for name in names {
        let text = BUILTINS.iter().find(|(n, _)| *n == name).unwrap().1;
        let spec = Spec::from_toml(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(spec.name(), name);
        assert!(Spec::builtin(name).is_some());
        assert!(matches!(Spec::builtin_checked(name), Some(Ok(_))));
        // All of fields 2..=128 are defined, with names.
        for id in 2..=128u16 {
            let def = spec.field(id).unwrap_or_else(|| panic!("{name}: F{id}"));
            assert!(!def.name.is_empty());
        }
        // Card data, account numbers, secrets and MACs, flagged in every
        // shipped spec (so `decode` never warns about one).
        for id in [2, 14, 34, 35, 36, 45, 52, 55, 64, 96, 102, 103, 128] {
            assert!(spec.field(id).unwrap().sensitive, "{name}: F{id}");
        }
        assert!(super::super::unflagged_sensitive(&spec).is_empty());
        assert_eq!(spec.field(2).unwrap().mask, Mask::Pan);
        // UnionPay POS sign-in answers carry the working keys in F62.
        if name == "cup-pos" {
            assert!(spec.field(62).unwrap().sensitive, "{name}: F62");
        }
        assert!(spec.network().echo_mti.is_some());
        assert!(!spec.network().echo_fields.is_empty());
    }
    assert!(Spec::builtin("nope").is_none());
    assert!(Spec::builtin_checked("/no/such/spec.toml").is_none());
}

#[test]
fn lookup_table_matches_fields() {
    let spec = with_fields(
        r#"
[[field]]
id = 11
name = "STAN"
format = "fixed"
length = 6
data = "ascii"
[[field]]
id = 2
name = "PAN"
format = "llvar"
length = 19
data = "bcd"
align = "left"
pad = "F"
length_encoding = "bcd"
sensitive = true
mask = "pan"
"#,
    )
    .unwrap();
    assert_eq!(spec.fields()[0].id, 2);
    let pan = spec.field(2).unwrap();
    assert_eq!((pan.pad, pan.align, pan.prefix_len), (0xF, Align::Left, 1));
    assert_eq!(pan.unit, Unit::Digits);
    assert_eq!(spec.field(11).unwrap().fixed_len(), Some(6));
    assert!(spec.field(3).is_none());
    assert!(spec.field(999).is_none());
}

fn field(id: u16, extra: &str) -> String {
    format!(
        "[[field]]\nid = {id}\nname = \"x\"\nformat = \"fixed\"\nlength = 4\ndata = \"ascii\"\n{extra}\n"
    )
}

#[test]
fn validation_errors_name_spec_and_field() {
    let e = with_fields(&format!("{}{}", field(3, ""), field(3, ""))).unwrap_err();
    assert!(matches!(e, SpecError::DuplicateField { id: 3, .. }), "{e}");
    assert_eq!(e.to_string(), "spec t: field 3: defined twice");

    for id in [0, 1, 193] {
        let e = with_fields(&field(id, "")).unwrap_err();
        assert!(matches!(e, SpecError::FieldIdOutOfRange { .. }), "{e}");
    }
    let e = with_fields(&field(130, "")).unwrap_err();
    assert!(e.to_string().contains("field 130"), "{e}");

    let e = with_fields(
        "[[field]]\nid = 2\nname = \"x\"\nformat = \"llvar\"\nlength = 100\ndata = \"ascii\"\nlength_encoding = \"ascii\"\n",
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            SpecError::BadLength {
                id: 2,
                reason: LengthReason::PrefixTooSmall { cap: 99, .. },
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "spec t: field 2: bad length: max 100 does not fit a ASCII LL length (at most 99)"
    );

    let e = with_fields(
        "[[field]]\nid = 2\nname = \"x\"\nformat = \"llvar\"\nlength = 10\ndata = \"ascii\"\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("length_encoding"), "{e}");

    let e = with_fields(&field(4, "pad = \"F\"")).unwrap_err();
    assert!(
        matches!(
            e,
            SpecError::BadField {
                id: 4,
                reason: FieldReason::AlignNotBcdDigits,
                ..
            }
        ),
        "{e}"
    );

    let e = with_fields(&field(4, "mask = \"pan\"")).unwrap_err();
    assert!(e.to_string().contains("sensitive"), "{e}");

    let e = with_fields(&field(4, "colour = 1")).unwrap_err();
    assert!(e.to_string().contains("colour"), "{e}");

    let e = with_fields(&field(4, "length_encoding = \"ascii\"")).unwrap_err();
    assert!(e.to_string().contains("variable"), "{e}");

    let e = with_fields(
        "[[field]]\nid = 52\nname = \"x\"\nformat = \"fixed\"\nlength = 12\nunit = \"bits\"\ndata = \"binary\"\n",
    )
    .unwrap_err();
    assert!(matches!(e, SpecError::BadLength { id: 52, .. }), "{e}");

    let e = with_fields("[network]\necho_mti = \"08X0\"\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"spec t: key network.echo_mti: "08X0": an MTI is four digits"#
    );
    let e = with_fields("[network]\necho_fields = [11]\n").unwrap_err();
    assert!(
        matches!(
            e,
            SpecError::BadKey {
                key: "network.echo_fields",
                reason: KeyReason::FieldUndefined(11),
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn integrity_keys_are_refused_by_key_and_reason() {
    let bad = |integrity: &str| with_fields(&format!("[integrity]\n{integrity}\n")).unwrap_err();
    let e = bad(r#"reversal_mti = "0200""#);
    assert!(
        matches!(
            e,
            SpecError::BadKey {
                key: "integrity.reversal_mti",
                reason: KeyReason::NotAReversal(_),
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "spec t: key integrity.reversal_mti: 0200 is not a reversal request or advice (04x0)"
    );
    let e = bad(r#"saf_done = ["0"]"#);
    assert_eq!(
        e.to_string(),
        r#"spec t: key integrity.saf_done: "0" is not a 2-character response code"#
    );
    let e = bad("saf_done = []");
    assert!(
        matches!(
            e,
            SpecError::BadKey {
                key: "integrity.saf_done",
                reason: KeyReason::NoDoneCode,
                ..
            }
        ),
        "{e}"
    );
    let e = bad("reversal_fields = [35]");
    assert!(
        matches!(
            e,
            SpecError::BadKey {
                reason: KeyReason::SensitiveField(35),
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn tertiary_needs_secondary_and_reserves_bit_65() {
    let text = HEAD.replace(
        "encoding = \"binary\"",
        "encoding = \"binary\"\nsecondary = false\ntertiary = true",
    );
    let e = Spec::from_toml(&text).unwrap_err();
    assert!(
        matches!(e, SpecError::TertiaryWithoutSecondary { .. }),
        "{e}"
    );

    let text = HEAD.replace(
        "encoding = \"binary\"",
        "encoding = \"binary\"\ntertiary = true",
    );
    let e = Spec::from_toml(&format!("{text}{}", field(65, ""))).unwrap_err();
    assert!(
        matches!(e, SpecError::FieldIdOutOfRange { id: 65, .. }),
        "{e}"
    );
    assert!(Spec::from_toml(&format!("{text}{}", field(150, ""))).is_ok());
}

#[test]
fn toml_errors_name_the_key() {
    let e = Spec::from_toml(&HEAD.replace("ascii4", "ascii5")).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("ascii5") && msg.contains("prefix"), "{msg}");
}

#[test]
fn mastercard_de48_is_read_as_a_category_code_and_subelements() {
    let spec = Spec::builtin("mastercard").expect("mastercard loads");
    let de48 = spec.field(48).expect("DE 48");
    let layout = de48.subelements.as_ref().expect("DE 48 has subelements");
    let parts = layout.parse(48, "R9203123").expect("parses");
    assert_eq!(parts.len(), 2);
    assert_eq!(layout.name("92"), Some("CVC 2"));
    assert!(layout.is_sensitive("92"));
    // No other field of any builtin has a layout: subelements are opt-in.
    for name in Spec::builtin_names() {
        let spec = Spec::builtin(name).expect("loads");
        let with: Vec<u16> = spec
            .fields()
            .iter()
            .filter(|d| d.subelements.is_some())
            .map(|d| d.id)
            .collect();
        let want: &[u16] = if name == "mastercard" { &[48] } else { &[] };
        assert_eq!(with, want, "{name}");
    }
}

#[test]
fn subelements_on_a_binary_field_are_refused_naming_the_field() {
    let err = with_fields(
        "[[field]]\nid = 48\nname = \"x\"\nformat = \"fixed\"\nlength = 4\ndata = \"binary\"\n\
         [field.subelements]\nlayout = \"tlv\"\ntag = 2\nlength = 2\n",
    )
    .expect_err("refused");
    assert!(err.to_string().contains("48"), "{err}");
    assert!(err.to_string().contains("subelements"), "{err}");
}
