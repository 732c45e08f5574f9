//! Statement-by-statement transactions on an engine thread, and the
//! journal's [`Database`] for the shared cold-path statements.

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

use outbox_core::{Error, Result};
use outbox_sql::{Arg, Conn, Database, Dialect, Row, Tx};
use rusqlite::Connection;
use tokio::sync::oneshot;

use super::values::{OwnedArg, engine_error, to_row};
use super::{Access, Engine, Step};
use crate::SqliteOptions;

/// The thread, held by one caller until it commits or drops the session.
pub(crate) struct Session {
    steps: mpsc::Sender<Step>,
    path: PathBuf,
}

impl Session {
    pub(super) fn new(steps: mpsc::Sender<Step>, path: PathBuf) -> Session {
        Session { steps, path }
    }

    fn gone(&self) -> Error {
        Error::Storage {
            message: format!("the sqlite engine of {} stopped", self.path.display()),
            temporary: false,
            source: None,
        }
    }

    /// Runs `body` on the session's connection.
    pub(crate) async fn run<T, F>(&self, body: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        self.steps
            .send(Step::Run(Box::new(move |conn| {
                let _ = reply.send(super::guarded(|| body(conn)));
            })))
            .map_err(|_| self.gone())?;
        rx.await.map_err(|_| self.gone())?
    }
}

fn statement<'c>(conn: &'c Connection, what: &str, sql: &str) -> Result<rusqlite::CachedStatement<'c>> {
    conn.prepare_cached(sql).map_err(|e| engine_error(what, e))
}

#[outbox_core::async_trait]
impl Conn for Session {
    async fn execute(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        let (what, sql, args) = (what.to_owned(), sql.to_owned(), OwnedArg::from_args(args));
        self.run(move |conn| {
            let n = statement(conn, &what, &sql)?
                .execute(rusqlite::params_from_iter(args))
                .map_err(|e| engine_error(&what, e))?;
            Ok(n as u64)
        })
        .await
    }

    async fn fetch(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        let (what, sql, args) = (what.to_owned(), sql.to_owned(), OwnedArg::from_args(args));
        self.run(move |conn| {
            let mut st = statement(conn, &what, &sql)?;
            let rows = st
                .query_map(rusqlite::params_from_iter(args), to_row)
                .map_err(|e| engine_error(&what, e))?;
            rows.collect::<rusqlite::Result<Vec<Row>>>()
                .map_err(|e| engine_error(&what, e))
        })
        .await
    }
}

#[outbox_core::async_trait]
impl Tx for Session {
    async fn commit(self: Box<Self>, what: &str) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.steps
            .send(Step::Commit(what.to_owned(), reply))
            .map_err(|_| self.gone())?;
        rx.await.map_err(|_| self.gone())?
    }
}

/// [`Database::read`] on an engine: each statement sent as one read job.
struct Reads<'e>(&'e Engine);

#[outbox_core::async_trait]
impl Conn for Reads<'_> {
    async fn execute(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        let (what, sql, args) = (what.to_owned(), sql.to_owned(), OwnedArg::from_args(args));
        self.0
            .read(move |conn| {
                let n = statement(conn, &what, &sql)?
                    .execute(rusqlite::params_from_iter(args))
                    .map_err(|e| engine_error(&what, e))?;
                Ok(n as u64)
            })
            .await
    }

    async fn fetch(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        let (what, sql, args) = (what.to_owned(), sql.to_owned(), OwnedArg::from_args(args));
        self.0
            .read(move |conn| {
                let mut st = statement(conn, &what, &sql)?;
                let rows = st
                    .query_map(rusqlite::params_from_iter(args), to_row)
                    .map_err(|e| engine_error(&what, e))?;
                rows.collect::<rusqlite::Result<Vec<Row>>>()
                    .map_err(|e| engine_error(&what, e))
            })
            .await
    }
}

/// The journal file's two engines: the single writer and a reader.
#[derive(Debug)]
pub(crate) struct JournalEngine {
    pub(crate) writer: Engine,
    pub(crate) reader: Engine,
    dialect: Arc<Dialect>,
    /// The shared lease statements, rendered once for this file.
    pub(crate) leases: LeaseSql,
}

/// [`outbox_sql::journal`]'s lease statements in this dialect.
#[derive(Debug)]
pub(crate) struct LeaseSql {
    pub(crate) acquire: Arc<str>,
    pub(crate) renew: Arc<str>,
    /// The renewal of a partitioned claim's lease (its partition's).
    pub(crate) renew_partition: Arc<str>,
    pub(crate) release: Arc<str>,
}

impl JournalEngine {
    pub(crate) fn start(
        path: &Path,
        options: &SqliteOptions,
        dialect: Arc<Dialect>,
    ) -> Result<JournalEngine> {
        let leases = LeaseSql {
            acquire: dialect.sql(outbox_sql::journal::ACQUIRE).into(),
            renew: dialect.sql(outbox_sql::journal::RENEW).into(),
            renew_partition: dialect.sql(outbox_sql::partitions::PARTITION_RENEW).into(),
            release: dialect.sql(outbox_sql::journal::RELEASE).into(),
        };
        Ok(JournalEngine {
            writer: Engine::start(path, options, Access::Write)?,
            reader: Engine::start(path, options, Access::Read)?,
            dialect,
            leases,
        })
    }

    pub(crate) async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
    }
}

#[outbox_core::async_trait]
impl Database for JournalEngine {
    fn dialect(&self) -> &Dialect {
        &self.dialect
    }

    async fn begin(&self) -> Result<Box<dyn Tx + '_>> {
        Ok(Box::new(self.writer.session("BEGIN IMMEDIATE").await?))
    }

    /// Each statement its own read job on the reader thread: one round
    /// trip per statement, none to set a session up (a read connection
    /// runs each statement on its own, outside a transaction, anyway).
    async fn read(&self) -> Result<Box<dyn Conn + '_>> {
        Ok(Box::new(Reads(&self.reader)))
    }

    async fn snapshot(&self) -> Result<Box<dyn Tx + '_>> {
        Ok(Box::new(self.reader.session("BEGIN").await?))
    }
}
