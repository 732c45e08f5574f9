//! `outbox replay`, `outbox rebuild` and `outbox runs`.

use anyhow::Result;
use outbox_core::{Error, RunBounds, RunRecord};
use outbox_runtime::ReplayOptions;

use super::ctx::Ctx;
use crate::backend::{CliJournal, CliStore};
use crate::cli::{RebuildArgs, ReplayArgs, RunsAction, RunsArgs};
use crate::output::json;

pub(super) async fn rebuild<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &RebuildArgs) -> Result<()> {
    if a.blue_green
        && let Some(p) = &a.which.projection
    {
        return super::generations::rebuild_blue_green(ctx, p, a.json).await;
    }
    let rt = ctx.runtime().await?;
    let cancel = outbox_runtime::cancel_on_shutdown_signal();
    let options = ReplayOptions::new().with_complete_rows(a.complete_rows);
    let runs = match &a.which.projection {
        Some(p) => vec![rt.rebuild_with(p, options, &cancel).await?],
        None => rt.rebuild_all_with(options, &cancel).await?,
    };
    print_runs(&runs, a.json)?;
    fail_unless_completed(&runs)
}

pub(super) async fn replay<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &ReplayArgs) -> Result<()> {
    let rt = ctx.runtime().await?;
    let cancel = outbox_runtime::cancel_on_shutdown_signal();
    if let (Some(sink), Some(from)) = (&a.sink, a.from) {
        let report = rt.replay_sink(sink, from, a.until, &cancel).await?;
        if a.json {
            return crate::output::json(&report);
        }
        outln!(
            "republished {} event(s) to sink {sink} from global position {from} through {} ({} passed over by its policy)",
            report.published,
            report.position,
            report.passed_over
        )?;
        return Ok(());
    }
    let options = ReplayOptions::new().with_complete_rows(a.complete_rows);
    let bounds = RunBounds::new().with_since(a.since).with_until(a.until);
    bounds.validate(outbox_core::RunKind::CatchUp)?;
    let mut runs = Vec::new();
    match &a.which.projection {
        Some(p) => runs.push(rt.replay_bounded(p, bounds, options, &cancel).await?),
        None => {
            let names: Vec<String> = rt.projections().iter().map(|p| p.name().to_string()).collect();
            for p in names {
                let run = rt.replay_bounded(&p, bounds, options, &cancel).await?;
                let stop = run.state != outbox_core::RunState::Completed;
                runs.push(run);
                if stop {
                    break;
                }
            }
        }
    }
    print_runs(&runs, a.json)?;
    fail_unless_completed(&runs)
}

fn fail_unless_completed(runs: &[RunRecord]) -> Result<()> {
    match runs.iter().find(|r| r.state == outbox_core::RunState::Failed) {
        Some(r) => Err(Error::storage(
            format!(
                "run {} ({} {}) failed: {}",
                r.id,
                r.kind,
                r.projection,
                r.error_message.as_deref().unwrap_or("unknown error")
            ),
            std::io::Error::other(r.error_code.clone().unwrap_or_default()),
        )
        .into()),
        None => Ok(()),
    }
}

fn print_runs(runs: &[RunRecord], as_json: bool) -> Result<()> {
    if as_json {
        return json(&runs);
    }
    if runs.is_empty() {
        outln!("no runs")?;
    }
    for r in runs {
        let last = match (&r.last_stream, r.last_seq) {
            (Some(s), Some(q)) => format!(" last {s}/{q}"),
            _ => String::new(),
        };
        let since = r.since.map(|s| format!(" since {s}")).unwrap_or_default();
        let until = format!(
            "{since}{}{}",
            r.until.map(|u| format!(" until {u}")).unwrap_or_default(),
            r.position
                .map(|p| format!(" at position {p}"))
                .unwrap_or_default()
        );
        let err = r
            .error_message
            .as_deref()
            .map(|m| format!(" error [{}] {m}", r.error_code.as_deref().unwrap_or("")))
            .unwrap_or_default();
        let cancel = if r.cancel_requested && r.state.is_active() {
            " (cancel requested)"
        } else {
            ""
        };
        outln!(
            "run {:>4}  {:<9} {:<18} {:<9} processed {}{}{}{}{}  owner {} updated {}",
            r.id,
            r.kind,
            r.projection,
            r.state,
            r.processed,
            until,
            last,
            err,
            cancel,
            r.owner,
            r.updated_at
        )?;
    }
    Ok(())
}

pub(super) async fn runs<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &RunsArgs) -> Result<()> {
    match a.action.as_ref().unwrap_or(&RunsAction::List { limit: 20 }) {
        RunsAction::List { limit } => print_runs(&ctx.store.runs(*limit as usize).await?, a.json),
        RunsAction::Show { id } => {
            let run = ctx
                .store
                .run(*id)
                .await?
                .ok_or_else(|| Error::NotFound(format!("run {id}")))?;
            print_runs(&[run], a.json)
        }
        RunsAction::Cancel { id } => {
            let run = ctx.store.cancel_run(*id).await?;
            print_runs(&[run], a.json)
        }
    }
}
