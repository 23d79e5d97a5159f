//! `isoswitch sim ...`: the simulators' command lines (channel node, POS
//! network controller, UnionPay; VISA's is in `visa`). Built with the
//! `tools` feature only, like the simulators themselves.

pub mod visa;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Subcommand;

use super::{fail, runtime};
use crate::iso8583::{Spec, SpecFiles};

#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// A channel node answering requests per spec.
    Node {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        spec: String,
        #[arg(long, default_value = "01")]
        id: String,
        /// `5ms` or a uniform range `0..2s`.
        #[arg(long, default_value = "0ms")]
        delay: String,
        /// Share of requests left unanswered, 0..=1.
        #[arg(long, default_value_t = 0.0)]
        fail_rate: f64,
        /// Echo no usable key: answers carry F11 `000000`, a blank F41 and a
        /// zero F37 (a host only a `oneconnect` front can serve).
        #[arg(long)]
        no_key: bool,
        /// Also send this many node-originated 0200s per second (acquirer
        /// traffic to UnionPay through a simplex service).
        #[arg(long)]
        originate: Option<f64>,
        /// Wait this long before the first node-originated request (lets
        /// every switch instance connect first: a response routed by F37
        /// needs a live connection from the instance it lands on).
        #[arg(long, default_value = "0s", value_parser = crate::util::duration::parse)]
        originate_after: Duration,
        /// The first STAN of its own, within the node's range (1..=99999:
        /// node 03 sends 300000 + this, onwards). A node run again within
        /// the switch's duplicate window starts past the last run's STANs,
        /// or its requests are (rightly) duplicates of those.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=99_999))]
        stan_from: u32,
        /// Share of approvals (0100/0200 answered 00) answered late, each
        /// recorded: the switch should reverse every one (0..=1).
        #[arg(long, default_value_t = 0.0)]
        late_share: f64,
        /// How much later than `--delay` a late approval is answered (past
        /// the switch's timeout).
        #[arg(long, default_value = "0s", value_parser = crate::util::duration::parse)]
        late_by: Duration,
        /// Approve partially: F39 10, half the amount asked in F4, an F38
        /// of the node's own; each late one is recorded, and its reversal
        /// must name that F38 and the amount approved.
        #[arg(long)]
        partial: bool,
        /// Leave the first N reversal messages of each chain unanswered, so
        /// the switch repeats them as 0421.
        #[arg(long, default_value_t = 0)]
        ignore_reversals: u32,
        /// Leave every original advice (0120/0220) unacknowledged and
        /// acknowledge its repeats (0121/0221), so a switch storing advices
        /// has to repeat each one, to this node or another.
        #[arg(long)]
        ignore_advice_originals: bool,
        /// F39 of the answers to each reversal chain's messages in turn,
        /// the last for the rest (`96,96,00`: two system errors, then done).
        #[arg(long, value_delimiter = ',')]
        reversal_answers: Vec<String>,
        /// Leave the first N advice messages of each transaction
        /// unanswered, so the switch repeats them as 0221 / 0121.
        #[arg(long, default_value_t = 0)]
        ignore_advices: u32,
        /// The late answers (`--late-share`) decline (F39 05) instead of
        /// approving: the switch must reverse none of them.
        #[arg(long)]
        late_declines: bool,
        /// Send an 0820 key request (F70 101) this often, on the node's
        /// connections in turn; each answer must come back within 10 s.
        #[arg(long, value_parser = crate::util::duration::parse)]
        key_request_every: Option<Duration>,
        /// Print the final counters as one JSON object.
        #[arg(long)]
        json: bool,
        /// Accept TLS (--tls-cert, --tls-key; --tls-ca requires client
        /// certificates).
        #[command(flatten)]
        tls: crate::tls::tools::TlsFlags,
    },
    /// A POS network controller: terminals over uplinks, checking every answer.
    Nac {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long, default_value = "cup-pos")]
        spec: String,
        #[arg(long, default_value_t = 2)]
        uplinks: usize,
        #[arg(long, default_value_t = 50)]
        terminals: usize,
        /// Total requests per second (default: as fast as answered).
        #[arg(long)]
        rate: Option<f64>,
        #[arg(long, default_value = "10s", value_parser = crate::util::duration::parse)]
        duration: Duration,
        #[arg(long, default_value = "3s", value_parser = crate::util::duration::parse)]
        timeout: Duration,
        /// First two digits of every terminal ID: tells NACs apart.
        #[arg(long, default_value_t = 1)]
        nac_id: u8,
        /// Share of transactions sent as advices (0220, expecting 0230), 0..=1.
        #[arg(long, default_value_t = 0.0)]
        advice_share: f64,
        /// Repeats (0221) of an advice unacknowledged within --timeout, at most.
        #[arg(long, default_value_t = 3)]
        advice_repeats: u32,
        /// Each terminal signs in (0800) at its start and then this often.
        #[arg(long, value_parser = crate::util::duration::parse)]
        sign_in_every: Option<Duration>,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Connect over TLS (--tls-ca; --tls-cert/--tls-key for mutual TLS).
        #[command(flatten)]
        tls: crate::tls::tools::TlsFlags,
    },
    /// UnionPay on a simplex link set: accepts the switch's out links, opens
    /// in links to it, answers member requests and originates its own.
    Cups {
        /// Where the switch's out links connect.
        #[arg(long)]
        accept: SocketAddr,
        /// The switch's in-link listener.
        #[arg(long)]
        connect: SocketAddr,
        /// Another instance's in-link listener (repeatable): in links are
        /// spread over `--connect` and these, member answers go out on any
        /// of them, sign-on answers to the instance that asked.
        #[arg(long)]
        also_connect: Vec<SocketAddr>,
        /// In links to open (out links accepted: up to 4x this).
        #[arg(long, default_value_t = 2)]
        links: usize,
        #[arg(long, default_value = "cups")]
        spec: String,
        /// Issuer requests per second UnionPay originates (default: none).
        #[arg(long)]
        rate: Option<f64>,
        #[arg(long, default_value = "10s", value_parser = crate::util::duration::parse)]
        duration: Duration,
        #[arg(long, default_value = "3s", value_parser = crate::util::duration::parse)]
        timeout: Duration,
        /// Keep-alive on an in link idle this long (0s = never).
        #[arg(long, default_value = "30s", value_parser = crate::util::duration::parse)]
        keepalive_idle: Duration,
        /// Delay before answering a member request: `5ms` or `0..2s`.
        #[arg(long, default_value = "0ms")]
        delay: String,
        /// Leave member requests unanswered (exercises the switch's timeouts).
        #[arg(long)]
        no_answer: bool,
        /// Refuse (count, never answer) any frame on an out link before that
        /// link's sign-on 0820 F70 001 is answered.
        #[arg(long)]
        require_sign_on: bool,
        /// Wait this long before answering a sign-on.
        #[arg(long, default_value = "0ms", value_parser = crate::util::duration::parse)]
        sign_on_delay: Duration,
        /// Close every out link at once this often (chaos).
        #[arg(long, value_parser = crate::util::duration::parse)]
        drop_out_links_every: Option<Duration>,
        /// Share of member requests it approves answered late, each recorded:
        /// the switch should reverse every one (0..=1).
        #[arg(long, default_value_t = 0.0)]
        late_share: f64,
        /// How much later than `--delay` a late approval is answered.
        #[arg(long, default_value = "0s", value_parser = crate::util::duration::parse)]
        late_by: Duration,
        /// Leave the first N reversal messages of each chain unanswered.
        #[arg(long, default_value_t = 0)]
        ignore_reversals: u32,
        /// Advices of its own per second, on in links (acknowledgements are
        /// expected on out links).
        #[arg(long)]
        advice_rate: Option<f64>,
        /// MTI of those advices: 0120, 0220 or 0420 (repeatable: used in turn).
        #[arg(long, default_values_t = vec!["0220".to_string()])]
        advice_mti: Vec<String>,
        /// Repeats (0221, 0421) of an advice unacknowledged within --timeout.
        #[arg(long, default_value_t = 3)]
        advice_repeats: u32,
        /// Start a key reset (0800 F70 101) on an in link this often.
        #[arg(long, value_parser = crate::util::duration::parse)]
        key_reset_every: Option<Duration>,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// TLS on both directions: --tls-cert/--tls-key presented to the
        /// switch's out links and on the in links, --tls-ca verifying the
        /// switch (and requiring its client certificate on out links).
        #[command(flatten)]
        tls: crate::tls::tools::TlsFlags,
    },
    /// VISA on BASE I duplex links: takes (or dials) the bank's links, signs
    /// on, answers the bank's requests on another link, sends its own.
    Visa(visa::SimVisaArgs),
    /// A card network on duplex links, by its dialect (`--dialect
    /// visa-base1` is `sim visa`; `--dialect mastercard` waits for the
    /// member's group sign-on on each link, with no header): answers the
    /// bank's requests on another link, sends its own, books reversals.
    Network(visa::SimVisaArgs),
}

/// Runs one simulator until its duration ends or Ctrl-C.
pub fn run(sim: SimCommand) -> ExitCode {
    match sim {
        SimCommand::Visa(args) | SimCommand::Network(args) => visa::run(args),
        SimCommand::Node {
            listen,
            spec,
            id,
            delay,
            fail_rate,
            no_key,
            originate,
            originate_after,
            stan_from,
            late_share,
            late_by,
            partial,
            ignore_reversals,
            ignore_advice_originals,
            reversal_answers,
            ignore_advices,
            late_declines,
            key_request_every,
            json,
            tls,
        } => {
            let tls = match tls.server() {
                Ok(t) => t,
                Err(e) => return fail(e.to_string()),
            };
            let spec = match resolve_spec(&spec) {
                Ok(s) => s,
                Err(code) => return code,
            };
            let delay = match parse_delay(&delay) {
                Ok(d) => d,
                Err(code) => return code,
            };
            if !(0.0..=1.0).contains(&fail_rate) {
                return fail("--fail-rate must be within 0..=1".into());
            }
            if !(0.0..=1.0).contains(&late_share) {
                return fail("--late-share must be within 0..=1".into());
            }
            if key_request_every.is_some_and(|d| d.is_zero()) {
                return fail("--key-request-every must be more than 0s".into());
            }
            // Node IDs made of digits give disjoint STAN ranges: 01 → 100001..
            let stan_base = id.parse::<u32>().map_or(0, |n| (n % 10) * 100_000);
            let originate = originate.map(|rate| crate::sim::node::Originate {
                mti: "0200".into(),
                rate,
                stan_base,
                timeout: Duration::from_secs(10),
            });
            let finance = crate::sim::node::Finance {
                late: (late_share > 0.0).then_some(crate::sim::ledger::LateApprovals {
                    share: late_share,
                    by: late_by,
                }),
                partial,
                ignore_reversals,
                ignore_advice_originals,
                reversal_answers,
                ignore_advices,
                late_declines,
                key_requests: key_request_every.map(|every| crate::sim::node::KeyRequests {
                    every,
                    timeout: Duration::from_secs(10),
                    stan_base,
                }),
            };
            let cfg = crate::sim::node::NodeSimConfig {
                id,
                delay,
                fail_rate,
                originate,
            };
            runtime::<_, String>(async move {
                let opts = crate::sim::node::NodeOptions { no_key };
                let node =
                    crate::sim::node::NodeSim::start_tls(listen, spec, cfg, opts, finance, tls)
                        .await
                        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
                eprintln!("sim node listening on {}", node.addr);
                node.stans_from(stan_from);
                let holding = !originate_after.is_zero();
                if holding {
                    node.stop_originating();
                }
                let ctrl_c = tokio::signal::ctrl_c();
                tokio::pin!(ctrl_c);
                if holding {
                    tokio::select! {
                        _ = tokio::time::sleep(originate_after) => node.start_originating(),
                        _ = &mut ctrl_c => {}
                    }
                }
                if !holding || node.is_originating() {
                    let _ = ctrl_c.await;
                }
                // Stop originating, and let the answers to what was sent come
                // back (each is answered or times out within 10 s; key
                // requests stop too, and expire within 10 s as well).
                // On return every request sent is counted as outstanding.
                node.stop_originating();
                let settle = tokio::time::Instant::now() + Duration::from_secs(11);
                while node.outstanding() > 0 && tokio::time::Instant::now() < settle {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let stats = std::sync::Arc::clone(&node.stats);
                // Printed before stopping: `held` is what the node holds at the end.
                if json {
                    println!("{}", crate::sim::node::summary_json(&stats));
                } else {
                    println!("{}", crate::sim::node::summary(&stats));
                }
                node.stop().await;
                Ok(())
            })
        }
        SimCommand::Nac {
            connect,
            spec,
            uplinks,
            terminals,
            rate,
            duration,
            timeout,
            nac_id,
            advice_share,
            advice_repeats,
            sign_in_every,
            json,
            tls,
        } => {
            let tls = match tls.client() {
                Ok(t) => t,
                Err(e) => return fail(e.to_string()),
            };
            let spec = match resolve_spec(&spec) {
                Ok(s) => s,
                Err(code) => return code,
            };
            if !(0.0..=1.0).contains(&advice_share) {
                return fail("--advice-share must be within 0..=1".into());
            }
            if sign_in_every.is_some_and(|d| d.is_zero()) {
                return fail("--sign-in-every must be more than 0s".into());
            }
            let traffic = crate::sim::nac::NacTraffic {
                advice_share,
                advice_repeats,
                sign_in_every,
            };
            let cfg = crate::sim::nac::NacSimConfig {
                target: connect,
                nac_id,
                uplinks,
                terminals,
                rate,
                duration,
                timeout,
            };
            runtime::<_, String>(async move {
                let counters = Arc::new(crate::sim::nac::NacCounters::default());
                let report = crate::sim::nac::run_tls(spec, cfg, traffic, counters, tls)
                    .await
                    .map_err(|e| format!("cannot connect to {connect}: {e}"))?;
                print_report(&report, json);
                if report.mismatched > 0 || report.unanswered > 0 {
                    return Err("some requests were unanswered or mismatched".into());
                }
                if report.advices_unacknowledged > 0 || report.sign_ins_unanswered > 0 {
                    return Err("some advices or sign-ins were never answered".into());
                }
                Ok(())
            })
        }
        SimCommand::Cups {
            accept,
            connect,
            also_connect,
            links,
            spec,
            rate,
            duration,
            timeout,
            keepalive_idle,
            delay,
            no_answer,
            require_sign_on,
            sign_on_delay,
            drop_out_links_every,
            late_share,
            late_by,
            ignore_reversals,
            advice_rate,
            advice_mti,
            advice_repeats,
            key_reset_every,
            json,
            tls,
        } => {
            let tls = match tls.both() {
                Ok(t) => t,
                Err(e) => return fail(e.to_string()),
            };
            let spec = match resolve_spec(&spec) {
                Ok(s) => s,
                Err(code) => return code,
            };
            let delay = match parse_delay(&delay) {
                Ok(d) => d,
                Err(code) => return code,
            };
            if rate.is_some_and(|r| !(r.is_finite() && r >= 0.0)) {
                return fail("--rate must be a non-negative number".into());
            }
            if advice_rate.is_some_and(|r| !(r.is_finite() && r >= 0.0)) {
                return fail("--advice-rate must be a non-negative number".into());
            }
            if !(0.0..=1.0).contains(&late_share) {
                return fail("--late-share must be within 0..=1".into());
            }
            if key_reset_every.is_some_and(|d| d.is_zero()) {
                return fail("--key-reset-every must be more than 0s".into());
            }
            let mut advice_mtis = Vec::new();
            for text in &advice_mti {
                match text.parse::<crate::iso8583::Mti>() {
                    Ok(m) if crate::sim::cups::is_sendable_advice(m) => advice_mtis.push(m),
                    _ => return fail(format!("--advice-mti `{text}`: 0120, 0220 or 0420")),
                }
            }
            let cfg = crate::sim::cups::CupsSimConfig {
                rate,
                duration,
                timeout,
                keepalive_idle,
                answer_member_requests: !no_answer,
                delay,
                require_sign_on,
                sign_on_delay,
                drop_out_links_every,
                also_connect,
                late: (late_share > 0.0).then_some(crate::sim::ledger::LateApprovals {
                    share: late_share,
                    by: late_by,
                }),
                ignore_reversals,
                advice_rate,
                advice_mtis,
                advice_repeats,
                key_reset_every,
                tls,
                ..crate::sim::cups::CupsSimConfig::new(accept, connect, links)
            };
            runtime::<_, String>(async move {
                // Ctrl-C (SIGINT) ends the run early, with the usual report.
                let interrupted = async {
                    let _ = tokio::signal::ctrl_c().await;
                };
                let report = crate::sim::cups::run_until(spec, cfg, interrupted)
                    .await
                    .map_err(|e| {
                        if e.kind() == std::io::ErrorKind::InvalidInput {
                            e.to_string()
                        } else {
                            format!("cannot listen on {accept}: {e}")
                        }
                    })?;
                print_report(&report, json);
                if report.unsigned_frames > 0 {
                    return Err("frames arrived on an out link before its sign-on".into());
                }
                if report.mismatched > 0 || report.unanswered > 0 {
                    return Err("some requests were unanswered or mismatched".into());
                }
                if report.advices_unacknowledged > 0 || report.key_resets_unanswered > 0 {
                    return Err("some advices or key resets were never answered".into());
                }
                Ok(())
            })
        }
    }
}

/// A simulator's final report: its text line, or one JSON object.
fn print_report<R: std::fmt::Display + serde::Serialize>(report: &R, json: bool) {
    match serde_json::to_string(report) {
        Ok(text) if json => println!("{text}"),
        _ => println!("{report}"),
    }
}

/// A spec by built-in name or path, or the exit status after saying why not.
pub(super) fn resolve_spec(name: &str) -> Result<Arc<Spec>, ExitCode> {
    Spec::resolve(name)
        .map(Arc::new)
        .map_err(|e| fail(e.to_string()))
}

pub(super) fn parse_delay(text: &str) -> Result<crate::sim::node::Delay, ExitCode> {
    crate::sim::node::Delay::parse(text).map_err(|e| fail(format!("--delay: {e}")))
}
