//! The workloads, one module each; every one interleaves its rounds
//! (outbox, raw, outbox, raw, outbox, raw) and reports medians.

pub(crate) mod append;
pub(crate) mod claim;
pub(crate) mod concurrent;
pub(crate) mod drain;
pub(crate) mod fsyncs;
pub(crate) mod lag;
pub(crate) mod partitions;
pub(crate) mod rss;

/// Rounds per side.
pub(crate) const ROUNDS: usize = 3;

/// Runs a blocking raw-engine round off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f).await?
}

/// Tells a profiler to start or stop sampling: with `perf record -D -1
/// --control fifo:PATH` and `PERF_CTL_FIFO=PATH`, the `--profile-*` modes
/// are sampled only while the outbox works (not while a backlog is
/// filled); without the variable, nothing.
pub(crate) fn profiler(what: &str) -> anyhow::Result<()> {
    if let Ok(fifo) = std::env::var("PERF_CTL_FIFO") {
        std::fs::write(&fifo, format!("{what}\n"))?;
    }
    Ok(())
}
