//! The projection transaction handle: what appliers write through.

use std::ops::{Deref, DerefMut};

use std::collections::HashMap;

use outbox_core::spi::{ApplyTx, CheckpointMove, ViewRow, ViewStorage};
use outbox_core::{ProjectionName, Result, StreamId, async_trait};
use sqlx::{PgConnection, Postgres, Transaction};

use crate::db::{pnow, storage};

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
    /// The transaction id taken by [`ApplyTx::guard`].
    xid: Option<i64>,
}

impl PgTx {
    pub(crate) fn new(tx: Transaction<'static, Postgres>) -> Self {
        PgTx { tx, xid: None }
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

/// Advances checkpoints by compare-and-set (`$2` names, `$3` new, `$4`
/// old values on stream `$1`) and raises the watermark to `$5`; returns how
/// many checkpoints moved.
pub const APPLY_CAS: &str = concat!(
    "WITH cas AS (UPDATE outbox_checkpoints c SET last_applied = x.new, updated_at = ",
    pnow!(),
    " FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS x(p, new, old) \
               WHERE c.projection = x.p AND c.stream = $1 AND c.last_applied = x.old RETURNING 1), \
             wm AS (INSERT INTO outbox_watermarks AS w (stream, applied_through, updated_at) VALUES ($1, $5, ",
    pnow!(),
    ") ON CONFLICT (stream) DO UPDATE SET applied_through = excluded.applied_through, \
               updated_at = excluded.updated_at WHERE excluded.applied_through > w.applied_through) \
             SELECT count(*) FROM cas"
);

/// Locks checkpoints of projections `$2` on stream `$1`, in name order.
pub const LOCK_CHECKPOINTS: &str = "SELECT projection, last_applied FROM outbox_checkpoints \
     WHERE stream = $1 AND projection = ANY($2) ORDER BY projection FOR UPDATE";

/// Locks the checkpoint rows of `names` (sorted) on `stream`, creating
/// missing ones at 0, and returns each checkpoint.
async fn lock_checkpoints(
    conn: &mut PgConnection,
    stream: &str,
    names: &[&str],
) -> sqlx::Result<HashMap<String, i64>> {
    const LOCK: &str = LOCK_CHECKPOINTS;
    let found: Vec<(String, i64)> = sqlx::query_as(LOCK)
        .bind(stream)
        .bind(names)
        .fetch_all(&mut *conn)
        .await?;
    let mut cps: HashMap<String, i64> = found.into_iter().collect();
    if cps.len() < names.len() {
        let missing: Vec<&str> = names.iter().copied().filter(|n| !cps.contains_key(*n)).collect();
        // A concurrent first apply makes this wait for its commit and then do
        // nothing; the second lock reads what it committed.
        sqlx::query(concat!(
            "INSERT INTO outbox_checkpoints (projection, stream, last_applied, updated_at) \
             SELECT p, $1, 0, ",
            pnow!(),
            " FROM unnest($2::text[]) AS u(p) ORDER BY p ON CONFLICT (projection, stream) DO NOTHING"
        ))
        .bind(stream)
        .bind(&missing)
        .execute(&mut *conn)
        .await?;
        let more: Vec<(String, i64)> = sqlx::query_as(LOCK)
            .bind(stream)
            .bind(&missing)
            .fetch_all(&mut *conn)
            .await?;
        cps.extend(more);
    }
    Ok(cps)
}

#[async_trait]
impl ApplyTx for PgTx {
    /// Locks the checkpoint rows (`FOR UPDATE`, in projection-name order,
    /// inserting missing ones at 0 first): a concurrent apply of the same
    /// (projection, stream) waits here, then sees what this one committed and
    /// skips it as duplicates.
    async fn checkpoints(&mut self, stream: &StreamId, projections: &[&ProjectionName]) -> Result<Vec<u64>> {
        if projections.is_empty() {
            return Ok(Vec::new());
        }
        let mut names: Vec<&str> = projections.iter().map(|p| p.as_str()).collect();
        names.sort_unstable();
        let locked = lock_checkpoints(self.conn(), stream.as_str(), &names)
            .await
            .map_err(|e| storage("locking checkpoints", e))?;
        Ok(projections
            .iter()
            .map(|p| u64::try_from(locked.get(p.as_str()).copied().unwrap_or(0)).unwrap_or(0))
            .collect())
    }

    /// Takes the store's transaction id (assigning one now) right before user
    /// code runs.
    async fn guard(&mut self) -> Result<()> {
        let xid: i64 = sqlx::query_scalar("SELECT txid_current()")
            .fetch_one(self.conn())
            .await
            .map_err(|e| storage("opening the apply guard", e))?;
        self.xid = Some(xid);
        Ok(())
    }

    /// Checks that the transaction of [`ApplyTx::guard`] is still the one open
    /// on the connection. If user code ended it (`COMMIT` or `ROLLBACK`,
    /// possibly followed by a `BEGIN`), the connection is in autocommit mode
    /// or in another transaction, whose id is unassigned or different; if it
    /// swallowed an error, Postgres aborted the transaction and the check
    /// itself fails with `25P02`.
    async fn check_guard(&mut self) -> Result<Option<String>> {
        let xid = self.xid;
        match sqlx::query_scalar::<_, Option<i64>>("SELECT txid_current_if_assigned()")
            .fetch_one(self.conn())
            .await
        {
            Ok(now) if now.is_some() && now == xid => Ok(None),
            Ok(_) => Ok(Some(String::new())),
            Err(sqlx::Error::Database(d)) if d.code().as_deref() == Some("25P02") => {
                Ok(Some(d.message().to_owned()))
            }
            Err(e) => Err(storage("checking the apply guard", e)),
        }
    }

    /// Compare-and-sets every moved checkpoint against the value read and
    /// raises the watermark, in one statement.
    async fn advance(
        &mut self,
        stream: &StreamId,
        moves: &[CheckpointMove<'_>],
        through: u64,
    ) -> Result<u64> {
        let names: Vec<&str> = moves.iter().map(|m| m.projection.as_str()).collect();
        let to: Vec<i64> = moves
            .iter()
            .map(|m| i64::try_from(m.to).unwrap_or(i64::MAX))
            .collect();
        let from: Vec<i64> = moves
            .iter()
            .map(|m| i64::try_from(m.from).unwrap_or(i64::MAX))
            .collect();
        let moved: i64 = sqlx::query_scalar(APPLY_CAS)
            .bind(stream.as_str())
            .bind(&names)
            .bind(&to)
            .bind(&from)
            .bind(i64::try_from(through).unwrap_or(i64::MAX))
            .fetch_one(self.conn())
            .await
            .map_err(|e| storage("advancing checkpoints", e))?;
        Ok(u64::try_from(moved).unwrap_or(0))
    }
}
