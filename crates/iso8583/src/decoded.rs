//! Full decode into ordered fields, and encode back. For tools, tests and
//! switch-made messages (declines); the routing path uses [`super::Message`].

use std::fmt;

use super::codec;
use super::error::{IsoError, ValueReason};
use super::mask::Shown;
use super::message::{Bitmap, Message};
use super::mti::Mti;
use super::spec::{BitmapEncoding, Data, FieldDef, MtiEncoding, Spec};

/// A field's content. `Debug` shows only its size: a `Value` does not know
/// whether it is sensitive. Use [`Value::show`] with its definition to display it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Value {
    /// ASCII / EBCDIC text (each byte one Latin-1 character), or BCD as hex digits
    /// without pad (`6222021234567890123`, track 2 `...D2812...`).
    Text(String),
    /// Raw bytes of a binary field.
    Binary(Vec<u8>),
}

impl Value {
    pub fn text(s: impl Into<String>) -> Value {
        Value::Text(s.into())
    }

    pub fn binary(b: impl Into<Vec<u8>>) -> Value {
        Value::Binary(b.into())
    }

    pub fn as_text(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            Value::Binary(_) => None,
        }
    }

    pub fn as_binary(&self) -> Option<&[u8]> {
        match self {
            Value::Binary(b) => Some(b),
            Value::Text(_) => None,
        }
    }

    /// A display masked per `def` (see [`Shown::reveal`]).
    pub fn show<'a>(&'a self, def: &'a FieldDef) -> Shown<'a> {
        match self {
            Value::Text(s) => Shown::text(def, s),
            Value::Binary(b) => Shown::binary(def, b),
        }
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Text(s) => write!(f, "Text([{} chars])", s.chars().count()),
            Value::Binary(b) => write!(f, "Binary([{} bytes])", b.len()),
        }
    }
}

/// A fully decoded message: the envelope kept raw (for identity and for building
/// responses), the MTI and the fields in ascending id order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// Everything before the MTI, as on the wire (TPDU, scheme header(s)).
    pub envelope: Vec<u8>,
    pub mti: Mti,
    /// Fields in strictly ascending id order (the setters keep it so).
    pub fields: Vec<(u16, Value)>,
    /// Bitmaps to write at least (1..=3): some peers send a secondary bitmap with
    /// no field above 64. Encode writes more if the fields need them.
    pub bitmaps: u8,
}

impl Decoded {
    pub fn new(envelope: Vec<u8>, mti: Mti) -> Decoded {
        Decoded {
            envelope,
            mti,
            fields: Vec::new(),
            bitmaps: 1,
        }
    }

    fn position(&self, id: u16) -> Result<usize, usize> {
        self.fields.binary_search_by_key(&id, |(i, _)| *i)
    }

    pub fn get(&self, id: u16) -> Option<&Value> {
        self.position(id).ok().map(|i| &self.fields[i].1)
    }

    pub fn has(&self, id: u16) -> bool {
        self.position(id).is_ok()
    }

    /// Sets field `id`, keeping the order; returns the old value.
    pub fn set(&mut self, id: u16, value: Value) -> Option<Value> {
        match self.position(id) {
            Ok(i) => Some(std::mem::replace(&mut self.fields[i].1, value)),
            Err(i) => {
                self.fields.insert(i, (id, value));
                None
            }
        }
    }

    /// Sets a text (ASCII / EBCDIC / BCD) field.
    pub fn set_text(&mut self, id: u16, text: impl Into<String>) -> Option<Value> {
        self.set(id, Value::Text(text.into()))
    }

    /// Sets a binary field.
    pub fn set_binary(&mut self, id: u16, bytes: impl Into<Vec<u8>>) -> Option<Value> {
        self.set(id, Value::Binary(bytes.into()))
    }

    /// Builder form of [`Decoded::set`].
    pub fn with(mut self, id: u16, value: Value) -> Decoded {
        self.set(id, value);
        self
    }

    pub fn remove(&mut self, id: u16) -> Option<Value> {
        self.position(id).ok().map(|i| self.fields.remove(i).1)
    }

    /// Keeps only the fields whose ids `keep` returns true for.
    pub fn retain(&mut self, mut keep: impl FnMut(u16) -> bool) {
        self.fields.retain(|(id, _)| keep(*id));
    }

    /// A display of the whole message, masked per `spec` (see
    /// [`ShownMessage::reveal`]).
    pub fn show<'a>(&'a self, spec: &'a Spec) -> ShownMessage<'a> {
        ShownMessage {
            decoded: self,
            spec,
            reveal: false,
        }
    }
}

/// A [`Decoded`] ready for display: one line per field, sensitive fields masked.
pub struct ShownMessage<'a> {
    decoded: &'a Decoded,
    spec: &'a Spec,
    reveal: bool,
}

impl ShownMessage<'_> {
    /// Show sensitive fields in clear (test systems only).
    pub fn reveal(self) -> Self {
        self.revealed(true)
    }

    pub fn revealed(mut self, reveal: bool) -> Self {
        self.reveal = reveal;
        self
    }
}

impl fmt::Display for ShownMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.decoded;
        write!(
            f,
            "{} {} (envelope {} bytes)",
            self.spec.name(),
            d.mti,
            d.envelope.len()
        )?;
        for (id, value) in &d.fields {
            match self.spec.field(*id) {
                Some(def) => write!(
                    f,
                    "\n  F{id:<3} {:<40} {}",
                    def.name,
                    value.show(def).revealed(self.reveal)
                )?,
                None => write!(f, "\n  F{id:<3} (not in spec) {value:?}")?,
            }
        }
        Ok(())
    }
}

impl fmt::Debug for ShownMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Message<'_> {
    /// Decodes every field.
    pub fn decode(&self) -> Result<Decoded, IsoError> {
        self.spec().decode_in(self.layout(), self.payload())
    }
}

impl Spec {
    /// Decodes a whole payload.
    pub fn decode(&self, payload: &[u8]) -> Result<Decoded, IsoError> {
        let layout = self.layout(payload)?;
        self.decode_in(&layout, payload)
    }

    fn decode_in(
        &self,
        layout: &super::message::Layout,
        payload: &[u8],
    ) -> Result<Decoded, IsoError> {
        let mut fields = Vec::with_capacity(layout.present.iter().count());
        let mut end = layout.fields_at;
        self.walk(layout, payload, |def, span| {
            fields.push((def.id, field_value(def, payload, span)));
            end = span.end;
            true
        })?;
        if end != payload.len() {
            return Err(IsoError::TrailingBytes {
                offset: end,
                len: payload.len() - end,
            });
        }
        Ok(Decoded {
            envelope: payload.get(..layout.mti_at).unwrap_or_default().to_vec(),
            mti: layout.mti,
            fields,
            bitmaps: layout.bitmaps,
        })
    }

    /// Decodes what can be read of a payload that may be broken: the envelope,
    /// MTI and bitmaps must parse; fields are read in order until the first one
    /// that cannot be, and the rest (and any trailing bytes) are left out. For
    /// answering a malformed request with what it did carry.
    pub fn decode_readable(&self, payload: &[u8]) -> Result<Decoded, IsoError> {
        let layout = self.layout(payload)?;
        let mut fields = Vec::with_capacity(layout.present.iter().count());
        // The walk stops at the first field it cannot read; what came before stands.
        let _ = self.walk(&layout, payload, |def, span| {
            fields.push((def.id, field_value(def, payload, span)));
            true
        });
        Ok(Decoded {
            envelope: payload.get(..layout.mti_at).unwrap_or_default().to_vec(),
            mti: layout.mti,
            fields,
            bitmaps: layout.bitmaps,
        })
    }

    /// Builds a payload (envelope + MTI + bitmaps + fields). The bitmaps follow
    /// from the fields present (and [`Decoded::bitmaps`]); a CUPS or VISA header's
    /// total length is rewritten to fit. Decoding a payload and encoding it again
    /// gives the same bytes, for every payload in canonical form (upper-case hex
    /// bitmap, the spec's BCD pad nibble, header lengths that match).
    pub fn encode(&self, d: &Decoded) -> Result<Vec<u8>, IsoError> {
        let mut out = Vec::with_capacity(d.envelope.len() + 64 + 16 * d.fields.len());
        self.encode_into(d, &mut out)?;
        Ok(out)
    }

    /// [`Spec::encode`] appending to `out` (which should be empty: the payload
    /// starts at `out[0]`).
    pub fn encode_into(&self, d: &Decoded, out: &mut Vec<u8>) -> Result<(), IsoError> {
        let base = out.len();
        let envelope = self.envelope().parse(&d.envelope)?;
        if envelope.body_offset != d.envelope.len() {
            return Err(IsoError::TrailingBytes {
                offset: envelope.body_offset,
                len: d.envelope.len() - envelope.body_offset,
            });
        }
        out.extend_from_slice(&d.envelope);

        let digits = d.mti.digits();
        match self.mti_encoding() {
            MtiEncoding::Ascii => out.extend_from_slice(&digits),
            MtiEncoding::Ebcdic => out.extend(digits.iter().map(|b| b - b'0' + 0xF0)),
            MtiEncoding::Bcd => out.extend_from_slice(&[
                ((digits[0] - b'0') << 4) | (digits[1] - b'0'),
                ((digits[2] - b'0') << 4) | (digits[3] - b'0'),
            ]),
        }

        // Bitmaps from the fields present.
        let bm = self.bitmap();
        let mut bitmap = Bitmap::default();
        let mut prev = 0u16;
        for (id, _) in &d.fields {
            if *id <= prev {
                return Err(IsoError::FieldOrder { id: *id });
            }
            prev = *id;
            if self.field(*id).is_none() {
                return Err(IsoError::NoSuchField { id: *id });
            }
            bitmap.set(*id);
        }
        let mut count = 1;
        if bm.secondary && (bitmap.0[1] != 0 || d.bitmaps >= 2) {
            count = 2;
        }
        if bm.tertiary && (bitmap.0[2] != 0 || d.bitmaps >= 3) {
            count = 3;
        }
        if count >= 2 {
            bitmap.set(1);
        }
        if count == 3 {
            bitmap.set(65);
        }
        for word in &bitmap.0[..count] {
            match bm.encoding {
                BitmapEncoding::Binary => out.extend_from_slice(&word.to_be_bytes()),
                BitmapEncoding::Hex => out.extend(
                    (0..16)
                        .rev()
                        .map(|i| codec::hex_digit((word >> (4 * i)) as u8)),
                ),
            }
        }

        let mut scratch = Vec::new();
        for (id, value) in &d.fields {
            let def = self.field(*id).ok_or(IsoError::NoSuchField { id: *id })?;
            let logical: &[u8] = match (def.data, value) {
                (Data::Binary, Value::Binary(b)) => b,
                (Data::Binary, Value::Text(_)) => {
                    return Err(IsoError::BadValue {
                        id: *id,
                        reason: ValueReason::TextForBinary,
                    });
                }
                (_, Value::Binary(_)) => {
                    return Err(IsoError::BadValue {
                        id: *id,
                        reason: ValueReason::BinaryForText,
                    });
                }
                (_, Value::Text(s)) => {
                    scratch.clear();
                    for c in s.chars() {
                        let b = u8::try_from(u32::from(c)).map_err(|_| IsoError::BadValue {
                            id: *id,
                            reason: ValueReason::NotLatin1,
                        })?;
                        scratch.push(b);
                    }
                    &scratch
                }
            };
            let units = codec::units_of(def, logical.len())?;
            codec::check_units(def, units)?;
            let wire = def.wire_len(units).ok_or(IsoError::PartialByte {
                id: *id,
                offset: out.len() - base,
                len: units,
            })?;
            let at = out.len();
            out.resize(at + def.prefix_len + wire, 0);
            codec::write_prefix(def, units, &mut out[at..at + def.prefix_len]);
            codec::pack(def, logical, units, &mut out[at + def.prefix_len..])?;
        }

        let len = out.len() - base;
        let max = self.framing().max_frame;
        if len > max {
            return Err(IsoError::TooLong { len, max });
        }
        if envelope.rejected.is_none() {
            let h = base + self.envelope().header_offset();
            let total = out.len() - h;
            if let Some(header) = out.get_mut(h..) {
                self.envelope()
                    .header
                    .set_total_length_in(header, total)
                    .map_err(|e| IsoError::TooLong { len, max: e.max })?;
            }
        }
        Ok(())
    }

    /// A switch-made response to `request`: the response MTI, the envelope turned
    /// around (TPDU and header IDs swapped), the spec's `echo_fields` copied, and
    /// F39 set to `response_code` (e.g. a decline when a node is lost).
    pub fn respond(&self, request: &Decoded, response_code: &str) -> Result<Decoded, IsoError> {
        let mti = request
            .mti
            .response()
            .ok_or(IsoError::NotARequest { mti: request.mti })?;
        let mut envelope = request.envelope.clone();
        self.swap_envelope(&mut envelope);
        let mut out = Decoded::new(envelope, mti);
        for &id in &self.network().echo_fields {
            if let Some(v) = request.get(id) {
                out.set(id, v.clone());
            }
        }
        if self.field(39).is_none() {
            return Err(IsoError::NoSuchField { id: 39 });
        }
        out.set_text(39, response_code);
        Ok(out)
    }
}

/// The value of one field found in `payload`.
fn field_value(def: &FieldDef, payload: &[u8], span: codec::Span) -> Value {
    let data = payload.get(span.data..span.end).unwrap_or_default();
    match def.data {
        Data::Binary => Value::Binary(data.to_vec()),
        _ => Value::Text(
            codec::logical(def, data, span.units)
                .map(char::from)
                .collect(),
        ),
    }
}
