//! The health state machine of one node.
//!
//! A node may take a new request ([`Health::eligible`]) only when all of:
//!
//! - **admin** state is [`AdminState::Enabled`] (`Drain`: no new requests, the
//!   in-flight ones finish; `Disabled`: the same, out of service, back through
//!   slow start; `ForcedOffline`: in-flight declined at once by the owner);
//! - it has a **live connection** ([`Health::set_connected`]);
//! - **active checks** say up: down after `fall` consecutive failed checks, up
//!   again after `rise` consecutive good ones ([`Health::record_check`]);
//! - it is not **ejected**: `ejection_threshold` consecutive timeouts or errors
//!   on live traffic ([`Health::record_response`]) eject it for
//!   `base_ejection`, doubled on each repeated ejection up to `max_ejection`;
//!   the doubling starts over once the node has gone `ejection_reset` since its
//!   last ejection ended.
//!
//! After it comes back (checks up again, ejection over, reconnected, or
//! re-enabled from `Disabled` or `ForcedOffline`) its **slow start** begins: its [`Health::ramp`]
//! climbs linearly from 10% to 100% over `slow_start`, and with it the
//! effective weight. Every balancing algorithm honours the ramp (see
//! [`Balancer`](super::Balancer)).
//!
//! Time comes from the caller. Ejection ends by itself when its time passes;
//! [`Health::poll`] reports that moment once, for logs and metrics.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A slow-start ramp, in thousandths of a node's full share: where it starts
/// (10%) and where it ends (100%, also the value of a node not warming).
pub const RAMP_START: u16 = 100;
pub const RAMP_FULL: u16 = 1000;

/// What an operator set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdminState {
    #[default]
    Enabled,
    /// No new requests; those in flight finish normally. Back to `Enabled`
    /// at its full share at once (a short pause, a removal's first step).
    Drain,
    /// Out of service (F5's "disabled"): no new requests, those in flight
    /// finish up to their deadlines, never turned into declines. Back to
    /// `Enabled` through slow start.
    Disabled,
    /// Out of service now (F5's "forced offline"): the owner declines what
    /// is in flight at once, and the switch reverses what the node may have
    /// approved of it (timeout reversals). Back through slow start.
    ForcedOffline,
}

impl AdminState {
    /// Do requests already in flight on this node still wait for their answer?
    pub fn keeps_in_flight(self) -> bool {
        !matches!(self, AdminState::ForcedOffline)
    }

    /// Is the node out of service (not merely draining)? Leaving this state
    /// starts slow start.
    pub fn is_out_of_service(self) -> bool {
        matches!(self, AdminState::Disabled | AdminState::ForcedOffline)
    }
}

/// Health settings of a node pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// Consecutive good checks that bring a down node up.
    pub rise: u32,
    /// Consecutive failed checks that bring an up node down.
    pub fall: u32,
    /// Consecutive timeouts/errors on live traffic that eject a node; 0 turns
    /// passive ejection off.
    pub ejection_threshold: u32,
    /// First ejection time; doubles on each repeated ejection.
    #[serde(with = "super::duration")]
    pub base_ejection: Duration,
    /// Ejection time never exceeds this.
    #[serde(with = "super::duration")]
    pub max_ejection: Duration,
    /// This long after its last ejection ended, a node's next ejection is
    /// `base_ejection` again.
    #[serde(with = "super::duration")]
    pub ejection_reset: Duration,
    /// Length of the weight ramp after recovery; zero turns slow start off.
    #[serde(with = "super::duration")]
    pub slow_start: Duration,
    /// Passive ejection never takes out more than this share of a pool's
    /// nodes (one node may always be ejected), so that no client can take a
    /// service down by sending requests that time out (as Envoy caps it).
    pub max_ejection_percent: u32,
    /// When no node of a pool is eligible while some are still connected and
    /// enabled (every active check failing at once, say), route to those
    /// rather than decline everything (Envoy's healthy panic).
    pub panic_mode: bool,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            rise: 2,
            fall: 3,
            ejection_threshold: 5,
            base_ejection: Duration::from_secs(5),
            max_ejection: Duration::from_secs(300),
            ejection_reset: Duration::from_secs(60),
            slow_start: Duration::from_secs(10),
            max_ejection_percent: 50,
            panic_mode: true,
        }
    }
}

/// A [`HealthConfig`] that cannot work; names the key.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum HealthConfigError {
    #[error("health.{0} must be at least 1")]
    Zero(&'static str),
    #[error("health.base_ejection must not exceed health.max_ejection")]
    BaseAboveMax,
    #[error("health.max_ejection must not exceed 1 day")]
    MaxTooLong,
    #[error("health.max_ejection_percent must be within 0..=100")]
    PercentAbove100,
}

impl HealthConfig {
    pub fn validate(&self) -> Result<(), HealthConfigError> {
        if self.rise == 0 {
            return Err(HealthConfigError::Zero("rise"));
        }
        if self.fall == 0 {
            return Err(HealthConfigError::Zero("fall"));
        }
        if self.base_ejection > self.max_ejection {
            return Err(HealthConfigError::BaseAboveMax);
        }
        if self.max_ejection > Duration::from_secs(86_400) {
            return Err(HealthConfigError::MaxTooLong);
        }
        if self.max_ejection_percent > 100 {
            return Err(HealthConfigError::PercentAbove100);
        }
        Ok(())
    }
}

/// What a call changed, for the caller to log and count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    Unchanged,
    /// Active checks brought the node up (`rise` reached).
    CheckUp,
    /// Active checks brought the node down (`fall` reached).
    CheckDown,
    /// Passive ejection was due but the pool's `max_ejection_percent` is
    /// reached: the node stays in.
    EjectionCapped,
    /// Passive ejection: out for `duration`; `count` is its place in the
    /// current run of ejections (1 for the first).
    Ejected {
        duration: Duration,
        count: u32,
    },
    /// The ejection time is over (reported once, by [`Health::poll`]).
    EjectionEnded,
    Admin {
        from: AdminState,
        to: AdminState,
    },
    Connected,
    Disconnected,
}

/// What routing needs of a node's [`Health`]: a `Copy` value that changes
/// only on a transition (admin, connection, checks, ejection, reload), so an
/// owner can publish it to every thread when it changes and let them read it
/// without a lock. Time-based changes (an ejection running out, a slow-start
/// ramp climbing) are computed from it and `now`, with no writer involved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    pub weight: u32,
    pub admin: AdminState,
    pub connected: bool,
    pub check_up: bool,
    /// End of the latest ejection (kept after it passes).
    pub ejected_until: Option<Instant>,
    /// Start of the latest slow-start ramp.
    pub ramp_from: Option<Instant>,
    /// Length of a slow-start ramp (from [`HealthConfig::slow_start`]).
    pub slow_start: Duration,
}

impl Standing {
    /// Is the node ejected at `now`?
    #[inline]
    pub fn ejected(&self, now: Instant) -> bool {
        self.ejected_until.is_some_and(|until| now < until)
    }

    /// See [`Health::panic_eligible`].
    #[inline]
    pub fn panic_eligible(&self) -> bool {
        self.admin == AdminState::Enabled && self.connected
    }

    /// See [`Health::eligible`].
    #[inline]
    pub fn eligible(&self, now: Instant) -> bool {
        self.panic_eligible() && self.check_up && !self.ejected(now)
    }

    /// See [`Health::ramp`].
    pub fn ramp(&self, now: Instant) -> u16 {
        let (Some(from), window) = (self.ramp_from, self.slow_start) else {
            return RAMP_FULL;
        };
        let elapsed = now.saturating_duration_since(from);
        if window.is_zero() || elapsed >= window {
            return RAMP_FULL;
        }
        let span = u128::from(RAMP_FULL - RAMP_START);
        let gained = span * elapsed.as_nanos() / window.as_nanos();
        RAMP_START
            .saturating_add(u16::try_from(gained).unwrap_or(RAMP_FULL))
            .min(RAMP_FULL)
    }

    /// See [`Health::effective_weight`].
    pub fn effective_weight(&self, now: Instant) -> u32 {
        if !self.eligible(now) || self.weight == 0 {
            return 0;
        }
        let (Some(from), window) = (self.ramp_from, self.slow_start) else {
            return self.weight;
        };
        let elapsed = now.saturating_duration_since(from);
        if window.is_zero() || elapsed >= window {
            return self.weight;
        }
        // weight × (0.1 + 0.9 × elapsed / window), rounded up, in integers.
        let w = u128::from(self.weight);
        let win = window.as_nanos();
        let num = w * (win + 9 * elapsed.as_nanos());
        let den = 10 * win;
        let ramped = num.div_ceil(den);
        u32::try_from(ramped)
            .unwrap_or(self.weight)
            .clamp(1, self.weight)
    }
}

/// Health of one node. See the module doc.
#[derive(Clone, Debug)]
pub struct Health {
    cfg: HealthConfig,
    weight: u32,
    admin: AdminState,
    connected: bool,
    ever_connected: bool,
    check_up: bool,
    check_ok_run: u32,
    check_fail_run: u32,
    live_fail_run: u32,
    /// End of the latest ejection (kept after it passes, for the reset rule).
    ejected_until: Option<Instant>,
    ejection_end_reported: bool,
    /// Ejections in the current run (for doubling).
    ejection_run: u32,
    /// Start of the current slow-start ramp.
    ramp_from: Option<Instant>,
}

impl Health {
    /// A node that checks consider up, admin enabled, not yet connected.
    /// No slow start applies to a node's first connection.
    pub fn new(cfg: HealthConfig, weight: u32) -> Self {
        Self {
            cfg,
            weight,
            admin: AdminState::Enabled,
            connected: false,
            ever_connected: false,
            check_up: true,
            check_ok_run: 0,
            check_fail_run: 0,
            live_fail_run: 0,
            ejected_until: None,
            ejection_end_reported: true,
            ejection_run: 0,
            ramp_from: None,
        }
    }

    pub fn config(&self) -> &HealthConfig {
        &self.cfg
    }

    /// New settings (config reload); the state is kept.
    pub fn set_config(&mut self, cfg: HealthConfig) {
        self.cfg = cfg;
    }

    pub fn weight(&self) -> u32 {
        self.weight
    }

    pub fn set_weight(&mut self, weight: u32) {
        self.weight = weight;
    }

    pub fn admin(&self) -> AdminState {
        self.admin
    }

    pub fn connected(&self) -> bool {
        self.connected
    }

    /// Do the active checks say up?
    pub fn check_up(&self) -> bool {
        self.check_up
    }

    /// What routing reads of this node (see [`Standing`]).
    pub fn standing(&self) -> Standing {
        Standing {
            weight: self.weight,
            admin: self.admin,
            connected: self.connected,
            check_up: self.check_up,
            ejected_until: self.ejected_until,
            ramp_from: self.ramp_from,
            slow_start: self.cfg.slow_start,
        }
    }

    /// Is the node ejected at `now`?
    pub fn ejected(&self, now: Instant) -> bool {
        self.standing().ejected(now)
    }

    /// The end of the current ejection, if the node is ejected at `now`.
    pub fn ejected_until(&self, now: Instant) -> Option<Instant> {
        self.ejected_until.filter(|&until| now < until)
    }

    /// May a new request go to this node when the pool is in panic (no node
    /// eligible)? Enabled and connected, whatever checks and ejection say.
    pub fn panic_eligible(&self) -> bool {
        self.standing().panic_eligible()
    }

    /// May a new request go to this node at `now`?
    pub fn eligible(&self, now: Instant) -> bool {
        self.standing().eligible(now)
    }

    /// Where the node is on its slow-start ramp at `now`, in thousandths:
    /// from 100 when the ramp starts, linearly, to [`RAMP_FULL`] at its end
    /// and whenever no ramp runs. Unlike [`Health::effective_weight`] it does
    /// not round to whole weight units, so algorithms that ignore weights
    /// (round robin, sticky) and nodes of weight 1 ramp too.
    pub fn ramp(&self, now: Instant) -> u16 {
        self.standing().ramp(now)
    }

    /// The weight balancers use at `now`: 0 if not eligible, otherwise the
    /// configured weight, ramped from 10% (at least 1) to 100% during slow
    /// start.
    pub fn effective_weight(&self, now: Instant) -> u32 {
        self.standing().effective_weight(now)
    }

    /// Records one active check result.
    pub fn record_check(&mut self, ok: bool, now: Instant) -> Transition {
        if ok {
            self.check_fail_run = 0;
            self.check_ok_run = self.check_ok_run.saturating_add(1);
            if !self.check_up && self.check_ok_run >= self.cfg.rise {
                self.check_up = true;
                self.ramp_from = Some(now);
                return Transition::CheckUp;
            }
        } else {
            self.check_ok_run = 0;
            self.check_fail_run = self.check_fail_run.saturating_add(1);
            if self.check_up && self.check_fail_run >= self.cfg.fall {
                self.check_up = false;
                return Transition::CheckDown;
            }
        }
        Transition::Unchanged
    }

    /// Records how one live request ended: `ok` for a response, not `ok` for
    /// a timeout or an error. Results that arrive while the node is ejected
    /// (stragglers sent before) neither count nor extend the ejection.
    pub fn record_response(&mut self, ok: bool, now: Instant) -> Transition {
        self.record_response_capped(ok, now, true)
    }

    /// [`Health::record_response`] in a pool that may be at its ejection cap:
    /// with `may_eject` false a failure run that reaches the threshold leaves
    /// the node in ([`Transition::EjectionCapped`]) and the run stands, so the
    /// next failure tries again once the cap allows.
    pub fn record_response_capped(
        &mut self,
        ok: bool,
        now: Instant,
        may_eject: bool,
    ) -> Transition {
        if self.ejected(now) {
            return Transition::Unchanged;
        }
        if ok {
            self.live_fail_run = 0;
            return Transition::Unchanged;
        }
        self.live_fail_run = self.live_fail_run.saturating_add(1);
        if self.cfg.ejection_threshold == 0 || self.live_fail_run < self.cfg.ejection_threshold {
            return Transition::Unchanged;
        }
        if !may_eject {
            return Transition::EjectionCapped;
        }
        self.eject(now)
    }

    /// Would recording this outcome eject the node (were the pool's cap not
    /// in the way)? Lets an owner take its ejection-cap lock only then.
    pub fn would_eject(&self, ok: bool, now: Instant) -> bool {
        !ok && !self.ejected(now)
            && self.cfg.ejection_threshold != 0
            && self.live_fail_run.saturating_add(1) >= self.cfg.ejection_threshold
    }

    fn eject(&mut self, now: Instant) -> Transition {
        let healthy_since_last = match self.ejected_until {
            Some(last_end) => now.saturating_duration_since(last_end) >= self.cfg.ejection_reset,
            None => true,
        };
        if healthy_since_last {
            self.ejection_run = 0;
        }
        let doublings = self.ejection_run.min(31);
        let duration = self
            .cfg
            .base_ejection
            .saturating_mul(1u32 << doublings)
            .min(self.cfg.max_ejection);
        self.ejection_run = self.ejection_run.saturating_add(1);
        let until = now.checked_add(duration).unwrap_or(now);
        self.ejected_until = Some(until);
        self.ejection_end_reported = false;
        self.ramp_from = Some(until);
        self.live_fail_run = 0;
        Transition::Ejected {
            duration,
            count: self.ejection_run,
        }
    }

    /// Reports [`Transition::EjectionEnded`] once when an ejection's time has
    /// passed. Eligibility does not depend on calling this.
    pub fn poll(&mut self, now: Instant) -> Transition {
        match self.ejected_until {
            Some(until) if !self.ejection_end_reported && now >= until => {
                self.ejection_end_reported = true;
                Transition::EjectionEnded
            }
            _ => Transition::Unchanged,
        }
    }

    /// Sets the admin state. Leaving `Disabled` starts slow start at `now`.
    pub fn set_admin(&mut self, to: AdminState, now: Instant) -> Transition {
        let from = self.admin;
        if from == to {
            return Transition::Unchanged;
        }
        self.admin = to;
        if from.is_out_of_service() && !to.is_out_of_service() {
            self.ramp_from = Some(now);
        }
        Transition::Admin { from, to }
    }

    /// Whether the node has at least one live connection. A reconnection
    /// (not the first connection) starts slow start at `now`.
    pub fn set_connected(&mut self, connected: bool, now: Instant) -> Transition {
        if connected == self.connected {
            return Transition::Unchanged;
        }
        self.connected = connected;
        if connected {
            if self.ever_connected {
                self.ramp_from = Some(now);
            }
            self.ever_connected = true;
            Transition::Connected
        } else {
            Transition::Disconnected
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn live(cfg: HealthConfig, weight: u32, t0: Instant) -> Health {
        let mut h = Health::new(cfg, weight);
        assert_eq!(h.set_connected(true, t0), Transition::Connected);
        h
    }

    #[test]
    fn defaults_match_the_brief() {
        let c = HealthConfig::default();
        assert_eq!((c.rise, c.fall, c.ejection_threshold), (2, 3, 5));
        assert_eq!(
            (c.base_ejection, c.max_ejection, c.slow_start),
            (secs(5), secs(300), secs(10))
        );
        assert_eq!(c.validate(), Ok(()));
        let parsed: HealthConfig = toml::from_str("rise = 1\nbase_ejection = \"500ms\"").unwrap();
        assert_eq!(parsed.rise, 1);
        assert_eq!(parsed.base_ejection, Duration::from_millis(500));
        assert_eq!(parsed.fall, 3);
        assert!(toml::from_str::<HealthConfig>("rize = 1").is_err());
        assert!(toml::from_str::<HealthConfig>("slow_start = 10").is_err());
        let bad = HealthConfig { rise: 0, ..c };
        assert_eq!(bad.validate(), Err(HealthConfigError::Zero("rise")));
        let bad = HealthConfig {
            base_ejection: secs(600),
            ..c
        };
        assert_eq!(bad.validate(), Err(HealthConfigError::BaseAboveMax));
    }

    #[test]
    fn needs_a_connection() {
        let t0 = Instant::now();
        let mut h = Health::new(HealthConfig::default(), 4);
        assert!(!h.eligible(t0));
        assert_eq!(h.effective_weight(t0), 0);
        assert_eq!(h.set_connected(true, t0), Transition::Connected);
        assert_eq!(h.set_connected(true, t0), Transition::Unchanged);
        assert!(h.eligible(t0));
        assert_eq!(
            h.effective_weight(t0),
            4,
            "no slow start on first connection"
        );
        assert_eq!(h.set_connected(false, t0), Transition::Disconnected);
        assert!(!h.eligible(t0));
        assert_eq!(h.set_connected(true, t0 + secs(1)), Transition::Connected);
        assert_eq!(
            h.effective_weight(t0 + secs(1)),
            1,
            "reconnect ramps (10% of 4, rounded up)"
        );
    }

    #[test]
    fn fall_then_rise() {
        let t0 = Instant::now();
        let mut h = live(HealthConfig::default(), 10, t0);
        assert_eq!(h.record_check(false, t0), Transition::Unchanged);
        assert_eq!(h.record_check(false, t0), Transition::Unchanged);
        assert_eq!(
            h.record_check(true, t0),
            Transition::Unchanged,
            "a success resets the run"
        );
        assert_eq!(h.record_check(false, t0), Transition::Unchanged);
        assert_eq!(h.record_check(false, t0), Transition::Unchanged);
        assert!(h.eligible(t0));
        assert_eq!(h.record_check(false, t0), Transition::CheckDown);
        assert!(!h.eligible(t0) && !h.check_up());
        assert_eq!(h.record_check(false, t0), Transition::Unchanged);
        assert_eq!(h.record_check(true, t0), Transition::Unchanged);
        assert!(!h.eligible(t0));
        assert_eq!(h.record_check(true, t0), Transition::CheckUp);
        assert!(h.eligible(t0));
        assert_eq!(h.record_check(true, t0), Transition::Unchanged);
    }

    #[test]
    fn ejection_doubles_caps_and_resets() {
        let cfg = HealthConfig {
            ejection_threshold: 2,
            base_ejection: secs(5),
            max_ejection: secs(30),
            ejection_reset: secs(60),
            ..HealthConfig::default()
        };
        let t0 = Instant::now();
        let mut h = live(cfg, 1, t0);
        let mut now = t0;
        let eject = |h: &mut Health, now: Instant| {
            assert_eq!(h.record_response(false, now), Transition::Unchanged);
            h.record_response(false, now)
        };
        let expect = [5u64, 10, 20, 30, 30];
        for (i, &want) in expect.iter().enumerate() {
            let t = eject(&mut h, now);
            assert_eq!(
                t,
                Transition::Ejected {
                    duration: secs(want),
                    count: i as u32 + 1
                }
            );
            assert!(!h.eligible(now));
            assert_eq!(h.ejected_until(now), Some(now + secs(want)));
            // Stragglers while ejected do not count.
            assert_eq!(h.record_response(false, now), Transition::Unchanged);
            assert_eq!(
                h.poll(now + secs(want) - Duration::from_millis(1)),
                Transition::Unchanged
            );
            now += secs(want);
            assert!(h.eligible(now));
            assert_eq!(h.poll(now), Transition::EjectionEnded);
            assert_eq!(h.poll(now), Transition::Unchanged, "reported once");
            now += secs(1);
        }
        // A long healthy period: the next ejection is short again.
        now += secs(60);
        assert_eq!(
            eject(&mut h, now),
            Transition::Ejected {
                duration: secs(5),
                count: 1
            }
        );
    }

    #[test]
    fn successes_break_the_failure_run() {
        let t0 = Instant::now();
        let mut h = live(HealthConfig::default(), 1, t0);
        for _ in 0..10 {
            for _ in 0..4 {
                assert_eq!(h.record_response(false, t0), Transition::Unchanged);
            }
            assert_eq!(h.record_response(true, t0), Transition::Unchanged);
        }
        assert!(h.eligible(t0));
        let off = HealthConfig {
            ejection_threshold: 0,
            ..HealthConfig::default()
        };
        let mut h = live(off, 1, t0);
        for _ in 0..100 {
            assert_eq!(h.record_response(false, t0), Transition::Unchanged);
        }
        assert!(h.eligible(t0), "threshold 0 turns ejection off");
    }

    #[test]
    fn drain_and_disable() {
        let t0 = Instant::now();
        let mut h = live(HealthConfig::default(), 10, t0);
        assert_eq!(
            h.set_admin(AdminState::Drain, t0),
            Transition::Admin {
                from: AdminState::Enabled,
                to: AdminState::Drain
            }
        );
        assert!(!h.eligible(t0));
        assert!(h.admin().keeps_in_flight());
        assert_eq!(h.set_admin(AdminState::Drain, t0), Transition::Unchanged);
        assert!(matches!(
            h.set_admin(AdminState::Enabled, t0),
            Transition::Admin { .. }
        ));
        assert_eq!(h.effective_weight(t0), 10, "leaving drain: no ramp");
        let _ = h.set_admin(AdminState::Disabled, t0);
        assert!(h.admin().keeps_in_flight(), "disable lets in-flight finish");
        let _ = h.set_admin(AdminState::ForcedOffline, t0);
        assert!(!h.eligible(t0));
        assert!(!h.admin().keeps_in_flight());
        let _ = h.set_admin(AdminState::Enabled, t0);
        assert_eq!(h.effective_weight(t0), 1, "leaving disabled: ramp from 10%");
    }

    #[test]
    fn slow_start_ramps_linearly() {
        let cfg = HealthConfig {
            fall: 1,
            rise: 1,
            slow_start: secs(10),
            ..HealthConfig::default()
        };
        let t0 = Instant::now();
        let mut h = live(cfg, 100, t0);
        assert_eq!(h.record_check(false, t0), Transition::CheckDown);
        assert_eq!(h.effective_weight(t0), 0);
        assert_eq!(h.record_check(true, t0), Transition::CheckUp);
        let at = |s: u64| h.effective_weight(t0 + secs(s));
        assert_eq!(at(0), 10);
        assert_eq!(at(1), 19);
        assert_eq!(at(5), 55);
        assert_eq!(at(9), 91);
        assert_eq!(at(10), 100);
        assert_eq!(at(1000), 100);
        // Monotone.
        let mut last = 0;
        for ms in (0..=10_000).step_by(250) {
            let w = h.effective_weight(t0 + Duration::from_millis(ms));
            assert!(w >= last && (10..=100).contains(&w));
            last = w;
        }
        // Weight 1 stays at 1, weight 0 stays at 0.
        h.set_weight(1);
        assert_eq!(h.effective_weight(t0), 1);
        h.set_weight(0);
        assert_eq!(h.effective_weight(t0), 0);
    }

    #[test]
    fn ramp_climbs_in_thousandths_whatever_the_weight() {
        let cfg = HealthConfig {
            fall: 1,
            rise: 1,
            slow_start: secs(10),
            ..HealthConfig::default()
        };
        let t0 = Instant::now();
        // Weight 1: the effective weight cannot show the ramp, the ramp does.
        let mut h = live(cfg, 1, t0);
        assert_eq!(h.ramp(t0), RAMP_FULL, "no ramp on first connection");
        let _ = h.record_check(false, t0);
        let _ = h.record_check(true, t0);
        let at = |s: u64| h.ramp(t0 + secs(s));
        assert_eq!(at(0), RAMP_START);
        assert_eq!(at(1), 190);
        assert_eq!(at(5), 550);
        assert_eq!(at(10), RAMP_FULL);
        assert_eq!(at(1000), RAMP_FULL);
        assert_eq!(h.effective_weight(t0), 1);
        let mut last = 0;
        for ms in (0..=10_000).step_by(100) {
            let r = h.ramp(t0 + Duration::from_millis(ms));
            assert!(r >= last && (RAMP_START..=RAMP_FULL).contains(&r));
            last = r;
        }
        // Slow start off: never warming.
        h.set_config(HealthConfig {
            slow_start: Duration::ZERO,
            ..cfg
        });
        assert_eq!(h.ramp(t0), RAMP_FULL);
    }

    #[test]
    fn would_eject_foretells_record_response() {
        let cfg = HealthConfig {
            ejection_threshold: 3,
            ..HealthConfig::default()
        };
        let t0 = Instant::now();
        let mut h = live(cfg, 1, t0);
        for _ in 0..2 {
            assert!(!h.would_eject(false, t0));
            assert_eq!(h.record_response(false, t0), Transition::Unchanged);
        }
        assert!(!h.would_eject(true, t0), "a success never ejects");
        assert!(h.would_eject(false, t0));
        let before = h.standing();
        assert!(matches!(
            h.record_response(false, t0),
            Transition::Ejected { .. }
        ));
        assert_ne!(h.standing(), before, "an ejection changes the standing");
        assert!(!h.would_eject(false, t0), "stragglers while ejected");
        let off = HealthConfig {
            ejection_threshold: 0,
            ..cfg
        };
        assert!(!live(off, 1, t0).would_eject(false, t0));
    }

    #[test]
    fn standing_changes_only_on_transitions() {
        let t0 = Instant::now();
        let mut h = live(HealthConfig::default(), 4, t0);
        let s = h.standing();
        // Runs of checks and answers below their thresholds leave it alone.
        let _ = h.record_check(false, t0);
        let _ = h.record_response(false, t0);
        let _ = h.record_response(true, t0);
        assert_eq!(h.standing(), s);
        // Time alone moves what is computed from it, not the value.
        let _ = h.set_connected(false, t0);
        let _ = h.set_connected(true, t0 + secs(1));
        let s = h.standing();
        assert_eq!(s.effective_weight(t0 + secs(1)), 1);
        assert_eq!(s.effective_weight(t0 + secs(11)), 4);
        assert_eq!(h.standing(), s);
    }

    #[test]
    fn slow_start_after_ejection_begins_when_it_ends() {
        let cfg = HealthConfig {
            ejection_threshold: 1,
            ..HealthConfig::default()
        };
        let t0 = Instant::now();
        let mut h = live(cfg, 50, t0);
        assert!(matches!(
            h.record_response(false, t0),
            Transition::Ejected { .. }
        ));
        assert_eq!(h.effective_weight(t0 + secs(4)), 0);
        assert_eq!(h.effective_weight(t0 + secs(5)), 5);
        assert_eq!(h.effective_weight(t0 + secs(15)), 50);
    }
}
