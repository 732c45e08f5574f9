//! Partition leasing (ADR 0022): which partitions this worker owns.
//!
//! At start and at every heartbeat, a running worker reads the live workers
//! of its mode from the registry, computes its share of the partitions
//! ([`assigned_to`]: rendezvous hashing, the same answer in every process),
//! and brings its partition leases to that share in one journal transaction
//! ([`PartitionStore::sync_partitions`]): it renews what it keeps, releases
//! what it no longer owns and acquires what is free; a partition its
//! previous owner has not released yet is acquired at a later sync (a quick
//! one follows while any is waiting), or once that owner's lease expires
//! when it died. The worker's sweeps then claim only inside the partitions
//! it holds ([`PartitionStore::claim_partitioned`]), fenced by the
//! partition lease's epoch; the checkpoint compare-and-set stays the
//! safety net.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_core::{
    Partition, PartitionHandover, PartitionStore, PartitionSync, Result, WorkerId, WorkerRegistry,
    assigned_to,
};
use tracing::{info, warn};

use crate::config::heartbeat_ttl;
use crate::outbox::{JournalBackend, Outbox, ProjectionBackend};

/// This runtime's partition leasing state.
#[derive(Debug, Default)]
pub(crate) struct PartitionState {
    /// Whether the running worker claims inside its partitions.
    active: AtomicBool,
    /// The partitions held after the last synchronisation.
    held: Mutex<Vec<Partition>>,
    /// The live workers of this mode the last synchronisation shared the
    /// partitions among, sorted.
    members: Mutex<Vec<WorkerId>>,
}

impl PartitionState {
    pub(crate) fn active(&self) -> bool {
        self.active.load(Ordering::SeqCst)
    }

    pub(crate) fn set_active(&self, on: bool) {
        self.active.store(on, Ordering::SeqCst);
    }

    /// The partitions held after the last synchronisation.
    pub(crate) fn held(&self) -> Vec<Partition> {
        self.held.lock().map(|h| h.clone()).unwrap_or_default()
    }

    fn set_held(&self, held: Vec<Partition>) {
        if let Ok(mut h) = self.held.lock() {
            *h = held;
        }
    }

    fn members(&self) -> Vec<WorkerId> {
        self.members.lock().map(|m| m.clone()).unwrap_or_default()
    }

    fn set_members(&self, members: Vec<WorkerId>) {
        if let Ok(mut m) = self.members.lock() {
            *m = members;
        }
    }
}

impl<J: JournalBackend, P: ProjectionBackend> Outbox<J, P> {
    /// How long a partition lease lasts without renewal: the registry's
    /// heartbeat TTL, so a dead worker's partitions are taken over when its
    /// registry entry expires.
    pub(crate) fn partition_ttl(&self) -> Duration {
        heartbeat_ttl(self.config().heartbeat_interval)
    }

    /// How long this worker's claims hold their streams: the partition
    /// lease TTL under partition leasing, the stream lease TTL otherwise.
    pub(crate) fn claim_ttl(&self) -> Duration {
        if self.inner.partitions.active() {
            self.partition_ttl()
        } else {
            self.config().lease_ttl
        }
    }

    /// The partitions this worker holds after its last synchronisation
    /// (empty unless a worker with partition leasing runs).
    pub fn held_partitions(&self) -> Vec<Partition> {
        self.inner.partitions.held()
    }

    /// One synchronisation: the live workers of this mode, this worker's
    /// share of the partitions, and the leases brought to it. Wakes the
    /// worker when partitions were acquired.
    pub(crate) async fn sync_partitions(&self) -> Result<PartitionSync> {
        let live = self.live_workers().await?;
        self.sync_among(live, false).await
    }

    /// The first synchronisation of a starting worker: its share among the
    /// live workers of its mode, taken at once, including the partitions
    /// those workers still hold ([`outbox_core::PartitionHandover`]): each of them
    /// computes the same assignment and would release them at its next look
    /// at the registry; the handover makes that release now, so a joining
    /// worker never starts with an empty share while its partitions have
    /// live holders. A partition held by anyone else (a worker of another
    /// mode, one whose registry entry expired) is still waited for.
    pub(crate) async fn join_partitions(&self) -> Result<PartitionSync> {
        let live = self.live_workers().await?;
        self.sync_among(live, true).await
    }

    /// [`join_partitions`](Self::join_partitions), a failure logged (the
    /// next look synchronises); returns whether wanted partitions are
    /// still held by others.
    pub(crate) async fn join_partitions_or_warn(&self) -> bool {
        still_waiting(self.join_partitions().await)
    }

    /// [`sync_partitions`](Self::sync_partitions) with the live workers
    /// already read; `take` hands over the wanted partitions they hold.
    async fn sync_among(&self, live: Vec<WorkerId>, take: bool) -> Result<PartitionSync> {
        let me = self.worker_id();
        let wanted = assigned_to(me, &live, self.inner.journal.partitioning().count());
        let from: Vec<WorkerId> = if take {
            live.iter().filter(|w| *w != me).cloned().collect()
        } else {
            Vec::new()
        };
        let sync = if from.is_empty() {
            self.inner
                .journal
                .sync_partitions(me, &wanted, self.partition_ttl())
                .await?
        } else {
            self.inner
                .journal
                .sync_partitions_taking(me, &wanted, &from, self.partition_ttl())
                .await?
        };
        if !sync.acquired.is_empty() || !sync.released.is_empty() {
            info!(
                workers = live.len().max(1),
                held = sync.held.len(),
                acquired = %list(&sync.acquired),
                released = %list(&sync.released),
                waiting = %list(&sync.waiting),
                "partitions rebalanced"
            );
        }
        self.inner
            .partitions
            .set_held(sync.held.iter().map(|l| l.partition).collect());
        self.inner.partitions.set_members(live);
        if !sync.acquired.is_empty() {
            self.inner.wake.notify_one();
            self.inner.sink_wake.notify_waiters();
        }
        Ok(sync)
    }

    /// The live workers of this runtime's mode in the registry, sorted.
    async fn live_workers(&self) -> Result<Vec<WorkerId>> {
        let mode = self.mode();
        let mut live: Vec<WorkerId> = self
            .inner
            .journal
            .workers()
            .await?
            .into_iter()
            .filter(|w| w.mode == mode)
            .map(|w| w.id)
            .collect();
        live.sort();
        live.dedup();
        Ok(live)
    }

    /// Between two beats: one registry read, and a synchronisation when a
    /// worker of this mode joined or left since the last one, or while
    /// `waiting` (wanted partitions held by others). Returns whether wanted
    /// partitions are still held by others; a failed read changes nothing
    /// (the next beat synchronises anyway).
    pub(crate) async fn watch_partitions(&self, waiting: bool) -> bool {
        let live = match self.live_workers().await {
            Ok(live) => live,
            Err(e) => {
                warn!(error = %e, "reading the worker registry failed; the next heartbeat tries again");
                return waiting;
            }
        };
        if !waiting && live == self.inner.partitions.members() {
            return false;
        }
        still_waiting(self.sync_among(live, false).await)
    }

    /// [`sync_partitions`](Self::sync_partitions), a failure logged; returns
    /// whether wanted partitions are still held by others.
    pub(crate) async fn sync_partitions_or_warn(&self) -> bool {
        still_waiting(self.sync_partitions().await)
    }

    /// Gives every partition back (at shutdown), so the other workers take
    /// them at their next heartbeat instead of after the lease TTL.
    pub(crate) async fn release_partitions(&self) {
        self.inner.partitions.set_active(false);
        match self
            .inner
            .journal
            .sync_partitions(self.worker_id(), &[], self.partition_ttl())
            .await
        {
            Ok(sync) => {
                self.inner.partitions.set_held(Vec::new());
                if !sync.released.is_empty() {
                    info!(released = %list(&sync.released), "partitions released");
                }
            }
            Err(e) => warn!(error = %e, "releasing partition leases failed; they expire on their own"),
        }
    }
}

/// Whether a synchronisation left wanted partitions with other owners; a
/// failure is logged and counts as no.
fn still_waiting(sync: Result<PartitionSync>) -> bool {
    match sync {
        Ok(sync) => !sync.waiting.is_empty(),
        Err(e) => {
            warn!(error = %e, "synchronising partition leases failed; the next heartbeat tries again");
            false
        }
    }
}

/// `p00 p03 p07`, or `-`.
fn list(ps: &[Partition]) -> String {
    if ps.is_empty() {
        return "-".to_owned();
    }
    ps.iter().map(Partition::to_string).collect::<Vec<_>>().join(" ")
}
