//! The commands that apply no events: `report`, `requeue`, `requeue-dead`,
//! `retry`, `workers`, `migrate` and `verify` (and `leases`, in its own module). They never build a runtime and never write to
//! the projection database.

use anyhow::Result;
use outbox_core::{Error, ProjectionName, Seq, StreamId, ViewDigestCheck, WorkerInfo};
use serde::Serialize;

use super::ctx::Ctx;
use crate::backend::{CliJournal, CliStore};
use crate::cli::{JsonArg, ReportArgs, RequeueArgs, RequeueDeadArgs, RetryArgs, RowArgs, VerifyArgs};
use crate::output::json;
use crate::report::{Report, build_report, print_report, projection_lag};
use outbox_core::SinkStatus;
use outbox_runtime::consumers::{
    ProjectionException, projections_waiting_at, requeue_dead_projections, requeue_projections_at,
};

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
    let projections = super::ctx::projections::<P>(ctx.app);
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

/// What `requeue` and `retry` did at one stream and seq: the row (when
/// one was there) and the projections' exceptions waiting on that event.
#[derive(Serialize)]
struct Requeued {
    row: Option<outbox_core::OutboxRow>,
    projections: Vec<ProjectionException>,
}

pub(super) async fn requeue<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &RequeueArgs) -> Result<()> {
    let stream = StreamId::new(&a.stream)?;
    let seq = Seq::new(a.seq)?;
    let out = at_stream_and_seq(ctx, &stream, seq, a.projection.as_deref(), true).await?;
    if a.json {
        return json(&out);
    }
    if let Some(row) = &out.row {
        outln!(
            "requeued {}/{} ({}): pending, attempts 0, due now",
            row.stream,
            row.seq,
            row.event_type
        )?;
    }
    print_requeued_projections("requeued", &out.projections)
}

pub(super) async fn retry<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &RetryArgs) -> Result<()> {
    let stream = StreamId::new(&a.stream)?;
    let seq = Seq::new(a.seq)?;
    let out = at_stream_and_seq(ctx, &stream, seq, a.projection.as_deref(), false).await?;
    if a.json {
        return json(&out);
    }
    if let Some(row) = &out.row {
        outln!(
            "retrying {}/{} ({}): pending, attempts {} kept, due {}",
            row.stream,
            row.seq,
            row.event_type,
            row.attempt_count,
            row.next_attempt_at
        )?;
    }
    print_requeued_projections("retrying", &out.projections)
}

fn print_requeued_projections(verb: &str, projections: &[ProjectionException]) -> Result<()> {
    for e in projections {
        outln!(
            "{verb} {}/{} for projection {}: due now, attempts 0",
            e.stream,
            e.seq,
            e.projection
        )?;
    }
    Ok(())
}

/// Requeues (`dead`: `requeue`) or retries (`retry`) at `stream`/`seq`: the
/// row there, unless `projection` narrows it to that projection, and the
/// projections' exceptions waiting on that event. The row's refusal is the
/// error when neither was there.
async fn at_stream_and_seq<J: CliJournal, P: CliStore>(
    ctx: &Ctx<'_, J, P>,
    stream: &StreamId,
    seq: Seq,
    projection: Option<&str>,
    dead: bool,
) -> Result<Requeued> {
    let projection = projection.map(ProjectionName::new).transpose()?;
    let status = if dead {
        SinkStatus::Dead
    } else {
        SinkStatus::Failed
    };
    let projections = requeue_projections_at(&ctx.journal, stream, seq, projection.as_ref(), status).await?;
    if projections.is_empty() && !dead {
        // A retry of a dead exception: say what to do instead.
        let waiting = projections_waiting_at(&ctx.journal, stream, seq, projection.as_ref()).await?;
        if let Some(e) = waiting.iter().find(|e| e.status == SinkStatus::Dead) {
            return Err(Error::InvalidState(format!(
                "projection {} is dead on {stream}/{seq}: `requeue --stream {stream} --seq {seq} --projection {}` \
                 revives it",
                e.projection, e.projection
            ))
            .into());
        }
    }
    if let Some(p) = &projection {
        if projections.is_empty() {
            return Err(Error::NotFound(format!(
                "projection {p} has no {status} exception waiting on {stream}/{seq}"
            ))
            .into());
        }
        return Ok(Requeued {
            row: None,
            projections,
        });
    }
    let row = if dead {
        ctx.journal.requeue(stream, seq).await
    } else {
        ctx.journal.retry(stream, seq).await
    };
    match row {
        Ok(row) => Ok(Requeued {
            row: Some(row),
            projections,
        }),
        Err(Error::NotFound(_) | Error::InvalidState(_)) if !projections.is_empty() => Ok(Requeued {
            row: None,
            projections,
        }),
        Err(e) => Err(e.into()),
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

/// What `requeue-dead` did: dead rows, then dead projection exceptions.
#[derive(Serialize)]
struct RequeuedDead {
    rows: Vec<outbox_core::OutboxRow>,
    projections: Vec<ProjectionException>,
}

pub(super) async fn requeue_dead<J: CliJournal, P: CliStore>(
    ctx: &Ctx<'_, J, P>,
    a: &RequeueDeadArgs,
) -> Result<()> {
    let rows = ctx.journal.requeue_dead(a.limit as usize).await?;
    let projections = requeue_dead_projections(&ctx.journal, a.limit as usize).await?;
    if a.json {
        return json(&RequeuedDead { rows, projections });
    }
    outln!("requeued {} dead row(s)", rows.len())?;
    for r in &rows {
        outln!("  {}/{} {}", r.stream, r.seq, r.event_type)?;
    }
    if !projections.is_empty() {
        outln!("requeued {} dead projection exception(s)", projections.len())?;
        for e in &projections {
            outln!("  {}/{} {}", e.stream, e.seq, e.projection)?;
        }
    }
    Ok(())
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
        projections: super::ctx::projections::<P>(ctx.app)
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
