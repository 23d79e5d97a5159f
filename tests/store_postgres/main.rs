//! The PostgreSQL store against a real server (scripts/pg-test.sh starts a
//! throwaway one): the API suite, group commit, two instances sharing the
//! queue, lease expiry, migrations racing, an outage and a lost connection,
//! and no password in any error. Every connection is TLS (verify-full): the
//! test servers refuse TCP logins in clear.

mod journal;
#[path = "../store_support/mod.rs"]
mod store_support;

use std::sync::Arc;
use std::time::Duration;

use isoswitch::store::{SafFilter, SafState, Store, StoreConfig, StoreError};
use store_support::pg::PgServer;
use store_support::{LEASE, T0, TEST_LIMIT, TempDir, config, entry};

async fn open(url: &str) -> Store {
    Store::open(
        &config(Some(url.to_string())),
        std::path::Path::new("/nonexistent"),
    )
    .await
    .unwrap_or_else(|e| panic!("open postgres store: {e}"))
}

/// A fresh database on the shared server, and the server (kept alive).
async fn fresh(name: &str) -> (Arc<PgServer>, String) {
    let server = tokio::task::spawn_blocking(PgServer::shared)
        .await
        .expect("start PostgreSQL");
    let url = server.fresh_db(name).await;
    (server, url)
}

async fn limited<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_LIMIT, f)
        .await
        .expect("test timed out")
}

async fn admin(url: &str) -> tokio_postgres::Client {
    store_support::pg::connect(url).await
}

#[tokio::test]
async fn every_saf_operation() {
    limited(async {
        let (_server, url) = fresh("api").await;
        let store = open(&url).await;
        store_support::api_suite(&store).await;
        // Completed entries keep no payload; the retryable ones do.
        let kept: Vec<(String, bool)> = admin(&url)
            .await
            .query(
                "SELECT state, payload IS NOT NULL FROM saf ORDER BY id",
                &[],
            )
            .await
            .expect("read payloads")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(
            kept,
            [
                ("pending".into(), true),
                ("dropped".into(), false),
                ("delivered".into(), false)
            ]
        );
    })
    .await;
}

#[tokio::test]
async fn concurrent_puts_share_commits() {
    limited(async {
        let (_server, url) = fresh("group").await;
        let store = open(&url).await;
        let before = store.commits();
        // While the table is locked the writer is stuck in its first batch,
        // so everything submitted meanwhile waits for the next one.
        let mut locker = admin(&url).await;
        let lock = locker.transaction().await.expect("begin");
        lock.batch_execute("LOCK TABLE saf IN EXCLUSIVE MODE")
            .await
            .expect("lock");
        let acks: Vec<_> = (0..64)
            .map(|seq| store.saf_submit(entry("cups", seq, T0)).expect("queued"))
            .collect();
        lock.commit().await.expect("unlock");
        for ack in acks {
            ack.await.expect("acked");
        }
        let commits = store.commits() - before;
        assert!(commits <= 2, "64 puts took {commits} commits");
        assert_eq!(store.saf_stats(T0).await.expect("stats").pending, 64);
    })
    .await;
}

#[tokio::test]
async fn a_poisoned_request_fails_alone() {
    limited(async {
        let (_server, url) = fresh("poison").await;
        let store = open(&url).await;
        let mut locker = admin(&url).await;
        locker
            .batch_execute("ALTER TABLE saf ADD CONSTRAINT not_poison CHECK (service <> 'poison')")
            .await
            .expect("plant the constraint");
        let lock = locker.transaction().await.expect("begin");
        lock.batch_execute("LOCK TABLE saf IN EXCLUSIVE MODE")
            .await
            .expect("lock");
        store_support::a_poisoned_request_fails_alone(&store, async move {
            lock.commit().await.expect("unlock")
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn two_instances_never_claim_the_same_entry() {
    limited(async {
        let (_server, url) = fresh("two").await;
        let (a, b) = (open(&url).await, open(&url).await);
        store_support::two_instances_never_share(&a, &b, 500).await;
    })
    .await;
}

#[tokio::test]
async fn an_expired_lease_passes_to_the_other_instance() {
    limited(async {
        let (_server, url) = fresh("lease").await;
        let (a, b) = (open(&url).await, open(&url).await);
        store_support::an_expired_lease_passes_on(&a, &b).await;
    })
    .await;
}

#[tokio::test]
async fn pruning_deletes_only_completed_history() {
    limited(async {
        let (_server, url) = fresh("prune").await;
        let store = open(&url).await;
        store_support::pruning_deletes_only_completed_history(&store).await;
    })
    .await;
}

#[tokio::test]
async fn a_restarted_instance_releases_its_own_leases() {
    limited(async {
        let (_server, url) = fresh("release").await;
        let (a, b) = (open(&url).await, open(&url).await);
        store_support::a_restart_releases_its_own_leases(&a, &b).await;
    })
    .await;
}

#[tokio::test]
async fn entries_put_through_one_instance_are_delivered_by_the_other() {
    limited(async {
        let (_server, url) = fresh("handover").await;
        let a = open(&url).await;
        let ids = [
            a.saf_put(entry("cups", 1, T0)).await.expect("put"),
            a.saf_put(entry("cups", 2, T0)).await.expect("put"),
        ];
        a.close().await.expect("A goes away");
        let b = open(&url).await;
        let claimed = b.saf_claim("B", T0, 10, LEASE).await.expect("claim");
        assert_eq!(claimed.iter().map(|c| c.id).collect::<Vec<_>>(), ids);
        assert_eq!(claimed[1].payload, b"payload cups 2");
        for c in &claimed {
            b.saf_delivered(c.id, "B", T0 + 1, "0430 rc=00")
                .await
                .expect("delivered");
        }
        let stats = b.saf_stats(T0 + 1).await.expect("stats");
        assert_eq!((stats.pending, stats.delivered), (0, 2));
    })
    .await;
}

#[tokio::test]
async fn instances_starting_together_migrate_once() {
    limited(async {
        let (_server, url) = fresh("migrate").await;
        let (a, b) = tokio::join!(open(&url), open(&url));
        a.saf_put(entry("cups", 1, T0)).await.expect("put via A");
        let listed = b
            .saf_list(SafFilter {
                state: Some(SafState::Pending),
                service: None,
                limit: 10,
            })
            .await
            .expect("list via B");
        assert_eq!(listed.len(), 1);
        assert_eq!(
            b.meta_get("schema_version").await.expect("meta").as_deref(),
            Some(isoswitch::store::SCHEMA_VERSION.to_string().as_str())
        );
    })
    .await;
}

/// Retries `put` until the store answers again (it reconnects in the
/// background); bounded by the test's limit.
async fn put_until_back(store: &Store, seq: u32) -> isoswitch::store::SafId {
    loop {
        match store.saf_put(entry("cups", seq, T0)).await {
            Ok(id) => return id,
            Err(StoreError::Unavailable { .. }) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("while reconnecting: {e}"),
        }
    }
}

#[tokio::test]
async fn a_lost_connection_fails_fast_and_comes_back() {
    limited(async {
        let (_server, url) = fresh("lost").await;
        let store = open(&url).await;
        store.saf_put(entry("cups", 1, T0)).await.expect("put");
        // Only this test's database: other tests share the server.
        let admin = admin(&url).await;
        let theirs = "FROM pg_stat_activity WHERE application_name = 'isoswitch' \
                      AND datname = current_database() AND pid <> pg_backend_pid()";
        loop {
            // Again each round: the store's maintenance (day partitions)
            // may connect again meanwhile.
            admin
                .batch_execute(&format!("SELECT pg_terminate_backend(pid) {theirs}"))
                .await
                .expect("terminate the store's connections");
            let row = admin
                .query_one(&format!("SELECT count(*) {theirs}"), &[])
                .await
                .expect("count");
            if row.get::<_, i64>(0) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let during = store.saf_put(entry("cups", 2, T0)).await;
        assert!(
            matches!(during, Err(StoreError::Unavailable { .. })),
            "{during:?}"
        );
        put_until_back(&store, 3).await;
        assert_eq!(store.saf_stats(T0).await.expect("stats").pending, 2);
    })
    .await;
}

#[tokio::test]
async fn an_outage_fails_requests_at_once_until_the_server_is_back() {
    let server = Arc::new(
        tokio::task::spawn_blocking(|| PgServer::start_own("outage"))
            .await
            .expect("start"),
    );
    limited(async {
        let url = server.fresh_db("outage").await;
        let store = open(&url).await;
        let kept = store.saf_put(entry("cups", 1, T0)).await.expect("put");
        let halting = Arc::clone(&server);
        tokio::task::spawn_blocking(move || halting.halt())
            .await
            .expect("halt");
        // Down: every request is refused, none waits for the server.
        for seq in 0..3 {
            let during = tokio::time::timeout(
                Duration::from_secs(10),
                store.saf_put(entry("cups", seq, T0)),
            )
            .await
            .expect("a request during the outage hung");
            assert!(
                matches!(during, Err(StoreError::Unavailable { .. })),
                "{during:?}"
            );
        }
        let stats = store.saf_stats(T0).await;
        assert!(
            matches!(stats, Err(StoreError::Unavailable { .. })),
            "{stats:?}"
        );
        let resuming = Arc::clone(&server);
        tokio::task::spawn_blocking(move || resuming.resume())
            .await
            .expect("resume");
        let after = put_until_back(&store, 9).await;
        let claimed = store.saf_claim("A", T0, 10, LEASE).await.expect("claim");
        assert_eq!(
            claimed.iter().map(|c| c.id).collect::<Vec<_>>(),
            [kept, after]
        );
    })
    .await;
}

#[tokio::test]
async fn no_error_shows_the_password() {
    limited(async {
        let (server, url) = fresh("password").await;
        let password = server.password();
        assert!(!password.is_empty());
        let wrong = url.replacen(&format!(":{password}@"), ":Wr0ngPassw0rd@", 1);
        let err = Store::open(&config(Some(wrong)), std::path::Path::new("/d"))
            .await
            .err()
            .expect("a wrong password is refused");
        let shown = format!("{err} / {err:?}");
        assert!(!shown.contains("Wr0ngPassw0rd"), "{shown}");
        assert!(shown.contains("isoswitch:***@"), "{shown}");
        let store = open(&url).await;
        let shown = format!("{:?}", store.location());
        assert!(!shown.contains(&password), "{shown}");
    })
    .await;
}

#[tokio::test]
async fn journal_rows_queries_report_and_purges() {
    limited(async {
        let (_server, url) = fresh("journal").await;
        let store = open(&url).await;
        store_support::journal::journal_suite(&store).await;
        store.close().await.expect("close");
    })
    .await;
}

/// `saf_rekey` on PostgreSQL: a payload written in clear before sealing is
/// sealed; those already under the first key are left.
#[tokio::test]
async fn rekey_seals_what_is_in_clear() {
    limited(async {
        let (_server, url) = fresh("rekey").await;
        let store = open(&url).await;
        for seq in 1..=2 {
            store.saf_put(entry("cups", seq, T0)).await.expect("put");
        }
        admin(&url)
            .await
            .execute("UPDATE saf SET payload = convert_to('payload cups 1', 'UTF8') WHERE id = 1", &[])
            .await
            .expect("a payload in clear");
        let done = store.saf_rekey().await.expect("rekey");
        assert_eq!((done.resealed, done.current, done.unopenable), (1, 1, 0));
        let sealed: i64 = admin(&url)
            .await
            .query_one(
                "SELECT count(*) FROM saf WHERE substring(payload from 1 for 4) = '\\x49535701'::bytea",
                &[],
            )
            .await
            .expect("count")
            .get(0);
        assert_eq!(sealed, 2);
        let claimed = store.saf_claim("a", T0, 10, LEASE).await.expect("claim");
        assert_eq!(claimed[0].payload, b"payload cups 1");
        store.close().await.expect("close");
    })
    .await;
}

const DAY_MS: i64 = 86_400_000;

#[tokio::test]
async fn the_store_connects_over_verified_tls() {
    limited(async {
        let (_server, url) = fresh("tls").await;
        let store = open(&url).await;
        let shown = format!("{:?}", store.location());
        assert!(shown.contains("over TLS, verify-full"), "{shown}");
        store_support::api_suite(&store).await;
        // The server's view: every connection of the store's (the
        // application_name it sets) is TLS 1.2 or 1.3.
        let rows = admin(&url)
            .await
            .query(
                "SELECT s.ssl, coalesce(s.version, '') FROM pg_stat_activity a \
                 JOIN pg_stat_ssl s ON s.pid = a.pid \
                 WHERE a.application_name = 'isoswitch' AND a.datname = current_database()",
                &[],
            )
            .await
            .expect("pg_stat_ssl");
        assert!(
            !rows.is_empty(),
            "the store's connection is not in pg_stat_activity"
        );
        for row in rows {
            let (ssl, version): (bool, String) = (row.get(0), row.get(1));
            assert!(ssl && version.starts_with("TLSv1."), "{ssl} {version}");
        }
    })
    .await;
}

#[tokio::test]
async fn a_server_with_another_ca_or_name_is_refused() {
    limited(async {
        let (server, url) = fresh("tls_refused").await;
        // A CA that did not sign the server's certificate.
        let dir = std::env::temp_dir().join(format!("isoswitch-pg-otherca-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let other = dir.join("other-ca.crt");
        let ca = rcgen::generate_simple_self_signed(vec!["other-ca".to_string()]).expect("a CA");
        std::fs::write(&other, ca.cert.pem()).expect("write the other CA");
        let mut cfg = config(Some(url.clone()));
        cfg.ca_file = Some(other);
        let err = Store::open(&cfg, std::path::Path::new("/d"))
            .await
            .err()
            .expect("an unknown CA is refused");
        assert!(matches!(err, StoreError::Unavailable { .. }), "{err}");
        assert!(err.to_string().contains("UnknownIssuer"), "{err}");
        // The right CA, a name the certificate does not carry.
        // (hostaddr: the address; the host is the name TLS verifies.)
        let renamed =
            url.replacen("@127.0.0.1:", "@db.elsewhere.example:", 1) + "?hostaddr=127.0.0.1";
        let mut cfg = config(Some(url.clone()));
        cfg.url = Some(renamed);
        cfg.ca_file = Some(server.ca_file().to_path_buf());
        let err = Store::open(&cfg, std::path::Path::new("/d"))
            .await
            .err()
            .expect("a name the certificate lacks is refused");
        assert!(matches!(err, StoreError::Unavailable { .. }), "{err}");
        assert!(err.to_string().contains("not valid for name"), "{err}");
        // In clear: the server turns the switch away.
        let mut cfg = config(Some(format!("{url}?sslmode=disable")));
        cfg.ca_file = None;
        let err = Store::open(&cfg, std::path::Path::new("/d"))
            .await
            .err()
            .expect("a login in clear is refused");
        assert!(err.to_string().contains("no encryption"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

/// The URL of a primary and its standby (`host=a,b`): the store opens on
/// the one that takes writes, whichever is listed first, and when the
/// primary dies and the standby is promoted it reconnects to the new
/// primary by itself. Two servers of the test's own stand in for a
/// replicated pair: the "standby" refuses writes
/// (`default_transaction_read_only`, which is what `SHOW
/// transaction_read_only` reports on a hot standby) until it is
/// "promoted"; its schema is made beforehand, as replication would have.
#[tokio::test]
async fn a_store_on_a_primary_and_standby_follows_the_promotion() {
    let (primary, standby) = tokio::join!(
        tokio::task::spawn_blocking(|| PgServer::start_own("primary")),
        tokio::task::spawn_blocking(|| PgServer::start_own("standby")),
    );
    let (primary, standby) = (
        Arc::new(primary.expect("start the primary")),
        Arc::new(standby.expect("start the standby")),
    );
    limited(async {
        let on_primary = primary.fresh_db("pair").await;
        let on_standby = standby.fresh_db("pair").await;
        open(&on_standby)
            .await
            .close()
            .await
            .expect("the standby's schema");
        let standby_admin = admin(&on_standby).await;
        // One password for both, as replication would have it.
        standby_admin
            .batch_execute(&format!(
                "ALTER ROLE isoswitch PASSWORD '{}'",
                primary.password()
            ))
            .await
            .expect("the standby's password");
        let read_only = |on: bool| {
            let sql = if on {
                "ALTER SYSTEM SET default_transaction_read_only = on"
            } else {
                "ALTER SYSTEM RESET default_transaction_read_only"
            };
            let client = &standby_admin;
            async move {
                client.batch_execute(sql).await.expect(sql);
                client
                    .batch_execute("SELECT pg_reload_conf()")
                    .await
                    .expect("reload");
            }
        };
        read_only(true).await;
        let on_standby = on_standby.replace(&standby.password(), &primary.password());
        // Both CAs in one file: each server has its own.
        let dir = TempDir::new("pg-pair");
        let cas = dir.path().join("cas.crt");
        let mut pem = std::fs::read(primary.ca_file()).expect("the primary's CA");
        pem.extend(std::fs::read(standby.ca_file()).expect("the standby's CA"));
        std::fs::write(&cas, pem).expect("both CAs");
        let port = |url: &str| {
            url.rsplit_once(':')
                .and_then(|(_, p)| p.split('/').next())
                .map(str::to_string)
                .expect("a port in the test server's URL")
        };
        // The standby first: the store must skip it.
        let url = format!(
            "postgres://isoswitch:{}@127.0.0.1:{},127.0.0.1:{}/t_pair",
            primary.password(),
            port(&on_standby),
            port(&on_primary)
        );
        let cfg = StoreConfig {
            url: Some(url),
            ca_file: Some(cas),
            key_file: Some(store_support::shared_key_file()),
            ..StoreConfig::default()
        };
        let store = Store::open(&cfg, std::path::Path::new("/nonexistent"))
            .await
            .unwrap_or_else(|e| panic!("open on the primary and standby: {e}"));
        let count = |client: tokio_postgres::Client| async move {
            client
                .query_one("SELECT count(*) FROM saf", &[])
                .await
                .expect("count")
                .get::<_, i64>(0)
        };
        store.saf_put(entry("cups", 1, T0)).await.expect("put");
        assert_eq!(
            count(admin(&on_primary).await).await,
            1,
            "not on the primary"
        );
        assert_eq!(
            count(admin(&on_standby).await).await,
            0,
            "written on the standby"
        );
        // The primary dies; the standby is promoted.
        let halting = Arc::clone(&primary);
        tokio::task::spawn_blocking(move || halting.halt())
            .await
            .expect("halt the primary");
        read_only(false).await;
        put_until_back(&store, 2).await;
        assert_eq!(
            count(admin(&on_standby).await).await,
            1,
            "the store did not reconnect to the promoted standby"
        );
        store.close().await.expect("close");
    })
    .await;
}

#[tokio::test]
async fn an_answer_on_another_instance_finds_its_entry_by_its_keys() {
    limited(async {
        let (_server, url) = fresh("owed_to_peer").await;
        store_support::owed_to_peer_is_found_by_its_keys(&open(&url).await).await;
    })
    .await;
}
