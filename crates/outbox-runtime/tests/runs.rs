//! Projections that write a run at a time (`Projection::apply_run`): each
//! gets one call per run, and a failure it cannot place (a panic inside a
//! run, blamed on the run's first event) still ends up recorded on the
//! one event that fails by itself, with every event before it applied once
//! and the bystander untouched.

use std::sync::{Arc, Mutex};

use outbox_core::{
    BoxError, DigestBuilder, Event, EventTypeRegistry, ExpectedVersion, FailedEvent, Projection,
    ProjectionName, SinkStatus, StreamId, ViewProjection, ViewTx, async_trait,
};
use outbox_memory::MemoryTx;
use outbox_runtime::testing;

/// Writes runs; keeps in memory the runs it was handed and the seqs it
/// applied (a run commits here: the only other projection never fails).
/// Panics on any run holding a `boom` event.
struct Batcher {
    name: ProjectionName,
    runs: Mutex<Vec<Vec<u64>>>,
    applied: Mutex<Vec<u64>>,
}

#[async_trait]
impl Projection<MemoryTx> for Batcher {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn apply(&self, tx: &mut MemoryTx, event: &Event) -> Result<(), BoxError> {
        self.apply_run(tx, &[event]).await.map_err(|f| f.source)
    }

    async fn apply_run(&self, _: &mut MemoryTx, events: &[&Event]) -> Result<(), FailedEvent> {
        let seqs: Vec<u64> = events.iter().map(|e| e.seq.get()).collect();
        self.runs.lock().unwrap().push(seqs.clone());
        if events.iter().any(|e| e.payload == b"boom") {
            panic!("a run with a boom in it");
        }
        self.applied.lock().unwrap().extend(seqs);
        Ok(())
    }

    fn applies_runs(&self) -> bool {
        true
    }

    async fn reset(&self, _: &mut MemoryTx) -> Result<(), BoxError> {
        Ok(())
    }

    async fn digest(&self, _: &mut MemoryTx, _: &mut DigestBuilder) -> Result<(), BoxError> {
        Ok(())
    }
}

/// The bystander: counts each stream's events.
struct Steady(ProjectionName);

#[async_trait]
impl ViewProjection for Steady {
    fn name(&self) -> &ProjectionName {
        &self.0
    }

    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError> {
        view.update("seen", event.stream.as_str(), |seqs: &mut Vec<u64>| {
            seqs.push(event.seq.get())
        })
        .await?;
        Ok(())
    }
}

#[tokio::test]
async fn a_panic_inside_a_run_is_recorded_on_the_event_that_fails_alone() {
    let clock = testing::clock();
    let batcher = Arc::new(Batcher {
        name: ProjectionName::new("batcher").unwrap(),
        runs: Mutex::default(),
        applied: Mutex::default(),
    });
    let mut types = EventTypeRegistry::new();
    types.apply("happened").unwrap();
    let outbox = testing::memory(&clock)
        .event_types(types)
        .projection(batcher.clone())
        .view(Steady(ProjectionName::new("steady").unwrap()))
        .build()
        .await
        .unwrap();
    let s = StreamId::new("s").unwrap();
    let payloads = ["ok", "ok", "ok", "ok", "boom", "ok", "ok", "ok"];
    let events = payloads
        .iter()
        .map(|p| outbox.event("happened", p.as_bytes().to_vec()).unwrap())
        .collect();
    outbox.append(&s, ExpectedVersion::Any, events).await.unwrap();

    // The first pass hands the whole stream over as one run.
    outbox.drain().await.unwrap();
    assert_eq!(batcher.runs.lock().unwrap()[0], (1..=8).collect::<Vec<_>>());
    for _ in 0..10 {
        clock.advance(testing::RETRY);
        outbox.drain().await.unwrap();
    }

    // The bystander applied everything; the batcher every event before
    // the poison, each once, and its state is dead on the poison alone.
    let steady: Option<Vec<u64>> = outbox.views("steady").unwrap().get("seen", "s").await.unwrap();
    assert_eq!(steady, Some((1..=8).collect()));
    assert_eq!(*batcher.applied.lock().unwrap(), vec![1, 2, 3, 4]);
    let states = outbox.projection_states(None, 10).await.unwrap();
    let state = states.first().expect("the batcher's exception");
    assert_eq!(
        (
            state.sink.as_str(),
            state.stream.as_str(),
            state.seq,
            state.status
        ),
        ("projection:batcher", "s", 4, SinkStatus::Dead),
        "{states:?}"
    );
    assert_eq!(state.attempt_count, testing::DEAD_LETTER_AFTER, "{state:?}");
}
