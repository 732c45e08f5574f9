//! W2: drain a pre-filled backlog through one projection that upserts one
//! row per event, at batch 1 and 64, over 100 streams and over many
//! streams of 2 events each; the worker in both of its shapes, each against
//! a raw loop of the same shape: per-stream passes (`sweep_rows` 0: three
//! commits per stream run) and sweeps (the default: three commits for up
//! to `streams_per_pass` runs and `sweep_rows` rows).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::{ROUNDS, blocking};
use crate::fixture::{self, Seen, stream_name};
use crate::raw;
use crate::report::{Better, Row, median};
use crate::run::Ctx;

/// The worker's two shapes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    PerStream,
    Sweeps,
}

impl Shape {
    /// A `--profile-*` mode's shape argument.
    pub(crate) fn parse(flag: &str, arg: Option<&str>) -> Result<Self> {
        match arg {
            Some("sweeps") => Ok(Shape::Sweeps),
            Some("per-stream") => Ok(Shape::PerStream),
            other => anyhow::bail!("{flag}: the shape is sweeps or per-stream, not {other:?}"),
        }
    }
}

pub(crate) async fn run(ctx: &mut Ctx) -> Result<()> {
    let events = ctx.sizes.events;
    let shapes = [(100, events / 100), (ctx.sizes.many_streams, 2)];
    for shape in [Shape::PerStream, Shape::Sweeps] {
        for (streams, per_stream) in shapes {
            for batch in [1usize, 64] {
                let (mut o, mut r) = (Vec::new(), Vec::new());
                for round in 0..ROUNDS {
                    o.push(outbox_round(&ctx.tmp, streams, per_stream, batch, shape, || Ok(())).await?);
                    let tmp = ctx.tmp.clone();
                    r.push(
                        blocking(move || {
                            raw_round(&tmp, streams, per_stream, batch as i64, shape, || Ok(()))
                        })
                        .await?,
                    );
                    eprintln!(
                        "   {streams} streams x {per_stream}, batch {batch}, {}, round {}: outbox {:.0} ev/s, raw {:.0} ev/s",
                        label(shape),
                        round + 1,
                        o[round],
                        r[round]
                    );
                }
                if streams == 100 && batch == 64 && shape == Shape::Sweeps {
                    ctx.drain_64 = Some(median(&o));
                }
                ctx.rows.push(Row::pair(
                    format!(
                        "W2 drain, batch {batch} ({streams} streams x {per_stream} events), {}",
                        label(shape)
                    ),
                    "events/s",
                    Better::Higher,
                    o,
                    r,
                ));
            }
        }
    }
    // The hand-written SQL projection (issue 43's third point), on the
    // default worker, against the same raw loop.
    let (streams, per_stream, batch) = (100, events / 100, 64usize);
    let (mut o, mut r) = (Vec::new(), Vec::new());
    for n in 0..ROUNDS {
        o.push(
            round(
                &ctx.tmp,
                streams,
                per_stream,
                batch,
                Shape::Sweeps,
                Applier::Sql,
                || Ok(()),
            )
            .await?,
        );
        let tmp = ctx.tmp.clone();
        r.push(
            blocking(move || raw_round(&tmp, streams, per_stream, batch as i64, Shape::Sweeps, || Ok(())))
                .await?,
        );
        eprintln!(
            "   {streams} streams x {per_stream}, batch {batch}, sweeps, hand-written SQL projection, round {}: outbox {:.0} ev/s, raw {:.0} ev/s",
            n + 1,
            o[n],
            r[n]
        );
    }
    ctx.rows.push(Row::pair(
        format!(
            "W2 drain, batch {batch} ({streams} streams x {per_stream} events), sweeps, hand-written SQL projection (an upsert per event)"
        ),
        "events/s",
        Better::Higher,
        o,
        r,
    ));
    Ok(())
}

/// The flag of [`profile`].
pub(crate) const PROFILE_FLAG: &str = "--profile-drain";

/// `--profile-drain STREAMS PER_STREAM BATCH sweeps|per-stream ROUNDS`:
/// outbox rounds of one drain shape and nothing else, so a profiler
/// attached to the process sees only the outbox's work.
pub(crate) fn profile(mut args: impl Iterator<Item = String>) -> Result<()> {
    let mut number = |what: &str| super::profile_number(PROFILE_FLAG, &mut args, what);
    let (streams, per_stream, batch) = (number("STREAMS")?, number("PER_STREAM")?, number("BATCH")?);
    let shape = Shape::parse(PROFILE_FLAG, args.next().as_deref())?;
    let rounds = super::profile_number(PROFILE_FLAG, &mut args, "ROUNDS")?;
    super::profile_rounds(rounds, |tmp, gate| async move {
        outbox_round(&tmp, streams, per_stream, batch as usize, shape, gate).await
    })
}

pub(crate) fn label(shape: Shape) -> &'static str {
    match shape {
        Shape::PerStream => "per-stream passes",
        Shape::Sweeps => "sweeps",
    }
}

/// Pre-fills (not timed), calls `gate` (the fsync count's start), starts
/// the apply worker, times until the outbox is empty, checks the oracle.
pub(crate) async fn outbox_round(
    tmp: &std::path::Path,
    streams: u64,
    per_stream: u64,
    batch: usize,
    shape: Shape,
    gate: impl FnOnce() -> Result<()>,
) -> Result<f64> {
    round(tmp, streams, per_stream, batch, shape, Applier::View, gate).await
}

/// Which projection an outbox round drains into.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Applier {
    /// The backend-neutral view projection users write.
    View,
    /// A hand-written SQL projection: an upsert per event
    /// (`crate::sql_projection`).
    Sql,
}

async fn round(
    tmp: &std::path::Path,
    streams: u64,
    per_stream: u64,
    batch: usize,
    shape: Shape,
    applier: Applier,
    gate: impl FnOnce() -> Result<()>,
) -> Result<f64> {
    let dir = fixture::tempdir(tmp)?;
    let seen = Arc::new(Seen::default());
    let mut config = fixture::worker_config(batch);
    if shape == Shape::PerStream {
        config = config.with_sweep_rows(0);
    }
    let rt = match applier {
        Applier::View => fixture::open(dir.path(), config, seen.clone()).await?,
        Applier::Sql => crate::sql_projection::open(dir.path(), config, seen.clone()).await?,
    };
    let versions = fixture::prefill(&rt, "d", streams, per_stream, streams.min(1000)).await?;
    let total = streams * per_stream;
    gate()?;
    let t = Instant::now();
    let running = rt.start().await?;
    fixture::wait_drained(&rt, &seen, total, Duration::from_secs(600)).await?;
    let rate = total as f64 / t.elapsed().as_secs_f64();
    running.shutdown().await;
    match applier {
        Applier::View => fixture::verify(&rt, &seen, "d", &versions).await?,
        Applier::Sql => crate::sql_projection::verify(&rt, &seen, "d", &versions).await?,
    }
    Ok(rate)
}

pub(crate) fn raw_round(
    tmp: &std::path::Path,
    streams: u64,
    per_stream: u64,
    batch: i64,
    shape: Shape,
    gate: impl FnOnce() -> Result<()>,
) -> Result<f64> {
    let dir = fixture::tempdir(tmp)?;
    let mut j = raw::Journal::create(dir.path())?;
    let mut p = raw::Projection::create(dir.path())?;
    let names: Vec<String> = (0..streams).map(|s| stream_name("d", s)).collect();
    for _ in 0..per_stream {
        for chunk in names.chunks(1000) {
            let reqs: Vec<(&str, u64)> = chunk.iter().map(|s| (s.as_str(), 1)).collect();
            j.append(&reqs)?;
        }
    }
    let total = streams * per_stream;
    gate()?;
    let t = Instant::now();
    let applied = match shape {
        Shape::PerStream => raw::drain(&mut j, &mut p, &names, batch)?,
        Shape::Sweeps => {
            let c = outbox_runtime::Config::default();
            raw::drain_sweep(
                &mut j,
                &mut p,
                &names,
                batch,
                c.sweep_rows as i64,
                c.streams_per_pass,
            )?
        }
    };
    let rate = total as f64 / t.elapsed().as_secs_f64();
    anyhow::ensure!(applied == total, "raw drain applied {applied} of {total}");
    p.verify(&names, &vec![per_stream; streams as usize])?;
    Ok(rate)
}
