//! Riding out an unavailable database while starting (issue 16).
//!
//! A process that starts while its database restarts must not exit: every
//! store call [`Outbox::build`](crate::OutboxBuilder::build) and
//! [`Outbox::start`](crate::Outbox::start) make (projection setup, start-up
//! repair, the first heartbeat), and the `outbox work` command's connecting
//! and migrating, go through [`retry_while_unavailable`]. It retries a
//! *temporary storage* error ([`Error::Storage`] with `temporary`: what the
//! adapters classify as connection, shutdown, serialization, resource or
//! busy trouble) with a capped backoff ([`FIRST_DELAY`] doubling to
//! [`MAX_DELAY`]), logging one `warn` line per failed attempt, for at most
//! [`Config::start_retry`](crate::Config::start_retry)
//! (`OUTBOX_START_RETRY_MS`). A permanent error fails at once; an exhausted
//! budget fails with one line naming the attempts, the time spent and the
//! last error. Cancellation ends the wait between attempts at once.
//!
//! Only start-up retries here: once running, the worker's own loop rides
//! out an outage (a temporary error ends the pass; the next poll retries).

use std::future::Future;
use std::time::Duration;

use outbox_core::{Error, Result};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::Config;

/// The wait after the first failed attempt.
pub(crate) const FIRST_DELAY: Duration = Duration::from_millis(100);

/// The longest wait between two attempts.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(5);

/// Runs `op` until it succeeds, fails with anything but a temporary storage
/// error, `budget` has passed since the first attempt, or `cancel` is
/// cancelled (then `Ok(None)`): the wait between attempts ends at once; an
/// attempt in progress is not dropped (start-up repair stops itself between
/// streams, and every store call is bounded by the store deadline), so `op`
/// should watch `cancel` itself if it can take long.
///
/// `what` names the step in the log lines and in the error (`"start-up
/// repair"`, `"connecting to the journal"`). A budget of zero tries once.
pub async fn retry_while_unavailable<T, F, Fut>(
    budget: Duration,
    cancel: &CancellationToken,
    what: &str,
    mut op: F,
) -> Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let began = Instant::now();
    let mut delay = FIRST_DELAY;
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        if cancel.is_cancelled() {
            return Ok(None);
        }
        let e = match op().await {
            Ok(v) => {
                if attempt > 1 {
                    tracing::info!(attempt, elapsed = ?began.elapsed(), "{what}: the database is available again");
                }
                return Ok(Some(v));
            }
            Err(e) if is_unavailable(&e) => e,
            Err(e) => return Err(e),
        };
        let elapsed = began.elapsed();
        if elapsed + delay > budget {
            let message = format!(
                "{what}: the database is still unavailable after {attempt} attempt(s) in {:.1}s \
                     (giving up: {} is {}ms): {e}",
                elapsed.as_secs_f64(),
                Config::OUTBOX_START_RETRY_MS,
                budget.as_millis()
            );
            return Err(Error::temporary(message, e));
        }
        warn!(attempt, retry_in = ?delay, error = %e, "{what}: the database is unavailable; retrying");
        tokio::select! {
            biased;
            () = cancel.cancelled() => return Ok(None),
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(MAX_DELAY);
    }
}

/// Whether an error means "the database is unavailable right now": a
/// temporary storage error. (An [`Error::Apply`] is temporary for the worker
/// but is a projection's failure, not the database's: not retried here.)
pub(crate) fn is_unavailable(e: &Error) -> bool {
    matches!(e, Error::Storage { temporary: true, .. })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn down() -> Error {
        Error::temporary("connecting: connection refused", std::io::Error::other("refused"))
    }

    #[tokio::test(start_paused = true)]
    async fn temporary_errors_are_retried_with_a_capped_backoff_until_success() {
        let calls = AtomicU32::new(0);
        let began = Instant::now();
        let got = retry_while_unavailable(Duration::from_secs(60), &CancellationToken::new(), "x", || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move { if n < 8 { Err(down()) } else { Ok(n) } }
        })
        .await
        .unwrap();
        assert_eq!(got, Some(8));
        // 0.1 + 0.2 + 0.4 + 0.8 + 1.6 + 3.2 + 5 + 5 (capped)
        assert_eq!(began.elapsed(), Duration::from_millis(16_300));
    }

    #[tokio::test(start_paused = true)]
    async fn a_permanent_error_fails_at_once() {
        let calls = AtomicU32::new(0);
        let err = retry_while_unavailable(Duration::from_secs(60), &CancellationToken::new(), "x", || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(Error::storage("bad password", std::io::Error::other("auth"))) }
        })
        .await
        .unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(err.to_string().contains("bad password"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_exhausted_budget_fails_with_one_line_naming_the_attempts() {
        let err = retry_while_unavailable(
            Duration::from_secs(1),
            &CancellationToken::new(),
            "start-up repair",
            || async { Err::<(), _>(down()) },
        )
        .await
        .unwrap_err();
        let msg = err.to_string();
        assert!(!msg.contains('\n'), "{msg}");
        assert!(
            msg.contains("start-up repair")
                && msg.contains("4 attempt(s)")
                && msg.contains("OUTBOX_START_RETRY_MS")
                && msg.contains("connection refused"),
            "{msg}"
        );
        assert!(err.is_temporary());
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_budget_tries_once() {
        let calls = AtomicU32::new(0);
        retry_while_unavailable(Duration::ZERO, &CancellationToken::new(), "x", || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(down()) }
        })
        .await
        .unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn cancellation_stops_a_retrying_wait_at_once() {
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        let began = Instant::now();
        let waiting = retry_while_unavailable(Duration::from_secs(600), &cancel, "x", || async {
            Err::<(), _>(down())
        });
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(7)).await;
            c.cancel();
        });
        assert_eq!(waiting.await.unwrap(), None);
        assert_eq!(began.elapsed(), Duration::from_secs(7));
        // Cancelled before the first attempt: no attempt is made.
        let cancel = CancellationToken::new();
        cancel.cancel();
        let hung = retry_while_unavailable(Duration::from_secs(600), &cancel, "x", || {
            std::future::pending::<Result<()>>()
        });
        assert_eq!(hung.await.unwrap(), None);
    }
}
