//! The SQLite store: the API suite, group commit, a full queue, durability
//! across reopen and across kill -9 of a process that was acknowledged puts,
//! two instances on one file, and the file modes.

mod store_support;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use isoswitch::store::{SafFilter, SafId, SafState, Store, StoreError};
use store_support::{LEASE, T0, TEST_LIMIT, TempDir, config, entry};

async fn open(dir: &TempDir) -> Store {
    Store::open(&config(None), dir.path())
        .await
        .expect("open sqlite store")
}

fn db(dir: &TempDir) -> std::path::PathBuf {
    dir.path().join("isoswitch.db")
}

async fn limited<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_LIMIT, f)
        .await
        .expect("test timed out")
}

#[tokio::test]
async fn every_saf_operation() {
    let dir = TempDir::new("api");
    let store = open(&dir).await;
    limited(store_support::api_suite(&store)).await;
    store.close().await.expect("close");

    // Completed entries keep no payload; the retryable ones do.
    let conn = rusqlite::Connection::open(db(&dir)).expect("sqlite3 open");
    let kept: Vec<(String, bool)> = conn
        .prepare("SELECT state, payload IS NOT NULL FROM saf ORDER BY id")
        .and_then(|mut st| st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .expect("read payloads");
    assert_eq!(
        kept,
        [
            ("pending".into(), true),
            ("dropped".into(), false),
            ("delivered".into(), false)
        ]
    );
}

/// Holds SQLite's write lock from another connection, so the writer cannot
/// commit until it is released.
struct WriteLock(rusqlite::Connection);

impl WriteLock {
    fn take(dir: &TempDir) -> Self {
        let conn = rusqlite::Connection::open(db(dir)).expect("second connection");
        conn.execute_batch("BEGIN IMMEDIATE")
            .expect("take the write lock");
        WriteLock(conn)
    }
    fn release(self) {
        self.0
            .execute_batch("COMMIT")
            .expect("release the write lock");
    }
}

#[tokio::test]
async fn concurrent_puts_share_commits() {
    let dir = TempDir::new("group");
    let store = open(&dir).await;
    let before = store.commits();
    // While the lock is held the writer is stuck on its first batch, so
    // everything submitted meanwhile waits for the next one.
    let lock = WriteLock::take(&dir);
    let acks: Vec<_> = (0..64)
        .map(|seq| store.saf_submit(entry("cups", seq, T0)).expect("queued"))
        .collect();
    lock.release();
    let mut ids = Vec::new();
    for ack in acks {
        ids.push(limited(ack).await.expect("acked"));
    }
    let commits = store.commits() - before;
    assert!(commits <= 2, "64 puts took {commits} commits");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 64);
    let claimed = store.saf_claim("A", T0, 100, LEASE).await.expect("claim");
    assert_eq!(claimed.len(), 64, "every acked put is there");
}

#[tokio::test]
async fn a_poisoned_request_fails_alone() {
    let dir = TempDir::new("poison");
    let store = open(&dir).await;
    let lock = WriteLock::take(&dir);
    lock.0
        .execute_batch(
            "CREATE TRIGGER poison BEFORE INSERT ON saf WHEN NEW.service = 'poison' \
             BEGIN SELECT RAISE(ABORT, 'poisoned'); END;",
        )
        .expect("plant the trigger");
    limited(store_support::a_poisoned_request_fails_alone(
        &store,
        async move { lock.release() },
    ))
    .await;
}

#[tokio::test]
async fn a_full_queue_fails_the_put_at_once() {
    let dir = TempDir::new("full");
    let mut cfg = config(None);
    cfg.queue = 2;
    let store = Store::open(&cfg, dir.path()).await.expect("open");
    let lock = WriteLock::take(&dir);
    let mut acks = Vec::new();
    let mut refused = None;
    for seq in 0..10 {
        match store.saf_submit(entry("cups", seq, T0)) {
            Ok(ack) => acks.push(ack),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    lock.release();
    assert!(
        matches!(refused, Some(StoreError::QueueFull { capacity: 2 })),
        "{refused:?}"
    );
    let taken = acks.len();
    for ack in acks {
        limited(ack).await.expect("a queued put is still stored");
    }
    let stats = store.saf_stats(T0).await.expect("stats");
    assert_eq!(stats.pending, taken as u64);
}

#[tokio::test]
async fn entries_survive_a_reopen() {
    let dir = TempDir::new("reopen");
    let store = open(&dir).await;
    let id = store.saf_put(entry("cups", 7, T0)).await.expect("put");
    store.meta_put("instance", "a").await.expect("meta");
    store.close().await.expect("close");

    let store = open(&dir).await;
    let claimed = store.saf_claim("A", T0, 10, LEASE).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    assert_eq!(
        (claimed[0].id, claimed[0].payload.as_slice()),
        (id, &b"payload cups 7"[..])
    );
    assert_eq!(
        store.meta_get("instance").await.expect("meta").as_deref(),
        Some("a")
    );
    // Ids are never reused, even after the newest row is gone.
    let next = store.saf_put(entry("cups", 8, T0)).await.expect("put");
    assert!(next > id);
}

#[tokio::test]
async fn a_closed_store_says_so() {
    let dir = TempDir::new("closed");
    let store = open(&dir).await;
    let other = store.clone();
    store.close().await.expect("close");
    let after = other.saf_put(entry("cups", 1, T0)).await;
    assert!(matches!(after, Err(StoreError::Closed)), "{after:?}");
}

/// Set in the child process of `acked_puts_survive_kill_9`: the data dir.
const CHILD_DIR: &str = "ISOSWITCH_STORE_KILL_CHILD";

/// The child: 8 putters, a line per acknowledged put, until it is killed.
async fn put_until_killed(dir: std::path::PathBuf) {
    let store = Store::open(&config(None), &dir)
        .await
        .expect("child opens the store");
    let mut tasks = Vec::new();
    for putter in 0..8u32 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            // Bounded: the parent kills it long before.
            for seq in 0..20_000u32 {
                let mut e = entry("cups", seq, T0);
                e.payload = format!("putter {putter} seq {seq}").into_bytes();
                let id = store.saf_put(e).await.expect("child put");
                println!("acked {} putter {putter} seq {seq}", id.0);
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}

#[tokio::test]
async fn acked_puts_survive_kill_9() {
    if let Ok(dir) = std::env::var(CHILD_DIR) {
        put_until_killed(dir.into()).await;
        return;
    }
    let dir = TempDir::new("kill9");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "acked_puts_survive_kill_9",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the putting child");
    let stdout = child.stdout.take().expect("child stdout");
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut acked = Vec::new();
    let mut killed = false;
    // Read acks; SIGKILL mid-stream at 500; keep reading what was printed
    // before the kill until the pipe closes.
    loop {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                if let Some(ack) = line.strip_prefix("acked ") {
                    let mut words = ack.split(' ');
                    let id: i64 = words.next().and_then(|w| w.parse().ok()).expect("acked id");
                    let payload = words.collect::<Vec<_>>().join(" ");
                    acked.push((SafId(id), payload));
                }
                if acked.len() >= 500 && !killed {
                    child.kill().expect("SIGKILL the child");
                    killed = true;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!(
                    "the child printed nothing for 60 s ({} acks so far)",
                    acked.len()
                );
            }
        }
    }
    let status = child.wait().expect("reap the child");
    assert!(
        killed,
        "the child ended by itself ({status}) after {} acks",
        acked.len()
    );

    let store = open(&dir).await;
    let claimed = limited(store.saf_claim("check", T0, 1_000_000, LEASE))
        .await
        .expect("claim");
    let stored: std::collections::HashMap<SafId, Vec<u8>> =
        claimed.into_iter().map(|c| (c.id, c.payload)).collect();
    for (id, payload) in &acked {
        assert_eq!(
            stored
                .get(id)
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .as_deref(),
            Some(payload.as_str()),
            "acked entry {id} lost or changed after kill -9"
        );
    }
}

#[tokio::test]
async fn two_instances_on_one_file_never_share_an_entry() {
    let dir = TempDir::new("two");
    let a = open(&dir).await;
    let b = open(&dir).await;
    limited(store_support::two_instances_never_share(&a, &b, 300)).await;
}

#[tokio::test]
async fn an_expired_lease_passes_to_the_other_instance() {
    let dir = TempDir::new("lease");
    let a = open(&dir).await;
    let b = open(&dir).await;
    limited(store_support::an_expired_lease_passes_on(&a, &b)).await;
}

#[tokio::test]
async fn a_restarted_instance_releases_its_own_leases() {
    let dir = TempDir::new("release");
    let a = open(&dir).await;
    let b = open(&dir).await;
    limited(store_support::a_restart_releases_its_own_leases(&a, &b)).await;
}

#[tokio::test]
async fn pruning_deletes_only_completed_history() {
    let dir = TempDir::new("prune");
    let store = open(&dir).await;
    limited(store_support::pruning_deletes_only_completed_history(
        &store,
    ))
    .await;
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[tokio::test]
async fn the_database_and_its_wal_and_shm_are_0600() {
    let dir = TempDir::new("modes");
    let store = open(&dir).await;
    store.saf_put(entry("cups", 1, T0)).await.expect("put");
    let db = db(&dir);
    for suffix in ["", "-wal", "-shm"] {
        let path = std::path::PathBuf::from(format!("{}{suffix}", db.display()));
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
    let stats = store.saf_stats(T0).await.expect("stats");
    assert_eq!(stats.pending, 1);
}

#[tokio::test]
async fn unsafe_files_are_refused() {
    let dir = TempDir::new("unsafe");
    let db = db(&dir);

    std::fs::write(&db, b"").expect("create");
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let err = Store::open(&config(None), dir.path()).await.err();
    assert!(
        matches!(&err, Some(StoreError::UnsafeFile { reason, .. }) if reason.contains("0644")),
        "{err:?}"
    );
    std::fs::remove_file(&db).expect("rm");

    let elsewhere = dir.path().join("elsewhere.db");
    std::fs::write(&elsewhere, b"").expect("create");
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    symlink(&elsewhere, &db).expect("symlink");
    let err = Store::open(&config(None), dir.path()).await.err();
    assert!(
        matches!(&err, Some(StoreError::UnsafeFile { reason, .. }) if reason.contains("symbolic link")),
        "{err:?}"
    );
    std::fs::remove_file(&db).expect("rm");

    // A planted -wal link would send SQLite's writes elsewhere.
    let wal = dir.path().join("isoswitch.db-wal");
    symlink(&elsewhere, &wal).expect("symlink");
    let err = Store::open(&config(None), dir.path()).await.err();
    assert!(
        matches!(&err, Some(StoreError::UnsafeFile { path, .. }) if path == &wal),
        "{err:?}"
    );
    std::fs::remove_file(&wal).expect("rm");

    // With the traps gone the same directory opens.
    let store = open(&dir).await;
    assert_eq!(mode(&db), 0o600);
    let rows = store
        .saf_list(SafFilter {
            state: Some(SafState::Pending),
            service: None,
            limit: 1,
        })
        .await
        .expect("list");
    assert!(rows.is_empty());
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let dir = TempDir::new("newer");
    let store = open(&dir).await;
    store.meta_put("schema_version", "99").await.expect("meta");
    store.close().await.expect("close");
    let err = Store::open(&config(None), dir.path()).await.err();
    assert!(
        matches!(err, Some(StoreError::SchemaTooNew { found: 99, .. })),
        "{err:?}"
    );
}

#[tokio::test]
async fn sqlite_urls_pick_the_file() {
    let dir = TempDir::new("urls");
    let store = Store::open(&config(Some("sqlite:saf/queue.db".into())), dir.path())
        .await
        .expect("open relative");
    store.saf_put(entry("cups", 1, T0)).await.expect("put");
    store.close().await.expect("close");
    assert_eq!(mode(&dir.path().join("saf/queue.db")), 0o600);
    assert_eq!(
        mode(&dir.path().join("saf")),
        0o700,
        "a directory it creates is private"
    );

    let abs = format!("sqlite://{}", dir.path().join("abs.db").display());
    let store = Store::open(&config(Some(abs)), std::path::Path::new("/nonexistent"))
        .await
        .expect("open absolute");
    store.close().await.expect("close");
    assert_eq!(mode(&dir.path().join("abs.db")), 0o600);
}

#[tokio::test]
async fn journal_rows_queries_report_and_purges() {
    let dir = TempDir::new("journal");
    let store = open(&dir).await;
    limited(store_support::journal::journal_purges_rows(&store)).await;
    store.close().await.expect("close");
}

/// `PRAGMA secure_delete`: what the store deletes (a pruned SAF entry, a
/// purged journal row) or clears (a delivered entry's payload) is zeroed in
/// the file, not left in free space where a copy of the file would show it.
#[tokio::test]
async fn deleted_rows_leave_no_bytes_in_the_file() {
    use isoswitch::store::journal::{JournalRow, NewRow};
    const PAN: &[u8] = b"4761739001010119";
    const MARK: &str = "PURGEDMERCHANT7";
    let dir = TempDir::new("secure-delete");
    let store = open(&dir).await;
    limited(async {
        let with_pan = |seq| {
            let mut e = entry("pos", seq, T0);
            e.payload = [b"0420 F2=".as_slice(), PAN].concat();
            e
        };
        // One delivered (its payload cleared), one delivered and pruned,
        // one still pending with a payload of its own.
        for seq in 1..=2 {
            store.saf_put(with_pan(seq)).await.expect("put");
        }
        store.saf_put(entry("pos", 3, T0)).await.expect("put");
        let claimed = store.saf_claim("me", T0, 2, LEASE).await.expect("claim");
        assert_eq!(claimed.len(), 2);
        for c in &claimed {
            store
                .saf_delivered(c.id, "me", T0 + 1, "00")
                .await
                .expect("delivered");
        }
        assert_eq!(store.saf_prune(T0 + 2, 1).await.expect("prune"), 1);
        let row = |t_in, f42: &str| {
            NewRow::from(&JournalRow {
                t_in,
                t_out: t_in,
                service: "pos".into(),
                front: "listen".into(),
                link: "client#1".into(),
                origin: "front".into(),
                mti: "0200".into(),
                f42: Some(f42.into()),
                answered_by: "node".into(),
                outcome: "answered".into(),
                ..JournalRow::default()
            })
        };
        let rows = vec![row(T0, MARK), row(T0 + 10_000, "KEPTMERCHANT01")];
        store.journal_put(rows, Vec::new()).await.expect("journal");
        assert_eq!(store.journal_purge(T0 + 1, 10).await.expect("purge"), 1);
    })
    .await;
    store.close().await.expect("close");
    let mut bytes = std::fs::read(db(&dir)).expect("read the database");
    // Closed cleanly, the WAL is checkpointed and gone; if not, it counts.
    bytes.extend(std::fs::read(dir.path().join("isoswitch.db-wal")).unwrap_or_default());
    let holds = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(holds(b"KEPTMERCHANT01"), "the kept row is there");
    assert!(
        !holds(PAN),
        "a deleted or cleared payload's PAN is in the file"
    );
    assert!(
        !holds(MARK.as_bytes()),
        "a purged journal row is in the file"
    );
}

/// A key rotation: a new key put first in the key file seals new entries;
/// `saf_rekey` seals the old ones (and one written in clear before sealing)
/// again under it; then the old key can go and every entry still opens.
#[tokio::test]
async fn a_rotated_key_reseals_every_kept_payload() {
    limited(async {
        let dir = TempDir::new("rekey");
        let store = open(&dir).await;
        for seq in 1..=3 {
            store.saf_put(entry("cups", seq, T0)).await.expect("put");
        }
        store.close().await.expect("close");
        // The first entry as an isoswitch from before sealing wrote it.
        let conn = rusqlite::Connection::open(db(&dir)).expect("sqlite3 open");
        conn.execute(
            "UPDATE saf SET payload = CAST('payload cups 1' AS BLOB) WHERE id = 1",
            [],
        )
        .expect("a payload in clear");
        let key_ids = |conn: &rusqlite::Connection| -> Vec<String> {
            let mut st = conn
                .prepare("SELECT hex(substr(payload, 1, 8)) FROM saf ORDER BY id")
                .expect("prepare");
            st.query_map([], |r| r.get(0))
                .expect("query")
                .map(|r| r.expect("row"))
                .collect()
        };
        assert_eq!(
            key_ids(&conn)[1..],
            ["4953570100000001", "4953570100000001"]
        );

        let old = std::fs::read_to_string(dir.path().join("store.key")).expect("the key file");
        let old_line = old
            .lines()
            .find(|l| l.starts_with("1 "))
            .expect("key 1")
            .to_string();
        let new_line = format!("2 {}", "ab".repeat(32));
        let key_file = dir.path().join("rotated.key");
        let write = |text: String| {
            use std::os::unix::fs::OpenOptionsExt;
            let _ = std::fs::remove_file(&key_file);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&key_file)
                .expect("key file");
            std::io::Write::write_all(&mut f, text.as_bytes()).expect("write");
        };
        write(format!("{new_line}\n{old_line}\n"));
        let cfg = isoswitch::store::StoreConfig {
            key_file: Some(key_file.clone()),
            ..config(None)
        };
        let store = Store::open(&cfg, dir.path()).await.expect("open");
        let done = store.saf_rekey().await.expect("rekey");
        assert_eq!(
            (done.key, done.resealed, done.current, done.unopenable),
            (2, 3, 0, 0)
        );
        assert_eq!(store.saf_rekey().await.expect("again").current, 3);
        store.close().await.expect("close");
        assert!(
            key_ids(&conn).iter().all(|k| k == "4953570100000002"),
            "{:?}",
            key_ids(&conn)
        );

        // The old key out: every entry still opens, as it was put.
        write(format!("{new_line}\n"));
        let store = Store::open(&cfg, dir.path()).await.expect("open");
        let claimed = store.saf_claim("a", T0, 10, LEASE).await.expect("claim");
        let payloads: Vec<String> = claimed
            .iter()
            .map(|c| String::from_utf8_lossy(&c.payload).into_owned())
            .collect();
        assert_eq!(
            payloads,
            ["payload cups 1", "payload cups 2", "payload cups 3"]
        );
        store.close().await.expect("close");
    })
    .await;
}

#[tokio::test]
async fn an_answer_on_another_instance_finds_its_entry_by_its_keys() {
    limited(async {
        let dir = TempDir::new("owed-to-peer");
        store_support::owed_to_peer_is_found_by_its_keys(&open(&dir).await).await;
    })
    .await;
}
