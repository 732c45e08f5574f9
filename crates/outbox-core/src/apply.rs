//! The exactly-once apply loop, written once for every adapter.

use std::sync::Arc;

use crate::spi::{ApplyTx, CheckpointMove};
use crate::spi::{plan_apply, projection_names, validate_projection_names, validate_run};
use crate::{ApplyOutcome, ApplyReport, BoxError, Error, Event, Intent, Projection, Result, StreamId};

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

/// Applies the contiguous run `events` of `stream` to `projections` inside
/// the store's open transaction `tx`, exactly once: the body of every
/// adapter's [`ProjectionStore::apply`](crate::ProjectionStore::apply).
/// The caller begins the transaction and commits it when this returns
/// [`ApplyOutcome::Applied`] (and drops it otherwise).
///
/// 1. Reads (and locks, where applies run concurrently) each projection's
///    checkpoint, and plans with [`plan_apply`]: a gap returns
///    [`ApplyOutcome::Gap`] before anything is written.
/// 2. Calls the appliers for each new [`Intent::Apply`] event in seq order;
///    audit-only events only advance checkpoints. An applier error is
///    [`Error::Apply`] naming the event.
/// 3. Checks that user code left the transaction open (else a permanent
///    storage error: no checkpoint may commit without its writes).
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
    validate_projection_names(projections)?;
    let names: Vec<_> = projections.iter().map(|p| p.name()).collect();
    let read = tx.checkpoints(stream, &names).await?;
    for (p, cp) in projections.iter().zip(&read) {
        if let Err(gap) = plan_apply(p.name(), *cp, events) {
            return Ok(ApplyOutcome::Gap(gap));
        }
    }
    let mut current = read.clone();
    let mut report = ApplyReport::default();
    let mut guarded = false;
    for e in events {
        let mut new_to_some = projections.is_empty();
        for (p, cp) in projections.iter().zip(current.iter_mut()) {
            if e.seq.get() <= *cp {
                continue;
            }
            if e.intent == Intent::Apply {
                if !guarded {
                    tx.guard().await?;
                    guarded = true;
                }
                p.apply(tx, e).await.map_err(|source: BoxError| Error::Apply {
                    projection: p.name().to_string(),
                    stream: e.stream.clone(),
                    seq: e.seq,
                    source,
                })?;
            }
            *cp = e.seq.get();
            new_to_some = true;
        }
        report.count(e, new_to_some);
    }
    if guarded && let Some(detail) = tx.check_guard().await? {
        return Err(ended_by_projection(
            &projection_names(projections),
            Some(stream),
            &detail,
        ));
    }
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
    let through = events[events.len() - 1].seq.get();
    let moved = tx.advance(stream, &moves, through).await?;
    if moved != moves.len() as u64 {
        return Err(Error::Storage {
            message: format!(
                "a checkpoint on stream {stream} moved during the apply transaction; nothing was committed"
            ),
            temporary: true,
            source: None,
        });
    }
    Ok(ApplyOutcome::Applied(report))
}
