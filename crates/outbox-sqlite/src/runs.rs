//! [`RunStore`] on the projection database: the
//! `outbox_runs` table, through the shared statements of [`outbox_sql::runs`].

use std::time::Duration;

use outbox_core::{
    ProjectionName, Result, RunBounds, RunEnd, RunKind, RunProgress, RunRecord, RunStore, WorkerId,
};

use crate::SqliteProjectionStore;

impl RunStore for SqliteProjectionStore {
    fn admit_bounded_run(
        &self,
        kind: RunKind,
        projection: &ProjectionName,
        bounds: RunBounds,
        owner: &WorkerId,
        ttl: Duration,
    ) -> impl Future<Output = Result<RunRecord>> + Send {
        RunStore::admit_bounded_run(&self.sql, kind, projection, bounds, owner, ttl)
    }

    fn reclaim_run(
        &self,
        projection: &ProjectionName,
        live: &[WorkerId],
        idle: Duration,
    ) -> impl Future<Output = Result<Option<RunRecord>>> + Send {
        RunStore::reclaim_run(&self.sql, projection, live, idle)
    }

    fn record_progress(
        &self,
        id: u64,
        owner: &WorkerId,
        progress: RunProgress<'_>,
        ttl: Duration,
    ) -> impl Future<Output = Result<RunRecord>> + Send {
        RunStore::record_progress(&self.sql, id, owner, progress, ttl)
    }

    fn finish_run(
        &self,
        id: u64,
        owner: &WorkerId,
        end: RunEnd,
    ) -> impl Future<Output = Result<RunRecord>> + Send {
        RunStore::finish_run(&self.sql, id, owner, end)
    }

    fn cancel_run(&self, id: u64) -> impl Future<Output = Result<RunRecord>> + Send {
        RunStore::cancel_run(&self.sql, id)
    }

    fn run(&self, id: u64) -> impl Future<Output = Result<Option<RunRecord>>> + Send {
        RunStore::run(&self.sql, id)
    }

    fn runs(&self, limit: usize) -> impl Future<Output = Result<Vec<RunRecord>>> + Send {
        RunStore::runs(&self.sql, limit)
    }

    fn prune_runs(&self, older_than: Duration) -> impl Future<Output = Result<u64>> + Send {
        RunStore::prune_runs(&self.sql, older_than)
    }
}
