//! The projection database's `sqlx` connections: the single writer and the
//! readers, opened once the file is ready (`crate::migrate`), and the error
//! mapping of that driver.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use outbox_core::{Error, Result};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::{Connection, Sqlite, Transaction};

use crate::SqliteOptions;
use crate::errors::{SQLITE_BUSY, SQLITE_LOCKED, temporary_code};
use crate::files::{read_as_immutable, read_only_error};

pub(crate) use crate::clock::now_ms;

/// How many times `BEGIN IMMEDIATE` is retried after SQLite's own busy
/// timeout expired, before a temporary error reaches the caller.
const BUSY_RETRIES: u32 = 3;

use outbox_sql::Role;

/// An open database: one writer connection and a pool of read-only ones.
#[derive(Debug)]
pub(crate) struct Db {
    pub(crate) writer: SqlitePool,
    pub(crate) reader: SqlitePool,
    /// The clock its connections read (`crate::clock`).
    pub(crate) clock: crate::clock::Clock,
    pub(crate) path: PathBuf,
    busy_timeout: Duration,
    /// Opened read-only ([`SqliteOptions::read_only`]): [`Db::begin`]
    /// refuses.
    pub(crate) read_only: bool,
    /// The shared statements' dialect, with this file's clock.
    pub(crate) dialect: std::sync::Arc<outbox_sql::Dialect>,
}

/// The SQLite primary result code of a driver error, if it has one.
fn sqlite_code(e: &sqlx::Error) -> Option<i32> {
    match e {
        sqlx::Error::Database(d) => d.code().and_then(|c| c.parse::<i32>().ok()).map(|c| c & 0xff),
        _ => None,
    }
}

/// Whether the error is SQLite's "database is busy/locked".
pub(crate) fn is_busy(e: &sqlx::Error) -> bool {
    matches!(sqlite_code(e), Some(SQLITE_BUSY | SQLITE_LOCKED))
}

/// Whether a driver error is temporary: the one classification of the sqlx
/// side, used by opening, migrating and every statement.
pub(crate) fn is_temporary(e: &sqlx::Error) -> bool {
    use sqlx::Error as E;
    match e {
        // The pool had no connection within its timeout; the driver's
        // worker thread died; the OS refused an operation on the file.
        E::PoolTimedOut | E::WorkerCrashed | E::Io(_) => true,
        E::Database(_) => sqlite_code(e).is_some_and(temporary_code),
        // Permanent: our own pool closed, configuration, decoding, a missing
        // row, column or type, and the rest.
        _ => false,
    }
}

/// Maps a driver error to a storage error, temporary as [`is_temporary`]
/// says, everything else permanent. The message names what was being done
/// and the driver's one-line reason (SQLite messages carry no secrets); the
/// driver error is kept as the source.
///
/// A full disk (`SQLITE_FULL`) is temporary on purpose: SQLite rolls the
/// transaction back and leaves the file intact, and once space returns the
/// same open store writes again (`tests/disk.rs`). The worker treats a
/// temporary error as infrastructure trouble and retries on a later pass, not
/// as a failure of the event, so a full disk does not dead-letter events.
pub(crate) fn storage(context: impl fmt::Display, e: sqlx::Error) -> Error {
    let message = format!("{context}: {e}");
    if is_temporary(&e) {
        Error::temporary(message, e)
    } else {
        Error::storage(message, e)
    }
}

impl Db {
    /// Prepares the projection database at `path` (`crate::migrate`) and
    /// opens its connections.
    pub(crate) async fn open(path: &Path, options: &SqliteOptions) -> Result<Db> {
        let abs = crate::migrate::prepare(path, options, Role::Projection).await?;
        let shown = abs.display().to_string();
        let connect = SqliteConnectOptions::new()
            .filename(&abs)
            .create_if_missing(false)
            .busy_timeout(options.busy_timeout)
            .synchronous(options.synchronous.to_sqlx())
            .foreign_keys(true)
            .statement_cache_capacity(256)
            // Commits truncate a grown WAL file back to this size (see
            // `options::WAL_SIZE_LIMIT`; an engine's writer leaves that to its
            // checkpointer).
            .pragma("journal_size_limit", crate::options::WAL_SIZE_LIMIT.to_string());
        let connect = if options.read_only {
            connect.read_only(true).immutable(read_as_immutable(&abs))
        } else {
            connect
        };

        let clock = options.clock;
        // The single writer: one connection, kept open for the store's life.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(60))
            .after_connect(move |conn, _| Box::pin(crate::clock::install(conn, clock)))
            // Savepoint and statement journals in memory (an apply's guard,
            // a view flush); readers keep the default (see `engine::connect`).
            .connect_with(connect.clone().pragma("temp_store", "MEMORY"))
            .await
            .map_err(|e| storage(format_args!("opening {shown}"), e))?;
        let reader = SqlitePoolOptions::new()
            .max_connections(options.read_connections)
            .min_connections(0)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(60))
            .after_connect(move |conn, _| Box::pin(crate::clock::install(conn, clock)))
            .connect_lazy_with(connect.read_only(true));
        let db = Db {
            writer,
            reader,
            clock,
            path: abs,
            busy_timeout: options.busy_timeout,
            read_only: options.read_only,
            dialect: std::sync::Arc::new(outbox_sql::Dialect::sqlite(now_ms!())),
        };
        Ok(db)
    }

    /// `BEGIN IMMEDIATE` on the writer connection, retried a few times if
    /// SQLite's busy timeout expires first (another process holds the write
    /// lock); then a temporary error.
    ///
    /// When SQLite ended a transaction by itself (it rolls back on some
    /// errors, e.g. a full disk, or user code committed or rolled back), the
    /// driver's `ROLLBACK` on drop fails and it keeps counting the connection
    /// as inside a transaction, refusing every later `BEGIN`. Such a writer
    /// connection is closed and replaced once, instead of failing every write
    /// for the rest of the store's life.
    pub(crate) async fn begin(&self) -> Result<Transaction<'static, Sqlite>> {
        if self.read_only {
            return Err(read_only_error(&self.path, "starting a write transaction"));
        }
        let mut attempt = 0;
        let mut replaced = false;
        loop {
            match self.writer.begin_with("BEGIN IMMEDIATE").await {
                Ok(tx) => return Ok(tx),
                Err(sqlx::Error::InvalidSavePointStatement) if !replaced => {
                    replaced = true;
                    tracing::warn!(
                        path = %self.path.display(),
                        "the writer connection's transaction was ended behind the driver's back; replacing the connection"
                    );
                    // The pool holds exactly one writer connection: this is it.
                    let conn = self.writer.acquire().await.map_err(|e| {
                        storage(
                            format_args!("replacing the writer connection of {}", self.path.display()),
                            e,
                        )
                    })?;
                    if conn.is_in_transaction() {
                        // Closing rolls back whatever SQLite may still hold open.
                        if let Err(e) = conn.close().await {
                            tracing::warn!(path = %self.path.display(), error = %e, "closing the stale writer connection failed");
                        }
                    }
                }
                Err(e) if is_busy(&e) && attempt < BUSY_RETRIES => {
                    attempt += 1;
                    tracing::debug!(path = %self.path.display(), attempt, "sqlite write lock busy; retrying");
                    tokio::time::sleep(Duration::from_millis(10 * u64::from(attempt))).await;
                }
                Err(e) => {
                    return Err(storage(
                        format_args!(
                            "starting a write transaction on {} (waited {:?} per attempt)",
                            self.path.display(),
                            self.busy_timeout
                        ),
                        e,
                    ));
                }
            }
        }
    }

    /// Closes every connection (waits for checked-out ones to come back).
    pub(crate) async fn close(&self) {
        self.reader.close().await;
        self.writer.close().await;
    }

    /// Moves the database's clock forward by `ms` (tests only).
    #[cfg(feature = "test-util")]
    pub(crate) async fn advance_clock(&self, ms: i64) -> Result<()> {
        crate::clock::check_test_clock(self.clock, &self.path)?;
        let mut tx = self.begin().await?;
        sqlx::query(crate::clock::ADVANCE_TEST_CLOCK)
            .bind(ms)
            .execute(&mut *tx)
            .await
            .map_err(|e| storage("advancing the test clock", e))?;
        tx.commit()
            .await
            .map_err(|e| storage("advancing the test clock", e))
    }

    /// A read-only connection.
    pub(crate) async fn read(&self) -> Result<sqlx::pool::PoolConnection<Sqlite>> {
        self.reader.acquire().await.map_err(|e| {
            storage(
                format_args!("opening a read connection to {}", self.path.display()),
                e,
            )
        })
    }

    pub(crate) fn context(&self, what: &str) -> String {
        format!("{what} on {}", self.path.display())
    }
}

#[cfg(test)]
mod pragma_tests {
    use super::*;

    /// The `sqlx` writer keeps savepoint and statement journals in memory
    /// (an apply's guard journals every page the batch changes); readers
    /// keep the default, so a digest's sort of a whole table spills to disk.
    /// The writer truncates a grown WAL back to `options::WAL_SIZE_LIMIT`.
    #[tokio::test]
    async fn the_sqlx_connections_set_their_pragmas() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(&dir.path().join("p.db"), &SqliteOptions::default())
            .await
            .expect("open");
        let mut writer = db.writer.acquire().await.expect("writer");
        let mut reader = db.read().await.expect("reader");
        for (conn, temp_store, which) in [(&mut *writer, 2, "writer"), (&mut *reader, 0, "reader")] {
            let got: i64 = sqlx::query_scalar("PRAGMA temp_store")
                .fetch_one(conn)
                .await
                .expect("temp_store");
            assert_eq!(got, temp_store, "{which}'s temp_store");
        }
        let limit: i64 = sqlx::query_scalar("PRAGMA journal_size_limit")
            .fetch_one(&mut *writer)
            .await
            .expect("journal_size_limit");
        assert_eq!(
            limit,
            crate::options::WAL_SIZE_LIMIT,
            "the writer's journal_size_limit"
        );
        drop((writer, reader));
        db.close().await;
    }
}
