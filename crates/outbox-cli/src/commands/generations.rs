//! `outbox generations`, `outbox shadow`, `outbox promote` and
//! `outbox rebuild --blue-green` (ADR 0021).

use anyhow::Result;
use outbox_core::{Error, GenerationInfo, ProjectionName, StoredGeneration};
use outbox_runtime::{GenerationBuild, ShadowDiff, Swap};
use serde::Serialize;

use super::ctx::Ctx;
use crate::backend::{CliJournal, CliStore};
use crate::cli::{GenerationsAction, GenerationsArgs, PromoteArgs, ShadowAction, ShadowArgs};
use crate::output::json;

/// One projection's record and what each of its generations holds.
#[derive(Serialize)]
struct Listed {
    #[serde(flatten)]
    record: Option<GenerationInfo>,
    projection: ProjectionName,
    generations: Vec<StoredGeneration>,
}

pub(super) async fn generations<J: CliJournal, P: CliStore>(
    ctx: &Ctx<'_, J, P>,
    a: &GenerationsArgs,
) -> Result<()> {
    if let Some(action) = &a.drop {
        return drop_generation(ctx, action, a.json).await;
    }
    let names: Vec<ProjectionName> = match &a.projection {
        Some(p) => {
            let name = ProjectionName::new(p.as_str())?;
            let registered = ctx
                .app
                .views
                .iter()
                .chain(&ctx.app.candidates)
                .any(|v| v.name() == &name);
            // Any name lists as an empty live g1: one with no record, no
            // checkpoint and no document is not there.
            let stored = ctx.store.stored_generations(&name).await?;
            let empty = stored.iter().all(|g| g.streams == 0 && g.digest.documents == 0);
            if !registered && empty && ctx.store.generation(&name).await?.is_none() {
                return Err(Error::NotFound(format!(
                    "projection `{name}`: not registered in this binary, and the projection database holds no generation, checkpoint or document of it"
                ))
                .into());
            }
            vec![name]
        }
        None => ctx
            .store
            .generations()
            .await?
            .into_iter()
            .map(|r| r.projection)
            .collect(),
    };
    let mut listed = Vec::with_capacity(names.len());
    for name in names {
        listed.push(Listed {
            record: ctx.store.generation(&name).await?,
            generations: ctx.store.stored_generations(&name).await?,
            projection: name,
        });
    }
    if a.json {
        return json(&listed);
    }
    if listed.is_empty() {
        outln!(
            "no projection has a second generation (`{} rebuild --blue-green` builds one)",
            ctx.app.name()
        )?;
    }
    for l in &listed {
        print_listed(l)?;
    }
    Ok(())
}

fn print_listed(l: &Listed) -> anyhow::Result<()> {
    match &l.record {
        Some(r) => {
            let building = match (r.building, r.building_version) {
                (Some(g), Some(v)) => format!(
                    ", building g{g} (version {v}) at position {}",
                    r.building_position
                ),
                _ => String::new(),
            };
            outln!(
                "{}: live g{} (version {}), epoch {}{building}, updated {}",
                l.projection,
                r.live,
                r.live_version,
                r.epoch,
                r.updated_at
            )?;
        }
        None => outln!("{}: live g1 (no generation record)", l.projection)?,
    }
    let live = l.record.as_ref().map_or(1, |r| r.live);
    let building = l.record.as_ref().and_then(|r| r.building);
    for g in &l.generations {
        let role = if g.generation == live {
            "live"
        } else if Some(g.generation) == building {
            "building"
        } else {
            "kept"
        };
        let digest = g
            .digest
            .digest
            .map_or_else(|| "untracked".to_owned(), |d| d.to_string());
        outln!(
            "  g{:<4} {:<8} {:<24} streams {:<8} events {:<10} documents {:<8} running digest {}",
            g.generation,
            role,
            g.storage,
            g.streams,
            g.events,
            g.digest.documents,
            digest
        )?;
    }
    Ok(())
}

async fn drop_generation<J: CliJournal, P: CliStore>(
    ctx: &Ctx<'_, J, P>,
    action: &GenerationsAction,
    as_json: bool,
) -> Result<()> {
    let GenerationsAction::Drop {
        projection,
        generation,
        yes,
    } = action;
    let name = ProjectionName::new(action.projection())?;
    if !yes {
        return Err(Error::invalid(format_args!(
            "dropping generation {generation} of `{projection}` deletes its documents: add --yes"
        ))
        .into());
    }
    let documents = ctx.store.drop_generation(&name, *generation).await?;
    if as_json {
        #[derive(Serialize)]
        struct Dropped<'a> {
            projection: &'a ProjectionName,
            generation: u32,
            documents: u64,
        }
        return json(&Dropped {
            projection: &name,
            generation: *generation,
            documents,
        });
    }
    outln!("dropped generation {generation} of {name}: {documents} document(s) deleted")?;
    Ok(())
}

pub(super) async fn rebuild_blue_green<J: CliJournal, P: CliStore>(
    ctx: &Ctx<'_, J, P>,
    projection: &str,
    as_json: bool,
) -> Result<()> {
    let rt = ctx.runtime().await?;
    let cancel = outbox_runtime::cancel_on_shutdown_signal();
    let swap = rt.rebuild_blue_green(projection, &cancel).await?;
    print_swap(&swap, as_json, ctx.app.name())
}

fn print_build(b: &GenerationBuild) -> anyhow::Result<()> {
    let resumed = if b.from_position > 0 {
        format!(" (resumed at position {})", b.from_position)
    } else {
        String::new()
    };
    outln!(
        "{}: generation {} ({}) built by version {} through position {}{resumed}: {} event(s) applied{}",
        b.projection,
        b.generation,
        b.storage,
        b.version,
        b.position,
        b.applied,
        if b.cancelled {
            "; stopped by a signal, run it again to resume"
        } else {
            ""
        }
    )?;
    Ok(())
}

fn print_swap(s: &Swap, as_json: bool, bin: &str) -> Result<()> {
    if as_json {
        return json(s);
    }
    print_build(&s.build)?;
    if s.build.cancelled {
        return Ok(());
    }
    outln!(
        "{}: generation {} is live (was {}), epoch {}; {} swap attempt(s), {} event(s) caught up between them; \
         generation {} is kept until `{bin} generations drop`",
        s.build.projection,
        s.to,
        s.from,
        s.epoch,
        s.rounds,
        s.caught_up,
        s.from
    )?;
    Ok(())
}

pub(super) async fn shadow<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &ShadowArgs) -> Result<()> {
    let rt = ctx.runtime().await?;
    match &a.action {
        ShadowAction::Build { projection } => {
            let cancel = outbox_runtime::cancel_on_shutdown_signal();
            let build = rt.shadow_build(projection, &cancel).await?;
            if a.json {
                return json(&build);
            }
            print_build(&build)?;
            Ok(())
        }
        ShadowAction::Diff { projection, limit } => {
            let diff = rt
                .shadow_diff(projection, usize::try_from(*limit).unwrap_or(usize::MAX))
                .await?;
            if a.json {
                json(&diff)?;
            } else {
                print_diff(&diff)?;
            }
            match diff.differing.first() {
                None => Ok(()),
                Some(first) => Err(Error::InvalidState(format!(
                    "the candidate (version {}) differs from the live code (version {}) on {}{} stream(s); first: `{}`",
                    diff.candidate_version,
                    diff.live_version,
                    diff.differing.len(),
                    if diff.truncated { " or more" } else { "" },
                    first.stream
                ))
                .into()),
            }
        }
    }
}

fn print_diff(d: &ShadowDiff) -> anyhow::Result<()> {
    outln!(
        "{}: live code version {} vs candidate version {}: {} stream(s) compared, {} differ{}",
        d.projection,
        d.live_version,
        d.candidate_version,
        d.streams,
        d.differing.len(),
        if d.truncated {
            " (stopped at the limit)"
        } else {
            ""
        }
    )?;
    for s in &d.differing {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".into());
        outln!(
            "  {}: {} event(s), {} document(s) differ; first {}/{}: live {} candidate {}{}",
            s.stream,
            s.events,
            s.documents,
            s.table,
            s.key,
            show(&s.live),
            show(&s.candidate),
            s.error.as_ref().map(|e| format!("; {e}")).unwrap_or_default()
        )?;
    }
    for g in &d.generations {
        outln!(
            "  generation {} ({}): streams {} events {} documents {} running digest {}",
            g.generation,
            g.storage,
            g.streams,
            g.events,
            g.digest.documents,
            g.digest
                .digest
                .map_or_else(|| "untracked".into(), |x| x.to_string())
        )?;
    }
    Ok(())
}

pub(super) async fn promote<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &PromoteArgs) -> Result<()> {
    let rt = ctx.runtime().await?;
    let cancel = outbox_runtime::cancel_on_shutdown_signal();
    let swap = rt.promote(&a.projection, a.force, &cancel).await?;
    print_swap(&swap, a.json, ctx.app.name())
}
