//! `outbox partitions`: who owns which partition, with its rows; `resize`
//! (done when the journal was opened with the new count, see
//! `commands::execute`) reports the result. Applies no events and never
//! writes to the projection database.

use anyhow::Result;
use outbox_core::{PartitionStatus, Timestamp};
use serde::Serialize;

use super::ctx::Ctx;
use crate::backend::{CliJournal, CliStore};
use crate::cli::{PartitionsAction, PartitionsArgs};
use crate::output::json;

/// What `--json` prints.
#[derive(Serialize)]
struct Report<'a> {
    /// The partition count.
    count: u16,
    /// The partitioner's name.
    partitioner: &'a str,
    /// When it was read, by the journal's clock.
    as_of: Timestamp,
    /// Partitions an owner holds now.
    held: usize,
    partitions: &'a [PartitionStatus],
}

pub(super) async fn partitions<J: CliJournal, P: CliStore>(
    ctx: &Ctx<'_, J, P>,
    a: &PartitionsArgs,
) -> Result<()> {
    let partitioning = ctx.journal.partitioning();
    let list = ctx.journal.partitions().await?;
    let as_of = ctx.journal.summary().await?.as_of;
    let report = Report {
        count: partitioning.count(),
        partitioner: partitioning.partitioner_name(),
        as_of,
        held: list.iter().filter(|p| p.held).count(),
        partitions: &list,
    };
    if a.json {
        return json(&report);
    }
    if let Some(PartitionsAction::Resize { count, .. }) = &a.resize {
        outln!(
            "the journal is divided into {count} partitions by {}",
            report.partitioner
        )?;
    }
    outln!(
        "{} partitions by {}; {} held; as of {}",
        report.count,
        report.partitioner,
        report.held,
        as_of
    )?;
    for p in &list {
        outln!("{}", line(p, as_of))?;
    }
    Ok(())
}

fn line(p: &PartitionStatus, as_of: Timestamp) -> String {
    let owner = match (&p.owner, p.held) {
        (Some(o), true) => format!("owner {o}"),
        (Some(o), false) => format!("expired (was {o})"),
        (None, _) if p.epoch > 0 => "released".to_owned(),
        (None, _) => "never leased".to_owned(),
    };
    let expiry = match p.expires_at {
        Some(at) if p.held => format!("  expires in {} ms", at.duration_since(as_of).as_millis()),
        _ => String::new(),
    };
    format!(
        "{}  {owner}  epoch {}{expiry}  streams {}  rows {}  due {}",
        p.partition, p.epoch, p.streams, p.rows, p.due_rows
    )
}
