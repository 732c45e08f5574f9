//! Takeover under a backlog (issue 12 item 7), in tokio's virtual time: a
//! lease that a dead worker leaves behind is taken over within about one
//! lease TTL plus two sweeps (the one in flight and the one that takes the
//! stranded streams), however large the backlog the surviving worker is
//! draining.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::{
    Clock, Event, ExpectedVersion, LeaseStore, OutboxInspector, OutboxQueue, ProjectionName, StreamId,
    WorkerId,
};
use outbox_memory::{MemoryJournal, MemoryProjectionStore};
use outbox_runtime::{Config, Outbox, TokioClock};
use outbox_testkit::{add, oracle_registry};
use tokio::time::Instant;

const STREAMS: usize = 1_000;
const EVENTS_PER_STREAM: usize = 100;
/// Virtual time one event's apply costs: a batch of a whole stream is 100 ms.
const PER_EVENT: Duration = Duration::from_millis(1);

/// A projection that costs [`PER_EVENT`] of (virtual) time per event and
/// records when each stream's last applied event was applied.
struct Slow {
    name: ProjectionName,
    done: Arc<Mutex<BTreeMap<StreamId, (u64, Instant)>>>,
}

#[outbox_core::async_trait]
impl outbox_core::ViewProjection for Slow {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn apply(
        &self,
        _view: &mut outbox_core::ViewTx<'_>,
        event: &Event,
    ) -> Result<(), outbox_core::BoxError> {
        tokio::time::sleep(PER_EVENT).await;
        self.done
            .lock()
            .unwrap()
            .insert(event.stream.clone(), (event.seq.get(), Instant::now()));
        Ok(())
    }
}

fn stream(i: usize) -> StreamId {
    StreamId::new(format!("s{i:04}")).unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_is_taken_over_within_one_ttl_plus_one_batch_under_a_backlog() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::default());
    let journal = MemoryJournal::with_clock(clock.clone());
    let store = MemoryProjectionStore::with_clock(clock);
    let done = Arc::new(Mutex::new(BTreeMap::new()));
    let ttl = Duration::from_millis(1_500);
    // One batch drains one stream, so "one batch" is one stream's worth.
    let batch = EVENTS_PER_STREAM;
    let config = Config::apply_worker()
        .with_poll_interval(Duration::from_millis(200))
        .with_lease_ttl(ttl)
        .with_batch_size(batch)
        // A sweep of one batch's rows: "in flight" is one batch.
        .with_sweep_rows(batch)
        .with_repair_on_start(false)
        .with_worker_id(WorkerId::new("b").unwrap());
    let rt = Outbox::builder(journal.clone(), store.clone())
        .config(config)
        .event_types(oracle_registry())
        .view(Slow {
            name: ProjectionName::new("slow").unwrap(),
            done: done.clone(),
        })
        .build()
        .await
        .unwrap();

    // The backlog: 100,000 events, appended a stream at a time.
    for i in 0..STREAMS {
        let events = (0..EVENTS_PER_STREAM).map(|v| add(v as i64)).collect();
        rt.append(&stream(i), ExpectedVersion::Any, events).await.unwrap();
    }
    let summary = journal.summary().await.unwrap();
    assert_eq!(summary.total(), (STREAMS * EVENTS_PER_STREAM) as u64);

    // Worker A leased the three oldest due streams, claimed their rows and
    // died: nothing renews its leases from now on.
    let a = WorkerId::new("a").unwrap();
    let stranded: Vec<StreamId> = (0..3).map(stream).collect();
    for s in &stranded {
        let lease = journal.acquire(s, &a, ttl).await.unwrap().unwrap();
        journal.claim(&lease, batch).await.unwrap();
    }
    let died = Instant::now();
    let expiry = died + ttl;

    // Worker B drains the backlog.
    let running = rt.start().await.unwrap();
    let one_batch = PER_EVENT * batch as u32;
    // After the expiry B may finish the sweep it is applying (one batch of
    // rows). The next sweep takes the stranded streams (oldest due first)
    // with fewer than a batch of fresh rows from the backlog to fill it:
    // those are applied together first, then the stranded streams are
    // drained one batch each.
    let deadline = expiry + one_batch * (2 + stranded.len() as u32);
    let all_done = |done: &BTreeMap<StreamId, (u64, Instant)>| {
        stranded.iter().all(|s| {
            done.get(s)
                .is_some_and(|(seq, _)| *seq == EVENTS_PER_STREAM as u64)
        })
    };
    while !all_done(&done.lock().unwrap()) && Instant::now() < died + Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.abort();
    let done = done.lock().unwrap();
    let backlog_done = done.len() - stranded.iter().filter(|s| done.contains_key(*s)).count();
    for s in &stranded {
        let Some((seq, at)) = done.get(s) else {
            panic!("{s} was never taken over ({backlog_done} backlog streams drained meanwhile)");
        };
        assert_eq!(*seq, EVENTS_PER_STREAM as u64, "{s} drained");
        assert!(
            *at <= deadline,
            "{s} completed {:?} after the lease expired; the bound is {:?} (one lease TTL is {ttl:?} \
             after A died, then one batch of {one_batch:?} in flight plus one per stranded stream); \
             B drained {backlog_done} other streams meanwhile",
            *at - expiry,
            deadline - expiry,
        );
    }
    assert!(
        backlog_done < STREAMS - stranded.len(),
        "the backlog was still there when the stranded streams were done"
    );
}
