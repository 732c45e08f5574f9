#![doc = include_str!("../README.md")]

mod append;
mod db;
mod group;
mod journal;
mod notifier;
mod options;
mod projection;
mod runs;
mod sql;
mod tx;
mod wake;

pub use journal::PgJournal;
pub use options::{PgOptions, validate_identifier};
pub use projection::{PgProjectionStore, digest_table};
pub use tx::PgTx;
pub use wake::PgWakeSource;

/// The adapter's types, with the core prelude (the port traits, so their
/// methods can be called on the stores): `use outbox_postgres::prelude::*;`.
pub mod prelude {
    pub use crate::{PgJournal, PgOptions, PgProjectionStore, PgTx};
    pub use outbox_core::prelude::*;
}

/// The driver, re-exported so appliers name the same `PgConnection`.
pub use sqlx;

/// Maps a driver error from your own statements (through the re-exported
/// [`sqlx`]) the way the adapter maps its own: a temporary
/// [`Error::Storage`](outbox_core::Error) for the kinds of the crate docs'
/// table ("Errors: temporary or permanent"), a permanent one otherwise; the
/// message is `context: driver message`.
pub fn storage_error(context: impl std::fmt::Display, e: sqlx::Error) -> outbox_core::Error {
    db::storage(context, e)
}

#[cfg(feature = "test-util")]
pub mod testing;

/// The hot statements, for plan checks (`EXPLAIN`) in the crate's tests
/// and benches: a test seam (`test-util`), not part of the API.
#[cfg(feature = "test-util")]
pub mod statements {
    #![allow(missing_docs)] // Each is the statement of the same name.
    use crate::{append, journal, tx};

    pub const ABANDON: &str = journal::ABANDON;
    pub const APPEND: &str = append::APPEND;
    pub const APPEND_CALL: &str = append::APPEND_CALL;
    pub const CLAIM: &str = journal::CLAIM;
    pub const CLAIM_PARTITIONED: &str = journal::CLAIM_PARTITIONED;
    pub const CLAIM_AND_LOAD_PARTITIONED: &str = journal::CLAIM_AND_LOAD_PARTITIONED;
    pub const COMPLETE: &str = journal::COMPLETE;
    pub const COMPLETE_ALL: &str = journal::COMPLETE_ALL;
    pub const DUE_STREAMS: &str = journal::DUE_STREAMS;
    pub const LEASE_CHECK: &str = journal::LEASE_CHECK;
    pub const LOCK_STREAMS: &str = journal::LOCK_STREAMS;
    pub const PARTITION_LEASE_CHECK: &str = journal::PARTITION_LEASE_CHECK;
    pub const APPLY_CAS: &str = tx::APPLY_CAS;
    pub const LOCK_CHECKPOINTS: &str = tx::LOCK_CHECKPOINTS;

    /// The shared lease acquisition, rendered for the journal's schema.
    pub fn acquire() -> String {
        outbox_sql::Dialect::postgres(crate::db::jnow!()).sql(outbox_sql::journal::ACQUIRE)
    }
}
