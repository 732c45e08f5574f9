//! W3 on Postgres: the lag benchmark of [`crate::workloads::lag`] at half
//! the Postgres pipeline's measured maximum, in-process (wake-on-append)
//! and with the worker in a child process woken by LISTEN/NOTIFY.

use std::sync::Arc;

use anyhow::{Context as _, Result};
use outbox_runtime::Config;

use super::{drop_schema, open, schema};
use crate::Ctx;
use crate::fixture::Seen;
use crate::workloads::lag::{self, MAX_CALLS_PER_SECOND, STREAMS};

/// The hidden first argument that makes the binary a Postgres lag child.
pub(crate) const CHILD_FLAG: &str = "--pg-lag-child";

/// Half the slower of the Postgres drain (sweeps, batch 64) and append
/// (100 per call) rates measured in this run, in and across processes.
pub(crate) async fn run(ctx: &mut Ctx, url: &str, drain_64: f64, append_100: f64) -> Result<()> {
    let rate = (drain_64.min(append_100) / 2.0).floor().max(1.0);
    let per_call = (rate / MAX_CALLS_PER_SECOND).ceil().clamp(1.0, STREAMS as f64) as u64;
    let seconds = ctx.sizes.lag_seconds;
    let total = (rate * seconds as f64) as u64;
    let name = "PG lag {}, wake-on-append";
    lag::measure(ctx, name, rate, per_call, || {
        in_process(url, rate, total, per_call)
    })
    .await?;
    let name = "PG lag {}, worker in another process, LISTEN/NOTIFY wake-up";
    lag::measure(ctx, name, rate, per_call, || across(url, rate, total, per_call)).await
}

/// One in-process round on a fresh schema.
async fn in_process(url: &str, rate: f64, total: u64, per_call: u64) -> Result<(Vec<f64>, f64)> {
    let schema = schema("lag");
    let seen = Arc::new(Seen::recording(total));
    let config = Config::apply_worker().with_repair_on_start(false);
    let rt = open(url, &schema, config, seen.clone(), false).await?;
    let out = lag::in_process(&rt, &seen, rate, total, per_call, || Ok(())).await;
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
    let out = lag::with_child(&rt, &args, rate, total, per_call).await;
    rt.journal().close().await;
    drop_schema(url, &schema).await?;
    out
}

/// The child (`--pg-lag-child URL SCHEMA TOTAL`): the apply worker on
/// SCHEMA, woken by the journal's LISTEN/NOTIFY wake source.
pub(crate) fn child(mut args: impl Iterator<Item = String>) -> Result<()> {
    let url = args.next().context("URL")?;
    let schema = args.next().context("SCHEMA")?;
    let total: u64 = args.next().context("TOTAL")?.parse()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let seen = Arc::new(Seen::recording(total));
        let rt = open(&url, &schema, lag::child_config(), seen.clone(), true).await?;
        let out = lag::serve_child(&rt, &seen, total).await;
        rt.journal().close().await;
        out
    })
}
