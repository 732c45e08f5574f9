//! Backends: the one place a URL scheme picks SQLite or Postgres, and what
//! the commands need of each.

use std::path::PathBuf;
use std::sync::Arc;

use outbox_core::{Error, LeaseAdmin, WakeSource};
#[cfg(feature = "postgres")]
use outbox_postgres::{PgJournal, PgProjectionStore};
use outbox_runtime::open::OpenOptions;
use outbox_runtime::{JournalBackend, ProjectionBackend};
#[cfg(feature = "sqlite")]
use outbox_sqlite::{SqliteJournal, SqliteProjectionStore};

/// The journal side of a backend, as the commands use it.
pub(crate) trait CliJournal: JournalBackend + LeaseAdmin + Clone {
    /// Where it is, for `migrate` (a path, or a Postgres schema).
    fn describe(&self) -> String;
    /// Cross-process wake-ups for the worker, when the backend has them.
    fn wake(&self) -> Option<Arc<dyn WakeSource>>;
    /// Closes its connections.
    fn shut(&self) -> impl Future<Output = ()> + Send;
    /// The write-ahead log file beside it, where it has one (SQLite's
    /// `-wal`): a read-only monitor that found none reads the file as
    /// immutable, and warns once one appears (a process writes it now).
    #[cfg_attr(not(feature = "serve"), allow(dead_code))]
    fn wal_file(&self) -> Option<PathBuf> {
        None
    }
    /// Re-keys the sinks' feed after a logical restore (`outbox sinks
    /// rekey`): the events re-keyed, or `None` where the feed's keys are
    /// global positions, which need none.
    fn rekey_feed(&self) -> impl Future<Output = Result<Option<u64>, Error>> + Send {
        async { Ok(None) }
    }
}

/// The projection side of a backend, as the commands use it.
pub(crate) trait CliStore: ProjectionBackend + Clone {
    /// The backend's name ("sqlite", "postgres").
    const BACKEND: &'static str;
    /// The application's hand-written projections for this backend.
    fn hand_written(app: &crate::App) -> Vec<Arc<dyn outbox_core::Projection<Self::Tx>>>;
    /// Where it is, for `migrate`.
    fn describe(&self) -> String;
    /// Wakes `outbox wait` when another process applies (none: it reads
    /// the checkpoints again on a backoff).
    fn progress(&self) -> Option<Arc<dyn WakeSource>> {
        None
    }
    /// Closes its connections.
    fn shut(&self) -> impl Future<Output = ()> + Send;
}

#[cfg(feature = "sqlite")]
impl CliJournal for SqliteJournal {
    fn describe(&self) -> String {
        self.path().display().to_string()
    }
    fn wal_file(&self) -> Option<PathBuf> {
        let mut name = self.path().as_os_str().to_owned();
        name.push("-wal");
        Some(PathBuf::from(name))
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
    const BACKEND: &'static str = "sqlite";
    fn hand_written(app: &crate::App) -> Vec<Arc<dyn outbox_core::Projection<Self::Tx>>> {
        app.sqlite_projections.clone()
    }
    fn describe(&self) -> String {
        self.path().display().to_string()
    }
    fn progress(&self) -> Option<Arc<dyn WakeSource>> {
        Some(self.wake_source())
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
    const BACKEND: &'static str = "postgres";
    fn hand_written(app: &crate::App) -> Vec<Arc<dyn outbox_core::Projection<Self::Tx>>> {
        app.postgres_projections.clone()
    }
    fn describe(&self) -> String {
        format!("postgres schema {}", self.schema())
    }
    async fn shut(&self) {
        self.close().await;
    }
}

pub use outbox_runtime::open::Location;

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
    /// Existing SQLite databases at this build's schema, opened read-only:
    /// the commands that only read, on `?mode=ro` URLs or files this user
    /// cannot write. Nothing is created, migrated or written.
    ReadOnly,
}

impl Access {
    /// The runtime's opening options for this access.
    fn options(self, partitions: outbox_core::PartitionOptions) -> OpenOptions {
        OpenOptions::default()
            .with_create(self == Access::Create)
            .with_migrate(matches!(self, Access::Create | Access::Migrate))
            .with_read_only(self == Access::ReadOnly)
            .with_partitions(partitions)
    }
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
    outbox_runtime::open::open_sqlite(&journal_path, &projection_path, &access.options(partitions)).await
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
    outbox_runtime::open::open_postgres(
        journal_url,
        projection_url,
        &access.options(partitions).with_schema(schema),
    )
    .await
}
