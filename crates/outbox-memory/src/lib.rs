#![doc = include_str!("../README.md")]

mod journal;
mod generations;
mod projection;

pub use journal::MemoryJournal;
pub use projection::{MemoryProjectionStore, MemoryTx, Tables, digest_table};
