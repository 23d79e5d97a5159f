//! What the SQLite and PostgreSQL store tests share: entries, the API suite
//! every backend must pass, the two-instance claims, and temp dirs.
#![allow(dead_code)]

use std::collections::HashSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use isoswitch::store::{
    Direction, NewSafEntry, SafFilter, SafId, SafKeys, SafKind, SafState, Store, StoreConfig,
    StoreError,
};

pub mod journal;
pub mod pg;

/// A fake clock's start (Unix ms): no test reads the real time.
pub const T0: i64 = 1_700_000_000_000;
pub const SEC: i64 = 1_000;
pub const LEASE: Duration = Duration::from_secs(30);

/// Every test body runs under this limit.
pub const TEST_LIMIT: Duration = Duration::from_secs(120);

pub fn entry(service: &str, seq: u32, due: i64) -> NewSafEntry {
    NewSafEntry {
        service: service.to_string(),
        direction: Direction::ToPeer,
        kind: SafKind::Reversal,
        mti: "0420".to_string(),
        payload: format!("payload {service} {seq}").into_bytes(),
        keys: SafKeys {
            f11: Some(format!("{seq:06}")),
            f37: Some(format!("{seq:012}")),
            f7: Some("0101120000".to_string()),
            pan_masked: Some("623456******1234".to_string()),
            original: None,
        },
        created_at: due,
        expires_at: due + 3600 * SEC,
        first_attempt_at: due,
    }
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("isoswitch-store-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A store config on `url`; with PostgreSQL, the test run's one key file
/// (a PostgreSQL store needs one: every instance seals with the same keys).
pub fn config(url: Option<String>) -> StoreConfig {
    let postgres = url.as_deref().is_some_and(|u| u.starts_with("postgres"));
    StoreConfig {
        ca_file: url.as_deref().filter(|_| postgres).map(pg::ca_of),
        url,
        key_file: postgres.then(shared_key_file),
        ..StoreConfig::default()
    }
}

/// One key file for every PostgreSQL store of this test process.
pub fn shared_key_file() -> std::path::PathBuf {
    static KEY: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("store-{}.key", std::process::id()));
        let _ = std::fs::remove_file(&path);
        isoswitch::store::seal::Keyring::create(&path).expect("a key file");
        path
    })
    .clone()
}

fn ids(rows: &[isoswitch::store::ClaimedSaf]) -> Vec<SafId> {
    rows.iter().map(|c| c.id).collect()
}

type OwedRow = (String, SafKind, u64, Option<i64>, u64);

/// [`Store::saf_owed_by`] as (service, kind, pending, oldest age, dead).
async fn owed(store: &Store, now: i64) -> Vec<OwedRow> {
    let by = store.saf_owed_by(now).await.expect("owed");
    by.into_iter()
        .map(|g| {
            (
                g.service,
                g.kind,
                g.pending,
                g.oldest_pending_age_ms,
                g.dead,
            )
        })
        .collect()
}

/// Every SAF operation on a fresh store, with fake times.
pub async fn api_suite(store: &Store) {
    let e1 = store.saf_put(entry("cups", 1, T0)).await.expect("put 1");
    let mut later = entry("cups", 2, T0 + 10 * SEC);
    later.mti = "0120".to_string();
    later.kind = SafKind::Advice;
    let e2 = store.saf_put(later).await.expect("put 2");
    let mut to_node = entry("visa", 3, T0);
    to_node.direction = Direction::ToNode("02".to_string());
    to_node.mti = "0220".to_string();
    let e3 = store.saf_put(to_node).await.expect("put 3");
    assert!(e1 < e2 && e2 < e3, "ids grow: {e1} {e2} {e3}");

    let stats = store.saf_stats(T0 + 5 * SEC).await.expect("stats");
    assert_eq!((stats.pending, stats.in_flight, stats.delivered), (3, 0, 0));
    assert_eq!(stats.oldest_pending_age_ms, Some(5 * SEC));
    // What is owed per service and kind, as the metrics read it.
    assert_eq!(
        owed(store, T0 + 5 * SEC).await,
        [
            ("cups".to_string(), SafKind::Advice, 1, Some(0), 0),
            ("cups".to_string(), SafKind::Reversal, 1, Some(5 * SEC), 0),
            ("visa".to_string(), SafKind::Reversal, 1, Some(5 * SEC), 0),
        ]
    );

    // Due now: 1 and 3, not 2; each leased for its first attempt.
    let claimed = store.saf_claim("A", T0, 10, LEASE).await.expect("claim");
    assert_eq!(ids(&claimed), [e1, e3]);
    assert!(
        claimed
            .iter()
            .all(|c| c.attempt == 1 && c.lease_until == T0 + 30 * SEC)
    );
    assert_eq!(claimed[0].payload, b"payload cups 1");
    assert_eq!(claimed[0].mti, "0420");
    assert_eq!(claimed[1].direction, Direction::ToNode("02".to_string()));
    assert_eq!(claimed[1].service, "visa");
    assert_eq!(claimed[1].expires_at, T0 + 3600 * SEC);

    // Leased: nobody else gets them.
    let none = store
        .saf_claim("B", T0 + SEC, 10, LEASE)
        .await
        .expect("claim");
    assert!(none.is_empty(), "leased entries claimed again: {none:?}");
    assert_eq!(store.saf_stats(T0 + SEC).await.expect("stats").in_flight, 2);

    // Only the owner reports an attempt.
    let lost = store
        .saf_attempted(e1, "B", T0 + 5 * SEC, "no answer")
        .await;
    assert!(
        matches!(lost, Err(StoreError::LeaseLost { .. })),
        "{lost:?}"
    );
    store
        .saf_attempted(e1, "A", T0 + 5 * SEC, "no answer in 10s")
        .await
        .expect("attempted");

    // Delivered, and the same delivery reported twice is one.
    store
        .saf_delivered(e3, "A", T0 + 2 * SEC, "0230 rc=00")
        .await
        .expect("delivered");
    store
        .saf_delivered(e3, "B", T0 + 3 * SEC, "0230 rc=00")
        .await
        .expect("delivered twice");

    // The retry: attempt 2 (a repeat), and 2 is still not due.
    let claimed = store
        .saf_claim("B", T0 + 5 * SEC, 10, LEASE)
        .await
        .expect("claim");
    assert_eq!(ids(&claimed), [e1]);
    assert_eq!(claimed[0].attempt, 2);

    // Dead letter, then an operator retry: pending again, attempt 3.
    store
        .saf_dead(e1, T0 + 6 * SEC, "max age")
        .await
        .expect("dead");
    // Dead letters are owed too; delivered entries are not.
    assert_eq!(
        owed(store, T0 + 7 * SEC).await,
        [
            ("cups".to_string(), SafKind::Advice, 1, Some(0), 0),
            ("cups".to_string(), SafKind::Reversal, 0, None, 1),
        ]
    );
    let claimed = store
        .saf_claim("A", T0 + 10 * SEC, 10, LEASE)
        .await
        .expect("claim");
    assert_eq!(ids(&claimed), [e2], "a dead letter is not claimed");
    store
        .saf_retry_now(e1, T0 + 11 * SEC)
        .await
        .expect("retry now");
    let claimed = store
        .saf_claim("A", T0 + 11 * SEC, 10, LEASE)
        .await
        .expect("claim");
    assert_eq!(ids(&claimed), [e1]);
    assert_eq!(claimed[0].attempt, 3);
    assert_eq!(
        claimed[0].expires_at,
        T0 + 11 * SEC + 3600 * SEC,
        "max age again from the retry"
    );

    // An operator drop; completed entries refuse further changes.
    store
        .saf_drop(e2, T0 + 12 * SEC, "operator alice: duplicate")
        .await
        .expect("drop");
    let wrong = store.saf_drop(e2, T0 + 13 * SEC, "again").await;
    assert!(
        matches!(
            wrong,
            Err(StoreError::WrongState {
                state: SafState::Dropped,
                ..
            })
        ),
        "{wrong:?}"
    );
    let wrong = store.saf_retry_now(e3, T0 + 13 * SEC).await;
    assert!(
        matches!(
            wrong,
            Err(StoreError::WrongState {
                state: SafState::Delivered,
                ..
            })
        ),
        "{wrong:?}"
    );
    let wrong = store.saf_dead(e3, T0 + 13 * SEC, "late").await;
    assert!(
        matches!(wrong, Err(StoreError::WrongState { .. })),
        "{wrong:?}"
    );
    let missing = store.saf_retry_now(SafId(999_999), T0).await;
    assert!(
        matches!(missing, Err(StoreError::NotFound { .. })),
        "{missing:?}"
    );
    let lost = store.saf_attempted(e2, "A", T0, "x").await;
    assert!(
        matches!(lost, Err(StoreError::LeaseLost { .. })),
        "dropped while leased: {lost:?}"
    );

    // The listing: newest first, every field as recorded.
    let all = store
        .saf_list(SafFilter {
            state: None,
            service: None,
            limit: 10,
        })
        .await
        .expect("list");
    assert_eq!(all.iter().map(|r| r.id).collect::<Vec<_>>(), [e3, e2, e1]);
    let (r3, r2, r1) = (&all[0], &all[1], &all[2]);
    assert_eq!(r3.state, SafState::Delivered);
    assert_eq!(r3.answer.as_deref(), Some("0230 rc=00"));
    assert_eq!(r3.completed_by.as_deref(), Some("A"));
    assert_eq!(r3.completed_at, Some(T0 + 2 * SEC));
    assert_eq!(r3.keys.f11.as_deref(), Some("000003"));
    assert_eq!(r3.keys.pan_masked.as_deref(), Some("623456******1234"));
    assert_eq!(r3.mti, "0220");
    assert_eq!(r2.state, SafState::Dropped);
    assert_eq!(r2.kind, SafKind::Advice);
    assert_eq!(r2.reason.as_deref(), Some("operator alice: duplicate"));
    assert_eq!(r2.lease_owner, None);
    assert_eq!(r1.state, SafState::Pending);
    assert_eq!(r1.attempts, 3);
    assert_eq!(r1.lease_owner.as_deref(), Some("A"));
    assert_eq!(r1.last_error.as_deref(), Some("no answer in 10s"));
    assert_eq!(r1.reason, None, "a retried dead letter loses its reason");

    let delivered = store
        .saf_list(SafFilter {
            state: Some(SafState::Delivered),
            service: None,
            limit: 10,
        })
        .await
        .expect("list");
    assert_eq!(delivered.iter().map(|r| r.id).collect::<Vec<_>>(), [e3]);
    let cups = store
        .saf_list(SafFilter {
            state: None,
            service: Some("cups".into()),
            limit: 1,
        })
        .await
        .expect("list");
    assert_eq!(cups.iter().map(|r| r.id).collect::<Vec<_>>(), [e2]);

    let stats = store.saf_stats(T0 + 20 * SEC).await.expect("stats");
    assert_eq!(stats.pending, 1);
    assert_eq!(stats.in_flight, 1);
    assert_eq!(stats.delivered, 1);
    assert_eq!(stats.dropped, 1);
    assert_eq!(stats.dead, 0);
    assert_eq!(stats.repeats_sent, 2, "entry 1 went out 3 times");
    assert_eq!(stats.oldest_pending_age_ms, Some(20 * SEC));

    // meta: the schema version, and a runtime record.
    assert_eq!(
        store
            .meta_get("schema_version")
            .await
            .expect("meta")
            .as_deref(),
        Some(isoswitch::store::SCHEMA_VERSION.to_string().as_str())
    );
    assert_eq!(store.meta_get("instance").await.expect("meta"), None);
    store.meta_put("instance", "a").await.expect("meta put");
    store.meta_put("instance", "b").await.expect("meta put");
    assert_eq!(
        store.meta_get("instance").await.expect("meta").as_deref(),
        Some("b")
    );

    // A full PAN never reaches the store.
    let mut leaky = entry("cups", 9, T0);
    leaky.keys.pan_masked = Some("6234567890121234".to_string());
    let refused = store.saf_put(leaky).await;
    assert!(
        matches!(
            refused,
            Err(StoreError::InvalidEntry {
                field: "pan_masked",
                ..
            })
        ),
        "{refused:?}"
    );
}

/// Two instances claiming the same due entries at the same time: each entry
/// goes to exactly one of them.
pub async fn two_instances_never_share(a: &Store, b: &Store, entries: u32) {
    for seq in 0..entries {
        a.saf_put(entry("cups", seq, T0)).await.expect("put");
    }
    let claim_all = |store: Store, owner: &'static str| async move {
        let mut got = Vec::new();
        loop {
            let claimed = store.saf_claim(owner, T0, 7, LEASE).await.expect("claim");
            if claimed.is_empty() {
                return got;
            }
            got.extend(claimed.into_iter().map(|c| c.id));
        }
    };
    let (got_a, got_b) = tokio::join!(
        tokio::spawn(claim_all(a.clone(), "A")),
        tokio::spawn(claim_all(b.clone(), "B"))
    );
    let (got_a, got_b) = (got_a.expect("A claims"), got_b.expect("B claims"));
    let set_a: HashSet<_> = got_a.iter().collect();
    let set_b: HashSet<_> = got_b.iter().collect();
    assert_eq!(set_a.len(), got_a.len(), "A got an entry twice");
    assert_eq!(set_b.len(), got_b.len(), "B got an entry twice");
    let both: Vec<_> = set_a.intersection(&set_b).collect();
    assert!(both.is_empty(), "claimed by both instances: {both:?}");
    assert_eq!(
        set_a.len() + set_b.len(),
        entries as usize,
        "every entry claimed once"
    );
}

/// An owner takes an entry and vanishes; once its lease runs out the other
/// instance takes it (as a repeat), delivers it, and the first owner's late
/// report no longer applies.
pub async fn an_expired_lease_passes_on(a: &Store, b: &Store) {
    let id = a.saf_put(entry("cups", 1, T0)).await.expect("put");
    let claimed = a.saf_claim("A", T0, 10, LEASE).await.expect("claim");
    assert_eq!(ids(&claimed), [id]);
    let early = b
        .saf_claim("B", T0 + 30 * SEC - 1, 10, LEASE)
        .await
        .expect("claim");
    assert!(early.is_empty(), "taken before the lease ran out");
    let taken = b
        .saf_claim("B", T0 + 30 * SEC, 10, LEASE)
        .await
        .expect("claim");
    assert_eq!(ids(&taken), [id]);
    assert_eq!(taken[0].attempt, 2, "the second owner sends a repeat");
    let late = a.saf_attempted(id, "A", T0 + 40 * SEC, "no answer").await;
    assert!(
        matches!(late, Err(StoreError::LeaseLost { .. })),
        "{late:?}"
    );
    b.saf_delivered(id, "B", T0 + 31 * SEC, "0430 rc=00")
        .await
        .expect("delivered");
    let rows = a
        .saf_list(SafFilter {
            state: Some(SafState::Delivered),
            service: None,
            limit: 10,
        })
        .await
        .expect("list");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].completed_by.as_deref(), Some("B"));
}

/// An instance restarted under its name takes back what its dead
/// predecessor had leased, at once (not when the lease runs out), as a
/// repeat; another instance's leases stay as they are.
pub async fn a_restart_releases_its_own_leases(a: &Store, b: &Store) {
    let mine = a.saf_put(entry("pos", 1, T0)).await.expect("put");
    let theirs = a.saf_put(entry("pos", 2, T0)).await.expect("put");
    assert_eq!(
        ids(&a.saf_claim("A", T0, 1, LEASE).await.expect("claim")),
        [mine]
    );
    assert_eq!(
        ids(&b.saf_claim("B", T0, 1, LEASE).await.expect("claim")),
        [theirs]
    );
    // "A" restarts (kill -9: its lease is still live in the store).
    assert_eq!(a.saf_release_leases("A").await.expect("release"), 1);
    let again = a.saf_claim("A", T0 + 1, 10, LEASE).await.expect("claim");
    assert_eq!(ids(&again), [mine], "B's lease is not A's to release");
    assert_eq!(
        again[0].attempt, 2,
        "the attempt in flight may have reached the host"
    );
    assert_eq!(a.saf_release_leases("nobody").await.expect("release"), 0);
}

/// Pruning deletes delivered and dropped entries completed before the
/// cut-off, oldest first and at most `limit` a call; what is owed (pending)
/// and dead letters stay, whatever their age.
pub async fn pruning_deletes_only_completed_history(store: &Store) {
    let old_delivered = store.saf_put(entry("pos", 1, T0)).await.expect("put");
    let old_dropped = store.saf_put(entry("pos", 2, T0)).await.expect("put");
    let old_dead = store.saf_put(entry("pos", 3, T0)).await.expect("put");
    let old_pending = store.saf_put(entry("pos", 4, T0)).await.expect("put");
    let new_delivered = store.saf_put(entry("pos", 5, T0)).await.expect("put");
    let claimed = store.saf_claim("A", T0, 10, LEASE).await.expect("claim");
    assert_eq!(claimed.len(), 5);
    for (id, at) in [(old_delivered, T0 + SEC), (new_delivered, T0 + 100 * SEC)] {
        store
            .saf_delivered(id, "A", at, "0430 rc=00")
            .await
            .expect("delivered");
    }
    store
        .saf_dead(old_dead, T0 + SEC, "max age")
        .await
        .expect("dead");
    store
        .saf_drop(old_dropped, T0 + 2 * SEC, "operator: duplicate")
        .await
        .expect("drop");
    store
        .saf_attempted(old_pending, "A", T0 + 600 * SEC, "timeout")
        .await
        .expect("attempted");

    let cut = T0 + 50 * SEC;
    assert_eq!(
        store.saf_prune(cut, 1).await.expect("prune"),
        1,
        "one a call"
    );
    assert_eq!(store.saf_prune(cut, 10).await.expect("prune"), 1);
    assert_eq!(store.saf_prune(cut, 10).await.expect("prune"), 0);
    let left = store
        .saf_list(SafFilter {
            state: None,
            service: None,
            limit: 10,
        })
        .await
        .expect("list");
    let mut left: Vec<SafId> = left.iter().map(|r| r.id).collect();
    left.sort();
    assert_eq!(left, [old_dead, old_pending, new_delivered]);
}

/// Polls until `ready` holds (the writer taking a request is no event a
/// test can await); bounded by the test's own limit.
pub async fn wait_until(ready: impl Fn() -> bool) {
    while !ready() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A request that fails on its own data (the test plants a constraint that
/// refuses service "poison") fails alone: the requests batched with it are
/// stored. Called with the write lock held; `release` lets it go.
pub async fn a_poisoned_request_fails_alone(store: &Store, release: impl Future<Output = ()>) {
    // The writer takes this one and waits on the lock with it...
    let first = store.saf_submit(entry("cups", 0, T0)).expect("queued");
    wait_until(|| store.queued() == 0).await;
    // ...so these eleven wait together for the next batch.
    let mut acks = Vec::new();
    for seq in 1..=5 {
        acks.push(store.saf_submit(entry("cups", seq, T0)).expect("queued"));
    }
    let poison = store.saf_submit(entry("poison", 6, T0)).expect("queued");
    for seq in 7..=11 {
        acks.push(store.saf_submit(entry("cups", seq, T0)).expect("queued"));
    }
    assert_eq!(store.queued(), 11);
    release.await;
    first.await.expect("the first put");
    for ack in acks {
        ack.await
            .expect("a put batched with the poisoned one is stored");
    }
    let refused = poison.await;
    assert!(
        matches!(
            refused,
            Err(StoreError::Sqlite { .. } | StoreError::Postgres { .. })
        ),
        "{refused:?}"
    );
    // The server may quote the failing row (payload and all) in its detail:
    // the error must not carry it, not even in Debug.
    let payload = entry("poison", 6, T0).payload;
    let hex: String = payload.iter().map(|b| format!("{b:02x}")).collect();
    let shown = format!("{refused:?}");
    assert!(
        !shown.contains(&hex) && !shown.contains("payload poison"),
        "the error shows the payload: {shown}"
    );
    assert_eq!(store.saf_stats(T0).await.expect("stats").pending, 11);
}

/// An answer from the peer that reached another instance than the sender
/// finds its entry by F11, F7 and F37: only a pending entry to the peer of
/// that service, the oldest first; none once it is delivered.
pub async fn owed_to_peer_is_found_by_its_keys(store: &Store) {
    let one = store.saf_put(entry("cups", 41, T0)).await.expect("put");
    let again = store.saf_put(entry("cups", 41, T0)).await.expect("put");
    let mut to_node = entry("cups", 42, T0);
    to_node.direction = Direction::ToNode("01".to_string());
    store.saf_put(to_node).await.expect("put");
    let find = |service: &'static str, seq: u32| async move {
        store
            .saf_owed_to_peer(
                service,
                &format!("{seq:06}"),
                "0101120000",
                &format!("{seq:012}"),
            )
            .await
            .expect("look up")
    };
    assert_eq!(find("cups", 41).await, Some(one), "the oldest of two");
    assert_eq!(find("visa", 41).await, None, "another service's");
    assert_eq!(find("cups", 42).await, None, "an entry to a node");
    assert_eq!(find("cups", 43).await, None, "no such keys");
    store
        .saf_delivered(one, "B", T0 + 1, "0430 F39 00")
        .await
        .expect("delivered");
    assert_eq!(
        find("cups", 41).await,
        Some(again),
        "the other, once one is delivered"
    );
    store
        .saf_delivered(again, "C", T0 + 2, "0430 F39 00")
        .await
        .expect("delivered");
    assert_eq!(find("cups", 41).await, None, "none left pending");
}
