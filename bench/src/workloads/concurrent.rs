//! W1: 64 concurrent tasks, each appending one event per call to its own
//! stream, against the raw engine loop's 100-per-transaction rate of the
//! same run (the target is a ratio of at least 0.5).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Result;
use outbox_core::ExpectedVersion;
use outbox_runtime::Config;

use super::{ROUNDS, blocking};
use crate::fixture::{self, Seen, stream};
use crate::report::{Better, Row, median};
use crate::run::Ctx;

const TASKS: u64 = 64;

pub(crate) async fn run(ctx: &mut Ctx) -> Result<()> {
    let mut o = Vec::new();
    let mut r = Vec::new();
    for round in 0..ROUNDS {
        o.push(outbox_round(&ctx.tmp, ctx.sizes.events, || Ok(())).await?);
        if ctx.raw_append_100.is_none() {
            let (events, tmp) = (ctx.sizes.events, ctx.tmp.clone());
            r.push(blocking(move || super::append::raw_round(&tmp, events, 100, || Ok(()))).await?);
        }
        eprintln!("   round {}: outbox {:.0} ev/s", round + 1, o[round]);
    }
    let raw100 = match ctx.raw_append_100 {
        Some(v) => v,
        None => {
            let v = median(&r);
            ctx.raw_append_100 = Some(v);
            v
        }
    };
    let row = Row::single(
        format!(
            "W1 {TASKS} concurrent single-event appenders ({} events)",
            ctx.sizes.events
        ),
        "events/s",
        Better::Higher,
        o,
    );
    let ratio = row.outbox / raw100;
    let mut row = row
        .with_ratio(ratio)
        .with_note("ratio to raw 100 per txn; target >= 0.5");
    row.raw = Some(raw100);
    ctx.rows.push(row);
    Ok(())
}

/// The flag of [`profile`].
pub(crate) const PROFILE_FLAG: &str = "--profile-concurrent";

/// `--profile-concurrent EVENTS ROUNDS`: outbox rounds of this workload
/// and nothing else, sampled (as `--profile-drain`) only while appending.
pub(crate) fn profile(mut args: impl Iterator<Item = String>) -> Result<()> {
    let events = super::profile_number(PROFILE_FLAG, &mut args, "EVENTS")?;
    let rounds = super::profile_number(PROFILE_FLAG, &mut args, "ROUNDS")?;
    super::profile_rounds(rounds, |tmp, gate| async move {
        outbox_round(&tmp, events, gate).await
    })
}

async fn outbox_round(tmp: &std::path::Path, total: u64, gate: impl FnOnce() -> Result<()>) -> Result<f64> {
    let dir = fixture::tempdir(tmp)?;
    let rt = fixture::open(dir.path(), Config::producer_only(), Seen::default().into()).await?;
    gate()?;
    let next = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (rt, next) = (rt.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let s = stream("c", task)?;
            let mut version = 0u64;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return anyhow::Ok(version);
                }
                let e = fixture::new_event(&rt, i)?;
                rt.append(&s, ExpectedVersion::Exact(version), vec![e]).await?;
                version += 1;
            }
        }));
    }
    let mut appended = 0;
    for t in tasks {
        appended += t.await??;
    }
    let rate = total as f64 / t.elapsed().as_secs_f64();
    anyhow::ensure!(appended == total, "appended {appended} of {total}");
    let summary = outbox_core::OutboxInspector::summary(rt.journal()).await?;
    anyhow::ensure!(
        summary.pending == total,
        "expected {total} pending rows, got {summary:?}"
    );
    Ok(rate)
}
