//! Property tests over every builtin spec: random valid messages round-trip
//! byte-identically, and arbitrary or mutated bytes never make the parser panic.

use std::sync::Arc;

use bytes::Bytes;
use isoswitch::iso8583::{
    Data, Decoded, FieldDef, IsoError, Message, Mti, Spec, Unit, Value, samples,
};
use proptest::prelude::*;

/// Longest variable-length value generated, so that messages stay under max_frame.
const MAX_VAR: usize = 24;

fn specs() -> Vec<Spec> {
    Spec::builtin_names()
        .map(|n| Spec::builtin(n).expect("builtin loads"))
        .collect()
}

fn text(alphabet: &'static [u8], n: usize) -> BoxedStrategy<Value> {
    proptest::collection::vec(proptest::sample::select(alphabet), n)
        .prop_map(|v| Value::Text(v.into_iter().map(char::from).collect()))
        .boxed()
}

/// Any byte as a Latin-1 character: ASCII and EBCDIC fields must carry all 256.
fn latin1(n: usize) -> BoxedStrategy<Value> {
    proptest::collection::vec(any::<u8>(), n)
        .prop_map(|v| Value::Text(v.into_iter().map(char::from).collect()))
        .boxed()
}

/// A value that fits `def`: exact length for fixed, up to MAX_VAR units for variable.
fn value(def: &FieldDef) -> BoxedStrategy<Value> {
    const HEX: &[u8] = b"0123456789ABCDEF";
    let units: BoxedStrategy<usize> = if def.is_fixed() {
        Just(def.length).boxed()
    } else {
        (0..=def.length.min(MAX_VAR)).boxed()
    };
    match (def.data, def.unit) {
        (Data::Binary, Unit::Bits) => units
            .prop_flat_map(|n| proptest::collection::vec(any::<u8>(), n / 8))
            .prop_map(Value::Binary)
            .boxed(),
        (Data::Binary, _) => units
            .prop_flat_map(|n| proptest::collection::vec(any::<u8>(), n))
            .prop_map(Value::Binary)
            .boxed(),
        (Data::Bcd, Unit::Bytes) => units.prop_flat_map(|n| text(HEX, 2 * n)).boxed(),
        (Data::Bcd, _) => units.prop_flat_map(|n| text(HEX, n)).boxed(),
        (Data::Ascii | Data::Ebcdic, _) => units.prop_flat_map(latin1).boxed(),
    }
}

/// A random valid message for `spec`: random MTI, TPDU addresses, field set,
/// values and bitmap count.
fn message(spec: Arc<Spec>) -> impl Strategy<Value = Decoded> {
    let ids: Vec<usize> = (0..spec.fields().len()).collect();
    let fields = proptest::sample::subsequence(ids, 0..=40).prop_flat_map({
        let spec = spec.clone();
        move |picked| {
            picked
                .into_iter()
                .map(|i| {
                    let def = &spec.fields()[i];
                    let id = def.id;
                    value(def).prop_map(move |v| (id, v))
                })
                .collect::<Vec<_>>()
        }
    });
    let mti = proptest::array::uniform4(b'0'..=b'9').prop_map(|d| Mti::new(d).expect("digits"));
    (fields, mti, any::<[u8; 4]>(), 1u8..=2).prop_map(move |(fields, mti, addr, bitmaps)| {
        let mut envelope = samples::envelope(&spec);
        if spec.envelope().tpdu {
            envelope[1..5].copy_from_slice(&addr);
        }
        Decoded {
            envelope,
            mti,
            fields,
            bitmaps,
        }
    })
}

fn fail(spec: &Spec, what: &str, e: IsoError) -> TestCaseError {
    TestCaseError::fail(format!("{}: {what}: {e}", spec.name()))
}

fn roundtrip(spec: &Spec, d: &Decoded) -> Result<(), TestCaseError> {
    let payload = match spec.encode(d) {
        Ok(p) => p,
        Err(IsoError::TooLong { .. }) => return Err(TestCaseError::reject("over max_frame")),
        Err(e) => return Err(fail(spec, "encode", e)),
    };
    let back = spec.decode(&payload).map_err(|e| fail(spec, "decode", e))?;
    prop_assert_eq!(back.mti, d.mti);
    prop_assert_eq!(&back.fields, &d.fields);
    prop_assert!(back.bitmaps >= d.bitmaps);
    let again = spec.encode(&back).map_err(|e| fail(spec, "re-encode", e))?;
    prop_assert_eq!(&again, &payload);

    // The lazy view agrees with the full decode, field by field.
    let msg =
        Message::parse(spec, Bytes::from(payload.clone())).map_err(|e| fail(spec, "parse", e))?;
    prop_assert_eq!(
        msg.validate().map_err(|e| fail(spec, "validate", e))?,
        payload.len()
    );
    for (id, v) in &d.fields {
        let f = msg
            .field(*id)
            .map_err(|e| fail(spec, "field", e))?
            .ok_or_else(|| TestCaseError::fail(format!("F{id} missing")))?;
        let logical: Vec<u8> = f.logical().collect();
        let expected: Vec<u8> = match v {
            Value::Text(s) => s.chars().map(|c| c as u8).collect(),
            Value::Binary(b) => b.clone(),
        };
        prop_assert_eq!(logical, expected, "F{}", id);
    }
    let view = msg
        .routing_view()
        .map_err(|e| fail(spec, "routing view", e))?;
    for (id, r) in [
        (7, view.f7),
        (11, view.f11),
        (32, view.f32),
        (33, view.f33),
        (37, view.f37),
        (39, view.f39),
        (41, view.f41),
        (70, view.f70),
    ] {
        let direct = msg.field(id).ok().flatten().map(|f| f.range());
        prop_assert_eq!(r, direct, "F{}", id);
    }
    Ok(())
}

/// Everything a caller may do with untrusted bytes; must never panic.
fn poke(spec: &Spec, bytes: &[u8]) {
    if let Ok(msg) = Message::parse(spec, Bytes::copy_from_slice(bytes)) {
        for id in [2, 11, 35, 37, 41, 55, 64, 70, 100, 128, 192] {
            if let Ok(Some(f)) = msg.field(id) {
                let _ = f.to_string();
                let _ = format!("{f:?}");
                let _ = f.logical().count();
            }
        }
        let _ = msg.routing_view();
        let _ = msg.validate();
        if let Ok(d) = msg.decode() {
            let _ = d.show(spec).to_string();
            // Whatever decodes re-encodes, and re-decodes to the same fields.
            let p = spec.encode(&d).expect("a decoded message encodes");
            let again = spec.decode(&p).expect("an encoded message decodes");
            assert_eq!(again.fields, d.fields);
        }
    }
    let _ = spec.decode(bytes);
    let _ = spec.routing_view(bytes);
}

fn builtin(name: &str) -> Arc<Spec> {
    Arc::new(Spec::builtin(name).expect("builtin loads"))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        max_global_rejects: 4096,
        ..ProptestConfig::default()
    })]

    #[test]
    fn cups_roundtrips(d in message(builtin("cups"))) {
        roundtrip(&builtin("cups"), &d)?;
    }

    #[test]
    fn cup_pos_roundtrips(d in message(builtin("cup-pos"))) {
        roundtrip(&builtin("cup-pos"), &d)?;
    }

    #[test]
    fn visa_base1_roundtrips(d in message(builtin("visa-base1"))) {
        roundtrip(&builtin("visa-base1"), &d)?;
    }

    #[test]
    fn iso87ascii_roundtrips(d in message(builtin("iso87ascii"))) {
        roundtrip(&builtin("iso87ascii"), &d)?;
    }

    #[test]
    fn iso87binary_roundtrips(d in message(builtin("iso87binary"))) {
        roundtrip(&builtin("iso87binary"), &d)?;
    }

    #[test]
    fn iso93binary_roundtrips(d in message(builtin("iso93binary"))) {
        roundtrip(&builtin("iso93binary"), &d)?;
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..700)) {
        for spec in specs() {
            poke(&spec, &bytes);
            // Also behind a valid envelope, so the body parsers see the bytes.
            let mut framed = samples::envelope(&spec);
            framed.extend_from_slice(&bytes);
            poke(&spec, &framed);
        }
    }

    #[test]
    fn mutated_messages_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        for spec in specs() {
            let mut p = samples::purchase_payload(&spec).expect("sample encodes");
            for (at, byte) in &edits {
                let i = at.index(p.len());
                p[i] = *byte;
            }
            poke(&spec, &p);
            let n = cut.index(p.len() + 1);
            poke(&spec, &p[..n]);
        }
    }
}
