//! `decode --json`: one JSON object per message, for scripts.

use super::*;
use crate::wire::header::Scalar;

pub(super) fn json_message(
    spec: &Spec,
    payload: &[u8],
    reveal: bool,
    out: &mut impl Write,
) -> Shown {
    let layout = match spec.layout(payload) {
        Ok(l) => l,
        Err(e) => return Ok(Err(e)),
    };
    let env = &layout.envelope;
    // Build the whole line first: a message that fails half-way prints nothing.
    let mut line = String::with_capacity(payload.len() * 3 + 64);
    line.push_str("{\"mti\":");
    line.push_str(&json_string(layout.mti.as_str()));
    line.push_str(",\"tpdu\":");
    match env.tpdu {
        Some(t) => line.push_str(&json_string(&t.to_string())),
        None => line.push_str("null"),
    }
    line.push_str(",\"header\":");
    match &env.header {
        Some(h) => {
            let mut header = json_header(h);
            if let (Some(r), serde_json::Value::Object(map)) = (&env.rejected, &mut header) {
                if let Some(v) = &r.visa {
                    map.insert("reject".into(), json_visa_reject(v));
                }
                map.insert("original".into(), json_header(&r.original));
            }
            line.push_str(&header.to_string());
        }
        None => line.push_str("null"),
    }
    line.push_str(",\"fields\":{");
    let mut end = layout.fields_at;
    let mut first = true;
    for id in layout.present.iter() {
        let field = match spec.field_in(&layout, payload, id) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(e) => return Ok(Err(e)),
        };
        end = field.range().end;
        if !first {
            line.push(',');
        }
        first = false;
        line.push_str(&json_string(&id.to_string()));
        line.push(':');
        line.push_str(&json_string(&json_value(&field, reveal)));
    }
    line.push_str("}}");
    if let Err(e) = check_end(payload, end) {
        return Ok(Err(e));
    }
    writeln!(out, "{line}")?;
    Ok(Ok(()))
}

/// A field's value for JSON: masked per spec unless revealed; binary as
/// upper-case hex; text as its characters (Latin-1), unescaped.
fn json_value(field: &FieldRef<'_>, reveal: bool) -> String {
    let def = field.def();
    if crate::iso8583::is_sensitive(def) && !reveal {
        return field.show().to_string();
    }
    match def.data {
        Data::Binary => hex(field.data()),
        Data::Ascii | Data::Ebcdic | Data::Bcd => field.logical().map(char::from).collect(),
    }
}

fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// A scheme header as its own file describes it, after its `kind`.
fn json_header(h: &Header) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    map.insert("kind".into(), h.kind().name().into());
    for (key, value) in h.describe(None).keys {
        let value = match value {
            Scalar::Text(s) => s.into(),
            Scalar::Number(n) => n.into(),
            Scalar::Bool(b) => b.into(),
        };
        map.insert(key.into(), value);
    }
    serde_json::Value::Object(map)
}

fn json_visa_reject(v: &VisaReject) -> serde_json::Value {
    serde_json::json!({ "bitmap": hex(&v.bitmap), "code": hex(&v.code) })
}
