//! End-to-end: `listen` fronts in `oneconnect` mode in front of simulated nodes
//! that echo no key field (F11 `000000`, blank F41, zero F37 in every answer),
//! over real sockets on 127.0.0.1. Each node connection carries one request
//! at a time, so every answer still reaches the client that sent it.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use isoswitch::iso8583::{Message, Spec, samples};
use isoswitch::sim::node::{Delay, NodeOptions, NodeSim, NodeSimConfig};

const SPEC: &str = "cup-pos";

async fn no_key_nodes(spec: &Arc<Spec>, n: usize, delay: Delay) -> Vec<NodeSim> {
    let mut nodes = Vec::new();
    for i in 0..n {
        let mut cfg = NodeSimConfig::new(&format!("{:02}", i + 1));
        cfg.delay = delay;
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let opts = NodeOptions { no_key: true };
        nodes.push(
            NodeSim::start_with(addr, Arc::clone(spec), cfg, opts)
                .await
                .expect("node starts"),
        );
    }
    nodes
}

/// A purchase whose amount (F4) is `tag`: the node echoes F4, so the answer
/// names its request even though F11, F41 and F37 come back blanked.
/// One node that echoes no key, answering after `delay`, behind a
/// oneconnect front with one connection to it, no health checks (an echo
/// check would hold that connection itself) and a request timeout of
/// `request_timeout`.
async fn one_slow_node(
    spec: &Arc<Spec>,
    delay: &str,
    request_timeout: &str,
) -> (Vec<NodeSim>, isoswitch::ops::run::Switch) {
    let nodes = no_key_nodes(spec, 1, Delay::parse(delay).expect("a delay")).await;
    let cfg = Rig::on(SPEC)
        .service(&format!("timeouts = {{ request = \"{request_timeout}\" }}"))
        .front("mode = \"oneconnect\"")
        .back("connections_per_node = 1\n[service.back.health]\ncheck = \"none\"")
        .config(&[nodes[0].addr]);
    let switch = start_switch(&cfg).await;
    (nodes, switch)
}

fn purchase(spec: &Spec, tag: u64) -> Vec<u8> {
    let mut d = samples::purchase(spec);
    d.set_text(4, format!("{tag:012}"));
    d.set_text(11, "000001");
    RawClient::frame(spec, &spec.encode(&d).expect("encode"))
}

fn text(spec: &Spec, payload: &bytes::Bytes, id: u16) -> String {
    let msg = Message::parse(spec, payload.clone()).expect("parsable answer");
    msg.field(id)
        .ok()
        .flatten()
        .map(|f| String::from_utf8_lossy(&f.logical().collect::<Vec<u8>>()).into_owned())
        .unwrap_or_default()
}

/// What one ATM-like client saw: connect, one request, its answer (or
/// nothing within `timeout`), close.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// F39 00 and F4 = the request's tag.
    Answered,
    /// An answer with another F39 (a switch decline).
    Declined(String),
    /// An answer that carries another request's tag.
    Foreign(String),
    TimedOut,
}

async fn atm(addr: SocketAddr, spec: &Spec, tag: u64, timeout: Duration) -> Outcome {
    let mut c = RawClient::connect(addr, spec).await;
    c.send_raw(&purchase(spec, tag)).await;
    let answer = match tokio::time::timeout(timeout, c.recv()).await {
        Ok(Some(a)) => a,
        _ => return Outcome::TimedOut,
    };
    let f4 = text(spec, &answer, 4);
    let f39 = text(spec, &answer, 39);
    if f4 != format!("{tag:012}") {
        Outcome::Foreign(f4)
    } else if f39 != "00" {
        Outcome::Declined(f39)
    } else {
        Outcome::Answered
    }
}

fn oc(
    service: &isoswitch::link::Service,
) -> &isoswitch::link::front::oneconnect::OneConnectCounters {
    &service.view().counters.oneconnect
}

/// The "done when": 50 clients connect → one request → close, nodes
/// answering in 0–2 s that echo no key, 3 s client timeout (all times halved
/// here, ratios kept): every request answered to the client that sent it, and
/// each node sees at most `connections_per_node` connections over the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atms_get_their_own_answers_from_nodes_that_echo_no_key() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let spec = spec(SPEC);
        let delay = Delay::parse("0..1s").unwrap();
        let nodes = no_key_nodes(&spec, 2, delay).await;
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let cfg = Rig::on(SPEC)
            .service("timeouts = { request = \"1500ms\" }")
            .front("mode = \"oneconnect\"")
            .back("connections_per_node = 25")
            .config(&addrs);
        let switch = start_switch(&cfg).await;
        let addr = front(&switch);
        const CLIENTS: u64 = 50;
        const ROUNDS: u64 = 3;
        let mut tasks = tokio::task::JoinSet::new();
        for client in 0..CLIENTS {
            let spec = Arc::clone(&spec);
            tasks.spawn(async move {
                let mut seen = Vec::new();
                for round in 0..ROUNDS {
                    let tag = client * 100 + round + 1;
                    seen.push(atm(addr, &spec, tag, Duration::from_millis(1500)).await);
                }
                seen
            });
        }
        let mut outcomes = Vec::new();
        while let Some(done) = tasks.join_next().await {
            outcomes.extend(done.expect("client task"));
        }
        let answered = outcomes.iter().filter(|o| **o == Outcome::Answered).count();
        let wrong: Vec<_> = outcomes
            .iter()
            .filter(|o| **o != Outcome::Answered)
            .collect();
        assert_eq!(answered as u64, CLIENTS * ROUNDS, "not answered: {wrong:?}");
        for node in &nodes {
            let accepted = node.stats.connections.load(Ordering::Relaxed);
            assert!(accepted <= 25, "a node accepted {accepted} connections");
        }
        let svc = service(&switch);
        let total: u64 = nodes
            .iter()
            .map(|n| n.stats.connections.load(Ordering::Relaxed))
            .sum();
        assert!(
            oc(svc).reused.load(Ordering::Relaxed) >= CLIENTS * ROUNDS - total,
            "connections were reused"
        );
        switch.stop().await;
    })
    .await
    .expect("test timed out");
}

/// More requests than connections: they wait for one to free up (within their
/// deadline) and all go over the one connection, in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_wait_for_a_free_connection() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let spec = spec(SPEC);
        let (nodes, switch) = one_slow_node(&spec, "20ms", "10s").await;
        let addr = front(&switch);
        let mut tasks = tokio::task::JoinSet::new();
        for tag in 1..=8u64 {
            let spec = Arc::clone(&spec);
            tasks.spawn(async move { atm(addr, &spec, tag, Duration::from_secs(10)).await });
        }
        while let Some(done) = tasks.join_next().await {
            assert_eq!(done.expect("client task"), Outcome::Answered);
        }
        assert_eq!(nodes[0].stats.connections.load(Ordering::Relaxed), 1);
        assert!(oc(service(&switch)).waited.load(Ordering::Relaxed) >= 1);
        switch.stop().await;
    })
    .await
    .expect("test timed out");
}

/// `check = "none"` (ATM hosts that answer no echo) is a documented choice,
/// not a fault: the pool serves ATMs and the switch keeps running. It used to
/// end the pool's check tasks at once, which the supervisor took for a
/// critical task dying, and `isoswitch run` exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_health_checks_is_a_setting_not_a_fatal_error() {
    use futures_util::FutureExt;
    tokio::time::timeout(Duration::from_secs(30), async {
        let spec = spec(SPEC);
        let (_nodes, switch) = one_slow_node(&spec, "1ms", "5s").await;
        let addr = front(&switch);
        for tag in 1..=5u64 {
            assert_eq!(
                atm(addr, &spec, tag, Duration::from_secs(5)).await,
                Outcome::Answered
            );
        }
        let fatal = switch.handle().supervisor.fatal().now_or_never();
        assert_eq!(fatal, None, "the switch must keep running");
        switch.stop().await;
    })
    .await
    .expect("test timed out");
}

/// A client that closes before its answer: the connection stays busy until
/// the answer arrives, which is counted and dropped; the next client, waiting
/// for that connection, gets its own answer, not the orphan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_answer_is_dropped_never_delivered_elsewhere() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let spec = spec(SPEC);
        let (nodes, switch) = one_slow_node(&spec, "300ms", "10s").await;
        let addr = front(&switch);
        let svc = service(&switch);
        let mut gone = RawClient::connect(addr, &spec).await;
        gone.send_raw(&purchase(&spec, 111)).await;
        wait_until("the node has the first request", || {
            nodes[0].stats.requests.load(Ordering::Relaxed) == 1
        })
        .await;
        // Gone for good: a reset. (A client that only closes its sending side
        // may still be reading, and still gets its answer.)
        #[allow(deprecated)] // linger 0 resets at once; it never blocks the thread
        gone.stream
            .set_linger(Some(Duration::ZERO))
            .expect("linger 0");
        drop(gone);
        assert_eq!(
            atm(addr, &spec, 222, Duration::from_secs(10)).await,
            Outcome::Answered
        );
        wait_until("the orphan answer is counted", || {
            oc(svc).answers_dropped.load(Ordering::Relaxed) == 1
        })
        .await;
        assert_eq!(nodes[0].stats.connections.load(Ordering::Relaxed), 1);
        assert_eq!(svc.view().counters.answered.load(Ordering::Relaxed), 2);
        switch.stop().await;
    })
    .await
    .expect("test timed out");
}

/// A request past its deadline is declined and its connection closed: the
/// late answer must not reach the next client, so the next request opens a
/// new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_past_its_deadline_is_closed_not_reused() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let spec = spec(SPEC);
        // No echo checks: they would hold the one connection themselves.
        let (nodes, switch) = one_slow_node(&spec, "2s", "200ms").await;
        let addr = front(&switch);
        let svc = service(&switch);
        for tag in [1u64, 2] {
            match atm(addr, &spec, tag, Duration::from_secs(10)).await {
                Outcome::Declined(code) => assert_ne!(code, "00"),
                other => panic!("expected a timeout decline, got {other:?}"),
            }
        }
        assert_eq!(oc(svc).closed_deadline.load(Ordering::Relaxed), 2);
        assert_eq!(
            nodes[0].stats.connections.load(Ordering::Relaxed),
            2,
            "a timed-out connection is never reused"
        );
        assert_eq!(oc(svc).reused.load(Ordering::Relaxed), 0);
        switch.stop().await;
    })
    .await
    .expect("test timed out");
}

/// Pool connections unused for the idle timeout are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_pool_connections_close() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let spec = spec(SPEC);
        let nodes = no_key_nodes(&spec, 1, Delay::NONE).await;
        let cfg = Rig::on(SPEC)
            .front("mode = \"oneconnect\"\noneconnect = { idle_timeout = \"100ms\" }")
            .back("connections_per_node = 2\n[service.back.health]\ncheck = \"none\"")
            .config(&[nodes[0].addr]);
        let switch = start_switch(&cfg).await;
        let addr = front(&switch);
        assert_eq!(
            atm(addr, &spec, 7, Duration::from_secs(10)).await,
            Outcome::Answered
        );
        wait_until("the idle connection closes", || {
            nodes[0].stats.held.load(Ordering::Relaxed) == 0
        })
        .await;
        let svc = service(&switch);
        assert_eq!(oc(svc).closed_idle.load(Ordering::Relaxed), 1);
        assert_eq!(
            switch.services[0]
                .service
                .view()
                .side
                .oneconnect()
                .unwrap()
                .open(0),
            0
        );
        switch.stop().await;
    })
    .await
    .expect("test timed out");
}

/// The same nodes behind a keyed (`multiplex`) front: their answers cannot be
/// matched, which is why `oneconnect` exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_front_cannot_serve_nodes_that_echo_no_key() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let spec = spec(SPEC);
        let nodes = no_key_nodes(&spec, 1, Delay::NONE).await;
        let cfg = Rig::on(SPEC)
            .service("timeouts = { request = \"300ms\" }")
            .back("connections_per_node = 1")
            .config(&[nodes[0].addr]);
        let switch = start_switch(&cfg).await;
        wait_connected(service(&switch), 1).await;
        let outcome = atm(front(&switch), &spec, 5, Duration::from_secs(10)).await;
        assert!(matches!(outcome, Outcome::Declined(_)), "{outcome:?}");
        // (The echo checks' answers are unmatched too.)
        let unknown = service(&switch)
            .view()
            .counters
            .unknown_responses
            .load(Ordering::Relaxed);
        assert!(unknown >= 1, "{unknown}");
        switch.stop().await;
    })
    .await
    .expect("test timed out");
}

/// The load generator's ATM profile through a `oneconnect` front: a
/// connection per request, every answer on its own connection, and the nodes
/// still see at most `connections_per_node` connections each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_atm_profile_opens_a_connection_per_request() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let spec = spec(SPEC);
        let nodes = no_key_nodes(&spec, 2, Delay::parse("0..20ms").unwrap()).await;
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let cfg = Rig::on(SPEC)
            .service("timeouts = { request = \"10s\" }")
            .front("mode = \"oneconnect\"")
            .back("connections_per_node = 4")
            .config(&addrs);
        let switch = start_switch(&cfg).await;
        let mut load = isoswitch::sim::load::LoadConfig::new(front(&switch));
        load.clients = 10;
        load.duration = Duration::from_millis(500);
        load.timeout = Duration::from_secs(10);
        load.connection_per_request = true;
        load.think = Duration::from_millis(5);
        let counters = Arc::new(isoswitch::sim::load::LoadCounters::default());
        let report = isoswitch::sim::load::run(Arc::clone(&spec), load, counters)
            .await
            .expect("load runs");
        assert!(report.requests >= 10, "{report}");
        assert_eq!(report.answered, report.requests, "{report}");
        assert_eq!(report.mismatches, 0, "{report}");
        assert_eq!(report.connects, report.requests, "{report}");
        assert_eq!(report.connect_failures, 0, "{report}");
        for node in &nodes {
            assert!(node.stats.connections.load(Ordering::Relaxed) <= 4);
        }
        switch.stop().await;
    })
    .await
    .expect("test timed out");
}

/// The MBLB profile: rounds of 4 requests on long connections; one connect
/// per client, whole rounds only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_rounds_profile_sends_whole_rounds_on_long_connections() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let spec = spec(SPEC);
        let nodes = start_nodes(&spec, 1, Delay::parse("0..10ms").unwrap()).await;
        let mut load = isoswitch::sim::load::LoadConfig::new(nodes[0].addr);
        load.clients = 5;
        load.duration = Duration::from_millis(300);
        load.timeout = Duration::from_secs(10);
        load.requests_per_round = Some(4);
        let counters = Arc::new(isoswitch::sim::load::LoadCounters::default());
        let report = isoswitch::sim::load::run(Arc::clone(&spec), load, counters)
            .await
            .expect("load runs");
        assert!(report.requests >= 20, "{report}");
        assert_eq!(report.requests % 4, 0, "{report}");
        assert_eq!(report.answered, report.requests, "{report}");
        assert_eq!(report.connects, 5, "{report}");
        assert_eq!(nodes[0].stats.connections.load(Ordering::Relaxed), 5);
    })
    .await
    .expect("test timed out");
}

/// A graceful stop waits for the requests a oneconnect pool is carrying: the
/// client still gets its node's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_lets_carried_requests_finish() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let spec = spec(SPEC);
        let (nodes, switch) = one_slow_node(&spec, "300ms", "5s").await;
        let addr = front(&switch);
        let mut client = RawClient::connect(addr, &spec).await;
        client.send_raw(&purchase(&spec, 42)).await;
        wait_until("the node has the request", || {
            nodes[0].stats.requests.load(Ordering::Relaxed) == 1
        })
        .await;
        assert_eq!(service(&switch).in_flight(), 1);
        let ((), answer) = tokio::join!(switch.stop(), client.recv());
        let answer = answer.expect("an answer before the switch closes");
        assert_eq!(text(&spec, &answer, 4), format!("{:012}", 42));
        assert_eq!(text(&spec, &answer, 39), "00");
    })
    .await
    .expect("test timed out");
}
