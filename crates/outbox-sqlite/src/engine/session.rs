//! Statement-by-statement transactions on an engine thread: the caller's
//! side of a session (the thread's side is `Worker::session`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};

use outbox_core::{Error, Result};
use outbox_sql::{Arg, Conn, Row, Tx};
use rusqlite::Connection;
use tokio::sync::oneshot;

use super::values::{OwnedArg, engine_error, to_row};
use super::work::{Step, guarded};

/// The thread, held by one caller until it commits or drops the session.
///
/// Steps are pipelined where the caller does not need their answer: the
/// session's `BEGIN` is answered with its first step ([`Session::run`]), and
/// a step sent with [`Session::send`] is not answered at all, its error
/// reported by the next step that is. Each saves a round trip to the thread.
pub(crate) struct Session {
    steps: mpsc::Sender<Step>,
    path: PathBuf,
    /// The answer to the session's `BEGIN`, until a step waits for it.
    begun: Mutex<Option<oneshot::Receiver<Result<()>>>>,
    /// The first error of a step sent with [`Session::send`], until a step
    /// reports it.
    failed: Arc<Mutex<Option<Error>>>,
    /// Whether a step was sent with [`Session::send`] since the last step
    /// that was answered.
    unanswered: AtomicBool,
}

impl Session {
    pub(super) fn new(
        steps: mpsc::Sender<Step>,
        begun: oneshot::Receiver<Result<()>>,
        path: PathBuf,
    ) -> Session {
        Session {
            steps,
            path,
            begun: Mutex::new(Some(begun)),
            failed: Arc::default(),
            unanswered: AtomicBool::new(false),
        }
    }

    fn gone(&self) -> Error {
        Error::Storage {
            message: format!("the sqlite engine of {} stopped", self.path.display()),
            temporary: false,
            source: None,
        }
    }

    /// Waits for the answer to the session's `BEGIN` (once).
    async fn begun(&self) -> Result<()> {
        let begun = self.begun.lock().unwrap_or_else(PoisonError::into_inner).take();
        match begun {
            Some(begun) => begun.await.map_err(|_| self.gone())?,
            None => Ok(()),
        }
    }

    /// Sends `body` to run on the session's connection without waiting for
    /// it: its error, if any, is the next answered step's (every later step
    /// until then is skipped). If the session already ended (its `BEGIN`
    /// failed, or the engine stopped), the next answered step says why.
    pub(crate) fn send<F>(&self, body: F)
    where
        F: FnOnce(&Connection) -> Result<()> + Send + 'static,
    {
        let failed = Arc::clone(&self.failed);
        self.unanswered.store(true, Ordering::Relaxed);
        let _ = self.steps.send(Step::Run(Box::new(move |conn| {
            let mut failed = failed.lock().unwrap_or_else(PoisonError::into_inner);
            if failed.is_none()
                && let Err(e) = guarded(|| body(conn))
            {
                *failed = Some(e);
            }
        })));
    }

    /// Runs `body` on the session's connection and waits for its answer
    /// (the first step also for the `BEGIN`'s, and any step sent before it
    /// with [`Session::send`] for theirs).
    pub(crate) async fn run<T, F>(&self, body: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let failed = Arc::clone(&self.failed);
        self.unanswered.store(false, Ordering::Relaxed);
        let sent = self.steps.send(Step::Run(Box::new(move |conn| {
            let earlier = failed.lock().unwrap_or_else(PoisonError::into_inner).take();
            let _ = reply.send(match earlier {
                Some(e) => Err(e),
                None => guarded(|| body(conn)),
            });
        })));
        // A failed `BEGIN` ends the session (the step is never run, or not
        // even sent): its error is the answer.
        self.begun().await?;
        sent.map_err(|_| self.gone())?;
        rx.await.map_err(|_| self.gone())?
    }
}

impl Session {
    /// Runs `statements` in one step (one handoff, not one each) and
    /// returns the rows each changed, in order.
    pub(crate) async fn execute_all(&self, statements: &[outbox_sql::Statement<'_>]) -> Result<Vec<u64>> {
        let owned: Vec<(String, String, Vec<OwnedArg>)> = statements
            .iter()
            .map(|st| (st.what.to_owned(), st.sql.clone(), OwnedArg::from_args(&st.args)))
            .collect();
        self.run(move |conn| {
            owned
                .iter()
                .map(|(what, sql, args)| execute(conn, what, sql, args))
                .collect()
        })
        .await
    }
}

/// Runs one shared statement on `conn` (a session's or a read job's) and
/// returns the rows it changed.
pub(super) fn execute(conn: &Connection, what: &str, sql: &str, args: &[OwnedArg]) -> Result<u64> {
    statement(conn, what, sql)?
        .execute(rusqlite::params_from_iter(args))
        .map(|n| n as u64)
        .map_err(|e| engine_error(what, e))
}

/// Runs one shared query on `conn` and returns its rows.
pub(super) fn fetch(conn: &Connection, what: &str, sql: &str, args: &[OwnedArg]) -> Result<Vec<Row>> {
    statement(conn, what, sql)?
        .query_map(rusqlite::params_from_iter(args), to_row)
        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<Row>>>())
        .map_err(|e| engine_error(what, e))
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
        self.run(move |conn| execute(conn, &what, &sql, &args)).await
    }

    async fn fetch(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        let (what, sql, args) = (what.to_owned(), sql.to_owned(), OwnedArg::from_args(args));
        self.run(move |conn| fetch(conn, &what, &sql, &args)).await
    }
}

#[outbox_core::async_trait]
impl Tx for Session {
    async fn commit(self: Box<Self>, what: &str) -> Result<()> {
        if self.unanswered.load(Ordering::Relaxed) {
            // A step nobody waited for must not fail unseen.
            self.run(|_| Ok(())).await?;
        }
        self.begun().await?;
        let (reply, rx) = oneshot::channel();
        self.steps
            .send(Step::Commit(what.to_owned(), reply))
            .map_err(|_| self.gone())?;
        rx.await.map_err(|_| self.gone())?
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::SqliteOptions;
    use crate::engine::{Access, Engine};

    fn engine(dir: &Path, options: &SqliteOptions) -> (Engine, PathBuf) {
        let path = dir.join("session.db");
        crate::engine::new_wal_db(
            &path,
            "CREATE TABLE t (k INTEGER PRIMARY KEY, v INTEGER NOT NULL); INSERT INTO t VALUES (1, 0);",
        );
        (
            Engine::start(&path, options, Access::Write).expect("engine"),
            path,
        )
    }

    fn value(path: &Path) -> i64 {
        Connection::open(path)
            .and_then(|c| c.query_row("SELECT v FROM t WHERE k = 1", [], |r| r.get(0)))
            .expect("read")
    }

    fn bump(conn: &Connection) -> Result<()> {
        conn.execute("UPDATE t SET v = v + 1 WHERE k = 1", [])
            .map(drop)
            .map_err(|e| engine_error("bumping", e))
    }

    /// A `BEGIN` that meets another connection's lock past the busy
    /// timeout is the first step's error, temporary as a busy file is, and
    /// the session runs nothing.
    #[tokio::test]
    async fn a_failed_begin_is_the_first_steps_temporary_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = SqliteOptions::default().with_busy_timeout(Duration::from_millis(20));
        let (engine, path) = engine(dir.path(), &options);
        let other = Connection::open(&path).expect("other");
        other.execute_batch("BEGIN EXCLUSIVE").expect("lock");
        let session = engine.session("BEGIN IMMEDIATE").await.expect("queued");
        session.send(bump);
        let err = session.run(bump).await.expect_err("busy");
        assert!(err.is_temporary(), "{err}");
        assert!(err.to_string().contains("starting a transaction"), "{err}");
        drop(session);
        other.execute_batch("ROLLBACK").expect("unlock");
        assert_eq!(value(&path), 0, "nothing ran");
        let session = engine.session("BEGIN IMMEDIATE").await.expect("queued");
        session.run(bump).await.expect("the engine goes on");
        Tx::commit(Box::new(session), "committing").await.expect("commit");
        assert_eq!(value(&path), 1);
        engine.close().await;
    }

    /// A step sent without waiting that fails is the next answered step's
    /// error, the steps between are skipped, and a commit right after such
    /// a step reports it instead of committing.
    #[tokio::test]
    async fn an_unanswered_steps_error_is_reported_and_nothing_commits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (engine, path) = engine(dir.path(), &SqliteOptions::default());

        let session = engine.session("BEGIN IMMEDIATE").await.expect("queued");
        session.send(|_| Err(crate::errors::internal("the first step failed")));
        session.send(bump);
        let err = session.run(bump).await.expect_err("reported");
        assert!(err.to_string().contains("the first step failed"), "{err}");
        drop(session);
        assert_eq!(value(&path), 0, "rolled back");

        let session = engine.session("BEGIN IMMEDIATE").await.expect("queued");
        session.run(bump).await.expect("bump");
        session.send(|_| Err(crate::errors::internal("the last step failed")));
        let err = Tx::commit(Box::new(session), "committing")
            .await
            .expect_err("not committed");
        assert!(err.to_string().contains("the last step failed"), "{err}");
        assert_eq!(value(&path), 0, "nothing committed");

        let session = engine.session("BEGIN IMMEDIATE").await.expect("queued");
        session.send(bump);
        session.send(bump);
        Tx::commit(Box::new(session), "committing").await.expect("commit");
        assert_eq!(value(&path), 2, "both unanswered steps committed");
        engine.close().await;
    }
}
