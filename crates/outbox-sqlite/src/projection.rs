//! The projection database: checkpoints, watermarks and the user's tables.

use std::path::Path;
use std::sync::Arc;

use outbox_core::spi::apply_in;
use outbox_core::{
    ApplyOutcome, Digest, DigestBuilder, DigestValue, Error, Event, MAX_PAGE, Projection, ProjectionName,
    ProjectionStore, Result, StoredWatermark, StreamId, Watermark, WatermarkStore, validate_limit,
    validate_projection_names,
};
use sqlx::{AssertSqlSafe, Row, SqliteConnection, TypeInfo, ValueRef};

use crate::SqliteOptions;
use crate::db::{Db, Role, path_from_url, storage};
use crate::tx::{self, SqliteTx};

/// The SQLite projection database: implements [`ProjectionStore`] (appliers
/// write through a [`SqliteTx`], inside the store's `BEGIN IMMEDIATE`
/// transaction), [`WatermarkStore`] and [`ViewStore`](outbox_core::ViewStore).
///
/// The projection tables, the `(projection, stream)` checkpoints and the
/// watermarks live in one file, so an apply commits them together. Clones
/// share the connections.
#[derive(Clone, Debug)]
pub struct SqliteProjectionStore {
    pub(crate) db: Arc<Db>,
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
/// value mapped by its SQLite storage class to a [`DigestValue`]. The usual
/// body of a SQLite projection's [`Projection::digest`].
///
/// `table` must pass [`validate_identifier`] and exist.
pub async fn digest_table(conn: &mut SqliteConnection, table: &str, out: &mut DigestBuilder) -> Result<()> {
    validate_identifier(table)?;
    let err = |e| storage(format_args!("digesting table {table}"), e);
    let columns: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM pragma_table_info(?1)")
        .bind(table)
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    if columns == 0 {
        return Err(Error::invalid(format_args!("table {table} does not exist")));
    }
    let order: Vec<String> = (1..=columns).map(|i| i.to_string()).collect();
    let sql = format!("SELECT * FROM \"{table}\" ORDER BY {}", order.join(", "));
    let rows = sqlx::query(AssertSqlSafe(sql))
        .fetch_all(&mut *conn)
        .await
        .map_err(err)?;
    out.table(table);
    let decode = |e: sqlx::Error| storage(format_args!("digesting table {table}"), e);
    for row in &rows {
        // Owned copies first, then borrowed DigestValues over them.
        enum Owned {
            Null,
            Int(i64),
            Real(f64),
            Text(String),
            Blob(Vec<u8>),
        }
        let mut values = Vec::with_capacity(row.len());
        for i in 0..row.len() {
            let raw = row.try_get_raw(i).map_err(decode)?;
            let v = if raw.is_null() {
                Owned::Null
            } else {
                match raw.type_info().name() {
                    "INTEGER" => Owned::Int(row.try_get(i).map_err(decode)?),
                    "REAL" => Owned::Real(row.try_get(i).map_err(decode)?),
                    "TEXT" => Owned::Text(row.try_get(i).map_err(decode)?),
                    _ => Owned::Blob(row.try_get(i).map_err(decode)?),
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

async fn checkpoint_of(conn: &mut SqliteConnection, projection: &str, stream: &str) -> sqlx::Result<u64> {
    let cp: Option<i64> = sqlx::query_scalar(
        "SELECT last_applied FROM outbox_checkpoints WHERE projection = ?1 AND stream = ?2",
    )
    .bind(projection)
    .bind(stream)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(u64::try_from(cp.unwrap_or(0)).unwrap_or(0))
}

impl SqliteProjectionStore {
    /// Opens (creating if needed, mode 0600) the projection database at
    /// `path` and applies its migrations. Refuses the same inputs as
    /// [`SqliteJournal::open`](crate::SqliteJournal::open), and a journal
    /// database.
    pub async fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        Ok(SqliteProjectionStore {
            db: Arc::new(Db::open(path.as_ref(), &options, Role::Projection).await?),
        })
    }

    /// [`SqliteProjectionStore::open`] from a `sqlite://path` or `sqlite:path` URL.
    pub async fn open_url(url: &str, options: SqliteOptions) -> Result<Self> {
        Self::open(path_from_url(url)?, options).await
    }

    /// The database file's absolute path.
    pub fn path(&self) -> &Path {
        &self.db.path
    }

    /// Closes the connections of this instance and its clones (later calls
    /// fail). Dropping every clone also closes them, in the background;
    /// `close` waits, so the files can be reopened or copied right after.
    pub async fn close(&self) {
        self.db.close().await;
    }

    /// A read-only connection to the projection database, for queries by the
    /// application (projection tables, checkpoints).
    pub async fn read(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Sqlite>> {
        self.db.read().await
    }

    #[cfg(feature = "test-util")]
    /// Test support: moves this database's clock forward by `d`. See
    /// [`SqliteJournal::advance_clock_for_tests`](crate::SqliteJournal).
    #[doc(hidden)]
    pub async fn advance_clock_for_tests(&self, d: std::time::Duration) -> Result<()> {
        self.db.advance_clock(outbox_core::duration_millis(d)).await
    }

    async fn begin(&self) -> Result<SqliteTx> {
        Ok(SqliteTx::new(self.db.begin().await?))
    }

    async fn commit(&self, tx: SqliteTx, what: &str) -> Result<()> {
        tx.commit().await.map_err(|e| storage(self.db.context(what), e))
    }
}

impl ProjectionStore for SqliteProjectionStore {
    type Tx = SqliteTx;

    async fn setup(&self, projections: &[Arc<dyn Projection<SqliteTx>>]) -> Result<()> {
        validate_projection_names(projections)?;
        let mut tx = self.begin().await?;
        for p in projections {
            p.setup(&mut tx).await.map_err(|e| {
                Error::storage(format!("setting up projection `{}` failed: {e}", p.name()), e)
            })?;
        }
        self.commit(tx, "setting up projections").await
    }

    async fn apply(
        &self,
        stream: &StreamId,
        events: &[Event],
        projections: &[Arc<dyn Projection<SqliteTx>>],
    ) -> Result<ApplyOutcome> {
        let mut tx = self.begin().await?;
        let outcome = apply_in(&mut tx, stream, events, projections).await?;
        if matches!(outcome, ApplyOutcome::Applied(_)) {
            self.commit(tx, "applying events").await?;
        }
        // Otherwise dropping the transaction rolls it back: nothing written.
        Ok(outcome)
    }

    async fn checkpoint(&self, projection: &ProjectionName, stream: &StreamId) -> Result<u64> {
        let mut conn = self.db.read().await?;
        checkpoint_of(&mut conn, projection.as_str(), stream.as_str())
            .await
            .map_err(|e| storage(self.db.context("reading a checkpoint"), e))
    }

    async fn reset(&self, projection: &dyn Projection<SqliteTx>) -> Result<()> {
        let mut tx = self.begin().await?;
        tx::reset_in(&mut tx, projection).await?;
        self.commit(tx, "resetting a projection").await
    }

    async fn digest(&self, projection: &dyn Projection<SqliteTx>) -> Result<Digest> {
        let err = |e| storage(self.db.context("digesting a projection"), e);
        // One read transaction: the tables and the checkpoints are one snapshot.
        let mut tx = SqliteTx::new(self.db.reader.begin().await.map_err(err)?);
        let mut out = DigestBuilder::new();
        projection.digest(&mut tx, &mut out).await.map_err(|e| {
            Error::storage(
                format!("digest of projection `{}` failed: {e}", projection.name()),
                e,
            )
        })?;
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT stream, last_applied FROM outbox_checkpoints WHERE projection = ?1 ORDER BY stream",
        )
        .bind(projection.name().as_str())
        .fetch_all(tx.conn())
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        // Same framing as the memory adapter, so equal states digest equally.
        out.table("checkpoints");
        for (stream, cp) in &rows {
            out.row(&[DigestValue::Text(stream), DigestValue::Int(*cp)]);
        }
        Ok(out.finish())
    }
}

impl WatermarkStore for SqliteProjectionStore {
    async fn watermark(&self, stream: &StreamId) -> Result<Option<Watermark>> {
        let mut conn = self.db.read().await?;
        let row: Option<(String, i64, i64)> = sqlx::query_as(
            "SELECT stream, applied_through, updated_at FROM outbox_watermarks WHERE stream = ?1",
        )
        .bind(stream.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| storage(self.db.context("reading a watermark"), e))?;
        row.map(|w| StoredWatermark::from(w).into_watermark()).transpose()
    }

    async fn watermarks(&self, after: Option<&StreamId>, limit: usize) -> Result<Vec<Watermark>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let mut conn = self.db.read().await?;
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT stream, applied_through, updated_at FROM outbox_watermarks \
             WHERE stream > ?1 ORDER BY stream LIMIT ?2",
        )
        .bind(after.map_or("", StreamId::as_str))
        .bind(limit as i64)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| storage(self.db.context("listing watermarks"), e))?;
        rows.into_iter()
            .map(|w| StoredWatermark::from(w).into_watermark())
            .collect()
    }
}

impl outbox_core::ViewStore for SqliteProjectionStore {
    async fn view_get(&self, projection: &ProjectionName, table: &str, key: &str) -> Result<Option<String>> {
        let mut conn = self.db.read().await?;
        sqlx::query_scalar("SELECT value FROM outbox_views WHERE projection = ?1 AND tbl = ?2 AND key = ?3")
            .bind(projection.as_str())
            .bind(table)
            .bind(key)
            .fetch_optional(&mut *conn)
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
        let mut conn = self.db.read().await?;
        tx::scan(&mut conn, projection, table, after, limit).await
    }
}
