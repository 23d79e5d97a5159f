//! The outlier policy of a node pool: how many nodes passive ejection may
//! take out, and what happens when no node is eligible. Pure functions over
//! the node snapshots a pool publishes and a time the caller gives, so the
//! tests run on a fake clock (a base `Instant` plus offsets). `link/back/pool.rs`
//! applies them under its locks.
//!
//! - **The ejection cap** (as Envoy's outlier detection has
//!   `max_ejection_percent`): a node is ejected only while fewer than that
//!   share of the pool's members is ejected; one node always may be. A burst
//!   of timeouts then costs at most that share of the pool, never the
//!   service.
//! - **Panic routing**: when no node is eligible but some are connected and
//!   enabled (every active check failing at once says more about the checks
//!   than about the nodes), route to those rather than decline everything.
//!
//! Slow start (a node coming back ramps up) is part of each node's standing
//! ([`super::Standing::ramp`]) and of the balancers, not of this policy.

use std::time::Instant;

use super::{NodeSnapshot, NodeView};

/// The pool-wide part of `[service.back.health]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutlierPolicy {
    /// At most this share (percent) of the members is ejected at once.
    pub max_ejection_percent: u32,
    /// Route to connected, enabled nodes when none is eligible.
    pub panic_mode: bool,
}

impl OutlierPolicy {
    /// The policy a health config sets.
    pub fn of(cfg: &super::HealthConfig) -> OutlierPolicy {
        OutlierPolicy {
            max_ejection_percent: cfg.max_ejection_percent,
            panic_mode: cfg.panic_mode,
        }
    }

    /// How many members may be ejected at once: the cap's share of them,
    /// rounded down, but at least one.
    pub fn ejection_cap(&self, members: usize) -> usize {
        let share = members.saturating_mul(self.max_ejection_percent as usize) / 100;
        share.max(1)
    }

    /// May one more node be ejected at `now`? `members` are the snapshots of
    /// the pool's members (removed nodes left out); a member whose ejection
    /// has run out by `now` no longer counts.
    pub fn may_eject_another<'a>(
        &self,
        members: impl IntoIterator<Item = &'a NodeSnapshot>,
        now: Instant,
    ) -> bool {
        let (mut count, mut ejected) = (0usize, 0usize);
        for s in members {
            count += 1;
            ejected += usize::from(s.standing.ejected(now));
        }
        ejected < self.ejection_cap(count)
    }

    /// Should a pick that found no node among `views` be made again as panic
    /// routing sees the nodes? Only when panic mode is on and no node is
    /// eligible: a pick that failed for other reasons (the rules' subset,
    /// every eligible node busy elsewhere) is not a panic.
    pub fn panic_applies(&self, views: &[NodeView]) -> bool {
        self.panic_mode && none_eligible(views)
    }
}

/// True when no node of `views` is eligible: a pick that still found a node
/// (panic routing) is a pick in panic.
pub fn none_eligible(views: &[NodeView]) -> bool {
    !views.iter().any(|v| v.eligible)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{EwmaConfig, HealthConfig, NodeId, NodeState};

    /// A fake clock: every time is this base plus an offset.
    fn clock() -> impl Fn(u64) -> Instant {
        let base = Instant::now();
        move |ms| base + Duration::from_millis(ms)
    }

    fn cfg(threshold: u32, percent: u32) -> HealthConfig {
        HealthConfig {
            ejection_threshold: threshold,
            base_ejection: Duration::from_secs(10),
            max_ejection_percent: percent,
            slow_start: Duration::ZERO,
            ..HealthConfig::default()
        }
    }

    /// `n` connected, enabled nodes as their pool would hold them.
    fn nodes(n: usize, c: &HealthConfig, now: Instant) -> Vec<NodeState> {
        (0..n)
            .map(|i| {
                let id = NodeId::new(format!("{:02}", i + 1).as_bytes()).expect("an id");
                let mut s = NodeState::new(id, 1, 0, *c, EwmaConfig::default());
                s.health_mut().set_connected(true, now);
                s
            })
            .collect()
    }

    fn snapshots(states: &[NodeState]) -> Vec<NodeSnapshot> {
        states.iter().map(NodeState::snapshot).collect()
    }

    /// Fails node `i` until it would be ejected, asking the policy first as
    /// the pool does; true if it was ejected.
    fn fail_until_ejected(
        policy: &OutlierPolicy,
        states: &mut [NodeState],
        i: usize,
        now: Instant,
    ) -> bool {
        loop {
            if states[i].health().would_eject(false, now) {
                let may = policy.may_eject_another(&snapshots(states), now);
                let t = states[i].record_outcome(false, Duration::from_secs(1), now, may);
                return matches!(t, crate::Transition::Ejected { .. });
            }
            states[i].record_outcome(false, Duration::from_secs(1), now, true);
        }
    }

    #[test]
    fn the_cap_is_a_share_of_the_members_and_never_below_one() {
        let p = |percent| OutlierPolicy {
            max_ejection_percent: percent,
            panic_mode: true,
        };
        assert_eq!(p(50).ejection_cap(4), 2);
        assert_eq!(p(50).ejection_cap(5), 2);
        assert_eq!(p(50).ejection_cap(1), 1);
        assert_eq!(p(0).ejection_cap(10), 1, "one node always may go");
        assert_eq!(p(100).ejection_cap(3), 3);
        assert_eq!(p(100).ejection_cap(usize::MAX), usize::MAX / 100);
    }

    #[test]
    fn nodes_failing_at_once_are_ejected_up_to_the_cap_only() {
        let at = clock();
        let c = cfg(3, 50);
        let policy = OutlierPolicy::of(&c);
        let mut states = nodes(4, &c, at(0));
        let ejected: Vec<bool> = (0..4)
            .map(|i| fail_until_ejected(&policy, &mut states, i, at(100)))
            .collect();
        assert_eq!(ejected, [true, true, false, false]);
        assert!(!policy.may_eject_another(&snapshots(&states), at(100)));
    }

    #[test]
    fn an_ejection_that_ran_out_frees_its_place_under_the_cap() {
        let at = clock();
        let c = cfg(1, 50);
        let policy = OutlierPolicy::of(&c);
        let mut states = nodes(2, &c, at(0));
        assert!(fail_until_ejected(&policy, &mut states, 0, at(0)));
        assert!(!policy.may_eject_another(&snapshots(&states), at(9_999)));
        // Ten seconds on the fake clock: node 01's ejection is over.
        assert!(policy.may_eject_another(&snapshots(&states), at(10_000)));
        assert!(fail_until_ejected(&policy, &mut states, 1, at(10_000)));
    }

    #[test]
    fn panic_applies_only_with_no_eligible_node_and_panic_mode_on() {
        let at = clock();
        let c = cfg(1, 100);
        let on = OutlierPolicy::of(&c);
        let off = OutlierPolicy {
            panic_mode: false,
            ..on
        };
        let mut states = nodes(2, &c, at(0));
        let views =
            |s: &[NodeState], now| -> Vec<NodeView> { s.iter().map(|n| n.view(now)).collect() };
        assert!(!on.panic_applies(&views(&states, at(0))));
        for i in 0..2 {
            assert!(fail_until_ejected(&on, &mut states, i, at(0)));
        }
        let all_out = views(&states, at(1));
        assert!(none_eligible(&all_out));
        assert!(on.panic_applies(&all_out));
        assert!(!off.panic_applies(&all_out));
        // Panic routing still takes the connected, enabled nodes.
        assert!(states.iter().all(|s| s.panic_view(at(1)).eligible));
        // Once the ejections run out, the pool is out of panic.
        assert!(!on.panic_applies(&views(&states, at(10_000))));
    }
}
