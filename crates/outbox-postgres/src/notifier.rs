//! Wake-ups sent after appends commit, coalesced, off the commit path.
//!
//! A `pg_notify` inside an append's transaction makes its commit take
//! Postgres' database-wide notification lock and hold it through the WAL
//! flush, so concurrent appends that notify commit one at a time (issue 43
//! measured COMMIT waiting on it in three samples of four). Instead, an
//! append that enqueued rows marks a notification pending once it has
//! committed, and one task per journal sends `SELECT pg_notify(channel,
//! '')` in a transaction of its own, as often as appends mark it, but never
//! two at once: every append that commits while one is being sent is
//! covered by the next. That transaction writes only its commit record (a
//! notification takes a transaction id), and a transaction that wrote
//! nothing else does not wait for the WAL flush at its commit (checked on
//! a durable server: after it, the WAL's insert position has moved by one
//! commit record and its flush position has not), so a wake-up never adds
//! an fsync of its own.
//!
//! A notification is a hint (listeners recheck the queue, and poll as a
//! fallback), so one that fails to send is logged and dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sqlx::PgPool;
use tokio::sync::Notify;

/// The coalescing notifier of one journal (shared by its clones).
#[derive(Debug, Default)]
pub(crate) struct Notifier {
    /// Set by each committed append, cleared by the task before it sends.
    pending: AtomicBool,
    /// Set when the journal is closed or dropped: the task ends.
    closed: AtomicBool,
    /// Wakes the task (keeps one permit, so no poke is lost between the
    /// task's last look at `pending` and its wait).
    wake: Notify,
    /// The task, started by the first append that notifies and again when
    /// it ended with the runtime it ran on (a journal used from one runtime
    /// after another).
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Notifier {
    /// Marks a notification pending on `channel` of `pool`, starting the
    /// sending task on first use. Never waits.
    pub(crate) fn poke(self: &Arc<Self>, pool: &PgPool, channel: &str) {
        {
            let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
            if task.as_ref().is_none_or(|t| t.is_finished()) && !self.closed.load(Ordering::Acquire) {
                *task = Some(tokio::spawn(send_loop(
                    self.clone(),
                    pool.clone(),
                    channel.to_owned(),
                )));
            }
        }
        if !self.pending.swap(true, Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }

    /// Ends the task (at its next wake-up, which this gives it).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake.notify_one();
    }
}

/// Sends one notification per round while any append marked one pending
/// since the last was sent; ends when the notifier is closed.
async fn send_loop(n: Arc<Notifier>, pool: PgPool, channel: String) {
    loop {
        while n.pending.swap(false, Ordering::AcqRel) {
            if n.closed.load(Ordering::Acquire) || pool.is_closed() {
                return;
            }
            if let Err(e) = sqlx::query("SELECT pg_notify($1, '')")
                .bind(&channel)
                .execute(&pool)
                .await
            {
                tracing::debug!(target: "outbox::postgres", error = %e,
                    "a wake-up notification was not sent; workers fall back to polling");
            }
        }
        if n.closed.load(Ordering::Acquire) || pool.is_closed() {
            return;
        }
        n.wake.notified().await;
    }
}
