//! The store decorator: every port call the runtime makes is bounded by a
//! deadline and counted, in one place (issue 12 item 4, issue 42 point 3).
//!
//! The runtime holds its journal and its projection store as [`Bounded`]
//! stores. [`Bounded`] implements every port the runtime's bounds name by
//! forwarding each call to the adapter through [`Guard::call`], which
//!
//! - bounds it by [`Config::store_deadline`](crate::Config::store_deadline)
//!   (a third of the lease TTL unless configured, always below it), or by
//!   [`Config::run_ttl`](crate::Config::run_ttl) for a reset that deletes a
//!   whole projection;
//! - counts it per call name: calls, temporary errors, deadline passes, time
//!   spent ([`StoreCallStats`], in [`MetricsSnapshot`](crate::MetricsSnapshot)).
//!
//! A call past its deadline is dropped and becomes a temporary
//! [`Error::Storage`] naming the call and the deadline, so the worker treats
//! it like any other infrastructure trouble: the stream's pass stops, its
//! claimed rows are abandoned and its lease released (each of those bounded
//! too, else left to expire), nothing is counted against a row, and a later
//! pass retries. An *apply* past its deadline (a projection that hangs,
//! [`stalled`]) ends like a crash instead: its rows stay `processing` for
//! the next claim to isolate, and an attempt of a row applied alone is
//! charged to it (ADR 0029).
//!
//! **Exactly-once is unaffected.** Dropping a store future drops its
//! transaction before commit, and an uncommitted transaction rolls back
//! (sqlx rolls back a dropped `Transaction`; the memory adapter's
//! transaction replays its undo log on drop). A call that had already sent
//! its commit when the deadline passed is an ambiguous commit, as after any
//! lost connection: the projection checkpoint's compare-and-set makes the
//! retry a duplicate that is skipped.
//!
//! **What is not bounded here.** A composition of ports (an
//! `OutboxQueueExt` helper, `pause_consumer`) is bounded call by call, as
//! each primitive is. The accessors [`Outbox::journal`](crate::Outbox::journal)
//! and [`Outbox::store`](crate::Outbox::store) return the adapters
//! themselves: the calls an application makes through them are its own to
//! bound. A sink's `publish` and a projection's hooks are the application's
//! code, not ports: the delivery loop bounds a publish by the lease TTL
//! itself, and a projection's apply runs inside the store's `apply`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::{
    ActivityCounts, ActivityLog, ActivitySeries, AppendOptions, AppendRequest, Appended, ApplyOutcome,
    ClaimedRun, ConsumerInfo, ConsumerKind, ConsumerRegistry, DeadLetters, Digest, Error, Event,
    EventJournal, FailureOutcome, FeedPage, GenerationInfo, GenerationStore, Lease, LeaseEntry, LeaseStore,
    OutboxInspector, OutboxQueue, OutboxRow, OutboxStatus, OutboxSummary, Partition, PartitionHandover,
    PartitionStatus, PartitionStore, PartitionSync, Partitioning, Projection, ProjectionName,
    ProjectionStore, Result, RetryPolicy, RunStore, Seq, SinkFeed, SinkName, SinkStatus, SinkStore,
    SinkStream, SinkSummary, SkippedEvent, SkippedEvents, StoredGeneration, StreamEnd, StreamId,
    StreamVersion, SwapCheck, SwapOutcome, SweepLimits, ViewStore, Watermark, WatermarkStore, WorkerId,
    WorkerInfo, WorkerRegistry,
};
use serde::Serialize;

/// A store whose every port call is bounded and counted by its [`Guard`]
/// (see the module docs).
pub(crate) struct Bounded<S> {
    inner: S,
    guard: Guard,
}

impl<S> Bounded<S> {
    pub(crate) fn new(inner: S, guard: Guard) -> Self {
        Bounded { inner, guard }
    }

    /// The adapter itself, for the calls an application makes.
    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// Which deadline bounds a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deadline {
    /// The store deadline.
    Store,
    /// The store deadline; past it the error is also [`stalled`]: the call
    /// runs projection code.
    Apply,
    /// The run TTL: a call that deletes a whole projection.
    Run,
}

/// The deadlines and the counters every [`Bounded`] call goes through.
#[derive(Clone)]
pub(crate) struct Guard {
    store: Duration,
    run: Duration,
    calls: Arc<StoreCalls>,
}

impl Guard {
    pub(crate) fn new(store: Duration, run: Duration, calls: Arc<StoreCalls>) -> Self {
        Guard { store, run, calls }
    }

    /// Runs `fut`, the port call `call`, within its deadline, and counts it.
    pub(crate) async fn call<T>(
        &self,
        call: &'static str,
        kind: Deadline,
        fut: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let limit = match kind {
            Deadline::Run => self.run,
            Deadline::Store | Deadline::Apply => self.store,
        };
        let started = Instant::now();
        let (result, timed_out) = match tokio::time::timeout(limit, fut).await {
            Ok(result) => (result, false),
            Err(elapsed) => {
                let what =
                    format_args!("store call `{call}` did not finish within the store deadline of {limit:?}");
                let error = match kind {
                    Deadline::Apply => Error::temporary(what, ApplyStalled),
                    Deadline::Store | Deadline::Run => Error::temporary(what, elapsed),
                };
                (Err(error), true)
            }
        };
        let temporary = result.as_ref().is_err_and(Error::is_temporary);
        self.calls.record(call, started.elapsed(), temporary, timed_out);
        result
    }
}

/// The source of a worker's apply that passed its deadline.
#[derive(Debug)]
struct ApplyStalled;

impl std::fmt::Display for ApplyStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the projection apply did not finish in time")
    }
}

impl std::error::Error for ApplyStalled {}

/// Whether `error` is an apply (a call that runs projection code) that did
/// not finish within its deadline: the worker ends the attempt as a crash
/// would end it. Its rows stay `processing` for the next claim to isolate,
/// and an attempt of a row applied alone is charged to it (ADR 0029), so a
/// projection that hangs on one event dead-letters it instead of retrying
/// it forever. Every other call past its deadline is a plain temporary
/// error.
pub(crate) fn stalled(error: &Error) -> bool {
    error.is_temporary() && std::error::Error::source(error).is_some_and(|s| s.is::<ApplyStalled>())
}

/// One store call's counters since the runtime was built.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StoreCallStats {
    /// The port method, as the ports name it (`claim`, `apply_runs`, ...).
    pub call: &'static str,
    /// Calls made.
    pub calls: u64,
    /// Calls that ended in a temporary error (the database unreachable,
    /// busy, or the deadline passed): infrastructure trouble, not answers
    /// such as "not found".
    pub temporary_errors: u64,
    /// Calls dropped at their deadline (counted in `temporary_errors` too).
    pub timeouts: u64,
    /// Time spent in the calls, in microseconds.
    pub total_us: u64,
    /// The slowest call, in microseconds.
    pub max_us: u64,
}

/// The counters of every store call, by call name.
#[derive(Debug, Default)]
pub(crate) struct StoreCalls {
    by_call: Mutex<BTreeMap<&'static str, StoreCallStats>>,
}

impl StoreCalls {
    fn record(&self, call: &'static str, took: Duration, temporary: bool, timed_out: bool) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        // A poisoned lock only means a panic elsewhere while counting: the
        // counters stay usable.
        let mut by_call = self.by_call.lock().unwrap_or_else(|p| p.into_inner());
        let s = by_call.entry(call).or_insert_with(|| StoreCallStats {
            call,
            ..StoreCallStats::default()
        });
        s.calls += 1;
        s.temporary_errors += u64::from(temporary);
        s.timeouts += u64::from(timed_out);
        s.total_us = s.total_us.saturating_add(us);
        s.max_us = s.max_us.max(us);
    }

    /// Every call's counters, by call name.
    pub(crate) fn snapshot(&self) -> Vec<StoreCallStats> {
        let by_call = self.by_call.lock().unwrap_or_else(|p| p.into_inner());
        by_call.values().cloned().collect()
    }
}

// The ports, forwarded. Every method is forwarded, those with a default
// body too, so an adapter's own implementation is the one that runs.

impl<S: EventJournal> EventJournal for Bounded<S> {
    fn append(
        &self,
        batch: &[AppendRequest],
        options: AppendOptions,
    ) -> impl Future<Output = Result<Vec<Appended>>> + Send {
        self.guard
            .call("append", Deadline::Store, self.inner.append(batch, options))
    }

    fn load(&self, stream: &StreamId, seq: Seq) -> impl Future<Output = Result<Event>> + Send {
        self.guard
            .call("load", Deadline::Store, self.inner.load(stream, seq))
    }

    fn read_stream(
        &self,
        stream: &StreamId,
        from: Seq,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Event>>> + Send {
        self.guard.call(
            "read_stream",
            Deadline::Store,
            self.inner.read_stream(stream, from, limit),
        )
    }

    fn read_runs(
        &self,
        runs: &[(StreamId, Seq, usize)],
    ) -> impl Future<Output = Result<Vec<Vec<Event>>>> + Send {
        self.guard
            .call("read_runs", Deadline::Store, self.inner.read_runs(runs))
    }

    fn read_global(&self, after: u64, limit: usize) -> impl Future<Output = Result<Vec<Event>>> + Send {
        self.guard.call(
            "read_global",
            Deadline::Store,
            self.inner.read_global(after, limit),
        )
    }

    fn stream_version(&self, stream: &StreamId) -> impl Future<Output = Result<u64>> + Send {
        self.guard.call(
            "stream_version",
            Deadline::Store,
            self.inner.stream_version(stream),
        )
    }

    fn stream_versions(
        &self,
        after: Option<&StreamId>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StreamVersion>>> + Send {
        self.guard.call(
            "stream_versions",
            Deadline::Store,
            self.inner.stream_versions(after, limit),
        )
    }
}

impl<S: OutboxQueue> OutboxQueue for Bounded<S> {
    fn due_streams(&self, limit: usize) -> impl Future<Output = Result<Vec<StreamId>>> + Send {
        self.guard
            .call("due_streams", Deadline::Store, self.inner.due_streams(limit))
    }

    fn take(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        what: outbox_core::Take<'_>,
    ) -> impl Future<Output = Result<Vec<ClaimedRun>>> + Send {
        self.guard
            .call("take", Deadline::Store, self.inner.take(owner, ttl, what))
    }

    fn claim(&self, lease: &Lease, max: usize) -> impl Future<Output = Result<Vec<OutboxRow>>> + Send {
        self.guard
            .call("claim", Deadline::Store, self.inner.claim(lease, max))
    }

    fn complete_and_claim(
        &self,
        lease: &Lease,
        through: Seq,
        max: usize,
    ) -> impl Future<Output = Result<(u64, Vec<OutboxRow>)>> + Send {
        self.guard.call(
            "complete_and_claim",
            Deadline::Store,
            self.inner.complete_and_claim(lease, through, max),
        )
    }

    fn complete(&self, stream: &StreamId, through: Seq) -> impl Future<Output = Result<u64>> + Send {
        self.guard
            .call("complete", Deadline::Store, self.inner.complete(stream, through))
    }

    fn finish(&self, ends: &[StreamEnd]) -> impl Future<Output = Result<u64>> + Send {
        self.guard
            .call("finish", Deadline::Store, self.inner.finish(ends))
    }

    fn fail(
        &self,
        lease: &Lease,
        seq: Seq,
        error: &str,
        policy: &RetryPolicy,
    ) -> impl Future<Output = Result<FailureOutcome>> + Send {
        self.guard.call(
            "fail",
            Deadline::Store,
            self.inner.fail(lease, seq, error, policy),
        )
    }

    fn enqueue_catch_up(&self, stream: &StreamId) -> impl Future<Output = Result<bool>> + Send {
        self.guard.call(
            "enqueue_catch_up",
            Deadline::Store,
            self.inner.enqueue_catch_up(stream),
        )
    }

    fn begin_attempt(&self, lease: &Lease, seq: Seq) -> impl Future<Output = Result<()>> + Send {
        self.guard.call(
            "begin_attempt",
            Deadline::Store,
            self.inner.begin_attempt(lease, seq),
        )
    }
}

impl<S: DeadLetters> DeadLetters for Bounded<S> {
    fn requeue(&self, stream: &StreamId, seq: Seq) -> impl Future<Output = Result<OutboxRow>> + Send {
        self.guard
            .call("requeue", Deadline::Store, self.inner.requeue(stream, seq))
    }

    fn retry(&self, stream: &StreamId, seq: Seq) -> impl Future<Output = Result<OutboxRow>> + Send {
        self.guard
            .call("retry", Deadline::Store, self.inner.retry(stream, seq))
    }

    fn requeue_dead(&self, limit: usize) -> impl Future<Output = Result<Vec<OutboxRow>>> + Send {
        self.guard
            .call("requeue_dead", Deadline::Store, self.inner.requeue_dead(limit))
    }
}

impl<S: OutboxInspector> OutboxInspector for Bounded<S> {
    fn row(&self, stream: &StreamId, seq: Seq) -> impl Future<Output = Result<Option<OutboxRow>>> + Send {
        self.guard
            .call("row", Deadline::Store, self.inner.row(stream, seq))
    }

    fn head(&self, stream: &StreamId) -> impl Future<Output = Result<Option<OutboxRow>>> + Send {
        self.guard.call("head", Deadline::Store, self.inner.head(stream))
    }

    fn summary(&self) -> impl Future<Output = Result<OutboxSummary>> + Send {
        self.guard.call("summary", Deadline::Store, self.inner.summary())
    }

    fn list(
        &self,
        status: Option<OutboxStatus>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<OutboxRow>>> + Send {
        self.guard
            .call("list", Deadline::Store, self.inner.list(status, limit))
    }

    fn lease(&self, stream: &StreamId) -> impl Future<Output = Result<Option<Lease>>> + Send {
        self.guard
            .call("lease", Deadline::Store, self.inner.lease(stream))
    }

    fn leases(
        &self,
        after: Option<&StreamId>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<LeaseEntry>>> + Send {
        self.guard
            .call("leases", Deadline::Store, self.inner.leases(after, limit))
    }
}

impl<S: LeaseStore> LeaseStore for Bounded<S> {
    fn acquire(
        &self,
        stream: &StreamId,
        owner: &WorkerId,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Lease>>> + Send {
        self.guard
            .call("acquire", Deadline::Store, self.inner.acquire(stream, owner, ttl))
    }

    fn renew(&self, lease: &Lease, ttl: Duration) -> impl Future<Output = Result<Lease>> + Send {
        self.guard
            .call("renew", Deadline::Store, self.inner.renew(lease, ttl))
    }

    fn release(&self, lease: &Lease) -> impl Future<Output = Result<bool>> + Send {
        self.guard
            .call("release", Deadline::Store, self.inner.release(lease))
    }
}

impl<S: WorkerRegistry> WorkerRegistry for Bounded<S> {
    fn heartbeat(
        &self,
        id: &WorkerId,
        host: &str,
        pid: u32,
        mode: outbox_core::Mode,
        ttl: Duration,
    ) -> impl Future<Output = Result<WorkerInfo>> + Send {
        self.guard.call(
            "heartbeat",
            Deadline::Store,
            self.inner.heartbeat(id, host, pid, mode, ttl),
        )
    }

    fn workers(&self) -> impl Future<Output = Result<Vec<WorkerInfo>>> + Send {
        self.guard.call("workers", Deadline::Store, self.inner.workers())
    }

    fn deregister(&self, id: &WorkerId) -> impl Future<Output = Result<bool>> + Send {
        self.guard
            .call("deregister", Deadline::Store, self.inner.deregister(id))
    }

    fn prune(&self, grace: Duration) -> impl Future<Output = Result<u64>> + Send {
        self.guard.call("prune", Deadline::Store, self.inner.prune(grace))
    }
}

impl<S: PartitionStore> PartitionStore for Bounded<S> {
    fn partitioning(&self) -> &Partitioning {
        self.inner.partitioning()
    }

    fn sync_partitions(
        &self,
        owner: &WorkerId,
        wanted: &[Partition],
        ttl: Duration,
    ) -> impl Future<Output = Result<PartitionSync>> + Send {
        self.guard.call(
            "sync_partitions",
            Deadline::Store,
            self.inner.sync_partitions(owner, wanted, ttl),
        )
    }

    fn claim_partitioned(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        limits: SweepLimits,
    ) -> impl Future<Output = Result<Vec<(Lease, Vec<OutboxRow>)>>> + Send {
        self.guard.call(
            "claim_partitioned",
            Deadline::Store,
            self.inner.claim_partitioned(owner, ttl, limits),
        )
    }

    fn claim_and_load_partitioned(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        limits: SweepLimits,
    ) -> impl Future<Output = Result<Vec<ClaimedRun>>> + Send {
        self.guard.call(
            "claim_and_load_partitioned",
            Deadline::Store,
            self.inner.claim_and_load_partitioned(owner, ttl, limits),
        )
    }

    fn partitions(&self) -> impl Future<Output = Result<Vec<PartitionStatus>>> + Send {
        self.guard
            .call("partitions", Deadline::Store, self.inner.partitions())
    }
}

impl<S: PartitionHandover> PartitionHandover for Bounded<S> {
    fn sync_partitions_taking(
        &self,
        owner: &WorkerId,
        wanted: &[Partition],
        from: &[WorkerId],
        ttl: Duration,
    ) -> impl Future<Output = Result<PartitionSync>> + Send {
        self.guard.call(
            "sync_partitions_taking",
            Deadline::Store,
            self.inner.sync_partitions_taking(owner, wanted, from, ttl),
        )
    }
}

impl<S: SinkStore> SinkStore for Bounded<S> {
    fn sink_states(
        &self,
        sink: &SinkName,
        streams: &[StreamId],
    ) -> impl Future<Output = Result<Vec<SinkStream>>> + Send {
        self.guard.call(
            "sink_states",
            Deadline::Store,
            self.inner.sink_states(sink, streams),
        )
    }

    fn advance_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
        partition: Partition,
        from: u64,
        to: Seq,
        more: bool,
    ) -> impl Future<Output = Result<bool>> + Send {
        self.guard.call(
            "advance_sink",
            Deadline::Store,
            self.inner.advance_sink(sink, stream, partition, from, to, more),
        )
    }

    fn hold_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
        partition: Partition,
        at: u64,
    ) -> impl Future<Output = Result<SinkStream>> + Send {
        self.guard.call(
            "hold_sink",
            Deadline::Store,
            self.inner.hold_sink(sink, stream, partition, at),
        )
    }

    fn fail_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
        partition: Partition,
        seq: Seq,
        error: &str,
        policy: &RetryPolicy,
    ) -> impl Future<Output = Result<FailureOutcome>> + Send {
        self.guard.call(
            "fail_sink",
            Deadline::Store,
            self.inner.fail_sink(sink, stream, partition, seq, error, policy),
        )
    }

    fn due_sink_streams(
        &self,
        sink: &SinkName,
        partitions: &[Partition],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SinkStream>>> + Send {
        self.guard.call(
            "due_sink_streams",
            Deadline::Store,
            self.inner.due_sink_streams(sink, partitions, limit),
        )
    }

    fn sink_streams(
        &self,
        sink: &SinkName,
        status: Option<SinkStatus>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SinkStream>>> + Send {
        self.guard.call(
            "sink_streams",
            Deadline::Store,
            self.inner.sink_streams(sink, status, limit),
        )
    }

    fn requeue_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
    ) -> impl Future<Output = Result<SinkStream>> + Send {
        self.guard.call(
            "requeue_sink",
            Deadline::Store,
            self.inner.requeue_sink(sink, stream),
        )
    }

    fn sinks(&self) -> impl Future<Output = Result<Vec<SinkSummary>>> + Send {
        self.guard.call("sinks", Deadline::Store, self.inner.sinks())
    }
}

impl<S: ConsumerRegistry> ConsumerRegistry for Bounded<S> {
    fn register_consumers(
        &self,
        consumers: &[(SinkName, ConsumerKind)],
        version: &str,
        worker: &WorkerId,
    ) -> impl Future<Output = Result<()>> + Send {
        self.guard.call(
            "register_consumers",
            Deadline::Store,
            self.inner.register_consumers(consumers, version, worker),
        )
    }

    fn consumers(&self) -> impl Future<Output = Result<Vec<ConsumerInfo>>> + Send {
        self.guard
            .call("consumers", Deadline::Store, self.inner.consumers())
    }

    fn set_paused(&self, key: &SinkName, paused: bool) -> impl Future<Output = Result<bool>> + Send {
        self.guard
            .call("set_paused", Deadline::Store, self.inner.set_paused(key, paused))
    }

    fn retire_consumer(&self, key: &SinkName) -> impl Future<Output = Result<bool>> + Send {
        self.guard.call(
            "retire_consumer",
            Deadline::Store,
            self.inner.retire_consumer(key),
        )
    }
}

impl<S: SinkFeed> SinkFeed for Bounded<S> {
    fn read_feed(&self, after: u64, limit: usize) -> impl Future<Output = Result<FeedPage>> + Send {
        self.guard
            .call("read_feed", Deadline::Store, self.inner.read_feed(after, limit))
    }

    fn sink_cursors(&self, sink: &SinkName) -> impl Future<Output = Result<Vec<(Partition, u64)>>> + Send {
        self.guard
            .call("sink_cursors", Deadline::Store, self.inner.sink_cursors(sink))
    }

    fn advance_sink_cursor(
        &self,
        sink: &SinkName,
        partition: Partition,
        from: u64,
        to: u64,
    ) -> impl Future<Output = Result<bool>> + Send {
        self.guard.call(
            "advance_sink_cursor",
            Deadline::Store,
            self.inner.advance_sink_cursor(sink, partition, from, to),
        )
    }
}

impl<S: ActivityLog> ActivityLog for Bounded<S> {
    fn record_activity(
        &self,
        id: &WorkerId,
        counts: ActivityCounts,
    ) -> impl Future<Output = Result<()>> + Send {
        self.guard.call(
            "record_activity",
            Deadline::Store,
            self.inner.record_activity(id, counts),
        )
    }

    fn activity(&self, minutes: u32) -> impl Future<Output = Result<ActivitySeries>> + Send {
        self.guard
            .call("activity", Deadline::Store, self.inner.activity(minutes))
    }
}

impl<S: ProjectionStore> ProjectionStore for Bounded<S> {
    type Tx = S::Tx;

    fn setup(
        &self,
        projections: &[Arc<dyn Projection<Self::Tx>>],
    ) -> impl Future<Output = Result<()>> + Send {
        self.guard
            .call("setup", Deadline::Store, self.inner.setup(projections))
    }

    fn apply(
        &self,
        stream: &StreamId,
        events: &[Event],
        projections: &[Arc<dyn Projection<Self::Tx>>],
    ) -> impl Future<Output = Result<ApplyOutcome>> + Send {
        self.guard.call(
            "apply",
            Deadline::Apply,
            self.inner.apply(stream, events, projections),
        )
    }

    fn apply_runs(
        &self,
        runs: &[&[Event]],
        projections: &[Arc<dyn Projection<Self::Tx>>],
    ) -> impl Future<Output = Result<Vec<ApplyOutcome>>> + Send {
        self.guard.call(
            "apply_runs",
            Deadline::Apply,
            self.inner.apply_runs(runs, projections),
        )
    }

    fn checkpoint(
        &self,
        projection: &ProjectionName,
        stream: &StreamId,
    ) -> impl Future<Output = Result<u64>> + Send {
        self.guard.call(
            "checkpoint",
            Deadline::Store,
            self.inner.checkpoint(projection, stream),
        )
    }

    fn reset(&self, projection: &dyn Projection<Self::Tx>) -> impl Future<Output = Result<()>> + Send {
        self.guard
            .call("reset", Deadline::Run, self.inner.reset(projection))
    }

    fn digest(&self, projection: &dyn Projection<Self::Tx>) -> impl Future<Output = Result<Digest>> + Send {
        self.guard
            .call("digest", Deadline::Store, self.inner.digest(projection))
    }
}

impl<S: WatermarkStore> WatermarkStore for Bounded<S> {
    fn watermark(&self, stream: &StreamId) -> impl Future<Output = Result<Option<Watermark>>> + Send {
        self.guard
            .call("watermark", Deadline::Store, self.inner.watermark(stream))
    }

    fn watermarks(
        &self,
        after: Option<&StreamId>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Watermark>>> + Send {
        self.guard
            .call("watermarks", Deadline::Store, self.inner.watermarks(after, limit))
    }
}

impl<S: ViewStore> ViewStore for Bounded<S> {
    fn view_get(
        &self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        self.guard.call(
            "view_get",
            Deadline::Store,
            self.inner.view_get(projection, table, key),
        )
    }

    fn view_scan(
        &self,
        projection: &ProjectionName,
        table: &str,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, String)>>> + Send {
        self.guard.call(
            "view_scan",
            Deadline::Store,
            self.inner.view_scan(projection, table, after, limit),
        )
    }

    fn view_digests(&self) -> impl Future<Output = Result<Vec<outbox_core::ViewDigest>>> + Send {
        self.guard
            .call("view_digests", Deadline::Store, self.inner.view_digests())
    }

    fn verify_view_digest(
        &self,
        projection: &ProjectionName,
    ) -> impl Future<Output = Result<outbox_core::ViewDigestCheck>> + Send {
        self.guard.call(
            "verify_view_digest",
            Deadline::Store,
            self.inner.verify_view_digest(projection),
        )
    }
}

impl<S: RunStore> RunStore for Bounded<S> {
    fn admit_bounded_run(
        &self,
        kind: outbox_core::RunKind,
        projection: &ProjectionName,
        bounds: outbox_core::RunBounds,
        owner: &WorkerId,
        ttl: Duration,
    ) -> impl Future<Output = Result<outbox_core::RunRecord>> + Send {
        self.guard.call(
            "admit_bounded_run",
            Deadline::Store,
            self.inner.admit_bounded_run(kind, projection, bounds, owner, ttl),
        )
    }

    fn admit_run(
        &self,
        kind: outbox_core::RunKind,
        projection: &ProjectionName,
        until: Option<u64>,
        owner: &WorkerId,
        ttl: Duration,
    ) -> impl Future<Output = Result<outbox_core::RunRecord>> + Send {
        self.guard.call(
            "admit_run",
            Deadline::Store,
            self.inner.admit_run(kind, projection, until, owner, ttl),
        )
    }

    fn reclaim_run(
        &self,
        projection: &ProjectionName,
        live: &[WorkerId],
        idle: Duration,
    ) -> impl Future<Output = Result<Option<outbox_core::RunRecord>>> + Send {
        self.guard.call(
            "reclaim_run",
            Deadline::Store,
            self.inner.reclaim_run(projection, live, idle),
        )
    }

    fn record_progress(
        &self,
        id: u64,
        owner: &WorkerId,
        progress: outbox_core::RunProgress<'_>,
        ttl: Duration,
    ) -> impl Future<Output = Result<outbox_core::RunRecord>> + Send {
        self.guard.call(
            "record_progress",
            Deadline::Store,
            self.inner.record_progress(id, owner, progress, ttl),
        )
    }

    fn update_run(
        &self,
        id: u64,
        owner: &WorkerId,
        processed: u64,
        last: Option<(&StreamId, Seq)>,
        ttl: Duration,
    ) -> impl Future<Output = Result<outbox_core::RunRecord>> + Send {
        self.guard.call(
            "update_run",
            Deadline::Store,
            self.inner.update_run(id, owner, processed, last, ttl),
        )
    }

    fn finish_run(
        &self,
        id: u64,
        owner: &WorkerId,
        end: outbox_core::RunEnd,
    ) -> impl Future<Output = Result<outbox_core::RunRecord>> + Send {
        self.guard.call(
            "finish_run",
            Deadline::Store,
            self.inner.finish_run(id, owner, end),
        )
    }

    fn cancel_run(&self, id: u64) -> impl Future<Output = Result<outbox_core::RunRecord>> + Send {
        self.guard
            .call("cancel_run", Deadline::Store, self.inner.cancel_run(id))
    }

    fn run(&self, id: u64) -> impl Future<Output = Result<Option<outbox_core::RunRecord>>> + Send {
        self.guard.call("run", Deadline::Store, self.inner.run(id))
    }

    fn runs(&self, limit: usize) -> impl Future<Output = Result<Vec<outbox_core::RunRecord>>> + Send {
        self.guard.call("runs", Deadline::Store, self.inner.runs(limit))
    }

    fn prune_runs(&self, older_than: Duration) -> impl Future<Output = Result<u64>> + Send {
        self.guard
            .call("prune_runs", Deadline::Store, self.inner.prune_runs(older_than))
    }
}

impl<S: GenerationStore> GenerationStore for Bounded<S> {
    fn generation(
        &self,
        projection: &ProjectionName,
    ) -> impl Future<Output = Result<Option<GenerationInfo>>> + Send {
        self.guard
            .call("generation", Deadline::Store, self.inner.generation(projection))
    }

    fn generations(&self) -> impl Future<Output = Result<Vec<GenerationInfo>>> + Send {
        self.guard
            .call("generations", Deadline::Store, self.inner.generations())
    }

    fn begin_generation(
        &self,
        projection: &ProjectionName,
        live_version: u32,
        version: u32,
    ) -> impl Future<Output = Result<GenerationInfo>> + Send {
        self.guard.call(
            "begin_generation",
            Deadline::Store,
            self.inner.begin_generation(projection, live_version, version),
        )
    }

    fn record_build_position(
        &self,
        projection: &ProjectionName,
        generation: u32,
        position: u64,
    ) -> impl Future<Output = Result<()>> + Send {
        self.guard.call(
            "record_build_position",
            Deadline::Store,
            self.inner.record_build_position(projection, generation, position),
        )
    }

    fn swap_generation(
        &self,
        projection: &ProjectionName,
        generation: u32,
        check: SwapCheck,
    ) -> impl Future<Output = Result<SwapOutcome>> + Send {
        self.guard.call(
            "swap_generation",
            Deadline::Store,
            self.inner.swap_generation(projection, generation, check),
        )
    }

    fn drop_generation(
        &self,
        projection: &ProjectionName,
        generation: u32,
    ) -> impl Future<Output = Result<u64>> + Send {
        self.guard.call(
            "drop_generation",
            Deadline::Store,
            self.inner.drop_generation(projection, generation),
        )
    }

    fn stored_generations(
        &self,
        projection: &ProjectionName,
    ) -> impl Future<Output = Result<Vec<StoredGeneration>>> + Send {
        self.guard.call(
            "stored_generations",
            Deadline::Store,
            self.inner.stored_generations(projection),
        )
    }
}

impl<S: SkippedEvents> SkippedEvents for Bounded<S> {
    fn skipped(
        &self,
        projection: Option<&ProjectionName>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SkippedEvent>>> + Send {
        self.guard
            .call("skipped", Deadline::Store, self.inner.skipped(projection, limit))
    }

    fn reapply(
        &self,
        event: &Event,
        projection: &Arc<dyn Projection<Self::Tx>>,
    ) -> impl Future<Output = Result<bool>> + Send {
        self.guard
            .call("reapply", Deadline::Apply, self.inner.reapply(event, projection))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::{EventType, NewEvent};
    use outbox_memory::MemoryJournal;

    fn guard(store: Duration, run: Duration) -> (Guard, Arc<StoreCalls>) {
        let calls = Arc::new(StoreCalls::default());
        (Guard::new(store, run, Arc::clone(&calls)), calls)
    }

    fn stats(calls: &StoreCalls, call: &str) -> StoreCallStats {
        calls
            .snapshot()
            .into_iter()
            .find(|s| s.call == call)
            .unwrap_or_else(|| panic!("no `{call}` counted: {:?}", calls.snapshot()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_deadline_is_a_temporary_storage_error_and_counted() {
        let (guard, calls) = guard(Duration::from_secs(2), Duration::from_secs(60));
        let started = tokio::time::Instant::now();
        let hung = std::future::pending::<Result<()>>();
        let err = guard.call("claim", Deadline::Store, hung).await.unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert!(err.is_temporary(), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("`claim`") && msg.contains("2s"), "{msg}");
        let s = stats(&calls, "claim");
        assert_eq!((s.calls, s.temporary_errors, s.timeouts), (1, 1, 1), "{s:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_is_bounded_by_the_run_ttl() {
        let (guard, _) = guard(Duration::from_secs(2), Duration::from_secs(60));
        let started = tokio::time::Instant::now();
        let hung = std::future::pending::<Result<()>>();
        guard.call("reset", Deadline::Run, hung).await.unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn only_an_apply_past_its_deadline_is_stalled() {
        let (guard, _) = guard(Duration::from_secs(1), Duration::from_secs(60));
        let hung = std::future::pending::<Result<()>>();
        assert!(stalled(
            &guard.call("apply", Deadline::Apply, hung).await.unwrap_err()
        ));
        let read = std::future::pending::<Result<()>>();
        assert!(
            !stalled(
                &guard
                    .call("read_stream", Deadline::Store, read)
                    .await
                    .unwrap_err()
            ),
            "another call past its deadline is no stall"
        );
        let other = Error::temporary("connection reset", std::io::Error::other("reset"));
        assert!(!stalled(&other), "another temporary error is no stall");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_within_its_deadline_keeps_its_result_and_only_trouble_is_counted() {
        let (guard, calls) = guard(Duration::from_secs(1), Duration::from_secs(60));
        let ok = guard.call("read_stream", Deadline::Store, async { Ok::<_, Error>(7) });
        assert_eq!(ok.await.unwrap(), 7);
        let err = guard
            .call("append", Deadline::Store, async {
                Err::<(), _>(Error::Config("x".into()))
            })
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Config(_)),
            "the call's own error passes through"
        );
        let trouble = async { Err::<(), _>(Error::temporary("busy", std::io::Error::other("busy"))) };
        guard.call("append", Deadline::Store, trouble).await.unwrap_err();
        let read = stats(&calls, "read_stream");
        assert_eq!((read.calls, read.temporary_errors, read.timeouts), (1, 0, 0));
        let append = stats(&calls, "append");
        assert_eq!(
            (append.calls, append.temporary_errors, append.timeouts),
            (2, 1, 0),
            "an answer such as a refused configuration is no trouble: {append:?}"
        );
    }

    #[tokio::test]
    async fn every_method_is_forwarded_to_the_adapter_defaults_included() {
        // `read_runs` has a default body made of `read_stream` calls: were
        // it not forwarded, the decorator's default would run and count
        // `read_stream`s instead of the adapter's own `read_runs`.
        let (guard, calls) = guard(Duration::from_secs(5), Duration::from_secs(60));
        let journal = Bounded::new(MemoryJournal::new(), guard);
        let stream = StreamId::new("s-1").unwrap();
        let event = NewEvent::new(
            EventType::new("added").unwrap(),
            outbox_core::Intent::Apply,
            b"{}".to_vec(),
        );
        let request = AppendRequest::new(stream.clone(), outbox_core::ExpectedVersion::Any, vec![event]);
        journal
            .append(&[request], AppendOptions::default())
            .await
            .unwrap();
        let runs = journal
            .read_runs(&[(stream, Seq::new(1).unwrap(), 10)])
            .await
            .unwrap();
        assert_eq!(runs[0].len(), 1);
        let counted: Vec<(&str, u64)> = calls.snapshot().iter().map(|s| (s.call, s.calls)).collect();
        assert_eq!(counted, [("append", 1), ("read_runs", 1)]);
    }
}
