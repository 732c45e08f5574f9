//! `outbox gaps`: streams whose projections are behind the journal.

use anyhow::Result;
use outbox_core::Error;
use outbox_core::StreamLag;

use super::ctx::Ctx;
use crate::backend::{CliJournal, CliStore};
use crate::cli::GapsArgs;
use crate::output::json;

pub(super) async fn gaps<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &GapsArgs) -> Result<()> {
    let rt = ctx.runtime().await?;
    let lags: Vec<StreamLag> = rt.gaps(10_000).await?;
    if !a.repair {
        if a.json {
            return json(&lags);
        }
        if lags.is_empty() {
            outln!("no gaps: every projection has applied every stream through its journal version")?;
        }
        for l in &lags {
            let behind: Vec<String> = l.behind.iter().map(|(p, cp)| format!("{p} at {cp}")).collect();
            outln!(
                "{}: version {}, watermark {}, behind: {}",
                l.stream,
                l.version,
                l.watermark,
                behind.join(", ")
            )?;
        }
        return Ok(());
    }
    let options = outbox_runtime::ReplayOptions::new().with_complete_rows(a.complete_rows);
    let report = rt.repair_gaps_with(options).await?;
    if a.json {
        json(&report)?;
    } else {
        outln!(
            "repaired {} of {} stream(s): {} event(s) applied ({} watermark(s) were behind)",
            report.streams_repaired,
            report.streams_scanned,
            report.events_applied,
            report.watermark_behind
        )?;
        for f in &report.failures {
            outln!("  could not repair {}: {}", f.stream, f.error)?;
        }
    }
    if let Some(f) = report.failures.first() {
        return Err(Error::storage(
            format!(
                "{} stream(s) could not be repaired, first {}",
                report.failures.len(),
                f.stream
            ),
            std::io::Error::other(f.error.clone()),
        )
        .into());
    }
    Ok(())
}
