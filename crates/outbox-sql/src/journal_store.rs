//! [`SqlJournal`]: the journal's cold-path ports, implemented once over any
//! [`Database`] (the driver trait each SQL adapter implements).

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    ActivityCounts, ActivityLog, ActivitySeries, DeadLetters, FailureOutcome, Lease, LeaseAdmin, LeaseEntry,
    LeaseStore, Mode, OutboxInspector, OutboxRow, OutboxStatus, OutboxSummary, Partition, Result,
    RetryPolicy, Seq, SinkName, SinkStatus, SinkStore, SinkStream, SinkSummary, StreamId, WorkerId,
    WorkerInfo, WorkerRegistry,
};

use crate::{Database, Dialect, journal, sinks};

/// The cold-path journal ports on a journal database `D`: [`DeadLetters`],
/// [`OutboxInspector`], [`LeaseAdmin`], [`WorkerRegistry`], [`ActivityLog`],
/// [`LeaseStore`] and [`SinkStore`], each a statement or a short
/// transaction of [`journal`] or [`sinks`].
///
/// An adapter's journal type holds one and forwards these ports to it; where
/// a dialect has a faster path (SQLite's leases on its engine thread), the
/// adapter implements that port itself, with the same statements.
#[derive(Debug)]
pub struct SqlJournal<D: ?Sized> {
    db: Arc<D>,
}

impl<D: ?Sized> Clone for SqlJournal<D> {
    fn clone(&self) -> Self {
        SqlJournal {
            db: Arc::clone(&self.db),
        }
    }
}

impl<D: Database + ?Sized> SqlJournal<D> {
    /// The ports on `db`, with its dialect's clock.
    pub fn new(db: Arc<D>) -> Self {
        SqlJournal { db }
    }

    /// The database the statements run on.
    pub fn database(&self) -> &D {
        &self.db
    }

    /// The database's dialect.
    pub fn dialect(&self) -> &Dialect {
        self.db.dialect()
    }
}

impl<D: Database + ?Sized> DeadLetters for SqlJournal<D> {
    async fn requeue(&self, stream: &StreamId, seq: Seq) -> Result<OutboxRow> {
        journal::requeue(&*self.db, stream, seq).await
    }

    async fn requeue_dead(&self, limit: usize) -> Result<Vec<OutboxRow>> {
        journal::requeue_dead(&*self.db, limit).await
    }

    async fn retry(&self, stream: &StreamId, seq: Seq) -> Result<OutboxRow> {
        journal::retry(&*self.db, stream, seq).await
    }
}

impl<D: Database + ?Sized> OutboxInspector for SqlJournal<D> {
    async fn row(&self, stream: &StreamId, seq: Seq) -> Result<Option<OutboxRow>> {
        journal::row(&*self.db, stream, seq).await
    }

    async fn head(&self, stream: &StreamId) -> Result<Option<OutboxRow>> {
        journal::head(&*self.db, stream).await
    }

    async fn summary(&self) -> Result<OutboxSummary> {
        journal::summary(&*self.db).await
    }

    async fn list(&self, status: Option<OutboxStatus>, limit: usize) -> Result<Vec<OutboxRow>> {
        journal::list(&*self.db, status, limit).await
    }

    async fn lease(&self, stream: &StreamId) -> Result<Option<Lease>> {
        journal::lease(&*self.db, stream).await
    }

    async fn leases(&self, after: Option<&StreamId>, limit: usize) -> Result<Vec<LeaseEntry>> {
        journal::leases(&*self.db, after, limit).await
    }
}

impl<D: Database + ?Sized> LeaseAdmin for SqlJournal<D> {
    async fn break_lease(&self, stream: &StreamId) -> Result<Option<Lease>> {
        journal::break_lease(&*self.db, stream).await
    }
}

impl<D: Database + ?Sized> WorkerRegistry for SqlJournal<D> {
    async fn heartbeat(
        &self,
        id: &WorkerId,
        host: &str,
        pid: u32,
        mode: Mode,
        ttl: Duration,
    ) -> Result<WorkerInfo> {
        journal::heartbeat(&*self.db, id, host, pid, mode, ttl).await
    }

    async fn workers(&self) -> Result<Vec<WorkerInfo>> {
        journal::workers(&*self.db).await
    }

    async fn deregister(&self, id: &WorkerId) -> Result<bool> {
        journal::deregister(&*self.db, id).await
    }

    async fn prune(&self, grace: Duration) -> Result<u64> {
        journal::prune(&*self.db, grace).await
    }
}

impl<D: Database + ?Sized> ActivityLog for SqlJournal<D> {
    async fn record_activity(&self, id: &WorkerId, counts: ActivityCounts) -> Result<()> {
        journal::record_activity(&*self.db, id, counts).await
    }

    async fn activity(&self, minutes: u32) -> Result<ActivitySeries> {
        journal::activity(&*self.db, minutes).await
    }
}

/// The shared lease statements, one short transaction each (Postgres's
/// leases; SQLite runs the same statements on its engine thread).
impl<D: Database + ?Sized> LeaseStore for SqlJournal<D> {
    async fn acquire(&self, stream: &StreamId, owner: &WorkerId, ttl: Duration) -> Result<Option<Lease>> {
        journal::acquire(&*self.db, stream, owner, ttl).await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        journal::renew(&*self.db, lease, ttl).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        journal::release(&*self.db, lease).await
    }
}

impl<D: Database + ?Sized> SinkStore for SqlJournal<D> {
    async fn sink_states(&self, sink: &SinkName, streams: &[StreamId]) -> Result<Vec<SinkStream>> {
        sinks::sink_states(&*self.db, sink, streams).await
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
        sinks::advance_sink(&*self.db, sink, stream, partition, from, to, more).await
    }

    async fn hold_sink(
        &self,
        sink: &SinkName,
        stream: &StreamId,
        partition: Partition,
        at: u64,
    ) -> Result<SinkStream> {
        sinks::hold_sink(&*self.db, sink, stream, partition, at).await
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
        sinks::fail_sink(&*self.db, sink, stream, partition, seq, error, policy).await
    }

    async fn due_sink_streams(
        &self,
        sink: &SinkName,
        partitions: &[Partition],
        limit: usize,
    ) -> Result<Vec<SinkStream>> {
        sinks::due_sink_streams(&*self.db, sink, partitions, limit).await
    }

    async fn sink_streams(
        &self,
        sink: &SinkName,
        status: Option<SinkStatus>,
        limit: usize,
    ) -> Result<Vec<SinkStream>> {
        sinks::sink_streams(&*self.db, sink, status, limit).await
    }

    async fn requeue_sink(&self, sink: &SinkName, stream: &StreamId) -> Result<SinkStream> {
        sinks::requeue_sink(&*self.db, sink, stream).await
    }

    async fn sinks(&self) -> Result<Vec<SinkSummary>> {
        sinks::sinks(&*self.db).await
    }
}
