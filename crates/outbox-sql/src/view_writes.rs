//! Write-behind view documents for a single-writer database.
//!
//! On SQLite an apply transaction is the only writer of its file, so the
//! document writes of a whole batch can wait in memory and reach the
//! database as one statement for the puts and one for the deletes, right
//! before the checkpoints move in the same transaction. Reads see the
//! pending writes first, so an applier reads its own writes as before; scans
//! and clears write the pending ones out first. Where writers run
//! concurrently (Postgres, [`Dialect::locks_rows`]) nothing is deferred: a
//! document's row lock must be taken when it is written.

use std::collections::BTreeMap;

use outbox_core::{ProjectionName, Result};

use crate::{Arg, Conn, Dialect};

/// Documents written in a transaction and not yet sent to the database:
/// `Some(value)` to put, `None` to delete.
#[derive(Debug, Default)]
pub struct ViewWrites {
    pending: BTreeMap<(String, String, String), Option<String>>,
}

/// The most documents kept in memory before they are written out.
const MAX_PENDING: usize = 1024;

fn slot(projection: &ProjectionName, table: &str, key: &str) -> (String, String, String) {
    (projection.as_str().to_owned(), table.to_owned(), key.to_owned())
}

impl ViewWrites {
    /// A pending write of the document: `Some(Some(value))` a put,
    /// `Some(None)` a delete, `None` when there is none.
    pub fn get(&self, projection: &ProjectionName, table: &str, key: &str) -> Option<Option<&str>> {
        self.pending
            .get(&slot(projection, table, key))
            .map(|v| v.as_deref())
    }

    /// Records a put; whether enough is pending to write it out now.
    pub fn put(&mut self, projection: &ProjectionName, table: &str, key: &str, value: &str) -> bool {
        self.pending
            .insert(slot(projection, table, key), Some(value.to_owned()));
        self.pending.len() >= MAX_PENDING
    }

    /// Turns a pending put or delete into a delete; whether the document
    /// existed, or `None` when nothing was pending for it (the caller then
    /// deletes in the database).
    pub fn delete(&mut self, projection: &ProjectionName, table: &str, key: &str) -> Option<bool> {
        let entry = self.pending.get_mut(&slot(projection, table, key))?;
        Some(entry.take().is_some())
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Writes the pending documents out: one statement for every put, one
    /// for every delete. Empty afterwards, also on an error (the
    /// transaction is then rolled back by its owner).
    pub async fn flush(&mut self, dialect: &Dialect, tx: &mut (dyn Conn + '_)) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        let mut puts = Vec::new();
        let mut deletes = Vec::new();
        for ((p, t, k), v) in pending {
            match v {
                Some(v) => puts.push(serde_json::json!([p, t, k, v])),
                None => deletes.push(serde_json::json!([p, t, k])),
            }
        }
        if !puts.is_empty() {
            let rows = serde_json::Value::Array(puts).to_string();
            tx.execute(
                "writing view documents",
                &dialect.sql(
                    "INSERT INTO outbox_views (projection, tbl, key, value) \
                     SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3 FROM json_each($1) WHERE true \
                     ON CONFLICT (projection, tbl, key) DO UPDATE SET value = excluded.value",
                ),
                &[Arg::Text(&rows)],
            )
            .await?;
        }
        if !deletes.is_empty() {
            let rows = serde_json::Value::Array(deletes).to_string();
            tx.execute(
                "deleting view documents",
                &dialect.sql(
                    "DELETE FROM outbox_views WHERE (projection, tbl, key) IN \
                     (SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each($1))",
                ),
                &[Arg::Text(&rows)],
            )
            .await?;
        }
        Ok(())
    }
}
