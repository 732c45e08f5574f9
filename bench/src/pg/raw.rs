//! The plain client loop on Postgres: the same work as the outbox, written
//! by hand with `sqlx`, one statement per row, in its own schema.

use std::time::Instant;

use anyhow::{Result, ensure};
use outbox_postgres::sqlx::{self, Connection as _, PgConnection, Row as _};

use crate::fixture::{payload, stream_name};

async fn connect(url: &str) -> Result<PgConnection> {
    Ok(PgConnection::connect(url).await?)
}

pub(crate) async fn drop_schema(url: &str, schema: &str) -> Result<()> {
    let mut c = connect(url).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE"
    )))
    .execute(&mut c)
    .await?;
    Ok(())
}

/// A connection whose `search_path` is a fresh schema holding the raw
/// tables (journal and projection side).
async fn create(url: &str, schema: &str) -> Result<PgConnection> {
    let mut c = connect(url).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {schema}; SET search_path TO {schema};
         CREATE TABLE streams (stream text PRIMARY KEY, head bigint NOT NULL);
         CREATE TABLE events (id bigserial PRIMARY KEY, stream text NOT NULL, seq bigint NOT NULL,
           event_type text NOT NULL, payload bytea NOT NULL, recorded_at bigint NOT NULL, UNIQUE (stream, seq));
         CREATE TABLE outbox (stream text NOT NULL, seq bigint NOT NULL, status text NOT NULL,
           next_at bigint NOT NULL, PRIMARY KEY (stream, seq));
         CREATE TABLE checkpoints (stream text PRIMARY KEY, last bigint NOT NULL);
         CREATE TABLE docs (stream text PRIMARY KEY, doc text NOT NULL);"
    )))
    .execute(&mut c)
    .await?;
    Ok(c)
}

/// One event appended to `stream` inside the open transaction: the head
/// bumped (and locked), the event, its outbox row.
async fn append_one(c: &mut PgConnection, stream: &str, i: u64) -> Result<()> {
    let seq: i64 = sqlx::query_scalar(
        "INSERT INTO streams (stream, head) VALUES ($1, 1) \
         ON CONFLICT (stream) DO UPDATE SET head = streams.head + 1 RETURNING head",
    )
    .bind(stream)
    .fetch_one(&mut *c)
    .await?;
    sqlx::query(
        "INSERT INTO events (stream, seq, event_type, payload, recorded_at) \
         VALUES ($1, $2, 'bench.event', $3, (extract(epoch from clock_timestamp()) * 1000)::bigint)",
    )
    .bind(stream)
    .bind(seq)
    .bind(payload(i))
    .execute(&mut *c)
    .await?;
    sqlx::query(
        "INSERT INTO outbox (stream, seq, status, next_at) \
         VALUES ($1, $2, 'pending', (extract(epoch from clock_timestamp()) * 1000)::bigint)",
    )
    .bind(stream)
    .bind(seq)
    .execute(&mut *c)
    .await?;
    Ok(())
}

pub(crate) async fn append_round(url: &str, schema: &str, total: u64, per_txn: u64) -> Result<f64> {
    let mut c = create(url, schema).await?;
    let names: Vec<String> = (0..super::setup::STREAMS).map(|s| stream_name("a", s)).collect();
    let t = Instant::now();
    let mut i = 0u64;
    while i < total {
        let mut tx = c.begin().await?;
        for _ in 0..per_txn.min(total - i) {
            append_one(&mut tx, &names[(i % super::setup::STREAMS) as usize], i).await?;
            i += 1;
        }
        tx.commit().await?;
    }
    let rate = total as f64 / t.elapsed().as_secs_f64();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&mut c)
        .await?;
    ensure!(
        n as u64 == total,
        "plain client: expected {total} outbox rows, got {n}"
    );
    drop(c);
    drop_schema(url, schema).await?;
    Ok(rate)
}

/// Claims the head run of `s` (at most `max` rows): select, then mark
/// processing.
async fn claim(tx: &mut PgConnection, s: &str, max: i64) -> Result<Vec<i64>> {
    let seqs: Vec<i64> = sqlx::query_scalar(
        "SELECT seq FROM outbox WHERE stream = $1 ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED",
    )
    .bind(s)
    .bind(max)
    .fetch_all(&mut *tx)
    .await?;
    if let (Some(&first), Some(&last)) = (seqs.first(), seqs.last()) {
        sqlx::query("UPDATE outbox SET status = 'processing' WHERE stream = $1 AND seq BETWEEN $2 AND $3")
            .bind(s)
            .bind(first)
            .bind(last)
            .execute(&mut *tx)
            .await?;
    }
    Ok(seqs)
}

/// The events `first..=last` of `s`: (seq, payload bytes).
async fn load(c: &mut PgConnection, s: &str, first: i64, last: i64) -> Result<Vec<(i64, usize)>> {
    let rows = sqlx::query(
        "SELECT seq, payload FROM events WHERE stream = $1 AND seq BETWEEN $2 AND $3 ORDER BY seq",
    )
    .bind(s)
    .bind(first)
    .bind(last)
    .fetch_all(c)
    .await?;
    rows.iter()
        .map(|e| Ok((e.try_get(0)?, e.try_get::<Vec<u8>, _>(1)?.len())))
        .collect()
}

/// Applies a run inside the caller's transaction: checkpoint
/// compare-and-set, one upsert per event.
async fn apply(tx: &mut PgConnection, s: &str, events: &[(i64, usize)]) -> Result<()> {
    let (first, last) = (events[0].0, events[events.len() - 1].0);
    let moved = sqlx::query(
        "INSERT INTO checkpoints (stream, last) VALUES ($1, $3) \
         ON CONFLICT (stream) DO UPDATE SET last = $3 WHERE checkpoints.last = $2",
    )
    .bind(s)
    .bind(first - 1)
    .bind(last)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    ensure!(moved == 1, "plain client: checkpoint of {s} moved");
    for (seq, bytes) in events {
        sqlx::query("INSERT INTO docs (stream, doc) VALUES ($1, $2) ON CONFLICT (stream) DO UPDATE SET doc = excluded.doc")
            .bind(s)
            .bind(format!("{{\"seq\":{seq},\"bytes\":{bytes}}}"))
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}

async fn ack(tx: &mut PgConnection, s: &str, last: i64) -> Result<()> {
    sqlx::query("DELETE FROM outbox WHERE stream = $1 AND seq <= $2")
        .bind(s)
        .bind(last)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The drain of a pre-filled backlog, timed. With `sweep` `None`, one
/// stream at a time: claim, load, apply, ack, three transactions per stream
/// run (the worker's per-stream passes). With `Some((rows, streams))`, in
/// sweeps like the worker's: one transaction claims the runs of the next
/// streams (at most `batch` rows each, `streams` streams, `rows` rows), one
/// applies them all, one acks them all.
pub(crate) async fn drain_round(
    url: &str,
    schema: &str,
    streams: u64,
    per_stream: u64,
    batch: i64,
    sweep: Option<(i64, usize)>,
) -> Result<f64> {
    let mut c = create(url, schema).await?;
    let names: Vec<String> = (0..streams).map(|s| stream_name("d", s)).collect();
    let mut i = 0;
    for _ in 0..per_stream {
        let mut tx = c.begin().await?;
        for s in &names {
            append_one(&mut tx, s, i).await?;
            i += 1;
        }
        tx.commit().await?;
    }
    let total = streams * per_stream;
    let t = Instant::now();
    let (sweep_rows, sweep_streams) = sweep.unwrap_or((batch, 1));
    let mut live: std::collections::VecDeque<&str> = names.iter().map(String::as_str).collect();
    let mut applied = 0u64;
    while !live.is_empty() {
        let mut taken: Vec<(&str, Vec<i64>)> = Vec::new();
        let mut rows = 0;
        let mut tx = c.begin().await?;
        while taken.len() < sweep_streams && rows < sweep_rows {
            let Some(s) = live.pop_front() else { break };
            let seqs = claim(&mut tx, s, batch.min(sweep_rows - rows)).await?;
            if !seqs.is_empty() {
                rows += seqs.len() as i64;
                taken.push((s, seqs));
            }
        }
        tx.commit().await?;
        let mut runs = Vec::with_capacity(taken.len());
        for (s, seqs) in &taken {
            runs.push(load(&mut c, s, seqs[0], seqs[seqs.len() - 1]).await?);
        }
        let mut tx = c.begin().await?;
        for ((s, _), events) in taken.iter().zip(&runs) {
            apply(&mut tx, s, events).await?;
        }
        tx.commit().await?;
        let mut tx = c.begin().await?;
        for (s, seqs) in &taken {
            ack(&mut tx, s, seqs[seqs.len() - 1]).await?;
        }
        tx.commit().await?;
        for (s, seqs) in taken {
            applied += seqs.len() as u64;
            let more: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox WHERE stream = $1)")
                .bind(s)
                .fetch_one(&mut c)
                .await?;
            if more {
                live.push_back(s);
            }
        }
    }
    let rate = total as f64 / t.elapsed().as_secs_f64();
    ensure!(
        applied == total,
        "plain client drain applied {applied} of {total}"
    );
    let last: Vec<i64> = sqlx::query_scalar("SELECT last FROM checkpoints ORDER BY stream")
        .fetch_all(&mut c)
        .await?;
    ensure!(
        last.len() as u64 == streams && last.iter().all(|l| *l as u64 == per_stream),
        "plain client: checkpoints off"
    );
    drop(c);
    drop_schema(url, schema).await?;
    Ok(rate)
}
