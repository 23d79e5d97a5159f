//! Command-line interface. `main.rs` only calls [`main`].
//!
//! The commands that are tools rather than the switch (`sim`, `load`,
//! `bench`, `demo`) are built with the `tools` cargo feature only (on by
//! default); the production build (`--no-default-features`, what
//! `scripts/package.sh` ships) leaves them out, and names them in a clear
//! error when asked for one ([`TOOL_COMMANDS`]).

#[cfg(feature = "tools")]
pub mod bench;
pub mod check;
pub mod ctl;
pub mod decode;
#[cfg(feature = "tools")]
pub mod demo;
#[cfg(feature = "tools")]
pub mod demo_atm;
pub mod journal;
#[cfg(feature = "tools")]
pub mod load;
pub mod replay;
#[cfg(feature = "tools")]
pub mod sim;
pub mod store;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::config::Config;

#[derive(Debug, Parser)]
#[command(
    name = "isoswitch",
    version,
    about = "A protocol-aware switch for ISO 8583 links"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The whole switch in one process on the embedded default config: a POS
    /// network controller and UnionPay through three channel nodes, with a
    /// drain, a node failure and a recovery.
    #[cfg(feature = "tools")]
    Demo(demo::DemoArgs),
    /// Run the switch on a config file (the embedded default without one).
    Run {
        #[arg(long)]
        config: Option<PathBuf>,
        /// Seconds between stats lines.
        #[arg(long, default_value_t = 5)]
        stats_every: u64,
        /// Runtime worker threads (default: one per core).
        #[arg(long)]
        worker_threads: Option<usize>,
        /// Runs every task on one thread (tokio's current-thread runtime):
        /// no work stealing and no scheduler statistics per wake-up, and one
        /// core at most. For single-core hosts, and to measure what the
        /// multi-thread scheduler costs a message (BENCHMARKS.md).
        #[arg(long, conflicts_with = "worker_threads")]
        single_thread: bool,
        /// Capture every service's connections as pcapng into DIR (masked).
        #[arg(long, value_name = "DIR")]
        capture: Option<PathBuf>,
        /// With --capture: keep card data in clear (test systems only; builds
        /// with the `tools` feature only, refused by the production build).
        #[arg(long, requires = "capture")]
        capture_clear: bool,
        /// Where the switch keeps what outlives a run (the operators'
        /// runtime node changes). Default: the config's `data_dir`, else
        /// $STATE_DIRECTORY, else ./isoswitch-data.
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Let a crash write a core dump (debugging only: a core holds the
        /// PANs and PIN blocks in flight). Off by default: the process is
        /// not dumpable and its core size limit is 0.
        #[arg(long)]
        allow_core_dumps: bool,
    },
    /// Validate a config file and print it resolved (defaults filled in).
    Check {
        #[arg(long)]
        config: PathBuf,
    },
    /// Operate a running switch through its admin API.
    Ctl(ctl::CtlArgs),
    /// The exchanges and admin actions the switch journaled (masked), and
    /// the day's reconciliation report.
    Journal(journal::JournalArgs),
    /// The store's upkeep: `rekey` after a key rotation.
    Store(store::StoreCmdArgs),
    /// Decode framed messages like a protocol dissector.
    Decode(decode::DecodeArgs),
    /// Measure the load generator direct to a node, through HAProxy (if
    /// installed) and through isoswitch, in one run.
    #[cfg(feature = "tools")]
    Bench(bench::BenchArgs),
    /// Drive load at an address (a node, the switch, a proxy) and report
    /// throughput and latency.
    #[cfg(feature = "tools")]
    Load(load::LoadArgs),
    /// Replay the client side of a capture against a switch or a node and
    /// compare the answers with the captured ones.
    Replay(replay::ReplayArgs),
    /// Simulators: channel node, POS network controller, UnionPay.
    #[cfg(feature = "tools")]
    #[command(subcommand)]
    Sim(sim::SimCommand),
}

/// Parses the arguments and runs the command.
pub fn main() -> ExitCode {
    if let Some(code) = refuse_missing_tool(std::env::args_os().nth(1)) {
        return code;
    }
    let cli = Cli::parse();
    use std::io::IsTerminal;
    // The demo's screen is its own narration: it sends the switch's log to a
    // file of its own (demo::run), never between the lines a person reads.
    let _log_flush = match cli.command {
        #[cfg(feature = "tools")]
        Command::Demo(_) => None,
        _ => Some(init_logging(
            "info",
            std::io::stderr(),
            std::io::stderr().is_terminal(),
        )),
    };
    match cli.command {
        Command::Decode(args) => decode::run(&args),
        Command::Ctl(args) => ctl::run(&args),
        Command::Journal(args) => journal::run(args),
        Command::Store(args) => store::run(args),
        #[cfg(feature = "tools")]
        Command::Demo(args) => demo::run(&args),
        #[cfg(feature = "tools")]
        Command::Bench(args) => bench::run(&args),
        #[cfg(feature = "tools")]
        Command::Load(args) => load::run(&args),
        Command::Replay(args) => replay::run(&args),
        Command::Check { config } => check::run(&config),
        Command::Run {
            config,
            stats_every,
            worker_threads,
            single_thread,
            capture,
            capture_clear,
            data_dir,
            allow_core_dumps,
        } => {
            if !allow_core_dumps && let Err(e) = no_core_dumps() {
                return fail(format!("cannot turn core dumps off: {e}"));
            }
            let loaded = match &config {
                Some(path) => Config::load(path).map_err(|e| format!("{}: {e}", path.display())),
                None => Config::embedded_default().map_err(|e| format!("embedded default: {e}")),
            };
            let mut cfg = match loaded {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            if capture_clear && !cfg!(feature = "tools") {
                return fail(format!(
                    "--capture-clear (capture.clear): {}",
                    crate::config::CLEAR_NEEDS_TOOLS
                ));
            }
            if let Some(dir) = &capture {
                crate::config::CaptureConfig::apply_to_all(&mut cfg, dir, capture_clear);
            }
            let state_directory = std::env::var(crate::ops::data_dir::STATE_DIRECTORY_ENV).ok();
            let (data_dir, origin) = crate::ops::data_dir::resolve(
                data_dir.as_deref(),
                cfg.data_dir.as_deref(),
                state_directory.as_deref(),
            );
            tracing::info!(data_dir = %data_dir.display(), from = origin.as_str(), "data directory");
            let threads = if single_thread {
                Threads::One
            } else {
                Threads::Workers(worker_threads)
            };
            runtime_with(threads, async move {
                crate::ops::run::run_until_interrupted(
                    &cfg,
                    config.clone(),
                    &data_dir,
                    Duration::from_secs(stats_every.max(1)),
                )
                .await
            })
        }
        #[cfg(feature = "tools")]
        Command::Sim(command) => sim::run(command),
    }
}

/// The subcommands only a build with the `tools` feature has.
pub const TOOL_COMMANDS: [&str; 4] = ["sim", "load", "bench", "demo"];

/// In a build without the `tools` feature, the exit status after saying
/// that `first` (the first argument) is a tool this binary was built
/// without; `None` where it is not one, or the tools are in.
fn refuse_missing_tool(first: Option<std::ffi::OsString>) -> Option<ExitCode> {
    let first = first?;
    let name = first.to_str()?;
    if cfg!(feature = "tools") || !TOOL_COMMANDS.contains(&name) {
        return None;
    }
    Some(fail(format!(
        "`{name}` is not in this binary: it was built without tools \
         (the simulators, load, bench and demo); build with the `tools` \
         feature (cargo's default) for them"
    )))
}

/// No core dump, ever, unless asked for: a crash of a switch writes the
/// card data in flight (PANs, PIN blocks, tracks) to disk in a core. The
/// core size limit goes to 0 and the process becomes undumpable (which
/// also keeps other processes of the same user from ptrace-reading it).
fn no_core_dumps() -> std::io::Result<()> {
    rlimit::setrlimit(rlimit::Resource::CORE, 0, 0)?;
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) takes no pointers and changes only
    // this process's dumpable flag.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Runs a command's future; its error (typed, or a tool's `String`) is
/// printed as the command's failure.
fn runtime<F, E>(fut: F) -> ExitCode
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    runtime_with(Threads::Workers(None), fut)
}

/// The threads a command's runtime runs its tasks on.
enum Threads {
    /// A multi-thread runtime of that many workers (default: one per core).
    Workers(Option<usize>),
    /// The calling thread alone (`run --single-thread`).
    One,
}

fn runtime_with<F, E>(threads: Threads, fut: F) -> ExitCode
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut builder = match threads {
        Threads::Workers(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            if let Some(n) = n {
                b.worker_threads(n.max(1));
            }
            b
        }
        Threads::One => tokio::runtime::Builder::new_current_thread(),
    };
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the runtime: {e}")),
    };
    match rt.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e.to_string()),
    }
}

fn fail(msg: String) -> ExitCode {
    eprintln!("isoswitch: {msg}");
    ExitCode::FAILURE
}

/// Sets up logging to `out` (stderr, or the demo's log file), in colour when
/// `ansi`; the guard returned flushes lines still queued when it is dropped,
/// at the end of the command.
pub(crate) fn init_logging(
    default_level: &str,
    out: impl std::io::Write + Send + 'static,
    ansi: bool,
) -> tracing_appender::non_blocking::WorkerGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ISOSWITCH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // Log lines go through a bounded queue to a writer thread: a slow terminal
    // or disk never stalls the message path (lines past the queue are dropped
    // and the writer says how many).
    let (writer, guard) = tracing_appender::non_blocking(out);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    // `ISOSWITCH_LOG_FORMAT=json`: one JSON object a line, for log shippers.
    let _ = match std::env::var("ISOSWITCH_LOG_FORMAT").as_deref() {
        Ok("json") => builder.json().try_init(),
        _ => builder.with_ansi(ansi).try_init(),
    };
    guard
}
