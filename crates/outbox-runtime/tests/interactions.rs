//! Interaction tests with a mocked projection: the exact calls the worker
//! makes when a batch fails midway (failure isolation), checked with mockall.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    BoxError, DigestBuilder, Event, EventTypeRegistry, ExpectedVersion, ManualClock, OutboxInspector,
    Projection, ProjectionName, RetryPolicy, SinkStatus, SinkStore, async_trait,
};
use outbox_memory::{MemoryJournal, MemoryProjectionStore, MemoryTx};
use outbox_runtime::{Config, Outbox};
use outbox_testkit::sid;

mockall::mock! {
    Proj {}
    #[async_trait]
    impl Projection<MemoryTx> for Proj {
        fn name(&self) -> &ProjectionName;
        async fn apply(&self, tx: &mut MemoryTx, event: &Event) -> Result<(), BoxError>;
        async fn reset(&self, tx: &mut MemoryTx) -> Result<(), BoxError>;
        async fn digest(&self, tx: &mut MemoryTx, out: &mut DigestBuilder) -> Result<(), BoxError>;
    }
}

fn expect_apply(p: &mut MockProj, seq: &mut mockall::Sequence, n: u64, ok: bool) {
    p.expect_apply()
        .withf(move |_, e| e.seq.get() == n)
        .times(1)
        .in_sequence(seq)
        .returning(move |_, _| if ok { Ok(()) } else { Err("boom".into()) });
}

/// The apply worker on memory stores with `clock`, event type `e` and `p`.
async fn runtime(
    p: MockProj,
    clock: &ManualClock,
    config: Config,
) -> Outbox<MemoryJournal, MemoryProjectionStore> {
    let mut types = EventTypeRegistry::new();
    types.apply("e").unwrap();
    Outbox::builder(
        MemoryJournal::with_clock(Arc::new(clock.clone())),
        MemoryProjectionStore::with_clock(Arc::new(clock.clone())),
    )
    .config(config)
    .event_types(types)
    .projection(Arc::new(p))
    .build()
    .await
    .unwrap()
}

/// The apply worker retrying after 1 ms, without start-up repair.
fn quick_retries() -> Config {
    Config::apply_worker()
        .with_retry(RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(1), 5).unwrap())
        .with_repair_on_start(false)
}

/// A batch [1, 2, 3] whose event 2 fails once: the whole batch rolls back,
/// event 1 is committed alone, the projection's failure at 2 is recorded on
/// its own state for the stream (ADR 0032) and every row is done; after the
/// backoff its exception path applies 2 and then 3. Each committed event is
/// applied exactly once; the rolled-back attempt at 1 is the only repeat.
#[tokio::test(start_paused = true)]
async fn a_failing_event_is_isolated_and_its_predecessors_commit() {
    failing_event_is_isolated(Config::default().sweep_rows).await;
}

/// The same, with sweeps off: the per-stream pass isolates it alike.
#[tokio::test(start_paused = true)]
async fn a_failing_event_is_isolated_by_the_per_stream_pass_too() {
    failing_event_is_isolated(0).await;
}

/// The consumer state of the mock projection on `s`.
async fn state(rt: &Outbox<MemoryJournal, MemoryProjectionStore>, s: &str) -> outbox_core::SinkStream {
    let key = outbox_core::projection_consumer(&ProjectionName::new("mock").unwrap()).unwrap();
    rt.journal().sink_states(&key, &[sid(s)]).await.unwrap().remove(0)
}

async fn failing_event_is_isolated(sweep_rows: usize) {
    let mut p = MockProj::new();
    p.expect_name().return_const(ProjectionName::new("mock").unwrap());
    let mut seq = mockall::Sequence::new();
    expect_apply(&mut p, &mut seq, 1, true); // batch attempt, rolled back with it
    expect_apply(&mut p, &mut seq, 2, false); // the failure
    expect_apply(&mut p, &mut seq, 1, true); // the prefix, committed alone
    expect_apply(&mut p, &mut seq, 2, true); // the retry, after the backoff
    expect_apply(&mut p, &mut seq, 3, true);

    let clock = ManualClock::default();
    let rt = runtime(p, &clock, quick_retries().with_sweep_rows(sweep_rows)).await;
    let s = sid("s");
    let events = (0..3).map(|_| rt.event("e", vec![]).unwrap()).collect();
    rt.append(&s, ExpectedVersion::NoStream, events).await.unwrap();

    let first = rt.tick().await.unwrap();
    assert_eq!(
        (first.completed, first.failed, first.caught_up),
        (3, 1, 0),
        "every row done, the projection's failure at 2 recorded"
    );
    let held = state(&rt, "s").await;
    assert_eq!(
        (held.seq, held.status, held.attempt_count),
        (1, SinkStatus::Failed, 1),
        "the projection stands at 1, failing on 2"
    );
    assert_eq!(rt.journal().summary().await.unwrap().total(), 0);

    clock.advance(Duration::from_millis(1)); // the backoff has passed

    let second = rt.tick().await.unwrap();
    assert_eq!((second.caught_up, second.failed), (2, 0));
    let ok = state(&rt, "s").await;
    assert_eq!((ok.seq, ok.status), (3, SinkStatus::Ok), "caught up: {ok:?}");
    // Dropping the runtime drops the mock, which verifies every expectation.
}

/// The applier fails on 2, and then, while the events before 2 are
/// re-applied alone, on 1: the failure is charged to 1, where the
/// projection now stands, not lost and not charged to 2.
#[tokio::test(start_paused = true)]
async fn a_failure_while_committing_the_prefix_is_charged_to_its_own_event() {
    let mut p = MockProj::new();
    p.expect_name().return_const(ProjectionName::new("mock").unwrap());
    let mut seq = mockall::Sequence::new();
    expect_apply(&mut p, &mut seq, 1, true);
    expect_apply(&mut p, &mut seq, 2, false);
    expect_apply(&mut p, &mut seq, 1, false); // the prefix fails too: charged to 1

    let clock = ManualClock::default();
    let rt = runtime(
        p,
        &clock,
        Config::apply_worker()
            .with_repair_on_start(false)
            .with_sweep_rows(0),
    )
    .await;
    let s = sid("s");
    let events = (0..3).map(|_| rt.event("e", vec![]).unwrap()).collect();
    rt.append(&s, ExpectedVersion::NoStream, events).await.unwrap();

    let tick = rt.tick().await.unwrap();
    assert_eq!((tick.completed, tick.failed, tick.storage_errors), (3, 1, 0));
    let held = state(&rt, "s").await;
    assert_eq!(
        (held.seq, held.status, held.attempt_count),
        (0, SinkStatus::Failed, 1),
        "charged to 1, where the projection now fails"
    );
}

fn expect_on(p: &mut MockProj, seq: &mut mockall::Sequence, stream: &'static str, n: u64, ok: bool) {
    p.expect_apply()
        .withf(move |_, e| e.stream.as_str() == stream && e.seq.get() == n)
        .times(1)
        .in_sequence(seq)
        .returning(move |_, _| if ok { Ok(()) } else { Err("boom".into()) });
}

/// A sweep over streams a, b, c (one projection transaction) whose b fails
/// at its event 2: the transaction rolls back and is applied again with b's
/// run cut before 2, so a's run, b's event 1 and c's run commit together
/// (each applied once more than it commits); the projection's failure at 2
/// is recorded on its state for b and the rest of b's run goes to the other
/// projections (none here) (ADR 0032). Every row is done and no stream is
/// left claimed or leased. After the backoff the projection goes on from 2
/// on b.
#[tokio::test(start_paused = true)]
async fn a_failing_event_in_a_sweep_is_pinned_on_its_stream_and_the_others_commit_together() {
    let mut p = MockProj::new();
    p.expect_name().return_const(ProjectionName::new("mock").unwrap());
    let mut seq = mockall::Sequence::new();
    // The sweep's first attempt, rolled back at b's event 2.
    expect_on(&mut p, &mut seq, "a", 1, true);
    expect_on(&mut p, &mut seq, "a", 2, true);
    expect_on(&mut p, &mut seq, "b", 1, true);
    expect_on(&mut p, &mut seq, "b", 2, false);
    // The second attempt, committed: b's run ends before its failure.
    expect_on(&mut p, &mut seq, "a", 1, true);
    expect_on(&mut p, &mut seq, "a", 2, true);
    expect_on(&mut p, &mut seq, "b", 1, true);
    expect_on(&mut p, &mut seq, "c", 1, true);
    expect_on(&mut p, &mut seq, "c", 2, true);
    // After the backoff, the projection's own catch-up on b.
    expect_on(&mut p, &mut seq, "b", 2, true);
    expect_on(&mut p, &mut seq, "b", 3, true);

    let clock = ManualClock::default();
    let rt = runtime(p, &clock, quick_retries()).await;
    for (name, n) in [("a", 2), ("b", 3), ("c", 2)] {
        let events = (0..n).map(|_| rt.event("e", vec![]).unwrap()).collect();
        rt.append(&sid(name), ExpectedVersion::NoStream, events)
            .await
            .unwrap();
    }

    let first = rt.tick().await.unwrap();
    assert_eq!(
        (first.leased, first.completed, first.failed),
        (3, 7, 1),
        "three streams in the sweep; every row done; the projection's failure on b's 2 recorded"
    );
    let failed = state(&rt, "b").await;
    assert_eq!(
        (failed.seq, failed.status, failed.attempt_count),
        (1, SinkStatus::Failed, 1)
    );
    assert!(failed.last_error.unwrap().contains("boom"));
    assert_eq!(rt.journal().summary().await.unwrap().total(), 0);
    for s in ["a", "b", "c"] {
        let lease = rt.journal().lease(&sid(s)).await.unwrap();
        assert!(lease.is_none(), "{s} is still leased: {lease:?}");
    }

    clock.advance(Duration::from_millis(1)); // the backoff has passed
    let second = rt.tick().await.unwrap();
    assert_eq!((second.caught_up, second.failed), (2, 0));
    assert_eq!(state(&rt, "b").await.status, SinkStatus::Ok);
    // Dropping the runtime drops the mock, which verifies every expectation.
}
