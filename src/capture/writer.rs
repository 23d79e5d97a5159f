//! The capture writer task of one service: turns tap events into synthetic TCP
//! packets, masks the messages in them, and writes rotating pcapng files. It
//! runs off the message path; the taps only ever `try_send` to it.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::config::space::SpaceLimit;
use bytes::BytesMut;
use tokio::sync::{mpsc, watch};

use super::file::{RotatingFiles, Rotation};
use super::mask::{MaskedFields, blank_payload, mask_payload_with};
use super::tap::{Batch, Capture, Event, Segment, Staged};
use super::tcp::{MAX_SEGMENT, TcpFlow};
use crate::config::ServiceConfig;
use crate::iso8583::Spec;
use crate::wire::prefix::split_frame;

/// How often buffered packets reach the file and drops are reported.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// How often the writer drains its queue and takes the connections' staged
/// batches. Each pass wakes a thread (a visible cost on a virtual machine);
/// the copies wait in their connection's batch meanwhile, never on the
/// message path. 20 ms, not 50: smaller batches stay in cache between the
/// taps' copies and the writer's read, which measured cheaper than the
/// wake-ups they add (BENCHMARKS.md, "Capture cost"; the run is in git history).
const DRAIN_EVERY: Duration = Duration::from_millis(20);
/// Dropped events are logged at most this often.
const DROP_LOG_EVERY: Duration = Duration::from_secs(10);

/// What the writer needs besides its events.
#[derive(Clone, Debug)]
pub struct WriterConfig {
    pub rotation: Rotation,
    /// Keep the bytes in clear (no masking).
    pub clear: bool,
}

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
) -> Result<(), super::file::FileError> {
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
    pub fn new(spec: Arc<Spec>, cfg: &WriterConfig) -> Result<Recorder, super::file::FileError> {
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
    pub fn record(&mut self, ev: Event) -> Result<(), super::file::FileError> {
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
    fn take_staged(&mut self, conn: u64) -> Result<(), super::file::FileError> {
        let Some(staged) = self.conns.get(&conn).and_then(|c| c.staged.clone()) else {
            return Ok(());
        };
        let batch = staged.take();
        let result = self.write_batch(conn, &batch);
        staged.give_back(batch);
        result
    }

    fn write_batch(&mut self, conn: u64, batch: &Batch) -> Result<(), super::file::FileError> {
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
    ) -> Result<(), super::file::FileError> {
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

    fn close(&mut self, conn: u64, at: SystemTime) -> Result<(), super::file::FileError> {
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

    pub fn flush(&mut self) -> Result<(), super::file::FileError> {
        self.files.flush()
    }

    /// Closes every open connection and the file (shutdown).
    pub fn finish(&mut self) -> Result<(), super::file::FileError> {
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
    fn ensure_file(&mut self, at: SystemTime) -> Result<(), super::file::FileError> {
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

/// The writer task: runs until `shutdown`, then records what is still queued,
/// closes every connection and the file. Errors writing a file are logged
/// (rate-limited); the events meanwhile are counted as dropped.
///
/// The work runs on a thread of its own (tokio's blocking pool): a direct
/// write of a 1 MiB chunk waits for the device, and must not hold up a
/// runtime worker and the connections queued on it. A panic there is raised
/// here, for the supervisor.
pub async fn run(
    service: Arc<str>,
    spec: Arc<Spec>,
    capture: Capture,
    cfg: WriterConfig,
    rx: mpsc::Receiver<Event>,
    shutdown: watch::Receiver<bool>,
    min_free: SpaceLimit,
) {
    let worker = tokio::task::spawn_blocking(move || {
        let guard = DiskGuard {
            probe: &crate::store::disk::Statvfs,
            min_free,
        };
        run_blocking(&service, spec, &capture, cfg, rx, shutdown, &guard)
    });
    if let Err(e) = worker.await
        && e.is_panic()
    {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Whether the switch is stopping (a change, or the sender gone).
fn stopping(s: &watch::Receiver<bool>) -> bool {
    !matches!(s.has_changed(), Ok(false))
}

/// The capture's disk guard: its probe and `min_free` (docs/capture.md).
struct DiskGuard<'a> {
    probe: &'a dyn crate::store::disk::DiskProbe,
    min_free: SpaceLimit,
}

fn run_blocking(
    service: &str,
    spec: Arc<Spec>,
    capture: &Capture,
    cfg: WriterConfig,
    mut rx: mpsc::Receiver<Event>,
    shutdown: watch::Receiver<bool>,
    guard: &DiskGuard<'_>,
) {
    let mut recorder = match Recorder::new(spec, &cfg) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(service, error = %e, "capture disabled: cannot use the capture directory");
            // Keep draining so that nothing waits on a full queue.
            while !stopping(&shutdown) {
                std::thread::sleep(DRAIN_EVERY);
                loop {
                    match rx.try_recv() {
                        Ok(_) => capture.count_dropped(1),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => return,
                    }
                }
            }
            return;
        }
    };
    // The writer wakes on a timer and drains what queued meanwhile, rather
    // than on each event: a `try_send` to a receiver that is not waiting
    // wakes no one, so the connections' reads and writes cause no wake-ups.
    let mut last_flush = std::time::Instant::now();
    let mut reported_drops = 0u64;
    let mut last_drop_log: Option<std::time::Instant> = None;
    let mut last_error_log: Option<std::time::Instant> = None;
    let mut last_disk = std::time::Instant::now();
    let mut last_pause_log: Option<std::time::Instant> = None;
    while !stopping(&shutdown) {
        std::thread::sleep(DRAIN_EVERY);
        if last_disk.elapsed() >= super::disk::DISK_EVERY {
            last_disk = std::time::Instant::now();
            guard_disk(service, &mut recorder, guard, &mut last_pause_log);
        }
        loop {
            match rx.try_recv() {
                Ok(ev) => {
                    if let Err(e) = recorder.record(ev) {
                        capture.count_dropped(1);
                        if last_error_log.is_none_or(|t| t.elapsed() >= DROP_LOG_EVERY) {
                            last_error_log = Some(std::time::Instant::now());
                            tracing::error!(service, error = %e, "capture write failed");
                        }
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    let _ = recorder.finish();
                    return;
                }
            }
        }
        capture.count_dropped(recorder.rotating().take_skipped());
        if last_flush.elapsed() >= FLUSH_EVERY {
            last_flush = std::time::Instant::now();
            if let Err(e) = recorder.flush() {
                tracing::error!(service, error = %e, "capture flush failed");
            }
            let drops = capture.dropped();
            if drops > reported_drops && last_drop_log.is_none_or(|t| t.elapsed() >= DROP_LOG_EVERY)
            {
                tracing::warn!(
                    service,
                    dropped = drops - reported_drops,
                    total = drops,
                    "capture events dropped: the writer could not keep up"
                );
                reported_drops = drops;
                last_drop_log = Some(std::time::Instant::now());
            }
        }
    }
    while let Ok(ev) = rx.try_recv() {
        let _ = recorder.record(ev);
    }
    if let Err(e) = recorder.finish() {
        tracing::error!(service, error = %e, "capture could not be closed cleanly");
    }
}

/// One reading of the capture directory's filesystem: old files deleted,
/// paused or resumed, logged (while paused, at WARN at most once a minute).
fn guard_disk(
    service: &str,
    recorder: &mut Recorder,
    guard: &DiskGuard<'_>,
    last_log: &mut Option<std::time::Instant>,
) {
    let every = std::time::Duration::from_secs(60);
    let files = recorder.rotating();
    match super::disk::keep_free(files, guard.probe, guard.min_free) {
        Ok(step) => {
            if step.deleted > 0 {
                tracing::warn!(
                    service,
                    deleted = step.deleted,
                    free = step.avail,
                    min_free = step.min_free,
                    "capture: oldest files deleted to keep min_free free"
                );
            }
            let paused = files.is_paused();
            if step.paused == Some(false) {
                tracing::warn!(
                    service,
                    free = step.avail,
                    "capture resumed: back above min_free"
                );
                *last_log = None;
            } else if paused
                && (step.paused == Some(true) || last_log.is_none_or(|t| t.elapsed() >= every))
            {
                *last_log = Some(std::time::Instant::now());
                tracing::warn!(
                    service,
                    free = step.avail,
                    min_free = step.min_free,
                    "capture PAUSED: its filesystem is under min_free with no old file left to delete; copies are dropped (capture_dropped) until space returns"
                );
            }
        }
        Err(e) => {
            if last_log.is_none_or(|t| t.elapsed() >= every) {
                *last_log = Some(std::time::Instant::now());
                tracing::warn!(service, error = %e, "capture: cannot read its filesystem's free space");
            }
        }
    }
}

/// A capture set up for a service that has not started yet: the writer task
/// still to spawn.
pub struct Pending {
    service: Arc<str>,
    spec: Arc<Spec>,
    capture: Capture,
    cfg: WriterConfig,
    rx: mpsc::Receiver<Event>,
    min_free: SpaceLimit,
}

/// The capture `config` asks for (warning when in clear), as the handle the
/// service's connections take taps from and the writer still to spawn
/// ([`Pending::run`]).
pub fn open(config: &ServiceConfig, spec: Arc<Spec>) -> Option<(Capture, Pending)> {
    let cfg = config.capture.clone().filter(|c| c.enabled)?;
    let (capture, rx) = super::Capture::channel(cfg.queue);
    let service = config.name.as_str();
    if cfg.clear {
        tracing::warn!(
            service,
            directory = %cfg.directory.display(),
            "capture in CLEAR: card numbers, track data, PIN blocks, EMV data and MACs are written as they are; test systems only"
        );
    } else {
        tracing::info!(service, directory = %cfg.directory.display(), "capture on (masked)");
    }
    let pending = Pending {
        service: service.into(),
        spec,
        capture: capture.clone(),
        cfg: WriterConfig {
            rotation: Rotation {
                directory: cfg.directory.clone(),
                prefix: file_prefix(service),
                max_file_bytes: cfg.max_file_bytes,
                max_files: cfg.max_files,
                max_total_bytes: cfg.max_total_bytes,
            },
            clear: cfg.clear,
        },
        rx,
        min_free: cfg.min_free.unwrap_or(super::disk::DEFAULT_MIN_FREE),
    };
    Some((capture, pending))
}

impl Pending {
    /// The writer task of the service.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        run(
            self.service,
            self.spec,
            self.capture,
            self.cfg,
            self.rx,
            shutdown,
            self.min_free,
        )
        .await
    }
}

/// `isoswitch-<service>`, with anything but letters, digits, `-` and `_`
/// replaced, so that a service name cannot reach outside the directory.
pub fn file_prefix(service: &str) -> String {
    let safe: String = service
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("isoswitch-{safe}")
}

#[cfg(test)]
mod tests;
