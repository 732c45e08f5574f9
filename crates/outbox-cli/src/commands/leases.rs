//! `outbox leases`: list the stream leases, or break a stuck one. Applies
//! no events and never writes to the projection database.

use anyhow::Result;
use outbox_core::{Error, LeaseEntry, StreamId};
use serde::Serialize;

use super::ctx::Ctx;
use crate::backend::{CliJournal, CliStore};
use crate::cli::LeasesArgs;
use crate::output::json;

pub(super) async fn leases<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &LeasesArgs) -> Result<()> {
    if let Some(stream) = &a.break_stream {
        return break_lease(ctx, &StreamId::new(stream)?, a).await;
    }
    let entries = match &a.stream {
        Some(s) => one(ctx, &StreamId::new(s)?).await?.into_iter().collect(),
        None => ctx.journal.leases(None, a.limit as usize).await?,
    };
    if a.json {
        return json(&entries);
    }
    if entries.is_empty() {
        outln!("no stream leases held")?;
    }
    for e in &entries {
        outln!("{}", line(e))?;
    }
    if a.stream.is_none() && entries.len() as u64 == a.limit {
        outln!("(listing stopped at --limit {})", a.limit)?;
    }
    Ok(())
}

/// One stream's held lease, marked expired or not by the store's clock.
async fn one<J: CliJournal, P: CliStore>(
    ctx: &Ctx<'_, J, P>,
    stream: &StreamId,
) -> Result<Option<LeaseEntry>> {
    let Some(lease) = ctx.journal.lease(stream).await? else {
        return Ok(None);
    };
    let as_of = ctx.journal.summary().await?.as_of;
    Ok(Some(LeaseEntry {
        expired: lease.expires_at <= as_of,
        lease,
    }))
}

fn line(e: &LeaseEntry) -> String {
    let l = &e.lease;
    format!(
        "{}  owner {}  epoch {}  expires {}{}",
        l.stream,
        l.owner,
        l.epoch,
        l.expires_at,
        if e.expired { " (expired)" } else { "" }
    )
}

/// `--break STREAM`: without `--yes`, names the lease that would be broken
/// and refuses (nothing changes); with it, frees the lease.
async fn break_lease<J: CliJournal, P: CliStore>(
    ctx: &Ctx<'_, J, P>,
    stream: &StreamId,
    a: &LeasesArgs,
) -> Result<()> {
    let no_lease = || Error::NotFound(format!("stream {stream} has no held lease"));
    if !a.yes {
        let e = one(ctx, stream).await?.ok_or_else(no_lease)?;
        return Err(Error::invalid(format_args!(
            "would break the lease of stream {stream} held by {} (epoch {}, expires {}{}); add --yes to break it",
            e.lease.owner,
            e.lease.epoch,
            e.lease.expires_at,
            if e.expired { ", expired" } else { "" }
        ))
        .into());
    }
    let lease = ctx.journal.break_lease(stream).await?.ok_or_else(no_lease)?;
    if a.json {
        #[derive(Serialize)]
        struct Broken<'a> {
            broken: &'a outbox_core::Lease,
        }
        return json(&Broken { broken: &lease });
    }
    outln!(
        "broke the lease of stream {} held by {} (epoch {}); its next holder gets epoch {}",
        lease.stream,
        lease.owner,
        lease.epoch,
        lease.epoch + 1
    )?;
    Ok(())
}
