//! A service's capture as packets: tap events (open, reads and writes,
//! close) turned into synthetic TCP packets, each message masked (or
//! blanked when it cannot be read), written to the rotating pcapng files.
//! Synchronous and without a task, so tests and `replay --record` drive it
//! directly; the writer task that feeds it is [`super`].

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::BytesMut;

use super::WriterConfig;
use crate::capture::file::RotatingFiles;
use crate::capture::mask::{MaskedFields, blank_payload, mask_payload_with};
use crate::capture::tap::{Batch, Event, Segment, Staged};
use crate::capture::tcp::{MAX_SEGMENT, TcpFlow};
use crate::iso8583::Spec;
use crate::wire::prefix::split_frame;

/// One direction of a captured connection: bytes waiting for the rest of
/// their frame (masking needs whole messages).
#[derive(Default)]
struct Direction {
    pending: BytesMut,
    /// Stream offset of the next byte expected from the tap.
    next_offset: u64,
    /// Frames can no longer be found (a gap or an untrusted prefix): what
    /// follows is written blanked when masking.
    lost_sync: bool,
    /// Sizes of the reads/writes `pending` came in: the capture keeps the
    /// connection's real segmentation (a frame split across two reads shows
    /// as two segments).
    /// With each, when it was read or written: a packet keeps its own time
    /// even when it waits for the rest of its frame.
    chunks: std::collections::VecDeque<(usize, SystemTime)>,
}

impl Direction {
    /// The sizes of the next `n` bytes as they came.
    fn take_chunks(&mut self, n: usize, now: SystemTime) -> Vec<(usize, SystemTime)> {
        let mut out = Vec::new();
        let mut left = n;
        while left > 0 {
            let Some((c, at)) = self.chunks.pop_front() else {
                out.push((left, now));
                break;
            };
            if c > left {
                self.chunks.push_front((c - left, at));
                out.push((left, at));
                break;
            }
            out.push((c, at));
            left -= c;
        }
        out
    }
}

/// Packets for `bytes`, one per original chunk.
fn packets(
    flow: &mut TcpFlow,
    from_client: bool,
    bytes: &[u8],
    chunks: &[(usize, SystemTime)],
) -> Vec<(SystemTime, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pos = 0;
    for &(c, at) in chunks {
        let end = (pos + c).min(bytes.len());
        out.extend(
            flow.data(from_client, &bytes[pos..end])
                .into_iter()
                .map(|p| (at, p)),
        );
        pos = end;
    }
    out
}

/// Writes `bytes` as one packet per chunk (as it was read or written, with
/// its time), built in the reused `packet`. The file was chosen before the
/// sequence numbers moved ([`Recorder::data`]).
fn write_chunks(
    flow: &mut TcpFlow,
    from_client: bool,
    (bytes, chunks): (&[u8], &[(usize, SystemTime)]),
    packet: &mut Vec<u8>,
    files: &mut RotatingFiles,
) -> Result<(), crate::capture::file::FileError> {
    let mut pos = 0;
    for &(c, at) in chunks {
        let end = (pos + c).min(bytes.len());
        for piece in bytes[pos..end].chunks(MAX_SEGMENT) {
            flow.data_into(from_client, piece, packet);
            files.write(at, packet)?;
        }
        pos = end;
    }
    Ok(())
}

struct Conn {
    flow: TcpFlow,
    dirs: [Direction; 2],
    /// Where the connection's taps stage their copies.
    staged: Option<Arc<Staged>>,
}

/// The writer's connections by ID. The IDs are the switch's own sequence
/// numbers (no input chooses them), so one multiply spreads them as well as
/// SipHash, which was a visible share of the writer's time with a look-up
/// per read or write.
type ConnMap = HashMap<u64, Conn, BuildHasherDefault<ConnIdHasher>>;

#[derive(Default)]
struct ConnIdHasher(u64);

impl Hasher for ConnIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Events to packets, for one service; separate from the task for tests.
pub struct Recorder {
    spec: Arc<Spec>,
    masked: MaskedFields,
    clear: bool,
    files: RotatingFiles,
    conns: ConnMap,
    /// Messages that could not be read for masking and were blanked.
    pub blanked: u64,
    /// Every data packet is built here, then written (no allocation per packet).
    packet: Vec<u8>,
    /// The frames found in the read or write at hand: `(start, end, masked)`.
    frames: Vec<(usize, usize, bool)>,
}

impl Recorder {
    pub fn new(
        spec: Arc<Spec>,
        cfg: &WriterConfig,
    ) -> Result<Recorder, crate::capture::file::FileError> {
        Ok(Recorder {
            masked: MaskedFields::of(&spec),
            spec,
            clear: cfg.clear,
            files: RotatingFiles::new(cfg.rotation.clone())?,
            conns: ConnMap::default(),
            blanked: 0,
            packet: Vec::new(),
            frames: Vec::new(),
        })
    }

    /// A recorder writing one file at `path` (`replay --record`).
    pub fn single_file(spec: Arc<Spec>, path: &std::path::Path, clear: bool) -> Recorder {
        Recorder {
            masked: MaskedFields::of(&spec),
            spec,
            clear,
            files: RotatingFiles::single(path),
            conns: ConnMap::default(),
            blanked: 0,
            packet: Vec::new(),
            frames: Vec::new(),
        }
    }

    /// The files, for the disk guard.
    pub fn rotating(&mut self) -> &mut RotatingFiles {
        &mut self.files
    }

    /// Records one event.
    pub fn record(&mut self, ev: Event) -> Result<(), crate::capture::file::FileError> {
        match ev {
            Event::Open {
                conn,
                client,
                server,
                at,
                staged,
            } => {
                let flow = TcpFlow::new(client, server, (conn as u32).wrapping_mul(0x0100_0193));
                self.ensure_file(at)?;
                for p in flow.handshake() {
                    self.files.write(at, &p)?;
                }
                self.conns.insert(
                    conn,
                    Conn {
                        flow,
                        dirs: Default::default(),
                        staged,
                    },
                );
            }
            Event::Data {
                conn,
                from_client,
                offset,
                bytes,
                at,
            } => self.data(conn, from_client, offset, &bytes, at)?,
            Event::Ready { conn } => self.take_staged(conn)?,
            Event::Close { conn, at } => {
                self.take_staged(conn)?;
                self.close(conn, at)?;
            }
        }
        Ok(())
    }

    /// Writes what a connection's taps staged: both directions together, in
    /// the order they happened, each read or write its own packet with its
    /// own time.
    fn take_staged(&mut self, conn: u64) -> Result<(), crate::capture::file::FileError> {
        let Some(staged) = self.conns.get(&conn).and_then(|c| c.staged.clone()) else {
            return Ok(());
        };
        let batch = staged.take();
        let result = self.write_batch(conn, &batch);
        staged.give_back(batch);
        result
    }

    fn write_batch(
        &mut self,
        conn: u64,
        batch: &Batch,
    ) -> Result<(), crate::capture::file::FileError> {
        for (from_client, seg, bytes) in in_time_order(batch) {
            self.data(conn, from_client, seg.offset, bytes, seg.at)?;
        }
        Ok(())
    }

    /// One read or write of a connection.
    fn data(
        &mut self,
        conn: u64,
        from_client: bool,
        offset: u64,
        bytes: &[u8],
        at: SystemTime,
    ) -> Result<(), crate::capture::file::FileError> {
        if !self.conns.contains_key(&conn) {
            return Ok(());
        }
        // Rotate before the sequence numbers move: a new file's
        // handshakes must start where this event's packets start.
        self.ensure_file(at)?;
        let Some(c) = self.conns.get_mut(&conn) else {
            return Ok(());
        };
        let d = &mut c.dirs[usize::from(from_client)];
        if offset > d.next_offset {
            // Events were dropped: leave a gap, as a lossy capture does.
            let (flushed, _) = take_ready(
                &self.spec,
                &self.masked,
                d,
                self.clear,
                true,
                &mut self.blanked,
            );
            let gap = offset - d.next_offset;
            let chunks = d.take_chunks(flushed.len(), at);
            d.lost_sync = true;
            write_chunks(
                &mut c.flow,
                from_client,
                (&flushed, &chunks),
                &mut self.packet,
                &mut self.files,
            )?;
            c.flow.skip(from_client, gap);
        }
        let Some(c) = self.conns.get_mut(&conn) else {
            return Ok(());
        };
        let d = &mut c.dirs[usize::from(from_client)];
        d.next_offset = offset + bytes.len() as u64;
        // The usual case: nothing pending and the read or write holds whole
        // frames. They are masked in the packet being built, with no copy
        // kept in between.
        if d.pending.is_empty() && !d.lost_sync {
            let whole = whole_frames(&self.spec, bytes, &mut self.frames);
            if let Some(cut) = whole.filter(|&n| n <= MAX_SEGMENT) {
                if cut > 0 {
                    let start = c
                        .flow
                        .data_into(from_client, &bytes[..cut], &mut self.packet);
                    if !self.clear {
                        let payload = &mut self.packet[start..];
                        for &(from, to, masked) in &self.frames {
                            if masked {
                                mask_or_blank(
                                    &self.spec,
                                    &self.masked,
                                    &mut payload[from..to],
                                    &mut self.blanked,
                                );
                            }
                        }
                    }
                    self.files.write(at, &self.packet)?;
                }
                if cut < bytes.len() {
                    d.pending.extend_from_slice(&bytes[cut..]);
                    d.chunks.push_back((bytes.len() - cut, at));
                }
                return Ok(());
            }
        }
        d.pending.extend_from_slice(bytes);
        d.chunks.push_back((bytes.len(), at));
        let (ready, _) = take_ready(
            &self.spec,
            &self.masked,
            d,
            self.clear,
            false,
            &mut self.blanked,
        );
        if !ready.is_empty() {
            let chunks = d.take_chunks(ready.len(), at);
            write_chunks(
                &mut c.flow,
                from_client,
                (&ready, &chunks),
                &mut self.packet,
                &mut self.files,
            )?;
        }
        Ok(())
    }

    fn close(&mut self, conn: u64, at: SystemTime) -> Result<(), crate::capture::file::FileError> {
        let Some(mut c) = self.conns.remove(&conn) else {
            return Ok(());
        };
        let mut packets = Vec::new();
        for from_client in [true, false] {
            let d = &mut c.dirs[usize::from(from_client)];
            let (rest, _) = take_ready(
                &self.spec,
                &self.masked,
                d,
                self.clear,
                true,
                &mut self.blanked,
            );
            let chunks = d.take_chunks(rest.len(), at);
            packets.extend(self::packets(&mut c.flow, from_client, &rest, &chunks));
        }
        packets.extend(c.flow.close().into_iter().map(|p| (at, p)));
        // The last bytes and FINs stay in the file the connection
        // is in, even past its size: a file of FINs alone would
        // reassemble nothing.
        if !self.files.has_file() {
            self.files.rotate(at)?;
        }
        for (at, p) in packets {
            self.files.write(at, &p)?;
        }
        Ok(())
    }

    /// Connections open now (tests).
    pub fn open_connections(&self) -> usize {
        self.conns.len()
    }

    pub fn flush(&mut self) -> Result<(), crate::capture::file::FileError> {
        self.files.flush()
    }

    /// Closes every open connection and the file (shutdown).
    pub fn finish(&mut self) -> Result<(), crate::capture::file::FileError> {
        let at = SystemTime::now();
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for conn in ids {
            self.record(Event::Close { conn, at })?;
        }
        self.files.finish_current()
    }

    pub fn files(&self) -> Vec<std::path::PathBuf> {
        self.files.files()
    }

    /// Opens the first or next file; a new file starts with the handshake of
    /// every connection still open, so each file reassembles on its own.
    fn ensure_file(&mut self, at: SystemTime) -> Result<(), crate::capture::file::FileError> {
        if !self.files.needs_new_file() {
            return Ok(());
        }
        self.files.rotate(at)?;
        let handshakes: Vec<Vec<u8>> = self
            .conns
            .values()
            .flat_map(|c| c.flow.handshake())
            .collect();
        for p in handshakes {
            self.files.write(at, &p)?;
        }
        Ok(())
    }
}

/// Takes the whole frames at the front of `d.pending`, masked unless `clear`.
/// With `all`, takes the partial frame at the end too (blanked when masking:
/// an incomplete message cannot be masked field by field). Returns the bytes
/// and the number of frames.
fn take_ready(
    spec: &Spec,
    masked: &MaskedFields,
    d: &mut Direction,
    clear: bool,
    all: bool,
    blanked: &mut u64,
) -> (BytesMut, usize) {
    let framing = spec.framing();
    let mut cut = 0;
    let mut frames = 0;
    if !d.lost_sync {
        loop {
            match split_frame(framing.prefix, &d.pending[cut..], framing.max_frame) {
                Ok(Some(f)) => {
                    let start = cut + framing.prefix.len();
                    let end = cut + f.consumed;
                    if !clear && !f.header.session_control && end > start {
                        mask_or_blank(spec, masked, &mut d.pending[start..end], blanked);
                    }
                    cut = end;
                    frames += 1;
                }
                Ok(None) => break,
                Err(_) => {
                    d.lost_sync = true;
                    break;
                }
            }
        }
    }
    if d.lost_sync || all {
        if !clear {
            blank_payload(&mut d.pending[cut..]);
        }
        cut = d.pending.len();
    }
    (d.pending.split_to(cut), frames)
}

/// The segments of both directions of a batch, oldest first (a stable
/// merge: each direction is already in order).
fn in_time_order(batch: &Batch) -> impl Iterator<Item = (bool, &Segment, &[u8])> {
    let [server, client] = &batch.dirs;
    let (mut i, mut j, mut at_i, mut at_j) = (0, 0, 0usize, 0usize);
    std::iter::from_fn(move || {
        let next_client = match (client.segments.get(i), server.segments.get(j)) {
            (Some(c), Some(s)) => c.at <= s.at,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return None,
        };
        let (d, k, pos) = if next_client {
            (client, &mut i, &mut at_i)
        } else {
            (server, &mut j, &mut at_j)
        };
        let seg = &d.segments[*k];
        let end = (*pos + seg.len as usize).min(d.bytes.len());
        let bytes = &d.bytes[(*pos).min(end)..end];
        *k += 1;
        *pos = end;
        Some((next_client, seg, bytes))
    })
}

/// How many bytes at the front of `bytes` are whole frames, each listed in
/// `frames` as `(payload start, end, whether it is a message to mask)`; or
/// `None` when a length prefix cannot be read (the caller then takes the
/// slow path, which loses sync the same way as ever).
fn whole_frames(
    spec: &Spec,
    bytes: &[u8],
    frames: &mut Vec<(usize, usize, bool)>,
) -> Option<usize> {
    let framing = spec.framing();
    frames.clear();
    let mut cut = 0;
    loop {
        match split_frame(framing.prefix, &bytes[cut..], framing.max_frame) {
            Ok(Some(f)) => {
                let start = cut + framing.prefix.len();
                let end = cut + f.consumed;
                frames.push((start, end, !f.header.session_control && end > start));
                cut = end;
            }
            Ok(None) => return Some(cut),
            Err(_) => return None,
        }
    }
}

/// Masks one message payload in place; one the spec cannot read is blanked.
fn mask_or_blank(spec: &Spec, masked: &MaskedFields, payload: &mut [u8], blanked: &mut u64) {
    if mask_payload_with(spec, masked, payload).is_err() {
        blank_payload(payload);
        *blanked += 1;
    }
}
