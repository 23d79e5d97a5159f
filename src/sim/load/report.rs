//! What the load generator counts while it runs ([`LoadCounters`], read by
//! progress lines) and what it reports at the end ([`LoadReport`]).

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use hdrhistogram::Histogram;

/// What the load generator saw.
#[derive(Clone, Debug)]
pub struct LoadReport {
    pub requests: u64,
    /// Responses with F39 `00`.
    pub answered: u64,
    /// Responses with another F39.
    pub declined: u64,
    pub timeouts: u64,
    /// Responses that matched no request waiting on their connection (a crossed,
    /// doubled or garbled answer).
    pub mismatches: u64,
    /// Client connections that closed before the end.
    pub connections_lost: u64,
    /// Connections opened, and connect attempts that failed.
    pub connects: u64,
    pub connect_failures: u64,
    pub elapsed: Duration,
    /// Latency of answered and declined requests, in microseconds.
    pub latency_us: Histogram<u64>,
}

impl LoadReport {
    /// Answers of any kind (approved and declined) per second.
    pub fn throughput(&self) -> f64 {
        self.per_s(self.answered + self.declined)
    }

    /// Approved answers (F39 `00`) per second: the work a payment system is
    /// for. A proxy that declines fast would look fast in [`Self::throughput`].
    pub fn approved_per_s(&self) -> f64 {
        self.per_s(self.answered)
    }

    /// Requests sent per second: at a fixed rate, whether the offered rate
    /// was held.
    pub fn sent_per_s(&self) -> f64 {
        self.per_s(self.requests)
    }

    /// Requests that got no usable answer: timeouts, answers matching no
    /// request, connections lost or never made.
    pub fn errors(&self) -> u64 {
        self.timeouts + self.mismatches + self.connections_lost + self.connect_failures
    }

    fn per_s(&self, n: u64) -> f64 {
        n as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn connects_per_s(&self) -> f64 {
        self.connects as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn percentile_us(&self, q: f64) -> u64 {
        self.latency_us.value_at_quantile(q)
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "requests": self.requests,
            "answered": self.answered,
            "declined": self.declined,
            "timeouts": self.timeouts,
            "mismatches": self.mismatches,
            "connections_lost": self.connections_lost,
            "connects": self.connects,
            "connects_per_s": self.connects_per_s(),
            "connect_failures": self.connect_failures,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "throughput_per_s": self.throughput(),
            "approved_per_s": self.approved_per_s(),
            "sent_per_s": self.sent_per_s(),
            "latency_us": {
                "p50": self.percentile_us(0.50),
                "p90": self.percentile_us(0.90),
                "p99": self.percentile_us(0.99),
                "p99_9": self.percentile_us(0.999),
                "max": self.latency_us.max(),
            }
        })
    }
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "requests {}  answered {}  declined {}  timeouts {}  mismatches {}  connections lost {}",
            self.requests,
            self.answered,
            self.declined,
            self.timeouts,
            self.mismatches,
            self.connections_lost
        )?;
        writeln!(
            f,
            "connects {} ({:.1}/s)  connect failures {}",
            self.connects,
            self.connects_per_s(),
            self.connect_failures
        )?;
        write!(
            f,
            "throughput {:.0} msg/s ({:.0} approved/s) over {:.1} s  latency p50 {} µs  p90 {} µs  p99 {} µs  p99.9 {} µs  max {} µs",
            self.throughput(),
            self.approved_per_s(),
            self.elapsed.as_secs_f64(),
            self.percentile_us(0.50),
            self.percentile_us(0.90),
            self.percentile_us(0.99),
            self.percentile_us(0.999),
            self.latency_us.max()
        )
    }
}

/// Live counters, readable while the load runs (progress lines).
#[derive(Debug, Default)]
pub struct LoadCounters {
    pub requests: AtomicU64,
    pub answered: AtomicU64,
    pub declined: AtomicU64,
    pub timeouts: AtomicU64,
    pub mismatches: AtomicU64,
    pub connections_lost: AtomicU64,
    pub connects: AtomicU64,
    pub connect_failures: AtomicU64,
    /// While set, answers to requests sent meanwhile are counted but their
    /// latency is not recorded: `isoswitch bench --scenario clients` keeps
    /// the minutes of connecting thousands of clients out of its p50/p99.
    pub latency_paused: AtomicBool,
}
