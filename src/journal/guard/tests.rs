use std::path::Path;
use std::sync::Mutex;

use super::*;
use crate::store::StoreConfig;
use crate::store::journal::{JournalFilter, JournalRow, NewRow};

const MIB: u64 = 1 << 20;
const NOW: i64 = 1_764_842_400_000; // 2025-12-04T10:00:00Z
const TODAY: i64 = 1_764_806_400_000; // its midnight

fn limits() -> Limits {
    Limits {
        max_size: 10 * MIB,
        min_free: 8 * MIB,
    }
}

fn space(used: u64, reusable: u64, oldest: Option<i64>) -> JournalSpace {
    JournalSpace {
        used,
        reusable,
        oldest,
    }
}

fn disk(avail: u64) -> DiskStats {
    DiskStats {
        total: 80 * MIB,
        avail,
    }
}

#[test]
fn within_limits_the_journal_writes() {
    let s = space(MIB, 0, Some(TODAY - 3 * DAY_MS));
    assert_eq!(
        decide(limits(), &s, disk(40 * MIB), false, NOW),
        Action::Write
    );
}

#[test]
fn past_either_limit_the_oldest_day_goes_first_then_it_pauses() {
    let three_days_ago = TODAY - 3 * DAY_MS + 5_000;
    // Too big: the oldest day's rows go, up to its end.
    let big = space(11 * MIB, 0, Some(three_days_ago));
    assert_eq!(
        decide(limits(), &big, disk(40 * MIB), false, NOW),
        Action::DropBefore(TODAY - 2 * DAY_MS)
    );
    // Too little free: the same.
    let small = space(MIB, 0, Some(three_days_ago));
    assert_eq!(
        decide(limits(), &small, disk(7 * MIB), false, NOW),
        Action::DropBefore(TODAY - 2 * DAY_MS)
    );
    // Only today's rows: pause.
    let today = space(MIB, 0, Some(TODAY + 1));
    assert_eq!(
        decide(limits(), &today, disk(7 * MIB), false, NOW),
        Action::Pause
    );
    assert_eq!(
        decide(
            limits(),
            &space(11 * MIB, 0, None),
            disk(40 * MIB),
            false,
            NOW
        ),
        Action::Pause
    );
}

#[test]
fn free_pages_in_the_file_count_as_free() {
    let s = space(MIB, 2 * MIB, Some(TODAY));
    assert_eq!(
        decide(limits(), &s, disk(7 * MIB), false, NOW),
        Action::Write
    );
}

#[test]
fn paused_it_resumes_only_inside_the_margin() {
    let s = space(MIB, 0, Some(TODAY));
    // Just at min_free: not yet.
    assert_eq!(
        decide(limits(), &s, disk(8 * MIB), true, NOW),
        Action::Pause
    );
    // Not paused, the same reading writes on.
    assert_eq!(
        decide(limits(), &s, disk(8 * MIB), false, NOW),
        Action::Write
    );
    // 5% inside: resumes.
    assert_eq!(
        decide(limits(), &s, disk(8 * MIB + 8 * MIB / 20), true, NOW),
        Action::Write
    );
    // The same for max_size.
    let near = space(10 * MIB - MIB / 4, 0, Some(TODAY));
    assert_eq!(
        decide(limits(), &near, disk(40 * MIB), true, NOW),
        Action::Pause
    );
}

/// A disk whose free space the test sets.
struct FakeDisk(Mutex<DiskStats>);

impl DiskProbe for FakeDisk {
    fn stat(&self, _: &Path) -> std::io::Result<DiskStats> {
        Ok(*self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

fn row(t_in: i64, i: usize) -> NewRow {
    NewRow::from(&JournalRow {
        t_in,
        t_out: t_in + 3,
        service: "pos".into(),
        front: "listen".into(),
        link: "client#1".into(),
        origin: "front".into(),
        mti: "0200".into(),
        f11: Some(format!("{i:06}")),
        f37_in: Some(format!("{i:012}")),
        f41: Some("TERM0001".into()),
        answered_by: "node".into(),
        outcome: "answered".into(),
        latency_us: Some(3_000),
        ..JournalRow::default()
    })
}

async fn count(store: &Store) -> usize {
    store
        .journal_query(JournalFilter {
            limit: 100_000,
            ..Default::default()
        })
        .await
        .expect("query")
        .len()
}

/// On a real store with a made-up disk: too little free, the guard
/// deletes the days before today, then pauses the writer (whose rows are
/// counted, not written); space back, it resumes by itself.
#[tokio::test]
async fn the_guard_drops_old_days_then_pauses_then_resumes() {
    let dir = std::env::temp_dir().join(format!("isoswitch-guard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&StoreConfig::default(), &dir)
        .await
        .expect("open");
    let now = super::super::now_millis();
    let today = now.div_euclid(DAY_MS) * DAY_MS;
    let old: Vec<NewRow> = (0..300)
        .map(|i| row(today - 3 * DAY_MS + i as i64, i))
        .collect();
    let older: Vec<NewRow> = (0..300)
        .map(|i| row(today - 5 * DAY_MS + i as i64, 1000 + i))
        .collect();
    let fresh: Vec<NewRow> = (0..50).map(|i| row(today + i as i64, 2000 + i)).collect();
    for rows in [old, older, fresh] {
        store.journal_put(rows, Vec::new()).await.expect("put");
    }
    assert_eq!(count(&store).await, 650);

    let fake = Arc::new(FakeDisk(Mutex::new(DiskStats {
        total: 100 * MIB,
        avail: MIB,
    })));
    let counters = Arc::new(JournalCounters::default());
    let stop = CancellationToken::new();
    let guard = Guard {
        store: store.clone(),
        path: Some(dir.clone()),
        probe: Arc::clone(&fake) as Arc<dyn DiskProbe>,
        cfg: JournalConfig::default(),
        counters: Arc::clone(&counters),
        every: Duration::from_millis(10),
        stop: stop.clone(),
    };
    let task = tokio::spawn(guard.run());
    let paused = async {
        while !counters.paused.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), paused)
        .await
        .expect("the guard paused the journal within 20 s");
    // Both old days went, today's rows stay.
    assert_eq!(count(&store).await, 50);
    assert_eq!(counters.purged.load(Ordering::Relaxed), 600);

    // Paused, the writer counts what it is given and writes nothing.
    let (journal, rx) = super::super::Journal::channel(16);
    let writer = super::super::writer::WriterTask {
        rx: Arc::new(tokio::sync::Mutex::new(rx)),
        store: store.clone(),
        counters: Arc::clone(&counters),
        batch_interval: Duration::from_millis(1),
        stop: stop.clone(),
    };
    let writer_task = tokio::spawn(writer.run());
    drop(
        journal
            .tx
            .try_send(super::super::Entry::Row(row(now, 3000))),
    );
    let counted = async {
        while counters.paused_rows.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), counted)
        .await
        .expect("the paused writer counted the row");
    assert_eq!(count(&store).await, 50);

    // Space comes back: the journal resumes by itself and writes again.
    fake.0.lock().unwrap_or_else(|p| p.into_inner()).avail = 90 * MIB;
    let resumed = async {
        while counters.paused.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), resumed)
        .await
        .expect("the journal resumed within 20 s");
    drop(
        journal
            .tx
            .try_send(super::super::Entry::Row(row(now, 3001))),
    );
    let written = async {
        while counters.written.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), written)
        .await
        .expect("the resumed writer wrote the row");
    assert_eq!(count(&store).await, 51);

    stop.cancel();
    let _ = task.await;
    let _ = writer_task.await;
    store.close().await.expect("close");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The store's own reading: the journal's bytes grow with its rows, and
/// the oldest row is found.
#[tokio::test]
async fn the_store_measures_the_journal() {
    let dir = std::env::temp_dir().join(format!("isoswitch-space-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&StoreConfig::default(), &dir)
        .await
        .expect("open");
    let empty = store.journal_space().await.expect("space");
    assert_eq!(empty.oldest, None);
    let rows: Vec<NewRow> = (0..2000).map(|i| row(NOW + i as i64, i)).collect();
    store.journal_put(rows, Vec::new()).await.expect("put");
    let full = store.journal_space().await.expect("space");
    assert_eq!(full.oldest, Some(NOW));
    assert!(
        full.used > empty.used + 200_000,
        "2000 rows take more than 200 kB: {empty:?} then {full:?}"
    );
    store.close().await.expect("close");
    let _ = std::fs::remove_dir_all(&dir);
}
