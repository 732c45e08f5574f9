//! A [`Clock`] that follows tokio's clock, so a paused test clock moves the
//! memory adapter's "database time" too.

use outbox_core::{Clock, Timestamp};
use tokio::time::Instant;

/// Reads tokio's clock: `base + (tokio now - start)`. Under
/// `#[tokio::test(start_paused = true)]` time auto-advances when every task
/// waits, which moves lease expiry and retry due times with it: retry and
/// lease tests run in virtual time, without sleeping.
#[derive(Debug, Clone)]
pub struct TokioClock {
    base: Timestamp,
    start: Instant,
}

impl TokioClock {
    /// A clock reading `base` now. Create it inside the tokio runtime.
    pub fn starting_at(base: Timestamp) -> Self {
        TokioClock {
            base,
            start: Instant::now(),
        }
    }
}

impl Default for TokioClock {
    /// Starts at 2026-01-01T00:00:00Z.
    fn default() -> Self {
        Self::starting_at(Timestamp::from_millis(1_767_225_600_000))
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.base.saturating_add(self.start.elapsed())
    }
}
