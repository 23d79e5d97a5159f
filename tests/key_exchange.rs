//! End-to-end, real processes: network management that belongs to the hosts
//! on UnionPay's split simplex links (`sim cups`, the switch, `sim node`s).
//!
//! - UnionPay's key resets (0800 F70 101) reach the key node, every one,
//!   and no other node; each 0810 goes back to UnionPay on an out link.
//! - The nodes' own key requests (0820 F70 101, no F37) go out to UnionPay,
//!   and each answer comes back to the node that asked, by F11 + F7.
//! - With no key node up, the switch declines a key reset (F39 91), never
//!   answering 00 for a key no host holds.
//! - The same both ways on VISA's duplex links (`sim visa`), where F70 is
//!   BCD and F39 EBCDIC: VISA's key exchanges (F70 161) reach the key node,
//!   and the nodes' key requests reach VISA and come back to their node.

use std::net::SocketAddr;
use std::time::Duration;

#[path = "common/procs.rs"]
mod procs;
use procs::*;

/// Each case drives five processes; two at once on a 2-core machine could
/// answer late enough to fail a simulator's own timeout.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn within<F: std::future::Future<Output = ()>>(limit: Duration, test: F) {
    let _alone = ONE_AT_A_TIME.lock().await;
    tokio::time::timeout(limit, test)
        .await
        .expect("key exchange case within its timeout");
}

/// A UnionPay simplex service: 4 out links to `accept`, in links on
/// `listen`, the nodes at `nodes`, `integrity` appended to
/// `[service.integrity]`. A sign-on UnionPay answers before its in links
/// are up is lost; it is sent again soon.
fn unionpay_config(
    admin_toml: &str,
    accept: SocketAddr,
    listen: SocketAddr,
    nodes: &[SocketAddr],
    integrity: &str,
) -> String {
    format!(
        "{admin_toml}[[service]]\nname = \"unionpay\"\nspec = \"cups\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
         [service.front]\nkind = \"simplex\"\nconnect = \"{accept}\"\nlisten = \"{listen}\"\nlinks = 4\n\
         member_id = \"03105840\"\npeer_id = \"00010000\"\nkeepalive_idle = \"200ms\"\n\
         reconnect_min = \"20ms\"\nreconnect_max = \"200ms\"\nsign_on_retry = \"300ms\"\n\
         [service.integrity]\n{integrity}\n\
         [service.back]\nconnections_per_node = 2\nreconnect_min = \"20ms\"\nreconnect_max = \"200ms\"\n{}",
        nodes_toml(nodes)
    )
}

/// The last number on the first metrics line that starts with `name` and
/// contains `label`.
fn metric(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l.contains(label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Waits (bounded by the case's timeout) until the switch has every node in
/// `up` eligible and `links` out links usable, so that what UnionPay sends
/// first already finds its way.
async fn wait_ready(admin: SocketAddr, up: &[&str], links: f64) {
    // The admin listener opens after the service's own.
    wait_listening(admin).await;
    loop {
        let text = metrics(admin, &["isoswitch_server_", "isoswitch_link_set_"]).await;
        let nodes_up = up.iter().all(|id| {
            metric(
                &text,
                "isoswitch_server_effective_weight",
                &format!("server=\"{id}\""),
            ) > 0.0
        });
        if nodes_up && metric(&text, "isoswitch_link_set_usable", "") >= links {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts the switch process on `toml`, with its in-link listener up.
async fn start_switch(name: &str, toml: &str, listen: SocketAddr) -> Proc {
    let path = write_config(name, toml);
    let p = path.to_string_lossy().into_owned();
    let data = data_dir(name);
    let switch = Proc::spawn(name, &["run", "--config", &p, "--data-dir", &data]);
    wait_listening(listen).await;
    switch
}

/// `sim cups`: accepting the out links on `accept`, 4 in links to `listen`,
/// with `extra` arguments.
async fn start_cups(name: &str, accept: SocketAddr, listen: SocketAddr, extra: &[&str]) -> Proc {
    let (a, l) = (accept.to_string(), listen.to_string());
    let mut args = vec![
        "sim",
        "cups",
        "--accept",
        &a,
        "--connect",
        &l,
        "--links",
        "4",
        "--timeout",
        "3s",
        "--keepalive-idle",
        "200ms",
        "--json",
    ];
    args.extend_from_slice(extra);
    let cups = Proc::spawn(name, &args);
    wait_listening(accept).await;
    cups
}

fn key_resets(node: &serde_json::Value) -> u64 {
    node["key_resets"]
        .as_object()
        .map_or(0, |m| m.values().filter_map(|v| v.as_u64()).sum())
}

/// UnionPay resets keys every 200 ms for 3 s, issuer requests beside them:
/// every reset reaches node 02 (the configured key node), none another
/// node, and every 0810 comes back to UnionPay with F39 00.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unionpay_key_resets_reach_the_key_node_and_its_answers_the_peer() {
    within(Duration::from_secs(90), async {
        let (nodes, addrs) = start_nodes_with("cups", 3, "0..5ms", &["--json"]).await;
        let (accept, listen) = (free_addr(), free_addr());
        let (admin, admin_toml) = admin_toml("keys-reset-switch");
        let toml = unionpay_config(&admin_toml, accept, listen, &addrs, "key_nodes = [\"02\"]");
        // The switch with its nodes first, so that UnionPay's first reset
        // finds the key node up (its out links dial UnionPay until it
        // listens; answers wait for them).
        let _switch = start_switch("keys-reset-switch", &toml, listen).await;
        wait_ready(admin, &["01", "02", "03"], 0.0).await;
        let cups = start_cups(
            "keys-reset-cups",
            accept,
            listen,
            &[
                "--rate",
                "20",
                "--duration",
                "3s",
                "--key-reset-every",
                "200ms",
            ],
        )
        .await;
        // It stops by itself after --duration, once its resets are answered.
        let report = cups.report().await;
        let mut node_reports = Vec::new();
        for node in nodes {
            node.signal("INT");
            node_reports.push(node.report().await);
        }
        let seen = metrics(
            admin,
            &[
                "isoswitch_service_key_exchange",
                "isoswitch_service_network",
            ],
        )
        .await;
        eprintln!("UnionPay: {report}");
        for (i, r) in node_reports.iter().enumerate() {
            eprintln!("node {:02}: {r}", i + 1);
        }
        eprintln!("the switch's counters:\n{seen}");

        let sent = n(&report, "key_resets_sent");
        assert!(sent >= 5, "key resets sent: {report}");
        assert_eq!(n(&report, "key_resets_unanswered"), 0, "{report}");
        assert_eq!(n(&report, "key_resets_answered"), sent, "{report}");
        assert_eq!(
            report["key_reset_f39"],
            serde_json::json!({ "00": sent }),
            "every 0810 is the key node's approval: {report}"
        );
        assert_eq!(
            node_reports[1]["key_resets"],
            serde_json::json!({ "101": sent }),
            "every reset reached the key node"
        );
        for i in [0, 2] {
            assert_eq!(key_resets(&node_reports[i]), 0, "node {:02}", i + 1);
        }
        // The issuer traffic beside them is unaffected.
        assert_eq!(n(&report, "mismatched"), 0, "{report}");
        assert_eq!(n(&report, "unanswered"), 0, "{report}");
    })
    .await;
}

/// Three nodes each send a key request every 200 ms: every one reaches
/// UnionPay, and every answer comes back to the node that asked (none to
/// another: a node counts an answer to a request it never sent as foreign).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_key_requests_go_out_and_their_answers_come_back_to_that_node() {
    within(Duration::from_secs(90), async {
        let (nodes, addrs) = start_nodes_with(
            "cups",
            3,
            "0..5ms",
            &["--key-request-every", "200ms", "--json"],
        )
        .await;
        let (accept, listen) = (free_addr(), free_addr());
        let (admin, admin_toml) = admin_toml("keys-request-switch");
        let toml = unionpay_config(&admin_toml, accept, listen, &addrs, "");
        // UnionPay first: the nodes ask as soon as the switch connects to
        // them, and their requests then find out links coming up at once.
        let cups = start_cups("keys-request-cups", accept, listen, &["--duration", "60s"]).await;
        let _switch = start_switch("keys-request-switch", &toml, listen).await;
        wait_ready(admin, &["01", "02", "03"], 4.0).await;
        // Key requests flowing: five rounds' worth of the three nodes' (one
        // each 200 ms), about a second on a machine that keeps up.
        wait_metric_sum(admin, "isoswitch_service_node_key_exchange", &[], 15.0).await;
        // The nodes stop asking and report once their requests are settled,
        // while UnionPay still answers; then UnionPay stops.
        let mut node_reports = Vec::new();
        for node in nodes {
            node.signal("INT");
            node_reports.push(node.report().await);
        }
        cups.signal("INT");
        let report = cups.report().await;
        let seen = metrics(
            admin,
            &[
                "isoswitch_service_node_key_exchange",
                "isoswitch_service_declines",
            ],
        )
        .await;
        eprintln!("UnionPay: {report}");
        for (i, r) in node_reports.iter().enumerate() {
            eprintln!("node {:02}: {r}", i + 1);
        }
        eprintln!("the switch's counters:\n{seen}");

        let mut total = 0;
        for (i, r) in node_reports.iter().enumerate() {
            let k = &r["key_requests"];
            let sent = n(k, "sent");
            assert!(sent >= 1, "node {:02} sent no key request: {r}", i + 1);
            assert_eq!(n(k, "answered"), sent, "node {:02}: {r}", i + 1);
            assert_eq!(n(k, "unanswered"), 0, "node {:02}: {r}", i + 1);
            assert_eq!(
                n(r, "foreign_responses"),
                0,
                "node {:02} got another's answer: {r}",
                i + 1
            );
            total += sent;
        }
        assert_eq!(
            report["member_key_requests"],
            serde_json::json!({ "101": total }),
            "every key request reached UnionPay: {report}"
        );
    })
    .await;
}

/// The key node is down (nothing listens at its address): UnionPay's key
/// resets are declined with F39 91, never approved by the switch, and the
/// live node never sees one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_key_node_up_a_key_reset_is_declined_not_approved() {
    within(Duration::from_secs(90), async {
        let (nodes, mut addrs) = start_nodes_with("cups", 1, "0..5ms", &["--json"]).await;
        // Node 02: configured, its port held by this test and never
        // listening, so every connect to it is refused.
        let (down, _held) = dead_addr();
        addrs.push(down);
        let (accept, listen) = (free_addr(), free_addr());
        let (admin, admin_toml) = admin_toml("keys-down-switch");
        let toml = unionpay_config(&admin_toml, accept, listen, &addrs, "key_nodes = [\"02\"]");
        let _switch = start_switch("keys-down-switch", &toml, listen).await;
        wait_ready(admin, &["01"], 0.0).await;
        let cups = start_cups(
            "keys-down-cups",
            accept,
            listen,
            &["--duration", "1s", "--key-reset-every", "200ms"],
        )
        .await;
        let report = cups.report().await;
        let mut node_reports = Vec::new();
        for node in nodes {
            node.signal("INT");
            node_reports.push(node.report().await);
        }
        eprintln!("UnionPay: {report}");
        eprintln!("node 01: {}", node_reports[0]);
        let sent = n(&report, "key_resets_sent");
        assert!(sent >= 1, "{report}");
        assert_eq!(n(&report, "key_resets_answered"), sent, "{report}");
        assert_eq!(
            report["key_reset_f39"],
            serde_json::json!({ "91": sent }),
            "{report}"
        );
        assert_eq!(key_resets(&node_reports[0]), 0);
    })
    .await;
}

/// A VISA duplex service: 2 links dialled to `visa`, signed on per link,
/// the nodes at `nodes`, `integrity` appended to `[service.integrity]`.
fn visa_config(
    admin_toml: &str,
    visa: SocketAddr,
    nodes: &[SocketAddr],
    integrity: &str,
) -> String {
    format!(
        "{admin_toml}[[service]]\nname = \"visa\"\nspec = \"visa-base1\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
         [service.front]\nkind = \"connect\"\nconnect = \"{visa}\"\nlinks = 2\nsign_on = \"per-link\"\n\
         sign_on_retry = \"300ms\"\nreconnect_min = \"20ms\"\nreconnect_max = \"200ms\"\n\
         [service.integrity]\n{integrity}\n\
         [service.back]\nconnections_per_node = 2\nreconnect_min = \"20ms\"\nreconnect_max = \"200ms\"\n{}",
        nodes_toml(nodes)
    )
}

/// `sim visa` accepting the switch's 2 links on `at`, with `extra`.
async fn start_visa(name: &str, at: SocketAddr, extra: &[&str]) -> Proc {
    let a = at.to_string();
    let mut args = vec![
        "sim",
        "visa",
        "--accept",
        &a,
        "--links",
        "2",
        "--timeout",
        "3s",
        "--json",
    ];
    args.extend_from_slice(extra);
    let visa = Proc::spawn(name, &args);
    wait_listening(at).await;
    visa
}

/// VISA starts a dynamic key exchange (0800 F70 161, an institution code)
/// every 200 ms for 3 s: every one reaches node 02 (the key node, by its
/// BCD F70 read as text), none another node, and every 0810 comes back to
/// VISA with the node's F39 00.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visa_key_exchanges_reach_the_key_node_and_its_answers_visa() {
    visa_key_exchanges_with_f70("161").await;
}

/// Key exchange is an allowlist: a code the dialect names nowhere (188) is
/// not the link's, so the switch never answers it 00 itself: it reaches the
/// key node like any institution code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlisted_network_code_goes_to_the_key_node_not_answered_by_the_switch() {
    visa_key_exchanges_with_f70("188").await;
}

async fn visa_key_exchanges_with_f70(f70: &str) {
    // Its two cases run at once: every file and directory is named by F70.
    let name = format!("keys-visa-switch-{f70}");
    within(Duration::from_secs(90), async {
        let (nodes, addrs) = start_nodes_with("visa-base1", 3, "0..5ms", &["--json"]).await;
        let visa_addr = free_addr();
        let (admin, admin_toml) = admin_toml(&name);
        let toml = visa_config(&admin_toml, visa_addr, &addrs, "key_nodes = [\"02\"]");
        let path = write_config(&name, &toml);
        let p = path.to_string_lossy().into_owned();
        let data = data_dir(&name);
        let _switch = Proc::spawn(&name, &["run", "--config", &p, "--data-dir", &data]);
        wait_ready(admin, &["01", "02", "03"], 0.0).await;
        let visa = start_visa(
            &format!("keys-visa-{f70}"),
            visa_addr,
            &[
                "--duration",
                "3s",
                "--key-reset-every",
                "200ms",
                "--key-reset-f70",
                f70,
            ],
        )
        .await;
        // It stops by itself after --duration, once its exchanges are answered.
        let report = visa.report().await;
        let mut node_reports = Vec::new();
        for node in nodes {
            node.signal("INT");
            node_reports.push(node.report().await);
        }
        eprintln!("VISA: {report}");
        for (i, r) in node_reports.iter().enumerate() {
            eprintln!("node {:02}: {r}", i + 1);
        }
        let sent = n(&report, "key_resets_sent");
        assert!(sent >= 5, "key exchanges sent: {report}");
        assert_eq!(n(&report, "key_resets_unanswered"), 0, "{report}");
        assert_eq!(n(&report, "key_resets_answered"), sent, "{report}");
        assert_eq!(
            report["key_reset_f39"],
            serde_json::json!({ "00": sent }),
            "every 0810 is the key node's approval: {report}"
        );
        assert_eq!(
            node_reports[1]["key_resets"],
            serde_json::json!({ f70: sent }),
            "every exchange reached the key node"
        );
        for i in [0, 2] {
            assert_eq!(key_resets(&node_reports[i]), 0, "node {:02}", i + 1);
        }
    })
    .await;
}

/// Three nodes each send a key request every 200 ms over VISA's duplex
/// links: every one reaches VISA, and every answer comes back to the node
/// that asked, by F11 + F7 + F70 (none to another).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_key_requests_reach_visa_and_their_answers_that_node() {
    within(Duration::from_secs(90), async {
        let (nodes, addrs) = start_nodes_with(
            "visa-base1",
            3,
            "0..5ms",
            &["--key-request-every", "200ms", "--json"],
        )
        .await;
        let visa_addr = free_addr();
        let (admin, admin_toml) = admin_toml("keys-visa-request-switch");
        let toml = visa_config(&admin_toml, visa_addr, &addrs, "");
        let visa = start_visa("keys-visa-requests", visa_addr, &["--duration", "60s"]).await;
        let path = write_config("keys-visa-request-switch", &toml);
        let p = path.to_string_lossy().into_owned();
        let data = data_dir("keys-visa-request-switch");
        let _switch = Proc::spawn(
            "keys-visa-request-switch",
            &["run", "--config", &p, "--data-dir", &data],
        );
        wait_ready(admin, &["01", "02", "03"], 2.0).await;
        wait_metric_sum(admin, "isoswitch_service_node_key_exchange", &[], 15.0).await;
        let mut node_reports = Vec::new();
        for node in nodes {
            node.signal("INT");
            node_reports.push(node.report().await);
        }
        visa.signal("INT");
        let report = visa.report().await;
        eprintln!("VISA: {report}");
        let mut total = 0;
        for (i, r) in node_reports.iter().enumerate() {
            eprintln!("node {:02}: {r}", i + 1);
            let k = &r["key_requests"];
            let sent = n(k, "sent");
            assert!(sent >= 1, "node {:02} sent no key request: {r}", i + 1);
            assert_eq!(n(k, "answered"), sent, "node {:02}: {r}", i + 1);
            assert_eq!(n(k, "unanswered"), 0, "node {:02}: {r}", i + 1);
            assert_eq!(n(r, "foreign_responses"), 0, "node {:02}: {r}", i + 1);
            total += sent;
        }
        assert_eq!(
            report["bank_key_requests"],
            serde_json::json!({ "101": total }),
            "every key request reached VISA: {report}"
        );
    })
    .await;
}
