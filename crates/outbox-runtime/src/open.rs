//! Opening both stores from URLs: `memory:`, `sqlite://path` or
//! `postgres://...`, the one place a backend is chosen from a scheme (the
//! `outbox` command opens its databases through it too).
//!
//! Each backend is a feature of this crate (`memory`, `sqlite`,
//! `postgres`), off by default: a URL whose backend is not built in is
//! refused with one line naming the feature.
//!
//! The stores' types differ per backend, so [`open_stores`] hands them to
//! a [`WithStores`], whose one method is generic over them: the code an
//! application writes once for every backend (build the [`Outbox`](crate::Outbox),
//! append, run the worker).
//!
//! ```no_run
//! use outbox_core::LeaseAdmin;
//! use outbox_runtime::open::{OpenOptions, WithStores, open_stores};
//! use outbox_runtime::{JournalBackend, Outbox, ProjectionBackend};
//!
//! struct Report;
//!
//! impl WithStores for Report {
//!     type Output = outbox_core::Result<u64>;
//!     async fn with<J, P>(self, journal: J, store: P) -> Self::Output
//!     where
//!         J: JournalBackend + LeaseAdmin + Clone,
//!         P: ProjectionBackend + Clone,
//!     {
//!         let outbox = Outbox::builder(journal, store).build().await?;
//!         Ok(outbox_core::OutboxInspector::summary(outbox.journal()).await?.pending)
//!     }
//! }
//!
//! # async fn run() -> Result<(), outbox_core::Error> {
//! let options = OpenOptions::from_env()?.with_create(true);
//! let pending = open_stores("sqlite://journal.db", "sqlite://projections.db", &options, Report).await??;
//! println!("{pending} rows pending");
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::path::Path;

use outbox_core::{Error, LeaseAdmin, PartitionOptions, Result};

use crate::{JournalBackend, ProjectionBackend};

/// The Postgres schema both stores use unless told otherwise.
pub const DEFAULT_SCHEMA: &str = "outbox";

/// The environment variable [`OpenOptions::from_env`] reads the schema from.
pub const SCHEMA_VAR: &str = "OUTBOX_PG_SCHEMA";

pub use outbox_core::Location;

/// [`Location::parse`]: the name said "open" but nothing is opened.
#[deprecated(since = "0.1.1", note = "use `Location::parse` (outbox_core::Location)")]
pub fn open_url(url: &str) -> Result<Location> {
    Location::parse(url)
}

/// How [`open_stores`] opens the stores.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct OpenOptions {
    /// The Postgres schema of both stores. Default [`DEFAULT_SCHEMA`].
    pub schema: String,
    /// Create what is missing: a SQLite file, a Postgres schema. Default
    /// `false`: a missing database is [`Error::NotFound`], so a mistyped
    /// path does not quietly start an empty journal.
    pub create: bool,
    /// Apply pending migrations. Default `true`. Without it a store of an
    /// older schema is [`Error::SchemaTooOld`] and nothing is changed
    /// (inspection tools).
    pub migrate: bool,
    /// The journal's partitioning.
    pub partitions: PartitionOptions,
    /// Open SQLite files read-only (inspection with read access only:
    /// nothing is created, migrated or written; see
    /// `outbox_sqlite::SqliteOptions::read_only`). Default `false`. Ignored
    /// by Postgres, whose role's grants say what it may write.
    pub read_only: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            schema: DEFAULT_SCHEMA.to_owned(),
            create: false,
            migrate: true,
            partitions: PartitionOptions::default(),
            read_only: false,
        }
    }
}

impl OpenOptions {
    /// The defaults, with the schema from `OUTBOX_PG_SCHEMA` when set (as
    /// the `outbox` command reads it).
    pub fn from_env() -> Result<Self> {
        let mut o = OpenOptions::default();
        match std::env::var(SCHEMA_VAR) {
            Ok(s) if !s.is_empty() => o.schema = s,
            Ok(_) | Err(std::env::VarError::NotPresent) => {}
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(Error::Config(format!("{SCHEMA_VAR} is not valid UTF-8")));
            }
        }
        Ok(o)
    }

    /// Sets [`OpenOptions::schema`].
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Sets [`OpenOptions::create`].
    pub fn with_create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Sets [`OpenOptions::migrate`].
    pub fn with_migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Sets [`OpenOptions::read_only`].
    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Sets [`OpenOptions::partitions`].
    pub fn with_partitions(mut self, partitions: PartitionOptions) -> Self {
        self.partitions = partitions;
        self
    }
}

/// What to do with the stores [`open_stores`] opened: one method, generic
/// over the backend, written once.
pub trait WithStores {
    /// What [`WithStores::with`] returns.
    type Output;

    /// Runs on the opened stores (clones; [`open_stores`] closes them once
    /// this returns).
    fn with<J, P>(self, journal: J, store: P) -> impl Future<Output = Self::Output> + Send
    where
        J: JournalBackend + LeaseAdmin + Clone,
        P: ProjectionBackend + Clone;
}

/// Opens the journal at `journal_url` and the projection store at
/// `projection_url` (the same backend; on Postgres equal URLs share one
/// pool and schema), runs `with` on them and closes them.
///
/// Refused, changing nothing: URLs of two backends, a backend this build
/// lacks (the error names the feature), and the refusals of each adapter's
/// opening (a missing database without [`OpenOptions::create`], a schema
/// newer than this build, an invalid schema name). A SQLite journal file
/// this call created is removed again when the projection store then
/// fails to open.
pub async fn open_stores<W: WithStores>(
    journal_url: &str,
    projection_url: &str,
    options: &OpenOptions,
    with: W,
) -> Result<W::Output> {
    match (Location::parse(journal_url)?, Location::parse(projection_url)?) {
        (Location::Memory, Location::Memory) => memory(with).await,
        (Location::Sqlite(j), Location::Sqlite(p)) => sqlite(&j, &p, options, with).await,
        (Location::Postgres(j), Location::Postgres(p)) => postgres(&j, &p, options, with).await,
        _ => Err(Error::invalid(
            "the journal and the projection store must use the same backend (both memory, sqlite or postgres)",
        )),
    }
}

#[cfg(feature = "memory")]
async fn memory<W: WithStores>(with: W) -> Result<W::Output> {
    Ok(with
        .with(
            outbox_memory::MemoryJournal::new(),
            outbox_memory::MemoryProjectionStore::new(),
        )
        .await)
}

#[cfg(not(feature = "memory"))]
async fn memory<W: WithStores>(_: W) -> Result<W::Output> {
    Err(unsupported("memory"))
}

#[cfg(feature = "sqlite")]
async fn sqlite<W: WithStores>(
    journal: &Path,
    projections: &Path,
    options: &OpenOptions,
    with: W,
) -> Result<W::Output> {
    let (journal, store) = open_sqlite(journal, projections, options).await?;
    let out = with.with(journal.clone(), store.clone()).await;
    journal.close().await;
    store.close().await;
    Ok(out)
}

#[cfg(not(feature = "sqlite"))]
async fn sqlite<W: WithStores>(_: &Path, _: &Path, _: &OpenOptions, _: W) -> Result<W::Output> {
    Err(unsupported("sqlite"))
}

#[cfg(feature = "postgres")]
async fn postgres<W: WithStores>(
    journal: &str,
    projections: &str,
    options: &OpenOptions,
    with: W,
) -> Result<W::Output> {
    let (journal, store) = open_postgres(journal, projections, options).await?;
    let out = with.with(journal.clone(), store.clone()).await;
    store.close().await;
    journal.close().await;
    Ok(out)
}

#[cfg(not(feature = "postgres"))]
async fn postgres<W: WithStores>(_: &str, _: &str, _: &OpenOptions, _: W) -> Result<W::Output> {
    Err(unsupported("postgres"))
}

#[cfg(not(all(feature = "memory", feature = "sqlite", feature = "postgres")))]
fn unsupported(backend: &str) -> Error {
    Error::Config(format!(
        "this build has no {backend} support (enable the `{backend}` feature of outbox-runtime, \
         or of outbox-cli for an operator binary)"
    ))
}

/// Opens both SQLite stores (two files, never the same one) as `options`
/// say.
#[cfg(feature = "sqlite")]
pub async fn open_sqlite(
    journal_path: &Path,
    projection_path: &Path,
    options: &OpenOptions,
) -> Result<(outbox_sqlite::SqliteJournal, outbox_sqlite::SqliteProjectionStore)> {
    use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};
    let mut opts = SqliteOptions::default()
        .with_create_if_missing(options.create)
        .with_migrate(options.migrate)
        .with_read_only(options.read_only);
    opts.partitions = options.partitions.clone();
    if journal_path == projection_path {
        return Err(Error::invalid(format_args!(
            "the journal and the projection database must be different files (both are {})",
            journal_path.display()
        )));
    }
    // A journal this call creates is removed again if the projection
    // database then cannot be opened: a refused call changes nothing.
    let journal_is_new = options.create && !journal_path.try_exists().unwrap_or(true);
    let journal = SqliteJournal::open(journal_path, opts.clone()).await?;
    match SqliteProjectionStore::open(projection_path, opts).await {
        Ok(store) => Ok((journal, store)),
        Err(e) => {
            journal.close().await;
            if journal_is_new {
                remove_new_database(journal_path);
            }
            Err(e)
        }
    }
}

/// Removes a SQLite database this process just created, with the files
/// SQLite and the engine keep beside it. Best effort: the call fails with
/// its own error either way.
#[cfg(feature = "sqlite")]
fn remove_new_database(path: &Path) {
    let mut files = vec![path.to_path_buf()];
    for suffix in ["-wal", "-shm", "-journal", "-turn"] {
        let mut beside = path.as_os_str().to_owned();
        beside.push(suffix);
        files.push(std::path::PathBuf::from(beside));
    }
    for f in files {
        if let Err(e) = std::fs::remove_file(&f)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(file = %f.display(), error = %e, "could not remove a database file this call created");
        }
    }
}

/// Opens both Postgres stores in `options.schema`. Equal URLs share one
/// pool and schema; otherwise each store connects on its own. Without
/// [`OpenOptions::create`], a schema without the outbox tables is
/// [`Error::NotFound`].
#[cfg(feature = "postgres")]
pub async fn open_postgres(
    journal_url: &str,
    projection_url: &str,
    options: &OpenOptions,
) -> Result<(outbox_postgres::PgJournal, outbox_postgres::PgProjectionStore)> {
    use outbox_postgres::{PgJournal, PgOptions, PgProjectionStore};
    let schema = options.schema.as_str();
    outbox_postgres::validate_identifier(schema).map_err(|e| Error::Config(format!("schema: {e}")))?;
    let mut pg = PgOptions::default()
        .with_schema(schema)
        .with_migrate(options.migrate);
    pg.partitions = options.partitions.clone();
    let jc = pg_connect_options(journal_url)?;
    let pc = pg_connect_options(projection_url)?;
    if !options.create {
        pg_require(&jc, schema, "outbox_journal_meta", "journal").await?;
        pg_require(&pc, schema, "outbox_projection_meta", "projection tables").await?;
    }
    let journal = PgJournal::connect_with(jc, pg.clone()).await?;
    let store = if journal_url == projection_url {
        PgProjectionStore::sharing(&journal).await
    } else {
        PgProjectionStore::connect_with(pc, pg).await
    };
    match store {
        Ok(store) => Ok((journal, store)),
        Err(e) => {
            journal.close().await;
            Err(e)
        }
    }
}

#[cfg(feature = "postgres")]
fn pg_connect_options(url: &str) -> Result<outbox_postgres::sqlx::postgres::PgConnectOptions> {
    url.parse().map_err(|_| {
        Error::invalid("malformed postgres connection url (url not shown; it may contain a password)")
    })
}

/// Refuses a Postgres schema that does not hold the role's outbox tables.
#[cfg(feature = "postgres")]
async fn pg_require(
    connect: &outbox_postgres::sqlx::postgres::PgConnectOptions,
    schema: &str,
    meta: &str,
    what: &str,
) -> Result<()> {
    use outbox_postgres::sqlx::{self, Connection as _};
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
            "postgres schema {schema} holds no outbox {what} (create it with `outbox migrate`, or open with \
             OpenOptions::create)"
        ))),
    }
}
