//! `isoswitch replay FILE --spec S --target HOST:PORT`: sends the client-side
//! requests of a capture to a target and compares its answers with the
//! captured ones. Exit status 1 on any difference, missing or unexpected answer.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::capture::read;
use crate::capture::replay::{self, DEFAULT_IGNORE, ReplayOptions};
use crate::capture::writer::Recorder;
use crate::iso8583::Spec;

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Only the requests a connection's client sent are replayed (answers, keep-alives \
and network management the server started are not), each on a connection of its \
own per captured connection, in the captured order: a request sent after N answers \
in the capture is sent after N answers now. A capture taken on a switch holds \
both its client and its node connections: --server-port picks which to replay \
(required when both have requests).

Answers are matched to requests by response MTI, F11 and F41, and compared \
field by field after masking both sides like a capture; --ignore lists the fields \
left out (default 7,37,38: transmission time, the F37 node stamp, the \
authorization code).")]
pub struct ReplayArgs {
    /// A pcap or pcapng capture.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The capture's dialect (built-in name or spec file).
    #[arg(long)]
    pub spec: String,
    /// Where to send the requests: a switch front or a node.
    #[arg(long)]
    pub target: SocketAddr,
    /// Replay only connections whose server port in the capture is this.
    #[arg(long)]
    pub server_port: Option<u16>,
    /// Fields not compared, e.g. `7,37,38,39`.
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_IGNORE)]
    pub ignore: Vec<u16>,
    /// Keep the captured timing, this many times faster (1 = as captured).
    #[arg(long, conflicts_with = "rate")]
    pub speed: Option<f64>,
    /// Send at this many requests per second in all.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Wait this long for each answer.
    #[arg(long, default_value = "5s", value_parser = crate::util::duration::parse)]
    pub timeout: Duration,
    /// Connections replayed at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Write what was sent and answered as a pcapng capture (masked).
    #[arg(long, value_name = "OUT")]
    pub record: Option<PathBuf>,
    /// With --record: keep card data in clear (test systems only).
    #[arg(long, requires = "record")]
    pub record_clear: bool,
}

pub fn run(a: &ReplayArgs) -> ExitCode {
    let spec = match Spec::resolve(&a.spec) {
        Ok(s) => Arc::new(s),
        Err(e) => return fail(&e.to_string()),
    };
    if a.speed.is_some_and(|s| !(s.is_finite() && s > 0.0)) {
        return fail("--speed must be a positive number");
    }
    if a.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return fail("--rate must be a positive number");
    }
    let packets = match read::read_file(&a.file) {
        Ok(p) => p,
        Err(e) => return fail(&e.to_string()),
    };
    let conns = match select(&spec, read::connections(&packets.segments), a.server_port) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let record = a.record.as_ref().map(|path| {
        if a.record_clear {
            tracing::warn!(file = %path.display(), "--record in CLEAR: card data is written as it is");
        }
        Arc::new(Mutex::new(Recorder::single_file(Arc::clone(&spec), path, a.record_clear)))
    });
    let opts = ReplayOptions {
        target: a.target,
        ignore: a.ignore.clone(),
        speed: a.speed,
        rate: a.rate,
        timeout: a.timeout,
        concurrency: a.concurrency,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    let report = rt.block_on(replay::replay(
        Arc::clone(&spec),
        &conns,
        &opts,
        record.clone(),
    ));
    if let Some(r) = record {
        let mut r = r.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = r.finish() {
            return fail(&e.to_string());
        }
    }
    print!("{report}");
    if report.is_clean() && report.replayed > 0 {
        ExitCode::SUCCESS
    } else {
        if report.replayed == 0 {
            eprintln!("isoswitch replay: nothing was replayed");
        }
        ExitCode::FAILURE
    }
}

/// The connections to replay: those of `--server-port`, else all when their
/// requests go to one server port only.
pub fn select(
    spec: &Spec,
    conns: Vec<read::Connection>,
    server_port: Option<u16>,
) -> Result<Vec<read::Connection>, String> {
    let ports = replay::server_ports(spec, &conns);
    let port = match (server_port, ports.as_slice()) {
        (Some(p), _) => p,
        (None, [(p, _)]) => *p,
        (None, []) => return Err("the capture has no client-side requests to replay".into()),
        (None, many) => {
            let list: Vec<String> = many
                .iter()
                .map(|(p, n)| format!("{p} ({n} connections)"))
                .collect();
            return Err(format!(
                "the capture has requests to several server ports: {}; choose with --server-port",
                list.join(", ")
            ));
        }
    };
    Ok(conns
        .into_iter()
        .filter(|c| c.server.port() == port)
        .collect())
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("isoswitch replay: {msg}");
    ExitCode::FAILURE
}
