//! `isoswitch ctl`: the admin API from a shell. Tables for people, `--json`
//! for scripts. The token comes from `ISOSWITCH_ADMIN_TOKEN`. An
//! `https://` admin URL is reached over TLS, verified against `--tls-ca`
//! (with `--tls-cert`/`--tls-key` where the admin wants client
//! certificates).

use std::process::ExitCode;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::ops::saf::{SafEntryView, SafQuery};
use crate::ops::status::{ConnectionView, Status};

#[derive(Debug, clap::Args)]
pub struct CtlArgs {
    /// The admin listener: `http://HOST:PORT` or `https://HOST:PORT`.
    #[arg(long, default_value = "http://127.0.0.1:9090")]
    pub admin: String,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The admin token. Prefer the environment variable: a flag shows in
    /// the process list.
    #[arg(long, env = "ISOSWITCH_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    #[command(subcommand)]
    pub command: CtlCommand,
    /// For an `https://` admin: --tls-ca, and --tls-cert/--tls-key for a
    /// client certificate; --tls-server-name defaults to the URL's host.
    #[command(flatten)]
    pub tls: crate::tls::tools::TlsFlags,
}

#[derive(Debug, clap::Subcommand)]
pub enum CtlCommand {
    /// Services, nodes and links with their counters.
    Status,
    /// The connection table.
    Conns,
    /// No new requests to NODE; its in-flight requests finish.
    Drain { service: String, node: String },
    /// NODE out of service: no new requests; its in-flight requests finish
    /// up to their deadlines.
    Disable { service: String, node: String },
    /// NODE out of service now: its in-flight requests are declined at once,
    /// and those the host may have approved get timeout reversals.
    ForceOffline { service: String, node: String },
    /// NODE takes traffic again (through slow start).
    Enable { service: String, node: String },
    /// Adds a node at runtime.
    AddNode {
        service: String,
        node: String,
        address: std::net::SocketAddr,
        #[arg(long, default_value_t = 1)]
        weight: u32,
        #[arg(long, default_value_t = 0)]
        priority: u32,
    },
    /// Drains NODE, then removes it.
    RemoveNode { service: String, node: String },
    /// Re-reads the config file the switch started with.
    Reload,
    /// The store-and-forward queue (reversals and advices the switch owes):
    /// lists entries, newest first; `retry` and `drop` act on one.
    Saf {
        /// pending, dead, delivered, dropped or all.
        #[arg(long, default_value = "pending")]
        state: String,
        /// Only this service's entries.
        #[arg(long)]
        service: Option<String>,
        /// At most this many entries (1..=1000).
        #[arg(long, default_value_t = crate::ops::saf::DEFAULT_LIMIT)]
        limit: usize,
        #[command(subcommand)]
        action: Option<SafAction>,
    },
    /// Probes /healthz (or /readyz): exit status 0 when it answers 200.
    ///
    /// /healthz: the process answers. /readyz: every service has a healthy
    /// node and every link set is signed on; the reason is printed when not.
    /// No token needed while those paths are open (admin.open_paths): the
    /// container image's HEALTHCHECK, in an image without curl.
    Health {
        /// Probe /readyz instead of /healthz.
        #[arg(long)]
        ready: bool,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum SafAction {
    /// Makes entry ID due now (a dead letter comes back pending).
    Retry { id: String },
    /// Gives entry ID up: it is never delivered. The reason is stored with
    /// it and logged with your address.
    Drop {
        id: String,
        #[arg(long)]
        reason: String,
    },
}

/// An HTTP error or an unreachable admin listener.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("--admin {0}: expected http://HOST:PORT or https://HOST:PORT")]
    BadUrl(String),
    #[error("--admin {0}: https needs --tls-ca (the CA of the admin's certificate)")]
    NoCa(String),
    /// The admin listener at `admin` could not be reached.
    #[error("{admin}: {}{source}", .step.prefix())]
    Io {
        admin: String,
        step: IoStep,
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed once connected.
    #[error("{source}")]
    Http {
        step: HttpStep,
        #[source]
        source: hyper::Error,
    },
    /// The request could not be built (a method, path or token that is no
    /// valid HTTP).
    #[error("{0}")]
    Request(#[source] hyper::http::Error),
    /// A 2xx answer that is not the JSON the command reads.
    #[error("unexpected answer: {0}")]
    Answer(#[source] serde_json::Error),
    #[error("HTTP {status}: {body}")]
    Status { status: u16, body: String },
    /// A flag or argument refused before any request, in the switch's own
    /// words (they name the parameter: state, limit, service, id).
    #[error(transparent)]
    Usage(#[from] crate::ops::saf::SafInputError),
    #[error(transparent)]
    Tls(#[from] crate::tls::tools::TlsFlagsError),
}

/// What ctl was doing when the admin listener could not be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoStep {
    /// The TCP connection (or reading its peer address).
    Connect,
    /// The TLS handshake of an `https://` admin.
    TlsHandshake,
}

impl IoStep {
    fn prefix(self) -> &'static str {
        match self {
            IoStep::Connect => "",
            IoStep::TlsHandshake => "TLS: ",
        }
    }
}

/// Which part of the HTTP exchange failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpStep {
    Handshake,
    Send,
    ReadBody,
}

/// One request to the admin API: `(status, body)`.
pub async fn request(
    admin: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<String>,
) -> Result<(u16, String), CtlError> {
    request_tls(admin, None, method, path, token, body).await
}

/// The host:port of an admin URL, and whether it is `https`.
fn authority(admin: &str) -> Result<(&str, bool), CtlError> {
    let (rest, https) = match admin.strip_prefix("https://") {
        Some(rest) => (rest, true),
        None => (admin.strip_prefix("http://").unwrap_or("/"), false),
    };
    let a = rest.trim_end_matches('/');
    if a.is_empty() || a.contains('/') {
        return Err(CtlError::BadUrl(admin.to_string()));
    }
    Ok((a, https))
}

/// The host of `host:port` (`[v6]:port` too), the name a TLS admin's
/// certificate must carry unless --tls-server-name says otherwise.
fn host_of(authority: &str) -> &str {
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// [`request`] over TLS when `admin` is `https://` (`tls` then required).
pub async fn request_tls(
    admin: &str,
    tls: Option<&crate::tls::tools::Connector>,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<String>,
) -> Result<(u16, String), CtlError> {
    let (authority, https) = authority(admin)?;
    let io = |step| {
        move |source| CtlError::Io {
            admin: admin.to_string(),
            step,
            source,
        }
    };
    let http = |step| move |source| CtlError::Http { step, source };
    let tcp = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(io(IoStep::Connect))?;
    let tls = match (https, tls) {
        (false, _) => None,
        (true, Some(t)) => Some(t),
        (true, None) => return Err(CtlError::NoCa(admin.to_string())),
    };
    let peer = tcp.peer_addr().map_err(io(IoStep::Connect))?;
    let stream = crate::tls::tools::secure_connect(tls, tcp, peer)
        .await
        .map_err(io(IoStep::TlsHandshake))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http(HttpStep::Handshake))?;
    let driver = tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, authority);
    if let Some(t) = token {
        req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    if body.is_some() || !matches!(method, "GET" | "HEAD") {
        // The switch takes a change only as JSON, body or not (no browser can
        // send that cross-site without asking first).
        req = req.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(CtlError::Request)?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(http(HttpStep::Send))?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(http(HttpStep::ReadBody))?
        .to_bytes();
    driver.abort();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

pub fn run(args: &CtlArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("isoswitch ctl: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(execute(args)) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("isoswitch ctl: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one ctl command; returns what to print.
pub async fn execute(args: &CtlArgs) -> Result<String, CtlError> {
    let node_path = |s: &str, n: &str, a: &str| format!("/api/v1/services/{s}/nodes/{n}/{a}");
    let (method, path, body) = match &args.command {
        CtlCommand::Status => ("GET", "/api/v1/status".to_string(), None),
        CtlCommand::Conns => ("GET", "/api/v1/connections".to_string(), None),
        CtlCommand::Drain { service, node } => ("POST", node_path(service, node, "drain"), None),
        CtlCommand::Disable { service, node } => {
            ("POST", node_path(service, node, "disable"), None)
        }
        CtlCommand::ForceOffline { service, node } => {
            ("POST", node_path(service, node, "force-offline"), None)
        }
        CtlCommand::Enable { service, node } => ("POST", node_path(service, node, "enable"), None),
        CtlCommand::AddNode {
            service,
            node,
            address,
            weight,
            priority,
        } => (
            "POST",
            format!("/api/v1/services/{service}/nodes"),
            Some(
                serde_json::json!({"id": node, "address": address.to_string(), "weight": weight, "priority": priority})
                    .to_string(),
            ),
        ),
        CtlCommand::RemoveNode { service, node } => (
            "DELETE",
            format!("/api/v1/services/{service}/nodes/{node}"),
            None,
        ),
        CtlCommand::Reload => ("POST", "/api/v1/reload".to_string(), None),
        CtlCommand::Saf {
            state,
            service,
            limit,
            action,
        } => saf_request(state, service.as_deref(), *limit, action.as_ref())?,
        CtlCommand::Health { ready: false } => ("GET", "/healthz".to_string(), None),
        CtlCommand::Health { ready: true } => ("GET", "/readyz".to_string(), None),
    };
    let tls = connector(args)?;
    let token = args.token.as_deref();
    let (status, text) =
        request_tls(&args.admin, tls.as_deref(), method, &path, token, body).await?;
    if !(200..300).contains(&status) {
        return Err(CtlError::Status { status, body: text });
    }
    if args.json {
        return Ok(format!("{text}\n"));
    }
    let parse_err = CtlError::Answer;
    Ok(match args.command {
        CtlCommand::Status => status_table(&serde_json::from_str(&text).map_err(parse_err)?),
        CtlCommand::Conns => {
            let rows: Vec<ConnectionView> = serde_json::from_str(&text).map_err(parse_err)?;
            conns_table(&rows)
        }
        CtlCommand::Reload => {
            let report: crate::ops::reload::ReloadReport =
                serde_json::from_str(&text).map_err(parse_err)?;
            format!("{report}\n")
        }
        CtlCommand::Health { .. } => format!("{}\n", text.trim_end()),
        CtlCommand::Saf { action: None, .. } => {
            let rows: Vec<SafEntryView> = serde_json::from_str(&text).map_err(parse_err)?;
            saf_table(&rows)
        }
        _ => format!("{text}\n"),
    })
}

/// The request `ctl saf` makes: a listing, or an action on one entry.
fn saf_request(
    state: &str,
    service: Option<&str>,
    limit: usize,
    action: Option<&SafAction>,
) -> Result<(&'static str, String, Option<String>), CtlError> {
    let entry = |id: &str| {
        crate::ops::saf::parse_id(id)
            .map(|id| id.0)
            .map_err(CtlError::Usage)
    };
    Ok(match action {
        None => {
            let mut query = format!("state={state}&limit={limit}");
            if let Some(s) = service {
                query.push_str(&format!("&service={s}"));
            }
            // Refused here with the switch's own words, before any request.
            let query = SafQuery::parse(Some(&query))?;
            ("GET", format!("/api/v1/saf?{}", query.to_query()), None)
        }
        Some(SafAction::Retry { id }) => {
            ("POST", format!("/api/v1/saf/{}/retry", entry(id)?), None)
        }
        Some(SafAction::Drop { id, reason }) => (
            "POST",
            format!("/api/v1/saf/{}/drop", entry(id)?),
            Some(serde_json::json!({ "reason": reason }).to_string()),
        ),
    })
}

/// Entries as a table; times as the API gives them (UTC).
fn saf_table(rows: &[SafEntryView]) -> String {
    let mut out = format!(
        "{:>6} {:<8} {:<8} {:<4} {:<9} {:<6} {:<6} {:<12} {:<19} {:>5} {:<24} {:<24} {}\n",
        "ID",
        "SERVICE",
        "KIND",
        "MTI",
        "STATE",
        "TO",
        "F11",
        "F37",
        "PAN",
        "TRIES",
        "NEXT-ATTEMPT",
        "CREATED",
        "LAST-ERROR/REASON"
    );
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    for r in rows {
        let to = match r.direction.as_str() {
            "to_peer" => "peer".to_string(),
            "to_any_node" => "any".to_string(),
            _ => dash(&r.node),
        };
        let note = r
            .reason
            .as_ref()
            .or(r.last_error.as_ref())
            .or(r.answer.as_ref());
        out.push_str(&format!(
            "{:>6} {:<8} {:<8} {:<4} {:<9} {:<6} {:<6} {:<12} {:<19} {:>5} {:<24} {:<24} {}\n",
            r.id,
            r.service,
            r.kind,
            r.mti,
            r.state,
            to,
            dash(&r.f11),
            dash(&r.f37),
            dash(&r.pan_masked),
            r.attempts,
            r.next_attempt_at,
            r.created_at,
            note.map_or("-", String::as_str)
        ));
    }
    out
}

/// The status as a table, one block per service.
/// The TLS client of an `https://` admin URL: the flags, the server name
/// defaulting to the URL's host.
fn connector(args: &CtlArgs) -> Result<Option<Arc<crate::tls::tools::Connector>>, CtlError> {
    let (authority, https) = authority(&args.admin)?;
    if !https {
        return Ok(None);
    }
    let mut flags = args.tls.clone();
    if flags.tls_ca.is_none() {
        return Err(CtlError::NoCa(args.admin.clone()));
    }
    if flags.tls_server_name.is_none() {
        flags.tls_server_name = Some(host_of(authority).to_string());
    }
    Ok(flags.client()?)
}

pub fn status_table(status: &Status) -> String {
    let mut out = String::new();
    for s in &status.services {
        let declined: u64 = s.declined.values().sum();
        out.push_str(&format!(
            "{} ({} {}): requests {} answered {} declined {} in_flight {} late {} clients {}\n",
            s.name,
            s.front,
            s.front_address,
            s.requests,
            s.answered,
            declined,
            s.in_flight,
            s.late_responses,
            s.clients
        ));
        let refused: Vec<String> = s
            .refused
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(why, n)| format!("{why} {n}"))
            .collect();
        if !refused.is_empty() {
            out.push_str(&format!("  clients refused: {}\n", refused.join(", ")));
        }
        let i = &s.integrity;
        if let Some(q) = &i.saf {
            out.push_str(&format!(
                "  saf: pending {} (reversals {}, advices {}, {} in attempt) oldest {:.0}s dead letters {}\n",
                q.pending, q.reversals_pending, q.advices_pending, q.in_flight, q.oldest_age_s, q.dead_letters
            ));
        }
        if i.late_reversed + i.late_logged + i.late_unreversed > 0 {
            out.push_str(&format!(
                "  late approvals: reversed {} logged {} not reversed {}; reversals sent {} acknowledged {}\n",
                i.late_reversed, i.late_logged, i.late_unreversed, i.reversals_sent, i.reversals_acknowledged
            ));
        }
        if let Some(l) = &s.links {
            out.push_str(&format!(
                "  links {}/{} up, {} signed on, {} in links\n",
                l.up, l.links, l.signed_on, l.in_links
            ));
        }
        out.push_str(&format!(
            "  {:<6} {:<21} {:<9} {:>7} {:>5} {:>9} {:>9} {:>9} {:>7} {:>8}\n",
            "NODE",
            "ADDRESS",
            "STATE",
            "WEIGHT",
            "CONNS",
            "IN-FLIGHT",
            "SENT",
            "ANSWERED",
            "FAILED",
            "EWMA-MS"
        ));
        for n in &s.nodes {
            out.push_str(&format!(
                "  {:<6} {:<21} {:<9} {:>7} {:>5} {:>9} {:>9} {:>9} {:>7} {:>8.1}\n",
                n.id,
                n.address,
                n.state,
                format!("{}/{}", n.effective_weight, n.weight),
                n.connections,
                n.in_flight,
                n.sent,
                n.answered,
                n.failed,
                n.latency_ewma_ms
            ));
        }
    }
    for c in &status.tls {
        out.push_str(&format!(
            "tls {} {}: {} expires in {}d ({})\n",
            c.service,
            c.link,
            c.subject,
            c.expires_in_s.div_euclid(86_400),
            c.key
        ));
    }
    out
}

fn conns_table(conns: &[ConnectionView]) -> String {
    let mut out = format!(
        "{:>6} {:<8} {:<9} {:<5} {:<21} {:<21} {:>9} {:>9} {:>9} {:>9} {:>9} {}\n",
        "ID",
        "SERVICE",
        "KIND",
        "NODE",
        "PEER",
        "LOCAL",
        "AGE-MS",
        "MSGS-IN",
        "MSGS-OUT",
        "IN-FLIGHT",
        "IDLE-MS",
        "TLS"
    );
    for c in conns {
        out.push_str(&format!(
            "{:>6} {:<8} {:<9} {:<5} {:<21} {:<21} {:>9} {:>9} {:>9} {:>9} {:>9} {}\n",
            c.id,
            c.service,
            c.kind,
            c.node.as_deref().unwrap_or("-"),
            c.peer,
            c.local,
            c.age_ms,
            c.messages_in,
            c.messages_out,
            c.in_flight
                .map_or_else(|| "-".to_string(), |n| n.to_string()),
            c.idle_ms,
            c.tls.as_ref().map_or_else(
                || "-".to_string(),
                |t| format!(
                    "{} {} {}",
                    t.version,
                    t.cipher,
                    t.peer_subject
                        .as_deref()
                        .unwrap_or("(no client certificate)")
                )
            )
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::saf::SafInputError;

    fn status(refused: &str) -> Status {
        let json = format!(
            r#"{{"restarts": 0, "services": [{{"name": "atm", "front": "listen",
            "front_address": "127.0.0.1:6000", "requests": 1, "answered": 1,
            "declined": {{}}, "refused": {refused}, "in_flight": 0,
            "late_responses": 0, "unknown_responses": 0, "bad_messages": 0,
            "bad_frames": 0, "clients": 27, "nodes": []}}]}}"#
        );
        serde_json::from_str(&json).expect("a status")
    }

    #[test]
    fn refused_clients_show_by_reason_only_when_there_are_some() {
        let table = status(r#"{"descriptors": 73, "shutdown": 0}"#);
        let table = status_table(&table);
        assert!(
            table.contains("clients refused: descriptors 73\n"),
            "{table}"
        );
        let quiet = status_table(&status(r#"{"descriptors": 0}"#));
        assert!(!quiet.contains("refused"), "{quiet}");
    }

    #[tokio::test]
    async fn an_unreachable_admin_is_an_io_error_naming_it_and_the_step() {
        // A port just bound and released: nothing listens there.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let admin = format!("http://{addr}");
        let e = request(&admin, "GET", "/healthz", None, None)
            .await
            .expect_err("nothing listens");
        let CtlError::Io { step, source, .. } = &e else {
            panic!("not an I/O error: {e:?}");
        };
        assert_eq!(*step, IoStep::Connect);
        assert_eq!(e.to_string(), format!("{admin}: {source}"));
        let parse = serde_json::from_str::<Status>("{").expect_err("not JSON");
        let shown = parse.to_string();
        assert_eq!(
            CtlError::Answer(parse).to_string(),
            format!("unexpected answer: {shown}")
        );
    }

    #[test]
    fn saf_requests_are_built_and_bad_flags_refused_before_sending() {
        let (m, path, body) = saf_request("dead", Some("pos"), 5, None).expect("list");
        assert_eq!(
            (m, path.as_str(), body),
            ("GET", "/api/v1/saf?state=dead&limit=5&service=pos", None)
        );
        let drop = SafAction::Drop {
            id: "#12".into(),
            reason: "booked \"by hand\"".into(),
        };
        let (m, path, body) = saf_request("pending", None, 100, Some(&drop)).expect("drop");
        assert_eq!((m, path.as_str()), ("POST", "/api/v1/saf/12/drop"));
        let sent: serde_json::Value = serde_json::from_str(&body.expect("a body")).expect("json");
        assert_eq!(sent["reason"], "booked \"by hand\"");
        let retry = SafAction::Retry { id: "x".into() };
        assert!(matches!(
            saf_request("pending", None, 1, Some(&retry)),
            Err(CtlError::Usage(SafInputError::Id(_)))
        ));
        assert!(matches!(
            saf_request("lost", None, 1, None),
            Err(CtlError::Usage(SafInputError::State(_)))
        ));
        assert!(matches!(
            saf_request("all", None, 0, None),
            Err(CtlError::Usage(SafInputError::Limit(_)))
        ));
    }

    #[test]
    fn saf_entries_show_as_a_table() {
        let json = r#"[{"id": 7, "service": "pos", "direction": "to_node", "node": "02",
            "kind": "reversal", "mti": "0420", "f11": "000123", "f37": null, "f7": null,
            "pan_masked": "476173******0119", "attempts": 3,
            "next_attempt_at": "2026-12-04T12:00:00.000Z", "state": "pending",
            "last_error": "no answer", "created_at": "2026-12-04T11:59:00.000Z",
            "expires_at": "2026-12-05T11:59:00.000Z"}]"#;
        let rows: Vec<SafEntryView> = serde_json::from_str(json).expect("rows");
        let table = saf_table(&rows);
        let line = table.lines().nth(1).expect("a row");
        for part in [
            "7 pos",
            "reversal",
            "0420",
            "pending",
            "02",
            "476173******0119",
            "no answer",
        ] {
            assert!(line.contains(part), "{part}: {table}");
        }
    }
}
