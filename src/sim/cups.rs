//! `isoswitch sim cups`: UnionPay's side of a split simplex link set (WIRE.md §1).
//!
//! - **Out links** (the member writes, UnionPay reads): the simulator listens on
//!   `accept` and reads whatever the switch sends. `0820` network management and
//!   member requests are answered, and the answers go out **on an in link**
//!   chosen round-robin, never on the connection the request came in on.
//!   Responses to the simulator's own requests are matched by F7 + F11 + F32 +
//!   F33 against what is outstanding.
//! - **In links** (UnionPay writes, the member reads): the simulator opens `links`
//!   connections to the switch's `connect` address, keeps them up (reconnecting
//!   after a short backoff), writes a `0000` keep-alive on any that has been idle
//!   for `keepalive_idle`, and originates issuer requests (`0100`) and echo tests
//!   (`0820` F70 `301`) on them.
//!
//! Every queue and table is bounded, every wait has a deadline, and nothing read
//! from a socket can make it panic: a frame that does not parse is counted and
//! dropped; a length prefix that cannot be trusted closes that link only.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::codec::FramedRead;

use crate::iso8583::{Decoded, Message, Mti, Spec, samples};
use crate::sim::answer::{self, response_mti};
use crate::sim::node::Delay;
use crate::sim::writer::{Outbound, Patch, run_writer};
use crate::util::rng::{Rng, entropy_seed};
use crate::wire::{Frame, FrameCodec};

/// UnionPay's institution ID (header source of what it sends, F33).
pub const CUPS_ID: &str = "00010000";

/// Frames queued per in link before senders see it as full.
const IN_LINK_QUEUE: usize = 4096;
/// Requests (issuer requests and echo tests) awaiting a response, at most.
const MAX_OUTSTANDING: usize = 100_000;
/// Out links accepted beyond `links` x this are closed at once.
const OUT_LINKS_PER_IN_LINK: usize = 4;
/// Wait before reopening an in link the switch (or a test) closed.
const RECONNECT_MIN: Duration = Duration::from_millis(100);
/// Longest wait between failed connection attempts.
const RECONNECT_MAX: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Issuer requests sent in one pacing tick at most (a late tick does not burst).
const MAX_BURST: u64 = 1000;
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
        }
    }
}

/// Counters a test can read while the simulator runs.
#[derive(Debug, Default)]
pub struct CupsSimStats {
    /// Issuer requests written on an in link.
    pub sent: AtomicU64,
    /// Issuer requests not sent: no live in link, every queue full, or too many
    /// outstanding.
    pub unsent: AtomicU64,
    /// Responses to issuer requests with F39 `00`.
    pub answered: AtomicU64,
    /// Responses to issuer requests with another F39.
    pub declined: AtomicU64,
    /// Responses matching nothing outstanding (unknown, or answered already) or
    /// with the wrong MTI.
    pub mismatched: AtomicU64,
    /// Issuer requests without a response within `timeout`.
    pub unanswered: AtomicU64,
    /// Member requests (not network management) read on out links.
    pub member_requests: AtomicU64,
    /// Member requests whose response was written on an in link.
    pub member_requests_answered: AtomicU64,
    /// Network-management requests (`0820`, `0800`) read on out links.
    pub network_requests: AtomicU64,
    /// Their responses (`0830`, `0810`) written on an in link.
    pub network_answered: AtomicU64,
    /// Responses (to member or network requests) dropped: no live in link, or
    /// every in-link queue full, or too many waiting out their delay.
    pub responses_unsent: AtomicU64,
    /// `0000` frames read on any link.
    pub keepalives_received: AtomicU64,
    /// `0000` frames written on idle in links.
    pub keepalives_sent: AtomicU64,
    /// `0820` echo tests written on an in link.
    pub echo_sent: AtomicU64,
    /// `0830`s read on an out link matching an echo test.
    pub echo_answered: AtomicU64,
    /// Echo tests without an `0830` within `timeout`.
    pub echo_unanswered: AtomicU64,
    /// In-link connections made.
    pub in_links_opened: AtomicU64,
    /// In links live now.
    pub in_links_up: AtomicU64,
    /// Out-link connections accepted (and kept).
    pub out_links_accepted: AtomicU64,
    /// Out links live now.
    pub out_links_up: AtomicU64,
    /// Out links closed at once because too many were open.
    pub out_links_refused: AtomicU64,
    /// Frames that did not parse, or prefixes that could not be trusted.
    pub bad_frames: AtomicU64,
    /// Message frames the switch wrote on an in link (it should only read them).
    pub unexpected_on_in_links: AtomicU64,
    /// Frames read on an out link before its sign-on (`require_sign_on`):
    /// refused, never answered.
    pub unsigned_frames: AtomicU64,
    /// Sign-on 0820s answered (`require_sign_on`).
    pub sign_ons: AtomicU64,
    /// Times every out link was dropped at once (`drop_out_links_every`).
    pub out_link_drops: AtomicU64,
    /// Answers to member requests written on an in link to another host than
    /// the out link the request came on (another switch instance), by
    /// `"from->to"` host pair.
    pub crossed: Mutex<std::collections::BTreeMap<String, u64>>,
}

/// What the simulated UnionPay saw.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CupsReport {
    pub sent: u64,
    pub answered: u64,
    pub declined: u64,
    pub mismatched: u64,
    pub unanswered: u64,
    pub unsent: u64,
    pub member_requests: u64,
    pub member_requests_answered: u64,
    pub keepalives_received: u64,
    pub echo_sent: u64,
    pub echo_answered: u64,
    pub in_links_up: u64,
    pub out_links_accepted: u64,
    pub bad_frames: u64,
    pub unsigned_frames: u64,
    pub sign_ons: u64,
    pub out_link_drops: u64,
    /// Member answers that went to another host than their request came
    /// from, by `"from->to"` (see [`CupsSimStats::crossed`]).
    pub crossed: std::collections::BTreeMap<String, u64>,
}

impl CupsReport {
    fn from_stats(s: &CupsSimStats) -> CupsReport {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CupsReport {
            sent: get(&s.sent),
            answered: get(&s.answered),
            declined: get(&s.declined),
            mismatched: get(&s.mismatched),
            unanswered: get(&s.unanswered),
            unsent: get(&s.unsent),
            member_requests: get(&s.member_requests),
            member_requests_answered: get(&s.member_requests_answered),
            keepalives_received: get(&s.keepalives_received),
            echo_sent: get(&s.echo_sent),
            echo_answered: get(&s.echo_answered),
            in_links_up: get(&s.in_links_up),
            out_links_accepted: get(&s.out_links_accepted),
            bad_frames: get(&s.bad_frames),
            unsigned_frames: get(&s.unsigned_frames),
            sign_ons: get(&s.sign_ons),
            out_link_drops: get(&s.out_link_drops),
            crossed: lock(&s.crossed).clone(),
        }
    }
}

impl std::fmt::Display for CupsReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sent {} answered {} declined {} mismatched {} unanswered {} unsent {} \
             member_requests {} member_requests_answered {} keepalives_received {} \
             echo_sent {} echo_answered {} in_links_up {} out_links_accepted {} bad_frames {} \
             unsigned_frames {} sign_ons {}",
            self.sent,
            self.answered,
            self.declined,
            self.mismatched,
            self.unanswered,
            self.unsent,
            self.member_requests,
            self.member_requests_answered,
            self.keepalives_received,
            self.echo_sent,
            self.echo_answered,
            self.in_links_up,
            self.out_links_accepted,
            self.bad_frames,
            self.unsigned_frames,
            self.sign_ons
        )
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
            next_answer: AtomicUsize::new(0),
            next_link_id: AtomicU64::new(1),
            outstanding: Mutex::new(HashMap::new()),
            stan: AtomicU32::new((entropy_seed() % 999_999) as u32 + 1),
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
        if shared.cfg.rate.is_some_and(|r| r > 0.0) {
            tasks.spawn(originate(Arc::clone(&shared), rx.clone()));
        }
        if let Some(every) = shared.cfg.drop_out_links_every.filter(|d| !d.is_zero()) {
            tasks.spawn(drop_out_links(Arc::clone(&shared), every, rx.clone()));
        }
        tasks.spawn(sweep(Arc::clone(&shared), rx));
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
        lock(&self.shared.outstanding).len()
    }

    /// Sends an `0820` echo test (F70 `301`) on a live in link; the switch's
    /// `0830` is expected on an out link. `false` if no in link could take it.
    pub fn send_echo(&self) -> bool {
        self.shared.send_echo()
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
        let left: Vec<Pending> = lock(&self.shared.outstanding)
            .drain()
            .map(|(_, p)| p)
            .collect();
        for p in left {
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
    let sim = CupsSim::start(spec, cfg).await?;
    tokio::select! {
        _ = tokio::time::sleep(duration) => {}
        _ = stop => sim.stop_originating(),
    }
    let deadline = deadline_after(timeout);
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
    /// Round-robin cursor of member answers alone: their in links then take
    /// turns whatever else is sent, so with several switch instances the
    /// answers to each instance's requests spread over all of them (on the
    /// shared cursor the interleaving with other traffic could lock one
    /// instance's answers onto its own in links).
    next_answer: AtomicUsize,
    next_link_id: AtomicU64,
    /// Requests the simulator sent, by F7 + F11 + F32 + F33.
    outstanding: Mutex<HashMap<Key, Pending>>,
    /// Last STAN used (1..=999999).
    stan: AtomicU32,
    /// Member responses waiting out their delay.
    delayed: Arc<super::DelayedAnswers>,
    issuer: Option<IssuerTemplate>,
    /// Closed by [`CupsSim::stop_originating`].
    originating: super::OriginateGate,
    shutdown: watch::Receiver<bool>,
}

/// A live in link, as senders see it.
struct InLink {
    id: u64,
    /// The switch host it connects to.
    host: std::net::IpAddr,
    tx: mpsc::Sender<Outbound>,
    /// Microseconds since `Shared::base` of the last frame queued on it.
    last_sent: Arc<AtomicU64>,
    close: Arc<Notify>,
}

/// A live out link, as `close_out_links` sees it.
struct OutLink {
    id: u64,
    close: Arc<Notify>,
}

/// F7 + F11 + F32 + F33 of a request, each with its length.
type Key = Vec<u8>;

/// Which in links an answer may go out on.
#[derive(Clone, Copy, Debug)]
enum To {
    /// One to this switch host if there is one (network management: the
    /// instance that asked), else any.
    Host(Option<IpAddr>),
    /// Any (a member answer, as UnionPay sends them); the host its request
    /// came from, for counting answers that crossed to another instance.
    Any(Option<IpAddr>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Issuer,
    Echo,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    kind: Kind,
    /// The MTI its response must carry.
    response: Mti,
    deadline: Instant,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn close_links<T>(links: &Mutex<Vec<T>>, n: usize, close: impl Fn(&T) -> &Arc<Notify>) -> usize {
    let links = lock(links);
    let mut closed = 0;
    for l in links.iter().take(n) {
        close(l).notify_one();
        closed += 1;
    }
    closed
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
    fn now_micros(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Queues `item` on the next live in link (round-robin) that can take it.
    fn send_in(&self, item: Outbound) -> bool {
        self.send_in_where(item, &self.next_in, |_| true).is_some()
    }

    /// Queues `item` on the next live in link (round-robin) to `host`, or on
    /// any in link if none goes there: network management answers go back
    /// to the switch instance that asked, as UnionPay answers the front-end
    /// processor that signed a link on.
    fn send_in_to_host(&self, item: Outbound, host: Option<std::net::IpAddr>) -> bool {
        match host {
            Some(h) if lock(&self.in_links).iter().any(|l| l.host == h) => self
                .send_in_where(item, &self.next_in, |l| l.host == h)
                .is_some(),
            _ => self.send_in(item),
        }
    }

    /// Queues `item` on the next live in link (round-robin) that `pick`
    /// allows and can take it; the host it went to.
    fn send_in_where(
        &self,
        mut item: Outbound,
        cursor: &AtomicUsize,
        pick: impl Fn(&InLink) -> bool,
    ) -> Option<std::net::IpAddr> {
        let links = lock(&self.in_links);
        let n = links.len();
        if n == 0 {
            return None;
        }
        let start = cursor.fetch_add(1, Ordering::Relaxed) % n;
        for k in 0..n {
            let link = &links[(start + k) % n];
            if !pick(link) {
                continue;
            }
            match link.tx.try_send(item) {
                Ok(()) => {
                    link.last_sent.store(self.now_micros(), Ordering::Relaxed);
                    return Some(link.host);
                }
                Err(
                    mpsc::error::TrySendError::Full(it) | mpsc::error::TrySendError::Closed(it),
                ) => {
                    item = it;
                }
            }
        }
        None
    }

    /// The next STAN, 1..=999999 then round again. A STAN that comes round
    /// while its last use is still outstanding is refused by [`Shared::expect`].
    fn next_stan(&self) -> [u8; 6] {
        let s = self
            .stan
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some(s % 999_999 + 1)
            })
            .map_or(1, |prev| prev % 999_999 + 1);
        let mut out = [b'0'; 6];
        crate::wire::write_ascii_decimal(&mut out, u64::from(s));
        out
    }

    /// Registers a request as outstanding; `false` if the table is full or the
    /// key is taken (the STAN wrapped within one timeout).
    fn expect(&self, key: Key, pending: Pending) -> bool {
        let mut out = lock(&self.outstanding);
        if out.len() >= MAX_OUTSTANDING || out.contains_key(&key) {
            return false;
        }
        out.insert(key, pending);
        true
    }

    fn forget(&self, key: &Key) {
        lock(&self.outstanding).remove(key);
    }

    fn count_expired(&self, p: &Pending) {
        let c = match p.kind {
            Kind::Issuer => &self.stats.unanswered,
            Kind::Echo => &self.stats.echo_unanswered,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// One issuer request on the next in link.
    fn send_issuer_request(&self) -> bool {
        let f7 = transmission_time();
        let f11 = self.next_stan();
        let mut f37 = [b'0'; 12];
        f37[..6].copy_from_slice(&f7[4..]);
        f37[6..].copy_from_slice(&f11);
        let Some(t) = &self.issuer else {
            return false;
        };
        let mut patch = Patch::default();
        if patch.overwrite(t.f7.start, &f7).is_err()
            || patch.overwrite(t.f11.start, &f11).is_err()
            || patch.overwrite(t.f37.start, &f37).is_err()
        {
            return false;
        }
        let k = key(&f7, &f11, &t.f32, &t.f33);
        let pending = Pending {
            kind: Kind::Issuer,
            response: t.response,
            deadline: deadline_after(self.cfg.timeout),
        };
        if !self.expect(k.clone(), pending) {
            return false;
        }
        if self.send_in(Outbound::Message(t.payload.clone(), patch)) {
            true
        } else {
            self.forget(&k);
            false
        }
    }

    fn send_echo(&self) -> bool {
        let Some((payload, k, response)) = self.echo_request() else {
            return false;
        };
        let pending = Pending {
            kind: Kind::Echo,
            response,
            deadline: deadline_after(self.cfg.timeout),
        };
        if !self.expect(k.clone(), pending) {
            return false;
        }
        if self.send_in(Outbound::message(payload)) {
            self.stats.echo_sent.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            self.forget(&k);
            false
        }
    }

    /// An `0820` echo test from UnionPay: F7, F11, F33, F53, F70 `301`, F100.
    fn echo_request(&self) -> Option<(Bytes, Key, Mti)> {
        let spec = &*self.spec;
        let mut d = samples::echo(spec);
        d.envelope = from_cups_envelope(spec);
        let f7 = transmission_time();
        let f11 = self.next_stan();
        for (id, text) in [(7, &f7[..]), (11, &f11[..])] {
            if spec.field(id).is_some() {
                d.set_text(id, String::from_utf8_lossy(text));
            }
        }
        for id in [53, 100] {
            if let (Some(_), Some(v)) = (spec.field(id), samples::value(id)) {
                d.set(id, v);
            }
        }
        let response = response_mti(d.mti)?;
        let payload = Bytes::from(spec.encode(&d).ok()?);
        let msg = Message::parse(spec, payload.clone()).ok()?;
        let k = key_of(&msg)?;
        Some((payload, k, response))
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
        let network = mti.is_network_management();
        let (received, answered) = if network {
            (&self.stats.network_requests, &self.stats.network_answered)
        } else {
            (
                &self.stats.member_requests,
                &self.stats.member_requests_answered,
            )
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
        let delay = if network {
            Duration::ZERO
        } else {
            self.cfg.delay.sample(rng)
        };
        let to = if network {
            To::Host(from)
        } else {
            To::Any(from)
        };
        if delay.is_zero() {
            self.deliver(response, answered, to);
        } else {
            self.deliver_later(response, delay, to);
        }
    }

    /// A frame on an out link that has not signed on: its sign-on 0820 is
    /// answered (after `sign_on_delay`) and signs the link on; anything else is
    /// refused and counted.
    fn before_sign_on(
        self: &Arc<Shared>,
        payload: Bytes,
        signed_on: &Arc<std::sync::atomic::AtomicBool>,
        from: Option<IpAddr>,
    ) {
        let answer = Message::parse(&self.spec, payload).ok().and_then(|msg| {
            let sign_on = msg.mti().is_network_management()
                && msg.mti().is_request()
                && matches!(msg.field(70), Ok(Some(f)) if f.eq_logical(b"001"));
            if !sign_on {
                return None;
            }
            answer::answer(&self.spec, &msg, "00").ok()
        });
        let Some(answer) = answer else {
            self.stats.unsigned_frames.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.stats.network_requests.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::clone(self);
        let signed_on = Arc::clone(signed_on);
        let delay = self.cfg.sign_on_delay;
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            // Signed on before the 0830 leaves: whatever the switch writes
            // after reading it is read after this.
            signed_on.store(true, Ordering::Release);
            shared.stats.sign_ons.fetch_add(1, Ordering::Relaxed);
            shared.deliver(answer, &shared.stats.network_answered, To::Host(from));
        });
    }

    /// Writes a response on an in link and counts it under `answered`.
    fn deliver(&self, response: Bytes, answered: &AtomicU64, to: To) {
        let out = Outbound::message(response);
        let sent = match to {
            To::Host(host) => self.send_in_to_host(out, host),
            To::Any(from) => match self.send_in_where(out, &self.next_answer, |_| true) {
                Some(host) => {
                    if let Some(from) = from.filter(|f| *f != host) {
                        *lock(&self.stats.crossed)
                            .entry(format!("{from}->{host}"))
                            .or_default() += 1;
                    }
                    true
                }
                None => false,
            },
        };
        let counter = if sent {
            answered
        } else {
            &self.stats.responses_unsent
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn deliver_later(self: &Arc<Shared>, response: Bytes, delay: Duration, to: To) {
        let shared = Arc::clone(self);
        let send = move || shared.deliver(response, &shared.stats.member_requests_answered, to);
        if !self.delayed.send_after(delay, self.shutdown.clone(), send) {
            self.stats.responses_unsent.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A response read on an out link: to an issuer request or an echo test.
    fn on_response(&self, msg: &Message<'_>) {
        let Some(k) = key_of(msg) else {
            self.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let found = {
            let mut out = lock(&self.outstanding);
            match out.get(&k) {
                Some(p) if p.response == msg.mti() => out.remove(&k),
                _ => None,
            }
        };
        let stats = &self.stats;
        let counter = match found.map(|p| p.kind) {
            None => &stats.mismatched,
            Some(Kind::Echo) => &stats.echo_answered,
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

    /// Expires outstanding requests past their deadline.
    fn expire(&self, now: Instant) {
        let expired: Vec<Pending> = {
            let mut out = lock(&self.outstanding);
            let mut gone = Vec::new();
            out.retain(|_, p| {
                let keep = p.deadline > now;
                if !keep {
                    gone.push(*p);
                }
                keep
            });
            gone
        };
        for p in &expired {
            self.count_expired(p);
        }
    }
}

/// Accepts the switch's out links and reads each until it closes.
async fn accept_out_links(
    shared: Arc<Shared>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    let max = shared
        .cfg
        .links
        .max(1)
        .saturating_mul(OUT_LINKS_PER_IN_LINK);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else {
                    // Out of descriptors or similar: do not spin.
                    tokio::time::sleep(RECONNECT_MIN).await;
                    continue;
                };
                if lock(&shared.out_links).len() >= max {
                    shared.stats.out_links_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, max, "sim cups: out link refused, too many open");
                    drop(stream);
                    continue;
                }
                conns.spawn(serve_out_link(Arc::clone(&shared), stream, shutdown.clone()));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// Reads one out link: UnionPay never writes on it.
async fn serve_out_link(
    shared: Arc<Shared>,
    stream: TcpStream,
    mut shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    // The switch instance this out link comes from.
    let from = stream.peer_addr().ok().map(|a| a.ip());
    let id = shared.next_link_id.fetch_add(1, Ordering::Relaxed);
    let close = Arc::new(Notify::new());
    {
        let mut links = lock(&shared.out_links);
        links.push(OutLink {
            id,
            close: Arc::clone(&close),
        });
        shared
            .stats
            .out_links_accepted
            .fetch_add(1, Ordering::Relaxed);
        shared.stats.out_links_up.fetch_add(1, Ordering::Relaxed);
    }
    let framing = shared.spec.framing();
    let mut frames = FramedRead::new(stream, FrameCodec::new(framing.prefix, framing.max_frame));
    let mut rng = Rng::from_entropy();
    let signed_on = Arc::new(std::sync::atomic::AtomicBool::new(
        !shared.cfg.require_sign_on,
    ));
    // A frame begun must end within this (a stalled peer cannot hold a buffer).
    let partial_limit = shared.cfg.timeout.max(Duration::from_secs(1));
    let mut closing = false;
    loop {
        let partial = frames.decoder().in_frame() || !frames.read_buffer().is_empty();
        let next = async {
            if partial {
                tokio::time::timeout(partial_limit, frames.next())
                    .await
                    .ok()
            } else {
                Some(frames.next().await)
            }
        };
        let frame = tokio::select! {
            f = next => f,
            _ = close.notified(), if !closing => {
                // A graceful close: half-close our side and keep reading until the
                // switch closes too, so nothing it already wrote is lost.
                closing = true;
                let _ = frames.get_mut().shutdown().await;
                lock(&shared.out_links).retain(|l| l.id != id);
                shared.stats.out_links_up.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            _ = shutdown.changed() => break,
        };
        match frame {
            Some(Some(Ok(_))) if !signed_on.load(Ordering::Acquire) => {
                if let Some(Some(Ok(Frame::Message(payload)))) = frame {
                    shared.before_sign_on(payload, &signed_on, from);
                } else {
                    shared.stats.unsigned_frames.fetch_add(1, Ordering::Relaxed);
                }
            }
            Some(Some(Ok(Frame::Message(payload)))) => shared.on_out_link(payload, &mut rng, from),
            Some(Some(Ok(Frame::KeepAlive))) => {
                shared
                    .stats
                    .keepalives_received
                    .fetch_add(1, Ordering::Relaxed);
            }
            Some(Some(Ok(Frame::SessionControl(_)))) => {
                shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
            }
            Some(Some(Err(e))) => {
                // The prefix cannot be trusted: this link only is closed.
                tracing::debug!(error = %e, "sim cups: out link closed on a bad frame");
                shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                break;
            }
            Some(None) => break,
            None => {
                tracing::debug!("sim cups: out link closed, a partial frame stalled");
                shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
    }
    if !closing {
        let mut links = lock(&shared.out_links);
        links.retain(|l| l.id != id);
        shared.stats.out_links_up.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Keeps one in link open: connects, serves it until it closes, waits a short
/// backoff, connects again.
async fn keep_in_link(
    shared: Arc<Shared>,
    target: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = RECONNECT_MIN;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let connect = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target));
        let connected = tokio::select! {
            r = connect => r,
            _ = shutdown.changed() => return,
        };
        match connected {
            Ok(Ok(stream)) => {
                backoff = RECONNECT_MIN;
                serve_in_link(&shared, stream, target.ip(), &mut shutdown).await;
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, connect = %target, "sim cups: in link connect failed");
                backoff = (backoff * 2).min(RECONNECT_MAX);
            }
            Err(_) => backoff = (backoff * 2).min(RECONNECT_MAX),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Serves one connected in link until it closes, is closed on demand, or the
/// simulator stops.
async fn serve_in_link(
    shared: &Arc<Shared>,
    stream: TcpStream,
    host: IpAddr,
    shutdown: &mut watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let (read, write) = stream.into_split();
    let framing = shared.spec.framing();
    let (tx, rx) = mpsc::channel(IN_LINK_QUEUE);
    let mut writer = tokio::spawn(run_writer(write, framing.prefix, rx));
    let id = shared.next_link_id.fetch_add(1, Ordering::Relaxed);
    let close = Arc::new(Notify::new());
    let last_sent = Arc::new(AtomicU64::new(shared.now_micros()));
    {
        let mut links = lock(&shared.in_links);
        links.push(InLink {
            id,
            host,
            tx: tx.clone(),
            last_sent: Arc::clone(&last_sent),
            close: Arc::clone(&close),
        });
        shared.stats.in_links_opened.fetch_add(1, Ordering::Relaxed);
        shared.stats.in_links_up.fetch_add(1, Ordering::Relaxed);
    }
    let mut frames = FramedRead::new(read, FrameCodec::new(framing.prefix, framing.max_frame));
    let idle = shared.cfg.keepalive_idle;
    let mut closing = false;
    loop {
        let keepalive_due = (!idle.is_zero())
            .then(|| shared.base + Duration::from_micros(last_sent.load(Ordering::Relaxed)) + idle);
        let keepalive = async {
            match keepalive_due {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = keepalive => {
                let now = shared.now_micros();
                let last = last_sent.load(Ordering::Relaxed);
                let idle_us = u64::try_from(idle.as_micros()).unwrap_or(u64::MAX);
                if now.saturating_sub(last) >= idle_us {
                    // A full queue is traffic enough: no keep-alive needed.
                    if tx.try_send(Outbound::KeepAlive).is_ok() {
                        shared.stats.keepalives_sent.fetch_add(1, Ordering::Relaxed);
                    }
                    last_sent.store(now, Ordering::Relaxed);
                }
            }
            frame = frames.next() => match frame {
                Some(Ok(Frame::KeepAlive)) => {
                    shared.stats.keepalives_received.fetch_add(1, Ordering::Relaxed);
                }
                Some(Ok(_)) => {
                    shared.stats.unexpected_on_in_links.fetch_add(1, Ordering::Relaxed);
                }
                Some(Err(_)) => {
                    shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                None => break,
            },
            _ = &mut writer => break,
            _ = close.notified() => {
                closing = true;
                break;
            }
            _ = shutdown.changed() => break,
        }
    }
    {
        let mut links = lock(&shared.in_links);
        links.retain(|l| l.id != id);
        shared.stats.in_links_up.fetch_sub(1, Ordering::Relaxed);
    }
    if closing && !writer.is_finished() {
        // A graceful close on demand: no new frames, flush what is queued,
        // then FIN (the writer shuts the write half down when its queue closes).
        drop(tx);
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut writer).await;
    }
    writer.abort();
}

/// Sends issuer requests at `rate` for `duration`.
async fn originate(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let rate = shared.cfg.rate.unwrap_or(0.0);
    if !(rate > 0.0 && rate.is_finite()) {
        return;
    }
    let start = Instant::now();
    let stop_at = start.checked_add(shared.cfg.duration);
    let period = Duration::from_secs_f64((1.0 / rate).clamp(0.001, 3600.0));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut due_so_far: u64 = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now = Instant::now();
        if stop_at.is_some_and(|s| now >= s) {
            return;
        }
        // One request at start, then as many as the rate owes by now.
        let due = (now.duration_since(start).as_secs_f64() * rate) as u64 + 1;
        let owed = due.saturating_sub(due_so_far).min(MAX_BURST);
        due_so_far = due;
        let issued = shared.originating.issue(|| {
            for _ in 0..owed {
                let counter = if shared.send_issuer_request() {
                    &shared.stats.sent
                } else {
                    &shared.stats.unsent
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        });
        if issued.is_none() {
            return;
        }
    }
}

/// Closes every out link at once, every `every`, as a lost line to all of
/// them would.
async fn drop_out_links(shared: Arc<Shared>, every: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let n = close_links(&shared.out_links, usize::MAX, |l| &l.close);
                shared.stats.out_link_drops.fetch_add(1, Ordering::Relaxed);
                tracing::info!(closed = n, "sim cups: every out link dropped");
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// Counts requests unanswered past their deadline.
async fn sweep(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let every =
        (shared.cfg.timeout / 4).clamp(Duration::from_millis(5), Duration::from_millis(100));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => shared.expire(Instant::now()),
            _ = shutdown.changed() => return,
        }
    }
}

/// The issuer request, encoded once; each request patches F7, F11 and F37.
struct IssuerTemplate {
    payload: Bytes,
    response: Mti,
    f7: std::ops::Range<usize>,
    f11: std::ops::Range<usize>,
    f37: std::ops::Range<usize>,
    f32: Vec<u8>,
    f33: Vec<u8>,
}

impl IssuerTemplate {
    /// An `0100` authorisation from UnionPay to the member: the sample purchase
    /// with the header turned around.
    fn new(spec: &Spec) -> Result<IssuerTemplate, String> {
        let mti = Mti::new(*b"0100").ok_or("bad MTI")?;
        let mut d: Decoded = samples::purchase(spec);
        d.mti = mti;
        d.envelope = from_cups_envelope(spec);
        d.set_text(7, "0000000000");
        d.set_text(11, "000000");
        d.set_text(37, "000000000000");
        let payload = Bytes::from(spec.encode(&d).map_err(|e| e.to_string())?);
        let msg = Message::parse(spec, payload.clone()).map_err(|e| e.to_string())?;
        let ascii = |id: u16, len: usize| -> Result<std::ops::Range<usize>, String> {
            match msg.field(id) {
                Ok(Some(f)) if f.data().len() == len && f.data().iter().all(|&b| b == b'0') => {
                    Ok(f.range())
                }
                _ => Err(format!(
                    "spec `{}` needs F{id} as {len} ASCII characters",
                    spec.name()
                )),
            }
        };
        let data = |id: u16| -> Vec<u8> {
            match msg.field(id) {
                Ok(Some(f)) => f.data().to_vec(),
                _ => Vec::new(),
            }
        };
        Ok(IssuerTemplate {
            f7: ascii(7, 10)?,
            f11: ascii(11, 6)?,
            f37: ascii(37, 12)?,
            f32: data(32),
            f33: data(33),
            response: response_mti(mti).ok_or("0100 has no response MTI")?,
            payload,
        })
    }
}

/// `timeout` from now; a timeout too long for the clock means a year.
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(now)
}

/// The sample envelope turned around: from UnionPay to the member.
fn from_cups_envelope(spec: &Spec) -> Vec<u8> {
    let mut env = samples::envelope(spec);
    answer::turn_envelope(spec.envelope(), &mut env);
    env
}

/// F7 now: `MMDDhhmmss`, UTC.
fn transmission_time() -> [u8; 10] {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    crate::iso8583::transmission_date_time(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transmission_time_is_ten_digits() {
        let f7 = transmission_time();
        assert!(f7.iter().all(u8::is_ascii_digit));
    }

    #[test]
    fn issuer_template_is_an_0100_from_unionpay() {
        let spec = Spec::builtin("cups").unwrap();
        let t = IssuerTemplate::new(&spec).unwrap();
        let msg = Message::parse(&spec, t.payload.clone()).unwrap();
        assert_eq!(msg.mti().as_str(), "0100");
        assert_eq!(t.response.as_str(), "0110");
        let Some(crate::wire::Header::Cups(h)) = msg.envelope().header else {
            panic!("a CUPS header");
        };
        assert_eq!(h.source_id(), CUPS_ID);
        assert_eq!((t.f7.len(), t.f11.len(), t.f37.len()), (10, 6, 12));
        assert!(!t.f32.is_empty() && !t.f33.is_empty());
        // A spec with BCD F11 (POS) cannot carry the simulator's requests.
        let binary = Spec::builtin("cup-pos").unwrap();
        assert!(IssuerTemplate::new(&binary).is_err());
    }

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
