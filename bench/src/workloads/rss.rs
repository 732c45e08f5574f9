//! W4/memory: the worker's resident memory while it drains a slice of a
//! small and a large backlog. Each size runs in a child process of this
//! binary, so its VmHWM is the worker's alone, not the bench's.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};

use crate::fixture::{self, Seen, stream_name};
use crate::report::{Better, Row};
use crate::run::Ctx;

/// The hidden first argument that makes the binary the RSS child.
pub(crate) const CHILD_FLAG: &str = "--rss-child";

pub(crate) async fn run(ctx: &mut Ctx) -> Result<()> {
    for n in ctx.sizes.backlogs {
        let dir = match ctx.backlogs.iter().position(|(m, _)| *m == n) {
            Some(i) => ctx.backlogs.remove(i).1,
            None => {
                eprintln!("   pre-filling {n} pending rows");
                super::claim::prefill_outbox(ctx, n).await?
            }
        };
        let slice = n.min(ctx.sizes.events);
        let out = std::process::Command::new(std::env::current_exe()?)
            .arg(CHILD_FLAG)
            .arg(dir.path())
            .arg(n.to_string())
            .arg(slice.to_string())
            .stderr(std::process::Stdio::inherit())
            .output()
            .context("running the RSS child")?;
        ensure!(out.status.success(), "RSS child failed ({})", out.status);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("RSS child output")?;
        let get = |k: &str| v[k].as_f64().with_context(|| format!("{k} missing in {v}"));
        let (hwm, rss, rate) = (
            get("hwm_kib")? / 1024.0,
            get("rss_kib")? / 1024.0,
            get("events_per_s")?,
        );
        eprintln!(
            "   {n} pending: VmHWM {hwm:.1} MiB, VmRSS {rss:.1} MiB, drained {slice} at {rate:.0} ev/s"
        );
        ctx.rows.push(
            Row::single(
                format!("W4 worker VmHWM at {n} pending"),
                "MiB",
                Better::Lower,
                vec![hwm],
            )
            .with_note(format!("VmRSS {rss:.1} MiB after draining {slice}")),
        );
        ctx.rows.push(Row::single(
            format!("W4 drain batch 64 at {n} pending (first {slice})"),
            "events/s",
            Better::Higher,
            vec![rate],
        ));
    }
    Ok(())
}

/// The child: `--rss-child DIR PENDING SLICE`. Drains SLICE events of the
/// backlog in DIR with the apply worker, prints its memory as JSON.
pub(crate) fn child(mut args: impl Iterator<Item = String>) -> Result<()> {
    let dir = std::path::PathBuf::from(args.next().context("DIR")?);
    let pending: u64 = args.next().context("PENDING")?.parse()?;
    let slice: u64 = args.next().context("SLICE")?.parse()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let seen = Arc::new(Seen::default());
        let rt = fixture::open(&dir, fixture::worker_config(64), seen.clone()).await?;
        let (_, rss_before) = fixture::vm_kib()?;
        let t = Instant::now();
        let running = rt.start().await?;
        let deadline = Instant::now() + Duration::from_secs(600);
        while seen.applied.load(Ordering::Relaxed) < slice {
            ensure!(Instant::now() < deadline, "RSS child: slice not drained in time");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let secs = t.elapsed().as_secs_f64();
        let (hwm, rss) = fixture::vm_kib()?;
        running.shutdown().await;
        // Oracle on the streams touched: each document is at its apply count.
        let streams = (pending / super::claim::PER_STREAM).max(1);
        let per_stream = seen
            .per_stream
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .clone();
        let versions: Vec<u64> = (0..streams)
            .map(|s| per_stream.get(&stream_name("k", s)).copied().unwrap_or(0))
            .collect();
        fixture::verify(&rt, &seen, "k", &versions).await?;
        let applied = seen.applied.load(Ordering::Relaxed);
        println!(
            "{}",
            serde_json::json!({
                "pending": pending,
                "hwm_kib": hwm,
                "rss_kib": rss,
                "rss_before_kib": rss_before,
                "applied": applied,
                "events_per_s": applied as f64 / secs,
            })
        );
        Ok(())
    })
}
