//! `isoswitch sim cups`: UnionPay's side of a split simplex link set.
//!
//! - **Out links** (the member writes, UnionPay reads): the simulator listens on
//!   `accept` and reads whatever the switch sends. `0820` network management and
//!   member requests are answered, and the answers go out **on an in link**,
//!   never on the connection the request came in on: a member answer on an in
//!   link drawn at random, a network-management answer on an in link of the
//!   switch instance that asked.
//!   Responses to the simulator's own requests are matched by F7 + F11 + F32 +
//!   F33 against what is outstanding.
//! - **In links** (UnionPay writes, the member reads): the simulator opens `links`
//!   connections to the switch's `connect` address, keeps them up (reconnecting
//!   after a short backoff), writes a `0000` keep-alive on any that has been idle
//!   for `keepalive_idle`, and originates issuer requests (`0100`) and echo tests
//!   (`0820` F70 `301`) on them.
//!
//! As the oracle of a financial switch's store and forward, it also
//!
//! - answers a share of the member requests it approves late and records
//!   them; reads the member's reversals (`0420`/`0421`) on out links,
//!   answers `0430` on an in link and books them per chain against those
//!   late approvals, as `sim node` does ([`crate::sim::ledger`]); acknowledges
//!   the member's advices (`0120`/`0220`) and counts their repeats;
//! - sends advices of its own (`0220`, or `0420` reversal advices) on in
//!   links at `advice_rate`, expects the `0230`/`0430` on an out link and
//!   repeats an unacknowledged one (`0221`/`0421`) after `timeout`;
//! - starts key resets (`0800` F70 `101`) every `key_reset_every`, expects the
//!   `0810` on an out link and counts its F39; and answers the member's key
//!   requests (`0820` F70 `1xx`) with `0830`, as any network management.
//!
//! Every queue and table is bounded, every wait has a deadline, and nothing read
//! from a socket can make it panic: a frame that does not parse is counted and
//! dropped; a length prefix that cannot be trusted closes that link only.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

mod links;
mod originate;
mod report;
mod saf;

pub use report::{CupsReport, CupsSimStats};

use originate::{
    IssuerTemplate, Originated, from_cups_envelope, originate, reset_keys, transmission_time,
};

use links::{InLink, OutLink, To, accept_out_links, close_links, drop_out_links, keep_in_link};

use crate::iso8583::{Message, Mti, Spec};
use crate::sim::answer;
use crate::sim::ledger::{LateApprovals, is_advice, is_approvable, is_key_management, is_reversal};
use crate::sim::node::Delay;
use crate::sim::original::OriginalKey;
use crate::sim::peer::{Outstanding, deadline_after};
use crate::util::rng::{Rng, entropy_seed};

/// UnionPay's institution ID (header source of what it sends, F33).
pub const CUPS_ID: &str = "00010000";

/// Frames queued per in link before senders see it as full.
const IN_LINK_QUEUE: usize = 4096;
/// Out links accepted beyond `links` x this are closed at once.
const OUT_LINKS_PER_IN_LINK: usize = 4;
/// How long `stop` waits for tasks before aborting them.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// What the simulated UnionPay does.
#[derive(Clone, Debug)]
pub struct CupsSimConfig {
    /// Where it listens for the switch's out links (port 0 for any).
    pub accept: SocketAddr,
    /// The switch's in-link listener it connects to.
    pub connect: SocketAddr,
    /// More in-link listeners (other switch instances of the same member):
    /// in link `i` goes to `[connect, also_connect..][i % n]`.
    pub also_connect: Vec<SocketAddr>,
    /// In links it opens and keeps open; it accepts up to 4 x this out links.
    pub links: usize,
    /// Issuer requests per second it originates; `None` or 0 = none.
    pub rate: Option<f64>,
    /// How long it originates requests (and how long [`run`] runs).
    pub duration: Duration,
    /// A request unanswered this long counts as unanswered; [`run`] waits this
    /// long for stragglers after `duration`.
    pub timeout: Duration,
    /// Sends a `0000` keep-alive on an in link it has not written for this long
    /// (zero = never).
    pub keepalive_idle: Duration,
    /// Answer member requests (`false` leaves them to the switch's timeouts).
    pub answer_member_requests: bool,
    /// How long it waits before answering a member request.
    pub delay: Delay,
    /// Refuse traffic on an out link before that link's sign-on: every frame
    /// (keep-alives too) read on it before the simulator's 0830 to its 0820
    /// F70 001 is dropped unanswered and counted in `unsigned_frames`, as
    /// UnionPay rejects traffic on a link that has not signed on.
    pub require_sign_on: bool,
    /// How long it waits before answering a sign-on 0820 (with
    /// `require_sign_on`): frames the switch writes before it has the 0830
    /// then arrive in this window and are caught.
    pub sign_on_delay: Duration,
    /// Closes every out link at once this often (chaos: all links lost).
    pub drop_out_links_every: Option<Duration>,
    /// A share of the member requests it approves answered late, each
    /// recorded: the switch should reverse them.
    pub late: Option<LateApprovals>,
    /// Leave the first this many reversal messages of each chain unanswered.
    pub ignore_reversals: u32,
    /// Advices of its own per second (`None` or 0 = none).
    pub advice_rate: Option<f64>,
    /// MTIs of those advices, used in turn: `0120`, `0220` (the purchase's
    /// fields) or `0420` (a reversal advice: F90 names an `0200` of
    /// UnionPay's, F39 `98`, issuer not answering).
    pub advice_mtis: Vec<Mti>,
    /// Repeats (`0221`, `0421`) of an advice unacknowledged within
    /// `timeout`, at most.
    pub advice_repeats: u32,
    /// Starts a key reset (`0800` F70 `101`) this often, for `duration`.
    pub key_reset_every: Option<Duration>,
    /// TLS on both link directions (`--tls-*`); plain by default.
    pub tls: crate::tls::tools::SimTls,
}

/// The MTI of UnionPay's advices unless told otherwise.
pub const ADVICE_MTI: Mti = match Mti::new(*b"0220") {
    Some(m) => m,
    None => unreachable!(),
};

/// Whether `mti` is an advice UnionPay can send: `0120`, `0220`, `0420`.
pub fn is_sendable_advice(mti: Mti) -> bool {
    matches!(mti.class(), 1 | 2 | 4) && mti.function() == 2 && mti.origin() == 0
}

impl CupsSimConfig {
    /// Two-way defaults: no issuer requests, 10 s run, 3 s timeout, keep-alive
    /// after 30 s idle, member requests answered at once.
    pub fn new(accept: SocketAddr, connect: SocketAddr, links: usize) -> CupsSimConfig {
        CupsSimConfig {
            accept,
            connect,
            also_connect: Vec::new(),
            links,
            rate: None,
            duration: Duration::from_secs(10),
            timeout: Duration::from_secs(3),
            keepalive_idle: Duration::from_secs(30),
            answer_member_requests: true,
            delay: Delay::NONE,
            require_sign_on: false,
            sign_on_delay: Duration::ZERO,
            drop_out_links_every: None,
            late: None,
            ignore_reversals: 0,
            advice_rate: None,
            advice_mtis: vec![ADVICE_MTI],
            advice_repeats: 3,
            key_reset_every: None,
            tls: Default::default(),
        }
    }
}

/// A running simulated UnionPay.
pub struct CupsSim {
    shared: Arc<Shared>,
    accept_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl CupsSim {
    /// Binds `cfg.accept`, then (in the background) opens the in links, accepts
    /// out links, and originates issuer requests for `cfg.duration` at
    /// `cfg.rate`. Returns once bound: the switch need not be up yet.
    pub async fn start(spec: Arc<Spec>, cfg: CupsSimConfig) -> std::io::Result<CupsSim> {
        // Only a dialect with ASCII F7, F11 and F37 can carry issuer requests.
        let issuer = match IssuerTemplate::new(&spec) {
            Ok(t) => Some(t),
            Err(e) if cfg.rate.is_some_and(|r| r > 0.0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("sim cups: {e}"),
                ));
            }
            Err(_) => None,
        };
        let listener = TcpListener::bind(cfg.accept).await?;
        let accept_addr = listener.local_addr()?;
        let (shutdown, rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            spec,
            stats: Arc::new(CupsSimStats::default()),
            base: Instant::now(),
            in_links: Mutex::new(Vec::new()),
            out_links: Mutex::new(Vec::new()),
            next_in: AtomicUsize::new(0),
            next_link_id: AtomicU64::new(1),
            outstanding: Outstanding::default(),
            stan: AtomicU32::new((entropy_seed() % 999_999) as u32 + 1),
            next_advice: AtomicUsize::new(0),
            delayed: Arc::default(),
            issuer,
            originating: super::OriginateGate::new(true),
            shutdown: rx.clone(),
            cfg,
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(accept_out_links(Arc::clone(&shared), listener, rx.clone()));
        let targets: Vec<SocketAddr> = std::iter::once(shared.cfg.connect)
            .chain(shared.cfg.also_connect.iter().copied())
            .collect();
        for i in 0..shared.cfg.links {
            let target = targets[i % targets.len()];
            tasks.spawn(keep_in_link(Arc::clone(&shared), target, rx.clone()));
        }
        for (rate, what) in [
            (shared.cfg.rate, Originated::Issuer),
            (shared.cfg.advice_rate, Originated::Advice),
        ] {
            if let Some(rate) = rate.filter(|r| *r > 0.0) {
                tasks.spawn(originate(Arc::clone(&shared), rate, what, rx.clone()));
            }
        }
        if let Some(every) = shared.cfg.key_reset_every.filter(|d| !d.is_zero()) {
            tasks.spawn(reset_keys(Arc::clone(&shared), every, rx.clone()));
        }
        if let Some(every) = shared.cfg.drop_out_links_every.filter(|d| !d.is_zero()) {
            tasks.spawn(drop_out_links(Arc::clone(&shared), every, rx.clone()));
        }
        let (expiring, timeout) = (Arc::clone(&shared), shared.cfg.timeout);
        tasks.spawn(crate::sim::peer::sweep(timeout, rx, move |now| {
            expiring.expire(now)
        }));
        tracing::info!(accept = %accept_addr, connect = %shared.cfg.connect, links = shared.cfg.links, "sim cups started");
        Ok(CupsSim {
            shared,
            accept_addr,
            shutdown,
            tasks,
        })
    }

    /// Where the switch's out links connect.
    pub fn accept_addr(&self) -> SocketAddr {
        self.accept_addr
    }

    pub fn stats(&self) -> Arc<CupsSimStats> {
        Arc::clone(&self.shared.stats)
    }

    /// The counters now.
    pub fn report(&self) -> CupsReport {
        CupsReport::from_stats(&self.shared.stats)
    }

    /// Stops originating issuer requests (those sent still get their answers).
    /// Every request sent before is in [`CupsSim::outstanding`] on return.
    pub fn stop_originating(&self) {
        self.shared.originating.close();
    }

    /// Issuer requests and echo tests awaiting a response.
    pub fn outstanding(&self) -> usize {
        self.shared.outstanding.len()
    }

    /// Sends an `0820` echo test (F70 `301`) on a live in link; the switch's
    /// `0830` is expected on an out link. `false` if no in link could take it.
    pub fn send_echo(&self) -> bool {
        self.shared.send_echo()
    }

    /// Sends one advice of its own now (the next of `advice_mtis`) on a live
    /// in link; its acknowledgement is expected on an out link, and it is
    /// repeated after `timeout` (`advice_repeats` times at most). `false`
    /// if no in link could take it.
    pub fn send_advice(&self) -> bool {
        self.shared.send_advice()
    }

    /// Starts a key reset now: `0800` F70 `101` on a live in link, the
    /// `0810` expected on an out link. `false` if no in link could take it.
    pub fn send_key_reset(&self) -> bool {
        self.shared.send_key_reset()
    }

    /// Closes up to `n` live in links (oldest first), as a broken line would; each
    /// is reopened after a short backoff. Returns how many were closed.
    pub fn close_in_links(&self, n: usize) -> usize {
        close_links(&self.shared.in_links, n, |l| &l.close)
    }

    /// Closes up to `n` live out links (oldest first); reopening them is the
    /// switch's job. Returns how many were closed.
    pub fn close_out_links(&self, n: usize) -> usize {
        close_links(&self.shared.out_links, n, |l| &l.close)
    }

    /// Closes every link and the listener. Requests still outstanding count as
    /// unanswered. Returns the final report (`in_links_up` as it was just before
    /// the stop).
    pub async fn stop(mut self) -> CupsReport {
        let up = self.shared.stats.in_links_up.load(Ordering::Relaxed);
        let _ = self.shutdown.send(true);
        super::join_within(&mut self.tasks, STOP_GRACE).await;
        for (_, p) in self.shared.outstanding.drain() {
            self.shared.count_expired(&p);
        }
        CupsReport {
            in_links_up: up,
            ..self.report()
        }
    }
}

/// Runs the simulator for `cfg.duration`, waits up to `cfg.timeout` for the
/// responses still due, stops and reports.
pub async fn run(spec: Arc<Spec>, cfg: CupsSimConfig) -> std::io::Result<CupsReport> {
    run_until(spec, cfg, std::future::pending()).await
}

/// [`run`], ending early when `stop` completes: no new issuer requests, the
/// wait for the responses still due, then the report.
pub async fn run_until(
    spec: Arc<Spec>,
    cfg: CupsSimConfig,
    stop: impl std::future::Future<Output = ()>,
) -> std::io::Result<CupsReport> {
    let (duration, timeout) = (cfg.duration, cfg.timeout);
    // An advice can be sent 1 + advice_repeats times, a timeout each.
    let settle = if cfg.advice_rate.is_some_and(|r| r > 0.0) {
        timeout.saturating_mul(cfg.advice_repeats.saturating_add(1))
    } else {
        timeout
    };
    let sim = CupsSim::start(spec, cfg).await?;
    tokio::select! {
        _ = tokio::time::sleep(duration) => {}
        _ = stop => {}
    }
    // Key resets and advices stop too; what was sent gets its answers.
    sim.stop_originating();
    let deadline = deadline_after(settle);
    while sim.outstanding() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(sim.stop().await)
}

/// Everything the tasks share.
struct Shared {
    spec: Arc<Spec>,
    cfg: CupsSimConfig,
    stats: Arc<CupsSimStats>,
    /// Clock origin of the in links' last-write times.
    base: Instant,
    in_links: Mutex<Vec<InLink>>,
    out_links: Mutex<Vec<OutLink>>,
    /// Round-robin cursor over the in links.
    next_in: AtomicUsize,
    next_link_id: AtomicU64,
    /// Requests the simulator sent, by F7 + F11 + F32 + F33.
    outstanding: Outstanding<Key, Pending>,
    /// Last STAN used (1..=999999).
    stan: AtomicU32,
    /// Turn of the next advice in `cfg.advice_mtis`.
    next_advice: AtomicUsize,
    /// Member responses waiting out their delay.
    delayed: Arc<super::DelayedAnswers>,
    issuer: Option<IssuerTemplate>,
    /// Closed by [`CupsSim::stop_originating`].
    originating: super::OriginateGate,
    shutdown: watch::Receiver<bool>,
}

/// F7 + F11 + F32 + F33 of a request, each with its length.
type Key = Vec<u8>;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Issuer,
    Echo,
    /// An advice of UnionPay's: its repeat, and how many repeats are left.
    Advice {
        repeat: Bytes,
        repeats_left: u32,
    },
    KeyReset,
}

/// Which counter an answer written on an in link goes to.
#[derive(Clone, Copy, Debug)]
enum Tally {
    Member,
    Network,
    Reversal,
    Advice,
}

#[derive(Clone, Debug)]
struct Pending {
    kind: Kind,
    /// The MTI its response must carry.
    response: Mti,
}

fn key(f7: &[u8], f11: &[u8], f32: &[u8], f33: &[u8]) -> Key {
    let mut k = Vec::with_capacity(f7.len() + f11.len() + f32.len() + f33.len() + 4);
    for part in [f7, f11, f32, f33] {
        k.push(part.len().min(255) as u8);
        k.extend_from_slice(part);
    }
    k
}

/// The key of a parsed message; absent fields count as empty.
fn key_of(msg: &Message<'_>) -> Option<Key> {
    let data = |id: u16| -> Option<&[u8]> {
        match msg.field(id) {
            Ok(Some(f)) => Some(f.data()),
            Ok(None) => Some(&[]),
            Err(_) => None,
        }
    };
    Some(key(data(7)?, data(11)?, data(32)?, data(33)?))
}

impl Shared {
    fn count_expired(&self, p: &Pending) {
        let c = match p.kind {
            Kind::Issuer => &self.stats.unanswered,
            Kind::Echo => &self.stats.echo_unanswered,
            Kind::Advice { .. } => &self.stats.advices_unacknowledged,
            Kind::KeyReset => &self.stats.key_resets_unanswered,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// A frame read on an out link from switch host `from`.
    fn on_out_link(self: &Arc<Shared>, payload: Bytes, rng: &mut Rng, from: Option<IpAddr>) {
        let msg = match Message::parse(&self.spec, payload) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "sim cups: bad frame on an out link");
                self.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let mti = msg.mti();
        if mti.is_response() {
            self.on_response(&msg);
            return;
        }
        if is_reversal(mti) {
            self.on_reversal(&msg, rng, from);
            return;
        }
        if is_advice(mti) {
            self.on_member_advice(&msg, rng, from);
            return;
        }
        let network = mti.is_network_management();
        if network && let Ok(Some(f70)) = msg.field(70) {
            let f70: Vec<u8> = f70.logical().collect();
            if is_key_management(&f70) {
                self.stats.member_key_requests.add(&f70);
            }
        }
        let received = if network {
            &self.stats.network_requests
        } else {
            &self.stats.member_requests
        };
        received.fetch_add(1, Ordering::Relaxed);
        if !network && !self.cfg.answer_member_requests {
            return;
        }
        let response = match answer::answer(&self.spec, &msg, "00") {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, mti = %mti, "sim cups: cannot answer a request");
                self.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        if network {
            self.deliver(response, Tally::Network, To::Host(from), None);
            return;
        }
        // A late approval is one the simulator can name (and so record).
        let late = match &self.cfg.late {
            Some(late) if is_approvable(mti) && self.stats.reversals.has_room() => late
                .draw(rng)
                .and_then(|by| Some((by, OriginalKey::of_message(&msg).ok()?))),
            _ => None,
        };
        let (extra, approved_late) = late.map_or((Duration::ZERO, None), |(by, k)| (by, Some(k)));
        let delay = self.cfg.delay.sample(rng) + extra;
        let to = To::Any {
            from,
            draw: rng.next_u64(),
        };
        self.deliver_after(response, delay, Tally::Member, to, approved_late);
    }

    /// A response read on an out link: to an issuer request or an echo test.
    fn on_response(&self, msg: &Message<'_>) {
        let Some(k) = key_of(msg) else {
            self.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let found = self.outstanding.take_if(&k, |p| p.response == msg.mti());
        let stats = &self.stats;
        let counter = match found.map(|p| p.kind) {
            None => &stats.mismatched,
            Some(Kind::Echo) => &stats.echo_answered,
            Some(Kind::Advice { .. }) => &stats.advices_acknowledged,
            Some(Kind::KeyReset) => {
                match msg.field(39) {
                    Ok(Some(f)) => stats.key_reset_f39.add(&f.logical().collect::<Vec<u8>>()),
                    _ => stats.key_reset_f39.add(b"none"),
                }
                &stats.key_resets_answered
            }
            Some(Kind::Issuer) => {
                let approved = matches!(msg.field(39), Ok(Some(f)) if f.eq_logical(b"00"));
                if approved {
                    &stats.answered
                } else {
                    &stats.declined
                }
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Expires outstanding requests past their deadline; an advice with
    /// repeats left is repeated instead, with a new deadline.
    fn expire(&self, now: Instant) {
        for (k, p) in self.outstanding.expired(now) {
            match p.kind {
                Kind::Advice {
                    repeat,
                    repeats_left,
                } if repeats_left > 0 => self.repeat_advice(k, repeat, repeats_left, p.response),
                _ => self.count_expired(&p),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_parts_apart() {
        assert_ne!(key(b"1", b"23", b"", b""), key(b"12", b"3", b"", b""));
    }

    #[test]
    fn report_line() {
        let r = CupsReport {
            sent: 3,
            answered: 2,
            ..CupsReport::default()
        };
        assert!(
            r.to_string()
                .starts_with("sent 3 answered 2 declined 0 mismatched 0 unanswered 0")
        );
    }
}
