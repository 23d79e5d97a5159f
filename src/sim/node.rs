//! `isoswitch sim node`: a channel node that answers requests per spec.
//!
//! Answers each request with its response MTI, the request's fields (less track
//! data, PIN block, EMV data and MAC), F39 = `00`, the TPDU swapped and the CUPS /
//! VISA header IDs swapped; answers echo tests the same way. With a delay range it
//! answers after a uniformly random delay; with a fail rate it leaves that share
//! of requests unanswered (so the switch's timeouts are exercised).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_util::codec::FramedRead;

use crate::iso8583::{Message, Spec};
use crate::sim::writer::{Outbound, Patch, run_writer};
use crate::util::{Rng, duration};
use crate::wire::{Frame, FrameCodec};

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

/// Counters a test can read while the node runs.
#[derive(Debug, Default)]
pub struct NodeSimStats {
    /// Connections accepted over the run.
    pub connections: AtomicU64,
    /// Connections open now, and the most open at once.
    pub held: AtomicU64,
    pub peak_held: AtomicU64,
    pub requests: AtomicU64,
    pub answered: AtomicU64,
    pub unanswered: AtomicU64,
    pub bad: AtomicU64,
    /// Node-originated requests sent.
    pub originated: AtomicU64,
    /// Responses to them with F39 00, and with another F39.
    pub originated_answered: AtomicU64,
    pub originated_declined: AtomicU64,
    /// Responses that match no request this node has outstanding (another
    /// node's, or a second answer).
    pub foreign_responses: AtomicU64,
    /// Node-originated requests unanswered within their timeout.
    pub originated_unanswered: AtomicU64,
    /// Responses to node-originated requests that came back on another
    /// connection than their request left on (behind F37 stamping, often
    /// another switch instance's): matched by STAN all the same.
    pub originated_answered_elsewhere: AtomicU64,
}

/// One line of a node's counters, as `sim node` prints them on exit.
pub fn summary(s: &NodeSimStats) -> String {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    format!(
        "connections {} held {} peak {} requests {} answered {} unanswered {} bad {} | originated {} answered {} declined {} unanswered {} foreign {} elsewhere {}",
        get(&s.connections),
        get(&s.held),
        get(&s.peak_held),
        get(&s.requests),
        get(&s.answered),
        get(&s.unanswered),
        get(&s.bad),
        get(&s.originated),
        get(&s.originated_answered),
        get(&s.originated_declined),
        get(&s.originated_unanswered),
        get(&s.foreign_responses),
        get(&s.originated_answered_elsewhere),
    )
}

/// [`summary`] as one JSON object.
pub fn summary_json(s: &NodeSimStats) -> String {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    serde_json::json!({
        "connections": get(&s.connections),
        "requests": get(&s.requests),
        "answered": get(&s.answered),
        "unanswered": get(&s.unanswered),
        "bad": get(&s.bad),
        "originated": get(&s.originated),
        "originated_answered": get(&s.originated_answered),
        "originated_declined": get(&s.originated_declined),
        "originated_unanswered": get(&s.originated_unanswered),
        "foreign_responses": get(&s.foreign_responses),
        "originated_answered_elsewhere": get(&s.originated_answered_elsewhere),
    })
    .to_string()
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
}

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
    let _ = stream.set_nodelay(true);
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
    let mut rng = Rng::from_entropy();
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn handle(
    shared: &Shared,
    tx: &mpsc::Sender<Outbound>,
    payload: Bytes,
    rng: &mut Rng,
    conn: u64,
    shutdown: &watch::Receiver<bool>,
) {
    let (spec, cfg, stats) = (&*shared.spec, &shared.cfg, &*shared.stats);
    let Ok(msg) = Message::parse(spec, payload) else {
        stats.bad.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if msg.mti().is_response() {
        originated_response(shared, &msg, conn);
        return;
    }
    stats.requests.fetch_add(1, Ordering::Relaxed);
    let Ok(response) = crate::sim::answer::answer(spec, &msg, "00") else {
        stats.bad.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let response = if shared.opts.no_key {
        match blank_keys(spec, response) {
            Some(r) => r,
            None => {
                stats.bad.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    } else {
        response
    };
    if cfg.fail_rate > 0.0 && rng.chance(cfg.fail_rate) {
        stats.unanswered.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let delay = cfg.delay.sample(rng);
    if delay.is_zero() {
        stats.answered.fetch_add(1, Ordering::Relaxed);
        let _ = tx.try_send(Outbound::message(response));
        return;
    }
    let tx = tx.clone();
    // A full write queue drops the answer, as it does undelayed.
    let send = move || drop(tx.try_send(Outbound::message(response)));
    if shared.delayed.send_after(delay, shutdown.clone(), send) {
        stats.answered.fetch_add(1, Ordering::Relaxed);
    } else {
        // Past MAX_DELAYED answers waiting: the node is over its capacity.
        stats.unanswered.fetch_add(1, Ordering::Relaxed);
    }
}

/// A response to a node-originated request, read on connection `conn`: it
/// must be one of ours, on whichever connection it comes.
fn originated_response(shared: &Shared, msg: &Message<'_>, conn: u64) {
    let stats = &shared.stats;
    let stan = msg.field(11).ok().flatten().and_then(|f| {
        f.logical().try_fold(0u32, |n, d| {
            d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0'))
        })
    });
    let mine = stan.and_then(|s| lock(&shared.outstanding).remove(&s));
    let Some((_, sent_on)) = mine else {
        stats.foreign_responses.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if sent_on != conn {
        stats
            .originated_answered_elsewhere
            .fetch_add(1, Ordering::Relaxed);
    }
    let approved = msg
        .field(39)
        .ok()
        .flatten()
        .is_some_and(|f| f.eq_logical(b"00"));
    let counter = if approved {
        &stats.originated_answered
    } else {
        &stats.originated_declined
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Sends node-originated requests at a rate, round robin over the node's
/// connections, and expires the unanswered.
async fn originate(shared: Arc<Shared>, o: Originate, mut shutdown: watch::Receiver<bool>) {
    let Some(mut next) = Originator::new(&shared.spec, &o) else {
        return;
    };
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / o.rate.max(0.01)));
    // A busy runtime delays ticks; it must not then fire a burst.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        expire_originated(&shared, o.timeout);
        if shared.originating.issue(|| next.issue(&shared, &o)) == Some(Err(Unsendable)) {
            return;
        }
    }
}

/// The template's F11 cannot hold a STAN: origination stops.
#[derive(Debug, PartialEq, Eq)]
struct Unsendable;

/// The next node-originated request: the template with its STAN.
struct Originator {
    template: Bytes,
    f11: std::ops::Range<usize>,
    /// F11 is six ASCII digits (else three BCD bytes).
    ascii: bool,
    counter: u32,
    next_conn: usize,
}

impl Originator {
    fn new(spec: &Spec, o: &Originate) -> Option<Originator> {
        let template = crate::sim::sample_request(spec, &o.mti).ok()?;
        let msg = Message::parse(spec, template.clone()).ok()?;
        let f11 = msg.field(11).ok().flatten()?.range();
        Some(Originator {
            ascii: f11.len() == 6,
            template,
            f11,
            counter: 0,
            next_conn: 0,
        })
    }

    /// Sends one request on the next connection, recorded as outstanding
    /// before it leaves.
    fn issue(&mut self, shared: &Shared, o: &Originate) -> Result<(), Unsendable> {
        let (conn_id, conn) = {
            let conns = lock(&shared.conns);
            if conns.is_empty() {
                return Ok(());
            }
            self.next_conn = self.next_conn.wrapping_add(1);
            let (id, tx) = &conns[self.next_conn % conns.len()];
            (*id, tx.clone())
        };
        self.counter = self.counter % 99_999 + 1;
        let stan = o.stan_base + self.counter;
        let digits = format!("{stan:06}");
        let encoded: Vec<u8> = if self.ascii {
            digits.into_bytes()
        } else {
            digits
                .as_bytes()
                .chunks(2)
                .map(|p| ((p[0] - b'0') << 4) | (p[1] - b'0'))
                .collect()
        };
        let mut patch = Patch::default();
        if patch.overwrite(self.f11.start, &encoded).is_err() {
            return Err(Unsendable);
        }
        lock(&shared.outstanding).insert(stan, (Instant::now(), conn_id));
        if conn
            .try_send(Outbound::Message(self.template.clone(), patch))
            .is_ok()
        {
            shared.stats.originated.fetch_add(1, Ordering::Relaxed);
        } else {
            lock(&shared.outstanding).remove(&stan);
        }
        Ok(())
    }
}

fn expire_originated(shared: &Shared, timeout: Duration) {
    let now = Instant::now();
    let mut out = lock(&shared.outstanding);
    let before = out.len();
    out.retain(|_, (sent, _)| now.duration_since(*sent) < timeout);
    let expired = (before - out.len()) as u64;
    shared
        .stats
        .originated_unanswered
        .fetch_add(expired, Ordering::Relaxed);
}

impl NodeSim {
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

    /// Node-originated requests still waiting for their response.
    pub fn outstanding(&self) -> usize {
        let s = &self.stats;
        let done = s.originated_answered.load(Ordering::Relaxed)
            + s.originated_declined.load(Ordering::Relaxed)
            + s.originated_unanswered.load(Ordering::Relaxed);
        s.originated.load(Ordering::Relaxed).saturating_sub(done) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cup-pos node that answers after `delay`.
    async fn delayed_node(delay: &str) -> (Arc<Spec>, NodeSim) {
        let spec = Arc::new(Spec::builtin("cup-pos").unwrap());
        let mut cfg = NodeSimConfig::new("01");
        cfg.delay = Delay::parse(delay).unwrap();
        let node = NodeSim::start("127.0.0.1:0".parse().unwrap(), spec.clone(), cfg)
            .await
            .unwrap();
        (spec, node)
    }

    /// `n` sample 0200s for `spec`, each behind its length prefix.
    fn purchases(spec: &Spec, n: usize) -> bytes::BytesMut {
        let request = crate::sim::sample_request(spec, "0200").unwrap();
        let mut frames = bytes::BytesMut::new();
        for _ in 0..n {
            spec.framing()
                .prefix
                .encode(request.len(), &mut frames)
                .unwrap();
            frames.extend_from_slice(&request);
        }
        frames
    }

    /// Stopping a node closes its connections at once, as a dying process
    /// does: answers it was still delaying are not sent (their tasks used to
    /// keep the writer, and so the connection, open until they had run).
    #[tokio::test]
    async fn stop_closes_every_connection_at_once() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (spec, node) = delayed_node("500ms").await;
        let mut client = TcpStream::connect(node.addr).await.unwrap();
        client.write_all(&purchases(&spec, 1)).await.unwrap();
        while node.stats.requests.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        node.stop().await;
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_millis(200), client.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "closed at once, no late answer: {read:?}"
        );
    }

    /// Delayed answers are bounded: past MAX_DELAYED waiting, a request is
    /// counted unanswered instead of holding one more task (it used to spawn
    /// one per request without limit).
    #[tokio::test]
    async fn delayed_answers_past_the_cap_are_counted_unanswered() {
        use tokio::io::AsyncWriteExt;
        tokio::time::timeout(Duration::from_secs(30), async {
            let (spec, node) = delayed_node("60s").await;
            let mut client = TcpStream::connect(node.addr).await.unwrap();
            let over = 3;
            let frames = purchases(&spec, super::super::MAX_DELAYED + over);
            client.write_all(&frames).await.unwrap();
            let total = (super::super::MAX_DELAYED + over) as u64;
            while node.stats.requests.load(Ordering::Relaxed) < total {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(node.stats.unanswered.load(Ordering::Relaxed), over as u64);
            assert_eq!(
                node.stats.answered.load(Ordering::Relaxed),
                super::super::MAX_DELAYED as u64
            );
            node.stop().await;
        })
        .await
        .expect("within the test's time");
    }

    /// Behind F37 stamping (and across switch instances) the answer to a
    /// node-originated request comes back on whichever connection the
    /// switch holds: matched by STAN all the same, counted as elsewhere; a
    /// second answer is foreign.
    #[tokio::test]
    async fn an_originated_answer_on_another_connection_is_matched() {
        use tokio::io::AsyncWriteExt;
        tokio::time::timeout(Duration::from_secs(20), async {
            let spec = Arc::new(Spec::builtin("cups").unwrap());
            let mut cfg = NodeSimConfig::new("03");
            cfg.originate = Some(Originate {
                mti: "0200".into(),
                rate: 20.0,
                stan_base: 300_000,
                timeout: Duration::from_secs(10),
            });
            let node = NodeSim::start("127.0.0.1:0".parse().unwrap(), spec.clone(), cfg)
                .await
                .unwrap();
            let framing = spec.framing();
            let mut conns = Vec::new();
            for _ in 0..2 {
                let s = TcpStream::connect(node.addr).await.unwrap();
                let (r, w) = s.into_split();
                conns.push((
                    FramedRead::new(r, FrameCodec::new(framing.prefix, framing.max_frame)),
                    w,
                ));
            }
            // The first originated request, on whichever connection it left.
            let (request, came_on) = loop {
                let (a, b) = conns.split_at_mut(1);
                let got = tokio::select! {
                    f = a[0].0.next() => (f, 0),
                    f = b[0].0.next() => (f, 1),
                };
                if let (Some(Ok(Frame::Message(p))), i) = got {
                    break (p, i);
                }
            };
            let mut d = Message::parse(&spec, request).unwrap().decode().unwrap();
            d.mti = crate::sim::answer::response_mti(d.mti).unwrap();
            d.set_text(39, "00");
            let answer = spec.encode(&d).unwrap();
            let mut frame = bytes::BytesMut::new();
            framing.prefix.encode(answer.len(), &mut frame).unwrap();
            frame.extend_from_slice(&answer);
            let other = &mut conns[1 - came_on].1;
            other.write_all(&frame).await.unwrap();
            other.write_all(&frame).await.unwrap();
            let s = &node.stats;
            while s.foreign_responses.load(Ordering::Relaxed) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(s.originated_answered.load(Ordering::Relaxed), 1);
            assert_eq!(s.originated_answered_elsewhere.load(Ordering::Relaxed), 1);
            assert_eq!(
                s.foreign_responses.load(Ordering::Relaxed),
                1,
                "the second answer"
            );
            node.stop().await;
        })
        .await
        .expect("within the test's time limit");
    }

    #[test]
    fn delay_forms() {
        assert_eq!(
            Delay::parse("5ms").unwrap(),
            Delay {
                min: Duration::from_millis(5),
                max: Duration::from_millis(5)
            }
        );
        let r = Delay::parse("0..2s").unwrap();
        assert_eq!((r.min, r.max), (Duration::ZERO, Duration::from_secs(2)));
        let r = Delay::parse("10ms..200ms").unwrap();
        assert_eq!(
            (r.min, r.max),
            (Duration::from_millis(10), Duration::from_millis(200))
        );
        let r = Delay::parse("100..300ms").unwrap();
        assert_eq!(
            (r.min, r.max),
            (Duration::from_millis(100), Duration::from_millis(300))
        );
        assert!(Delay::parse("2s..1s").is_err());
        assert!(Delay::parse("soon").is_err());
        let mut rng = Rng::new(7);
        for _ in 0..100 {
            let d = r.sample(&mut rng);
            assert!(d >= r.min && d <= r.max);
        }
    }
}
