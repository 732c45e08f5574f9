//! Counters and gauges, exposed as a serializable snapshot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use outbox_core::{ActivityCounts, Mode, OutboxSummary, Timestamp};
use serde::Serialize;

use crate::bounded::{StoreCallStats, StoreCalls};
use crate::lag::{LagHistogram, LagSnapshot};

/// Live counters of one runtime. Cheap to update from any task.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub(crate) applied: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) audit_only: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) completed_rows: AtomicU64,
    pub(crate) claims: AtomicU64,
    pub(crate) contended: AtomicU64,
    pub(crate) caught_up: AtomicU64,
    pub(crate) inline_applied: AtomicU64,
    pub(crate) inline_failed: AtomicU64,
    pub(crate) shadow_verified: AtomicU64,
    pub(crate) storage_errors: AtomicU64,
    pub(crate) lease_takeovers: AtomicU64,
    pub(crate) lag: LagHistogram,
    pub(crate) gauges: Mutex<Option<Gauges>>,
    /// Every store call, counted by the [`Bounded`](crate::bounded::Bounded)
    /// stores.
    pub(crate) store_calls: Arc<StoreCalls>,
    /// The reading of [`Metrics::activity`] last added to the journal's
    /// per-minute activity (kept across restarts of the runtime).
    pub(crate) recorded_activity: Mutex<ActivityCounts>,
}

/// Queue gauges, refreshed by the heartbeat task (and by [`Outbox::refresh_gauges`](crate::Outbox::refresh_gauges)).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Gauges {
    /// Pending rows.
    pub pending: u64,
    /// Processing rows.
    pub processing: u64,
    /// Failed rows.
    pub failed: u64,
    /// Dead rows.
    pub dead: u64,
    /// Age of the oldest pending-or-failed row that is due, in ms (0 when
    /// none), rows held back behind a dead or failing head included.
    pub oldest_due_age_ms: u64,
    /// The workers' lag: the age of the oldest work a worker may take now
    /// (a due head row), in ms (0 when none). Rows that failures hold back
    /// do not count (`dead`, `failed` say how many streams those are).
    pub worker_lag_ms: u64,
    /// When these were read, by the store's clock.
    pub as_of: Timestamp,
}

impl Gauges {
    /// The gauges of a queue summary (the oldest due age measured at its `as_of`).
    pub fn from_summary(s: &OutboxSummary) -> Self {
        let oldest_due_age_ms = s
            .oldest_retry_eligible
            .as_ref()
            .filter(|r| r.next_attempt_at <= s.as_of)
            .map_or(0, |r| {
                s.as_of.duration_since(r.next_attempt_at).as_millis() as u64
            });
        let worker_lag_ms = s
            .oldest_applicable_due
            .filter(|due| *due <= s.as_of)
            .map_or(0, |due| s.as_of.duration_since(due).as_millis() as u64);
        Gauges {
            pending: s.pending,
            processing: s.processing,
            failed: s.failed,
            dead: s.dead,
            oldest_due_age_ms,
            worker_lag_ms,
            as_of: s.as_of,
        }
    }
}

/// A point-in-time copy of a runtime's counters and gauges.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MetricsSnapshot {
    /// The mode the runtime runs in.
    pub mode: Option<Mode>,
    /// Events applied to projections (by the worker, repair or catch-up).
    pub applied: u64,
    /// Events skipped because every projection had applied them already.
    pub duplicates: u64,
    /// Audit-only events checkpointed without calling appliers.
    pub audit_only: u64,
    /// Failures recorded (retries scheduled).
    pub failed: u64,
    /// Rows dead-lettered.
    pub dead_lettered: u64,
    /// Events a projection skipped with a record (ADR 0032).
    pub skipped: u64,
    /// Outbox rows deleted after their events were applied.
    pub completed_rows: u64,
    /// Successful claims.
    pub claims: u64,
    /// Streams skipped because another worker held the lease.
    pub contended: u64,
    /// Gap catch-ups from the journal.
    pub caught_up: u64,
    /// Appends applied inline.
    pub inline_applied: u64,
    /// Inline applies that failed (the events stay for a worker or repair).
    pub inline_failed: u64,
    /// Rows the shadow worker verified and completed.
    pub shadow_verified: u64,
    /// Stream passes stopped by a temporary storage error or a lost lease
    /// (rows abandoned, nothing counted against them), plus whole passes that
    /// failed (after which the worker doubles its idle wait, up to 60 s).
    pub storage_errors: u64,
    /// Claims that took over rows a worker had left `processing` (it
    /// crashed, was killed or stalled past its lease), one per row run.
    pub lease_takeovers: u64,
    /// The append-to-applied lag of the events this runtime's worker applied.
    pub lag: LagSnapshot,
    /// The last gauges read, if any.
    pub gauges: Option<Gauges>,
    /// Every store call this runtime made through the ports, by call name:
    /// how often, how many ended in infrastructure trouble or at their
    /// deadline, the time they took.
    pub store_calls: Vec<StoreCallStats>,
}

impl Metrics {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The counters the journal's per-minute activity is made of: rows
    /// completed (their events applied, checkpointed as audit-only or found
    /// applied already), failures, dead letters.
    pub(crate) fn activity(&self) -> ActivityCounts {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ActivityCounts {
            applied: g(&self.completed_rows),
            failed: g(&self.failed),
            dead: g(&self.dead_lettered),
        }
    }

    pub(crate) fn snapshot(&self, mode: Mode) -> MetricsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            mode: Some(mode),
            applied: g(&self.applied),
            duplicates: g(&self.duplicates),
            audit_only: g(&self.audit_only),
            failed: g(&self.failed),
            dead_lettered: g(&self.dead_lettered),
            skipped: g(&self.skipped),
            completed_rows: g(&self.completed_rows),
            claims: g(&self.claims),
            contended: g(&self.contended),
            caught_up: g(&self.caught_up),
            inline_applied: g(&self.inline_applied),
            inline_failed: g(&self.inline_failed),
            shadow_verified: g(&self.shadow_verified),
            storage_errors: g(&self.storage_errors),
            lease_takeovers: g(&self.lease_takeovers),
            lag: self.lag.snapshot(),
            gauges: self.gauges.lock().map(|g| g.clone()).unwrap_or(None),
            store_calls: self.store_calls.snapshot(),
        }
    }
}
