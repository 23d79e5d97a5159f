//! The journal's two tasks, both owned by the switch's supervisor and
//! restarted if they die:
//!
//! - the writer: takes what the message path queued, waits
//!   `journal.batch_interval` for more (it wakes once per batch, never per
//!   row) and inserts the batch in one transaction, a few multi-row
//!   statements (the rows come masked; their texts are made here). A kill -9
//!   loses what is queued and the batch being written: about one batch
//!   interval plus one commit of rows. A failed insert loses its batch,
//!   counted and logged, never retried into a growing backlog.
//! - retention: every minute, deletes rows older than `journal.retain` a
//!   bounded batch at a time (one short transaction each, a pause between),
//!   so the store's writer is never held for long. On PostgreSQL the store
//!   drops whole days older than that instead, off the writer's connection
//!   (`store::postgres`, docs/journal.md "Retention").

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use super::{Entry, JournalCounters};
use crate::store::Store;

/// Most entries written in one transaction.
pub const MAX_BATCH: usize = 4096;

/// Rows deleted per retention transaction: about 12 ms of the store's
/// writer on a million-row SQLite table in a debug build, commit included
/// (docs/journal.md has the measurement).
pub const PURGE_BATCH: usize = 500;

/// How often retention runs, and the pause between two of its batches.
const PURGE_EVERY: Duration = Duration::from_secs(60);
const PURGE_PAUSE: Duration = Duration::from_millis(10);

/// One failed-insert line per this long at most.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

/// What the writer task needs; cloned into each (re)start.
#[derive(Clone)]
pub struct WriterTask {
    pub rx: Arc<Mutex<mpsc::Receiver<Entry>>>,
    pub store: Store,
    pub counters: Arc<JournalCounters>,
    pub batch_interval: Duration,
    pub stop: CancellationToken,
}

impl WriterTask {
    pub async fn run(self) {
        let mut rx = self.rx.lock().await;
        let mut last_error: Option<Instant> = None;
        loop {
            let first = tokio::select! {
                first = rx.recv() => first,
                _ = self.stop.cancelled() => None,
            };
            let Some(first) = first else {
                // Stopping (or every sender gone): write what is left.
                let mut rest = Vec::new();
                while let Ok(e) = rx.try_recv() {
                    rest.push(e);
                }
                if !rest.is_empty() {
                    self.write(rest, &mut last_error).await;
                }
                return;
            };
            let mut batch = vec![first];
            // Gather for one interval: one transaction per interval, however
            // busy, and the batch a kill -9 can lose stays that small.
            tokio::select! {
                _ = tokio::time::sleep(self.batch_interval) => {}
                _ = self.stop.cancelled() => {}
            }
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(e) => batch.push(e),
                    Err(_) => break,
                }
            }
            self.write(batch, &mut last_error).await;
        }
    }

    async fn write(&self, batch: Vec<Entry>, last_error: &mut Option<Instant>) {
        if batch.is_empty() {
            return;
        }
        // The disk guard paused the journal: the disk is kept for SAF (and
        // no row's texts are made for nothing).
        if self.counters.paused.load(Ordering::Relaxed) {
            self.counters
                .paused_rows
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            return;
        }
        let mut rows = Vec::with_capacity(batch.len());
        let mut admin = Vec::new();
        for entry in batch {
            match entry {
                // The row's texts, made here, off the message path.
                Entry::Exchange(raw) => rows.push(raw.row()),
                Entry::Row(row) => rows.push(row),
                Entry::Admin(a) => admin.push(a),
            }
        }
        let (n_rows, n_admin) = (rows.len() as u64, admin.len() as u64);
        let outcomes: Vec<(i64, String)> = rows
            .iter()
            .filter(|r| r.outcome.text() != "answered")
            .map(|r| (r.t_in, r.outcome.text().to_string()))
            .collect();
        match self.store.journal_put(rows, admin).await {
            Ok(_) => {
                let c = &self.counters;
                for (t, outcome) in &outcomes {
                    c.count_today(*t, outcome);
                }
                c.written.fetch_add(n_rows, Ordering::Relaxed);
                c.admin_written.fetch_add(n_admin, Ordering::Relaxed);
            }
            Err(e) => {
                self.counters
                    .failed
                    .fetch_add(n_rows + n_admin, Ordering::Relaxed);
                if last_error.is_none_or(|t| t.elapsed() >= ERROR_LOG_EVERY) {
                    *last_error = Some(Instant::now());
                    tracing::error!(error = %e, rows = n_rows + n_admin, "journal: rows not written (counted in isoswitch_journal_failed_total)");
                }
            }
        }
    }
}

/// Deletes what is older than `retain`, forever.
pub async fn retain_forever(
    store: Store,
    retain: Duration,
    counters: Arc<JournalCounters>,
    stop: CancellationToken,
) {
    let mut first = true;
    loop {
        let wait = if first {
            Duration::from_secs(5)
        } else {
            PURGE_EVERY
        };
        first = false;
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return,
        }
        let keep = i64::try_from(retain.as_millis()).unwrap_or(i64::MAX);
        let before = super::now_millis().saturating_sub(keep);
        if let Err(e) = purge_before(&store, before, &counters, &stop).await {
            tracing::warn!(error = %e, "journal retention: will try again");
        }
    }
}

/// Deletes rows older than `before`, a batch at a time, until none is left.
pub async fn purge_before(
    store: &Store,
    before: i64,
    counters: &JournalCounters,
    stop: &CancellationToken,
) -> Result<u64, crate::store::StoreError> {
    let mut total = 0;
    loop {
        let n = store.journal_purge(before, PURGE_BATCH).await?;
        total += n;
        counters.purged.fetch_add(n, Ordering::Relaxed);
        if n == 0 || stop.is_cancelled() {
            return Ok(total);
        }
        tokio::time::sleep(PURGE_PAUSE).await;
    }
}
