//! Reloads from the config file, and supervised tasks restarted.

use super::*;

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
            svc.view()
                .links
                .table
                .count(isoswitch::link::io::conns::ConnKind::Client)
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
        // The node never answers within the test: every answer the
        // clients get is the switch's timeout decline, however slow the
        // machine (a 5 s node once raced the client's own 5 s wait and
        // answered first while the restarted sweeper had not yet run).
        let nodes = start_nodes(&spec, 1, Delay::parse("300s").unwrap()).await;
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
        // The restarted sweeper runs after the supervisor's backoff: wait
        // for its decline on the machine's time, not a fixed 5 s.
        let answer = client
            .recv_within(Duration::from_secs(30))
            .await
            .expect("a timeout decline after the restart");
        let msg = isoswitch::iso8583::Message::parse(&spec, answer).unwrap();
        assert_eq!(msg.mti().as_str(), "0210");
        let counters = &svc.view().counters;
        let declined: Vec<_> = DeclineReason::ALL
            .iter()
            .map(|&r| (r, counters.declined(r)))
            .filter(|&(_, n)| n > 0)
            .collect();
        assert_eq!(
            counters.declined(DeclineReason::Timeout),
            1,
            "F39 {:?}, declined {declined:?}",
            msg.field(39).ok().flatten().map(|f| f.data().to_vec())
        );

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
        assert!(
            late_comer
                .recv_within(Duration::from_secs(30))
                .await
                .is_some(),
            "a new client is served"
        );
        // The first client's link survived both.
        client.send_raw(&RawClient::frame(&spec, &request)).await;
        assert!(
            client.recv_within(Duration::from_secs(30)).await.is_some(),
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
        let links = svc.view().side.out_links().cloned().unwrap();
        wait_until("4 out links signed on, 4 in links", || {
            links.up() == (4, 4) && svc.view().links.table.count(isoswitch::link::io::conns::ConnKind::InLink) == 4
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
