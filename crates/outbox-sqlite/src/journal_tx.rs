//! The application's own transaction on the journal file
//! ([`SqliteJournal::transaction`](crate::SqliteJournal::transaction)): its
//! writes and an append commit or roll back together, on the journal's one
//! writer connection.

use outbox_core::{AppendOptions, AppendRequest, Appended, Partitioning, Result};
use rusqlite::Connection;

use crate::append::{append_body, append_inputs};
use crate::engine::engine_error;

/// A write transaction on the journal file, open while the body given to
/// [`SqliteJournal::transaction`](crate::SqliteJournal::transaction) runs.
///
/// The application writes its own tables through [`JournalTx::conn`] and
/// appends events with [`JournalTx::append`]; everything commits together
/// when the body returns `Ok`, and nothing does when it returns `Err` or
/// panics.
pub struct JournalTx<'c> {
    conn: &'c Connection,
    partitioning: &'c Partitioning,
}

impl<'c> JournalTx<'c> {
    pub(crate) fn new(conn: &'c Connection, partitioning: &'c Partitioning) -> Self {
        JournalTx { conn, partitioning }
    }

    /// The journal's writer connection, inside the transaction: run the
    /// application's own statements on it. It must not commit, roll back
    /// or change the journal's own tables.
    pub fn conn(&self) -> &'c Connection {
        self.conn
    }

    /// Appends `batch` inside this transaction: the same contract as
    /// [`EventJournal::append`](outbox_core::EventJournal::append), and the
    /// events and their outbox rows commit only with the transaction. On an
    /// error (a version conflict, invalid input) the batch has written
    /// nothing (it runs in a savepoint) and the transaction is still usable.
    /// Seqs and global positions are final once the transaction commits.
    pub fn append(&self, batch: &[AppendRequest], options: AppendOptions) -> Result<Vec<Appended>> {
        options.validate(batch)?;
        let (hashes, partitions) = append_inputs(batch, self.partitioning);
        let savepoint = |sql: &str| {
            self.conn
                .execute_batch(sql)
                .map_err(|e| engine_error("appending in the caller's transaction", e))
        };
        savepoint("SAVEPOINT outbox_append")?;
        match append_body(self.conn, batch, &hashes, &partitions, options.enqueues()) {
            Ok(appended) => {
                savepoint("RELEASE outbox_append")?;
                Ok(appended)
            }
            Err(e) => {
                savepoint("ROLLBACK TO outbox_append; RELEASE outbox_append")?;
                Err(e)
            }
        }
    }
}

impl std::fmt::Debug for JournalTx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JournalTx")
    }
}
