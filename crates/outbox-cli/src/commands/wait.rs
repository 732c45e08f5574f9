//! `outbox wait`: read-your-writes from the command line (ADR 0032).

use std::time::Duration;

use anyhow::Result;
use outbox_core::{ProjectionName, Seq, StreamId};
use outbox_runtime::wait::AppendToken;

use super::ctx::Ctx;
use crate::backend::{CliJournal, CliStore};
use crate::cli::WaitArgs;
use crate::output::json;

pub(super) async fn wait<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &WaitArgs) -> Result<()> {
    let token = AppendToken::at(StreamId::new(&a.stream)?, Seq::new(a.seq)?);
    let names = a
        .projections
        .iter()
        .map(|p| ProjectionName::new(p.as_str()))
        .collect::<Result<Vec<_>, _>>()?;
    let rt = ctx.runtime().await?;
    let only = (!names.is_empty()).then_some(names.as_slice());
    rt.wait_for(&token, only, Duration::from_millis(a.timeout_ms))
        .await?;
    if a.json {
        return json(&serde_json::json!({ "stream": a.stream, "seq": a.seq, "applied": true }));
    }
    outln!(
        "{}/{} is applied by {}",
        crate::output::visible(&a.stream),
        a.seq,
        if names.is_empty() {
            "every projection".to_owned()
        } else {
            names
                .iter()
                .map(ProjectionName::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        }
    )?;
    Ok(())
}
