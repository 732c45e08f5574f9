//! LISTEN/NOTIFY as a [`WakeSource`].

use std::time::Duration;

use outbox_core::WakeSource;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;

/// How long one attempt to (re)connect the listener may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest pause between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The first pause after a failed attempt.
const MIN_BACKOFF: Duration = Duration::from_millis(100);

/// Wakes workers when an append that enqueued rows commits anywhere on the
/// journal's schema: `LISTEN` on the schema's channel over one dedicated
/// connection (not taken from the journal's pool).
///
/// No background task: the connection is driven by whichever caller is
/// inside [`WakeSource::wait`] (the others wait for its signal), so dropping
/// a `wait` future at any point is safe and nothing runs when nobody waits.
/// Notifications that arrive meanwhile are buffered on the connection and
/// resolve the next `wait` at once.
///
/// When the connection is lost, the listener is rebuilt from scratch (a new
/// connection, `LISTEN` again); every reconnection resolves `wait` (work may
/// have been appended while nobody listened), and while the database cannot
/// be reached `wait` resolves after each attempt, at most about every
/// four seconds, so the caller's polling carries on.
#[derive(Debug)]
pub struct PgWakeSource {
    channel: String,
    pool: PgPool,
    driver: Mutex<Driver>,
    signal: watch::Sender<u64>,
}

struct Driver {
    listener: Option<PgListener>,
    failures: u32,
    retry_at: Option<Instant>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("connected", &self.listener.is_some())
            .field("failures", &self.failures)
            .finish()
    }
}

impl PgWakeSource {
    /// A wake source listening on `channel` of the database at `connect`
    /// (connects on the first `wait`).
    pub fn new(connect: PgConnectOptions, channel: String) -> Self {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(CONNECT_TIMEOUT)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_lazy_with(connect);
        PgWakeSource {
            channel,
            pool,
            driver: Mutex::new(Driver {
                listener: None,
                failures: 0,
                retry_at: None,
            }),
            signal: watch::channel(0).0,
        }
    }

    /// The channel listened on.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// Whether the listener is connected right now (for tests and metrics).
    pub async fn is_connected(&self) -> bool {
        self.driver.lock().await.listener.is_some()
    }

    async fn connect(&self) -> Result<PgListener, sqlx::Error> {
        let mut l = PgListener::connect_with(&self.pool).await?;
        // We rebuild the listener ourselves after a loss, with our own
        // timeouts, rather than inside a `try_recv` that may be cancelled.
        l.eager_reconnect(false);
        l.ignore_pool_close_event(true);
        l.listen(&self.channel).await?;
        Ok(l)
    }

    /// Drives the listener until something may be due: a notification, a
    /// (re)connection, a lost connection, or a pause between attempts.
    async fn drive(&self, d: &mut Driver) {
        if d.listener.is_none() {
            if let Some(at) = d.retry_at
                && Instant::now() < at
            {
                tokio::time::sleep_until(at).await;
            }
            match tokio::time::timeout(CONNECT_TIMEOUT, self.connect()).await {
                Ok(Ok(l)) => {
                    if d.failures > 0 {
                        tracing::info!(channel = %self.channel, "wake-up listener reconnected");
                    }
                    d.listener = Some(l);
                    d.failures = 0;
                    d.retry_at = None;
                }
                Ok(Err(e)) => self.failed(d, &e.to_string()),
                Err(_) => self.failed(d, "connecting timed out"),
            }
            // Connected just now (appends may have been missed) or not at all:
            // either way the caller should look at the store.
            return;
        }
        let l = d.listener.as_mut().expect("checked above");
        match l.try_recv().await {
            Ok(Some(_)) => {
                // Fold whatever else already arrived into this one wake-up.
                loop {
                    match tokio::time::timeout(Duration::ZERO, l.try_recv()).await {
                        Ok(Ok(Some(_))) => {}
                        Err(_) => break,
                        Ok(Ok(None) | Err(_)) => {
                            d.listener = None;
                            break;
                        }
                    }
                }
            }
            Ok(None) => {
                tracing::warn!(channel = %self.channel, "wake-up listener lost its connection; reconnecting");
                d.listener = None;
            }
            Err(e) => {
                tracing::warn!(channel = %self.channel, error = %e, "wake-up listener failed; reconnecting");
                d.listener = None;
            }
        }
    }

    fn failed(&self, d: &mut Driver, error: &str) {
        d.failures = d.failures.saturating_add(1);
        let pause = MIN_BACKOFF
            .saturating_mul(1u32 << d.failures.min(8))
            .min(MAX_BACKOFF);
        d.retry_at = Some(Instant::now() + pause);
        if d.failures == 1 || d.failures.is_multiple_of(30) {
            tracing::warn!(channel = %self.channel, attempts = d.failures, error, "wake-up listener cannot connect; polling meanwhile");
        }
    }
}

#[async_trait::async_trait]
impl WakeSource for PgWakeSource {
    async fn wait(&self) {
        let mut rx = self.signal.subscribe();
        tokio::select! {
            // Another waiter drives the listener: its signal wakes us too.
            _ = rx.changed() => {}
            mut d = self.driver.lock() => {
                self.drive(&mut d).await;
                self.signal.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }
}
