//! Sweeps: one pass over many due streams in three commits (ADR 0016).
//!
//! A sweep leases due streams and claims the head run of each in one
//! journal commit, which on SQLite also reads the runs' events
//! ([`outbox_core::OutboxQueue::take`]), applies every
//! run in one projection transaction ([`outbox_core::ProjectionStore::apply_runs`]) and
//! completes and releases them in one more journal commit
//! ([`outbox_core::OutboxQueue::finish`]). Only runs of fresh rows go
//! together; a run with a retried or unfinished row, a run whose events do
//! not load, a run whose projection is behind and a run whose applier fails
//! are drained on their own by the per-stream path
//! ([`Worker::process_leased`]), which isolates failures exactly as it does
//! without sweeps. The checkpoint compare-and-set stays the safety net: a
//! sweep that dies anywhere leaves rows the next claim finds, and the apply
//! skips what was committed.

use std::collections::HashSet;

use outbox_core::{
    ApplyOutcome, ClaimedRun, Error, Event, EventJournal, Lease, OutboxQueue, OutboxRow, PartitionStore,
    ProjectionStore, Result, Seq, StreamEnd, SweepLimits, spi::all_applied,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};

use super::{TickReport, Worker, WorkerKind, complete_run};
use crate::bounded::stalled;
use crate::metrics::Metrics;
use crate::outbox::{JournalBackend, ProjectionBackend};

/// One stream of a sweep: its lease, its claimed run and (once loaded) the run's events.
struct Taken {
    lease: Lease,
    rows: Vec<OutboxRow>,
    events: Vec<Event>,
    /// The event a projection's applier failed on, and the error, once
    /// known: the run applied together is cut before it, and the rest of it
    /// (`rest`) is applied without that projection afterwards (ADR 0032).
    failed: Option<(Seq, Error)>,
    /// The run from the failed event on.
    rest: Vec<Event>,
}

impl<J: JournalBackend, P: ProjectionBackend> Worker<'_, J, P> {
    /// A pass made of sweeps: up to `batches_per_stream` of them, each over
    /// the streams due at the time, until one finds nothing to take. While
    /// a sweep applies, the sweep before it ends (completes and releases)
    /// and the next one is claimed, in that order (it cannot take the
    /// current sweep's streams: their leases are held); on SQLite the two
    /// share a commit (group commit), so the worker waits on no journal
    /// commit between projection transactions.
    pub(crate) async fn sweep_tick(
        &self,
        kind: WorkerKind,
        cancel: &CancellationToken,
    ) -> Result<TickReport> {
        let mut report = TickReport::default();
        // The ends of the last sweep applied, not yet committed: they go
        // with the next claim (see `end_then_claim`), and whatever is left
        // when the pass stops is ended before it returns.
        let mut ending = Vec::new();
        let result = self.sweeps(kind, cancel, &mut report, &mut ending).await;
        if !ending.is_empty() {
            let _ = self
                .end_then_claim(kind, std::mem::take(&mut ending), false, &mut report)
                .await;
        }
        result.map(|()| report)
    }

    /// The sweeps of one pass (see [`Worker::sweep_tick`]).
    async fn sweeps(
        &self,
        kind: WorkerKind,
        cancel: &CancellationToken,
        report: &mut TickReport,
        ending: &mut Vec<StreamEnd>,
    ) -> Result<()> {
        let inner = &self.rt.inner;
        let config = &inner.config;
        // Streams this pass took up, each counted once however many sweeps took it.
        let mut seen = HashSet::new();
        let mut next = if cancel.is_cancelled() {
            Vec::new()
        } else {
            self.claim_sweep().await?
        };
        // When `next` was claimed: its leases are not renewed while it waits.
        let mut claimed_at = Instant::now();
        for round in 1..=config.batches_per_stream {
            if next.is_empty() {
                break;
            }
            if cancel.is_cancelled() {
                // Claimed ahead but not to be applied: give it back.
                self.give_up(next.into_iter().map(|r| r.lease), Vec::new()).await;
                break;
            }
            if claimed_at.elapsed() > self.rt.claim_ttl() / 3 {
                // The sweep before took long (streams drained on their
                // own): give back what waited and take a fresh claim, so
                // no lease of this sweep is near its expiry.
                self.give_up(next.into_iter().map(|r| r.lease), Vec::new()).await;
                next = self
                    .end_then_claim(kind, std::mem::take(ending), true, report)
                    .await?;
                if next.is_empty() {
                    break;
                }
            }
            let taken = std::mem::take(&mut next);
            for ClaimedRun { lease, .. } in &taken {
                if seen.insert(lease.stream.clone()) {
                    report.due_streams += 1;
                    report.leased += 1;
                }
            }
            let span = info_span!(
                "sweep",
                streams = taken.len(),
                worker = %inner.worker_id,
                otel.kind = "internal",
                messaging.system = "outbox",
                messaging.operation.type = "process",
                messaging.batch.message_count = taken.iter().map(|r| r.rows.len()).sum::<usize>(),
            );
            let ahead = round < config.batches_per_stream && !cancel.is_cancelled();
            let mut done = TickReport::default();
            let claim_started = Instant::now();
            // This sweep applies while the last one ends and the next one
            // is claimed: the worker waits on neither journal commit.
            let (previous, mut ended) = (std::mem::take(ending), TickReport::default());
            let (swept, claimed) = tokio::join!(
                self.sweep(kind, taken, &mut done, cancel).instrument(span),
                self.end_then_claim(kind, previous, ahead, &mut ended)
            );
            report.add(&done);
            report.add(&ended);
            let failed = match swept {
                Ok(ends) => {
                    *ending = ends;
                    None
                }
                Err(e) if e.is_temporary() || matches!(e, Error::LeaseLost { .. }) => {
                    // Infrastructure trouble or a lost lease: nothing is
                    // counted against the rows; the next pass retries.
                    warn!(error = %e, "sweep interrupted");
                    report.storage_errors += 1;
                    Metrics::add(&inner.metrics.storage_errors, 1);
                    Some(None)
                }
                Err(e) => Some(Some(e)),
            };
            match (failed, claimed) {
                (None, Ok(claimed)) => {
                    next = claimed;
                    claimed_at = claim_started;
                    if next.is_empty() && ahead && !cancel.is_cancelled() {
                        // Claimed ahead while this sweep held its streams:
                        // what it left (the rest of full runs) is due only
                        // once it has ended.
                        next = self
                            .end_then_claim(kind, std::mem::take(ending), true, report)
                            .await?;
                        claimed_at = Instant::now();
                    }
                }
                (None, Err(e)) => return Err(e),
                (Some(stop), claimed) => {
                    if let Ok(claimed) = claimed {
                        self.give_up(claimed.into_iter().map(|r| r.lease), Vec::new())
                            .await;
                    }
                    return match stop {
                        None => Ok(()),
                        Some(e) => Err(e),
                    };
                }
            }
        }
        Ok(())
    }

    /// Ends the passes of a sweep that applied (`ends`; none is fine) and,
    /// when `claim`, claims the next sweep. Both calls are made before
    /// either is awaited, the end first: on SQLite they queue for the one
    /// writer in that order and share a commit, and the claim can take the
    /// streams just released. The rows ended are counted in `report`; a
    /// failed end is only logged: the leases expire and the checkpoints
    /// skip what was applied. Without `claim`, the claim is empty.
    async fn end_then_claim(
        &self,
        kind: WorkerKind,
        ends: Vec<StreamEnd>,
        claim: bool,
        report: &mut TickReport,
    ) -> Result<Vec<ClaimedRun>> {
        let end = async {
            if ends.is_empty() {
                return None;
            }
            crate::failpoint::failpoint("after_apply");
            match self.rt.inner.journal.finish(&ends).await {
                Ok(n) => Some(n),
                Err(e) => {
                    debug!(error = %e, "ending a sweep failed; its leases will expire");
                    None
                }
            }
        };
        let next = async {
            if claim {
                self.claim_sweep().await
            } else {
                Ok(Vec::new())
            }
        };
        let (ended, claimed) = tokio::join!(end, next);
        if let Some(n) = ended {
            self.completed(kind, n, report);
        }
        claimed
    }

    /// Leases due streams and claims their runs, with their events where
    /// the journal reads them with the claim: the start of a sweep.
    async fn claim_sweep(&self) -> Result<Vec<ClaimedRun>> {
        let inner = &self.rt.inner;
        let config = &inner.config;
        let limits = match config.sweep_rows {
            // Partition leasing without sweeps: one stream at a time.
            0 => SweepLimits {
                streams: 1,
                per_stream: config.batch_size,
                rows: config.batch_size,
            },
            rows => SweepLimits {
                streams: config.streams_per_pass,
                per_stream: config.batch_size,
                rows,
            },
        };
        let (taken, ttl) = if inner.partitions.active() {
            let ttl = self.rt.partition_ttl();
            let taken = inner
                .journal
                .claim_and_load_partitioned(&inner.worker_id, ttl, limits)
                .await?;
            (taken, ttl)
        } else {
            let taken = inner
                .journal
                .take(&inner.worker_id, config.lease_ttl, outbox_core::Take::Due(limits))
                .await?;
            (taken, config.lease_ttl)
        };
        if let Some(run) = taken.first() {
            inner.metrics.lag.saw_lease(&run.lease, ttl);
        }
        let mut taken = taken;
        self.read_ahead(&mut taken).await;
        Ok(taken)
    }

    /// Reads the events of the fresh runs the claim did not read, while
    /// the sweep before still applies (the claim is made ahead): the sweep
    /// then starts with them. A read that fails is left to the sweep's own
    /// ([`Worker::load_fresh`]), which handles its errors.
    async fn read_ahead(&self, taken: &mut [ClaimedRun]) {
        let mut unread: Vec<&mut ClaimedRun> = taken
            .iter_mut()
            .filter(|r| r.events.is_none() && fresh(r))
            .collect();
        if unread.is_empty() {
            return;
        }
        match self.read_events_of(unread.iter().map(|r| &**r)).await {
            Ok(read) if read.len() == unread.len() => {
                for (run, events) in unread.iter_mut().zip(read) {
                    run.events = Some(events);
                }
            }
            Ok(_) => {}
            Err(e) => debug!(error = %e, "reading a sweep's runs ahead failed; the sweep reads them"),
        }
    }

    /// Applies (or verifies) the runs `taken` together where it can and
    /// drains the rest stream by stream. Returns the ends of the runs
    /// applied together, for the caller to commit with its next claim; when
    /// some streams are drained on their own, those ends are committed
    /// first instead, so no applied stream stays leased behind them.
    async fn sweep(
        &self,
        kind: WorkerKind,
        taken: Vec<ClaimedRun>,
        report: &mut TickReport,
        cancel: &CancellationToken,
    ) -> Result<Vec<StreamEnd>> {
        let inner = &self.rt.inner;
        report.claimed += taken.iter().map(|r| r.rows.len() as u64).sum::<u64>();
        Metrics::add(&inner.metrics.claims, taken.len() as u64);
        crate::failpoint::failpoint("after_claim");
        // Runs of fresh rows go together; the rest are drained one by one.
        let (mut fresh, mut alone): (Vec<ClaimedRun>, Vec<(Lease, Vec<OutboxRow>)>) =
            (Vec::new(), Vec::new());
        for run in taken {
            if self::fresh(&run) {
                fresh.push(run);
            } else {
                alone.push((run.lease, run.rows));
            }
        }
        let mut together = match self.load_fresh(fresh, &mut alone).await {
            Ok(together) => together,
            Err(e) => {
                self.give_up(std::iter::empty(), alone).await;
                return Err(e);
            }
        };
        if let Err(e) = self.apply_together(kind, &mut together, &mut alone).await {
            if stalled(&e) {
                // An apply past its deadline ends like a crash: its rows
                // stay `processing`, for the next claim to isolate (ADR 0029).
                self.release_as_stalled(together.into_iter().map(|t| t.lease), alone)
                    .await;
            } else {
                self.give_up(together.into_iter().map(|t| t.lease), alone).await;
            }
            return Err(e);
        }
        // A run cut at a projection's failure: the failure is recorded on
        // that projection's state for the stream, and the rest of the run
        // applied without it. If that cannot be done now, the rest's rows
        // go back to pending for the next claim.
        let mut abandon = vec![false; together.len()];
        // The projections another process runs keep their share of what
        // this sweep completes (ADR 0032).
        if kind == WorkerKind::Apply {
            for (t, abandon) in together.iter_mut().zip(abandon.iter_mut()) {
                if let Err(e) = self.rt.hold_unrun(&t.lease.stream).await {
                    // Nothing of this run is completed: it is claimed again
                    // (the checkpoints skip what was applied).
                    warn!(stream = %t.lease.stream, error = %e, "leaving work to a projection this process does not run failed; the rows are claimed again");
                    t.events.clear();
                    t.failed = None;
                    t.rest.clear();
                    *abandon = true;
                }
            }
        }
        for (t, abandon) in together.iter_mut().zip(abandon.iter_mut()) {
            let Some((_, error)) = t.failed.take() else {
                continue;
            };
            let rest = std::mem::take(&mut t.rest);
            match self
                .rt
                .apply_rest_without(&t.lease.stream, &rest, &error, report)
                .await
            {
                Ok(()) => t.events.extend(rest),
                Err(e) => {
                    warn!(stream = %t.lease.stream, error = %e, "applying a run past a projection's failure was interrupted; its rows are claimed again");
                    report.storage_errors += 1;
                    Metrics::add(&inner.metrics.storage_errors, 1);
                    *abandon = true;
                }
            }
        }
        if kind == WorkerKind::Apply {
            for t in &together {
                inner.metrics.lag.applied(&t.events);
            }
        }
        let ends: Vec<StreamEnd> = together
            .into_iter()
            .zip(abandon)
            .map(|(t, abandon)| StreamEnd {
                through: t.events.last().map(|e| e.seq),
                abandon,
                lease: t.lease,
            })
            .collect();
        if alone.is_empty() {
            return Ok(ends);
        }
        let _ = self.end_then_claim(kind, ends, false, report).await;
        for (lease, rows) in alone {
            let stream = lease.stream.clone();
            let span = crate::worker::stream_span(&stream, &inner.worker_id, Some(rows.len()));
            match self
                .process_leased(kind, lease, rows, report, cancel)
                .instrument(span)
                .await
            {
                Ok(_) => {}
                Err(e) if e.is_temporary() || matches!(e, Error::LeaseLost { .. }) => {
                    warn!(stream = %stream, error = %e, "stream pass interrupted");
                    report.storage_errors += 1;
                    Metrics::add(&inner.metrics.storage_errors, 1);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Vec::new())
    }

    /// The events of the fresh runs of a sweep: those the claim read, and
    /// the others in one read. A run the journal cannot serve whole moves to
    /// `alone`, whose own pass finds the fault again and records it. A
    /// temporary error moves every run to `alone` and is returned.
    async fn load_fresh(
        &self,
        fresh: Vec<ClaimedRun>,
        alone: &mut Vec<(Lease, Vec<OutboxRow>)>,
    ) -> Result<Vec<Taken>> {
        let unread = fresh.iter().filter(|r| r.events.is_none()).count();
        let read = if unread == 0 {
            Vec::new()
        } else {
            match self
                .read_events_of(fresh.iter().filter(|r| r.events.is_none()))
                .await
            {
                Ok(read) if read.len() == unread => read,
                Err(e) if e.is_temporary() => {
                    alone.extend(fresh.into_iter().map(|r| (r.lease, r.rows)));
                    return Err(e);
                }
                // Every unread run goes alone.
                _ => Vec::new(),
            }
        };
        let mut read = read.into_iter();
        let mut together = Vec::with_capacity(fresh.len());
        for ClaimedRun { lease, rows, events } in fresh {
            let Some(events) = events.or_else(|| read.next()) else {
                alone.push((lease, rows));
                continue;
            };
            match complete_run(&lease.stream, &rows, events) {
                Ok(events) => together.push(Taken {
                    lease,
                    rows,
                    events,
                    failed: None,
                    rest: Vec::new(),
                }),
                Err(_) => alone.push((lease, rows)),
            }
        }
        Ok(together)
    }

    /// One read of the events of `runs` (each its claimed rows' seqs).
    async fn read_events_of<'a>(
        &self,
        runs: impl Iterator<Item = &'a ClaimedRun>,
    ) -> Result<Vec<Vec<Event>>> {
        let wanted: Vec<_> = runs
            .map(|r| (r.lease.stream.clone(), r.rows[0].seq, r.rows.len()))
            .collect();
        self.rt.inner.journal.read_runs(&wanted).await
    }

    /// Applies the runs in `together` in one projection transaction (or
    /// verifies them, as the shadow worker).
    ///
    /// An applier failing on event `k` of a stream cuts that stream's run
    /// before `k` (the events before it go with the others, as the
    /// per-stream path commits them alone) and the transaction is tried
    /// again; the caller then records the failure on that projection's
    /// state for the stream and applies the rest without it (ADR 0032). A
    /// run that cannot go with the others for another reason (a projection
    /// is behind on its stream, it fails the shadow check) moves to `alone`,
    /// whose per-stream path applies it to each projection on its own; a
    /// permanent error the store cannot pin on one stream moves them all. A
    /// temporary error is returned: nothing was committed.
    async fn apply_together(
        &self,
        kind: WorkerKind,
        together: &mut Vec<Taken>,
        alone: &mut Vec<(Lease, Vec<OutboxRow>)>,
    ) -> Result<()> {
        let inner = &self.rt.inner;
        if kind == WorkerKind::Shadow {
            let mut i = 0;
            while i < together.len() {
                if self.verify_run(&together[i].events).is_ok() {
                    i += 1;
                } else {
                    let t = together.remove(i);
                    alone.push((t.lease, t.rows));
                }
            }
            return Ok(());
        }
        loop {
            let runs: Vec<&[Event]> = together
                .iter()
                .filter(|t| !t.events.is_empty())
                .map(|t| t.events.as_slice())
                .collect();
            if runs.is_empty() {
                break;
            }
            let result = inner.store.apply_runs(&runs, &self.rt.active_projections()).await;
            match result {
                Ok(outcomes) if all_applied(&outcomes, runs.len()) => {
                    for o in &outcomes {
                        if let ApplyOutcome::Applied(r) = o {
                            self.rt.count(r);
                        }
                    }
                    break;
                }
                // The last outcome is the run that stopped the call (a gap).
                Ok(outcomes) => {
                    let stopped = outcomes
                        .len()
                        .checked_sub(1)
                        .and_then(|last| runs.get(last))
                        .and_then(|run| together.iter().position(|t| t.lease.stream == run[0].stream));
                    match stopped {
                        Some(i) => {
                            let t = together.remove(i);
                            alone.push((t.lease, t.rows));
                        }
                        // A store that says neither "applied" nor where it
                        // stopped: every run goes its own way.
                        None => {
                            alone.extend(together.drain(..).map(|t| (t.lease, t.rows)));
                            break;
                        }
                    }
                }
                // A projection failing on event `k` of a run: the run is cut
                // before `k` and the transaction tried again; the rest goes
                // on without that projection once it commits (ADR 0032).
                Err(Error::Apply {
                    projection,
                    stream,
                    seq,
                    source,
                }) if together
                    .iter()
                    .any(|t| t.lease.stream == stream && t.events.first().is_some_and(|e| e.seq <= seq)) =>
                {
                    let Some(t) = together.iter_mut().find(|t| t.lease.stream == stream) else {
                        unreachable!("checked by the guard");
                    };
                    let at = t
                        .events
                        .iter()
                        .position(|e| e.seq >= seq)
                        .unwrap_or(t.events.len());
                    let mut rest = t.events.split_off(at);
                    rest.append(&mut t.rest);
                    t.rest = rest;
                    t.failed = Some((
                        seq,
                        Error::Apply {
                            projection,
                            stream,
                            seq,
                            source,
                        },
                    ));
                }
                Err(e) if e.is_temporary() => return Err(e),
                Err(_) => {
                    alone.extend(together.drain(..).map(|t| (t.lease, t.rows)));
                    break;
                }
            }
        }
        Ok(())
    }

    /// Ends every pass of a sweep that stops on a temporary error: claimed
    /// rows back to pending, leases released, in one commit (best effort:
    /// otherwise the leases expire).
    async fn give_up(&self, leases: impl Iterator<Item = Lease>, alone: Vec<(Lease, Vec<OutboxRow>)>) {
        self.end_unapplied(leases, alone, true).await;
    }

    /// Ends every pass of a sweep whose apply stalled past its deadline:
    /// leases released, claimed rows left `processing` as a crash would
    /// leave them (see [`stalled`]).
    async fn release_as_stalled(
        &self,
        leases: impl Iterator<Item = Lease>,
        alone: Vec<(Lease, Vec<OutboxRow>)>,
    ) {
        self.end_unapplied(leases, alone, false).await;
    }

    async fn end_unapplied(
        &self,
        leases: impl Iterator<Item = Lease>,
        alone: Vec<(Lease, Vec<OutboxRow>)>,
        abandon: bool,
    ) {
        let ends: Vec<StreamEnd> = leases
            .chain(alone.into_iter().map(|(lease, _)| lease))
            .map(|lease| StreamEnd {
                lease,
                through: None,
                abandon,
            })
            .collect();
        if let Err(e) = self.rt.inner.journal.finish(&ends).await {
            debug!(error = %e, "abandoning a sweep failed; its leases will expire");
        }
    }
}

/// Whether a claimed run is of fresh rows only (never tried, not applied
/// alone): those go together.
fn fresh(run: &ClaimedRun) -> bool {
    run.rows.iter().all(OutboxRow::is_fresh)
}
