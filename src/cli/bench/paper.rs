//! `isoswitch bench --scenario paper`: the bank paper's two tables, for
//! isoswitch, HAProxy in TCP mode and the clients straight to a node.
//!
//! - **Table 1, OneConnect (ATMs):** 50 clients, each connect → 1 request →
//!   close, 3 s client timeout, nodes answering in 0–2 s and echoing no key
//!   field. isoswitch runs a `oneconnect` front.
//! - **Table 2, MBLB (POS):** 50 clients on long connections, 4 requests per
//!   round, same delay and timeout. isoswitch runs a (keyed) `listen` front.
//!
//! Every row gets three fresh nodes, so their counters (connections accepted,
//! held at the end, requests each) are that row's alone. The switch (or
//! HAProxy) runs in its own process; its CPU time comes from /proc.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::procs::{self, cpu_ticks};
use super::{BenchArgs, Haproxy, SwitchFiles, free_port, wait_listening};
use crate::iso8583::Spec;
use crate::iso8583::SpecFiles;
use crate::sim::load::{self, LoadConfig, LoadCounters, LoadReport, Mix};
use crate::sim::node::{Delay, NodeOptions, NodeSim, NodeSimConfig};

/// The paper's parameters; only the duration is scaled by `--duration`.
const CLIENTS: usize = 50;
const NODES: usize = 3;
const DELAY: &str = "0..2s";
const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);
const REQUESTS_PER_ROUND: usize = 4;
/// OneConnect pool: at most this many connections per node (3 × 20 = 60 for
/// 50 clients).
const ONECONNECT_PER_NODE: usize = 20;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Table {
    OneConnect,
    Mblb,
}

#[derive(Clone, Copy)]
enum Setup {
    Isoswitch,
    Haproxy,
    Direct,
}

impl Setup {
    fn name(self) -> &'static str {
        match self {
            Setup::Isoswitch => "isoswitch",
            Setup::Haproxy => "haproxy tcp",
            Setup::Direct => "direct to node 01",
        }
    }
}

/// One measured row of a table.
struct Row {
    setup: Setup,
    report: LoadReport,
    /// Requests each node received.
    per_node: Vec<u64>,
    accepted: Vec<u64>,
    /// Most connections each node held at once, and what it held at the end.
    peak: Vec<u64>,
    held: Vec<u64>,
    /// Switch CPU over the run, in percent of one core (None: no switch).
    cpu: Option<f64>,
}

pub async fn run(args: &BenchArgs) -> Result<(), String> {
    let spec_name = "cup-pos";
    let spec = Arc::new(Spec::resolve(spec_name).map_err(|e| e.to_string())?);
    let haproxy_ok = !args.no_haproxy && which("haproxy");
    if !haproxy_ok && !args.no_haproxy {
        eprintln!("haproxy not found on PATH: its rows are skipped (scripts/bench.sh installs it)");
    }
    println!(
        "# isoswitch bench --scenario paper: {CLIENTS} clients, {NODES} nodes answering in {DELAY}, client timeout {} s, {} s per row, spec {spec_name}",
        CLIENT_TIMEOUT.as_secs(),
        args.duration.as_secs_f64()
    );
    let plot_dir = std::path::PathBuf::from(&args.plot_dir);
    std::fs::create_dir_all(&plot_dir).map_err(|e| format!("{}: {e}", plot_dir.display()))?;
    for table in [Table::OneConnect, Table::Mblb] {
        let mut rows = Vec::new();
        for setup in [Setup::Isoswitch, Setup::Haproxy, Setup::Direct] {
            if matches!(setup, Setup::Haproxy) && !haproxy_ok {
                continue;
            }
            rows.push(measure(table, setup, &spec, spec_name, args).await?);
        }
        print_table(table, &rows);
        let stem = match table {
            Table::OneConnect => "paper-table1-oneconnect",
            Table::Mblb => "paper-table2-mblb",
        };
        let path = plot_dir.join(format!("{stem}.svg"));
        super::paper_plot::draw(&path, title(table), &rows_for_plot(&rows))?;
        println!("\nplot: {}", path.display());
    }
    Ok(())
}

fn title(table: Table) -> &'static str {
    match table {
        Table::OneConnect => {
            "Table 1, OneConnect: 50 ATMs, connect -> 1 request -> close, nodes 0-2 s, echo no key"
        }
        Table::Mblb => "Table 2, MBLB: 50 clients on long connections, 4 requests per round",
    }
}

fn rows_for_plot(rows: &[Row]) -> Vec<super::paper_plot::Series> {
    rows.iter()
        .map(|r| super::paper_plot::Series {
            name: r.setup.name().to_string(),
            per_node: r.per_node.clone(),
            latency_us: r.report.latency_us.clone(),
        })
        .collect()
}

async fn start_nodes(spec: &Arc<Spec>, no_key: bool) -> Result<Vec<NodeSim>, String> {
    let mut nodes = Vec::new();
    for i in 0..NODES {
        let mut cfg = NodeSimConfig::new(&format!("{:02}", i + 1));
        cfg.delay = Delay::parse(DELAY)?;
        let any: SocketAddr = "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?;
        let node = NodeSim::start_with(any, Arc::clone(spec), cfg, NodeOptions { no_key })
            .await
            .map_err(|e| e.to_string())?;
        nodes.push(node);
    }
    Ok(nodes)
}

async fn measure(
    table: Table,
    setup: Setup,
    spec: &Arc<Spec>,
    spec_name: &str,
    args: &BenchArgs,
) -> Result<Row, String> {
    // Table 1's nodes echo no key: only one request per node connection at a
    // time can serve them (isoswitch's oneconnect pool, or a proxy that
    // opens a node connection per client connection).
    let nodes = start_nodes(spec, table == Table::OneConnect).await?;
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    let (guard, target) = match setup {
        Setup::Direct => (Proc::None, addrs[0]),
        Setup::Haproxy => {
            let h = Haproxy::start(&addrs)?;
            let front = h.front;
            (Proc::Haproxy(h), front)
        }
        Setup::Isoswitch => {
            let (child, files, front) = start_switch(table, spec_name, &addrs, args)?;
            (
                Proc::Switch {
                    child,
                    _files: files,
                },
                front,
            )
        }
    };
    wait_listening(target).await?;
    // The switch's own node connections are its pool: all count. Through
    // HAProxy or straight to the node, wait_listening's probe made one that
    // no client did: count from after it.
    let base: Vec<u64> = if matches!(setup, Setup::Isoswitch) {
        vec![0; NODES]
    } else {
        tokio::time::sleep(Duration::from_millis(200)).await;
        nodes
            .iter()
            .map(|n| n.stats.connections.load(Ordering::Relaxed))
            .collect()
    };
    let base_requests: Vec<u64> = nodes
        .iter()
        .map(|n| n.stats.requests.load(Ordering::Relaxed))
        .collect();
    let mut cfg = LoadConfig::new(target);
    cfg.clients = CLIENTS;
    cfg.mix = Mix::Fixed(300);
    cfg.duration = args.duration;
    cfg.timeout = CLIENT_TIMEOUT;
    match table {
        Table::OneConnect => cfg.connection_per_request = true,
        Table::Mblb => cfg.requests_per_round = Some(REQUESTS_PER_ROUND),
    }
    eprintln!("measuring {} / {} ...", title(table), setup.name());
    let cpu_before = guard.pid().and_then(cpu_ticks);
    let started = Instant::now();
    let report = load::run(Arc::clone(spec), cfg, Arc::new(LoadCounters::default())).await?;
    let elapsed = started.elapsed();
    let cpu = match (cpu_before, guard.pid()) {
        (Some(before), Some(pid)) => cpu_ticks(pid).map(|after| {
            (after.saturating_sub(before)) as f64 / procs::TICKS_PER_S / elapsed.as_secs_f64()
                * 100.0
        }),
        _ => None,
    };
    let per_node = nodes
        .iter()
        .zip(&base_requests)
        .map(|(n, b)| n.stats.requests.load(Ordering::Relaxed).saturating_sub(*b))
        .collect();
    let accepted = nodes
        .iter()
        .zip(&base)
        .map(|(n, b)| {
            n.stats
                .connections
                .load(Ordering::Relaxed)
                .saturating_sub(*b)
        })
        .collect();
    // Let the clients' closes reach the nodes: what is held then is what
    // the proxy keeps open.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = nodes
        .iter()
        .map(|n| n.stats.held.load(Ordering::Relaxed))
        .collect();
    let peak = nodes
        .iter()
        .map(|n| n.stats.peak_held.load(Ordering::Relaxed))
        .collect();
    drop(guard);
    for n in nodes {
        n.stop().await;
    }
    Ok(Row {
        setup,
        report,
        per_node,
        accepted,
        peak,
        held,
        cpu,
    })
}

fn start_switch(
    table: Table,
    spec: &str,
    nodes: &[SocketAddr],
    args: &BenchArgs,
) -> Result<(Child, SwitchFiles, SocketAddr), String> {
    let front = free_port()?;
    let (mode, per_node) = match table {
        Table::OneConnect => ("oneconnect", ONECONNECT_PER_NODE),
        Table::Mblb => ("multiplex", 2),
    };
    // No active checks, as HAProxy's `server` lines here have none: the
    // node-side connection counts are then the traffic's alone.
    let mut toml = format!(
        "[[service]]\nname = \"paper\"\nspec = \"{spec}\"\n\
         [service.front]\nkind = \"listen\"\nlisten = \"{front}\"\nmode = \"{mode}\"\n\
         [service.back]\nconnections_per_node = {per_node}\n\
         [service.back.health]\ncheck = \"none\"\n\
         [service.timeouts]\nrequest = \"3s\"\n"
    );
    for (i, a) in nodes.iter().enumerate() {
        toml.push_str(&format!(
            "[[service.back.node]]\nid = \"{:02}\"\naddress = \"{a}\"\n",
            i + 1
        ));
    }
    let files = SwitchFiles::write("isoswitch-paper", &toml)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    files.run_args(&mut cmd);
    if let Some(n) = args.switch_threads {
        cmd.arg("--worker-threads").arg(n.to_string());
    }
    let child = cmd
        .env("ISOSWITCH_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the switch: {e}"))?;
    Ok((child, files, front))
}

/// The switch or proxy process of a row; killed when the row ends, however
/// it ends (HAProxy's own guard kills it).
enum Proc {
    None,
    Haproxy(Haproxy),
    /// The config file and data directory live as long as the switch.
    Switch {
        child: Child,
        _files: SwitchFiles,
    },
}

impl Proc {
    fn pid(&self) -> Option<u32> {
        match self {
            Proc::None => None,
            Proc::Haproxy(h) => Some(h.pid()),
            Proc::Switch { child, .. } => Some(child.id()),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Proc::Switch { child, .. } = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn which(tool: &str) -> bool {
    Command::new(tool)
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn share(per_node: &[u64]) -> String {
    let total: u64 = per_node.iter().sum();
    per_node
        .iter()
        .map(|&n| format!("{:.0}%", n as f64 * 100.0 / total.max(1) as f64))
        .collect::<Vec<_>>()
        .join(" / ")
}

fn list(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(" / ")
}

fn ms(h: &Histogram<u64>, q: f64) -> String {
    format!("{:.0}", h.value_at_quantile(q) as f64 / 1000.0)
}

fn print_table(table: Table, rows: &[Row]) {
    println!("\n## {}\n", title(table));
    println!(
        "| setup | requests | answered | timed out | declined | per-node share (01/02/03) | node conns accepted | node conns peak held | node conns held at end | switch CPU | connects/s | p50 ms | p99 ms |"
    );
    println!("|---|---:|---:|---:|---:|---|---|---|---|---:|---:|---:|---:|");
    for r in rows {
        let rep = &r.report;
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} | {} |",
            r.setup.name(),
            rep.requests,
            rep.answered,
            rep.timeouts,
            rep.declined,
            share(&r.per_node),
            list(&r.accepted),
            list(&r.peak),
            list(&r.held),
            r.cpu
                .map_or_else(|| "-".to_string(), |c| format!("{c:.1}%")),
            rep.connects_per_s(),
            ms(&rep.latency_us, 0.5),
            ms(&rep.latency_us, 0.99),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_and_list_format() {
        assert_eq!(share(&[1, 1, 2]), "25% / 25% / 50%");
        assert_eq!(share(&[0, 0, 0]), "0% / 0% / 0%");
        assert_eq!(list(&[20, 3, 0]), "20 / 3 / 0");
    }
}
