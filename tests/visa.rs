//! End-to-end: VISA-style duplex links the switch connects to the peer, where
//! both directions share every link and the peer may answer on any of them.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures_util::StreamExt;
use isoswitch::iso8583::{Message, Spec};
use isoswitch::ops::config::Config;
use isoswitch::ops::run::Switch;
use isoswitch::sim::node::{Delay, NodeSim, NodeSimConfig, Originate};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// The peer: accepts the switch's duplex links; the test reads what arrives
/// (with the link it came on) and writes on any link it likes.
struct Peer {
    addr: SocketAddr,
    frames: mpsc::UnboundedReceiver<(usize, Bytes)>,
    links: mpsc::UnboundedReceiver<tokio::net::tcp::OwnedWriteHalf>,
    writers: Vec<tokio::net::tcp::OwnedWriteHalf>,
}

impl Peer {
    async fn start(spec: Arc<Spec>) -> Peer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (frames_tx, frames) = mpsc::unbounded_channel();
        let (links_tx, links) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut id = 0;
            while let Ok((stream, _)) = listener.accept().await {
                let (read, write) = stream.into_split();
                let _ = links_tx.send(write);
                let (tx, spec) = (frames_tx.clone(), spec.clone());
                let link = id;
                id += 1;
                tokio::spawn(async move {
                    let codec = isoswitch::wire::FrameCodec::new(
                        spec.framing().prefix,
                        spec.framing().max_frame,
                    );
                    let mut frames = tokio_util::codec::FramedRead::new(read, codec);
                    while let Some(Ok(frame)) = frames.next().await {
                        if let isoswitch::wire::Frame::Message(p) = frame {
                            let _ = tx.send((link, p));
                        }
                    }
                });
            }
        });
        Peer {
            addr,
            frames,
            links,
            writers: Vec::new(),
        }
    }

    async fn wait_links(&mut self, n: usize) {
        while self.writers.len() < n {
            let w = tokio::time::timeout(Duration::from_secs(5), self.links.recv()).await;
            self.writers
                .push(w.expect("the switch connects").expect("peer up"));
        }
    }

    async fn send_on(&mut self, link: usize, spec: &Spec, payload: &[u8]) {
        self.writers[link]
            .write_all(&RawClient::frame(spec, payload))
            .await
            .unwrap();
    }
}

/// Node-originated requests leave on any link with the node's ID stamped in
/// EBCDIC F37 and come back to their node whichever link the answer takes;
/// the peer's own requests are balanced over the nodes and answered once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplex_links_route_both_ways() {
    let spec = spec("visa-base1");
    let mut peer = Peer::start(spec.clone()).await;
    let mut nodes = Vec::new();
    for i in 0..3u32 {
        let mut cfg = NodeSimConfig::new(&format!("{:02}", i + 1));
        cfg.delay = Delay::parse("0..10ms").unwrap();
        cfg.originate = Some(Originate {
            mti: "0200".into(),
            rate: 40.0,
            stan_base: (i + 1) * 100_000,
            timeout: Duration::from_secs(5),
        });
        nodes.push(
            NodeSim::start("127.0.0.1:0".parse().unwrap(), spec.clone(), cfg)
                .await
                .unwrap(),
        );
    }
    let mut toml = format!(
        "[[service]]\nname = \"visa\"\nspec = \"visa-base1\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
         [service.front]\nkind = \"connect\"\nconnect = \"{}\"\nlinks = 2\nkeepalive_idle = \"200ms\"\n\
         [service.back]\n[service.back.health]\ncheck = \"tcp\"\n",
        peer.addr
    );
    for (i, n) in nodes.iter().enumerate() {
        toml.push_str(&format!(
            "[[service.back.node]]\nid = \"{:02}\"\naddress = \"{}\"\n",
            i + 1,
            n.addr
        ));
    }
    let switch = Switch::start(&Config::from_toml(&toml).unwrap())
        .await
        .unwrap();
    let svc = service(&switch).clone();
    peer.wait_links(2).await;

    // The peer's own requests: 0100s with their own STANs, all on link 0.
    let mut issuer = isoswitch::iso8583::samples::purchase(&spec);
    issuer.mti = "0100".parse().unwrap();
    let mut our_stans = std::collections::BTreeSet::new();
    let ebcdic = isoswitch::iso8583::ebcdic::from_ascii;
    let (mut answered, mut stamped_ok, mut member_requests) = (0, 0, 0);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
    let mut next_issuer = 0u32;
    while tokio::time::Instant::now() < deadline || !our_stans.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline + Duration::from_secs(5),
            "answers missing: {our_stans:?}"
        );
        if tokio::time::Instant::now() < deadline && next_issuer < 60 {
            next_issuer += 1;
            let stan = 500_000 + next_issuer;
            issuer.set_text(11, format!("{stan:06}"));
            peer.send_on(0, &spec, &spec.encode(&issuer).unwrap()).await;
            our_stans.insert(stan);
        }
        let Ok(Some((link, p))) =
            tokio::time::timeout(Duration::from_millis(20), peer.frames.recv()).await
        else {
            continue;
        };
        let m = Message::parse(&spec, p).unwrap();
        match m.mti().as_str() {
            "0200" => {
                // A node's request: answer it on the other link.
                member_requests += 1;
                let f37 = m.field(37).unwrap().unwrap().data().to_vec();
                if [b'0', b'1', b'2', b'3']
                    .iter()
                    .any(|d| f37[10..12] == [ebcdic(b'0'), ebcdic(*d)])
                {
                    stamped_ok += 1;
                }
                let resp = isoswitch::link::decline::respond(&spec, &m, "00").unwrap();
                peer.send_on(1 - link, &spec, &resp).await;
            }
            "0110" => {
                let stan: u32 = m
                    .field(11)
                    .unwrap()
                    .unwrap()
                    .show()
                    .to_string()
                    .parse()
                    .unwrap();
                assert!(
                    our_stans.remove(&stan),
                    "one answer per request, STAN {stan}"
                );
                answered += 1;
            }
            other => panic!("unexpected {other} from the switch"),
        }
    }
    assert_eq!(answered, 60);
    assert!(member_requests > 0);
    assert_eq!(
        stamped_ok, member_requests,
        "every node request stamped with a node ID in EBCDIC"
    );
    for n in &nodes {
        n.stop_originating();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Answer what is still arriving until every node has its answers.
    let settle = tokio::time::Instant::now() + Duration::from_secs(5);
    while nodes.iter().any(|n| n.outstanding() > 0) {
        assert!(tokio::time::Instant::now() < settle, "nodes still waiting");
        while let Ok((link, p)) = peer.frames.try_recv() {
            let m = Message::parse(&spec, p).unwrap();
            if m.mti().as_str() == "0200" {
                let resp = isoswitch::link::decline::respond(&spec, &m, "00").unwrap();
                peer.send_on(1 - link, &spec, &resp).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
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
        assert!(
            s.requests.load(Ordering::Relaxed) > 0,
            "node {i} got some of the peer's requests"
        );
    }
    assert_eq!(svc.counters.unroutable_responses.load(Ordering::Relaxed), 0);
    switch.stop().await;
}

/// With `sign_on = "per-link"` on a connect front, a duplex link carries
/// nothing but its 0800 sign-on until the peer's 0810 to it: the answer to a
/// request the peer sent before any sign-on was confirmed waits, then leaves
/// on the one link the peer signed on, never on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplex_link_carries_nothing_before_its_sign_on() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let spec = spec("visa-base1");
        let mut peer = Peer::start(spec.clone()).await;
        let node = NodeSim::start(
            "127.0.0.1:0".parse().unwrap(),
            spec.clone(),
            NodeSimConfig::new("01"),
        )
        .await
        .unwrap();
        let toml = format!(
            "[[service]]\nname = \"visa\"\nspec = \"visa-base1\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
             [service.front]\nkind = \"connect\"\nconnect = \"{}\"\nlinks = 2\nkeepalive_idle = \"100ms\"\n\
             sign_on = \"per-link\"\nsign_on_retry = \"10s\"\n\
             [service.back]\n[service.back.health]\ncheck = \"tcp\"\n\
             [[service.back.node]]\nid = \"01\"\naddress = \"{}\"\n",
            peer.addr, node.addr
        );
        let switch = Switch::start(&Config::from_toml(&toml).unwrap())
            .await
            .unwrap();
        let svc = service(&switch).clone();
        wait_until("a node connection up", || svc.pool.nodes()[0].live_conns() > 0).await;
        peer.wait_links(2).await;
        let mut sign_ons = HashMapOf::new();
        while sign_ons.len() < 2 {
            let (link, p) = next_frame(&mut peer).await;
            let m = Message::parse(&spec, p).unwrap();
            assert_eq!(m.mti().as_str(), "0800", "link {link}: only its sign-on");
            sign_ons.insert(link, m.decode().unwrap());
        }
        let mut request = isoswitch::iso8583::samples::purchase(&spec);
        request.mti = "0100".parse().unwrap();
        peer.send_on(0, &spec, &spec.encode(&request).unwrap()).await;
        let links = svc.out_links.as_ref().unwrap().clone();
        wait_until("the node's answer waits for a signed-on link", || {
            links.waiting() == 1
        })
        .await;
        // The peer confirms link 1's sign-on only.
        let ack = spec.encode(&spec.respond(&sign_ons[&1], "00").unwrap()).unwrap();
        peer.send_on(0, &spec, &ack).await;
        let (link, p) = next_frame(&mut peer).await;
        let m = Message::parse(&spec, p).unwrap();
        assert_eq!((link, m.mti().as_str()), (1, "0110"), "on the signed-on link");
        assert_eq!(links.up(), (2, 1));
        tokio::time::sleep(Duration::from_millis(300)).await;
        while let Ok((link, p)) = peer.frames.try_recv() {
            let m = Message::parse(&spec, p).unwrap();
            assert!(
                link == 1 || m.mti().as_str() == "0800",
                "link 0 is not signed on: {}",
                m.mti()
            );
        }
        switch.stop().await;
    })
    .await
    .expect("test within its timeout");
}

type HashMapOf = std::collections::HashMap<usize, isoswitch::iso8583::Decoded>;

async fn next_frame(peer: &mut Peer) -> (usize, Bytes) {
    tokio::time::timeout(Duration::from_secs(5), peer.frames.recv())
        .await
        .expect("a frame in time")
        .expect("peer up")
}
