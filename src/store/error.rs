//! The store's one error type. Every variant names what it is about (the
//! config key, the file, the entry); none carries a PostgreSQL password: URLs
//! appear only in their redacted form ([`super::config::redact_url`]).
//!
//! Errors are `Clone` because one failed commit answers every request of its
//! batch with the same error.

use std::path::PathBuf;
use std::sync::Arc;

use super::state::{SafId, SafState};

#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// `store.url` could not be read; `url` is redacted.
    #[error("store.url `{url}`: {reason}")]
    BadUrl { url: String, reason: String },

    /// A `[store]` key with a value the store cannot use.
    #[error("{key}: {reason}")]
    BadConfig { key: &'static str, reason: String },

    /// The SQLite file (or its -wal / -shm) is not one the store will use.
    #[error("store file {}: {reason}", path.display())]
    UnsafeFile { path: PathBuf, reason: String },

    #[error("store file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },

    #[error("sqlite store {}: {source}", path.display())]
    Sqlite {
        path: PathBuf,
        #[source]
        source: Arc<rusqlite::Error>,
    },

    /// A PostgreSQL statement failed while connected; `url` is redacted.
    /// Only the server's message and code are kept: the driver's error also
    /// carries the server's DETAIL, which can quote a whole row, payload
    /// (and so the PAN) included, and would show in any `{:?}`.
    #[error("postgres store {url}: {detail}")]
    Postgres { url: String, detail: String },

    /// No connection to PostgreSQL right now (never connected since the loss,
    /// or lost during this request). The request may or may not have been
    /// applied if the connection broke during its commit: callers keep what
    /// they hold in memory and try again later.
    #[error("postgres store {url} is unavailable: {reason}")]
    Unavailable { url: String, reason: String },

    /// The writer's queue is full: the request was not taken. Seen at once,
    /// never a silent drop.
    #[error("store queue is full ({capacity} requests waiting; store.queue)")]
    QueueFull { capacity: usize },

    /// The store was closed (or its writer stopped).
    #[error("store is closed")]
    Closed,

    /// The database was written by a newer isoswitch.
    #[error("store schema version {found} is newer than this isoswitch knows ({known})")]
    SchemaTooNew { found: i64, known: i64 },

    /// The `meta` table holds something that is not a schema version.
    #[error("store meta `{key}`: `{value}` is not a number")]
    BadMeta { key: String, value: String },

    /// A new entry refused before it reached the queue.
    #[error("saf entry field {field}: {reason}")]
    InvalidEntry { field: &'static str, reason: String },

    #[error("saf entry {id} does not exist")]
    NotFound { id: SafId },

    /// The entry is not in a state the operation applies to.
    #[error("saf entry {id} is {state}; {action} needs {needs}")]
    WrongState {
        id: SafId,
        state: SafState,
        action: &'static str,
        needs: &'static str,
    },

    /// The caller's lease ran out and the entry moved on (another owner took
    /// it, or it completed): the caller's report is not applied.
    #[error("saf entry {id} is no longer leased to {owner}")]
    LeaseLost { id: SafId, owner: String },

    /// The writer answered a request with the wrong kind of outcome: a bug,
    /// reported rather than panicking.
    #[error("store writer answered {op} with {got}")]
    WrongAnswer { op: &'static str, got: String },

    /// The store's key file cannot be used (`line` 0: the file as a whole).
    #[error("store key file {}: line {line}: {reason}", path.display())]
    BadKeyFile {
        path: PathBuf,
        line: usize,
        reason: String,
    },

    /// A payload could not be sealed or opened (never names its content).
    #[error("sealed payload: {reason}")]
    Seal { reason: String },

    /// A value read back from the database is not one this code writes.
    #[error("store column {column}: unexpected value `{value}`")]
    Corrupt { column: &'static str, value: String },
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io {
            path: path.into(),
            source: Arc::new(source),
        }
    }

    pub(crate) fn unsafe_file(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        StoreError::UnsafeFile {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
