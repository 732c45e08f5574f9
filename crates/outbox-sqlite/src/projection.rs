//! The projection database: checkpoints, watermarks and the user's tables.

use std::path::Path;
use std::sync::Arc;

use outbox_core::spi::{all_applied, apply_in, apply_runs_in};
use outbox_core::{
    ApplyOutcome, Digest, DigestBuilder, Error, Event, GenerationInfo, GenerationStore, Projection,
    ProjectionName, ProjectionStore, Result, StoredGeneration, StreamId, SwapCheck, SwapOutcome, ViewDigest,
    ViewDigestCheck, ViewStore, Watermark, WatermarkStore,
};
use outbox_sql::{Role, SqlProjections};

use crate::SqliteOptions;
use crate::clock::now_ms;
use crate::engine::{Engines, engine_error};
use crate::files::path_from_url;
use crate::tx::SqliteTx;

/// The SQLite projection database: implements [`ProjectionStore`] (appliers
/// write through a [`SqliteTx`], inside the store's `BEGIN IMMEDIATE`
/// transaction), [`WatermarkStore`] and [`ViewStore`].
///
/// The projection tables, the `(projection, stream)` checkpoints and the
/// watermarks live in one file, so an apply commits them together. Like
/// the journal, the file has one writer connection, owned by an engine
/// thread (ADR 0038), and one reader. Clones share the connections.
#[derive(Clone, Debug)]
pub struct SqliteProjectionStore {
    engines: Arc<Engines>,
    /// The database file's absolute path.
    path: Arc<Path>,
    /// The clock the engine's connections read (test support).
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    clock: crate::clock::Clock,
    /// The cold-path ports, and the live generations apply transactions
    /// reuse (ADR 0021).
    pub(crate) sql: SqlProjections<Engines>,
}

/// Checks a table or column name for use in SQL text: an ASCII letter or
/// underscore, then up to 62 ASCII letters, digits or underscores
/// (`^[A-Za-z_][A-Za-z0-9_]{0,62}$`). Anything else is
/// [`Error::InvalidInput`]. Identifiers cannot be bound as parameters, so
/// every identifier that reaches SQL text must pass this first.
pub fn validate_identifier(name: &str) -> Result<&str> {
    let mut chars = name.chars();
    let ok = match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {
            name.len() <= 63 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        _ => false,
    };
    if ok {
        Ok(name)
    } else {
        Err(Error::invalid(format_args!(
            "{name:?} is not a valid SQL identifier (letters, digits and underscores, at most 63, not starting with a digit)"
        )))
    }
}

/// Feeds every row of `table` into `out`, ordered by all its columns
/// (`ORDER BY 1, 2, ...`, so the order is total and deterministic), each
/// value mapped by its SQLite storage class to a [`DigestValue`](outbox_core::DigestValue). The usual
/// body of a SQLite projection's [`Projection::digest`].
///
/// `table` must pass [`validate_identifier`] and exist.
pub async fn digest_table(tx: &mut SqliteTx, table: &str, out: &mut DigestBuilder) -> Result<()> {
    validate_identifier(table)?;
    let name = table.to_owned();
    let columns: i64 = tx
        .run(move |conn| conn.query_row("SELECT COUNT(*) FROM pragma_table_info(?1)", [name], |r| r.get(0)))
        .await?;
    if columns == 0 {
        return Err(Error::invalid(format_args!("table {table} does not exist")));
    }
    let order: Vec<String> = (1..=columns).map(|i| i.to_string()).collect();
    let sql = format!("SELECT * FROM \"{table}\" ORDER BY {}", order.join(", "));
    let rows = outbox_sql::Conn::fetch(tx, &format!("digesting table {table}"), &sql, &[]).await?;
    outbox_sql::digest_rows(out, table, &rows);
    Ok(())
}

impl SqliteProjectionStore {
    /// Opens (creating if needed, mode 0600) the projection database at
    /// `path` and applies its migrations. Refuses the same inputs as
    /// [`SqliteJournal::open`](crate::SqliteJournal::open), and a journal
    /// database.
    pub async fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let path = crate::migrate::prepare(path.as_ref(), &options, Role::Projection).await?;
        let dialect = Arc::new(outbox_sql::Dialect::sqlite(now_ms!()));
        let engines = Arc::new(Engines::start(&path, &options, dialect)?);
        Ok(SqliteProjectionStore {
            sql: SqlProjections::new(Arc::clone(&engines)),
            engines,
            path: path.into(),
            clock: options.clock,
        })
    }

    /// [`SqliteProjectionStore::open`] from a `sqlite://path` or `sqlite:path` URL.
    pub async fn open_url(url: &str, options: SqliteOptions) -> Result<Self> {
        Self::open(path_from_url(url)?, options).await
    }

    /// A wake-up source for waiters: resolves within about a millisecond of
    /// a commit to this file by any other connection, in this process or
    /// another (see [`SqliteWakeSource`](crate::SqliteWakeSource)). Give it
    /// to the runtime (`Outbox::builder().progress_source(...)`) so
    /// `Outbox::wait_for` in one process wakes when a worker in another
    /// applies.
    pub fn wake_source(&self) -> Arc<dyn outbox_core::WakeSource> {
        Arc::new(crate::SqliteWakeSource::new(&self.path))
    }

    /// The database file's absolute path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes the connections of this instance and its clones (later calls
    /// fail). Dropping every clone also closes them, in the background;
    /// `close` waits, so the files can be reopened or copied right after.
    pub async fn close(&self) {
        self.engines.close().await;
    }

    /// Runs `body` on the store's read-only connection, for queries by the
    /// application (projection tables, checkpoints); each statement reads
    /// the latest commit. Its error is mapped as the store's own.
    pub async fn read<T, F>(&self, body: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.engines
            .reader
            .read(move |conn| body(conn).map_err(|e| engine_error("reading the projection database", e)))
            .await
    }

    #[cfg(feature = "test-util")]
    /// Test support: moves this database's clock forward by `d`. See
    /// [`SqliteJournal::advance_clock_for_tests`](crate::SqliteJournal).
    #[doc(hidden)]
    pub async fn advance_clock_for_tests(&self, d: std::time::Duration) -> Result<()> {
        crate::clock::check_test_clock(self.clock, &self.path)?;
        let ms = outbox_core::spi::duration_millis(d);
        self.engines
            .writer
            .write(move |conn| {
                conn.execute(crate::clock::ADVANCE_TEST_CLOCK, [ms])
                    .map(drop)
                    .map_err(|e| engine_error("advancing the test clock", e))
            })
            .await
    }

    /// A write transaction; `cached` reuses the live generations the last
    /// apply resolved (an apply fenced by their epoch), otherwise they are
    /// read now (setup, reset).
    async fn begin(&self, cached: bool) -> Result<SqliteTx> {
        let session = self.engines.writer.session("BEGIN IMMEDIATE").await?;
        let mut tx = SqliteTx::new(session, Arc::clone(self.engines.dialect()));
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

    async fn commit(&self, tx: SqliteTx, what: &str) -> Result<()> {
        tx.commit(&format!("{what} on {}", self.path.display())).await
    }
}

impl ProjectionStore for SqliteProjectionStore {
    type Tx = SqliteTx;

    async fn setup(&self, projections: &[Arc<dyn Projection<SqliteTx>>]) -> Result<()> {
        let mut tx = self.begin(false).await?;
        outbox_sql::projection::setup_in(self.engines.dialect(), &mut tx, projections).await?;
        self.commit(tx, "setting up projections").await
    }

    async fn apply(
        &self,
        stream: &StreamId,
        events: &[Event],
        projections: &[Arc<dyn Projection<SqliteTx>>],
    ) -> Result<ApplyOutcome> {
        self.forget_generations(
            async {
                let mut tx = self.begin(true).await?;
                let outcome = apply_in(&mut tx, stream, events, projections).await?;
                if matches!(outcome, ApplyOutcome::Applied(_)) {
                    self.commit(tx, "applying events").await?;
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
        projections: &[Arc<dyn Projection<SqliteTx>>],
    ) -> Result<Vec<ApplyOutcome>> {
        self.forget_generations(
            async {
                let mut tx = self.begin(true).await?;
                let outcomes = apply_runs_in(&mut tx, runs, projections).await?;
                if all_applied(&outcomes, runs.len()) {
                    self.commit(tx, "applying events").await?;
                }
                Ok(outcomes)
            }
            .await,
        )
    }

    async fn checkpoint(&self, projection: &ProjectionName, stream: &StreamId) -> Result<u64> {
        outbox_sql::projection::checkpoint(&*self.engines, projection, stream).await
    }

    async fn reset(&self, projection: &dyn Projection<SqliteTx>) -> Result<()> {
        let mut tx = self.begin(false).await?;
        outbox_sql::projection::reset_in(self.engines.dialect(), &mut tx, projection).await?;
        self.commit(tx, "resetting a projection").await
    }

    async fn digest(&self, projection: &dyn Projection<SqliteTx>) -> Result<Digest> {
        // One read transaction: the documents, tables and checkpoints are one snapshot.
        let session = self.engines.reader.session("BEGIN").await?;
        let mut tx = SqliteTx::new(session, Arc::clone(self.engines.dialect()));
        tx.resolve_generations(None).await?;
        let digest = outbox_sql::projection::digest_in(self.engines.dialect(), &mut tx, projection).await?;
        tx.commit(&format!("digesting a projection on {}", self.path.display()))
            .await?;
        Ok(digest)
    }
}

impl outbox_core::SkippedEvents for SqliteProjectionStore {
    async fn skipped(
        &self,
        projection: Option<&ProjectionName>,
        limit: usize,
    ) -> Result<Vec<outbox_core::SkippedEvent>> {
        outbox_sql::skipped::skipped(&*self.engines, projection, limit).await
    }

    async fn reapply(&self, event: &Event, projection: &Arc<dyn Projection<SqliteTx>>) -> Result<bool> {
        let mut tx = self.begin(false).await?;
        let done = outbox_core::spi::reapply_in(&mut tx, event, projection).await?;
        if done {
            self.commit(tx, "re-applying a skipped event").await?;
        }
        Ok(done)
    }
}

// The cold-path ports: the shared statements of `SqlProjections`.

impl ViewStore for SqliteProjectionStore {
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

impl GenerationStore for SqliteProjectionStore {
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

impl WatermarkStore for SqliteProjectionStore {
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
