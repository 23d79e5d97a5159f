//! The switch's real per-message path, in process: a request frame in →
//! bytes queued to its node (frame cut, validation, key, pick, F37 stamp,
//! correlator insert, node queue, writer encode), and a response frame in →
//! bytes queued to the client (frame cut, validation, key, correlator take,
//! health, client queue, writer encode), per dialect. Sockets and task
//! wake-ups are not in it: `scripts/bench.sh` measures those end to end.
//!
//! Goal (issue 10): ≤ 150 ns per request and per response.
//! Run: `cargo bench --bench path`; numbers in BENCHMARKS.md.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group};
use isoswitch::link::inproc::{
    Rig, echo_response, frame, purchase_frames, purchase_round, service_toml,
};

/// Requests in flight per batch: distinct keys, answered after the batch.
const BATCH: usize = 256;

struct Dialect {
    name: &'static str,
    spec: &'static str,
    stamp: bool,
}

const DIALECTS: [Dialect; 3] = [
    Dialect {
        name: "cups",
        spec: "cups",
        stamp: true,
    },
    Dialect {
        name: "cup-pos",
        spec: "cup-pos",
        stamp: false,
    },
    Dialect {
        name: "visa",
        spec: "visa-base1",
        stamp: true,
    },
];

/// The batch's requests, as new transactions each round, and the node's
/// answers to them (which match every round).
struct Traffic {
    requests: Vec<Vec<u8>>,
    answers: Vec<Vec<u8>>,
    round: u32,
}

impl Traffic {
    /// The same STANs again as new transactions (unless [`fresh_keys`]):
    /// sent again unchanged they would be duplicates, answered by the
    /// switch with the answers it kept, without reaching a node. Made
    /// outside the timed and counted calls.
    fn next_round(&mut self, rig: &Rig) {
        self.round += 1;
        if fresh_keys() {
            (self.requests, self.answers) = fresh_round(rig, self.round);
            return;
        }
        self.requests = purchase_round(rig.service.spec(), BATCH, self.round).expect("frames");
    }
}

/// `PATH_TRAFFIC=fresh`: each round's purchases are new transactions as
/// terminals send them, with new STANs (so new correlation keys: F11 is in
/// every dialect's key) and nothing else changed (no F7 added to a POS
/// request), and the node's answers echo them. The default traffic sends
/// the same STANs again each round, another F7 (or F41) telling them apart:
/// every request then finds its key answered by the round before, which
/// the duplicate check pays for (docs/bench/integrity-cost.md).
fn fresh_keys() -> bool {
    std::env::var("PATH_TRAFFIC").is_ok_and(|v| v == "fresh")
}

/// Round `round` of [`fresh_keys`] traffic: the requests and their answers.
fn fresh_round(rig: &Rig, round: u32) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let spec = rig.service.spec();
    let prefix = spec.framing().prefix;
    let mut d = isoswitch::iso8583::samples::purchase(spec);
    let (mut requests, mut answers) = (Vec::with_capacity(BATCH), Vec::with_capacity(BATCH));
    for i in 0..BATCH {
        let stan = (round as usize * BATCH + i) % 999_999 + 1;
        d.set_text(11, format!("{stan:06}"));
        let payload = spec.encode(&d).expect("encode");
        let answer = echo_response(spec, &payload).expect("echo");
        answers.push(frame(prefix, &answer).expect("frame"));
        requests.push(frame(prefix, &payload).expect("frame"));
    }
    (requests, answers)
}

/// A warm rig, its request frames and the node's answers to them.
fn setup(d: &Dialect) -> (Rig, Traffic) {
    let mut toml = service_toml(d.spec, d.stamp);
    match duplicates().as_deref() {
        Some("off") => toml += "[service.integrity]\nduplicate_window = \"0s\"\n",
        Some("decline") => toml += "[service.integrity]\nduplicates = \"decline\"\n",
        _ => {}
    }
    let mut rig = Rig::new(&toml).expect("rig").on_wall_clock();
    if journal_on() {
        rig = rig.with_journal().expect("journal");
    }
    let requests = purchase_frames(rig.service.spec(), BATCH).expect("frames");
    let mut answers = Vec::with_capacity(BATCH);
    for req in &requests {
        let (node, bytes) = rig.request(req).expect("routes").expect("to a node");
        let bytes = bytes.to_vec();
        let answer = rig.answer_frame(&bytes).expect("answer");
        rig.response(node, &answer).expect("answered");
        answers.push(answer);
    }
    let rows = rig.drain_journal();
    assert!(
        !journal_on() || rows == BATCH,
        "{rows} journal rows for {BATCH} exchanges"
    );
    let mut traffic = Traffic {
        requests,
        answers,
        round: 0,
    };
    traffic.next_round(&rig);
    (rig, traffic)
}

/// `PATH_DUPLICATES=off`: the rig's service keeps no duplicate book
/// (`duplicate_window = "0s"`), to count what the duplicate check costs
/// the message path against the default; `PATH_DUPLICATES=decline`: the
/// book keeps no answers (`duplicates = "decline"`), to count the ring's
/// share.
fn duplicates() -> Option<String> {
    std::env::var("PATH_DUPLICATES").ok()
}

/// `PATH_JOURNAL=1`: the rig journals every exchange, as a switch with
/// `[journal] enabled = true` does (the rows are made on the path and
/// dropped off the queue, untimed): the journal's cost to the workers.
fn journal_on() -> bool {
    std::env::var("PATH_JOURNAL").is_ok_and(|v| v == "1")
}

/// Times `iters` requests (in batches of [`BATCH`] in flight) or their
/// responses, whichever `time_requests` says; the other half runs untimed.
fn run(rig: &mut Rig, traffic: &mut Traffic, iters: u64, time_requests: bool) -> Duration {
    let mut total = Duration::ZERO;
    let mut nodes = [0usize; BATCH];
    let mut done = 0u64;
    while done < iters {
        let n = (iters - done).min(BATCH as u64) as usize;
        let t0 = Instant::now();
        for (i, req) in traffic.requests.iter().take(n).enumerate() {
            let (node, bytes) = rig.request(req).expect("routes").expect("to a node");
            black_box(bytes);
            nodes[i] = node;
        }
        if time_requests {
            total += t0.elapsed();
        }
        let t1 = Instant::now();
        for (i, answer) in traffic.answers.iter().take(n).enumerate() {
            black_box(rig.response(nodes[i], answer).expect("answered"));
        }
        if !time_requests {
            total += t1.elapsed();
        }
        // The journal writer's side of the queue, untimed and outside
        // `Rig::response`, which path-ir.sh counts.
        rig.drain_journal();
        traffic.next_round(rig);
        done += n as u64;
    }
    total
}

fn path(c: &mut Criterion) {
    let mut g = c.benchmark_group("path");
    g.throughput(Throughput::Elements(1));
    for d in &DIALECTS {
        let (mut rig, mut traffic) = setup(d);
        g.bench_function(format!("{}_request", d.name), |b| {
            b.iter_custom(|iters| run(&mut rig, &mut traffic, iters, true))
        });
        g.bench_function(format!("{}_response", d.name), |b| {
            b.iter_custom(|iters| run(&mut rig, &mut traffic, iters, false))
        });
        let c = &rig.service.view().counters;
        assert_eq!(c.declined_total(), 0, "{}: the bench declined", d.name);
    }
    g.finish();
}

/// `PATH_IR_DECLINE=1`: N requests go out and none is answered; each
/// passes its deadline and is declined by the switch (`Rig::expire_all`,
/// counted per request by `scripts/path-ir.sh`): the decline path.
fn count_declines(rig: &mut Rig, traffic: &mut Traffic, requests: u64) {
    let mut done = 0u64;
    while done < requests {
        let n = (requests - done).min(BATCH as u64) as usize;
        for req in traffic.requests.iter().take(n) {
            black_box(rig.request(req).expect("routes").expect("to a node"));
        }
        assert_eq!(rig.expire_all(), n, "every request declined");
        while let Some(decline) = rig.client_bytes().expect("encoded") {
            black_box(decline);
        }
        rig.drain_journal();
        traffic.next_round(rig);
        done += n as u64;
    }
}

/// `PATH_IR_PAIRS=N`: no criterion; drives N request/response pairs of the
/// dialect `PATH_IR_DIALECT` (default cups) through the warm rig and exits,
/// for `scripts/path-ir.sh`, which counts the instructions of `Rig::request`
/// and `Rig::response` under callgrind: a count that, unlike a time, the
/// other processes on a shared machine do not move.
fn count_pairs(pairs: u64) {
    let name = std::env::var("PATH_IR_DIALECT").unwrap_or_else(|_| "cups".into());
    let d = DIALECTS
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("PATH_IR_DIALECT: no dialect {name}"));
    let (mut rig, mut traffic) = setup(d);
    if std::env::var("PATH_IR_DECLINE").is_ok_and(|v| v == "1") {
        count_declines(&mut rig, &mut traffic, pairs);
        return;
    }
    run(&mut rig, &mut traffic, pairs, true);
    assert_eq!(rig.service.view().counters.declined_total(), 0, "declined");
    if let Some(journal) = rig.service.journal() {
        let dropped = journal
            .counters
            .dropped
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(dropped, 0, "journal rows dropped");
    }
}

criterion_group!(benches, path);

fn main() {
    if let Some(pairs) = std::env::var("PATH_IR_PAIRS")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        count_pairs(pairs);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
