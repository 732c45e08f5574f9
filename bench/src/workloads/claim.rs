//! W4: the cost of claiming one stream's version at a small and a large
//! backlog. The outbox: acquire the lease, claim up to 64 rows, abandon
//! them, release. The raw loop: claim up to 64 rows in one statement, give
//! them back in another (its claim is its lease).

use outbox_core::OutboxQueueExt as _;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use outbox_core::{LeaseStore, OutboxQueue, WorkerId};
use outbox_runtime::Config;

use super::{ROUNDS, blocking};
use crate::fixture::{self, Seen, stream, stream_name};
use crate::raw;
use crate::report::{Better, Row, median};
use crate::run::Ctx;

const CYCLES: u32 = 200;
const CLAIM: usize = 64;
/// Events per stream in the backlog (and per `append_batch` call).
pub(crate) const PER_STREAM: u64 = 1000;

pub(crate) async fn run(ctx: &mut Ctx) -> Result<()> {
    // Pre-fill every size on both sides first, then interleave sizes as
    // well as sides, so that a change in the machine's fsync latency hits
    // both sizes alike (the size ratio is the figure that matters).
    let mut sides = Vec::new();
    for n in ctx.sizes.backlogs {
        let t = Instant::now();
        let dir = prefill_outbox(ctx, n).await?;
        let tmp = ctx.tmp.clone();
        let raw_dir = blocking(move || prefill_raw(&tmp, n)).await?;
        eprintln!(
            "   backlog {n}: pre-filled both sides in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let rt = fixture::open(dir.path(), Config::producer_only(), Seen::default().into()).await?;
        let raw_path = raw_dir.path().to_path_buf();
        let j = blocking(move || raw::Journal::create(&raw_path)).await?;
        sides.push(Side {
            n,
            dir,
            _raw_dir: raw_dir,
            rt,
            raw: Some(j),
            o: Vec::new(),
            r: Vec::new(),
        });
    }
    for round in 0..ROUNDS {
        for side in &mut sides {
            side.o.push(outbox_cycles(&side.rt).await?);
            let mut j = side.raw.take().expect("journal");
            let (us, j) = blocking(move || {
                let us = raw_cycles(&mut j)?;
                Ok((us, j))
            })
            .await?;
            side.raw = Some(j);
            side.r.push(us);
            eprintln!(
                "   backlog {}, round {}: outbox {:.1} us/op, raw {:.1} us/op",
                side.n,
                round + 1,
                side.o[round],
                side.r[round]
            );
        }
    }
    let mut medians = Vec::new();
    for side in sides {
        medians.push((side.n, median(&side.o), median(&side.r)));
        ctx.rows.push(Row::pair(
            format!("W4 claim+abandon cycle at {} pending", side.n),
            "us/op",
            Better::Lower,
            side.o,
            side.r,
        ));
        side.rt.journal().close().await;
        side.rt.store().close().await;
        ctx.backlogs.push((side.n, side.dir));
    }
    if let [(n0, o0, r0), (n1, o1, r1)] = medians[..] {
        let mut row = Row::single(
            format!("W4 claim cost {n1} / {n0} pending"),
            "x",
            Better::Lower,
            vec![o1 / o0],
        )
        .with_note("time ratio; target <= 2");
        row.raw = Some(r1 / r0);
        ctx.rows.push(row);
    }
    Ok(())
}

/// One backlog size: the outbox's files and runtime, the raw journal.
struct Side {
    n: u64,
    dir: tempfile::TempDir,
    _raw_dir: tempfile::TempDir,
    rt: fixture::Rt,
    raw: Option<raw::Journal>,
    o: Vec<f64>,
    r: Vec<f64>,
}

/// An outbox journal with `n` pending rows: `n / 1000` streams of 1000
/// events, 1000 events per `append_batch` call.
pub(crate) async fn prefill_outbox(ctx: &Ctx, n: u64) -> Result<tempfile::TempDir> {
    let dir = fixture::tempdir(&ctx.tmp)?;
    let rt = fixture::open(dir.path(), Config::producer_only(), Seen::default().into()).await?;
    let streams = (n / PER_STREAM).max(1);
    fixture::prefill(&rt, "k", streams, n / streams, PER_STREAM).await?;
    let s = outbox_core::OutboxInspector::summary(rt.journal()).await?;
    ensure!(s.pending == n, "pre-fill: expected {n} pending, got {s:?}");
    rt.journal().close().await;
    rt.store().close().await;
    Ok(dir)
}

fn prefill_raw(tmp: &std::path::Path, n: u64) -> Result<tempfile::TempDir> {
    let dir = fixture::tempdir(tmp)?;
    let mut j = raw::Journal::create(dir.path())?;
    let streams = (n / PER_STREAM).max(1);
    let per_stream = n / streams;
    let names: Vec<String> = (0..streams).map(|s| stream_name("k", s)).collect();
    if streams >= PER_STREAM {
        for _ in 0..per_stream {
            for chunk in names.chunks(PER_STREAM as usize) {
                let reqs: Vec<(&str, u64)> = chunk.iter().map(|s| (s.as_str(), 1)).collect();
                j.append(&reqs)?;
            }
        }
    } else {
        for s in &names {
            j.append(&[(s.as_str(), per_stream)])?;
        }
    }
    Ok(dir)
}

/// µs per cycle over `CYCLES` cycles on stream 0.
async fn outbox_cycles(rt: &fixture::Rt) -> Result<f64> {
    let j = rt.journal();
    let s = stream("k", 0)?;
    let owner = WorkerId::new("bench-claim")?;
    let ttl = Duration::from_secs(30);
    let t = Instant::now();
    for _ in 0..CYCLES {
        let Some(lease) = j.acquire(&s, &owner, ttl).await? else {
            anyhow::bail!("lease on {s} not acquired");
        };
        let rows = j.claim(&lease, CLAIM).await?;
        ensure!(rows.len() == CLAIM, "claimed {} rows, wanted {CLAIM}", rows.len());
        j.complete_and_release(&lease, None, true).await?;
        j.release(&lease).await?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / f64::from(CYCLES))
}

fn raw_cycles(j: &mut raw::Journal) -> Result<f64> {
    let s = stream_name("k", 0);
    let t = Instant::now();
    for _ in 0..CYCLES {
        let n = j.claim_cycle(&s, CLAIM as i64)?;
        ensure!(n == CLAIM, "raw claimed {n} rows, wanted {CLAIM}");
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / f64::from(CYCLES))
}
