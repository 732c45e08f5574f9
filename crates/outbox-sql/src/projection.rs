//! The projection database's cold paths: checkpoint and watermark reads,
//! setup, reset and digest around the user's code, and the documents of
//! backend-neutral projections.

use std::sync::Arc;

use outbox_core::spi::{ApplyTx, ViewRow, ended_by_projection, validate_limit};
use outbox_core::spi::{
    StoredWatermark, projection_undecodable, stored_view_digest, validate_projection_names,
};
use outbox_core::{
    Digest, DigestBuilder, DigestValue, DocumentHash, Error, MAX_PAGE, Projection, ProjectionName,
    RUNNING_DIGEST_LANES, Result, RunningDigest, StreamId, ViewDigest, ViewDigestCheck, Watermark,
};

use crate::{Arg, Conn, Database, Dialect, Row};

/// The storage name of a projection's live generation, for `$1` the
/// projection: its own name without a record.
pub const LIVE_STORAGE: &str =
    "COALESCE((SELECT live_storage FROM outbox_generations WHERE projection = $1), $1)";

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
/// written back (or a blind write). Advisory locks are database-wide, so the
/// key includes the schema: stores in other schemas of the database never
/// wait for (or deadlock with) this one's documents.
const LOCK_DOCUMENT: &str = "SELECT pg_advisory_xact_lock(hashtextextended(\
     current_schema() || chr(31) || $1 || chr(31) || $2 || chr(31) || $3, 0))";

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
            &db.dialect().sql(&format!(
                "SELECT last_applied FROM outbox_checkpoints WHERE projection = {LIVE_STORAGE} AND stream = $2"
            )),
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
    // The live generation's checkpoints (ADR 0021).
    let stored = tx.generations().storage(projection.name()).clone();
    let name = stored.as_str();
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
    // A rebuild applies every event again: nothing stays skipped.
    crate::skipped::clear_skips_in(dialect, tx, projection.name()).await
}

/// [`ProjectionStore::digest`](outbox_core::ProjectionStore::digest) inside
/// the store's read snapshot `tx`: the projection's rows, then its
/// checkpoints (the same framing on every adapter, so equal states digest
/// equally; a checkpoint at 0 is the same as none).
pub async fn digest_in<T: Conn + outbox_core::spi::ViewStorage + Send + 'static>(
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
            &[Arg::Text(
                tx.generations().storage(projection.name()).clone().as_str(),
            )],
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

/// [`ViewStorage::view_delete`](outbox_core::spi::ViewStorage::view_delete):
/// returns the hash of the document it deleted (`None`: there was none),
/// as the delete found it.
pub async fn view_delete(
    dialect: &Dialect,
    tx: &mut (dyn Conn + '_),
    projection: &ProjectionName,
    table: &str,
    key: &str,
) -> Result<Option<DocumentHash>> {
    let row = tx
        .fetch_optional(
            "deleting a view document",
            &dialect.sql(
                "DELETE FROM outbox_views WHERE projection = $1 AND tbl = $2 AND key = $3 RETURNING value",
            ),
            &[Arg::Text(projection.as_str()), Arg::Text(table), Arg::Text(key)],
        )
        .await?;
    row.map(|r| r.text(0).map(|v| DocumentHash::of(table, key, &v)))
        .transpose()
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

/// [`ViewStorage::view_clear`](outbox_core::spi::ViewStorage::view_clear):
/// returns the hashes of the documents it deleted, as it deleted them (a
/// concurrent apply's documents it did not see stay, and so does their
/// share of the running digest).
pub async fn view_clear(
    dialect: &Dialect,
    tx: &mut (dyn Conn + '_),
    projection: &ProjectionName,
) -> Result<Vec<DocumentHash>> {
    tx.fetch(
        "clearing the documents of a projection",
        &dialect.sql("DELETE FROM outbox_views WHERE projection = $1 RETURNING tbl, key, value"),
        &[Arg::Text(projection.as_str())],
    )
    .await?
    .iter()
    .map(|r| Ok(DocumentHash::of(&r.text(0)?, &r.text(1)?, &r.text(2)?)))
    .collect()
}

/// The columns of a running digest row, after `projection`.
pub(crate) const DIGEST_COLUMNS: &str =
    "d0, d1, d2, d3, d4, d5, d6, d7, documents, last_stream, last_seq, updated_at";

pub(crate) fn decode_view_digest(projection: &ProjectionName, r: &Row, at: usize) -> Result<ViewDigest> {
    let mut lanes = [None; RUNNING_DIGEST_LANES];
    for (i, l) in lanes.iter_mut().enumerate() {
        *l = r.opt_int(at + i)?;
    }
    let last = match (r.opt_text(at + 9)?, r.opt_int(at + 10)?) {
        (Some(s), Some(q)) => Some((s, q)),
        _ => None,
    };
    stored_view_digest(projection, lanes, r.int(at + 8)?, last, r.opt_int(at + 11)?)
}

/// [`ViewStore::view_digests`](outbox_core::ViewStore::view_digests).
pub async fn view_digests(db: &(impl Database + ?Sized)) -> Result<Vec<ViewDigest>> {
    let mut conn = db.read().await?;
    let rows = conn
        .fetch(
            "reading running digests",
            &db.dialect().sql(&format!(
                "SELECT projection, {DIGEST_COLUMNS} FROM outbox_view_digests ORDER BY projection"
            )),
            &[],
        )
        .await?;
    rows.iter()
        .map(|r| {
            let p =
                ProjectionName::new(r.text(0)?).map_err(|e| projection_undecodable("running digest", e))?;
            decode_view_digest(&p, r, 1)
        })
        .collect()
}

/// [`ViewStore::verify_view_digest`](outbox_core::ViewStore::verify_view_digest):
/// the recorded row and a scan of every document, in one snapshot.
pub async fn verify_view_digest(
    db: &(impl Database + ?Sized),
    projection: &ProjectionName,
) -> Result<ViewDigestCheck> {
    let dialect = db.dialect();
    let mut tx = db.snapshot().await?;
    let projection = &live_storage(dialect, &mut *tx, projection).await?;
    let row = tx
        .fetch_optional(
            "reading a running digest",
            &dialect.sql(&format!(
                "SELECT {DIGEST_COLUMNS} FROM outbox_view_digests WHERE projection = $1"
            )),
            &[Arg::Text(projection.as_str())],
        )
        .await?;
    let recorded = match row {
        Some(r) => decode_view_digest(projection, &r, 0)?,
        None => ViewDigest::empty(projection),
    };
    let mut scanned = RunningDigest::EMPTY;
    let mut after: Option<(String, String)> = None;
    loop {
        let page = view_rows(
            dialect,
            &mut *tx,
            projection,
            after.as_ref().map(|(t, k)| (t.as_str(), k.as_str())),
            VERIFY_PAGE,
        )
        .await?;
        let full = page.len() == VERIFY_PAGE;
        for row in page {
            scanned.add(&DocumentHash::of(&row.table, &row.key, &row.value));
            after = Some((row.table, row.key));
        }
        if !full {
            break;
        }
    }
    tx.commit("verifying a running digest").await?;
    Ok(ViewDigestCheck { recorded, scanned })
}

/// Documents read per page by [`verify_view_digest`].
const VERIFY_PAGE: usize = 1000;

/// The storage name of `projection`'s live generation (ADR 0021).
async fn live_storage(
    dialect: &Dialect,
    conn: &mut (dyn Conn + '_),
    projection: &ProjectionName,
) -> Result<ProjectionName> {
    let row = conn
        .fetch_optional(
            "resolving the live generation",
            &dialect.sql(&format!("SELECT {LIVE_STORAGE}")),
            &[Arg::Text(projection.as_str())],
        )
        .await?;
    match row {
        Some(r) => ProjectionName::new(r.text(0)?).map_err(|e| projection_undecodable("generation", e)),
        None => Ok(projection.clone()),
    }
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
        &db.dialect().sql(&format!(
            "SELECT value FROM outbox_views WHERE projection = {LIVE_STORAGE} AND tbl = $2 AND key = $3"
        )),
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
    let storage = live_storage(db.dialect(), &mut *conn, projection).await?;
    view_scan(db.dialect(), &mut *conn, &storage, table, after, limit).await
}
