//! The SQLite backend's `meta` table: small runtime records and the
//! schema's version (read and written by the migrations too).

use rusqlite::{Connection, OptionalExtension, params};

use super::Sqlite;
use crate::store::backend::MetaOps;

impl MetaOps for Sqlite<'_> {
    async fn meta_get(&self, key: &str) -> rusqlite::Result<Option<String>> {
        get(self.tx, key)
    }

    async fn meta_put(&self, key: &str, value: &str) -> rusqlite::Result<()> {
        put(self.tx, key, value)
    }
}

pub(super) fn get(conn: &Connection, key: &str) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT value FROM meta WHERE key = ?1")?
        .query_row(params![key], |r| r.get(0))
        .optional()
}

pub(super) fn put(conn: &Connection, key: &str, value: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO meta (key, value) VALUES (?1, ?2) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![key, value])?;
    Ok(())
}
