//! The simulators' own writer task: one per connection, fed by a bounded
//! queue, writing length-prefixed frames through a `BufWriter` and flushing
//! whenever the queue runs dry.
//!
//! Separate from the switch's writer (`link/io/writer.rs`) on purpose: a
//! simulator is a test oracle, so a framing bug in the switch's writer must
//! show up as a disagreement with the peer, not be shared by it. Only the
//! `wire` layer's length prefix is reused, to write each frame's length.
//!
//! A request made from a template carries its per-request bytes (STAN, F7,
//! F37) as a [`Patch`] beside the shared template, applied while the frame is
//! written: the load generator sends thousands of requests a second without
//! copying a template per request.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

use crate::wire::LengthPrefix;

/// Bytes buffered before the writer writes without waiting for the queue to
/// run dry.
const BUFFER: usize = 64 * 1024;
/// Edits one frame can carry, and the longest edit (an F37 of 12 bytes).
const MAX_EDITS: usize = 4;
const MAX_EDIT_LEN: usize = 16;

/// A frame for a simulator's writer.
#[derive(Clone, Debug)]
pub enum Outbound {
    /// A payload (envelope + MTI + fields, no length prefix) and the edits to
    /// make to it on the way out.
    Message(Bytes, Patch),
    /// A zero-length frame: the link keep-alive (CUPS, POS) or poll (VISA).
    KeepAlive,
}

impl Outbound {
    /// A payload sent as it is.
    pub fn message(payload: Bytes) -> Outbound {
        Outbound::Message(payload, Patch::default())
    }
}

/// Up to four overwrites of a payload at fixed offsets, kept inline (no heap).
#[derive(Clone, Copy, Debug, Default)]
pub struct Patch {
    count: usize,
    edits: [(usize, usize, [u8; MAX_EDIT_LEN]); MAX_EDITS],
}

/// A patch that cannot take one more edit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("simulator patch full or edit too long: {len} bytes at offset {offset}")]
pub struct PatchFull {
    pub offset: usize,
    pub len: usize,
}

impl Patch {
    /// Overwrite the payload's bytes at `offset` with `bytes` when written.
    pub fn overwrite(&mut self, offset: usize, bytes: &[u8]) -> Result<(), PatchFull> {
        let full = PatchFull {
            offset,
            len: bytes.len(),
        };
        if self.count == MAX_EDITS || bytes.len() > MAX_EDIT_LEN {
            return Err(full);
        }
        let mut held = [0u8; MAX_EDIT_LEN];
        held[..bytes.len()].copy_from_slice(bytes);
        self.edits[self.count] = (offset, bytes.len(), held);
        self.count += 1;
        Ok(())
    }

    /// Makes the edits on `frame`; an edit past its end is skipped (edits are
    /// computed from the template they travel with, so only a bug does that).
    pub fn apply(&self, frame: &mut [u8]) {
        for (offset, len, bytes) in &self.edits[..self.count] {
            if let Some(dst) = frame.get_mut(*offset..offset + len) {
                dst.copy_from_slice(&bytes[..*len]);
            }
        }
    }

    /// `payload` with the edits made, as a new buffer.
    pub fn applied_to(&self, payload: &[u8]) -> Vec<u8> {
        let mut out = payload.to_vec();
        self.apply(&mut out);
        out
    }
}

/// Appends `item` to `out` as one frame: length prefix, then the payload with
/// its edits. A payload too long for the prefix is an error and nothing is
/// appended.
pub fn frame_into(
    prefix: LengthPrefix,
    item: &Outbound,
    out: &mut BytesMut,
) -> Result<(), crate::wire::WireError> {
    let (payload, patch) = match item {
        Outbound::KeepAlive => return prefix.encode(0, out),
        Outbound::Message(payload, patch) => (payload, patch),
    };
    prefix.encode(payload.len(), out)?;
    let start = out.len();
    out.extend_from_slice(payload);
    patch.apply(&mut out[start..]);
    Ok(())
}

/// Writes the frames queued on `rx` to `w` until the queue closes (then shuts
/// the write side down: the peer reads what was sent, then EOF) or a write
/// fails. Frames go through a buffer that is flushed whenever nothing more is
/// queued, so a burst leaves in few writes and a lone frame leaves at once.
/// A frame too long for the prefix is logged and skipped.
pub async fn run_writer<W>(
    w: W,
    prefix: LengthPrefix,
    mut rx: mpsc::Receiver<Outbound>,
) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let mut out = BufWriter::with_capacity(BUFFER, w);
    let mut frame = BytesMut::with_capacity(4096);
    while let Some(mut item) = rx.recv().await {
        loop {
            frame.clear();
            match frame_into(prefix, &item, &mut frame) {
                Ok(()) => out.write_all(&frame).await?,
                Err(e) => tracing::warn!(error = %e, "simulator frame dropped"),
            }
            match rx.try_recv() {
                Ok(next) => item = next,
                Err(_) => break,
            }
        }
        out.flush().await?;
    }
    out.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn patch_edits_at_offsets_and_refuses_a_fifth() {
        let mut p = Patch::default();
        p.overwrite(0, b"AB").unwrap();
        p.overwrite(4, b"Z").unwrap();
        p.overwrite(9, b"past the end").unwrap();
        assert_eq!(p.applied_to(b"0123456789"), b"AB23Z56789".to_vec());
        p.overwrite(1, b"x").unwrap();
        assert_eq!(p.overwrite(2, b"y"), Err(PatchFull { offset: 2, len: 1 }));
        assert!(Patch::default().overwrite(0, &[0; 17]).is_err());
    }

    #[test]
    fn frames_carry_their_length() {
        let mut out = BytesMut::new();
        let mut p = Patch::default();
        p.overwrite(1, b"Z").unwrap();
        frame_into(
            LengthPrefix::Ascii4,
            &Outbound::Message(Bytes::from_static(b"abc"), p),
            &mut out,
        )
        .unwrap();
        frame_into(LengthPrefix::Ascii4, &Outbound::KeepAlive, &mut out).unwrap();
        assert_eq!(&out[..], b"0003aZc0000");
        out.clear();
        frame_into(
            LengthPrefix::Binary2,
            &Outbound::message(Bytes::from_static(b"hi")),
            &mut out,
        )
        .unwrap();
        assert_eq!(&out[..], &[0, 2, b'h', b'i']);
        let huge = Outbound::message(Bytes::from(vec![0u8; 10_000]));
        out.clear();
        assert!(frame_into(LengthPrefix::Ascii4, &huge, &mut out).is_err());
        assert!(out.is_empty());
    }

    /// Everything queued arrives in order, an oversized frame is skipped, and
    /// closing the queue closes the stream.
    #[tokio::test]
    async fn writes_in_order_then_closes() {
        let (client, mut server) = tokio::io::duplex(1 << 20);
        let (tx, rx) = mpsc::channel(16);
        let task = tokio::spawn(run_writer(client, LengthPrefix::Ascii4, rx));
        tx.send(Outbound::message(Bytes::from_static(b"one")))
            .await
            .unwrap();
        tx.send(Outbound::message(Bytes::from(vec![b'x'; 10_000])))
            .await
            .unwrap();
        tx.send(Outbound::KeepAlive).await.unwrap();
        tx.send(Outbound::message(Bytes::from_static(b"two")))
            .await
            .unwrap();
        drop(tx);
        let mut got = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            server.read_to_end(&mut got),
        )
        .await
        .expect("the writer closes the stream")
        .unwrap();
        assert_eq!(got, b"0003one00000003two".to_vec());
        assert!(task.await.unwrap().is_ok());
    }
}
