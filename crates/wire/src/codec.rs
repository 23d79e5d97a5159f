//! [`Framer`]: cuts a byte stream into [`Frame`]s with a [`LengthPrefix`], and
//! writes them. Pure: the switch's tokio-util `Decoder`/`Encoder` (its
//! `Framer`) wraps it; nothing here reads a socket.
//!
//! - Incremental: any split of the stream into reads yields the same frames.
//! - Bounded: a prefix announcing more than `max_frame` payload bytes is an error
//!   before any memory is reserved; once a header is known, the buffer reserves
//!   exactly the rest of that frame.
//! - Zero copy: a payload is split off the read buffer and frozen.
//! - Error offsets are **stream-relative**: the codec counts the bytes it has
//!   consumed, so an offset names the byte since the start of the connection (the
//!   first byte of the bad prefix, or the bad digit in it).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use thiserror::Error;

use super::prefix::{FrameHeader, LengthPrefix};
use super::{Frame, WireError};

/// The longest prefix any [`LengthPrefix`] writes.
const PREFIX_MAX: usize = 4;

/// Why a stream of frames cannot go on. On a decode error the caller closes that
/// connection (and only that one).
#[derive(Debug, Error)]
pub enum FrameError {
    /// The bytes on the wire cannot be trusted, or a frame does not fit.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The transport failed (a tokio-util codec must take `io::Error`).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A session-control frame was given to a codec whose prefix cannot mark one
    /// (only `visa4` can).
    #[error("a {0} length prefix cannot carry a session-control frame")]
    SessionControlUnsupported(LengthPrefix),
}

/// Cuts frames from a stream and writes them to one. One codec per connection.
#[derive(Clone, Debug)]
pub struct Framer {
    prefix: LengthPrefix,
    max_frame: usize,
    /// The header of the frame being read, once its prefix has been consumed.
    pending: Option<FrameHeader>,
    /// Bytes consumed from the stream so far (prefixes and payloads).
    consumed: u64,
}

impl Framer {
    /// A codec for `prefix` accepting payloads (bytes after the prefix) of at most
    /// `max_frame` bytes, in both directions.
    pub fn new(prefix: LengthPrefix, max_frame: usize) -> Framer {
        Framer {
            prefix,
            max_frame,
            pending: None,
            consumed: 0,
        }
    }

    pub fn prefix(&self) -> LengthPrefix {
        self.prefix
    }

    /// The longest payload accepted or written.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Bytes consumed from the stream so far: the stream offset of the next
    /// unread byte (excluding a partial frame's prefix already consumed).
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Whether a frame has been started (its prefix read) but not finished.
    pub fn in_frame(&self) -> bool {
        self.pending.is_some()
    }

    /// The stream offset of byte 0 of the current buffer.
    fn base(&self) -> usize {
        usize::try_from(self.consumed).unwrap_or(usize::MAX)
    }

    fn count(&mut self, n: usize) {
        self.consumed = self.consumed.saturating_add(n as u64);
    }

    fn check_len(&self, payload_len: usize) -> Result<(), WireError> {
        if payload_len > self.max_frame {
            return Err(WireError::FrameTooLong {
                offset: 0,
                len: payload_len,
                max: self.max_frame,
            });
        }
        Ok(())
    }

    fn encode_payload(
        &mut self,
        session_control: bool,
        payload: &[u8],
        dst: &mut BytesMut,
    ) -> Result<(), FrameError> {
        self.check_len(payload.len())?;
        // Check the prefix before reserving, so nothing is written on error.
        let mut prefix = [0u8; PREFIX_MAX];
        let mut head = &mut prefix[..];
        if session_control {
            if !self.prefix.has_session_control() {
                return Err(FrameError::SessionControlUnsupported(self.prefix));
            }
            LengthPrefix::encode_visa_session_control(payload.len(), &mut head)?;
        } else {
            self.prefix.encode(payload.len(), &mut head)?;
        }
        let written = PREFIX_MAX - head.len();
        dst.reserve(written + payload.len());
        dst.put_slice(prefix.get(..written).unwrap_or_default());
        dst.put_slice(payload);
        Ok(())
    }
}

impl Framer {
    /// The next whole frame in `src`, split off it; `None` until one is
    /// complete. An error ends the stream.
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let header = match self.pending {
            Some(header) => header,
            None => {
                let parsed = self.prefix.parse_header(src, self.max_frame);
                let Some(header) = parsed.map_err(|e| e.shifted(self.base()))? else {
                    return Ok(None);
                };
                src.advance(self.prefix.len());
                self.count(self.prefix.len());
                self.pending = Some(header);
                header
            }
        };
        if src.len() < header.payload_len {
            // Bounded: payload_len <= max_frame was checked by parse_header.
            src.reserve(header.payload_len - src.len());
            return Ok(None);
        }
        let payload = src.split_to(header.payload_len).freeze();
        self.pending = None;
        self.count(header.payload_len);
        Ok(Some(header.frame(payload)))
    }

    /// As [`Framer::decode`] at the end of the stream: bytes left that are
    /// not a whole frame are an error naming where it started.
    pub fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if let Some(frame) = self.decode(src)? {
            return Ok(Some(frame));
        }
        let prefix_len = self.prefix.len();
        match self.pending {
            None if src.is_empty() => Ok(None),
            None => Err(WireError::Truncated {
                what: "length prefix",
                offset: self.base(),
                need: prefix_len,
                have: src.len(),
            }
            .into()),
            Some(header) => Err(WireError::Truncated {
                what: "frame",
                // Point at the frame's prefix, consumed already.
                offset: self.base().saturating_sub(prefix_len),
                need: prefix_len.saturating_add(header.payload_len),
                have: prefix_len.saturating_add(src.len()),
            }
            .into()),
        }
    }
}

impl Framer {
    /// Writes prefix + payload. A keep-alive is the zero-length prefix (`0000`,
    /// `00 00`, ...); a session control frame needs the `visa4` prefix.
    pub fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        match frame {
            Frame::KeepAlive => self.encode_payload(false, &[], dst),
            Frame::SessionControl(payload) => self.encode_payload(true, &payload, dst),
            Frame::Message(payload) => self.encode_payload(false, &payload, dst),
        }
    }
}

impl Framer {
    /// Writes a message payload with its prefix. An empty payload goes out as
    /// a zero-length frame, which the peer reads as a keep-alive.
    pub fn encode_payload_of(
        &mut self,
        payload: Bytes,
        dst: &mut BytesMut,
    ) -> Result<(), FrameError> {
        self.encode_payload(false, &payload, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(codec: &mut Framer, buf: &mut BytesMut) -> Vec<Frame> {
        let mut out = Vec::new();
        while let Some(f) = codec.decode(buf).unwrap() {
            out.push(f);
        }
        out
    }

    #[test]
    fn zero_length_is_keep_alive() {
        for p in LengthPrefix::ALL {
            let mut codec = Framer::new(p, 100);
            let mut buf = BytesMut::new();
            codec.encode(Frame::KeepAlive, &mut buf).unwrap();
            assert_eq!(buf.len(), p.len());
            assert_eq!(decode_all(&mut codec, &mut buf), [Frame::KeepAlive]);
            let mut buf = BytesMut::new();
            codec.encode_payload_of(Bytes::new(), &mut buf).unwrap();
            assert_eq!(decode_all(&mut codec, &mut buf), [Frame::KeepAlive]);
        }
    }

    #[test]
    fn cups_keep_alive_and_message() {
        let mut codec = Framer::new(LengthPrefix::Ascii4, 100);
        let mut buf = BytesMut::from(&b"00000005hello0000"[..]);
        assert_eq!(
            decode_all(&mut codec, &mut buf),
            [
                Frame::KeepAlive,
                Frame::Message(Bytes::from_static(b"hello")),
                Frame::KeepAlive
            ]
        );
        assert!(buf.is_empty());
        assert_eq!(codec.consumed(), 17);
    }

    #[test]
    fn payload_is_zero_copy() {
        let mut codec = Framer::new(LengthPrefix::Binary2, 100);
        let mut buf = BytesMut::from(&[0u8, 3, b'a', b'b', b'c'][..]);
        let start = buf.as_ptr() as usize;
        let Some(Frame::Message(payload)) = codec.decode(&mut buf).unwrap() else {
            panic!("expected a message");
        };
        assert_eq!(payload.as_ptr() as usize, start + 2);
    }

    #[test]
    fn reserves_rest_of_frame_once_header_known() {
        let mut codec = Framer::new(LengthPrefix::Binary2, 5000);
        let mut buf = BytesMut::from(&[0x13u8, 0x88, 1, 2, 3][..]);
        assert_eq!(codec.decode(&mut buf).unwrap(), None);
        assert!(codec.in_frame());
        assert!(buf.capacity() >= 5000);
    }

    #[test]
    fn visa_session_control() {
        let mut codec = Framer::new(LengthPrefix::Visa4, 100);
        let mut buf = BytesMut::new();
        let sc = Frame::SessionControl(Bytes::from_static(b"\x01\x02"));
        codec.encode(sc.clone(), &mut buf).unwrap();
        assert_eq!(&buf[..], [0, 2, 0x20, 0, 1, 2]);
        assert_eq!(decode_all(&mut codec, &mut buf), vec![sc.clone()]);

        let mut cups = Framer::new(LengthPrefix::Ascii4, 100);
        let mut buf = BytesMut::new();
        assert!(matches!(
            cups.encode(sc, &mut buf),
            Err(FrameError::SessionControlUnsupported(LengthPrefix::Ascii4))
        ));
        assert!(buf.is_empty());
    }

    #[test]
    fn error_offsets_are_stream_relative() {
        let mut codec = Framer::new(LengthPrefix::Ascii4, 100);
        let mut buf = BytesMut::from(&b"0002ab00x1"[..]);
        assert_eq!(
            codec.decode(&mut buf).unwrap(),
            Some(Frame::Message(Bytes::from_static(b"ab")))
        );
        let err = codec.decode(&mut buf).unwrap_err();
        assert!(
            matches!(
                err,
                FrameError::Wire(WireError::BadPrefixDigit {
                    offset: 8,
                    byte: b'x',
                    ..
                })
            ),
            "{err:?}"
        );
    }

    #[test]
    fn too_long_is_an_error_both_ways() {
        let mut codec = Framer::new(LengthPrefix::Binary4, 1000);
        let mut buf = BytesMut::from(&[0x7Fu8, 0xFF, 0xFF, 0xFF][..]);
        assert!(matches!(
            codec.decode(&mut buf),
            Err(FrameError::Wire(WireError::FrameTooLong { max: 1000, .. }))
        ));
        assert!(buf.capacity() < 1000);
        let mut out = BytesMut::new();
        assert!(
            codec
                .encode_payload_of(Bytes::from(vec![0u8; 1001]), &mut out)
                .is_err()
        );
        assert!(out.is_empty());
        // Within max_frame but beyond what the prefix can say.
        let mut cups = Framer::new(LengthPrefix::Ascii4, 20_000);
        assert!(matches!(
            cups.encode_payload_of(Bytes::from(vec![0u8; 10_000]), &mut out),
            Err(FrameError::Wire(WireError::FrameTooLong { max: 9999, .. }))
        ));
        assert!(out.is_empty());
    }

    #[test]
    fn eof() {
        let mut codec = Framer::new(LengthPrefix::Ascii4, 100);
        assert_eq!(codec.decode_eof(&mut BytesMut::new()).unwrap(), None);

        let mut buf = BytesMut::from(&b"0003abc00"[..]);
        assert!(codec.decode_eof(&mut buf).unwrap().is_some());
        assert!(matches!(
            codec.decode_eof(&mut buf),
            Err(FrameError::Wire(WireError::Truncated {
                offset: 7,
                need: 4,
                have: 2,
                ..
            }))
        ));

        let mut codec = Framer::new(LengthPrefix::Ascii4, 100);
        let mut buf = BytesMut::from(&b"0003ab"[..]);
        assert!(matches!(
            codec.decode_eof(&mut buf),
            Err(FrameError::Wire(WireError::Truncated {
                offset: 0,
                need: 7,
                have: 6,
                ..
            }))
        ));
    }
}
