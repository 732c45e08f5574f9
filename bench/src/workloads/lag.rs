//! W3: end-to-end lag at a fixed offered rate, open loop: each append is
//! scheduled at a fixed interval and its lag runs from the scheduled time
//! to the projection's having applied it visibly: committed, as a reader
//! of its checkpoints sees it (wall clock; see `crate::visible`). In-process
//! (wake-on-append) and across processes (a worker in a child process,
//! woken by the journal's wake source; the appender is producer-only).

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result};
use outbox_core::{AppendRequest, ExpectedVersion};
use outbox_runtime::{Config, JournalBackend, Outbox, ProjectionBackend};

use super::ROUNDS;
use crate::fixture::{self, Seen, stream, stream_name};
use crate::pace::Schedule;
use crate::report::{Better, Row, percentile};
use crate::run::Ctx;
use crate::visible::{Stamps, Watcher};

pub(crate) const STREAMS: u64 = 100;
const DEFAULT_RATE: f64 = 1000.0;

/// Fixed rates also measured, in and across processes: where the lag
/// stays low, and the wake-up path without queueing.
const FIXED_RATES: [f64; 3] = [10_000.0, 2_000.0, 200.0];

/// The most append calls a second the half-load run makes: above it,
/// events go several to a call (`append_batch`, distinct streams), since
/// single-event appends alone peak well below that rate on this
/// machine kind. Each event's lag still runs from its own scheduled time.
pub(crate) const MAX_CALLS_PER_SECOND: f64 = 2_000.0;

pub(crate) async fn run(ctx: &mut Ctx) -> Result<()> {
    let half = half_load(ctx);
    let per_call = (half / MAX_CALLS_PER_SECOND).ceil().clamp(1.0, STREAMS as f64) as u64;
    at_rate(ctx, half, per_call, false).await?;
    at_rate(ctx, half, per_call, true).await?;
    for rate in FIXED_RATES {
        at_rate(ctx, rate, 1, false).await?;
        at_rate(ctx, rate, 1, true).await?;
    }
    Ok(())
}

/// Half the pipeline's measured maximum: half the slower of its two
/// halves, the drain (sweeps, 100 streams, batch 64) and the append (100
/// events per call), as measured in this run. Appends and the drain share
/// the one writer, so a rate the appends alone cannot take is not half of
/// anything: the drain now outruns the appends several times over, and
/// half its rate exceeds even the raw engine loop's append rate at 100 per
/// transaction (said on stderr when it does).
fn half_load(ctx: &Ctx) -> f64 {
    let slower = match (ctx.drain_64, ctx.append_100) {
        (Some(d), Some(a)) => d.min(a),
        (Some(r), None) | (None, Some(r)) => r,
        (None, None) => 2.0 * DEFAULT_RATE,
    };
    if let (Some(d), Some(raw)) = (ctx.drain_64, ctx.raw_append_100)
        && d / 2.0 > raw
    {
        eprintln!(
            "   half the drain rate ({:.0} ev/s) is more than the raw engine loop appends at 100 per transaction ({raw:.0} ev/s); offering half the slower of the drain and the 100-per-call append",
            d / 2.0
        );
    }
    (slower / 2.0).floor().max(1.0)
}

async fn at_rate(ctx: &mut Ctx, rate: f64, per_call: u64, across: bool) -> Result<()> {
    let (tmp, seconds) = (ctx.tmp.clone(), ctx.sizes.lag_seconds);
    let how = if across {
        "worker in another process, data_version wake-up"
    } else {
        "wake-on-append"
    };
    // The raw engine loop runs its worker in the appender's process: it is
    // the reference of the in-process rows only.
    let sides: &[Side] = if across {
        &[Side::Outbox]
    } else {
        &[Side::Outbox, Side::Raw]
    };
    measure(
        ctx,
        &format!("W3 lag {{}}, {how}"),
        rate,
        per_call,
        sides,
        |side| {
            let tmp = tmp.clone();
            async move {
                match (side, across) {
                    (Side::Raw, _) => raw_round(&tmp, seconds, rate, per_call).await,
                    (Side::Outbox, true) => across_processes(&tmp, seconds, rate, per_call).await,
                    (Side::Outbox, false) => one_run(&tmp, seconds, rate, per_call, || Ok(())).await,
                }
            }
        },
    )
    .await
}

/// One round of the raw engine loop ([`crate::raw_lag`]) over the same
/// streams: each event's lag in ms and the rate its appends achieved.
async fn raw_round(tmp: &std::path::Path, seconds: u64, rate: f64, per_call: u64) -> Result<(Vec<f64>, f64)> {
    let (scheduled, stamps, achieved) = crate::raw_lag::round(tmp, seconds, rate, per_call, STREAMS).await?;
    Ok((lags(scheduled, &stamps)?, achieved))
}

/// Which loop a lag round runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// The outbox.
    Outbox,
    /// The raw engine loop ([`crate::raw_lag`]).
    Raw,
}

/// The percentiles of one side's rounds.
#[derive(Default)]
struct Figures {
    p50: Vec<f64>,
    p99: Vec<f64>,
    max: Vec<f64>,
    achieved: Vec<f64>,
}

/// Runs [`ROUNDS`] rounds of `round` for each of `sides` (interleaved:
/// each round runs every side in turn; each gives its lags in ms and the
/// rate its appends achieved) at `rate`, prints each, and adds the p50,
/// p99 and max rows, named by `name` with `{}` standing for the figure:
/// the outbox's, against the raw engine loop's when `sides` has it.
pub(crate) async fn measure<F, Fut>(
    ctx: &mut Ctx,
    name: &str,
    rate: f64,
    per_call: u64,
    sides: &[Side],
    mut round: F,
) -> Result<()>
where
    F: FnMut(Side) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<f64>, f64)>>,
{
    let (mut outbox, mut raw) = (Figures::default(), Figures::default());
    let mut failed = None;
    'rounds: for n in 0..ROUNDS {
        for &side in sides {
            // A round that cannot keep up (its appends pass the store
            // deadline) is a figure too: the row says so and the run goes on.
            let (mut lags, sent_rate) = match round(side).await {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("   round {} ({side:?}): did not keep up: {e:#}", n + 1);
                    failed = Some(format!("round {} ({side:?}) did not keep up: {e}", n + 1));
                    break 'rounds;
                }
            };
            lags.sort_by(f64::total_cmp);
            let figures = if side == Side::Raw { &mut raw } else { &mut outbox };
            figures.p50.push(percentile(&lags, 50.0));
            figures.p99.push(percentile(&lags, 99.0));
            figures.max.push(*lags.last().context("no events")?);
            figures.achieved.push(sent_rate);
            eprintln!(
                "   round {} ({side:?}): {} events offered at {rate} ev/s, {per_call} per call (appended at {sent_rate:.0} ev/s): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                n + 1,
                lags.len(),
                percentile(&lags, 50.0),
                percentile(&lags, 99.0),
                lags.last().copied().unwrap_or_default()
            );
        }
    }
    let mut note = format!(
        "{rate:.0} ev/s offered, {per_call} per call, {:.0} ev/s appended, {} s",
        crate::report::median(&outbox.achieved),
        ctx.sizes.lag_seconds
    );
    if !raw.achieved.is_empty() {
        note = format!(
            "{note}; the raw engine loop appended {:.0} ev/s",
            crate::report::median(&raw.achieved)
        );
    }
    if let Some(failed) = failed {
        note = format!("{note}; {failed}");
    }
    let with_raw = sides.contains(&Side::Raw) && !raw.p50.is_empty();
    for (what, o, r) in [
        ("p50", outbox.p50, raw.p50),
        ("p99", outbox.p99, raw.p99),
        ("max", outbox.max, raw.max),
    ] {
        let name = name.replace("{}", what);
        let row = if with_raw {
            Row::pair(name, "ms", Better::Lower, o, r)
        } else {
            Row::single(name, "ms", Better::Lower, o)
        };
        ctx.rows.push(row.with_note(note.clone()));
    }
    Ok(())
}

/// The flag of [`profile`].
pub(crate) const PROFILE_FLAG: &str = "--profile-lag";

/// The flag of [`profile`] with the worker in another process.
pub(crate) const PROFILE_ACROSS_FLAG: &str = "--profile-lag-across";

/// The flag of [`profile`] for the raw engine loop.
pub(crate) const PROFILE_RAW_FLAG: &str = "--profile-lag-raw";

/// Where [`profile`] runs its worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProfileMode {
    /// The outbox's worker in this process.
    InProcess,
    /// The outbox's worker in a child process.
    Across,
    /// The raw engine loop ([`crate::raw_lag`]).
    Raw,
}

/// `--profile-lag RATE PER_CALL SECONDS ROUNDS`: in-process open-loop runs
/// at RATE ev/s, PER_CALL events per call, and nothing else (sampled, as
/// `--profile-drain`, only while appending and draining); prints each
/// round's lag percentiles. With [`ProfileMode::Across`]
/// (`--profile-lag-across`), the worker runs in a child process and this
/// one only appends (the profiler's gate is not used: the child is a
/// process of its own); with [`ProfileMode::Raw`] (`--profile-lag-raw`),
/// the raw engine loop runs instead of the outbox (not gated either).
pub(crate) fn profile(mut args: impl Iterator<Item = String>, mode: ProfileMode) -> Result<()> {
    let flag = match mode {
        ProfileMode::InProcess => PROFILE_FLAG,
        ProfileMode::Across => PROFILE_ACROSS_FLAG,
        ProfileMode::Raw => PROFILE_RAW_FLAG,
    };
    let mut number = |what: &str| super::profile_number(flag, &mut args, what);
    let (rate, per_call, seconds) = (number("RATE")?, number("PER_CALL")?, number("SECONDS")?);
    let rounds = number("ROUNDS")?;
    anyhow::ensure!(
        rate > 0 && per_call > 0 && seconds > 0,
        "{flag}: every number must be positive"
    );
    super::profile_rounds(rounds, |tmp, gate| async move {
        let (mut lags, sent) = match mode {
            ProfileMode::Across => across_processes(&tmp, seconds, rate as f64, per_call).await?,
            ProfileMode::InProcess => one_run(&tmp, seconds, rate as f64, per_call, gate).await?,
            ProfileMode::Raw => raw_round(&tmp, seconds, rate as f64, per_call).await?,
        };
        lags.sort_by(f64::total_cmp);
        eprintln!(
            "   p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            percentile(&lags, 50.0),
            percentile(&lags, 99.0),
            lags.last().copied().unwrap_or_default()
        );
        Ok(sent)
    })
}

/// Lags in ms of one open-loop run, and the rate the appends achieved;
/// `gate` is called once the worker runs, before the first append.
async fn one_run(
    tmp: &std::path::Path,
    seconds: u64,
    rate: f64,
    per_call: u64,
    gate: impl FnOnce() -> Result<()>,
) -> Result<(Vec<f64>, f64)> {
    let dir = fixture::tempdir(tmp)?;
    let total = (rate * seconds as f64) as u64;
    let seen = Arc::new(Seen::recording());
    let config = Config::apply_worker().with_repair_on_start(false);
    let rt = fixture::open(dir.path(), config, seen.clone()).await?;
    let watch = Watcher::sqlite_unless_to_apply(&dir.path().join("projections.db"))?;
    in_process(&rt, &seen, rate, total, per_call, gate, watch).await
}

/// The open-loop run of [`one_run`] on any backend: `rt` has the apply
/// worker and records into `seen`, `watch` reads its projection's
/// checkpoints; returns the lags to visibility in ms and the rate the
/// appends achieved.
pub(crate) async fn in_process<J: JournalBackend, P: ProjectionBackend>(
    rt: &Outbox<J, P>,
    seen: &Seen,
    rate: f64,
    total: u64,
    per_call: u64,
    gate: impl FnOnce() -> Result<()>,
    watch: Option<Watcher>,
) -> Result<(Vec<f64>, f64)> {
    let running = rt.start().await?;
    gate()?;
    let streams: Vec<_> = (0..STREAMS).map(|s| stream("l", s)).collect::<Result<_>>()?;
    let offered = offer(rt, &streams, rate, total, per_call).await?;
    fixture::wait_drained(rt, seen, total, Duration::from_secs(120)).await?;
    let visible = Watcher::finish_or(watch, seen.applied_at()?).await?;
    running.shutdown().await;
    fixture::verify(rt, seen, "l", &offered.versions).await?;
    print_split(&offered, &seen.applied_at()?, &visible);
    print_store_calls(&rt.metrics().store_calls);
    Ok((lags(offered.scheduled, &visible)?, offered.rate))
}

/// Prints (stderr) the store calls the runtime spent most time in during
/// the round, as its store decorator counted them: where the worker's and
/// the appender's time went.
pub(crate) fn print_store_calls(calls: &[outbox_runtime::StoreCallStats]) {
    let mut calls: Vec<_> = calls.iter().filter(|c| c.calls > 0).collect();
    calls.sort_by_key(|c| std::cmp::Reverse(c.total_us));
    let top: Vec<String> = calls
        .iter()
        .take(6)
        .map(|c| {
            format!(
                "{} {}x {:.2} ms avg {:.1} ms max",
                c.call,
                c.calls,
                c.total_us as f64 / c.calls as f64 / 1e3,
                c.max_us as f64 / 1e3
            )
        })
        .collect();
    eprintln!("   store calls by time: {}", top.join("; "));
}

/// Prints (stderr) the p50 and p99 of the time from each event's scheduled
/// time to its call's acknowledgement (the appender's part of the lag),
/// from there to the projection's apply of it (`applied`: stamped inside
/// the apply transaction), and from the apply to its being visible
/// (`visible`: the commit and the reader's poll).
fn print_split(offered: &Offered, applied: &Stamps, visible: &Stamps) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut to_ack: Vec<f64> = Vec::with_capacity(offered.acked.len());
    let mut to_apply: Vec<f64> = Vec::with_capacity(offered.acked.len());
    let mut to_visible: Vec<f64> = Vec::with_capacity(offered.acked.len());
    for ((s, seq, sent), ack) in offered.scheduled.iter().zip(&offered.acked) {
        to_ack.push(ms(ack.duration_since(*sent).unwrap_or_default()));
        let key = (s.clone(), *seq);
        if let Some(at) = applied.get(&key) {
            to_apply.push(ms(at.duration_since(*ack).unwrap_or_default()));
            if let Some(seen) = visible.get(&key) {
                to_visible.push(ms(seen.duration_since(*at).unwrap_or_default()));
            }
        }
    }
    for (what, mut v) in [
        ("scheduled to acknowledged", to_ack),
        ("acknowledged to applied", to_apply),
        ("applied to visible", to_visible),
    ] {
        v.sort_by(f64::total_cmp);
        if let Some(max) = v.last() {
            eprintln!(
                "   {what}: p50 {:.2} ms, p99 {:.2} ms, max {max:.2} ms",
                percentile(&v, 50.0),
                percentile(&v, 99.0)
            );
        }
    }
}

/// What [`offer`] appended.
pub(crate) struct Offered {
    /// Each event's stream, seq and scheduled wall time.
    pub(crate) scheduled: Vec<(String, u64, SystemTime)>,
    /// When each event's call was acknowledged (as `scheduled`).
    pub(crate) acked: Vec<SystemTime>,
    /// Each stream's version.
    pub(crate) versions: Vec<u64>,
    /// The rate the appends achieved: events over the time to the last
    /// acknowledgement.
    pub(crate) rate: f64,
}

/// Appends `total` events round-robin over `streams` at `rate`, open
/// loop, `per_call` events to distinct streams per `append_batch`: each
/// call starts at the scheduled time of its last event as a task of its
/// own, so calls whose predecessors are still committing run concurrently
/// (and share commits) instead of falling behind the schedule.
///
/// The calls are paced from a thread of their own with the OS's sleep
/// (tens of microseconds late), not with tokio's timer: that fires on
/// whole milliseconds, on workers the outbox's own tasks keep busy, and
/// calls started 0.8 ms after their schedule at the median (1.8 ms at p99,
/// at half load), lateness of the load generator that the lag counted.
pub(crate) async fn offer<J: JournalBackend, P: ProjectionBackend>(
    rt: &Outbox<J, P>,
    streams: &[outbox_core::StreamId],
    rate: f64,
    total: u64,
    per_call: u64,
) -> Result<Offered> {
    let schedule = Schedule::at(rate);
    let runtime = tokio::runtime::Handle::current();
    let (rt, all) = (rt.clone(), streams.to_vec());
    let tasks = tokio::task::spawn_blocking(move || {
        let mut tasks = Vec::with_capacity(total.div_ceil(per_call) as usize);
        for first in (0..total).step_by(per_call as usize) {
            let last = (first + per_call).min(total) - 1;
            schedule.wait_for(last);
            let calls: Vec<(usize, outbox_core::StreamId, SystemTime)> = (first..=last)
                .map(|i| {
                    let s = (i % all.len() as u64) as usize;
                    (s, all[s].clone(), schedule.wall(i))
                })
                .collect();
            tasks.push(runtime.spawn(append_call(rt.clone(), first, calls)));
        }
        tasks
    })
    .await?;
    let mut versions = vec![0u64; streams.len()];
    let mut scheduled = Vec::with_capacity(total as usize);
    let mut acked = Vec::with_capacity(total as usize);
    for task in tasks {
        let (events, ack) = task.await??;
        for (s, seq, at) in events {
            versions[s] = versions[s].max(seq);
            scheduled.push((stream_name("l", s as u64), seq, at));
            acked.push(ack);
        }
    }
    Ok(Offered {
        scheduled,
        acked,
        versions,
        rate: schedule.achieved(total),
    })
}

/// How many times a call of [`offer`] is made again after a temporary error.
const TEMPORARY_RETRIES: u32 = 5;

/// One call of [`offer`]: `calls` (stream index, stream, scheduled time)
/// in one `append_batch`, event numbers from `first`; returns each
/// event's stream index, seq and scheduled time, and when the call was
/// acknowledged.
#[allow(clippy::type_complexity)]
async fn append_call<J: JournalBackend, P: ProjectionBackend>(
    rt: Outbox<J, P>,
    first: u64,
    calls: Vec<(usize, outbox_core::StreamId, SystemTime)>,
) -> Result<(Vec<(usize, u64, SystemTime)>, SystemTime)> {
    let mut batch = Vec::with_capacity(calls.len());
    for (k, (_, stream, _)) in calls.iter().enumerate() {
        let e = fixture::new_event(&rt, first + k as u64)?;
        batch.push(AppendRequest::new(stream.clone(), ExpectedVersion::Any, vec![e]));
    }
    // A temporary error (on Postgres, a deadlock between appends creating
    // the same new streams) committed nothing: the call is made again, as
    // an application would, and its events' lag includes the retry.
    let mut tries = 0;
    let appended = loop {
        match rt.append_batch(batch.clone()).await {
            Err(e) if e.is_temporary() && tries < TEMPORARY_RETRIES => {
                tries += 1;
                eprintln!("   append retried after a temporary error: {e}");
            }
            result => break result?,
        }
    };
    anyhow::ensure!(
        appended.appended.len() == calls.len(),
        "appended {} of {}",
        appended.appended.len(),
        calls.len()
    );
    let ack = SystemTime::now();
    Ok((
        calls
            .into_iter()
            .zip(&appended.appended)
            .map(|((s, _, at), a)| (s, a.last_seq.get(), at))
            .collect(),
        ack,
    ))
}

/// Each scheduled append's lag in ms, to when `visible` says it was seen.
pub(crate) fn lags(scheduled: Vec<(String, u64, SystemTime)>, visible: &Stamps) -> Result<Vec<f64>> {
    scheduled
        .into_iter()
        .map(|(s, seq, sent)| {
            let applied = visible
                .get(&(s.clone(), seq))
                .with_context(|| format!("{s}/{seq} never seen applied"))?;
            Ok(applied.duration_since(sent).unwrap_or_default().as_secs_f64() * 1e3)
        })
        .collect()
}

/// The hidden first argument that makes the binary the lag child.
pub(crate) const CHILD_FLAG: &str = "--lag-child";

/// Lags in ms with the worker in a child process (`--lag-child DIR TOTAL`)
/// and this process appending through a producer-only runtime.
async fn across_processes(
    tmp: &std::path::Path,
    seconds: u64,
    rate: f64,
    per_call: u64,
) -> Result<(Vec<f64>, f64)> {
    let dir = fixture::tempdir(tmp)?;
    // Creates both files before the child opens them.
    let rt = fixture::open(dir.path(), Config::producer_only(), Arc::new(Seen::default())).await?;
    let total = (rate * seconds as f64) as u64;
    let args = [
        CHILD_FLAG.into(),
        dir.path().as_os_str().to_owned(),
        total.to_string().into(),
    ];
    let watch = Watcher::sqlite_unless_to_apply(&dir.path().join("projections.db"))?;
    with_child(&rt, &args, rate, total, per_call, watch).await
}

/// Starts this binary with `args` as the worker's process, waits for its
/// `ready`, appends `total` events through `rt` (producer-only) at `rate`
/// and returns each event's lag to visibility in ms (as `watch`, in this
/// process, sees the projection's checkpoints) and the rate the appends
/// achieved.
pub(crate) async fn with_child<J: JournalBackend, P: ProjectionBackend>(
    rt: &Outbox<J, P>,
    args: &[std::ffi::OsString],
    rate: f64,
    total: u64,
    per_call: u64,
    watch: Option<Watcher>,
) -> Result<(Vec<f64>, f64)> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the lag child")?;
    let mut out = BufReader::new(child.stdout.take().context("child stdout")?);
    let ready = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        out.read_line(&mut line).map(|_| (line, out))
    })
    .await??;
    anyhow::ensure!(ready.0.trim() == "ready", "lag child: {:?}", ready.0);
    let mut out = ready.1;
    let streams: Vec<_> = (0..STREAMS).map(|s| stream("l", s)).collect::<Result<_>>()?;
    let offered = offer(rt, &streams, rate, total, per_call).await?;
    let applied: Vec<(String, u64, u64)> = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        out.read_line(&mut line)?;
        anyhow::Ok(serde_json::from_str(&line)?)
    })
    .await??;
    anyhow::ensure!(child.wait()?.success(), "lag child failed");
    let at: Stamps = applied
        .into_iter()
        .map(|(s, q, ns)| ((s, q), SystemTime::UNIX_EPOCH + Duration::from_nanos(ns)))
        .collect();
    let visible = Watcher::finish_or(watch, at.clone()).await?;
    print_split(&offered, &at, &visible);
    Ok((lags(offered.scheduled, &visible)?, offered.rate))
}

/// The child: opens the files in DIR with the apply worker and the
/// journal's wake source and serves as [`serve_child`] says.
pub(crate) fn child(mut args: impl Iterator<Item = String>) -> Result<()> {
    let dir = std::path::PathBuf::from(args.next().context("DIR")?);
    let total: u64 = args.next().context("TOTAL")?.parse()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let seen = Arc::new(Seen::recording());
        let rt = fixture::open_with(&dir, child_config(), seen.clone(), true).await?;
        serve_child(&rt, &seen, total).await
    })
}

/// The worker configuration of a lag child: no poll to speak of, so only
/// the wake source can start a pass.
pub(crate) fn child_config() -> Config {
    Config::apply_worker()
        .with_repair_on_start(false)
        .with_poll_interval(Duration::from_secs(60))
}

/// A lag child's work once its runtime `rt` is open (recording into
/// `seen`): starts the worker, says `ready`, waits until TOTAL events are
/// applied, checks them with the oracle and prints when each was applied as
/// JSON `[[stream, seq, unix_ns], ...]`.
pub(crate) async fn serve_child<J: JournalBackend, P: ProjectionBackend>(
    rt: &Outbox<J, P>,
    seen: &Seen,
    total: u64,
) -> Result<()> {
    let running = rt.start().await?;
    println!("ready");
    fixture::wait_drained(rt, seen, total, Duration::from_secs(120)).await?;
    running.shutdown().await;
    let per_stream = seen
        .per_stream
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let versions: Vec<u64> = (0..STREAMS)
        .map(|s| per_stream.get(&stream_name("l", s)).copied().unwrap_or(0))
        .collect();
    fixture::verify(rt, seen, "l", &versions).await?;
    let at = seen.applied_at()?;
    let rows: Vec<(String, u64, u64)> = at
        .iter()
        .map(|((s, q), t)| {
            let ns = t
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos() as u64;
            (s.clone(), *q, ns)
        })
        .collect();
    println!("{}", serde_json::to_string(&rows)?);
    Ok(())
}
