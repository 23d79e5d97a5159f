//! What the pool counts per node, read by `/metrics` and the status API:
//! traffic counters and a lock-free latency histogram.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Per-node traffic counters.
#[derive(Debug, Default)]
pub struct NodeCounters {
    pub sent: AtomicU64,
    pub answered: AtomicU64,
    pub declined: AtomicU64,
    pub connects: AtomicU64,
    pub disconnects: AtomicU64,
    /// Ejections due but refused by the pool's `max_ejection_percent`.
    pub ejections_capped: AtomicU64,
    /// Connect attempts that failed or timed out.
    pub connect_failures: AtomicU64,
    /// Answer latency of the requests this node answered.
    pub latency: LatencyHistogram,
}

/// Upper bounds (seconds) of the per-node latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// A latency histogram of plain atomics: recording takes no lock, so it can
/// sit on the per-response path. Read by `/metrics`.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Non-cumulative counts per bucket of [`LATENCY_BUCKETS`], then +Inf.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

impl LatencyHistogram {
    pub fn observe(&self, latency: Duration) {
        let secs = latency.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Sum in seconds, count, and cumulative `(upper bound, count)` pairs
    /// (the last bound is +Inf), as Prometheus wants them.
    pub fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let mut cumulative = 0;
        let mut out = Vec::with_capacity(self.buckets.len());
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b.load(Ordering::Relaxed);
            let le = LATENCY_BUCKETS.get(i).copied().unwrap_or(f64::INFINITY);
            out.push((le, cumulative));
        }
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        (sum, cumulative, out)
    }
}
