//! Picking a node and recording its answer, from several threads at once on
//! one pool: what the worker threads of a busy service do per request
//! (`NodePool::pick`, then `NodePool::finished`). Each sample spreads its
//! iterations over `threads` threads and reports wall time per pick+finish,
//! so with a pool-wide lock the time per operation stops falling (or rises)
//! as threads are added, and without one it can fall.
//!
//! Run: `cargo bench --bench pick`; numbers in BENCHMARKS.md.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use isoswitch::config::BackConfig;
use isoswitch::link::back::pool::{ConnHandle, NodePool};
use isoswitch::link::io::writer::Outbound;
use tokio::sync::mpsc;

const NODES: usize = 3;

/// A pool of three nodes, each with one connection up, and the receivers
/// that keep those connections open.
fn pool(algorithm: &str, now: Instant) -> (NodePool, Vec<mpsc::Receiver<Outbound>>) {
    let mut text = format!("algorithm = \"{algorithm}\"\nconnections_per_node = 1\n");
    for i in 0..NODES {
        text += &format!(
            "[[node]]\nid = \"{:02}\"\naddress = \"127.0.0.1:{}\"\n",
            i + 1,
            9000 + i
        );
    }
    let back: BackConfig = toml::from_str(&text).expect("pool config");
    let pool = NodePool::new("bench", &back, now).expect("pool");
    let receivers = (0..NODES)
        .map(|i| {
            let (tx, rx) = mpsc::channel(1);
            pool.set_conn(
                i,
                0,
                Some(ConnHandle {
                    id: i as u64,
                    tx: tx.into(),
                }),
                now,
            );
            rx
        })
        .collect();
    (pool, receivers)
}

fn no_fields(_: u16) -> Option<&'static [u8]> {
    None
}

/// Wall time for `iters` pick+finish pairs spread over `threads` threads.
fn run(pool: &NodePool, threads: usize, iters: u64, now: Instant) -> Duration {
    let per_thread = iters.div_ceil(threads as u64);
    let start = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            let start = &start;
            s.spawn(move || {
                start.wait();
                for _ in 0..per_thread {
                    let (picked, conn) = pool
                        .pick(b"0200", no_fields, None, now)
                        .expect("a node is up");
                    black_box(&conn);
                    drop(conn);
                    picked.finished(true, Duration::from_micros(300), now);
                }
            });
        }
        let t = Instant::now();
        start.wait();
        // The scope joins every thread before it returns.
        t
    })
    .elapsed()
}

fn bench(c: &mut Criterion) {
    let now = Instant::now();
    let mut g = c.benchmark_group("pick");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for algorithm in ["round-robin", "weighted", "peak-ewma"] {
        let (pool, _rx) = pool(algorithm, now);
        for threads in [1, 2, 4] {
            g.bench_function(format!("{algorithm}/{threads}t"), |b| {
                b.iter_custom(|iters| run(&pool, threads, iters, now))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
