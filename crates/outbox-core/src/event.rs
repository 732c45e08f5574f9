//! Events: what callers append and what the journal gives back.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::{Error, EventType, Result, Seq, StreamId, Timestamp};

/// What an event means to projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Intent {
    /// Applied to every projection.
    Apply,
    /// Kept in the journal for audit only: it advances every projection's
    /// checkpoint without calling any applier, so it never stalls a stream.
    AuditOnly,
}

impl Intent {
    /// The stable name stored by SQL adapters.
    pub const fn as_str(self) -> &'static str {
        match self {
            Intent::Apply => "apply",
            Intent::AuditOnly => "audit_only",
        }
    }
}

impl std::str::FromStr for Intent {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "apply" => Ok(Intent::Apply),
            "audit_only" => Ok(Intent::AuditOnly),
            _ => Err(Error::invalid(format_args!("unknown intent {s:?}"))),
        }
    }
}

impl fmt::Display for Intent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// SHA-256 of an event's payload bytes, stored at append and checked on load.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PayloadHash(pub [u8; 32]);

impl PayloadHash {
    /// Hashes `payload`.
    pub fn of(payload: &[u8]) -> Self {
        PayloadHash(Sha256::digest(payload).into())
    }

    /// From stored bytes; `None` unless exactly 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(PayloadHash)
    }
}

impl fmt::Display for PayloadHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for PayloadHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PayloadHash({self})")
    }
}

impl Serialize for PayloadHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Caller-supplied metadata of an event being appended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewMetadata {
    /// Correlates every event caused by one request.
    pub correlation_id: Option<String>,
    /// The id of whatever caused this event.
    pub causation_id: Option<String>,
}

/// An event to append: its type, the intent resolved from the registry, and payload bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewEvent {
    /// The event type.
    pub event_type: EventType,
    /// The intent; use [`EventTypeRegistry::event`] to resolve it from the type.
    pub intent: Intent,
    /// Opaque payload bytes (JSON, protobuf, ...).
    pub payload: Vec<u8>,
    /// Correlation and causation ids.
    pub metadata: NewMetadata,
}

impl NewEvent {
    /// An event with no correlation or causation id.
    pub fn new(event_type: EventType, intent: Intent, payload: impl Into<Vec<u8>>) -> Self {
        NewEvent {
            event_type,
            intent,
            payload: payload.into(),
            metadata: NewMetadata::default(),
        }
    }

    /// Sets the correlation id.
    pub fn with_correlation_id(mut self, id: impl Into<String>) -> Self {
        self.metadata.correlation_id = Some(id.into());
        self
    }

    /// Sets the causation id.
    pub fn with_causation_id(mut self, id: impl Into<String>) -> Self {
        self.metadata.causation_id = Some(id.into());
        self
    }
}

/// Metadata of a recorded event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Metadata {
    /// When the journal committed the event, by the journal's clock.
    pub recorded_at: Timestamp,
    /// Correlation id, as appended.
    pub correlation_id: Option<String>,
    /// Causation id, as appended.
    pub causation_id: Option<String>,
}

/// A recorded event: the envelope every projection sees.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Event {
    /// The stream.
    pub stream: StreamId,
    /// Its position in the stream (1-based, contiguous).
    pub seq: Seq,
    /// Its position in the whole journal: unique and increasing in append
    /// order on one journal, but not a delivery order (projections order by
    /// stream and seq only).
    pub global_position: u64,
    /// The event type.
    pub event_type: EventType,
    /// The intent recorded at append.
    pub intent: Intent,
    /// The payload bytes.
    #[serde(skip)]
    pub payload: Vec<u8>,
    /// Recorded-at time and correlation and causation ids.
    pub metadata: Metadata,
    /// SHA-256 of `payload`.
    pub payload_hash: PayloadHash,
    /// The payload's decoded value, once a typed projection asked for it
    /// ([`Event::decoded`]): empty (`Decoded::default()`) when the event is
    /// read, shared by its clones, never compared or serialised.
    #[serde(skip)]
    pub decoded: crate::typed::Decoded,
}

impl Event {
    /// Checks the payload against its stored hash.
    pub fn verify(&self) -> Result<()> {
        if PayloadHash::of(&self.payload) != self.payload_hash {
            return Err(Error::Corrupt {
                stream: self.stream.clone(),
                seq: self.seq,
                reason: "payload does not match its stored hash".into(),
            });
        }
        Ok(())
    }
}

/// The version an append expects its stream to be at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExpectedVersion {
    /// Append whatever the stream's version.
    Any,
    /// The stream must have no events.
    NoStream,
    /// The stream's last seq must be exactly this (0 means no events).
    Exact(u64),
}

impl ExpectedVersion {
    /// Whether a stream currently at `actual` satisfies this expectation.
    pub fn matches(self, actual: u64) -> bool {
        match self {
            ExpectedVersion::Any => true,
            ExpectedVersion::NoStream => actual == 0,
            ExpectedVersion::Exact(v) => v == actual,
        }
    }

    /// The [`Error::Conflict`] for a stream found at `actual`.
    pub fn conflict(self, stream: &StreamId, actual: u64) -> Error {
        Error::Conflict {
            stream: stream.clone(),
            expected: match self {
                ExpectedVersion::Any => "any".into(),
                ExpectedVersion::NoStream => "no stream".into(),
                ExpectedVersion::Exact(v) => v.to_string(),
            },
            actual,
        }
    }
}

/// Append `events` to `stream`, expecting it at `expected`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendRequest {
    /// The stream.
    pub stream: StreamId,
    /// The expected version.
    pub expected: ExpectedVersion,
    /// The events, in order; at least one.
    pub events: Vec<NewEvent>,
}

impl AppendRequest {
    /// A request.
    pub fn new(stream: StreamId, expected: ExpectedVersion, events: Vec<NewEvent>) -> Self {
        AppendRequest {
            stream,
            expected,
            events,
        }
    }
}

/// How an append behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendOptions {
    enqueue: bool,
    max_payload_bytes: usize,
    max_batch_events: usize,
}

impl AppendOptions {
    /// Default payload limit: 1 MiB.
    pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1 << 20;
    /// Default limit on events in one append call: 10,000.
    pub const DEFAULT_MAX_BATCH_EVENTS: usize = 10_000;

    /// Appends that also insert an outbox row per event, in the same transaction.
    pub fn enqueue() -> Self {
        AppendOptions {
            enqueue: true,
            ..Self::journal_only()
        }
    }

    /// Appends that write only the journal (inline-apply-only mode).
    pub fn journal_only() -> Self {
        AppendOptions {
            enqueue: false,
            max_payload_bytes: Self::DEFAULT_MAX_PAYLOAD_BYTES,
            max_batch_events: Self::DEFAULT_MAX_BATCH_EVENTS,
        }
    }

    /// Sets the largest accepted payload.
    pub fn with_max_payload_bytes(mut self, n: usize) -> Self {
        self.max_payload_bytes = n;
        self
    }

    /// Sets the most events accepted in one append call.
    pub fn with_max_batch_events(mut self, n: usize) -> Self {
        self.max_batch_events = n;
        self
    }

    /// Whether outbox rows are inserted.
    pub fn enqueues(&self) -> bool {
        self.enqueue
    }

    /// Checks a batch against these options before anything is written.
    ///
    /// Every adapter calls this first, so every adapter rejects the same inputs
    /// with the same messages.
    pub fn validate(&self, batch: &[AppendRequest]) -> Result<()> {
        if batch.is_empty() {
            return Err(Error::invalid("append batch is empty"));
        }
        let mut total = 0usize;
        for req in batch {
            if req.events.is_empty() {
                return Err(Error::invalid(format_args!(
                    "append to stream {} has no events",
                    req.stream
                )));
            }
            total = total.saturating_add(req.events.len());
            for (i, e) in req.events.iter().enumerate() {
                if e.payload.len() > self.max_payload_bytes {
                    return Err(Error::invalid(format_args!(
                        "event {i} ({}) appended to stream {} has a {}-byte payload; the limit is {} bytes",
                        e.event_type,
                        req.stream,
                        e.payload.len(),
                        self.max_payload_bytes
                    )));
                }
            }
        }
        if total > self.max_batch_events {
            return Err(Error::invalid(format_args!(
                "append batch has {total} events; the limit is {}",
                self.max_batch_events
            )));
        }
        Ok(())
    }
}

impl Default for AppendOptions {
    /// [`AppendOptions::enqueue`].
    fn default() -> Self {
        Self::enqueue()
    }
}

/// What one [`AppendRequest`] produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Appended {
    /// The stream.
    pub stream: StreamId,
    /// The first seq written.
    pub first_seq: Seq,
    /// The last seq written (the stream's new version).
    pub last_seq: Seq,
    /// The global position of the first event.
    pub first_global_position: u64,
    /// When the journal recorded the events.
    pub recorded_at: Timestamp,
}

/// A stream and its version (its last seq; the journal lists only streams
/// with events, so at least 1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StreamVersion {
    /// The stream.
    pub stream: StreamId,
    /// Its last seq.
    pub version: u64,
}

/// Maps each event type to its [`Intent`]. Unknown types are an error, never a silent skip.
#[derive(Clone, Debug, Default)]
pub struct EventTypeRegistry {
    types: BTreeMap<EventType, Intent>,
}

impl EventTypeRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `event_type` with `intent`. Registering the same type twice
    /// with the same intent is a no-op; with a different intent, an error.
    pub fn register(&mut self, event_type: EventType, intent: Intent) -> Result<&mut Self> {
        match self.types.get(&event_type) {
            Some(existing) if *existing != intent => Err(Error::Config(format!(
                "event type `{event_type}` is already registered as {existing}, not {intent}"
            ))),
            _ => {
                self.types.insert(event_type, intent);
                Ok(self)
            }
        }
    }

    /// Registers an [`Intent::Apply`] type given by name.
    pub fn apply(&mut self, name: &str) -> Result<&mut Self> {
        self.register(EventType::new(name)?, Intent::Apply)
    }

    /// Registers an [`Intent::AuditOnly`] type given by name.
    pub fn audit_only(&mut self, name: &str) -> Result<&mut Self> {
        self.register(EventType::new(name)?, Intent::AuditOnly)
    }

    /// The intent of `event_type`.
    pub fn intent(&self, event_type: &EventType) -> Result<Intent> {
        self.types
            .get(event_type)
            .copied()
            .ok_or_else(|| Error::UnknownEventType(event_type.to_string()))
    }

    /// A [`NewEvent`] of type `name` with its registered intent.
    pub fn event(&self, name: &str, payload: impl Into<Vec<u8>>) -> Result<NewEvent> {
        let event_type = EventType::new(name)?;
        let intent = self.intent(&event_type)?;
        Ok(NewEvent::new(event_type, intent, payload))
    }

    /// Every registered type, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&EventType, Intent)> {
        self.types.iter().map(|(t, i)| (t, *i))
    }

    /// How many types are registered.
    pub fn len(&self) -> usize {
        self.types.len()
    }

    /// Whether no type is registered.
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(n: usize) -> NewEvent {
        NewEvent::new(EventType::new("t").unwrap(), Intent::Apply, vec![0u8; n])
    }

    #[test]
    fn registry_rejects_unknown_and_conflicting_types() {
        let mut r = EventTypeRegistry::new();
        r.apply("a").unwrap().audit_only("b").unwrap();
        assert_eq!(r.intent(&EventType::new("a").unwrap()).unwrap(), Intent::Apply);
        assert_eq!(r.event("b", b"x".to_vec()).unwrap().intent, Intent::AuditOnly);
        assert!(matches!(r.event("c", vec![]), Err(Error::UnknownEventType(t)) if t == "c"));
        assert!(r.apply("a").is_ok());
        assert!(matches!(r.audit_only("a"), Err(Error::Config(_))));
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn validate_rejects_empty_and_oversized() {
        let s = StreamId::new("s").unwrap();
        let o = AppendOptions::enqueue()
            .with_max_payload_bytes(4)
            .with_max_batch_events(3);
        assert!(o.validate(&[]).is_err());
        assert!(
            o.validate(&[AppendRequest::new(s.clone(), ExpectedVersion::Any, vec![])])
                .is_err()
        );
        let big = o.validate(&[AppendRequest::new(s.clone(), ExpectedVersion::Any, vec![ev(5)])]);
        assert!(big.unwrap_err().to_string().contains("5-byte payload"));
        let many = vec![AppendRequest::new(s.clone(), ExpectedVersion::Any, vec![ev(1), ev(1)]); 2];
        assert!(o.validate(&many).unwrap_err().to_string().contains("4 events"));
        assert!(
            o.validate(&[AppendRequest::new(s, ExpectedVersion::Any, vec![ev(4)])])
                .is_ok()
        );
    }

    #[test]
    fn expected_version_matching() {
        assert!(ExpectedVersion::Any.matches(5));
        assert!(ExpectedVersion::NoStream.matches(0));
        assert!(!ExpectedVersion::NoStream.matches(1));
        assert!(ExpectedVersion::Exact(3).matches(3));
        assert!(!ExpectedVersion::Exact(3).matches(2));
    }

    #[test]
    fn hash_detects_tampering() {
        let payload = b"hello".to_vec();
        let mut e = Event {
            stream: StreamId::new("s").unwrap(),
            seq: Seq::FIRST,
            global_position: 1,
            event_type: EventType::new("t").unwrap(),
            intent: Intent::Apply,
            payload_hash: PayloadHash::of(&payload),
            decoded: Default::default(),
            payload,
            metadata: Metadata {
                recorded_at: Timestamp::EPOCH,
                correlation_id: None,
                causation_id: None,
            },
        };
        assert!(e.verify().is_ok());
        e.payload.push(b'!');
        assert!(matches!(e.verify(), Err(Error::Corrupt { .. })));
        assert_eq!(PayloadHash::of(b"").to_string().len(), 64);
    }
}

/// Where each request of an append batch lands, checked before anything is
/// written ([`plan_append`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendPlan<'a> {
    /// The first seq of each request, in batch order.
    pub firsts: Vec<u64>,
    /// Each stream's version (last seq) before the batch, in
    /// first-appearance order.
    pub before: Vec<(&'a StreamId, u64)>,
    /// Each stream's version after the batch, same order.
    pub after: Vec<(&'a StreamId, u64)>,
}

/// Checks every request's expected version against its stream's version
/// (from `version`, asked once per stream; later requests for a stream see the
/// earlier ones), in batch order: the first mismatch is the batch's
/// [`Error::Conflict`], and a stream pushed past [`Seq::MAX`] is invalid
/// input. Every adapter's append runs this before writing, so all agree.
pub fn plan_append<'a>(
    batch: &'a [AppendRequest],
    mut version: impl FnMut(&StreamId) -> u64,
) -> Result<AppendPlan<'a>> {
    let mut plan = AppendPlan {
        firsts: Vec::with_capacity(batch.len()),
        before: Vec::new(),
        after: Vec::new(),
    };
    let mut index: std::collections::HashMap<&StreamId, usize> = std::collections::HashMap::new();
    for req in batch {
        let at = *index.entry(&req.stream).or_insert_with(|| {
            let v = version(&req.stream);
            plan.before.push((&req.stream, v));
            plan.after.push((&req.stream, v));
            plan.after.len() - 1
        });
        let actual = plan.after[at].1;
        if !req.expected.matches(actual) {
            return Err(req.expected.conflict(&req.stream, actual));
        }
        let next = actual + req.events.len() as u64;
        if next > Seq::MAX.get() {
            return Err(Error::invalid(format_args!(
                "stream {} would exceed the largest seq",
                req.stream
            )));
        }
        plan.firsts.push(actual + 1);
        plan.after[at].1 = next;
    }
    Ok(plan)
}
