//! The `testing` module as an application's tests use it.

use outbox_core::{
    BoxError, Event, EventTypeRegistry, ExpectedVersion, LeaseAdmin, ProjectionName, StreamId,
    ViewProjection, ViewTx, async_trait,
};
use outbox_runtime::open::WithStores;
use outbox_runtime::testing::{self, Backend};
use outbox_runtime::{JournalBackend, Outbox, ProjectionBackend};

/// Counts each stream's events; fails on a payload of `boom`.
struct Counts(ProjectionName);

#[async_trait]
impl ViewProjection for Counts {
    fn name(&self) -> &ProjectionName {
        &self.0
    }

    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError> {
        if event.payload == b"boom" {
            return Err("a payload this projection refuses".into());
        }
        view.update("counts", event.stream.as_str(), |n: &mut u64| *n += 1)
            .await?;
        Ok(())
    }
}

fn counts() -> Counts {
    Counts(ProjectionName::new("counts").unwrap())
}

fn types() -> EventTypeRegistry {
    let mut t = EventTypeRegistry::new();
    t.apply("happened").unwrap();
    t
}

#[tokio::test]
async fn drain_names_the_failing_row_and_its_error_then_retries_dead_letter_it() {
    let clock = testing::clock();
    let outbox = testing::memory(&clock)
        .event_types(types())
        .view(counts())
        .build()
        .await
        .unwrap();
    let bad = StreamId::new("bad").unwrap();
    let good = StreamId::new("good").unwrap();
    outbox
        .append(
            &bad,
            ExpectedVersion::Any,
            vec![outbox.event("happened", b"boom").unwrap()],
        )
        .await
        .unwrap();
    outbox
        .append(
            &good,
            ExpectedVersion::Any,
            vec![outbox.event("happened", b"ok").unwrap()],
        )
        .await
        .unwrap();
    let e = testing::drain(&outbox).await.expect_err("a row failed");
    let shown = e.to_string();
    assert!(
        shown.contains("bad/1") && shown.contains("a payload this projection refuses"),
        "{shown}"
    );
    // The retry is due once the clock moves; the threshold dead-letters.
    for _ in 1..testing::DEAD_LETTER_AFTER {
        clock.advance(testing::RETRY);
        assert!(testing::drain(&outbox).await.is_err());
    }
    let dead = testing::dead_letters(&outbox).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        (
            dead[0].projection.as_deref(),
            dead[0].stream.as_str(),
            dead[0].seq,
            dead[0].attempt_count
        ),
        (Some("counts"), "bad", 1, testing::DEAD_LETTER_AFTER)
    );
    let n: Option<u64> = outbox
        .views("counts")
        .unwrap()
        .get("counts", "good")
        .await
        .unwrap();
    assert_eq!(n, Some(1), "the other stream applied");
}

/// Appends three events to two streams and drains; returns the digests.
struct Scenario;

impl WithStores for Scenario {
    type Output = outbox_core::Result<std::collections::BTreeMap<String, String>>;

    async fn with<J, P>(self, journal: J, store: P) -> Self::Output
    where
        J: JournalBackend + LeaseAdmin + Clone,
        P: ProjectionBackend + Clone,
    {
        let outbox = Outbox::builder(journal, store)
            .config(outbox_runtime::Config::producer_only())
            .event_types(types())
            .view(counts())
            .build()
            .await?;
        for (s, n) in [("a", 2), ("b", 1)] {
            let events = (0..n)
                .map(|_| outbox.event("happened", b"ok"))
                .collect::<Result<Vec<_>, _>>()?;
            outbox
                .append(&StreamId::new(s)?, ExpectedVersion::Any, events)
                .await?;
        }
        testing::drain(&outbox).await?;
        testing::digests(&outbox).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_test_runs_on_every_backend_with_equal_digests() {
    let runs = testing::on_every_backend(|| Scenario).await.unwrap();
    let backends: Vec<Backend> = runs.iter().map(|(b, _)| *b).collect();
    assert_eq!(&backends[..2], &[Backend::Memory, Backend::Sqlite]);
    if outbox_testkit::pg::test_database_url().is_some() {
        assert_eq!(backends.get(2), Some(&Backend::Postgres));
    }
    let reference = runs[0].1.as_ref().unwrap().clone();
    assert_eq!(reference.len(), 1);
    for (backend, digests) in &runs {
        assert_eq!(digests.as_ref().unwrap(), &reference, "{backend:?}");
    }
}

/// A typed event whose payload does not decode is a failure of the typed
/// projection on its own stream only, on the default settings: the
/// projection beside it applies the event, and the stream beside it
/// applies for both (ADR 0032).
#[tokio::test]
async fn an_undecodable_typed_event_fails_its_consumer_and_spares_the_bystanders() {
    use outbox_core::typed::{DomainEvent, EventKind, TypedViewProjection, json, typed};
    use outbox_core::{AppendOptions, AppendRequest, EventJournal, NewEvent, OutboxInspector};

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Added {
        n: u64,
    }
    impl DomainEvent for Added {
        const KINDS: &'static [EventKind] = &[EventKind::apply("added")];
        fn kind(&self) -> EventKind {
            Self::KINDS[0]
        }
        fn encode(&self) -> Result<Vec<u8>, BoxError> {
            json::encode(self)
        }
        fn decode(_: &str, payload: &[u8]) -> Result<Self, BoxError> {
            json::decode(payload)
        }
    }
    struct Sum(ProjectionName);
    #[async_trait]
    impl TypedViewProjection<Added> for Sum {
        fn name(&self) -> &ProjectionName {
            &self.0
        }
        async fn apply(&self, view: &mut ViewTx<'_>, event: &Event, value: &Added) -> Result<(), BoxError> {
            view.update("sums", event.stream.as_str(), |t: &mut u64| *t += value.n)
                .await?;
            Ok(())
        }
    }

    let outbox = Outbox::builder(
        outbox_memory::MemoryJournal::new(),
        outbox_memory::MemoryProjectionStore::new(),
    )
    .config(outbox_runtime::Config::apply_worker())
    .event_types(EventTypeRegistry::of::<Added>().unwrap())
    .view(typed(Sum(ProjectionName::new("sums").unwrap())))
    .view(counts())
    .build()
    .await
    .unwrap();
    // Written around the typed API: a payload that is not an `Added`.
    let bad = NewEvent::new(
        outbox_core::EventType::new("added").unwrap(),
        outbox_core::Intent::Apply,
        b"{\"n\": \"x\"}".to_vec(),
    );
    outbox
        .journal()
        .append(
            &[AppendRequest::new(
                StreamId::new("bad").unwrap(),
                ExpectedVersion::NoStream,
                vec![bad],
            )],
            AppendOptions::enqueue(),
        )
        .await
        .unwrap();
    outbox
        .append_typed(
            &StreamId::new("good").unwrap(),
            ExpectedVersion::NoStream,
            &[Added { n: 5 }],
        )
        .await
        .unwrap();
    outbox.drain().await.unwrap();
    let sum: Option<u64> = outbox.views("sums").unwrap().get("sums", "good").await.unwrap();
    assert_eq!(sum, Some(5), "the bystander stream applied");
    let none: Option<u64> = outbox.views("sums").unwrap().get("sums", "bad").await.unwrap();
    assert_eq!(none, None);
    let counted: Option<u64> = outbox
        .views("counts")
        .unwrap()
        .get("counts", "bad")
        .await
        .unwrap();
    assert_eq!(
        counted,
        Some(1),
        "the other projection applied the bad stream's event"
    );
    let left = outbox.journal().summary().await.unwrap();
    assert_eq!(left.total(), 0, "every row is done: {left:?}");
    let failing = outbox.projection_states(None, 10).await.unwrap();
    assert_eq!(failing.len(), 1, "{failing:?}");
    let state = &failing[0];
    assert_eq!(
        (
            state.sink.as_str(),
            state.stream.as_str(),
            state.seq,
            state.status
        ),
        ("projection:sums", "bad", 0, outbox_core::SinkStatus::Failed)
    );
    assert!(
        state
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("does not decode"),
        "{state:?}"
    );
}
