//! The journal database: events, outbox rows, outbox heads, stream leases,
//! worker heartbeats.

use std::collections::HashMap;
use std::sync::Arc;

use std::time::Duration;

use outbox_core::spi::{
    duration_millis, journal_undecodable, truncate_error, unless_lease_lost, validate_limit, validate_ttl,
};
use outbox_core::{
    ActivityCounts, ActivityLog, ActivitySeries, AppendOptions, AppendRequest, Appended, DeadLetters, Error,
    Event, EventJournal, FailureDecision, FailureOutcome, FeedPage, Lease, LeaseAdmin, LeaseEntry,
    LeaseStore, MAX_PAGE, Mode, OutboxInspector, OutboxQueue, OutboxRow, OutboxStatus, OutboxSummary,
    Partition, PartitionStatus, PartitionStore, PartitionSync, Partitioning, Result, RetryPolicy, Seq,
    SinkFeed, SinkName, SinkStatus, SinkStore, SinkStream, SinkSummary, StreamEnd, StreamId, StreamVersion,
    SweepLimits, Timestamp, WakeSource, WorkerId, WorkerInfo, WorkerRegistry,
};
use sqlx::postgres::{PgConnectOptions, PgPool, PgRow};
use sqlx::{Connection, PgConnection, Postgres, Row as _, Transaction};

use crate::PgOptions;
use crate::append::Args;
use crate::db::{Db, Role, jnow, parse_url, storage};
use crate::group;
use crate::sql::RoleDb;
use crate::wake::PgWakeSource;
use outbox_sql::{Arg, SqlJournal};

/// The Postgres journal database: implements [`EventJournal`](outbox_core::EventJournal),
/// [`OutboxQueue`](outbox_core::OutboxQueue), [`LeaseStore`](outbox_core::LeaseStore) and [`WorkerRegistry`](outbox_core::WorkerRegistry) on one schema.
///
/// Any number of instances, in any number of processes and hosts, may use the
/// same schema: appends lock their streams' version rows, claims are guarded
/// by the stream lease row (locked `FOR SHARE`), and every lease expiry and
/// due time is compared in SQL with the database's clock. Clones share the
/// pool.
#[derive(Clone, Debug)]
pub struct PgJournal {
    db: Arc<Db>,
    /// The shared cold-path statements on this schema, with the journal's clock.
    sql: SqlJournal<RoleDb>,
    /// The journal's partitioning, resolved and stored at connect.
    partitioning: Partitioning,
}

fn decode_row(r: &PgRow) -> Result<OutboxRow> {
    outbox_sql::journal::decode_row(&crate::sql::to_row(r).map_err(|e| journal_undecodable("outbox row", e))?)
}

/// [`EventJournal::read_runs`] in one statement: `$1` streams, `$2` the
/// first seq and `$3` the most events of each run; each row is an event's
/// columns then the run's place in the arrays (1-based), in run then seq
/// order.
const READ_RUNS: &str = concat!(
    "SELECT e.*, r.ord FROM unnest($1::text[], $2::bigint[], $3::bigint[]) WITH ORDINALITY AS r(stream, first, most, ord) \
     CROSS JOIN LATERAL (SELECT ",
    outbox_sql::event_columns!(),
    " FROM events WHERE stream = r.stream AND seq >= r.first ORDER BY seq LIMIT r.most) e \
     ORDER BY r.ord, e.seq"
);

/// The column of [`READ_RUNS`] that holds the run's place.
const READ_RUNS_ORD: usize = 10;

fn decode_event(r: &PgRow, stream: &StreamId) -> Result<Event> {
    outbox_sql::journal::decode_event(
        &crate::sql::to_row(r).map_err(|e| journal_undecodable("event", e))?,
        stream,
    )
}

fn decode_any_event(r: &PgRow) -> Result<Event> {
    outbox_sql::journal::decode_any_event(
        &crate::sql::to_row(r).map_err(|e| journal_undecodable("event", e))?,
    )
}

/// The append turns' semaphore is never closed: the journal holds it for
/// its life.
fn slots_closed(closed: tokio::sync::AcquireError) -> Error {
    Error::storage("appending: the journal's append turns are closed", closed)
}

fn seq_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Postgres text cannot hold NUL; stored error messages replace it.
fn storable(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        std::borrow::Cow::Owned(text.replace('\0', "\u{fffd}"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// Locks the stream's version row. Every transaction that changes a
/// stream's outbox rows takes it first, so the statements after it (each
/// with a fresh READ COMMITTED snapshot) see every committed append, and
/// the head row is never recomputed from a stale view.
async fn lock_stream(conn: &mut PgConnection, stream: &str) -> sqlx::Result<()> {
    sqlx::query("SELECT 1 FROM streams WHERE stream = $1 FOR NO KEY UPDATE")
        .bind(stream)
        .fetch_optional(&mut *conn)
        .await
        .map(|_| ())
}

/// Recomputes the stream's `outbox_heads` entry from its first outbox row,
/// or removes it when the stream has none. One statement, two index seeks.
/// The caller holds the stream lock.
async fn refresh_head(conn: &mut PgConnection, stream: &str) -> sqlx::Result<()> {
    sqlx::query(
        "WITH first AS (SELECT stream, seq, CASE WHEN status = 'dead' THEN NULL ELSE next_attempt_at END AS due, \
                        partition_no FROM outbox WHERE stream = $1 ORDER BY seq LIMIT 1), \
              up AS (INSERT INTO outbox_heads (stream, head_seq, due_at, partition_no) \
                     SELECT stream, seq, due, partition_no FROM first \
                     ON CONFLICT (stream) DO UPDATE SET head_seq = excluded.head_seq, due_at = excluded.due_at, \
                     partition_no = excluded.partition_no) \
         DELETE FROM outbox_heads WHERE stream = $1 AND NOT EXISTS (SELECT 1 FROM first)",
    )
    .bind(stream)
    .execute(&mut *conn)
    .await
    .map(|_| ())
}

/// Whether `lease` is the stream's current, unexpired lease (database clock),
/// or for a partitioned claim's lease, its partition's. Locks the lease row
/// `FOR SHARE` until the transaction ends, so a takeover (which updates the
/// row) waits for this transaction.
async fn lease_valid(conn: &mut PgConnection, lease: &Lease) -> sqlx::Result<bool> {
    if let Some(p) = lease.partition {
        return sqlx::query(PARTITION_LEASE_CHECK)
            .bind(i64::from(p.get()))
            .bind(lease.owner.as_str())
            .bind(seq_i64(lease.epoch))
            .fetch_optional(&mut *conn)
            .await
            .map(|r| r.is_some());
    }
    sqlx::query(LEASE_CHECK)
        .bind(lease.stream.as_str())
        .bind(lease.owner.as_str())
        .bind(seq_i64(lease.epoch))
        .fetch_optional(&mut *conn)
        .await
        .map(|r| r.is_some())
}

/// The current attempt count of a row that must be `processing` (locked).
async fn processing_row(conn: &mut PgConnection, lease: &Lease, seq: Seq) -> Result<u32> {
    let found: Option<(String, i32)> =
        sqlx::query_as("SELECT status, attempt_count FROM outbox WHERE stream = $1 AND seq = $2 FOR UPDATE")
            .bind(lease.stream.as_str())
            .bind(seq.as_i64())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| storage("reading an outbox row", e))?;
    let (status, attempts) =
        found.ok_or_else(|| Error::NotFound(format!("outbox row {}/{seq}", lease.stream)))?;
    if status != OutboxStatus::Processing.as_str() {
        return Err(Error::InvalidState(format!(
            "outbox row {}/{seq} is {status}, not processing",
            lease.stream
        )));
    }
    Ok(u32::try_from(attempts.max(0)).unwrap_or(0))
}

impl PgJournal {
    /// Connects to the database at `url` (`postgres://` or `postgresql://`),
    /// creates the schema named by [`PgOptions::schema`] if missing and applies
    /// the journal migrations.
    ///
    /// Refused, leaving the database as it was: a schema whose journal
    /// tables are newer than this build ([`Error::SchemaTooNew`]) or carry
    /// another role's marker ([`Error::InvalidInput`]); an invalid schema
    /// name ([`Error::Config`]). The URL is never shown in errors or logs.
    pub async fn connect(url: &str, options: PgOptions) -> Result<Self> {
        Self::connect_with(parse_url(url)?, options).await
    }

    /// [`PgJournal::connect`] with parsed connection options.
    pub async fn connect_with(connect: PgConnectOptions, options: PgOptions) -> Result<Self> {
        let db = Db::pool(connect, &options)?;
        if let Err(e) = db.migrate(Role::Journal).await {
            db.close().await;
            return Err(e);
        }
        let db = Arc::new(db);
        let sql = Arc::new(RoleDb::new(Arc::clone(&db), jnow!()));
        let p = &options.partitions;
        let partitioning = match outbox_sql::partitions::open_partitioning(
            &*sql,
            "outbox_journal_meta",
            p.count,
            Arc::clone(&p.partitioner),
            p.repartition,
        )
        .await
        {
            Ok(partitioning) => partitioning,
            Err(e) => {
                db.close().await;
                return Err(e);
            }
        };
        Ok(PgJournal {
            sql: SqlJournal::new(sql),
            db,
            partitioning,
        })
    }

    pub(crate) fn db(&self) -> &Arc<Db> {
        &self.db
    }

    /// The pool (its connections use the store's schema as `search_path`).
    pub fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    /// The schema holding the journal tables.
    pub fn schema(&self) -> &str {
        &self.db.schema
    }

    /// The LISTEN/NOTIFY channel appends notify on.
    pub fn channel(&self) -> &str {
        &self.db.channel
    }

    /// Closes the pool of this instance and its clones (later calls fail).
    pub async fn close(&self) {
        self.db.close().await;
    }

    /// A wake-up source for workers: resolves when an append that enqueued
    /// rows committed anywhere on this schema (LISTEN on [`PgJournal::channel`]
    /// over a dedicated connection), or at most every few seconds while that
    /// connection is down. See [`PgWakeSource`].
    pub fn wake_source(&self) -> Arc<dyn WakeSource> {
        Arc::new(PgWakeSource::new(
            self.db.connect.clone(),
            self.db.channel.clone(),
        ))
    }

    /// Starts a transaction on a pooled connection, for
    /// [`PgJournal::append_in`] alongside the caller's own writes to the
    /// journal database. Commit it with `tx.commit()`; dropping it rolls back.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>> {
        self.db.begin().await
    }

    /// The transactional append: appends `batch` inside the caller's open
    /// transaction on the journal database (from [`PgJournal::begin`], or any
    /// transaction on a connection whose `search_path` names the journal
    /// schema), so the events and their outbox rows commit or roll back with
    /// the caller's writes. The notification, if any, is sent when the caller
    /// commits.
    ///
    /// Same contract as [`EventJournal::append`]; on any error the batch has
    /// written nothing (it runs in a savepoint) and the caller's transaction
    /// is still usable. The streams appended to stay locked until the caller
    /// commits, so keep the transaction short.
    pub async fn append_in(
        &self,
        conn: &mut PgConnection,
        batch: &[AppendRequest],
        options: AppendOptions,
    ) -> Result<Vec<Appended>> {
        options.validate(batch)?;
        if !conn.is_in_transaction() {
            return Err(Error::invalid(
                "append_in needs a connection inside a transaction (see PgJournal::begin)",
            ));
        }
        Args::new(batch, options, self.notify_channel(), &self.partitioning)?
            .append_in(conn)
            .await
    }

    /// Re-keys the sinks' feed after a logical restore into another
    /// server (ADR 0030): the stored events keep the transaction ids of the
    /// server they were written on, which this server's own may stay below
    /// for a long time, so the feed refuses them
    /// ([`FOREIGN_KEYS`](outbox_sql::sinks::FOREIGN_KEYS)). Each sink
    /// cursor becomes the position below the first event it had not read;
    /// every event gets a key below this transaction's id, in position
    /// order (migration 0007's rule); each cursor becomes the key of its
    /// position less one. Events near a cursor may be read again, which
    /// the sinks' per-stream checkpoints keep from being published twice.
    /// Returns the events re-keyed. Meant for a stopped deployment; a sink
    /// scan running meanwhile waits for it (the cursors are locked).
    pub async fn rekey_feed(&self) -> Result<u64> {
        self.write("re-keying the sinks' feed", async |tx| {
            let err = |e| storage("re-keying the sinks' feed", e);
            sqlx::query("LOCK TABLE outbox_sink_cursors IN EXCLUSIVE MODE")
                .execute(&mut *tx)
                .await
                .map_err(err)?;
            sqlx::query(REKEY_CURSORS_TO_POSITIONS)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
            let events = sqlx::query(REKEY_EVENTS).execute(&mut *tx).await.map_err(err)?;
            sqlx::query(REKEY_CURSORS_TO_KEYS)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
            Ok(events.rows_affected())
        })
        .await
    }

    #[cfg(feature = "test-util")]
    /// Test support: moves this schema's journal clock forward by `d`, for
    /// every instance. The clock is the database's clock plus an offset stored
    /// in the schema (0 unless this is called). Never call it in production.
    #[doc(hidden)]
    pub async fn advance_clock_for_tests(&self, d: std::time::Duration) -> Result<()> {
        self.db.advance_clock(Role::Journal, duration_millis(d)).await
    }

    /// An append alone on its turn, in the caller's task.
    async fn append_alone(
        &self,
        batch: &[AppendRequest],
        options: AppendOptions,
        turn: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<Vec<Appended>> {
        // No notification inside the transaction (see `notifier`): one is
        // sent after the commit, coalesced with other appends'.
        let args = Args::new(batch, options, None, &self.partitioning)?;
        let deadline = tokio::time::Instant::now() + self.db.acquire_timeout;
        let mut conn = tokio::time::timeout_at(deadline, self.db.pool.acquire())
            .await
            .map_err(|e| self.waited(e))?
            .map_err(|e| storage(self.db.context("appending events"), e))?;
        let out = args.append(&mut conn).await;
        drop(conn);
        drop(turn);
        let out = out?;
        self.appended(options);
        Ok(out)
    }

    /// Appends a group's batches in one statement on `turn`, and answers
    /// each member (see `group`).
    async fn append_group(self, mut members: Vec<group::Waiting>, turn: tokio::sync::OwnedSemaphorePermit) {
        let options = members[0].options;
        let conn = tokio::time::timeout(self.db.acquire_timeout, self.db.pool.acquire()).await;
        let mut conn = match conn {
            Ok(Ok(conn)) => conn,
            failed => {
                let e = match failed {
                    Err(elapsed) => self.waited(elapsed),
                    Ok(Err(e)) => storage(self.db.context("appending events"), e),
                    Ok(Ok(_)) => unreachable!("matched above"),
                };
                for m in members {
                    m.answer(Err(group::copy_of(&e)));
                }
                return;
            }
        };
        let mut ends = Vec::with_capacity(members.len());
        let mut merged = Vec::new();
        for m in &mut members {
            merged.append(&mut m.batch);
            ends.push(merged.len());
        }
        let ranges: Vec<std::ops::Range<usize>> = ends
            .iter()
            .scan(0, |start, &end| {
                let r = *start..end;
                *start = end;
                Some(r)
            })
            .collect();
        let together = match Args::new(&merged, options, None, &self.partitioning) {
            Ok(args) if members.len() > 1 => match args.write(&mut conn).await {
                Ok(rows) => Some(args.appended(&rows)),
                // The server answered: the statement rolled back, nothing
                // was written; each member is appended on its own.
                Err(sqlx::Error::Database(_)) => None,
                Err(e) => Some(Err(storage(self.db.context("appending events"), e))),
            },
            _ => None,
        };
        let outs: Vec<Result<Vec<Appended>>> = match together {
            Some(Ok(all)) => {
                let mut all = all.into_iter();
                ranges
                    .iter()
                    .map(|r| Ok(all.by_ref().take(r.len()).collect()))
                    .collect()
            }
            Some(Err(e)) => ranges.iter().map(|_| Err(group::copy_of(&e))).collect(),
            None => {
                let mut outs = Vec::with_capacity(ranges.len());
                for r in &ranges {
                    let out = match Args::new(&merged[r.clone()], options, None, &self.partitioning) {
                        Ok(args) => args.append(&mut conn).await,
                        Err(e) => Err(e),
                    };
                    outs.push(out);
                }
                outs
            }
        };
        drop(conn);
        drop(turn);
        if outs.iter().any(Result::is_ok) {
            self.appended(options);
        }
        for (m, out) in members.into_iter().zip(outs) {
            m.answer(out);
        }
    }

    /// After an append committed: wakes the listeners, if it enqueued.
    fn appended(&self, options: AppendOptions) {
        if options.enqueues()
            && let Some(channel) = self.notify_channel()
        {
            self.db.notifier.poke(&self.db.pool, channel);
        }
    }

    /// The error of an append that waited `acquire_timeout` for its turn or
    /// its connection.
    fn waited(&self, elapsed: tokio::time::error::Elapsed) -> Error {
        Error::temporary(
            format_args!(
                "waiting {:?} for a connection to append with (every connection appends may \
                 hold was busy)",
                self.db.acquire_timeout
            ),
            elapsed,
        )
    }

    fn notify_channel(&self) -> Option<&str> {
        self.db.notify.then_some(self.db.channel.as_str())
    }

    /// `f` in a transaction whose commit waits for the disk: appends and
    /// failure records.
    async fn write<T>(
        &self,
        what: &'static str,
        f: impl AsyncFnOnce(&mut PgConnection) -> Result<T>,
    ) -> Result<T> {
        let tx = self.db.begin().await?;
        self.run_in(tx, what, f).await
    }

    /// `f` in a transaction whose commit does not wait for the disk: the
    /// workers' claims, completions and releases, which the projection
    /// checkpoints make safe to lose and redo (ADR 0027).
    async fn write_relaxed<T>(
        &self,
        what: &'static str,
        f: impl AsyncFnOnce(&mut PgConnection) -> Result<T>,
    ) -> Result<T> {
        let tx = self.db.begin_relaxed().await?;
        self.run_in(tx, what, f).await
    }

    async fn run_in<T>(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
        what: &'static str,
        f: impl AsyncFnOnce(&mut PgConnection) -> Result<T>,
    ) -> Result<T> {
        let out = f(&mut tx).await?;
        tx.commit().await.map_err(|e| storage(self.db.context(what), e))?;
        Ok(out)
    }
}

impl EventJournal for PgJournal {
    /// Appends take turns for their share of the pool
    /// (`PgOptions::append_connections`): the reserved connections stay
    /// free for the runtime's calls (`PgOptions::reserved_connections`).
    /// An append that finds a turn
    /// free and none queued runs alone; otherwise it queues, and whichever
    /// queued append gets the next turn appends every queued batch in one
    /// statement (`group`). The turn and the connection share one
    /// `acquire_timeout`, as one wait for a connection would.
    async fn append(&self, batch: &[AppendRequest], options: AppendOptions) -> Result<Vec<Appended>> {
        options.validate(batch)?;
        crate::append::check_text(batch)?;
        if self.db.appends.is_empty()
            && let Ok(turn) = self.db.append_slots.clone().try_acquire_owned()
        {
            return self.append_alone(batch, options, turn).await;
        }
        let (id, mut answer) = self.db.appends.push(batch, options);
        let deadline = tokio::time::Instant::now() + self.db.acquire_timeout;
        loop {
            let turn = tokio::select! {
                biased;
                out = &mut answer => return out.unwrap_or_else(|_| Err(group::unanswered())),
                turn = tokio::time::timeout_at(deadline, self.db.append_slots.clone().acquire_owned()) => turn,
            };
            let turn = match turn {
                Ok(turn) => turn.map_err(slots_closed)?,
                Err(elapsed) if self.db.appends.withdraw(id) => return Err(self.waited(elapsed)),
                // A group took the batch: its outcome is on the way.
                Err(_) => return answer.await.unwrap_or_else(|_| Err(group::unanswered())),
            };
            let members = self.db.appends.take();
            if members.is_empty() {
                drop(turn);
                return answer.await.unwrap_or_else(|_| Err(group::unanswered()));
            }
            // Its own task: no caller's deadline cancels another's append.
            tokio::spawn(self.clone().append_group(members, turn));
        }
    }

    async fn load(&self, stream: &StreamId, seq: Seq) -> Result<Event> {
        let row = sqlx::query(concat!(
            "SELECT ",
            outbox_sql::event_columns!(),
            " FROM events WHERE stream = $1 AND seq = $2"
        ))
        .bind(stream.as_str())
        .bind(seq.as_i64())
        .fetch_optional(&self.db.pool)
        .await
        .map_err(|e| storage(self.db.context("loading an event"), e))?
        .ok_or_else(|| Error::NotFound(format!("event {stream}/{seq}")))?;
        decode_event(&row, stream)
    }

    async fn read_stream(&self, stream: &StreamId, from: Seq, limit: usize) -> Result<Vec<Event>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let rows = sqlx::query(concat!(
            "SELECT ",
            outbox_sql::event_columns!(),
            " FROM events WHERE stream = $1 AND seq >= $2 ORDER BY seq LIMIT $3"
        ))
        .bind(stream.as_str())
        .bind(from.as_i64())
        .bind(limit as i64)
        .fetch_all(&self.db.pool)
        .await
        .map_err(|e| storage(self.db.context("reading a stream"), e))?;
        rows.iter().map(|r| decode_event(r, stream)).collect()
    }

    /// One statement for every run (a sweep's reads were one round trip
    /// per stream): each run's range, in the order asked.
    async fn read_runs(&self, runs: &[(StreamId, Seq, usize)]) -> Result<Vec<Vec<Event>>> {
        let mut streams = Vec::with_capacity(runs.len());
        let (mut froms, mut limits) = (Vec::with_capacity(runs.len()), Vec::with_capacity(runs.len()));
        for (stream, from, limit) in runs {
            streams.push(stream.as_str());
            froms.push(from.as_i64());
            limits.push(validate_limit(*limit, MAX_PAGE)? as i64);
        }
        let rows = sqlx::query(READ_RUNS)
            .bind(&streams)
            .bind(&froms)
            .bind(&limits)
            .fetch_all(&self.db.pool)
            .await
            .map_err(|e| storage(self.db.context("reading runs of streams"), e))?;
        let mut out: Vec<Vec<Event>> = runs.iter().map(|_| Vec::new()).collect();
        for r in &rows {
            // The run's place (1-based), after the event's columns.
            let ord: i64 = r
                .try_get(READ_RUNS_ORD)
                .map_err(|e| journal_undecodable("a run's place", e))?;
            let k = usize::try_from(ord - 1)
                .ok()
                .filter(|k| *k < runs.len())
                .ok_or_else(|| journal_undecodable("a run's place", ord))?;
            out[k].push(decode_event(r, &runs[k].0)?);
        }
        Ok(out)
    }

    async fn read_global(&self, after: u64, limit: usize) -> Result<Vec<Event>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let rows = sqlx::query(outbox_sql::journal::READ_GLOBAL)
            .bind(i64::try_from(after).unwrap_or(i64::MAX))
            .bind(limit as i64)
            .fetch_all(&self.db.pool)
            .await
            .map_err(|e| storage(self.db.context("reading the journal by global position"), e))?;
        rows.iter().map(decode_any_event).collect()
    }

    async fn stream_version(&self, stream: &StreamId) -> Result<u64> {
        // The version's column is named `head` (the first schema's name).
        let version: Option<i64> = sqlx::query_scalar("SELECT head FROM streams WHERE stream = $1")
            .bind(stream.as_str())
            .fetch_optional(&self.db.pool)
            .await
            .map_err(|e| storage(self.db.context("reading a stream version"), e))?;
        Ok(u64::try_from(version.unwrap_or(0)).unwrap_or(0))
    }

    async fn stream_versions(&self, after: Option<&StreamId>, limit: usize) -> Result<Vec<StreamVersion>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT stream, head FROM streams WHERE stream > $1 AND head > 0 ORDER BY stream LIMIT $2",
        )
        .bind(after.map_or("", StreamId::as_str))
        .bind(limit as i64)
        .fetch_all(&self.db.pool)
        .await
        .map_err(|e| storage(self.db.context("listing streams"), e))?;
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

/// Takes or extends `stream`'s lease (the shared `ACQUIRE` statement).
async fn acquire_in(
    tx: &mut PgConnection,
    acquire: &str,
    stream: &StreamId,
    owner: &WorkerId,
    ttl: Duration,
) -> Result<Option<Lease>> {
    let row = crate::sql::fetch(
        tx,
        "acquiring a stream lease",
        acquire,
        &[
            Arg::Text(stream.as_str()),
            Arg::Text(owner.as_str()),
            Arg::Int(duration_millis(ttl)),
        ],
    )
    .await?
    .into_iter()
    .next();
    row.map(|row| outbox_sql::journal::decode_lease(&row, stream))
        .transpose()
}

/// Frees `lease` if it is still current (the shared `RELEASE` statement);
/// a partitioned claim's lease leaves its partition held and, while it is
/// current, puts the stream's head back in the due index by its rows.
async fn release_in(tx: &mut PgConnection, release: &str, lease: &Lease) -> Result<()> {
    if lease.partition.is_some() {
        let err = |e| storage("ending a partitioned pass", e);
        lock_stream(tx, lease.stream.as_str()).await.map_err(err)?;
        if lease_valid(tx, lease).await.map_err(err)? {
            refresh_head(tx, lease.stream.as_str()).await.map_err(err)?;
        }
        return Ok(());
    }
    crate::sql::execute(
        tx,
        "releasing a stream lease",
        release,
        &[
            Arg::Text(lease.stream.as_str()),
            Arg::Text(lease.owner.as_str()),
            Arg::Int(i64::try_from(lease.epoch).unwrap_or(i64::MAX)),
        ],
    )
    .await?;
    Ok(())
}

/// The end of a stream pass: the completion, the abandon (when asked) and
/// the release; a lease no longer current abandons and releases nothing.
async fn end_in(
    tx: &mut PgConnection,
    release: &str,
    lease: &Lease,
    through: Option<Seq>,
    abandon: bool,
) -> Result<u64> {
    let done = match through {
        Some(t) => complete_in(tx, &lease.stream, t).await?,
        None => 0,
    };
    let abandoned = if abandon {
        unless_lease_lost(abandon_in(tx, lease).await)?
    } else {
        0
    };
    // Both recompute the head from the rows, which ends a partitioned
    // claim's hold on it; the release need not do it again.
    if lease.partition.is_none() || done + abandoned == 0 {
        release_in(tx, release, lease).await?;
    }
    Ok(done)
}

/// The plain ends `ends` (each with a completion, no abandon, streams
/// distinct and locked): their rows deleted and heads recomputed in one
/// statement ([`COMPLETE_ALL`]); then, one by one in the order given, the
/// releases `end_in` would make: every stream lease, and a partitioned
/// claim's lease that completed nothing (its hold ended by recomputing the
/// head while the partition lease is current). The stream leases are
/// released in the sweep's order, as its claim acquired them: one
/// statement releasing them all updates their rows in no set order and
/// deadlocks with other workers' sweeps acquiring them. Returns the rows
/// deleted.
async fn complete_all(tx: &mut PgConnection, release: &str, ends: &[&StreamEnd]) -> Result<u64> {
    if ends.is_empty() {
        return Ok(0);
    }
    let err = |e| storage("completing and releasing", e);
    let (streams, through): (Vec<&str>, Vec<i64>) = ends
        .iter()
        .map(|e| (e.lease.stream.as_str(), e.through.map_or(0, Seq::as_i64)))
        .unzip();
    let counts: Vec<(String, i64)> = sqlx::query_as(COMPLETE_ALL)
        .bind(&streams)
        .bind(&through)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
    let counts: HashMap<&str, i64> = counts.iter().map(|(s, n)| (s.as_str(), *n)).collect();
    let mut done = 0;
    for e in ends {
        let n = counts.get(e.lease.stream.as_str()).copied().unwrap_or(0);
        done += u64::try_from(n).unwrap_or(0);
        // See `end_in`: a recomputed head ends a partitioned hold.
        if e.lease.partition.is_none() || n == 0 {
            release_in(tx, release, &e.lease).await?;
        }
    }
    Ok(done)
}

impl OutboxQueue for PgJournal {
    async fn due_streams(&self, limit: usize) -> Result<Vec<StreamId>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let rows: Vec<String> = sqlx::query_scalar(DUE_STREAMS)
            .bind(limit as i64)
            .fetch_all(&self.db.pool)
            .await
            .map_err(|e| storage(self.db.context("listing due streams"), e))?;
        rows.into_iter()
            .map(|s| StreamId::new(s).map_err(|e| journal_undecodable("outbox head", e)))
            .collect()
    }

    async fn claim(&self, lease: &Lease, max: usize) -> Result<Vec<OutboxRow>> {
        let max = validate_limit(max, MAX_PAGE)?;
        self.write_relaxed("claiming outbox rows", async |tx| claim_in(tx, lease, max).await)
            .await
    }

    /// One transaction: a stream's lease and its run; or the due streams
    /// (oldest due first, as `due_streams`), their leases and runs.
    /// Concurrent sweeps read the due streams in the same order, so they
    /// lock leases in one order; a deadlock all the same is a temporary
    /// error the worker retries. The runs' events are left to the worker.
    async fn take(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        what: outbox_core::Take<'_>,
    ) -> Result<Vec<outbox_core::ClaimedRun>> {
        use outbox_core::{ClaimedRun, Take};
        validate_ttl(ttl)?;
        let acquire = self.sql.dialect().sql(outbox_sql::journal::ACQUIRE);
        match what {
            Take::Stream { stream, max } => {
                let max = validate_limit(max, MAX_PAGE)?;
                self.write_relaxed("acquiring a lease and claiming", async |tx| {
                    let Some(lease) = acquire_in(tx, &acquire, stream, owner, ttl).await? else {
                        return Ok(Vec::new());
                    };
                    let rows = claim_in(tx, &lease, max).await?;
                    Ok(vec![ClaimedRun {
                        lease,
                        rows,
                        events: None,
                    }])
                })
                .await
            }
            Take::Due(limits) => {
                let limits = limits.validated()?;
                let release = self.sql.dialect().sql(outbox_sql::journal::RELEASE);
                self.write_relaxed("sweeping due streams", async |tx| {
                    let due: Vec<String> = sqlx::query_scalar(DUE_STREAMS)
                        .bind(limits.streams as i64)
                        .fetch_all(&mut *tx)
                        .await
                        .map_err(|e| storage("listing due streams", e))?;
                    let mut taken = Vec::new();
                    let mut rows = 0;
                    for stream in due {
                        if rows >= limits.rows {
                            break;
                        }
                        let stream =
                            StreamId::new(stream).map_err(|e| journal_undecodable("outbox head", e))?;
                        let Some(lease) = acquire_in(tx, &acquire, &stream, owner, ttl).await? else {
                            continue;
                        };
                        let run = claim_in(tx, &lease, limits.per_stream.min(limits.rows - rows)).await?;
                        if run.is_empty() {
                            release_in(tx, &release, &lease).await?;
                            continue;
                        }
                        rows += run.len();
                        taken.push((lease, run));
                    }
                    Ok(ClaimedRun::unloaded(taken))
                })
                .await
            }
        }
    }

    /// One transaction: every pass's completion, abandon and release. The
    /// plain ends (a completion, no abandon) take one statement together
    /// (`COMPLETE_ALL`), whatever their number; the others end one by one.
    async fn finish(&self, ends: &[StreamEnd]) -> Result<u64> {
        let release = self.sql.dialect().sql(outbox_sql::journal::RELEASE);
        let mut streams: Vec<&str> = ends.iter().map(|e| e.lease.stream.as_str()).collect();
        streams.sort_unstable();
        streams.dedup();
        // One statement takes each stream once: a stream ended twice in
        // one call (never by a sweep) ends one by one.
        let (plain, single): (Vec<&StreamEnd>, Vec<&StreamEnd>) = if streams.len() == ends.len() {
            ends.iter().partition(|e| e.through.is_some() && !e.abandon)
        } else {
            (Vec::new(), ends.iter().collect())
        };
        self.write_relaxed("completing and releasing", async |tx| {
            // The streams' version rows first, all in stream order as an
            // append locks them: ending them one by one in the sweep's
            // order could deadlock with an append (each `end_in` takes its
            // stream's lock again, already held). The statements after it
            // see every append committed before the lock was granted.
            sqlx::query(LOCK_STREAMS)
                .bind(&streams)
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| storage("completing and releasing", e))?;
            let mut done = complete_all(tx, &release, &plain).await?;
            for end in single {
                done += end_in(tx, &release, &end.lease, end.through, end.abandon).await?;
            }
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
        self.write_relaxed("completing and claiming", async |tx| {
            let done = complete_in(tx, &lease.stream, through).await?;
            Ok((done, unless_lease_lost(claim_in(tx, lease, max).await)?))
        })
        .await
    }

    async fn complete(&self, stream: &StreamId, through: Seq) -> Result<u64> {
        self.write_relaxed("completing outbox rows", async |tx| {
            complete_in(tx, stream, through).await
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
        let err = |e| storage("recording an outbox failure", e);
        self.write("recording an outbox failure", async |tx| {
            lock_stream(tx, lease.stream.as_str()).await.map_err(err)?;
            if !lease_valid(tx, lease).await.map_err(err)? {
                return Err(lease.lost());
            }
            let attempt = processing_row(tx, lease, seq).await?.saturating_add(1);
            let (status, delay) = match policy.decide(attempt) {
                FailureDecision::DeadLetter => (OutboxStatus::Dead, 0),
                FailureDecision::Retry(d) => (OutboxStatus::Failed, duration_millis(d)),
            };
            let next: i64 = sqlx::query_scalar(concat!(
                "UPDATE outbox SET status = $3, attempt_count = $4, last_error = $5, next_attempt_at = ",
                jnow!(),
                " + $6, updated_at = ",
                jnow!(),
                ", first_failed_at = COALESCE(first_failed_at, ",
                jnow!(),
                ") WHERE stream = $1 AND seq = $2 RETURNING next_attempt_at"
            ))
            .bind(lease.stream.as_str())
            .bind(seq.as_i64())
            .bind(status.as_str())
            .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
            .bind(storable(truncate_error(error)))
            .bind(delay)
            .fetch_one(&mut *tx)
            .await
            .map_err(err)?;
            refresh_head(tx, lease.stream.as_str()).await.map_err(err)?;
            Ok(match status {
                OutboxStatus::Dead => FailureOutcome::Dead { attempt },
                _ => FailureOutcome::Retry {
                    attempt,
                    next_attempt_at: Timestamp::from_millis(next),
                },
            })
        })
        .await
    }

    async fn enqueue_catch_up(&self, stream: &StreamId) -> Result<bool> {
        let partition = i32::from(self.partitioning.of(stream).get());
        self.write("enqueueing a catch-up row", async |tx| {
            let err = |e| storage("enqueueing a catch-up row", e);
            lock_stream(tx, stream.as_str()).await.map_err(err)?;
            let inserted = sqlx::query(concat!(
                "INSERT INTO outbox (stream, seq, event_type, status, attempt_count, next_attempt_at, \
                 last_error, updated_at, partition_no) \
                 SELECT e.stream, e.seq, e.event_type, 'pending', 0, ",
                jnow!(),
                ", NULL, ",
                jnow!(),
                ", $2 FROM streams s JOIN events e ON e.stream = s.stream AND e.seq = s.head \
                 WHERE s.stream = $1 AND NOT EXISTS (SELECT 1 FROM outbox WHERE stream = $1 AND seq = s.head)"
            ))
            .bind(stream.as_str())
            .bind(partition)
            .execute(&mut *tx)
            .await
            .map_err(err)?
            .rows_affected();
            if inserted == 0 {
                return Ok(false);
            }
            refresh_head(tx, stream.as_str()).await.map_err(err)?;
            Ok(true)
        })
        .await
    }

    /// Lease bookkeeping: committed without waiting for the WAL flush
    /// (ADR 0027), like the claim it follows.
    async fn begin_attempt(&self, lease: &Lease, seq: Seq) -> Result<()> {
        self.write_relaxed("beginning an attempt", async |tx| {
            begin_attempt_in(tx, lease, seq).await
        })
        .await
    }
}

/// The claim, inside a transaction: the lease must be current.
async fn claim_in(tx: &mut PgConnection, lease: &Lease, max: usize) -> Result<Vec<OutboxRow>> {
    let err = |e| storage("claiming outbox rows", e);
    if !lease_valid(tx, lease).await.map_err(err)? {
        return Err(lease.lost());
    }
    let rows = claim_run_in(tx, lease, max).await?;
    if lease.partition.is_some() && !rows.is_empty() {
        sqlx::query(outbox_sql::partitions::HOLD_HEAD)
            .bind(lease.stream.as_str())
            .bind(lease.expires_at.as_millis())
            .execute(&mut *tx)
            .await
            .map_err(err)?;
    }
    Ok(rows)
}

/// The claim under a lease this transaction holds locked (just acquired or
/// renewed), so it is current.
async fn claim_run_in(tx: &mut PgConnection, lease: &Lease, max: usize) -> Result<Vec<OutboxRow>> {
    let err = |e| storage("claiming outbox rows", e);
    let rows = sqlx::query(CLAIM)
        .bind(lease.stream.as_str())
        .bind(max as i64)
        .bind(outbox_core::UNFINISHED_ATTEMPT)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
    let mut rows = rows.iter().map(decode_row).collect::<Result<Vec<_>>>()?;
    rows.sort_by_key(|r| r.seq);
    Ok(rows)
}

/// The completion, inside a transaction (the stream locked first).
async fn complete_in(tx: &mut PgConnection, stream: &StreamId, through: Seq) -> Result<u64> {
    let err = |e| storage("completing outbox rows", e);
    lock_stream(tx, stream.as_str()).await.map_err(err)?;
    let done: i64 = sqlx::query_scalar(COMPLETE)
        .bind(stream.as_str())
        .bind(through.as_i64())
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
    Ok(u64::try_from(done).unwrap_or(0))
}

/// Marks the start of an attempt of an `alone` row's own (ADR 0029).
async fn begin_attempt_in(tx: &mut PgConnection, lease: &Lease, seq: Seq) -> Result<()> {
    let err = |e| storage("beginning an attempt", e);
    lock_stream(tx, lease.stream.as_str()).await.map_err(err)?;
    if !lease_valid(tx, lease).await.map_err(err)? {
        return Err(lease.lost());
    }
    let marked = sqlx::query(
        "UPDATE outbox SET alone = 2 WHERE stream = $1 AND seq = $2 AND status = 'processing' AND alone > 0",
    )
    .bind(lease.stream.as_str())
    .bind(seq.as_i64())
    .execute(&mut *tx)
    .await
    .map_err(err)?
    .rows_affected();
    if marked == 0 {
        processing_row(tx, lease, seq).await?;
        return Err(Error::InvalidState(format!(
            "outbox row {}/{seq} is not applied alone",
            lease.stream
        )));
    }
    Ok(())
}

/// A stream's processing rows back to pending. The walk of the stream's
/// rows stops at its first pending row: its processing rows all come
/// before it (a claim marks a run from the stream's first row on, and rows
/// are only ever added behind a stream's last), so it reads the claimed
/// run by the key, and no index of processing rows is kept up to date for
/// it (journal migration 0011, ADR 0041).
pub(crate) const ABANDON: &str = concat!(
    "UPDATE outbox SET status = 'pending', updated_at = ",
    jnow!(),
    " WHERE stream = $1 AND status = 'processing' AND seq < coalesce(\
     (SELECT seq FROM outbox WHERE stream = $1 AND status = 'pending' ORDER BY seq LIMIT 1), \
     9223372036854775807)"
);

/// The abandon, inside a transaction: the lease must be current.
async fn abandon_in(tx: &mut PgConnection, lease: &Lease) -> Result<u64> {
    let err = |e| storage("abandoning outbox rows", e);
    lock_stream(tx, lease.stream.as_str()).await.map_err(err)?;
    if !lease_valid(tx, lease).await.map_err(err)? {
        return Err(lease.lost());
    }
    let n = sqlx::query(ABANDON)
        .bind(lease.stream.as_str())
        .execute(&mut *tx)
        .await
        .map_err(err)?
        .rows_affected();
    if n > 0 {
        refresh_head(tx, lease.stream.as_str()).await.map_err(err)?;
    }
    Ok(n)
}

/// [`PgJournal::rekey_feed`], first: each cursor, a key of the old server,
/// becomes the position below the first event it had not read, or the last
/// position when it had read all. The old server's events are those up to
/// the last one whose key this server cannot have made (at or above its
/// next transaction id); every event after it was appended here, where the
/// feed refused to read, so none of those was read. Any doubt re-reads
/// (the sinks' checkpoints keep that from publishing twice), never skips.
const REKEY_CURSORS_TO_POSITIONS: &str = "WITH old AS (\
       SELECT max(global_position) AS p FROM events \
       WHERE txid >= pg_snapshot_xmax(pg_current_snapshot())) \
     UPDATE outbox_sink_cursors c SET position = COALESCE(\
       least(\
         (SELECT min(e.global_position) FROM events e \
          WHERE e.txid > (c.position)::text::xid8 AND e.global_position <= old.p), \
         (SELECT min(e.global_position) FROM events e WHERE e.global_position > COALESCE(old.p, 0))\
       ) - 1, \
       (SELECT max(global_position) FROM events), 0) \
     FROM old";

/// [`PgJournal::rekey_feed`], then: every event a key below this
/// transaction's id, in position order (as migration 0007).
const REKEY_EVENTS: &str = "WITH bounds AS (\
       SELECT min(global_position) AS lo, max(global_position) AS hi, \
              pg_current_xact_id()::text::bigint AS x FROM events) \
     UPDATE events e \
     SET txid = (1 + ((e.global_position - b.lo) * greatest(b.x - 2, 1)) / (b.hi - b.lo + 1))::text::xid8 \
     FROM bounds b";

/// [`PgJournal::rekey_feed`], last: each cursor (a position now) becomes
/// the key of its position less one, never above the oldest transaction
/// open (as migration 0007).
const REKEY_CURSORS_TO_KEYS: &str = "WITH bounds AS (\
       SELECT min(global_position) AS lo, max(global_position) AS hi, \
              pg_current_xact_id()::text::bigint AS x, \
              pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS horizon FROM events) \
     UPDATE outbox_sink_cursors c \
     SET position = CASE \
       WHEN b.lo IS NULL OR c.position < b.lo THEN 0 \
       ELSE least(\
         (1 + ((least(c.position, b.hi) - b.lo) * greatest(b.x - 2, 1)) / (b.hi - b.lo + 1)) \
           - CASE WHEN c.position >= b.hi THEN 0 ELSE 1 END, \
         b.horizon - 1) \
     END \
     FROM bounds b";

/// Locks streams' version rows in stream order and reads their versions.
pub(crate) const LOCK_STREAMS: &str =
    "SELECT stream, head FROM streams WHERE stream = ANY($1) ORDER BY stream FOR NO KEY UPDATE";

/// The `SET` list of a claim's `UPDATE outbox o`: marks the row processing;
/// a row found processing already (its claimer stopped before finishing
/// it) is applied alone from now on (`alone` 1), and if an attempt of its
/// own had begun (`alone` 2) it records the message bound at `$err` for the
/// claimer to count (ADR 0029). No attempt is counted here.
macro_rules! mark_processing {
    ($err:literal) => {
        concat!(
            "status = 'processing', updated_at = ",
            jnow!(),
            ", alone = CASE WHEN o.alone > 0 OR o.status = 'processing' THEN 1 ELSE 0 END, \
             last_error = CASE WHEN o.status = 'processing' AND o.alone = 2 THEN ",
            $err,
            " ELSE o.last_error END, \
             first_failed_at = CASE WHEN o.status = 'processing' AND o.alone = 2 THEN COALESCE(o.first_failed_at, ",
            jnow!(),
            ") ELSE o.first_failed_at END"
        )
    };
}

/// Checks (and share-locks) a lease: stream, owner, epoch.
pub(crate) const LEASE_CHECK: &str = concat!(
    "SELECT 1 FROM stream_leases WHERE stream = $1 AND owner = $2 AND epoch = $3 AND expires_at > ",
    jnow!(),
    " FOR SHARE"
);

/// Due heads with a free or expired lease in a partition no one holds,
/// oldest due first: an ordered scan of the partial index on `outbox_heads
/// (due_at, stream)`, primary-key probes of `stream_leases` and
/// `outbox_partition_leases` per head.
pub(crate) const DUE_STREAMS: &str = concat!(
    "SELECT h.stream FROM outbox_heads h LEFT JOIN stream_leases l ON l.stream = h.stream \
     LEFT JOIN outbox_partition_leases p ON p.partition_no = h.partition_no \
     WHERE h.due_at IS NOT NULL AND h.due_at <= ",
    jnow!(),
    " AND (l.owner IS NULL OR l.expires_at <= ",
    jnow!(),
    ") AND (p.owner IS NULL OR p.expires_at <= ",
    jnow!(),
    ") ORDER BY h.due_at, h.stream LIMIT $1"
);

/// [`outbox_sql::partitions::PARTITION_LEASE_CHECK`] on this clock, share-locking the row.
pub(crate) const PARTITION_LEASE_CHECK: &str = concat!(
    "SELECT 1 FROM outbox_partition_leases WHERE partition_no = $1 AND owner = $2 AND epoch = $3 \
     AND expires_at > ",
    jnow!(),
    " FOR SHARE"
);

/// A stream's head run over `$rows` (its first rows in seq order, with
/// `seq`, `status`, `next_attempt_at` and `alone`): each row's `seq` and
/// whether it `keep`s, that is whether it and every row before it are
/// contiguous, not dead and due, and, past the first, neither in flight
/// nor applied alone, behind a head that is neither (ADR 0029). The one
/// rule of what a claim takes, for [`CLAIM`] and the partitioned claim.
macro_rules! head_run {
    ($rows:expr) => {
        concat!(
            "SELECT seq, bool_and(ok) OVER (ORDER BY seq) AS keep FROM (\
               SELECT seq, status <> 'dead' AND next_attempt_at <= ",
            jnow!(),
            " AND seq = first_value(seq) OVER (ORDER BY seq) + row_number() OVER (ORDER BY seq) - 1 \
               AND (row_number() OVER (ORDER BY seq) = 1 OR (status <> 'processing' AND alone = 0 \
                    AND first_value(status) OVER (ORDER BY seq) <> 'processing' \
                    AND first_value(alone) OVER (ORDER BY seq) = 0)) AS ok \
               FROM (",
            $rows,
            ") h) x"
        )
    };
}

/// The partitioned claim's statement with `$select` as its last part
/// (it reads `claimed` and `hold`); see [`CLAIM_PARTITIONED`].
macro_rules! claim_partitioned {
    ($select:expr) => {
        concat!(
        "WITH held AS (SELECT partition_no, epoch FROM outbox_partition_leases WHERE owner = $1 AND expires_at > ",
        jnow!(),
        " AND set_config('synchronous_commit', 'off', true) IS NOT NULL FOR SHARE), \
         early AS (SELECT h.stream, h.due_at, h.head_seq, h.partition_no FROM outbox_heads h \
              WHERE h.due_at IS NOT NULL AND h.due_at <= ",
        jnow!(),
        " ORDER BY h.due_at, h.stream LIMIT 4 * $3), \
         fast AS (SELECT held.partition_no, held.epoch, e.stream, e.due_at, e.head_seq FROM early e \
              JOIN held ON held.partition_no = e.partition_no LEFT JOIN stream_leases l ON l.stream = e.stream \
              WHERE l.owner IS NULL OR l.owner = $1 OR l.expires_at <= ",
        jnow!(),
        "), \
         slow AS (SELECT held.partition_no, held.epoch, d.stream, d.due_at, d.head_seq FROM held \
              JOIN LATERAL (SELECT h.stream, h.due_at, h.head_seq FROM outbox_heads h \
                   LEFT JOIN stream_leases l ON l.stream = h.stream \
                   WHERE h.partition_no = held.partition_no AND h.due_at IS NOT NULL AND h.due_at <= ",
        jnow!(),
        " AND (l.owner IS NULL OR l.owner = $1 OR l.expires_at <= ",
        jnow!(),
        ") ORDER BY h.due_at, h.stream LIMIT $3) d ON true \
              WHERE (SELECT count(*) FROM fast) < $3 AND (SELECT count(*) FROM early) = 4 * $3), \
         due AS (SELECT * FROM (SELECT * FROM fast \
                                WHERE (SELECT count(*) FROM fast) >= $3 OR (SELECT count(*) FROM early) < 4 * $3 \
                                UNION ALL SELECT * FROM slow) u \
              ORDER BY due_at, stream LIMIT $3), \
         sized AS (SELECT due.*, least($4, s.head - due.head_seq + 1) AS most \
              FROM due LEFT JOIN streams s ON s.stream = due.stream), \
         picked AS (SELECT * FROM (SELECT sized.*, \
                    (sum(most) OVER (ORDER BY due_at, stream ROWS UNBOUNDED PRECEDING) - most)::bigint AS before \
                    FROM sized) z \
              WHERE before < $5), \
         runs AS (SELECT picked.partition_no, picked.epoch, picked.stream, picked.due_at, r.lo, r.hi \
              FROM picked JOIN LATERAL (SELECT min(seq) AS lo, max(seq) AS hi FROM (\
",
        head_run!(
            "SELECT seq, status, next_attempt_at, alone FROM outbox WHERE stream = picked.stream \
             ORDER BY seq LIMIT least(picked.most, $5 - picked.before)"
        ),
        ") y WHERE keep) r ON r.lo IS NOT NULL), \
         budget AS (SELECT * FROM (SELECT runs.*, \
                    (sum(hi - lo + 1) OVER (ORDER BY due_at, stream ROWS UNBOUNDED PRECEDING) - (hi - lo + 1))::bigint \
                      AS base FROM runs) z \
              WHERE base < $5), \
         claimed AS (UPDATE outbox o SET ",
        mark_processing!("$6"),
        " FROM budget b WHERE o.stream = b.stream AND o.seq BETWEEN b.lo AND least(b.hi, b.lo + $5 - b.base - 1) \
            RETURNING o.stream, o.seq, o.event_type, o.status, o.attempt_count, o.next_attempt_at, \
                      o.last_error, o.updated_at, o.first_failed_at, o.alone, b.partition_no::bigint, b.epoch, \
                      b.base + o.seq - b.lo + 1 AS place), \
         hold AS (SELECT ",
        jnow!(),
        " + $2 AS until), \
         held_heads AS (UPDATE outbox_heads h \
              SET due_at = CASE WHEN h.due_at IS NULL THEN NULL ELSE (SELECT until FROM hold) END \
              FROM (SELECT DISTINCT stream FROM claimed) c WHERE h.stream = c.stream) ",
            $select
        )
    };
}

/// The whole partitioned claim in one statement (no transaction around
/// it, one round trip): share-locks owner `$1`'s unexpired partition leases
/// (a takeover waits for this statement's commit); takes, oldest due first,
/// up to `$3` streams with a due head in them whose stream lease is free,
/// expired or `$1`'s; claims each one's head run as [`CLAIM`] does (its first `$4`
/// rows, kept while contiguous, not dead and due), at most `$5` rows in
/// all, in due order; and holds the claimed streams' heads out of the due
/// index until now + `$2` ms. Rows are read only for the streams the budget
/// can reach, judged by each stream's rows at most (its version less its
/// head, capped at `$4`), so a sweep reads about `$5` rows, not `$3` × `$4`;
/// where a run is shorter than that bound (a row in flight, not due or
/// dead) the claim may take fewer than `$5` rows, never more. Such streams have no stream lease: the hold
/// keeps the holder's next claim off a run in flight, a takeover after the
/// holder died finds it due, and the pass's end puts the head back.
///
/// The commit is the workers' bookkeeping and does not wait for its WAL
/// flush (ADR 0027): `set_config` turns `synchronous_commit` off for this
/// statement's own transaction. It sits in the lease rows' filter, so it
/// has run whenever a lease row was locked, and nothing is written without
/// one.
///
/// The due streams come from the first 4 × `$3` heads of the global due
/// index when `$3` of them lie in held partitions (they are then the oldest
/// due there: any older one would be among them) or when there were fewer
/// than 4 × `$3` due heads in all (then those are every due head), which
/// is the usual case for a worker holding a quarter of the partitions or
/// more; otherwise from a lateral range of `outbox_heads_by_partition` per
/// held partition, merged. Either way the heads read are bounded by `$3` (4 × `$3`, plus
/// `$3` per held partition on the fallback), whatever the backlog in
/// partitions others hold.
///
/// Each stream's run is cut inside a lateral subquery over its own rows
/// (the windows of [`CLAIM`], in the primary key's order, so no sort) to
/// a seq range `lo..=hi`, contiguous by the hole check; `base` counts the
/// rows of the runs before it in due order, and the `UPDATE` marks one
/// primary-key range per stream. A row's place is `base + seq - lo + 1`,
/// its rank in (due, stream, seq) order. No run passes `$5` (a stream reads
/// at most `$5` less its predecessors' bounds, and runs are within their
/// bounds); the range's end is still cut at `$5` so that the budget holds
/// by this statement alone. This replaced windows and sorts over every row
/// read and a primary-key probe per claimed row (issue 43: about a quarter
/// less per claim of 512 rows, the claim being most of a Postgres sweep
/// drain); what is claimed is unchanged.
///
/// Returns the claimed rows (the columns of `decode_row`), each with its
/// partition, the partition lease's epoch, the hold's end and its place in
/// the claim (`$6` is the message a row whose own attempt began and never
/// ended records). A head applied alone (`alone`, or `processing`) is
/// claimed by itself, a run of one row (ADR 0029).
///
/// The hold finds each head by its primary key alone: with `due_at IS NOT
/// NULL` in the join, a plan made while the table was empty seeks
/// `outbox_heads_by_partition` by stream, a scan of the whole index per
/// head (3.5 of 14 ms per claim at 2,000 appends/s); a dead head keeps its
/// NULL through the `CASE`.
pub(crate) const CLAIM_PARTITIONED: &str =
    claim_partitioned!("SELECT claimed.*, hold.until FROM claimed, hold");

/// [`CLAIM_PARTITIONED`] returning each claimed row's event beside it
/// (the columns of `event_columns!` after the claim's, NULL where the
/// journal has no such event), so a sweep reads its runs' events in the
/// claim's round trip instead of one of its own (`read_runs`): about a
/// round trip and a statement less per sweep. The event is found by the
/// events' `(stream, seq)` key; the claim committed the row in the same
/// transaction as its event, so a claimed row's event is visible to it.
pub(crate) const CLAIM_AND_LOAD_PARTITIONED: &str = claim_partitioned!(concat!(
    "SELECT claimed.*, hold.until, e.* FROM claimed CROSS JOIN hold LEFT JOIN LATERAL (SELECT ",
    outbox_sql::event_columns!(),
    " FROM events WHERE events.stream = claimed.stream AND events.seq = claimed.seq) e ON true"
));

/// The columns of [`CLAIM_PARTITIONED`]'s rows (the outbox row's, then
/// partition, epoch, place and the hold's end) before
/// [`CLAIM_AND_LOAD_PARTITIONED`]'s event columns.
const CLAIM_COLUMNS: usize = 14;

/// The head run: the stream's first `$2` rows in seq order (a primary-key
/// range seek), kept while contiguous, not dead and due; marked processing
/// in the same statement. A head applied alone (`alone`, or `processing`)
/// is claimed by itself; a row applied alone behind the head ends the run
/// (`$3` is the message a row whose own attempt began and never ended
/// records, ADR 0029).
pub(crate) const CLAIM: &str = concat!(
    "WITH run AS (",
    head_run!(
        "SELECT seq, status, next_attempt_at, alone FROM outbox WHERE stream = $1 ORDER BY seq LIMIT $2"
    ),
    ") \
     UPDATE outbox o SET ",
    mark_processing!("$3"),
    " FROM run WHERE o.stream = $1 AND o.seq = run.seq AND run.keep \
     RETURNING o.stream, o.seq, o.event_type, o.status, o.attempt_count, o.next_attempt_at, \
               o.last_error, o.updated_at, o.first_failed_at, o.alone"
);

/// Deletes the stream's rows through `$2` and recomputes its head from the
/// first remaining row, in one statement (the caller holds the stream lock).
pub(crate) const COMPLETE: &str = "WITH del AS (DELETE FROM outbox WHERE stream = $1 AND seq <= $2 RETURNING 1), \
     first AS (SELECT stream, seq, CASE WHEN status = 'dead' THEN NULL ELSE next_attempt_at END AS due, \
               partition_no FROM outbox WHERE stream = $1 AND seq > $2 ORDER BY seq LIMIT 1), \
     up AS (INSERT INTO outbox_heads (stream, head_seq, due_at, partition_no) \
            SELECT stream, seq, due, partition_no FROM first WHERE EXISTS (SELECT 1 FROM del) \
            ON CONFLICT (stream) DO UPDATE SET head_seq = excluded.head_seq, due_at = excluded.due_at, \
            partition_no = excluded.partition_no), \
     gone AS (DELETE FROM outbox_heads WHERE stream = $1 AND EXISTS (SELECT 1 FROM del) \
              AND NOT EXISTS (SELECT 1 FROM first)) \
     SELECT count(*) FROM del";

/// [`COMPLETE`] for many streams at once (`$1` with `$2`, the last seq
/// completed of each; streams distinct and locked). Returns each stream of
/// `$1` that had rows deleted, with how many.
///
/// Each stream's range starts at its first row (`f`, one primary-key seek):
/// a range with both ends unknown is estimated at a few rows, so even a
/// generic plan seeks each stream's range in the primary key (with `seq <=
/// t` alone the planner expects a third of each stream's rows and deletes
/// through a hash join over the whole outbox, once per end), and the
/// delete's bitmap scan visits no row deleted before. With 0 as the start
/// it visited every earlier row of the stream that vacuum had not yet
/// removed: 19 heap pages per row deleted in a 10,000-event drain, the
/// most expensive statement of a sweep. The seek skips those rows by
/// their index entries' dead marks once a plain scan has set them.
pub(crate) const COMPLETE_ALL: &str = "WITH u AS (SELECT u.s, u.t, COALESCE((SELECT o.seq FROM outbox o WHERE o.stream = u.s \
                                         ORDER BY o.seq LIMIT 1), 0) AS f \
                FROM unnest($1::text[], $2::bigint[]) AS u(s, t)), \
     del AS (DELETE FROM outbox o USING u WHERE o.stream = u.s AND o.seq BETWEEN u.f AND u.t \
             RETURNING o.stream), \
     n AS (SELECT stream, count(*) AS c FROM del GROUP BY stream), \
     first AS (SELECT f.* FROM u JOIN n ON n.stream = u.s CROSS JOIN LATERAL \
               (SELECT stream, seq, CASE WHEN status = 'dead' THEN NULL ELSE next_attempt_at END AS due, \
                partition_no FROM outbox WHERE stream = u.s AND seq > u.t ORDER BY seq LIMIT 1) f), \
     up AS (INSERT INTO outbox_heads (stream, head_seq, due_at, partition_no) \
            SELECT stream, seq, due, partition_no FROM first \
            ON CONFLICT (stream) DO UPDATE SET head_seq = excluded.head_seq, due_at = excluded.due_at, \
            partition_no = excluded.partition_no), \
     gone AS (DELETE FROM outbox_heads h USING n WHERE h.stream = ANY($1::text[]) AND h.stream = n.stream \
              AND NOT EXISTS (SELECT 1 FROM first WHERE first.stream = n.stream)) \
     SELECT stream, c FROM n";

/// A joining worker takes its share from live holders at once (ADR 0022).
impl outbox_core::PartitionHandover for PgJournal {
    async fn sync_partitions_taking(
        &self,
        owner: &WorkerId,
        wanted: &[Partition],
        from: &[WorkerId],
        ttl: Duration,
    ) -> Result<PartitionSync> {
        outbox_sql::partitions::sync_partitions_taking(
            self.sql.database(),
            &self.partitioning,
            owner,
            wanted,
            from,
            ttl,
        )
        .await
    }
}

impl PgJournal {
    /// Runs `CLAIM_PARTITIONED`, or with `with_events`
    /// `CLAIM_AND_LOAD_PARTITIONED` (whose rows carry their events after
    /// the claim's columns), and groups
    /// its rows into runs: in due order, each stream's rows in seq order
    /// (the claim's places). With events, a run's are those its rows have
    /// in the journal, in seq order (a row without one has none: the
    /// worker then finds the run short and drains it on its own).
    async fn claim_in_partitions(
        &self,
        with_events: bool,
        owner: &WorkerId,
        ttl: Duration,
        limits: SweepLimits,
    ) -> Result<Vec<outbox_core::ClaimedRun>> {
        validate_ttl(ttl)?;
        let limits = limits.validated()?;
        let sql = if with_events {
            CLAIM_AND_LOAD_PARTITIONED
        } else {
            CLAIM_PARTITIONED
        };
        let err = |e| storage(self.db.context("claiming in partitions"), e);
        let rows = sqlx::query(sql)
            .bind(owner.as_str())
            .bind(duration_millis(ttl))
            .bind(limits.streams as i64)
            .bind(limits.per_stream as i64)
            .bind(limits.rows as i64)
            .bind(outbox_core::UNFINISHED_ATTEMPT)
            .fetch_all(&self.db.pool)
            .await
            .map_err(err)?;
        let mut claimed = Vec::with_capacity(rows.len());
        for r in &rows {
            let place: i64 = r.try_get(12).map_err(|e| journal_undecodable("claim", e))?;
            let (row, event) = if with_events {
                let mut columns = crate::sql::to_row(r)
                    .map_err(|e| journal_undecodable("claim", e))?
                    .0;
                let event = columns.split_off(CLAIM_COLUMNS);
                let row = outbox_sql::journal::decode_row(&outbox_sql::Row(columns))?;
                let event = if event.first().is_none_or(|v| matches!(v, outbox_sql::Value::Null)) {
                    None
                } else {
                    Some(outbox_sql::journal::decode_event(
                        &outbox_sql::Row(event),
                        &row.stream,
                    )?)
                };
                (row, event)
            } else {
                (decode_row(r)?, None)
            };
            claimed.push((place, row, event, r));
        }
        claimed.sort_by_key(|(place, ..)| *place);
        let mut taken: Vec<outbox_core::ClaimedRun> = Vec::new();
        for (_, row, event, r) in claimed {
            if let Some(run) = taken.last_mut()
                && run.lease.stream == row.stream
            {
                run.rows.push(row);
                if let (Some(events), Some(event)) = (run.events.as_mut(), event) {
                    events.push(event);
                }
                continue;
            }
            let bad = |e| journal_undecodable("claim", e);
            let partition: i64 = r.try_get(10).map_err(bad)?;
            let epoch: i64 = r.try_get(11).map_err(bad)?;
            let until: i64 = r.try_get(13).map_err(bad)?;
            let partition = u16::try_from(partition)
                .map(Partition::new)
                .map_err(|e| journal_undecodable("partition", e))?;
            let lease = Lease::in_partition(
                row.stream.clone(),
                owner,
                partition,
                outbox_sql::partitions::lease_epoch(epoch)?,
                Timestamp::from_millis(until),
            );
            taken.push(outbox_core::ClaimedRun {
                lease,
                rows: vec![row],
                events: with_events.then(|| event.into_iter().collect()),
            });
        }
        Ok(taken)
    }
}

impl PartitionStore for PgJournal {
    fn partitioning(&self) -> &Partitioning {
        &self.partitioning
    }

    async fn sync_partitions(
        &self,
        owner: &WorkerId,
        wanted: &[Partition],
        ttl: Duration,
    ) -> Result<PartitionSync> {
        outbox_sql::partitions::sync_partitions(self.sql.database(), &self.partitioning, owner, wanted, ttl)
            .await
    }

    /// One statement (`CLAIM_PARTITIONED`): the owner's partition leases
    /// share-locked, the due streams in them, their runs and the holds on
    /// their heads, committed as one.
    async fn claim_partitioned(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        limits: SweepLimits,
    ) -> Result<Vec<(Lease, Vec<OutboxRow>)>> {
        let runs = self.claim_in_partitions(false, owner, ttl, limits).await?;
        Ok(runs.into_iter().map(|r| (r.lease, r.rows)).collect())
    }

    /// [`claim_partitioned`](PartitionStore::claim_partitioned) with each
    /// run's events, in the same statement (`CLAIM_AND_LOAD_PARTITIONED`).
    async fn claim_and_load_partitioned(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        limits: SweepLimits,
    ) -> Result<Vec<outbox_core::ClaimedRun>> {
        self.claim_in_partitions(true, owner, ttl, limits).await
    }

    async fn partitions(&self) -> Result<Vec<PartitionStatus>> {
        outbox_sql::partitions::partitions(self.sql.database(), self.partitioning.count()).await
    }
}

// The cold-path ports: the shared statements of `SqlJournal`, on this
// schema with the journal's clock.

impl DeadLetters for PgJournal {
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

impl OutboxInspector for PgJournal {
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

impl LeaseAdmin for PgJournal {
    fn break_lease(&self, stream: &StreamId) -> impl Future<Output = Result<Option<Lease>>> + Send {
        LeaseAdmin::break_lease(&self.sql, stream)
    }
}

impl WorkerRegistry for PgJournal {
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

impl ActivityLog for PgJournal {
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

impl LeaseStore for PgJournal {
    fn acquire(
        &self,
        stream: &StreamId,
        owner: &WorkerId,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Lease>>> + Send {
        LeaseStore::acquire(&self.sql, stream, owner, ttl)
    }

    fn renew(&self, lease: &Lease, ttl: Duration) -> impl Future<Output = Result<Lease>> + Send {
        LeaseStore::renew(&self.sql, lease, ttl)
    }

    fn release(&self, lease: &Lease) -> impl Future<Output = Result<bool>> + Send {
        LeaseStore::release(&self.sql, lease)
    }
}

impl SinkStore for PgJournal {
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

impl SinkFeed for PgJournal {
    async fn read_feed(&self, after: u64, limit: usize) -> Result<FeedPage> {
        outbox_sql::sinks::read_feed(self, self.sql.database(), after, limit).await
    }

    fn sink_cursors(&self, sink: &SinkName) -> impl Future<Output = Result<Vec<(Partition, u64)>>> + Send {
        outbox_sql::sinks::sink_cursors(self.sql.database(), sink)
    }

    fn advance_sink_cursor(
        &self,
        sink: &SinkName,
        partition: Partition,
        from: u64,
        to: u64,
    ) -> impl Future<Output = Result<bool>> + Send {
        outbox_sql::sinks::advance_sink_cursor(self.sql.database(), sink, partition, from, to)
    }
}

impl outbox_core::ConsumerRegistry for PgJournal {
    async fn register_consumers(
        &self,
        consumers: &[(outbox_core::SinkName, outbox_core::ConsumerKind)],
        version: &str,
        worker: &outbox_core::WorkerId,
    ) -> Result<()> {
        outbox_sql::consumers::register_consumers(self.sql.database(), consumers, version, worker).await
    }

    async fn consumers(&self) -> Result<Vec<outbox_core::ConsumerInfo>> {
        outbox_sql::consumers::consumers(self.sql.database()).await
    }

    async fn set_paused(&self, key: &outbox_core::SinkName, paused: bool) -> Result<bool> {
        outbox_sql::consumers::set_paused(self.sql.database(), key, paused).await
    }

    async fn retire_consumer(&self, key: &outbox_core::SinkName) -> Result<bool> {
        outbox_sql::consumers::retire_consumer(self.sql.database(), key).await
    }
}
