//! The projection transaction handle: what appliers write through.

use std::collections::HashMap;
use std::sync::Arc;

use outbox_core::spi::{ApplyTx, CheckpointMove, GenerationMap, StreamAdvance, ViewRow, ViewStorage};
use outbox_core::{Error, ProjectionName, Result, Seq, StreamId, async_trait};
use outbox_sql::generations::GenerationCache;
use outbox_sql::{Arg, Conn, Dialect, Row, SqlTx};
use sqlx::{PgConnection, Postgres, Transaction};

use crate::db::{pnow, storage};
use crate::sql::WriteTx;

/// One transaction of the Postgres projection database (read committed for
/// an apply or a reset, a repeatable-read snapshot for a digest).
///
/// Backend-neutral projections ([`ViewProjection`](outbox_core::ViewProjection))
/// use it through its [`ViewStorage`](outbox_core::spi::ViewStorage) implementation without knowing it is
/// Postgres. A hand-written projection (`Projection<PgTx>`, the escape
/// hatch) runs its own SQL on the connection: `tx.conn()`, or `&mut **tx`
/// through `DerefMut`. It must not commit, roll back or keep it.
pub struct PgTx {
    /// The driver's transaction, the live generations and the pending
    /// document writes, as every SQL dialect keeps them.
    sql: SqlTx<WriteTx>,
    /// The transaction id the apply guard took.
    guard: Option<i64>,
}

impl PgTx {
    pub(crate) fn new(tx: Transaction<'static, Postgres>, dialect: Arc<Dialect>) -> Self {
        PgTx {
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
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.sql.conn().0
    }
}

impl std::fmt::Debug for PgTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PgTx")
    }
}

impl std::ops::Deref for PgTx {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.sql.conn_ref().0
    }
}

impl std::ops::DerefMut for PgTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn()
    }
}

/// The shared statements run on the store's transaction (setup, reset,
/// digests, skip records).
#[async_trait]
impl Conn for PgTx {
    async fn execute(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        crate::sql::execute(self.conn(), what, sql, args).await
    }

    async fn fetch(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        crate::sql::fetch(self.conn(), what, sql, args).await
    }
}

/// The document writes of [`SqlTx`], the same on every SQL dialect.
#[async_trait]
impl ViewStorage for PgTx {
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

/// Advances checkpoints by compare-and-set (`$2` names, `$3` new, `$4`
/// old values on stream `$1`, each fenced by the generation record `$6` at
/// epoch `$7`, ADR 0021: the record is share-locked, so a swap waits for
/// this transaction, and a swap committed first fails the compare) and
/// raises the watermark to `$5`; returns how many checkpoints moved.
pub(crate) const APPLY_CAS: &str = concat!(
    "WITH cas AS (UPDATE outbox_checkpoints c SET last_applied = x.new, updated_at = ",
    pnow!(),
    " FROM unnest($2::text[], $3::bigint[], $4::bigint[], $6::text[], $7::bigint[]) AS x(p, new, old, f, e) \
               WHERE c.projection = x.p AND c.stream = $1 AND c.last_applied = x.old \
               AND COALESCE((SELECT g.epoch FROM outbox_generations g WHERE g.projection = x.f FOR SHARE), 0) = x.e \
               RETURNING 1), \
             wm AS (INSERT INTO outbox_watermarks AS w (stream, applied_through, updated_at) VALUES ($1, $5, ",
    pnow!(),
    ") ON CONFLICT (stream) DO UPDATE SET applied_through = excluded.applied_through, \
               updated_at = excluded.updated_at WHERE excluded.applied_through > w.applied_through) \
             SELECT count(*) FROM cas"
);

/// Locks checkpoints of projections `$2` on stream `$1`, in name order.
pub(crate) const LOCK_CHECKPOINTS: &str = "SELECT projection, last_applied FROM outbox_checkpoints \
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

/// [`APPLY_CAS`] for several streams: checkpoints by compare-and-set
/// (`$1` streams, `$2` names, `$3` new, `$4` old values, `$7` fencing
/// records and `$8` their epochs, one element per move) and watermarks raised (`$5` streams, `$6` seqs, in stream order);
/// returns how many checkpoints moved.
pub(crate) const APPLY_CAS_ALL: &str = concat!(
    "WITH cas AS (UPDATE outbox_checkpoints c SET last_applied = x.new, updated_at = ",
    pnow!(),
    " FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $7::text[], $8::bigint[]) \
                 AS x(s, p, new, old, f, e) \
               WHERE c.projection = x.p AND c.stream = x.s AND c.last_applied = x.old \
               AND COALESCE((SELECT g.epoch FROM outbox_generations g WHERE g.projection = x.f FOR SHARE), 0) = x.e \
               RETURNING 1), \
             wm AS (INSERT INTO outbox_watermarks AS w (stream, applied_through, updated_at) \
               SELECT m.s, m.t, ",
    pnow!(),
    " FROM unnest($5::text[], $6::bigint[]) AS m(s, t) ORDER BY m.s \
               ON CONFLICT (stream) DO UPDATE SET applied_through = excluded.applied_through, \
               updated_at = excluded.updated_at WHERE excluded.applied_through > w.applied_through) \
             SELECT count(*) FROM cas"
);

/// Locks the checkpoints of the (stream, projection) pairs `$1`, `$2`, in
/// (stream, projection) order.
const LOCK_CHECKPOINTS_OF: &str = "SELECT stream, projection, last_applied FROM outbox_checkpoints \
     WHERE (stream, projection) IN (SELECT * FROM unnest($1::text[], $2::text[])) \
     ORDER BY stream, projection FOR UPDATE";

/// [`lock_checkpoints`] for several streams at once: every (stream,
/// projection) pair locked in that order, missing ones created at 0.
async fn lock_checkpoints_of(
    conn: &mut PgConnection,
    streams: &[&str],
    names: &[&str],
) -> sqlx::Result<HashMap<(String, String), i64>> {
    let mut pairs: Vec<(&str, &str)> = streams
        .iter()
        .flat_map(|s| names.iter().map(move |p| (*s, *p)))
        .collect();
    pairs.sort_unstable();
    let (ss, ps): (Vec<&str>, Vec<&str>) = pairs.iter().copied().unzip();
    let found: Vec<(String, String, i64)> = sqlx::query_as(LOCK_CHECKPOINTS_OF)
        .bind(&ss)
        .bind(&ps)
        .fetch_all(&mut *conn)
        .await?;
    let mut cps: HashMap<(String, String), i64> = found.into_iter().map(|(s, p, cp)| ((s, p), cp)).collect();
    if cps.len() < pairs.len() {
        let missing: Vec<(&str, &str)> = pairs
            .iter()
            .copied()
            .filter(|(s, p)| !cps.contains_key(&((*s).to_owned(), (*p).to_owned())))
            .collect();
        let (ms, mp): (Vec<&str>, Vec<&str>) = missing.into_iter().unzip();
        // As in `lock_checkpoints`: a concurrent first apply makes this
        // wait for its commit and insert nothing; the lock reads it.
        sqlx::query(concat!(
            "INSERT INTO outbox_checkpoints (projection, stream, last_applied, updated_at) \
             SELECT p, s, 0, ",
            pnow!(),
            " FROM unnest($1::text[], $2::text[]) AS u(s, p) ORDER BY s, p \
             ON CONFLICT (projection, stream) DO NOTHING"
        ))
        .bind(&ms)
        .bind(&mp)
        .execute(&mut *conn)
        .await?;
        let more: Vec<(String, String, i64)> = sqlx::query_as(LOCK_CHECKPOINTS_OF)
            .bind(&ms)
            .bind(&mp)
            .fetch_all(&mut *conn)
            .await?;
        cps.extend(more.into_iter().map(|(s, p, cp)| ((s, p), cp)));
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
        self.guard = Some(xid);
        Ok(())
    }

    /// Checks that the transaction of [`ApplyTx::guard`] is still the one open
    /// on the connection. If user code ended it (`COMMIT` or `ROLLBACK`,
    /// possibly followed by a `BEGIN`), the connection is in autocommit mode
    /// or in another transaction, whose id is unassigned or different; if it
    /// swallowed an error, Postgres aborted the transaction and the check
    /// itself fails with `25P02`.
    async fn check_guard(&mut self) -> Result<Option<String>> {
        let xid = self.guard;
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
        // The batch's document writes first (write-behind, ADR 0019).
        self.flush_views().await?;
        let names: Vec<&str> = moves.iter().map(|m| m.projection.as_str()).collect();
        let to: Vec<i64> = moves
            .iter()
            .map(|m| i64::try_from(m.to).unwrap_or(i64::MAX))
            .collect();
        let from: Vec<i64> = moves
            .iter()
            .map(|m| i64::try_from(m.from).unwrap_or(i64::MAX))
            .collect();
        let generations = std::sync::Arc::clone(self.sql.generations());
        let (fences, epochs): (Vec<&str>, Vec<i64>) = moves
            .iter()
            .map(|m| {
                let (f, e) = generations.fence(m.projection);
                (f.as_str(), i64::try_from(e).unwrap_or(i64::MAX))
            })
            .unzip();
        let moved: i64 = sqlx::query_scalar(APPLY_CAS)
            .bind(stream.as_str())
            .bind(&names)
            .bind(&to)
            .bind(&from)
            .bind(i64::try_from(through).unwrap_or(i64::MAX))
            .bind(&fences)
            .bind(&epochs)
            .fetch_one(self.conn())
            .await
            .map_err(|e| storage("advancing checkpoints", e))?;
        Ok(u64::try_from(moved).unwrap_or(0))
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

    /// Every stream's checkpoints locked in one statement (two more the
    /// first time a pair is seen), in (stream, projection) order.
    async fn checkpoints_of(
        &mut self,
        streams: &[&StreamId],
        projections: &[&ProjectionName],
    ) -> Result<Vec<Vec<u64>>> {
        if projections.is_empty() || streams.is_empty() {
            return Ok(streams.iter().map(|_| Vec::new()).collect());
        }
        let ss: Vec<&str> = streams.iter().map(|s| s.as_str()).collect();
        let ps: Vec<&str> = projections.iter().map(|p| p.as_str()).collect();
        let locked = lock_checkpoints_of(self.conn(), &ss, &ps)
            .await
            .map_err(|e| storage("locking checkpoints", e))?;
        Ok(ss
            .iter()
            .map(|s| {
                ps.iter()
                    .map(|p| {
                        let cp = locked
                            .get(&((*s).to_owned(), (*p).to_owned()))
                            .copied()
                            .unwrap_or(0);
                        u64::try_from(cp).unwrap_or(0)
                    })
                    .collect()
            })
            .collect())
    }

    /// Every stream's checkpoints and watermark in one statement.
    async fn advance_all(&mut self, advances: &[StreamAdvance<'_>]) -> Result<u64> {
        self.flush_views().await?;
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let (mut ss, mut ps, mut to, mut from) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut fences, mut epochs) = (Vec::new(), Vec::new());
        let generations = std::sync::Arc::clone(self.sql.generations());
        for a in advances {
            for m in &a.moves {
                ss.push(a.stream.as_str());
                ps.push(m.projection.as_str());
                to.push(int(m.to));
                from.push(int(m.from));
                let (f, e) = generations.fence(m.projection);
                fences.push(f.as_str());
                epochs.push(int(e));
            }
        }
        let (ws, wt): (Vec<&str>, Vec<i64>) = advances
            .iter()
            .map(|a| (a.stream.as_str(), int(a.through)))
            .unzip();
        let moved: i64 = sqlx::query_scalar(APPLY_CAS_ALL)
            .bind(&ss)
            .bind(&ps)
            .bind(&to)
            .bind(&from)
            .bind(&ws)
            .bind(&wt)
            .bind(&fences)
            .bind(&epochs)
            .fetch_one(self.conn())
            .await
            .map_err(|e| storage("advancing checkpoints", e))?;
        Ok(u64::try_from(moved).unwrap_or(0))
    }
}
