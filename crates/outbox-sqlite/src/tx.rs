//! The projection transaction handle: what appliers write through.

use std::ops::{Deref, DerefMut};

use outbox_core::spi::{ApplyTx, CheckpointMove, ViewRow, ViewStorage};
use outbox_core::{Error, ProjectionName, Result, StreamId, async_trait};
use sqlx::{Sqlite, SqliteConnection, Transaction};

use crate::db::{now_ms, storage};

/// One transaction of the SQLite projection database (`BEGIN IMMEDIATE` for
/// an apply or a reset, a read transaction for a digest).
///
/// Backend-neutral projections ([`ViewProjection`](outbox_core::ViewProjection))
/// use it through its [`ViewStorage`] implementation without knowing it is
/// SQLite. A hand-written projection (`Projection<SqliteTx>`, the escape
/// hatch) runs its own SQL on the connection: `tx.conn()`, or `&mut **tx`
/// through `DerefMut`. It must not commit, roll back or keep it.
pub struct SqliteTx {
    tx: Transaction<'static, Sqlite>,
}

impl SqliteTx {
    pub(crate) fn new(tx: Transaction<'static, Sqlite>) -> Self {
        SqliteTx { tx }
    }

    pub(crate) async fn commit(self) -> sqlx::Result<()> {
        self.tx.commit().await
    }

    /// The connection, inside the store's transaction.
    pub fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

impl std::fmt::Debug for SqliteTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqliteTx")
    }
}

impl Deref for SqliteTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        &self.tx
    }
}

impl DerefMut for SqliteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

fn as_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl ViewStorage for SqliteTx {
    async fn view_get(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
    ) -> Result<Option<String>> {
        sqlx::query_scalar("SELECT value FROM outbox_views WHERE projection = ?1 AND tbl = ?2 AND key = ?3")
            .bind(projection.as_str())
            .bind(table)
            .bind(key)
            .fetch_optional(self.conn())
            .await
            .map_err(|e| storage(format_args!("reading view document {table}/{key}"), e))
    }

    async fn view_put(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
        value: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO outbox_views (projection, tbl, key, value) VALUES (?1, ?2, ?3, ?4) \
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
        sqlx::query("DELETE FROM outbox_views WHERE projection = ?1 AND tbl = ?2 AND key = ?3")
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
            "SELECT tbl, key, value FROM outbox_views WHERE projection = ?1 AND (tbl, key) > (?2, ?3) \
             ORDER BY tbl, key LIMIT ?4",
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
        sqlx::query("DELETE FROM outbox_views WHERE projection = ?1")
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
    conn: &mut SqliteConnection,
    projection: &ProjectionName,
    table: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, String)>> {
    sqlx::query_as(
        "SELECT key, value FROM outbox_views WHERE projection = ?1 AND tbl = ?2 AND key > ?3 \
         ORDER BY key LIMIT ?4",
    )
    .bind(projection.as_str())
    .bind(table)
    .bind(after.unwrap_or(""))
    .bind(as_i64(limit))
    .fetch_all(conn)
    .await
    .map_err(|e| storage(format_args!("scanning view table {table}"), e))
}

#[async_trait]
impl ApplyTx for SqliteTx {
    async fn checkpoints(&mut self, stream: &StreamId, projections: &[&ProjectionName]) -> Result<Vec<u64>> {
        // Under BEGIN IMMEDIATE this transaction is the only writer: reading is locking.
        let mut out = Vec::with_capacity(projections.len());
        for p in projections {
            let cp: Option<i64> = sqlx::query_scalar(
                "SELECT last_applied FROM outbox_checkpoints WHERE projection = ?1 AND stream = ?2",
            )
            .bind(p.as_str())
            .bind(stream.as_str())
            .fetch_optional(self.conn())
            .await
            .map_err(|e| storage("reading a checkpoint", e))?;
            out.push(u64::try_from(cp.unwrap_or(0)).unwrap_or(0));
        }
        Ok(out)
    }

    /// A savepoint right after `BEGIN IMMEDIATE`, before user code runs.
    async fn guard(&mut self) -> Result<()> {
        sqlx::query("SAVEPOINT outbox_guard")
            .execute(self.conn())
            .await
            .map(drop)
            .map_err(|e| storage("opening the apply guard", e))
    }

    /// Releases the savepoint. If user code ended the transaction (committed
    /// it, or swallowed an error after which SQLite rolled it back), the
    /// savepoint is gone and `RELEASE` fails: the store's writes must not then
    /// run in autocommit mode, where a checkpoint would commit without the
    /// projection writes it stands for.
    async fn check_guard(&mut self) -> Result<Option<String>> {
        Ok(sqlx::query("RELEASE outbox_guard")
            .execute(self.conn())
            .await
            .err()
            .map(|e| e.to_string()))
    }

    async fn advance(
        &mut self,
        stream: &StreamId,
        moves: &[CheckpointMove<'_>],
        through: u64,
    ) -> Result<u64> {
        let err = |e| storage("advancing checkpoints", e);
        let mut moved = 0;
        for m in moves {
            moved += sqlx::query(concat!(
                "INSERT INTO outbox_checkpoints (projection, stream, last_applied, updated_at) \
                 VALUES (?1, ?2, ?3, ",
                now_ms!(),
                ") ON CONFLICT (projection, stream) DO UPDATE SET last_applied = excluded.last_applied, \
                 updated_at = excluded.updated_at WHERE outbox_checkpoints.last_applied = ?4"
            ))
            .bind(m.projection.as_str())
            .bind(stream.as_str())
            .bind(i64::try_from(m.to).unwrap_or(i64::MAX))
            .bind(i64::try_from(m.from).unwrap_or(i64::MAX))
            .execute(self.conn())
            .await
            .map_err(err)?
            .rows_affected();
        }
        sqlx::query(concat!(
            "INSERT INTO outbox_watermarks (stream, applied_through, updated_at) VALUES (?1, ?2, ",
            now_ms!(),
            ") ON CONFLICT (stream) DO UPDATE SET applied_through = excluded.applied_through, \
             updated_at = excluded.updated_at WHERE excluded.applied_through > outbox_watermarks.applied_through"
        ))
        .bind(stream.as_str())
        .bind(i64::try_from(through).unwrap_or(i64::MAX))
        .execute(self.conn())
        .await
        .map_err(err)?;
        Ok(moved)
    }
}

/// Runs the store's own reset around user code: guards the projection's
/// `reset`, then deletes its checkpoints.
pub(crate) async fn reset_in(
    tx: &mut SqliteTx,
    projection: &dyn outbox_core::Projection<SqliteTx>,
) -> Result<()> {
    tx.guard().await?;
    projection.reset(tx).await.map_err(|e| {
        Error::storage(
            format!("resetting projection `{}` failed: {e}", projection.name()),
            e,
        )
    })?;
    if let Some(detail) = tx.check_guard().await? {
        return Err(outbox_core::spi::ended_by_projection(
            &format!("`{}`", projection.name()),
            None,
            &detail,
        ));
    }
    sqlx::query("DELETE FROM outbox_checkpoints WHERE projection = ?1")
        .bind(projection.name().as_str())
        .execute(tx.conn())
        .await
        .map(drop)
        .map_err(|e| storage("resetting checkpoints", e))
}
