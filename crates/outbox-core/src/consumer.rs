//! Consumers the database knows (ADR 0032): every projection and sink a
//! deployment runs is registered in the journal database, so that a worker
//! that does not run one still leaves it the work it completes, and an
//! operator sees a consumer no live worker runs.

use std::fmt;
use std::future::Future;
use std::str::FromStr;

use serde::Serialize;

use crate::{Error, Result, SinkName, Timestamp, WorkerId};

/// The longest code version a consumer is registered with, in bytes.
pub const MAX_CODE_VERSION_LEN: usize = 64;

/// What a consumer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsumerKind {
    /// A projection (its key is [`projection_consumer`](crate::projection_consumer)).
    Projection,
    /// A sink (its key is its name).
    Sink,
}

impl ConsumerKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ConsumerKind::Projection => "projection",
            ConsumerKind::Sink => "sink",
        }
    }
}

impl fmt::Display for ConsumerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ConsumerKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "projection" => Ok(ConsumerKind::Projection),
            "sink" => Ok(ConsumerKind::Sink),
            other => Err(Error::invalid(format!(
                "`{other}` is not a consumer kind (projection, sink)"
            ))),
        }
    }
}

/// One registered consumer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConsumerInfo {
    /// Its key: `projection:NAME` for a projection, the name for a sink.
    pub key: SinkName,
    /// What it is.
    pub kind: ConsumerKind,
    /// The code version the application last registered it with (empty
    /// when it sets none).
    pub version: String,
    /// When a worker first registered it, by the store's clock.
    pub first_seen: Timestamp,
    /// When a worker last registered it (at its start and every heartbeat).
    pub last_seen: Timestamp,
    /// The worker that did.
    pub last_worker: WorkerId,
    /// Paused (by an operator, or by its error policy `stop`): no worker
    /// applies it, and every worker leaves it a state on each stream whose
    /// rows it completes, so its backlog is kept and reported.
    pub paused: bool,
}

impl ConsumerInfo {
    /// The projection's name, for a projection.
    pub fn projection(&self) -> Option<&str> {
        crate::consumer_projection(&self.key)
    }

    /// Whether a worker registered it within `grace` of `now`: one runs it.
    pub fn live(&self, now: Timestamp, grace: std::time::Duration) -> bool {
        self.last_seen.as_millis() + i64::try_from(grace.as_millis()).unwrap_or(i64::MAX) >= now.as_millis()
    }
}

/// `InvalidInput` unless `version` is a code version a consumer may carry:
/// at most [`MAX_CODE_VERSION_LEN`] bytes, no control characters.
pub fn validate_code_version(version: &str) -> Result<()> {
    if version.len() > MAX_CODE_VERSION_LEN || version.chars().any(char::is_control) {
        return Err(Error::invalid(format!(
            "a code version is at most {MAX_CODE_VERSION_LEN} bytes without control characters: {version:?}"
        )));
    }
    Ok(())
}

/// The journal database's registry of consumers.
///
/// # Contract
/// - `register_consumers(consumers, version, worker)` upserts each (key,
///   kind): `first_seen` is set once, `last_seen` to the store's clock now,
///   `version` and `last_worker` to those given. An invalid version is
///   `InvalidInput` and changes nothing.
/// - `consumers()` lists every registered consumer by key.
/// - `set_paused(key, paused)` sets a registered consumer's flag and
///   returns whether it changed; `NotFound` when it is not registered.
///   Registering never changes it.
/// - `retire_consumer(key)` removes the consumer and every per-stream state
///   kept under its key ([`SinkStore`](crate::SinkStore)) in one
///   transaction; `true` when it was registered or had state. A worker that
///   still runs it registers it again at its next heartbeat.
pub trait ConsumerRegistry: Send + Sync {
    /// Registers (or refreshes) `consumers` as run by `worker`.
    fn register_consumers(
        &self,
        consumers: &[(SinkName, ConsumerKind)],
        version: &str,
        worker: &WorkerId,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Every registered consumer, by key.
    fn consumers(&self) -> impl Future<Output = Result<Vec<ConsumerInfo>>> + Send;

    /// Pauses or resumes a registered consumer.
    fn set_paused(&self, key: &SinkName, paused: bool) -> impl Future<Output = Result<bool>> + Send;

    /// Removes a consumer and its per-stream states.
    fn retire_consumer(&self, key: &SinkName) -> impl Future<Output = Result<bool>> + Send;
}

/// What an applier's error asks for (ADR 0032), carried by an
/// [`ApplyError`]; a plain error takes the projection's registered policy
/// (retry, unless the application set another).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Retried with backoff, dead at the threshold (the default).
    #[default]
    Retry,
    /// Dead for this projection on this stream at once: retrying cannot help
    /// (a payload it cannot decode, a rule it refuses); `requeue` after the fix.
    Park,
    /// The projection paused for every stream (the failure recorded), until
    /// an operator resumes it: it must not go on at all.
    Stop,
    /// The event passed over for this projection, with a record kept in the
    /// projection store (in the transaction that moves its checkpoint past
    /// it): the projection goes on with the stream's next event, and the
    /// skipped one is listed and can be re-applied once, later.
    Skip,
}

impl OnError {
    /// The name shown.
    pub fn as_str(self) -> &'static str {
        match self {
            OnError::Retry => "retry",
            OnError::Park => "park",
            OnError::Stop => "stop",
            OnError::Skip => "skip",
        }
    }
}

impl fmt::Display for OnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An applier's error with its decision ([`OnError`]): return it (as a
/// [`BoxError`](crate::BoxError)) from an applier to park the event at once,
/// skip it with a record, or stop the projection instead of retrying.
///
/// ```
/// use outbox_core::{ApplyError, BoxError};
/// fn decode(payload: &[u8]) -> Result<u64, BoxError> {
///     std::str::from_utf8(payload)
///         .ok()
///         .and_then(|s| s.parse().ok())
///         .ok_or_else(|| ApplyError::park("not a number: retrying will not help").into())
/// }
/// assert!(decode(b"x").is_err());
/// ```
#[derive(Debug)]
pub struct ApplyError {
    decision: OnError,
    source: crate::BoxError,
}

impl ApplyError {
    /// Retry with backoff (what a plain error gets by default).
    pub fn retry(source: impl Into<crate::BoxError>) -> Self {
        ApplyError {
            decision: OnError::Retry,
            source: source.into(),
        }
    }

    /// Dead for this projection on this stream at once.
    pub fn park(source: impl Into<crate::BoxError>) -> Self {
        ApplyError {
            decision: OnError::Park,
            source: source.into(),
        }
    }

    /// Pause the projection for every stream.
    pub fn stop(source: impl Into<crate::BoxError>) -> Self {
        ApplyError {
            decision: OnError::Stop,
            source: source.into(),
        }
    }

    /// Pass over the event for this projection, keeping a record of it.
    pub fn skip(source: impl Into<crate::BoxError>) -> Self {
        ApplyError {
            decision: OnError::Skip,
            source: source.into(),
        }
    }

    /// The decision.
    pub fn decision(&self) -> OnError {
        self.decision
    }

    /// The decision `error` carries, if it is (or wraps, at its top) an
    /// [`ApplyError`].
    pub fn decision_of(error: &(dyn std::error::Error + 'static)) -> Option<OnError> {
        error.downcast_ref::<ApplyError>().map(ApplyError::decision)
    }
}

impl fmt::Display for ApplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl std::error::Error for ApplyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}
