//! The PostgreSQL backend's `meta` table: small runtime records and the
//! schema's version (written by the migrations too, with [`META_PUT`]).

use tokio_postgres::{Client, Statement};

use super::Postgres;
use crate::store::backend::MetaOps;

pub(super) const META_PUT: &str = "INSERT INTO meta (key, value) VALUES ($1, $2) \
     ON CONFLICT (key) DO UPDATE SET value = excluded.value";

/// The table's statements, prepared once per connection.
pub(super) struct Statements {
    get: Statement,
    put: Statement,
}

impl Statements {
    pub(super) async fn prepare(c: &Client) -> Result<Self, tokio_postgres::Error> {
        Ok(Statements {
            get: c.prepare("SELECT value FROM meta WHERE key = $1").await?,
            put: c.prepare(META_PUT).await?,
        })
    }
}

impl MetaOps for Postgres<'_> {
    async fn meta_get(&self, key: &str) -> Result<Option<String>, tokio_postgres::Error> {
        let row = self.tx.query_opt(&self.st.meta.get, &[&key]).await?;
        row.map(|r| r.try_get(0)).transpose()
    }

    async fn meta_put(&self, key: &str, value: &str) -> Result<(), tokio_postgres::Error> {
        self.tx.execute(&self.st.meta.put, &[&key, &value]).await?;
        Ok(())
    }
}
