//! The append-to-applied lag histogram: for every event a worker applies,
//! how long after its append (`recorded_at`, by the database's clock) the
//! projection transaction committed.
//!
//! The worker reads no clock of the database's at commit time; it learns
//! the database's time from its leases (a lease granted or renewed expires
//! exactly one TTL after the database's `now`) and advances that reading
//! by the local monotonic clock. So the lag is measured on one clock, the
//! database's, whatever the skew between hosts.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_core::{Event, Lease, Timestamp};
use serde::Serialize;
use tokio::time::Instant;

/// Upper bounds of the histogram's buckets, in milliseconds (a last,
/// unbounded bucket follows).
pub const LAG_BUCKETS_MS: [u64; 14] = [
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 60_000,
];

/// The live histogram and the database-clock reading it measures with.
#[derive(Debug, Default)]
pub(crate) struct LagHistogram {
    /// Per bucket (not cumulative); the last is the unbounded one.
    buckets: [AtomicU64; LAG_BUCKETS_MS.len() + 1],
    count: AtomicU64,
    sum_ms: AtomicU64,
    /// The database's time as last learned, and when (local monotonic clock).
    clock: Mutex<Option<(Timestamp, Instant)>>,
}

/// A point-in-time copy of the histogram.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LagSnapshot {
    /// `(upper bound in ms, events with a lag up to it)`, cumulative, one
    /// per [`LAG_BUCKETS_MS`] bound.
    pub buckets: Vec<(u64, u64)>,
    /// Events observed (the unbounded bucket's cumulative count).
    pub count: u64,
    /// The sum of their lags, in milliseconds.
    pub sum_ms: u64,
}

impl LagHistogram {
    /// Learns the database's time from a lease just granted or renewed for `ttl`.
    pub(crate) fn saw_lease(&self, lease: &Lease, ttl: Duration) {
        let granted = lease.expires_at.saturating_sub(ttl);
        if let Ok(mut c) = self.clock.lock() {
            *c = Some((granted, Instant::now()));
        }
    }

    /// The database's time now, as estimated from the last lease.
    fn db_now(&self) -> Option<Timestamp> {
        let (at, when) = (*self.clock.lock().ok()?)?;
        Some(at.saturating_add(when.elapsed()))
    }

    /// Observes the lag of `events`, applied just now.
    pub(crate) fn applied(&self, events: &[Event]) {
        let Some(now) = self.db_now() else {
            return;
        };
        for e in events {
            self.observe(now.duration_since(e.metadata.recorded_at));
        }
    }

    fn observe(&self, lag: Duration) {
        let ms = u64::try_from(lag.as_millis()).unwrap_or(u64::MAX);
        let i = LAG_BUCKETS_MS
            .iter()
            .position(|&b| ms <= b)
            .unwrap_or(LAG_BUCKETS_MS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ms.fetch_add(ms, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> LagSnapshot {
        let mut cumulative = 0;
        let buckets = LAG_BUCKETS_MS
            .iter()
            .zip(&self.buckets)
            .map(|(&le, n)| {
                cumulative += n.load(Ordering::Relaxed);
                (le, cumulative)
            })
            .collect();
        LagSnapshot {
            buckets,
            count: self.count.load(Ordering::Relaxed),
            sum_ms: self.sum_ms.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use outbox_core::{EventType, Intent, Metadata, PayloadHash, Seq, StreamId, WorkerId};

    use super::*;

    fn event(recorded_at: i64) -> Event {
        Event {
            global_position: 1,
            stream: StreamId::new("s").unwrap(),
            seq: Seq::FIRST,
            event_type: EventType::new("t").unwrap(),
            intent: Intent::Apply,
            payload: Vec::new(),
            payload_hash: PayloadHash::of(&[]),
            decoded: Default::default(),
            metadata: Metadata {
                recorded_at: Timestamp::from_millis(recorded_at),
                correlation_id: None,
                causation_id: None,
            },
        }
    }

    fn lease(expires_at: i64) -> Lease {
        Lease {
            stream: StreamId::new("s").unwrap(),
            owner: WorkerId::new("w").unwrap(),
            epoch: 1,
            expires_at: Timestamp::from_millis(expires_at),
            partition: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn lags_are_measured_on_the_database_clock_from_the_lease() {
        let h = LagHistogram::default();
        h.applied(&[event(0)]);
        assert_eq!(
            h.snapshot().count,
            0,
            "no lease seen yet: nothing to measure with"
        );
        // Granted at 10_000 (db clock) with a 30 s TTL.
        h.saw_lease(&lease(40_000), Duration::from_secs(30));
        tokio::time::advance(Duration::from_millis(3)).await;
        // Appended 4 ms and 200 ms before the grant; applied 3 ms after it.
        h.applied(&[event(9_996), event(9_800)]);
        // An event stamped after the estimate (clocks never go back) counts as 0.
        h.applied(&[event(20_000)]);
        let s = h.snapshot();
        assert_eq!((s.count, s.sum_ms), (3, 7 + 203));
        let le = |bound: u64| s.buckets.iter().find(|(b, _)| *b == bound).unwrap().1;
        assert_eq!((le(1), le(5), le(10), le(250), le(60_000)), (1, 1, 2, 3, 3));
    }
}
