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

/// The next argument of a `--profile-*` mode (`flag`), as a number.
pub(crate) fn profile_number(
    flag: &str,
    args: &mut impl Iterator<Item = String>,
    what: &str,
) -> anyhow::Result<u64> {
    let v = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("{flag}: missing {what}"))?;
    v.parse()
        .map_err(|_| anyhow::anyhow!("{flag}: {what} {v:?} is not a number"))
}

/// Runs `rounds` outbox rounds of a `--profile-*` mode and nothing else:
/// `round` gets the temp root and the gate that starts the profiler (called
/// when the timed part starts); the profiler stops when the round returns.
pub(crate) fn profile_rounds<F, Fut>(rounds: u64, mut round: F) -> anyhow::Result<()>
where
    F: FnMut(std::path::PathBuf, fn() -> anyhow::Result<()>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<f64>>,
{
    let tmp = crate::fixture::bench_tmp_root()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    for n in 1..=rounds {
        let rate = rt.block_on(round(tmp.clone(), || profiler("enable")))?;
        profiler("disable")?;
        eprintln!("   round {n}: outbox {rate:.0} ev/s");
    }
    Ok(())
}
