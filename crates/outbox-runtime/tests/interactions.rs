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

/// A batch [1, 2, 3] whose event 2 fails once: the whole batch rolls back,
/// event 1 is committed alone, event 2's row records the failure (3 stays
/// blocked), and the retry applies 2 and then 3. Each committed event is
/// applied exactly once; the rolled-back attempt at 1 is the only repeat.
#[tokio::test(start_paused = true)]
async fn a_failing_event_is_isolated_and_its_predecessors_commit() {
    let mut p = MockProj::new();
    p.expect_name().return_const(ProjectionName::new("mock").unwrap());
    let mut seq = mockall::Sequence::new();
    expect_apply(&mut p, &mut seq, 1, true); // batch attempt, rolled back with it
    expect_apply(&mut p, &mut seq, 2, false); // the failure
    expect_apply(&mut p, &mut seq, 1, true); // the prefix, committed alone
    expect_apply(&mut p, &mut seq, 2, true); // the retry, after the backoff
    expect_apply(&mut p, &mut seq, 3, true);

    let mut types = EventTypeRegistry::new();
    types.apply("e").unwrap();
    let clock = ManualClock::default();
    let rt = Outbox::builder(
        MemoryJournal::with_clock(Arc::new(clock.clone())),
        MemoryProjectionStore::with_clock(Arc::new(clock.clone())),
    )
    .config(
        Config::apply_worker()
            .with_retry(RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(1), 5).unwrap())
            .with_repair_on_start(false),
    )
    .event_types(types)
    .projection(Arc::new(p))
    .build()
    .await
    .unwrap();
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

    let mut types = EventTypeRegistry::new();
    types.apply("e").unwrap();
    let clock = ManualClock::default();
    let rt = Outbox::builder(
        MemoryJournal::with_clock(Arc::new(clock.clone())),
        MemoryProjectionStore::with_clock(Arc::new(clock)),
    )
    .config(Config::apply_worker().with_repair_on_start(false))
    .event_types(types)
    .projection(Arc::new(p))
    .build()
    .await
    .unwrap();
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
