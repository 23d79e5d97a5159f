//! `isoswitch bench --scenario clients`: the many-terminals curve. The same
//! total rate (`--clients-rate`, 10k req/s) from 50, 1,000, 8,000 and 10,000
//! client connections (`--client-counts`), one request in flight each,
//! through HAProxy (TCP mode, one server connection per client) and through
//! the switch (a few node links shared by every client), each pinned as the
//! throughput rows are.
//!
//! Every row gets a proxy process of its own, started for it and stopped
//! after it, so that one row's memory high-water mark does not carry into
//! the next. The CPU window starts a second after the last client connected
//! and ends half a second before the load stops: connecting and closing
//! thousands of clients is not per-message work. Memory and the node
//! connections are read at the end of that window, while every client is
//! still connected.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::procs::{self, Pinning, Proc};
use super::report::{Summary, div};
use super::{BenchArgs, dwell, wait_listening};
use crate::iso8583::{Spec, SpecFiles};
use crate::sim::load::{self, LoadConfig, LoadCounters, LoadReport};

/// The two proxies of the curve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Proxy {
    Haproxy,
    Switch,
}

impl Proxy {
    pub(super) fn key(self) -> &'static str {
        match self {
            Proxy::Haproxy => "haproxy",
            Proxy::Switch => "switch",
        }
    }
}

/// What one row measured.
#[derive(Clone, Debug, Default)]
pub(super) struct Measured {
    /// Over the CPU window.
    pub(super) cpu_us_per_msg: f64,
    pub(super) user_percent: f64,
    pub(super) window_msgs_per_s: f64,
    /// At the end of the window, kB.
    pub(super) rss_kb: u64,
    /// The process's high-water mark at the end of the window, kB.
    pub(super) hwm_kb: u64,
    /// Established connections to the nodes' ports at the end of the window.
    pub(super) node_connections: usize,
    pub(super) p50_us: u64,
    pub(super) p99_us: u64,
    /// Requests sent that got no answer (timeouts, connections lost, or
    /// never sent for a failed connect).
    pub(super) lost: u64,
    /// Answers that matched no request waiting on their connection: a
    /// doubled or crossed answer.
    pub(super) doubled: u64,
    /// Time inside the proxy on the wire (both legs), when `--dwell`.
    pub(super) dwell_p50_us: Option<u64>,
    pub(super) dwell_p99_us: Option<u64>,
}

/// One row: a proxy at a client count, in one repetition.
pub(super) struct CurveRow {
    pub(super) proxy: Proxy,
    pub(super) clients: usize,
    pub(super) repetition: usize,
    pub(super) result: Result<Measured, String>,
}

pub(super) async fn run(args: &BenchArgs, pinning: Option<Pinning>) -> Result<(), String> {
    let spec = Arc::new(Spec::resolve(&args.spec).map_err(|e| e.to_string())?);
    // Children inherit it: the nodes hold a connection per HAProxy client.
    let limit = crate::config::descriptors::raise_open_file_limit()
        .map_err(|e| format!("cannot raise the open-file limit: {e}"))?;
    let rate = args.clients_rate;
    let load_cpus = pinning.as_ref().map(|p| &p.load);
    let proxy_cpus = pinning.as_ref().map(|p| &p.proxy);
    let threads = args
        .switch_threads
        .or(pinning.as_ref().map(|p| p.proxy.len()))
        .unwrap_or(1)
        .max(1);
    let (node_procs, nodes) = super::start_nodes(args, load_cpus).await?;
    let haproxy = !args.no_haproxy && procs::answers("haproxy", &["-v"]);
    if !haproxy && !args.no_haproxy {
        eprintln!("haproxy not found on PATH: its rows are skipped (scripts/bench.sh installs it)");
    }
    print_header(args, pinning.as_ref(), threads, nodes.len(), limit, haproxy);
    let mut rows = Vec::new();
    for rep in 0..args.repeat.max(1) {
        for &n in &args.client_counts {
            let mut proxies = vec![Proxy::Switch];
            if haproxy {
                proxies.push(Proxy::Haproxy);
            }
            // Who goes first alternates, so neither always follows the other.
            if rep % 2 == 1 {
                proxies.reverse();
            }
            for proxy in proxies {
                let result = if let Some(why) = too_many_files(proxy, n, limit) {
                    Err(why)
                } else {
                    eprintln!(
                        "measuring {} with {n} clients at {rate:.0} req/s ...",
                        proxy.key()
                    );
                    let started = start_proxy(proxy, n, &args.spec, &nodes, threads, proxy_cpus);
                    match started.await {
                        Ok((p, front)) => measure(&p, front, &nodes, n, rate, &spec, args).await,
                        Err(e) => Err(e),
                    }
                };
                if let Err(e) = &result {
                    eprintln!("  {} with {n} clients: {e}", proxy.key());
                }
                rows.push(CurveRow {
                    proxy,
                    clients: n,
                    repetition: rep,
                    result,
                });
            }
        }
    }
    drop(node_procs);
    print_rows(&rows, rate);
    let summary = summarize(&rows, args, nodes.len());
    println!("\n## Summary (medians over the repetitions)\n");
    println!("```");
    for (k, v) in &summary.lines {
        println!("{k} = {v}");
    }
    println!("```");
    super::goals::print(&summary.lines);
    let plot = std::path::Path::new(&args.clients_plot);
    if let Some(dir) = plot.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    super::clients_plot::draw(plot, &curves(&rows))?;
    println!("\nplot: {}", plot.display());
    println!("\nload average at the end: {}", procs::load_average());
    Ok(())
}

fn print_header(
    args: &BenchArgs,
    pinning: Option<&Pinning>,
    threads: usize,
    nodes: usize,
    limit: u64,
    haproxy: bool,
) {
    println!("# isoswitch bench --scenario clients\n");
    println!(
        "- load: spec {}, {} req/s in total from each client count ({}), one request in flight per client (more only where too few clients could not carry the rate at 20 ms an answer: column `in flight`), mix {:?}, {} s measured per row, {} repetition(s)",
        args.spec,
        args.clients_rate,
        args.client_counts
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        args.mix,
        args.duration.as_secs_f64(),
        args.repeat.max(1)
    );
    println!(
        "- processes: {nodes} nodes (`isoswitch sim node`), the switch (`isoswitch run`, {threads} worker thread(s), 2 links per node){}; a fresh proxy process for every row",
        if haproxy {
            format!(", HAProxy (TCP mode, roundrobin, nbthread {threads})")
        } else {
            ", no HAProxy".into()
        }
    );
    match pinning {
        Some(p) => println!(
            "- CPUs (taskset): the proxy on {}, load generator and nodes on {}",
            p.proxy.list(),
            p.load.list()
        ),
        None => println!("- CPUs: nothing pinned"),
    }
    println!(
        "- open-file limit (raised to the hard limit, inherited by every process): {limit}; a row that would need more is skipped"
    );
    println!(
        "- CPU µs/msg: utime + stime (/proc/PID/stat) from 1 s after the last client connected to 0.5 s before the load stops, over the answers in that window; RSS and HWM (VmRSS, VmHWM) and node connections (ESTABLISHED to a node port in /proc/net/tcp) at the window's end; p50/p99 end to end at the load generator, of the requests sent in that window"
    );
}

/// Why `proxy` cannot hold `clients` under the open-file limit `limit`,
/// when it cannot. The load generator holds one descriptor per client and
/// so does the switch; HAProxy two ([`procs::haproxy_files`]), and refuses
/// to start when its maxconn asks for more than the limit.
pub(super) fn too_many_files(proxy: Proxy, clients: usize, limit: u64) -> Option<String> {
    let need = match proxy {
        Proxy::Switch => clients as u64 + 200,
        Proxy::Haproxy => procs::haproxy_files(haproxy_maxconn(clients)),
    };
    (need > limit)
        .then(|| format!("needs about {need} open files, over the limit of {limit}: skipped"))
}

fn haproxy_maxconn(clients: usize) -> usize {
    clients + 16
}

async fn start_proxy(
    proxy: Proxy,
    clients: usize,
    spec: &str,
    nodes: &[SocketAddr],
    threads: usize,
    cpus: Option<&procs::CpuSet>,
) -> Result<(Proc, SocketAddr), String> {
    let (mut p, front) = match proxy {
        Proxy::Switch => procs::start_switch(
            spec,
            nodes,
            Some(threads),
            cpus,
            false,
            false,
            Some(clients),
        )?,
        Proxy::Haproxy => {
            procs::start_haproxy(nodes, Some(threads), cpus, haproxy_maxconn(clients))?
        }
    };
    wait_listening(front).await?;
    if let Some(status) = p.exited() {
        return Err(format!("{} exited at start: {status}", proxy.key()));
    }
    Ok((p, front))
}

/// Time to connect every client before the window opens: the load
/// generator connects them one after the other, while the first ones
/// already send; on this 2-core machine under load, 8,000 took over 6 s.
fn setup_allowance(clients: usize) -> Duration {
    Duration::from_secs(3) + Duration::from_millis(2 * clients as u64)
}

/// Requests in flight per client: one, as a terminal has, unless that many
/// clients could not offer `rate` with answers taking 20 ms (a loaded
/// machine's p99): 50 clients at 10k req/s get 4 each, the throughput
/// rows' window, so that the few-clients row carries the rate it is
/// offered.
pub(super) fn in_flight(clients: usize, rate: f64) -> usize {
    let slots = (rate * 0.020 / clients.max(1) as f64).ceil();
    if slots.is_finite() && slots > 1.0 {
        slots as usize
    } else {
        1
    }
}

/// What a process had spent and the load had answered at one moment.
struct Mark {
    usage: procs::Usage,
    answers: u64,
    at: Instant,
}

impl Mark {
    fn take(pid: u32, counters: &LoadCounters) -> Result<Mark, String> {
        let usage = procs::usage(pid).ok_or("the proxy's /proc/PID/stat is gone")?;
        Ok(Mark {
            usage,
            answers: counters.answered.load(Ordering::Relaxed)
                + counters.declined.load(Ordering::Relaxed),
            at: Instant::now(),
        })
    }
}

async fn measure(
    proxy: &Proc,
    front: SocketAddr,
    nodes: &[SocketAddr],
    clients: usize,
    rate: f64,
    spec: &Arc<Spec>,
    args: &BenchArgs,
) -> Result<Measured, String> {
    let pid = proxy.pid();
    let counters = Arc::new(LoadCounters::default());
    counters.latency_paused.store(true, Ordering::Relaxed);
    let mut cfg = LoadConfig::new(front);
    cfg.clients = clients;
    cfg.in_flight = in_flight(clients, rate);
    cfg.mix = args.mix;
    cfg.rate = Some(rate);
    cfg.duration = args.duration + setup_allowance(clients);
    let ends_at = Instant::now() + cfg.duration;
    let load = tokio::spawn(load::run(spec.clone(), cfg, counters.clone()));
    while counters.connects.load(Ordering::Relaxed) < clients as u64 && !load.is_finished() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let window_end = ends_at.checked_sub(Duration::from_millis(500));
    let (start, end, rss_kb, hwm_kb, node_connections) = match window_end {
        Some(end_at) if end_at > Instant::now() && !load.is_finished() => {
            let start = Mark::take(pid, &counters)?;
            counters.latency_paused.store(false, Ordering::Relaxed);
            tokio::time::sleep_until(end_at.into()).await;
            let end = Mark::take(pid, &counters)?;
            counters.latency_paused.store(true, Ordering::Relaxed);
            let (rss, hwm) = memory_kb(pid).ok_or("no VmRSS in /proc/PID/status")?;
            (start, end, rss, hwm, node_connections(nodes))
        }
        _ => {
            let report = load.await.map_err(|e| e.to_string())?;
            return Err(format!(
                "the clients took longer to connect than allowed ({:?}): {}",
                setup_allowance(clients),
                report.map_or_else(|e| e, |r| r.to_string())
            ));
        }
    };
    let report = load.await.map_err(|e| e.to_string())??;
    let spent = start.usage.until(end.usage);
    let ticks = spent.user + spent.system;
    let answers = end.answers.saturating_sub(start.answers).max(1);
    let seconds = end.at.duration_since(start.at).as_secs_f64().max(1e-9);
    let mut m = Measured {
        cpu_us_per_msg: ticks as f64 / procs::TICKS_PER_S * 1e6 / answers as f64,
        user_percent: spent.user as f64 * 100.0 / ticks.max(1) as f64,
        window_msgs_per_s: answers as f64 / seconds,
        rss_kb,
        hwm_kb,
        node_connections,
        p50_us: report.percentile_us(0.5),
        p99_us: report.percentile_us(0.99),
        lost: lost(&report),
        doubled: report.mismatches,
        ..Measured::default()
    };
    if let Some(window) = args.dwell {
        dwell(&mut m, front, nodes, clients, rate, window, spec, args).await?;
    }
    Ok(m)
}

/// Requests without an answer: sent and never answered, or never sent
/// because a connection failed or was lost.
pub(super) fn lost(r: &LoadReport) -> u64 {
    r.requests.saturating_sub(r.answered + r.declined) + r.connect_failures + r.connections_lost
}

/// A second, shorter load at the same rate and client count with tcpdump
/// on the loopback: the time inside the proxy, both legs ([`dwell`]). Run
/// apart from the CPU window: tcpdump's copies are charged to the proxy's
/// CPU as it sends.
#[allow(clippy::too_many_arguments)]
async fn dwell(
    m: &mut Measured,
    front: SocketAddr,
    nodes: &[SocketAddr],
    clients: usize,
    rate: f64,
    window: Duration,
    spec: &Arc<Spec>,
    args: &BenchArgs,
) -> Result<(), String> {
    if !dwell::available() {
        return Err("--dwell: tcpdump is not installed (apt-get install tcpdump)".into());
    }
    let mut ports = vec![front.port()];
    ports.extend(nodes.iter().map(SocketAddr::port));
    let mut cfg = LoadConfig::new(front);
    cfg.clients = clients;
    cfg.in_flight = in_flight(clients, rate);
    cfg.mix = args.mix;
    cfg.rate = Some(rate);
    cfg.duration = window + setup_allowance(clients);
    let dump = dwell::Tcpdump::start(&ports, "clients").await?;
    let report = load::run(spec.clone(), cfg, Arc::new(LoadCounters::default())).await;
    let (packets, _) = dump.finish().await?;
    report?;
    let d = dwell::Dwell::measure(spec, &packets, front, nodes);
    m.dwell_p50_us = dwell::quantile(&d.both, 0.5);
    m.dwell_p99_us = dwell::quantile(&d.both, 0.99);
    Ok(())
}

/// VmRSS and VmHWM of `pid`, kB.
fn memory_kb(pid: u32) -> Option<(u64, u64)> {
    parse_memory_kb(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

pub(super) fn parse_memory_kb(status: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<u64>()
            .ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Connections established to any of `nodes`' ports, whoever opened them:
/// in this scenario only the proxy under test does.
fn node_connections(nodes: &[SocketAddr]) -> usize {
    let ports: HashSet<u16> = nodes.iter().map(SocketAddr::port).collect();
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|t| count_established_to(&t, &ports))
        .sum()
}

/// In a `/proc/net/tcp` table, the ESTABLISHED (state 01) sockets whose
/// local port is one of `ports`: the nodes' ends of their connections.
pub(super) fn count_established_to(table: &str, ports: &HashSet<u16>) -> usize {
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let mut f = line.split_whitespace();
            let local = f.nth(1);
            let state = f.nth(1);
            let port = local
                .and_then(|l| l.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            state == Some("01") && port.is_some_and(|p| ports.contains(&p))
        })
        .count()
}

fn print_rows(rows: &[CurveRow], rate: f64) {
    println!("\n## Many terminals: {rate:.0} req/s in total, one request in flight per client\n");
    println!(
        "| proxy | clients | in flight | # | msg/s in window | CPU µs/msg | user % | RSS MB | HWM MB | KB/client | node conns | p50 µs | p99 µs | inside p50 µs | inside p99 µs | lost | doubled |"
    );
    println!(
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in rows {
        let head = format!(
            "| {} | {} | {} | {} |",
            r.proxy.key(),
            r.clients,
            in_flight(r.clients, rate),
            r.repetition + 1
        );
        match &r.result {
            Ok(m) => {
                let opt = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
                println!(
                    "{head} {:.0} | {:.1} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} | {} |",
                    m.window_msgs_per_s,
                    m.cpu_us_per_msg,
                    m.user_percent,
                    m.rss_kb as f64 / 1024.0,
                    m.hwm_kb as f64 / 1024.0,
                    m.rss_kb as f64 / r.clients.max(1) as f64,
                    m.node_connections,
                    m.p50_us,
                    m.p99_us,
                    opt(m.dwell_p50_us),
                    opt(m.dwell_p99_us),
                    m.lost,
                    m.doubled
                );
            }
            Err(e) => println!("{head} {e} ||||||||||||||"),
        }
    }
}

/// The `clients.*` summary lines: per proxy and client count, the median
/// over the repetitions; and how many nodes there were, for the goal of
/// node connections per node.
pub(super) fn summarize(rows: &[CurveRow], args: &BenchArgs, nodes: usize) -> Summary {
    let mut s = Summary {
        lines: vec![("clients.nodes".into(), nodes.to_string())],
        spreads: Vec::new(),
    };
    let reps = args.repeat.max(1);
    let per_rep = |p: Proxy, n: usize, f: &dyn Fn(&Measured) -> f64| {
        (0..reps)
            .map(|i| {
                rows.iter()
                    .find(|r| r.proxy == p && r.clients == n && r.repetition == i)
                    .and_then(|r| r.result.as_ref().ok())
                    .map(f)
            })
            .collect::<Vec<_>>()
    };
    for &n in &args.client_counts {
        for p in [Proxy::Switch, Proxy::Haproxy] {
            let k = p.key();
            s.add(
                &format!("clients.cpu_us_per_msg.{k}@{n}"),
                &per_rep(p, n, &|m| m.cpu_us_per_msg),
                1,
            );
            s.add(
                &format!("clients.rss_mb.{k}@{n}"),
                &per_rep(p, n, &|m| m.rss_kb as f64 / 1024.0),
                1,
            );
            s.add(
                &format!("clients.hwm_mb.{k}@{n}"),
                &per_rep(p, n, &|m| m.hwm_kb as f64 / 1024.0),
                1,
            );
            s.add(
                &format!("clients.node_connections.{k}@{n}"),
                &per_rep(p, n, &|m| m.node_connections as f64),
                0,
            );
            s.add(
                &format!("clients.p50_us.{k}@{n}"),
                &per_rep(p, n, &|m| m.p50_us as f64),
                0,
            );
            s.add(
                &format!("clients.p99_us.{k}@{n}"),
                &per_rep(p, n, &|m| m.p99_us as f64),
                0,
            );
            for (name, q) in [("p50", 0), ("p99", 1)] {
                let v = per_rep(p, n, &|m| {
                    [m.dwell_p50_us, m.dwell_p99_us][q].map_or(f64::NAN, |v| v as f64)
                });
                if v.iter().all(|x| x.is_some_and(|x| !x.is_nan())) {
                    s.add(&format!("clients.dwell_{name}_us.{k}@{n}"), &v, 0);
                }
            }
            // Totals, not medians: one lost answer in any repetition counts.
            let ran: Vec<&Measured> = rows
                .iter()
                .filter(|r| r.proxy == p && r.clients == n)
                .filter_map(|r| r.result.as_ref().ok())
                .collect();
            if !ran.is_empty() {
                let lost: u64 = ran.iter().map(|m| m.lost).sum();
                let doubled: u64 = ran.iter().map(|m| m.doubled).sum();
                s.lines
                    .push((format!("clients.lost.{k}@{n}"), lost.to_string()));
                s.lines
                    .push((format!("clients.doubled.{k}@{n}"), doubled.to_string()));
            }
        }
        let sw = per_rep(Proxy::Switch, n, &|m| m.cpu_us_per_msg);
        let ha = per_rep(Proxy::Haproxy, n, &|m| m.cpu_us_per_msg);
        s.add(
            &format!("ratio.clients_cpu_switch_over_haproxy@{n}"),
            &div(&sw, &ha),
            2,
        );
        let sw = per_rep(Proxy::Switch, n, &|m| m.rss_kb as f64);
        let ha = per_rep(Proxy::Haproxy, n, &|m| m.rss_kb as f64);
        s.add(
            &format!("ratio.clients_rss_switch_over_haproxy@{n}"),
            &div(&sw, &ha),
            2,
        );
    }
    s
}

/// Per proxy, (clients, median CPU µs/msg, median RSS MB) for the plot.
fn curves(rows: &[CurveRow]) -> Vec<super::clients_plot::Curve> {
    [Proxy::Switch, Proxy::Haproxy]
        .into_iter()
        .map(|p| {
            let mut counts: Vec<usize> = rows
                .iter()
                .filter(|r| r.proxy == p && r.result.is_ok())
                .map(|r| r.clients)
                .collect();
            counts.sort_unstable();
            counts.dedup();
            let points = counts
                .into_iter()
                .map(|n| {
                    let of = |f: &dyn Fn(&Measured) -> f64| {
                        let mut v: Vec<f64> = rows
                            .iter()
                            .filter(|r| r.proxy == p && r.clients == n)
                            .filter_map(|r| r.result.as_ref().ok())
                            .map(f)
                            .collect();
                        v.sort_by(f64::total_cmp);
                        v.get(v.len() / 2).copied().unwrap_or(0.0)
                    };
                    (
                        n as f64,
                        of(&|m| m.cpu_us_per_msg),
                        of(&|m| m.rss_kb as f64 / 1024.0),
                    )
                })
                .collect();
            super::clients_plot::Curve {
                name: match p {
                    Proxy::Switch => "isoswitch".into(),
                    Proxy::Haproxy => "HAProxy (TCP mode)".into(),
                },
                points,
            }
        })
        .filter(|c| !c.points.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_established_connections_to_node_ports() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1\n\
   2: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1\n\
   3: 0100007F:1F91 0100007F:C351 06 00000000:00000000 00:00000000 00000000     0        0 0 3 0000000000000000\n\
   4: 0100007F:1F91 0100007F:C352 01 00000000:00000000 00:00000000 00000000     0        0 4 1 0000000000000000 20 4 30 10 -1\n";
        // 0x1F90 = 8080, 0x1F91 = 8081: listening (0A), the client's end
        // (local port 0xC350) and TIME_WAIT (06) do not count.
        let ports: HashSet<u16> = [8080, 8081].into();
        assert_eq!(count_established_to(table, &ports), 2);
        assert_eq!(count_established_to(table, &[9].into()), 0);
        assert_eq!(count_established_to("garbage\nmore garbage", &ports), 0);
    }

    #[test]
    fn reads_rss_and_high_water_mark() {
        let status = "Name:\tisoswitch\nVmHWM:\t  693248 kB\nVmRSS:\t  677000 kB\nThreads:\t3\n";
        assert_eq!(parse_memory_kb(status), Some((677_000, 693_248)));
        assert_eq!(parse_memory_kb("Name:\tx\n"), None);
    }

    #[test]
    fn haproxy_needs_two_files_a_client_and_is_skipped_past_the_limit() {
        assert!(too_many_files(Proxy::Haproxy, 8_000, 20_000).is_none());
        let why = too_many_files(Proxy::Haproxy, 10_000, 20_000).unwrap();
        assert!(why.contains("20000"), "{why}");
        assert!(too_many_files(Proxy::Switch, 10_000, 20_000).is_none());
        assert!(too_many_files(Proxy::Switch, 20_000, 20_000).is_some());
    }

    #[test]
    fn few_clients_get_a_window_that_can_carry_the_rate() {
        assert_eq!(in_flight(50, 10_000.0), 4);
        assert_eq!(in_flight(1_000, 10_000.0), 1);
        assert_eq!(in_flight(8_000, 10_000.0), 1);
        assert_eq!(in_flight(0, 10_000.0), 200);
        assert_eq!(in_flight(50, 30_000.0), 12);
    }

    #[test]
    fn lost_counts_unanswered_and_never_sent() {
        let mut r = LoadReport {
            requests: 100,
            answered: 90,
            declined: 8,
            timeouts: 2,
            mismatches: 1,
            connections_lost: 0,
            connects: 10,
            connect_failures: 3,
            elapsed: Duration::from_secs(1),
            latency_us: hdrhistogram::Histogram::new(3).unwrap(),
        };
        assert_eq!(lost(&r), 2 + 3);
        r.answered = 92;
        r.connect_failures = 0;
        assert_eq!(lost(&r), 0);
    }
}
