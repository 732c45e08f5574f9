//! The raw engine loop's lag: the reference for the outbox's in-process
//! lag rows (issue 43: every figure against the minimal loop a careful
//! engineer writes by hand for the same guarantee).
//!
//! The same open-loop offer as the outbox's rounds (the same rate, events
//! per call, streams and payloads), into the raw journal, with a worker
//! thread in the same process: one writer connection per file (the
//! journal's shared by the appender and the worker under a mutex), the
//! worker woken by each append through a condition variable, and draining
//! in sweeps as the outbox does by default (the due runs of up to 64
//! streams claimed in one transaction at `NORMAL`, their events read on a
//! read-only connection, applied with the checkpoint compare-and-set in
//! one projection transaction at `FULL`, deleted in one more at `NORMAL`).
//! Appends commit at `FULL`. Lag is measured as the outbox's is: from each
//! event's scheduled time to a reader of the projection's checkpoints
//! seeing it ([`Watcher`]).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result, anyhow, ensure};

use crate::fixture::{self, stream_name};
use crate::pace::Schedule;
use crate::raw::{self, Journal, Projection};
use crate::visible::{Stamps, Watcher};

/// Rows one sweep takes at most, of each stream and in all, and the
/// streams it takes at most: the outbox's defaults.
const BATCH: i64 = 64;
const SWEEP_ROWS: i64 = 512;
const SWEEP_STREAMS: usize = 64;

/// How long the idle worker waits for an append's wake-up before it looks
/// again anyway (a wake-up is never missed: see [`Wake`]).
const IDLE_LOOK: Duration = Duration::from_millis(100);

/// The appends' count, which the worker waits to see move.
#[derive(Default)]
struct Wake {
    appended: Mutex<u64>,
    moved: Condvar,
}

impl Wake {
    fn count(&self) -> u64 {
        *self.appended.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn appended(&self) {
        *self.appended.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.moved.notify_one();
    }

    /// Waits until the count is past `seen` (read before the worker's
    /// claim found nothing, so an append in between is not missed), at
    /// most [`IDLE_LOOK`].
    fn wait_past(&self, seen: u64) {
        let guard = self.appended.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .moved
            .wait_timeout_while(guard, IDLE_LOOK, |n| *n == seen)
            .map_err(|p| p.into_inner());
    }
}

fn lock(journal: &Mutex<Journal>) -> MutexGuard<'_, Journal> {
    journal.lock().unwrap_or_else(|p| p.into_inner())
}

/// One round: `rate` events/s for `seconds` over `streams` streams,
/// `per_call` events (to distinct streams) per append transaction.
/// Returns each event's (stream, seq, scheduled time), when each was seen
/// applied, and the rate the appends achieved.
pub(crate) async fn round(
    tmp: &Path,
    seconds: u64,
    rate: f64,
    per_call: u64,
    streams: u64,
) -> Result<(Scheduled, Stamps, f64)> {
    let dir = fixture::tempdir(tmp)?;
    let journal = Journal::create(dir.path())?;
    let projection = Projection::create(dir.path())?;
    let reader = raw::journal_reader(dir.path())?;
    let watch = Watcher::raw_sqlite(&dir.path().join("raw-projection.db"))?;
    let total = (rate * seconds as f64) as u64;
    let (scheduled, achieved, versions, projection) = tokio::task::spawn_blocking(move || {
        offer_and_drain(journal, projection, reader, rate, total, per_call, streams)
    })
    .await??;
    let stamps = watch.finish().await?;
    let names: Vec<String> = (0..streams).map(|s| stream_name("l", s)).collect();
    projection.verify(&names, &versions)?;
    Ok((scheduled, stamps, achieved))
}

/// Each event's (stream, seq, scheduled time).
pub(crate) type Scheduled = Vec<(String, u64, SystemTime)>;

/// What a round's appender thread offered: each event's schedule, the
/// rate achieved, and each stream's version.
type Offered = (Scheduled, f64, Vec<u64>);

/// Starts the worker thread, offers `total` events from this one, and
/// waits for the worker to have applied them all.
fn offer_and_drain(
    journal: Journal,
    mut projection: Projection,
    reader: rusqlite::Connection,
    rate: f64,
    total: u64,
    per_call: u64,
    streams: u64,
) -> Result<(Scheduled, f64, Vec<u64>, Projection)> {
    let journal = Arc::new(Mutex::new(journal));
    let wake = Arc::new(Wake::default());
    // Set by either side when it fails, so the other stops too.
    let failed = Arc::new(AtomicBool::new(false));
    let worker = {
        let (journal, wake, failed) = (journal.clone(), wake.clone(), failed.clone());
        std::thread::Builder::new()
            .name("raw-worker".into())
            .spawn(move || {
                let out = drain(&journal, &mut projection, &reader, &wake, &failed, total);
                if out.is_err() {
                    failed.store(true, Ordering::Release);
                }
                out.map(|()| projection)
            })?
    };
    let offered = offer(&journal, &wake, &failed, rate, total, per_call, streams);
    if offered.is_err() {
        failed.store(true, Ordering::Release);
    }
    let projection = worker
        .join()
        .map_err(|_| anyhow!("the raw worker panicked"))?
        .context("the raw worker")?;
    let (scheduled, achieved, versions) = offered?;
    Ok((scheduled, achieved, versions, projection))
}

/// The paced appender: each call at the scheduled time of its last event
/// (the OS's sleep), one transaction, then the worker's wake-up. A call
/// that starts late stays late: its events' lag counts it.
fn offer(
    journal: &Mutex<Journal>,
    wake: &Wake,
    failed: &AtomicBool,
    rate: f64,
    total: u64,
    per_call: u64,
    streams: u64,
) -> Result<Offered> {
    let schedule = Schedule::at(rate);
    let names: Vec<String> = (0..streams).map(|s| stream_name("l", s)).collect();
    let mut versions = vec![0u64; streams as usize];
    let mut scheduled = Vec::with_capacity(total as usize);
    for first in (0..total).step_by(per_call as usize) {
        ensure!(!failed.load(Ordering::Acquire), "the raw worker failed");
        let last = (first + per_call).min(total) - 1;
        schedule.wait_for(last);
        let calls: Vec<(&str, u64)> = (first..=last)
            .map(|i| (names[(i % streams) as usize].as_str(), 1))
            .collect();
        lock(journal).append(&calls)?;
        wake.appended();
        for i in first..=last {
            let s = (i % streams) as usize;
            versions[s] += 1;
            scheduled.push((names[s].clone(), versions[s], schedule.wall(i)));
        }
    }
    let achieved = schedule.achieved(total);
    Ok((scheduled, achieved, versions))
}

/// The worker: sweeps until `total` events are applied.
fn drain(
    journal: &Mutex<Journal>,
    projection: &mut Projection,
    reader: &rusqlite::Connection,
    wake: &Wake,
    failed: &AtomicBool,
    total: u64,
) -> Result<()> {
    let mut applied = 0u64;
    while applied < total {
        ensure!(!failed.load(Ordering::Acquire), "the raw appender failed");
        let seen = wake.count();
        let runs = lock(journal).claim_due(SWEEP_STREAMS, BATCH, SWEEP_ROWS)?;
        if runs.is_empty() {
            wake.wait_past(seen);
            continue;
        }
        let events = raw::load_runs(reader, &runs)?;
        projection.apply_runs(&runs, &events)?;
        lock(journal).ack_runs(&runs)?;
        applied += runs.iter().map(|(_, seqs)| seqs.len() as u64).sum::<u64>();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// A short round at a low rate: every offered event is seen applied,
    /// and the projection's oracle holds (each stream's row at its
    /// version).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_round_sees_every_offered_event_applied() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (scheduled, stamps, achieved) = super::round(tmp.path(), 1, 300.0, 3, 10).await.expect("round");
        assert_eq!(scheduled.len(), 300);
        assert_eq!(stamps.len(), 300);
        for (stream, seq, _) in &scheduled {
            assert!(
                stamps.contains_key(&(stream.clone(), *seq)),
                "{stream}/{seq} never seen"
            );
        }
        assert!(achieved > 0.0);
    }
}
