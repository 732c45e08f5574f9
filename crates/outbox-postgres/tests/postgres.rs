//! Postgres-specific behaviour beyond the conformance suite: a connection
//! killed inside an apply, query plans on a large outbox, LISTEN/NOTIFY,
//! schema checks and secrets.

mod common;

use outbox_core::OutboxQueueExt as _;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{DropSchemas, journal, options, projections, test_database_url, unique_schema};
use outbox_core::{
    AppendOptions, AppendRequest, ApplyOutcome, BoxError, DigestBuilder, Error, Event, EventJournal,
    ExpectedVersion, LeaseStore, OutboxQueue, Partition, PartitionStore, Projection, ProjectionName,
    ProjectionStore, StreamEnd, SweepLimits, WakeSource, WatermarkStore, WorkerId,
};
use outbox_postgres::sqlx::postgres::PgListener;
use outbox_postgres::sqlx::{self, PgPool};
use outbox_postgres::{PgJournal, PgOptions, PgProjectionStore, PgTx, statements};
use outbox_testkit::{Expected, OracleProjection, add, check_history, read_state, sid};
use tokio::sync::Notify;

fn request(stream: &str, values: &[i64]) -> AppendRequest {
    AppendRequest::new(
        sid(stream),
        ExpectedVersion::Any,
        values.iter().map(|v| add(*v)).collect(),
    )
}

/// The id of the transaction open on `tx` (assigned now).
async fn xact_id(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>) -> String {
    sqlx::query_scalar("SELECT pg_current_xact_id()::text")
        .fetch_one(&mut **tx)
        .await
        .unwrap()
}

/// Whether a session waits for transaction `xid` (a lock it holds).
async fn waited_for(pool: &PgPool, xid: &str) -> bool {
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid' \
         AND transactionid::text = $1",
    )
    .bind(xid)
    .fetch_one(pool)
    .await
    .unwrap();
    waiting > 0
}

async fn admin_pool(url: &str) -> PgPool {
    PgPool::connect(url).await.expect("admin pool")
}

/// An oracle projection that, after writing inside the apply transaction,
/// reports its backend pid and blocks until released.
struct Blocking {
    inner: Arc<dyn Projection<PgTx>>,
    pid: Arc<Mutex<Option<i32>>>,
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

#[outbox_core::async_trait]
impl Projection<PgTx> for Blocking {
    fn name(&self) -> &ProjectionName {
        self.inner.name()
    }
    async fn setup(&self, tx: &mut PgTx) -> Result<(), BoxError> {
        self.inner.setup(tx).await
    }
    async fn apply(&self, tx: &mut PgTx, event: &Event) -> Result<(), BoxError> {
        self.inner.apply(tx, event).await?;
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut **tx)
            .await?;
        *self.pid.lock().unwrap() = Some(pid);
        self.entered.notify_one();
        self.release.notified().await;
        Ok(())
    }
    async fn reset(&self, tx: &mut PgTx) -> Result<(), BoxError> {
        self.inner.reset(tx).await
    }
    async fn digest(&self, tx: &mut PgTx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        self.inner.digest(tx, out).await
    }
}

/// A backend terminated (`pg_terminate_backend`) while its apply transaction
/// is open ends that apply in a temporary error with nothing committed; the
/// retry applies every event exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_connection_during_apply_is_temporary_then_retry_applies_once() {
    let Some(url) = test_database_url() else { return };
    let (js, ps) = (unique_schema("kj"), unique_schema("kp"));
    let _drop = DropSchemas::new(&url, [js.clone(), ps.clone()]);
    let j = journal(&url, &js).await;
    let store = projections(&url, &ps).await;
    let oracle = OracleProjection::new("p").shared();
    store.setup(std::slice::from_ref(&oracle)).await.expect("setup");
    j.append(&[request("s", &[1, 2, 3])], AppendOptions::enqueue())
        .await
        .expect("append");
    let events = j
        .read_stream(&sid("s"), outbox_core::Seq::FIRST, 10)
        .await
        .expect("read");

    let blocking = Blocking {
        inner: oracle.clone(),
        pid: Arc::default(),
        entered: Arc::new(Notify::new()),
        release: Arc::new(Notify::new()),
    };
    let (pid, entered, release) = (
        blocking.pid.clone(),
        blocking.entered.clone(),
        blocking.release.clone(),
    );
    let blocking: Arc<dyn Projection<PgTx>> = Arc::new(blocking);
    let task = {
        let (store, events) = (store.clone(), events.clone());
        tokio::spawn(async move { store.apply(&sid("s"), &events[..1], &[blocking]).await })
    };
    tokio::time::timeout(Duration::from_secs(10), entered.notified())
        .await
        .expect("the applier entered the transaction");
    let victim = pid.lock().unwrap().expect("pid recorded");
    let admin = admin_pool(&url).await;
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(victim)
        .fetch_one(&admin)
        .await
        .expect("terminate");
    assert!(killed, "the applier's backend was terminated");
    release.notify_one();
    let r = task.await.expect("apply task");
    match &r {
        Err(e) => assert!(
            e.is_temporary(),
            "a dropped connection is a temporary error, got {e:?}"
        ),
        Ok(o) => panic!("an apply on a terminated connection cannot commit, got {o:?}"),
    }
    assert!(
        matches!(&r, Err(Error::Storage { .. })),
        "a storage error, not an applier error: {r:?}"
    );
    assert_eq!(
        store.checkpoint(oracle.name(), &sid("s")).await.unwrap(),
        0,
        "nothing committed"
    );

    // The retry (the pool replaces the dead connection) applies once.
    let mut attempts = 0;
    let report = loop {
        attempts += 1;
        match store
            .apply(&sid("s"), &events, std::slice::from_ref(&oracle))
            .await
        {
            Ok(ApplyOutcome::Applied(r)) => break r,
            Err(e) if e.is_temporary() && attempts < 5 => continue,
            other => panic!("retry after the dropped connection: {other:?}"),
        }
    };
    assert_eq!((report.applied, report.duplicates), (3, 0));
    let state = read_state(&store, "p").await.expect("oracle");
    let want = BTreeMap::from([("s".to_owned(), Expected { through: 3, sum: 6 })]);
    check_history(&state, &want, &BTreeMap::new()).unwrap_or_else(|p| panic!("history:\n{p}"));
}

async fn explain(
    pool: &PgPool,
    sql: &str,
    binds: impl FnOnce(
        sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> String {
    let mut tx = pool.begin().await.expect("begin");
    // Plan as the server would for the prepared statement with these values.
    let q = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")));
    let rows: Vec<(String,)> = {
        use sqlx::Row;
        binds(q)
            .fetch_all(&mut *tx)
            .await
            .expect("explain")
            .into_iter()
            .map(|r| (r.get::<String, _>(0),))
            .collect()
    };
    tx.rollback().await.expect("rollback");
    rows.into_iter().map(|(l,)| l).collect::<Vec<_>>().join("\n")
}

/// Prepares `sql` as `name` in `tx`, under the plan cache mode that plans
/// it once, generically, at its first execution (as the pool's sessions
/// do with `PgOptions::generic_plans`).
async fn prepare_generic(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, name: &str, sql: &str) {
    sqlx::query("SET LOCAL plan_cache_mode = force_generic_plan")
        .execute(&mut **tx)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("PREPARE {name} AS {sql}")))
        .execute(&mut **tx)
        .await
        .expect("prepare");
}

/// A sweep's ends in one statement (`COMPLETE_ALL`) seek the rows of their
/// streams under the plan a prepared statement settles on (a
/// generic one, which knows neither how many ends nor which), on an
/// outbox of the bench's shape: 100 streams of 100 rows. A join with the
/// array of ends planned as a hash join scanned the whole outbox per end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_ends_seek_their_streams_under_a_generic_plan() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("ends");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let j = journal(&url, &s).await;
    let pool = j.pool();
    for sql in [
        "INSERT INTO outbox (stream, seq, event_type, status, attempt_count, next_attempt_at, updated_at) \
         SELECT 's' || st, q, 'oracle.add', 'pending', 0, 0, 0 \
         FROM generate_series(1, 100) st, generate_series(1, 100) q",
        "INSERT INTO outbox_heads (stream, head_seq, due_at) SELECT 's' || st, 1, 0 FROM generate_series(1, 100) st",
        "INSERT INTO streams (stream, head) SELECT 's' || st, 100 FROM generate_series(1, 100) st",
        "ANALYZE outbox",
        "ANALYZE outbox_heads",
    ] {
        sqlx::query(sql).execute(pool).await.expect("fill");
    }
    let mut tx = pool.begin().await.unwrap();
    prepare_generic(&mut tx, "ends", statements::COMPLETE_ALL).await;
    let plan: Vec<String> =
        sqlx::query_scalar("EXPLAIN EXECUTE ends (ARRAY['s5']::text[], ARRAY[3]::bigint[])")
            .fetch_all(&mut *tx)
            .await
            .expect("explain");
    let plan = plan.join("\n");
    tx.rollback().await.unwrap();
    println!("{plan}");
    // (`outbox_heads` has a row per stream with rows, 100 here: a scan of
    // it is the planner's fair choice at that size.)
    assert!(
        !plan.contains("Seq Scan on outbox "),
        "a sweep's ends scan the outbox:\n{plan}"
    );
    assert!(
        plan.contains("Index Scan using outbox_pkey on outbox o"),
        "a sweep's ends seek each stream's range:\n{plan}"
    );
}

/// `due_streams`, `claim`, `complete`, `abandon`, the append and the
/// partitioned claim seek indexes on a large outbox: no sequential scan of `outbox` (or of
/// `outbox_heads`) in their plans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_statements_use_indexes_on_a_large_outbox() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("plan");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let j = journal(&url, &s).await;
    let pool = j.pool();
    // 20,000 streams x 10 rows, most of them not due yet, built in SQL.
    sqlx::query(
        "INSERT INTO outbox (stream, seq, event_type, status, attempt_count, next_attempt_at, updated_at) \
         SELECT 's' || st, q, 'oracle.add', 'pending', 0, 4000000000000 + st, 0 \
         FROM generate_series(1, 20000) st, generate_series(1, 10) q",
    )
    .execute(pool)
    .await
    .expect("fill outbox");
    sqlx::query(
        "INSERT INTO outbox_heads (stream, head_seq, due_at) \
         SELECT 's' || st, 1, CASE WHEN st % 1000 = 0 THEN 0 ELSE 4000000000000 + st END \
         FROM generate_series(1, 20000) st",
    )
    .execute(pool)
    .await
    .expect("fill heads");
    sqlx::query("INSERT INTO streams (stream, head) SELECT 's' || st, 10 FROM generate_series(1, 20000) st")
        .execute(pool)
        .await
        .expect("fill streams");
    for t in ["outbox", "outbox_heads", "stream_leases", "streams"] {
        sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE {t}")))
            .execute(pool)
            .await
            .expect("analyze");
    }

    let due = explain(pool, statements::DUE_STREAMS, |q| q.bind(64i64)).await;
    let claim = explain(pool, statements::CLAIM, |q| {
        q.bind("s500").bind(64i64).bind("x").bind(true)
    })
    .await;
    let complete = explain(pool, statements::COMPLETE, |q| q.bind("s500").bind(3i64)).await;
    let abandon = explain(pool, statements::ABANDON, |q| q.bind("s500")).await;
    for (what, plan) in [
        ("due_streams", &due),
        ("claim", &claim),
        ("complete", &complete),
        ("abandon", &abandon),
    ] {
        println!("{what}:\n{plan}\n");
        assert!(
            !plan.contains("Seq Scan on outbox"),
            "{what} scans a table:\n{plan}"
        );
        assert!(plan.contains("Index"), "{what} uses no index:\n{plan}");
    }
    assert!(
        due.contains("outbox_heads_by_due"),
        "due_streams walks the due index:\n{due}"
    );

    // The append (one statement) of an event to one of those streams:
    // its version row and its head are found by their keys.
    let append = explain(pool, statements::APPEND, |q| {
        q.bind(vec!["s500"])
            .bind(vec![1i64])
            .bind(vec!["oracle.add"])
            .bind(vec!["apply"])
            .bind(vec![b"1".to_vec()])
            .bind(vec![vec![0u8; 32]])
            .bind(vec![None::<&str>])
            .bind(vec![None::<&str>])
            .bind(vec![1i32])
            .bind(vec!["s500"])
            .bind(vec![1i64])
            .bind(vec![None::<i64>])
            .bind(vec![0i32])
            .bind(true)
            .bind(None::<&str>)
            .bind(i64::MAX)
    })
    .await;
    println!("append:\n{append}\n");
    for table in ["outbox ", "outbox_heads ", "streams ", "events "] {
        assert!(
            !append.contains(&format!("Seq Scan on {table}")),
            "the append scans {table}:\n{append}"
        );
    }

    // The partitioned claim (one statement) on the same data, with every
    // head in partition 0 and that partition held: a range of the
    // due index and primary-key seeks, no scan of either table.
    sqlx::query("INSERT INTO outbox_partition_leases (partition_no, owner, epoch, expires_at) VALUES (0, 'w', 1, 9000000000000)")
        .execute(pool)
        .await
        .expect("hold partition 0");
    // Both forms: the claim alone, and the claim with its rows' events.
    let mut plans = Vec::new();
    for (what, sql) in [
        ("claim_partitioned", statements::CLAIM_PARTITIONED),
        (
            "claim_and_load_partitioned",
            statements::CLAIM_AND_LOAD_PARTITIONED,
        ),
    ] {
        let plan = explain(pool, sql, |q| {
            q.bind("w")
                .bind(15_000i64)
                .bind(64i64)
                .bind(64i64)
                .bind(512i64)
                .bind("x")
                .bind(true)
        })
        .await;
        plans.push((what, plan));
    }
    sqlx::query("DELETE FROM outbox_partition_leases")
        .execute(pool)
        .await
        .expect("free partition 0");
    for (what, plan) in &plans {
        println!("{what}:\n{plan}\n");
        for table in ["outbox ", "outbox_heads ", "streams ", "events "] {
            assert!(
                !plan.contains(&format!("Seq Scan on {table}")),
                "{what} scans {table}:\n{plan}"
            );
        }
        assert!(
            plan.contains("Index Scan using outbox_heads_by_") && plan.contains("outbox_pkey"),
            "{what} walks a due index and the rows' keys:\n{plan}"
        );
    }

    // And the results are right on that data: the 20 due streams, oldest first.
    let found = j.due_streams(100).await.expect("due_streams");
    assert_eq!(found.len(), 20);
    let lease = j
        .acquire(
            &sid("s1000"),
            &WorkerId::new("w").unwrap(),
            Duration::from_secs(30),
        )
        .await
        .unwrap()
        .unwrap();
    assert!(
        j.claim(&lease, 64).await.expect("claim").is_empty(),
        "rows of s1000 are not due"
    );
}

/// The partitioned claim's runs, on rows written in SQL so that every
/// kind of cut sits behind a due head in one claim: each stream's run ends
/// at the first hole, dead row, row not due yet, row in flight or row
/// applied alone; a head applied alone (`alone`, or found `processing`) is
/// a run of one, marked as ADR 0029 says; runs come in due order and the
/// row budget stops the claim at the stream it cannot reach. (The claim
/// cuts each run to a seq range per stream: this pins that down against
/// rows the range would hold but the run must not.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_claim_cuts_each_run_where_claim_would() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("cuts");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let j = journal(&url, &s).await;
    let pool = j.pool();
    // (stream, seq, status, due, alone); every head due, oldest first in
    // this order; `later` is a time far ahead of the journal clock.
    let later = 4_000_000_000_000i64;
    let rows: &[(&str, i64, &str, i64, i16)] = &[
        ("a-hole", 1, "pending", 0, 0),
        ("a-hole", 2, "pending", 0, 0),
        ("a-hole", 4, "pending", 0, 0),
        ("b-dead", 3, "pending", 0, 0),
        ("b-dead", 4, "dead", 0, 0),
        ("b-dead", 5, "pending", 0, 0),
        ("c-later", 1, "failed", 0, 0),
        ("c-later", 2, "pending", later, 0),
        ("d-flight", 1, "pending", 0, 0),
        ("d-flight", 2, "processing", 0, 0),
        ("e-alone", 1, "pending", 0, 0),
        ("e-alone", 2, "pending", 0, 1),
        ("f-alone-head", 1, "pending", 0, 1),
        ("f-alone-head", 2, "pending", 0, 0),
        ("g-unfinished", 1, "processing", 0, 2),
        ("g-unfinished", 2, "pending", 0, 0),
        ("h-whole", 1, "pending", 0, 0),
        ("h-whole", 2, "pending", 0, 0),
        ("h-whole", 3, "pending", 0, 0),
        ("i-beyond", 1, "pending", 0, 0),
    ];
    for &(stream, seq, status, due, alone) in rows {
        sqlx::query(
            "INSERT INTO outbox (stream, seq, event_type, status, attempt_count, next_attempt_at, \
             updated_at, alone) VALUES ($1, $2, 'oracle.add', $3, 0, $4, 0, $5)",
        )
        .bind(stream)
        .bind(seq)
        .bind(status)
        .bind(due)
        .bind(alone)
        .execute(pool)
        .await
        .expect("row");
    }
    sqlx::query(
        "INSERT INTO outbox_heads (stream, head_seq, due_at) \
         SELECT stream, min(seq), rank() OVER (ORDER BY stream) FROM outbox GROUP BY stream",
    )
    .execute(pool)
    .await
    .expect("heads");
    sqlx::query("INSERT INTO streams (stream, head) SELECT stream, max(seq) FROM outbox GROUP BY stream")
        .execute(pool)
        .await
        .expect("versions");
    sqlx::query(
        "INSERT INTO outbox_partition_leases (partition_no, owner, epoch, expires_at) \
         VALUES (0, 'w', 1, $1)",
    )
    .bind(later)
    .execute(pool)
    .await
    .expect("hold partition 0");

    // The streams' bounds (each one's version less its head, at most 4:
    // 4, 3, 2, 2, 2, 2, 2 and 3) add up to 20 before `i-beyond`: a budget
    // of 20 rows reads every stream but that one.
    let limits = SweepLimits {
        streams: 64,
        per_stream: 4,
        rows: 20,
    };
    let taken = j
        .claim_partitioned(&WorkerId::new("w").unwrap(), Duration::from_secs(30), limits)
        .await
        .expect("claim");
    let runs: Vec<(String, Vec<u64>)> = taken
        .iter()
        .map(|(lease, run)| {
            (
                lease.stream.as_str().to_owned(),
                run.iter().map(|r| r.seq.get()).collect(),
            )
        })
        .collect();
    let expected: Vec<(String, Vec<u64>)> = [
        ("a-hole", vec![1, 2]),
        ("b-dead", vec![3]),
        ("c-later", vec![1]),
        ("d-flight", vec![1]),
        ("e-alone", vec![1]),
        ("f-alone-head", vec![1]),
        ("g-unfinished", vec![1]),
        ("h-whole", vec![1, 2, 3]),
    ]
    .into_iter()
    .map(|(s, r)| (s.to_owned(), r))
    .collect();
    assert_eq!(runs, expected, "the runs, in due order");
    for (lease, run) in &taken {
        for row in run {
            assert_eq!(row.status, outbox_core::OutboxStatus::Processing, "{row:?}");
        }
        assert_eq!(lease.partition, Some(Partition::new(0)), "{lease:?}");
    }
    let row = |name: &str| {
        taken
            .iter()
            .find(|(l, _)| l.stream.as_str() == name)
            .map(|(_, run)| run[0].clone())
            .unwrap()
    };
    assert!(row("f-alone-head").alone && !row("f-alone-head").ended_unfinished());
    assert!(
        row("g-unfinished").ended_unfinished(),
        "{:?}",
        row("g-unfinished")
    );
    assert!(!row("a-hole").alone && row("a-hole").last_error.is_none());

    // Only the claimed rows changed: the rows behind each cut are as they were.
    let untouched: Vec<(String, i64, String, i16)> = sqlx::query_as(
        "SELECT stream, seq, status, alone FROM outbox \
         WHERE NOT (stream, seq) IN (SELECT * FROM unnest($1::text[], $2::bigint[])) ORDER BY stream, seq",
    )
    .bind(
        runs.iter()
            .flat_map(|(s, r)| r.iter().map(move |_| s.clone()))
            .collect::<Vec<_>>(),
    )
    .bind(
        runs.iter()
            .flat_map(|(_, r)| r.iter().map(|&q| q as i64))
            .collect::<Vec<_>>(),
    )
    .fetch_all(pool)
    .await
    .expect("rows");
    let left: Vec<(&str, i64, &str, i16)> = untouched
        .iter()
        .map(|(s, q, st, a)| (s.as_str(), *q, st.as_str(), *a))
        .collect();
    assert_eq!(
        left,
        [
            ("a-hole", 4, "pending", 0),
            ("b-dead", 4, "dead", 0),
            ("b-dead", 5, "pending", 0),
            ("c-later", 2, "pending", 0),
            ("d-flight", 2, "processing", 0),
            ("e-alone", 2, "pending", 1),
            ("f-alone-head", 2, "pending", 0),
            ("g-unfinished", 2, "pending", 0),
            ("i-beyond", 1, "pending", 0),
        ]
    );
}

/// A waiter on one journal instance is woken by an append through another
/// (its own pool), and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_a_waiter_after_an_append_from_another_pool() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("wake");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let listener_side = journal(&url, &s).await;
    let appender = journal(&url, &s).await;
    let wake = listener_side.wake_source();
    // The first wait connects and LISTENs, then resolves (appends may have
    // been missed before): callers re-check the store after it.
    tokio::time::timeout(Duration::from_secs(10), wake.wait())
        .await
        .expect("first wait connects");
    let waiting = {
        let wake = wake.clone();
        tokio::spawn(async move { wake.wait().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "nothing appended yet: the waiter waits");
    appender
        .append(&[request("s", &[1])], AppendOptions::enqueue())
        .await
        .expect("append");
    tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("woken by the append's notification")
        .expect("waiter task");

    // A journal-only append enqueues nothing and notifies nobody.
    let waiting = {
        let wake = wake.clone();
        tokio::spawn(async move { wake.wait().await })
    };
    appender
        .append(&[request("t", &[1])], AppendOptions::journal_only())
        .await
        .expect("append");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "a journal-only append does not wake workers"
    );
    appender
        .append(&[request("t", &[2])], AppendOptions::enqueue())
        .await
        .expect("append");
    tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("woken")
        .expect("waiter task");
}

/// One append transaction, whatever its size, sends one notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_append_transaction_emits_one_notification() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("once");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let j = journal(&url, &s).await;
    let mut listener = PgListener::connect(&url).await.expect("listener");
    listener.listen(j.channel()).await.expect("listen");
    let batch = vec![
        request("a", &[1, 2, 3]),
        request("b", &[4]),
        request("a", &[5, 6]),
    ];
    j.append(&batch, AppendOptions::enqueue()).await.expect("append");
    // append_in: two appends in the caller's transaction, one commit.
    let mut tx = j.begin().await.expect("begin");
    j.append_in(&mut tx, &[request("c", &[1])], AppendOptions::enqueue())
        .await
        .expect("append_in");
    j.append_in(&mut tx, &[request("d", &[1])], AppendOptions::enqueue())
        .await
        .expect("append_in");
    tx.commit().await.expect("commit");
    let mut got = 0;
    while let Ok(n) = tokio::time::timeout(Duration::from_millis(700), listener.recv()).await {
        n.expect("notification");
        got += 1;
    }
    assert_eq!(got, 2, "one notification per committed append transaction");

    let quiet = PgJournal::connect(&url, options(&s).with_notify(false))
        .await
        .expect("connect");
    quiet
        .append(&[request("e", &[1])], AppendOptions::enqueue())
        .await
        .expect("append");
    let none = tokio::time::timeout(Duration::from_millis(500), listener.recv()).await;
    assert!(none.is_err(), "with notify off nothing is sent");
}

/// The listener's connection terminated under it: the waiter resolves (a
/// spurious wake-up), the source reconnects, and a later append wakes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_source_reconnects_after_its_connection_is_terminated() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("recon");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let j = journal(&url, &s).await;
    let wake = j.wake_source();
    tokio::time::timeout(Duration::from_secs(10), wake.wait())
        .await
        .expect("connects");
    let waiting = {
        let wake = wake.clone();
        tokio::spawn(async move { wake.wait().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let admin = admin_pool(&url).await;
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'LISTEN \"' || $1 || '\"'",
    )
    .bind(j.channel())
    .fetch_all(&admin)
    .await
    .expect("terminate");
    assert_eq!(killed, [true], "the listener's backend was found and terminated");
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("a lost connection resolves the waiter")
        .expect("waiter task");
    // The next wait reconnects (and resolves: appends may have been missed).
    tokio::time::timeout(Duration::from_secs(6), wake.wait())
        .await
        .expect("wait resolves within a few seconds while reconnecting");
    // Connected again: a waiter now waits (retrying if the reconnection
    // needed another round) until an append wakes it.
    let mut waiting = None;
    for _ in 0..5 {
        let w = {
            let wake = wake.clone();
            tokio::spawn(async move { wake.wait().await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        if !w.is_finished() {
            waiting = Some(w);
            break;
        }
    }
    let waiting = waiting.expect("reconnected and waiting");
    j.append(&[request("s", &[1])], AppendOptions::enqueue())
        .await
        .expect("append");
    tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("woken after reconnecting")
        .expect("waiter task");
}

/// While the database cannot be reached, `wait` keeps resolving every few
/// seconds (polling stays the fallback) and never errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_source_resolves_while_the_database_is_unreachable() {
    let connect = sqlx::postgres::PgConnectOptions::new()
        .socket("/nonexistent-outbox-socket-dir")
        .username("nobody");
    let wake = outbox_postgres::PgWakeSource::new(connect, "x_wake".to_owned());
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(5), wake.wait())
            .await
            .expect("resolves while disconnected");
    }
    assert!(!wake.is_connected().await);
}

/// A schema migrated by a newer build is refused with `SchemaTooNew` and left
/// exactly as it was; so is a journal schema marked with another role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_schema_is_refused_unchanged() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("new");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let j = journal(&url, &s).await;
    sqlx::query(
        "INSERT INTO _outbox_journal_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', true, '\\x00', 0)",
    )
    .execute(j.pool())
    .await
    .expect("fake a newer migration");
    let tables = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let before = tables(j.pool().clone()).await;
    match PgJournal::connect(&url, options(&s)).await {
        Err(Error::SchemaTooNew { found, supported, .. }) => assert_eq!((found, supported), (9999, 12)),
        other => panic!("a newer schema is SchemaTooNew, got {other:?}"),
    }
    assert_eq!(tables(j.pool().clone()).await, before, "nothing created");
    // The projection role has its own tables and is unaffected...
    PgProjectionStore::connect(&url, options(&s))
        .await
        .expect("the projection role may share the schema");
    // ...but a forged role marker is refused.
    sqlx::query("UPDATE outbox_journal_meta SET value = 'projection' WHERE key = 'role'")
        .execute(j.pool())
        .await
        .unwrap();
    sqlx::query("DELETE FROM _outbox_journal_migrations WHERE version = 9999")
        .execute(j.pool())
        .await
        .unwrap();
    let r = PgJournal::connect(&url, options(&s)).await;
    assert!(
        matches!(r, Err(Error::InvalidInput(_))),
        "wrong role marker: {r:?}"
    );
}

/// Bad schema names are configuration errors; a URL's password never shows
/// up in an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_and_secrets() {
    let Some(url) = test_database_url() else { return };
    for bad in [
        "",
        "Outbox",
        "a-b",
        "x; DROP TABLE y",
        "pg_catalog",
        &"a".repeat(64),
    ] {
        let r = PgJournal::connect(&url, PgOptions::default().with_schema(bad)).await;
        assert!(matches!(r, Err(Error::Config(_))), "schema {bad:?}: {r:?}");
    }
    let secret = "s3cr3t-pw";
    for bad_url in [
        format!("postgres://user:{secret}@127.0.0.1:1/db"),
        format!("postgres://user:{secret}@[bad/db"),
        format!("mysql://user:{secret}@127.0.0.1/db"),
    ] {
        let r = PgJournal::connect(
            &bad_url,
            PgOptions::default().with_acquire_timeout(Duration::from_millis(500)),
        )
        .await;
        let e = r.expect_err("cannot connect");
        let shown = format!("{e} {e:?}");
        assert!(!shown.contains(secret), "the password leaked: {shown}");
    }
}

/// An applier that writes nothing still works through the same pool the
/// journal uses when both share one schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharing_store_uses_the_journal_schema() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("share");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let j = journal(&url, &s).await;
    let p = PgProjectionStore::sharing(&j).await.expect("sharing");
    assert_eq!(p.schema(), j.schema());
    let oracle = OracleProjection::new("p").shared();
    p.setup(std::slice::from_ref(&oracle)).await.unwrap();
    j.append(&[request("s", &[5])], AppendOptions::enqueue())
        .await
        .unwrap();
    let events = j
        .read_stream(&sid("s"), outbox_core::Seq::FIRST, 10)
        .await
        .unwrap();
    p.apply(&sid("s"), &events, std::slice::from_ref(&oracle))
        .await
        .unwrap();
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_views WHERE projection = 'p' AND tbl = 'ledger'")
            .fetch_one(j.pool())
            .await
            .unwrap();
    assert_eq!(n, 1, "the projection's documents are in the shared schema");
}

/// The pool's connections plan each statement once (generic plans) unless
/// the options say otherwise, and keep the schema as their search path
/// either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_use_generic_plans_unless_turned_off() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("plans");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    for (generic, want) in [(true, "force_generic_plan"), (false, "auto")] {
        let j = PgJournal::connect(&url, options(&s).with_generic_plans(generic))
            .await
            .expect("connect journal");
        let mode: String = sqlx::query_scalar("SELECT current_setting('plan_cache_mode')")
            .fetch_one(j.pool())
            .await
            .unwrap();
        assert_eq!(mode, want, "generic_plans = {generic}");
        let path: String = sqlx::query_scalar("SELECT current_setting('search_path')")
            .fetch_one(j.pool())
            .await
            .unwrap();
        assert_eq!(path, s, "generic_plans = {generic}");
        j.close().await;
    }
}

/// The dialect's one-row aggregate on Postgres: every row's columns come
/// back exactly (quotes, backslashes, control characters, non-ASCII,
/// `NULL`), and no rows give an empty array, as on SQLite.
#[tokio::test]
async fn json_group_gives_back_every_row_exactly() {
    let Some(url) = test_database_url() else { return };
    let pool = admin_pool(&url).await;
    let dialect = outbox_sql::Dialect::postgres("0");
    let texts = [
        Some("{\"a\":\"q\\\"uote\"}".to_owned()),
        Some("tab\tnewline\ncontrol\u{1}back\\slash ü €".to_owned()),
        None,
    ];
    for (filter, want) in [("k >= -1", 3), ("k > 5", 0)] {
        let sql = format!(
            "SELECT {} FROM (SELECT k, v FROM unnest($1::bigint[], $2::text[]) AS t(k, v) WHERE {filter}) t",
            dialect.json_group("k, v")
        );
        let text: String = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(vec![-1i64, 0, 1])
            .bind(texts.to_vec())
            .fetch_one(&pool)
            .await
            .expect("aggregate");
        let mut rows: Vec<(i64, Option<String>)> = outbox_sql::decode_json("testing", &text).expect("decode");
        rows.sort();
        assert_eq!(rows.len(), want, "{text}");
        for (i, (k, v)) in rows.iter().enumerate() {
            assert_eq!((*k, v), (i as i64 - 1, &texts[i]), "{text}");
        }
    }
    pool.close().await;
}

/// `admit_run` across processes: many stores (each its own pool, as separate
/// processes) admit a run for one projection at the same moment; exactly one
/// succeeds and every other is `InvalidState` naming the winner. Also when
/// the projection's previous run has an expired claim (the sweep races too):
/// it is abandoned once and exactly one new run is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_admissions_admit_exactly_one_run() {
    let Some(url) = test_database_url() else { return };
    use outbox_core::{RunEnd, RunKind, RunState, RunStore};
    let s = unique_schema("runs");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let mut stores = Vec::new();
    for _ in 0..8 {
        stores.push(projections(&url, &s).await);
    }
    let p = ProjectionName::new("p").unwrap();
    let ttl = Duration::from_secs(60);
    let mut previous: Option<(u64, WorkerId)> = None;
    for round in 0..6 {
        let expire = round % 2 == 1;
        if expire {
            // Leave the active run with a claim that expires.
            let (id, owner) = previous.take().expect("an active run from the last round");
            stores[0].advance_clock_for_tests(ttl * 2).await.unwrap();
            previous = Some((id, owner));
        } else if let Some((id, owner)) = previous.take() {
            stores[0].finish_run(id, &owner, RunEnd::Completed).await.unwrap();
        }
        let barrier = Arc::new(tokio::sync::Barrier::new(stores.len()));
        let mut tasks = Vec::new();
        for (i, store) in stores.iter().enumerate() {
            let (store, p, barrier) = (store.clone(), p.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let owner = WorkerId::new(format!("w{round}-{i}")).unwrap();
                barrier.wait().await;
                (
                    owner.clone(),
                    store.admit_run(RunKind::Rebuild, &p, None, &owner, ttl).await,
                )
            }));
        }
        let mut won = Vec::new();
        let mut refused = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                (owner, Ok(run)) => won.push((run, owner)),
                (_, Err(Error::InvalidState(m))) => refused.push(m),
                (_, Err(e)) => panic!("round {round}: unexpected error {e}"),
            }
        }
        assert_eq!(won.len(), 1, "round {round}: exactly one admission wins: {won:?}");
        let (run, owner) = won.pop().unwrap();
        assert_eq!(refused.len(), stores.len() - 1);
        for m in &refused {
            assert!(
                m.contains(&format!("run {}", run.id)),
                "round {round}: names the winner: {m}"
            );
        }
        let active: Vec<_> = stores[1]
            .runs(100)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.projection == p && r.state.is_active())
            .collect();
        assert_eq!(active.len(), 1, "round {round}: one active run");
        if expire {
            let (old, _) = previous.as_ref().unwrap();
            let old = stores[2].run(*old).await.unwrap().unwrap();
            assert_eq!(
                (old.state, old.error_code.as_deref()),
                (RunState::Failed, Some("abandoned"))
            );
        }
        previous = Some((run.id, owner));
    }
    for st in &stores {
        st.close().await;
    }
}

/// How an applier (or a projection's reset) ends the store's transaction
/// behind its back.
#[derive(Clone, Copy, Debug)]
enum Sabotage {
    /// `COMMIT` through the store's connection.
    Commit,
    /// `ROLLBACK` through the store's connection.
    Rollback,
    /// `COMMIT` then `BEGIN`: a transaction is open again, but a new one.
    CommitAndBegin,
    /// A failing statement whose error is swallowed: Postgres aborts the
    /// transaction.
    SwallowError,
    /// None: a well-behaved projection.
    None,
}

struct Saboteur(ProjectionName, Sabotage);

impl Saboteur {
    async fn sabotage(&self, tx: &mut PgTx) -> Result<(), BoxError> {
        match self.1 {
            Sabotage::Commit => {
                sqlx::query("COMMIT").execute(&mut **tx).await?;
            }
            Sabotage::Rollback => {
                sqlx::query("ROLLBACK").execute(&mut **tx).await?;
            }
            Sabotage::CommitAndBegin => {
                sqlx::query("COMMIT").execute(&mut **tx).await?;
                sqlx::query("BEGIN").execute(&mut **tx).await?;
            }
            Sabotage::SwallowError => {
                let r = sqlx::query("SELECT 1/0").execute(&mut **tx).await;
                assert!(r.is_err(), "the division fails");
            }
            Sabotage::None => {}
        }
        Ok(())
    }
}

#[outbox_core::async_trait]
impl Projection<PgTx> for Saboteur {
    fn name(&self) -> &ProjectionName {
        &self.0
    }
    async fn setup(&self, tx: &mut PgTx) -> Result<(), BoxError> {
        sqlx::query("CREATE TABLE IF NOT EXISTS written (seq bigint PRIMARY KEY)")
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
    async fn apply(&self, tx: &mut PgTx, e: &Event) -> Result<(), BoxError> {
        sqlx::query("INSERT INTO written (seq) VALUES ($1)")
            .bind(e.seq.as_i64())
            .execute(&mut **tx)
            .await?;
        self.sabotage(tx).await
    }
    async fn reset(&self, tx: &mut PgTx) -> Result<(), BoxError> {
        sqlx::query("DELETE FROM written").execute(&mut **tx).await?;
        self.sabotage(tx).await
    }
    async fn digest(&self, tx: &mut PgTx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        Ok(outbox_postgres::digest_table(tx, "written", out).await?)
    }
}

async fn written(store: &PgProjectionStore) -> Vec<i64> {
    sqlx::query_scalar("SELECT seq FROM written ORDER BY seq")
        .fetch_all(store.pool())
        .await
        .unwrap()
}

fn is_permanent_storage(r: &outbox_core::Result<impl std::fmt::Debug>) -> bool {
    matches!(r, Err(e @ Error::Storage { .. }) if !e.is_temporary())
}

/// `apply`: an applier that ends the store's transaction makes the call a
/// permanent `Storage` error with no checkpoint or watermark moved, and the
/// store (its pooled connections) stays usable.
async fn apply_detects(sabotage: Sabotage) {
    let Some(url) = test_database_url() else { return };
    let (js, ps) = (unique_schema("sabj"), unique_schema("sabp"));
    let _drop = DropSchemas::new(&url, [js.clone(), ps.clone()]);
    let j = journal(&url, &js).await;
    // One connection: the sabotaged one is the one reused afterwards.
    let store = PgProjectionStore::connect(&url, options(&ps).with_max_connections(1))
        .await
        .unwrap();
    let name = ProjectionName::new("saboteur").unwrap();
    let p: Arc<dyn Projection<PgTx>> = Arc::new(Saboteur(name.clone(), sabotage));
    store.setup(std::slice::from_ref(&p)).await.unwrap();
    j.append(&[request("s", &[1, 2])], AppendOptions::enqueue())
        .await
        .unwrap();
    let s = sid("s");
    let events = j.read_stream(&s, outbox_core::Seq::FIRST, 10).await.unwrap();
    let r = store.apply(&s, &events[..1], std::slice::from_ref(&p)).await;
    assert!(
        is_permanent_storage(&r),
        "{sabotage:?}: a permanent storage error: {r:?}"
    );
    let msg = r.unwrap_err().to_string();
    assert!(
        msg.contains("saboteur"),
        "{sabotage:?}: names the projection: {msg}"
    );
    assert_eq!(
        store.checkpoint(&name, &s).await.unwrap(),
        0,
        "{sabotage:?}: no checkpoint moved"
    );
    assert_eq!(
        store.watermark(&s).await.unwrap(),
        None,
        "{sabotage:?}: no watermark"
    );
    match sabotage {
        // The applier's own COMMIT made its row durable; what must not
        // happen is the checkpoint committing with (or without) it.
        Sabotage::Commit | Sabotage::CommitAndBegin => assert_eq!(written(&store).await, [1]),
        _ => assert_eq!(written(&store).await, Vec::<i64>::new()),
    }
    // The store is usable afterwards, on the same (only) connection.
    let ok = OracleProjection::new("oracle").shared();
    store.setup(std::slice::from_ref(&ok)).await.expect("setup after");
    store
        .apply(&s, &events, std::slice::from_ref(&ok))
        .await
        .expect("a later apply works");
    let st = read_state(&store, "oracle").await.unwrap();
    assert_eq!(st.streams["s"].seqs, [1, 2]);
    store.close().await;
    j.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_refuses_a_transaction_committed_by_an_applier() {
    apply_detects(Sabotage::Commit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_refuses_a_transaction_rolled_back_by_an_applier() {
    apply_detects(Sabotage::Rollback).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_refuses_a_transaction_replaced_by_an_applier() {
    apply_detects(Sabotage::CommitAndBegin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_refuses_a_transaction_aborted_by_a_swallowed_error() {
    apply_detects(Sabotage::SwallowError).await;
}

/// `reset`: a projection whose reset ends the transaction makes the call a
/// permanent `Storage` error and the checkpoints are not deleted on their
/// own (a replay would then apply every event again onto rows still there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_refuses_a_transaction_ended_by_the_projection() {
    let Some(url) = test_database_url() else { return };
    for sabotage in [
        Sabotage::Commit,
        Sabotage::Rollback,
        Sabotage::CommitAndBegin,
        Sabotage::SwallowError,
    ] {
        let (js, ps) = (unique_schema("rsj"), unique_schema("rsp"));
        let _drop = DropSchemas::new(&url, [js.clone(), ps.clone()]);
        let j = journal(&url, &js).await;
        let store = PgProjectionStore::connect(&url, options(&ps).with_max_connections(1))
            .await
            .unwrap();
        let name = ProjectionName::new("saboteur").unwrap();
        let good: Arc<dyn Projection<PgTx>> = Arc::new(Saboteur(name.clone(), Sabotage::None));
        let bad: Arc<dyn Projection<PgTx>> = Arc::new(Saboteur(name.clone(), sabotage));
        store.setup(std::slice::from_ref(&good)).await.unwrap();
        j.append(&[request("s", &[1])], AppendOptions::enqueue())
            .await
            .unwrap();
        let s = sid("s");
        let events = j.read_stream(&s, outbox_core::Seq::FIRST, 10).await.unwrap();
        store
            .apply(&s, &events, std::slice::from_ref(&good))
            .await
            .unwrap();
        let r = store.reset(bad.as_ref()).await;
        assert!(
            is_permanent_storage(&r),
            "{sabotage:?}: a permanent storage error: {r:?}"
        );
        assert_eq!(
            store.checkpoint(&name, &s).await.unwrap(),
            1,
            "{sabotage:?}: the checkpoints were not deleted"
        );
        store.reset(good.as_ref()).await.expect("a later reset works");
        assert_eq!(
            (store.checkpoint(&name, &s).await.unwrap(), written(&store).await),
            (0, vec![])
        );
        store.close().await;
        j.close().await;
    }
}

/// A view projection counting events in ONE shared document, whatever the
/// stream; the first apply to enter pauses after its read until released.
struct SharedCounter {
    name: ProjectionName,
    paused: std::sync::atomic::AtomicBool,
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

#[outbox_core::async_trait]
impl outbox_core::ViewProjection for SharedCounter {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn apply(&self, view: &mut outbox_core::ViewTx<'_>, _: &Event) -> Result<(), BoxError> {
        let n: u64 = view.get("counts", "all").await?.unwrap_or(0);
        if !self.paused.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.entered.notify_one();
            self.release.notified().await;
        }
        view.put("counts", "all", &(n + 1)).await?;
        Ok(())
    }
}

/// Two streams applied concurrently update one document: the second reader
/// waits for the first's commit instead of reading the value it is about to
/// replace (a lost update), also when the document does not exist yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_applies_of_one_view_document_lose_no_update() {
    let Some(url) = test_database_url() else { return };
    let (js, ps) = (unique_schema("vj"), unique_schema("vp"));
    let _drop = DropSchemas::new(&url, [js.clone(), ps.clone()]);
    let j = journal(&url, &js).await;
    let store = projections(&url, &ps).await;
    let counter = Arc::new(SharedCounter {
        name: ProjectionName::new("shared").unwrap(),
        paused: Default::default(),
        entered: Arc::new(Notify::new()),
        release: Arc::new(Notify::new()),
    });
    let (entered, release) = (counter.entered.clone(), counter.release.clone());
    let p: Arc<dyn Projection<PgTx>> = outbox_core::view_projection(counter);
    j.append(
        &[request("a", &[1]), request("b", &[1])],
        AppendOptions::enqueue(),
    )
    .await
    .unwrap();
    let a = j
        .read_stream(&sid("a"), outbox_core::Seq::FIRST, 1)
        .await
        .unwrap();
    let b = j
        .read_stream(&sid("b"), outbox_core::Seq::FIRST, 1)
        .await
        .unwrap();

    // A reads the (missing) document and pauses inside its transaction.
    let first = {
        let (store, p) = (store.clone(), p.clone());
        tokio::spawn(async move { store.apply(&sid("a"), &a, std::slice::from_ref(&p)).await })
    };
    entered.notified().await;
    // B applies another stream meanwhile: its read must wait for A.
    let second = {
        let (store, p) = (store.clone(), p.clone());
        tokio::spawn(async move { store.apply(&sid("b"), &b, std::slice::from_ref(&p)).await })
    };
    // Wait (bounded) until B's backend is blocked on a lock: without the lock
    // it would have read the missing document, written 1 and committed.
    let admin = admin_pool(&url).await;
    let mut blocked = false;
    for _ in 0..600 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .fetch_one(&admin)
        .await
        .unwrap();
        if waiting > 0 {
            blocked = true;
            break;
        }
        if second.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        blocked,
        "the second apply did not wait for the first's document lock"
    );
    release.notify_one();
    first.await.unwrap().expect("first apply");
    second.await.unwrap().expect("second apply");
    let n: Option<u64> = outbox_core::ViewReader::new(&store, ProjectionName::new("shared").unwrap())
        .get("counts", "all")
        .await
        .unwrap();
    assert_eq!(n, Some(2), "one update was lost");
}

/// A sweep's end locks its streams' version rows in stream order, as an
/// append does: an append holding stream `a` (and about to take `b`) and
/// an end of `b` then `a` wait for each other in turn instead of
/// deadlocking. Before, the end locked `b`, then waited for `a`, and the
/// append's lock on `b` closed the cycle (seen as "deadlock detected" in
/// the lag benchmark's appends).
#[tokio::test]
async fn a_sweeps_end_locks_its_streams_in_the_order_appends_do() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("order");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let j = journal(&url, &s).await;
    j.append(
        &[request("a", &[1]), request("b", &[1])],
        AppendOptions::default(),
    )
    .await
    .unwrap();
    let owner = WorkerId::new("w").unwrap();
    let ttl = Duration::from_secs(60);
    let mut ends = Vec::new();
    for stream in ["b", "a"] {
        let (lease, rows) = j
            .acquire_and_claim(&sid(stream), &owner, ttl, 10)
            .await
            .unwrap()
            .expect("claimed");
        ends.push(outbox_core::StreamEnd {
            lease,
            through: Some(rows[0].seq),
            abandon: false,
        });
    }
    // An append in progress: it holds `a`'s version row.
    let pool = admin_pool(&url).await;
    let mut append = pool.begin().await.unwrap();
    let lock =
        |stream: &str| format!("SELECT 1 FROM \"{s}\".streams WHERE stream = '{stream}' FOR NO KEY UPDATE");
    sqlx::query(sqlx::AssertSqlSafe(lock("a")))
        .execute(&mut *append)
        .await
        .unwrap();
    let xid = xact_id(&mut append).await;
    let ender = j.clone();
    let end = tokio::spawn(async move { ender.finish(&ends).await });
    // Until the end waits for this transaction (for `a`'s row, held above):
    // nothing else waits on it, whatever other tests run meanwhile.
    loop {
        if waited_for(&pool, &xid).await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let b = sqlx::query(sqlx::AssertSqlSafe(lock("b")))
        .execute(&mut *append)
        .await;
    assert!(b.is_ok(), "the append's lock on b: {b:?}");
    append.commit().await.unwrap();
    assert_eq!(end.await.unwrap().unwrap(), 2, "both streams completed");
}

/// A claim in partitions holds its streams' head rows (an `UPDATE` of their
/// due time) until it commits; an append to one of those streams must not
/// wait for it: its head row exists, so there is nothing to insert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_does_not_wait_for_a_claim_holding_its_streams_head() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("hold");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let j = journal(&url, &s).await;
    j.append(&[request("h", &[1])], AppendOptions::default())
        .await
        .unwrap();
    // The claim's hold, uncommitted.
    let pool = admin_pool(&url).await;
    let mut claim = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE \"{s}\".outbox_heads SET due_at = due_at + 60000 WHERE stream = 'h'"
    )))
    .execute(&mut *claim)
    .await
    .unwrap();
    let xid = xact_id(&mut claim).await;
    let appender = j.clone();
    let append = tokio::spawn(async move {
        appender
            .append(&[request("h", &[2])], AppendOptions::default())
            .await
    });
    // Either the append returns, or it waits for the claim's transaction
    // (nothing else can: the transaction is this test's own).
    let waited = waits_for(&pool, &xid, &append).await;
    claim.rollback().await.unwrap();
    let appended = append.await.unwrap().expect("the append");
    assert!(
        !waited,
        "the append waited for the claim holding the stream's head"
    );
    assert_eq!(appended[0].first_seq.get(), 2);
}

/// The workers' bookkeeping commits without waiting for the WAL flush;
/// appends and failure records wait for it (ADR 0027). A statement trigger
/// on the outbox records the setting each writing transaction ran under.
#[tokio::test]
async fn only_the_workers_bookkeeping_commits_without_waiting_for_the_disk() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("sync");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let j = journal(&url, &s).await;
    let pool = admin_pool(&url).await;
    for ddl in [
        format!("CREATE TABLE \"{s}\".seen_commits (n serial, op text, sync text)"),
        format!(
            "CREATE FUNCTION \"{s}\".note_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             INSERT INTO \"{s}\".seen_commits (op, sync) VALUES (TG_OP, current_setting('synchronous_commit')); \
             RETURN NULL; END $$"
        ),
        format!(
            "CREATE TRIGGER note_commit AFTER INSERT OR UPDATE OR DELETE ON \"{s}\".outbox \
             FOR EACH STATEMENT EXECUTE FUNCTION \"{s}\".note_commit()"
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(ddl))
            .execute(&pool)
            .await
            .unwrap();
    }
    let seen = || async {
        let rows: Vec<(String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT op, sync FROM \"{s}\".seen_commits ORDER BY n"
        )))
        .fetch_all(&pool)
        .await
        .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM \"{s}\".seen_commits")))
            .execute(&pool)
            .await
            .unwrap();
        rows.into_iter()
            .map(|(op, sync)| format!("{op} {sync}"))
            .collect::<Vec<_>>()
    };

    j.append(&[request("a", &[1, 2])], AppendOptions::default())
        .await
        .unwrap();
    assert_eq!(seen().await, ["INSERT on"], "the append");
    let owner = WorkerId::new("w").unwrap();
    let ttl = Duration::from_secs(60);
    let (lease, rows) = j
        .acquire_and_claim(&sid("a"), &owner, ttl, 1)
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!(seen().await, ["UPDATE off"], "the claim");
    j.complete_and_release(&lease, Some(rows[0].seq), false)
        .await
        .unwrap();
    assert_eq!(seen().await, ["DELETE off"], "the completion");
    let (lease, rows) = j
        .acquire_and_claim(&sid("a"), &owner, ttl, 1)
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!(seen().await, ["UPDATE off"], "the second claim");
    j.fail(&lease, rows[0].seq, "boom", &outbox_core::RetryPolicy::default())
        .await
        .unwrap();
    assert_eq!(seen().await, ["UPDATE on"], "the failure's record");
    // The partitioned claim is one autocommit statement: it turns the
    // setting off for its own transaction.
    j.append(&[request("b", &[1])], AppendOptions::default())
        .await
        .unwrap();
    assert_eq!(seen().await, ["INSERT on"], "the second append");
    let all: Vec<Partition> = Partition::all(j.partitioning().count()).collect();
    j.sync_partitions(&owner, &all, ttl).await.unwrap();
    let limits = SweepLimits {
        streams: 8,
        per_stream: 8,
        rows: 8,
    };
    let taken = j.claim_partitioned(&owner, ttl, limits).await.unwrap();
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(seen().await, ["UPDATE off"], "the partitioned claim");
}

/// The partitioned claim under a generic plan made while the journal was
/// empty (a fresh deployment's first claims): it holds the claimed heads
/// by their primary key, and with fewer due heads than its first look
/// takes it never walks the partitions one by one. Before, that plan held
/// each head through a scan of `outbox_heads_by_partition` (about a
/// quarter of every claim at 2,000 appends/s), and the per-partition walk
/// ran whenever fewer streams than the limit were due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_claim_planned_on_empty_tables_seeks_its_heads_by_key() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("empty_plan");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let j = journal(&url, &s).await;
    let pool = j.pool();
    let mut tx = pool.begin().await.unwrap();
    prepare_generic(&mut tx, "claim", statements::CLAIM_AND_LOAD_PARTITIONED).await;
    let execute = "EXECUTE claim ('w', 15000, 64, 64, 512, 'x')";
    // Planned now, on empty tables, and kept.
    sqlx::raw_sql(execute)
        .execute(&mut *tx)
        .await
        .expect("first claim");
    for sql in [
        "INSERT INTO outbox (stream, seq, event_type, status, attempt_count, next_attempt_at, updated_at, partition_no) \
         SELECT 's' || st, q, 'oracle.add', 'pending', 0, 0, 0, st % 16 \
         FROM generate_series(1, 20) st, generate_series(1, 3) q",
        "INSERT INTO outbox_heads (stream, head_seq, due_at, partition_no) \
         SELECT 's' || st, 1, 0, st % 16 FROM generate_series(1, 20) st",
        "INSERT INTO streams (stream, head) SELECT 's' || st, 3 FROM generate_series(1, 20) st",
        "INSERT INTO outbox_partition_leases (partition_no, owner, epoch, expires_at) \
         SELECT p, 'w', 1, 9000000000000 FROM generate_series(0, 15) p",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await
            .expect("fill");
    }
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {execute}"
    )))
    .fetch_all(&mut *tx)
    .await
    .expect("explain");
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_heads WHERE due_at > 0")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let plan = plan.join("\n");
    println!("{plan}");
    assert_eq!(held, 20, "every due head is held:\n{plan}");
    for line in plan.lines().filter(|l| l.contains("outbox_heads_by_partition")) {
        assert!(
            line.contains("never executed"),
            "the claim walked or probed outbox_heads_by_partition: {line}\n{plan}"
        );
    }
    assert!(
        plan.contains("outbox_heads_pkey"),
        "the hold seeks the heads by key:\n{plan}"
    );
}

/// A partitioned sweep's end that completes nothing (its rows were
/// deleted behind the journal's back, the head left held) still ends the
/// stream's hold: the row behind is claimed at once, not when the
/// claim's hold expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_end_that_completes_nothing_ends_the_hold() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("held");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let j = journal(&url, &s).await;
    let owner = WorkerId::new("w").unwrap();
    let ttl = Duration::from_secs(60);
    j.append(&[request("s", &[1, 2, 3])], AppendOptions::enqueue())
        .await
        .unwrap();
    let all: Vec<Partition> = Partition::all(j.partitioning().count()).collect();
    j.sync_partitions(&owner, &all, ttl).await.unwrap();
    let limits = SweepLimits {
        streams: 1,
        per_stream: 2,
        rows: 2,
    };
    let mut taken = j.claim_partitioned(&owner, ttl, limits).await.unwrap();
    assert_eq!(taken.len(), 1, "{taken:?}");
    let (lease, rows) = taken.remove(0);
    assert_eq!(rows.len(), 2);
    sqlx::query("DELETE FROM outbox WHERE stream = 's' AND seq <= 2")
        .execute(j.pool())
        .await
        .unwrap();
    assert!(
        j.claim_partitioned(&owner, ttl, limits).await.unwrap().is_empty(),
        "the claim holds the stream until its lease expires"
    );
    let end = StreamEnd {
        lease,
        through: Some(rows[1].seq),
        abandon: false,
    };
    assert_eq!(j.finish(&[end]).await.unwrap(), 0, "nothing left to complete");
    let next = j.claim_partitioned(&owner, ttl, limits).await.unwrap();
    assert_eq!(
        next.iter()
            .map(|(l, rows)| (
                l.stream.to_string(),
                rows.iter().map(|r| r.seq.get()).collect::<Vec<_>>()
            ))
            .collect::<Vec<_>>(),
        [("s".to_owned(), vec![3])],
        "the end recomputed the head: the row behind is claimed at once"
    );
}

/// Migration 0006 rewrites the message of attempts the old claims counted
/// to the message of a recorded one: both must be the constants' texts.
#[test]
fn the_alone_migration_names_the_unfinished_and_the_recorded_messages() {
    let sql = include_str!("../migrations/journal/0006_alone.sql");
    for text in [outbox_core::UNFINISHED_ATTEMPT, outbox_core::ENDED_WITHOUT_RESULT] {
        assert!(sql.contains(&format!("'{text}'")), "0006 lacks {text:?}");
    }
}

/// The sessions waiting for a row of `schema`'s `streams` that transaction
/// `xid` locked: the first on the transaction, the others on the row.
async fn waiting_on_streams(pool: &PgPool, schema: &str, xid: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted AND \
         ((locktype = 'transactionid' AND transactionid::text = $1) \
          OR (locktype = 'tuple' AND relation = to_regclass($2)))",
    )
    .bind(xid)
    .bind(format!("\"{schema}\".streams"))
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A transaction of another session holding `stream`'s version row in
/// `schema` (appends to the stream wait for it), and its id.
async fn hold_stream(
    pool: &PgPool,
    schema: &str,
    stream: &str,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, String) {
    let mut holder = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT 1 FROM \"{schema}\".streams WHERE stream = $1 FOR UPDATE"
    )))
    .bind(stream)
    .execute(&mut *holder)
    .await
    .unwrap();
    let xid = xact_id(&mut holder).await;
    (holder, xid)
}

/// Appends never take the reserved connections
/// (`PgOptions::reserved_connections`): in a pool of three with two
/// reserved, three appends held up by a stream's lock occupy one connection
/// between them (the others wait for its slot, not in the pool), and two of
/// the runtime's calls run at once on the other two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_appends_leaves_the_reserved_connections_free() {
    let Some(url) = test_database_url() else {
        return;
    };
    let s = unique_schema("reserve");
    let _drop = DropSchemas::new(&url, vec![s.clone()]);
    let options = options(&s).with_max_connections(3).with_reserved_connections(2);
    let j = PgJournal::connect(&url, options).await.unwrap();
    j.append(&[request("held", &[1])], AppendOptions::default())
        .await
        .unwrap();
    // Another session holds the stream's version row: its appends wait.
    let pool = admin_pool(&url).await;
    let (holder, xid) = hold_stream(&pool, &s, "held").await;
    let appends: Vec<_> = (0..3)
        .map(|_| {
            let j = j.clone();
            tokio::spawn(async move { j.append(&[request("held", &[1])], AppendOptions::default()).await })
        })
        .collect();
    // Until one append waits for the row (it holds a connection).
    while waiting_on_streams(&pool, &s, &xid).await == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Two calls at once, each on a connection of its own.
    let (held, other) = (sid("held"), sid("other"));
    let (held, other) = tokio::join!(j.stream_version(&held), j.stream_version(&other));
    assert_eq!((held.unwrap(), other.unwrap()), (1, 0));
    assert_eq!(
        waiting_on_streams(&pool, &s, &xid).await,
        1,
        "only the append holding the one append slot reached the database"
    );
    holder.rollback().await.unwrap();
    for a in appends {
        a.await.unwrap().unwrap();
    }
    assert_eq!(j.stream_version(&sid("held")).await.unwrap(), 4);
}

/// With the default options an append waiting on a stream's lock holds
/// one of the two append connections (`PgOptions::append_connections`):
/// appends to other streams keep going on the other one meanwhile, grouped
/// while it is busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_held_by_a_lock_leaves_the_other_appends_going() {
    let Some(url) = test_database_url() else {
        return;
    };
    let s = unique_schema("bystander");
    let _drop = DropSchemas::new(&url, vec![s.clone()]);
    let j = PgJournal::connect(&url, options(&s)).await.unwrap();
    j.append(&[request("held", &[1])], AppendOptions::default())
        .await
        .unwrap();
    let pool = admin_pool(&url).await;
    let (holder, xid) = hold_stream(&pool, &s, "held").await;
    let blocked = {
        let j = j.clone();
        tokio::spawn(async move { j.append(&[request("held", &[2])], AppendOptions::default()).await })
    };
    assert!(
        waits_for(&pool, &xid, &blocked).await,
        "the append waits for the lock"
    );
    // Sixteen appenders at once, to sixteen other streams, while it waits.
    let others: Vec<_> = (0..16)
        .map(|k| {
            let j = j.clone();
            tokio::spawn(async move {
                j.append(&[request(&format!("other-{k}"), &[k])], AppendOptions::default())
                    .await
            })
        })
        .collect();
    // A guard against a hang only: they do not wait for the lock.
    let done = tokio::time::timeout(Duration::from_secs(60), async {
        for a in others {
            a.await.unwrap().expect("an append to another stream");
        }
    })
    .await;
    assert!(
        done.is_ok(),
        "appends to other streams waited for a lock on 'held'"
    );
    assert!(!blocked.is_finished(), "the held append still waits");
    holder.rollback().await.unwrap();
    blocked
        .await
        .unwrap()
        .expect("the held append, once the lock is gone");
    assert_eq!(j.stream_version(&sid("held")).await.unwrap(), 2);
    for k in 0..16u64 {
        assert_eq!(j.stream_version(&sid(&format!("other-{k}"))).await.unwrap(), 1);
    }
}

/// Runs `sql` (statements on `schema`'s tables, `{s}` standing for the
/// schema) in `tx`.
async fn run_in(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, schema: &str, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.replace("{s}", schema)))
        .execute(&mut **tx)
        .await
        .expect(sql);
}

/// `(head_seq, due_at is set)` of `stream`'s head row, if it has one.
async fn head_of(pool: &PgPool, schema: &str, stream: &str) -> Option<(i64, bool)> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT head_seq, due_at IS NOT NULL FROM {schema}.outbox_heads WHERE stream = $1"
    )))
    .bind(stream)
    .fetch_optional(pool)
    .await
    .unwrap()
}

/// Waits until a session waits for transaction `xid`, or `task` ends
/// first; returns whether it waited. Polls the server's lock table, so no
/// outcome depends on how fast the machine is.
async fn waits_for<T>(pool: &PgPool, xid: &str, task: &tokio::task::JoinHandle<T>) -> bool {
    loop {
        if waited_for(pool, xid).await {
            return true;
        }
        if task.is_finished() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The append is one statement whose snapshot is taken before it waits for
/// a stream's lock (ADR 0042). A worker that held that lock and removed the
/// stream's head (its last row completed) commits while the append waits:
/// the append still sees the head in its snapshot, and must put one back
/// for its new row, or no claim would ever find that row. A bystander
/// stream's head is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_behind_a_worker_that_removed_the_head_puts_one_back() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("behind");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let j = journal(&url, &s).await;
    let admin = admin_pool(&url).await;
    j.append(
        &[request("s", &[1]), request("t", &[1, 2])],
        AppendOptions::enqueue(),
    )
    .await
    .expect("append");
    assert_eq!(head_of(&admin, &s, "s").await, Some((1, true)));

    // A worker completing s's only row: it locks the stream, deletes the
    // row and the head, and has not committed yet.
    let mut worker = admin.begin().await.unwrap();
    run_in(
        &mut worker,
        &s,
        "SELECT 1 FROM {s}.streams WHERE stream = 's' FOR NO KEY UPDATE; \
         DELETE FROM {s}.outbox WHERE stream = 's'; \
         DELETE FROM {s}.outbox_heads WHERE stream = 's';",
    )
    .await;
    let xid = xact_id(&mut worker).await;
    let appender = j.clone();
    let append = tokio::spawn(async move {
        appender
            .append(&[request("s", &[2])], AppendOptions::enqueue())
            .await
    });
    assert!(
        waits_for(&admin, &xid, &append).await,
        "the append waits for the stream's lock"
    );
    worker.commit().await.unwrap();
    let appended = append.await.unwrap().expect("append");
    assert_eq!(appended[0].first_seq.get(), 2);

    assert_eq!(
        head_of(&admin, &s, "s").await,
        Some((2, true)),
        "the new row has a due head"
    );
    let rows: Vec<(i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT seq, status FROM {s}.outbox WHERE stream = 's' ORDER BY seq"
    )))
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(rows, vec![(2, "pending".to_owned())]);
    assert_eq!(
        head_of(&admin, &s, "t").await,
        Some((1, true)),
        "the bystander's head"
    );
}

/// A refused `append_in` (its expected version does not match) names the
/// conflict, writes nothing, and leaves the caller's transaction usable:
/// a later append in it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_append_in_leaves_the_transaction_usable() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("refusedin");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let j = journal(&url, &s).await;
    j.append(&[request("s", &[1, 2])], AppendOptions::enqueue())
        .await
        .expect("append");

    let mut tx = j.begin().await.expect("begin");
    let stale = AppendRequest::new(sid("s"), ExpectedVersion::Exact(1), vec![add(3)]);
    match j
        .append_in(&mut tx, &[stale, request("u", &[1])], AppendOptions::enqueue())
        .await
    {
        Err(Error::Conflict { stream, actual, .. }) => assert_eq!((stream.as_str(), actual), ("s", 2)),
        other => panic!("expected a conflict, got {other:?}"),
    }
    j.append_in(&mut tx, &[request("v", &[1])], AppendOptions::enqueue())
        .await
        .expect("append_in after a refusal");
    tx.commit().await.expect("commit");

    assert_eq!(j.stream_version(&sid("s")).await.unwrap(), 2);
    assert_eq!(
        j.stream_version(&sid("u")).await.unwrap(),
        0,
        "nothing of the refused batch"
    );
    assert_eq!(j.stream_version(&sid("v")).await.unwrap(), 1);
}

/// A journal with one append turn, and an append to "x" that holds it:
/// it waits for the stream lock the returned transaction holds. Every
/// append started meanwhile queues for the turn (ADR 0042's groups).
async fn turn_held(
    url: &str,
    schema: &str,
    admin: &PgPool,
) -> (
    PgJournal,
    sqlx::Transaction<'static, sqlx::Postgres>,
    tokio::task::JoinHandle<outbox_core::Result<Vec<outbox_core::Appended>>>,
) {
    let j = PgJournal::connect(
        url,
        options(schema)
            .with_max_connections(3)
            .with_reserved_connections(2),
    )
    .await
    .expect("connect");
    j.append(&[request("x", &[1])], AppendOptions::enqueue())
        .await
        .expect("append");
    let mut lock = admin.begin().await.unwrap();
    run_in(
        &mut lock,
        schema,
        "SELECT 1 FROM {s}.streams WHERE stream = 'x' FOR NO KEY UPDATE;",
    )
    .await;
    let xid = xact_id(&mut lock).await;
    let appender = j.clone();
    let blocker = tokio::spawn(async move {
        appender
            .append(&[request("x", &[2])], AppendOptions::enqueue())
            .await
    });
    assert!(
        waits_for(admin, &xid, &blocker).await,
        "the append holding the turn waits for the lock"
    );
    (j, lock, blocker)
}

type Pending<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = outbox_core::Result<Vec<outbox_core::Appended>>> + Send + 'a>,
>;

/// Polls each append once: each has queued for the turn when this returns
/// (an append queues before its first wait).
async fn queue_all(appends: &mut [Pending<'_>]) {
    std::future::poll_fn(|cx| {
        for a in appends.iter_mut() {
            assert!(a.as_mut().poll(cx).is_pending(), "the append waits for the turn");
        }
        std::task::Poll::Ready(())
    })
    .await;
}

/// The transaction ids the events of `stream` were written in, by seq.
async fn txids(pool: &PgPool, schema: &str, stream: &str) -> Vec<(i64, String)> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT seq, txid::text FROM {schema}.events WHERE stream = $1 ORDER BY seq"
    )))
    .bind(stream)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Appends queued while the only append turn is busy are appended by the
/// next turn in one statement, one commit: each gets its own answer, seqs
/// follow the queue's order within a stream, and every event is written in
/// the same transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_appends_share_one_commit() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("group");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let admin = admin_pool(&url).await;
    let (j, lock, blocker) = turn_held(&url, &s, &admin).await;

    let batches: Vec<Vec<AppendRequest>> = vec![
        vec![request("a", &[1, 2])],
        vec![request("b", &[3])],
        vec![request("a", &[4])],
        vec![request("c", &[5]), request("b", &[6])],
    ];
    let mut appends: Vec<Pending<'_>> = batches
        .iter()
        .map(|b| Box::pin(j.append(b, AppendOptions::enqueue())) as Pending<'_>)
        .collect();
    queue_all(&mut appends).await;
    lock.commit().await.unwrap();
    blocker.await.unwrap().expect("the blocked append");

    let mut answers = Vec::new();
    for a in appends {
        answers.push(a.await.expect("a queued append"));
    }
    let firsts: Vec<Vec<(String, u64, u64)>> = answers
        .iter()
        .map(|out| {
            out.iter()
                .map(|a| (a.stream.as_str().to_owned(), a.first_seq.get(), a.last_seq.get()))
                .collect()
        })
        .collect();
    assert_eq!(
        firsts,
        vec![
            vec![("a".to_owned(), 1, 2)],
            vec![("b".to_owned(), 1, 1)],
            vec![("a".to_owned(), 3, 3)],
            vec![("c".to_owned(), 1, 1), ("b".to_owned(), 2, 2)],
        ]
    );
    let mut all = Vec::new();
    for stream in ["a", "b", "c"] {
        all.extend(txids(&admin, &s, stream).await);
    }
    assert_eq!(all.len(), 6);
    assert!(
        all.iter().all(|(_, t)| *t == all[0].1),
        "one transaction for the group: {all:?}"
    );
    for stream in ["a", "b", "c"] {
        assert!(
            head_of(&admin, &s, stream)
                .await
                .is_some_and(|(seq, due)| seq == 1 && due),
            "{stream} has a due head"
        );
    }
}

/// A queued append whose expected version does not match fails alone with
/// its conflict; the others in its group are appended as if it were not
/// there. An append whose caller stopped waiting while it was queued is
/// never appended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_member_of_a_group_harms_no_other() {
    let Some(url) = test_database_url() else { return };
    let s = unique_schema("groupbad");
    let _drop = DropSchemas::new(&url, [s.clone()]);
    let admin = admin_pool(&url).await;
    let (j, lock, blocker) = turn_held(&url, &s, &admin).await;

    let stale = vec![AppendRequest::new(
        sid("x"),
        ExpectedVersion::Exact(7),
        vec![add(9)],
    )];
    let good_a = vec![request("a", &[1])];
    let good_b = vec![request("b", &[2, 3])];
    let dropped = vec![request("d", &[4])];
    let mut appends: Vec<Pending<'_>> = vec![
        Box::pin(j.append(&good_a, AppendOptions::enqueue())),
        Box::pin(j.append(&stale, AppendOptions::enqueue())),
        Box::pin(j.append(&dropped, AppendOptions::enqueue())),
        Box::pin(j.append(&good_b, AppendOptions::enqueue())),
    ];
    queue_all(&mut appends).await;
    // The caller of the third stops waiting while it is queued.
    drop(appends.remove(2));
    lock.commit().await.unwrap();
    blocker.await.unwrap().expect("the blocked append");

    let mut answers = Vec::new();
    for a in appends {
        answers.push(a.await);
    }
    assert_eq!(answers[0].as_ref().expect("a")[0].first_seq.get(), 1);
    match &answers[1] {
        Err(Error::Conflict { stream, actual, .. }) => assert_eq!((stream.as_str(), *actual), ("x", 2)),
        other => panic!("expected the stale append's conflict, got {other:?}"),
    }
    assert_eq!(answers[2].as_ref().expect("b")[0].last_seq.get(), 2);
    assert_eq!(
        j.stream_version(&sid("x")).await.unwrap(),
        2,
        "nothing of the stale batch"
    );
    assert_eq!(
        j.stream_version(&sid("d")).await.unwrap(),
        0,
        "the abandoned batch was not appended"
    );
    assert_eq!(j.stream_version(&sid("a")).await.unwrap(), 1);
    assert_eq!(j.stream_version(&sid("b")).await.unwrap(), 2);
}
