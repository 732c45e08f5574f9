#![doc = include_str!("../README.md")]

mod consumers;
mod generations;
mod journal;
mod projection;
mod sinks;

pub use journal::MemoryJournal;
pub use projection::{MemoryProjectionStore, MemoryTx, Tables, digest_table};
