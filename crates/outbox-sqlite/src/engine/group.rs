//! Group commit: the write jobs queued on an engine thread run in one
//! transaction and share its commit.
//!
//! **Savepoints only when a job needs undoing.** Jobs run one after
//! another with no savepoint of their own. A job that fails having changed
//! nothing (an append's version conflict is found before it writes) leaves
//! nothing to undo, and the others go on. A job that fails after it
//! changed rows (the connection's change counter moved) cannot be undone
//! alone: the transaction is rolled back, the jobs that had succeeded run
//! again from the start, and the rest of the group runs with a savepoint
//! around each job, as the slow path always did. Savepoints are not free:
//! each journals a copy of every page its job changes, and with a
//! savepoint per job that copying, not the jobs' own statements, was the
//! largest cost of a group of small appends beyond its WAL writes.
//!
//! **Bookkeeping commits do not wait for the disk.** A job is durable (an
//! append, a failure's record: its commit waits for the WAL's fsync when
//! the database is `synchronous = FULL`) or relaxed (the leases, claims
//! and completions of the workers, which the projection checkpoints make
//! safe to redo: ADR 0026). A group whose jobs are all relaxed commits at
//! `NORMAL`: it survives the process dying, and a power loss can undo it
//! only together with every commit after it, none of them durable. The
//! level is set before `BEGIN` (SQLite refuses to change it inside a
//! transaction), from the jobs queued then; a relaxed group takes no
//! durable job later (it waits for the next group), a durable group takes
//! any job.
//!
//! A job's body may therefore run twice (`FnMut`); its first run's writes
//! are then gone, and only the last run's result is replied. Bodies hold
//! only SQL and their own locals, so a second run is a clean one.
//!
//! **Reads that need no write lock come after the commit.** A job may
//! carry a step that completes its result by reading (a sweep's claim reads
//! its runs' events). It runs once the group has committed and the other
//! jobs have their replies, on the same thread (no handoff) but on the
//! writer's read-only connection: writers of other processes do not wait
//! for it, and the pages it reads do not crowd the writer's page cache.
//! (Read on the writer's own connection, a large backlog's event pages
//! took its cache and the worker's memory grew from 16 to 26 MiB at 10^6
//! pending rows.) This process's next group does wait for it, so a step
//! reads only what its caller would otherwise read at once. The job has
//! committed before its step runs: a panic in the step leaves the result
//! as the step left it, never an error.

use std::sync::mpsc;

use outbox_core::Result;

use super::Worker;
use super::work::{Failure, Msg, WriteJob};
use crate::errors::internal;

/// The most write jobs that share one transaction.
const MAX_GROUP: usize = 256;

/// The jobs of one open group transaction.
struct Group {
    /// Every job run so far, in order.
    ran: Vec<Box<dyn WriteJob>>,
    /// Whether each job runs in a savepoint of its own (after a job had
    /// to be undone).
    savepoints: bool,
}

impl Group {
    /// Whether any job has something to commit.
    fn any_ok(&self) -> bool {
        self.ran.iter().any(|j| j.succeeded())
    }
}

impl Worker {
    /// Takes the write jobs already queued behind the ones taken so far
    /// (`taken` of them), up to [`MAX_GROUP`] in all; the first message that
    /// is not a write job (or, for a `relaxed` group, a durable one) is kept
    /// in `next` and ends the taking.
    fn take_queued(
        receiver: &mpsc::Receiver<Msg>,
        next: &mut Option<Msg>,
        taken: usize,
        relaxed: bool,
    ) -> Vec<Box<dyn WriteJob>> {
        let mut more = Vec::new();
        while next.is_none() && taken + more.len() < MAX_GROUP {
            match receiver.try_recv() {
                Ok(Msg::Write(j)) if relaxed && j.durable() => *next = Some(Msg::Write(j)),
                Ok(Msg::Write(j)) => more.push(j),
                Ok(other) => *next = Some(other),
                Err(_) => break,
            }
        }
        more
    }

    /// Runs `first` and the write jobs queued behind it in one transaction.
    /// Jobs that arrive while the group runs join it before the commit
    /// (never waiting for them), so under load the commits grow instead of
    /// queueing up: nobody's `Ok` comes before the shared `COMMIT`.
    pub(super) fn group(
        &self,
        first: Box<dyn WriteJob>,
        receiver: &mpsc::Receiver<Msg>,
        next: &mut Option<Msg>,
    ) {
        let mut pending = vec![first];
        pending.extend(Self::take_queued(receiver, next, 1, false));
        let relaxed = pending.iter().all(|j| !j.durable());
        if let Err(e) = self
            .sync_for(relaxed)
            .and_then(|()| self.begin("BEGIN IMMEDIATE"))
        {
            let f = Failure::from_error(&e);
            pending.into_iter().for_each(|j| j.finish(Err(&f)));
            return;
        }
        let mut group = Group {
            ran: Vec::with_capacity(pending.len()),
            savepoints: false,
        };
        loop {
            let mut jobs = pending.into_iter();
            while let Some(job) = jobs.next() {
                if let Err(e) = self.step(&mut group, job) {
                    self.rollback();
                    let f = Failure::from_error(&e);
                    group.ran.into_iter().chain(jobs).for_each(|j| j.finish(Err(&f)));
                    return;
                }
            }
            // Nothing joins a transaction with nothing to keep, or one SQLite
            // ended (the commit then fails every job).
            if !group.any_ok() || self.conn.is_autocommit() {
                break;
            }
            pending = Self::take_queued(receiver, next, group.ran.len(), relaxed);
            if pending.is_empty() {
                break;
            }
        }
        let commit = if group.any_ok() {
            self.exec("COMMIT")
        } else {
            // Nothing to keep: every job failed.
            self.exec("ROLLBACK")
        };
        match commit {
            Ok(()) => {
                let (mut settling, done): (Vec<_>, Vec<_>) = group.ran.into_iter().partition(|j| j.settles());
                done.into_iter().for_each(|j| j.finish(Ok(())));
                let reader = self.loader.as_ref().unwrap_or(&self.conn);
                for j in &mut settling {
                    j.settle(reader);
                }
                settling.into_iter().for_each(|j| j.finish(Ok(())));
            }
            Err(e) => {
                self.rollback();
                let f = Failure::from_error(&e);
                group.ran.into_iter().for_each(|j| j.finish(Err(&f)));
            }
        }
    }

    /// Runs one job of the group (see the module docs). An error means the
    /// whole group must fail.
    fn step(&self, group: &mut Group, mut job: Box<dyn WriteJob>) -> Result<()> {
        if group.savepoints {
            let step = self.run_in_savepoint(&mut job);
            group.ran.push(job);
            return step;
        }
        let before = self.conn.total_changes();
        let ok = job.run(&self.conn);
        let changed = self.conn.total_changes() != before;
        group.ran.push(job);
        self.still_open()?;
        if ok || !changed {
            return Ok(());
        }
        // Undo the failed job's writes: the whole transaction, then the
        // jobs that succeeded again, each in a savepoint from now on.
        self.exec("ROLLBACK")?;
        self.begin("BEGIN IMMEDIATE")?;
        group.savepoints = true;
        for job in group.ran.iter_mut().filter(|j| j.succeeded()) {
            self.run_in_savepoint(job)?;
        }
        Ok(())
    }

    /// Runs one job in its own savepoint: a failed job is rolled back
    /// alone. An error means the whole group must fail.
    fn run_in_savepoint(&self, job: &mut Box<dyn WriteJob>) -> Result<()> {
        self.exec("SAVEPOINT outbox_job")?;
        let ok = job.run(&self.conn);
        self.still_open()?;
        if !ok {
            self.exec("ROLLBACK TO outbox_job")?;
        }
        self.exec("RELEASE outbox_job")
    }

    /// Fails when SQLite ended the whole transaction by itself (a full
    /// disk, an I/O error): nothing of the group survives.
    fn still_open(&self) -> Result<()> {
        if self.conn.is_autocommit() {
            return Err(internal(format!(
                "the transaction on {} was rolled back by SQLite",
                self.path
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use outbox_core::Error;
    use rusqlite::Connection;
    use tokio::sync::oneshot;

    use super::super::work::{After, Commit, Job};
    use super::super::{Access, Engine};
    use super::*;
    use crate::SqliteOptions;
    use crate::engine::engine_error;

    type Reply<T> = oneshot::Receiver<Result<T>>;

    /// A write engine on a new database with `t (k, v)` holding `(1, 0)`.
    fn engine(dir: &Path) -> (Arc<Engine>, std::path::PathBuf) {
        let path = dir.join("group.db");
        crate::engine::new_wal_db(
            &path,
            "CREATE TABLE t (k INTEGER PRIMARY KEY, v INTEGER NOT NULL); INSERT INTO t VALUES (1, 0);",
        );
        let engine = Engine::start(&path, &SqliteOptions::default(), Access::Write).expect("engine");
        (Arc::new(engine), path)
    }

    fn bump(conn: &Connection) -> Result<()> {
        conn.execute("UPDATE t SET v = v + 1 WHERE k = 1", [])
            .map(drop)
            .map_err(|e| engine_error("bumping", e))
    }

    /// Queues `body` behind the job that calls it: it joins that job's group.
    fn queue<T: Send + 'static>(
        engine: &Engine,
        body: impl FnMut(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<Reply<T>> {
        engine.submit(body, Commit::Durable)
    }

    /// Queues `body`, with `after` to run past the commit, behind the job
    /// that calls it.
    fn queue_then<T: Send + 'static>(
        engine: &Engine,
        body: impl FnMut(&Connection) -> Result<T> + Send + 'static,
        after: After<T>,
    ) -> Result<Reply<T>> {
        let (reply, rx) = oneshot::channel();
        engine.send(Msg::Write(Box::new(
            Job::new(body, reply, Commit::Relaxed).then(after),
        )))?;
        Ok(rx)
    }

    /// The connection's `synchronous` level where the body runs (0 OFF,
    /// 1 NORMAL, 2 FULL): the level its transaction commits at.
    fn level(conn: &Connection) -> Result<i64> {
        conn.query_row("PRAGMA synchronous", [], |r| r.get(0))
            .map_err(|e| engine_error("reading the level", e))
    }

    /// Bumps, then says the level it runs at.
    fn leveled_bump(conn: &Connection) -> Result<i64> {
        bump(conn)?;
        level(conn)
    }

    /// What the table holds once the engine is closed.
    fn rows(path: &Path) -> Vec<(i64, i64)> {
        let conn = Connection::open(path).expect("open");
        let mut st = conn.prepare("SELECT k, v FROM t ORDER BY k").expect("prepare");
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect())
            .expect("read")
    }

    /// Whether the statement runs inside the group's per-job savepoint.
    fn in_savepoint(conn: &Connection) -> Result<bool> {
        Ok(conn.execute_batch("ROLLBACK TO outbox_job").is_ok())
    }

    /// Whether it runs in a savepoint, probed before it bumps (rolling back
    /// to the savepoint then undoes nothing), then the bump.
    fn probed_bump(conn: &Connection) -> Result<bool> {
        let savepoint = in_savepoint(conn)?;
        bump(conn)?;
        Ok(savepoint)
    }

    /// A job's after-commit step runs once its group committed and the
    /// other jobs of the group have their replies, outside the write
    /// transaction (it sees the commit), and completes the result replied;
    /// a panic in it leaves the committed job's result as the step left
    /// it, not an error.
    #[tokio::test]
    async fn a_jobs_after_step_runs_past_the_commit_and_completes_its_result() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (engine, path) = engine(dir.path());
        let sender = Arc::clone(&engine);
        let (settled, panicked) = engine
            .write(move |conn| {
                bump(conn)?;
                let plain: Arc<std::sync::Mutex<Option<Reply<()>>>> = Arc::default();
                let seen = Arc::clone(&plain);
                let step: After<Vec<String>> = Box::new(move |conn, out| {
                    out.push(format!("outside the transaction: {}", conn.is_autocommit()));
                    let v: i64 = conn
                        .query_row("SELECT v FROM t WHERE k = 1", [], |r| r.get(0))
                        .expect("read");
                    out.push(format!("v = {v}"));
                    let replied = seen
                        .lock()
                        .expect("lock")
                        .as_mut()
                        .map(|rx| rx.try_recv().is_ok());
                    out.push(format!("the plain job had its reply: {replied:?}"));
                });
                let settled = queue_then(
                    &sender,
                    |conn| {
                        bump(conn)?;
                        Ok(vec!["body".to_owned()])
                    },
                    step,
                )?;
                *plain.lock().expect("lock") = Some(queue(&sender, bump)?);
                let panics: After<Vec<i32>> = Box::new(|_, out| {
                    out.push(2);
                    panic!("a step that panics")
                });
                let panicked = queue_then(&sender, |_| Ok(vec![1]), panics)?;
                Ok((settled, panicked))
            })
            .await
            .expect("first job");
        assert_eq!(
            settled.await.expect("reply").expect("the settled job"),
            [
                "body",
                "outside the transaction: true",
                "v = 3",
                "the plain job had its reply: Some(true)"
            ]
        );
        assert_eq!(
            panicked.await.expect("reply").expect("a committed job"),
            [1, 2],
            "the result as the panicking step left it"
        );
        engine.close().await;
        assert_eq!(rows(&path), [(1, 3)], "the three bumps committed");
    }

    /// A job whose body fails, or whose group does not commit, replies
    /// its error and its after-commit step never runs.
    #[tokio::test]
    async fn a_failed_jobs_after_step_never_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (engine, path) = engine(dir.path());
        let ran = Arc::new(AtomicUsize::new(0));
        let step = |ran: &Arc<AtomicUsize>| -> After<()> {
            let ran = Arc::clone(ran);
            Box::new(move |_, _| {
                ran.fetch_add(1, Ordering::SeqCst);
            })
        };
        let failing = queue_then(
            &engine,
            |conn| {
                bump(conn)?;
                Err(engine_error("a body", rusqlite::Error::InvalidQuery))
            },
            step(&ran),
        )
        .expect("queued");
        assert!(failing.await.expect("reply").is_err(), "the body's error");
        // A body that ends the group's transaction itself: the group's
        // COMMIT fails, and so does every job of it.
        let uncommitted = queue_then(
            &engine,
            |conn| {
                bump(conn)?;
                conn.execute_batch("ROLLBACK")
                    .map_err(|e| engine_error("rolling back", e))
            },
            step(&ran),
        )
        .expect("queued");
        assert!(
            uncommitted.await.expect("reply").is_err(),
            "the failed commit's error"
        );
        assert_eq!(ran.load(Ordering::SeqCst), 0, "no step ran");
        engine.close().await;
        assert_eq!(rows(&path), [(1, 0)], "nothing committed");
    }

    /// Three jobs sharing a group, one of them failing before it writes:
    /// no job runs in a savepoint, none runs twice, and the failed one is
    /// the only one that fails.
    #[tokio::test]
    async fn jobs_that_fail_before_writing_cost_no_savepoints() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (engine, path) = engine(dir.path());
        let runs = Arc::new(AtomicUsize::new(0));
        let (sender, counter) = (Arc::clone(&engine), Arc::clone(&runs));
        let (conflict, last) = engine
            .write(move |conn| {
                counter.fetch_add(1, Ordering::SeqCst);
                bump(conn)?;
                let savepoint = in_savepoint(conn)?;
                let conflict = queue(&sender, |conn| {
                    in_savepoint(conn)?;
                    Err::<(), _>(Error::invalid("a conflict found before writing"))
                })?;
                let last = queue(&sender, probed_bump)?;
                assert!(!savepoint, "the first job ran in a savepoint");
                Ok((conflict, last))
            })
            .await
            .expect("first job");
        let conflict = conflict.await.expect("reply");
        assert!(
            matches!(&conflict, Err(Error::InvalidInput(m)) if m.contains("before writing")),
            "{conflict:?}"
        );
        assert!(
            !last.await.expect("reply").expect("last job"),
            "the last job ran in a savepoint"
        );
        engine.close().await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the first job ran again");
        assert_eq!(rows(&path), [(1, 2)], "both bumps committed");
    }

    /// A job that fails after writing is undone alone: the group starts
    /// over, the job that had succeeded runs again, the failed job's row
    /// is gone and the job queued after it commits, in a savepoint.
    #[tokio::test]
    async fn a_job_that_fails_after_writing_is_undone_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (engine, path) = engine(dir.path());
        let runs = Arc::new(AtomicUsize::new(0));
        let replies = Arc::new(std::sync::Mutex::new(None));
        let (sender, counter, queued) = (Arc::clone(&engine), Arc::clone(&runs), Arc::clone(&replies));
        engine
            .write(move |conn| {
                bump(conn)?;
                // Only the first run queues the others (the test's own side effect).
                if counter.fetch_add(1, Ordering::SeqCst) == 0 {
                    let failed = queue(&sender, |conn| {
                        conn.execute("INSERT INTO t VALUES (2, 0)", [])
                            .map_err(|e| engine_error("inserting", e))?;
                        Err::<(), _>(Error::invalid("failed after writing"))
                    })?;
                    let last = queue(&sender, probed_bump)?;
                    *queued.lock().expect("lock") = Some((failed, last));
                }
                Ok(())
            })
            .await
            .expect("first job");
        let (failed, last) = replies.lock().expect("lock").take().expect("queued");
        let failed = failed.await.expect("reply");
        assert!(
            matches!(&failed, Err(Error::InvalidInput(m)) if m.contains("after writing")),
            "{failed:?}"
        );
        assert!(
            last.await.expect("reply").expect("last job"),
            "the last job ran without a savepoint"
        );
        engine.close().await;
        assert_eq!(runs.load(Ordering::SeqCst), 2, "the first job did not run again");
        assert_eq!(
            rows(&path),
            [(1, 2)],
            "both bumps committed, the failed insert did not"
        );
    }

    /// On a `FULL` database a relaxed job commits at `NORMAL` and a durable
    /// one at `FULL`, in either order, and a session after a relaxed job is
    /// back at `FULL`.
    #[tokio::test]
    async fn relaxed_jobs_commit_at_normal_and_durable_ones_at_full() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (engine, path) = engine(dir.path());
        let mut seen = Vec::new();
        for relaxed in [true, false, true, true, false] {
            seen.push(if relaxed {
                engine.write_relaxed(leveled_bump).await
            } else {
                engine.write(leveled_bump).await
            });
        }
        let session = engine.session("BEGIN IMMEDIATE").await.expect("session");
        let in_session = session.run(level).await.expect("session level");
        drop(session);
        engine.close().await;
        let seen: Vec<i64> = seen.into_iter().collect::<Result<_>>().expect("jobs");
        assert_eq!(
            seen,
            [1, 2, 1, 1, 2],
            "levels of relaxed, durable, relaxed, relaxed, durable"
        );
        assert_eq!(in_session, 2, "a session after a relaxed job");
        assert_eq!(rows(&path), [(1, 5)], "every job committed");
    }

    /// A durable job queued while a relaxed group runs does not join it:
    /// it commits on its own, at `FULL`, after the relaxed group. A relaxed
    /// job queued while a durable group runs joins it and shares its
    /// `FULL` commit.
    #[tokio::test]
    async fn only_relaxed_jobs_share_a_relaxed_commit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (engine, path) = engine(dir.path());
        let sender = Arc::clone(&engine);
        let (first, durable, relaxed) = engine
            .write_relaxed(move |conn| {
                let first = leveled_bump(conn)?;
                let durable = queue(&sender, leveled_bump)?;
                let relaxed = sender.submit(leveled_bump, Commit::Relaxed)?;
                Ok((first, durable, relaxed))
            })
            .await
            .expect("relaxed job");
        let durable = durable.await.expect("reply").expect("durable job");
        let relaxed = relaxed.await.expect("reply").expect("relaxed job behind it");
        engine.close().await;
        assert_eq!(first, 1, "the relaxed group's level");
        assert_eq!(durable, 2, "the durable job joined the relaxed group");
        assert_eq!(
            relaxed, 2,
            "the relaxed job behind the durable one did not share its commit"
        );
        assert_eq!(rows(&path), [(1, 3)], "every job committed");
    }

    /// A database opened at `NORMAL` or `OFF` runs every job at its own
    /// level: a relaxed job never raises `OFF`, a durable one never `NORMAL`.
    #[tokio::test]
    async fn below_full_every_job_commits_at_the_databases_level() {
        for (synchronous, want) in [(crate::Synchronous::Normal, 1), (crate::Synchronous::Off, 0)] {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("group.db");
            crate::engine::new_wal_db(
                &path,
                "CREATE TABLE t (k INTEGER PRIMARY KEY, v INTEGER NOT NULL); INSERT INTO t VALUES (1, 0);",
            );
            let options = SqliteOptions::default().with_synchronous(synchronous);
            let engine = Engine::start(&path, &options, Access::Write).expect("engine");
            let relaxed = engine.write_relaxed(leveled_bump).await.expect("relaxed job");
            let durable = engine.write(leveled_bump).await.expect("durable job");
            engine.close().await;
            assert_eq!((relaxed, durable), (want, want), "{synchronous:?}");
        }
    }
}
