//! `outbox report`: what the queue, the workers and the projections look
//! like, as a value an application can also print or serialize.

use std::sync::Arc;

use outbox_core::{
    Digest, DigestBuilder, DigestValue, Error, OutboxRow, OutboxStatus, Projection, ProjectionStore,
    RunRecord, WorkerInfo,
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
    pub rows: Vec<OutboxRow>,
    pub digests: Option<Digests>,
    pub workers: Vec<WorkerInfo>,
    pub active_runs: Vec<RunRecord>,
}

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
    let digests = if with_digests && !projections.is_empty() {
        Some(digests(store, projections).await?)
    } else {
        None
    };
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
        rows,
        digests,
        workers: journal.workers().await?,
        active_runs,
    })
}

/// Prints a report as text.
pub fn print_report(r: &Report, status: Option<OutboxStatus>) {
    println!("outbox report at {}", r.as_of);
    println!(
        "  rows: {} pending, {} processing, {} failed, {} dead ({} in all)",
        r.pending, r.processing, r.failed, r.dead, r.total
    );
    match &r.oldest_retry_eligible {
        Some(row) => println!(
            "  oldest retry-eligible: {}/{} {} ({}, attempts {}, due {}) - lag {}",
            row.stream,
            row.seq,
            row.event_type,
            row.status,
            row.attempt_count,
            row.next_attempt_at,
            human_ms(r.oldest_due_age_ms)
        ),
        None => println!("  oldest retry-eligible: none (lag 0)"),
    }
    if r.dead > 0 {
        println!(
            "  dead letters: {} (fix the cause, then `outbox requeue-dead --limit N`)",
            r.dead
        );
    }
    if !r.rows.is_empty() {
        let which = status.map_or("rows".to_string(), |s| format!("{s} rows"));
        println!("  {which} (first {}):", r.rows.len());
        for row in &r.rows {
            let err = row
                .last_error
                .as_deref()
                .map(|e| format!(" - {e}"))
                .unwrap_or_default();
            println!(
                "    {}/{} {} {} attempts={} next={}{}",
                row.stream, row.seq, row.event_type, row.status, row.attempt_count, row.next_attempt_at, err
            );
        }
    }
    if let Some(d) = &r.digests {
        println!("  digests:");
        for (name, hex) in &d.projections {
            println!("    {name:<18} {hex}");
        }
        println!("    {:<18} {}", "(store)", d.store);
    }
    if !r.workers.is_empty() {
        println!("  workers:");
        for w in &r.workers {
            println!(
                "    {} {} pid {} on {}, last beat {}",
                w.id, w.mode, w.pid, w.host, w.last_beat
            );
        }
    }
    for run in &r.active_runs {
        println!(
            "  active run {}: {} {} ({}, {} processed)",
            run.id, run.kind, run.projection, run.state, run.processed
        );
    }
}
