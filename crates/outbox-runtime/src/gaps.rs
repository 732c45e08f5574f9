//! Streams behind the journal: finding them (`outbox gaps`) and catching
//! them up (start-up repair, `outbox gaps --repair`).

use std::collections::BTreeMap;

use outbox_core::{
    ConsumerRegistry, EventJournal, OutboxInspector, OutboxQueue, OutboxStatus, ProjectionStore, Result, Seq,
    StreamId, StreamLag, StreamVersion, WatermarkStore, WorkerId, WorkerRegistry, projection_consumer,
};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::config::heartbeat_ttl;
use crate::metrics::Metrics;
use crate::outbox::{InlineFailure, JournalBackend, Outbox, ProjectionBackend};
use crate::replay::ReplayOptions;

/// Streams read per page from the journal and the watermarks.
const PAGE: usize = 500;

/// What repair does with a stream behind the journal.
#[derive(Clone, Copy)]
enum Repair {
    /// Hands it to the live worker of this process (start-up repair of an
    /// apply worker).
    HandOver,
    /// Applies the missing events, short of a dead or failed head;
    /// `complete_rows` then deletes the rows every projection is past.
    Apply { complete_rows: bool },
}

/// What gap repair did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RepairReport {
    /// Streams compared with the journal.
    pub streams_scanned: u64,
    /// Streams where some projection was behind the journal.
    pub streams_repaired: u64,
    /// Events newly applied.
    pub events_applied: u64,
    /// Streams behind the journal left to the worker, which catches them up
    /// under the outbox's protocol (start-up repair of an apply worker),
    /// each with a row at its last event: the one it had, or a catch-up row
    /// ([`outbox_core::OutboxQueue::enqueue_catch_up`]).
    /// A stream behind a dead head among them waits for its requeue.
    pub handed_to_worker: u64,
    /// Streams repair stopped short of a dead or failed head row, which
    /// only the worker (after its retry, or a requeue) may apply.
    pub stopped_at_head: u64,
    /// Streams whose watermark was behind the journal's version.
    pub watermark_behind: u64,
    /// The lags found (at most the first 100), before repair. Start-up
    /// repair of an apply worker leaves out the streams behind their
    /// watermark that already have a row at their last event: it hands
    /// those over without reading their checkpoints.
    pub gaps: Vec<StreamLag>,
    /// Streams that could not be repaired, with the error.
    pub failures: Vec<InlineFailure>,
    /// The repair was cancelled before it had scanned every stream (the
    /// streams it scanned are repaired; the rest are left for the worker,
    /// the next start-up repair or `outbox gaps --repair`).
    pub cancelled: bool,
    /// Start-up repair left to this live worker of the same mode, started
    /// shortly before this one and running the same projections: its own
    /// start-up repair covers the journal, so this one scanned nothing
    /// (once per fleet; see [`Outbox::start`]).
    pub left_to: Option<WorkerId>,
}

/// Gap repair (ADR 0010): finds streams whose projections are behind the
/// journal and catches them up, at start-up, on demand, or for the fleet.
pub(crate) struct Repairer<'a, J, P: ProjectionStore> {
    rt: &'a Outbox<J, P>,
}

impl<J: JournalBackend, P: ProjectionBackend> Outbox<J, P> {
    /// The repairer service of this runtime.
    pub(crate) fn repairer(&self) -> Repairer<'_, J, P> {
        Repairer { rt: self }
    }

    /// Streams whose watermark or some projection's checkpoint is behind the
    /// journal's version (at most `limit`), without changing anything.
    pub async fn gaps(&self, limit: usize) -> Result<Vec<StreamLag>> {
        self.repairer().gaps(limit).await
    }

    /// Gap repair: compares every stream's journal version with every
    /// projection's checkpoint (and reports the watermark) and applies the
    /// missing seqs in order. Safe to run at any time, alongside workers.
    /// Leaves the outbox rows alone ([`ReplayOptions::new`]).
    pub async fn repair_gaps(&self) -> Result<RepairReport> {
        self.repair_gaps_with(ReplayOptions::new()).await
    }

    /// [`repair_gaps`](Self::repair_gaps) with options: with
    /// [`ReplayOptions::with_complete_rows`] (and the outbox on), a stream's
    /// rows are deleted once every projection is at its version.
    pub async fn repair_gaps_with(&self, options: ReplayOptions) -> Result<RepairReport> {
        self.repair_gaps_until(options, &CancellationToken::new()).await
    }

    /// [`repair_gaps_with`](Self::repair_gaps_with) that stops when `cancel`
    /// is cancelled: it looks between streams and between pages, finishes
    /// the stream in progress and returns a report with
    /// [`RepairReport::cancelled`] set.
    pub async fn repair_gaps_until(
        &self,
        options: ReplayOptions,
        cancel: &CancellationToken,
    ) -> Result<RepairReport> {
        self.repairer().repair_gaps_until(options, cancel).await
    }
}

impl<J: JournalBackend, P: ProjectionBackend> Repairer<'_, J, P> {
    /// One page of streams after `after`, each with its version and
    /// watermark: a page of the journal's versions joined with the
    /// watermarks of the same range, read page by page too.
    async fn versions_page(&self, after: Option<&StreamId>) -> Result<Vec<(StreamVersion, u64)>> {
        let inner = &self.rt.inner;
        let versions = inner.journal.stream_versions(after, PAGE).await?;
        let Some(last) = versions.last() else {
            return Ok(Vec::new());
        };
        let mut watermarks = BTreeMap::new();
        let mut from = after.cloned();
        'pages: loop {
            let page = inner.store.watermarks(from.as_ref(), PAGE).await?;
            let full = page.len() == PAGE;
            for w in page {
                if w.stream > last.stream {
                    break 'pages;
                }
                from = Some(w.stream.clone());
                watermarks.insert(w.stream, w.applied_through);
            }
            if !full {
                break;
            }
        }
        Ok(versions
            .into_iter()
            .map(|v| {
                let w = watermarks.get(&v.stream).copied().unwrap_or(0);
                (v, w)
            })
            .collect())
    }

    /// The lag of one stream, reading every projection's checkpoint.
    async fn lag(&self, v: &StreamVersion, watermark: u64) -> Result<Option<StreamLag>> {
        let mut checkpoints = Vec::with_capacity(self.rt.inner.projections.len());
        for p in &self.rt.inner.projections {
            let cp = self.rt.inner.store.checkpoint(p.name(), &v.stream).await?;
            checkpoints.push((p.name().clone(), cp));
        }
        Ok(StreamLag::of(&v.stream, v.version, watermark, checkpoints))
    }

    /// [`Outbox::gaps`]: up to `limit` streams whose watermark or some
    /// projection's checkpoint is behind their version, a page at a time.
    pub(crate) async fn gaps(&self, limit: usize) -> Result<Vec<StreamLag>> {
        let mut out = Vec::new();
        let mut after: Option<StreamId> = None;
        while out.len() < limit {
            let page = self.versions_page(after.as_ref()).await?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.stream.clone());
            for (v, watermark) in &page {
                if let Some(lag) = self.lag(v, *watermark).await?
                    && out.len() < limit
                {
                    out.push(lag);
                }
            }
        }
        Ok(out)
    }

    /// [`Outbox::repair_gaps_until`]: applies what the projections miss;
    /// deletes a caught-up stream's rows when `options` and the mode ask.
    pub(crate) async fn repair_gaps_until(
        &self,
        options: ReplayOptions,
        cancel: &CancellationToken,
    ) -> Result<RepairReport> {
        let complete_rows = options.complete_rows() && self.rt.inner.mode.enqueues();
        self.repair(Repair::Apply { complete_rows }, cancel).await
    }

    /// Start-up repair ([`Outbox::start`]): completes rows when the mode
    /// makes this runtime the one that drains them (the apply worker, or
    /// inline apply that deletes its rows), since its projection store is
    /// then the live one.
    ///
    /// An apply worker's start-up repair applies nothing itself: it hands
    /// every stream behind the journal to the worker (ADR 0029), so a
    /// catch-up that kills the process is an attempt of a row, counted and
    /// dead-lettered like any other, and `start` is not held for a backlog
    /// the worker drains anyway.
    pub(crate) async fn start_up_repair(&self, cancel: &CancellationToken) -> Result<RepairReport> {
        let mode = self.rt.inner.mode;
        let how = if mode.runs_apply_worker() {
            Repair::HandOver
        } else {
            Repair::Apply {
                complete_rows: mode.inline_deletes_rows(),
            }
        };
        self.repair(how, cancel).await
    }

    /// The worker whose start-up repair covers this one's, if any: the
    /// first (by registration time on the store's clock, then by id) of the
    /// live workers of this mode that registered before this one and at
    /// most one heartbeat TTL earlier, provided every projection this
    /// runtime runs is registered with its code version (by a worker of the
    /// same code: a worker of other code may run other projections, and
    /// this one then repairs for its own). Read after this worker's first
    /// heartbeat and before it registers its consumers.
    ///
    /// Two workers started together therefore repair once: the first scans
    /// the journal, the second finds it. A worker started later than one
    /// heartbeat TTL after every other repairs for itself, as every worker
    /// did before (a projection database restored since, say).
    pub(crate) async fn fleet_repairer(&self) -> Result<Option<WorkerId>> {
        let inner = &self.rt.inner;
        let workers = inner.journal.workers().await?;
        let me = &inner.worker_id;
        let Some(mine) = workers.iter().find(|w| &w.id == me) else {
            return Ok(None);
        };
        let window =
            i64::try_from(heartbeat_ttl(inner.config.heartbeat_interval).as_millis()).unwrap_or(i64::MAX);
        let first = workers
            .iter()
            .filter(|w| w.mode == mine.mode && &w.id != me && w.expires_at > mine.last_beat)
            .filter(|w| (w.started_at, &w.id) < (mine.started_at, me))
            .filter(|w| {
                mine.started_at
                    .as_millis()
                    .saturating_sub(w.started_at.as_millis())
                    <= window
            })
            .min_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
        let Some(first) = first else {
            return Ok(None);
        };
        let consumers = inner.journal.consumers().await?;
        for p in &inner.projections {
            let key = projection_consumer(p.name())?;
            if !consumers
                .iter()
                .any(|c| c.key == key && c.version == inner.code_version)
            {
                return Ok(None);
            }
        }
        Ok(Some(first.id.clone()))
    }

    async fn repair(&self, how: Repair, cancel: &CancellationToken) -> Result<RepairReport> {
        let inner = &self.rt.inner;
        let mut report = RepairReport::default();
        let mut after: Option<StreamId> = None;
        'pages: loop {
            if cancel.is_cancelled() {
                report.cancelled = true;
                break;
            }
            let page = self.versions_page(after.as_ref()).await?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.stream.clone());
            for (v, watermark) in page {
                if cancel.is_cancelled() {
                    report.cancelled = true;
                    break 'pages;
                }
                report.streams_scanned += 1;
                let stream = &v.stream;
                // A stream behind its watermark with a row at its last event
                // (a backlog) is the worker's already: handed over without
                // reading every projection's checkpoint (one read, not one
                // per projection and one more).
                // Set when that read found no row at the last event: the
                // hand-over below then enqueues one without reading again.
                let mut no_row_at_tip = false;
                if matches!(how, Repair::HandOver) && watermark < v.version {
                    let tip = Seq::new(v.version)?;
                    let row = inner.journal.row(stream, tip).await?;
                    if row.is_some() {
                        report.watermark_behind += 1;
                        report.handed_to_worker += 1;
                        continue;
                    }
                    no_row_at_tip = true;
                }
                let lag = self.lag(&v, watermark).await?;
                if let Some(lag) = &lag {
                    if lag.watermark < lag.version {
                        report.watermark_behind += 1;
                    }
                    if report.gaps.len() < 100 {
                        report.gaps.push(lag.clone());
                    }
                }
                let lowest = lag.as_ref().map_or(v.version, StreamLag::lowest_checkpoint);
                let behind = lowest < v.version;
                let complete_rows = match how {
                    Repair::HandOver if !behind => continue,
                    Repair::HandOver => {
                        // The worker catches the stream up through a row at
                        // its last event (a gap below a row is part of that
                        // row's attempt): one is put there when missing (a
                        // read first: a backlog's streams have it, and a read
                        // costs less than a write that finds so).
                        let tip = Seq::new(v.version)?;
                        let has_row = !no_row_at_tip && inner.journal.row(stream, tip).await?.is_some();
                        if !has_row {
                            inner.journal.enqueue_catch_up(stream).await?;
                        }
                        report.handed_to_worker += 1;
                        continue;
                    }
                    Repair::Apply { complete_rows } => complete_rows,
                };
                if !behind && !complete_rows {
                    continue;
                }
                // Never at or past a dead or failed head that is still to be
                // applied: that event is the worker's to retry (or an
                // operator's to requeue). One every projection is past is a
                // stale hint, completed below with the rest.
                let mut until = v.version;
                if behind
                    && inner.mode.enqueues()
                    && let Some(head) = inner.journal.head(stream).await?
                    && matches!(head.status, OutboxStatus::Dead | OutboxStatus::Failed)
                    && head.seq.get() > lowest
                {
                    until = head.seq.get() - 1;
                    report.stopped_at_head += 1;
                }
                // Not a paused projection, nor one off the shared path on
                // this stream: its own catch-up retries it (ADR 0032).
                let projections = if lowest < until {
                    self.rt.repairable(stream).await?
                } else {
                    Vec::new()
                };
                if lowest < until && !projections.is_empty() {
                    report.streams_repaired += 1;
                    match self.rt.catch_up(stream, lowest + 1, until, &projections).await {
                        Ok(n) => report.events_applied += n,
                        Err(e) => {
                            report.failures.push(InlineFailure {
                                stream: stream.clone(),
                                error: e.to_string(),
                            });
                            continue;
                        }
                    }
                }
                // Every projection is now at `until`, or has a state that
                // brings it there: the stream's rows through it are stale hints.
                if complete_rows && let Ok(through) = Seq::new(until) {
                    // The projections another process runs keep their share.
                    self.rt.refresh_registry(false).await?;
                    self.rt.hold_unrun(stream).await?;
                    let n = inner.journal.complete(stream, through).await?;
                    Metrics::add(&inner.metrics.completed_rows, n);
                }
            }
        }
        if report.cancelled {
            info!(
                scanned = report.streams_scanned,
                repaired = report.streams_repaired,
                events = report.events_applied,
                "gap repair cancelled"
            );
        } else if report.streams_repaired > 0 || report.watermark_behind > 0 {
            info!(
                scanned = report.streams_scanned,
                repaired = report.streams_repaired,
                events = report.events_applied,
                "gap repair applied missing events"
            );
        }
        Ok(report)
    }
}
