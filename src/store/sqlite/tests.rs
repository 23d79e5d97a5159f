//! Unit tests of the SQLite backend: migrations, ops and refusals on an in-memory database.

use rusqlite::params;

use super::migrations::{LIST_CHECKS, MIGRATIONS, list_check_texts};
use super::*;
use crate::store::schema;

fn migrated() -> Connection {
    let mut conn = Connection::open_in_memory().expect("open");
    assert!(migrate(&mut conn).is_ok(), "migrate");
    conn
}

/// The program SQLite runs for `sql`, its parameters left unbound.
fn opcodes(conn: &Connection, sql: &str) -> Vec<String> {
    let mut st = conn.prepare(&format!("EXPLAIN {sql}")).expect("explain");
    let mut rows = st.raw_query();
    let mut ops = Vec::new();
    while let Some(r) = rows.next().expect("opcode") {
        ops.push(r.get(1).expect("opcode name"));
    }
    ops
}

/// No write that checks a listed column fills a temporary b-tree: the
/// journal's own insert, and an update of each such column.
#[test]
fn list_checks_are_evaluated_in_place_not_through_a_temporary_btree() {
    let conn = migrated();
    let mut writes = vec![crate::store::journal::insert::sqlite_insert_sql(1).to_string()];
    for (table, column, _) in LIST_CHECKS {
        writes.push(format!("UPDATE {table} SET {column} = ?1"));
    }
    for sql in writes {
        let ops = opcodes(&conn, &sql);
        assert!(!ops.is_empty(), "{sql}");
        assert!(
            !ops.iter().any(|op| op == "OpenEphemeral"),
            "{sql} builds a temporary b-tree: {ops:?}"
        );
    }
}

/// The rewritten checks accept exactly the listed values, and the file
/// holds the new text only.
#[test]
fn inlined_checks_accept_what_the_lists_accepted_and_nothing_else() {
    let conn = migrated();
    conn.execute_batch(
        "INSERT INTO saf (service, direction, kind, mti, created_at, expires_at, \
         next_attempt_at, state) VALUES ('pos', 'to_node', 'reversal', '0400', 0, 0, 0, 'pending');
         INSERT INTO journal (t_in, t_out, service, front, link, origin, mti, answered_by, \
         outcome, late, duplicate, repeat, unroutable) \
         VALUES (0, 0, 'pos', 'listen', 'client#1', 'front', '0200', 'node', 'answered', 0, 0, 0, 0);",
    )
    .expect("a row in each table");
    for &(table, column, values) in LIST_CHECKS {
        let (as_list, as_or) = list_check_texts(column, values);
        let sql: String = conn
            .query_row(
                "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?1",
                params![table],
                |r| r.get(0),
            )
            .expect("table text");
        assert!(sql.contains(&as_or) && !sql.contains(&as_list), "{sql}");
        let set = |v: &str| conn.execute(&format!("UPDATE {table} SET {column} = ?1"), [v]);
        for v in values {
            assert_eq!(set(v).expect(v), 1, "{table}.{column} = {v}");
        }
        for bad in ["bogus", "", "NODE"] {
            let e = set(bad).expect_err(bad);
            assert_eq!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::ConstraintViolation),
                "{table}.{column} = {bad:?}: {e}"
            );
        }
    }
}

/// A file already rewritten is not edited again: its schema cookie
/// stays, so other connections keep their parsed schema.
#[test]
fn the_check_rewrite_happens_once() {
    let mut conn = migrated();
    let cookie = |c: &Connection| -> i64 {
        c.query_row("PRAGMA schema_version", [], |r| r.get(0))
            .expect("schema_version")
    };
    let before = cookie(&conn);
    assert!(migrate(&mut conn).is_ok(), "migrate again");
    assert_eq!(cookie(&conn), before);
}

#[test]
fn there_is_one_migration_per_schema_version() {
    assert_eq!(MIGRATIONS.len() as i64, schema::SCHEMA_VERSION);
}

#[test]
fn a_connection_keeps_its_statement_journals_in_memory_and_syncs_fully() {
    let dir = std::env::temp_dir().join(format!("isoswitch-pragmas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store.db");
    Connection::open(&path).unwrap();
    let conn = connect(&path).unwrap();
    let pragma = |name: &str| -> i64 {
        conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(pragma("temp_store"), 2, "MEMORY");
    assert_eq!(pragma("synchronous"), 2, "FULL");
    assert_eq!(pragma("secure_delete"), 1);
    drop(conn);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The writer polls each operation once: one that waited would be a bug,
/// answered as an error rather than a writer stuck on it.
#[test]
fn an_operation_that_waits_is_an_error_not_a_hang() {
    assert!(now(std::future::pending::<rusqlite::Result<()>>()).is_err());
    assert_eq!(now(async { Ok(7) }).ok(), Some(7));
}

/// The claim, run twice a second and at every reversal stored, is
/// prepared once: a bound `LIMIT` made SQLite prepare it again at each
/// step (see `saf::claim_sql`).
#[test]
fn a_claim_is_prepared_once_not_at_every_step() {
    let conn = migrated();
    let sql = super::saf::claim_sql(64);
    let mut reprepared = 0;
    for now in 1..=3i64 {
        let mut st = conn.prepare_cached(&sql).expect("prepares");
        let rows = st
            .query_map(params!["me", now + 1_000, now], |_| Ok(()))
            .expect("runs")
            .count();
        assert_eq!(rows, 0);
        reprepared = st.get_status(rusqlite::StatementStatus::RePrepare);
    }
    assert_eq!(reprepared, 0, "the claim was prepared again");
}
