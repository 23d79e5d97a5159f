//! Real processes for end-to-end tests: the `isoswitch` binary as switch,
//! nodes, NAC and UnionPay, each its own process on 127.0.0.1, killed when
//! dropped; their `--json` reports; config files and data dirs under the
//! target's tmp dir. Shared by tests/chaos.rs and tests/integrity.rs.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

pub const BIN: &str = env!("CARGO_BIN_EXE_isoswitch");

/// One child process, killed (SIGKILL) when dropped, on every exit path.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `isoswitch ARGS`; stderr goes to a log file (named in failures),
    /// stdout is kept for the report.
    pub fn spawn(name: &str, args: &[&str]) -> Proc {
        Proc::start(name, Command::new(BIN).args(args))
    }

    /// [`Proc::spawn`] with SIGINT ignored, as a script's `cmd &` starts
    /// it without job control (`trap '' INT`, then exec).
    pub fn spawn_ignoring_sigint(name: &str, args: &[&str]) -> Proc {
        let mut sh = Command::new("sh");
        sh.args(["-c", "trap '' INT; exec \"$0\" \"$@\"", BIN])
            .args(args);
        Proc::start(name, &mut sh)
    }

    fn start(name: &str, command: &mut Command) -> Proc {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        // One file per process started: two cases of one test binary run at
        // once and name their nodes alike ("node03"); a shared file was
        // truncated by the second while the first waited on its line.
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = dir.join(format!("{name}-{}-{n}.log", std::process::id()));
        let stderr = std::fs::File::create(&log).expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: cannot start {BIN}: {e}"));
        Proc {
            name: name.into(),
            child,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("still running")
    }

    /// Waits until the process has written `line` to its log (stderr).
    pub async fn wait_logged(&self, line: &str) {
        // Bounded by the case's own timeout in practice; 60 s here so a
        // loaded machine starting a debug build does not fail it.
        for _ in 0..6000 {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            if log.contains(line) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "{}: never logged {line:?} (see {})",
            self.name,
            self.log.display()
        );
    }

    /// Sends a signal by name (TERM, INT, KILL) with kill(1).
    pub fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill(1) runs")
            .success();
        assert!(ok, "{}: kill -{sig} failed", self.name);
    }

    /// SIGKILL, and reap it.
    pub async fn kill9(&mut self) {
        self.child.start_kill().expect("SIGKILL");
        let _ = self.child.wait().await;
    }

    /// Waits for the process to exit by itself; returns its status and stdout.
    pub async fn finish(mut self) -> (ExitStatus, String) {
        let mut stdout = self.child.stdout.take().expect("stdout piped");
        let mut out = String::new();
        let (read, status) = tokio::join!(stdout.read_to_string(&mut out), self.child.wait());
        read.expect("read stdout");
        (status.expect("wait"), out)
    }

    /// The last line of stdout as JSON (the simulators' `--json` report).
    pub async fn report(self) -> serde_json::Value {
        let (name, log) = (self.name.clone(), self.log.clone());
        let (status, out) = self.finish().await;
        let line = out.lines().last().unwrap_or_default();
        serde_json::from_str(line).unwrap_or_else(|e| {
            panic!(
                "{name} ({status}): no JSON report ({e}): {out:?}; log {}",
                log.display()
            )
        })
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// An address where a connection is refused for as long as the returned
/// socket lives: bound, never listening. (A port only found free can be
/// taken by another test's listener while this one runs, and a "down"
/// node then answers as that process.)
pub fn dead_addr() -> (SocketAddr, tokio::net::TcpSocket) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("a port to hold");
    let addr = socket.local_addr().expect("its address");
    (addr, socket)
}

/// Waits until something accepts connections on `addr`.
pub async fn wait_listening(addr: SocketAddr) {
    // Bounded by the case's own timeout in practice; 60 s here so a
    // loaded machine starting a debug build does not fail it.
    for _ in 0..6000 {
        if TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("nothing listens on {addr}");
}

/// A data directory for one switch process, fresh (the switch creates it):
/// no two switches share runtime state, and nothing lands in the repo.
pub fn data_dir(name: &str) -> String {
    // Fresh on every call, so unique on every call too: two cases running at
    // once through one helper never share a store.
    static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-{}-{n}.data", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    path.to_string_lossy().into_owned()
}

pub fn write_config(name: &str, toml: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-{}.toml", std::process::id()));
    std::fs::write(&path, toml).expect("write config");
    // The owner's alone: a token file others may read is refused.
    let owner_only = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600);
    std::fs::set_permissions(&path, owner_only).expect("chmod 600");
    path
}

/// An `[admin]` section listening on a free port (its /metrics needs no token).
pub fn admin_toml(name: &str) -> (SocketAddr, String) {
    let addr = free_addr();
    let token = write_config(&format!("{name}-token"), "process-test-token\n");
    let toml = format!(
        "[admin]\nlisten = \"{addr}\"\ntoken_file = \"{}\"\n",
        token.display()
    );
    (addr, toml)
}

/// A connection to `addr` once something listens there (10 s at most).
pub async fn connect_when_listening(addr: SocketAddr) -> TcpStream {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect(addr).await {
            Ok(s) => return s,
            Err(e) if std::time::Instant::now() >= deadline => {
                panic!("nothing listens on {addr} after 10 s: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// The switch's /metrics lines whose name starts with one of `prefixes`.
pub async fn metrics(admin: SocketAddr, prefixes: &[&str]) -> String {
    // The admin listener runs on a thread of its own, started beside the
    // fronts: a test that waited for a front may ask before it listens.
    let mut stream = connect_when_listening(admin).await;
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send GET");
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .await
        .expect("read /metrics");
    text.lines()
        .filter(|l| prefixes.iter().any(|p| l.starts_with(p)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The sum of the metric `name` (a counter's `name_total`) in `text`, over
/// the label sets that contain every one of `labels` (`server="02"`).
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            let rest = l.strip_prefix(name).unwrap_or("");
            let rest = rest.strip_prefix("_total").unwrap_or(rest);
            (rest.starts_with('{') || rest.starts_with(' ')) && labels.iter().all(|x| l.contains(x))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until the switch's metric `name` (see [`metric_sum`]) reaches
/// `at_least`: the event a test of processes waits for instead of a time
/// (traffic flowing, a node busy, a link dropped). Bounded by the case's
/// own timeout in practice; 60 s here, as [`Proc::wait_logged`].
pub async fn wait_metric_sum(admin: SocketAddr, name: &str, labels: &[&str], at_least: f64) {
    wait_listening(admin).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let now = metric_sum(&metrics(admin, &[name]).await, name, labels);
        if now >= at_least {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}{labels:?} at {now}, never {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `done` holds of the switch's /metrics lines that start
/// with one of `prefixes`; fails after `limit` naming `what` and the last
/// lines read. The event a test of processes waits for instead of a time.
pub async fn metrics_hold(
    admin: SocketAddr,
    prefixes: &[&str],
    what: &str,
    limit: Duration,
    done: impl Fn(&str) -> bool,
) -> String {
    wait_listening(admin).await;
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let text = metrics(admin, prefixes).await;
        if done(&text) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never {what} within {limit:?}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every request the switch declined for a timeout has had its
/// late answer from the host (an approval, whatever the switch did with it,
/// a decline, or one after its reversal): where a case's hosts answer late
/// on purpose, the event that says every late approval has landed. Only
/// for cases where every timeout is such a late answer on its way (no host
/// stopped with requests in flight). At least one timeout is waited for.
pub async fn late_answers_in(admin: SocketAddr) {
    let late = [
        "isoswitch_late_approvals",
        "isoswitch_late_declines",
        "isoswitch_late_answers_after_reversal",
    ];
    let mut prefixes = late.to_vec();
    prefixes.push("isoswitch_service_declines");
    metrics_hold(
        admin,
        &prefixes,
        "a late answer for every timeout",
        Duration::from_secs(60),
        |text| {
            let timeouts = metric_sum(text, "isoswitch_service_declines", &["reason=\"timeout\""]);
            let answered: f64 = late.iter().map(|name| metric_sum(text, name, &[])).sum();
            timeouts > 0.0 && answered >= timeouts
        },
    )
    .await;
}

/// `n` node processes on `spec`, answering after `delay`, listening.
pub async fn start_nodes(spec: &str, n: usize, delay: &str) -> (Vec<Proc>, Vec<SocketAddr>) {
    start_nodes_with(spec, n, delay, &[]).await
}

/// [`start_nodes`] with extra `sim node` arguments.
pub async fn start_nodes_with(
    spec: &str,
    n: usize,
    delay: &str,
    extra: &[&str],
) -> (Vec<Proc>, Vec<SocketAddr>) {
    let mut procs = Vec::new();
    let mut addrs = Vec::new();
    for i in 0..n {
        let addr = free_addr();
        let (a, id) = (addr.to_string(), format!("{:02}", i + 1));
        let mut args = vec![
            "sim", "node", "--listen", &a, "--spec", spec, "--id", &id, "--delay", delay,
        ];
        args.extend_from_slice(extra);
        procs.push(Proc::spawn(&format!("node{id}"), &args));
        addrs.push(addr);
    }
    // Not by connecting: a node that originates requests would send some on
    // a probe connection, where nothing reads them (they were lost, and the
    // node counted them unanswered).
    for p in &procs {
        p.wait_logged("sim node listening on").await;
    }
    (procs, addrs)
}

pub fn nodes_toml(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            format!(
                "[[service.back.node]]\nid = \"{:02}\"\naddress = \"{a}\"\n",
                i + 1
            )
        })
        .collect()
}

pub fn n(report: &serde_json::Value, key: &str) -> u64 {
    report[key]
        .as_u64()
        .unwrap_or_else(|| panic!("report has no {key}: {report}"))
}

/// Every request the NAC sent was answered exactly once (approved or declined).
pub fn assert_exactly_once(report: &serde_json::Value) {
    assert!(n(report, "sent") > 0, "{report}");
    assert_eq!(
        n(report, "mismatched"),
        0,
        "answered twice or wrongly: {report}"
    );
    assert_eq!(n(report, "unanswered"), 0, "{report}");
    assert_eq!(
        n(report, "answered") + n(report, "declined"),
        n(report, "sent"),
        "{report}"
    );
}

/// A NAC process on `cup-pos`: `rate` a second for `duration`, waiting
/// `timeout` for each answer, `extra` args.
pub fn nac(
    name: &str,
    switch: SocketAddr,
    rate: u32,
    (duration, timeout): (&str, &str),
    extra: &[&str],
) -> Proc {
    let (a, r) = (switch.to_string(), rate.to_string());
    let mut args = vec![
        "sim",
        "nac",
        "--connect",
        &a,
        "--spec",
        "cup-pos",
        "--uplinks",
        "2",
        "--terminals",
        "40",
        "--rate",
        &r,
        "--duration",
        duration,
        "--timeout",
        timeout,
        "--json",
    ];
    args.extend_from_slice(extra);
    Proc::spawn(name, &args)
}
