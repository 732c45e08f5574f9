//! Generations of view projections through the runtime (ADR 0021): a
//! blue/green rebuild beside a live worker and a reader, and promoting
//! candidate versions that agree and that do not.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use outbox_core::{
    AppendRequest, BoxError, DigestBuilder, Error, Event, ExpectedVersion, GenerationStore, OutboxInspector,
    Projection, ProjectionName, ProjectionStore, StreamId, ViewProjection, ViewTx, async_trait,
};
use outbox_memory::{MemoryJournal, MemoryProjectionStore, MemoryTx};
use outbox_runtime::{Config, JournalBackend, Outbox, ProjectionBackend};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};
use outbox_testkit::{add, oracle_registry, sid};
use tokio_util::sync::CancellationToken;

const COUNTS: &str = "counts";

/// Per stream, `factor(stream)` for every event; and the sum over all
/// streams. `version` tells the versions apart.
struct Counts {
    name: ProjectionName,
    version: u32,
    /// Streams whose events count double in this version.
    doubles: Option<&'static str>,
    /// Writes the total before the stream's count (same documents).
    total_first: bool,
}

fn counts(version: u32, doubles: Option<&'static str>, total_first: bool) -> Arc<dyn ViewProjection> {
    Arc::new(Counts {
        name: ProjectionName::new(COUNTS).unwrap(),
        version,
        doubles,
        total_first,
    })
}

#[async_trait]
impl ViewProjection for Counts {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    fn version(&self) -> u32 {
        self.version
    }

    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError> {
        let s = event.stream.as_str();
        let by = if self.doubles.is_some_and(|p| s.starts_with(p)) {
            2
        } else {
            1
        };
        if self.total_first {
            view.update("total", "all", |n: &mut u64| *n += by).await?;
            view.update("n", s, |n: &mut u64| *n += by).await?;
        } else {
            view.update("n", s, |n: &mut u64| *n += by).await?;
            view.update("total", "all", |n: &mut u64| *n += by).await?;
        }
        Ok(())
    }
}

async fn build<J: JournalBackend, P: ProjectionBackend>(
    journal: J,
    store: P,
    config: Config,
    main: Arc<dyn ViewProjection>,
    candidate: Option<Arc<dyn ViewProjection>>,
) -> Outbox<J, P> {
    let mut b = Outbox::builder(journal, store)
        .config(config)
        .event_types(oracle_registry())
        .view_arc(main);
    if let Some(c) = candidate {
        b = b.candidate_arc(c);
    }
    b.build().await.expect("build the runtime")
}

async fn total<J: JournalBackend, P: ProjectionBackend>(rt: &Outbox<J, P>) -> u64 {
    rt.views(COUNTS)
        .unwrap()
        .get("total", "all")
        .await
        .unwrap()
        .unwrap_or(0)
}

async fn count<J: JournalBackend, P: ProjectionBackend>(rt: &Outbox<J, P>, stream: &str) -> u64 {
    rt.views(COUNTS)
        .unwrap()
        .get("n", stream)
        .await
        .unwrap()
        .unwrap_or(0)
}

async fn append<J: JournalBackend, P: ProjectionBackend>(rt: &Outbox<J, P>, streams: &[StreamId], each: u64) {
    let batch = streams
        .iter()
        .map(|s| {
            AppendRequest::new(
                s.clone(),
                ExpectedVersion::Any,
                (0..each).map(|i| add(i as i64)).collect(),
            )
        })
        .collect();
    rt.append_batch(batch).await.expect("append");
}

/// A blue/green rebuild (from a second runtime, as `outbox rebuild
/// --blue-green` would run) while the first runtime's worker applies live
/// appends and a reader reads the live generation over and over: every
/// count the reader sees is at least the one it saw before (a projection
/// rebuilt in place would start again from zero), the swap happens, the
/// reader reads after it, and once drained the live generation's digest is
/// that of a fresh rebuild into another database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blue_green_rebuild_beside_live_appends_never_shows_a_partial_projection() {
    let dir = tempfile::tempdir().unwrap();
    let (jp, pp) = (dir.path().join("journal.db"), dir.path().join("projections.db"));
    let open = || async {
        (
            SqliteJournal::open(&jp, SqliteOptions::default()).await.unwrap(),
            SqliteProjectionStore::open(&pp, SqliteOptions::default())
                .await
                .unwrap(),
        )
    };
    let (j, p) = open().await;
    let live = build(
        j,
        p,
        Config::apply_worker().with_batch_size(16),
        counts(1, None, false),
        None,
    )
    .await;
    let running = live.start().await.expect("start the worker");
    let streams: Vec<StreamId> = (0..30).map(|i| sid(&format!("s{i:02}"))).collect();
    append(&live, &streams, 20).await;
    let appended = Arc::new(AtomicU64::new(600));

    // The reader: monotonic counts, before and after the swap.
    let swapped = Arc::new(AtomicBool::new(false));
    let stop = CancellationToken::new();
    let (first_read, first_read_seen) = tokio::sync::oneshot::channel::<()>();
    let reader = tokio::spawn({
        let (rt, swapped, stop) = (live.clone(), swapped.clone(), stop.clone());
        async move {
            let (mut last_total, mut last_s00, mut after_swap, mut reads) = (0u64, 0u64, 0u64, 0u64);
            let mut first_read = Some(first_read);
            while !(stop.is_cancelled() && after_swap > 0) {
                let was_swapped = swapped.load(Ordering::SeqCst);
                let (t, s) = (total(&rt).await, count(&rt, "s00").await);
                assert!(
                    t >= last_total,
                    "the total went back from {last_total} to {t} after {reads} reads"
                );
                assert!(s >= last_s00, "stream s00 went back from {last_s00} to {s}");
                (last_total, last_s00) = (t, s);
                reads += 1;
                if was_swapped {
                    after_swap += 1;
                }
                if let Some(tx) = first_read.take() {
                    let _ = tx.send(());
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (reads, after_swap, last_total)
        }
    });
    first_read_seen
        .await
        .expect("the reader read once before the rebuild");

    // Appends keep arriving during the rebuild.
    let appender = tokio::spawn({
        let (rt, stop, appended, streams) = (live.clone(), stop.clone(), appended.clone(), streams.clone());
        async move {
            let mut i = 0usize;
            while !stop.is_cancelled() {
                append(&rt, &streams[i % streams.len()..=i % streams.len()], 3).await;
                appended.fetch_add(3, Ordering::SeqCst);
                i += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });

    let (j2, p2) = open().await;
    let builder = build(
        j2,
        p2,
        Config::default().with_batch_size(16),
        counts(1, None, false),
        None,
    )
    .await;
    let swap = builder
        .rebuild_blue_green(COUNTS, &CancellationToken::new())
        .await
        .expect("blue/green rebuild");
    swapped.store(true, Ordering::SeqCst);
    assert_eq!((swap.from, swap.to, swap.epoch), (1, 2, 1), "{swap:?}");
    assert!(
        swap.build.applied >= 600,
        "the build applied the journal: {swap:?}"
    );
    stop.cancel();
    appender.await.unwrap();
    let (reads, after_swap, _) = reader.await.expect("the reader saw no count go back");
    assert!(
        after_swap > 0 && reads > after_swap,
        "read before and after the swap"
    );

    // Drained: the live generation is complete and equals a fresh rebuild.
    let want = appended.load(Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while live.journal().summary().await.unwrap().total() > 0 || total(&live).await < want {
        assert!(tokio::time::Instant::now() < deadline, "not drained (watchdog)");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.shutdown().await;
    assert_eq!(total(&live).await, want, "every event counted once");
    let rec = live
        .store()
        .generation(&ProjectionName::new(COUNTS).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((rec.live, rec.building), (2, None));
    let digest = live
        .store()
        .digest(&*live.projection(COUNTS).unwrap())
        .await
        .unwrap();

    let fresh_path = dir.path().join("fresh.db");
    let fresh = build(
        SqliteJournal::open(&jp, SqliteOptions::default()).await.unwrap(),
        SqliteProjectionStore::open(&fresh_path, SqliteOptions::default())
            .await
            .unwrap(),
        Config::default(),
        counts(1, None, false),
        None,
    )
    .await;
    fresh.rebuild(COUNTS, &CancellationToken::new()).await.unwrap();
    let want_digest = fresh
        .store()
        .digest(&*fresh.projection(COUNTS).unwrap())
        .await
        .unwrap();
    assert_eq!(
        digest, want_digest,
        "the swapped-in generation equals a fresh rebuild"
    );
}

/// Promotion on `store`: a candidate that writes the same documents another
/// way agrees with the live code on every stream and is promoted; once live,
/// the runtime applies its code. A candidate that counts the `b` streams
/// double is refused, naming `b1` (the first stream it differs on), and
/// nothing changes; `--force` promotes it.
async fn promotion<J: JournalBackend + Clone, P: ProjectionBackend + Clone>(journal: J, store: P) {
    let streams = [sid("a1"), sid("a2"), sid("b1"), sid("b2")];
    let rt = build(
        journal.clone(),
        store.clone(),
        Config::default(),
        counts(1, None, false),
        Some(counts(2, None, true)),
    )
    .await;
    append(&rt, &streams, 5).await;
    let diff = rt.shadow_diff(COUNTS, 10).await.unwrap();
    assert!(diff.agrees(), "{diff:?}");
    assert_eq!(diff.streams, 4);
    let build_report = rt.shadow_build(COUNTS, &CancellationToken::new()).await.unwrap();
    assert_eq!((build_report.generation, build_report.version), (2, 2));
    assert_eq!(total(&rt).await, 20, "the shadow generation is invisible");
    append(&rt, &streams[..1], 1).await; // live moves on: promote catches up
    let swap = rt
        .promote(COUNTS, false, &CancellationToken::new())
        .await
        .expect("agreeing candidate");
    assert_eq!((swap.from, swap.to), (1, 2));
    assert_eq!(total(&rt).await, 21);

    // The next release makes version 2 the live code, with a candidate
    // that counts `b` streams double.
    let rt = build(
        journal.clone(),
        store.clone(),
        Config::default(),
        counts(2, None, true),
        Some(counts(3, Some("b"), false)),
    )
    .await;
    let diff = rt.shadow_diff(COUNTS, 10).await.unwrap();
    let differing: Vec<&str> = diff.differing.iter().map(|d| d.stream.as_str()).collect();
    assert_eq!(differing, ["b1", "b2"], "{diff:?}");
    assert_eq!(
        (diff.differing[0].table.as_str(), diff.differing[0].documents),
        ("n", 2),
        "the stream's count and its share of the total differ; n/b1 comes first: {diff:?}"
    );
    rt.shadow_build(COUNTS, &CancellationToken::new()).await.unwrap();
    let err = rt
        .promote(COUNTS, false, &CancellationToken::new())
        .await
        .expect_err("refused");
    let msg = err.to_string();
    assert!(matches!(err, Error::InvalidState(_)), "{msg}");
    assert!(msg.contains("first differing stream `b1`"), "{msg}");
    let name = ProjectionName::new(COUNTS).unwrap();
    let rec = rt.store().generation(&name).await.unwrap().unwrap();
    assert_eq!(
        (rec.live, rec.building),
        (2, Some(3)),
        "a refusal changes nothing"
    );
    assert_eq!(total(&rt).await, 21);
    let swap = rt
        .promote(COUNTS, true, &CancellationToken::new())
        .await
        .expect("forced");
    assert_eq!((swap.from, swap.to), (2, 3));
    assert_eq!(total(&rt).await, 31, "b1 (5) and b2 (5) now count double");
    append(&rt, &streams[2..3], 1).await;
    assert_eq!(count(&rt, "b1").await, 12, "the live code is now the candidate's");
    let kept: BTreeMap<u32, u64> = rt
        .store()
        .stored_generations(&name)
        .await
        .unwrap()
        .iter()
        .map(|g| (g.generation, g.events))
        .collect();
    assert_eq!(
        kept.keys().copied().collect::<Vec<_>>(),
        [1, 2, 3],
        "old generations are kept"
    );
    // An unknown projection is named.
    let err = rt
        .rebuild_blue_green("nope", &CancellationToken::new())
        .await
        .expect_err("unknown");
    assert!(matches!(err, Error::NotFound(_)), "{err}");
}

#[tokio::test]
async fn promotion_on_memory() {
    promotion(MemoryJournal::new(), MemoryProjectionStore::new()).await;
}

#[tokio::test]
async fn promotion_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    promotion(
        SqliteJournal::open(dir.path().join("j.db"), SqliteOptions::default())
            .await
            .unwrap(),
        SqliteProjectionStore::open(dir.path().join("p.db"), SqliteOptions::default())
            .await
            .unwrap(),
    )
    .await;
}

/// A view wrapped with `view_projection` and registered with `projection`
/// (issue 45: it silently lost blue/green rebuilds) is known as a view:
/// its candidate is accepted, built beside it and promoted, and a
/// blue/green rebuild of it runs.
#[tokio::test]
async fn a_view_registered_as_a_projection_keeps_its_blue_green_rebuilds() {
    let streams = [sid("a1"), sid("b1")];
    let rt = Outbox::builder(MemoryJournal::new(), MemoryProjectionStore::new())
        .event_types(oracle_registry())
        .projection(outbox_core::view_projection(counts(1, None, false)))
        .candidate_arc(counts(2, None, true))
        .build()
        .await
        .expect("the candidate's view is registered");
    append(&rt, &streams, 3).await;
    assert_eq!(total(&rt).await, 6, "view reads see it");
    rt.shadow_build(COUNTS, &CancellationToken::new()).await.unwrap();
    let swap = rt
        .promote(COUNTS, false, &CancellationToken::new())
        .await
        .expect("agreeing candidate");
    assert_eq!((swap.from, swap.to), (1, 2));
    let rebuilt = rt
        .rebuild_blue_green(COUNTS, &CancellationToken::new())
        .await
        .expect("a view's blue/green rebuild");
    assert_eq!(total(&rt).await, 6, "{rebuilt:?}");
}

/// A projection of its own statements (here none): no view.
struct HandWritten(ProjectionName);

#[async_trait]
impl Projection<MemoryTx> for HandWritten {
    fn name(&self) -> &ProjectionName {
        &self.0
    }

    async fn apply(&self, _: &mut MemoryTx, _: &Event) -> Result<(), BoxError> {
        Ok(())
    }

    async fn reset(&self, _: &mut MemoryTx) -> Result<(), BoxError> {
        Ok(())
    }

    async fn digest(&self, _: &mut MemoryTx, _: &mut DigestBuilder) -> Result<(), BoxError> {
        Ok(())
    }
}

/// Generations are for view projections: a projection registered as a
/// `Projection<Tx>` is refused by name, and a registered name that looks like a generation's
/// storage name is refused at build.
#[tokio::test]
async fn hand_written_projections_and_reserved_names_are_refused() {
    let rt = Outbox::builder(MemoryJournal::new(), MemoryProjectionStore::new())
        .event_types(oracle_registry())
        .projection(Arc::new(HandWritten(ProjectionName::new("hand").unwrap())))
        .build()
        .await
        .unwrap();
    let err = rt
        .rebuild_blue_green("hand", &CancellationToken::new())
        .await
        .expect_err("hand-written");
    assert!(err.to_string().contains("OutboxBuilder::projection"), "{err}");
    let reserved = Arc::new(Counts {
        name: ProjectionName::new("counts@g2").unwrap(),
        version: 1,
        doubles: None,
        total_first: false,
    });
    let err = Outbox::builder(MemoryJournal::new(), MemoryProjectionStore::new())
        .view_arc(reserved)
        .build()
        .await
        .err()
        .expect("reserved name");
    assert!(err.to_string().contains("reserved"), "{err}");
}
