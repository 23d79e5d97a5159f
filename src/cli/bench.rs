//! `isoswitch bench`: one run, same machine, same workload, measuring in turn
//! (a) the load generator straight to one node, (a2) straight to every node,
//! its clients spread over them in turn (the cluster without a balancer),
//! (b) HAProxy in TCP mode round robin over the nodes (when `haproxy` is on
//! the PATH), (c) isoswitch balancing per message over the same nodes as
//! shipped, its journal on, and (cj) the same switch with its journal off
//! (the routing core), so that HAProxy is compared both ways; with
//! `--integrity-off`, also (c0) a switch whose integrity books are off, for
//! what they cost when nothing is late. Every switch row says whether its
//! journal is on.
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

mod clients;
mod clients_plot;
mod dwell;
mod goals;
mod paper;
mod paper_plot;
pub(crate) mod procs;
mod report;
mod runs;
mod strace;
#[cfg(test)]
mod tests;

use report::*;
use runs::*;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::iso8583::Spec;
use crate::iso8583::SpecFiles;
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
    /// Leave out (cj), the switch with its journal off (the routing core
    /// compared with HAProxy): only the switch as shipped, journal on.
    #[arg(long)]
    pub no_journal_off: bool,
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
    /// Offered rates of the `--dwell` runs, requests/s, comma-separated
    /// (the goals judge the time inside at 10k and 30k).
    #[arg(long, value_delimiter = ',', default_values_t = [10_000.0, 30_000.0], value_parser = parse_rate)]
    pub dwell_rate: Vec<f64>,
    /// `throughput` (the rows above); `paper`: the bank paper's Table 1
    /// (OneConnect) and Table 2 (MBLB) for isoswitch, HAProxy and direct to a
    /// node, `--duration` per row (the paper ran 5m); `clients`: the
    /// many-terminals curve, `--clients-rate` from each of `--client-counts`
    /// connections (one request in flight each) through HAProxy and the
    /// switch, `--duration` measured per row.
    #[arg(long, default_value = "throughput", value_parser = ["throughput", "paper", "clients"])]
    pub scenario: String,
    /// Client connections of `--scenario clients`, comma-separated. A count
    /// a proxy cannot hold under the open-file limit is skipped for it.
    #[arg(long, value_delimiter = ',', default_values_t = [50usize, 1_000, 8_000, 10_000])]
    pub client_counts: Vec<usize>,
    /// Total offered rate of `--scenario clients`, requests/s.
    #[arg(long, default_value_t = 10_000.0, value_parser = parse_rate)]
    pub clients_rate: f64,
    /// Where `--scenario clients` writes its plot (SVG).
    #[arg(long, default_value = "target/bench-clients.svg")]
    pub clients_plot: String,
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
    /// The switch as shipped: its journal on.
    Switch,
    /// The switch with its journal off (`[journal] enabled = false`): the
    /// routing core.
    SwitchJournalOff,
    /// The switch with its integrity books off (`--integrity-off`), its
    /// journal on.
    SwitchIntegrityOff,
}

impl Target {
    fn label(self) -> &'static str {
        match self {
            Target::Direct => "(a) direct to one node",
            Target::DirectAll => "(a2) direct, clients spread over the nodes",
            Target::Haproxy => "(b) haproxy tcp roundrobin",
            Target::Switch => "(c) isoswitch per message, journal on",
            Target::SwitchJournalOff => "(cj) isoswitch per message, journal off",
            Target::SwitchIntegrityOff => "(c0) isoswitch, integrity off, journal on",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::DirectAll => "direct_all",
            Target::Haproxy => "haproxy",
            Target::Switch => "switch",
            Target::SwitchJournalOff => "switch_journal_off",
            Target::SwitchIntegrityOff => "switch_integrity_off",
        }
    }
}

const ALL_TARGETS: [Target; 6] = [
    Target::Direct,
    Target::DirectAll,
    Target::Haproxy,
    Target::Switch,
    Target::SwitchJournalOff,
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
    switch_journal_off: Option<(Proc, SocketAddr)>,
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
            Target::SwitchJournalOff => self
                .switch_journal_off
                .as_ref()
                .map(|(p, a)| (*a, Some(p.pid()))),
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
        if self.switch_journal_off.is_some() {
            t.push(Target::SwitchJournalOff);
        }
        if self.switch_integrity_off.is_some() {
            t.push(Target::SwitchIntegrityOff);
        }
        t
    }
}

/// The rows of repetition `rep`, in order: the switches ((c), (cj), (c0))
/// take turns going first, their order reversed every other repetition,
/// so that none always runs right after another. Their ratios are a few
/// percent, and on a shared machine a row's place in the sequence can move
/// its CPU per message by about that much (BENCHMARKS.md, "Integrity
/// cost").
fn take_turns(mut targets: Vec<Target>, rep: usize) -> Vec<Target> {
    let switches = |t: &Target| {
        matches!(
            t,
            Target::Switch | Target::SwitchJournalOff | Target::SwitchIntegrityOff
        )
    };
    if rep % 2 == 1 {
        let slots: Vec<usize> = (0..targets.len())
            .filter(|&i| switches(&targets[i]))
            .collect();
        let reversed: Vec<Target> = slots.iter().rev().map(|&i| targets[i]).collect();
        for (&slot, t) in slots.iter().zip(reversed) {
            targets[slot] = t;
        }
    }
    targets
}

async fn bench(args: &BenchArgs, pinning: Option<Pinning>) -> Result<(), String> {
    if args.scenario == "paper" {
        return paper::run(args).await;
    }
    if args.scenario == "clients" {
        return clients::run(args, pinning).await;
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
    goals::print(&summary.lines);
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
    let (node_procs, nodes) = start_nodes(args, load_cpus).await?;
    let start_switch = |integrity_off, journal_off| {
        procs::start_switch(
            &args.spec,
            &nodes,
            Some(proxy_threads),
            proxy_cpus,
            integrity_off,
            journal_off,
            None,
        )
    };
    let switch = start_switch(false, false)?;
    wait_listening(switch.1).await?;
    let switch_journal_off = if args.no_journal_off {
        None
    } else {
        let off = start_switch(false, true)?;
        wait_listening(off.1).await?;
        Some(off)
    };
    let switch_integrity_off = if args.integrity_off {
        let off = start_switch(true, false)?;
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
        let (mut p, front) = procs::start_haproxy(
            &nodes,
            Some(proxy_threads),
            proxy_cpus,
            procs::HAPROXY_MAXCONN,
        )?;
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
        switch_journal_off,
        switch_integrity_off,
        haproxy,
    })
}

fn haproxy_installed() -> bool {
    procs::answers("haproxy", &["-v"])
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

/// Waits until something accepts on `addr`, then gives the switch time to
/// open its node connections.
pub(super) async fn wait_listening(addr: SocketAddr) -> Result<(), String> {
    wait_accepting(addr).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}

/// `args.nodes` (at least one) `sim node` processes with IDs 01, 02, ...,
/// on `cpus`, each accepting before this returns.
async fn start_nodes(
    args: &BenchArgs,
    cpus: Option<&procs::CpuSet>,
) -> Result<(Vec<procs::Proc>, Vec<SocketAddr>), String> {
    let mut node_procs = Vec::new();
    let mut nodes = Vec::new();
    for i in 0..args.nodes.max(1) {
        let (p, addr) = procs::start_node(&args.spec, &format!("{:02}", i + 1), cpus)?;
        node_procs.push(p);
        nodes.push(addr);
    }
    for &n in &nodes {
        wait_accepting(n).await?;
    }
    Ok((node_procs, nodes))
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
        let (proc, front) = procs::start_haproxy(nodes, None, None, procs::HAPROXY_MAXCONN)?;
        Ok(Haproxy { proc, front })
    }
}
