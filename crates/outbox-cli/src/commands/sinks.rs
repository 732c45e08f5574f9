//! `outbox sinks`: each sink's delivery (streams, failures, dead letters,
//! scan position), a sink's failing streams, and `requeue`. Reads and
//! writes only the journal database's sink state; publishes nothing.

use anyhow::Result;
use outbox_core::{SinkName, SinkStatus, SinkStream, SinkSummary, StreamId};
use serde::Serialize;

use super::ctx::Ctx;
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

/// The registry key `outbox consumers retire --consumer` names: `sink:NAME`
/// for a sink, a projection's name otherwise.
pub(super) fn consumer_key(consumer: &str) -> Result<SinkName, outbox_core::Error> {
    match consumer.strip_prefix("sink:") {
        Some(sink) => SinkName::new(sink),
        None => outbox_core::projection_consumer(&outbox_core::ProjectionName::new(consumer)?),
    }
}

/// `outbox consumers`: the registry, or `retire`.
pub(super) async fn consumers<J: CliJournal, P: CliStore>(
    ctx: &Ctx<'_, J, P>,
    a: &crate::cli::ConsumersArgs,
) -> Result<()> {
    if let Some(
        crate::cli::ConsumersAction::Pause { consumer } | crate::cli::ConsumersAction::Resume { consumer },
    ) = &a.action
    {
        let paused = matches!(a.action, Some(crate::cli::ConsumersAction::Pause { .. }));
        let key = consumer_key(consumer)?;
        let changed = outbox_runtime::consumers::pause_consumer(&ctx.journal, &key, paused).await?;
        if a.json {
            return json(
                &serde_json::json!({ "consumer": key.as_str(), "paused": paused, "changed": changed }),
            );
        }
        let state = if paused { "paused" } else { "resumed" };
        if changed {
            outln!("{state} consumer {key} (live workers see it within a heartbeat interval)")?;
        } else {
            outln!("consumer {key} was already {state}: nothing changed")?;
        }
        return Ok(());
    }
    if let Some(crate::cli::ConsumersAction::Retire { consumer, .. }) = &a.action {
        let key = consumer_key(consumer)?;
        let removed = ctx.journal.retire_consumer(&key).await?;
        tracing::info!(consumer = %key, removed, "consumer retired");
        if a.json {
            return json(&serde_json::json!({ "consumer": key.as_str(), "removed": removed }));
        }
        if removed {
            outln!("retired consumer {key}: its registry entry and per-stream states are removed")?;
        } else {
            outln!("consumer {key} was not registered and had no state: nothing to retire")?;
        }
        return Ok(());
    }
    let statuses = outbox_runtime::consumers::consumer_statuses(&ctx.journal).await?;
    if a.json {
        return json(&statuses);
    }
    print_consumers(&statuses)?;
    Ok(())
}

/// The registry as text, one line per consumer.
pub(crate) fn print_consumers(statuses: &[outbox_runtime::consumers::ConsumerStatus]) -> Result<()> {
    if statuses.is_empty() {
        outln!("no consumer registered yet (workers register theirs when they start)")?;
        return Ok(());
    }
    for c in statuses {
        let version = if c.info.version.is_empty() {
            String::new()
        } else {
            format!(" version {}", crate::output::visible(&c.info.version))
        };
        outln!(
            "{} {}{version}, first seen {}, last registered {} by {}{}{}",
            c.info.kind,
            crate::output::visible(c.projection.as_deref().unwrap_or(c.info.key.as_str())),
            c.info.first_seen,
            c.info.last_seen,
            crate::output::visible(c.info.last_worker.as_str()),
            if c.info.paused { " - PAUSED" } else { "" },
            if c.live { "" } else { " - NO LIVE WORKER runs it" }
        )?;
    }
    Ok(())
}
