//! End-to-end: POS network controllers and load clients through the switch to
//! simulated channel nodes, over real sockets on 127.0.0.1.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use isoswitch::sim::nac::{self, NacSimConfig};
use isoswitch::sim::node::Delay;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacs_get_every_answer_on_their_own_uplink() {
    let spec = spec("cup-pos");
    let nodes = start_nodes(&spec, 3, Delay::NONE).await;
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let cfg = Rig::on("cup-pos")
        .back("connections_per_node = 2")
        .config(&addrs);
    let switch = start_switch(&cfg).await;
    let svc = service(&switch);
    wait_connected(svc, 2).await;

    let run_nac = |nac_id| {
        nac::run(
            spec.clone(),
            NacSimConfig {
                target: front(&switch),
                nac_id,
                uplinks: 4,
                terminals: 50,
                rate: None,
                duration: Duration::from_secs(2),
                timeout: Duration::from_secs(3),
            },
        )
    };
    let (a, b) = tokio::join!(run_nac(1), run_nac(2));
    for report in [a.unwrap(), b.unwrap()] {
        assert!(report.sent > 100, "{report}");
        assert_eq!(report.answered, report.sent, "{report}");
        assert_eq!(report.mismatched, 0, "{report}");
        assert_eq!(report.unanswered, 0, "{report}");
        assert_eq!(report.uplinks_lost, 0, "{report}");
    }
    // Round robin: each node within ±10% of a third.
    let per_node: Vec<u64> = (0..3).map(|i| sent(svc, i)).collect();
    let total: u64 = per_node.iter().sum();
    for &n in &per_node {
        let share = n as f64 / total as f64;
        assert!(
            (share - 1.0 / 3.0).abs() < 0.1 / 3.0 + 0.001,
            "spread {per_node:?}"
        );
    }
    // Backend connections stay K per node, however many clients.
    for node in &nodes {
        assert_eq!(node.stats.connections.load(Ordering::Relaxed), 2);
    }
    switch.stop().await;
}

use isoswitch::iso8583::Message;
use isoswitch::sim::load::{self, LoadConfig, LoadCounters, Mix};
use std::sync::Arc;

/// The seeds' acceptance test, scaled down: 50 clients, 80% of requests
/// 200-300 bytes and 20% 1,200-1,400 bytes, nodes answering after 0-200 ms,
/// 4 requests in flight per client, 3 s timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acceptance_profile_has_no_timeouts_and_no_mismatches() {
    let spec = spec("cups");
    let delay = Delay::parse("0..200ms").unwrap();
    let nodes = start_nodes(&spec, 3, delay).await;
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let cfg = Rig::on("cups").config(&addrs);
    let switch = start_switch(&cfg).await;
    wait_connected(service(&switch), 2).await;
    let mut lc = LoadConfig::new(front(&switch));
    lc.clients = 50;
    lc.in_flight = 4;
    lc.mix = Mix::Paper;
    lc.duration = Duration::from_secs(3);
    lc.timeout = Duration::from_secs(3);
    let report = load::run(spec.clone(), lc, Arc::new(LoadCounters::default()))
        .await
        .unwrap();
    println!("{report}");
    assert!(report.requests > 1000, "{report}");
    assert_eq!(report.timeouts, 0, "{report}");
    assert_eq!(report.mismatches, 0, "{report}");
    assert_eq!(report.declined, 0, "{report}");
    assert_eq!(report.connections_lost, 0, "{report}");
    assert_eq!(report.answered, report.requests, "{report}");
    let svc = service(&switch);
    assert_eq!(svc.view().counters.declined_total(), 0);
    switch.stop().await;
}

/// A request over one MTU (1,460 bytes), written one byte at a time, and its
/// equally large response arrive intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_and_byte_by_byte_streams_arrive_intact() {
    let spec = spec("cups");
    let (_nodes, switch) = Rig::on("cups").nodes(2).start().await;
    wait_connected(service(&switch), 2).await;
    let request = isoswitch::sim::sized_request(&spec, "0200", 1800).unwrap();
    assert!(request.len() > 1460);
    let mut client = RawClient::connect(front(&switch), &spec).await;
    for byte in RawClient::frame(&spec, &request) {
        client.send_raw(&[byte]).await;
    }
    let response = client.recv().await.expect("a response");
    let resp = Message::parse(&spec, response.clone()).unwrap();
    let req = Message::parse(&spec, request.clone()).unwrap();
    assert_eq!(resp.mti().as_str(), "0210");
    assert_eq!(resp.field(39).unwrap().unwrap().data(), b"00");
    assert_eq!(
        resp.field(48).unwrap().unwrap().data(),
        req.field(48).unwrap().unwrap().data()
    );
    assert!(
        response.len() > 1460,
        "response of {} bytes",
        response.len()
    );
    switch.stop().await;
}

fn load_config(target: std::net::SocketAddr, clients: usize, seconds: u64) -> LoadConfig {
    let mut lc = LoadConfig::new(target);
    lc.clients = clients;
    lc.in_flight = 4;
    lc.mix = Mix::Fixed(250);
    lc.duration = Duration::from_secs(seconds);
    lc.timeout = Duration::from_secs(3);
    lc
}

/// Killing a node under load: no client connection closes; its in-flight
/// requests are declined at once; everything is answered exactly once; when the
/// node comes back it rejoins after `rise` good checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_node_declines_its_in_flight_and_clients_stay_up() {
    let spec = spec("cups");
    let back = "[service.back.health]\ncheck = \"echo\"\ninterval = \"100ms\"\ntimeout = \"500ms\"\nrise = 2\nfall = 2";
    let (mut nodes, switch) = Rig::on("cups")
        .nodes(3)
        .delay("0..50ms")
        .back(back)
        .start()
        .await;
    let svc = service(&switch).clone();
    wait_connected(&svc, 2).await;

    let counters = Arc::new(LoadCounters::default());
    let load = tokio::spawn(load::run(
        spec.clone(),
        load_config(front(&switch), 10, 3),
        counters.clone(),
    ));
    wait_until("node 02 has requests in flight", || {
        svc.view().pool.outstanding(1) > 0
    })
    .await;
    let victim = nodes.remove(1);
    let victim_addr = victim.addr;
    victim.stop().await;
    wait_until("node 02 ineligible", || {
        !svc.view().pool.eligible(1, std::time::Instant::now())
    })
    .await;
    let report = load.await.unwrap().unwrap();
    println!("{report}");
    assert_eq!(report.connections_lost, 0, "{report}");
    assert_eq!(report.mismatches, 0, "{report}");
    assert_eq!(report.timeouts, 0, "{report}");
    assert_eq!(
        report.answered + report.declined,
        report.requests,
        "{report}"
    );
    assert!(
        report.declined > 0,
        "the node had requests in flight: {report}"
    );
    let c = &svc.view().counters;
    // Every reason, so that a mismatch says which other one it was.
    let by_reason: Vec<_> = isoswitch::route::DeclineReason::ALL
        .iter()
        .map(|r| (r.as_str(), c.declined(*r)))
        .filter(|(_, n)| *n > 0)
        .collect();
    assert_eq!(
        c.declined(isoswitch::route::DeclineReason::NodeLost),
        report.declined,
        "the switch's declines by reason {by_reason:?}; {report}"
    );
    assert_eq!(
        c.late_responses.load(Ordering::Relaxed) + c.unknown_responses.load(Ordering::Relaxed),
        0
    );

    // The node comes back on the same address and rejoins after `rise` checks.
    let revived = isoswitch::sim::node::NodeSim::start(
        victim_addr,
        spec.clone(),
        isoswitch::sim::node::NodeSimConfig {
            id: "02".into(),
            delay: Delay::NONE,
            fail_rate: 0.0,
            originate: None,
        },
    )
    .await
    .expect("rebind the node's port");
    wait_until("node 02 eligible again", || {
        svc.view().pool.eligible(1, std::time::Instant::now())
    })
    .await;
    let before = sent(&svc, 1);
    let report = load::run(
        spec.clone(),
        load_config(front(&switch), 4, 1),
        Arc::new(LoadCounters::default()),
    )
    .await
    .unwrap();
    assert_eq!(report.answered, report.requests, "{report}");
    assert!(
        sent(&svc, 1) > before,
        "the revived node takes traffic again"
    );
    revived.stop().await;
    switch.stop().await;
}

/// Draining a node: it gets no new requests, and what it has in flight completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_a_node_stops_new_requests_and_lets_in_flight_finish() {
    let spec = spec("cups");
    let (_nodes, switch) = Rig::on("cups").nodes(2).delay("100ms").start().await;
    let svc = service(&switch).clone();
    wait_connected(&svc, 2).await;

    let load = tokio::spawn(load::run(
        spec.clone(),
        load_config(front(&switch), 4, 2),
        Arc::new(LoadCounters::default()),
    ));
    wait_until("node 01 has requests in flight", || {
        svc.view().pool.outstanding(0) > 0
    })
    .await;
    assert!(svc.view().pool.set_admin(
        0,
        isoswitch::route::AdminState::Drain,
        std::time::Instant::now()
    ));
    let at_drain = sent(&svc, 0);
    let report = load.await.unwrap().unwrap();
    assert_eq!(
        sent(&svc, 0),
        at_drain,
        "a draining node gets no new requests"
    );
    assert_eq!(
        svc.view().pool.outstanding(0),
        0,
        "its in-flight requests completed"
    );
    assert_eq!(report.answered, report.requests, "{report}");
    assert_eq!(svc.view().counters.declined_total(), 0);
    switch.stop().await;
}

/// Garbage from one client closes that client only; an oversized length prefix
/// is refused before anything is buffered; the per-source limit holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_clients_are_closed_and_others_are_unaffected() {
    let spec = spec("cup-pos");
    let front_extra = "max_per_source = 3\non_bad_message = \"close\"";
    let (_nodes, switch) = Rig::on("cup-pos").nodes(2).front(front_extra).start().await;
    let svc = service(&switch).clone();
    wait_connected(&svc, 2).await;

    // Healthy NAC traffic from 127.0.0.2 while 127.0.0.1 misbehaves.
    let healthy = {
        let spec = spec.clone();
        let target = front(&switch);
        tokio::spawn(async move {
            let mut lc = load_config(target, 2, 2);
            lc.bind_ip = Some("127.0.0.2".parse().unwrap());
            load::run(spec, lc, Arc::new(LoadCounters::default())).await
        })
    };

    // An oversized length prefix (binary2 0xFFFF > max_frame 4096).
    let mut oversized = RawClient::connect(front(&switch), &spec).await;
    oversized.send_raw(&[0xFF, 0xFF, 0x60, 0x00]).await;
    assert!(
        oversized.closed_by_peer().await,
        "oversized frame closes the link"
    );

    // A well-framed message that is garbage inside (policy: close).
    let mut garbage = RawClient::connect(front(&switch), &spec).await;
    garbage
        .send_raw(&RawClient::frame(&spec, b"\x61\x00\x03\x00\x00garbage"))
        .await;
    assert!(
        garbage.closed_by_peer().await,
        "unparsable message closes the link"
    );
    wait_until("bad frame and bad message counted", || {
        svc.view().counters.bad_frames.load(Ordering::Relaxed) >= 1
            && svc.view().counters.bad_messages.load(Ordering::Relaxed) >= 1
    })
    .await;

    // Per-source limit: three links from 127.0.0.1 are fine, the fourth is closed.
    let mut kept = Vec::new();
    for _ in 0..3 {
        kept.push(RawClient::connect(front(&switch), &spec).await);
    }
    wait_until("three links admitted", || {
        svc.view().counters.clients_accepted.load(Ordering::Relaxed) >= 5 + 2
    })
    .await;
    let mut fourth = RawClient::connect(front(&switch), &spec).await;
    assert!(
        fourth.closed_by_peer().await,
        "the fourth link from one source is refused"
    );
    let refused = svc
        .view()
        .counters
        .refused(isoswitch::link::service::Refusal::TooManyFromSource);
    assert!(refused >= 1);
    // By reason in the metrics and the status, as operators see them.
    let metrics = isoswitch::ops::metrics::render(switch.handle()).expect("metrics");
    assert!(
        metrics.contains(&format!(
            "isoswitch_service_connections_refused_total{{service=\"svc\",reason=\"max_per_source\"}} {refused}"
        )),
        "{metrics}"
    );
    let status = isoswitch::ops::status::status_of(switch.handle());
    assert_eq!(status.services[0].refused["max_per_source"], refused);
    assert_eq!(status.services[0].refused["descriptors"], 0);

    let report = healthy.await.unwrap().unwrap();
    assert!(report.requests > 0);
    assert_eq!(report.answered, report.requests, "{report}");
    assert_eq!(report.connections_lost, 0, "{report}");
    drop(kept);
    switch.stop().await;
}

/// No node up: requests are declined with the no-healthy-node code, and the
/// client stays connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_healthy_node_declines_and_keeps_the_client() {
    let spec = spec("cup-pos");
    // An address nothing listens on while the test runs.
    let (dead, _held) = dead_addr();
    let switch = start_switch(&Rig::on("cup-pos").config(&[dead])).await;
    let request = isoswitch::sim::sample_request(&spec, "0200").unwrap();
    let mut client = RawClient::connect(front(&switch), &spec).await;
    for _ in 0..2 {
        client.send_raw(&RawClient::frame(&spec, &request)).await;
        let resp = Message::parse(&spec, client.recv().await.expect("a decline")).unwrap();
        assert_eq!(resp.mti().as_str(), "0210");
        assert_eq!(resp.field(39).unwrap().unwrap().data(), b"91");
        let req = Message::parse(&spec, request.clone()).unwrap();
        assert_eq!(resp.tpdu(), req.tpdu().map(|t| t.swapped()));
    }
    switch.stop().await;
}

/// Directed routing on a BCD field: POS balance inquiries (F3 starting `31`)
/// go only to the nodes their rule names; purchases spread over all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directed_rule_on_bcd_processing_code_picks_its_nodes() {
    let spec = spec("cup-pos");
    let back = "[[service.back.rule]]\nmti = \"02xx\"\nfields = [{ field = 3, prefix = \"31\" }]\nnodes = [\"02\"]";
    let (_nodes, switch) = Rig::on("cup-pos").nodes(3).back(back).start().await;
    let svc = service(&switch).clone();
    wait_connected(&svc, 2).await;

    // Each its own transaction (STAN): the same one again would be a
    // duplicate, answered by the switch.
    let request = |f3: &str, stan: u32| {
        let mut d = isoswitch::iso8583::samples::purchase(&spec);
        d.set_text(3, f3);
        d.set_text(11, format!("{stan:06}"));
        spec.encode(&d).unwrap()
    };
    let mut client = RawClient::connect(front(&switch), &spec).await;
    for stan in 1..=6 {
        let inquiry = request("310000", stan);
        client.send_raw(&RawClient::frame(&spec, &inquiry)).await;
        assert!(client.recv().await.is_some());
    }
    assert_eq!((sent(&svc, 0), sent(&svc, 1), sent(&svc, 2)), (0, 6, 0));
    for stan in 11..=16 {
        let purchase = request("000000", stan);
        client.send_raw(&RawClient::frame(&spec, &purchase)).await;
        assert!(client.recv().await.is_some());
    }
    assert!(
        sent(&svc, 0) > 0 && sent(&svc, 2) > 0,
        "purchases use every node"
    );
    switch.stop().await;
}

/// Forcing a node offline declines its in-flight requests at once and sends
/// it nothing new; re-enabling brings it back without reconnecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forcing_a_node_offline_declines_its_in_flight_at_once() {
    let spec = spec("cups");
    let (_nodes, switch) = Rig::on("cups").nodes(2).delay("1s").start().await;
    let svc = service(&switch).clone();
    wait_connected(&svc, 2).await;
    let load = tokio::spawn(load::run(
        spec.clone(),
        load_config(front(&switch), 2, 1),
        Arc::new(LoadCounters::default()),
    ));
    wait_until("both nodes busy", || {
        svc.view().pool.outstanding(0) > 0 && svc.view().pool.outstanding(1) > 0
    })
    .await;
    let now = std::time::Instant::now;
    assert!(svc.set_node_admin(0, isoswitch::route::AdminState::ForcedOffline, now()));
    assert_eq!(
        svc.view().pool.outstanding(0),
        0,
        "in-flight declined at once"
    );
    let at_disable = sent(&svc, 0);
    let report = load.await.unwrap().unwrap();
    assert_eq!(sent(&svc, 0), at_disable);
    assert_eq!(
        report.answered + report.declined,
        report.requests,
        "{report}"
    );
    assert!(
        svc.view()
            .counters
            .declined(isoswitch::route::DeclineReason::Shutdown)
            > 0
    );
    assert!(svc.set_node_admin(0, isoswitch::route::AdminState::Enabled, now()));
    assert!(
        svc.view().pool.eligible(0, now()),
        "back at once: its connections stayed up"
    );
    switch.stop().await;
}

/// A client that starts a frame and stalls is closed after the partial-frame
/// timeout (not the much longer idle timeout); a silent client after the idle
/// timeout; keep-alives keep an idle client open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_frame_and_idle_timeouts_close_only_their_client() {
    let spec = spec("cup-pos");
    let front_extra = "idle_timeout = \"1500ms\"\npartial_frame_timeout = \"200ms\"";
    let (_nodes, switch) = Rig::on("cup-pos").front(front_extra).start().await;
    let target = front(&switch);

    // The switch's clocks start at accept, after this instant.
    let started = std::time::Instant::now();
    let mut silent = RawClient::connect(target, &spec).await;
    let mut chatty = RawClient::connect(target, &spec).await;
    let mut stalled = RawClient::connect(target, &spec).await;
    stalled.send_raw(&[0x00, 0x40, 0x60, 0x00]).await; // 64 bytes announced, 2 sent
    let stalled_closed = async {
        let closed = stalled.closed_by_peer().await;
        (closed, started.elapsed())
    };
    let silent_closed = async {
        let closed = silent.closed_by_peer().await;
        (closed, started.elapsed())
    };
    let keep_alives = async {
        for _ in 0..14 {
            chatty.send_raw(&[0x00, 0x00]).await;
            // Pacing, not a wait: the scenario is a keep-alive every 150 ms.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        chatty
    };
    let ((stalled_closed, stalled_at), (silent_closed, silent_at), mut chatty) =
        tokio::join!(stalled_closed, silent_closed, keep_alives);
    assert!(
        stalled_closed && stalled_at < Duration::from_millis(1000),
        "stalled frame closed at {stalled_at:?}"
    );
    assert!(
        silent_closed && silent_at >= Duration::from_millis(1500),
        "silent client closed at {silent_at:?}"
    );
    // The chatty client is still served.
    let request = isoswitch::sim::sample_request(&spec, "0200").unwrap();
    chatty.send_raw(&RawClient::frame(&spec, &request)).await;
    assert!(
        chatty.recv().await.is_some(),
        "keep-alives kept the link open"
    );
    switch.stop().await;
}

/// A graceful stop: requests in flight still get their node's answers, a
/// request arriving during the stop gets the shutdown decline, new clients are
/// refused, and only then do the links close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_answers_in_flight_and_declines_new_requests() {
    let spec = spec("cup-pos");
    // TCP checks: no echo requests among what the nodes count.
    let back = "[service.back.health]\ncheck = \"tcp\"";
    let (nodes, switch) = Rig::on("cup-pos")
        .nodes(2)
        .delay("400ms")
        .back(back)
        .start()
        .await;
    let svc = service(&switch).clone();
    let target = front(&switch);
    wait_connected(&svc, 2).await;

    let mut d = isoswitch::iso8583::samples::purchase(&spec);
    let mut client = RawClient::connect(target, &spec).await;
    for stan in ["000001", "000002", "000003"] {
        d.set_text(11, stan);
        client
            .send_raw(&RawClient::frame(&spec, &spec.encode(&d).unwrap()))
            .await;
    }
    wait_until("three requests at the nodes", || {
        nodes
            .iter()
            .map(|n| n.stats.requests.load(Ordering::Relaxed))
            .sum::<u64>()
            >= 3
    })
    .await;
    let stopping = tokio::spawn(switch.stop());
    wait_until("draining", || svc.view().links.is_draining()).await;
    let mut newcomer = RawClient::connect(target, &spec).await;
    assert!(
        newcomer.closed_by_peer().await,
        "no new clients while stopping"
    );
    d.set_text(11, "000004");
    client
        .send_raw(&RawClient::frame(&spec, &spec.encode(&d).unwrap()))
        .await;
    let mut answers = std::collections::BTreeMap::new();
    for _ in 0..4 {
        let m =
            Message::parse(&spec, client.recv().await.expect("an answer before close")).unwrap();
        let f11 = m.field(11).unwrap().unwrap().show().to_string();
        let f39 = m.field(39).unwrap().unwrap().data().to_vec();
        answers.insert(f11, f39);
    }
    let expect: std::collections::BTreeMap<String, Vec<u8>> = [
        ("000001", b"00"),
        ("000002", b"00"),
        ("000003", b"00"),
        ("000004", b"91"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_vec()))
    .collect();
    assert_eq!(
        answers, expect,
        "in-flight answered by the node, the late one declined"
    );
    assert!(client.closed_by_peer().await, "links close at the end");
    stopping.await.unwrap();
}

/// A node that stalls in the middle of a frame: its connection is closed after
/// the partial-frame timeout and the request it held is declined at once
/// (node lost), not left to the request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stalling_mid_frame_loses_its_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let spec = spec("cup-pos");
    let stalling = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = stalling.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = stalling.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                // On the first bytes from the switch, start a 100-byte frame and stop.
                if matches!(s.read(&mut buf).await, Ok(n) if n > 0) {
                    let _ = s.write_all(&[0x00, 0x64, 0x60, 0x00, 0x00]).await;
                }
                // The scenario, not a wait: a host that stalls mid-frame
                // and holds its connection open.
                tokio::time::sleep(Duration::from_secs(30)).await;
                drop(s);
            });
            held.push(());
        }
    });
    let back = "partial_frame_timeout = \"200ms\"\nconnections_per_node = 1\n[service.back.health]\ncheck = \"none\"";
    let switch = start_switch(&Rig::on("cup-pos").back(back).config(&[addr])).await;
    let svc = service(&switch).clone();
    wait_connected(&svc, 1).await;
    let request = isoswitch::sim::sample_request(&spec, "0200").unwrap();
    let mut client = RawClient::connect(front(&switch), &spec).await;
    let sent = std::time::Instant::now();
    client.send_raw(&RawClient::frame(&spec, &request)).await;
    let resp = Message::parse(&spec, client.recv().await.expect("a decline")).unwrap();
    assert_eq!(
        resp.field(39).unwrap().unwrap().data(),
        b"91",
        "node lost, not a timeout"
    );
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "declined at the partial-frame timeout"
    );
    assert_eq!(
        svc.view()
            .counters
            .declined(isoswitch::route::DeclineReason::NodeLost),
        1
    );
    switch.stop_within(Duration::ZERO).await;
}

/// The F37 node stamp is written in the field's own encoding: on VISA, whose
/// F37 is EBCDIC, the node sees its ID as EBCDIC characters, and the response
/// still finds its way back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f37_stamp_is_written_in_the_fields_encoding() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let spec = spec("visa-base1");
    // A node that records the F37 it receives, then answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let node_spec = spec.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (spec, seen) = (node_spec.clone(), seen_tx.clone());
            tokio::spawn(async move {
                let mut codec = isoswitch::wire::FrameCodec::new(
                    spec.framing().prefix,
                    spec.framing().max_frame,
                );
                let mut buf = bytes::BytesMut::new();
                loop {
                    use tokio_util::codec::Decoder;
                    while let Ok(Some(isoswitch::wire::Frame::Message(p))) = codec.decode(&mut buf)
                    {
                        let m = Message::parse(&spec, p).unwrap();
                        let _ = seen.send(m.field(37).unwrap().map(|f| f.data().to_vec()));
                        let resp = isoswitch::sim::answer::answer(&spec, &m, "00").unwrap();
                        let _ = s.write_all(&RawClient::frame(&spec, &resp)).await;
                    }
                    if !matches!(s.read_buf(&mut buf).await, Ok(n) if n > 0) {
                        return;
                    }
                }
            });
        }
    });
    let service_extra = "f37_stamp = { offset = 10, width = 2 }";
    let back = "connections_per_node = 1\n[service.back.health]\ncheck = \"none\"";
    let switch = start_switch(
        &Rig::on("visa-base1")
            .service(service_extra)
            .back(back)
            .config(&[addr]),
    )
    .await;
    wait_connected(service(&switch), 1).await;
    let request = isoswitch::sim::sample_request(&spec, "0200").unwrap();
    let mut client = RawClient::connect(front(&switch), &spec).await;
    client.send_raw(&RawClient::frame(&spec, &request)).await;
    let resp = Message::parse(&spec, client.recv().await.expect("an answer")).unwrap();
    assert_eq!(resp.field(39).unwrap().unwrap().show().to_string(), "00");
    let stamped = seen_rx.recv().await.unwrap().expect("F37 at the node");
    let ebcdic_01 = [
        isoswitch::iso8583::ebcdic::from_ascii(b'0'),
        isoswitch::iso8583::ebcdic::from_ascii(b'1'),
    ];
    assert_eq!(&stamped[10..12], &ebcdic_01, "node ID 01 in EBCDIC");
    switch.stop().await;
}

/// A request the switch cannot stamp (it carries no F37) is declined after a
/// node was picked for it; the node's outstanding count, which least-
/// outstanding balances on and the in-flight gauges show, goes back to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_f37_stamp_gives_the_pick_back() {
    let spec = spec("iso87ascii");
    let service_extra = "f37_stamp = { offset = 10, width = 2 }";
    let back = "algorithm = \"least-outstanding\"\n[service.back.health]\ncheck = \"none\"";
    let (_nodes, switch) = Rig::on("iso87ascii")
        .service(service_extra)
        .back(back)
        .start()
        .await;
    let svc = service(&switch);
    wait_connected(svc, 2).await;
    let mut request = isoswitch::iso8583::samples::purchase(&spec);
    assert!(request.remove(37).is_some(), "the sample carries F37");
    let request = spec.encode(&request).expect("encode");
    let mut client = RawClient::connect(front(&switch), &spec).await;
    for _ in 0..3 {
        client.send_raw(&RawClient::frame(&spec, &request)).await;
        let answer = client.recv().await.expect("a decline");
        let answer = isoswitch::iso8583::Message::parse(&spec, answer).expect("parses");
        assert_ne!(
            answer.field(39).unwrap().unwrap().show().to_string(),
            "00",
            "declined"
        );
    }
    assert_eq!(svc.view().pool.outstanding(0), 0, "picks given back");
    switch.stop().await;
}

/// A terminal's own reversal advice (0420), stored and acknowledged by the
/// switch in store-and-forward mode, then delivered to a node that answers
/// 0430: counted as an advice delivered. The switch's reversals (of late
/// approvals) are counted apart; it sent none here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_reversal_advice_is_counted_as_an_advice_delivered() {
    let spec = spec("cups");
    let scratch = Scratch::new("stored-0420");
    let nodes = start_nodes(&spec, 1, Delay::parse("1ms").unwrap()).await;
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let mut cfg = Rig::on("cups")
        .service("[service.integrity]\nadvices = \"store-and-forward\"")
        .config(&addrs);
    cfg.data_dir = Some(scratch.join("data"));
    let switch = start_switch(&cfg).await;
    let svc = service(&switch).clone();
    wait_connected(&svc, 2).await;
    // Naming its original in F90 (MTI, F11, F7, F32, F33), as a terminal's
    // reversal does: a host answers one that names none with 30 (format
    // error), which is not a "done" and is tried again.
    let advice = isoswitch::sim::sample_request(&spec, "0420").unwrap();
    let mut advice = spec.decode(&advice).unwrap();
    let text = |id| {
        advice
            .get(id)
            .and_then(|v| v.as_text())
            .unwrap_or("")
            .to_string()
    };
    let f90 = format!("0200{:0>6}{:0>10}{:0>22}", text(11), text(7), 0);
    advice.set_text(90, f90);
    let advice = spec.encode(&advice).unwrap();
    let mut client = RawClient::connect(front(&switch), &spec).await;
    client.send_raw(&RawClient::frame(&spec, &advice)).await;
    let ack = Message::parse(&spec, client.recv().await.unwrap()).unwrap();
    assert_eq!(&ack.mti().digits(), b"0430");
    assert_eq!(ack.field(39).unwrap().unwrap().data(), b"00");
    let m = &svc.view().made.counters;
    wait_until("the stored advice delivered", || {
        m.advices_delivered.load(Ordering::Relaxed)
            + m.reversals_acknowledged.load(Ordering::Relaxed)
            >= 1
    })
    .await;
    assert_eq!(m.advices_delivered.load(Ordering::Relaxed), 1);
    assert_eq!(m.reversals_sent.load(Ordering::Relaxed), 0);
    assert_eq!(
        m.reversals_acknowledged.load(Ordering::Relaxed),
        0,
        "a client's advice counted as the switch's own reversal"
    );
    switch.stop().await;
}
