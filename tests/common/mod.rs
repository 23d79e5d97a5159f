//! Shared harness for end-to-end tests: real simulated nodes and a real switch
//! on 127.0.0.1, each test on its own ports (port 0).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use isoswitch::config::Config;
use isoswitch::iso8583::Spec;
use isoswitch::link::Service;
use isoswitch::ops::run::Switch;
use isoswitch::sim::node::{Delay, NodeSim, NodeSimConfig};

/// A directory of this test process's own under the target's temp dir (for
/// config files and the data directories of switch processes), fresh, removed
/// when dropped.
pub struct Scratch(std::path::PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("scratch dir");
        Scratch(path)
    }

    pub fn join(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An address on 127.0.0.1 that was free a moment ago (for a listener a
/// test starts later, or one that must refuse).
/// Writes a secret (a token, a key): the owner's alone, as the switch
/// wants it.
pub fn write_secret(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write the secret");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
}

pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// An address where a connection is refused for as long as the returned
/// socket lives: bound, never listening (a port only found free can be
/// taken by another test's listener meanwhile).
pub fn dead_addr() -> (SocketAddr, tokio::net::TcpSocket) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("a port to hold");
    let addr = socket.local_addr().expect("its address");
    (addr, socket)
}

pub fn spec(name: &str) -> Arc<Spec> {
    Arc::new(Spec::builtin(name).expect("builtin spec"))
}

pub async fn start_nodes(spec: &Arc<Spec>, n: usize, delay: Delay) -> Vec<NodeSim> {
    let mut nodes = Vec::new();
    for i in 0..n {
        let cfg = NodeSimConfig {
            id: format!("{:02}", i + 1),
            delay,
            fail_rate: 0.0,
            originate: None,
        };
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        nodes.push(
            NodeSim::start(addr, Arc::clone(spec), cfg)
                .await
                .expect("node starts"),
        );
    }
    nodes
}

/// A test rig said by name, not by position: a listen service `svc` on a
/// builtin spec in front of simulated nodes, with whatever else the test
/// needs as TOML lines under the table they belong to.
///
/// ```ignore
/// let (nodes, switch) = Rig::on("cups")
///     .nodes(2)
///     .delay("400ms")
///     .back("[service.back.health]\ncheck = \"tcp\"")
///     .service("[service.timeouts]\nrequest = \"150ms\"")
///     .start()
///     .await;
/// ```
#[derive(Clone, Debug)]
pub struct Rig {
    spec: String,
    nodes: usize,
    delay: Delay,
    /// Lines of the `[[service]]` table itself (keys such as `f37_stamp`,
    /// and sub-tables such as `[service.timeouts]`).
    service: String,
    /// Lines of `[service.front]`.
    front: String,
    /// Lines of `[service.back]` (and its sub-tables).
    back: String,
}

impl Rig {
    /// One node answering at once, no extra settings.
    pub fn on(spec: &str) -> Rig {
        Rig {
            spec: spec.to_string(),
            nodes: 1,
            delay: Delay::NONE,
            service: String::new(),
            front: String::new(),
            back: String::new(),
        }
    }

    pub fn nodes(mut self, n: usize) -> Rig {
        self.nodes = n;
        self
    }

    /// How long each node takes to answer (`"400ms"`, `"0..50ms"`).
    pub fn delay(mut self, delay: &str) -> Rig {
        self.delay = Delay::parse(delay).unwrap_or_else(|e| panic!("delay `{delay}`: {e}"));
        self
    }

    pub fn service(mut self, toml: &str) -> Rig {
        self.service = format!("{}{toml}\n", self.service);
        self
    }

    pub fn front(mut self, toml: &str) -> Rig {
        self.front = format!("{}{toml}\n", self.front);
        self
    }

    pub fn back(mut self, toml: &str) -> Rig {
        self.back = format!("{}{toml}\n", self.back);
        self
    }

    /// The switch's config in front of nodes at `nodes` (ids `01`, `02`, ...).
    pub fn config(&self, nodes: &[SocketAddr]) -> Config {
        let mut toml = format!(
            "[[service]]\nname = \"svc\"\nspec = \"{}\"\n{}\n\
             [service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:0\"\n{}\n\
             [service.back]\n{}\n",
            self.spec, self.service, self.front, self.back
        );
        for (i, addr) in nodes.iter().enumerate() {
            toml.push_str(&format!(
                "[[service.back.node]]\nid = \"{:02}\"\naddress = \"{addr}\"\n",
                i + 1
            ));
        }
        Config::from_toml(&toml).unwrap_or_else(|e| panic!("config: {e}\n{toml}"))
    }

    /// Starts the nodes, then the switch in front of them.
    pub async fn start(self) -> (Vec<NodeSim>, Switch) {
        let nodes = start_nodes(&spec(&self.spec), self.nodes, self.delay).await;
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let switch = start_switch(&self.config(&addrs)).await;
        (nodes, switch)
    }
}

pub async fn start_switch(config: &Config) -> Switch {
    Switch::start(config).await.expect("switch starts")
}

pub fn front(switch: &Switch) -> SocketAddr {
    switch.services[0].front_addr
}

pub fn service(switch: &Switch) -> &Arc<Service> {
    &switch.services[0].service
}

/// Waits until every node has all its connections up (or panics after 5 s).
pub async fn wait_connected(service: &Service, per_node: usize) {
    wait_until("node connections up", || {
        service
            .view()
            .pool
            .nodes()
            .iter()
            .all(|n| n.live_conns() == per_node)
    })
    .await;
}

pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn sent(service: &Service, node: usize) -> u64 {
    service.view().pool.nodes()[node]
        .counters
        .sent
        .load(Ordering::Relaxed)
}

/// A bare client link: frames out, frames in, by hand.
pub struct RawClient {
    pub stream: tokio::net::TcpStream,
    pub codec: isoswitch::wire::FrameCodec,
    pub buf: bytes::BytesMut,
}

impl RawClient {
    pub async fn connect(addr: SocketAddr, spec: &Spec) -> RawClient {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).unwrap();
        RawClient {
            stream,
            codec: isoswitch::wire::FrameCodec::new(
                spec.framing().prefix,
                spec.framing().max_frame,
            ),
            buf: bytes::BytesMut::new(),
        }
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(bytes).await.expect("write");
    }

    pub fn frame(spec: &Spec, payload: &[u8]) -> Vec<u8> {
        let mut out = bytes::BytesMut::new();
        spec.framing()
            .prefix
            .encode(payload.len(), &mut out)
            .unwrap();
        out.extend_from_slice(payload);
        out.to_vec()
    }

    /// The next message payload, or None on EOF / error / 5 s without one.
    pub async fn recv(&mut self) -> Option<bytes::Bytes> {
        self.recv_within(Duration::from_secs(5)).await
    }

    /// [`RawClient::recv`], waiting at most `wait`.
    pub async fn recv_within(&mut self, wait: Duration) -> Option<bytes::Bytes> {
        use tokio::io::AsyncReadExt;
        use tokio_util::codec::Decoder;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match self.codec.decode(&mut self.buf) {
                Ok(Some(isoswitch::wire::Frame::Message(p))) => return Some(p),
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(_) => return None,
            }
            let read = tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await;
            match read {
                Ok(Ok(n)) if n > 0 => {}
                _ => return None,
            }
        }
    }

    /// True if the switch closed this link within 5 s.
    pub async fn closed_by_peer(&mut self) -> bool {
        use tokio::io::AsyncReadExt;
        let mut scratch = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut scratch)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }
}

/// One HTTP/1.1 request written by hand, headers exactly as given (what a
/// browser or a script could send), on a connection of its own: the status
/// code and body.
pub async fn raw_http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(body);
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}
