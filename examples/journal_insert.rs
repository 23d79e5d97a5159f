//! The journal's insert cost on the store's own thread: CPU per row for a
//! given number of rows per transaction (the writer's batch), with the
//! keys the switch bench sends (one RRN, one terminal) or with keys like a
//! bank's traffic (random RRNs, many terminals), which the secondary
//! indexes pay for.
//!
//!     cargo run --release --example journal_insert -- --batch 50,200,500 --keys same,random
//!
//! SQLite in a temporary directory (removed after), `synchronous = NORMAL`
//! for these journal-only commits as in the switch. One line per batch
//! size and key kind: rows, the store thread's CPU per row (utime + stime
//! from /proc), wall time per row.

use std::time::Instant;

use clap::Parser;
use isoswitch::store::journal::{JournalRow, NewRow};
use isoswitch::store::{Store, StoreConfig, now_millis};

#[derive(Parser)]
struct Args {
    /// Rows inserted per run.
    #[arg(long, default_value_t = 100_000)]
    rows: usize,
    /// Rows per transaction, one run each (5 ms at 10k req/s is 50).
    #[arg(long, value_delimiter = ',', default_value = "50,200,500")]
    batch: Vec<usize>,
    /// `same`: every row the bench's RRN and terminal; `random`: random
    /// 12-digit RRNs, 500 terminals, STANs in turn.
    #[arg(long, value_delimiter = ',', default_value = "same,random")]
    keys: Vec<String>,
    /// Journal indexes to drop before inserting (`journal_t_in`,
    /// `journal_f37`, `journal_f37_out`, `journal_f41`): what each one costs
    /// the store thread per row.
    #[arg(long, value_delimiter = ',')]
    drop_index: Vec<String>,
}

/// xorshift: the same keys every run, no dependency.
struct Keys(u64);

impl Keys {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn row(i: usize, t_in: i64, random: Option<&mut Keys>) -> NewRow {
    let (f37, f41) = match random {
        Some(k) => (
            format!("{:012}", k.next() % 1_000_000_000_000),
            format!("TERM{:04}", k.next() % 500),
        ),
        None => ("123456789012".to_string(), "12345678".to_string()),
    };
    NewRow::from(&JournalRow {
        t_in,
        t_out: t_in,
        service: "bench".into(),
        front: "listen".into(),
        link: format!("client#{}", i % 50),
        node: Some(format!("0{}", 1 + i % 3)),
        origin: "front".into(),
        mti: "0200".into(),
        mti_out: Some("0210".into()),
        f11: Some(format!("{:06}", i % 1_000_000)),
        f7: Some("1202145246".into()),
        f37_in: Some(f37.clone()),
        f37_out: Some(f37),
        f41: Some(f41),
        f42: Some("123456789012345".into()),
        f32: Some("03105840".into()),
        f33: Some("00010000".into()),
        pan: Some("622202*********0123".into()),
        f4: Some("000000010000".into()),
        f49: Some("156".into()),
        f39: Some("00".into()),
        answered_by: "node".into(),
        outcome: "answered".into(),
        latency_us: Some(365),
        ..JournalRow::default()
    })
}

/// CPU seconds (user + system) of this process's thread named `name`.
fn thread_cpu(name: &str) -> f64 {
    let ticks = 100.0; // CLK_TCK on Linux
    let mut total = 0u64;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() != name {
                continue;
            }
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // Fields after the `(comm)`: state is the 3rd field, utime the 14th.
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            let f: Vec<&str> = after.split_whitespace().collect();
            let utime: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
            let stime: u64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
            total += utime + stime;
        }
    }
    total as f64 / ticks
}

async fn run(rows: usize, batch: usize, keys: &str, drop_index: &[String]) {
    let dir = std::env::temp_dir().join(format!(
        "isoswitch-jins-{}-{batch}-{keys}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&StoreConfig::default(), &dir)
        .await
        .expect("open the store");
    if !drop_index.is_empty() {
        let db = rusqlite::Connection::open(dir.join(isoswitch::store::config::DEFAULT_FILE))
            .expect("open the file beside the store");
        for name in drop_index {
            db.execute_batch(&format!("DROP INDEX {name}"))
                .expect("drop the index");
        }
    }
    let mut random = (keys == "random").then_some(Keys(88_172_645_463_325_252));
    let base = now_millis();
    // Rows built before the clock starts: only the store's work is timed.
    let batches: Vec<Vec<NewRow>> = (0..rows)
        .map(|i| row(i, base + (i / 10) as i64, random.as_mut()))
        .collect::<Vec<_>>()
        .chunks(batch.max(1))
        .map(<[NewRow]>::to_vec)
        .collect();
    let cpu = thread_cpu("isoswitch-store");
    let started = Instant::now();
    for b in batches {
        store.journal_put(b, Vec::new()).await.expect("insert");
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = thread_cpu("isoswitch-store") - cpu;
    store.close().await.expect("close");
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "keys {keys:6} batch {batch:5} dropped {drop_index:?}: {rows} rows, store thread {:.2} us CPU/row, {:.2} us wall/row",
        cpu / rows as f64 * 1e6,
        wall / rows as f64 * 1e6
    );
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    for keys in &args.keys {
        for &batch in &args.batch {
            run(args.rows, batch, keys, &args.drop_index).await;
        }
    }
}
