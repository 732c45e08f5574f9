//! W1: append with outbox enqueue, 1 / 10 / 100 events per transaction,
//! 100 streams; a transaction of k events is k requests of one event each
//! to k different streams.

use std::time::Instant;

use anyhow::Result;
use outbox_core::{AppendRequest, ExpectedVersion};
use outbox_runtime::Config;

use super::{ROUNDS, blocking};
use crate::fixture::{self, Seen, stream, stream_name};
use crate::raw;
use crate::report::{Better, Row};
use crate::run::Ctx;

pub(crate) const STREAMS: u64 = 100;

pub(crate) async fn run(ctx: &mut Ctx) -> Result<()> {
    for per_txn in [1u64, 10, 100] {
        let (o, r) = measure(ctx, per_txn).await?;
        if per_txn == 100 {
            ctx.raw_append_100 = Some(crate::report::median(&r));
            ctx.append_100 = Some(crate::report::median(&o));
        }
        ctx.rows.push(Row::pair(
            format!(
                "W1 append, {per_txn} per txn ({} events, {STREAMS} streams)",
                ctx.sizes.events
            ),
            "events/s",
            Better::Higher,
            o,
            r,
        ));
    }
    Ok(())
}

/// Interleaved rounds of both sides; events/s of each.
pub(crate) async fn measure(ctx: &Ctx, per_txn: u64) -> Result<(Vec<f64>, Vec<f64>)> {
    let (mut o, mut r) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        o.push(outbox_round(&ctx.tmp, ctx.sizes.events, per_txn, || Ok(())).await?);
        let (events, tmp) = (ctx.sizes.events, ctx.tmp.clone());
        r.push(blocking(move || raw_round(&tmp, events, per_txn, || Ok(()))).await?);
        eprintln!(
            "   {per_txn}/txn round {}: outbox {:.0} ev/s, raw {:.0} ev/s",
            round + 1,
            o[round],
            r[round]
        );
    }
    Ok((o, r))
}

/// One round: opens fresh files, calls `gate` (the fsync count's start),
/// appends `total` events `per_txn` per transaction.
pub(crate) async fn outbox_round(
    tmp: &std::path::Path,
    total: u64,
    per_txn: u64,
    gate: impl FnOnce() -> Result<()>,
) -> Result<f64> {
    let dir = fixture::tempdir(tmp)?;
    let rt = fixture::open(dir.path(), Config::producer_only(), Seen::default().into()).await?;
    let streams: Vec<_> = (0..STREAMS).map(|s| stream("a", s)).collect::<Result<_>>()?;
    let mut versions = vec![0u64; STREAMS as usize];
    gate()?;
    let mut next_stream = 0u64;
    let t = Instant::now();
    let mut i = 0u64;
    while i < total {
        let mut batch = Vec::with_capacity(per_txn as usize);
        for _ in 0..per_txn.min(total - i) {
            let s = (next_stream % STREAMS) as usize;
            next_stream += 1;
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
    Ok(rate)
}

pub(crate) fn raw_round(
    tmp: &std::path::Path,
    total: u64,
    per_txn: u64,
    gate: impl FnOnce() -> Result<()>,
) -> Result<f64> {
    let dir = fixture::tempdir(tmp)?;
    let mut j = raw::Journal::create(dir.path())?;
    let names: Vec<String> = (0..STREAMS).map(|s| stream_name("a", s)).collect();
    gate()?;
    let mut next_stream = 0u64;
    let t = Instant::now();
    let mut i = 0u64;
    let mut reqs: Vec<(&str, u64)> = Vec::with_capacity(per_txn as usize);
    while i < total {
        reqs.clear();
        for _ in 0..per_txn.min(total - i) {
            reqs.push((names[(next_stream % STREAMS) as usize].as_str(), 1));
            next_stream += 1;
            i += 1;
        }
        j.append(&reqs)?;
    }
    let rate = total as f64 / t.elapsed().as_secs_f64();
    let n: i64 = j
        .conn
        .query_row("SELECT COUNT(*) FROM outbox", [], |r| r.get(0))?;
    anyhow::ensure!(n as u64 == total, "raw: expected {total} outbox rows, got {n}");
    Ok(rate)
}

/// The flag of [`profile`].
pub(crate) const PROFILE_FLAG: &str = "--profile-append";

/// `--profile-append PER_TXN EVENTS ROUNDS`: outbox rounds of W1, each
/// followed by a raw round (printed beside it, not sampled), for a
/// profiler and quick A/Bs.
pub(crate) fn profile(mut args: impl Iterator<Item = String>) -> Result<()> {
    let per_txn = super::profile_number(PROFILE_FLAG, &mut args, "PER_TXN")?;
    let events = super::profile_number(PROFILE_FLAG, &mut args, "EVENTS")?;
    let rounds = super::profile_number(PROFILE_FLAG, &mut args, "ROUNDS")?;
    let tmp = fixture::bench_tmp_root()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    for n in 1..=rounds {
        let o = rt.block_on(outbox_round(&tmp, events, per_txn, || super::profiler("enable")))?;
        super::profiler("disable")?;
        let r = raw_round(&tmp, events, per_txn, || Ok(()))?;
        eprintln!(
            "   round {n}: outbox {o:.0} ev/s, raw {r:.0} ev/s, ratio {:.2}",
            o / r
        );
    }
    Ok(())
}
