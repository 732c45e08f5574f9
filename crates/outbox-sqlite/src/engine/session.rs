//! Statement-by-statement transactions on an engine thread: the caller's
//! side of a session (the thread's side is `Worker::session`).

use std::path::PathBuf;
use std::sync::mpsc;

use outbox_core::{Error, Result};
use outbox_sql::{Arg, Conn, Row, Tx};
use rusqlite::Connection;
use tokio::sync::oneshot;

use super::values::{OwnedArg, engine_error, to_row};
use super::work::{Step, guarded};

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
                let _ = reply.send(guarded(|| body(conn)));
            })))
            .map_err(|_| self.gone())?;
        rx.await.map_err(|_| self.gone())?
    }
}

pub(super) fn statement<'c>(
    conn: &'c Connection,
    what: &str,
    sql: &str,
) -> Result<rusqlite::CachedStatement<'c>> {
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
