//! Blocked streams: every stream whose head row is `failed` or `dead`, as
//! `outbox report --blocked` and the web monitor's blocked page show them.
//!
//! Read through the existing ports only ([`OutboxInspector::list`] by status,
//! [`OutboxInspector::row`] to confirm a row is its stream's head, and
//! [`EventJournal::stream_version`] for what waits behind it). How long a
//! stream has been failing comes from its head row's first failure time
//! ([`OutboxRow::first_failed_at`], kept through retries, cleared by a
//! requeue).

use outbox_core::{Error, EventJournal, OutboxInspector, OutboxRow, OutboxStatus, Seq, Timestamp};
use serde::Serialize;

use crate::output::human_ms;

/// One blocked stream.
#[derive(Clone, Debug, Serialize)]
pub struct BlockedStream {
    /// The stream.
    pub stream: String,
    /// Its head row's seq.
    pub seq: u64,
    /// The head row's event type.
    pub event_type: String,
    /// `failed` or `dead`.
    pub status: OutboxStatus,
    /// Consecutive failures of the head row.
    pub attempts: u32,
    /// When the head row last changed (its last failure), by the store's clock.
    pub last_failure_at: String,
    /// When the head row first failed, by the store's clock.
    pub first_failure_at: String,
    /// Milliseconds since the head row first failed.
    pub failing_for_ms: u64,
    /// When a failed row is tried again (`None` for a dead row: never, until requeued).
    pub next_attempt_at: Option<String>,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// Events after the head in the stream: the rows waiting behind it.
    pub waiting_behind: u64,
}

/// The blocked streams at one moment.
#[derive(Clone, Debug, Serialize)]
pub struct BlockedReport {
    /// The store's clock when the list was read.
    pub as_of: String,
    /// Dead heads first, then failed ones; each by (next attempt, stream).
    pub streams: Vec<BlockedStream>,
    /// `false` when a status had more rows than the limit (the list is then partial).
    pub complete: bool,
}

/// Reads the blocked streams: up to `limit` rows of each of `dead` and
/// `failed`, each kept when it is its stream's head. Reads only.
pub async fn blocked_streams<J>(journal: &J, limit: usize) -> Result<BlockedReport, Error>
where
    J: OutboxInspector + EventJournal,
{
    let as_of = journal.summary().await?.as_of;
    blocked_streams_at(journal, limit, as_of).await
}

/// [`blocked_streams`] with "now" given (a page that read the summary
/// already, or shows the monitor's stored figures): the failing times are
/// counted to `as_of`. Reads only.
pub async fn blocked_streams_at<J>(
    journal: &J,
    limit: usize,
    as_of: Timestamp,
) -> Result<BlockedReport, Error>
where
    J: OutboxInspector + EventJournal,
{
    let mut streams = Vec::new();
    let mut complete = true;
    for status in [OutboxStatus::Dead, OutboxStatus::Failed] {
        let rows = journal.list(Some(status), limit).await?;
        complete &= rows.len() < limit;
        for row in rows {
            if !is_head(journal, &row).await? {
                continue;
            }
            let version = journal.stream_version(&row.stream).await?;
            streams.push(blocked(&row, as_of, version));
        }
    }
    Ok(BlockedReport {
        as_of: as_of.to_string(),
        streams,
        complete,
    })
}

/// Whether no row of the stream comes before `row`.
async fn is_head<J: OutboxInspector>(journal: &J, row: &OutboxRow) -> Result<bool, Error> {
    let n = row.seq.get();
    if n <= 1 {
        return Ok(true);
    }
    Ok(journal.row(&row.stream, Seq::new(n - 1)?).await?.is_none())
}

fn blocked(row: &OutboxRow, as_of: Timestamp, version: u64) -> BlockedStream {
    // A failed or dead row always has a first failure time; its last change
    // stands in should a store not have one.
    let first = row.first_failed_at.unwrap_or(row.updated_at);
    BlockedStream {
        stream: row.stream.to_string(),
        seq: row.seq.get(),
        event_type: row.event_type.to_string(),
        status: row.status,
        attempts: row.attempt_count,
        last_failure_at: row.updated_at.to_string(),
        first_failure_at: first.to_string(),
        failing_for_ms: as_of.duration_since(first).as_millis() as u64,
        next_attempt_at: (row.status == OutboxStatus::Failed).then(|| row.next_attempt_at.to_string()),
        last_error: row.last_error.clone(),
        waiting_behind: version.saturating_sub(row.seq.get()),
    }
}

/// Prints the blocked streams as text.
pub fn print_blocked(r: &BlockedReport) -> anyhow::Result<()> {
    outln!("blocked streams at {}", r.as_of)?;
    if r.streams.is_empty() {
        outln!("  none: no stream's head row is failed or dead")?;
    }
    for b in &r.streams {
        let next = b
            .next_attempt_at
            .as_deref()
            .map_or("never (requeue it)".to_string(), str::to_string);
        outln!(
            "  {}/{} {} {}: attempts {}, failing for {} (since {}), next attempt {}, {} row(s) waiting behind",
            b.stream,
            b.seq,
            b.event_type,
            b.status,
            b.attempts,
            human_ms(b.failing_for_ms),
            b.first_failure_at,
            next,
            b.waiting_behind
        )?;
        if let Some(e) = &b.last_error {
            outln!("    last error: {e}")?;
        }
    }
    if !r.complete {
        outln!("  (listing stopped at --limit; more rows of a status exist)")?;
    }
    Ok(())
}
