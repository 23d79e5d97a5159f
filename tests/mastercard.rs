//! End-to-end: Mastercard duplex links (no header, EBCDIC, 2-byte length)
//! that the switch's `connect` front dials to the network simulator playing
//! Mastercard (`sim network --dialect mastercard`), in front of three
//! channel nodes. Both directions at once on every link:
//!
//! - the switch signs each link on as Mastercard expects (`0800` DE 70 `061`,
//!   group sign-on, with the member's DE 33), and Mastercard sends its issuer
//!   requests on a link only once the member has signed on there;
//! - Mastercard's issuer requests are balanced over the nodes and answered
//!   once each on the link they came on;
//! - the nodes' acquirer requests leave with their node ID stamped into
//!   F37, and Mastercard answers each on another link, so only the stamp
//!   (and F11, which each node matches) brings it home;
//! - echo tests (`270`) both ways are answered; links are dropped mid-run,
//!   dialled and signed on again; nothing is lost or doubled;
//! - Mastercard's key exchanges (`161`) reach the key node and its answers
//!   Mastercard.
//!
//! Every test has its own time limit and waits on conditions, never on a
//! fixed sleep.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use isoswitch::config::Config;
use isoswitch::iso8583::Spec;
use isoswitch::link::Service;
use isoswitch::ops::run::Switch;
use isoswitch::sim::node::{Delay, NodeSim, NodeSimConfig, Originate};
use isoswitch::sim::visa::{Dial, Network, VisaReport, VisaSim, VisaSimConfig};

const LINKS: usize = 3;
const NODES: u32 = 3;
/// Round trips each way (the VISA test's full run is 10,000; this one is
/// kept short on a shared machine).
const ROUND_TRIPS: u64 = 1_000;
/// Mastercard's issuer requests per second; the nodes together send as many.
const RATE: f64 = 500.0;
/// The member's customer ID, sent in DE 33 of its network management.
const MEMBER_ID: &str = "001234";

/// Three nodes, each originating its own 0200s at `rate` (from its own STAN
/// range, so an answer reaching the wrong node is seen as foreign).
async fn nodes(spec: &Arc<Spec>, rate: Option<f64>) -> Vec<NodeSim> {
    let mut out = Vec::new();
    for i in 0..NODES {
        let mut cfg = NodeSimConfig::new(&format!("{:02}", i + 1));
        cfg.delay = Delay::parse("0..5ms").unwrap();
        cfg.originate = rate.map(|rate| Originate {
            mti: "0200".into(),
            rate,
            stan_base: (i + 1) * 100_000,
            timeout: Duration::from_secs(10),
        });
        out.push(
            NodeSim::start("127.0.0.1:0".parse().unwrap(), spec.clone(), cfg)
                .await
                .unwrap(),
        );
    }
    out
}

/// A `connect` service on the mastercard dialect dialling `peer`, signing
/// each link on (group sign-on with the member's DE 33) and echoing often;
/// `integrity` goes in `[service.integrity]`.
fn connect_config(peer: SocketAddr, nodes: &[SocketAddr], integrity: &str) -> Config {
    let mut toml = format!(
        "[[service]]\nname = \"mastercard\"\nspec = \"mastercard\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
         [service.front]\nkind = \"connect\"\nconnect = \"{peer}\"\nlinks = {LINKS}\n\
         keepalive_idle = \"200ms\"\necho_interval = \"300ms\"\nsign_on = \"per-link\"\n\
         sign_on_retry = \"300ms\"\nreconnect_min = \"20ms\"\nreconnect_max = \"200ms\"\n\
         [service.network]\nfields = {{ F33 = \"{MEMBER_ID}\" }}\n\
         [service.integrity]\n{integrity}\n\
         [service.back]\nconnections_per_node = 2\nalgorithm = \"least-outstanding\"\n\
         [service.back.health]\ncheck = \"echo\"\ninterval = \"100ms\"\n\
         [service.timeouts]\nrequest = \"5s\"\n"
    );
    for (i, a) in nodes.iter().enumerate() {
        toml.push_str(&format!(
            "[[service.back.node]]\nid = \"{:02}\"\naddress = \"{a}\"\n",
            i + 1
        ));
    }
    Config::from_toml(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

/// Mastercard's side, accepting the switch's links; held until resumed.
fn network_config(rate: f64, count: u64) -> VisaSimConfig {
    let mut cfg = VisaSimConfig::new(Dial::Accept("127.0.0.1:0".parse().unwrap()), LINKS);
    cfg.rate = Some(rate);
    cfg.count = Some(count);
    cfg.duration = Duration::from_secs(3600);
    cfg.timeout = Duration::from_secs(10);
    cfg.echo_interval = Duration::from_millis(250);
    cfg.keepalive_idle = Duration::from_millis(200);
    cfg.paused = true;
    cfg
}

/// Both sides agree every link is up, and Mastercard has seen the member's
/// sign-on on each.
async fn wait_signed_on(svc: &Service, mc: &VisaSim) {
    let links = svc
        .view()
        .side
        .out_links()
        .expect("a connect front")
        .clone();
    wait_until("every link up and signed on, both ways", || {
        links.up() == (LINKS, LINKS) && mc.links() == (LINKS, LINKS)
    })
    .await;
}

fn originated(nodes: &[NodeSim]) -> u64 {
    nodes
        .iter()
        .map(|n| n.stats.originated.load(Ordering::Relaxed))
        .sum()
}

/// How links are dropped mid-run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Drops {
    /// One link at a third of the way, another at two thirds.
    OneAtATime,
    /// Every link at once, half way.
    AllAtOnce,
}

async fn round_trips_each_way(n: u64, drops: Drops) {
    let spec = spec("mastercard");
    let nodes = nodes(&spec, Some(RATE / f64::from(NODES))).await;
    let mc = VisaSim::start(spec.clone(), network_config(RATE, n))
        .await
        .unwrap();
    assert_eq!(mc.network(), Network::Mastercard);
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let switch = Switch::start(&connect_config(mc.local_addr().unwrap(), &addrs, ""))
        .await
        .unwrap();
    let svc = service(&switch).clone();
    wait_signed_on(&svc, &mc).await;
    wait_until("every node healthy", || {
        let now = std::time::Instant::now();
        (0..NODES as usize).all(|i| svc.view().pool.eligible(i, now))
    })
    .await;
    mc.resume();
    let unsent_at_start = svc
        .view()
        .counters
        .peer
        .node_requests_unsent
        .load(Ordering::Relaxed);
    let originated_at_start = originated(&nodes);

    let (at, per_drop) = match drops {
        Drops::OneAtATime => (vec![n / 3, 2 * n / 3], 1),
        Drops::AllAtOnce => (vec![n / 2], LINKS),
    };
    for &when in &at {
        wait_until_long("more issuer requests", || mc.issuer_sent() >= when).await;
        let opened = mc.stats().links_opened.load(Ordering::Relaxed);
        assert_eq!(mc.close_links(per_drop), per_drop);
        wait_until("the dropped links dialled again", || {
            mc.stats().links_opened.load(Ordering::Relaxed) >= opened + per_drop as u64
        })
        .await;
        wait_signed_on(&svc, &mc).await;
    }
    let dropped = (at.len() * per_drop) as u64;
    wait_until_long(
        "every issuer request sent, and as many node requests",
        || mc.originated_all() && originated(&nodes) >= originated_at_start + n,
    )
    .await;
    for node in &nodes {
        node.stop_originating();
    }
    wait_until_long("every answer in", || {
        mc.outstanding() == 0 && nodes.iter().all(|n| n.outstanding() == 0)
    })
    .await;
    let report = mc.report();
    eprintln!("sim network (mastercard): {report}");
    for node in &nodes {
        eprintln!("node: {}", isoswitch::sim::node::summary(&node.stats));
    }

    // Mastercard → bank: each issuer request answered once, with its keys.
    assert_eq!(report.issuer_sent, n, "{report}");
    assert_eq!(report.issuer_approved, n, "{report}");
    assert_clean(&report);
    let per_node: Vec<u64> = (0..NODES as usize).map(|i| sent(&svc, i)).collect();
    assert_eq!(per_node.iter().sum::<u64>(), n, "spread {per_node:?}");
    assert!(per_node.iter().all(|&c| c > 0), "spread {per_node:?}");

    // Bank → Mastercard: each node's requests came back to it by the F37
    // stamp, though Mastercard answered them on other links.
    let mut answered = 0;
    let mut declined = 0;
    for (i, node) in nodes.iter().enumerate() {
        let s = &node.stats;
        let sent = s.originated.load(Ordering::Relaxed);
        let ok = s.originated_answered.load(Ordering::Relaxed);
        let no = s.originated_declined.load(Ordering::Relaxed);
        assert_eq!(s.foreign_responses.load(Ordering::Relaxed), 0, "node {i}");
        assert_eq!(
            s.originated_unanswered.load(Ordering::Relaxed),
            0,
            "node {i}"
        );
        assert_eq!(ok + no, sent, "node {i}: one answer each");
        let stamp = format!("{:02}", i + 1);
        assert_eq!(
            report.stamps.get(&stamp).copied().unwrap_or(0),
            ok,
            "node {i}: Mastercard saw its stamp on each of its requests"
        );
        answered += ok;
        declined += no;
    }
    let unsent = svc
        .view()
        .counters
        .peer
        .node_requests_unsent
        .load(Ordering::Relaxed);
    assert_eq!(declined, unsent, "a node's only declines: no link up");
    if drops == Drops::OneAtATime {
        assert_eq!(unsent, unsent_at_start, "always a link up after the start");
    }
    assert!(
        answered + unsent - unsent_at_start >= n,
        "{answered} node requests answered, wanted {n}"
    );
    assert_eq!(report.bank_requests, answered, "{report}");
    assert_eq!(report.bank_answered, report.bank_requests, "{report}");
    assert!(report.bank_answered_on_other_link > 0, "{report}");

    // The links: dropped, dialled and signed on again by the member;
    // Mastercard signs on nothing itself.
    assert_eq!(report.links_dropped, dropped, "{report}");
    assert!(report.links_opened >= LINKS as u64 + dropped, "{report}");
    assert_eq!(report.sign_ons_sent, 0, "{report}");
    let stats = mc.stats();
    assert!(stats.bank_sign_ons.load(Ordering::Relaxed) >= LINKS as u64 + dropped);
    let links = svc.view().side.out_links().unwrap();
    assert!(
        links.sign_ons_acknowledged.load(Ordering::Relaxed) >= LINKS as u64 + dropped,
        "the switch signed the new links on"
    );
    assert!(report.echo_answered > 0 && stats.bank_echoes.load(Ordering::Relaxed) > 0);
    let c = &svc.view().counters;
    for (what, v) in [
        ("unroutable", &c.peer.unroutable_responses),
        ("late", &c.late_responses),
        ("unknown", &c.unknown_responses),
        ("undeliverable", &c.undeliverable),
        ("bad messages", &c.bad_messages),
    ] {
        assert_eq!(v.load(Ordering::Relaxed), 0, "switch: {what}");
    }
    assert_eq!(c.declined_total(), declined, "no decline to Mastercard");
    switch.stop().await;
    let last = mc.stop().await;
    assert_clean(&last);
    for node in nodes {
        node.stop().await;
    }
}

fn assert_clean(r: &VisaReport) {
    assert_eq!(r.issuer_unanswered, 0, "lost: {r}");
    assert_eq!(r.doubled, 0, "doubled: {r}");
    assert_eq!(r.wrong_key, 0, "crossed: {r}");
    assert_eq!(r.unknown + r.late, 0, "unknown or late: {r}");
    assert_eq!(r.answers_unsent + r.bad_frames + r.rejects, 0, "{r}");
}

/// As [`wait_until`], with time for a loaded machine.
async fn wait_until_long(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_both_ways_survive_two_link_drops() {
    tokio::time::timeout(
        Duration::from_secs(120),
        round_trips_each_way(ROUND_TRIPS, Drops::OneAtATime),
    )
    .await
    .expect("the run finishes in time");
}

/// Every link dropped at once, half way: Mastercard's answers wait in the
/// switch for a link to come back (and its sign-on), as do the answers
/// Mastercard owes the nodes; the nodes' requests meanwhile are declined at
/// once. Nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_link_dropped_at_once_loses_nothing() {
    tokio::time::timeout(
        Duration::from_secs(120),
        round_trips_each_way(ROUND_TRIPS / 2, Drops::AllAtOnce),
    )
    .await
    .expect("the run finishes in time");
}

/// Mastercard starts a key exchange (`0800` DE 70 `161`, an institution
/// code) every 100 ms: every one reaches node 02 (the key node) and none
/// another, and every `0810` goes back to Mastercard with the node's DE 39.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_exchanges_reach_the_key_node_and_its_answers_mastercard() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let spec = spec("mastercard");
        let nodes = nodes(&spec, None).await;
        let mut cfg = network_config(0.0, 0);
        cfg.rate = None;
        cfg.count = None;
        cfg.paused = false;
        cfg.key_reset_every = Some(Duration::from_millis(100));
        cfg.duration = Duration::from_secs(1);
        let mc = VisaSim::start(spec.clone(), cfg).await.unwrap();
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let switch = Switch::start(&connect_config(
            mc.local_addr().unwrap(),
            &addrs,
            "key_nodes = [\"02\"]",
        ))
        .await
        .unwrap();
        let svc = service(&switch).clone();
        wait_signed_on(&svc, &mc).await;
        let stats = mc.stats();
        wait_until_long("key exchanges sent and every one answered", || {
            let sent = stats.key_resets_sent.load(Ordering::Relaxed);
            sent >= 3 && stats.key_resets_answered.load(Ordering::Relaxed) == sent
        })
        .await;
        let report = mc.stop().await;
        eprintln!("sim network (mastercard): {report}");
        let sent = report.key_resets_sent;
        assert_eq!(report.key_resets_unanswered, 0, "{report}");
        let at_key_node = nodes[1].stats.key_resets.snapshot();
        assert_eq!(
            at_key_node.values().sum::<u64>(),
            sent,
            "every exchange reached the key node: {at_key_node:?}"
        );
        for i in [0, 2] {
            assert!(nodes[i].stats.key_resets.snapshot().is_empty(), "node {i}");
        }
        switch.stop().await;
        for node in nodes {
            node.stop().await;
        }
    })
    .await
    .expect("the run finishes in time");
}

/// The real binary: `isoswitch sim network --dialect mastercard` against a
/// switch run on examples/mastercard.toml (placed on free ports). It prints
/// a JSON report and exits 0 when nothing was lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_network_binary_against_the_example_config() {
    use isoswitch::config::FrontConfig;
    use tokio::io::AsyncBufReadExt;
    tokio::time::timeout(Duration::from_secs(60), async {
        let spec = spec("mastercard");
        let nodes = nodes(&spec, Some(20.0)).await;
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_isoswitch"))
            .args([
                "sim",
                "network",
                "--dialect",
                "mastercard",
                "--accept",
                "127.0.0.1:0",
                "--links",
                "2",
                "--rate",
                "200",
                "--count",
                "300",
                "--duration",
                "30s",
                "--json",
            ])
            .env("ISOSWITCH_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the binary runs");
        let stderr = child.stderr.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let addr: SocketAddr = loop {
            let line = lines.next_line().await.unwrap().expect("a listening line");
            if let Some(a) = line.strip_prefix("sim network (mastercard) listening on ") {
                break a.trim().parse().unwrap();
            }
        };
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let mut cfg = Config::load(std::path::Path::new("examples/mastercard.toml"))
            .expect("the example loads");
        let svc = &mut cfg.services[0];
        let FrontConfig::Connect(front) = &mut svc.front else {
            panic!("the example has a connect front");
        };
        front.connect = addr;
        front.keepalive_idle = Duration::from_millis(200);
        for (node, sim) in svc.back.nodes.iter_mut().zip(&nodes) {
            node.address = sim.addr;
        }
        let switch = Switch::start(&cfg).await.expect("the switch starts");
        let out = child.wait_with_output().await.unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "sim network failed: {text}");
        let report: serde_json::Value = serde_json::from_str(text.trim()).expect("JSON");
        assert_eq!(report["issuer_sent"], 300, "{report}");
        // The first few may be declined by the switch before its node
        // connections are up: answered all the same.
        let approved = report["issuer_approved"].as_u64().unwrap();
        let declined = report["issuer_declined"].as_u64().unwrap();
        assert_eq!(approved + declined, 300, "{report}");
        assert!(approved > 0, "{report}");
        assert_eq!(report["issuer_unanswered"], 0, "{report}");
        assert_eq!(report["doubled"], 0, "{report}");
        assert!(report["bank_requests"].as_u64().unwrap() > 0, "{report}");
        assert_eq!(report["bank_answered"], report["bank_requests"], "{report}");
        switch.stop().await;
        for n in nodes {
            assert_eq!(n.stats.foreign_responses.load(Ordering::Relaxed), 0);
            n.stop().await;
        }
    })
    .await
    .expect("the run finishes in time");
}
