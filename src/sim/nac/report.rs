//! What the NAC counts while it runs ([`NacCounters`], read by progress
//! lines) and what it reports at the end ([`NacReport`]): the simulator's
//! bookkeeping, apart from the terminals and uplinks that make the traffic.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What the NAC saw.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NacReport {
    pub sent: u64,
    /// Responses with F39 `00`.
    pub answered: u64,
    /// Responses with another F39 (switch-made declines among them).
    pub declined: u64,
    /// Responses on the wrong uplink, with the wrong TPDU, or matching nothing.
    pub mismatched: u64,
    pub unanswered: u64,
    /// Uplinks that closed while the NAC was running.
    pub uplinks_lost: u64,
    /// Latency of answered and declined requests, in microseconds.
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    /// Advices sent (`0220`, each counted once), acknowledged (`0230`, any
    /// F39), repeats sent (`0221`), and given up after every repeat.
    pub advices_sent: u64,
    pub advice_acks: u64,
    pub advice_repeats: u64,
    pub advices_unacknowledged: u64,
    /// `0230`s for an advice already acknowledged or given up.
    pub advice_acks_extra: u64,
    /// Sign-ins (`0800`) sent, answered (`0810`), and unanswered.
    pub sign_ins_sent: u64,
    pub sign_ins_answered: u64,
    pub sign_ins_unanswered: u64,
}

impl std::fmt::Display for NacReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sent {} answered {} declined {} mismatched {} unanswered {} uplinks_lost {} p50 {} µs p99 {} µs max {} µs \
             | advices {} acks {} repeats {} unacknowledged {} extra acks {} | sign-ins {} answered {} unanswered {}",
            self.sent,
            self.answered,
            self.declined,
            self.mismatched,
            self.unanswered,
            self.uplinks_lost,
            self.p50_us,
            self.p99_us,
            self.max_us,
            self.advices_sent,
            self.advice_acks,
            self.advice_repeats,
            self.advices_unacknowledged,
            self.advice_acks_extra,
            self.sign_ins_sent,
            self.sign_ins_answered,
            self.sign_ins_unanswered,
        )
    }
}

/// Live counters of a running NAC (progress lines read them).
#[derive(Debug)]
pub struct NacCounters {
    pub sent: AtomicU64,
    pub answered: AtomicU64,
    pub declined: AtomicU64,
    pub mismatched: AtomicU64,
    pub unanswered: AtomicU64,
    pub uplinks_lost: AtomicU64,
    pub advices_sent: AtomicU64,
    pub advice_acks: AtomicU64,
    pub advice_repeats: AtomicU64,
    pub advices_unacknowledged: AtomicU64,
    pub advice_acks_extra: AtomicU64,
    pub sign_ins_sent: AtomicU64,
    pub sign_ins_answered: AtomicU64,
    pub sign_ins_unanswered: AtomicU64,
    latency_us: Mutex<hdrhistogram::Histogram<u64>>,
}

impl Default for NacCounters {
    fn default() -> Self {
        NacCounters {
            sent: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            declined: AtomicU64::new(0),
            mismatched: AtomicU64::new(0),
            unanswered: AtomicU64::new(0),
            uplinks_lost: AtomicU64::new(0),
            advices_sent: AtomicU64::new(0),
            advice_acks: AtomicU64::new(0),
            advice_repeats: AtomicU64::new(0),
            advices_unacknowledged: AtomicU64::new(0),
            advice_acks_extra: AtomicU64::new(0),
            sign_ins_sent: AtomicU64::new(0),
            sign_ins_answered: AtomicU64::new(0),
            sign_ins_unanswered: AtomicU64::new(0),
            // 1 µs .. 1 min at 3 significant digits: the bounds are valid.
            latency_us: Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3)
                    .unwrap_or_else(|_| unreachable!("valid histogram bounds")),
            ),
        }
    }
}

impl NacCounters {
    /// Answered and declined requests so far.
    pub fn done(&self) -> u64 {
        self.answered.load(Ordering::Relaxed) + self.declined.load(Ordering::Relaxed)
    }

    pub(super) fn record(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let _ = self
            .latency_us
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(us);
    }

    pub(super) fn report(&self) -> NacReport {
        let h = self.latency_us.lock().unwrap_or_else(|p| p.into_inner());
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NacReport {
            sent: get(&self.sent),
            answered: get(&self.answered),
            declined: get(&self.declined),
            mismatched: get(&self.mismatched),
            unanswered: get(&self.unanswered),
            uplinks_lost: get(&self.uplinks_lost),
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            max_us: h.max(),
            advices_sent: get(&self.advices_sent),
            advice_acks: get(&self.advice_acks),
            advice_repeats: get(&self.advice_repeats),
            advices_unacknowledged: get(&self.advices_unacknowledged),
            advice_acks_extra: get(&self.advice_acks_extra),
            sign_ins_sent: get(&self.sign_ins_sent),
            sign_ins_answered: get(&self.sign_ins_answered),
            sign_ins_unanswered: get(&self.sign_ins_unanswered),
        }
    }
}
