//! `isoswitch sim visa`: VISA's side of BASE I style duplex links (WIRE.md §3).
//!
//! Every link carries both directions. The simulator
//!
//! - **accepts** the bank's links (the switch's `connect` front dials them) or
//!   **dials** `links` links itself, and keeps what it dialled up;
//! - **signs on** each link as it comes up (`0800` F70 `001`); a link carries
//!   the simulator's own requests only once its sign-on is approved (the
//!   `0810` may come back on any link: it is matched by F7 + F11);
//! - answers the bank's network management (`0800` sign-on, sign-off, echo) with
//!   an `0810` F39 `00` on the link it came on, and sends its own echo tests;
//! - as **acquirer for the bank's cards**, sends issuer requests (`0100` /
//!   `0200`) at a rate and checks every answer: exactly one, with the MTI, F4,
//!   F37 and F41 of its request;
//! - as **issuer for the bank's acquiring**, answers the requests the bank's
//!   nodes send, on a link **other than** the one the request came on, so that
//!   only the F37 node stamp can bring each answer back to its node.
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
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::codec::{Encoder, FramedRead};

use crate::iso8583::{Decoded, IsoError, Message, Mti, Spec};
use crate::sim::answer;
use crate::sim::node::Delay;
use crate::util::rng::{Rng, entropy_seed};
use crate::wire::{Frame, FrameCodec, LengthPrefix, VisaHeader};

/// VISA's station ID (source of what it sends), BCD.
pub const VISA_STATION: [u8; 3] = [0x00, 0x00, 0x01];
/// The bank's station ID (destination of what VISA sends), BCD.
pub const BANK_STATION: [u8; 3] = [0x45, 0x67, 0x89];

/// Frames queued per link before senders move on to another link.
const LINK_QUEUE: usize = 4096;
/// Requests (issuer requests, sign-ons, echo tests) awaiting a response, at most.
const MAX_OUTSTANDING: usize = 100_000;
/// Keys of requests already answered or expired, remembered to tell a second
/// answer (or a late one) from an unknown one.
const MAX_DONE: usize = 1_000_000;
/// Answers to the bank waiting for a link to come up, at most.
const MAX_PARKED: usize = 10_000;
/// Accepted links beyond `links` x this are closed at once.
const ACCEPT_FACTOR: usize = 4;
/// Distinct F37 stamps counted in the report, at most.
const MAX_STAMPS: usize = 256;
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Issuer requests sent in one pacing tick at most (a late tick does not burst).
const MAX_BURST: u64 = 1000;
/// How long a link closed on demand waits for the bank to close its side.
const CLOSE_GRACE: Duration = Duration::from_secs(3);
/// How long `stop` waits for tasks before aborting them.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// Writes are batched up to this many bytes.
const WRITE_BATCH: usize = 64 * 1024;
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
}

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
        }
    }
}

fn mti(digits: [u8; 4]) -> Mti {
    // The callers pass literal four-digit MTIs.
    Mti::new(digits).unwrap_or_else(|| unreachable!("four ASCII digits"))
}

/// Counters a test can read while the simulator runs.
#[derive(Debug, Default)]
pub struct VisaSimStats {
    /// Issuer requests written on a link.
    pub issuer_sent: AtomicU64,
    /// Their answers with F39 `00`, and with another F39.
    pub issuer_approved: AtomicU64,
    pub issuer_declined: AtomicU64,
    /// Issuer requests without an answer within `timeout`.
    pub issuer_unanswered: AtomicU64,
    /// Answers found by F7 + F11 whose MTI, F4, F32, F37 or F41 differ.
    pub wrong_key: AtomicU64,
    /// A second answer to a request already answered.
    pub doubled: AtomicU64,
    /// An answer to a request that had expired.
    pub late: AtomicU64,
    /// An answer matching nothing ever sent.
    pub unknown: AtomicU64,
    /// Requests from the bank's nodes (not network management).
    pub bank_requests: AtomicU64,
    /// Their answers written, and how many of those on another link.
    pub bank_answered: AtomicU64,
    pub bank_answered_on_other_link: AtomicU64,
    /// Answers to the bank that found no link up and waited for one.
    pub answers_parked: AtomicU64,
    /// Answers to the bank dropped: every queue full, too many parked, or
    /// parked longer than `timeout`.
    pub answers_unsent: AtomicU64,
    /// The bank's `0800`s, by kind, and the `0810`s written for them.
    pub network_requests: AtomicU64,
    pub bank_sign_ons: AtomicU64,
    pub bank_sign_offs: AtomicU64,
    pub bank_echoes: AtomicU64,
    pub network_answered: AtomicU64,
    /// The bank's `0800`s read on a link being dropped with no link up: left
    /// unanswered, as the exchange belongs to a link that is gone.
    pub network_link_gone: AtomicU64,
    /// Our sign-ons written, approved, and answered with another F39.
    pub sign_ons_sent: AtomicU64,
    pub sign_ons_approved: AtomicU64,
    pub sign_ons_refused: AtomicU64,
    /// Our echo tests written, answered, and unanswered within `timeout`.
    pub echo_sent: AtomicU64,
    pub echo_answered: AtomicU64,
    pub echo_unanswered: AtomicU64,
    pub keepalives_received: AtomicU64,
    pub keepalives_sent: AtomicU64,
    /// Links opened (dialled or accepted), up now, refused at accept, and
    /// closed on demand ([`VisaSim::close_links`]).
    pub links_opened: AtomicU64,
    pub links_up: AtomicU64,
    pub links_refused: AtomicU64,
    pub links_dropped: AtomicU64,
    /// Frames that did not parse, prefixes that could not be trusted, stalled
    /// partial frames.
    pub bad_frames: AtomicU64,
    /// Reject messages (header bit 0x80) received.
    pub rejects: AtomicU64,
}

/// What the simulated VISA saw. `lost` and `doubled` are the verdict: a run is
/// clean when both are zero.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct VisaReport {
    pub issuer_sent: u64,
    pub issuer_approved: u64,
    pub issuer_declined: u64,
    pub issuer_unanswered: u64,
    pub wrong_key: u64,
    pub doubled: u64,
    pub late: u64,
    pub unknown: u64,
    pub bank_requests: u64,
    pub bank_answered: u64,
    pub bank_answered_on_other_link: u64,
    pub answers_parked: u64,
    pub answers_unsent: u64,
    pub network_requests: u64,
    pub network_answered: u64,
    pub sign_ons_sent: u64,
    pub sign_ons_approved: u64,
    pub echo_sent: u64,
    pub echo_answered: u64,
    pub keepalives_received: u64,
    pub links_opened: u64,
    pub links_up: u64,
    pub links_dropped: u64,
    pub bad_frames: u64,
    pub rejects: u64,
    /// Bank requests per F37 stamp (the node ID the switch wrote).
    pub stamps: BTreeMap<String, u64>,
}

impl VisaReport {
    fn from_stats(s: &VisaSimStats, stamps: BTreeMap<String, u64>) -> VisaReport {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        VisaReport {
            issuer_sent: get(&s.issuer_sent),
            issuer_approved: get(&s.issuer_approved),
            issuer_declined: get(&s.issuer_declined),
            issuer_unanswered: get(&s.issuer_unanswered),
            wrong_key: get(&s.wrong_key),
            doubled: get(&s.doubled),
            late: get(&s.late),
            unknown: get(&s.unknown),
            bank_requests: get(&s.bank_requests),
            bank_answered: get(&s.bank_answered),
            bank_answered_on_other_link: get(&s.bank_answered_on_other_link),
            answers_parked: get(&s.answers_parked),
            answers_unsent: get(&s.answers_unsent),
            network_requests: get(&s.network_requests),
            network_answered: get(&s.network_answered),
            sign_ons_sent: get(&s.sign_ons_sent),
            sign_ons_approved: get(&s.sign_ons_approved),
            echo_sent: get(&s.echo_sent),
            echo_answered: get(&s.echo_answered),
            keepalives_received: get(&s.keepalives_received),
            links_opened: get(&s.links_opened),
            links_up: get(&s.links_up),
            links_dropped: get(&s.links_dropped),
            bad_frames: get(&s.bad_frames),
            rejects: get(&s.rejects),
            stamps,
        }
    }

    /// Issuer requests that got no answer.
    pub fn lost(&self) -> u64 {
        self.issuer_unanswered
    }

    /// Answers that should not have come: second, crossed (wrong key) or
    /// matching nothing sent.
    pub fn doubled_or_crossed(&self) -> u64 {
        self.doubled + self.wrong_key + self.unknown
    }

    /// Nothing lost, nothing doubled or crossed.
    pub fn is_clean(&self) -> bool {
        self.lost() == 0 && self.doubled_or_crossed() == 0
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

impl std::fmt::Display for VisaReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "issuer sent {} approved {} declined {} unanswered {} wrong_key {} doubled {} late {} unknown {} \
             | bank requests {} answered {} (on another link {}) parked {} unsent {} \
             | network {} answered {} | sign-ons {}/{} echo {}/{} \
             | links opened {} up {} dropped {} | bad_frames {} rejects {}",
            self.issuer_sent,
            self.issuer_approved,
            self.issuer_declined,
            self.issuer_unanswered,
            self.wrong_key,
            self.doubled,
            self.late,
            self.unknown,
            self.bank_requests,
            self.bank_answered,
            self.bank_answered_on_other_link,
            self.answers_parked,
            self.answers_unsent,
            self.network_requests,
            self.network_answered,
            self.sign_ons_approved,
            self.sign_ons_sent,
            self.echo_answered,
            self.echo_sent,
            self.links_opened,
            self.links_up,
            self.links_dropped,
            self.bad_frames,
            self.rejects,
        )?;
        if !self.stamps.is_empty() {
            let s: Vec<String> = self
                .stamps
                .iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect();
            write!(f, " | stamps {}", s.join(" "))?;
        }
        Ok(())
    }
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
        check_spec(&spec)?;
        let (shutdown, rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            spec,
            stats: Arc::new(VisaSimStats::default()),
            base: Instant::now(),
            links: Mutex::new(Vec::new()),
            next_link: AtomicUsize::new(0),
            next_link_id: AtomicU64::new(1),
            outstanding: Mutex::new(HashMap::new()),
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
        tasks.spawn(sweep(Arc::clone(&shared), rx));
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
        lock(&self.shared.outstanding).len()
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
        let left: Vec<Pending> = lock(&self.shared.outstanding)
            .drain()
            .map(|(_, p)| p)
            .collect();
        for p in &left {
            self.shared.count_expired(p);
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
    let timeout = cfg.timeout;
    let sim = VisaSim::start(spec, cfg).await?;
    if let Some(addr) = sim.local_addr() {
        eprintln!("sim visa listening on {addr}");
    }
    while !sim.originated_all() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let deadline = deadline_after(timeout);
    while sim.outstanding() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(sim.stop().await)
}

/// The fields the simulator writes must exist in the spec, with F7 and F11
/// numeric and F37 twelve characters.
fn check_spec(spec: &Spec) -> std::io::Result<()> {
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
    for id in [2, 3, 4, 7, 11, 32, 37, 39, 41, 49, 70] {
        if spec.field(id).is_none() {
            return Err(bad(format!(
                "sim visa: spec `{}` has no F{id}",
                spec.name()
            )));
        }
    }
    if spec.envelope().header != crate::wire::HeaderKind::Visa {
        return Err(bad(format!(
            "sim visa: spec `{}` has no VISA header",
            spec.name()
        )));
    }
    Ok(())
}

/// Everything the tasks share.
struct Shared {
    spec: Arc<Spec>,
    cfg: VisaSimConfig,
    stats: Arc<VisaSimStats>,
    /// Clock origin of the links' last-write times and of the run.
    base: Instant,
    links: Mutex<Vec<LinkHandle>>,
    /// Round-robin cursor over the links.
    next_link: AtomicUsize,
    next_link_id: AtomicU64,
    /// Requests sent, by F7 + F11.
    outstanding: Mutex<HashMap<Key, Pending>>,
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

/// A frame for a link's writer.
#[derive(Debug)]
enum Out {
    Message(Bytes),
    Poll,
}

/// A live link, as senders see it.
struct LinkHandle {
    id: u64,
    tx: mpsc::Sender<Out>,
    signed_on: Arc<AtomicBool>,
    /// Microseconds since `Shared::base` of the last frame queued on it.
    last_sent: Arc<AtomicU64>,
    close: Arc<Notify>,
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
}

#[derive(Clone, Debug)]
struct Pending {
    kind: Kind,
    response: Mti,
    deadline: Instant,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `timeout` from now; a timeout too long for the clock means a year.
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(now)
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
    fn now_micros(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// The next STAN, 1..=999999 then round again.
    fn next_stan(&self) -> u32 {
        self.stan
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some(s % 999_999 + 1)
            })
            .map_or(1, |prev| prev % 999_999 + 1)
    }

    /// Queues `payload` on one link chosen by `pick` among the live ones, in
    /// round-robin order; a full queue moves on. Returns the link's ID.
    fn send_where(&self, payload: &Bytes, pick: impl Fn(&LinkHandle) -> bool) -> Option<u64> {
        let links = lock(&self.links);
        let n = links.len();
        if n == 0 {
            return None;
        }
        let start = self.next_link.fetch_add(1, Ordering::Relaxed) % n;
        for k in 0..n {
            let link = &links[(start + k) % n];
            if !pick(link) {
                continue;
            }
            if link.tx.try_send(Out::Message(payload.clone())).is_ok() {
                link.last_sent.store(self.now_micros(), Ordering::Relaxed);
                return Some(link.id);
            }
        }
        None
    }

    /// Registers a request as outstanding; `false` if the table is full or the
    /// key is taken (the STAN came round within one timeout).
    fn expect(&self, key: Key, pending: Pending) -> bool {
        let mut out = lock(&self.outstanding);
        if out.len() >= MAX_OUTSTANDING || out.contains_key(&key) {
            return false;
        }
        out.insert(key, pending);
        true
    }

    fn forget(&self, key: Key) {
        lock(&self.outstanding).remove(&key);
    }

    fn count_expired(&self, p: &Pending) {
        let c = match p.kind {
            Kind::Issuer { .. } => &self.stats.issuer_unanswered,
            Kind::Echo => &self.stats.echo_unanswered,
            // An unanswered sign-on is retried by its link.
            Kind::SignOn { .. } => return,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn expire(&self, now: Instant) {
        let expired: Vec<(Key, Pending)> = {
            let mut out = lock(&self.outstanding);
            let keys: Vec<Key> = out
                .iter()
                .filter(|(_, p)| p.deadline <= now)
                .map(|(k, _)| *k)
                .collect();
            keys.into_iter()
                .filter_map(|k| out.remove(&k).map(|p| (k, p)))
                .collect()
        };
        let mut done = lock(&self.done);
        for (k, p) in &expired {
            done.insert(*k, false);
            self.count_expired(p);
        }
    }

    /// A fresh message from VISA to the bank: header with the station IDs, F7
    /// now, F11 the next STAN. Returns it with its key.
    fn fresh(&self, mti: Mti) -> (Decoded, Key, u32) {
        let header = VisaHeader::new(BANK_STATION, VISA_STATION, 0);
        let mut d = Decoded::new(header.0.to_vec(), mti);
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

    /// One issuer request (the bank's card, VISA acquiring) on a signed-on
    /// link. `false` when no link could take it (nothing is counted then: the
    /// request is sent later).
    fn send_issuer_request(&self) -> bool {
        let mtis = &self.cfg.mtis;
        let Some(&mti) =
            mtis.get(self.next_mti.fetch_add(1, Ordering::Relaxed) % mtis.len().max(1))
        else {
            return false;
        };
        let Some(response) = answer::response_mti(mti) else {
            return false;
        };
        let (mut d, key, stan) = self.fresh(mti);
        let amount = 100 + u64::from(stan % 100_000);
        // F37: a retrieval reference of our own, unique per request.
        let rrn = format!("V{:05}{stan:06}", (key / 1_000_000) % 100_000);
        // Only fields whose VISA encoding is settled (see the module notes).
        d.set_text(2, "4761739001010119");
        d.set_text(3, "000000");
        d.set_text(4, format!("{amount:012}"));
        d.set_text(12, "120000");
        d.set_text(13, "1203");
        d.set_text(14, "2812");
        d.set_text(32, "400050");
        d.set_text(37, rrn.clone());
        d.set_text(41, "VTERM001");
        d.set_text(42, "VISAMERCHANT001");
        d.set_text(49, "840");
        let payload = match self.spec.encode(&d) {
            Ok(p) => Bytes::from(p),
            Err(e) => {
                tracing::error!(error = %e, "sim visa: cannot build an issuer request");
                return false;
            }
        };
        let echoed = CHECKED
            .iter()
            .filter_map(|&id| {
                let v = d.get(id)?.as_text()?;
                Some((id, v.as_bytes().to_vec()))
            })
            .collect();
        let pending = Pending {
            kind: Kind::Issuer { echoed },
            response,
            deadline: deadline_after(self.cfg.timeout),
        };
        if !self.expect(key, pending) {
            return false;
        }
        match self.send_where(&payload, |l| l.signed_on.load(Ordering::Relaxed)) {
            Some(_) => {
                self.stats.issuer_sent.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => {
                self.forget(key);
                false
            }
        }
    }

    /// A sign-on or echo test (`0800` with F70) on link `link`.
    fn send_network(&self, link: u64, kind: NmKind) -> bool {
        let net = self.spec.network();
        let mti = net.echo_mti.unwrap_or_else(|| mti(*b"0800"));
        let Some(response) = answer::response_mti(mti) else {
            return false;
        };
        let f70 = match kind {
            NmKind::SignOn => net.sign_on_f70.clone().unwrap_or_else(|| "001".into()),
            NmKind::Echo => net.echo_f70.clone().unwrap_or_else(|| "301".into()),
        };
        let (mut d, key, _) = self.fresh(mti);
        d.set_text(70, f70);
        let Ok(payload) = self.spec.encode(&d).map(Bytes::from) else {
            return false;
        };
        let pending = Pending {
            kind: match kind {
                NmKind::SignOn => Kind::SignOn { link },
                NmKind::Echo => Kind::Echo,
            },
            response,
            deadline: deadline_after(self.cfg.timeout),
        };
        if !self.expect(key, pending) {
            return false;
        }
        if self.send_where(&payload, |l| l.id == link).is_none() {
            self.forget(key);
            return false;
        }
        let sent = match kind {
            NmKind::SignOn => &self.stats.sign_ons_sent,
            NmKind::Echo => &self.stats.echo_sent,
        };
        sent.fetch_add(1, Ordering::Relaxed);
        true
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
        let found = lock(&self.outstanding).remove(&key);
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
        }
    }

    /// The bank's `0800`: answered `0810` F39 `00` on the link it came on (a
    /// link-level exchange), or any link if that one is gone.
    fn on_network_request(&self, link: u64, msg: &Message<'_>) {
        let stats = &self.stats;
        stats.network_requests.fetch_add(1, Ordering::Relaxed);
        let net = self.spec.network();
        let f70 = logical(msg, 70);
        let is = |v: &Option<String>, dflt: &str| f70 == v.as_deref().unwrap_or(dflt).as_bytes();
        if is(&net.sign_on_f70, "001") {
            stats.bank_sign_ons.fetch_add(1, Ordering::Relaxed);
        } else if is(&net.sign_off_f70, "002") {
            stats.bank_sign_offs.fetch_add(1, Ordering::Relaxed);
        } else if is(&net.echo_f70, "301") {
            stats.bank_echoes.fetch_add(1, Ordering::Relaxed);
        }
        let Ok(resp) = answer(&self.spec, msg, "00") else {
            stats.bad_frames.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let sent = self.send_where(&resp, |l| l.id == link).is_some()
            || self.send_where(&resp, |_| true).is_some();
        let counter = if sent {
            &stats.network_answered
        } else if lock(&self.links).is_empty() {
            &stats.network_link_gone
        } else {
            &stats.answers_unsent
        };
        counter.fetch_add(1, Ordering::Relaxed);
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
        let delay = self.cfg.delay.sample(rng);
        if delay.is_zero() {
            self.deliver(link, &resp);
        } else {
            self.deliver_later(link, resp, delay);
        }
    }

    /// Writes an answer to the bank on a link other than `came_on` (on that
    /// one only when it is the only link up). With no link up it waits for
    /// one ([`Shared::flush_parked`]), as a peer holds answers over a
    /// reconnect.
    fn deliver(&self, came_on: u64, resp: &Bytes) {
        if self.try_deliver(came_on, resp) {
            return;
        }
        {
            // Under the parked lock (then the links lock): a link coming up
            // now flushes after this, so nothing parked is left behind.
            let mut parked = lock(&self.parked);
            if lock(&self.links).is_empty() {
                let counter = if parked.len() < MAX_PARKED {
                    parked.push_back((Instant::now(), came_on, resp.clone()));
                    &self.stats.answers_parked
                } else {
                    &self.stats.answers_unsent
                };
                counter.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        // A link is up (every queue was full, or it just came up): once more.
        if !self.try_deliver(came_on, resp) {
            self.stats.answers_unsent.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn try_deliver(&self, came_on: u64, resp: &Bytes) -> bool {
        let stats = &self.stats;
        let sent = self
            .send_where(resp, |l| l.id != came_on)
            .or_else(|| self.send_where(resp, |l| l.id == came_on));
        let Some(on) = sent else {
            return false;
        };
        stats.bank_answered.fetch_add(1, Ordering::Relaxed);
        if on != came_on {
            stats
                .bank_answered_on_other_link
                .fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// A link came up: the parked answers still worth sending go out; those
    /// older than `timeout` (the bank has given up on them) are dropped.
    fn flush_parked(&self) {
        let parked: Vec<_> = lock(&self.parked).drain(..).collect();
        for (at, came_on, resp) in parked {
            if at.elapsed() > self.cfg.timeout || !self.try_deliver(came_on, &resp) {
                self.stats.answers_unsent.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn deliver_later(self: &Arc<Shared>, came_on: u64, resp: Bytes, delay: Duration) {
        let shared = Arc::clone(self);
        let send = move || shared.deliver(came_on, &resp);
        if !self.delayed.send_after(delay, self.shutdown.clone(), send) {
            self.stats.answers_unsent.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Writes a link's frames, batching what is queued; on the queue's end it
/// shuts the write half down (a FIN: the bank reads what was sent, then EOF).
async fn write_link(
    mut w: OwnedWriteHalf,
    prefix: LengthPrefix,
    max_frame: usize,
    mut rx: mpsc::Receiver<Out>,
) -> std::io::Result<()> {
    let mut codec = FrameCodec::new(prefix, max_frame);
    let mut buf = BytesMut::with_capacity(WRITE_BATCH);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(out) = next.take() {
            let frame = match out {
                Out::Message(p) => Frame::Message(p),
                Out::Poll => Frame::KeepAlive,
            };
            if let Err(e) = codec.encode(frame, &mut buf) {
                // Only an oversized payload fails here: it is ours, so a bug.
                tracing::error!(error = %e, "sim visa: a frame could not be written");
            }
            if buf.len() < WRITE_BATCH {
                next = rx.try_recv().ok();
            }
        }
        w.write_all(&buf).await?;
        buf.clear();
    }
    w.shutdown().await
}

/// Accepts the bank's links and serves each until it closes.
async fn accept_links(
    shared: Arc<Shared>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    let max = shared.cfg.links.max(1).saturating_mul(ACCEPT_FACTOR);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else {
                    // Out of descriptors or similar: do not spin.
                    tokio::time::sleep(RECONNECT_MIN).await;
                    continue;
                };
                if conns.len() >= max {
                    shared.stats.links_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, max, "sim visa: link refused, too many open");
                    drop(stream);
                    continue;
                }
                let (s, mut sd) = (Arc::clone(&shared), shutdown.clone());
                conns.spawn(async move { serve_link(&s, stream, &mut sd).await });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    // Each link task saw the same shutdown: let them finish their close.
    super::join_within(&mut conns, STOP_GRACE).await;
}

/// Keeps one dialled link up: connects, serves it until it closes, waits a
/// short backoff, connects again.
async fn keep_link(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let Dial::Connect(addr) = shared.cfg.dial else {
        return;
    };
    let mut backoff = RECONNECT_MIN;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let connect = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr));
        let connected = tokio::select! {
            r = connect => r,
            _ = shutdown.changed() => return,
        };
        match connected {
            Ok(Ok(stream)) => {
                backoff = RECONNECT_MIN;
                serve_link(&shared, stream, &mut shutdown).await;
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, %addr, "sim visa: connect failed");
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

/// Why a link's read loop ended.
#[derive(Debug, PartialEq, Eq)]
enum LinkEnd {
    Closed,
    Broken,
    Shutdown,
}

/// Serves one link until it closes, is dropped on demand, or the simulator
/// stops: reads and dispatches frames; signs on, polls and echoes on time.
async fn serve_link(shared: &Arc<Shared>, stream: TcpStream, shutdown: &mut watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let (read, write) = stream.into_split();
    let framing = shared.spec.framing();
    let (tx, rx) = mpsc::channel(LINK_QUEUE);
    let mut writer = tokio::spawn(write_link(write, framing.prefix, framing.max_frame, rx));
    let id = shared.next_link_id.fetch_add(1, Ordering::Relaxed);
    let close = Arc::new(Notify::new());
    let signed_on = Arc::new(AtomicBool::new(!shared.cfg.sign_on));
    let last_sent = Arc::new(AtomicU64::new(shared.now_micros()));
    lock(&shared.links).push(LinkHandle {
        id,
        tx,
        signed_on: Arc::clone(&signed_on),
        last_sent: Arc::clone(&last_sent),
        close: Arc::clone(&close),
    });
    let stats = &shared.stats;
    stats.links_opened.fetch_add(1, Ordering::Relaxed);
    stats.links_up.fetch_add(1, Ordering::Relaxed);
    shared.flush_parked();
    let unregister = || {
        let mut links = lock(&shared.links);
        let before = links.len();
        links.retain(|l| l.id != id);
        if links.len() < before {
            stats.links_up.fetch_sub(1, Ordering::Relaxed);
        }
    };
    let cfg = &shared.cfg;
    let mut last_sign_on = None;
    let mut last_echo = Instant::now();
    if cfg.sign_on && shared.send_network(id, NmKind::SignOn) {
        last_sign_on = Some(Instant::now());
    }
    let mut frames = FramedRead::new(read, FrameCodec::new(framing.prefix, framing.max_frame));
    let mut rng = Rng::from_entropy();
    // A frame begun must end within this (a stalled peer cannot hold a buffer).
    let partial_limit = cfg.timeout.max(Duration::from_secs(1));
    let mut partial_since: Option<Instant> = None;
    let mut closing_since: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = loop {
        tokio::select! {
            frame = frames.next() => match frame {
                Some(Ok(Frame::Message(p))) => shared.on_frame(id, p, &mut rng),
                Some(Ok(Frame::KeepAlive)) => {
                    stats.keepalives_received.fetch_add(1, Ordering::Relaxed);
                }
                // Session control is link-level and carries no message.
                Some(Ok(Frame::SessionControl(_))) => {}
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "sim visa: link closed on a bad frame");
                    stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                    break LinkEnd::Broken;
                }
                None => break LinkEnd::Closed,
            },
            _ = tick.tick() => {
                let now = Instant::now();
                let partial = frames.decoder().in_frame() || !frames.read_buffer().is_empty();
                match (partial, partial_since) {
                    (false, _) => partial_since = None,
                    (true, None) => partial_since = Some(now),
                    (true, Some(t)) if now.duration_since(t) > partial_limit => {
                        stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                        break LinkEnd::Broken;
                    }
                    (true, Some(_)) => {}
                }
                if let Some(t) = closing_since {
                    if now.duration_since(t) > CLOSE_GRACE {
                        break LinkEnd::Closed;
                    }
                    continue;
                }
                on_tick(shared, id, &signed_on, &last_sent, &mut last_sign_on, &mut last_echo, now);
            }
            res = &mut writer, if closing_since.is_none() => {
                tracing::debug!(result = ?res, "sim visa: link writer ended");
                break LinkEnd::Broken;
            }
            _ = close.notified(), if closing_since.is_none() => {
                // A graceful drop: no new frames, the queue flushes, then FIN;
                // keep reading until the bank closes its side too.
                closing_since = Some(Instant::now());
                stats.links_dropped.fetch_add(1, Ordering::Relaxed);
                unregister();
            }
            _ = shutdown.changed() => break LinkEnd::Shutdown,
        }
    };
    unregister();
    if end != LinkEnd::Broken && !writer.is_finished() {
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut writer).await;
    }
    writer.abort();
    tracing::debug!(link = id, end = ?end, "sim visa: link down");
}

/// Link housekeeping: poll when idle, retry an unanswered sign-on, echo.
fn on_tick(
    shared: &Shared,
    id: u64,
    signed_on: &AtomicBool,
    last_sent: &AtomicU64,
    last_sign_on: &mut Option<Instant>,
    last_echo: &mut Instant,
    now: Instant,
) {
    let cfg = &shared.cfg;
    let idle = cfg.keepalive_idle;
    if !idle.is_zero() {
        let since = shared
            .now_micros()
            .saturating_sub(last_sent.load(Ordering::Relaxed));
        if Duration::from_micros(since) >= idle {
            let links = lock(&shared.links);
            if let Some(l) = links.iter().find(|l| l.id == id)
                && l.tx.try_send(Out::Poll).is_ok()
            {
                shared.stats.keepalives_sent.fetch_add(1, Ordering::Relaxed);
            }
            last_sent.store(shared.now_micros(), Ordering::Relaxed);
        }
    }
    if cfg.sign_on
        && !signed_on.load(Ordering::Relaxed)
        && last_sign_on.is_none_or(|t| now.duration_since(t) >= cfg.sign_on_retry)
    {
        *last_sign_on = Some(now);
        shared.send_network(id, NmKind::SignOn);
    }
    if !cfg.echo_interval.is_zero() && now.duration_since(*last_echo) >= cfg.echo_interval {
        *last_echo = now;
        shared.send_network(id, NmKind::Echo);
    }
}

/// Sends issuer requests at `rate` until `count` are sent or `duration` has
/// passed. Requests no link can take wait for one (they are not dropped).
async fn originate(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let rate = shared.cfg.rate.unwrap_or(0.0);
    if !(rate > 0.0 && rate.is_finite()) {
        return;
    }
    let stop_at = shared.base.checked_add(shared.cfg.duration);
    // The pacing restarts after a pause: when, and how many were sent by then.
    let mut paced_from: Option<(Instant, u64)> = None;
    let limit = shared.cfg.count.unwrap_or(u64::MAX);
    let period = Duration::from_secs_f64((1.0 / rate).clamp(0.001, 3600.0));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now = Instant::now();
        let sent = shared.stats.issuer_sent.load(Ordering::Relaxed);
        if stop_at.is_some_and(|s| now >= s) || sent >= limit {
            return;
        }
        if shared.paused.load(Ordering::Relaxed) {
            paced_from = None;
            continue;
        }
        let (start, sent_before) = *paced_from.get_or_insert((now, sent));
        // One request at start, then as many as the rate owes by now.
        let owed = (now.duration_since(start).as_secs_f64() * rate) as u64 + 1;
        let due = sent_before.saturating_add(owed).min(limit);
        for _ in 0..due.saturating_sub(sent).min(MAX_BURST) {
            if !shared.send_issuer_request() {
                break;
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec::builtin("visa-base1").unwrap()
    }

    #[test]
    fn answer_turns_a_bank_request_around() {
        let spec = spec();
        let req = crate::sim::sample_request(&spec, "0200").unwrap();
        let msg = Message::parse(&spec, req).unwrap();
        let resp = Message::parse(&spec, answer(&spec, &msg, "00").unwrap()).unwrap();
        assert_eq!(resp.mti().as_str(), "0210");
        for id in [2, 3, 4, 7, 11, 32, 37, 41] {
            assert_eq!(logical(&resp, id), logical(&msg, id), "F{id} echoed");
        }
        assert_eq!(logical(&resp, 39), b"00");
        assert_eq!(logical(&resp, 38).len(), 6, "an approval code");
        let (Some(crate::wire::Header::Visa(q)), Some(crate::wire::Header::Visa(r))) =
            (msg.envelope().header, resp.envelope().header)
        else {
            panic!("VISA headers");
        };
        assert_eq!(r.source_id(), q.destination_id());
        assert_eq!(r.destination_id(), q.source_id());
    }

    #[test]
    fn answer_keeps_no_secrets() {
        let spec = spec();
        let d = crate::iso8583::samples::purchase(&spec);
        let msg = Message::parse(&spec, Bytes::from(spec.encode(&d).unwrap())).unwrap();
        assert!(msg.has_field(35) && msg.has_field(52));
        let resp = Message::parse(&spec, answer(&spec, &msg, "05").unwrap()).unwrap();
        for id in [35, 52, 128] {
            assert!(!resp.has_field(id), "F{id} not echoed");
        }
        assert!(!resp.has_field(38), "no approval code on a decline");
    }

    #[test]
    fn answering_a_response_is_an_error() {
        let spec = spec();
        let req = crate::sim::sample_request(&spec, "0210").unwrap();
        let msg = Message::parse(&spec, req).unwrap();
        assert!(answer(&spec, &msg, "00").is_err());
    }

    #[test]
    fn keys_join_f7_and_f11() {
        let spec = spec();
        let mut d = crate::iso8583::samples::echo(&spec);
        d.set_text(7, "1203045959");
        d.set_text(11, "000042");
        let msg = Message::parse(&spec, Bytes::from(spec.encode(&d).unwrap())).unwrap();
        assert_eq!(key_of(&msg), Some(1_203_045_959_000_042));
    }

    #[test]
    fn done_is_bounded_and_remembers_answers() {
        let mut done = Done::default();
        for k in 0..(MAX_DONE as u64 + 10) {
            done.insert(k, k % 2 == 0);
        }
        assert_eq!(done.keys.len(), MAX_DONE);
        assert!(!done.keys.contains_key(&0), "oldest forgotten");
        assert_eq!(done.keys.get(&(MAX_DONE as u64 + 8)), Some(&true));
    }

    #[test]
    fn a_non_visa_spec_is_refused() {
        let cups = Spec::builtin("cups").unwrap();
        assert!(check_spec(&cups).is_err());
        assert!(check_spec(&spec()).is_ok());
    }

    #[test]
    fn report_verdict() {
        let mut r = VisaReport {
            issuer_sent: 3,
            issuer_approved: 3,
            ..VisaReport::default()
        };
        assert!(r.is_clean());
        assert!(r.to_string().starts_with("issuer sent 3 approved 3"));
        assert!(r.to_json().contains("\"issuer_sent\":3"));
        r.doubled = 1;
        assert!(!r.is_clean());
    }
}
