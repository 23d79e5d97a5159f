//! A real PostgreSQL server for the tests: `scripts/pg-test.sh` starts a
//! throwaway cluster on a free 127.0.0.1 port, shared by the tests of this
//! binary that run at the same time and stopped when the last lets go. With
//! ISOSWITCH_TEST_PG_URL set (`scripts/pg-test.sh run -- cargo test ...`)
//! that server is used instead. Each test gets a database of its own.
//!
//! No server, no pass: a missing or failing PostgreSQL fails the test with
//! what went wrong.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio_postgres::NoTls;

pub struct PgServer {
    /// The cluster's directory, when this process started it.
    dir: Option<PathBuf>,
    /// The URL of the `postgres` database, password included.
    url: String,
}

static SHARED: Mutex<Weak<PgServer>> = Mutex::new(Weak::new());

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
            Ok(url) => PgServer { dir: None, url },
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
        PgServer {
            dir: Some(dir),
            url,
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
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL test server refused a connection: {e}"));
        tokio::spawn(connection);
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
