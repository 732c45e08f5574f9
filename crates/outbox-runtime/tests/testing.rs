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
        (dead[0].stream.as_str(), dead[0].attempt_count),
        ("bad", testing::DEAD_LETTER_AFTER)
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
