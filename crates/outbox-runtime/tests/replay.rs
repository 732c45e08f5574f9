//! The replay coordinator on the memory adapter.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_core::{
    BoxError, Clock, DigestBuilder, Event, ExpectedVersion, LeaseStore, OutboxInspector, Projection,
    ProjectionName, ProjectionStore, RunKind, RunState, RunStore, WorkerId, WorkerRegistry, async_trait,
};
use outbox_memory::{MemoryJournal, MemoryProjectionStore, MemoryTx};
use outbox_runtime::{Config, Outbox, ReplayOptions, TokioClock};
use outbox_testkit::{OracleProjection, Seed, add, audit, oracle_registry, sid};
use tokio_util::sync::CancellationToken;

type Rt = Outbox<MemoryJournal, MemoryProjectionStore>;

/// Wraps a projection and cancels a token after `after` applies.
struct CancelAfter {
    inner: Arc<dyn Projection<MemoryTx>>,
    seen: AtomicU64,
    after: u64,
    token: CancellationToken,
}

#[async_trait]
impl Projection<MemoryTx> for CancelAfter {
    fn name(&self) -> &ProjectionName {
        self.inner.name()
    }
    async fn apply(&self, tx: &mut MemoryTx, e: &Event) -> Result<(), BoxError> {
        if self.seen.fetch_add(1, Ordering::SeqCst) + 1 == self.after {
            self.token.cancel();
        }
        self.inner.apply(tx, e).await
    }
    async fn reset(&self, tx: &mut MemoryTx) -> Result<(), BoxError> {
        self.inner.reset(tx).await
    }
    async fn digest(&self, tx: &mut MemoryTx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        self.inner.digest(tx, out).await
    }
}

fn oracle(name: &str) -> Arc<dyn Projection<MemoryTx>> {
    OracleProjection::new(name).shared()
}

async fn build(
    journal: &MemoryJournal,
    store: &MemoryProjectionStore,
    projections: &[Arc<dyn Projection<MemoryTx>>],
    config: Config,
) -> Rt {
    let mut b = Outbox::builder(journal.clone(), store.clone())
        .config(config)
        .event_types(oracle_registry());
    for p in projections {
        b = b.projection(p.clone());
    }
    b.build().await.unwrap()
}

fn stores() -> (MemoryJournal, MemoryProjectionStore) {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::default());
    (
        MemoryJournal::with_clock(clock.clone()),
        MemoryProjectionStore::with_clock(clock),
    )
}

/// Appends a seeded random history; returns how many events were appended.
async fn random_history(rt: &Rt, seed: Seed, appends: usize) -> u64 {
    let mut rng = seed.rng();
    let mut total = 0;
    for _ in 0..appends {
        let s = sid(&format!("s{}", rng.below(9)));
        let n = 1 + rng.below(5);
        let events = (0..n)
            .map(|_| {
                if rng.below(6) == 0 {
                    audit()
                } else {
                    add(rng.below(100) as i64)
                }
            })
            .collect();
        rt.append(&s, ExpectedVersion::Any, events).await.unwrap();
        total += n;
    }
    total
}

async fn drain(rt: &Rt) {
    for _ in 0..1000 {
        let r = rt.tick().await.unwrap();
        if !r.made_progress() && rt.journal().summary().await.unwrap().total() == 0 {
            return;
        }
    }
    panic!("not drained");
}

#[tokio::test(start_paused = true)]
async fn worker_catch_up_and_rebuild_converge_on_randomized_journals() {
    for round in 0..5 {
        let seed = Seed::pick(&format!("worker_catch_up_and_rebuild_converge round {round}"));
        let (journal, store) = stores();
        let p = oracle("oracle");
        let rt = build(
            &journal,
            &store,
            std::slice::from_ref(&p),
            Config::apply_worker().with_batch_size(4),
        )
        .await;
        random_history(&rt, seed, 150).await;
        drain(&rt).await;
        let by_worker = store.digest(p.as_ref()).await.unwrap();

        // Catch-up into a fresh projection store over the same journal.
        let (_, fresh) = stores();
        let caught = build(&journal, &fresh, std::slice::from_ref(&p), Config::default()).await;
        let run = caught
            .replay("oracle", None, &CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(
            (run.kind, run.state),
            (RunKind::CatchUp, RunState::Completed),
            "seed {}",
            seed.0
        );
        assert_eq!(
            fresh.digest(p.as_ref()).await.unwrap(),
            by_worker,
            "seed {}: catch-up vs worker",
            seed.0
        );

        // Rebuild from origin in the worker's own store.
        let run = rt.rebuild("oracle", &CancellationToken::new()).await.unwrap();
        assert_eq!(run.state, RunState::Completed, "seed {}", seed.0);
        assert!(run.processed > 0);
        assert_eq!(
            store.digest(p.as_ref()).await.unwrap(),
            by_worker,
            "seed {}: rebuild vs worker",
            seed.0
        );
    }
}

#[tokio::test(start_paused = true)]
async fn cancelled_run_keeps_committed_batches_and_the_next_run_resumes() {
    let (journal, store) = stores();
    let reference = oracle("oracle");
    let rt = build(
        &journal,
        &store,
        std::slice::from_ref(&reference),
        Config::apply_worker().with_batch_size(5),
    )
    .await;
    let total = random_history(&rt, Seed(7), 60).await;
    drain(&rt).await;
    let want = store.digest(reference.as_ref()).await.unwrap();

    let token = CancellationToken::new();
    let cancelling: Arc<dyn Projection<MemoryTx>> = Arc::new(CancelAfter {
        inner: oracle("oracle"),
        seen: AtomicU64::new(0),
        after: 23,
        token: token.clone(),
    });
    let (_, fresh) = stores();
    let first = build(
        &journal,
        &fresh,
        &[cancelling],
        Config::default().with_batch_size(5),
    )
    .await;
    let run = first.replay("oracle", None, &token).await.unwrap();
    assert_eq!(run.state, RunState::Cancelled);
    assert!(
        run.processed >= 23 && run.processed < total,
        "stopped at a batch boundary: {}",
        run.processed
    );
    let committed = fresh.digest(reference.as_ref()).await.unwrap();
    assert_ne!(committed, want, "a cancelled run is partial");

    let second = build(
        &journal,
        &fresh,
        std::slice::from_ref(&reference),
        Config::default().with_batch_size(5),
    )
    .await;
    let run2 = second
        .replay("oracle", None, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(run2.state, RunState::Completed);
    assert_eq!(
        run.processed + run2.processed,
        total,
        "resumed from the checkpoint: nothing twice, nothing lost"
    );
    assert_eq!(fresh.digest(reference.as_ref()).await.unwrap(), want);
    let runs = fresh.runs(10).await.unwrap();
    assert_eq!(
        runs.iter().map(|r| r.state).collect::<Vec<_>>(),
        [RunState::Completed, RunState::Cancelled]
    );
}

#[tokio::test(start_paused = true)]
async fn until_stops_at_a_global_position() {
    let (journal, store) = stores();
    let p = oracle("oracle");
    let rt = build(&journal, &store, std::slice::from_ref(&p), Config::default()).await;
    for i in 0..10 {
        rt.append(
            &sid(if i % 2 == 0 { "a" } else { "b" }),
            ExpectedVersion::Any,
            vec![add(1)],
        )
        .await
        .unwrap();
    }
    let (_, fresh) = stores();
    let replayer = build(&journal, &fresh, std::slice::from_ref(&p), Config::default()).await;
    let run = replayer
        .replay("oracle", Some(5), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        (run.state, run.processed, run.until),
        (RunState::Completed, 5, Some(5))
    );
    assert_eq!(fresh.checkpoint(p.name(), &sid("a")).await.unwrap(), 3);
    assert_eq!(fresh.checkpoint(p.name(), &sid("b")).await.unwrap(), 2);
}

#[tokio::test(start_paused = true)]
async fn one_run_per_projection_and_a_clear_refusal() {
    let (journal, store) = stores();
    let p = oracle("oracle");
    let rt = build(&journal, &store, std::slice::from_ref(&p), Config::default()).await;
    rt.append(&sid("a"), ExpectedVersion::Any, vec![add(1)])
        .await
        .unwrap();
    // Another process is rebuilding the projection; it is alive (in the
    // worker registry, beating with a 10 s entry ttl).
    let other = WorkerId::new("other-process").unwrap();
    journal
        .heartbeat(
            &other,
            "elsewhere",
            1,
            outbox_core::Mode::OutboxApplyOnly,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let held = store
        .admit_run(RunKind::Rebuild, p.name(), None, &other, Duration::from_secs(60))
        .await
        .unwrap();
    let err = rt.rebuild("oracle", &CancellationToken::new()).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "rebuild run {} is already queued on projection `oracle`",
            held.id
        )),
        "{msg}"
    );
    assert!(matches!(err, outbox_core::Error::InvalidState(_)));
    let err = rt
        .replay("nope", None, &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("projection `nope` (registered: oracle)"),
        "{err}"
    );
    // It crashed: its registry entry expires (10 s) and the run has been
    // idle for a registry entry's lifetime (3 heartbeat intervals, 15 s)
    // long before the run's 60 s claim expires; the next request takes over,
    // marking it abandoned.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(
        rt.rebuild("oracle", &CancellationToken::new()).await.is_err(),
        "idle for less than a registry entry's lifetime: left alone"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let run = rt.rebuild("oracle", &CancellationToken::new()).await.unwrap();
    assert_eq!(run.state, RunState::Completed);
    assert_eq!(run.id, held.id + 1, "the refused admission consumed no id");
    let old = store.run(held.id).await.unwrap().unwrap();
    assert_eq!(
        (old.state, old.error_code.as_deref()),
        (RunState::Failed, Some("abandoned"))
    );
    assert!(
        old.error_message
            .as_deref()
            .unwrap_or("")
            .contains("worker registry"),
        "{old:?}"
    );
}

/// Issue 16: a run whose owner never registered (or whose entry was
/// pruned) is reclaimed once it has been idle for a registry entry's
/// lifetime, long before its claim expires; a live owner's run is kept until
/// its claim expires.
#[tokio::test(start_paused = true)]
async fn a_run_whose_owner_is_absent_from_the_registry_is_reclaimed_before_its_claim_expires() {
    let (journal, store) = stores();
    let p = oracle("oracle");
    let rt = build(&journal, &store, std::slice::from_ref(&p), Config::default()).await;
    rt.append(&sid("a"), ExpectedVersion::Any, vec![add(1)])
        .await
        .unwrap();
    let ghost = WorkerId::new("never-registered").unwrap();
    let held = store
        .admit_run(
            RunKind::Rebuild,
            p.name(),
            None,
            &ghost,
            Duration::from_secs(3600),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(16)).await;
    let run = rt.rebuild("oracle", &CancellationToken::new()).await.unwrap();
    assert_eq!(run.state, RunState::Completed);
    let old = store.run(held.id).await.unwrap().unwrap();
    assert_eq!(
        (old.state, old.error_code.as_deref()),
        (RunState::Failed, Some("abandoned"))
    );
    // The owner of a finished run keeps its registry entry only until it
    // ages out; a live owner (beating) keeps its run.
    let alive = WorkerId::new("alive").unwrap();
    journal
        .heartbeat(
            &alive,
            "elsewhere",
            2,
            outbox_core::Mode::OutboxApplyOnly,
            Duration::from_secs(3600),
        )
        .await
        .unwrap();
    store
        .admit_run(RunKind::Rebuild, p.name(), None, &alive, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        rt.rebuild("oracle", &CancellationToken::new()).await.is_err(),
        "a live owner's run blocks"
    );
    tokio::time::sleep(Duration::from_secs(61)).await;
    rt.rebuild("oracle", &CancellationToken::new())
        .await
        .expect("an expired claim frees the projection even with a live owner");
}

#[tokio::test(start_paused = true)]
async fn cancel_request_from_another_process_stops_the_run() {
    let (journal, store) = stores();
    let p = oracle("oracle");
    let rt = build(
        &journal,
        &store,
        std::slice::from_ref(&p),
        Config::default().with_batch_size(1),
    )
    .await;
    random_history(&rt, Seed(3), 30).await;
    // Queue a run, cancel it before it starts: it is cancelled at once.
    let other = WorkerId::new("other").unwrap();
    let queued = store
        .admit_run(RunKind::CatchUp, p.name(), None, &other, Duration::from_secs(60))
        .await
        .unwrap();
    let cancelled = rt.cancel_run(queued.id).await.unwrap();
    assert_eq!(cancelled.state, RunState::Cancelled);
    assert!(
        rt.cancel_run(queued.id).await.is_err(),
        "a finished run cannot be cancelled"
    );
    assert!(matches!(
        rt.cancel_run(999).await,
        Err(outbox_core::Error::NotFound(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn rebuild_alongside_the_live_worker_converges() {
    let seed = Seed::pick("rebuild_alongside_the_live_worker_converges");
    let (journal, store) = stores();
    let p = oracle("oracle");
    let config = Config::apply_worker()
        .with_batch_size(3)
        .with_poll_interval(Duration::from_millis(5));
    let rt = build(&journal, &store, std::slice::from_ref(&p), config).await;
    random_history(&rt, seed, 80).await;
    let running = rt.start().await.unwrap();
    // Rebuild while the worker drains and while more events arrive.
    let appender = {
        let rt = rt.clone();
        tokio::spawn(async move { random_history(&rt, Seed(seed.0 ^ 1), 80).await })
    };
    let run = rt.rebuild("oracle", &CancellationToken::new()).await.unwrap();
    assert_eq!(run.state, RunState::Completed, "seed {}", seed.0);
    appender.await.unwrap();
    for _ in 0..10_000 {
        if rt.journal().summary().await.unwrap().total() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.shutdown().await;
    let live = store.digest(p.as_ref()).await.unwrap();
    let (_, fresh) = stores();
    let check = build(&journal, &fresh, std::slice::from_ref(&p), Config::default()).await;
    check
        .replay("oracle", None, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        live,
        fresh.digest(p.as_ref()).await.unwrap(),
        "seed {}: live+rebuild vs replay from scratch",
        seed.0
    );
}

/// The journal's outbox rows, as (stream, seq, status), in order.
async fn rows(journal: &MemoryJournal) -> Vec<(String, u64, String)> {
    let mut out: Vec<_> = journal
        .list(None, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.stream.to_string(), r.seq.get(), format!("{:?}", r.status)))
        .collect();
    out.sort();
    out
}

#[tokio::test(start_paused = true)]
async fn replay_rebuild_and_repair_keep_the_outbox_rows_by_default() {
    let (journal, live) = stores();
    let p = oracle("oracle");
    // The live runtime enqueues; its worker has not drained yet.
    let rt = build(&journal, &live, std::slice::from_ref(&p), Config::apply_worker()).await;
    random_history(&rt, Seed(7), 20).await;
    let before = rows(&journal).await;
    assert!(!before.is_empty());
    // A scratch projection store, with a runtime in the same worker mode.
    let (_, scratch) = stores();
    let s = build(
        &journal,
        &scratch,
        std::slice::from_ref(&p),
        Config::apply_worker(),
    )
    .await;
    let cancel = CancellationToken::new();
    assert_eq!(
        s.replay("oracle", None, &cancel).await.unwrap().state,
        RunState::Completed
    );
    assert_eq!(rows(&journal).await, before, "replay");
    assert_eq!(
        s.rebuild("oracle", &cancel).await.unwrap().state,
        RunState::Completed
    );
    assert_eq!(rows(&journal).await, before, "rebuild");
    s.rebuild_all(&cancel).await.unwrap();
    assert_eq!(rows(&journal).await, before, "rebuild_all");
    s.repair_gaps().await.unwrap();
    assert_eq!(rows(&journal).await, before, "repair_gaps");
    // The live worker still drains them (as duplicates of nothing: the live
    // store has applied none of them yet).
    drain(&rt).await;
    assert_eq!(
        live.digest(p.as_ref()).await.unwrap(),
        scratch.digest(p.as_ref()).await.unwrap()
    );
}

/// A journal with `n` streams of three enqueued rows each that no
/// projection has applied, and the live store beside it.
async fn undrained(
    n: usize,
) -> (
    MemoryJournal,
    MemoryProjectionStore,
    Arc<dyn Projection<MemoryTx>>,
) {
    let (journal, store) = stores();
    let p = oracle("oracle");
    let rt = build(&journal, &store, std::slice::from_ref(&p), Config::apply_worker()).await;
    for i in 0..n {
        rt.append(
            &sid(&format!("s{i}")),
            ExpectedVersion::Any,
            vec![add(1), audit(), add(2)],
        )
        .await
        .unwrap();
    }
    assert_eq!(rows(&journal).await.len(), 3 * n);
    (journal, store, p)
}

#[tokio::test(start_paused = true)]
async fn completing_rows_is_an_explicit_opt_in() {
    let complete = ReplayOptions::new().with_complete_rows(true);
    assert!(!ReplayOptions::default().complete_rows() && complete.complete_rows());
    let cancel = CancellationToken::new();

    let (journal, store, p) = undrained(3).await;
    let rt = build(&journal, &store, std::slice::from_ref(&p), Config::apply_worker()).await;
    let report = rt.repair_gaps_with(complete).await.unwrap();
    assert_eq!((report.streams_repaired, report.events_applied), (3, 9));
    assert_eq!(rows(&journal).await, [], "repair_gaps_with(complete)");

    let (journal, store, p) = undrained(3).await;
    let rt = build(&journal, &store, std::slice::from_ref(&p), Config::apply_worker()).await;
    let run = rt.replay_with("oracle", None, complete, &cancel).await.unwrap();
    assert_eq!(run.state, RunState::Completed);
    assert_eq!(rows(&journal).await, [], "replay_with(complete)");

    let (journal, store, p) = undrained(3).await;
    let rt = build(&journal, &store, std::slice::from_ref(&p), Config::apply_worker()).await;
    rt.rebuild_with("oracle", complete, &cancel).await.unwrap();
    assert_eq!(rows(&journal).await, [], "rebuild_with(complete)");

    let (journal, store, p) = undrained(3).await;
    let rt = build(&journal, &store, std::slice::from_ref(&p), Config::apply_worker()).await;
    rt.rebuild_all_with(complete, &cancel).await.unwrap();
    assert_eq!(rows(&journal).await, [], "rebuild_all_with(complete)");

    // With the outbox off the runtime never deletes rows, even when asked.
    let (journal, store, p) = undrained(3).await;
    let before = rows(&journal).await;
    let rt = build(&journal, &store, std::slice::from_ref(&p), Config::default()).await;
    rt.repair_gaps_with(complete).await.unwrap();
    rt.replay_with("oracle", None, complete, &cancel).await.unwrap();
    assert_eq!(rows(&journal).await, before, "outbox off");
}

#[tokio::test(start_paused = true)]
async fn start_up_repair_of_a_live_runtime_still_completes_rows() {
    // Inline apply that deletes its rows: start() repairs, and no worker runs.
    let (journal, store, p) = undrained(3).await;
    let inline = Config::default().with_flags(outbox_core::ModeFlags {
        outbox: true,
        apply_worker: false,
        shadow_worker: false,
        inline_apply: true,
    });
    let rt = build(&journal, &store, std::slice::from_ref(&p), inline).await;
    let running = rt.start().await.unwrap();
    assert_eq!(running.repair_report().unwrap().events_applied, 9);
    assert_eq!(rows(&journal).await, [], "inline mode");
    running.shutdown().await;

    // The apply worker: start-up repair applies nothing itself (ADR 0029).
    // Every stream's lease is held by someone else: the rows wait for the
    // holder's lease to expire, and the worker then applies them.
    let (journal, store, p) = undrained(3).await;
    let zombie = WorkerId::new("zombie").unwrap();
    for i in 0..3 {
        journal
            .acquire(&sid(&format!("s{i}")), &zombie, Duration::from_secs(600))
            .await
            .unwrap()
            .unwrap();
    }
    let rt = build(
        &journal,
        &store,
        std::slice::from_ref(&p),
        Config::apply_worker().with_leasing(false),
    )
    .await;
    let running = rt.start().await.unwrap();
    let report = running.repair_report().unwrap().clone();
    assert_eq!(
        (report.events_applied, report.handed_to_worker),
        (0, 3),
        "handed to the worker: {report:?}"
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(rows(&journal).await.len(), 9, "the zombie's leases hold the rows");
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(
        rows(&journal).await,
        [],
        "the worker applied them once the leases expired"
    );
    running.shutdown().await;
}

/// A projection whose apply never returns: a process that hangs, then dies.
struct Hang(ProjectionName);

#[async_trait]
impl Projection<MemoryTx> for Hang {
    fn name(&self) -> &ProjectionName {
        &self.0
    }
    async fn apply(&self, _tx: &mut MemoryTx, _e: &Event) -> Result<(), BoxError> {
        std::future::pending().await
    }
    async fn reset(&self, _tx: &mut MemoryTx) -> Result<(), BoxError> {
        Ok(())
    }
    async fn digest(&self, _tx: &mut MemoryTx, _out: &mut DigestBuilder) -> Result<(), BoxError> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_killed_run_blocks_new_runs_for_the_configured_run_ttl_only() {
    let (journal, store) = stores();
    let hang: Arc<dyn Projection<MemoryTx>> = Arc::new(Hang(ProjectionName::new("oracle").unwrap()));
    let config = |id: &str| {
        Config::default()
            .with_run_ttl(Duration::from_secs(5))
            .with_worker_id(WorkerId::new(id).unwrap())
    };
    let rt = build(&journal, &store, &[oracle("oracle")], config("next")).await;
    rt.append(&sid("a"), ExpectedVersion::Any, vec![add(1)])
        .await
        .unwrap();
    let dying = build(&journal, &store, &[hang], config("dying")).await;
    // The rebuild hangs in its first apply and its process is killed.
    let killed = tokio::time::timeout(
        Duration::from_secs(1),
        dying.rebuild("oracle", &CancellationToken::new()),
    )
    .await;
    assert!(killed.is_err(), "the rebuild hung");
    let err = rt.rebuild("oracle", &CancellationToken::new()).await.unwrap_err();
    assert!(err.to_string().contains("already"), "{err}");
    // Five seconds after its last progress update the claim has expired.
    tokio::time::sleep(Duration::from_millis(4_100)).await;
    let run = rt.rebuild("oracle", &CancellationToken::new()).await.unwrap();
    assert_eq!(run.state, RunState::Completed);
}

/// Wraps a projection and never returns from its apply number `after + 1`
/// (a process that hangs there and is then killed).
struct HangAfter {
    inner: Arc<dyn Projection<MemoryTx>>,
    seen: AtomicU64,
    after: u64,
}

#[async_trait]
impl Projection<MemoryTx> for HangAfter {
    fn name(&self) -> &ProjectionName {
        self.inner.name()
    }
    async fn apply(&self, tx: &mut MemoryTx, e: &Event) -> Result<(), BoxError> {
        if self.seen.fetch_add(1, Ordering::SeqCst) == self.after {
            std::future::pending::<()>().await;
        }
        self.inner.apply(tx, e).await
    }
    async fn reset(&self, tx: &mut MemoryTx) -> Result<(), BoxError> {
        self.inner.reset(tx).await
    }
    async fn digest(&self, tx: &mut MemoryTx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        self.inner.digest(tx, out).await
    }
}

/// A catch-up killed after some committed batches (it hangs inside the next
/// batch's transaction, which never commits, and its process is dropped)
/// resumes from the global position it recorded and ends with the digest
/// of an uninterrupted run: every event applied exactly once in all.
#[tokio::test(start_paused = true)]
async fn a_killed_run_resumes_from_its_recorded_position_and_converges() {
    for round in 0..3 {
        let seed = Seed::pick(&format!(
            "a_killed_run_resumes_from_its_recorded_position round {round}"
        ));
        let (journal, store) = stores();
        let p = oracle("oracle");
        let rt = build(
            &journal,
            &store,
            std::slice::from_ref(&p),
            Config::apply_worker().with_batch_size(5),
        )
        .await;
        let total = random_history(&rt, seed, 60).await;
        drain(&rt).await;
        let by_worker = store.digest(p.as_ref()).await.unwrap();

        let config = |id: &str| {
            Config::default()
                .with_batch_size(5)
                .with_run_ttl(Duration::from_secs(5))
                .with_worker_id(WorkerId::new(id).unwrap())
        };
        let (_, whole) = stores();
        let uninterrupted = build(&journal, &whole, std::slice::from_ref(&p), config("whole"))
            .await
            .replay("oracle", None, &CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(uninterrupted.state, RunState::Completed, "seed {}", seed.0);
        let want = whole.digest(p.as_ref()).await.unwrap();
        assert_eq!(want, by_worker, "seed {}: catch-up vs worker", seed.0);

        let (_, fresh) = stores();
        let hang: Arc<dyn Projection<MemoryTx>> = Arc::new(HangAfter {
            inner: oracle("oracle"),
            seen: AtomicU64::new(0),
            after: 17,
        });
        let dying = build(&journal, &fresh, &[hang], config("dying")).await;
        let killed = tokio::time::timeout(
            Duration::from_secs(1),
            dying.replay("oracle", None, &CancellationToken::new()),
        )
        .await;
        assert!(killed.is_err(), "seed {}: the run hung", seed.0);
        let stopped = fresh.runs(1).await.unwrap().remove(0);
        assert_eq!(stopped.state, RunState::Running, "seed {}", seed.0);
        let position = stopped.position.expect("a committed page recorded its position");
        assert!(
            stopped.processed > 0 && stopped.processed < total,
            "seed {}: part of the journal committed ({} of {total})",
            seed.0,
            stopped.processed
        );
        assert_ne!(
            fresh.digest(p.as_ref()).await.unwrap(),
            want,
            "seed {}: partial",
            seed.0
        );

        let next = build(&journal, &fresh, std::slice::from_ref(&p), config("next")).await;
        let early = next
            .resume_run(stopped.id, ReplayOptions::new(), &CancellationToken::new())
            .await
            .unwrap_err();
        assert!(early.to_string().contains("already"), "seed {}: {early}", seed.0);
        // The killed run's claim expires five seconds after its last progress.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let resumed = next
            .resume_run(stopped.id, ReplayOptions::new(), &CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(
            (resumed.kind, resumed.state, resumed.since),
            (RunKind::CatchUp, RunState::Completed, Some(position)),
            "seed {}",
            seed.0
        );
        assert!(
            resumed.position.is_some_and(|end| end > position),
            "seed {}",
            seed.0
        );
        assert_eq!(
            stopped.processed + resumed.processed,
            total,
            "seed {}: nothing applied twice, nothing lost",
            seed.0
        );
        assert_eq!(fresh.digest(p.as_ref()).await.unwrap(), want, "seed {}", seed.0);
        let old = fresh.run(stopped.id).await.unwrap().unwrap();
        assert_eq!(
            (old.state, old.error_code.as_deref(), old.position),
            (RunState::Failed, Some("abandoned"), Some(position)),
            "seed {}",
            seed.0
        );
        let err = next
            .resume_run(resumed.id, ReplayOptions::new(), &CancellationToken::new())
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("nothing to resume"),
            "seed {}: {err}",
            seed.0
        );
    }
}

/// `since`: events at or before it are taken as reflected and not read; a
/// stream whose checkpoint is behind its first event after `since` is caught
/// up from its checkpoint (never skipped, never doubled); a stream with no
/// event after `since` is not looked at; bad bounds are refused.
#[tokio::test(start_paused = true)]
async fn since_reads_after_its_position_and_catches_up_a_stream_behind() {
    let (journal, store) = stores();
    let p = oracle("oracle");
    let rt = build(&journal, &store, std::slice::from_ref(&p), Config::default()).await;
    // Positions: 1 d1, 2 a1, 3 b1, 4 a2, 5 c1, 6 b2, 7 a3, 8 c2.
    for (stream, value) in [
        ("d", 1),
        ("a", 1),
        ("b", 2),
        ("a", 3),
        ("c", 4),
        ("b", 5),
        ("a", 6),
        ("c", 7),
    ] {
        rt.append(&sid(stream), ExpectedVersion::Any, vec![add(value)])
            .await
            .unwrap();
    }
    let (_, fresh) = stores();
    // The projection reflects a1 and a2 only: b is behind its first event
    // after position 4 (b2), d behind with nothing after it.
    let a = outbox_core::EventJournal::read_stream(&journal, &sid("a"), outbox_core::Seq::FIRST, 2)
        .await
        .unwrap();
    fresh
        .apply(&sid("a"), &a, std::slice::from_ref(&p))
        .await
        .unwrap();
    let replayer = build(&journal, &fresh, std::slice::from_ref(&p), Config::default()).await;
    let bounds = outbox_core::RunBounds::new().with_since(Some(4));
    let run = replayer
        .replay_bounded("oracle", bounds, ReplayOptions::new(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        (run.state, run.since, run.until, run.position),
        (RunState::Completed, Some(4), None, Some(8))
    );
    assert_eq!(run.processed, 5, "c1, b1 (caught up), b2, a3, c2");
    let checkpoints = async |s: &str| fresh.checkpoint(p.name(), &sid(s)).await.unwrap();
    assert_eq!(
        (
            checkpoints("a").await,
            checkpoints("b").await,
            checkpoints("c").await,
            checkpoints("d").await
        ),
        (3, 2, 2, 0),
        "b caught up from its checkpoint; d, with nothing after `since`, left alone"
    );
    // With d applied too, the result is the full journal's.
    let d = outbox_core::EventJournal::read_stream(&journal, &sid("d"), outbox_core::Seq::FIRST, 1)
        .await
        .unwrap();
    fresh
        .apply(&sid("d"), &d, std::slice::from_ref(&p))
        .await
        .unwrap();
    let (_, whole) = stores();
    build(&journal, &whole, std::slice::from_ref(&p), Config::default())
        .await
        .replay("oracle", None, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        fresh.digest(p.as_ref()).await.unwrap(),
        whole.digest(p.as_ref()).await.unwrap()
    );

    // `since` with `until`: only (4, 6] is read; a second run finds it applied.
    let again = replayer
        .replay_bounded(
            "oracle",
            bounds.with_until(Some(6)),
            ReplayOptions::new(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!((again.processed, again.position), (0, Some(6)));
    for bad in [bounds.with_until(Some(4)), bounds.with_until(Some(2))] {
        let err = replayer
            .replay_bounded("oracle", bad, ReplayOptions::new(), &CancellationToken::new())
            .await
            .unwrap_err();
        assert!(
            matches!(err, outbox_core::Error::InvalidInput(_)),
            "{bad:?}: {err}"
        );
    }
}
