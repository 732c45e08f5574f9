//! The projection database's cold paths: checkpoint and watermark reads,
//! setup, reset and digest around the user's code, and the documents of
//! backend-neutral projections.

use std::sync::Arc;

use outbox_core::spi::{ApplyTx, ViewRow, ended_by_projection, validate_limit};
use outbox_core::spi::{StoredWatermark, projection_undecodable, validate_projection_names};
use outbox_core::{
    Digest, DigestBuilder, DigestValue, Error, MAX_PAGE, Projection, ProjectionName, Result, StreamId,
    Watermark,
};

use crate::{Arg, Conn, Database, Dialect, Row};

/// Serializes concurrent setups of one schema (`CREATE TABLE IF NOT EXISTS`
/// races in the catalog otherwise), where writers run concurrently.
const LOCK_SETUP: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended('outbox.setup.' || current_schema(), 0))";

/// Locks a projection's (`$1`) checkpoints before a reset clears them, so a
/// concurrent apply finishes before it or starts after it.
const LOCK_PROJECTION: &str =
    "SELECT 1 FROM outbox_checkpoints WHERE projection = $1 ORDER BY stream FOR UPDATE";

/// Locks one document's key (`$1` projection, `$2` table, `$3` key) for the
/// rest of the transaction, present or not, before a read that may be
/// written back.
const LOCK_DOCUMENT: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2 || chr(31) || $3, 0))";

fn as_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn decode_watermark(r: &Row) -> Result<Watermark> {
    let bad = |e: Error| projection_undecodable("watermark", e);
    StoredWatermark::from((
        r.text(0).map_err(bad)?,
        r.int(1).map_err(bad)?,
        r.int(2).map_err(bad)?,
    ))
    .into_watermark()
}

/// [`ProjectionStore::checkpoint`](outbox_core::ProjectionStore::checkpoint).
pub async fn checkpoint(
    db: &(impl Database + ?Sized),
    projection: &ProjectionName,
    stream: &StreamId,
) -> Result<u64> {
    let mut conn = db.read().await?;
    let row = conn
        .fetch_optional(
            "reading a checkpoint",
            &db.dialect()
                .sql("SELECT last_applied FROM outbox_checkpoints WHERE projection = $1 AND stream = $2"),
            &[Arg::Text(projection.as_str()), Arg::Text(stream.as_str())],
        )
        .await?;
    Ok(match row {
        Some(r) => u64::try_from(r.int(0)?).unwrap_or(0),
        None => 0,
    })
}

/// [`WatermarkStore::watermark`](outbox_core::WatermarkStore::watermark).
pub async fn watermark(db: &(impl Database + ?Sized), stream: &StreamId) -> Result<Option<Watermark>> {
    let mut conn = db.read().await?;
    let row = conn
        .fetch_optional(
            "reading a watermark",
            &db.dialect()
                .sql("SELECT stream, applied_through, updated_at FROM outbox_watermarks WHERE stream = $1"),
            &[Arg::Text(stream.as_str())],
        )
        .await?;
    row.as_ref().map(decode_watermark).transpose()
}

/// [`WatermarkStore::watermarks`](outbox_core::WatermarkStore::watermarks).
pub async fn watermarks(
    db: &(impl Database + ?Sized),
    after: Option<&StreamId>,
    limit: usize,
) -> Result<Vec<Watermark>> {
    let limit = validate_limit(limit, MAX_PAGE)?;
    let mut conn = db.read().await?;
    let rows = conn
        .fetch(
            "listing watermarks",
            &db.dialect().sql(
                "SELECT stream, applied_through, updated_at FROM outbox_watermarks \
                 WHERE stream > $1 ORDER BY stream LIMIT $2",
            ),
            &[
                Arg::Text(after.map_or("", StreamId::as_str)),
                Arg::Int(as_i64(limit)),
            ],
        )
        .await?;
    rows.iter().map(decode_watermark).collect()
}

/// [`ProjectionStore::setup`](outbox_core::ProjectionStore::setup) inside the
/// store's write transaction `tx`.
pub async fn setup_in<T: ApplyTx + Conn + 'static>(
    dialect: &Dialect,
    tx: &mut T,
    projections: &[Arc<dyn Projection<T>>],
) -> Result<()> {
    validate_projection_names(projections)?;
    if dialect.locks_rows() {
        tx.fetch("setting up projections", LOCK_SETUP, &[]).await?;
    }
    for p in projections {
        p.setup(tx)
            .await
            .map_err(|e| Error::storage(format!("setting up projection `{}` failed: {e}", p.name()), e))?;
    }
    Ok(())
}

/// [`ProjectionStore::reset`](outbox_core::ProjectionStore::reset) inside the
/// store's write transaction `tx`: the projection's `reset` runs guarded
/// (user code must not end the transaction), then its checkpoints go.
pub async fn reset_in<T: ApplyTx + Conn + 'static>(
    dialect: &Dialect,
    tx: &mut T,
    projection: &dyn Projection<T>,
) -> Result<()> {
    let name = projection.name().as_str();
    if dialect.locks_rows() {
        tx.fetch(
            "resetting checkpoints",
            &dialect.sql(LOCK_PROJECTION),
            &[Arg::Text(name)],
        )
        .await?;
    }
    tx.guard().await?;
    projection
        .reset(tx)
        .await
        .map_err(|e| Error::storage(format!("resetting projection `{name}` failed: {e}"), e))?;
    if let Some(detail) = tx.check_guard().await? {
        return Err(ended_by_projection(&format!("`{name}`"), None, &detail));
    }
    tx.execute(
        "resetting checkpoints",
        &dialect.sql("DELETE FROM outbox_checkpoints WHERE projection = $1"),
        &[Arg::Text(name)],
    )
    .await?;
    Ok(())
}

/// [`ProjectionStore::digest`](outbox_core::ProjectionStore::digest) inside
/// the store's read snapshot `tx`: the projection's rows, then its
/// checkpoints (the same framing on every adapter, so equal states digest
/// equally; a checkpoint at 0 is the same as none).
pub async fn digest_in<T: Conn + Send + 'static>(
    dialect: &Dialect,
    tx: &mut T,
    projection: &dyn Projection<T>,
) -> Result<Digest> {
    let mut out = DigestBuilder::new();
    projection.digest(tx, &mut out).await.map_err(|e| {
        Error::storage(
            format!("digest of projection `{}` failed: {e}", projection.name()),
            e,
        )
    })?;
    let rows = tx
        .fetch(
            "digesting checkpoints",
            &dialect.sql(
                "SELECT stream, last_applied FROM outbox_checkpoints \
                 WHERE projection = $1 AND last_applied > 0 ORDER BY stream",
            ),
            &[Arg::Text(projection.name().as_str())],
        )
        .await?;
    out.table("checkpoints");
    for r in &rows {
        out.row(&[DigestValue::Text(&r.text(0)?), DigestValue::Int(r.int(1)?)]);
    }
    Ok(out.finish())
}

// ---------------------------------------------------------------------------
// Documents of backend-neutral projections (ViewStorage, ViewStore)
// ---------------------------------------------------------------------------

/// [`ViewStorage::view_get`](outbox_core::spi::ViewStorage::view_get):
/// where writers run concurrently, the document's key is locked first and
/// read in a new statement, so a read-modify-write from two streams never
/// loses an update (also for a document that does not exist yet).
pub async fn view_get(
    dialect: &Dialect,
    tx: &mut (dyn Conn + '_),
    projection: &ProjectionName,
    table: &str,
    key: &str,
) -> Result<Option<String>> {
    let what = "reading a view document";
    let args = [Arg::Text(projection.as_str()), Arg::Text(table), Arg::Text(key)];
    if dialect.locks_rows() {
        tx.fetch(what, &dialect.sql(LOCK_DOCUMENT), &args).await?;
    }
    tx.fetch_optional(
        what,
        &dialect.sql("SELECT value FROM outbox_views WHERE projection = $1 AND tbl = $2 AND key = $3"),
        &args,
    )
    .await?
    .map(|r| r.text(0))
    .transpose()
}

/// [`ViewStorage::view_put`](outbox_core::spi::ViewStorage::view_put).
pub async fn view_put(
    dialect: &Dialect,
    tx: &mut (dyn Conn + '_),
    projection: &ProjectionName,
    table: &str,
    key: &str,
    value: &str,
) -> Result<()> {
    tx.execute(
        "writing a view document",
        &dialect.sql(
            "INSERT INTO outbox_views (projection, tbl, key, value) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (projection, tbl, key) DO UPDATE SET value = excluded.value",
        ),
        &[
            Arg::Text(projection.as_str()),
            Arg::Text(table),
            Arg::Text(key),
            Arg::Text(value),
        ],
    )
    .await
    .map(drop)
}

/// [`ViewStorage::view_delete`](outbox_core::spi::ViewStorage::view_delete).
pub async fn view_delete(
    dialect: &Dialect,
    tx: &mut (dyn Conn + '_),
    projection: &ProjectionName,
    table: &str,
    key: &str,
) -> Result<bool> {
    tx.execute(
        "deleting a view document",
        &dialect.sql("DELETE FROM outbox_views WHERE projection = $1 AND tbl = $2 AND key = $3"),
        &[Arg::Text(projection.as_str()), Arg::Text(table), Arg::Text(key)],
    )
    .await
    .map(|n| n > 0)
}

/// [`ViewStorage::view_scan`](outbox_core::spi::ViewStorage::view_scan) and
/// [`ViewStore::view_scan`](outbox_core::ViewStore::view_scan): keys after
/// `after` (an empty key sorts before every valid one), bytewise.
pub async fn view_scan(
    dialect: &Dialect,
    tx: &mut (dyn Conn + '_),
    projection: &ProjectionName,
    table: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, String)>> {
    tx.fetch(
        "scanning a view table",
        &dialect.sql(
            "SELECT key, value FROM outbox_views WHERE projection = $1 AND tbl = $2 AND key > $3 \
             ORDER BY key LIMIT $4",
        ),
        &[
            Arg::Text(projection.as_str()),
            Arg::Text(table),
            Arg::Text(after.unwrap_or("")),
            Arg::Int(as_i64(limit)),
        ],
    )
    .await?
    .iter()
    .map(|r| Ok((r.text(0)?, r.text(1)?)))
    .collect()
}

/// [`ViewStorage::view_rows`](outbox_core::spi::ViewStorage::view_rows).
pub async fn view_rows(
    dialect: &Dialect,
    tx: &mut (dyn Conn + '_),
    projection: &ProjectionName,
    after: Option<(&str, &str)>,
    limit: usize,
) -> Result<Vec<ViewRow>> {
    let (t, k) = after.unwrap_or(("", ""));
    tx.fetch(
        "reading the documents of a projection",
        &dialect.sql(
            "SELECT tbl, key, value FROM outbox_views WHERE projection = $1 AND (tbl, key) > ($2, $3) \
             ORDER BY tbl, key LIMIT $4",
        ),
        &[
            Arg::Text(projection.as_str()),
            Arg::Text(t),
            Arg::Text(k),
            Arg::Int(as_i64(limit)),
        ],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(ViewRow {
            table: r.text(0)?,
            key: r.text(1)?,
            value: r.text(2)?,
        })
    })
    .collect()
}

/// [`ViewStorage::view_clear`](outbox_core::spi::ViewStorage::view_clear).
pub async fn view_clear(
    dialect: &Dialect,
    tx: &mut (dyn Conn + '_),
    projection: &ProjectionName,
) -> Result<u64> {
    tx.execute(
        "clearing the documents of a projection",
        &dialect.sql("DELETE FROM outbox_views WHERE projection = $1"),
        &[Arg::Text(projection.as_str())],
    )
    .await
}

/// [`ViewStore::view_get`](outbox_core::ViewStore::view_get): a committed
/// read, outside any transaction.
pub async fn read_view(
    db: &(impl Database + ?Sized),
    projection: &ProjectionName,
    table: &str,
    key: &str,
) -> Result<Option<String>> {
    let mut conn = db.read().await?;
    conn.fetch_optional(
        "reading a view document",
        &db.dialect()
            .sql("SELECT value FROM outbox_views WHERE projection = $1 AND tbl = $2 AND key = $3"),
        &[Arg::Text(projection.as_str()), Arg::Text(table), Arg::Text(key)],
    )
    .await?
    .map(|r| r.text(0))
    .transpose()
}

/// [`ViewStore::view_scan`](outbox_core::ViewStore::view_scan).
pub async fn read_view_page(
    db: &(impl Database + ?Sized),
    projection: &ProjectionName,
    table: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, String)>> {
    let limit = validate_limit(limit, MAX_PAGE)?;
    let mut conn = db.read().await?;
    view_scan(db.dialect(), &mut *conn, projection, table, after, limit).await
}

/// Implements `ViewStorage` for an adapter's transaction handle `$tx` (a
/// [`transaction_handle!`](crate::transaction_handle): it implements
/// [`Conn`](crate::Conn) and keeps [`ViewWrites`](crate::ViewWrites)), and
/// `WatermarkStore` and `ViewStore` for its store `$store` whose `$db` field
/// implements [`Database`](crate::Database), by delegating to this module.
#[macro_export]
macro_rules! impl_projection_ports {
    ($store:ty, $db:ident, $tx:ty) => {
        #[::outbox_core::async_trait]
        impl ::outbox_core::spi::ViewStorage for $tx {
            async fn view_get(
                &mut self,
                projection: &::outbox_core::ProjectionName,
                table: &str,
                key: &str,
            ) -> ::outbox_core::Result<Option<String>> {
                if let Some(pending) = self.views.get(projection, table, key) {
                    return Ok(pending.map(str::to_owned));
                }
                let d = self.dialect();
                $crate::projection::view_get(&d, self, projection, table, key).await
            }

            async fn view_put(
                &mut self,
                projection: &::outbox_core::ProjectionName,
                table: &str,
                key: &str,
                value: &str,
            ) -> ::outbox_core::Result<()> {
                let d = self.dialect();
                if d.locks_rows() {
                    return $crate::projection::view_put(&d, self, projection, table, key, value).await;
                }
                if self.views.put(projection, table, key, value) {
                    self.flush_views().await?;
                }
                Ok(())
            }

            async fn view_delete(
                &mut self,
                projection: &::outbox_core::ProjectionName,
                table: &str,
                key: &str,
            ) -> ::outbox_core::Result<bool> {
                if let Some(existed) = self.views.delete(projection, table, key) {
                    return Ok(existed);
                }
                let d = self.dialect();
                $crate::projection::view_delete(&d, self, projection, table, key).await
            }

            async fn view_scan(
                &mut self,
                projection: &::outbox_core::ProjectionName,
                table: &str,
                after: Option<&str>,
                limit: usize,
            ) -> ::outbox_core::Result<Vec<(String, String)>> {
                self.flush_views().await?;
                let d = self.dialect();
                $crate::projection::view_scan(&d, self, projection, table, after, limit).await
            }

            async fn view_rows(
                &mut self,
                projection: &::outbox_core::ProjectionName,
                after: Option<(&str, &str)>,
                limit: usize,
            ) -> ::outbox_core::Result<Vec<::outbox_core::spi::ViewRow>> {
                self.flush_views().await?;
                let d = self.dialect();
                $crate::projection::view_rows(&d, self, projection, after, limit).await
            }

            async fn view_clear(
                &mut self,
                projection: &::outbox_core::ProjectionName,
            ) -> ::outbox_core::Result<u64> {
                self.flush_views().await?;
                let d = self.dialect();
                $crate::projection::view_clear(&d, self, projection).await
            }
        }

        impl ::outbox_core::ViewStore for $store {
            async fn view_get(
                &self,
                projection: &::outbox_core::ProjectionName,
                table: &str,
                key: &str,
            ) -> ::outbox_core::Result<Option<String>> {
                $crate::projection::read_view(&*self.$db, projection, table, key).await
            }

            async fn view_scan(
                &self,
                projection: &::outbox_core::ProjectionName,
                table: &str,
                after: Option<&str>,
                limit: usize,
            ) -> ::outbox_core::Result<Vec<(String, String)>> {
                $crate::projection::read_view_page(&*self.$db, projection, table, after, limit).await
            }
        }

        impl ::outbox_core::WatermarkStore for $store {
            async fn watermark(
                &self,
                stream: &::outbox_core::StreamId,
            ) -> ::outbox_core::Result<Option<::outbox_core::Watermark>> {
                $crate::projection::watermark(&*self.$db, stream).await
            }

            async fn watermarks(
                &self,
                after: Option<&::outbox_core::StreamId>,
                limit: usize,
            ) -> ::outbox_core::Result<Vec<::outbox_core::Watermark>> {
                $crate::projection::watermarks(&*self.$db, after, limit).await
            }
        }
    };
}
