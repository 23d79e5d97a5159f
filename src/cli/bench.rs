//! `isoswitch bench`: one run, same machine, same workload, measuring in turn
//! (a) the load generator straight to one node, (a2) straight to every node,
//! its clients spread over them in turn (the cluster without a balancer),
//! (b) HAProxy in TCP mode round robin over the nodes (when `haproxy` is on
//! the PATH) and (c) isoswitch balancing per message over the same nodes;
//! with `--integrity-off`, also (c0) a second switch whose integrity books
//! are off, for what they cost when nothing is late.
//!
//! Every party but the load generator is a process of its own: the nodes
//! (`isoswitch sim node`), the switch (`isoswitch run`) and HAProxy. Where
//! `taskset` and two CPUs or more are available, the proxy under test (switch
//! or HAProxy, both with the same thread count) runs on CPUs of its own and
//! the load side (this process and the nodes) on the others, so that neither
//! proxy shares a core with the traffic it is measured on.
//!
//! Rows: a saturation run (closed loop, every client's window full) and, at
//! each offered rate, an open-loop run whose latency is corrected for
//! coordinated omission ([`crate::sim::load`]). Throughput counts approved
//! answers (F39 `00`) only; declines and errors have their own columns. The
//! proxies' CPU per message comes from `/proc/PID/stat` over each row.
//! `--strace` adds system calls per message under load, `--dwell` the time
//! each message spends inside each proxy, read off the wire.

mod dwell;
mod paper;
mod paper_plot;
pub(crate) mod procs;
mod strace;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::iso8583::Spec;
use crate::sim::load::{self, LoadConfig, LoadCounters, LoadReport, Mix};

use procs::{CpuSet, Pinning, Proc};
pub(super) use procs::{SwitchFiles, free_port};

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[arg(long, default_value = "cups")]
    pub spec: String,
    /// Node simulators, each in its own process.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    #[arg(long, default_value_t = 50)]
    pub clients: usize,
    #[arg(long, default_value_t = 4)]
    pub in_flight: usize,
    /// `paper` (80% 200-300 bytes, 20% 1,200-1,400) or a size in bytes.
    #[arg(long, default_value = "paper")]
    pub mix: Mix,
    /// Length of each measurement (row).
    #[arg(long, default_value = "10s", value_parser = crate::util::duration::parse)]
    pub duration: Duration,
    /// Offered rates of the open-loop rows, requests/s, comma-separated.
    #[arg(long = "rate", value_delimiter = ',', default_values_t = [10_000.0, 30_000.0], value_parser = parse_rate)]
    pub rates: Vec<f64>,
    /// Leave out the saturation rows (closed loop, as fast as answered).
    #[arg(long)]
    pub no_saturation: bool,
    /// Skip HAProxy even if it is installed.
    #[arg(long)]
    pub no_haproxy: bool,
    /// Also measure (c0): a second switch with `[service.integrity]` off
    /// (no repeat book, no late book, late approvals logged), for the CPU
    /// the integrity books cost when nothing is late.
    #[arg(long)]
    pub integrity_off: bool,
    /// Measure every row this many times, interleaved (a, b, c, a, b, c...),
    /// and report the median and range: on a shared machine one run is not a
    /// number.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Worker threads of the switch, and HAProxy's `nbthread` (default: the
    /// number of proxy CPUs when pinned, else the CPUs available).
    #[arg(long)]
    pub switch_threads: Option<usize>,
    /// Worker threads of this process, the load generator (default: one per
    /// CPU it may run on).
    #[arg(long)]
    pub threads: Option<usize>,
    /// CPUs of the proxy under test, a `taskset -c` list (`1`, `2-3`).
    /// Default: the upper half of the CPUs this process may use.
    #[arg(long)]
    pub proxy_cpus: Option<String>,
    /// CPUs of the load generator and the nodes. Default: the CPUs not given
    /// to the proxy.
    #[arg(long)]
    pub load_cpus: Option<String>,
    /// Pin nothing: every process may run on every CPU.
    #[arg(long)]
    pub no_pin: bool,
    /// Also count the proxies' system calls per message: `strace -c -f -p`
    /// for this long (default 10s) at `--strace-rate`.
    #[arg(long, num_args = 0..=1, default_missing_value = "10s", value_parser = crate::util::duration::parse)]
    pub strace: Option<Duration>,
    /// Offered rate of the `--strace` run, requests/s.
    #[arg(long, default_value_t = 10_000.0, value_parser = parse_rate)]
    pub strace_rate: f64,
    /// Also time each message inside each proxy, on the wire: tcpdump on the
    /// loopback for this long (default 3s) at `--dwell-rate`, every message's
    /// legs in and out of the proxy matched by F11.
    #[arg(long, num_args = 0..=1, default_missing_value = "3s", value_parser = crate::util::duration::parse)]
    pub dwell: Option<Duration>,
    /// Offered rate of the `--dwell` run, requests/s.
    #[arg(long, default_value_t = 10_000.0, value_parser = parse_rate)]
    pub dwell_rate: f64,
    /// `throughput` (the rows above) or `paper`: the bank paper's Table 1
    /// (OneConnect) and Table 2 (MBLB) for isoswitch, HAProxy and direct to a
    /// node, `--duration` per row (the paper ran 5m).
    #[arg(long, default_value = "throughput", value_parser = ["throughput", "paper"])]
    pub scenario: String,
    /// Where `--scenario paper` writes its plots (SVG).
    #[arg(long, default_value = "target/paper")]
    pub plot_dir: String,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!(
            "`{s}`: use a positive number of requests per second"
        )),
    }
}

pub fn run(args: &BenchArgs) -> ExitCode {
    let pinning = if args.scenario == "paper" {
        None
    } else {
        match plan_pinning(args) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("isoswitch bench: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
    // Before the runtime starts: its threads inherit the affinity.
    if let Some(Err(e)) = pinning.as_ref().map(|p| procs::pin_self(&p.load)) {
        eprintln!("isoswitch bench: {e}");
        return ExitCode::FAILURE;
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.threads {
        builder.worker_threads(n.max(1));
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("isoswitch bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(bench(args, pinning)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("isoswitch bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn plan_pinning(args: &BenchArgs) -> Result<Option<Pinning>, String> {
    if args.no_pin {
        return Ok(None);
    }
    if !procs::taskset_available() {
        eprintln!("taskset not found (util-linux): nothing is pinned");
        return Ok(None);
    }
    let Some(allowed) = CpuSet::allowed() else {
        eprintln!("cannot read Cpus_allowed_list: nothing is pinned");
        return Ok(None);
    };
    let p = Pinning::choose(
        &allowed,
        args.proxy_cpus.as_deref(),
        args.load_cpus.as_deref(),
    )?;
    if p.is_none() {
        eprintln!("one CPU: nothing to pin apart");
    }
    Ok(p)
}

/// Who answers the load generator in a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Direct,
    /// The clients spread over every node in turn: the same cluster as the
    /// proxies' rows, with no balancer between.
    DirectAll,
    Haproxy,
    Switch,
    /// The switch with its integrity books off (`--integrity-off`).
    SwitchIntegrityOff,
}

impl Target {
    fn label(self) -> &'static str {
        match self {
            Target::Direct => "(a) direct to one node",
            Target::DirectAll => "(a2) direct, clients spread over the nodes",
            Target::Haproxy => "(b) haproxy tcp roundrobin",
            Target::Switch => "(c) isoswitch per message",
            Target::SwitchIntegrityOff => "(c0) isoswitch, integrity off",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::DirectAll => "direct_all",
            Target::Haproxy => "haproxy",
            Target::Switch => "switch",
            Target::SwitchIntegrityOff => "switch_integrity_off",
        }
    }
}

const ALL_TARGETS: [Target; 5] = [
    Target::Direct,
    Target::DirectAll,
    Target::Haproxy,
    Target::Switch,
    Target::SwitchIntegrityOff,
];

/// CPU a proxy process spent over a row.
#[derive(Clone, Copy, Debug)]
struct Cpu {
    /// Per message: one request and its answer through the proxy.
    us_per_msg: f64,
    /// Of one core, over the row.
    percent: f64,
    /// Share of that CPU spent in user space (the rest is the kernel's:
    /// system calls, TCP, wake-ups).
    user_percent: f64,
    /// Context switches of the proxy's threads per message.
    switches_per_msg: f64,
}

/// One measured row.
struct Row {
    target: Target,
    /// Offered rate; `None` for saturation.
    rate: Option<f64>,
    repetition: usize,
    report: LoadReport,
    cpu: Option<Cpu>,
}

/// The processes under test and where to reach them. Fields drop in order:
/// the proxies go before the nodes, so that the switch does not log every
/// node link closing.
struct Rig {
    switch: (Proc, SocketAddr),
    switch_integrity_off: Option<(Proc, SocketAddr)>,
    haproxy: Option<(Proc, SocketAddr)>,
    _nodes: Vec<Proc>,
    nodes: Vec<SocketAddr>,
}

impl Rig {
    fn addr_pid(&self, t: Target) -> Option<(SocketAddr, Option<u32>)> {
        match t {
            Target::Direct | Target::DirectAll => Some((self.nodes[0], None)),
            Target::Switch => Some((self.switch.1, Some(self.switch.0.pid()))),
            Target::Haproxy => self.haproxy.as_ref().map(|(p, a)| (*a, Some(p.pid()))),
            Target::SwitchIntegrityOff => self
                .switch_integrity_off
                .as_ref()
                .map(|(p, a)| (*a, Some(p.pid()))),
        }
    }

    fn targets(&self) -> Vec<Target> {
        let mut t = vec![Target::Direct];
        if self.nodes.len() > 1 {
            t.push(Target::DirectAll);
        }
        if self.haproxy.is_some() {
            t.push(Target::Haproxy);
        }
        t.push(Target::Switch);
        if self.switch_integrity_off.is_some() {
            t.push(Target::SwitchIntegrityOff);
        }
        t
    }
}

/// The rows of repetition `rep`, in order: (c) and (c0) take turns going
/// first, so that neither always runs right after the other. Their ratio is
/// a goal of a few percent, and on a shared machine a row's place in the
/// sequence can move its CPU per message by about that much (BENCHMARKS.md,
/// "Integrity cost").
fn take_turns(mut targets: Vec<Target>, rep: usize) -> Vec<Target> {
    let on = targets.iter().position(|t| *t == Target::Switch);
    let off = targets
        .iter()
        .position(|t| *t == Target::SwitchIntegrityOff);
    if let (Some(on), Some(off)) = (on, off)
        && rep % 2 == 1
    {
        targets.swap(on, off);
    }
    targets
}

async fn bench(args: &BenchArgs, pinning: Option<Pinning>) -> Result<(), String> {
    if args.scenario == "paper" {
        return paper::run(args).await;
    }
    let spec = Arc::new(Spec::resolve(&args.spec).map_err(|e| e.to_string())?);
    let proxy_threads = args
        .switch_threads
        .or(pinning.as_ref().map(|p| p.proxy.len()))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let load_average_start = procs::load_average();
    let rig = start_rig(args, pinning.as_ref(), proxy_threads).await?;
    print_header(
        args,
        pinning.as_ref(),
        proxy_threads,
        &rig,
        &load_average_start,
    );

    let mut rows = Vec::new();
    for rep in 0..args.repeat.max(1) {
        let rates = std::iter::once(None)
            .filter(|_| !args.no_saturation)
            .chain(args.rates.iter().map(|r| Some(*r)));
        for rate in rates {
            for target in take_turns(rig.targets(), rep) {
                rows.push(measure(&rig, target, rate, rep, &spec, args).await?);
            }
        }
    }
    if !args.no_saturation {
        println!(
            "\n## Saturation (closed loop: {} clients x {} in flight, as fast as answered)\n",
            args.clients, args.in_flight
        );
        print_table(rows.iter().filter(|r| r.rate.is_none()), args.repeat > 1);
    }
    for &rate in &args.rates {
        println!(
            "\n## Open loop at {rate:.0} req/s offered (latency corrected for coordinated omission)\n"
        );
        print_table(
            rows.iter().filter(|r| r.rate == Some(rate)),
            args.repeat > 1,
        );
    }
    let mut summary = Summary::from_rows(&rows, args);
    print_ratios(&summary, args);
    if let Some(window) = args.strace {
        strace_run(&rig, &spec, args, window, &mut summary).await?;
    }
    if let Some(window) = args.dwell {
        dwell_run(&rig, &spec, args, window, &mut summary).await?;
    }
    println!("\n## Summary (medians; docs/capacity.md reads these lines)\n");
    println!("```");
    for (k, v) in &summary.lines {
        println!("{k} = {v}");
    }
    println!("```");
    println!(
        "\nload average at the end: {} (at the start: {load_average_start})",
        procs::load_average()
    );
    Ok(())
}

async fn start_rig(
    args: &BenchArgs,
    pinning: Option<&Pinning>,
    proxy_threads: usize,
) -> Result<Rig, String> {
    let load_cpus = pinning.map(|p| &p.load);
    let proxy_cpus = pinning.map(|p| &p.proxy);
    let mut node_procs = Vec::new();
    let mut nodes = Vec::new();
    for i in 0..args.nodes.max(1) {
        let (p, addr) = procs::start_node(&args.spec, &format!("{:02}", i + 1), load_cpus)?;
        node_procs.push(p);
        nodes.push(addr);
    }
    for &n in &nodes {
        wait_accepting(n).await?;
    }
    let start_switch = |integrity_off| {
        procs::start_switch(
            &args.spec,
            &nodes,
            Some(proxy_threads),
            proxy_cpus,
            integrity_off,
        )
    };
    let switch = start_switch(false)?;
    wait_listening(switch.1).await?;
    let switch_integrity_off = if args.integrity_off {
        let off = start_switch(true)?;
        wait_listening(off.1).await?;
        Some(off)
    } else {
        None
    };
    let haproxy = if args.no_haproxy {
        None
    } else if !haproxy_installed() {
        eprintln!("haproxy not found on PATH: row (b) skipped (scripts/bench.sh installs it)");
        None
    } else {
        let (mut p, front) = procs::start_haproxy(&nodes, Some(proxy_threads), proxy_cpus)?;
        match wait_listening(front).await {
            Ok(()) if p.exited().is_none() => Some((p, front)),
            Ok(()) => {
                eprintln!("haproxy exited at start: row (b) skipped");
                None
            }
            Err(e) => {
                eprintln!("haproxy did not start ({e}): row (b) skipped");
                None
            }
        }
    };
    Ok(Rig {
        _nodes: node_procs,
        nodes,
        switch,
        switch_integrity_off,
        haproxy,
    })
}

fn haproxy_installed() -> bool {
    procs::answers("haproxy", &["-v"])
}

fn print_header(
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
    if rig.switch_integrity_off.is_some() {
        println!(
            "- (c0): a second switch, same config and threads, with `[service.integrity]` late_approval = \"log\", late_window = \"0s\", repeat_window = \"0s\" (its SQLite store opens in its data directory all the same)"
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

/// The bench's workload (`--clients`, `--in-flight`, `--mix`) against `addr`
/// for `duration`, at `rate` (open loop) or as fast as answered (`None`).
fn load_config(
    addr: SocketAddr,
    args: &BenchArgs,
    duration: Duration,
    rate: Option<f64>,
) -> LoadConfig {
    let mut cfg = LoadConfig::new(addr);
    cfg.clients = args.clients;
    cfg.in_flight = args.in_flight;
    cfg.mix = args.mix;
    cfg.duration = duration;
    cfg.rate = rate;
    cfg
}

async fn measure(
    rig: &Rig,
    target: Target,
    rate: Option<f64>,
    repetition: usize,
    spec: &Arc<Spec>,
    args: &BenchArgs,
) -> Result<Row, String> {
    let Some((addr, pid)) = rig.addr_pid(target) else {
        return Err(format!("no {} in this run", target.key()));
    };
    let mut cfg = load_config(addr, args, args.duration, rate);
    if target == Target::DirectAll {
        cfg.spread = rig.nodes.iter().skip(1).copied().collect();
    }
    eprintln!(
        "measuring {} at {} ...",
        target.label(),
        rate.map_or("saturation".into(), |r| format!("{r:.0} req/s"))
    );
    let before = pid.and_then(procs::usage);
    let report = load::run(spec.clone(), cfg, Arc::new(LoadCounters::default())).await?;
    let after = pid.and_then(procs::usage);
    let cpu = match (before, after) {
        (Some(b), Some(a)) => Some(cpu_use(
            b.until(a),
            report.answered + report.declined,
            report.elapsed,
        )),
        _ => None,
    };
    Ok(Row {
        target,
        rate,
        repetition,
        report,
        cpu,
    })
}

fn cpu_use(spent: procs::Usage, messages: u64, elapsed: Duration) -> Cpu {
    let ticks = spent.user + spent.system;
    let seconds = ticks as f64 / procs::TICKS_PER_S;
    let messages = messages.max(1) as f64;
    Cpu {
        us_per_msg: seconds * 1e6 / messages,
        percent: seconds * 100.0 / elapsed.as_secs_f64().max(1e-9),
        user_percent: spent.user as f64 * 100.0 / ticks.max(1) as f64,
        switches_per_msg: spent.switches as f64 / messages,
    }
}

fn print_table<'r>(rows: impl Iterator<Item = &'r Row>, numbered: bool) {
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
struct Summary {
    lines: Vec<(String, String)>,
    spreads: Vec<(String, String)>,
}

impl Summary {
    fn from_rows(rows: &[Row], args: &BenchArgs) -> Summary {
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
            for t in [Target::Haproxy, Target::Switch, Target::SwitchIntegrityOff] {
                s.add(
                    &format!("cpu_us_per_msg.{}@saturation", t.key()),
                    &per_rep(t, None, &cpu),
                    1,
                );
            }
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
            for t in [Target::Haproxy, Target::Switch] {
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
        s
    }

    /// Adds a figure when every repetition has it.
    fn add(&mut self, key: &str, values: &[Option<f64>], decimals: usize) {
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

    fn spread(&self, key: &str) -> Option<&str> {
        self.spreads
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn div(a: &[Option<f64>], b: &[Option<f64>]) -> Vec<Option<f64>> {
    a.iter()
        .zip(b)
        .map(|(a, b)| match (a, b) {
            (Some(a), Some(b)) if *b > 0.0 => Some(a / b),
            _ => None,
        })
        .collect()
}

fn sub(a: &[Option<f64>], b: &[Option<f64>]) -> Vec<Option<f64>> {
    a.iter().zip(b).map(|(a, b)| Some((*a)? - (*b)?)).collect()
}

fn print_ratios(s: &Summary, args: &BenchArgs) {
    println!("\n## Ratios (same run)\n");
    let line = |what: &str, key: &str, goal: &str| {
        if let Some(v) = s.spread(key) {
            println!("- {what}: **{v}**{goal}");
        }
    };
    for &rate in &args.rates {
        let r = format!("{rate:.0}");
        line(
            &format!("switch CPU/msg ÷ HAProxy CPU/msg at {r} req/s"),
            &format!("ratio.cpu_switch_over_haproxy@{r}"),
            " (goal ≤ 0.5)",
        );
        line(
            &format!("CPU µs/msg integrity on ÷ off at {r} req/s (switch (c) ÷ (c0))"),
            &format!("ratio.cpu_integrity_on_over_off@{r}"),
            " (goal ≤ 1.05)",
        );
    }
    line(
        "saturation, switch ÷ HAProxy (approved/s)",
        "ratio.saturation_switch_over_haproxy",
        " (goal ≥ 1.5)",
    );
    line(
        "saturation, switch ÷ direct to one node (approved/s)",
        "ratio.saturation_switch_over_direct",
        " (goal ≥ 0.8)",
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
            &format!("switch-added p99 at {r} req/s (switch p99 − direct p99)"),
            &format!("p99_added_us.switch@{r}"),
            if rate == 10_000.0 {
                " µs (goal ≤ 300 µs)"
            } else {
                " µs"
            },
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

/// System calls per message of each proxy at `--strace-rate`, counted over
/// one open-loop row each by `perf stat` on the kernel's syscall tracepoints
/// (when perf is installed) and by `strace -c -f -p`. strace stops the traced
/// process twice at every system call: it slows the proxy, whose writes then
/// batch more, so its counts per message run low when the proxy cannot keep
/// the offered rate (the table says the rate it carried). perf counts in the
/// kernel without stopping anyone.
async fn strace_run(
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

/// Time inside each proxy at `--dwell-rate`: one open-loop row per proxy per
/// repetition (interleaved) with tcpdump on the loopback, each message's legs
/// matched by F11 ([`dwell`]). tcpdump runs on the load side's CPUs, as this
/// process does.
async fn dwell_run(
    rig: &Rig,
    spec: &Arc<Spec>,
    args: &BenchArgs,
    window: Duration,
    summary: &mut Summary,
) -> Result<(), String> {
    if !dwell::available() {
        return Err("--dwell: tcpdump is not installed (apt-get install tcpdump)".into());
    }
    let rate = args.dwell_rate;
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
            " µs (goal ≤ 300 µs)",
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

fn print_dwell(
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

fn per_msg(n: u64, rep: &LoadReport) -> f64 {
    n as f64 / (rep.answered + rep.declined).max(1) as f64
}

fn print_syscalls(
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

/// Waits until something accepts on `addr`, then gives the switch time to
/// open its node connections.
pub(super) async fn wait_listening(addr: SocketAddr) -> Result<(), String> {
    wait_accepting(addr).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}

async fn wait_accepting(addr: SocketAddr) -> Result<(), String> {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err(format!("nothing listens on {addr}"))
}

/// HAProxy for `--scenario paper`: default thread count, not pinned.
pub(super) struct Haproxy {
    proc: Proc,
    pub(super) front: SocketAddr,
}

impl Haproxy {
    pub(super) fn pid(&self) -> u32 {
        self.proc.pid()
    }

    pub(super) fn start(nodes: &[SocketAddr]) -> Result<Haproxy, String> {
        let (proc, front) = procs::start_haproxy(nodes, None, None)?;
        Ok(Haproxy { proc, front })
    }
}

#[cfg(test)]
mod tests {
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
                Target::Haproxy | Target::Switch | Target::SwitchIntegrityOff
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
}
