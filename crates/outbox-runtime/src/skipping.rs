//! Skipping an event for one projection, with a record, and re-applying it
//! later (ADR 0032, [`OnError::Skip`](outbox_core::OnError::Skip)).
//!
//! A skip is an ordinary apply of the one event, through the projection
//! store's compare-and-set, with the applier replaced by the writing of the
//! skip record: the checkpoint moves past the event and the record is
//! written in one transaction, exactly once, and the projection goes on with
//! the stream's next event. Re-applying takes the record and runs the real
//! applier in one transaction ([`SkippedEvents::reapply`]), so a skipped
//! event is applied at most once, whenever an operator asks.

use std::sync::Arc;

use outbox_core::{
    ApplyOutcome, BoxError, DigestBuilder, Error, Event, EventJournal, Projection, ProjectionName,
    ProjectionStore, Result, Seq, SkippedEvent, SkippedEvents, StreamId, async_trait, spi::ApplyTx,
};
use tracing::{info, warn};

use crate::outbox::{JournalBackend, Outbox, ProjectionBackend};

/// What [`Outbox::skip_event`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SkipOutcome {
    /// The checkpoint moved past the event; the record is written.
    Skipped,
    /// Nothing: the projection is not run here, or its checkpoint moved
    /// elsewhere meanwhile (past the event: another worker applied it).
    Elsewhere,
    /// Nothing: the projection store keeps no skip records.
    Unsupported,
}

/// Stands in for a projection for one apply of the event at `seq`: writes
/// its skip record instead of running its applier.
struct Skipping<Tx> {
    inner: Arc<dyn Projection<Tx>>,
    seq: Seq,
    error: String,
}

#[async_trait]
impl<Tx: ApplyTx + 'static> Projection<Tx> for Skipping<Tx> {
    fn name(&self) -> &ProjectionName {
        self.inner.name()
    }

    async fn apply(&self, tx: &mut Tx, event: &Event) -> Result<(), BoxError> {
        if event.seq != self.seq {
            return Err(format!("a skip of {} was handed {}/{}", self.seq, event.stream, event.seq).into());
        }
        tx.record_skip(self.inner.name(), &event.stream, event.seq, &self.error)
            .await?;
        Ok(())
    }

    async fn reset(&self, _: &mut Tx) -> Result<(), BoxError> {
        Err("a skip never resets a projection".into())
    }

    async fn digest(&self, _: &mut Tx, _: &mut DigestBuilder) -> Result<(), BoxError> {
        Err("a skip never digests a projection".into())
    }

    /// The skip record is the store's own statement: no user code runs.
    fn documents_only(&self) -> bool {
        true
    }
}

impl<J: JournalBackend, P: ProjectionBackend> Outbox<J, P> {
    /// Passes over `stream`/`seq` for projection `name`, recording `error`:
    /// its checkpoint moves past the event (compare-and-set from the event
    /// before) in the transaction that writes the record.
    pub(crate) async fn skip_event(
        &self,
        name: &ProjectionName,
        stream: &StreamId,
        seq: Seq,
        error: &str,
    ) -> Result<SkipOutcome> {
        let Some(p) = self.inner.projections.iter().find(|p| p.name() == name) else {
            return Ok(SkipOutcome::Elsewhere);
        };
        let event = self.inner.journal.load(stream, seq).await?;
        let skipping: Arc<dyn Projection<P::Tx>> = Arc::new(Skipping {
            inner: Arc::clone(p),
            seq,
            error: error.to_owned(),
        });
        let outcome = self
            .inner
            .store
            .apply(
                stream,
                std::slice::from_ref(&event),
                std::slice::from_ref(&skipping),
            )
            .await;
        match outcome {
            // Found applied already (another worker got past it): no skip.
            Ok(ApplyOutcome::Applied(r)) if r.applied == 0 => Ok(SkipOutcome::Elsewhere),
            Ok(ApplyOutcome::Applied(_)) => {
                warn!(projection = %name, stream = %stream, seq = %seq, error = %error, "event skipped for this projection (recorded; `outbox skipped` lists it, `outbox skipped reapply` applies it)");
                Ok(SkipOutcome::Skipped)
            }
            Ok(ApplyOutcome::Gap(_)) => Ok(SkipOutcome::Elsewhere),
            // A store without skip records (ADR 0035).
            Err(Error::Apply { source, .. })
                if matches!(source.downcast_ref::<Error>(), Some(Error::Unsupported(_))) =>
            {
                warn!(projection = %name, stream = %stream, seq = %seq, "the applier asks to skip the event, but this projection store keeps no skip records: it is parked instead");
                Ok(SkipOutcome::Unsupported)
            }
            Err(e) => Err(e),
        }
    }

    /// The events projections of this deployment skipped: of `projection`,
    /// or of every projection; at most `limit`, ordered by (projection,
    /// stream, seq).
    pub async fn skipped_events(
        &self,
        projection: Option<&ProjectionName>,
        limit: usize,
    ) -> Result<Vec<SkippedEvent>> {
        self.inner.store.skipped(projection, limit).await
    }

    /// Re-applies the event `stream`/`seq` that projection `projection`
    /// skipped: its applier runs on it now (after the stream's later
    /// events, which it has applied), and the record goes, in one
    /// transaction. `NotFound` when there is no such record (never skipped,
    /// or re-applied already); an applier failure is returned and the
    /// record stays. `InvalidInput` when this runtime does not run the
    /// projection.
    pub async fn reapply(&self, projection: &ProjectionName, stream: &StreamId, seq: Seq) -> Result<()> {
        let Some(p) = self.inner.projections.iter().find(|p| p.name() == projection) else {
            return Err(Error::invalid(format_args!(
                "projection `{projection}` is not run by this deployment: re-apply it from a binary that has it"
            )));
        };
        let event = self.inner.journal.load(stream, seq).await?;
        let done = self.inner.store.reapply(&event, p).await?;
        if !done {
            return Err(Error::NotFound(format!(
                "projection `{projection}` has no skipped event {stream}/{seq} (never skipped, or re-applied already)"
            )));
        }
        info!(projection = %projection, stream = %stream, seq = %seq, "skipped event re-applied");
        Ok(())
    }
}
