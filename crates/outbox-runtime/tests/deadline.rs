//! Store calls have a deadline (issue 12 item 4): a store call that hangs,
//! like one on a dead database connection, ends as a temporary storage error
//! after the deadline instead of holding the worker past its lease. On
//! tokio's paused clock with the memory adapter.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_core::{
    BoxError, Clock, DigestBuilder, Event, ExpectedVersion, OutboxInspector, OutboxStatus, Projection,
    ProjectionName, Seq, async_trait,
};
use outbox_memory::{MemoryJournal, MemoryProjectionStore, MemoryTx};
use outbox_runtime::{Config, Outbox, TokioClock};
use outbox_testkit::{Expected, OracleProjection, add, check_history, oracle_registry, read_state, sid};

const ORACLE: &str = "oracle";

/// The oracle projection, except that its first apply, once armed, writes
/// and then never returns: the projection store's `apply` call hangs in the
/// middle of its transaction, as on a database connection that stopped
/// answering.
struct HangOnce {
    inner: Arc<dyn Projection<MemoryTx>>,
    armed: Arc<AtomicBool>,
}

#[async_trait]
impl Projection<MemoryTx> for HangOnce {
    fn name(&self) -> &ProjectionName {
        self.inner.name()
    }

    async fn apply(&self, tx: &mut MemoryTx, event: &Event) -> Result<(), BoxError> {
        self.inner.apply(tx, event).await?;
        if self.armed.swap(false, Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    async fn reset(&self, tx: &mut MemoryTx) -> Result<(), BoxError> {
        self.inner.reset(tx).await
    }

    async fn digest(&self, tx: &mut MemoryTx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        self.inner.digest(tx, out).await
    }
}

/// A worker runtime (not started: the test runs its passes) whose store's
/// first `apply` hangs once armed.
async fn runtime(
    config: Config,
) -> (
    Outbox<MemoryJournal, MemoryProjectionStore>,
    MemoryProjectionStore,
    Arc<AtomicBool>,
) {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::default());
    let store = MemoryProjectionStore::with_clock(clock.clone());
    let armed = Arc::new(AtomicBool::new(false));
    let rt = Outbox::builder(MemoryJournal::with_clock(clock), store.clone())
        .config(config)
        .event_types(oracle_registry())
        .projection(Arc::new(HangOnce {
            inner: OracleProjection::new(ORACLE).shared(),
            armed: armed.clone(),
        }))
        .build()
        .await
        .expect("runtime builds");
    (rt, store, armed)
}

/// The hang is bounded by the deadline (a third of the lease TTL by
/// default), reported as a temporary storage error that counts nothing
/// against the rows (they were applied together: nobody can tell which one
/// hung), the lease is released, the half-done apply rolled back, the rows
/// are left `processing` as a crash leaves them (ADR 0029), and the next
/// pass applies every event exactly once, each row alone.
#[tokio::test(start_paused = true)]
async fn a_hung_store_call_times_out_before_the_lease_and_the_row_is_applied_once_later() {
    let lease_ttl = Duration::from_secs(3);
    let (rt, store, armed) = runtime(
        Config::apply_worker()
            .with_lease_ttl(lease_ttl)
            .with_repair_on_start(false),
    )
    .await;
    let s = sid("s");
    rt.append(&s, ExpectedVersion::Any, vec![add(1), add(2), add(3)])
        .await
        .expect("append");
    armed.store(true, Ordering::SeqCst);

    let started = tokio::time::Instant::now();
    // Bounded on virtual time, so a missing deadline fails instead of hanging.
    let report = tokio::time::timeout(Duration::from_secs(600), rt.tick())
        .await
        .expect("the pass hung on the store call for 600 s of virtual time: no deadline")
        .expect("a timed-out store call is a temporary error, not a failed pass");
    let took = started.elapsed();
    assert!(
        took >= lease_ttl / 3 && took < lease_ttl,
        "the pass ended after {took:?}: want the deadline (a third of the {lease_ttl:?} lease)"
    );
    assert_eq!(
        (
            report.storage_errors,
            report.claimed,
            report.completed,
            report.failed
        ),
        (1, 3, 0, 0),
        "{report:?}"
    );
    assert_eq!(rt.metrics().storage_errors, 1);

    // Nothing is counted against the rows; the lease is gone; the rows are
    // left as a crash would leave them, due for the next claim to isolate.
    for seq in 1..=3 {
        let row = rt
            .journal()
            .row(&s, Seq::new(seq).unwrap())
            .await
            .unwrap()
            .expect("the row is still queued");
        assert_eq!(
            (row.status, row.attempt_count, row.last_error),
            (OutboxStatus::Processing, 0, None),
            "row {seq}"
        );
    }
    assert_eq!(rt.journal().lease(&s).await.unwrap(), None, "lease released");
    // The dropped apply rolled back: nothing of it is visible.
    let state = read_state(&store, ORACLE).await.unwrap();
    assert!(
        state.ledger.is_empty(),
        "the timed-out apply rolled back: {state:?}"
    );

    // The next pass applies the run, once.
    let report = rt.tick().await.unwrap();
    assert_eq!((report.completed, report.storage_errors), (3, 0), "{report:?}");
    assert_eq!(rt.journal().summary().await.unwrap().total(), 0);
    let want: BTreeMap<String, Expected> = [("s".to_owned(), Expected { through: 3, sum: 6 })].into();
    check_history(
        &read_state(&store, ORACLE).await.unwrap(),
        &want,
        &BTreeMap::new(),
    )
    .unwrap();
}

/// Inline apply is bounded too: the append returns (its events are durable)
/// with the timed-out apply reported as an inline failure naming the call
/// and the deadline; the rolled-back apply left nothing, and gap repair
/// applies the events once.
#[tokio::test(start_paused = true)]
async fn a_hung_inline_apply_ends_at_the_deadline_and_repair_applies_once() {
    let deadline = Duration::from_millis(700);
    let (rt, store, armed) = runtime(
        Config::default()
            .with_lease_ttl(Duration::from_secs(3))
            .with_store_deadline(deadline),
    )
    .await;
    armed.store(true, Ordering::SeqCst);
    let s = sid("s");
    let started = tokio::time::Instant::now();
    let outcome = tokio::time::timeout(
        Duration::from_secs(600),
        rt.append(&s, ExpectedVersion::Any, vec![add(4), add(5)]),
    )
    .await
    .expect("the append hung on the inline apply: no deadline")
    .expect("the events are durable");
    assert_eq!(started.elapsed(), deadline);
    let [failure] = outcome.inline_failures.as_slice() else {
        panic!("one inline failure: {outcome:?}");
    };
    assert!(
        failure
            .error
            .contains("store call `apply` did not finish within the store deadline of 700ms"),
        "{failure:?}"
    );
    assert!(
        read_state(&store, ORACLE).await.unwrap().ledger.is_empty(),
        "rolled back"
    );

    let repair = rt.repair_gaps().await.unwrap();
    assert_eq!(repair.events_applied, 2, "{repair:?}");
    let want: BTreeMap<String, Expected> = [("s".to_owned(), Expected { through: 2, sum: 9 })].into();
    check_history(
        &read_state(&store, ORACLE).await.unwrap(),
        &want,
        &BTreeMap::new(),
    )
    .unwrap();
}

/// The deadline must leave the lease time to spare.
#[tokio::test]
async fn a_deadline_not_below_the_lease_ttl_is_refused() {
    let config = Config::apply_worker()
        .with_lease_ttl(Duration::from_secs(2))
        .with_store_deadline(Duration::from_secs(2));
    let err = config.validate().unwrap_err().to_string();
    assert!(
        err.contains("OUTBOX_STORE_DEADLINE_MS") && err.contains("OUTBOX_LEASE_TTL_MS"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
}
