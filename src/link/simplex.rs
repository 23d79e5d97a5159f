//! The `simplex` front: UnionPay's split links. The switch connects N out links
//! to the peer and only writes on them; the peer connects N in links to the
//! switch and only writes on them. A response usually arrives on a different TCP
//! connection from the one its request left on, so nothing here is tied to a
//! connection: out links are a pool, in links are sources.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_util::codec::FramedRead;

use super::node::Backoff;
use super::service::Service;
use super::timer::{ReadTimeout, ReadTimer, in_frame};
use super::writer::{Outbound, run_writer_until};
use crate::capture::{Opened, Tapped};
use crate::ops::config::{FrontConfig, LinkSet, SignOn, SimplexFront};
use crate::wire::{Frame, FrameCodec};

/// Where a link stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkState {
    Connecting = 0,
    Up = 1,
    SignedOn = 2,
    Down = 3,
}

impl LinkState {
    fn from_u8(v: u8) -> LinkState {
        match v {
            1 => LinkState::Up,
            2 => LinkState::SignedOn,
            3 => LinkState::Down,
            _ => LinkState::Connecting,
        }
    }
}

/// Counters and state of one out link.
#[derive(Debug, Default)]
pub struct OutLinkStats {
    state: std::sync::atomic::AtomicU8,
    pub connects: AtomicU64,
    pub frames_out: AtomicU64,
    pub keepalives_out: AtomicU64,
    /// Frames the peer sent on a write-only link (logged, never routed).
    pub unexpected_in: AtomicU64,
    /// Milliseconds since the front started, at the last frame written.
    last_sent_ms: AtomicU64,
}

impl OutLinkStats {
    pub fn state(&self) -> LinkState {
        LinkState::from_u8(self.state.load(Ordering::Relaxed))
    }

    fn set_state(&self, s: LinkState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }
}

/// In-link counters.
#[derive(Debug, Default)]
pub struct InLinkStats {
    pub accepted: AtomicU64,
    pub refused: AtomicU64,
    pub open: AtomicUsize,
    pub frames_in: AtomicU64,
    pub keepalives_in: AtomicU64,
    pub closed_silent: AtomicU64,
}

/// The out links of a simplex front: a pool any outbound frame can use.
pub struct OutLinks {
    slots: Vec<Mutex<Option<mpsc::Sender<Outbound>>>>,
    pub stats: Vec<OutLinkStats>,
    signed_on: Vec<AtomicBool>,
    group_signed_on: AtomicBool,
    sign_on: SignOn,
    next: AtomicUsize,
    epoch: Instant,
    /// Sign-ons and echoes waiting for their 0830, by STAN: the out link that
    /// sent them (the answer arrives on an in link).
    pending_nm: Mutex<HashMap<u32, usize>>,
    pub in_stats: InLinkStats,
    pub sign_ons_acknowledged: AtomicU64,
    pub echoes_acknowledged: AtomicU64,
    /// Answers to the peer waiting for an out link to come up, oldest first,
    /// each with the time it was parked.
    parked: Mutex<std::collections::VecDeque<(Instant, Outbound)>>,
    /// How long a parked answer is worth sending (the peer's own timeout).
    park_for: Duration,
    pub parked_sent: AtomicU64,
    pub parked_dropped: AtomicU64,
}

/// Answers parked while no out link is up, at most.
const PARK_CAPACITY: usize = 10_000;

/// No out link could take a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoOutLink;

impl OutLinks {
    pub fn new(links: usize, sign_on: SignOn, park_for: Duration, epoch: Instant) -> OutLinks {
        OutLinks {
            slots: (0..links).map(|_| Mutex::new(None)).collect(),
            stats: (0..links).map(|_| OutLinkStats::default()).collect(),
            signed_on: (0..links).map(|_| AtomicBool::new(false)).collect(),
            group_signed_on: AtomicBool::new(false),
            sign_on,
            next: AtomicUsize::new(0),
            epoch,
            pending_nm: Mutex::new(HashMap::new()),
            in_stats: InLinkStats::default(),
            sign_ons_acknowledged: AtomicU64::new(0),
            echoes_acknowledged: AtomicU64::new(0),
            parked: Mutex::new(std::collections::VecDeque::new()),
            park_for,
            parked_sent: AtomicU64::new(0),
            parked_dropped: AtomicU64::new(0),
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Out links up (connected), and up and allowed to carry traffic.
    pub fn up(&self) -> (usize, usize) {
        let up = (0..self.len())
            .filter(|&i| self.sender(i).is_some())
            .count();
        let usable = (0..self.len()).filter(|&i| self.usable(i)).count();
        (up, usable)
    }

    fn sender(&self, link: usize) -> Option<mpsc::Sender<Outbound>> {
        self.slots
            .get(link)?
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn signed_on(&self, link: usize) -> bool {
        match self.sign_on {
            SignOn::None => true,
            SignOn::PerLink => self
                .signed_on
                .get(link)
                .is_some_and(|s| s.load(Ordering::Relaxed)),
            SignOn::PerGroup => self.group_signed_on.load(Ordering::Relaxed),
        }
    }

    fn usable(&self, link: usize) -> bool {
        self.signed_on(link) && self.sender(link).is_some()
    }

    /// Queues a request of ours on the next usable (up and signed on) out link,
    /// round robin; a full queue moves on to the next link.
    pub fn send(&self, out: Outbound) -> Result<usize, NoOutLink> {
        self.send_where(out, true)
    }

    /// Queues an answer to the peer (a response, a decline, an 0830) on the next
    /// out link that is up: the peer already uses the link set, so answers need
    /// no sign-on of ours. With no out link up, the answer is parked until one
    /// comes up (bounded in count and age) rather than lost.
    pub fn answer(&self, out: Outbound, now: Instant) -> Result<usize, NoOutLink> {
        match self.send_where(out.clone(), false) {
            Ok(link) => Ok(link),
            Err(NoOutLink) => {
                let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
                if parked.len() >= PARK_CAPACITY {
                    return Err(NoOutLink);
                }
                parked.push_back((now, out));
                Ok(usize::MAX)
            }
        }
    }

    /// Sends the parked answers that are still worth sending on `link`, which
    /// just came up; drops (and counts) the stale ones.
    fn flush_parked(&self, link: usize, now: Instant) {
        let parked: Vec<_> = self
            .parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for (at, out) in parked {
            if now.saturating_duration_since(at) > self.park_for || !self.send_on(link, out) {
                self.parked_dropped.fetch_add(1, Ordering::Relaxed);
            } else {
                self.parked_sent.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn send_where(&self, out: Outbound, signed_on: bool) -> Result<usize, NoOutLink> {
        let n = self.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            let link = (start + i) % n;
            if signed_on && !self.signed_on(link) {
                continue;
            }
            let Some(tx) = self.sender(link) else {
                continue;
            };
            if tx.try_send(out.clone()).is_ok() {
                self.sent_on(link);
                return Ok(link);
            }
        }
        Err(NoOutLink)
    }

    /// Queues a frame on one given link, signed on or not (network management).
    fn send_on(&self, link: usize, out: Outbound) -> bool {
        let ok = self.sender(link).is_some_and(|tx| tx.try_send(out).is_ok());
        if ok {
            self.sent_on(link);
        }
        ok
    }

    fn sent_on(&self, link: usize) {
        if let Some(s) = self.stats.get(link) {
            s.frames_out.fetch_add(1, Ordering::Relaxed);
            s.last_sent_ms.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn idle_for(&self, link: usize) -> Duration {
        let last = self
            .stats
            .get(link)
            .map_or(0, |s| s.last_sent_ms.load(Ordering::Relaxed));
        Duration::from_millis(self.now_ms().saturating_sub(last))
    }

    fn set_link(&self, link: usize, tx: Option<mpsc::Sender<Outbound>>) {
        if let Some(slot) = self.slots.get(link) {
            let up = tx.is_some();
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = tx;
            if let Some(s) = self.signed_on.get(link) {
                s.store(false, Ordering::Relaxed);
            }
            if let Some(st) = self.stats.get(link) {
                st.set_state(if up { LinkState::Up } else { LinkState::Down });
                if up {
                    st.connects.fetch_add(1, Ordering::Relaxed);
                    st.last_sent_ms.store(self.now_ms(), Ordering::Relaxed);
                }
            }
            if !up && self.sign_on == SignOn::PerGroup && self.up().0 == 0 {
                self.group_signed_on.store(false, Ordering::Relaxed);
            }
        }
    }

    /// Remembers a switch-made network management request sent on `link`.
    fn expect_nm_answer(&self, stan: u32, link: usize) {
        let mut p = self.pending_nm.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: a peer that never answers cannot grow this without limit.
        if p.len() >= 4096 {
            p.clear();
        }
        p.insert(stan, link);
    }

    /// The peer answered a switch-made 0820: a sign-on marks its link (or the
    /// group) signed on.
    pub fn nm_answered(
        &self,
        stan: u32,
        f70: &[u8],
        approved: bool,
        sign_on_f70: &[u8],
        echo_f70: &[u8],
    ) -> bool {
        let link = self
            .pending_nm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&stan);
        let Some(link) = link else { return false };
        if f70 == sign_on_f70 && approved {
            self.sign_ons_acknowledged.fetch_add(1, Ordering::Relaxed);
            self.group_signed_on.store(true, Ordering::Relaxed);
            if let Some(s) = self.signed_on.get(link) {
                s.store(true, Ordering::Relaxed);
            }
            if let Some(st) = self.stats.get(link) {
                st.set_state(LinkState::SignedOn);
            }
        } else if f70 == echo_f70 {
            self.echoes_acknowledged.fetch_add(1, Ordering::Relaxed);
        }
        true
    }
}

/// Spawns the out links and the in-link listener of a simplex front.
pub async fn start(
    service: Arc<Service>,
    front: SimplexFront,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
) -> std::io::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind(front.listen).await?;
    let addr = listener.local_addr()?;
    let set = FrontConfig::Simplex(front.clone())
        .link_set()
        .ok_or_else(|| std::io::Error::other("a simplex front has a link set"))?;
    spawn_links(&service, &set, tasks, shutdown);
    tasks.spawn(accept_in_links(
        Arc::clone(&service),
        front,
        listener,
        shutdown.clone(),
    ));
    Ok(addr)
}

/// Spawns the duplex links of a `connect` front (VISA): the switch connects
/// them, and every link carries both directions. Returns the peer's address.
pub fn start_connect(
    service: Arc<Service>,
    set: LinkSet,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
) -> std::net::SocketAddr {
    spawn_links(&service, &set, tasks, shutdown);
    set.connect
}

fn spawn_links(
    service: &Arc<Service>,
    set: &LinkSet,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
) {
    let (rebuild, _) = watch::channel(0u64);
    let rebuild = Arc::new(rebuild);
    for link in 0..set.links {
        tasks.spawn(keep_out_link(
            Arc::clone(service),
            set.clone(),
            link,
            Arc::clone(&rebuild),
            shutdown.clone(),
        ));
    }
}

fn out_links(service: &Service) -> Option<&Arc<OutLinks>> {
    service.out_links.as_ref()
}

async fn keep_out_link(
    service: Arc<Service>,
    front: LinkSet,
    link: usize,
    rebuild: Arc<watch::Sender<u64>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let seed = (link as u64) << 40 ^ 0xA5A5_5A5A;
    let mut backoff = Backoff::new(front.reconnect_min, front.reconnect_max, seed);
    let mut rebuild_rx = rebuild.subscribe();
    while !*shutdown.borrow() {
        let connect =
            tokio::time::timeout(front.connect_timeout, TcpStream::connect(front.connect)).await;
        if let Ok(Ok(stream)) = connect {
            backoff.reset();
            rebuild_rx.mark_unchanged();
            let why = run_out_link(
                &service,
                &front,
                link,
                stream,
                &mut rebuild_rx,
                &mut shutdown,
            )
            .await;
            if why == OutLinkEnd::Shutdown {
                tracing::info!(service = service.name(), link, "out link closed: shutdown");
            } else {
                tracing::warn!(
                    service = service.name(),
                    link,
                    reason = why.as_str(),
                    "out link down"
                );
            }
            if why == OutLinkEnd::Broken && front.rebuild_group {
                rebuild.send_modify(|g| *g += 1);
            }
        }
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.next_delay()) => {}
            _ = shutdown.changed() => {}
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OutLinkEnd {
    Broken,
    Rebuild,
    Shutdown,
}

impl OutLinkEnd {
    fn as_str(self) -> &'static str {
        match self {
            OutLinkEnd::Broken => "broken",
            OutLinkEnd::Rebuild => "group rebuild",
            OutLinkEnd::Shutdown => "shutdown",
        }
    }
}

async fn run_out_link(
    service: &Arc<Service>,
    front: &LinkSet,
    link: usize,
    stream: TcpStream,
    rebuild: &mut watch::Receiver<u64>,
    shutdown: &mut watch::Receiver<bool>,
) -> OutLinkEnd {
    let Some(links) = out_links(service) else {
        return OutLinkEnd::Shutdown;
    };
    let _ = stream.set_nodelay(true);
    let tap = service.capture_tap(&stream, Opened::BySwitch);
    let (read, write) = stream.into_split();
    let (read, write) = (Tapped::reader(read, &tap), Tapped::writer(write, &tap));
    let (tx, rx) = mpsc::channel(front.write_queue);
    let prefix = service.spec.framing().prefix;
    let (stop_writer, stop_rx) = watch::channel(false);
    let mut writer = tokio::spawn(run_writer_until(write, prefix, rx, stop_rx));
    links.set_link(link, Some(tx.clone()));
    links.flush_parked(link, Instant::now());
    tracing::info!(service = service.name(), link, "out link up");
    let mut frames = FramedRead::new(
        read,
        FrameCodec::new(prefix, service.spec.framing().max_frame),
    );
    let tick_every =
        (front.keepalive_idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut tick = tokio::time::interval(tick_every);
    let mut last_sign_on: Option<Instant> = None;
    let mut last_echo = Instant::now();
    let mut writer_done = None;
    // Duplex links read the peer's frames; a frame started must finish.
    let mut timer = ReadTimer::new(Duration::ZERO, front.partial_frame_timeout, Instant::now());
    let end = loop {
        tokio::select! {
            item = frames.next() => {
                timer.frame(Instant::now());
                match item {
                    Some(Ok(Frame::KeepAlive)) if front.duplex => {
                        links.in_stats.keepalives_in.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(Ok(Frame::Message(p))) if front.duplex => {
                        links.in_stats.frames_in.fetch_add(1, Ordering::Relaxed);
                        service.on_peer_frame(p, Instant::now());
                    }
                    Some(Ok(Frame::KeepAlive | Frame::SessionControl(_))) => {}
                    Some(Ok(Frame::Message(p))) => {
                        links.stats[link].unexpected_in.fetch_add(1, Ordering::Relaxed);
                        service.log_unexpected_on_out_link(link, p);
                    }
                    Some(Err(_)) | None => break OutLinkEnd::Broken,
                }
            }
            _ = tick.tick() => {
                let now = Instant::now();
                if front.duplex && timer.check(in_frame(&frames), now).is_some() {
                    break OutLinkEnd::Broken;
                }
                if needs_sign_on(front.sign_on, links, link)
                    && last_sign_on.is_none_or(|t| now.duration_since(t) >= front.sign_on_retry)
                {
                    last_sign_on = Some(now);
                    send_nm(service, links, link, NmKind::SignOn);
                }
                if !front.echo_interval.is_zero() && now.duration_since(last_echo) >= front.echo_interval {
                    last_echo = now;
                    send_nm(service, links, link, NmKind::Echo);
                }
                if links.idle_for(link) >= front.keepalive_idle && links.send_on(link, Outbound::KeepAlive) {
                    links.stats[link].keepalives_out.fetch_add(1, Ordering::Relaxed);
                }
            }
            res = &mut writer => {
                writer_done = Some(res);
                break OutLinkEnd::Broken;
            }
            _ = rebuild.changed() => break OutLinkEnd::Rebuild,
            _ = shutdown.changed() => break OutLinkEnd::Shutdown,
        }
    };
    if end == OutLinkEnd::Shutdown && front.sign_on != SignOn::None {
        // Sign off, and give the writer a moment to flush it.
        send_nm(service, links, link, NmKind::SignOff);
    }
    links.set_link(link, None);
    drop(tx);
    if end != OutLinkEnd::Shutdown {
        // The link is gone: frames not yet written go out on the other links.
        let _ = stop_writer.send(true);
    }
    let finished = match writer_done {
        Some(res) => Ok(res),
        None => tokio::time::timeout(Duration::from_millis(500), &mut writer).await,
    };
    match finished {
        Ok(Ok((_, mut rest))) => requeue(service, links, &mut rest),
        _ => writer.abort(),
    }
    end
}

/// Passes the unwritten frames of a dead out link to the live ones.
fn requeue(service: &Service, links: &OutLinks, rest: &mut mpsc::Receiver<Outbound>) {
    let mut moved = 0u64;
    while let Ok(out) = rest.try_recv() {
        if matches!(out, Outbound::KeepAlive) {
            continue;
        }
        if links.answer(out, Instant::now()).is_ok() {
            moved += 1;
        } else {
            service
                .counters
                .undeliverable
                .fetch_add(1, Ordering::Relaxed);
        }
    }
    if moved > 0 {
        tracing::info!(
            service = service.name(),
            moved,
            "frames of a dead out link moved to live links"
        );
    }
}

fn needs_sign_on(policy: SignOn, links: &OutLinks, link: usize) -> bool {
    match policy {
        SignOn::None => false,
        SignOn::PerLink => !links.signed_on(link),
        // One link signs the group on: the lowest-numbered link that is up.
        SignOn::PerGroup => {
            !links.group_signed_on.load(Ordering::Relaxed)
                && (0..links.len()).find(|&i| links.sender(i).is_some()) == Some(link)
        }
    }
}

/// Switch-made network management on out links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NmKind {
    SignOn,
    SignOff,
    Echo,
}

fn send_nm(service: &Service, links: &OutLinks, link: usize, kind: NmKind) {
    let stan = service.next_stan();
    match service.network_request(kind, stan) {
        Ok(payload) => {
            if links.send_on(link, Outbound::message(payload)) {
                links.expect_nm_answer(stan, link);
            }
        }
        Err(e) => {
            tracing::error!(service = service.name(), error = %e, ?kind, "cannot build network management request")
        }
    }
}

async fn accept_in_links(
    service: Arc<Service>,
    front: SimplexFront,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(links) = out_links(&service).cloned() else {
        return;
    };
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        let Ok((stream, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let allowed = front.allow.is_empty() || front.allow.iter().any(|n| n.contains(&peer.ip()));
        let open = links.in_stats.open.load(Ordering::Relaxed);
        if !allowed || open >= front.max_in_links() {
            links.in_stats.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(service = service.name(), %peer, allowed, open, "in link refused");
            continue;
        }
        links.in_stats.accepted.fetch_add(1, Ordering::Relaxed);
        links.in_stats.open.fetch_add(1, Ordering::Relaxed);
        tracing::info!(service = service.name(), %peer, "in link up");
        let svc = Arc::clone(&service);
        let f = front.clone();
        let sd = shutdown.clone();
        let l = Arc::clone(&links);
        tokio::spawn(async move {
            let why = run_in_link(&svc, &f, stream, sd).await;
            l.in_stats.open.fetch_sub(1, Ordering::Relaxed);
            tracing::warn!(service = svc.name(), %peer, reason = %why, "in link down");
        });
    }
}

async fn run_in_link(
    service: &Arc<Service>,
    front: &SimplexFront,
    stream: TcpStream,
    mut shutdown: watch::Receiver<bool>,
) -> String {
    let Some(links) = out_links(service) else {
        return "no front".into();
    };
    let prefix = service.spec.framing().prefix;
    let tap = service.capture_tap(&stream, Opened::ByPeer);
    let mut frames = FramedRead::new(
        Tapped::reader(stream, &tap),
        FrameCodec::new(prefix, service.spec.framing().max_frame),
    );
    let mut timer = ReadTimer::new(
        front.in_link_silence,
        front.partial_frame_timeout,
        Instant::now(),
    );
    let mut tick = tokio::time::interval(timer.tick_period());
    loop {
        let item = tokio::select! {
            item = frames.next() => item,
            _ = tick.tick() => {
                match timer.check(in_frame(&frames), Instant::now()) {
                    Some(ReadTimeout::Idle) => {
                        links.in_stats.closed_silent.fetch_add(1, Ordering::Relaxed);
                        return "silent too long".into();
                    }
                    Some(t) => return t.as_str().into(),
                    None => continue,
                }
            }
            _ = shutdown.changed() => return "shutdown".into(),
        };
        timer.frame(Instant::now());
        match item {
            Some(Ok(Frame::KeepAlive)) => {
                links.in_stats.keepalives_in.fetch_add(1, Ordering::Relaxed);
            }
            Some(Ok(Frame::Message(p))) => {
                links.in_stats.frames_in.fetch_add(1, Ordering::Relaxed);
                service.on_peer_frame(p, Instant::now());
            }
            Some(Ok(Frame::SessionControl(_))) => {}
            Some(Err(e)) => {
                service.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                return format!("untrusted frame: {e}");
            }
            None => return "closed by peer".into(),
        }
    }
}
