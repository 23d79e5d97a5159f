//! What the integrity tests share (tests/integrity.rs, tests/integrity_pair.rs):
//! nodes that keep books, the switch with a data directory, a NAC, and the
//! SQLite store read from outside.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::procs::*;

/// One case at a time: each runs a switch, nodes and a sender at load, and a
/// 2-core machine running two would answer late for the wrong reason.
pub static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub async fn within<F: std::future::Future<Output = ()>>(limit: Duration, test: F) {
    let _alone = ONE_AT_A_TIME.lock().await;
    tokio::time::timeout(limit, test)
        .await
        .expect("integrity case within its timeout");
}

/// A `sim node` on `spec` with id `id`, reporting JSON on SIGINT.
pub async fn node(spec: &str, id: &str, addr: SocketAddr, delay: &str, extra: &[&str]) -> Proc {
    let a = addr.to_string();
    let mut args = vec![
        "sim", "node", "--listen", &a, "--spec", spec, "--id", id, "--delay", delay, "--json",
    ];
    args.extend_from_slice(extra);
    let p = Proc::spawn(&format!("node{id}-{}", addr.port()), &args);
    p.wait_logged("sim node listening on").await;
    p
}

/// Stops a node (SIGINT: it settles and prints its books) and returns them.
pub async fn books(node: Proc) -> serde_json::Value {
    node.signal("INT");
    node.report().await
}

pub fn sub(report: &serde_json::Value, book: &str, key: &str) -> u64 {
    report[book][key]
        .as_u64()
        .unwrap_or_else(|| panic!("report has no {book}.{key}: {report}"))
}

/// The switch with `toml`, its data directory `data` (the store is
/// `data/isoswitch.db`), listening on `listen`.
pub async fn switch(name: &str, toml: &str, data: &str, listen: SocketAddr) -> Proc {
    let path = write_config(name, toml);
    let p = path.to_string_lossy().into_owned();
    let s = Proc::spawn(name, &["run", "--config", &p, "--data-dir", data]);
    wait_listening(listen).await;
    s
}

/// A POS service on `listen` before `nodes`: requests time out after 500 ms
/// (declined 68 to the terminal), reversals and advices get 2 s, a failed
/// store-and-forward attempt is retried after `retry`. `extra` goes into
/// `[service.integrity]`. [`PosToml`] says the same by name, and more.
pub fn pos_toml(listen: SocketAddr, nodes: &[SocketAddr], retry: &str, extra: &str) -> String {
    PosToml::new(listen, nodes)
        .retry(retry)
        .integrity(extra)
        .build()
}

/// The config of [`pos_toml`], each setting a setter, so a case says what
/// it changes instead of replacing text in the TOML.
///
/// ```ignore
/// let toml = PosToml::new(listen, &[addr])
///     .admin(&admin_toml)
///     .purchase_timeout("10s")
///     .back("[service.back.health]\ncheck = \"none\"")
///     .build();
/// ```
#[derive(Clone, Debug)]
pub struct PosToml {
    listen: SocketAddr,
    nodes: Vec<SocketAddr>,
    /// Top-level sections before the rest (`[admin]`, `[journal]`).
    top: String,
    retry: String,
    request: String,
    purchase: String,
    integrity: String,
    /// Lines after the nodes, under `[service.back]` (its sub-tables).
    back: String,
}

impl PosToml {
    /// Retries after 300 ms, requests and purchases time out after 500 ms.
    pub fn new(listen: SocketAddr, nodes: &[SocketAddr]) -> PosToml {
        PosToml {
            listen,
            nodes: nodes.to_vec(),
            top: String::new(),
            retry: "300ms".into(),
            request: "500ms".into(),
            purchase: "500ms".into(),
            integrity: String::new(),
            back: String::new(),
        }
    }

    /// The same service for `isoswitch::link::inproc::Rig`, which listens
    /// nowhere and dials no node: `nodes` nodes (ids `01`, ...) at an
    /// address nobody connects to. Read with [`PosToml::service_config`].
    pub fn in_process(nodes: usize) -> PosToml {
        let never_dialled: Vec<SocketAddr> = (0..nodes)
            .map(|i| SocketAddr::from(([127, 0, 0, 1], 9 + i as u16)))
            .collect();
        PosToml::new(SocketAddr::from(([127, 0, 0, 1], 0)), &never_dialled)
    }

    /// The service's config, typed: what `Rig::from_config` takes, and where
    /// a case sets a key this has no setter for as a field
    /// (`cfg.integrity.duplicate_window = ...`) instead of in TOML.
    pub fn service_config(&self) -> isoswitch::config::ServiceConfig {
        let toml = self.build();
        let cfg = isoswitch::config::Config::from_toml(&toml)
            .unwrap_or_else(|e| panic!("config: {e}\n{toml}"));
        cfg.services.into_iter().next().expect("one [[service]]")
    }

    /// Top-level sections (an [`admin_toml`]'s, `[journal]`), first.
    pub fn admin(mut self, toml: &str) -> PosToml {
        self.top.push_str(toml);
        self
    }

    /// `[store.saf]` `retry` and `retry_max`.
    pub fn retry(mut self, every: &str) -> PosToml {
        self.retry = every.into();
        self
    }

    /// `[service.timeouts]` `request`: any request without its own.
    pub fn request_timeout(mut self, after: &str) -> PosToml {
        self.request = after.into();
        self
    }

    /// `[service.timeouts]` `by_mti` `"02x0"`: purchases and the like.
    pub fn purchase_timeout(mut self, after: &str) -> PosToml {
        self.purchase = after.into();
        self
    }

    /// Lines of `[service.integrity]`.
    pub fn integrity(mut self, lines: &str) -> PosToml {
        self.integrity.push_str(lines);
        self
    }

    /// Sub-tables of `[service.back]` (`[service.back.health]`), last.
    pub fn back(mut self, lines: &str) -> PosToml {
        self.back.push_str(lines);
        self.back.push('\n');
        self
    }

    pub fn build(&self) -> String {
        let PosToml {
            listen,
            nodes,
            top,
            retry,
            request,
            purchase,
            integrity,
            back,
        } = self;
        format!(
            "{top}[store.saf]\nretry = \"{retry}\"\nretry_max = \"{retry}\"\n\
             [[service]]\nname = \"pos\"\nspec = \"cup-pos\"\n\
             [service.front]\nkind = \"listen\"\nlisten = \"{listen}\"\n\
             [service.back]\nconnections_per_node = 2\nreconnect_min = \"50ms\"\nreconnect_max = \"200ms\"\n\
             [service.timeouts]\nrequest = \"{request}\"\nby_mti = {{ \"04x0\" = \"2s\", \"02x0\" = \"{purchase}\", \"0220\" = \"2s\" }}\n\
             [service.integrity]\nlate_approval = \"reverse\"\n{integrity}\n{}{back}",
            nodes_toml(nodes)
        )
    }
}

/// One row of the store's SAF table, as the test reads it.
#[derive(Debug)]
pub struct SafRow {
    pub kind: String,
    pub state: String,
    pub mti: String,
    pub attempts: i64,
    pub node_id: Option<String>,
    pub direction: String,
    pub f11: Option<String>,
    pub pan_masked: Option<String>,
    /// Why it is dead or dropped, or flagged for reconciliation.
    pub reason: Option<String>,
    /// The host's answer as recorded, or the last error.
    pub answer: Option<String>,
    pub last_error: Option<String>,
    /// The original transaction it is about (`F41/F11 F7 F32 F33`).
    pub original: Option<String>,
    pub id: i64,
}

pub fn db_path(data: &str) -> PathBuf {
    Path::new(data).join("isoswitch.db")
}

/// Every SAF row of the store at `data`, read-only from outside the switch
/// (SQLite in WAL mode lets a reader beside the writer).
pub fn saf_rows(data: &str) -> Vec<SafRow> {
    let path = db_path(data);
    if !path.exists() {
        return Vec::new();
    }
    let db = rusqlite::Connection::open_with_flags(
        &path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    db.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    let query = "SELECT kind, state, mti, attempts, node_id, direction, f11, pan_masked, reason, \
         answer, last_error, original, id FROM saf ORDER BY id";
    let mut st = match db.prepare(query) {
        // The file exists from the moment the switch opens it, a moment
        // before its tables do.
        Err(e) if e.to_string().contains("no such table") => return Vec::new(),
        st => st.expect("the saf table"),
    };
    st.query_map([], |r| {
        Ok(SafRow {
            kind: r.get(0)?,
            state: r.get(1)?,
            mti: r.get(2)?,
            attempts: r.get(3)?,
            node_id: r.get(4)?,
            direction: r.get(5)?,
            f11: r.get(6)?,
            pan_masked: r.get(7)?,
            reason: r.get(8)?,
            answer: r.get(9)?,
            last_error: r.get(10)?,
            original: r.get(11)?,
            id: r.get(12)?,
        })
    })
    .expect("query saf")
    .collect::<Result<_, _>>()
    .expect("saf rows")
}

pub fn count(rows: &[SafRow], kind: &str, state: &str) -> usize {
    rows.iter()
        .filter(|r| r.kind == kind && r.state == state)
        .count()
}

/// Rows by kind and state: what "the store settled" compares (attempts
/// and retry times move on while nothing else does).
pub fn tally(rows: &[SafRow]) -> std::collections::BTreeMap<(String, String), usize> {
    let mut t = std::collections::BTreeMap::new();
    for r in rows {
        *t.entry((r.kind.clone(), r.state.clone())).or_default() += 1;
    }
    t
}

/// Polls the store until `done` holds for the rows, with the same tally in
/// two reads `settle` apart; returns them. The case's timeout bounds it.
pub async fn store_settles(
    data: &str,
    settle: Duration,
    done: impl Fn(&[SafRow]) -> bool,
) -> Vec<SafRow> {
    let mut last = None;
    loop {
        let rows = saf_rows(data);
        eprintln!("store: {:?}", tally(&rows));
        let now = Some(tally(&rows));
        if done(&rows) && last == now {
            return rows;
        }
        last = now;
        tokio::time::sleep(settle).await;
    }
}

/// Checks a node's reversal book against the switch's duty: one chain per
/// late approval, none for anything else, every F90 readable. Returns the
/// node's late approvals.
pub fn assert_reversed_exactly(id: &str, r: &serde_json::Value) -> u64 {
    let late = sub(r, "reversals", "late_approvals");
    assert_eq!(
        sub(r, "reversals", "late_never_reversed"),
        0,
        "node {id}: a late approval was never reversed: {r}"
    );
    assert_eq!(
        sub(r, "reversals", "chains"),
        late,
        "node {id}: one chain per late approval: {r}"
    );
    assert_eq!(sub(r, "reversals", "chains_late"), late, "node {id}: {r}");
    assert_eq!(
        sub(r, "reversals", "chains_not_late"),
        0,
        "node {id}: a reversal for a decline or an answer in time: {r}"
    );
    assert_eq!(
        sub(r, "reversals", "duplicate_chains"),
        0,
        "node {id}: a second 0420 for one original: {r}"
    );
    assert_eq!(
        sub(r, "reversals", "unreadable"),
        0,
        "node {id}: F90 named no original: {r}"
    );
    late
}

/// Frames `payload` (cup-pos: a 2-byte length), sends it on `s`, and reads
/// the answer's MTI and F39, or `None` when none comes within `wait`.
pub async fn ask(
    s: &mut tokio::net::TcpStream,
    payload: &[u8],
    wait: Duration,
) -> Option<(String, String)> {
    use tokio::io::AsyncWriteExt;
    s.write_all(&framed(payload)).await.expect("write");
    read_answer(s, wait).await
}

/// A cup-pos request `mti` with STAN `stan` and processing code `f3`.
pub fn pos_request(mti: &str, stan: &str, f3: &str) -> Vec<u8> {
    let spec = isoswitch::iso8583::Spec::builtin("cup-pos").expect("cup-pos");
    let sample = isoswitch::sim::sample_request(&spec, "0200").expect("a 0200");
    let mut d = spec.decode(&sample).expect("decodes");
    d.mti = mti.parse().expect("an MTI");
    d.set_text(11, stan);
    d.set_text(3, f3);
    spec.encode(&d).expect("encodes")
}

/// `payload` framed as cup-pos carries it (a 2-byte length).
pub fn framed(payload: &[u8]) -> Vec<u8> {
    let mut framed = u16::try_from(payload.len())
        .expect("short")
        .to_be_bytes()
        .to_vec();
    framed.extend_from_slice(payload);
    framed
}

/// Reads one cup-pos answer from `s`: its MTI and F39, or `None` when none
/// comes within `wait`.
pub async fn read_answer(
    s: &mut tokio::net::TcpStream,
    wait: Duration,
) -> Option<(String, String)> {
    use tokio::io::AsyncReadExt;
    let spec = isoswitch::iso8583::Spec::builtin("cup-pos").expect("cup-pos");
    let mut len = [0u8; 2];
    tokio::time::timeout(wait, s.read_exact(&mut len))
        .await
        .ok()?
        .expect("read");
    let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut answer).await.expect("an answer");
    Some(mti_f39(&spec, answer))
}

/// A message's MTI and F39 as text (F39 empty without one).
pub fn mti_f39(spec: &isoswitch::iso8583::Spec, payload: Vec<u8>) -> (String, String) {
    let msg =
        isoswitch::iso8583::Message::parse(spec, bytes::Bytes::from(payload)).expect("parses");
    let f39 = msg
        .field(39)
        .ok()
        .flatten()
        .map(|f| f.logical().map(char::from).collect());
    (msg.mti().as_str().to_string(), f39.unwrap_or_default())
}

/// `query`'s one-column rows from the store, read from outside (none
/// before the switch has made its tables).
pub fn store_column<T: rusqlite::types::FromSql>(data: &str, query: &str) -> Vec<T> {
    let db = rusqlite::Connection::open_with_flags(
        db_path(data),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .expect("open the store");
    db.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    // The store file is there a moment before the switch has made its
    // tables: no rows yet, for the caller's poll to try again.
    let mut st = match db.prepare(query) {
        Ok(st) => st,
        Err(e) if e.to_string().contains("no such table") => return Vec::new(),
        Err(e) => panic!("the saf table: {e}"),
    };
    st.query_map([], |r| r.get(0))
        .expect("query saf")
        .collect::<Result<_, _>>()
        .expect("saf rows")
}

/// The payload of a reversal still owed (a delivered one keeps none),
/// polled for until one is stored, and opened with the store's key (it is
/// sealed at rest); the case's timeout bounds it.
pub async fn an_owed_reversal(data: &str) -> Vec<u8> {
    let query = "SELECT id FROM saf WHERE kind = 'reversal' AND state = 'pending' \
                 AND payload IS NOT NULL ORDER BY id LIMIT 1";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let id = loop {
        if db_path(data).exists()
            && let Some(id) = store_column::<i64>(data, query).pop()
        {
            break id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reversal owed with its payload in {data} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let row = |column: &str| -> Vec<rusqlite::types::Value> {
        store_column(data, &format!("SELECT {column} FROM saf WHERE id = {id}"))
    };
    let text = |column: &str| match row(column).pop() {
        Some(rusqlite::types::Value::Text(t)) => t,
        other => panic!("{column}: {other:?}"),
    };
    let created_at = match row("created_at").pop() {
        Some(rusqlite::types::Value::Integer(n)) => n,
        other => panic!("created_at: {other:?}"),
    };
    let sealed = match row("payload").pop() {
        Some(rusqlite::types::Value::Blob(b)) => b,
        other => panic!("payload: {other:?}"),
    };
    let (service, mti) = (text("service"), text("mti"));
    let keys = isoswitch::store::seal::Keyring::load(&std::path::Path::new(data).join("store.key"))
        .expect("the store's key file");
    let row = isoswitch::store::seal::RowBinding {
        service: &service,
        kind: isoswitch::store::SafKind::Reversal,
        mti: &mti,
        created_at,
    };
    assert!(
        matches!(
            isoswitch::store::seal::sealing(&sealed),
            isoswitch::store::seal::Sealing::Key(_)
        ),
        "sealed at rest"
    );
    keys.open(row, &sealed).expect("opens with the store's key")
}

/// `isoswitch decode --json --spec SPEC` of one stored payload, framed as
/// the link carries it: a 2-byte binary length, then `header` (VISA's
/// `visa4` prefix has two more bytes; Mastercard's none).
pub async fn decode_stored(spec: &str, header: &[u8], payload: &[u8]) -> serde_json::Value {
    let len = u16::try_from(payload.len()).expect("a 2-byte framed message");
    let mut framed = len.to_be_bytes().to_vec();
    framed.extend_from_slice(header);
    framed.extend_from_slice(payload);
    let hex: String = framed.iter().map(|b| format!("{b:02X}")).collect();
    let decode = Proc::spawn(
        &format!("decode-{spec}-reversal"),
        &["decode", "--json", "--spec", spec, "--hex", &hex],
    );
    let (status, out) = decode.finish().await;
    assert!(status.success(), "decode: {status}: {out}");
    serde_json::from_str(out.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("decode --json: {e}: {out}"))
}

/// Field `id`'s text in `decode --json`'s output.
pub fn decoded_field(msg: &serde_json::Value, id: u16) -> String {
    msg["fields"][id.to_string()]
        .as_str()
        .unwrap_or_else(|| panic!("no F{id} text in {msg}"))
        .to_string()
}
