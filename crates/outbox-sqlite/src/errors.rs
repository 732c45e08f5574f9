//! SQLite's result codes, which of them are temporary, and the adapter's
//! own errors. A leaf: the engine (`engine/`) and the migrations
//! (`migrate.rs`) both use it without importing each other.

use outbox_core::Error;

pub(crate) const SQLITE_BUSY: i32 = 5;
pub(crate) const SQLITE_LOCKED: i32 = 6;
pub(crate) const SQLITE_IOERR: i32 = 10;
pub(crate) const SQLITE_FULL: i32 = 13;
pub(crate) const SQLITE_CANTOPEN: i32 = 14;
pub(crate) const SQLITE_PROTOCOL: i32 = 15;

/// Whether a SQLite primary result code means "retry later" (the table in
/// the crate docs, "Errors: temporary or permanent"): another process holds
/// the lock past the busy timeout (`BUSY`, `LOCKED`), the file could not be
/// read or written or opened right now (`IOERR`, `CANTOPEN`: a file whose
/// permissions or mount are briefly wrong), the disk is full (`FULL`), or a
/// WAL lock race (`PROTOCOL`). Used by the engine's `engine_error`.
pub(crate) fn temporary_code(code: i32) -> bool {
    matches!(
        code & 0xff,
        SQLITE_BUSY | SQLITE_LOCKED | SQLITE_IOERR | SQLITE_FULL | SQLITE_CANTOPEN | SQLITE_PROTOCOL
    )
}

/// A permanent storage error of the adapter's own making (no driver error
/// behind it).
pub(crate) fn internal(message: impl Into<String>) -> Error {
    Error::Storage {
        message: message.into(),
        temporary: false,
        source: None,
    }
}
