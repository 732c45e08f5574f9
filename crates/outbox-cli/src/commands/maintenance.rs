//! The commands that apply no events: `report`, `requeue`, `requeue-dead`,
//! `retry`, `workers`, `migrate` and `verify` (and `leases`, in its own module). They never build a runtime and never write to
//! the projection database.

use anyhow::Result;
use outbox_core::{Error, ProjectionName, Seq, StreamId, ViewDigestCheck, WorkerInfo};
use serde::Serialize;

use super::Ctx;
use crate::backend::{CliJournal, CliStore};
use crate::cli::{JsonArg, ReportArgs, RequeueArgs, RequeueDeadArgs, RetryArgs, RowArgs, VerifyArgs};
use crate::output::json;
use crate::report::{Report, build_report, print_report, projection_lag};

pub(super) async fn report<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &ReportArgs) -> Result<()> {
    if a.blocked {
        let limit = if a.limit == 0 { 10_000 } else { a.limit as usize };
        let r = crate::blocked::blocked_streams(&ctx.journal, limit).await?;
        if a.json {
            return json(&r);
        }
        crate::blocked::print_blocked(&r)?;
        return Ok(());
    }
    let projections = super::projections::<P>(ctx.app);
    let r = build_report(
        &ctx.journal,
        &ctx.store,
        &projections,
        a.status,
        a.limit,
        !a.no_digests,
    )
    .await?;
    let r = Report {
        lag: if projections.is_empty() || a.lag_streams == 0 {
            None
        } else {
            Some(projection_lag(&ctx.journal, &ctx.store, &projections, a.lag_streams as usize).await?)
        },
        ..r
    };
    if a.json {
        json(&r)
    } else {
        print_report(&r, a.status, ctx.app.name())?;
        Ok(())
    }
}

pub(super) async fn requeue<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &RequeueArgs) -> Result<()> {
    let stream = StreamId::new(&a.stream)?;
    let seq = Seq::new(a.seq)?;
    let row = ctx.journal.requeue(&stream, seq).await?;
    if a.json {
        json(&row)
    } else {
        outln!(
            "requeued {}/{} ({}): pending, attempts 0, due now",
            row.stream,
            row.seq,
            row.event_type
        )?;
        Ok(())
    }
}

pub(super) async fn retry<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &RetryArgs) -> Result<()> {
    let stream = StreamId::new(&a.stream)?;
    let seq = Seq::new(a.seq)?;
    let row = ctx.journal.retry(&stream, seq).await?;
    if a.json {
        json(&row)
    } else {
        outln!(
            "retrying {}/{} ({}): pending, attempts {} kept, due {}",
            row.stream,
            row.seq,
            row.event_type,
            row.attempt_count,
            row.next_attempt_at
        )?;
        Ok(())
    }
}

/// One row as the journal holds it; `NotFound` (exit 3) when there is none
/// (applied rows are deleted: look at the projections' checkpoints).
pub(super) async fn row<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &RowArgs) -> Result<()> {
    let stream = StreamId::new(&a.stream)?;
    let seq = Seq::new(a.seq)?;
    let row = ctx.journal.row(&stream, seq).await?.ok_or_else(|| {
        Error::NotFound(format!(
            "outbox row {stream}/{seq} (rows are deleted once applied, so an applied event has none)"
        ))
    })?;
    if a.json {
        return json(&row);
    }
    outln!(
        "{}/{} {} {}: attempts {}, next attempt {}, updated {}",
        row.stream,
        row.seq,
        row.event_type,
        row.status,
        row.attempt_count,
        row.next_attempt_at,
        row.updated_at
    )?;
    if row.alone {
        outln!("  applied alone: a claim that held it ended without a result (ADR 0029)")?;
    }
    if let Some(e) = &row.last_error {
        outln!("  last error: {e}")?;
    }
    Ok(())
}

pub(super) async fn requeue_dead<J: CliJournal, P: CliStore>(
    ctx: &Ctx<'_, J, P>,
    a: &RequeueDeadArgs,
) -> Result<()> {
    let rows = ctx.journal.requeue_dead(a.limit as usize).await?;
    if a.json {
        json(&rows)
    } else {
        outln!("requeued {} dead row(s)", rows.len())?;
        for r in &rows {
            outln!("  {}/{} {}", r.stream, r.seq, r.event_type)?;
        }
        Ok(())
    }
}

pub(super) async fn workers<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &JsonArg) -> Result<()> {
    let workers = ctx.journal.workers().await?;
    if a.json {
        json(&workers)
    } else {
        print_workers(&workers)?;
        Ok(())
    }
}

/// The stores were migrated when they were opened (created if missing).
pub(super) async fn migrate<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &JsonArg) -> Result<()> {
    #[derive(Serialize)]
    struct Migrated {
        journal: String,
        projection: String,
        projections: Vec<String>,
    }
    let out = Migrated {
        journal: ctx.journal.describe(),
        projection: ctx.store.describe(),
        projections: super::projections::<P>(ctx.app)
            .iter()
            .map(|p| p.name().to_string())
            .collect(),
    };
    if a.json {
        json(&out)
    } else {
        outln!("journal    {} (migrated)", out.journal)?;
        outln!("projection {} (migrated)", out.projection)?;
        if !out.projections.is_empty() {
            outln!("projections: {}", out.projections.join(", "))?;
        }
        Ok(())
    }
}

fn print_workers(workers: &[WorkerInfo]) -> anyhow::Result<()> {
    if workers.is_empty() {
        outln!("no live workers registered")?;
    }
    for w in workers {
        outln!(
            "{}  {}  host {} pid {}  started {}  last beat {}  expires {}",
            w.id,
            w.mode,
            w.host,
            w.pid,
            w.started_at,
            w.last_beat,
            w.expires_at
        )?;
    }
    Ok(())
}

/// `outbox verify`: each view projection's recorded running digest against
/// a full scan of its documents (one snapshot per projection). Prints one
/// line per projection; a difference is an error (exit 4) naming the first
/// projection that differs, after every projection was checked.
pub(super) async fn verify<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &VerifyArgs) -> Result<()> {
    // The view projections there are: this binary's, and those with a
    // running digest in the store (the stock binary registers none).
    let mut known: Vec<ProjectionName> = ctx.app.views.iter().map(|v| v.name().clone()).collect();
    known.extend(ctx.store.view_digests().await?.into_iter().map(|d| d.projection));
    known.sort();
    known.dedup();
    let mut names: Vec<ProjectionName> = Vec::new();
    if a.projections.is_empty() {
        names.clone_from(&known);
    } else {
        for p in &a.projections {
            let name = ProjectionName::new(p.as_str())?;
            if !known.contains(&name) {
                return Err(unknown_view(&name, &known).into());
            }
            names.push(name);
        }
        names.sort();
        names.dedup();
    }
    let mut checks = Vec::with_capacity(names.len());
    for p in &names {
        checks.push(ctx.store.verify_view_digest(p).await?);
    }
    if a.json {
        json(&checks)?;
    } else if checks.is_empty() {
        outln!("no view projection to verify (none in this binary, none with a running digest)")?;
    } else {
        for c in &checks {
            match c.mismatch() {
                None => outln!(
                    "{:<18} ok  {} ({} documents)",
                    c.recorded.projection.as_str(),
                    c.scanned,
                    c.scanned.documents()
                )?,
                Some(line) => outln!("{:<18} DIFFERS: {line}", c.recorded.projection.as_str())?,
            }
        }
    }
    let bad: Vec<&ViewDigestCheck> = checks.iter().filter(|c| !c.matches()).collect();
    match bad.first() {
        None => Ok(()),
        Some(first) => Err(Error::InvalidState(format!(
            "{} of {} view projection(s) differ from their running digest; first: {}",
            bad.len(),
            checks.len(),
            first.mismatch().unwrap_or_default()
        ))
        .into()),
    }
}

/// A `--projection` that names no view projection: neither this binary's
/// nor one with a running digest in the projection database.
fn unknown_view(name: &ProjectionName, known: &[ProjectionName]) -> Error {
    let known: Vec<&str> = known.iter().map(ProjectionName::as_str).collect();
    Error::NotFound(format!(
        "projection `{name}`: not registered in this binary and no running digest in the projection database (known: {})",
        if known.is_empty() {
            "none".to_owned()
        } else {
            known.join(", ")
        }
    ))
}
