//! The error type shared by every port.

use std::fmt;

use crate::{Seq, StreamId};

/// A boxed error from user code or from an adapter's driver.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a port can report.
///
/// Variants are semantic: adapters map their driver errors into them and keep
/// the driver error as the `source`. Ask [`Error::is_temporary`] whether
/// retrying the same call can help; the runtime's retry loop asks nothing else.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something the contract rejects (empty batch,
    /// oversized payload, malformed identifier, ...). Nothing was changed.
    #[error("invalid input: {0}")]
    InvalidInput(String),

    /// The configuration is inconsistent (for example a worker flag without the
    /// outbox flag). Raised at start-up, before anything runs.
    #[error("configuration error: {0}")]
    Config(String),

    /// An append's expected version did not match the stream's current version.
    #[error("version conflict on stream {stream}: expected {expected}, found {actual}")]
    Conflict {
        /// The stream appended to.
        stream: StreamId,
        /// The version the caller expected.
        expected: String,
        /// The stream's current version (its last seq, 0 when empty).
        actual: u64,
    },

    /// The addressed entity does not exist.
    #[error("not found: {0}")]
    NotFound(String),

    /// The store does not have the optional capability the call needs
    /// (sinks, runs, generations: ADR 0035). Nothing was changed; use an
    /// adapter that has it.
    #[error("not supported by this store: {0}")]
    Unsupported(String),

    /// The operation is not allowed in the entity's current state (for
    /// example requeueing a row that is not dead).
    #[error("{0}")]
    InvalidState(String),

    /// The caller no longer holds the stream lease it presented (it expired,
    /// was released, or was taken over with a higher epoch).
    #[error("lease lost on stream {stream} (owner {owner}, epoch {epoch})")]
    LeaseLost {
        /// The stream.
        stream: StreamId,
        /// The owner named by the stale lease.
        owner: String,
        /// The epoch of the stale lease.
        epoch: u64,
    },

    /// The event type is not registered.
    #[error("unknown event type `{0}`")]
    UnknownEventType(String),

    /// A stored event failed validation when read back (hash mismatch,
    /// undecodable column). Retrying reads the same bytes, so this is permanent.
    #[error("corrupt event {stream}/{seq}: {reason}")]
    Corrupt {
        /// The stream.
        stream: StreamId,
        /// The seq.
        seq: Seq,
        /// What was wrong.
        reason: String,
    },

    /// A projection's applier failed; the whole apply transaction was rolled back.
    #[error("projection `{projection}` failed on {stream}/{seq}: {source}")]
    Apply {
        /// The projection whose applier failed.
        projection: String,
        /// The stream.
        stream: StreamId,
        /// The seq of the event that failed.
        seq: Seq,
        /// The applier's error.
        #[source]
        source: BoxError,
    },

    /// The database's schema is newer than this build understands. Nothing was
    /// changed; upgrade the binary.
    #[error("schema version {found} of {database} is newer than the newest this build knows ({supported})")]
    SchemaTooNew {
        /// Which database (journal, projection).
        database: String,
        /// The version found.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },

    /// The database's schema is older than this build and the store was
    /// opened without migrating (an operator's inspection must not upgrade
    /// an application's database behind its back). Nothing was changed; run
    /// `migrate` with this build, or use a build of the database's version.
    #[error("{}", schema_too_old(.database, *.found, *.supported))]
    SchemaTooOld {
        /// Which database.
        database: String,
        /// The version found (0: not migrated at all).
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },

    /// The backing store failed.
    #[error("storage error: {message}")]
    Storage {
        /// What failed, without secrets.
        message: String,
        /// Whether retrying can help (connection drop, lock timeout, ...).
        temporary: bool,
        /// The driver's error.
        #[source]
        source: Option<BoxError>,
    },
}

/// [`Error::SchemaTooOld`]'s message. Version 0 is a database with none of
/// the outbox's tables: most often a mistyped path (another application's
/// file), so the message says so before it offers `migrate`.
fn schema_too_old(database: &str, found: i64, supported: i64) -> String {
    if found == 0 {
        format!(
            "{database} holds no outbox tables (schema version 0): check the path; `migrate` creates them (version {supported}), beside any tables of its own"
        )
    } else {
        format!(
            "schema version {found} of {database} is older than this build's ({supported}); run `migrate` to upgrade it"
        )
    }
}
impl Error {
    /// Whether retrying the same call, unchanged, can succeed.
    ///
    /// Storage errors say so themselves; applier failures are treated as
    /// temporary (the applier may depend on something that recovers, and a
    /// deployed fix turns a failing event into a succeeding one). A lost lease
    /// is *not*: repeating the call with the same stale lease fails forever;
    /// the caller must acquire a new lease. Everything else is a property of
    /// the input and will fail the same way again.
    pub fn is_temporary(&self) -> bool {
        match self {
            Error::Storage { temporary, .. } => *temporary,
            Error::Apply { .. } => true,
            _ => false,
        }
    }

    /// A permanent storage error with a message and a source.
    pub fn storage(message: impl fmt::Display, source: impl Into<BoxError>) -> Self {
        Error::Storage {
            message: message.to_string(),
            temporary: false,
            source: Some(source.into()),
        }
    }

    /// A temporary storage error (retrying may help) with a message and a source.
    pub fn temporary(message: impl fmt::Display, source: impl Into<BoxError>) -> Self {
        Error::Storage {
            message: message.to_string(),
            temporary: true,
            source: Some(source.into()),
        }
    }

    /// An [`Error::InvalidInput`].
    pub fn invalid(message: impl fmt::Display) -> Self {
        Error::InvalidInput(message.to_string())
    }
}
