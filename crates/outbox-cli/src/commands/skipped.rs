//! `outbox skipped`: the events projections passed over with a record, and
//! re-applying one (ADR 0032).

use anyhow::Result;
use outbox_core::{ProjectionName, Seq, StreamId};

use super::ctx::Ctx;
use crate::backend::{CliJournal, CliStore};
use crate::cli::{SkippedAction, SkippedArgs};
use crate::output::{json, visible};

pub(super) async fn skipped<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &SkippedArgs) -> Result<()> {
    if let Some(SkippedAction::Reapply {
        projection,
        stream,
        seq,
    }) = &a.action
    {
        let (name, stream_id, seq) = (
            ProjectionName::new(projection.as_str())?,
            StreamId::new(stream)?,
            Seq::new(*seq)?,
        );
        let rt = ctx.runtime().await?;
        rt.reapply(&name, &stream_id, seq).await?;
        if a.json {
            return json(&serde_json::json!({
                "projection": name.as_str(), "stream": stream_id.as_str(), "seq": seq.get(), "reapplied": true
            }));
        }
        outln!(
            "re-applied {}/{} to {}; its skip record is removed",
            visible(stream_id.as_str()),
            seq,
            visible(name.as_str())
        )?;
        return Ok(());
    }
    let only = a.projection.as_deref().map(ProjectionName::new).transpose()?;
    let limit = usize::try_from(a.limit).unwrap_or(usize::MAX);
    let list = ctx.store.skipped(only.as_ref(), limit).await?;
    if a.json {
        return json(&list);
    }
    if list.is_empty() {
        outln!("no skipped event")?;
        return Ok(());
    }
    for s in &list {
        outln!(
            "{} skipped {}/{} at {}: {}",
            visible(s.projection.as_str()),
            visible(s.stream.as_str()),
            s.seq,
            s.skipped_at,
            visible(&s.error)
        )?;
    }
    outln!(
        "re-apply one after the fix with `{} skipped reapply --projection P --stream S --seq N`",
        ctx.app.name
    )?;
    Ok(())
}
