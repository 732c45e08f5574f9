//! `outbox work`: run the configured worker.

use std::time::Duration;

use anyhow::Result;

use super::ctx::Ctx;
use crate::backend::{CliJournal, CliStore};
use crate::cli::WorkArgs;
use crate::output::{human_ms, json_line};

pub(super) async fn work<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &WorkArgs) -> Result<()> {
    // The configuration (flags applied, a worker mode) was checked by `run`.
    // Signals are handled from here on (the token was installed before the
    // databases were opened): SIGTERM or Ctrl-C while start-up waits for
    // the database or runs its repair stops it, and the command exits 0.
    let cancel = ctx
        .shutdown
        .clone()
        .unwrap_or_else(outbox_runtime::cancel_on_shutdown_signal);
    let rt = tokio::select! {
        biased;
        () = cancel.cancelled() => {
            if !a.quiet && !a.json {
                outln!("stopped while waiting for the database; no worker was started")?;
            }
            return Ok(());
        }
        rt = ctx.runtime() => rt?,
    };
    if a.once {
        let tick = rt.tick().await?;
        rt.record_activity().await?;
        if a.json {
            json_line(&tick)?;
        } else if !a.quiet {
            outln!(
                "{} pass: {} due stream(s), {} claimed, {} completed, {} failed, {} dead-lettered, {} contended, \
                 {} event(s) caught up for projections off the shared path",
                rt.mode(),
                tick.due_streams,
                tick.claimed,
                tick.completed,
                tick.failed,
                tick.dead_lettered,
                tick.contended,
                tick.caught_up
            )?;
        }
        return Ok(());
    }
    let running = rt.start_until(&cancel).await?;
    if let Some(r) = running.repair_report().cloned()
        && r.cancelled
    {
        running.shutdown().await;
        if !a.quiet && !a.json {
            outln!(
                "stopped during start-up repair: {} stream(s) caught up, {} event(s) applied; no worker was started",
                r.streams_repaired,
                r.events_applied
            )?;
        }
        return Ok(());
    }
    if let Some(r) = running.repair_report()
        && !(a.quiet || a.json)
    {
        if r.streams_repaired > 0 {
            outln!(
                "start-up repair: {} stream(s) caught up, {} event(s) applied",
                r.streams_repaired,
                r.events_applied
            )?;
        }
        if r.handed_to_worker > 0 {
            outln!(
                "start-up repair: {} stream(s) behind the journal left to the worker",
                r.handed_to_worker
            )?;
        }
        if let Some(first) = &r.left_to {
            outln!("start-up repair: left to worker {first}, started just before this one")?;
        }
    }
    if !a.quiet && !a.json {
        outln!("{} worker {} running (Ctrl-C to stop)", rt.mode(), rt.worker_id())?;
    }
    // A status line that cannot be written (stdout closed or full) stops
    // the worker gracefully, as Ctrl-C does, and the command reports it.
    let status = async {
        let lines = status_lines(&rt, a, &cancel).await;
        if lines.is_err() {
            cancel.cancel();
        }
        lines
    };

    #[cfg(feature = "serve")]
    let result = match a.metrics_addr {
        Some(addr) => {
            match crate::serve::worker_metrics(rt.clone(), ctx.journal.clone(), addr, &a.http, cancel.clone())
                .await
            {
                Ok((local, server)) => {
                    // Always printed (also with --quiet or --json: on stderr then),
                    // so a supervisor or a test learns the bound port.
                    let line = format!("metrics on http://{local}/metrics");
                    if a.quiet || a.json {
                        eprintln!("{line}");
                    } else {
                        outln!("{line}")?;
                    }
                    let (s, m) = tokio::join!(status, server);
                    s.and(m)
                }
                Err(e) => Err(e),
            }
        }
        None => status.await,
    };
    #[cfg(not(feature = "serve"))]
    let result = status.await;
    running.shutdown().await;
    result?;
    if !a.quiet && !a.json {
        outln!("stopped: leases released, nothing left processing")?;
    }
    Ok(())
}

/// Prints the worker's status every `--report-ms` (a JSON line with
/// `--json`, nothing with `--quiet`) until `cancel`.
async fn status_lines<J: CliJournal, P: CliStore>(
    rt: &outbox_runtime::Outbox<J, P>,
    a: &WorkArgs,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<()> {
    let mut every = tokio::time::interval(Duration::from_millis(a.report_ms));
    every.tick().await;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            _ = every.tick() => {
                let m = rt.metrics();
                if a.json {
                    json_line(&m)?;
                } else if !a.quiet {
                    let g = m.gauges.clone().unwrap_or_default();
                    outln!(
                        "applied {} | duplicates {} | failed {} | dead {} | queue: {} pending, {} failed, {} dead | lag {}",
                        m.applied, m.duplicates, m.failed, m.dead_lettered, g.pending, g.failed, g.dead,
                        human_ms(g.oldest_due_age_ms)
                    )?;
                }
            }
        }
    }
}
