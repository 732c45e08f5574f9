//! W3: end-to-end lag from append to applied on SQLite at a steady offered
//! rate (open loop: lag is measured from each event's *scheduled* send
//! time, so a slow append cannot hide lag), with wake-on-append and with
//! polling only. Prints a table; checks every stream applied 1..=head.
//!
//! `cargo bench -p outbox-runtime --bench lag` (OUTBOX_BENCH_RATE,
//! OUTBOX_BENCH_SECONDS override the defaults: 200 events/s for 5 s).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::{
    BoxError, DigestBuilder, Event, EventTypeRegistry, ExpectedVersion, OutboxInspector, Projection,
    ProjectionName, StreamId, async_trait,
};
use outbox_runtime::{Config, Outbox};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore, SqliteTx, digest_table};

/// Records when each event was applied, and upserts a row like a real projection.
struct Probe {
    name: ProjectionName,
    applied: Arc<Mutex<HashMap<(String, u64), Instant>>>,
}

#[async_trait]
impl Projection<SqliteTx> for Probe {
    fn name(&self) -> &ProjectionName {
        &self.name
    }
    async fn setup(&self, tx: &mut SqliteTx) -> Result<(), BoxError> {
        tx.run(|conn| {
            conn.execute_batch(
                "CREATE TABLE IF NOT EXISTS probe (stream TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID",
            )
        })
        .await?;
        Ok(())
    }
    async fn apply(&self, tx: &mut SqliteTx, e: &Event) -> Result<(), BoxError> {
        let stream = e.stream.as_str().to_owned();
        tx.run(move |conn| {
            conn.execute(
                "INSERT INTO probe (stream, n) VALUES (?1, 1) ON CONFLICT (stream) DO UPDATE SET n = n + 1",
                [stream],
            )
        })
        .await?;
        self.applied
            .lock()
            .map_err(|_| "poisoned")?
            .insert((e.stream.to_string(), e.seq.get()), Instant::now());
        Ok(())
    }
    async fn reset(&self, tx: &mut SqliteTx) -> Result<(), BoxError> {
        tx.run(|conn| conn.execute_batch("DELETE FROM probe")).await?;
        Ok(())
    }
    async fn digest(&self, tx: &mut SqliteTx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        digest_table(tx, "probe", out).await?;
        Ok(())
    }
}

struct Lag {
    p50: Duration,
    p99: Duration,
    max: Duration,
    events: usize,
}

fn env_u64(k: &str, default: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn run(wake: bool, rate: u64, seconds: u64) -> Lag {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = SqliteJournal::open(dir.path().join("j.db"), SqliteOptions::default())
        .await
        .expect("journal");
    let store = SqliteProjectionStore::open(dir.path().join("p.db"), SqliteOptions::default())
        .await
        .expect("store");
    let applied = Arc::new(Mutex::new(HashMap::new()));
    let probe = Arc::new(Probe {
        name: ProjectionName::new("probe").expect("name"),
        applied: applied.clone(),
    });
    let mut types = EventTypeRegistry::new();
    types.apply("tick").expect("type");
    let rt = Outbox::builder(journal, store)
        .config(
            Config::apply_worker()
                .with_wake_on_append(wake)
                .with_repair_on_start(false),
        )
        .event_types(types)
        .projection(probe)
        .build()
        .await
        .expect("runtime");
    let running = rt.start().await.expect("start");
    let streams: Vec<StreamId> = (0..20)
        .map(|i| StreamId::new(format!("s{i:02}")).expect("id"))
        .collect();
    let total = (rate * seconds) as usize;
    let interval = Duration::from_nanos(1_000_000_000 / rate);
    let t0 = Instant::now() + Duration::from_millis(50);
    let mut scheduled = HashMap::with_capacity(total);
    let mut heads = vec![0u64; streams.len()];
    for i in 0..total {
        let at = t0 + interval * i as u32;
        tokio::time::sleep_until(at.into()).await;
        let s = i % streams.len();
        heads[s] += 1;
        let ev = rt.event("tick", vec![]).expect("event");
        rt.append(&streams[s], ExpectedVersion::Exact(heads[s] - 1), vec![ev])
            .await
            .expect("append");
        scheduled.insert((streams[s].to_string(), heads[s]), at);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while rt.journal().summary().await.expect("summary").total() > 0 {
        assert!(Instant::now() < deadline, "not drained");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.shutdown().await;
    let applied = applied.lock().expect("lock");
    // Correctness: every scheduled event applied exactly once (the map has one entry each).
    assert_eq!(applied.len(), total, "every event applied once");
    let mut lags: Vec<Duration> = scheduled
        .iter()
        .map(|(k, at)| applied.get(k).expect("applied").saturating_duration_since(*at))
        .collect();
    lags.sort();
    let pick = |q: f64| lags[((lags.len() as f64 - 1.0) * q).round() as usize];
    Lag {
        p50: pick(0.50),
        p99: pick(0.99),
        max: *lags.last().expect("some"),
        events: total,
    }
}

fn main() {
    let rate = env_u64("OUTBOX_BENCH_RATE", 200);
    let seconds = env_u64("OUTBOX_BENCH_SECONDS", 5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let with = rt.block_on(run(true, rate, seconds));
    let without = rt.block_on(run(false, rate, seconds));
    println!(
        "W3 lag, SQLite (synchronous=FULL), {rate} events/s for {seconds}s over 20 streams, poll interval 2s"
    );
    println!("| mode | events | p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    for (name, l) in [("wake on append", &with), ("polling only", &without)] {
        println!(
            "| {name} | {} | {:.2?} | {:.2?} | {:.2?} |",
            l.events, l.p50, l.p99, l.max
        );
    }
    println!(
        "ratio polling/wake: p50 {:.0}x, p99 {:.0}x",
        without.p50.as_secs_f64() / with.p50.as_secs_f64().max(1e-9),
        without.p99.as_secs_f64() / with.p99.as_secs_f64().max(1e-9)
    );
}
