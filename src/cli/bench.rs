//! `isoswitch bench`: one run, same machine, same workload, nodes answering at
//! once, measuring in turn (a) the load generator straight to one node, (b)
//! HAProxy in TCP mode round robin over the nodes (when `haproxy` is on the PATH)
//! and (c) isoswitch balancing per message over the same nodes, in its own
//! process. Then the same at a fixed request rate, for the latency the switch
//! adds.

use std::net::SocketAddr;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::iso8583::Spec;
use crate::sim::load::{self, LoadConfig, LoadCounters, LoadReport, Mix};
use crate::sim::node::{Delay, NodeSim, NodeSimConfig};

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[arg(long, default_value = "cups")]
    pub spec: String,
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    #[arg(long, default_value_t = 50)]
    pub clients: usize,
    #[arg(long, default_value_t = 4)]
    pub in_flight: usize,
    /// `paper` (80% 200-300 bytes, 20% 1,200-1,400) or a size in bytes.
    #[arg(long, default_value = "paper")]
    pub mix: Mix,
    /// Length of each measurement.
    #[arg(long, default_value = "10s", value_parser = crate::util::duration::parse)]
    pub duration: Duration,
    /// Request rate of the fixed-rate run (the added-latency measurement).
    #[arg(long, default_value_t = 10_000.0)]
    pub rate: f64,
    /// Skip HAProxy even if it is installed.
    #[arg(long)]
    pub no_haproxy: bool,
    /// Measure every row this many times, interleaved (a, b, c, a, b, c...),
    /// and report the range: on a shared machine one run is not a number.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Worker threads of the switch process (`isoswitch run --worker-threads`;
    /// default: its own default, one per core).
    #[arg(long)]
    pub switch_threads: Option<usize>,
    /// Worker threads of this process, which runs the nodes and the load
    /// generator (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// `throughput` (the rows above) or `paper`: the bank paper's Table 1
    /// (OneConnect) and Table 2 (MBLB) for isoswitch, HAProxy and direct to a
    /// node, `--duration` per row (the paper ran 5m).
    #[arg(long, default_value = "throughput", value_parser = ["throughput", "paper"])]
    pub scenario: String,
    /// Where `--scenario paper` writes its plots (SVG).
    #[arg(long, default_value = "target/paper")]
    pub plot_dir: String,
}

/// One measured row.
struct Row {
    what: String,
    report: LoadReport,
}

pub fn run(args: &BenchArgs) -> ExitCode {
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
    match rt.block_on(bench(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("isoswitch bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bench(args: &BenchArgs) -> Result<(), String> {
    if args.scenario == "paper" {
        return super::paper::run(args).await;
    }
    let spec = Arc::new(Spec::resolve(&args.spec).map_err(|e| e.to_string())?);
    let mut nodes = Vec::new();
    for i in 0..args.nodes.max(1) {
        let cfg = NodeSimConfig {
            id: format!("{:02}", i + 1),
            delay: Delay::NONE,
            fail_rate: 0.0,
            originate: None,
        };
        let any: SocketAddr = "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?;
        nodes.push(
            NodeSim::start(any, spec.clone(), cfg)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    let haproxy = if args.no_haproxy {
        None
    } else {
        Haproxy::start(&addrs).ok()
    };
    if haproxy.is_none() && !args.no_haproxy {
        eprintln!("haproxy not found on PATH: row (b) skipped (scripts/bench.sh installs it)");
    }
    let switch = SwitchProcess::start(&args.spec, &addrs, args.switch_threads)?;
    wait_listening(switch.front).await?;
    let haproxy = match haproxy {
        Some(h) => match wait_listening(h.front).await {
            Ok(()) => Some(h),
            Err(e) => {
                eprintln!("haproxy did not start ({e}): row (b) skipped");
                None
            }
        },
        None => None,
    };
    println!(
        "# isoswitch bench: spec {}, {} nodes answering at once, {} clients x {} in flight, mix {:?}, {} s per row, {} repetition(s); switch threads {}, bench threads {}",
        args.spec,
        addrs.len(),
        args.clients,
        args.in_flight,
        args.mix,
        args.duration.as_secs_f64(),
        args.repeat.max(1),
        args.switch_threads
            .map_or_else(|| "default".to_string(), |n| n.to_string()),
        args.threads
            .map_or_else(|| "default".to_string(), |n| n.to_string()),
    );
    let repeat = args.repeat.max(1);
    let tag = |what: &str, i: usize| {
        if repeat > 1 {
            format!("{what} #{}", i + 1)
        } else {
            what.to_string()
        }
    };
    let mut rows = Vec::new();
    let mut fixed = Vec::new();
    let mut ratios = Vec::new();
    for i in 0..repeat {
        let a = measure(
            &tag("(a) direct to one node", i),
            addrs[0],
            &spec,
            args,
            None,
        )
        .await?;
        let b = match &haproxy {
            Some(h) => Some(
                measure(
                    &tag("(b) haproxy tcp roundrobin", i),
                    h.front,
                    &spec,
                    args,
                    None,
                )
                .await?,
            ),
            None => None,
        };
        let c = measure(
            &tag("(c) isoswitch per message", i),
            switch.front,
            &spec,
            args,
            None,
        )
        .await?;
        let label = tag(&format!("(a) direct at {} req/s", args.rate), i);
        let fa = measure(&label, addrs[0], &spec, args, Some(args.rate)).await?;
        let fb = match &haproxy {
            Some(h) => {
                let label = tag(&format!("(b) haproxy at {} req/s", args.rate), i);
                Some(measure(&label, h.front, &spec, args, Some(args.rate)).await?)
            }
            None => None,
        };
        let label = tag(&format!("(c) isoswitch at {} req/s", args.rate), i);
        let fc = measure(&label, switch.front, &spec, args, Some(args.rate)).await?;
        ratios.push(Ratios {
            c_b: b.as_ref().map(|b| ratio(&c.report, &b.report)),
            c_a: ratio(&c.report, &a.report),
            added_p99_us: p99(&fc.report) - p99(&fa.report),
            added_p99_haproxy_us: fb.as_ref().map(|fb| p99(&fb.report) - p99(&fa.report)),
        });
        rows.push(a);
        rows.extend(b);
        rows.push(c);
        fixed.push(fa);
        fixed.extend(fb);
        fixed.push(fc);
    }
    print_table("Maximum throughput", &rows);
    print_table("Fixed rate", &fixed);
    print_summary(&ratios, args.rate);
    drop(switch);
    drop(haproxy);
    for n in nodes {
        n.stop().await;
    }
    Ok(())
}

async fn measure(
    what: &str,
    target: SocketAddr,
    spec: &Arc<Spec>,
    args: &BenchArgs,
    rate: Option<f64>,
) -> Result<Row, String> {
    let mut cfg = LoadConfig::new(target);
    cfg.clients = args.clients;
    cfg.in_flight = args.in_flight;
    cfg.mix = args.mix;
    cfg.duration = args.duration;
    cfg.rate = rate;
    eprintln!("measuring {what} ...");
    let report = load::run(spec.clone(), cfg, Arc::new(LoadCounters::default())).await?;
    Ok(Row {
        what: what.to_string(),
        report,
    })
}

fn print_table(title: &str, rows: &[Row]) {
    println!("\n## {title}\n");
    println!("| target | msg/s | p50 µs | p99 µs | p99.9 µs | timeouts | mismatches |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.0} | {} | {} | {} | {} | {} |",
            r.what,
            r.report.throughput(),
            r.report.percentile_us(0.5),
            r.report.percentile_us(0.99),
            r.report.percentile_us(0.999),
            r.report.timeouts,
            r.report.mismatches
        );
    }
}

/// What one repetition gives.
struct Ratios {
    c_b: Option<f64>,
    c_a: f64,
    added_p99_us: i64,
    added_p99_haproxy_us: Option<i64>,
}

fn ratio(num: &LoadReport, den: &LoadReport) -> f64 {
    num.throughput() / den.throughput().max(1e-9)
}

fn p99(r: &LoadReport) -> i64 {
    i64::try_from(r.percentile_us(0.99)).unwrap_or(i64::MAX)
}

/// `median (min..max)` of the values, or the value alone.
fn spread<T: Copy + PartialOrd + std::fmt::Display>(
    mut v: Vec<T>,
    show: fn(T) -> String,
) -> String {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    match (v.first(), v.get(v.len() / 2), v.last()) {
        (Some(&lo), Some(&mid), Some(&hi)) if v.len() > 1 => {
            format!("{} (range {} .. {})", show(mid), show(lo), show(hi))
        }
        (Some(&x), _, _) => show(x),
        _ => "-".into(),
    }
}

fn print_summary(ratios: &[Ratios], rate: f64) {
    let two = |x: f64| format!("{x:.2}");
    let us = |x: i64| format!("{x} µs");
    println!();
    let c_b: Vec<f64> = ratios.iter().filter_map(|r| r.c_b).collect();
    if !c_b.is_empty() {
        println!("c/b (isoswitch / haproxy) = {}", spread(c_b, two));
    }
    let c_a: Vec<f64> = ratios.iter().map(|r| r.c_a).collect();
    println!("c/a (isoswitch / direct)  = {}", spread(c_a, two));
    let added: Vec<i64> = ratios.iter().map(|r| r.added_p99_us).collect();
    println!(
        "added p99 at {rate} req/s, isoswitch: {}",
        spread(added, us)
    );
    let added_b: Vec<i64> = ratios
        .iter()
        .filter_map(|r| r.added_p99_haproxy_us)
        .collect();
    if !added_b.is_empty() {
        println!(
            "added p99 at {rate} req/s, haproxy:   {}",
            spread(added_b, us)
        );
    }
}

pub(super) async fn wait_listening(addr: SocketAddr) -> Result<(), String> {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            // Give the switch time to open its node connections.
            tokio::time::sleep(Duration::from_millis(500)).await;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err(format!("nothing listens on {addr}"))
}

pub(super) fn free_port() -> Result<SocketAddr, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map_err(|e| e.to_string())
}

/// isoswitch in its own process, as HAProxy is.
struct SwitchProcess {
    child: Child,
    front: SocketAddr,
    _config: TempFile,
}

impl SwitchProcess {
    fn start(
        spec: &str,
        nodes: &[SocketAddr],
        threads: Option<usize>,
    ) -> Result<SwitchProcess, String> {
        let front = free_port()?;
        let mut toml = format!(
            "[[service]]\nname = \"bench\"\nspec = \"{spec}\"\n[service.front]\nkind = \"listen\"\nlisten = \"{front}\"\n\
             [service.back]\nconnections_per_node = 2\n"
        );
        for (i, a) in nodes.iter().enumerate() {
            toml.push_str(&format!(
                "[[service.back.node]]\nid = \"{:02}\"\naddress = \"{a}\"\n",
                i + 1
            ));
        }
        let config = TempFile::write("isoswitch-bench", "toml", &toml)?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(exe);
        cmd.args(["run", "--config"]).arg(&config.path);
        if let Some(n) = threads {
            cmd.arg("--worker-threads").arg(n.to_string());
        }
        let child = cmd
            .env("ISOSWITCH_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the switch: {e}"))?;
        Ok(SwitchProcess {
            child,
            front,
            _config: config,
        })
    }
}

impl Drop for SwitchProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// HAProxy in TCP mode, round robin over the nodes: it balances connections,
/// not messages.
pub(super) struct Haproxy {
    child: Child,
    pub(super) front: SocketAddr,
    _config: TempFile,
}

impl Haproxy {
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(super) fn start(nodes: &[SocketAddr]) -> Result<Haproxy, String> {
        let front = free_port()?;
        let mut cfg = format!(
            // maxconn sizes HAProxy's file descriptor limit (about twice
            // maxconn); 10000 asks for more than a default hard limit of 20000
            // and HAProxy 2.6 then refuses to start.
            "global\n  maxconn 4000\ndefaults\n  mode tcp\n  timeout connect 2s\n  timeout client 60s\n  timeout server 60s\n\
             frontend f\n  bind {front}\n  default_backend b\nbackend b\n  balance roundrobin\n"
        );
        for (i, a) in nodes.iter().enumerate() {
            cfg.push_str(&format!("  server n{i} {a}\n"));
        }
        let config = TempFile::write("isoswitch-bench-haproxy", "cfg", &cfg)?;
        let child = Command::new("haproxy")
            .arg("-f")
            .arg(&config.path)
            .arg("-q")
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        Ok(Haproxy {
            child,
            front,
            _config: config,
        })
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) struct TempFile {
    pub(super) path: std::path::PathBuf,
}

impl TempFile {
    pub(super) fn write(stem: &str, ext: &str, text: &str) -> Result<TempFile, String> {
        let path = std::env::temp_dir().join(format!("{stem}-{}.{ext}", std::process::id()));
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(TempFile { path })
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
