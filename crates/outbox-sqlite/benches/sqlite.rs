//! The SQLite adapter against a raw sqlx loop issuing the same statements,
//! in one run (see `/docs` performance guide: ratios, not absolute figures).
//!
//! - W1 append with outbox enqueue, 1 / 10 / 100 events per transaction
//! - W2 drain step (due → acquire → claim → load → apply upserting one row
//!   per event → complete → release) at batch 1 / 64
//! - W4 head claim (claim + abandon under a held lease) with 10^3 / 10^5
//!   pending rows behind the head
//!
//! Synchronous = FULL (the default) throughout. Prints a ratio table at the end.

#![allow(missing_docs, clippy::type_complexity)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use outbox_core::{
    AppendOptions, AppendRequest, ApplyOutcome, BoxError, DigestBuilder, Event, EventJournal, EventType,
    ExpectedVersion, Intent, LeaseStore, NewEvent, OutboxQueue, PayloadHash, Projection, ProjectionName,
    ProjectionStore, StreamId, WorkerId, async_trait,
};
use outbox_sqlite::sqlx::{self, ConnectOptions, Connection, SqliteConnection, sqlite::SqliteConnectOptions};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore, SqliteTx};
use tokio::runtime::Runtime;

macro_rules! now {
    () => {
        "(CAST(unixepoch('subsec') * 1000 AS INTEGER) + COALESCE((SELECT CAST(value AS INTEGER) \
         FROM outbox_meta WHERE key = 'test_clock_offset_ms'), 0))"
    };
}

/// Best per-iteration time of each (workload, side).
static RESULTS: Mutex<BTreeMap<(String, &'static str), (Duration, u64)>> = Mutex::new(BTreeMap::new());

fn record(workload: &str, side: &'static str, per_iter: Duration, events: u64) {
    let mut r = RESULTS.lock().unwrap();
    let e = r.entry((workload.to_owned(), side)).or_insert((per_iter, events));
    if per_iter < e.0 {
        *e = (per_iter, events);
    }
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
    _dir: tempfile::TempDir,
    journal: SqliteJournal,
    store: SqliteProjectionStore,
    raw_j: SqliteConnection,
    raw_p: SqliteConnection,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let jpath = dir.path().join("journal.db");
    let ppath = dir.path().join("projections.db");
    let journal = SqliteJournal::open(&jpath, SqliteOptions::default())
        .await
        .unwrap();
    let store = SqliteProjectionStore::open(&ppath, SqliteOptions::default())
        .await
        .unwrap();
    let raw = |p: &std::path::Path| {
        SqliteConnectOptions::new()
            .filename(p)
            .busy_timeout(Duration::from_secs(5))
            .synchronous(sqlx::sqlite::SqliteSynchronous::Full)
            .statement_cache_capacity(256)
    };
    let raw_j = raw(&jpath).connect().await.unwrap();
    let raw_p = raw(&ppath).connect().await.unwrap();
    Fixture {
        _dir: dir,
        journal,
        store,
        raw_j,
        raw_p,
    }
}

/// A projection that upserts one row per event.
struct Upsert(ProjectionName);

#[async_trait]
impl Projection<SqliteTx> for Upsert {
    fn name(&self) -> &ProjectionName {
        &self.0
    }
    async fn setup(&self, tx: &mut SqliteTx) -> Result<(), BoxError> {
        sqlx::query("CREATE TABLE IF NOT EXISTS totals (stream TEXT PRIMARY KEY, n INTEGER NOT NULL, last INTEGER NOT NULL)")
            .execute(tx.conn())
            .await?;
        Ok(())
    }
    async fn apply(&self, tx: &mut SqliteTx, e: &Event) -> Result<(), BoxError> {
        upsert(tx.conn(), e.stream.as_str(), e.seq.as_i64()).await?;
        Ok(())
    }
    async fn reset(&self, tx: &mut SqliteTx) -> Result<(), BoxError> {
        sqlx::query("DELETE FROM totals").execute(tx.conn()).await?;
        Ok(())
    }
    async fn digest(&self, tx: &mut SqliteTx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        Ok(outbox_sqlite::digest_table(tx.conn(), "totals", out).await?)
    }
}

async fn upsert(tx: &mut SqliteConnection, stream: &str, seq: i64) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO totals (stream, n, last) VALUES (?1, 1, ?2) \
         ON CONFLICT (stream) DO UPDATE SET n = n + 1, last = excluded.last",
    )
    .bind(stream)
    .bind(seq)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

// ---------- raw loops: the adapter's statements, issued directly ----------

async fn raw_append(c: &mut SqliteConnection, stream: &str, events: &[NewEvent]) {
    let mut tx = c.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let head: Option<i64> = sqlx::query_scalar("SELECT head FROM streams WHERE stream = ?1")
        .bind(stream)
        .fetch_optional(&mut *tx)
        .await
        .unwrap();
    let head = head.unwrap_or(0);
    let now: i64 = sqlx::query_scalar(concat!("SELECT ", now!()))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let mut i = 0;
    while i < events.len() {
        let n = (events.len() - i).min(64);
        let n = 1 << (usize::BITS - 1 - n.leading_zeros());
        let rows = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?)"; n].join(", ");
        let sql = format!(
            "INSERT INTO events (stream, seq, event_type, intent, payload, payload_hash, recorded_at, \
             correlation_id, causation_id) VALUES {rows}"
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (j, e) in events[i..i + n].iter().enumerate() {
            q = q
                .bind(stream)
                .bind(head + 1 + (i + j) as i64)
                .bind(e.event_type.as_str())
                .bind(e.intent.as_str())
                .bind(e.payload.as_slice())
                .bind(PayloadHash::of(&e.payload).0.to_vec())
                .bind(now)
                .bind(None::<&str>)
                .bind(None::<&str>);
        }
        q.execute(&mut *tx).await.unwrap();
        i += n;
    }
    let last = head + events.len() as i64;
    sqlx::query(
        "INSERT INTO outbox (stream, seq, event_type, status, attempt_count, next_attempt_at, last_error, \
         updated_at) SELECT stream, seq, event_type, 'pending', 0, ?4, NULL, ?4 FROM events \
         WHERE stream = ?1 AND seq BETWEEN ?2 AND ?3",
    )
    .bind(stream)
    .bind(head + 1)
    .bind(last)
    .bind(now)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outbox_heads (stream, head_seq, due_at) VALUES (?1, ?2, ?3) ON CONFLICT (stream) DO NOTHING",
    )
    .bind(stream)
    .bind(head + 1)
    .bind(now)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query("INSERT INTO streams (stream, head) VALUES (?1, ?2) ON CONFLICT (stream) DO UPDATE SET head = excluded.head")
        .bind(stream)
        .bind(last)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

async fn raw_claim(c: &mut SqliteConnection, stream: &str, owner: &str, epoch: i64, max: i64) -> Vec<i64> {
    let mut tx = c.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let ok: i64 = sqlx::query_scalar(concat!(
        "SELECT EXISTS (SELECT 1 FROM stream_leases WHERE stream = ?1 AND owner = ?2 AND epoch = ?3 AND expires_at > ",
        now!(),
        ")"
    ))
    .bind(stream)
    .bind(owner)
    .bind(epoch)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(ok, 1);
    let run: Vec<(i64, String, bool)> = sqlx::query_as(concat!(
        "SELECT seq, status, next_attempt_at <= ",
        now!(),
        " FROM outbox WHERE stream = ?1 ORDER BY seq LIMIT ?2"
    ))
    .bind(stream)
    .bind(max)
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let mut through = None;
    for (i, (seq, status, due)) in run.iter().enumerate() {
        if *seq != run[0].0 + i as i64 || status == "dead" || !due {
            break;
        }
        through = Some(*seq);
    }
    let mut out = Vec::new();
    if let Some(t) = through {
        let rows: Vec<(String, i64, String, String, i64, i64, Option<String>, i64)> =
            sqlx::query_as(concat!(
                "UPDATE outbox SET status = 'processing', updated_at = ",
                now!(),
                " WHERE stream = ?1 AND seq BETWEEN ?2 AND ?3 RETURNING stream, seq, event_type, status, \
             attempt_count, next_attempt_at, last_error, updated_at"
            ))
            .bind(stream)
            .bind(run[0].0)
            .bind(t)
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        out = rows.into_iter().map(|r| r.1).collect();
        out.sort_unstable();
    }
    tx.commit().await.unwrap();
    out
}

async fn raw_abandon(c: &mut SqliteConnection, stream: &str, owner: &str, epoch: i64) {
    let mut tx = c.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let ok: i64 = sqlx::query_scalar(concat!(
        "SELECT EXISTS (SELECT 1 FROM stream_leases WHERE stream = ?1 AND owner = ?2 AND epoch = ?3 AND expires_at > ",
        now!(),
        ")"
    ))
    .bind(stream)
    .bind(owner)
    .bind(epoch)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(ok, 1);
    let n = sqlx::query(concat!(
        "UPDATE outbox INDEXED BY outbox_processing SET status = 'pending', updated_at = ",
        now!(),
        " WHERE stream = ?1 AND status = 'processing'"
    ))
    .bind(stream)
    .execute(&mut *tx)
    .await
    .unwrap()
    .rows_affected();
    if n > 0 {
        raw_refresh_head(&mut tx, stream).await;
    }
    tx.commit().await.unwrap();
}

async fn raw_refresh_head(tx: &mut SqliteConnection, stream: &str) {
    sqlx::query(
        "INSERT INTO outbox_heads (stream, head_seq, due_at) SELECT stream, seq, CASE WHEN status = 'dead' \
         THEN NULL ELSE next_attempt_at END FROM outbox WHERE stream = ?1 ORDER BY seq LIMIT 1 \
         ON CONFLICT (stream) DO UPDATE SET head_seq = excluded.head_seq, due_at = excluded.due_at",
    )
    .bind(stream)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "DELETE FROM outbox_heads WHERE stream = ?1 AND NOT EXISTS (SELECT 1 FROM outbox WHERE stream = ?1)",
    )
    .bind(stream)
    .execute(&mut *tx)
    .await
    .unwrap();
}

/// One raw drain step; returns events completed.
async fn raw_drain_step(f: &mut Fixture, batch: i64) -> u64 {
    let due: Vec<String> = sqlx::query_scalar(concat!(
        "SELECT h.stream FROM outbox_heads h LEFT JOIN stream_leases l ON l.stream = h.stream \
         WHERE h.due_at IS NOT NULL AND h.due_at <= ",
        now!(),
        " AND (l.owner IS NULL OR l.expires_at <= ",
        now!(),
        ") ORDER BY h.due_at, h.stream LIMIT 1"
    ))
    .fetch_all(&mut f.raw_j)
    .await
    .unwrap();
    let stream = &due[0];
    let mut tx = f.raw_j.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let (owner, epoch): (String, i64) = sqlx::query_as(concat!(
        "INSERT INTO stream_leases (stream, owner, epoch, expires_at) VALUES (?1, ?2, 1, ",
        now!(),
        " + ?3) ON CONFLICT (stream) DO UPDATE SET epoch = CASE WHEN stream_leases.owner = excluded.owner \
         AND stream_leases.expires_at > ",
        now!(),
        " THEN stream_leases.epoch ELSE stream_leases.epoch + 1 END, owner = excluded.owner, \
         expires_at = excluded.expires_at WHERE stream_leases.owner IS NULL OR stream_leases.owner = excluded.owner \
         OR stream_leases.expires_at <= ",
        now!(),
        " RETURNING owner, epoch"
    ))
    .bind(stream)
    .bind("raw")
    .bind(30_000i64)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let seqs = raw_claim(&mut f.raw_j, stream, &owner, epoch, batch).await;
    let events: Vec<(
        i64,
        String,
        i64,
        String,
        String,
        Vec<u8>,
        Vec<u8>,
        i64,
        Option<String>,
        Option<String>,
    )> = sqlx::query_as(
        "SELECT global_position, stream, seq, event_type, intent, payload, payload_hash, recorded_at, \
             correlation_id, causation_id FROM events WHERE stream = ?1 AND seq >= ?2 ORDER BY seq LIMIT ?3",
    )
    .bind(stream)
    .bind(seqs[0])
    .bind(seqs.len() as i64)
    .fetch_all(&mut f.raw_j)
    .await
    .unwrap();
    for e in &events {
        assert_eq!(PayloadHash::of(&e.5).0.as_slice(), e.6.as_slice());
    }
    let last = events[events.len() - 1].2;
    // Projection transaction.
    let mut tx = f.raw_p.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let cp: Option<i64> = sqlx::query_scalar(
        "SELECT last_applied FROM outbox_checkpoints WHERE projection = ?1 AND stream = ?2",
    )
    .bind("upsert")
    .bind(stream)
    .fetch_optional(&mut *tx)
    .await
    .unwrap();
    let cp = cp.unwrap_or(0);
    for e in &events {
        upsert(&mut tx, stream, e.2).await.unwrap();
    }
    sqlx::query(concat!(
        "INSERT INTO outbox_checkpoints (projection, stream, last_applied, updated_at) VALUES (?1, ?2, ?3, ",
        now!(),
        ") ON CONFLICT (projection, stream) DO UPDATE SET last_applied = excluded.last_applied, \
         updated_at = excluded.updated_at WHERE outbox_checkpoints.last_applied = ?4"
    ))
    .bind("upsert")
    .bind(stream)
    .bind(last)
    .bind(cp)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(concat!(
        "INSERT INTO outbox_watermarks (stream, applied_through, updated_at) VALUES (?1, ?2, ",
        now!(),
        ") ON CONFLICT (stream) DO UPDATE SET applied_through = excluded.applied_through, \
         updated_at = excluded.updated_at WHERE excluded.applied_through > outbox_watermarks.applied_through"
    ))
    .bind(stream)
    .bind(last)
    .execute(&mut *tx)
    .await
    .unwrap();
    let _: (String, i64, i64) =
        sqlx::query_as("SELECT stream, applied_through, updated_at FROM outbox_watermarks WHERE stream = ?1")
            .bind(stream)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    tx.commit().await.unwrap();
    // Complete.
    let mut tx = f.raw_j.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let n = sqlx::query("DELETE FROM outbox WHERE stream = ?1 AND seq <= ?2")
        .bind(stream)
        .bind(last)
        .execute(&mut *tx)
        .await
        .unwrap()
        .rows_affected();
    raw_refresh_head(&mut tx, stream).await;
    tx.commit().await.unwrap();
    // Release.
    let mut tx = f.raw_j.begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query(concat!(
        "UPDATE stream_leases SET owner = NULL, expires_at = ",
        now!(),
        " WHERE stream = ?1 AND owner = ?2 AND epoch = ?3 AND expires_at > ",
        now!()
    ))
    .bind(stream)
    .bind(&owner)
    .bind(epoch)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    n
}

async fn adapter_drain_step(f: &Fixture, projections: &[Arc<dyn Projection<SqliteTx>>], batch: usize) -> u64 {
    let owner = WorkerId::new("adapter").unwrap();
    let due = f.journal.due_streams(1).await.unwrap();
    let stream = &due[0];
    let lease = f
        .journal
        .acquire(stream, &owner, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let rows = f.journal.claim(&lease, batch).await.unwrap();
    let events = f
        .journal
        .read_stream(stream, rows[0].seq, rows.len())
        .await
        .unwrap();
    let out = f.store.apply(stream, &events, projections).await.unwrap();
    assert!(matches!(out, ApplyOutcome::Applied(_)));
    let n = f
        .journal
        .complete(stream, rows[rows.len() - 1].seq)
        .await
        .unwrap();
    f.journal.release(&lease).await.unwrap();
    n
}

/// Fills `streams` streams (prefix) with `per` events each, about 1000 events per append.
async fn prefill(j: &SqliteJournal, prefix: &str, streams: u64, per: u64) {
    let mut batch = Vec::new();
    let mut n = 0;
    for s in 0..streams {
        let mut left = per;
        while left > 0 {
            let take = left.min(1000);
            batch.push(AppendRequest::new(
                sid(prefix, s),
                ExpectedVersion::Any,
                (0..take).map(ev).collect(),
            ));
            n += take;
            left -= take;
            if n >= 1000 {
                j.append(&batch, AppendOptions::enqueue()).await.unwrap();
                batch.clear();
                n = 0;
            }
        }
    }
    if !batch.is_empty() {
        j.append(&batch, AppendOptions::enqueue()).await.unwrap();
    }
}

fn w1_append(c: &mut Criterion, rt: &Runtime) {
    let mut g = c.benchmark_group("W1 append+enqueue");
    for per in [1u64, 10, 100] {
        let name = format!("W1 append {per}/txn");
        let events: Vec<NewEvent> = (0..per).map(ev).collect();
        let mut f = rt.block_on(fixture());
        let mut k = 0u64;
        g.bench_function(format!("adapter/{per}"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        k += 1;
                        let req =
                            AppendRequest::new(sid("a", k % 1000), ExpectedVersion::Any, events.clone());
                        f.journal.append(&[req], AppendOptions::enqueue()).await.unwrap();
                    }
                    let t = start.elapsed();
                    record(&name, "adapter", t / iters as u32, per);
                    t
                })
            })
        });
        g.bench_function(format!("raw/{per}"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        k += 1;
                        raw_append(&mut f.raw_j, sid("r", k % 1000).as_str(), &events).await;
                    }
                    let t = start.elapsed();
                    record(&name, "raw", t / iters as u32, per);
                    t
                })
            })
        });
    }
    g.finish();
}

fn w2_drain(c: &mut Criterion, rt: &Runtime) {
    let mut g = c.benchmark_group("W2 drain step");
    let upsert: Arc<dyn Projection<SqliteTx>> = Arc::new(Upsert(ProjectionName::new("upsert").unwrap()));
    let projections = vec![upsert];
    for batch in [1u64, 64] {
        let name = format!("W2 drain batch {batch}");
        let mut f = rt.block_on(fixture());
        rt.block_on(f.store.setup(&projections)).unwrap();
        let mut round = 0u64;
        g.bench_function(format!("adapter/{batch}"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    round += 1;
                    prefill(&f.journal, &format!("a{round}"), iters, batch).await;
                    let start = Instant::now();
                    let mut n = 0;
                    for _ in 0..iters {
                        n += adapter_drain_step(&f, &projections, batch as usize).await;
                    }
                    let t = start.elapsed();
                    assert_eq!(n, iters * batch);
                    record(&name, "adapter", t / iters as u32, batch);
                    t
                })
            })
        });
        g.bench_function(format!("raw/{batch}"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    round += 1;
                    prefill(&f.journal, &format!("r{round}"), iters, batch).await;
                    let start = Instant::now();
                    let mut n = 0;
                    for _ in 0..iters {
                        n += raw_drain_step(&mut f, batch as i64).await;
                    }
                    let t = start.elapsed();
                    assert_eq!(n, iters * batch);
                    record(&name, "raw", t / iters as u32, batch);
                    t
                })
            })
        });
    }
    g.finish();
}

fn w4_claim(c: &mut Criterion, rt: &Runtime) {
    let mut g = c.benchmark_group("W4 head claim");
    for backlog in [1_000u64, 100_000] {
        let name = format!("W4 claim+abandon, {backlog} pending");
        let mut f = rt.block_on(fixture());
        // One stream with the whole backlog behind its head, plus 100 others.
        rt.block_on(async {
            prefill(&f.journal, "deep", 1, backlog).await;
            prefill(&f.journal, "other", 100, 10).await;
        });
        let s = sid("deep", 0);
        let owner = WorkerId::new("bench").unwrap();
        let lease = rt
            .block_on(f.journal.acquire(&s, &owner, Duration::from_secs(3600)))
            .unwrap()
            .unwrap();
        g.bench_function(format!("adapter/{backlog}"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let rows = f.journal.claim(&lease, 1).await.unwrap();
                        assert_eq!(rows.len(), 1);
                        f.journal.abandon(&lease).await.unwrap();
                    }
                    let t = start.elapsed();
                    record(&name, "adapter", t / iters as u32, 1);
                    t
                })
            })
        });
        let epoch = lease.epoch as i64;
        g.bench_function(format!("raw/{backlog}"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let rows = raw_claim(&mut f.raw_j, s.as_str(), "bench", epoch, 1).await;
                        assert_eq!(rows.len(), 1);
                        raw_abandon(&mut f.raw_j, s.as_str(), "bench", epoch).await;
                    }
                    let t = start.elapsed();
                    record(&name, "raw", t / iters as u32, 1);
                    t
                })
            })
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    w1_append(c, &rt);
    w2_drain(c, &rt);
    w4_claim(c, &rt);
}

fn print_table() {
    let r = RESULTS.lock().unwrap();
    let workloads: Vec<&String> = {
        let mut v: Vec<&String> = r.keys().map(|(w, _)| w).collect();
        v.dedup();
        v
    };
    println!();
    println!("| workload | adapter | raw sqlx | adapter/raw time |");
    println!("|---|---|---|---|");
    for w in workloads {
        let a = r.get(&(w.clone(), "adapter"));
        let b = r.get(&(w.clone(), "raw"));
        let fmt = |x: Option<&(Duration, u64)>| match x {
            Some((t, ev)) => format!(
                "{:.1} µs/op, {:.0} events/s",
                t.as_secs_f64() * 1e6,
                *ev as f64 / t.as_secs_f64()
            ),
            None => "-".into(),
        };
        let ratio = match (a, b) {
            (Some((ta, _)), Some((tb, _))) => format!("{:.2}", ta.as_secs_f64() / tb.as_secs_f64()),
            _ => "-".into(),
        };
        println!("| {w} | {} | {} | {ratio} |", fmt(a), fmt(b));
    }
}

criterion_group! {
    name = group;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1500))
        .without_plots();
    targets = benches
}

fn main() {
    group();
    Criterion::default().configure_from_args().final_summary();
    print_table();
}
