//! Stored column values and their validated conversion into domain types.
//!
//! Database adapters read a row's columns as primitive values (integers,
//! strings, bytes) into one of the `Stored*` structs and call its conversion,
//! so every adapter validates what it reads back in the same way and reports
//! the same errors. Nothing here does I/O.
//!
//! Errors, by kind:
//! - a value of the journal or the projection database that does not decode
//!   is a permanent [`Error::Storage`] reading `undecodable {what} in the
//!   journal: {reason}` (see [`journal_undecodable`] and
//!   [`projection_undecodable`]);
//! - a stored event whose seq decodes but whose other values do not, or
//!   whose payload does not match its hash, is [`Error::Corrupt`] naming
//!   the stream and seq;
//! - a run row with an invalid value is a permanent [`Error::Storage`]
//!   reading `run row has an invalid {what}`.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use crate::{
    Error, Event, EventType, Intent, Lease, Metadata, OutboxRow, PayloadHash, Projection, ProjectionName,
    Result, RunRecord, Seq, StreamId, Timestamp, Watermark, WorkerId,
};

/// The permanent [`Error::Storage`] for a `what` (`"outbox row"`,
/// `"stream lease"`, ...) of the journal that does not decode:
/// `undecodable {what} in the journal: {e}`.
pub fn journal_undecodable(what: &str, e: impl fmt::Display) -> Error {
    undecodable(what, "the journal", e)
}

/// The permanent [`Error::Storage`] for a `what` (`"watermark"`, ...) of the
/// projection database that does not decode: `undecodable {what} in the
/// projection database: {e}`.
pub fn projection_undecodable(what: &str, e: impl fmt::Display) -> Error {
    undecodable(what, "the projection database", e)
}

fn undecodable(what: &str, database: &str, e: impl fmt::Display) -> Error {
    Error::Storage {
        message: format!("undecodable {what} in {database}: {e}"),
        temporary: false,
        source: None,
    }
}

/// The stored columns of one journal event, as the database returns them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEvent {
    /// `global_position`: the event's position in the whole journal (from 1).
    pub global_position: i64,
    /// `stream`: the stream the row belongs to.
    pub stream: String,
    /// `seq`: the event's seq in its stream (from 1).
    pub seq: i64,
    /// `event_type`.
    pub event_type: String,
    /// `intent`: the [`Intent`]'s text form.
    pub intent: String,
    /// `payload`.
    pub payload: Vec<u8>,
    /// `payload_hash`: SHA-256 of the payload, 32 bytes.
    pub payload_hash: Vec<u8>,
    /// `recorded_at`: milliseconds since the Unix epoch.
    pub recorded_at: i64,
    /// `correlation_id`.
    pub correlation_id: Option<String>,
    /// `causation_id`.
    pub causation_id: Option<String>,
}

impl StoredEvent {
    /// The error for a column of the event at `seq` (raw) on
    /// `expected_stream` that the driver could not read: [`Error::Corrupt`]
    /// naming the stream and seq, or, when `seq` itself is not a valid seq,
    /// the [`journal_undecodable`] error for the seq.
    pub fn column_error(expected_stream: &StreamId, seq: i64, e: impl fmt::Display) -> Error {
        match Seq::try_from(seq) {
            Ok(seq) => Error::Corrupt {
                stream: expected_stream.clone(),
                seq,
                reason: e.to_string(),
            },
            Err(bad) => journal_undecodable("event", bad),
        }
    }

    /// Validates the values and builds the [`Event`] of `expected_stream`
    /// (the stream the caller asked for).
    ///
    /// # Errors
    ///
    /// - an invalid `seq` (below 1): [`journal_undecodable`] for `"event"`;
    /// - a row of another stream, a negative global position, an invalid
    ///   event type or intent, a payload hash that is not 32 bytes, or a
    ///   payload that does not match its hash: [`Error::Corrupt`] naming
    ///   `expected_stream` and the seq.
    pub fn into_event(self, expected_stream: &StreamId) -> Result<Event> {
        let seq = Seq::try_from(self.seq).map_err(|e| journal_undecodable("event", e))?;
        let corrupt = |reason: String| Error::Corrupt {
            stream: expected_stream.clone(),
            seq,
            reason,
        };
        if self.stream != expected_stream.as_str() {
            return Err(corrupt(format!("row belongs to stream {:?}", self.stream)));
        }
        let hash = self.payload_hash;
        let event = Event {
            stream: expected_stream.clone(),
            seq,
            global_position: u64::try_from(self.global_position).map_err(|e| corrupt(e.to_string()))?,
            event_type: EventType::new(self.event_type).map_err(|e| corrupt(e.to_string()))?,
            intent: self
                .intent
                .parse::<Intent>()
                .map_err(|e| corrupt(e.to_string()))?,
            payload_hash: PayloadHash::from_slice(&hash)
                .ok_or_else(|| corrupt(format!("stored payload hash is {} bytes, not 32", hash.len())))?,
            payload: self.payload,
            metadata: Metadata {
                recorded_at: Timestamp::from_millis(self.recorded_at),
                correlation_id: self.correlation_id,
                causation_id: self.causation_id,
            },
            decoded: Default::default(),
        };
        event.verify()?;
        Ok(event)
    }
}

/// The stored columns of one outbox row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredOutboxRow {
    /// `stream`.
    pub stream: String,
    /// `seq`.
    pub seq: i64,
    /// `event_type`.
    pub event_type: String,
    /// `status`: the [`OutboxStatus`](crate::OutboxStatus)'s text form.
    pub status: String,
    /// `attempt_count`; negative values read as 0, values beyond `u32` as
    /// `u32::MAX`.
    pub attempt_count: i64,
    /// `next_attempt_at`: milliseconds since the Unix epoch.
    pub next_attempt_at: i64,
    /// `last_error`.
    pub last_error: Option<String>,
    /// `updated_at`: milliseconds since the Unix epoch.
    pub updated_at: i64,
    /// `first_failed_at`: milliseconds since the Unix epoch.
    pub first_failed_at: Option<i64>,
    /// `alone`: whether the row is applied alone (a stored mark above 0).
    pub alone: bool,
}

impl StoredOutboxRow {
    /// Validates the values and builds the [`OutboxRow`].
    ///
    /// # Errors
    ///
    /// An invalid stream, seq, event type or status:
    /// [`journal_undecodable`] for `"outbox row"`.
    pub fn into_row(self) -> Result<OutboxRow> {
        let bad = |e: Error| journal_undecodable("outbox row", e);
        Ok(OutboxRow {
            stream: StreamId::new(self.stream).map_err(bad)?,
            seq: Seq::try_from(self.seq).map_err(bad)?,
            event_type: EventType::new(self.event_type).map_err(bad)?,
            status: self.status.parse().map_err(bad)?,
            attempt_count: u32::try_from(self.attempt_count.max(0)).unwrap_or(u32::MAX),
            next_attempt_at: Timestamp::from_millis(self.next_attempt_at),
            last_error: self.last_error,
            updated_at: Timestamp::from_millis(self.updated_at),
            first_failed_at: self.first_failed_at.map(Timestamp::from_millis),
            alone: self.alone,
        })
    }
}

/// The stored columns of one stream lease (the stream is the one asked for).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredLease {
    /// `owner`.
    pub owner: String,
    /// `epoch`.
    pub epoch: i64,
    /// `expires_at`: milliseconds since the Unix epoch.
    pub expires_at: i64,
}

impl StoredLease {
    /// Validates the values and builds the [`Lease`] on `stream`.
    ///
    /// # Errors
    ///
    /// An invalid owner or a negative epoch: [`journal_undecodable`] for
    /// `"stream lease"`.
    pub fn into_lease(self, stream: &StreamId) -> Result<Lease> {
        Ok(Lease {
            stream: stream.clone(),
            owner: WorkerId::new(self.owner).map_err(|e| journal_undecodable("stream lease", e))?,
            epoch: u64::try_from(self.epoch).map_err(|e| journal_undecodable("stream lease", e))?,
            expires_at: Timestamp::from_millis(self.expires_at),
            partition: None,
        })
    }
}

impl From<(String, i64, i64)> for StoredLease {
    /// From `(owner, epoch, expires_at)`, the column order of the adapters'
    /// lease queries.
    fn from((owner, epoch, expires_at): (String, i64, i64)) -> Self {
        StoredLease {
            owner,
            epoch,
            expires_at,
        }
    }
}

/// The stored columns of one stream watermark (projection database).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredWatermark {
    /// `stream`.
    pub stream: String,
    /// `applied_through`.
    pub applied_through: i64,
    /// `updated_at`: milliseconds since the Unix epoch.
    pub updated_at: i64,
}

impl StoredWatermark {
    /// Validates the values and builds the [`Watermark`].
    ///
    /// # Errors
    ///
    /// A negative `applied_through` or an invalid stream:
    /// [`projection_undecodable`] for `"watermark"`.
    pub fn into_watermark(self) -> Result<Watermark> {
        let applied_through =
            u64::try_from(self.applied_through).map_err(|e| projection_undecodable("watermark", e))?;
        Ok(Watermark {
            stream: StreamId::new(self.stream).map_err(|e| projection_undecodable("watermark", e))?,
            applied_through,
            expected_next: applied_through + 1,
            updated_at: Timestamp::from_millis(self.updated_at),
        })
    }
}

impl From<(String, i64, i64)> for StoredWatermark {
    /// From `(stream, applied_through, updated_at)`, the column order of the
    /// adapters' watermark queries.
    fn from((stream, applied_through, updated_at): (String, i64, i64)) -> Self {
        StoredWatermark {
            stream,
            applied_through,
            updated_at,
        }
    }
}

/// The stored columns of one replay or rebuild run (`outbox_runs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRun {
    /// `id`; a negative value reads as 0.
    pub id: i64,
    /// `kind`: the [`RunKind`](crate::RunKind)'s text form.
    pub kind: String,
    /// `projection`.
    pub projection: String,
    /// `state`: the [`RunState`](crate::RunState)'s text form.
    pub state: String,
    /// `since_position`; a negative value reads as 0.
    pub since_position: Option<i64>,
    /// `until_position`; a negative value reads as 0.
    pub until_position: Option<i64>,
    /// `cursor_position`; a negative value reads as 0.
    pub cursor_position: Option<i64>,
    /// `processed`; a negative value reads as 0.
    pub processed: i64,
    /// `last_stream`.
    pub last_stream: Option<String>,
    /// `last_seq`.
    pub last_seq: Option<i64>,
    /// `error_code`.
    pub error_code: Option<String>,
    /// `error_message`.
    pub error_message: Option<String>,
    /// `cancel_requested`.
    pub cancel_requested: bool,
    /// `owner`.
    pub owner: String,
    /// `lease_expires_at`: milliseconds since the Unix epoch.
    pub lease_expires_at: i64,
    /// `created_at`: milliseconds since the Unix epoch.
    pub created_at: i64,
    /// `updated_at`: milliseconds since the Unix epoch.
    pub updated_at: i64,
}

impl StoredRun {
    /// Validates the values and builds the [`RunRecord`].
    ///
    /// # Errors
    ///
    /// An invalid kind, projection, state, last stream, last seq or owner: a
    /// permanent [`Error::Storage`] reading `run row has an invalid {what}`
    /// (`kind`, `projection`, `state`, `stream`, `seq`, `owner`) with the
    /// validation error as its source.
    pub fn into_record(self) -> Result<RunRecord> {
        let corrupt = |what: &str, e: Error| Error::storage(format!("run row has an invalid {what}"), e);
        let u = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(RunRecord {
            id: u(self.id),
            kind: self.kind.parse().map_err(|e| corrupt("kind", e))?,
            projection: ProjectionName::new(self.projection).map_err(|e| corrupt("projection", e))?,
            state: self.state.parse().map_err(|e| corrupt("state", e))?,
            since: self.since_position.map(u),
            until: self.until_position.map(u),
            position: self.cursor_position.map(u),
            processed: u(self.processed),
            last_stream: self
                .last_stream
                .map(StreamId::new)
                .transpose()
                .map_err(|e| corrupt("stream", e))?,
            last_seq: self
                .last_seq
                .map(Seq::try_from)
                .transpose()
                .map_err(|e| corrupt("seq", e))?,
            error_code: self.error_code,
            error_message: self.error_message,
            cancel_requested: self.cancel_requested,
            owner: WorkerId::new(self.owner).map_err(|e| corrupt("owner", e))?,
            lease_expires_at: Timestamp::from_millis(self.lease_expires_at),
            created_at: Timestamp::from_millis(self.created_at),
            updated_at: Timestamp::from_millis(self.updated_at),
        })
    }
}

/// Refuses a projection list that names a projection twice, as
/// [`ProjectionStore::setup`](crate::ProjectionStore::setup) and
/// [`ProjectionStore::apply`](crate::ProjectionStore::apply) must.
///
/// # Errors
///
/// [`Error::InvalidInput`]: ``projection `{name}` is listed twice``.
pub fn validate_projection_names<Tx: Send>(projections: &[Arc<dyn Projection<Tx>>]) -> Result<()> {
    let mut seen = BTreeSet::new();
    for p in projections {
        if !seen.insert(p.name()) {
            return Err(Error::invalid(format_args!(
                "projection `{}` is listed twice",
                p.name()
            )));
        }
    }
    Ok(())
}

/// The projections' names for messages: `` `a`, `b` ``.
pub fn projection_names<Tx: Send>(projections: &[Arc<dyn Projection<Tx>>]) -> String {
    projections
        .iter()
        .map(|p| format!("`{}`", p.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BoxError, OutboxStatus, RunKind, RunState, async_trait};

    fn stream() -> StreamId {
        StreamId::new("orders-1").unwrap()
    }

    fn event() -> StoredEvent {
        let payload = b"{\"n\":1}".to_vec();
        StoredEvent {
            global_position: 7,
            stream: "orders-1".into(),
            seq: 3,
            event_type: "OrderPlaced".into(),
            intent: Intent::Apply.to_string(),
            payload_hash: PayloadHash::of(&payload).0.to_vec(),
            payload,
            recorded_at: 1_000,
            correlation_id: Some("c".into()),
            causation_id: None,
        }
    }

    /// The reason of a `Corrupt` error on orders-1/3, or a panic.
    fn corrupt_reason(r: Result<Event>) -> String {
        match r {
            Err(Error::Corrupt {
                stream: s,
                seq,
                reason,
            }) => {
                assert_eq!(s, stream());
                assert_eq!(seq.get(), 3);
                reason
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    fn storage_message<T: fmt::Debug>(r: Result<T>) -> String {
        match r {
            Err(Error::Storage {
                message, temporary, ..
            }) => {
                assert!(!temporary);
                message
            }
            other => panic!("expected Storage, got {other:?}"),
        }
    }

    #[test]
    fn a_good_event_converts() {
        let e = event().into_event(&stream()).unwrap();
        assert_eq!(e.stream, stream());
        assert_eq!(e.seq.get(), 3);
        assert_eq!(e.global_position, 7);
        assert_eq!(e.event_type.as_str(), "OrderPlaced");
        assert_eq!(e.intent, Intent::Apply);
        assert_eq!(e.payload, b"{\"n\":1}");
        assert_eq!(e.metadata.recorded_at, Timestamp::from_millis(1_000));
        assert_eq!(e.metadata.correlation_id.as_deref(), Some("c"));
        assert_eq!(e.metadata.causation_id, None);
    }

    #[test]
    fn an_invalid_seq_is_undecodable() {
        let msg = storage_message(StoredEvent { seq: 0, ..event() }.into_event(&stream()));
        assert!(msg.starts_with("undecodable event in the journal: "), "{msg}");
    }

    #[test]
    fn bad_event_values_are_corrupt() {
        let reason = corrupt_reason(
            StoredEvent {
                stream: "other".into(),
                ..event()
            }
            .into_event(&stream()),
        );
        assert_eq!(reason, "row belongs to stream \"other\"");

        corrupt_reason(
            StoredEvent {
                global_position: -1,
                ..event()
            }
            .into_event(&stream()),
        );
        corrupt_reason(
            StoredEvent {
                event_type: String::new(),
                ..event()
            }
            .into_event(&stream()),
        );
        corrupt_reason(
            StoredEvent {
                intent: "sideways".into(),
                ..event()
            }
            .into_event(&stream()),
        );

        let reason = corrupt_reason(
            StoredEvent {
                payload_hash: vec![0; 5],
                ..event()
            }
            .into_event(&stream()),
        );
        assert_eq!(reason, "stored payload hash is 5 bytes, not 32");

        let reason = corrupt_reason(
            StoredEvent {
                payload: b"tampered".to_vec(),
                ..event()
            }
            .into_event(&stream()),
        );
        assert_eq!(reason, "payload does not match its stored hash");
    }

    #[test]
    fn column_errors_name_the_event_when_the_seq_is_valid() {
        match StoredEvent::column_error(&stream(), 3, "bad column") {
            Error::Corrupt {
                stream: s,
                seq,
                reason,
            } => {
                assert_eq!((s, seq.get(), reason.as_str()), (stream(), 3, "bad column"));
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        let msg = storage_message::<()>(Err(StoredEvent::column_error(&stream(), -2, "bad column")));
        assert!(msg.starts_with("undecodable event in the journal: "), "{msg}");
    }

    fn outbox_row() -> StoredOutboxRow {
        StoredOutboxRow {
            stream: "orders-1".into(),
            seq: 3,
            event_type: "OrderPlaced".into(),
            status: OutboxStatus::Failed.as_str().into(),
            attempt_count: 2,
            next_attempt_at: 5_000,
            last_error: Some("boom".into()),
            updated_at: 4_000,
            first_failed_at: Some(3_000),
            alone: false,
        }
    }

    #[test]
    fn a_good_outbox_row_converts() {
        let r = outbox_row().into_row().unwrap();
        assert_eq!(r.stream, stream());
        assert_eq!(r.seq.get(), 3);
        assert_eq!(r.event_type.as_str(), "OrderPlaced");
        assert_eq!(r.status, OutboxStatus::Failed);
        assert_eq!(r.attempt_count, 2);
        assert_eq!(r.next_attempt_at, Timestamp::from_millis(5_000));
        assert_eq!(r.last_error.as_deref(), Some("boom"));
        assert_eq!(r.updated_at, Timestamp::from_millis(4_000));
        assert_eq!(r.first_failed_at, Some(Timestamp::from_millis(3_000)));
    }

    #[test]
    fn outbox_attempt_counts_are_clamped() {
        let low = StoredOutboxRow {
            attempt_count: -4,
            ..outbox_row()
        };
        assert_eq!(low.into_row().unwrap().attempt_count, 0);
        let high = StoredOutboxRow {
            attempt_count: i64::MAX,
            ..outbox_row()
        };
        assert_eq!(high.into_row().unwrap().attempt_count, u32::MAX);
    }

    #[test]
    fn bad_outbox_row_values_are_undecodable() {
        let bad = [
            StoredOutboxRow {
                stream: String::new(),
                ..outbox_row()
            },
            StoredOutboxRow {
                seq: 0,
                ..outbox_row()
            },
            StoredOutboxRow {
                event_type: String::new(),
                ..outbox_row()
            },
            StoredOutboxRow {
                status: "lost".into(),
                ..outbox_row()
            },
        ];
        for row in bad {
            let msg = storage_message(row.into_row());
            assert!(
                msg.starts_with("undecodable outbox row in the journal: "),
                "{msg}"
            );
        }
    }

    #[test]
    fn leases_convert_and_refuse_bad_values() {
        let good = StoredLease {
            owner: "w1".into(),
            epoch: 4,
            expires_at: 9_000,
        };
        let lease = good.clone().into_lease(&stream()).unwrap();
        assert_eq!(lease.stream, stream());
        assert_eq!(lease.owner.as_str(), "w1");
        assert_eq!(lease.epoch, 4);
        assert_eq!(lease.expires_at, Timestamp::from_millis(9_000));
        for bad in [
            StoredLease {
                owner: String::new(),
                ..good.clone()
            },
            StoredLease { epoch: -1, ..good },
        ] {
            let msg = storage_message(bad.into_lease(&stream()));
            assert!(
                msg.starts_with("undecodable stream lease in the journal: "),
                "{msg}"
            );
        }
    }

    #[test]
    fn watermarks_convert_and_refuse_bad_values() {
        let w = StoredWatermark::from(("orders-1".to_string(), 5, 1_234))
            .into_watermark()
            .unwrap();
        assert_eq!(w.stream, stream());
        assert_eq!((w.applied_through, w.expected_next), (5, 6));
        assert_eq!(w.updated_at, Timestamp::from_millis(1_234));
        for bad in [("orders-1".to_string(), -1, 0), (String::new(), 1, 0)] {
            let msg = storage_message(StoredWatermark::from(bad).into_watermark());
            assert!(
                msg.starts_with("undecodable watermark in the projection database: "),
                "{msg}"
            );
        }
    }

    fn run() -> StoredRun {
        StoredRun {
            id: 12,
            kind: RunKind::Rebuild.as_str().into(),
            projection: "balances".into(),
            state: RunState::Running.as_str().into(),
            until_position: Some(100),
            since_position: None,
            cursor_position: Some(40),
            processed: 40,
            last_stream: Some("orders-1".into()),
            last_seq: Some(3),
            error_code: None,
            error_message: None,
            cancel_requested: true,
            owner: "w1".into(),
            lease_expires_at: 3_000,
            created_at: 1_000,
            updated_at: 2_000,
        }
    }

    #[test]
    fn a_good_run_converts() {
        let r = run().into_record().unwrap();
        assert_eq!(r.id, 12);
        assert_eq!(r.kind, RunKind::Rebuild);
        assert_eq!(r.projection.as_str(), "balances");
        assert_eq!(r.state, RunState::Running);
        assert_eq!(r.until, Some(100));
        assert_eq!(r.processed, 40);
        assert_eq!(r.last_stream, Some(stream()));
        assert_eq!(r.last_seq.map(Seq::get), Some(3));
        assert!(r.cancel_requested);
        assert_eq!(r.owner.as_str(), "w1");
        assert_eq!(r.lease_expires_at, Timestamp::from_millis(3_000));
        assert_eq!(r.created_at, Timestamp::from_millis(1_000));
        assert_eq!(r.updated_at, Timestamp::from_millis(2_000));

        let empty = StoredRun {
            id: -1,
            until_position: Some(-5),
            processed: -2,
            last_stream: None,
            last_seq: None,
            ..run()
        }
        .into_record()
        .unwrap();
        assert_eq!((empty.id, empty.until, empty.processed), (0, Some(0), 0));
        assert_eq!((empty.last_stream, empty.last_seq), (None, None));
    }

    #[test]
    fn bad_run_values_name_the_column() {
        let cases = [
            (
                StoredRun {
                    kind: "sideways".into(),
                    ..run()
                },
                "kind",
            ),
            (
                StoredRun {
                    projection: String::new(),
                    ..run()
                },
                "projection",
            ),
            (
                StoredRun {
                    state: "lost".into(),
                    ..run()
                },
                "state",
            ),
            (
                StoredRun {
                    last_stream: Some(String::new()),
                    ..run()
                },
                "stream",
            ),
            (
                StoredRun {
                    last_seq: Some(0),
                    ..run()
                },
                "seq",
            ),
            (
                StoredRun {
                    owner: String::new(),
                    ..run()
                },
                "owner",
            ),
        ];
        for (bad, what) in cases {
            let msg = storage_message(bad.into_record());
            assert_eq!(msg, format!("run row has an invalid {what}"));
        }
    }

    struct Named(ProjectionName);

    #[async_trait]
    impl Projection<()> for Named {
        fn name(&self) -> &ProjectionName {
            &self.0
        }
        async fn apply(&self, _tx: &mut (), _event: &Event) -> Result<(), BoxError> {
            Ok(())
        }
        async fn reset(&self, _tx: &mut ()) -> Result<(), BoxError> {
            Ok(())
        }
        async fn digest(&self, _tx: &mut (), _out: &mut crate::DigestBuilder) -> Result<(), BoxError> {
            Ok(())
        }
    }

    fn named(name: &str) -> Arc<dyn Projection<()>> {
        Arc::new(Named(ProjectionName::new(name).unwrap()))
    }

    #[test]
    fn projection_names_must_be_unique() {
        assert!(validate_projection_names::<()>(&[]).is_ok());
        assert!(validate_projection_names(&[named("a"), named("b")]).is_ok());
        match validate_projection_names(&[named("a"), named("b"), named("a")]) {
            Err(Error::InvalidInput(m)) => assert_eq!(m, "projection `a` is listed twice"),
            other => panic!("expected InvalidInput, got {other:?}"),
        }
        assert_eq!(projection_names(&[named("a"), named("b")]), "`a`, `b`");
    }
}
