//! Store-call deadlines (issue 12 item 4): a hung database connection must
//! not hold a worker past its lease.
//!
//! Every store call the runtime makes (the worker's, the heartbeat's, gap
//! repair's, inline apply's, replay's) goes through [`Within::within`], which
//! bounds it by [`Config::store_deadline`](crate::Config::store_deadline) (a
//! third of the lease TTL unless configured, always below it) with
//! `tokio::time::timeout`. A call past its deadline is dropped and becomes a
//! temporary [`Error::Storage`] naming the call and the deadline, so the
//! worker treats it like any other infrastructure trouble: the stream's pass
//! stops, its claimed rows are abandoned and its lease released (each of
//! those bounded too, else left to expire), nothing is counted against a
//! row, and a later pass retries. An *apply* past its deadline (a projection
//! that hangs, [`stalled`]) ends like a crash instead: its rows stay
//! `processing` for the next claim to isolate, and an attempt of a row
//! applied alone is charged to it (ADR 0029).
//!
//! **Exactly-once is unaffected.** Dropping a store future drops its
//! transaction before commit, and an uncommitted transaction rolls back
//! (sqlx rolls back a dropped `Transaction`; the memory adapter's
//! transaction replays its undo log on drop). A call that had already sent
//! its commit when the deadline passed is an ambiguous commit, as after any
//! lost connection: the projection checkpoint's compare-and-set makes the
//! retry a duplicate that is skipped.
//!
//! **Why a wrapper at each call and not a decorator type.** Style rule 22
//! asks for decorators. A `Deadline<J>` implementing every port would have
//! to forward ten traits (about forty methods, `impl Future` signatures, the
//! projection store's associated transaction type) and would change what
//! [`Outbox::journal`](crate::Outbox::journal) and
//! [`Outbox::store`](crate::Outbox::store) return to applications; this
//! combinator is one definition, applied where the runtime (the only crate
//! that owns time) calls a port. The calls an application makes itself
//! through those accessors are its own to bound.

use std::future::Future;
use std::time::Duration;

use outbox_core::{Error, Result};

/// Bounds a store call by a deadline (see the module docs).
pub(crate) trait Within<T>: Future<Output = Result<T>> + Sized {
    /// Runs the call for at most `deadline`; past it, the call is dropped
    /// (its transaction rolls back) and the result is a temporary storage
    /// error naming `call` and the deadline.
    async fn within(self, deadline: Duration, call: &'static str) -> Result<T> {
        match tokio::time::timeout(deadline, self).await {
            Ok(result) => result,
            Err(elapsed) => Err(Error::temporary(
                format_args!("store call `{call}` did not finish within the store deadline of {deadline:?}"),
                elapsed,
            )),
        }
    }

    /// [`within`](Self::within) for a worker's projection apply: past the
    /// deadline the error is also [`stalled`].
    async fn within_apply(self, deadline: Duration, call: &'static str) -> Result<T> {
        match tokio::time::timeout(deadline, self).await {
            Ok(result) => result,
            Err(_) => Err(Error::temporary(
                format_args!("store call `{call}` did not finish within the store deadline of {deadline:?}"),
                ApplyStalled,
            )),
        }
    }
}

impl<T, F: Future<Output = Result<T>>> Within<T> for F {}

/// The source of a worker's apply that passed its deadline.
#[derive(Debug)]
struct ApplyStalled;

impl std::fmt::Display for ApplyStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the projection apply did not finish in time")
    }
}

impl std::error::Error for ApplyStalled {}

/// Whether `error` is a worker's projection apply that did not finish
/// within its deadline ([`Within::within_apply`]): the attempt is ended as
/// a crash would end it. Its rows stay `processing` for the next claim to
/// isolate, and an attempt of a row applied alone is charged to it
/// (ADR 0029), so a projection that hangs on one event dead-letters it
/// instead of retrying it forever. Every other call past its deadline is
/// a plain temporary error.
pub(crate) fn stalled(error: &Error) -> bool {
    error.is_temporary() && std::error::Error::source(error).is_some_and(|s| s.is::<ApplyStalled>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_deadline_is_a_temporary_storage_error() {
        let started = tokio::time::Instant::now();
        let hung = std::future::pending::<Result<()>>();
        let err = hung.within(Duration::from_secs(2), "claim").await.unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert!(err.is_temporary(), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("`claim`") && msg.contains("2s"), "{msg}");
    }

    #[tokio::test(start_paused = true)]
    async fn only_an_apply_past_its_deadline_is_stalled() {
        let hung = std::future::pending::<Result<()>>();
        assert!(stalled(
            &hung
                .within_apply(Duration::from_secs(1), "apply")
                .await
                .unwrap_err()
        ));
        let read = std::future::pending::<Result<()>>();
        assert!(
            !stalled(
                &read
                    .within(Duration::from_secs(1), "read_stream")
                    .await
                    .unwrap_err()
            ),
            "another call past its deadline is no stall"
        );
        let other = Error::temporary("connection reset", std::io::Error::other("reset"));
        assert!(!stalled(&other), "another temporary error is no stall");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_within_its_deadline_keeps_its_result() {
        let ok = async { Ok::<_, Error>(7) }.within(Duration::from_secs(1), "read_stream");
        assert_eq!(ok.await.unwrap(), 7);
        let err = async { Err::<(), _>(Error::Config("x".into())) }
            .within(Duration::from_secs(1), "append")
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Config(_)),
            "the call's own error passes through"
        );
    }
}
