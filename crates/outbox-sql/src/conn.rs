//! What an adapter implements so the shared statements can run on it.

use async_trait::async_trait;
use outbox_core::Result;

use crate::{Arg, Dialect, Row};

/// A connection (or a transaction on one) that runs statements.
///
/// # Contract
/// - `sql` is already rendered for the adapter's dialect; `args` bind to
///   its parameters 1, 2, ... in order.
/// - Errors are mapped by the adapter into [`outbox_core::Error`] (temporary
///   or permanent by the driver's error kind), with `what` as the context.
#[async_trait]
pub trait Conn: Send {
    /// Runs a statement and returns the rows it changed.
    async fn execute(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<u64>;

    /// Runs a query and returns its rows.
    async fn fetch(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>>;

    /// Runs a query that returns at most one row.
    async fn fetch_optional(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<Option<Row>> {
        Ok(self.fetch(what, sql, args).await?.into_iter().next())
    }
}

/// A write transaction.
#[async_trait]
pub trait Tx: Conn {
    /// Commits it (dropping it uncommitted rolls it back).
    async fn commit(self: Box<Self>, what: &str) -> Result<()>;
}

/// A database as the shared stores use it.
#[async_trait]
pub trait Database: Send + Sync {
    /// Its dialect.
    fn dialect(&self) -> &Dialect;

    /// Begins a write transaction (SQLite: `BEGIN IMMEDIATE` on the one
    /// writer connection; Postgres: `BEGIN`).
    async fn begin(&self) -> Result<Box<dyn Tx + '_>>;

    /// A connection for reads (outside any write transaction).
    async fn read(&self) -> Result<Box<dyn Conn + '_>>;

    /// A read-only transaction: every statement in it sees one snapshot.
    async fn snapshot(&self) -> Result<Box<dyn Tx + '_>>;
}
