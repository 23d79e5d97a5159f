//! Store-and-forward throughput: entries stored and acknowledged per second
//! (each put returns only once its batch is committed and synced), with 1 and
//! with 64 concurrent putters by default.
//!
//!     cargo run --release --example saf_bench                      # SQLite in a temp dir
//!     scripts/pg-test.sh run -- sh -c \
//!       'cargo run --release --example saf_bench -- --url "$ISOSWITCH_TEST_PG_URL"'
//!
//! One line per putter count: acked entries, entries/s, commits and entries
//! per commit (group commit at work), put latency p50 / p99.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use isoswitch::store::{
    Direction, Location, NewSafEntry, SafKeys, SafKind, Store, StoreConfig, now_millis,
};

#[derive(Parser)]
struct Args {
    /// The store (`sqlite:...` or `postgres://...`); default SQLite in the data dir.
    #[arg(long)]
    url: Option<String>,
    /// Data dir for SQLite; kept. Default: a temp dir per run, removed after.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Seconds each run puts for.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Concurrent putters, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    putters: Vec<usize>,
    /// The store's key file (`store.key_file`). Default: the data dir's own
    /// with SQLite; with PostgreSQL, one made in a temp dir for the run.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// The CA of PostgreSQL's certificate (`store.ca_file`): the store
    /// connects over TLS with it. scripts/pg-test.sh's servers take TLS only.
    #[arg(long, env = "ISOSWITCH_TEST_PG_CA")]
    ca_file: Option<PathBuf>,
}

/// A PAN in every payload, for scripts/checks/store.sh to look for in clear.
const PAN: &[u8] = b"6234567890121234";

/// A reversal advice about the size of a real one (~200 bytes).
fn entry(putter: usize, seq: u64) -> NewSafEntry {
    let now = now_millis();
    NewSafEntry {
        service: "cups".into(),
        direction: Direction::ToPeer,
        kind: SafKind::Reversal,
        mti: "0420".into(),
        payload: [PAN, &[0x30 + (seq % 10) as u8; 184][..]].concat(),
        keys: SafKeys {
            f11: Some(format!("{:06}", seq % 1_000_000)),
            f37: Some(format!("{putter:04}{seq:08}")),
            f7: Some("0101120000".into()),
            pan_masked: Some("623456******1234".into()),
            original: None,
        },
        created_at: now,
        expires_at: now + 86_400_000,
        first_attempt_at: now + 86_400_000,
    }
}

async fn run(cfg: &StoreConfig, dir: &std::path::Path, putters: usize, seconds: f64) {
    let store = match Store::open(cfg, dir).await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("saf_bench: {e}");
            std::process::exit(1);
        }
    };
    let what = match store.location() {
        Location::Sqlite(_) => "sqlite",
        Location::Postgres(_) => "postgres",
    };
    let commits_before = store.commits();
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for putter in 0..putters {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut latency = Histogram::<u64>::new(3).expect("histogram");
            let mut seq = 0u64;
            while Instant::now() < until {
                let t = Instant::now();
                if let Err(e) = store.saf_put(entry(putter, seq)).await {
                    eprintln!("saf_bench: put: {e}");
                    std::process::exit(1);
                }
                let _ = latency.record(t.elapsed().as_micros() as u64);
                seq += 1;
            }
            (seq, latency)
        }));
    }
    let mut acked = 0u64;
    let mut latency = Histogram::<u64>::new(3).expect("histogram");
    for task in tasks {
        let (n, h) = task.await.expect("putter");
        acked += n;
        let _ = latency.add(h);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let commits = store.commits() - commits_before;
    let _ = store.close().await;
    println!(
        "{what} putters={putters} seconds={elapsed:.1} acked={acked} entries/s={:.0} commits={commits} \
         entries/commit={:.1} p50={:.2}ms p99={:.2}ms",
        acked as f64 / elapsed,
        acked as f64 / commits.max(1) as f64,
        latency.value_at_quantile(0.5) as f64 / 1000.0,
        latency.value_at_quantile(0.99) as f64 / 1000.0,
    );
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let postgres = args
        .url
        .as_deref()
        .is_some_and(|u| u.starts_with("postgres"));
    let key_file = args.key_file.clone().or_else(|| {
        postgres.then(|| {
            let dir = std::env::temp_dir()
                .join(format!("isoswitch-saf-bench-key-{}", std::process::id()));
            let path = dir.join("store.key");
            if !path.exists() {
                isoswitch::store::seal::Keyring::create(&path).expect("a key file for the run");
            }
            path
        })
    });
    let cfg = StoreConfig {
        url: args.url.clone(),
        key_file,
        ca_file: args.ca_file.clone(),
        ..StoreConfig::default()
    };
    for &putters in &args.putters {
        match &args.data_dir {
            Some(dir) => run(&cfg, dir, putters, args.seconds).await,
            None => {
                let dir = std::env::temp_dir().join(format!(
                    "isoswitch-saf-bench-{}-{putters}",
                    std::process::id()
                ));
                run(&cfg, &dir, putters, args.seconds).await;
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
}
