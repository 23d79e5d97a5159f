//! Tests across the pieces: a request's whole life through `route/`, and
//! property tests that no input makes a piece misbehave.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

fn ids(n: usize) -> Vec<NodeId> {
    (1..=n)
        .map(|i| NodeId::new(format!("{i:02}").as_bytes()).unwrap())
        .collect()
}

/// Three nodes; node 1's connection dies with requests in flight. Every
/// request gets exactly one answer: a response or a decline, never both.
#[test]
fn node_loss_declines_its_in_flight_once_and_traffic_moves() {
    let t0 = Instant::now();
    let ids = ids(3);
    let mut nodes: Vec<NodeState> = ids
        .iter()
        .map(|&id| NodeState::new(id, 1, 0, HealthConfig::default(), EwmaConfig::default()))
        .collect();
    for n in &mut nodes {
        let _ = n.health_mut().set_connected(true, t0);
    }
    let mut balancer = Balancer::with_capacity(BalancerConfig::default(), 1, 3);
    let mut table: Correlator<u32> = Correlator::new(CorrelatorConfig::default());
    let codes = DeclineCodes::default();
    let mut views = Vec::with_capacity(3);
    // Answers per request: (response or decline code).
    let mut answers: HashMap<u32, Vec<[u8; 2]>> = HashMap::new();
    let key = |stan: u32| {
        CorrelationKey::builder()
            .push(b"T1")
            .push(format!("{stan:06}").as_bytes())
            .build()
            .unwrap()
    };

    for stan in 0..30u32 {
        views.clear();
        views.extend(nodes.iter().map(|n| n.view(t0)));
        let i = balancer.pick(&views, None).unwrap();
        table
            .insert(key(stan), stan, i as u64, t0 + Duration::from_secs(30))
            .unwrap();
        nodes[i].dispatched();
    }
    assert_eq!(
        nodes.iter().map(NodeState::outstanding).collect::<Vec<_>>(),
        [10, 10, 10]
    );

    // Node 1's only connection dies.
    let _ = nodes[1].health_mut().set_connected(false, t0);
    let mut lost = Vec::new();
    assert_eq!(table.take_via(1, t0, &mut lost), 10);
    for (_, stan) in lost.drain(..) {
        nodes[1].released();
        answers
            .entry(stan)
            .or_default()
            .push(codes.code(DeclineReason::NodeLost));
    }
    assert_eq!(nodes[1].outstanding(), 0);

    // New traffic avoids node 1.
    views.clear();
    views.extend(nodes.iter().map(|n| n.view(t0)));
    for _ in 0..10 {
        assert_ne!(balancer.pick(&views, None), Some(1));
    }

    // Every node "answers" all 30: only the live ones match; node 1's are late.
    let t1 = t0 + Duration::from_millis(50);
    let mut late = 0;
    for stan in 0..30u32 {
        match table.take(&key(stan), t1) {
            Ok(v) => answers.entry(v).or_default().push(*b"00"),
            Err(Miss::Late) => late += 1,
            Err(Miss::Unknown) => panic!("request {stan} unknown"),
        }
    }
    assert_eq!(late, 10);
    assert_eq!(answers.len(), 30);
    assert!(
        answers.values().all(|a| a.len() == 1),
        "exactly one answer each"
    );
    assert_eq!(answers.values().filter(|a| a[0] == *b"91").count(), 10);
    assert!(table.is_empty());
}

/// Deadlines: requests nobody answers are declined with the timeout code,
/// in deadline order, and the node's failure run can eject it.
#[test]
fn timeouts_decline_and_eject() {
    let t0 = Instant::now();
    let cfg = HealthConfig {
        ejection_threshold: 3,
        ..HealthConfig::default()
    };
    let mut node = NodeState::new(ids(1)[0], 1, 0, cfg, EwmaConfig::default());
    let _ = node.health_mut().set_connected(true, t0);
    let mut table: Correlator<u32> = Correlator::new(CorrelatorConfig::default());
    for stan in 0..3u32 {
        let k = CorrelationKey::builder()
            .push(&stan.to_be_bytes())
            .build()
            .unwrap();
        table
            .insert(
                k,
                stan,
                0,
                t0 + Duration::from_millis(100 * u64::from(3 - stan)),
            )
            .unwrap();
        node.dispatched();
    }
    let t1 = t0 + Duration::from_secs(1);
    let mut out = Vec::new();
    table.expire(t1, &mut out);
    let order: Vec<u32> = out.iter().map(|(_, v)| *v).collect();
    assert_eq!(order, [2, 1, 0]);
    let mut last = Transition::Unchanged;
    for _ in &out {
        last = node.record_response(false, Duration::from_millis(100), t1);
    }
    assert_eq!(
        last,
        Transition::Ejected {
            duration: Duration::from_secs(5),
            count: 1
        }
    );
    assert!(!node.view(t1).eligible);
    assert_eq!(DeclineCodes::default().code(DeclineReason::Timeout), *b"68");
}

fn arb_view(n_ids: usize) -> impl Strategy<Value = Vec<NodeView>> {
    proptest::collection::vec(
        (0u32..5, 0u32..3, 0u32..50, 0u64..500, any::<bool>()),
        0..n_ids,
    )
    .prop_map(|v| {
        let ids = ids(v.len());
        v.into_iter()
            .zip(ids)
            .map(|((w, p, o, lat, eligible), id)| NodeView {
                id,
                weight: w,
                effective_weight: if eligible { w } else { 0 },
                ramp: crate::health::RAMP_FULL,
                priority: p,
                outstanding: o,
                latency: Duration::from_millis(lat),
                eligible,
            })
            .collect()
    })
}

fn arb_algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::RoundRobin),
        Just(Algorithm::Weighted),
        Just(Algorithm::LeastOutstanding),
        Just(Algorithm::PeakEwma),
        Just(Algorithm::Sticky),
    ]
}

proptest! {
    /// Whatever the pool looks like, a pick is a pickable node inside the
    /// allowed subset, and `None` only when there is no such node.
    #[test]
    fn picks_are_pickable_and_allowed(
        nodes in arb_view(9),
        algorithm in arb_algorithm(),
        min_active in 0usize..4,
        allowed in proptest::collection::vec(0usize..12, 0..6),
        use_subset in any::<bool>(),
        seed in any::<u64>(),
        keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..10), 1..20),
    ) {
        let mut b = Balancer::new(BalancerConfig { algorithm, min_active }, seed);
        for key in &keys {
            let got = if use_subset {
                b.pick_in(&nodes, &allowed, Some(key))
            } else {
                b.pick(&nodes, Some(key))
            };
            let in_scope = |i: usize| !use_subset || allowed.contains(&i);
            let any = (0..nodes.len()).any(|i| in_scope(i) && nodes[i].pickable());
            match got {
                Some(i) => {
                    prop_assert!(i < nodes.len() && nodes[i].pickable() && in_scope(i));
                    // Priority groups: nothing in a qualifying higher group was skipped.
                    let qualifying = |p: u32| {
                        (0..nodes.len())
                            .filter(|&j| in_scope(j) && nodes[j].pickable() && nodes[j].priority == p)
                            .count()
                            >= min_active.max(1)
                    };
                    if qualifying(nodes[i].priority) {
                        prop_assert!(!(nodes[i].priority + 1..3).any(qualifying));
                    } else {
                        prop_assert!(!(0..3).any(qualifying));
                    }
                }
                None => prop_assert!(!any),
            }
        }
    }

    /// Sticky: removing any one node moves exactly the keys it held.
    #[test]
    fn sticky_moves_only_the_lost_nodes_keys(n in 2usize..8, lost in 0usize..8, seed in any::<u64>()) {
        let lost = lost % n;
        let mut nodes: Vec<NodeView> = ids(n).into_iter().map(|id| NodeView::healthy(id, 1, 0)).collect();
        let mut b = Balancer::new(BalancerConfig { algorithm: Algorithm::Sticky, min_active: 1 }, seed);
        let keys: Vec<[u8; 8]> = (0..64u64).map(|k| (k ^ seed).to_be_bytes()).collect();
        let before: Vec<_> = keys.iter().map(|k| b.pick(&nodes, Some(k))).collect();
        nodes[lost].eligible = false;
        for (k, was) in keys.iter().zip(before) {
            let now = b.pick(&nodes, Some(k));
            if was == Some(lost) {
                prop_assert!(now.is_some() && now != Some(lost));
            } else {
                prop_assert_eq!(now, was);
            }
        }
    }

    /// Stamping any node of a valid table reads back as that node.
    #[test]
    fn stamp_round_trips(
        raw in proptest::collection::vec("[0-9A-Za-z]{1,4}", 1..10),
        offset in 0usize..10,
        width in 1usize..6,
        f37 in proptest::collection::vec(any::<u8>(), 0..16),
    ) {
        let ids: Vec<NodeId> = raw.iter().map(|s| s.parse().unwrap()).collect();
        let stamp = F37Stamp { offset, width };
        match StampTable::new(stamp, &ids) {
            Ok(table) => {
                for i in 0..ids.len() {
                    let mut f = f37.clone();
                    match table.stamp(&mut f, i) {
                        Ok(()) => prop_assert_eq!(table.node_of(&f), Some(i)),
                        Err(e) => {
                            prop_assert!(matches!(e, StampError::FieldTooShort { .. }), "{e}");
                            prop_assert_eq!(&f, &f37);
                        }
                    }
                }
            }
            Err(_) => prop_assert!(stamp.validate(&ids).is_err()),
        }
        let _ = stamp.read(&f37);
    }

    /// Health under any sequence of events: effective weight is 0 exactly when
    /// the node is not eligible (or has weight 0), and never above the weight.
    #[test]
    fn health_weight_is_consistent(
        ops in proptest::collection::vec((0u8..6, any::<bool>(), 0u64..4000), 0..200),
        weight in 0u32..200,
    ) {
        let t0 = Instant::now();
        let mut now = t0;
        let cfg = HealthConfig { ejection_threshold: 2, base_ejection: Duration::from_secs(1), ..HealthConfig::default() };
        let mut h = Health::new(cfg, weight);
        for (op, flag, ms) in ops {
            now += Duration::from_millis(ms);
            let _ = match op {
                0 => h.record_check(flag, now),
                1 => h.record_response(flag, now),
                2 => h.set_connected(flag, now),
                3 => h.set_admin(if flag { AdminState::Enabled } else { AdminState::Drain }, now),
                4 => h.set_admin(if flag { AdminState::Enabled } else { AdminState::Disabled }, now),
                _ => h.poll(now),
            };
            let w = h.effective_weight(now);
            prop_assert!(w <= weight);
            prop_assert_eq!(w > 0, h.eligible(now) && weight > 0);
        }
    }
}
