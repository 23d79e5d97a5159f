//! Chaos: the real `isoswitch` binary as the switch, the channel nodes, the NAC
//! and UnionPay, each its own process on 127.0.0.1, and real faults: a node
//! killed with SIGKILL, every UnionPay out link dropped at once, a client that
//! never reads, SIGTERM to the switch. Each case checks exactly-once answers
//! from the simulators' own JSON reports (or, for the SIGTERM case, from a
//! client that tracks every request it wrote). No assertion is on timing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::sync::Arc;
use std::time::Duration;

use isoswitch::iso8583::{Message, Spec, samples};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[path = "common/procs.rs"]
mod procs;
use procs::*;

/// A POS service (`cup-pos`) listening on `listen`, in front of `nodes`.
/// The shutdown decline gets its own code (`92`) so a test can tell it apart.
fn pos_config(listen: SocketAddr, nodes: &[SocketAddr], request_timeout: &str) -> String {
    format!(
        "[[service]]\nname = \"pos\"\nspec = \"cup-pos\"\n\
         [service.front]\nkind = \"listen\"\nlisten = \"{listen}\"\n\
         [service.back]\nconnections_per_node = 2\nreconnect_min = \"50ms\"\nreconnect_max = \"200ms\"\n\
         [service.timeouts]\nrequest = \"{request_timeout}\"\n\
         [service.declines]\nshutdown = \"92\"\n{}",
        nodes_toml(nodes)
    )
}

async fn start_switch(name: &str, toml: &str, listen: SocketAddr) -> Proc {
    start_switch_with(name, toml, listen, &[]).await
}

/// [`start_switch`] with more `run` flags.
async fn start_switch_with(name: &str, toml: &str, listen: SocketAddr, extra: &[&str]) -> Proc {
    let path = write_config(name, toml);
    let p = path.to_string_lossy().into_owned();
    let data = data_dir(name);
    let mut args = vec![
        "run",
        "--config",
        &p,
        "--data-dir",
        &data,
        "--stats-every",
        "1",
    ];
    args.extend_from_slice(extra);
    let switch = Proc::spawn(name, &args);
    wait_listening(listen).await;
    switch
}

/// A NAC process: `rate` requests a second for `duration`, JSON report.
fn start_nac(name: &str, switch: SocketAddr, rate: u32, duration: &str) -> Proc {
    nac(name, switch, rate, (duration, "5s"), &[])
}

/// The cases run one at a time: each drives several processes at full load,
/// and beside another case (the client that never reads sends 50,000
/// requests) a 2-core machine answers late enough to fail a simulator's own
/// timeout.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn within<F: std::future::Future<Output = ()>>(limit: Duration, test: F) {
    let _alone = ONE_AT_A_TIME.lock().await;
    tokio::time::timeout(limit, test)
        .await
        .expect("chaos case within its timeout");
}

/// A node process killed with SIGKILL while a NAC runs: every NAC request is
/// answered exactly once (the dead node's in-flight ones declined), and a NAC
/// run after the kill is served entirely by the other nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_node_under_nac_load() {
    within(Duration::from_secs(90), async {
        let (mut nodes, addrs) = start_nodes("cup-pos", 3, "20..80ms").await;
        let listen = free_addr();
        let (admin, admin_toml) = admin_toml("kill9-switch");
        let toml = format!("{admin_toml}{}", pos_config(listen, &addrs, "3s"));
        let _switch = start_switch("kill9-switch", &toml, listen).await;
        let first_nac = start_nac("kill9-nac", listen, 200, "3s");
        // Killed with requests in flight, well into the NAC's run.
        wait_metric_sum(admin, "isoswitch_service_requests", &[], 100.0).await;
        wait_metric_sum(admin, "isoswitch_server_in_flight", &["server=\"02\""], 1.0).await;
        nodes[1].kill9().await;
        let during = first_nac.report().await;
        eprintln!("NAC across the kill: {during}");
        assert_exactly_once(&during);
        // Other terminals (another NAC ID): the first NAC's STANs sent
        // again from the same terminals would be duplicates of its
        // transactions, answered by the switch's duplicate book.
        let after = nac(
            "kill9-nac-after",
            listen,
            200,
            ("1s", "5s"),
            &["--nac-id", "2"],
        )
        .report()
        .await;
        assert_exactly_once(&after);
        assert_eq!(
            n(&after, "declined"),
            0,
            "served by the live nodes: {after}"
        );
    })
    .await;
}

/// The switch on one thread (`run --single-thread`, tokio's current-thread
/// runtime): a node killed with SIGKILL under NAC load, every request
/// answered exactly once, the rest served by the live nodes, and SIGINT
/// still ends it cleanly. Nothing of the switch may assume a second thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_single_thread_a_node_killed_under_load_loses_nothing() {
    within(Duration::from_secs(90), async {
        let (mut nodes, addrs) = start_nodes("cup-pos", 3, "5..20ms").await;
        let listen = free_addr();
        let (admin, admin_toml) = admin_toml("single-switch");
        let toml = format!("{admin_toml}{}", pos_config(listen, &addrs, "3s"));
        let switch = start_switch_with("single-switch", &toml, listen, &["--single-thread"]).await;
        let load = start_nac("single-nac", listen, 200, "3s");
        wait_metric_sum(admin, "isoswitch_service_requests", &[], 100.0).await;
        nodes[2].kill9().await;
        let report = load.report().await;
        eprintln!("NAC across the kill, one thread: {report}");
        assert_exactly_once(&report);
        assert!(n(&report, "answered") > 100, "{report}");
        switch.signal("INT");
        let (status, _) = switch.finish().await;
        assert!(status.success(), "a clean stop on one thread: {status:?}");
    })
    .await;
}

/// UnionPay (a `sim cups` process that refuses any frame on a link before
/// its sign-on) drops all 8 out links at once every 700 ms under load both
/// ways (its own 0100s, and the nodes' 0200s): no frame precedes a sign-on on
/// any link, every request is answered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_unionpay_out_link_dropped_at_once_under_load() {
    within(Duration::from_secs(90), async {
        let (nodes, addrs) =
            start_nodes_with("cups", 3, "0..20ms", &["--originate", "30", "--json"]).await;
        let (accept, listen) = (free_addr(), free_addr());
        let (a, l) = (accept.to_string(), listen.to_string());
        let cups = Proc::spawn(
            "cups",
            &[
                "sim", "cups", "--accept", &a, "--connect", &l, "--links", "8", "--rate", "200",
                "--duration", "60s", "--timeout", "3s", "--keepalive-idle", "200ms",
                "--require-sign-on", "--sign-on-delay", "30ms", "--drop-out-links-every",
                "700ms", "--json",
            ],
        );
        wait_listening(accept).await;
        let (admin, admin_toml) = admin_toml("drop-switch");
        let toml = format!(
            "{admin_toml}[[service]]\nname = \"unionpay\"\nspec = \"cups\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
             [service.front]\nkind = \"simplex\"\nconnect = \"{accept}\"\nlisten = \"{listen}\"\nlinks = 8\n\
             member_id = \"03105840\"\npeer_id = \"00010000\"\nkeepalive_idle = \"200ms\"\n\
             reconnect_min = \"20ms\"\nreconnect_max = \"200ms\"\nsign_on = \"per-link\"\nsign_on_retry = \"300ms\"\n\
             [service.back]\nconnections_per_node = 2\n{}",
            nodes_toml(&addrs)
        );
        let path = write_config("drop-switch", &toml);
        let p = path.to_string_lossy().into_owned();
        let data = data_dir("drop-switch");
        let _switch = Proc::spawn(
            "drop-switch",
            &["run", "--config", &p, "--data-dir", &data],
        );
        // Load both ways across several drops (one each 700 ms): by volume,
        // about 4 s of it on a machine that keeps up.
        wait_metric_sum(admin, "isoswitch_service_requests", &[], 600.0).await;
        wait_metric_sum(admin, "isoswitch_service_node_requests", &[], 250.0).await;
        // The nodes stop originating and report once their requests are
        // settled, while UnionPay still runs; then UnionPay stops and reports.
        for node in &nodes {
            node.signal("INT");
        }
        let mut node_reports = Vec::new();
        for node in nodes {
            node_reports.push(node.report().await);
        }
        cups.signal("INT");
        let report = cups.report().await;
        // Every report first: a lost request is explained by both ends.
        for (i, r) in node_reports.iter().enumerate() {
            eprintln!("node {i} across the drops: {r}");
        }
        eprintln!("UnionPay across the drops: {report}");
        let seen = metrics(
            admin,
            &["isoswitch_service_", "isoswitch_link_set_waited"],
        )
        .await;
        eprintln!("the switch's counters:\n{seen}");
        for (i, r) in node_reports.iter().enumerate() {
            assert!(n(r, "originated") > 0, "node {i}: {r}");
            assert_eq!(n(r, "originated_unanswered"), 0, "node {i}: {r}");
            assert_eq!(n(r, "foreign_responses"), 0, "node {i}: {r}");
            assert_eq!(
                n(r, "originated_answered") + n(r, "originated_declined"),
                n(r, "originated"),
                "node {i}: exactly once: {r}"
            );
        }
        assert_eq!(n(&report, "unsigned_frames"), 0, "frames before sign-on: {report}");
        assert!(n(&report, "out_link_drops") >= 1, "{report}");
        assert!(n(&report, "sign_ons") >= 8, "{report}");
        assert!(n(&report, "sent") > 0, "{report}");
        assert!(n(&report, "member_requests") > 0, "{report}");
        assert_eq!(
            n(&report, "member_requests_answered"),
            n(&report, "member_requests"),
            "{report}"
        );
        assert_eq!(n(&report, "mismatched"), 0, "{report}");
        assert_eq!(n(&report, "unanswered"), 0, "{report}");
        assert_eq!(
            n(&report, "answered") + n(&report, "declined"),
            n(&report, "sent"),
            "{report}"
        );
    })
    .await;
}

/// A `cup-pos` request from terminal `tid` with STAN `stan`, framed.
fn pos_request(spec: &Spec, tid: u32, stan: u32) -> Vec<u8> {
    let mut d = samples::purchase(spec);
    d.set_text(11, format!("{:06}", stan % 1_000_000));
    d.set_text(41, format!("T{tid:07}"));
    let payload = spec.encode(&d).expect("encode a purchase");
    let mut out = bytes::BytesMut::new();
    spec.framing()
        .prefix
        .encode(payload.len(), &mut out)
        .expect("prefix");
    out.extend_from_slice(&payload);
    out.to_vec()
}

fn vm_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A client that connects, writes 50,000 requests and never reads cannot hurt
/// the others: a NAC running beside it gets every request answered by a node,
/// and the switch's memory stays bounded.
///
/// Fails today: the hog alone holds ~11,000 requests in flight in the node
/// queues, so the NAC's requests wait seconds behind them (answers after the
/// NAC's 5 s timeout: counted unanswered and mismatched), the nodes' health
/// echoes time out behind the same queues and all three nodes are ejected.
/// The per-connection fair share (`max_in_flight_per_connection`) keeps it
/// to its share; health counts only the nodes' own faults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_cannot_hurt_the_others() {
    within(Duration::from_secs(120), async {
        let (_nodes, addrs) = start_nodes("cup-pos", 3, "0..5ms").await;
        let listen = free_addr();
        let switch = start_switch("noread-switch", &pos_config(listen, &addrs, "3s"), listen).await;
        let spec = Arc::new(Spec::builtin("cup-pos").expect("cup-pos"));
        let mut hog = TcpStream::connect(listen).await.expect("connect");
        let writer = tokio::spawn(async move {
            for stan in 0..50_000u32 {
                let frame = pos_request(&spec, 9_000_000 + stan / 1000, stan);
                if hog.write_all(&frame).await.is_err() {
                    break;
                }
            }
            // Keep it open, unread, until the test ends.
            hog
        });
        let report = start_nac("noread-nac", listen, 200, "3s").report().await;
        assert_exactly_once(&report);
        assert_eq!(
            n(&report, "declined"),
            0,
            "the other client was harmed: {report}"
        );
        let peak_kib = vm_kib(switch.pid(), "VmHWM:");
        eprintln!("NAC beside a client that never reads: {report}; switch peak RSS {peak_kib} KiB");
        assert!(peak_kib < 256 * 1024, "switch peak RSS {peak_kib} KiB");
        writer.abort();
    })
    .await;
}

/// Ctrl-C while the switch is still starting (held at its store's open by
/// another process's write lock, as a long migration would hold it) stops
/// it once it has started, even when SIGINT came in ignored, as it does to
/// a switch a script starts with `&`. The switch used to listen for it only
/// from its main loop on: such a signal was lost and the switch ran on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_startup_stops_the_switch_once_started() {
    within(Duration::from_secs(60), async {
        let name = "startup-int";
        let data = data_dir(name);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&data)
            .expect("data dir");
        let db = std::path::Path::new(&data).join("isoswitch.db");
        let lock = rusqlite::Connection::open(&db).expect("open the store's file");
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600)).expect("0600");
        lock.execute_batch("BEGIN EXCLUSIVE")
            .expect("hold the write lock");
        let listen = free_addr();
        let config = write_config(name, &pos_config(listen, &[free_addr()], "1s"));
        let config = config.to_string_lossy();
        let switch =
            Proc::spawn_ignoring_sigint(name, &["run", "--config", &config, "--data-dir", &data]);
        // Once the switch has its own handler (the store still locked, so
        // it is still starting), Ctrl-C.
        // SIGINT (2) in a signal set of /proc/PID/status: SigCgt (caught),
        // ShdPnd (sent to the process, not yet delivered).
        let sigint_in = |pid: u32, set: &str| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status
                .lines()
                .find_map(|l| l.strip_prefix(set)?.strip_prefix(':'))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .is_some_and(|mask| mask & (1 << (2 - 1)) != 0)
        };
        let caught = |pid: u32| sigint_in(pid, "SigCgt");
        let mut waited = 0;
        while !caught(switch.pid()) && waited < 300 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            waited += 1;
        }
        assert!(
            caught(switch.pid()),
            "the switch did not listen for Ctrl-C while it was starting"
        );
        assert!(
            std::net::TcpStream::connect(listen).is_err(),
            "the switch is still starting"
        );
        switch.signal("INT");
        // Delivered to the switch's handler while the store is still locked.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while sigint_in(switch.pid(), "ShdPnd") {
            assert!(
                tokio::time::Instant::now() < deadline,
                "SIGINT still pending at the switch"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        lock.execute_batch("COMMIT").expect("let the store open");
        drop(lock);
        let finished = tokio::time::timeout(Duration::from_secs(20), switch.finish())
            .await
            .expect("the switch stops after it has started, on the Ctrl-C it got while starting");
        assert!(finished.0.success(), "switch exit: {}", finished.0);
    })
    .await;
}

/// SIGTERM to the switch under load: every request written before the signal
/// is answered exactly once (by its node, or declined `shutdown` if the
/// switch read it after the signal); requests written during the drain are
/// declined `shutdown` at once; then the switch closes the link and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_drains_then_closes() {
    within(Duration::from_secs(90), async {
        // Slow nodes keep requests in flight across the signal.
        let (_nodes, addrs) = start_nodes("cup-pos", 2, "1000..1500ms").await;
        let listen = free_addr();
        let switch = start_switch("term-switch", &pos_config(listen, &addrs, "5s"), listen).await;
        let spec = Arc::new(Spec::builtin("cup-pos").expect("cup-pos"));
        let stream = TcpStream::connect(listen).await.expect("connect");
        let (read, mut write) = stream.into_split();
        let reader = tokio::spawn(read_answers(Arc::clone(&spec), read));
        // Before the signal: 200 requests, written.
        let mut stan = 0u32;
        for _ in 0..200 {
            stan += 1;
            write
                .write_all(&pos_request(&spec, 1, stan))
                .await
                .expect("write");
            // Pacing, not a wait: a terminal's steady stream of requests.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let before = stan;
        switch.signal("TERM");
        // During the drain: one request every 10 ms until the link closes.
        while !reader.is_finished() && stan < before + 2000 {
            stan += 1;
            if write.write_all(&pos_request(&spec, 1, stan)).await.is_err() {
                break;
            }
            // Pacing, not a wait: requests keep coming through the drain.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let answers = reader.await.expect("reader");
        let (status, _) = switch.finish().await;
        assert!(status.success(), "switch exit: {status}");
        let mut shutdown_declines = 0;
        for s in 1..=before {
            let got = answers.get(&s).map(Vec::as_slice).unwrap_or_default();
            assert_eq!(got.len(), 1, "request {s}, written before SIGTERM: {got:?}");
            assert!(
                got[0] == "00" || got[0] == "92",
                "request {s}: F39 {}",
                got[0]
            );
        }
        for s in before + 1..=stan {
            let got = answers.get(&s).map(Vec::as_slice).unwrap_or_default();
            assert!(got.len() <= 1, "request {s} answered twice: {got:?}");
            if got.first().is_some_and(|c| c == "92") {
                shutdown_declines += 1;
            }
        }
        eprintln!(
            "SIGTERM: {before} requests before, {} during the drain, {shutdown_declines} declined for shutdown",
            stan - before
        );
        assert!(shutdown_declines > 0, "no request declined for shutdown");
        assert!(
            answers.keys().all(|s| *s <= stan),
            "answers to requests never sent"
        );
    })
    .await;
}

/// Reads answers until the switch closes the link: F39 by STAN.
async fn read_answers(
    spec: Arc<Spec>,
    mut read: tokio::net::tcp::OwnedReadHalf,
) -> HashMap<u32, Vec<String>> {
    use tokio_util::codec::Decoder;
    let mut codec =
        isoswitch::wire::FrameCodec::new(spec.framing().prefix, spec.framing().max_frame);
    let mut buf = bytes::BytesMut::new();
    let mut answers: HashMap<u32, Vec<String>> = HashMap::new();
    loop {
        while let Ok(Some(frame)) = codec.decode(&mut buf) {
            let isoswitch::wire::Frame::Message(p) = frame else {
                continue;
            };
            let Ok(m) = Message::parse(&spec, p) else {
                continue;
            };
            let text = |id| {
                m.field(id)
                    .ok()
                    .flatten()
                    .map(|f| {
                        String::from_utf8_lossy(&f.logical().collect::<Vec<u8>>()).into_owned()
                    })
                    .unwrap_or_default()
            };
            let stan = text(11).parse().unwrap_or(u32::MAX);
            answers.entry(stan).or_default().push(text(39));
        }
        match read.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return answers,
            Ok(_) => {}
        }
    }
}

/// Bad requests in the flood of the poison case.
const FLOOD: u32 = 3_000;

/// A POS 0200 whose F55 length runs past the end of the message: its key
/// fields (TPDU, F11, F41) read fine, the rest does not.
fn poison_request(spec: &Spec, tid: u32, stan: u32) -> Vec<u8> {
    let mut d = samples::purchase(spec);
    d.set_text(11, format!("{:06}", stan % 1_000_000));
    d.set_text(41, format!("T{tid:07}"));
    let mut payload = spec.encode(&d).expect("encode a purchase");
    let at = Message::parse(spec, bytes::Bytes::from(payload.clone()))
        .expect("parses")
        .field(55)
        .expect("walks to F55")
        .expect("F55 present")
        .prefix_at();
    // LLL as two BCD bytes: 0999, far past the end.
    payload[at] = 0x09;
    payload[at + 1] = 0x99;
    let mut out = bytes::BytesMut::new();
    spec.framing()
        .prefix
        .encode(payload.len(), &mut out)
        .expect("prefix");
    out.extend_from_slice(&payload);
    out.to_vec()
}

/// The poison case with real processes: while a NAC runs at 100 req/s
/// against three nodes, one terminal sends 30 requests broken after their key
/// fields and another connection floods 3,000 more. Every poison request is
/// declined 30 once, none reaches a node, no healthy node is ejected, the NAC
/// loses nothing and gets no decline, and the switch's log stays small
/// (warnings rate-limited per kind and peer, not one per bad frame).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_burst_during_a_nac_run_costs_no_good_request() {
    within(Duration::from_secs(90), async {
        let (_nodes, addrs) = start_nodes("cup-pos", 3, "0..20ms").await;
        let listen = free_addr();
        let (admin, admin_toml) = admin_toml("poison-switch");
        let toml = format!("{admin_toml}{}", pos_config(listen, &addrs, "3s"));
        let switch = start_switch("poison-switch", &toml, listen).await;
        let spec = Arc::new(Spec::builtin("cup-pos").expect("cup-pos"));
        let nac = start_nac("poison-nac", listen, 100, "4s");

        let (read, mut terminal) = TcpStream::connect(listen)
            .await
            .expect("connect")
            .into_split();
        let terminal_answers = tokio::spawn(read_answers(Arc::clone(&spec), read));
        let (read, mut flood) = TcpStream::connect(listen)
            .await
            .expect("connect")
            .into_split();
        let flood_answers = tokio::spawn(read_answers(Arc::clone(&spec), read));
        // The poison goes in while the NAC's run is under way.
        wait_metric_sum(admin, "isoswitch_service_requests", &[], 50.0).await;
        for stan in 1..=30u32 {
            terminal
                .write_all(&poison_request(&spec, 66, stan))
                .await
                .expect("write");
            // Pacing, not a wait: the poison spread over the NAC's run.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Fewer than the client's write queue (4096): however slowly its reader
        // runs, no decline is dropped for a full queue.
        for stan in 1..=FLOOD {
            flood
                .write_all(&poison_request(&spec, 77, stan))
                .await
                .expect("write");
        }

        let report = nac.report().await;
        assert_exactly_once(&report);
        assert_eq!(
            n(&report, "declined"),
            0,
            "no good request declined: {report}"
        );
        switch.signal("TERM");
        let log = switch.log.clone();
        let (status, _) = switch.finish().await;
        assert!(status.success(), "switch exit: {status}");

        let terminal_answers = terminal_answers.await.expect("reader");
        for stan in 1..=30u32 {
            assert_eq!(
                terminal_answers.get(&stan).map(Vec::as_slice),
                Some(&["30".to_string()][..]),
                "poison request {stan} declined 30, once"
            );
        }
        let flood_answers = flood_answers.await.expect("reader");
        let flood_declined = flood_answers
            .values()
            .filter(|v| v == &&["30".to_string()])
            .count();
        assert_eq!(
            flood_declined, FLOOD as usize,
            "every flood request declined 30, once"
        );

        let log = std::fs::read_to_string(&log).expect("switch log");
        let bad_lines = log
            .lines()
            .filter(|l| l.contains("bad request from client"))
            .count();
        let ejections = log.lines().filter(|l| l.contains("Ejected")).count();
        eprintln!(
            "poison: {bad_lines} bad-request log lines for {} bad requests; {} bytes of log",
            FLOOD + 30,
            log.len()
        );
        assert!(bad_lines <= 60, "{bad_lines} log lines: not rate-limited");
        assert!(log.contains("suppressed"), "the suppressed count is logged");
        assert_eq!(ejections, 0, "no healthy node ejected");
    })
    .await;
}
