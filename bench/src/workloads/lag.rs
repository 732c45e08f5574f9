//! W3: end-to-end lag at a fixed offered rate, open loop: each append is
//! scheduled at a fixed interval and its lag runs from the scheduled time
//! to the projection having applied it. In-process, wake-on-append on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use outbox_core::ExpectedVersion;
use outbox_runtime::Config;

use super::ROUNDS;
use crate::Ctx;
use crate::fixture::{self, Seen, stream, stream_name};
use crate::report::{Better, Row, percentile};

const STREAMS: u64 = 100;
const MAX_RATE: f64 = 2000.0;
const DEFAULT_RATE: f64 = 1000.0;

/// A low rate also measured, for the wake-up path without queueing.
const LOW_RATE: f64 = 200.0;

pub(crate) async fn run(ctx: &mut Ctx) -> Result<()> {
    let rate = ctx
        .drain_64
        .map_or(DEFAULT_RATE, |r| r / 2.0)
        .min(MAX_RATE)
        .floor()
        .max(1.0);
    for rate in [rate, LOW_RATE] {
        at_rate(ctx, rate).await?;
    }
    Ok(())
}

async fn at_rate(ctx: &mut Ctx, rate: f64) -> Result<()> {
    let (mut p50, mut p99, mut max, mut achieved) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let (mut lags, sent_rate) = one_run(ctx, rate).await?;
        lags.sort_by(f64::total_cmp);
        p50.push(percentile(&lags, 50.0));
        p99.push(percentile(&lags, 99.0));
        max.push(*lags.last().context("no events")?);
        achieved.push(sent_rate);
        eprintln!(
            "   round {}: {} events offered at {rate} ev/s (appended at {sent_rate:.0} ev/s): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            round + 1,
            lags.len(),
            p50[round],
            p99[round],
            max[round]
        );
    }
    let note = format!(
        "{rate:.0} ev/s offered, {:.0} ev/s appended, {} s",
        crate::report::median(&achieved),
        ctx.sizes.lag_seconds
    );
    for (what, v) in [("p50", p50), ("p99", p99), ("max", max)] {
        ctx.rows.push(
            Row::single(format!("W3 lag {what}, wake-on-append"), "ms", Better::Lower, v)
                .with_note(note.clone()),
        );
    }
    Ok(())
}

/// Lags in ms of one open-loop run, and the rate the appends achieved.
async fn one_run(ctx: &Ctx, rate: f64) -> Result<(Vec<f64>, f64)> {
    let dir = fixture::tempdir(&ctx.tmp)?;
    let seen = Arc::new(Seen {
        at: Some(Mutex::new(HashMap::new())),
        ..Seen::default()
    });
    let config = Config::apply_worker().with_repair_on_start(false);
    let rt = fixture::open(dir.path(), config, seen.clone()).await?;
    let running = rt.start().await?;
    let streams: Vec<_> = (0..STREAMS).map(|s| stream("l", s)).collect::<Result<_>>()?;
    let total = (rate * ctx.sizes.lag_seconds as f64) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let t0 = Instant::now() + Duration::from_millis(50);
    let mut heads = vec![0u64; STREAMS as usize];
    let mut scheduled = Vec::with_capacity(total as usize);
    for i in 0..total {
        let at = t0 + interval.mul_f64(i as f64);
        tokio::time::sleep_until(at.into()).await;
        let s = (i % STREAMS) as usize;
        let e = fixture::new_event(&rt, i)?;
        rt.append(&streams[s], ExpectedVersion::Exact(heads[s]), vec![e])
            .await?;
        heads[s] += 1;
        scheduled.push((stream_name("l", s as u64), heads[s], at));
    }
    let sent_rate = total as f64 / t0.elapsed().as_secs_f64();
    fixture::wait_drained(&rt, &seen, total, Duration::from_secs(120)).await?;
    running.shutdown().await;
    fixture::verify(&rt, &seen, "l", &heads).await?;
    let at = seen
        .at
        .as_ref()
        .context("recording")?
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?;
    let lags = scheduled
        .into_iter()
        .map(|(s, seq, sent)| {
            let applied = at
                .get(&(s.clone(), seq))
                .with_context(|| format!("{s}/{seq} not applied"))?;
            Ok(applied.saturating_duration_since(sent).as_secs_f64() * 1e3)
        })
        .collect::<Result<_>>()?;
    Ok((lags, sent_rate))
}
