#![doc = include_str!("../README.md")]

mod append;
mod clock;
mod engine;
mod errors;
mod files;
mod journal;
mod journal_tx;
mod migrate;
mod options;
mod projection;
mod runs;
mod tx;
mod wake;

pub use journal::SqliteJournal;
pub use journal_tx::JournalTx;
pub use options::{SqliteOptions, Synchronous};
pub use projection::{SqliteProjectionStore, digest_table, validate_identifier};
pub use tx::SqliteTx;
pub use wake::SqliteWakeSource;

/// The adapter's types, with the core prelude (the port traits, so their
/// methods can be called on the stores): `use outbox_sqlite::prelude::*;`.
pub mod prelude {
    pub use crate::{JournalTx, SqliteJournal, SqliteOptions, SqliteProjectionStore, SqliteTx, Synchronous};
    pub use outbox_core::prelude::*;
}

/// The driver, re-exported so hand-written projections
/// ([`SqliteTx::run`]) and an application's own statements
/// ([`SqliteJournal::transaction`]) use the same `rusqlite`.
pub use rusqlite;
