//! Events a projection passed over ([`OnError::Skip`](crate::OnError::Skip),
//! ADR 0032): the record of each is written in the transaction that moves
//! the projection's checkpoint past it, and removed in the transaction that
//! re-applies it, so a skipped event is applied at most once later and
//! never lost from view.

use std::future::Future;
use std::sync::Arc;

use serde::Serialize;

use crate::{Event, Projection, ProjectionName, ProjectionStore, Result, Seq, StreamId, Timestamp};

/// One event a projection passed over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkippedEvent {
    /// The projection that passed over it.
    pub projection: ProjectionName,
    /// The event's stream.
    pub stream: StreamId,
    /// The event's seq.
    pub seq: Seq,
    /// The applier's error that asked for the skip.
    pub error: String,
    /// When it was skipped, by the projection store's clock.
    pub skipped_at: Timestamp,
}

/// The skip records of a projection store: an optional capability (ADR
/// 0035). A store without it lists none and re-applies nothing (the
/// defaults), and its transactions keep no record
/// ([`ApplyTx::record_skip`](crate::spi::ApplyTx::record_skip)'s default):
/// the runtime then parks an event an applier asks to skip.
///
/// # Contract
/// `skipped`:
/// - Up to `limit` records (at most [`MAX_PAGE`](crate::MAX_PAGE);
///   `InvalidInput` at 0), of `projection` or of every projection, ordered
///   by (projection, stream, seq).
///
/// `reapply`:
/// - In ONE transaction: removes the record of (`projection`,
///   `event.stream`, `event.seq`) and runs the projection's applier on
///   `event`. Commits only when both succeed; the projection's checkpoint
///   does not move (it is already past the event).
/// - `Ok(false)`, nothing changed, when there is no such record (never
///   skipped, or re-applied already): two concurrent calls apply the event
///   at most once.
/// - An applier failure is [`Error::Apply`](crate::Error::Apply) naming the
///   event; nothing is committed and the record stays.
pub trait SkippedEvents: ProjectionStore {
    /// The skip records.
    fn skipped(
        &self,
        projection: Option<&ProjectionName>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SkippedEvent>>> + Send {
        let _ = (projection, limit);
        async { Ok(Vec::new()) }
    }

    /// Re-applies one skipped event to its projection, once.
    fn reapply(
        &self,
        event: &Event,
        projection: &Arc<dyn Projection<Self::Tx>>,
    ) -> impl Future<Output = Result<bool>> + Send {
        let _ = (event, projection);
        async {
            Err(crate::Error::Unsupported(
                "skips: this projection store keeps no skip records".into(),
            ))
        }
    }
}
