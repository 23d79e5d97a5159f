//! The repeat book on the message path: every answered request is recorded
//! (`RepeatBook::record`, from `Service::deliver` and the switch's own
//! declines) with which node had it, for `repeat_window` (30 s by default).
//! At 30,000 requests a second the book holds about a million requests, so
//! what a record costs depends on how the book is kept: this bench fills a
//! 30 s window at 30,000 a second on a simulated clock, sweeping once a
//! simulated second as the switch does, and times records at that steady
//! state, on one thread and on two.
//!
//! Run: `cargo bench -p isoswitch-route --bench books`; numbers in BENCHMARKS.md ("Integrity
//! cost").

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use isoswitch_route::correlator::CorrelationKey;
use isoswitch_route::integrity::RepeatBook;

const RATE: u64 = 30_000;
const WINDOW: Duration = Duration::from_secs(30);
/// Simulated time between two records.
const STEP: Duration = Duration::from_nanos(1_000_000_000 / RATE);

/// A key shaped like a POS request's (terminal, STAN, date and time), made
/// without formatting so that the bench times the book, not the key.
fn key(n: u64) -> CorrelationKey {
    let mut text = *b"TERM0001:000000:1204101112";
    text[..8].copy_from_slice(&(n % 9_999_999).to_le_bytes());
    text[9..15].copy_from_slice(&(n % 1_000_000).to_le_bytes()[..6]);
    CorrelationKey::builder()
        .push(&text)
        .build()
        .expect("26 bytes fit a key")
}

/// A book holding a full window, and the simulated time and count reached.
fn full_book(t0: Instant) -> (RepeatBook, Instant, u64) {
    let book = RepeatBook::new(WINDOW, 2_000_000);
    let n = RATE * WINDOW.as_secs();
    let mut now = t0;
    for i in 0..n {
        book.record(&key(i), (i % 3) as usize, now);
        now += STEP;
        if i % RATE == 0 {
            book.sweep(now);
        }
    }
    (book, now, n)
}

/// Wall time of `iters` records spread over `threads` threads, the clock
/// moving on as the stream's would.
fn run(book: &RepeatBook, from: (Instant, u64), threads: u64, iters: u64) -> Duration {
    let per_thread = iters.div_ceil(threads);
    let start = Barrier::new(threads as usize + 1);
    std::thread::scope(|s| {
        for t in 0..threads {
            let start = &start;
            s.spawn(move || {
                start.wait();
                for j in 0..per_thread {
                    let i = from.1 + j * threads + t;
                    let now = from.0 + STEP * (j * threads + t) as u32;
                    book.record(black_box(&key(i)), (i % 3) as usize, now);
                    if t == 0 && j % RATE == 0 {
                        book.sweep(now);
                    }
                }
            });
        }
        let began = Instant::now();
        start.wait();
        // The scope joins the threads before it returns.
        began
    })
    .elapsed()
}

/// Resident memory of this process, KiB (Linux; 0 elsewhere).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn books(c: &mut Criterion) {
    let t0 = Instant::now();
    let before = rss_kib();
    let (book, mut now, mut n) = full_book(t0);
    let grew = rss_kib().saturating_sub(before);
    println!(
        "repeat book holding {} requests (a 30 s window at 30,000/s): {:.1} MB resident, {:.0} bytes a request",
        book.len(),
        grew as f64 / 1024.0,
        grew as f64 * 1024.0 / book.len().max(1) as f64
    );
    let mut g = c.benchmark_group("repeat_book");
    g.measurement_time(Duration::from_secs(5));
    for threads in [1u64, 2] {
        g.bench_function(
            format!("record_30s_window_30k_per_s/{threads}_threads"),
            |b| {
                b.iter_custom(|iters| {
                    let took = run(&book, (now, n), threads, iters);
                    n += iters;
                    now += STEP * iters as u32;
                    took
                })
            },
        );
    }
    g.finish();
    // The key's own cost, to subtract: building it is not the book's work.
    c.bench_function("repeat_book/key_only", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            black_box(key(i))
        })
    });
}

criterion_group!(benches, books);
criterion_main!(benches);
