//! The zero-copy message view: envelope, MTI and bitmaps found eagerly, field
//! offsets found lazily by reading length prefixes only. Nothing here allocates
//! on success.

use std::fmt;
use std::ops::Range;

use bytes::Bytes;

use super::codec::{self, Span, ebcdic};
use super::error::{IsoError, ValueReason};
use super::mask::Shown;
use super::mti::Mti;
use super::spec::{
    BitmapEncoding, Data, FieldDef, MAX_FIELD, MtiEncoding, NOT_A_DIGIT, PREFIX_VALUE, Spec,
};
use isoswitch_wire::{Envelope, Tpdu};

mod index;
pub use index::FieldIndex;

/// Up to three bitmaps as 64-bit words (bit 63 of word 0 is field 1).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bitmap(pub [u64; 3]);

impl Bitmap {
    /// Whether bit `id` (1..=192) is set.
    #[inline]
    pub fn bit(&self, id: u16) -> bool {
        if !(1..=192).contains(&id) {
            return false;
        }
        let i = (id - 1) as usize;
        self.0[i / 64] & (1u64 << (63 - i % 64)) != 0
    }

    #[inline]
    pub fn set(&mut self, id: u16) {
        if (1..=192).contains(&id) {
            let i = (id - 1) as usize;
            self.0[i / 64] |= 1u64 << (63 - i % 64);
        }
    }

    #[inline]
    pub fn clear(&mut self, id: u16) {
        if (1..=192).contains(&id) {
            let i = (id - 1) as usize;
            self.0[i / 64] &= !(1u64 << (63 - i % 64));
        }
    }

    /// The set bits, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        (0..3usize).flat_map(move |w| {
            let mut bits = self.0[w];
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let lz = bits.leading_zeros();
                bits &= !(1u64 << (63 - lz));
                Some((w * 64 + lz as usize + 1) as u16)
            })
        })
    }
}

impl fmt::Debug for Bitmap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// Where the parts of a payload are: everything found before the fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub envelope: Envelope,
    pub mti: Mti,
    /// Offset of the MTI (= `envelope.body_offset`).
    pub mti_at: usize,
    /// Offset of the primary bitmap.
    pub bitmap_at: usize,
    /// Bitmaps on the wire (1..=3).
    pub bitmaps: u8,
    /// The bitmaps as read, bitmap-announcing bits included.
    pub bitmap: Bitmap,
    /// The data fields present: `bitmap` without bit 1 (and bit 65 when it
    /// announces a tertiary bitmap).
    pub present: Bitmap,
    /// Offset of the first field.
    pub fields_at: usize,
}

/// The ranges of the fields routing needs (data only, without length prefixes),
/// found in one pass. Holds no field data, so it is safe to log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutingView {
    pub mti: Option<Mti>,
    pub tpdu: Option<Tpdu>,
    pub f7: Option<Range<usize>>,
    pub f11: Option<Range<usize>>,
    pub f32: Option<Range<usize>>,
    pub f33: Option<Range<usize>>,
    pub f37: Option<Range<usize>>,
    pub f39: Option<Range<usize>>,
    pub f41: Option<Range<usize>>,
    pub f70: Option<Range<usize>>,
}

const fn routing_mask() -> Bitmap {
    let ids = [7u16, 11, 32, 33, 37, 39, 41, 70];
    let mut words = [0u64; 3];
    let mut k = 0;
    while k < ids.len() {
        let i = (ids[k] - 1) as usize;
        words[i / 64] |= 1u64 << (63 - i % 64);
        k += 1;
    }
    Bitmap(words)
}
const ROUTING: Bitmap = routing_mask();

/// One field found in a payload: its definition, raw data bytes (without length
/// prefix) and their place. `Display` and `Debug` mask sensitive fields.
#[derive(Clone)]
pub struct FieldRef<'a> {
    def: &'a FieldDef,
    data: &'a [u8],
    range: Range<usize>,
    prefix_at: usize,
    units: usize,
}

impl<'a> FieldRef<'a> {
    pub fn id(&self) -> u16 {
        self.def.id
    }

    pub fn def(&self) -> &'a FieldDef {
        self.def
    }

    /// The raw data bytes, as on the wire, without the length prefix.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Where [`FieldRef::data`] lies in the payload.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// Offset of the field's length prefix (= `range().start` for fixed fields).
    pub fn prefix_at(&self) -> usize {
        self.prefix_at
    }

    /// Length in the field's units (digits, bytes or bits).
    pub fn units(&self) -> usize {
        self.units
    }

    /// The logical bytes (Latin-1 text, BCD hex digits without pad, raw binary),
    /// one at a time, without allocating.
    pub fn logical(&self) -> impl ExactSizeIterator<Item = u8> + Clone + 'a {
        codec::logical(self.def, self.data, self.units)
    }

    /// Whether the logical value equals `expected` (e.g. F70 == b"301"), without
    /// allocating.
    pub fn eq_logical(&self, expected: &[u8]) -> bool {
        let it = self.logical();
        it.len() == expected.len() && it.zip(expected).all(|(a, &b)| a == b)
    }

    /// A masked display (see [`Shown::reveal`]).
    pub fn show(&self) -> Shown<'a> {
        Shown::raw(self.def, self.data, self.units)
    }
}

impl fmt::Display for FieldRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.show().fmt(f)
    }
}

impl fmt::Debug for FieldRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FieldRef")
            .field("id", &self.def.id)
            .field("range", &self.range)
            .field("value", &format_args!("{}", self.show()))
            .finish()
    }
}

impl Spec {
    /// Field `id` of `payload`, read where it starts (`at`, as
    /// [`FieldIndex::starts`] recorded it): its length prefix is read again,
    /// the fields before it are not walked. `None` when the spec does not
    /// define `id` or the bytes at `at` cannot hold it (checked: any `at` is
    /// safe, though only a recorded one gives the field).
    pub fn field_at<'a>(&'a self, payload: &'a [u8], id: u16, at: usize) -> Option<FieldRef<'a>> {
        let def = self.field(id)?;
        let span = codec::span(def, payload, at).ok()?;
        Some(field_ref(def, payload, span))
    }

    /// Finds the envelope, MTI and bitmaps of a payload.
    pub fn layout(&self, payload: &[u8]) -> Result<Layout, IsoError> {
        let max = self.framing().max_frame;
        if payload.len() > max {
            return Err(IsoError::TooLong {
                len: payload.len(),
                max,
            });
        }
        let envelope = self.envelope().parse(payload)?;
        let mti_at = envelope.body_offset;
        let mti = read_mti(self.mti_encoding(), payload, mti_at)?;
        let bitmap_at = mti_at + self.mti_len();
        let bm = self.bitmap();
        let width = bm.width();
        let mut bitmap = Bitmap::default();
        bitmap.0[0] = read_bitmap(bm.encoding, payload, bitmap_at)?;
        let mut bitmaps = 1u8;
        let mut present = bitmap;
        present.clear(1);
        if bitmap.bit(1) {
            if !bm.secondary {
                return Err(IsoError::UndefinedField {
                    id: 1,
                    offset: bitmap_at,
                });
            }
            bitmap.0[1] = read_bitmap(bm.encoding, payload, bitmap_at + width)?;
            present.0[1] = bitmap.0[1];
            bitmaps = 2;
            if bm.tertiary {
                present.clear(65);
                if bitmap.bit(65) {
                    bitmap.0[2] = read_bitmap(bm.encoding, payload, bitmap_at + 2 * width)?;
                    present.0[2] = bitmap.0[2];
                    bitmaps = 3;
                }
            }
        }
        Ok(Layout {
            envelope,
            mti,
            mti_at,
            bitmap_at,
            bitmaps,
            bitmap,
            present,
            fields_at: bitmap_at + bitmaps as usize * width,
        })
    }

    /// Visits the present fields in order, reading only length prefixes, until
    /// `visit` returns false.
    #[inline]
    #[doc(hidden)]
    pub fn walk<'a>(
        &'a self,
        layout: &Layout,
        payload: &[u8],
        mut visit: impl FnMut(&'a FieldDef, Span) -> bool,
    ) -> Result<(), IsoError> {
        let mut at = layout.fields_at;
        for w in 0..3 {
            let mut bits = layout.present.0[w];
            while bits != 0 {
                let lz = bits.leading_zeros();
                bits &= !(1u64 << (63 - lz));
                let id = (w as u32 * 64 + lz + 1) as u16;
                let def = self
                    .field(id)
                    .ok_or(IsoError::UndefinedField { id, offset: at })?;
                let span = codec::span(def, payload, at)?;
                at = span.end;
                if !visit(def, span) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Finds field `id` in a payload whose layout is known.
    pub fn field_in<'a>(
        &'a self,
        layout: &Layout,
        payload: &'a [u8],
        id: u16,
    ) -> Result<Option<FieldRef<'a>>, IsoError> {
        if !layout.present.bit(id) {
            return Ok(None);
        }
        let mut found = None;
        self.walk(layout, payload, |def, span| {
            if def.id == id {
                found = Some((def, span));
                false
            } else {
                true
            }
        })?;
        Ok(found.map(|(def, span)| field_ref(def, payload, span)))
    }

    /// The routing view of a payload whose layout is known: one pass over the
    /// fields, stopping after the last routing field present.
    pub fn routing_view_in(
        &self,
        layout: &Layout,
        payload: &[u8],
    ) -> Result<RoutingView, IsoError> {
        let mut view = RoutingView {
            mti: Some(layout.mti),
            tpdu: layout.envelope.tpdu,
            ..RoutingView::default()
        };
        let wanted = Bitmap([
            layout.present.0[0] & ROUTING.0[0],
            layout.present.0[1] & ROUTING.0[1],
            0,
        ]);
        let last = if wanted.0[1] != 0 {
            64 + 64 - wanted.0[1].trailing_zeros() as u16
        } else if wanted.0[0] != 0 {
            64 - wanted.0[0].trailing_zeros() as u16
        } else {
            return Ok(view);
        };
        self.walk(layout, payload, |def, span| {
            let r = Some(span.data..span.end);
            match def.id {
                7 => view.f7 = r,
                11 => view.f11 = r,
                32 => view.f32 = r,
                33 => view.f33 = r,
                37 => view.f37 = r,
                39 => view.f39 = r,
                41 => view.f41 = r,
                70 => view.f70 = r,
                _ => {}
            }
            def.id < last
        })?;
        Ok(view)
    }

    /// The routing view of a payload (for buffers that are not `Bytes`, e.g. a
    /// `BytesMut` about to be patched).
    pub fn routing_view(&self, payload: &[u8]) -> Result<RoutingView, IsoError> {
        let layout = self.layout(payload)?;
        self.routing_view_in(&layout, payload)
    }

    /// Writes `ascii` into F37 at `offset` (the node stamp), encoded as F37 is
    /// (ASCII, or EBCDIC for VISA). `f37` is the range from a [`RoutingView`].
    pub fn stamp_f37(
        &self,
        buf: &mut [u8],
        f37: Range<usize>,
        offset: usize,
        ascii: &[u8],
    ) -> Result<(), IsoError> {
        let def = self.field(37).ok_or(IsoError::NoSuchField { id: 37 })?;
        match def.data {
            Data::Ascii => stamp(buf, f37, offset, ascii),
            Data::Ebcdic => {
                let dst = stamp_place(buf, f37, offset, ascii.len())?;
                for (d, &s) in dst.iter_mut().zip(ascii) {
                    *d = ebcdic::from_ascii(s);
                }
                Ok(())
            }
            Data::Bcd | Data::Binary => Err(IsoError::BadValue {
                id: 37,
                reason: ValueReason::StampNotText,
            }),
        }
    }

    /// Reads back `len` stamp bytes at `offset` of F37 as ASCII into `out`
    /// (translating EBCDIC); returns the filled part of `out`.
    pub fn read_f37_stamp<'o>(
        &self,
        payload: &[u8],
        f37: Range<usize>,
        offset: usize,
        out: &'o mut [u8],
    ) -> Option<&'o [u8]> {
        let def = self.field(37)?;
        let start = f37.start.checked_add(offset)?;
        let end = start.checked_add(out.len())?;
        if end > f37.end {
            return None;
        }
        let src = payload.get(start..end)?;
        for (o, &s) in out.iter_mut().zip(src) {
            *o = match def.data {
                Data::Ebcdic => ebcdic::to_ascii(s),
                _ => s,
            };
        }
        Some(out)
    }

    /// Turns the envelope of a request in `buf` into the envelope of its response,
    /// in place: TPDU destination/source swapped, the scheme header's IDs swapped
    /// (CUPS, VISA; a POS header has none).
    pub fn swap_envelope(&self, buf: &mut [u8]) {
        let env = self.envelope();
        if env.tpdu {
            Tpdu::swap_in_place(buf);
        }
        let at = env.header_offset();
        if let Some(rest) = buf.get_mut(at..) {
            env.header.swap_ids_in(rest);
        }
    }

    /// Swaps the TPDU addresses in place, if this dialect has a TPDU. Returns
    /// whether it did.
    pub fn swap_tpdu(&self, buf: &mut [u8]) -> bool {
        if self.envelope().tpdu && buf.len() >= Tpdu::LEN {
            Tpdu::swap_in_place(buf);
            true
        } else {
            false
        }
    }
}

fn field_ref<'a>(def: &'a FieldDef, payload: &'a [u8], span: Span) -> FieldRef<'a> {
    FieldRef {
        def,
        // `span` was checked against `payload` by `codec::span`.
        data: payload.get(span.data..span.end).unwrap_or_default(),
        range: span.data..span.end,
        prefix_at: span.start,
        units: span.units,
    }
}

fn read_mti(enc: MtiEncoding, payload: &[u8], at: usize) -> Result<Mti, IsoError> {
    let n = if enc == MtiEncoding::Bcd { 2 } else { 4 };
    let raw = payload
        .get(at..)
        .and_then(|b| b.get(..n))
        .ok_or(IsoError::Truncated {
            what: "MTI",
            offset: at,
            need: n,
            have: payload.len().saturating_sub(at),
        })?;
    let mut digits = [0u8; 4];
    let bad = |i: usize, byte: u8, encoding| IsoError::BadMti {
        offset: at + i,
        byte,
        encoding,
    };
    match enc {
        MtiEncoding::Ascii => {
            for (i, (d, &b)) in digits.iter_mut().zip(raw).enumerate() {
                if !b.is_ascii_digit() {
                    return Err(bad(i, b, "ASCII"));
                }
                *d = b;
            }
        }
        MtiEncoding::Ebcdic => {
            for (i, (d, &b)) in digits.iter_mut().zip(raw).enumerate() {
                if !(0xF0..=0xF9).contains(&b) {
                    return Err(bad(i, b, "EBCDIC"));
                }
                *d = b - 0xF0 + b'0';
            }
        }
        MtiEncoding::Bcd => {
            for (i, &b) in raw.iter().enumerate() {
                let (hi, lo) = (b >> 4, b & 0xF);
                if hi > 9 || lo > 9 {
                    return Err(bad(i, b, "BCD"));
                }
                digits[2 * i] = b'0' + hi;
                digits[2 * i + 1] = b'0' + lo;
            }
        }
    }
    // Every byte was checked to be a digit.
    Mti::new(digits).ok_or(IsoError::BadMti {
        offset: at,
        byte: raw[0],
        encoding: "decimal",
    })
}

fn read_bitmap(enc: BitmapEncoding, payload: &[u8], at: usize) -> Result<u64, IsoError> {
    let width = if enc == BitmapEncoding::Hex { 16 } else { 8 };
    let raw = payload
        .get(at..)
        .and_then(|b| b.get(..width))
        .ok_or(IsoError::Truncated {
            what: "bitmap",
            offset: at,
            need: width,
            have: payload.len().saturating_sub(at),
        })?;
    let mut word = 0u64;
    match enc {
        BitmapEncoding::Binary => {
            // `raw` is 8 bytes here: one load, not eight shifts.
            if let Ok(bytes) = <[u8; 8]>::try_from(raw) {
                word = u64::from_be_bytes(bytes);
            }
        }
        BitmapEncoding::Hex => {
            for (i, &b) in raw.iter().enumerate() {
                let v = codec::hex_value(b).ok_or(IsoError::BadBitmap {
                    offset: at + i,
                    byte: b,
                })?;
                word = (word << 4) | v as u64;
            }
        }
    }
    Ok(word)
}

/// Patches a fixed-width field in place. `value` is the logical value (ASCII /
/// Latin-1 text, BCD digits as ASCII hex digits, or raw binary bytes); it is
/// checked against the field's width and encoding and written in that encoding.
pub fn patch_fixed(
    buf: &mut [u8],
    def: &FieldDef,
    range: Range<usize>,
    value: &[u8],
) -> Result<(), IsoError> {
    if !def.is_fixed() {
        return Err(IsoError::NotFixed { id: def.id });
    }
    let bad_range = IsoError::BadRange {
        id: def.id,
        start: range.start,
        end: range.end,
        len: buf.len(),
    };
    if range.len() != def.fixed_len || range.start > range.end {
        return Err(bad_range);
    }
    let units = codec::units_of(def, value.len())?;
    codec::check_units(def, units)?;
    let dst = buf.get_mut(range).ok_or(bad_range)?;
    codec::pack(def, value, units, dst)
}

/// Writes raw `bytes` at `offset` inside F37's data range `f37` (the node stamp).
/// See [`Spec::stamp_f37`] for a version that encodes per the spec.
#[inline]
pub fn stamp(
    buf: &mut [u8],
    f37: Range<usize>,
    offset: usize,
    bytes: &[u8],
) -> Result<(), IsoError> {
    stamp_place(buf, f37, offset, bytes.len())?.copy_from_slice(bytes);
    Ok(())
}

#[inline]
fn stamp_place(
    buf: &mut [u8],
    f37: Range<usize>,
    offset: usize,
    len: usize,
) -> Result<&mut [u8], IsoError> {
    let buf_len = buf.len();
    let start = f37.start.saturating_add(offset);
    let end = start.saturating_add(len);
    if f37.start > f37.end || end > f37.end {
        return Err(IsoError::BadRange {
            id: 37,
            start,
            end,
            len: f37.end.saturating_sub(f37.start),
        });
    }
    buf.get_mut(start..end).ok_or(IsoError::BadRange {
        id: 37,
        start: f37.start,
        end: f37.end,
        len: buf_len,
    })
}

/// A message: a payload (`Bytes`, shared, never copied) and where its parts are.
/// Parsing finds the envelope, MTI and bitmaps; fields are found on demand.
#[derive(Clone)]
pub struct Message<'s> {
    spec: &'s Spec,
    payload: Bytes,
    layout: Layout,
}

impl<'s> Message<'s> {
    /// Parses the envelope, MTI and bitmaps of `payload` (a frame without its
    /// length prefix). Allocates nothing.
    #[inline]
    pub fn parse(spec: &'s Spec, payload: Bytes) -> Result<Message<'s>, IsoError> {
        let layout = spec.layout(&payload)?;
        Ok(Message {
            spec,
            payload,
            layout,
        })
    }

    pub fn spec(&self) -> &'s Spec {
        self.spec
    }

    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    pub fn into_payload(self) -> Bytes {
        self.payload
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn envelope(&self) -> &Envelope {
        &self.layout.envelope
    }

    pub fn tpdu(&self) -> Option<Tpdu> {
        self.layout.envelope.tpdu
    }

    pub fn mti(&self) -> Mti {
        self.layout.mti
    }

    /// The data fields present (bitmap-announcing bits excluded).
    pub fn present(&self) -> Bitmap {
        self.layout.present
    }

    #[inline]
    pub fn has_field(&self, id: u16) -> bool {
        self.layout.present.bit(id)
    }

    /// Field `id`, found by reading the length prefixes of the fields before it.
    pub fn field(&self, id: u16) -> Result<Option<FieldRef<'_>>, IsoError> {
        self.spec.field_in(&self.layout, &self.payload, id)
    }

    /// MTI, TPDU and the ranges of F7, F11, F32, F33, F37, F39, F41, F70 in one pass.
    pub fn routing_view(&self) -> Result<RoutingView, IsoError> {
        self.spec.routing_view_in(&self.layout, &self.payload)
    }

    /// Checks every field's length (one pass) and returns the end of the last one,
    /// which should be the payload's length.
    pub fn validate(&self) -> Result<usize, IsoError> {
        let mut end = self.layout.fields_at;
        self.spec.walk(&self.layout, &self.payload, |_, span| {
            end = span.end;
            true
        })?;
        Ok(end)
    }
}

impl fmt::Debug for Message<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("spec", &self.spec.name())
            .field("mti", &self.layout.mti)
            .field("tpdu", &self.layout.envelope.tpdu)
            .field("fields", &self.layout.present)
            .field("len", &self.payload.len())
            .finish()
    }
}
