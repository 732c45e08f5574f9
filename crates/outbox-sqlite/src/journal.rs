//! The journal database: events, outbox rows, outbox heads, stream leases.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, LazyLock};

use outbox_core::spi::{duration_millis, journal_undecodable, truncate_error, validate_limit};
use outbox_core::{
    AppendOptions, AppendRequest, Appended, Error, Event, EventJournal, FailureDecision, FailureOutcome,
    Lease, MAX_PAGE, OutboxQueue, OutboxRow, OutboxStatus, PayloadHash, Result, RetryPolicy, Seq, StreamId,
    StreamVersion, Timestamp,
};
use sqlx::sqlite::SqliteRow;
use sqlx::{AssertSqlSafe, Connection, Sqlite, SqliteConnection, Transaction};

use crate::SqliteOptions;
use crate::db::{Db, Role, now_ms, path_from_url, storage};

/// The SQLite journal database: implements [`EventJournal`](outbox_core::EventJournal), [`OutboxQueue`](outbox_core::OutboxQueue),
/// [`LeaseStore`](outbox_core::LeaseStore) and [`WorkerRegistry`](outbox_core::WorkerRegistry) on one file.
///
/// Every write runs in a `BEGIN IMMEDIATE` transaction on the instance's
/// single writer connection; reads use a small pool of read-only
/// connections. Several instances (in one process or many) may open the same
/// file: SQLite's write lock and busy timeout serialize them, and every lease
/// expiry and due-time comparison happens in SQL with SQLite's clock.
/// Clones share the connections.
#[derive(Clone, Debug)]
pub struct SqliteJournal {
    db: Arc<Db>,
}

/// The largest number of events inserted by one statement.
const CHUNK: usize = 64;

/// `INSERT INTO events` statements for 1, 2, 4, ..., 64 rows, so a batch of
/// any size uses at most seven distinct (cached) statements.
static EVENT_INSERTS: LazyLock<Vec<Arc<str>>> = LazyLock::new(|| {
    (0..=CHUNK.trailing_zeros())
        .map(|k| {
            let rows = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?)"; 1 << k].join(", ");
            Arc::from(format!(
                "INSERT INTO events (stream, seq, event_type, intent, payload, payload_hash, recorded_at, \
                 correlation_id, causation_id) VALUES {rows}"
            ))
        })
        .collect()
});

/// Splits `n` into chunk sizes: full chunks, then the binary digits of the rest.
fn chunks(n: usize) -> impl Iterator<Item = usize> {
    let full = n / CHUNK;
    let rest = n % CHUNK;
    std::iter::repeat_n(CHUNK, full).chain(
        (0..CHUNK.trailing_zeros())
            .rev()
            .map(|k| 1usize << k)
            .filter(move |b| rest & b != 0),
    )
}

fn decode_row(r: &SqliteRow) -> Result<OutboxRow> {
    outbox_sql::journal::decode_row(&crate::sql::to_row(r).map_err(|e| journal_undecodable("outbox row", e))?)
}

fn decode_event(r: &SqliteRow, stream: &StreamId) -> Result<Event> {
    outbox_sql::journal::decode_event(
        &crate::sql::to_row(r).map_err(|e| journal_undecodable("event", e))?,
        stream,
    )
}

fn seq_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Recomputes the stream's `outbox_heads` entry from its first outbox row
/// (or removes it when the stream has none). Two index seeks.
async fn refresh_head(conn: &mut SqliteConnection, stream: &str) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO outbox_heads (stream, head_seq, due_at) \
         SELECT stream, seq, CASE WHEN status = 'dead' THEN NULL ELSE next_attempt_at END \
         FROM outbox WHERE stream = ?1 ORDER BY seq LIMIT 1 \
         ON CONFLICT (stream) DO UPDATE SET head_seq = excluded.head_seq, due_at = excluded.due_at",
    )
    .bind(stream)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "DELETE FROM outbox_heads WHERE stream = ?1 AND NOT EXISTS (SELECT 1 FROM outbox WHERE stream = ?1)",
    )
    .bind(stream)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Whether `lease` is the stream's current, unexpired lease (SQLite's clock).
async fn lease_valid(conn: &mut SqliteConnection, lease: &Lease) -> sqlx::Result<bool> {
    sqlx::query_scalar::<_, i64>(concat!(
        "SELECT EXISTS (SELECT 1 FROM stream_leases WHERE stream = ?1 AND owner = ?2 AND epoch = ?3 \
         AND expires_at > ",
        now_ms!(),
        ")"
    ))
    .bind(lease.stream.as_str())
    .bind(lease.owner.as_str())
    .bind(seq_i64(lease.epoch))
    .fetch_one(&mut *conn)
    .await
    .map(|v| v != 0)
}

/// The current status and attempt count of a row that must be `processing`.
async fn processing_row(conn: &mut SqliteConnection, lease: &Lease, seq: Seq) -> Result<u32> {
    let found: Option<(String, i64)> =
        sqlx::query_as("SELECT status, attempt_count FROM outbox WHERE stream = ?1 AND seq = ?2")
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
    Ok(u32::try_from(attempts.max(0)).unwrap_or(u32::MAX))
}

async fn now(conn: &mut SqliteConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar(concat!("SELECT ", now_ms!()))
        .fetch_one(&mut *conn)
        .await
}

impl SqliteJournal {
    /// Opens (creating if needed, mode 0600) the journal database at `path`
    /// and applies its migrations.
    ///
    /// Refused, leaving the file as it was: a file that is not a SQLite
    /// database, a read-only file, a missing directory (unless
    /// [`SqliteOptions::create_dirs`]), a projection database
    /// ([`Error::InvalidInput`]), a schema newer than this build
    /// ([`Error::SchemaTooNew`]).
    pub async fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        Ok(SqliteJournal {
            db: Arc::new(Db::open(path.as_ref(), &options, Role::Journal).await?),
        })
    }

    /// [`SqliteJournal::open`] from a `sqlite://path` or `sqlite:path` URL.
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

    /// Starts a `BEGIN IMMEDIATE` transaction on this store's writer
    /// connection, for [`SqliteJournal::append_in`] alongside the caller's own
    /// writes to the journal file. Commit it with `tx.commit()`; dropping it
    /// rolls back. Other writes of this instance wait until it ends, so keep
    /// it short.
    pub async fn begin(&self) -> Result<Transaction<'static, Sqlite>> {
        self.db.begin().await
    }

    /// The transactional append: appends `batch` inside the caller's open
    /// transaction on the journal file (from [`SqliteJournal::begin`], or the
    /// caller's own `BEGIN IMMEDIATE` on a connection to this file), so the
    /// events and their outbox rows commit or roll back together with the
    /// caller's writes. This is the adapter's answer to "append in my
    /// transaction" (the port itself has no transaction parameter).
    ///
    /// Same contract as [`EventJournal::append`]; on any error the batch has
    /// written nothing (it runs in a savepoint) and the caller's transaction
    /// is still usable. Seqs and global positions are final only once the
    /// caller commits.
    pub async fn append_in(
        &self,
        conn: &mut SqliteConnection,
        batch: &[AppendRequest],
        options: AppendOptions,
    ) -> Result<Vec<Appended>> {
        options.validate(batch)?;
        if !conn.is_in_transaction() {
            return Err(Error::invalid(
                "append_in needs a connection inside a transaction (see SqliteJournal::begin)",
            ));
        }
        let mut sp = conn
            .begin()
            .await
            .map_err(|e| storage("starting a savepoint", e))?;
        let out = append_tx(&mut sp, batch, options).await?;
        sp.commit()
            .await
            .map_err(|e| storage("releasing a savepoint", e))?;
        Ok(out)
    }

    #[cfg(feature = "test-util")]
    /// Test support: moves this database's clock forward by `d`, for every
    /// instance on the file. The database's clock is SQLite's clock plus an
    /// offset stored in the file (0 unless this is called), so lease expiry,
    /// due times and recorded times all see the same shifted "now". Never
    /// call it on a production database.
    #[doc(hidden)]
    pub async fn advance_clock_for_tests(&self, d: std::time::Duration) -> Result<()> {
        self.db.advance_clock(duration_millis(d)).await
    }

    async fn write<T>(
        &self,
        what: &'static str,
        f: impl AsyncFnOnce(&mut SqliteConnection) -> Result<T>,
    ) -> Result<T> {
        let mut tx = self.db.begin().await?;
        let out = f(&mut tx).await?;
        tx.commit().await.map_err(|e| storage(self.db.context(what), e))?;
        Ok(out)
    }
}

/// The append itself, inside a transaction: checks every expected version
/// first (nothing is written on a conflict), then writes.
async fn append_tx(
    conn: &mut SqliteConnection,
    batch: &[AppendRequest],
    options: AppendOptions,
) -> Result<Vec<Appended>> {
    let err = |e| storage("appending events", e);
    let mut start: HashMap<&StreamId, u64> = HashMap::new();
    let mut heads: HashMap<&StreamId, u64> = HashMap::new();
    for req in batch {
        let actual = match heads.get(&req.stream) {
            Some(h) => *h,
            None => {
                let h: Option<i64> = sqlx::query_scalar("SELECT head FROM streams WHERE stream = ?1")
                    .bind(req.stream.as_str())
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(err)?;
                let h = u64::try_from(h.unwrap_or(0)).unwrap_or(0);
                start.insert(&req.stream, h);
                h
            }
        };
        if !req.expected.matches(actual) {
            return Err(req.expected.conflict(&req.stream, actual));
        }
        let next = actual + req.events.len() as u64;
        if next > Seq::MAX.get() {
            return Err(Error::invalid(format_args!(
                "stream {} would exceed the largest seq",
                req.stream
            )));
        }
        heads.insert(&req.stream, next);
    }

    let now = now(conn).await.map_err(err)?;
    let mut out = Vec::with_capacity(batch.len());
    for req in batch {
        let head = start.get_mut(&req.stream).expect("read above");
        let first = *head + 1;
        let mut first_global = None;
        let mut i = 0usize;
        for n in chunks(req.events.len()) {
            let sql = Arc::clone(&EVENT_INSERTS[n.trailing_zeros() as usize]);
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (j, e) in req.events[i..i + n].iter().enumerate() {
                q = q
                    .bind(req.stream.as_str())
                    .bind(seq_i64(first + (i + j) as u64))
                    .bind(e.event_type.as_str())
                    .bind(e.intent.as_str())
                    .bind(e.payload.as_slice())
                    .bind(PayloadHash::of(&e.payload).0.to_vec())
                    .bind(now)
                    .bind(e.metadata.correlation_id.as_deref())
                    .bind(e.metadata.causation_id.as_deref());
            }
            let done = q.execute(&mut *conn).await.map_err(err)?;
            // AUTOINCREMENT under the write lock: one statement's rows get
            // consecutive positions ending at last_insert_rowid.
            first_global.get_or_insert(done.last_insert_rowid() - n as i64 + 1);
            i += n;
        }
        let last = first + req.events.len() as u64 - 1;
        if options.enqueues() {
            sqlx::query(
                "INSERT INTO outbox (stream, seq, event_type, status, attempt_count, next_attempt_at, \
                 last_error, updated_at) \
                 SELECT stream, seq, event_type, 'pending', 0, ?4, NULL, ?4 FROM events \
                 WHERE stream = ?1 AND seq BETWEEN ?2 AND ?3",
            )
            .bind(req.stream.as_str())
            .bind(seq_i64(first))
            .bind(seq_i64(last))
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(err)?;
            // New rows are behind any existing ones: an existing head stays.
            sqlx::query(
                "INSERT INTO outbox_heads (stream, head_seq, due_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (stream) DO NOTHING",
            )
            .bind(req.stream.as_str())
            .bind(seq_i64(first))
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(err)?;
        }
        *head = last;
        out.push(Appended {
            stream: req.stream.clone(),
            first_seq: Seq::new(first)?,
            last_seq: Seq::new(last)?,
            first_global_position: u64::try_from(first_global.unwrap_or(0)).unwrap_or(0),
            recorded_at: Timestamp::from_millis(now),
        });
    }
    for (stream, head) in &start {
        sqlx::query(
            "INSERT INTO streams (stream, head) VALUES (?1, ?2) \
             ON CONFLICT (stream) DO UPDATE SET head = excluded.head",
        )
        .bind(stream.as_str())
        .bind(seq_i64(*head))
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    }
    Ok(out)
}

impl EventJournal for SqliteJournal {
    async fn append(&self, batch: &[AppendRequest], options: AppendOptions) -> Result<Vec<Appended>> {
        options.validate(batch)?;
        self.write("appending events", async |tx| append_tx(tx, batch, options).await)
            .await
    }

    async fn load(&self, stream: &StreamId, seq: Seq) -> Result<Event> {
        let mut conn = self.db.read().await?;
        let row = sqlx::query(concat!(
            "SELECT ",
            outbox_sql::event_columns!(),
            " FROM events WHERE stream = ?1 AND seq = ?2"
        ))
        .bind(stream.as_str())
        .bind(seq.as_i64())
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| storage(self.db.context("loading an event"), e))?
        .ok_or_else(|| Error::NotFound(format!("event {stream}/{seq}")))?;
        decode_event(&row, stream)
    }

    async fn read_stream(&self, stream: &StreamId, from: Seq, limit: usize) -> Result<Vec<Event>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let mut conn = self.db.read().await?;
        let rows = sqlx::query(concat!(
            "SELECT ",
            outbox_sql::event_columns!(),
            " FROM events WHERE stream = ?1 AND seq >= ?2 ORDER BY seq LIMIT ?3"
        ))
        .bind(stream.as_str())
        .bind(from.as_i64())
        .bind(limit as i64)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| storage(self.db.context("reading a stream"), e))?;
        rows.iter().map(|r| decode_event(r, stream)).collect()
    }

    async fn stream_version(&self, stream: &StreamId) -> Result<u64> {
        let mut conn = self.db.read().await?;
        let head: Option<i64> = sqlx::query_scalar("SELECT head FROM streams WHERE stream = ?1")
            .bind(stream.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| storage(self.db.context("reading a stream head"), e))?;
        Ok(u64::try_from(head.unwrap_or(0)).unwrap_or(0))
    }

    async fn stream_versions(&self, after: Option<&StreamId>, limit: usize) -> Result<Vec<StreamVersion>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let mut conn = self.db.read().await?;
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT stream, head FROM streams WHERE stream > ?1 ORDER BY stream LIMIT ?2")
                .bind(after.map_or("", StreamId::as_str))
                .bind(limit as i64)
                .fetch_all(&mut *conn)
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

impl OutboxQueue for SqliteJournal {
    async fn due_streams(&self, limit: usize) -> Result<Vec<StreamId>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let mut conn = self.db.read().await?;
        let rows: Vec<String> = sqlx::query_scalar(concat!(
            "SELECT h.stream FROM outbox_heads h LEFT JOIN stream_leases l ON l.stream = h.stream \
             WHERE h.due_at IS NOT NULL AND h.due_at <= ",
            now_ms!(),
            " AND (l.owner IS NULL OR l.expires_at <= ",
            now_ms!(),
            ") ORDER BY h.due_at, h.stream LIMIT ?1"
        ))
        .bind(limit as i64)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| storage(self.db.context("listing due streams"), e))?;
        rows.into_iter()
            .map(|s| StreamId::new(s).map_err(|e| journal_undecodable("outbox head", e)))
            .collect()
    }

    async fn claim(&self, lease: &Lease, max: usize) -> Result<Vec<OutboxRow>> {
        let max = validate_limit(max, MAX_PAGE)?;
        let err = |e| storage("claiming outbox rows", e);
        self.write("claiming outbox rows", async |tx| {
            if !lease_valid(tx, lease).await.map_err(err)? {
                return Err(lease.lost());
            }
            // The head run: the first `max` rows in seq order (a primary-key
            // range seek), cut at the first hole, dead row or row not yet due.
            let run: Vec<(i64, String, bool)> = sqlx::query_as(concat!(
                "SELECT seq, status, next_attempt_at <= ",
                now_ms!(),
                " FROM outbox WHERE stream = ?1 ORDER BY seq LIMIT ?2"
            ))
            .bind(lease.stream.as_str())
            .bind(max as i64)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
            let mut through = None;
            for (i, (seq, status, due)) in run.iter().enumerate() {
                let contiguous = i == 0 || *seq == run[0].0 + i as i64;
                if !contiguous || status == OutboxStatus::Dead.as_str() || !due {
                    break;
                }
                through = Some(*seq);
            }
            let Some(through) = through else {
                return Ok(Vec::new());
            };
            let rows = sqlx::query(concat!(
                "UPDATE outbox SET status = 'processing', updated_at = ",
                now_ms!(),
                " WHERE stream = ?1 AND seq BETWEEN ?2 AND ?3 RETURNING ",
                outbox_sql::outbox_row_columns!()
            ))
            .bind(lease.stream.as_str())
            .bind(run[0].0)
            .bind(through)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
            let mut rows = rows.iter().map(decode_row).collect::<Result<Vec<_>>>()?;
            rows.sort_by_key(|r| r.seq);
            Ok(rows)
        })
        .await
    }

    async fn complete(&self, stream: &StreamId, through: Seq) -> Result<u64> {
        let err = |e| storage("completing outbox rows", e);
        self.write("completing outbox rows", async |tx| {
            let done = sqlx::query("DELETE FROM outbox WHERE stream = ?1 AND seq <= ?2")
                .bind(stream.as_str())
                .bind(through.as_i64())
                .execute(&mut *tx)
                .await
                .map_err(err)?
                .rows_affected();
            if done > 0 {
                refresh_head(tx, stream.as_str()).await.map_err(err)?;
            }
            Ok(done)
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
            if !lease_valid(tx, lease).await.map_err(err)? {
                return Err(lease.lost());
            }
            let attempt = processing_row(tx, lease, seq).await?.saturating_add(1);
            let (status, delay) = match policy.decide(attempt) {
                FailureDecision::DeadLetter => (OutboxStatus::Dead, 0),
                FailureDecision::Retry(d) => (OutboxStatus::Failed, duration_millis(d)),
            };
            let next: i64 = sqlx::query_scalar(concat!(
                "UPDATE outbox SET status = ?3, attempt_count = ?4, last_error = ?5, \
                 next_attempt_at = ",
                now_ms!(),
                " + ?6, updated_at = ",
                now_ms!(),
                " WHERE stream = ?1 AND seq = ?2 RETURNING next_attempt_at"
            ))
            .bind(lease.stream.as_str())
            .bind(seq.as_i64())
            .bind(status.as_str())
            .bind(i64::from(attempt))
            .bind(truncate_error(error))
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

    async fn abandon(&self, lease: &Lease) -> Result<u64> {
        let err = |e| storage("abandoning outbox rows", e);
        self.write("abandoning outbox rows", async |tx| {
            if !lease_valid(tx, lease).await.map_err(err)? {
                return Err(lease.lost());
            }
            let n = sqlx::query(concat!(
                "UPDATE outbox INDEXED BY outbox_processing SET status = 'pending', updated_at = ",
                now_ms!(),
                " WHERE stream = ?1 AND status = 'processing'"
            ))
            .bind(lease.stream.as_str())
            .execute(&mut *tx)
            .await
            .map_err(err)?
            .rows_affected();
            if n > 0 {
                refresh_head(tx, lease.stream.as_str()).await.map_err(err)?;
            }
            Ok(n)
        })
        .await
    }
}

outbox_sql::impl_journal_ports!(SqliteJournal, db);
