//! The capture writer task of one service: turns tap events into synthetic TCP
//! packets, masks the messages in them, and writes rotating pcapng files. It
//! runs off the message path; the taps only ever `try_send` to it. This file
//! is the task (its queue, flushes, disk guard and drop logs) and a
//! service's capture set up; the events-to-packets work is
//! `writer/recorder.rs`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

mod recorder;

pub use recorder::Recorder;

use super::file::Rotation;
use super::tap::{Capture, Event};
use crate::config::ServiceConfig;
use crate::config::space::SpaceLimit;
use crate::iso8583::Spec;

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
