//! Replaying a capture: the client side of each captured connection is sent
//! to a target (a switch or a node) over its own connection, in the captured
//! order; each answer is matched to its request by a correlation key of its
//! own (response MTI, F11, F41 — not the switch's correlator), and compared
//! field by field with the captured answer.
//!
//! Order within a connection follows the capture's causality: a request that
//! was sent after N answers had come back is sent after N answers come back
//! (so a one-request-at-a-time front sees one at a time, and a pipelining
//! NAC pipelines). `speed` also keeps the captured timing (scaled); `rate`
//! paces requests at a fixed rate instead.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::codec::FramedRead;

mod record;
mod verdict;

use record::Rec;
pub use verdict::{FieldDiff, Outcome, Report, compare};

use super::read::{Connection, frames};
use super::writer::Recorder;
use crate::iso8583::{Mti, Spec};
use crate::wire::{Frame, FrameCodec};

/// How to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub target: SocketAddr,
    /// Fields not compared.
    pub ignore: Vec<u16>,
    /// Keep the captured timing, this many times faster (1.0 = as captured).
    pub speed: Option<f64>,
    /// Or send at this many requests per second in all.
    pub rate: Option<f64>,
    /// How long to wait for each answer after its request was sent.
    pub timeout: Duration,
    /// Connections replayed at once.
    pub concurrency: usize,
}

/// Fields not compared unless asked: transmission time, the F37 node stamp,
/// the authorization code.
pub const DEFAULT_IGNORE: [u16; 3] = [7, 37, 38];

/// A request and what to expect, taken from a captured connection.
#[derive(Clone, Debug)]
struct Planned {
    at: Duration,
    /// Captured answers seen before this request was sent.
    after_answers: usize,
    frame: Bytes,
    key: Option<Key>,
    label: String,
    expected: Option<Bytes>,
}

/// The correlation key of the replay: response MTI, F11, F41.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Key {
    pub(super) mti: Mti,
    pub(super) stan: String,
    pub(super) terminal: String,
}

pub(super) fn key_of(spec: &Spec, payload: &[u8]) -> Option<(Key, bool)> {
    let d = spec.decode(payload).ok()?;
    let text = |id| {
        d.get(id)
            .and_then(|v| v.as_text())
            .map(str::to_owned)
            .unwrap_or_default()
    };
    let (mti, is_request) = match d.mti.response() {
        Some(r) => (r, true),
        None => (d.mti, false),
    };
    Some((
        Key {
            mti,
            stan: text(11),
            terminal: text(41),
        },
        is_request,
    ))
}

/// The requests of a connection's client side and the answers captured for them.
fn plan(spec: &Spec, c: &Connection) -> Vec<Planned> {
    let (requests, _) = frames(spec, &c.to_server);
    let (answers, _) = frames(spec, &c.to_client);
    let mut answer_times = Vec::new();
    let mut expected: HashMap<Key, Vec<Bytes>> = HashMap::new();
    for a in &answers {
        let Frame::Message(p) = &a.frame else {
            continue;
        };
        if let Some((k, false)) = key_of(spec, p) {
            answer_times.push(a.at);
            expected.entry(k).or_default().push(p.clone());
        }
    }
    let mut out = Vec::new();
    for r in requests {
        let Frame::Message(p) = &r.frame else {
            continue;
        };
        let Some((key, true)) = key_of(spec, p) else {
            continue;
        };
        let expected = expected.get_mut(&key).and_then(|v| {
            if v.is_empty() {
                None
            } else {
                Some(v.remove(0))
            }
        });
        let mut frame = BytesMut::new();
        if spec.framing().prefix.encode(p.len(), &mut frame).is_err() {
            continue;
        }
        frame.extend_from_slice(p);
        out.push(Planned {
            at: r.at,
            after_answers: answer_times.iter().filter(|&&t| t < r.at).count(),
            frame: frame.freeze(),
            label: format!(
                "{} F11={} F41={}",
                key_mti_request(p, spec),
                key.stan,
                key.terminal
            ),
            key: Some(key),
            expected,
        });
    }
    out
}

fn key_mti_request(p: &[u8], spec: &Spec) -> String {
    spec.layout(p)
        .map(|l| l.mti.to_string())
        .unwrap_or_default()
}

/// Which captured connections have client-side requests, by server port.
pub fn server_ports(spec: &Spec, conns: &[Connection]) -> Vec<(u16, usize)> {
    let mut counts: HashMap<u16, usize> = HashMap::new();
    for c in conns {
        if !plan(spec, c).is_empty() {
            *counts.entry(c.server.port()).or_default() += 1;
        }
    }
    let mut v: Vec<(u16, usize)> = counts.into_iter().collect();
    v.sort();
    v
}

/// Replays `conns` (already selected) against the target.
pub async fn replay(
    spec: Arc<Spec>,
    conns: &[Connection],
    opts: &ReplayOptions,
    record: Option<Arc<Mutex<Recorder>>>,
) -> Report {
    let plans: Vec<(usize, Vec<Planned>)> = conns
        .iter()
        .map(|c| (c.number, plan(&spec, c)))
        .filter(|(_, p)| !p.is_empty())
        .collect();
    let origin = plans
        .iter()
        .filter_map(|(_, p)| p.first().map(|r| r.at))
        .min()
        .unwrap_or_default();
    let clock = Clock::new(origin, opts);
    let sem = Arc::new(tokio::sync::Semaphore::new(opts.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for (number, planned) in plans {
        let spec = Arc::clone(&spec);
        let opts = opts.clone();
        let sem = Arc::clone(&sem);
        let record = record.clone();
        let clock = clock.clone();
        tasks.spawn(async move {
            if let Some(first) = planned.first() {
                clock.wait_until(first.at).await;
            }
            let Ok(_permit) = sem.acquire_owned().await else {
                return Report::default();
            };
            replay_connection(&spec, number, planned, &opts, &clock, record).await
        });
    }
    let mut report = Report::default();
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(r) => report.add(r),
            Err(e) => report.details.push(format!("a replay task failed: {e}")),
        }
    }
    report
}

struct Pacer {
    every: Duration,
    next: tokio::time::Instant,
}

/// When to send: the captured timing scaled (`speed`) and/or a fixed rate.
#[derive(Clone)]
pub(super) struct Clock {
    start: tokio::time::Instant,
    origin: Duration,
    speed: Option<f64>,
    pacer: Option<Arc<tokio::sync::Mutex<Pacer>>>,
}

impl Clock {
    /// A clock starting now, at the captured moment `origin`.
    pub(super) fn new(origin: Duration, opts: &ReplayOptions) -> Clock {
        let start = tokio::time::Instant::now();
        Clock {
            start,
            origin,
            speed: opts.speed.filter(|s| *s > 0.0),
            pacer: opts.rate.filter(|r| *r > 0.0).map(|r| {
                Arc::new(tokio::sync::Mutex::new(Pacer {
                    every: Duration::from_secs_f64(1.0 / r),
                    next: start,
                }))
            }),
        }
    }

    /// With `speed`: until the captured moment `at`, scaled.
    pub(super) async fn wait_until(&self, at: Duration) {
        if let Some(speed) = self.speed {
            let offset = at.saturating_sub(self.origin).div_f64(speed);
            tokio::time::sleep_until(self.start + offset).await;
        }
    }

    /// With `rate`: the next send slot.
    pub(super) async fn pace(&self) {
        if let Some(p) = &self.pacer {
            let slot = {
                let mut p = p.lock().await;
                let slot = p.next.max(tokio::time::Instant::now());
                p.next = slot + p.every;
                slot
            };
            tokio::time::sleep_until(slot).await;
        }
    }
}

async fn replay_connection(
    spec: &Spec,
    number: usize,
    planned: Vec<Planned>,
    opts: &ReplayOptions,
    clock: &Clock,
    record: Option<Arc<Mutex<Recorder>>>,
) -> Report {
    let mut report = Report {
        connections: 1,
        ..Report::default()
    };
    let stream = match tokio::time::timeout(opts.timeout, TcpStream::connect(opts.target)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            report.connect_errors += 1;
            report.details.push(format!(
                "connection {number}: cannot connect to {}: {e}",
                opts.target
            ));
            return report;
        }
        Err(_) => {
            report.connect_errors += 1;
            report.details.push(format!(
                "connection {number}: connect to {} timed out",
                opts.target
            ));
            return report;
        }
    };
    let _ = stream.set_nodelay(true);
    let rec = Rec::open(record, &stream);
    let (read, mut write) = stream.into_split();
    let framing = spec.framing();
    let mut answers = FramedRead::new(read, FrameCodec::new(framing.prefix, framing.max_frame));
    // Key → indices of requests waiting for that answer, oldest first.
    let mut waiting: HashMap<Key, Vec<usize>> = HashMap::new();
    let mut got: Vec<Option<Bytes>> = vec![None; planned.len()];
    let mut received = 0usize;
    let mut read_offset = 0u64;
    let mut closed = false;
    for (i, p) in planned.iter().enumerate() {
        // Keep the captured causality: wait for the answers this request followed.
        let deadline = tokio::time::Instant::now() + opts.timeout;
        while received < p.after_answers && !closed {
            match tokio::time::timeout_at(deadline, answers.next()).await {
                Ok(Some(Ok(f))) => {
                    received += take_answer(
                        spec,
                        f,
                        &mut waiting,
                        &mut got,
                        &mut report,
                        &rec,
                        &mut read_offset,
                    );
                }
                Ok(_) => closed = true,
                Err(_) => break,
            }
        }
        clock.wait_until(p.at).await;
        clock.pace().await;
        if let Some(k) = &p.key {
            waiting.entry(k.clone()).or_default().push(i);
        }
        rec.data(true, &p.frame);
        if write.write_all(&p.frame).await.is_err() {
            closed = true;
        }
        report.replayed += 1;
    }
    // The remaining answers, each within the timeout of the last request.
    let mut deadline = tokio::time::Instant::now() + opts.timeout;
    while !closed && waiting.values().any(|v| !v.is_empty()) {
        match tokio::time::timeout_at(deadline, answers.next()).await {
            Ok(Some(Ok(f))) => {
                if take_answer(
                    spec,
                    f,
                    &mut waiting,
                    &mut got,
                    &mut report,
                    &rec,
                    &mut read_offset,
                ) > 0
                {
                    deadline = tokio::time::Instant::now() + opts.timeout;
                }
            }
            _ => break,
        }
    }
    let _ = write.shutdown().await;
    drop(rec);
    for (p, answer) in planned.iter().zip(got) {
        let outcome = compare(spec, p.expected.as_deref(), answer.as_deref(), &opts.ignore);
        report.tally(&format!("connection {number} {}", p.label), outcome);
    }
    report
}

/// Matches one frame from the target; returns 1 if it answered a request.
fn take_answer(
    spec: &Spec,
    frame: Frame,
    waiting: &mut HashMap<Key, Vec<usize>>,
    got: &mut [Option<Bytes>],
    report: &mut Report,
    rec: &Rec,
    read_offset: &mut u64,
) -> usize {
    let Frame::Message(p) = frame else {
        return 0;
    };
    let mut wire = BytesMut::new();
    if spec.framing().prefix.encode(p.len(), &mut wire).is_ok() {
        wire.extend_from_slice(&p);
        rec.data(false, &wire);
    }
    *read_offset += wire.len() as u64;
    match key_of(spec, &p) {
        Some((_, true)) => {
            report.unsolicited += 1;
            0
        }
        Some((k, false)) => match waiting.get_mut(&k).filter(|v| !v.is_empty()) {
            Some(v) => {
                let i = v.remove(0);
                if let Some(slot) = got.get_mut(i) {
                    *slot = Some(p);
                }
                1
            }
            None => {
                report.unexpected += 1;
                report.details.push(format!(
                    "an answer {} F11={} F41={} matches no replayed request",
                    k.mti, k.stan, k.terminal
                ));
                0
            }
        },
        None => {
            report.unexpected += 1;
            report.details.push("an answer that does not decode".into());
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iso8583::samples;

    #[test]
    fn compare_ignores_listed_fields_and_names_the_rest() {
        let spec = Spec::builtin("cups").unwrap();
        let req = samples::purchase(&spec);
        let a = spec.respond(&req, "00").unwrap();
        let mut b = a.clone();
        b.set_text(39, "05");
        b.set_text(37, "999999999999");
        let (wa, wb) = (spec.encode(&a).unwrap(), spec.encode(&b).unwrap());
        assert_eq!(compare(&spec, Some(&wa), Some(&wa), &[]), Outcome::Matched);
        let Outcome::Differs(d) = compare(&spec, Some(&wa), Some(&wb), &DEFAULT_IGNORE) else {
            panic!("F39 differs")
        };
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].field, 39);
        assert_eq!(
            compare(&spec, Some(&wa), Some(&wb), &[37, 39]),
            Outcome::Matched
        );
        assert_eq!(compare(&spec, Some(&wa), None, &[]), Outcome::Missing);
        assert_eq!(compare(&spec, None, Some(&wa), &[]), Outcome::Unexpected);
    }

    #[test]
    fn keys_pair_a_request_with_its_response() {
        let spec = Spec::builtin("iso87ascii").unwrap();
        let req = samples::purchase(&spec);
        let resp = spec.respond(&req, "00").unwrap();
        let (kq, rq) = key_of(&spec, &spec.encode(&req).unwrap()).unwrap();
        let (kr, rr) = key_of(&spec, &spec.encode(&resp).unwrap()).unwrap();
        assert!(rq && !rr);
        assert_eq!(kq, kr);
    }
}
