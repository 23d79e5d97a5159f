//! The paper's two client profiles for the load generator ([`super`]):
//!
//! - **ATM** (`--connection-per-request`, OneConnect's Table 1): connect, send
//!   one request, wait for its answer (or the timeout), close, think, repeat.
//!   The answer is the first message on the connection: it is checked by its
//!   F11 unless the node blanked F11 (all zeros: a node that echoes no key).
//! - **Rounds** (`--requests-per-round`, MBLB's Table 2): on one long
//!   connection, send N requests at once, wait for all N answers, think,
//!   repeat.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_util::StreamExt;
use hdrhistogram::Histogram;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::FramedRead;

use super::{
    LoadConfig, LoadCounters, Outcome, Template, Waiting, connect, pick_template, read_responses,
    stan_bytes, stan_value,
};
use crate::iso8583::{Message, Spec};
use crate::sim::writer::{Outbound, Patch, frame_into, run_writer};
use crate::util::Rng;
use crate::wire::{Frame, FrameCodec};

/// A request from a template with its F11 set to `stan`.
fn request(t: &Template, stan: u32) -> Option<Outbound> {
    let digits = stan_bytes(stan);
    let encoded = if t.f11_width == 3 {
        &digits.1[..]
    } else {
        &digits.0[..]
    };
    let mut patch = Patch::default();
    patch.overwrite(t.f11, encoded).ok()?;
    Some(Outbound::Message(t.payload.clone(), patch))
}

fn record_latency(histogram: &Mutex<Histogram<u64>>, sent_at: Instant) {
    let us = u64::try_from(sent_at.elapsed().as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    let _ = histogram
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .record(us);
}

/// One ATM: a connection per request, until `stop_at`.
pub(crate) async fn run_atm(
    client: usize,
    spec: Arc<Spec>,
    templates: Arc<Vec<Template>>,
    cfg: LoadConfig,
    counters: Arc<LoadCounters>,
    histogram: Arc<Mutex<Histogram<u64>>>,
    stop_at: Instant,
) {
    let mut rng = Rng::new((client as u64) << 20 | 1);
    let total_share: u32 = templates.iter().map(|t| t.share).sum();
    let step = cfg.clients.max(1) as u32;
    let mut stan = client as u32 % 1_000_000;
    let target = cfg.target_of(client);
    while Instant::now() < stop_at {
        stan = (stan + step) % 1_000_000;
        let stream = match tokio::time::timeout(cfg.timeout, connect(&cfg, target)).await {
            Ok(Ok(s)) => s,
            _ => {
                counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                // Do not spin on a refusing target.
                tokio::time::sleep(cfg.think.max(Duration::from_millis(10))).await;
                continue;
            }
        };
        counters.connects.fetch_add(1, Ordering::Relaxed);
        let t = pick_template(&templates, total_share, &mut rng);
        let Some(out) = request(t, stan) else { return };
        one_request(&spec, stream, &out, stan, &cfg, &counters, &histogram).await;
        if !cfg.think.is_zero() {
            tokio::time::sleep(cfg.think).await;
        }
    }
}

/// Connect → one request → its answer → close (the stream drops here).
async fn one_request(
    spec: &Spec,
    stream: crate::tls::LinkStream,
    out: &Outbound,
    stan: u32,
    cfg: &LoadConfig,
    counters: &LoadCounters,
    histogram: &Mutex<Histogram<u64>>,
) {
    let prefix = spec.framing().prefix;
    let mut buf = BytesMut::new();
    if frame_into(prefix, out, &mut buf).is_err() {
        return;
    }
    let (read, mut write) = stream.into_split();
    counters.requests.fetch_add(1, Ordering::Relaxed);
    let sent_at = Instant::now();
    if write.write_all(&buf).await.is_err() {
        counters.connections_lost.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut frames = FramedRead::new(read, FrameCodec::new(prefix, spec.framing().max_frame));
    let answer = tokio::time::timeout(cfg.timeout, async {
        loop {
            match frames.next().await {
                Some(Ok(Frame::Message(p))) => return Some(p),
                Some(Ok(_)) => continue,
                _ => return None,
            }
        }
    })
    .await;
    let payload = match answer {
        Ok(Some(p)) => p,
        Ok(None) => {
            counters.connections_lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Err(_) => {
            counters.timeouts.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    record_latency(histogram, sent_at);
    let Ok(msg) = Message::parse(spec, payload) else {
        counters.mismatches.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let f11 = msg
        .field(11)
        .ok()
        .flatten()
        .and_then(|f| stan_value(f.data()));
    // A blanked F11 (a node that echoes no key) cannot be checked: the
    // connection alone ties the answer to the request.
    if f11.is_some_and(|v| v != 0 && v != stan) {
        counters.mismatches.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let ok = msg
        .field(39)
        .ok()
        .flatten()
        .is_some_and(|f| f.eq_logical(b"00"));
    let counter = if ok {
        &counters.answered
    } else {
        &counters.declined
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// One long-connection client sending `per_round` requests at a time.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_rounds(
    client: usize,
    per_round: usize,
    stream: crate::tls::LinkStream,
    spec: Arc<Spec>,
    templates: Arc<Vec<Template>>,
    cfg: LoadConfig,
    counters: Arc<LoadCounters>,
    histogram: Arc<Mutex<Histogram<u64>>>,
    stop_at: Instant,
) {
    let per_round = per_round.max(1);
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
    let mut rng = Rng::new((client as u64) << 20 | 3);
    let total_share: u32 = templates.iter().map(|t| t.share).sum();
    // Disjoint STANs per client and request of the round.
    let step = (cfg.clients.max(1) * per_round) as u32;
    let mut base = (client * per_round) as u32;
    'rounds: while Instant::now() < stop_at {
        let mut round = Vec::with_capacity(per_round);
        for i in 0..per_round as u32 {
            let stan = (base + i) % 1_000_000;
            let t = pick_template(&templates, total_share, &mut rng);
            let Some(out) = request(t, stan) else {
                break 'rounds;
            };
            let (done, outcome) = oneshot::channel();
            let sent_at = Instant::now();
            waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(stan, (sent_at, done));
            if tx.send(out).await.is_err() {
                counters.connections_lost.fetch_add(1, Ordering::Relaxed);
                break 'rounds;
            }
            counters.requests.fetch_add(1, Ordering::Relaxed);
            round.push((stan, sent_at, outcome));
        }
        base = (base + step) % 1_000_000;
        for (stan, sent_at, outcome) in round {
            let until = tokio::time::Instant::from_std(sent_at + cfg.timeout);
            let counter = match tokio::time::timeout_at(until, outcome).await {
                Ok(Ok(o)) => {
                    record_latency(&histogram, sent_at);
                    match o {
                        Outcome::Answered => &counters.answered,
                        Outcome::Declined => &counters.declined,
                    }
                }
                Ok(Err(_)) => {
                    counters.connections_lost.fetch_add(1, Ordering::Relaxed);
                    break 'rounds;
                }
                Err(_) => {
                    waiting
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&stan);
                    &counters.timeouts
                }
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        if !cfg.think.is_zero() {
            tokio::time::sleep(cfg.think).await;
        }
    }
    drop(tx);
    reader.abort();
    let _ = writer.await;
}
