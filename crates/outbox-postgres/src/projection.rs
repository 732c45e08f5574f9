//! The projection database: checkpoints, watermarks and the user's tables.

use std::collections::HashMap;
use std::sync::Arc;

use outbox_core::{
    ApplyOutcome, ApplyReport, BoxError, Digest, DigestBuilder, DigestValue, Error, Event, Intent, MAX_PAGE,
    Projection, ProjectionName, ProjectionStore, Result, StoredWatermark, StreamId, Watermark,
    WatermarkStore, plan_apply, projection_names, validate_limit, validate_projection_names, validate_run,
};
use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{AssertSqlSafe, PgConnection, Row, TypeInfo, ValueRef};

use crate::db::{Db, Role, parse_url, pnow, storage};
use crate::tx::{self, PgTx};
use crate::{PgJournal, PgOptions, validate_identifier};

/// The Postgres projection database: implements [`ProjectionStore`]
/// (appliers write through a [`PgTx`], inside the store's transaction),
/// [`WatermarkStore`], [`ViewStore`](outbox_core::ViewStore) and
/// [`RunStore`](outbox_core::RunStore) (replay and rebuild runs in
/// `outbox_runs`).
///
/// The projection tables, the `(projection, stream)` checkpoints and the
/// watermarks live in one schema (the connections' `search_path`), so an
/// apply commits them together. Concurrent applies of the same (projection,
/// stream), from any number of processes, serialize on the checkpoint rows
/// (`SELECT ... FOR UPDATE`, taken in projection-name order), and each
/// checkpoint advances by compare-and-set. Clones share the pool.
#[derive(Clone, Debug)]
pub struct PgProjectionStore {
    pub(crate) db: Arc<Db>,
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

/// The store's transaction id, assigned now if it was not yet: taken right
/// before user code (appliers, `Projection::reset`) runs on the store's
/// transaction. See [`check_guard`].
async fn open_guard(conn: &mut PgConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT txid_current()")
        .fetch_one(&mut *conn)
        .await
}

/// Checks, after the user code and before the store's own writes
/// (checkpoints, watermark, checkpoint deletion), that the transaction of
/// [`open_guard`] is still the one open on the connection. If the user code
/// ended it (`COMMIT` or `ROLLBACK`, possibly followed by a `BEGIN`), the
/// connection is in autocommit mode or in another transaction, whose id is
/// unassigned or different, and the store's writes must not run: a checkpoint
/// would commit without the projection writes it stands for. If it swallowed
/// an error, Postgres aborted the transaction and the check itself fails
/// with `25P02`. Both are a permanent [`Error::Storage`].
async fn check_guard(
    conn: &mut PgConnection,
    xid: i64,
    stream: Option<&StreamId>,
    projections: &str,
) -> Result<()> {
    let ended = |detail: String| {
        let on = stream.map(|s| format!(" on stream {s}")).unwrap_or_default();
        Error::Storage {
            message: format!(
                "the transaction of projection(s) {projections}{on} was ended by the projection (it \
                 committed or rolled back the store's transaction, or swallowed an error after which \
                 Postgres aborted it); no checkpoint was moved{detail}"
            ),
            temporary: false,
            source: None,
        }
    };
    match sqlx::query_scalar::<_, Option<i64>>("SELECT txid_current_if_assigned()")
        .fetch_one(&mut *conn)
        .await
    {
        Ok(Some(now)) if now == xid => Ok(()),
        Ok(_) => Err(ended(String::new())),
        Err(sqlx::Error::Database(d)) if d.code().as_deref() == Some("25P02") => {
            Err(ended(format!(": {}", d.message())))
        }
        Err(e) => Err(storage("applying events", e)),
    }
}

impl PgProjectionStore {
    /// Connects to the database at `url`, creates the schema named by
    /// [`PgOptions::schema`] if missing and applies the projection
    /// migrations. Refuses the same inputs as
    /// [`PgJournal::connect`](crate::PgJournal::connect).
    pub async fn connect(url: &str, options: PgOptions) -> Result<Self> {
        Self::connect_with(parse_url(url)?, options).await
    }

    /// [`PgProjectionStore::connect`] with parsed connection options.
    pub async fn connect_with(connect: PgConnectOptions, options: PgOptions) -> Result<Self> {
        let db = Db::pool(connect, &options)?;
        if let Err(e) = db.migrate(Role::Projection).await {
            db.close().await;
            return Err(e);
        }
        Ok(PgProjectionStore { db: Arc::new(db) })
    }

    /// The projection store in the journal's own database and schema,
    /// sharing its pool (the "one database" deployment). Applies the
    /// projection migrations to that schema. Exactly-once still never relies
    /// on the two committing together.
    pub async fn sharing(journal: &PgJournal) -> Result<Self> {
        let db = Arc::clone(journal.db());
        db.migrate(Role::Projection).await?;
        Ok(PgProjectionStore { db })
    }

    /// The pool (its connections use the store's schema as `search_path`),
    /// for the application's own queries of its projection tables.
    pub fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    /// The schema holding the projection tables.
    pub fn schema(&self) -> &str {
        &self.db.schema
    }

    /// Closes the pool of this instance and its clones (and of a journal
    /// sharing it).
    pub async fn close(&self) {
        self.db.close().await;
    }

    #[cfg(feature = "test-util")]
    /// Test support: moves this schema's projection clock forward by `d`.
    /// See [`PgJournal::advance_clock_for_tests`].
    #[doc(hidden)]
    pub async fn advance_clock_for_tests(&self, d: std::time::Duration) -> Result<()> {
        self.db
            .advance_clock(Role::Projection, outbox_core::duration_millis(d))
            .await
    }
}

impl ProjectionStore for PgProjectionStore {
    type Tx = PgTx;

    async fn setup(&self, projections: &[Arc<dyn Projection<PgTx>>]) -> Result<()> {
        validate_projection_names(projections)?;
        let mut tx = PgTx::new(self.db.begin().await?);
        // Concurrent setups of the same tables would race on CREATE TABLE IF
        // NOT EXISTS (a unique violation in the catalog): serialize them.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('outbox.setup.' || current_schema(), 0))")
            .execute(tx.conn())
            .await
            .map_err(|e| storage("setting up projections", e))?;
        for p in projections {
            p.setup(&mut tx).await.map_err(|e| {
                Error::storage(format!("setting up projection `{}` failed: {e}", p.name()), e)
            })?;
        }
        tx.commit()
            .await
            .map_err(|e| storage(self.db.context("setting up projections"), e))
    }

    async fn apply(
        &self,
        stream: &StreamId,
        events: &[Event],
        projections: &[Arc<dyn Projection<PgTx>>],
    ) -> Result<ApplyOutcome> {
        validate_run(stream, events)?;
        validate_projection_names(projections)?;
        let err = |e| storage("applying events", e);
        let mut tx = PgTx::new(self.db.begin().await?);
        // Lock every checkpoint of the run first, in name order: a concurrent
        // apply of the same (projection, stream) waits here, then sees what
        // this one committed and skips it as duplicates.
        let mut names: Vec<&str> = projections.iter().map(|p| p.name().as_str()).collect();
        names.sort_unstable();
        let locked = if names.is_empty() {
            HashMap::new()
        } else {
            lock_checkpoints(tx.conn(), stream.as_str(), &names)
                .await
                .map_err(err)?
        };
        let mut read = Vec::with_capacity(projections.len());
        for p in projections {
            let cp = u64::try_from(locked.get(p.name().as_str()).copied().unwrap_or(0)).unwrap_or(0);
            if let Err(gap) = plan_apply(p.name(), cp, events) {
                // Dropping the transaction rolls it back: nothing written.
                return Ok(ApplyOutcome::Gap(gap));
            }
            read.push(cp);
        }
        let mut current = read.clone();
        let mut report = ApplyReport::default();
        // Taken before the first applier runs (none may run: duplicates and
        // audit-only events only), checked after the last.
        let mut guard = None;
        for e in events {
            let mut new_to_some = projections.is_empty();
            for (p, cp) in projections.iter().zip(current.iter_mut()) {
                if e.seq.get() <= *cp {
                    continue;
                }
                if e.intent == Intent::Apply {
                    if guard.is_none() {
                        guard = Some(open_guard(tx.conn()).await.map_err(err)?);
                    }
                    p.apply(&mut tx, e)
                        .await
                        .map_err(|source: BoxError| Error::Apply {
                            projection: p.name().to_string(),
                            stream: e.stream.clone(),
                            seq: e.seq,
                            source,
                        })?;
                }
                *cp = e.seq.get();
                new_to_some = true;
            }
            report.count(e, new_to_some);
        }
        if let Some(xid) = guard {
            check_guard(tx.conn(), xid, Some(stream), &projection_names(projections)).await?;
        }
        let mut moved_names = Vec::new();
        let mut moved_new = Vec::new();
        let mut moved_old = Vec::new();
        for ((p, old), new) in projections.iter().zip(&read).zip(&current) {
            if new != old {
                moved_names.push(p.name().as_str());
                moved_new.push(i64::try_from(*new).unwrap_or(i64::MAX));
                moved_old.push(i64::try_from(*old).unwrap_or(i64::MAX));
            }
        }
        let last = events[events.len() - 1].seq.as_i64();
        // Compare-and-set every moved checkpoint against the value read, and
        // raise the watermark, in one statement. The rows are locked, so a
        // miss means the database was changed behind the lock; refuse rather
        // than risk a double apply.
        let changed: i64 = sqlx::query_scalar(APPLY_CAS)
            .bind(stream.as_str())
            .bind(&moved_names)
            .bind(&moved_new)
            .bind(&moved_old)
            .bind(last)
            .fetch_one(tx.conn())
            .await
            .map_err(err)?;
        if changed != moved_names.len() as i64 {
            return Err(Error::Storage {
                message: format!(
                    "a checkpoint on stream {stream} moved during the apply transaction; nothing was committed"
                ),
                temporary: true,
                source: None,
            });
        }
        tx.commit()
            .await
            .map_err(|e| storage(self.db.context("applying events"), e))?;
        Ok(ApplyOutcome::Applied(report))
    }

    async fn checkpoint(&self, projection: &ProjectionName, stream: &StreamId) -> Result<u64> {
        let cp: Option<i64> = sqlx::query_scalar(
            "SELECT last_applied FROM outbox_checkpoints WHERE projection = $1 AND stream = $2",
        )
        .bind(projection.as_str())
        .bind(stream.as_str())
        .fetch_optional(&self.db.pool)
        .await
        .map_err(|e| storage(self.db.context("reading a checkpoint"), e))?;
        Ok(u64::try_from(cp.unwrap_or(0)).unwrap_or(0))
    }

    async fn reset(&self, projection: &dyn Projection<PgTx>) -> Result<()> {
        let mut tx = PgTx::new(self.db.begin().await?);
        // Lock the projection's checkpoints first so a concurrent apply
        // either finishes before the reset or starts after it.
        sqlx::query("SELECT 1 FROM outbox_checkpoints WHERE projection = $1 ORDER BY stream FOR UPDATE")
            .bind(projection.name().as_str())
            .fetch_all(tx.conn())
            .await
            .map_err(|e| storage("resetting checkpoints", e))?;
        let xid = open_guard(tx.conn())
            .await
            .map_err(|e| storage("resetting checkpoints", e))?;
        projection.reset(&mut tx).await.map_err(|e| {
            Error::storage(
                format!("resetting projection `{}` failed: {e}", projection.name()),
                e,
            )
        })?;
        check_guard(tx.conn(), xid, None, &format!("`{}`", projection.name())).await?;
        sqlx::query("DELETE FROM outbox_checkpoints WHERE projection = $1")
            .bind(projection.name().as_str())
            .execute(tx.conn())
            .await
            .map_err(|e| storage("resetting checkpoints", e))?;
        tx.commit()
            .await
            .map_err(|e| storage(self.db.context("resetting a projection"), e))
    }

    async fn digest(&self, projection: &dyn Projection<PgTx>) -> Result<Digest> {
        let err = |e| storage(self.db.context("digesting a projection"), e);
        // One snapshot: the tables and the checkpoints agree.
        let mut tx = PgTx::new(
            self.db
                .pool
                .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .await
                .map_err(err)?,
        );
        let mut out = DigestBuilder::new();
        projection.digest(&mut tx, &mut out).await.map_err(|e| {
            Error::storage(
                format!("digest of projection `{}` failed: {e}", projection.name()),
                e,
            )
        })?;
        // Checkpoints at 0 are placeholders equal to "never applied".
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT stream, last_applied FROM outbox_checkpoints \
             WHERE projection = $1 AND last_applied > 0 ORDER BY stream",
        )
        .bind(projection.name().as_str())
        .fetch_all(tx.conn())
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        // Same framing as the other adapters, so equal states digest equally.
        out.table("checkpoints");
        for (stream, cp) in &rows {
            out.row(&[DigestValue::Text(stream), DigestValue::Int(*cp)]);
        }
        Ok(out.finish())
    }
}

impl WatermarkStore for PgProjectionStore {
    async fn watermark(&self, stream: &StreamId) -> Result<Option<Watermark>> {
        let row: Option<(String, i64, i64)> = sqlx::query_as(
            "SELECT stream, applied_through, updated_at FROM outbox_watermarks WHERE stream = $1",
        )
        .bind(stream.as_str())
        .fetch_optional(&self.db.pool)
        .await
        .map_err(|e| storage(self.db.context("reading a watermark"), e))?;
        row.map(|w| StoredWatermark::from(w).into_watermark()).transpose()
    }

    async fn watermarks(&self, after: Option<&StreamId>, limit: usize) -> Result<Vec<Watermark>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT stream, applied_through, updated_at FROM outbox_watermarks \
             WHERE stream > $1 ORDER BY stream LIMIT $2",
        )
        .bind(after.map_or("", StreamId::as_str))
        .bind(limit as i64)
        .fetch_all(&self.db.pool)
        .await
        .map_err(|e| storage(self.db.context("listing watermarks"), e))?;
        rows.into_iter()
            .map(|w| StoredWatermark::from(w).into_watermark())
            .collect()
    }
}

/// Feeds every row of `table` (in the connection's `search_path`) into
/// `out`, ordered by all its columns (`ORDER BY 1, 2, ...`, so the order is
/// total and deterministic). Integers and booleans become
/// [`DigestValue::Int`], floating point [`DigestValue::Real`], `bytea`
/// [`DigestValue::Blob`], and every other type its text form. The usual body
/// of a Postgres projection's [`Projection::digest`].
///
/// `table` must pass [`validate_identifier`] and exist.
pub async fn digest_table(conn: &mut PgConnection, table: &str, out: &mut DigestBuilder) -> Result<()> {
    validate_identifier(table)?;
    let err = |e| storage(format_args!("digesting table {table}"), e);
    let columns: Vec<(String, String)> = sqlx::query_as(
        "SELECT a.attname::text, format_type(a.atttypid, NULL) FROM pg_attribute a \
         WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
    )
    .bind(table)
    .fetch_all(&mut *conn)
    .await
    .map_err(err)?;
    if columns.is_empty() {
        return Err(Error::invalid(format_args!("table {table} does not exist")));
    }
    // Column names come from the catalog; quote them (doubling quotes).
    let select: Vec<String> = columns
        .iter()
        .map(|(name, ty)| {
            let quoted = format!("\"{}\"", name.replace('"', "\"\""));
            match ty.as_str() {
                "smallint" | "integer" | "bigint" | "double precision" | "real" | "bytea" | "text" => quoted,
                "boolean" => format!("{quoted}::int8"),
                _ => format!("{quoted}::text"),
            }
        })
        .collect();
    let order: Vec<String> = (1..=columns.len()).map(|i| i.to_string()).collect();
    let sql = format!(
        "SELECT {} FROM {table} ORDER BY {}",
        select.join(", "),
        order.join(", ")
    );
    let rows = sqlx::query(AssertSqlSafe(sql))
        .fetch_all(&mut *conn)
        .await
        .map_err(err)?;
    out.table(table);
    enum Owned {
        Null,
        Int(i64),
        Real(f64),
        Text(String),
        Blob(Vec<u8>),
    }
    for row in &rows {
        let mut values = Vec::with_capacity(row.len());
        for i in 0..row.len() {
            let raw = row.try_get_raw(i).map_err(err)?;
            let v = if raw.is_null() {
                Owned::Null
            } else {
                match raw.type_info().name() {
                    "INT2" => Owned::Int(i64::from(row.try_get::<i16, _>(i).map_err(err)?)),
                    "INT4" => Owned::Int(i64::from(row.try_get::<i32, _>(i).map_err(err)?)),
                    "INT8" => Owned::Int(row.try_get(i).map_err(err)?),
                    "FLOAT4" => Owned::Real(f64::from(row.try_get::<f32, _>(i).map_err(err)?)),
                    "FLOAT8" => Owned::Real(row.try_get(i).map_err(err)?),
                    "BYTEA" => Owned::Blob(row.try_get(i).map_err(err)?),
                    _ => Owned::Text(row.try_get(i).map_err(err)?),
                }
            };
            values.push(v);
        }
        let borrowed: Vec<DigestValue<'_>> = values
            .iter()
            .map(|v| match v {
                Owned::Null => DigestValue::Null,
                Owned::Int(i) => DigestValue::Int(*i),
                Owned::Real(r) => DigestValue::Real(*r),
                Owned::Text(t) => DigestValue::Text(t),
                Owned::Blob(b) => DigestValue::Blob(b),
            })
            .collect();
        out.row(&borrowed);
    }
    Ok(())
}

impl outbox_core::ViewStore for PgProjectionStore {
    async fn view_get(&self, projection: &ProjectionName, table: &str, key: &str) -> Result<Option<String>> {
        sqlx::query_scalar("SELECT value FROM outbox_views WHERE projection = $1 AND tbl = $2 AND key = $3")
            .bind(projection.as_str())
            .bind(table)
            .bind(key)
            .fetch_optional(&self.db.pool)
            .await
            .map_err(|e| storage(self.db.context("reading a view document"), e))
    }

    async fn view_scan(
        &self,
        projection: &ProjectionName,
        table: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, String)>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let mut conn = self
            .db
            .pool
            .acquire()
            .await
            .map_err(|e| storage(self.db.context("scanning a view table"), e))?;
        tx::scan(&mut conn, projection, table, after, limit).await
    }
}
