//! The capture writer task of one service: turns tap events into synthetic TCP
//! packets, masks the messages in them, and writes rotating pcapng files. It
//! runs off the message path; the taps only ever `try_send` to it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use bytes::BytesMut;
use tokio::sync::{mpsc, watch};

use super::file::{RotatingFiles, Rotation};
use super::mask::{MaskedFields, blank_payload, mask_payload_with};
use super::tap::Event;
use super::tcp::TcpFlow;
use crate::iso8583::Spec;
use crate::link::Service;
use crate::wire::prefix::split_frame;

/// How often buffered packets reach the file and drops are reported.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// How often the writer drains its queue.
const DRAIN_EVERY: Duration = Duration::from_millis(10);
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
    chunks: std::collections::VecDeque<usize>,
}

impl Direction {
    /// The sizes of the next `n` bytes as they came.
    fn take_chunks(&mut self, n: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut left = n;
        while left > 0 {
            let Some(c) = self.chunks.pop_front() else {
                out.push(left);
                break;
            };
            if c > left {
                self.chunks.push_front(c - left);
                out.push(left);
                break;
            }
            out.push(c);
            left -= c;
        }
        out
    }
}

/// Packets for `bytes`, one per original chunk.
fn packets(flow: &mut TcpFlow, from_client: bool, bytes: &[u8], chunks: &[usize]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 0;
    for &c in chunks {
        let end = (at + c).min(bytes.len());
        out.extend(flow.data(from_client, &bytes[at..end]));
        at = end;
    }
    out
}

struct Conn {
    flow: TcpFlow,
    dirs: [Direction; 2],
}

/// Events to packets, for one service; separate from the task for tests.
pub struct Recorder {
    spec: Arc<Spec>,
    masked: MaskedFields,
    clear: bool,
    files: RotatingFiles,
    conns: HashMap<u64, Conn>,
    /// Messages that could not be read for masking and were blanked.
    pub blanked: u64,
}

impl Recorder {
    pub fn new(spec: Arc<Spec>, cfg: &WriterConfig) -> Result<Recorder, super::file::FileError> {
        Ok(Recorder {
            masked: MaskedFields::of(&spec),
            spec,
            clear: cfg.clear,
            files: RotatingFiles::new(cfg.rotation.clone())?,
            conns: HashMap::new(),
            blanked: 0,
        })
    }

    /// A recorder writing one file at `path` (`replay --record`).
    pub fn single_file(spec: Arc<Spec>, path: &std::path::Path, clear: bool) -> Recorder {
        Recorder {
            masked: MaskedFields::of(&spec),
            spec,
            clear,
            files: RotatingFiles::single(path),
            conns: HashMap::new(),
            blanked: 0,
        }
    }

    /// Records one event.
    pub fn record(&mut self, ev: Event) -> Result<(), super::file::FileError> {
        match ev {
            Event::Open {
                conn,
                client,
                server,
                at,
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
                    },
                );
            }
            Event::Data {
                conn,
                from_client,
                offset,
                bytes,
                at,
            } => {
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
                    let chunks = d.take_chunks(flushed.len());
                    let packets = packets(&mut c.flow, from_client, &flushed, &chunks);
                    c.flow.skip(from_client, gap);
                    d.lost_sync = true;
                    self.write_all(at, packets)?;
                }
                let Some(c) = self.conns.get_mut(&conn) else {
                    return Ok(());
                };
                let d = &mut c.dirs[usize::from(from_client)];
                d.next_offset = offset + bytes.len() as u64;
                d.pending.extend_from_slice(&bytes);
                d.chunks.push_back(bytes.len());
                let (ready, _) = take_ready(
                    &self.spec,
                    &self.masked,
                    d,
                    self.clear,
                    false,
                    &mut self.blanked,
                );
                if !ready.is_empty() {
                    let chunks = d.take_chunks(ready.len());
                    let packets = packets(&mut c.flow, from_client, &ready, &chunks);
                    self.write_all(at, packets)?;
                }
            }
            Event::Close { conn, at } => {
                if let Some(mut c) = self.conns.remove(&conn) {
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
                        let chunks = d.take_chunks(rest.len());
                        packets.extend(self::packets(&mut c.flow, from_client, &rest, &chunks));
                    }
                    packets.extend(c.flow.close());
                    // The last bytes and FINs stay in the file the connection
                    // is in, even past its size: a file of FINs alone would
                    // reassemble nothing.
                    if !self.files.has_file() {
                        self.files.rotate(at)?;
                    }
                    for p in packets {
                        self.files.write(at, &p)?;
                    }
                }
            }
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

    fn write_all(
        &mut self,
        at: SystemTime,
        packets: Vec<Vec<u8>>,
    ) -> Result<(), super::file::FileError> {
        if packets.is_empty() {
            return Ok(());
        }
        self.ensure_file(at)?;
        for p in packets {
            self.files.write(at, &p)?;
        }
        Ok(())
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
                        let payload = &mut d.pending[start..end];
                        if mask_payload_with(spec, masked, payload).is_err() {
                            blank_payload(payload);
                            *blanked += 1;
                        }
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

/// The writer task: runs until `shutdown`, then records what is still queued,
/// closes every connection and the file. Errors writing a file are logged
/// (rate-limited); the events meanwhile are counted as dropped.
///
/// The work runs on a thread of its own (tokio's blocking pool): a direct
/// write of a 1 MiB chunk waits for the device, and must not hold up a
/// runtime worker and the connections queued on it. A panic there is raised
/// here, for the supervisor.
pub async fn run(
    service: Arc<Service>,
    cfg: WriterConfig,
    rx: mpsc::Receiver<Event>,
    shutdown: watch::Receiver<bool>,
) {
    let worker = tokio::task::spawn_blocking(move || run_blocking(service, cfg, rx, shutdown));
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

fn run_blocking(
    service: Arc<Service>,
    cfg: WriterConfig,
    mut rx: mpsc::Receiver<Event>,
    shutdown: watch::Receiver<bool>,
) {
    let mut recorder = match Recorder::new(Arc::clone(&service.spec), &cfg) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(service = service.name(), error = %e, "capture disabled: cannot use the capture directory");
            // Keep draining so that nothing waits on a full queue.
            while !stopping(&shutdown) {
                std::thread::sleep(DRAIN_EVERY);
                loop {
                    match rx.try_recv() {
                        Ok(_) => {
                            service
                                .counters
                                .capture_dropped
                                .fetch_add(1, Ordering::Relaxed);
                        }
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
    while !stopping(&shutdown) {
        std::thread::sleep(DRAIN_EVERY);
        loop {
            match rx.try_recv() {
                Ok(ev) => {
                    if let Err(e) = recorder.record(ev) {
                        service
                            .counters
                            .capture_dropped
                            .fetch_add(1, Ordering::Relaxed);
                        if last_error_log.is_none_or(|t| t.elapsed() >= DROP_LOG_EVERY) {
                            last_error_log = Some(std::time::Instant::now());
                            tracing::error!(service = service.name(), error = %e, "capture write failed");
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
        if last_flush.elapsed() >= FLUSH_EVERY {
            last_flush = std::time::Instant::now();
            if let Err(e) = recorder.flush() {
                tracing::error!(service = service.name(), error = %e, "capture flush failed");
            }
            let drops = service.counters.capture_dropped.load(Ordering::Relaxed);
            if drops > reported_drops && last_drop_log.is_none_or(|t| t.elapsed() >= DROP_LOG_EVERY)
            {
                tracing::warn!(
                    service = service.name(),
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
        tracing::error!(service = service.name(), error = %e, "capture could not be closed cleanly");
    }
}

/// A capture set up on a service that has not started yet: the writer task
/// still to spawn.
pub struct Pending {
    cfg: WriterConfig,
    rx: mpsc::Receiver<Event>,
}

/// Turns capture on for `service` if its config asks for it (warning when in
/// clear). Call before the service is shared; spawn [`Pending::run`] after.
pub fn attach(service: &mut Service) -> Option<Pending> {
    let cfg = service.config.capture.clone().filter(|c| c.enabled)?;
    let (capture, rx) = super::Capture::channel(cfg.queue);
    service.capture = Some(capture);
    if cfg.clear {
        tracing::warn!(
            service = service.name(),
            directory = %cfg.directory.display(),
            "capture in CLEAR: card numbers, track data, PIN blocks, EMV data and MACs are written as they are; test systems only"
        );
    } else {
        tracing::info!(service = service.name(), directory = %cfg.directory.display(), "capture on (masked)");
    }
    Some(Pending {
        cfg: WriterConfig {
            rotation: Rotation {
                directory: cfg.directory.clone(),
                prefix: file_prefix(service.name()),
                max_file_bytes: cfg.max_file_bytes,
                max_files: cfg.max_files,
                max_total_bytes: cfg.max_total_bytes,
            },
            clear: cfg.clear,
        },
        rx,
    })
}

impl Pending {
    /// The writer task of the service.
    pub async fn run(self, service: Arc<Service>, shutdown: watch::Receiver<bool>) {
        run(service, self.cfg, self.rx, shutdown).await
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
mod tests {
    use super::*;
    use crate::capture::read;
    use crate::iso8583::samples;
    use bytes::Bytes;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "isoswitch-writer-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn recorder(dir: &std::path::Path, max_file_bytes: u64, max_files: usize) -> Recorder {
        let spec = Arc::new(Spec::builtin("iso87ascii").unwrap());
        let cfg = WriterConfig {
            rotation: Rotation {
                directory: dir.to_path_buf(),
                prefix: "isoswitch-t".into(),
                max_file_bytes,
                max_files,
                max_total_bytes: u64::MAX,
            },
            clear: false,
        };
        Recorder::new(spec, &cfg).unwrap()
    }

    fn framed(spec: &Spec, stan: u32) -> Vec<u8> {
        let mut d = samples::purchase(spec);
        d.set_text(11, format!("{stan:06}"));
        let p = spec.encode(&d).unwrap();
        let mut out = BytesMut::new();
        spec.framing().prefix.encode(p.len(), &mut out).unwrap();
        out.extend_from_slice(&p);
        out.to_vec()
    }

    fn open(r: &mut Recorder, conn: u64) {
        r.record(Event::Open {
            conn,
            client: "127.0.0.1:40000".parse().unwrap(),
            server: "127.0.0.1:5000".parse().unwrap(),
            at: SystemTime::now(),
        })
        .unwrap();
    }

    fn data(r: &mut Recorder, conn: u64, offset: u64, bytes: &[u8]) {
        r.record(Event::Data {
            conn,
            from_client: true,
            offset,
            bytes: Bytes::copy_from_slice(bytes),
            at: SystemTime::now(),
        })
        .unwrap();
    }

    #[test]
    fn rotation_keeps_the_newest_files_each_reassembling_alone() {
        let dir = temp_dir("rotate");
        let spec = Spec::builtin("iso87ascii").unwrap();
        let mut r = recorder(&dir, 4096, 2);
        open(&mut r, 1);
        let mut offset = 0;
        for stan in 0..100 {
            let f = framed(&spec, stan);
            data(&mut r, 1, offset, &f);
            offset += f.len() as u64;
        }
        r.finish().unwrap();
        let files = super::super::file::list(&dir, "isoswitch-t").unwrap();
        assert_eq!(files.len(), 2, "the oldest were deleted");
        for f in &files {
            let p = read::read_file(f).unwrap();
            let c = read::connections(&p.segments);
            assert_eq!(c.len(), 1);
            assert!(c[0].saw_syn, "each file starts with a handshake");
            assert!(c[0].to_server.gaps.is_empty(), "{:?}", c[0].to_server.gaps);
            let (frames, cut) = read::frames(&spec, &c[0].to_server);
            assert!(cut.is_none() && !frames.is_empty());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_dropped_event_leaves_a_gap_and_blanks_what_follows() {
        let dir = temp_dir("gap");
        let spec = Spec::builtin("iso87ascii").unwrap();
        let mut r = recorder(&dir, 1 << 20, 4);
        open(&mut r, 7);
        let a = framed(&spec, 1);
        let b = framed(&spec, 2);
        data(&mut r, 7, 0, &a);
        // The event with `b` was dropped; the next one arrives.
        data(&mut r, 7, (a.len() + b.len()) as u64, &a);
        r.finish().unwrap();
        let files = super::super::file::list(&dir, "isoswitch-t").unwrap();
        let p = read::read_file(&files[0]).unwrap();
        let c = read::connections(&p.segments);
        let s = &c[0].to_server;
        assert_eq!(s.bytes.len(), a.len(), "reassembly stops at the gap");
        assert_eq!(s.gaps.len(), 1);
        let after: Vec<u8> = p
            .segments
            .iter()
            .rev()
            .find(|s| !s.payload.is_empty())
            .unwrap()
            .payload
            .clone();
        assert!(after.iter().all(|&b| b == 0), "after a gap: blanked");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
