//! `isoswitch sim nac`: a POS network controller. Many terminals, each with its
//! own TPDU source address and terminal ID (F41), share a few uplinks; each
//! terminal keeps one request in flight, as a POS does. Every response must come
//! back on the uplink that carried its request, with the TPDU swapped, matching a
//! request that terminal sent.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::FramedRead;

use crate::iso8583::{Message, Spec};
use crate::sim::writer::{Outbound, Patch, run_writer};
use crate::wire::{Frame, FrameCodec, Tpdu};

#[derive(Clone, Debug)]
pub struct NacSimConfig {
    pub target: SocketAddr,
    /// Distinguishes NACs sharing TPDU addresses: the first two digits of F41.
    pub nac_id: u8,
    pub uplinks: usize,
    pub terminals: usize,
    /// Total requests per second across all terminals; `None` = as fast as answered.
    pub rate: Option<f64>,
    pub duration: Duration,
    /// A request unanswered this long counts as unanswered.
    pub timeout: Duration,
}

/// What the NAC saw.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NacReport {
    pub sent: u64,
    /// Responses with F39 `00`.
    pub answered: u64,
    /// Responses with another F39 (switch-made declines among them).
    pub declined: u64,
    /// Responses on the wrong uplink, with the wrong TPDU, or matching nothing.
    pub mismatched: u64,
    pub unanswered: u64,
    /// Uplinks that closed while the NAC was running.
    pub uplinks_lost: u64,
    /// Latency of answered and declined requests, in microseconds.
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl std::fmt::Display for NacReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sent {} answered {} declined {} mismatched {} unanswered {} uplinks_lost {} p50 {} µs p99 {} µs max {} µs",
            self.sent,
            self.answered,
            self.declined,
            self.mismatched,
            self.unanswered,
            self.uplinks_lost,
            self.p50_us,
            self.p99_us,
            self.max_us
        )
    }
}

/// Live counters of a running NAC (progress lines read them).
#[derive(Debug)]
pub struct NacCounters {
    pub sent: AtomicU64,
    pub answered: AtomicU64,
    pub declined: AtomicU64,
    pub mismatched: AtomicU64,
    pub unanswered: AtomicU64,
    pub uplinks_lost: AtomicU64,
    latency_us: Mutex<hdrhistogram::Histogram<u64>>,
}

impl Default for NacCounters {
    fn default() -> Self {
        NacCounters {
            sent: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            declined: AtomicU64::new(0),
            mismatched: AtomicU64::new(0),
            unanswered: AtomicU64::new(0),
            uplinks_lost: AtomicU64::new(0),
            // 1 µs .. 1 min at 3 significant digits: the bounds are valid.
            latency_us: Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3)
                    .unwrap_or_else(|_| unreachable!("valid histogram bounds")),
            ),
        }
    }
}

impl NacCounters {
    /// Answered and declined requests so far.
    pub fn done(&self) -> u64 {
        self.answered.load(Ordering::Relaxed) + self.declined.load(Ordering::Relaxed)
    }

    fn record(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let _ = self
            .latency_us
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(us);
    }

    fn report(&self) -> NacReport {
        let h = self.latency_us.lock().unwrap_or_else(|p| p.into_inner());
        NacReport {
            sent: self.sent.load(Ordering::Relaxed),
            answered: self.answered.load(Ordering::Relaxed),
            declined: self.declined.load(Ordering::Relaxed),
            mismatched: self.mismatched.load(Ordering::Relaxed),
            unanswered: self.unanswered.load(Ordering::Relaxed),
            uplinks_lost: self.uplinks_lost.load(Ordering::Relaxed),
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            max_us: h.max(),
        }
    }
}

type Counters = NacCounters;

/// The outcome a terminal waits for.
enum Outcome {
    Answered,
    Declined,
    Mismatched,
}

/// Requests in flight on one uplink, by (F41, F11).
type Waiting = Mutex<HashMap<([u8; 8], [u8; 3]), (Tpdu, oneshot::Sender<Outcome>)>>;

struct Uplink {
    tx: mpsc::Sender<Outbound>,
    waiting: Waiting,
}

/// Where to patch a request template per terminal and per request.
#[derive(Clone)]
struct Template {
    payload: Bytes,
    f11: std::ops::Range<usize>,
    f41: std::ops::Range<usize>,
}

/// Runs the NAC to completion and reports.
pub async fn run(spec: Arc<Spec>, cfg: NacSimConfig) -> std::io::Result<NacReport> {
    run_with(spec, cfg, Arc::new(NacCounters::default())).await
}

/// [`run`], with counters the caller can watch while it runs.
pub async fn run_with(
    spec: Arc<Spec>,
    cfg: NacSimConfig,
    counters: Arc<NacCounters>,
) -> std::io::Result<NacReport> {
    let template = template(&spec).map_err(std::io::Error::other)?;
    let mut uplinks = Vec::with_capacity(cfg.uplinks);
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..cfg.uplinks.max(1) {
        let stream = TcpStream::connect(cfg.target).await?;
        let _ = stream.set_nodelay(true);
        let (read, write) = stream.into_split();
        let (tx, rx) = mpsc::channel(4096);
        tokio::spawn(run_writer(write, spec.framing().prefix, rx));
        let uplink = Arc::new(Uplink {
            tx,
            waiting: Mutex::new(HashMap::new()),
        });
        readers.spawn(read_uplink(
            Arc::clone(&spec),
            read,
            Arc::clone(&uplink),
            Arc::clone(&counters),
        ));
        uplinks.push(uplink);
    }
    let stop_at = Instant::now() + cfg.duration;
    let per_terminal = cfg
        .rate
        .map(|r| Duration::from_secs_f64(cfg.terminals as f64 / r.max(0.001)));
    let mut terminals = tokio::task::JoinSet::new();
    for t in 0..cfg.terminals {
        let uplink = Arc::clone(&uplinks[t % uplinks.len()]);
        let term = Terminal::new(cfg.nac_id, t);
        // Terminals start spread over one period, as real ones are: all of
        // them firing at the same instant would make the traffic one burst.
        let first_send = Instant::now()
            + per_terminal.map_or(Duration::ZERO, |p| {
                p.mul_f64(t as f64 / cfg.terminals as f64)
            });
        terminals.spawn(run_terminal(
            term,
            template.clone(),
            uplink,
            Arc::clone(&counters),
            (first_send, stop_at),
            per_terminal,
            cfg.timeout,
        ));
    }
    while terminals.join_next().await.is_some() {}
    readers.abort_all();
    Ok(counters.report())
}

struct Terminal {
    tpdu: Tpdu,
    f41: [u8; 8],
    stan: u32,
}

/// The TPDU a host's answer to `sent` carries: the addresses trade places
/// (written here, not taken from the switch's TPDU code: this is the check).
fn answer_tpdu(sent: Tpdu) -> Tpdu {
    Tpdu {
        id: sent.id,
        destination: sent.source,
        source: sent.destination,
    }
}

impl Terminal {
    fn new(nac: u8, index: usize) -> Terminal {
        // Source address: the terminal's line number as four BCD digits, as a NAC
        // numbers its POS lines. Several NACs use the same addresses.
        let line = (index % 10_000) as u16;
        let bcd = |v: u16| ((v / 10) << 4 | (v % 10)) as u8;
        let tpdu = Tpdu {
            id: Tpdu::ID,
            destination: [0x00, 0x03],
            source: [bcd(line / 100), bcd(line % 100)],
        };
        let mut f41 = [b'0'; 8];
        let id = format!("{:02}{:06}", nac % 100, index % 1_000_000);
        f41.copy_from_slice(id.as_bytes());
        Terminal { tpdu, f41, stan: 0 }
    }

    fn next_stan(&mut self) -> [u8; 3] {
        self.stan = self.stan % 999_999 + 1;
        let s = self.stan;
        let bcd = |v: u32| ((v / 10) << 4 | (v % 10)) as u8;
        [bcd(s / 10_000), bcd(s / 100 % 100), bcd(s % 100)]
    }
}

async fn run_terminal(
    mut term: Terminal,
    template: Template,
    uplink: Arc<Uplink>,
    counters: Arc<Counters>,
    (first_send, stop_at): (Instant, Instant),
    pace: Option<Duration>,
    timeout: Duration,
) {
    let mut next_send = first_send;
    while Instant::now() < stop_at {
        if let Some(p) = pace {
            tokio::time::sleep_until(next_send.into()).await;
            next_send += p;
        }
        let stan = term.next_stan();
        let mut patch = Patch::default();
        let ok = patch.overwrite(0, &term.tpdu.to_bytes()).is_ok()
            && patch.overwrite(template.f11.start, &stan).is_ok()
            && patch.overwrite(template.f41.start, &term.f41).is_ok();
        if !ok {
            return;
        }
        let (done, outcome) = oneshot::channel();
        uplink
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((term.f41, stan), (answer_tpdu(term.tpdu), done));
        if uplink
            .tx
            .send(Outbound::Message(template.payload.clone(), patch))
            .await
            .is_err()
        {
            counters.uplinks_lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
        counters.sent.fetch_add(1, Ordering::Relaxed);
        let sent_at = Instant::now();
        let outcome = tokio::time::timeout(timeout, outcome).await;
        if let Ok(Ok(Outcome::Answered | Outcome::Declined)) = &outcome {
            counters.record(sent_at.elapsed());
        }
        let counter = match outcome {
            Ok(Ok(Outcome::Answered)) => &counters.answered,
            Ok(Ok(Outcome::Declined)) => &counters.declined,
            Ok(Ok(Outcome::Mismatched)) => &counters.mismatched,
            _ => {
                uplink
                    .waiting
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&(term.f41, stan));
                &counters.unanswered
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

async fn read_uplink(
    spec: Arc<Spec>,
    read: tokio::net::tcp::OwnedReadHalf,
    uplink: Arc<Uplink>,
    counters: Arc<Counters>,
) {
    let mut frames = FramedRead::new(
        read,
        FrameCodec::new(spec.framing().prefix, spec.framing().max_frame),
    );
    while let Some(frame) = frames.next().await {
        let payload = match frame {
            Ok(Frame::Message(p)) => p,
            Ok(_) => continue,
            Err(_) => break,
        };
        match classify(&spec, &uplink, payload) {
            Some(()) => {}
            None => {
                counters.mismatched.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    counters.uplinks_lost.fetch_add(1, Ordering::Relaxed);
}

/// Matches a response to a waiting terminal on this uplink; `None` if it matches
/// nothing here (it crossed from another uplink, or is garbage).
fn classify(spec: &Spec, uplink: &Uplink, payload: Bytes) -> Option<()> {
    let msg = Message::parse(spec, payload).ok()?;
    let f41: [u8; 8] = msg.field(41).ok()??.data().try_into().ok()?;
    let f11: [u8; 3] = msg.field(11).ok()??.data().try_into().ok()?;
    let tpdu = msg.tpdu()?;
    let (expected, done) = uplink
        .waiting
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(f41, f11))?;
    let outcome = if tpdu != expected {
        Outcome::Mismatched
    } else if msg
        .field(39)
        .ok()
        .flatten()
        .is_some_and(|f| f.eq_logical(b"00"))
    {
        Outcome::Answered
    } else {
        Outcome::Declined
    };
    let _ = done.send(outcome);
    Some(())
}

fn template(spec: &Spec) -> Result<Template, String> {
    let payload = crate::sim::sample_request(spec, "0200")?;
    let msg = Message::parse(spec, payload.clone()).map_err(|e| e.to_string())?;
    let range = |id: u16| -> Result<std::ops::Range<usize>, String> {
        msg.field(id)
            .map_err(|e| e.to_string())?
            .map(|f| f.range())
            .ok_or_else(|| format!("spec `{}` sample has no F{id}", spec.name()))
    };
    let (f11, f41) = (range(11)?, range(41)?);
    if f11.len() != 3 || f41.len() != 8 || msg.tpdu().is_none() {
        return Err("sim nac needs a POS spec: TPDU, F11 BCD n6, F41 ans8".into());
    }
    Ok(Template { payload, f11, f41 })
}
