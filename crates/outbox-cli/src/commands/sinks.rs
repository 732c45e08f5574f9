//! `outbox sinks`: each sink's delivery (streams, failures, dead letters,
//! scan position), a sink's failing streams, and `requeue`. Reads and
//! writes only the journal database's sink state; publishes nothing.

use anyhow::Result;
use outbox_core::{SinkName, SinkStatus, SinkStream, SinkSummary, StreamId};
use serde::Serialize;

use super::Ctx;
use crate::backend::{CliJournal, CliStore};
use crate::cli::{SinksAction, SinksArgs};
use crate::output::json;

/// What `--json` prints.
#[derive(Serialize)]
struct Report<'a> {
    sinks: &'a [SinkSummary],
    /// With `--sink`: its failing and dead-lettered streams.
    #[serde(skip_serializing_if = "Option::is_none")]
    failing: Option<&'a [SinkStream]>,
}

pub(super) async fn sinks<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &SinksArgs) -> Result<()> {
    if let Some(SinksAction::Requeue { sink, stream }) = &a.action {
        let state = ctx
            .journal
            .requeue_sink(&SinkName::new(sink.as_str())?, &StreamId::new(stream.as_str())?)
            .await?;
        if a.json {
            return json(&state);
        }
        outln!(
            "requeued stream {} for sink {}: due now from seq {} (attempts reset)",
            state.stream,
            state.sink,
            state.seq + 1
        )?;
        return Ok(());
    }
    if let Some(SinksAction::Rekey) = &a.action {
        let done = ctx.journal.rekey_feed().await?;
        if a.json {
            return json(&serde_json::json!({ "rekeyed_events": done }));
        }
        match done {
            Some(n) => outln!("re-keyed {n} event(s) and every sink's scan cursor for this server")?,
            None => outln!("nothing to re-key: this journal's feed is read by global position")?,
        }
        return Ok(());
    }
    // The projections' exceptions share the table (ADR 0032): `report`
    // shows them; this lists the sinks.
    let all: Vec<_> = ctx
        .journal
        .sinks()
        .await?
        .into_iter()
        .filter(|s| outbox_core::consumer_projection(&s.sink).is_none())
        .collect();
    let failing = match &a.sink {
        Some(name) => {
            let name = SinkName::new(name.as_str())?;
            let limit = a.limit as usize;
            let mut v = ctx
                .journal
                .sink_streams(&name, Some(SinkStatus::Dead), limit)
                .await?;
            v.extend(
                ctx.journal
                    .sink_streams(&name, Some(SinkStatus::Failed), limit)
                    .await?,
            );
            Some(v)
        }
        None => None,
    };
    if a.json {
        return json(&Report {
            sinks: &all,
            failing: failing.as_deref(),
        });
    }
    if all.is_empty() {
        outln!("no sink has delivered anything yet")?;
    }
    for s in &all {
        outln!(
            "{}  streams {}  failing {}  dead {}  scanned through {}",
            s.sink,
            s.streams,
            s.failed,
            s.dead,
            s.position
        )?;
    }
    let held = SinkSummary::held_back_of(&all);
    if held > 0 {
        outln!(
            "held back: {held}{} committed event(s) wait for an older transaction still open on the server; \
             they are delivered once it ends (see the runbook, \"Sinks\")",
            if held >= SinkSummary::HELD_BACK_CAP {
                "+"
            } else {
                ""
            }
        )?;
    }
    for f in failing.iter().flatten() {
        outln!(
            "  {} {}  at seq {}  attempts {}  next attempt {}  {}",
            f.status,
            f.stream,
            f.seq + 1,
            f.attempt_count,
            f.next_attempt_at,
            f.last_error.as_deref().unwrap_or("")
        )?;
    }
    Ok(())
}
