//! The plain client loop on Postgres: what a careful engineer writes by
//! hand with `sqlx` for the outbox's guarantee, each batch one statement
//! (issue 43): an append of any number of events is one statement that
//! inserts the events and their outbox rows, the stream versions checked
//! (a taken seq fails the unique key, a gap fails the statement), so it
//! commits or writes nothing in one round trip; a drain sweep claims the
//! head runs of its streams in one statement, reads their events in one,
//! applies them in one transaction (the checkpoints' compare-and-set in
//! one statement, the documents in another) and deletes them in one.
//! Runs in its own schema, at the server's durability (the outbox's
//! appends and applies wait for the disk too).

use std::time::Instant;

use anyhow::{Result, ensure};
use outbox_postgres::sqlx::{self, Connection as _, PgConnection, Row as _};

use crate::fixture::{payload, stream_name};

/// How long a claim holds its rows (the lease), in ms.
const CLAIM_MS: i64 = 30_000;

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
         CREATE TABLE events (position bigserial PRIMARY KEY, stream text NOT NULL, seq bigint NOT NULL,
           event_type text NOT NULL, payload bytea NOT NULL, recorded_at bigint NOT NULL, UNIQUE (stream, seq));
         CREATE TABLE outbox (stream text NOT NULL, seq bigint NOT NULL, available_at bigint NOT NULL,
           PRIMARY KEY (stream, seq));
         CREATE TABLE checkpoints (stream text PRIMARY KEY, last bigint NOT NULL);
         CREATE TABLE docs (stream text PRIMARY KEY, doc text NOT NULL);"
    )))
    .execute(&mut c)
    .await?;
    Ok(c)
}

/// Appends one event to each `(stream, seq)` (distinct streams, `seq` the
/// stream's next) in one statement: the events, then their outbox rows. A
/// seq already taken fails the unique key; a seq past the stream's next
/// leaves a row out, and the last step then divides by zero, failing the
/// statement: it commits all or nothing, in one round trip.
async fn append(c: &mut PgConnection, streams: &[&str], seqs: &[i64], first_payload: u64) -> Result<()> {
    let payloads: Vec<Vec<u8>> = (0..streams.len() as u64)
        .map(|k| payload(first_payload + k))
        .collect();
    let written = sqlx::query(
        "WITH req AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[]) AS r(stream, seq, payload)),
              ev AS (INSERT INTO events (stream, seq, event_type, payload, recorded_at)
                     SELECT r.stream, r.seq, 'bench.event', r.payload,
                            (extract(epoch from clock_timestamp()) * 1000)::bigint
                       FROM req r
                      WHERE r.seq = 1
                         OR EXISTS (SELECT 1 FROM events e WHERE e.stream = r.stream AND e.seq = r.seq - 1)
                     RETURNING stream, seq),
              ok AS (SELECT 1 / (CASE WHEN (SELECT count(*) FROM ev) = cardinality($1) THEN 1 ELSE 0 END) AS one)
         INSERT INTO outbox (stream, seq, available_at)
         SELECT ev.stream, ev.seq, (extract(epoch from clock_timestamp()) * 1000)::bigint FROM ev, ok",
    )
    .bind(streams)
    .bind(seqs)
    .bind(&payloads)
    .execute(&mut *c)
    .await?
    .rows_affected();
    ensure!(
        written as usize == streams.len(),
        "plain client: appended {written} of {}",
        streams.len()
    );
    Ok(())
}

/// Appends `total` events, `per_txn` a statement, to 100 streams round robin.
pub(crate) async fn append_round(url: &str, schema: &str, total: u64, per_txn: u64) -> Result<f64> {
    ensure!(
        per_txn <= super::setup::STREAMS,
        "one event per stream per statement"
    );
    let mut c = create(url, schema).await?;
    let names: Vec<String> = (0..super::setup::STREAMS).map(|s| stream_name("a", s)).collect();
    let mut versions = vec![0i64; names.len()];
    let (mut streams, mut seqs) = (Vec::new(), Vec::new());
    let t = Instant::now();
    let mut i = 0u64;
    while i < total {
        let n = per_txn.min(total - i);
        streams.clear();
        seqs.clear();
        for k in 0..n {
            let s = ((i + k) % super::setup::STREAMS) as usize;
            versions[s] += 1;
            streams.push(names[s].as_str());
            seqs.push(versions[s]);
        }
        append(&mut c, &streams, &seqs, i).await?;
        i += n;
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

/// Claims the head runs of `streams` (at most `max` rows each, `rows` in
/// all) in one statement: a stream's first rows, only when its first row
/// is free and due, locked against other claimers. Returns (stream, seq)
/// pairs by stream then seq.
async fn claim(c: &mut PgConnection, streams: &[&str], max: i64, rows: i64) -> Result<Vec<(String, i64)>> {
    let claimed = sqlx::query(
        "WITH now AS (SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint AS ms),
              pick AS (SELECT c.stream, c.seq
                         FROM unnest($1::text[]) WITH ORDINALITY AS s(stream, ord), now,
                              LATERAL (SELECT o.stream, o.seq FROM outbox o
                                        WHERE o.stream = s.stream AND o.available_at <= now.ms
                                          AND (SELECT h.available_at FROM outbox h WHERE h.stream = s.stream
                                                ORDER BY h.seq LIMIT 1) <= now.ms
                                        ORDER BY o.seq LIMIT $2 FOR UPDATE SKIP LOCKED) c
                        ORDER BY s.ord, c.seq LIMIT $3)
         UPDATE outbox o SET available_at = now.ms + $4 FROM pick, now
          WHERE o.stream = pick.stream AND o.seq = pick.seq
         RETURNING o.stream, o.seq",
    )
    .bind(streams)
    .bind(max)
    .bind(rows)
    .bind(CLAIM_MS)
    .fetch_all(&mut *c)
    .await?;
    let mut out: Vec<(String, i64)> = claimed
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_>>()?;
    let order: std::collections::HashMap<&str, usize> =
        streams.iter().enumerate().map(|(i, s)| (*s, i)).collect();
    out.sort_by_key(|(s, seq)| (order.get(s.as_str()).copied(), *seq));
    Ok(out)
}

/// The events of the claimed `(stream, first, last)` runs, in one
/// statement: (stream, seq, payload bytes) by stream then seq.
async fn load(c: &mut PgConnection, runs: &[(&str, i64, i64)]) -> Result<Vec<(String, i64, usize)>> {
    let streams: Vec<&str> = runs.iter().map(|r| r.0).collect();
    let firsts: Vec<i64> = runs.iter().map(|r| r.1).collect();
    let lasts: Vec<i64> = runs.iter().map(|r| r.2).collect();
    let rows = sqlx::query(
        "SELECT e.stream, e.seq, length(e.payload)
           FROM unnest($1::text[], $2::bigint[], $3::bigint[]) WITH ORDINALITY AS r(stream, first, last, ord)
           JOIN events e ON e.stream = r.stream AND e.seq BETWEEN r.first AND r.last
          ORDER BY r.ord, e.seq",
    )
    .bind(&streams)
    .bind(&firsts)
    .bind(&lasts)
    .fetch_all(&mut *c)
    .await?;
    rows.iter()
        .map(|e| Ok((e.try_get(0)?, e.try_get(1)?, e.try_get::<i32, _>(2)? as usize)))
        .collect()
}

/// The drain of a pre-filled backlog, timed. With `sweep` `None`, one
/// stream at a time: claim, load, apply, delete, each one statement (the
/// apply one transaction). With `Some((rows, streams))`, in sweeps like
/// the worker's: one statement claims the runs of the next streams (at
/// most `batch` rows each, `streams` streams, `rows` rows), one reads them,
/// one transaction applies them all, one statement deletes them all. A
/// stream that gave fewer rows than asked is done (the backlog is fixed
/// while it drains).
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
    for seq in 1..=per_stream as i64 {
        for chunk in names.chunks(100) {
            let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
            append(&mut c, &chunk, &vec![seq; chunk.len()], i).await?;
            i += chunk.len() as u64;
        }
    }
    let total = streams * per_stream;
    let t = Instant::now();
    let (sweep_rows, sweep_streams) = sweep.unwrap_or((batch, 1));
    let mut live: std::collections::VecDeque<&str> = names.iter().map(String::as_str).collect();
    let mut applied = 0u64;
    let mut pick: Vec<&str> = Vec::new();
    while !live.is_empty() {
        pick.clear();
        while pick.len() < sweep_streams
            && let Some(s) = live.pop_front()
        {
            pick.push(s);
        }
        let claimed = claim(&mut c, &pick, batch, sweep_rows).await?;
        // The runs, by stream in claim order: (stream, first, last).
        let mut runs: Vec<(&str, i64, i64)> = Vec::new();
        for (s, seq) in &claimed {
            match runs.last_mut() {
                Some(run) if run.0 == s.as_str() => run.2 = *seq,
                _ => {
                    let name = pick
                        .iter()
                        .copied()
                        .find(|p| *p == s.as_str())
                        .unwrap_or_default();
                    runs.push((name, *seq, *seq));
                }
            }
        }
        let events = load(&mut c, &runs).await?;
        ensure!(events.len() == claimed.len(), "plain client: events missing");
        let mut tx = c.begin().await?;
        let cas_streams: Vec<&str> = runs.iter().map(|r| r.0).collect();
        let cas_before: Vec<i64> = runs.iter().map(|r| r.1 - 1).collect();
        let cas_last: Vec<i64> = runs.iter().map(|r| r.2).collect();
        let moved = sqlx::query(
            "INSERT INTO checkpoints AS k (stream, last)
             SELECT stream, last FROM unnest($1::text[], $3::bigint[]) AS r(stream, last)
             ON CONFLICT (stream) DO UPDATE SET last = excluded.last
              WHERE k.last = ($2::bigint[])[array_position($1::text[], k.stream)]",
        )
        .bind(&cas_streams)
        .bind(&cas_before)
        .bind(&cas_last)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        ensure!(moved as usize == runs.len(), "plain client: a checkpoint moved");
        // Each event's document, the last of each stream's run written
        // (the outbox's view writes, too, reach the database once per
        // document per batch), in one statement.
        let (mut doc_streams, mut docs): (Vec<&str>, Vec<String>) = (Vec::new(), Vec::new());
        for (s, seq, bytes) in &events {
            let doc = format!("{{\"seq\":{seq},\"bytes\":{bytes}}}");
            if doc_streams.last() == Some(&s.as_str()) {
                *docs.last_mut().expect("a doc per stream") = doc;
            } else {
                doc_streams.push(s);
                docs.push(doc);
            }
        }
        sqlx::query(
            "INSERT INTO docs (stream, doc) SELECT * FROM unnest($1::text[], $2::text[])
             ON CONFLICT (stream) DO UPDATE SET doc = excluded.doc",
        )
        .bind(&doc_streams)
        .bind(&docs)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        sqlx::query(
            "DELETE FROM outbox o USING unnest($1::text[], $2::bigint[]) AS r(stream, last)
              WHERE o.stream = r.stream AND o.seq <= r.last",
        )
        .bind(&cas_streams)
        .bind(&cas_last)
        .execute(&mut c)
        .await?;
        applied += events.len() as u64;
        // A stream that filled its share may have more; the rest are done
        // (a stream the sweep's row cap cut short is asked again too).
        let mut rows_left = sweep_rows;
        for s in &pick {
            let got = runs.iter().find(|r| r.0 == *s).map_or(0, |r| r.2 - r.1 + 1);
            let asked = batch.min(rows_left.max(0));
            rows_left -= got;
            if got == asked {
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
