//! [`FrameCodec`]: the tokio-util `Decoder`/`Encoder` every link reads and
//! writes frames with, over the pure [`Framer`] of the wire crate (which
//! cannot depend on tokio). Reached as `crate::wire::FrameCodec`.

use std::ops::{Deref, DerefMut};

use bytes::{Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use isoswitch_wire::{Frame, FrameError, Framer, LengthPrefix};

/// Cuts frames from a stream and writes them to one. One codec per
/// connection; everything but the trait glue is the [`Framer`]'s.
#[derive(Clone, Debug)]
pub struct FrameCodec(Framer);

impl FrameCodec {
    /// A codec for `prefix` accepting payloads (bytes after the prefix) of at
    /// most `max_frame` bytes, in both directions.
    pub fn new(prefix: LengthPrefix, max_frame: usize) -> FrameCodec {
        FrameCodec(Framer::new(prefix, max_frame))
    }
}

impl Deref for FrameCodec {
    type Target = Framer;
    fn deref(&self) -> &Framer {
        &self.0
    }
}

impl DerefMut for FrameCodec {
    fn deref_mut(&mut self) -> &mut Framer {
        &mut self.0
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        self.0.decode(src)
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        self.0.decode_eof(src)
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        self.0.encode(frame, dst)
    }
}

impl Encoder<Bytes> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, payload: Bytes, dst: &mut BytesMut) -> Result<(), FrameError> {
        self.0.encode_payload_of(payload, dst)
    }
}
