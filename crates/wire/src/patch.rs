//! Fixed-width edits of a payload (a TPDU swap, an F37 node stamp), made by
//! routing and applied while the writer copies the payload into its buffer,
//! so no message is copied just to be patched. Pure data.

/// Largest patch: an F37 window or a TPDU.
pub const PATCH_MAX: usize = 12;
/// Patches one frame can carry (TPDU + F37 + one header edit).
pub const PATCHES: usize = 3;

/// Up to three fixed-width overwrites of a payload, applied at write time.
#[derive(Clone, Copy, Debug, Default)]
pub struct Patch {
    len: u8,
    edits: [Edit; PATCHES],
}

#[derive(Clone, Copy, Debug, Default)]
struct Edit {
    offset: u16,
    len: u8,
    bytes: [u8; PATCH_MAX],
}

/// A patch that does not fit (too many edits, too long, or past u16 offsets).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("patch of {len} bytes at offset {offset} does not fit the writer's patch slots")]
pub struct PatchOverflow {
    pub offset: usize,
    pub len: usize,
}

impl Patch {
    /// Adds an overwrite of `bytes` at `offset` in the payload.
    pub fn overwrite(&mut self, offset: usize, bytes: &[u8]) -> Result<(), PatchOverflow> {
        let overflow = PatchOverflow {
            offset,
            len: bytes.len(),
        };
        let slot = self.edits.get_mut(usize::from(self.len)).ok_or(overflow)?;
        let offset16 = u16::try_from(offset).map_err(|_| overflow)?;
        if bytes.len() > PATCH_MAX {
            return Err(overflow);
        }
        slot.offset = offset16;
        slot.len = bytes.len() as u8;
        slot.bytes[..bytes.len()].copy_from_slice(bytes);
        self.len += 1;
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Applies the edits to a copy of the payload; edits past its end are ignored
    /// (they were computed from this payload, so this only guards against bugs).
    pub fn apply(&self, frame: &mut [u8]) {
        for e in &self.edits[..usize::from(self.len)] {
            let start = usize::from(e.offset);
            let len = usize::from(e.len);
            if let Some(dst) = frame.get_mut(start..start + len) {
                dst.copy_from_slice(&e.bytes[..len]);
            }
        }
    }

    /// The payload with the edits applied, as a new buffer (tools and tests).
    pub fn applied_to(&self, payload: &[u8]) -> Vec<u8> {
        let mut v = payload.to_vec();
        self.apply(&mut v);
        v
    }
}
