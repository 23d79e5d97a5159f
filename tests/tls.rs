//! TLS end to end, with the real binary as switch, nodes and NAC, each its
//! own process on 127.0.0.1, and certificates made by the test (rcgen):
//! a NAC over mutual TLS through the switch to nodes over mutual TLS, every
//! answer exactly once; clients without a certificate, with one from another
//! CA or with a name not allowed, refused in the handshake and counted by
//! reason; HTTPS on the admin API with `ctl`; certificates renewed and
//! reloaded under load without a link dropped; revoked client certificates
//! (`client_crl`) refused in the handshake, the list read again on reload;
//! expired certificates failing `check`, `run` and a reload. No assertion
//! is on timing.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::io::AsyncReadExt;

#[path = "common/certs.rs"]
mod certs;
#[path = "common/procs.rs"]
mod procs;
use certs::{Leaf, Pki};
use procs::*;

/// One case at a time: each runs a switch, nodes and a NAC, and two at once
/// on a 2-core machine would only slow both.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn within<F: std::future::Future<Output = ()>>(limit: Duration, test: F) {
    let _alone = ONE_AT_A_TIME.lock().await;
    tokio::time::timeout(limit, test)
        .await
        .expect("TLS case within its timeout");
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// The certificates of one case: the switch's (as server to clients and as
/// client to nodes), the nodes', and a NAC's whose name is allowed.
struct Certs {
    pki: Pki,
    switch: Leaf,
    nodes: Leaf,
    nac: Leaf,
}

impl Certs {
    fn new(name: &str) -> Certs {
        let pki = Pki::new(name);
        Certs {
            switch: pki.issue("switch", &["switch.test", "127.0.0.1"]),
            nodes: pki.issue("node", &["node.test", "127.0.0.1"]),
            nac: pki.issue("nac", &["nac-01"]),
            pki,
        }
    }

    /// `sim node` flags: TLS, requiring the switch's client certificate.
    fn node_flags(&self) -> Vec<String> {
        let mut f = self.nodes.flags();
        f.extend(["--tls-ca".into(), path(&self.pki.ca)]);
        f
    }

    /// `sim nac` flags for a NAC presenting `leaf`.
    fn nac_flags(&self, leaf: Option<&Leaf>) -> Vec<String> {
        let mut f = vec!["--tls-ca".into(), path(&self.pki.ca)];
        if let Some(l) = leaf {
            f.extend(l.flags());
        }
        f
    }
}

/// A POS service over TLS on both sides: clients need a certificate naming
/// `nac-01`; node links present the switch's certificate.
fn pos_toml(c: &Certs, listen: SocketAddr, nodes: &[SocketAddr], admin: &str) -> String {
    format!(
        "{admin}\
         [[service]]\nname = \"pos\"\nspec = \"cup-pos\"\n\
         [service.front]\nkind = \"listen\"\nlisten = \"{listen}\"\n\
         [service.front.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\nclient_names = [\"nac-01\"]\n\
         [service.back]\nconnections_per_node = 2\nreconnect_min = \"50ms\"\nreconnect_max = \"200ms\"\n\
         [service.back.tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
         [service.timeouts]\nrequest = \"2s\"\n{}",
        path(&c.switch.cert),
        path(&c.switch.key),
        path(&c.pki.ca),
        path(&c.pki.ca),
        path(&c.switch.cert),
        path(&c.switch.key),
        nodes_toml(nodes)
    )
}

async fn start_switch(name: &str, toml: &str, listen: SocketAddr) -> (Proc, std::path::PathBuf) {
    let config = write_config(name, toml);
    let data = data_dir(name);
    let switch = Proc::spawn(
        name,
        &["run", "--config", &path(&config), "--data-dir", &data],
    );
    wait_listening(listen).await;
    (switch, config)
}

/// The value of the one metric line starting with `line` (labels included).
async fn metric(admin: SocketAddr, line: &str) -> u64 {
    let text = metrics(admin, &[line]).await;
    text.lines()
        .find_map(|l| l.strip_prefix(line)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Polls the metric until it reaches `at_least`; fails naming it after 60 s.
async fn wait_metric(admin: SocketAddr, line: &str, at_least: u64) {
    let what = format!("{line} at {at_least} or more");
    metrics_hold(admin, &[line], &what, Duration::from_secs(60), |text| {
        text.lines()
            .find_map(|l| l.strip_prefix(line)?.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
            >= at_least
    })
    .await;
}

const NODE_HANDSHAKES: &str = "isoswitch_tls_handshakes_total{service=\"pos\",side=\"connect\"}";

fn failures(reason: &str) -> String {
    format!(
        "isoswitch_tls_handshake_failures_total{{service=\"pos\",side=\"accept\",reason=\"{reason}\"}}"
    )
}

/// A client that connects over TLS as `flags` say and reads: the switch
/// refuses it in the handshake, so the read fails or ends, never a frame.
async fn refused_client(switch: SocketAddr, flags: isoswitch::tls::tools::TlsFlags) {
    let tls = flags.client().expect("client TLS loads").expect("TLS on");
    // TLS 1.3: the client's side of the handshake may finish before the
    // server has judged its certificate; the refusal then comes as an alert
    // on the first read.
    if let Ok(stream) = isoswitch::tls::tools::connect(Some(&tls), switch).await {
        let (mut read, _write) = stream.into_split();
        let mut buf = [0u8; 64];
        let got = read.read(&mut buf).await;
        assert!(
            matches!(got, Ok(0) | Err(_)),
            "a refused client read {got:?}"
        );
    }
}

fn flags(ca: &Path, leaf: Option<&Leaf>) -> isoswitch::tls::tools::TlsFlags {
    isoswitch::tls::tools::TlsFlags {
        tls_ca: Some(ca.to_path_buf()),
        tls_cert: leaf.map(|l| l.cert.clone()),
        tls_key: leaf.map(|l| l.key.clone()),
        tls_server_name: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nac_over_mutual_tls_to_nodes_over_tls_gets_every_answer_once() {
    within(Duration::from_secs(120), async {
        let c = Certs::new("tls-mutual");
        let node_flags = c.node_flags();
        let extra: Vec<&str> = node_flags.iter().map(String::as_str).collect();
        let (_nodes, addrs) = start_nodes_with("cup-pos", 2, "1ms", &extra).await;
        let (admin, admin_toml) = admin_toml("tls-mutual");
        let listen = free_addr();
        let toml = pos_toml(&c, listen, &addrs, &admin_toml);
        let (_switch, _) = start_switch("tls-mutual", &toml, listen).await;
        wait_listening(admin).await;
        // Both nodes' two links up, each through a handshake.
        wait_metric(admin, NODE_HANDSHAKES, 4).await;

        let nac_flags = c.nac_flags(Some(&c.nac));
        let extra: Vec<&str> = nac_flags.iter().map(String::as_str).collect();
        let report = nac("tls-nac", listen, 200, ("3s", "3s"), &extra)
            .report()
            .await;
        assert_exactly_once(&report);
        assert!(n(&report, "answered") > 0, "{report}");
        assert_eq!(metric(admin, &failures("no-certificate")).await, 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_a_valid_allowed_certificate_are_refused_and_counted() {
    within(Duration::from_secs(120), async {
        let c = Certs::new("tls-refused");
        let node_flags = c.node_flags();
        let extra: Vec<&str> = node_flags.iter().map(String::as_str).collect();
        let (_nodes, addrs) = start_nodes_with("cup-pos", 1, "1ms", &extra).await;
        let (admin, admin_toml) = admin_toml("tls-refused");
        let listen = free_addr();
        let toml = pos_toml(&c, listen, &addrs, &admin_toml);
        let (_switch, _) = start_switch("tls-refused", &toml, listen).await;
        wait_listening(admin).await;

        // No certificate at all.
        refused_client(listen, flags(&c.pki.ca, None)).await;
        wait_metric(admin, &failures("no-certificate"), 1).await;
        // A certificate from another CA, with the right name.
        let rogue = Pki::new("tls-rogue");
        let forged = rogue.issue("nac", &["nac-01"]);
        refused_client(listen, flags(&c.pki.ca, Some(&forged))).await;
        wait_metric(admin, &failures("bad-certificate"), 1).await;
        // The right CA, a name not in client_names.
        let other = c.pki.issue("nac-99", &["nac-99"]);
        refused_client(listen, flags(&c.pki.ca, Some(&other))).await;
        wait_metric(admin, &failures("name-not-allowed"), 1).await;
        // A plain client on the TLS port.
        let mut plain = tokio::net::TcpStream::connect(listen).await.expect("tcp");
        use tokio::io::AsyncWriteExt;
        plain
            .write_all(b"\x00\x10this is not TLS!")
            .await
            .expect("write");
        let mut buf = [0u8; 64];
        let _ = plain.read(&mut buf).await;
        wait_metric(admin, &failures("not-tls"), 1).await;

        // The allowed client still gets through after all that.
        let nac_flags = c.nac_flags(Some(&c.nac));
        let extra: Vec<&str> = nac_flags.iter().map(String::as_str).collect();
        let report = nac("tls-nac-ok", listen, 100, ("1s", "3s"), &extra)
            .report()
            .await;
        assert_exactly_once(&report);
    })
    .await;
}

/// An `[admin]` table serving HTTPS with the switch's certificate.
fn https_admin(c: &Certs, name: &str) -> (SocketAddr, String) {
    let addr = free_addr();
    let token = write_config(&format!("{name}-token"), "process-test-token\n");
    let toml = format!(
        "[admin]\nlisten = \"{addr}\"\ntoken_file = \"{}\"\n\
         [admin.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        path(&token),
        path(&c.switch.cert),
        path(&c.switch.key),
    );
    (addr, toml)
}

/// GET `path` from an HTTPS admin, verified against `ca`.
async fn https_get(admin: SocketAddr, ca: &Path, path: &str) -> String {
    let tls = flags(ca, None).client().expect("TLS loads");
    let url = format!("https://{admin}");
    let (status, body) =
        isoswitch::cli::ctl::request_tls(&url, tls.as_deref(), "GET", path, None, None)
            .await
            .expect("HTTPS answer");
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the metric line starting with `line`, over HTTPS.
async fn https_metric(admin: SocketAddr, ca: &Path, line: &str) -> u64 {
    https_get(admin, ca, "/metrics")
        .await
        .lines()
        .find_map(|l| l.strip_prefix(line)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

async fn wait_https_metric(admin: SocketAddr, ca: &Path, line: &str, at_least: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let now = https_metric(admin, ca, line).await;
        if now >= at_least {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{line} at {now}, never {at_least} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `isoswitch ctl ARGS` against `admin` over HTTPS: exit success and stdout.
async fn ctl(admin: SocketAddr, ca: &Path, args: &[&str]) -> (bool, String) {
    let url = format!("https://{admin}");
    let ca = path(ca);
    let mut all = vec![
        "ctl",
        "--admin",
        &url,
        "--tls-ca",
        &ca,
        "--token",
        "process-test-token",
    ];
    all.extend_from_slice(args);
    let (status, out) = Proc::spawn("tls-ctl", &all).finish().await;
    (status.success(), out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_serves_https_and_ctl_shows_tls_links_and_expiry() {
    within(Duration::from_secs(120), async {
        let c = Certs::new("tls-admin");
        let node_flags = c.node_flags();
        let extra: Vec<&str> = node_flags.iter().map(String::as_str).collect();
        let (_nodes, addrs) = start_nodes_with("cup-pos", 1, "1ms", &extra).await;
        let (admin, admin_toml) = https_admin(&c, "tls-admin");
        let listen = free_addr();
        let toml = pos_toml(&c, listen, &addrs, &admin_toml);
        let (_switch, _) = start_switch("tls-admin", &toml, listen).await;
        wait_listening(admin).await;
        wait_https_metric(admin, &c.pki.ca, NODE_HANDSHAKES, 2).await;

        let expiry = https_metric(
            admin,
            &c.pki.ca,
            "isoswitch_tls_cert_expiry_seconds{service=\"pos\",link=\"front\",key=\"service[0].front.tls.cert\"}",
        )
        .await;
        assert!(expiry > 86_400 * 365, "expiry metric: {expiry}");
        let (ok, status) = ctl(admin, &c.pki.ca, &["status"]).await;
        assert!(ok, "{status}");
        assert!(status.contains("tls pos front: CN=switch.test expires in"), "{status}");
        assert!(status.contains("tls admin admin: CN=switch.test"), "{status}");
        let (ok, conns) = ctl(admin, &c.pki.ca, &["conns"]).await;
        assert!(ok, "{conns}");
        let node_rows: Vec<&str> = conns.lines().filter(|l| l.contains(" node ")).collect();
        assert_eq!(node_rows.len(), 2, "{conns}");
        for row in node_rows {
            assert!(row.contains("TLSv1.3 TLS13_"), "{row}");
            assert!(row.contains("CN=node.test"), "{row}");
        }

        // Plain HTTP to the HTTPS admin gets no answer, and is counted.
        let plain = isoswitch::cli::ctl::request(
            &format!("http://{admin}"),
            "GET",
            "/healthz",
            None,
            None,
        )
        .await;
        assert!(plain.is_err(), "plain HTTP answered: {plain:?}");
        let not_tls = "isoswitch_tls_handshake_failures_total{service=\"admin\",side=\"accept\",reason=\"not-tls\"}";
        wait_https_metric(admin, &c.pki.ca, not_tls, 1).await;
        // A CA that did not sign the admin's certificate: ctl refuses it.
        let rogue = Pki::new("tls-admin-rogue");
        let (ok, out) = ctl(admin, &rogue.ca, &["status"]).await;
        assert!(!ok, "ctl trusted a certificate its CA did not sign: {out}");
    })
    .await;
}

/// The subject of the certificate a new TLS connection to `addr` is shown.
async fn served_subject(addr: SocketAddr, c: &Certs) -> String {
    let tls = flags(&c.pki.ca, Some(&c.nac))
        .client()
        .expect("TLS loads")
        .expect("TLS on");
    let stream = isoswitch::tls::tools::connect(Some(&tls), addr)
        .await
        .expect("handshake");
    let isoswitch::tls::LinkStream::Tls(s) = stream else {
        panic!("a TLS stream");
    };
    let (_, state) = s.get_ref();
    let leaf = state
        .peer_certificates()
        .and_then(|c| c.first())
        .expect("a server certificate");
    isoswitch::config::tls::subject_of(leaf.as_ref()).expect("a subject")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_certificates_reload_under_load_without_a_link_dropped() {
    within(Duration::from_secs(120), async {
        let c = Certs::new("tls-reload");
        let node_flags = c.node_flags();
        let extra: Vec<&str> = node_flags.iter().map(String::as_str).collect();
        let (_nodes, addrs) = start_nodes_with("cup-pos", 2, "1ms", &extra).await;
        let (admin, admin_toml) = admin_toml("tls-reload");
        let listen = free_addr();
        let toml = pos_toml(&c, listen, &addrs, &admin_toml);
        let (switch, _) = start_switch("tls-reload", &toml, listen).await;
        wait_listening(admin).await;
        wait_metric(admin, NODE_HANDSHAKES, 4).await;
        assert_eq!(served_subject(listen, &c).await, "CN=switch.test");

        let nac_flags = c.nac_flags(Some(&c.nac));
        let extra: Vec<&str> = nac_flags.iter().map(String::as_str).collect();
        let load = nac("tls-reload-nac", listen, 200, ("4s", "3s"), &extra);
        // Under load: the NAC's requests are flowing.
        wait_metric(
            admin,
            "isoswitch_service_requests_total{service=\"pos\"}",
            100,
        )
        .await;
        // The certificate is renewed in place (same files, new content) and
        // the switch told to reload.
        let renewed = c
            .pki
            .issue("renewed", &["switch-renewed.test", "127.0.0.1"]);
        std::fs::copy(&renewed.cert, &c.switch.cert).expect("renew cert");
        std::fs::copy(&renewed.key, &c.switch.key).expect("renew key");
        switch.signal("HUP");
        switch
            .wait_logged("TLS certificates and keys read again")
            .await;
        // New connections get the renewed certificate.
        assert_eq!(served_subject(listen, &c).await, "CN=switch-renewed.test");

        let report = load.report().await;
        assert_exactly_once(&report);
        assert!(n(&report, "answered") > 0, "{report}");
        // No node link was opened again: the four handshakes of the start.
        assert_eq!(metric(admin, NODE_HANDSHAKES).await, 4);
        let dropped = metrics(admin, &["isoswitch_server_disconnects"]).await;
        assert_eq!(dropped.lines().count(), 2, "{dropped}");
        assert!(
            dropped.lines().all(|l| l.ends_with(" 0")),
            "a node link dropped: {dropped}"
        );
    })
    .await;
}

/// UnionPay's 8 out links and 8 in links all over mutual TLS (the switch as
/// client on the out links, as server on the in links), nodes over TLS
/// too, traffic both ways: every request answered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unionpay_8_by_8_over_tls_both_ways_answers_everything_once() {
    within(Duration::from_secs(120), async {
        let c = Certs::new("tls-cups");
        let mut node_flags = c.node_flags();
        node_flags.extend(["--originate".into(), "30".into(), "--json".into()]);
        let extra: Vec<&str> = node_flags.iter().map(String::as_str).collect();
        let (nodes, addrs) = start_nodes_with("cups", 3, "0..20ms", &extra).await;
        // UnionPay's certificate: presented on the out links it accepts and
        // on the in links it opens.
        let unionpay = c.pki.issue("unionpay", &["unionpay.test", "127.0.0.1"]);
        let (accept, listen) = (free_addr(), free_addr());
        let (a, l, ca) = (accept.to_string(), listen.to_string(), path(&c.pki.ca));
        let mut args: Vec<String> = [
            "sim", "cups", "--accept", &a, "--connect", &l, "--links", "8", "--rate", "200",
            "--duration", "60s", "--timeout", "3s", "--keepalive-idle", "200ms",
            "--require-sign-on", "--json", "--tls-ca", &ca,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(unionpay.flags());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let cups = Proc::spawn("tls-cups", &args);
        wait_listening(accept).await;
        let (admin, admin_toml) = admin_toml("tls-cups-switch");
        let (cert, key) = (path(&c.switch.cert), path(&c.switch.key));
        let toml = format!(
            "{admin_toml}[[service]]\nname = \"unionpay\"\nspec = \"cups\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
             [service.front]\nkind = \"simplex\"\nconnect = \"{accept}\"\nlisten = \"{listen}\"\nlinks = 8\n\
             member_id = \"03105840\"\npeer_id = \"00010000\"\nkeepalive_idle = \"200ms\"\n\
             reconnect_min = \"20ms\"\nreconnect_max = \"200ms\"\nsign_on = \"per-link\"\nsign_on_retry = \"300ms\"\n\
             [service.front.tls]\nca = \"{ca}\"\ncert = \"{cert}\"\nkey = \"{key}\"\n\
             [service.front.in_tls]\ncert = \"{cert}\"\nkey = \"{key}\"\nclient_ca = \"{ca}\"\nclient_names = [\"unionpay.test\"]\n\
             [service.back]\nconnections_per_node = 2\n\
             [service.back.tls]\nca = \"{ca}\"\ncert = \"{cert}\"\nkey = \"{key}\"\n{}",
            nodes_toml(&addrs)
        );
        let (_switch, _) = start_switch("tls-cups-switch", &toml, listen).await;
        wait_listening(admin).await;
        let shaken = |side: &str| {
            format!("isoswitch_tls_handshakes_total{{service=\"unionpay\",side=\"{side}\"}}")
        };
        // 8 out links and 6 node links as client, 8 in links as server.
        wait_metric(admin, &shaken("connect"), 14).await;
        wait_metric(admin, &shaken("accept"), 8).await;
        // Traffic both ways for a while: UnionPay's own requests flowing.
        wait_metric(admin, "isoswitch_service_requests_total{service=\"unionpay\"}", 400).await;
        for node in &nodes {
            node.signal("INT");
        }
        let mut node_reports = Vec::new();
        for node in nodes {
            node_reports.push(node.report().await);
        }
        cups.signal("INT");
        let report = cups.report().await;
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
        assert_eq!(n(&report, "unsigned_frames"), 0, "{report}");
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
        // No link needed a second handshake: none dropped.
        assert_eq!(metric(admin, &shaken("connect")).await, 14);
        assert_eq!(metric(admin, &shaken("accept")).await, 8);
    })
    .await;
}

/// `isoswitch load` over mutual TLS: long connections, then the ATM profile
/// (a connection, and so a full handshake, per request).
async fn load_over_tls(c: &Certs, front: SocketAddr, extra: &[&str]) -> serde_json::Value {
    let (t, ca) = (front.to_string(), path(&c.pki.ca));
    let leaf = c.nac.flags();
    let mut args = vec![
        "load",
        "--target",
        &t,
        "--spec",
        "cup-pos",
        "--clients",
        "4",
        "--in-flight",
        "2",
        "--duration",
        "1s",
        "--rate",
        "200",
        "--json",
        "--quiet",
        "--tls-ca",
        &ca,
    ];
    args.extend(leaf.iter().map(String::as_str));
    args.extend_from_slice(extra);
    let report = Proc::spawn("tls-load", &args).report().await;
    assert!(n(&report, "requests") > 0, "{report}");
    assert_eq!(n(&report, "timeouts"), 0, "{report}");
    assert_eq!(n(&report, "mismatches"), 0, "{report}");
    assert_eq!(n(&report, "connect_failures"), 0, "{report}");
    report
}

/// `load` through the TLS front, and VISA's duplex links over mutual TLS
/// (`sim visa --accept` as the TLS server): every request answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_and_visa_links_run_over_tls() {
    within(Duration::from_secs(120), async {
        let c = Certs::new("tls-visa");
        let node_flags = c.node_flags();
        let extra: Vec<&str> = node_flags.iter().map(String::as_str).collect();
        let (_pos_nodes, pos_addrs) = start_nodes_with("cup-pos", 1, "1ms", &extra).await;
        let (_visa_nodes, visa_addrs) =
            start_nodes_with("visa-base1", 2, "1ms", &["--originate", "20"]).await;
        let visa_cert = c.pki.issue("visa", &["visa.test", "127.0.0.1"]);
        let visa_at = free_addr();
        let (v, ca) = (visa_at.to_string(), path(&c.pki.ca));
        let mut args: Vec<String> = [
            "sim", "visa", "--accept", &v, "--links", "2", "--rate", "200", "--count", "300",
            "--duration", "60s", "--json", "--tls-ca", &ca,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(visa_cert.flags());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let visa = Proc::spawn("tls-visa", &args);
        visa.wait_logged("sim visa listening on").await;

        let (admin, admin_toml) = admin_toml("tls-visa-switch");
        let listen = free_addr();
        let pos = pos_toml(&c, listen, &pos_addrs, &admin_toml);
        let (cert, key) = (path(&c.switch.cert), path(&c.switch.key));
        let toml = format!(
            "{pos}[[service]]\nname = \"visa\"\nspec = \"visa-base1\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
             [service.front]\nkind = \"connect\"\nconnect = \"{visa_at}\"\nlinks = 2\n\
             keepalive_idle = \"200ms\"\nsign_on = \"none\"\n\
             [service.front.tls]\nca = \"{ca}\"\ncert = \"{cert}\"\nkey = \"{key}\"\nserver_name = \"visa.test\"\n\
             [service.back]\nconnections_per_node = 2\n{}",
            nodes_toml(&visa_addrs)
        );
        let (_switch, _) = start_switch("tls-visa-switch", &toml, listen).await;
        wait_listening(admin).await;

        let (status, out) = visa.finish().await;
        assert!(status.success(), "sim visa over TLS failed: {out}");
        let report: serde_json::Value =
            serde_json::from_str(out.lines().last().unwrap_or_default()).expect("JSON");
        assert_eq!(report["issuer_sent"], 300, "{report}");
        let answered = n(&report, "issuer_approved") + n(&report, "issuer_declined");
        assert_eq!(answered, 300, "{report}");
        assert_eq!(report["issuer_unanswered"], 0, "{report}");
        assert_eq!(report["doubled"], 0, "{report}");
        let visa_links = "isoswitch_tls_handshakes_total{service=\"visa\",side=\"connect\"}";
        assert!(metric(admin, visa_links).await >= 2);

        wait_metric(admin, NODE_HANDSHAKES, 2).await;
        load_over_tls(&c, listen, &[]).await;
        let atm = load_over_tls(&c, listen, &["--connection-per-request"]).await;
        assert!(n(&atm, "connects") > 10, "{atm}");
    })
    .await;
}

/// `isoswitch check` reads the TLS files as `run` would: a missing or broken
/// key fails it, naming the key and the file, never showing the key's lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_the_key_and_file_of_bad_tls_material_without_showing_it() {
    within(Duration::from_secs(60), async {
        let c = Certs::new("tls-check");
        let secret = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgSECRETSECRET";
        let broken = c.pki.dir.join("broken.key");
        certs::write_key(
            &broken,
            &format!("-----BEGIN PRIVATE KEY-----\n{secret}\n-----END PRIVATE KEY-----\n"),
        );
        for (key, shown) in [
            (c.pki.dir.join("missing.key"), "missing.key"),
            (broken, "broken.key"),
        ] {
            let toml = format!(
                "[[service]]\nname = \"pos\"\nspec = \"cup-pos\"\n\
                 [service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:0\"\n\
                 [service.front.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
                 [service.back]\n[[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:9\"\n",
                path(&c.switch.cert),
                path(&key)
            );
            let config = write_config("tls-check", &toml);
            let check = Proc::spawn("tls-check", &["check", "--config", &path(&config)]);
            let log_file = check.log.clone();
            let (status, _) = check.finish().await;
            let log = std::fs::read_to_string(log_file).expect("check's stderr");
            assert!(!status.success(), "{log}");
            assert!(log.contains("service[0].front.tls.key: "), "{log}");
            assert!(log.contains(shown), "{log}");
            assert!(!log.contains("SECRET"), "key material shown: {log}");
        }
    })
    .await;
}

/// A POS front with `client_crl`: a client certificate the CRL revokes is
/// refused in the handshake (counted `revoked-certificate`) while a valid
/// one gets every answer; a new list read on SIGHUP revokes that one too; a
/// reload onto an expired certificate is refused and the old one served;
/// the CAs' expiry is exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_client_certificate_is_refused_and_the_crl_is_read_again_on_reload() {
    within(Duration::from_secs(120), async {
        let c = Certs::new("tls-crl");
        let good = c.pki.issue_serial("nac-good", &["nac-01"], 1001);
        let revoked = c.pki.issue_serial("nac-revoked", &["nac-01"], 1002);
        let crl = c.pki.crl("clients.crl", &[1002]);
        let node_flags = c.node_flags();
        let extra: Vec<&str> = node_flags.iter().map(String::as_str).collect();
        let (_nodes, addrs) = start_nodes_with("cup-pos", 1, "1ms", &extra).await;
        let (admin, admin_toml) = admin_toml("tls-crl");
        let listen = free_addr();
        let toml = pos_toml(&c, listen, &addrs, &admin_toml).replace(
            "client_names = [\"nac-01\"]\n",
            &format!(
                "client_names = [\"nac-01\"]\nclient_crl = [\"{}\"]\n",
                path(&crl)
            ),
        );
        let (switch, _) = start_switch("tls-crl", &toml, listen).await;
        wait_listening(admin).await;

        refused_client(listen, flags(&c.pki.ca, Some(&revoked))).await;
        wait_metric(admin, &failures("revoked-certificate"), 1).await;
        let nac_flags = c.nac_flags(Some(&good));
        let extra: Vec<&str> = nac_flags.iter().map(String::as_str).collect();
        let report = nac("tls-crl-nac", listen, 100, ("1s", "3s"), &extra)
            .report()
            .await;
        assert_exactly_once(&report);
        assert!(n(&report, "answered") > 0, "{report}");

        let cas = metrics(admin, &["isoswitch_tls_ca_expiry_seconds"]).await;
        for key in ["service[0].front.tls.client_ca", "service[0].back.tls.ca"] {
            let line = cas
                .lines()
                .find(|l| l.contains(&format!("key=\"{key}\"")))
                .unwrap_or_else(|| panic!("no CA expiry for {key}: {cas}"));
            assert!(line.contains("subject=\"CN=tls-crl test CA\""), "{line}");
            let left: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
            assert!(left > 86_400.0, "{line}");
        }

        // The CA's next list revokes the good one too: read on reload.
        let newer = c.pki.crl("newer.crl", &[1001, 1002]);
        std::fs::copy(&newer, &crl).expect("new CRL in place");
        switch.signal("HUP");
        switch.wait_logged("SIGHUP: config reloaded").await;
        refused_client(listen, flags(&c.pki.ca, Some(&good))).await;
        wait_metric(admin, &failures("revoked-certificate"), 2).await;

        // A renewal that put an expired certificate in place is refused,
        // naming the key; the switch keeps presenting the one it has.
        let expired = c
            .pki
            .issue_with("expired", &["switch.test", "127.0.0.1"], |p| {
                p.not_before = rcgen::date_time_ymd(2000, 1, 1);
                p.not_after = rcgen::date_time_ymd(2001, 1, 1);
            });
        std::fs::copy(&expired.cert, &c.switch.cert).expect("expired cert");
        std::fs::copy(&expired.key, &c.switch.key).expect("its key");
        switch.signal("HUP");
        switch.wait_logged("SIGHUP: reload refused").await;
        let log = std::fs::read_to_string(&switch.log).expect("the switch's log");
        assert!(
            log.contains("service[0].front.tls.cert") && log.contains("expired on 2001-01-01"),
            "{log}"
        );
        let still = c.pki.issue("still", &["nac-01"]);
        let tls = flags(&c.pki.ca, Some(&still)).client().unwrap().unwrap();
        let stream = isoswitch::tls::tools::connect(Some(&tls), listen).await;
        assert!(stream.is_ok(), "the old certificate is still served");
    })
    .await;
}

/// `check` and `run` refuse an expired or not yet valid certificate and a
/// key file others may read, naming the key and the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_run_refuse_expired_certificates_and_open_keys_naming_the_key() {
    within(Duration::from_secs(60), async {
        let c = Certs::new("tls-validity");
        let expired = c.pki.issue_with("expired", &["switch.test"], |p| {
            p.not_before = rcgen::date_time_ymd(2000, 1, 1);
            p.not_after = rcgen::date_time_ymd(2001, 1, 1);
        });
        let early = c.pki.issue_with("early", &["switch.test"], |p| {
            p.not_before = rcgen::date_time_ymd(2090, 1, 1);
            p.not_after = rcgen::date_time_ymd(2091, 1, 1);
        });
        let open = c.pki.issue("open", &["switch.test"]);
        let others = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o644);
        std::fs::set_permissions(&open.key, others).expect("chmod 644");
        let cases = [
            (
                &expired,
                "service[0].front.tls.cert: ",
                "expired on 2001-01-01T00:00:00Z",
            ),
            (
                &early,
                "service[0].front.tls.cert: ",
                "not valid before 2090-01-01T00:00:00Z",
            ),
            (
                &open,
                "service[0].front.tls.key: ",
                "mode 0644: group or others may read it",
            ),
        ];
        for (leaf, key, why) in cases {
            let toml = format!(
                "[[service]]\nname = \"pos\"\nspec = \"cup-pos\"\n\
                 [service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:0\"\n\
                 [service.front.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
                 [service.back]\n[[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:9\"\n",
                path(&leaf.cert),
                path(&leaf.key)
            );
            let config = write_config("tls-validity", &toml);
            let data = data_dir("tls-validity");
            for args in [
                vec!["check", "--config", &path(&config)],
                vec!["run", "--config", &path(&config), "--data-dir", &data],
            ] {
                let proc = Proc::spawn("tls-validity", &args);
                let log_file = proc.log.clone();
                let (status, _) = proc.finish().await;
                let log = std::fs::read_to_string(log_file).expect("stderr");
                assert!(!status.success(), "{} passed: {log}", args[0]);
                assert!(log.contains(key) && log.contains(why), "{}: {log}", args[0]);
            }
        }
    })
    .await;
}
