//! The journal's disk guard: the journal never takes the space what the
//! switch owes (SAF) needs (docs/journal.md, "The disk").
//!
//! A task of the supervisor reads, every [`GUARD_EVERY`], what the journal
//! takes of the store (on the store's own writer) and how full the store's
//! filesystem is (`statvfs`, on a blocking thread): never the message path.
//! Past `journal.max_size`, or with less than `journal.min_free` free (free
//! pages inside the store's file count as free: rows reuse them before the
//! file grows), it deletes the oldest day's rows, then the next, and when
//! only today's are left it pauses the journal: the writer drops what comes
//! (counted in `isoswitch_journal_paused_total`) while SAF keeps writing.
//! Once both are back within their limits, with a margin so that the
//! journal does not flap at the edge, it resumes by itself.
//!
//! On PostgreSQL the same guard holds `journal.max_size` alone: what the
//! journal takes is its day partitions' total (`pg_total_relation_size`),
//! the oldest day goes by dropping its partition, and the server's
//! filesystem, which a client cannot read, is the server's own to watch
//! (`journal.min_free` is refused there at `check`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::JournalCounters;
use crate::config::journal::JournalConfig;
use crate::store::Store;
use crate::store::StoreError;
use crate::store::disk::{DiskProbe, DiskStats, JournalSpace};

/// How often the guard reads the disk: a few pragmas on the store's writer
/// and one `statvfs`.
pub const GUARD_EVERY: Duration = Duration::from_secs(1);

/// At most one WARN line a minute while the journal is paused.
const WARN_EVERY: Duration = Duration::from_secs(60);

const DAY_MS: i64 = 86_400_000;

/// What the guard does after a reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Within the limits (or, paused, back within them with the margin).
    Write,
    /// Delete the rows older than this (the end of the oldest day).
    DropBefore(i64),
    /// Pause the journal (or stay paused).
    Pause,
}

/// The limits on a filesystem of `total` bytes, and why one is crossed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_size: u64,
    pub min_free: u64,
}

impl Limits {
    pub fn of(cfg: &JournalConfig, disk: DiskStats) -> Limits {
        Limits {
            max_size: cfg.max_size_bytes(disk.total),
            min_free: cfg.min_free_bytes(disk.total),
        }
    }

    /// A store on a PostgreSQL server: `max_size` alone.
    pub fn remote(cfg: &JournalConfig) -> Limits {
        Limits {
            max_size: cfg.max_size_remote_bytes(),
            min_free: 0,
        }
    }
}

/// The disk of a store whose filesystem is not read (a PostgreSQL
/// server's): never short of space, so only `max_size` decides.
pub const UNREAD_DISK: DiskStats = DiskStats {
    total: u64::MAX,
    avail: u64::MAX,
};

/// Free space as the journal sees it: the filesystem's, and the free pages
/// inside the store's file.
pub fn free(space: &JournalSpace, disk: DiskStats) -> u64 {
    disk.avail.saturating_add(space.reusable)
}

/// The guard's decision: pure, so that made-up disks test it.
pub fn decide(
    limits: Limits,
    space: &JournalSpace,
    disk: DiskStats,
    paused: bool,
    now_ms: i64,
) -> Action {
    let free = free(space, disk);
    let over = space.used > limits.max_size || free < limits.min_free;
    if over {
        let today = now_ms.div_euclid(DAY_MS) * DAY_MS;
        return match space.oldest {
            Some(oldest) if oldest < today => {
                Action::DropBefore((oldest.div_euclid(DAY_MS) + 1) * DAY_MS)
            }
            _ => Action::Pause,
        };
    }
    // Paused, resume only 5% inside both limits: rows written at the edge
    // would pause it again at once.
    let within_margin = space.used.saturating_add(limits.max_size / 20) <= limits.max_size
        && free >= limits.min_free.saturating_add(limits.min_free / 20);
    if paused && !within_margin {
        Action::Pause
    } else {
        Action::Write
    }
}

/// The guard task; cloned into each (re)start by the supervisor.
#[derive(Clone)]
pub struct Guard {
    pub store: Store,
    /// The store's file (its filesystem is the one read); `None`: a store
    /// on a PostgreSQL server, whose filesystem is not read.
    pub path: Option<PathBuf>,
    pub probe: Arc<dyn DiskProbe>,
    pub cfg: JournalConfig,
    pub counters: Arc<JournalCounters>,
    pub every: Duration,
    pub stop: CancellationToken,
}

impl Guard {
    pub async fn run(self) {
        let mut last_warn: Option<Instant> = None;
        let mut warned_rows = self.counters.paused_rows.load(Ordering::Relaxed);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.every) => {}
                _ = self.stop.cancelled() => return,
            }
            // Days are dropped one after the other without a pause between
            // them; each purge is itself in short transactions.
            loop {
                let (space, disk) = match self.read().await {
                    Ok(r) => r,
                    Err(e) => {
                        if last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                            last_warn = Some(Instant::now());
                            tracing::warn!(error = %e, path = ?self.path, "journal disk guard: cannot read the disk; will try again");
                        }
                        break;
                    }
                };
                let limits = match &self.path {
                    Some(_) => Limits::of(&self.cfg, disk),
                    None => Limits::remote(&self.cfg),
                };
                let paused = self.counters.paused.load(Ordering::Relaxed);
                match decide(limits, &space, disk, paused, super::now_millis()) {
                    Action::DropBefore(before) => {
                        tracing::warn!(
                            day = %super::params::day_of(before - 1),
                            journal_bytes = space.used,
                            max_size = limits.max_size,
                            free = free(&space, disk),
                            min_free = limits.min_free,
                            "journal: deleting its oldest day to stay within journal.max_size and journal.min_free"
                        );
                        match super::writer::purge_before(
                            &self.store,
                            before,
                            &self.counters,
                            &self.stop,
                        )
                        .await
                        {
                            Ok(_) if !self.stop.is_cancelled() => continue,
                            Ok(_) => return,
                            Err(e) => {
                                tracing::warn!(error = %e, "journal: its oldest day could not be deleted; will try again");
                                break;
                            }
                        }
                    }
                    Action::Pause => {
                        if !paused {
                            self.counters.paused.store(true, Ordering::Relaxed);
                        }
                        let rows = self.counters.paused_rows.load(Ordering::Relaxed);
                        if !paused || last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                            last_warn = Some(Instant::now());
                            tracing::warn!(
                                journal_bytes = space.used,
                                max_size = limits.max_size,
                                free = free(&space, disk),
                                min_free = limits.min_free,
                                rows_not_written = rows - warned_rows,
                                "journal PAUSED: past journal.max_size or journal.min_free with only today's rows left; exchanges are not journaled (isoswitch_journal_paused_total) while SAF keeps writing; it resumes by itself when space returns"
                            );
                            warned_rows = rows;
                        }
                    }
                    Action::Write => {
                        if paused {
                            self.counters.paused.store(false, Ordering::Relaxed);
                            let rows = self.counters.paused_rows.load(Ordering::Relaxed);
                            tracing::warn!(
                                journal_bytes = space.used,
                                free = free(&space, disk),
                                rows_not_written = rows - warned_rows,
                                "journal resumed: back within journal.max_size and journal.min_free"
                            );
                            warned_rows = rows;
                        }
                    }
                }
                break;
            }
        }
    }

    async fn read(&self) -> Result<(JournalSpace, DiskStats), ReadError> {
        let space = self.store.journal_space().await?;
        let Some(path) = self.path.clone() else {
            return Ok((space, UNREAD_DISK));
        };
        let probe = Arc::clone(&self.probe);
        let at = path.clone();
        let disk = tokio::task::spawn_blocking(move || probe.stat(&at))
            .await?
            .map_err(|source| ReadError::Disk { path, source })?;
        Ok((space, disk))
    }
}

/// Why a pass of the guard could not read the journal's size or the disk
/// it lives on; the pass is skipped and tried again.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("journal size: {0}")]
    Space(#[from] StoreError),
    #[error("{}: {source}", .path.display())]
    Disk {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("disk probe: {0}")]
    Probe(#[from] tokio::task::JoinError),
}

#[cfg(test)]
mod tests;
