//! The Postgres adapter against a raw sqlx loop written by hand for the same work,
//! in one run (ratios, not absolute figures; see the performance guide).
//!
//! - W1 append with outbox enqueue, 1 / 100 events per transaction
//! - W2 drain a pre-filled backlog (due → acquire → claim → load → apply
//!   upserting one row per event → complete → release) at batch 1 / 64 with
//!   1 / 2 workers
//!
//! Reads `OUTBOX_BENCH_DATABASE_URL` or `OUTBOX_TEST_DATABASE_URL`. Every
//! drain run is checked: each stream's projection row counts every event once.
//! Prints a ratio table at the end.

#![allow(missing_docs, clippy::type_complexity)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use outbox_core::{
    AppendOptions, AppendRequest, ApplyOutcome, BoxError, DigestBuilder, Event, EventJournal, EventType,
    ExpectedVersion, Intent, LeaseStore, NewEvent, OutboxInspector, OutboxQueue, PayloadHash, Projection,
    ProjectionName, ProjectionStore, StreamId, WorkerId, async_trait,
};
use outbox_postgres::sqlx::{self, Connection, PgConnection, PgPool};
use outbox_postgres::{PgJournal, PgOptions, PgProjectionStore, PgTx, digest_table, statements};
use tokio::runtime::Runtime;

static RESULTS: Mutex<BTreeMap<(String, &'static str), (Duration, u64)>> = Mutex::new(BTreeMap::new());

fn record(workload: &str, side: &'static str, per_iter: Duration, events: u64) {
    let mut r = RESULTS.lock().unwrap();
    let e = r.entry((workload.to_owned(), side)).or_insert((per_iter, events));
    if per_iter < e.0 {
        *e = (per_iter, events);
    }
}

fn url() -> String {
    std::env::var("OUTBOX_BENCH_DATABASE_URL")
        .or_else(|_| std::env::var("OUTBOX_TEST_DATABASE_URL"))
        .expect("set OUTBOX_BENCH_DATABASE_URL or OUTBOX_TEST_DATABASE_URL (see `cargo xtask pg-shell`)")
}

fn ev(i: u64) -> NewEvent {
    NewEvent::new(
        EventType::new("bench.add").unwrap(),
        Intent::Apply,
        i.to_string().into_bytes(),
    )
}

fn sid(prefix: &str, i: u64) -> StreamId {
    StreamId::new(format!("{prefix}-{i:08}")).unwrap()
}

struct Fixture {
    schema: String,
    journal: PgJournal,
    store: PgProjectionStore,
}

async fn fixture(tag: &str) -> Fixture {
    let schema = format!("bench_{tag}_{}", std::process::id());
    let admin = PgPool::connect(&url()).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE"
    )))
    .execute(&admin)
    .await
    .unwrap();
    let options = PgOptions::default().with_schema(&schema).with_max_connections(8);
    let journal = PgJournal::connect(&url(), options).await.unwrap();
    let store = PgProjectionStore::sharing(&journal).await.unwrap();
    let p: Arc<dyn Projection<PgTx>> = Arc::new(Upsert(ProjectionName::new("totals").unwrap()));
    store.setup(&[p]).await.unwrap();
    Fixture {
        schema,
        journal,
        store,
    }
}

async fn drop_fixture(f: Fixture) {
    f.journal.close().await;
    let admin = PgPool::connect(&url()).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {} CASCADE",
        f.schema
    )))
    .execute(&admin)
    .await
    .unwrap();
}

/// A projection that upserts one row per event.
struct Upsert(ProjectionName);

async fn upsert(tx: &mut PgConnection, stream: &str, seq: i64) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO totals (stream, n, last) VALUES ($1, 1, $2) \
         ON CONFLICT (stream) DO UPDATE SET n = totals.n + 1, last = excluded.last",
    )
    .bind(stream)
    .bind(seq)
    .execute(&mut *tx)
    .await
    .map(|_| ())
}

#[async_trait]
impl Projection<PgTx> for Upsert {
    fn name(&self) -> &ProjectionName {
        &self.0
    }
    async fn setup(&self, tx: &mut PgTx) -> Result<(), BoxError> {
        sqlx::query("CREATE TABLE IF NOT EXISTS totals (stream text PRIMARY KEY, n bigint NOT NULL, last bigint NOT NULL)")
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
    async fn apply(&self, tx: &mut PgTx, e: &Event) -> Result<(), BoxError> {
        upsert(tx.conn(), e.stream.as_str(), e.seq.as_i64()).await?;
        Ok(())
    }
    async fn reset(&self, tx: &mut PgTx) -> Result<(), BoxError> {
        sqlx::query("DELETE FROM totals").execute(&mut **tx).await?;
        Ok(())
    }
    async fn digest(&self, tx: &mut PgTx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        Ok(digest_table(tx.conn(), "totals", out).await?)
    }
}

const STREAMS: u64 = 64;

/// The raw append as a careful engineer writes it by hand: in one
/// transaction, the stream's version bumped (and locked), the events and
/// their outbox rows each inserted by one statement, a notification.
async fn raw_append(conn: &mut PgConnection, stream: &str, events: &[NewEvent], channel: &str) {
    let mut tx = conn.begin().await.unwrap();
    let n = events.len() as i64;
    let head: i64 =
        sqlx::query_scalar("UPDATE streams SET head = head + $2 WHERE stream = $1 RETURNING head")
            .bind(stream)
            .bind(n)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    let q: Vec<i64> = (head - n + 1..=head).collect();
    let t: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    let p: Vec<&[u8]> = events.iter().map(|e| e.payload.as_slice()).collect();
    let h: Vec<Vec<u8>> = events
        .iter()
        .map(|e| PayloadHash::of(&e.payload).0.to_vec())
        .collect();
    sqlx::query(
        "INSERT INTO events (stream, seq, event_type, intent, payload, payload_hash, recorded_at) \
         SELECT $1, u.q, u.t, 'apply', u.p, u.h, (extract(epoch from clock_timestamp()) * 1000)::bigint \
         FROM unnest($2::bigint[], $3::text[], $4::bytea[], $5::bytea[]) AS u(q, t, p, h)",
    )
    .bind(stream)
    .bind(&q)
    .bind(&t)
    .bind(&p)
    .bind(&h)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outbox (stream, seq, event_type, status, next_attempt_at, updated_at) \
         SELECT $1, u.q, u.t, 'pending', (extract(epoch from clock_timestamp()) * 1000)::bigint, \
                (extract(epoch from clock_timestamp()) * 1000)::bigint \
         FROM unnest($2::bigint[], $3::text[]) AS u(q, t)",
    )
    .bind(stream)
    .bind(&q)
    .bind(&t)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(channel)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

fn bench_append(c: &mut Criterion, rt: &Runtime) {
    let mut g = c.benchmark_group("W1_append");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let f = rt.block_on(fixture("append"));
    let mut raw = rt.block_on(async {
        let mut c = PgConnection::connect_with(&f.journal.pool().connect_options())
            .await
            .unwrap();
        // Create the streams once, so both sides lock existing rows.
        for s in 0..STREAMS {
            f.journal
                .append(
                    &[AppendRequest::new(sid("a", s), ExpectedVersion::Any, vec![ev(0)])],
                    AppendOptions::enqueue(),
                )
                .await
                .unwrap();
        }
        sqlx::query("SELECT 1").execute(&mut c).await.unwrap();
        c
    });
    for per_txn in [1u64, 100] {
        let events: Vec<NewEvent> = (0..per_txn).map(ev).collect();
        let name = format!("W1 append {per_txn}/txn");
        let mut k = 0u64;
        g.bench_function(format!("{per_txn}_per_txn/adapter"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        k += 1;
                        let req =
                            AppendRequest::new(sid("a", k % STREAMS), ExpectedVersion::Any, events.clone());
                        f.journal.append(&[req], AppendOptions::enqueue()).await.unwrap();
                    }
                    let d = start.elapsed();
                    record(&name, "adapter", d / iters as u32, per_txn);
                    d
                })
            })
        });
        let channel = f.journal.channel().to_owned();
        g.bench_function(format!("{per_txn}_per_txn/raw"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        k += 1;
                        let s = sid("a", k % STREAMS);
                        raw_append(&mut raw, s.as_str(), &events, &channel).await;
                    }
                    let d = start.elapsed();
                    record(&name, "raw", d / iters as u32, per_txn);
                    d
                })
            })
        });
    }
    g.finish();
    rt.block_on(async {
        raw.close().await.unwrap();
        drop_fixture(f).await;
    });
}

const DRAIN_STREAMS: u64 = 32;

/// Fills the outbox: `per_stream` events on each of fresh streams (a new
/// prefix every time, so seqs start at 1 and checkpoints at 0).
async fn fill(f: &Fixture, per_stream: u64) {
    static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let prefix = format!(
        "d{}",
        GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let reqs: Vec<AppendRequest> = (0..DRAIN_STREAMS)
        .map(|s| {
            AppendRequest::new(
                sid(&prefix, s),
                ExpectedVersion::Any,
                (0..per_stream).map(ev).collect(),
            )
        })
        .collect();
    f.journal.append(&reqs, AppendOptions::enqueue()).await.unwrap();
    sqlx::query("TRUNCATE totals")
        .execute(f.journal.pool())
        .await
        .unwrap();
}

async fn check(f: &Fixture, per_stream: u64) {
    let counts: Vec<(String, i64)> = sqlx::query_as("SELECT stream, n FROM totals ORDER BY stream")
        .fetch_all(f.store.pool())
        .await
        .unwrap();
    assert_eq!(counts.len() as u64, DRAIN_STREAMS, "every stream applied");
    for (s, n) in counts {
        let head = f
            .journal
            .stream_version(&StreamId::new(&s).unwrap())
            .await
            .unwrap();
        let cp = f
            .store
            .checkpoint(
                &ProjectionName::new("totals").unwrap(),
                &StreamId::new(&s).unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(n as u64, per_stream, "{s}: each event once");
        assert_eq!(cp, head, "{s}: checkpoint at the head");
    }
    assert_eq!(f.journal.summary().await.unwrap().total(), 0, "outbox drained");
}

/// The adapter's worker loop (one worker).
async fn adapter_worker(f: &Fixture, who: &str, batch: usize) {
    let owner = WorkerId::new(who).unwrap();
    let projs: Vec<Arc<dyn Projection<PgTx>>> =
        vec![Arc::new(Upsert(ProjectionName::new("totals").unwrap()))];
    loop {
        let due = f.journal.due_streams(16).await.unwrap();
        if due.is_empty() {
            return;
        }
        for s in due {
            let Some(lease) = f
                .journal
                .acquire(&s, &owner, Duration::from_secs(30))
                .await
                .unwrap()
            else {
                continue;
            };
            let rows = f.journal.claim(&lease, batch).await.unwrap();
            if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
                let events = f.journal.read_stream(&s, first.seq, rows.len()).await.unwrap();
                match f.store.apply(&s, &events, &projs).await.unwrap() {
                    ApplyOutcome::Applied(_) => {}
                    ApplyOutcome::Gap(g) => panic!("gap {g:?}"),
                }
                f.journal.complete(&s, last.seq).await.unwrap();
            }
            f.journal.release(&lease).await.unwrap();
        }
    }
}

/// The same loop as raw statements on two connections.
async fn raw_worker(pool: &PgPool, who: &str, batch: usize) {
    let mut j = pool.acquire().await.unwrap();
    let mut p = pool.acquire().await.unwrap();
    loop {
        let due: Vec<String> = sqlx::query_scalar(statements::DUE_STREAMS)
            .bind(16i64)
            .fetch_all(&mut *j)
            .await
            .unwrap();
        if due.is_empty() {
            return;
        }
        for s in due {
            let lease: Option<(String, i64, i64)> =
                sqlx::query_as(sqlx::AssertSqlSafe(statements::acquire()))
                    .bind(&s)
                    .bind(who)
                    .bind(30_000i64)
                    .fetch_optional(&mut *j)
                    .await
                    .unwrap();
            let Some((_, epoch, _)) = lease else { continue };
            let mut tx = j.begin().await.unwrap();
            sqlx::query(statements::LEASE_CHECK)
                .bind(&s)
                .bind(who)
                .bind(epoch)
                .fetch_optional(&mut *tx)
                .await
                .unwrap()
                .expect("lease");
            let mut seqs: Vec<i64> = sqlx::query(statements::CLAIM)
                .bind(&s)
                .bind(batch as i64)
                .bind(outbox_core::UNFINISHED_ATTEMPT)
                .bind(true)
                .fetch_all(&mut *tx)
                .await
                .unwrap()
                .iter()
                .map(|r| sqlx::Row::get::<i64, _>(r, 1))
                .collect();
            tx.commit().await.unwrap();
            seqs.sort_unstable();
            if let (Some(first), Some(last)) = (seqs.first().copied(), seqs.last().copied()) {
                let events: Vec<(i64, Vec<u8>)> = sqlx::query_as(
                    "SELECT seq, payload FROM events WHERE stream = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
                )
                .bind(&s)
                .bind(first)
                .bind(seqs.len() as i64)
                .fetch_all(&mut *j)
                .await
                .unwrap();
                let mut tx = p.begin().await.unwrap();
                let cps: Vec<(String, i64)> = sqlx::query_as(statements::LOCK_CHECKPOINTS)
                    .bind(&s)
                    .bind(vec!["totals"])
                    .fetch_all(&mut *tx)
                    .await
                    .unwrap();
                let old = match cps.first() {
                    Some((_, cp)) => *cp,
                    None => {
                        sqlx::query(
                            "INSERT INTO outbox_checkpoints (projection, stream, last_applied, updated_at) \
                             VALUES ('totals', $1, 0, 0) ON CONFLICT DO NOTHING",
                        )
                        .bind(&s)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                        0
                    }
                };
                for (seq, _) in &events {
                    if *seq > old {
                        upsert(&mut tx, &s, *seq).await.unwrap();
                    }
                }
                let moved: i64 = sqlx::query_scalar(statements::APPLY_CAS)
                    .bind(&s)
                    .bind(vec!["totals"])
                    .bind(vec![last])
                    .bind(vec![old])
                    .bind(last)
                    .bind(vec!["totals"])
                    .bind(vec![0_i64])
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                assert_eq!(moved, 1);
                tx.commit().await.unwrap();
                let mut tx = j.begin().await.unwrap();
                sqlx::query("SELECT 1 FROM streams WHERE stream = $1 FOR NO KEY UPDATE")
                    .bind(&s)
                    .fetch_optional(&mut *tx)
                    .await
                    .unwrap();
                sqlx::query_scalar::<_, i64>(statements::COMPLETE)
                    .bind(&s)
                    .bind(last)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
            sqlx::query(
                "UPDATE stream_leases SET owner = NULL WHERE stream = $1 AND owner = $2 AND epoch = $3",
            )
            .bind(&s)
            .bind(who)
            .bind(epoch)
            .execute(&mut *j)
            .await
            .unwrap();
        }
    }
}

fn bench_drain(c: &mut Criterion, rt: &Runtime) {
    let mut g = c.benchmark_group("W2_drain");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(2));
    let f = Arc::new(rt.block_on(fixture("drain")));
    for (batch, per_stream) in [(1usize, 8u64), (64, 128)] {
        for workers in [1usize, 2] {
            let name = format!("W2 drain batch {batch}, {workers} worker(s)");
            let total = per_stream * DRAIN_STREAMS;
            for side in ["adapter", "raw"] {
                g.bench_function(format!("batch_{batch}_workers_{workers}/{side}"), |b| {
                    b.iter_custom(|iters| {
                        rt.block_on(async {
                            let mut spent = Duration::ZERO;
                            for _ in 0..iters {
                                fill(&f, per_stream).await;
                                let start = Instant::now();
                                let mut tasks = Vec::new();
                                for w in 0..workers {
                                    let f = f.clone();
                                    let who = format!("w{w}");
                                    tasks.push(tokio::spawn(async move {
                                        if side == "adapter" {
                                            adapter_worker(&f, &who, batch).await;
                                        } else {
                                            raw_worker(f.journal.pool(), &who, batch).await;
                                        }
                                    }));
                                }
                                for t in tasks {
                                    t.await.unwrap();
                                }
                                spent += start.elapsed();
                                check(&f, per_stream).await;
                            }
                            record(&name, side, spent / iters as u32, total);
                            spent
                        })
                    })
                });
            }
        }
    }
    g.finish();
    let f = Arc::try_unwrap(f).ok().expect("no workers left");
    rt.block_on(drop_fixture(f));
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    bench_append(c, &rt);
    bench_drain(c, &rt);
}

fn report() {
    let r = RESULTS.lock().unwrap();
    let mut workloads: Vec<&String> = r.keys().map(|(w, _)| w).collect();
    workloads.dedup();
    println!();
    println!("| workload | adapter events/s | raw events/s | adapter / raw |");
    println!("|---|---:|---:|---:|");
    for w in workloads {
        let rate = |side| {
            r.get(&(w.clone(), side))
                .map(|(d, n): &(Duration, u64)| *n as f64 / d.as_secs_f64())
        };
        if let (Some(a), Some(b)) = (rate("adapter"), rate("raw")) {
            println!("| {w} | {a:.0} | {b:.0} | {:.2} |", a / b);
        }
    }
}

criterion_group!(group, benches);

fn main() {
    group();
    Criterion::default().configure_from_args().final_summary();
    report();
}
