//! `isoswitch sim node`: a channel node that answers requests per spec.
//!
//! Answers each request with its response MTI, the request's fields (less track
//! data, PIN block, EMV data and MAC), F39 = `00`, the TPDU swapped and the CUPS /
//! VISA header IDs swapped; answers echo tests the same way. With a delay range it
//! answers after a uniformly random delay; with a fail rate it leaves that share
//! of requests unanswered (so the switch's timeouts are exercised).
//!
//! It is also the oracle of a financial switch's store and forward
//! ([`Finance`]): it answers a share of its approvals late (past the switch's
//! timeout) and records them; it answers reversals (`0420`/`0421`) with
//! `0430` and books them per chain against those late approvals (see
//! [`crate::sim::ledger`]), leaving the first few of each chain unanswered on
//! demand; it acknowledges advices (`0120`/`0220` → `0130`/`0230`) and counts
//! their repeats and duplicates; it answers key exchange and counts key
//! resets by F70; it sends key requests of its own (`0820` F70 `101`); and
//! it counts repeated requests (`0201`...) and whether it had answered the
//! first.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_util::codec::FramedRead;

use crate::iso8583::{Message, Mti, Spec, samples};
use crate::sim::ledger::{
    Answered, LateApprovals, Taken, is_advice, is_approvable, is_inquiry, is_key_management,
    is_repeated_request, is_reversal_in,
};
use crate::sim::original::OriginalKey;
use crate::sim::peer::lock;
use crate::sim::writer::{Outbound, Patch, run_writer};
use crate::util::{Rng, duration};
use crate::wire::{Frame, FrameCodec};

mod own;
mod report;

use own::{key_request_response, originate, originated_response, request_keys};
pub use report::{NodeSimStats, summary, summary_json};

/// How long the node waits before answering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delay {
    pub min: Duration,
    pub max: Duration,
}

impl Delay {
    pub const NONE: Delay = Delay {
        min: Duration::ZERO,
        max: Duration::ZERO,
    };

    /// `5ms` (fixed) or `0..2s` / `10ms..200ms` (uniform range).
    pub fn parse(s: &str) -> Result<Delay, String> {
        let one = |t: &str| duration::parse(t).map_err(|e| e.to_string());
        match s.split_once("..") {
            Some((lo, hi)) => {
                // `0..2s`: a bare number takes the unit of the other end.
                let hi_d = one(hi)?;
                // `100..300ms`: a bare number takes the unit of the other end.
                let unit = hi
                    .trim()
                    .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
                let lo_d = match lo.trim().parse::<u64>() {
                    Ok(0) => Duration::ZERO,
                    Ok(_) => one(&format!("{}{unit}", lo.trim()))?,
                    Err(_) => one(lo)?,
                };
                if lo_d > hi_d {
                    return Err(format!("delay range `{s}` is reversed"));
                }
                Ok(Delay {
                    min: lo_d,
                    max: hi_d,
                })
            }
            None => {
                let d = one(s)?;
                Ok(Delay { min: d, max: d })
            }
        }
    }

    /// A uniformly random delay within the range.
    pub fn sample(&self, rng: &mut Rng) -> Duration {
        rng.duration_between(self.min, self.max)
    }
}

/// What `sim node` does.
#[derive(Clone, Debug)]
pub struct NodeSimConfig {
    pub id: String,
    pub delay: Delay,
    /// Share of requests (0.0..=1.0) left unanswered.
    pub fail_rate: f64,
    /// Requests the node sends itself (an acquirer's 0200s to UnionPay).
    pub originate: Option<Originate>,
}

impl NodeSimConfig {
    pub fn new(id: &str) -> NodeSimConfig {
        NodeSimConfig {
            id: id.to_string(),
            delay: Delay::NONE,
            fail_rate: 0.0,
            originate: None,
        }
    }
}

/// What a node does for a financial switch's store and forward, beyond
/// answering: all off by default.
#[derive(Clone, Debug, Default)]
pub struct Finance {
    /// A share of approvals answered late, each recorded.
    pub late: Option<LateApprovals>,
    /// Approve partially: F39 10, half the amount in F4, an F38 of the
    /// node's own (`P` and the STAN's last five digits).
    pub partial: bool,
    /// Leave the first this many reversal messages of each chain unanswered
    /// (so the switch has to repeat them as `0421`).
    pub ignore_reversals: u32,
    /// Leave every original advice unacknowledged, acknowledge repeats (so
    /// a switch storing advices has to repeat each as `0121`/`0221`).
    pub ignore_advice_originals: bool,
    /// Key requests the node sends itself.
    pub key_requests: Option<KeyRequests>,
    /// F39 of the answers to each reversal chain's messages in turn (the
    /// last one for the rest): `96, 96, 00` makes the switch try three
    /// times. Empty: `00`.
    pub reversal_answers: Vec<String>,
    /// Leave the first this many advice messages of each transaction
    /// unanswered (so the switch repeats them as `0221`).
    pub ignore_advices: u32,
    /// The late answers (`late`) decline (F39 05) instead of approving:
    /// nothing to reverse, and a timeout reversal the switch stored for one
    /// must not reach this node.
    pub late_declines: bool,
}

/// Node-originated key requests: an `0820` F70 `101` (with F7 and F11, no
/// F37) every `every`, on the node's connections in turn; the `0830` must
/// come back to this node, matched by F11 + F7. Held while origination is
/// stopped ([`NodeSim::stop_originating`]), as originated requests are.
#[derive(Clone, Copy, Debug)]
pub struct KeyRequests {
    pub every: Duration,
    /// A key request unanswered this long counts as unanswered.
    pub timeout: Duration,
    /// The node's STANs are `stan_base + 1 ..= stan_base + 99_999`, shared
    /// with its originated requests.
    pub stan_base: u32,
}

/// Node-originated requests: sent round robin over the node's connections; each
/// response must come back to this node (its STANs are its own).
#[derive(Clone, Debug)]
pub struct Originate {
    pub mti: String,
    /// Requests per second.
    pub rate: f64,
    /// This node's STANs are `stan_base + 1 ..= stan_base + 99_999`.
    pub stan_base: u32,
    /// A request unanswered this long counts as unanswered.
    pub timeout: Duration,
}

/// A running simulated node.
pub struct NodeSim {
    pub addr: SocketAddr,
    pub stats: Arc<NodeSimStats>,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeSim {
    /// Binds `addr` (port 0 for any) and serves until [`NodeSim::stop`].
    pub async fn start(
        addr: SocketAddr,
        spec: Arc<Spec>,
        cfg: NodeSimConfig,
    ) -> std::io::Result<NodeSim> {
        Self::start_with(addr, spec, cfg, NodeOptions::default()).await
    }

    /// As [`NodeSim::start`], with the answer style of `opts`.
    pub async fn start_with(
        addr: SocketAddr,
        spec: Arc<Spec>,
        cfg: NodeSimConfig,
        opts: NodeOptions,
    ) -> std::io::Result<NodeSim> {
        Self::start_financial(addr, spec, cfg, opts, Finance::default()).await
    }

    /// As [`NodeSim::start_with`], with the store-and-forward oracle of
    /// `finance`.
    pub async fn start_financial(
        addr: SocketAddr,
        spec: Arc<Spec>,
        cfg: NodeSimConfig,
        opts: NodeOptions,
        finance: Finance,
    ) -> std::io::Result<NodeSim> {
        Self::start_tls(addr, spec, cfg, opts, finance, None).await
    }

    /// As [`NodeSim::start_financial`], accepting TLS when `tls` is given.
    pub async fn start_tls(
        addr: SocketAddr,
        spec: Arc<Spec>,
        cfg: NodeSimConfig,
        opts: NodeOptions,
        finance: Finance,
        tls: Option<Arc<crate::tls::tools::Acceptor>>,
    ) -> std::io::Result<NodeSim> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(NodeSimStats::default());
        let (shutdown, rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            spec,
            cfg,
            stats: Arc::clone(&stats),
            conns: Mutex::new(Vec::new()),
            outstanding: Mutex::new(HashMap::new()),
            originating: super::OriginateGate::new(true),
            opts,
            delayed: Arc::default(),
            finance,
            answered_keys: Answered::new(REMEMBERED_ANSWERS),
            key_requests: Mutex::new(HashMap::new()),
            stan_counter: AtomicU32::new(0),
            next_key_conn: AtomicUsize::new(0),
            tls,
        });
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&shared), rx));
        Ok(NodeSim {
            addr,
            stats,
            shared: Arc::clone(&shared),
            shutdown,
            task,
        })
    }

    /// Closes the listener and every connection: a node process dying.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}

/// What every connection task of a node shares.
struct Shared {
    spec: Arc<Spec>,
    cfg: NodeSimConfig,
    stats: Arc<NodeSimStats>,
    /// Live connections, for node-originated requests.
    conns: Mutex<Vec<(u64, mpsc::Sender<Outbound>)>>,
    /// Node-originated requests in flight: STAN → sent at, on connection.
    outstanding: Mutex<HashMap<u32, (Instant, u64)>>,
    /// Node-originated requests keep coming while this is open.
    originating: super::OriginateGate,
    opts: NodeOptions,
    /// Answers waiting out their delay (bounded, dropped at the stop).
    delayed: Arc<super::DelayedAnswers>,
    finance: Finance,
    /// Requests answered lately, to tell what a repeat repeats.
    answered_keys: Answered,
    /// Key requests in flight: (F11, F7) → sent at.
    key_requests: Mutex<HashMap<(u32, [u8; 10]), Instant>>,
    /// The last STAN counter used (1..=99_999), by originated requests and
    /// key requests alike.
    stan_counter: AtomicU32,
    /// Round-robin cursor of key requests over the connections.
    next_key_conn: AtomicUsize,
    /// Accept TLS (the handshake runs in each connection's task).
    tls: Option<Arc<crate::tls::tools::Acceptor>>,
}

/// Answered requests remembered to classify repeats.
const REMEMBERED_ANSWERS: usize = 65_536;

/// How a simulated node shapes its answers.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeOptions {
    /// Echo no usable key: F11 comes back `000000`, F41 blank and F37 zeros in
    /// every answer (a host that only a OneConnect pool can serve).
    pub no_key: bool,
}

/// Overwrites the key fields of an answer with fixed values, as a node that
/// echoes no key does. Fields the spec lacks or the answer does not carry are
/// left out.
fn blank_keys(spec: &Spec, response: Bytes) -> Option<Bytes> {
    let mut d = Message::parse(spec, response).ok()?.decode().ok()?;
    for (id, text) in [(11, "000000"), (41, "        "), (37, "000000000000")] {
        if d.has(id) {
            d.set_text(id, text);
        }
    }
    spec.encode(&d).ok().map(Bytes::from)
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = tokio::task::JoinSet::new();
    if let Some(o) = shared.cfg.originate.clone() {
        conns.spawn(originate(Arc::clone(&shared), o, shutdown.clone()));
    }
    if let Some(k) = shared.finance.key_requests {
        conns.spawn(request_keys(Arc::clone(&shared), k, shutdown.clone()));
    }
    let mut next_id = 0u64;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                shared.stats.connections.fetch_add(1, Ordering::Relaxed);
                next_id += 1;
                conns.spawn(serve_conn(next_id, stream, Arc::clone(&shared), shutdown.clone()));
                // Reap the connections that ended, so churn costs no memory.
                while conns.try_join_next().is_some() {}
            }
            _ = shutdown.changed() => break,
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

async fn serve_conn(
    id: u64,
    stream: TcpStream,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let stream = match crate::tls::tools::accept(shared.tls.as_deref(), stream).await {
        Ok(s) => s,
        Err(e) => {
            shared.stats.tls_refused.fetch_add(1, Ordering::Relaxed);
            eprintln!("sim node: TLS handshake failed: {e}");
            return;
        }
    };
    let (read, write) = stream.into_split();
    let spec = &shared.spec;
    let prefix = spec.framing().prefix;
    let (tx, rx) = mpsc::channel(8192);
    lock(&shared.conns).push((id, tx.clone()));
    let held = shared.stats.held.fetch_add(1, Ordering::Relaxed) + 1;
    shared.stats.peak_held.fetch_max(held, Ordering::Relaxed);
    // However this task ends (even aborted, as when the node is stopped), the
    // writer goes with it, so the connection really closes.
    let _conn = ConnGuard {
        writer: tokio::spawn(run_writer(write, prefix, rx)),
        shared: Arc::clone(&shared),
        id,
    };
    let mut frames = FramedRead::new(read, FrameCodec::new(prefix, spec.framing().max_frame));
    let mut rng = crate::util::rng::rng_from_entropy();
    loop {
        let frame = tokio::select! {
            f = frames.next() => f,
            _ = shutdown.changed() => break,
        };
        match frame {
            Some(Ok(Frame::Message(payload))) => {
                handle(&shared, &tx, payload, &mut rng, id, &shutdown)
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => break,
        }
    }
}

/// Closes a node connection's writer and forgets the connection on drop.
struct ConnGuard {
    writer: tokio::task::JoinHandle<std::io::Result<()>>,
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.writer.abort();
        lock(&self.shared.conns).retain(|(c, _)| *c != self.id);
        self.shared.stats.held.fetch_sub(1, Ordering::Relaxed);
    }
}

fn handle(
    shared: &Arc<Shared>,
    tx: &mpsc::Sender<Outbound>,
    payload: Bytes,
    rng: &mut Rng,
    conn: u64,
    shutdown: &watch::Receiver<bool>,
) {
    let stats = &*shared.stats;
    let Ok(msg) = Message::parse(&shared.spec, payload) else {
        stats.bad.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let mti = msg.mti();
    if mti.is_response() {
        if mti.is_network_management() {
            key_request_response(shared, &msg);
        } else {
            originated_response(shared, &msg, conn);
        }
        return;
    }
    let plan = if is_reversal_in(&shared.spec, mti) {
        shared.on_reversal(&msg)
    } else if is_advice(mti) {
        shared.on_advice(&msg)
    } else {
        shared.on_request(&msg, rng)
    };
    let Some(plan) = plan else { return };
    let tally = plan.tally;
    let scheduled = respond(shared, tx, &msg, plan, rng, shutdown);
    match (tally, scheduled) {
        (_, None) => {}
        (Tally::Request, Some(true)) => drop(stats.answered.fetch_add(1, Ordering::Relaxed)),
        (Tally::Reversal, Some(true)) => stats.reversals.answered(),
        (Tally::Advice, Some(true)) => stats.advices.answered(),
        // Past MAX_DELAYED answers waiting: the node is over its capacity.
        (_, Some(false)) => drop(stats.unanswered.fetch_add(1, Ordering::Relaxed)),
    }
}

/// How the node answers one message.
struct Plan {
    /// F39 of the answer.
    code: String,
    /// A partial approval: half the amount, the node's F38.
    partial: bool,
    /// Added to the normal delay (a late approval).
    extra: Duration,
    /// What the node records as the answer leaves.
    on_sent: OnSent,
    tally: Tally,
}

impl Plan {
    fn answer(code: &str, tally: Tally) -> Plan {
        Plan {
            code: code.to_string(),
            partial: false,
            extra: Duration::ZERO,
            on_sent: OnSent::Nothing,
            tally,
        }
    }
}

/// Recorded when an answer is written: before the switch can have it, so
/// before any repeat or reversal of it can come back.
enum OnSent {
    Nothing,
    /// An answer to a request that may be repeated.
    Answered(OriginalKey),
    /// A late approval: answered, and to be reversed (naming what was
    /// approved, for a partial one).
    ApprovedLate(OriginalKey, Option<crate::sim::ledger::Approval>),
}

/// Which counter an answer scheduled goes to.
#[derive(Clone, Copy)]
enum Tally {
    Request,
    Reversal,
    Advice,
}

/// What the node approves of `request` when it approves partially: half
/// its F4, and an F38 of its own.
fn partial_approval(request: &Message<'_>) -> Option<crate::sim::ledger::Approval> {
    let text = |id| -> Option<String> {
        let f = request.field(id).ok()??;
        Some(f.logical().map(char::from).collect())
    };
    let asked: u64 = text(4)?.parse().ok()?;
    let stan = text(11)?;
    Some(crate::sim::ledger::Approval {
        f38: format!("P{}", &stan[stan.len().saturating_sub(5)..]),
        amount: format!("{:012}", asked / 2),
    })
}

/// `answer` (an approval of `request`) made partial: F4 and F38 as
/// [`partial_approval`] says.
fn partially(spec: &Spec, request: &Message<'_>, answer: Bytes) -> Option<Bytes> {
    let approval = partial_approval(request)?;
    let mut d = spec.decode(&answer).ok()?;
    d.set_text(4, approval.amount);
    d.set_text(38, approval.f38);
    spec.encode(&d).ok().map(Bytes::from)
}

/// Builds the answer to `msg` per `plan` and sends it after the node's
/// delay (plus the plan's extra). `None` when the answer cannot be built
/// (counted bad), else whether it was sent or scheduled.
fn respond(
    shared: &Arc<Shared>,
    tx: &mpsc::Sender<Outbound>,
    msg: &Message<'_>,
    plan: Plan,
    rng: &mut Rng,
    shutdown: &watch::Receiver<bool>,
) -> Option<bool> {
    let spec = &*shared.spec;
    let built = crate::sim::answer::answer(spec, msg, &plan.code)
        .ok()
        .and_then(|r| {
            if shared.opts.no_key {
                blank_keys(spec, r)
            } else {
                Some(r)
            }
        });
    let built = match built {
        Some(r) if plan.partial => partially(spec, msg, r),
        other => other,
    };
    let Some(response) = built else {
        shared.stats.bad.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    let delay = shared.cfg.delay.sample(rng) + plan.extra;
    let on_sent = plan.on_sent;
    if delay.is_zero() {
        shared.sent(on_sent);
        let _ = tx.try_send(Outbound::message(response));
        return Some(true);
    }
    let (me, tx) = (Arc::clone(shared), tx.clone());
    // A full write queue drops the answer, as it does undelayed.
    let send = move || {
        me.sent(on_sent);
        drop(tx.try_send(Outbound::message(response)));
    };
    Some(shared.delayed.send_after(delay, shutdown.clone(), send))
}

impl Shared {
    /// A request (not a reversal or advice): counted, maybe left unanswered
    /// (`fail_rate`), maybe approved late.
    fn on_request(&self, msg: &Message<'_>, rng: &mut Rng) -> Option<Plan> {
        let stats = &*self.stats;
        stats.requests.fetch_add(1, Ordering::Relaxed);
        let mti = msg.mti();
        // Requests that can be repeated (0100, 0200, 0400 and their
        // repeats) are remembered as answered, to classify repeats.
        let key = (mti.function() == 0 && matches!(mti.class(), 1 | 2 | 4))
            .then(|| OriginalKey::of_message(msg).ok())
            .flatten();
        if is_repeated_request(mti) {
            stats.repeat_requests.fetch_add(1, Ordering::Relaxed);
            if key.as_ref().is_some_and(|k| self.answered_keys.contains(k)) {
                stats.repeats_of_answered.fetch_add(1, Ordering::Relaxed);
            }
        }
        if mti.class() == 4 && mti.function() == 0 {
            // A terminal's reversal names its purchase (or authorization)
            // by that one's STAN, F7 and terminal: was it answered here?
            stats.terminal_reversals.fetch_add(1, Ordering::Relaxed);
            let here = key.as_ref().is_some_and(|k| {
                [*b"0200", *b"0100"]
                    .iter()
                    .any(|m| self.answered_keys.contains(&k.under(*m)))
            });
            if here {
                stats
                    .terminal_reversals_of_answered
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        if mti.is_network_management()
            && let Ok(Some(f70)) = msg.field(70)
        {
            let f70: Vec<u8> = f70.logical().collect();
            if is_key_management(&f70) {
                stats.key_resets.add(&f70);
            }
        }
        let fail_rate = self.cfg.fail_rate;
        if fail_rate > 0.0 && rng.chance(fail_rate) {
            stats.unanswered.fetch_add(1, Ordering::Relaxed);
            if let (true, Some(k)) = (is_approvable(mti), &key) {
                stats.reversals.not_answered(k.clone());
            }
            return None;
        }
        let partial = self.finance.partial && is_approvable(mti) && !is_inquiry(msg);
        let mut plan = Plan::answer(if partial { "10" } else { "00" }, Tally::Request);
        plan.partial = partial;
        let late = match (&self.finance.late, &key) {
            (Some(late), Some(_)) if is_approvable(mti) && stats.reversals.has_room() => {
                late.draw(rng)
            }
            _ => None,
        };
        // A late approval is one the switch must reverse only when it moves
        // money: an inquiry's is answered as late, and not booked.
        plan.on_sent = match (late, key) {
            (Some(by), Some(k)) if self.finance.late_declines => {
                plan.extra = by;
                plan.code = "05".into();
                stats.declined_late.fetch_add(1, Ordering::Relaxed);
                OnSent::Answered(k)
            }
            (Some(by), Some(k)) if is_inquiry(msg) => {
                plan.extra = by;
                OnSent::Answered(k)
            }
            (Some(by), Some(k)) => {
                plan.extra = by;
                let approval = partial.then(|| partial_approval(msg)).flatten();
                OnSent::ApprovedLate(k, approval)
            }
            (_, Some(k)) => OnSent::Answered(k),
            (_, None) => OnSent::Nothing,
        };
        Some(plan)
    }

    /// A reversal (`0420`/`0421`): booked in its chain and answered `0430`,
    /// unless it is one of the first `ignore_reversals` of its chain. One
    /// whose F90 names no original is answered F39 `30` (format error).
    fn on_reversal(&self, msg: &Message<'_>) -> Option<Plan> {
        // A reversal of an advice (a voided offline sale) must come after
        // the advice: the host cannot reverse what it has not booked.
        if let Ok(original) = OriginalKey::of_reversal(msg)
            && original.is_advice()
            && !self.stats.advices.has_booked(&original)
        {
            self.stats
                .reversals_before_their_advice
                .fetch_add(1, Ordering::Relaxed);
        }
        let turn = match self
            .stats
            .reversals
            .take(msg, self.finance.ignore_reversals)
        {
            Taken::Ignored => return None,
            Taken::Unreadable => return Some(Plan::answer("30", Tally::Reversal)),
            Taken::Answer(turn) => turn as usize,
        };
        // The answers count from the first message answered.
        let codes = &self.finance.reversal_answers;
        let code = codes
            .get(turn - 1)
            .or(codes.last())
            .map_or("00", String::as_str);
        Some(Plan::answer(code, Tally::Reversal))
    }

    /// An advice (`0120`/`0220`, or a repeat): booked and acknowledged,
    /// unless it is one of the first `ignore_advices` messages of its
    /// transaction here, or an original with `ignore_advice_originals`.
    fn on_advice(&self, msg: &Message<'_>) -> Option<Plan> {
        let Ok(key) = OriginalKey::of_message(msg) else {
            self.stats.bad.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let repeat = msg.mti().is_repeat();
        let place = self.stats.advices.advice(key.clone(), repeat);
        let original_ignored = self.finance.ignore_advice_originals && !repeat;
        if place <= self.finance.ignore_advices || original_ignored {
            self.stats.advices.ignored();
            return None;
        }
        self.stats.advices.book(key);
        Some(Plan::answer("00", Tally::Advice))
    }

    /// What is recorded as an answer leaves.
    fn sent(&self, on_sent: OnSent) {
        match on_sent {
            OnSent::Nothing => {}
            OnSent::Answered(key) => self.answered_keys.remember(key),
            OnSent::ApprovedLate(key, approval) => {
                self.answered_keys.remember(key.clone());
                self.stats.reversals.approved_late(key.clone());
                if let Some(approval) = approval {
                    self.stats.reversals.approved_as(key, approval);
                }
            }
        }
    }

    /// The node's next STAN, `base + 1 ..= base + 99_999` in turn.
    fn next_stan(&self, base: u32) -> u32 {
        let counter = self
            .stan_counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c % 99_999 + 1)
            })
            .map_or(1, |prev| prev % 99_999 + 1);
        base + counter
    }
}

impl NodeSim {
    /// The next STAN of the node's own is `base + from` (1..=99_999; out of
    /// range wraps into it), then onwards.
    pub fn stans_from(&self, from: u32) {
        let before = from.saturating_sub(1) % 99_999;
        self.shared.stan_counter.store(before, Ordering::Relaxed);
    }

    /// Stops sending node-originated requests (answers keep coming).
    /// Every request sent before is counted in [`NodeSim::outstanding`] on return.
    pub fn stop_originating(&self) {
        self.shared.originating.close();
    }

    /// Sends node-originated requests again (after [`NodeSim::stop_originating`]).
    pub fn start_originating(&self) {
        self.shared.originating.open();
    }

    pub fn is_originating(&self) -> bool {
        self.shared.originating.is_open()
    }

    /// Node-originated requests (key requests among them) still waiting for
    /// their response.
    pub fn outstanding(&self) -> usize {
        let s = &self.stats;
        let done = s.originated_answered.load(Ordering::Relaxed)
            + s.originated_declined.load(Ordering::Relaxed)
            + s.originated_unanswered.load(Ordering::Relaxed);
        let originated = s.originated.load(Ordering::Relaxed).saturating_sub(done) as usize;
        originated + lock(&self.shared.key_requests).len()
    }
}

#[cfg(test)]
mod tests;
