//! `isoswitch bench` end to end, briefly: the binary starts its node
//! processes and the switch, runs one open-loop row per target, and prints
//! the tables and the summary lines docs/capacity.md is refreshed from.
//! Structure only: no figure is compared with a speed.

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_prints_its_rows_and_summary_lines() {
    let stdout = run_bench(&[], Duration::from_secs(60)).await;
    assert!(
        stdout.contains("## Open loop at 500 req/s offered"),
        "{stdout}"
    );
    let row = |label: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {label}")))
            .unwrap_or_else(|| panic!("no `{label}` row in {stdout}"))
            .split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    for label in [
        "(a) direct to one node",
        "(c) isoswitch per message, journal on",
        "(cj) isoswitch per message, journal off",
    ] {
        let cols = row(label);
        // target, sent/s, approved/s, declined, errors/timeouts, p50, p99,
        // p99.9, CPU µs/msg, CPU %, user % of it, context switches/msg.
        assert_eq!(cols.len(), 12, "{cols:?}");
        let approved: f64 = cols[2].parse().unwrap();
        assert!(approved > 0.0, "{cols:?}");
        assert_eq!(cols[3], "0", "declined: {cols:?}");
        assert_eq!(cols[4], "0", "errors: {cols:?}");
    }
    // The switch's CPU per message is read from its process; direct has none.
    assert_eq!(row("(a) direct to one node")[8..], ["-", "-", "-", "-"]);
    let switch = row("(c) isoswitch per message, journal on");
    for label in [
        "(c) isoswitch per message, journal on",
        "(cj) isoswitch per message, journal off",
    ] {
        let switch = row(label);
        for (col, what) in [(8, "CPU µs/msg"), (10, "user %"), (11, "switches/msg")] {
            let v: f64 = switch[col]
                .parse()
                .unwrap_or_else(|_| panic!("{what}: {switch:?}"));
            assert!(v >= 0.0, "{what}: {switch:?}");
        }
    }
    // Every switch row says whether its journal is on.
    for line in stdout.lines().filter(|l| l.starts_with("| (c")) {
        assert!(
            line.contains(", journal on |") || line.contains(", journal off |"),
            "a switch row without its journal: {line}"
        );
    }
    assert!(
        stdout.contains("- journal: (c) is the switch as shipped, its journal on"),
        "{stdout}"
    );
    assert!(
        stdout.contains("- CPU µs/msg journal on ÷ off at 500 req/s (switch (c) ÷ (cj))"),
        "{stdout}"
    );
    let user: f64 = switch[10].parse().unwrap();
    assert!(user <= 100.0, "user share: {switch:?}");
    for key in [
        "cpu_us_per_msg.switch@500 = ",
        "p99_us.direct@500 = ",
        "p99_added_us.switch@500 = ",
        "cpu_us_per_msg.switch_journal_off@500 = ",
        "ratio.cpu_journal_on_over_off@500 = ",
        "p99_added_us.switch_journal_off@500 = ",
    ] {
        assert!(stdout.contains(key), "no `{key}` in {stdout}");
    }
}

/// `--integrity-off`: a second switch, its integrity books off, measured as
/// row (c0) beside (c), and the ratio of their CPU per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_measures_the_switch_with_integrity_off_beside_it() {
    let stdout = run_bench(&["--integrity-off"], Duration::from_secs(60)).await;
    let row = stdout
        .lines()
        .find(|l| l.starts_with("| (c0) isoswitch, integrity off, journal on |"))
        .unwrap_or_else(|| panic!("no (c0) row in {stdout}"));
    let cols: Vec<&str> = row.split('|').map(str::trim).collect();
    // "", target, sent/s, approved/s, declined, errors, ..., CPU µs/msg.
    assert_eq!((cols[4], cols[5]), ("0", "0"), "declined, errors: {row}");
    assert!(cols[9].parse::<f64>().is_ok(), "CPU µs/msg: {row}");
    assert!(
        stdout.contains("- CPU µs/msg integrity on ÷ off at 500 req/s"),
        "{stdout}"
    );
    for key in [
        "cpu_us_per_msg.switch_integrity_off@500 = ",
        "ratio.cpu_integrity_on_over_off@500 = ",
    ] {
        assert!(stdout.contains(key), "no `{key}` in {stdout}");
    }
}

/// `--dwell`: tcpdump on the loopback while the load runs through the switch,
/// each message's legs in and out of it matched by F11. Needs tcpdump and the
/// right to capture (root in CI); without them the bench fails and says why,
/// and so does this test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_times_each_message_inside_the_switch_on_the_wire() {
    let stdout = run_bench(
        &["--dwell", "2s", "--dwell-rate", "500", "--no-journal-off"],
        Duration::from_secs(90),
    )
    .await;
    assert!(
        stdout.contains("## Time inside the proxy, on the wire (2 s at 500 req/s offered"),
        "{stdout}"
    );
    let row: Vec<&str> = stdout
        .lines()
        .find(|l| {
            l.starts_with("| (c) isoswitch per message, journal on |") && l.split('|').count() == 16
        })
        .unwrap_or_else(|| panic!("no dwell row for the switch in {stdout}"))
        .split('|')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    // proxy, sent/s, timed, not timed, dropped, request p50, p99, answer
    // p50, p99, both p50, p90, p99, p99.9, max.
    let num = |i: usize| -> f64 {
        row[i]
            .parse()
            .unwrap_or_else(|_| panic!("column {i}: {row:?}"))
    };
    // About 1,000 messages were sent in 2 s; every one whose four legs fell
    // inside the capture is timed (the capture starts before the load).
    assert!(num(2) >= 900.0, "timed: {row:?}");
    assert!(num(3) <= 10.0, "not timed: {row:?}");
    assert_eq!(row[4], "0", "dropped: {row:?}");
    // The sum of the legs is at least each leg, and the quantiles rise.
    assert!(num(9) >= num(5).min(num(7)), "{row:?}");
    assert!(num(9) <= num(10) && num(10) <= num(11) && num(11) <= num(12) && num(12) <= num(13));
    assert!(num(9) > 0.0, "a message takes time in the switch: {row:?}");
    for key in [
        "dwell_p50_us.switch@500 = ",
        "dwell_p99_us.switch@500 = ",
        "dwell_p99_9_us.switch@500 = ",
    ] {
        assert!(stdout.contains(key), "no `{key}` in {stdout}");
    }
}

/// Runs a brief bench (two nodes, four clients, 1 s rows at 500 req/s, no
/// saturation, no HAProxy) with `extra` arguments; its stdout, once it
/// succeeded within `limit`.
async fn run_bench(extra: &[&str], limit: Duration) -> String {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_isoswitch"))
        .args([
            "bench",
            "--duration",
            "1s",
            "--rate",
            "500",
            "--no-saturation",
            "--no-haproxy",
            "--nodes",
            "2",
            "--clients",
            "4",
            "--in-flight",
            "2",
        ])
        .args(extra)
        .env("ISOSWITCH_LOG", "error")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(limit, run)
        .await
        .unwrap_or_else(|_| panic!("bench ends within {limit:?}"))
        .expect("the isoswitch binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "status {:?}\nstdout {stdout}\nstderr {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
