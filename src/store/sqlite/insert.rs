//! The journal's multi-row insert on SQLite, prepared once per chunk size
//! and bound without copies.
//!
//! rusqlite binds every text as `SQLITE_TRANSIENT`: SQLite copies it into
//! a buffer of its own, one `malloc` and `free` per text parameter, 22 per
//! row. A row's texts already sit in its inline buffers ([`NewRow`]), alive
//! for the whole statement, so they are bound `SQLITE_STATIC` here, through
//! the C API: about a quarter of SQLite's per-row cost on the store thread
//! (docs/journal.md, "Cost"). Every pointer bound is cleared before
//! [`RowInserts::insert`] returns, so none outlives the rows it points into.
//!
//! Rows go into the newest **part** (schema migration 5): the key indexes
//! lead with the part, so a batch's random RRNs and terminals share the few
//! index pages of one part, whatever the table's size, and the WAL writes
//! those pages, not a page per key. A part takes [`PART_ROWS`] rows (a
//! batch never splits); `journal_part` records each part's rows and the
//! range of their `t_in`, in the batch's transaction.

use std::cell::Cell;
use std::ffi::{CStr, c_int};
use std::ptr;

use rusqlite::{Connection, ffi};

use crate::store::journal::NewRow;
use crate::store::journal::insert::{INSERT_ARITY, INSERT_CHUNKS, chunks, sqlite_insert_sql};

/// Rows per journal part. Smaller parts share index pages better (a part's
/// slice of each key index is about PART_ROWS / 130 pages); larger ones
/// mean fewer seeks for a query by key, one per part in its time range
/// (docs/journal.md, "Parts").
pub(crate) const PART_ROWS: i64 = 2048;

/// Records a batch in its part's `journal_part` row.
const PART_UPSERT: &str = "INSERT INTO journal_part (part, t_min, t_max, rows) \
     VALUES (?1, ?2, ?3, ?4) ON CONFLICT (part) DO UPDATE SET \
     t_min = min(t_min, excluded.t_min), t_max = max(t_max, excluded.t_max), \
     rows = rows + excluded.rows";

/// The part rows go into, and how many it holds.
#[derive(Clone, Copy, Debug)]
struct PartCursor {
    part: i64,
    rows: i64,
}

/// The insert statements of one connection, prepared on first use;
/// finalized when dropped, before the connection they borrow can close.
pub(super) struct RowInserts<'c> {
    conn: &'c Connection,
    /// One per [`INSERT_CHUNKS`] size; null until first used.
    stmts: [Cell<*mut ffi::sqlite3_stmt>; INSERT_CHUNKS.len()],
    /// Read from `journal_part` at the first batch.
    cursor: Cell<Option<PartCursor>>,
}

impl<'c> RowInserts<'c> {
    pub fn new(conn: &'c Connection) -> Self {
        RowInserts {
            conn,
            stmts: std::array::from_fn(|_| Cell::new(ptr::null_mut())),
            cursor: Cell::new(None),
        }
    }

    /// Inserts a batch into the newest part, in the connection's open
    /// transaction, and records it in `journal_part`.
    pub fn put(&self, rows: &[NewRow]) -> rusqlite::Result<u64> {
        let (Some(t_min), Some(t_max)) = (
            rows.iter().map(|r| r.t_in).min(),
            rows.iter().map(|r| r.t_in).max(),
        ) else {
            return Ok(0);
        };
        let cursor = self.part()?;
        let mut n = 0;
        for chunk in chunks(rows) {
            n += self.insert(chunk, cursor.part)?;
        }
        let added = i64::try_from(n).unwrap_or(i64::MAX);
        self.conn
            .prepare_cached(PART_UPSERT)?
            .execute(rusqlite::params![cursor.part, t_min, t_max, added])?;
        // Ahead of the commit: a batch rolled back only starts the next
        // part a little early.
        self.cursor.set(Some(PartCursor {
            part: cursor.part,
            rows: cursor.rows.saturating_add(added),
        }));
        Ok(n)
    }

    /// The part the next batch goes into: the newest one until it is full.
    fn part(&self) -> rusqlite::Result<PartCursor> {
        let cursor = match self.cursor.get() {
            Some(c) => c,
            None => {
                use rusqlite::OptionalExtension;
                self.conn
                    .query_row(
                        "SELECT part, rows FROM journal_part ORDER BY part DESC LIMIT 1",
                        [],
                        |r| {
                            Ok(PartCursor {
                                part: r.get(0)?,
                                rows: r.get(1)?,
                            })
                        },
                    )
                    .optional()?
                    .unwrap_or(PartCursor { part: 0, rows: 0 })
            }
        };
        Ok(if cursor.rows >= PART_ROWS {
            PartCursor {
                part: cursor.part.saturating_add(1),
                rows: 0,
            }
        } else {
            cursor
        })
    }

    /// Inserts `chunk` (one of [`INSERT_CHUNKS`] rows long) into `part`
    /// with one statement.
    fn insert(&self, chunk: &[NewRow], part: i64) -> rusqlite::Result<u64> {
        let st = self.stmt(chunk.len())?;
        let result = chunk
            .iter()
            .enumerate()
            .try_for_each(|(i, r)| self.bind_row(st, i * INSERT_ARITY, r))
            .and_then(|()| {
                let mut b = Binder {
                    st,
                    next: chunk.len() * INSERT_ARITY + 1,
                    owner: self,
                };
                b.int(Some(part))
            })
            .and_then(|()| {
                // SAFETY: `st` is a live statement of `self.conn`, used on
                // this thread only; every text bound points into `chunk`,
                // alive until this function returns.
                match unsafe { ffi::sqlite3_step(st) } {
                    ffi::SQLITE_DONE => Ok(chunk.len() as u64),
                    rc => Err(self.error(rc)),
                }
            });
        // SAFETY: as above. Reset ends the statement's run; clearing the
        // bindings drops every pointer into `chunk` before it goes away.
        // Reset's return repeats the step's error, already taken.
        unsafe {
            ffi::sqlite3_reset(st);
            ffi::sqlite3_clear_bindings(st);
        }
        result
    }

    /// The statement for `rows` rows, prepared the first time.
    fn stmt(&self, rows: usize) -> rusqlite::Result<*mut ffi::sqlite3_stmt> {
        let Some(k) = INSERT_CHUNKS.iter().position(|&n| n == rows) else {
            return Err(rusqlite::Error::InvalidParameterCount(
                rows,
                INSERT_CHUNKS[0],
            ));
        };
        let cached = self.stmts[k].get();
        if !cached.is_null() {
            return Ok(cached);
        }
        let sql = sqlite_insert_sql(rows);
        let len = c_int::try_from(sql.len()).map_err(|_| rusqlite::Error::InvalidQuery)?;
        let mut st = ptr::null_mut();
        // SAFETY: `sql` is valid for `len` bytes; the handle is this
        // connection's, used on this thread only; `st` is finalized in
        // `drop`, before the connection (borrowed for 'c) can close.
        let rc = unsafe {
            ffi::sqlite3_prepare_v3(
                self.conn.handle(),
                sql.as_ptr().cast(),
                len,
                ffi::SQLITE_PREPARE_PERSISTENT,
                &mut st,
                ptr::null_mut(),
            )
        };
        if rc != ffi::SQLITE_OK || st.is_null() {
            return Err(self.error(rc));
        }
        self.stmts[k].set(st);
        Ok(st)
    }

    /// Binds `r` to parameters `at + 1 ..= at + INSERT_ARITY`, in
    /// `INSERT_COLUMNS` order.
    fn bind_row(&self, st: *mut ffi::sqlite3_stmt, at: usize, r: &NewRow) -> rusqlite::Result<()> {
        let mut b = Binder {
            st,
            next: at + 1,
            owner: self,
        };
        b.int(Some(r.t_in))?;
        b.int(Some(r.t_out))?;
        b.text(Some(r.service().as_bytes()))?;
        b.text(Some(r.front.text_bytes()))?;
        b.text(Some(r.link.text_bytes()))?;
        b.text(r.node.bytes())?;
        b.text(Some(r.origin.text_bytes()))?;
        b.text(Some(r.mti.text_bytes()))?;
        b.text(r.mti_out.bytes())?;
        b.text(r.f11.bytes())?;
        b.text(r.f7.bytes())?;
        b.text(r.f37_in.bytes())?;
        b.text(r.f37_out.bytes())?;
        b.text(r.f41.bytes())?;
        b.text(r.f42.bytes())?;
        b.text(r.f32.bytes())?;
        b.text(r.f33.bytes())?;
        b.text(r.pan.bytes())?;
        b.text(r.f4.bytes())?;
        b.text(r.f49.bytes())?;
        b.text(r.f39.bytes())?;
        b.text(Some(r.answered_by.text_bytes()))?;
        b.text(r.reason.bytes())?;
        b.text(Some(r.outcome.text_bytes()))?;
        b.int(r.latency_us)?;
        b.int(Some(i64::from(r.late)))?;
        b.int(Some(i64::from(r.duplicate)))?;
        b.int(Some(i64::from(r.repeat)))?;
        b.int(Some(i64::from(r.unroutable)))?;
        b.text(r.bad.bytes())?;
        b.int(r.reversal_id)?;
        debug_assert_eq!(b.next, at + INSERT_ARITY + 1);
        Ok(())
    }

    /// The connection's error for return code `rc`.
    fn error(&self, rc: c_int) -> rusqlite::Error {
        // SAFETY: the handle is live; the message is copied at once, before
        // any other call on the connection can change it.
        let msg = unsafe {
            let m = ffi::sqlite3_errmsg(self.conn.handle());
            (!m.is_null()).then(|| CStr::from_ptr(m).to_string_lossy().into_owned())
        };
        rusqlite::Error::SqliteFailure(ffi::Error::new(rc), msg)
    }
}

impl Drop for RowInserts<'_> {
    fn drop(&mut self) {
        for st in &self.stmts {
            let st = st.replace(ptr::null_mut());
            if !st.is_null() {
                // SAFETY: prepared by `stmt` on this connection, finalized once.
                unsafe { ffi::sqlite3_finalize(st) };
            }
        }
    }
}

/// Binds one row's values in turn.
struct Binder<'a, 'c> {
    st: *mut ffi::sqlite3_stmt,
    next: usize,
    owner: &'a RowInserts<'c>,
}

impl Binder<'_, '_> {
    fn index(&mut self) -> rusqlite::Result<c_int> {
        let i = c_int::try_from(self.next).map_err(|_| rusqlite::Error::InvalidQuery)?;
        self.next += 1;
        Ok(i)
    }

    fn check(&self, rc: c_int) -> rusqlite::Result<()> {
        if rc == ffi::SQLITE_OK {
            Ok(())
        } else {
            Err(self.owner.error(rc))
        }
    }

    /// A text bound in place (`SQLITE_STATIC`): the caller keeps it alive
    /// until the statement is reset and its bindings cleared. UTF-8, as
    /// every [`Short`](crate::store::journal::insert::Short) holds.
    fn text(&mut self, value: Option<&[u8]>) -> rusqlite::Result<()> {
        let i = self.index()?;
        // SAFETY: `st` is live; `t` outlives the statement's step (see
        // `RowInserts::insert`), and its length is what is passed.
        let rc = match value {
            None => unsafe { ffi::sqlite3_bind_null(self.st, i) },
            Some(t) => {
                let len = c_int::try_from(t.len()).map_err(|_| rusqlite::Error::InvalidQuery)?;
                unsafe {
                    ffi::sqlite3_bind_text(self.st, i, t.as_ptr().cast(), len, ffi::SQLITE_STATIC())
                }
            }
        };
        self.check(rc)
    }

    fn int(&mut self, value: Option<i64>) -> rusqlite::Result<()> {
        let i = self.index()?;
        // SAFETY: `st` is live.
        let rc = match value {
            None => unsafe { ffi::sqlite3_bind_null(self.st, i) },
            Some(v) => unsafe { ffi::sqlite3_bind_int64(self.st, i, v) },
        };
        self.check(rc)
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::RowInserts;
    use crate::store::journal::{JournalRow, NewRow};

    fn store() -> Connection {
        let mut conn = Connection::open_in_memory().expect("open");
        assert!(super::super::migrate(&mut conn).is_ok(), "migrate");
        conn
    }

    fn row(i: i64, origin: &str) -> NewRow {
        NewRow::from(&JournalRow {
            t_in: 1_000 + i,
            t_out: 1_003 + i,
            service: "pos".into(),
            front: "listen".into(),
            link: format!("client#{i}"),
            node: Some("01".into()),
            origin: origin.into(),
            mti: "0200".into(),
            f11: Some(format!("{i:06}")),
            f37_in: Some("123456789012".into()),
            f41: Some("TERM0001".into()),
            pan: Some("622202*********0123".into()),
            answered_by: "node".into(),
            outcome: "answered".into(),
            latency_us: Some(3_000),
            late: true,
            ..JournalRow::default()
        })
    }

    /// t_in, link, f11, pan, outcome, f42, late.
    type ReadBack = (
        i64,
        String,
        String,
        Option<String>,
        String,
        Option<String>,
        i64,
    );

    /// Every column lands where `INSERT_COLUMNS` says, texts bound in place
    /// read back whole, NULLs stay NULL.
    #[test]
    fn rows_bound_in_place_read_back_whole() {
        let conn = store();
        let inserts = RowInserts::new(&conn);
        let rows: Vec<NewRow> = (0..8).map(|i| row(i, "front")).collect();
        assert_eq!(inserts.insert(&rows, 0).expect("insert 8"), 8);
        assert_eq!(inserts.insert(&rows[..1], 0).expect("insert 1"), 1);
        let got: Vec<ReadBack> = conn
            .prepare("SELECT t_in, link, f11, pan, outcome, f42, late FROM journal ORDER BY id")
            .expect("prepare")
            .query_map([], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                ))
            })
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(got.len(), 9);
        assert_eq!(
            got[7],
            (
                1_007,
                "client#7".to_string(),
                "000007".to_string(),
                Some("622202*********0123".to_string()),
                "answered".to_string(),
                None,
                1
            )
        );
        assert_eq!(got[8].1, "client#0");
        drop(inserts);
    }

    /// A row its CHECK refuses fails its statement as a constraint (so the
    /// writer retries the batch's requests one by one) and leaves the
    /// statement ready for the next chunk. The statement does not undo the
    /// rows before the refused one (`OR FAIL`: no statement journal to
    /// keep); the writer's rollback of the transaction does, as here.
    #[test]
    fn a_refused_row_is_a_constraint_error_and_the_statement_recovers() {
        let conn = store();
        let count = || -> i64 {
            conn.query_row("SELECT count(*) FROM journal", [], |r| r.get(0))
                .expect("count")
        };
        let inserts = RowInserts::new(&conn);
        let mut rows: Vec<NewRow> = (0..8).map(|i| row(i, "front")).collect();
        rows[5] = row(5, "bogus");
        conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
        let e = inserts.insert(&rows, 0).expect_err("CHECK (origin IN ...)");
        assert_eq!(
            e.sqlite_error_code(),
            Some(rusqlite::ErrorCode::ConstraintViolation),
            "{e}"
        );
        assert_eq!(
            count(),
            5,
            "the rows before the refused one, until rollback"
        );
        conn.execute_batch("ROLLBACK").expect("rollback");
        assert_eq!(count(), 0);
        rows[5] = row(5, "node");
        assert_eq!(inserts.insert(&rows, 0).expect("insert again"), 8);
        assert_eq!(count(), 8);
    }

    /// Batches fill a part up to PART_ROWS rows, never split, and the
    /// next part starts after; `journal_part` holds each part's rows and
    /// `t_in` range; a new connection's inserts carry on in the newest part.
    #[test]
    fn batches_fill_parts_and_journal_part_says_what_each_holds() {
        let conn = store();
        let batch = 1_000;
        let put = |inserts: &RowInserts<'_>, from: i64| {
            let rows: Vec<NewRow> = (from..from + batch).map(|i| row(i, "front")).collect();
            assert_eq!(inserts.put(&rows).expect("put"), batch as u64);
        };
        let inserts = RowInserts::new(&conn);
        for k in 0..3 {
            put(&inserts, k * batch);
        }
        drop(inserts);
        // A restart: the newest part (1, 1,000 rows) takes the next batch.
        let inserts = RowInserts::new(&conn);
        put(&inserts, 3 * batch);
        drop(inserts);
        let parts: Vec<(i64, i64, i64, i64)> = conn
            .prepare("SELECT part, t_min, t_max, rows FROM journal_part ORDER BY part")
            .expect("prepare")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert!(super::PART_ROWS > batch && super::PART_ROWS <= 3 * batch);
        assert_eq!(
            parts,
            [(0, 1_000, 3_999, 3_000), (1, 4_000, 4_999, 1_000)],
            "3,000 rows fill part 0 past PART_ROWS; the fourth batch starts part 1"
        );
        let in_parts: Vec<(i64, i64, i64)> = conn
            .prepare("SELECT part, min(t_in), count(*) FROM journal GROUP BY part")
            .expect("prepare")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(in_parts, [(0, 1_000, 3_000), (1, 4_000, 1_000)]);
    }
}
