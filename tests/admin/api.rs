//! Node changes, tokens, open paths and slow clients, through the API.

use super::*;

/// The issue's acceptance run: under NAC load, drain node 02 (no new
/// requests, in-flight answered, no declines), enable it (traffic returns),
/// disable node 03 (its in-flight answered, no declines), force it offline
/// (its in-flight declined at once), add node 04 (takes
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
        wait_until("node 02 busy", || svc.view().pool.outstanding(1) > 0).await;
        api.node("02", "drain").await;
        assert_eq!(api.status().await.services[0].nodes[1].state, "draining");
        wait_until("node 02 in-flight answered", || {
            svc.view().pool.outstanding(1) == 0
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
        assert_eq!(
            svc.view().counters.declined_total(),
            0,
            "a drain declines nothing"
        );

        // Enable: traffic returns.
        api.node("02", "enable").await;
        wait_until("node 02 takes traffic again", || {
            requests_of(&nodes[1]) > drained_at + 10
        })
        .await;

        // Disable 03 (F5's "disabled"): no new requests, and those in
        // flight are answered by the node, never declined.
        wait_until("node 03 busy", || svc.view().pool.outstanding(2) > 0).await;
        api.node("03", "disable").await;
        assert_eq!(api.status().await.services[0].nodes[2].state, "disabled");
        wait_until("node 03 in-flight answered", || {
            svc.view().pool.outstanding(2) == 0
        })
        .await;
        assert_eq!(
            svc.view().counters.declined_total(),
            0,
            "a disable declines nothing: in-flight finish"
        );
        api.node("03", "enable").await;

        // Force 03 offline: its in-flight requests are declined at once.
        wait_until("node 03 busy again", || svc.view().pool.outstanding(2) > 0).await;
        api.node("03", "force-offline").await;
        assert_eq!(
            svc.view().pool.outstanding(2),
            0,
            "force-offline declines the node's in-flight at once"
        );
        assert_eq!(
            api.status().await.services[0].nodes[2].state,
            "forced-offline"
        );
        let declined_by_disable = svc.view().counters.declined(DeclineReason::Shutdown);
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
        assert_eq!(svc.view().pool.outstanding(0), 0);
        wait_until("node 01 links closed", || {
            svc.view().pool.nodes()[0].live_conns() == 0
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
            "only the force-offline declined: {report}"
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
        assert!(
            body.contains("expected drain, disable, force-offline or enable"),
            "{body}"
        );
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

/// Every admin answer says it may be kept by no cache and shown in no
/// frame: the page, the API, the probes, a refusal and a 404 alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_answer_is_no_store_and_never_framed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 1, Delay::NONE).await;
        let mut cfg = Rig::on("cup-pos").config(&[nodes[0].addr]);
        cfg.admin = Some(admin_config("headers"));
        let switch = start_switch(&cfg).await;
        let addr = switch.admin_addr().unwrap();
        for (path, auth) in [
            ("/healthz", false),
            ("/metrics", false),
            ("/api/v1/status", true),
            ("/api/v1/status", false),
            ("/no/such/thing", true),
        ] {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let auth = if auth {
                format!("Authorization: Bearer {TOKEN}\r\n")
            } else {
                String::new()
            };
            let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n");
            s.write_all(head.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            let _ = s.read_to_end(&mut answer).await;
            let answer = String::from_utf8_lossy(&answer).to_lowercase();
            let head = answer.split("\r\n\r\n").next().unwrap_or_default();
            for want in [
                "cache-control: no-store",
                "x-frame-options: deny",
                "x-content-type-options: nosniff",
                "content-security-policy: default-src 'none'",
            ] {
                assert!(head.contains(want), "{path}: no {want:?} in {head}");
            }
        }
        switch.stop().await;
    })
    .await
    .expect("test within its time limit");
}
