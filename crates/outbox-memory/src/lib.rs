#![doc = include_str!("../README.md")]

mod consumers;
mod generations;
mod journal;
mod projection;
mod sinks;

pub use journal::MemoryJournal;
pub use projection::{MemoryProjectionStore, MemoryTx, Tables, digest_table};

/// The adapter's types, with the core prelude (the port traits, so their
/// methods can be called on the stores): `use outbox_memory::prelude::*;`.
pub mod prelude {
    pub use crate::{MemoryJournal, MemoryProjectionStore, MemoryTx};
    pub use outbox_core::prelude::*;
}
