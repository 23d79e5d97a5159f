//! Typical messages per spec, for tests, benches and the CLI demo. Not part of
//! the stable API.

use super::{Decoded, IsoError, Mti, Spec, Value};
use isoswitch_wire::{HeaderKind, Tpdu};

/// Fields of a UnionPay inter-institution purchase (also used for VISA and the
/// generic dialects).
pub const CUPS_0200_FIELDS: [u16; 24] = [
    2, 3, 4, 7, 11, 12, 13, 14, 18, 22, 25, 32, 33, 35, 37, 41, 42, 43, 49, 52, 53, 60, 100, 128,
];

/// Fields of a UnionPay POS purchase (`specs/cup-pos.toml`).
pub const POS_0200_FIELDS: [u16; 19] = [
    2, 3, 4, 11, 14, 22, 23, 25, 26, 35, 36, 41, 42, 49, 52, 53, 55, 60, 64,
];

/// A realistic value for field `id` (text for text and BCD fields, bytes for binary).
pub fn value(id: u16) -> Option<Value> {
    let text = |s: &str| Some(Value::text(s));
    match id {
        2 => text("6222021234567890123"),
        3 => text("000000"),
        4 => text("000000010000"),
        7 => text("1202145246"),
        11 => text("123456"),
        12 => text("145246"),
        13 => text("1202"),
        14 => text("2812"),
        18 => text("5411"),
        22 => text("051"),
        23 => text("001"),
        25 => text("00"),
        26 => text("12"),
        32 => text("03105840"),
        33 => text("00010000"),
        35 => text("6222021234567890123D2812101123456789"),
        36 => text("996222021234567890123D156156000000000000000000000000000000D000000000000D"),
        37 => text("123456789012"),
        39 => text("00"),
        41 => text("12345678"),
        42 => text("123456789012345"),
        43 => text("ACME COFFEE SHOP         SHANGHAI    CHN"),
        49 => text("156"),
        52 => Some(Value::binary(*b"\x12\x34\x56\x78\x9A\xBC\xDE\xF0")),
        53 => text("2600000000000000"),
        55 => Some(Value::binary(
            b"\x9F\x26\x08\x01\x02\x03\x04\x05\x06\x07\x08\x9F\x27\x01\x80\x9F\x10\x07\x06\x01\x0A\x03\xA0\x00\x00\x9F\x37\x04\x11\x22\x33\x44"
                .to_vec(),
        )),
        60 => text("22000001000500"),
        64 | 128 => Some(Value::binary(*b"\xA1\xB2\xC3\xD4\xE5\xF6\x07\x18")),
        70 => text("301"),
        100 => text("00010000"),
        _ => None,
    }
}

/// The envelope a request of this spec typically carries (lengths are fixed up
/// by [`Spec::encode`]).
pub fn envelope(spec: &Spec) -> Vec<u8> {
    let env = spec.envelope();
    let mut out = Vec::new();
    if env.tpdu {
        out.extend_from_slice(&Tpdu::from_bytes([Tpdu::ID, 0x00, 0x03, 0x00, 0x00]).to_bytes());
    }
    if let Some(header) = env.header.sample() {
        out.extend_from_slice(header.as_bytes());
    }
    out
}

/// A typical 0200 purchase for `spec`: the POS field set for a POS envelope,
/// the CUPS one otherwise; fields the spec does not define are left out.
pub fn purchase(spec: &Spec) -> Decoded {
    let ids: &[u16] = if spec.envelope().header == HeaderKind::Pos {
        &POS_0200_FIELDS
    } else {
        &CUPS_0200_FIELDS
    };
    let mti = Mti::new(*b"0200").unwrap_or_else(|| unreachable!());
    let mut d = Decoded::new(envelope(spec), mti);
    for &id in ids {
        if let (Some(def), Some(v)) = (spec.field(id), value(id)) {
            d.set(id, fitted(def, v));
        }
    }
    d
}

/// `v` adapted to a dialect's field where it differs from the common one:
/// VISA's F22 is n4 (POS entry mode + PIN capability) and its F60 binary;
/// Mastercard's institution codes (F32, F33) are at most 6 digits.
fn fitted(def: &super::FieldDef, v: Value) -> Value {
    match (&v, def.data) {
        (Value::Text(t), super::Data::Binary) => {
            let bytes: Vec<u8> = t
                .as_bytes()
                .chunks(2)
                .map(|pair| pair.iter().fold(0u8, |acc, &c| (acc << 4) | (c & 0x0F)))
                .take(def.length)
                .collect();
            Value::binary(bytes)
        }
        (Value::Text(t), _) if def.is_fixed() && t.len() < def.length => {
            Value::text(format!("{t:0<width$}", width = def.length))
        }
        (Value::Text(t), _) if !def.is_fixed() && t.chars().count() > def.length => {
            Value::text(t.chars().take(def.length).collect::<String>())
        }
        _ => v,
    }
}

/// [`purchase`], encoded.
pub fn purchase_payload(spec: &Spec) -> Result<Vec<u8>, IsoError> {
    spec.encode(&purchase(spec))
}

/// An echo test (network management) for `spec`, per its `[network]` table.
pub fn echo(spec: &Spec) -> Decoded {
    let net = spec.network();
    let mti = net
        .echo_mti
        .unwrap_or_else(|| Mti::new(*b"0800").unwrap_or_else(|| unreachable!()));
    let mut d = Decoded::new(envelope(spec), mti);
    for id in [7, 11, 33] {
        if let (Some(def), Some(v)) = (spec.field(id), value(id)) {
            d.set(id, fitted(def, v));
        }
    }
    if let Some(f70) = &net.echo_f70 {
        d.set_text(70, f70.clone());
    }
    d
}

/// The builtin CUPS spec and a CUPS 0200 payload.
pub fn cups_0200() -> (Spec, Vec<u8>) {
    builtin_purchase("cups")
}

/// The builtin UnionPay POS spec and a POS 0200 payload.
pub fn pos_0200() -> (Spec, Vec<u8>) {
    builtin_purchase("cup-pos")
}

fn builtin_purchase(name: &str) -> (Spec, Vec<u8>) {
    let spec = Spec::builtin(name).unwrap_or_else(|| panic!("builtin spec {name} loads"));
    let payload = purchase_payload(&spec).unwrap_or_else(|e| panic!("sample {name}: {e}"));
    (spec, payload)
}
