//! `isoswitch sim visa` and `isoswitch sim network --dialect ...`: the card
//! network peer of a `connect` front (VISA, Mastercard), from the command
//! line. See [`crate::sim::visa`].

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use crate::iso8583::Mti;
use crate::sim::ledger::LateApprovals;
use crate::sim::visa::{Dial, VisaSimConfig};

#[derive(Debug, clap::Args)]
pub struct SimVisaArgs {
    /// Listen here for the bank's links (the switch's `connect` front dials).
    #[arg(long, conflicts_with = "connect", required_unless_present = "connect")]
    pub accept: Option<SocketAddr>,
    /// Dial the bank's links here instead.
    #[arg(long)]
    pub connect: Option<SocketAddr>,
    /// Links to dial (with --connect); with --accept, the links expected (up
    /// to 4x this are accepted at once).
    #[arg(long, default_value_t = 2)]
    pub links: usize,
    /// The network's dialect: `visa-base1` (VISA, the default) or
    /// `mastercard`, or a spec file of either's envelope.
    #[arg(long, visible_alias = "dialect", default_value = "visa-base1")]
    pub spec: String,
    /// Issuer requests per second for the bank's cards (default: none).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Stop after this many issuer requests (default: run for --duration).
    #[arg(long)]
    pub count: Option<u64>,
    /// MTIs of the issuer requests, used in turn.
    #[arg(long, default_value = "0100,0200", value_delimiter = ',')]
    pub mti: Vec<String>,
    /// Longest time issuer requests are sent.
    #[arg(long, default_value = "10s", value_parser = crate::util::duration::parse)]
    pub duration: Duration,
    /// A request unanswered this long counts as lost.
    #[arg(long, default_value = "3s", value_parser = crate::util::duration::parse)]
    pub timeout: Duration,
    /// Send issuer requests without signing links on first (VISA), or
    /// without waiting for the member's sign-on (Mastercard).
    #[arg(long)]
    pub no_sign_on: bool,
    /// Echo test (0800 F70 301) on each link this often (0s = never).
    #[arg(long, default_value = "60s", value_parser = crate::util::duration::parse)]
    pub echo_interval: Duration,
    /// Zero-length poll on a link idle this long (0s = never).
    #[arg(long, default_value = "30s", value_parser = crate::util::duration::parse)]
    pub keepalive_idle: Duration,
    /// Delay before answering a bank request: `5ms` or `0..2s`.
    #[arg(long, default_value = "0ms")]
    pub delay: String,
    /// Leave the bank's requests unanswered (exercises its timeouts).
    #[arg(long)]
    pub no_answer: bool,
    /// Share of the bank's requests it approves answered late, each booked:
    /// the switch should reverse every one toward VISA (0..=1).
    #[arg(long, default_value_t = 0.0)]
    pub late_share: f64,
    /// How much later than --delay a late approval is answered.
    #[arg(long, default_value = "0s", value_parser = crate::util::duration::parse)]
    pub late_by: Duration,
    /// Leave the first N reversal messages of each chain unanswered.
    #[arg(long, default_value_t = 0)]
    pub ignore_reversals: u32,
    /// Start a key exchange (0800 F70 161) this often, for --duration; the
    /// bank's key node must answer each.
    #[arg(long, value_parser = crate::util::duration::parse)]
    pub key_reset_every: Option<Duration>,
    /// F70 of those key exchanges.
    #[arg(long, default_value = crate::sim::visa::KEY_RESET_F70)]
    pub key_reset_f70: String,
    /// Print the report as one JSON object instead of a summary line.
    #[arg(long)]
    pub json: bool,
    /// TLS on the links: --tls-cert/--tls-key (and --tls-ca to require the
    /// bank's certificate) with --accept; --tls-ca (and a client
    /// certificate) with --connect.
    #[command(flatten)]
    pub tls: crate::tls::tools::TlsFlags,
}

pub fn run(args: SimVisaArgs) -> ExitCode {
    let spec = match super::resolve_spec(&args.spec) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let delay = match super::parse_delay(&args.delay) {
        Ok(d) => d,
        Err(code) => return code,
    };
    if args.rate.is_some_and(|r| !(r.is_finite() && r >= 0.0)) {
        return crate::cli::fail("--rate must be a non-negative number".into());
    }
    if !(0.0..=1.0).contains(&args.late_share) {
        return crate::cli::fail("--late-share must be within 0..=1".into());
    }
    let mut mtis = Vec::new();
    for text in &args.mti {
        match text.parse::<Mti>() {
            Ok(m) if m.is_request() && !m.is_network_management() => mtis.push(m),
            _ => {
                return crate::cli::fail(format!("--mti: `{text}` is not a financial request MTI"));
            }
        }
    }
    let dial = match (args.accept, args.connect) {
        (Some(a), _) => Dial::Accept(a),
        (None, Some(c)) => Dial::Connect(c),
        (None, None) => return crate::cli::fail("one of --accept or --connect is needed".into()),
    };
    let tls = match &dial {
        Dial::Accept(_) => args.tls.server().map(|server| crate::tls::tools::SimTls {
            server,
            client: None,
        }),
        Dial::Connect(_) => args.tls.client().map(|client| crate::tls::tools::SimTls {
            server: None,
            client,
        }),
    };
    let tls = match tls {
        Ok(t) => t,
        Err(e) => return crate::cli::fail(e.to_string()),
    };
    let cfg = VisaSimConfig {
        tls,
        rate: args.rate,
        count: args.count,
        mtis,
        duration: args.duration,
        timeout: args.timeout,
        sign_on: !args.no_sign_on,
        echo_interval: args.echo_interval,
        keepalive_idle: args.keepalive_idle,
        delay,
        answer_bank_requests: !args.no_answer,
        late: (args.late_share > 0.0).then_some(LateApprovals {
            share: args.late_share,
            by: args.late_by,
        }),
        ignore_reversals: args.ignore_reversals,
        key_reset_every: args.key_reset_every,
        key_reset_f70: args.key_reset_f70.clone(),
        ..VisaSimConfig::new(dial, args.links)
    };
    let json = args.json;
    crate::cli::runtime(async move {
        // Ctrl-C (SIGINT) ends the run early, with the usual report.
        let interrupted = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        let report = crate::sim::visa::run_until(spec, cfg, interrupted)
            .await
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::InvalidInput {
                    e.to_string()
                } else {
                    format!("cannot listen on {dial:?}: {e}")
                }
            })?;
        if json {
            println!("{}", report.to_json());
        } else {
            println!("{report}");
        }
        if !report.is_clean() {
            return Err(format!(
                "{} requests lost, {} answers doubled or crossed",
                report.lost(),
                report.doubled_or_crossed()
            ));
        }
        Ok(())
    })
}
