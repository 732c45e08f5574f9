#![doc = include_str!("../README.md")]

mod sink;
mod subject;

pub use sink::{NatsSink, NatsSinkOptions};
pub use subject::Subjects;

/// The `async-nats` client this crate is built on, re-exported so an
/// application connects with the same version.
pub use async_nats;
