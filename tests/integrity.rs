//! Integrity with real processes: the `isoswitch` binary as the switch with
//! its SQLite store, `sim node` processes as hosts that approve a share of
//! requests late and keep their own books of the reversals and advices they
//! get, `sim nac` and `sim cups` as senders. The simulators never use the
//! switch's code to decide what is right (src/sim/ledger.rs,
//! src/sim/original.rs), and the store is read with rusqlite from outside.
//!
//! No assertion is on timing. Where a case must wait for the switch to be
//! done (every late approval turned into a stored reversal, every owed entry
//! delivered), it polls the store until the state holds, within the case's
//! own timeout.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[path = "common/procs.rs"]
mod procs;
use procs::*;

/// One case at a time: each runs a switch, nodes and a sender at load, and a
/// 2-core machine running two would answer late for the wrong reason.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn within<F: std::future::Future<Output = ()>>(limit: Duration, test: F) {
    let _alone = ONE_AT_A_TIME.lock().await;
    tokio::time::timeout(limit, test)
        .await
        .expect("integrity case within its timeout");
}

/// A `sim node` on `spec` with id `id`, reporting JSON on SIGINT.
async fn node(spec: &str, id: &str, addr: SocketAddr, delay: &str, extra: &[&str]) -> Proc {
    let a = addr.to_string();
    let mut args = vec![
        "sim", "node", "--listen", &a, "--spec", spec, "--id", id, "--delay", delay, "--json",
    ];
    args.extend_from_slice(extra);
    let p = Proc::spawn(&format!("node{id}-{}", addr.port()), &args);
    p.wait_logged("sim node listening on").await;
    p
}

/// Stops a node (SIGINT: it settles and prints its books) and returns them.
async fn books(node: Proc) -> serde_json::Value {
    node.signal("INT");
    node.report().await
}

fn sub(report: &serde_json::Value, book: &str, key: &str) -> u64 {
    report[book][key]
        .as_u64()
        .unwrap_or_else(|| panic!("report has no {book}.{key}: {report}"))
}

/// The switch with `toml`, its data directory `data` (the store is
/// `data/isoswitch.db`), listening on `listen`.
async fn switch(name: &str, toml: &str, data: &str, listen: SocketAddr) -> Proc {
    let path = write_config(name, toml);
    let p = path.to_string_lossy().into_owned();
    let s = Proc::spawn(name, &["run", "--config", &p, "--data-dir", data]);
    wait_listening(listen).await;
    s
}

/// A POS service on `listen` before `nodes`: requests time out after 500 ms
/// (declined 68 to the terminal), reversals and advices get 2 s, a failed
/// store-and-forward attempt is retried after `retry`. `extra` goes into
/// `[service.integrity]`.
fn pos_toml(listen: SocketAddr, nodes: &[SocketAddr], retry: &str, extra: &str) -> String {
    format!(
        "[store.saf]\nretry = \"{retry}\"\nretry_max = \"{retry}\"\n\
         [[service]]\nname = \"pos\"\nspec = \"cup-pos\"\n\
         [service.front]\nkind = \"listen\"\nlisten = \"{listen}\"\n\
         [service.back]\nconnections_per_node = 2\nreconnect_min = \"50ms\"\nreconnect_max = \"200ms\"\n\
         [service.timeouts]\nrequest = \"500ms\"\nby_mti = {{ \"04x0\" = \"2s\", \"02x0\" = \"500ms\", \"0220\" = \"2s\" }}\n\
         [service.integrity]\nlate_approval = \"reverse\"\n{extra}\n{}",
        nodes_toml(nodes)
    )
}

/// A NAC process on `cup-pos`: `rate` a second for `duration`, waiting
/// `timeout` for each answer, `extra` args.
fn nac(
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

/// One row of the store's SAF table, as the test reads it.
#[derive(Debug)]
struct SafRow {
    kind: String,
    state: String,
    mti: String,
    attempts: i64,
    node_id: Option<String>,
    direction: String,
    f11: Option<String>,
    pan_masked: Option<String>,
}

fn db_path(data: &str) -> PathBuf {
    Path::new(data).join("isoswitch.db")
}

/// Every SAF row of the store at `data`, read-only from outside the switch
/// (SQLite in WAL mode lets a reader beside the writer).
fn saf_rows(data: &str) -> Vec<SafRow> {
    let path = db_path(data);
    if !path.exists() {
        return Vec::new();
    }
    let db = rusqlite::Connection::open_with_flags(
        &path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    db.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    let mut st = db
        .prepare(
            "SELECT kind, state, mti, attempts, node_id, direction, f11, pan_masked FROM saf ORDER BY id",
        )
        .expect("the saf table");
    st.query_map([], |r| {
        Ok(SafRow {
            kind: r.get(0)?,
            state: r.get(1)?,
            mti: r.get(2)?,
            attempts: r.get(3)?,
            node_id: r.get(4)?,
            direction: r.get(5)?,
            f11: r.get(6)?,
            pan_masked: r.get(7)?,
        })
    })
    .expect("query saf")
    .collect::<Result<_, _>>()
    .expect("saf rows")
}

fn count(rows: &[SafRow], kind: &str, state: &str) -> usize {
    rows.iter()
        .filter(|r| r.kind == kind && r.state == state)
        .count()
}

/// Rows by kind and state: what "the store settled" compares (attempts
/// and retry times move on while nothing else does).
fn tally(rows: &[SafRow]) -> std::collections::BTreeMap<(String, String), usize> {
    let mut t = std::collections::BTreeMap::new();
    for r in rows {
        *t.entry((r.kind.clone(), r.state.clone())).or_default() += 1;
    }
    t
}

/// Polls the store until `done` holds for the rows, with the same tally in
/// two reads `settle` apart; returns them. The case's timeout bounds it.
async fn store_settles(
    data: &str,
    settle: Duration,
    done: impl Fn(&[SafRow]) -> bool,
) -> Vec<SafRow> {
    let mut last = None;
    loop {
        let rows = saf_rows(data);
        eprintln!("store: {:?}", tally(&rows));
        let now = Some(tally(&rows));
        if done(&rows) && last == now {
            return rows;
        }
        last = now;
        tokio::time::sleep(settle).await;
    }
}

/// Checks a node's reversal book against the switch's duty: one chain per
/// late approval, none for anything else, every F90 readable. Returns the
/// node's late approvals.
fn assert_reversed_exactly(id: &str, r: &serde_json::Value) -> u64 {
    let late = sub(r, "reversals", "late_approvals");
    assert_eq!(
        sub(r, "reversals", "late_never_reversed"),
        0,
        "node {id}: a late approval was never reversed: {r}"
    );
    assert_eq!(
        sub(r, "reversals", "chains"),
        late,
        "node {id}: one chain per late approval: {r}"
    );
    assert_eq!(sub(r, "reversals", "chains_late"), late, "node {id}: {r}");
    assert_eq!(
        sub(r, "reversals", "chains_not_late"),
        0,
        "node {id}: a reversal for a decline or an answer in time: {r}"
    );
    assert_eq!(
        sub(r, "reversals", "duplicate_chains"),
        0,
        "node {id}: a second 0420 for one original: {r}"
    );
    assert_eq!(
        sub(r, "reversals", "unreadable"),
        0,
        "node {id}: F90 named no original: {r}"
    );
    late
}

/// NAC at 200 req/s through the switch to 3 nodes; 5% of approvals come
/// 1 s past the switch's 500 ms timeout (the terminal got 68). Each is
/// reversed at the node that approved it: one chain (0420, then 0421 only
/// while unanswered: node 01 ignores the first message of each chain), each
/// acknowledged; nothing for a decline or an answer in time; every F90 names
/// the original by the node's own reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_late_approval_is_reversed_once_at_the_node_that_approved() {
    within(Duration::from_secs(120), async {
        let late = ["--late-share", "0.05", "--late-by", "1500ms"];
        let addrs = [free_addr(), free_addr(), free_addr()];
        let mut nodes = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            let mut extra = late.to_vec();
            if i == 0 {
                extra.extend(["--ignore-reversals", "1"]);
            }
            nodes.push(node("cup-pos", &format!("0{}", i + 1), *a, "2..20ms", &extra).await);
        }
        let listen = free_addr();
        let data = data_dir("late-switch");
        let _switch = switch(
            "late-switch",
            &pos_toml(listen, &addrs, "300ms", ""),
            &data,
            listen,
        )
        .await;
        let report = nac("late-nac", listen, 200, ("3s", "5s"), &[])
            .report()
            .await;
        eprintln!("NAC: {report}");
        assert_exactly_once(&report);
        assert!(n(&report, "declined") > 0, "late ones declined: {report}");
        // Every late approval arrives within the nodes' --late-by of the
        // NAC's end; then the store must hold every reversal, delivered.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            !rows.is_empty() && count(rows, "reversal", "pending") == 0
        })
        .await;
        let mut reports = Vec::new();
        for host in nodes {
            reports.push(books(host).await);
        }
        let mut late_total = 0;
        for (i, r) in reports.iter().enumerate() {
            eprintln!("node 0{}: {r}", i + 1);
            late_total += assert_reversed_exactly(&format!("0{}", i + 1), r);
        }
        assert!(late_total > 0, "some approvals came late: {reports:?}");
        // Node 01 ignored each chain's 0420: each chain went on as one 0421.
        let (first, rest) = (&reports[0], &reports[1..]);
        let first_chains = sub(first, "reversals", "chains");
        assert_eq!(sub(first, "reversals", "ignored"), first_chains, "{first}");
        assert_eq!(sub(first, "reversals", "repeats"), first_chains, "{first}");
        for r in rest {
            assert_eq!(
                sub(r, "reversals", "repeats"),
                0,
                "answered at once, never repeated: {r}"
            );
        }
        // The store: one delivered reversal per late approval, to the node
        // that approved it, with listing keys and a masked PAN only.
        assert_eq!(rows.len() as u64, late_total, "{rows:#?}");
        for (i, r) in reports.iter().enumerate() {
            let id = format!("0{}", i + 1);
            let stored = rows
                .iter()
                .filter(|row| row.node_id.as_deref() == Some(id.as_str()))
                .count() as u64;
            assert_eq!(stored, sub(r, "reversals", "late_approvals"), "node {id}");
        }
        for row in &rows {
            assert_eq!(
                (row.kind.as_str(), row.state.as_str()),
                ("reversal", "delivered")
            );
            assert_eq!(row.mti, "0420", "{row:?}");
            assert_eq!(row.direction, "to_node", "{row:?}");
            assert!(row.f11.as_deref().is_some_and(|s| s.len() == 6), "{row:?}");
            let pan = row.pan_masked.as_deref().unwrap_or_default();
            assert!(pan.contains('*') || pan.is_empty(), "PAN masked: {row:?}");
            let want = if row.node_id.as_deref() == Some("01") {
                2
            } else {
                1
            };
            assert_eq!(row.attempts, want, "{row:?}");
        }
    })
    .await;
}

/// kill -9 of the switch while reversals wait for their next attempt and
/// acknowledged advices wait for a node: after a restart on the same data
/// directory, every one is delivered (as repeats) and none is lost; the
/// counts match the nodes' own books.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_reversals_and_advices_owed_then_restart_delivers_every_one() {
    within(Duration::from_secs(150), async {
        // Service "pos": nodes approve 10% late and ignore each chain's first
        // two reversal messages, so every reversal is still owed at the kill.
        let late_addrs = [free_addr(), free_addr()];
        let mut late_nodes = Vec::new();
        for (i, a) in late_addrs.iter().enumerate() {
            let extra = ["--late-share", "0.1", "--late-by", "1s", "--ignore-reversals", "2"];
            late_nodes.push(node("cup-pos", &format!("0{}", i + 1), *a, "2..20ms", &extra).await);
        }
        // Service "advices": its node is down until after the restart, so
        // every advice the switch acknowledged is owed at the kill.
        let advice_node = free_addr();
        let (pos, adv) = (free_addr(), free_addr());
        let data = data_dir("owed-switch");
        let toml = format!(
            "{}\n[[service]]\nname = \"advices\"\nspec = \"cup-pos\"\n\
             [service.front]\nkind = \"listen\"\nlisten = \"{adv}\"\n\
             [service.back]\nconnections_per_node = 1\nreconnect_min = \"50ms\"\nreconnect_max = \"200ms\"\n\
             [service.integrity]\nadvices = \"store-and-forward\"\n{}",
            pos_toml(pos, &late_addrs, "8s", ""),
            nodes_toml(&[advice_node])
        );
        let mut first = switch("owed-switch", &toml, &data, pos).await;
        wait_listening(adv).await;
        let pos_nac = nac("owed-nac", pos, 150, ("2s", "5s"), &[]);
        let adv_nac = nac(
            "owed-advice-nac",
            adv,
            50,
            ("2s", "5s"),
            &["--advice-share", "1", "--nac-id", "2"],
        );
        let (pos_report, adv_report) = (pos_nac.report().await, adv_nac.report().await);
        eprintln!("NAC pos: {pos_report}\nNAC advices: {adv_report}");
        assert_exactly_once(&pos_report);
        let advices = n(&adv_report, "advices_sent");
        assert!(advices > 0, "{adv_report}");
        assert_eq!(
            n(&adv_report, "advice_acks"),
            advices,
            "each advice acknowledged once stored: {adv_report}"
        );
        // Past the late approvals: every one is a stored reversal, its first
        // attempt ignored, its next one seconds away.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let owed = store_settles(&data, Duration::from_millis(700), |rows| {
            count(rows, "advice", "pending") as u64 == advices
                && count(rows, "reversal", "pending") > 0
        })
        .await;
        let reversals = count(&owed, "reversal", "pending");
        assert_eq!(count(&owed, "reversal", "delivered"), 0, "{owed:#?}");
        first.kill9().await;
        drop(first);

        let advice_host = node("cup-pos", "03", advice_node, "0ms", &[]).await;
        let _second = switch("owed-switch-2", &toml, &data, pos).await;
        let done = store_settles(&data, Duration::from_millis(1000), |rows| {
            count(rows, "reversal", "delivered") == reversals
                && count(rows, "advice", "delivered") as u64 == advices
        })
        .await;
        assert!(
            done.iter().all(|r| r.state == "delivered"),
            "nothing pending, dead or dropped: {done:#?}"
        );
        let adv_books = books(advice_host).await;
        eprintln!("advice node: {adv_books}");
        assert_eq!(
            sub(&adv_books, "advices", "distinct"),
            advices,
            "every advice acknowledged reached a host: {adv_books}"
        );
        let mut late_total = 0;
        for (i, host) in late_nodes.into_iter().enumerate() {
            let r = books(host).await;
            eprintln!("late node 0{}: {r}", i + 1);
            late_total += assert_reversed_exactly(&format!("0{}", i + 1), &r);
            // Two ignored, the third (a repeat, sent by the second switch
            // process) acknowledged.
            let chains = sub(&r, "reversals", "chains");
            assert_eq!(sub(&r, "reversals", "repeats"), 2 * chains, "{r}");
        }
        assert_eq!(late_total as usize, reversals, "{done:#?}");
    })
    .await;
}

/// Advices in `forward` mode with every node down: the switch never answers
/// one itself (a terminal that takes any 0230 as done would never repeat);
/// the NAC repeats, and once a node is back, its answer is the one the NAC
/// gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_advices_get_no_switch_made_answer_while_every_node_is_down() {
    within(Duration::from_secs(90), async {
        let node_addr = free_addr();
        let listen = free_addr();
        let data = data_dir("forward-switch");
        let (admin, admin_toml) = admin_toml("forward-switch");
        let toml = format!(
            "{admin_toml}[[service]]\nname = \"pos\"\nspec = \"cup-pos\"\n\
             [service.front]\nkind = \"listen\"\nlisten = \"{listen}\"\n\
             [service.back]\nconnections_per_node = 1\nreconnect_min = \"50ms\"\nreconnect_max = \"100ms\"\n\
             [service.timeouts]\nrequest = \"500ms\"\n{}",
            nodes_toml(&[node_addr])
        );
        let _switch = switch("forward-switch", &toml, &data, listen).await;
        let sender = nac(
            "forward-nac",
            listen,
            20,
            ("1500ms", "700ms"),
            &["--advice-share", "1", "--advice-repeats", "10"],
        );
        // The NAC's first advices meet no node; bring one up only after the
        // switch has had them (and would have answered them, if it did).
        let seen = |text: &str| {
            text.lines()
                .filter(|l| l.starts_with("isoswitch_service_requests_total"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        };
        while seen(&metrics(admin, &["isoswitch_service_requests_total"]).await) < 5.0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let host = node("cup-pos", "01", node_addr, "0ms", &[]).await;
        let report = sender.report().await;
        let host_books = books(host).await;
        eprintln!("NAC: {report}\nnode: {host_books}");
        let advices = n(&report, "advices_sent");
        assert!(advices > 0, "{report}");
        assert!(n(&report, "advice_repeats") > 0, "repeated while no node: {report}");
        assert_eq!(n(&report, "advices_unacknowledged"), 0, "{report}");
        assert_eq!(n(&report, "advice_acks"), advices, "{report}");
        // Every acknowledgement the NAC got came from the node: it saw every
        // advice (repeats included), and the switch made none.
        assert_eq!(sub(&host_books, "advices", "distinct"), advices, "{host_books}");
        assert!(
            saf_rows(&data).is_empty(),
            "forward mode stores nothing: {:?}",
            saf_rows(&data)
        );
    })
    .await;
}

/// UnionPay 8/8: the peer approves a share of the nodes' own requests past
/// the switch's timeout (the switch declined them to the node). Each is
/// reversed toward the peer on an out link, one chain each, acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unionpay_late_approvals_of_node_requests_are_reversed_toward_the_peer() {
    within(Duration::from_secs(120), async {
        let addrs = [free_addr(), free_addr()];
        let mut nodes = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            // Originating once every instance link is up and signed on.
            let extra = ["--originate", "40", "--originate-after", "2s"];
            nodes.push(node("cups", &format!("0{}", i + 1), *a, "0..10ms", &extra).await);
        }
        let (accept, listen) = (free_addr(), free_addr());
        let (a, l) = (accept.to_string(), listen.to_string());
        let cups = Proc::spawn(
            "late-cups",
            &[
                "sim", "cups", "--accept", &a, "--connect", &l, "--links", "8", "--rate", "20",
                "--duration", "60s", "--timeout", "3s", "--late-share", "0.1", "--late-by",
                "1500ms", "--ignore-reversals", "1", "--json",
            ],
        );
        wait_listening(accept).await;
        let data = data_dir("cups-late-switch");
        let toml = format!(
            "[store.saf]\nretry = \"300ms\"\nretry_max = \"300ms\"\n\
             [[service]]\nname = \"unionpay\"\nspec = \"cups\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
             [service.front]\nkind = \"simplex\"\nconnect = \"{accept}\"\nlisten = \"{listen}\"\nlinks = 8\n\
             member_id = \"03105840\"\npeer_id = \"00010000\"\nsign_on_retry = \"300ms\"\n\
             [service.back]\nconnections_per_node = 2\n\
             [service.timeouts]\nrequest = \"500ms\"\nnode_on_timeout = \"decline\"\nby_mti = {{ \"04x0\" = \"2s\" }}\n{}",
            nodes_toml(&addrs)
        );
        let path = write_config("cups-late-switch", &toml);
        let p = path.to_string_lossy().into_owned();
        let _switch = Proc::spawn("cups-late-switch", &["run", "--config", &p, "--data-dir", &data]);
        // Three seconds of the nodes' requests, then they stop originating
        // and settle; the late approvals land within --late-by after.
        tokio::time::sleep(Duration::from_secs(5)).await;
        for host in &nodes {
            host.signal("INT");
        }
        let mut node_reports = Vec::new();
        for host in nodes {
            node_reports.push(host.report().await);
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            !rows.is_empty() && count(rows, "reversal", "pending") == 0
        })
        .await;
        cups.signal("INT");
        let report = cups.report().await;
        for (i, r) in node_reports.iter().enumerate() {
            eprintln!("node 0{}: {r}", i + 1);
            assert!(n(r, "originated") > 0, "{r}");
            assert_eq!(n(r, "originated_unanswered"), 0, "{r}");
        }
        eprintln!("UnionPay: {report}");
        let late = assert_reversed_exactly("UnionPay", &report);
        assert!(late > 0, "UnionPay approved some late: {report}");
        let chains = sub(&report, "reversals", "chains");
        assert_eq!(sub(&report, "reversals", "repeats"), chains, "{report}");
        assert_eq!(rows.len() as u64, late, "{rows:#?}");
        for row in &rows {
            assert_eq!((row.kind.as_str(), row.state.as_str()), ("reversal", "delivered"));
            assert_eq!(row.direction, "to_peer", "{row:?}");
            assert_eq!(row.attempts, 2, "the 0420 ignored, its 0421 answered: {row:?}");
        }
        let declined: u64 = node_reports.iter().map(|r| n(r, "originated_declined")).sum();
        assert!(declined >= late, "the switch declined each late one to its node first");
    })
    .await;
}
