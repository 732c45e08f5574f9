//! Partitions (ADR 0022) on the shared statements: the journal's stored
//! partitioning and its backfill, partition lease synchronisation and the
//! partition report. The partitioned claim is each adapter's hot path and
//! lives with it; the statements it shares are here.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_core::spi::{duration_millis, journal_undecodable, validate_ttl, validate_wanted};
use outbox_core::{
    Error, Partition, PartitionLease, PartitionStatus, PartitionSync, Partitioning, Result, StreamId,
    Timestamp, WorkerId,
};

use crate::{Arg, Conn, Database, Row};

/// Whether the partition lease (`$1` partition, `$2` owner, `$3` epoch) is
/// current. Postgres appends `FOR SHARE`, so a takeover waits for the
/// transaction that checked it.
pub const PARTITION_LEASE_CHECK: &str = "SELECT 1 FROM outbox_partition_leases \
     WHERE partition_no = $1 AND owner = $2 AND epoch = $3 AND expires_at > {now}";

/// Extends partition lease (`$1` partition, `$2` owner, `$3` epoch) to
/// `{now} + $4` ms if it is still current; returns the new expiry.
pub const PARTITION_RENEW: &str = "UPDATE outbox_partition_leases SET expires_at = {now} + $4 \
     WHERE partition_no = $1 AND owner = $2 AND epoch = $3 AND expires_at > {now} RETURNING expires_at";

/// Holds stream `$1`'s head out of the due index until `$2` (a partitioned
/// claim's lease expiry): the stream is in flight.
pub const HOLD_HEAD: &str = "UPDATE outbox_heads SET due_at = $2 WHERE stream = $1 AND due_at IS NOT NULL";

/// Owner `$1`'s unexpired partition leases (partition, epoch) and the
/// clock's now: the start of a partitioned claim (the heartbeat renews
/// them; a claim only reads them).
pub const PARTITIONS_HELD: &str = "SELECT partition_no, epoch, {now} FROM outbox_partition_leases \
     WHERE owner = $1 AND expires_at > {now} ORDER BY partition_no";

/// Up to `$3` streams with a due head in partition `$1`, oldest due first,
/// whose stream lease is free, expired or owner `$2`'s: an ordered range of
/// the partial index on `outbox_heads (partition_no, due_at, stream)`.
pub const DUE_IN_PARTITION: &str = "SELECT h.stream FROM outbox_heads h \
     LEFT JOIN stream_leases l ON l.stream = h.stream \
     WHERE h.partition_no = $1 AND h.due_at IS NOT NULL AND h.due_at <= {now} \
       AND (l.owner IS NULL OR l.owner = $2 OR l.expires_at <= {now}) \
     ORDER BY h.due_at, h.stream LIMIT $3";

/// Takes partition `$1` for owner `$2` for `$3` ms when it is free, released
/// or expired (epoch + 1), or extends the owner's own unexpired lease (same
/// epoch); returns (epoch, expires_at), or no row when another owner holds it.
const PARTITION_ACQUIRE: &str = "INSERT INTO outbox_partition_leases (partition_no, owner, epoch, expires_at) \
     VALUES ($1, $2, 1, {now} + $3) \
     ON CONFLICT (partition_no) DO UPDATE SET \
       epoch = CASE WHEN outbox_partition_leases.owner = excluded.owner \
                     AND outbox_partition_leases.expires_at > {now} \
               THEN outbox_partition_leases.epoch ELSE outbox_partition_leases.epoch + 1 END, \
       owner = excluded.owner, expires_at = excluded.expires_at \
     WHERE outbox_partition_leases.owner IS NULL OR outbox_partition_leases.owner = excluded.owner \
        OR outbox_partition_leases.expires_at <= {now} \
     RETURNING epoch, expires_at";

/// Releases partition `$1` if owner `$2` holds it (the epoch stays).
const PARTITION_RELEASE: &str = "UPDATE outbox_partition_leases SET owner = NULL, expires_at = {now} \
     WHERE partition_no = $1 AND owner = $2";

fn int_of(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn partition_of(r: &Row, i: usize) -> Result<Partition> {
    let n = r.int(i)?;
    u16::try_from(n)
        .map(Partition::new)
        .map_err(|e| journal_undecodable("partition", e))
}

fn epoch_of(n: i64) -> Result<u64> {
    u64::try_from(n).map_err(|e| journal_undecodable("partition lease", e))
}

/// [`PartitionStore::sync_partitions`](outbox_core::PartitionStore::sync_partitions):
/// one transaction that visits every partition the owner holds or wants in
/// ascending order (so concurrent syncs lock partitions in one order and
/// never deadlock), releasing, renewing or acquiring each.
pub async fn sync_partitions(
    db: &(impl Database + ?Sized),
    partitioning: &Partitioning,
    owner: &WorkerId,
    wanted: &[Partition],
    ttl: Duration,
) -> Result<PartitionSync> {
    sync_partitions_taking(db, partitioning, owner, wanted, &[], ttl).await
}

/// [`PartitionHandover::sync_partitions_taking`](outbox_core::PartitionHandover::sync_partitions_taking):
/// [`sync_partitions`], where a wanted partition that a worker in `from`
/// holds is taken over (compare-and-set on its holder, epoch + 1).
pub async fn sync_partitions_taking(
    db: &(impl Database + ?Sized),
    partitioning: &Partitioning,
    owner: &WorkerId,
    wanted: &[Partition],
    from: &[WorkerId],
    ttl: Duration,
) -> Result<PartitionSync> {
    validate_ttl(ttl)?;
    let wanted = validate_wanted(wanted, partitioning.count())?;
    let what = "synchronising partition leases";
    let d = db.dialect();
    let mut tx = db.begin().await?;
    let held_before: Vec<Partition> = tx
        .fetch(
            what,
            &d.sql("SELECT partition_no FROM outbox_partition_leases WHERE owner = $1 AND expires_at > {now} ORDER BY partition_no"),
            &[Arg::Text(owner.as_str())],
        )
        .await?
        .iter()
        .map(|r| partition_of(r, 0))
        .collect::<Result<_>>()?;
    let mut visit: Vec<(Partition, bool)> = held_before
        .iter()
        .filter(|p| wanted.binary_search(p).is_err())
        .map(|p| (*p, false))
        .chain(wanted.iter().map(|p| (*p, true)))
        .collect();
    visit.sort();
    let (acquire, release) = (d.sql(PARTITION_ACQUIRE), d.sql(PARTITION_RELEASE));
    let mut out = PartitionSync::default();
    for (p, want) in visit {
        let no = Arg::Int(i64::from(p.get()));
        if !want {
            tx.execute(what, &release, &[no, Arg::Text(owner.as_str())])
                .await?;
            out.released.push(p);
            continue;
        }
        let mut row = tx
            .fetch_optional(
                what,
                &acquire,
                &[no, Arg::Text(owner.as_str()), Arg::Int(duration_millis(ttl))],
            )
            .await?;
        if row.is_none() && !from.is_empty() {
            row = take_over(&mut *tx, d, p, owner, from, ttl).await?;
        }
        match row {
            Some(r) => {
                if held_before.binary_search(&p).is_err() {
                    out.acquired.push(p);
                }
                out.held.push(PartitionLease {
                    partition: p,
                    owner: owner.clone(),
                    epoch: epoch_of(r.int(0)?)?,
                    expires_at: Timestamp::from_millis(r.int(1)?),
                });
            }
            None => out.waiting.push(p),
        }
    }
    tx.commit(what).await?;
    Ok(out)
}

/// Takes partition `$1` for owner `$2` for `$3` ms from holder `$4` while
/// that holder still holds it unexpired (epoch + 1); returns (epoch,
/// expires_at), or no row when the holder changed.
const PARTITION_TAKE_OVER: &str = "UPDATE outbox_partition_leases \
     SET owner = $2, epoch = epoch + 1, expires_at = {now} + $3 \
     WHERE partition_no = $1 AND owner = $4 AND expires_at > {now} \
     RETURNING epoch, expires_at";

/// Partition `p`'s unexpired holder, taken over for `owner` when it is one
/// of `from` (inside [`sync_partitions_taking`]'s transaction).
async fn take_over(
    tx: &mut (dyn crate::Tx + '_),
    d: &crate::Dialect,
    p: Partition,
    owner: &WorkerId,
    from: &[WorkerId],
    ttl: Duration,
) -> Result<Option<Row>> {
    let what = "taking a partition over";
    let no = || Arg::Int(i64::from(p.get()));
    let holder = tx
        .fetch_optional(
            what,
            &d.sql(
                "SELECT owner FROM outbox_partition_leases WHERE partition_no = $1 AND expires_at > {now}",
            ),
            &[no()],
        )
        .await?;
    let Some(holder) = holder.map(|r| r.opt_text(0)).transpose()?.flatten() else {
        return Ok(None);
    };
    if holder == owner.as_str() || !from.iter().any(|w| w.as_str() == holder) {
        return Ok(None);
    }
    tx.fetch_optional(
        what,
        &d.sql(PARTITION_TAKE_OVER),
        &[
            no(),
            Arg::Text(owner.as_str()),
            Arg::Int(duration_millis(ttl)),
            Arg::Text(&holder),
        ],
    )
    .await
}

/// [`PartitionStore::partitions`](outbox_core::PartitionStore::partitions):
/// the lease table and the outbox rows grouped by partition, read in one
/// snapshot.
pub async fn partitions(db: &(impl Database + ?Sized), count: u16) -> Result<Vec<PartitionStatus>> {
    let what = "reading partitions";
    let d = db.dialect();
    let mut tx = db.snapshot().await?;
    let leases = tx
        .fetch(
            what,
            &d.sql(
                "SELECT partition_no, owner, epoch, expires_at, \
                 CASE WHEN owner IS NOT NULL AND expires_at > {now} THEN 1 ELSE 0 END \
                 FROM outbox_partition_leases ORDER BY partition_no",
            ),
            &[],
        )
        .await?;
    let rows = tx
        .fetch(
            what,
            &d.sql(
                "SELECT partition_no, count(DISTINCT stream), count(*), \
                 sum(CASE WHEN status IN ('pending', 'failed') AND next_attempt_at <= {now} THEN 1 ELSE 0 END) \
                 FROM outbox GROUP BY partition_no",
            ),
            &[],
        )
        .await?;
    tx.commit(what).await?;
    let mut out: BTreeMap<Partition, PartitionStatus> = Partition::all(count)
        .map(|p| {
            (
                p,
                PartitionStatus {
                    partition: p,
                    owner: None,
                    epoch: 0,
                    expires_at: None,
                    held: false,
                    streams: 0,
                    rows: 0,
                    due_rows: 0,
                },
            )
        })
        .collect();
    for r in &leases {
        let Some(s) = out.get_mut(&partition_of(r, 0)?) else {
            continue;
        };
        s.owner = r
            .opt_text(1)?
            .map(|o| WorkerId::new(o).map_err(|e| journal_undecodable("partition lease", e)))
            .transpose()?;
        s.epoch = epoch_of(r.int(2)?)?;
        s.expires_at = Some(Timestamp::from_millis(r.int(3)?));
        s.held = r.bool(4)?;
    }
    for r in &rows {
        let Some(s) = out.get_mut(&partition_of(r, 0)?) else {
            continue;
        };
        let n = |i: usize| r.int(i).map(|v| u64::try_from(v).unwrap_or(0));
        s.streams = n(1)?;
        s.rows = n(2)?;
        s.due_rows = n(3)?;
    }
    Ok(out.into_values().collect())
}

/// The partition count and partitioner name stored in the journal's meta
/// table `meta`, each `None` until stored.
async fn stored_partitioning(
    conn: &mut (dyn Conn + '_),
    what: &str,
    meta: &str,
) -> Result<(Option<u16>, Option<String>)> {
    let stored = conn
        .fetch(
            what,
            &format!("SELECT key, value FROM {meta} WHERE key IN ('partitions', 'partitioner')"),
            &[],
        )
        .await?;
    let (mut count, mut name) = (None, None);
    for r in &stored {
        match r.text(0)?.as_str() {
            "partitions" => {
                let v = r.text(1)?;
                count = Some(
                    v.parse::<u16>()
                        .map_err(|e| journal_undecodable("partition count", e))?,
                );
            }
            _ => name = Some(r.text(1)?),
        }
    }
    Ok((count, name))
}

/// [`open_partitioning`] on a journal opened read-only: the stored
/// partitioning, checked against `count` and `partitioner` as there, and
/// nothing written. A journal that stores none yet (created before
/// partitions) is refused: opening it once with write access stores it.
pub async fn read_partitioning(
    db: &(impl Database + ?Sized),
    meta: &str,
    count: Option<u16>,
    partitioner: std::sync::Arc<dyn outbox_core::Partitioner>,
) -> Result<Partitioning> {
    let what = "reading the journal's partitioning";
    let mut tx = db.snapshot().await?;
    let (stored_count, stored_name) = stored_partitioning(&mut *tx, what, meta).await?;
    tx.commit(what).await?;
    let (Some(c), Some(n)) = (stored_count, stored_name) else {
        return Err(Error::InvalidState(
            "the journal stores no partitioning yet and is open read-only: open it once with write access \
             (`outbox migrate`) to store it"
                .into(),
        ));
    };
    let resolved = Partitioning::new(count.unwrap_or(c), partitioner)?;
    resolved.check_stored(c, &n)?;
    Ok(resolved)
}

/// Resolves and stores the journal's partitioning at open (`meta` is the
/// journal's meta table): `count` partitions (when given; else the stored
/// count, or [`DEFAULT_PARTITIONS`](outbox_core::DEFAULT_PARTITIONS) for a
/// journal that has none) by `partitioner`, in one transaction.
///
/// A journal that has no partitioning yet (new, or created before
/// partitions) gets it, and every stream with outbox rows is given its
/// partition. A journal stored with another count or partitioner is refused
/// (nothing changes), unless `repartition`: then, provided no partition
/// lease is held, every stream with outbox rows gets its new partition,
/// every partition lease is released with its epoch raised (a claim made
/// under the old partitioning is no longer current), and the new
/// partitioning is stored.
pub async fn open_partitioning(
    db: &(impl Database + ?Sized),
    meta: &str,
    count: Option<u16>,
    partitioner: std::sync::Arc<dyn outbox_core::Partitioner>,
    repartition: bool,
) -> Result<Partitioning> {
    let what = "storing the journal's partitioning";
    let d = db.dialect();
    let mut tx = db.begin().await?;
    let (stored_count, stored_name) = stored_partitioning(&mut *tx, what, meta).await?;
    let resolved = Partitioning::new(
        count.or(stored_count).unwrap_or(outbox_core::DEFAULT_PARTITIONS),
        partitioner,
    )?;
    if let (Some(c), Some(n)) = (stored_count, stored_name.as_deref()) {
        if resolved.check_stored(c, n).is_ok() {
            return Ok(resolved);
        }
        if !repartition {
            return Err(resolved.check_stored(c, n).unwrap_err());
        }
        let held = tx
            .fetch(
                what,
                &d.sql(
                    "SELECT partition_no, owner FROM outbox_partition_leases \
                     WHERE owner IS NOT NULL AND expires_at > {now} ORDER BY partition_no LIMIT 1",
                ),
                &[],
            )
            .await?;
        if let Some(r) = held.first() {
            return Err(Error::InvalidState(format!(
                "partition {} is leased by worker {}: stop every worker (or wait for its lease to expire) before repartitioning",
                partition_of(r, 0)?,
                r.text(1)?
            )));
        }
        tx.execute(
            what,
            &d.sql("UPDATE outbox_partition_leases SET owner = NULL, epoch = epoch + 1, expires_at = {now}"),
            &[],
        )
        .await?;
    }
    if stored_count.is_some() {
        // Sinks: each (sink, stream) state gets its stream's new partition,
        // and each sink's scan cursors restart, in every new partition, from
        // its lowest old one (the checkpoints skip what was delivered).
        let sink_streams = tx
            .fetch(
                what,
                "SELECT DISTINCT stream FROM outbox_sink_streams ORDER BY stream",
                &[],
            )
            .await?;
        let move_sink = d.sql("UPDATE outbox_sink_streams SET partition_no = $2 WHERE stream = $1");
        for r in &sink_streams {
            let stream = StreamId::new(r.text(0)?).map_err(|e| journal_undecodable("sink state", e))?;
            let p = Arg::Int(i64::from(resolved.of(&stream).get()));
            tx.execute(what, &move_sink, &[Arg::Text(stream.as_str()), p])
                .await?;
        }
        let lowest = tx
            .fetch(
                what,
                "SELECT sink, min(position) FROM outbox_sink_cursors GROUP BY sink ORDER BY sink",
                &[],
            )
            .await?;
        tx.execute(what, "DELETE FROM outbox_sink_cursors", &[]).await?;
        let cursor =
            d.sql("INSERT INTO outbox_sink_cursors (sink, partition_no, position) VALUES ($1, $2, $3)");
        for r in &lowest {
            let (sink, position) = (r.text(0)?, r.int(1)?);
            for p in Partition::all(resolved.count()) {
                tx.execute(
                    what,
                    &cursor,
                    &[Arg::Text(&sink), Arg::Int(i64::from(p.get())), Arg::Int(position)],
                )
                .await?;
            }
        }
    }
    let streams = tx
        .fetch(what, "SELECT stream FROM outbox_heads ORDER BY stream", &[])
        .await?;
    let (rows, heads) = (
        d.sql("UPDATE outbox SET partition_no = $2 WHERE stream = $1 AND partition_no <> $2"),
        d.sql("UPDATE outbox_heads SET partition_no = $2 WHERE stream = $1"),
    );
    for r in &streams {
        let stream = StreamId::new(r.text(0)?).map_err(|e| journal_undecodable("outbox head", e))?;
        let p = Arg::Int(i64::from(resolved.of(&stream).get()));
        tx.execute(what, &rows, &[Arg::Text(stream.as_str()), p]).await?;
        tx.execute(what, &heads, &[Arg::Text(stream.as_str()), p]).await?;
    }
    // A repartition replaces the stored values; a first store only adds
    // them, and reads back what is stored: of two processes opening a new
    // journal at once (Postgres runs them concurrently), the second waits
    // for the first's insert and is then held to its partitioning.
    let conflict = if repartition {
        "DO UPDATE SET value = excluded.value"
    } else {
        "DO NOTHING"
    };
    let store = d.sql(&format!(
        "INSERT INTO {meta} (key, value) VALUES ($1, $2) ON CONFLICT (key) {conflict}"
    ));
    let count_text = resolved.count().to_string();
    tx.execute(what, &store, &[Arg::Text("partitions"), Arg::Text(&count_text)])
        .await?;
    tx.execute(
        what,
        &store,
        &[Arg::Text("partitioner"), Arg::Text(resolved.partitioner_name())],
    )
    .await?;
    let now_stored = tx
        .fetch(
            what,
            &format!("SELECT key, value FROM {meta} WHERE key IN ('partitioner', 'partitions') ORDER BY key"),
            &[],
        )
        .await?;
    if let [name, count] = now_stored.as_slice() {
        let count = count
            .text(1)?
            .parse::<u16>()
            .map_err(|e| journal_undecodable("partition count", e))?;
        resolved.check_stored(count, &name.text(1)?)?;
    }
    tx.commit(what).await?;
    Ok(resolved)
}

/// The epoch of a lease row read back, for adapters' partitioned claims.
pub fn lease_epoch(n: i64) -> Result<u64> {
    epoch_of(n)
}

/// The claim's partition lease values: `(partition, epoch, now)` rows of
/// [`PARTITIONS_HELD`].
pub fn decode_held(rows: &[Row]) -> Result<Vec<(Partition, u64, i64)>> {
    let mut out = rows
        .iter()
        .map(|r| Ok((partition_of(r, 0)?, epoch_of(r.int(1)?)?, r.int(2)?)))
        .collect::<Result<Vec<_>>>()?;
    out.sort();
    Ok(out)
}

/// An epoch as adapters bind it.
pub fn epoch_arg(epoch: u64) -> i64 {
    int_of(epoch)
}
