//! The projection database: checkpoints, watermarks and the user's tables.

use std::sync::Arc;

use outbox_core::spi::{all_applied, apply_in, apply_runs_in};
use outbox_core::{
    ApplyOutcome, Digest, DigestBuilder, Error, Event, GenerationInfo, GenerationStore, Projection,
    ProjectionName, ProjectionStore, Result, StoredGeneration, StreamId, SwapCheck, SwapOutcome, ViewDigest,
    ViewDigestCheck, ViewStore, Watermark, WatermarkStore,
};
use sqlx::PgConnection;
use sqlx::postgres::{PgConnectOptions, PgPool};

use crate::db::{Db, Role, parse_url, pnow, storage};
use crate::sql::RoleDb;
use crate::tx::PgTx;
use crate::{PgJournal, PgOptions, validate_identifier};
use outbox_sql::SqlProjections;

/// The Postgres projection database: implements [`ProjectionStore`]
/// (appliers write through a [`PgTx`], inside the store's transaction),
/// [`WatermarkStore`](outbox_core::WatermarkStore), [`ViewStore`](outbox_core::ViewStore) and
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
    /// The shared cold-path ports on this schema, with the projection
    /// role's clock, and the live generations apply transactions reuse
    /// (ADR 0021).
    pub(crate) sql: SqlProjections<RoleDb>,
}

impl PgProjectionStore {
    fn from_db(db: Arc<Db>) -> Self {
        PgProjectionStore {
            sql: SqlProjections::new(Arc::new(RoleDb::new(Arc::clone(&db), pnow!()))),
            db,
        }
    }

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
        Ok(PgProjectionStore::from_db(Arc::new(db)))
    }

    /// The projection store in the journal's own database and schema,
    /// sharing its pool (the "one database" deployment). Applies the
    /// projection migrations to that schema. Exactly-once still never relies
    /// on the two committing together.
    pub async fn sharing(journal: &PgJournal) -> Result<Self> {
        let db = Arc::clone(journal.db());
        db.migrate(Role::Projection).await?;
        Ok(PgProjectionStore::from_db(db))
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
            .advance_clock(Role::Projection, outbox_core::spi::duration_millis(d))
            .await
    }
}

impl PgProjectionStore {
    /// A read-committed transaction; `cached` reuses the live generations
    /// the last apply resolved (an apply fenced by their epoch), otherwise
    /// they are read now (setup, reset).
    async fn begin(&self, cached: bool) -> Result<PgTx> {
        let mut tx = PgTx::new(self.db.begin().await?, self.sql.database().dialect.clone());
        tx.resolve_generations(cached.then_some(self.sql.generation_cache()))
            .await?;
        Ok(tx)
    }

    /// Forgets the cached live generations after a failed apply: a swap
    /// makes an apply with the old ones fail, and the retry reads them again.
    fn forget_generations<T>(&self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            self.sql.generation_cache().invalidate();
        }
        result
    }
}

impl ProjectionStore for PgProjectionStore {
    type Tx = PgTx;

    async fn setup(&self, projections: &[Arc<dyn Projection<PgTx>>]) -> Result<()> {
        let mut tx = self.begin(false).await?;
        outbox_sql::projection::setup_in(&self.sql.database().dialect, &mut tx, projections).await?;
        tx.commit(|e| storage(self.db.context("setting up projections"), e))
            .await
    }

    async fn apply(
        &self,
        stream: &StreamId,
        events: &[Event],
        projections: &[Arc<dyn Projection<PgTx>>],
    ) -> Result<ApplyOutcome> {
        self.forget_generations(
            async {
                let mut tx = self.begin(true).await?;
                let outcome = apply_in(&mut tx, stream, events, projections).await?;
                if matches!(outcome, ApplyOutcome::Applied(_)) {
                    tx.commit(|e| storage(self.db.context("applying events"), e))
                        .await?;
                }
                // Otherwise dropping the transaction rolls it back: nothing written.
                Ok(outcome)
            }
            .await,
        )
    }

    async fn apply_runs(
        &self,
        runs: &[&[Event]],
        projections: &[Arc<dyn Projection<PgTx>>],
    ) -> Result<Vec<ApplyOutcome>> {
        self.forget_generations(
            async {
                let mut tx = self.begin(true).await?;
                let outcomes = apply_runs_in(&mut tx, runs, projections).await?;
                if all_applied(&outcomes, runs.len()) {
                    tx.commit(|e| storage(self.db.context("applying events"), e))
                        .await?;
                }
                Ok(outcomes)
            }
            .await,
        )
    }

    async fn checkpoint(&self, projection: &ProjectionName, stream: &StreamId) -> Result<u64> {
        outbox_sql::projection::checkpoint(self.sql.database(), projection, stream).await
    }

    async fn reset(&self, projection: &dyn Projection<PgTx>) -> Result<()> {
        let mut tx = self.begin(false).await?;
        outbox_sql::projection::reset_in(&self.sql.database().dialect, &mut tx, projection).await?;
        tx.commit(|e| storage(self.db.context("resetting a projection"), e))
            .await
    }

    async fn digest(&self, projection: &dyn Projection<PgTx>) -> Result<Digest> {
        let err = |e| storage(self.db.context("digesting a projection"), e);
        // One snapshot: the documents, tables and checkpoints agree.
        let tx = self
            .db
            .pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .await
            .map_err(err)?;
        let mut tx = PgTx::new(tx, self.sql.database().dialect.clone());
        tx.resolve_generations(None).await?;
        let digest =
            outbox_sql::projection::digest_in(&self.sql.database().dialect, &mut tx, projection).await?;
        tx.commit(err).await?;
        Ok(digest)
    }
}

/// Feeds every row of `table` (in the connection's `search_path`) into
/// `out`, ordered by all its columns (`ORDER BY 1, 2, ...`, so the order is
/// total and deterministic). Integers and booleans become
/// [`DigestValue::Int`](outbox_core::DigestValue::Int), floating point [`DigestValue::Real`](outbox_core::DigestValue::Real), `bytea`
/// [`DigestValue::Blob`](outbox_core::DigestValue::Blob), and every other type its text form. The usual body
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
    let rows = crate::sql::fetch(conn, &format!("digesting table {table}"), &sql, &[]).await?;
    outbox_sql::digest_rows(out, table, &rows);
    Ok(())
}

impl outbox_core::SkippedEvents for PgProjectionStore {
    async fn skipped(
        &self,
        projection: Option<&ProjectionName>,
        limit: usize,
    ) -> Result<Vec<outbox_core::SkippedEvent>> {
        outbox_sql::skipped::skipped(self.sql.database(), projection, limit).await
    }

    async fn reapply(&self, event: &Event, projection: &Arc<dyn Projection<PgTx>>) -> Result<bool> {
        let mut tx = self.begin(false).await?;
        let done = outbox_core::spi::reapply_in(&mut tx, event, projection).await?;
        if done {
            tx.commit(|e| storage(self.db.context("re-applying a skipped event"), e))
                .await?;
        }
        Ok(done)
    }
}

// The cold-path ports: the shared statements of `SqlProjections`, on
// this schema with the projection role's clock.

impl ViewStore for PgProjectionStore {
    fn view_get(
        &self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        ViewStore::view_get(&self.sql, projection, table, key)
    }

    fn view_scan(
        &self,
        projection: &ProjectionName,
        table: &str,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, String)>>> + Send {
        ViewStore::view_scan(&self.sql, projection, table, after, limit)
    }

    fn view_digests(&self) -> impl Future<Output = Result<Vec<ViewDigest>>> + Send {
        ViewStore::view_digests(&self.sql)
    }

    fn verify_view_digest(
        &self,
        projection: &ProjectionName,
    ) -> impl Future<Output = Result<ViewDigestCheck>> + Send {
        ViewStore::verify_view_digest(&self.sql, projection)
    }
}

impl GenerationStore for PgProjectionStore {
    fn generation(
        &self,
        projection: &ProjectionName,
    ) -> impl Future<Output = Result<Option<GenerationInfo>>> + Send {
        GenerationStore::generation(&self.sql, projection)
    }

    fn generations(&self) -> impl Future<Output = Result<Vec<GenerationInfo>>> + Send {
        GenerationStore::generations(&self.sql)
    }

    fn begin_generation(
        &self,
        projection: &ProjectionName,
        live_version: u32,
        version: u32,
    ) -> impl Future<Output = Result<GenerationInfo>> + Send {
        GenerationStore::begin_generation(&self.sql, projection, live_version, version)
    }

    fn record_build_position(
        &self,
        projection: &ProjectionName,
        generation: u32,
        position: u64,
    ) -> impl Future<Output = Result<()>> + Send {
        GenerationStore::record_build_position(&self.sql, projection, generation, position)
    }

    fn swap_generation(
        &self,
        projection: &ProjectionName,
        generation: u32,
        check: SwapCheck,
    ) -> impl Future<Output = Result<SwapOutcome>> + Send {
        GenerationStore::swap_generation(&self.sql, projection, generation, check)
    }

    fn drop_generation(
        &self,
        projection: &ProjectionName,
        generation: u32,
    ) -> impl Future<Output = Result<u64>> + Send {
        GenerationStore::drop_generation(&self.sql, projection, generation)
    }

    fn stored_generations(
        &self,
        projection: &ProjectionName,
    ) -> impl Future<Output = Result<Vec<StoredGeneration>>> + Send {
        GenerationStore::stored_generations(&self.sql, projection)
    }
}

impl WatermarkStore for PgProjectionStore {
    fn watermark(&self, stream: &StreamId) -> impl Future<Output = Result<Option<Watermark>>> + Send {
        WatermarkStore::watermark(&self.sql, stream)
    }

    fn watermarks(
        &self,
        after: Option<&StreamId>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Watermark>>> + Send {
        WatermarkStore::watermarks(&self.sql, after, limit)
    }
}
