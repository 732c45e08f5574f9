//! Sinks: publishers beside the projections (ADR 0023).
//!
//! A [`Sink`] receives the journal's events (those its publication policy,
//! [`Sink::accepts`], wants) in stream order, at least once, each carrying
//! the idempotency key `stream:seq` ([`message_id`]). Delivery is tracked
//! per (sink, stream) by a checkpoint in the journal database
//! ([`SinkStore`]): the last seq handed to the sink and acknowledged (or
//! passed over by its policy). A sink reads the journal itself, by global
//! position, so it never holds back the outbox rows the projections drain,
//! and a projection failing never holds back a sink; a stream whose
//! publication fails is retried with backoff and dead-lettered per sink,
//! by the same [`RetryPolicy`](crate::RetryPolicy) as outbox rows.

use std::fmt;
use std::future::Future;
use std::str::FromStr;

use serde::Serialize;

use crate::{
    BoxError, Error, Event, FailureOutcome, Partition, Result, RetryPolicy, Seq, SinkName, StreamId,
    Timestamp,
};

/// The prefix of a projection's key among the consumers whose per-stream
/// state [`SinkStore`] keeps (ADR 0032): `projection:NAME`. A sink's name
/// may not start with it.
pub const PROJECTION_CONSUMER_PREFIX: &str = "projection:";

/// The key under which [`SinkStore`] keeps projection `name`'s per-stream
/// exceptions: the streams on which it failed, is dead-lettered, or fell
/// behind while the others went on (ADR 0032). `InvalidInput` when the
/// name is too long to carry the prefix.
pub fn projection_consumer(name: &crate::ProjectionName) -> Result<SinkName> {
    SinkName::new(format!("{PROJECTION_CONSUMER_PREFIX}{name}")).map_err(|_| {
        Error::invalid(format!(
            "projection name `{name}` is too long: a projection's name is at most {} bytes",
            crate::MAX_ID_LEN - PROJECTION_CONSUMER_PREFIX.len()
        ))
    })
}

/// The projection whose exceptions `consumer` keys, when it keys one's
/// ([`projection_consumer`]); `None` for a sink.
pub fn consumer_projection(consumer: &SinkName) -> Option<&str> {
    consumer.as_str().strip_prefix(PROJECTION_CONSUMER_PREFIX)
}

/// The idempotency key of an event's message: `stream:seq`.
pub fn message_id(event: &Event) -> String {
    format!("{}:{}", event.stream, event.seq)
}

/// What one [`Sink::publish`] call achieved.
#[derive(Debug, Default)]
pub struct Published {
    /// How many of the events given, from the first, were acknowledged.
    pub acknowledged: usize,
    /// Why the next one was not, if one was not.
    pub error: Option<BoxError>,
}

impl Published {
    /// Every one of `n` events acknowledged.
    pub fn all(n: usize) -> Self {
        Published {
            acknowledged: n,
            error: None,
        }
    }

    /// The first `acknowledged` events acknowledged, the next one failed.
    pub fn failed(acknowledged: usize, error: impl Into<BoxError>) -> Self {
        Published {
            acknowledged,
            error: Some(error.into()),
        }
    }
}

/// A publisher beside the projections: a message bus, a webhook, another
/// service. Implementations must deliver the events of one call in the order
/// given (they are one stream's, in seq order) and count an event as
/// acknowledged only once the receiver has it durably; the runtime never
/// gives an event of a stream before the previous one was acknowledged.
/// Every event may be delivered more than once (after a crash or a lost
/// acknowledgement): put [`message_id`] on each message so the receiver
/// can drop repeats.
#[async_trait::async_trait]
pub trait Sink: Send + Sync {
    /// Its name: the key of its checkpoints.
    fn name(&self) -> &SinkName;

    /// The publication policy: whether this sink receives `event`. Events
    /// it does not receive advance its checkpoint all the same. Default:
    /// every event.
    fn accepts(&self, event: &Event) -> bool {
        let _ = event;
        true
    }

    /// Publishes `events` (one stream's, in seq order, at least one) and
    /// reports how many, from the first, were acknowledged.
    async fn publish(&self, events: &[Event]) -> Published;
}

/// A publication policy by event type: the sink receives the listed types
/// only (or every type when the list is empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventTypeFilter(Vec<crate::EventType>);

impl EventTypeFilter {
    /// Every event type.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only these types.
    pub fn only(types: impl IntoIterator<Item = crate::EventType>) -> Self {
        let mut v: Vec<_> = types.into_iter().collect();
        v.sort();
        v.dedup();
        EventTypeFilter(v)
    }

    /// Whether `event` passes.
    pub fn accepts(&self, event: &Event) -> bool {
        self.0.is_empty() || self.0.binary_search(&event.event_type).is_ok()
    }
}

/// The delivery state of one (sink, stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SinkStatus {
    /// Publishing as events come.
    Ok,
    /// The event after the checkpoint failed; retried at `next_attempt_at`.
    Failed,
    /// Failed the dead-letter threshold of times; waits for a requeue.
    Dead,
}

impl SinkStatus {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            SinkStatus::Ok => "ok",
            SinkStatus::Failed => "failed",
            SinkStatus::Dead => "dead",
        }
    }
}

impl fmt::Display for SinkStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SinkStatus {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "ok" => Ok(SinkStatus::Ok),
            "failed" => Ok(SinkStatus::Failed),
            "dead" => Ok(SinkStatus::Dead),
            other => Err(Error::invalid(format!(
                "`{other}` is not a sink status (ok, failed, dead)"
            ))),
        }
    }
}

/// One (consumer, stream)'s checkpoint and failure state. A sink's is its
/// delivery checkpoint; a projection's (keyed by [`projection_consumer`])
/// exists only while the projection is off the shared path on the stream,
/// and its `seq` is where its exception stands (the projection store's
/// checkpoint stays the truth).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SinkStream {
    /// The sink.
    pub sink: SinkName,
    /// The stream.
    pub stream: StreamId,
    /// The last seq delivered (or passed over by the policy); 0 for none.
    pub seq: u64,
    /// Its state.
    pub status: SinkStatus,
    /// Consecutive failures of the event after `seq`.
    pub attempt_count: u32,
    /// When a failed stream is retried.
    pub next_attempt_at: Timestamp,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// When the state last changed.
    pub updated_at: Timestamp,
}

impl SinkStream {
    /// The state of a (sink, stream) never delivered to.
    pub fn new(sink: &SinkName, stream: &StreamId) -> Self {
        SinkStream {
            sink: sink.clone(),
            stream: stream.clone(),
            seq: 0,
            status: SinkStatus::Ok,
            attempt_count: 0,
            next_attempt_at: Timestamp::from_millis(0),
            last_error: None,
            updated_at: Timestamp::from_millis(0),
        }
    }
}

/// One sink as `outbox sinks` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SinkSummary {
    /// The sink.
    pub sink: SinkName,
    /// Streams with a checkpoint.
    pub streams: u64,
    /// Streams failing (retried with backoff).
    pub failed: u64,
    /// Streams dead-lettered.
    pub dead: u64,
    /// The lowest feed cursor among its stored per-partition cursors (0 when
    /// none is stored): a global position on SQLite and memory, a
    /// transaction id on Postgres ([`SinkFeed::read_feed`]).
    pub position: u64,
    /// Committed events the feed holds back because a transaction that
    /// began writing before them is still open (Postgres; counted up to
    /// [`HELD_BACK_CAP`](Self::HELD_BACK_CAP); always 0 where positions follow commit order). They are
    /// delivered once it ends (ADR 0030).
    pub held_back: u64,
}

impl SinkSummary {
    /// The most events [`held_back`](Self::held_back) counts: a count at
    /// this value means "this many or more".
    pub const HELD_BACK_CAP: u64 = 10_000;

    /// The events held back from every sink, as `sinks` (one summary per
    /// sink, all reading the same journal) report it: 0 without sinks.
    pub fn held_back_of(sinks: &[SinkSummary]) -> u64 {
        sinks.iter().map(|s| s.held_back).max().unwrap_or(0)
    }
}

/// A page of the journal in the order its events became visible
/// ([`SinkFeed::read_feed`]): what the sinks scan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FeedPage {
    /// The events read, each with its feed key: every event read by a
    /// cursor `c` has a key above `c`, and a cursor at or above an event's
    /// key has read it.
    pub events: Vec<(u64, Event)>,
    /// The cursor to continue from: every event with a key at or below it
    /// has been read, by this page or before it. Never below `after`.
    pub next: u64,
}

/// The journal database's record of sink deliveries: per (sink, stream)
/// checkpoints with their failures, and per (sink, partition) scan cursors.
///
/// # Contract
/// - A (sink, stream) without a stored state reads as
///   [`SinkStream::new`]: seq 0, `ok`.
/// - `sink_states(sink, streams)` returns one state per stream given, in
///   the order given.
/// - `advance_sink(sink, stream, from, to, more)` is a compare-and-set: when
///   the stored seq is `from` (0 for none) it becomes `to` and the call
///   returns `true`; otherwise nothing changes and it returns `false`.
///   Without `more` the status becomes `ok`, the attempt count 0 and the
///   error cleared, when the stored status was `ok` or `to` reaches the
///   stream's version; otherwise (a stream that failed, or died, since the
///   caller read it) only the seq moves: a `failed` one stays failed and
///   becomes due now, a `dead` one stays dead. Scan cursors pass over the
///   events of a stream that is not `ok`, so only a catch-up to its end may
///   declare it caught up. With `more` (a catch-up that has more of the stream to
///   deliver) the stream becomes `failed` and due now, its attempt count
///   and error kept: if the deliverer stops before the end, the stream is
///   still retried from its checkpoint, even when the scan cursors have
///   passed its events. `to < from`, or `to == from` with `more`, is
///   `InvalidInput`; `to == from` without `more` moves nothing and settles
///   the status by the same rule (a stream found at its end is `ok`). The
///   partition of the stream is recorded with it.
/// - `hold_sink(sink, stream, partition, at)` takes a (consumer, stream)
///   off the shared path: when it has no state or is `ok`, its seq becomes
///   `at` and it becomes `failed`, due now, attempt count 0, error cleared;
///   a `failed` or `dead` one is left as it is. Returns the state after.
/// - `fail_sink(sink, stream, seq, error, policy)` records a failure of
///   event `seq`, which must be the one after the stored seq (else
///   `InvalidState`, nothing changes): the attempt count grows by one, the
///   error is stored (cut to [`MAX_ERROR_LEN`](crate::MAX_ERROR_LEN)); the
///   status becomes `dead` when the policy dead-letters at that count, else
///   `failed`, due at `now + policy.delay(attempt)` by the store's clock.
/// - `due_sink_streams(sink, partitions, limit)` lists the `failed` streams
///   of `sink` in `partitions` that are due (by the store's clock), oldest
///   due first.
/// - `sink_streams(sink, status, limit)` lists states by stream, optionally
///   of one status.
/// - `requeue_sink(sink, stream)` makes a `failed` or `dead` stream
///   `failed`, attempt count 0, due now; `NotFound` when it has no state,
///   `InvalidState` when it is `ok`.
/// - `sink_cursors(sink)` lists the stored (partition, feed cursor) cursors
///   by partition (see `read_feed`); `advance_sink_cursor(sink, partition, from, to)` is a
///   compare-and-set like `advance_sink` (absent counts as 0).
/// - `sinks()` summarises every sink with stored state, by name, each with
///   the events `read_feed` holds back now (see [`SinkSummary::held_back`]).
/// - `read_feed(after, limit)` reads the journal in the order its events
///   became visible to readers (ADR 0030), from the feed cursor `after` (0:
///   the beginning): every event whose key is above `after` and at or below
///   the page's `next`, in key order (about `limit` events: more when one
///   transaction's events straddle the limit, which a page never splits).
///   **An event that commits after a page was read has a key above that
///   page's `next`, whatever its global position**: a reader that moves its
///   cursor to `next` loses nothing to commit order. Where positions are
///   taken in commit order (SQLite, memory) the key is the global position;
///   on Postgres, where a position is taken before its transaction commits,
///   it is the transaction id, and `next` stays below every transaction
///   still open (so one long-open transaction holds back the events that
///   commit after it, never loses them).
pub trait SinkStore: Send + Sync {
    /// The states of `streams` for `sink`.
    fn sink_states(
        &self,
        sink: &SinkName,
        streams: &[StreamId],
    ) -> impl Future<Output = Result<Vec<SinkStream>>> + Send;

    /// Moves the checkpoint from `from` to `to` (compare-and-set), the
    /// stream due again at once when it has `more` to deliver.
    fn advance_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
        partition: Partition,
        from: u64,
        to: Seq,
        more: bool,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Takes (`sink`, `stream`) off the shared path at `at`, unless it is already.
    fn hold_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
        partition: Partition,
        at: u64,
    ) -> impl Future<Output = Result<SinkStream>> + Send;

    /// Records a failure to publish `seq`.
    fn fail_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
        partition: Partition,
        seq: Seq,
        error: &str,
        policy: &RetryPolicy,
    ) -> impl Future<Output = Result<FailureOutcome>> + Send;

    /// Failed streams due for a retry, oldest due first.
    fn due_sink_streams(
        &self,
        sink: &SinkName,
        partitions: &[Partition],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SinkStream>>> + Send;

    /// States by stream, optionally of one status.
    fn sink_streams(
        &self,
        sink: &SinkName,
        status: Option<SinkStatus>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SinkStream>>> + Send;

    /// Makes a failed or dead stream due now with a fresh attempt count.
    fn requeue_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
    ) -> impl Future<Output = Result<SinkStream>> + Send;

    /// Every sink with stored state.
    fn sinks(&self) -> impl Future<Output = Result<Vec<SinkSummary>>> + Send;
}

/// What a sink's delivery reads beyond the consumer states: the journal in
/// visibility order and the scan cursors (ADR 0023, 0030). An optional
/// capability (ADR 0035): a journal without it takes no sinks (the runtime
/// refuses to start one), and the defaults say so. The contract of
/// `read_feed`, `sink_cursors` and `advance_sink_cursor` is
/// [`SinkStore`]'s above.
pub trait SinkFeed: SinkStore {
    /// The journal from feed cursor `after`, in the order it became visible.
    fn read_feed(&self, after: u64, limit: usize) -> impl Future<Output = Result<FeedPage>> + Send {
        let _ = (after, limit);
        async {
            Err(Error::Unsupported(
                "sinks: this journal has no feed to deliver from".into(),
            ))
        }
    }

    /// The scan cursors of `sink`, by partition (none without the capability).
    fn sink_cursors(&self, sink: &SinkName) -> impl Future<Output = Result<Vec<(Partition, u64)>>> + Send {
        let _ = sink;
        async { Ok(Vec::new()) }
    }

    /// Moves a scan cursor from `from` to `to` (compare-and-set).
    fn advance_sink_cursor(
        &self,
        sink: &SinkName,
        partition: Partition,
        from: u64,
        to: u64,
    ) -> impl Future<Output = Result<bool>> + Send {
        let _ = (sink, partition, from, to);
        async {
            Err(Error::Unsupported(
                "sinks: this journal keeps no scan cursors".into(),
            ))
        }
    }
}

/// `InvalidInput` unless `to > from`, or `to == from` without `more` (a settle).
pub fn validate_advance(from: u64, to: Seq, more: bool) -> Result<()> {
    if to.get() < from || (to.get() == from && more) {
        return Err(Error::invalid(format!(
            "a sink checkpoint moves forward: {from} to {to} does not"
        )));
    }
    Ok(())
}

/// `InvalidInput` unless a sink cursor's move goes forward (`to > from`).
pub fn validate_cursor_move(from: u64, to: u64) -> Result<()> {
    if to <= from {
        return Err(Error::invalid(format!(
            "a sink cursor moves forward: {from} to {to} does not"
        )));
    }
    Ok(())
}

/// `InvalidState` unless `seq` is the event after the stored `checkpoint`.
pub fn validate_failing(sink: &SinkName, stream: &StreamId, checkpoint: u64, seq: Seq) -> Result<()> {
    if seq.get() != checkpoint + 1 {
        return Err(Error::InvalidState(format!(
            "sink {sink} is at {stream}/{checkpoint}: a failure of {stream}/{seq} is not the next event's"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EventType, Intent, Metadata, PayloadHash};

    fn event(t: &str) -> Event {
        Event {
            stream: StreamId::new("s").unwrap(),
            seq: Seq::new(7).unwrap(),
            global_position: 9,
            event_type: EventType::new(t).unwrap(),
            intent: Intent::Apply,
            payload_hash: PayloadHash::of(b""),
            decoded: Default::default(),
            payload: Vec::new(),
            metadata: Metadata {
                recorded_at: Timestamp::from_millis(0),
                correlation_id: None,
                causation_id: None,
            },
        }
    }

    #[test]
    fn the_message_id_is_stream_and_seq() {
        assert_eq!(message_id(&event("a")), "s:7");
    }

    #[test]
    fn a_type_filter_passes_listed_types_or_all() {
        let only = EventTypeFilter::only([EventType::new("b").unwrap(), EventType::new("a").unwrap()]);
        assert!(only.accepts(&event("a")) && only.accepts(&event("b")) && !only.accepts(&event("c")));
        assert!(EventTypeFilter::all().accepts(&event("c")));
    }

    #[test]
    fn statuses_round_trip() {
        for s in [SinkStatus::Ok, SinkStatus::Failed, SinkStatus::Dead] {
            assert_eq!(s.as_str().parse::<SinkStatus>().unwrap(), s);
        }
        assert!("x".parse::<SinkStatus>().is_err());
    }
}
