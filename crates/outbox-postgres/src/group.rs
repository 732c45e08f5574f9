//! Group commit of concurrent appends (ADR 0042).
//!
//! An append waits for one of the connections appends may hold
//! ([`PgOptions::append_connections`](crate::PgOptions), 2 by default).
//! Each waiting append is queued; the one that gets a connection takes
//! every queued batch with the same options (up to [`GROUP_EVENTS`]
//! events) and appends them in one statement, so they share one commit
//! and one WAL flush. An append that finds a connection free runs alone,
//! as before; a group only forms while every append connection is busy,
//! which is when commits queue behind the disk anyway. Few append
//! connections make groups form early: each statement costs the server
//! about as much CPU for one event as for dozens.
//!
//! A group is atomic only as an optimization, never to a member's cost:
//! when the statement fails with an answer from the server (a member's
//! expected version does not match, or any error that rolled the statement
//! back), each member is appended again on its own, so a bad batch fails
//! alone. An error after which the outcome is unknown (the connection lost
//! mid-commit) is every member's, as it would be for each alone.
//!
//! The group runs in a task of its own, holding the connection's turn, so
//! a caller that stops waiting (a deadline) cancels no other member's
//! append; a batch still queued when its caller stops waiting is dropped
//! from the queue and never appended.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use outbox_core::{AppendOptions, AppendRequest, Appended, Error, Result};
use tokio::sync::oneshot;

/// The most events a group appends in one statement; a larger batch runs
/// alone.
pub(crate) const GROUP_EVENTS: usize = 1_000;

/// One queued append.
pub(crate) struct Waiting {
    id: u64,
    pub(crate) batch: Vec<AppendRequest>,
    pub(crate) options: AppendOptions,
    done: oneshot::Sender<Result<Vec<Appended>>>,
}

impl Waiting {
    /// Hands the append its outcome (a caller that stopped waiting is gone).
    pub(crate) fn answer(self, out: Result<Vec<Appended>>) {
        let _ = self.done.send(out);
    }
}

/// The appends waiting for a connection, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    waiting: Mutex<Vec<Waiting>>,
    next: AtomicU64,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("id", &self.id)
            .field("requests", &self.batch.len())
            .finish()
    }
}

impl Queue {
    /// Queues a batch; returns its id and where its outcome arrives.
    pub(crate) fn push(
        &self,
        batch: &[AppendRequest],
        options: AppendOptions,
    ) -> (u64, oneshot::Receiver<Result<Vec<Appended>>>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (done, answer) = oneshot::channel();
        self.lock().push(Waiting {
            id,
            batch: batch.to_vec(),
            options,
            done,
        });
        (id, answer)
    }

    /// Takes batch `id` back out of the queue; false when a group has
    /// taken it already (its outcome will arrive).
    pub(crate) fn withdraw(&self, id: u64) -> bool {
        let mut waiting = self.lock();
        match waiting.iter().position(|w| w.id == id) {
            Some(at) => {
                waiting.remove(at);
                true
            }
            None => false,
        }
    }

    /// The next group: the oldest queued batch whose caller still waits,
    /// and every later one with the same options while the group stays
    /// within [`GROUP_EVENTS`] events. Batches whose callers stopped
    /// waiting are dropped.
    pub(crate) fn take(&self) -> Vec<Waiting> {
        let mut waiting = self.lock();
        waiting.retain(|w| !w.done.is_closed());
        let Some(options) = waiting.first().map(|w| w.options) else {
            return Vec::new();
        };
        let mut events = 0usize;
        let mut group = Vec::new();
        let mut rest = Vec::with_capacity(waiting.len());
        for w in waiting.drain(..) {
            let n: usize = w.batch.iter().map(|r| r.events.len()).sum();
            if w.options == options && (group.is_empty() || events + n <= GROUP_EVENTS) {
                events += n;
                group.push(w);
            } else {
                rest.push(w);
            }
        }
        *waiting = rest;
        group
    }

    /// Whether no append is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The error a member gets when its group's task ended without answering
/// (it panicked): the outcome is unknown.
pub(crate) fn unanswered() -> Error {
    Error::temporary(
        "appending events: the append's group ended without an answer (the outcome is unknown)",
        "group task ended",
    )
}

/// A copy of `e` for another member of a group: same message, same kind.
pub(crate) fn copy_of(e: &Error) -> Error {
    let message = e.to_string();
    if e.is_temporary() {
        Error::temporary(message.clone(), message)
    } else {
        Error::storage(message.clone(), message)
    }
}
