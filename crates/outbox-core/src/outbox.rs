//! Outbox rows, stream leases, summaries.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Error, Event, EventType, Partition, Result, Seq, StreamId, Timestamp, WorkerId};

/// The most rows any single listing or bulk operation returns.
pub const MAX_PAGE: usize = 10_000;

/// The state of an outbox row. Completed rows are deleted, so there is no "done".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutboxStatus {
    /// Waiting for its first attempt.
    Pending,
    /// Claimed by the holder of the stream's lease. When that lease expires the
    /// row is due again (a crashed worker never strands it).
    Processing,
    /// Failed at least once; due again at `next_attempt_at`.
    Failed,
    /// Failed `dead_letter_after` times in a row; blocks its stream until an
    /// operator requeues it.
    Dead,
}

impl OutboxStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [OutboxStatus; 4] = [
        OutboxStatus::Pending,
        OutboxStatus::Processing,
        OutboxStatus::Failed,
        OutboxStatus::Dead,
    ];

    /// The stable name stored by SQL adapters.
    pub const fn as_str(self) -> &'static str {
        match self {
            OutboxStatus::Pending => "pending",
            OutboxStatus::Processing => "processing",
            OutboxStatus::Failed => "failed",
            OutboxStatus::Dead => "dead",
        }
    }
}

impl std::str::FromStr for OutboxStatus {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        OutboxStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                Error::invalid(format_args!(
                    "unknown outbox status {s:?} (expected pending, processing, failed or dead)"
                ))
            })
    }
}

impl fmt::Display for OutboxStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One outbox row: a pointer to a journal event that projections have not
/// (as far as the outbox knows) applied yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OutboxRow {
    /// The stream.
    pub stream: StreamId,
    /// The event's seq.
    pub seq: Seq,
    /// The event's type (for inspection without loading the event).
    pub event_type: EventType,
    /// The row's state.
    pub status: OutboxStatus,
    /// Consecutive failures so far.
    pub attempt_count: u32,
    /// When the row is due (for pending and failed rows), or when it died.
    pub next_attempt_at: Timestamp,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// When the row last changed.
    pub updated_at: Timestamp,
    /// When the row first failed (a recorded failure or an unfinished
    /// attempt); kept through its retries, cleared by a requeue.
    pub first_failed_at: Option<Timestamp>,
    /// Whether the row is applied alone: a claim that held it ended without
    /// a result (its worker crashed, was killed or stalled) before anything
    /// showed which row was at fault, so it is claimed by itself from then
    /// on, and an attempt of its own that ends without a result is charged
    /// to it (ADR 0029). Kept until the row is completed or requeued.
    pub alone: bool,
}

impl OutboxRow {
    /// Whether the row has never been tried: not failed, not unfinished,
    /// not to be applied alone. Only fresh rows are applied together with
    /// other streams' rows.
    pub fn is_fresh(&self) -> bool {
        self.attempt_count == 0 && !self.alone && self.last_error.is_none()
    }

    /// Whether the claim that returned this row found an attempt of its own
    /// unfinished (begun with
    /// [`OutboxQueue::begin_attempt`](crate::OutboxQueue::begin_attempt),
    /// then never completed, failed or abandoned): the claimer records that
    /// attempt with [`OutboxQueue::fail`](crate::OutboxQueue::fail) before it
    /// applies the row again (ADR 0029).
    pub fn ended_unfinished(&self) -> bool {
        self.alone && self.last_error.as_deref() == Some(UNFINISHED_ATTEMPT)
    }
}

/// The longest failure message stored; longer ones are cut at a char boundary.
pub const MAX_ERROR_LEN: usize = 2048;

/// The error a claim records on an [`alone`](OutboxRow::alone) row it finds
/// still `processing` after an attempt of its own began
/// ([`OutboxQueue::begin_attempt`](crate::OutboxQueue::begin_attempt)): the
/// worker stopped without completing, failing or abandoning it (see
/// [`OutboxQueue`](crate::OutboxQueue), `claim`). The claimer then records
/// the attempt with [`ENDED_WITHOUT_RESULT`] as its message.
pub const UNFINISHED_ATTEMPT: &str =
    "a worker claimed this row and stopped before finishing it (crashed, killed or stalled past its lease)";

/// The failure a worker records for an attempt that ended without a result
/// (see [`UNFINISHED_ATTEMPT`]): distinct from it, so a claim of the failed
/// row does not read as unfinished again.
pub const ENDED_WITHOUT_RESULT: &str = "the apply ended without a result: its worker crashed, was killed or stalled past its lease while applying this row alone";

/// `message` cut to at most [`MAX_ERROR_LEN`] bytes at a char boundary.
pub fn truncate_error(message: &str) -> &str {
    if message.len() <= MAX_ERROR_LEN {
        return message;
    }
    let mut end = MAX_ERROR_LEN;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

/// The result of [`OutboxQueue::fail`](crate::OutboxQueue::fail).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum FailureOutcome {
    /// The row is `failed` and due again at `next_attempt_at`.
    Retry {
        /// Consecutive failures including this one.
        attempt: u32,
        /// When it is due again (the store's clock plus the policy's delay).
        next_attempt_at: Timestamp,
    },
    /// The threshold was reached: the row is `dead`.
    Dead {
        /// Consecutive failures including this one.
        attempt: u32,
    },
}

/// Row counts by status and the oldest retry-eligible row.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OutboxSummary {
    /// Rows waiting for a first attempt.
    pub pending: u64,
    /// Rows claimed by a worker.
    pub processing: u64,
    /// Rows waiting for a retry.
    pub failed: u64,
    /// Dead rows.
    pub dead: u64,
    /// The pending or failed row with the earliest `next_attempt_at`
    /// (ties broken by stream, then seq).
    pub oldest_retry_eligible: Option<OutboxRow>,
    /// The earliest due time among the streams' head rows that a worker
    /// may take: the oldest work that is not held back. Rows behind a dead
    /// head, or behind a failed head not due yet, do not count; so
    /// `as_of - oldest_applicable_due` is the workers' lag, apart from the
    /// streams that failures block (see [`dead`](Self::dead)).
    pub oldest_applicable_due: Option<Timestamp>,
    /// The store's clock when the summary was taken, for computing ages.
    pub as_of: Timestamp,
}

impl OutboxSummary {
    /// All rows.
    pub fn total(&self) -> u64 {
        self.pending + self.processing + self.failed + self.dead
    }

    /// A summary from stored `(status, count)` pairs, as SQL adapters read
    /// them with `GROUP BY status`. An unknown status is
    /// [`Error::Storage`] (the stored data is not ours).
    pub fn from_counts(
        as_of: Timestamp,
        oldest_retry_eligible: Option<OutboxRow>,
        counts: impl IntoIterator<Item = (String, i64)>,
    ) -> Result<Self> {
        let mut s = OutboxSummary {
            as_of,
            oldest_retry_eligible,
            ..OutboxSummary::default()
        };
        for (status, n) in counts {
            let status: OutboxStatus = status
                .parse()
                .map_err(|e| Error::storage("undecodable outbox row status in the journal", e))?;
            *s.count_mut(status) = u64::try_from(n).unwrap_or(0);
        }
        Ok(s)
    }

    fn count_mut(&mut self, status: OutboxStatus) -> &mut u64 {
        match status {
            OutboxStatus::Pending => &mut self.pending,
            OutboxStatus::Processing => &mut self.processing,
            OutboxStatus::Failed => &mut self.failed,
            OutboxStatus::Dead => &mut self.dead,
        }
    }

    /// The count for one status.
    pub fn count(&self, status: OutboxStatus) -> u64 {
        match status {
            OutboxStatus::Pending => self.pending,
            OutboxStatus::Processing => self.processing,
            OutboxStatus::Failed => self.failed,
            OutboxStatus::Dead => self.dead,
        }
    }
}

/// A stream lease: who may work on a stream, until when.
///
/// The epoch grows by one on every change of owner, so a stale holder can be
/// told apart from the current one even if it reuses its owner id. A lease
/// may also be a partition's (see [`Lease::partition`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Lease {
    /// The stream.
    pub stream: StreamId,
    /// The holder.
    pub owner: WorkerId,
    /// Grows on every takeover.
    pub epoch: u64,
    /// When the lease expires, by the store's clock.
    pub expires_at: Timestamp,
    /// Set when the stream was claimed inside a leased partition
    /// ([`PartitionStore::claim_partitioned`](crate::PartitionStore::claim_partitioned)):
    /// the lease is then the partition's (its `epoch` and `expires_at` are
    /// the partition lease's) and no stream lease exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<Partition>,
}

/// `r`, with a lost lease read as "nothing": what the fused calls of
/// [`OutboxQueue`](crate::OutboxQueue) do with the claim or the abandon
/// that follows a completion (the completion stands; a lease that is no
/// longer current claims and abandons nothing).
pub fn unless_lease_lost<T: Default>(r: Result<T>) -> Result<T> {
    match r {
        Err(Error::LeaseLost { .. }) => Ok(T::default()),
        other => other,
    }
}

impl Lease {
    /// The lease of a run of `stream` claimed inside `partition`, whose
    /// lease `owner` holds at `epoch`; the claim holds the stream until
    /// `expires_at` ([`PartitionStore::claim_partitioned`](crate::PartitionStore::claim_partitioned)).
    pub fn in_partition(
        stream: StreamId,
        owner: &WorkerId,
        partition: Partition,
        epoch: u64,
        expires_at: Timestamp,
    ) -> Lease {
        Lease {
            stream,
            owner: owner.clone(),
            epoch,
            expires_at,
            partition: Some(partition),
        }
    }

    /// The [`Error::LeaseLost`] for this lease.
    pub fn lost(&self) -> Error {
        Error::LeaseLost {
            stream: self.stream.clone(),
            owner: self.owner.to_string(),
            epoch: self.epoch,
        }
    }
}

/// How much one sweep
/// ([`Take::Due`] of [`OutboxQueue::take`](crate::OutboxQueue::take))
/// takes: at most `streams` streams, at most `per_stream` rows of each, at
/// most `rows` in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SweepLimits {
    /// Streams leased at most.
    pub streams: usize,
    /// Rows claimed of each stream at most (its head run).
    pub per_stream: usize,
    /// Rows claimed in all at most.
    pub rows: usize,
}

impl SweepLimits {
    /// Checks every limit is at least 1 and caps each at
    /// [`MAX_PAGE`](crate::MAX_PAGE).
    pub fn validated(self) -> Result<SweepLimits> {
        let cap = |n: usize, what: &str| {
            validate_limit(n, MAX_PAGE)
                .map_err(|_| Error::invalid(format!("sweep limit `{what}` must be at least 1")))
        };
        Ok(SweepLimits {
            streams: cap(self.streams, "streams")?,
            per_stream: cap(self.per_stream, "per_stream")?,
            rows: cap(self.rows, "rows")?,
        })
    }
}

/// The end of one stream's pass, as
/// [`OutboxQueue::finish`](crate::OutboxQueue::finish) takes it: complete through `through` (if any), abandon what is still
/// `processing` (if `abandon`), release the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamEnd {
    /// The lease the pass held.
    pub lease: Lease,
    /// The last applied seq to complete through.
    pub through: Option<Seq>,
    /// Whether claimed rows may still be `processing`.
    pub abandon: bool,
}

/// What [`OutboxQueue::take`](crate::OutboxQueue::take) leases and claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take<'a> {
    /// The due streams within the limits: the start of a sweep.
    Due(SweepLimits),
    /// One stream's head run of at most `max` rows: the start of a stream pass.
    Stream {
        /// The stream.
        stream: &'a StreamId,
        /// The most rows claimed.
        max: usize,
    },
}

/// A run a pass leased and claimed, with its events when the claim read
/// them
/// ([`OutboxQueue::take`](crate::OutboxQueue::take),
/// [`PartitionStore::claim_and_load_partitioned`](crate::PartitionStore::claim_and_load_partitioned)).
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimedRun {
    /// The stream's lease.
    pub lease: Lease,
    /// The claimed rows, in seq order (never empty, except for a
    /// [`Take::Stream`] that found nothing due).
    pub rows: Vec<OutboxRow>,
    /// What the journal holds for `rows`, as
    /// [`EventJournal::read_runs`](crate::EventJournal::read_runs) returns
    /// it for the run, or `None` when the claim did not read it (the
    /// caller does).
    pub events: Option<Vec<Event>>,
}

impl ClaimedRun {
    /// Claimed runs whose events are left to the caller to read.
    pub fn unloaded(taken: Vec<(Lease, Vec<OutboxRow>)>) -> Vec<ClaimedRun> {
        taken
            .into_iter()
            .map(|(lease, rows)| ClaimedRun {
                lease,
                rows,
                events: None,
            })
            .collect()
    }
}

/// The shortest lease accepted.
pub const MIN_LEASE_TTL: Duration = Duration::from_millis(10);
/// The longest lease accepted.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(86_400);

/// Rejects a lease TTL outside [`MIN_LEASE_TTL`]`..=`[`MAX_LEASE_TTL`].
pub fn validate_ttl(ttl: Duration) -> Result<()> {
    if !(MIN_LEASE_TTL..=MAX_LEASE_TTL).contains(&ttl) {
        return Err(Error::invalid(format_args!(
            "lease ttl {ttl:?} is outside {MIN_LEASE_TTL:?}..={MAX_LEASE_TTL:?}"
        )));
    }
    Ok(())
}

/// Rejects a zero limit and caps the rest at `max`.
pub fn validate_limit(limit: usize, max: usize) -> Result<usize> {
    if limit == 0 {
        return Err(Error::invalid("limit must be at least 1"));
    }
    Ok(limit.min(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_from_counts() {
        let s = OutboxSummary::from_counts(
            Timestamp::EPOCH,
            None,
            [
                ("pending".to_string(), 3),
                ("dead".to_string(), 1),
                ("failed".to_string(), -1),
            ],
        )
        .unwrap();
        assert_eq!(
            (s.pending, s.processing, s.failed, s.dead, s.total()),
            (3, 0, 0, 1, 4)
        );
        assert!(OutboxSummary::from_counts(Timestamp::EPOCH, None, [("done".to_string(), 1)]).is_err());
    }

    #[test]
    fn status_round_trips() {
        for s in OutboxStatus::ALL {
            assert_eq!(s.as_str().parse::<OutboxStatus>().unwrap(), s);
        }
        assert!("done".parse::<OutboxStatus>().is_err());
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        let s = "é".repeat(MAX_ERROR_LEN);
        let t = truncate_error(&s);
        assert!(t.len() <= MAX_ERROR_LEN && t.len() >= MAX_ERROR_LEN - 1);
        assert_eq!(truncate_error("short"), "short");
    }

    #[test]
    fn ttl_and_limit_validation() {
        assert!(validate_ttl(Duration::ZERO).is_err());
        assert!(validate_ttl(Duration::from_secs(30)).is_ok());
        assert!(validate_ttl(Duration::from_secs(86_401)).is_err());
        assert!(validate_limit(0, 10).is_err());
        assert_eq!(validate_limit(50, 10).unwrap(), 10);
    }
}
