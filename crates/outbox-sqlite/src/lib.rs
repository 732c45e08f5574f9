#![doc = include_str!("../README.md")]

mod db;
mod journal;
mod options;
#[cfg(feature = "oracle")]
pub mod oracle;
mod projection;
mod runs;

pub use journal::SqliteJournal;
pub use options::{SqliteOptions, Synchronous};
pub use projection::{SqliteProjectionStore, digest_table, validate_identifier};

/// The driver, re-exported so appliers name the same `SqliteConnection`.
pub use sqlx;
