//! End-to-end: operating a live switch through its admin API, under NAC load,
//! over real sockets on 127.0.0.1.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use isoswitch::cli::ctl::request;
use isoswitch::config::{AdminConfig, Config};
use isoswitch::iso8583::Spec;
use isoswitch::ops::run::Switch;
use isoswitch::ops::status::{ConnectionView, Status};
use isoswitch::route::DeclineReason;
use isoswitch::sim::nac::{self, NacReport, NacSimConfig};
use isoswitch::sim::node::{Delay, NodeSim, NodeSimConfig};

const TOKEN: &str = "test-token-0123456789abcdef";
/// Every test's own deadline.
const TEST_LIMIT: Duration = Duration::from_secs(60);

/// A temp file unique to this test process and `name`.
fn temp_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("isoswitch-admin-{}-{name}", std::process::id()));
    std::fs::write(&path, text).expect("write temp file");
    path
}

fn admin_config(test: &str) -> AdminConfig {
    AdminConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        token_file: Some(temp_file(&format!("{test}.token"), &format!("{TOKEN}\n"))),
        ..AdminConfig::default()
    }
}

struct Api {
    base: String,
}

impl Api {
    fn of(switch: &Switch) -> Api {
        Api {
            base: format!("http://{}", switch.admin_addr().expect("admin listener")),
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<String>) -> (u16, String) {
        request(&self.base, method, path, Some(TOKEN), body)
            .await
            .expect("admin API reachable")
    }

    async fn ok(&self, method: &str, path: &str, body: Option<String>) -> String {
        let (status, text) = self.call(method, path, body).await;
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {text}"
        );
        text
    }

    async fn status(&self) -> Status {
        serde_json::from_str(&self.ok("GET", "/api/v1/status", None).await).unwrap()
    }

    async fn connection_ids(&self) -> Vec<u64> {
        let rows: Vec<ConnectionView> =
            serde_json::from_str(&self.ok("GET", "/api/v1/connections", None).await).unwrap();
        let mut ids: Vec<u64> = rows.iter().map(|r| r.id).collect();
        ids.sort_unstable();
        ids
    }

    async fn node(&self, node: &str, action: &str) {
        self.ok(
            "POST",
            &format!("/api/v1/services/svc/nodes/{node}/{action}"),
            None,
        )
        .await;
    }
}

async fn node_sim(spec: &Arc<Spec>, id: &str, delay: Delay) -> NodeSim {
    let cfg = NodeSimConfig {
        id: id.into(),
        delay,
        fail_rate: 0.0,
        originate: None,
    };
    NodeSim::start("127.0.0.1:0".parse().unwrap(), Arc::clone(spec), cfg)
        .await
        .expect("node starts")
}

/// `n` nodes answering after `delay` behind a `cup-pos` listen service with
/// the admin API on (its token file named after `test`).
async fn admin_rig(
    spec: &Arc<Spec>,
    n: usize,
    delay: Delay,
    test: &str,
) -> (Vec<NodeSim>, isoswitch::ops::run::Switch) {
    let nodes = start_nodes(spec, n, delay).await;
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let mut cfg = Rig::on("cup-pos").config(&addrs);
    cfg.admin = Some(admin_config(test));
    let switch = start_switch(&cfg).await;
    (nodes, switch)
}

fn nac_load(
    spec: &Arc<Spec>,
    target: SocketAddr,
    seconds: u64,
) -> tokio::task::JoinHandle<NacReport> {
    let spec = Arc::clone(spec);
    tokio::spawn(async move {
        nac::run(
            spec,
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
        .expect("NAC runs")
    })
}

fn requests_of(node: &NodeSim) -> u64 {
    node.stats.requests.load(Ordering::Relaxed)
}

/// The value of the sample `name{labels}` in a Prometheus exposition.
fn sample(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {name_and_labels} in\n{text}"))
}

/// The issue's acceptance run: under NAC load, drain node 02 (no new
/// requests, in-flight answered, no declines), enable it (traffic returns),
/// disable node 03 (its in-flight declined at once), add node 04 (takes
/// traffic), remove node 01 (nothing lost); at the end every request got one
/// answer and /metrics agrees with the NAC's own counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_drained_disabled_enabled_added_and_removed_under_load() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let delay = Delay::parse("50ms..150ms").unwrap();
        let (nodes, switch) = admin_rig(&spec, 3, delay, "control").await;
        let svc = service(&switch).clone();
        wait_connected(&svc, 2).await;
        let api = Api::of(&switch);
        let load = nac_load(&spec, front(&switch), 8);

        // Drain 02 while it has requests in flight.
        wait_until("node 02 busy", || svc.pool.outstanding(1) > 0).await;
        api.node("02", "drain").await;
        assert_eq!(api.status().await.services[0].nodes[1].state, "draining");
        wait_until("node 02 in-flight answered", || {
            svc.pool.outstanding(1) == 0
        })
        .await;
        let drained_at = requests_of(&nodes[1]);
        let sent_at = sent(&svc, 1);
        // Traffic goes on to the others meanwhile; none of it to 02.
        let others = || sent(&svc, 0) + sent(&svc, 2);
        let others_at = others();
        wait_until("20 more requests to nodes 01 and 03", || {
            others() >= others_at + 20
        })
        .await;
        assert_eq!(
            requests_of(&nodes[1]),
            drained_at,
            "no new request reaches a draining node"
        );
        assert_eq!(sent(&svc, 1), sent_at);
        assert_eq!(svc.counters.declined_total(), 0, "a drain declines nothing");

        // Enable: traffic returns.
        api.node("02", "enable").await;
        wait_until("node 02 takes traffic again", || {
            requests_of(&nodes[1]) > drained_at + 10
        })
        .await;

        // Disable 03: its in-flight requests are declined at once.
        wait_until("node 03 busy", || svc.pool.outstanding(2) > 0).await;
        api.node("03", "disable").await;
        assert_eq!(
            svc.pool.outstanding(2),
            0,
            "disable declines the node's in-flight at once"
        );
        let declined_by_disable = svc.counters.declined(DeclineReason::Shutdown);
        assert!(declined_by_disable > 0);
        let disabled_at = requests_of(&nodes[2]);
        api.node("03", "enable").await;
        wait_until("node 03 takes traffic again", || {
            requests_of(&nodes[2]) > disabled_at + 10
        })
        .await;

        // Add 04: it takes traffic.
        let added = node_sim(&spec, "04", delay).await;
        let body = format!("{{\"id\": \"04\", \"address\": \"{}\"}}", added.addr);
        let (code, text) = api
            .call("POST", "/api/v1/services/svc/nodes", Some(body))
            .await;
        assert_eq!(code, 201, "{text}");
        wait_until("node 04 takes traffic", || requests_of(&added) > 10).await;

        // Remove 01: drained, then gone; nothing lost.
        api.ok("DELETE", "/api/v1/services/svc/nodes/01", None)
            .await;
        let status = api.status().await;
        assert_eq!(status.services[0].nodes[0].state, "removed");
        let removed_at = requests_of(&nodes[0]);
        assert_eq!(svc.pool.outstanding(0), 0);
        wait_until("node 01 links closed", || {
            svc.pool.nodes()[0].live_conns() == 0
        })
        .await;

        let report = load.await.unwrap();
        println!("{report}");
        assert_eq!(
            requests_of(&nodes[0]),
            removed_at,
            "a removed node gets nothing"
        );
        assert!(report.sent > 500, "{report}");
        assert_eq!(report.unanswered, 0, "{report}");
        assert_eq!(report.mismatched, 0, "{report}");
        assert_eq!(report.uplinks_lost, 0, "{report}");
        assert_eq!(report.answered + report.declined, report.sent, "{report}");
        assert_eq!(
            report.declined, declined_by_disable,
            "only the disable declined: {report}"
        );

        // The metrics agree with the NAC's own counts.
        let (code, text) = request(&api.base, "GET", "/metrics", None, None)
            .await
            .unwrap();
        assert_eq!(code, 200);
        let svc_label = "{service=\"svc\"}";
        assert_eq!(
            sample(
                &text,
                &format!("isoswitch_service_requests_total{svc_label}")
            ),
            report.sent as f64
        );
        assert_eq!(
            sample(
                &text,
                &format!("isoswitch_service_responses_total{svc_label}")
            ),
            report.answered as f64
        );
        assert_eq!(
            sample(
                &text,
                "isoswitch_service_declines_total{service=\"svc\",reason=\"shutdown\"}"
            ),
            report.declined as f64
        );
        let per_node: f64 = ["01", "02", "03", "04"]
            .iter()
            .map(|id| {
                sample(
                    &text,
                    &format!("isoswitch_server_responses_total{{service=\"svc\",server=\"{id}\"}}"),
                )
            })
            .sum();
        assert_eq!(per_node, report.answered as f64);
        assert_eq!(
            sample(
                &text,
                "isoswitch_server_response_time_seconds_count{service=\"svc\",server=\"02\"}"
            ),
            sample(
                &text,
                "isoswitch_server_responses_total{service=\"svc\",server=\"02\"}"
            )
        );
        assert_eq!(
            sample(
                &text,
                "isoswitch_server_state{service=\"svc\",server=\"01\",state=\"removed\"}"
            ),
            1.0
        );
        switch.stop().await;
        added.stop().await;
    })
    .await
    .expect("test within its time limit");
}

/// Every endpoint refuses a missing or wrong token (401), except the open
/// paths; bad input gets 400 with the reason; unknown names 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_bad_input_are_refused_with_the_reason() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let (_nodes, switch) = admin_rig(&spec, 2, Delay::NONE, "auth").await;
        wait_connected(service(&switch), 2).await;
        let api = Api::of(&switch);
        let guarded = [
            ("GET", "/"),
            ("POST", "/readyz"),
            ("DELETE", "/metrics"),
            ("GET", "/api/v1/status"),
            ("GET", "/api/v1/connections"),
            ("POST", "/api/v1/reload"),
            ("POST", "/api/v1/services/svc/nodes"),
            ("DELETE", "/api/v1/services/svc/nodes/01"),
            ("POST", "/api/v1/services/svc/nodes/01/drain"),
            ("POST", "/api/v1/services/svc/nodes/01/disable"),
            ("POST", "/api/v1/services/svc/nodes/01/enable"),
        ];
        for (method, path) in guarded {
            for token in [None, Some("wrong-token-0123456789abcdef"), Some("")] {
                let (code, body) = request(&api.base, method, path, token, None).await.unwrap();
                assert_eq!(code, 401, "{method} {path} with {token:?}: {body}");
                assert!(body.contains("token"), "{body}");
            }
        }
        for path in ["/healthz", "/readyz", "/metrics"] {
            let (code, _) = request(&api.base, "GET", path, None, None).await.unwrap();
            assert_eq!(code, 200, "{path} is open");
        }
        // Nothing changed: node 01 still up.
        assert_eq!(api.status().await.services[0].nodes[0].state, "up");

        let (code, body) = api
            .call("POST", "/api/v1/services/svc/nodes/01/explode", None)
            .await;
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("expected drain, disable or enable"), "{body}");
        let (code, body) = api
            .call(
                "POST",
                "/api/v1/services/svc/nodes",
                Some("{\"id\": 4}".into()),
            )
            .await;
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("body:"), "{body}");
        let (code, body) = api
            .call(
                "POST",
                "/api/v1/services/svc/nodes",
                Some("{\"id\": \"04\", \"address\": \"nowhere\"}".into()),
            )
            .await;
        assert_eq!(code, 400, "{body}");
        let (code, body) = api
            .call(
                "POST",
                "/api/v1/services/svc/nodes",
                Some("{\"id\": \"\", \"address\": \"127.0.0.1:1\"}".into()),
            )
            .await;
        assert_eq!(code, 400, "{body}");
        let (code, body) = api
            .call(
                "POST",
                "/api/v1/services/svc/nodes",
                Some("{\"id\": \"01\", \"address\": \"127.0.0.1:1\"}".into()),
            )
            .await;
        assert_eq!(code, 409, "a node ID in use: {body}");
        let (code, body) = api
            .call("POST", "/api/v1/services/nope/nodes/01/drain", None)
            .await;
        assert_eq!(code, 404, "{body}");
        assert!(body.contains("no service `nope`"), "{body}");
        let (code, body) = api
            .call("POST", "/api/v1/services/svc/nodes/09/drain", None)
            .await;
        assert_eq!(code, 404, "{body}");
        let (code, body) = api.call("POST", "/api/v1/reload", None).await;
        assert_eq!(code, 400, "no file to reload: {body}");
        let (code, body) = api.call("GET", "/readyz", None).await;
        assert_eq!(code, 200, "{body}");
        let sup = Arc::clone(&switch.handle().supervisor);
        switch.stop().await;
        assert_eq!(sup.restarts(), 0, "a clean stop restarts nothing");
    })
    .await
    .expect("test within its time limit");
}

/// Open paths are read-only: even a path that changes the switch listed in
/// `open_paths` (config load refuses that; a config built in code does not
/// pass through it) wants the token, and so does any method but GET on an
/// open path. Every change wants `Content-Type: application/json` (415
/// otherwise), body or not: a browser's cross-site form post cannot add a
/// node or disable one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_paths_only_read_and_changes_want_json() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 2, Delay::NONE).await;
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let mut cfg = Rig::on("cup-pos").config(&addrs);
        let mut admin = admin_config("open");
        admin.open_paths = vec![
            "/metrics".into(),
            "/api/v1/services/svc/nodes/01/disable".into(),
            "/api/v1/reload".into(),
        ];
        cfg.admin = Some(admin);
        let switch = start_switch(&cfg).await;
        wait_connected(service(&switch), 2).await;
        let api = Api::of(&switch);
        let addr = switch.admin_addr().unwrap();
        let json = ("Content-Type", "application/json");
        for (method, path) in [
            ("POST", "/api/v1/services/svc/nodes/01/disable"),
            ("POST", "/api/v1/reload"),
            ("POST", "/metrics"),
            ("PUT", "/metrics"),
        ] {
            let (code, body) = raw_http(addr, method, path, &[json], "").await;
            assert_eq!(code, 401, "{method} {path} without the token: {body}");
        }
        let bearer = format!("Bearer {TOKEN}");
        let auth = ("Authorization", bearer.as_str());
        let disable = "/api/v1/services/svc/nodes/01/disable";
        for headers in [vec![auth], vec![auth, ("Content-Type", "text/plain")]] {
            let (code, body) = raw_http(addr, "POST", disable, &headers, "").await;
            assert_eq!(code, 415, "{headers:?}: {body}");
            assert!(body.contains("application/json"), "{body}");
        }
        // A cross-site form post: a JSON body sent as text/plain.
        let node = r#"{"id": "66", "address": "127.0.0.1:6666"}"#;
        for content_type in ["text/plain", "application/x-www-form-urlencoded"] {
            let headers = [auth, ("Content-Type", content_type)];
            let (code, body) =
                raw_http(addr, "POST", "/api/v1/services/svc/nodes", &headers, node).await;
            assert_eq!(code, 415, "{content_type}: {body}");
        }
        let (code, body) =
            raw_http(addr, "DELETE", "/api/v1/services/svc/nodes/02", &[auth], "").await;
        assert_eq!(code, 415, "{body}");
        let status = api.status().await;
        assert_eq!(status.services[0].nodes.len(), 2, "no node added");
        assert!(
            status.services[0].nodes.iter().all(|n| n.state == "up"),
            "nothing changed: {status:?}"
        );
        // With both, the change applies (a charset parameter is fine).
        let headers = [auth, ("Content-Type", "application/json; charset=utf-8")];
        let (code, body) = raw_http(addr, "POST", disable, &headers, "").await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(api.status().await.services[0].nodes[0].state, "disabled");
        // A node ID that would break a metrics label is refused.
        let (code, body) = api
            .call(
                "POST",
                "/api/v1/services/svc/nodes",
                Some(r#"{"id": "x\",y=\"z", "address": "127.0.0.1:6666"}"#.into()),
            )
            .await;
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("a letter, a digit"), "{body}");
        switch.stop().await;
    })
    .await
    .expect("test within its time limit");
}

/// Slow admin clients are cut: one that sends nothing after
/// `header_timeout`, one that sends its body too slowly after
/// `request_timeout` (503), and a kept-alive connection after
/// `max_requests_per_connection` requests (the last answer says close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_admin_clients_are_cut_and_keep_alive_is_capped() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 1, Delay::NONE).await;
        let mut cfg = Rig::on("cup-pos").config(&[nodes[0].addr]);
        let mut admin = admin_config("slow");
        admin.header_timeout = Duration::from_millis(300);
        admin.request_timeout = Duration::from_millis(500);
        admin.max_requests_per_connection = 2;
        cfg.admin = Some(admin);
        let switch = start_switch(&cfg).await;
        let addr = switch.admin_addr().unwrap();
        let read_all = |mut s: tokio::net::TcpStream| async move {
            let mut text = Vec::new();
            let _ = s.read_to_end(&mut text).await;
            String::from_utf8_lossy(&text).into_owned()
        };

        let idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert_eq!(read_all(idle).await, "", "cut without an answer");

        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /api/v1/services/svc/nodes HTTP/1.1\r\nHost: x\r\n\
             Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\
             Content-Length: 100\r\n\r\n{{"
        );
        slow.write_all(head.as_bytes()).await.unwrap();
        let answer = read_all(slow).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("admin.request_timeout"), "{answer}");

        let mut kept = tokio::net::TcpStream::connect(addr).await.unwrap();
        let get = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".repeat(3);
        kept.write_all(get.as_bytes()).await.unwrap();
        let answer = read_all(kept).await;
        assert_eq!(
            answer.matches("HTTP/1.1 200").count(),
            2,
            "two answers, then the connection closes: {answer}"
        );
        assert!(answer.contains("connection: close"), "{answer}");
        switch.stop().await;
    })
    .await
    .expect("test within its time limit");
}

/// A node added through the API runs on the switch's runtime: when the
/// admin thread ends (killed here, then restarted by the supervisor) the
/// node keeps being served and the NAC loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_through_the_api_outlives_the_admin_thread() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let delay = Delay::parse("1ms..5ms").unwrap();
        let (_nodes, switch) = admin_rig(&spec, 2, delay, "outlive").await;
        let svc = service(&switch).clone();
        wait_connected(&svc, 2).await;
        let api = Api::of(&switch);
        let load = nac_load(&spec, front(&switch), 6);
        let added = node_sim(&spec, "04", delay).await;
        let body = format!("{{\"id\": \"04\", \"address\": \"{}\"}}", added.addr);
        let (code, text) = api
            .call("POST", "/api/v1/services/svc/nodes", Some(body))
            .await;
        assert_eq!(code, 201, "{text}");
        api.node("01", "drain").await;
        wait_until("node 04 takes traffic", || requests_of(&added) > 10).await;

        let sup = Arc::clone(&switch.handle().supervisor);
        assert_eq!(sup.kill("admin"), 1, "the admin thread's task");
        wait_until("admin restarted", || sup.restarts() == 1).await;
        let after_kill = requests_of(&added);
        wait_until("node 04 still served", || {
            requests_of(&added) > after_kill + 50
        })
        .await;
        assert_eq!(
            api.status().await.services[0].nodes[2].state,
            "up",
            "the restarted admin thread answers"
        );
        let report = load.await.unwrap();
        assert_eq!(report.unanswered, 0, "{report}");
        assert_eq!(report.declined, 0, "{report}");
        assert_eq!(report.answered, report.sent, "{report}");
        switch.stop().await;
        added.stop().await;
    })
    .await
    .expect("test within its time limit");
}

fn file_config(
    nodes: &[SocketAddr],
    weight_02: u32,
    listen: &str,
    token_file: &std::path::Path,
) -> String {
    let mut toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"{}\"\n\
         [[service]]\nname = \"svc\"\nspec = \"cup-pos\"\n\
         [service.front]\nkind = \"listen\"\nlisten = \"{listen}\"\n\
         [service.back]\nalgorithm = \"weighted\"\n",
        token_file.display()
    );
    for (i, addr) in nodes.iter().enumerate() {
        let weight = if i == 1 { weight_02 } else { 1 };
        toml.push_str(&format!(
            "[[service.back.node]]\nid = \"{:02}\"\naddress = \"{addr}\"\nweight = {weight}\n",
            i + 1
        ));
    }
    toml
}

/// Reloading a weight change closes no client link and no node link (the
/// connection IDs before and after are the same) and moves traffic; an
/// invalid file or a change that needs a restart is refused and the old
/// config keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_a_weight_change_without_closing_links() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 3, Delay::parse("1ms..5ms").unwrap()).await;
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let token = temp_file("reload.token", TOKEN);
        let path = temp_file(
            "reload.toml",
            &file_config(&addrs, 1, "127.0.0.1:0", &token),
        );
        let cfg = Config::load(&path).unwrap();
        let switch = start_switch(&cfg).await;
        switch.set_source(Some(path.clone()));
        let svc = service(&switch).clone();
        wait_connected(&svc, 2).await;
        let api = Api::of(&switch);
        let load = nac_load(&spec, front(&switch), 4);
        wait_until("clients connected", || {
            svc.links
                .table
                .count(isoswitch::link::conns::ConnKind::Client)
                == 2
        })
        .await;
        let before = api.connection_ids().await;
        assert_eq!(
            before.len(),
            2 + 3 * 2,
            "2 client links, 3 nodes × 2 links: {before:?}"
        );

        // Invalid: refused with the key, the old config stays.
        std::fs::write(
            &path,
            file_config(&addrs, 0, "127.0.0.1:0", &token)
                .replace("algorithm = \"weighted\"", "algorithm = \"fastest\""),
        )
        .unwrap();
        let (code, body) = api.call("POST", "/api/v1/reload", None).await;
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("fastest"), "{body}");
        // A listen address change: restart needed.
        std::fs::write(&path, file_config(&addrs, 1, "127.0.0.1:1", &token)).unwrap();
        let (code, body) = api.call("POST", "/api/v1/reload", None).await;
        assert_eq!(code, 409, "{body}");
        assert!(
            body.contains("front.listen") && body.contains("restart needed"),
            "{body}"
        );

        // A weight change applies live.
        std::fs::write(&path, file_config(&addrs, 8, "127.0.0.1:0", &token)).unwrap();
        let body = api.ok("POST", "/api/v1/reload", None).await;
        assert!(body.contains("node 02 weight 1 -> 8"), "{body}");
        assert_eq!(api.status().await.services[0].nodes[1].weight, 8);
        let at_reload: Vec<u64> = (0..3).map(|i| sent(&svc, i)).collect();
        wait_until("node 02 takes 8 shares", || {
            let d: Vec<u64> = (0..3).map(|i| sent(&svc, i) - at_reload[i]).collect();
            d[1] > 200 && d[1] > 5 * d[0].max(d[2])
        })
        .await;
        let after = api.connection_ids().await;
        assert_eq!(before, after, "no link closed by the reload");
        let report = load.await.unwrap();
        assert_eq!(report.answered, report.sent, "{report}");
        assert_eq!(report.uplinks_lost, 0, "{report}");
        switch.stop().await;
    })
    .await
    .expect("test within its time limit");
}

/// A reload changes the request timeout and the decline codes for the
/// requests that come after it, without a restart and without closing links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_timeouts_and_decline_codes_live() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        // One node that answers after 2 s: with a 5 s timeout it answers, with
        // 300 ms the switch declines first.
        let nodes = start_nodes(&spec, 1, Delay::parse("2s").unwrap()).await;
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let token = temp_file("live.token", TOKEN);
        let base = file_config(&addrs, 1, "127.0.0.1:0", &token);
        let with = |extra: &str| format!("{base}{extra}");
        let path = temp_file("live.toml", &with("[service.timeouts]\nrequest = \"5s\"\n"));
        let cfg = Config::load(&path).unwrap();
        let switch = start_switch(&cfg).await;
        switch.set_source(Some(path.clone()));
        let svc = service(&switch).clone();
        wait_connected(&svc, 2).await;
        let api = Api::of(&switch);
        let before = api.connection_ids().await;

        // Also a new in-flight share for clients that connect from now on.
        let limited = with(
            "[service.timeouts]\nrequest = \"300ms\"\n[service.declines]\ntimeout = \"N7\"\n\
             [service.correlation]\nmax_in_flight = 5000\n\
             [service.back.health]\ninterval = \"700ms\"\ntimeout = \"600ms\"\n",
        )
        .replace(
            "kind = \"listen\"\n",
            "kind = \"listen\"\nmax_in_flight_per_connection = 1\n",
        );
        std::fs::write(&path, limited).unwrap();
        let body = api.ok("POST", "/api/v1/reload", None).await;
        assert!(body.contains("timeouts.request"), "{body}");
        assert_eq!(
            svc.live().timeouts.default_timeout().after,
            Duration::from_millis(300)
        );
        assert_eq!(
            (svc.live().check_interval, svc.live().check_timeout),
            (Duration::from_millis(700), Duration::from_millis(600)),
            "health-check timing from the next check"
        );

        let mut c = RawClient::connect(front(&switch), &spec).await;
        let mut d = isoswitch::iso8583::samples::purchase(&spec);
        d.set_text(11, "000777");
        c.send_raw(&RawClient::frame(&spec, &spec.encode(&d).unwrap()))
            .await;
        // A second request while the first is in flight: over the new share
        // of 1, declined queue-full at once.
        d.set_text(11, "000778");
        c.send_raw(&RawClient::frame(&spec, &spec.encode(&d).unwrap()))
            .await;
        let over = c.recv().await.expect("declined over its share");
        assert_eq!(
            spec.decode(&over).unwrap().get(39).cloned(),
            Some(isoswitch::iso8583::Value::text("96")),
            "the new in-flight share"
        );
        let answer = c.recv().await.expect("declined at the new timeout");
        let f39 = spec.decode(&answer).unwrap().get(39).cloned();
        assert_eq!(
            f39,
            Some(isoswitch::iso8583::Value::text("N7")),
            "the new timeout and its new code"
        );
        assert_eq!(
            api.connection_ids().await.len(),
            before.len() + 1,
            "no link closed"
        );
        // The connection table counts the client's traffic both ways.
        let rows: Vec<ConnectionView> =
            serde_json::from_str(&api.ok("GET", "/api/v1/connections", None).await).unwrap();
        let client = rows
            .iter()
            .find(|r| r.kind == "client")
            .expect("the client's row");
        assert_eq!(
            (client.messages_in, client.messages_out),
            (2, 2),
            "{client:?}"
        );
        assert!(client.bytes_in > 0 && client.bytes_out > 0, "{client:?}");
        assert_eq!(client.in_flight, Some(0), "{client:?}");
        let metrics = api.ok("GET", "/metrics", None).await;
        assert!(
            metrics.contains("isoswitch_service_bytes_total{service=\"svc\",direction=\"in\"}"),
            "{metrics}"
        );
        switch.stop().await;
    })
    .await
    .expect("test within its time limit");
}

/// Fault injection: killing the timeout sweeper or the accept loop is logged
/// and the task restarted; existing client links live on, timeouts are still
/// declined and new clients still get in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sweeper_or_accept_loop_is_restarted() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 1, Delay::parse("5s").unwrap()).await;
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let cfg = Rig::on("cup-pos")
            .service("[service.timeouts]\nrequest = \"200ms\"")
            .config(&addrs);
        let switch = start_switch(&cfg).await;
        let svc = service(&switch).clone();
        wait_connected(&svc, 2).await;
        let sup = &switch.handle().supervisor;
        let mut client = RawClient::connect(front(&switch), &spec).await;

        assert_eq!(sup.kill("svc/sweeper"), 1);
        wait_until("sweeper restarted", || sup.restarts() == 1).await;
        let request = isoswitch::sim::sized_request(&spec, "0200", 200).unwrap();
        client.send_raw(&RawClient::frame(&spec, &request)).await;
        let answer = client
            .recv()
            .await
            .expect("a timeout decline after the restart");
        let msg = isoswitch::iso8583::Message::parse(&spec, answer).unwrap();
        assert_eq!(msg.mti().as_str(), "0210");
        assert_eq!(svc.counters.declined(DeclineReason::Timeout), 1);

        assert_eq!(sup.kill("svc/accept"), 1);
        wait_until("accept loop restarted", || sup.restarts() == 2).await;
        // The listener is back after the restart's backoff.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(front(&switch))
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the front listens again"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut late_comer = RawClient::connect(front(&switch), &spec).await;
        let request = isoswitch::sim::sized_request(&spec, "0200", 200).unwrap();
        late_comer
            .send_raw(&RawClient::frame(&spec, &request))
            .await;
        assert!(late_comer.recv().await.is_some(), "a new client is served");
        // The first client's link survived both.
        client.send_raw(&RawClient::frame(&spec, &request)).await;
        assert!(
            client.recv().await.is_some(),
            "the old client link still works"
        );
        assert!(sup.task_names().iter().any(|t| t == "svc/accept"));
        switch.stop().await;
    })
    .await
    .expect("test within its time limit");
}

/// Reloading a weight change on a UnionPay simplex service under issuer
/// traffic closes no in link, out link or node link: the connection IDs
/// before and after are the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_every_simplex_link() {
    use isoswitch::sim::cups::{CupsSim, CupsSimConfig};
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cups");
        let nodes = start_nodes(&spec, 2, Delay::parse("1ms..5ms").unwrap()).await;
        let listen = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let mut cups_cfg = CupsSimConfig::new("127.0.0.1:0".parse().unwrap(), listen, 4);
        cups_cfg.rate = Some(100.0);
        cups_cfg.duration = Duration::from_secs(20);
        // Generous: an answer that comes after the simulator gave up counts as
        // mismatched, and a loaded machine must not make it so.
        cups_cfg.timeout = Duration::from_secs(10);
        let cups = CupsSim::start(spec.clone(), cups_cfg).await.unwrap();
        let token = temp_file("simplex.token", TOKEN);
        let text = |weight: u32| {
            format!(
                "[admin]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"{}\"\n\
                 [[service]]\nname = \"svc\"\nspec = \"cups\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
                 [service.front]\nkind = \"simplex\"\nconnect = \"{}\"\nlisten = \"{listen}\"\nlinks = 4\n\
                 member_id = \"03105840\"\npeer_id = \"00010000\"\n\
                 [service.back]\nalgorithm = \"weighted\"\n\
                 [[service.back.node]]\nid = \"01\"\naddress = \"{}\"\n\
                 [[service.back.node]]\nid = \"02\"\naddress = \"{}\"\nweight = {weight}\n",
                token.display(),
                cups.accept_addr(),
                nodes[0].addr,
                nodes[1].addr
            )
        };
        let path = temp_file("simplex.toml", &text(1));
        let switch = start_switch(&Config::load(&path).unwrap()).await;
        switch.set_source(Some(path.clone()));
        let svc = service(&switch).clone();
        wait_connected(&svc, 2).await;
        let links = svc.side.out_links().cloned().unwrap();
        wait_until("4 out links signed on, 4 in links", || {
            links.up() == (4, 4) && svc.links.table.count(isoswitch::link::conns::ConnKind::InLink) == 4
        })
        .await;
        let api = Api::of(&switch);
        let status: Status =
            serde_json::from_str(&api.ok("GET", "/api/v1/status", None).await).unwrap();
        let shown = status.services[0].links.as_ref().expect("a simplex front's links");
        assert_eq!((shown.links, shown.signed_on, shown.in_links), (4, 4, 4));
        let before = api.connection_ids().await;
        assert_eq!(before.len(), 4 + 4 + 2 * 2, "{before:?}");
        std::fs::write(&path, text(5)).unwrap();
        let body = api.ok("POST", "/api/v1/reload", None).await;
        assert!(body.contains("node 02 weight 1 -> 5"), "{body}");
        let at_reload = requests_of(&nodes[1]);
        wait_until("traffic after the reload", || requests_of(&nodes[1]) > at_reload + 20).await;
        let after = api.connection_ids().await;
        let report = cups.stop().await;
        assert_eq!(before, after, "no link closed by the reload");
        assert!(report.sent > 20, "{report:?}");
        assert_eq!(report.mismatched, 0, "{report:?}");
        switch.stop().await;
    })
    .await
    .expect("test within its time limit");
}

/// `isoswitch ctl` over the API: the status table, the connection table,
/// a drain, JSON for scripts, and a refusal without the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_shows_tables_and_drains_a_node() {
    use isoswitch::cli::ctl::{CtlArgs, CtlCommand, execute};
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let (_nodes, switch) = admin_rig(&spec, 2, Delay::NONE, "ctl").await;
        wait_connected(service(&switch), 2).await;
        let args = |command, json| CtlArgs {
            admin: Api::of(&switch).base,
            json,
            token: Some(TOKEN.into()),
            command,
            tls: Default::default(),
        };
        let table = execute(&args(CtlCommand::Status, false)).await.unwrap();
        assert!(table.contains("NODE   ADDRESS"), "{table}");
        assert!(
            table
                .lines()
                .any(|l| l.trim_start().starts_with("02 ") && l.contains(" up ")),
            "{table}"
        );
        let conns = execute(&args(CtlCommand::Conns, false)).await.unwrap();
        assert_eq!(
            conns.lines().filter(|l| l.contains(" node ")).count(),
            4,
            "{conns}"
        );
        let drain = CtlCommand::Drain {
            service: "svc".into(),
            node: "02".into(),
        };
        execute(&args(drain, false)).await.unwrap();
        let json = execute(&args(CtlCommand::Status, true)).await.unwrap();
        let status: Status = serde_json::from_str(&json).unwrap();
        assert_eq!(status.services[0].nodes[1].state, "draining");
        let mut anonymous = args(CtlCommand::Status, false);
        anonymous.token = None;
        let err = execute(&anonymous).await.unwrap_err().to_string();
        assert!(err.contains("HTTP 401"), "{err}");
        switch.stop().await;
    })
    .await
    .expect("test within its time limit");
}

/// `isoswitch ctl health`, the container image's HEALTHCHECK: no token on the
/// open probe paths; `--ready` fails with the reason while no node can take
/// traffic; an admin listener that is not there fails too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_health_probes_without_a_token() {
    use isoswitch::cli::ctl::{CtlArgs, CtlCommand, execute};
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let (_nodes, switch) = admin_rig(&spec, 2, Delay::NONE, "health").await;
        let api = Api::of(&switch);
        let probe = |admin: &str, ready| CtlArgs {
            admin: admin.to_string(),
            json: false,
            token: None,
            command: CtlCommand::Health { ready },
            tls: Default::default(),
        };
        assert_eq!(execute(&probe(&api.base, false)).await.unwrap(), "ok\n");
        wait_connected(service(&switch), 2).await;
        let ready = loop {
            match execute(&probe(&api.base, true)).await {
                Ok(text) => break text,
                Err(e) => assert!(e.to_string().contains("HTTP 503"), "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(ready, "ready\n");
        api.node("01", "disable").await;
        api.node("02", "disable").await;
        let err = execute(&probe(&api.base, true))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("HTTP 503") && err.contains("no healthy node"),
            "{err}"
        );
        // Alive all the same: /healthz says the process answers, nothing more.
        assert_eq!(execute(&probe(&api.base, false)).await.unwrap(), "ok\n");
        let gone = format!("http://{}", switch.admin_addr().expect("admin listener"));
        switch.stop().await;
        assert!(execute(&probe(&gone, false)).await.is_err());
    })
    .await
    .expect("test within its time limit");
}

/// `isoswitch run`: SIGHUP reloads the file (a weight change applies; an
/// invalid file is refused and the switch runs on), SIGTERM stops it with
/// exit status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_running_switch() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 3, Delay::NONE).await;
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let token = temp_file("sighup.token", TOKEN);
        let admin = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let text = |weight| {
            file_config(&addrs, weight, "127.0.0.1:0", &token).replace(
                "listen = \"127.0.0.1:0\"\ntoken_file",
                &format!("listen = \"{admin}\"\ntoken_file"),
            )
        };
        let path = temp_file("sighup.toml", &text(1));
        let data_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("admin-sighup-{}.data", std::process::id()));
        let _ = std::fs::remove_dir_all(&data_dir);
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_isoswitch"))
            .args(["run", "--config"])
            .arg(&path)
            .arg("--data-dir")
            .arg(&data_dir)
            .env("ISOSWITCH_LOG", "warn")
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("run the switch");
        let api = Api {
            base: format!("http://{admin}"),
        };
        let weight_of_02 = || async {
            match request(&api.base, "GET", "/api/v1/status", Some(TOKEN), None).await {
                Ok((200, body)) => serde_json::from_str::<Status>(&body)
                    .ok()
                    .map(|s| s.services[0].nodes[1].weight),
                _ => None,
            }
        };
        let until = |want: u32| async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while weight_of_02().await != Some(want) {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "weight of 02 never became {want}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        until(1).await;
        let hup = |pid: u32| {
            std::process::Command::new("kill")
                .args(["-HUP", &pid.to_string()])
                .status()
                .unwrap()
        };
        let pid = child.id().expect("running");
        let mut log = {
            use tokio::io::AsyncBufReadExt;
            tokio::io::BufReader::new(child.stderr.take().unwrap()).lines()
        };
        std::fs::write(&path, text(1).replace("weighted", "fastest")).unwrap();
        assert!(hup(pid).success());
        loop {
            let line = log
                .next_line()
                .await
                .unwrap()
                .expect("the switch logs the refusal");
            if line.contains("reload refused") {
                assert!(line.contains("fastest"), "{line}");
                break;
            }
        }
        assert_eq!(weight_of_02().await, Some(1), "the old config runs on");
        std::fs::write(&path, text(4)).unwrap();
        // The refused reload left the switch up; this one applies.
        assert!(hup(pid).success());
        until(4).await;
        assert!(child.try_wait().unwrap().is_none(), "still running");
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        let status = child.wait().await.unwrap();
        assert!(status.success(), "{status}");
        std::fs::remove_dir_all(&data_dir).expect("the switch made its data directory");
    })
    .await
    .expect("test within its time limit");
}

/// A switch whose start fails (here: the admin address is taken) stops what
/// it had started: its front no longer accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_leaves_nothing_listening() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 1, Delay::NONE).await;
        let front_addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut cfg = Rig::on("cup-pos").config(&[nodes[0].addr]);
        if let isoswitch::config::FrontConfig::Listen(l) = &mut cfg.services[0].front {
            l.listen = front_addr;
        }
        let mut admin = admin_config("failed-start");
        admin.listen = taken.local_addr().unwrap();
        cfg.admin = Some(admin);
        let err = Switch::start(&cfg)
            .await
            .err()
            .expect("the admin address is taken");
        assert!(err.to_string().contains("admin.listen"), "{err}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tokio::net::TcpStream::connect(front_addr).await.is_ok() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the front still accepts after a failed start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("test within its time limit");
}
