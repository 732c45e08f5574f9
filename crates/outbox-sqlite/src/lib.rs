#![doc = include_str!("../README.md")]

mod append_in;
mod clock;
mod db;
mod engine;
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

/// The driver, re-exported so hand-written projections use the same `sqlx`.
pub use sqlx;
