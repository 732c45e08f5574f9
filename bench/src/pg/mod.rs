//! The same shapes on Postgres: the outbox (`PgJournal` and a
//! `PgProjectionStore` sharing its schema, through the runtime) against a
//! plain client loop doing the same work with `sqlx` (each batch one
//! statement, as a careful engineer writes it by hand: see `raw`). Runs when
//! `OUTBOX_TEST_DATABASE_URL` names a server (`cargo xtask bench` starts a
//! throwaway one when it is not set); each round uses fresh schemas,
//! dropped afterwards.

pub(crate) mod lag;
mod raw;
mod setup;
mod sql_projection;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use outbox_core::{AppendRequest, ExpectedVersion};
use outbox_runtime::Config;

use crate::fixture::{self, Seen, stream};
use crate::report::{Better, Row};
use crate::run::Ctx;
use crate::workloads::ROUNDS;
use crate::workloads::drain::{Shape, label};
use setup::STREAMS;
pub(crate) use setup::{open, schema};

pub(crate) async fn drop_schema(url: &str, schema: &str) -> Result<()> {
    raw::drop_schema(url, schema).await
}

/// The server's `fsync` setting, for the rows' names: the figures of a
/// server that does not sync (the tests' throwaway one) are labelled so.
async fn durability(url: &str) -> Result<String> {
    use outbox_postgres::sqlx::{self, Connection as _};
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .context("connecting to read fsync")?;
    let fsync: String = sqlx::query_scalar("SHOW fsync").fetch_one(&mut conn).await?;
    conn.close().await?;
    Ok(format!("fsync={fsync}"))
}

pub(crate) async fn run(ctx: &mut Ctx, url: &str) -> Result<()> {
    let durable = durability(url).await?;
    eprintln!("   pg server: {durable}");
    // The rates half load is taken from (see `lag::run`).
    let (mut append_100, mut drain_64) = (0.0, 0.0);
    for per_txn in [1u64, 100] {
        let (mut o, mut r) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            o.push(append_round(url, ctx.sizes.events, per_txn).await?);
            r.push(raw::append_round(url, &schema("raw"), ctx.sizes.events, per_txn).await?);
            eprintln!(
                "   pg {per_txn}/txn round {}: outbox {:.0} ev/s, plain client {:.0} ev/s",
                round + 1,
                o[round],
                r[round]
            );
        }
        if per_txn == 100 {
            append_100 = crate::report::median(&o);
        }
        ctx.rows.push(Row::pair(
            format!(
                "PG append, {per_txn} per txn ({} events, {STREAMS} streams, {durable})",
                ctx.sizes.events
            ),
            "events/s",
            Better::Higher,
            o,
            r,
        ));
    }
    let per_stream = ctx.sizes.events / STREAMS;
    let defaults = Config::default();
    for shape in [Shape::PerStream, Shape::Sweeps] {
        for batch in [1usize, 64] {
            let sweep =
                (shape == Shape::Sweeps).then_some((defaults.sweep_rows as i64, defaults.streams_per_pass));
            let (mut o, mut r) = (Vec::new(), Vec::new());
            for round in 0..ROUNDS {
                o.push(drain_round(url, per_stream, batch, shape, || Ok(())).await?);
                r.push(
                    raw::drain_round(url, &schema("raw"), STREAMS, per_stream, batch as i64, sweep).await?,
                );
                eprintln!(
                    "   pg drain batch {batch}, {}, round {}: outbox {:.0} ev/s, plain client {:.0} ev/s",
                    label(shape),
                    round + 1,
                    o[round],
                    r[round]
                );
            }
            if shape == Shape::Sweeps && batch == 64 {
                drain_64 = crate::report::median(&o);
            }
            ctx.rows.push(Row::pair(
                format!(
                    "PG drain, batch {batch} ({STREAMS} streams x {per_stream} events, {durable}), {}",
                    label(shape)
                ),
                "events/s",
                Better::Higher,
                o,
                r,
            ));
        }
    }
    hand_written(ctx, url, per_stream, &durable).await?;
    lag::run(ctx, url, drain_64, append_100, &durable).await
}

/// The hand-written SQL projection (a run per statement) against the view
/// projection, both on the default worker at batch 64 (issue 43's third
/// point: at least 0.8 of the view projection).
async fn hand_written(ctx: &mut Ctx, url: &str, per_stream: u64, durable: &str) -> Result<()> {
    let (mut o, mut v) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        o.push(drain_with(url, per_stream, 64, Shape::Sweeps, true, || Ok(())).await?);
        v.push(drain_with(url, per_stream, 64, Shape::Sweeps, false, || Ok(())).await?);
        eprintln!(
            "   pg drain batch 64, sweeps, hand-written against view, round {}: hand-written {:.0} ev/s, view {:.0} ev/s",
            round + 1,
            o[round],
            v[round]
        );
    }
    let row = Row::pair(
        format!(
            "PG drain, batch 64 ({STREAMS} streams x {per_stream} events, {durable}), sweeps, hand-written SQL projection (one upsert per run)"
        ),
        "events/s",
        Better::Higher,
        o,
        v,
    )
    .with_note("second column: the view projection in the same rounds; target >= 0.8");
    ctx.rows.push(row);
    Ok(())
}

async fn append_round(url: &str, total: u64, per_txn: u64) -> Result<f64> {
    let schema = schema("outbox");
    let rt = open(
        url,
        &schema,
        Config::producer_only(),
        Seen::default().into(),
        false,
    )
    .await?;
    let streams: Vec<_> = (0..STREAMS).map(|s| stream("a", s)).collect::<Result<_>>()?;
    let mut versions = vec![0u64; STREAMS as usize];
    let t = Instant::now();
    let mut i = 0u64;
    while i < total {
        let mut batch = Vec::with_capacity(per_txn as usize);
        for _ in 0..per_txn.min(total - i) {
            let s = (i % STREAMS) as usize;
            batch.push(AppendRequest::new(
                streams[s].clone(),
                ExpectedVersion::Exact(versions[s]),
                vec![fixture::new_event(&rt, i)?],
            ));
            versions[s] += 1;
            i += 1;
        }
        rt.append_batch(batch).await?;
    }
    let rate = total as f64 / t.elapsed().as_secs_f64();
    let summary = outbox_core::OutboxInspector::summary(rt.journal()).await?;
    anyhow::ensure!(
        summary.pending == total,
        "expected {total} pending rows, got {summary:?}"
    );
    rt.journal().close().await;
    drop_schema(url, &schema).await?;
    Ok(rate)
}

/// The flag of [`profile_append`].
pub(crate) const PROFILE_APPEND_FLAG: &str = "--profile-pg-append";

/// `--profile-pg-append PER_TXN ROUNDS`: Postgres append rounds
/// (`OUTBOX_TEST_DATABASE_URL`), the outbox and the plain client loop in
/// turn, each round's two rates printed; the outbox side sampled (as
/// `--profile-drain`) only while appending.
pub(crate) fn profile_append(mut args: impl Iterator<Item = String>) -> Result<()> {
    let url = std::env::var("OUTBOX_TEST_DATABASE_URL")
        .context("--profile-pg-append needs OUTBOX_TEST_DATABASE_URL")?;
    let mut number = |what: &str| crate::workloads::profile_number(PROFILE_APPEND_FLAG, &mut args, what);
    let (per_txn, rounds) = (number("PER_TXN")?, number("ROUNDS")?);
    let events = crate::run::Sizes::of(false).events;
    crate::workloads::profile_rounds(rounds, |_tmp, gate| {
        let url = url.clone();
        async move {
            let plain = raw::append_round(&url, &schema("raw"), events, per_txn).await?;
            gate()?;
            let rate = append_round(&url, events, per_txn).await?;
            eprintln!("   plain client {plain:.0} ev/s, ratio {:.2}", rate / plain);
            Ok(rate)
        }
    })
}

/// The flag of [`profile`].
pub(crate) const PROFILE_FLAG: &str = "--profile-pg-drain";

/// `--profile-pg-drain PER_STREAM BATCH sweeps|per-stream ROUNDS`: outbox
/// drain rounds on Postgres (`OUTBOX_TEST_DATABASE_URL`) over 100 streams
/// and nothing else, sampled (as `--profile-drain`) only while draining.
pub(crate) fn profile(mut args: impl Iterator<Item = String>) -> Result<()> {
    let url = std::env::var("OUTBOX_TEST_DATABASE_URL")
        .context("--profile-pg-drain needs OUTBOX_TEST_DATABASE_URL")?;
    let mut number = |what: &str| crate::workloads::profile_number(PROFILE_FLAG, &mut args, what);
    let (per_stream, batch) = (number("PER_STREAM")?, number("BATCH")?);
    let shape = Shape::parse(PROFILE_FLAG, args.next().as_deref())?;
    let rounds = crate::workloads::profile_number(PROFILE_FLAG, &mut args, "ROUNDS")?;
    let hand_written = match args.next().as_deref() {
        None => false,
        Some("hand-written") => true,
        Some(other) => {
            anyhow::bail!("{PROFILE_FLAG}: expected `hand-written` or nothing after ROUNDS, got {other:?}")
        }
    };
    crate::workloads::profile_rounds(rounds, |_tmp, gate| {
        let url = url.clone();
        async move { drain_with(&url, per_stream, batch as usize, shape, hand_written, gate).await }
    })
}

async fn drain_round(
    url: &str,
    per_stream: u64,
    batch: usize,
    shape: Shape,
    gate: impl FnOnce() -> Result<()>,
) -> Result<f64> {
    drain_with(url, per_stream, batch, shape, false, gate).await
}

/// A drain round with the view projection, or the hand-written one.
async fn drain_with(
    url: &str,
    per_stream: u64,
    batch: usize,
    shape: Shape,
    hand_written: bool,
    gate: impl FnOnce() -> Result<()>,
) -> Result<f64> {
    let schema = schema("outbox");
    let seen = Arc::new(Seen::default());
    let mut config = fixture::worker_config(batch);
    if shape == Shape::PerStream {
        config = config.with_sweep_rows(0);
    }
    let rt = if hand_written {
        sql_projection::open(url, &schema, config, seen.clone()).await?
    } else {
        open(url, &schema, config, seen.clone(), false).await?
    };
    let versions = fixture::prefill(&rt, "d", STREAMS, per_stream, STREAMS).await?;
    let total = STREAMS * per_stream;
    gate()?;
    let t = Instant::now();
    let running = rt.start().await?;
    fixture::wait_drained(&rt, &seen, total, Duration::from_secs(600)).await?;
    let rate = total as f64 / t.elapsed().as_secs_f64();
    running.shutdown().await;
    if hand_written {
        sql_projection::verify(&rt, &seen, "d", &versions).await?;
    } else {
        fixture::verify(&rt, &seen, "d", &versions).await?;
    }
    rt.journal().close().await;
    drop_schema(url, &schema).await?;
    Ok(rate)
}
