//! Records the fixture captures of `fixtures/captures/` with the real switch
//! (capture on, masked) in front of the real simulators:
//!
//!     cargo run --example record_captures -- fixtures/captures
//!
//! Each scenario uses fixed ports on 127.0.0.1 (listed in
//! fixtures/captures/README.md) so the tests know which connections are which.
//! `pos-lossy.pcap` is derived from `pos-nac.pcapng`: segments reordered,
//! retransmitted and split with overlaps, written as classic pcap.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use etherparse::{PacketBuilder, SlicedPacket, TransportSlice};
use futures_util::StreamExt;
use isoswitch::config::Config;
use isoswitch::iso8583::{Spec, samples};
use isoswitch::ops::run::Switch;
use isoswitch::sim::node::{NodeSim, NodeSimConfig, Originate};
use isoswitch::wire::{Frame, FrameCodec};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn spec(name: &str) -> Arc<Spec> {
    Arc::new(Spec::builtin(name).expect("built-in spec"))
}

fn frame(spec: &Spec, payload: &[u8]) -> Vec<u8> {
    let mut out = bytes::BytesMut::new();
    spec.framing()
        .prefix
        .encode(payload.len(), &mut out)
        .expect("fits");
    out.extend_from_slice(payload);
    out.to_vec()
}

fn request(spec: &Spec, mti: &str, tid: &str, stan: u32) -> Vec<u8> {
    let mut d = samples::purchase(spec);
    d.mti = mti.parse().expect("mti");
    d.set_text(11, format!("{stan:06}"));
    if spec.field(41).is_some() {
        d.set_text(41, tid);
    }
    frame(spec, &spec.encode(&d).expect("encodes"))
}

async fn nodes(spec: &Arc<Spec>, ports: &[u16], originate: Option<f64>) -> Vec<NodeSim> {
    let mut out = Vec::new();
    for (i, &p) in ports.iter().enumerate() {
        let mut cfg = NodeSimConfig::new(&format!("{:02}", i + 1));
        cfg.originate = originate.map(|rate| Originate {
            mti: "0200".into(),
            rate,
            stan_base: (i as u32 + 1) * 100_000,
            timeout: Duration::from_secs(5),
        });
        out.push(
            NodeSim::start(addr(p), Arc::clone(spec), cfg)
                .await
                .unwrap_or_else(|e| panic!("node on {p}: {e}")),
        );
    }
    out
}

fn node_toml(ports: &[u16]) -> String {
    ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "[[service.back.node]]\nid = \"{:02}\"\naddress = \"127.0.0.1:{p}\"\n",
                i + 1
            )
        })
        .collect()
}

/// Runs `traffic` against a switch started from `toml` with capture into a
/// scratch directory, then moves the one capture file to `out`.
async fn record<F, Fut>(toml: String, out: &Path, traffic: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let scratch = std::env::temp_dir().join(format!("isoswitch-record-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let toml = format!(
        "{toml}[service.capture]\ndirectory = \"{}\"\n",
        scratch.display()
    );
    let cfg = Config::from_toml(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    let switch = Switch::start(&cfg).await.expect("switch starts");
    tokio::time::sleep(Duration::from_millis(500)).await;
    traffic().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    switch.stop_within(Duration::from_secs(2)).await;
    let files: Vec<PathBuf> = std::fs::read_dir(&scratch)
        .expect("capture directory")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(files.len(), 1, "one capture file");
    std::fs::copy(&files[0], out).expect("copy");
    let _ = std::fs::remove_dir_all(&scratch);
    println!("wrote {}", out.display());
}

/// Reads answers off a connection until `n` arrived (or 5 s).
async fn answers(read: tokio::net::tcp::OwnedReadHalf, spec: &Spec, n: usize) {
    let mut frames = tokio_util::codec::FramedRead::new(
        read,
        FrameCodec::new(spec.framing().prefix, spec.framing().max_frame),
    );
    let mut got = 0;
    while got < n {
        match tokio::time::timeout(Duration::from_secs(5), frames.next()).await {
            Ok(Some(Ok(Frame::Message(_)))) => got += 1,
            Ok(Some(Ok(_))) => {}
            _ => break,
        }
    }
    assert_eq!(got, n, "every request answered");
}

/// POS: two NAC uplinks, three terminals, keep-alives, one frame in two writes.
async fn pos(out: &Path) {
    let spec = spec("cup-pos");
    let _nodes = nodes(&spec, &[26001, 26002], None).await;
    let toml = format!(
        "[[service]]\nname = \"pos\"\nspec = \"cup-pos\"\n[service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:26000\"\n\
         [service.back]\nconnections_per_node = 1\n[service.back.health]\ncheck = \"tcp\"\n{}",
        node_toml(&[26001, 26002])
    );
    let s = Arc::clone(&spec);
    record(toml, out, || async move {
        let mut tasks = Vec::new();
        for (uplink, terminals) in [(0u32, vec!["10000001", "10000002"]), (1, vec!["10000003"])] {
            let spec = Arc::clone(&s);
            tasks.push(tokio::spawn(async move {
                let stream = TcpStream::connect(addr(26000)).await.expect("connect");
                stream.set_nodelay(true).expect("nodelay");
                let (read, mut write) = stream.into_split();
                let n = terminals.len() * 3;
                let reader = tokio::spawn({
                    let spec = Arc::clone(&spec);
                    async move { answers(read, &spec, n).await }
                });
                let mut stan = uplink * 1000;
                for round in 0..3 {
                    for tid in &terminals {
                        stan += 1;
                        let f = request(&spec, "0200", tid, stan);
                        if uplink == 0 && round == 1 {
                            // One frame over two segments.
                            write.write_all(&f[..25]).await.expect("write");
                            tokio::time::sleep(Duration::from_millis(30)).await;
                            write.write_all(&f[25..]).await.expect("write");
                        } else {
                            write.write_all(&f).await.expect("write");
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    write.write_all(&[0, 0]).await.expect("keep-alive");
                }
                reader.await.expect("reader");
            }));
        }
        for t in tasks {
            t.await.expect("uplink");
        }
    })
    .await;
}

/// ATM: short connections, one request each.
async fn atm(out: &Path) {
    let spec = spec("iso87ascii");
    let _nodes = nodes(&spec, &[26101], None).await;
    let toml = format!(
        "[[service]]\nname = \"atm\"\nspec = \"iso87ascii\"\n[service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:26100\"\n\
         [service.back]\nconnections_per_node = 1\n[service.back.health]\ncheck = \"tcp\"\n{}",
        node_toml(&[26101])
    );
    let s = Arc::clone(&spec);
    record(toml, out, || async move {
        for i in 0..5u32 {
            let stream = TcpStream::connect(addr(26100)).await.expect("connect");
            let (read, mut write) = stream.into_split();
            let tid = format!("ATM0000{}", i % 2 + 1);
            write
                .write_all(&request(&s, "0200", &tid, 500 + i))
                .await
                .expect("write");
            answers(read, &s, 1).await;
            drop(write);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// UnionPay: 8 out / 8 in links, sign-on and echo per link, UnionPay's own
/// requests and the nodes' acquirer requests.
async fn unionpay(out: &Path) {
    let spec = spec("cups");
    let _nodes = nodes(&spec, &[26201, 26202], Some(10.0)).await;
    let toml = format!(
        "[[service]]\nname = \"unionpay\"\nspec = \"cups\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
         [service.front]\nkind = \"simplex\"\nconnect = \"127.0.0.1:26290\"\nlisten = \"127.0.0.1:26291\"\nlinks = 8\n\
         member_id = \"03105840\"\npeer_id = \"00010000\"\nkeepalive_idle = \"500ms\"\necho_interval = \"1s\"\n\
         sign_on = \"none\"\nreconnect_min = \"20ms\"\nreconnect_max = \"200ms\"\n\
         [service.back]\nconnections_per_node = 1\n[service.back.health]\ncheck = \"tcp\"\n{}",
        node_toml(&[26201, 26202])
    );
    let s = Arc::clone(&spec);
    // UnionPay listens for the out links before the switch starts.
    let mut cfg = isoswitch::sim::cups::CupsSimConfig::new(addr(26290), addr(26291), 8);
    cfg.rate = Some(10.0);
    cfg.duration = Duration::from_secs(2);
    cfg.timeout = Duration::from_secs(3);
    cfg.keepalive_idle = Duration::from_millis(500);
    let sim = tokio::spawn(isoswitch::sim::cups::run(s, cfg));
    record(toml, out, || async move {
        let report = sim.await.expect("sim task").expect("sim runs");
        println!("unionpay sim: {report}");
    })
    .await;
}

/// VISA: the switch connects two duplex links to VISA; VISA answers the
/// nodes' requests and sends its own.
async fn visa(out: &Path) {
    let spec = spec("visa-base1");
    let _nodes = nodes(&spec, &[26301, 26302], Some(10.0)).await;
    let listener = TcpListener::bind(addr(26390)).await.expect("visa listens");
    let toml = format!(
        "[[service]]\nname = \"visa\"\nspec = \"visa-base1\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
         [service.front]\nkind = \"connect\"\nconnect = \"127.0.0.1:26390\"\nlinks = 2\nkeepalive_idle = \"500ms\"\nsign_on = \"none\"\n\
         [service.back]\nconnections_per_node = 1\n[service.back.health]\ncheck = \"tcp\"\n{}",
        node_toml(&[26301, 26302])
    );
    let s = Arc::clone(&spec);
    record(toml, out, || async move {
        let mut links = Vec::new();
        for _ in 0..2 {
            let (stream, _) = tokio::time::timeout(Duration::from_secs(5), listener.accept())
                .await
                .expect("the switch connects")
                .expect("accept");
            links.push(stream);
        }
        let mut tasks = Vec::new();
        for (i, link) in links.into_iter().enumerate() {
            let spec = Arc::clone(&s);
            tasks.push(tokio::spawn(visa_link(spec, link, i as u32)));
        }
        for t in tasks {
            t.await.expect("visa link");
        }
    })
    .await;
}

/// One VISA link for 2 s: answers every request "00", sends 5 of its own.
async fn visa_link(spec: Arc<Spec>, link: TcpStream, n: u32) {
    let (read, mut write) = link.into_split();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let answer_spec = Arc::clone(&spec);
    let reader = tokio::spawn(async move {
        let mut frames = tokio_util::codec::FramedRead::new(
            read,
            FrameCodec::new(
                answer_spec.framing().prefix,
                answer_spec.framing().max_frame,
            ),
        );
        while let Some(Ok(f)) = frames.next().await {
            let Frame::Message(p) = f else { continue };
            let Ok(d) = answer_spec.decode(&p) else {
                continue;
            };
            if d.mti.is_request()
                && let Ok(r) = answer_spec.respond(&d, "00")
                && let Ok(w) = answer_spec.encode(&r)
            {
                let _ = tx.send(frame(&answer_spec, &w));
            }
        }
    });
    let end = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut stan = 900_000 + n * 1000;
    let mut tick = tokio::time::interval(Duration::from_millis(300));
    while tokio::time::Instant::now() < end {
        tokio::select! {
            Some(f) = rx.recv() => { let _ = write.write_all(&f).await; }
            _ = tick.tick() => {
                stan += 1;
                let _ = write.write_all(&request(&spec, "0100", "VISA0001", stan)).await;
            }
        }
    }
    reader.abort();
}

/// `pos-lossy.pcap`: the POS capture with its client-to-switch data segments
/// disturbed: pairs swapped, every third one sent again, every fourth split
/// in two overlapping halves. Classic pcap, microseconds.
fn lossy(from: &Path, out: &Path) {
    use pcap_file::pcap::{PcapPacket, PcapWriter};
    use pcap_file::pcapng::{PcapNgReader, blocks::Block};
    let data = std::fs::read(from).expect("pos capture");
    let mut reader = PcapNgReader::new(&data[..]).expect("pcapng");
    let mut packets: Vec<(Duration, Vec<u8>)> = Vec::new();
    while let Some(b) = reader.next_block() {
        if let Block::EnhancedPacket(p) = b.expect("block") {
            packets.push((p.timestamp, p.data.into_owned()));
        }
    }
    let mut disturbed = Vec::new();
    let mut held: Option<(Duration, Vec<u8>)> = None;
    let mut n = 0;
    for (at, p) in packets {
        let is_client_data = SlicedPacket::from_ethernet(&p)
            .ok()
            .and_then(|s| match s.transport {
                Some(TransportSlice::Tcp(t)) => {
                    Some(t.destination_port() == 26000 && !t.payload().is_empty())
                }
                _ => None,
            })
            == Some(true);
        if !is_client_data {
            disturbed.push((at, p));
            continue;
        }
        n += 1;
        let mut these = vec![(at, p.clone())];
        if n % 4 == 0 {
            these = split_overlapping(&p).into_iter().map(|q| (at, q)).collect();
        }
        if n % 3 == 0 {
            these.push((at, p.clone()));
        }
        if n % 5 == 1 {
            // Hold this one back: it goes out after the next.
            held = Some((at, p));
            continue;
        }
        disturbed.extend(these);
        if let Some(h) = held.take() {
            disturbed.push(h);
        }
    }
    if let Some(h) = held.take() {
        disturbed.push(h);
    }
    let file = std::fs::File::create(out).expect("create");
    let mut w = PcapWriter::new(file).expect("pcap header");
    for (at, p) in disturbed {
        // Microseconds: pcap-file hands pcapng timestamps over as nanoseconds.
        let at = Duration::from_micros((at.as_nanos() / 1000) as u64);
        w.write_packet(&PcapPacket::new(at, p.len() as u32, &p))
            .expect("packet");
    }
    println!("wrote {}", out.display());
}

/// A data packet as two: the first 2/3 of the payload, then from 1/3 to the end.
fn split_overlapping(p: &[u8]) -> Vec<Vec<u8>> {
    let Ok(s) = SlicedPacket::from_ethernet(p) else {
        return vec![p.to_vec()];
    };
    let (Some(etherparse::NetSlice::Ipv4(ip)), Some(TransportSlice::Tcp(t))) = (s.net, s.transport)
    else {
        return vec![p.to_vec()];
    };
    let payload = t.payload();
    let (a, b) = (payload.len() * 2 / 3, payload.len() / 3);
    let build = |from: usize, to: usize| {
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4(ip.header().source(), ip.header().destination(), 64)
            .tcp(
                t.source_port(),
                t.destination_port(),
                t.sequence_number().wrapping_add(from as u32),
                65535,
            )
            .psh()
            .ack(t.acknowledgment_number());
        let mut v = Vec::new();
        b.write(&mut v, &payload[from..to]).expect("packet");
        v
    };
    vec![build(0, a), build(b, payload.len())]
}

#[tokio::main]
async fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("ISOSWITCH_LOG"))
        .try_init();
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "fixtures/captures".into()),
    );
    std::fs::create_dir_all(&dir).expect("output directory");
    pos(&dir.join("pos-nac.pcapng")).await;
    atm(&dir.join("atm-short.pcapng")).await;
    unionpay(&dir.join("unionpay.pcapng")).await;
    visa(&dir.join("visa.pcapng")).await;
    lossy(&dir.join("pos-nac.pcapng"), &dir.join("pos-lossy.pcap"));
}
