//! Runtime behaviour on the memory adapter, in tokio's virtual time.

use outbox_core::ActivityLog as _;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    ActivityCounts, ActivitySeries, AppendOptions, AppendRequest, Clock, EventJournal, ExpectedVersion,
    LeaseStore, Mode, ModeFlags, OutboxInspector, OutboxQueue, Projection, ProjectionStore, RetryPolicy, Seq,
    SinkStatus, SinkStore, StreamId, WorkerRegistry,
};
use outbox_memory::{MemoryJournal, MemoryProjectionStore, MemoryTx};
use outbox_runtime::{Config, Outbox, TokioClock};
use outbox_testkit::{
    Expected, Faults, OracleProjection, Seed, add, audit, check_history, oracle_registry, read_state, sid,
};

type Rt = Outbox<MemoryJournal, MemoryProjectionStore>;

const ORACLE: &str = "oracle";

struct Env {
    journal: MemoryJournal,
    store: MemoryProjectionStore,
    faults: Faults,
    oracle: Arc<dyn Projection<MemoryTx>>,
}

fn env() -> Env {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::default());
    let p = OracleProjection::new(ORACLE);
    let faults = p.faults();
    Env {
        journal: MemoryJournal::with_clock(clock.clone()),
        store: MemoryProjectionStore::with_clock(clock),
        faults,
        oracle: p.shared(),
    }
}

fn flags(outbox: bool, apply_worker: bool, shadow_worker: bool) -> ModeFlags {
    ModeFlags {
        outbox,
        apply_worker,
        shadow_worker,
        inline_apply: true,
    }
}

async fn runtime(e: &Env, config: Config) -> Rt {
    Outbox::builder(e.journal.clone(), e.store.clone())
        .config(config)
        .event_types(oracle_registry())
        .projection(e.oracle.clone())
        .build()
        .await
        .expect("runtime builds")
}

fn worker_config() -> Config {
    Config::apply_worker().with_poll_interval(Duration::from_millis(200))
}

/// Until every row is done and no projection is off the shared path.
async fn wait_until_drained(rt: &Rt) {
    for _ in 0..10_000 {
        if rt.journal().summary().await.unwrap().total() == 0
            && rt.projection_states(None, 1).await.unwrap().is_empty()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "outbox not drained: {:?}, projections off the shared path: {:?}",
        rt.journal().summary().await.unwrap(),
        rt.projection_states(None, 10).await.unwrap()
    );
}

/// The oracle projection's consumer state on `stream` (ADR 0032).
async fn oracle_state(rt: &Rt, stream: &StreamId) -> outbox_core::SinkStream {
    consumer_state(rt, ORACLE, stream).await
}

/// Projection `name`'s consumer state on `stream` (ADR 0032).
async fn consumer_state(rt: &Rt, name: &str, stream: &StreamId) -> outbox_core::SinkStream {
    let key = outbox_core::projection_consumer(&outbox_core::ProjectionName::new(name).unwrap()).unwrap();
    rt.journal()
        .sink_states(&key, std::slice::from_ref(stream))
        .await
        .unwrap()
        .remove(0)
}

async fn state(e: &Env) -> outbox_testkit::OracleState {
    read_state(&e.store, ORACLE).await.expect("oracle state")
}

fn expect(streams: &[(&str, u64, i64)]) -> BTreeMap<String, Expected> {
    streams
        .iter()
        .map(|(s, through, sum)| {
            (
                s.to_string(),
                Expected {
                    through: *through,
                    sum: *sum,
                },
            )
        })
        .collect()
}

async fn append_values(rt: &Rt, stream: &StreamId, values: &[i64]) {
    let events = values.iter().map(|v| add(*v)).collect();
    rt.append(stream, ExpectedVersion::Any, events)
        .await
        .expect("append");
}

#[tokio::test(start_paused = true)]
async fn every_append_enqueues_exactly_when_the_mode_says() {
    for (f, rows_left, applied) in [
        (flags(false, false, false), 0, true), // inline only: no rows
        (flags(true, false, false), 0, true),  // outbox + inline: rows deleted after inline apply
        (flags(true, true, false), 3, false),  // apply worker (not started): rows wait
        (flags(true, false, true), 3, true),   // shadow: applied inline, rows kept for the shadow worker
    ] {
        let e = env();
        let rt = runtime(&e, Config::default().with_flags(f)).await;
        append_values(&rt, &sid("s"), &[1, 2, 3]).await;
        let summary = rt.journal().summary().await.unwrap();
        assert_eq!(summary.total(), rows_left, "{}: rows left", rt.mode());
        assert_eq!(rt.journal().stream_version(&sid("s")).await.unwrap(), 3);
        let cp = rt.store().checkpoint(e.oracle.name(), &sid("s")).await.unwrap();
        assert_eq!(cp, if applied { 3 } else { 0 }, "{}: inline apply", rt.mode());
    }
}

#[tokio::test(start_paused = true)]
async fn each_mode_starts_the_right_tasks_and_no_others() {
    for (f, mode, apply, shadow) in [
        (flags(false, false, false), Mode::InlineApplyOnly, false, false),
        (flags(true, false, false), Mode::OutboxInline, false, false),
        (flags(true, true, false), Mode::OutboxApplyOnly, true, false),
        (flags(true, false, true), Mode::ShadowOnly, false, true),
        (flags(true, true, true), Mode::OutboxApplyOnly, true, false),
    ] {
        let e = env();
        let rt = runtime(&e, Config::default().with_flags(f)).await;
        assert_eq!(rt.mode(), mode);
        let running = rt.start().await.unwrap();
        let t = running.tasks();
        assert_eq!(
            (t.apply_worker, t.shadow_worker, t.heartbeat),
            (apply, shadow, apply || shadow),
            "{mode}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let registered = rt.journal().workers().await.unwrap();
        assert_eq!(
            registered.len(),
            usize::from(apply || shadow),
            "{mode}: worker registry"
        );
        running.shutdown().await;
        assert!(
            rt.journal().workers().await.unwrap().is_empty(),
            "{mode}: deregistered on shutdown"
        );
    }
    for f in [flags(false, true, false), flags(false, false, true)] {
        let e = env();
        let err = Outbox::builder(e.journal.clone(), e.store.clone())
            .config(Config::default().with_flags(f))
            .build()
            .await;
        assert!(err.err().unwrap().to_string().contains("OUTBOX_ENABLED is not"));
    }
}

#[tokio::test(start_paused = true)]
async fn retries_follow_the_backoff_schedule_and_dead_letter_at_the_threshold() {
    let e = env();
    let rt = runtime(&e, worker_config()).await;
    let poison = sid("poison");
    e.faults.fail(&poison, 1, u32::MAX);
    let running = rt.start().await.unwrap();
    append_values(&rt, &poison, &[1, 2]).await;
    append_values(&rt, &sid("healthy"), &[5, 6]).await;

    let policy = RetryPolicy::default();
    let mut seen = 0;
    let mut delays = Vec::new();
    for _ in 0..100_000 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let held = oracle_state(&rt, &poison).await;
        if held.attempt_count > seen {
            seen = held.attempt_count;
            if held.status == SinkStatus::Failed {
                delays.push(held.next_attempt_at.duration_since(held.updated_at));
            }
        }
        if held.status == SinkStatus::Dead {
            break;
        }
    }
    running.shutdown().await;
    let want: Vec<Duration> = (1..8).map(|n| policy.delay(n)).collect();
    assert_eq!(delays, want, "one retry per failure, 1s doubling");
    let held = oracle_state(&rt, &poison).await;
    assert_eq!(
        (held.status, held.attempt_count, held.seq),
        (SinkStatus::Dead, 8, 0),
        "dead after exactly 8 failures, on the stream's first event"
    );
    assert!(held.last_error.unwrap().contains("injected failure"));
    assert_eq!(
        rt.journal().summary().await.unwrap().total(),
        0,
        "the rows are done: the projection's later events wait on its own state"
    );
    let m = rt.metrics();
    assert_eq!((m.failed, m.dead_lettered), (7, 1));
    let activity = rt.journal().activity(60).await.unwrap();
    assert!(
        activity.minutes.len() > 1,
        "the retries (127 s of backoff) spread over minutes: {activity:?}"
    );
    assert_eq!(
        activity_total(&activity),
        ActivityCounts {
            applied: m.completed_rows,
            failed: 7,
            dead: 1
        },
        "the heartbeat put every count in the journal's per-minute activity"
    );
    check_history(
        &state(&e).await,
        &expect(&[("healthy", 2, 11), ("poison", 0, 0)]),
        &BTreeMap::new(),
    )
    .expect("the healthy stream flowed; nothing of the poisoned one applied");
}

fn activity_total(a: &ActivitySeries) -> ActivityCounts {
    a.minutes
        .iter()
        .fold(ActivityCounts::default(), |t, m| ActivityCounts {
            applied: t.applied + m.counts.applied,
            failed: t.failed + m.counts.failed,
            dead: t.dead + m.counts.dead,
        })
}

/// Every event the worker applies is observed once in the lag histogram,
/// in both worker shapes (sweeps and per-stream passes); nothing was taken
/// over.
#[tokio::test(start_paused = true)]
async fn the_lag_histogram_observes_every_applied_event_in_both_worker_shapes() {
    for sweep_rows in [512, 0] {
        let e = env();
        let rt = runtime(&e, worker_config().with_sweep_rows(sweep_rows)).await;
        let running = rt.start().await.unwrap();
        for s in ["a", "b", "c"] {
            append_values(&rt, &sid(s), &[1, 2, 3, 4]).await;
        }
        wait_until_drained(&rt).await;
        running.shutdown().await;
        let m = rt.metrics();
        assert_eq!(m.applied, 12, "sweep_rows {sweep_rows}");
        assert_eq!(
            m.lag.count, 12,
            "sweep_rows {sweep_rows}: one observation per applied event"
        );
        let (last_bound, last_count) = *m.lag.buckets.last().unwrap();
        assert_eq!(last_bound, *outbox_runtime::LAG_BUCKETS_MS.last().unwrap());
        assert_eq!(last_count, 12, "no lag beyond a minute");
        assert!(
            m.lag.buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "cumulative buckets: {:?}",
            m.lag.buckets
        );
        assert_eq!(m.lease_takeovers, 0);
    }
}

/// A runtime started twice records each count once: the second start
/// carries on from what the first recorded.
#[tokio::test(start_paused = true)]
async fn activity_is_recorded_once_across_restarts() {
    let e = env();
    let rt = runtime(&e, worker_config()).await;
    for (stream, values) in [("a", &[1, 2, 3][..]), ("b", &[4, 5][..])] {
        let running = rt.start().await.unwrap();
        append_values(&rt, &sid(stream), values).await;
        wait_until_drained(&rt).await;
        running.shutdown().await;
    }
    assert_eq!(rt.metrics().completed_rows, 5);
    assert_eq!(
        activity_total(&rt.journal().activity(60).await.unwrap()),
        ActivityCounts {
            applied: 5,
            failed: 0,
            dead: 0
        }
    );
}

#[tokio::test(start_paused = true)]
async fn transient_applier_errors_are_retried_until_success() {
    let e = env();
    let rt = runtime(&e, worker_config()).await;
    let s = sid("s");
    e.faults.fail(&s, 2, 3);
    let running = rt.start().await.unwrap();
    append_values(&rt, &s, &[1, 2, 3]).await;
    wait_until_drained(&rt).await;
    running.shutdown().await;
    check_history(&state(&e).await, &expect(&[("s", 3, 6)]), &BTreeMap::new()).unwrap();
    assert_eq!(rt.metrics().failed, 3);
}

/// Many streams with failing events in both worker shapes (sweeps, the
/// default, and per-stream passes): every stream ends applied exactly once,
/// in order, with the failures counted once each.
#[tokio::test(start_paused = true)]
async fn sweeps_and_per_stream_passes_drain_failing_streams_alike() {
    for sweep_rows in [Config::default().sweep_rows, 7, 0] {
        let e = env();
        let rt = runtime(&e, worker_config().with_batch_size(3).with_sweep_rows(sweep_rows)).await;
        let streams: Vec<StreamId> = (0..12).map(|i| sid(&format!("s{i:02}"))).collect();
        for (i, s) in streams.iter().enumerate() {
            if i % 3 == 0 {
                // Fails twice on its 2nd event, then applies.
                e.faults.fail(s, 2, 2);
            }
        }
        let running = rt.start().await.unwrap();
        for s in &streams {
            append_values(&rt, s, &[1, 2, 3, 4, 5]).await;
        }
        wait_until_drained(&rt).await;
        running.shutdown().await;
        let want: Vec<(String, u64, i64)> = streams.iter().map(|s| (s.to_string(), 5, 15)).collect();
        let want: Vec<(&str, u64, i64)> = want.iter().map(|(s, t, v)| (s.as_str(), *t, *v)).collect();
        check_history(&state(&e).await, &expect(&want), &BTreeMap::new())
            .unwrap_or_else(|err| panic!("sweep_rows {sweep_rows}: {err}"));
        assert_eq!(
            rt.metrics().failed,
            8,
            "sweep_rows {sweep_rows}: 4 streams x 2 failures"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn poison_blocks_only_its_stream_and_requeue_applies_it_exactly_once() {
    let e = env();
    let policy = RetryPolicy::new(Duration::from_secs(1), Duration::from_secs(4), 3).unwrap();
    let rt = runtime(&e, worker_config().with_retry(policy)).await;
    let (a, b) = (sid("a"), sid("b"));
    e.faults.fail(&a, 2, u32::MAX);
    let running = rt.start().await.unwrap();
    append_values(&rt, &a, &[1, 2, 3, 4, 5]).await;
    append_values(&rt, &b, &[10, 20]).await;
    // Wait (in virtual time) until the poisoned row is dead.
    let mut dead_seen = false;
    for _ in 0..10_000 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if oracle_state(&rt, &a).await.status == SinkStatus::Dead {
            dead_seen = true;
            break;
        }
    }
    assert!(
        dead_seen,
        "the poisoned event never died: {:?}",
        oracle_state(&rt, &a).await
    );
    let dead = rt.projection_states(Some(SinkStatus::Dead), 10).await.unwrap();
    assert_eq!(
        (dead[0].stream.as_str(), dead[0].seq + 1, dead[0].attempt_count),
        ("a", 2, 3)
    );
    check_history(
        &state(&e).await,
        &expect(&[("a", 1, 1), ("b", 2, 30)]),
        &BTreeMap::new(),
    )
    .expect("a stops before its dead seq; b is unaffected");

    e.faults.clear(); // the fix is deployed
    rt.requeue_projection(&outbox_core::ProjectionName::new(ORACLE).unwrap(), &a)
        .await
        .unwrap();
    wait_until_drained(&rt).await;
    running.shutdown().await;
    check_history(
        &state(&e).await,
        &expect(&[("a", 5, 15), ("b", 2, 30)]),
        &BTreeMap::new(),
    )
    .expect("requeued row applied exactly once, then the rest of a");
}

#[tokio::test(start_paused = true)]
async fn crash_between_append_and_inline_apply_is_repaired_at_start_up() {
    let e = env();
    // The process appended and died before its inline apply ran.
    let req = AppendRequest::new(sid("s"), ExpectedVersion::NoStream, vec![add(1), audit(), add(5)]);
    e.journal
        .append(&[req], AppendOptions::journal_only())
        .await
        .unwrap();
    let rt = runtime(&e, Config::default()).await;
    assert_eq!(rt.mode(), Mode::InlineApplyOnly);
    let running = rt.start().await.unwrap();
    let report = running.repair_report().expect("repair ran").clone();
    running.shutdown().await;
    assert_eq!(
        (
            report.streams_repaired,
            report.events_applied,
            report.watermark_behind
        ),
        (1, 3, 1)
    );
    let skipped = BTreeMap::from([("s".to_string(), vec![2])]);
    check_history(&state(&e).await, &expect(&[("s", 3, 6)]), &skipped).unwrap();
    assert_eq!(rt.metrics().audit_only, 1);
}

#[tokio::test(start_paused = true)]
async fn crash_between_append_and_apply_is_repaired_by_the_worker() {
    let e = env();
    let req = AppendRequest::new(sid("s"), ExpectedVersion::NoStream, vec![add(1), add(2)]);
    e.journal.append(&[req], AppendOptions::enqueue()).await.unwrap();
    let rt = runtime(&e, worker_config().with_repair_on_start(false)).await;
    let running = rt.start().await.unwrap();
    wait_until_drained(&rt).await;
    running.shutdown().await;
    check_history(&state(&e).await, &expect(&[("s", 2, 3)]), &BTreeMap::new()).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_crash_after_the_projection_commit_ends_in_a_skipped_duplicate() {
    let e = env();
    let s = sid("s");
    let req = AppendRequest::new(s.clone(), ExpectedVersion::NoStream, vec![add(1), add(2)]);
    e.journal.append(&[req], AppendOptions::enqueue()).await.unwrap();
    // The projection transaction committed; the process died before deleting the rows.
    let events = e.journal.read_stream(&s, Seq::FIRST, 10).await.unwrap();
    e.store
        .apply(&s, &events, std::slice::from_ref(&e.oracle))
        .await
        .unwrap();
    let rt = runtime(&e, worker_config().with_repair_on_start(false)).await;
    let tick = rt.tick().await.unwrap();
    assert_eq!(tick.completed, 2);
    assert_eq!(rt.metrics().duplicates, 2, "both events skipped as duplicates");
    assert_eq!(rt.journal().summary().await.unwrap().total(), 0, "rows deleted");
    check_history(&state(&e).await, &expect(&[("s", 2, 3)]), &BTreeMap::new()).unwrap();
}

#[tokio::test(start_paused = true)]
async fn shadow_worker_drains_rows_without_touching_projections() {
    let e = env();
    let req = AppendRequest::new(sid("s"), ExpectedVersion::NoStream, vec![add(1), add(2)]);
    e.journal.append(&[req], AppendOptions::enqueue()).await.unwrap();
    let rt = runtime(
        &e,
        Config::default()
            .with_flags(flags(true, false, true))
            .with_repair_on_start(false),
    )
    .await;
    let tick = rt.tick().await.unwrap();
    assert_eq!(tick.completed, 2);
    assert_eq!(rt.metrics().shadow_verified, 2);
    assert_eq!(
        rt.store().checkpoint(e.oracle.name(), &sid("s")).await.unwrap(),
        0,
        "no projection mutation"
    );
    assert!(state(&e).await.ledger.is_empty());
}

#[tokio::test(start_paused = true)]
async fn wake_on_append_applies_without_waiting_for_the_poll() {
    for wake in [true, false] {
        let e = env();
        let config = worker_config()
            .with_poll_interval(Duration::from_secs(3600))
            .with_wake_on_append(wake);
        let rt = runtime(&e, config).await;
        let running = rt.start().await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await; // the worker is now idle, waiting
        append_values(&rt, &sid("s"), &[7]).await;
        let drained = tokio::time::timeout(Duration::from_secs(10), wait_until_drained(&rt))
            .await
            .is_ok();
        assert_eq!(
            drained, wake,
            "wake_on_append={wake}: applied within 10 virtual seconds of a 1 h poll"
        );
        running.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_leaves_no_row_processing_and_no_lease_held() {
    let e = env();
    let rt = runtime(&e, worker_config().with_batch_size(2)).await;
    let streams: Vec<StreamId> = (0..20).map(|i| sid(&format!("s{i:02}"))).collect();
    for s in &streams {
        append_values(&rt, s, &[1, 2, 3, 4, 5]).await;
    }
    let running = rt.start().await.unwrap();
    tokio::task::yield_now().await;
    running.shutdown().await;
    let summary = rt.journal().summary().await.unwrap();
    assert_eq!(summary.processing, 0, "{summary:?}");
    for s in &streams {
        let lease = rt.journal().lease(s).await.unwrap();
        assert!(lease.is_none(), "lease on {s} still held: {lease:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn unknown_or_mismatched_event_types_are_rejected_and_nothing_is_written() {
    let e = env();
    let rt = runtime(&e, Config::apply_worker()).await;
    let unknown = outbox_core::NewEvent::new(
        outbox_core::EventType::new("nope").unwrap(),
        outbox_core::Intent::Apply,
        vec![],
    );
    let err = rt
        .append(&sid("s"), ExpectedVersion::Any, vec![add(1), unknown])
        .await
        .unwrap_err();
    assert!(
        matches!(err, outbox_core::Error::UnknownEventType(ref t) if t == "nope"),
        "{err}"
    );
    let mut lying = add(1);
    lying.intent = outbox_core::Intent::AuditOnly;
    assert!(
        rt.append(&sid("s"), ExpectedVersion::Any, vec![lying])
            .await
            .is_err()
    );
    assert_eq!(rt.journal().stream_version(&sid("s")).await.unwrap(), 0);
    assert_eq!(rt.journal().summary().await.unwrap().total(), 0);
}

/// Inline apply, the worker and start-up repair give identical digests for
/// the same randomized journal.
#[tokio::test(start_paused = true)]
async fn inline_worker_and_repair_converge_on_identical_digests() {
    let seed = Seed::pick("inline_worker_and_repair_converge_on_identical_digests");
    let mut rng = seed.rng();
    let mut plan: Vec<(StreamId, Vec<outbox_core::NewEvent>)> = Vec::new();
    for _ in 0..200 {
        let s = sid(&format!("s{}", rng.below(12)));
        let n = 1 + rng.below(4) as usize;
        let events = (0..n)
            .map(|_| {
                if rng.below(5) == 0 {
                    audit()
                } else {
                    add(rng.below(1000) as i64 - 500)
                }
            })
            .collect();
        plan.push((s, events));
    }
    // 1. Inline: appends through an inline-only runtime.
    let inline = env();
    let rt_inline = runtime(&inline, Config::default()).await;
    // 2. Worker: appends enqueue, the worker drains.
    let worker = env();
    let rt_worker = runtime(&worker, worker_config().with_batch_size(3)).await;
    for (s, events) in &plan {
        rt_inline
            .append(s, ExpectedVersion::Any, events.clone())
            .await
            .unwrap();
        rt_worker
            .append(s, ExpectedVersion::Any, events.clone())
            .await
            .unwrap();
    }
    let running = rt_worker.start().await.unwrap();
    wait_until_drained(&rt_worker).await;
    running.shutdown().await;
    // 3. Repair: a fresh projection store over the worker's journal.
    let repaired = Env {
        store: MemoryProjectionStore::with_clock(Arc::new(TokioClock::default())),
        ..env()
    };
    let rt_repair = Outbox::builder(worker.journal.clone(), repaired.store.clone())
        .event_types(oracle_registry())
        .projection(repaired.oracle.clone())
        .build()
        .await
        .unwrap();
    let report = rt_repair.repair_gaps().await.unwrap();
    assert!(report.failures.is_empty());

    let d_inline = inline.store.digest(inline.oracle.as_ref()).await.unwrap();
    let d_worker = worker.store.digest(worker.oracle.as_ref()).await.unwrap();
    let d_repair = repaired.store.digest(repaired.oracle.as_ref()).await.unwrap();
    assert_eq!(d_inline, d_worker, "seed {}: inline vs worker", seed.0);
    assert_eq!(d_worker, d_repair, "seed {}: worker vs repair", seed.0);
    // And the digest is not vacuous: the oracle applied everything exactly once.
    let st = state(&worker).await;
    assert!(
        st.ledger.len() > 300,
        "seed {}: {} applies",
        seed.0,
        st.ledger.len()
    );
}

#[tokio::test(start_paused = true)]
async fn a_dead_worker_is_taken_over_after_its_lease_expires() {
    let e = env();
    let s = sid("s");
    append_values(&runtime(&e, worker_config()).await, &s, &[1, 2, 3]).await;
    // A crashed worker holds the stream's lease and has claimed its rows.
    let zombie = outbox_core::WorkerId::new("zombie").unwrap();
    let lease = e
        .journal
        .acquire(&s, &zombie, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    e.journal.claim(&lease, 10).await.unwrap();
    // Stream leases, as a worker without partition leasing takes them.
    let config = worker_config().with_repair_on_start(false).with_leasing(false);
    let rt = runtime(&e, config).await;
    let running = rt.start().await.unwrap();
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        state(&e).await.ledger.len(),
        0,
        "nothing taken over while the lease is live"
    );
    wait_until_drained(&rt).await;
    running.shutdown().await;
    check_history(&state(&e).await, &expect(&[("s", 3, 6)]), &BTreeMap::new()).unwrap();
    assert_eq!(
        rt.metrics().lease_takeovers,
        3,
        "each row the zombie left processing was taken over (claimed alone)"
    );
    let taken = e.journal.lease(&s).await.unwrap();
    assert!(taken.is_none(), "the new owner released the stream");
    assert!(
        !e.journal.release(&lease).await.unwrap(),
        "the zombie's lease is gone"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dead_workers_partitions_are_taken_over_after_its_heartbeat_ttl() {
    use outbox_core::{Mode, Partition, PartitionStore, SweepLimits, WorkerRegistry};
    let e = env();
    let s = sid("s");
    append_values(&runtime(&e, worker_config()).await, &s, &[1, 2, 3]).await;
    // A crashed worker: registered, holding every partition, its rows of
    // `s` claimed. Heartbeat TTL 15 s (the default 5 s interval, three times).
    let ttl = Duration::from_secs(15);
    let zombie = outbox_core::WorkerId::new("zombie").unwrap();
    e.journal
        .heartbeat(&zombie, "gone", 1, Mode::OutboxApplyOnly, ttl)
        .await
        .unwrap();
    let all: Vec<Partition> = Partition::all(e.journal.partitioning().count()).collect();
    e.journal.sync_partitions(&zombie, &all, ttl).await.unwrap();
    let limits = SweepLimits {
        streams: 8,
        per_stream: 8,
        rows: 8,
    };
    let claimed = e.journal.claim_partitioned(&zombie, ttl, limits).await.unwrap();
    assert_eq!(claimed.len(), 1, "the zombie claimed s");
    let rt = runtime(&e, worker_config().with_repair_on_start(false)).await;
    let running = rt.start().await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        state(&e).await.ledger.len(),
        0,
        "nothing the zombie claimed is taken over while its claim holds the stream"
    );
    // The zombie looks live until its entry expires: the new worker took
    // its own share from it at start (ADR 0022, "fair start"), no more.
    let share = outbox_core::assigned_to(
        rt.worker_id(),
        &[zombie.clone(), rt.worker_id().clone()],
        e.journal.partitioning().count(),
    );
    assert_eq!(
        rt.held_partitions(),
        share,
        "its share while the zombie's entry lives"
    );
    wait_until_drained(&rt).await;
    assert_eq!(
        rt.held_partitions(),
        all,
        "the only live worker holds every partition once the zombie's entry expired"
    );
    running.shutdown().await;
    check_history(&state(&e).await, &expect(&[("s", 3, 6)]), &BTreeMap::new()).unwrap();
    assert_eq!(
        rt.metrics().lease_takeovers,
        3,
        "each row the zombie left processing was taken over (claimed alone)"
    );
    let report = e.journal.partitions().await.unwrap();
    assert!(
        report.iter().all(|p| p.epoch == 2 && p.owner.is_none()),
        "each partition changed hands once and was released at shutdown: {report:?}"
    );
    assert!(
        e.journal.claim(&claimed[0].0, 8).await.is_err(),
        "the zombie's claim is no longer current"
    );
}

/// A second worker started beside one that took every partition gets its
/// share within a second (the first sees it join between two heartbeats),
/// not a heartbeat interval later.
#[tokio::test(start_paused = true)]
async fn a_worker_started_beside_another_gets_its_share_before_the_next_heartbeat() {
    use outbox_core::{Partition, PartitionStore, WorkerId};
    let e = env();
    // A heartbeat far away: only the membership watch can rebalance.
    let config = |id: &str| {
        worker_config()
            .with_repair_on_start(false)
            .with_heartbeat_interval(Duration::from_secs(60))
            .with_worker_id(WorkerId::new(id).unwrap())
    };
    let first = runtime(&e, config("first")).await;
    let all: Vec<Partition> = Partition::all(e.journal.partitioning().count()).collect();
    let a = first.start().await.unwrap();
    assert_eq!(
        first.held_partitions(),
        all,
        "alone, the first holds every partition"
    );
    let second = runtime(&e, config("second")).await;
    let b = second.start().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mine, theirs) = (first.held_partitions(), second.held_partitions());
    assert!(
        !mine.is_empty() && !theirs.is_empty() && mine.len() + theirs.len() == all.len(),
        "shared within a second: first {mine:?}, second {theirs:?}"
    );
    b.shutdown().await;
    a.shutdown().await;
}

/// A projection that panics on every apply of one stream.
struct Panicky {
    name: outbox_core::ProjectionName,
    stream: StreamId,
}

#[outbox_core::async_trait]
impl outbox_core::ViewProjection for Panicky {
    fn name(&self) -> &outbox_core::ProjectionName {
        &self.name
    }

    async fn apply(
        &self,
        _view: &mut outbox_core::ViewTx<'_>,
        event: &outbox_core::Event,
    ) -> Result<(), outbox_core::BoxError> {
        assert!(event.stream != self.stream, "applier bug on {}", event.stream);
        Ok(())
    }
}

/// The oracle beside a [`Panicky`] view that panics on `poison`.
async fn runtime_panicking_on(e: &Env, config: Config, poison: &StreamId) -> Rt {
    Outbox::builder(e.journal.clone(), e.store.clone())
        .config(config)
        .event_types(oracle_registry())
        .projection(e.oracle.clone())
        .view(Panicky {
            name: outbox_core::ProjectionName::new("panicky").unwrap(),
            stream: poison.clone(),
        })
        .build()
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_panicking_applier_is_a_failure_of_its_projection_and_dead_letters_at_the_threshold() {
    let e = env();
    let poison = sid("poison");
    let policy = RetryPolicy::new(Duration::from_secs(1), Duration::from_secs(4), 3).unwrap();
    let rt = runtime_panicking_on(&e, worker_config().with_retry(policy), &poison).await;
    append_values(&rt, &poison, &[1, 2]).await;
    append_values(&rt, &sid("healthy"), &[5, 6]).await;
    for _ in 0..3 {
        rt.tick()
            .await
            .expect("a panic is a failure of the row, not of the pass");
        tokio::time::advance(Duration::from_secs(5)).await;
    }
    let held = consumer_state(&rt, "panicky", &poison).await;
    assert_eq!((held.status, held.attempt_count), (SinkStatus::Dead, 3));
    let error = held.last_error.unwrap();
    assert!(
        error.contains("panicked") && error.contains("applier bug on poison"),
        "{error}"
    );
    let m = rt.metrics();
    assert_eq!((m.failed, m.dead_lettered), (2, 1));
    check_history(
        &state(&e).await,
        &expect(&[("healthy", 2, 11), ("poison", 2, 3)]),
        &BTreeMap::new(),
    )
    .expect("the healthy stream flowed, and the projection beside the panicking one applied poison");
    assert_eq!(oracle_state(&rt, &poison).await.status, SinkStatus::Ok);
}

/// A wake source whose first wait panics (a bug outside any applier).
struct PanicOnce(std::sync::atomic::AtomicBool);

#[outbox_core::async_trait]
impl outbox_core::WakeSource for PanicOnce {
    async fn wait(&self) {
        if !self.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
            panic!("wake source bug");
        }
        std::future::pending::<()>().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_dies_is_restarted_and_stays_registered() {
    let e = env();
    let rt = Outbox::builder(e.journal.clone(), e.store.clone())
        .config(worker_config())
        .event_types(oracle_registry())
        .projection(e.oracle.clone())
        .wake_source(Arc::new(PanicOnce(Default::default())))
        .build()
        .await
        .unwrap();
    let running = rt.start().await.unwrap();
    // The first idle wait panics and ends the worker's loop.
    tokio::time::sleep(Duration::from_millis(10)).await;
    append_values(&rt, &sid("s"), &[1, 2, 3]).await;
    wait_until_drained(&rt).await;
    let registered = rt.journal().workers().await.unwrap();
    assert_eq!(registered.len(), 1, "the restarted worker is still registered");
    running.shutdown().await;
    assert!(rt.journal().workers().await.unwrap().is_empty());
    check_history(&state(&e).await, &expect(&[("s", 3, 6)]), &BTreeMap::new()).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_second_start_of_one_runtime_is_refused_until_the_first_stops() {
    let e = env();
    let rt = runtime(&e, worker_config()).await;
    let running = rt.start().await.unwrap();
    for second in [rt.start().await, rt.clone().start().await] {
        let err = second.err().expect("a second start is refused");
        assert!(
            matches!(err, outbox_core::Error::InvalidState(_)) && err.to_string().contains("already started"),
            "{err}"
        );
    }
    running.shutdown().await;
    rt.start().await.expect("starts again after shutdown").abort();
    rt.start()
        .await
        .expect("starts again after abort")
        .shutdown()
        .await;
}

#[tokio::test(start_paused = true)]
async fn start_is_refused_while_another_process_holds_the_worker_id() {
    let e = env();
    let id = outbox_core::WorkerId::new("shared-id").unwrap();
    // Another process registered the id and is still live.
    e.journal
        .heartbeat(
            &id,
            "other-host",
            4242,
            Mode::OutboxApplyOnly,
            Duration::from_secs(15),
        )
        .await
        .unwrap();
    let rt = runtime(&e, worker_config().with_worker_id(id.clone())).await;
    let err = rt.start().await.err().expect("the id is held");
    assert!(
        matches!(err, outbox_core::Error::InvalidState(_))
            && err.to_string().contains("other-host")
            && err.to_string().contains("4242"),
        "{err}"
    );
    assert_eq!(rt.journal().workers().await.unwrap()[0].host, "other-host");
    // The other process stopped beating: once its entry expires, the id is free.
    tokio::time::advance(Duration::from_secs(16)).await;
    rt.start()
        .await
        .expect("the expired id is taken")
        .shutdown()
        .await;
}

#[tokio::test(start_paused = true)]
async fn the_heartbeat_prunes_registry_entries_expired_longer_than_the_retention() {
    let e = env();
    let beat = |id: &str, ttl: Duration| {
        let j = e.journal.clone();
        let id = outbox_core::WorkerId::new(id).unwrap();
        async move {
            j.heartbeat(&id, "gone-host", 7, Mode::OutboxApplyOnly, ttl)
                .await
                .unwrap();
        }
    };
    let gone = |id: &str| {
        let j = e.journal.clone();
        let id = outbox_core::WorkerId::new(id).unwrap();
        async move { !j.deregister(&id).await.unwrap() }
    };
    beat("old", Duration::from_secs(1)).await;
    beat("recent", Duration::from_secs(10)).await;
    tokio::time::advance(Duration::from_secs(12)).await;
    // old expired 11 s ago, recent 2 s ago.
    // A quick heartbeat needs a store deadline within its partition lease TTL.
    let config = worker_config()
        .with_heartbeat_interval(Duration::from_millis(100))
        .with_store_deadline(Duration::from_millis(500))
        .with_registry_retention(Duration::from_secs(5));
    let rt = runtime(&e, config).await;
    let running = rt.start().await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        gone("old").await,
        "pruned at start: expired longer than the retention"
    );
    assert!(!gone("recent").await, "expired only 2 s ago: kept");
    beat("recent", Duration::from_secs(10)).await; // deregister removed it: back, expiring at +10 s
    beat("late", Duration::from_secs(1)).await; // expires at +1 s
    // Prunes run every 60 beats (6 s here): at +6 s nothing is 5 s past
    // expiry yet; at +12 s `late` is, `recent` is not.
    tokio::time::sleep(Duration::from_secs(13)).await;
    running.shutdown().await;
    assert!(gone("late").await, "a later scheduled prune removed it");
    assert!(!gone("recent").await, "expired 3 s ago: kept");
}

#[tokio::test(start_paused = true)]
async fn the_heartbeat_prunes_finished_runs_older_than_the_retention() {
    use outbox_core::{RunEnd, RunKind, RunStore};
    let e = env();
    let w = outbox_core::WorkerId::new("replayer").unwrap();
    let ttl = Duration::from_secs(60);
    let name = |n: &str| outbox_core::ProjectionName::new(n).unwrap();
    let old = e
        .store
        .admit_run(RunKind::Rebuild, &name("a"), None, &w, ttl)
        .await
        .unwrap();
    e.store.finish_run(old.id, &w, RunEnd::Completed).await.unwrap();
    tokio::time::advance(Duration::from_secs(100)).await;
    let recent = e
        .store
        .admit_run(RunKind::Rebuild, &name("b"), None, &w, ttl)
        .await
        .unwrap();
    e.store
        .finish_run(recent.id, &w, RunEnd::Cancelled)
        .await
        .unwrap();
    let active = e
        .store
        .admit_run(RunKind::CatchUp, &name("c"), None, &w, ttl)
        .await
        .unwrap();
    let config = worker_config().with_run_retention(Duration::from_secs(50));
    let rt = runtime(&e, config).await;
    let running = rt.start().await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    running.shutdown().await;
    assert!(
        e.store.run(old.id).await.unwrap().is_none(),
        "finished 100 s ago: pruned at start"
    );
    assert!(
        e.store.run(recent.id).await.unwrap().is_some(),
        "finished just now: kept"
    );
    assert!(e.store.run(active.id).await.unwrap().is_some(), "active: kept");
}

/// A view that cancels a token on its `after`-th apply.
struct CancelOnApply {
    name: outbox_core::ProjectionName,
    token: tokio_util::sync::CancellationToken,
    after: u64,
    seen: std::sync::atomic::AtomicU64,
}

#[outbox_core::async_trait]
impl outbox_core::ViewProjection for CancelOnApply {
    fn name(&self) -> &outbox_core::ProjectionName {
        &self.name
    }

    async fn apply(
        &self,
        _view: &mut outbox_core::ViewTx<'_>,
        _event: &outbox_core::Event,
    ) -> Result<(), outbox_core::BoxError> {
        if self.seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == self.after {
            self.token.cancel();
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn start_up_repair_stops_when_cancelled_and_nothing_is_started() {
    let e = env();
    // Twenty streams behind: appended with the worker on but not started.
    let appender = runtime(&e, worker_config()).await;
    for i in 0..20 {
        append_values(&appender, &sid(&format!("s{i:02}")), &[1, 2, 3]).await;
    }
    let token = tokio_util::sync::CancellationToken::new();
    // Outbox with inline apply (no worker): its start-up repair applies
    // (an apply worker's hands the streams to its worker instead).
    let inline = Config::default().with_flags(flags(true, false, false));
    let rt = Outbox::builder(e.journal.clone(), e.store.clone())
        .config(inline)
        .event_types(oracle_registry())
        .view(CancelOnApply {
            name: outbox_core::ProjectionName::new("cancels").unwrap(),
            token: token.clone(),
            // A signal arrives while the second stream is caught up.
            after: 5,
            seen: Default::default(),
        })
        .build()
        .await
        .unwrap();
    let running = rt
        .start_until(&token)
        .await
        .expect("a cancelled start is not an error");
    let report = running.repair_report().expect("repair ran").clone();
    assert!(report.cancelled, "{report:?}");
    assert_eq!(
        (
            report.streams_scanned,
            report.streams_repaired,
            report.events_applied
        ),
        (2, 2, 6),
        "it finished the stream in progress and stopped: {report:?}"
    );
    let t = running.tasks();
    assert!(!(t.apply_worker || t.shadow_worker || t.heartbeat), "{t:?}");
    assert!(
        rt.journal().workers().await.unwrap().is_empty(),
        "never registered"
    );
    running.shutdown().await;
    // The rest is left for the next start.
    assert_eq!(rt.journal().summary().await.unwrap().total(), 18 * 3);
    let running = rt
        .start_until(&tokio_util::sync::CancellationToken::new())
        .await
        .unwrap();
    let report = running.repair_report().unwrap().clone();
    assert!(!report.cancelled);
    assert_eq!((report.streams_scanned, report.streams_repaired), (20, 18));
    running.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_producer_only_process_enqueues_applies_nothing_and_starts_nothing() {
    let e = env();
    // Streams already behind: start-up repair would apply them, were it run.
    let earlier = runtime(&e, worker_config()).await;
    append_values(&earlier, &sid("old"), &[1, 2]).await;
    let rt = runtime(&e, Config::producer_only()).await;
    assert_eq!(rt.mode(), Mode::ProducerOnly);
    append_values(&rt, &sid("s"), &[1, 2, 3]).await;
    let summary = rt.journal().summary().await.unwrap();
    assert_eq!(summary.total(), 2 + 3, "one row per event, none deleted");
    let running = rt.start().await.unwrap();
    let t = running.tasks();
    assert!(!(t.apply_worker || t.shadow_worker || t.heartbeat), "{t:?}");
    assert!(running.repair_report().is_none(), "no start-up repair");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(rt.journal().workers().await.unwrap().is_empty(), "not registered");
    running.shutdown().await;
    assert_eq!(rt.journal().summary().await.unwrap().total(), 5);
    assert!(state(&e).await.ledger.is_empty(), "nothing applied");
    // A worker elsewhere drains what it enqueued.
    let worker = runtime(&e, worker_config().with_repair_on_start(false)).await;
    while worker.tick().await.unwrap().made_progress() {}
    check_history(
        &state(&e).await,
        &expect(&[("old", 2, 3), ("s", 3, 6)]),
        &BTreeMap::new(),
    )
    .unwrap();
}

#[tokio::test(start_paused = true)]
async fn producer_only_is_reached_from_the_environment() {
    let c = Config::from_lookup(|k| match k {
        "OUTBOX_ENABLED" => Some("true".into()),
        "OUTBOX_INLINE_APPLY" => Some("false".into()),
        _ => None,
    })
    .unwrap();
    let e = env();
    assert_eq!(runtime(&e, c).await.mode(), Mode::ProducerOnly);
    // Inline apply off with the outbox off would apply and record nothing:
    // refused as the environment is read, and by the builder.
    let err = Config::from_lookup(|k| (k == "OUTBOX_INLINE_APPLY").then(|| "false".into())).unwrap_err();
    assert!(err.to_string().contains("OUTBOX_INLINE_APPLY is false"), "{err}");
    let c = Config::default().with_flags(outbox_core::ModeFlags {
        inline_apply: false,
        ..Config::default().flags
    });
    let e = env();
    let err = Outbox::builder(e.journal.clone(), e.store.clone())
        .config(c)
        .build()
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("OUTBOX_INLINE_APPLY is false"), "{err}");
}

/// `drain` applies everything due and returns, also when a projection
/// fails: the projection's retry on the stream is not waited for.
#[tokio::test(start_paused = true)]
async fn drain_applies_what_is_due_and_returns_when_a_projection_fails() {
    let e = env();
    let poison = sid("poison");
    let rt = runtime_panicking_on(&e, worker_config().with_repair_on_start(false), &poison).await;
    append_values(&rt, &sid("a"), &[1, 2, 3]).await;
    append_values(&rt, &sid("b"), &[4]).await;
    append_values(&rt, &poison, &[5, 6]).await;
    let report = rt.drain().await.unwrap();
    assert_eq!(report.completed, 6, "{report:?}");
    assert_eq!(
        report.failed, 1,
        "the projection failed once on poison: {report:?}"
    );
    let summary = rt.journal().summary().await.unwrap();
    assert_eq!(summary.total(), 0, "{summary:?}");
    assert_eq!(
        consumer_state(&rt, "panicky", &poison).await.status,
        SinkStatus::Failed
    );
    check_history(
        &state(&e).await,
        &expect(&[("a", 3, 6), ("b", 1, 4), ("poison", 2, 11)]),
        &BTreeMap::new(),
    )
    .expect("the healthy streams are applied, and poison for the projection beside the panicking one");
    // Nothing is due until the retry: a second drain does nothing.
    assert!(!rt.drain().await.unwrap().made_progress());
}

/// A projection that waits for its gate to open before every apply: a
/// worker that runs it stops inside its first batch until the test says so.
struct Gated {
    inner: Arc<dyn Projection<MemoryTx>>,
    open: tokio::sync::watch::Receiver<bool>,
}

#[outbox_core::async_trait]
impl Projection<MemoryTx> for Gated {
    fn name(&self) -> &outbox_core::ProjectionName {
        self.inner.name()
    }
    async fn apply(&self, tx: &mut MemoryTx, e: &outbox_core::Event) -> Result<(), outbox_core::BoxError> {
        let mut open = self.open.clone();
        let _ = open.wait_for(|o| *o).await;
        self.inner.apply(tx, e).await
    }
    async fn reset(&self, tx: &mut MemoryTx) -> Result<(), outbox_core::BoxError> {
        self.inner.reset(tx).await
    }
    async fn digest(
        &self,
        tx: &mut MemoryTx,
        out: &mut outbox_core::DigestBuilder,
    ) -> Result<(), outbox_core::BoxError> {
        self.inner.digest(tx, out).await
    }
}

/// `streams` streams of `events` events each (every value 1), enqueued
/// and not applied; what each stream's oracle must end at.
async fn backlog(e: &Env, streams: usize, events: usize) -> BTreeMap<String, Expected> {
    let appender = runtime(e, worker_config()).await;
    let mut want = BTreeMap::new();
    for i in 0..streams {
        let s = format!("s{i:03}");
        append_values(&appender, &sid(&s), &vec![1; events]).await;
        want.insert(
            s,
            Expected {
                through: events as u64,
                sum: events as i64,
            },
        );
    }
    want
}

/// Issue 43 point 4, "fair start": two runtimes started together on one
/// journal, the first already inside its first sweep (held there by a
/// gate, so nothing here depends on how fast either one runs). The second
/// holds its share of the partitions as soon as its `start` returns, taken
/// from the first at once (not at the first's next look at the registry),
/// and each applies a share of a 20,000-event drain: every event exactly
/// once, in stream order.
#[tokio::test(start_paused = true)]
async fn a_second_runtime_takes_its_share_at_start_and_both_apply_a_share_of_the_drain() {
    use outbox_core::{Partition, PartitionStore, WorkerId};
    let e = env();
    let want = backlog(&e, 200, 100).await;
    let config = |id: &str| {
        worker_config()
            .with_repair_on_start(false)
            .with_worker_id(WorkerId::new(id).unwrap())
    };
    let (gate, opens) = tokio::sync::watch::channel(false);
    let first = Outbox::builder(e.journal.clone(), e.store.clone())
        .config(config("first"))
        .event_types(oracle_registry())
        .projection(Arc::new(Gated {
            inner: e.oracle.clone(),
            open: opens,
        }))
        .build()
        .await
        .unwrap();
    let a = first.start().await.unwrap();
    let all: Vec<Partition> = Partition::all(e.journal.partitioning().count()).collect();
    assert_eq!(
        first.held_partitions(),
        all,
        "alone, the first holds every partition"
    );
    // The first's worker claims its first sweep and waits at the gate.
    tokio::task::yield_now().await;
    let second = runtime(&e, config("second")).await;
    let b = second.start().await.unwrap();
    let theirs = second.held_partitions();
    let want_theirs = outbox_core::assigned_to(
        second.worker_id(),
        &[first.worker_id().clone(), second.worker_id().clone()],
        e.journal.partitioning().count(),
    );
    assert!(!want_theirs.is_empty(), "the second's share is not empty");
    assert_eq!(
        theirs, want_theirs,
        "the second holds its share when its start returns"
    );
    let report = e.journal.partitions().await.unwrap();
    for p in &report {
        let owner = if want_theirs.contains(&p.partition) {
            &second
        } else {
            &first
        };
        assert_eq!(
            p.owner.as_ref(),
            Some(owner.worker_id()),
            "every partition has its one owner in the store: {p:?}"
        );
    }
    gate.send(true).unwrap();
    wait_until_drained(&second).await;
    b.shutdown().await;
    a.shutdown().await;
    let (by_first, by_second) = (first.metrics().applied, second.metrics().applied);
    assert!(
        by_first > 0 && by_second > 0 && by_first + by_second == 20_000,
        "each applied a share: first {by_first}, second {by_second}"
    );
    check_history(&state(&e).await, &want, &BTreeMap::new()).unwrap();
    assert_eq!(state(&e).await.ledger.len(), 20_000, "each event applied once");
}

/// Issue 45: two workers started together repair once. The streams behind
/// the journal (appended without outbox rows, as after a crash in an inline
/// mode) are handed to the workers by the first one's start-up repair; the
/// second, started right after it, leaves the repair to it and scans
/// nothing. Every stream is then applied exactly once by the two workers.
#[tokio::test(start_paused = true)]
async fn start_up_repair_runs_once_for_two_workers_started_together() {
    use outbox_core::WorkerId;
    let e = env();
    let mut want = backlog(&e, 10, 3).await;
    for i in 0..30 {
        let s = format!("u{i:02}");
        let req = AppendRequest::new(sid(&s), ExpectedVersion::NoStream, vec![add(2), add(2)]);
        e.journal
            .append(&[req], AppendOptions::journal_only())
            .await
            .unwrap();
        want.insert(s, Expected { through: 2, sum: 4 });
    }
    let config = |id: &str| worker_config().with_worker_id(WorkerId::new(id).unwrap());
    let first = runtime(&e, config("first")).await;
    let second = runtime(&e, config("second")).await;
    let a = first.start().await.unwrap();
    let b = second.start().await.unwrap();
    let (ra, rb) = (
        a.repair_report().expect("repair ran").clone(),
        b.repair_report().expect("repair ran").clone(),
    );
    assert_eq!(
        (ra.streams_scanned, ra.handed_to_worker),
        (40, 40),
        "the first scans every stream and hands the 40 behind to the workers: {ra:?}"
    );
    assert_eq!(
        (rb.streams_scanned, rb.handed_to_worker),
        (0, 0),
        "the second leaves the repair to the first: {rb:?}"
    );
    assert_eq!((ra.left_to, rb.left_to), (None, Some(first.worker_id().clone())));
    wait_until_drained(&first).await;
    b.shutdown().await;
    a.shutdown().await;
    check_history(&state(&e).await, &want, &BTreeMap::new()).unwrap();
    assert_eq!(
        first.metrics().applied + second.metrics().applied,
        10 * 3 + 30 * 2,
        "every event applied once"
    );
}

/// `start()` returns without draining a backlog the worker can drain: the
/// projection cannot apply anything until after `start` returned (its gate
/// is shut), so `start` holding out for the backlog would never return.
#[tokio::test(start_paused = true)]
async fn start_returns_without_draining_a_backlog_the_worker_drains() {
    let e = env();
    let want = backlog(&e, 50, 20).await;
    let (gate, opens) = tokio::sync::watch::channel(false);
    let rt = Outbox::builder(e.journal.clone(), e.store.clone())
        .config(worker_config())
        .event_types(oracle_registry())
        .projection(Arc::new(Gated {
            inner: e.oracle.clone(),
            open: opens,
        }))
        .build()
        .await
        .unwrap();
    let running = rt.start().await.unwrap();
    let report = running.repair_report().expect("repair ran").clone();
    assert_eq!(
        (report.events_applied, report.handed_to_worker),
        (0, 50),
        "nothing applied by start: {report:?}"
    );
    assert!(state(&e).await.ledger.is_empty(), "nothing applied yet");
    gate.send(true).unwrap();
    wait_until_drained(&rt).await;
    running.shutdown().await;
    check_history(&state(&e).await, &want, &BTreeMap::new()).unwrap();
}

/// The bounds of "once per fleet": a worker started more than one
/// heartbeat TTL after the first repairs for itself (something may have
/// fallen behind since), and so does one that runs a projection no earlier
/// worker registered (the first one's repair did not cover it).
#[tokio::test(start_paused = true)]
async fn start_up_repair_is_left_only_to_a_worker_started_just_before_with_the_same_projections() {
    use outbox_core::WorkerId;
    let e = env();
    for i in 0..5 {
        let req = AppendRequest::new(sid(&format!("u{i}")), ExpectedVersion::NoStream, vec![add(1)]);
        e.journal
            .append(&[req], AppendOptions::journal_only())
            .await
            .unwrap();
    }
    let config = |id: &str| worker_config().with_worker_id(WorkerId::new(id).unwrap());
    let first = runtime(&e, config("first")).await;
    let a = first.start().await.unwrap();
    assert_eq!(a.repair_report().unwrap().streams_scanned, 5);
    // Another projection: not registered by the first.
    let extra = Outbox::builder(e.journal.clone(), e.store.clone())
        .config(config("extra"))
        .event_types(oracle_registry())
        .projection(e.oracle.clone())
        .view(Panicky {
            name: outbox_core::ProjectionName::new("extra").unwrap(),
            stream: sid("none"),
        })
        .build()
        .await
        .unwrap();
    let x = extra.start().await.unwrap();
    let rx = x.repair_report().unwrap().clone();
    assert_eq!((rx.streams_scanned, rx.left_to.clone()), (5, None), "{rx:?}");
    // Later than one heartbeat TTL (15 s by default) after the first.
    tokio::time::sleep(Duration::from_secs(16)).await;
    let late = runtime(&e, config("late")).await;
    let l = late.start().await.unwrap();
    let rl = l.repair_report().unwrap().clone();
    assert_eq!((rl.streams_scanned, rl.left_to.clone()), (5, None), "{rl:?}");
    l.shutdown().await;
    x.shutdown().await;
    a.shutdown().await;
}
