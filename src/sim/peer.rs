//! The machinery the scheme simulators (`sim cups`, `sim visa`) share, so
//! that each keeps only its protocol: one pacer for what they originate at a
//! rate, one table of requests awaiting their answer with a deadline each,
//! one sweep that expires them, and one loop that keeps a dialled link up.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::watch;

/// Requests awaiting an answer, at most, per simulator.
pub const MAX_OUTSTANDING: usize = 100_000;
/// Requests a pacer lets out in one tick at most: a late tick does not
/// burst, what it owes goes out over the next ticks.
pub const MAX_BURST: u64 = 1000;
/// Wait before reopening a link that closed.
pub const RECONNECT_MIN: Duration = Duration::from_millis(100);
/// Longest wait between failed connection attempts.
pub const RECONNECT_MAX: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A simulator's mutex, taken even if a panicking holder poisoned it (the
/// data is counters and tables, still whole). Every simulator uses this one.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `timeout` from now; a timeout too long for the clock means a year.
pub fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(now)
}

/// Paces requests at a rate: each tick says how many are owed by now, one
/// at the start and then `rate` a second, counted from the start (or from
/// the last [`Pacer::restart`]).
pub struct Pacer {
    rate: f64,
    tick: tokio::time::Interval,
    /// When pacing (re)started, and how many had gone out by then.
    from: Option<(Instant, u64)>,
}

impl Pacer {
    /// `None` unless `rate` is a positive number.
    pub fn new(rate: f64) -> Option<Pacer> {
        if !(rate > 0.0 && rate.is_finite()) {
            return None;
        }
        let period = Duration::from_secs_f64((1.0 / rate).clamp(0.001, 3600.0));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Some(Pacer {
            rate,
            tick,
            from: None,
        })
    }

    /// Waits for the next tick.
    pub async fn tick(&mut self) {
        self.tick.tick().await;
    }

    /// How many to send now, `done` having gone out so far (at most
    /// [`MAX_BURST`]).
    pub fn owed(&mut self, now: Instant, done: u64) -> u64 {
        let (start, before) = *self.from.get_or_insert((now, done));
        let due = (now.duration_since(start).as_secs_f64() * self.rate) as u64 + 1;
        before
            .saturating_add(due)
            .saturating_sub(done)
            .min(MAX_BURST)
    }

    /// Starts counting afresh (after a pause: what was owed meanwhile is
    /// not made up).
    pub fn restart(&mut self) {
        self.from = None;
    }
}

/// Requests awaiting their answer, each with a deadline: bounded at
/// [`MAX_OUTSTANDING`], a key held once.
#[derive(Debug)]
pub struct Outstanding<K, V> {
    inner: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Eq + Hash + Clone, V> Default for Outstanding<K, V> {
    fn default() -> Self {
        Outstanding {
            inner: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone, V> Outstanding<K, V> {
    /// Registers a request due within `timeout`; `false` if the table is
    /// full or the key is taken (a STAN came round within one timeout).
    pub fn expect(&self, key: K, value: V, timeout: Duration) -> bool {
        let mut out = lock(&self.inner);
        if out.len() >= MAX_OUTSTANDING || out.contains_key(&key) {
            return false;
        }
        out.insert(key, (value, deadline_after(timeout)));
        true
    }

    /// Registers `value` again under `key`, due within `timeout` (a repeat).
    pub fn renew(&self, key: K, value: V, timeout: Duration) {
        lock(&self.inner).insert(key, (value, deadline_after(timeout)));
    }

    pub fn forget(&self, key: &K) {
        lock(&self.inner).remove(key);
    }

    /// The request under `key`, if `answers` says the answer is its.
    pub fn take_if(&self, key: &K, answers: impl FnOnce(&V) -> bool) -> Option<V> {
        let mut out = lock(&self.inner);
        match out.get(key) {
            Some((v, _)) if answers(v) => out.remove(key).map(|(v, _)| v),
            _ => None,
        }
    }

    pub fn take(&self, key: &K) -> Option<V> {
        self.take_if(key, |_| true)
    }

    pub fn len(&self) -> usize {
        lock(&self.inner).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes and returns the requests due by `now`.
    pub fn expired(&self, now: Instant) -> Vec<(K, V)> {
        let mut out = lock(&self.inner);
        let keys: Vec<K> = out
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(k, _)| k.clone())
            .collect();
        keys.into_iter()
            .filter_map(|k| out.remove(&k).map(|(v, _)| (k, v)))
            .collect()
    }

    /// Removes and returns every request (at the stop).
    pub fn drain(&self) -> Vec<(K, V)> {
        lock(&self.inner)
            .drain()
            .map(|(k, (v, _))| (k, v))
            .collect()
    }
}

/// Calls `expire` with the time now, often enough for a `timeout` (a
/// quarter of it, within 5..100 ms), until the shutdown.
pub async fn sweep(
    timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
    expire: impl Fn(Instant),
) {
    let every = (timeout / 4).clamp(Duration::from_millis(5), Duration::from_millis(100));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => expire(Instant::now()),
            _ = shutdown.changed() => return,
        }
    }
}

/// Calls `tick` every `every` (the first after one period) until it says
/// stop, `stop_at` passes or the shutdown: a simulator's periodic work of
/// its own (key resets).
pub async fn every_until(
    every: Duration,
    stop_at: Option<Instant>,
    mut shutdown: watch::Receiver<bool>,
    mut tick: impl FnMut() -> bool,
) {
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = shutdown.changed() => return,
        }
        if stop_at.is_some_and(|s| Instant::now() >= s) || !tick() {
            return;
        }
    }
}

/// Keeps one dialled link up until the shutdown: connects to `target`,
/// runs `serve` on it until it returns, waits a short backoff (longer after
/// each failed attempt), connects again. `what` names the link in logs.
pub async fn keep_dialled<F>(
    target: SocketAddr,
    what: &str,
    mut shutdown: watch::Receiver<bool>,
    mut serve: impl FnMut(TcpStream, watch::Receiver<bool>) -> F,
) where
    F: Future<Output = ()>,
{
    let mut backoff = RECONNECT_MIN;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let connect = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target));
        let connected = tokio::select! {
            r = connect => r,
            _ = shutdown.changed() => return,
        };
        match connected {
            Ok(Ok(stream)) => {
                backoff = RECONNECT_MIN;
                serve(stream, shutdown.clone()).await;
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, %target, "{what}: connect failed");
                backoff = (backoff * 2).min(RECONNECT_MAX);
            }
            Err(_) => backoff = (backoff * 2).min(RECONNECT_MAX),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_owes_one_at_start_then_the_rate_capped() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let mut p = Pacer::new(100.0).unwrap();
        let t0 = Instant::now();
        assert_eq!(p.owed(t0, 0), 1);
        assert_eq!(p.owed(t0 + Duration::from_millis(100), 1), 10);
        // Behind by far more than a tick allows: the rest comes later.
        assert_eq!(p.owed(t0 + Duration::from_secs(60), 11), MAX_BURST);
        p.restart();
        assert_eq!(p.owed(t0 + Duration::from_secs(60), 5000), 1);
        assert!(Pacer::new(0.0).is_none() && Pacer::new(f64::NAN).is_none());
    }

    #[test]
    fn outstanding_is_bounded_keyed_once_and_expires() {
        let t: Outstanding<u32, &str> = Outstanding::default();
        assert!(t.expect(1, "a", Duration::ZERO));
        assert!(!t.expect(1, "again", Duration::from_secs(60)), "key taken");
        assert!(t.expect(2, "b", Duration::from_secs(60)));
        assert_eq!(t.take_if(&2, |v| *v == "x"), None);
        assert_eq!(t.expired(Instant::now()), vec![(1, "a")]);
        assert_eq!(t.take(&2), Some("b"));
        assert!(t.is_empty());
        for k in 0..MAX_OUTSTANDING as u32 {
            assert!(t.expect(k, "", Duration::from_secs(60)));
        }
        assert!(!t.expect(u32::MAX, "full", Duration::from_secs(60)));
        assert_eq!(t.drain().len(), MAX_OUTSTANDING);
    }

    /// The sweep calls `expire` every quarter of the timeout (within 5..100
    /// ms) until the shutdown, and no more after it: counted on the paused
    /// runtime clock, so the test's second passes at once.
    #[tokio::test(start_paused = true)]
    async fn the_sweep_runs_every_quarter_timeout_until_the_shutdown() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        for (timeout, every_ms) in [(200, 50), (4, 5), (10_000, 100)] {
            let calls = Arc::new(AtomicU64::new(0));
            let (stop, shutdown) = watch::channel(false);
            let counted = Arc::clone(&calls);
            let sweep = tokio::spawn(sweep(Duration::from_millis(timeout), shutdown, move |_| {
                counted.fetch_add(1, Ordering::Relaxed);
            }));
            tokio::time::sleep(Duration::from_millis(1000) + Duration::from_micros(1)).await;
            // One at the start, then one a period.
            let want = 1 + 1000 / every_ms;
            let got = calls.load(Ordering::Relaxed);
            assert_eq!(got, want, "timeout {timeout} ms: {got} sweeps in 1 s");
            stop.send(true).unwrap();
            sweep.await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(
                calls.load(Ordering::Relaxed),
                got,
                "none after the shutdown"
            );
        }
    }

    #[test]
    fn deadlines_never_overflow() {
        assert!(deadline_after(Duration::MAX) > Instant::now());
    }
}
