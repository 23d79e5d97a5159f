//! Tests of `direct`.

use super::*;
use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// A frame whose every byte is its number, so that the reader can tell
/// frames apart and see any interleaving.
fn frame(n: u8, len: usize) -> Outbound {
    Outbound::message(Bytes::from(vec![n; len]))
}

async fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
    (client.unwrap(), accepted.unwrap().0)
}

/// Reads every frame (Binary2 prefix) until the peer closes: each one's
/// number, checking that all its bytes carry it.
async fn read_frames(mut peer: TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    peer.read_to_end(&mut all).await.unwrap();
    let mut seen = Vec::new();
    let mut rest = &all[..];
    while !rest.is_empty() {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let body = &rest[2..2 + len];
        assert!(body.iter().all(|b| *b == body[0]), "frames interleaved");
        seen.push(body[0]);
        rest = &rest[2 + len..];
    }
    seen
}

/// A direct (client) link over `sock` whose idle frames are never probes.
fn start(sock: TcpStream, queue: usize) -> (LinkTx, LinkWriter, TcpStreamHalf) {
    start_probing(sock, queue, u32::MAX)
}

fn start_probing(
    sock: TcpStream,
    queue: usize,
    probe_every: u32,
) -> (LinkTx, LinkWriter, TcpStreamHalf) {
    let (read, write) = sock.into_split();
    let (tx, d) = direct_link(
        write,
        LengthPrefix::Binary2,
        queue,
        None,
        probe_every,
        false,
    );
    (tx, LinkWriter(Owner::Direct(d)), read)
}

/// Waits until everything sent is written and every sender is gone,
/// checks no write failed, and ends the link (its socket closes once
/// nothing holds it).
async fn finished(mut writer: LinkWriter) {
    writer.finish(std::time::Duration::from_secs(60)).await;
    if let Owner::Direct(d) = &writer.0 {
        assert_eq!(d.lock().failed, None);
    }
}

/// Whether the link has a writer task now.
fn has_writer(tx: &LinkTx) -> bool {
    tx.direct().lock().writer.is_some()
}

type TcpStreamHalf = tokio::net::tcp::OwnedReadHalf;

/// Fills the socket of a link whose peer does not read: the sender
/// writes 60,000-byte frames directly until a write is short and the
/// writer takes the link. Returns how many frames were sent.
fn fill(tx: &LinkTx) -> u8 {
    let mut sent = 0u8;
    while !tx.is_busy() {
        assert!(sent < 250, "the socket never filled");
        tx.try_send(frame(sent, 60_000)).unwrap();
        sent += 1;
    }
    sent
}

#[tokio::test]
async fn an_idle_link_is_written_by_the_sender_with_no_wakeup() {
    let (ours, peer) = pair().await;
    let (tx, writer, _read) = start(ours, 4);
    for n in 0..3 {
        tx.try_send(frame(n, 10)).unwrap();
        assert!(!tx.is_busy(), "written at once: the writer stays idle");
        assert!(!has_writer(&tx), "and no writer task exists");
    }
    drop(tx);
    finished(writer).await;
    assert_eq!(read_frames(peer).await, [0, 1, 2]);
}

/// The peer does not read, so the socket fills: a frame is written in
/// part, the rest of it and every frame after it must follow in order,
/// including those queued while the writer is inside a blocked write.
#[tokio::test]
async fn a_remainder_and_frames_queued_behind_a_write_keep_their_order() {
    let (ours, peer) = pair().await;
    let (tx, writer, _read) = start(ours, 64);
    let len = 60_000;
    let mut sent = fill(&tx);
    // Busy: these queue behind the remainder.
    for _ in 0..2 {
        tx.try_send(frame(sent, len)).unwrap();
        sent += 1;
    }
    // Let the writer start its (blocked) write, then queue more behind it.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(tx.is_busy(), "the peer still does not read");
    for _ in 0..3 {
        tx.try_send(frame(sent, len)).unwrap();
        sent += 1;
    }
    drop(tx);
    let reading = tokio::spawn(read_frames(peer));
    finished(writer).await;
    let seen = reading.await.unwrap();
    assert_eq!(seen, (0..sent).collect::<Vec<u8>>());
}

#[tokio::test]
async fn once_the_queue_is_drained_the_link_is_handed_back() {
    let (ours, peer) = pair().await;
    let (tx, writer, _read) = start(ours, 64);
    let mut sent = fill(&tx);
    let reading = tokio::spawn(read_frames(peer));
    // The writer drains everything and hands the link back.
    while tx.is_busy() {
        tokio::task::yield_now().await;
    }
    tx.try_send(frame(sent, 5)).unwrap();
    sent += 1;
    drop(tx);
    finished(writer).await;
    assert_eq!(reading.await.unwrap(), (0..sent).collect::<Vec<u8>>());
}

/// Thousands of quiet terminals each have a link: once a busy one is
/// handed back it holds no queue slots (a channel held 32 from the start).
#[tokio::test]
async fn a_link_handed_back_gives_its_queue_slots_back() {
    let (ours, peer) = pair().await;
    let (tx, writer, _read) = start(ours, 64);
    assert_eq!(tx.direct().lock().queue.capacity(), 0, "a new link");
    let mut sent = fill(&tx);
    for _ in 0..40 {
        tx.try_send(frame(sent, 10)).unwrap();
        sent += 1;
    }
    assert!(tx.direct().lock().queue.capacity() >= 40);
    let reading = tokio::spawn(read_frames(peer));
    while tx.is_busy() {
        tokio::task::yield_now().await;
    }
    assert_eq!(tx.direct().lock().queue.capacity(), 0, "given back");
    drop(tx);
    finished(writer).await;
    assert_eq!(reading.await.unwrap(), (0..sent).collect::<Vec<u8>>());
}

/// A quiet terminal's link holds no task: the writer is spawned when the
/// socket fills and ends once it has handed the link back. A resident
/// (node) link's stays.
#[tokio::test]
async fn a_client_link_has_a_writer_task_only_while_busy() {
    for resident in [false, true] {
        let (ours, peer) = pair().await;
        let (_read, write) = ours.into_split();
        let (tx, d) = direct_link(write, LengthPrefix::Binary2, 64, None, u32::MAX, resident);
        let writer = LinkWriter(Owner::Direct(d));
        assert!(!has_writer(&tx), "a new link");
        let mut sent = fill(&tx);
        assert!(has_writer(&tx), "busy: spawned");
        let reading = tokio::spawn(read_frames(peer));
        while tx.is_busy() {
            tokio::task::yield_now().await;
        }
        assert_eq!(has_writer(&tx), resident, "handed back");
        // Busy again: a new writer (or the same one) takes it.
        let before = sent;
        sent += fill(&tx);
        assert!(sent > before);
        drop(tx);
        finished(writer).await;
        let got = reading.await.unwrap();
        assert_eq!(got.len(), usize::from(sent));
    }
}

/// Requests in flight hold the link's senders: its owner waits for them
/// (a half-closed client's answers) at most its linger, then ends the
/// link, so that an answer after it is refused (and reversed as
/// undelivered by the service).
#[tokio::test]
async fn finish_ends_the_link_at_its_linger_while_a_sender_lives() {
    let (ours, peer) = pair().await;
    let (tx, mut writer, _read) = start(ours, 4);
    let in_flight = tx.clone();
    drop(tx);
    writer.finish(std::time::Duration::from_millis(50)).await;
    assert!(writer.is_finished());
    assert!(matches!(
        in_flight.try_send(frame(1, 10)),
        Err(TrySendError::Closed(_))
    ));
    drop((in_flight, writer));
    assert_eq!(read_frames(peer).await, Vec::<u8>::new());
}

/// ... and no longer than until the last of them is gone with all it
/// sent written.
#[tokio::test]
async fn finish_returns_once_the_last_sender_is_gone_and_all_is_written() {
    let (ours, peer) = pair().await;
    let (tx, writer, _read) = start(ours, 4);
    let in_flight = tx.clone();
    drop(tx);
    let answer = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        in_flight.try_send(frame(1, 10)).unwrap();
    });
    // The linger is a minute: only the drained link ends it this soon.
    tokio::time::timeout(std::time::Duration::from_secs(10), finished(writer))
        .await
        .expect("finish returned when the last sender went");
    answer.await.unwrap();
    assert_eq!(read_frames(peer).await, [1]);
}

#[tokio::test]
async fn a_busy_link_refuses_frames_past_its_queue() {
    let (ours, _peer) = pair().await;
    let (tx, _writer, _read) = start(ours, 1);
    let sent = fill(&tx);
    tx.try_send(frame(sent, 10)).unwrap();
    assert!(matches!(
        tx.try_send(frame(sent + 1, 10)),
        Err(TrySendError::Full(_))
    ));
}

/// A probe whose wait gains a frame turns the link to coalescing (every
/// frame through the writer); waits that gain nothing turn it back.
#[tokio::test]
async fn a_probe_that_gains_turns_the_link_to_coalescing_and_back() {
    let (ours, peer) = pair().await;
    let (tx, writer, _read) = start_probing(ours, 16, 2);
    let coalescing = |tx: &LinkTx| tx.direct().lock().coalescing;
    tx.try_send(frame(0, 10)).unwrap();
    assert!(!tx.is_busy(), "written directly");
    tx.try_send(frame(1, 10)).unwrap();
    assert!(tx.is_busy(), "a probe: through the writer");
    // The writer takes the probe and waits; meanwhile another frame.
    tokio::task::yield_now().await;
    tx.try_send(frame(2, 10)).unwrap();
    while tx.is_busy() {
        tokio::task::yield_now().await;
    }
    assert!(coalescing(&tx), "the wait gained a frame");
    let mut n = 3;
    while coalescing(&tx) {
        assert!(n < 3 + 2 * FUTILE_WAITS as u8, "never turned back");
        tx.try_send(frame(n, 10)).unwrap();
        n += 1;
        while tx.is_busy() {
            tokio::task::yield_now().await;
        }
    }
    drop(tx);
    finished(writer).await;
    assert_eq!(read_frames(peer).await, (0..n).collect::<Vec<u8>>());
}

/// Nothing has arrived at `peer` yet.
fn nothing_arrived(peer: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(peer.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

#[tokio::test]
async fn a_burst_is_held_back_until_its_last_frame_and_keeps_its_order() {
    let (ours, peer) = pair().await;
    let (tx, writer, _read) = start(ours, 4);
    corked(true, || tx.try_send(frame(0, 10))).unwrap();
    corked(true, || tx.try_send(frame(1, 10))).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert!(nothing_arrived(&peer), "held back while the burst lasts");
    corked(false, || tx.try_send(frame(2, 10))).unwrap();
    assert!(!tx.is_busy());
    drop(tx);
    finished(writer).await;
    assert_eq!(read_frames(peer).await, [0, 1, 2]);
}

#[tokio::test]
async fn a_sender_outside_the_burst_writes_the_held_back_bytes_first() {
    let (ours, peer) = pair().await;
    let (tx, writer, _read) = start(ours, 4);
    corked(true, || tx.try_send(frame(0, 10))).unwrap();
    // Another task (here on the same thread, outside any burst) sends:
    // frame 0 must not be overtaken.
    tx.try_send(frame(1, 10)).unwrap();
    flush_corked();
    tx.try_send(frame(2, 10)).unwrap();
    drop(tx);
    finished(writer).await;
    assert_eq!(read_frames(peer).await, [0, 1, 2]);
}

#[tokio::test]
async fn held_back_bytes_reach_the_peer_when_every_sender_is_gone() {
    let (ours, peer) = pair().await;
    let (tx, writer, _read) = start(ours, 4);
    corked(true, || tx.try_send(frame(7, 10))).unwrap();
    drop(tx);
    // The writer may end first; the bytes are still written by the flush.
    flush_corked();
    finished(writer).await;
    assert_eq!(read_frames(peer).await, [7]);
}

#[tokio::test]
async fn frame_ready_sees_a_whole_next_frame_only() {
    use crate::wire::FrameCodec;
    use futures_util::StreamExt;
    use tokio_util::codec::FramedRead;
    let codec = || FrameCodec::new(LengthPrefix::Binary2, 1000);
    // Two whole frames, then two bytes of a third.
    let bytes: &[u8] = b"\x00\x02ab\x00\x01c\x00\x05de";
    let mut frames = FramedRead::new(bytes, codec());
    frames.next().await.unwrap().unwrap();
    assert!(frame_ready(&frames), "the second frame is read already");
    frames.next().await.unwrap().unwrap();
    assert!(!frame_ready(&frames), "the third is partial");
    let mut alone = FramedRead::new(&b"\x00\x01x"[..], codec());
    alone.next().await.unwrap().unwrap();
    assert!(!frame_ready(&alone));
}

#[tokio::test]
async fn a_link_whose_writer_ended_refuses_frames() {
    let (ours, _peer) = pair().await;
    let (tx, writer, _read) = start(ours, 4);
    writer.abort();
    assert!(writer.is_finished());
    assert!(matches!(
        tx.try_send(frame(0, 10)),
        Err(TrySendError::Closed(_))
    ));
}
