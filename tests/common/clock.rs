//! What the tests on the rig's clock share (tests/deadlines.rs,
//! tests/ejection.rs): a cup-pos service in process
//! (`isoswitch::link::inproc::Rig`, no socket, no task), its requests and a
//! node's answers as bytes, and the store a reversal is owed in.
//!
//! The rig's clock is the only clock the service reads: a case moves it
//! with `Rig::advance` and runs the sweeper with `Rig::expire`, so a
//! deadline, a window or an ejection is stepped past to the millisecond and
//! no case sleeps. Read with `#[path]` beside `owed.rs` and `procs.rs`
//! (`PosToml`, `pos_request`, `framed`, `data_dir`).

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use isoswitch::config::ServiceConfig;
use isoswitch::link::inproc::Rig;
use isoswitch::link::service::SafOutbox;
use isoswitch::store::{ClaimedSaf, SafFilter, SafRow, Store, StoreConfig, now_millis};

use super::owed::{PosToml, framed, pos_request};
use super::procs::data_dir;

/// Every case's bound: a case does no I/O but the store's, so a hang is a
/// bug, not a slow machine.
pub async fn bounded<F: std::future::Future<Output = ()>>(case: F) {
    tokio::time::timeout(Duration::from_secs(30), case)
        .await
        .expect("case within 30 s");
}

/// A cup-pos service before `nodes` nodes, as `PosToml` writes it (requests
/// and purchases time out after 500 ms, declined 68; late approvals
/// reversed), its config typed for the case to change.
pub fn pos_config(nodes: usize) -> ServiceConfig {
    PosToml::in_process(nodes).service_config()
}

pub fn rig(cfg: ServiceConfig) -> Rig {
    Rig::from_config(cfg).expect("a rig of the config")
}

/// A cup-pos purchase (0200) with STAN `stan`, framed.
pub fn purchase(stan: u32) -> Vec<u8> {
    framed(&pos_request("0200", &format!("{stan:06}"), "000000"))
}

/// A cup-pos request `mti` with STAN `stan`, framed.
pub fn request(mti: &str, stan: u32) -> Vec<u8> {
    framed(&pos_request(mti, &format!("{stan:06}"), "000000"))
}

/// Sends `frame` from the client: the node it went to and the bytes it got,
/// or `None` when the switch answered it itself (then [`said`] reads it).
pub fn send(rig: &mut Rig, frame: &[u8]) -> Option<(usize, Vec<u8>)> {
    rig.request(frame)
        .expect("the rig takes the frame")
        .map(|(node, bytes)| (node, bytes.to_vec()))
}

/// Sends `frame` and expects it at a node: which one, and its bytes.
pub fn to_node(rig: &mut Rig, frame: &[u8]) -> (usize, Vec<u8>) {
    send(rig, frame).expect("the request went to a node")
}

/// The node's answer to what it got (`node_bytes`, framed): the response
/// response MTI, F39 `f39`, every other field echoed.
pub fn answer(rig: &Rig, node_bytes: &[u8], f39: &str) -> Vec<u8> {
    let spec = rig.service.spec();
    let mut d = spec
        .decode(&node_bytes[2..])
        .expect("the node's bytes decode");
    // The function digit up one (0200 → 0210, 0420 → 0430), and a repeat's
    // answer is the original's (0421 → 0430).
    let mut mti = d.mti.as_str().as_bytes().to_vec();
    mti[2] += 1;
    mti[3] = b'0';
    d.mti = std::str::from_utf8(&mti).unwrap().parse().expect("an MTI");
    d.set_text(39, f39);
    framed(&spec.encode(&d).expect("the answer encodes"))
}

/// The next answer queued for the client: its MTI and F39; `None` when
/// there is none.
pub fn said(rig: &mut Rig) -> Option<(String, String)> {
    let spec = Arc::clone(rig.service.spec());
    let bytes = rig.client_bytes().expect("encodes")?;
    Some(framed_mti_f39(&spec, bytes))
}

/// The node's `frame` relayed to the client: the MTI and F39 it got.
pub fn relay(rig: &mut Rig, node: usize, frame: &[u8]) -> (String, String) {
    let spec = Arc::clone(rig.service.spec());
    let bytes = rig.response(node, frame).expect("relayed to the client");
    framed_mti_f39(&spec, bytes)
}

/// A framed cup-pos message's MTI and F39 (empty without one).
fn framed_mti_f39(spec: &isoswitch::iso8583::Spec, framed: &[u8]) -> (String, String) {
    super::owed::mti_f39(spec, framed[2..].to_vec())
}

/// The answer to the client, or a panic naming `what` was expected.
pub fn answered(rig: &mut Rig, what: &str) -> (String, String) {
    said(rig).unwrap_or_else(|| panic!("no answer to the client: expected {what}"))
}

/// The node the bytes went to, by id (`"01"`, ...).
pub fn node_id(rig: &Rig, node: usize) -> String {
    rig.service.view().pool.nodes()[node].id.to_string()
}

/// A SQLite store of the case's own, given to the rig's service as its
/// outbox (what `run` does with a data directory): what the service owes
/// is stored there. No delivery loop runs: the rows stay as stored. The
/// outbox's wake is returned: the service notifies it once a reversal is
/// committed, which is the event a case waits on.
pub async fn owe_into_store(rig: &Rig, name: &str) -> (Store, Arc<tokio::sync::Notify>) {
    let dir = data_dir(name);
    std::fs::create_dir_all(&dir).expect("the data dir");
    let cfg = StoreConfig::default();
    let store = Store::open(&cfg, std::path::Path::new(&dir))
        .await
        .expect("the store opens");
    let wake = Arc::new(tokio::sync::Notify::new());
    let outbox = SafOutbox {
        store: store.clone(),
        owner: "rig".into(),
        policy: cfg.saf.clone(),
        wake: Arc::clone(&wake),
    };
    assert!(rig.service.view().made.set_saf(outbox), "one outbox");
    (store, wake)
}

/// Every row the store holds.
pub async fn owed_rows(store: &Store) -> Vec<SafRow> {
    let filter = SafFilter {
        state: None,
        service: None,
        limit: 100,
    };
    store.saf_list(filter).await.expect("the store lists")
}

pub fn late_responses(rig: &Rig) -> u64 {
    let c = &rig.service.view().counters.late_responses;
    c.load(std::sync::atomic::Ordering::Relaxed)
}

/// The one entry due in `store` `later` past the wall clock (the store's
/// times are its own clock: a case steps it past `saf.retry` and the lease
/// by asking as of later), claimed by the rig's outbox as the delivery loop
/// claims it.
pub async fn claim_due(store: &Store, later: Duration) -> ClaimedSaf {
    let at = now_millis() + i64::try_from(later.as_millis()).expect("short");
    let lease = StoreConfig::default().saf.lease;
    let mut due = store.saf_claim("rig", at, 10, lease).await.expect("claims");
    assert_eq!(due.len(), 1, "one entry due: {due:?}");
    due.remove(0)
}

/// The store's one row once `done` holds for it: what the service's own
/// store writes (tasks of their own) have recorded. Read again after each
/// turn of the runtime; the case's bound limits it.
pub async fn row_when(store: &Store, done: impl Fn(&SafRow) -> bool) -> SafRow {
    loop {
        let mut rows = owed_rows(store).await;
        assert_eq!(rows.len(), 1, "one row: {rows:?}");
        if done(&rows[0]) {
            return rows.remove(0);
        }
        tokio::task::yield_now().await;
    }
}

/// The owed message the rig queued for a node: which node, and its bytes.
pub fn owed_at_node(rig: &mut Rig) -> (usize, Vec<u8>) {
    let (node, bytes) = rig
        .node_bytes()
        .expect("encodes")
        .expect("an owed message queued for a node");
    (node, bytes.to_vec())
}

/// A framed message's MTI.
pub fn mti_of(rig: &Rig, framed: &[u8]) -> String {
    framed_mti_f39(rig.service.spec(), framed).0
}
