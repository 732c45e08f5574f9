#![doc = include_str!("../README.md")]

mod columns;
mod conn;
pub mod consumers;
mod dialect;
pub mod generations;
pub mod journal;
pub mod partitions;
mod plumbing;
pub mod projection;
pub mod runs;
pub mod sinks;
pub mod skipped;
mod value;
mod view_writes;

pub use conn::{Conn, Database, Tx};
pub use dialect::{Dialect, LockedDocuments};
pub use plumbing::{Role, digest_row, digest_rows};
pub use value::{Arg, Row, Value, decode_json, json_text, json_text_unless_empty};
pub use view_writes::{DigestWrites, DocumentWrites, Statement, ViewWrites};

/// Implements the cold-path journal ports (`DeadLetters`, `OutboxInspector`,
/// `LeaseAdmin`, `WorkerRegistry`) for an adapter type whose `$db` field
/// implements [`Database`], by delegating to [`journal`].
#[macro_export]
macro_rules! impl_journal_ports {
    ($ty:ty, $db:ident) => {
        impl ::outbox_core::DeadLetters for $ty {
            async fn requeue(
                &self,
                stream: &::outbox_core::StreamId,
                seq: ::outbox_core::Seq,
            ) -> ::outbox_core::Result<::outbox_core::OutboxRow> {
                $crate::journal::requeue(&*self.$db, stream, seq).await
            }

            async fn requeue_dead(
                &self,
                limit: usize,
            ) -> ::outbox_core::Result<Vec<::outbox_core::OutboxRow>> {
                $crate::journal::requeue_dead(&*self.$db, limit).await
            }

            async fn retry(
                &self,
                stream: &::outbox_core::StreamId,
                seq: ::outbox_core::Seq,
            ) -> ::outbox_core::Result<::outbox_core::OutboxRow> {
                $crate::journal::retry(&*self.$db, stream, seq).await
            }
        }

        impl ::outbox_core::OutboxInspector for $ty {
            async fn row(
                &self,
                stream: &::outbox_core::StreamId,
                seq: ::outbox_core::Seq,
            ) -> ::outbox_core::Result<Option<::outbox_core::OutboxRow>> {
                $crate::journal::row(&*self.$db, stream, seq).await
            }

            async fn head(
                &self,
                stream: &::outbox_core::StreamId,
            ) -> ::outbox_core::Result<Option<::outbox_core::OutboxRow>> {
                $crate::journal::head(&*self.$db, stream).await
            }

            async fn summary(&self) -> ::outbox_core::Result<::outbox_core::OutboxSummary> {
                $crate::journal::summary(&*self.$db).await
            }

            async fn list(
                &self,
                status: Option<::outbox_core::OutboxStatus>,
                limit: usize,
            ) -> ::outbox_core::Result<Vec<::outbox_core::OutboxRow>> {
                $crate::journal::list(&*self.$db, status, limit).await
            }

            async fn lease(
                &self,
                stream: &::outbox_core::StreamId,
            ) -> ::outbox_core::Result<Option<::outbox_core::Lease>> {
                $crate::journal::lease(&*self.$db, stream).await
            }

            async fn leases(
                &self,
                after: Option<&::outbox_core::StreamId>,
                limit: usize,
            ) -> ::outbox_core::Result<Vec<::outbox_core::LeaseEntry>> {
                $crate::journal::leases(&*self.$db, after, limit).await
            }
        }

        impl ::outbox_core::LeaseAdmin for $ty {
            async fn break_lease(
                &self,
                stream: &::outbox_core::StreamId,
            ) -> ::outbox_core::Result<Option<::outbox_core::Lease>> {
                $crate::journal::break_lease(&*self.$db, stream).await
            }
        }

        impl ::outbox_core::WorkerRegistry for $ty {
            async fn heartbeat(
                &self,
                id: &::outbox_core::WorkerId,
                host: &str,
                pid: u32,
                mode: ::outbox_core::Mode,
                ttl: ::std::time::Duration,
            ) -> ::outbox_core::Result<::outbox_core::WorkerInfo> {
                $crate::journal::heartbeat(&*self.$db, id, host, pid, mode, ttl).await
            }

            async fn workers(&self) -> ::outbox_core::Result<Vec<::outbox_core::WorkerInfo>> {
                $crate::journal::workers(&*self.$db).await
            }

            async fn deregister(&self, id: &::outbox_core::WorkerId) -> ::outbox_core::Result<bool> {
                $crate::journal::deregister(&*self.$db, id).await
            }

            async fn prune(&self, grace: ::std::time::Duration) -> ::outbox_core::Result<u64> {
                $crate::journal::prune(&*self.$db, grace).await
            }
        }

        impl ::outbox_core::ActivityLog for $ty {
            async fn record_activity(
                &self,
                id: &::outbox_core::WorkerId,
                counts: ::outbox_core::ActivityCounts,
            ) -> ::outbox_core::Result<()> {
                $crate::journal::record_activity(&*self.$db, id, counts).await
            }

            async fn activity(&self, minutes: u32) -> ::outbox_core::Result<::outbox_core::ActivitySeries> {
                $crate::journal::activity(&*self.$db, minutes).await
            }
        }
    };
}

/// Implements `LeaseStore` for an adapter type whose `$db` field implements
/// [`Database`], by delegating to [`journal`] (an adapter with a faster
/// path writes its own, with the same statements).
#[macro_export]
macro_rules! impl_lease_store {
    ($ty:ty, $db:ident) => {
        impl ::outbox_core::LeaseStore for $ty {
            async fn acquire(
                &self,
                stream: &::outbox_core::StreamId,
                owner: &::outbox_core::WorkerId,
                ttl: ::std::time::Duration,
            ) -> ::outbox_core::Result<Option<::outbox_core::Lease>> {
                $crate::journal::acquire(&*self.$db, stream, owner, ttl).await
            }

            async fn renew(
                &self,
                lease: &::outbox_core::Lease,
                ttl: ::std::time::Duration,
            ) -> ::outbox_core::Result<::outbox_core::Lease> {
                $crate::journal::renew(&*self.$db, lease, ttl).await
            }

            async fn release(&self, lease: &::outbox_core::Lease) -> ::outbox_core::Result<bool> {
                $crate::journal::release(&*self.$db, lease).await
            }
        }
    };
}
