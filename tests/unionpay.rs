//! End-to-end: UnionPay split simplex links (8 in / 8 out) through the switch to
//! three channel nodes, with the UnionPay simulator on the other side.

mod common;
mod store_support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use isoswitch::config::Config;
use isoswitch::iso8583::Spec;
use isoswitch::link::Service;
use isoswitch::ops::run::Switch;
use isoswitch::sim::cups::{CupsSim, CupsSimConfig};
use isoswitch::sim::node::{Delay, NodeSim, NodeSimConfig, Originate};

const LINKS: usize = 8;

/// Three nodes; with `originate`, each sends its own 0200s at that rate.
async fn nodes(spec: &Arc<Spec>, delay: Delay, originate: Option<f64>) -> Vec<NodeSim> {
    let mut out = Vec::new();
    for i in 0..3u32 {
        let mut cfg = NodeSimConfig::new(&format!("{:02}", i + 1));
        cfg.delay = delay;
        cfg.originate = originate.map(|rate| Originate {
            mti: "0200".into(),
            rate,
            stan_base: (i + 1) * 100_000,
            timeout: Duration::from_secs(5),
        });
        out.push(
            NodeSim::start("127.0.0.1:0".parse().unwrap(), spec.clone(), cfg)
                .await
                .unwrap(),
        );
    }
    out
}

/// A simplex service: out links to `peer`, in links on `listen`.
fn simplex_config(
    peer: SocketAddr,
    listen: SocketAddr,
    nodes: &[SocketAddr],
    links: usize,
    front_extra: &str,
) -> Config {
    let toml = simplex_toml(peer, listen, nodes, links, front_extra);
    Config::from_toml(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

fn simplex_toml(
    peer: SocketAddr,
    listen: SocketAddr,
    nodes: &[SocketAddr],
    links: usize,
    front_extra: &str,
) -> String {
    let mut toml = format!(
        "[[service]]\nname = \"unionpay\"\nspec = \"cups\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
         [service.front]\nkind = \"simplex\"\nconnect = \"{peer}\"\nlisten = \"{listen}\"\nlinks = {links}\n\
         member_id = \"03105840\"\npeer_id = \"00010000\"\nkeepalive_idle = \"200ms\"\n\
         reconnect_min = \"20ms\"\nreconnect_max = \"200ms\"\n{front_extra}\n\
         [service.back]\nconnections_per_node = 2\n[service.back.health]\ncheck = \"echo\"\ninterval = \"100ms\"\n"
    );
    for (i, a) in nodes.iter().enumerate() {
        toml.push_str(&format!(
            "[[service.back.node]]\nid = \"{:02}\"\naddress = \"{a}\"\n",
            i + 1
        ));
    }
    toml
}

fn cups_sim_config(
    accept: SocketAddr,
    connect: SocketAddr,
    rate: Option<f64>,
    seconds: u64,
) -> CupsSimConfig {
    let mut c = CupsSimConfig::new(accept, connect, LINKS);
    c.rate = rate;
    c.duration = Duration::from_secs(seconds);
    c.timeout = Duration::from_secs(3);
    c.keepalive_idle = Duration::from_millis(200);
    c
}

async fn wait_links_up(svc: &Service) {
    let links = svc
        .view()
        .side
        .out_links()
        .expect("a simplex front")
        .clone();
    wait_until("8 out links signed on and 8 in links up", || {
        links.up() == (LINKS, LINKS) && links.in_stats.open.load(Ordering::Relaxed) == LINKS
    })
    .await;
}

/// Waits until UnionPay sent `issuer` requests and each node had `answered`
/// of its own answered: by volume, not time, so a slow machine runs the same.
async fn wait_traffic(cups: &CupsSim, nodes: &[NodeSim], issuer: u64, answered: u64) {
    wait_until("traffic both ways", || {
        cups.report().sent >= issuer
            && nodes
                .iter()
                .all(|n| n.stats.originated_answered.load(Ordering::Relaxed) >= answered)
    })
    .await;
}

struct Rig {
    /// Node requests declined before the out links were signed on.
    unsent_at_start: u64,
    nodes: Vec<NodeSim>,
    cups: CupsSim,
    switch: Switch,
}

impl Rig {
    /// UnionPay originates at `issuer_rate` until [`Rig::settle`]: a test
    /// waits for the traffic it needs ([`wait_traffic`]), however long a
    /// slow machine takes to carry it.
    async fn start(node_delay: Delay, originate: Option<f64>, issuer_rate: Option<f64>) -> Rig {
        let spec = spec("cups");
        let nodes = nodes(&spec, node_delay, originate).await;
        let listen = free_addr();
        let cups = CupsSim::start(
            spec.clone(),
            cups_sim_config("127.0.0.1:0".parse().unwrap(), listen, issuer_rate, 3600),
        )
        .await
        .unwrap();
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let switch = Switch::start(&simplex_config(
            cups.accept_addr(),
            listen,
            &addrs,
            LINKS,
            "sign_on_retry = \"300ms\"",
        ))
        .await
        .unwrap();
        wait_links_up(service(&switch)).await;
        let peer = &service(&switch).view().counters.peer;
        let unsent_at_start = peer.node_requests_unsent.load(Ordering::Relaxed);
        Rig {
            unsent_at_start,
            nodes,
            cups,
            switch,
        }
    }

    fn svc(&self) -> &Arc<Service> {
        service(&self.switch)
    }

    /// Stops every originator (the nodes, and UnionPay if its run is still
    /// going), then waits until every request is answered or timed out, so
    /// reports read after this cannot count a request sent after the wait.
    async fn settle(&self) {
        for n in &self.nodes {
            n.stop_originating();
        }
        self.cups.stop_originating();
        wait_until("node-originated requests settled", || {
            self.nodes.iter().all(|n| n.outstanding() == 0)
        })
        .await;
        wait_until("issuer requests settled", || self.cups.outstanding() == 0).await;
    }
}

/// Every node-originated request came back to its own node: answered, or
/// declined by the switch only while no out link was signed on yet.
fn assert_nodes_got_their_own(nodes: &[NodeSim], svc: &Service, unsent_at_start: u64) {
    let mut declined = 0;
    for (i, n) in nodes.iter().enumerate() {
        let s = &n.stats;
        let sent = s.originated.load(Ordering::Relaxed);
        let answered = s.originated_answered.load(Ordering::Relaxed);
        declined += s.originated_declined.load(Ordering::Relaxed);
        assert!(answered > 0, "node {i} got no answer");
        assert_eq!(
            s.foreign_responses.load(Ordering::Relaxed),
            0,
            "node {i}: a response meant for another node"
        );
        assert_eq!(
            s.originated_unanswered.load(Ordering::Relaxed),
            0,
            "node {i}"
        );
        assert_eq!(
            answered + s.originated_declined.load(Ordering::Relaxed),
            sent,
            "node {i}"
        );
    }
    let unsent = svc
        .view()
        .counters
        .peer
        .node_requests_unsent
        .load(Ordering::Relaxed);
    assert_eq!(
        declined, unsent,
        "the only declines: no out link signed on yet"
    );
    assert_eq!(
        unsent, unsent_at_start,
        "none once the links were signed on"
    );
}

/// Node-originated 0200s come back to the node that sent them, by the F37
/// stamp, though they return on other TCP connections; UnionPay-originated
/// 0100s are balanced across the nodes and each answered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_reach_their_node_and_issuer_requests_balance() {
    let rig = Rig::start(Delay::parse("0..20ms").unwrap(), Some(100.0), Some(300.0)).await;
    // Two seconds' worth at 300/s, as many as the spread check needs.
    wait_traffic(&rig.cups, &rig.nodes, 600, 1).await;
    rig.settle().await;
    assert_nodes_got_their_own(&rig.nodes, rig.svc(), rig.unsent_at_start);
    let report = rig.cups.report();
    assert!(report.sent > 300, "{report}");
    assert_eq!(report.answered, report.sent, "{report}");
    assert_eq!(report.mismatched, 0, "{report}");
    assert_eq!(report.unanswered, 0, "{report}");
    assert_eq!(
        report.member_requests_answered, report.member_requests,
        "{report}"
    );
    let per_node: Vec<u64> = (0..3).map(|i| sent(rig.svc(), i)).collect();
    let total: u64 = per_node.iter().sum();
    assert_eq!(total, report.sent, "every issuer request went to a node");
    for n in &per_node {
        assert!(
            (*n as f64 / total as f64 - 1.0 / 3.0).abs() < 0.05,
            "spread {per_node:?}"
        );
    }
    let c = &rig.svc().view().counters;
    assert_eq!(c.peer.unroutable_responses.load(Ordering::Relaxed), 0);
    assert_eq!(
        c.declined_total(),
        c.peer.node_requests_unsent.load(Ordering::Relaxed),
        "declines only to node requests sent before sign-on"
    );
    rig.switch.stop().await;
    rig.cups.stop().await;
}

/// Closing 3 out links and 3 in links mid-run loses nothing, and the links
/// come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_links_mid_run_loses_nothing() {
    let rig = Rig::start(Delay::NONE, Some(50.0), Some(200.0)).await;
    wait_traffic(&rig.cups, &rig.nodes, 150, 1).await;
    assert_eq!(rig.cups.close_out_links(3), 3);
    assert_eq!(rig.cups.close_in_links(3), 3);
    // The links come back, and traffic flows over them again.
    wait_links_up(rig.svc()).await;
    let sent = rig.cups.report().sent;
    let own = |n: &NodeSim| n.stats.originated_answered.load(Ordering::Relaxed);
    let answered = rig.nodes.iter().map(own).max().unwrap_or(0);
    wait_traffic(&rig.cups, &rig.nodes, sent + 300, answered + 20).await;
    rig.settle().await;
    wait_links_up(rig.svc()).await;
    assert_nodes_got_their_own(&rig.nodes, rig.svc(), rig.unsent_at_start);
    let report = rig.cups.report();
    assert_eq!(report.answered, report.sent, "{report}");
    assert_eq!(report.unanswered + report.mismatched, 0, "{report}");
    let links = rig.svc().view().side.out_links().unwrap();
    let reconnects: u64 = links
        .stats
        .iter()
        .map(|s| s.connects.load(Ordering::Relaxed))
        .sum();
    assert!(
        reconnects >= LINKS as u64 + 3,
        "closed out links reconnected: {reconnects}"
    );
    rig.switch.stop().await;
    rig.cups.stop().await;
}

/// A node dies with UnionPay's requests in flight: UnionPay gets the switch's
/// declines for them, nothing goes unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_node_declines_its_in_flight_issuer_requests() {
    let mut rig = Rig::start(Delay::parse("100..300ms").unwrap(), None, Some(300.0)).await;
    let svc = Arc::clone(rig.svc());
    wait_until("node 03 has requests in flight", || {
        svc.view().pool.outstanding(2) > 0
    })
    .await;
    rig.nodes.remove(2).stop().await;
    wait_until("UnionPay has the switch's declines", || {
        rig.cups.report().declined > 0
    })
    .await;
    // And traffic goes on through the two nodes left.
    let sent = rig.cups.report().sent;
    wait_traffic(&rig.cups, &rig.nodes, sent + 150, 0).await;
    rig.settle().await;
    let report = rig.cups.report();
    assert!(report.declined > 0, "{report}");
    assert_eq!(report.answered + report.declined, report.sent, "{report}");
    assert_eq!(report.unanswered + report.mismatched, 0, "{report}");
    let c = &rig.svc().view().counters;
    assert_eq!(
        c.declined(isoswitch::route::DeclineReason::NodeLost),
        report.declined
    );
    rig.switch.stop().await;
    rig.cups.stop().await;
}

/// Keep-alives flow both ways on idle links and never reach the nodes; the
/// switch answers UnionPay's echo test itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalives_and_echo_are_handled_by_the_switch() {
    let rig = Rig::start(Delay::NONE, None, None).await;
    let links = rig.svc().view().side.out_links().unwrap().clone();
    wait_until("keep-alives on every idle out link", || {
        let out: u64 = links
            .stats
            .iter()
            .map(|s| s.keepalives_out.load(Ordering::Relaxed))
            .sum();
        out >= LINKS as u64 && rig.cups.report().keepalives_received >= LINKS as u64
    })
    .await;
    let ka_out: u64 = links
        .stats
        .iter()
        .map(|s| s.keepalives_out.load(Ordering::Relaxed))
        .sum();
    assert!(
        ka_out >= LINKS as u64,
        "keep-alives sent on idle out links: {ka_out}"
    );
    assert!(rig.cups.report().keepalives_received >= LINKS as u64);
    wait_until("keep-alives accepted on in links", || {
        links.in_stats.keepalives_in.load(Ordering::Relaxed) > 0
    })
    .await;
    assert!(rig.cups.send_echo());
    wait_until("UnionPay's echo answered", || {
        rig.cups.report().echo_answered == 1
    })
    .await;
    assert_eq!(
        rig.svc()
            .view()
            .counters
            .peer
            .network_answered
            .load(Ordering::Relaxed),
        1
    );
    // Nodes see only the switch's own health echoes: nothing from UnionPay.
    assert_eq!(
        rig.svc().view().counters.requests.load(Ordering::Relaxed),
        0,
        "nothing routed to the nodes"
    );
    assert_eq!(
        links.sign_ons_acknowledged.load(Ordering::Relaxed),
        LINKS as u64
    );
    rig.switch.stop().await;
    rig.cups.stop().await;
}

/// UnionPay played by hand: accepts out links, opens in links, and lets the
/// test decide what to answer and on which link.
struct HandPeer {
    addr: SocketAddr,
    frames: tokio::sync::mpsc::UnboundedReceiver<(usize, bytes::Bytes)>,
    in_links: Vec<tokio::net::TcpStream>,
}

impl HandPeer {
    async fn start() -> HandPeer {
        HandPeer::start_at("127.0.0.1:0".parse().unwrap()).await
    }

    async fn start_at(addr: SocketAddr) -> HandPeer {
        use futures_util::StreamExt;
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, frames) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut id = 0;
            while let Ok((stream, _)) = listener.accept().await {
                id += 1;
                let tx = tx.clone();
                tokio::spawn(async move {
                    let codec = isoswitch::wire::FrameCodec::new(
                        isoswitch::wire::LengthPrefix::Ascii4,
                        8192,
                    );
                    let mut frames = tokio_util::codec::FramedRead::new(stream, codec);
                    while let Some(Ok(frame)) = frames.next().await {
                        if let isoswitch::wire::Frame::Message(p) = frame {
                            let _ = tx.send((id, p));
                        }
                    }
                });
            }
        });
        HandPeer {
            addr,
            frames,
            in_links: Vec::new(),
        }
    }

    async fn open_in_links(&mut self, switch_in: SocketAddr, n: usize) {
        for _ in 0..n {
            self.in_links
                .push(tokio::net::TcpStream::connect(switch_in).await.unwrap());
        }
    }

    async fn send_on(&mut self, in_link: usize, spec: &Spec, payload: &[u8]) {
        use tokio::io::AsyncWriteExt;
        let frame = RawClient::frame(spec, payload);
        self.in_links[in_link].write_all(&frame).await.unwrap();
    }

    /// The next message from any out link, skipping what `skip` says.
    async fn next_where(
        &mut self,
        spec: &Spec,
        want: impl Fn(&isoswitch::iso8583::Message) -> bool,
    ) -> (usize, bytes::Bytes) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let (link, p) = tokio::time::timeout_at(deadline, self.frames.recv())
                .await
                .expect("a frame from the switch in time")
                .expect("peer open");
            let m = isoswitch::iso8583::Message::parse(spec, p.clone()).unwrap();
            if want(&m) {
                return (link, p);
            }
        }
    }
}

/// UnionPay's approval of a member 0200; None for anything else.
fn answer_0200(spec: &Spec, payload: bytes::Bytes) -> Option<bytes::Bytes> {
    let m = isoswitch::iso8583::Message::parse(spec, payload).ok()?;
    (m.mti().as_str() == "0200").then(|| isoswitch::sim::answer::answer(spec, &m, "00").unwrap())
}

fn f70(m: &isoswitch::iso8583::Message) -> Vec<u8> {
    m.field(70)
        .unwrap()
        .map(|f| f.data().to_vec())
        .unwrap_or_default()
}

/// With per-link sign-on, each out link's first message is an 0820 sign-on;
/// node requests wait (not declined, not written) until UnionPay acknowledges
/// it, then flow. On shutdown the switch signs off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_on_precedes_traffic_and_sign_off_ends_it() {
    let spec = spec("cups");
    let nodes = nodes(&spec, Delay::NONE, Some(50.0)).await;
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let mut peer = HandPeer::start().await;
    let listen = free_addr();
    let cfg = simplex_config(peer.addr, listen, &addrs, 2, "sign_on_retry = \"10s\"");
    let switch = Switch::start(&cfg).await.unwrap();
    let svc = service(&switch).clone();
    peer.open_in_links(listen, 2).await;

    // The first message on each out link is its sign-on.
    let mut sign_ons = Vec::new();
    let mut links_seen = std::collections::HashSet::new();
    while links_seen.len() < 2 {
        let (link, p) = peer.next_where(&spec, |_| true).await;
        let m = isoswitch::iso8583::Message::parse(&spec, p.clone()).unwrap();
        assert!(
            links_seen.insert(link),
            "one sign-on per link, before anything else"
        );
        assert_eq!(m.mti().as_str(), "0820");
        assert_eq!(f70(&m), b"001");
        sign_ons.push(m.decode().unwrap());
    }
    let links = svc.view().side.out_links().unwrap().clone();
    wait_until("node requests waiting while not signed on", || {
        links.waiting() > 0
    })
    .await;
    assert_eq!(links.up(), (2, 0), "up, not signed on");
    assert_eq!(
        svc.view()
            .counters
            .peer
            .node_requests_unsent
            .load(Ordering::Relaxed),
        0
    );

    // UnionPay acknowledges on an in link; traffic starts.
    for req in &sign_ons {
        let ack = spec.encode(&spec.respond(req, "00").unwrap()).unwrap();
        peer.send_on(0, &spec, &ack).await;
    }
    let (_, p) = peer.next_where(&spec, |m| m.mti().as_str() == "0200").await;
    let m = isoswitch::iso8583::Message::parse(&spec, p).unwrap();
    let f37 = m.field(37).unwrap().unwrap();
    assert!(
        f37.data().ends_with(b"01") || f37.data().ends_with(b"02") || f37.data().ends_with(b"03")
    );
    // Traffic may start on the first link acknowledged, before the second
    // acknowledgement is read.
    wait_until("both links signed on", || links.up() == (2, 2)).await;

    for n in &nodes {
        n.stop_originating();
    }
    switch.stop().await;
    let (_, p) = peer
        .next_where(&spec, |m| m.mti().as_str() == "0820" && f70(m) == b"002")
        .await;
    assert!(!p.is_empty(), "sign-off on shutdown");
}

/// Two switch instances on the same nodes, each with its own links: a
/// response arriving at either instance reaches the node that stamped the
/// request, with no state shared between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn either_instance_routes_a_response_to_the_stamping_node() {
    let spec = spec("cups");
    let nodes = nodes(&spec, Delay::NONE, Some(40.0)).await;
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let mut peer_a = HandPeer::start().await;
    let mut peer_b = HandPeer::start().await;
    let (listen_a, listen_b) = (free_addr(), free_addr());
    let no_sign_on = "sign_on = \"none\"\nsign_on_retry = \"300ms\"";
    let a = Switch::start(&simplex_config(
        peer_a.addr,
        listen_a,
        &addrs,
        2,
        no_sign_on,
    ))
    .await
    .unwrap();
    let b = Switch::start(&simplex_config(
        peer_b.addr,
        listen_b,
        &addrs,
        2,
        no_sign_on,
    ))
    .await
    .unwrap();
    // UnionPay answers what instance A sends on B's in links, and vice versa.
    peer_a.open_in_links(listen_a, 2).await;
    peer_b.open_in_links(listen_b, 2).await;
    let (mut via_a, mut via_b) = (0, 0);
    while via_a < 20 || via_b < 20 {
        tokio::select! {
            Some((_, p)) = peer_a.frames.recv() => {
                let Some(resp) = answer_0200(&spec, p) else { continue };
                peer_b.send_on(via_a % 2, &spec, &resp).await;
                via_a += 1;
            }
            Some((_, p)) = peer_b.frames.recv() => {
                let Some(resp) = answer_0200(&spec, p) else { continue };
                peer_a.send_on(via_b % 2, &spec, &resp).await;
                via_b += 1;
            }
        }
    }
    for n in &nodes {
        n.stop_originating();
    }
    // Keep answering stragglers until every node has its answers.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while nodes.iter().any(|n| n.outstanding() > 0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nodes still waiting"
        );
        while let Ok((_, p)) = peer_a.frames.try_recv() {
            if let Some(resp) = answer_0200(&spec, p) {
                peer_b.send_on(0, &spec, &resp).await;
            }
        }
        while let Ok((_, p)) = peer_b.frames.try_recv() {
            if let Some(resp) = answer_0200(&spec, p) {
                peer_a.send_on(0, &spec, &resp).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (i, n) in nodes.iter().enumerate() {
        let s = &n.stats;
        assert_eq!(s.foreign_responses.load(Ordering::Relaxed), 0, "node {i}");
        assert_eq!(
            s.originated_unanswered.load(Ordering::Relaxed),
            0,
            "node {i}"
        );
        assert!(
            s.originated_answered.load(Ordering::Relaxed) > 0,
            "node {i}"
        );
    }
    for sw in [&a, &b] {
        let c = &service(sw).view().counters;
        assert!(
            c.peer.peer_responses.load(Ordering::Relaxed) > 0,
            "each instance routed responses"
        );
        assert_eq!(c.peer.unroutable_responses.load(Ordering::Relaxed), 0);
    }
    a.stop().await;
    b.stop().await;
}

/// UnionPay's request arrives while none of our out links is up yet: the
/// node's answer is parked, not lost, and sent once an out link is up and
/// signed on, never before that link's sign-on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_wait_for_an_out_link_instead_of_being_lost() {
    let spec = spec("cups");
    let nodes = nodes(&spec, Delay::NONE, None).await;
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let (peer_addr, listen) = (free_addr(), free_addr());
    let switch = Switch::start(&simplex_config(peer_addr, listen, &addrs, 2, ""))
        .await
        .unwrap();
    let svc = service(&switch).clone();
    wait_until("node connections up", || {
        svc.view().pool.nodes().iter().all(|n| n.live_conns() == 2)
    })
    .await;

    // In links first; nothing listens for our out links yet.
    let mut early = HandPeer {
        addr: peer_addr,
        frames: tokio::sync::mpsc::unbounded_channel().1,
        in_links: Vec::new(),
    };
    early.open_in_links(listen, 1).await;
    let mut request = isoswitch::iso8583::samples::purchase(&spec);
    request.mti = "0100".parse().unwrap();
    early
        .send_on(0, &spec, &spec.encode(&request).unwrap())
        .await;
    wait_until("the node answered", || {
        svc.view().counters.answered.load(Ordering::Relaxed) == 1
    })
    .await;
    assert_eq!(svc.view().side.out_links().unwrap().up().0, 0);

    // UnionPay starts accepting: the first frame on a link is its sign-on,
    // and the parked answer waits for UnionPay's 0830.
    let mut peer = HandPeer::start_at(peer_addr).await;
    let (_, p) = peer.next_where(&spec, |_| true).await;
    let sign_on = isoswitch::iso8583::Message::parse(&spec, p).unwrap();
    assert_eq!(sign_on.mti().as_str(), "0820");
    assert_eq!(f70(&sign_on), b"001");
    // Absence, not a wait: nothing but sign-ons may come in this window
    // (the parked answer must wait for the 0830).
    tokio::time::sleep(Duration::from_millis(100)).await;
    while let Ok((_, p)) = peer.frames.try_recv() {
        let m = isoswitch::iso8583::Message::parse(&spec, p).unwrap();
        assert_eq!(
            (m.mti().as_str(), f70(&m)),
            ("0820", b"001".to_vec()),
            "only sign-ons before the 0830"
        );
    }
    assert_eq!(svc.view().side.out_links().unwrap().waiting(), 1);
    let ack = spec
        .encode(&spec.respond(&sign_on.decode().unwrap(), "00").unwrap())
        .unwrap();
    early.send_on(0, &spec, &ack).await;
    let (_, p) = peer.next_where(&spec, |m| m.mti().as_str() == "0110").await;
    let m = isoswitch::iso8583::Message::parse(&spec, p).unwrap();
    assert_eq!(m.field(39).unwrap().unwrap().data(), b"00");
    assert_eq!(
        svc.view()
            .side
            .out_links()
            .as_ref()
            .unwrap()
            .parked_sent
            .load(Ordering::Relaxed),
        1
    );
    assert_eq!(svc.view().counters.undeliverable.load(Ordering::Relaxed), 0);
    switch.stop().await;
}

/// With `rebuild_group`, one broken out link rebuilds them all; an in link
/// silent past `in_link_silence` is closed by the switch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_rebuild_and_in_link_silence() {
    use tokio::io::AsyncReadExt;
    let spec = spec("cups");
    let nodes = nodes(&spec, Delay::NONE, None).await;
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let listen = free_addr();
    let mut cups_cfg = cups_sim_config("127.0.0.1:0".parse().unwrap(), listen, None, 5);
    cups_cfg.links = 4;
    let cups = CupsSim::start(spec.clone(), cups_cfg).await.unwrap();
    let extra = "rebuild_group = true\nsign_on = \"none\"\nin_link_silence = \"400ms\"";
    let switch = Switch::start(&simplex_config(
        cups.accept_addr(),
        listen,
        &addrs,
        4,
        extra,
    ))
    .await
    .unwrap();
    let svc = service(&switch).clone();
    let links = svc.view().side.out_links().unwrap().clone();
    let connects = || {
        links
            .stats
            .iter()
            .map(|s| s.connects.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    wait_until("4 out links up", || links.up().0 == 4).await;
    assert_eq!(connects(), 4);
    assert_eq!(cups.close_out_links(1), 1);
    wait_until("the whole group rebuilt", || {
        connects() >= 8 && links.up().0 == 4
    })
    .await;

    // An in link of our own that never speaks: closed for silence. (The
    // simulator's in links send keep-alives and stay.)
    let mut mute = tokio::net::TcpStream::connect(listen).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(3), mute.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "closed: {read:?}");
    assert!(links.in_stats.closed_silent.load(Ordering::Relaxed) >= 1);
    switch.stop().await;
    cups.stop().await;
}

/// With `stamp_by = node` the nodes stamp F37 themselves: the switch forwards
/// their requests untouched, routes the responses by the stamp, and counts a
/// request whose stamp does not name its sender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_stamps_are_checked_not_rewritten() {
    let spec = spec("cups");
    // The sample request's F37 is 123456789012: its stamp window (offset 10,
    // width 2) reads "12". Node "12" stamps itself correctly; node "34" sends
    // the same F37, a stamp that is not its own.
    let mut sims = Vec::new();
    for (i, id) in ["12", "34"].iter().enumerate() {
        let mut cfg = NodeSimConfig::new(id);
        cfg.originate = Some(Originate {
            mti: "0200".into(),
            rate: 50.0,
            stan_base: (i as u32 + 1) * 100_000,
            timeout: Duration::from_secs(5),
        });
        sims.push(
            NodeSim::start("127.0.0.1:0".parse().unwrap(), spec.clone(), cfg)
                .await
                .unwrap(),
        );
    }
    let listen = free_addr();
    let mut cups_cfg = cups_sim_config("127.0.0.1:0".parse().unwrap(), listen, None, 3);
    cups_cfg.links = 2;
    let cups = CupsSim::start(spec.clone(), cups_cfg).await.unwrap();
    let toml = format!(
        "[[service]]\nname = \"unionpay\"\nspec = \"cups\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
         [service.front]\nkind = \"simplex\"\nconnect = \"{}\"\nlisten = \"{listen}\"\nlinks = 2\n\
         member_id = \"03105840\"\npeer_id = \"00010000\"\nsign_on_retry = \"200ms\"\nstamp_by = \"node\"\n\
         [service.back]\n[service.back.health]\ncheck = \"echo\"\n\
         [[service.back.node]]\nid = \"12\"\naddress = \"{}\"\n[[service.back.node]]\nid = \"34\"\naddress = \"{}\"\n",
        cups.accept_addr(),
        sims[0].addr,
        sims[1].addr
    );
    // Per-link sign-on: node requests flow only once UnionPay's in links are
    // up to acknowledge it (before that they are declined, not lost).
    let switch = Switch::start(&Config::from_toml(&toml).unwrap())
        .await
        .unwrap();
    let svc = service(&switch).clone();
    wait_until("links signed on", || {
        svc.view().side.out_links().unwrap().up() == (2, 2)
    })
    .await;
    wait_until("both nodes' requests sent through the links", || {
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let (good, bad) = (&sims[0].stats, &sims[1].stats);
        load(&good.originated_answered) >= 10 && load(&bad.originated_answered) >= 10
    })
    .await;
    for n in &sims {
        n.stop_originating();
    }
    wait_until("node requests settled", || {
        sims.iter().all(|n| n.outstanding() == 0)
    })
    .await;
    let (good, bad) = (&sims[0].stats, &sims[1].stats);
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    assert!(
        load(&good.originated_answered) > 0,
        "the correctly stamped node gets its answers"
    );
    assert_eq!(load(&good.originated_unanswered), 0);
    // Node 34's requests were counted as mismatched, and sent as they were
    // (every one of them is counted, sent or declined for want of a link).
    // This instance remembers who sent each, so the answers come back to
    // node 34; an instance that did not send it would route by the stamp.
    let sent_ok = load(&bad.originated) - load(&bad.originated_declined);
    assert!(sent_ok > 0);
    assert_eq!(
        svc.view()
            .counters
            .peer
            .stamp_mismatches
            .load(Ordering::Relaxed),
        load(&bad.originated)
    );
    assert_eq!(load(&bad.originated_answered), sent_ok);
    assert_eq!(load(&good.foreign_responses), 0);
    switch.stop().await;
    cups.stop().await;
}

/// All 8 out links dropped at once by UnionPay, three times, under load both
/// ways, with a UnionPay that refuses any frame on a link before that link's
/// sign-on (and holds its 0830 a little, so a frame written too early is
/// caught): no frame precedes a sign-on on any link, and every request, the
/// nodes' and UnionPay's, is answered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_every_out_link_at_once_sends_nothing_before_sign_on() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let spec = spec("cups");
        let nodes = nodes(&spec, Delay::parse("0..20ms").unwrap(), Some(100.0)).await;
        let listen = free_addr();
        let mut cfg = cups_sim_config("127.0.0.1:0".parse().unwrap(), listen, Some(300.0), 60);
        cfg.require_sign_on = true;
        cfg.sign_on_delay = Duration::from_millis(30);
        let cups = CupsSim::start(spec.clone(), cfg).await.unwrap();
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let switch = Switch::start(&simplex_config(
            cups.accept_addr(),
            listen,
            &addrs,
            LINKS,
            "sign_on_retry = \"300ms\"",
        ))
        .await
        .unwrap();
        let svc = service(&switch).clone();
        wait_links_up(&svc).await;
        for round in 1..=3 {
            // Load both ways before each drop: by the end more than the
            // checks below ask for (500 of UnionPay's, 100 of each node's).
            wait_traffic(&cups, &nodes, round * 200, round * 40).await;
            assert_eq!(cups.close_out_links(LINKS), LINKS);
            wait_until("every out link down or reconnecting", || {
                svc.view().side.out_links().unwrap().up().1 < LINKS
            })
            .await;
            wait_links_up(&svc).await;
        }
        for n in &nodes {
            n.stop_originating();
        }
        cups.stop_originating();
        wait_until("node-originated requests settled", || {
            nodes.iter().all(|n| n.outstanding() == 0)
        })
        .await;
        wait_until("issuer requests settled", || cups.outstanding() == 0).await;
        let report = cups.report();
        assert_eq!(report.unsigned_frames, 0, "frames before sign-on: {report}");
        assert!(report.sign_ons >= 4 * LINKS as u64, "{report}");
        assert!(report.sent > 500, "{report}");
        assert_eq!(report.answered + report.declined, report.sent, "{report}");
        assert_eq!(report.unanswered + report.mismatched, 0, "{report}");
        for (i, n) in nodes.iter().enumerate() {
            let s = &n.stats;
            let sent = s.originated.load(Ordering::Relaxed);
            let answered = s.originated_answered.load(Ordering::Relaxed);
            let declined = s.originated_declined.load(Ordering::Relaxed);
            assert!(sent > 100, "node {i}");
            assert_eq!(answered + declined, sent, "node {i}: exactly once");
            assert_eq!(
                s.originated_unanswered.load(Ordering::Relaxed),
                0,
                "node {i}"
            );
            assert_eq!(s.foreign_responses.load(Ordering::Relaxed), 0, "node {i}");
        }
        let c = &svc.view().counters;
        assert_eq!(c.peer.node_requests_expired.load(Ordering::Relaxed), 0);
        assert_eq!(c.undeliverable.load(Ordering::Relaxed), 0);
        switch.stop().await;
        cups.stop().await;
    })
    .await
    .expect("test within its timeout");
}

/// Issue 39 item 12, in a pair on PostgreSQL: an owed reversal to the peer,
/// sent by one instance, answered (0430 F39 00) by the peer on an in link
/// of the *other* instance, is completed through the shared store by the
/// instance the answer reached, before the sender's next attempt: no 0421.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reversals_0430_on_the_other_instance_completes_it_through_the_store() {
    use isoswitch::store::{Direction, NewSafEntry, SafKeys, SafKind, Store};
    let server = tokio::task::spawn_blocking(store_support::pg::PgServer::shared)
        .await
        .expect("start PostgreSQL");
    tokio::time::timeout(Duration::from_secs(60), async {
        let url = server.fresh_db("wrong_instance").await;
        let spec = spec("cups");
        let nodes = nodes(&spec, Delay::NONE, None).await;
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let mut peers = [HandPeer::start().await, HandPeer::start().await];
        let listens = [free_addr(), free_addr()];
        // The sender's attempt waits 1 s; its next one would be 30 s later.
        let store_toml = format!(
            "[store]\nurl = \"{url}\"\nkey_file = \"{}\"\nca_file = \"{}\"\n\
             [store.saf]\nretry = \"30s\"\nretry_max = \"30s\"\nlease = \"10s\"\n",
            store_support::shared_key_file().display(),
            store_support::pg::ca_of(&url).display()
        );
        let no_sign_on = "sign_on = \"none\"\nsign_on_retry = \"300ms\"";
        let mut switches = Vec::new();
        for (peer, listen) in peers.iter().zip(listens) {
            let toml = format!(
                "{store_toml}{}[service.timeouts]\nrequest = \"3s\"\nby_mti = {{ \"04xx\" = \"1s\" }}\n",
                simplex_toml(peer.addr, listen, &addrs, 2, no_sign_on)
            );
            let config = Config::from_toml(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
            switches.push(Switch::start(&config).await.expect("start a switch"));
        }
        for (peer, listen) in peers.iter_mut().zip(listens) {
            peer.open_in_links(listen, 2).await;
        }
        for sw in &switches {
            let links = service(sw).view().side.out_links().expect("a simplex front").clone();
            wait_until("2 out links signed on and 2 in links up", || {
                links.up() == (2, 2) && links.in_stats.open.load(Ordering::Relaxed) == 2
            })
            .await;
        }
        // What a late approval of a node's request leaves owed: its
        // reversal to the peer.
        let mut original = isoswitch::iso8583::samples::purchase(&spec);
        original.set_text(11, "424242");
        original.set_text(37, "123456789001");
        let reversal =
            isoswitch::route::integrity::reversal(&spec, &original).expect("a reversal");
        let text = |id: u16| {
            reversal
                .get(id)
                .and_then(|v| v.as_text())
                .map(str::to_string)
        };
        let owed = Store::open(&store_support::config(Some(url.clone())), std::path::Path::new("/nonexistent"))
            .await
            .expect("the store");
        let now = isoswitch::store::saf::now_millis();
        let id = owed
            .saf_put(NewSafEntry {
                service: "unionpay".to_string(),
                direction: Direction::ToPeer,
                kind: SafKind::Reversal,
                mti: "0420".to_string(),
                payload: spec.encode(&reversal).expect("encode the reversal"),
                keys: SafKeys {
                    f11: text(11),
                    f37: text(37),
                    f7: text(7),
                    pan_masked: None,
                    original: None,
                },
                created_at: now,
                expires_at: now + 3_600_000,
                first_attempt_at: now,
            })
            .await
            .expect("owe it");
        // Whichever instance claims it sends it on its out link; the peer
        // answers on the other instance's in link.
        let is_0420 = |m: &isoswitch::iso8583::Message| m.mti().digits() == *b"0420";
        let (sender, payload) = {
            let [p0, p1] = &mut peers;
            tokio::select! {
                (_, p) = p0.next_where(&spec, is_0420) => (0, p),
                (_, p) = p1.next_where(&spec, is_0420) => (1, p),
            }
        };
        let other = 1 - sender;
        let request = isoswitch::iso8583::Message::parse(&spec, payload)
            .and_then(|m| m.decode())
            .expect("the 0420");
        let answer = spec
            .encode(&spec.respond(&request, "00").expect("an 0430"))
            .expect("encode the 0430");
        peers[other].send_on(0, &spec, &answer).await;
        let owner_of = |i: usize| {
            service(&switches[i])
                .view().made
                .saf()
                .map(|o| o.owner.clone())
                .expect("a store-and-forward outbox")
        };
        let rows = loop {
            let rows = owed
                .saf_list(isoswitch::store::SafFilter {
                    state: Some(isoswitch::store::SafState::Delivered),
                    service: None,
                    limit: 10,
                })
                .await
                .expect("list");
            if !rows.is_empty() {
                break rows;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].id, id);
        assert_eq!(rows[0].completed_by.as_deref(), Some(owner_of(other).as_str()));
        assert_eq!(rows[0].attempts, 1, "no repeat was needed");
        // The sender's own wait (1 s) runs out; it finds the entry done
        // and sends no 0421. Absence, not a wait: the switch shows no event
        // for a wait that ends in nothing sent.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        for peer in peers.iter_mut() {
            while let Ok((_, p)) = peer.frames.try_recv() {
                let m = isoswitch::iso8583::Message::parse(&spec, p).expect("a frame");
                assert_ne!(m.mti().digits(), *b"0421", "repeated although completed");
            }
        }
        owed.close().await.expect("close");
        for sw in switches {
            sw.stop().await;
        }
    })
    .await
    .expect("test timed out");
}
