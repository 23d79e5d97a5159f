//! Integrity on VISA BASE I duplex links, with real processes: the
//! `isoswitch` binary as the switch with its SQLite store, dialling `sim
//! visa`'s links, in front of `sim node` hosts. VISA's F39 is EBCDIC and its
//! F70 and F90 BCD: a late approval must be read as the text "00", and the
//! reversal written as the spec encodes it. Both directions:
//!
//! - VISA's issuer requests reach the nodes; a share of their approvals
//!   come past the switch's timeout (VISA got a decline) and each is
//!   reversed at the node that approved it;
//! - the nodes' own requests reach VISA; VISA approves a share of them past
//!   the switch's timeout (the node got a decline) and each is reversed
//!   toward VISA.
//!
//! The simulators keep their own books and read F90 with their own code
//! (src/sim/ledger.rs, src/sim/original.rs); the stored reversal is read
//! back with `isoswitch decode --spec visa-base1`. No assertion is on
//! timing: each case polls the store until its state holds, within the
//! case's own timeout.

use std::net::SocketAddr;
use std::time::Duration;

#[path = "common/owed.rs"]
mod owed;
#[path = "common/procs.rs"]
mod procs;
use owed::*;
use procs::*;

/// A `connect` service dialling VISA at `visa` over 2 links before `nodes`,
/// stamping F37; requests time out after 500 ms both ways (declined), a
/// reversal gets 2 s and a failed attempt is retried after 300 ms.
fn visa_toml(admin_toml: &str, visa: SocketAddr, nodes: &[SocketAddr]) -> String {
    format!(
        "{admin_toml}[store.saf]\nretry = \"300ms\"\nretry_max = \"300ms\"\n\
         [[service]]\nname = \"visa\"\nspec = \"visa-base1\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
         [service.front]\nkind = \"connect\"\nconnect = \"{visa}\"\nlinks = 2\n\
         sign_on = \"per-link\"\nsign_on_retry = \"300ms\"\nreconnect_min = \"20ms\"\nreconnect_max = \"200ms\"\n\
         [service.back]\nconnections_per_node = 2\nreconnect_min = \"50ms\"\nreconnect_max = \"200ms\"\n\
         [service.timeouts]\nrequest = \"500ms\"\non_timeout = \"decline\"\nnode_on_timeout = \"decline\"\n\
         by_mti = {{ \"04x0\" = \"2s\" }}\n\
         [service.integrity]\nlate_approval = \"reverse\"\n{}",
        nodes_toml(nodes)
    )
}

/// A stored reversal reads back, by the spec, as an 0420 with F39 68 and
/// an F90 naming a VISA original.
async fn assert_reads_back(payload: &[u8]) {
    let msg = decode_stored("visa-base1", &[0, 0], payload).await;
    eprintln!("an owed reversal: {msg}");
    assert_eq!(msg["mti"], "0420", "{msg}");
    assert_eq!(decoded_field(&msg, 39), "68", "{msg}");
    let f90 = decoded_field(&msg, 90);
    assert_eq!(f90.len(), 42, "F90 n42: {f90}");
    assert!(f90.starts_with("0100") || f90.starts_with("0200"), "{f90}");
}

/// Every delivered reversal has the host's answer recorded as its text
/// (an EBCDIC F39 is "00", not its bytes).
fn assert_answers_recorded_as_text(data: &str) {
    let answers: Vec<Option<String>> = store_column(
        data,
        "SELECT answer FROM saf WHERE kind = 'reversal' ORDER BY id",
    );
    assert!(!answers.is_empty());
    for a in answers {
        assert_eq!(a.as_deref(), Some("0430 F39 00"));
    }
}

/// VISA sends issuer requests at 50/s; 10% of the nodes' approvals come
/// 1.5 s past the switch's 500 ms timeout (VISA got 68). Each is reversed
/// at the node that approved it, one chain each (node 01 ignores each
/// chain's first message, so its chains go on as one 0421).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_visa_node_late_approval_is_reversed_at_that_node() {
    within(Duration::from_secs(150), async {
        let late = ["--late-share", "0.1", "--late-by", "1500ms"];
        let addrs = [free_addr(), free_addr()];
        let mut nodes = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            let mut extra = late.to_vec();
            if i == 0 {
                extra.extend(["--ignore-reversals", "1"]);
            }
            let id = format!("0{}", i + 1);
            nodes.push(node("visa-base1", &id, *a, "2..20ms", &extra).await);
        }
        let visa_addr = free_addr();
        let v = visa_addr.to_string();
        let visa = Proc::spawn(
            "late-visa-issuer",
            &[
                "sim",
                "visa",
                "--accept",
                &v,
                "--links",
                "2",
                "--rate",
                "50",
                "--count",
                "300",
                "--duration",
                "60s",
                "--timeout",
                "3s",
                "--json",
            ],
        );
        wait_listening(visa_addr).await;
        let data = data_dir("visa-late-switch");
        let (admin, admin_toml) = admin_toml("visa-late-switch");
        let path = write_config(
            "visa-late-switch",
            &visa_toml(&admin_toml, visa_addr, &addrs),
        );
        let p = path.to_string_lossy().into_owned();
        let _switch = Proc::spawn(
            "visa-late-switch",
            &["run", "--config", &p, "--data-dir", &data],
        );
        // Node 01 ignores each chain's first message: its reversals stay
        // owed (with their payload) for a while.
        assert_reads_back(&an_owed_reversal(&data).await).await;
        let report = visa.report().await;
        eprintln!("VISA: {report}");
        assert_eq!(n(&report, "issuer_sent"), 300, "{report}");
        assert_eq!(
            n(&report, "issuer_unanswered"),
            0,
            "every one answered: {report}"
        );
        assert!(
            n(&report, "issuer_declined") > 0,
            "late ones declined: {report}"
        );
        // Every late approval has landed (one for each timeout).
        late_answers_in(admin).await;
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            !rows.is_empty() && count(rows, "reversal", "pending") == 0
        })
        .await;
        let mut late_total = 0;
        for (i, host) in nodes.into_iter().enumerate() {
            let id = format!("0{}", i + 1);
            let r = books(host).await;
            eprintln!("node {id}: {r}");
            let late = assert_reversed_exactly(&id, &r);
            let stored = rows
                .iter()
                .filter(|row| row.node_id.as_deref() == Some(id.as_str()))
                .count() as u64;
            assert_eq!(
                stored, late,
                "node {id}: one stored reversal per late approval"
            );
            let chains = sub(&r, "reversals", "chains");
            let repeats = if i == 0 { chains } else { 0 };
            assert_eq!(sub(&r, "reversals", "repeats"), repeats, "node {id}: {r}");
            late_total += late;
        }
        assert!(late_total > 0, "some approvals came late");
        assert_eq!(rows.len() as u64, late_total, "{rows:#?}");
        for row in &rows {
            assert_eq!(
                (row.kind.as_str(), row.state.as_str()),
                ("reversal", "delivered")
            );
            assert_eq!(row.direction, "to_node", "{row:?}");
        }
        assert_answers_recorded_as_text(&data);
    })
    .await;
}

/// The nodes send their own 0200s to VISA (40/s each); VISA approves 10%
/// of them 1.5 s past the switch's 500 ms timeout (the node got 68). Each
/// is reversed toward VISA, one chain each; VISA ignores each chain's
/// first message, so each goes on as one 0421.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visa_late_approvals_of_node_requests_are_reversed_toward_visa() {
    within(Duration::from_secs(150), async {
        let addrs = [free_addr(), free_addr()];
        let mut nodes = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            // Originating once every link is up and signed on.
            let extra = ["--originate", "40", "--originate-after", "2s"];
            nodes.push(node("visa-base1", &format!("0{}", i + 1), *a, "0..10ms", &extra).await);
        }
        let visa_addr = free_addr();
        let v = visa_addr.to_string();
        let visa = Proc::spawn(
            "late-visa-acquirer",
            &[
                "sim",
                "visa",
                "--accept",
                &v,
                "--links",
                "2",
                "--duration",
                "90s",
                "--timeout",
                "3s",
                "--late-share",
                "0.1",
                "--late-by",
                "1500ms",
                "--ignore-reversals",
                "1",
                "--json",
            ],
        );
        wait_listening(visa_addr).await;
        let data = data_dir("visa-acq-late-switch");
        let (admin, admin_toml) = admin_toml("visa-acq-late-switch");
        let path = write_config(
            "visa-acq-late-switch",
            &visa_toml(&admin_toml, visa_addr, &addrs),
        );
        let p = path.to_string_lossy().into_owned();
        let _switch = Proc::spawn(
            "visa-acq-late-switch",
            &["run", "--config", &p, "--data-dir", &data],
        );
        // Three seconds' worth of the nodes' requests, some approved late;
        // then they stop originating and settle.
        wait_metric_sum(admin, "isoswitch_service_node_requests", &[], 240.0).await;
        wait_metric_sum(admin, "isoswitch_late_approvals", &[], 3.0).await;
        // VISA ignores each chain's first message: reversals stay owed.
        assert_reads_back(&an_owed_reversal(&data).await).await;
        for host in &nodes {
            host.signal("INT");
        }
        let mut node_reports = Vec::new();
        for host in nodes {
            node_reports.push(host.report().await);
        }
        // Every late approval toward the network has landed: the nodes
        // stopped only once each of their requests was answered or
        // declined, so each timeout is a late answer on its way.
        late_answers_in(admin).await;
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            !rows.is_empty() && count(rows, "reversal", "pending") == 0
        })
        .await;
        visa.signal("INT");
        let report = visa.report().await;
        for (i, r) in node_reports.iter().enumerate() {
            eprintln!("node 0{}: {r}", i + 1);
            assert!(n(r, "originated") > 0, "{r}");
            assert_eq!(n(r, "originated_unanswered"), 0, "{r}");
        }
        eprintln!("VISA: {report}");
        let late = assert_reversed_exactly("VISA", &report);
        assert!(late > 0, "VISA approved some late: {report}");
        let chains = sub(&report, "reversals", "chains");
        assert_eq!(sub(&report, "reversals", "repeats"), chains, "{report}");
        assert_eq!(rows.len() as u64, late, "{rows:#?}");
        for row in &rows {
            assert_eq!(
                (row.kind.as_str(), row.state.as_str()),
                ("reversal", "delivered")
            );
            assert_eq!(row.direction, "to_peer", "{row:?}");
            assert_eq!(
                row.attempts, 2,
                "the 0420 ignored, its 0421 answered: {row:?}"
            );
        }
        let declined: u64 = node_reports
            .iter()
            .map(|r| n(r, "originated_declined"))
            .sum();
        assert!(
            declined >= late,
            "the switch declined each late one to its node first"
        );
        assert_answers_recorded_as_text(&data);
    })
    .await;
}
