//! Sinks on the memory adapter, in tokio's virtual time: delivery in stream
//! order beside the projections, failures retried and dead-lettered per
//! sink, neither side blocking the other, replays on purpose.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::{
    Event, EventType, EventTypeFilter, ExpectedVersion, OutboxInspector, Published, RetryPolicy, Sink,
    SinkName, SinkStatus, SinkStore, StreamId, message_id,
};
use outbox_memory::{MemoryJournal, MemoryProjectionStore};
use outbox_runtime::{Config, Outbox, TokioClock};
use outbox_testkit::{OracleProjection, add, audit, oracle_registry, sid};

/// The oracle's applied event type (its audit type is the other).
const ORACLE_EVENT: &str = "oracle.add";
use tokio_util::sync::CancellationToken;

type Rt = Outbox<MemoryJournal, MemoryProjectionStore>;

/// A sink that records what it was given and fails on demand: each
/// (stream, seq) in `failing` fails that many more times (`u32::MAX`: always).
struct Recorder {
    name: SinkName,
    policy: EventTypeFilter,
    got: Mutex<Vec<String>>,
    failing: Mutex<BTreeMap<(String, u64), u32>>,
    /// What its failures ask for (retry by default).
    decision: Mutex<outbox_core::OnError>,
}

impl Recorder {
    fn new(name: &str, policy: EventTypeFilter) -> Arc<Self> {
        Arc::new(Recorder {
            name: SinkName::new(name).unwrap(),
            policy,
            got: Mutex::default(),
            failing: Mutex::default(),
            decision: Mutex::default(),
        })
    }

    fn decide(&self, decision: outbox_core::OnError) {
        *self.decision.lock().unwrap() = decision;
    }

    fn fail(&self, stream: &str, seq: u64, times: u32) {
        self.failing
            .lock()
            .unwrap()
            .insert((stream.to_owned(), seq), times);
    }

    fn got(&self) -> Vec<String> {
        self.got.lock().unwrap().clone()
    }

    /// What it received of `stream`, in order.
    fn of(&self, stream: &str) -> Vec<String> {
        self.got()
            .into_iter()
            .filter(|id| id.rsplit_once(':').is_some_and(|(s, _)| s == stream))
            .collect()
    }
}

#[outbox_core::async_trait]
impl Sink for Recorder {
    fn name(&self) -> &SinkName {
        &self.name
    }

    fn accepts(&self, event: &Event) -> bool {
        self.policy.accepts(event)
    }

    async fn publish(&self, events: &[Event]) -> Published {
        for (i, e) in events.iter().enumerate() {
            let key = (e.stream.to_string(), e.seq.get());
            {
                let mut failing = self.failing.lock().unwrap();
                if let Some(n) = failing.get_mut(&key)
                    && *n > 0
                {
                    if *n != u32::MAX {
                        *n -= 1;
                    }
                    let why = format!("bus refused {}", message_id(e));
                    return match *self.decision.lock().unwrap() {
                        outbox_core::OnError::Retry => Published::failed(i, why),
                        outbox_core::OnError::Park => {
                            Published::failed(i, outbox_core::ApplyError::park(why))
                        }
                        outbox_core::OnError::Skip => {
                            Published::failed(i, outbox_core::ApplyError::skip(why))
                        }
                        outbox_core::OnError::Stop => {
                            Published::failed(i, outbox_core::ApplyError::stop(why))
                        }
                    };
                }
            }
            self.got.lock().unwrap().push(message_id(e));
        }
        Published::all(events.len())
    }
}

fn ids(stream: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<String> {
    seqs.map(|s| format!("{stream}:{s}")).collect()
}

async fn runtime(journal: &MemoryJournal, sinks: &[Arc<Recorder>], oracle: OracleProjection) -> Rt {
    runtime_with(journal, sinks, oracle, config()).await
}

fn config() -> Config {
    Config::apply_worker()
        .with_poll_interval(Duration::from_millis(100))
        .with_retry(RetryPolicy::new(Duration::from_secs(1), Duration::from_secs(4), 3).unwrap())
}

async fn runtime_with(
    journal: &MemoryJournal,
    sinks: &[Arc<Recorder>],
    oracle: OracleProjection,
    config: Config,
) -> Rt {
    let store = MemoryProjectionStore::with_clock(Arc::new(TokioClock::default()));
    let mut b = Outbox::builder(journal.clone(), store)
        .config(config)
        .event_types(oracle_registry())
        .projection(oracle.shared());
    for s in sinks {
        b = b.sink_arc(s.clone());
    }
    b.build().await.expect("runtime builds")
}

fn journal() -> MemoryJournal {
    MemoryJournal::with_clock(Arc::new(TokioClock::default()))
}

/// Waits (virtual time) until `done`, failing after a generous bound.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..100_000 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

async fn append(rt: &Rt, stream: &StreamId, events: Vec<outbox_core::NewEvent>) {
    rt.append(stream, ExpectedVersion::Any, events)
        .await
        .expect("append");
}

#[tokio::test(start_paused = true)]
async fn a_sink_gets_its_events_in_stream_order_and_its_policy_passes_over_the_rest() {
    let j = journal();
    let oracle = OracleProjection::new("oracle");
    let adds_only = Recorder::new(
        "bus",
        EventTypeFilter::only([EventType::new(ORACLE_EVENT).unwrap()]),
    );
    let everything = Recorder::new("log", EventTypeFilter::all());
    let rt = runtime(&j, &[adds_only.clone(), everything.clone()], oracle).await;
    let (a, b) = (sid("a"), sid("b"));
    append(&rt, &a, vec![add(1), add(2), audit(), add(3)]).await;
    append(&rt, &b, vec![add(5)]).await;
    let running = rt.start().await.unwrap();
    append(&rt, &b, vec![audit(), add(6)]).await;
    until("both sinks caught up", async || {
        let states = j
            .sink_states(adds_only.name(), &[a.clone(), b.clone()])
            .await
            .unwrap();
        let log = j
            .sink_states(everything.name(), &[a.clone(), b.clone()])
            .await
            .unwrap();
        states.iter().chain(&log).map(|s| s.seq).collect::<Vec<_>>() == [4, 3, 4, 3]
    })
    .await;
    running.shutdown().await;
    assert_eq!(
        adds_only.of("a"),
        ["a:1", "a:2", "a:4"],
        "the audit event passed over, in order"
    );
    assert_eq!(adds_only.of("b"), ["b:1", "b:3"]);
    assert_eq!(everything.of("a"), ids("a", 1..=4));
    assert_eq!(everything.of("b"), ids("b", 1..=3));
    assert_eq!(everything.got().len(), 7, "each event once");
    assert_eq!(
        rt.journal().summary().await.unwrap().total(),
        0,
        "the projections drained too"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failing_sink_holds_back_only_its_stream_and_neither_side_blocks_the_other() {
    let j = journal();
    let oracle = OracleProjection::new("oracle");
    let faults = oracle.faults();
    let bus = Recorder::new("bus", EventTypeFilter::all());
    let rt = runtime(&j, std::slice::from_ref(&bus), oracle).await;
    let (a, b, c) = (sid("a"), sid("b"), sid("c"));
    // The bus refuses b:2 twice; the projection fails on c:1 for good.
    bus.fail("b", 2, 2);
    faults.fail(&c, 1, u32::MAX);
    for s in [&a, &b, &c] {
        append(&rt, s, vec![add(1), add(2), add(3)]).await;
    }
    let running = rt.start().await.unwrap();
    until(
        "a and b published, c published though its projection fails",
        async || bus.of("a").len() == 3 && bus.of("b").len() == 3 && bus.of("c").len() == 3,
    )
    .await;
    assert_eq!(bus.of("b"), ids("b", 1..=3), "b in order after its retries");
    assert_eq!(bus.got().len(), 9, "each event once");
    let b_state = &j.sink_states(bus.name(), std::slice::from_ref(&b)).await.unwrap()[0];
    assert_eq!(
        (b_state.seq, b_state.status, b_state.attempt_count),
        (3, SinkStatus::Ok, 0)
    );
    until("a and b applied while the sink was failing on b", async || {
        let s = rt.journal().summary().await.unwrap();
        let failing = rt.projection_states(None, 10).await.unwrap();
        // Every row done; the projection is off the shared path on c only.
        s.total() == 0 && failing.len() == 1 && failing[0].stream == c
    })
    .await;
    running.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_dead_sink_stream_waits_for_a_requeue_then_catches_up() {
    let j = journal();
    let oracle = OracleProjection::new("oracle");
    let bus = Recorder::new("bus", EventTypeFilter::all());
    let rt = runtime(&j, std::slice::from_ref(&bus), oracle).await;
    let s = sid("s");
    bus.fail("s", 2, u32::MAX);
    append(&rt, &s, vec![add(1), add(2), add(3)]).await;
    let running = rt.start().await.unwrap();
    until("dead after three failures", async || {
        j.sink_states(bus.name(), std::slice::from_ref(&s)).await.unwrap()[0].status == SinkStatus::Dead
    })
    .await;
    append(&rt, &s, vec![add(4)]).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(bus.of("s"), ["s:1"], "nothing after the dead event: stream order");
    bus.fail("s", 2, 0);
    let revived = j.requeue_sink(bus.name(), &s).await.unwrap();
    assert_eq!(revived.status, SinkStatus::Failed);
    until("caught up after the requeue", async || bus.of("s").len() == 4).await;
    assert_eq!(bus.of("s"), ids("s", 1..=4));
    running.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_sink_replay_republishes_on_purpose_and_leaves_the_checkpoints() {
    let j = journal();
    let oracle = OracleProjection::new("oracle");
    let bus = Recorder::new("bus", EventTypeFilter::all());
    let rt = runtime(&j, std::slice::from_ref(&bus), oracle).await;
    let (a, b) = (sid("a"), sid("b"));
    append(&rt, &a, vec![add(1), add(2)]).await;
    append(&rt, &b, vec![add(3)]).await;
    let report = rt.deliver().await.unwrap();
    assert_eq!(report.published, 3);
    // Projection replays never publish.
    rt.replay("oracle", None, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(bus.got().len(), 3, "a projection replay publishes nothing");
    let again = rt
        .replay_sink("bus", 2, None, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(again.published, 2, "global positions 2 and 3");
    assert_eq!(bus.got(), ["a:1", "a:2", "b:1", "a:2", "b:1"]);
    let states = j.sink_states(bus.name(), &[a.clone(), b.clone()]).await.unwrap();
    assert_eq!(
        states.iter().map(|s| s.seq).collect::<Vec<_>>(),
        [2, 1],
        "checkpoints unchanged"
    );
    let err = rt
        .replay_sink("nope", 1, None, &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no sink named `nope`"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_retry_catches_a_long_stream_up_to_its_end_without_new_appends() {
    let j = journal();
    let bus = Recorder::new("bus", EventTypeFilter::all());
    // Small batches: the retry reads the stream 2 events at a time, far
    // past one pass's budget of batches.
    let config = config().with_batch_size(2).with_batches_per_stream(2);
    let rt = runtime_with(
        &j,
        std::slice::from_ref(&bus),
        OracleProjection::new("oracle"),
        config,
    )
    .await;
    let s = sid("long");
    bus.fail("long", 2, 1);
    append(&rt, &s, (1..=30).map(add).collect()).await;
    let running = rt.start().await.unwrap();
    until("the whole stream published", async || bus.of("long").len() == 30).await;
    assert_eq!(bus.of("long"), ids("long", 1..=30), "in order, once each");
    running.shutdown().await;
}

/// A retry's catch-up that stops half way (its process killed between two
/// batches) leaves the stream due, not `ok` behind scan cursors that have
/// passed its events: the next pass delivers the rest. Found by the crash
/// harness's sink rounds: the stream used to stay `ok` at the checkpoint
/// of the last batch, every cursor past its events, and never got the rest
/// until its next append.
#[tokio::test(start_paused = true)]
async fn a_catch_up_stopped_half_way_leaves_its_stream_due() {
    let j = journal();
    let bus = Recorder::new("bus", EventTypeFilter::all());
    let rt = runtime_with(
        &j,
        std::slice::from_ref(&bus),
        OracleProjection::new("oracle"),
        config().with_batch_size(2),
    )
    .await;
    let s = sid("s");
    bus.fail("s", 1, 1);
    rt.append(&s, ExpectedVersion::Any, (1..=5).map(add).collect())
        .await
        .unwrap();
    rt.deliver().await.unwrap();
    let state = j
        .sink_states(bus.name(), std::slice::from_ref(&s))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (state.status, state.seq),
        (SinkStatus::Failed, 0),
        "the first publish failed"
    );
    // The retry's first batch, as the catch-up moves it while more of the
    // stream follows; then its process dies.
    let p = outbox_core::PartitionStore::partitioning(rt.journal()).of(&s);
    assert!(
        j.advance_sink(bus.name(), &s, p, 0, outbox_core::Seq::new(2).unwrap(), true)
            .await
            .unwrap()
    );
    let state = j
        .sink_states(bus.name(), std::slice::from_ref(&s))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (state.status, state.seq),
        (SinkStatus::Failed, 2),
        "still due while more follows"
    );
    assert_eq!(
        j.due_sink_streams(bus.name(), &[p], 10).await.unwrap().len(),
        1,
        "due at once"
    );
    rt.deliver().await.unwrap();
    assert_eq!(bus.of("s"), ids("s", 3..=5), "the rest is delivered");
    let state = j
        .sink_states(bus.name(), std::slice::from_ref(&s))
        .await
        .unwrap()
        .remove(0);
    assert_eq!((state.status, state.seq), (SinkStatus::Ok, 5));
}

/// A paused sink (ADR 0032) gets nothing while paused; its backlog is
/// delivered, in order, once it is resumed. The projection beside it goes on.
#[tokio::test(start_paused = true)]
async fn a_paused_sink_keeps_its_backlog_until_resumed() {
    let j = journal();
    let bus = Recorder::new("bus", EventTypeFilter::all());
    let rt = runtime(&j, std::slice::from_ref(&bus), OracleProjection::new("oracle")).await;
    let s = sid("s");
    append(&rt, &s, vec![add(1)]).await;
    rt.drain().await.unwrap();
    rt.deliver().await.unwrap();
    assert_eq!(bus.of("s"), ids("s", 1..=1));
    let key = SinkName::new("bus").unwrap();
    assert!(
        outbox_runtime::consumers::pause_consumer(&j, &key, true)
            .await
            .unwrap()
    );
    // Workers see the pause at their next registry read (a heartbeat interval).
    tokio::time::advance(Config::default().heartbeat_interval).await;
    append(&rt, &s, vec![add(2), add(3)]).await;
    rt.drain().await.unwrap();
    rt.deliver().await.unwrap();
    assert_eq!(bus.of("s"), ids("s", 1..=1), "nothing delivered while paused");
    assert_eq!(
        rt.journal().summary().await.unwrap().total(),
        0,
        "the projection went on"
    );
    assert!(
        outbox_runtime::consumers::pause_consumer(&j, &key, false)
            .await
            .unwrap()
    );
    tokio::time::advance(Config::default().heartbeat_interval).await;
    rt.deliver().await.unwrap();
    assert_eq!(
        bus.of("s"),
        ids("s", 1..=3),
        "the backlog, in order, after the resume"
    );
}

/// A sink's own decision (ADR 0032): `park` dead-letters its stream at the
/// first failure, `skip` parks too (a skipped publish would lose the
/// message), `stop` pauses the sink for every stream; the projection and
/// the other streams go on.
#[tokio::test(start_paused = true)]
async fn a_sink_parks_or_stops_on_its_own_decision() {
    use outbox_core::OnError;
    for decision in [OnError::Park, OnError::Skip, OnError::Stop] {
        let j = journal();
        let bus = Recorder::new("bus", EventTypeFilter::all());
        bus.decide(decision);
        bus.fail("s", 2, u32::MAX);
        let rt = runtime(&j, std::slice::from_ref(&bus), OracleProjection::new("oracle")).await;
        append(&rt, &sid("s"), vec![add(1), add(2), add(3)]).await;
        append(&rt, &sid("t"), vec![add(1)]).await;
        rt.drain().await.unwrap();
        rt.deliver().await.unwrap();
        let key = SinkName::new("bus").unwrap();
        let state = j.sink_states(&key, &[sid("s")]).await.unwrap().remove(0);
        let paused = outbox_runtime::consumers::consumer_statuses(&j)
            .await
            .unwrap()
            .iter()
            .any(|c| c.info.key == key && c.info.paused);
        assert_eq!(
            bus.of("s"),
            ids("s", 1..=1),
            "{decision:?}: stopped before its event"
        );
        assert_eq!(
            rt.journal().summary().await.unwrap().total(),
            0,
            "{decision:?}: the projection went on"
        );
        match decision {
            OnError::Park | OnError::Skip => {
                assert_eq!(
                    (state.status, state.attempt_count),
                    (SinkStatus::Dead, 1),
                    "{decision:?}"
                );
                assert!(!paused, "{decision:?}");
                assert_eq!(bus.of("t"), ids("t", 1..=1), "{decision:?}: the other stream");
            }
            _ => {
                assert_eq!(state.status, SinkStatus::Failed, "{decision:?}");
                assert!(paused, "{decision:?}: the sink is paused for every stream");
            }
        }
    }
}
