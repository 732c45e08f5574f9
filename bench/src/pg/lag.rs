//! W3 on Postgres: the lag benchmark of [`crate::workloads::lag`] at half
//! the Postgres pipeline's measured maximum, in-process (wake-on-append)
//! and with the worker in a child process woken by LISTEN/NOTIFY.

use std::sync::Arc;

use anyhow::{Context as _, Result};
use outbox_runtime::Config;

use super::raw::drop_schema;
use super::setup::{open, schema};
use crate::fixture::Seen;
use crate::run::Ctx;
use crate::visible::Watcher;
use crate::workloads::lag::{self, MAX_CALLS_PER_SECOND, STREAMS};

/// The hidden first argument that makes the binary a Postgres lag child.
pub(crate) const CHILD_FLAG: &str = "--pg-lag-child";

/// Half the slower of the Postgres drain (sweeps, batch 64) and append
/// (100 per call) rates measured in this run, in and across processes.
pub(crate) async fn run(
    ctx: &mut Ctx,
    url: &str,
    drain_64: f64,
    append_100: f64,
    durable: &str,
) -> Result<()> {
    let rate = (drain_64.min(append_100) / 2.0).floor().max(1.0);
    let per_call = (rate / MAX_CALLS_PER_SECOND).ceil().clamp(1.0, STREAMS as f64) as u64;
    let seconds = ctx.sizes.lag_seconds;
    let total = (rate * seconds as f64) as u64;
    let name = format!("PG lag {{}}, wake-on-append ({durable})");
    lag::measure(ctx, &name, rate, per_call, &[lag::Side::Outbox], |_| {
        in_process(url, rate, total, per_call)
    })
    .await?;
    let name = format!("PG lag {{}}, worker in another process, LISTEN/NOTIFY wake-up ({durable})");
    lag::measure(ctx, &name, rate, per_call, &[lag::Side::Outbox], |_| {
        across(url, rate, total, per_call)
    })
    .await?;
    // Issue 43's second Postgres target: single appends at a fixed rate.
    let (rate, per_call) = (FIXED_RATE, 1);
    let total = (rate * seconds as f64) as u64;
    let name = format!("PG lag {{}}, wake-on-append, {rate:.0} single appends/s ({durable})");
    lag::measure(ctx, &name, rate, per_call, &[lag::Side::Outbox], |_| {
        in_process(url, rate, total, per_call)
    })
    .await?;
    let name = format!(
        "PG lag {{}}, worker in another process, LISTEN/NOTIFY wake-up, {rate:.0} single appends/s ({durable})"
    );
    lag::measure(ctx, &name, rate, per_call, &[lag::Side::Outbox], |_| {
        across(url, rate, total, per_call)
    })
    .await
}

/// The fixed rate of single appends issue 43 sets a Postgres target at.
const FIXED_RATE: f64 = 2000.0;

/// One in-process round on a fresh schema.
async fn in_process(url: &str, rate: f64, total: u64, per_call: u64) -> Result<(Vec<f64>, f64)> {
    let schema = schema("lag");
    let seen = Arc::new(Seen::recording());
    let config = Config::apply_worker().with_repair_on_start(false);
    let rt = open(url, &schema, config, seen.clone(), false).await?;
    let out = match Watcher::postgres_unless_to_apply(url, &schema) {
        Ok(watch) => lag::in_process(&rt, &seen, rate, total, per_call, || Ok(()), watch).await,
        Err(e) => Err(e),
    };
    rt.journal().close().await;
    drop_schema(url, &schema).await?;
    out
}

/// One round with the worker in a child process, on a fresh schema this
/// process creates (producer-only) before the child opens it.
async fn across(url: &str, rate: f64, total: u64, per_call: u64) -> Result<(Vec<f64>, f64)> {
    let schema = schema("lag");
    let rt = open(url, &schema, Config::producer_only(), Arc::default(), false).await?;
    let args = [
        CHILD_FLAG.into(),
        url.into(),
        schema.clone().into(),
        total.to_string().into(),
    ];
    let out = match Watcher::postgres_unless_to_apply(url, &schema) {
        Ok(watch) => lag::with_child(&rt, &args, rate, total, per_call, watch).await,
        Err(e) => Err(e),
    };
    rt.journal().close().await;
    drop_schema(url, &schema).await?;
    out
}

/// The flag of [`profile`].
pub(crate) const PROFILE_FLAG: &str = "--profile-pg-lag";

/// The flag of [`profile`] with the worker in a child process.
pub(crate) const PROFILE_ACROSS_FLAG: &str = "--profile-pg-lag-across";

/// `--profile-pg-lag[-across] RATE PER_CALL SECONDS ROUNDS`: the lag
/// rounds of [`run`] on Postgres (`OUTBOX_TEST_DATABASE_URL`) at RATE
/// ev/s, PER_CALL events per call, and nothing else; prints each round's
/// lag percentiles. Not gated for a profiler: a round's set-up and
/// tear-down are short next to its SECONDS.
pub(crate) fn profile(mut args: impl Iterator<Item = String>, in_child: bool) -> Result<()> {
    let flag = if in_child {
        PROFILE_ACROSS_FLAG
    } else {
        PROFILE_FLAG
    };
    let url = std::env::var("OUTBOX_TEST_DATABASE_URL")
        .with_context(|| format!("{flag} needs OUTBOX_TEST_DATABASE_URL"))?;
    let mut number = |what: &str| crate::workloads::profile_number(flag, &mut args, what);
    let (rate, per_call, seconds) = (number("RATE")?, number("PER_CALL")?, number("SECONDS")?);
    let rounds = number("ROUNDS")?;
    anyhow::ensure!(
        rate > 0 && per_call > 0 && seconds > 0,
        "{flag}: every number must be positive"
    );
    let total = rate * seconds;
    crate::workloads::profile_rounds(rounds, |_tmp, _gate| {
        let url = url.clone();
        async move {
            let (mut lags, sent) = if in_child {
                across(&url, rate as f64, total, per_call).await?
            } else {
                in_process(&url, rate as f64, total, per_call).await?
            };
            lags.sort_by(f64::total_cmp);
            eprintln!(
                "   p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                crate::report::percentile(&lags, 50.0),
                crate::report::percentile(&lags, 99.0),
                lags.last().copied().unwrap_or_default()
            );
            Ok(sent)
        }
    })
}

/// The child (`--pg-lag-child URL SCHEMA TOTAL`): the apply worker on
/// SCHEMA, woken by the journal's LISTEN/NOTIFY wake source.
pub(crate) fn child(mut args: impl Iterator<Item = String>) -> Result<()> {
    let url = args.next().context("URL")?;
    let schema = args.next().context("SCHEMA")?;
    let total: u64 = args.next().context("TOTAL")?.parse()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let seen = Arc::new(Seen::recording());
        let rt = open(&url, &schema, lag::child_config(), seen.clone(), true).await?;
        let out = lag::serve_child(&rt, &seen, total).await;
        rt.journal().close().await;
        out
    })
}
