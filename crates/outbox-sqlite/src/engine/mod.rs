//! The SQLite engine: a thread per connection that runs whole
//! transactions on SQLite's C API (through `rusqlite`).
//!
//! Why: an async driver that runs each connection on its own thread pays a
//! thread handoff for every statement, `BEGIN`, `COMMIT` and result row, and
//! on a 2-core machine those handoffs, not SQLite, were most of an append's
//! and a claim's cost (ADR 0015). Here a caller sends one closure holding the
//! whole transaction body and awaits one reply.
//!
//! **Group commit.** Write jobs that queue up while the thread is busy run in
//! one `BEGIN IMMEDIATE` transaction and share its commit (and its fsync).
//! A job that fails (an append's version conflict) is undone alone and the
//! others commit, with savepoints only once a failed job has writes to
//! undo ([`group`]); every caller gets its own result, and none gets `Ok`
//! before the commit that makes its writes durable.
//!
//! **Durable and relaxed writes.** An append's commit waits for the disk
//! (at `synchronous = FULL`); a worker's lease bookkeeping does not
//! ([`Engine::write_relaxed`], ADR 0026).
//!
//! **Checkpoints** run on a thread of their own ([`checkpoint`]), not
//! inside the writer's commits.
//!
//! **Sessions** ([`Session`]) hand the thread to one caller for a
//! statement-by-statement transaction: the shared cold-path statements of
//! `outbox_sql` run that way. Dropping a session rolls it back.
//!
//! **Layout.** This file holds the callers' handle ([`Engine`], and the
//! file's pair of them, [`Engines`]) and the thread's loop (`Worker`). What both
//! sides hand each other is in `work.rs`, the opening of connections in
//! `connect.rs`; group.rs adds the group commit to `Worker`. Only group.rs
//! imports this file, and this file names nothing of group.rs, so no two
//! modules import each other (`cargo xtask tidy` checks it).

mod beside;
mod busy;
mod checkpoint;
mod connect;
mod group;
mod session;
mod turn;
mod values;
mod work;

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use outbox_core::{Error, Result};
use outbox_sql::{Arg, Conn, Database, Dialect, Row, Tx};
use rusqlite::Connection;
use tokio::sync::oneshot;

pub(crate) use connect::open_name;
use connect::{Access, connect};
pub(crate) use session::Session;
use values::OwnedArg;
pub(crate) use values::{engine_error, is_busy, to_row};
use work::{Commit, Job, Msg, Step, guarded};

use crate::errors::internal;
use crate::{SqliteOptions, Synchronous};

/// How many times `BEGIN IMMEDIATE` is retried after SQLite's own busy
/// timeout expired, before the jobs get a temporary error.
const BUSY_RETRIES: u32 = 3;

/// One connection and the thread that owns it.
#[derive(Debug)]
pub(crate) struct Engine {
    sender: Mutex<Option<mpsc::Sender<Msg>>>,
    stopped: Mutex<Option<oneshot::Receiver<()>>>,
    path: PathBuf,
    /// Opened on a read-only store ([`SqliteOptions::read_only`]): its
    /// connection is read-only and every write is refused before it is
    /// queued.
    read_only: bool,
}

impl Engine {
    /// Opens a connection and starts its thread.
    pub(crate) fn start(path: &Path, options: &SqliteOptions, access: Access) -> Result<Engine> {
        // A read-only store's writer is a reader that refuses writes.
        let read_only = options.read_only;
        let access = if read_only { Access::Read } else { access };
        let conn = connect(path, options, access)?;
        // A writer's jobs read after their commits on a read-only
        // connection of their own (see `group`).
        let loader = match access {
            Access::Write => Some(connect(path, options, Access::Read)?),
            Access::Read => None,
        };
        let checkpointer = match access {
            Access::Write => Some(checkpoint::Checkpointer::start(path, options, &conn)?),
            Access::Read => None,
        };
        let (busy_timeout, synchronous) = (options.busy_timeout, options.synchronous);
        let (sender, receiver) = mpsc::channel();
        let (stopped_tx, stopped) = oneshot::channel();
        let shown = path.display().to_string();
        let db = path.to_owned();
        thread::Builder::new()
            .name(match access {
                Access::Write => "outbox-sqlite-writer".into(),
                Access::Read => "outbox-sqlite-reader".into(),
            })
            .spawn(move || {
                busy::set_timeout(busy_timeout);
                if access == Access::Write {
                    turn::take_part(&db);
                }
                let worker = Worker {
                    conn,
                    loader,
                    path: shown,
                    full: synchronous == Synchronous::Full,
                    relaxed: Cell::new(false),
                };
                match checkpointer {
                    Some(c) => c.serve(|| worker.serve(receiver)),
                    None => worker.serve(receiver),
                }
                let _ = stopped_tx.send(());
            })
            .map_err(|e| internal(format!("starting the sqlite engine thread: {e}")))?;
        Ok(Engine {
            sender: Mutex::new(Some(sender)),
            stopped: Mutex::new(Some(stopped)),
            path: path.to_owned(),
            read_only,
        })
    }

    /// Refuses a write on a read-only store, before it is queued.
    fn writable(&self, what: &str) -> Result<()> {
        if self.read_only {
            return Err(crate::files::read_only_error(&self.path, what));
        }
        Ok(())
    }

    fn send(&self, msg: Msg) -> Result<()> {
        let sender = self.sender.lock().unwrap_or_else(|p| p.into_inner());
        match sender.as_ref() {
            Some(s) => s.send(msg).map_err(|_| self.gone()),
            None => Err(Error::Storage {
                message: format!("the store on {} is closed", self.path.display()),
                temporary: false,
                source: None,
            }),
        }
    }

    fn gone(&self) -> Error {
        internal(format!("the sqlite engine of {} stopped", self.path.display()))
    }

    /// Runs `body` in a write transaction, possibly shared with other
    /// callers' bodies (group commit); `Ok` only once it committed. The
    /// body may run twice, the first run's writes undone (see [`group`]):
    /// it must do nothing but SQL on the connection and its own locals.
    pub(crate) async fn write<T, F>(&self, body: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> Result<T> + Send + 'static,
    {
        self.submit(body, Commit::Durable)?
            .await
            .map_err(|_| self.gone())?
    }

    /// [`Engine::write`] for lease bookkeeping that the projection
    /// checkpoints make safe to redo (claims, completions, releases): on a
    /// `synchronous = FULL` database its commit does not wait for the disk
    /// when no durable write shares it. It survives the process dying; a
    /// power loss can undo it, with every commit after it, before the next
    /// durable commit or checkpoint (ADR 0026).
    pub(crate) async fn write_relaxed<T, F>(&self, body: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> Result<T> + Send + 'static,
    {
        self.submit(body, Commit::Relaxed)?
            .await
            .map_err(|_| self.gone())?
    }

    /// [`Engine::write_relaxed`] whose result `after` completes once the
    /// job's group has committed, outside the write transaction, on the
    /// writer thread's read-only connection (reads that need not hold the
    /// write lock; see [`group`]). `after` only adds to a whole result: if
    /// it panics, the committed result comes back as it left it.
    pub(crate) async fn write_relaxed_then<T, F, A>(&self, body: F, after: A) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> Result<T> + Send + 'static,
        A: FnOnce(&Connection, &mut T) + Send + 'static,
    {
        self.writable("writing")?;
        let (reply, rx) = oneshot::channel();
        let job = Job::new(body, reply, Commit::Relaxed).then(Box::new(after));
        self.send(Msg::Write(Box::new(job)))?;
        rx.await.map_err(|_| self.gone())?
    }

    /// Queues `body` as a write job; its result comes on the receiver.
    fn submit<T, F>(&self, body: F, commit: Commit) -> Result<oneshot::Receiver<Result<T>>>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> Result<T> + Send + 'static,
    {
        self.writable("writing")?;
        let (reply, rx) = oneshot::channel();
        self.send(Msg::Write(Box::new(Job::new(body, reply, commit))))?;
        Ok(rx)
    }

    /// Runs `body` on the connection outside any transaction (each
    /// statement is its own read).
    pub(crate) async fn read<T, F>(&self, body: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        self.send(Msg::Read(Box::new(move |conn| {
            let _ = reply.send(guarded(|| body(conn)));
        })))?;
        rx.await.map_err(|_| self.gone())?
    }

    /// Takes the thread for a statement-by-statement transaction opened
    /// with `begin` (`""` for none). Does not wait for the `begin`: its
    /// result comes back with the session's first step (one round trip for
    /// both), so a failed `begin` is that step's error.
    pub(crate) async fn session(&self, begin: &'static str) -> Result<Session> {
        if begin.contains("IMMEDIATE") {
            self.writable("starting a write transaction")?;
        }
        let (steps_tx, steps) = mpsc::channel();
        let (ready, begun) = oneshot::channel();
        self.send(Msg::Session { begin, steps, ready })?;
        Ok(Session::new(steps_tx, begun, self.path.clone()))
    }

    /// Stops taking work, lets the queued work finish and closes the
    /// connection; later calls fail.
    pub(crate) async fn close(&self) {
        drop(self.sender.lock().unwrap_or_else(|p| p.into_inner()).take());
        let stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(stopped) = stopped {
            let _ = stopped.await;
        }
    }
}

/// A database file's two engines: the single writer and a reader. The
/// journal and the projection database each open one.
#[derive(Debug)]
pub(crate) struct Engines {
    pub(crate) writer: Engine,
    pub(crate) reader: Engine,
    dialect: Arc<Dialect>,
}

impl Engines {
    pub(crate) fn start(path: &Path, options: &SqliteOptions, dialect: Arc<Dialect>) -> Result<Engines> {
        Ok(Engines {
            writer: Engine::start(path, options, Access::Write)?,
            reader: Engine::start(path, options, Access::Read)?,
            dialect,
        })
    }

    /// The shared statements' dialect, with this file's clock.
    pub(crate) fn dialect(&self) -> &Arc<Dialect> {
        &self.dialect
    }

    /// Closes the reader first: the last connection to a file checkpoints
    /// its WAL into it and removes it when it closes, which a read-only
    /// connection cannot do, so a writable one must be last.
    pub(crate) async fn close(&self) {
        self.reader.close().await;
        self.writer.close().await;
    }
}

/// [`Database::read`] on an engine: each statement sent as one read job.
struct Reads<'e>(&'e Engine);

#[outbox_core::async_trait]
impl Conn for Reads<'_> {
    async fn execute(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        let (what, sql, args) = (what.to_owned(), sql.to_owned(), OwnedArg::from_args(args));
        self.0
            .read(move |conn| session::execute(conn, &what, &sql, &args))
            .await
    }

    async fn fetch(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        let (what, sql, args) = (what.to_owned(), sql.to_owned(), OwnedArg::from_args(args));
        self.0
            .read(move |conn| session::fetch(conn, &what, &sql, &args))
            .await
    }
}

#[outbox_core::async_trait]
impl Database for Engines {
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

/// How long an engine thread keeps looking for its next message before it
/// sleeps. A caller that appends one event at a time sends its next job a
/// few tens of µs after its reply: a thread that went to sleep in between
/// must be woken by the kernel, which on a small virtual machine costs
/// about as much as the append's own statements. Looking for 100 µs
/// (yielding the core between looks) raised serial single-event appends
/// by about 8% (ratio to the raw loop 0.66 → 0.71 over ten alternating
/// rounds on 2 cores) and changed nothing measurable in drains or lag; an
/// idle engine spends at most this much CPU per message before it sleeps.
const LOOK_BEFORE_SLEEP: Duration = Duration::from_micros(100);

/// The next message for an engine thread: looks for
/// [`LOOK_BEFORE_SLEEP`], then waits. `None` once every sender is gone.
fn next_message(receiver: &mpsc::Receiver<Msg>) -> Option<Msg> {
    let until = Instant::now() + LOOK_BEFORE_SLEEP;
    loop {
        match receiver.try_recv() {
            Ok(m) => return Some(m),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) if Instant::now() < until => thread::yield_now(),
            Err(mpsc::TryRecvError::Empty) => return receiver.recv().ok(),
        }
    }
}

/// The thread's side.
struct Worker {
    /// A writer's read-only connection for the reads its jobs make after
    /// their commits: their pages do not crowd the writer's cache. Declared
    /// (so dropped) before `conn`: see [`Engines::close`].
    loader: Option<Connection>,
    conn: Connection,
    path: String,
    /// Whether the database is `synchronous = FULL`: only then do relaxed
    /// writes commit at a lower level.
    full: bool,
    /// Whether the connection is at `NORMAL` for relaxed writes now.
    relaxed: Cell<bool>,
}

impl Worker {
    fn serve(self, receiver: mpsc::Receiver<Msg>) {
        let mut next = None;
        loop {
            let msg = match next.take() {
                Some(m) => m,
                None => match next_message(&receiver) {
                    Some(m) => m,
                    None => return,
                },
            };
            match msg {
                Msg::Read(job) => job(&self.conn),
                Msg::Session { begin, steps, ready } => self.session(begin, &steps, ready),
                Msg::Write(job) => self.group(job, &receiver, &mut next),
            }
        }
    }

    /// Runs one of the engine's own fixed statements (`BEGIN IMMEDIATE`,
    /// `SAVEPOINT`, `COMMIT`, ...), prepared once and cached.
    fn exec(&self, sql: &str) -> Result<()> {
        self.conn
            .prepare_cached(sql)
            .and_then(|mut st| st.execute([]))
            .map(drop)
            .map_err(|e| engine_error(format_args!("{sql} on {}", self.path), e))
    }

    /// Sets the connection's `synchronous` level for the next transaction:
    /// `NORMAL` for a `relaxed` one on a `FULL` database, the database's
    /// own level otherwise. Only between transactions (SQLite refuses it
    /// inside one), and only when it changes.
    fn sync_for(&self, relaxed: bool) -> Result<()> {
        let relaxed = relaxed && self.full;
        if self.relaxed.get() != relaxed {
            self.exec(if relaxed {
                "PRAGMA synchronous = NORMAL"
            } else {
                "PRAGMA synchronous = FULL"
            })?;
            self.relaxed.set(relaxed);
        }
        Ok(())
    }

    /// `BEGIN IMMEDIATE`, retried a few times when SQLite's busy timeout
    /// expires first (another connection holds the write lock); a writer
    /// lets writers of other processes that wait for the lock go first
    /// ([`turn`]).
    fn begin(&self, begin: &str) -> Result<()> {
        // A checkpoint the checkpointer could not finish (`checkpoint`).
        checkpoint::finish_on_writer(&self.conn);
        // Writers in other processes that wait for the write lock go first.
        turn::let_waiters_in();
        let begun = self.try_begin(begin);
        turn::waited();
        begun
    }

    /// The tries of [`Worker::begin`].
    fn try_begin(&self, begin: &str) -> Result<()> {
        let mut attempt = 0;
        loop {
            match self.conn.prepare_cached(begin).and_then(|mut st| st.execute([])) {
                Ok(_) => return Ok(()),
                Err(e) if values::is_busy(&e) && attempt < BUSY_RETRIES => {
                    attempt += 1;
                    tracing::debug!(path = %self.path, attempt, "sqlite write lock busy; retrying");
                    thread::sleep(Duration::from_millis(10 * u64::from(attempt)));
                }
                Err(e) => {
                    return Err(engine_error(
                        format_args!("starting a transaction on {}", self.path),
                        e,
                    ));
                }
            }
        }
    }

    /// Leaves no transaction open (after a failure SQLite may already have
    /// rolled back by itself).
    fn rollback(&self) {
        if !self.conn.is_autocommit()
            && let Err(e) = self.conn.execute_batch("ROLLBACK")
        {
            tracing::warn!(path = %self.path, error = %e, "rolling back failed");
        }
    }

    /// Serves one session until it commits or its owner drops it.
    fn session(&self, begin: &'static str, steps: &mpsc::Receiver<Step>, ready: oneshot::Sender<Result<()>>) {
        // Sessions (the cold-path statements) are always durable.
        let durable = self.sync_for(false);
        if let Err(e) = durable.and_then(|()| match begin {
            "" => Ok(()),
            begin => self.begin(begin),
        }) {
            let _ = ready.send(Err(e));
            return;
        }
        if ready.send(Ok(())).is_err() {
            // The caller is gone before it started.
            self.rollback();
            return;
        }
        while let Ok(step) = steps.recv() {
            match step {
                Step::Run(job) => job(&self.conn),
                Step::Commit(what, reply) => {
                    let out = if self.conn.is_autocommit() {
                        Err(internal(format!(
                            "{what}: the transaction on {} had already ended",
                            self.path
                        )))
                    } else {
                        self.exec("COMMIT")
                    };
                    self.rollback();
                    let _ = reply.send(out);
                    return;
                }
            }
        }
        // Dropped without a commit.
        self.rollback();
    }
}

/// A new WAL-mode database at `path` made by `schema` (the engine's tests).
#[cfg(test)]
fn new_wal_db(path: &Path, schema: &str) {
    Connection::open(path)
        .and_then(|c| {
            c.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
            c.execute_batch(schema)
        })
        .expect("create");
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rusqlite::StatementStatus;

    use super::*;

    /// Frames in the WAL of `path` (each commit writes its dirty pages).
    fn wal_frames(path: &Path) -> i64 {
        Connection::open(path)
            .and_then(|c| c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1)))
            .expect("checkpoint")
    }

    /// The plan of a statement on an engine connection, one line per step.
    fn plan(conn: &Connection, sql: &str) -> String {
        let mut st = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("explain");
        let params = rusqlite::params_from_iter(std::iter::repeat_n(10, st.parameter_count()));
        let rows = st
            .query_map(params, |r| r.get::<_, String>(3))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .expect("plan");
        rows.join("; ")
    }

    /// A reader engine connection to a new, migrated journal in `dir`.
    async fn new_journal_reader(dir: &Path) -> Connection {
        let path = dir.join("journal.db");
        let journal = crate::SqliteJournal::open(&path, SqliteOptions::default())
            .await
            .expect("journal");
        journal.close().await;
        connect(&path, &SqliteOptions::default(), Access::Read).expect("connect")
    }

    /// With plans that ignore bound values, the partial indexes of failed
    /// and dead rows still serve `list` by status (its status is a literal).
    #[tokio::test]
    async fn listing_failed_or_dead_rows_walks_their_partial_index() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = new_journal_reader(dir.path()).await;
        let dialect = outbox_sql::Dialect::sqlite(crate::clock::now_ms!());
        for (status, index) in [
            (outbox_core::OutboxStatus::Failed, "outbox_failed"),
            (outbox_core::OutboxStatus::Dead, "outbox_dead"),
        ] {
            let sql = dialect.sql(&outbox_sql::journal::list_statement(Some(status)));
            let plan = plan(&conn, &sql);
            assert!(
                plan.contains(index) && !plan.contains("TEMP B-TREE"),
                "listing {status:?} rows: {plan}"
            );
        }
    }

    /// The queue summary (the heartbeat's gauges, every few seconds) counts
    /// without sorting the backlog: the failed and dead rows by their
    /// partial indexes, the total and the processing rows in one b-tree walk.
    #[tokio::test]
    async fn the_queue_summary_counts_without_sorting_the_backlog() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = new_journal_reader(dir.path()).await;
        let plan = plan(&conn, outbox_sql::journal::SUMMARY_COUNTS);
        for index in ["outbox_failed", "outbox_dead"] {
            assert!(plan.contains(index), "{index} unused: {plan}");
        }
        let walks = plan.split("; ").filter(|step| *step == "SCAN outbox").count();
        assert_eq!(walks, 1, "one walk for the total and the processing rows: {plan}");
        assert!(!plan.contains("TEMP B-TREE"), "{plan}");
    }

    /// A write job sent while a group runs joins that group's transaction:
    /// one commit (one frame for the one page both jobs change), not two.
    #[tokio::test]
    async fn a_write_queued_while_a_group_runs_shares_its_commit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("wal.db");
        new_wal_db(
            &path,
            "CREATE TABLE t (k INTEGER PRIMARY KEY, v INTEGER NOT NULL); INSERT INTO t VALUES (1, 0);
             PRAGMA wal_checkpoint(TRUNCATE);",
        );
        let engine =
            Arc::new(Engine::start(&path, &SqliteOptions::default(), Access::Write).expect("engine"));
        let bump = |conn: &Connection| {
            conn.execute("UPDATE t SET v = v + 1", [])
                .map(drop)
                .map_err(|e| engine_error("bumping", e))
        };
        let sender = Arc::clone(&engine);
        let second = engine
            .write(move |conn| {
                bump(conn)?;
                sender.submit(bump, Commit::Durable)
            })
            .await
            .expect("first job");
        second.await.expect("reply").expect("second job");
        // Counted while the engine holds the file open (the last connection
        // to close checkpoints the WAL away).
        let frames = wal_frames(&path);
        engine.close().await;
        let v: i64 = Connection::open(&path)
            .and_then(|c| c.query_row("SELECT v FROM t", [], |r| r.get(0)))
            .expect("read");
        assert_eq!(v, 2, "both jobs committed");
        assert_eq!(frames, 1, "the two jobs shared one commit");
    }

    /// A group's per-job savepoints journal every page they change; by
    /// default that journal spills to a temp file past 64 KiB, and in the
    /// lag benchmark those writes cost the writer thread more than its WAL
    /// frames: the writer keeps it in memory. A reader keeps the default,
    /// or the queue summary's sort of a million-row backlog grew the worker
    /// by 50 MiB.
    #[test]
    fn only_the_writer_keeps_temp_storage_in_memory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plain.db");
        Connection::open(&path)
            .and_then(|c| c.execute_batch("CREATE TABLE t (x INTEGER PRIMARY KEY);"))
            .expect("create");
        for (access, want) in [(Access::Write, 2), (Access::Read, 0)] {
            let conn = connect(&path, &SqliteOptions::default(), access).expect("connect");
            let store: i64 = conn
                .query_row("PRAGMA temp_store", [], |r| r.get(0))
                .expect("temp_store");
            assert_eq!(store, want, "{access:?} connection");
        }
    }

    /// SQLite 3.51 plans `LIMIT ?` with the bound value, so without the
    /// query planner stability guarantee every new binding expires a cached
    /// statement and the next step parses and plans it again (a quarter of
    /// the writer thread's time in the drain benchmark).
    #[test]
    fn cached_statements_with_a_bound_limit_are_not_prepared_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plain.db");
        Connection::open(&path)
            .and_then(|c| {
                c.execute_batch("CREATE TABLE t (x INTEGER PRIMARY KEY); INSERT INTO t VALUES (1), (2), (3);")
            })
            .expect("create");
        let conn = connect(&path, &SqliteOptions::default(), Access::Write).expect("connect");
        for limit in 1..=3 {
            let mut st = conn
                .prepare_cached("SELECT x FROM t WHERE x > ?1 ORDER BY x LIMIT ?2")
                .expect("prepare");
            let got: Vec<i64> = st
                .query_map(rusqlite::params![0, limit], |r| r.get(0))
                .and_then(|rows| rows.collect())
                .expect("query");
            assert_eq!(got.len(), limit as usize);
            assert_eq!(
                st.get_status(StatementStatus::RePrepare),
                0,
                "the statement was prepared again for LIMIT {limit}"
            );
        }
    }
}
