//! [`SqlProjections`]: the projection database's cold-path ports,
//! implemented once over any [`Database`] (the driver trait each SQL adapter
//! implements).

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    GenerationInfo, GenerationStore, ProjectionName, Result, RunBounds, RunEnd, RunKind, RunProgress,
    RunRecord, RunStore, StoredGeneration, StreamId, SwapCheck, SwapOutcome, ViewDigest, ViewDigestCheck,
    ViewStore, Watermark, WatermarkStore, WorkerId,
};

use crate::generations::GenerationCache;
use crate::{Database, Dialect, generations, projection, runs};

/// The cold-path projection ports on a projection database `D`:
/// [`ViewStore`], [`GenerationStore`], [`WatermarkStore`] and [`RunStore`],
/// each a statement or a short transaction of [`projection`],
/// [`generations`] or [`runs`], with `D`'s clock. It also keeps the store's
/// [`GenerationCache`], which a swap here invalidates and the adapter's
/// apply transactions read.
///
/// An adapter's projection store holds one and forwards these ports to it.
#[derive(Debug)]
pub struct SqlProjections<D: ?Sized> {
    db: Arc<D>,
    generations: Arc<GenerationCache>,
}

impl<D: ?Sized> Clone for SqlProjections<D> {
    fn clone(&self) -> Self {
        SqlProjections {
            db: Arc::clone(&self.db),
            generations: Arc::clone(&self.generations),
        }
    }
}

impl<D: Database + ?Sized> SqlProjections<D> {
    /// The ports on `db`, with an empty generation cache.
    pub fn new(db: Arc<D>) -> Self {
        SqlProjections {
            db,
            generations: Arc::default(),
        }
    }

    /// The database the statements run on.
    pub fn database(&self) -> &D {
        &self.db
    }

    /// The database's dialect.
    pub fn dialect(&self) -> &Dialect {
        self.db.dialect()
    }

    /// The live generations the store's apply transactions reuse (ADR 0021).
    pub fn generation_cache(&self) -> &GenerationCache {
        &self.generations
    }
}

impl<D: Database + ?Sized> ViewStore for SqlProjections<D> {
    async fn view_get(&self, projection: &ProjectionName, table: &str, key: &str) -> Result<Option<String>> {
        projection::read_view(&*self.db, projection, table, key).await
    }

    async fn view_scan(
        &self,
        projection: &ProjectionName,
        table: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, String)>> {
        projection::read_view_page(&*self.db, projection, table, after, limit).await
    }

    async fn view_digests(&self) -> Result<Vec<ViewDigest>> {
        projection::view_digests(&*self.db).await
    }

    async fn verify_view_digest(&self, projection: &ProjectionName) -> Result<ViewDigestCheck> {
        projection::verify_view_digest(&*self.db, projection).await
    }
}

impl<D: Database + ?Sized> GenerationStore for SqlProjections<D> {
    async fn generation(&self, projection: &ProjectionName) -> Result<Option<GenerationInfo>> {
        generations::generation(&*self.db, projection).await
    }

    async fn generations(&self) -> Result<Vec<GenerationInfo>> {
        generations::generations(&*self.db).await
    }

    async fn begin_generation(
        &self,
        projection: &ProjectionName,
        live_version: u32,
        version: u32,
    ) -> Result<GenerationInfo> {
        generations::begin_generation(&*self.db, projection, live_version, version).await
    }

    async fn record_build_position(
        &self,
        projection: &ProjectionName,
        generation: u32,
        position: u64,
    ) -> Result<()> {
        generations::record_build_position(&*self.db, projection, generation, position).await
    }

    async fn swap_generation(
        &self,
        projection: &ProjectionName,
        generation: u32,
        check: SwapCheck,
    ) -> Result<SwapOutcome> {
        let out = generations::swap_generation(&*self.db, projection, generation, check).await;
        // This process's applies read the new map at once.
        self.generations.invalidate();
        out
    }

    async fn drop_generation(&self, projection: &ProjectionName, generation: u32) -> Result<u64> {
        generations::drop_generation(&*self.db, projection, generation).await
    }

    async fn stored_generations(&self, projection: &ProjectionName) -> Result<Vec<StoredGeneration>> {
        generations::stored_generations(&*self.db, projection).await
    }
}

impl<D: Database + ?Sized> WatermarkStore for SqlProjections<D> {
    async fn watermark(&self, stream: &StreamId) -> Result<Option<Watermark>> {
        projection::watermark(&*self.db, stream).await
    }

    async fn watermarks(&self, after: Option<&StreamId>, limit: usize) -> Result<Vec<Watermark>> {
        projection::watermarks(&*self.db, after, limit).await
    }
}

impl<D: Database + ?Sized> RunStore for SqlProjections<D> {
    async fn admit_bounded_run(
        &self,
        kind: RunKind,
        projection: &ProjectionName,
        bounds: RunBounds,
        owner: &WorkerId,
        ttl: Duration,
    ) -> Result<RunRecord> {
        runs::admit_run(&*self.db, kind, projection, bounds, owner, ttl).await
    }

    async fn reclaim_run(
        &self,
        projection: &ProjectionName,
        live: &[WorkerId],
        idle: Duration,
    ) -> Result<Option<RunRecord>> {
        runs::reclaim_run(&*self.db, projection, live, idle).await
    }

    async fn record_progress(
        &self,
        id: u64,
        owner: &WorkerId,
        progress: RunProgress<'_>,
        ttl: Duration,
    ) -> Result<RunRecord> {
        runs::record_progress(&*self.db, id, owner, progress, ttl).await
    }

    async fn finish_run(&self, id: u64, owner: &WorkerId, end: RunEnd) -> Result<RunRecord> {
        runs::finish_run(&*self.db, id, owner, end).await
    }

    async fn cancel_run(&self, id: u64) -> Result<RunRecord> {
        runs::cancel_run(&*self.db, id).await
    }

    async fn run(&self, id: u64) -> Result<Option<RunRecord>> {
        runs::run(&*self.db, id).await
    }

    async fn runs(&self, limit: usize) -> Result<Vec<RunRecord>> {
        runs::runs(&*self.db, limit).await
    }

    async fn prune_runs(&self, older_than: Duration) -> Result<u64> {
        runs::prune_runs(&*self.db, older_than).await
    }
}
