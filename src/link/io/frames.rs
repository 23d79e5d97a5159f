//! A framed reader for client links that holds no read buffer between
//! frames.
//!
//! A POS network's front holds thousands of terminal connections, nearly all
//! quiet at any moment, each waiting for its next request. tokio-util's
//! `FramedRead` keeps a buffer per connection for that wait (it reads into
//! its spare capacity), 2 KiB each here: 16 MB at 8,000 terminals, for bytes
//! that are not there. [`LeanFrames`] reads into its worker thread's scratch
//! buffer instead; only what arrived is copied into a buffer of the
//! connection's own, sized to it, and that buffer is let go once its last
//! frame is cut. Between frames a connection holds nothing; a frame that
//! arrives in parts holds a buffer of the frame's size until it is whole.
//!
//! The price is one copy of the bytes read (a few hundred per request) and
//! one allocation per read, which the request's payload `Bytes` use. Links
//! to nodes and peers (a few each, busy) keep `FramedRead`.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use futures_util::Stream;
use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::codec::FramedRead;

use crate::wire::{Frame, FrameCodec, FrameError};

/// The most one read takes: a worker's scratch buffer.
const SCRATCH_LEN: usize = 16 * 1024;

thread_local! {
    /// Where this worker's client links read: one buffer per thread, used
    /// only inside one (synchronous) `poll_read`.
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; SCRATCH_LEN].into_boxed_slice());
}

/// A framed reader whose codec state and unframed bytes can be looked into
/// (a partial frame, or a whole one already read behind the current one).
pub trait Buffered {
    fn decoder(&self) -> &FrameCodec;
    fn read_buffer(&self) -> &BytesMut;
}

impl<R> Buffered for FramedRead<R, FrameCodec> {
    fn decoder(&self) -> &FrameCodec {
        FramedRead::decoder(self)
    }
    fn read_buffer(&self) -> &BytesMut {
        FramedRead::read_buffer(self)
    }
}

/// Frames read from `R` with no buffer held while nothing is unframed.
/// As `FramedRead`: an error ends the stream after it is returned, and at
/// the end of the stream bytes short of a frame are an error.
pub struct LeanFrames<R> {
    io: R,
    codec: FrameCodec,
    /// Bytes read and not yet framed; no storage while empty.
    buf: BytesMut,
    state: State,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Reading,
    /// The peer closed its side: what is left is framed, then the end.
    Eof,
    Done,
}

impl<R> Buffered for LeanFrames<R> {
    fn decoder(&self) -> &FrameCodec {
        &self.codec
    }
    fn read_buffer(&self) -> &BytesMut {
        &self.buf
    }
}

impl<R: AsyncRead + Unpin> LeanFrames<R> {
    pub fn new(io: R, codec: FrameCodec) -> LeanFrames<R> {
        LeanFrames {
            io,
            codec,
            buf: BytesMut::new(),
            state: State::Reading,
        }
    }

    /// Bytes of storage held for unframed bytes (tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.buf.capacity()
    }

    /// Cuts the next frame from what was read, if one is whole.
    fn cut(&mut self) -> Option<Result<Frame, FrameError>> {
        if self.buf.is_empty() && !self.codec.in_frame() {
            return None;
        }
        let cut = match self.state {
            State::Eof => self.codec.decode_eof(&mut self.buf),
            _ => self.codec.decode(&mut self.buf),
        };
        match cut {
            Ok(Some(frame)) => {
                if self.buf.is_empty() {
                    // The frames cut from it keep the storage alive as long
                    // as they need it; this link lets it go.
                    self.buf = BytesMut::new();
                }
                Some(Ok(frame))
            }
            Ok(None) => None,
            Err(e) => {
                self.state = State::Done;
                Some(Err(e))
            }
        }
    }

    /// Reads what the socket has through the worker's scratch buffer and
    /// appends it to this link's own; `Ok(0)` is the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let mut read = ReadBuf::new(&mut scratch[..]);
            ready!(Pin::new(&mut self.io).poll_read(cx, &mut read))?;
            let got = read.filled();
            if self.buf.capacity() == 0 {
                self.buf = BytesMut::with_capacity(got.len());
            }
            self.buf.extend_from_slice(got);
            Poll::Ready(Ok(got.len()))
        })
    }
}

impl<R: AsyncRead + Unpin> Stream for LeanFrames<R> {
    type Item = Result<Frame, FrameError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.state == State::Done {
                return Poll::Ready(None);
            }
            if let Some(item) = this.cut() {
                return Poll::Ready(Some(item));
            }
            if this.state == State::Eof {
                this.state = State::Done;
                return Poll::Ready(None);
            }
            match ready!(this.poll_fill(cx)) {
                Ok(0) => this.state = State::Eof,
                Ok(_) => {}
                Err(e) => {
                    this.state = State::Done;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::LengthPrefix;
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;

    fn codec() -> FrameCodec {
        FrameCodec::new(LengthPrefix::Binary2, 4096)
    }

    fn payload(item: Option<Result<Frame, FrameError>>) -> Vec<u8> {
        match item {
            Some(Ok(Frame::Message(p))) => p.to_vec(),
            other => panic!("expected a message, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn between_frames_nothing_is_held_and_a_partial_frame_holds_its_size() {
        let (ours, mut peer) = tokio::io::duplex(64 * 1024);
        let mut frames = LeanFrames::new(ours, codec());
        assert_eq!(frames.held(), 0, "a new link");
        peer.write_all(b"\x00\x03abc\x00\x02de").await.unwrap();
        assert_eq!(payload(frames.next().await), b"abc");
        assert!(frames.held() > 0, "the second frame is still buffered");
        assert_eq!(payload(frames.next().await), b"de");
        assert_eq!(frames.held(), 0, "every frame cut: let go");
        // A 1,000-byte frame in two parts: held at its own size meanwhile.
        let body = vec![7u8; 1000];
        peer.write_all(&[0x03, 0xe8]).await.unwrap();
        peer.write_all(&body[..10]).await.unwrap();
        let next = tokio::spawn(async move {
            let item = frames.next().await;
            (frames, item)
        });
        tokio::task::yield_now().await;
        peer.write_all(&body[10..]).await.unwrap();
        let (frames, item) = next.await.unwrap();
        assert_eq!(payload(item), body);
        assert_eq!(frames.held(), 0);
    }

    #[tokio::test]
    async fn a_partial_frame_is_buffered_at_its_size_not_the_scratch_size() {
        let (ours, mut peer) = tokio::io::duplex(64 * 1024);
        let mut frames = LeanFrames::new(ours, codec());
        peer.write_all(&[0x01, 0x00, 1, 2, 3]).await.unwrap();
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(frames.poll_next_unpin(&mut cx).is_pending());
        assert!(frames.decoder().in_frame());
        let held = frames.held();
        assert!(
            (253..1024).contains(&held),
            "held {held} for a 256-byte frame"
        );
    }

    #[tokio::test]
    async fn the_end_of_the_stream_ends_it_and_a_short_frame_is_an_error() {
        let (ours, mut peer) = tokio::io::duplex(1024);
        let mut frames = LeanFrames::new(ours, codec());
        peer.write_all(b"\x00\x01x\x00").await.unwrap();
        drop(peer);
        assert_eq!(payload(frames.next().await), b"x");
        assert!(matches!(
            frames.next().await,
            Some(Err(FrameError::Wire(_)))
        ));
        assert!(frames.next().await.is_none(), "an error ends the stream");
        let (ours, peer) = tokio::io::duplex(1024);
        drop(peer);
        let mut frames = LeanFrames::new(ours, codec());
        assert!(frames.next().await.is_none(), "a clean end");
    }

    /// Frames split at every byte arrive the same as whole: the fixture of
    /// the wire crate's own split tests, through a socket-like pipe.
    #[tokio::test]
    async fn frames_split_anywhere_arrive_whole_and_in_order() {
        let stream: Vec<u8> = b"\x00\x03abc\x00\x00\x00\x05hello\x00\x01z".to_vec();
        for cut in 1..stream.len() {
            let (ours, mut peer) = tokio::io::duplex(1024);
            let mut frames = LeanFrames::new(ours, codec());
            let (a, b) = stream.split_at(cut);
            let (a, b) = (a.to_vec(), b.to_vec());
            let writer = tokio::spawn(async move {
                peer.write_all(&a).await.unwrap();
                tokio::task::yield_now().await;
                peer.write_all(&b).await.unwrap();
            });
            let mut got = Vec::new();
            while let Some(item) = frames.next().await {
                match item.unwrap() {
                    Frame::Message(p) => got.push(p.to_vec()),
                    Frame::KeepAlive => got.push(Vec::new()),
                    Frame::SessionControl(_) => panic!("no session control on binary2"),
                }
            }
            writer.await.unwrap();
            let want: Vec<Vec<u8>> =
                vec![b"abc".to_vec(), vec![], b"hello".to_vec(), b"z".to_vec()];
            assert_eq!(got, want, "cut at {cut}");
        }
    }
}
