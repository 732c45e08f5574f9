//! Every projection on its own (ADR 0032), on every backend: a projection
//! failing on one stream holds back only itself there; the projection
//! beside it applies every event of that stream, and every other stream
//! goes on for both; after the fix and a requeue, the failing one catches
//! up exactly once, in order.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use outbox_core::{
    BoxError, Event, EventTypeRegistry, ExpectedVersion, LeaseAdmin, ProjectionName, SinkStatus, StreamId,
    ViewProjection, ViewTx, async_trait,
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

/// (projection, stream, the seqs it applied) for each pair.
type Ledgers = Vec<(String, String, Option<Vec<u64>>)>;

/// What one backend saw: the two projections' ledgers before and after the
/// fix, and the failing one's state in between.
#[derive(Debug, PartialEq)]
struct Seen {
    before: Ledgers,
    state: (String, String, u64, SinkStatus, u32),
    rows_left: u64,
    after: Ledgers,
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
        let read = async |outbox: &Outbox<J, P>| -> outbox_core::Result<Ledgers> {
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

/// Fails on `boom` with the decision `park`, `stop` or `skip` (never with
/// `retry`: the steady bystander); counts each stream's events.
struct Decides {
    name: ProjectionName,
    decision: outbox_core::OnError,
    fixed: Arc<AtomicBool>,
}

#[async_trait]
impl ViewProjection for Decides {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError> {
        let fails = self.decision != outbox_core::OnError::Retry;
        if fails && event.payload == b"boom" && !self.fixed.load(Ordering::SeqCst) {
            let e = format!("{} cannot take {}/{}", self.name, event.stream, event.seq);
            return Err(match self.decision {
                outbox_core::OnError::Park => outbox_core::ApplyError::park(e).into(),
                outbox_core::OnError::Stop => outbox_core::ApplyError::stop(e).into(),
                outbox_core::OnError::Skip => outbox_core::ApplyError::skip(e).into(),
                outbox_core::OnError::Retry => e.into(),
            });
        }
        view.update("seen", event.stream.as_str(), |n: &mut u64| *n += 1)
            .await?;
        Ok(())
    }
}

/// A producer-only runtime with one [`Decides`] projection per (name,
/// decision), all fixed together by `fixed`.
async fn deciding<J: JournalBackend, P: ProjectionBackend>(
    journal: J,
    store: P,
    fixed: &Arc<AtomicBool>,
    projections: &[(&str, outbox_core::OnError)],
) -> outbox_core::Result<Outbox<J, P>> {
    let mut b = Outbox::builder(journal, store)
        .config(outbox_runtime::Config::producer_only())
        .event_types(types());
    for (name, decision) in projections {
        b = b.view(Decides {
            name: ProjectionName::new(*name)?,
            decision: *decision,
            fixed: fixed.clone(),
        });
    }
    b.build().await
}

/// An applier that parks an event is dead for it at its first failure; one
/// that stops its projection pauses it for every stream (the others go on),
/// its backlog kept and reported; resumed after the fix, it catches up. A
/// pause from the API does the same without a failure.
struct Decisions;

#[derive(Debug, PartialEq)]
struct Decided {
    parked: (SinkStatus, u32),
    stopped_paused: bool,
    stopped_backlog: usize,
    steady_counts: (Option<u64>, Option<u64>),
    after_resume: (Option<u64>, Option<u64>),
    paused_by_hand_backlog: usize,
    after_second_resume: Option<u64>,
}

impl WithStores for Decisions {
    type Output = outbox_core::Result<Decided>;

    async fn with<J, P>(self, journal: J, store: P) -> Self::Output
    where
        J: JournalBackend + LeaseAdmin + Clone,
        P: ProjectionBackend + Clone,
    {
        use outbox_core::OnError::{Park, Retry, Stop};
        let fixed = Arc::new(AtomicBool::new(false));
        let outbox = deciding(
            journal,
            store,
            &fixed,
            &[("parks", Park), ("stops", Stop), ("steady", Retry)],
        )
        .await?;
        let append = async |stream: &str, payloads: &[&str]| -> outbox_core::Result<()> {
            let events = payloads
                .iter()
                .map(|p| outbox.event("happened", p.as_bytes().to_vec()))
                .collect::<Result<Vec<_>, _>>()?;
            outbox
                .append(&StreamId::new(stream)?, ExpectedVersion::Any, events)
                .await?;
            Ok(())
        };
        append("bad", &["ok", "boom", "ok"]).await?;
        outbox.drain().await?;
        append("other", &["ok", "ok"]).await?;
        outbox.drain().await?;
        let states = outbox.projection_states(None, 100).await?;
        let of = |p: &str| {
            states
                .iter()
                .filter(|s| outbox_core::consumer_projection(&s.sink) == Some(p))
                .collect::<Vec<_>>()
        };
        let parked = of("parks")[0];
        let consumers = outbox_runtime::consumers::consumer_statuses(outbox.journal()).await?;
        let stopped_paused = consumers
            .iter()
            .any(|c| c.projection.as_deref() == Some("stops") && c.info.paused);
        let count = async |p: &str, s: &str| -> outbox_core::Result<Option<u64>> {
            outbox.views(p)?.get("seen", s).await
        };
        let steady_counts = (count("steady", "bad").await?, count("steady", "other").await?);
        let stopped_backlog = of("stops").len();
        fixed.store(true, Ordering::SeqCst);
        let stops = ProjectionName::new("stops")?;
        outbox.pause_projection(&stops, false).await?;
        outbox
            .requeue_projection(&ProjectionName::new("parks")?, &StreamId::new("bad")?)
            .await?;
        outbox.drain().await?;
        let after_resume = (count("stops", "bad").await?, count("stops", "other").await?);
        // A pause by hand: nothing applied for it, its backlog reported.
        outbox.pause_projection(&stops, true).await?;
        append("later", &["ok", "ok"]).await?;
        outbox.drain().await?;
        let paused_by_hand_backlog = outbox
            .projection_states(None, 100)
            .await?
            .iter()
            .filter(|s| outbox_core::consumer_projection(&s.sink) == Some("stops"))
            .count();
        outbox.pause_projection(&stops, false).await?;
        testing::drain(&outbox).await?;
        Ok(Decided {
            parked: (parked.status, parked.attempt_count),
            stopped_paused,
            stopped_backlog,
            steady_counts,
            after_resume,
            paused_by_hand_backlog,
            after_second_resume: count("stops", "later").await?,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn park_stop_pause_and_resume_on_every_backend() {
    let runs = testing::on_every_backend(|| Decisions).await.unwrap();
    let want = Decided {
        parked: (SinkStatus::Dead, 1),
        stopped_paused: true,
        // Failed on `bad`, then held on `other` while paused.
        stopped_backlog: 2,
        steady_counts: (Some(3), Some(2)),
        after_resume: (Some(3), Some(2)),
        paused_by_hand_backlog: 1,
        after_second_resume: Some(2),
    };
    for (backend, decided) in runs {
        assert_eq!(decided.unwrap(), want, "{backend:?}");
    }
}

/// An applier that skips an event passes over it for its projection only,
/// with a record: the projection applies the stream's later events, the
/// bystander every event; the record is listed, a re-apply that fails
/// keeps it, and after the fix the event is re-applied exactly once.
struct Skips;

#[derive(Debug, PartialEq)]
struct Skipped {
    counts: (Option<u64>, Option<u64>, Option<u64>),
    listed: Vec<(String, String, u64, bool)>,
    exceptions_left: usize,
    failed_reapply_kept: (bool, usize),
    after_reapply: Option<u64>,
    listed_after: usize,
    second_reapply_not_found: bool,
}

impl WithStores for Skips {
    type Output = outbox_core::Result<Skipped>;

    async fn with<J, P>(self, journal: J, store: P) -> Self::Output
    where
        J: JournalBackend + LeaseAdmin + Clone,
        P: ProjectionBackend + Clone,
    {
        use outbox_core::OnError::{Retry, Skip};
        let fixed = Arc::new(AtomicBool::new(false));
        let outbox = deciding(journal, store, &fixed, &[("skips", Skip), ("steady", Retry)]).await?;
        for (stream, payloads) in [("bad", &["ok", "boom", "ok", "ok"][..]), ("other", &["ok", "ok"])] {
            let events = payloads
                .iter()
                .map(|p| outbox.event("happened", p.as_bytes().to_vec()))
                .collect::<Result<Vec<_>, _>>()?;
            outbox
                .append(&StreamId::new(stream)?, ExpectedVersion::Any, events)
                .await?;
        }
        testing::drain(&outbox).await?;
        let count = async |p: &str, s: &str| -> outbox_core::Result<Option<u64>> {
            outbox.views(p)?.get("seen", s).await
        };
        let counts = (
            count("skips", "bad").await?,
            count("skips", "other").await?,
            count("steady", "bad").await?,
        );
        let skips = ProjectionName::new("skips")?;
        let bad = StreamId::new("bad")?;
        let listed = outbox
            .skipped_events(None, 10)
            .await?
            .into_iter()
            .map(|s| {
                let named = s.error.contains("cannot take bad/2");
                (s.projection.to_string(), s.stream.to_string(), s.seq.get(), named)
            })
            .collect();
        let exceptions_left = outbox.projection_states(None, 10).await?.len();
        let seq = outbox_core::Seq::new(2)?;
        let failed = outbox.reapply(&skips, &bad, seq).await;
        let failed_reapply_kept = (
            matches!(failed, Err(outbox_core::Error::Apply { .. })),
            outbox.skipped_events(Some(&skips), 10).await?.len(),
        );
        fixed.store(true, Ordering::SeqCst);
        outbox.reapply(&skips, &bad, seq).await?;
        let second = outbox.reapply(&skips, &bad, seq).await;
        Ok(Skipped {
            counts,
            listed,
            exceptions_left,
            failed_reapply_kept,
            after_reapply: count("skips", "bad").await?,
            listed_after: outbox.skipped_events(None, 10).await?.len(),
            second_reapply_not_found: matches!(second, Err(outbox_core::Error::NotFound(_))),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_with_a_record_then_reapply_once_on_every_backend() {
    let runs = testing::on_every_backend(|| Skips).await.unwrap();
    let want = Skipped {
        counts: (Some(3), Some(2), Some(4)),
        listed: vec![("skips".into(), "bad".into(), 2, true)],
        exceptions_left: 0,
        failed_reapply_kept: (true, 1),
        after_reapply: Some(4),
        listed_after: 0,
        second_reapply_not_found: true,
    };
    for (backend, skipped) in runs {
        assert_eq!(skipped.unwrap(), want, "{backend:?}");
    }
}

/// Gap repair applies neither a paused projection nor one that is off the
/// shared path on a stream: those are their exception paths' to retry,
/// with their attempts counted (ADR 0032).
#[tokio::test]
async fn gap_repair_leaves_paused_and_failing_projections_to_their_own_path() {
    let fixed = Arc::new(AtomicBool::new(false));
    let decides = |name: &str, decision| Decides {
        name: ProjectionName::new(name).unwrap(),
        decision,
        fixed: fixed.clone(),
    };
    let clock = testing::clock();
    let outbox = testing::memory(&clock)
        .event_types(types())
        .view(decides("parks", outbox_core::OnError::Park))
        .view(decides("steady", outbox_core::OnError::Retry))
        .build()
        .await
        .unwrap();
    let append = async |stream: &str, payloads: &[&str]| {
        let events = payloads
            .iter()
            .map(|p| outbox.event("happened", p.as_bytes().to_vec()).unwrap())
            .collect();
        outbox
            .append(&StreamId::new(stream).unwrap(), ExpectedVersion::Any, events)
            .await
            .unwrap();
    };
    append("bad", &["ok", "boom", "ok"]).await;
    outbox.drain().await.unwrap();
    let steady = ProjectionName::new("steady").unwrap();
    outbox.pause_projection(&steady, true).await.unwrap();
    append("later", &["ok", "ok"]).await;
    outbox.drain().await.unwrap();
    let report = outbox.repair_gaps().await.unwrap();
    assert!(report.failures.is_empty(), "{report:?}");
    let seen =
        async |p: &str, s: &str| -> Option<u64> { outbox.views(p).unwrap().get("seen", s).await.unwrap() };
    assert_eq!(
        seen("parks", "bad").await,
        Some(1),
        "parked at 2: not retried by repair"
    );
    assert_eq!(
        seen("steady", "later").await,
        None,
        "paused: not applied by repair"
    );
    assert_eq!(seen("parks", "later").await, Some(2));
    let states = outbox.projection_states(None, 10).await.unwrap();
    let parked = states
        .iter()
        .find(|s| s.sink.as_str() == "projection:parks")
        .unwrap();
    assert_eq!((parked.status, parked.attempt_count), (SinkStatus::Dead, 1));
    // Resumed, the paused one catches up on its own.
    outbox.pause_projection(&steady, false).await.unwrap();
    outbox.drain().await.unwrap();
    assert_eq!(seen("steady", "later").await, Some(2));
}

/// Read-your-writes (ADR 0032): `wait_for` resolves once the projections
/// have applied an append, woken by the worker's applies; it says at once
/// which projection is dead or paused short of the token, and which is
/// failing when the time is up.
#[tokio::test(start_paused = true)]
async fn wait_for_resolves_on_apply_and_names_a_dead_paused_or_failing_projection() {
    use std::time::Duration;
    let fixed = Arc::new(AtomicBool::new(false));
    let decides = |name: &str, decision| Decides {
        name: ProjectionName::new(name).unwrap(),
        decision,
        fixed: fixed.clone(),
    };
    let journal = outbox_memory::MemoryJournal::with_clock(Arc::new(outbox_runtime::TokioClock::default()));
    let store =
        outbox_memory::MemoryProjectionStore::with_clock(Arc::new(outbox_runtime::TokioClock::default()));
    let outbox = Outbox::builder(journal, store)
        .config(outbox_runtime::Config::apply_worker().with_poll_interval(Duration::from_millis(50)))
        .event_types(types())
        .view(decides("parks", outbox_core::OnError::Park))
        .view(decides("steady", outbox_core::OnError::Retry))
        .view(Ledger {
            name: ProjectionName::new("retries").unwrap(),
            fixed: fixed.clone(),
            fails: true,
        })
        .build()
        .await
        .unwrap();
    let running = outbox.start().await.unwrap();
    let append = async |stream: &str, payload: &str| {
        outbox
            .append(
                &StreamId::new(stream).unwrap(),
                ExpectedVersion::Any,
                vec![outbox.event("happened", payload.as_bytes().to_vec()).unwrap()],
            )
            .await
            .unwrap()
            .token()
    };
    let ok = append("s", "ok").await;
    outbox
        .wait_for(&ok, None, Duration::from_secs(5))
        .await
        .expect("applied by every projection");

    let bad = append("bad", "boom").await;
    let steady = [ProjectionName::new("steady").unwrap()];
    outbox
        .wait_for(&bad, Some(&steady), Duration::from_secs(5))
        .await
        .expect("the bystander applied it");
    let parks = [ProjectionName::new("parks").unwrap()];
    let e = outbox
        .wait_for(&bad, Some(&parks), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, outbox_core::Error::InvalidState(m) if m.contains("projection parks is dead on bad/1")),
        "{e}"
    );
    let retries = [ProjectionName::new("retries").unwrap()];
    let e = outbox
        .wait_for(&bad, Some(&retries), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        e.is_temporary() && e.to_string().contains("projection retries is failing on bad/1"),
        "{e}"
    );

    outbox.pause_projection(&steady[0], true).await.unwrap();
    let later = append("later", "ok").await;
    let e = outbox
        .wait_for(&later, Some(&steady), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, outbox_core::Error::InvalidState(m) if m.contains("projection steady is paused")),
        "{e}"
    );
    outbox.pause_projection(&steady[0], false).await.unwrap();
    outbox
        .wait_for(&later, Some(&steady), Duration::from_secs(30))
        .await
        .expect("resumed, it catches up");
    let e = outbox
        .wait_for(
            &later,
            Some(&[ProjectionName::new("nope").unwrap()]),
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, outbox_core::Error::NotFound(_)), "{e}");
    running.shutdown().await;
}

/// Fails the first attempt at every even seq, then applies it.
struct OnceEach {
    name: ProjectionName,
    tried: std::sync::Mutex<std::collections::BTreeSet<(String, u64)>>,
}

#[async_trait]
impl ViewProjection for OnceEach {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError> {
        let key = (event.stream.to_string(), event.seq.get());
        if event.seq.get().is_multiple_of(2) && self.tried.lock().unwrap().insert(key) {
            return Err(format!("first try of {}/{}", event.stream, event.seq).into());
        }
        view.update("seen", event.stream.as_str(), |n: &mut u64| *n += 1)
            .await?;
        Ok(())
    }
}

/// Attempts count consecutive failures of one event: a projection that
/// fails once on many events of a stream, each then applying, is never
/// dead-lettered however many there are (the threshold here is 3).
#[tokio::test]
async fn a_projection_failing_once_per_event_is_not_dead_lettered() {
    let clock = testing::clock();
    let outbox = testing::memory(&clock)
        .event_types(types())
        .view(OnceEach {
            name: ProjectionName::new("once").unwrap(),
            tried: Default::default(),
        })
        .build()
        .await
        .unwrap();
    let events = (0..12)
        .map(|_| outbox.event("happened", b"ok".to_vec()).unwrap())
        .collect();
    outbox
        .append(&StreamId::new("s").unwrap(), ExpectedVersion::Any, events)
        .await
        .unwrap();
    for _ in 0..40 {
        outbox.drain().await.unwrap();
        clock.advance(testing::RETRY);
    }
    testing::drain(&outbox).await.expect("caught up, never dead");
    let n: Option<u64> = outbox.views("once").unwrap().get("seen", "s").await.unwrap();
    assert_eq!(n, Some(12));
}

/// A blue/green rebuild after the fix applies the skipped event in the new
/// generation, and the swap takes the skip record with it: a re-apply then
/// finds nothing, so the event is applied once (ADR 0032).
struct SkipThenRebuild;

impl WithStores for SkipThenRebuild {
    type Output = outbox_core::Result<(usize, usize, bool, Option<u64>)>;

    async fn with<J, P>(self, journal: J, store: P) -> Self::Output
    where
        J: JournalBackend + LeaseAdmin + Clone,
        P: ProjectionBackend + Clone,
    {
        use outbox_core::OnError::Skip;
        let fixed = Arc::new(AtomicBool::new(false));
        let outbox = deciding(journal, store, &fixed, &[("skips", Skip)]).await?;
        let events = ["ok", "boom", "ok"]
            .iter()
            .map(|p| outbox.event("happened", p.as_bytes().to_vec()))
            .collect::<Result<Vec<_>, _>>()?;
        let bad = StreamId::new("bad")?;
        outbox.append(&bad, ExpectedVersion::Any, events).await?;
        testing::drain(&outbox).await?;
        let before = outbox.skipped_events(None, 10).await?.len();
        fixed.store(true, Ordering::SeqCst);
        outbox
            .rebuild_blue_green("skips", &tokio_util::sync::CancellationToken::new())
            .await?;
        let after = outbox.skipped_events(None, 10).await?.len();
        let reapply = outbox
            .reapply(&ProjectionName::new("skips")?, &bad, outbox_core::Seq::new(2)?)
            .await;
        let count: Option<u64> = outbox.views("skips")?.get("seen", "bad").await?;
        Ok((
            before,
            after,
            matches!(reapply, Err(outbox_core::Error::NotFound(_))),
            count,
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blue_green_rebuild_takes_the_skip_records_with_the_swap_on_every_backend() {
    let runs = testing::on_every_backend(|| SkipThenRebuild).await.unwrap();
    for (backend, seen) in runs {
        assert_eq!(seen.unwrap(), (1, 0, true, Some(3)), "{backend:?}");
    }
}
