//! End-to-end: admin clients cannot hurt card traffic. The switch runs as its
//! own process (`isoswitch run`, under `ulimit -n 512`) in front of simulated
//! nodes, with a POS network controller on its front; 1,000 idle and
//! slow-loris admin connections must not cost it card traffic, descriptors
//! past the admin's cap, the operator's access, or its stop; 200 clients
//! trickling headers must not starve the probes.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use isoswitch::cli::ctl::request;
use isoswitch::iso8583::Spec;
use isoswitch::sim::nac::{self, NacReport, NacSimConfig};
use isoswitch::sim::node::{Delay, NodeSim};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "flood-token-0123456789abcdef";
const TEST_LIMIT: Duration = Duration::from_secs(180);
/// The switch's open-file limit: without the admin's cap, the flood alone
/// would exhaust it.
const SWITCH_NOFILE: u32 = 512;
/// `admin.max_connections` (the default).
const ADMIN_CAP: usize = 64;
/// `admin.probe_slots` (the default).
const PROBE_SLOTS: usize = 8;
const FLOOD: usize = 1_000;

/// `isoswitch run` in a process of its own, its log in a file.
struct SwitchProcess {
    child: tokio::process::Child,
    pid: u32,
    admin: SocketAddr,
    front: SocketAddr,
    log: PathBuf,
    data_dir: PathBuf,
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "isoswitch-admin-flood-{}-{name}",
        std::process::id()
    ))
}

impl SwitchProcess {
    /// Starts the switch in front of `nodes` (service `pos`) and waits for
    /// its admin listener.
    async fn start(test: &str, nodes: &[NodeSim], admin_extra: &str) -> SwitchProcess {
        let (admin, front) = (free_addr(), free_addr());
        let token = temp_path(&format!("{test}.token"));
        write_secret(&token, TOKEN);
        let mut toml = format!(
            "[admin]\nlisten = \"{admin}\"\ntoken_file = \"{}\"\n{admin_extra}\n\
             [[service]]\nname = \"pos\"\nspec = \"cup-pos\"\n\
             [service.front]\nkind = \"listen\"\nlisten = \"{front}\"\n[service.back]\n",
            token.display()
        );
        for (i, node) in nodes.iter().enumerate() {
            toml.push_str(&format!(
                "[[service.back.node]]\nid = \"{:02}\"\naddress = \"{}\"\n",
                i + 1,
                node.addr
            ));
        }
        let config = temp_path(&format!("{test}.toml"));
        std::fs::write(&config, toml).expect("write the config");
        let log = temp_path(&format!("{test}.log"));
        let stderr = std::fs::File::create(&log).expect("create the log");
        // Its own data dir: two switches cannot share one (it is locked).
        let data_dir = temp_path(&format!("{test}.data"));
        let _ = std::fs::remove_dir_all(&data_dir);
        // `exec` keeps the PID: /proc/PID/fd is the switch's own table.
        let child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -n {SWITCH_NOFILE} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_isoswitch"))
            .args(["run", "--config"])
            .arg(&config)
            .arg("--data-dir")
            .arg(&data_dir)
            .env("ISOSWITCH_LOG", "info")
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("run the switch");
        let pid = child.id().expect("running");
        let switch = SwitchProcess {
            child,
            pid,
            admin,
            front,
            log,
            data_dir,
        };
        let base = switch.base();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok((200, _)) = request(&base, "GET", "/readyz", None, None).await {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the switch never got ready:\n{}",
                switch.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        switch
    }

    fn base(&self) -> String {
        format!("http://{}", self.admin)
    }

    /// Waits until the switch has let go of every client link (the NAC's
    /// uplinks close a moment after the NAC ends).
    async fn wait_no_clients(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (code, body) = request(&self.base(), "GET", "/api/v1/status", Some(TOKEN), None)
                .await
                .expect("admin reachable");
            assert_eq!(code, 200, "{body}");
            let status: isoswitch::ops::status::Status =
                serde_json::from_str(&body).expect("status JSON");
            if status.services.iter().all(|s| s.clients == 0) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "client links still open: {body}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Descriptors the switch holds open now.
    fn open_files(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then the exit status and the whole log.
    async fn terminate(mut self) -> (std::process::ExitStatus, String) {
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .expect("kill");
        assert!(sent.success());
        let status = self.child.wait().await.expect("the switch exits");
        (status, self.log_text())
    }
}

fn raise_open_file_limit() {
    let (_, hard) = rlimit::Resource::NOFILE.get().expect("getrlimit");
    rlimit::Resource::NOFILE
        .set(hard, hard)
        .expect("raise the soft open-file limit to the hard one");
    assert!(
        hard >= (FLOOD + 512) as u64,
        "the flood needs an open-file hard limit of at least {} (ulimit -Hn is {hard})",
        FLOOD + 512
    );
}

async fn nac_run(spec: &Arc<Spec>, target: SocketAddr, seconds: u64) -> NacReport {
    nac::run(
        Arc::clone(spec),
        NacSimConfig {
            target,
            nac_id: 1,
            uplinks: 2,
            terminals: 100,
            rate: Some(300.0),
            duration: Duration::from_secs(seconds),
            timeout: Duration::from_secs(5),
        },
    )
    .await
    .expect("the NAC connects and runs")
}

fn assert_nothing_lost(report: &NacReport) {
    assert!(report.sent > 100, "{report}");
    assert_eq!(report.unanswered, 0, "{report}");
    assert_eq!(report.mismatched, 0, "{report}");
    assert_eq!(report.uplinks_lost, 0, "{report}");
    assert_eq!(report.declined, 0, "{report}");
    assert_eq!(report.answered, report.sent, "{report}");
}

/// An admin client that never finishes its request: `idle` ones send
/// nothing, the others a request line and then a header byte at a time.
/// Returns once the switch has cut it.
async fn slow_client(mut stream: TcpStream, idle: bool) {
    let mut scratch = [0u8; 1024];
    if idle {
        // Anything but the end: an answer would be a bug the count shows.
        while let Ok(n) = stream.read(&mut scratch).await {
            if n == 0 {
                return;
            }
        }
        return;
    }
    if stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: flood\r\nX-Slow: ")
        .await
        .is_err()
    {
        return;
    }
    loop {
        tokio::select! {
            read = stream.read(&mut scratch) => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            // Pacing, not a wait: one header byte every 250 ms.
            _ = tokio::time::sleep(Duration::from_millis(250)) => {
                if stream.write_all(b"a").await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The acceptance run. 1,000 idle and slow-loris admin connections
/// while a NAC runs through the switch: the NAC loses nothing, the switch
/// holds no more descriptors than its admin cap allows, every slow client
/// is cut, an operator's request gets through, and SIGTERM is not held by
/// admin clients in the middle of a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_slow_admin_clients_costs_no_card_traffic() {
    raise_open_file_limit();
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 2, Delay::parse("1ms..5ms").unwrap()).await;
        let switch = SwitchProcess::start("flood", &nodes, "header_timeout = \"1s\"").await;
        let quiet = nac_run(&spec, switch.front, 4).await;
        assert_nothing_lost(&quiet);
        switch.wait_no_clients().await;
        let baseline = switch.open_files();

        // The flood: every connection is made (those past the cap wait in
        // the kernel's backlog) before the NAC connects its uplinks.
        let mut flood = Vec::with_capacity(FLOOD);
        for _ in 0..FLOOD {
            flood.push(TcpStream::connect(switch.admin));
        }
        let streams = futures_util::future::join_all(flood).await;
        let cut = Arc::new(AtomicUsize::new(0));
        let mut clients = tokio::task::JoinSet::new();
        for (i, stream) in streams.into_iter().enumerate() {
            let stream = stream.expect("the kernel takes the connection");
            let cut = Arc::clone(&cut);
            clients.spawn(async move {
                slow_client(stream, i % 2 == 0).await;
                cut.fetch_add(1, Ordering::Relaxed);
            });
        }
        let peak = Arc::new(AtomicUsize::new(0));
        let sampler = {
            let (peak, pid) = (Arc::clone(&peak), switch.pid);
            tokio::spawn(async move {
                loop {
                    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
                        .map(|d| d.count())
                        .unwrap_or(0);
                    peak.fetch_max(open, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        // From the flood's own address, the operator is past its peer's
        // share: 503 (retry) until the switch has cut the slow clients.
        let operator = {
            let base = switch.base();
            tokio::spawn(async move { until_not_busy(&base, "/api/v1/status").await })
        };
        let loaded = nac_run(&spec, switch.front, 6).await;
        assert_nothing_lost(&loaded);

        while clients.join_next().await.is_some() {}
        assert_eq!(
            cut.load(Ordering::Relaxed),
            FLOOD,
            "every slow client was cut by the switch"
        );
        let (code, body) = operator.await.unwrap();
        assert_eq!(code, 200, "{body}");
        sampler.abort();
        let peak = peak.load(Ordering::Relaxed);
        // The cap, the probe slots and the one being refused, the NAC's two
        // uplinks, and a few for transient health checks and reconnects.
        let bound = baseline + ADMIN_CAP + PROBE_SLOTS + 1 + 2 + 8;
        assert!(
            peak <= bound,
            "the switch held {peak} descriptors, more than {bound} ({baseline} before the flood)"
        );
        let (code, _) = request(&switch.base(), "GET", "/api/v1/status", Some(TOKEN), None)
            .await
            .expect("admin reachable after the flood");
        assert_eq!(code, 200);

        // Admin clients in the middle of a request (token given, body sent
        // a byte at a time; request_timeout is 30 s) do not hold SIGTERM.
        switch.wait_no_clients().await;
        let idle = switch.open_files();
        let mut held = Vec::new();
        for _ in 0..10 {
            let mut stream = TcpStream::connect(switch.admin).await.unwrap();
            let head = format!(
                "POST /api/v1/services/pos/nodes HTTP/1.1\r\nHost: x\r\n\
                 Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\
                 Content-Length: 1000\r\n\r\n{{"
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            held.push(stream);
        }
        // The listener accepts in order: once a later request is answered,
        // the slow ones are in, a descriptor each (one less in case `idle`
        // still counted the socket of the status request before it).
        let (code, _) = request(&switch.base(), "GET", "/api/v1/status", Some(TOKEN), None)
            .await
            .expect("admin reachable");
        assert_eq!(code, 200);
        assert!(
            switch.open_files() >= idle + held.len() - 1,
            "the slow requests hold their connections"
        );
        let (status, log) = switch.terminate().await;
        assert!(status.success(), "{status}\n{log}");
        assert!(
            !log.contains("still running after the stop grace"),
            "the stop waited on admin clients:\n{log}"
        );
        println!(
            "NAC p99 without the admin flood: {} µs, with it: {} µs (open files {baseline} before, peak {peak})",
            quiet.p99_us, loaded.p99_us
        );
        drop(held);
        for node in nodes {
            node.stop().await;
        }
    })
    .await
    .expect("test within its time limit");
}

/// `GET path` with the token until it is not a 503 (the admin at its caps),
/// a few a second.
async fn until_not_busy(base: &str, path: &str) -> (u16, String) {
    loop {
        match request(base, "GET", path, Some(TOKEN), None).await {
            Ok((503, _)) | Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            Ok(answered) => return answered,
        }
    }
}

/// One slow client that keeps coming back: connects, sends a request line
/// and then a header byte every 100 ms, and connects again 100 ms after the
/// switch cuts or answers it, until `stop`. Counts its connections.
async fn trickler(
    admin: SocketAddr,
    connects: Arc<AtomicUsize>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut scratch = [0u8; 1024];
    while !stop.is_cancelled() {
        let Ok(mut stream) = TcpStream::connect(admin).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        connects.fetch_add(1, Ordering::Relaxed);
        if stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: trickle\r\nX-Slow: ")
            .await
            .is_err()
        {
            continue;
        }
        loop {
            tokio::select! {
                read = stream.read(&mut scratch) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                },
                // Pacing, not a wait: one header byte every 100 ms.
                _ = tokio::time::sleep(Duration::from_millis(100)) => {
                    if stream.write_all(b"a").await.is_err() {
                        break;
                    }
                }
                _ = stop.cancelled() => return,
            }
        }
        // Pacing, not a wait: a cut trickler comes back shortly after.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The done-when: while 200 clients trickle headers (and come back
/// as soon as they are cut), `/healthz` and `/readyz` answer 200 within 1 s,
/// every time; another request from their address gets a prompt 503 or is
/// served; an operator on another address is served (one address holds at
/// most `admin.max_connections_per_peer` of the slots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_within_a_second_while_200_clients_trickle_headers() {
    const TRICKLERS: usize = 200;
    const BOUND: Duration = Duration::from_secs(1);
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 1, Delay::NONE).await;
        let switch = SwitchProcess::start("probes", &nodes, "").await;
        let stop = tokio_util::sync::CancellationToken::new();
        let connects = Arc::new(AtomicUsize::new(0));
        let mut flood = tokio::task::JoinSet::new();
        for _ in 0..TRICKLERS {
            flood.spawn(trickler(switch.admin, Arc::clone(&connects), stop.clone()));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while connects.load(Ordering::Relaxed) < TRICKLERS {
            assert!(tokio::time::Instant::now() < deadline, "the flood connects");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let base = switch.base();
        let mut slowest = Duration::ZERO;
        // 6 s: past the 5 s header_timeout, so the served slow clients are
        // cut and come back while probes go on.
        for round in 0..30 {
            for path in ["/healthz", "/readyz"] {
                let began = tokio::time::Instant::now();
                let answered = tokio::time::timeout(BOUND, request(&base, "GET", path, None, None))
                    .await
                    .unwrap_or_else(|_| {
                        panic!("{path} not answered within {BOUND:?} (round {round})")
                    })
                    .expect("the probe is answered");
                assert_eq!(answered.0, 200, "{path}, round {round}: {}", answered.1);
                slowest = slowest.max(began.elapsed());
            }
            // Pacing, not a wait: probe rounds spread past header_timeout.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (code, body) = tokio::time::timeout(
            BOUND,
            request(&base, "GET", "/api/v1/status", Some(TOKEN), None),
        )
        .await
        .expect("a prompt answer past the peer's share")
        .expect("answered");
        assert!(code == 503 || code == 200, "{code}: {body}");
        if code == 503 {
            assert!(body.contains("admin.max_connections_per_peer"), "{body}");
        }
        let other = "127.0.0.2".parse().unwrap();
        let until = tokio::time::Instant::now() + Duration::from_millis(300);
        let statuses = hammer(switch.admin, other, TOKEN, until).await;
        assert!(
            !statuses.is_empty() && statuses.iter().all(|&s| s == 200),
            "another address is served: {statuses:?}"
        );
        let made = connects.load(Ordering::Relaxed);
        stop.cancel();
        while flood.join_next().await.is_some() {}
        let (status, log) = switch.terminate().await;
        assert!(status.success(), "{status}\n{log}");
        assert!(log.contains("answering probes only"), "{log}");
        println!(
            "{TRICKLERS} trickling clients ({made} connections): slowest probe {} ms",
            slowest.as_millis()
        );
        for node in nodes {
            node.stop().await;
        }
    })
    .await
    .expect("test within its time limit");
}

/// Refused tokens are logged at WARN with the peer's address, rate-limited
/// (the rest counted in a "suppressed" line); every change is logged at INFO
/// with the peer's address and its outcome, refused ones too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_changes_are_logged_with_the_peer() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 2, Delay::NONE).await;
        // No lockout within the test's refusals: this one is about the log.
        let switch = SwitchProcess::start("log", &nodes, "max_refused_tokens = 100000").await;
        let base = switch.base();
        const REFUSED: usize = 100;
        for _ in 0..REFUSED {
            let (code, _) = request(
                &base,
                "GET",
                "/api/v1/status",
                Some("wrong-token-0123456789"),
                None,
            )
            .await
            .unwrap();
            assert_eq!(code, 401);
        }
        let (code, body) = request(
            &base,
            "POST",
            "/api/v1/services/pos/nodes/02/drain",
            Some(TOKEN),
            None,
        )
        .await
        .unwrap();
        assert_eq!(code, 200, "{body}");
        let (code, _) = raw_http(
            switch.admin,
            "POST",
            "/api/v1/services/pos/nodes/02/enable",
            &[("Authorization", &format!("Bearer {TOKEN}"))],
            "",
        )
        .await;
        assert_eq!(code, 415);
        // The count of what was held back comes within a second or so.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !switch.log_text().contains("suppressed") {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no suppressed count:\n{}",
                switch.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (status, log) = switch.terminate().await;
        assert!(status.success(), "{status}\n{log}");
        let refused: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("admin: token refused"))
            .collect();
        assert!(!refused.is_empty(), "{log}");
        assert!(
            refused.len() < REFUSED,
            "rate-limited: {} lines for {REFUSED} refusals",
            refused.len()
        );
        for line in &refused {
            assert!(
                line.contains("WARN") && line.contains("peer=127.0.0.1:"),
                "{line}"
            );
        }
        let changes: Vec<&str> = log.lines().filter(|l| l.contains("admin change")).collect();
        assert_eq!(changes.len(), 2, "{log}");
        assert!(
            changes[0].contains("INFO")
                && changes[0].contains("peer=127.0.0.1:")
                && changes[0].contains("status=200")
                && changes[0].contains("/nodes/02/drain")
                && changes[0].contains("node `02` of `pos`: drain"),
            "{}",
            changes[0]
        );
        assert!(
            changes[1].contains("status=415") && changes[1].contains("/nodes/02/enable"),
            "{}",
            changes[1]
        );
        for node in nodes {
            node.stop().await;
        }
    })
    .await
    .expect("test within its time limit");
}

/// Bytes of every file in the switch's data directory (the database, its
/// WAL, the key, the runtime state).
fn data_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// One keep-alive connection from `source` sending `GET /api/v1/status`
/// with `token` as fast as the answers come, until `until`; reconnects
/// when the switch closes it. Returns the statuses answered.
async fn hammer(
    admin: SocketAddr,
    source: std::net::IpAddr,
    token: &str,
    until: tokio::time::Instant,
) -> Vec<u16> {
    let mut statuses = Vec::new();
    let request = format!(
        "GET /api/v1/status HTTP/1.1\r\nHost: flood\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    'connections: while tokio::time::Instant::now() < until {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::new(source, 0))
            .expect("bind the source");
        let Ok(mut stream) = socket.connect(admin).await else {
            continue;
        };
        let mut buf = Vec::new();
        while tokio::time::Instant::now() < until {
            if stream.write_all(request.as_bytes()).await.is_err() {
                continue 'connections;
            }
            // One answer: the head, then Content-Length bytes.
            let (status, rest) = loop {
                if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    let status: u16 = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + len {
                        break (status, end + 4 + len);
                    }
                }
                let mut chunk = [0u8; 4096];
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => continue 'connections,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            buf.drain(..rest);
            statuses.push(status);
        }
    }
    statuses
}

/// The `token-refused` audit rows in the switch's store: (second, count
/// the row carries).
fn refused_rows(data_dir: &std::path::Path) -> Vec<(i64, u64)> {
    let db = rusqlite::Connection::open(data_dir.join("isoswitch.db")).expect("open the store");
    let mut st = db
        .prepare("SELECT at, outcome FROM admin_log WHERE action = 'token-refused' ORDER BY at")
        .unwrap();
    st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
        .unwrap()
        .map(|r| {
            let (at, outcome) = r.unwrap();
            let n = outcome
                .split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no count in {outcome:?}"));
            (at / 1000, n)
        })
        .collect()
}

/// The done-when: a 5 s wrong-token flood (one keep-alive client,
/// thousands of 401s) writes at most 5 audit rows a second, one per second
/// here, that still count every refusal; the store grows by under 1 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_flood_writes_a_few_audit_rows_and_not_the_disk_full() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 2, Delay::NONE).await;
        // No lockout: every request of the flood is a refused token.
        let extra = "max_refused_tokens = 100000000";
        let switch = SwitchProcess::start("audit-flood", &nodes, extra).await;
        // The baseline, once ready (what start waits for): the store's
        // writes at start are done by then (the data dir stays the same
        // size from there while nothing comes), and anything written later
        // is counted against the flood, never for it.
        let before = data_bytes(&switch.data_dir);
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        let local = "127.0.0.1".parse().unwrap();
        let statuses = hammer(switch.admin, local, "wrong-token-0123456789", until).await;
        let refused = statuses.iter().filter(|&&s| s == 401).count() as u64;
        assert_eq!(refused as usize, statuses.len(), "all 401");
        assert!(refused > 1_000, "a flood: {refused} requests");
        // The last refusals are written (the book is flushed once a second):
        // the rows count every one.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let rows = refused_rows(&switch.data_dir);
            if rows.iter().map(|(_, n)| n).sum::<u64>() >= refused {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{refused} refusals, never all in the audit rows: {rows:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let grown = data_bytes(&switch.data_dir).saturating_sub(before);
        let data_dir = switch.data_dir.clone();
        let (status, log) = switch.terminate().await;
        assert!(status.success(), "{status}\n{log}");
        assert!(grown < 1 << 20, "the store grew by {grown} bytes");
        let rows = refused_rows(&data_dir);
        let mut per_second = std::collections::BTreeMap::new();
        for (second, _) in &rows {
            *per_second.entry(*second).or_insert(0) += 1;
        }
        assert!(
            per_second.values().all(|&n| n <= 5),
            "at most 5 rows a second: {per_second:?}"
        );
        assert!(rows.len() <= 9, "one row a second or so: {rows:?}");
        let counted: u64 = rows.iter().map(|(_, n)| n).sum();
        assert_eq!(counted, refused, "the rows count every refusal: {rows:?}");
        assert!(log.contains("admin audit: tokens refused"), "{log}");
        println!(
            "{refused} refused tokens in 5 s: {} audit rows, the data dir grew {grown} bytes",
            rows.len()
        );
        for node in nodes {
            node.stop().await;
        }
    })
    .await
    .expect("test within its time limit");
}

/// After `admin.max_refused_tokens` refusals a peer gets 429 with
/// Retry-After, even with the right token, for `admin.lockout`; another
/// address is not locked out, and the open probes stay open to the
/// locked-out one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_keeps_guessing_is_locked_out() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 2, Delay::NONE).await;
        let extra = "max_refused_tokens = 5\nlockout = \"10m\"";
        let switch = SwitchProcess::start("lockout", &nodes, extra).await;
        let base = switch.base();
        for i in 0..5 {
            let (code, _) = request(
                &base,
                "GET",
                "/api/v1/status",
                Some("wrong-token-0123456789"),
                None,
            )
            .await
            .unwrap();
            assert_eq!(code, 401, "refusal {i}");
        }
        let (code, body) = request(&base, "GET", "/api/v1/status", Some(TOKEN), None)
            .await
            .unwrap();
        assert_eq!(code, 429, "the right token, locked out: {body}");
        assert!(body.contains("locked out"), "{body}");
        let (code, _) = raw_http(
            switch.admin,
            "GET",
            "/api/v1/status",
            &[("Authorization", &format!("Bearer {TOKEN}"))],
            "",
        )
        .await;
        assert_eq!(code, 429);
        let (code, _) = request(&base, "GET", "/healthz", None, None).await.unwrap();
        assert_eq!(code, 200, "the probes stay open");
        // Another address of the host is not the guesser.
        let other = "127.0.0.2".parse().unwrap();
        let until = tokio::time::Instant::now() + Duration::from_millis(200);
        let statuses = hammer(switch.admin, other, TOKEN, until).await;
        assert!(
            !statuses.is_empty() && statuses.iter().all(|&s| s == 200),
            "{statuses:?}"
        );
        let (status, log) = switch.terminate().await;
        assert!(status.success(), "{status}\n{log}");
        assert!(log.contains("peer locked out"), "{log}");
        for node in nodes {
            node.stop().await;
        }
    })
    .await
    .expect("test within its time limit");
}
