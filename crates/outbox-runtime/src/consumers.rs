//! Every projection on its own (ADR 0032): the shared path applies a
//! stream's run to the projections that are current on it, and a projection
//! that fails on an event, or is found behind, leaves the shared path on
//! that stream alone. Its exception is kept per (projection, stream) in the
//! journal's consumer states ([`SinkStore`], under
//! [`projection_consumer`]), the same records and retry rules a sink's
//! failed stream has, and the exception path below catches it up from its
//! own checkpoint: retried with backoff, dead-lettered at the threshold,
//! requeued per (projection, stream). The other projections of the stream
//! go on applying its later events, exactly once, in order.
//!
//! The projection store's checkpoint stays the truth: a consumer state only
//! says "this projection needs the exception path on this stream". A run's
//! rows are completed only after every projection that did not apply it
//! has such a state (failed, dead or found behind), so no event is left
//! without someone to apply it; and a state becomes `ok` only when the
//! projection reached the stream's version, compared under the stream's
//! lock (the rule sinks follow), so an event appended meanwhile keeps it due.

use std::sync::Arc;

use outbox_core::{
    ApplyOutcome, ApplyReport, ConsumerRegistry, Error, Event, EventJournal, FailureOutcome, OnError,
    PartitionStore, Projection, ProjectionName, ProjectionStore, Result, Seq, SinkName, SinkStatus,
    SinkStore, SinkStream, StreamId, Timestamp, projection_consumer,
};
use serde::Serialize;
use tracing::{debug, warn};

use crate::metrics::Metrics;
use crate::outbox::{JournalBackend, Outbox, ProjectionBackend};
use crate::worker::TickReport;

impl<J: JournalBackend, P: ProjectionBackend> Outbox<J, P> {
    /// Applies the contiguous run `events` of `stream` to every projection
    /// that is current on the stream, each on its own: a projection found
    /// behind, or failing on an event, is taken off the shared path on this
    /// stream (its consumer state records why) and the run is applied to
    /// the others. Events before a failure are applied to every projection
    /// first, so the failing one stops right before its event. Returns the
    /// counts of what was committed; an error is the store's (nothing about
    /// it is the run's fault), and leaves the rows to the next claim.
    pub(crate) async fn apply_isolated(
        &self,
        stream: &StreamId,
        events: &[Event],
        report: &mut TickReport,
    ) -> Result<ApplyReport> {
        self.apply_isolated_without(stream, events, None, report).await
    }

    /// Records the applier failure `error` (an [`Error::Apply`] on the
    /// first event of `rest`) on its projection's state for `stream`, and
    /// applies `rest` to the other projections, each on its own.
    pub(crate) async fn apply_rest_without(
        &self,
        stream: &StreamId,
        rest: &[Event],
        error: &Error,
        report: &mut TickReport,
    ) -> Result<()> {
        let (Error::Apply { projection, .. }, Some(first)) = (error, rest.first()) else {
            return Err(Error::InvalidState(format!(
                "not an applier's failure on a run: {error}"
            )));
        };
        let name = ProjectionName::new(projection.as_str())?;
        let key = projection_consumer(&name)?;
        self.record_consumer_failure(&key, stream, first.seq, error, report)
            .await?;
        self.apply_isolated_without(stream, rest, Some(&name), report)
            .await?;
        Ok(())
    }

    /// [`apply_isolated`](Self::apply_isolated) without projection `without`.
    async fn apply_isolated_without(
        &self,
        stream: &StreamId,
        events: &[Event],
        without: Option<&ProjectionName>,
        report: &mut TickReport,
    ) -> Result<ApplyReport> {
        let inner = &self.inner;
        // Borrowed until a projection leaves the run (copied only then).
        let mut included = self.active_projections();
        if let Some(name) = without {
            included.to_mut().retain(|p| p.name() != name);
        }
        // The projections another process runs keep their share of what
        // this run completes.
        self.hold_unrun(stream).await?;
        let mut total = ApplyReport::default();
        // `events[..done]` is committed for `included`; `events[done..end]` is tried next.
        let (mut done, mut end) = (0, events.len());
        // A failure met past the start of a try: recorded once the events
        // before it are committed.
        let mut pending: Option<(usize, Error)> = None;
        while done < events.len() && !included.is_empty() {
            let outcome = inner.store.apply(stream, &events[done..end], &included).await;
            match outcome {
                Ok(ApplyOutcome::Applied(r)) => {
                    self.count(&r);
                    total.through = total.through.max(r.through);
                    total.applied += r.applied;
                    total.duplicates += r.duplicates;
                    total.audit_only += r.audit_only;
                    done = end;
                    end = events.len();
                    if let Some((at, error)) = pending.take()
                        && at == done
                    {
                        self.fail_on_shared_path(&mut included, stream, &events[at], &error, report)
                            .await?;
                    }
                }
                Ok(ApplyOutcome::Gap(gap)) => {
                    // Behind on this stream: its exception path catches it up.
                    included.to_mut().retain(|p| *p.name() != gap.projection);
                    let key = projection_consumer(&gap.projection)?;
                    self.hold(&key, stream, gap.checkpoint).await?;
                    debug!(projection = %gap.projection, stream = %stream, checkpoint = gap.checkpoint, "projection behind; left to its own catch-up");
                }
                Err(Error::Apply { seq, .. }) if !events[done..end].iter().any(|e| e.seq == seq) => {
                    return Err(Error::InvalidState(format!(
                        "an applier failed on {stream}/{seq}, which is not in the run being applied"
                    )));
                }
                Err(error @ Error::Apply { .. }) => {
                    let Error::Apply { seq, .. } = &error else {
                        unreachable!("matched above")
                    };
                    let at = events.iter().position(|e| e.seq == *seq).unwrap_or(done);
                    if at == done {
                        self.fail_on_shared_path(&mut included, stream, &events[at], &error, report)
                            .await?;
                    } else {
                        // Commit the events before it to every projection first.
                        end = at;
                        pending = Some((at, error));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }

    /// Records the failure of the projection `error` names on `event` and
    /// takes it out of `included`: the rest of the run goes on without it.
    async fn fail_on_shared_path(
        &self,
        included: &mut std::borrow::Cow<'_, [Arc<dyn Projection<P::Tx>>]>,
        stream: &StreamId,
        event: &Event,
        error: &Error,
        report: &mut TickReport,
    ) -> Result<()> {
        let Error::Apply { projection, .. } = error else {
            return Err(Error::InvalidState(format!("not an applier's failure: {error}")));
        };
        let Some(i) = included.iter().position(|p| p.name().as_str() == projection) else {
            return Err(Error::InvalidState(format!(
                "projection `{projection}` failed on {stream}/{} but is not being applied",
                event.seq
            )));
        };
        let p = included.to_mut().remove(i);
        let key = projection_consumer(p.name())?;
        self.record_consumer_failure(&key, stream, event.seq, error, report)
            .await
    }

    /// Clears the attempt count of (`key`, `stream`) once its position has
    /// moved past the event its failures were counted on (a no-op on a
    /// state with none, or one back on the shared path).
    async fn reset_attempts(&self, key: &SinkName, stream: &StreamId) -> Result<()> {
        let state = self
            .inner
            .journal
            .sink_states(key, std::slice::from_ref(stream))
            .await?
            .remove(0);
        if state.status == SinkStatus::Ok || state.attempt_count == 0 {
            return Ok(());
        }
        match self.inner.journal.requeue_sink(key, stream).await {
            Ok(_) | Err(Error::NotFound(_) | Error::InvalidState(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Takes (`key`, `stream`) off the shared path at `at` (no change when it is already).
    async fn hold(&self, key: &SinkName, stream: &StreamId, at: u64) -> Result<SinkStream> {
        let partition = self.inner.journal.partitioning().of(stream);
        self.inner.journal.hold_sink(key, stream, partition, at).await
    }

    /// Records that the consumer `key` failed on `stream`/`seq` with
    /// `error`, its position being right before it: one attempt counted,
    /// dead at the threshold, or as the error's decision (or the
    /// projection's policy) says: dead at once (`park`), the projection
    /// paused (`stop`), or the event passed over with a record (`skip`).
    /// Nothing is counted when its state has moved elsewhere meanwhile
    /// (another worker is at it).
    async fn record_consumer_failure(
        &self,
        key: &SinkName,
        stream: &StreamId,
        seq: Seq,
        error: &Error,
        report: &mut TickReport,
    ) -> Result<()> {
        let inner = &self.inner;
        let message = error.to_string();
        let message = message.as_str();
        let mut decision = self.decision(key, error);
        if decision == OnError::Stop
            && let Some(name) = outbox_core::consumer_projection(key)
        {
            match self.pause_projection(&ProjectionName::new(name)?, true).await {
                Ok(_) => {
                    warn!(consumer = %key, stream = %stream, seq = %seq, error = %message, "the projection's error stops it: paused for every stream until resumed")
                }
                // Not registered (no worker pass yet): retried as a plain failure.
                Err(e) => {
                    warn!(consumer = %key, error = %e, "the projection's error asks to stop it, but pausing it failed")
                }
            }
        }
        let partition = self.inner.journal.partitioning().of(stream);
        let before = seq.get() - 1;
        let state = self.hold(key, stream, before).await?;
        if state.seq < before {
            let moved = self
                .inner
                .journal
                .advance_sink(key, stream, partition, state.seq, Seq::new(before)?, true)
                .await?;
            if !moved {
                return Ok(());
            }
            // Past the event its earlier failures were on: this one is a
            // first attempt.
            self.reset_attempts(key, stream).await?;
        } else if state.seq > before {
            return Ok(());
        }
        if decision == OnError::Skip
            && let Some(name) = outbox_core::consumer_projection(key)
        {
            match self
                .skip_event(&ProjectionName::new(name)?, stream, seq, message)
                .await?
            {
                crate::skipping::SkipOutcome::Skipped => {
                    // Its state stays due: the exception path goes on from
                    // the checkpoint just past the event.
                    report.skipped += 1;
                    Metrics::add(&inner.metrics.skipped, 1);
                    return Ok(());
                }
                // No skip records (ADR 0035): parked instead.
                crate::skipping::SkipOutcome::Unsupported => decision = OnError::Park,
                // Its state stays due: the exception path finds where the
                // checkpoint is; this failure is nobody's to count.
                crate::skipping::SkipOutcome::Elsewhere => return Ok(()),
            }
        }
        let policy = match decision {
            OnError::Park => inner.config.retry.with_dead_letter_after(1)?,
            OnError::Retry | OnError::Stop | OnError::Skip => inner.config.retry,
        };
        let outcome = match self
            .inner
            .journal
            .fail_sink(key, stream, partition, seq, message, &policy)
            .await
        {
            Ok(o) => o,
            Err(Error::InvalidState(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        match outcome {
            FailureOutcome::Retry {
                attempt,
                next_attempt_at,
            } => {
                warn!(consumer = %key, stream = %stream, seq = %seq, attempt, %next_attempt_at, error = %message, "apply failed for this projection; it is retried on this stream while the others go on");
                report.failed += 1;
                Metrics::add(&inner.metrics.failed, 1);
            }
            FailureOutcome::Dead { attempt } => {
                warn!(consumer = %key, stream = %stream, seq = %seq, attempt, error = %message, "dead-lettered for this projection on this stream until requeued; the others go on");
                report.dead_lettered += 1;
                Metrics::add(&inner.metrics.dead_lettered, 1);
            }
        }
        Ok(())
    }

    /// The exception path: every projection's due consumer states in the
    /// partitions this worker serves, each caught up from the projection's
    /// own checkpoint, alone.
    pub(crate) async fn catch_up_consumers(&self, report: &mut TickReport) -> Result<()> {
        let inner = &self.inner;
        if inner.projections.is_empty() {
            return Ok(());
        }
        let parts = self.delivery().delivery_partitions();
        if parts.is_empty() {
            return Ok(());
        }
        for p in self.active_projections().into_owned() {
            let key = projection_consumer(p.name())?;
            let due = self
                .inner
                .journal
                .due_sink_streams(&key, &parts, inner.config.streams_per_pass)
                .await?;
            for state in due {
                match self.catch_up_consumer(&p, &key, &state, report).await {
                    Ok(()) => {}
                    Err(e) if e.is_temporary() => {
                        warn!(consumer = %key, stream = %state.stream, error = %e, "catching a projection up was interrupted; it is retried");
                        report.storage_errors += 1;
                        Metrics::add(&inner.metrics.storage_errors, 1);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Catches projection `p` up on `state.stream` from its checkpoint, a
    /// batch at a time; moves its consumer state along, `ok` once at the
    /// stream's version, or records its failure.
    async fn catch_up_consumer(
        &self,
        p: &Arc<dyn Projection<P::Tx>>,
        key: &SinkName,
        state: &SinkStream,
        report: &mut TickReport,
    ) -> Result<()> {
        let inner = &self.inner;
        let stream = &state.stream;
        let partition = self.inner.journal.partitioning().of(stream);
        let only = std::slice::from_ref(p);
        let mut at = state.seq;
        let mut checkpoint = inner.store.checkpoint(p.name(), stream).await?;
        if checkpoint > at {
            // Applied past where the state says (a catch-up that ended
            // before moving it): move it, keeping it due.
            let moved = self
                .inner
                .journal
                .advance_sink(key, stream, partition, at, Seq::new(checkpoint)?, true)
                .await?;
            if !moved {
                return Ok(());
            }
            self.reset_attempts(key, stream).await?;
            at = checkpoint;
        }
        let full = inner.config.batch_size.min(outbox_core::MAX_PAGE - 1);
        // A projection that writes runs cannot place a panic inside one: it
        // blames the run's first event. Before such a blame is recorded,
        // that event is tried alone (`batch` 1), so the failure recorded is
        // always the one event's that fails by itself.
        let mut batch = full;
        loop {
            let mut events = self
                .inner
                .journal
                .read_stream(stream, Seq::new(checkpoint + 1)?, batch + 1)
                .await?;
            let more = events.len() > batch;
            events.truncate(batch);
            let Some(last) = events.last().map(|e| e.seq) else {
                // At the stream's end: settle (`ok` when still at its
                // version under the stream's lock).
                if let Ok(here) = Seq::new(at) {
                    self.inner
                        .journal
                        .advance_sink(key, stream, partition, at, here, false)
                        .await?;
                }
                return Ok(());
            };
            let outcome = inner.store.apply(stream, &events, only).await;
            let (applied_through, failure) = match outcome {
                Ok(ApplyOutcome::Applied(r)) => {
                    self.count(&r);
                    report.caught_up += r.applied + r.audit_only;
                    batch = full;
                    (Some(last), None)
                }
                // Its checkpoint moved under us (a reset): the next pass starts over.
                Ok(ApplyOutcome::Gap(_)) => return Ok(()),
                Err(Error::Apply { seq, .. })
                    if p.applies_runs() && events.len() > 1 && seq == events[0].seq =>
                {
                    debug!(consumer = %key, stream = %stream, seq = %seq, "a run failed on its first event; trying that event alone before blaming it");
                    batch = 1;
                    continue;
                }
                Err(e @ Error::Apply { .. }) => {
                    let Error::Apply { seq, .. } = &e else {
                        unreachable!("matched above")
                    };
                    let seq = *seq;
                    let before: Vec<Event> = events.iter().filter(|x| x.seq < seq).cloned().collect();
                    let through = match before.last() {
                        None => None,
                        Some(prev) => match inner.store.apply(stream, &before, only).await {
                            Ok(ApplyOutcome::Applied(r)) => {
                                self.count(&r);
                                report.caught_up += r.applied + r.audit_only;
                                Some(prev.seq)
                            }
                            Ok(ApplyOutcome::Gap(_)) => return Ok(()),
                            Err(e) if e.is_temporary() && !crate::bounded::stalled(&e) => return Err(e),
                            // It failed earlier this time: the next pass finds where.
                            Err(_) => return Ok(()),
                        },
                    };
                    (through, Some((seq, e)))
                }
                Err(e) if e.is_temporary() && !crate::bounded::stalled(&e) => return Err(e),
                // Anything else is this projection's trouble on its next event
                // (a stalled apply, a transaction it ended).
                Err(e) => (None, Some((events[0].seq, e))),
            };
            if let Some(through) = applied_through {
                // With a failure to record, the state stays due whatever the version.
                let keep_due = more || failure.is_some();
                let moved = self
                    .inner
                    .journal
                    .advance_sink(key, stream, partition, at, through, keep_due)
                    .await?;
                if !moved {
                    return Ok(());
                }
                if keep_due {
                    // Past the event its earlier failures were on: attempts
                    // count consecutive failures of one event.
                    self.reset_attempts(key, stream).await?;
                }
                at = through.get();
                checkpoint = at;
            }
            if let Some((seq, e)) = failure {
                return self.record_consumer_failure(key, stream, seq, &e, report).await;
            }
            if !more {
                // The settle above (without `more`) made it `ok` at the
                // version, or left it due for the next pass.
                return Ok(());
            }
        }
    }
}

impl<J: JournalBackend, P: ProjectionBackend> Outbox<J, P> {
    /// The consumers this runtime runs: its projections and sinks. Only
    /// the paths that apply call [`refresh_registry`](Self::refresh_registry)
    /// (worker passes, inline apply, repair and replay that complete rows),
    /// so a producer registers nothing.
    fn own_consumers(&self) -> Result<Vec<(SinkName, outbox_core::ConsumerKind)>> {
        let inner = &self.inner;
        let mut out = Vec::new();
        for p in &inner.projections {
            out.push((
                projection_consumer(p.name())?,
                outbox_core::ConsumerKind::Projection,
            ));
        }
        for s in &inner.sinks {
            out.push((s.name().clone(), outbox_core::ConsumerKind::Sink));
        }
        Ok(out)
    }

    /// Registers this runtime's consumers and reads the registry: at most
    /// once per heartbeat interval, unless `force`. A runtime that runs no
    /// consumer (a producer) neither registers nor reads.
    pub(crate) async fn refresh_registry(&self, force: bool) -> Result<()> {
        let inner = &self.inner;
        if !force && !inner.registry.due(inner.config.heartbeat_interval) {
            return Ok(());
        }
        let mine = self.own_consumers()?;
        if mine.is_empty() {
            return Ok(());
        }
        self.inner
            .journal
            .register_consumers(&mine, &inner.code_version, &inner.worker_id)
            .await?;
        let all = self.inner.journal.consumers().await?;
        let name = |c: &outbox_core::ConsumerInfo| c.projection().and_then(|p| ProjectionName::new(p).ok());
        let unrun: Vec<ProjectionName> = all
            .iter()
            .filter(|c| !mine.iter().any(|(k, _)| *k == c.key))
            .filter_map(name)
            .collect();
        let paused: Vec<ProjectionName> = all
            .iter()
            .filter(|c| c.paused && mine.iter().any(|(k, _)| *k == c.key))
            .filter_map(name)
            .collect();
        let paused_sinks: Vec<SinkName> = all
            .iter()
            .filter(|c| c.paused && c.kind == outbox_core::ConsumerKind::Sink)
            .filter(|c| mine.iter().any(|(k, _)| *k == c.key))
            .map(|c| c.key.clone())
            .collect();
        self.set_registry(unrun, paused, paused_sinks);
        Ok(())
    }

    fn set_registry(
        &self,
        unrun: Vec<ProjectionName>,
        paused: Vec<ProjectionName>,
        paused_sinks: Vec<SinkName>,
    ) {
        self.inner.registry.replace(unrun, paused, paused_sinks);
    }

    /// The decision for `error` of consumer `key`: the error's own
    /// ([`ApplyError`](outbox_core::ApplyError)), else the projection's
    /// registered policy, else retry.
    fn decision(&self, key: &SinkName, error: &Error) -> OnError {
        if let Error::Apply { source, .. } = error
            && let Some(d) = outbox_core::ApplyError::decision_of(&**source)
        {
            return d;
        }
        let policy = outbox_core::consumer_projection(key)
            .and_then(|p| self.inner.policies.get(p).copied())
            .unwrap_or_default();
        // A registered skip is for the applier's own failures: a stalled
        // apply or a transaction it ended is retried, never skipped.
        if policy == OnError::Skip && !matches!(error, Error::Apply { .. }) {
            return OnError::Retry;
        }
        policy
    }

    /// The projections applied here now: the registered ones not paused.
    pub(crate) fn active_projections(&self) -> std::borrow::Cow<'_, [Arc<dyn Projection<P::Tx>>]> {
        let paused = self.inner.registry.paused();
        if paused.is_empty() {
            return std::borrow::Cow::Borrowed(&self.inner.projections);
        }
        std::borrow::Cow::Owned(
            self.inner
                .projections
                .iter()
                .filter(|p| !paused.contains(p.name()))
                .cloned()
                .collect(),
        )
    }

    /// The projections gap repair may apply on `stream`: the active ones
    /// (not paused) that are not off the shared path there (a failing or
    /// dead one is its exception path's to retry, with its attempts counted).
    pub(crate) async fn repairable(&self, stream: &StreamId) -> Result<Vec<Arc<dyn Projection<P::Tx>>>> {
        let mut out = Vec::new();
        for p in self.active_projections().iter() {
            let key = projection_consumer(p.name())?;
            let state = self
                .inner
                .journal
                .sink_states(&key, std::slice::from_ref(stream))
                .await?;
            if state.first().is_none_or(|s| s.status == SinkStatus::Ok) {
                out.push(Arc::clone(p));
            }
        }
        Ok(out)
    }

    /// Pauses (or resumes) projection `name` for every stream, in the
    /// registry and at once in this runtime (others follow at their next
    /// registry read, within a heartbeat interval). A paused projection is
    /// applied by no worker; every worker leaves it a state on each stream
    /// whose rows it completes, so its backlog is reported and kept.
    /// Resuming makes those states due at once. `NotFound` when no worker
    /// has registered it.
    pub async fn pause_projection(&self, name: &ProjectionName, paused: bool) -> Result<bool> {
        let key = projection_consumer(name)?;
        let changed = pause_consumer(&self.inner.journal, &key, paused).await?;
        let runs_here = self.inner.projections.iter().any(|p| p.name() == name);
        self.inner.registry.set_paused(name, paused && runs_here);
        Ok(changed)
    }

    /// Leaves every registered projection this runtime does not run a
    /// consumer state on `stream` (held, due at once) before its rows are
    /// completed here: the projection's own workers catch it up from its
    /// checkpoint (ADR 0032). Nothing when every registered projection runs
    /// here.
    pub(crate) async fn hold_unrun(&self, stream: &StreamId) -> Result<()> {
        let registry = &self.inner.registry;
        for p in registry.unrun().iter().chain(registry.paused().iter()) {
            self.hold(&projection_consumer(p)?, stream, 0).await?;
        }
        Ok(())
    }

    /// The registered projections' exceptions (ADR 0032): per (projection,
    /// stream), the streams on which a projection failed, was dead-lettered
    /// or fell behind while the others went on; only those of `status`
    /// when given; at most `limit` per projection. Each state's `sink` is
    /// the projection's key ([`projection_consumer`]) and its `seq` the
    /// last event the projection had applied when it left the shared path
    /// (the event after it is the one that failed).
    pub async fn projection_states(
        &self,
        status: Option<SinkStatus>,
        limit: usize,
    ) -> Result<Vec<SinkStream>> {
        let mut out = Vec::new();
        for p in &self.inner.projections {
            let key = projection_consumer(p.name())?;
            let mut states = self.inner.journal.sink_streams(&key, status, limit).await?;
            states.retain(|s| s.status != SinkStatus::Ok);
            out.append(&mut states);
        }
        Ok(out)
    }

    /// Makes projection `projection`'s failed or dead exception on `stream`
    /// due now with a fresh attempt count: the next worker pass retries it
    /// from the projection's checkpoint. `NotFound` when it has none,
    /// `InvalidState` when it is not failing there.
    pub async fn requeue_projection(
        &self,
        projection: &ProjectionName,
        stream: &StreamId,
    ) -> Result<SinkStream> {
        let key = projection_consumer(projection)?;
        let state = self.inner.journal.requeue_sink(&key, stream).await?;
        tracing::info!(projection = %projection, stream = %stream, "projection requeued on the stream");
        Ok(state)
    }
}

/// One projection's exception on one stream, as an operator sees it
/// (ADR 0032): the projection left the shared path there, and its own
/// catch-up retries it from its checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProjectionException {
    /// The projection.
    pub projection: String,
    /// The stream.
    pub stream: StreamId,
    /// The event it waits on: the one after its position when it left the
    /// shared path (the event that failed, for a failure).
    pub seq: u64,
    /// `failed` (retried at `next_attempt_at`; with no error and no
    /// attempt, a projection found behind) or `dead` (until requeued).
    pub status: SinkStatus,
    /// Consecutive failures on `seq`.
    pub attempt_count: u32,
    /// When it is retried.
    pub next_attempt_at: Timestamp,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// When the state last changed.
    pub updated_at: Timestamp,
}

impl ProjectionException {
    /// The exception a projection's consumer state holds; `None` for a
    /// sink's state or a projection back on the shared path.
    pub fn of(state: SinkStream) -> Option<Self> {
        if state.status == SinkStatus::Ok {
            return None;
        }
        let projection = outbox_core::consumer_projection(&state.sink)?.to_owned();
        Some(ProjectionException {
            projection,
            stream: state.stream,
            seq: state.seq + 1,
            status: state.status,
            attempt_count: state.attempt_count,
            next_attempt_at: state.next_attempt_at,
            last_error: state.last_error,
            updated_at: state.updated_at,
        })
    }
}

/// How many (projection, stream) exceptions there are, by status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ExceptionCounts {
    /// Retried with backoff (or behind, due now).
    pub failed: u64,
    /// Dead-lettered until requeued.
    pub dead: u64,
}

/// Every projection's exceptions in `journal` (of every projection with
/// stored state, registered in this binary or not): the counts, and up to
/// `limit` of them of `status` (every non-`ok` one when `None`), in
/// (projection, stream) order.
pub async fn projection_exceptions<J: outbox_core::SinkStore>(
    journal: &J,
    status: Option<SinkStatus>,
    limit: usize,
) -> Result<(ExceptionCounts, Vec<ProjectionException>)> {
    let summaries = journal.sinks().await?;
    projection_exceptions_of(journal, &summaries, status, limit).await
}

/// [`projection_exceptions`] from the consumer summaries already read with
/// [`SinkStore::sinks`] (a page that shows
/// the sinks too reads them once).
pub async fn projection_exceptions_of<J: outbox_core::SinkStore>(
    journal: &J,
    summaries: &[outbox_core::SinkSummary],
    status: Option<SinkStatus>,
    limit: usize,
) -> Result<(ExceptionCounts, Vec<ProjectionException>)> {
    let mut counts = ExceptionCounts::default();
    let mut out = Vec::new();
    let mut keys: Vec<_> = summaries
        .iter()
        .filter(|s| outbox_core::consumer_projection(&s.sink).is_some())
        .collect();
    keys.sort_by(|a, b| a.sink.cmp(&b.sink));
    for s in keys {
        counts.failed += s.failed;
        counts.dead += s.dead;
        if out.len() >= limit || s.failed + s.dead == 0 || status == Some(SinkStatus::Ok) {
            continue;
        }
        let wanted = match status {
            Some(SinkStatus::Dead) if s.dead == 0 => continue,
            Some(SinkStatus::Failed) if s.failed == 0 => continue,
            _ => status,
        };
        for state in journal
            .sink_streams(&s.sink, wanted, outbox_core::MAX_PAGE)
            .await?
        {
            if out.len() >= limit {
                break;
            }
            out.extend(ProjectionException::of(state));
        }
    }
    Ok((counts, out))
}

/// The exceptions waiting on `stream`/`seq` (of `projection` only, when
/// given), in projection order: reads only.
pub async fn projections_waiting_at<J: outbox_core::SinkStore>(
    journal: &J,
    stream: &StreamId,
    seq: Seq,
    projection: Option<&ProjectionName>,
) -> Result<Vec<ProjectionException>> {
    let mut out = Vec::new();
    for key in projection_keys(journal, projection).await? {
        let state = journal
            .sink_states(&key, std::slice::from_ref(stream))
            .await?
            .remove(0);
        if state.seq + 1 == seq.get() {
            out.extend(ProjectionException::of(state));
        }
    }
    Ok(out)
}

/// The keys of every projection with stored state (only `projection`'s, when given), sorted.
async fn projection_keys<J: outbox_core::SinkStore>(
    journal: &J,
    projection: Option<&ProjectionName>,
) -> Result<Vec<SinkName>> {
    let mut keys: Vec<SinkName> = journal
        .sinks()
        .await?
        .into_iter()
        .map(|s| s.sink)
        .filter(|k| outbox_core::consumer_projection(k).is_some())
        .collect();
    if let Some(p) = projection {
        let key = projection_consumer(p)?;
        keys.retain(|k| *k == key);
    }
    keys.sort();
    Ok(keys)
}

/// Requeues the exceptions of status `status` (dead for a requeue, failed
/// for a retry) waiting on `stream`/`seq` (of `projection` only, when
/// given): each becomes due now with a fresh attempt count. Returns them as
/// requeued (none when nothing of that status waits there).
pub async fn requeue_projections_at<J: outbox_core::SinkStore>(
    journal: &J,
    stream: &StreamId,
    seq: Seq,
    projection: Option<&ProjectionName>,
    status: SinkStatus,
) -> Result<Vec<ProjectionException>> {
    let mut out = Vec::new();
    for key in projection_keys(journal, projection).await? {
        let state = journal
            .sink_states(&key, std::slice::from_ref(stream))
            .await?
            .remove(0);
        let waiting = state.seq + 1 == seq.get() && state.status == status;
        if waiting {
            let requeued = journal.requeue_sink(&key, stream).await?;
            tracing::info!(consumer = %key, stream = %stream, seq = %seq, "projection requeued on the stream");
            out.extend(ProjectionException::of(requeued));
        }
    }
    Ok(out)
}

/// Requeues up to `limit` dead projection exceptions in (projection,
/// stream) order: each becomes due now with a fresh attempt count.
pub async fn requeue_dead_projections<J: outbox_core::SinkStore>(
    journal: &J,
    limit: usize,
) -> Result<Vec<ProjectionException>> {
    let (_, dead) = projection_exceptions(journal, Some(SinkStatus::Dead), limit).await?;
    let mut out = Vec::with_capacity(dead.len());
    for d in dead {
        let key = projection_consumer(&ProjectionName::new(d.projection.as_str())?)?;
        let requeued = journal.requeue_sink(&key, &d.stream).await?;
        tracing::info!(consumer = %key, stream = %d.stream, "dead projection requeued on the stream");
        out.extend(ProjectionException::of(requeued));
    }
    Ok(out)
}

/// One registered consumer as an operator sees it: the registry's record
/// and whether a live worker runs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConsumerStatus {
    /// The registry's record.
    #[serde(flatten)]
    pub info: outbox_core::ConsumerInfo,
    /// The projection's name, for a projection.
    pub projection: Option<String>,
    /// Whether the worker that last registered it is a live registered
    /// worker. `false`: no running worker has registered it since that one
    /// stopped (a `work --once` registers without staying live).
    pub live: bool,
}

/// Every registered consumer with whether a live worker runs it.
pub async fn consumer_statuses<J: outbox_core::ConsumerRegistry + outbox_core::WorkerRegistry>(
    journal: &J,
) -> Result<Vec<ConsumerStatus>> {
    let workers = journal.workers().await?;
    consumer_statuses_with(journal, &workers).await
}

/// [`consumer_statuses`] with the live workers already read (a page that
/// lists them too reads them once).
pub async fn consumer_statuses_with<J: outbox_core::ConsumerRegistry>(
    journal: &J,
    workers: &[outbox_core::WorkerInfo],
) -> Result<Vec<ConsumerStatus>> {
    let live: std::collections::BTreeSet<_> = workers.iter().map(|w| &w.id).collect();
    Ok(journal
        .consumers()
        .await?
        .into_iter()
        .map(|info| ConsumerStatus {
            projection: info.projection().map(str::to_owned),
            live: live.contains(&info.last_worker),
            info,
        })
        .collect())
}

/// Pauses (or resumes) consumer `key` in the registry: see
/// [`Outbox::pause_projection`]. On resume, its states that failed (and
/// are not dead) are due at once, attempts reset (the first 10,000 per
/// call). Returns whether the flag changed; `NotFound` when no worker has
/// registered it.
pub async fn pause_consumer<J: outbox_core::ConsumerRegistry + outbox_core::SinkStore>(
    journal: &J,
    key: &SinkName,
    paused: bool,
) -> Result<bool> {
    let changed = journal.set_paused(key, paused).await?;
    tracing::info!(consumer = %key, paused, changed, "consumer {}", if paused { "paused" } else { "resumed" });
    if !paused {
        let failed = journal
            .sink_streams(key, Some(SinkStatus::Failed), outbox_core::MAX_PAGE)
            .await?;
        for s in failed.iter().filter(|s| s.attempt_count > 0) {
            journal.requeue_sink(key, &s.stream).await?;
        }
    }
    Ok(changed)
}
