//! The projection transaction handle: what appliers write through.

use std::sync::Arc;

use outbox_core::spi::{ApplyTx, CheckpointMove, GenerationMap, StreamAdvance, ViewRow, ViewStorage};
use outbox_core::{FailedEvent, ProjectionName, Result, Seq, StreamId, async_trait};
use outbox_sql::generations::GenerationCache;
use outbox_sql::{Arg, Conn, Dialect, Row, SqlTx, Statement};
use rusqlite::{Connection, OptionalExtension as _, params};

use crate::clock::now_ms;
use crate::engine::{Session, engine_error};

/// One transaction of the SQLite projection database (`BEGIN IMMEDIATE` for
/// an apply or a reset, a read transaction for a digest), on the store's
/// engine thread.
///
/// Backend-neutral projections ([`ViewProjection`](outbox_core::ViewProjection))
/// use it through its [`ViewStorage`] implementation without knowing it is
/// SQLite. A hand-written projection (`Projection<SqliteTx>`, the escape
/// hatch) runs its own SQL with [`SqliteTx::run`]: a closure that gets the
/// store's [`rusqlite`] connection inside the transaction. It must not
/// commit or roll back.
pub struct SqliteTx {
    /// The engine session, the live generations and the pending document
    /// writes, as every SQL dialect keeps them.
    sql: SqlTx<Session>,
    /// Whether the apply guard's savepoint is open.
    guard: bool,
}

impl SqliteTx {
    pub(crate) fn new(session: Session, dialect: Arc<Dialect>) -> Self {
        SqliteTx {
            sql: SqlTx::new(session, dialect),
            guard: false,
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
    /// statement per projection changed), then commits.
    pub(crate) async fn commit(self, what: &str) -> Result<()> {
        let session = self.sql.finish().await?;
        outbox_sql::Tx::commit(Box::new(session), what).await
    }

    /// Runs `body` on the store's connection, inside this transaction, on
    /// the store's engine thread: one handoff for the whole body, however
    /// many statements it runs. Its error is mapped as the store's own
    /// (a busy or full database is temporary); a panic in it is an error.
    ///
    /// The body must be `'static`: copy what it needs from the event first.
    ///
    /// ```no_run
    /// # async fn demo(tx: &mut outbox_sqlite::SqliteTx, event: &outbox_core::Event) -> outbox_core::Result<()> {
    /// use outbox_sqlite::rusqlite::params;
    ///
    /// let stream = event.stream.as_str().to_owned();
    /// tx.run(move |conn| {
    ///     conn.execute(
    ///         "INSERT INTO counts (stream, n) VALUES (?1, 1) \
    ///          ON CONFLICT (stream) DO UPDATE SET n = n + 1",
    ///         params![stream],
    ///     )
    /// })
    /// .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run<T, F>(&mut self, body: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.sql
            .conn()
            .run(move |conn| body(conn).map_err(|e| engine_error("a projection's statement", e)))
            .await
    }

    /// Runs `body` once per item of `items`, in order, on the store's
    /// connection inside this transaction: one handoff for the whole run,
    /// the body of a projection's
    /// [`apply_run`](outbox_core::Projection::apply_run). The first item
    /// whose body fails stops the run: the failure names its index, with
    /// the error mapped as the store's own (a full disk stays temporary).
    /// A failed statement leaves the transaction usable, so the items
    /// before it stay written.
    ///
    /// ```no_run
    /// # async fn demo(tx: &mut outbox_sqlite::SqliteTx, events: &[&outbox_core::Event]) -> Result<(), outbox_core::FailedEvent> {
    /// use outbox_sqlite::rusqlite::params;
    ///
    /// let streams: Vec<String> = events.iter().map(|e| e.stream.as_str().to_owned()).collect();
    /// tx.run_each(streams, |conn, stream| {
    ///     conn.prepare_cached(
    ///         "INSERT INTO counts (stream, n) VALUES (?1, 1) \
    ///          ON CONFLICT (stream) DO UPDATE SET n = n + 1",
    ///     )?
    ///     .execute(params![stream])
    ///     .map(drop)
    /// })
    /// .await
    /// # }
    /// ```
    pub async fn run_each<I, F>(&mut self, items: Vec<I>, mut body: F) -> std::result::Result<(), FailedEvent>
    where
        I: Send + 'static,
        F: FnMut(&Connection, I) -> rusqlite::Result<()> + Send + 'static,
    {
        let ran = self
            .sql
            .conn()
            .run(move |conn| {
                for (index, item) in items.into_iter().enumerate() {
                    if let Err(e) = body(conn, item) {
                        return Ok(Some((index, engine_error("a projection's statement", e))));
                    }
                }
                Ok(None)
            })
            .await;
        match ran {
            Ok(None) => Ok(()),
            Ok(Some((index, e))) => Err(FailedEvent::at(index, e)),
            // The handoff itself failed: the store's trouble (a temporary
            // error is never blamed on an event).
            Err(e) => Err(FailedEvent::at(0, e)),
        }
    }
}

impl std::fmt::Debug for SqliteTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqliteTx")
    }
}

/// The shared statements run on the store's transaction (setup, reset,
/// digests, skip records).
#[async_trait]
impl Conn for SqliteTx {
    async fn execute(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        self.sql.conn().execute(what, sql, args).await
    }

    async fn fetch(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        self.sql.conn().fetch(what, sql, args).await
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

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The checkpoint of (`projection`, `stream`), 0 when there is none.
fn checkpoint(conn: &Connection, projection: &str, stream: &str) -> rusqlite::Result<u64> {
    let cp: Option<i64> = conn
        .prepare_cached("SELECT last_applied FROM outbox_checkpoints WHERE projection = ?1 AND stream = ?2")?
        .query_row(params![projection, stream], |r| r.get(0))
        .optional()?;
    Ok(u64::try_from(cp.unwrap_or(0)).unwrap_or(0))
}

#[async_trait]
impl ApplyTx for SqliteTx {
    async fn checkpoints(&mut self, stream: &StreamId, projections: &[&ProjectionName]) -> Result<Vec<u64>> {
        // Under BEGIN IMMEDIATE this transaction is the only writer: reading is locking.
        let stream = stream.as_str().to_owned();
        let projections: Vec<String> = projections.iter().map(|p| p.as_str().to_owned()).collect();
        self.sql
            .conn()
            .run(move |conn| {
                projections
                    .iter()
                    .map(|p| checkpoint(conn, p, &stream))
                    .collect::<rusqlite::Result<Vec<u64>>>()
                    .map_err(|e| engine_error("reading a checkpoint", e))
            })
            .await
    }

    /// A savepoint right after `BEGIN IMMEDIATE`, before user code runs.
    /// Sent without waiting for it (the next step reports its error): the
    /// `BEGIN`, the savepoint and the checkpoint read are one round trip.
    async fn guard(&mut self) -> Result<()> {
        self.sql.conn().send(|conn| {
            conn.execute_batch("SAVEPOINT outbox_guard")
                .map_err(|e| engine_error("opening the apply guard", e))
        });
        self.guard = true;
        Ok(())
    }

    /// Releases the savepoint. If user code ended the transaction (committed
    /// it, or swallowed an error after which SQLite rolled it back), the
    /// savepoint is gone and `RELEASE` fails: the store's writes must not then
    /// run in autocommit mode, where a checkpoint would commit without the
    /// projection writes it stands for.
    async fn check_guard(&mut self) -> Result<Option<String>> {
        if !std::mem::take(&mut self.guard) {
            return Ok(Some("the apply guard was never opened".into()));
        }
        // The batch's document writes, inside the guard.
        self.flush_views().await?;
        self.sql
            .conn()
            .run(|conn| {
                Ok(if conn.is_autocommit() {
                    Some("the transaction had ended".to_owned())
                } else {
                    conn.execute_batch("RELEASE outbox_guard")
                        .err()
                        .map(|e| e.to_string())
                })
            })
            .await
    }

    async fn advance(
        &mut self,
        stream: &StreamId,
        moves: &[CheckpointMove<'_>],
        through: u64,
    ) -> Result<u64> {
        // Nothing may stay pending once the checkpoints move.
        self.flush_views().await?;
        let moves: Vec<(String, i64, i64, String, i64)> = moves
            .iter()
            .map(|m| {
                // Fenced by the generation record's epoch (ADR 0021).
                let (fence, epoch) = self.sql.generations().fence(m.projection);
                (
                    m.projection.as_str().to_owned(),
                    int(m.to),
                    int(m.from),
                    fence.as_str().to_owned(),
                    int(epoch),
                )
            })
            .collect();
        let (stream, through) = (stream.as_str().to_owned(), int(through));
        self.sql
            .conn()
            .run(move |conn| {
                let advance = || -> rusqlite::Result<u64> {
                    let mut moved = 0;
                    let mut advance = conn.prepare_cached(ADVANCE_ONE)?;
                    for (projection, to, from, fence, epoch) in &moves {
                        moved += advance.execute(params![projection, stream, to, from, fence, epoch])? as u64;
                    }
                    // A moved checkpoint raises the watermark itself (a
                    // trigger, projection migration 0007): `through` is
                    // every moved checkpoint's new value.
                    if moves.is_empty() {
                        conn.prepare_cached(RAISE_ONE_WATERMARK)?
                            .execute(params![stream, through])?;
                    }
                    Ok(moved)
                };
                advance().map_err(|e| engine_error("advancing checkpoints", e))
            })
            .await
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

    /// One step for every (projection, stream) pair.
    async fn checkpoints_of(
        &mut self,
        streams: &[&StreamId],
        projections: &[&ProjectionName],
    ) -> Result<Vec<Vec<u64>>> {
        let streams: Vec<String> = streams.iter().map(|s| s.as_str().to_owned()).collect();
        let projections: Vec<String> = projections.iter().map(|p| p.as_str().to_owned()).collect();
        self.sql
            .conn()
            .run(move |conn| {
                streams
                    .iter()
                    .map(|s| projections.iter().map(|p| checkpoint(conn, p, s)).collect())
                    .collect::<rusqlite::Result<Vec<Vec<u64>>>>()
                    .map_err(|e| engine_error("reading checkpoints", e))
            })
            .await
    }

    /// One step for every stream at once, after the read of the documents
    /// the pending writes replace: the documents, the checkpoints (each set
    /// only where it still is `from` and the generation epoch is the one
    /// resolved, ADR 0021), whose trigger raises the watermarks, the
    /// watermarks of streams whose checkpoints did not move, and the running
    /// digests. Nothing writes after the checkpoints move, so the digests
    /// are final.
    async fn advance_all(&mut self, advances: &[StreamAdvance<'_>]) -> Result<u64> {
        let dialect = self.dialect();
        let mut views = std::mem::take(self.sql.views());
        let documents = views.prepare_flush(&dialect, self).await;
        let digests = views.take_digests();
        *self.sql.views() = views;
        let documents = documents?;
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
        let changed = self.sql.conn().execute_all(&statements).await?;
        Ok(match moves {
            Some(_) => changed[checkpoints],
            None => 0,
        })
    }
}

/// Sets the checkpoint of (`?1`, `?2`) to `?3` where it still is `?4` and
/// the generation epoch of `?5` is `?6`.
const ADVANCE_ONE: &str = concat!(
    "INSERT INTO outbox_checkpoints (projection, stream, last_applied, updated_at) \
     SELECT ?1, ?2, ?3, ",
    now_ms!(),
    " WHERE COALESCE((SELECT epoch FROM outbox_generations WHERE projection = ?5), 0) = ?6 \
     ON CONFLICT (projection, stream) DO UPDATE SET last_applied = excluded.last_applied, \
     updated_at = excluded.updated_at WHERE outbox_checkpoints.last_applied = ?4"
);

/// Raises the watermark of `?1` to `?2`, never lowering it.
const RAISE_ONE_WATERMARK: &str = concat!(
    "INSERT INTO outbox_watermarks (stream, applied_through, updated_at) VALUES (?1, ?2, ",
    now_ms!(),
    ") ON CONFLICT (stream) DO UPDATE SET applied_through = excluded.applied_through, \
     updated_at = excluded.updated_at WHERE excluded.applied_through > outbox_watermarks.applied_through"
);

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
