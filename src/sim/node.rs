//! `isoswitch sim node`: a channel node that answers requests per spec.
//!
//! Answers each request with its response MTI, the request's fields (less track
//! data, PIN block, EMV data and MAC), F39 = `00`, the TPDU swapped and the CUPS /
//! VISA header IDs swapped; answers echo tests the same way. With a delay range it
//! answers after a uniformly random delay; with a fail rate it leaves that share
//! of requests unanswered (so the switch's timeouts are exercised).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_util::codec::FramedRead;

use crate::iso8583::{Message, Spec};
use crate::link::writer::{Outbound, run_writer};
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
        let one = |t: &str| humantime::parse_duration(t.trim()).map_err(|e| format!("`{t}`: {e}"));
        match s.split_once("..") {
            Some((lo, hi)) => {
                // `0..2s`: a bare number takes the unit of the other end.
                let hi_d = one(hi)?;
                let lo_d = match lo.trim().parse::<u64>() {
                    Ok(0) => Duration::ZERO,
                    _ => one(lo)?,
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

    fn sample(&self, rng: &mut u64) -> Duration {
        if self.max <= self.min {
            return self.min;
        }
        let span = u64::try_from((self.max - self.min).as_micros()).unwrap_or(u64::MAX);
        self.min + Duration::from_micros(next_u64(rng) % (span + 1))
    }
}

/// What `sim node` does.
#[derive(Clone, Debug)]
pub struct NodeSimConfig {
    pub id: String,
    pub delay: Delay,
    /// Share of requests (0.0..=1.0) left unanswered.
    pub fail_rate: f64,
}

/// Counters a test can read while the node runs.
#[derive(Debug, Default)]
pub struct NodeSimStats {
    pub connections: AtomicU64,
    pub requests: AtomicU64,
    pub answered: AtomicU64,
    pub unanswered: AtomicU64,
    pub bad: AtomicU64,
}

/// A running simulated node.
pub struct NodeSim {
    pub addr: SocketAddr,
    pub stats: Arc<NodeSimStats>,
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
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(NodeSimStats::default());
        let (shutdown, rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(
            listener,
            spec,
            Arc::new(cfg),
            Arc::clone(&stats),
            rx,
        ));
        Ok(NodeSim {
            addr,
            stats,
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

async fn accept_loop(
    listener: TcpListener,
    spec: Arc<Spec>,
    cfg: Arc<NodeSimConfig>,
    stats: Arc<NodeSimStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                stats.connections.fetch_add(1, Ordering::Relaxed);
                conns.spawn(serve_conn(stream, Arc::clone(&spec), Arc::clone(&cfg), Arc::clone(&stats), shutdown.clone()));
            }
            _ = shutdown.changed() => break,
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

async fn serve_conn(
    stream: TcpStream,
    spec: Arc<Spec>,
    cfg: Arc<NodeSimConfig>,
    stats: Arc<NodeSimStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let (read, write) = stream.into_split();
    let prefix = spec.framing().prefix;
    let (tx, rx) = mpsc::channel(8192);
    let writer = tokio::spawn(run_writer(write, prefix, rx));
    let mut frames = FramedRead::new(read, FrameCodec::new(prefix, spec.framing().max_frame));
    let mut rng = seed();
    loop {
        let frame = tokio::select! {
            f = frames.next() => f,
            _ = shutdown.changed() => break,
        };
        match frame {
            Some(Ok(Frame::Message(payload))) => {
                stats.requests.fetch_add(1, Ordering::Relaxed);
                handle(&spec, &cfg, &stats, &tx, payload, &mut rng);
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => break,
        }
    }
    writer.abort();
}

fn handle(
    spec: &Spec,
    cfg: &NodeSimConfig,
    stats: &NodeSimStats,
    tx: &mpsc::Sender<Outbound>,
    payload: Bytes,
    rng: &mut u64,
) {
    let response = match Message::parse(spec, payload)
        .map_err(|e| e.to_string())
        .and_then(|m| {
            if m.mti().is_request() {
                crate::link::decline::respond(spec, &m, "00").map_err(|e| e.to_string())
            } else {
                Err("not a request".into())
            }
        }) {
        Ok(r) => r,
        Err(_) => {
            stats.bad.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    if cfg.fail_rate > 0.0 && (next_u64(rng) as f64 / u64::MAX as f64) < cfg.fail_rate {
        stats.unanswered.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let delay = cfg.delay.sample(rng);
    stats.answered.fetch_add(1, Ordering::Relaxed);
    if delay.is_zero() {
        let _ = tx.try_send(Outbound::message(response));
    } else {
        let tx = tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = tx.send(Outbound::message(response)).await;
        });
    }
}

fn seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ COUNTER.fetch_add(0x6A09_E667_F3BC_C909, Ordering::Relaxed)) | 1
}

/// xorshift64*: simulation randomness, not security.
pub(crate) fn next_u64(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(Delay::parse("2s..1s").is_err());
        assert!(Delay::parse("soon").is_err());
        let mut rng = 7;
        for _ in 0..100 {
            let d = r.sample(&mut rng);
            assert!(d >= r.min && d <= r.max);
        }
    }
}
