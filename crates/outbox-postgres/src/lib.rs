#![doc = include_str!("../README.md")]

mod db;
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

/// The hot statements, for plan checks (`EXPLAIN`) in tests and benches.
#[doc(hidden)]
pub mod statements {
    pub use crate::journal::{
        APPEND_CALL, CLAIM, CLAIM_PARTITIONED, COMPLETE, COMPLETE_ALL, DUE_STREAMS, LEASE_CHECK,
        LOCK_STREAMS, PARTITION_LEASE_CHECK,
    };
    pub use crate::tx::{APPLY_CAS, LOCK_CHECKPOINTS};

    /// The shared lease acquisition, rendered for the journal's schema.
    pub fn acquire() -> String {
        outbox_sql::Dialect::postgres(crate::db::jnow!()).sql(outbox_sql::journal::ACQUIRE)
    }
}
