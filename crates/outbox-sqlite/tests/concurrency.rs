//! Contention: four workers, each with its OWN store instances (own writer
//! connection, as separate processes would have), drain 200 streams on the
//! same two files while an appender keeps appending. Zero double claims,
//! zero errors surfaced (no SQLITE_BUSY), every event applied exactly once.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::test_options;
use outbox_core::{
    AppendOptions, AppendRequest, ApplyOutcome, EventJournal, ExpectedVersion, LeaseStore, OutboxInspector,
    OutboxQueue, Projection, ProjectionStore, WorkerId,
};
use outbox_sqlite::SqliteTx;
use outbox_sqlite::{SqliteJournal, SqliteProjectionStore};
use outbox_testkit::{Expected, OracleProjection, Seed, add, check_history, read_state, stream_ids};

const STREAMS: usize = 200;
const EVENTS_PER_STREAM: u64 = 25;
const WORKERS: usize = 4;

type Claims = Arc<Mutex<HashMap<(String, u64), usize>>>;

async fn worker(
    id: usize,
    journal: SqliteJournal,
    store: SqliteProjectionStore,
    projections: Vec<Arc<dyn Projection<SqliteTx>>>,
    claims: Claims,
    appending_done: Arc<std::sync::atomic::AtomicBool>,
    deadline: Instant,
) -> Result<u64, String> {
    let owner = WorkerId::new(format!("worker-{id}")).unwrap();
    let mut completed = 0;
    loop {
        if Instant::now() > deadline {
            return Err(format!("worker {id}: deadline passed"));
        }
        let due = journal
            .due_streams(16)
            .await
            .map_err(|e| format!("due_streams: {e}"))?;
        if due.is_empty() {
            let done = appending_done.load(std::sync::atomic::Ordering::Acquire);
            let total = journal
                .summary()
                .await
                .map_err(|e| format!("summary: {e}"))?
                .total();
            if done && total == 0 {
                return Ok(completed);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        for stream in due {
            let Some(lease) = journal
                .acquire(&stream, &owner, Duration::from_secs(30))
                .await
                .map_err(|e| format!("acquire: {e}"))?
            else {
                continue;
            };
            let rows = journal
                .claim(&lease, 8)
                .await
                .map_err(|e| format!("claim: {e}"))?;
            {
                let mut c = claims.lock().unwrap();
                for r in &rows {
                    *c.entry((r.stream.to_string(), r.seq.get())).or_default() += 1;
                }
            }
            if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
                let events = journal
                    .read_stream(&stream, first.seq, rows.len())
                    .await
                    .map_err(|e| format!("read_stream: {e}"))?;
                match store.apply(&stream, &events, &projections).await {
                    Ok(ApplyOutcome::Applied(_)) => {}
                    Ok(ApplyOutcome::Gap(g)) => return Err(format!("unexpected gap {g:?}")),
                    Err(e) => return Err(format!("apply: {e}")),
                }
                completed += journal
                    .complete(&stream, last.seq)
                    .await
                    .map_err(|e| format!("complete: {e}"))?;
            }
            journal
                .release(&lease)
                .await
                .map_err(|e| format!("release: {e}"))?;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_drain_200_streams_without_busy_or_double_claims() {
    let seed = Seed::pick("sqlite concurrency");
    let mut rng = seed.rng();
    let dir = tempfile::tempdir().unwrap();
    let jpath = dir.path().join("journal.db");
    let ppath = dir.path().join("projections.db");
    let streams = stream_ids("c", STREAMS);

    // Every instance opens the fresh files concurrently: the open path
    // (WAL switch, migrations) is contended too.
    let opens = (0..=WORKERS).map(|_| {
        let (j, p) = (jpath.clone(), ppath.clone());
        tokio::spawn(async move {
            let journal = SqliteJournal::open(&j, test_options())
                .await
                .expect("open journal");
            let store = SqliteProjectionStore::open(&p, test_options())
                .await
                .expect("open projections");
            (journal, store)
        })
    });
    let mut instances = Vec::new();
    for o in opens {
        instances.push(o.await.unwrap());
    }
    let oracle: Arc<dyn Projection<SqliteTx>> = OracleProjection::new("oracle").shared();
    instances[0].1.setup(std::slice::from_ref(&oracle)).await.unwrap();

    // Values appended, per stream.
    let mut values: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut plan = Vec::new();
    for round in 0..EVENTS_PER_STREAM {
        for s in &streams {
            let v = (rng.below(1000) as i64) - 500;
            values.entry(s.to_string()).or_default().push(v);
            plan.push(AppendRequest::new(
                s.clone(),
                ExpectedVersion::Exact(round),
                vec![add(v)],
            ));
        }
    }

    let claims: Claims = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(30);
    let (appender, _) = instances.pop().unwrap();
    let mut tasks = Vec::new();
    for (id, (journal, store)) in instances.into_iter().enumerate() {
        tasks.push(tokio::spawn(worker(
            id,
            journal,
            store,
            vec![oracle.clone()],
            claims.clone(),
            done.clone(),
            deadline,
        )));
    }
    // Group commit: 10 streams per append transaction, racing the workers.
    let started = Instant::now();
    for batch in plan.chunks(10) {
        appender
            .append(batch, AppendOptions::enqueue())
            .await
            .expect("append never fails under contention");
    }
    done.store(true, std::sync::atomic::Ordering::Release);

    let mut completed = 0;
    let mut errors = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(n) => completed += n,
            Err(e) => errors.push(e),
        }
    }
    let elapsed = started.elapsed();
    assert!(errors.is_empty(), "errors surfaced to callers: {errors:?}");
    let total = STREAMS as u64 * EVENTS_PER_STREAM;
    assert_eq!(completed, total, "every row completed once");
    let doubles: Vec<_> = claims
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, n)| (k.clone(), *n))
        .collect();
    assert!(doubles.is_empty(), "double claims: {doubles:?}");
    assert_eq!(claims.lock().unwrap().len() as u64, total);

    let expected: BTreeMap<String, Expected> = values
        .iter()
        .map(|(s, v)| {
            (
                s.clone(),
                Expected {
                    through: EVENTS_PER_STREAM,
                    sum: v.iter().sum(),
                },
            )
        })
        .collect();
    let (_, store) = (
        appender.clone(),
        SqliteProjectionStore::open(&ppath, test_options()).await.unwrap(),
    );
    let state = read_state(&store, "oracle").await.expect("oracle state");
    check_history(&state, &expected, &BTreeMap::new()).unwrap_or_else(|e| panic!("{seed:?}: {e}"));
    assert_eq!(appender.summary().await.unwrap().total(), 0);
    eprintln!("drained {total} events on {WORKERS} instances in {elapsed:?}");
}
