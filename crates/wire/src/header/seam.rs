//! The seam every scheme header implements ([`SchemeHeader`]), and the
//! reader of envelope parts it parses through ([`Parts`]).

use super::{Description, Fresh, FreshError, Header};
use crate::envelope::Rejected;
use crate::part::{WireResult, complete};

/// One scheme header: everything the switch needs to know of it. The kinds
/// are listed once in the registry (`header/mod.rs`), which dispatches to
/// these statically; nothing outside this folder matches on a kind.
pub trait SchemeHeader: Copy + Into<Header> {
    /// Bytes of the header on the wire (of a message that is not a reject).
    const LEN: usize;
    /// The part's name in errors and `decode`'s title: `CUPS header`.
    const PART: &'static str;
    /// Where the destination and source IDs are, if the header has them: a
    /// response carries them swapped.
    const IDS: Option<IdFields>;

    /// nom streaming parser for the header alone: `Incomplete` until all
    /// [`Self::LEN`] bytes are in, then a failure naming the field at its
    /// offset if the header cannot be one.
    fn header(input: &[u8]) -> WireResult<'_, Self>;

    /// The header at `input`; when it marks a reject, what the reject
    /// carries up to the original body goes into `rejected`. Read through
    /// `parts`, so a short input names the part it stops in. The default: a
    /// header without a reject form. (Every implementation is
    /// `inline(always)`: it is on the message path, and the out-parameter
    /// keeps the envelope from being copied through a second `Result`.)
    #[inline(always)]
    fn envelope_part<'a, const COMPLETE: bool>(
        parts: Parts<'a, COMPLETE>,
        input: &'a [u8],
        rejected: &mut Option<Rejected>,
    ) -> WireResult<'a, Self> {
        let _ = rejected;
        parts.read(Self::PART, Self::LEN, Self::header, input)
    }

    /// The header's bytes, as on the wire.
    fn as_bytes(&self) -> &[u8];

    /// The header of a message the switch makes itself (echo, sign-on), from
    /// the link's settings or the header's defaults.
    fn fresh(settings: &Fresh<'_>) -> Result<Self, FreshError>;

    /// The header of a typical request, for samples and examples.
    fn sample() -> Self;

    /// Writes `total` (bytes from the header's start to the message's end)
    /// into a header at the start of `buf`; nothing on a short buffer. The
    /// default: the header has no total length.
    #[inline]
    fn set_total_length_in(buf: &mut [u8], total: usize) -> Result<(), TotalTooLong> {
        let _ = (buf, total);
        Ok(())
    }

    /// Swaps the IDs of a header at the start of `buf` (a request's header
    /// becomes its response's); nothing on a buffer shorter than the header.
    #[inline]
    fn swap_ids_in(buf: &mut [u8]) {
        if let Some(ids) = Self::IDS
            && buf.len() >= Self::LEN
        {
            ids.swap(buf);
        }
    }

    /// What `decode` shows of the header, as text rows and JSON keys;
    /// `frame_len` (the payload's length, when known) lets it point out where
    /// the header disagrees with its frame.
    fn describe(&self, frame_len: Option<usize>) -> Description;
}

/// Where a header keeps the two IDs a response swaps: the destination's at
/// `destination`, the source's at `source` (after it), `len` bytes each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IdFields {
    pub destination: usize,
    pub source: usize,
    pub len: usize,
}

impl IdFields {
    /// Swaps the two IDs of a header at the start of `buf`, if both are there.
    #[inline]
    pub fn swap(self, buf: &mut [u8]) {
        let IdFields {
            destination,
            source,
            len,
        } = self;
        if let Some(both) = buf.get_mut(destination..source.saturating_add(len))
            && let Some(between) = source.checked_sub(destination)
        {
            let (d, s) = both.split_at_mut(between);
            if let (Some(d), Some(s)) = (d.get_mut(..len), s.get_mut(..len)) {
                d.swap_with_slice(s);
            }
        }
    }
}

/// A total length that does not fit the header's field (VISA's is two bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("total length {total} does not fit the header (at most {max})")]
pub struct TotalTooLong {
    pub total: usize,
    pub max: usize,
}

/// Reads the parts of one envelope in one mode: whole frame (`COMPLETE`, a
/// short part is `Truncated` naming it) or streaming (`Incomplete`), with
/// error offsets counted from the start of the payload.
#[derive(Clone, Copy, Debug)]
pub struct Parts<'a, const COMPLETE: bool> {
    payload: &'a [u8],
}

impl<'a, const COMPLETE: bool> Parts<'a, COMPLETE> {
    pub(crate) fn new(payload: &'a [u8]) -> Self {
        Parts { payload }
    }

    /// The part `what` (`len` bytes) at `input`, a suffix of the payload.
    /// Always inlined, so `parser` is a direct call: out of line (as LLVM
    /// chose once the headers moved behind the seam) it cost every message
    /// about 50 instructions on the path (`scripts/path-ir.sh`).
    #[inline(always)]
    pub fn read<T>(
        self,
        what: &'static str,
        len: usize,
        parser: fn(&'a [u8]) -> WireResult<'a, T>,
        input: &'a [u8],
    ) -> WireResult<'a, T> {
        let at = self.payload.len() - input.len();
        let result = if COMPLETE {
            complete(what, len, parser)(input)
        } else {
            parser(input)
        };
        result.map_err(|e| e.map(|e| e.shifted(at)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_swap_in_place_and_not_on_a_short_buffer() {
        let ids = IdFields {
            destination: 1,
            source: 4,
            len: 2,
        };
        let mut buf = *b"xAByCDz";
        ids.swap(&mut buf);
        assert_eq!(&buf, b"xCDyABz");
        let mut short = *b"xAByC";
        ids.swap(&mut short);
        assert_eq!(&short, b"xAByC");
    }
}
