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
    ApplyOutcome, Error, Event, EventJournal, OutboxQueue, Projection, ProjectionName, ProjectionStore,
    Result, RunBounds, RunEnd, RunKind, RunProgress, RunRecord, RunStore, Seq, StreamId, WorkerRegistry,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

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

/// Replays and rebuilds (ADR 0009, 0021): admits a run, applies the journal
/// to one projection page by page with its progress recorded, resumes or
/// cancels runs.
pub(crate) struct Replayer<'a, J, P: ProjectionStore> {
    rt: &'a Outbox<J, P>,
}

impl<J: JournalBackend, P: ProjectionBackend> Outbox<J, P> {
    /// The replayer service of this runtime.
    pub(crate) fn replayer(&self) -> Replayer<'_, J, P> {
        Replayer { rt: self }
    }

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

    /// Catch-up: applies what the projection has not applied yet, walking the
    /// journal in global-position order to the tail or to global position
    /// `until` (each stream in seq order; the checkpoints decide what is
    /// new). Returns the finished run record. Leaves the outbox rows alone
    /// ([`ReplayOptions::new`]).
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
        self.replay_bounded(projection, RunBounds::new().with_until(until), options, cancel)
            .await
    }

    /// Catch-up within global-position bounds (ADR 0020): only events after
    /// `bounds.since` are read (those at or before it are taken as already
    /// reflected) and none after `bounds.until`. A stream whose checkpoint is
    /// behind its first event after `since` is caught up from its checkpoint
    /// (events at or before `since` included), never skipped: the checkpoint,
    /// not `since`, says what the projection has applied. A stream with no
    /// event after `since` is not looked at.
    pub async fn replay_bounded(
        &self,
        projection: &str,
        bounds: RunBounds,
        options: ReplayOptions,
        cancel: &CancellationToken,
    ) -> Result<RunRecord> {
        self.replayer()
            .replay_bounded(projection, bounds, options, cancel)
            .await
    }

    /// Resumes a run that stopped before its end (failed, cancelled, or
    /// killed: an active run whose owner's claim expired or whose owner left
    /// the worker registry, which admission marks `abandoned`): admits a new
    /// run that continues from the stopped run's recorded cursor. A run that
    /// committed a page continues as a catch-up with `since` = its
    /// `position` and its `until` (a rebuild's reset is behind it); one that
    /// committed nothing starts again as it was (a rebuild resets again).
    /// The checkpoints keep it exactly-once either way: what the stopped run
    /// committed after the position it recorded is skipped as duplicates.
    ///
    /// # Errors
    ///
    /// `NotFound` for an unknown run; `InvalidState` for a completed run
    /// (nothing to resume) and, from admission, for a run still alive.
    pub async fn resume_run(
        &self,
        id: u64,
        options: ReplayOptions,
        cancel: &CancellationToken,
    ) -> Result<RunRecord> {
        self.replayer().resume_run(id, options, cancel).await
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
        self.replayer().rebuild_with(projection, options, cancel).await
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
        self.replayer().rebuild_all_with(options, cancel).await
    }

    /// Requests cancellation of a run (possibly running in another process).
    pub async fn cancel_run(&self, id: u64) -> Result<RunRecord> {
        self.inner.store.cancel_run(id).await
    }
}

impl<J: JournalBackend, P: ProjectionBackend> Replayer<'_, J, P> {
    /// [`Outbox::replay_bounded`]: admits a catch-up run of `projection`
    /// within `bounds` and executes it while this process stays registered.
    pub(crate) async fn replay_bounded(
        &self,
        projection: &str,
        bounds: RunBounds,
        options: ReplayOptions,
        cancel: &CancellationToken,
    ) -> Result<RunRecord> {
        let p = self.rt.projection(projection)?;
        let run = self.admit(RunKind::CatchUp, p.name(), bounds).await?;
        self.while_registered(self.execute(run, p, options, cancel)).await
    }

    /// [`Outbox::resume_run`]: a new run from run `id`'s cursor (or its
    /// bounds, if it never moved); refused for a completed run.
    pub(crate) async fn resume_run(
        &self,
        id: u64,
        options: ReplayOptions,
        cancel: &CancellationToken,
    ) -> Result<RunRecord> {
        let old = self
            .rt
            .inner
            .store
            .run(id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("run {id}")))?;
        if old.state == outbox_core::RunState::Completed {
            return Err(Error::InvalidState(format!(
                "run {id} completed: there is nothing to resume (start a catch-up with `since` {})",
                old.position.or(old.since).unwrap_or(0)
            )));
        }
        let p = self.rt.projection(old.projection.as_str())?;
        let (kind, bounds) = match (old.kind, old.position) {
            (_, Some(position)) => (
                RunKind::CatchUp,
                RunBounds::new().with_since(Some(position)).with_until(old.until),
            ),
            (kind, None) => (kind, RunBounds::new().with_since(old.since).with_until(old.until)),
        };
        // A cursor at `until` already: nothing is left, but a run says so.
        let bounds = match (bounds.since, bounds.until) {
            (Some(s), Some(u)) if s >= u => RunBounds::new().with_since(u.checked_sub(1)).with_until(Some(u)),
            _ => bounds,
        };
        // Admission refuses while the old run is alive, and marks it
        // `abandoned` when its claim expired or its owner is gone.
        let run = self.admit(kind, p.name(), bounds).await?;
        info!(run = run.id, resumes = id, since = ?run.since, "resuming a run from its cursor");
        self.while_registered(self.execute(run, p, options, cancel)).await
    }

    /// [`Outbox::rebuild_with`]: admits and executes a rebuild of
    /// `projection` from the first event.
    pub(crate) async fn rebuild_with(
        &self,
        projection: &str,
        options: ReplayOptions,
        cancel: &CancellationToken,
    ) -> Result<RunRecord> {
        let p = self.rt.projection(projection)?;
        let run = self.admit(RunKind::Rebuild, p.name(), RunBounds::new()).await?;
        self.while_registered(self.execute(run, p, options, cancel)).await
    }

    /// [`Outbox::rebuild_all_with`]: a rebuild of every projection, one
    /// after another.
    pub(crate) async fn rebuild_all_with(
        &self,
        options: ReplayOptions,
        cancel: &CancellationToken,
    ) -> Result<Vec<RunRecord>> {
        let mut queued = Vec::new();
        for p in self.rt.projections() {
            match self.admit(RunKind::Rebuild, p.name(), RunBounds::new()).await {
                Ok(run) => queued.push((run, p.clone())),
                Err(e) => {
                    for (run, _) in &queued {
                        let _ = self.rt.inner.store.cancel_run(run.id).await;
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
                done.push(self.rt.inner.store.cancel_run(run.id).await?);
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
    /// ([`Replayer::while_registered`]).
    async fn admit(
        &self,
        kind: RunKind,
        projection: &ProjectionName,
        bounds: RunBounds,
    ) -> Result<RunRecord> {
        let admit = || {
            self.rt.inner.store.admit_bounded_run(
                kind,
                projection,
                bounds,
                self.rt.worker_id(),
                self.rt.config().run_ttl,
            )
        };
        match admit().await {
            Err(Error::InvalidState(refused)) => {
                let live: Vec<_> = self
                    .rt
                    .inner
                    .journal
                    .workers()
                    .await?
                    .into_iter()
                    .map(|w| w.id)
                    .collect();
                match self
                    .rt
                    .inner
                    .store
                    .reclaim_run(
                        projection,
                        &live,
                        crate::config::heartbeat_ttl(self.rt.config().heartbeat_interval),
                    )
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
    pub(crate) async fn while_registered<T>(
        &self,
        work: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        // The beats run beside `work` in this task (no spawn): polled
        // whenever `work` waits, and ended by `work` ending.
        let stop = CancellationToken::new();
        let interval = self.rt.config().heartbeat_interval;
        let beating = async {
            loop {
                if let Err(e) = self.rt.beat().await {
                    warn!(error = %e, "registering the run's owner in the worker registry failed");
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(interval) => {}
                }
            }
        };
        let working = async {
            let out = work.await;
            stop.cancel();
            out
        };
        let (out, ()) = tokio::join!(working, beating);
        if !self.rt.inner.started.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = self.rt.inner.journal.deregister(self.rt.worker_id()).await;
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
        let owner = self.rt.worker_id().clone();
        let store = &self.rt.inner.store;
        let mut rec = store
            .update_run(run.id, &owner, 0, None, self.rt.config().run_ttl)
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
        let rec = store.finish_run(rec.id, &owner, end).await?;
        info!(run = rec.id, state = %rec.state, processed = rec.processed, "run finished");
        Ok(rec)
    }

    /// Returns Ok(true) when it reached the end, Ok(false) when cancelled.
    ///
    /// Walks the journal in global-position order from the run's `since`
    /// (ADR 0020), a page of `batch_size` events at a time. A page is
    /// applied in one projection transaction ([`apply_runs`]), one run per
    /// stream; when a stream's checkpoint is behind its first event in the
    /// page (a `Gap`), the page is applied stream by stream instead and that
    /// stream is caught up from its checkpoint. After each page the run
    /// records the page's last global position as its cursor.
    ///
    /// [`apply_runs`]: outbox_core::ProjectionStore::apply_runs
    async fn run_body(
        &self,
        rec: &mut RunRecord,
        projection: Arc<dyn Projection<P::Tx>>,
        options: ReplayOptions,
        cancel: &CancellationToken,
    ) -> Result<bool> {
        let owner = self.rt.worker_id().clone();
        let store = &self.rt.inner.store;
        let journal = &self.rt.inner.journal;
        let batch = self.rt.config().batch_size;
        let one = [projection.clone()];
        if rec.kind == RunKind::Rebuild {
            // Resetting deletes a whole projection: bounded by the run ttl
            // (a run without progress for that long is over anyway), not by
            // the per-call store deadline.
            store.reset(projection.as_ref()).await?;
        }
        let until = rec.until;
        let mut processed = 0u64;
        let mut cursor = rec.since.unwrap_or(0);
        loop {
            if rec.cancel_requested || cancel.is_cancelled() {
                return Ok(false);
            }
            let page: Vec<Event> = journal
                .read_global(cursor, batch)
                .await?
                .into_iter()
                .take_while(|e| until.is_none_or(|u| e.global_position <= u))
                .collect();
            let Some(last) = page.last() else { break };
            let (through, last_stream, last_seq) = (last.global_position, last.stream.clone(), last.seq);
            let runs = by_stream(page);
            processed += self.apply_page(Some(rec.id), rec.until, &runs, &one).await?;
            if options.complete_rows {
                for (stream, _) in &runs {
                    self.resolve_rows(stream).await?;
                }
            }
            cursor = through;
            let progress = RunProgress {
                processed,
                last: Some((&last_stream, last_seq)),
                position: Some(through),
            };
            *rec = store
                .record_progress(rec.id, &owner, progress, self.rt.config().run_ttl)
                .await?;
        }
        *rec = store
            .update_run(rec.id, &owner, processed, None, self.rt.config().run_ttl)
            .await?;
        Ok(true)
    }

    /// Applies one page (runs of distinct streams, each in seq order) to the
    /// projection `one` (of run `run`, none for a generation build) and
    /// returns the events it newly processed. First all of it in one
    /// transaction; if a stream's checkpoint is behind its run (nothing was
    /// committed then), stream by stream, catching such a stream up from its
    /// checkpoint first (no further than global position `until`).
    pub(crate) async fn apply_page(
        &self,
        run: Option<u64>,
        until: Option<u64>,
        runs: &[(StreamId, Vec<Event>)],
        one: &[Arc<dyn Projection<P::Tx>>],
    ) -> Result<u64> {
        let store = &self.rt.inner.store;
        let slices: Vec<&[Event]> = runs.iter().map(|(_, events)| events.as_slice()).collect();
        let outcomes = store.apply_runs(&slices, one).await?;
        if outcomes.len() == runs.len() && outcomes.iter().all(|o| matches!(o, ApplyOutcome::Applied(_))) {
            let mut processed = 0;
            for outcome in &outcomes {
                if let ApplyOutcome::Applied(r) = outcome {
                    self.rt.count(r);
                    processed += r.applied + r.audit_only;
                }
            }
            return Ok(processed);
        }
        let mut processed = 0;
        for (stream, events) in runs {
            let (Some(first), Some(last)) = (events.first(), events.last()) else {
                continue;
            };
            match store.apply(stream, events, one).await? {
                ApplyOutcome::Applied(r) => {
                    self.rt.count(&r);
                    processed += r.applied + r.audit_only;
                }
                ApplyOutcome::Gap(gap) => {
                    warn!(run = ?run, projection = %one[0].name(), stream = %stream,
                        checkpoint = gap.checkpoint, first_seq = first.seq.get(),
                        first_position = first.global_position,
                        "the stream's checkpoint is behind the run's first event for it: \
                         catching the stream up from its checkpoint");
                    processed += self
                        .catch_up_stream(stream, gap.checkpoint + 1, last.seq.get(), until, one)
                        .await?;
                }
            }
        }
        Ok(processed)
    }

    /// Applies `stream` from seq `next` through seq `through` (no further
    /// than global position `until`), in batches, following the checkpoint
    /// when a concurrent reset moves it back. Returns the events processed.
    pub(crate) async fn catch_up_stream(
        &self,
        stream: &StreamId,
        mut next: u64,
        through: u64,
        until: Option<u64>,
        one: &[Arc<dyn Projection<P::Tx>>],
    ) -> Result<u64> {
        let store = &self.rt.inner.store;
        let batch = self.rt.config().batch_size;
        let mut processed = 0;
        while next <= through {
            let want = usize::try_from(through - next + 1)
                .unwrap_or(usize::MAX)
                .min(batch);
            let events: Vec<Event> = self
                .rt
                .inner
                .journal
                .read_stream(stream, Seq::new(next)?, want)
                .await?
                .into_iter()
                .take_while(|e| until.is_none_or(|u| e.global_position <= u))
                .collect();
            let Some(last) = events.last() else { break };
            let last_seq = last.seq.get();
            match store.apply(stream, &events, one).await? {
                ApplyOutcome::Applied(r) => {
                    self.rt.count(&r);
                    processed += r.applied + r.audit_only;
                    next = last_seq + 1;
                }
                // Someone (a concurrent reset) moved the checkpoint back: follow it.
                ApplyOutcome::Gap(gap) => next = gap.checkpoint + 1,
            }
        }
        Ok(processed)
    }

    /// Deletes the stream's outbox rows (dead ones included) that every
    /// projection has now applied: the failure records a replay resolves.
    async fn resolve_rows(&self, stream: &StreamId) -> Result<()> {
        if !self.rt.mode().enqueues() || self.rt.projections().is_empty() {
            return Ok(());
        }
        let mut min = u64::MAX;
        for p in self.rt.projections() {
            min = min.min(self.rt.inner.store.checkpoint(p.name(), stream).await?);
        }
        if min > 0 {
            // The projections another process runs keep their share (ADR 0032).
            self.rt.refresh_registry(false).await?;
            self.rt.hold_unrun(stream).await?;
            let n = self.rt.inner.journal.complete(stream, Seq::new(min)?).await?;
            Metrics::add(&self.rt.inner.metrics.completed_rows, n);
        }
        Ok(())
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

/// Splits a page read in global-position order into one run per stream (in
/// the order the streams first appear), each in seq order.
pub(crate) fn by_stream(page: Vec<Event>) -> Vec<(StreamId, Vec<Event>)> {
    let mut runs: Vec<(StreamId, Vec<Event>)> = Vec::new();
    let mut index: std::collections::HashMap<StreamId, usize> = std::collections::HashMap::new();
    for event in page {
        match index.get(&event.stream) {
            Some(&i) => runs[i].1.push(event),
            None => {
                index.insert(event.stream.clone(), runs.len());
                runs.push((event.stream.clone(), vec![event]));
            }
        }
    }
    runs
}
