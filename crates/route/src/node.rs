//! Channel nodes as the balancers see them.
//!
//! - [`NodeId`]: the short ASCII id from config (`"01"`), inline and `Copy`.
//! - [`PeakEwma`]: the latency estimate peak-EWMA balancing reads.
//! - [`NodeState`]: everything the switch tracks per node (weight, priority,
//!   outstanding requests, latency, [`Health`]), updated by the caller.
//! - [`NodeView`]: a `Copy` snapshot of one node at one instant; balancers
//!   read only these, so they need no clock of their own.
//! - [`NodeSnapshot`] and [`EwmaCell`]: what a pool shared between threads
//!   publishes of each node so that a pick reads it without a lock: the
//!   rarely changing part (id, priority, [`Standing`]) as a value republished
//!   on each transition, the latency estimate as an atomic updated per answer.
//!   Requests outstanding are one atomic counter per node, kept by the pool.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::health::{Health, HealthConfig, RAMP_FULL, Standing, Transition};

/// Longest node id, in bytes.
pub const NODE_ID_MAX: usize = 8;

/// A node id as written in config: 1 to [`NODE_ID_MAX`] bytes, each a letter,
/// a digit, `_`, `.` or `-` (the name rule of [`isoswitch_util::name`]: an ID
/// goes unescaped into metrics labels, logs and URLs). Stored inline, so it is `Copy` and never allocates.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeId {
    len: u8,
    // Bytes past `len` are always zero, so the derived Eq/Hash are exact.
    bytes: [u8; NODE_ID_MAX],
}

/// Why a text is not a [`NodeId`].
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum NodeIdError {
    #[error("node id is empty")]
    Empty,
    #[error("node id `{0}` is longer than {NODE_ID_MAX} bytes")]
    TooLong(String),
    #[error("node id `{0}` holds a character other than a letter, a digit, `_`, `.` or `-`")]
    BadChar(String),
}

impl NodeId {
    /// Checks and copies `id`.
    pub fn new(id: &[u8]) -> Result<Self, NodeIdError> {
        let shown = || id.escape_ascii().to_string();
        if id.is_empty() {
            return Err(NodeIdError::Empty);
        }
        if id.len() > NODE_ID_MAX {
            return Err(NodeIdError::TooLong(shown()));
        }
        if !id.iter().all(|&b| isoswitch_util::name::is_name_byte(b)) {
            return Err(NodeIdError::BadChar(shown()));
        }
        let mut bytes = [0u8; NODE_ID_MAX];
        bytes[..id.len()].copy_from_slice(id);
        Ok(Self {
            len: id.len() as u8,
            bytes,
        })
    }

    /// The id's bytes (1 to [`NODE_ID_MAX`] of them).
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The id as text (always ASCII).
    pub fn as_str(&self) -> &str {
        // Only ASCII gets in, so this never fails; fall back rather than panic.
        std::str::from_utf8(self.as_bytes()).unwrap_or("?")
    }

    /// Length in bytes.
    #[allow(clippy::len_without_is_empty)] // never empty
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }
}

impl FromStr for NodeId {
    type Err = NodeIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s.as_bytes())
    }
}

impl TryFrom<String> for NodeId {
    type Error = NodeIdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s.as_bytes())
    }
}

impl From<NodeId> for String {
    fn from(id: NodeId) -> String {
        id.as_str().to_owned()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({:?})", self.as_str())
    }
}

impl PartialOrd for NodeId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for NodeId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

/// Settings of the latency estimate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct EwmaConfig {
    /// Time constant: an observation's weight falls to 1/e after this long,
    /// and an idle node's estimate decays towards zero at the same rate.
    #[serde(with = "super::duration")]
    pub decay: Duration,
    /// Estimate of a node nothing is known about yet, so a fresh node is not
    /// taken for infinitely fast and flooded.
    #[serde(with = "super::duration")]
    pub initial: Duration,
}

impl Default for EwmaConfig {
    fn default() -> Self {
        Self {
            decay: Duration::from_secs(10),
            initial: Duration::from_millis(50),
        }
    }
}

/// Peak-EWMA latency (Finagle / tower): a slower observation replaces the
/// estimate at once; a faster one is blended in by the time since the last
/// update; with no observations the estimate decays towards zero so an idle
/// node gets probed again.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PeakEwma {
    estimate_ns: f64,
    updated: Option<Instant>,
    decay_ns: f64,
}

impl PeakEwma {
    pub fn new(cfg: EwmaConfig) -> Self {
        Self {
            estimate_ns: cfg.initial.as_nanos() as f64,
            updated: None,
            // A zero time constant would divide by zero: treat it as 1 ns (no memory).
            decay_ns: (cfg.decay.as_nanos() as f64).max(1.0),
        }
    }

    fn weight_of_past(&self, now: Instant) -> f64 {
        match self.updated {
            Some(t) => {
                let elapsed = nanos_f64(now.saturating_duration_since(t));
                (-elapsed / self.decay_ns).exp()
            }
            None => 1.0,
        }
    }

    /// Records one round trip observed at `now`.
    pub fn observe(&mut self, rtt: Duration, now: Instant) {
        let rtt = nanos_f64(rtt);
        if rtt > self.estimate_ns {
            self.estimate_ns = rtt;
        } else {
            let w = self.weight_of_past(now);
            self.estimate_ns = self.estimate_ns * w + rtt * (1.0 - w);
        }
        self.updated = Some(now);
    }

    /// The estimate at `now`, in nanoseconds.
    pub fn get_ns(&self, now: Instant) -> f64 {
        self.estimate_ns * self.weight_of_past(now)
    }

    /// The estimate at `now`.
    pub fn get(&self, now: Instant) -> Duration {
        Duration::from_nanos(self.get_ns(now) as u64)
    }
}

/// `d.as_nanos() as f64`, the same value, without a call to the u128
/// conversion (`__floattidf`, ~45 instructions) when the nanoseconds fit a
/// u64 (570 years): a u64's conversion rounds the same number the same way.
/// (Converting `u64::try_from(d.as_nanos())` instead is folded back into
/// the u128 conversion by the optimiser: the same value either way.)
#[inline]
fn nanos_f64(d: Duration) -> f64 {
    const FITS_U64: u64 = 18_000_000_000;
    if d.as_secs() < FITS_U64 {
        (d.as_secs() * 1_000_000_000 + u64::from(d.subsec_nanos())) as f64
    } else {
        d.as_nanos() as f64
    }
}

/// A [`PeakEwma`] readable from any thread without a lock: its owner keeps
/// the estimate (under whatever serialises its writers, one node's lock in a
/// pool) and [`EwmaCell::publish`]es it after each update; readers get the
/// estimate at their `now` as [`PeakEwma::get`] would.
///
/// An estimate `E` observed at `t` is worth `E·exp(−(now−t)/τ)` at `now`,
/// that is `exp(K − now/τ)` with `K = ln E + t/τ`: one number, so the cell is
/// one atomic and a reader can never see half of a publish. (`t` counts from
/// the cell's epoch; after a year at τ = 1 s, `K` is about 3·10^7, which an
/// f64 holds to 4·10^-9: the estimate stays exact to a few parts per billion.)
#[derive(Debug)]
pub struct EwmaCell {
    /// `K` as f64 bits; `NEVER` until the first observation.
    log_estimate: AtomicU64,
    /// The estimate before any observation (it does not decay).
    initial_ns: f64,
    epoch: Instant,
    decay_ns: f64,
}

impl EwmaCell {
    /// A NaN that `ln` of a latency never yields.
    const NEVER: u64 = u64::MAX;

    /// A cell holding `ewma`, timing from `epoch` (times before it count as
    /// `epoch`).
    pub fn new(ewma: &PeakEwma, epoch: Instant) -> Self {
        let cell = Self {
            log_estimate: AtomicU64::new(Self::NEVER),
            initial_ns: ewma.estimate_ns,
            epoch,
            decay_ns: ewma.decay_ns,
        };
        cell.publish(ewma);
        cell
    }

    fn since_epoch(&self, t: Instant) -> f64 {
        // In two f64 steps rather than through u128 nanoseconds: cheaper,
        // and exact to the nanosecond for 104 days, to 1 ns in 2^53 beyond.
        let d = t.saturating_duration_since(self.epoch);
        d.as_secs() as f64 * 1e9 + f64::from(d.subsec_nanos())
    }

    /// Makes `ewma` what readers see. Called with the writers' lock held, so
    /// publishes land in the order of the updates.
    pub fn publish(&self, ewma: &PeakEwma) {
        let bits = match ewma.updated {
            Some(t) => (ewma.estimate_ns.ln() + self.since_epoch(t) / self.decay_ns).to_bits(),
            None => Self::NEVER,
        };
        self.log_estimate.store(bits, Ordering::Relaxed);
    }

    /// The estimate at `now`, in nanoseconds. A `now` a little before the
    /// last observation (another thread's clock read) sees it grown by
    /// `exp(Δ/τ)`, a few parts per million for microseconds at τ = 10 s.
    pub fn get_ns(&self, now: Instant) -> f64 {
        let bits = self.log_estimate.load(Ordering::Relaxed);
        if bits == Self::NEVER {
            return self.initial_ns;
        }
        (f64::from_bits(bits) - self.since_epoch(now) / self.decay_ns).exp()
    }

    /// The estimate at `now`.
    pub fn get(&self, now: Instant) -> Duration {
        Duration::from_nanos(self.get_ns(now) as u64)
    }
}

/// A snapshot of one node at one instant: what every balancer reads.
///
/// A node's index is its position in the slice handed to the balancer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NodeView {
    pub id: NodeId,
    /// Weight from config.
    pub weight: u32,
    /// Weight after health and slow start ([`Health::effective_weight`]);
    /// 0 when the node must get no new request.
    pub effective_weight: u32,
    /// Where the node is on its slow-start ramp, in thousandths
    /// ([`Health::ramp`]): 100 when it starts, [`RAMP_FULL`] when it is not
    /// warming. Every algorithm honours it, weights or not (see
    /// [`Balancer`](super::Balancer)).
    pub ramp: u16,
    /// Higher is preferred (see priority groups in [`Balancer`](super::Balancer)).
    pub priority: u32,
    /// Requests sent and neither answered nor declined yet.
    pub outstanding: u32,
    /// Peak-EWMA latency estimate.
    pub latency: Duration,
    /// Admin enabled, connected, checks up and not ejected.
    pub eligible: bool,
}

impl NodeView {
    /// May a new request go to this node?
    #[inline]
    pub fn pickable(&self) -> bool {
        self.eligible && self.effective_weight > 0
    }

    /// Is the node in slow start?
    #[inline]
    pub fn warming(&self) -> bool {
        self.ramp < RAMP_FULL
    }

    /// The weight the weighted algorithms use, in thousandths of a weight
    /// unit: the effective weight, and while warming the configured weight
    /// scaled by the ramp (so a node of weight 1 ramps too: its integer
    /// effective weight cannot go below 1), never above the effective weight
    /// (which is 0 when the node is out).
    #[inline]
    pub fn milli_weight(&self) -> u64 {
        let effective = u64::from(self.effective_weight) * u64::from(RAMP_FULL);
        if self.warming() {
            effective.min(u64::from(self.weight) * u64::from(self.ramp))
        } else {
            effective
        }
    }

    /// A healthy node with these figures (for tests and tools).
    pub fn healthy(id: NodeId, weight: u32, priority: u32) -> Self {
        Self {
            id,
            weight,
            effective_weight: weight,
            ramp: RAMP_FULL,
            priority,
            outstanding: 0,
            latency: Duration::ZERO,
            eligible: true,
        }
    }
}

/// What a pick reads of one node that only a transition changes: a `Copy`
/// value a pool republishes when it changes (see [`Standing`]), from which
/// [`NodeSnapshot::view`] computes everything time-based at `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeSnapshot {
    pub id: NodeId,
    pub priority: u32,
    pub standing: Standing,
}

impl NodeSnapshot {
    /// The view a balancer reads, at `now`, given the live figures kept apart
    /// (requests outstanding, latency estimate).
    #[inline]
    pub fn view(&self, outstanding: u32, latency: Duration, now: Instant) -> NodeView {
        NodeView {
            id: self.id,
            weight: self.standing.weight,
            effective_weight: self.standing.effective_weight(now),
            ramp: self.standing.ramp(now),
            priority: self.priority,
            outstanding,
            latency,
            eligible: self.standing.eligible(now),
        }
    }

    /// The view while the pool is in panic (no node eligible): connected and
    /// enabled nodes count as eligible at their full weight, whatever checks
    /// and ejection say.
    pub fn panic_view(&self, outstanding: u32, latency: Duration, now: Instant) -> NodeView {
        let eligible = self.standing.panic_eligible();
        NodeView {
            effective_weight: if eligible { self.standing.weight } else { 0 },
            ramp: RAMP_FULL,
            eligible,
            ..self.view(outstanding, latency, now)
        }
    }
}

/// Everything tracked for one channel node. Owned by whoever owns the node
/// pool; every method takes the time from its caller.
#[derive(Clone, Debug)]
pub struct NodeState {
    id: NodeId,
    priority: u32,
    outstanding: u32,
    latency: PeakEwma,
    health: Health,
}

impl NodeState {
    pub fn new(
        id: NodeId,
        weight: u32,
        priority: u32,
        health: HealthConfig,
        ewma: EwmaConfig,
    ) -> Self {
        Self {
            id,
            priority,
            outstanding: 0,
            latency: PeakEwma::new(ewma),
            health: Health::new(health, weight),
        }
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn priority(&self) -> u32 {
        self.priority
    }

    /// Changes weight and priority (config reload); keeps health and counters.
    pub fn reconfigure(&mut self, weight: u32, priority: u32) {
        self.priority = priority;
        self.health.set_weight(weight);
    }

    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    pub fn health(&self) -> &Health {
        &self.health
    }

    /// For admin changes, checks and connection state.
    pub fn health_mut(&mut self) -> &mut Health {
        &mut self.health
    }

    /// A request was sent to this node.
    pub fn dispatched(&mut self) {
        self.outstanding = self.outstanding.saturating_add(1);
    }

    /// The request finished on live traffic: `ok` for a response, not `ok`
    /// for a timeout or an error. Feeds the latency estimate and passive
    /// ejection. A timeout's `latency` is the time waited: a lower bound, and
    /// as such it rightly pushes the peak estimate up.
    pub fn record_response(&mut self, ok: bool, latency: Duration, now: Instant) -> Transition {
        self.record_outcome(ok, latency, now, true)
    }

    /// [`NodeState::record_response`] with the pool's ejection cap (see
    /// [`Health::record_response_capped`]).
    pub fn record_outcome(
        &mut self,
        ok: bool,
        latency: Duration,
        now: Instant,
        may_eject: bool,
    ) -> Transition {
        self.outstanding = self.outstanding.saturating_sub(1);
        self.latency.observe(latency, now);
        self.health.record_response_capped(ok, now, may_eject)
    }

    /// The request left without a verdict on the node (declined because its
    /// connection died, or at shutdown): only the count goes down.
    pub fn released(&mut self) {
        self.outstanding = self.outstanding.saturating_sub(1);
    }

    /// The latency estimate at `now`.
    pub fn latency(&self, now: Instant) -> Duration {
        self.latency.get(now)
    }

    /// The snapshot the balancers read while the pool is in panic (no node
    /// eligible): connected and enabled nodes count as eligible at their full
    /// weight, whatever checks and ejection say.
    pub fn panic_view(&self, now: Instant) -> NodeView {
        self.snapshot()
            .panic_view(self.outstanding, self.latency.get(now), now)
    }

    /// The snapshot the balancers read, evaluated at `now`.
    pub fn view(&self, now: Instant) -> NodeView {
        self.snapshot()
            .view(self.outstanding, self.latency.get(now), now)
    }

    /// The part of this node a shared pool publishes (see [`NodeSnapshot`]).
    pub fn snapshot(&self) -> NodeSnapshot {
        NodeSnapshot {
            id: self.id,
            priority: self.priority,
            standing: self.health.standing(),
        }
    }

    /// The latency estimate itself (to publish in an [`EwmaCell`]).
    pub fn ewma(&self) -> &PeakEwma {
        &self.latency
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nanos_as_f64_are_the_u128_conversion() {
        let cases = [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::new(1, 500_000_001),
            Duration::from_nanos((1 << 53) + 1),
            Duration::new(17_999_999_999, 999_999_999),
            Duration::new(18_000_000_000, 0),
            Duration::MAX,
        ];
        for d in cases {
            assert_eq!(
                nanos_f64(d).to_bits(),
                (d.as_nanos() as f64).to_bits(),
                "{d:?}"
            );
        }
    }

    #[test]
    fn node_id_checks_text() {
        let id: NodeId = "01".parse().unwrap();
        assert_eq!(id.as_bytes(), b"01");
        assert_eq!(id.to_string(), "01");
        assert_eq!(id.len(), 2);
        assert_eq!(NodeId::new(b""), Err(NodeIdError::Empty));
        assert!(matches!(
            NodeId::new(b"123456789"),
            Err(NodeIdError::TooLong(_))
        ));
        for bad in [&b"a b"[..], b"x\",y=\"z", b"\"", b"a\\b", &[0xff]] {
            assert!(
                matches!(NodeId::new(bad), Err(NodeIdError::BadChar(_))),
                "{}",
                bad.escape_ascii()
            );
        }
        assert!(NodeId::new(b"n.1_a-b").is_ok());
        assert!(NodeId::new(b"node-001").is_ok());
        assert!(NodeId::new(b"01").unwrap() < NodeId::new(b"02").unwrap());
        assert!(NodeId::new(b"1").unwrap() < NodeId::new(b"10").unwrap());
    }

    #[test]
    fn node_id_serde() {
        #[derive(Deserialize, Serialize)]
        struct T {
            id: NodeId,
        }
        let t: T = toml::from_str(r#"id = "07""#).unwrap();
        assert_eq!(t.id.as_str(), "07");
        assert_eq!(toml::to_string(&t).unwrap().trim(), r#"id = "07""#);
        assert!(toml::from_str::<T>(r#"id = "too-long-id""#).is_err());
    }

    #[test]
    fn peak_ewma_jumps_up_and_decays_down() {
        let t0 = Instant::now();
        let cfg = EwmaConfig {
            decay: Duration::from_secs(10),
            initial: Duration::from_millis(50),
        };
        let mut e = PeakEwma::new(cfg);
        assert_eq!(e.get(t0), Duration::from_millis(50));
        e.observe(Duration::from_millis(200), t0);
        assert_eq!(e.get(t0), Duration::from_millis(200), "peak taken at once");
        // A fast answer right away barely moves it.
        e.observe(Duration::from_millis(10), t0 + Duration::from_millis(1));
        assert!(e.get(t0 + Duration::from_millis(1)) > Duration::from_millis(199));
        // A fast answer after one time constant pulls it most of the way.
        let t1 = t0 + Duration::from_secs(10);
        e.observe(Duration::from_millis(10), t1);
        let v = e.get(t1).as_millis();
        assert!((75..=85).contains(&v), "{v}");
        // Idle: decays towards zero.
        assert!(e.get(t1 + Duration::from_secs(60)) < Duration::from_millis(1));
        // A zero time constant does not divide by zero.
        let mut z = PeakEwma::new(EwmaConfig {
            decay: Duration::ZERO,
            initial: Duration::ZERO,
        });
        z.observe(Duration::from_millis(5), t0);
        assert!(z.get_ns(t0).is_finite());
    }

    #[test]
    fn ewma_cell_reads_what_peak_ewma_says() {
        let t0 = Instant::now();
        let mut e = PeakEwma::new(EwmaConfig::default());
        let cell = EwmaCell::new(&e, t0);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.max(1.0);
        assert!(close(cell.get_ns(t0), e.get_ns(t0)), "initial, no decay");
        assert!(close(
            cell.get_ns(t0 + Duration::from_secs(100)),
            e.get_ns(t0 + Duration::from_secs(100))
        ));
        let mut now = t0;
        for (k, ms) in [200u64, 10, 10, 80, 5].into_iter().enumerate() {
            now += Duration::from_millis(300 * k as u64);
            e.observe(Duration::from_millis(ms), now);
            cell.publish(&e);
            for later in [0u64, 1, 7_000, 60_000] {
                let t = now + Duration::from_millis(later);
                assert!(
                    close(cell.get_ns(t), e.get_ns(t)),
                    "after {ms} ms, +{later} ms"
                );
            }
        }
        assert_eq!(cell.get(now), e.get(now));
    }

    #[test]
    fn ewma_cell_reads_whole_values_while_a_writer_publishes() {
        // Two alternating states far apart: a reader sees one or the other,
        // never a mix, however the threads interleave.
        let t0 = Instant::now();
        let mut slow = PeakEwma::new(EwmaConfig::default());
        slow.observe(Duration::from_secs(1), t0 + Duration::from_secs(1));
        let mut fast = PeakEwma::new(EwmaConfig::default());
        fast.observe(Duration::from_micros(1), t0);
        let cell = EwmaCell::new(&slow, t0);
        let at = t0 + Duration::from_secs(1);
        let (a, b) = (slow.get_ns(at), fast.get_ns(at));
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-6 * y;
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for k in 0..20_000 {
                    cell.publish(if k % 2 == 0 { &fast } else { &slow });
                }
                stop.store(true, Ordering::Relaxed);
            });
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) || reads < 1000 {
                let v = cell.get_ns(at);
                assert!(close(v, a) || close(v, b), "read {v}, want {a} or {b}");
                reads += 1;
            }
        });
    }

    #[test]
    fn snapshot_views_match_the_state() {
        let t0 = Instant::now();
        let mut n = NodeState::new(
            "01".parse().unwrap(),
            5,
            2,
            HealthConfig::default(),
            EwmaConfig::default(),
        );
        let _ = n.health_mut().set_connected(true, t0);
        let _ = n.health_mut().set_connected(false, t0);
        let _ = n
            .health_mut()
            .set_connected(true, t0 + Duration::from_secs(1));
        n.dispatched();
        let snap = n.snapshot();
        for s in [0u64, 1, 3, 11] {
            let t = t0 + Duration::from_secs(s);
            let latency = n.latency(t);
            assert_eq!(snap.view(1, latency, t), n.view(t));
            assert_eq!(snap.panic_view(1, latency, t), n.panic_view(t));
        }
    }

    #[test]
    fn node_state_counts_and_views() {
        let t0 = Instant::now();
        let mut n = NodeState::new(
            "01".parse().unwrap(),
            3,
            1,
            HealthConfig::default(),
            EwmaConfig::default(),
        );
        assert!(!n.view(t0).eligible, "not connected yet");
        let _ = n.health_mut().set_connected(true, t0);
        n.dispatched();
        n.dispatched();
        let v = n.view(t0);
        assert!(v.eligible && v.pickable());
        assert_eq!(
            (v.weight, v.effective_weight, v.priority, v.outstanding),
            (3, 3, 1, 2)
        );
        let _ = n.record_response(true, Duration::from_millis(80), t0);
        n.released();
        n.released(); // one too many: saturates, no panic
        assert_eq!(n.outstanding(), 0);
        assert_eq!(n.latency(t0), Duration::from_millis(80));
        n.reconfigure(7, 2);
        assert_eq!((n.view(t0).weight, n.priority()), (7, 2));
    }
}
