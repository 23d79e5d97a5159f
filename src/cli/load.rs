//! `isoswitch load`: the load generator of [`crate::sim::load`] against any
//! address (a node, the switch, a proxy), with a live progress line and a final
//! report. Exits 1 when any request timed out or any answer matched no request.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::iso8583::Spec;
use crate::iso8583::SpecFiles;
use crate::sim::load::{self, LoadConfig, LoadCounters, LoadReport, Mix};

#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// Where to send the requests: the switch's front, a node, a proxy. A
    /// comma-separated list spreads the clients over them in turn (straight
    /// to a cluster's nodes, with no balancer between).
    #[arg(long, value_delimiter = ',', required = true)]
    pub target: Vec<SocketAddr>,
    /// The dialect of the requests (a shipped spec name or a spec file).
    #[arg(long)]
    pub spec: String,
    /// Client connections.
    #[arg(long, default_value_t = 50)]
    pub clients: usize,
    /// Requests each client keeps in flight.
    #[arg(long, default_value_t = 4)]
    pub in_flight: usize,
    /// `paper` (80% of requests 200-300 bytes, 20% 1,200-1,400) or a size in bytes.
    #[arg(long, default_value = "paper")]
    pub mix: Mix,
    /// How long to send.
    #[arg(long, default_value = "10s", value_parser = crate::util::duration::parse)]
    pub duration: Duration,
    /// A request unanswered this long counts as a timeout.
    #[arg(long, default_value = "3s", value_parser = crate::util::duration::parse)]
    pub timeout: Duration,
    /// Total requests per second (default: as fast as the windows allow).
    /// Open loop: each of the clients x in-flight slots sends on its own
    /// schedule, and latency is corrected for coordinated omission.
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// The MTI of the requests.
    #[arg(long, default_value = "0200")]
    pub mti: String,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// No progress line.
    #[arg(long)]
    pub quiet: bool,
    /// Runtime worker threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// ATM profile (OneConnect): each request on a connection of its own:
    /// connect, one request, its answer, close. `--clients` loop at once;
    /// `--in-flight` is ignored.
    #[arg(long, conflicts_with = "requests_per_round")]
    pub connection_per_request: bool,
    /// Each client a terminal of its own (F41) and each request its own
    /// RRN (F37), as real traffic; by default all carry the template's.
    /// Long-connection mode only.
    #[arg(long, conflicts_with_all = ["connection_per_request", "requests_per_round"])]
    pub vary_keys: bool,
    /// Pause after each answer (after each round with `--requests-per-round`).
    #[arg(long, default_value = "0s", value_parser = crate::util::duration::parse)]
    pub think: Duration,
    /// MBLB profile: each client sends this many requests at once on its long
    /// connection and waits for all their answers before the next round (the
    /// paper uses 4). `--in-flight` and `--rate` are ignored.
    #[arg(long)]
    pub requests_per_round: Option<usize>,
    /// Connect over TLS: --tls-ca, and --tls-cert/--tls-key for a client
    /// certificate (the ATM profile then pays a full handshake per request).
    #[command(flatten)]
    pub tls: crate::tls::tools::TlsFlags,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!(
            "`{s}`: use a positive number of requests per second"
        )),
    }
}

/// Runs the load and prints the report; the exit status tells whether every
/// request got its own answer in time.
pub fn run(args: &LoadArgs) -> ExitCode {
    let spec = match Spec::resolve(&args.spec) {
        Ok(s) => Arc::new(s),
        Err(e) => return fail(format!("--spec {}: {e}", args.spec)),
    };
    if args.clients == 0 || args.in_flight == 0 {
        return fail("--clients and --in-flight must be at least 1".into());
    }
    if args.requests_per_round == Some(0) {
        return fail("--requests-per-round must be at least 1".into());
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.threads {
        builder.worker_threads(n.max(1));
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the runtime: {e}")),
    };
    let report = match rt.block_on(drive(spec, args)) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if args.json {
        println!("{}", report.to_json());
    } else {
        println!("{report}");
    }
    if report.timeouts > 0 || report.mismatches > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

async fn drive(spec: Arc<Spec>, args: &LoadArgs) -> Result<LoadReport, String> {
    let (first, spread) = args
        .target
        .split_first()
        .ok_or("--target: no address given")?;
    let mut cfg = LoadConfig::new(*first);
    cfg.spread = spread.to_vec();
    cfg.clients = args.clients;
    cfg.in_flight = args.in_flight;
    cfg.mix = args.mix;
    cfg.duration = args.duration;
    cfg.timeout = args.timeout;
    cfg.rate = args.rate;
    cfg.mti = args.mti.clone();
    cfg.connection_per_request = args.connection_per_request;
    cfg.think = args.think;
    cfg.requests_per_round = args.requests_per_round;
    cfg.vary_keys = args.vary_keys;
    cfg.tls = args.tls.client().map_err(|e| e.to_string())?;
    let counters = Arc::new(LoadCounters::default());
    let bar = progress_bar(
        args.quiet || !std::io::stderr().is_terminal(),
        args.duration,
    );
    let progress = tokio::spawn(show_progress(
        bar.clone(),
        Arc::clone(&counters),
        args.duration,
    ));
    let result = load::run(spec, cfg, counters).await;
    progress.abort();
    bar.finish_and_clear();
    result
}

fn progress_bar(hidden: bool, duration: Duration) -> ProgressBar {
    let len = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    let bar = ProgressBar::with_draw_target(
        Some(len),
        if hidden {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr_with_hz(5)
        },
    );
    if let Ok(style) = ProgressStyle::with_template("{elapsed:>4} {bar:20} {msg}") {
        bar.set_style(style);
    }
    bar
}

/// One line, redrawn every 200 ms: elapsed, requests, answered, msg/s, timeouts,
/// mismatches.
async fn show_progress(bar: ProgressBar, counters: Arc<LoadCounters>, duration: Duration) {
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = (started, 0u64);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let done =
            counters.answered.load(Ordering::Relaxed) + counters.declined.load(Ordering::Relaxed);
        let rate = (done - last.1.min(done)) as f64
            / now
                .saturating_duration_since(last.0)
                .as_secs_f64()
                .max(1e-3);
        last = (now, done);
        let elapsed = now.saturating_duration_since(started).min(duration);
        bar.set_position(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
        bar.set_message(format!(
            "requests {}  answered {}  {:.0} msg/s  timeouts {}  mismatches {}",
            counters.requests.load(Ordering::Relaxed),
            counters.answered.load(Ordering::Relaxed),
            rate,
            counters.timeouts.load(Ordering::Relaxed),
            counters.mismatches.load(Ordering::Relaxed),
        ));
    }
}

fn fail(msg: String) -> ExitCode {
    eprintln!("isoswitch load: {msg}");
    ExitCode::FAILURE
}
