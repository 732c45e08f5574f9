#![doc = include_str!("../README.md")]

mod append_in;
mod clock;
mod db;
mod engine;
mod errors;
mod journal;
mod options;
mod projection;
mod runs;
mod sql;
mod statements;
mod tx;
mod wake;

pub use journal::SqliteJournal;
pub use options::{SqliteOptions, Synchronous};
pub use projection::{SqliteProjectionStore, digest_table, validate_identifier};
pub use tx::SqliteTx;
pub use wake::SqliteWakeSource;

/// The adapter's types, with the core prelude (the port traits, so their
/// methods can be called on the stores): `use outbox_sqlite::prelude::*;`.
pub mod prelude {
    pub use crate::{SqliteJournal, SqliteOptions, SqliteProjectionStore, SqliteTx, Synchronous};
    pub use outbox_core::prelude::*;
}

/// The driver, re-exported so hand-written projections use the same `sqlx`.
pub use sqlx;
