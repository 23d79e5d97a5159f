//! The descriptor budget, on the real binary under a real open-file limit:
//! `isoswitch run` started by `sh -c 'ulimit -n 64; exec isoswitch run ...'`
//! (soft and hard limit 64: `run` cannot raise it), 100 clients knocking,
//! and a node killed and restarted. Clients past the budget are refused at
//! once; the node gets its connections back; the clients already in keep
//! getting an answer to every request.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use isoswitch::iso8583::{Message, Spec, samples};
use isoswitch::sim::node::{Delay, NodeSim, NodeSimConfig};
use isoswitch::wire::{Frame, FrameCodec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio_util::codec::Decoder;

const BIN: &str = env!("CARGO_BIN_EXE_isoswitch");
const SPEC: &str = "iso87ascii";
const OPEN_FILE_LIMIT: u32 = 64;
const CLIENTS: usize = 100;

fn spec() -> Arc<Spec> {
    Arc::new(Spec::builtin(SPEC).expect("builtin spec"))
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

fn tmp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("descriptors-{name}-{}", std::process::id()))
}

async fn node(addr: SocketAddr, id: &str) -> NodeSim {
    let mut cfg = NodeSimConfig::new(id);
    cfg.delay = Delay::NONE;
    NodeSim::start(addr, spec(), cfg)
        .await
        .expect("node starts")
}

/// The switch under `ulimit -n LIMIT` (soft and hard), killed when dropped.
struct Switch {
    child: Child,
    log: PathBuf,
}

impl Switch {
    fn spawn(name: &str, config: &str, limit: u32) -> Switch {
        let path = tmp(&format!("{name}.toml"));
        std::fs::write(&path, config).expect("write config");
        let log = tmp(&format!("{name}.log"));
        let stderr = std::fs::File::create(&log).expect("log file");
        // Its own data dir: two switches cannot share one (it is locked).
        let data_dir = tmp(&format!("{name}.data"));
        let _ = std::fs::remove_dir_all(&data_dir);
        let script =
            format!("ulimit -n {limit} && exec \"$0\" run --config \"$1\" --data-dir \"$2\"");
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(BIN)
            .arg(&path)
            .arg(&data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run sh (needed for ulimit): {e}"));
        Switch { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn wait_logged(&mut self, line: &str) {
        self.wait_log(|log| log.contains(line)).await;
    }

    /// Until the log (stderr) so far satisfies `done`.
    async fn wait_log(&mut self, done: impl Fn(&str) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if done(&self.log()) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the switch exited ({status}):\n{}", self.log());
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the switch's log never had what was waited for in 60 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Until `held` live connections reach the node.
async fn wait_held(node: &NodeSim, held: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let now = node.stats.held.load(Ordering::Relaxed);
        if now == held {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{now} connections held at the node, never {held} in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A client link: one request at a time, each waiting for its answer.
struct Client {
    stream: TcpStream,
    codec: FrameCodec,
    buf: bytes::BytesMut,
    terminal: usize,
    stan: u32,
}

/// What a client's first request got.
enum First {
    /// Answered, with this F39.
    Answered(Client, String),
    /// Closed by the switch: refused.
    Refused,
    /// Neither: stuck in the accept queue of a switch out of descriptors.
    LeftWaiting,
}

impl Client {
    async fn connect(addr: SocketAddr, terminal: usize, spec: &Spec) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect");
        Client {
            stream,
            codec: FrameCodec::new(spec.framing().prefix, spec.framing().max_frame),
            buf: bytes::BytesMut::new(),
            terminal,
            stan: 0,
        }
    }

    /// Sends a purchase and reads its answer's F39; `None` when the switch
    /// closed the link instead.
    async fn round_trip(&mut self, spec: &Spec) -> Option<String> {
        self.stan += 1;
        let mut d = samples::purchase(spec);
        // F7 + F11 + F32 + F33 tie an answer to its request here: the STAN
        // alone keeps every client's requests apart.
        d.set_text(
            11,
            format!("{:06}", self.terminal as u32 * 10_000 + self.stan),
        );
        d.set_text(41, format!("{:08}", self.terminal));
        let payload = spec.encode(&d).expect("encode");
        let mut frame = bytes::BytesMut::new();
        spec.framing()
            .prefix
            .encode(payload.len(), &mut frame)
            .expect("prefix");
        frame.extend_from_slice(&payload);
        // A refused client may find the link closed already.
        self.stream.write_all(&frame).await.ok()?;
        loop {
            if let Ok(Some(Frame::Message(answer))) = self.codec.decode(&mut self.buf) {
                let answer = Message::parse(spec, answer).expect("an answer that parses");
                let f39 = answer.field(39).ok().flatten().expect("F39");
                return Some(f39.show().to_string());
            }
            match self.stream.read_buf(&mut self.buf).await {
                Ok(n) if n > 0 => {}
                _ => return None,
            }
        }
    }

    /// The first request: answered, or the link closed by the switch, within
    /// a bound that only a client left waiting in the accept queue reaches.
    async fn first(mut self, spec: &Spec) -> First {
        match tokio::time::timeout(Duration::from_secs(10), self.round_trip(spec)).await {
            Ok(Some(f39)) => First::Answered(self, f39),
            Ok(None) => First::Refused,
            Err(_) => First::LeftWaiting,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_cannot_take_the_descriptors_a_restarted_node_needs() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let spec = spec();
        let (a1, a2) = (free_addr(), free_addr());
        let node1 = node(a1, "01").await;
        let mut node2 = node(a2, "02").await;
        let front = free_addr();
        let config = format!(
            "[[service]]\nname = \"atm\"\nspec = \"{SPEC}\"\n\
             [service.front]\nkind = \"listen\"\nlisten = \"{front}\"\nmax_per_source = 1000\n\
             [service.back]\nconnections_per_node = 2\nreconnect_min = \"50ms\"\nreconnect_max = \"500ms\"\n\
             [service.back.health]\ninterval = \"1s\"\n\
             [[service.back.node]]\nid = \"01\"\naddress = \"{a1}\"\n\
             [[service.back.node]]\nid = \"02\"\naddress = \"{a2}\"\n"
        );
        let mut switch = Switch::spawn("restart", &config, OPEN_FILE_LIMIT);
        switch.wait_logged("service started").await;
        wait_held(&node1, 2).await;
        wait_held(&node2, 2).await;

        // 100 clients at once: those past the budget are closed at once.
        let mut knocking = tokio::task::JoinSet::new();
        for terminal in 0..CLIENTS {
            let spec = Arc::clone(&spec);
            knocking.spawn(async move {
                Client::connect(front, terminal, &spec)
                    .await
                    .first(&spec)
                    .await
            });
        }
        let (mut served, mut waiting) = (Vec::new(), 0);
        while let Some(first) = knocking.join_next().await {
            match first.expect("client task") {
                First::Answered(c, f39) => {
                    assert_eq!(f39, "00", "approved by a node");
                    served.push(c);
                }
                First::Refused => {}
                First::LeftWaiting => waiting += 1,
            }
        }
        assert_eq!(
            waiting, 0,
            "clients neither served nor refused (the switch ran out of descriptors)"
        );
        assert!(!served.is_empty(), "some clients are served:\n{}", switch.log());
        assert!(
            served.len() < CLIENTS,
            "under a limit of {OPEN_FILE_LIMIT} the budget refuses some of {CLIENTS}"
        );
        assert!(
            switch.log().contains("the clients' share of the open-file limit is in use"),
            "refusals are logged with their reason:\n{}",
            switch.log()
        );

        // The served clients keep sending while node 02 dies and comes back.
        let stop = Arc::new(AtomicBool::new(false));
        let (sent, answered) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut talking = tokio::task::JoinSet::new();
        for mut c in served {
            let (spec, stop) = (Arc::clone(&spec), Arc::clone(&stop));
            let (sent, answered) = (Arc::clone(&sent), Arc::clone(&answered));
            talking.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    sent.fetch_add(1, Ordering::Relaxed);
                    if c.round_trip(&spec).await.is_none() {
                        return;
                    }
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        node2.stop().await;
        node2 = node(a2, "02").await;
        // Within a health-check round (reconnects back off to 500 ms at most).
        wait_held(&node2, 2).await;
        // A few more rounds for every client after the restart.
        let after = sent.load(Ordering::Relaxed);
        while sent.load(Ordering::Relaxed) < after + 3 * talking.len() as u64 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.store(true, Ordering::Relaxed);
        while let Some(done) = talking.join_next().await {
            done.expect("client task");
        }
        assert_eq!(
            answered.load(Ordering::Relaxed),
            sent.load(Ordering::Relaxed),
            "every request of a served client is answered:\n{}",
            switch.log()
        );
        node1.stop().await;
        node2.stop().await;
    })
    .await
    .expect("test timed out");
}

/// A peer that keeps opening in links it may not have (not in `allow`) gets
/// each one closed and counted, but the log says so a few times a second and
/// sums up the rest, instead of a line per attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_in_links_do_not_flood_the_log() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let nodes = free_addr();
        let _node = node(nodes, "01").await;
        let (peer, listen) = (free_addr(), free_addr());
        let config = format!(
            "[[service]]\nname = \"up\"\nspec = \"cups\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
             [service.front]\nkind = \"simplex\"\nconnect = \"{peer}\"\nlisten = \"{listen}\"\n\
             links = 1\nmember_id = \"00010000\"\npeer_id = \"03105840\"\nallow = [\"10.0.0.0/8\"]\n\
             [[service.back.node]]\nid = \"01\"\naddress = \"{nodes}\"\n"
        );
        let mut switch = Switch::spawn("in-links", &config, 1024);
        switch.wait_logged("service started").await;
        const ATTEMPTS: usize = 100;
        for _ in 0..ATTEMPTS {
            let mut link = TcpStream::connect(listen).await.expect("connect");
            // Closed at once by the switch.
            let mut byte = [0u8; 1];
            let _ = link.read(&mut byte).await;
        }
        // The sum of what was left out, or (unlimited) a line per attempt.
        switch
            .wait_log(|log| {
                log.contains("suppressed") || log.matches("in link refused").count() >= ATTEMPTS
            })
            .await;
        let lines = switch.log().matches("in link refused").count();
        assert!(
            lines < ATTEMPTS / 2,
            "{lines} lines for {ATTEMPTS} refused links:\n{}",
            switch.log()
        );
    })
    .await
    .expect("test timed out");
}
