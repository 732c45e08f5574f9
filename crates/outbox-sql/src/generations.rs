//! Generations of view projections (ADR 0021): the records, the map every
//! apply transaction resolves, and the swap, written once for both SQL
//! dialects.

use std::sync::{Arc, Mutex, PoisonError};

use outbox_core::spi::{
    BuildPlan, GenerationMap, comparable_digest, not_building, plan_build, plan_drop, projection_undecodable,
};
use outbox_core::{
    Error, GenerationInfo, ProjectionName, Result, StoredGeneration, StreamBehind, StreamId, SwapCheck,
    SwapOutcome, Timestamp, ViewDigest, generation_storage,
};

use crate::projection::{DIGEST_COLUMNS, decode_view_digest};
use crate::{Arg, Conn, Database, Dialect, Row};

/// The most streams a [`SwapOutcome::Behind`] lists.
const BEHIND_PAGE: i64 = 1000;

const COLUMNS: &str = "projection, live, live_version, epoch, building, building_version, \
     building_position, last_generation, updated_at";

pub use crate::projection::LIVE_STORAGE;

fn as_u32(n: i64, what: &str) -> Result<u32> {
    u32::try_from(n)
        .map_err(|_| projection_undecodable("generation", Error::invalid(format_args!("{what} {n}"))))
}

fn decode(r: &Row) -> Result<GenerationInfo> {
    let bad = |e: Error| projection_undecodable("generation", e);
    Ok(GenerationInfo {
        projection: ProjectionName::new(r.text(0)?).map_err(bad)?,
        live: as_u32(r.int(1)?, "live generation")?,
        live_version: as_u32(r.int(2)?, "live version")?,
        epoch: u64::try_from(r.int(3)?).unwrap_or(0),
        building: r
            .opt_int(4)?
            .map(|g| as_u32(g, "building generation"))
            .transpose()?,
        building_version: r.opt_int(5)?.map(|v| as_u32(v, "building version")).transpose()?,
        building_position: u64::try_from(r.int(6)?).unwrap_or(0),
        last_generation: as_u32(r.int(7)?, "last generation")?,
        updated_at: Timestamp::from_millis(r.int(8)?),
    })
}

/// Every record, in a transaction or not.
pub async fn load_all(dialect: &Dialect, conn: &mut (dyn Conn + '_)) -> Result<Vec<GenerationInfo>> {
    let rows = conn
        .fetch(
            "reading generations",
            &dialect.sql(&format!(
                "SELECT {COLUMNS} FROM outbox_generations ORDER BY projection"
            )),
            &[],
        )
        .await?;
    rows.iter().map(decode).collect()
}

/// The live generations, as a transaction handle carries them.
pub async fn load_map(dialect: &Dialect, conn: &mut (dyn Conn + '_)) -> Result<Arc<GenerationMap>> {
    Ok(Arc::new(GenerationMap::from_records(
        load_all(dialect, conn).await?,
    )?))
}

/// The last map a store's apply transactions resolved, reused until an
/// apply fails: a map made stale by a swap fails the apply's checkpoint
/// compare-and-set (the epoch fence), and the retry reads it again.
#[derive(Debug, Default)]
pub struct GenerationCache(Mutex<Option<Arc<GenerationMap>>>);

impl GenerationCache {
    /// The cached map, or the one `conn` reads now (then cached).
    pub async fn get(&self, dialect: &Dialect, conn: &mut (dyn Conn + '_)) -> Result<Arc<GenerationMap>> {
        if let Some(map) = self.0.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            return Ok(map);
        }
        let map = load_map(dialect, conn).await?;
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&map));
        Ok(map)
    }

    /// Forgets the map: the next transaction reads it again.
    pub fn invalidate(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// [`GenerationStore::generation`](outbox_core::GenerationStore::generation).
pub async fn generation(
    db: &(impl Database + ?Sized),
    projection: &ProjectionName,
) -> Result<Option<GenerationInfo>> {
    let mut conn = db.read().await?;
    read_record(db.dialect(), &mut *conn, projection, false).await
}

/// [`GenerationStore::generations`](outbox_core::GenerationStore::generations).
pub async fn generations(db: &(impl Database + ?Sized)) -> Result<Vec<GenerationInfo>> {
    let mut conn = db.read().await?;
    load_all(db.dialect(), &mut *conn).await
}

async fn read_record(
    dialect: &Dialect,
    conn: &mut (dyn Conn + '_),
    projection: &ProjectionName,
    lock: bool,
) -> Result<Option<GenerationInfo>> {
    let lock = if lock && dialect.locks_rows() {
        " FOR UPDATE"
    } else {
        ""
    };
    conn.fetch_optional(
        "reading a generation record",
        &dialect.sql(&format!(
            "SELECT {COLUMNS} FROM outbox_generations WHERE projection = $1{lock}"
        )),
        &[Arg::Text(projection.as_str())],
    )
    .await?
    .as_ref()
    .map(decode)
    .transpose()
}

/// Deletes everything stored under `storage`; returns the documents deleted.
async fn clear_storage(
    dialect: &Dialect,
    conn: &mut (dyn Conn + '_),
    storage: &ProjectionName,
) -> Result<u64> {
    let arg = [Arg::Text(storage.as_str())];
    let what = "clearing a generation";
    let docs = conn
        .execute(
            what,
            &dialect.sql("DELETE FROM outbox_views WHERE projection = $1"),
            &arg,
        )
        .await?;
    for table in ["outbox_checkpoints", "outbox_view_digests"] {
        conn.execute(
            what,
            &dialect.sql(&format!("DELETE FROM {table} WHERE projection = $1")),
            &arg,
        )
        .await?;
    }
    Ok(docs)
}

/// [`GenerationStore::begin_generation`](outbox_core::GenerationStore::begin_generation).
pub async fn begin_generation(
    db: &(impl Database + ?Sized),
    projection: &ProjectionName,
    live_version: u32,
    version: u32,
) -> Result<GenerationInfo> {
    let dialect = db.dialect();
    let mut tx = db.begin().await?;
    let mut record = read_record(dialect, &mut *tx, projection, true).await?;
    if record.is_none() {
        if dialect.locks_rows() {
            // The fence starts here: wait for every apply transaction that
            // wrote checkpoints without a record to share-lock, so none of
            // them can still commit after a later swap.
            tx.execute(
                "fencing applies",
                "LOCK TABLE outbox_checkpoints IN SHARE MODE",
                &[],
            )
            .await?;
        }
        tx.execute(
            "recording a generation",
            &dialect.sql(
                "INSERT INTO outbox_generations (projection, live, live_storage, live_version, epoch, \
                 last_generation, updated_at) VALUES ($1, 1, $1, $2, 0, 1, {now}) \
                 ON CONFLICT (projection) DO NOTHING",
            ),
            &[Arg::Text(projection.as_str()), Arg::Int(i64::from(live_version))],
        )
        .await?;
        record = read_record(dialect, &mut *tx, projection, true).await?;
    }
    let record = record.ok_or_else(|| Error::NotFound(format!("generation record of `{projection}`")))?;
    let BuildPlan::New {
        generation: next,
        storage,
    } = plan_build(&record, version)?
    else {
        tx.commit("resuming a generation").await?;
        return Ok(record);
    };
    clear_storage(dialect, &mut *tx, &storage).await?;
    tx.execute(
        "recording a generation",
        &dialect.sql(
            "UPDATE outbox_generations SET building = $2, building_version = $3, building_position = 0, \
             last_generation = $2, updated_at = {now} WHERE projection = $1",
        ),
        &[
            Arg::Text(projection.as_str()),
            Arg::Int(i64::from(next)),
            Arg::Int(i64::from(version)),
        ],
    )
    .await?;
    let record = read_record(dialect, &mut *tx, projection, false)
        .await?
        .ok_or_else(|| Error::NotFound(format!("generation record of `{projection}`")))?;
    tx.commit("recording a generation").await?;
    Ok(record)
}

/// [`GenerationStore::record_build_position`](outbox_core::GenerationStore::record_build_position).
pub async fn record_build_position(
    db: &(impl Database + ?Sized),
    projection: &ProjectionName,
    generation: u32,
    position: u64,
) -> Result<()> {
    let mut tx = db.begin().await?;
    let n = tx
        .execute(
            "recording a build's position",
            &db.dialect().sql(
                "UPDATE outbox_generations SET building_position = $3, updated_at = {now} \
                 WHERE projection = $1 AND building = $2",
            ),
            &[
                Arg::Text(projection.as_str()),
                Arg::Int(i64::from(generation)),
                Arg::Int(i64::try_from(position).unwrap_or(i64::MAX)),
            ],
        )
        .await?;
    if n == 0 {
        return Err(not_building(projection, generation));
    }
    tx.commit("recording a build's position").await
}

/// Streams on which `ahead`'s checkpoint is above `behind`'s (at most a page).
async fn ahead_of(
    dialect: &Dialect,
    conn: &mut (dyn Conn + '_),
    ahead: &ProjectionName,
    behind: &ProjectionName,
) -> Result<Vec<(StreamId, u64, u64)>> {
    let rows = conn
        .fetch(
            "comparing generations",
            &dialect.sql(
                "SELECT a.stream, a.last_applied, COALESCE(b.last_applied, 0) FROM outbox_checkpoints a \
                 LEFT JOIN outbox_checkpoints b ON b.projection = $2 AND b.stream = a.stream \
                 WHERE a.projection = $1 AND a.last_applied > COALESCE(b.last_applied, 0) \
                 ORDER BY a.stream LIMIT $3",
            ),
            &[
                Arg::Text(ahead.as_str()),
                Arg::Text(behind.as_str()),
                Arg::Int(BEHIND_PAGE),
            ],
        )
        .await?;
    rows.iter()
        .map(|r| {
            let stream = StreamId::new(r.text(0)?).map_err(|e| projection_undecodable("checkpoint", e))?;
            Ok((
                stream,
                u64::try_from(r.int(1)?).unwrap_or(0),
                u64::try_from(r.int(2)?).unwrap_or(0),
            ))
        })
        .collect()
}

async fn recorded_digest(
    dialect: &Dialect,
    conn: &mut (dyn Conn + '_),
    storage: &ProjectionName,
) -> Result<ViewDigest> {
    let row = conn
        .fetch_optional(
            "reading a running digest",
            &dialect.sql(&format!(
                "SELECT {DIGEST_COLUMNS} FROM outbox_view_digests WHERE projection = $1"
            )),
            &[Arg::Text(storage.as_str())],
        )
        .await?;
    match row {
        Some(r) => decode_view_digest(storage, &r, 0),
        None => Ok(ViewDigest::empty(storage)),
    }
}

/// [`GenerationStore::swap_generation`](outbox_core::GenerationStore::swap_generation).
pub async fn swap_generation(
    db: &(impl Database + ?Sized),
    projection: &ProjectionName,
    generation: u32,
    check: SwapCheck,
) -> Result<SwapOutcome> {
    let dialect = db.dialect();
    let mut tx = db.begin().await?;
    // On Postgres the row lock waits for every apply that share-locked it
    // (its checkpoint compare-and-set) and holds off new ones until commit.
    let record = read_record(dialect, &mut *tx, projection, true)
        .await?
        .filter(|r| r.building == Some(generation))
        .ok_or_else(|| not_building(projection, generation))?;
    let live = record.live_storage()?;
    let new = generation_storage(projection, generation)?;
    let mut behind: Vec<StreamBehind> = ahead_of(dialect, &mut *tx, &live, &new)
        .await?
        .into_iter()
        .map(|(stream, live, building)| StreamBehind {
            stream,
            live,
            building,
        })
        .collect();
    if check != SwapCheck::CaughtUp {
        behind.extend(ahead_of(dialect, &mut *tx, &new, &live).await?.into_iter().map(
            |(stream, building, live)| StreamBehind {
                stream,
                live,
                building,
            },
        ));
        behind.sort_by(|a, b| a.stream.cmp(&b.stream));
        behind.truncate(usize::try_from(BEHIND_PAGE).unwrap_or(usize::MAX));
    }
    if !behind.is_empty() {
        return Ok(SwapOutcome::Behind { streams: behind });
    }
    if check == SwapCheck::Agrees {
        let a = comparable_digest(&recorded_digest(dialect, &mut *tx, &live).await?)?;
        let b = comparable_digest(&recorded_digest(dialect, &mut *tx, &new).await?)?;
        if a != b {
            return Ok(SwapOutcome::Differs { live: a, building: b });
        }
    }
    tx.execute(
        "swapping generations",
        &dialect.sql(
            "UPDATE outbox_generations SET live = $2, live_storage = $3, live_version = building_version, \
             epoch = epoch + 1, building = NULL, building_version = NULL, building_position = 0, \
             updated_at = {now} WHERE projection = $1",
        ),
        &[
            Arg::Text(projection.as_str()),
            Arg::Int(i64::from(generation)),
            Arg::Text(new.as_str()),
        ],
    )
    .await?;
    // The new generation applied every event, the skipped ones included:
    // nothing is left to re-apply (ADR 0032). On Postgres this waits for a
    // re-apply in flight, which holds the record's lock.
    crate::skipped::clear_skips_in(dialect, &mut *tx, projection).await?;
    tx.commit("swapping generations").await?;
    Ok(SwapOutcome::Swapped {
        from: record.live,
        to: generation,
        epoch: record.epoch + 1,
    })
}

/// [`GenerationStore::drop_generation`](outbox_core::GenerationStore::drop_generation).
pub async fn drop_generation(
    db: &(impl Database + ?Sized),
    projection: &ProjectionName,
    generation: u32,
) -> Result<u64> {
    let dialect = db.dialect();
    let mut tx = db.begin().await?;
    let record = read_record(dialect, &mut *tx, projection, true).await?;
    let storage = plan_drop(projection, record.as_ref(), generation)?;
    let docs = clear_storage(dialect, &mut *tx, &storage).await?;
    if record.is_some_and(|r| r.building == Some(generation)) {
        tx.execute(
            "ending a build",
            &dialect.sql(
                "UPDATE outbox_generations SET building = NULL, building_version = NULL, \
                 building_position = 0, updated_at = {now} WHERE projection = $1",
            ),
            &[Arg::Text(projection.as_str())],
        )
        .await?;
    }
    tx.commit("dropping a generation").await?;
    Ok(docs)
}

/// [`GenerationStore::stored_generations`](outbox_core::GenerationStore::stored_generations).
pub async fn stored_generations(
    db: &(impl Database + ?Sized),
    projection: &ProjectionName,
) -> Result<Vec<StoredGeneration>> {
    let dialect = db.dialect();
    let mut tx = db.snapshot().await?;
    let record = read_record(dialect, &mut *tx, projection, false).await?;
    let (live, building, last) = record
        .as_ref()
        .map_or((1, None, 1), |r| (r.live, r.building, r.last_generation));
    let mut out = Vec::new();
    for generation in 1..=last {
        let storage = generation_storage(projection, generation)?;
        let r = tx
            .fetch_optional(
                "reading a generation's checkpoints",
                &dialect.sql(
                    "SELECT count(*), CAST(COALESCE(sum(last_applied), 0) AS BIGINT) FROM outbox_checkpoints \
                     WHERE projection = $1",
                ),
                &[Arg::Text(storage.as_str())],
            )
            .await?;
        let (streams, events) = match r {
            Some(r) => (r.int(0)?, r.int(1)?),
            None => (0, 0),
        };
        let digest = recorded_digest(dialect, &mut *tx, &storage).await?;
        let kept = streams > 0 || digest.updated_at.is_some();
        if kept || generation == live || building == Some(generation) {
            out.push(StoredGeneration {
                generation,
                storage,
                streams: u64::try_from(streams).unwrap_or(0),
                events: u64::try_from(events).unwrap_or(0),
                digest,
            });
        }
    }
    tx.commit("reading generations").await?;
    Ok(out)
}
