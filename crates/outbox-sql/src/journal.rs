//! The journal database's cold paths: stream leases, the worker registry,
//! outbox inspection and dead-letter administration.

use std::time::Duration;

use outbox_core::spi::{
    StoredEvent, StoredLease, StoredOutboxRow, duration_millis, journal_undecodable, validate_ttl,
};
use outbox_core::spi::{validate_limit, worker_id_held};
use outbox_core::{
    ActivityCounts, ActivitySeries, Error, Event, Lease, LeaseEntry, MAX_PAGE, MINUTE_MS, MinuteActivity,
    Mode, OutboxRow, OutboxStatus, OutboxSummary, Result, Seq, StreamId, Timestamp, WorkerId, WorkerInfo,
    validate_activity_minutes,
};

use crate::{Arg, Conn, Database, Row};

/// The columns of an outbox row, in [`decode_row`]'s order.
pub const ROW_COLUMNS: &str = crate::outbox_row_columns!();

/// An event of `stream` from the columns of [`event_columns!`](crate::event_columns); a column
/// that does not decode is [`Error::Corrupt`] naming the event.
pub fn decode_event(r: &Row, stream: &StreamId) -> Result<Event> {
    let seq = r.int(2).map_err(|e| journal_undecodable("event", e))?;
    let bad = |e: Error| StoredEvent::column_error(stream, seq, e);
    StoredEvent {
        global_position: r.int(0).map_err(bad)?,
        stream: r.text(1).map_err(bad)?,
        seq,
        event_type: r.text(3).map_err(bad)?,
        intent: r.text(4).map_err(bad)?,
        payload: r.bytes(5).map_err(bad)?,
        payload_hash: r.bytes(6).map_err(bad)?,
        recorded_at: r.int(7).map_err(bad)?,
        correlation_id: r.opt_text(8).map_err(bad)?,
        causation_id: r.opt_text(9).map_err(bad)?,
    }
    .into_event(stream)
}

/// An event of whatever stream its row names (a read across streams, by
/// global position), from the columns of [`event_columns!`](crate::event_columns); a stream
/// column that is not a valid stream id is an undecodable event.
pub fn decode_any_event(r: &Row) -> Result<Event> {
    let stream = r
        .text(1)
        .and_then(StreamId::new)
        .map_err(|e| journal_undecodable("event", e))?;
    decode_event(r, &stream)
}

/// The statement of [`EventJournal::read_global`](outbox_core::EventJournal::read_global)
/// for both dialects (`$1` after, `$2` limit): a range seek on the primary key.
pub const READ_GLOBAL: &str = concat!(
    "SELECT ",
    crate::event_columns!(),
    " FROM events WHERE global_position > $1 ORDER BY global_position LIMIT $2"
);

const WORKER_COLUMNS: &str = "id, host, pid, mode, started_at, last_beat, expires_at";

fn i64_of(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// An outbox row from the columns of [`ROW_COLUMNS`].
pub fn decode_row(r: &Row) -> Result<OutboxRow> {
    let bad = |e: Error| journal_undecodable("outbox row", e);
    StoredOutboxRow {
        stream: r.text(0).map_err(bad)?,
        seq: r.int(1).map_err(bad)?,
        event_type: r.text(2).map_err(bad)?,
        status: r.text(3).map_err(bad)?,
        attempt_count: r.int(4).map_err(bad)?,
        next_attempt_at: r.int(5).map_err(bad)?,
        last_error: r.opt_text(6).map_err(bad)?,
        updated_at: r.int(7).map_err(bad)?,
        first_failed_at: r.opt_int(8).map_err(bad)?,
        alone: r.int(9).map_err(bad)? != 0,
    }
    .into_row()
}

/// A lease row (owner, epoch, expires_at) of `stream`, as [`ACQUIRE`] returns it.
pub fn decode_lease(r: &Row, stream: &StreamId) -> Result<Lease> {
    let bad = |e: Error| journal_undecodable("stream lease", e);
    StoredLease::from((
        r.text(0).map_err(bad)?,
        r.int(1).map_err(bad)?,
        r.int(2).map_err(bad)?,
    ))
    .into_lease(stream)
}

fn decode_worker(r: &Row) -> Result<WorkerInfo> {
    let bad = |e: &dyn std::fmt::Display| journal_undecodable("worker entry", e);
    let mode = r.text(3).map_err(|e| bad(&e))?;
    Ok(WorkerInfo {
        id: WorkerId::new(r.text(0).map_err(|e| bad(&e))?).map_err(|e| bad(&e))?,
        host: r.text(1).map_err(|e| bad(&e))?,
        pid: u32::try_from(r.int(2).map_err(|e| bad(&e))?).map_err(|e| bad(&e))?,
        mode: Mode::parse(&mode).ok_or_else(|| bad(&format_args!("unknown mode {mode:?}")))?,
        started_at: Timestamp::from_millis(r.int(4).map_err(|e| bad(&e))?),
        last_beat: Timestamp::from_millis(r.int(5).map_err(|e| bad(&e))?),
        expires_at: Timestamp::from_millis(r.int(6).map_err(|e| bad(&e))?),
    })
}

/// Recomputes `stream`'s head row from its first outbox row (the dialect's
/// statements), inside the caller's transaction.
pub async fn refresh_head(
    db: &(impl Database + ?Sized),
    tx: &mut (dyn Conn + '_),
    stream: &str,
) -> Result<()> {
    for statement in db.dialect().refresh_head() {
        tx.execute(
            "recomputing a stream's head row",
            &db.dialect().sql(statement),
            &[Arg::Text(stream)],
        )
        .await?;
    }
    Ok(())
}

/// Locks `stream` before its outbox rows change, where the dialect needs it.
pub async fn lock_stream(
    db: &(impl Database + ?Sized),
    tx: &mut (dyn Conn + '_),
    stream: &str,
) -> Result<()> {
    if let Some(lock) = db.dialect().lock_stream() {
        tx.fetch("locking a stream", &db.dialect().sql(lock), &[Arg::Text(stream)])
            .await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// LeaseStore
// ---------------------------------------------------------------------------

/// [`LeaseStore::acquire`](outbox_core::LeaseStore::acquire): one statement
/// takes a free, expired or released lease (epoch + 1) or extends the
/// owner's own unexpired one (same epoch); nothing otherwise. A concurrent
/// acquirer waits on the row and re-checks it after the winner's commit.
pub async fn acquire(
    db: &(impl Database + ?Sized),
    stream: &StreamId,
    owner: &WorkerId,
    ttl: Duration,
) -> Result<Option<Lease>> {
    validate_ttl(ttl)?;
    let what = "acquiring a stream lease";
    let mut tx = db.begin().await?;
    let row = tx
        .fetch_optional(
            what,
            &db.dialect().sql(ACQUIRE),
            &[
                Arg::Text(stream.as_str()),
                Arg::Text(owner.as_str()),
                Arg::Int(duration_millis(ttl)),
            ],
        )
        .await?;
    tx.commit(what).await?;
    row.map(|r| decode_lease(&r, stream)).transpose()
}

/// Takes a free, expired or released lease of stream `$1` for owner `$2`
/// for `$3` ms (epoch + 1), or extends the owner's own (same epoch); returns
/// (owner, epoch, expires_at), or no row when another owner holds it or
/// the stream's head lies in a partition another owner holds (ADR 0022).
pub const ACQUIRE: &str = "INSERT INTO stream_leases (stream, owner, epoch, expires_at) SELECT $1, $2, 1, {now} + $3 \
         WHERE NOT EXISTS (SELECT 1 FROM outbox_heads h JOIN outbox_partition_leases p \
                           ON p.partition_no = h.partition_no WHERE h.stream = $1 \
                           AND p.owner IS NOT NULL AND p.owner <> $2 AND p.expires_at > {now}) \
         ON CONFLICT (stream) DO UPDATE SET \
           epoch = CASE WHEN stream_leases.owner = excluded.owner AND stream_leases.expires_at > {now} \
                   THEN stream_leases.epoch ELSE stream_leases.epoch + 1 END, \
           owner = excluded.owner, expires_at = excluded.expires_at \
         WHERE stream_leases.owner IS NULL OR stream_leases.owner = excluded.owner \
            OR stream_leases.expires_at <= {now} \
         RETURNING owner, epoch, expires_at";

/// Extends lease (`$1` stream, `$2` owner, `$3` epoch) to `{now} + $4` ms
/// if it is still current; returns the new expiry, or no row.
pub const RENEW: &str = "UPDATE stream_leases SET expires_at = {now} + $4 \
     WHERE stream = $1 AND owner = $2 AND epoch = $3 AND expires_at > {now} RETURNING expires_at";

/// Frees lease (`$1` stream, `$2` owner, `$3` epoch) if it is still
/// current (the epoch stays, so the next holder gets the next one).
pub const RELEASE: &str = "UPDATE stream_leases SET owner = NULL, expires_at = {now} \
     WHERE stream = $1 AND owner = $2 AND epoch = $3 AND expires_at > {now}";

/// [`LeaseStore::renew`](outbox_core::LeaseStore::renew): a stream lease,
/// or the partition lease a partitioned claim's lease stands for.
pub async fn renew(db: &(impl Database + ?Sized), lease: &Lease, ttl: Duration) -> Result<Lease> {
    validate_ttl(ttl)?;
    let what = "renewing a lease";
    let (sql, key) = match lease.partition {
        Some(p) => (crate::partitions::PARTITION_RENEW, Arg::Int(i64::from(p.get()))),
        None => (RENEW, Arg::Text(lease.stream.as_str())),
    };
    let mut tx = db.begin().await?;
    let row = tx
        .fetch_optional(
            what,
            &db.dialect().sql(sql),
            &[
                key,
                Arg::Text(lease.owner.as_str()),
                Arg::Int(i64_of(lease.epoch)),
                Arg::Int(duration_millis(ttl)),
            ],
        )
        .await?;
    let expires = row.ok_or_else(|| lease.lost())?.int(0)?;
    if lease.partition.is_some() {
        tx.execute(
            what,
            &db.dialect().sql(crate::partitions::HOLD_HEAD),
            &[Arg::Text(lease.stream.as_str()), Arg::Int(expires)],
        )
        .await?;
    }
    tx.commit(what).await?;
    Ok(Lease {
        expires_at: Timestamp::from_millis(expires),
        ..lease.clone()
    })
}

/// [`LeaseStore::release`](outbox_core::LeaseStore::release): a partitioned
/// claim's lease leaves its partition held and, while it is current, puts
/// the stream's head back in the due index by its rows.
pub async fn release(db: &(impl Database + ?Sized), lease: &Lease) -> Result<bool> {
    if let Some(p) = lease.partition {
        let what = "ending a partitioned pass";
        let mut tx = db.begin().await?;
        lock_stream(db, &mut *tx, lease.stream.as_str()).await?;
        let current = tx
            .fetch_optional(
                what,
                &db.dialect().sql(crate::partitions::PARTITION_LEASE_CHECK),
                &[
                    Arg::Int(i64::from(p.get())),
                    Arg::Text(lease.owner.as_str()),
                    Arg::Int(i64_of(lease.epoch)),
                ],
            )
            .await?;
        if current.is_some() {
            refresh_head(db, &mut *tx, lease.stream.as_str()).await?;
        }
        tx.commit(what).await?;
        return Ok(false);
    }
    let what = "releasing a stream lease";
    let mut tx = db.begin().await?;
    let n = tx
        .execute(
            what,
            &db.dialect().sql(RELEASE),
            &[
                Arg::Text(lease.stream.as_str()),
                Arg::Text(lease.owner.as_str()),
                Arg::Int(i64_of(lease.epoch)),
            ],
        )
        .await?;
    tx.commit(what).await?;
    Ok(n > 0)
}

/// [`OutboxInspector::lease`](outbox_core::OutboxInspector::lease).
pub async fn lease(db: &(impl Database + ?Sized), stream: &StreamId) -> Result<Option<Lease>> {
    const LEASE: &str =
        "SELECT owner, epoch, expires_at FROM stream_leases WHERE stream = $1 AND owner IS NOT NULL";
    let mut conn = db.read().await?;
    let row = conn
        .fetch_optional(
            "reading a stream lease",
            &db.dialect().sql(LEASE),
            &[Arg::Text(stream.as_str())],
        )
        .await?;
    row.map(|r| decode_lease(&r, stream)).transpose()
}

/// [`LeaseAdmin::break_lease`](outbox_core::LeaseAdmin::break_lease): reads
/// the held lease, then frees it as its holder's `release` would (epoch
/// kept), guarded by the owner and epoch just read.
pub async fn break_lease(db: &(impl Database + ?Sized), stream: &StreamId) -> Result<Option<Lease>> {
    const HELD: &str = "SELECT owner, epoch, expires_at FROM stream_leases \
         WHERE stream = $1 AND owner IS NOT NULL";
    const BREAK: &str = "UPDATE stream_leases SET owner = NULL, expires_at = {now} \
         WHERE stream = $1 AND owner = $2 AND epoch = $3";
    let what = "breaking a stream lease";
    let mut tx = db.begin().await?;
    let Some(row) = tx
        .fetch_optional(what, &db.dialect().sql(HELD), &[Arg::Text(stream.as_str())])
        .await?
    else {
        tx.commit(what).await?;
        return Ok(None);
    };
    let lease = decode_lease(&row, stream)?;
    let n = tx
        .execute(
            what,
            &db.dialect().sql(BREAK),
            &[
                Arg::Text(stream.as_str()),
                Arg::Text(lease.owner.as_str()),
                Arg::Int(i64_of(lease.epoch)),
            ],
        )
        .await?;
    tx.commit(what).await?;
    if n == 0 {
        // Another owner took it between the read and the update (Postgres
        // runs writers concurrently): break nothing the operator did not see.
        return Err(Error::InvalidState(format!(
            "the lease of stream {stream} changed while it was being broken; look again"
        )));
    }
    Ok(Some(lease))
}

/// [`OutboxInspector::leases`](outbox_core::OutboxInspector::leases): one
/// walk of the lease table's primary key.
pub async fn leases(
    db: &(impl Database + ?Sized),
    after: Option<&StreamId>,
    limit: usize,
) -> Result<Vec<LeaseEntry>> {
    const COLUMNS: &str = "SELECT stream, owner, epoch, expires_at, \
         CASE WHEN expires_at <= {now} THEN 1 ELSE 0 END FROM stream_leases WHERE owner IS NOT NULL";
    let limit = Arg::Int(i64::try_from(validate_limit(limit, MAX_PAGE)?).unwrap_or(i64::MAX));
    let (sql, args) = match after {
        Some(a) => (
            format!("{COLUMNS} AND stream > $1 ORDER BY stream LIMIT $2"),
            vec![Arg::Text(a.as_str()), limit],
        ),
        None => (format!("{COLUMNS} ORDER BY stream LIMIT $1"), vec![limit]),
    };
    let mut conn = db.read().await?;
    let rows = conn
        .fetch("listing stream leases", &db.dialect().sql(&sql), &args)
        .await?;
    rows.iter()
        .map(|r| {
            let stream = StreamId::new(r.text(0)?).map_err(|e| journal_undecodable("stream lease", e))?;
            let lease = StoredLease::from((r.text(1)?, r.int(2)?, r.int(3)?)).into_lease(&stream)?;
            Ok(LeaseEntry {
                lease,
                expired: r.bool(4)?,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------
// WorkerRegistry
// ---------------------------------------------------------------------------

/// [`WorkerRegistry::heartbeat`](outbox_core::WorkerRegistry::heartbeat):
/// one statement, so every use of the clock sees the same `now`; a refresh
/// keeps `started_at` from the first beat. The upsert's `WHERE` refuses to
/// touch a live entry of another (host, pid): no row comes back, and the
/// holder is read in the same transaction to name it in the error.
pub async fn heartbeat(
    db: &(impl Database + ?Sized),
    id: &WorkerId,
    host: &str,
    pid: u32,
    mode: Mode,
    ttl: Duration,
) -> Result<WorkerInfo> {
    validate_ttl(ttl)?;
    if host.contains('\0') {
        return Err(Error::invalid("the worker's host contains a NUL character"));
    }
    let sql = format!(
        "INSERT INTO outbox_workers ({WORKER_COLUMNS}) VALUES ($1, $2, $3, $4, {{now}}, {{now}}, {{now}} + $5) \
         ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid, mode = excluded.mode, \
         last_beat = excluded.last_beat, expires_at = excluded.expires_at \
         WHERE outbox_workers.expires_at <= excluded.last_beat \
         OR (outbox_workers.host = excluded.host AND outbox_workers.pid = excluded.pid) \
         RETURNING {WORKER_COLUMNS}"
    );
    let what = "recording a worker heartbeat";
    let mut tx = db.begin().await?;
    let row = tx
        .fetch_optional(
            what,
            &db.dialect().sql(&sql),
            &[
                Arg::Text(id.as_str()),
                Arg::Text(host),
                Arg::Int(i64::from(pid)),
                Arg::Text(mode.as_str()),
                Arg::Int(duration_millis(ttl)),
            ],
        )
        .await?;
    let Some(row) = row else {
        let held = tx
            .fetch_optional(
                what,
                &db.dialect().sql(&format!(
                    "SELECT {WORKER_COLUMNS} FROM outbox_workers WHERE id = $1"
                )),
                &[Arg::Text(id.as_str())],
            )
            .await?
            .ok_or_else(|| journal_undecodable("worker entry", "the heartbeat returned no row"))?;
        return Err(worker_id_held(&decode_worker(&held)?));
    };
    tx.commit(what).await?;
    decode_worker(&row)
}

/// [`WorkerRegistry::workers`](outbox_core::WorkerRegistry::workers).
pub async fn workers(db: &(impl Database + ?Sized)) -> Result<Vec<WorkerInfo>> {
    let sql = format!("SELECT {WORKER_COLUMNS} FROM outbox_workers WHERE expires_at > {{now}} ORDER BY id");
    let mut conn = db.read().await?;
    let rows = conn
        .fetch("listing workers", &db.dialect().sql(&sql), &[])
        .await?;
    rows.iter().map(decode_worker).collect()
}

/// [`WorkerRegistry::deregister`](outbox_core::WorkerRegistry::deregister).
pub async fn deregister(db: &(impl Database + ?Sized), id: &WorkerId) -> Result<bool> {
    let what = "deregistering a worker";
    let mut tx = db.begin().await?;
    let n = tx
        .execute(
            what,
            &db.dialect().sql("DELETE FROM outbox_workers WHERE id = $1"),
            &[Arg::Text(id.as_str())],
        )
        .await?;
    tx.commit(what).await?;
    Ok(n > 0)
}

/// [`WorkerRegistry::prune`](outbox_core::WorkerRegistry::prune): the
/// expired entries and the activity minutes that ended `grace` ago, in one
/// transaction.
pub async fn prune(db: &(impl Database + ?Sized), grace: Duration) -> Result<u64> {
    let what = "pruning expired workers";
    let grace = duration_millis(grace);
    let mut tx = db.begin().await?;
    let n = tx
        .execute(
            what,
            &db.dialect()
                .sql("DELETE FROM outbox_workers WHERE expires_at <= {now} - $1"),
            &[Arg::Int(grace)],
        )
        .await?;
    tx.execute(
        what,
        &db.dialect().sql(&format!(
            "DELETE FROM outbox_activity WHERE minute + {MINUTE_MS} <= {{now}} - $1"
        )),
        &[Arg::Int(grace)],
    )
    .await?;
    tx.commit(what).await?;
    Ok(n)
}

/// The start of the current minute by the database clock, as SQL.
const CURRENT_MINUTE: &str = "({now} / 60000 * 60000)";

/// [`ActivityLog::record_activity`](outbox_core::ActivityLog::record_activity):
/// one upsert into the worker's own bucket.
pub async fn record_activity(
    db: &(impl Database + ?Sized),
    id: &WorkerId,
    counts: ActivityCounts,
) -> Result<()> {
    if counts.is_empty() {
        return Ok(());
    }
    let what = "recording worker activity";
    let sql = format!(
        "INSERT INTO outbox_activity (minute, worker, applied, failed, dead) \
         VALUES ({CURRENT_MINUTE}, $1, $2, $3, $4) \
         ON CONFLICT (minute, worker) DO UPDATE SET applied = outbox_activity.applied + excluded.applied, \
         failed = outbox_activity.failed + excluded.failed, dead = outbox_activity.dead + excluded.dead"
    );
    let mut tx = db.begin().await?;
    tx.execute(
        what,
        &db.dialect().sql(&sql),
        &[
            Arg::Text(id.as_str()),
            Arg::Int(i64_of(counts.applied)),
            Arg::Int(i64_of(counts.failed)),
            Arg::Int(i64_of(counts.dead)),
        ],
    )
    .await?;
    tx.commit(what).await
}

/// [`ActivityLog::activity`](outbox_core::ActivityLog::activity): the
/// current minute and the sums per minute, read in one snapshot.
pub async fn activity(db: &(impl Database + ?Sized), minutes: u32) -> Result<ActivitySeries> {
    validate_activity_minutes(minutes)?;
    let what = "reading worker activity";
    let bad = |e: &dyn std::fmt::Display| journal_undecodable("activity minute", e);
    // The current minute rides on every row (and on a row of its own, so an
    // empty window still reports it); one statement, one snapshot.
    let sql = format!(
        "WITH cur AS (SELECT {CURRENT_MINUTE} AS m) \
         SELECT cur.m, a.minute, CAST(SUM(a.applied) AS BIGINT), CAST(SUM(a.failed) AS BIGINT), \
         CAST(SUM(a.dead) AS BIGINT) \
         FROM cur JOIN outbox_activity a ON a.minute > cur.m - $1 * {MINUTE_MS} AND a.minute <= cur.m \
         GROUP BY cur.m, a.minute \
         UNION ALL SELECT cur.m, NULL, NULL, NULL, NULL FROM cur \
         ORDER BY 2"
    );
    let mut conn = db.read().await?;
    let rows = conn
        .fetch(what, &db.dialect().sql(&sql), &[Arg::Int(i64::from(minutes))])
        .await?;
    let mut current_minute = None;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        current_minute = Some(Timestamp::from_millis(r.int(0).map_err(|e| bad(&e))?));
        let Some(minute) = r.opt_int(1).map_err(|e| bad(&e))? else {
            continue;
        };
        let count =
            |i: usize| -> Result<u64> { u64::try_from(r.int(i).map_err(|e| bad(&e))?).map_err(|e| bad(&e)) };
        out.push(MinuteActivity {
            minute: Timestamp::from_millis(minute),
            counts: ActivityCounts {
                applied: count(2)?,
                failed: count(3)?,
                dead: count(4)?,
            },
        });
    }
    Ok(ActivitySeries {
        current_minute: current_minute.ok_or_else(|| bad(&"the clock row is missing"))?,
        minutes: out,
    })
}

// ---------------------------------------------------------------------------
// OutboxInspector
// ---------------------------------------------------------------------------

/// [`OutboxInspector::row`](outbox_core::OutboxInspector::row).
pub async fn row(db: &(impl Database + ?Sized), stream: &StreamId, seq: Seq) -> Result<Option<OutboxRow>> {
    let sql = format!("SELECT {ROW_COLUMNS} FROM outbox WHERE stream = $1 AND seq = $2");
    let mut conn = db.read().await?;
    let row = conn
        .fetch_optional(
            "reading an outbox row",
            &db.dialect().sql(&sql),
            &[Arg::Text(stream.as_str()), Arg::Int(seq.as_i64())],
        )
        .await?;
    row.as_ref().map(decode_row).transpose()
}

/// [`OutboxInspector::head`](outbox_core::OutboxInspector::head): a
/// primary-key seek.
pub async fn head(db: &(impl Database + ?Sized), stream: &StreamId) -> Result<Option<OutboxRow>> {
    let sql = format!("SELECT {ROW_COLUMNS} FROM outbox WHERE stream = $1 ORDER BY seq LIMIT 1");
    let mut conn = db.read().await?;
    let row = conn
        .fetch_optional(
            "reading an outbox head",
            &db.dialect().sql(&sql),
            &[Arg::Text(stream.as_str())],
        )
        .await?;
    row.as_ref().map(decode_row).transpose()
}

/// The queue summary's counts: every row and the processing ones in one
/// walk, then the failed and dead ones (pending is the rest). No `GROUP
/// BY status`: on a large backlog that sorted every row (no backend has
/// an index led by the status, ADR 0041) every time the heartbeat
/// refreshed its gauges. The total and the processing rows walk the table
/// once with no sort (no index holds processing rows: claims would write
/// it); the partial indexes of failed and dead rows count those.
pub const SUMMARY_COUNTS: &str = "SELECT t.total, t.processing, \
     (SELECT COUNT(*) FROM outbox WHERE status = 'failed'), \
     (SELECT COUNT(*) FROM outbox WHERE status = 'dead') \
     FROM (SELECT COUNT(*) AS total, COUNT(*) FILTER (WHERE status = 'processing') AS processing \
     FROM outbox) AS t";

/// [`OutboxInspector::summary`](outbox_core::OutboxInspector::summary): the
/// counts, the oldest retry-eligible row and `now`, in one snapshot: one
/// statement (a statement reads one snapshot on SQLite and Postgres), so a
/// summary costs one round trip to the database, not a transaction's
/// five (the monitor's pages read it on every request).
pub async fn summary(db: &(impl Database + ?Sized)) -> Result<OutboxSummary> {
    let what = "summarizing the outbox";
    let d = db.dialect();
    // The counts as in SUMMARY_COUNTS (the total and the processing rows
    // in one walk); the oldest applicable due time
    // (`IS NOT NULL` lets the partial index of due heads answer the min:
    // without it SQLite walked every head); the oldest pending or failed
    // row, joined on when there is one.
    let sql = format!(
        "SELECT c.now_ms, t.total, t.processing, c.failed, c.dead, c.applicable, o.* FROM (SELECT \
           {{now}} AS now_ms, \
           (SELECT COUNT(*) FROM outbox WHERE status = 'failed') AS failed, \
           (SELECT COUNT(*) FROM outbox WHERE status = 'dead') AS dead, \
           (SELECT min(due_at) FROM outbox_heads WHERE due_at IS NOT NULL) AS applicable) AS c \
         CROSS JOIN (SELECT COUNT(*) AS total, COUNT(*) FILTER (WHERE status = 'processing') AS processing \
           FROM outbox) AS t \
         LEFT JOIN (SELECT * FROM (SELECT * FROM (SELECT {ROW_COLUMNS} FROM outbox WHERE status = 'pending' \
             ORDER BY next_attempt_at, stream, seq LIMIT 1) AS p \
           UNION ALL SELECT * FROM (SELECT {ROW_COLUMNS} FROM outbox WHERE status = 'failed' \
             ORDER BY next_attempt_at, stream, seq LIMIT 1) AS f) AS pf \
           ORDER BY next_attempt_at, stream, seq LIMIT 1) AS o ON 1 = 1"
    );
    let mut conn = db.read().await?;
    let r = conn
        .fetch(what, &d.sql(&sql), &[])
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| journal_undecodable("outbox summary", "no row"))?;
    drop(conn);
    let as_of = r.int(0)?;
    let (total, processing, failed, dead) = (r.int(1)?, r.int(2)?, r.int(3)?, r.int(4)?);
    let applicable = r.opt_int(5)?;
    // The status column only takes these four values (a CHECK constraint).
    let counts = [
        ("pending", total - processing - failed - dead),
        ("processing", processing),
        ("failed", failed),
        ("dead", dead),
    ]
    .map(|(status, n)| (status.to_owned(), n));
    // The joined row's columns follow the six figures; a NULL stream is
    // no row.
    let oldest = match r.0.get(6) {
        Some(crate::Value::Null) | None => None,
        Some(_) => Some(decode_row(&Row(r.0[6..].to_vec()))?),
    };
    let mut s = OutboxSummary::from_counts(Timestamp::from_millis(as_of), oldest, counts)?;
    s.oldest_applicable_due = applicable.map(Timestamp::from_millis);
    Ok(s)
}

/// The statement of [`list`] (`$1` the limit). The status is a literal, not
/// a parameter: the failed and dead rows have partial indexes
/// (`WHERE status = 'failed'`), and a planner that does not plan with bound
/// values (SQLite's engine connections run with the query planner stability
/// guarantee, ADR 0015) matches them only by the text. The status comes from
/// the closed set of [`OutboxStatus`] names, never from input.
pub fn list_statement(status: Option<OutboxStatus>) -> String {
    match status {
        Some(st) => format!(
            "SELECT {ROW_COLUMNS} FROM outbox WHERE status = '{}' ORDER BY next_attempt_at, stream, seq LIMIT $1",
            st.as_str()
        ),
        None => format!("SELECT {ROW_COLUMNS} FROM outbox ORDER BY next_attempt_at, stream, seq LIMIT $1"),
    }
}

/// [`OutboxInspector::list`](outbox_core::OutboxInspector::list): one index
/// walk in (`next_attempt_at`, stream, seq) order, by status when given.
pub async fn list(
    db: &(impl Database + ?Sized),
    status: Option<OutboxStatus>,
    limit: usize,
) -> Result<Vec<OutboxRow>> {
    let limit = Arg::Int(i64::try_from(validate_limit(limit, MAX_PAGE)?).unwrap_or(i64::MAX));
    let mut conn = db.read().await?;
    let rows = conn
        .fetch(
            "listing outbox rows",
            &db.dialect().sql(&list_statement(status)),
            &[limit],
        )
        .await?;
    rows.iter().map(decode_row).collect()
}

// ---------------------------------------------------------------------------
// DeadLetters
// ---------------------------------------------------------------------------

/// A dead row back to pending, due now, count and error cleared; `None` if
/// it is no longer dead.
async fn revive(
    db: &(impl Database + ?Sized),
    tx: &mut (dyn Conn + '_),
    stream: &str,
    seq: i64,
) -> Result<Option<Row>> {
    let sql = format!(
        "UPDATE outbox SET status = 'pending', attempt_count = 0, last_error = NULL, first_failed_at = NULL, alone = 0, \
         next_attempt_at = {{now}}, updated_at = {{now}} \
         WHERE stream = $1 AND seq = $2 AND status = 'dead' RETURNING {ROW_COLUMNS}"
    );
    tx.fetch_optional(
        "requeueing an outbox row",
        &db.dialect().sql(&sql),
        &[Arg::Text(stream), Arg::Int(seq)],
    )
    .await
}

/// Locks `stream` (where the dialect needs it) and reads the status of its
/// row `seq`; `NotFound` when there is none.
async fn locked_status(
    db: &(impl Database + ?Sized),
    tx: &mut (dyn Conn + '_),
    stream: &StreamId,
    seq: Seq,
    what: &str,
) -> Result<String> {
    lock_stream(db, &mut *tx, stream.as_str()).await?;
    tx.fetch_optional(
        what,
        &db.dialect()
            .sql("SELECT status FROM outbox WHERE stream = $1 AND seq = $2"),
        &[Arg::Text(stream.as_str()), Arg::Int(seq.as_i64())],
    )
    .await?
    .ok_or_else(|| Error::NotFound(format!("outbox row {stream}/{seq}")))?
    .text(0)
}

/// [`DeadLetters::requeue`](outbox_core::DeadLetters::requeue).
pub async fn requeue(db: &(impl Database + ?Sized), stream: &StreamId, seq: Seq) -> Result<OutboxRow> {
    let what = "requeueing an outbox row";
    let mut tx = db.begin().await?;
    let status = locked_status(db, &mut *tx, stream, seq, what).await?;
    if status != OutboxStatus::Dead.as_str() {
        return Err(Error::InvalidState(format!(
            "outbox row {stream}/{seq} is {status}, not dead; only dead rows can be requeued"
        )));
    }
    let row = revive(db, &mut *tx, stream.as_str(), seq.as_i64())
        .await?
        .ok_or_else(|| Error::NotFound(format!("outbox row {stream}/{seq}")))?;
    refresh_head(db, &mut *tx, stream.as_str()).await?;
    tx.commit(what).await?;
    decode_row(&row)
}

/// [`DeadLetters::retry`](outbox_core::DeadLetters::retry): under the
/// stream's lock, a failed or pending row becomes pending and due now
/// (an earlier due time kept), attempts and error kept; the head follows.
pub async fn retry(db: &(impl Database + ?Sized), stream: &StreamId, seq: Seq) -> Result<OutboxRow> {
    let what = "retrying an outbox row";
    let mut tx = db.begin().await?;
    let status = locked_status(db, &mut *tx, stream, seq, what).await?;
    if status == OutboxStatus::Dead.as_str() {
        return Err(Error::InvalidState(format!(
            "outbox row {stream}/{seq} is dead; use requeue for dead rows"
        )));
    }
    if status == OutboxStatus::Processing.as_str() {
        return Err(Error::InvalidState(format!(
            "outbox row {stream}/{seq} is processing; a worker holds it"
        )));
    }
    let sql = format!(
        "UPDATE outbox SET status = 'pending', \
         next_attempt_at = CASE WHEN next_attempt_at > {{now}} THEN {{now}} ELSE next_attempt_at END, \
         updated_at = {{now}} \
         WHERE stream = $1 AND seq = $2 AND status IN ('pending', 'failed') RETURNING {ROW_COLUMNS}"
    );
    let row = tx
        .fetch_optional(
            what,
            &db.dialect().sql(&sql),
            &[Arg::Text(stream.as_str()), Arg::Int(seq.as_i64())],
        )
        .await?
        .ok_or_else(|| Error::NotFound(format!("outbox row {stream}/{seq}")))?;
    refresh_head(db, &mut *tx, stream.as_str()).await?;
    tx.commit(what).await?;
    decode_row(&row)
}

/// [`DeadLetters::requeue_dead`](outbox_core::DeadLetters::requeue_dead):
/// the oldest dead rows, their streams locked in stream order.
pub async fn requeue_dead(db: &(impl Database + ?Sized), limit: usize) -> Result<Vec<OutboxRow>> {
    let limit = validate_limit(limit, MAX_PAGE)?;
    let what = "requeueing dead outbox rows";
    let mut tx = db.begin().await?;
    let keys = tx
        .fetch(
            what,
            &db.dialect().sql(
                "SELECT stream, seq FROM outbox WHERE status = 'dead' \
                 ORDER BY next_attempt_at, stream, seq LIMIT $1",
            ),
            &[Arg::Int(i64::try_from(limit).unwrap_or(i64::MAX))],
        )
        .await?
        .iter()
        .map(|r| Ok((r.text(0)?, r.int(1)?)))
        .collect::<Result<Vec<_>>>()?;
    let mut streams: Vec<&str> = keys.iter().map(|(s, _)| s.as_str()).collect();
    streams.sort_unstable();
    streams.dedup();
    for s in &streams {
        lock_stream(db, &mut *tx, s).await?;
    }
    let mut out = Vec::with_capacity(keys.len());
    for (stream, seq) in &keys {
        // A row requeued meanwhile (between the listing and the lock) is skipped.
        if let Some(row) = revive(db, &mut *tx, stream, *seq).await? {
            out.push(decode_row(&row)?);
        }
    }
    for s in &streams {
        refresh_head(db, &mut *tx, s).await?;
    }
    tx.commit(what).await?;
    Ok(out)
}
