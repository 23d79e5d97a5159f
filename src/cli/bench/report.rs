//! What `isoswitch bench` prints: the header, the table of rows, the
//! summary over repeats with its ratios, dwell times and system calls.

use super::*;

pub(super) fn print_header(
    args: &BenchArgs,
    pinning: Option<&Pinning>,
    proxy_threads: usize,
    rig: &Rig,
    load_average: &str,
) {
    println!("# isoswitch bench\n");
    println!(
        "- load: spec {}, {} clients x {} in flight, mix {:?}, {} s per row, {} repetition(s), rows interleaved",
        args.spec,
        args.clients,
        args.in_flight,
        args.mix,
        args.duration.as_secs_f64(),
        args.repeat.max(1),
    );
    println!(
        "- processes: {} nodes (`isoswitch sim node`, one process each), the switch (`isoswitch run`, {proxy_threads} worker thread(s)), {}, the load generator (this process)",
        rig.nodes.len(),
        if rig.haproxy.is_some() {
            format!("HAProxy (TCP mode, nbthread {proxy_threads})")
        } else {
            "no HAProxy".into()
        }
    );
    println!(
        "- journal: (c) is the switch as shipped, its journal on (`[journal] enabled = true`, SQLite in its data directory); {}",
        if rig.switch_journal_off.is_some() {
            "(cj) is a second switch, same config and threads, with `[journal] enabled = false` (the routing core)"
        } else {
            "no journal-off row (--no-journal-off)"
        }
    );
    if rig.switch_integrity_off.is_some() {
        println!(
            "- (c0): another switch, same config and threads, its journal on, with `[service.integrity]` late_approval = \"log\", late_window = \"0s\", repeat_window = \"0s\" (its SQLite store opens in its data directory all the same)"
        );
    }
    match pinning {
        Some(p) => println!(
            "- CPUs (taskset): switch and HAProxy on {}, load generator and nodes on {}",
            p.proxy.list(),
            p.load.list()
        ),
        None => println!("- CPUs: nothing pinned"),
    }
    // Not available_parallelism: this process may be pinned by now.
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| CpuSet::parse(&s).ok())
        .map_or(0, |c| c.len());
    println!("- machine: {online} CPU(s) online, load average at the start {load_average}");
    println!(
        "- CPU µs/msg: utime + stime of the proxy process (/proc/PID/stat) over the row / answers it carried (a message = a request and its answer)"
    );
}

pub(super) fn print_table<'r>(rows: impl Iterator<Item = &'r Row>, numbered: bool) {
    println!(
        "| target | sent/s | approved/s | declined | errors/timeouts | p50 µs | p99 µs | p99.9 µs | CPU µs/msg | CPU % of a core | user % of it | ctx switches/msg |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let name = if numbered {
            format!("{} #{}", r.target.label(), r.repetition + 1)
        } else {
            r.target.label().to_string()
        };
        let [cpu_msg, cpu_pct, user_pct, switches] =
            r.cpu.map_or(["-", "-", "-", "-"].map(String::from), |c| {
                [
                    format!("{:.1}", c.us_per_msg),
                    format!("{:.0}", c.percent),
                    format!("{:.0}", c.user_percent),
                    format!("{:.2}", c.switches_per_msg),
                ]
            });
        let rep = &r.report;
        println!(
            "| {name} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {cpu_msg} | {cpu_pct} | {user_pct} | {switches} |",
            rep.sent_per_s(),
            rep.approved_per_s(),
            rep.declined,
            rep.errors(),
            rep.percentile_us(0.5),
            rep.percentile_us(0.99),
            rep.percentile_us(0.999),
        );
    }
}

/// The figures of a run, median over its repetitions, as `key = value`
/// lines (printed last, read by docs/capacity.md), and the same figures as
/// `median (range)` for the ratios section.
pub(super) struct Summary {
    pub(super) lines: Vec<(String, String)>,
    pub(super) spreads: Vec<(String, String)>,
}

impl Summary {
    pub(super) fn from_rows(rows: &[Row], args: &BenchArgs) -> Summary {
        let mut s = Summary {
            lines: Vec::new(),
            spreads: Vec::new(),
        };
        let reps = args.repeat.max(1);
        // Per repetition: a row's value, or None when the row is missing.
        let per_rep = |target: Target, rate: Option<f64>, f: &dyn Fn(&Row) -> Option<f64>| {
            (0..reps)
                .map(|i| {
                    rows.iter()
                        .find(|r| r.target == target && r.rate == rate && r.repetition == i)
                        .and_then(f)
                })
                .collect::<Vec<_>>()
        };
        let approved = |r: &Row| Some(r.report.approved_per_s());
        let cpu = |r: &Row| r.cpu.map(|c| c.us_per_msg);
        let p99 = |r: &Row| Some(r.report.percentile_us(0.99) as f64);
        if !args.no_saturation {
            for t in ALL_TARGETS {
                s.add(
                    &format!("saturation_approved_per_s.{}", t.key()),
                    &per_rep(t, None, &approved),
                    0,
                );
            }
            for t in [
                Target::Haproxy,
                Target::Switch,
                Target::SwitchJournalOff,
                Target::SwitchIntegrityOff,
            ] {
                s.add(
                    &format!("cpu_us_per_msg.{}@saturation", t.key()),
                    &per_rep(t, None, &cpu),
                    1,
                );
            }
            s.add(
                "ratio.cpu_switch_over_haproxy@saturation",
                &div(
                    &per_rep(Target::Switch, None, &cpu),
                    &per_rep(Target::Haproxy, None, &cpu),
                ),
                2,
            );
            let sw = per_rep(Target::Switch, None, &approved);
            let ha = per_rep(Target::Haproxy, None, &approved);
            let di = per_rep(Target::Direct, None, &approved);
            s.add("ratio.saturation_switch_over_haproxy", &div(&sw, &ha), 2);
            s.add("ratio.saturation_switch_over_direct", &div(&sw, &di), 2);
            let da = per_rep(Target::DirectAll, None, &approved);
            s.add("ratio.saturation_switch_over_direct_all", &div(&sw, &da), 2);
            s.add(
                "ratio.saturation_haproxy_over_direct_all",
                &div(&ha, &da),
                2,
            );
            // HAProxy against the routing core: the switch, journal off.
            let core_cpu = per_rep(Target::SwitchJournalOff, None, &cpu);
            s.add(
                "ratio.cpu_switch_journal_off_over_haproxy@saturation",
                &div(&core_cpu, &per_rep(Target::Haproxy, None, &cpu)),
                2,
            );
            let core = per_rep(Target::SwitchJournalOff, None, &approved);
            s.add(
                "ratio.saturation_switch_journal_off_over_haproxy",
                &div(&core, &ha),
                2,
            );
        }
        for &rate in &args.rates {
            let at = Some(rate);
            let r = format!("{rate:.0}");
            let sw_cpu = per_rep(Target::Switch, at, &cpu);
            let ha_cpu = per_rep(Target::Haproxy, at, &cpu);
            s.add(&format!("cpu_us_per_msg.switch@{r}"), &sw_cpu, 1);
            s.add(&format!("cpu_us_per_msg.haproxy@{r}"), &ha_cpu, 1);
            s.add(
                &format!("ratio.cpu_switch_over_haproxy@{r}"),
                &div(&sw_cpu, &ha_cpu),
                2,
            );
            let core_cpu = per_rep(Target::SwitchJournalOff, at, &cpu);
            s.add(
                &format!("cpu_us_per_msg.switch_journal_off@{r}"),
                &core_cpu,
                1,
            );
            s.add(
                &format!("ratio.cpu_switch_journal_off_over_haproxy@{r}"),
                &div(&core_cpu, &ha_cpu),
                2,
            );
            s.add(
                &format!("ratio.cpu_journal_on_over_off@{r}"),
                &div(&sw_cpu, &core_cpu),
                3,
            );
            let off_cpu = per_rep(Target::SwitchIntegrityOff, at, &cpu);
            s.add(
                &format!("cpu_us_per_msg.switch_integrity_off@{r}"),
                &off_cpu,
                1,
            );
            s.add(
                &format!("ratio.cpu_integrity_on_over_off@{r}"),
                &div(&sw_cpu, &off_cpu),
                3,
            );
            let direct = per_rep(Target::Direct, at, &p99);
            for t in ALL_TARGETS {
                s.add(&format!("p99_us.{}@{r}", t.key()), &per_rep(t, at, &p99), 0);
            }
            let direct_all = per_rep(Target::DirectAll, at, &p99);
            for t in [Target::Haproxy, Target::Switch, Target::SwitchJournalOff] {
                s.add(
                    &format!("p99_added_us.{}@{r}", t.key()),
                    &sub(&per_rep(t, at, &p99), &direct),
                    0,
                );
                s.add(
                    &format!("p99_added_over_direct_all_us.{}@{r}", t.key()),
                    &sub(&per_rep(t, at, &p99), &direct_all),
                    0,
                );
            }
        }
        // A total, not a median: one lost answer in any row counts.
        let errors: u64 = rows.iter().map(|r| r.report.errors()).sum();
        s.lines.push(("errors.all_rows".into(), errors.to_string()));
        s
    }

    /// Adds a figure when every repetition has it.
    pub(super) fn add(&mut self, key: &str, values: &[Option<f64>], decimals: usize) {
        let Some(mut v) = values.iter().copied().collect::<Option<Vec<f64>>>() else {
            return;
        };
        if v.is_empty() {
            return;
        }
        v.sort_by(f64::total_cmp);
        let show = |x: f64| format!("{x:.decimals$}");
        let median = v[v.len() / 2];
        self.lines.push((key.to_string(), show(median)));
        let spread = match (v.first(), v.last()) {
            (Some(&lo), Some(&hi)) if v.len() > 1 => {
                format!("{} (range {} .. {})", show(median), show(lo), show(hi))
            }
            _ => show(median),
        };
        self.spreads.push((key.to_string(), spread));
    }

    pub(super) fn spread(&self, key: &str) -> Option<&str> {
        self.spreads
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

pub(super) fn div(a: &[Option<f64>], b: &[Option<f64>]) -> Vec<Option<f64>> {
    a.iter()
        .zip(b)
        .map(|(a, b)| match (a, b) {
            (Some(a), Some(b)) if *b > 0.0 => Some(a / b),
            _ => None,
        })
        .collect()
}

pub(super) fn sub(a: &[Option<f64>], b: &[Option<f64>]) -> Vec<Option<f64>> {
    a.iter().zip(b).map(|(a, b)| Some((*a)? - (*b)?)).collect()
}

/// The ratios as measured. The goals they are judged against are the goal
/// lines' (`goals.rs`), printed after: issue 10's older bars (CPU ≤ 0.5×
/// HAProxy, saturation ≥ 1.5×, 300 µs added) no longer sit beside them.
pub(super) fn print_ratios(s: &Summary, args: &BenchArgs) {
    println!("\n## Ratios (same run)\n");
    let line = |what: &str, key: &str, goal: &str| {
        if let Some(v) = s.spread(key) {
            println!("- {what}: **{v}**{goal}");
        }
    };
    for &rate in &args.rates {
        let r = format!("{rate:.0}");
        line(
            &format!(
                "switch CPU/msg ÷ HAProxy CPU/msg at {r} req/s, journal on (as shipped, (c) ÷ (b))"
            ),
            &format!("ratio.cpu_switch_over_haproxy@{r}"),
            "",
        );
        line(
            &format!(
                "switch CPU/msg ÷ HAProxy CPU/msg at {r} req/s, journal off (the routing core, (cj) ÷ (b))"
            ),
            &format!("ratio.cpu_switch_journal_off_over_haproxy@{r}"),
            "",
        );
        line(
            &format!("CPU µs/msg journal on ÷ off at {r} req/s (switch (c) ÷ (cj))"),
            &format!("ratio.cpu_journal_on_over_off@{r}"),
            "",
        );
        line(
            &format!("CPU µs/msg integrity on ÷ off at {r} req/s (switch (c) ÷ (c0))"),
            &format!("ratio.cpu_integrity_on_over_off@{r}"),
            " (goal ≤ 1.05)",
        );
    }
    line(
        "saturation, switch ÷ HAProxy (approved/s), journal on (as shipped)",
        "ratio.saturation_switch_over_haproxy",
        "",
    );
    line(
        "saturation, switch ÷ HAProxy (approved/s), journal off (the routing core)",
        "ratio.saturation_switch_journal_off_over_haproxy",
        "",
    );
    line(
        "saturation, switch ÷ direct to one node (approved/s)",
        "ratio.saturation_switch_over_direct",
        "",
    );
    line(
        "saturation, switch ÷ direct with the clients spread over the nodes (approved/s)",
        "ratio.saturation_switch_over_direct_all",
        "",
    );
    line(
        "saturation, HAProxy ÷ direct with the clients spread over the nodes (approved/s)",
        "ratio.saturation_haproxy_over_direct_all",
        "",
    );
    for &rate in &args.rates {
        let r = format!("{rate:.0}");
        line(
            &format!("switch-added p99 at {r} req/s (switch p99 − direct p99), journal on"),
            &format!("p99_added_us.switch@{r}"),
            " µs",
        );
        line(
            &format!("switch-added p99 at {r} req/s, journal off"),
            &format!("p99_added_us.switch_journal_off@{r}"),
            " µs",
        );
        line(
            &format!("HAProxy-added p99 at {r} req/s"),
            &format!("p99_added_us.haproxy@{r}"),
            " µs",
        );
        line(
            &format!(
                "switch-added p99 at {r} req/s over direct with the clients spread over the nodes"
            ),
            &format!("p99_added_over_direct_all_us.switch@{r}"),
            " µs",
        );
        line(
            &format!(
                "HAProxy-added p99 at {r} req/s over direct with the clients spread over the nodes"
            ),
            &format!("p99_added_over_direct_all_us.haproxy@{r}"),
            " µs",
        );
    }
}

pub(super) fn print_dwell(
    timed: &[(Target, usize, LoadReport, dwell::Dwell, Option<u64>)],
    window: Duration,
    rate: &str,
) {
    println!(
        "\n## Time inside the proxy, on the wire ({} s at {rate} req/s offered; tcpdump on the loopback, legs matched by F11)\n",
        window.as_secs_f64()
    );
    println!(
        "Request leg: proxy → node minus client → proxy. Answer leg: proxy → client minus node → proxy. \
         Both: their sum, what the proxy added to the round trip. µs.\n"
    );
    println!(
        "| proxy | sent/s | messages timed | not timed | packets dropped | request p50 | request p99 | answer p50 | answer p99 | both p50 | both p90 | both p99 | both p99.9 | both max |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let many = timed.iter().any(|(_, rep, ..)| *rep > 0);
    for (t, rep, report, d, dropped) in timed {
        let q = |v: &[u64], q: f64| dwell::quantile(v, q).map_or("-".into(), |x| x.to_string());
        let label = if many {
            format!("{} #{}", t.label(), rep + 1)
        } else {
            t.label().to_string()
        };
        println!(
            "| {label} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            report.sent_per_s(),
            d.messages(),
            d.unmatched,
            dropped.map_or("-".into(), |n| n.to_string()),
            q(&d.request, 0.5),
            q(&d.request, 0.99),
            q(&d.answer, 0.5),
            q(&d.answer, 0.99),
            q(&d.both, 0.5),
            q(&d.both, 0.9),
            q(&d.both, 0.99),
            q(&d.both, 0.999),
            q(&d.both, 1.0),
        );
    }
}

pub(super) fn per_msg(n: u64, rep: &LoadReport) -> f64 {
    n as f64 / (rep.answered + rep.declined).max(1) as f64
}

pub(super) fn print_syscalls(
    counted: &[(Target, &str, LoadReport, strace::Counts)],
    window: Duration,
    rate: &str,
) {
    println!(
        "\n## System calls per message ({} s at {rate} req/s offered; `perf stat` on the syscall tracepoints, `strace -c -f -p PID`)\n",
        window.as_secs_f64()
    );
    print!("| system call |");
    for (t, tool, _, _) in counted {
        print!(" {} ({tool}) |", t.key());
    }
    println!();
    println!("|---|{}", "---:|".repeat(counted.len()));
    let mut names: Vec<&str> = Vec::new();
    for (_, _, _, c) in counted {
        for (n, _) in &c.0 {
            if n != "all" && !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
    }
    for name in names {
        // Calls under one per 1,000 messages are timers and housekeeping.
        if counted
            .iter()
            .all(|(_, _, rep, c)| per_msg(c.get(name), rep) < 0.001)
        {
            continue;
        }
        print!("| `{name}` |");
        for (_, tool, rep, c) in counted {
            if *tool == "perf" && !c.0.iter().any(|(n, _)| n == name) {
                print!(" - |");
            } else {
                print!(" {:.3} |", per_msg(c.get(name), rep));
            }
        }
        println!();
    }
    print!("| **all** |");
    for (_, _, rep, c) in counted {
        print!(" **{:.2}** |", per_msg(c.total(), rep));
    }
    println!();
    print!("| messages answered (msg/s carried) |");
    for (_, _, rep, _) in counted {
        print!(
            " {} ({:.0}) |",
            rep.answered + rep.declined,
            rep.throughput()
        );
    }
    println!();
}
