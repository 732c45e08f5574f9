//! The replay coordinator: catch-up and rebuild runs, persisted in the
//! projection database, one active run per projection.
//!
//! A run and the live worker never corrupt one projection: every apply, from
//! either, is one projection transaction that compare-and-sets the
//! (projection, stream) checkpoint, and those transactions serialize on the
//! checkpoint row (SQLite's single writer; a row lock on Postgres). A worker
//! that meets a projection a rebuild has reset catches that stream up itself;
//! the rebuild then finds the stream applied and skips it as duplicates.
//!
//! A run leaves the outbox rows alone unless [`ReplayOptions`] asks for them
//! to be completed: the projection store it ran on need not be the one the
//! live workers drain into (ADR 0014).

use std::sync::Arc;

use outbox_core::{
    ApplyOutcome, Error, Projection, ProjectionName, Result, RunEnd, RunKind, RunRecord, Seq, StreamId,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::deadline::Within;
use crate::metrics::Metrics;
use crate::outbox::{JournalBackend, Outbox, ProjectionBackend};

/// What a replay, a rebuild or a gap repair does with the outbox rows of the
/// streams it has brought up to date (ADR 0014).
///
/// By default it leaves them. The rows are the live workers' hints, and the
/// projection store this runtime was built on need not be the one those
/// workers drain into: a replay into a scratch database must not delete
/// them. Left alone, a row costs the live worker one duplicate apply (it
/// claims it, finds it applied and deletes it); a dead row stays dead until
/// it is requeued or retried.
///
/// [`with_complete_rows(true)`](Self::with_complete_rows) deletes, after each
/// stream, the rows that every registered projection has now applied, dead
/// ones included. Ask for it only when this runtime's projection store is
/// the one the live workers use. With the outbox off
/// (`OUTBOX_ENABLED=false`) nothing is deleted either way. Start-up repair
/// ([`Outbox::start`]) decides by the mode instead: a runtime that runs the
/// apply worker, or deletes rows after an inline apply, is the live one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayOptions {
    complete_rows: bool,
}

impl ReplayOptions {
    /// The defaults: rows are left alone.
    pub const fn new() -> Self {
        Self { complete_rows: false }
    }

    /// Whether to delete the rows every projection has applied.
    #[must_use]
    pub const fn with_complete_rows(mut self, complete_rows: bool) -> Self {
        self.complete_rows = complete_rows;
        self
    }

    /// Whether rows every projection has applied are deleted.
    pub const fn complete_rows(&self) -> bool {
        self.complete_rows
    }
}

impl<J: JournalBackend, P: ProjectionBackend> Outbox<J, P> {
    /// The registered projection called `name`.
    pub fn projection(&self, name: &str) -> Result<Arc<dyn Projection<P::Tx>>> {
        self.projections()
            .iter()
            .find(|p| p.name().as_str() == name)
            .cloned()
            .ok_or_else(|| {
                let known: Vec<&str> = self.projections().iter().map(|p| p.name().as_str()).collect();
                Error::NotFound(format!("projection `{name}` (registered: {})", known.join(", ")))
            })
    }

    /// Catch-up: from each stream's checkpoint forward, in seq order, to the
    /// tail or to global position `until`. Returns the finished run record.
    /// Leaves the outbox rows alone ([`ReplayOptions::new`]).
    pub async fn replay(
        &self,
        projection: &str,
        until: Option<u64>,
        cancel: &CancellationToken,
    ) -> Result<RunRecord> {
        self.replay_with(projection, until, ReplayOptions::new(), cancel)
            .await
    }

    /// [`replay`](Self::replay) with options.
    pub async fn replay_with(
        &self,
        projection: &str,
        until: Option<u64>,
        options: ReplayOptions,
        cancel: &CancellationToken,
    ) -> Result<RunRecord> {
        let p = self.projection(projection)?;
        let run = self.admit(RunKind::CatchUp, p.name(), until).await?;
        self.while_registered(self.execute(run, p, options, cancel)).await
    }

    /// Rebuild: clears the projection's tables and checkpoints, then replays
    /// from the journal's origin. Returns the finished run record. Leaves the
    /// outbox rows alone ([`ReplayOptions::new`]).
    pub async fn rebuild(&self, projection: &str, cancel: &CancellationToken) -> Result<RunRecord> {
        self.rebuild_with(projection, ReplayOptions::new(), cancel).await
    }

    /// [`rebuild`](Self::rebuild) with options.
    pub async fn rebuild_with(
        &self,
        projection: &str,
        options: ReplayOptions,
        cancel: &CancellationToken,
    ) -> Result<RunRecord> {
        let p = self.projection(projection)?;
        let run = self.admit(RunKind::Rebuild, p.name(), None).await?;
        self.while_registered(self.execute(run, p, options, cancel)).await
    }

    /// Rebuilds every projection in registration order. All runs are admitted
    /// (queued) first, so a conflict refuses the whole request before anything
    /// is cleared; a failed or cancelled run stops the sequence and cancels
    /// the queued rest. Leaves the outbox rows alone ([`ReplayOptions::new`]).
    pub async fn rebuild_all(&self, cancel: &CancellationToken) -> Result<Vec<RunRecord>> {
        self.rebuild_all_with(ReplayOptions::new(), cancel).await
    }

    /// [`rebuild_all`](Self::rebuild_all) with options.
    pub async fn rebuild_all_with(
        &self,
        options: ReplayOptions,
        cancel: &CancellationToken,
    ) -> Result<Vec<RunRecord>> {
        let mut queued = Vec::new();
        for p in self.projections() {
            match self.admit(RunKind::Rebuild, p.name(), None).await {
                Ok(run) => queued.push((run, p.clone())),
                Err(e) => {
                    for (run, _) in &queued {
                        let _ = self
                            .store()
                            .cancel_run(run.id)
                            .within(self.config().store_deadline(), "cancel_run")
                            .await;
                    }
                    return Err(e);
                }
            }
        }
        self.while_registered(async {
            let mut done = Vec::new();
            let mut rest = queued.into_iter();
            for (run, p) in rest.by_ref() {
                let rec = self.execute(run, p, options, cancel).await?;
                let stop = rec.state != outbox_core::RunState::Completed;
                done.push(rec);
                if stop {
                    break;
                }
            }
            for (run, _) in rest {
                done.push(
                    self.store()
                        .cancel_run(run.id)
                        .within(self.config().store_deadline(), "cancel_run")
                        .await?,
                );
            }
            Ok(done)
        })
        .await
    }

    /// Admits a run owned by this process (a refused admission writes
    /// nothing). When the projection's active run refuses it, that run's
    /// owner is not in the worker registry (killed: its entry expired; or
    /// never registered) and the run has not been updated for a registry
    /// entry's lifetime, the run is reclaimed (`abandoned`) and the
    /// admission is tried once more, without waiting for the run's claim to
    /// expire. The owner of a run beats in the registry while it executes
    /// ([`Outbox::while_registered`]).
    async fn admit(
        &self,
        kind: RunKind,
        projection: &ProjectionName,
        until: Option<u64>,
    ) -> Result<RunRecord> {
        let deadline = self.config().store_deadline();
        let admit = || {
            self.store()
                .admit_run(kind, projection, until, self.worker_id(), self.config().run_ttl)
                .within(deadline, "admit_run")
        };
        match admit().await {
            Err(Error::InvalidState(refused)) => {
                let live: Vec<_> = self
                    .journal()
                    .workers()
                    .within(deadline, "workers")
                    .await?
                    .into_iter()
                    .map(|w| w.id)
                    .collect();
                match self
                    .store()
                    .reclaim_run(
                        projection,
                        &live,
                        crate::running::heartbeat_ttl(self.config().heartbeat_interval),
                    )
                    .within(deadline, "reclaim_run")
                    .await?
                {
                    Some(gone) => {
                        warn!(run = gone.id, owner = %gone.owner, projection = %projection,
                            "reclaimed a run whose owner is gone from the worker registry");
                        admit().await
                    }
                    None => Err(Error::InvalidState(refused)),
                }
            }
            other => other,
        }
    }

    /// Runs `work` (executing admitted runs) with this process in the worker
    /// registry: a beat at once and every heartbeat interval (also during a
    /// rebuild's reset), so no other admission takes its runs for orphaned.
    /// Afterwards a process that runs no worker deregisters, so `outbox
    /// workers` does not show a finished replay.
    async fn while_registered<T>(&self, work: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        let stop = CancellationToken::new();
        let beating = tokio::spawn({
            let (this, stop) = (self.clone(), stop.clone());
            let interval = self.config().heartbeat_interval;
            async move {
                loop {
                    if let Err(e) = this.beat().await {
                        warn!(error = %e, "registering the run's owner in the worker registry failed");
                    }
                    tokio::select! {
                        () = stop.cancelled() => break,
                        () = tokio::time::sleep(interval) => {}
                    }
                }
            }
        });
        let out = work.await;
        stop.cancel();
        let _ = beating.await;
        if !self.inner.started.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = self
                .journal()
                .deregister(self.worker_id())
                .within(self.config().store_deadline(), "deregister")
                .await;
        }
        out
    }

    async fn execute(
        &self,
        run: RunRecord,
        projection: Arc<dyn Projection<P::Tx>>,
        options: ReplayOptions,
        cancel: &CancellationToken,
    ) -> Result<RunRecord> {
        let owner = self.worker_id().clone();
        let store = self.store();
        let mut rec = store
            .update_run(run.id, &owner, 0, None, self.config().run_ttl)
            .within(self.config().store_deadline(), "update_run")
            .await?;
        info!(run = rec.id, kind = %rec.kind, projection = %rec.projection, "run started");
        let result = self.run_body(&mut rec, projection, options, cancel).await;
        let end = match result {
            Ok(true) => RunEnd::Completed,
            Ok(false) => RunEnd::Cancelled,
            Err(e) => {
                warn!(run = rec.id, error = %e, "run failed; committed batches stay");
                RunEnd::Failed {
                    code: error_code(&e).into(),
                    message: e.to_string(),
                }
            }
        };
        let rec = store
            .finish_run(rec.id, &owner, end)
            .within(self.config().store_deadline(), "finish_run")
            .await?;
        info!(run = rec.id, state = %rec.state, processed = rec.processed, "run finished");
        Ok(rec)
    }

    /// Returns Ok(true) when it reached the end, Ok(false) when cancelled.
    async fn run_body(
        &self,
        rec: &mut RunRecord,
        projection: Arc<dyn Projection<P::Tx>>,
        options: ReplayOptions,
        cancel: &CancellationToken,
    ) -> Result<bool> {
        let owner = self.worker_id().clone();
        let store = self.store();
        let journal = self.journal();
        let batch = self.config().batch_size;
        let deadline = self.config().store_deadline();
        let one = [projection.clone()];
        if rec.kind == RunKind::Rebuild {
            // Resetting deletes a whole projection: bounded by the run ttl
            // (a run without progress for that long is over anyway), not by
            // the per-call store deadline.
            store
                .reset(projection.as_ref())
                .within(self.config().run_ttl, "reset")
                .await?;
        }
        let mut processed = 0u64;
        let mut after: Option<StreamId> = None;
        loop {
            let page = journal
                .stream_versions(after.as_ref(), 500)
                .within(deadline, "stream_versions")
                .await?;
            let Some(last_head) = page.last() else { break };
            after = Some(last_head.stream.clone());
            // Renew the claim and look for a cancel request once per page too,
            // so a long scan over already-applied streams keeps the run alive.
            *rec = store
                .update_run(rec.id, &owner, processed, None, self.config().run_ttl)
                .within(deadline, "update_run")
                .await?;
            if rec.cancel_requested || cancel.is_cancelled() {
                return Ok(false);
            }
            for head in page {
                let stream = &head.stream;
                let mut next = store
                    .checkpoint(projection.name(), stream)
                    .within(deadline, "checkpoint")
                    .await?
                    + 1;
                while next <= head.version {
                    let events = journal
                        .read_stream(stream, Seq::new(next)?, batch)
                        .within(deadline, "read_stream")
                        .await?;
                    let events: Vec<_> = events
                        .into_iter()
                        .take_while(|e| rec.until.is_none_or(|u| e.global_position <= u))
                        .collect();
                    let Some(last) = events.last() else { break };
                    let last_seq = last.seq;
                    match store
                        .apply(stream, &events, &one)
                        .within(deadline, "apply")
                        .await?
                    {
                        ApplyOutcome::Applied(r) => {
                            self.count(&r);
                            processed += r.applied + r.audit_only;
                        }
                        ApplyOutcome::Gap(gap) => {
                            // Someone (a concurrent reset) moved the checkpoint back: follow it.
                            next = gap.checkpoint + 1;
                            continue;
                        }
                    }
                    next = last_seq.get() + 1;
                    *rec = store
                        .update_run(
                            rec.id,
                            &owner,
                            processed,
                            Some((stream, last_seq)),
                            self.config().run_ttl,
                        )
                        .within(deadline, "update_run")
                        .await?;
                    if rec.cancel_requested || cancel.is_cancelled() {
                        return Ok(false);
                    }
                }
                if options.complete_rows {
                    self.resolve_rows(stream).await?;
                }
            }
        }
        *rec = store
            .update_run(rec.id, &owner, processed, None, self.config().run_ttl)
            .within(deadline, "update_run")
            .await?;
        Ok(true)
    }

    /// Deletes the stream's outbox rows (dead ones included) that every
    /// projection has now applied: the failure records a replay resolves.
    async fn resolve_rows(&self, stream: &StreamId) -> Result<()> {
        if !self.mode().enqueues() || self.projections().is_empty() {
            return Ok(());
        }
        let mut min = u64::MAX;
        for p in self.projections() {
            min = min.min(
                self.store()
                    .checkpoint(p.name(), stream)
                    .within(self.config().store_deadline(), "checkpoint")
                    .await?,
            );
        }
        if min > 0 {
            let n = self
                .journal()
                .complete(stream, Seq::new(min)?)
                .within(self.config().store_deadline(), "complete")
                .await?;
            Metrics::add(&self.inner.metrics.completed_rows, n);
        }
        Ok(())
    }

    /// Requests cancellation of a run (possibly running in another process).
    pub async fn cancel_run(&self, id: u64) -> Result<RunRecord> {
        self.store()
            .cancel_run(id)
            .within(self.config().store_deadline(), "cancel_run")
            .await
    }
}

/// A short machine-readable code for a run failure.
pub fn error_code(e: &Error) -> &'static str {
    match e {
        Error::Apply { .. } => "apply",
        Error::Corrupt { .. } => "corrupt",
        Error::Storage { .. } => "storage",
        Error::InvalidState(_) => "invalid_state",
        Error::NotFound(_) => "not_found",
        _ => "other",
    }
}
