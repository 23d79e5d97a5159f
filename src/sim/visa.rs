//! `isoswitch sim visa` / `sim network --dialect`: a card network's side of
//! duplex links, VISA's (BASE I) or Mastercard's (Banknet); what differs
//! between the two is in [`Network`], the rest comes from the spec.
//!
//! Every link carries both directions. The simulator
//!
//! - **accepts** the bank's links (the switch's `connect` front dials them) or
//!   **dials** `links` links itself, and keeps what it dialled up;
//! - **signs on** each link as it comes up (VISA: `0800` F70 `001`); a link
//!   carries the simulator's own requests only once its sign-on is approved
//!   (the `0810` may come back on any link: it is matched by F7 + F11).
//!   Mastercard does not sign on: a link carries its requests from the
//!   member's group sign-on (`061`) on it to the member's sign-off (`062`);
//! - answers the bank's network management (`0800` sign-on, sign-off, echo) with
//!   an `0810` F39 `00` on the link it came on, and sends its own echo tests;
//! - as **acquirer for the bank's cards**, sends issuer requests (`0100` /
//!   `0200`) at a rate and checks every answer: exactly one, with the MTI, F4,
//!   F37 and F41 of its request;
//! - as **issuer for the bank's acquiring**, answers the requests the bank's
//!   nodes send, on a link **other than** the one the request came on, so that
//!   only the F37 node stamp can bring each answer back to its node;
//! - approves a share of those late (`late`), past the switch's timeout,
//!   and keeps books of the reversals the switch then owes it
//!   ([`crate::sim::ledger`], as `sim node` and `sim cups` do): each
//!   reversal (VISA `0420`/`0421`, Mastercard `0400`/`0401`) is read by its
//!   own F90 parse ([`crate::sim::original`]), booked in its chain and
//!   answered (the first `ignore_reversals` of each chain are left
//!   unanswered);
//! - starts key exchanges (`0800` F70 `161`) every `key_reset_every` and
//!   counts the answers by F39, and counts the bank's own key requests by
//!   F70: key management belongs to the bank's hosts, not to the switch.
//!
//! Written independently of the switch: it frames with [`crate::wire`], parses
//! and builds with [`crate::iso8583`], and has its own writer and its own
//! response builder. Every queue and table is bounded, every wait has a
//! deadline, and nothing read from a socket can make it panic: a frame that does
//! not parse is counted and dropped; a length prefix that cannot be trusted
//! closes that link only.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

mod issuer;
mod links;
mod netmgmt;
mod network;
mod owed;
mod report;

pub use network::Network;

pub use report::{VisaReport, VisaSimStats};

use issuer::originate;
use links::{LinkHandle, accept_links, keep_link};
use network::check_spec;
use owed::reset_keys;

use crate::iso8583::{Decoded, IsoError, Message, Mti, Spec};
use crate::sim::answer;
use crate::sim::ledger::{LateApprovals, is_approvable};
use crate::sim::node::Delay;
use crate::sim::original::OriginalKey;
use crate::sim::peer::{Outstanding, deadline_after, lock};
use crate::util::rng::{Rng, entropy_seed};

/// VISA's station ID (source of what it sends), BCD.
pub const VISA_STATION: [u8; 3] = [0x00, 0x00, 0x01];
/// The bank's station ID (destination of what VISA sends), BCD.
pub const BANK_STATION: [u8; 3] = [0x45, 0x67, 0x89];

/// Frames queued per link before senders move on to another link.
const LINK_QUEUE: usize = 4096;
/// Keys of requests already answered or expired, remembered to tell a second
/// answer (or a late one) from an unknown one.
const MAX_DONE: usize = 1_000_000;
/// Answers to the bank waiting for a link to come up, at most.
const MAX_PARKED: usize = 10_000;
/// Accepted links beyond `links` x this are closed at once.
const ACCEPT_FACTOR: usize = 4;
/// Distinct F37 stamps counted in the report, at most.
const MAX_STAMPS: usize = 256;
/// How long a link closed on demand waits for the bank to close its side.
const CLOSE_GRACE: Duration = Duration::from_secs(3);
/// How long `stop` waits for tasks before aborting them.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// Fields of an issuer response that must equal the request's (with the MTI
/// and F7 + F11, which find the request).
const CHECKED: [u16; 4] = [4, 32, 37, 41];

/// Who opens the links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dial {
    /// The bank (the switch's `connect` front) dials; VISA listens here.
    Accept(SocketAddr),
    /// VISA dials the bank here.
    Connect(SocketAddr),
}

/// What the simulated VISA does.
#[derive(Clone, Debug)]
pub struct VisaSimConfig {
    pub dial: Dial,
    /// Links dialled and kept up (`Connect`); links expected (`Accept`: up to
    /// 4 x this are accepted at once).
    pub links: usize,
    /// Issuer requests per second; `None` or 0 = none.
    pub rate: Option<f64>,
    /// Stop originating after this many issuer requests (default: no limit).
    pub count: Option<u64>,
    /// MTIs of the issuer requests, used in turn (`0100`, `0200`).
    pub mtis: Vec<Mti>,
    /// How long it originates requests at most (and how long [`run`] runs when
    /// there is no `count`).
    pub duration: Duration,
    /// A request unanswered this long counts as unanswered; [`run`] waits this
    /// long for stragglers.
    pub timeout: Duration,
    /// Sign each link on before sending issuer requests on it.
    pub sign_on: bool,
    /// Resend an unanswered sign-on after this long.
    pub sign_on_retry: Duration,
    /// Send an echo test on each link this often (zero = never).
    pub echo_interval: Duration,
    /// Send a zero-length poll on a link not written for this long (zero = never).
    pub keepalive_idle: Duration,
    /// How long it waits before answering a bank request.
    pub delay: Delay,
    /// Answer the requests the bank's nodes send (false leaves them to the
    /// switch's and the nodes' timeouts).
    pub answer_bank_requests: bool,
    /// Where in F37 (offset, width) the bank's node ID is expected: counted per
    /// value in the report.
    pub stamp: Option<(usize, usize)>,
    /// Start with issuer requests held until [`VisaSim::resume`] (e.g. until
    /// the bank's nodes are up).
    pub paused: bool,
    /// TLS on the links (`--tls-*`): as server when accepting, as client
    /// when dialling; plain by default.
    pub tls: crate::tls::tools::SimTls,
    /// A share of the bank's requests it approves answered late, each
    /// recorded: the switch should reverse every one toward VISA.
    pub late: Option<LateApprovals>,
    /// The first N reversal messages of each chain are left unanswered.
    pub ignore_reversals: u32,
    /// Start a dynamic key exchange (`0800` F70 [`KEY_RESET_F70`]) this
    /// often while originating, on a signed-on link: the bank's key node
    /// must answer it (none = never).
    pub key_reset_every: Option<Duration>,
    /// F70 of those key exchanges (default [`KEY_RESET_F70`]).
    pub key_reset_f70: String,
}

/// F70 of the key exchange VISA starts by default: 161, "new key" of BASE
/// I's dynamic key exchange (an institution code in `visa-base1`).
pub const KEY_RESET_F70: &str = "161";

impl VisaSimConfig {
    /// Defaults: no issuer requests, 10 s run, 3 s timeout, sign-on on, echo
    /// every 60 s, poll after 30 s idle, bank requests answered at once.
    pub fn new(dial: Dial, links: usize) -> VisaSimConfig {
        VisaSimConfig {
            dial,
            links,
            rate: None,
            count: None,
            mtis: vec![mti(*b"0100"), mti(*b"0200")],
            duration: Duration::from_secs(10),
            timeout: Duration::from_secs(3),
            sign_on: true,
            sign_on_retry: Duration::from_secs(1),
            echo_interval: Duration::from_secs(60),
            keepalive_idle: Duration::from_secs(30),
            delay: Delay::NONE,
            answer_bank_requests: true,
            stamp: Some((10, 2)),
            paused: false,
            tls: Default::default(),
            late: None,
            ignore_reversals: 0,
            key_reset_every: None,
            key_reset_f70: KEY_RESET_F70.to_string(),
        }
    }
}

fn mti(digits: [u8; 4]) -> Mti {
    // The callers pass literal four-digit MTIs.
    Mti::new(digits).unwrap_or_else(|| unreachable!("four ASCII digits"))
}

/// A running simulated VISA.
pub struct VisaSim {
    shared: Arc<Shared>,
    local_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl VisaSim {
    /// Binds (in `Accept` mode), then in the background keeps the links,
    /// signs them on and originates issuer requests. Returns once bound: the
    /// bank need not be up yet.
    pub async fn start(spec: Arc<Spec>, cfg: VisaSimConfig) -> std::io::Result<VisaSim> {
        let network = check_spec(&spec)?;
        let (shutdown, rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            spec,
            network,
            stats: Arc::new(VisaSimStats::default()),
            base: Instant::now(),
            links: Mutex::new(Vec::new()),
            next_link: AtomicUsize::new(0),
            next_link_id: AtomicU64::new(1),
            outstanding: Outstanding::default(),
            done: Mutex::new(Done::default()),
            stan: AtomicU32::new((entropy_seed() % 999_999) as u32 + 1),
            next_mti: AtomicUsize::new(0),
            delayed: Arc::default(),
            stamps: Mutex::new(BTreeMap::new()),
            paused: AtomicBool::new(cfg.paused),
            parked: Mutex::new(VecDeque::new()),
            shutdown: rx.clone(),
            cfg,
        });
        let mut tasks = JoinSet::new();
        let local_addr = match shared.cfg.dial {
            Dial::Accept(addr) => {
                let listener = TcpListener::bind(addr).await?;
                let local = listener.local_addr()?;
                tasks.spawn(accept_links(Arc::clone(&shared), listener, rx.clone()));
                Some(local)
            }
            Dial::Connect(_) => {
                for _ in 0..shared.cfg.links {
                    tasks.spawn(keep_link(Arc::clone(&shared), rx.clone()));
                }
                None
            }
        };
        if shared.cfg.rate.is_some_and(|r| r > 0.0) {
            tasks.spawn(originate(Arc::clone(&shared), rx.clone()));
        }
        if let Some(every) = shared.cfg.key_reset_every.filter(|d| !d.is_zero()) {
            tasks.spawn(reset_keys(Arc::clone(&shared), every, rx.clone()));
        }
        let (expiring, timeout) = (Arc::clone(&shared), shared.cfg.timeout);
        tasks.spawn(crate::sim::peer::sweep(timeout, rx, move |now| {
            expiring.expire(now)
        }));
        tracing::info!(dial = ?shared.cfg.dial, links = shared.cfg.links, "sim visa started");
        Ok(VisaSim {
            shared,
            local_addr,
            shutdown,
            tasks,
        })
    }

    /// Where it listens (`Accept` mode).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    pub fn stats(&self) -> Arc<VisaSimStats> {
        Arc::clone(&self.shared.stats)
    }

    /// The counters now.
    pub fn report(&self) -> VisaReport {
        VisaReport::from_stats(&self.shared.stats, lock(&self.shared.stamps).clone())
    }

    /// Requests (issuer, sign-on, echo) awaiting their answer.
    pub fn outstanding(&self) -> usize {
        self.shared.outstanding.len()
    }

    /// The network played (from the spec's envelope).
    pub fn network(&self) -> Network {
        self.shared.network
    }

    /// Links up, and of those signed on (ours to send issuer requests on).
    pub fn links(&self) -> (usize, usize) {
        let links = lock(&self.shared.links);
        let signed = links
            .iter()
            .filter(|l| l.signed_on.load(Ordering::Relaxed))
            .count();
        (links.len(), signed)
    }

    /// Issuer requests sent so far.
    pub fn issuer_sent(&self) -> u64 {
        self.shared.stats.issuer_sent.load(Ordering::Relaxed)
    }

    /// Whether origination is over: `count` requests sent, or `duration` passed.
    pub fn originated_all(&self) -> bool {
        let cfg = &self.shared.cfg;
        cfg.count.is_some_and(|c| self.issuer_sent() >= c)
            || self.shared.base.elapsed() >= cfg.duration
    }

    /// Holds issuer requests (those owed while paused are not made up later).
    pub fn pause(&self) {
        self.shared.paused.store(true, Ordering::Relaxed);
    }

    /// Sends issuer requests again, at the configured rate from now on.
    pub fn resume(&self) {
        self.shared.paused.store(false, Ordering::Relaxed);
    }

    /// Sends an echo test on each link now. Returns how many went out.
    pub fn send_echo(&self) -> usize {
        let ids: Vec<u64> = lock(&self.shared.links).iter().map(|l| l.id).collect();
        ids.into_iter()
            .filter(|&id| self.shared.send_network(id, NmKind::Echo))
            .count()
    }

    /// Drops up to `n` live links (oldest first), as a broken line would, but
    /// gracefully: nothing more is sent on them, what is queued is flushed, and
    /// what the bank already wrote is still read until it closes its side. In
    /// `Connect` mode each is dialled again after a short backoff; in `Accept`
    /// mode dialling again is the bank's job. Returns how many were dropped.
    pub fn close_links(&self, n: usize) -> usize {
        let links = lock(&self.shared.links);
        let mut closed = 0;
        for l in links.iter().take(n) {
            l.close.notify_one();
            closed += 1;
        }
        closed
    }

    /// Closes every link (and the listener). Requests still outstanding count
    /// as unanswered. Returns the final report (`links_up` as it was just
    /// before the stop).
    pub async fn stop(mut self) -> VisaReport {
        let up = self.shared.stats.links_up.load(Ordering::Relaxed);
        let _ = self.shutdown.send(true);
        super::join_within(&mut self.tasks, STOP_GRACE).await;
        for (_, p) in self.shared.outstanding.drain() {
            self.shared.count_expired(&p);
        }
        VisaReport {
            links_up: up,
            ..self.report()
        }
    }
}

/// Runs until origination is over (`count` sent or `duration` passed), waits up
/// to `timeout` for the answers still due, stops and reports.
pub async fn run(spec: Arc<Spec>, cfg: VisaSimConfig) -> std::io::Result<VisaReport> {
    run_until(spec, cfg, std::future::pending()).await
}

/// [`run`], ended early when `interrupted` completes (Ctrl-C): origination
/// stops there, and the answers still due are waited for as at the end.
pub async fn run_until(
    spec: Arc<Spec>,
    cfg: VisaSimConfig,
    interrupted: impl std::future::Future<Output = ()>,
) -> std::io::Result<VisaReport> {
    let timeout = cfg.timeout;
    let sim = VisaSim::start(spec, cfg).await?;
    if let Some(addr) = sim.local_addr() {
        // `sim visa` keeps the line scripts and tests look for.
        match sim.network() {
            Network::Visa => eprintln!("sim visa listening on {addr}"),
            Network::Mastercard => eprintln!("sim network (mastercard) listening on {addr}"),
        }
    }
    tokio::pin!(interrupted);
    while !sim.originated_all() {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            _ = &mut interrupted => break,
        }
    }
    sim.pause();
    let deadline = deadline_after(timeout);
    while sim.outstanding() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(sim.stop().await)
}

/// Everything the tasks share.
struct Shared {
    spec: Arc<Spec>,
    /// The network played: its envelope, who signs links on.
    network: Network,
    cfg: VisaSimConfig,
    stats: Arc<VisaSimStats>,
    /// Clock origin of the links' last-write times and of the run.
    base: Instant,
    links: Mutex<Vec<LinkHandle>>,
    /// Round-robin cursor over the links.
    next_link: AtomicUsize,
    next_link_id: AtomicU64,
    /// Requests sent, by F7 + F11.
    outstanding: Outstanding<Key, Pending>,
    done: Mutex<Done>,
    /// Last STAN used (1..=999999).
    stan: AtomicU32,
    next_mti: AtomicUsize,
    /// Answers to the bank waiting out their delay.
    delayed: Arc<super::DelayedAnswers>,
    stamps: Mutex<BTreeMap<String, u64>>,
    /// Issuer requests are held while this is set.
    paused: AtomicBool,
    /// Answers to the bank waiting for a link, oldest first: when parked, the
    /// link the request came on, the answer.
    parked: Mutex<VecDeque<(Instant, u64, Bytes)>>,
    shutdown: watch::Receiver<bool>,
}

/// F7 (10 digits) and F11 (6 digits) as one number.
type Key = u64;

#[derive(Clone, Debug)]
enum Kind {
    /// An issuer request, with the logical values its answer must echo.
    Issuer {
        echoed: Vec<(u16, Vec<u8>)>,
    },
    /// A sign-on sent on the link with this ID.
    SignOn {
        link: u64,
    },
    Echo,
    /// A key exchange of VISA's, answered by the bank's key node.
    KeyReset,
}

#[derive(Clone, Debug)]
struct Pending {
    kind: Kind,
    response: Mti,
}

/// Keys of requests answered or expired, oldest first out.
#[derive(Default)]
struct Done {
    keys: HashMap<Key, bool>,
    order: VecDeque<Key>,
}

impl Done {
    /// Remembers `key` as answered (`true`) or expired (`false`).
    fn insert(&mut self, key: Key, answered: bool) {
        if self.keys.insert(key, answered).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > MAX_DONE {
            if let Some(old) = self.order.pop_front() {
                self.keys.remove(&old);
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NmKind {
    SignOn,
    Echo,
}

/// The digits of a numeric field's logical value, as a number.
fn digits_of(msg: &Message<'_>, id: u16) -> Option<u64> {
    let f = msg.field(id).ok().flatten()?;
    f.logical().try_fold(0u64, |n, d| {
        d.is_ascii_digit()
            .then(|| n.saturating_mul(10).saturating_add(u64::from(d - b'0')))
    })
}

fn key_of(msg: &Message<'_>) -> Option<Key> {
    Some(digits_of(msg, 7)? % 10_000_000_000 * 1_000_000 + digits_of(msg, 11)? % 1_000_000)
}

fn logical(msg: &Message<'_>, id: u16) -> Vec<u8> {
    msg.field(id)
        .ok()
        .flatten()
        .map(|f| f.logical().collect())
        .unwrap_or_default()
}

/// An answer to `request`, made the way an issuer (or VISA's network
/// management) makes one: the simulators' answer ([`answer::response_fields`]:
/// response MTI, station IDs swapped, every request field but the secret ones
/// echoed, F39 = `code`), keeping the request's bitmap count, and F38 (an
/// approval code) on an approved financial answer in place of any request F38.
pub fn answer(spec: &Spec, request: &Message<'_>, code: &str) -> Result<Bytes, IsoError> {
    let mut d = answer::response_fields(spec, request, code)?;
    d.bitmaps = request.layout().bitmaps;
    d.remove(38);
    if code == "00" && !d.mti.is_network_management() && spec.field(38).is_some() {
        // An approval code: the last six digits of the STAN do.
        let stan = d.get(11).and_then(|v| v.as_text()).unwrap_or("000000");
        d.set_text(38, format!("{stan:0>6}"));
    }
    spec.encode(&d).map(Bytes::from)
}

impl Shared {
    /// The next STAN, 1..=999999 then round again.
    fn next_stan(&self) -> u32 {
        self.stan
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some(s % 999_999 + 1)
            })
            .map_or(1, |prev| prev % 999_999 + 1)
    }

    fn count_expired(&self, p: &Pending) {
        let c = match p.kind {
            Kind::Issuer { .. } => &self.stats.issuer_unanswered,
            Kind::Echo => &self.stats.echo_unanswered,
            Kind::KeyReset => &self.stats.key_resets_unanswered,
            // An unanswered sign-on is retried by its link.
            Kind::SignOn { .. } => return,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn expire(&self, now: Instant) {
        let expired = self.outstanding.expired(now);
        let mut done = lock(&self.done);
        for (k, p) in &expired {
            done.insert(*k, false);
            self.count_expired(p);
        }
    }

    /// A fresh message from the network to the bank: its envelope (VISA's
    /// header with the station IDs), F7 now, F11 the next STAN. Returns it
    /// with its key.
    fn fresh(&self, mti: Mti) -> (Decoded, Key, u32) {
        let mut d = Decoded::new(self.network.envelope(), mti);
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let f7 = crate::iso8583::transmission_date_time(secs);
        let f7_text = String::from_utf8_lossy(&f7).into_owned();
        let f7_num = f7_text.parse::<u64>().unwrap_or(0);
        let stan = self.next_stan();
        d.set_text(7, f7_text);
        d.set_text(11, format!("{stan:06}"));
        (d, f7_num * 1_000_000 + u64::from(stan), stan)
    }

    /// Registers a request as outstanding and writes it on a link `pick`
    /// allows; `false` (and forgotten) when none takes it.
    fn send_expected(
        &self,
        payload: &Bytes,
        key: Key,
        pending: Pending,
        pick: impl Fn(&LinkHandle) -> bool,
    ) -> bool {
        if !self.outstanding.expect(key, pending, self.cfg.timeout) {
            return false;
        }
        let sent = self.send_where(payload, pick).is_some();
        if !sent {
            self.outstanding.forget(&key);
        }
        sent
    }

    /// A message frame read on link `link`.
    fn on_frame(self: &Arc<Shared>, link: u64, payload: Bytes, rng: &mut Rng) {
        let msg = match Message::parse(&self.spec, payload) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "sim visa: a frame that does not parse");
                self.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        if msg.envelope().rejected.is_some() {
            self.stats.rejects.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if msg.mti().is_response() {
            self.on_response(&msg);
        } else if msg.mti().is_network_management() {
            self.on_network_request(link, &msg);
        } else if self.network.is_reversal(msg.mti()) {
            self.on_reversal(&msg);
        } else {
            self.on_bank_request(link, &msg, rng);
        }
    }

    /// An answer to one of our requests: it must match one outstanding.
    fn on_response(&self, msg: &Message<'_>) {
        let stats = &self.stats;
        let Some(key) = key_of(msg) else {
            stats.unknown.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let found = self.outstanding.take(&key);
        let Some(p) = found else {
            let counter = match lock(&self.done).keys.get(&key) {
                Some(true) => &stats.doubled,
                Some(false) => &stats.late,
                None => &stats.unknown,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            return;
        };
        lock(&self.done).insert(key, true);
        let approved = logical(msg, 39) == b"00";
        match p.kind {
            Kind::Issuer { echoed } => {
                let same =
                    p.response == msg.mti() && echoed.iter().all(|(id, v)| logical(msg, *id) == *v);
                let counter = if !same {
                    &stats.wrong_key
                } else if approved {
                    &stats.issuer_approved
                } else {
                    &stats.issuer_declined
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            Kind::SignOn { link } => {
                if approved {
                    stats.sign_ons_approved.fetch_add(1, Ordering::Relaxed);
                    if let Some(l) = lock(&self.links).iter().find(|l| l.id == link) {
                        l.signed_on.store(true, Ordering::Relaxed);
                    }
                } else {
                    stats.sign_ons_refused.fetch_add(1, Ordering::Relaxed);
                }
            }
            Kind::Echo => {
                stats.echo_answered.fetch_add(1, Ordering::Relaxed);
            }
            Kind::KeyReset => {
                stats.key_resets_answered.fetch_add(1, Ordering::Relaxed);
                let f39 = logical(msg, 39);
                stats
                    .key_reset_f39
                    .add(if f39.is_empty() { b"none" } else { &f39 });
            }
        }
    }

    /// A request from the bank's nodes (VISA as issuer): counted by its F37
    /// stamp and answered on another link.
    fn on_bank_request(self: &Arc<Shared>, link: u64, msg: &Message<'_>, rng: &mut Rng) {
        self.stats.bank_requests.fetch_add(1, Ordering::Relaxed);
        if let Some((at, width)) = self.cfg.stamp {
            let f37 = logical(msg, 37);
            let stamp = f37
                .get(at..at.saturating_add(width))
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .unwrap_or_default();
            let mut stamps = lock(&self.stamps);
            if stamps.len() < MAX_STAMPS || stamps.contains_key(&stamp) {
                *stamps.entry(stamp).or_insert(0) += 1;
            }
        }
        if !self.cfg.answer_bank_requests {
            return;
        }
        let resp = match answer(&self.spec, msg, "00") {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "sim visa: cannot answer a bank request");
                self.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        // A late approval is one the simulator can name (and so book).
        let late = match &self.cfg.late {
            Some(late) if is_approvable(msg.mti()) && self.stats.reversals.has_room() => late
                .draw(rng)
                .and_then(|by| Some((by, OriginalKey::of_message(msg).ok()?))),
            _ => None,
        };
        let (extra, approved_late) = late.map_or((Duration::ZERO, None), |(by, k)| (by, Some(k)));
        let delay = self.cfg.delay.sample(rng) + extra;
        if delay.is_zero() {
            self.deliver(link, &resp);
        } else {
            self.deliver_later(link, resp, delay, approved_late);
        }
    }
}

#[cfg(test)]
mod tests;
