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
