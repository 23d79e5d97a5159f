//! The capture writer over a fixed batch: what one pass of the writer costs
//! for the reads and writes of [`PAIRS`] CUPS requests and their answers on a
//! client connection and a node connection (4 messages per request, as the
//! switch captures them): masking, the synthetic Ethernet/IP/TCP headers,
//! the pcapng blocks and the copy into the direct-write file buffer. The
//! taps' side (one copy and a clock read per read or write) is staged
//! outside the timing.
//!
//! Run: `cargo bench --bench capture`. Instructions per pass, which do not
//! move with a shared machine's load:
//! `valgrind --tool=callgrind --toggle-collect='*capture::write_pass*'
//! target/release/deps/capture-<hash> --bench --profile-time 2`
//! (then `callgrind_annotate`: inclusive Ir over the calls). Numbers in
//! BENCHMARKS.md ("Capture cost").

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use criterion::{Criterion, Throughput, criterion_group};
use isoswitch::capture::writer::{Recorder, WriterConfig};
use isoswitch::capture::{Event, Staged, file::Rotation};
use isoswitch::iso8583::Spec;
use isoswitch::link::inproc::{Rig, purchase_frames, service_toml};

/// Requests per pass (each read or write one frame: the usual case). A
/// busy node connection at 10k requests/s sees about this many in one
/// 50 ms pass of the writer.
const PAIRS: usize = 64;

/// Frames, one per request.
type Frames = Vec<Vec<u8>>;

/// Request frames as the client sends them, as the switch sends them to
/// the node (F37 stamped), and the node's answers.
fn frames() -> (Frames, Frames, Frames) {
    let mut rig = Rig::new(&service_toml("cups", true))
        .expect("rig")
        .on_wall_clock();
    let requests = purchase_frames(rig.service.spec(), PAIRS).expect("frames");
    let (mut to_node, mut answers) = (Vec::new(), Vec::new());
    for req in &requests {
        let (node, bytes) = rig.request(req).expect("routes").expect("to a node");
        let bytes = bytes.to_vec();
        let answer = rig.answer_frame(&bytes).expect("answer");
        rig.response(node, &answer).expect("answered");
        to_node.push(bytes);
        answers.push(answer);
    }
    (requests, to_node, answers)
}

struct Setup {
    recorder: Recorder,
    /// The client connection's and the node connection's staged batches.
    staged: [Arc<Staged>; 2],
    /// Next stream offset per connection and direction.
    offsets: [[u64; 2]; 2],
    requests: Frames,
    to_node: Frames,
    answers: Frames,
    clock: SystemTime,
}

fn setup(dir: &std::path::Path) -> Setup {
    let _ = std::fs::remove_dir_all(dir);
    let spec = Arc::new(Spec::builtin("cups").expect("cups"));
    let cfg = WriterConfig {
        rotation: Rotation {
            directory: dir.to_path_buf(),
            prefix: "isoswitch-bench".into(),
            max_file_bytes: 64 << 20,
            max_files: 2,
            max_total_bytes: u64::MAX,
        },
        clear: false,
    };
    let mut recorder = Recorder::new(spec, &cfg).expect("recorder");
    let clock = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_700_000);
    let staged = [Arc::new(Staged::new(4096)), Arc::new(Staged::new(4096))];
    for (conn, (client, server)) in [
        ("127.0.0.1:40000", "127.0.0.1:26600"),
        ("127.0.0.1:26600", "127.0.0.1:26601"),
    ]
    .into_iter()
    .enumerate()
    {
        recorder
            .record(Event::Open {
                conn: conn as u64,
                client: client.parse().expect("address"),
                server: server.parse().expect("address"),
                at: clock,
                staged: Some(Arc::clone(&staged[conn])),
            })
            .expect("open");
    }
    let (requests, to_node, answers) = frames();
    Setup {
        recorder,
        staged,
        offsets: [[0; 2]; 2],
        requests,
        to_node,
        answers,
        clock,
    }
}

impl Setup {
    /// Stages one pass's reads and writes, as the taps would.
    fn stage(&mut self) {
        for i in 0..PAIRS {
            self.clock += Duration::from_micros(100);
            // Client connection: request in, answer out. Node connection:
            // request out, answer in.
            let steps: [(usize, bool, &[u8]); 4] = [
                (0, true, &self.requests[i]),
                (1, true, &self.to_node[i]),
                (1, false, &self.answers[i]),
                (0, false, &self.answers[i]),
            ];
            for (conn, from_client, bytes) in steps {
                let offset = &mut self.offsets[conn][usize::from(from_client)];
                self.staged[conn].push(from_client, *offset, bytes, self.clock);
                *offset += bytes.len() as u64;
            }
        }
    }
}

/// One pass of the writer over what was staged (the function callgrind
/// counts).
#[inline(never)]
fn write_pass(recorder: &mut Recorder) {
    for conn in 0..2 {
        recorder
            .record(Event::Ready { conn })
            .expect("writes the batch");
    }
}

fn bench(c: &mut Criterion) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-capture");
    let mut s = setup(&dir);
    let mut g = c.benchmark_group("capture");
    g.throughput(Throughput::Elements(PAIRS as u64));
    g.bench_function("writer_pass_64_requests", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                s.stage();
                let t = std::time::Instant::now();
                write_pass(black_box(&mut s.recorder));
                total += t.elapsed();
            }
            total
        })
    });
    g.finish();
    let _ = s.recorder.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
