//! End-to-end: the sign-on gate on a `connect` front's duplex links, against
//! a peer played by hand so that the test decides exactly which sign-on is
//! confirmed and when.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures_util::StreamExt;
use isoswitch::config::Config;
use isoswitch::iso8583::{Message, Spec};
use isoswitch::ops::run::Switch;
use isoswitch::sim::node::{NodeSim, NodeSimConfig};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// A VISA-side peer by hand: accepts the switch's links, hands every frame
/// read (with its link number) to the test, writes what the test says.
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
        wait_until("a node connection up", || svc.view().pool.nodes()[0].live_conns() > 0).await;
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
        let links = svc.view().side.out_links().unwrap().clone();
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
        // Absence, not a wait: nothing but a sign-on may come on link 0
        // within this window.
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
