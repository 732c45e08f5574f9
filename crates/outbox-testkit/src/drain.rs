//! A reference drain loop over the ports: the simplest correct worker.
//!
//! The runtime's apply worker is faster (batching, wake-ups, lease renewal);
//! this one exists so adapter tests can drive the full lifecycle without the
//! runtime, and so the runtime can be compared against it.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::OutboxQueueExt as _;
use outbox_core::{
    ApplyOutcome, Error, EventJournal, FailureOutcome, LeaseStore, OutboxQueue, Projection, ProjectionStore,
    Result, RetryPolicy, Seq, WorkerId,
};

/// What one [`drain`] pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainStats {
    /// Rows completed (applied, or skipped as duplicates).
    pub completed: u64,
    /// Failures recorded (retries scheduled).
    pub failed: u64,
    /// Rows dead-lettered.
    pub dead: u64,
    /// Streams whose lease was held by someone else when we tried.
    pub contended: u64,
    /// Gaps caught up from the journal.
    pub caught_up: u64,
}

/// Drains every due stream once or more until nothing is due (or `max_rounds`
/// passes were made): acquire the lease, claim up to `batch` rows, load them,
/// apply them exactly once, complete them; on an applier error record the
/// failure for the first failing row by `policy`.
#[allow(clippy::too_many_arguments)]
pub async fn drain<J, P>(
    journal: &J,
    store: &P,
    projections: &[Arc<dyn Projection<P::Tx>>],
    owner: &WorkerId,
    batch: usize,
    policy: &RetryPolicy,
    max_rounds: usize,
) -> Result<DrainStats>
where
    J: EventJournal + OutboxQueue + LeaseStore,
    P: ProjectionStore,
{
    let mut stats = DrainStats::default();
    for _ in 0..max_rounds {
        let due = journal.due_streams(64).await?;
        if due.is_empty() {
            break;
        }
        for stream in due {
            let Some(lease) = journal.acquire(&stream, owner, Duration::from_secs(30)).await? else {
                stats.contended += 1;
                continue;
            };
            let rows = match journal.claim(&lease, batch).await {
                Ok(rows) => rows,
                Err(Error::LeaseLost { .. }) => continue,
                Err(e) => return Err(e),
            };
            if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
                let events = journal.read_stream(&stream, first.seq, rows.len()).await?;
                let mut outcome = store.apply(&stream, &events, projections).await;
                if let Ok(ApplyOutcome::Gap(gap)) = &outcome {
                    // Catch up from the journal, then offer the run again.
                    let from = Seq::new(gap.checkpoint + 1)?;
                    let missing = journal
                        .read_stream(&stream, from, (first.seq.get() - from.get()) as usize)
                        .await?;
                    if !missing.is_empty() {
                        store.apply(&stream, &missing, projections).await?;
                    }
                    stats.caught_up += 1;
                    outcome = store.apply(&stream, &events, projections).await;
                }
                match outcome {
                    Ok(ApplyOutcome::Applied(_)) => {
                        stats.completed += journal.complete(&stream, last.seq).await?;
                    }
                    Ok(ApplyOutcome::Gap(gap)) => {
                        return Err(Error::InvalidState(format!(
                            "gap persists after catch-up: {gap:?}"
                        )));
                    }
                    Err(Error::Apply { seq, source, .. }) => {
                        // Commit the run before the failing event, then record the failure.
                        let before: Vec<_> = events.iter().filter(|e| e.seq < seq).cloned().collect();
                        if !before.is_empty() {
                            store.apply(&stream, &before, projections).await?;
                            stats.completed +=
                                journal.complete(&stream, before[before.len() - 1].seq).await?;
                        }
                        match journal.fail(&lease, seq, &source.to_string(), policy).await? {
                            FailureOutcome::Retry { .. } => stats.failed += 1,
                            FailureOutcome::Dead { .. } => stats.dead += 1,
                        }
                        journal.complete_and_release(&lease, None, true).await?;
                    }
                    Err(e) => return Err(e),
                }
            }
            journal.release(&lease).await?;
        }
    }
    Ok(stats)
}
