//! The admin audit, always on: every change, every read of card
//! transactions (the journal, the SAF listing) and every refused token is
//! recorded in the store's `admin_log` (kept `admin.audit_retain`, 400 days
//! by default, whether the journal is on or not) and written to the log.
//!
//! **A flood cannot fill the disk.** Refused tokens are not a row each: they
//! are counted per peer address and written once a second, one row per peer
//! with the count, at most [`PEER_ROWS_PER_SECOND`] peers a second and the
//! rest summed in one more row; the book holds at most [`MAX_PEERS`]
//! addresses. A wrong-token flood writes at most five rows a second.
//!
//! **Lockout.** A peer whose tokens are refused `admin.max_refused_tokens`
//! times within `admin.lockout` gets 429 on every request that needs a
//! token, for `admin.lockout` (PCI DSS 8.3.4); the open paths stay open.
//!
//! Rows wait in a bounded queue for the audit's writer task (one
//! transaction a second); a full queue drops the row, counted, and the log
//! still has it. Without a store the audit is the log alone.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::AdminConfig;
use crate::journal::{AdminRow, now_millis};
use crate::store::Store;

/// Peers whose refusals get a row of their own each second; the others'
/// are summed in one row.
pub const PEER_ROWS_PER_SECOND: usize = 4;
/// Peer addresses the refusal book tracks; past it, refusals are only
/// counted (in the summary row) and their peers are not locked out.
pub const MAX_PEERS: usize = 4096;
/// Rows waiting for the writer.
const QUEUE: usize = 4096;
/// How often the writer writes (and the refusal book is flushed).
const WRITE_EVERY: Duration = Duration::from_secs(1);
/// How often retention runs, and its batch.
const PURGE_EVERY: Duration = Duration::from_secs(3600);
const PURGE_BATCH: usize = 500;

/// What the audit has done, for metrics and the status.
#[derive(Debug, Default)]
pub struct AuditCounters {
    pub written: AtomicU64,
    /// Rows lost to a full queue or a failed insert (the log has them).
    pub lost: AtomicU64,
    pub purged: AtomicU64,
    /// Tokens refused, and requests answered 429 by a lockout.
    pub refused: AtomicU64,
    pub locked_out: AtomicU64,
}

/// One peer's refusals since the last flush, and its lockout.
#[derive(Debug)]
struct PeerBook {
    refused: u64,
    throttled: u64,
    method: String,
    path: String,
    why: &'static str,
    strikes: u32,
    first_strike: Instant,
    locked_until: Option<Instant>,
}

/// Refused tokens by peer, between two flushes.
#[derive(Debug, Default)]
struct RefusalBook {
    peers: HashMap<IpAddr, PeerBook>,
    /// Refusals of peers the book had no room for.
    untracked: u64,
}

/// What a refusal means for the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 401: try again with the right token.
    Unauthorized,
    /// This refusal locked the peer out (answered 401; the next get 429).
    LockedOut,
}

/// The admin audit. Cheap to share.
pub struct Audit {
    tx: Option<mpsc::Sender<AdminRow>>,
    book: Mutex<RefusalBook>,
    max_strikes: u32,
    lockout: Duration,
    pub counters: Arc<AuditCounters>,
}

impl std::fmt::Debug for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Audit")
            .field("stored", &self.tx.is_some())
            .finish_non_exhaustive()
    }
}

impl Audit {
    /// An audit that writes to `store` (when there is one): the writer and
    /// retention tasks run under `supervisor` until it stops.
    pub fn start(
        cfg: &AdminConfig,
        store: Option<Store>,
        supervisor: &Arc<crate::link::supervisor::Supervisor>,
    ) -> Arc<Audit> {
        let stored = store.map(|store| (store, mpsc::channel(QUEUE)));
        let audit = Arc::new(Audit {
            tx: stored.as_ref().map(|(_, (tx, _))| tx.clone()),
            ..Audit::log_only(cfg)
        });
        if let Some((store, (_, rx))) = stored {
            let rx = Arc::new(tokio::sync::Mutex::new(rx));
            let writer = Arc::clone(&audit);
            let (wstore, stop) = (store.clone(), supervisor.token());
            supervisor.spawn_critical("admin-audit".into(), supervisor.token(), move || {
                let (audit, store, rx, stop) = (
                    Arc::clone(&writer),
                    wstore.clone(),
                    Arc::clone(&rx),
                    stop.clone(),
                );
                async move { audit.write_forever(store, rx, stop).await }
            });
            let (retain, counters, stop) = (
                cfg.audit_retain,
                Arc::clone(&audit.counters),
                supervisor.token(),
            );
            supervisor.spawn_critical(
                "admin-audit-retention".into(),
                supervisor.token(),
                move || retain_forever(store.clone(), retain, Arc::clone(&counters), stop.clone()),
            );
        }
        audit
    }

    /// An audit that only logs (no store), with `cfg`'s lockout.
    pub fn log_only(cfg: &AdminConfig) -> Audit {
        Audit {
            tx: None,
            book: Mutex::default(),
            max_strikes: cfg.max_refused_tokens,
            lockout: cfg.lockout,
            counters: Arc::default(),
        }
    }

    /// Records an admin row (a change, a read of card transactions): to the
    /// log at once, to the store with the next write.
    pub fn record(&self, row: AdminRow) {
        tracing::info!(
            target: "isoswitch::admin_audit",
            peer = %row.peer,
            action = %row.action,
            method = %row.method,
            path = ?row.path,
            status = row.status,
            outcome = %row.outcome,
            "admin audit"
        );
        self.queue(row);
    }

    fn queue(&self, row: AdminRow) {
        if let Some(tx) = &self.tx
            && tx.try_send(row).is_err()
        {
            self.counters.lost.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How long `peer` stays locked out, if it is; its request is counted.
    pub fn locked(&self, peer: Option<IpAddr>, now: Instant) -> Option<Duration> {
        let ip = peer?;
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        let entry = book.peers.get_mut(&ip)?;
        let left = entry.locked_until?.checked_duration_since(now)?;
        if left.is_zero() {
            return None;
        }
        entry.throttled += 1;
        self.counters.locked_out.fetch_add(1, Ordering::Relaxed);
        Some(left)
    }

    /// Counts a refused token from `peer`; written with the next flush.
    pub fn refused(
        &self,
        peer: Option<IpAddr>,
        method: &str,
        path: &str,
        why: &'static str,
        now: Instant,
    ) -> Refusal {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        let Some(ip) = peer else {
            book.untracked += 1;
            return Refusal::Unauthorized;
        };
        if !book.peers.contains_key(&ip) && book.peers.len() >= MAX_PEERS {
            book.forget_idle(now, self.lockout);
            if book.peers.len() >= MAX_PEERS {
                book.untracked += 1;
                return Refusal::Unauthorized;
            }
        }
        let entry = book.peers.entry(ip).or_insert_with(|| PeerBook {
            refused: 0,
            throttled: 0,
            method: String::new(),
            path: String::new(),
            why,
            strikes: 0,
            first_strike: now,
            locked_until: None,
        });
        entry.refused += 1;
        if entry.method != method {
            entry.method = method.to_string();
        }
        if entry.path != path {
            entry.path = crate::store::saf::clip(path);
        }
        entry.why = why;
        if now.saturating_duration_since(entry.first_strike) >= self.lockout {
            entry.strikes = 0;
        }
        if entry.strikes == 0 {
            entry.first_strike = now;
        }
        entry.strikes += 1;
        if entry.strikes >= self.max_strikes {
            entry.strikes = 0;
            entry.locked_until = Some(now + self.lockout);
            return Refusal::LockedOut;
        }
        Refusal::Unauthorized
    }

    /// The refusals since the last flush as rows: one per peer (the
    /// busiest [`PEER_ROWS_PER_SECOND`]), the rest summed in one; each
    /// logged at WARN and queued for the store.
    pub fn flush(&self, now: Instant) {
        let rows = {
            let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
            let rows = book.rows(now_millis());
            book.forget_idle(now, self.lockout);
            rows
        };
        for row in rows {
            tracing::warn!(
                target: "isoswitch::admin_audit",
                peer = %row.peer,
                status = row.status,
                outcome = %row.outcome,
                "admin audit: tokens refused"
            );
            self.queue(row);
        }
    }

    /// Writes what is queued once a second, until `stop`; then what is
    /// left. (The admin thread flushes the refusal book, once a second.)
    async fn write_forever(
        &self,
        store: Store,
        rx: Arc<tokio::sync::Mutex<mpsc::Receiver<AdminRow>>>,
        stop: CancellationToken,
    ) {
        let mut rx = rx.lock().await;
        let mut every = tokio::time::interval(WRITE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let stopping = tokio::select! {
                _ = every.tick() => false,
                _ = stop.cancelled() => true,
            };
            if stopping {
                self.flush(Instant::now());
            }
            let mut rows = Vec::new();
            while let Ok(row) = rx.try_recv() {
                rows.push(row);
            }
            if !rows.is_empty() {
                let n = rows.len() as u64;
                match store.journal_put(Vec::new(), rows).await {
                    Ok(_) => {
                        self.counters.written.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(e) => {
                        self.counters.lost.fetch_add(n, Ordering::Relaxed);
                        tracing::error!(error = %e, rows = n, "admin audit: rows not stored (they are in the log)");
                    }
                }
            }
            if stopping {
                return;
            }
        }
    }
}

impl RefusalBook {
    fn rows(&mut self, at: i64) -> Vec<AdminRow> {
        let mut busy: Vec<(&IpAddr, &mut PeerBook)> = self
            .peers
            .iter_mut()
            .filter(|(_, p)| p.refused + p.throttled > 0)
            .collect();
        busy.sort_by_key(|(_, p)| std::cmp::Reverse(p.refused + p.throttled));
        let mut rows = Vec::new();
        let (mut rest_refused, mut rest_peers) = (std::mem::take(&mut self.untracked), 0u64);
        for (i, (ip, p)) in busy.into_iter().enumerate() {
            let (refused, throttled) = (
                std::mem::take(&mut p.refused),
                std::mem::take(&mut p.throttled),
            );
            if i >= PEER_ROWS_PER_SECOND {
                rest_refused += refused + throttled;
                rest_peers += 1;
                continue;
            }
            let mut outcome = format!("{refused} refused ({})", p.why);
            if throttled > 0 {
                outcome.push_str(&format!(", {throttled} answered 429 (locked out)"));
            }
            if p.locked_until.is_some() {
                outcome.push_str("; peer locked out");
            }
            rows.push(AdminRow {
                id: 0,
                at,
                peer: ip.to_string(),
                action: "token-refused".into(),
                method: std::mem::take(&mut p.method),
                path: std::mem::take(&mut p.path),
                status: if refused > 0 { 401 } else { 429 },
                outcome,
            });
        }
        if rest_refused > 0 {
            rows.push(AdminRow {
                id: 0,
                at,
                peer: "*".into(),
                action: "token-refused".into(),
                method: "-".into(),
                path: "-".into(),
                status: 401,
                outcome: format!(
                    "{rest_refused} refused or locked out from {rest_peers} more peers (or untracked)"
                ),
            });
        }
        rows
    }

    /// Forgets peers with nothing to write, no lockout running and no
    /// strike within `lockout`.
    fn forget_idle(&mut self, now: Instant, lockout: Duration) {
        self.peers.retain(|_, p| {
            p.refused + p.throttled > 0
                || p.locked_until.is_some_and(|t| t > now)
                || (p.strikes > 0 && now.saturating_duration_since(p.first_strike) < lockout)
        });
    }
}

/// Deletes audit rows older than `retain`, a batch at a time, hourly.
async fn retain_forever(
    store: Store,
    retain: Duration,
    counters: Arc<AuditCounters>,
    stop: CancellationToken,
) {
    let mut wait = Duration::from_secs(10);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return,
        }
        wait = PURGE_EVERY;
        let keep = i64::try_from(retain.as_millis()).unwrap_or(i64::MAX);
        let before = now_millis().saturating_sub(keep);
        loop {
            match store.admin_purge(before, PURGE_BATCH).await {
                Ok(0) => break,
                Ok(n) => {
                    counters.purged.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "admin audit retention: will try again");
                    break;
                }
            }
            if stop.is_cancelled() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn audit(max: u32) -> Audit {
        Audit::log_only(&AdminConfig {
            max_refused_tokens: max,
            lockout: Duration::from_secs(60),
            ..AdminConfig::default()
        })
    }

    fn ip(n: u32) -> Option<IpAddr> {
        Some(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n)))
    }

    #[test]
    fn a_second_of_refusals_is_one_row_per_peer_and_five_at_most() {
        let a = audit(u32::MAX);
        let now = Instant::now();
        for n in 0..100 {
            for _ in 0..=n {
                a.refused(ip(n), "GET", "/api/v1/status", "wrong token", now);
            }
        }
        let rows = a.book.lock().unwrap().rows(0);
        assert_eq!(rows.len(), PEER_ROWS_PER_SECOND + 1, "{rows:?}");
        // The busiest peers by name, the rest summed.
        assert_eq!(rows[0].peer, "10.0.0.99");
        assert!(rows[0].outcome.starts_with("100 refused"), "{rows:?}");
        let total: u64 = rows
            .iter()
            .map(|r| r.outcome.split(' ').next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(total, (1..=100).sum::<u64>());
        assert!(
            a.book.lock().unwrap().rows(0).is_empty(),
            "counts start over"
        );
    }

    #[test]
    fn the_book_holds_a_bounded_number_of_peers() {
        let a = audit(u32::MAX);
        let now = Instant::now();
        for n in 0..(MAX_PEERS as u32 + 100) {
            a.refused(ip(n), "GET", "/", "wrong token", now);
        }
        let book = a.book.lock().unwrap();
        assert_eq!(book.peers.len(), MAX_PEERS);
        assert_eq!(book.untracked, 100);
    }

    #[test]
    fn a_peer_is_locked_out_after_max_refusals_and_let_in_after_the_lockout() {
        let a = audit(3);
        let t0 = Instant::now();
        assert_eq!(a.refused(ip(1), "GET", "/", "w", t0), Refusal::Unauthorized);
        assert_eq!(a.refused(ip(1), "GET", "/", "w", t0), Refusal::Unauthorized);
        assert_eq!(a.locked(ip(1), t0), None);
        assert_eq!(a.refused(ip(1), "GET", "/", "w", t0), Refusal::LockedOut);
        assert_eq!(a.locked(ip(1), t0), Some(Duration::from_secs(60)));
        assert_eq!(a.locked(ip(2), t0), None, "another peer is not");
        assert_eq!(a.locked(ip(1), t0 + Duration::from_secs(60)), None);
        // Refusals further apart than the lockout never add up.
        let b = audit(2);
        b.refused(ip(1), "GET", "/", "w", t0);
        let later = t0 + Duration::from_secs(61);
        assert_eq!(
            b.refused(ip(1), "GET", "/", "w", later),
            Refusal::Unauthorized
        );
    }
}
