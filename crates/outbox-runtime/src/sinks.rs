//! Sink delivery (ADR 0023): the journal's events published to each
//! registered [`Sink`] in stream order, at least once, beside the
//! projections.
//!
//! A delivery pass of one sink first retries its failed streams that are
//! due, then reads the journal by global position from the sink's scan
//! cursors (one per partition, so a partition's new owner resumes where the
//! old one stopped) in the partitions this worker holds (all of them without
//! partition leasing). Each stream's new events go to the sink as one run,
//! in seq order; the per-(sink, stream) checkpoint then moves by
//! compare-and-set over what was acknowledged and what the sink's policy
//! passes over. A failure is recorded on the stream (backoff, dead letter at
//! the threshold) and holds back that stream only; its later events are
//! delivered by the retry, which reads the stream from its checkpoint.
//! Replays of projections never publish; [`Outbox::replay_sink`] republishes
//! on purpose.

use std::collections::BTreeMap;
use std::sync::Arc;

use outbox_core::{
    Error, Event, EventJournal, FailureOutcome, Partition, PartitionStore, ProjectionStore, Published,
    Result, Seq, Sink, SinkFeed, SinkStatus, SinkStore, StreamId,
};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use crate::outbox::{JournalBackend, Outbox, ProjectionBackend};
use crate::panic::CatchUnwind;

/// What one delivery pass (or a sink replay) did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeliveryReport {
    /// Events the sink acknowledged.
    pub published: u64,
    /// Events its policy passed over (the checkpoint moved past them).
    pub passed_over: u64,
    /// Failures recorded with a retry.
    pub failed: u64,
    /// Streams dead-lettered for the sink.
    pub dead_lettered: u64,
    /// The feed cursor the pass scanned through (0: nothing new): a global
    /// position on SQLite and memory, a transaction id on Postgres (ADR 0030).
    pub position: u64,
}

impl DeliveryReport {
    fn add(&mut self, other: &DeliveryReport) {
        self.published += other.published;
        self.passed_over += other.passed_over;
        self.failed += other.failed;
        self.dead_lettered += other.dead_lettered;
        self.position = self.position.max(other.position);
    }

    /// Whether the pass delivered or recorded anything.
    pub fn made_progress(&self) -> bool {
        self.published + self.passed_over + self.failed + self.dead_lettered > 0 || self.position > 0
    }
}

/// How one run's delivery ended.
enum DeliveryEnd {
    /// Every event delivered or passed over; the checkpoint is at the last.
    Done,
    /// A failure was recorded; the stream waits for its retry.
    Failed,
    /// Another worker moved the checkpoint first; this one stops.
    Overtaken,
}

/// Delivery to the registered sinks (ADR 0023): per sink, due retries and
/// pages of the journal from its cursors, publishing, recording failures;
/// and replays of the journal to a sink.
pub(crate) struct SinkDelivery<'a, J, P: ProjectionStore> {
    rt: &'a Outbox<J, P>,
}

impl<J: JournalBackend, P: ProjectionBackend> Outbox<J, P> {
    /// The sink delivery service of this runtime.
    pub(crate) fn delivery(&self) -> SinkDelivery<'_, J, P> {
        SinkDelivery { rt: self }
    }

    /// The registered sinks.
    pub fn sinks(&self) -> &[Arc<dyn Sink>] {
        &self.inner.sinks
    }

    /// One delivery pass of every registered sink (see the module docs).
    /// The running apply worker does this on its own; call it when you
    /// drive [`tick`](Self::tick) yourself.
    pub async fn deliver(&self) -> Result<DeliveryReport> {
        self.delivery().deliver().await
    }

    /// Publishes the journal's events from global position `from` (through
    /// `until` when given) to sink `name` again, on purpose: in global order
    /// (so in seq order per stream), by the sink's policy, with the usual
    /// message ids (a receiver that dedupes drops what it already has). The
    /// sink's checkpoints and cursors are left as they are. Stops at the
    /// first failure, naming it; run it again to go on.
    pub async fn replay_sink(
        &self,
        name: &str,
        from: u64,
        until: Option<u64>,
        cancel: &CancellationToken,
    ) -> Result<DeliveryReport> {
        self.delivery().replay_sink(name, from, until, cancel).await
    }
}

impl<J: JournalBackend, P: ProjectionBackend> SinkDelivery<'_, J, P> {
    fn sink_named(&self, name: &str) -> Result<Arc<dyn Sink>> {
        self.rt
            .inner
            .sinks
            .iter()
            .find(|s| s.name().as_str() == name)
            .cloned()
            .ok_or_else(|| {
                let known: Vec<&str> = self.rt.inner.sinks.iter().map(|s| s.name().as_str()).collect();
                Error::NotFound(format!(
                    "no sink named `{name}` is registered (registered: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ))
            })
    }

    /// The partitions this worker delivers for: those it holds under
    /// partition leasing, every partition otherwise.
    pub(crate) fn delivery_partitions(&self) -> Vec<Partition> {
        if self.rt.inner.partitions.active() {
            self.rt.inner.partitions.held()
        } else {
            Partition::all(self.rt.inner.journal.partitioning().count()).collect()
        }
    }

    /// [`Outbox::deliver`]: one delivery pass of every registered sink.
    pub(crate) async fn deliver(&self) -> Result<DeliveryReport> {
        let mut report = DeliveryReport::default();
        for sink in self.rt.inner.sinks.clone() {
            report.add(&self.deliver_to(&sink).await?);
        }
        Ok(report)
    }

    /// One delivery pass of `sink`: its due retries, then one page of the
    /// journal from its cursors.
    pub(crate) async fn deliver_to(&self, sink: &Arc<dyn Sink>) -> Result<DeliveryReport> {
        let config = self.rt.config();
        let name = sink.name();
        let parts = self.delivery_partitions();
        let mut report = DeliveryReport::default();
        // A paused sink (ADR 0032) keeps its checkpoints and cursors: its
        // backlog is delivered once it is resumed.
        self.rt.refresh_registry(false).await?;
        if parts.is_empty() || self.rt.inner.registry.sink_paused(name) {
            return Ok(report);
        }
        let due = self
            .rt
            .inner
            .journal
            .due_sink_streams(name, &parts, config.streams_per_pass)
            .await?;
        for state in due {
            self.catch_up_sink(sink, &state.stream, state.seq, None, &mut report)
                .await?;
        }
        let stored: BTreeMap<Partition, u64> = self
            .rt
            .inner
            .journal
            .sink_cursors(name)
            .await?
            .into_iter()
            .collect();
        let cursors: BTreeMap<Partition, u64> = parts
            .iter()
            .map(|p| (*p, stored.get(p).copied().unwrap_or(0)))
            .collect();
        let start = cursors.values().copied().min().unwrap_or(0);
        let page = config.sweep_rows.max(config.batch_size);
        // In the order the events became visible, not by global position:
        // an event that commits after a later position was read comes in a
        // later page (ADR 0030).
        let feed = self.rt.inner.journal.read_feed(start, page).await?;
        let last = feed.next;
        // Nothing new: the cursors stay (moving them over an empty range
        // would be a write per pass, and on Postgres each write takes a
        // transaction id that moves the horizon: a pass that never idles).
        if last <= start || feed.events.is_empty() {
            return Ok(report);
        }
        // Each stream's new events of this page, in seq order.
        let mut runs: BTreeMap<StreamId, (Partition, Vec<Event>)> = BTreeMap::new();
        for (key, e) in feed.events {
            let p = self.rt.inner.journal.partitioning().of(&e.stream);
            if cursors.get(&p).is_some_and(|c| key > *c) {
                runs.entry(e.stream.clone())
                    .or_insert_with(|| (p, Vec::new()))
                    .1
                    .push(e);
            }
        }
        let streams: Vec<StreamId> = runs.keys().cloned().collect();
        let states = self.rt.inner.journal.sink_states(name, &streams).await?;
        for (state, (stream, (partition, events))) in states.into_iter().zip(runs) {
            if state.status != SinkStatus::Ok {
                continue; // its retry catches it up
            }
            // A page is in visibility order; a stream's later event may
            // come first in it (its transaction began earlier).
            let mut new: Vec<Event> = events.into_iter().filter(|e| e.seq.get() > state.seq).collect();
            new.sort_by_key(|e| e.seq);
            let Some(first) = new.first() else { continue };
            // Delivered as read only when contiguous from the checkpoint
            // (an event of the stream may be in a later page); otherwise
            // read from the journal in seq order.
            let contiguous = new
                .iter()
                .enumerate()
                .all(|(i, e)| e.seq.get() == state.seq + 1 + i as u64);
            if first.seq.get() != state.seq + 1 || !contiguous {
                let through = new.last().map(|e| e.seq.get());
                self.catch_up_sink(sink, &stream, state.seq, through, &mut report)
                    .await?;
            } else {
                self.deliver_run(sink, &stream, partition, state.seq, &new, false, &mut report)
                    .await?;
            }
        }
        for (p, c) in cursors {
            if c < last {
                self.rt
                    .inner
                    .journal
                    .advance_sink_cursor(name, p, c, last)
                    .await?;
            }
        }
        report.position = last;
        Ok(report)
    }

    /// Delivers `stream` from after `checkpoint` (through `through`, or its
    /// end), reading it from the journal a batch at a time: a retry, or a
    /// stream found behind. It goes on to the end (the scan cursor may have
    /// passed the stream's later events already) unless a publish fails or
    /// another worker moves the checkpoint first.
    async fn catch_up_sink(
        &self,
        sink: &Arc<dyn Sink>,
        stream: &StreamId,
        mut checkpoint: u64,
        through: Option<u64>,
        report: &mut DeliveryReport,
    ) -> Result<()> {
        let config = self.rt.config();
        let partition = self.rt.inner.journal.partitioning().of(stream);
        loop {
            if through.is_some_and(|t| checkpoint >= t) {
                return Ok(());
            }
            // One event more than a batch: whether more follows this batch
            // (a batch of the largest size reads one less).
            let batch = config.batch_size.min(outbox_core::MAX_PAGE - 1);
            let mut events = self
                .rt
                .inner
                .journal
                .read_stream(stream, Seq::new(checkpoint + 1)?, batch + 1)
                .await?;
            if let Some(t) = through {
                events.retain(|e| e.seq.get() <= t);
            }
            let more = events.len() > batch;
            events.truncate(batch);
            let Some(last) = events.last().map(|e| e.seq.get()) else {
                return Ok(());
            };
            // While more follows, the stream stays due: a deliverer that
            // stops half way leaves it to the retries, never `ok` behind
            // scan cursors that have passed its events.
            match self
                .deliver_run(sink, stream, partition, checkpoint, &events, more, report)
                .await?
            {
                DeliveryEnd::Done => checkpoint = last,
                DeliveryEnd::Failed | DeliveryEnd::Overtaken => return Ok(()),
            }
        }
    }

    /// Hands `events` (the run of `stream` right after `checkpoint`) to the
    /// sink and moves the checkpoint over what was acknowledged or passed
    /// over; records a failure of the first event not acknowledged. With
    /// `more` (a catch-up with more of the stream to come), the stream
    /// stays due while its checkpoint moves.
    #[allow(clippy::too_many_arguments)]
    async fn deliver_run(
        &self,
        sink: &Arc<dyn Sink>,
        stream: &StreamId,
        partition: Partition,
        checkpoint: u64,
        events: &[Event],
        more: bool,
        report: &mut DeliveryReport,
    ) -> Result<DeliveryEnd> {
        let config = self.rt.config();
        let name = sink.name();
        let accepted: Vec<Event> = events.iter().filter(|e| sink.accepts(e)).cloned().collect();
        let outcome = if accepted.is_empty() {
            Published::all(0)
        } else {
            let span = info_span!(
                "publish",
                sink = %name,
                stream = %stream,
                otel.kind = "producer",
                messaging.system = "outbox",
                messaging.operation.type = "publish",
                messaging.destination.name = %name,
                messaging.batch.message_count = accepted.len(),
            );
            let limit = config.lease_ttl;
            // Not while the worker applies a row alone (ADR 0029).
            let _gate = self.rt.inner.alone_gate.read().await;
            match CatchUnwind::new(tokio::time::timeout(limit, sink.publish(&accepted)))
                .instrument(span)
                .await
            {
                Ok(Ok(p)) => p,
                Ok(Err(_)) => Published::failed(
                    0,
                    format!(
                        "the sink did not finish publishing {} event(s) within {limit:?}",
                        accepted.len()
                    ),
                ),
                Err(panic) => Published::failed(0, format!("the sink panicked: {panic}")),
            }
        };
        let acknowledged = outcome.acknowledged.min(accepted.len());
        // Everything before the first unacknowledged event is done: the
        // acknowledged ones and those the policy passed over.
        let failing = outcome.error.as_ref().and(accepted.get(acknowledged));
        let done_through = match failing {
            Some(f) => f.seq.get() - 1,
            None => events.last().map_or(checkpoint, |e| e.seq.get()),
        };
        let passed_over = events
            .iter()
            .filter(|e| e.seq.get() <= done_through)
            .count()
            .saturating_sub(acknowledged);
        if done_through > checkpoint {
            let moved = self
                .rt
                .inner
                .journal
                .advance_sink(name, stream, partition, checkpoint, Seq::new(done_through)?, more)
                .await?;
            if !moved {
                return Ok(DeliveryEnd::Overtaken);
            }
        }
        report.published += acknowledged as u64;
        report.passed_over += passed_over as u64;
        let (Some(failing), Some(error)) = (failing, outcome.error) else {
            return Ok(DeliveryEnd::Done);
        };
        let message = error.to_string();
        // The sink's own decision (ADR 0032): `park` dead-letters at once;
        // `skip` parks too (a skipped publish would be a lost message: the
        // dead stream is the record, a requeue publishes it); `stop` pauses
        // the sink for every stream, this failure counted as a retry.
        let decision = outbox_core::ApplyError::decision_of(&*error).unwrap_or_default();
        let policy = match decision {
            outbox_core::OnError::Park | outbox_core::OnError::Skip => {
                config.retry.with_dead_letter_after(1)?
            }
            outbox_core::OnError::Retry | outbox_core::OnError::Stop => config.retry,
        };
        if decision == outbox_core::OnError::Stop {
            match crate::consumers::pause_consumer(&self.rt.inner.journal, name, true).await {
                Ok(_) => {
                    self.rt.inner.registry.pause_sink_here(name);
                    warn!(sink = %name, stream = %stream, seq = %failing.seq, error = %message, "the sink's error stops it: paused for every stream until resumed");
                }
                Err(e) => {
                    warn!(sink = %name, error = %e, "the sink's error asks to stop it, but pausing it failed")
                }
            }
        }
        match self
            .rt
            .inner
            .journal
            .fail_sink(name, stream, partition, failing.seq, &message, &policy)
            .await?
        {
            FailureOutcome::Retry {
                attempt,
                next_attempt_at,
            } => {
                warn!(sink = %name, stream = %stream, seq = %failing.seq, attempt, %next_attempt_at, error = %message, "publishing failed; the stream is retried");
                report.failed += 1;
            }
            FailureOutcome::Dead { attempt } => {
                warn!(sink = %name, stream = %stream, seq = %failing.seq, attempt, error = %message, "publishing failed; the stream is dead-lettered for this sink until requeued");
                report.dead_lettered += 1;
            }
        }
        Ok(DeliveryEnd::Failed)
    }

    /// [`Outbox::replay_sink`]: publishes the events from global position
    /// `from` (through `until` when given) to sink `name` again.
    pub(crate) async fn replay_sink(
        &self,
        name: &str,
        from: u64,
        until: Option<u64>,
        cancel: &CancellationToken,
    ) -> Result<DeliveryReport> {
        let sink = self.sink_named(name)?;
        let config = self.rt.config();
        let mut report = DeliveryReport::default();
        let mut after = from.saturating_sub(1);
        let page = config.sweep_rows.max(config.batch_size);
        while !cancel.is_cancelled() {
            let mut events = self.rt.inner.journal.read_global(after, page).await?;
            if let Some(u) = until {
                events.retain(|e| e.global_position <= u);
            }
            let Some(last) = events.last().map(|e| e.global_position) else {
                break;
            };
            let mut runs: BTreeMap<StreamId, Vec<Event>> = BTreeMap::new();
            for e in events {
                if sink.accepts(&e) {
                    runs.entry(e.stream.clone()).or_default().push(e);
                } else {
                    report.passed_over += 1;
                }
            }
            for (stream, run) in runs {
                let _gate = self.rt.inner.alone_gate.read().await;
                // The sink's own code, not a port: bounded here, by the
                // lease TTL as a delivery pass's publish is.
                let publish = tokio::time::timeout(config.lease_ttl, sink.publish(&run));
                let published = CatchUnwind::new(publish)
                    .await
                    .map_err(|panic| Error::storage(format!("sink {name} panicked"), panic))?
                    .map_err(|elapsed| {
                        Error::temporary(
                            format_args!(
                                "the sink did not finish publishing {} event(s) within {:?}",
                                run.len(),
                                config.lease_ttl
                            ),
                            elapsed,
                        )
                    })
                    .map_err(|e| Error::storage(format!("replaying to sink {name}"), e))?;
                report.published += published.acknowledged.min(run.len()) as u64;
                if let Some(e) = published.error {
                    let at = &run[published.acknowledged.min(run.len() - 1)];
                    return Err(Error::storage(
                        format!(
                            "sink {name} failed on {stream}/{} (global position {}); {} event(s) republished \
                             before it: run the replay again with the same --from (receivers drop repeats by \
                             message id)",
                            at.seq, at.global_position, report.published
                        ),
                        e,
                    ));
                }
            }
            report.position = last;
            after = last;
            if until.is_some_and(|u| last >= u) {
                break;
            }
        }
        info!(sink = %name, from, published = report.published, position = report.position, "sink replay finished");
        Ok(report)
    }

    /// The delivery loop of `sink`: passes back to back while they make
    /// progress, then waits for an append in this process, a wake-up from
    /// another, the poll interval, or shutdown.
    pub(crate) async fn sink_loop(&self, sink: Arc<dyn Sink>, cancel: CancellationToken) {
        let inner = &self.rt.inner;
        let mut backoff = inner.config.poll_interval;
        while !cancel.is_cancelled() {
            let busy = match CatchUnwind::new(self.deliver_to(&sink)).await {
                Ok(Ok(r)) => {
                    backoff = inner.config.poll_interval;
                    r.made_progress()
                }
                Ok(Err(e)) => {
                    warn!(sink = %sink.name(), error = %e, "delivery pass failed; backing off");
                    backoff = (backoff * 2).min(std::time::Duration::from_secs(60));
                    false
                }
                Err(panic) => {
                    warn!(sink = %sink.name(), panic = %panic, "delivery pass panicked; backing off");
                    backoff = (backoff * 2).min(std::time::Duration::from_secs(60));
                    false
                }
            };
            if busy {
                tokio::task::yield_now().await;
                continue;
            }
            crate::worker::idle(inner.wake_source.as_deref(), &inner.sink_wake, backoff, &cancel).await;
        }
    }
}
