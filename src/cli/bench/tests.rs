//! The bench's flags and its summary arithmetic.

use super::*;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn args(argv: &[&str]) -> BenchArgs {
    Cli::try_parse_from(std::iter::once("bench").chain(argv.iter().copied()))
        .unwrap()
        .bench
}

#[test]
fn defaults_offer_10k_and_30k_and_no_strace() {
    let a = args(&[]);
    assert_eq!(a.rates, vec![10_000.0, 30_000.0]);
    assert_eq!(a.strace, None);
    let a = args(&["--rate", "5000,20000", "--strace"]);
    assert_eq!(a.rates, vec![5_000.0, 20_000.0]);
    assert_eq!(a.strace, Some(Duration::from_secs(10)));
    let a = args(&["--strace", "3s"]);
    assert_eq!(a.strace, Some(Duration::from_secs(3)));
    assert!(Cli::try_parse_from(["bench", "--rate", "0"]).is_err());
}

#[test]
fn cpu_per_message_is_process_time_over_answers() {
    // 150 ticks = 1.5 s of CPU for 50,000 answers in 5 s.
    let spent = procs::Usage {
        user: 50,
        system: 100,
        switches: 25_000,
    };
    let c = cpu_use(spent, 50_000, Duration::from_secs(5));
    assert!((c.us_per_msg - 30.0).abs() < 1e-9, "{}", c.us_per_msg);
    assert!((c.percent - 30.0).abs() < 1e-9, "{}", c.percent);
    assert!(
        (c.user_percent - 100.0 / 3.0).abs() < 1e-9,
        "{}",
        c.user_percent
    );
    assert!(
        (c.switches_per_msg - 0.5).abs() < 1e-9,
        "{}",
        c.switches_per_msg
    );
}

fn row(
    target: Target,
    rate: Option<f64>,
    repetition: usize,
    answered: u64,
    p99: u64,
    cpu: f64,
) -> Row {
    let mut latency_us = hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3).unwrap();
    latency_us.record(p99).unwrap();
    Row {
        target,
        rate,
        repetition,
        report: LoadReport {
            requests: answered + 10,
            answered,
            declined: 10,
            timeouts: 0,
            mismatches: 0,
            connections_lost: 0,
            connects: 50,
            connect_failures: 0,
            elapsed: Duration::from_secs(1),
            latency_us,
        },
        cpu: matches!(
            target,
            Target::Haproxy
                | Target::Switch
                | Target::SwitchJournalOff
                | Target::SwitchIntegrityOff
        )
        .then_some(Cpu {
            us_per_msg: cpu,
            percent: 50.0,
            user_percent: 30.0,
            switches_per_msg: 1.0,
        }),
    }
}

#[test]
fn summary_divides_within_a_repetition_and_takes_the_median() {
    let a = args(&["--rate", "10000", "--repeat", "3"]);
    let mut rows = Vec::new();
    for (i, (sw, ha)) in [(20.0, 40.0), (30.0, 40.0), (45.0, 50.0)]
        .iter()
        .enumerate()
    {
        rows.push(row(Target::Direct, None, i, 100_000, 100, 0.0));
        rows.push(row(Target::DirectAll, None, i, 64_000, 100, 0.0));
        rows.push(row(Target::Haproxy, None, i, 50_000, 100, *ha));
        rows.push(row(Target::Switch, None, i, 80_000, 100, *sw));
        rows.push(row(Target::Direct, Some(10_000.0), i, 10_000, 200, 0.0));
        rows.push(row(Target::DirectAll, Some(10_000.0), i, 10_000, 350, 0.0));
        rows.push(row(Target::Haproxy, Some(10_000.0), i, 10_000, 500, *ha));
        rows.push(row(
            Target::Switch,
            Some(10_000.0),
            i,
            10_000,
            400 + i as u64 * 100,
            *sw,
        ));
    }
    let s = Summary::from_rows(&rows, &a);
    let get = |k: &str| {
        s.lines
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {k} in {:?}", s.lines))
    };
    // Approved only: the 10 declines per row are not throughput.
    assert_eq!(get("saturation_approved_per_s.switch"), "80000");
    assert_eq!(get("ratio.saturation_switch_over_haproxy"), "1.60");
    assert_eq!(get("ratio.saturation_switch_over_direct"), "0.80");
    assert_eq!(get("ratio.saturation_switch_over_direct_all"), "1.25");
    assert_eq!(get("ratio.saturation_haproxy_over_direct_all"), "0.78");
    // Ratios 0.5, 0.75, 0.9: median 0.75.
    assert_eq!(get("ratio.cpu_switch_over_haproxy@10000"), "0.75");
    assert_eq!(
        s.spread("ratio.cpu_switch_over_haproxy@10000"),
        Some("0.75 (range 0.50 .. 0.90)")
    );
    assert_eq!(get("cpu_us_per_msg.switch@10000"), "30.0");
    // Switch p99 400, 500, 600 µs against direct 200 µs.
    assert_eq!(get("p99_added_us.switch@10000"), "300");
    assert_eq!(get("p99_added_us.haproxy@10000"), "300");
    assert_eq!(get("p99_added_over_direct_all_us.switch@10000"), "150");
}

#[test]
fn integrity_on_over_off_is_paired_within_a_repetition() {
    let a = args(&["--rate", "10000", "--no-saturation", "--repeat", "3"]);
    assert!(!a.integrity_off);
    assert!(args(&["--integrity-off"]).integrity_off);
    let mut rows = Vec::new();
    for (i, (on, off)) in [(21.0, 20.0), (30.0, 25.0), (19.0, 20.0)]
        .iter()
        .enumerate()
    {
        let at = Some(10_000.0);
        rows.push(row(Target::Switch, at, i, 10_000, 300, *on));
        rows.push(row(Target::SwitchIntegrityOff, at, i, 10_000, 300, *off));
    }
    let s = Summary::from_rows(&rows, &a);
    // Ratios 1.05, 1.2, 0.95: median 1.05.
    assert_eq!(
        s.spread("ratio.cpu_integrity_on_over_off@10000"),
        Some("1.050 (range 0.950 .. 1.200)")
    );
    assert_eq!(
        s.spread("cpu_us_per_msg.switch_integrity_off@10000"),
        Some("20.0 (range 20.0 .. 25.0)")
    );
}

#[test]
fn integrity_on_and_off_take_turns_going_first() {
    use Target::*;
    let all = vec![Direct, DirectAll, Switch, SwitchIntegrityOff];
    assert_eq!(take_turns(all.clone(), 0), all);
    assert_eq!(
        take_turns(all.clone(), 1),
        [Direct, DirectAll, SwitchIntegrityOff, Switch]
    );
    assert_eq!(take_turns(all.clone(), 2), all);
    let without = vec![Direct, Haproxy, Switch];
    assert_eq!(take_turns(without.clone(), 1), without);
    // Three switches: their order reversed every other repetition.
    let three = vec![
        Direct,
        Haproxy,
        Switch,
        SwitchJournalOff,
        SwitchIntegrityOff,
    ];
    assert_eq!(take_turns(three.clone(), 2), three);
    assert_eq!(
        take_turns(three.clone(), 1),
        [
            Direct,
            Haproxy,
            SwitchIntegrityOff,
            SwitchJournalOff,
            Switch
        ]
    );
}

/// HAProxy compared both ways: the switch as shipped (journal on) and the
/// routing core (journal off), and journal on ÷ off, each within its
/// repetition.
#[test]
fn haproxy_is_compared_with_the_switch_journal_on_and_off() {
    let a = args(&["--rate", "10000", "--repeat", "3"]);
    assert!(!a.no_journal_off);
    assert!(args(&["--no-journal-off"]).no_journal_off);
    let mut rows = Vec::new();
    for (i, (on, off, ha)) in [(24.0, 20.0, 40.0), (36.0, 30.0, 40.0), (26.0, 20.0, 50.0)]
        .iter()
        .enumerate()
    {
        rows.push(row(Target::Haproxy, None, i, 50_000, 100, *ha));
        rows.push(row(Target::Switch, None, i, 60_000, 100, *on));
        rows.push(row(Target::SwitchJournalOff, None, i, 75_000, 100, *off));
        let at = Some(10_000.0);
        rows.push(row(Target::Direct, at, i, 10_000, 200, 0.0));
        rows.push(row(Target::Haproxy, at, i, 10_000, 500, *ha));
        rows.push(row(Target::Switch, at, i, 10_000, 400, *on));
        rows.push(row(Target::SwitchJournalOff, at, i, 10_000, 300, *off));
    }
    let s = Summary::from_rows(&rows, &a);
    // On: 0.6, 0.9, 0.52; off: 0.5, 0.75, 0.4; on ÷ off 1.2, 1.2, 1.3.
    assert_eq!(
        s.spread("ratio.cpu_switch_over_haproxy@10000"),
        Some("0.60 (range 0.52 .. 0.90)")
    );
    assert_eq!(
        s.spread("ratio.cpu_switch_journal_off_over_haproxy@10000"),
        Some("0.50 (range 0.40 .. 0.75)")
    );
    assert_eq!(
        s.spread("ratio.cpu_journal_on_over_off@10000"),
        Some("1.200 (range 1.200 .. 1.300)")
    );
    let get = |k: &str| {
        s.lines
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(get("ratio.saturation_switch_over_haproxy"), Some("1.20"));
    assert_eq!(
        get("ratio.saturation_switch_journal_off_over_haproxy"),
        Some("1.50")
    );
    assert_eq!(get("p99_added_us.switch_journal_off@10000"), Some("100"));
    assert_eq!(
        get("saturation_approved_per_s.switch_journal_off"),
        Some("75000")
    );
}

#[test]
fn without_haproxy_its_ratios_are_left_out() {
    let a = args(&["--rate", "10000", "--no-saturation"]);
    let rows = vec![
        row(Target::Direct, Some(10_000.0), 0, 10_000, 200, 0.0),
        row(Target::Switch, Some(10_000.0), 0, 10_000, 300, 25.0),
    ];
    let s = Summary::from_rows(&rows, &a);
    assert!(s.spread("ratio.cpu_switch_over_haproxy@10000").is_none());
    assert!(s.spread("ratio.cpu_integrity_on_over_off@10000").is_none());
    assert_eq!(s.spread("p99_added_us.switch@10000"), Some("100"));
    assert!(s.spread("ratio.saturation_switch_over_direct").is_none());
    assert!(
        s.spread("ratio.saturation_switch_over_direct_all")
            .is_none()
    );
}
