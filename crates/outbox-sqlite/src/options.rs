//! How a store opens its database file.

use std::time::Duration;

use outbox_core::{Error, Result};

/// SQLite's `synchronous` setting (the database always runs in WAL mode).
///
/// What each level promises once a write call has returned `Ok`:
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Synchronous {
    /// `FULL` (the default): the WAL is fsynced at every commit that carries
    /// data. A committed append, failure record or apply survives a process
    /// crash *and* a power loss or OS crash. The workers' lease bookkeeping
    /// (claims, completions, releases) commits without waiting for the disk
    /// unless it shares a commit with an append: it survives a process
    /// crash, and a power loss can undo only bookkeeping, which the
    /// projection checkpoints make safe to redo (rows come back and are
    /// skipped as already applied).
    #[default]
    Full,
    /// `NORMAL`: the WAL is fsynced only at checkpoints. A process crash loses
    /// nothing; a power loss or OS crash can roll back the last few commits
    /// (the database stays consistent). Across two files this can leave a
    /// projection checkpoint behind a deleted outbox row: the watermark gap
    /// check and catch-up replay repair it, but the outbox row is no longer
    /// there to drive it. About 4x faster commits.
    Normal,
    /// `OFF`: no fsync at all. A process crash loses nothing, but a power loss
    /// or OS crash can lose commits and may corrupt the database. For tests
    /// and throwaway data only.
    Off,
}

/// How [`SqliteJournal`](crate::SqliteJournal) and
/// [`SqliteProjectionStore`](crate::SqliteProjectionStore) open their file.
///
/// ```
/// use std::time::Duration;
/// use outbox_sqlite::{SqliteOptions, Synchronous};
///
/// let options = SqliteOptions::default()
///     .with_synchronous(Synchronous::Normal)
///     .with_busy_timeout(Duration::from_secs(10))
///     .with_create_dirs(true);
/// assert_eq!(options.busy_timeout, Duration::from_secs(10));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqliteOptions {
    /// Durability of commits. Default [`Synchronous::Full`].
    pub synchronous: Synchronous,
    /// How long a connection waits for another process's write lock before
    /// giving up (and the store retrying a few times, then returning a
    /// temporary error). Default 5 s.
    pub busy_timeout: Duration,
    /// Create missing parent directories (mode 0700). Default `false`: a
    /// missing directory is an error naming the path.
    pub create_dirs: bool,
    /// Create the database file when it does not exist. Default `true`;
    /// maintenance tools turn it off so a mistyped path is an error, not a
    /// new empty database.
    pub create_if_missing: bool,
    /// Apply pending migrations when opening. Default `true`; inspection
    /// tools turn it off, so a database of an older schema is refused
    /// ([`Error::SchemaTooOld`]) instead of
    /// upgraded behind its application's back.
    pub migrate: bool,
    /// The journal's partitioning (ADR 0022): the count asked for, the
    /// partitioner, and whether to repartition a journal stored with
    /// another. Ignored by the projection store. Default: the journal's
    /// stored count (16 for a new journal) by CRC-32, never repartitioning.
    pub partitions: outbox_core::PartitionOptions,
    /// Open the file read-only (`SQLITE_OPEN_READONLY`): inspection with
    /// read access only. Nothing is created, migrated or written (no WAL
    /// switch, no checkpoint, no partitioning stored): a schema behind this
    /// build is [`Error::SchemaTooOld`],
    /// and every write the store is asked for fails with one line saying the
    /// store is read-only. When no `-wal` file is beside the database (no
    /// process has it open), it is read as immutable, so no `-wal` or `-shm`
    /// file is created either: a process that starts writing it later is not
    /// seen until the store is opened again. Default `false`.
    pub read_only: bool,
    /// The clock the store's statements read (see `crate::clock`): SQLite's
    /// own unless a test opens the store with the test clock.
    pub(crate) clock: crate::clock::Clock,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
            create_dirs: false,
            create_if_missing: true,
            migrate: true,
            partitions: outbox_core::PartitionOptions::default(),
            read_only: false,
            clock: crate::clock::Clock::System,
        }
    }
}

impl SqliteOptions {
    /// Asks for `count` partitions (see [`SqliteOptions::partitions`]).
    pub fn with_partitions(mut self, count: u16) -> Self {
        self.partitions.count = Some(count);
        self
    }

    /// Sets the partitioner (an application keying by tenant, say).
    pub fn with_partitioner(mut self, partitioner: std::sync::Arc<dyn outbox_core::Partitioner>) -> Self {
        self.partitions.partitioner = partitioner;
        self
    }

    /// Repartitions a journal stored with another partitioning instead of
    /// refusing it (only while no partition lease is held).
    pub fn with_repartition(mut self, repartition: bool) -> Self {
        self.partitions.repartition = repartition;
        self
    }

    /// Test support (feature `test-util`): the store's clock is SQLite's
    /// plus an offset stored in the database, which
    /// [`SqliteJournal::advance_clock_for_tests`](crate::SqliteJournal::advance_clock_for_tests)
    /// and [`SqliteProjectionStore::advance_clock_for_tests`](crate::SqliteProjectionStore::advance_clock_for_tests)
    /// move for every instance and process on the file that opened it with
    /// the test clock. A store opened without it never reads the offset.
    #[cfg(feature = "test-util")]
    pub fn with_test_clock(mut self) -> Self {
        self.clock = crate::clock::Clock::Test;
        self
    }

    /// Sets [`SqliteOptions::migrate`].
    pub fn with_migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Sets [`SqliteOptions::read_only`].
    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Sets [`SqliteOptions::synchronous`].
    pub fn with_synchronous(mut self, synchronous: Synchronous) -> Self {
        self.synchronous = synchronous;
        self
    }

    /// Sets [`SqliteOptions::busy_timeout`].
    pub fn with_busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Sets [`SqliteOptions::create_if_missing`].
    pub fn with_create_if_missing(mut self, create: bool) -> Self {
        self.create_if_missing = create;
        self
    }

    /// Sets [`SqliteOptions::create_dirs`].
    pub fn with_create_dirs(mut self, create: bool) -> Self {
        self.create_dirs = create;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.busy_timeout < Duration::from_millis(1) || self.busy_timeout > Duration::from_secs(3600) {
            return Err(Error::Config(format!(
                "sqlite busy timeout {:?} is outside 1ms..=1h",
                self.busy_timeout
            )));
        }
        Ok(())
    }
}

/// The largest WAL file kept once writing goes quiet: a WAL that grew
/// while a reader held it (a long backup, a burst) does not keep its
/// largest size on disk until the last connection closes. An engine's
/// writer never truncates the file itself (`journal_size_limit = -1`); its
/// checkpointer does, once the writer is quiet (`engine::checkpoint`).
pub(crate) const WAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;
