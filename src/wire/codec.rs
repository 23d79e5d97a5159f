//! FrameCodec (to be completed by the wire-framing work).
pub struct FrameCodec;
