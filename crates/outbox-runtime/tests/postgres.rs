//! The runtime on Postgres: the LISTEN/NOTIFY wake source across pools,
//! several runtimes (each with its own pools, as separate processes would
//! have) on one database with one of them crashing, and poison rows.
//!
//! Needs `OUTBOX_TEST_DATABASE_URL` (`cargo xtask test` provides one);
//! without it the tests are skipped with one line saying so (outside CI).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{
    AppendOptions, AppendRequest, EventJournal, ExpectedVersion, OutboxInspector, Projection,
    ProjectionStore, RetryPolicy, Seq, StreamId, WorkerId,
};
use outbox_postgres::sqlx;
use outbox_postgres::testing::{DropSchemas, unique_schema};
use outbox_postgres::{PgJournal, PgOptions, PgProjectionStore, PgTx};
use outbox_runtime::{Config, Outbox};
use outbox_testkit::{
    Expected, Faults, OracleProjection, add, check_history, oracle_registry, read_state, sid,
};

type Rt = Outbox<PgJournal, PgProjectionStore>;

/// A journal schema and a projection schema no other test uses on the
/// server at `url`, dropped at the end.
struct Schemas {
    url: String,
    journal: String,
    projections: String,
    _drop: DropSchemas,
}

impl Schemas {
    /// `None` when the Postgres tests are skipped (no server, outside CI):
    /// the test returns.
    fn new(tag: &str) -> Option<Schemas> {
        let url = outbox_testkit::pg::test_database_url()?;
        let base = unique_schema(&format!("rt_{tag}"));
        Some(Schemas {
            journal: format!("{base}_j"),
            projections: format!("{base}_p"),
            _drop: DropSchemas::new(&url, [format!("{base}_j"), format!("{base}_p")]),
            url,
        })
    }

    fn options(schema: &str) -> PgOptions {
        PgOptions::default()
            .with_schema(schema)
            .with_max_connections(4)
            .with_acquire_timeout(Duration::from_secs(20))
    }

    async fn journal(&self) -> PgJournal {
        PgJournal::connect(&self.url, Self::options(&self.journal))
            .await
            .expect("connect journal")
    }

    async fn projections(&self) -> PgProjectionStore {
        PgProjectionStore::connect(&self.url, Self::options(&self.projections))
            .await
            .expect("connect projections")
    }
}

fn oracle() -> (Arc<dyn Projection<PgTx>>, Faults) {
    let p = OracleProjection::new("oracle");
    let f = p.faults();
    (p.shared(), f)
}

/// A runtime with pools of its own on the schemas.
async fn open(s: &Schemas, config: Config, p: &Arc<dyn Projection<PgTx>>, wake: bool) -> Rt {
    let journal = s.journal().await;
    let store = s.projections().await;
    let mut b = Outbox::builder(journal.clone(), store)
        .config(config)
        .event_types(oracle_registry())
        .projection(p.clone());
    if wake {
        b = b.wake_source(journal.wake_source());
    }
    b.build().await.unwrap()
}

async fn close(rt: &Rt) {
    rt.journal().close().await;
    rt.store().close().await;
}

async fn wait_drained(rt: &Rt, limit: Duration) {
    let start = Instant::now();
    loop {
        let s = rt.journal().summary().await.unwrap();
        let failing = rt.projection_states(None, 10).await.unwrap();
        if s.total() == 0 && failing.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "not drained within {limit:?}: {s:?}, projections off the shared path: {failing:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits up to `limit` for the oracle to have applied `stream` through
/// `through`; returns how long it took, or `None`.
async fn applied_within(rt: &Rt, stream: &StreamId, through: u64, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let name = outbox_core::ProjectionName::new("oracle").unwrap();
    loop {
        use outbox_core::ProjectionStore;
        if rt.store().checkpoint(&name, stream).await.unwrap() >= through {
            return Some(start.elapsed());
        }
        if start.elapsed() >= limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// With a one-hour poll interval, only a wake-up can make an idle worker
/// look again within seconds. A worker with the journal's wake source applies
/// an event appended through another pool (as another process would) within
/// the bound; one without it is reported (not asserted: a spurious wake-up
/// is allowed by the contract, polling is the fallback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_source_wakes_an_idle_worker_for_an_append_from_another_pool() {
    const BOUND: Duration = Duration::from_secs(5);
    let config = Config::apply_worker()
        .with_poll_interval(Duration::from_secs(3600))
        .with_repair_on_start(false);
    let mut outcomes = Vec::new();
    for wake in [true, false] {
        let Some(s) = Schemas::new(if wake { "wake" } else { "nowake" }) else {
            return;
        };
        let (p, _) = oracle();
        let rt = open(&s, config.clone(), &p, wake).await;
        let running = rt.start().await.unwrap();
        // Let the worker finish its first (empty) pass, go idle and LISTEN.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let other = s.journal().await;
        let stream = sid("woken");
        other
            .append(
                &[AppendRequest::new(
                    stream.clone(),
                    ExpectedVersion::NoStream,
                    vec![add(7)],
                )],
                AppendOptions::enqueue(),
            )
            .await
            .unwrap();
        let took = applied_within(&rt, &stream, 1, BOUND).await;
        eprintln!(
            "wake source {}: the idle worker applied an append from another pool {}",
            if wake { "on" } else { "off" },
            match took {
                Some(d) => format!("after {d:?}"),
                None => format!("not within {BOUND:?}"),
            }
        );
        outcomes.push((wake, took));
        running.shutdown().await;
        other.close().await;
        close(&rt).await;
    }
    assert!(
        outcomes[0].1.is_some(),
        "with the wake source the worker must apply the append within {BOUND:?}"
    );
}

fn expected(streams: &[StreamId], events: u64, value: i64) -> BTreeMap<String, Expected> {
    streams
        .iter()
        .map(|s| {
            (
                s.to_string(),
                Expected {
                    through: events,
                    sum: value * events as i64,
                },
            )
        })
        .collect()
}

/// Three runtimes on one database, 100 streams x 50 events; one is aborted
/// while it holds a stream lease and its pools are closed (what a dead
/// process leaves: its leases live until they expire). The others finish the
/// work: every event applied exactly once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_runtimes_on_one_database_one_crashes_nothing_lost_or_doubled() {
    let Some(s) = Schemas::new("three") else { return };
    let (p, _) = oracle();
    // Stream leases (partitioned crashes: `outbox-demo`'s rebalance test
    // and the crash harness).
    let config = Config::apply_worker()
        .with_lease_ttl(Duration::from_millis(1500))
        .with_poll_interval(Duration::from_millis(50))
        .with_batch_size(16)
        .with_leasing(false)
        .with_repair_on_start(false);
    let mut rts = Vec::new();
    for i in 0..3 {
        let c = config
            .clone()
            .with_worker_id(WorkerId::new(format!("pg-rt-{i}")).unwrap());
        rts.push(open(&s, c, &p, true).await);
    }
    let streams: Vec<StreamId> = (0..100).map(|i| sid(&format!("s{i:03}"))).collect();
    // 100 streams x 50 events, appended in 5 rounds of one transaction each.
    for round in 0..5u64 {
        let batch: Vec<AppendRequest> = streams
            .iter()
            .map(|st| {
                AppendRequest::new(
                    st.clone(),
                    ExpectedVersion::Exact(round * 10),
                    (0..10).map(|_| add(3)).collect(),
                )
            })
            .collect();
        rts[0].append_batch(batch).await.unwrap();
    }
    // Runtime 0 starts alone, so it is certain to hold stream leases however
    // loaded the machine is (the others cannot drain the backlog first); it is
    // crashed while it holds one, then the other two start and take over.
    let mut running: Vec<_> = vec![Some(rts[0].start().await.unwrap())];
    let victim = rts[0].worker_id().clone();
    let mut stranded = BTreeSet::new();
    for _ in 0..30_000 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let mut held = Vec::new();
        for st in &streams {
            if let Some(l) = rts[1].journal().lease(st).await.unwrap()
                && l.owner == victim
            {
                held.push(st.clone());
            }
        }
        if !held.is_empty() {
            running[0].take().unwrap().abort();
            close(&rts[0]).await;
            for st in held {
                if let Some(l) = rts[1].journal().lease(&st).await.unwrap()
                    && l.owner == victim
                {
                    // Stranded with work: events the crashed runtime had not applied.
                    let oracle = outbox_core::ProjectionName::new("oracle").unwrap();
                    let applied = rts[1].store().checkpoint(&oracle, &st).await.unwrap();
                    let version = rts[1].journal().stream_version(&st).await.unwrap();
                    if applied < version {
                        stranded.insert(st);
                    }
                }
            }
            break;
        }
    }
    assert!(running[0].is_none(), "runtime 0 never held a lease to crash with");
    for rt in &rts[1..] {
        running.push(Some(rt.start().await.unwrap()));
    }
    wait_drained(&rts[1], Duration::from_secs(120)).await;
    for r in running.into_iter().flatten() {
        r.shutdown().await;
    }
    let state = read_state(rts[1].store(), "oracle").await.unwrap();
    check_history(&state, &expected(&streams, 50, 3), &BTreeMap::new())
        .expect("every event applied exactly once, in order");
    eprintln!(
        "runtime 0 crashed holding {} stream lease(s); all were taken over after expiry",
        stranded.len()
    );
    for st in &stranded {
        let l = rts[1].journal().lease(st).await.unwrap();
        assert!(
            l.is_none_or(|l| l.owner != victim),
            "{st} still held by the crashed runtime"
        );
    }
    let totals: u64 = rts[1..].iter().map(|r| r.metrics().completed_rows).sum();
    assert!(totals > 0, "the surviving runtimes did the work");
    for rt in &rts[1..] {
        close(rt).await;
    }
}

/// A poison event dead-letters on exactly the threshold-th failure, blocks
/// only its stream, and once requeued (after the fix) applies exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_on_postgres_dead_letters_at_the_threshold_and_requeue_applies_once() {
    let Some(s) = Schemas::new("poison") else { return };
    let (p, faults) = oracle();
    let policy = RetryPolicy::new(Duration::from_millis(5), Duration::from_millis(20), 3).unwrap();
    let rt = open(
        &s,
        Config::apply_worker()
            .with_retry(policy)
            .with_poll_interval(Duration::from_millis(10)),
        &p,
        true,
    )
    .await;
    let (bad, good) = (sid("bad"), sid("good"));
    faults.fail(&bad, 2, u32::MAX);
    rt.append(&bad, ExpectedVersion::NoStream, vec![add(1), add(2), add(3)])
        .await
        .unwrap();
    rt.append(&good, ExpectedVersion::NoStream, vec![add(5), add(5)])
        .await
        .unwrap();
    let running = rt.start().await.unwrap();
    let start = Instant::now();
    let oracle = outbox_core::ProjectionName::new("oracle").unwrap();
    let dead = loop {
        let dead = rt
            .projection_states(Some(outbox_core::SinkStatus::Dead), 10)
            .await
            .unwrap();
        if !dead.is_empty() {
            break dead;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never dead-lettered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        (dead[0].stream.as_str(), dead[0].seq + 1, dead[0].attempt_count),
        ("bad", 2, 3),
        "dead for the projection on bad/2 after three attempts"
    );
    // The other stream flowed meanwhile.
    assert!(
        rt.journal()
            .row(&good, Seq::new(2).unwrap())
            .await
            .unwrap()
            .is_none()
            || applied_within(&rt, &good, 2, Duration::from_secs(10))
                .await
                .is_some()
    );
    faults.clear();
    rt.requeue_projection(&oracle, &bad).await.unwrap();
    wait_drained(&rt, Duration::from_secs(30)).await;
    running.shutdown().await;
    let state = read_state(rt.store(), "oracle").await.unwrap();
    let want = BTreeMap::from([
        ("bad".to_string(), Expected { through: 3, sum: 6 }),
        ("good".to_string(), Expected { through: 2, sum: 10 }),
    ]);
    check_history(&state, &want, &BTreeMap::new()).unwrap();
    close(&rt).await;
}

/// A sink that records the message ids it was given.
struct Recorder {
    name: outbox_core::SinkName,
    got: std::sync::Mutex<Vec<String>>,
}

#[outbox_core::async_trait]
impl outbox_core::Sink for Recorder {
    fn name(&self) -> &outbox_core::SinkName {
        &self.name
    }

    async fn publish(&self, events: &[outbox_core::Event]) -> outbox_core::Published {
        let mut got = self.got.lock().unwrap();
        got.extend(events.iter().map(outbox_core::message_id));
        outbox_core::Published::all(events.len())
    }
}

/// A runtime on `s` with the oracle projection and a [`Recorder`] sink,
/// one worker without leases or start-up repair (the tests drive it).
async fn recording(s: &Schemas) -> (PgJournal, Rt, Arc<Recorder>) {
    let journal = s.journal().await;
    let sink = Arc::new(Recorder {
        name: outbox_core::SinkName::new("recorder").unwrap(),
        got: std::sync::Mutex::default(),
    });
    let (p, _) = oracle();
    let rt: Rt = Outbox::builder(journal.clone(), s.projections().await)
        .config(
            Config::apply_worker()
                .with_leasing(false)
                .with_repair_on_start(false),
        )
        .event_types(oracle_registry())
        .projection(p)
        .sink_arc(sink.clone())
        .build()
        .await
        .unwrap();
    (journal, rt, sink)
}

/// Delivers until the sink's message ids (sorted) satisfy `done`, or a
/// bound for liveness (other tests' transactions on the server may hold the
/// scan back a moment; they never make it skip anything); returns them.
async fn deliver_until(rt: &Rt, sink: &Recorder, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    for _ in 0..3_000 {
        rt.deliver().await.unwrap();
        let mut got = sink.got.lock().unwrap().clone();
        got.sort();
        if done(&got) {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut got = sink.got.lock().unwrap().clone();
    got.sort();
    got
}

/// The reproduction of a lost sink message (ADR 0030): `quiet:1` takes
/// global position 1 in a transaction left open, `busy:1` commits at
/// position 2 and is delivered, then `quiet:1` commits. It used to be
/// published never: the scan cursor had passed its position. Now the scan
/// waits below the open transaction and publishes both, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_gets_an_event_that_commits_after_a_later_one_was_delivered() {
    let Some(s) = Schemas::new("late") else { return };
    let (journal, rt, sink) = recording(&s).await;
    // A first event, delivered: the sink has stored state to report on.
    rt.append(&sid("warm"), ExpectedVersion::Any, vec![add(3)])
        .await
        .unwrap();
    deliver_until(&rt, &sink, |got| !got.is_empty()).await;
    let mut t1 = journal.begin().await.unwrap();
    journal
        .append_in(
            &mut t1,
            &[AppendRequest::new(
                sid("quiet"),
                ExpectedVersion::Any,
                vec![add(1)],
            )],
            AppendOptions::enqueue(),
        )
        .await
        .unwrap();
    rt.append(&sid("busy"), ExpectedVersion::Any, vec![add(2)])
        .await
        .unwrap();
    rt.deliver().await.unwrap();
    // `busy:1` committed after `quiet`'s transaction began writing: the
    // scan holds it back, and says so.
    let summary = outbox_core::SinkStore::sinks(&journal).await.unwrap();
    assert!(
        !summary.is_empty() && summary.iter().all(|s| s.held_back >= 1),
        "the held-back event is reported: {summary:?}"
    );
    t1.commit().await.unwrap();
    let want = ["busy:1".to_owned(), "quiet:1".to_owned(), "warm:1".to_owned()];
    let got = deliver_until(&rt, &sink, |got| got == want).await;
    assert_eq!(got, want, "both events published, each once");
    rt.journal().close().await;
}

/// After a logical restore into another server the stored events keep the
/// old server's transaction ids, which the new server's stay below: a sink
/// cursor among them would skip every new event. Simulated here by moving
/// every stored key and cursor a billion ids ahead. The feed refuses such
/// keys (the sink pass fails, saying what to do, and publishes nothing);
/// `rekey_feed` gives them keys of this server, and the sink then gets the
/// new event, and nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_refuses_keys_of_another_server_until_the_feed_is_rekeyed() {
    let Some(s) = Schemas::new("rekey") else { return };
    let (journal, rt, sink) = recording(&s).await;
    rt.append(&sid("before"), ExpectedVersion::Any, vec![add(1), add(2)])
        .await
        .unwrap();
    // Other tests' transactions may hold the scan back a moment.
    let got = deliver_until(&rt, &sink, |got| got.len() == 2).await;
    assert_eq!(got.len(), 2, "delivered before the restore");
    // "The restore": the stored keys and cursors are another server's.
    for sql in [
        "UPDATE events SET txid = (txid::text::bigint + 1000000000)::text::xid8",
        "UPDATE outbox_sink_cursors SET position = position + 1000000000",
    ] {
        sqlx::query(sql).execute(journal.pool()).await.unwrap();
    }
    rt.append(&sid("after"), ExpectedVersion::Any, vec![add(3)])
        .await
        .unwrap();
    let refused = rt.deliver().await.unwrap_err().to_string();
    assert!(refused.contains("outbox sinks rekey"), "{refused}");
    assert_eq!(sink.got.lock().unwrap().len(), 2, "nothing published meanwhile");
    let rekeyed = journal.rekey_feed().await.unwrap();
    assert_eq!(rekeyed, 3, "every event re-keyed");
    let want = ["after:1", "before:1", "before:2"].map(String::from);
    let got = deliver_until(&rt, &sink, |got| got == want).await;
    assert_eq!(got, want, "the new event published, nothing twice");
    rt.journal().close().await;
}

/// A projection that waits for its gate to open before every apply.
struct Gated {
    inner: Arc<dyn Projection<PgTx>>,
    open: tokio::sync::watch::Receiver<bool>,
}

#[outbox_core::async_trait]
impl Projection<PgTx> for Gated {
    fn name(&self) -> &outbox_core::ProjectionName {
        self.inner.name()
    }
    async fn apply(&self, tx: &mut PgTx, e: &outbox_core::Event) -> Result<(), outbox_core::BoxError> {
        let mut open = self.open.clone();
        let _ = open.wait_for(|o| *o).await;
        self.inner.apply(tx, e).await
    }
    async fn reset(&self, tx: &mut PgTx) -> Result<(), outbox_core::BoxError> {
        self.inner.reset(tx).await
    }
    async fn digest(
        &self,
        tx: &mut PgTx,
        out: &mut outbox_core::DigestBuilder,
    ) -> Result<(), outbox_core::BoxError> {
        self.inner.digest(tx, out).await
    }
}

/// Issues 43 (point 4) and 45 on Postgres: two workers started together,
/// the first held inside its first sweep by a gate (nothing depends on
/// speed). The second holds its share of the partitions when its `start`
/// returns and leaves start-up repair to the first; each applies a share,
/// every event once and in stream order, the streams without outbox rows
/// included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_started_together_share_the_drain_and_repair_once() {
    use outbox_core::{Partition, PartitionStore};
    let Some(s) = Schemas::new("fleet") else { return };
    let (p, _) = oracle();
    let queued: Vec<StreamId> = (0..40).map(|i| sid(&format!("s{i:02}"))).collect();
    let unqueued: Vec<StreamId> = (0..10).map(|i| sid(&format!("u{i:02}"))).collect();
    {
        let journal = s.journal().await;
        let reqs = |ids: &[StreamId], n: usize| -> Vec<AppendRequest> {
            ids.iter()
                .map(|id| AppendRequest::new(id.clone(), ExpectedVersion::NoStream, vec![add(1); n]))
                .collect()
        };
        journal
            .append(&reqs(&queued, 50), AppendOptions::enqueue())
            .await
            .unwrap();
        journal
            .append(&reqs(&unqueued, 2), AppendOptions::journal_only())
            .await
            .unwrap();
        journal.close().await;
    }
    let config = |id: &str| {
        Config::apply_worker()
            .with_poll_interval(Duration::from_millis(10))
            .with_worker_id(WorkerId::new(id).unwrap())
    };
    let (gate, opens) = tokio::sync::watch::channel(false);
    let gated: Arc<dyn Projection<PgTx>> = Arc::new(Gated {
        inner: p.clone(),
        open: opens,
    });
    let first = open(&s, config("first"), &gated, false).await;
    let second = open(&s, config("second"), &p, false).await;
    let count = first.journal().partitioning().count();
    let a = first.start().await.unwrap();
    assert_eq!(first.held_partitions(), Partition::all(count).collect::<Vec<_>>());
    let b = second.start().await.unwrap();
    let share = outbox_core::assigned_to(
        second.worker_id(),
        &[first.worker_id().clone(), second.worker_id().clone()],
        count,
    );
    assert!(!share.is_empty());
    assert_eq!(
        second.held_partitions(),
        share,
        "the second holds its share when its start returns"
    );
    let (ra, rb) = (
        a.repair_report().expect("repair ran").clone(),
        b.repair_report().expect("repair ran").clone(),
    );
    assert_eq!((ra.streams_scanned, ra.handed_to_worker), (50, 50), "{ra:?}");
    assert_eq!((rb.streams_scanned, rb.handed_to_worker), (0, 0), "{rb:?}");
    gate.send(true).unwrap();
    wait_drained(&second, Duration::from_secs(120)).await;
    b.shutdown().await;
    a.shutdown().await;
    let (by_first, by_second) = (first.metrics().applied, second.metrics().applied);
    assert!(
        by_first > 0 && by_second > 0 && by_first + by_second == 40 * 50 + 10 * 2,
        "each applied a share: first {by_first}, second {by_second}"
    );
    let mut want = BTreeMap::new();
    for (ids, n) in [(&queued, 50u64), (&unqueued, 2)] {
        for id in ids {
            want.insert(
                id.to_string(),
                Expected {
                    through: n,
                    sum: n as i64,
                },
            );
        }
    }
    let state = read_state(first.store(), "oracle").await.expect("oracle state");
    check_history(&state, &want, &BTreeMap::new()).unwrap();
    assert_eq!(state.ledger.len(), 40 * 50 + 10 * 2, "each event applied once");
    close(&first).await;
    close(&second).await;
}
