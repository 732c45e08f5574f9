//! The apply and shadow workers: one pass ([`Outbox::tick`]) and the loop.

mod sweep;

use std::collections::HashSet;
use std::time::Duration;

use outbox_core::{
    ENDED_WITHOUT_RESULT, Error, Event, EventJournal, FailureOutcome, Lease, LeaseStore, OutboxQueue,
    OutboxQueueExt as _, OutboxRow, ProjectionStore, Result, Seq, StreamId, WorkerId,
};
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};

use crate::bounded::stalled;
use crate::metrics::Metrics;
use crate::outbox::{JournalBackend, Outbox, ProjectionBackend};

/// Which worker a pass runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerKind {
    /// Applies projections.
    Apply,
    /// Claims, loads, verifies and completes rows without touching projections.
    Shadow,
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TickReport {
    /// Due streams the pass took up (each is counted once, however often
    /// the due streams were read).
    pub due_streams: u64,
    /// Streams whose lease we took.
    pub leased: u64,
    /// Streams another worker held.
    pub contended: u64,
    /// Rows claimed.
    pub claimed: u64,
    /// Rows completed (applied, verified or found already applied).
    pub completed: u64,
    /// Failures recorded with a retry.
    pub failed: u64,
    /// Rows dead-lettered.
    pub dead_lettered: u64,
    /// Streams whose pass stopped on a temporary storage error or a lost
    /// lease: their claimed rows were abandoned and their leases released,
    /// nothing counted against the rows; the pass went on to the next stream.
    pub storage_errors: u64,
    /// Events applied to a projection on its own exception path: a
    /// projection that had failed on, or fallen behind on, a stream while
    /// the others went on, caught up from its checkpoint (ADR 0032).
    pub caught_up: u64,
    /// Events a projection passed over with a record (its error asked to
    /// skip them, ADR 0032).
    pub skipped: u64,
}

impl TickReport {
    /// Whether the pass changed anything (a busy pass is followed at once by another).
    pub fn made_progress(&self) -> bool {
        self.completed + self.failed + self.dead_lettered + self.caught_up + self.skipped > 0
    }

    /// Adds another pass's (or sweep's) counts to these.
    pub(crate) fn add(&mut self, other: &TickReport) {
        self.due_streams += other.due_streams;
        self.leased += other.leased;
        self.contended += other.contended;
        self.claimed += other.claimed;
        self.completed += other.completed;
        self.failed += other.failed;
        self.dead_lettered += other.dead_lettered;
        self.storage_errors += other.storage_errors;
        self.caught_up += other.caught_up;
        self.skipped += other.skipped;
    }
}

/// The apply worker and the shadow worker (ADR 0016, 0029): claim rows,
/// apply them, end passes, record failures. `worker.rs` has the per-stream
/// pass and the loop, `sweep.rs` the sweeps over many streams per commit.
pub(crate) struct Worker<'a, J, P: ProjectionStore> {
    rt: &'a Outbox<J, P>,
}

/// How draining one stream in a pass ended.
pub(crate) enum StreamPass {
    /// Nothing more is immediately processable.
    Drained,
    /// The stream is blocked behind a failed or dead head.
    Blocked,
    /// The per-stream batch budget is used; come back next pass.
    Budget,
}

impl<J: JournalBackend, P: ProjectionBackend> Outbox<J, P> {
    /// The worker service of this runtime.
    pub(crate) fn worker(&self) -> Worker<'_, J, P> {
        Worker { rt: self }
    }

    /// One pass of the worker of this runtime's mode (apply or shadow): finds
    /// due streams and drains each as far as it can. `outbox work --once`
    /// runs exactly this.
    pub async fn tick(&self) -> Result<TickReport> {
        self.worker().tick().await
    }

    /// Worker passes ([`tick`](Self::tick)) until one changes nothing; what
    /// they did, added up. Every row due when it is called (or falling due
    /// meanwhile) ends applied, failed with a retry, or dead-lettered: a
    /// failed row's retry is not waited for, so a failing projection cannot
    /// keep it running (its rows stay in [`summary`](outbox_core::OutboxInspector::summary)
    /// as `failed`). Rows another worker holds are left to it.
    ///
    /// For tests (append, `drain`, assert the views) and one-shot jobs; a
    /// service runs the worker with [`start`](Self::start) instead.
    pub async fn drain(&self) -> Result<TickReport> {
        self.worker().drain().await
    }
}

impl<J: JournalBackend, P: ProjectionBackend> Worker<'_, J, P> {
    /// [`Outbox::tick`]: one pass as this process's worker kind (the
    /// shadow worker in shadow mode), with a token nobody cancels.
    pub(crate) async fn tick(&self) -> Result<TickReport> {
        let kind = if self.rt.inner.mode.runs_shadow_worker() {
            WorkerKind::Shadow
        } else {
            WorkerKind::Apply
        };
        self.tick_as(kind, &CancellationToken::new(), true).await
    }

    /// [`Outbox::drain`]: passes until one finds nothing to do, their
    /// reports summed.
    pub(crate) async fn drain(&self) -> Result<TickReport> {
        let mut total = TickReport::default();
        loop {
            let pass = self.tick().await?;
            total.add(&pass);
            if !pass.made_progress() {
                return Ok(total);
            }
        }
    }

    /// One pass: up to `streams_per_pass` streams, each drained for up to
    /// `batches_per_stream` batches. The due streams are read again before
    /// each stream (oldest due first, streams this pass already had skipped),
    /// so a stream whose lease expired mid-pass, such as one stranded by a
    /// dead worker, is next in line once the stream in progress ends its
    /// turn, rather than waiting for the next pass (ADR 0008).
    ///
    /// With `exceptions`, the pass then catches up the projections that
    /// left the shared path on some stream (ADR 0032).
    pub(crate) async fn tick_as(
        &self,
        kind: WorkerKind,
        cancel: &CancellationToken,
        exceptions: bool,
    ) -> Result<TickReport> {
        if kind == WorkerKind::Apply {
            self.rt.refresh_registry(false).await?;
        }
        let mut report = if self.rt.inner.config.sweep_rows > 0 || self.rt.inner.partitions.active() {
            self.sweep_tick(kind, cancel).await?
        } else {
            self.stream_tick(kind, cancel).await?
        };
        if exceptions && kind == WorkerKind::Apply && !cancel.is_cancelled() {
            self.rt.catch_up_consumers(&mut report).await?;
        }
        Ok(report)
    }

    /// A pass stream by stream (without sweeps or partitions).
    async fn stream_tick(&self, kind: WorkerKind, cancel: &CancellationToken) -> Result<TickReport> {
        let inner = &self.rt.inner;
        let mut report = TickReport::default();
        // Streams this pass has had (or tried): skipped by later reads.
        let mut visited: HashSet<StreamId> = HashSet::new();
        // Visited streams that may still be due (their turn ended on the
        // budget, contention or an error): a read must reach past them.
        let mut may_be_due = 0usize;
        while visited.len() < inner.config.streams_per_pass && !cancel.is_cancelled() {
            let limit = (may_be_due + 1).min(inner.config.streams_per_pass);
            let due = inner.journal.due_streams(limit).await?;
            let Some(stream) = due.into_iter().find(|s| !visited.contains(s)) else {
                break;
            };
            report.due_streams += 1;
            visited.insert(stream.clone());
            let before = (report.contended, report.storage_errors);
            let span = stream_span(&stream, &inner.worker_id, None);
            match self
                .process_stream(kind, &stream, &mut report, cancel)
                .instrument(span)
                .await
            {
                Ok(StreamPass::Budget) => may_be_due += 1,
                Ok(StreamPass::Drained | StreamPass::Blocked) => {
                    if (report.contended, report.storage_errors) != before {
                        may_be_due += 1;
                    }
                }
                Err(e) if e.is_temporary() || matches!(e, Error::LeaseLost { .. }) => {
                    // Infrastructure trouble or a lost lease: nothing is
                    // counted against the row; the next pass retries.
                    warn!(stream = %stream, error = %e, "stream pass interrupted");
                    report.storage_errors += 1;
                    Metrics::add(&inner.metrics.storage_errors, 1);
                    may_be_due += 1;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(report)
    }

    async fn process_stream(
        &self,
        kind: WorkerKind,
        stream: &StreamId,
        report: &mut TickReport,
        cancel: &CancellationToken,
    ) -> Result<StreamPass> {
        let inner = &self.rt.inner;
        let ttl = inner.config.lease_ttl;
        // The pass's first commit: the lease and the first run.
        let Some((lease, claimed)) = inner
            .journal
            .acquire_and_claim(stream, &inner.worker_id, ttl, inner.config.batch_size)
            .await?
        else {
            report.contended += 1;
            Metrics::add(&inner.metrics.contended, 1);
            return Ok(StreamPass::Drained);
        };
        report.leased += 1;
        self.process_leased(kind, lease, claimed, report, cancel).await
    }

    /// Drains a stream whose lease this worker holds, starting with the
    /// run `claimed` under it, and ends the pass (completes, abandons what
    /// is left `processing`, releases the lease).
    pub(crate) async fn process_leased(
        &self,
        kind: WorkerKind,
        mut lease: Lease,
        claimed: Vec<OutboxRow>,
        report: &mut TickReport,
        cancel: &CancellationToken,
    ) -> Result<StreamPass> {
        let inner = &self.rt.inner;
        // A stream claimed in a partition holds the partition's lease.
        let ttl = match lease.partition {
            Some(_) => self.rt.partition_ttl(),
            None => inner.config.lease_ttl,
        };
        inner.metrics.lag.saw_lease(&lease, ttl);
        let mut renewed_at = Instant::now();
        // Whether rows of this lease may be left `processing`.
        let mut dirty = false;
        // The last batch's completion, left to the pass's last commit.
        let mut through = None;
        let result = async {
            let mut ended = StreamPass::Budget;
            // Rows claimed ahead: by the acquisition, then by the previous
            // batch's completion.
            let mut next = Some(claimed);
            let batches = inner.config.batches_per_stream;
            // Batches of one unfinished row (a takeover re-claiming what a
            // stopped worker left, one row at a time) are recovery, not
            // budget: the crashed batch is finished in this turn.
            let mut spent = 0;
            while spent < batches {
                if cancel.is_cancelled() {
                    ended = StreamPass::Drained;
                    break;
                }
                // Renew at a third of the TTL; the store's clock judges expiry.
                if renewed_at.elapsed() > ttl / 3 {
                    lease = inner.journal.renew(&lease, ttl).await?;
                    renewed_at = Instant::now();
                    inner.metrics.lag.saw_lease(&lease, ttl);
                }
                let more = spent + 1 < batches;
                let recovery;
                (ended, next, recovery) = self
                    .run_batch(kind, &lease, report, next.take(), more, &mut dirty, &mut through)
                    .await?;
                if !recovery {
                    spent += 1;
                }
                match ended {
                    StreamPass::Budget => continue,
                    StreamPass::Drained | StreamPass::Blocked => break,
                }
            }
            Ok::<StreamPass, Error>(ended)
        }
        .await;
        // The pass's last commit: complete what the last batch applied,
        // leave nothing stuck in `processing` (skipped when every claimed
        // row was completed) and free the stream for the next worker. Best
        // effort: if it fails, the lease expires and the rows are due again
        // (already applied rows are then skipped by the checkpoints). An
        // apply past its deadline leaves its rows `processing`, as a crash
        // would: the next claim isolates them (ADR 0029).
        let abandon = match &result {
            Err(e) => !stalled(e),
            Ok(_) => dirty,
        };
        match inner.journal.complete_and_release(&lease, through, abandon).await {
            Ok(n) => self.completed(kind, n, report),
            Err(e) => debug!(error = %e, "ending the stream pass failed; the lease will expire"),
        }
        result
    }

    /// Claims one run of rows (unless the previous batch's completion did:
    /// `claimed`) and applies (or verifies) it. When the run was a full batch
    /// and `more` batches may follow, its completion claims the next run in
    /// the same store call, returned for the next batch. `dirty` says
    /// whether claimed rows may be left `processing`; a last batch leaves
    /// its completion in `through` for the pass's last commit. Also returns
    /// whether the run was one unfinished row (a recovery batch).
    #[allow(clippy::too_many_arguments)]
    async fn run_batch(
        &self,
        kind: WorkerKind,
        lease: &Lease,
        report: &mut TickReport,
        claimed: Option<Vec<OutboxRow>>,
        more: bool,
        dirty: &mut bool,
        through: &mut Option<Seq>,
    ) -> Result<(StreamPass, Option<Vec<OutboxRow>>, bool)> {
        let inner = &self.rt.inner;
        let batch = inner.config.batch_size;
        let rows = match claimed {
            Some(rows) => rows,
            None => inner.journal.claim(lease, batch).await?,
        };
        let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
            return Ok((StreamPass::Drained, None, false));
        };
        crate::failpoint::failpoint("after_claim");
        *dirty = true;
        // A row applied alone (a suspect, or one whose own attempt ended
        // without a result) is recovery, not budget.
        let recovery = first.alone;
        if recovery {
            Metrics::add(&inner.metrics.lease_takeovers, 1);
        }
        let more = more || recovery;
        let stream = &lease.stream;
        // The claim found this row's own attempt unfinished (its apply
        // killed or stalled its worker): that attempt is recorded like any
        // failure (backoff, then dead at the threshold) before the row is
        // applied again, unless every projection had applied it (the
        // attempt then ended after the apply, before the completion: the
        // apply below skips it). ADR 0029.
        if first.ended_unfinished()
            && !(kind == WorkerKind::Apply && self.applied_everywhere(&first.stream, first.seq).await?)
        {
            report.claimed += rows.len() as u64;
            self.record_failure_message(lease, first, ENDED_WITHOUT_RESULT, report)
                .await?;
            return Ok((StreamPass::Blocked, None, recovery));
        }
        // A row applied alone (its run is that row): the attempt of its own
        // is marked before it begins, so that if it ends without a result
        // the next claim charges it, and nothing else of this process
        // applies or publishes until it ends (ADR 0029).
        let _alone = if recovery && kind == WorkerKind::Apply {
            let gate = inner.alone_gate.write().await;
            // The gate may have waited for a publish: the lease is renewed
            // before the attempt begins, so it cannot expire under an
            // attempt that has barely started (another worker would then
            // take the row and charge it while this one still applies).
            let ttl = match lease.partition {
                Some(_) => self.rt.partition_ttl(),
                None => inner.config.lease_ttl,
            };
            inner.journal.renew(lease, ttl).await?;
            match inner.journal.begin_attempt(lease, first.seq).await {
                Ok(()) => {}
                // The row is no longer this claim's (completed by a repair
                // with `--complete-rows`, requeued): nothing to apply here.
                Err(Error::NotFound(_) | Error::InvalidState(_)) => {
                    report.claimed += rows.len() as u64;
                    return Ok((StreamPass::Drained, None, recovery));
                }
                Err(e) => return Err(e),
            }
            Some(gate)
        } else {
            None
        };
        report.claimed += rows.len() as u64;
        Metrics::add(&inner.metrics.claims, 1);
        let span = info_span!(
            "apply",
            stream = %stream,
            first_seq = %first.seq,
            last_seq = %last.seq,
            otel.kind = "consumer",
            messaging.system = "outbox",
            messaging.operation.type = "process",
            messaging.destination.name = %stream,
            messaging.batch.message_count = rows.len(),
        );
        async {
            let events = match self.load_run(stream, &rows).await {
                Ok(events) => events,
                Err(e) if e.is_temporary() => return Err(e),
                Err(e) => {
                    return self
                        .record_failure(lease, first, &e, report)
                        .await
                        .map(|()| (StreamPass::Blocked, None, recovery));
                }
            };
            let result = match kind {
                WorkerKind::Apply => self.rt.apply_isolated(stream, &events, report).await.map(|_| ()),
                WorkerKind::Shadow => self.verify_run(&events),
            };
            match result {
                Ok(()) => {
                    if kind == WorkerKind::Apply {
                        inner.metrics.lag.applied(&events);
                    }
                    crate::failpoint::failpoint("after_apply");
                    // A run the claim cut at an unfinished row (claimed
                    // alone) may have more right behind it.
                    let full = rows.len() == batch || recovery;
                    let next = if full && more {
                        let (n, next) = inner.journal.complete_and_claim(lease, last.seq, batch).await?;
                        self.completed(kind, n, report);
                        Some(next)
                    } else {
                        // The pass ends here: its last commit completes.
                        *through = Some(last.seq);
                        None
                    };
                    *dirty = next.as_ref().is_some_and(|r| !r.is_empty());
                    let pass = match &next {
                        Some(rows) if rows.is_empty() => StreamPass::Drained,
                        _ if full => StreamPass::Budget,
                        _ => StreamPass::Drained,
                    };
                    Ok((pass, next, recovery))
                }
                Err(Error::Apply {
                    seq,
                    source,
                    projection,
                    ..
                }) if kind == WorkerKind::Apply => {
                    // Isolate the failing event: commit the ones before it.
                    let before: Vec<Event> = events.iter().filter(|e| e.seq < seq).cloned().collect();
                    let mut err = Error::Apply {
                        projection,
                        stream: stream.clone(),
                        seq,
                        source,
                    };
                    let mut failing_seq = seq;
                    if let Some(prev) = before.last() {
                        match self.rt.apply_run(stream, &before).await {
                            Ok(_) => {
                                inner.metrics.lag.applied(&before);
                                let n = inner.journal.complete(stream, prev.seq).await?;
                                report.completed += n;
                                Metrics::add(&inner.metrics.completed_rows, n);
                            }
                            // The applier failed on an earlier event this time:
                            // that event is now the head, and the failure is its.
                            Err(e @ Error::Apply { seq: earlier, .. }) => {
                                failing_seq = earlier;
                                err = e;
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    let failing = rows.iter().find(|r| r.seq == failing_seq).unwrap_or(first);
                    self.record_failure(lease, failing, &err, report).await?;
                    Ok((StreamPass::Blocked, None, recovery))
                }
                Err(e) if e.is_temporary() => Err(e),
                Err(e) => {
                    self.record_failure(lease, first, &e, report).await?;
                    Ok((StreamPass::Blocked, None, recovery))
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Counts `n` rows a store call completed (past the `after_complete`
    /// crash point).
    pub(crate) fn completed(&self, kind: WorkerKind, n: u64, report: &mut TickReport) {
        crate::failpoint::failpoint("after_complete");
        report.completed += n;
        Metrics::add(&self.rt.inner.metrics.completed_rows, n);
        if kind == WorkerKind::Shadow {
            Metrics::add(&self.rt.inner.metrics.shadow_verified, n);
        }
    }

    /// Whether every projection's checkpoint on `stream` is at `seq` or past it.
    async fn applied_everywhere(&self, stream: &StreamId, seq: Seq) -> Result<bool> {
        let inner = &self.rt.inner;
        for p in &inner.projections {
            let cp = inner.store.checkpoint(p.name(), stream).await?;
            if cp < seq.get() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Loads the claimed run from the journal and checks it is complete.
    pub(crate) async fn load_run(&self, stream: &StreamId, rows: &[OutboxRow]) -> Result<Vec<Event>> {
        let events = self
            .rt
            .inner
            .journal
            .read_stream(stream, rows[0].seq, rows.len())
            .await?;
        complete_run(stream, rows, events)
    }

    /// The shadow worker's check: the event type is registered with the
    /// intent recorded (payload hashes were verified by the journal on load).
    pub(crate) fn verify_run(&self, events: &[Event]) -> Result<()> {
        for e in events {
            let intent = self.rt.inner.types.intent(&e.event_type)?;
            if intent != e.intent {
                return Err(Error::Corrupt {
                    stream: e.stream.clone(),
                    seq: e.seq,
                    reason: format!(
                        "recorded intent {} differs from the registered {intent}",
                        e.intent
                    ),
                });
            }
        }
        Ok(())
    }

    /// Records `error` as the failed attempt of `row` (the retry policy
    /// decides retry or dead letter) and counts it in `report`.
    pub(crate) async fn record_failure(
        &self,
        lease: &Lease,
        row: &OutboxRow,
        error: &Error,
        report: &mut TickReport,
    ) -> Result<()> {
        self.record_failure_message(lease, row, &error.to_string(), report)
            .await
    }

    async fn record_failure_message(
        &self,
        lease: &Lease,
        row: &OutboxRow,
        message: &str,
        report: &mut TickReport,
    ) -> Result<()> {
        let inner = &self.rt.inner;
        match inner
            .journal
            .fail(lease, row.seq, message, &inner.config.retry)
            .await?
        {
            FailureOutcome::Retry {
                attempt,
                next_attempt_at,
            } => {
                warn!(stream = %lease.stream, seq = %row.seq, attempt, %next_attempt_at, error = %message, "apply failed; retry scheduled");
                report.failed += 1;
                Metrics::add(&inner.metrics.failed, 1);
            }
            FailureOutcome::Dead { attempt } => {
                warn!(stream = %lease.stream, seq = %row.seq, attempt, error = %message, "row dead-lettered; its stream is blocked until requeued");
                report.dead_lettered += 1;
                Metrics::add(&inner.metrics.dead_lettered, 1);
            }
        }
        Ok(())
    }

    /// The worker loop: passes back to back while they make progress, then
    /// waits for an append in this process, the poll interval, or shutdown.
    pub(crate) async fn work_loop(&self, kind: WorkerKind, cancel: CancellationToken) {
        let inner = &self.rt.inner;
        let mut backoff = inner.config.poll_interval;
        // The exception path reads every projection's due states (a read
        // per projection and partition): once per poll interval, and at
        // once again while it finds work, not on every busy pass.
        let mut exceptions_at: Option<Instant> = None;
        let mut exceptions_busy = false;
        while !cancel.is_cancelled() {
            let exceptions =
                exceptions_busy || exceptions_at.is_none_or(|at| at.elapsed() >= inner.config.poll_interval);
            if exceptions {
                exceptions_at = Some(Instant::now());
            }
            let busy = match self.tick_as(kind, &cancel, exceptions).await {
                Ok(r) => {
                    backoff = inner.config.poll_interval;
                    if exceptions {
                        exceptions_busy = r.caught_up + r.failed + r.dead_lettered + r.skipped > 0;
                    }
                    r.made_progress()
                }
                Err(e) => {
                    warn!(error = %e, "worker pass failed; backing off");
                    Metrics::add(&inner.metrics.storage_errors, 1);
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                    false
                }
            };
            if busy {
                tokio::task::yield_now().await;
                continue;
            }
            idle(
                self.rt.inner.wake_source.as_deref(),
                &inner.wake,
                backoff,
                &cancel,
            )
            .await;
        }
    }
}

/// An idle loop's wait: until `wake` is notified (an append in this
/// process), `source` wakes (another process), `backoff` passes, or
/// shutdown.
pub(crate) async fn idle(
    source: Option<&dyn outbox_core::WakeSource>,
    wake: &tokio::sync::Notify,
    backoff: Duration,
    cancel: &CancellationToken,
) {
    tokio::select! {
        () = cancel.cancelled() => {}
        () = wake.notified() => {}
        () = woken_by(source) => {}
        () = tokio::time::sleep(backoff) => {}
    }
}

/// Resolves when `source` wakes (never without one).
pub(crate) async fn woken_by(source: Option<&dyn outbox_core::WakeSource>) {
    match source {
        Some(s) => s.wait().await,
        None => std::future::pending().await,
    }
}

/// The span of one stream's pass, with the OpenTelemetry messaging
/// attributes (the rows of its first batch when known).
pub(crate) fn stream_span(stream: &StreamId, worker: &WorkerId, rows: Option<usize>) -> tracing::Span {
    let span = info_span!(
        "stream",
        stream = %stream,
        worker = %worker,
        otel.kind = "consumer",
        messaging.system = "outbox",
        messaging.operation.type = "process",
        messaging.destination.name = %stream,
        messaging.batch.message_count = tracing::field::Empty,
    );
    if let Some(n) = rows {
        span.record("messaging.batch.message_count", n);
    }
    span
}

/// `events`, read for the claimed `rows`, if the journal had every one and
/// they are those rows' events (the stream's, at the rows' seqs, in
/// order): the rows are completed through the last event applied, so an
/// event paired with another row must never be applied.
pub(crate) fn complete_run(stream: &StreamId, rows: &[OutboxRow], events: Vec<Event>) -> Result<Vec<Event>> {
    if events.len() != rows.len() {
        let missing = rows[0].seq.get() + events.len() as u64;
        return Err(Error::Corrupt {
            stream: stream.clone(),
            seq: outbox_core::Seq::new(missing)?,
            reason: "the outbox points at an event the journal does not have".into(),
        });
    }
    if let Some((row, event)) = rows
        .iter()
        .zip(&events)
        .find(|(row, event)| event.stream != *stream || event.seq != row.seq)
    {
        return Err(Error::Corrupt {
            stream: stream.clone(),
            seq: row.seq,
            reason: format!(
                "the events read do not match the claimed rows: event {} of stream {} came for this row",
                event.seq, event.stream
            ),
        });
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use outbox_core::{EventType, Intent, Metadata, OutboxStatus, PayloadHash, Seq, Timestamp};

    use super::*;

    fn event(stream: &str, seq: u64) -> Event {
        Event {
            global_position: seq,
            stream: StreamId::new(stream).unwrap(),
            seq: Seq::new(seq).unwrap(),
            event_type: EventType::new("t").unwrap(),
            intent: Intent::Apply,
            payload: Vec::new(),
            payload_hash: PayloadHash::of(&[]),
            decoded: Default::default(),
            metadata: Metadata {
                recorded_at: Timestamp::from_millis(0),
                correlation_id: None,
                causation_id: None,
            },
        }
    }

    fn row(stream: &str, seq: u64) -> OutboxRow {
        OutboxRow {
            stream: StreamId::new(stream).unwrap(),
            seq: Seq::new(seq).unwrap(),
            event_type: EventType::new("t").unwrap(),
            status: OutboxStatus::Processing,
            attempt_count: 0,
            next_attempt_at: Timestamp::from_millis(0),
            last_error: None,
            updated_at: Timestamp::from_millis(0),
            first_failed_at: None,
            alone: false,
        }
    }

    /// A run's events must be its rows' events: a short read is the
    /// journal's corruption, and events of another stream or seq (a pairing
    /// mistake) are refused rather than applied and completed.
    #[test]
    fn a_run_takes_only_its_rows_events() {
        let s = StreamId::new("s").unwrap();
        let rows = [row("s", 3), row("s", 4)];
        let good = complete_run(&s, &rows, vec![event("s", 3), event("s", 4)]).unwrap();
        assert_eq!(good.iter().map(|e| e.seq.get()).collect::<Vec<_>>(), [3, 4]);

        let short = complete_run(&s, &rows, vec![event("s", 3)]).unwrap_err();
        assert!(
            matches!(short, Error::Corrupt { seq, .. } if seq.get() == 4),
            "{short}"
        );

        for wrong in [
            vec![event("s", 4), event("s", 5)],
            vec![event("t", 3), event("t", 4)],
        ] {
            let e = complete_run(&s, &rows, wrong).unwrap_err();
            assert!(
                matches!(&e, Error::Corrupt { seq, reason, .. } if seq.get() == 3 && reason.contains("do not match")),
                "{e}"
            );
        }
    }
}
