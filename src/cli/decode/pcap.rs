//! `isoswitch decode --pcap FILE`: every message of a capture, with time,
//! direction and connection, decoded per spec (masked unless `--reveal`).
//!
//! The spec of a connection is `--spec`, else the spec of the configured
//! service whose port is the connection's server port (`--config`), else the
//! built-in spec under which the most of the capture decodes.

use std::collections::HashMap;
use std::io::{self, BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use super::{DecodeArgs, Options, write_message};
use crate::capture::read::{self, Connection};
use crate::config::{Config, ConfigError, FrontConfig};
use crate::iso8583::SpecFiles;
use crate::iso8583::{Spec, SpecError};
use crate::wire::Frame;

/// What a pcap decode saw (also what the tshark check compares).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PcapSummary {
    pub packets: usize,
    pub connections: usize,
    pub frames: usize,
    pub messages: usize,
    pub keep_alives: usize,
    pub errors: usize,
}

pub fn run(a: &DecodeArgs, path: &Path) -> ExitCode {
    let packets = match read::read_file(path) {
        Ok(p) => p,
        Err(e) => return fail(&e.to_string()),
    };
    if packets.cut_short {
        eprintln!(
            "isoswitch decode: {}",
            read::cut_note(path, packets.packets)
        );
    }
    let conns = read::connections(&packets.segments);
    let specs = match ConnSpecs::new(a, &conns) {
        Ok(s) => s,
        Err(e) => return fail(&e.to_string()),
    };
    let opts = Options {
        json: a.json,
        reveal: a.reveal,
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = write_capture(&conns, &specs, packets.packets, opts, &mut out)
        .and_then(|s| out.flush().map(|()| s));
    match result {
        Ok(s) => {
            eprintln!(
                "isoswitch decode: {} packets, {} connections, {} frames, {} messages, {} keep-alives, {} errors",
                s.packets, s.connections, s.frames, s.messages, s.keep_alives, s.errors
            );
            if s.errors == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => fail(&format!("cannot write the output: {e}")),
    }
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("isoswitch decode: {msg}");
    ExitCode::FAILURE
}

/// Why the specs of a capture's connections could not be chosen: the
/// `--spec`, the `--config` file, or the service whose spec would not load.
#[derive(Debug, thiserror::Error)]
pub enum ConnSpecsError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("{}: {source}", .path.display())]
    Config {
        path: PathBuf,
        #[source]
        source: ConfigError,
    },
    #[error("service {service}: {source}")]
    Service {
        service: String,
        #[source]
        source: ConfigError,
    },
}

/// The spec of each connection.
pub struct ConnSpecs {
    fixed: Option<Arc<Spec>>,
    by_port: HashMap<u16, Arc<Spec>>,
    guessed: Option<Arc<Spec>>,
}

impl ConnSpecs {
    fn new(a: &DecodeArgs, conns: &[Connection]) -> Result<ConnSpecs, ConnSpecsError> {
        let fixed = match &a.spec {
            Some(name) => Some(Arc::new(Spec::resolve(name)?)),
            None => None,
        };
        let by_port = match &a.config {
            Some(path) => {
                let cfg = Config::load(path).map_err(|source| ConnSpecsError::Config {
                    path: path.clone(),
                    source,
                })?;
                specs_by_port(&cfg)?
            }
            None => HashMap::new(),
        };
        let guessed = if fixed.is_none() && by_port.is_empty() {
            let g = read::guess_spec(conns).map(Arc::new);
            if let Some(s) = &g {
                eprintln!(
                    "isoswitch decode: spec guessed: {} (give --spec to choose)",
                    s.name()
                );
            }
            g
        } else {
            None
        };
        let mut names = std::collections::HashSet::new();
        for spec in fixed.iter().chain(by_port.values()).chain(guessed.iter()) {
            if names.insert(spec.name().to_string()) {
                super::warn_unflagged(spec);
            }
        }
        Ok(ConnSpecs {
            fixed,
            by_port,
            guessed,
        })
    }

    pub fn for_conn(&self, c: &Connection) -> Option<&Arc<Spec>> {
        self.fixed
            .as_ref()
            .or_else(|| self.by_port.get(&c.server.port()))
            .or(self.guessed.as_ref())
    }
}

/// Server port → spec, from every address a config names.
pub fn specs_by_port(cfg: &Config) -> Result<HashMap<u16, Arc<Spec>>, ConnSpecsError> {
    let mut out = HashMap::new();
    for svc in &cfg.services {
        let spec = Arc::new(svc.load_spec().map_err(|source| ConnSpecsError::Service {
            service: svc.name.to_string(),
            source,
        })?);
        let mut ports: Vec<u16> = svc.back.nodes.iter().map(|n| n.address.port()).collect();
        match &svc.front {
            FrontConfig::Listen(f) => ports.push(f.listen.port()),
            FrontConfig::Simplex(f) => ports.extend([f.listen.port(), f.connect.port()]),
            FrontConfig::Connect(f) => ports.push(f.connect.port()),
        }
        for p in ports {
            out.insert(p, Arc::clone(&spec));
        }
    }
    Ok(out)
}

fn write_capture(
    conns: &[Connection],
    specs: &ConnSpecs,
    packets: usize,
    opts: Options,
    out: &mut impl Write,
) -> io::Result<PcapSummary> {
    let mut summary = PcapSummary {
        packets,
        connections: conns.len(),
        ..PcapSummary::default()
    };
    let mut frames = Vec::new();
    for (i, c) in conns.iter().enumerate() {
        let Some(spec) = specs.for_conn(c) else {
            eprintln!(
                "isoswitch decode: connection {} ({} -> {}): no spec (give --spec or --config)",
                c.number, c.client, c.server
            );
            summary.errors += 1;
            continue;
        };
        if !opts.json {
            writeln!(
                out,
                "connection {}: client {} server {} spec {}{}",
                c.number,
                c.client,
                c.server,
                spec.name(),
                if c.saw_syn {
                    ""
                } else {
                    " (no handshake captured: client guessed)"
                }
            )?;
        }
        let (fs, problems) = read::timeline(spec, std::slice::from_ref(c));
        for p in problems {
            eprintln!(
                "isoswitch decode: connection {} {}: {}",
                c.number,
                direction(p.from_client),
                p.what
            );
            summary.errors += 1;
        }
        frames.extend(fs.into_iter().map(|f| (f, i, Arc::clone(spec))));
    }
    frames.sort_by_key(|(f, _, _)| f.at);
    for (n, (f, i, spec)) in frames.iter().enumerate() {
        let c = &conns[*i];
        summary.frames += 1;
        let (src, dst) = if f.from_client {
            (c.client, c.server)
        } else {
            (c.server, c.client)
        };
        let head = Head {
            number: n + 1,
            at: f.at,
            conn: c.number,
            from_client: f.from_client,
            src,
            dst,
            offset: f.frame.offset,
        };
        match &f.frame.frame {
            Frame::Message(payload) => {
                let result = if opts.json {
                    let mut buf = Vec::new();
                    let r = write_message(spec, payload, opts, &mut buf)?;
                    if r.is_ok() {
                        writeln!(out, "{}", head.json(&buf))?;
                    }
                    r
                } else {
                    head.text(out, &format!("{} bytes", payload.len()))?;
                    write_message(spec, payload, opts, out)?
                };
                match result {
                    Ok(()) => summary.messages += 1,
                    Err(e) => {
                        out.flush()?;
                        eprintln!(
                            "isoswitch decode: frame {} (connection {} {}, stream offset {}): {e}",
                            n + 1,
                            c.number,
                            direction(f.from_client),
                            f.frame.offset
                        );
                        summary.errors += 1;
                    }
                }
            }
            Frame::KeepAlive => {
                summary.keep_alives += 1;
                if !opts.json {
                    head.text(out, "keep-alive")?;
                }
            }
            Frame::SessionControl(p) => {
                if !opts.json {
                    head.text(out, &format!("session control, {} bytes", p.len()))?;
                }
            }
        }
    }
    Ok(summary)
}

fn direction(from_client: bool) -> &'static str {
    if from_client {
        "client->server"
    } else {
        "server->client"
    }
}

struct Head {
    number: usize,
    at: Duration,
    conn: usize,
    from_client: bool,
    src: SocketAddr,
    dst: SocketAddr,
    offset: usize,
}

impl Head {
    fn text(&self, out: &mut impl Write, what: &str) -> io::Result<()> {
        writeln!(
            out,
            "#{} {} conn {} {} {} -> {} stream offset {}: {what}",
            self.number,
            utc(self.at),
            self.conn,
            direction(self.from_client),
            self.src,
            self.dst,
            self.offset
        )
    }

    /// The message's JSON object with the capture's keys added.
    fn json(&self, message_line: &[u8]) -> String {
        let mut v: serde_json::Value =
            serde_json::from_slice(message_line).unwrap_or(serde_json::Value::Null);
        if let Some(obj) = v.as_object_mut() {
            obj.insert("time".into(), utc(self.at).into());
            obj.insert("conn".into(), self.conn.into());
            obj.insert("direction".into(), direction(self.from_client).into());
            obj.insert("src".into(), self.src.to_string().into());
            obj.insert("dst".into(), self.dst.to_string().into());
        }
        v.to_string()
    }
}

/// `2026-12-03T03:15:00.123456Z`.
pub fn utc(at: Duration) -> String {
    let secs = at.as_secs();
    let (y, m, d) = crate::iso8583::civil_from_days(secs / 86_400);
    let s = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        at.subsec_micros()
    )
}
