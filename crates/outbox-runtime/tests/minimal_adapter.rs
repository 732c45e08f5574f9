//! The optional capabilities (ADR 0035): an adapter that implements only
//! the required ports, and takes every capability trait's defaults (no sink
//! feed, no activity log, no runs, no generations, no skip records), runs
//! the worker, its exception path and the registry; the runtime refuses
//! what needs a missing capability with one clear error.
//!
//! The adapter here wraps the memory adapter and forwards the required
//! ports only: what a third-party adapter author has to write.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_core::{
    AppendOptions, AppendRequest, Appended, ApplyOutcome, BoxError, ClaimedRun, ConsumerInfo, ConsumerKind,
    Digest, Error, Event, EventJournal, EventTypeRegistry, ExpectedVersion, FailureOutcome, Lease,
    LeaseEntry, LeaseStore, OutboxInspector, OutboxQueue, OutboxRow, OutboxStatus, OutboxSummary, Partition,
    PartitionStatus, PartitionStore, PartitionSync, Partitioning, Projection, ProjectionName,
    ProjectionStore, Result, RetryPolicy, Seq, SinkName, SinkStatus, SinkStore, SinkStream, SinkSummary,
    StreamEnd, StreamId, StreamVersion, SweepLimits, Take, ViewDigest, ViewDigestCheck, ViewProjection,
    ViewStore, ViewTx, Watermark, WatermarkStore, WorkerId, WorkerInfo, WorkerRegistry, async_trait,
};
use outbox_memory::{MemoryJournal, MemoryProjectionStore, MemoryTx};
use outbox_runtime::{Outbox, testing};

/// A journal with the required ports only.
#[derive(Clone)]
struct Journal(MemoryJournal);

/// A projection store with the required ports only.
#[derive(Clone)]
struct Store(MemoryProjectionStore);

impl EventJournal for Journal {
    fn append(
        &self,
        b: &[AppendRequest],
        o: AppendOptions,
    ) -> impl Future<Output = Result<Vec<Appended>>> + Send {
        self.0.append(b, o)
    }
    fn load(&self, s: &StreamId, q: Seq) -> impl Future<Output = Result<Event>> + Send {
        self.0.load(s, q)
    }
    fn read_stream(&self, s: &StreamId, f: Seq, l: usize) -> impl Future<Output = Result<Vec<Event>>> + Send {
        self.0.read_stream(s, f, l)
    }
    fn read_global(&self, a: u64, l: usize) -> impl Future<Output = Result<Vec<Event>>> + Send {
        self.0.read_global(a, l)
    }
    fn stream_version(&self, s: &StreamId) -> impl Future<Output = Result<u64>> + Send {
        self.0.stream_version(s)
    }
    fn stream_versions(
        &self,
        a: Option<&StreamId>,
        l: usize,
    ) -> impl Future<Output = Result<Vec<StreamVersion>>> + Send {
        self.0.stream_versions(a, l)
    }
}

impl OutboxQueue for Journal {
    fn due_streams(&self, l: usize) -> impl Future<Output = Result<Vec<StreamId>>> + Send {
        self.0.due_streams(l)
    }
    fn take(
        &self,
        o: &WorkerId,
        t: Duration,
        w: Take<'_>,
    ) -> impl Future<Output = Result<Vec<ClaimedRun>>> + Send {
        self.0.take(o, t, w)
    }
    fn claim(&self, l: &Lease, m: usize) -> impl Future<Output = Result<Vec<OutboxRow>>> + Send {
        self.0.claim(l, m)
    }
    fn complete_and_claim(
        &self,
        l: &Lease,
        t: Seq,
        m: usize,
    ) -> impl Future<Output = Result<(u64, Vec<OutboxRow>)>> + Send {
        self.0.complete_and_claim(l, t, m)
    }
    fn complete(&self, s: &StreamId, t: Seq) -> impl Future<Output = Result<u64>> + Send {
        self.0.complete(s, t)
    }
    fn finish(&self, e: &[StreamEnd]) -> impl Future<Output = Result<u64>> + Send {
        self.0.finish(e)
    }
    fn fail(
        &self,
        l: &Lease,
        q: Seq,
        e: &str,
        p: &RetryPolicy,
    ) -> impl Future<Output = Result<FailureOutcome>> + Send {
        self.0.fail(l, q, e, p)
    }
    fn enqueue_catch_up(&self, s: &StreamId) -> impl Future<Output = Result<bool>> + Send {
        self.0.enqueue_catch_up(s)
    }
    fn begin_attempt(&self, l: &Lease, q: Seq) -> impl Future<Output = Result<()>> + Send {
        self.0.begin_attempt(l, q)
    }
}

impl outbox_core::DeadLetters for Journal {
    fn requeue(&self, s: &StreamId, q: Seq) -> impl Future<Output = Result<OutboxRow>> + Send {
        self.0.requeue(s, q)
    }
    fn retry(&self, s: &StreamId, q: Seq) -> impl Future<Output = Result<OutboxRow>> + Send {
        self.0.retry(s, q)
    }
    fn requeue_dead(&self, l: usize) -> impl Future<Output = Result<Vec<OutboxRow>>> + Send {
        self.0.requeue_dead(l)
    }
}

impl OutboxInspector for Journal {
    fn row(&self, s: &StreamId, q: Seq) -> impl Future<Output = Result<Option<OutboxRow>>> + Send {
        self.0.row(s, q)
    }
    fn head(&self, s: &StreamId) -> impl Future<Output = Result<Option<OutboxRow>>> + Send {
        self.0.head(s)
    }
    fn summary(&self) -> impl Future<Output = Result<OutboxSummary>> + Send {
        self.0.summary()
    }
    fn list(&self, s: Option<OutboxStatus>, l: usize) -> impl Future<Output = Result<Vec<OutboxRow>>> + Send {
        self.0.list(s, l)
    }
    fn lease(&self, s: &StreamId) -> impl Future<Output = Result<Option<Lease>>> + Send {
        self.0.lease(s)
    }
    fn leases(&self, a: Option<&StreamId>, l: usize) -> impl Future<Output = Result<Vec<LeaseEntry>>> + Send {
        self.0.leases(a, l)
    }
}

impl LeaseStore for Journal {
    fn acquire(
        &self,
        s: &StreamId,
        o: &WorkerId,
        t: Duration,
    ) -> impl Future<Output = Result<Option<Lease>>> + Send {
        self.0.acquire(s, o, t)
    }
    fn renew(&self, l: &Lease, t: Duration) -> impl Future<Output = Result<Lease>> + Send {
        self.0.renew(l, t)
    }
    fn release(&self, l: &Lease) -> impl Future<Output = Result<bool>> + Send {
        self.0.release(l)
    }
}

impl WorkerRegistry for Journal {
    fn heartbeat(
        &self,
        id: &WorkerId,
        host: &str,
        pid: u32,
        mode: outbox_core::Mode,
        ttl: Duration,
    ) -> impl Future<Output = Result<WorkerInfo>> + Send {
        self.0.heartbeat(id, host, pid, mode, ttl)
    }
    fn workers(&self) -> impl Future<Output = Result<Vec<WorkerInfo>>> + Send {
        self.0.workers()
    }
    fn deregister(&self, id: &WorkerId) -> impl Future<Output = Result<bool>> + Send {
        self.0.deregister(id)
    }
    fn prune(&self, g: Duration) -> impl Future<Output = Result<u64>> + Send {
        self.0.prune(g)
    }
}

impl PartitionStore for Journal {
    fn partitioning(&self) -> &Partitioning {
        self.0.partitioning()
    }
    fn sync_partitions(
        &self,
        o: &WorkerId,
        w: &[Partition],
        t: Duration,
    ) -> impl Future<Output = Result<PartitionSync>> + Send {
        self.0.sync_partitions(o, w, t)
    }
    fn claim_partitioned(
        &self,
        o: &WorkerId,
        t: Duration,
        l: SweepLimits,
    ) -> impl Future<Output = Result<Vec<(Lease, Vec<OutboxRow>)>>> + Send {
        self.0.claim_partitioned(o, t, l)
    }
    fn partitions(&self) -> impl Future<Output = Result<Vec<PartitionStatus>>> + Send {
        self.0.partitions()
    }
}

impl SinkStore for Journal {
    fn sink_states(
        &self,
        k: &SinkName,
        s: &[StreamId],
    ) -> impl Future<Output = Result<Vec<SinkStream>>> + Send {
        self.0.sink_states(k, s)
    }
    fn advance_sink(
        &self,
        k: &SinkName,
        s: &StreamId,
        p: Partition,
        f: u64,
        t: Seq,
        m: bool,
    ) -> impl Future<Output = Result<bool>> + Send {
        self.0.advance_sink(k, s, p, f, t, m)
    }
    fn hold_sink(
        &self,
        k: &SinkName,
        s: &StreamId,
        p: Partition,
        a: u64,
    ) -> impl Future<Output = Result<SinkStream>> + Send {
        self.0.hold_sink(k, s, p, a)
    }
    fn fail_sink(
        &self,
        k: &SinkName,
        s: &StreamId,
        p: Partition,
        q: Seq,
        e: &str,
        r: &RetryPolicy,
    ) -> impl Future<Output = Result<FailureOutcome>> + Send {
        self.0.fail_sink(k, s, p, q, e, r)
    }
    fn due_sink_streams(
        &self,
        k: &SinkName,
        p: &[Partition],
        l: usize,
    ) -> impl Future<Output = Result<Vec<SinkStream>>> + Send {
        self.0.due_sink_streams(k, p, l)
    }
    fn sink_streams(
        &self,
        k: &SinkName,
        s: Option<SinkStatus>,
        l: usize,
    ) -> impl Future<Output = Result<Vec<SinkStream>>> + Send {
        self.0.sink_streams(k, s, l)
    }
    fn requeue_sink(&self, k: &SinkName, s: &StreamId) -> impl Future<Output = Result<SinkStream>> + Send {
        self.0.requeue_sink(k, s)
    }
    fn sinks(&self) -> impl Future<Output = Result<Vec<SinkSummary>>> + Send {
        self.0.sinks()
    }
}

impl outbox_core::ConsumerRegistry for Journal {
    fn register_consumers(
        &self,
        c: &[(SinkName, ConsumerKind)],
        v: &str,
        w: &WorkerId,
    ) -> impl Future<Output = Result<()>> + Send {
        self.0.register_consumers(c, v, w)
    }
    fn consumers(&self) -> impl Future<Output = Result<Vec<ConsumerInfo>>> + Send {
        self.0.consumers()
    }
    fn set_paused(&self, k: &SinkName, p: bool) -> impl Future<Output = Result<bool>> + Send {
        self.0.set_paused(k, p)
    }
    fn retire_consumer(&self, k: &SinkName) -> impl Future<Output = Result<bool>> + Send {
        self.0.retire_consumer(k)
    }
}

// The optional capabilities: nothing written, the defaults taken.
impl outbox_core::SinkFeed for Journal {}
impl outbox_core::ActivityLog for Journal {}
impl outbox_core::PartitionHandover for Journal {}

impl ProjectionStore for Store {
    type Tx = MemoryTx;

    fn setup(&self, p: &[Arc<dyn Projection<MemoryTx>>]) -> impl Future<Output = Result<()>> + Send {
        self.0.setup(p)
    }
    fn apply(
        &self,
        s: &StreamId,
        e: &[Event],
        p: &[Arc<dyn Projection<MemoryTx>>],
    ) -> impl Future<Output = Result<ApplyOutcome>> + Send {
        self.0.apply(s, e, p)
    }
    fn apply_runs(
        &self,
        r: &[&[Event]],
        p: &[Arc<dyn Projection<MemoryTx>>],
    ) -> impl Future<Output = Result<Vec<ApplyOutcome>>> + Send {
        self.0.apply_runs(r, p)
    }
    fn checkpoint(&self, p: &ProjectionName, s: &StreamId) -> impl Future<Output = Result<u64>> + Send {
        self.0.checkpoint(p, s)
    }
    fn reset(&self, p: &dyn Projection<MemoryTx>) -> impl Future<Output = Result<()>> + Send {
        self.0.reset(p)
    }
    fn digest(&self, p: &dyn Projection<MemoryTx>) -> impl Future<Output = Result<Digest>> + Send {
        self.0.digest(p)
    }
}

impl WatermarkStore for Store {
    fn watermark(&self, s: &StreamId) -> impl Future<Output = Result<Option<Watermark>>> + Send {
        self.0.watermark(s)
    }
    fn watermarks(
        &self,
        a: Option<&StreamId>,
        l: usize,
    ) -> impl Future<Output = Result<Vec<Watermark>>> + Send {
        self.0.watermarks(a, l)
    }
}

impl ViewStore for Store {
    fn view_get(
        &self,
        p: &ProjectionName,
        t: &str,
        k: &str,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        self.0.view_get(p, t, k)
    }
    fn view_scan(
        &self,
        p: &ProjectionName,
        t: &str,
        a: Option<&str>,
        l: usize,
    ) -> impl Future<Output = Result<Vec<(String, String)>>> + Send {
        self.0.view_scan(p, t, a, l)
    }
    fn view_digests(&self) -> impl Future<Output = Result<Vec<ViewDigest>>> + Send {
        self.0.view_digests()
    }
    fn verify_view_digest(&self, p: &ProjectionName) -> impl Future<Output = Result<ViewDigestCheck>> + Send {
        self.0.verify_view_digest(p)
    }
}

impl outbox_core::RunStore for Store {}
impl outbox_core::GenerationStore for Store {}
impl outbox_core::SkippedEvents for Store {}

/// Counts each stream's events; fails on `boom` until `fixed`.
struct Counter {
    name: ProjectionName,
    fails: bool,
    fixed: Arc<AtomicBool>,
}

#[async_trait]
impl ViewProjection for Counter {
    fn name(&self) -> &ProjectionName {
        &self.name
    }
    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> std::result::Result<(), BoxError> {
        if self.fails && event.payload == b"boom" && !self.fixed.load(Ordering::SeqCst) {
            return Err(format!("{} refuses {}/{}", self.name, event.stream, event.seq).into());
        }
        view.update("seen", event.stream.as_str(), |n: &mut u64| *n += 1)
            .await?;
        Ok(())
    }
}

fn types() -> EventTypeRegistry {
    let mut t = EventTypeRegistry::new();
    t.apply("happened").unwrap();
    t
}

fn stores() -> (Journal, Store) {
    let clock = testing::clock();
    (
        Journal(MemoryJournal::with_clock(clock.clone())),
        Store(MemoryProjectionStore::with_clock(clock)),
    )
}

/// The worker, the exception path, a requeue and the registry run on the
/// required ports alone.
#[tokio::test]
async fn the_worker_runs_on_the_required_ports_alone() {
    let fixed = Arc::new(AtomicBool::new(false));
    let counter = |name: &str, fails: bool| Counter {
        name: ProjectionName::new(name).unwrap(),
        fails,
        fixed: fixed.clone(),
    };
    let (journal, store) = stores();
    let outbox = Outbox::builder(journal, store)
        .config(outbox_runtime::Config::producer_only())
        .event_types(types())
        .view(counter("picky", true))
        .view(counter("steady", false))
        .build()
        .await
        .unwrap();
    for (stream, payloads) in [("bad", &["ok", "boom", "ok"][..]), ("good", &["ok", "ok"])] {
        let events = payloads
            .iter()
            .map(|p| outbox.event("happened", p.as_bytes().to_vec()))
            .collect::<Result<Vec<_>>>()
            .unwrap();
        outbox
            .append(&StreamId::new(stream).unwrap(), ExpectedVersion::Any, events)
            .await
            .unwrap();
    }
    outbox.drain().await.unwrap();
    let count =
        async |p: &str, s: &str| -> Option<u64> { outbox.views(p).unwrap().get("seen", s).await.unwrap() };
    assert_eq!(
        count("steady", "bad").await,
        Some(3),
        "the bystander applied every event"
    );
    assert_eq!(
        count("picky", "bad").await,
        Some(1),
        "the failing one stopped before its event"
    );
    assert_eq!(count("picky", "good").await, Some(2));
    let consumers = outbox_runtime::consumers::consumer_statuses(outbox.journal())
        .await
        .unwrap();
    assert_eq!(consumers.len(), 2, "both registered: {consumers:?}");
    fixed.store(true, Ordering::SeqCst);
    outbox
        .requeue_projection(
            &ProjectionName::new("picky").unwrap(),
            &StreamId::new("bad").unwrap(),
        )
        .await
        .unwrap();
    testing::drain(&outbox).await.unwrap();
    assert_eq!(count("picky", "bad").await, Some(3), "caught up after the fix");
    assert!(outbox.skipped_events(None, 10).await.unwrap().is_empty());
}

/// A sink on a journal without a feed is refused when the runtime is
/// built, with one line naming why.
#[tokio::test]
async fn sinks_are_refused_without_a_sink_feed() {
    struct Nowhere(SinkName);
    #[async_trait]
    impl outbox_core::Sink for Nowhere {
        fn name(&self) -> &SinkName {
            &self.0
        }
        async fn publish(&self, _: &[Event]) -> outbox_core::Published {
            outbox_core::Published::all(0)
        }
    }
    let (journal, store) = stores();
    let built = Outbox::builder(journal, store)
        .event_types(types())
        .sink(Nowhere(SinkName::new("bus").unwrap()))
        .build()
        .await;
    let Err(Error::Config(why)) = built else {
        panic!("a sink without a feed must be refused");
    };
    assert!(why.contains("cannot deliver") && why.contains("sinks"), "{why}");
}

/// A replay needs runs: it is refused with `Unsupported`, and the worker
/// runs on.
#[tokio::test]
async fn replay_without_runs_is_unsupported() {
    let (journal, store) = stores();
    let outbox = Outbox::builder(journal, store)
        .config(outbox_runtime::Config::producer_only())
        .event_types(types())
        .view(Counter {
            name: ProjectionName::new("steady").unwrap(),
            fails: false,
            fixed: Arc::new(AtomicBool::new(true)),
        })
        .build()
        .await
        .unwrap();
    let e = outbox
        .journal()
        .append(
            &[AppendRequest::new(
                StreamId::new("s").unwrap(),
                ExpectedVersion::Any,
                vec![outbox.event("happened", b"ok".to_vec()).unwrap()],
            )],
            AppendOptions::enqueue(),
        )
        .await;
    assert!(e.is_ok());
    let replayed = outbox
        .replay("steady", None, &tokio_util::sync::CancellationToken::new())
        .await;
    assert!(matches!(replayed, Err(Error::Unsupported(_))), "{replayed:?}");
    outbox.drain().await.unwrap();
    assert_eq!(
        outbox
            .views("steady")
            .unwrap()
            .get::<u64>("seen", "s")
            .await
            .unwrap(),
        Some(1),
        "the worker runs without runs"
    );
}
