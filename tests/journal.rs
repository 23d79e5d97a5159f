//! The journal with real processes: the `isoswitch` binary as the switch
//! with its SQLite store, `sim node` processes as hosts (one leaves a share
//! of requests unanswered, so the switch declines them at its deadline; or
//! approves a share late, so the switch reverses them), `sim nac` as the
//! sender, and `isoswitch journal` / `ctl` as the operator's tools.
//!
//! The journal is read with the `journal` command, never with the switch's
//! code; counts are checked against the NAC's and the nodes' own reports.
//! Where a case must wait for the journal writer (a batch every few ms),
//! it polls the journal until the rows are there, within its own timeout.

use std::process::Command;
use std::time::Duration;

#[path = "common/owed.rs"]
mod owed;
#[path = "common/procs.rs"]
mod procs;
use owed::*;
use procs::*;

/// The journal is off by default (its cost): every case turns it on.
const JOURNAL_ON: &str = "[journal]\nenabled = true\n";

/// The sample card every simulator sends (iso8583::samples): it must never
/// reach the journal in clear, as text or as packed BCD.
const PAN: &str = "6222021234567890123";
const PAN_MASKED: &str = "622202*********0123";

/// `isoswitch journal ARGS --data-dir DATA --json`, parsed.
fn journal(data: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(BIN)
        .arg("journal")
        .args(args)
        .args(["--data-dir", data, "--json", "--limit", "100000"])
        .output()
        .expect("isoswitch journal runs");
    assert!(
        out.status.success(),
        "journal {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .expect("journal JSON")
        .as_array()
        .cloned()
        .expect("an array")
}

/// Polls the journal until `done` holds on every row (the writer commits a
/// batch every few ms); the case's timeout bounds it.
async fn journal_settles(
    data: &str,
    args: &[&str],
    done: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    loop {
        let rows = journal(data, args);
        if done(&rows) {
            return rows;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn text<'a>(row: &'a serde_json::Value, key: &str) -> &'a str {
    row[key].as_str().unwrap_or("")
}

fn where_<'a>(rows: &'a [serde_json::Value], key: &str, value: &str) -> Vec<&'a serde_json::Value> {
    rows.iter().filter(|r| text(r, key) == value).collect()
}

/// The bytes of the store (database and WAL) do not hold `digits`, neither
/// as text nor packed two digits a byte.
fn assert_not_in_store(data: &str, digits: &str) {
    let packed: Vec<u8> = digits
        .as_bytes()
        .chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| ((c[0] - b'0') << 4) | (c[1] - b'0'))
        .collect();
    for suffix in ["", "-wal"] {
        let path = format!("{}{suffix}", db_path(data).display());
        let Ok(bytes) = std::fs::read(&path) else {
            assert!(!suffix.is_empty(), "no store at {path}");
            continue;
        };
        for needle in [digits.as_bytes(), packed.as_slice()] {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle),
                "{path} holds the PAN ({needle:02X?})"
            );
        }
    }
}

/// A NAC through the switch to two nodes, node 02 leaving a third of its
/// requests unanswered: every exchange is journaled once, with who answered
/// (the node, or the switch with `timeout`), counts equal to the NAC's and
/// the nodes' own; the PAN is masked in every row and nowhere in clear in
/// the file; the queries by STAN, terminal, node and outcome select the right
/// rows; an operator's drain and a refused token are admin rows; the report
/// adds up.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exchange_is_journaled_masked_and_found_again() {
    within(Duration::from_secs(120), async {
        let addrs = [free_addr(), free_addr()];
        let node1 = node("cup-pos", "01", addrs[0], "2..10ms", &[]).await;
        let node2 = node(
            "cup-pos",
            "02",
            addrs[1],
            "2..10ms",
            &["--fail-rate", "0.3"],
        )
        .await;
        let listen = free_addr();
        let (admin, admin_toml) = admin_toml("journal-switch");
        let data = data_dir("journal-switch");
        let toml = format!(
            "{JOURNAL_ON}{admin_toml}{}",
            pos_toml(listen, &addrs, "1s", "")
        );
        let _switch = switch("journal-switch", &toml, &data, listen).await;
        let report = nac("journal-nac", listen, 100, ("2s", "5s"), &[])
            .report()
            .await;
        eprintln!("NAC: {report}");
        assert_exactly_once(&report);
        let sent = n(&report, "sent") as usize;
        let rows = journal_settles(&data, &[], |rows| rows.len() >= sent).await;
        assert_eq!(rows.len(), sent, "one row per exchange");

        // Who answered, against the nodes' own books: a node also counts
        // the switch's echo tests (health checks, one or two a connection
        // in this run), which are not exchanges and not journaled.
        let (r1, r2) = (books(node1).await, books(node2).await);
        for (id, r) in [("01", &r1), ("02", &r2)] {
            let mine = where_(&rows, "node", id).len() as u64;
            let got = n(r, "requests");
            assert!(
                mine <= got && got - mine <= 2 * n(r, "connections"),
                "node {id}: {mine} rows, {r}"
            );
        }
        let made = where_(&rows, "answered_by", "switch");
        assert!(!made.is_empty(), "node 02 left some unanswered");
        for row in &made {
            assert_eq!(text(row, "reason"), "timeout", "{row}");
            assert_eq!(text(row, "node"), "02", "{row}");
            assert_eq!(text(row, "outcome"), "switch-made", "{row}");
            assert_eq!(
                text(row, "f39"),
                "68",
                "the decline the terminal got: {row}"
            );
        }
        assert_eq!(
            made.len() + where_(&rows, "answered_by", "node").len(),
            sent,
            "every other one answered by its node"
        );
        assert_eq!(
            n(&report, "declined") as usize,
            made.len()
                + rows
                    .iter()
                    .filter(|r| text(r, "answered_by") == "node" && text(r, "f39") != "00")
                    .count(),
            "the NAC's declines are the switch's and the nodes'"
        );

        // Masked everywhere.
        for row in &rows {
            assert_eq!(text(row, "pan"), PAN_MASKED, "{row}");
            assert!(row["f35"].is_null() && row["f52"].is_null(), "{row}");
        }
        assert_not_in_store(&data, PAN);

        // The queries.
        // The NAC sends no F37 (a POS purchase has none), so `--rrn` is
        // checked on stored rows by the store's own tests (src/store).
        let pick = &made[0];
        let (stan, term) = (text(pick, "f11"), text(pick, "f41"));
        let by_both = journal(&data, &["--stan", stan, "--terminal", term]);
        assert!(by_both.iter().any(|r| r["id"] == pick["id"]), "{by_both:?}");
        assert!(
            by_both
                .iter()
                .all(|r| text(r, "f11") == stan && text(r, "f41") == term)
        );
        let switch_made = journal(&data, &["--outcome", "switch-made"]);
        assert_eq!(switch_made.len(), made.len());
        assert!(journal(&data, &["--outcome", "late"]).is_empty());
        assert_eq!(
            journal(&data, &["--node", "02"]).len(),
            where_(&rows, "node", "02").len()
        );

        // Admin actions: a drain, and a refused token.
        let ctl = |token: &str, args: &[&str]| {
            Command::new(BIN)
                .args([
                    "ctl",
                    "--admin",
                    &format!("http://{admin}"),
                    "--token",
                    token,
                ])
                .args(args)
                .output()
                .expect("ctl runs")
        };
        assert!(
            ctl("process-test-token", &["drain", "pos", "01"])
                .status
                .success()
        );
        assert!(
            !ctl("wrong-token-wrong-token", &["drain", "pos", "02"])
                .status
                .success()
        );
        let admin_rows = journal_settles(&data, &["--admin"], |rows| rows.len() >= 2).await;
        eprintln!("admin: {admin_rows:?}");
        let drain = admin_rows
            .iter()
            .find(|r| text(r, "action") == "drain")
            .expect("the drain is recorded");
        assert_eq!(drain["status"], 200, "{drain}");
        assert!(text(drain, "peer").starts_with("127.0.0.1:"), "{drain}");
        let refused = admin_rows
            .iter()
            .find(|r| text(r, "action") == "token-refused")
            .expect("the refused token is recorded");
        assert_eq!(refused["status"], 401, "{refused}");

        // The day's report adds up.
        let out = Command::new(BIN)
            .args(["journal", "report", "--data-dir", &data, "--json"])
            .output()
            .expect("report runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let groups = report["groups"].as_array().expect("groups");
        let total: u64 = groups.iter().map(|g| n(g, "exchanges")).sum();
        assert_eq!(total as usize, sent, "{report}");
        let g2 = groups.iter().find(|g| g["node"] == "02").expect("node 02");
        assert_eq!(
            g2["by_reason"]["timeout"].as_u64(),
            Some(made.len() as u64),
            "{report}"
        );
        assert!(g2["p99_us"].as_u64().is_some(), "{report}");

        // The chart of the day: an SVG file with one series per outcome.
        let svg = std::path::PathBuf::from(&data).join("day.svg");
        let out = Command::new(BIN)
            .args(["journal", "report", "--data-dir", &data, "--svg"])
            .arg(&svg)
            .output()
            .expect("report runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let drawn = std::fs::read_to_string(&svg).expect("the SVG is written");
        assert!(
            drawn.starts_with("<svg") && drawn.trim_end().ends_with("</svg>"),
            "not an SVG document: {drawn:.200}"
        );
        assert_eq!(
            drawn.matches("<svg").count(),
            drawn.matches("</svg>").count(),
            "one document"
        );
        for series in ["answered", "switch-made"] {
            assert!(drawn.contains(series), "no {series} series in the chart");
        }
    })
    .await;
}

/// Nodes approve a share of requests 1.5 s past the switch's 500 ms
/// deadline: each late approval is a `late` row linked to its reversal's
/// store entry, and that reversal was acknowledged (`delivered`); the
/// switch-made decline the terminal got is a row of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_approval_is_journaled_with_its_reversal() {
    within(Duration::from_secs(120), async {
        let late = ["--late-share", "0.1", "--late-by", "1500ms"];
        let addrs = [free_addr(), free_addr()];
        let mut nodes = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            nodes.push(node("cup-pos", &format!("0{}", i + 1), *a, "2..10ms", &late).await);
        }
        let listen = free_addr();
        let data = data_dir("journal-late");
        let (admin, admin_toml) = admin_toml("journal-late");
        let _switch = switch(
            "journal-late",
            &format!(
                "{admin_toml}{JOURNAL_ON}{}",
                pos_toml(listen, &addrs, "300ms", "")
            ),
            &data,
            listen,
        )
        .await;
        let report = nac("journal-late-nac", listen, 100, ("2s", "5s"), &[])
            .report()
            .await;
        assert_exactly_once(&report);
        // Every late approval lands, and is journaled as it comes; its
        // reversal (a timeout reversal held `timeout_reversal_hold` in the
        // store) is delivered after that, so the hosts stay up until every
        // row's reversal is delivered.
        late_answers_in(admin).await;
        let name = "isoswitch_late_approvals";
        let late = metric_sum(&metrics(admin, &[name]).await, name, &[]) as usize;
        let rows = journal_settles(&data, &["--outcome", "late"], |rows| {
            rows.len() >= late.max(1) && rows.iter().all(|r| r["reversal_state"] == "delivered")
        })
        .await;
        let mut late_total = 0;
        for host in nodes {
            late_total += sub(&books(host).await, "reversals", "late_approvals");
        }
        assert!(late_total > 0, "some approvals came late");
        assert_eq!(rows.len() as u64, late_total);
        for row in &rows {
            assert_eq!(text(row, "outcome"), "late", "{row}");
            assert_eq!(text(row, "f39"), "00", "an approval: {row}");
            assert!(row["reversal_id"].as_i64().is_some(), "{row}");
            assert_eq!(text(row, "pan"), PAN_MASKED, "{row}");
            // The decline the terminal got at the deadline, same keys.
            let before = journal(
                &data,
                &[
                    "--stan",
                    text(row, "f11"),
                    "--terminal",
                    text(row, "f41"),
                    "--outcome",
                    "switch-made",
                ],
            );
            assert!(
                before.iter().any(|r| text(r, "reason") == "timeout"),
                "the switch's own answer: {before:?}"
            );
        }
        assert_eq!(
            journal(&data, &["--outcome", "reversed"]).len() as u64,
            late_total
        );
    })
    .await;
}

/// kill -9 of the switch under load: the journal reopens clean (the
/// `journal` command reads it, the restarted switch writes to it), keeps
/// what it committed, and never holds more rows than exchanges the NAC
/// sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_survives_a_kill_9_under_load() {
    within(Duration::from_secs(120), async {
        let addrs = [free_addr()];
        let _node = node("cup-pos", "01", addrs[0], "2..10ms", &[]).await;
        let listen = free_addr();
        let data = data_dir("journal-kill");
        let toml = format!("{JOURNAL_ON}{}", pos_toml(listen, &addrs, "1s", ""));
        let mut first = switch("journal-kill", &toml, &data, listen).await;
        let load = nac("journal-kill-nac", listen, 200, ("3s", "1s"), &[]);
        // Killed once the journal has rows: under load, mid-batch.
        journal_settles(&data, &[], |rows| rows.len() >= 50).await;
        first.kill9().await;
        let report = load.report().await;
        let before = journal(&data, &[]);
        assert!(
            before.len() as u64 <= n(&report, "sent"),
            "{} rows for {report}",
            before.len()
        );
        assert!(before.iter().all(|r| text(r, "pan") == PAN_MASKED));
        // The restarted switch journals on the same store.
        let _second = switch("journal-kill-2", &toml, &data, listen).await;
        let again = nac("journal-kill-nac-2", listen, 50, ("1s", "5s"), &[])
            .report()
            .await;
        assert_exactly_once(&again);
        let want = before.len() + n(&again, "sent") as usize;
        let after = journal_settles(&data, &[], |rows| rows.len() >= want).await;
        assert_eq!(after.len(), want, "one row per exchange after the restart");
    })
    .await;
}

/// `GET PATH` on the admin API with the test token, the body as JSON.
async fn api_get(admin: std::net::SocketAddr, path: &str) -> serde_json::Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin)
        .await
        .expect("admin listener");
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {admin}\r\nAuthorization: Bearer process-test-token\r\n\
         Connection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send GET");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("read answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "GET {path}: {text}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

fn ids(rows: &[serde_json::Value]) -> std::collections::BTreeSet<i64> {
    rows.iter().filter_map(|r| r["id"].as_i64()).collect()
}

/// The switch stamps each node's ID into F37 (`f37_stamp`), so an answer's
/// F37 differs from its request's: `isoswitch journal --rrn R` and `GET
/// /api/v1/journal?rrn=R` find, for the RRN as answered, exactly the
/// exchanges of the node it names, and for the RRN as received, all of
/// them (`isoswitch load` sends one RRN).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_and_the_api_find_exchanges_by_rrn() {
    within(Duration::from_secs(120), async {
        let addrs = [free_addr(), free_addr()];
        let _n1 = node("cups", "01", addrs[0], "1..3ms", &[]).await;
        let _n2 = node("cups", "02", addrs[1], "1..3ms", &[]).await;
        let listen = free_addr();
        let (admin, admin_toml) = admin_toml("journal-rrn");
        let data = data_dir("journal-rrn");
        let toml = format!(
            "{JOURNAL_ON}{admin_toml}[[service]]\nname = \"pos\"\nspec = \"cups\"\n\
             f37_stamp = {{ offset = 10, width = 2 }}\n\
             [service.front]\nkind = \"listen\"\nlisten = \"{listen}\"\n\
             [service.back]\nconnections_per_node = 1\n{}",
            nodes_toml(&addrs)
        );
        let _switch = switch("journal-rrn", &toml, &data, listen).await;
        let target = listen.to_string();
        let load = Proc::spawn(
            "journal-rrn-load",
            &[
                "load",
                "--target",
                &target,
                "--spec",
                "cups",
                "--rate",
                "100",
                "--duration",
                "1s",
                "--clients",
                "4",
                "--quiet",
                "--json",
            ],
        )
        .report()
        .await;
        let answered = n(&load, "answered") as usize;
        assert!(answered > 0, "{load}");
        let rows = journal_settles(&data, &[], |rows| rows.len() >= answered).await;
        assert_eq!(rows.len(), answered, "one row per exchange");

        let received = text(&rows[0], "f37_in").to_string();
        assert_eq!(received.len(), 12, "{}", rows[0]);
        assert!(rows.iter().all(|r| text(r, "f37_in") == received));
        let by_received = journal(&data, &["--rrn", &received]);
        assert_eq!(
            ids(&by_received),
            ids(&rows),
            "every exchange, by F37 as received"
        );

        for id in ["01", "02"] {
            let mine = where_(&rows, "node", id);
            assert!(!mine.is_empty(), "node {id} answered some");
            let stamped = text(mine[0], "f37_out").to_string();
            assert_eq!(&stamped[10..], id, "the stamp names the node: {}", mine[0]);
            assert_ne!(stamped, received);
            let want: std::collections::BTreeSet<i64> =
                mine.iter().filter_map(|r| r["id"].as_i64()).collect();
            let by_cli = journal(&data, &["--rrn", &stamped]);
            assert_eq!(ids(&by_cli), want, "--rrn {stamped}");
            assert!(by_cli.iter().all(|r| text(r, "f37_out") == stamped));
            let by_api = api_get(
                admin,
                &format!("/api/v1/journal?rrn={stamped}&limit=100000"),
            )
            .await;
            let by_api = by_api.as_array().expect("an array");
            assert_eq!(ids(by_api), want, "GET ?rrn={stamped}");
            assert!(by_api.iter().all(|r| !text(r, "pan").contains(PAN)));
        }
        assert!(journal(&data, &["--rrn", "999999999999"]).is_empty());
        let none = api_get(admin, "/api/v1/journal?rrn=999999999999").await;
        assert_eq!(none.as_array().map(Vec::len), Some(0), "{none}");
    })
    .await;
}

/// The reasons docs/journal.md gives for switch-made rows are the ones the
/// switch writes (`DeclineReason::as_str`, the same text as the metrics'
/// `reason` label): a query by a documented name finds its rows.
#[test]
fn every_documented_decline_reason_is_what_the_store_holds() {
    use isoswitch::route::DeclineReason;
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/journal.md"))
        .expect("docs/journal.md");
    let documented: Vec<String> = doc
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains("| `switch` |"))
        .filter_map(|l| l.split('|').nth(3).map(str::to_string))
        .flat_map(|cell| {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|r| r != "stored")
        .collect();
    let written: Vec<&str> = DeclineReason::ALL.iter().map(|r| r.as_str()).collect();
    assert!(!documented.is_empty());
    for r in &documented {
        assert!(
            written.contains(&r.as_str()),
            "documented {r:?}, written: {written:?}"
        );
    }
    for r in written {
        assert!(
            documented.iter().any(|d| d == r),
            "{r} written, not documented: {documented:?}"
        );
    }
}
