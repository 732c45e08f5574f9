//! [`SinkStore`] and [`SinkFeed`] in memory: sink checkpoints and scan cursors in the
//! journal's state (one lock, so every call is one "transaction").

use std::collections::BTreeMap;

use outbox_core::spi::{duration_millis, truncate_error, validate_advance, validate_failing, validate_limit};
use outbox_core::{
    Error, EventJournal, FailureDecision, FailureOutcome, FeedPage, MAX_PAGE, Partition, Result, RetryPolicy,
    Seq, SinkFeed, SinkName, SinkStatus, SinkStore, SinkStream, SinkSummary, StreamId, Timestamp,
};

use crate::MemoryJournal;

/// The sinks' part of the journal's state.
#[derive(Debug, Default)]
pub(crate) struct SinkState {
    /// (sink, stream) -> (partition, state).
    pub(crate) streams: BTreeMap<(SinkName, StreamId), (Partition, SinkStream)>,
    cursors: BTreeMap<(SinkName, Partition), u64>,
}

impl SinkStore for MemoryJournal {
    async fn sink_states(&self, sink: &SinkName, streams: &[StreamId]) -> Result<Vec<SinkStream>> {
        let st = self.lock();
        Ok(streams
            .iter()
            .map(|s| {
                st.sinks
                    .streams
                    .get(&(sink.clone(), s.clone()))
                    .map_or_else(|| SinkStream::new(sink, s), |(_, state)| state.clone())
            })
            .collect())
    }

    async fn advance_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
        partition: Partition,
        from: u64,
        to: Seq,
        more: bool,
    ) -> Result<bool> {
        validate_advance(from, to, more)?;
        let now = self.now();
        let mut st = self.lock();
        let key = (sink.clone(), stream.clone());
        let current = st.sinks.streams.get(&key).map_or(0, |(_, s)| s.seq);
        if current != from {
            return Ok(false);
        }
        let before = st.sinks.streams.get(&key).map(|(_, s)| s.clone());
        let state = if more {
            // Due again at once, its failure record kept.
            SinkStream {
                seq: to.get(),
                status: SinkStatus::Failed,
                updated_at: now,
                next_attempt_at: now,
                ..before.unwrap_or_else(|| SinkStream::new(sink, stream))
            }
        } else if before.as_ref().is_some_and(|b| b.status != SinkStatus::Ok)
            && to.get() < st.version_of(stream)
        {
            // Not ok when read, and not at the stream's end: scan cursors
            // may have passed its later events, so only a catch-up to the
            // end may make it ok. A failed stream stays due (now), a dead
            // one dead; the checkpoint moves over what was published.
            let before = before.unwrap_or_else(|| SinkStream::new(sink, stream));
            SinkStream {
                seq: to.get(),
                updated_at: now,
                next_attempt_at: if before.status == SinkStatus::Failed {
                    now
                } else {
                    before.next_attempt_at
                },
                ..before
            }
        } else {
            SinkStream {
                seq: to.get(),
                status: SinkStatus::Ok,
                attempt_count: 0,
                last_error: None,
                updated_at: now,
                next_attempt_at: before.map_or(now, |s| s.next_attempt_at),
                ..SinkStream::new(sink, stream)
            }
        };
        st.sinks.streams.insert(key, (partition, state));
        Ok(true)
    }

    async fn hold_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
        partition: Partition,
        at: u64,
    ) -> Result<SinkStream> {
        let now = self.now();
        let mut st = self.lock();
        let key = (sink.clone(), stream.clone());
        if let Some((_, state)) = st.sinks.streams.get(&key)
            && state.status != SinkStatus::Ok
        {
            return Ok(state.clone());
        }
        let state = SinkStream {
            seq: at,
            status: SinkStatus::Failed,
            next_attempt_at: now,
            updated_at: now,
            ..SinkStream::new(sink, stream)
        };
        st.sinks.streams.insert(key, (partition, state.clone()));
        Ok(state)
    }

    async fn fail_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
        partition: Partition,
        seq: Seq,
        error: &str,
        policy: &RetryPolicy,
    ) -> Result<FailureOutcome> {
        let now = self.now();
        let mut st = self.lock();
        let key = (sink.clone(), stream.clone());
        let mut state = st
            .sinks
            .streams
            .get(&key)
            .map_or_else(|| SinkStream::new(sink, stream), |(_, s)| s.clone());
        validate_failing(sink, stream, state.seq, seq)?;
        let attempt = state.attempt_count.saturating_add(1);
        let outcome = match policy.decide(attempt) {
            FailureDecision::DeadLetter => {
                state.status = SinkStatus::Dead;
                state.next_attempt_at = now;
                FailureOutcome::Dead { attempt }
            }
            FailureDecision::Retry(delay) => {
                state.status = SinkStatus::Failed;
                state.next_attempt_at = Timestamp::from_millis(now.as_millis() + duration_millis(delay));
                FailureOutcome::Retry {
                    attempt,
                    next_attempt_at: state.next_attempt_at,
                }
            }
        };
        state.attempt_count = attempt;
        state.last_error = Some(truncate_error(error).to_owned());
        state.updated_at = now;
        st.sinks.streams.insert(key, (partition, state));
        Ok(outcome)
    }

    async fn due_sink_streams(
        &self,
        sink: &SinkName,
        partitions: &[Partition],
        limit: usize,
    ) -> Result<Vec<SinkStream>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let now = self.now();
        let st = self.lock();
        let mut out: Vec<SinkStream> = st
            .sinks
            .streams
            .iter()
            .filter(|((s, _), (p, state))| {
                s == sink
                    && partitions.contains(p)
                    && state.status == SinkStatus::Failed
                    && state.next_attempt_at <= now
            })
            .map(|(_, (_, state))| state.clone())
            .collect();
        out.sort_by(|a, b| (a.next_attempt_at, &a.stream).cmp(&(b.next_attempt_at, &b.stream)));
        out.truncate(limit);
        Ok(out)
    }

    async fn sink_streams(
        &self,
        sink: &SinkName,
        status: Option<SinkStatus>,
        limit: usize,
    ) -> Result<Vec<SinkStream>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let st = self.lock();
        Ok(st
            .sinks
            .streams
            .iter()
            .filter(|((s, _), (_, state))| s == sink && status.is_none_or(|x| state.status == x))
            .map(|(_, (_, state))| state.clone())
            .take(limit)
            .collect())
    }

    async fn requeue_sink(&self, sink: &SinkName, stream: &StreamId) -> Result<SinkStream> {
        let now = self.now();
        let mut st = self.lock();
        let Some((_, state)) = st.sinks.streams.get_mut(&(sink.clone(), stream.clone())) else {
            return Err(Error::NotFound(format!(
                "sink {sink} has no state for stream {stream}"
            )));
        };
        if state.status == SinkStatus::Ok {
            return Err(Error::InvalidState(format!(
                "sink {sink} is not failing on stream {stream}: nothing to requeue"
            )));
        }
        state.status = SinkStatus::Failed;
        state.attempt_count = 0;
        state.next_attempt_at = now;
        state.updated_at = now;
        Ok(state.clone())
    }

    async fn sinks(&self) -> Result<Vec<SinkSummary>> {
        let st = self.lock();
        let mut out: BTreeMap<SinkName, SinkSummary> = BTreeMap::new();
        let blank = |sink: &SinkName| SinkSummary {
            sink: sink.clone(),
            streams: 0,
            failed: 0,
            dead: 0,
            position: 0,
            // Positions follow commit order: nothing is ever held back.
            held_back: 0,
        };
        for ((sink, _), (_, state)) in &st.sinks.streams {
            let e = out.entry(sink.clone()).or_insert_with(|| blank(sink));
            e.streams += 1;
            match state.status {
                SinkStatus::Failed => e.failed += 1,
                SinkStatus::Dead => e.dead += 1,
                SinkStatus::Ok => {}
            }
        }
        let mut mins: BTreeMap<SinkName, u64> = BTreeMap::new();
        for ((sink, _), pos) in &st.sinks.cursors {
            let m = mins.entry(sink.clone()).or_insert(*pos);
            *m = (*m).min(*pos);
        }
        for (sink, pos) in mins {
            out.entry(sink.clone()).or_insert_with(|| blank(&sink)).position = pos;
        }
        Ok(out.into_values().collect())
    }
}

impl SinkFeed for MemoryJournal {
    /// Positions are taken under the journal's one lock, in commit order:
    /// the feed key is the global position.
    async fn read_feed(&self, after: u64, limit: usize) -> Result<FeedPage> {
        let events = self.read_global(after, limit).await?;
        let next = events.last().map_or(after, |e| e.global_position);
        Ok(FeedPage {
            events: events.into_iter().map(|e| (e.global_position, e)).collect(),
            next,
        })
    }

    async fn sink_cursors(&self, sink: &SinkName) -> Result<Vec<(Partition, u64)>> {
        let st = self.lock();
        Ok(st
            .sinks
            .cursors
            .iter()
            .filter(|((s, _), _)| s == sink)
            .map(|((_, p), pos)| (*p, *pos))
            .collect())
    }

    async fn advance_sink_cursor(
        &self,
        sink: &SinkName,
        partition: Partition,
        from: u64,
        to: u64,
    ) -> Result<bool> {
        outbox_core::spi::validate_cursor_move(from, to)?;
        let mut st = self.lock();
        let key = (sink.clone(), partition);
        if st.sinks.cursors.get(&key).copied().unwrap_or(0) != from {
            return Ok(false);
        }
        st.sinks.cursors.insert(key, to);
        Ok(true)
    }
}
