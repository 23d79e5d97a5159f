//! The pool under threads and a fake clock: rotation, weights, ejection,
//! the cap, panic routing, runtime adds, reloads.

use std::sync::Barrier;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::*;
use crate::link::io::writer::Outbound;
use crate::route::HealthConfig;

const MTI: &[u8; 4] = b"0200";

fn no_fields(_: u16) -> Option<&'static [u8]> {
    None
}

/// A pool of nodes `01`, `02`, ... with these weights, each with one
/// connection up (a channel nothing reads: picks only clone its sender).
fn connected_pool(
    algorithm: &str,
    weights: &[u32],
    health: HealthConfig,
    t0: Instant,
) -> (NodePool, Vec<mpsc::Receiver<Outbound>>) {
    let mut text = format!("algorithm = \"{algorithm}\"\nconnections_per_node = 1\n");
    for (i, w) in weights.iter().enumerate() {
        text += &format!(
            "[[node]]\nid = \"{:02}\"\naddress = \"127.0.0.1:{}\"\nweight = {w}\n",
            i + 1,
            9000 + i
        );
    }
    let mut back: BackConfig = toml::from_str(&text).unwrap();
    back.health.state = health;
    let pool = NodePool::new("test", &back, t0).unwrap();
    let receivers = (0..weights.len()).map(|i| connect(&pool, i, t0)).collect();
    (pool, receivers)
}

fn connect(pool: &NodePool, node: usize, now: Instant) -> mpsc::Receiver<Outbound> {
    let (tx, rx) = mpsc::channel(1);
    let id = 100 + node as u64;
    pool.set_conn(node, 0, Some(ConnHandle { id, tx: tx.into() }), now);
    rx
}

fn pick(pool: &NodePool, now: Instant) -> Option<usize> {
    pool.pick(MTI, no_fields, None, now)
        .ok()
        .map(|(picked, _)| picked.in_flight())
}

/// `threads` threads pick `rounds` × `batch` times each, holding `batch`
/// requests in flight and then finishing them (answered, declined without
/// verdict, released, in turn). Picks per node.
fn pick_and_finish_from_threads(
    pool: &NodePool,
    now: Instant,
    threads: usize,
    rounds: usize,
    batch: usize,
) -> Vec<usize> {
    let n = pool.nodes().len();
    let per: Vec<Vec<usize>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let mut counts = vec![0; n];
                    let mut held = Vec::with_capacity(batch);
                    for _ in 0..rounds {
                        held.extend((0..batch).map(|_| pick(pool, now).unwrap()));
                        for (k, i) in held.drain(..).enumerate() {
                            counts[i] += 1;
                            match k % 3 {
                                0 => pool.finished(i, true, Duration::from_millis(2), now),
                                1 => pool.finished_without_verdict(i),
                                _ => pool.released(i),
                            }
                        }
                    }
                    counts
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (0..n).map(|i| per.iter().map(|c| c[i]).sum()).collect()
}

#[test]
fn picks_from_threads_rotate_exactly_and_outstanding_returns_to_zero() {
    let t0 = Instant::now();
    let (pool, _rx) = connected_pool("round-robin", &[1, 1, 1], HealthConfig::default(), t0);
    assert!(pool.set_admin(1, AdminState::Disabled, t0));
    let counts = pick_and_finish_from_threads(&pool, t0, 4, 30, 100);
    assert_eq!(
        counts,
        [6000, 0, 6000],
        "never the disabled node; exact split"
    );
    for (i, &picked) in counts.iter().enumerate() {
        assert_eq!(pool.outstanding(i), 0, "node {i}");
        let c = &pool.node(i).unwrap().counters;
        assert_eq!(c.sent.load(Ordering::Relaxed), picked as u64);
    }
}

#[test]
fn a_pick_is_given_back_unless_handed_on() {
    let t0 = Instant::now();
    let (pool, _rx) = connected_pool("round-robin", &[1], HealthConfig::default(), t0);
    let (picked, _conn) = pool.pick(MTI, no_fields, None, t0).unwrap();
    assert_eq!(pool.outstanding(0), 1);
    drop(picked);
    assert_eq!(pool.outstanding(0), 0, "dropped: given back");
    let (picked, _conn) = pool.pick(MTI, no_fields, None, t0).unwrap();
    let node = picked.in_flight();
    assert_eq!(pool.outstanding(node), 1, "in flight: the entry owns it");
    pool.finished(node, true, Duration::from_millis(1), t0);
    let picked = pool.pick_where(MTI, no_fields, None, t0, |_| true).unwrap();
    picked.finished(false, Duration::ZERO, t0);
    assert_eq!(pool.outstanding(0), 0);
    let c = &pool.node(0).unwrap().counters;
    assert_eq!(
        c.sent.load(Ordering::Relaxed),
        2,
        "the pick given back was never sent"
    );
    assert_eq!(c.answered.load(Ordering::Relaxed), 1);
    assert_eq!(c.declined.load(Ordering::Relaxed), 1);
}

/// The key node: always the first usable one of the order, never
/// balanced; the next only while it is down, disabled or unconnected.
#[test]
fn pick_first_takes_the_first_usable_node_every_time() {
    let t0 = Instant::now();
    let (pool, _rx) = connected_pool("round-robin", &[1, 1, 1], HealthConfig::default(), t0);
    let first = |order: &[usize]| {
        pool.pick_first(order.iter().copied(), t0)
            .ok()
            .map(|(p, _)| p.node())
    };
    for _ in 0..5 {
        assert_eq!(first(&[1, 0, 2]), Some(1));
    }
    assert_eq!(pool.outstanding(1), 0, "each pick dropped: given back");
    assert!(pool.set_admin(1, AdminState::Disabled, t0));
    assert_eq!(first(&[1, 0, 2]), Some(0), "the next while 1 is disabled");
    pool.set_conn(0, 0, None, t0);
    assert_eq!(first(&[1, 0, 2]), Some(2), "0 has no connection");
    assert_eq!(first(&[1, 0]), None, "none of these is usable");
    assert_eq!(first(&[7]), None, "no such node");
    assert!(pool.set_admin(1, AdminState::Enabled, t0));
    assert_eq!(first(&[1, 0, 2]), Some(1), "back to the first");
}

#[test]
fn weighted_picks_from_threads_follow_the_weights() {
    let t0 = Instant::now();
    let (pool, _rx) = connected_pool("weighted", &[5, 1, 1], HealthConfig::default(), t0);
    let counts = pick_and_finish_from_threads(&pool, t0, 4, 10, 700);
    for (got, want) in counts.iter().zip([20_000usize, 4000, 4000]) {
        assert!(got.abs_diff(want) <= 100, "{counts:?}");
    }
    assert!((0..3).all(|i| pool.outstanding(i) == 0));
}

#[test]
fn least_outstanding_from_threads_sees_the_live_counts() {
    let t0 = Instant::now();
    let (pool, _rx) = connected_pool("least-outstanding", &[1, 1, 1], HealthConfig::default(), t0);
    // Requests held open on node 0 steer the picks away from it.
    for _ in 0..50 {
        let picked = pool
            .pick_where(MTI, no_fields, None, t0, |i| i == 0)
            .unwrap();
        assert_eq!(picked.in_flight(), 0);
    }
    let counts = pick_and_finish_from_threads(&pool, t0, 4, 10, 10);
    assert!(counts[0] < counts[1] / 4, "{counts:?}");
    for _ in 0..50 {
        pool.released(0);
    }
    assert!((0..3).all(|i| pool.outstanding(i) == 0));
}

#[test]
fn peak_ewma_reads_the_latency_answers_publish() {
    let t0 = Instant::now();
    let (pool, _rx) = connected_pool("peak-ewma", &[1, 1], HealthConfig::default(), t0);
    for _ in 0..5 {
        pool.finished(0, true, Duration::from_millis(500), t0);
        pool.finished(1, true, Duration::from_millis(1), t0);
    }
    // Two nodes: both are always the two choices; the fast one wins.
    for _ in 0..100 {
        let i = pick(&pool, t0).unwrap();
        assert_eq!(i, 1);
        pool.released(i);
    }
    let s = pool.status(0, t0).unwrap();
    assert_eq!(s.latency, Duration::from_millis(500));
}

#[test]
fn an_ejection_ends_and_the_ramp_climbs_by_time_alone() {
    let health = HealthConfig {
        ejection_threshold: 2,
        base_ejection: Duration::from_secs(5),
        slow_start: Duration::from_secs(10),
        max_ejection_percent: 100,
        ..HealthConfig::default()
    };
    let t0 = Instant::now();
    let (pool, _rx) = connected_pool("round-robin", &[1, 1], health, t0);
    pool.finished(0, false, Duration::from_secs(1), t0);
    assert!(pool.eligible(0, t0));
    pool.finished(0, false, Duration::from_secs(1), t0);
    assert!(!pool.eligible(0, t0), "two timeouts eject it");
    let at = |s: u64| t0 + Duration::from_secs(s);
    assert!((0..100).all(|_| pick(&pool, at(4)) == Some(1)));
    // No writer ran since: the pick alone sees the ejection over, and the
    // node ramping up from 10% of its share.
    assert!(pool.eligible(0, at(5)));
    let share =
        |now: Instant| (0..2000).filter(|_| pick(&pool, now) == Some(0)).count() as f64 / 2000.0;
    let early = share(at(5));
    assert!(early > 0.02 && early < 0.2, "{early}");
    let late = share(at(12));
    assert!(late > early && late < 0.5, "{late}");
    assert_eq!(share(at(15)), 0.5, "ramp over: an exact rotation");
    let s = pool.status(0, at(15)).unwrap();
    assert_eq!((s.state(), s.eligible), ("up", true));
}

#[test]
fn the_ejection_cap_holds_when_nodes_fail_at_once() {
    let health = HealthConfig {
        ejection_threshold: 1,
        max_ejection_percent: 50,
        ..HealthConfig::default()
    };
    let t0 = Instant::now();
    for _ in 0..20 {
        let (pool, _rx) = connected_pool("round-robin", &[1, 1, 1, 1], health, t0);
        let start = Barrier::new(4);
        std::thread::scope(|s| {
            for i in 0..4 {
                let (pool, start) = (&pool, &start);
                s.spawn(move || {
                    start.wait();
                    pool.finished(i, false, Duration::from_secs(1), t0);
                });
            }
        });
        let ejected = (0..4).filter(|&i| !pool.eligible(i, t0)).count();
        let capped: u64 = pool
            .nodes()
            .iter()
            .map(|n| n.counters.ejections_capped.load(Ordering::Relaxed))
            .sum();
        assert_eq!((ejected, capped), (2, 2), "half of four, however they race");
    }
}

/// A reload's new cap and panic mode apply to the running pool.
#[test]
fn a_reloaded_cap_and_panic_mode_apply_at_once() {
    let health = HealthConfig {
        ejection_threshold: 1,
        max_ejection_percent: 50,
        ..HealthConfig::default()
    };
    let t0 = Instant::now();
    let (pool, _rx) = connected_pool("round-robin", &[1, 1], health, t0);
    pool.set_health_config(HealthConfig {
        max_ejection_percent: 100,
        panic_mode: false,
        ..health
    });
    pool.finished(0, false, Duration::from_secs(1), t0);
    pool.finished(1, false, Duration::from_secs(1), t0);
    assert!(
        !pool.eligible(0, t0) && !pool.eligible(1, t0),
        "both ejected under a 100% cap"
    );
    assert_eq!(pick(&pool, t0), None, "no panic routing once it is off");
}

#[test]
fn a_node_added_at_runtime_joins_the_rotation() {
    let t0 = Instant::now();
    let (pool, _rx) = connected_pool("round-robin", &[1, 1], HealthConfig::default(), t0);
    let cfg: NodeConfig = toml::from_str("id = \"03\"\naddress = \"127.0.0.1:9100\"").unwrap();
    let index = pool.add_node(cfg.clone(), t0).unwrap();
    assert_eq!(index, 2);
    assert_eq!(
        pool.add_node(cfg, t0),
        Err(NodeChangeError::Exists("03".into()))
    );
    assert!(!pool.eligible(2, t0), "not connected yet");
    assert!((0..20).all(|_| pick(&pool, t0) != Some(2)));
    let _rx2 = connect(&pool, 2, t0);
    let mut counts = [0; 3];
    for _ in 0..300 {
        counts[pick(&pool, t0).unwrap()] += 1;
    }
    assert_eq!(counts, [100, 100, 100]);
    pool.remove_node(2, t0).unwrap();
    assert!((0..20).all(|_| pick(&pool, t0) != Some(2)));
}

#[test]
fn panic_mode_routes_to_connected_nodes_when_none_is_eligible() {
    let health = HealthConfig {
        fall: 1,
        ..HealthConfig::default()
    };
    let t0 = Instant::now();
    let (pool, _rx) = connected_pool("round-robin", &[1, 1], health, t0);
    pool.record_check(0, false, t0);
    pool.record_check(1, false, t0);
    assert!(!pool.in_panic());
    assert!(pick(&pool, t0).is_some());
    assert!(pool.in_panic());
    assert_eq!(pool.panic_picks(), 1);
    pool.record_check(1, true, t0);
    pool.record_check(1, true, t0);
    assert_eq!(pick(&pool, t0), Some(1));
    assert!(!pool.in_panic());
}
