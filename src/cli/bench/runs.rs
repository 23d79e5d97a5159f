//! The optional runs of `isoswitch bench`: system calls per message under
//! strace (`--strace`) and the time inside each proxy read off the wire
//! (`--dwell`).

use super::*;

/// System calls per message of each proxy at `--strace-rate`, counted over
/// one open-loop row each by `perf stat` on the kernel's syscall tracepoints
/// (when perf is installed) and by `strace -c -f -p`. strace stops the traced
/// process twice at every system call: it slows the proxy, whose writes then
/// batch more, so its counts per message run low when the proxy cannot keep
/// the offered rate (the table says the rate it carried). perf counts in the
/// kernel without stopping anyone.
pub(super) async fn strace_run(
    rig: &Rig,
    spec: &Arc<Spec>,
    args: &BenchArgs,
    window: Duration,
    summary: &mut Summary,
) -> Result<(), String> {
    if !strace::available() {
        return Err("--strace: strace is not installed (apt-get install strace)".into());
    }
    let perf = strace::perf_available();
    if !perf {
        eprintln!("perf not usable (linux-perf, perf_event_paranoid): strace counts only");
    }
    let rate = args.strace_rate;
    let r = format!("{rate:.0}");
    let mut counted: Vec<(Target, &str, LoadReport, strace::Counts)> = Vec::new();
    for target in rig.targets().into_iter().filter(|t| *t != Target::Direct) {
        let Some((addr, Some(pid))) = rig.addr_pid(target) else {
            continue;
        };
        for tool in ["perf", "strace"]
            .into_iter()
            .filter(|t| perf || *t == "strace")
        {
            let cfg = load_config(addr, args, window, Some(rate));
            eprintln!("{tool} on {} at {r} req/s ...", target.label());
            let load = || load::run(spec.clone(), cfg, Arc::new(LoadCounters::default()));
            let (report, counts) = if tool == "perf" {
                let counter = strace::PerfCounter::attach(pid, target.key()).await?;
                let report = load().await;
                (report, counter.finish().await?)
            } else {
                let tracer = strace::Tracer::attach(pid, target.key()).await?;
                let report = load().await;
                (report, tracer.finish().await?)
            };
            counted.push((target, tool, report?, counts));
        }
    }
    print_syscalls(&counted, window, &r);
    for (t, tool, rep, c) in &counted {
        let key = if *tool == "perf" {
            "syscalls_per_msg_perf"
        } else {
            "syscalls_per_msg_strace"
        };
        summary.lines.push((
            format!("{key}.{}@{r}", t.key()),
            format!("{:.2}", per_msg(c.total(), rep)),
        ));
    }
    Ok(())
}

/// Time inside each proxy at each of `--dwell-rate`: one open-loop row per
/// proxy per repetition (interleaved) with tcpdump on the loopback, each
/// message's legs matched by F11 ([`dwell`]). tcpdump runs on the load side's
/// CPUs, as this process does.
pub(super) async fn dwell_run(
    rig: &Rig,
    spec: &Arc<Spec>,
    args: &BenchArgs,
    window: Duration,
    summary: &mut Summary,
) -> Result<(), String> {
    if !dwell::available() {
        return Err("--dwell: tcpdump is not installed (apt-get install tcpdump)".into());
    }
    for &rate in &args.dwell_rate {
        dwell_at(rig, spec, args, window, rate, summary).await?;
    }
    Ok(())
}

async fn dwell_at(
    rig: &Rig,
    spec: &Arc<Spec>,
    args: &BenchArgs,
    window: Duration,
    rate: f64,
    summary: &mut Summary,
) -> Result<(), String> {
    let r = format!("{rate:.0}");
    let proxies: Vec<Target> = rig
        .targets()
        .into_iter()
        .filter(|t| matches!(t, Target::Haproxy | Target::Switch))
        .collect();
    let mut timed: Vec<(Target, usize, LoadReport, dwell::Dwell, Option<u64>)> = Vec::new();
    for rep in 0..args.repeat.max(1) {
        for &target in &proxies {
            let Some((front, _)) = rig.addr_pid(target) else {
                continue;
            };
            let mut ports = vec![front.port()];
            ports.extend(rig.nodes.iter().map(SocketAddr::port));
            let cfg = load_config(front, args, window, Some(rate));
            eprintln!("tcpdump on {} at {r} req/s ...", target.label());
            let dump = dwell::Tcpdump::start(&ports, target.key()).await?;
            let report = load::run(spec.clone(), cfg, Arc::new(LoadCounters::default())).await?;
            let (packets, dropped) = dump.finish().await?;
            let d = dwell::Dwell::measure(spec, &packets, front, &rig.nodes);
            if d.problems > 0 {
                eprintln!(
                    "  {} direction(s) of the capture stop early (bytes not captured, or a frame cut): their later messages are not timed",
                    d.problems
                );
            }
            timed.push((target, rep, report, d, dropped));
        }
    }
    print_dwell(&timed, window, &r);
    let reps = args.repeat.max(1);
    let per_rep = |t: Target, q: f64| {
        (0..reps)
            .map(|i| {
                timed
                    .iter()
                    .find(|(tt, rep, ..)| *tt == t && *rep == i)
                    .and_then(|(.., d, _)| dwell::quantile(&d.both, q))
                    .map(|us| us as f64)
            })
            .collect::<Vec<_>>()
    };
    for t in &proxies {
        for (q, name) in [(0.5, "p50"), (0.99, "p99"), (0.999, "p99_9")] {
            summary.add(
                &format!("dwell_{name}_us.{}@{r}", t.key()),
                &per_rep(*t, q),
                0,
            );
        }
    }
    let ratio = div(
        &per_rep(Target::Switch, 0.99),
        &per_rep(Target::Haproxy, 0.99),
    );
    summary.add(
        &format!("ratio.dwell_p99_switch_over_haproxy@{r}"),
        &ratio,
        2,
    );
    println!();
    for (what, key, goal) in [
        (
            format!(
                "switch-added p99 on the wire at {r} req/s (time inside the switch, both legs)"
            ),
            format!("dwell_p99_us.switch@{r}"),
            " µs",
        ),
        (
            format!("HAProxy-added p99 on the wire at {r} req/s"),
            format!("dwell_p99_us.haproxy@{r}"),
            " µs",
        ),
        (
            format!("switch ÷ HAProxy, p99 inside the proxy at {r} req/s"),
            format!("ratio.dwell_p99_switch_over_haproxy@{r}"),
            "",
        ),
    ] {
        if let Some(v) = summary.spread(&key) {
            println!("- {what}: **{v}**{goal}");
        }
    }
    Ok(())
}
