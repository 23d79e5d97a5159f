//! The journal's store operations, the same on both backends: rows found
//! by RRN, STAN, outcome and time, a late one with its reversal's state,
//! admin rows, the report, and bounded purges.

use isoswitch::store::journal::{AdminRow, JournalFilter, JournalRow, NewRow, OutcomeFilter};
use isoswitch::store::{Direction, NewSafEntry, SafKeys, SafKind, Store, now_millis};

fn row(t_in: i64, f11: &str, f37: Option<&str>) -> JournalRow {
    JournalRow {
        t_in,
        t_out: t_in + 3,
        service: "pos".into(),
        front: "listen".into(),
        link: "client#1".into(),
        node: Some("01".into()),
        origin: "front".into(),
        mti: "0200".into(),
        f11: Some(f11.into()),
        f37_in: f37.map(str::to_string),
        f41: Some("TERM0001".into()),
        pan: Some("622202*********0123".into()),
        answered_by: "node".into(),
        outcome: "answered".into(),
        latency_us: Some(3_000),
        ..JournalRow::default()
    }
}

/// Rows, queries, the report and the admin log, on both backends.
pub async fn journal_suite(store: &Store) -> i64 {
    let now = now_millis();
    let reversal = store
        .saf_put(NewSafEntry {
            service: "pos".into(),
            direction: Direction::ToNode("01".into()),
            kind: SafKind::Reversal,
            mti: "0420".into(),
            payload: b"x".to_vec(),
            keys: SafKeys::default(),
            created_at: now,
            expires_at: now + 60_000,
            first_attempt_at: now,
        })
        .await
        .expect("reversal stored");
    let mut late = row(now, "000002", Some("222222222222"));
    late.late = true;
    late.outcome = "late".into();
    late.reversal_id = Some(reversal.0);
    let mut made = row(now - 1_000, "000002", Some("222222222222"));
    made.answered_by = "switch".into();
    made.reason = Some("timeout".into());
    made.outcome = "switch-made".into();
    let rows = [row(now - 2_000, "000001", Some("111111111111")), made, late];
    let admin = vec![AdminRow {
        at: now,
        peer: "127.0.0.1:5".into(),
        action: "drain".into(),
        method: "POST".into(),
        path: "/api/v1/services/pos/nodes/01/drain".into(),
        status: 200,
        outcome: "node 01 draining".into(),
        ..AdminRow::default()
    }];
    let rows = rows.iter().map(NewRow::from).collect();
    assert_eq!(store.journal_put(rows, admin).await.expect("put"), 4);
    let q = |f: JournalFilter| store.journal_query(JournalFilter { limit: 100, ..f });
    let by_rrn = q(JournalFilter {
        rrn: Some("222222222222".into()),
        ..JournalFilter::default()
    })
    .await
    .expect("query");
    assert_eq!(by_rrn.len(), 2);
    assert!(by_rrn[0].t_in < by_rrn[1].t_in, "oldest first");
    let late = q(JournalFilter {
        outcome: Some(OutcomeFilter::Late),
        ..JournalFilter::default()
    })
    .await
    .expect("query");
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].reversal_state.as_deref(), Some("pending"));
    let made = q(JournalFilter {
        outcome: Some(OutcomeFilter::SwitchMade),
        since: Some(now - 1_500),
        ..JournalFilter::default()
    })
    .await
    .expect("query");
    assert_eq!(made.len(), 1);
    assert_eq!(made[0].reason.as_deref(), Some("timeout"));
    let report = store
        .journal_report(now - 10_000, now + 1)
        .await
        .expect("report");
    assert_eq!(report.groups.len(), 1);
    assert_eq!(report.groups[0].exchanges, 3);
    assert_eq!(report.groups[0].late.reversals["pending"], 1);
    let admin = store.admin_query(None, 10).await.expect("admin");
    assert_eq!(admin[0].action, "drain");
    now
}

/// SQLite's retention: what is older goes, in bounded batches of rows
/// (PostgreSQL drops whole days instead: tests/store_postgres/).
pub async fn journal_purges_rows(store: &Store) {
    let now = journal_suite(store).await;
    let q = |f: JournalFilter| store.journal_query(JournalFilter { limit: 100, ..f });
    assert_eq!(store.journal_purge(now - 500, 1).await.expect("purge"), 1);
    assert_eq!(store.journal_purge(now - 500, 1).await.expect("purge"), 1);
    assert_eq!(store.journal_purge(now - 500, 1).await.expect("purge"), 0);
    let left = q(JournalFilter::default()).await.expect("query");
    assert_eq!(left.len(), 1);
}
