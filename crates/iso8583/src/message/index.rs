//! A message's field index: where each field a service reads lies, found
//! in the pass that checks the whole message.

use super::*;

/// The fields a service reads from every message, found in the same pass that
/// checks the whole message ([`Message::index`]). A fixed-size table on the
/// stack: no allocation per message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldIndex {
    /// The ids recorded, and the span of each (`Span::end == 0` = absent).
    ids: [u16; FieldIndex::CAPACITY],
    spans: [(u32, u32, u32, u32); FieldIndex::CAPACITY],
    n: u8,
    /// `slot[id]`: the entry of field `id` plus one (0: not recorded), so
    /// that a lookup is one load instead of a search.
    slot: [u8; MAX_FIELD as usize + 1],
    /// Where the last field ends (= the payload's length for a whole message).
    end: usize,
}

impl Default for FieldIndex {
    fn default() -> FieldIndex {
        FieldIndex {
            ids: [0; FieldIndex::CAPACITY],
            spans: [(0, 0, 0, 0); FieldIndex::CAPACITY],
            n: 0,
            slot: [0; MAX_FIELD as usize + 1],
            end: 0,
        }
    }
}

impl FieldIndex {
    /// Most fields one service can ask to have indexed.
    pub const CAPACITY: usize = 24;

    fn record(&mut self, id: u16, span: Span) {
        // Every offset is within a payload whose length fits a u32 (checked
        // by the walk).
        let span = (
            span.start as u32,
            span.data as u32,
            span.end as u32,
            span.units as u32,
        );
        self.record_at(id, span);
    }

    /// Records field `id` at `(start, data, end, units)`. Fields come in
    /// message order; past [`FieldIndex::CAPACITY`] they are left out.
    #[inline]
    fn record_at(&mut self, id: u16, span: (u32, u32, u32, u32)) {
        let i = self.n as usize;
        if i >= Self::CAPACITY {
            return;
        }
        if let Some(slot) = self.slot.get_mut(id as usize) {
            // CAPACITY < 255: the entry plus one fits a u8.
            *slot = i as u8 + 1;
            self.ids[i] = id;
            self.spans[i] = span;
            self.n += 1;
        }
    }

    /// Forgets every field recorded (only the slots they took are cleared).
    #[inline]
    fn clear(&mut self) {
        let n = usize::from(self.n).min(Self::CAPACITY);
        for &id in &self.ids[..n] {
            if let Some(slot) = self.slot.get_mut(id as usize) {
                *slot = 0;
            }
        }
        self.n = 0;
    }

    pub(crate) fn span(&self, id: u16) -> Option<Span> {
        let i = usize::from(*self.slot.get(id as usize)?).checked_sub(1)?;
        if i >= usize::from(self.n) || self.ids.get(i) != Some(&id) {
            return None;
        }
        let (start, data, end, units) = self.spans[i];
        Some(Span {
            start: start as usize,
            data: data as usize,
            end: end as usize,
            units: units as usize,
        })
    }

    /// Every field indexed and where it starts (its length prefix, if
    /// any), in message order, for [`Spec::field_at`].
    pub fn starts(&self) -> impl Iterator<Item = (u16, usize)> + '_ {
        let n = usize::from(self.n);
        self.ids[..n]
            .iter()
            .zip(&self.spans[..n])
            .map(|(&id, span)| (id, span.0 as usize))
    }

    /// Every field indexed and the bytes it takes, its length prefix
    /// included (`start..end` of the payload), in message order: a field
    /// copied as it lies, to be read later with [`Spec::field_at`] at 0.
    pub fn ranges(&self) -> impl Iterator<Item = (u16, Range<usize>)> + '_ {
        let n = usize::from(self.n);
        self.ids[..n]
            .iter()
            .zip(&self.spans[..n])
            .map(|(&id, span)| (id, span.0 as usize..span.2 as usize))
    }

    /// End of the last field.
    pub fn end(&self) -> usize {
        self.end
    }
}

impl Message<'_> {
    /// Checks the whole message in one pass over its fields (every field the
    /// bitmaps announce is defined, its length prefix is sound and within the
    /// spec's maximum, its data is there, and no byte is left over) and records
    /// where the fields in `wanted` lie. Allocates nothing.
    ///
    /// A message that passes can be routed, answered and declined: every
    /// field lookup through the index is then free of errors.
    #[inline]
    pub fn index(&self, wanted: &Bitmap) -> Result<FieldIndex, IsoError> {
        let mut index = FieldIndex::default();
        self.index_into(wanted, &mut index)?;
        Ok(index)
    }

    /// [`Message::index`] into an index the caller holds (the per-message
    /// path keeps it beside the message instead of copying it there).
    #[inline]
    pub fn index_into(&self, wanted: &Bitmap, index: &mut FieldIndex) -> Result<(), IsoError> {
        if self.index_fast(wanted, index).is_some() {
            return Ok(());
        }
        // Something is wrong with this message: the careful walk finds what,
        // and names the field and offset.
        *index = self.index_checked(wanted)?;
        Ok(())
    }

    /// [`Message::index`] for a message that turns out sound, in the fewest
    /// steps, table-driven: each field is crossed by its spec's precomputed
    /// [`Cross`] entry (no definition read, no branch on an encoding). A
    /// fixed field moves the offset by its length, with no bounds check
    /// (the offset only grows, so one check that the last field ends at the
    /// payload's end covers them all); a variable field reads its prefix
    /// through its encoding's digit table, checked. `None` on anything
    /// [`Message::index_checked`] would refuse (`index` then holds nothing
    /// of use), and it accepts nothing that walk refuses.
    pub(crate) fn index_fast(&self, wanted: &Bitmap, index: &mut FieldIndex) -> Option<()> {
        let payload: &[u8] = &self.payload;
        u32::try_from(payload.len()).ok()?;
        // Only the first `n` entries and their slots are ever read.
        index.clear();
        let cross = self.spec.cross();
        // In 64 bits: the payload's length fits 32 (checked above) and a
        // field moves the offset by at most 2^32 - 1 (an undefined field:
        // `Cross::UNDEFINED`), 192 times, so no sum overflows and none
        // needs checking. An offset past the payload only grows, so the
        // one check at the end refuses it.
        let mut at = self.layout.fields_at as u64;
        // The bits by hand: `Bitmap::iter`'s flat_map cost ~300
        // instructions more per message here (scripts/path-ir.sh).
        for w in 0..3 {
            let mut bits = self.layout.present.0[w];
            let want = wanted.0[w];
            // Non-zero: `leading_zeros` is one instruction, with no case
            // for zero.
            while let Some(nz) = std::num::NonZeroU64::new(bits) {
                let lz = nz.leading_zeros();
                let bit = 1u64 << (63 - lz);
                bits ^= bit;
                // At most 3 * 64: fits the 256-entry table, unchecked.
                let id = (w as u32 * 64 + lz + 1) as u8;
                let c = &cross[id as usize];
                let start = at;
                let (data, units) = if c.prefix == 0 {
                    at += u64::from(c.fixed);
                    (start, c.units)
                } else {
                    let from = usize::try_from(at).ok()?;
                    let digits = payload.get(from..from.checked_add(c.prefix as usize)?)?;
                    let value = &PREFIX_VALUE[usize::from(c.table & 3)];
                    let base = u32::from(c.base);
                    let mut len = 0u32;
                    for &b in digits {
                        let v = value[b as usize];
                        if v == NOT_A_DIGIT {
                            return None;
                        }
                        len = len * base + u32::from(v);
                    }
                    if len > c.units || len & u32::from(c.whole) != 0 {
                        return None;
                    }
                    let wire = (len + u32::from(c.round)) >> c.shift;
                    let data = at + u64::from(c.prefix);
                    at = data + u64::from(wire);
                    (data, len)
                };
                if want & bit != 0 {
                    // Truncation cannot matter: a sound message ends within
                    // 32 bits, and any other is refused below.
                    index.record_at(id as u16, (start as u32, data as u32, at as u32, units));
                }
            }
        }
        if at != payload.len() as u64 {
            return None;
        }
        index.end = payload.len();
        Some(())
    }

    /// [`Message::index`] one field at a time, each checked as it is
    /// crossed: the walk that explains a refusal.
    pub(crate) fn index_checked(&self, wanted: &Bitmap) -> Result<FieldIndex, IsoError> {
        let mut index = FieldIndex {
            end: self.layout.fields_at,
            ..FieldIndex::default()
        };
        let payload: &[u8] = &self.payload;
        if payload.len() > u32::MAX as usize {
            return Err(IsoError::TooLong {
                len: payload.len(),
                max: u32::MAX as usize,
            });
        }
        self.spec.walk(&self.layout, payload, |def, span| {
            if wanted.bit(def.id) {
                index.record(def.id, span);
            }
            index.end = span.end;
            true
        })?;
        if index.end != payload.len() {
            return Err(IsoError::TrailingBytes {
                offset: index.end,
                len: payload.len() - index.end,
            });
        }
        Ok(index)
    }

    /// Field `id` through an index made by [`Message::index`] of this message:
    /// no walk. `None` when the field is absent or was not asked for.
    pub fn indexed(&self, index: &FieldIndex, id: u16) -> Option<FieldRef<'_>> {
        let span = index.span(id)?;
        let def = self.spec.field(id)?;
        Some(field_ref(def, &self.payload, span))
    }

    /// The data of field `id` (as [`FieldRef::data`]) through an index made
    /// by [`Message::index`] of this message, read straight off the index:
    /// the bitmap says first whether it is there at all. `None` when the
    /// field is absent or was not asked for.
    #[inline]
    pub fn indexed_data(&self, index: &FieldIndex, id: u16) -> Option<&[u8]> {
        if !self.layout.present.bit(id) {
            return None;
        }
        let span = index.span(id)?;
        self.payload.get(span.data..span.end)
    }
}
