//! The runtime on SQLite files, with several runtimes (each with its own
//! store instances, as separate processes would have) on the same files.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{
    AppendOptions, AppendRequest, EventJournal, ExpectedVersion, OutboxInspector, OutboxStatus,
    PartitionStore, Projection, ProjectionStore, RetryPolicy, Seq, StreamId,
};
use outbox_runtime::{Config, Outbox};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore, SqliteTx};
use outbox_testkit::{
    Expected, Faults, OracleProjection, add, check_history, oracle_registry, read_state, sid,
};

type Rt = Outbox<SqliteJournal, SqliteProjectionStore>;

struct Files {
    _dir: tempfile::TempDir,
    journal: std::path::PathBuf,
    projections: std::path::PathBuf,
}

fn files() -> Files {
    let dir = tempfile::tempdir().unwrap();
    Files {
        journal: dir.path().join("journal.db"),
        projections: dir.path().join("projections.db"),
        _dir: dir,
    }
}

fn oracle() -> (Arc<dyn Projection<SqliteTx>>, Faults) {
    let p = OracleProjection::new("oracle");
    let f = p.faults();
    (p.shared(), f)
}

async fn open(f: &Files, config: Config, p: &Arc<dyn Projection<SqliteTx>>) -> Rt {
    let journal = SqliteJournal::open(&f.journal, SqliteOptions::default())
        .await
        .unwrap();
    let store = SqliteProjectionStore::open(&f.projections, SqliteOptions::default())
        .await
        .unwrap();
    Outbox::builder(journal, store)
        .config(config)
        .event_types(oracle_registry())
        .projection(p.clone())
        .build()
        .await
        .unwrap()
}

async fn wait_drained(rt: &Rt, limit: Duration) {
    let start = Instant::now();
    loop {
        let s = rt.journal().summary().await.unwrap();
        let failing = rt.projection_states(None, 10).await.unwrap();
        if s.total() == 0 && failing.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "not drained within {limit:?}: {s:?}, projections off the shared path: {failing:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn expected(streams: &[StreamId], events: u64, value: i64) -> BTreeMap<String, Expected> {
    streams
        .iter()
        .map(|s| {
            (
                s.to_string(),
                Expected {
                    through: events,
                    sum: value * events as i64,
                },
            )
        })
        .collect()
}

/// A projection that applies like `inner` until it has applied `after`
/// events, then says so on `stalled` and never returns: a process hung in
/// its applier, holding whatever it had claimed.
struct Stall {
    inner: Arc<dyn Projection<SqliteTx>>,
    after: u64,
    applied: std::sync::atomic::AtomicU64,
    stalled: Arc<tokio::sync::Notify>,
}

#[outbox_core::async_trait]
impl Projection<SqliteTx> for Stall {
    fn name(&self) -> &outbox_core::ProjectionName {
        self.inner.name()
    }

    async fn setup(&self, tx: &mut SqliteTx) -> Result<(), outbox_core::BoxError> {
        self.inner.setup(tx).await
    }

    async fn apply(
        &self,
        tx: &mut SqliteTx,
        event: &outbox_core::Event,
    ) -> Result<(), outbox_core::BoxError> {
        if self.applied.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == self.after {
            self.stalled.notify_one();
            std::future::pending::<()>().await;
        }
        self.inner.apply(tx, event).await
    }

    async fn reset(&self, tx: &mut SqliteTx) -> Result<(), outbox_core::BoxError> {
        self.inner.reset(tx).await
    }

    async fn digest(
        &self,
        tx: &mut SqliteTx,
        out: &mut outbox_core::DigestBuilder,
    ) -> Result<(), outbox_core::BoxError> {
        self.inner.digest(tx, out).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_runtimes_on_one_pair_of_files_one_crashes_nothing_lost_or_doubled() {
    four_runtimes_one_crashes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_partitioned_runtimes_one_crashes_nothing_lost_or_doubled() {
    four_runtimes_one_crashes(true).await;
}

/// Four runtimes on one pair of files, one killed inside an apply, with
/// stream leases (`leasing` off) or partition leases.
async fn four_runtimes_one_crashes(leasing: bool) {
    let f = files();
    let (p, _) = oracle();
    let config = Config::apply_worker()
        .with_lease_ttl(Duration::from_millis(1500))
        .with_heartbeat_interval(Duration::from_millis(500))
        .with_poll_interval(Duration::from_millis(50))
        .with_batch_size(16)
        .with_leasing(leasing)
        .with_repair_on_start(false);
    let stalled = Arc::new(tokio::sync::Notify::new());
    let stalling: Arc<dyn Projection<SqliteTx>> = Arc::new(Stall {
        inner: p.clone(),
        after: 50,
        applied: std::sync::atomic::AtomicU64::new(0),
        stalled: stalled.clone(),
    });
    let mut rts = Vec::new();
    for i in 0..4 {
        let c = config
            .clone()
            .with_worker_id(outbox_core::WorkerId::new(format!("rt-{i}")).unwrap());
        rts.push(open(&f, c, if i == 0 { &stalling } else { &p }).await);
    }
    let streams: Vec<StreamId> = (0..100).map(|i| sid(&format!("s{i:03}"))).collect();
    // 100 streams x 100 events, appended in 10 rounds of one transaction each.
    for round in 0..10u64 {
        let batch: Vec<AppendRequest> = streams
            .iter()
            .map(|s| {
                AppendRequest::new(
                    s.clone(),
                    ExpectedVersion::Exact(round * 10),
                    (0..10).map(|_| add(3)).collect(),
                )
            })
            .collect();
        rts[0].append_batch(batch).await.unwrap();
    }
    // Runtimes 0 and 1 start; a runtime holds the leases of at most two
    // sweeps (32 streams each here), so runtime 1 cannot take every stream
    // and runtime 0 gets work of its own.
    let mut running: Vec<_> = Vec::new();
    for rt in &rts[..2] {
        running.push(Some(rt.start().await.unwrap()));
    }
    // Crash runtime 0 while it holds stream leases: its applier stalls
    // inside a batch (the leases of that batch or sweep are held, its rows
    // claimed), and the runtime is killed there.
    let victim = rts[0].worker_id().clone();
    tokio::time::timeout(Duration::from_secs(60), stalled.notified())
        .await
        .expect("runtime 0 reached its stalling apply");
    running[0].take().unwrap().abort();
    // Two more runtimes join.
    for rt in &rts[2..] {
        running.push(Some(rt.start().await.unwrap()));
    }
    // What a dead process leaves: its connections gone, its leases live.
    rts[0].journal().close().await;
    rts[0].store().close().await;
    let mut stranded = BTreeSet::new();
    let oracle = outbox_core::ProjectionName::new("oracle").unwrap();
    let victims_partitions: BTreeSet<outbox_core::Partition> = rts[1]
        .journal()
        .partitions()
        .await
        .unwrap()
        .into_iter()
        .filter(|p| p.owner.as_ref() == Some(&victim))
        .map(|p| p.partition)
        .collect();
    for s in &streams {
        let held = if leasing {
            victims_partitions.contains(&rts[1].journal().partitioning().of(s))
        } else {
            rts[1]
                .journal()
                .lease(s)
                .await
                .unwrap()
                .is_some_and(|l| l.owner == victim)
        };
        if held {
            // Stranded with work: events the crashed runtime had not applied.
            let applied = rts[1].store().checkpoint(&oracle, s).await.unwrap();
            let version = rts[1].journal().stream_version(s).await.unwrap();
            if applied < version {
                stranded.insert(s.clone());
            }
        }
    }
    assert!(
        !stranded.is_empty(),
        "runtime 0 was killed inside an apply: it held the leases of that batch"
    );
    wait_drained(&rts[1], Duration::from_secs(90)).await;
    for r in running.into_iter().flatten() {
        r.shutdown().await;
    }
    let state = read_state(rts[1].store(), "oracle").await.expect("oracle state");
    check_history(&state, &expected(&streams, 100, 3), &BTreeMap::new())
        .expect("every event applied exactly once, in order");
    eprintln!(
        "runtime 0 crashed holding {} stream(s) with work ({} partition(s)); all were taken over after expiry",
        stranded.len(),
        victims_partitions.len()
    );
    for s in &stranded {
        let l = rts[1].journal().lease(s).await.unwrap();
        assert!(
            l.is_none_or(|l| l.owner != victim),
            "{s} still held by the crashed runtime"
        );
    }
    let after = rts[1].journal().partitions().await.unwrap();
    assert!(
        after.iter().all(|p| p.owner.as_ref() != Some(&victim) || !p.held),
        "no partition is still held by the crashed runtime: {after:?}"
    );
    let totals: u64 = rts[1..].iter().map(|r| r.metrics().completed_rows).sum();
    assert!(totals > 0, "the surviving runtimes did the work");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_on_sqlite_dead_letters_at_the_threshold_and_requeue_applies_once() {
    let f = files();
    let (p, faults) = oracle();
    let policy = RetryPolicy::new(Duration::from_millis(5), Duration::from_millis(20), 3).unwrap();
    let rt = open(
        &f,
        Config::apply_worker()
            .with_retry(policy)
            .with_poll_interval(Duration::from_millis(10)),
        &p,
    )
    .await;
    let (bad, good) = (sid("bad"), sid("good"));
    faults.fail(&bad, 2, u32::MAX);
    rt.append(&bad, ExpectedVersion::NoStream, vec![add(1), add(2), add(3)])
        .await
        .unwrap();
    rt.append(&good, ExpectedVersion::NoStream, vec![add(5), add(5)])
        .await
        .unwrap();
    let running = rt.start().await.unwrap();
    let start = Instant::now();
    let oracle = outbox_core::ProjectionName::new("oracle").unwrap();
    let dead = loop {
        let dead = rt
            .projection_states(Some(outbox_core::SinkStatus::Dead), 10)
            .await
            .unwrap();
        if !dead.is_empty() {
            break dead;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never dead-lettered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        (dead[0].stream.as_str(), dead[0].seq + 1, dead[0].attempt_count),
        ("bad", 2, 3),
        "dead for the projection on bad/2 after three attempts"
    );
    faults.clear();
    rt.requeue_projection(&oracle, &bad).await.unwrap();
    wait_drained(&rt, Duration::from_secs(30)).await;
    running.shutdown().await;
    let state = read_state(rt.store(), "oracle").await.expect("oracle state");
    let want = BTreeMap::from([
        ("bad".to_string(), Expected { through: 3, sum: 6 }),
        ("good".to_string(), Expected { through: 2, sum: 10 }),
    ]);
    check_history(&state, &want, &BTreeMap::new()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_repair_and_the_worker_finish_what_a_crash_left_on_sqlite() {
    let f = files();
    let (p, _) = oracle();
    {
        // A process appended (with and without outbox rows) and died before applying.
        let journal = SqliteJournal::open(&f.journal, SqliteOptions::default())
            .await
            .unwrap();
        let req = |s: &str| AppendRequest::new(sid(s), ExpectedVersion::NoStream, vec![add(2), add(2)]);
        journal
            .append(&[req("queued")], AppendOptions::enqueue())
            .await
            .unwrap();
        journal
            .append(&[req("unqueued")], AppendOptions::journal_only())
            .await
            .unwrap();
        journal.close().await;
    }
    let rt = open(
        &f,
        Config::apply_worker().with_poll_interval(Duration::from_millis(10)),
        &p,
    )
    .await;
    let running = rt.start().await.unwrap();
    let repair = running.repair_report().unwrap().clone();
    // Start-up repair applies nothing: `queued` has its rows, `unqueued`
    // gets a catch-up row at its last event, and the worker applies both
    // under the outbox's protocol (ADR 0029).
    assert_eq!(
        (
            repair.handed_to_worker,
            repair.streams_repaired,
            repair.events_applied
        ),
        (2, 0, 0),
        "{repair:?}"
    );
    wait_drained(&rt, Duration::from_secs(30)).await;
    running.shutdown().await;
    let state = read_state(rt.store(), "oracle").await.expect("oracle state");
    let want = BTreeMap::from([
        ("queued".to_string(), Expected { through: 2, sum: 4 }),
        ("unqueued".to_string(), Expected { through: 2, sum: 4 }),
    ]);
    check_history(&state, &want, &BTreeMap::new()).unwrap();
}

/// A worker learns of an append made through another connection to the
/// journal file (as another process would make it) from the journal's wake
/// source, not from its poll: the poll interval is an hour, so without the
/// wake-up the row would stay pending for the whole test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_wakes_on_another_connections_append_without_polling() {
    let f = files();
    let (p, _) = oracle();
    let journal = SqliteJournal::open(&f.journal, SqliteOptions::default())
        .await
        .unwrap();
    let store = SqliteProjectionStore::open(&f.projections, SqliteOptions::default())
        .await
        .unwrap();
    let rt: Rt = Outbox::builder(journal.clone(), store)
        .config(
            Config::apply_worker()
                .with_poll_interval(Duration::from_secs(3600))
                .with_repair_on_start(false),
        )
        .event_types(oracle_registry())
        .projection(p.clone())
        .wake_source(journal.wake_source())
        .build()
        .await
        .unwrap();
    let running = rt.start().await.unwrap();
    // The other "process": its own connections to the same file.
    let other = SqliteJournal::open(&f.journal, SqliteOptions::default())
        .await
        .unwrap();
    let s = sid("woken");
    for n in 0..3u64 {
        other
            .append(
                &[AppendRequest::new(
                    s.clone(),
                    ExpectedVersion::Exact(n),
                    vec![add(2)],
                )],
                AppendOptions::enqueue(),
            )
            .await
            .unwrap();
        // A liveness guard only: a missed wake-up waits an hour.
        wait_drained(&rt, Duration::from_secs(60)).await;
    }
    running.shutdown().await;
    let state = read_state(rt.store(), "oracle").await.expect("oracle state");
    let want = BTreeMap::from([("woken".to_string(), Expected { through: 3, sum: 6 })]);
    check_history(&state, &want, &BTreeMap::new()).unwrap();
}

/// Issue 16: `start()` rides out a journal that another process holds
/// locked for longer than the busy timeout (the first heartbeat is a write
/// that meets `SQLITE_BUSY`, a temporary error), and starts once the lock is
/// released. Nothing here depends on timing: `start()` cannot finish while
/// the lock is held, and the liveness bound after release is generous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_rides_out_a_journal_locked_past_the_busy_timeout() {
    let f = files();
    let (p, _) = oracle();
    let opts = SqliteOptions::default().with_busy_timeout(Duration::from_millis(50));
    let journal = SqliteJournal::open(&f.journal, opts.clone()).await.unwrap();
    let store = SqliteProjectionStore::open(&f.projections, opts).await.unwrap();
    let rt = Outbox::builder(journal, store)
        .config(
            Config::apply_worker()
                .with_poll_interval(Duration::from_millis(10))
                .with_start_retry(Duration::from_secs(120)),
        )
        .event_types(oracle_registry())
        .projection(p.clone())
        .build()
        .await
        .unwrap();
    rt.journal()
        .append(
            &[AppendRequest::new(
                sid("locked"),
                ExpectedVersion::NoStream,
                vec![add(1), add(2), add(3)],
            )],
            AppendOptions::enqueue(),
        )
        .await
        .unwrap();
    // "Another process": a connection of its own holding the write lock.
    let other = outbox_sqlite::rusqlite::Connection::open(&f.journal).unwrap();
    other.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let starting = tokio::spawn({
        let rt = rt.clone();
        async move { rt.start().await }
    });
    // Several busy timeouts pass: start() is still waiting, not failed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !starting.is_finished(),
        "start() must wait for the lock, not fail"
    );
    other.execute_batch("COMMIT").unwrap();
    drop(other);
    let running = tokio::time::timeout(Duration::from_secs(120), starting)
        .await
        .expect("start() finishes once the lock is released")
        .unwrap()
        .expect("start() rides out the lock");
    assert!(running.tasks().apply_worker);
    wait_drained(&rt, Duration::from_secs(120)).await;
    running.shutdown().await;
    let state = read_state(rt.store(), "oracle").await.expect("oracle state");
    let want = BTreeMap::from([("locked".to_string(), Expected { through: 3, sum: 6 })]);
    check_history(&state, &want, &BTreeMap::new()).unwrap();
}

/// With no budget, the same lock fails `start()` at once with one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_with_no_retry_budget_fails_fast_with_one_line() {
    let f = files();
    let (p, _) = oracle();
    let opts = SqliteOptions::default().with_busy_timeout(Duration::from_millis(50));
    let journal = SqliteJournal::open(&f.journal, opts.clone()).await.unwrap();
    let store = SqliteProjectionStore::open(&f.projections, opts).await.unwrap();
    let rt = Outbox::builder(journal, store)
        .config(Config::apply_worker().with_start_retry(Duration::ZERO))
        .event_types(oracle_registry())
        .projection(p.clone())
        .build()
        .await
        .unwrap();
    let other = outbox_sqlite::rusqlite::Connection::open(&f.journal).unwrap();
    other.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let err = match rt.start().await {
        Ok(_) => panic!("start() succeeded under a held lock"),
        Err(e) => e,
    };
    let msg = err.to_string();
    assert!(err.is_temporary() && !msg.contains('\n'), "{msg}");
    assert!(
        msg.contains("1 attempt(s)") && msg.contains("OUTBOX_START_RETRY_MS"),
        "{msg}"
    );
    other.execute_batch("ROLLBACK").unwrap();
}

/// A sweep whose claim read every run but one (an event that no longer
/// decodes) applies the others together and leaves the broken stream to
/// its own pass, which records the fault on it: nothing else is held up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_applies_the_runs_its_claim_read_and_sends_an_undecodable_one_alone() {
    let f = files();
    let (p, _faults) = oracle();
    let rt = open(&f, Config::apply_worker(), &p).await;
    let (bad, good) = (sid("bad"), sid("good"));
    rt.append(&bad, ExpectedVersion::NoStream, vec![add(1), add(2)])
        .await
        .unwrap();
    rt.append(&good, ExpectedVersion::NoStream, vec![add(5), add(5)])
        .await
        .unwrap();
    rt.journal()
        .transaction(|tx| {
            tx.conn()
                .execute(
                    "UPDATE events SET payload_hash = x'00' WHERE stream = 'bad' AND seq = 2",
                    [],
                )
                .expect("damage the hash");
            Ok::<(), outbox_core::Error>(())
        })
        .await
        .unwrap();
    let report = rt.tick().await.unwrap();
    assert_eq!(
        (report.completed, report.failed),
        (2, 1),
        "good's run applied, the fault recorded on bad: {report:?}"
    );
    for n in 1..=2 {
        let row = rt.journal().row(&good, Seq::new(n).unwrap()).await.unwrap();
        assert_eq!(row, None, "good/{n} is completed");
    }
    let head = rt
        .journal()
        .row(&bad, Seq::FIRST)
        .await
        .unwrap()
        .expect("bad/1 stays");
    assert_eq!(head.status, OutboxStatus::Failed);
    assert!(
        head.last_error
            .as_deref()
            .is_some_and(|e| e.contains("corrupt event bad/2")),
        "the failure names the event: {head:?}"
    );
    let state = read_state(rt.store(), "oracle").await.expect("oracle state");
    let want = BTreeMap::from([("good".to_string(), Expected { through: 2, sum: 10 })]);
    check_history(&state, &want, &BTreeMap::new()).unwrap();
}

/// A projection that waits for its gate to open before every apply.
struct Gated {
    inner: Arc<dyn Projection<SqliteTx>>,
    open: tokio::sync::watch::Receiver<bool>,
}

#[outbox_core::async_trait]
impl Projection<SqliteTx> for Gated {
    fn name(&self) -> &outbox_core::ProjectionName {
        self.inner.name()
    }
    async fn apply(&self, tx: &mut SqliteTx, e: &outbox_core::Event) -> Result<(), outbox_core::BoxError> {
        let mut open = self.open.clone();
        let _ = open.wait_for(|o| *o).await;
        self.inner.apply(tx, e).await
    }
    async fn reset(&self, tx: &mut SqliteTx) -> Result<(), outbox_core::BoxError> {
        self.inner.reset(tx).await
    }
    async fn digest(
        &self,
        tx: &mut SqliteTx,
        out: &mut outbox_core::DigestBuilder,
    ) -> Result<(), outbox_core::BoxError> {
        self.inner.digest(tx, out).await
    }
}

/// `streams` streams of `events` enqueued events each (value 1), appended
/// through a journal of their own, as another process would.
async fn enqueue_backlog(f: &Files, streams: usize, events: u64) -> Vec<StreamId> {
    let journal = SqliteJournal::open(&f.journal, SqliteOptions::default())
        .await
        .unwrap();
    let ids: Vec<StreamId> = (0..streams).map(|i| sid(&format!("s{i:03}"))).collect();
    for chunk in ids.chunks(20) {
        let reqs: Vec<AppendRequest> = chunk
            .iter()
            .map(|s| {
                AppendRequest::new(
                    s.clone(),
                    ExpectedVersion::NoStream,
                    vec![add(1); events as usize],
                )
            })
            .collect();
        journal.append(&reqs, AppendOptions::enqueue()).await.unwrap();
    }
    journal.close().await;
    ids
}

/// Issue 43 point 4 on SQLite: two runtimes on one journal file, the first
/// held inside its first sweep by a gate (so nothing depends on speed). The
/// second holds its share as soon as its `start` returns, and each applies
/// a share of a 20,000-event drain, every event once and in stream order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runtimes_on_one_journal_file_each_apply_a_share_of_the_drain() {
    use outbox_core::{Partition, WorkerId};
    let f = files();
    let (p, _) = oracle();
    let ids = enqueue_backlog(&f, 200, 100).await;
    let config = |id: &str| {
        Config::apply_worker()
            .with_poll_interval(Duration::from_millis(10))
            .with_repair_on_start(false)
            .with_worker_id(WorkerId::new(id).unwrap())
    };
    let (gate, opens) = tokio::sync::watch::channel(false);
    let gated: Arc<dyn Projection<SqliteTx>> = Arc::new(Gated {
        inner: p.clone(),
        open: opens,
    });
    let first = open(&f, config("first"), &gated).await;
    let second = open(&f, config("second"), &p).await;
    let count = first.journal().partitioning().count();
    let a = first.start().await.unwrap();
    let all: Vec<Partition> = Partition::all(count).collect();
    assert_eq!(
        first.held_partitions(),
        all,
        "alone, the first holds every partition"
    );
    let b = second.start().await.unwrap();
    let share = outbox_core::assigned_to(
        second.worker_id(),
        &[first.worker_id().clone(), second.worker_id().clone()],
        count,
    );
    assert!(!share.is_empty());
    assert_eq!(
        second.held_partitions(),
        share,
        "the second holds its share when its start returns"
    );
    for s in first.journal().partitions().await.unwrap() {
        let owner = if share.contains(&s.partition) {
            &second
        } else {
            &first
        };
        assert_eq!(s.owner.as_ref(), Some(owner.worker_id()), "{s:?}");
    }
    gate.send(true).unwrap();
    wait_drained(&second, Duration::from_secs(300)).await;
    b.shutdown().await;
    a.shutdown().await;
    let (by_first, by_second) = (first.metrics().applied, second.metrics().applied);
    assert!(
        by_first > 0 && by_second > 0 && by_first + by_second == 20_000,
        "each applied a share: first {by_first}, second {by_second}"
    );
    let state = read_state(first.store(), "oracle").await.expect("oracle state");
    check_history(&state, &expected(&ids, 100, 1), &BTreeMap::new()).unwrap();
    assert_eq!(state.ledger.len(), 20_000, "each event applied once");
}

/// Issue 45 on SQLite: two workers started together on one journal file
/// run start-up repair once: the second leaves it to the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_repair_runs_once_for_two_workers_on_one_journal_file() {
    use outbox_core::WorkerId;
    let f = files();
    let (p, _) = oracle();
    let queued = enqueue_backlog(&f, 10, 3).await;
    let unqueued: Vec<StreamId> = (0..30).map(|i| sid(&format!("u{i:02}"))).collect();
    {
        let journal = SqliteJournal::open(&f.journal, SqliteOptions::default())
            .await
            .unwrap();
        let reqs: Vec<AppendRequest> = unqueued
            .iter()
            .map(|s| AppendRequest::new(s.clone(), ExpectedVersion::NoStream, vec![add(2), add(2)]))
            .collect();
        journal
            .append(&reqs, AppendOptions::journal_only())
            .await
            .unwrap();
        journal.close().await;
    }
    let config = |id: &str| {
        Config::apply_worker()
            .with_poll_interval(Duration::from_millis(10))
            .with_worker_id(WorkerId::new(id).unwrap())
    };
    let first = open(&f, config("first"), &p).await;
    let second = open(&f, config("second"), &p).await;
    let a = first.start().await.unwrap();
    let b = second.start().await.unwrap();
    let (ra, rb) = (
        a.repair_report().expect("repair ran").clone(),
        b.repair_report().expect("repair ran").clone(),
    );
    assert_eq!((ra.streams_scanned, ra.handed_to_worker), (40, 40), "{ra:?}");
    assert_eq!((rb.streams_scanned, rb.handed_to_worker), (0, 0), "{rb:?}");
    assert_eq!(rb.left_to.as_ref(), Some(first.worker_id()));
    wait_drained(&first, Duration::from_secs(120)).await;
    b.shutdown().await;
    a.shutdown().await;
    let mut want = expected(&queued, 3, 1);
    want.extend(expected(&unqueued, 2, 2));
    let state = read_state(first.store(), "oracle").await.expect("oracle state");
    check_history(&state, &want, &BTreeMap::new()).unwrap();
    assert_eq!(state.ledger.len(), 30 + 60, "each event applied once");
}
