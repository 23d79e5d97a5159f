//! Bytes on the wire: length prefixes, frames and envelopes. Pure: no I/O, no clocks.
//!
//! - [`prefix`]: nom parsers for every length prefix the switch speaks.
//! - [`codec`]: [`Framer`], which cuts a stream into frames and writes them, on top
//!   of [`prefix`] (the switch wraps it in its tokio-util codec).
//! - [`tpdu`] and [`header`] (the scheme headers [`cups`], [`pos`], [`visa`]
//!   behind the [`SchemeHeader`] seam): the envelope parts that precede the
//!   MTI, each a streaming nom parser (`Incomplete` on a short input) with a
//!   whole-frame form (`Tpdu::parse`, ...) where a short input is `Truncated`.
//! - [`envelope`]: parses the whole envelope of a frame as a spec describes it.

#![forbid(unsafe_code)]

pub mod codec;
pub mod envelope;
mod error;
pub mod header;
mod part;
pub mod patch;
pub mod prefix;
pub mod tpdu;

pub use header::{cups, pos, visa};

pub use codec::FrameError;
pub use codec::Framer;
pub use cups::CupsHeader;
pub use envelope::{Envelope, EnvelopeSpec};
pub use error::{EnvelopeReason, WireError};
pub use header::{Header, HeaderKind, SchemeHeader};
pub use part::WireResult;
pub use patch::{Patch, PatchOverflow};
pub use pos::PosHeader;
pub use prefix::LengthPrefix;
pub use tpdu::Tpdu;
pub use visa::VisaHeader;

use bytes::Bytes;

/// Writes `n` into `dst` as zero-padded ASCII decimal digits, right-aligned;
/// digits that do not fit are cut from the left. (Header lengths, F7, STANs.)
pub fn write_ascii_decimal(dst: &mut [u8], mut n: u64) {
    for slot in dst.iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// One unit cut from a stream by a [`LengthPrefix`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A zero-length frame: the link keep-alive (CUPS `0000`, VISA poll). Never routed.
    KeepAlive,
    /// A VISA session-control frame (upper nibble of prefix byte 3 is 2): payload
    /// without the prefix. Handled per link, never routed.
    SessionControl(Bytes),
    /// A message frame: everything after the length prefix (envelope + body).
    Message(Bytes),
}
