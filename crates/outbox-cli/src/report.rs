//! `outbox report`: what the queue, the workers and the projections look
//! like, as a value an application can also print or serialize.

use std::sync::Arc;

use outbox_core::{
    Digest, DigestBuilder, DigestValue, Error, OutboxRow, OutboxStatus, Projection, ProjectionStore,
    RunRecord, SinkStatus, StreamId, StreamLag, ViewDigest, WorkerInfo,
};
use outbox_runtime::consumers::{
    ConsumerStatus, ProjectionException, consumer_statuses, projection_exceptions,
};
use outbox_runtime::{Gauges, JournalBackend, ProjectionBackend};
use serde::Serialize;

use crate::output::human_ms;

/// Per-projection digests and the whole store's digest.
#[derive(Clone, Debug, Serialize)]
pub struct Digests {
    /// (projection, digest) in registration order.
    pub projections: Vec<(String, String)>,
    /// A digest over the per-projection digests.
    pub store: String,
}

/// The digest of each projection in `store`, and one over them all.
pub async fn digests<P: ProjectionStore>(
    store: &P,
    projections: &[Arc<dyn Projection<P::Tx>>],
) -> Result<Digests, Error> {
    let mut out = Vec::new();
    let mut whole = DigestBuilder::new();
    whole.table("projections");
    for p in projections {
        let d: Digest = store.digest(p.as_ref()).await?;
        let hex = d.to_string();
        whole.row(&[DigestValue::Text(p.name().as_str()), DigestValue::Text(&hex)]);
        out.push((p.name().to_string(), hex));
    }
    Ok(Digests {
        projections: out,
        store: whole.finish().to_string(),
    })
}

/// What `outbox report` shows.
#[derive(Serialize)]
#[allow(missing_docs)]
pub struct Report {
    pub as_of: String,
    pub pending: u64,
    pub processing: u64,
    pub failed: u64,
    pub dead: u64,
    pub total: u64,
    pub oldest_retry_eligible: Option<OutboxRow>,
    pub oldest_due_age_ms: u64,
    /// The workers' lag: how long the oldest work a worker may take now
    /// has waited, in ms (rows behind a failed or dead row do not count).
    pub worker_lag_ms: u64,
    pub rows: Vec<OutboxRow>,
    /// The projections that left the shared path on some stream (ADR
    /// 0032): failing there, dead-lettered there, or behind; the others
    /// applied those streams.
    pub projection_exceptions: ProjectionExceptions,
    /// The consumers the journal knows (ADR 0032), each with whether a live
    /// worker runs it.
    pub consumers: Vec<ConsumerStatus>,
    /// Events projections skipped with a record (ADR 0032), the first
    /// [`SKIPPED_LISTED`] by (projection, stream, seq).
    pub skipped: Vec<outbox_core::SkippedEvent>,
    pub digests: Option<Digests>,
    /// Every recorded running digest of a view projection (no scan; `outbox
    /// verify` recomputes them).
    pub running_digests: Vec<ViewDigest>,
    pub workers: Vec<WorkerInfo>,
    pub active_runs: Vec<RunRecord>,
    /// Checkpoint lag per projection ([`projection_lag`]); `None` when not
    /// computed ([`build_report`] leaves it out; `outbox report` fills it in
    /// when the binary has projections).
    pub lag: Option<LagReport>,
}

/// The projections' exceptions: counts, and the first ones listed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProjectionExceptions {
    /// (projection, stream)s retried with backoff, or behind.
    pub failed: u64,
    /// (projection, stream)s dead-lettered until requeued.
    pub dead: u64,
    /// The first of them, of the status asked, in (projection, stream) order.
    pub listed: Vec<ProjectionException>,
}

/// How far each projection's checkpoints are behind the journal, over the
/// first streams (in stream order) of the journal.
#[derive(Clone, Debug, Serialize)]
pub struct LagReport {
    /// Streams compared.
    pub streams_scanned: u64,
    /// Whether every stream of the journal was compared (`false` when the
    /// scan stopped at its bound: the counts are then lower bounds).
    pub complete: bool,
    /// Streams whose watermark is behind their version.
    pub watermarks_behind: u64,
    /// One entry per projection, in registration order.
    pub projections: Vec<ProjectionLag>,
}

/// One projection's checkpoint lag.
#[derive(Clone, Debug, Serialize)]
pub struct ProjectionLag {
    /// The projection.
    pub projection: String,
    /// Streams whose checkpoint is below the journal's version.
    pub streams_behind: u64,
    /// Events not yet applied, summed over those streams.
    pub events_behind: u64,
}

/// Streams per page of the lag scan.
const LAG_PAGE: usize = 1_000;

/// Compares every projection's checkpoint (and the watermark) with the
/// journal's version of each stream, over at most `max_streams` streams in
/// stream order ([`StreamLag`] per stream, the same comparison `outbox gaps`
/// makes). Reads only; costs one checkpoint read per stream and projection.
pub async fn projection_lag<J: JournalBackend, P: ProjectionBackend>(
    journal: &J,
    store: &P,
    projections: &[Arc<dyn Projection<P::Tx>>],
    max_streams: usize,
) -> Result<LagReport, Error> {
    let mut out = LagReport {
        streams_scanned: 0,
        complete: true,
        watermarks_behind: 0,
        projections: projections
            .iter()
            .map(|p| ProjectionLag {
                projection: p.name().to_string(),
                streams_behind: 0,
                events_behind: 0,
            })
            .collect(),
    };
    let mut after: Option<StreamId> = None;
    'scan: loop {
        let page = journal.stream_versions(after.as_ref(), LAG_PAGE).await?;
        let full = page.len() == LAG_PAGE;
        for v in &page {
            if out.streams_scanned as usize >= max_streams {
                out.complete = false;
                break 'scan;
            }
            out.streams_scanned += 1;
            let watermark = store.watermark(&v.stream).await?.map_or(0, |w| w.applied_through);
            let mut checkpoints = Vec::with_capacity(projections.len());
            for p in projections {
                checkpoints.push((p.name().clone(), store.checkpoint(p.name(), &v.stream).await?));
            }
            let Some(lag) = StreamLag::of(&v.stream, v.version, watermark, checkpoints) else {
                continue;
            };
            if lag.watermark < lag.version {
                out.watermarks_behind += 1;
            }
            for (name, cp) in &lag.behind {
                if let Some(p) = out.projections.iter_mut().find(|p| p.projection == name.as_str()) {
                    p.streams_behind += 1;
                    p.events_behind += lag.version - cp;
                }
            }
        }
        match page.last() {
            Some(last) if full => after = Some(last.stream.clone()),
            _ => break,
        }
    }
    Ok(out)
}

/// How many skipped events a report lists (`outbox skipped` lists more).
pub const SKIPPED_LISTED: usize = 20;

/// Reads a report from the stores. Digests are computed (reading every
/// document) only for `projections`, and only when `with_digests`; nothing
/// is written.
pub async fn build_report<J: JournalBackend, P: ProjectionBackend>(
    journal: &J,
    store: &P,
    projections: &[Arc<dyn Projection<P::Tx>>],
    status: Option<OutboxStatus>,
    limit: u64,
    with_digests: bool,
) -> Result<Report, Error> {
    let summary = journal.summary().await?;
    let g = Gauges::from_summary(&summary);
    let rows = if limit == 0 {
        Vec::new()
    } else {
        journal.list(status, limit as usize).await?
    };
    // Rows by status map onto exceptions: failed and dead alike; pending
    // and processing have none.
    let wanted = match status {
        None => Some(None),
        Some(OutboxStatus::Failed) => Some(Some(SinkStatus::Failed)),
        Some(OutboxStatus::Dead) => Some(Some(SinkStatus::Dead)),
        Some(_) => None,
    };
    let listed = match wanted {
        Some(_) if limit > 0 => limit as usize,
        _ => 0,
    };
    let (counts, exceptions) = projection_exceptions(journal, wanted.flatten(), listed).await?;
    let digests = if with_digests && !projections.is_empty() {
        Some(digests(store, projections).await?)
    } else {
        None
    };
    let running_digests = store.view_digests().await?;
    let active_runs = store
        .runs(50)
        .await?
        .into_iter()
        .filter(|r| r.state.is_active())
        .collect();
    Ok(Report {
        as_of: summary.as_of.to_string(),
        pending: summary.pending,
        processing: summary.processing,
        failed: summary.failed,
        dead: summary.dead,
        total: summary.total(),
        oldest_retry_eligible: summary.oldest_retry_eligible.clone(),
        oldest_due_age_ms: g.oldest_due_age_ms,
        worker_lag_ms: g.worker_lag_ms,
        rows,
        projection_exceptions: ProjectionExceptions {
            failed: counts.failed,
            dead: counts.dead,
            listed: exceptions,
        },
        consumers: consumer_statuses(journal).await?,
        skipped: store.skipped(None, SKIPPED_LISTED).await?,
        digests,
        running_digests,
        workers: journal.workers().await?,
        active_runs,
        lag: None,
    })
}

/// Prints a report as text; its hints name the command `bin` (the
/// application's own binary, or `outbox`).
pub fn print_report(r: &Report, status: Option<OutboxStatus>, bin: &str) -> anyhow::Result<()> {
    outln!("outbox report at {}", r.as_of)?;
    outln!(
        "  rows: {} pending, {} processing, {} failed, {} dead ({} in all)",
        r.pending,
        r.processing,
        r.failed,
        r.dead,
        r.total
    )?;
    match &r.oldest_retry_eligible {
        Some(row) => outln!(
            "  oldest retry-eligible: {}/{} {} ({}, attempts {}, due {}) - lag {}",
            row.stream,
            row.seq,
            row.event_type,
            row.status,
            row.attempt_count,
            row.next_attempt_at,
            human_ms(r.oldest_due_age_ms)
        )?,
        None => outln!("  oldest retry-eligible: none (lag 0)")?,
    }
    outln!(
        "  worker lag: {} (the oldest work a worker may take now; {} stream(s) blocked by a failed or dead row)",
        human_ms(r.worker_lag_ms),
        r.failed + r.dead
    )?;
    if r.dead > 0 {
        outln!(
            "  dead letters: {} hold their streams back (`{bin} report --blocked` lists them; fix the cause, \
             then `{bin} requeue-dead --limit N`)",
            r.dead
        )?;
    }
    if !r.rows.is_empty() {
        let which = status.map_or("rows".to_string(), |s| format!("{s} rows"));
        outln!("  {which} (first {}):", r.rows.len())?;
        for row in &r.rows {
            let err = row
                .last_error
                .as_deref()
                .map(|e| format!(" - {e}"))
                .unwrap_or_default();
            outln!(
                "    {}/{} {} {} attempts={} next={}{}",
                row.stream,
                row.seq,
                row.event_type,
                row.status,
                row.attempt_count,
                row.next_attempt_at,
                err
            )?;
        }
    }
    let x = &r.projection_exceptions;
    if x.failed + x.dead > 0 {
        outln!(
            "  projections off the shared path: {} stream(s) failing or behind, {} dead (each holds back only \
             that projection on that stream; `{bin} requeue --stream S --seq N [--projection P]` or \
             `{bin} requeue-dead --limit N` after the fix)",
            x.failed,
            x.dead
        )?;
        for e in &x.listed {
            let err = e
                .last_error
                .as_deref()
                .map(|m| format!(" - {m}"))
                .unwrap_or_default();
            outln!(
                "    {} on {}/{} {} attempts={} next={}{}",
                e.projection,
                e.stream,
                e.seq,
                e.status,
                e.attempt_count,
                e.next_attempt_at,
                err
            )?;
        }
    }
    if !r.skipped.is_empty() {
        let more = if r.skipped.len() >= SKIPPED_LISTED {
            " or more"
        } else {
            ""
        };
        outln!(
            "  skipped events: {}{more} passed over by their projection with a record (`{bin} skipped` lists \
             them, `{bin} skipped reapply` applies one after the fix)",
            r.skipped.len()
        )?;
        for s in &r.skipped {
            outln!(
                "    {} skipped {}/{} at {} - {}",
                crate::output::visible(s.projection.as_str()),
                crate::output::visible(s.stream.as_str()),
                s.seq,
                s.skipped_at,
                crate::output::visible(&s.error)
            )?;
        }
    }
    let orphans: Vec<&ConsumerStatus> = r.consumers.iter().filter(|c| !c.live).collect();
    if !r.consumers.is_empty() {
        outln!(
            "  consumers: {} registered, {} without a live worker (`{bin} consumers` lists them)",
            r.consumers.len(),
            orphans.len()
        )?;
        for c in orphans {
            outln!(
                "    {} {}: NO LIVE WORKER runs it (last registered {} by {}); it falls behind until one does, \
                 or `{bin} consumers retire` if no deployment runs it any more",
                c.info.kind,
                crate::output::visible(c.projection.as_deref().unwrap_or(c.info.key.as_str())),
                c.info.last_seen,
                crate::output::visible(c.info.last_worker.as_str())
            )?;
        }
    }
    if let Some(d) = &r.digests {
        outln!("  digests:")?;
        for (name, hex) in &d.projections {
            outln!("    {name:<18} {hex}")?;
        }
        outln!("    {:<18} {}", "(store)", d.store)?;
    }
    if !r.running_digests.is_empty() {
        outln!("  running digests (kept by every apply; `{bin} verify` recomputes them):")?;
        for d in &r.running_digests {
            let name = d.projection.as_str();
            let Some(digest) = d.digest else {
                outln!(
                    "    {name:<18} untracked: documents predate running digests (rebuild the projection)"
                )?;
                continue;
            };
            let last = d
                .last_event
                .as_ref()
                .map(|(s, q)| format!(" as of {s}/{q}"))
                .unwrap_or_default();
            let at = d.updated_at.map(|t| format!(" at {t}")).unwrap_or_default();
            outln!("    {name:<18} {digest} {} documents{last}{at}", d.documents)?;
        }
    }
    if !r.workers.is_empty() {
        outln!("  workers:")?;
        for w in &r.workers {
            outln!(
                "    {} {} pid {} on {}, last beat {}",
                w.id,
                w.mode,
                w.pid,
                w.host,
                w.last_beat
            )?;
        }
    }
    if let Some(lag) = &r.lag {
        let scope = if lag.complete {
            format!("all {} stream(s)", lag.streams_scanned)
        } else {
            format!(
                "the first {} stream(s) only (`--lag-streams` bounds the scan)",
                lag.streams_scanned
            )
        };
        outln!("  projection lag (checkpoints behind the journal, over {scope}):")?;
        for p in &lag.projections {
            if p.streams_behind == 0 {
                outln!("    {:<18} up to date", p.projection)?;
            } else if r.dead + r.failed + x.failed + x.dead > 0 {
                // Dead or failing rows hold streams back: repair would
                // stop short of them; the cause is the failure.
                outln!(
                    "    {:<18} BEHIND: {} stream(s), {} event(s) (rows that failed hold streams back: \
                     `{bin} report --blocked`; `{bin} gaps` lists the streams)",
                    p.projection,
                    p.streams_behind,
                    p.events_behind
                )?;
            } else {
                outln!(
                    "    {:<18} BEHIND: {} stream(s), {} event(s) (`{bin} gaps` lists them, `{bin} gaps --repair` catches up)",
                    p.projection,
                    p.streams_behind,
                    p.events_behind
                )?;
            }
        }
        if lag.watermarks_behind > 0 {
            outln!("    watermarks behind on {} stream(s)", lag.watermarks_behind)?;
        }
    }
    for run in &r.active_runs {
        outln!(
            "  active run {}: {} {} ({}, {} processed{})",
            run.id,
            run.kind,
            run.projection,
            run.state,
            run.processed,
            run.position
                .map(|p| format!(", at position {p}"))
                .unwrap_or_default()
        )?;
    }
    Ok(())
}
