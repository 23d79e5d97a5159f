//! Passive ejection end to end in process (`isoswitch::link::inproc::Rig`)
//! on the rig's clock: a node whose answers time out is taken out of the
//! pool for its ejection time and comes back at its end, to the
//! millisecond; the pool's cap; declines that are not the node's fault.
//! None sleeps: the rig's clock is stepped (`Rig::advance`) and the
//! sweeper run (`Rig::expire`). The health rules themselves are unit-tested
//! in crates/route/src/health.rs; this is the service applying them to
//! live traffic. Health checks over sockets stay in tests/hardening.rs.

use std::sync::atomic::Ordering;
use std::time::Duration;

use isoswitch::config::ServiceConfig;
use isoswitch::link::inproc::Rig;
use isoswitch::route::AdminState;

#[path = "common/clock.rs"]
mod clock;
#[path = "common/owed.rs"]
mod owed;
#[path = "common/procs.rs"]
mod procs;
use clock::*;

const MS: Duration = Duration::from_millis(1);
/// `PosToml`'s deadline of a purchase (02x0).
const PURCHASE: Duration = Duration::from_millis(500);

/// `nodes` nodes whose answers time out `threshold` times in a row are
/// ejected for `ejection` (no slow start after, so a node back is back
/// at its full share).
fn ejecting(nodes: usize, threshold: u32, ejection: Duration) -> ServiceConfig {
    let mut cfg = pos_config(nodes);
    let health = &mut cfg.back.health.state;
    health.ejection_threshold = threshold;
    health.base_ejection = ejection;
    health.max_ejection = ejection;
    health.slow_start = Duration::ZERO;
    cfg
}

fn eligible(rig: &Rig, node: usize) -> bool {
    rig.service.view().pool.eligible(node, rig.now())
}

/// The nodes `n` purchases went to, from STAN `first` on.
fn spread(rig: &mut Rig, first: u32, n: u32) -> Vec<usize> {
    (first..first + n)
        .map(|stan| to_node(rig, &purchase(stan)).0)
        .collect()
}

/// Node 0 never answers: its second timeout in a row ejects it, and for
/// its 5 s ejection every purchase goes to node 1; at the end of those 5 s
/// (not a millisecond before) round robin reaches node 0 again.
#[tokio::test(start_paused = true)]
async fn a_node_whose_answers_time_out_is_ejected_until_its_time_is_up() {
    bounded(async {
        let ejection = Duration::from_secs(5);
        let mut rig = rig(ejecting(2, 2, ejection));
        for stan in 1..=4 {
            let (node, got) = to_node(&mut rig, &purchase(stan));
            if node == 1 {
                let approval = answer(&rig, &got, "00");
                assert_eq!(relay(&mut rig, node, &approval).1, "00");
            }
        }
        rig.advance(PURCHASE);
        assert_eq!(rig.expire(), 2, "node 0's two purchases");
        assert!(!eligible(&rig, 0), "ejected at its second timeout");
        assert!(eligible(&rig, 1));
        let while_out = spread(&mut rig, 10, 4);
        assert_eq!(while_out, [1, 1, 1, 1], "only node 1 while 0 is out");
        rig.advance(ejection - MS);
        assert!(!eligible(&rig, 0), "1 ms before its ejection ends");
        rig.advance(MS);
        assert!(eligible(&rig, 0), "back when its ejection ends");
        let back = spread(&mut rig, 20, 4);
        assert_eq!(back.iter().filter(|&&n| n == 0).count(), 2, "{back:?}");
    })
    .await;
}

/// Sends purchases from STAN `first` on until `times` of them went to
/// `node` (the others' nodes answer at once), then lets those time out:
/// the sweep that declines them is at the rig's clock when it returns.
fn time_out_at(rig: &mut Rig, node: usize, times: usize, first: u32) {
    let mut stan = first;
    let mut at_node = 0;
    while at_node < times {
        let (to, got) = to_node(rig, &purchase(stan));
        stan += 1;
        if to == node {
            at_node += 1;
        } else {
            let approval = answer(rig, &got, "00");
            assert_eq!(relay(rig, to, &approval).1, "00");
        }
    }
    rig.advance(PURCHASE);
    assert_eq!(rig.expire(), times, "node {node}'s purchases time out");
    for _ in 0..times {
        assert_eq!(answered(rig, "a timeout decline").1, "68");
    }
}

/// Out for `ejection` from now: still out a millisecond before its end,
/// back at it.
fn out_for(rig: &mut Rig, node: usize, ejection: Duration) {
    assert!(!eligible(rig, node), "ejected");
    rig.advance(ejection - MS);
    assert!(!eligible(rig, node), "1 ms before {ejection:?} are up");
    rig.advance(MS);
    assert!(eligible(rig, node), "back after {ejection:?}");
}

/// An ejection that follows another doubles (5 s, then 10 s), up to
/// `max_ejection`; after `ejection_reset` (1 min) without one the next is
/// `base_ejection` again.
#[tokio::test(start_paused = true)]
async fn a_repeated_ejection_doubles_and_starts_over_after_the_reset() {
    bounded(async {
        let base = Duration::from_secs(5);
        let mut cfg = ejecting(2, 2, base);
        cfg.back.health.state.max_ejection = Duration::from_secs(300);
        cfg.back.health.state.ejection_reset = Duration::from_secs(60);
        let mut rig = rig(cfg);
        time_out_at(&mut rig, 0, 2, 1);
        out_for(&mut rig, 0, base);
        time_out_at(&mut rig, 0, 2, 100);
        out_for(&mut rig, 0, 2 * base);
        rig.advance(Duration::from_secs(60));
        time_out_at(&mut rig, 0, 2, 200);
        out_for(&mut rig, 0, base);
    })
    .await;
}

/// Moved from tests/hardening.rs, where nodes answering after 20 s waited
/// out real 100 ms timeouts: nodes that never answer time out, but passive
/// ejection stops at `max_ejection_percent` (50%): the pool keeps half its
/// nodes, and the ejections past the cap are counted as refused.
#[tokio::test(start_paused = true)]
async fn ejection_stops_at_the_pool_cap() {
    bounded(async {
        let mut rig = rig(ejecting(4, 1, Duration::from_secs(30)));
        let sent = spread(&mut rig, 1, 12);
        for node in 0..4 {
            assert_eq!(sent.iter().filter(|&&n| n == node).count(), 3, "{sent:?}");
        }
        rig.advance(PURCHASE);
        assert_eq!(rig.expire(), 12);
        for _ in 0..12 {
            assert_eq!(answered(&mut rig, "a timeout decline").1, "68");
        }
        let out = (0..4).filter(|&i| !eligible(&rig, i)).count();
        assert_eq!(out, 2, "half of 4 nodes at most, and the cap was reached");
        let nodes = rig.service.view().pool.nodes();
        let capped: u64 = nodes
            .iter()
            .map(|n| n.counters.ejections_capped.load(Ordering::Relaxed))
            .sum();
        assert!(capped > 0, "ejections past the cap were refused");
    })
    .await;
}

/// Moved from tests/hardening.rs (there a node answering after 2 s kept
/// the requests in flight): declines that are not the node's fault, here
/// its in-flight requests declined (91) because an operator forced it
/// offline, do not eject it, even at a threshold of one.
#[tokio::test(start_paused = true)]
async fn force_offline_declines_do_not_count_against_the_node() {
    bounded(async {
        let mut rig = rig(ejecting(1, 1, Duration::from_secs(30)));
        spread(&mut rig, 1, 3);
        let svc = std::sync::Arc::clone(&rig.service);
        assert!(svc.set_node_admin(0, AdminState::ForcedOffline, rig.now()));
        for _ in 0..3 {
            assert_eq!(answered(&mut rig, "declined at once").1, "91");
        }
        assert!(svc.set_node_admin(0, AdminState::Enabled, rig.now()));
        assert!(eligible(&rig, 0), "enabled again and not ejected");
        assert_eq!(spread(&mut rig, 10, 1), [0], "and it takes requests");
    })
    .await;
}
