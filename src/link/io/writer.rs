//! One writer task per connection: a bounded queue of outbound frames, written in
//! batches. Fixed-width edits (TPDU swap, F37 stamp) travel beside the payload and
//! are applied while the frame is copied into the write buffer, so a forwarded
//! message is never copied or allocated just to patch a few bytes.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use super::conns::ConnEntry;
use crate::wire::LengthPrefix;
pub use crate::wire::patch::{PATCH_MAX, PATCHES, Patch, PatchOverflow};

/// Writes are batched up to this many bytes.
pub(in crate::link) const BATCH_BYTES: usize = 64 * 1024;

/// A write buffer larger than this is given back when the queue is empty
/// after a write: a quiet link (most of a POS network's thousands of
/// terminals) holds at most this much, while a busy one, whose queue is
/// rarely empty, keeps its batch buffer.
const IDLE_BUFFER: usize = 1024;

/// A frame for the writer.
#[derive(Clone, Debug)]
pub enum Outbound {
    /// A message payload (envelope + body, no length prefix) and its edits.
    Message(Bytes, Patch),
    /// A zero-length keep-alive frame.
    KeepAlive,
}

impl Outbound {
    pub fn message(payload: Bytes) -> Outbound {
        Outbound::Message(payload, Patch::default())
    }
}

/// What a writer queue carries: an outbound frame, possibly with bookkeeping
/// the writer ignores (a simplex out link keeps each frame's age and kind, so
/// a link that dies can hand them on with their deadlines).
pub trait WriterItem {
    fn outbound(&self) -> &Outbound;
}

impl WriterItem for Outbound {
    fn outbound(&self) -> &Outbound {
        self
    }
}

/// Appends one framed message to `buf`. A payload too long for the prefix is
/// dropped with an error (it cannot be sent on this link at all).
pub fn encode_into(
    prefix: LengthPrefix,
    item: &Outbound,
    buf: &mut BytesMut,
) -> Result<(), crate::wire::WireError> {
    match item {
        Outbound::KeepAlive => prefix.encode(0, buf),
        Outbound::Message(payload, patch) => {
            prefix.encode(payload.len(), buf)?;
            let start = buf.len();
            buf.extend_from_slice(payload);
            patch.apply(&mut buf[start..]);
            Ok(())
        }
    }
}

/// Drains `rx` onto `w` until the queue closes or a write fails. Everything
/// already queued when a write starts goes out in the same `write_all`.
pub async fn run_writer<W>(
    w: W,
    prefix: LengthPrefix,
    rx: mpsc::Receiver<Outbound>,
) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let (result, _) = write_loop(w, prefix, rx, None, false, None).await;
    result
}

/// As [`run_writer`], but before each write it yields once, so that the
/// readers that are ready run first and what they queue for this link goes
/// out in the same write. The switch's links use this: under load it sends
/// about a third fewer segments; with nothing else runnable the yield costs
/// one scheduler pass and an I/O poll, not a wait. A link where the yields
/// stop gaining frames writes at once (`Pacing`). (The simulators keep
/// [`run_writer`], so that the benchmarks' reference client and nodes did
/// not change with it.)
/// Counts what it writes into `conn` (the connection table's entry).
pub async fn run_coalescing_writer<W>(
    w: W,
    prefix: LengthPrefix,
    rx: mpsc::Receiver<Outbound>,
    conn: Option<Arc<ConnEntry>>,
) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let (result, _) = write_loop(w, prefix, rx, None, true, conn).await;
    result
}

/// As [`run_writer`], but stops as soon as `stop` turns true and hands back the
/// queue with what was not yet written, so a link that died can pass its
/// frames to another link instead of losing them.
pub async fn run_writer_until<W, T>(
    w: W,
    prefix: LengthPrefix,
    rx: mpsc::Receiver<T>,
    stop: watch::Receiver<bool>,
    conn: Option<Arc<ConnEntry>>,
) -> (std::io::Result<()>, mpsc::Receiver<T>)
where
    W: AsyncWrite + Unpin,
    T: WriterItem,
{
    write_loop(w, prefix, rx, Some(stop), false, conn).await
}

async fn write_loop<W, T>(
    mut w: W,
    prefix: LengthPrefix,
    mut rx: mpsc::Receiver<T>,
    mut stop: Option<watch::Receiver<bool>>,
    coalesce: bool,
    conn: Option<Arc<ConnEntry>>,
) -> (std::io::Result<()>, mpsc::Receiver<T>)
where
    W: AsyncWrite + Unpin,
    T: WriterItem,
{
    // Grown on the first write, to what the link's batches need.
    let mut buf = BytesMut::new();
    let mut pacing = Pacing::default();
    loop {
        let first = match &mut stop {
            Some(stop) => tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return (Ok(()), rx),
                item = rx.recv() => item,
            },
            None => rx.recv().await,
        };
        let Some(first) = first else { break };
        push(prefix, &first, &mut buf);
        let mut frames = 1 + drain(prefix, &mut rx, &mut buf);
        if coalesce && buf.len() < BATCH_BYTES && pacing.should_wait() {
            // Let the readers that are ready run first: under load they queue
            // more frames for this link, which then leave in the same write.
            tokio::task::yield_now().await;
            let gained = drain(prefix, &mut rx, &mut buf);
            pacing.waited(gained);
            frames += gained;
        }
        if let Err(e) = w.write_all(&buf).await {
            return (Err(e), rx);
        }
        if let Some(conn) = &conn {
            conn.wrote(frames, buf.len() as u64);
        }
        settle(&mut buf, rx.is_empty());
    }
    (w.shutdown().await, rx)
}

/// Whether a coalescing writer yields before its next write. The yield
/// (`tokio::task::yield_now`) waits for the next I/O poll and runs every
/// reader that is ready by then, so under load their frames for this link
/// join the write. It costs the frame the time those readers take, which on
/// bursty arrivals is most of its time in the switch (`isoswitch bench
/// --dwell`), and a client's link, with a few requests in flight, or a node
/// link at a modest rate gains nothing from it. So a writer whose last
/// [`FUTILE_WAITS`] yields in a row gained no frame writes at once, and
/// yields once every [`PROBE_EVERY`] writes to notice the load coming back.
#[derive(Debug, Default)]
struct Pacing {
    /// Waits in a row that gained no frame.
    futile: u32,
    /// Writes since the last probe, once waiting stopped paying.
    since_probe: u32,
}

const FUTILE_WAITS: u32 = 8;
const PROBE_EVERY: u32 = 16;

impl Pacing {
    fn should_wait(&mut self) -> bool {
        if self.futile < FUTILE_WAITS {
            return true;
        }
        self.since_probe += 1;
        if self.since_probe >= PROBE_EVERY {
            self.since_probe = 0;
            return true;
        }
        false
    }

    /// After a wait: `gained` frames were queued meanwhile.
    fn waited(&mut self, gained: u64) {
        self.futile = if gained > 0 {
            0
        } else {
            self.futile.saturating_add(1)
        };
    }
}

/// Appends what is already queued, up to the batch size. Returns how many
/// frames it took.
/// Empties the write buffer after a write, and gives a large one back when
/// nothing else is queued (see [`IDLE_BUFFER`]).
pub(in crate::link) fn settle(buf: &mut BytesMut, queue_empty: bool) {
    buf.clear();
    if queue_empty && buf.capacity() > IDLE_BUFFER {
        *buf = BytesMut::new();
    }
}

pub(in crate::link) fn drain<T: WriterItem>(
    prefix: LengthPrefix,
    rx: &mut mpsc::Receiver<T>,
    buf: &mut BytesMut,
) -> u64 {
    let mut frames = 0;
    while buf.len() < BATCH_BYTES {
        match rx.try_recv() {
            Ok(next) => {
                push(prefix, &next, buf);
                frames += 1;
            }
            Err(_) => break,
        }
    }
    frames
}

pub(in crate::link) fn push<T: WriterItem>(prefix: LengthPrefix, item: &T, buf: &mut BytesMut) {
    if let Err(e) = encode_into(prefix, item.outbound(), buf) {
        tracing::warn!(error = %e, "outbound frame dropped: it does not fit the length prefix");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_link_gives_its_batch_buffer_back_and_a_busy_one_keeps_it() {
        let mut buf = BytesMut::with_capacity(BATCH_BYTES);
        buf.extend_from_slice(&[0u8; 4000]);
        settle(&mut buf, false);
        assert!(buf.is_empty());
        assert!(buf.capacity() >= BATCH_BYTES, "more is queued: keep it");
        buf.extend_from_slice(&[0u8; 4000]);
        settle(&mut buf, true);
        assert_eq!(buf.capacity(), 0, "nothing queued: given back");
        let mut small = BytesMut::with_capacity(IDLE_BUFFER);
        small.extend_from_slice(&[0u8; 300]);
        settle(&mut small, true);
        assert_eq!(small.capacity(), IDLE_BUFFER, "a small one is kept");
    }

    #[test]
    fn a_writer_whose_waits_gain_nothing_writes_at_once_but_probes() {
        let mut p = Pacing::default();
        for _ in 0..FUTILE_WAITS {
            assert!(p.should_wait());
            p.waited(0);
        }
        // One write in PROBE_EVERY still waits; the rest go out at once.
        let waits: Vec<bool> = (0..2 * PROBE_EVERY).map(|_| p.should_wait()).collect();
        assert_eq!(waits.iter().filter(|w| **w).count(), 2, "{waits:?}");
        assert!(waits[PROBE_EVERY as usize - 1]);
    }

    #[test]
    fn a_probe_that_gains_a_frame_brings_the_waits_back() {
        let mut p = Pacing::default();
        for _ in 0..FUTILE_WAITS {
            p.should_wait();
            p.waited(0);
        }
        while !p.should_wait() {}
        p.waited(3);
        assert!((0..FUTILE_WAITS).all(|_| p.should_wait()));
    }

    #[test]
    fn a_wait_that_gains_resets_the_streak() {
        let mut p = Pacing::default();
        for _ in 0..10 * FUTILE_WAITS {
            assert!(p.should_wait());
            // Gains now and then, never FUTILE_WAITS misses in a row.
            p.waited(u64::from(p.futile == FUTILE_WAITS - 1));
        }
    }

    #[test]
    fn patch_applies_at_write_time() {
        let mut p = Patch::default();
        p.overwrite(1, &[0xAA, 0xBB]).unwrap();
        p.overwrite(4, b"Z").unwrap();
        let mut buf = BytesMut::new();
        let payload = Bytes::from_static(b"012345");
        encode_into(
            LengthPrefix::Binary2,
            &Outbound::Message(payload.clone(), p),
            &mut buf,
        )
        .unwrap();
        assert_eq!(&buf[..], b"\x00\x060\xAA\xBB3Z5");
        assert_eq!(&payload[..], b"012345", "the shared payload is untouched");
    }

    #[test]
    fn patch_slots_are_bounded() {
        let mut p = Patch::default();
        for i in 0..PATCHES {
            p.overwrite(i, b"x").unwrap();
        }
        assert!(p.overwrite(9, b"x").is_err());
        let mut q = Patch::default();
        assert!(q.overwrite(0, &[0u8; PATCH_MAX + 1]).is_err());
        assert!(q.overwrite(70_000, b"x").is_err());
    }

    #[test]
    fn keep_alive_is_a_zero_length_frame() {
        let mut buf = BytesMut::new();
        encode_into(LengthPrefix::Ascii4, &Outbound::KeepAlive, &mut buf).unwrap();
        assert_eq!(&buf[..], b"0000");
    }

    #[tokio::test]
    async fn coalescing_writer_keeps_order_and_flushes_everything() {
        let (tx, rx) = mpsc::channel(16);
        let (client, mut server) = tokio::io::duplex(1 << 16);
        let table = Arc::new(crate::link::io::conns::ConnTable::default());
        let addr = "127.0.0.1:1".parse().unwrap();
        let conn = table.register(
            1,
            crate::link::io::conns::ConnKind::Client,
            None,
            addr,
            addr,
        );
        let entry = Some(Arc::clone(&conn.entry));
        let task = tokio::spawn(run_coalescing_writer(
            client,
            LengthPrefix::Ascii4,
            rx,
            entry,
        ));
        for m in [&b"0800"[..], b"0810", b"0200"] {
            tx.send(Outbound::message(Bytes::copy_from_slice(m)))
                .await
                .unwrap();
            tokio::task::yield_now().await;
        }
        drop(tx);
        task.await.unwrap().unwrap();
        let mut out = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut server, &mut out)
            .await
            .unwrap();
        assert_eq!(out, b"000408000004081000040200");
        // The connection table counts what was written.
        assert_eq!((conn.entry.messages_out(), conn.entry.bytes_out()), (3, 24));
        assert_eq!(
            table
                .traffic
                .bytes_out
                .load(std::sync::atomic::Ordering::Relaxed),
            24
        );
    }

    /// Records the size of every write it is given.
    struct Writes(Arc<std::sync::Mutex<Vec<usize>>>);

    impl AsyncWrite for Writes {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.0.lock().unwrap().push(buf.len());
            std::task::Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// The switch's runtime shape: one worker, whose LIFO slot runs a woken
    /// writer right after the reader that woke it. Three readers runnable at
    /// once each queue a frame for the link: the writer yields to them and
    /// sends the three in one write, not the first alone.
    #[test]
    fn frames_from_readers_runnable_together_leave_in_one_write() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let writes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = Writes(Arc::clone(&writes));
        rt.block_on(async move {
            tokio::spawn(async move {
                let (tx, rx) = mpsc::channel(16);
                let writer =
                    tokio::spawn(run_coalescing_writer(sink, LengthPrefix::Ascii4, rx, None));
                // The writer waits on its empty queue.
                tokio::task::yield_now().await;
                let readers: Vec<_> = [&b"0200"[..], b"0210", b"0800"]
                    .into_iter()
                    .map(|m| {
                        let tx = tx.clone();
                        tokio::spawn(async move {
                            tx.send(Outbound::message(Bytes::from_static(m)))
                                .await
                                .unwrap();
                        })
                    })
                    .collect();
                drop(tx);
                for r in readers {
                    r.await.unwrap();
                }
                writer.await.unwrap().unwrap();
            })
            .await
            .unwrap();
        });
        assert_eq!(*writes.lock().unwrap(), [24]);
    }

    #[tokio::test]
    async fn writer_batches_and_flushes_everything() {
        let (tx, rx) = mpsc::channel(16);
        let (client, mut server) = tokio::io::duplex(1 << 16);
        let task = tokio::spawn(run_writer(client, LengthPrefix::Ascii4, rx));
        for _ in 0..3 {
            tx.send(Outbound::message(Bytes::from_static(b"0800")))
                .await
                .unwrap();
        }
        drop(tx);
        task.await.unwrap().unwrap();
        let mut out = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut server, &mut out)
            .await
            .unwrap();
        assert_eq!(out, b"000408000004080000040800");
    }
}
