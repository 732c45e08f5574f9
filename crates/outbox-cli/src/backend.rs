//! Backends: the one place a URL scheme picks SQLite or Postgres, and what
//! the commands need of each.

use std::path::PathBuf;
use std::sync::Arc;

use outbox_core::{Error, LeaseAdmin, WakeSource};
#[cfg(feature = "postgres")]
use outbox_postgres::sqlx::{self, Connection, postgres::PgConnectOptions};
#[cfg(feature = "postgres")]
use outbox_postgres::{PgJournal, PgOptions, PgProjectionStore};
use outbox_runtime::{JournalBackend, ProjectionBackend};
#[cfg(feature = "sqlite")]
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};

/// The journal side of a backend, as the commands use it.
pub(crate) trait CliJournal: JournalBackend + LeaseAdmin + Clone {
    /// Where it is, for `migrate` (a path, or a Postgres schema).
    fn describe(&self) -> String;
    /// Cross-process wake-ups for the worker, when the backend has them.
    fn wake(&self) -> Option<Arc<dyn WakeSource>>;
    /// Closes its connections.
    fn shut(&self) -> impl Future<Output = ()> + Send;
    /// Re-keys the sinks' feed after a logical restore (`outbox sinks
    /// rekey`): the events re-keyed, or `None` where the feed's keys are
    /// global positions, which need none.
    fn rekey_feed(&self) -> impl Future<Output = Result<Option<u64>, Error>> + Send {
        async { Ok(None) }
    }
}

/// The projection side of a backend, as the commands use it.
pub(crate) trait CliStore: ProjectionBackend + Clone {
    /// Where it is, for `migrate`.
    fn describe(&self) -> String;
    /// Closes its connections.
    fn shut(&self) -> impl Future<Output = ()> + Send;
}

#[cfg(feature = "sqlite")]
impl CliJournal for SqliteJournal {
    fn describe(&self) -> String {
        self.path().display().to_string()
    }
    fn wake(&self) -> Option<Arc<dyn WakeSource>> {
        Some(self.wake_source())
    }
    async fn shut(&self) {
        self.close().await;
    }
}

#[cfg(feature = "sqlite")]
impl CliStore for SqliteProjectionStore {
    fn describe(&self) -> String {
        self.path().display().to_string()
    }
    async fn shut(&self) {
        self.close().await;
    }
}

#[cfg(feature = "postgres")]
impl CliJournal for PgJournal {
    fn describe(&self) -> String {
        format!("postgres schema {}", self.schema())
    }
    fn wake(&self) -> Option<Arc<dyn WakeSource>> {
        Some(self.wake_source())
    }
    async fn shut(&self) {
        self.close().await;
    }
    async fn rekey_feed(&self) -> Result<Option<u64>, Error> {
        PgJournal::rekey_feed(self).await.map(Some)
    }
}

#[cfg(feature = "postgres")]
impl CliStore for PgProjectionStore {
    fn describe(&self) -> String {
        format!("postgres schema {}", self.schema())
    }
    async fn shut(&self) {
        self.close().await;
    }
}

/// A database location parsed from a URL or path.
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A Postgres database: the `postgres://` or `postgresql://` URL as given
    /// (never shown: it may hold a password).
    Postgres(String),
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Sqlite(p) => f.debug_tuple("Sqlite").field(p).finish(),
            Location::Postgres(_) => f.write_str("Postgres(<url not shown>)"),
        }
    }
}

/// How a command opens the databases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Create missing databases (or the schema) and migrate: `migrate`.
    Create,
    /// Existing databases, migrated to this build: the commands that apply
    /// events, run by the application's own binary.
    Migrate,
    /// Existing databases at this build's schema, never upgraded: inspection
    /// and administration, which any build may run on any application's
    /// databases (an older schema is `SchemaTooOld`, nothing changed).
    Existing,
}

/// Parses a database URL: `postgres://...` / `postgresql://...`,
/// `sqlite://path`, `sqlite:path` or a plain path (SQLite). The one place a
/// backend is chosen from a scheme.
pub fn open_url(url: &str) -> Result<Location, Error> {
    match url.split_once(':') {
        Some(("sqlite", rest)) => {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(Error::invalid(format_args!("database URL {url:?} names no file")));
            }
            Ok(Location::Sqlite(PathBuf::from(path)))
        }
        Some(("postgres" | "postgresql", rest)) if rest.starts_with("//") => {
            Ok(Location::Postgres(url.to_owned()))
        }
        Some(("postgres" | "postgresql", _)) => Err(Error::invalid(
            "a postgres URL must start with postgres:// or postgresql:// (url not shown)",
        )),
        Some((scheme, rest)) if rest.starts_with("//") => Err(Error::invalid(format_args!(
            "unsupported database URL scheme {scheme:?} (use sqlite://path or postgres://...)"
        ))),
        _ if url.is_empty() => Err(Error::invalid("the database URL is empty")),
        // A mistyped URL (`postgres//app:pw@host/db`, `postgres:/...`) would
        // otherwise be taken for a file name and printed, password and all.
        _ if looks_like_a_url(url) => Err(Error::invalid(
            "the database URL is neither postgres://... nor sqlite://path, and looks like a mistyped URL \
             with credentials, not a file name (url not shown)",
        )),
        _ => Ok(Location::Sqlite(PathBuf::from(url))),
    }
}

/// Whether a value that is no URL of ours looks like a mistyped one: it
/// names a Postgres scheme, or carries `user:password@` before its first
/// `/`-separated part ends.
fn looks_like_a_url(value: &str) -> bool {
    let lower = value.to_ascii_lowercase();
    if lower.starts_with("postgres") {
        return true;
    }
    value
        .split_once('@')
        .is_some_and(|(before, _)| before.contains(':'))
}

#[cfg(feature = "sqlite")]
/// Opens both SQLite stores as `access` says. `Create` allows creating missing files
/// (migrate, demo); every other command refuses a missing database.
pub(crate) async fn open_sqlite(
    journal_path: PathBuf,
    projection_path: PathBuf,
    access: Access,
    partitions: outbox_core::PartitionOptions,
) -> Result<(SqliteJournal, SqliteProjectionStore), Error> {
    let mut opts = SqliteOptions::default()
        .with_create_if_missing(access == Access::Create)
        .with_migrate(access != Access::Existing);
    opts.partitions = partitions;
    if journal_path == projection_path {
        return Err(Error::invalid(format_args!(
            "the journal and the projection database must be different files (both are {})",
            journal_path.display()
        )));
    }
    // A journal this call creates is removed again if the projection
    // database then cannot be opened: a refused command changes nothing.
    let journal_is_new = access == Access::Create && !journal_path.try_exists().unwrap_or(true);
    let journal = SqliteJournal::open(&journal_path, opts.clone()).await?;
    match SqliteProjectionStore::open(&projection_path, opts).await {
        Ok(store) => Ok((journal, store)),
        Err(e) => {
            journal.close().await;
            if journal_is_new {
                remove_new_database(&journal_path);
            }
            Err(e)
        }
    }
}

#[cfg(feature = "sqlite")]
/// Removes a SQLite database this process just created, with the files
/// SQLite and the engine keep beside it. Best effort: the command fails
/// with its own error either way.
fn remove_new_database(path: &std::path::Path) {
    let mut files = vec![path.to_path_buf()];
    for suffix in ["-wal", "-shm", "-journal", "-turn"] {
        let mut beside = path.as_os_str().to_owned();
        beside.push(suffix);
        files.push(PathBuf::from(beside));
    }
    for f in files {
        if let Err(e) = std::fs::remove_file(&f)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(file = %f.display(), error = %e, "could not remove a database file this command created");
        }
    }
}

#[cfg(feature = "postgres")]
fn pg_connect_options(url: &str) -> Result<PgConnectOptions, Error> {
    <PgConnectOptions as std::str::FromStr>::from_str(url).map_err(|_| {
        Error::invalid("malformed postgres connection url (url not shown; it may contain a password)")
    })
}

#[cfg(feature = "postgres")]
/// Refuses a Postgres schema that does not hold the role's outbox tables
/// (every command but `migrate` works on an existing outbox, as on SQLite).
async fn pg_require(connect: &PgConnectOptions, schema: &str, meta: &str, what: &str) -> Result<(), Error> {
    let shown = |e: sqlx::Error| {
        outbox_postgres::storage_error(format_args!("connecting to postgres to check schema {schema}"), e)
    };
    let mut conn = sqlx::PgConnection::connect_with(connect).await.map_err(shown)?;
    let found: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(format!("{schema}.{meta}"))
        .fetch_one(&mut conn)
        .await
        .map_err(shown)?;
    let _ = conn.close().await;
    match found {
        Some(_) => Ok(()),
        None => Err(Error::NotFound(format!(
            "postgres schema {schema} holds no outbox {what} (run `outbox migrate` to create it)"
        ))),
    }
}

#[cfg(feature = "postgres")]
/// Opens both Postgres stores in `schema`. Equal URLs share one pool and
/// schema (`PgProjectionStore::sharing`); otherwise each store connects on
/// its own. Unless `access` is `Create`, a schema without the outbox tables is refused.
pub(crate) async fn open_postgres(
    journal_url: &str,
    projection_url: &str,
    schema: &str,
    access: Access,
    partitions: outbox_core::PartitionOptions,
) -> Result<(PgJournal, PgProjectionStore), Error> {
    outbox_postgres::validate_identifier(schema).map_err(|e| Error::Config(format!("--schema: {e}")))?;
    let mut options = PgOptions::default()
        .with_schema(schema)
        .with_migrate(access != Access::Existing);
    options.partitions = partitions;
    let jc = pg_connect_options(journal_url)?;
    let pc = pg_connect_options(projection_url)?;
    if access != Access::Create {
        pg_require(&jc, schema, "outbox_journal_meta", "journal").await?;
        pg_require(&pc, schema, "outbox_projection_meta", "projection tables").await?;
    }
    let journal = PgJournal::connect_with(jc, options.clone()).await?;
    let store = if journal_url == projection_url {
        PgProjectionStore::sharing(&journal).await
    } else {
        PgProjectionStore::connect_with(pc, options).await
    };
    match store {
        Ok(store) => Ok((journal, store)),
        Err(e) => {
            journal.close().await;
            Err(e)
        }
    }
}
