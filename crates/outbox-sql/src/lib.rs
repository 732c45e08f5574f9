#![doc = include_str!("../README.md")]

mod columns;
mod conn;
pub mod consumers;
mod dialect;
pub mod generations;
pub mod journal;
mod journal_store;
pub mod partitions;
mod plumbing;
pub mod projection;
mod projection_store;
pub mod runs;
pub mod sinks;
pub mod skipped;
mod transaction;
mod value;
mod view_writes;

pub use conn::{Conn, Database, Tx};
pub use dialect::{Dialect, LockedDocuments};
pub use journal_store::SqlJournal;
pub use plumbing::{Role, digest_row, digest_rows};
pub use projection_store::SqlProjections;
pub use transaction::SqlTx;
pub use value::{Arg, Row, Value, decode_json, json_text, json_text_unless_empty};
pub use view_writes::{DigestWrites, DocumentWrites, Statement, ViewWrites};
