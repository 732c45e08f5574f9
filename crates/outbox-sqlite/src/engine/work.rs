//! The work that callers hand an engine thread: write jobs (run in group
//! commits, `group.rs`), reads, and a session's steps. Both sides name these
//! types: the callers' (`Engine`, `Session`) and the thread's (`Worker`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;

use outbox_core::{Error, Result};
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::errors::internal;

/// Runs `f`, turning a panic into an error instead of killing the thread.
pub(super) fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let why = p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        Err(internal(format!("the sqlite engine caught a panic: {why}")))
    })
}

/// A read, or a session's statement, on the thread's connection.
pub(super) type ReadJob = Box<dyn FnOnce(&Connection) + Send>;

/// A statement-by-statement step of a session.
pub(super) enum Step {
    Run(ReadJob),
    Commit(String, oneshot::Sender<Result<()>>),
}

/// What the thread is asked to do.
pub(super) enum Msg {
    Write(Box<dyn WriteJob>),
    Read(ReadJob),
    Session {
        begin: &'static str,
        steps: mpsc::Receiver<Step>,
        ready: oneshot::Sender<Result<()>>,
    },
}

/// A write job: a transaction body and where its result goes.
pub(super) trait WriteJob: Send {
    /// Runs the body in the open transaction (again, if it ran before);
    /// whether it succeeded.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Whether its last run succeeded.
    fn succeeded(&self) -> bool;
    /// Whether its commit must wait for the disk (see `group.rs`).
    fn durable(&self) -> bool;
    /// Whether it has a step to run after the commit (see `group.rs`).
    fn settles(&self) -> bool;
    /// Runs the step after the commit on its result, if it succeeded.
    fn settle(&mut self, conn: &Connection);
    /// Replies: the body's result, or the commit's error if the body
    /// succeeded but its transaction did not commit.
    fn finish(self: Box<Self>, commit: std::result::Result<(), &Failure>);
}

/// A step that completes a job's result after the commit. It only adds to
/// a result that is whole without it: a panic in it leaves the result as
/// the step left it (and is logged), since the job has committed.
pub(super) type After<T> = Box<dyn FnOnce(&Connection, &mut T) + Send>;

/// Why a group did not commit, handed to each of its jobs.
pub(super) struct Failure {
    message: String,
    temporary: bool,
}

impl Failure {
    pub(super) fn from_error(e: &Error) -> Failure {
        Failure {
            message: e.to_string(),
            temporary: e.is_temporary(),
        }
    }

    fn to_error(&self) -> Error {
        Error::Storage {
            message: self.message.clone(),
            temporary: self.temporary,
            source: None,
        }
    }
}

/// A [`WriteJob`] of a body returning `T`.
pub(super) struct Job<T, F> {
    body: F,
    out: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
    commit: Commit,
    after: Option<After<T>>,
}

/// Whether a job's commit waits for the disk (see `group.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Commit {
    Durable,
    Relaxed,
}

impl<T, F> Job<T, F> {
    pub(super) fn new(body: F, reply: oneshot::Sender<Result<T>>, commit: Commit) -> Self {
        Job {
            body,
            out: None,
            reply,
            commit,
            after: None,
        }
    }

    /// The job with `after` run on its result once it committed.
    pub(super) fn then(self, after: After<T>) -> Self {
        Job {
            after: Some(after),
            ..self
        }
    }
}

impl<T, F> WriteJob for Job<T, F>
where
    T: Send,
    F: FnMut(&Connection) -> Result<T> + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let out = guarded(|| (self.body)(conn));
        let ok = out.is_ok();
        self.out = Some(out);
        ok
    }

    fn succeeded(&self) -> bool {
        matches!(self.out, Some(Ok(_)))
    }

    fn durable(&self) -> bool {
        self.commit == Commit::Durable
    }

    fn settles(&self) -> bool {
        self.after.is_some()
    }

    fn settle(&mut self, conn: &Connection) {
        if let (Some(after), Some(Ok(out))) = (self.after.take(), self.out.as_mut()) {
            // The job has committed: a panic in its step cannot make it an
            // error (the caller would take it for nothing done). The
            // result stands as the step left it.
            if let Err(e) = guarded(|| {
                after(conn, out);
                Ok(())
            }) {
                tracing::warn!(error = %e, "a write's after-commit step panicked; its result stands without it");
            }
        }
    }

    fn finish(self: Box<Self>, commit: std::result::Result<(), &Failure>) {
        let out = match (self.out, commit) {
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(v)), Ok(())) => Ok(v),
            (_, Err(f)) => Err(f.to_error()),
            (None, Ok(())) => Err(internal("a write job never ran")),
        };
        // The caller may have gone (its deadline passed): nothing to do.
        let _ = self.reply.send(out);
    }
}
