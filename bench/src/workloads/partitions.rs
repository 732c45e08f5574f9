//! W9: partition leasing against per-stream leasing (issue 13). N workers
//! (runtimes with their own connections, as N processes would have) drain
//! one backlog of 100 streams together, with partition leasing on
//! (`Config::leasing`, the default) and off (every worker competes for
//! every stream with stream leases), at 1, 2 and 4 workers, on SQLite and
//! on Postgres; the ratio is partitioned over per-stream throughput in the
//! same run. The workers are registered before they start, so each one's
//! first synchronisation already takes its final share (the rebalance
//! itself is measured by the multi-process test, not here).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use outbox_core::{Mode, WorkerId};
use outbox_runtime::{JournalBackend, Outbox, ProjectionBackend};

use super::ROUNDS;
use crate::fixture::{self, Seen};
use crate::report::{Better, Row};
use crate::run::Ctx;

/// Streams of the backlog.
const STREAMS: u64 = 100;

/// Worker counts compared.
const WORKERS: [usize; 3] = [1, 2, 4];

pub(crate) async fn run(ctx: &mut Ctx) -> Result<()> {
    // Five times the drain workload's events: at 100k events/s a round of
    // 20,000 would be over before the workers' start-up stops mattering.
    let per_stream = 5 * ctx.sizes.events / STREAMS;
    counts(ctx, per_stream).await?;
    let url = std::env::var("OUTBOX_TEST_DATABASE_URL")
        .ok()
        .filter(|u| !u.is_empty());
    for backend in ["SQLite", "Postgres"] {
        if backend == "Postgres" && url.is_none() {
            eprintln!(
                "   Postgres skipped: OUTBOX_TEST_DATABASE_URL is not set (cargo xtask bench starts a server)"
            );
            continue;
        }
        for workers in WORKERS {
            let (mut o, mut r) = (Vec::new(), Vec::new());
            for round in 0..ROUNDS {
                for leasing in [true, false] {
                    let rate = match &url {
                        Some(url) if backend == "Postgres" => {
                            pg_round(url, workers, per_stream, leasing).await?
                        }
                        _ => sqlite_round(ctx, workers, per_stream, leasing, None).await?,
                    };
                    if leasing { &mut o } else { &mut r }.push(rate);
                }
                eprintln!(
                    "   {backend}, {workers} worker(s), round {}: partition leasing {:.0} ev/s, stream leases {:.0} ev/s",
                    round + 1,
                    o[round],
                    r[round]
                );
            }
            ctx.rows.push(
                Row::pair(
                    format!(
                        "W9 drain by {workers} worker(s), {backend} ({STREAMS} streams x {per_stream} events, batch 64)"
                    ),
                    "events/s",
                    Better::Higher,
                    o,
                    r,
                )
                .with_note("outbox column: partition leasing; raw column: stream leases (OUTBOX_LEASING=false)"),
            );
        }
    }
    Ok(())
}

fn config(i: usize, leasing: bool) -> Result<outbox_runtime::Config> {
    Ok(fixture::worker_config(64)
        .with_leasing(leasing)
        .with_worker_id(WorkerId::new(format!("bench-w{i}"))?))
}

/// The default partition count against others: one worker on SQLite
/// claims inside all of them (a seek per partition per claim).
async fn counts(ctx: &mut Ctx, per_stream: u64) -> Result<()> {
    for count in [4u16, 64, 256] {
        let (mut o, mut r) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            o.push(sqlite_round(ctx, 1, per_stream, true, Some(count)).await?);
            r.push(sqlite_round(ctx, 1, per_stream, true, Some(outbox_core::DEFAULT_PARTITIONS)).await?);
            eprintln!(
                "   SQLite, 1 worker, round {}: {count} partitions {:.0} ev/s, {} partitions {:.0} ev/s",
                round + 1,
                o[round],
                outbox_core::DEFAULT_PARTITIONS,
                r[round]
            );
        }
        ctx.rows.push(
            Row::pair(
                format!("W9 drain in {count} partitions, 1 worker, SQLite ({STREAMS} streams x {per_stream} events)"),
                "events/s",
                Better::Higher,
                o,
                r,
            )
            .with_note(format!(
                "raw column: the default {} partitions",
                outbox_core::DEFAULT_PARTITIONS
            )),
        );
    }
    Ok(())
}

async fn sqlite_round(
    ctx: &Ctx,
    workers: usize,
    per_stream: u64,
    leasing: bool,
    partitions: Option<u16>,
) -> Result<f64> {
    let dir = fixture::tempdir(&ctx.tmp)?;
    let seen = Arc::new(Seen::default());
    let mut rts = Vec::new();
    for i in 0..workers {
        rts.push(
            fixture::open_partitioned(dir.path(), config(i, leasing)?, seen.clone(), false, partitions)
                .await?,
        );
    }
    drain(&rts, &seen, per_stream).await
}

async fn pg_round(url: &str, workers: usize, per_stream: u64, leasing: bool) -> Result<f64> {
    let schema = crate::pg::schema("parts");
    let seen = Arc::new(Seen::default());
    let mut rts = Vec::new();
    for i in 0..workers {
        rts.push(crate::pg::open(url, &schema, config(i, leasing)?, seen.clone(), false).await?);
    }
    let rate = drain(&rts, &seen, per_stream).await;
    for rt in &rts {
        rt.journal().close().await;
    }
    crate::pg::drop_schema(url, &schema).await?;
    rate
}

/// Pre-fills through the first runtime (not timed), registers every worker,
/// starts them all and times until the backlog is applied; checks it.
async fn drain<J: JournalBackend, P: ProjectionBackend>(
    rts: &[Outbox<J, P>],
    seen: &Seen,
    per_stream: u64,
) -> Result<f64> {
    let versions = fixture::prefill(&rts[0], "p", STREAMS, per_stream, STREAMS).await?;
    for rt in rts {
        rt.journal()
            .heartbeat(
                rt.worker_id(),
                &outbox_runtime::host_name(),
                std::process::id(),
                Mode::OutboxApplyOnly,
                Duration::from_secs(15),
            )
            .await?;
    }
    let total = STREAMS * per_stream;
    let t = Instant::now();
    let mut running = Vec::new();
    for rt in rts {
        running.push(rt.start().await?);
    }
    fixture::wait_drained(&rts[0], seen, total, Duration::from_secs(600)).await?;
    let rate = total as f64 / t.elapsed().as_secs_f64();
    for r in running {
        r.shutdown().await;
    }
    fixture::verify(&rts[0], seen, "p", &versions).await?;
    Ok(rate)
}
