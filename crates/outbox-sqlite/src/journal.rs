//! The journal database: events, outbox rows, outbox heads, stream leases.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use outbox_core::spi::{
    StoredEvent, StoredOutboxRow, duration_millis, journal_undecodable, truncate_error, unless_lease_lost,
    validate_limit, validate_ttl,
};
use outbox_core::{
    ActivityCounts, ActivityLog, ActivitySeries, AppendOptions, AppendRequest, Appended, ClaimedRun,
    DeadLetters, Error, Event, EventJournal, FailureDecision, FailureOutcome, FeedPage, Lease, LeaseAdmin,
    LeaseEntry, LeaseStore, MAX_PAGE, Mode, OutboxInspector, OutboxQueue, OutboxRow, OutboxStatus,
    OutboxSummary, Partition, PartitionStatus, PartitionStore, PartitionSync, Partitioning, Result,
    RetryPolicy, Seq, SinkFeed, SinkName, SinkStatus, SinkStore, SinkStream, SinkSummary, StreamEnd,
    StreamId, StreamVersion, SweepLimits, Timestamp, UNFINISHED_ATTEMPT, WorkerId, WorkerInfo,
    WorkerRegistry,
};
use outbox_sql::SqlJournal;
use rusqlite::{Connection, OptionalExtension, params};
use std::time::Duration;

use crate::SqliteOptions;
use crate::append::{READ_VERSION, append_body, append_inputs};
use crate::clock::now_ms;
use crate::engine::{Engines, engine_error, to_row};
use crate::files::path_from_url;
use crate::journal_tx::JournalTx;
use outbox_sql::Role;

/// The SQLite journal database: implements [`EventJournal`], [`OutboxQueue`],
/// [`LeaseStore`] and [`WorkerRegistry`] on one file.
///
/// Every write runs in a `BEGIN IMMEDIATE` transaction on the instance's
/// single writer connection, owned by a thread that runs whole transactions
/// on SQLite's C API; writes that arrive together share one commit (group
/// commit). Reads run on a second, read-only connection. Several instances (in one process or many) may open the same
/// file: SQLite's write lock and busy timeout serialize them, and every lease
/// expiry and due-time comparison happens in SQL with SQLite's clock.
/// Clones share the connections.
#[derive(Clone, Debug)]
pub struct SqliteJournal {
    /// The database file's absolute path.
    path: Arc<Path>,
    /// The clock the engine's connections read (test support).
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    clock: crate::clock::Clock,
    /// Every port call.
    engine: Arc<Engines>,
    /// The shared lease statements, rendered once for this file.
    leases: Arc<LeaseSql>,
    /// The cold-path ports, on the engine.
    sql: SqlJournal<Engines>,
    /// The journal's partitioning, resolved and stored at open.
    partitioning: Partitioning,
}

/// [`outbox_sql::journal`]'s lease statements in this dialect.
#[derive(Debug)]
struct LeaseSql {
    acquire: Arc<str>,
    renew: Arc<str>,
    /// The renewal of a partitioned claim's lease (its partition's).
    renew_partition: Arc<str>,
    release: Arc<str>,
}

fn seq_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The error mapping of one call, naming what it was doing.
fn ctx(what: &'static str) -> impl Fn(rusqlite::Error) -> Error {
    move |e| engine_error(what, e)
}

/// The upsert of `outbox_heads` entries from the outbox rows that
/// `$first_rows` (a `FROM … WHERE …` naming each stream's first row)
/// selects: a dead head is not due, any other is due by its row.
macro_rules! upsert_heads {
    ($first_rows:literal) => {
        concat!(
            "INSERT INTO outbox_heads (stream, head_seq, due_at, partition_no) \
             SELECT stream, seq, CASE WHEN status = 'dead' THEN NULL ELSE next_attempt_at END, partition_no ",
            $first_rows,
            " ON CONFLICT (stream) DO UPDATE SET head_seq = excluded.head_seq, due_at = excluded.due_at, \
             partition_no = excluded.partition_no"
        )
    };
}

/// Recomputes the stream's `outbox_heads` entry from its first outbox row
/// (or removes it when the stream has none). Two index seeks; the second
/// statement only when the stream has no row left.
fn refresh_head(conn: &Connection, stream: &str) -> rusqlite::Result<()> {
    let kept = conn
        .prepare_cached(upsert_heads!(
            "FROM outbox WHERE stream = ?1 ORDER BY seq LIMIT 1"
        ))?
        .execute([stream])?;
    if kept > 0 {
        return Ok(());
    }
    conn.prepare_cached(
        "DELETE FROM outbox_heads WHERE stream = ?1 AND NOT EXISTS (SELECT 1 FROM outbox WHERE stream = ?1)",
    )?
    .execute([stream])?;
    Ok(())
}

/// [`refresh_head`] for several streams in two statements (none when
/// `streams` is empty): each head recomputed from the stream's first row
/// (a primary-key seek each), then the heads of streams left without rows
/// removed.
fn refresh_heads(conn: &Connection, streams: &[&str]) -> rusqlite::Result<()> {
    if streams.is_empty() {
        return Ok(());
    }
    let streams = serde_json::Value::from(streams.to_vec()).to_string();
    conn.prepare_cached(upsert_heads!(
        "FROM json_each(?1) AS j JOIN outbox AS o ON o.stream = j.value \
         WHERE o.seq = (SELECT min(seq) FROM outbox WHERE stream = j.value)"
    ))?
    .execute([&streams])?;
    conn.prepare_cached(
        "DELETE FROM outbox_heads WHERE stream IN (SELECT value FROM json_each(?1)) \
         AND NOT EXISTS (SELECT 1 FROM outbox WHERE stream = outbox_heads.stream)",
    )?
    .execute([&streams])?;
    Ok(())
}

/// Whether `lease` is the stream's current, unexpired lease (SQLite's
/// clock), or for a partitioned claim's lease, its partition's.
fn lease_valid(conn: &Connection, lease: &Lease) -> rusqlite::Result<bool> {
    if let Some(p) = lease.partition {
        return conn
            .prepare_cached(concat!(
                "SELECT EXISTS (SELECT 1 FROM outbox_partition_leases WHERE partition_no = ?1 AND owner = ?2 \
                 AND epoch = ?3 AND expires_at > ",
                now_ms!(),
                ")"
            ))?
            .query_row(
                params![i64::from(p.get()), lease.owner.as_str(), seq_i64(lease.epoch)],
                |r| r.get::<_, bool>(0),
            );
    }
    conn.prepare_cached(concat!(
        "SELECT EXISTS (SELECT 1 FROM stream_leases WHERE stream = ?1 AND owner = ?2 AND epoch = ?3 \
         AND expires_at > ",
        now_ms!(),
        ")"
    ))?
    .query_row(
        params![lease.stream.as_str(), lease.owner.as_str(), seq_i64(lease.epoch)],
        |r| r.get::<_, bool>(0),
    )
}

/// The current status and attempt count of a row that must be `processing`.
fn processing_row(conn: &Connection, lease: &Lease, seq: Seq) -> Result<u32> {
    let found: Option<(String, i64)> = conn
        .prepare_cached("SELECT status, attempt_count FROM outbox WHERE stream = ?1 AND seq = ?2")
        .and_then(|mut st| {
            st.query_row(params![lease.stream.as_str(), seq.as_i64()], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
        })
        .map_err(ctx("reading an outbox row"))?;
    let (status, attempts) =
        found.ok_or_else(|| Error::NotFound(format!("outbox row {}/{seq}", lease.stream)))?;
    if status != OutboxStatus::Processing.as_str() {
        return Err(Error::InvalidState(format!(
            "outbox row {}/{seq} is {status}, not processing",
            lease.stream
        )));
    }
    Ok(u32::try_from(attempts.max(0)).unwrap_or(u32::MAX))
}

/// The claim: the head run of the stream under a valid lease, marked
/// `processing`.
fn claim_body(conn: &Connection, lease: &Lease, max: usize) -> Result<Vec<OutboxRow>> {
    if !lease_valid(conn, lease).map_err(ctx("claiming outbox rows"))? {
        return Err(lease.lost());
    }
    let rows = claim_run(conn, lease, max)?;
    if lease.partition.is_some() && !rows.is_empty() {
        hold_head(conn, lease).map_err(ctx("claiming outbox rows"))?;
    }
    Ok(rows)
}

/// The SET list that marks claimed rows `processing`, given the
/// parameters of the store's now and of the unfinished-attempt message. A
/// row found `processing` (its claimer stopped without an end) is applied
/// alone from now on (`alone` 1); if an attempt of its own had begun
/// (`alone` 2, set by `begin_attempt`), its `last_error` says so, for the
/// claimer to record (ADR 0029). No attempt is counted here, and the
/// begun mark is cleared.
macro_rules! mark_processing {
    ($now:literal, $unfinished:literal) => {
        concat!(
            "status = 'processing', updated_at = ",
            $now,
            ", alone = (alone > 0 OR status = 'processing'), \
             last_error = CASE WHEN status = 'processing' AND alone = 2 THEN ",
            $unfinished,
            " ELSE last_error END, \
             first_failed_at = CASE WHEN status = 'processing' AND alone = 2 THEN COALESCE(first_failed_at, ",
            $now,
            ") ELSE first_failed_at END"
        )
    };
}

/// The claim under a lease this transaction just acquired (so it is valid).
///
/// One read and one write: the head run's rows are read whole (with the
/// database's clock) and decoded once, then marked `processing` by a
/// statement that returns nothing; the rows handed back carry the values
/// that statement wrote.
fn claim_run(conn: &Connection, lease: &Lease, max: usize) -> Result<Vec<OutboxRow>> {
    let err = ctx("claiming outbox rows");
    let (run, now) = read_run(conn, &lease.stream, max)?;
    let (Some(first), Some(last)) = (run.first(), run.last()) else {
        return Ok(Vec::new());
    };
    let marked = conn
        .prepare_cached(concat!(
            "UPDATE outbox SET ",
            mark_processing!("?4", "?5"),
            " WHERE stream = ?1 AND seq BETWEEN ?2 AND ?3"
        ))
        .and_then(|mut st| {
            st.execute(params![
                lease.stream.as_str(),
                first.0.seq,
                last.0.seq,
                now,
                UNFINISHED_ATTEMPT
            ])
        })
        .map_err(&err)?;
    check_marked(marked, run.len())?;
    claimed_rows(run, now)
}

/// A stream's head run as [`claim_run`] takes it, not yet marked: the
/// first `max` rows in seq order (a primary-key range seek), cut at the
/// first hole, dead row or row not yet due. A row applied alone (`alone`,
/// or unfinished: `processing`) is taken only as the head, by itself.
/// Returns the run (its `alone` column as stored: 0, 1, or 2 once an
/// attempt of its own began) and the store's now.
fn read_run(conn: &Connection, stream: &StreamId, max: usize) -> Result<(Vec<(StoredOutboxRow, i64)>, i64)> {
    let err = ctx("claiming outbox rows");
    let processing = OutboxStatus::Processing.as_str();
    let mut run: Vec<(StoredOutboxRow, i64)> = Vec::new();
    let mut now = 0;
    let mut st = conn
        .prepare_cached(concat!(
            "SELECT ",
            outbox_sql::outbox_row_columns!(),
            ", ",
            now_ms!(),
            " FROM outbox WHERE stream = ?1 ORDER BY seq LIMIT ?2"
        ))
        .map_err(&err)?;
    let mut rows = st.query(params![stream.as_str(), max as i64]).map_err(&err)?;
    while let Some(r) = rows.next().map_err(&err)? {
        // What cuts the run first; the rest of a row only once it is in.
        let (seq, status, next_attempt_at, alone): (i64, String, i64, i64) = (
            r.get(1).map_err(&err)?,
            r.get(3).map_err(&err)?,
            r.get(5).map_err(&err)?,
            r.get(9).map_err(&err)?,
        );
        now = r.get(10).map_err(&err)?;
        let contiguous = run
            .first()
            .is_none_or(|(first, _)| seq == first.seq + run.len() as i64);
        if !contiguous || status == OutboxStatus::Dead.as_str() || next_attempt_at > now {
            break;
        }
        // A row applied alone is claimed by itself (as the head) or not at all.
        let by_itself = alone > 0 || status == processing;
        if by_itself && !run.is_empty() {
            break;
        }
        run.push((
            stored_row(r).map_err(|e| journal_undecodable("outbox row", e))?,
            alone,
        ));
        if by_itself {
            break;
        }
    }
    Ok((run, now))
}

/// Fails (temporarily) when a claim's update marked other than the rows
/// it read.
fn check_marked(marked: usize, read: usize) -> Result<()> {
    if marked != read {
        return Err(Error::Storage {
            message: format!("claiming outbox rows: marked {marked} rows of runs of {read}"),
            temporary: true,
            source: None,
        });
    }
    Ok(())
}

/// The rows of a run as its claim left them (see `mark_processing!`).
fn claimed_rows(run: Vec<(StoredOutboxRow, i64)>, now: i64) -> Result<Vec<OutboxRow>> {
    let processing = OutboxStatus::Processing.as_str();
    run.into_iter()
        .map(|(mut row, alone)| {
            if row.status == processing {
                if alone == 2 {
                    row.last_error = Some(UNFINISHED_ATTEMPT.to_owned());
                    row.first_failed_at = Some(row.first_failed_at.unwrap_or(now));
                }
                row.alone = true;
            }
            row.status = processing.to_owned();
            row.updated_at = now;
            row.into_row()
        })
        .collect()
}

/// An outbox row from the columns of [`outbox_sql::outbox_row_columns`],
/// straight from the statement (no intermediate values).
fn stored_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredOutboxRow> {
    Ok(StoredOutboxRow {
        stream: r.get(0)?,
        seq: r.get(1)?,
        event_type: r.get(2)?,
        status: r.get(3)?,
        attempt_count: r.get(4)?,
        next_attempt_at: r.get(5)?,
        last_error: r.get(6)?,
        updated_at: r.get(7)?,
        first_failed_at: r.get(8)?,
        alone: r.get::<_, i64>(9)? > 0,
    })
}

fn complete_body(conn: &Connection, stream: &str, through: i64) -> Result<u64> {
    let done = delete_through(conn, stream, through)?;
    if done > 0 {
        refresh_head(conn, stream).map_err(ctx("completing outbox rows"))?;
    }
    Ok(done)
}

/// Deletes the stream's rows through `through` (the head is left to the
/// caller); how many.
fn delete_through(conn: &Connection, stream: &str, through: i64) -> Result<u64> {
    let done = conn
        .prepare_cached("DELETE FROM outbox WHERE stream = ?1 AND seq <= ?2")
        .and_then(|mut st| st.execute(params![stream, through]))
        .map_err(ctx("completing outbox rows"))?;
    Ok(done as u64)
}

fn fail_body(
    conn: &Connection,
    lease: &Lease,
    seq: Seq,
    error: &str,
    policy: &RetryPolicy,
) -> Result<FailureOutcome> {
    let err = ctx("recording an outbox failure");
    if !lease_valid(conn, lease).map_err(&err)? {
        return Err(lease.lost());
    }
    let attempt = processing_row(conn, lease, seq)?.saturating_add(1);
    let (status, delay) = match policy.decide(attempt) {
        FailureDecision::DeadLetter => (OutboxStatus::Dead, 0),
        FailureDecision::Retry(d) => (OutboxStatus::Failed, duration_millis(d)),
    };
    let next: i64 = conn
        .prepare_cached(concat!(
            "UPDATE outbox SET status = ?3, attempt_count = ?4, last_error = ?5, next_attempt_at = ",
            now_ms!(),
            " + ?6, updated_at = ",
            now_ms!(),
            ", first_failed_at = COALESCE(first_failed_at, ",
            now_ms!(),
            ") WHERE stream = ?1 AND seq = ?2 RETURNING next_attempt_at"
        ))
        .and_then(|mut st| {
            st.query_row(
                params![
                    lease.stream.as_str(),
                    seq.as_i64(),
                    status.as_str(),
                    i64::from(attempt),
                    truncate_error(error),
                    delay
                ],
                |r| r.get(0),
            )
        })
        .map_err(&err)?;
    refresh_head(conn, lease.stream.as_str()).map_err(&err)?;
    Ok(match status {
        OutboxStatus::Dead => FailureOutcome::Dead { attempt },
        _ => FailureOutcome::Retry {
            attempt,
            next_attempt_at: Timestamp::from_millis(next),
        },
    })
}

fn abandon_body(conn: &Connection, lease: &Lease) -> Result<u64> {
    let err = ctx("abandoning outbox rows");
    if !lease_valid(conn, lease).map_err(&err)? {
        return Err(lease.lost());
    }
    // The walk of the stream's rows stops at its first pending row: its
    // processing rows all come before it (a claim marks a run from the
    // stream's first row on, only up to a row that is not due, and rows are
    // only ever added behind a stream's last). So it reads the claimed run
    // and the failed rows among it by the key, never the stream's backlog,
    // and no claim keeps an index of processing rows up to date for it
    // (journal migration 0011, ADR 0041).
    let n = conn
        .prepare_cached(concat!(
            "UPDATE outbox SET status = 'pending', updated_at = ",
            now_ms!(),
            " WHERE stream = ?1 AND status = 'processing' AND seq < coalesce(\
             (SELECT seq FROM outbox WHERE stream = ?1 AND status = 'pending' ORDER BY seq LIMIT 1), \
             9223372036854775807)"
        ))
        .and_then(|mut st| st.execute([lease.stream.as_str()]))
        .map_err(&err)?;
    if n > 0 {
        refresh_head(conn, lease.stream.as_str()).map_err(&err)?;
    }
    Ok(n as u64)
}

/// A row at the last event of a stream that has none there (see
/// `OutboxQueue::enqueue_catch_up`): one insert, then the stream's head.
fn enqueue_catch_up_body(conn: &Connection, stream: &str, partition: i64) -> Result<bool> {
    let err = ctx("enqueueing a catch-up row");
    let now = crate::clock::now(conn).map_err(&err)?;
    let inserted = conn
        .prepare_cached(
            "INSERT INTO outbox (stream, seq, event_type, status, attempt_count, next_attempt_at, last_error, \
             updated_at, partition_no) \
             SELECT e.stream, e.seq, e.event_type, 'pending', 0, ?2, NULL, ?2, ?3 FROM events e \
             WHERE e.stream = ?1 AND e.seq = (SELECT max(seq) FROM events WHERE stream = ?1) \
             AND NOT EXISTS (SELECT 1 FROM outbox WHERE stream = ?1 AND seq = e.seq)",
        )
        .and_then(|mut st| st.execute(params![stream, now, partition]))
        .map_err(&err)?;
    if inserted == 0 {
        return Ok(false);
    }
    refresh_head(conn, stream).map_err(&err)?;
    Ok(true)
}

/// Marks the start of an attempt of an `alone` row's own (ADR 0029).
fn begin_attempt_body(conn: &Connection, lease: &Lease, seq: Seq) -> Result<()> {
    let err = ctx("beginning an attempt");
    if !lease_valid(conn, lease).map_err(&err)? {
        return Err(lease.lost());
    }
    let marked = conn
        .prepare_cached(
            "UPDATE outbox SET alone = 2 WHERE stream = ?1 AND seq = ?2 AND status = 'processing' AND alone > 0",
        )
        .and_then(|mut st| st.execute(params![lease.stream.as_str(), seq.as_i64()]))
        .map_err(&err)?;
    if marked == 0 {
        processing_row(conn, lease, seq)?;
        return Err(Error::InvalidState(format!(
            "outbox row {}/{seq} is not applied alone",
            lease.stream
        )));
    }
    Ok(())
}

/// Takes or extends `stream`'s lease (the shared `ACQUIRE` statement).
fn acquire_body(
    conn: &Connection,
    sql: &str,
    stream: &StreamId,
    owner: &WorkerId,
    ttl: i64,
) -> Result<Option<Lease>> {
    let row = conn
        .prepare_cached(sql)
        .and_then(|mut st| {
            st.query_row(params![stream.as_str(), owner.as_str(), ttl], to_row)
                .optional()
        })
        .map_err(ctx("acquiring a stream lease"))?;
    row.map(|r| outbox_sql::journal::decode_lease(&r, stream))
        .transpose()
}

/// The end of a stream pass: the completion, the abandon (when asked) and
/// the release; a lease no longer current abandons and releases nothing.
fn end_body(
    conn: &Connection,
    release: &str,
    lease: &Lease,
    through: Option<Seq>,
    abandon: bool,
) -> Result<u64> {
    let done = match through {
        Some(t) => complete_body(conn, lease.stream.as_str(), t.as_i64())?,
        None => 0,
    };
    let abandoned = if abandon {
        unless_lease_lost(abandon_body(conn, lease))?
    } else {
        0
    };
    // Both recompute the head from the rows, which ends a partitioned
    // claim's hold on it; the release need not do it again.
    if lease.partition.is_none() || done + abandoned == 0 {
        release_body(conn, release, lease)?;
    }
    Ok(done)
}

/// Frees `lease` if it is still current (the shared `RELEASE` statement);
/// a partitioned claim's lease leaves its partition held and, while it is
/// current, puts the stream's head back in the due index by its rows.
fn release_body(conn: &Connection, sql: &str, lease: &Lease) -> Result<bool> {
    if lease.partition.is_some() {
        if lease_valid(conn, lease).map_err(ctx("ending a partitioned pass"))? {
            refresh_head(conn, lease.stream.as_str()).map_err(ctx("ending a partitioned pass"))?;
        }
        return Ok(false);
    }
    let n = conn
        .prepare_cached(sql)
        .and_then(|mut st| {
            st.execute(params![
                lease.stream.as_str(),
                lease.owner.as_str(),
                seq_i64(lease.epoch)
            ])
        })
        .map_err(ctx("releasing a stream lease"))?;
    Ok(n > 0)
}

/// Up to `limit` streams with a due head, a free lease and a partition no
/// one holds, oldest due first.
fn due_body(conn: &Connection, limit: usize) -> Result<Vec<String>> {
    conn.prepare_cached(concat!(
        "SELECT h.stream FROM outbox_heads h LEFT JOIN stream_leases l ON l.stream = h.stream \
         LEFT JOIN outbox_partition_leases p ON p.partition_no = h.partition_no \
         WHERE h.due_at IS NOT NULL AND h.due_at <= ",
        now_ms!(),
        " AND (l.owner IS NULL OR l.expires_at <= ",
        now_ms!(),
        ") AND (p.owner IS NULL OR p.expires_at <= ",
        now_ms!(),
        ") ORDER BY h.due_at, h.stream LIMIT ?1"
    ))
    .and_then(|mut st| st.query_map([limit as i64], |r| r.get(0))?.collect())
    .map_err(ctx("listing due streams"))
}

fn read_events(conn: &Connection, stream: &StreamId, from: i64, limit: i64) -> Result<Vec<Event>> {
    let err = ctx("reading a stream");
    let mut st = conn
        .prepare_cached(concat!(
            "SELECT ",
            outbox_sql::event_columns!(),
            " FROM events WHERE stream = ?1 AND seq >= ?2 ORDER BY seq LIMIT ?3"
        ))
        .map_err(&err)?;
    let mut rows = st.query(params![stream.as_str(), from, limit]).map_err(&err)?;
    let mut events = Vec::new();
    while let Some(r) = rows.next().map_err(&err)? {
        events.push(stored_event(r, stream)?.into_event(stream)?);
    }
    Ok(events)
}

/// An event's row of [`outbox_sql::event_columns!`], read straight into
/// its stored form: each text and the payload are copied once, not into a
/// row of owned values first (the hot path of every claim's load). A
/// column of the wrong type is [`Error::Corrupt`] naming the event, as
/// [`outbox_sql::journal::decode_event`] has it.
fn stored_event(r: &rusqlite::Row<'_>, stream: &StreamId) -> Result<StoredEvent> {
    let seq: i64 = r.get(2).map_err(|e| journal_undecodable("event", e))?;
    let bad = |e: rusqlite::Error| StoredEvent::column_error(stream, seq, e);
    Ok(StoredEvent {
        global_position: r.get(0).map_err(bad)?,
        stream: r.get(1).map_err(bad)?,
        seq,
        event_type: r.get(3).map_err(bad)?,
        intent: r.get(4).map_err(bad)?,
        payload: r.get(5).map_err(bad)?,
        payload_hash: r.get(6).map_err(bad)?,
        recorded_at: r.get(7).map_err(bad)?,
        correlation_id: r.get(8).map_err(bad)?,
        causation_id: r.get(9).map_err(bad)?,
    })
}

impl SqliteJournal {
    /// Opens (creating if needed, mode 0600) the journal database at `path`
    /// and applies its migrations.
    ///
    /// With [`SqliteOptions::read_only`] it is opened read-only instead:
    /// nothing is created, migrated or written, and every write it is asked
    /// for fails with one line saying so.
    ///
    /// Refused, leaving the file as it was: a file that is not a SQLite
    /// database, a read-only file (unless opened read-only), a missing directory (unless
    /// [`SqliteOptions::create_dirs`]), a projection database
    /// ([`Error::InvalidInput`]), a schema newer than this build
    /// ([`Error::SchemaTooNew`]).
    pub async fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let path = crate::migrate::prepare(path.as_ref(), &options, Role::Journal).await?;
        let dialect = Arc::new(outbox_sql::Dialect::sqlite(now_ms!()));
        let leases = Arc::new(LeaseSql {
            acquire: dialect.sql(outbox_sql::journal::ACQUIRE).into(),
            renew: dialect.sql(outbox_sql::journal::RENEW).into(),
            renew_partition: dialect.sql(outbox_sql::partitions::PARTITION_RENEW).into(),
            release: dialect.sql(outbox_sql::journal::RELEASE).into(),
        });
        let engine = Engines::start(&path, &options, dialect)?;
        let p = &options.partitions;
        let partitioning = if options.read_only {
            outbox_sql::partitions::read_partitioning(
                &engine,
                "outbox_meta",
                p.count,
                Arc::clone(&p.partitioner),
            )
            .await
        } else {
            outbox_sql::partitions::open_partitioning(
                &engine,
                "outbox_meta",
                p.count,
                Arc::clone(&p.partitioner),
                p.repartition,
            )
            .await
        };
        let partitioning = match partitioning {
            Ok(partitioning) => partitioning,
            Err(e) => {
                engine.close().await;
                return Err(e);
            }
        };
        let engine = Arc::new(engine);
        Ok(SqliteJournal {
            path: path.into(),
            clock: options.clock,
            sql: SqlJournal::new(Arc::clone(&engine)),
            engine,
            leases,
            partitioning,
        })
    }

    /// [`SqliteJournal::open`] from a `sqlite://path` or `sqlite:path` URL.
    pub async fn open_url(url: &str, options: SqliteOptions) -> Result<Self> {
        Self::open(path_from_url(url)?, options).await
    }

    /// The database file's absolute path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes the connections of this instance and its clones (later calls
    /// fail). Dropping every clone also closes them, in the background;
    /// `close` waits, so the files can be reopened or copied right after.
    pub async fn close(&self) {
        self.engine.close().await;
    }

    /// A wake-up source for workers: resolves within about a millisecond
    /// of a commit to this file by any other connection, in this process or
    /// another (see [`SqliteWakeSource`](crate::SqliteWakeSource)). Give it to
    /// the runtime (`Outbox::builder().wake_source(...)`) so a worker in one
    /// process applies what another process appends without waiting for its
    /// poll.
    pub fn wake_source(&self) -> Arc<dyn outbox_core::WakeSource> {
        Arc::new(crate::SqliteWakeSource::new(&self.path))
    }

    /// Runs `body` in a write transaction on the journal's writer
    /// connection (`BEGIN IMMEDIATE`), and commits it if `body` returns
    /// `Ok`: the application's own writes to the journal file
    /// ([`JournalTx::conn`]) and its appends ([`JournalTx::append`]) commit
    /// or roll back together. This is the adapter's answer to "append in
    /// my transaction" (the port itself has no transaction parameter).
    ///
    /// `body` runs once, on the engine's writer thread, while every other
    /// write of this store waits: keep it short and never block in it. An
    /// `Err` from `body`, or a panic in it (reported as an error), rolls
    /// the transaction back. Refused on a store opened read-only.
    ///
    /// ```no_run
    /// # async fn demo(journal: outbox_sqlite::SqliteJournal, batch: Vec<outbox_core::AppendRequest>) -> outbox_core::Result<()> {
    /// use outbox_core::AppendOptions;
    ///
    /// let appended = journal
    ///     .transaction(move |tx| {
    ///         tx.conn()
    ///             .execute("INSERT INTO orders (id) VALUES (?1)", ["o-1"])
    ///             .map_err(|e| outbox_core::Error::invalid(e.to_string()))?;
    ///         tx.append(&batch, AppendOptions::default())
    ///     })
    ///     .await?;
    /// # let _ = appended;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn transaction<T, E, F>(&self, body: F) -> std::result::Result<T, E>
    where
        T: Send + 'static,
        E: From<Error> + Send + 'static,
        F: FnOnce(&JournalTx<'_>) -> std::result::Result<T, E> + Send + 'static,
    {
        let session = self.engine.writer.session("BEGIN IMMEDIATE").await?;
        let partitioning = self.partitioning.clone();
        // The session rolls back when it is dropped without a commit.
        match session
            .run(move |conn| Ok(body(&JournalTx::new(conn, &partitioning))))
            .await?
        {
            Ok(out) => {
                outbox_sql::Tx::commit(Box::new(session), "committing the caller's transaction").await?;
                Ok(out)
            }
            Err(e) => Err(e),
        }
    }

    #[cfg(feature = "test-util")]
    /// Test support: moves this database's clock forward by `d`, for every
    /// instance on the file. The database's clock is SQLite's clock plus an
    /// offset stored in the file (0 unless this is called), so lease expiry,
    /// due times and recorded times all see the same shifted "now". Never
    /// call it on a production database.
    #[doc(hidden)]
    pub async fn advance_clock_for_tests(&self, d: std::time::Duration) -> Result<()> {
        crate::clock::check_test_clock(self.clock, &self.path)?;
        let ms = duration_millis(d);
        self.engine
            .writer
            .write(move |conn| {
                conn.execute(crate::clock::ADVANCE_TEST_CLOCK, [ms])
                    .map(drop)
                    .map_err(ctx("advancing the test clock"))
            })
            .await
    }
}

/// A page of streams after `?1` with their versions, walking the events'
/// `(stream, seq)` index from one stream to the next (each step one index
/// seek, not a scan of the stream's events), up to `?2` streams.
const STREAM_VERSIONS: &str = "WITH RECURSIVE next (stream) AS ( \
         SELECT (SELECT min(stream) FROM events WHERE stream > ?1) \
         UNION ALL \
         SELECT (SELECT min(stream) FROM events WHERE stream > next.stream) FROM next \
         WHERE next.stream IS NOT NULL LIMIT ?2 \
     ) \
     SELECT stream, (SELECT max(seq) FROM events WHERE stream = next.stream) FROM next \
     WHERE stream IS NOT NULL";

impl EventJournal for SqliteJournal {
    async fn append(&self, batch: &[AppendRequest], options: AppendOptions) -> Result<Vec<Appended>> {
        options.validate(batch)?;
        // Hashing happens here, off the writer thread.
        let (hashes, partitions) = append_inputs(batch, &self.partitioning);
        let batch = batch.to_vec();
        let enqueue = options.enqueues();
        self.engine
            .writer
            .write(move |conn| append_body(conn, &batch, &hashes, &partitions, enqueue))
            .await
    }

    async fn load(&self, stream: &StreamId, seq: Seq) -> Result<Event> {
        let s = stream.clone();
        let mut events = self
            .engine
            .reader
            .read(move |conn| read_events(conn, &s, seq.as_i64(), 1))
            .await?;
        match events.pop() {
            Some(e) if e.seq == seq => Ok(e),
            _ => Err(Error::NotFound(format!("event {stream}/{seq}"))),
        }
    }

    /// One job on the read connection.
    async fn read_runs(&self, runs: &[(StreamId, Seq, usize)]) -> Result<Vec<Vec<Event>>> {
        let runs = runs
            .iter()
            .map(|(s, from, limit)| Ok((s.clone(), from.as_i64(), validate_limit(*limit, MAX_PAGE)? as i64)))
            .collect::<Result<Vec<_>>>()?;
        self.engine
            .reader
            .read(move |conn| {
                runs.iter()
                    .map(|(s, from, limit)| read_events(conn, s, *from, *limit))
                    .collect()
            })
            .await
    }

    async fn read_stream(&self, stream: &StreamId, from: Seq, limit: usize) -> Result<Vec<Event>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let stream = stream.clone();
        self.engine
            .reader
            .read(move |conn| read_events(conn, &stream, from.as_i64(), limit as i64))
            .await
    }

    async fn read_global(&self, after: u64, limit: usize) -> Result<Vec<Event>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        self.engine
            .reader
            .read(move |conn| {
                let rows: Vec<outbox_sql::Row> = conn
                    .prepare_cached(concat!(
                        "SELECT ",
                        outbox_sql::event_columns!(),
                        " FROM events WHERE global_position > ?1 ORDER BY global_position LIMIT ?2"
                    ))
                    .and_then(|mut st| st.query_map(params![after, limit as i64], to_row)?.collect())
                    .map_err(ctx("reading the journal by global position"))?;
                rows.iter().map(outbox_sql::journal::decode_any_event).collect()
            })
            .await
    }

    async fn stream_version(&self, stream: &StreamId) -> Result<u64> {
        let stream = stream.clone();
        self.engine
            .reader
            .read(move |conn| {
                let version: Option<i64> = conn
                    .prepare_cached(READ_VERSION)
                    .and_then(|mut st| st.query_row([stream.as_str()], |r| r.get(0)))
                    .map_err(ctx("reading a stream version"))?;
                Ok(u64::try_from(version.unwrap_or(0)).unwrap_or(0))
            })
            .await
    }

    async fn stream_versions(&self, after: Option<&StreamId>, limit: usize) -> Result<Vec<StreamVersion>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let after = after.map_or(String::new(), |s| s.as_str().to_owned());
        let rows: Vec<(String, i64)> = self
            .engine
            .reader
            .read(move |conn| {
                conn.prepare_cached(STREAM_VERSIONS)
                    .and_then(|mut st| {
                        st.query_map(params![after, limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
                            .collect()
                    })
                    .map_err(ctx("listing streams"))
            })
            .await?;
        rows.into_iter()
            .map(|(s, h)| {
                Ok(StreamVersion {
                    stream: StreamId::new(s).map_err(|e| journal_undecodable("stream", e))?,
                    version: u64::try_from(h).map_err(|e| journal_undecodable("stream version", e))?,
                })
            })
            .collect()
    }
}

impl OutboxQueue for SqliteJournal {
    async fn due_streams(&self, limit: usize) -> Result<Vec<StreamId>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let rows: Vec<String> = self.engine.reader.read(move |conn| due_body(conn, limit)).await?;
        rows.into_iter()
            .map(|s| StreamId::new(s).map_err(|e| journal_undecodable("outbox head", e)))
            .collect()
    }

    async fn claim(&self, lease: &Lease, max: usize) -> Result<Vec<OutboxRow>> {
        let max = validate_limit(max, MAX_PAGE)?;
        let lease = lease.clone();
        self.engine
            .writer
            .write_relaxed(move |conn| claim_body(conn, &lease, max))
            .await
    }

    async fn complete(&self, stream: &StreamId, through: Seq) -> Result<u64> {
        let stream = stream.clone();
        self.engine
            .writer
            .write_relaxed(move |conn| complete_body(conn, stream.as_str(), through.as_i64()))
            .await
    }

    /// One transaction: a stream's lease and its run; or the due streams,
    /// their leases and runs, whose fresh runs' events are then read right
    /// after the commit, on the writer's thread (no handoff) and its
    /// read-only connection, without the write lock. The worker saves a
    /// read of its own; a retried run, which the worker sends alone, is
    /// left unread.
    async fn take(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        what: outbox_core::Take<'_>,
    ) -> Result<Vec<ClaimedRun>> {
        use outbox_core::Take;
        validate_ttl(ttl)?;
        match what {
            Take::Stream { stream, max } => {
                let max = validate_limit(max, MAX_PAGE)?;
                let (stream, owner, sql) = (stream.clone(), owner.clone(), Arc::clone(&self.leases.acquire));
                self.engine
                    .writer
                    .write_relaxed(move |conn| {
                        let Some(lease) = acquire_body(conn, &sql, &stream, &owner, duration_millis(ttl))?
                        else {
                            return Ok(Vec::new());
                        };
                        let rows = claim_run(conn, &lease, max)?;
                        Ok(vec![ClaimedRun {
                            lease,
                            rows,
                            events: None,
                        }])
                    })
                    .await
            }
            Take::Due(limits) => {
                let sweep = self.sweep(owner, ttl, limits)?;
                self.engine
                    .writer
                    .write_relaxed_then(
                        move |conn| Ok(ClaimedRun::unloaded(sweep.claim(conn)?)),
                        |conn, runs: &mut Vec<ClaimedRun>| load_runs(conn, runs),
                    )
                    .await
            }
        }
    }

    /// One transaction: every pass's completion, abandon and release.
    async fn finish(&self, ends: &[StreamEnd]) -> Result<u64> {
        let (ends, sql) = (ends.to_vec(), Arc::clone(&self.leases.release));
        self.engine
            .writer
            .write_relaxed(move |conn| {
                // The plain ends (a completion, no abandon) delete their
                // rows one by one and have their heads recomputed together.
                let (mut done, mut completed) = (0, Vec::new());
                for end in &ends {
                    let Some(through) = end.through.filter(|_| !end.abandon) else {
                        done += end_body(conn, &sql, &end.lease, end.through, end.abandon)?;
                        continue;
                    };
                    let n = delete_through(conn, end.lease.stream.as_str(), through.as_i64())?;
                    if n > 0 {
                        completed.push(end.lease.stream.as_str());
                    }
                    // See `end_body`: a recomputed head ends a partitioned hold.
                    if end.lease.partition.is_none() || n == 0 {
                        release_body(conn, &sql, &end.lease)?;
                    }
                    done += n;
                }
                completed.sort_unstable();
                completed.dedup();
                refresh_heads(conn, &completed).map_err(ctx("completing outbox rows"))?;
                Ok(done)
            })
            .await
    }

    /// One transaction: the completion, then the next claim.
    async fn complete_and_claim(
        &self,
        lease: &Lease,
        through: Seq,
        max: usize,
    ) -> Result<(u64, Vec<OutboxRow>)> {
        let max = validate_limit(max, MAX_PAGE)?;
        let lease = lease.clone();
        self.engine
            .writer
            .write_relaxed(move |conn| {
                let done = complete_body(conn, lease.stream.as_str(), through.as_i64())?;
                Ok((done, unless_lease_lost(claim_body(conn, &lease, max))?))
            })
            .await
    }

    async fn fail(
        &self,
        lease: &Lease,
        seq: Seq,
        error: &str,
        policy: &RetryPolicy,
    ) -> Result<FailureOutcome> {
        let (lease, error, policy) = (lease.clone(), error.to_owned(), *policy);
        self.engine
            .writer
            .write(move |conn| fail_body(conn, &lease, seq, &error, &policy))
            .await
    }

    async fn enqueue_catch_up(&self, stream: &StreamId) -> Result<bool> {
        let partition = i64::from(self.partitioning.of(stream).get());
        let stream = stream.as_str().to_owned();
        self.engine
            .writer
            .write(move |conn| enqueue_catch_up_body(conn, &stream, partition))
            .await
    }

    /// Lease bookkeeping: the mark survives this process's crash without
    /// waiting for the disk (ADR 0026).
    async fn begin_attempt(&self, lease: &Lease, seq: Seq) -> Result<()> {
        let lease = lease.clone();
        self.engine
            .writer
            .write_relaxed(move |conn| begin_attempt_body(conn, &lease, seq))
            .await
    }
}

impl LeaseStore for SqliteJournal {
    async fn acquire(&self, stream: &StreamId, owner: &WorkerId, ttl: Duration) -> Result<Option<Lease>> {
        validate_ttl(ttl)?;
        let (stream, owner, sql) = (stream.clone(), owner.clone(), Arc::clone(&self.leases.acquire));
        self.engine
            .writer
            .write_relaxed(move |conn| acquire_body(conn, &sql, &stream, &owner, duration_millis(ttl)))
            .await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        validate_ttl(ttl)?;
        let (lease, sql) = (
            lease.clone(),
            match lease.partition {
                Some(_) => Arc::clone(&self.leases.renew_partition),
                None => Arc::clone(&self.leases.renew),
            },
        );
        self.engine
            .writer
            .write_relaxed(move |conn| {
                let key: rusqlite::types::Value = match lease.partition {
                    Some(p) => i64::from(p.get()).into(),
                    None => lease.stream.as_str().to_owned().into(),
                };
                let expires: Option<i64> = conn
                    .prepare_cached(&sql)
                    .and_then(|mut st| {
                        st.query_row(
                            params![
                                key,
                                lease.owner.as_str(),
                                seq_i64(lease.epoch),
                                duration_millis(ttl)
                            ],
                            |r| r.get(0),
                        )
                        .optional()
                    })
                    .map_err(ctx("renewing a lease"))?;
                let expires = expires.ok_or_else(|| lease.lost())?;
                if lease.partition.is_some() {
                    let held = Lease {
                        expires_at: Timestamp::from_millis(expires),
                        ..lease.clone()
                    };
                    hold_head(conn, &held).map_err(ctx("renewing a lease"))?;
                }
                Ok(Lease {
                    expires_at: Timestamp::from_millis(expires),
                    ..lease.clone()
                })
            })
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        let (lease, sql) = (lease.clone(), Arc::clone(&self.leases.release));
        self.engine
            .writer
            .write_relaxed(move |conn| release_body(conn, &sql, &lease))
            .await
    }
}

// The other cold-path ports: the shared statements of `SqlJournal`, run
// by the engine's sessions.

impl DeadLetters for SqliteJournal {
    fn requeue(&self, stream: &StreamId, seq: Seq) -> impl Future<Output = Result<OutboxRow>> + Send {
        DeadLetters::requeue(&self.sql, stream, seq)
    }

    fn requeue_dead(&self, limit: usize) -> impl Future<Output = Result<Vec<OutboxRow>>> + Send {
        DeadLetters::requeue_dead(&self.sql, limit)
    }

    fn retry(&self, stream: &StreamId, seq: Seq) -> impl Future<Output = Result<OutboxRow>> + Send {
        DeadLetters::retry(&self.sql, stream, seq)
    }
}

impl OutboxInspector for SqliteJournal {
    fn row(&self, stream: &StreamId, seq: Seq) -> impl Future<Output = Result<Option<OutboxRow>>> + Send {
        OutboxInspector::row(&self.sql, stream, seq)
    }

    fn head(&self, stream: &StreamId) -> impl Future<Output = Result<Option<OutboxRow>>> + Send {
        OutboxInspector::head(&self.sql, stream)
    }

    fn summary(&self) -> impl Future<Output = Result<OutboxSummary>> + Send {
        OutboxInspector::summary(&self.sql)
    }

    fn list(
        &self,
        status: Option<OutboxStatus>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<OutboxRow>>> + Send {
        OutboxInspector::list(&self.sql, status, limit)
    }

    fn lease(&self, stream: &StreamId) -> impl Future<Output = Result<Option<Lease>>> + Send {
        OutboxInspector::lease(&self.sql, stream)
    }

    fn leases(
        &self,
        after: Option<&StreamId>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<LeaseEntry>>> + Send {
        OutboxInspector::leases(&self.sql, after, limit)
    }
}

impl LeaseAdmin for SqliteJournal {
    fn break_lease(&self, stream: &StreamId) -> impl Future<Output = Result<Option<Lease>>> + Send {
        LeaseAdmin::break_lease(&self.sql, stream)
    }
}

impl WorkerRegistry for SqliteJournal {
    fn heartbeat(
        &self,
        id: &WorkerId,
        host: &str,
        pid: u32,
        mode: Mode,
        ttl: Duration,
    ) -> impl Future<Output = Result<WorkerInfo>> + Send {
        WorkerRegistry::heartbeat(&self.sql, id, host, pid, mode, ttl)
    }

    fn workers(&self) -> impl Future<Output = Result<Vec<WorkerInfo>>> + Send {
        WorkerRegistry::workers(&self.sql)
    }

    fn deregister(&self, id: &WorkerId) -> impl Future<Output = Result<bool>> + Send {
        WorkerRegistry::deregister(&self.sql, id)
    }

    fn prune(&self, grace: Duration) -> impl Future<Output = Result<u64>> + Send {
        WorkerRegistry::prune(&self.sql, grace)
    }
}

impl ActivityLog for SqliteJournal {
    fn record_activity(
        &self,
        id: &WorkerId,
        counts: ActivityCounts,
    ) -> impl Future<Output = Result<()>> + Send {
        ActivityLog::record_activity(&self.sql, id, counts)
    }

    fn activity(&self, minutes: u32) -> impl Future<Output = Result<ActivitySeries>> + Send {
        ActivityLog::activity(&self.sql, minutes)
    }
}

impl SinkStore for SqliteJournal {
    fn sink_states(
        &self,
        sink: &SinkName,
        streams: &[StreamId],
    ) -> impl Future<Output = Result<Vec<SinkStream>>> + Send {
        SinkStore::sink_states(&self.sql, sink, streams)
    }

    fn advance_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
        partition: Partition,
        from: u64,
        to: Seq,
        more: bool,
    ) -> impl Future<Output = Result<bool>> + Send {
        SinkStore::advance_sink(&self.sql, sink, stream, partition, from, to, more)
    }

    fn hold_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
        partition: Partition,
        at: u64,
    ) -> impl Future<Output = Result<SinkStream>> + Send {
        SinkStore::hold_sink(&self.sql, sink, stream, partition, at)
    }

    fn fail_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
        partition: Partition,
        seq: Seq,
        error: &str,
        policy: &RetryPolicy,
    ) -> impl Future<Output = Result<FailureOutcome>> + Send {
        SinkStore::fail_sink(&self.sql, sink, stream, partition, seq, error, policy)
    }

    fn due_sink_streams(
        &self,
        sink: &SinkName,
        partitions: &[Partition],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SinkStream>>> + Send {
        SinkStore::due_sink_streams(&self.sql, sink, partitions, limit)
    }

    fn sink_streams(
        &self,
        sink: &SinkName,
        status: Option<SinkStatus>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SinkStream>>> + Send {
        SinkStore::sink_streams(&self.sql, sink, status, limit)
    }

    fn requeue_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
    ) -> impl Future<Output = Result<SinkStream>> + Send {
        SinkStore::requeue_sink(&self.sql, sink, stream)
    }

    fn sinks(&self) -> impl Future<Output = Result<Vec<SinkSummary>>> + Send {
        SinkStore::sinks(&self.sql)
    }
}

impl SinkFeed for SqliteJournal {
    async fn read_feed(&self, after: u64, limit: usize) -> Result<FeedPage> {
        outbox_sql::sinks::read_feed(self, &*self.engine, after, limit).await
    }

    fn sink_cursors(&self, sink: &SinkName) -> impl Future<Output = Result<Vec<(Partition, u64)>>> + Send {
        outbox_sql::sinks::sink_cursors(&*self.engine, sink)
    }

    fn advance_sink_cursor(
        &self,
        sink: &SinkName,
        partition: Partition,
        from: u64,
        to: u64,
    ) -> impl Future<Output = Result<bool>> + Send {
        outbox_sql::sinks::advance_sink_cursor(&*self.engine, sink, partition, from, to)
    }
}

/// A sweep's claim, checked and ready to run in the writer's transaction
/// ([`Take::Due`](outbox_core::Take::Due) of [`OutboxQueue::take`]).
struct DueSweep {
    owner: WorkerId,
    ttl: i64,
    limits: SweepLimits,
    acquire: Arc<str>,
    release: Arc<str>,
}

impl SqliteJournal {
    /// Checks a sweep's arguments.
    fn sweep(&self, owner: &WorkerId, ttl: Duration, limits: SweepLimits) -> Result<DueSweep> {
        validate_ttl(ttl)?;
        Ok(DueSweep {
            owner: owner.clone(),
            ttl: duration_millis(ttl),
            limits: limits.validated()?,
            acquire: Arc::clone(&self.leases.acquire),
            release: Arc::clone(&self.leases.release),
        })
    }
}

impl DueSweep {
    /// Leases the due streams and claims their runs, within the limits.
    fn claim(&self, conn: &Connection) -> Result<Vec<(Lease, Vec<OutboxRow>)>> {
        let (limits, mut taken, mut rows) = (self.limits, Vec::new(), 0);
        for stream in due_body(conn, limits.streams)? {
            if rows >= limits.rows {
                break;
            }
            let stream = StreamId::new(stream).map_err(|e| journal_undecodable("outbox head", e))?;
            let Some(lease) = acquire_body(conn, &self.acquire, &stream, &self.owner, self.ttl)? else {
                continue;
            };
            let run = claim_run(conn, &lease, limits.per_stream.min(limits.rows - rows))?;
            if run.is_empty() {
                release_body(conn, &self.release, &lease)?;
                continue;
            }
            rows += run.len();
            taken.push((lease, run));
        }
        Ok(taken)
    }
}

/// The payload bytes a claim reads on the writer's thread before it leaves
/// the remaining runs to the worker (see [`load_runs`]): a sweep of the
/// default 512 rows of 500-byte events is read whole.
const LOAD_BUDGET: usize = 256 * 1024;

/// Reads the events of claimed runs, after the claim committed, in one
/// read transaction. Only fresh runs are read (no row failed before): the
/// worker sends a retried run alone and reads it there. A run whose events
/// do not decode (or cannot be read) is left unread: the worker's own read
/// finds the fault and records it on the stream, where failing the claim
/// would stop every stream.
///
/// The read runs on the writer's thread, where this process's next writes
/// wait for it: once the runs read hold [`LOAD_BUDGET`] bytes of payload,
/// the rest are left unread, for the worker to read ahead on the journal's
/// read connection instead (large events cannot hold the appends up).
///
/// Nothing here fails the claim, which has committed. A read transaction
/// left open on `conn` (a step that panicked half way) is rolled back
/// first, so one bad read cannot pin an old snapshot (and the WAL) or
/// leave every later claim unread.
fn load_runs(conn: &Connection, runs: &mut [ClaimedRun]) {
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    let fresh = |run: &ClaimedRun| run.rows.iter().all(OutboxRow::is_fresh);
    if !runs.iter().any(|r| !r.rows.is_empty() && fresh(r)) {
        return;
    }
    if let Err(e) = conn.execute_batch("BEGIN") {
        tracing::debug!(error = %e, "reading claimed runs could not begin; the worker reads them");
        return;
    }
    let mut bytes = 0;
    for run in runs.iter_mut().filter(|r| fresh(r)) {
        if bytes >= LOAD_BUDGET {
            break;
        }
        let Some(first) = run.rows.first() else { continue };
        let (first, n) = (first.seq.as_i64(), run.rows.len() as i64);
        run.events = read_events(conn, &run.lease.stream, first, n).ok();
        bytes += run
            .events
            .iter()
            .flatten()
            .map(|e| e.payload.len())
            .sum::<usize>();
    }
    // A read transaction: ending it cannot lose anything. The connection
    // starts its next read with an empty cache anyway (the writer commits
    // in between): its pages are freed now, so a large backlog's event
    // pages do not stay in the worker's memory.
    if conn.execute_batch("COMMIT").is_err() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    let _ = conn.execute_batch("PRAGMA shrink_memory");
}

/// One partitioned claim, inside the engine's transaction: reads the owner's
/// partition leases, then the oldest due heads of those partitions
/// ([`due_heads`]; `partitions` is the journal's count), claims their runs
/// and holds their heads until now + `ttl`.
fn claim_partitioned_body(
    conn: &Connection,
    owner: &WorkerId,
    ttl: i64,
    limits: SweepLimits,
    partitions: u16,
) -> Result<Vec<(Lease, Vec<OutboxRow>)>> {
    let err = ctx("claiming in partitions");
    let held: Vec<outbox_sql::Row> = conn
        .prepare_cached(concat!(
            "SELECT partition_no, epoch, ",
            now_ms!(),
            " FROM outbox_partition_leases WHERE owner = ?1 AND expires_at > ",
            now_ms!(),
            " ORDER BY partition_no"
        ))
        .and_then(|mut st| st.query_map(params![owner.as_str()], to_row)?.collect())
        .map_err(&err)?;
    let held = outbox_sql::partitions::decode_held(&held)?;
    if held.is_empty() {
        return Ok(Vec::new());
    }
    let due = due_heads(conn, &held, owner, limits.streams, partitions).map_err(&err)?;
    // Each due stream's run, read one by one within the rows budget, then
    // marked (one range update per run) and held (one statement for all),
    // with the store's now of the last read as the claim's time.
    let mut runs: Vec<(Lease, Vec<(StoredOutboxRow, i64)>)> = Vec::new();
    let (mut rows, mut at) = (0, 0);
    for (_, stream, i) in due {
        if rows >= limits.rows {
            break;
        }
        let (partition, epoch, now) = held[i];
        let stream = StreamId::new(stream).map_err(|e| journal_undecodable("outbox head", e))?;
        let (run, read_at) = read_run(conn, &stream, limits.per_stream.min(limits.rows - rows))?;
        if run.is_empty() {
            continue;
        }
        at = read_at;
        rows += run.len();
        let until = Timestamp::from_millis(now.saturating_add(ttl));
        runs.push((Lease::in_partition(stream, owner, partition, epoch, until), run));
    }
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    // A run of several rows: one range update of its own, a primary-key
    // seek (measured 2.4 against 3.0 µs per row for one `UPDATE … FROM
    // json_each(…)`, which SQLite runs in two passes over a materialized
    // join). Runs of one row: all in that one statement, which measured
    // about 10% faster than one statement each at batch 1.
    let mut marked = 0;
    let singles: Vec<(&str, i64)> = runs
        .iter()
        .filter(|(_, run)| run.len() == 1)
        .map(|(lease, run)| (lease.stream.as_str(), run[0].0.seq))
        .collect();
    if !singles.is_empty() {
        let singles = outbox_sql::json_text(&singles)?;
        marked += conn
            .prepare_cached(concat!(
                "UPDATE outbox SET ",
                mark_processing!("?2", "?3"),
                " FROM json_each(?1) AS j WHERE outbox.stream = j.value ->> 0 AND outbox.seq = j.value ->> 1"
            ))
            .and_then(|mut st| st.execute(params![singles, at, UNFINISHED_ATTEMPT]))
            .map_err(&err)?;
    }
    {
        let mut mark = conn
            .prepare_cached(concat!(
                "UPDATE outbox SET ",
                mark_processing!("?4", "?5"),
                " WHERE stream = ?1 AND seq BETWEEN ?2 AND ?3"
            ))
            .map_err(&err)?;
        for (lease, run) in runs.iter().filter(|(_, run)| run.len() > 1) {
            marked += mark
                .execute(params![
                    lease.stream.as_str(),
                    run[0].0.seq,
                    run[run.len() - 1].0.seq,
                    at,
                    UNFINISHED_ATTEMPT
                ])
                .map_err(&err)?;
        }
    }
    check_marked(marked, rows)?;
    let holds: Vec<(&str, i64)> = runs
        .iter()
        .map(|(lease, _)| (lease.stream.as_str(), lease.expires_at.as_millis()))
        .collect();
    let holds = outbox_sql::json_text(&holds)?;
    conn.prepare_cached(
        "UPDATE outbox_heads SET due_at = j.value ->> 1 FROM json_each(?1) AS j \
         WHERE outbox_heads.stream = j.value ->> 0 AND outbox_heads.due_at IS NOT NULL",
    )
    .and_then(|mut st| st.execute(params![holds]))
    .map_err(&err)?;
    runs.into_iter()
        .map(|(lease, run)| Ok((lease, claimed_rows(run, at)?)))
        .collect()
}

/// How many due heads of all partitions, per head a claim may take, the
/// walk in [`due_heads`] reads before it falls back to one range per held
/// partition (as the Postgres claim does, ADR 0022).
const DUE_WINDOW: usize = 4;

/// The due heads of the owner's `held` partitions that a claim takes, at
/// most `limit`, oldest due first: each as (due at, stream, index into
/// `held`). A head whose stream another worker leases is not due.
///
/// Two ways to the same heads, chosen by how many of the journal's
/// `partitions` the owner holds:
/// - **One range per held partition** (`outbox_heads_by_partition`), each
///   up to `limit` heads, merged and cut to `limit`. Reads up to
///   `held × limit` heads: in a deep backlog a worker holding all 16
///   default partitions read 16 heads for each one it kept (with the sort,
///   about a sixth of the writer's time draining 10^4 streams at batch 1).
/// - **The oldest due heads of all partitions** (`outbox_heads_by_due`, in
///   due order), at most [`DUE_WINDOW`] × `limit` of them, keeping those of
///   held partitions. Once `limit` are kept they are the oldest due in the
///   held partitions (an older one would have come first). A window that
///   ends first (heads of partitions not held crowd it: another worker's,
///   or a dead worker's until its leases expire) falls back to the ranges,
///   so the walk never reads more than the window.
///
/// The walk is tried when the owner holds more than the square root of the
/// partition count (more than 4 of 16), where it reads fewer heads.
fn due_heads(
    conn: &Connection,
    held: &[(Partition, u64, i64)],
    owner: &WorkerId,
    limit: usize,
    partitions: u16,
) -> rusqlite::Result<Vec<(i64, String, usize)>> {
    let limit_arg = i64::try_from(limit).unwrap_or(i64::MAX);
    if held.len() * held.len() > usize::from(partitions) {
        let index: HashMap<i64, usize> = held
            .iter()
            .enumerate()
            .map(|(i, (p, _, _))| (i64::from(p.get()), i))
            .collect();
        let window = limit.saturating_mul(DUE_WINDOW);
        let mut st = conn.prepare_cached(concat!(
            "SELECT h.stream, h.due_at, h.partition_no, \
             (l.owner IS NULL OR l.owner = ?1 OR l.expires_at <= ",
            now_ms!(),
            ") FROM outbox_heads h INDEXED BY outbox_heads_by_due \
             LEFT JOIN stream_leases l ON l.stream = h.stream \
             WHERE h.due_at IS NOT NULL AND h.due_at <= ",
            now_ms!(),
            " ORDER BY h.due_at, h.stream LIMIT ?2"
        ))?;
        let mut rows = st.query(params![owner.as_str(), i64::try_from(window).unwrap_or(i64::MAX)])?;
        let (mut due, mut read) = (Vec::new(), 0);
        while let Some(row) = rows.next()? {
            read += 1;
            let (partition, free): (i64, bool) = (row.get(2)?, row.get(3)?);
            if let (Some(&i), true) = (index.get(&partition), free) {
                due.push((row.get::<_, i64>(1)?, row.get::<_, String>(0)?, i));
                if due.len() == limit {
                    return Ok(due);
                }
            }
        }
        if read < window {
            // Every due head was read: these are all of the held ones.
            return Ok(due);
        }
    }
    let mut due: Vec<(i64, String, usize)> = Vec::new();
    let mut st = conn.prepare_cached(concat!(
        "SELECT h.stream, h.due_at FROM outbox_heads h INDEXED BY outbox_heads_by_partition \
         LEFT JOIN stream_leases l ON l.stream = h.stream \
         WHERE h.partition_no = ?1 AND h.due_at IS NOT NULL AND h.due_at <= ",
        now_ms!(),
        " AND (l.owner IS NULL OR l.owner = ?2 OR l.expires_at <= ",
        now_ms!(),
        ") ORDER BY h.due_at, h.stream LIMIT ?3"
    ))?;
    for (i, (p, _, _)) in held.iter().enumerate() {
        let rows = st.query_map(params![i64::from(p.get()), owner.as_str(), limit_arg], |r| {
            Ok((r.get::<_, i64>(1)?, r.get::<_, String>(0)?, i))
        })?;
        for row in rows {
            due.push(row?);
        }
    }
    due.sort();
    due.truncate(limit);
    Ok(due)
}

/// A stream claimed in a partition has no stream lease; its head is held
/// out of the due index until the claim's lease expires, so the holder's
/// next claim does not take the run again while it is in flight, and a
/// takeover after the holder died finds it due. The pass's end
/// (`release_body`) puts the head back by its rows.
fn hold_head(conn: &Connection, lease: &Lease) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE outbox_heads SET due_at = ?2 WHERE stream = ?1 AND due_at IS NOT NULL")?
        .execute(params![lease.stream.as_str(), lease.expires_at.as_millis()])?;
    Ok(())
}

/// A joining worker takes its share from live holders at once (ADR 0022).
impl outbox_core::PartitionHandover for SqliteJournal {
    async fn sync_partitions_taking(
        &self,
        owner: &WorkerId,
        wanted: &[Partition],
        from: &[WorkerId],
        ttl: Duration,
    ) -> Result<PartitionSync> {
        outbox_sql::partitions::sync_partitions_taking(
            &*self.engine,
            &self.partitioning,
            owner,
            wanted,
            from,
            ttl,
        )
        .await
    }
}

impl PartitionStore for SqliteJournal {
    fn partitioning(&self) -> &Partitioning {
        &self.partitioning
    }

    async fn sync_partitions(
        &self,
        owner: &WorkerId,
        wanted: &[Partition],
        ttl: Duration,
    ) -> Result<PartitionSync> {
        outbox_sql::partitions::sync_partitions(&*self.engine, &self.partitioning, owner, wanted, ttl).await
    }

    /// One transaction on the engine thread.
    async fn claim_partitioned(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        limits: SweepLimits,
    ) -> Result<Vec<(Lease, Vec<OutboxRow>)>> {
        validate_ttl(ttl)?;
        let limits = limits.validated()?;
        let (owner, partitions) = (owner.clone(), self.partitioning.count());
        self.engine
            .writer
            .write_relaxed(move |conn| {
                claim_partitioned_body(conn, &owner, duration_millis(ttl), limits, partitions)
            })
            .await
    }

    /// The same claim; the fresh runs' events are read right after its
    /// commit (see `take`).
    async fn claim_and_load_partitioned(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        limits: SweepLimits,
    ) -> Result<Vec<ClaimedRun>> {
        validate_ttl(ttl)?;
        let limits = limits.validated()?;
        let (owner, partitions) = (owner.clone(), self.partitioning.count());
        self.engine
            .writer
            .write_relaxed_then(
                move |conn| {
                    claim_partitioned_body(conn, &owner, duration_millis(ttl), limits, partitions)
                        .map(ClaimedRun::unloaded)
                },
                |conn, runs: &mut Vec<ClaimedRun>| load_runs(conn, runs),
            )
            .await
    }

    async fn partitions(&self) -> Result<Vec<PartitionStatus>> {
        outbox_sql::partitions::partitions(&*self.engine, self.partitioning.count()).await
    }
}

impl outbox_core::ConsumerRegistry for SqliteJournal {
    async fn register_consumers(
        &self,
        consumers: &[(outbox_core::SinkName, outbox_core::ConsumerKind)],
        version: &str,
        worker: &outbox_core::WorkerId,
    ) -> Result<()> {
        outbox_sql::consumers::register_consumers(&*self.engine, consumers, version, worker).await
    }

    async fn consumers(&self) -> Result<Vec<outbox_core::ConsumerInfo>> {
        outbox_sql::consumers::consumers(&*self.engine).await
    }

    async fn set_paused(&self, key: &outbox_core::SinkName, paused: bool) -> Result<bool> {
        outbox_sql::consumers::set_paused(&*self.engine, key, paused).await
    }

    async fn retire_consumer(&self, key: &outbox_core::SinkName) -> Result<bool> {
        outbox_sql::consumers::retire_consumer(&*self.engine, key).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::{EventType, ExpectedVersion, Intent, NewEvent};

    const LIMITS: SweepLimits = SweepLimits {
        streams: 10,
        per_stream: 10,
        rows: 100,
    };
    const TTL: Duration = Duration::from_secs(30);

    fn owner() -> WorkerId {
        WorkerId::new("w").expect("owner")
    }

    /// A new journal in a temporary directory (kept while the guard
    /// lives), and its file's path.
    async fn temp_journal() -> (tempfile::TempDir, std::path::PathBuf, SqliteJournal) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j.db");
        let journal = SqliteJournal::open(&path, SqliteOptions::default())
            .await
            .expect("open");
        (dir, path, journal)
    }

    /// Appends `n` events carrying `payload` to `stream`.
    async fn append(journal: &SqliteJournal, stream: &str, n: usize, payload: &[u8]) {
        let event = || {
            NewEvent::new(
                EventType::new("e").expect("type"),
                Intent::Apply,
                payload.to_vec(),
            )
        };
        let stream = StreamId::new(stream).expect("stream");
        let request = AppendRequest::new(stream, ExpectedVersion::Any, (0..n).map(|_| event()).collect());
        journal
            .append(&[request], AppendOptions::enqueue())
            .await
            .expect("append");
    }

    /// Both ways of finding a claim's due heads ([`due_heads`]) take the
    /// same heads in the same order as a plain reading of the rule: heads
    /// of held partitions, due by now, not leased by another worker, oldest
    /// due first, at most the limit. Held partition sets of every size and
    /// limits below and above the due count, so the walk's window is
    /// sometimes crowded by heads of partitions not held (and falls back)
    /// and sometimes holds every due head; some heads are dead (no due
    /// time), some due later, one stream leased by another worker and one
    /// by the owner.
    #[tokio::test]
    async fn both_ways_to_the_due_heads_take_the_same_heads() {
        let (_dir, path, journal) = temp_journal().await;
        for s in 0..60 {
            append(&journal, &format!("stream-{s}"), 1, b"{}").await;
        }
        journal.close().await;
        let conn = Connection::open(&path).expect("connection");
        crate::clock::install_on(&conn, crate::clock::Clock::System).expect("clock");
        // Due times in a scrambled order (ties included), every fifth head
        // dead, every seventh due in an hour.
        conn.execute_batch(
            "UPDATE outbox_heads SET due_at = CASE \
                 WHEN CAST(substr(stream, 8) AS INTEGER) % 5 = 0 THEN NULL \
                 WHEN CAST(substr(stream, 8) AS INTEGER) % 7 = 0 THEN 99999999999999 \
                 ELSE 1000 + (CAST(substr(stream, 8) AS INTEGER) * 37) % 23 END; \
             INSERT INTO stream_leases (stream, owner, epoch, expires_at) VALUES \
                 ('stream-1', 'other', 1, 99999999999999), ('stream-2', 'w', 1, 99999999999999);",
        )
        .expect("arrange heads");
        let heads: Vec<(String, Option<i64>, i64)> = conn
            .prepare("SELECT stream, due_at, partition_no FROM outbox_heads")
            .and_then(|mut st| {
                st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect()
            })
            .expect("heads");
        let now: i64 = conn
            .query_row(concat!("SELECT ", now_ms!()), [], |r| r.get(0))
            .expect("now");
        let owner = owner();
        for held_count in [1u16, 2, 4, 5, 8, 16] {
            let held: Vec<(Partition, u64, i64)> = (0..held_count)
                .map(|p| (Partition::new(p * (16 / held_count)), 1, now))
                .collect();
            let held_numbers: Vec<i64> = held.iter().map(|(p, _, _)| i64::from(p.get())).collect();
            for limit in [3usize, 8, 100] {
                let mut expected: Vec<(i64, String)> = heads
                    .iter()
                    .filter(|(stream, due, p)| {
                        held_numbers.contains(p) && due.is_some_and(|d| d <= now) && stream != "stream-1"
                    })
                    .map(|(stream, due, _)| (due.unwrap_or_default(), stream.clone()))
                    .collect();
                expected.sort();
                expected.truncate(limit);
                for partitions in [1u16, u16::MAX] {
                    let got = due_heads(&conn, &held, &owner, limit, partitions).expect("due heads");
                    for (_, stream, i) in &got {
                        let partition = heads.iter().find(|(s, _, _)| s == stream).map(|h| h.2);
                        assert_eq!(
                            partition,
                            Some(held_numbers[*i]),
                            "{stream} is named with its own held partition"
                        );
                    }
                    let got: Vec<(i64, String)> = got.into_iter().map(|(d, s, _)| (d, s)).collect();
                    assert_eq!(
                        got,
                        expected,
                        "{held_count} held partitions, limit {limit}, {} way",
                        if partitions == 1 { "walk" } else { "per-partition" }
                    );
                }
            }
        }
        assert!(
            heads.iter().filter(|h| h.1.is_some_and(|d| d <= now)).count() > 20,
            "enough heads are due for the limits to matter"
        );
    }

    /// An abandon gives back the claimed run's processing rows, the ones
    /// behind a row that failed in it included, and stops at the stream's
    /// first pending row: failed rows stay failed, other streams' rows are
    /// untouched, and a processing row behind a pending one (which only an
    /// operator's retry racing the abandon leaves) is not the run's: the
    /// next claim takes it alone.
    #[tokio::test]
    async fn an_abandon_gives_back_the_claimed_run_up_to_the_first_pending_row() {
        let (_dir, path, journal) = temp_journal().await;
        append(&journal, "s", 9, b"{}").await;
        append(&journal, "t", 2, b"{}").await;
        let runs = journal
            .take(&owner(), TTL, outbox_core::Take::Due(LIMITS))
            .await
            .expect("claim");
        let lease = runs
            .iter()
            .find(|r| r.lease.stream.as_str() == "s")
            .map(|r| r.lease.clone())
            .expect("s claimed");
        journal.close().await;
        let conn = Connection::open(&path).expect("connection");
        crate::clock::install_on(&conn, crate::clock::Clock::System).expect("clock");
        // The run failed at 4; 7 and 8 are pending again and 9 processing
        // behind them.
        conn.execute_batch(
            "UPDATE outbox SET status = 'failed' WHERE stream = 's' AND seq = 4; \
             UPDATE outbox SET status = 'pending' WHERE stream = 's' AND seq IN (7, 8);",
        )
        .expect("arrange rows");
        let statuses = |stream: &str| -> Vec<String> {
            conn.prepare("SELECT status FROM outbox WHERE stream = ?1 ORDER BY seq")
                .and_then(|mut st| st.query_map([stream], |r| r.get(0))?.collect())
                .expect("statuses")
        };
        assert_eq!(statuses("s")[8], "processing", "the claim marked the whole run");

        let abandoned = abandon_body(&conn, &lease).expect("abandon");

        assert_eq!(abandoned, 5, "rows 1-3, 5 and 6");
        assert_eq!(
            statuses("s"),
            [
                "pending",
                "pending",
                "pending",
                "failed",
                "pending",
                "pending",
                "pending",
                "pending",
                "processing"
            ]
        );
        assert_eq!(
            statuses("t"),
            ["processing", "processing"],
            "another stream's claim stands"
        );
    }

    /// A read transaction left open on the connection that loads claimed
    /// runs (a step that panicked half way through) is ended first: it
    /// neither keeps its old snapshot, which predates the claimed events,
    /// nor stops every later claim from being read.
    #[tokio::test]
    async fn loading_runs_ends_a_read_transaction_left_open_before_it() {
        let (_dir, path, journal) = temp_journal().await;
        let conn = Connection::open(&path).expect("connection");
        conn.execute_batch("BEGIN").expect("begin");
        let before: i64 = conn
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .expect("a read that takes the snapshot");
        assert_eq!(before, 0);

        append(&journal, "s", 2, b"{}").await;
        let mut runs = journal
            .take(&owner(), TTL, outbox_core::Take::Due(LIMITS))
            .await
            .expect("claim");
        // Read again, by the loader on the stale connection.
        for run in &mut runs {
            run.events = None;
        }
        load_runs(&conn, &mut runs);

        assert!(conn.is_autocommit(), "the loader's transaction is over");
        assert_eq!(runs.len(), 1);
        assert_eq!(
            runs[0].events.as_ref().map(Vec::len),
            Some(2),
            "the run is read past the stale transaction"
        );
    }

    /// A claim reads runs on the writer's thread only until they hold
    /// `LOAD_BUDGET` bytes of payload; the rest come back unread, for the
    /// worker to read ahead off that thread.
    #[tokio::test]
    async fn a_claim_reads_runs_up_to_its_byte_budget() {
        let (_dir, _, journal) = temp_journal().await;
        let big = vec![b'x'; LOAD_BUDGET * 3 / 4];
        for s in ["a", "b", "c"] {
            append(&journal, s, 1, &big).await;
        }
        let runs = journal
            .take(&owner(), TTL, outbox_core::Take::Due(LIMITS))
            .await
            .expect("claim");
        assert_eq!(runs.len(), 3, "every stream is claimed");
        let read: Vec<bool> = runs.iter().map(|r| r.events.is_some()).collect();
        assert_eq!(
            read,
            [true, true, false],
            "two runs reach the budget; the third is left to the worker"
        );
    }
}
