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

use std::time::Duration;

#[path = "common/owed.rs"]
mod owed;
#[path = "common/procs.rs"]
mod procs;
use owed::*;
use procs::*;

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
        let (admin, admin_toml) = admin_toml("late-switch");
        let toml = PosToml::new(listen, &addrs).admin(&admin_toml).build();
        let _switch = switch("late-switch", &toml, &data, listen).await;
        let report = nac("late-nac", listen, 200, ("3s", "5s"), &[])
            .report()
            .await;
        eprintln!("NAC: {report}");
        assert_exactly_once(&report);
        assert!(n(&report, "declined") > 0, "late ones declined: {report}");
        // Once every late approval has arrived, the store must hold every
        // reversal, delivered.
        late_answers_in(admin).await;
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
        let (admin, admin_toml) = admin_toml("owed-switch");
        let toml = format!(
            "{admin_toml}{}\n[[service]]\nname = \"advices\"\nspec = \"cup-pos\"\n\
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
        // Once the late approvals are in, every one is a stored reversal,
        // its first attempt ignored, its next one seconds away.
        late_answers_in(admin).await;
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
        wait_metric_sum(admin, "isoswitch_service_requests", &[], 5.0).await;
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
        let (admin, admin_toml) = admin_toml("cups-late-switch");
        let toml = format!(
            "{admin_toml}[store.saf]\nretry = \"300ms\"\nretry_max = \"300ms\"\n\
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
        // Three seconds' worth of the nodes' requests (40/s each), some of
        // them approved late, then they stop originating and settle; the
        // late approvals still due land within --late-by after.
        wait_metric_sum(admin, "isoswitch_service_node_requests", &[], 240.0).await;
        wait_metric_sum(admin, "isoswitch_late_approvals", &[], 3.0).await;
        for host in &nodes {
            host.signal("INT");
        }
        let mut node_reports = Vec::new();
        for host in nodes {
            node_reports.push(host.report().await);
        }
        // Every late approval toward the nodes' requests has landed: the
        // nodes stopped only once each of their requests was answered or
        // declined, and UnionPay's own requests at a stopping node end
        // node-lost, not timed out, so each timeout is a late answer on its
        // way.
        late_answers_in(admin).await;
        // UnionPay's own requests in flight at a node as it stops get
        // timeout reversals to that node, pending until it is back: not
        // what this case counts.
        let to_peer = |rows: Vec<SafRow>| -> Vec<SafRow> {
            rows.into_iter().filter(|r| r.direction == "to_peer").collect()
        };
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            let rows: Vec<_> = rows.iter().filter(|r| r.direction == "to_peer").collect();
            !rows.is_empty() && rows.iter().all(|r| r.state != "pending")
        })
        .await;
        let rows = to_peer(rows);
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

/// Only a host's "done" closes what the switch owes. Three hosts approve
/// 10% late and answer each reversal chain their own way: node 01 with 96
/// (system error) twice, then 00; node 02 with 25 (original not found);
/// node 03 with 12 (invalid transaction). Node 01's reversals are tried
/// three times, then delivered; node 02's are delivered at once, flagged
/// for reconciliation; node 03's are dead letters at once, never repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reversal_closes_only_on_the_host_done_code() {
    within(Duration::from_secs(120), async {
        let answers = ["96,96,00", "25", "12"];
        let addrs = [free_addr(), free_addr(), free_addr()];
        let mut nodes = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            let extra = [
                "--late-share",
                "0.1",
                "--late-by",
                "1s",
                "--reversal-answers",
                answers[i],
            ];
            nodes.push(node("cup-pos", &format!("0{}", i + 1), *a, "2..20ms", &extra).await);
        }
        let listen = free_addr();
        let data = data_dir("host-done-switch");
        let (admin, admin_toml) = admin_toml("host-done-switch");
        let toml = PosToml::new(listen, &addrs).admin(&admin_toml).build();
        let _switch = switch("host-done-switch", &toml, &data, listen).await;
        let report = nac("host-done-nac", listen, 100, ("3s", "5s"), &[])
            .report()
            .await;
        assert_exactly_once(&report);
        late_answers_in(admin).await;
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            !rows.is_empty() && rows.iter().all(|r| r.state != "pending")
        })
        .await;
        let of = |id: &str| -> Vec<&SafRow> {
            rows.iter()
                .filter(|r| r.node_id.as_deref() == Some(id))
                .collect()
        };
        let mut books_of = Vec::new();
        for host in nodes {
            books_of.push(books(host).await);
        }
        for (i, r) in books_of.iter().enumerate() {
            let id = format!("0{}", i + 1);
            eprintln!("node {id}: {r}");
            let late = sub(r, "reversals", "late_approvals");
            assert!(late > 0, "node {id} approved some late: {r}");
            assert_eq!(
                of(&id).len() as u64,
                late,
                "node {id}: one entry per late approval"
            );
            assert_eq!(sub(r, "reversals", "chains"), late, "node {id}: {r}");
        }
        for row in of("01") {
            assert_eq!(
                (row.state.as_str(), row.attempts),
                ("delivered", 3),
                "{row:?}"
            );
            assert_eq!(row.answer.as_deref(), Some("0430 F39 00"), "{row:?}");
            assert_eq!(row.reason, None, "{row:?}");
        }
        assert_eq!(
            sub(&books_of[0], "reversals", "repeats"),
            2 * sub(&books_of[0], "reversals", "chains"),
            "each chain: 0420 (96), 0421 (96), 0421 (00)"
        );
        for row in of("02") {
            assert_eq!(
                (row.state.as_str(), row.attempts),
                ("delivered", 1),
                "{row:?}"
            );
            let reason = row.reason.as_deref().unwrap_or_default();
            assert!(
                reason.contains("reconcile") && reason.contains("25"),
                "{row:?}"
            );
        }
        for row in of("03") {
            assert_eq!((row.state.as_str(), row.attempts), ("dead", 1), "{row:?}");
            let reason = row.reason.as_deref().unwrap_or_default();
            assert!(reason.contains("F39 12"), "{row:?}");
        }
        assert_eq!(
            sub(&books_of[2], "reversals", "repeats"),
            0,
            "a refusal is not repeated"
        );
    })
    .await;
}

/// The host never answers 5% of the requests (the terminal gets 68 at the
/// switch's 500 ms): the outcome at the host is unknown, so each gets one
/// timeout reversal at that node, stored as the switch declines, and
/// nothing else gets one. The nodes' books say which they left unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_host_never_answers_is_reversed_once_at_that_node() {
    within(Duration::from_secs(120), async {
        let addrs = [free_addr(), free_addr()];
        let mut nodes = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            let extra = ["--fail-rate", "0.05"];
            nodes.push(node("cup-pos", &format!("0{}", i + 1), *a, "2..20ms", &extra).await);
        }
        let listen = free_addr();
        let data = data_dir("unanswered-switch");
        let _switch = switch(
            "unanswered-switch",
            &pos_toml(listen, &addrs, "300ms", ""),
            &data,
            listen,
        )
        .await;
        let report = nac("unanswered-nac", listen, 100, ("3s", "5s"), &[])
            .report()
            .await;
        assert_exactly_once(&report);
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            !rows.is_empty() && count(rows, "reversal", "pending") == 0
        })
        .await;
        let mut unanswered = 0;
        for (i, host) in nodes.into_iter().enumerate() {
            let id = format!("0{}", i + 1);
            let r = books(host).await;
            eprintln!("node {id}: {r}");
            let n = sub(&r, "reversals", "unanswered");
            assert!(n > 0, "node {id} left some unanswered: {r}");
            assert_eq!(
                sub(&r, "reversals", "chains_unanswered"),
                n,
                "node {id}: {r}"
            );
            assert_eq!(
                sub(&r, "reversals", "unanswered_never_reversed"),
                0,
                "node {id}: {r}"
            );
            assert_eq!(sub(&r, "reversals", "chains_not_late"), 0, "node {id}: {r}");
            assert_eq!(
                sub(&r, "reversals", "duplicate_chains"),
                0,
                "node {id}: {r}"
            );
            let stored = rows
                .iter()
                .filter(|row| row.node_id.as_deref() == Some(id.as_str()))
                .count() as u64;
            assert_eq!(
                stored,
                sub(&r, "reversals", "chains"),
                "node {id}: one entry a chain"
            );
            unanswered += n;
        }
        assert!(
            n(&report, "declined") >= unanswered,
            "the terminal got a decline for each: {report}"
        );
        for row in &rows {
            assert_eq!(
                (row.kind.as_str(), row.state.as_str()),
                ("reversal", "delivered")
            );
        }
    })
    .await;
}

/// A terminal's repeat (0201) of a purchase the switch declined at its
/// timeout and reversed is declined by the switch itself, never relayed: the
/// host, which approved the original late, would approve the repeat, and the
/// terminal would show an approval for a reversed sale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_of_a_reversed_purchase_is_never_relayed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    within(Duration::from_secs(60), async {
        let addr = free_addr();
        let extra = ["--late-share", "1", "--late-by", "1s"];
        let host = node("cup-pos", "01", addr, "0ms", &extra).await;
        let listen = free_addr();
        let data = data_dir("repeat-switch");
        let _switch = switch(
            "repeat-switch",
            &pos_toml(listen, &[addr], "300ms", ""),
            &data,
            listen,
        )
        .await;
        let spec = isoswitch::iso8583::Spec::builtin("cup-pos").expect("cup-pos");
        let original = isoswitch::sim::sample_request(&spec, "0200").expect("a 0200");
        let mut repeat = spec.decode(&original).expect("decodes");
        repeat.mti = "0201".parse().expect("an MTI");
        let repeat = spec.encode(&repeat).expect("encodes");
        let mut s = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        let mut exchange = async |payload: &[u8]| -> (String, String) {
            let mut framed = u16::try_from(payload.len())
                .expect("short")
                .to_be_bytes()
                .to_vec();
            framed.extend_from_slice(payload);
            s.write_all(&framed).await.expect("write");
            let mut len = [0u8; 2];
            s.read_exact(&mut len).await.expect("an answer");
            let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
            s.read_exact(&mut answer).await.expect("an answer");
            owed::mti_f39(&spec, answer)
        };
        assert_eq!(exchange(&original).await, ("0210".into(), "68".into()));
        assert_eq!(exchange(&repeat).await, ("0210".into(), "68".into()));
        let rows = store_settles(&data, Duration::from_millis(1500), |rows| {
            count(rows, "reversal", "delivered") == 1
        })
        .await;
        assert_eq!(rows.len(), 1, "one chain: {rows:?}");
        let r = books(host).await;
        eprintln!("node: {r}");
        assert_eq!(
            n(&r, "repeat_requests"),
            0,
            "the repeat never reached the host: {r}"
        );
        assert_eq!(sub(&r, "reversals", "late_approvals"), 1, "{r}");
        assert_eq!(sub(&r, "reversals", "chains"), 1, "{r}");
        assert_eq!(
            sub(&r, "reversals", "chains_late"),
            1,
            "the late approval attached: {r}"
        );
    })
    .await;
}

/// A terminal's reversal request (0400) that its host never answers gets
/// no switch-made 0410: the terminal would take it as done and stop
/// repeating. A purchase in the same state is declined 68, as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_reversal_is_never_answered_by_the_switch() {
    within(Duration::from_secs(60), async {
        let addr = free_addr();
        let _host = node("cup-pos", "01", addr, "0ms", &["--fail-rate", "1"]).await;
        let listen = free_addr();
        let data = data_dir("terminal-reversal-switch");
        let toml = pos_toml(listen, &[addr], "300ms", "");
        let _switch = switch("terminal-reversal-switch", &toml, &data, listen).await;
        let mut s = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        let wait = Duration::from_millis(2500);
        let purchase = ask(&mut s, &pos_request("0200", "000301", "000000"), wait).await;
        assert_eq!(purchase, Some(("0210".into(), "68".into())));
        let reversal = ask(&mut s, &pos_request("0400", "000302", "000000"), wait).await;
        assert_eq!(
            reversal, None,
            "the switch answered a terminal's 0400 itself"
        );
    })
    .await;
}

/// A balance inquiry the host approves late moves no money: the switch
/// declines it at its timeout and reverses nothing; a purchase beside it,
/// approved late as well, is reversed once. The host's books (which book
/// no inquiry as owed) agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_balance_inquiry_is_not_reversed() {
    within(Duration::from_secs(60), async {
        let addr = free_addr();
        let host = node(
            "cup-pos",
            "01",
            addr,
            "0ms",
            &["--late-share", "1", "--late-by", "1s"],
        )
        .await;
        let listen = free_addr();
        let data = data_dir("inquiry-switch");
        let (admin, admin_toml) = admin_toml("inquiry-switch");
        let toml = PosToml::new(listen, &[addr]).admin(&admin_toml).build();
        let _switch = switch("inquiry-switch", &toml, &data, listen).await;
        let mut s = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        let wait = Duration::from_millis(2500);
        let inquiry = ask(&mut s, &pos_request("0200", "000401", "310000"), wait).await;
        assert_eq!(inquiry, Some(("0210".into(), "68".into())));
        let purchase = ask(&mut s, &pos_request("0200", "000402", "000000"), wait).await;
        assert_eq!(purchase, Some(("0210".into(), "68".into())));
        // Once both late approvals are in, the store holds the purchase's
        // reversal only.
        late_answers_in(admin).await;
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            count(rows, "reversal", "delivered") >= 1
        })
        .await;
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].f11.as_deref(), Some("000402"), "{rows:?}");
        let r = books(host).await;
        eprintln!("node: {r}");
        assert_eq!(sub(&r, "reversals", "late_approvals"), 1, "{r}");
        assert_eq!(sub(&r, "reversals", "chains"), 1, "{r}");
        assert_eq!(sub(&r, "reversals", "chains_not_late"), 0, "{r}");
    })
    .await;
}

/// F5's meaning of "disable": the node's in-flight requests finish. Ten
/// purchases in flight at node 01 when it is disabled: ten approvals reach
/// the terminal and nothing is reversed. Ten more in flight when it is
/// forced offline: ten declines at once, and ten timeout reversals, each
/// delivered to node 01 once it is back, one chain each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_lets_in_flight_finish_and_force_offline_reverses_them() {
    use isoswitch::cli::ctl::{CtlArgs, CtlCommand, execute};
    use tokio::io::AsyncWriteExt;
    within(Duration::from_secs(90), async {
        let addr = free_addr();
        let host = node("cup-pos", "01", addr, "1s", &[]).await;
        let listen = free_addr();
        let data = data_dir("disable-switch");
        let (admin, admin_extra) = admin_toml("disable-switch");
        // Answers in 1 s, well inside the request timeout: only the admin
        // action decides what happens to them.
        let toml = PosToml::new(listen, &[addr])
            .admin(&admin_extra)
            .purchase_timeout("10s")
            .request_timeout("10s")
            .build();
        let _switch = switch("disable-switch", &toml, &data, listen).await;
        let ctl = |command| CtlArgs {
            admin: format!("http://{admin}"),
            json: false,
            token: Some("process-test-token".into()),
            command,
            tls: Default::default(),
        };
        let action = |force: bool| {
            let (service, node) = ("pos".to_string(), "01".to_string());
            if force {
                CtlCommand::ForceOffline { service, node }
            } else {
                CtlCommand::Disable { service, node }
            }
        };
        let enable = || CtlCommand::Enable {
            service: "pos".into(),
            node: "01".into(),
        };
        wait_metric_sum(admin, "isoswitch_server_current_connections", &[], 2.0).await;
        let mut s = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        let wait = Duration::from_secs(15);
        for (round, force) in [(0, false), (1, true)] {
            for i in 0..10 {
                let stan = format!("0006{round}{i}");
                let framed = framed(&pos_request("0200", &stan, "000000"));
                s.write_all(&framed).await.expect("write");
            }
            wait_metric_sum(admin, "isoswitch_service_in_flight", &[], 10.0).await;
            execute(&ctl(action(force))).await.expect("admin action");
            let mut codes = Vec::new();
            for _ in 0..10 {
                let (mti, code) = read_answer(&mut s, wait).await.expect("an answer");
                assert_eq!(mti, "0210");
                codes.push(code);
            }
            if force {
                assert!(codes.iter().all(|c| c != "00"), "declined: {codes:?}");
            } else {
                assert!(codes.iter().all(|c| c == "00"), "approved: {codes:?}");
                assert!(saf_rows(&data).is_empty(), "disable reversed nothing");
            }
            execute(&ctl(enable())).await.expect("enable");
        }
        let rows = store_settles(&data, Duration::from_millis(1500), |rows| {
            count(rows, "reversal", "delivered") == 10
        })
        .await;
        assert_eq!(rows.len(), 10, "{rows:?}");
        assert!(
            rows.iter()
                .all(|r| r.f11.as_deref().is_some_and(|f| f.starts_with("00061"))),
            "only the forced-offline round: {rows:?}"
        );
        let r = books(host).await;
        eprintln!("node: {r}");
        assert_eq!(sub(&r, "reversals", "chains"), 10, "{r}");
        assert_eq!(sub(&r, "reversals", "duplicate_chains"), 0, "{r}");
    })
    .await;
}

/// The same purchase sent again (same F7, F11, F41: a retransmission not
/// marked as a repeat) never reaches the host a second time: sent while
/// the first is in flight it waits for the host's answer; sent after it,
/// it gets that answer again from the switch. A repeat (0201) still goes
/// to the host, which answers repeats itself. The host's own count is
/// the judge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_purchase_twice_reaches_the_host_once() {
    use tokio::io::AsyncWriteExt;
    within(Duration::from_secs(60), async {
        let addr = free_addr();
        let host = node("cup-pos", "01", addr, "300ms", &[]).await;
        let listen = free_addr();
        let data = data_dir("duplicate-switch");
        // No echo checks: the host counts the purchases alone.
        let toml = PosToml::new(listen, &[addr])
            .purchase_timeout("10s")
            .back("[service.back.health]\ncheck = \"none\"")
            .build();
        let _switch = switch("duplicate-switch", &toml, &data, listen).await;
        let mut s = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        let wait = Duration::from_secs(5);
        let purchase = pos_request("0200", "000701", "000000");
        // Twice back to back: the second arrives while the first is in
        // flight at the host.
        s.write_all(&framed(&purchase)).await.expect("write");
        s.write_all(&framed(&purchase)).await.expect("write");
        let approved = Some(("0210".to_string(), "00".to_string()));
        assert_eq!(read_answer(&mut s, wait).await, approved);
        assert_eq!(read_answer(&mut s, wait).await, approved);
        // Again once answered: the switch's book answers it.
        assert_eq!(ask(&mut s, &purchase, wait).await, approved);
        // A repeat is the terminal saying "I never got it": the host's.
        let repeat = pos_request("0201", "000701", "000000");
        assert_eq!(ask(&mut s, &repeat, wait).await, approved);
        let r = books(host).await;
        eprintln!("node: {r}");
        assert_eq!(n(&r, "requests"), 2, "one purchase and its repeat: {r}");
        assert_eq!(n(&r, "repeat_requests"), 1, "{r}");
    })
    .await;
}

/// A terminal's reversal (0400) goes to the node that answered the
/// purchase it reverses (the host that holds the money), not to whichever
/// node the balancer would pick: six purchases over two nodes, each
/// reversed, and each node's own books say every 0400 it got names a
/// purchase it answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_reversal_goes_to_the_node_of_its_purchase() {
    within(Duration::from_secs(60), async {
        let addrs = [free_addr(), free_addr()];
        let mut hosts = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            hosts.push(node("cup-pos", &format!("0{}", i + 1), *a, "0ms", &[]).await);
        }
        let listen = free_addr();
        let data = data_dir("terminal-reversal-node-switch");
        let toml = pos_toml(listen, &addrs, "300ms", "");
        let _switch = switch("terminal-reversal-node-switch", &toml, &data, listen).await;
        let mut s = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        let wait = Duration::from_secs(5);
        let approved = Some(("0210".to_string(), "00".to_string()));
        for i in 0..6 {
            let stan = format!("00081{i}");
            let purchase = pos_request("0200", &stan, "000000");
            assert_eq!(ask(&mut s, &purchase, wait).await, approved);
            let reversal = pos_request("0400", &stan, "000000");
            let answer = ask(&mut s, &reversal, wait).await;
            assert_eq!(answer.map(|a| a.0).as_deref(), Some("0410"));
        }
        let (mut reversals, mut of_answered) = (0, 0);
        for host in hosts {
            let r = books(host).await;
            eprintln!("node: {r}");
            reversals += n(&r, "terminal_reversals");
            of_answered += n(&r, "terminal_reversals_of_answered");
        }
        assert_eq!(reversals, 6);
        assert_eq!(of_answered, 6, "each 0400 at the node of its purchase");
    })
    .await;
}

/// A terminal gone before its approval: the client sends a purchase and
/// closes at once; the host approves it in time, and the switch has no one
/// to give it to. The approval is reversed at that host, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_whose_terminal_is_gone_is_reversed_once() {
    use tokio::io::AsyncWriteExt;
    within(Duration::from_secs(60), async {
        let addr = free_addr();
        let host = node("cup-pos", "01", addr, "600ms", &[]).await;
        let listen = free_addr();
        let data = data_dir("gone-switch");
        let (admin, admin_toml) = admin_toml("gone-switch");
        let toml = PosToml::new(listen, &[addr])
            .admin(&admin_toml)
            .purchase_timeout("10s")
            .build();
        let _switch = switch("gone-switch", &toml, &data, listen).await;
        let mut s = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        let purchase = pos_request("0200", "000901", "000000");
        s.write_all(&framed(&purchase)).await.expect("write");
        // Gone once its purchase is at the host (which answers 600 ms on).
        wait_metric_sum(admin, "isoswitch_server_requests", &[], 1.0).await;
        drop(s);
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            count(rows, "reversal", "delivered") == 1
        })
        .await;
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].f11.as_deref(), Some("000901"), "{rows:?}");
        let r = books(host).await;
        eprintln!("node: {r}");
        assert_eq!(sub(&r, "reversals", "chains"), 1, "{r}");
        assert_eq!(sub(&r, "reversals", "duplicate_chains"), 0, "{r}");
    })
    .await;
}

/// A terminal that resends its purchase on a new connection while the first
/// is in flight, then loses the first: the host approves in time, the first
/// connection cannot take it, and the approval is reversed. The duplicate
/// that waited for that answer must not get it (its terminal would show a
/// sale whose money goes back): it gets a decline, and the host sees one
/// purchase and one reversal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_never_gets_an_approval_its_original_could_not_take() {
    use tokio::io::AsyncWriteExt;
    within(Duration::from_secs(60), async {
        let addr = free_addr();
        let host = node("cup-pos", "01", addr, "800ms", &[]).await;
        let listen = free_addr();
        let data = data_dir("gone-duplicate-switch");
        let (admin, admin_toml) = admin_toml("gone-duplicate-switch");
        let toml = PosToml::new(listen, &[addr])
            .admin(&admin_toml)
            .purchase_timeout("10s")
            .back("[service.back.health]\ncheck = \"none\"")
            .build();
        let _switch = switch("gone-duplicate-switch", &toml, &data, listen).await;
        let connect = || tokio::net::TcpStream::connect(listen);
        let (mut first, mut second) = (
            connect().await.expect("connect"),
            connect().await.expect("connect"),
        );
        let purchase = pos_request("0200", "000951", "000000");
        first.write_all(&framed(&purchase)).await.expect("write");
        // The first at the host (which answers 800 ms on), then the second
        // taken by the switch (counted as it is checked for a duplicate, in
        // the same step that makes it wait for the first): both in flight.
        wait_metric_sum(admin, "isoswitch_server_requests", &[], 1.0).await;
        second.write_all(&framed(&purchase)).await.expect("write");
        wait_metric_sum(admin, "isoswitch_service_requests", &[], 2.0).await;
        drop(first);
        let answer = read_answer(&mut second, Duration::from_secs(5)).await;
        let code = answer.as_ref().map(|(_, code)| code.as_str());
        assert!(answer.is_some(), "the duplicate gets an answer");
        assert_ne!(code, Some("00"), "an approval being reversed: {answer:?}");
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            count(rows, "reversal", "delivered") == 1
        })
        .await;
        assert_eq!(rows.len(), 1, "{rows:?}");
        let r = books(host).await;
        eprintln!("node: {r}");
        assert_eq!(n(&r, "requests"), 1, "one purchase reached the host: {r}");
        assert_eq!(sub(&r, "reversals", "chains"), 1, "{r}");
    })
    .await;
}

/// A partial approval (F39 10, half the amount, the host's own F38) that
/// comes late is reversed by what it approved: the timeout reversal, stored
/// when the switch declined and not yet taken by the host (its first 0420
/// left unanswered), is completed with the approval's F38 and amount, and
/// its 0421 names them. The host's books judge by their own reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_partial_approval_is_reversed_by_its_f38_and_amount() {
    within(Duration::from_secs(60), async {
        let addr = free_addr();
        let extra = [
            "--late-share",
            "1",
            "--late-by",
            "1s",
            "--partial",
            "--ignore-reversals",
            "1",
        ];
        let host = node("cup-pos", "01", addr, "0ms", &extra).await;
        let listen = free_addr();
        let data = data_dir("partial-switch");
        let toml = pos_toml(listen, &[addr], "2s", "");
        let _switch = switch("partial-switch", &toml, &data, listen).await;
        let mut s = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        let purchase = pos_request("0200", "000921", "000000");
        let answer = ask(&mut s, &purchase, Duration::from_secs(5)).await;
        assert_eq!(answer, Some(("0210".into(), "68".into())));
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            count(rows, "reversal", "delivered") == 1
        })
        .await;
        assert_eq!(rows.len(), 1, "{rows:?}");
        let r = books(host).await;
        eprintln!("node: {r}");
        assert_eq!(sub(&r, "reversals", "chains"), 1, "{r}");
        assert_eq!(sub(&r, "reversals", "named_approval"), 1, "{r}");
        assert_eq!(sub(&r, "reversals", "misnamed_approval"), 0, "{r}");
    })
    .await;
}

/// A host whose connection drops with a purchase in flight (killed -9): the
/// terminal gets a decline (91) with the host's outcome unknown, so the
/// switch owes a timeout reversal; it waits for the host and reaches it,
/// once, when the host is back on its address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_lost_with_a_purchase_in_flight_gets_its_reversal_when_back() {
    use tokio::io::AsyncWriteExt;
    within(Duration::from_secs(60), async {
        let addr = free_addr();
        let mut host = node("cup-pos", "01", addr, "5s", &[]).await;
        let listen = free_addr();
        let data = data_dir("host-lost-switch");
        let (admin, admin_extra) = admin_toml("host-lost-switch");
        let toml = PosToml::new(listen, &[addr])
            .admin(&admin_extra)
            .purchase_timeout("10s")
            .build();
        let _switch = switch("host-lost-switch", &toml, &data, listen).await;
        let mut s = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        let purchase = pos_request("0200", "000931", "000000");
        s.write_all(&framed(&purchase)).await.expect("write");
        wait_metric_sum(admin, "isoswitch_server_in_flight", &[], 1.0).await;
        host.kill9().await;
        let answer = read_answer(&mut s, Duration::from_secs(5)).await;
        assert_eq!(answer, Some(("0210".into(), "91".into())));
        let owed = store_settles(&data, Duration::from_millis(500), |rows| {
            count(rows, "reversal", "pending") == 1
        })
        .await;
        assert_eq!(owed.len(), 1, "{owed:?}");
        let back = node("cup-pos", "01", addr, "0ms", &[]).await;
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            count(rows, "reversal", "delivered") == 1
        })
        .await;
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].f11.as_deref(), Some("000931"), "{rows:?}");
        let r = books(back).await;
        eprintln!("node back: {r}");
        assert_eq!(sub(&r, "reversals", "chains"), 1, "{r}");
        assert_eq!(sub(&r, "reversals", "duplicate_chains"), 0, "{r}");
    })
    .await;
}

/// The switch killed -9 right after a timeout decline, its timeout
/// reversal stored but not yet taken by the host (which leaves the first
/// messages of each chain unanswered): the switch started again on the same
/// data directory delivers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_reversal_survives_kill_9_of_the_switch() {
    within(Duration::from_secs(60), async {
        let addr = free_addr();
        let extra = ["--fail-rate", "1", "--ignore-reversals", "1"];
        let host = node("cup-pos", "01", addr, "0ms", &extra).await;
        let listen = free_addr();
        let data = data_dir("timeout-kill9-switch");
        let toml = pos_toml(listen, &[addr], "5s", "");
        let mut first = switch("timeout-kill9-switch", &toml, &data, listen).await;
        let mut s = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        let purchase = pos_request("0200", "000941", "000000");
        let answer = ask(&mut s, &purchase, Duration::from_secs(5)).await;
        assert_eq!(answer, Some(("0210".into(), "68".into())));
        let owed = store_settles(&data, Duration::from_millis(500), |rows| {
            rows.iter().any(|r| r.kind == "reversal" && r.attempts >= 1)
        })
        .await;
        assert_eq!(count(&owed, "reversal", "pending"), 1, "{owed:?}");
        first.kill9().await;
        drop(first);
        let _second = switch("timeout-kill9-switch-2", &toml, &data, listen).await;
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            count(rows, "reversal", "delivered") == 1
        })
        .await;
        assert_eq!(rows.len(), 1, "{rows:?}");
        let r = books(host).await;
        eprintln!("node: {r}");
        assert_eq!(sub(&r, "reversals", "chains"), 1, "{r}");
        assert_eq!(sub(&r, "reversals", "chains_unanswered"), 1, "{r}");
        assert_eq!(sub(&r, "reversals", "duplicate_chains"), 0, "{r}");
    })
    .await;
}

/// A OneConnect front (nodes that echo no usable key, one request per
/// connection): a purchase the host never answers is declined at its
/// deadline and its connection closed, so no late answer is ever read. The
/// switch's timeout reversal is the only way the money comes back: stored
/// at once and carried to that host on a pool connection like a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_oneconnect_purchase_the_host_never_answers_is_reversed() {
    within(Duration::from_secs(60), async {
        let addr = free_addr();
        let extra = ["--fail-rate", "1", "--no-key"];
        let host = node("cup-pos", "01", addr, "0ms", &extra).await;
        let listen = free_addr();
        let data = data_dir("oneconnect-switch");
        let toml = pos_toml(listen, &[addr], "300ms", "").replace(
            &format!("listen = \"{listen}\"\n"),
            &format!("listen = \"{listen}\"\nmode = \"oneconnect\"\n"),
        ) + "[service.back.health]\ncheck = \"tcp\"\n";
        let _switch = switch("oneconnect-switch", &toml, &data, listen).await;
        let mut s = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        let purchase = pos_request("0200", "000951", "000000");
        let answer = ask(&mut s, &purchase, Duration::from_secs(5)).await;
        assert_eq!(answer, Some(("0210".into(), "68".into())));
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            count(rows, "reversal", "delivered") == 1
        })
        .await;
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].f11.as_deref(), Some("000951"), "{rows:?}");
        let r = books(host).await;
        eprintln!("node: {r}");
        assert_eq!(sub(&r, "reversals", "chains"), 1, "{r}");
        assert_eq!(sub(&r, "reversals", "chains_unanswered"), 1, "{r}");
    })
    .await;
}
