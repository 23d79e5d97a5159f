//! The load generator behind `isoswitch load` and the switch benchmarks: many
//! client connections, each keeping a window of requests in flight, with the
//! seeds' message-size mix, checking that every response matches a request it
//! sent on that connection, exactly once.

/// The paper's two client profiles: ATMs and rounds of in-flight requests.
mod profiles;
mod report;
mod template;

pub use report::{LoadCounters, LoadReport};
pub(crate) use template::{Template, pick_template, stan_bytes, stan_value};
use template::{templates, vary_f7, vary_keys};

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hdrhistogram::Histogram;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::FramedRead;

use crate::iso8583::{Message, Spec};
use crate::sim::writer::{Outbound, Patch, run_writer};
use crate::util::Rng;
use crate::wire::{Frame, FrameCodec};

/// Request sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// The seeds' acceptance profile: 80% of requests 200-300 bytes, 20%
    /// 1,200-1,400 bytes.
    Paper,
    /// Every request about this many bytes.
    Fixed(usize),
}

impl std::str::FromStr for Mix {
    type Err = String;
    fn from_str(s: &str) -> Result<Mix, String> {
        if s == "paper" {
            return Ok(Mix::Paper);
        }
        s.parse::<usize>()
            .map(Mix::Fixed)
            .map_err(|_| format!("`{s}`: use `paper` or a size in bytes"))
    }
}

impl Mix {
    /// The template sizes to prepare, each with its share of requests in 1/100.
    fn sizes(self) -> Vec<(usize, u32)> {
        match self {
            Mix::Paper => {
                let small = (200..=300).step_by(20).map(|s| (s, 80 / 6));
                let large = (1200..=1400).step_by(50).map(|s| (s, 20 / 5));
                small.chain(large).collect()
            }
            Mix::Fixed(n) => vec![(n, 1)],
        }
    }
}

#[derive(Clone, Debug)]
pub struct LoadConfig {
    pub target: SocketAddr,
    /// Further targets: client `c` connects to the `c mod n`-th of `target`
    /// and these, as clients spread over a cluster with no balancer between.
    pub spread: Vec<SocketAddr>,
    pub clients: usize,
    pub in_flight: usize,
    pub mix: Mix,
    pub duration: Duration,
    pub timeout: Duration,
    /// Total requests per second; `None` = as fast as the windows allow.
    pub rate: Option<f64>,
    /// Local address to connect from (per-source limits in tests).
    pub bind_ip: Option<IpAddr>,
    /// The MTI of the requests.
    pub mti: String,
    /// ATM profile: every request on a connection of its own (connect, one
    /// request, its answer, close), `clients` of these loops at once.
    pub connection_per_request: bool,
    /// Pause after each answer (each round with `requests_per_round`).
    pub think: Duration,
    /// The paper's MBLB profile: each client sends this many requests at once
    /// on its long connection, waits for all their answers, thinks, repeats.
    pub requests_per_round: Option<usize>,
    /// Connect over TLS (`--tls-*`); plain by default.
    pub tls: Option<Arc<crate::tls::tools::Connector>>,
    /// Each client sends its own F41 (terminal) and each request its own
    /// F37 (RRN), as a network's terminals do; by default every request
    /// carries the template's. What indexes those fields (the journal) sees
    /// real keys only with this. Long-connection mode only.
    pub vary_keys: bool,
}

impl LoadConfig {
    /// Where client `client` connects: `target` and `spread` in turn.
    pub fn target_of(&self, client: usize) -> SocketAddr {
        match client % (self.spread.len() + 1) {
            0 => self.target,
            i => self.spread[i - 1],
        }
    }

    pub fn new(target: SocketAddr) -> LoadConfig {
        LoadConfig {
            target,
            spread: Vec::new(),
            clients: 50,
            in_flight: 4,
            mix: Mix::Paper,
            duration: Duration::from_secs(10),
            timeout: Duration::from_secs(3),
            rate: None,
            bind_ip: None,
            mti: "0200".into(),
            connection_per_request: false,
            think: Duration::ZERO,
            requests_per_round: None,
            tls: None,
            vary_keys: false,
        }
    }
}

pub(crate) enum Outcome {
    Answered,
    Declined,
}

pub(crate) type Waiting = Mutex<HashMap<u32, (Instant, oneshot::Sender<Outcome>)>>;

/// Runs the load to completion.
pub async fn run(
    spec: Arc<Spec>,
    cfg: LoadConfig,
    counters: Arc<LoadCounters>,
) -> Result<LoadReport, String> {
    let templates = Arc::new(templates(&spec, &cfg)?);
    let histogram = Arc::new(Mutex::new(new_histogram()?));
    let started = Instant::now();
    let stop_at = started + cfg.duration;
    let per_slot = cfg
        .rate
        .map(|r| Duration::from_secs_f64((cfg.clients * cfg.in_flight) as f64 / r.max(0.001)));
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..cfg.clients {
        if cfg.connection_per_request {
            clients.spawn(profiles::run_atm(
                c,
                Arc::clone(&spec),
                Arc::clone(&templates),
                cfg.clone(),
                Arc::clone(&counters),
                Arc::clone(&histogram),
                stop_at,
            ));
            continue;
        }
        let target = cfg.target_of(c);
        let stream = connect(&cfg, target)
            .await
            .map_err(|e| format!("cannot connect to {target}: {e}"))?;
        counters.connects.fetch_add(1, Ordering::Relaxed);
        if let Some(n) = cfg.requests_per_round {
            clients.spawn(profiles::run_rounds(
                c,
                n,
                stream,
                Arc::clone(&spec),
                Arc::clone(&templates),
                cfg.clone(),
                Arc::clone(&counters),
                Arc::clone(&histogram),
                stop_at,
            ));
            continue;
        }
        clients.spawn(run_client(
            c,
            stream,
            Arc::clone(&spec),
            Arc::clone(&templates),
            cfg.clone(),
            Arc::clone(&counters),
            Arc::clone(&histogram),
            stop_at,
            per_slot,
        ));
    }
    while clients.join_next().await.is_some() {}
    let elapsed = started.elapsed();
    let latency_us = histogram.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let c = &counters;
    Ok(LoadReport {
        requests: c.requests.load(Ordering::Relaxed),
        answered: c.answered.load(Ordering::Relaxed),
        declined: c.declined.load(Ordering::Relaxed),
        timeouts: c.timeouts.load(Ordering::Relaxed),
        mismatches: c.mismatches.load(Ordering::Relaxed),
        connections_lost: c.connections_lost.load(Ordering::Relaxed),
        connects: c.connects.load(Ordering::Relaxed),
        connect_failures: c.connect_failures.load(Ordering::Relaxed),
        elapsed,
        latency_us,
    })
}

fn new_histogram() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())
}

pub(crate) async fn connect(
    cfg: &LoadConfig,
    target: SocketAddr,
) -> std::io::Result<crate::tls::LinkStream> {
    let stream = match cfg.bind_ip {
        None => TcpStream::connect(target).await?,
        Some(ip) => {
            let socket = if ip.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            socket.bind(SocketAddr::new(ip, 0))?;
            socket.connect(target).await?
        }
    };
    stream.set_nodelay(true)?;
    crate::tls::tools::secure_connect(cfg.tls.as_deref(), stream, target).await
}

#[allow(clippy::too_many_arguments)]
async fn run_client(
    client: usize,
    stream: crate::tls::LinkStream,
    spec: Arc<Spec>,
    templates: Arc<Vec<Template>>,
    cfg: LoadConfig,
    counters: Arc<LoadCounters>,
    histogram: Arc<Mutex<Histogram<u64>>>,
    stop_at: Instant,
    pace: Option<Duration>,
) {
    let (read, write) = stream.into_split();
    let (tx, rx) = mpsc::channel(1024);
    let writer = tokio::spawn(run_writer(write, spec.framing().prefix, rx));
    let waiting: Arc<Waiting> = Arc::new(Mutex::new(HashMap::new()));
    let reader = tokio::spawn(read_responses(
        Arc::clone(&spec),
        read,
        Arc::clone(&waiting),
        Arc::clone(&counters),
        stop_at + cfg.timeout,
    ));
    let mut slots = tokio::task::JoinSet::new();
    for slot in 0..cfg.in_flight.max(1) {
        // Every slot of every client owns a disjoint STAN sequence, so keys stay
        // unique across clients whatever the service's correlation key.
        let slots_total = (cfg.clients * cfg.in_flight.max(1)) as u32;
        let env = SlotEnv {
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            stan_base: (client * cfg.in_flight.max(1) + slot) as u32,
            stan_step: slots_total.max(1),
            templates: Arc::clone(&templates),
            tx: tx.clone(),
            waiting: Arc::clone(&waiting),
            counters: Arc::clone(&counters),
            histogram: Arc::clone(&histogram),
            timeout: cfg.timeout,
            think: cfg.think,
            seed: (client as u64) << 20 | slot as u64 | 1,
            terminal: cfg.vary_keys.then_some(client as u32),
        };
        // Paced slots start spread over one period, so that the rate is
        // smooth: started together, they would all fire in the same instant,
        // a burst of clients x in_flight requests every period, and the
        // queueing of that burst would dominate the latency measured. The
        // slots of one client are a period / in_flight apart, not side by
        // side, so that a connection's requests are independent in time as
        // a NAC's terminals are, instead of leaving in the same timer tick
        // and sharing one TCP segment.
        let rank = slot * cfg.clients.max(1) + client;
        let phase = pace.map_or(Duration::ZERO, |p| {
            p.mul_f64(rank as f64 / f64::from(slots_total.max(1)))
        });
        slots.spawn(run_slot(env, stop_at, pace, phase));
    }
    while slots.join_next().await.is_some() {}
    drop(tx);
    reader.abort();
    let _ = writer.await;
}

struct SlotEnv {
    stan_base: u32,
    stan_step: u32,
    templates: Arc<Vec<Template>>,
    tx: mpsc::Sender<Outbound>,
    waiting: Arc<Waiting>,
    counters: Arc<LoadCounters>,
    histogram: Arc<Mutex<Histogram<u64>>>,
    timeout: Duration,
    think: Duration,
    seed: u64,
    /// With `vary_keys`: this client's number, for its F41 and F37s.
    terminal: Option<u32>,
    /// The run's start, in seconds since the epoch: F7 of the slot's first
    /// pass over its STANs, a second later for each pass after.
    started: u64,
}

/// One request at a time; a client runs `in_flight` of these on one connection.
async fn run_slot(env: SlotEnv, stop_at: Instant, pace: Option<Duration>, phase: Duration) {
    let mut rng = Rng::new(env.seed);
    let mut stan = env.stan_base;
    // How many times this slot's STANs came round: seconds added to F7.
    let mut rounds = 0u64;
    let mut next_send = Instant::now() + phase;
    let total_share: u32 = env.templates.iter().map(|t| t.share).sum();
    while Instant::now() < stop_at {
        if let Some(p) = pace {
            tokio::time::sleep_until(next_send.into()).await;
            next_send += p;
        }
        let next = (stan + env.stan_step) % 1_000_000;
        if next < stan {
            rounds = rounds.wrapping_add(1);
        }
        stan = next;
        let t = pick_template(&env.templates, total_share, &mut rng);
        let digits = stan_bytes(stan);
        let encoded = if t.f11_width == 3 {
            &digits.1[..]
        } else {
            &digits.0[..]
        };
        let mut patch = Patch::default();
        if patch.overwrite(t.f11, encoded).is_err() {
            return;
        }
        if let Some(terminal) = env.terminal {
            vary_keys(&mut patch, t, terminal, stan);
        }
        vary_f7(&mut patch, t, env.started + rounds);
        let (done, outcome) = oneshot::channel();
        let sent_at = Instant::now();
        let timed = !env.counters.latency_paused.load(Ordering::Relaxed);
        env.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(stan, (sent_at, done));
        if env
            .tx
            .send(Outbound::Message(t.payload.clone(), patch))
            .await
            .is_err()
        {
            env.counters
                .connections_lost
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        env.counters.requests.fetch_add(1, Ordering::Relaxed);
        let outcome = tokio::time::timeout(env.timeout, outcome).await;
        if !env.think.is_zero() {
            tokio::time::sleep(env.think).await;
        }
        let counter = match outcome {
            Ok(Ok(o)) => {
                let us = u64::try_from(sent_at.elapsed().as_micros())
                    .unwrap_or(u64::MAX)
                    .max(1);
                if timed {
                    record_latency(
                        &mut env.histogram.lock().unwrap_or_else(|p| p.into_inner()),
                        us,
                        pace,
                    );
                }
                match o {
                    Outcome::Answered => &env.counters.answered,
                    Outcome::Declined => &env.counters.declined,
                }
            }
            Ok(Err(_)) => {
                // The reader ended: the connection is gone.
                env.counters
                    .connections_lost
                    .fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(_) => {
                env.waiting
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&stan);
                &env.counters.timeouts
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Records one answer's latency, in µs. At a fixed rate (`pace` = the
/// slot's period) a slot waiting on a slow answer does not send the requests
/// its schedule holds meanwhile: measured alone, the stall would be one
/// sample, and the requests it delayed would never be (coordinated omission).
/// `record_correct` adds the samples those requests would have seen (the
/// latency minus one period, minus two, ...), as an open-loop client sending
/// on schedule would have measured. Latency is taken from the actual send, not
/// the intended one: tokio's timer fires up to 1 ms late, which would add
/// timer slack, not the target's latency, to every sample.
pub(crate) fn record_latency(histogram: &mut Histogram<u64>, us: u64, pace: Option<Duration>) {
    let interval = pace.map_or(0, |p| u64::try_from(p.as_micros()).unwrap_or(u64::MAX));
    let _ = if interval > 0 {
        histogram.record_correct(us, interval)
    } else {
        histogram.record(us)
    };
}

pub(crate) async fn read_responses(
    spec: Arc<Spec>,
    read: crate::tls::LinkRead,
    waiting: Arc<Waiting>,
    counters: Arc<LoadCounters>,
    _until: Instant,
) {
    let codec = FrameCodec::new(spec.framing().prefix, spec.framing().max_frame);
    let mut frames = FramedRead::new(read, codec);
    while let Some(frame) = frames.next().await {
        let payload = match frame {
            Ok(Frame::Message(p)) => p,
            Ok(_) => continue,
            Err(_) => break,
        };
        let matched = Message::parse(&spec, payload).ok().and_then(|msg| {
            let stan = stan_value(msg.field(11).ok()??.data())?;
            let (_, done) = waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&stan)?;
            let ok = msg
                .field(39)
                .ok()
                .flatten()
                .is_some_and(|f| f.eq_logical(b"00"));
            let _ = done.send(if ok {
                Outcome::Answered
            } else {
                Outcome::Declined
            });
            Some(())
        });
        if matched.is_none() {
            counters.mismatches.fetch_add(1, Ordering::Relaxed);
        }
    }
    // Dropping the waiters tells their slots the connection is gone.
    waiting.lock().unwrap_or_else(|p| p.into_inner()).clear();
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn varied_keys_give_each_client_a_terminal_and_each_request_an_rrn() {
        let spec = Spec::builtin("cups").unwrap();
        let cfg = LoadConfig::new("127.0.0.1:1".parse().unwrap());
        let t = &templates(&spec, &cfg).unwrap()[0];
        assert!(
            t.f37.is_some() && t.f41.is_some(),
            "cups carries both as text"
        );
        let keys = |terminal, stan| {
            let mut patch = Patch::default();
            vary_keys(&mut patch, t, terminal, stan);
            let mut body = t.payload.to_vec();
            patch.apply(&mut body);
            let msg = Message::parse(&spec, Bytes::from(body)).unwrap();
            let text = |id| {
                msg.field(id)
                    .unwrap()
                    .unwrap()
                    .logical()
                    .collect::<Vec<u8>>()
            };
            (text(41), text(37))
        };
        assert_eq!(
            keys(42, 7),
            (b"T0000042".to_vec(), b"000042000007".to_vec())
        );
        assert_eq!(
            keys(12_345_678, 1_234_567).0,
            b"T2345678".to_vec(),
            "last digits"
        );
        assert_ne!(keys(1, 7).1, keys(1, 8).1);
    }

    #[test]
    fn stan_encodings_round_trip() {
        for stan in [0, 7, 123_456, 999_999] {
            let (ascii, bcd) = stan_bytes(stan);
            assert_eq!(stan_value(&ascii), Some(stan));
            assert_eq!(stan_value(&bcd), Some(stan));
        }
        assert_eq!(stan_bytes(123_456).1, [0x12, 0x34, 0x56]);
        assert_eq!(stan_value(b"12a456"), None);
        assert_eq!(stan_value(&[0x1A, 0, 0]), None);
    }

    #[test]
    fn a_stall_at_a_fixed_rate_counts_the_requests_it_held_back() {
        // A slot with a 1 ms period stalled 10 ms on one answer: an open-loop
        // client would have sent 9 more requests meanwhile, waiting 9, 8, ...
        // 1 ms. They are in the histogram.
        let mut h = new_histogram().unwrap();
        for _ in 0..89 {
            record_latency(&mut h, 100, Some(Duration::from_millis(1)));
        }
        record_latency(&mut h, 10_000, Some(Duration::from_millis(1)));
        assert_eq!(h.len(), 89 + 10);
        assert!(
            h.value_at_quantile(0.95) >= 5_000,
            "{}",
            h.value_at_quantile(0.95)
        );
        // Closed loop (no period): one stall is one sample.
        let mut h = new_histogram().unwrap();
        for _ in 0..89 {
            record_latency(&mut h, 100, None);
        }
        record_latency(&mut h, 10_000, None);
        assert_eq!(h.len(), 90);
        assert!(h.value_at_quantile(0.95) < 200);
    }

    #[test]
    fn approved_rate_leaves_declines_out() {
        let report = LoadReport {
            requests: 120,
            answered: 80,
            declined: 30,
            timeouts: 6,
            mismatches: 1,
            connections_lost: 2,
            connects: 5,
            connect_failures: 1,
            elapsed: Duration::from_secs(2),
            latency_us: new_histogram().unwrap(),
        };
        assert_eq!(report.approved_per_s(), 40.0);
        assert_eq!(report.throughput(), 55.0);
        assert_eq!(report.sent_per_s(), 60.0);
        assert_eq!(report.errors(), 10);
    }

    #[test]
    fn spread_clients_take_the_targets_in_turn() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let c: SocketAddr = "127.0.0.1:3".parse().unwrap();
        let mut cfg = LoadConfig::new(a);
        assert_eq!(
            (0..3).map(|i| cfg.target_of(i)).collect::<Vec<_>>(),
            [a, a, a]
        );
        cfg.spread = vec![b, c];
        let got: Vec<_> = (0..5).map(|i| cfg.target_of(i)).collect();
        assert_eq!(got, [a, b, c, a, b]);
    }

    #[test]
    fn paper_mix_is_80_20() {
        let sizes = Mix::Paper.sizes();
        let small: u32 = sizes
            .iter()
            .filter(|(s, _)| *s <= 300)
            .map(|(_, w)| w)
            .sum();
        let large: u32 = sizes
            .iter()
            .filter(|(s, _)| *s >= 1200)
            .map(|(_, w)| w)
            .sum();
        let total = small + large;
        assert!(
            (small * 100 / total).abs_diff(80) <= 2,
            "small share {small}/{total}"
        );
    }
}
