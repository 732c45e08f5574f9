//! The projection transaction handle: what appliers write through.

use std::collections::HashMap;
use std::sync::Arc;

use outbox_core::spi::{ApplyTx, CheckpointMove, GenerationMap, StreamAdvance, ViewRow, ViewStorage};
use outbox_core::{Error, ProjectionName, Result, Seq, StreamId, async_trait};
use outbox_sql::generations::GenerationCache;
use outbox_sql::{Arg, Conn, Dialect, Row, SqlTx, Statement};
use sqlx::{Sqlite, SqliteConnection, Transaction};

use crate::db::{now_ms, storage};
use crate::sql::WriteTx;

/// One transaction of the SQLite projection database (`BEGIN IMMEDIATE` for
/// an apply or a reset, a read transaction for a digest).
///
/// Backend-neutral projections ([`ViewProjection`](outbox_core::ViewProjection))
/// use it through its [`ViewStorage`](outbox_core::spi::ViewStorage) implementation without knowing it is
/// SQLite. A hand-written projection (`Projection<SqliteTx>`, the escape
/// hatch) runs its own SQL on the connection: `tx.conn()`, or `&mut **tx`
/// through `DerefMut`. It must not commit, roll back or keep it.
pub struct SqliteTx {
    /// The driver's transaction, the live generations and the pending
    /// document writes, as every SQL dialect keeps them.
    sql: SqlTx<WriteTx>,
    /// `Some` while the apply guard's savepoint is open.
    guard: Option<i64>,
}

impl SqliteTx {
    pub(crate) fn new(tx: Transaction<'static, Sqlite>, dialect: Arc<Dialect>) -> Self {
        SqliteTx {
            sql: SqlTx::new(WriteTx(tx), dialect),
            guard: None,
        }
    }

    /// Resolves the live generations for this transaction: from `cache`
    /// (`Some`), or read now.
    pub(crate) async fn resolve_generations(&mut self, cache: Option<&GenerationCache>) -> Result<()> {
        self.sql.resolve_generations(cache).await
    }

    /// Writes out the pending document writes (see [`ViewWrites`](outbox_sql::ViewWrites)).
    pub(crate) async fn flush_views(&mut self) -> Result<()> {
        self.sql.flush_views().await
    }

    /// The shared statements' dialect.
    pub(crate) fn dialect(&self) -> Arc<Dialect> {
        self.sql.dialect()
    }

    /// Writes out the pending documents and the running digest changes (one
    /// statement per projection changed), then commits; `err` maps the
    /// commit's own error.
    pub(crate) async fn commit(self, err: impl FnOnce(sqlx::Error) -> Error) -> Result<()> {
        let WriteTx(tx) = self.sql.finish().await?;
        tx.commit().await.map_err(err)
    }

    /// The connection, inside the store's transaction.
    pub fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.sql.conn().0
    }
}

impl std::fmt::Debug for SqliteTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqliteTx")
    }
}

impl std::ops::Deref for SqliteTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        &self.sql.conn_ref().0
    }
}

impl std::ops::DerefMut for SqliteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.conn()
    }
}

/// The shared statements run on the store's transaction (setup, reset,
/// digests, skip records).
#[async_trait]
impl Conn for SqliteTx {
    async fn execute(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        crate::sql::execute(self.conn(), what, sql, args).await
    }

    async fn fetch(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        crate::sql::fetch(self.conn(), what, sql, args).await
    }
}

/// The document writes of [`SqlTx`], the same on every SQL dialect.
#[async_trait]
impl ViewStorage for SqliteTx {
    fn generations(&self) -> &GenerationMap {
        self.sql.generations()
    }

    fn view_applying(&mut self, projection: &ProjectionName, stream: &StreamId, seq: Seq) {
        self.sql.view_applying(projection, stream, seq);
    }

    async fn view_get(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
    ) -> Result<Option<String>> {
        self.sql.view_get(projection, table, key).await
    }

    async fn view_put(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
        value: &str,
    ) -> Result<()> {
        self.sql.view_put(projection, table, key, value).await
    }

    async fn view_delete(&mut self, projection: &ProjectionName, table: &str, key: &str) -> Result<bool> {
        self.sql.view_delete(projection, table, key).await
    }

    async fn view_scan(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, String)>> {
        self.sql.view_scan(projection, table, after, limit).await
    }

    async fn view_rows(
        &mut self,
        projection: &ProjectionName,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<ViewRow>> {
        self.sql.view_rows(projection, after, limit).await
    }

    async fn view_clear(&mut self, projection: &ProjectionName) -> Result<u64> {
        self.sql.view_clear(projection).await
    }
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
            .map_err(|e| storage("opening the apply guard", e))?;
        self.guard = Some(0);
        Ok(())
    }

    /// Releases the savepoint. If user code ended the transaction (committed
    /// it, or swallowed an error after which SQLite rolled it back), the
    /// savepoint is gone and `RELEASE` fails: the store's writes must not then
    /// run in autocommit mode, where a checkpoint would commit without the
    /// projection writes it stands for.
    async fn check_guard(&mut self) -> Result<Option<String>> {
        if self.guard.take().is_none() {
            return Ok(Some("the apply guard was never opened".into()));
        }
        // The batch's document writes, inside the guard.
        self.flush_views().await?;
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
        // Nothing may stay pending once the checkpoints move.
        self.flush_views().await?;
        let err = |e| storage("advancing checkpoints", e);
        let mut moved = 0;
        for m in moves {
            // Fenced by the generation record's epoch (ADR 0021).
            let (fence, epoch) = self.sql.generations().fence(m.projection);
            moved += sqlx::query(concat!(
                "INSERT INTO outbox_checkpoints (projection, stream, last_applied, updated_at) \
                 SELECT ?1, ?2, ?3, ",
                now_ms!(),
                " WHERE COALESCE((SELECT epoch FROM outbox_generations WHERE projection = ?5), 0) = ?6 \
                 ON CONFLICT (projection, stream) DO UPDATE SET last_applied = excluded.last_applied, \
                 updated_at = excluded.updated_at WHERE outbox_checkpoints.last_applied = ?4"
            ))
            .bind(m.projection.as_str())
            .bind(stream.as_str())
            .bind(i64::try_from(m.to).unwrap_or(i64::MAX))
            .bind(i64::try_from(m.from).unwrap_or(i64::MAX))
            .bind(fence.as_str())
            .bind(i64::try_from(epoch).unwrap_or(i64::MAX))
            .execute(self.conn())
            .await
            .map_err(err)?
            .rows_affected();
        }
        // A moved checkpoint raises the watermark itself (a trigger, projection
        // migration 0007): `through` is every moved checkpoint's new value.
        if moves.is_empty() {
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
        }
        Ok(moved)
    }

    async fn record_skip(
        &mut self,
        projection: &ProjectionName,
        stream: &StreamId,
        seq: outbox_core::Seq,
        error: &str,
    ) -> Result<()> {
        let d = self.dialect();
        outbox_sql::skipped::record_skip_in(&d, self, projection, stream, seq, error).await
    }

    async fn take_skip(
        &mut self,
        projection: &ProjectionName,
        stream: &StreamId,
        seq: outbox_core::Seq,
    ) -> Result<bool> {
        let d = self.dialect();
        outbox_sql::skipped::take_skip_in(&d, self, projection, stream, seq).await
    }

    /// One statement for every (projection, stream) pair.
    async fn checkpoints_of(
        &mut self,
        streams: &[&StreamId],
        projections: &[&ProjectionName],
    ) -> Result<Vec<Vec<u64>>> {
        let pairs: Vec<(&str, &str)> = streams
            .iter()
            .flat_map(|s| projections.iter().map(move |p| (p.as_str(), s.as_str())))
            .collect();
        // One row holding every checkpoint found: `sqlx` hands rows over
        // from its thread one by one, each a wake-up of this task.
        let what = "reading checkpoints";
        let found: String = sqlx::query_scalar(
            "SELECT json_group_array(json_array(projection, stream, last_applied)) FROM outbox_checkpoints \
             WHERE (projection, stream) IN (SELECT value ->> 0, value ->> 1 FROM json_each(?1))",
        )
        .bind(outbox_sql::json_text(&pairs)?)
        .fetch_one(self.conn())
        .await
        .map_err(|e| storage(what, e))?;
        let found: Vec<(String, String, i64)> = outbox_sql::decode_json(what, &found)?;
        let found: HashMap<(&str, &str), i64> = found
            .iter()
            .map(|(p, s, cp)| ((p.as_str(), s.as_str()), *cp))
            .collect();
        Ok(streams
            .iter()
            .map(|s| {
                projections
                    .iter()
                    .map(|p| {
                        let cp = found.get(&(p.as_str(), s.as_str())).copied().unwrap_or(0);
                        u64::try_from(cp).unwrap_or(0)
                    })
                    .collect()
            })
            .collect())
    }

    /// One command for every stream at once, after the read of the
    /// documents the pending writes replace: the documents, the
    /// checkpoints (each set only where it still is `from` and the
    /// generation epoch is the one resolved, ADR 0021), whose trigger raises
    /// the watermarks, the watermarks of streams whose checkpoints did not
    /// move, and the running digests. Each statement would otherwise be a
    /// handoff to the driver's thread of its own; nothing writes after the
    /// checkpoints move, so the digests are final.
    async fn advance_all(&mut self, advances: &[StreamAdvance<'_>]) -> Result<u64> {
        let dialect = self.dialect();
        let mut views = std::mem::take(self.sql.views());
        let documents = views.prepare_flush(&dialect, self).await;
        let digests = views.take_digests();
        *self.sql.views() = views;
        let documents = documents?;
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let moves: Vec<(&str, &str, i64, i64, &str, i64)> = advances
            .iter()
            .flat_map(|a| {
                a.moves.iter().map(|m| {
                    let (fence, epoch) = self.sql.generations().fence(m.projection);
                    (
                        m.projection.as_str(),
                        a.stream.as_str(),
                        int(m.from),
                        int(m.to),
                        fence.as_str(),
                        int(epoch),
                    )
                })
            })
            .collect();
        // Streams whose checkpoints moved have their watermarks raised by the
        // checkpoints' trigger (projection migration 0007).
        let marks: Vec<(&str, i64)> = advances
            .iter()
            .filter(|a| a.moves.is_empty())
            .map(|a| (a.stream.as_str(), int(a.through)))
            .collect();
        let (moves, marks) = (
            outbox_sql::json_text_unless_empty(&moves)?,
            outbox_sql::json_text_unless_empty(&marks)?,
        );
        let mut statements = documents.statements(&dialect);
        let checkpoints = statements.len();
        if let Some(moves) = &moves {
            statements.push(Statement {
                what: "advancing checkpoints",
                sql: ADVANCE_CHECKPOINTS.to_owned(),
                args: vec![Arg::Text(moves)],
            });
        }
        if let Some(marks) = &marks {
            statements.push(Statement {
                what: "raising watermarks",
                sql: RAISE_WATERMARKS.to_owned(),
                args: vec![Arg::Text(marks)],
            });
        }
        statements.extend(digests.statements(&dialect));
        let changed = crate::sql::execute_all(self.conn(), "advancing checkpoints", &statements).await?;
        Ok(match moves {
            Some(_) => changed[checkpoints],
            None => 0,
        })
    }
}

/// Sets every checkpoint of `?1` (`[projection, stream, from, to, fenced
/// projection, epoch]` rows) that still is `from` under the epoch given.
const ADVANCE_CHECKPOINTS: &str = concat!(
    "INSERT INTO outbox_checkpoints (projection, stream, last_applied, updated_at) \
     SELECT j.value ->> 0, j.value ->> 1, j.value ->> 3, ",
    now_ms!(),
    " FROM json_each(?1) j LEFT JOIN outbox_checkpoints c \
     ON c.projection = j.value ->> 0 AND c.stream = j.value ->> 1 \
     WHERE COALESCE(c.last_applied, 0) = j.value ->> 2 \
     AND COALESCE((SELECT g.epoch FROM outbox_generations g WHERE g.projection = j.value ->> 4), 0) \
         = j.value ->> 5 \
     ON CONFLICT (projection, stream) DO UPDATE SET last_applied = excluded.last_applied, \
     updated_at = excluded.updated_at"
);

/// Raises the watermarks of `?1` (`[stream, through]` rows), never lowering one.
const RAISE_WATERMARKS: &str = concat!(
    "INSERT INTO outbox_watermarks (stream, applied_through, updated_at) \
     SELECT value ->> 0, value ->> 1, ",
    now_ms!(),
    " FROM json_each(?1) WHERE true \
     ON CONFLICT (stream) DO UPDATE SET applied_through = excluded.applied_through, \
     updated_at = excluded.updated_at WHERE excluded.applied_through > outbox_watermarks.applied_through"
);
