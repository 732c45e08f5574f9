//! What an adapter provides to run the conformance suite.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    AppendRequest, DeadLetters, EventJournal, GenerationStore, LeaseAdmin, LeaseStore, OutboxInspector,
    OutboxQueue, PartitionStore, Projection, ProjectionStore, RunStore, Seq, SinkStore, StreamId, ViewStore,
    WatermarkStore, WorkerRegistry,
};

/// The projection transaction handle of a harness.
pub type TxOf<H> = <<H as Harness>::Projections as ProjectionStore>::Tx;

/// An adapter under test.
///
/// Every method opens or inspects *real* stores of the adapter: the suite
/// never reaches behind the ports except through [`Harness::advance`] and
/// [`Harness::corrupt_payload`], which each adapter implements on its own
/// terms. The oracle is a backend-neutral projection and is read back through
/// the [`ViewStore`](outbox_core::ViewStore) port.
pub trait Harness: Send + Sync + Sized + 'static {
    /// The journal database (journal, outbox, leases and the worker registry).
    type Journal: EventJournal
        + OutboxQueue
        + DeadLetters
        + OutboxInspector
        + LeaseStore
        + LeaseAdmin
        + WorkerRegistry
        + PartitionStore
        + outbox_core::PartitionHandover
        + SinkStore
        + outbox_core::SinkFeed
        + outbox_core::ActivityLog
        + outbox_core::ConsumerRegistry
        + 'static;
    /// The projection database (checkpoints, watermarks, runs, projection tables).
    type Projections: ProjectionStore
        + WatermarkStore
        + ViewStore
        + RunStore
        + GenerationStore
        + outbox_core::SkippedEvents
        + 'static;
    /// Whatever identifies the underlying databases, to open more instances.
    type Context: Send + Sync + 'static;

    /// Fresh, empty, migrated stores.
    fn open(&self) -> impl Future<Output = Fixture<Self>> + Send;

    /// Another journal instance on the same database, as another process
    /// would open it (its own connections, its own in-process state).
    fn reopen_journal(&self, ctx: &Self::Context) -> impl Future<Output = Self::Journal> + Send;

    /// Another projection-store instance on the same database.
    fn reopen_projections(&self, ctx: &Self::Context) -> impl Future<Output = Self::Projections> + Send;

    /// Moves the stores' clock forward by `d`. The memory adapter advances its
    /// injected clock; SQL adapters add `d` to a test-only offset on the
    /// database clock (the stored times stay as they are).
    fn advance(&self, ctx: &Self::Context, d: Duration) -> impl Future<Output = ()> + Send;

    /// Appends `batch` (outbox rows on) in a transaction of its own that
    /// takes its global positions now and commits only when the returned
    /// [`HeldAppend`] is committed, as an application's transaction around
    /// an append would (Postgres: `begin` and `append_in`). Where no other
    /// append can run while one is open (SQLite's one writer), the harness
    /// appends at commit instead: positions then follow commit order by
    /// construction, which is what the commit-order checks rely on there.
    fn hold_append(
        &self,
        ctx: &Self::Context,
        batch: Vec<AppendRequest>,
    ) -> impl Future<Output = HeldAppend> + Send;

    /// Damages the stored payload of event `seq` of `stream` behind the store's
    /// back (flips one byte, leaving the stored hash as it was), as disk or
    /// operator damage would. Panics if there is no such event.
    fn corrupt_payload(
        &self,
        ctx: &Self::Context,
        stream: &StreamId,
        seq: Seq,
    ) -> impl Future<Output = ()> + Send;
}

/// An append whose transaction is open ([`Harness::hold_append`]).
pub struct HeldAppend(Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>);

impl HeldAppend {
    /// An append that `commit` completes.
    pub fn new<F>(commit: impl FnOnce() -> F + Send + 'static) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        HeldAppend(Box::new(move || Box::pin(commit())))
    }

    /// Commits the append (panics when it cannot).
    pub async fn commit(self) {
        (self.0)().await;
    }
}

/// Stores opened by [`Harness::open`].
pub struct Fixture<H: Harness> {
    /// The journal instance.
    pub journal: H::Journal,
    /// The projection-store instance.
    pub projections: H::Projections,
    /// Identifies the databases.
    pub ctx: H::Context,
}

/// A projection list of one, as [`ProjectionStore::apply`] takes it.
pub fn one<Tx: Send + 'static>(p: Arc<dyn Projection<Tx>>) -> Vec<Arc<dyn Projection<Tx>>> {
    vec![p]
}
