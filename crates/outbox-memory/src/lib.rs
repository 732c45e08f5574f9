#![doc = include_str!("../README.md")]

mod journal;
#[cfg(feature = "oracle")]
pub mod oracle;
mod projection;

pub use journal::MemoryJournal;
pub use projection::{MemoryProjectionStore, MemoryTx, Tables, digest_table};
