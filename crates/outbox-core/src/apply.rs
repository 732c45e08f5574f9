//! The exactly-once apply loop, written once for every adapter.

use std::sync::Arc;

use crate::spi::{plan_apply, projection_names, validate_projection_names, validate_run};
use crate::tx::{ApplyTx, CheckpointMove, StreamAdvance};
use crate::{
    ApplyOutcome, ApplyReport, BoxError, Error, Event, FailedEvent, Intent, Projection, Result, StreamId,
};

/// The message of a transaction ended by user code (an applier or a
/// projection's reset): a permanent [`Error::Storage`]. `detail` is the
/// store's reason, if it has one.
pub fn ended_by_projection(projections: &str, stream: Option<&StreamId>, detail: &str) -> Error {
    let on = stream.map(|s| format!(" on stream {s}")).unwrap_or_default();
    let detail = if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    };
    Error::Storage {
        message: format!(
            "the transaction of projection(s) {projections}{on} was ended by the projection (it committed \
             or rolled back the store's transaction, or swallowed an error after which the database \
             rolled it back); no checkpoint was moved{detail}"
        ),
        temporary: false,
        source: None,
    }
}

/// What an applier's error means. A temporary storage error passed on from
/// the store (a `ViewTx` call that met a deadlock, a lost connection, a
/// timeout) is the store's trouble, not the event's: it is returned as it
/// is, so the worker retries without counting an attempt against the row.
/// Anything else is the projection failing on this event: [`Error::Apply`].
fn applier_error(projection: &str, event: &Event, source: BoxError) -> Error {
    match source.downcast::<Error>() {
        Ok(e) if matches!(*e, Error::Storage { temporary: true, .. }) => *e,
        Ok(e) => Error::Apply {
            projection: projection.to_owned(),
            stream: event.stream.clone(),
            seq: event.seq,
            source: e,
        },
        Err(source) => Error::Apply {
            projection: projection.to_owned(),
            stream: event.stream.clone(),
            seq: event.seq,
            source,
        },
    }
}

/// What a projection's failed [`apply_run`](Projection::apply_run) over
/// `run` means: [`applier_error`] on the event it names. An index past the
/// run is the projection's bug, blamed on the run's first event so the
/// retry policy still ends it.
fn run_error(projection: &str, run: &[&Event], failed: FailedEvent) -> Error {
    match run.get(failed.index) {
        Some(event) => applier_error(projection, event, failed.source),
        None => applier_error(
            projection,
            run[0],
            format!(
                "apply_run named event {} of a run of {}: {}",
                failed.index,
                run.len(),
                failed.source
            )
            .into(),
        ),
    }
}

/// Applies the contiguous run `events` of `stream` to `projections` inside
/// the store's open transaction `tx`, exactly once: the body of every
/// adapter's [`ProjectionStore::apply`](crate::ProjectionStore::apply).
/// The caller begins the transaction and commits it when this returns
/// [`ApplyOutcome::Applied`] (and drops it otherwise).
///
/// 1. Reads (and locks, where applies run concurrently) each projection's
///    checkpoint, and plans with [`plan_apply`]: a gap returns
///    [`ApplyOutcome::Gap`] before anything is written.
/// 2. Hands each projection its new [`Intent::Apply`] events, in seq
///    order, as one run ([`Projection::apply_run`]); audit-only events only
///    advance checkpoints. An applier error is [`Error::Apply`] naming the
///    event.
/// 3. Checks that user code left the transaction open (else a permanent
///    storage error: no checkpoint may commit without its writes); skipped
///    when every projection only writes documents
///    ([`Projection::documents_only`](crate::Projection::documents_only)).
/// 4. Advances every moved checkpoint by compare-and-set against the value
///    read, and raises the watermark to the run's last seq. A miss means the
///    database changed behind the lock: a temporary error, nothing committed.
pub async fn apply_in<Tx: ApplyTx + 'static>(
    tx: &mut Tx,
    stream: &StreamId,
    events: &[Event],
    projections: &[Arc<dyn Projection<Tx>>],
) -> Result<ApplyOutcome> {
    validate_run(stream, events)?;
    let mut outcomes = apply_all(tx, &[events], projections).await?;
    outcomes
        .pop()
        .ok_or_else(|| Error::invalid("apply: the run is empty"))
}

/// Applies several runs inside the store's open transaction `tx`: the body
/// of every adapter's [`ProjectionStore::apply_runs`](crate::ProjectionStore::apply_runs).
/// The steps of [`apply_in`] over every run at once: the checkpoints of
/// every stream read first ([`ApplyTx::checkpoints_of`]), each run planned
/// right before its appliers run (a gap stops the call: the outcomes end
/// with it), one guard around all the appliers, and every checkpoint and
/// watermark advanced at the end ([`ApplyTx::advance_all`]). The caller
/// commits only when every run came back [`ApplyOutcome::Applied`] (see
/// [`all_applied`]) and drops the transaction otherwise.
pub async fn apply_runs_in<Tx: ApplyTx + 'static>(
    tx: &mut Tx,
    runs: &[&[Event]],
    projections: &[Arc<dyn Projection<Tx>>],
) -> Result<Vec<ApplyOutcome>> {
    let mut streams = std::collections::HashSet::with_capacity(runs.len());
    for run in runs {
        let Some(first) = run.first() else {
            return Err(Error::invalid("apply_runs: a run is empty"));
        };
        validate_run(&first.stream, run)?;
        if !streams.insert(&first.stream) {
            return Err(Error::invalid(format_args!(
                "apply_runs: stream {} has two runs in one call",
                first.stream
            )));
        }
    }
    apply_all(tx, runs, projections).await
}

/// Re-applies one skipped event inside the store's open transaction `tx`:
/// the body of every adapter's
/// [`SkippedEvents::reapply`](crate::SkippedEvents::reapply).
///
/// 1. Reads and locks the projection's checkpoint on the stream (in its
///    live generation), as an apply does: a reset, a swap or an apply of
///    the same (projection, stream) waits for this transaction, or this
///    one for them. A checkpoint before the event is `InvalidState`: the
///    event is still ahead of the projection, not behind it.
/// 2. Takes the skip record (`Ok(false)` when there is none: the caller
///    commits nothing).
/// 3. Runs the applier under the guard.
/// 4. Compare-and-sets the checkpoint to the value it read (it does not
///    move): the generation fence of an apply, and the write of any
///    documents the store holds back until then.
///
/// The caller commits on `Ok(true)` and drops the transaction otherwise.
pub async fn reapply_in<Tx: ApplyTx + 'static>(
    tx: &mut Tx,
    event: &Event,
    projection: &Arc<dyn Projection<Tx>>,
) -> Result<bool> {
    let name = projection.name();
    let storage = tx.generations().storage(name).clone();
    let read = tx.checkpoints(&event.stream, &[&storage]).await?;
    let Some(&checkpoint) = read.first() else {
        return Err(Error::Storage {
            message: "the store returned no checkpoint for the projection asked".into(),
            temporary: false,
            source: None,
        });
    };
    if checkpoint < event.seq.get() {
        return Err(Error::InvalidState(format!(
            "projection `{name}` has not reached {}/{} (its checkpoint is {checkpoint}): it applies the event in order",
            event.stream, event.seq
        )));
    }
    if !tx.take_skip(name, &event.stream, event.seq).await? {
        return Ok(false);
    }
    if event.intent == Intent::Apply {
        let guarded = !projection.documents_only();
        if guarded {
            tx.guard().await?;
        }
        projection
            .apply(tx, event)
            .await
            .map_err(|source| applier_error(name.as_str(), event, source))?;
        if guarded && let Some(detail) = tx.check_guard().await? {
            return Err(ended_by_projection(name.as_str(), Some(&event.stream), &detail));
        }
    }
    let stay = CheckpointMove {
        projection: &storage,
        from: checkpoint,
        to: checkpoint,
    };
    if tx.advance(&event.stream, &[stay], checkpoint).await? != 1 {
        return Err(Error::Storage {
            message: format!(
                "projection `{name}`'s checkpoint on {} moved, or its live generation changed, during the \
                 re-apply; nothing was committed",
                event.stream
            ),
            temporary: true,
            source: None,
        });
    }
    Ok(true)
}

/// Whether [`apply_runs_in`]'s outcomes for `runs` runs say "commit".
pub fn all_applied(outcomes: &[ApplyOutcome], runs: usize) -> bool {
    outcomes.len() == runs && outcomes.iter().all(|o| matches!(o, ApplyOutcome::Applied(_)))
}

/// The apply loop over validated, non-empty runs of distinct streams.
async fn apply_all<Tx: ApplyTx + 'static>(
    tx: &mut Tx,
    runs: &[&[Event]],
    projections: &[Arc<dyn Projection<Tx>>],
) -> Result<Vec<ApplyOutcome>> {
    validate_projection_names(projections)?;
    // Checkpoints are kept under each projection's live generation (ADR 0021).
    let stored: Vec<_> = projections
        .iter()
        .map(|p| tx.generations().storage(p.name()).clone())
        .collect();
    let names: Vec<_> = stored.iter().collect();
    let streams: Vec<&StreamId> = runs.iter().map(|r| &r[0].stream).collect();
    let read = tx.checkpoints_of(&streams, &names).await?;
    if read.len() != runs.len() || read.iter().any(|r| r.len() != names.len()) {
        return Err(Error::Storage {
            message: "the store returned checkpoints for other streams or projections than asked".into(),
            temporary: false,
            source: None,
        });
    }
    // Projections that only write documents cannot end the transaction:
    // with only those, no guard is needed.
    let unguarded = projections.iter().all(|p| p.documents_only());
    let mut guarded = false;
    let mut outcomes = Vec::with_capacity(runs.len());
    let mut advances = Vec::with_capacity(runs.len());
    for (run, read) in runs.iter().zip(&read) {
        for (p, cp) in projections.iter().zip(read) {
            if let Err(gap) = plan_apply(p.name(), *cp, run) {
                outcomes.push(ApplyOutcome::Gap(gap));
                return Ok(outcomes);
            }
        }
        let last = run[run.len() - 1].seq.get();
        let mut current = read.clone();
        // Projection by projection: each owns its tables, so the order
        // between them inside the transaction is not observable, and one
        // that writes runs gets its new events in one call.
        for (p, cp) in projections.iter().zip(current.iter_mut()) {
            if last <= *cp {
                continue;
            }
            let new: Vec<&Event> = run
                .iter()
                .filter(|e| e.seq.get() > *cp && e.intent == Intent::Apply)
                .collect();
            if !new.is_empty() {
                if !guarded && !unguarded {
                    tx.guard().await?;
                    guarded = true;
                }
                if new.len() > 1 && p.applies_runs() {
                    p.apply_run(tx, &new)
                        .await
                        .map_err(|failed| run_error(p.name().as_str(), &new, failed))?;
                } else {
                    for e in new {
                        p.apply(tx, e)
                            .await
                            .map_err(|source| applier_error(p.name().as_str(), e, source))?;
                    }
                }
            }
            *cp = last;
        }
        let mut report = ApplyReport::default();
        for e in run.iter() {
            let new_to_some = projections.is_empty() || read.iter().any(|cp| e.seq.get() > *cp);
            report.count(e, new_to_some);
        }
        outcomes.push(ApplyOutcome::Applied(report));
        let moves: Vec<CheckpointMove<'_>> = names
            .iter()
            .zip(read.iter().zip(&current))
            .filter(|(_, (from, to))| from != to)
            .map(|(projection, (from, to))| CheckpointMove {
                projection,
                from: *from,
                to: *to,
            })
            .collect();
        advances.push(StreamAdvance {
            stream: &run[0].stream,
            moves,
            through: run[run.len() - 1].seq.get(),
        });
    }
    let single = (runs.len() == 1).then(|| &runs[0][0].stream);
    if guarded && let Some(detail) = tx.check_guard().await? {
        return Err(ended_by_projection(
            &projection_names(projections),
            single,
            &detail,
        ));
    }
    let expected: usize = advances.iter().map(|a| a.moves.len()).sum();
    let moved = tx.advance_all(&advances).await?;
    if moved != expected as u64 {
        let on = single.map(|s| format!(" on stream {s}")).unwrap_or_default();
        return Err(Error::Storage {
            message: format!(
                "a checkpoint{on} moved, or a projection's live generation changed, during the apply \
                 transaction; nothing was committed"
            ),
            temporary: true,
            source: None,
        });
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spi::{ApplyTx, CheckpointMove, ViewRow, ViewStorage};
    use crate::{
        EventType, Metadata, PayloadHash, ProjectionName, Seq, Timestamp, ViewProjection, ViewTx,
        async_trait, view_projection,
    };

    /// A transaction whose document reads fail with `error`; counts the
    /// guards opened.
    struct Failing(fn() -> Error, u32);

    #[async_trait]
    impl ViewStorage for Failing {
        fn view_applying(&mut self, _: &ProjectionName, _: &StreamId, _: Seq) {}
        async fn view_get(&mut self, _: &ProjectionName, _: &str, _: &str) -> Result<Option<String>> {
            Err((self.0)())
        }
        async fn view_put(&mut self, _: &ProjectionName, _: &str, _: &str, _: &str) -> Result<()> {
            Ok(())
        }
        async fn view_delete(&mut self, _: &ProjectionName, _: &str, _: &str) -> Result<bool> {
            Ok(false)
        }
        async fn view_scan(
            &mut self,
            _: &ProjectionName,
            _: &str,
            _: Option<&str>,
            _: usize,
        ) -> Result<Vec<(String, String)>> {
            Ok(Vec::new())
        }
        async fn view_rows(
            &mut self,
            _: &ProjectionName,
            _: Option<(&str, &str)>,
            _: usize,
        ) -> Result<Vec<ViewRow>> {
            Ok(Vec::new())
        }
        async fn view_clear(&mut self, _: &ProjectionName) -> Result<u64> {
            Ok(0)
        }
    }

    #[async_trait]
    impl ApplyTx for Failing {
        async fn checkpoints(&mut self, _: &StreamId, p: &[&ProjectionName]) -> Result<Vec<u64>> {
            Ok(vec![0; p.len()])
        }
        async fn guard(&mut self) -> Result<()> {
            self.1 += 1;
            Ok(())
        }
        async fn check_guard(&mut self) -> Result<Option<String>> {
            Ok(None)
        }
        async fn advance(&mut self, _: &StreamId, moves: &[CheckpointMove<'_>], _: u64) -> Result<u64> {
            Ok(moves.len() as u64)
        }
        async fn record_skip(&mut self, _: &ProjectionName, _: &StreamId, _: Seq, _: &str) -> Result<()> {
            Ok(())
        }
        async fn take_skip(&mut self, _: &ProjectionName, _: &StreamId, _: Seq) -> Result<bool> {
            Ok(false)
        }
    }

    /// Reads one document per event.
    struct Reader(ProjectionName);

    #[async_trait]
    impl ViewProjection for Reader {
        fn name(&self) -> &ProjectionName {
            &self.0
        }
        async fn apply(&self, view: &mut ViewTx<'_>, _: &Event) -> Result<(), BoxError> {
            let _: Option<u64> = view.get("t", "k").await?;
            Ok(())
        }
    }

    fn event() -> Event {
        Event {
            stream: StreamId::new("s").unwrap(),
            seq: Seq::new(1).unwrap(),
            global_position: 1,
            event_type: EventType::new("t").unwrap(),
            intent: crate::Intent::Apply,
            payload: vec![],
            metadata: Metadata {
                recorded_at: Timestamp::EPOCH,
                correlation_id: None,
                causation_id: None,
            },
            payload_hash: PayloadHash::of(&[]),
            decoded: Default::default(),
        }
    }

    fn run(error: fn() -> Error) -> Result<ApplyOutcome> {
        let p = view_projection::<Failing>(std::sync::Arc::new(Reader(ProjectionName::new("p").unwrap())));
        run_with(error, &[p]).0
    }

    /// Applies one event with `projections`; the outcome and the guards opened.
    fn run_with(
        error: fn() -> Error,
        projections: &[std::sync::Arc<dyn crate::Projection<Failing>>],
    ) -> (Result<ApplyOutcome>, u32) {
        let mut tx = Failing(error, 0);
        let s = StreamId::new("s").unwrap();
        let events = [event()];
        let out = block(apply_in(&mut tx, &s, &events, projections));
        (out, tx.1)
    }

    /// A tiny executor: nothing here awaits anything that is not ready.
    fn block<T>(fut: impl std::future::Future<Output = T>) -> T {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut fut = std::pin::pin!(fut);
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => panic!("the fake store never waits"),
        }
    }

    /// Writes one document per event.
    struct Writer(ProjectionName);

    #[async_trait]
    impl ViewProjection for Writer {
        fn name(&self) -> &ProjectionName {
            &self.0
        }
        async fn apply(&self, view: &mut ViewTx<'_>, _: &Event) -> Result<(), BoxError> {
            view.put("t", "k", &1u64).await?;
            Ok(())
        }
    }

    /// A hand-written projection (it could run any statement).
    struct Raw(ProjectionName);

    #[async_trait]
    impl crate::Projection<Failing> for Raw {
        fn name(&self) -> &ProjectionName {
            &self.0
        }
        async fn apply(&self, _: &mut Failing, _: &Event) -> Result<(), BoxError> {
            Ok(())
        }
        async fn reset(&self, _: &mut Failing) -> Result<(), BoxError> {
            Ok(())
        }
        async fn digest(&self, _: &mut Failing, _: &mut crate::DigestBuilder) -> Result<(), BoxError> {
            Ok(())
        }
    }

    /// Writes runs: keeps the seqs of every run it is handed, and fails
    /// the run naming index `fail_at` when set.
    struct Runs {
        name: ProjectionName,
        fail_at: Option<usize>,
        runs: std::sync::Mutex<Vec<Vec<u64>>>,
    }

    #[async_trait]
    impl crate::Projection<Failing> for Runs {
        fn name(&self) -> &ProjectionName {
            &self.name
        }
        async fn apply(&self, _: &mut Failing, _: &Event) -> Result<(), BoxError> {
            Err("apply is not called on a projection that applies runs".into())
        }
        async fn apply_run(&self, _: &mut Failing, events: &[&Event]) -> Result<(), FailedEvent> {
            self.runs
                .lock()
                .unwrap()
                .push(events.iter().map(|e| e.seq.get()).collect());
            match self.fail_at {
                Some(i) => Err(FailedEvent::at(i, "refused")),
                None => Ok(()),
            }
        }
        fn applies_runs(&self) -> bool {
            true
        }
        async fn reset(&self, _: &mut Failing) -> Result<(), BoxError> {
            Ok(())
        }
        async fn digest(&self, _: &mut Failing, _: &mut crate::DigestBuilder) -> Result<(), BoxError> {
            Ok(())
        }
    }

    /// Events 1..=n of `stream`; `audit` ones audit-only.
    fn events(stream: &str, n: u64, audit: &[u64]) -> Vec<Event> {
        (1..=n)
            .map(|seq| {
                let mut e = event();
                e.stream = StreamId::new(stream).unwrap();
                e.seq = Seq::new(seq).unwrap();
                if audit.contains(&seq) {
                    e.intent = crate::Intent::AuditOnly;
                }
                e
            })
            .collect()
    }

    fn runs_projection(fail_at: Option<usize>) -> std::sync::Arc<Runs> {
        std::sync::Arc::new(Runs {
            name: ProjectionName::new("runs").unwrap(),
            fail_at,
            runs: Default::default(),
        })
    }

    #[test]
    fn a_projection_that_applies_runs_gets_one_call_per_run_of_its_new_apply_events() {
        let p = runs_projection(None);
        let (a, b) = (events("a", 4, &[2]), events("b", 3, &[]));
        let mut tx = Failing(|| Error::invalid("unused"), 0);
        let dynamic: std::sync::Arc<dyn crate::Projection<Failing>> = p.clone();
        let out = block(apply_runs_in(&mut tx, &[&a, &b], &[dynamic])).unwrap();
        assert!(all_applied(&out, 2), "{out:?}");
        assert_eq!(*p.runs.lock().unwrap(), vec![vec![1, 3, 4], vec![1, 2, 3]]);
    }

    #[test]
    fn a_run_failure_is_the_named_events_and_an_index_past_the_run_the_first_ones() {
        let a = events("a", 4, &[2]);
        let mut tx = Failing(|| Error::invalid("unused"), 0);
        let named: std::sync::Arc<dyn crate::Projection<Failing>> = runs_projection(Some(1));
        let r = block(apply_runs_in(&mut tx, &[&a], &[named]));
        // Index 1 of the run [1, 3, 4]: seq 3.
        assert!(
            matches!(&r, Err(Error::Apply { seq, .. }) if seq.get() == 3),
            "{r:?}"
        );
        let past: std::sync::Arc<dyn crate::Projection<Failing>> = runs_projection(Some(7));
        let r = block(apply_runs_in(&mut tx, &[&a], &[past]));
        assert!(
            matches!(&r, Err(Error::Apply { seq, source, .. }) if seq.get() == 1 && source.to_string().contains("event 7 of a run of 3")),
            "{r:?}"
        );
    }

    #[test]
    fn only_hand_written_projections_need_the_guard() {
        let never = || Error::invalid("unused");
        let view = view_projection::<Failing>(std::sync::Arc::new(Writer(ProjectionName::new("v").unwrap())));
        let raw: std::sync::Arc<dyn crate::Projection<Failing>> =
            std::sync::Arc::new(Raw(ProjectionName::new("r").unwrap()));
        let (out, guards) = run_with(never, std::slice::from_ref(&view));
        assert!(matches!(out, Ok(ApplyOutcome::Applied(_))), "{out:?}");
        assert_eq!(guards, 0, "documents only: no savepoint");
        let (out, guards) = run_with(never, &[view, raw]);
        assert!(matches!(out, Ok(ApplyOutcome::Applied(_))), "{out:?}");
        assert_eq!(guards, 1, "a hand-written projection is guarded");
    }

    #[test]
    fn a_temporary_store_error_inside_an_applier_is_not_the_events_failure() {
        let r = run(|| Error::Storage {
            message: "deadlock detected".into(),
            temporary: true,
            source: None,
        });
        assert!(
            matches!(r, Err(Error::Storage { temporary: true, .. })),
            "a temporary store error passes through, so no attempt is counted: {r:?}"
        );
        let r = run(|| Error::invalid("bad key"));
        assert!(
            matches!(r, Err(Error::Apply { .. })),
            "anything else is the projection failing on the event: {r:?}"
        );
    }
}
