//! A poison event harms only its own stream (ADR 0029): an apply that kills
//! its process or hangs is charged to the row being applied, never to the
//! rows claimed beside it, and dead-letters at exactly the threshold, on
//! every worker configuration (sweeps and partition leasing on and off).
//!
//! The memory adapter in tokio's paused time; a "crash" is
//! [`Running::abort`](outbox_runtime::Running::abort) while the poison's
//! apply is in progress (no completion, failure, abandon or release runs),
//! followed by a new runtime on the same stores, as a supervisor restarts a
//! process.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    BoxError, Clock, Event, ExpectedVersion, OutboxInspector, OutboxStatus, Projection, ProjectionName,
    RetryPolicy, Seq, StreamId, ViewProjection, ViewTx, async_trait,
};
use outbox_memory::{MemoryJournal, MemoryProjectionStore, MemoryTx};
use outbox_runtime::{Config, Outbox, TokioClock};
use outbox_testkit::{Expected, OracleProjection, add, check_history, oracle_registry, read_state, sid};
use tokio::sync::Notify;

type Rt = Outbox<MemoryJournal, MemoryProjectionStore>;

const THRESHOLD: u32 = 3;
const STREAMS: usize = 12;
const EVENTS: u64 = 3;
/// The poison: the second stream's second event.
const POISON_STREAM: usize = 1;
const POISON_SEQ: u64 = 2;

fn stream(i: usize) -> StreamId {
    sid(&format!("s{i:02}"))
}

/// A view whose apply of the poison event never returns; it says when it
/// starts one.
struct Poisoned {
    name: ProjectionName,
    started: Arc<Notify>,
}

#[async_trait]
impl ViewProjection for Poisoned {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn apply(&self, _view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError> {
        if event.stream == stream(POISON_STREAM) && event.seq.get() == POISON_SEQ {
            self.started.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

struct Env {
    journal: MemoryJournal,
    store: MemoryProjectionStore,
    oracle: Arc<dyn Projection<MemoryTx>>,
    started: Arc<Notify>,
}

fn env() -> Env {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::default());
    Env {
        journal: MemoryJournal::with_clock(clock.clone()),
        store: MemoryProjectionStore::with_clock(clock),
        oracle: OracleProjection::new("oracle").shared(),
        started: Arc::new(Notify::new()),
    }
}

fn config(sweeps: bool, leasing: bool, repair: bool) -> Config {
    Config::apply_worker()
        .with_poll_interval(Duration::from_millis(200))
        .with_retry(RetryPolicy::new(Duration::from_secs(1), Duration::from_secs(2), THRESHOLD).unwrap())
        .with_sweep_rows(if sweeps { 512 } else { 0 })
        .with_leasing(leasing)
        .with_repair_on_start(repair)
}

async fn runtime(e: &Env, config: Config) -> Rt {
    Outbox::builder(e.journal.clone(), e.store.clone())
        .config(config)
        .event_types(oracle_registry())
        .projection(e.oracle.clone())
        .view(Poisoned {
            name: ProjectionName::new("poisoned").unwrap(),
            started: e.started.clone(),
        })
        .build()
        .await
        .expect("runtime builds")
}

async fn append_all(rt: &Rt) {
    for i in 0..STREAMS {
        let events = (1..=EVENTS).map(|v| add(v as i64)).collect();
        rt.append(&stream(i), ExpectedVersion::Any, events).await.unwrap();
    }
}

async fn poison_row(rt: &Rt) -> outbox_core::OutboxRow {
    rt.journal()
        .row(&stream(POISON_STREAM), Seq::new(POISON_SEQ).unwrap())
        .await
        .unwrap()
        .expect("the poison row is kept")
}

/// Every stream but the poisoned one applied whole; the poisoned one
/// through the event before the poison; the poison dead after exactly
/// the threshold of its own attempts; no other row charged or dead.
async fn check_isolated(e: &Env, rt: &Rt, what: &str) {
    let poison = poison_row(rt).await;
    assert_eq!(
        (poison.status, poison.attempt_count),
        (OutboxStatus::Dead, THRESHOLD),
        "{what}: the poison is dead after exactly the threshold: {poison:?}"
    );
    let summary = rt.journal().summary().await.unwrap();
    assert_eq!(summary.dead, 1, "{what}: only the poison is dead: {summary:?}");
    for seq in POISON_SEQ + 1..=EVENTS {
        let behind = rt
            .journal()
            .row(&stream(POISON_STREAM), Seq::new(seq).unwrap())
            .await
            .unwrap()
            .expect("the rows behind the poison wait");
        assert_eq!(
            (behind.status, behind.attempt_count, behind.last_error.as_deref()),
            (OutboxStatus::Pending, 0, None),
            "{what}: a row behind the poison is waiting, never charged"
        );
    }
    assert_eq!(
        summary.total(),
        EVENTS - POISON_SEQ + 1,
        "{what}: every other row was applied and completed: {summary:?}"
    );
    let sum: i64 = (1..=EVENTS as i64).sum();
    let mut want: BTreeMap<String, Expected> = (0..STREAMS)
        .map(|i| (stream(i).to_string(), Expected { through: EVENTS, sum }))
        .collect();
    want.insert(
        stream(POISON_STREAM).to_string(),
        Expected {
            through: POISON_SEQ - 1,
            sum: (1..POISON_SEQ as i64).sum(),
        },
    );
    let state = read_state(&e.store, "oracle").await.unwrap();
    check_history(&state, &want, &BTreeMap::new())
        .unwrap_or_else(|p| panic!("{what}: every innocent stream applied exactly once:\n{p}"));
}

/// A poison whose apply kills its process, under a supervisor that
/// restarts it: the first crash (the poison claimed beside other streams'
/// rows) charges nobody; each crash after it is the poison's own, and the
/// poison is dead once they reach the threshold. Every configuration of
/// sweeps, partition leasing and start-up repair: a restart's start-up
/// repair neither crash-loops on the poison nor applies it once dead.
#[tokio::test(start_paused = true)]
async fn a_process_killing_poison_is_dead_after_exactly_its_own_attempts_and_harms_no_other_stream() {
    for (sweeps, leasing, repair) in [
        (true, true, true),
        (true, true, false),
        (true, false, true),
        (false, true, false),
        (false, false, true),
        (false, false, false),
    ] {
        let what = format!("sweeps {sweeps}, leasing {leasing}, start-up repair {repair}");
        let e = env();
        let first = runtime(&e, config(sweeps, leasing, repair)).await;
        append_all(&first).await;
        let mut crashes = 0u32;
        let mut rt = first;
        for _ in 0..50 {
            let running = rt.start().await.unwrap();
            let dead = tokio::select! {
                () = e.started.notified() => false,
                () = tokio::time::sleep(Duration::from_secs(60)) => true,
            };
            // A crash mid-apply, or (once the poison is dead) a stop.
            running.abort();
            if dead {
                break;
            }
            crashes += 1;
            // The supervisor restarts the process after its leases expired.
            tokio::time::advance(Duration::from_secs(61)).await;
            rt = runtime(&e, config(sweeps, leasing, repair)).await;
        }
        eprintln!("{what}: {crashes} crashes until the poison was dead");
        check_isolated(&e, &rt, &what).await;
        assert!(
            crashes == THRESHOLD || crashes == THRESHOLD + 1,
            "{what}: {crashes} crashes: the threshold's own, plus at most one shared by other rows"
        );
    }
}

/// A poison whose apply hangs: each apply past the store deadline ends
/// like a crash, so the poison dead-letters after exactly the threshold of
/// its own attempts instead of being retried forever, and the other
/// streams flow meanwhile. One running runtime, no restart.
#[tokio::test(start_paused = true)]
async fn a_hanging_poison_is_dead_after_exactly_its_own_attempts_and_harms_no_other_stream() {
    for (sweeps, leasing) in [(true, true), (false, false)] {
        let what = format!("sweeps {sweeps}, leasing {leasing}");
        let e = env();
        let rt = runtime(&e, config(sweeps, leasing, true)).await;
        append_all(&rt).await;
        let running = rt.start().await.unwrap();
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_secs(5)).await;
            if poison_row(&rt).await.status == OutboxStatus::Dead
                && rt.journal().summary().await.unwrap().total() == 2
            {
                break;
            }
        }
        running.shutdown().await;
        check_isolated(&e, &rt, &what).await;
    }
}

/// Gap repair run by hand (`outbox gaps --repair`) honours the outbox too:
/// it catches the poisoned stream up to the event before its dead head and
/// stops there; the dead row is not applied.
#[tokio::test(start_paused = true)]
async fn gap_repair_stops_short_of_a_dead_head() {
    let e = env();
    let rt = runtime(&e, config(true, true, false)).await;
    append_all(&rt).await;
    // The poison dead-letters (hanging past the deadline each time).
    let running = rt.start().await.unwrap();
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        if poison_row(&rt).await.status == OutboxStatus::Dead {
            break;
        }
    }
    running.shutdown().await;
    // A fresh projection store: every stream is behind it.
    let store = MemoryProjectionStore::with_clock(Arc::new(TokioClock::default()));
    let scratch = Env {
        journal: e.journal.clone(),
        store: store.clone(),
        oracle: OracleProjection::new("oracle").shared(),
        started: Arc::new(Notify::new()),
    };
    let by_hand = runtime(&scratch, config(true, true, false)).await;
    let applying = scratch.started.notified();
    tokio::pin!(applying);
    applying.as_mut().enable();
    let report = by_hand.repair_gaps().await.unwrap();
    assert_eq!(report.stopped_at_head, 1, "{report:?}");
    assert!(
        futures_poll_once(applying.as_mut()).await.is_none(),
        "the dead poison was not applied"
    );
    check_isolated(&scratch, &by_hand, "repair by hand").await;
}

/// Whether `f` is ready at once.
async fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        out = f => Some(out),
        () = std::future::ready(()) => None,
    }
}

/// A supervisor restarting a killed worker under a fixed id: the id's
/// registry entry names a process of this host that no longer exists, so
/// the new process takes the id over at once. An entry naming a live
/// process (this test's own) or another host still refuses the id.
#[cfg(target_os = "linux")]
#[tokio::test(start_paused = true)]
async fn a_worker_id_held_by_a_dead_process_of_this_host_is_taken_over_at_once() {
    use outbox_core::{Mode, WorkerId, WorkerRegistry};
    let e = env();
    let id = WorkerId::new("fixed").unwrap();
    let host = outbox_runtime::host_name();
    let fixed = || config(true, true, false).with_worker_id(id.clone());
    // No process has pid u32::MAX - 1 (Linux caps pids far below).
    let dead_pid = u32::MAX - 1;
    let ttl = Duration::from_secs(60);
    e.journal
        .heartbeat(&id, &host, dead_pid, Mode::OutboxApplyOnly, ttl)
        .await
        .unwrap();
    let rt = runtime(&e, fixed()).await;
    let running = rt
        .start()
        .await
        .expect("a dead holder's id is taken over at once");
    let holder = e.journal.workers().await.unwrap();
    assert_eq!(
        holder.iter().map(|w| (w.id.as_str(), w.pid)).collect::<Vec<_>>(),
        [("fixed", std::process::id())],
        "the id is this process's now"
    );
    running.shutdown().await;
    // A live holder: pid 1 exists on every Linux host.
    e.journal
        .heartbeat(&id, &host, 1, Mode::OutboxApplyOnly, ttl)
        .await
        .unwrap();
    let refused = runtime(&e, fixed()).await.start().await;
    assert!(
        matches!(refused, Err(outbox_core::Error::InvalidState(_))),
        "a live holder keeps its id: {:?}",
        refused.err()
    );
    e.journal.deregister(&id).await.unwrap();
    // Another host's process cannot be checked from here.
    e.journal
        .heartbeat(&id, "another-host", dead_pid, Mode::OutboxApplyOnly, ttl)
        .await
        .unwrap();
    let refused = runtime(&e, fixed()).await.start().await;
    assert!(
        matches!(refused, Err(outbox_core::Error::InvalidState(_))),
        "another host's holder keeps its id until its entry expires: {:?}",
        refused.err()
    );
}

/// `gaps --repair --complete-rows` still clears a dead row whose event every
/// projection has applied (a stale hint): stopping short of a dead head only
/// holds back events still to be applied.
#[tokio::test(start_paused = true)]
async fn repair_with_complete_rows_clears_a_dead_row_already_applied() {
    use outbox_core::{LeaseStore, OutboxQueue, WorkerId};
    let e = env();
    let rt = runtime(&e, config(true, true, false)).await;
    let s = sid("applied");
    rt.append(&s, ExpectedVersion::Any, vec![add(1)]).await.unwrap();
    let report = rt.repair_gaps().await.unwrap();
    assert_eq!(report.events_applied, 1, "applied, its row left: {report:?}");
    let w = WorkerId::new("w").unwrap();
    let lease = e
        .journal
        .acquire(&s, &w, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    e.journal.claim(&lease, 1).await.unwrap();
    let once = RetryPolicy::new(Duration::from_secs(1), Duration::from_secs(1), 1).unwrap();
    e.journal.fail(&lease, Seq::FIRST, "boom", &once).await.unwrap();
    e.journal.release(&lease).await.unwrap();
    assert_eq!(rt.journal().summary().await.unwrap().dead, 1);
    rt.repair_gaps_with(outbox_runtime::ReplayOptions::new().with_complete_rows(true))
        .await
        .unwrap();
    assert_eq!(
        rt.journal().summary().await.unwrap().total(),
        0,
        "the stale dead row is completed"
    );
}
