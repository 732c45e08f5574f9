//! The projection transaction handle: what appliers write through.

use std::ops::{Deref, DerefMut};

use outbox_core::spi::{ViewRow, ViewStorage};
use outbox_core::{ProjectionName, Result, async_trait};
use sqlx::{PgConnection, Postgres, Transaction};

use crate::db::storage;

/// One transaction of the Postgres projection database (read committed for
/// an apply or a reset, a repeatable-read snapshot for a digest).
///
/// Backend-neutral projections ([`ViewProjection`](outbox_core::ViewProjection))
/// use it through its [`ViewStorage`] implementation without knowing it is
/// Postgres. A hand-written projection (`Projection<PgTx>`, the escape
/// hatch) runs its own SQL on the connection: `tx.conn()`, or `&mut **tx`
/// through `DerefMut`. It must not commit, roll back or keep it.
pub struct PgTx {
    tx: Transaction<'static, Postgres>,
}

impl PgTx {
    pub(crate) fn new(tx: Transaction<'static, Postgres>) -> Self {
        PgTx { tx }
    }

    pub(crate) async fn commit(self) -> sqlx::Result<()> {
        self.tx.commit().await
    }

    /// The connection, inside the store's transaction.
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

impl std::fmt::Debug for PgTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PgTx")
    }
}

impl Deref for PgTx {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for PgTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

fn as_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl ViewStorage for PgTx {
    async fn view_get(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
    ) -> Result<Option<String>> {
        let err = |e| storage(format_args!("reading view document {table}/{key}"), e);
        // Applies of different streams run concurrently on Postgres: a
        // projection that reads a document and writes it back must not lose a
        // concurrent update (or a concurrent first insert, which a row lock
        // cannot cover). Lock the document's key for the transaction first,
        // then read it in a new statement, so the read sees what the previous
        // holder committed.
        sqlx::query(
            "SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2 || chr(31) || $3, 0))",
        )
        .bind(projection.as_str())
        .bind(table)
        .bind(key)
        .execute(self.conn())
        .await
        .map_err(err)?;
        sqlx::query_scalar("SELECT value FROM outbox_views WHERE projection = $1 AND tbl = $2 AND key = $3")
            .bind(projection.as_str())
            .bind(table)
            .bind(key)
            .fetch_optional(self.conn())
            .await
            .map_err(err)
    }

    async fn view_put(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
        value: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO outbox_views (projection, tbl, key, value) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (projection, tbl, key) DO UPDATE SET value = excluded.value",
        )
        .bind(projection.as_str())
        .bind(table)
        .bind(key)
        .bind(value)
        .execute(self.conn())
        .await
        .map(drop)
        .map_err(|e| storage(format_args!("writing view document {table}/{key}"), e))
    }

    async fn view_delete(&mut self, projection: &ProjectionName, table: &str, key: &str) -> Result<bool> {
        sqlx::query("DELETE FROM outbox_views WHERE projection = $1 AND tbl = $2 AND key = $3")
            .bind(projection.as_str())
            .bind(table)
            .bind(key)
            .execute(self.conn())
            .await
            .map(|r| r.rows_affected() > 0)
            .map_err(|e| storage(format_args!("deleting view document {table}/{key}"), e))
    }

    async fn view_scan(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, String)>> {
        scan(self.conn(), projection, table, after, limit).await
    }

    async fn view_rows(
        &mut self,
        projection: &ProjectionName,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<ViewRow>> {
        let (t, k) = after.unwrap_or(("", ""));
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT tbl, key, value FROM outbox_views WHERE projection = $1 AND (tbl, key) > ($2, $3) \
             ORDER BY tbl, key LIMIT $4",
        )
        .bind(projection.as_str())
        .bind(t)
        .bind(k)
        .bind(as_i64(limit))
        .fetch_all(self.conn())
        .await
        .map_err(|e| {
            storage(
                format_args!("reading the documents of projection `{projection}`"),
                e,
            )
        })?;
        Ok(rows
            .into_iter()
            .map(|(table, key, value)| ViewRow { table, key, value })
            .collect())
    }

    async fn view_clear(&mut self, projection: &ProjectionName) -> Result<u64> {
        sqlx::query("DELETE FROM outbox_views WHERE projection = $1")
            .bind(projection.as_str())
            .execute(self.conn())
            .await
            .map(|r| r.rows_affected())
            .map_err(|e| {
                storage(
                    format_args!("clearing the documents of projection `{projection}`"),
                    e,
                )
            })
    }
}

/// A page of one view table, in key order (also the store's read path).
pub(crate) async fn scan(
    conn: &mut PgConnection,
    projection: &ProjectionName,
    table: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, String)>> {
    sqlx::query_as(
        "SELECT key, value FROM outbox_views WHERE projection = $1 AND tbl = $2 AND key > $3 \
         ORDER BY key LIMIT $4",
    )
    .bind(projection.as_str())
    .bind(table)
    .bind(after.unwrap_or(""))
    .bind(as_i64(limit))
    .fetch_all(conn)
    .await
    .map_err(|e| storage(format_args!("scanning view table {table}"), e))
}
