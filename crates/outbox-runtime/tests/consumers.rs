//! Every projection on its own (ADR 0032), on every backend: a projection
//! failing on one stream holds back only itself there; the projection
//! beside it applies every event of that stream, and every other stream
//! goes on for both; after the fix and a requeue, the failing one catches
//! up exactly once, in order.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use outbox_core::{
    BoxError, Event, EventTypeRegistry, ExpectedVersion, LeaseAdmin, OutboxInspector, ProjectionName,
    SinkStatus, StreamId, ViewProjection, ViewTx, async_trait,
};
use outbox_runtime::open::WithStores;
use outbox_runtime::{JournalBackend, Outbox, ProjectionBackend, testing};

/// Appends each stream's events in order, as a list of seqs per stream
/// (`seen`), and fails on a payload of `boom` until `fixed`.
struct Ledger {
    name: ProjectionName,
    fixed: Arc<AtomicBool>,
    fails: bool,
}

#[async_trait]
impl ViewProjection for Ledger {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError> {
        if self.fails && event.payload == b"boom" && !self.fixed.load(Ordering::SeqCst) {
            return Err(format!("{} refuses {}/{}", self.name, event.stream, event.seq).into());
        }
        view.update("seen", event.stream.as_str(), |seqs: &mut Vec<u64>| {
            seqs.push(event.seq.get())
        })
        .await?;
        Ok(())
    }
}

fn types() -> EventTypeRegistry {
    let mut t = EventTypeRegistry::new();
    t.apply("happened").unwrap();
    t
}

/// What one backend saw: the two projections' ledgers before and after the
/// fix, and the failing one's state in between.
#[derive(Debug, PartialEq)]
struct Seen {
    before: Vec<(String, String, Option<Vec<u64>>)>,
    state: (String, String, u64, SinkStatus, u32),
    rows_left: u64,
    after: Vec<(String, String, Option<Vec<u64>>)>,
}

struct Scenario;

impl WithStores for Scenario {
    type Output = outbox_core::Result<Seen>;

    async fn with<J, P>(self, journal: J, store: P) -> Self::Output
    where
        J: JournalBackend + LeaseAdmin + Clone,
        P: ProjectionBackend + Clone,
    {
        let fixed = Arc::new(AtomicBool::new(false));
        let ledger = |name: &str, fails: bool| Ledger {
            name: ProjectionName::new(name).unwrap(),
            fixed: fixed.clone(),
            fails,
        };
        let outbox = Outbox::builder(journal, store)
            .config(outbox_runtime::Config::producer_only())
            .event_types(types())
            .view(ledger("picky", true))
            .view(ledger("steady", false))
            .build()
            .await?;
        let (bad, good) = (StreamId::new("bad")?, StreamId::new("good")?);
        for (stream, payloads) in [(&bad, &["ok", "boom", "ok", "ok"][..]), (&good, &["ok", "ok"])] {
            let events = payloads
                .iter()
                .map(|p| outbox.event("happened", p.as_bytes().to_vec()))
                .collect::<Result<Vec<_>, _>>()?;
            outbox.append(stream, ExpectedVersion::Any, events).await?;
        }
        outbox.drain().await?;
        let read =
            async |outbox: &Outbox<J, P>| -> outbox_core::Result<Vec<(String, String, Option<Vec<u64>>)>> {
                let mut out = Vec::new();
                for p in ["picky", "steady"] {
                    for s in ["bad", "good"] {
                        let seqs: Option<Vec<u64>> = outbox.views(p)?.get("seen", s).await?;
                        out.push((p.to_owned(), s.to_owned(), seqs));
                    }
                }
                Ok(out)
            };
        let before = read(&outbox).await?;
        let states = outbox.projection_states(None, 10).await?;
        let s = states.first().cloned().expect("the picky projection's exception");
        let state = (
            s.sink.to_string(),
            s.stream.to_string(),
            s.seq,
            s.status,
            s.attempt_count,
        );
        let rows_left = outbox.journal().summary().await?.total();
        fixed.store(true, Ordering::SeqCst);
        outbox
            .requeue_projection(&ProjectionName::new("picky")?, &bad)
            .await?;
        testing::drain(&outbox).await?;
        let after = read(&outbox).await?;
        Ok(Seen {
            before,
            state,
            rows_left,
            after,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_projection_holds_back_only_itself_on_its_stream_on_every_backend() {
    let runs = testing::on_every_backend(|| Scenario).await.unwrap();
    let all = |seqs: &[u64]| Some(seqs.to_vec());
    let want = Seen {
        before: vec![
            ("picky".into(), "bad".into(), all(&[1])),
            ("picky".into(), "good".into(), all(&[1, 2])),
            ("steady".into(), "bad".into(), all(&[1, 2, 3, 4])),
            ("steady".into(), "good".into(), all(&[1, 2])),
        ],
        state: ("projection:picky".into(), "bad".into(), 1, SinkStatus::Failed, 1),
        rows_left: 0,
        after: vec![
            ("picky".into(), "bad".into(), all(&[1, 2, 3, 4])),
            ("picky".into(), "good".into(), all(&[1, 2])),
            ("steady".into(), "bad".into(), all(&[1, 2, 3, 4])),
            ("steady".into(), "good".into(), all(&[1, 2])),
        ],
    };
    for (backend, seen) in runs {
        assert_eq!(seen.unwrap(), want, "{backend:?}");
    }
}
