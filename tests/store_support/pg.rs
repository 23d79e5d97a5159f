//! A real PostgreSQL server for the tests: `scripts/pg-test.sh` starts a
//! throwaway cluster on a free 127.0.0.1 port, shared by the tests of this
//! binary that run at the same time and stopped when the last lets go. With
//! ISOSWITCH_TEST_PG_URL set (`scripts/pg-test.sh run -- cargo test ...`)
//! that server is used instead (with ISOSWITCH_TEST_PG_CA, its CA). Each
//! test gets a database of its own.
//!
//! The servers take TCP logins over TLS only (pg_hba `hostssl`), so every
//! store here, and every admin connection of the tests, runs over TLS with
//! the switch's own connector (`isoswitch::store::pg_tls`, verify-full
//! against the server's throwaway CA).
//!
//! No server, no pass: a missing or failing PostgreSQL fails the test with
//! what went wrong.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use isoswitch::store::pg_tls::PgTls;

pub struct PgServer {
    /// The cluster's directory, when this process started it.
    dir: Option<PathBuf>,
    /// The URL of the `postgres` database, password included.
    url: String,
    /// The CA the server's certificate leads to (store.ca_file).
    ca: PathBuf,
}

static SHARED: Mutex<Weak<PgServer>> = Mutex::new(Weak::new());

/// Each server's `host:port` and its CA, for [`ca_of`].
static CAS: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());

/// `host:port` of a postgres:// URL.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let rest = rest.rsplit_once('@').map(|(_, r)| r).unwrap_or(rest);
    rest.split(['/', '?'])
        .next()
        .unwrap_or_default()
        .to_string()
}

fn remember(url: &str, ca: &Path) {
    let mut cas = CAS.lock().unwrap_or_else(|p| p.into_inner());
    cas.retain(|(hp, _)| *hp != host_port(url));
    cas.push((host_port(url), ca.to_path_buf()));
}

/// The CA of the test server `url` points at (any database of it).
pub fn ca_of(url: &str) -> PathBuf {
    let cas = CAS.lock().unwrap_or_else(|p| p.into_inner());
    cas.iter()
        .find(|(hp, _)| *hp == host_port(url))
        .map(|(_, ca)| ca.clone())
        .unwrap_or_else(|| panic!("no test PostgreSQL server is known at {}", host_port(url)))
}

/// A client connection to a test server, over TLS (verify-full).
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let tls = PgTls::from_ca_file(&ca_of(url)).unwrap_or_else(|e| panic!("test server CA: {e}"));
    let (client, connection) = tokio_postgres::connect(url, tls)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL test server refused a TLS connection: {e}"));
    tokio::spawn(connection);
    client
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/pg-test.sh")
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

impl PgServer {
    /// The server the tests share (started if none is running).
    pub fn shared() -> Arc<PgServer> {
        let mut slot = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(server) = slot.upgrade() {
            return server;
        }
        let server = Arc::new(match std::env::var("ISOSWITCH_TEST_PG_URL") {
            Ok(url) => {
                let ca = std::env::var_os("ISOSWITCH_TEST_PG_CA")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| {
                        panic!("ISOSWITCH_TEST_PG_URL needs ISOSWITCH_TEST_PG_CA: the server's CA (the tests connect over TLS only)")
                    });
                remember(&url, &ca);
                PgServer { dir: None, url, ca }
            }
            Err(_) => PgServer::start_own("shared"),
        });
        *slot = Arc::downgrade(&server);
        server
    }

    /// A server of this test's own (one it may stop and start again).
    pub fn start_own(name: &str) -> PgServer {
        // A new name each time: a shared server being stopped may still own
        // the last one while the next test starts another.
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("isoswitch-pg-{}-{name}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let port = free_port();
        let url = run_script(&["start", &dir.to_string_lossy(), &port.to_string()]);
        let ca = dir.join("tls/ca.crt");
        remember(&url, &ca);
        PgServer {
            dir: Some(dir),
            url,
            ca,
        }
    }

    /// Stops the server, keeping its data (an outage).
    pub fn halt(&self) {
        let dir = self
            .dir
            .as_ref()
            .expect("halt needs a server of the test's own");
        run_script(&["halt", &dir.to_string_lossy()]);
    }

    /// Starts a halted server again on its port.
    pub fn resume(&self) {
        let dir = self
            .dir
            .as_ref()
            .expect("resume needs a server of the test's own");
        let port = self
            .url
            .rsplit(':')
            .next()
            .and_then(|p| p.split('/').next())
            .unwrap_or_default();
        run_script(&["start", &dir.to_string_lossy(), port]);
    }

    /// A new, empty database; its URL.
    pub async fn fresh_db(&self, name: &str) -> String {
        let client = connect(&self.url).await;
        let db = format!("t_{}", name.replace('-', "_"));
        // Two statements: CREATE DATABASE refuses to run in a transaction.
        for sql in [
            format!("DROP DATABASE IF EXISTS {db}"),
            format!("CREATE DATABASE {db}"),
        ] {
            client
                .batch_execute(&sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        }
        self.url_of(&db)
    }

    /// The CA file to name as store.ca_file.
    pub fn ca_file(&self) -> &Path {
        &self.ca
    }

    pub fn url_of(&self, db: &str) -> String {
        match self.url.rsplit_once('/') {
            Some((base, _)) => format!("{base}/{db}"),
            None => panic!("test server URL without a database"),
        }
    }

    /// The password in the URL (to check nothing shows it).
    pub fn password(&self) -> String {
        let rest = self
            .url
            .split_once("://")
            .map(|(_, r)| r)
            .unwrap_or_default();
        let userinfo = rest.rsplit_once('@').map(|(u, _)| u).unwrap_or_default();
        userinfo
            .split_once(':')
            .map(|(_, p)| p.to_string())
            .unwrap_or_default()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = Command::new(script())
                .args(["stop", &dir.to_string_lossy()])
                .status();
        }
    }
}

/// Runs scripts/pg-test.sh; its stdout on success, a failing test otherwise.
fn run_script(args: &[&str]) -> String {
    let out = Command::new(script())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
    if !out.status.success() {
        panic!(
            "PostgreSQL for the store tests: `scripts/pg-test.sh {}` failed ({}):\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
