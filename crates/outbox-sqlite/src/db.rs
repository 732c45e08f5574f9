//! Opening a database file safely, migrations, the single writer, error mapping.

use std::fmt;
use std::fs::{DirBuilder, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use outbox_core::{Error, Location, Result};
use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::{Connection, Sqlite, SqliteConnection, Transaction};

use crate::SqliteOptions;
use crate::errors::{SQLITE_BUSY, SQLITE_LOCKED, SQLITE_NOTADB, temporary_code};

pub(crate) use crate::clock::now_ms;

/// The table recording applied migrations. Not sqlx's default
/// `_sqlx_migrations`, so an application that keeps its own sqlx migrations
/// in the same file (typically the projection database) does not collide.
pub(crate) const MIGRATIONS_TABLE: &str = "_outbox_migrations";

/// How many times `BEGIN IMMEDIATE` is retried after SQLite's own busy
/// timeout expired, before a temporary error reaches the caller.
const BUSY_RETRIES: u32 = 3;

pub(crate) use outbox_sql::Role;

/// What a role means on SQLite: its embedded migrations.
pub(crate) trait RoleMigrations {
    fn migrator(self) -> Migrator;
}

impl RoleMigrations for Role {
    fn migrator(self) -> Migrator {
        let mut m = match self {
            Role::Journal => sqlx::migrate!("migrations/journal"),
            Role::Projection => sqlx::migrate!("migrations/projection"),
        };
        m.dangerous_set_table_name(MIGRATIONS_TABLE);
        m
    }
}

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
        E::Migrate(m) => match m.as_ref() {
            sqlx::migrate::MigrateError::Execute(inner)
            | sqlx::migrate::MigrateError::ExecuteMigration(inner, _) => is_temporary(inner),
            _ => false,
        },
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

/// Maps a `sqlx` migration failure: a database error inside it (a
/// connection reset while migrating, an admin shutdown, a busy file) is
/// classified by [`storage`] like any statement's; a failure of the
/// migration files themselves (checksum mismatch, a missing or dirty
/// version) is a permanent storage error.
pub(crate) fn migrate_error(context: impl fmt::Display, e: sqlx::migrate::MigrateError) -> Error {
    match e {
        sqlx::migrate::MigrateError::Execute(db) | sqlx::migrate::MigrateError::ExecuteMigration(db, _) => {
            storage(context, db)
        }
        other => Error::Storage {
            message: format!("{context}: {other}"),
            temporary: false,
            source: Some(Box::new(other)),
        },
    }
}

/// `sqlite://path`, `sqlite:path` to a path, by [`Location::parse`]'s
/// rules (no options, no `:memory:`).
pub(crate) fn path_from_url(url: &str) -> Result<PathBuf> {
    if !url.starts_with("sqlite:") {
        return Err(Error::invalid(
            "a sqlite url must start with sqlite:// or sqlite:",
        ));
    }
    match Location::parse(url)? {
        Location::Sqlite(path) => Ok(path),
        _ => Err(Error::invalid(
            "a sqlite url must start with sqlite:// or sqlite:",
        )),
    }
}

fn io_invalid(path: &Path, what: &str, e: io::Error) -> Error {
    Error::invalid(format_args!("cannot open {}: {what}: {e}", path.display()))
}

const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// Checks and prepares the path before SQLite sees it: the directory exists
/// (or is created 0700 when asked), the file is created 0600 if missing, an
/// existing file is a SQLite database (or empty) and writable. Returns the
/// absolute path. Never changes an existing file.
fn prepare_path(path: &Path, options: &SqliteOptions) -> Result<PathBuf> {
    let shown = path.display();
    if path.as_os_str().is_empty() {
        return Err(Error::invalid("the database path is empty"));
    }
    if path.to_str().is_none() {
        return Err(Error::invalid(format_args!(
            "database path {shown} is not valid UTF-8"
        )));
    }
    let name = path
        .file_name()
        .ok_or_else(|| Error::invalid(format_args!("database path {shown} names no file")))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match std::fs::metadata(parent) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Error::invalid(format_args!(
                "cannot open {shown}: {} is not a directory",
                parent.display()
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if !options.create_if_missing {
                return Err(Error::NotFound(format!(
                    "database file {shown} (its directory does not exist)"
                )));
            }
            if !options.create_dirs {
                return Err(Error::invalid(format_args!(
                    "cannot open {shown}: directory {} does not exist",
                    parent.display()
                )));
            }
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|e| io_invalid(path, "creating its directory failed", e))?;
        }
        Err(e) => return Err(io_invalid(path, "its directory is not accessible", e)),
    }
    let dir = parent
        .canonicalize()
        .map_err(|e| io_invalid(path, "resolving its directory failed", e))?;
    let abs = dir.join(name);
    let shown = abs.display();

    if options.read_only {
        return prepare_read_only(abs);
    }
    if !options.create_if_missing {
        // `exists()` reads "cannot look" as "absent"; an unreadable
        // directory is a permission problem, not a database to create.
        match abs.try_exists() {
            Ok(true) => {}
            Ok(false) => {
                return Err(Error::NotFound(format!(
                    "database file {shown} (create it with `outbox migrate`)"
                )));
            }
            Err(e) => return Err(io_invalid(&abs, "cannot look for it", e)),
        }
    }
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&abs)
    {
        Ok(_) => return Ok(abs),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_invalid(&abs, "creating the file failed", e)),
    }
    let meta = std::fs::metadata(&abs).map_err(|e| io_invalid(&abs, "reading its metadata failed", e))?;
    if !meta.is_file() {
        return Err(Error::invalid(format_args!(
            "cannot open {shown}: not a regular file"
        )));
    }
    if meta.len() == 0 && !options.create_if_missing {
        // An empty file is a database that was never created; only a
        // command allowed to create databases may initialize it.
        return Err(Error::NotFound(format!(
            "database file {shown} is empty (create it with `outbox migrate`)"
        )));
    }
    let mut header = [0u8; 16];
    let mut file = OpenOptions::new()
        .read(true)
        .open(&abs)
        .map_err(|e| io_invalid(&abs, "reading it failed", e))?;
    let mut got = 0;
    while got < header.len() {
        match file.read(&mut header[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_invalid(&abs, "reading it failed", e)),
        }
    }
    if got != 0 && (got < header.len() || &header != SQLITE_HEADER) {
        return Err(Error::invalid(format_args!("{shown} is not a SQLite database")));
    }
    // `readonly()` means no write bit at all: honoured even when running as
    // root, who would otherwise be allowed to write.
    if meta.permissions().readonly() {
        return Err(Error::invalid(format_args!(
            "cannot open {shown}: the file is read-only"
        )));
    }
    OpenOptions::new()
        .write(true)
        .open(&abs)
        .map_err(|e| io_invalid(&abs, "it is not writable", e))?;
    Ok(abs)
}

/// [`prepare_path`] for a read-only open: the file exists, is a regular,
/// non-empty file with SQLite's header; nothing is created or opened for
/// writing.
fn prepare_read_only(abs: PathBuf) -> Result<PathBuf> {
    let shown = abs.display();
    match abs.try_exists() {
        Ok(true) => {}
        Ok(false) => {
            return Err(Error::NotFound(format!(
                "database file {shown} (opened read-only, so it is not created; create it with `outbox migrate`)"
            )));
        }
        Err(e) => return Err(io_invalid(&abs, "cannot look for it", e)),
    }
    let meta = std::fs::metadata(&abs).map_err(|e| io_invalid(&abs, "reading its metadata failed", e))?;
    if !meta.is_file() {
        return Err(Error::invalid(format_args!(
            "cannot open {shown}: not a regular file"
        )));
    }
    if meta.len() == 0 {
        return Err(Error::NotFound(format!(
            "database file {shown} is empty (create it with `outbox migrate`)"
        )));
    }
    let mut header = [0u8; 16];
    let mut file = OpenOptions::new()
        .read(true)
        .open(&abs)
        .map_err(|e| io_invalid(&abs, "reading it failed", e))?;
    file.read_exact(&mut header)
        .map_err(|e| io_invalid(&abs, "reading it failed", e))?;
    if &header != SQLITE_HEADER {
        return Err(Error::invalid(format_args!("{shown} is not a SQLite database")));
    }
    Ok(abs)
}

/// The file beside the database `path` with `suffix` (`-wal`, `-shm`).
pub(crate) fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Whether a read-only open of `path` reads it as immutable: when no `-wal`
/// file is beside it, no process has it open in WAL mode, and a read-only
/// connection would otherwise create the `-wal` and `-shm` files (or, in a
/// directory it cannot write, fail to open).
pub(crate) fn read_as_immutable(path: &Path) -> bool {
    !beside(path, "-wal").exists()
}

/// The error of a write asked of a store opened read-only.
pub(crate) fn read_only_error(path: &Path, what: impl fmt::Display) -> Error {
    Error::Storage {
        message: format!(
            "{what}: {} is open read-only (sqlite://…?mode=ro, or a file this user cannot write); \
             this needs write access",
            path.display()
        ),
        temporary: false,
        source: None,
    }
}

/// What an existing file says about itself.
struct Found {
    role: Option<String>,
    version: Option<i64>,
}

async fn inspect(conn: &mut SqliteConnection, path: &Path) -> Result<Found> {
    let not_db = |e: sqlx::Error| {
        if sqlite_code(&e) == Some(SQLITE_NOTADB) {
            Error::invalid(format_args!("{} is not a SQLite database", path.display()))
        } else {
            storage(format_args!("reading the schema of {}", path.display()), e)
        }
    };
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('outbox_meta', ?1)",
    )
    .bind(MIGRATIONS_TABLE)
    .fetch_all(&mut *conn)
    .await
    .map_err(not_db)?;
    let role = if tables.iter().any(|t| t == "outbox_meta") {
        sqlx::query_scalar("SELECT value FROM outbox_meta WHERE key = 'role'")
            .fetch_optional(&mut *conn)
            .await
            .map_err(not_db)?
    } else {
        None
    };
    let version = if tables.iter().any(|t| t == MIGRATIONS_TABLE) {
        sqlx::query_scalar("SELECT MAX(version) FROM _outbox_migrations")
            .fetch_one(&mut *conn)
            .await
            .map_err(not_db)?
    } else {
        None
    };
    Ok(Found { role, version })
}

/// Refuses a file of the other role or of a newer schema. Reads only.
fn check(found: &Found, role: Role, path: &Path, newest: i64) -> Result<()> {
    if let Some(r) = &found.role {
        if r != role.as_str() {
            return Err(Error::invalid(format_args!(
                "{} is an outbox {r} database, not a {role} database; the {role} store needs its own file",
                path.display()
            )));
        }
    } else if found.version.is_some() {
        return Err(Error::invalid(format_args!(
            "{} has outbox migrations but no role; refusing to use it as a {role} database",
            path.display()
        )));
    }
    if let Some(v) = found.version
        && v > newest
    {
        return Err(Error::SchemaTooNew {
            database: format!("{role} database {}", path.display()),
            found: v,
            supported: newest,
        });
    }
    Ok(())
}

impl Db {
    pub(crate) async fn open(path: &Path, options: &SqliteOptions, role: Role) -> Result<Db> {
        options.validate()?;
        let abs = prepare_path(path, options)?;
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
        if let Err(e) = db.setup(role, options.migrate).await {
            db.writer.close().await;
            db.reader.close().await;
            return Err(e);
        }
        Ok(db)
    }

    /// Role and version checks, WAL, migrations, role record.
    async fn setup(&self, role: Role, migrate: bool) -> Result<()> {
        let path = self.path.as_path();
        let shown = path.display();
        let migrator = role.migrator();
        let newest = migrator.iter().map(|m| m.version).max().unwrap_or(0);
        {
            let mut conn = self
                .writer
                .acquire()
                .await
                .map_err(|e| storage(format_args!("opening {shown}"), e))?;
            // 1. Read-only checks first: a refused file is left exactly as it was.
            let found = inspect(&mut conn, path).await?;
            check(&found, role, path, newest)?;
            let version = found.version.unwrap_or(0);
            if (!migrate || self.read_only) && version < newest {
                return Err(Error::SchemaTooOld {
                    database: format!("{role} database {}", path.display()),
                    found: version,
                    supported: newest,
                });
            }
            // Read-only: no WAL switch (a database of ours is in WAL mode
            // since its first migration), no migration, no role record.
            if self.read_only {
                return Ok(());
            }

            // 2. WAL. Switching needs an exclusive lock that the busy handler
            //    does not wait for, so retry while another opener holds one.
            let started = Instant::now();
            loop {
                match sqlx::query_scalar::<_, String>("PRAGMA journal_mode = WAL")
                    .fetch_one(&mut *conn)
                    .await
                {
                    Ok(mode) if mode.eq_ignore_ascii_case("wal") => break,
                    Ok(mode) => {
                        return Err(Error::Storage {
                            message: format!("{shown} cannot use WAL mode (journal mode is {mode})"),
                            temporary: false,
                            source: None,
                        });
                    }
                    Err(e) if is_busy(&e) && started.elapsed() < self.busy_timeout => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(e) => return Err(storage(format_args!("switching {shown} to WAL mode"), e)),
                }
            }
        }

        // 3. Migrate and record the role in one write transaction, checking
        //    again under the write lock (another process may have won).
        //    Without `migrate` the schema is current (checked above): no write.
        if !migrate {
            return Ok(());
        }
        let mut tx = self.begin().await?;
        check(&inspect(&mut tx, path).await?, role, path, newest)?;
        migrator
            .run_direct(None, &mut *tx, false)
            .await
            .map_err(|e| migrate_error(format_args!("migrating the {role} database {shown}"), e))?;
        sqlx::query("INSERT INTO outbox_meta (key, value) VALUES ('role', ?1) ON CONFLICT (key) DO NOTHING")
            .bind(role.as_str())
            .execute(&mut *tx)
            .await
            .map_err(|e| storage(format_args!("recording the role of {shown}"), e))?;
        tx.commit()
            .await
            .map_err(|e| storage(format_args!("migrating {shown}"), e))?;
        // The writer connected before the first migration made the meta
        // table that the test clock reads (`clock`).
        #[cfg(feature = "test-util")]
        if self.clock == crate::clock::Clock::Test {
            let mut conn = self
                .writer
                .acquire()
                .await
                .map_err(|e| storage(format_args!("opening {shown}"), e))?;
            crate::clock::install(&mut conn, self.clock)
                .await
                .map_err(|e| storage(format_args!("installing the test clock on {shown}"), e))?;
        }
        Ok(())
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
        sqlx::query(
            "INSERT INTO outbox_meta (key, value) VALUES ('test_clock_offset_ms', ?1) \
             ON CONFLICT (key) DO UPDATE SET value = CAST(value AS INTEGER) + ?1",
        )
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
mod migrate_tests {
    use super::*;

    #[test]
    fn a_busy_or_lost_file_while_migrating_is_temporary() {
        let io = || sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::Interrupted));
        let e = migrate_error("migrating", sqlx::migrate::MigrateError::Execute(io()));
        assert!(e.is_temporary(), "{e}");
        let e = migrate_error("migrating", sqlx::migrate::MigrateError::VersionMissing(3));
        assert!(!e.is_temporary(), "a missing migration is permanent: {e}");
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
        let db = Db::open(
            &dir.path().join("p.db"),
            &SqliteOptions::default(),
            Role::Projection,
        )
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
