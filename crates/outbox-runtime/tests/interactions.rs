//! Interaction tests with a mocked projection: the exact calls the worker
//! makes when a batch fails midway (failure isolation), checked with mockall.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    BoxError, DigestBuilder, Event, EventTypeRegistry, ExpectedVersion, ManualClock, OutboxInspector,
    OutboxStatus, Projection, ProjectionName, RetryPolicy, Seq, async_trait,
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
/// event 1 is committed alone, event 2's row records the failure (3 stays
/// blocked), and the retry applies 2 and then 3. Each committed event is
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
        (first.completed, first.failed),
        (1, 1),
        "event 1 committed, event 2 failed"
    );
    let row = rt.journal().row(&s, Seq::new(2).unwrap()).await.unwrap().unwrap();
    assert_eq!((row.status, row.attempt_count), (OutboxStatus::Failed, 1));
    let blocked = rt.journal().row(&s, Seq::new(3).unwrap()).await.unwrap().unwrap();
    assert_eq!(
        blocked.status,
        OutboxStatus::Pending,
        "3 waits behind the failed head"
    );

    clock.advance(Duration::from_millis(1)); // the backoff has passed

    let second = rt.tick().await.unwrap();
    assert_eq!(second.completed, 2);
    assert_eq!(rt.journal().summary().await.unwrap().total(), 0);
    // Dropping the runtime drops the mock, which verifies every expectation.
}

/// The applier fails on 2, and then, while the events before 2 are
/// re-applied alone, on 1: the failure is recorded on row 1 (now the head),
/// not lost and not charged to 2.
#[tokio::test(start_paused = true)]
async fn a_failure_while_committing_the_prefix_is_recorded_on_its_own_row() {
    let mut p = MockProj::new();
    p.expect_name().return_const(ProjectionName::new("mock").unwrap());
    let mut seq = mockall::Sequence::new();
    expect_apply(&mut p, &mut seq, 1, true);
    expect_apply(&mut p, &mut seq, 2, false);
    expect_apply(&mut p, &mut seq, 1, false); // the prefix fails too

    let clock = ManualClock::default();
    let rt = runtime(p, &clock, Config::apply_worker().with_repair_on_start(false)).await;
    let s = sid("s");
    let events = (0..3).map(|_| rt.event("e", vec![]).unwrap()).collect();
    rt.append(&s, ExpectedVersion::NoStream, events).await.unwrap();

    let tick = rt.tick().await.unwrap();
    assert_eq!((tick.completed, tick.failed, tick.storage_errors), (0, 1, 0));
    let one = rt.journal().row(&s, Seq::new(1).unwrap()).await.unwrap().unwrap();
    assert_eq!(
        (one.status, one.attempt_count),
        (OutboxStatus::Failed, 1),
        "charged to the new head"
    );
    let two = rt.journal().row(&s, Seq::new(2).unwrap()).await.unwrap().unwrap();
    assert_eq!((two.status, two.attempt_count), (OutboxStatus::Pending, 0));
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
/// (each applied once more than it commits, as the per-stream path's batch
/// attempt would be); the failure is recorded on b's row 2, row 3 waits
/// behind it, and no stream is left claimed or leased. After the backoff b
/// goes on from 2.
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
    // After the backoff.
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
        (3, 5, 1),
        "three streams in the sweep; a's 2, b's 1 and c's 2 committed; b's 2 failed"
    );
    let row = |s: &'static str, n: u64| {
        let j = rt.journal().clone();
        async move { j.row(&sid(s), Seq::new(n).unwrap()).await.unwrap() }
    };
    let failed = row("b", 2).await.expect("b's row 2 is kept");
    assert_eq!((failed.status, failed.attempt_count), (OutboxStatus::Failed, 1));
    assert!(failed.last_error.unwrap().contains("boom"));
    let behind = row("b", 3).await.expect("b's row 3 is kept");
    assert_eq!(
        (behind.status, behind.attempt_count),
        (OutboxStatus::Pending, 0),
        "3 was claimed with the sweep and abandoned behind the failure"
    );
    assert_eq!(
        rt.journal().summary().await.unwrap().total(),
        2,
        "only b's 2 and 3 remain"
    );
    for s in ["a", "b", "c"] {
        let lease = rt.journal().lease(&sid(s)).await.unwrap();
        assert!(lease.is_none(), "{s} is still leased: {lease:?}");
    }

    clock.advance(Duration::from_millis(1)); // the backoff has passed
    let second = rt.tick().await.unwrap();
    assert_eq!((second.completed, second.failed), (2, 0));
    assert_eq!(rt.journal().summary().await.unwrap().total(), 0);
    // Dropping the runtime drops the mock, which verifies every expectation.
}
