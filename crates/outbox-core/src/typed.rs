//! Typed events: an application declares its events once as Rust values
//! ([`DomainEvent`], usually an enum with one variant per event type),
//! appends those values, derives its [`EventTypeRegistry`] from them, and
//! writes projections that receive the decoded value
//! ([`TypedViewProjection`], registered with [`typed`]). An event is decoded
//! at most once per apply however many typed projections read it: the
//! value is kept on the [`Event`] ([`Event::decoded`]).
//!
//! The encoding is the type's own ([`DomainEvent::encode`] and
//! [`DomainEvent::decode`]); [`json`] gives the usual serde JSON in one
//! line each. The byte-level API ([`NewEvent`], [`ViewProjection`]) stays
//! for code that needs it.
//!
//! ```
//! use outbox_core::typed::{DomainEvent, EventKind, json};
//! use outbox_core::{BoxError, EventTypeRegistry};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize)]
//! #[serde(tag = "type", rename_all = "snake_case")]
//! enum ShopEvent {
//!     OrderPlaced { order: String, cents: i64 },
//!     NoteAdded { text: String },
//! }
//!
//! impl DomainEvent for ShopEvent {
//!     const KINDS: &'static [EventKind] = &[
//!         EventKind::apply("order_placed"),
//!         EventKind::audit_only("note_added"),
//!     ];
//!     fn kind(&self) -> EventKind {
//!         match self {
//!             ShopEvent::OrderPlaced { .. } => Self::KINDS[0],
//!             ShopEvent::NoteAdded { .. } => Self::KINDS[1],
//!         }
//!     }
//!     fn encode(&self) -> Result<Vec<u8>, BoxError> {
//!         json::encode(self)
//!     }
//!     fn decode(_event_type: &str, payload: &[u8]) -> Result<Self, BoxError> {
//!         json::decode(payload)
//!     }
//! }
//!
//! let types = EventTypeRegistry::of::<ShopEvent>().unwrap();
//! assert_eq!(types.len(), 2);
//! let new = ShopEvent::OrderPlaced { order: "o-1".into(), cents: 250 }.to_new_event().unwrap();
//! assert_eq!(new.event_type.as_str(), "order_placed");
//! ```

use std::any::{Any, TypeId};
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;

use crate::{
    BoxError, Error, Event, EventType, EventTypeRegistry, Intent, NewEvent, NewMetadata, ProjectionName,
    Result, ViewProjection, ViewTx,
};

/// One kind of event a [`DomainEvent`] type holds: the type name stored
/// with each event and its intent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventKind {
    /// The stored type name (a valid [`EventType`]).
    pub name: &'static str,
    /// Whether projections apply it or it is only recorded.
    pub intent: Intent,
}

impl EventKind {
    /// A kind that projections apply.
    pub const fn apply(name: &'static str) -> Self {
        EventKind {
            name,
            intent: Intent::Apply,
        }
    }

    /// A kind that is only recorded (projections never see it; it moves
    /// their checkpoints).
    pub const fn audit_only(name: &'static str) -> Self {
        EventKind {
            name,
            intent: Intent::AuditOnly,
        }
    }
}

/// An application's events as Rust values.
///
/// `KINDS` lists every event type the values can have; [`kind`](Self::kind)
/// says which one a value is. `encode` and `decode` are the payload's
/// encoding: [`json::encode`] and [`json::decode`] for serde JSON.
pub trait DomainEvent: Send + Sync + Sized + 'static {
    /// Every kind of event this type holds, each name once.
    const KINDS: &'static [EventKind];

    /// This value's kind (one of [`KINDS`](Self::KINDS)).
    fn kind(&self) -> EventKind;

    /// This value's payload.
    fn encode(&self) -> std::result::Result<Vec<u8>, BoxError>;

    /// The value of a stored event of type `event_type` with `payload`.
    fn decode(event_type: &str, payload: &[u8]) -> std::result::Result<Self, BoxError>;

    /// This value's correlation and causation ids, appended with it (by
    /// default none: a value that carries them, a command's id say, returns
    /// them here).
    fn metadata(&self) -> NewMetadata {
        NewMetadata::default()
    }

    /// This value as an event to append: type, intent, payload and
    /// [`metadata`](Self::metadata). Its kind must be among
    /// [`KINDS`](Self::KINDS).
    fn to_new_event(&self) -> Result<NewEvent> {
        let kind = self.kind();
        if !Self::KINDS.contains(&kind) {
            return Err(Error::invalid(format_args!(
                "event kind `{}` is not among the KINDS of {}",
                kind.name,
                std::any::type_name::<Self>()
            )));
        }
        let payload = self
            .encode()
            .map_err(|e| Error::invalid(format_args!("encoding a `{}` event: {e}", kind.name)))?;
        let mut event = NewEvent::new(EventType::new(kind.name)?, kind.intent, payload);
        event.metadata = self.metadata();
        Ok(event)
    }
}

impl EventTypeRegistry {
    /// The registry of `E`'s kinds. Two kinds with one name and different
    /// intents are a [`Error::Config`].
    pub fn of<E: DomainEvent>() -> Result<Self> {
        let mut r = EventTypeRegistry::new();
        r.add::<E>()?;
        Ok(r)
    }

    /// Registers `E`'s kinds beside those already registered.
    pub fn add<E: DomainEvent>(&mut self) -> Result<&mut Self> {
        for k in E::KINDS {
            self.register(EventType::new(k.name)?, k.intent)?;
        }
        Ok(self)
    }
}

/// The decoded value an [`Event`] carries for the typed projections that
/// read it (decoded by the first one, shared by the others and by the
/// event's clones). Not part of the event's identity: it compares equal
/// always, is never serialised, and starts empty (`Default`).
#[derive(Clone, Default)]
pub struct Decoded(Arc<OnceLock<(TypeId, Arc<dyn Any + Send + Sync>)>>);

impl std::fmt::Debug for Decoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "Decoded(..)"
        } else {
            "Decoded(empty)"
        })
    }
}

impl PartialEq for Decoded {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Decoded {}

impl Event {
    /// The event's value as `E`, decoded once and kept on the event (a
    /// second type decodes each time). An event whose type is not among
    /// `E`'s kinds, or whose payload does not decode, is an error naming
    /// the event: for a projection, a failure of this event.
    pub fn decoded<E: DomainEvent>(&self) -> Result<Arc<E>> {
        if let Some((id, value)) = self.decoded.0.get()
            && *id == TypeId::of::<E>()
            && let Ok(v) = Arc::clone(value).downcast::<E>()
        {
            return Ok(v);
        }
        let name = self.event_type.as_str();
        if !E::KINDS.iter().any(|k| k.name == name) {
            return Err(Error::invalid(format_args!(
                "event {}/{} has type `{name}`, which is not one of {}",
                self.stream,
                self.seq,
                std::any::type_name::<E>()
            )));
        }
        let value = Arc::new(E::decode(name, &self.payload).map_err(|e| {
            Error::invalid(format_args!(
                "event {}/{} of type `{name}` does not decode as {}: {e}",
                self.stream,
                self.seq,
                std::any::type_name::<E>()
            ))
        })?);
        let shared: Arc<dyn Any + Send + Sync> = value.clone();
        let _ = self.decoded.0.set((TypeId::of::<E>(), shared));
        Ok(value)
    }
}

/// A view projection that receives the decoded value of each event it
/// applies; register it with `.view(typed(p))`.
#[async_trait]
pub trait TypedViewProjection<E: DomainEvent>: Send + Sync + 'static {
    /// The projection's name (see [`ViewProjection::name`]).
    fn name(&self) -> &ProjectionName;

    /// The version of its code (see [`ViewProjection::version`]).
    fn version(&self) -> u32 {
        1
    }

    /// Applies one event, given with its decoded value (never an
    /// audit-only one).
    async fn apply(
        &self,
        view: &mut ViewTx<'_>,
        event: &Event,
        value: &E,
    ) -> std::result::Result<(), BoxError>;
}

/// `projection` as a [`ViewProjection`]: each event is decoded as `E`
/// ([`Event::decoded`], once per event for every typed projection) before
/// `projection` sees it; an event that does not decode fails this
/// projection's apply with an error naming it.
pub fn typed<E: DomainEvent, T: TypedViewProjection<E>>(projection: T) -> Typed<E, T> {
    Typed(projection, PhantomData)
}

/// What [`typed`] returns.
pub struct Typed<E, T>(T, PhantomData<fn() -> E>);

#[async_trait]
impl<E: DomainEvent, T: TypedViewProjection<E>> ViewProjection for Typed<E, T> {
    fn name(&self) -> &ProjectionName {
        self.0.name()
    }

    fn version(&self) -> u32 {
        self.0.version()
    }

    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> std::result::Result<(), BoxError> {
        let value = event.decoded::<E>()?;
        self.0.apply(view, event, &value).await
    }
}

/// serde JSON as a [`DomainEvent`]'s encoding.
pub mod json {
    use crate::BoxError;

    /// `value` as JSON bytes.
    pub fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(value)?)
    }

    /// A value from JSON bytes.
    pub fn decode<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(payload)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Metadata, PayloadHash, Seq, StreamId, Timestamp};
    use std::sync::atomic::{AtomicUsize, Ordering};

    static DECODES: AtomicUsize = AtomicUsize::new(0);

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Shop {
        Placed { cents: i64 },
        Noted { text: String },
    }

    impl DomainEvent for Shop {
        const KINDS: &'static [EventKind] = &[EventKind::apply("placed"), EventKind::audit_only("noted")];
        fn kind(&self) -> EventKind {
            match self {
                Shop::Placed { .. } => Self::KINDS[0],
                Shop::Noted { .. } => Self::KINDS[1],
            }
        }
        fn encode(&self) -> std::result::Result<Vec<u8>, BoxError> {
            json::encode(self)
        }
        fn decode(_: &str, payload: &[u8]) -> std::result::Result<Self, BoxError> {
            DECODES.fetch_add(1, Ordering::SeqCst);
            json::decode(payload)
        }
    }

    fn stored(new: &NewEvent) -> Event {
        Event {
            stream: StreamId::new("s").unwrap(),
            seq: Seq::FIRST,
            global_position: 1,
            event_type: new.event_type.clone(),
            intent: new.intent,
            payload: new.payload.clone(),
            metadata: Metadata {
                recorded_at: Timestamp::from_millis(0),
                correlation_id: None,
                causation_id: None,
            },
            payload_hash: PayloadHash::of(&new.payload),
            decoded: Decoded::default(),
        }
    }

    /// A type whose values carry the command that caused them.
    struct Caused(&'static str);

    impl DomainEvent for Caused {
        const KINDS: &'static [EventKind] = &[EventKind::apply("caused")];
        fn kind(&self) -> EventKind {
            Self::KINDS[0]
        }
        fn encode(&self) -> std::result::Result<Vec<u8>, BoxError> {
            Ok(Vec::new())
        }
        fn decode(_: &str, _: &[u8]) -> std::result::Result<Self, BoxError> {
            Ok(Caused("?"))
        }
        fn metadata(&self) -> NewMetadata {
            NewMetadata {
                correlation_id: Some("request-1".into()),
                causation_id: Some(self.0.into()),
            }
        }
    }

    #[test]
    fn a_value_s_metadata_is_appended_with_it() {
        let new = Caused("command-7").to_new_event().unwrap();
        assert_eq!(new.metadata.correlation_id.as_deref(), Some("request-1"));
        assert_eq!(new.metadata.causation_id.as_deref(), Some("command-7"));
        // By default, none.
        let plain = Shop::Noted { text: "x".into() }.to_new_event().unwrap();
        assert_eq!(plain.metadata, NewMetadata::default());
    }

    #[test]
    fn a_value_round_trips_and_is_decoded_once_for_every_reader() {
        let new = Shop::Placed { cents: 250 }.to_new_event().unwrap();
        assert_eq!((new.event_type.as_str(), new.intent), ("placed", Intent::Apply));
        let e = stored(&new);
        let before = DECODES.load(Ordering::SeqCst);
        let a = e.decoded::<Shop>().unwrap();
        let b = e.clone().decoded::<Shop>().unwrap();
        assert_eq!(*a, Shop::Placed { cents: 250 });
        assert!(Arc::ptr_eq(&a, &b), "the clone shares the decoded value");
        assert_eq!(DECODES.load(Ordering::SeqCst) - before, 1, "decoded once");
        let registry = EventTypeRegistry::of::<Shop>().unwrap();
        assert_eq!(
            registry.intent(&EventType::new("noted").unwrap()).unwrap(),
            Intent::AuditOnly
        );
    }

    #[test]
    fn an_undecodable_or_foreign_event_is_an_error_naming_it() {
        let mut e = stored(&Shop::Placed { cents: 1 }.to_new_event().unwrap());
        e.payload = b"{not json".to_vec();
        let err = e.decoded::<Shop>().unwrap_err().to_string();
        assert!(err.contains("s/1") && err.contains("does not decode"), "{err}");
        let mut other = stored(&Shop::Placed { cents: 1 }.to_new_event().unwrap());
        other.event_type = EventType::new("shipped").unwrap();
        let err = other.decoded::<Shop>().unwrap_err().to_string();
        assert!(err.contains("`shipped`") && err.contains("not one of"), "{err}");
    }
}
