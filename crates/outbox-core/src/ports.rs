//! The ports: what every adapter implements.
//!
//! One journal database holds [`EventJournal`], [`OutboxQueue`],
//! [`DeadLetters`], [`OutboxInspector`], [`LeaseStore`], [`LeaseAdmin`] and
//! [`WorkerRegistry`]
//! (an append and its outbox rows must share a transaction); one projection
//! database holds [`ProjectionStore`], [`WatermarkStore`], [`ViewStore`] and
//! [`RunStore`] (a projection's writes, its checkpoints and the watermark must
//! share a transaction). Whether the two may be the same database is the adapter's
//! choice (SQLite keeps two files and refuses to mix them; Postgres allows
//! either): exactly-once never relies on them committing together (see
//! `docs/architecture.md`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::tx::ApplyTx;
use crate::{
    AppendOptions, AppendRequest, Appended, ApplyOutcome, ClaimedRun, Digest, Event, FailureOutcome, Lease,
    OutboxRow, OutboxStatus, OutboxSummary, Projection, ProjectionName, Result, RetryPolicy, Seq, StreamEnd,
    StreamId, StreamVersion, Watermark, WorkerId,
};

/// The event journal: append-only streams of events.
///
/// # Contract
/// `append`:
/// - Validates the whole batch with [`AppendOptions::validate`] first; an
///   invalid batch is [`Error::InvalidInput`](crate::Error::InvalidInput) and
///   writes nothing.
/// - Writes every request of the batch in ONE transaction: all of it commits
///   or none of it does. Requests are applied in order, so two requests for
///   the same stream see each other.
/// - Checks each request's expected version against the stream's current
///   last seq; a mismatch is [`Error::Conflict`](crate::Error::Conflict) and
///   the whole batch writes nothing.
/// - Gives the events seqs `last + 1, last + 2, ...`: contiguous, no holes,
///   ever (not even after a failed append).
/// - With [`AppendOptions::enqueues`], inserts one `pending` outbox row per
///   event, due now, in the same transaction. Without it, inserts none.
/// - Stamps `recorded_at` with the store's clock and a `global_position`
///   that is unique and increasing within the journal.
///
/// `load`:
/// - Returns the event as appended (payload bytes, type, intent, metadata,
///   hash); [`Error::NotFound`](crate::Error::NotFound) for an unknown stream
///   or seq; [`Error::Corrupt`](crate::Error::Corrupt) if the stored payload
///   does not match its hash.
///
/// `read_stream`:
/// - Returns up to `limit` events of the stream with seq `>= from`, in seq
///   order; an empty vector past the end or for an unknown stream;
///   [`Error::Corrupt`](crate::Error::Corrupt) if a stored payload does not
///   match its hash.
///
/// `read_runs`:
/// - `read_stream` for each `(stream, from, limit)`, one vector per request
///   in the order given, in one read where the adapter can.
///
/// `read_global`:
/// - Returns up to `limit` events of any streams with `global_position >
///   after`, in global-position order (so each stream's events in seq
///   order); an empty vector past the end;
///   [`Error::Corrupt`](crate::Error::Corrupt) if a stored payload does not
///   match its hash.
/// - Costs an index seek on the global position, not a scan of what lies
///   before `after`.
/// - Sees what had committed when it read. On a database whose positions
///   are handed out before commit (Postgres), a transaction still in flight
///   may later commit an event *below* the last position returned: a cursor
///   over positions is not a promise that nothing will appear behind it (the
///   per-stream checkpoint, not a position, is the truth; ADR 0020).
///
/// `stream_version`:
/// - Returns the stream's version (its last seq), 0 for a stream with no events.
///
/// `stream_versions`:
/// - Pages through every stream with events and its version, ordered by
///   stream id, starting strictly after `after`, at most `limit` per page.
pub trait EventJournal: Send + Sync {
    /// Appends a batch of requests in one transaction.
    fn append(
        &self,
        batch: &[AppendRequest],
        options: AppendOptions,
    ) -> impl Future<Output = Result<Vec<Appended>>> + Send;

    /// Loads one event.
    fn load(&self, stream: &StreamId, seq: Seq) -> impl Future<Output = Result<Event>> + Send;

    /// Reads a range of one stream.
    fn read_stream(
        &self,
        stream: &StreamId,
        from: Seq,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Event>>> + Send;

    /// Reads ranges of several streams (one read where the adapter can).
    /// The default calls `read_stream` for each.
    fn read_runs(
        &self,
        runs: &[(StreamId, Seq, usize)],
    ) -> impl Future<Output = Result<Vec<Vec<Event>>>> + Send {
        async move {
            let mut out = Vec::with_capacity(runs.len());
            for (stream, from, limit) in runs {
                out.push(self.read_stream(stream, *from, *limit).await?);
            }
            Ok(out)
        }
    }

    /// Events of every stream after a global position, in global-position order.
    fn read_global(&self, after: u64, limit: usize) -> impl Future<Output = Result<Vec<Event>>> + Send;

    /// The stream's version: its last seq (0 when empty).
    fn stream_version(&self, stream: &StreamId) -> impl Future<Output = Result<u64>> + Send;

    /// A page of streams and their versions.
    fn stream_versions(
        &self,
        after: Option<&StreamId>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StreamVersion>>> + Send;
}

/// The outbox's worker protocol: one pointer row per event not yet known to
/// be applied, and what a worker does with them.
///
/// The *head* of a stream is its outstanding row with the lowest seq. Only the
/// head is ever processable: a failed or dead head blocks the rows behind it
/// (head-of-line blocking per stream), while other streams flow.
///
/// # Contract
/// `due_streams`:
/// - Returns up to `limit` streams whose head is not dead, is due
///   (`next_attempt_at <= now` by the store's clock), and whose lease is free
///   or expired, oldest due first. Never a stream whose head is dead or
///   not yet due. A `processing` head whose lease expired is due again.
/// - Costs an index seek, not a scan of the backlog.
///
/// `claim`:
/// - Requires `lease` to be the stream's current, unexpired lease (same
///   owner and epoch); otherwise [`Error::LeaseLost`](crate::Error::LeaseLost)
///   and nothing changes.
/// - Marks `processing` and returns the head and the rows right behind it
///   (contiguous seqs, at most `max`) that are due, in seq order. Returns an
///   empty vector if the head is dead or not due (or there are no rows).
/// - Re-claiming rows already `processing` (after a takeover) is allowed:
///   the claimer before stopped without completing, failing or abandoning
///   them (a crash, a kill, a stall past its lease). Such a head, and any
///   [`alone`](crate::OutboxRow::alone) head, is claimed **by itself** (a
///   run of one row); a row behind the head that is `processing` or `alone`
///   ends the run before it. A `processing` head becomes `alone` for good
///   (until completed or requeued). Blame goes only where it is known
///   (ADR 0029):
///   - no attempt is counted for a head whose claim shared it with other
///     rows or whose apply never began: nobody can tell which row ended it;
///   - a head whose attempt of its own began (`begin_attempt`) and never
///     ended is reported: its `last_error` becomes
///     [`UNFINISHED_ATTEMPT`](crate::UNFINISHED_ATTEMPT) (and
///     `first_failed_at` is set if unset), its `attempt_count` is left
///     alone, and the claimer records the attempt with `fail`
///     ([`OutboxRow::ended_unfinished`](crate::OutboxRow::ended_unfinished)),
///     so it counts exactly once and dead-letters at the threshold like any
///     failure.
/// - A claim also clears a `begin_attempt` mark it finds on a row.
/// - Of two claimers presenting different leases, at most one succeeds.
///
/// `complete`:
/// - Deletes every row of the stream with seq `<= through`, whatever its
///   status (the projection checkpoint is the truth; the row is a hint) and
///   returns how many. Idempotent; needs no lease.
///
/// `complete_and_claim`:
/// - `complete(lease.stream, through)`, then, while the lease is still the
///   stream's current one, `claim(lease, max)`: the batch loop's step, in
///   one transaction (one commit). Returns the rows completed and the rows
///   claimed; the claimed rows are empty when nothing is due or the lease
///   is no longer valid (the completion stands either way: it needs no
///   lease).
///
/// `take` (for adapters that are also a [`LeaseStore`]): the start of
/// passes, in one transaction:
/// - [`Take::Stream`](crate::Take::Stream): `acquire(stream, owner, ttl)`,
///   then `claim` under the lease (at most `max` rows). Returns nothing when
///   another owner holds the lease; otherwise the one run, **even when it
///   is empty** (the caller then releases the lease with `finish`).
/// - [`Take::Due`](crate::Take::Due): reads the due streams (as
///   `due_streams`, oldest due first), acquires each free lease and claims
///   that stream's head run (at most `limits.per_stream` rows), until
///   `limits.streams` streams or `limits.rows` rows in all are taken. A
///   stream whose lease another owner holds is skipped; a stream whose run
///   comes back empty is released and left out. Returns the runs in the
///   order taken.
/// - A run's `events`, when `Some`, are what `read_runs` returns for its
///   rows (read with the claim or right after its commit: events never
///   change once appended). An adapter may leave any run unread (`None`);
///   the worker reads it.
/// - On an error nothing stays leased by this call.
///
/// `finish`: the end of passes, in one transaction, for each
/// [`StreamEnd`](crate::StreamEnd) in order:
/// - `complete(lease.stream, through)` when `through` is given;
/// - when `abandon` is set and the lease is still current, the stream's
///   `processing` rows go back to `pending` (attempt counts and
///   `next_attempt_at` unchanged: they were due when claimed), so they are
///   due at once;
/// - `release(lease)`.
///
/// Returns the rows completed in all. A lease that is no longer current is
/// not an error: its abandon and release change nothing (the completion
/// stands).
///
/// `fail`:
/// - Requires the current lease (else `LeaseLost`) and a `processing` row at
///   `seq` (else [`Error::NotFound`](crate::Error::NotFound) or
///   [`Error::InvalidState`](crate::Error::InvalidState)).
/// - Increments `attempt_count`, stores the message (cut to
///   [`MAX_ERROR_LEN`](crate::MAX_ERROR_LEN)); when `policy` decides
///   dead-letter the row becomes `dead`, else `failed` and due at
///   `now + policy.delay(attempt)` by the store's clock.
///
/// `enqueue_catch_up`:
/// - When the stream has events and no outbox row for its last event,
///   inserts one `pending` row for it (due now by the store's clock, in the
///   stream's partition, not `alone`; the stream's head when it has no other
///   row) and returns `true`; otherwise (that row exists, or the stream has
///   no events) changes nothing and returns `false`. Rows below it stay as
///   they are; a claim's run stops at the hole before it. Start-up repair hands a stream whose projections
///   are behind to the worker this way, so that catching it up is an
///   attempt of that row: counted, retried and dead-lettered like any
///   other (ADR 0029).
///
/// `begin_attempt`:
/// - Requires the current lease (else `LeaseLost`) and a `processing`,
///   `alone` row at `seq` (else `NotFound` or `InvalidState`); marks that an
///   attempt of its own begins now: if the row is still `processing` when
///   a later claim takes it, that claim reports the attempt (see `claim`).
///   Nothing else changes. A worker calls it right before it applies a row
///   that is `alone`, and applies nothing else until that row's attempt
///   ends.
///
pub trait OutboxQueue: Send + Sync {
    /// Streams with a due head and a free lease.
    fn due_streams(&self, limit: usize) -> impl Future<Output = Result<Vec<StreamId>>> + Send;

    /// Leases streams and claims their head runs: the start of passes.
    fn take(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        what: crate::Take<'_>,
    ) -> impl Future<Output = Result<Vec<ClaimedRun>>> + Send;

    /// Claims the due head run of the lease's stream.
    fn claim(&self, lease: &Lease, max: usize) -> impl Future<Output = Result<Vec<OutboxRow>>> + Send;

    /// Completes through `through` and claims the next run under `lease`.
    fn complete_and_claim(
        &self,
        lease: &Lease,
        through: Seq,
        max: usize,
    ) -> impl Future<Output = Result<(u64, Vec<OutboxRow>)>> + Send;

    /// Deletes the stream's rows up to `through`.
    fn complete(&self, stream: &StreamId, through: Seq) -> impl Future<Output = Result<u64>> + Send;

    /// Ends passes: completes, abandons and releases.
    fn finish(&self, ends: &[StreamEnd]) -> impl Future<Output = Result<u64>> + Send;

    /// Records a failure of the processing row at `seq`.
    fn fail(
        &self,
        lease: &Lease,
        seq: Seq,
        error: &str,
        policy: &RetryPolicy,
    ) -> impl Future<Output = Result<FailureOutcome>> + Send;

    /// Puts a row at a stream's last event when it has none there.
    fn enqueue_catch_up(&self, stream: &StreamId) -> impl Future<Output = Result<bool>> + Send;

    /// Marks the start of an attempt of an `alone` row's own.
    fn begin_attempt(&self, lease: &Lease, seq: Seq) -> impl Future<Output = Result<()>> + Send;
}

/// Compositions of the [`OutboxQueue`] primitives, for every queue: what a
/// caller writes more than once, written once (the port stays narrow).
pub trait OutboxQueueExt: OutboxQueue {
    /// Acquires the stream's lease and claims its head run
    /// ([`Take::Stream`](crate::Take::Stream)): `None` when another owner
    /// holds the lease.
    fn acquire_and_claim(
        &self,
        stream: &StreamId,
        owner: &WorkerId,
        ttl: Duration,
        max: usize,
    ) -> impl Future<Output = Result<Option<(Lease, Vec<OutboxRow>)>>> + Send {
        async move {
            let taken = self.take(owner, ttl, crate::Take::Stream { stream, max }).await?;
            Ok(taken.into_iter().next().map(|run| (run.lease, run.rows)))
        }
    }

    /// Ends one pass ([`OutboxQueue::finish`] of one [`StreamEnd`]).
    fn complete_and_release(
        &self,
        lease: &Lease,
        through: Option<Seq>,
        abandon: bool,
    ) -> impl Future<Output = Result<u64>> + Send {
        async move {
            let end = StreamEnd {
                lease: lease.clone(),
                through,
                abandon,
            };
            self.finish(std::slice::from_ref(&end)).await
        }
    }
}

impl<Q: OutboxQueue + ?Sized> OutboxQueueExt for Q {}

/// Dead-letter administration: what an operator does with parked rows.
///
/// # Contract
/// `requeue`:
/// - Turns one `dead` row into `pending`, attempt count 0, due now, error
///   cleared. [`Error::NotFound`](crate::Error::NotFound) if there is no such
///   row; [`Error::InvalidState`](crate::Error::InvalidState) if it is not
///   dead (nothing changes).
///
/// `requeue_dead`:
/// - Requeues up to `limit` dead rows, oldest first by
///   (`next_attempt_at`, stream, seq), and returns them as they now are.
///
/// `retry`:
/// - Makes one `failed` or `pending` row due now by the store's clock: a
///   `failed` row becomes `pending`; its attempt count and last error are
///   kept; a row already due keeps its earlier due time. If the row is its
///   stream's head, the stream is due at once. Returns the row as it now is.
/// - [`Error::NotFound`](crate::Error::NotFound) if there is no such row;
///   [`Error::InvalidState`](crate::Error::InvalidState) for a `dead` row
///   (that is what `requeue` is for) or a `processing` one (a worker holds
///   it); nothing changes.
pub trait DeadLetters: Send + Sync {
    /// Requeues one dead row.
    fn requeue(&self, stream: &StreamId, seq: Seq) -> impl Future<Output = Result<OutboxRow>> + Send;

    /// Makes one failed or pending row due now, keeping its attempt count.
    fn retry(&self, stream: &StreamId, seq: Seq) -> impl Future<Output = Result<OutboxRow>> + Send;

    /// Requeues up to `limit` dead rows, oldest first.
    fn requeue_dead(&self, limit: usize) -> impl Future<Output = Result<Vec<OutboxRow>>> + Send;
}

/// Read-only inspection of the outbox and its leases, for operators and
/// reports. Changes nothing.
///
/// # Contract
/// - `row` returns one row or `None`.
/// - `head` returns the stream's head (its outstanding row with the lowest
///   seq, whatever its status) or `None` when the stream has no row.
/// - `summary` counts rows by status and names the pending-or-failed row with
///   the earliest `next_attempt_at`, all in one snapshot, with the store's
///   `now` as `as_of`.
/// - `list` returns up to `limit` rows (optionally of one status) ordered by
///   (`next_attempt_at`, stream, seq).
/// - `lease` returns the stream's lease as last granted (possibly expired:
///   compare `expires_at`), or `None` if it was never leased or was released.
/// - `leases` pages through the leases that have an owner (expired ones
///   included, each marked by the store's clock; released ones left out),
///   ordered by stream id, strictly after `after`, at most `limit` per page.
pub trait OutboxInspector: Send + Sync {
    /// One row.
    fn row(&self, stream: &StreamId, seq: Seq) -> impl Future<Output = Result<Option<OutboxRow>>> + Send;

    /// The stream's head row, if it has rows.
    fn head(&self, stream: &StreamId) -> impl Future<Output = Result<Option<OutboxRow>>> + Send;

    /// Counts by status and the oldest retry-eligible row.
    fn summary(&self) -> impl Future<Output = Result<OutboxSummary>> + Send;

    /// Rows, optionally of one status.
    fn list(
        &self,
        status: Option<OutboxStatus>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<OutboxRow>>> + Send;

    /// The stream's lease as last granted.
    fn lease(&self, stream: &StreamId) -> impl Future<Output = Result<Option<Lease>>> + Send;

    /// A page of held (possibly expired) leases, by stream.
    fn leases(
        &self,
        after: Option<&StreamId>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<LeaseEntry>>> + Send;
}

/// A stream lease as [`OutboxInspector::leases`] lists it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LeaseEntry {
    /// The lease as last granted.
    #[serde(flatten)]
    pub lease: Lease,
    /// Whether it has expired, by the store's clock when it was listed.
    pub expired: bool,
}

/// Lease administration: what an operator does with a stuck lease. Workers
/// never call it (they use [`LeaseStore`]).
///
/// # Contract
/// `break_lease`:
/// - Frees the stream's lease whoever holds it, expired or not, as a
///   `release` by its holder would: the epoch is kept, so the next `acquire`
///   gets epoch + 1 and the old holder's `renew`, `claim` and `fail` fail
///   with [`Error::LeaseLost`](crate::Error::LeaseLost) (its `finish`
///   abandons and releases nothing).
///   Returns the lease as it was before.
/// - Returns `None` and changes nothing when the stream has no held lease
///   (never leased, or released).
/// - Outbox rows are not touched: rows the old holder left `processing` are
///   due again at once (see [`OutboxQueue::due_streams`]).
pub trait LeaseAdmin: Send + Sync {
    /// Frees the stream's lease, whoever holds it.
    fn break_lease(&self, stream: &StreamId) -> impl Future<Output = Result<Option<Lease>>> + Send;
}

/// Stream leases: who may work on a stream. Leases make work efficient; the
/// projection checkpoint makes it safe.
///
/// # Contract
/// - `acquire` succeeds when the stream has no lease, or its lease expired or
///   was released (then the epoch becomes the previous epoch + 1; the first
///   epoch is 1), or `owner` already holds it (then only the expiry moves).
///   It returns `None` while another owner holds an unexpired lease.
/// - Expiry is judged by the store's clock, never the caller's.
/// - `renew` extends an unexpired lease held by the same owner and epoch to
///   `now + ttl`; otherwise [`Error::LeaseLost`](crate::Error::LeaseLost).
/// - `release` frees the lease if the same owner and epoch still hold it and
///   returns whether it did; releasing a lost lease is not an error.
/// - Epochs never decrease for a stream, including across release.
/// - A `ttl` outside [`MIN_LEASE_TTL`](crate::MIN_LEASE_TTL)..=[`MAX_LEASE_TTL`](crate::MAX_LEASE_TTL)
///   is [`Error::InvalidInput`](crate::Error::InvalidInput).
pub trait LeaseStore: Send + Sync {
    /// Takes the stream's lease for `owner`.
    fn acquire(
        &self,
        stream: &StreamId,
        owner: &WorkerId,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Lease>>> + Send;

    /// Extends a held lease.
    fn renew(&self, lease: &Lease, ttl: Duration) -> impl Future<Output = Result<Lease>> + Send;

    /// Frees a held lease.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<bool>> + Send;
}

/// The projection database: checkpoints and the user's projection tables.
///
/// # Contract
/// `apply`:
/// - Runs ONE transaction. For every projection given, reads its checkpoint
///   for the stream and plans with [`plan_apply`](crate::spi::plan_apply): events
///   at or below the checkpoint are skipped as duplicates; if the first new
///   event is not `checkpoint + 1` the transaction writes nothing and the
///   call returns [`ApplyOutcome::Gap`].
/// - Calls `Projection::apply` for each new [`Intent::Apply`](crate::Intent)
///   event in seq order; audit-only events advance the checkpoint without
///   calling the applier.
/// - Advances each checkpoint that is below the run's last seq to that seq
///   with a compare-and-set against the value it read (a checkpoint already
///   beyond the run is left as it is), and raises the stream's watermark to
///   the run's last seq, in the same transaction.
/// - If an applier fails, the transaction rolls back (no projection write,
///   no checkpoint move) and the call returns
///   [`Error::Apply`](crate::Error::Apply) naming the failing event.
/// - An applier must not end the store's transaction (commit, roll back, or
///   swallow an error after which the database rolled back). If it does, the
///   store detects it, moves no checkpoint and returns a permanent
///   [`Error::Storage`](crate::Error::Storage).
/// - `events` must be a contiguous run of `stream` (see
///   [`validate_run`](crate::spi::validate_run)); otherwise `InvalidInput`.
/// - Concurrent `apply` calls for the same (projection, stream) serialize:
///   each event commits at most once.
///
/// `apply_runs`:
/// - `apply` for each run in order (runs of distinct streams, else
///   `InvalidInput` before anything is written), all in ONE transaction,
///   which commits only when every run is
///   [`ApplyOutcome::Applied`]. A run that meets a gap stops the call:
///   nothing is committed and the outcomes returned end with that run's
///   [`ApplyOutcome::Gap`]. An applier failing is
///   [`Error::Apply`](crate::Error::Apply) naming its stream and event, and
///   nothing is committed. Used by the worker's sweep over many streams.
///
/// `setup`, `reset` and `digest` report a failing projection hook as a
/// permanent [`Error::Storage`](crate::Error::Storage) naming the projection.
///
/// `checkpoint` returns the last applied seq (0 when none).
/// `reset` runs `Projection::reset` and deletes the projection's checkpoints
/// in one transaction. `digest` hashes the projection's state (its rows, via
/// `Projection::digest`, and its checkpoints). `setup` runs every
/// projection's `setup` (idempotent).
pub trait ProjectionStore: Send + Sync {
    /// The transaction-scoped handle appliers write through. It stores the
    /// documents of [`ViewProjection`](crate::ViewProjection)s, so a
    /// projection written once runs on every adapter.
    type Tx: ApplyTx + 'static;

    /// Creates every projection's tables.
    fn setup(&self, projections: &[Arc<dyn Projection<Self::Tx>>])
    -> impl Future<Output = Result<()>> + Send;

    /// Applies a contiguous run of one stream exactly once.
    fn apply(
        &self,
        stream: &StreamId,
        events: &[Event],
        projections: &[Arc<dyn Projection<Self::Tx>>],
    ) -> impl Future<Output = Result<ApplyOutcome>> + Send;

    /// Applies runs of several streams in one transaction: each exactly
    /// once, committed together or not at all.
    fn apply_runs(
        &self,
        runs: &[&[Event]],
        projections: &[Arc<dyn Projection<Self::Tx>>],
    ) -> impl Future<Output = Result<Vec<ApplyOutcome>>> + Send;

    /// The projection's checkpoint for the stream.
    fn checkpoint(
        &self,
        projection: &ProjectionName,
        stream: &StreamId,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Clears the projection and its checkpoints.
    fn reset(&self, projection: &dyn Projection<Self::Tx>) -> impl Future<Output = Result<()>> + Send;

    /// Hashes the projection's state and checkpoints.
    fn digest(&self, projection: &dyn Projection<Self::Tx>) -> impl Future<Output = Result<Digest>> + Send;
}

/// Watermarks: per stream, the highest seq the apply path committed.
///
/// Watermarks are raised by [`ProjectionStore::apply`] in its transaction
/// and never lowered.
///
/// # Contract
/// - `watermark` returns `None` for a stream never applied.
/// - `watermarks` pages through watermarks ordered by stream id, strictly
///   after `after`, at most `limit` per page.
pub trait WatermarkStore: Send + Sync {
    /// One stream's watermark.
    fn watermark(&self, stream: &StreamId) -> impl Future<Output = Result<Option<Watermark>>> + Send;

    /// A page of watermarks.
    fn watermarks(
        &self,
        after: Option<&StreamId>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Watermark>>> + Send;
}

/// A running worker as registered in the journal database.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WorkerInfo {
    /// The worker's id (also the owner on its leases).
    pub id: WorkerId,
    /// The host it runs on.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The mode it runs in.
    pub mode: crate::Mode,
    /// When it registered, by the store's clock.
    pub started_at: crate::Timestamp,
    /// Its last heartbeat, by the store's clock.
    pub last_beat: crate::Timestamp,
    /// When the entry ages out unless beaten again.
    pub expires_at: crate::Timestamp,
}

/// The refusal of [`WorkerRegistry::heartbeat`] when `held`, a live entry,
/// belongs to another (host, pid): written once so every adapter words it
/// the same way.
pub fn worker_id_held(held: &WorkerInfo) -> crate::Error {
    crate::Error::InvalidState(format!(
        "worker id `{}` is held by a live worker on host {} pid {} (registered {}, entry expires {}): give this process another OUTBOX_WORKER_ID, or stop the other one",
        held.id, held.host, held.pid, held.started_at, held.expires_at
    ))
}

/// What workers did: counts added to the current minute's bucket by
/// [`ActivityLog::record_activity`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ActivityCounts {
    /// Outbox rows completed: their events applied to the projections (or
    /// checkpointed, for audit-only events and events found applied already).
    pub applied: u64,
    /// Failures recorded (retries scheduled).
    pub failed: u64,
    /// Rows dead-lettered.
    pub dead: u64,
}

impl ActivityCounts {
    /// Whether every count is zero.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `self - earlier`, count by count (saturating): the activity between
    /// two readings of ever-growing counters.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            applied: self.applied.saturating_sub(earlier.applied),
            failed: self.failed.saturating_sub(earlier.failed),
            dead: self.dead.saturating_sub(earlier.dead),
        }
    }
}

/// One minute of every worker's activity, summed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MinuteActivity {
    /// The start of the minute, by the store's clock.
    pub minute: crate::Timestamp,
    /// What was done in it.
    #[serde(flatten)]
    pub counts: ActivityCounts,
}

/// The last minutes of activity, as [`ActivityLog::activity`] reads them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ActivitySeries {
    /// The start of the current minute, by the store's clock when read.
    pub current_minute: crate::Timestamp,
    /// The minutes that have any activity, oldest first, each within the
    /// requested window (the last of them may be the current minute).
    pub minutes: Vec<MinuteActivity>,
}

impl ActivitySeries {
    /// The window as `n` consecutive minutes ending with the current one,
    /// oldest first, the minutes without activity as zeros.
    pub fn filled(&self, n: usize) -> Vec<MinuteActivity> {
        let cur = self.current_minute.as_millis();
        (0..n as i64)
            .rev()
            .map(|back| {
                let minute =
                    crate::Timestamp::from_millis(cur.saturating_sub(back.saturating_mul(MINUTE_MS)));
                let counts = self
                    .minutes
                    .iter()
                    .find(|m| m.minute == minute)
                    .map_or_else(ActivityCounts::default, |m| m.counts);
                MinuteActivity { minute, counts }
            })
            .collect()
    }
}

/// A minute in milliseconds: the width of an activity bucket.
pub const MINUTE_MS: i64 = 60_000;

/// The most minutes [`ActivityLog::activity`] reads at once (a day).
pub const MAX_ACTIVITY_MINUTES: u32 = 1440;

/// Worker heartbeats, so operators can see who is working.
///
/// # Contract
/// - `heartbeat` inserts the worker (keeping `started_at` from the first
///   beat) or refreshes it: `last_beat = now`, `expires_at = now + ttl`, by
///   the store's clock. `ttl` outside the lease TTL range is `InvalidInput`.
/// - A worker id has one live holder: while the id's entry is unexpired (by
///   the store's clock), a `heartbeat` from another (`host`, `pid`) is
///   `InvalidState` naming the id and the holder's host and pid, and changes
///   nothing. The holder's own beats keep working. Once the entry expired or
///   was deregistered, any process may take the id.
/// - `workers` lists the entries that have not expired, ordered by id.
/// - `deregister` removes the worker's entry and returns whether it existed.
/// - `prune` deletes entries that expired `grace` or more ago
///   (`expires_at <= now - grace`) and returns how many.
/// - A heartbeat refreshes `mode` (and `host` and `pid` when it takes an
///   expired entry over), and keeps `started_at` for as long as the entry
///   exists (expired or not).
/// - On a store with an [`ActivityLog`], `prune` also deletes the activity
///   buckets whose minute ended `grace` or more ago.
pub trait WorkerRegistry: Send + Sync {
    /// Registers or refreshes a worker.
    fn heartbeat(
        &self,
        id: &WorkerId,
        host: &str,
        pid: u32,
        mode: crate::Mode,
        ttl: Duration,
    ) -> impl Future<Output = Result<WorkerInfo>> + Send;

    /// Live workers.
    fn workers(&self) -> impl Future<Output = Result<Vec<WorkerInfo>>> + Send;

    /// Removes a worker.
    fn deregister(&self, id: &WorkerId) -> impl Future<Output = Result<bool>> + Send;

    /// Deletes long-expired entries (and old activity).
    fn prune(&self, grace: Duration) -> impl Future<Output = Result<u64>> + Send;
}

/// The per-minute activity every worker contributes to, so operators can
/// see what was done (the monitor's throughput chart). An optional
/// capability (ADR 0035): the defaults keep nothing and read
/// [`Error::Unsupported`](crate::Error::Unsupported).
///
/// # Contract
/// - `record_activity` adds `counts` to the bucket of (the current minute by
///   the store's clock, `id`), creating it; empty counts write nothing.
///   Buckets are per worker, so concurrent workers never wait on each other.
/// - `activity(n)` sums the buckets of all workers per minute over the last
///   `n` minutes (the current one included), oldest first, omitting minutes
///   without buckets, and returns the current minute with them. `n` of 0 or
///   above [`MAX_ACTIVITY_MINUTES`] is `InvalidInput`.
pub trait ActivityLog: Send + Sync {
    /// Adds a worker's counts to the current minute.
    fn record_activity(
        &self,
        id: &WorkerId,
        counts: ActivityCounts,
    ) -> impl Future<Output = Result<()>> + Send {
        let _ = (id, counts);
        async { Ok(()) }
    }

    /// Every worker's activity over the last `minutes` minutes.
    fn activity(&self, minutes: u32) -> impl Future<Output = Result<ActivitySeries>> + Send {
        let _ = minutes;
        async {
            Err(crate::Error::Unsupported(
                "activity: this journal keeps no activity log".into(),
            ))
        }
    }
}

/// `InvalidInput` unless `1 <= minutes <= MAX_ACTIVITY_MINUTES`.
pub fn validate_activity_minutes(minutes: u32) -> Result<()> {
    if minutes == 0 || minutes > MAX_ACTIVITY_MINUTES {
        return Err(crate::Error::invalid(format!(
            "an activity window of {minutes} minutes is out of range (1 to {MAX_ACTIVITY_MINUTES})"
        )));
    }
    Ok(())
}

/// Optional ability: tells a worker that another process may have appended,
/// so it need not wait for its poll (Postgres LISTEN/NOTIFY, for example).
///
/// # Contract
/// - `wait` resolves after an append committed anywhere may have made work
///   due, and may also resolve spuriously; callers re-check the store.
/// - It never errors: an adapter that loses its notification channel keeps
///   trying to restore it and meanwhile resolves at most every few seconds,
///   so polling remains the fallback.
#[async_trait::async_trait]
pub trait WakeSource: Send + Sync {
    /// Resolves when work may be due.
    async fn wait(&self);
}

/// Persisted replay and rebuild runs, kept in the projection database.
///
/// # Contract
/// - `admit_bounded_run` first validates `bounds` for `kind`
///   ([`RunBounds::validate`](crate::RunBounds::validate): a rebuild takes
///   no `since`; `since` must be below `until`); invalid bounds are
///   [`Error::InvalidInput`](crate::Error::InvalidInput) and nothing
///   changes. It then records a new `queued` run for `projection` owned by
///   `owner`, with `since` and `until` as given and no `position`, with its claim expiring at `now + ttl` (store clock), unless the
///   projection already has an active (queued or running) run whose claim has
///   not expired: then [`Error::InvalidState`](crate::Error::InvalidState)
///   naming that run, and nothing changes. An active run whose claim expired
///   is marked `failed` (code `abandoned`) first. Ids are unique and
///   increasing; a refused admission consumes no id, so with no concurrent
///   admission the next admitted run's id is the last one plus one (on
///   Postgres concurrent admissions of one projection are serialized by a
///   transaction-scoped advisory lock, so the loser inserts nothing either;
///   ids are still not promised to be contiguous: a rolled-back transaction
///   consumes one). `admit_run` is `admit_bounded_run` with only `until`.
/// - `reclaim_run` marks the projection's active run `failed` (code
///   `abandoned`) when its owner is not one of `live` (the caller read the
///   worker registry: the owner is gone, expired or never registered) and
///   the run was last updated `idle` or more ago (store clock: a run just
///   admitted by a process whose first beat has not landed yet is left
///   alone), and returns it; `None` otherwise (no active run, a live owner,
///   a recent update). The runtime calls it when an admission is refused,
///   so a killed run's projection is free once its owner's registry entry
///   expired and the run has been idle that long, without waiting for the
///   run's own claim.
/// - `record_progress` is called by the owner: it moves a queued run to
///   `running`, records `processed`, the last committed (stream, seq) and
///   the global `position` committed through (each of the last two kept
///   when not given), and renews the claim; it returns the record, whose `cancel_requested` tells
///   the owner to stop. A run that is not active or not owned by `owner` is
///   `InvalidState`. `update_run` is `record_progress` without a position.
/// - `finish_run` moves an active run owned by `owner` to its terminal state
///   with the error code and message for a failure (cut to
///   [`MAX_ERROR_LEN`](crate::MAX_ERROR_LEN), a NUL replaced by U+FFFD);
///   otherwise `InvalidState`.
/// - `cancel_run` sets `cancel_requested` on an active run (a queued run is
///   cancelled at once) and returns it; `NotFound` for an unknown id,
///   `InvalidState` for a finished run.
/// - `run` returns one run or `None`; `runs` lists up to `limit`, newest first.
/// - `prune_runs` deletes the finished (completed, failed or cancelled) runs
///   last updated `older_than` or more ago (`updated_at <= now - older_than`,
///   store clock) and returns how many; active runs are never deleted, and
///   ids stay unique and increasing after a prune.
///
/// An optional capability (ADR 0035): the defaults read no runs and refuse
/// to admit one with [`Error::Unsupported`](crate::Error::Unsupported) (no
/// replay or rebuild jobs; the worker, repair and the rest run).
pub trait RunStore: Send + Sync {
    /// Admits a run with global-position bounds.
    fn admit_bounded_run(
        &self,
        kind: crate::RunKind,
        projection: &ProjectionName,
        bounds: crate::RunBounds,
        owner: &WorkerId,
        ttl: Duration,
    ) -> impl Future<Output = Result<crate::RunRecord>> + Send {
        let _ = (kind, projection, bounds, owner, ttl);
        async { no_runs() }
    }

    /// Admits a run bounded only by `until`.
    fn admit_run(
        &self,
        kind: crate::RunKind,
        projection: &ProjectionName,
        until: Option<u64>,
        owner: &WorkerId,
        ttl: Duration,
    ) -> impl Future<Output = Result<crate::RunRecord>> + Send {
        self.admit_bounded_run(
            kind,
            projection,
            crate::RunBounds::new().with_until(until),
            owner,
            ttl,
        )
    }

    /// Frees a projection whose active run's owner is gone.
    fn reclaim_run(
        &self,
        projection: &ProjectionName,
        live: &[WorkerId],
        idle: Duration,
    ) -> impl Future<Output = Result<Option<crate::RunRecord>>> + Send {
        let _ = (projection, live, idle);
        async { Ok(None) }
    }

    /// Records progress (with the global position committed through) and
    /// renews the owner's claim.
    fn record_progress(
        &self,
        id: u64,
        owner: &WorkerId,
        progress: crate::RunProgress<'_>,
        ttl: Duration,
    ) -> impl Future<Output = Result<crate::RunRecord>> + Send {
        let _ = (id, owner, progress, ttl);
        async { no_runs() }
    }

    /// Records progress without a position and renews the owner's claim.
    fn update_run(
        &self,
        id: u64,
        owner: &WorkerId,
        processed: u64,
        last: Option<(&StreamId, Seq)>,
        ttl: Duration,
    ) -> impl Future<Output = Result<crate::RunRecord>> + Send {
        let progress = crate::RunProgress {
            processed,
            last,
            position: None,
        };
        self.record_progress(id, owner, progress, ttl)
    }

    /// Ends a run.
    fn finish_run(
        &self,
        id: u64,
        owner: &WorkerId,
        end: crate::RunEnd,
    ) -> impl Future<Output = Result<crate::RunRecord>> + Send {
        let _ = (id, owner, end);
        async { no_runs() }
    }

    /// Requests cancellation.
    fn cancel_run(&self, id: u64) -> impl Future<Output = Result<crate::RunRecord>> + Send {
        let _ = id;
        async { no_runs() }
    }

    /// One run.
    fn run(&self, id: u64) -> impl Future<Output = Result<Option<crate::RunRecord>>> + Send {
        let _ = id;
        async { Ok(None) }
    }

    /// Recent runs, newest first.
    fn runs(&self, limit: usize) -> impl Future<Output = Result<Vec<crate::RunRecord>>> + Send {
        let _ = limit;
        async { Ok(Vec::new()) }
    }

    /// Deletes long-finished runs.
    fn prune_runs(&self, older_than: Duration) -> impl Future<Output = Result<u64>> + Send {
        let _ = older_than;
        async { Ok(0) }
    }
}

/// Reads the documents of [`ViewProjection`](crate::ViewProjection)s outside
/// any apply (the application's query side); used through
/// [`ViewReader`](crate::ViewReader), which validates names and decodes.
///
/// # Contract
/// - `view_get` returns the committed JSON text of (projection, table, key)
///   or `None`.
/// - `view_scan` returns up to `limit` committed documents of one table with
///   key strictly greater than `after`, ordered by key bytewise, as
///   [`ViewStorage::view_scan`](crate::spi::ViewStorage::view_scan) does inside a transaction.
/// - Each call reads one committed state; it never blocks an apply for long.
/// - `view_digests` returns the recorded running digest
///   ([`ViewDigest`](crate::ViewDigest)) of every projection that has one,
///   ordered by projection name, without reading any document: what the last
///   committed apply left. A projection never written has none (its
///   running digest is [`RunningDigest::EMPTY`](crate::RunningDigest::EMPTY));
///   a reset leaves an empty one with no `last_event`.
/// - `verify_view_digest` reads, in one snapshot, the projection's recorded
///   running digest ([`ViewDigest::empty`](crate::ViewDigest::empty) when it
///   has none) and the one a scan of every document of it gives. They are
///   equal unless the store was changed behind the adapter.
pub trait ViewStore: Send + Sync {
    /// One document.
    fn view_get(
        &self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<String>>> + Send;

    /// A page of one table, in key order.
    fn view_scan(
        &self,
        projection: &ProjectionName,
        table: &str,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, String)>>> + Send;

    /// Every recorded running digest, without a scan.
    fn view_digests(&self) -> impl Future<Output = Result<Vec<crate::ViewDigest>>> + Send;

    /// The recorded running digest of `projection` beside a full scan's.
    fn verify_view_digest(
        &self,
        projection: &ProjectionName,
    ) -> impl Future<Output = Result<crate::ViewDigestCheck>> + Send;
}

/// What a [`RunStore`] without the capability answers to a write.
fn no_runs<T>() -> Result<T> {
    Err(crate::Error::Unsupported(
        "runs: this projection store keeps no replay or rebuild runs".into(),
    ))
}
