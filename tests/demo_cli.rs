//! The README's first command: `isoswitch demo` runs the whole switch on the
//! embedded default and ends with nothing lost and nothing doubled, on a
//! screen a person can read: the switch's log goes to a file the demo names.

use std::process::{Command, Stdio};

/// `2026-12-04T09:38:12.231198Z  WARN isoswitch::link::back::node: ...`: a line of
/// the switch's log (text format) rather than of the demo's narration.
fn is_log_line(line: &str) -> bool {
    let mut words = line.split_whitespace();
    let stamp = words.next().unwrap_or("");
    let level = words.next().unwrap_or("");
    stamp.len() > 20
        && stamp.as_bytes()[..4].iter().all(u8::is_ascii_digit)
        && stamp.contains('T')
        && ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level)
}

#[test]
fn demo_runs_to_a_clean_summary() {
    // stdout and stderr into one file, in the order written, as a terminal
    // shows them; the switch's default log level.
    let screen_path =
        std::env::temp_dir().join(format!("isoswitch-demo-test-{}.screen", std::process::id()));
    let screen = std::fs::File::create(&screen_path).expect("screen file");
    let status = Command::new(env!("CARGO_BIN_EXE_isoswitch"))
        .args(["demo", "--seconds", "6"])
        .env_remove("ISOSWITCH_LOG")
        .env_remove("ISOSWITCH_LOG_FORMAT")
        .stdout(screen.try_clone().expect("screen file"))
        .stderr(screen)
        .stdin(Stdio::null())
        .status()
        .expect("run the demo");
    let stdout = std::fs::read_to_string(&screen_path).expect("read the screen");
    let _ = std::fs::remove_file(&screen_path);
    assert!(status.success(), "demo failed:\n{stdout}");
    assert_readable(&stdout);
    assert!(stdout.contains("draining node 02"), "{stdout}");
    assert!(stdout.contains("killing node 03"), "{stdout}");
    assert!(stdout.contains("disabling node 01"), "{stdout}");
    assert!(
        stdout.contains("weight 1 -> 3"),
        "the reload applied: {stdout}"
    );
    assert!(
        stdout.contains("NODE   ADDRESS"),
        "status tables from the API: {stdout}"
    );
    assert!(stdout.contains("node 03 is back"), "{stdout}");
    assert!(
        stdout.contains("lost = 0, answered twice or crossed = 0"),
        "{stdout}"
    );
    // The VISA duplex scenario has its own row.
    let visa = stdout
        .lines()
        .find(|l| l.starts_with("VISA "))
        .unwrap_or_else(|| panic!("a VISA row: {stdout}"));
    assert!(visa.contains("unanswered 0 doubled/crossed 0"), "{visa}");
    // So has the Mastercard one (same shape, no header, the member signs on).
    let mastercard = stdout
        .lines()
        .find(|l| l.starts_with("Mastercard "))
        .unwrap_or_else(|| panic!("a Mastercard row: {stdout}"));
    assert!(
        mastercard.contains("unanswered 0 doubled/crossed 0"),
        "{mastercard}"
    );
    // The ATM (OneConnect) scenario has its own row: every ATM answered, the
    // hosts never see more than the pool's connections.
    let atm = stdout
        .lines()
        .find(|l| l.starts_with("ATM (OneConnect)"))
        .unwrap_or_else(|| panic!("no ATM row:\n{stdout}"));
    assert!(atm.contains("timeouts 0 mismatches 0"), "{atm}");
    let hosts = atm
        .split("host connections ")
        .nth(1)
        .and_then(|r| r.split_once(" (pool max "))
        .unwrap_or_else(|| panic!("no host connections: {atm}"));
    let max: u64 = hosts.1.split(' ').next().unwrap().parse().unwrap();
    for n in hosts.0.split('/') {
        assert!(n.parse::<u64>().unwrap() <= max, "{atm}");
    }
    // One progress line a second.
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("t=")).count(),
        6,
        "{stdout}"
    );
}

/// Nothing but the demo's own lines on the screen: no log line anywhere, and
/// under every status table header exactly the three node rows. The log is
/// in the file named on the first line and again on the last, with the
/// warnings node 03's death caused.
fn assert_readable(screen: &str) {
    let lines: Vec<&str> = screen.lines().collect();
    let log_line = lines.iter().find(|l| is_log_line(l));
    assert!(
        log_line.is_none(),
        "a log line on the screen: {log_line:?}\n{screen}"
    );
    let mut tables = 0;
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with("  NODE   ADDRESS") {
            continue;
        }
        tables += 1;
        let rows: Vec<&str> = lines[i + 1..]
            .iter()
            .take_while(|l| l.starts_with("  "))
            .copied()
            .collect();
        assert_eq!(rows.len(), 3, "three node rows under line {i}:\n{screen}");
        for (n, row) in rows.iter().enumerate() {
            let id = format!("  {:02} ", n + 1);
            assert!(
                row.starts_with(&id) && row.contains("127.0.0.1:"),
                "line {} is not node {:02}'s row: {row:?}\n{screen}",
                i + 1 + n,
                n + 1
            );
        }
    }
    // Five steps, five services each (the embedded default's four and the
    // demo's Mastercard service).
    assert_eq!(tables, 25, "{screen}");
    let named = |line: &str| {
        line.strip_prefix("switch log: ")
            .map(|rest| rest.split(" (").next().unwrap_or(rest).to_string())
    };
    let first = lines.first().and_then(|l| named(l));
    let last = lines.last().and_then(|l| named(l));
    let path = first.unwrap_or_else(|| panic!("the log file named first:\n{screen}"));
    assert_eq!(last.as_deref(), Some(path.as_str()), "and last:\n{screen}");
    // The journal, on by default, is named with the command for its report,
    // and that command prints the day's table.
    let report = lines
        .iter()
        .find_map(|l| {
            l.trim()
                .strip_prefix("isoswitch journal report --data-dir ")
        })
        .unwrap_or_else(|| panic!("the journal report command:\n{screen}"))
        .to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_isoswitch"))
        .args(["journal", "report", "--data-dir", &report])
        .output()
        .expect("journal report runs");
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = std::fs::remove_dir_all(&report);
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        table.contains("switch-made") || table.contains("answered"),
        "{table}"
    );
    let log = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let _ = std::fs::remove_file(&path);
    assert!(
        log.lines()
            .any(|l| is_log_line(l) && l.contains(" WARN ") && l.contains("node=03")),
        "node 03's warnings are in the log file:\n{log}"
    );
}

#[test]
fn example_configs_check_and_print_defaults() {
    let check = |file: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_isoswitch"))
            .args(["check", "--config", file])
            .output()
            .expect("run check");
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    check("examples/unionpay.toml");
    check("examples/visa.toml");
    check("examples/mastercard.toml");
    let out = check("examples/pos-nac.toml");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("tpdu_on_response = \"swap\""),
        "defaults are printed: {text}"
    );
}
