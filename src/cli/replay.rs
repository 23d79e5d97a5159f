//! `isoswitch replay FILE --spec S --target HOST:PORT`: sends the client-side
//! requests of a capture to a target and compares its answers with the
//! captured ones; with `--accept`, plays the peer (see [`crate::capture::peer`]).
//! Exit status 1 on any difference, missing or unexpected answer.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::capture::peer;
use crate::capture::read;
use crate::capture::replay::{self, DEFAULT_IGNORE, ReplayOptions};
use crate::capture::writer::Recorder;
use crate::iso8583::Spec;
use crate::iso8583::SpecFiles;

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
authorization code).

With --accept PORT=ADDR replay plays the peer of a simplex (UnionPay) or \
connect (VISA) front: it accepts on ADDR the connections the switch opens \
(the captured connections to PORT), opens the connections to --server-port \
at --target (in links), sends the peer's requests on each and matches the \
answers on any link; the switch's own requests are answered, not compared.")]
pub struct ReplayArgs {
    /// A pcap or pcapng capture.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The capture's dialect (built-in name or spec file).
    #[arg(long)]
    pub spec: String,
    /// Where to send the requests: a switch front or a node (with --accept:
    /// where to open the connections the peer opened, e.g. a simplex in-link
    /// listener).
    #[arg(long, required_unless_present = "accept")]
    pub target: Option<SocketAddr>,
    /// Play the peer (UnionPay, VISA): accept the connections the switch
    /// opens, on ADDR, for the captured connections to server port PORT
    /// (`PORT=ADDR`, repeatable), and match answers on every link.
    #[arg(long, value_name = "PORT=ADDR", value_parser = parse_accept)]
    pub accept: Vec<(u16, SocketAddr)>,
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
    if packets.cut_short {
        eprintln!(
            "isoswitch replay: {}",
            read::cut_note(&a.file, packets.packets)
        );
    }
    let conns = match select(&spec, read::connections(&packets.segments), a.server_port) {
        Ok(c) => c,
        Err(e) => return fail(&e.to_string()),
    };
    if !a.accept.is_empty() {
        return run_peer(a, &spec, &packets.segments);
    }
    let Some(target) = a.target else {
        return fail("--target is required without --accept");
    };
    let record = a.record.as_ref().map(|path| {
        if a.record_clear {
            tracing::warn!(file = %path.display(), "--record in CLEAR: card data is written as it is");
        }
        Arc::new(Mutex::new(Recorder::single_file(Arc::clone(&spec), path, a.record_clear)))
    });
    let opts = ReplayOptions {
        target,
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

/// `--accept`: replay plays the peer, accepting the switch's connections on
/// the given addresses and opening its own to `--target` (the captured
/// connections to `--server-port`).
fn run_peer(a: &ReplayArgs, spec: &Arc<Spec>, segments: &[read::Segment]) -> ExitCode {
    if a.record.is_some() {
        return fail("--record is not available with --accept");
    }
    let connect = match (a.server_port, a.target) {
        (Some(p), Some(t)) => vec![(p, t)],
        (None, None) => Vec::new(),
        _ => return fail("with --accept, --server-port and --target go together"),
    };
    let conns = read::connections(segments);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    let opts = ReplayOptions {
        target: connect
            .first()
            .map_or(SocketAddr::from(([127, 0, 0, 1], 0)), |c| c.1),
        ignore: a.ignore.clone(),
        speed: a.speed,
        rate: a.rate,
        timeout: a.timeout,
        concurrency: a.concurrency,
    };
    let report = rt.block_on(async {
        let mut accept = Vec::new();
        for (port, addr) in &a.accept {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => accept.push((*port, l)),
                Err(source) => {
                    return Err(ReplayError::Listen {
                        addr: *addr,
                        source,
                    });
                }
            }
        }
        let links = peer::PeerLinks { accept, connect };
        Ok(peer::replay_peer(Arc::clone(spec), &conns, links, &opts).await)
    });
    let report = match report {
        Ok(r) => r,
        Err(e) => return fail(&e.to_string()),
    };
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

/// Why `isoswitch replay` could not start: a flag, the capture's
/// connections, or a listener for `--accept`.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("--accept {0}: expected PORT=ADDR")]
    AcceptForm(String),
    #[error("--accept {accept}: port {port}: {source}")]
    AcceptPort {
        accept: String,
        port: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("--accept {accept}: address {addr}: {source}")]
    AcceptAddr {
        accept: String,
        addr: String,
        #[source]
        source: std::net::AddrParseError,
    },
    #[error("the capture has no client-side requests to replay")]
    NoRequests,
    /// The server ports the requests go to, with their connections.
    #[error(
        "the capture has requests to several server ports: {}; choose with --server-port",
        port_list(.0)
    )]
    SeveralPorts(Vec<(u16, usize)>),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

fn port_list(ports: &[(u16, usize)]) -> String {
    let list: Vec<String> = ports
        .iter()
        .map(|(p, n)| format!("{p} ({n} connections)"))
        .collect();
    list.join(", ")
}

fn parse_accept(s: &str) -> Result<(u16, SocketAddr), ReplayError> {
    let (port, addr) = s
        .split_once('=')
        .ok_or_else(|| ReplayError::AcceptForm(s.to_string()))?;
    let port = port.parse().map_err(|source| ReplayError::AcceptPort {
        accept: s.to_string(),
        port: port.to_string(),
        source,
    })?;
    let addr = addr.parse().map_err(|source| ReplayError::AcceptAddr {
        accept: s.to_string(),
        addr: addr.to_string(),
        source,
    })?;
    Ok((port, addr))
}

/// The connections to replay: those of `--server-port`, else all when their
/// requests go to one server port only.
pub fn select(
    spec: &Spec,
    conns: Vec<read::Connection>,
    server_port: Option<u16>,
) -> Result<Vec<read::Connection>, ReplayError> {
    let ports = replay::server_ports(spec, &conns);
    let port = match (server_port, ports.as_slice()) {
        (Some(p), _) => p,
        (None, [(p, _)]) => *p,
        (None, []) => return Err(ReplayError::NoRequests),
        (None, many) => return Err(ReplayError::SeveralPorts(many.to_vec())),
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
