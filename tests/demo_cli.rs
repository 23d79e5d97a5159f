//! The README's first command: `isoswitch demo` runs the whole switch on the
//! embedded default and ends with nothing lost and nothing doubled.

use std::process::Command;

#[test]
fn demo_runs_to_a_clean_summary() {
    let out = Command::new(env!("CARGO_BIN_EXE_isoswitch"))
        .args(["demo", "--seconds", "6"])
        .env("ISOSWITCH_LOG", "error")
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    let out = check("examples/pos-nac.toml");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("tpdu_on_response = \"swap\""),
        "defaults are printed: {text}"
    );
}
