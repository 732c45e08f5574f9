//! [`SqlTx`]: the part of a projection transaction handle that is the same
//! on every SQL dialect: the document writes of
//! [`ViewStorage`](outbox_core::spi::ViewStorage), the live generations,
//! and the writes still pending at commit.

use std::sync::Arc;

use outbox_core::spi::{GenerationMap, ViewRow};
use outbox_core::{ProjectionName, Result, Seq, StreamId};

use crate::generations::{self, GenerationCache};
use crate::{Conn, Dialect, ViewWrites, projection};

/// The shared state and document writes of an adapter's projection
/// transaction over the driver's transaction `C` (a [`Conn`]).
///
/// An adapter's handle (`SqliteTx`, `PgTx`) holds one beside what only its
/// dialect needs (the apply guard), implements
/// [`ApplyTx`](outbox_core::spi::ApplyTx) itself (the hot path: the
/// checkpoint lock and compare-and-set differ per dialect), and implements
/// [`ViewStorage`](outbox_core::spi::ViewStorage) by calling the methods of
/// the same names here. They are inherent methods, not a second
/// implementation of the port: the port is `#[async_trait]`, and forwarding
/// one boxed future to another would allocate twice for every document an
/// applier reads or writes.
pub struct SqlTx<C> {
    conn: C,
    dialect: Arc<Dialect>,
    /// Document writes not yet sent (single-writer dialects only).
    views: ViewWrites,
    /// The live generations resolved when the transaction began.
    generations: Arc<GenerationMap>,
}

impl<C> std::fmt::Debug for SqlTx<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqlTx")
    }
}

impl<C: Conn> SqlTx<C> {
    /// A transaction `conn` has begun, with statements in `dialect`.
    pub fn new(conn: C, dialect: Arc<Dialect>) -> Self {
        SqlTx {
            conn,
            dialect,
            views: ViewWrites::default(),
            generations: Arc::default(),
        }
    }

    /// The driver's transaction.
    pub fn conn(&mut self) -> &mut C {
        &mut self.conn
    }

    /// The driver's transaction, shared.
    pub fn conn_ref(&self) -> &C {
        &self.conn
    }

    /// The shared statements' dialect.
    pub fn dialect(&self) -> Arc<Dialect> {
        Arc::clone(&self.dialect)
    }

    /// The live generations resolved when the transaction began.
    pub fn generations(&self) -> &Arc<GenerationMap> {
        &self.generations
    }

    /// The document writes not yet sent.
    pub fn views(&mut self) -> &mut ViewWrites {
        &mut self.views
    }

    /// Resolves the live generations for this transaction: from `cache`
    /// (`Some`), or read now.
    pub async fn resolve_generations(&mut self, cache: Option<&GenerationCache>) -> Result<()> {
        self.generations = match cache {
            Some(cache) => cache.get(&self.dialect, &mut self.conn).await?,
            None => generations::load_map(&self.dialect, &mut self.conn).await?,
        };
        Ok(())
    }

    /// Writes out the pending document writes (see [`ViewWrites`]).
    pub async fn flush_views(&mut self) -> Result<()> {
        if self.views.is_empty() {
            return Ok(());
        }
        // Keeps what it learnt (document hashes, digest changes).
        self.views.flush(&self.dialect, &mut self.conn).await
    }

    /// Writes out the pending documents and the running digest changes (one
    /// statement per projection changed), and gives back the driver's
    /// transaction for the adapter to commit.
    pub async fn finish(mut self) -> Result<C> {
        self.flush_views().await?;
        self.views.flush_digests(&self.dialect, &mut self.conn).await?;
        Ok(self.conn)
    }

    /// [`ViewStorage::view_applying`](outbox_core::spi::ViewStorage::view_applying).
    pub fn view_applying(&mut self, projection: &ProjectionName, stream: &StreamId, seq: Seq) {
        self.views.applying(projection, stream, seq);
    }

    /// [`ViewStorage::view_get`](outbox_core::spi::ViewStorage::view_get):
    /// a pending write, else the stored document.
    pub async fn view_get(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
    ) -> Result<Option<String>> {
        if let Some(pending) = self.views.get(projection, table, key) {
            return Ok(pending.map(str::to_owned));
        }
        let found = projection::view_get(&self.dialect, &mut self.conn, projection, table, key).await?;
        self.views.read(projection, table, key, found.as_deref());
        Ok(found)
    }

    /// [`ViewStorage::view_put`](outbox_core::spi::ViewStorage::view_put):
    /// pending until the batch flushes, or written now.
    pub async fn view_put(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
        value: &str,
    ) -> Result<()> {
        if self.views.put(projection, table, key, value) {
            self.flush_views().await?;
        }
        Ok(())
    }

    /// [`ViewStorage::view_delete`](outbox_core::spi::ViewStorage::view_delete).
    pub async fn view_delete(&mut self, projection: &ProjectionName, table: &str, key: &str) -> Result<bool> {
        if let Some(existed) = self.views.delete(projection, table, key) {
            return Ok(existed);
        }
        let d = &self.dialect;
        if !d.locks_rows()
            && let Some(old) = self.views.known(projection, table, key)
        {
            // A single writer knows what is there: defer the delete too.
            if old.is_some() {
                self.views.defer_delete(projection, table, key);
            }
            return Ok(old.is_some());
        }
        let locked = !d.locks_rows() || self.views.knows(projection, table, key);
        let old = projection::view_delete(d, &mut self.conn, projection, table, key).await?;
        self.views.wrote(projection, table, key, old, None, locked);
        Ok(old.is_some())
    }

    /// [`ViewStorage::view_scan`](outbox_core::spi::ViewStorage::view_scan),
    /// after the pending writes.
    pub async fn view_scan(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, String)>> {
        self.flush_views().await?;
        projection::view_scan(&self.dialect, &mut self.conn, projection, table, after, limit).await
    }

    /// [`ViewStorage::view_rows`](outbox_core::spi::ViewStorage::view_rows),
    /// after the pending writes.
    pub async fn view_rows(
        &mut self,
        projection: &ProjectionName,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<ViewRow>> {
        self.flush_views().await?;
        projection::view_rows(&self.dialect, &mut self.conn, projection, after, limit).await
    }

    /// [`ViewStorage::view_clear`](outbox_core::spi::ViewStorage::view_clear),
    /// after the pending writes.
    pub async fn view_clear(&mut self, projection: &ProjectionName) -> Result<u64> {
        self.flush_views().await?;
        let deleted = projection::view_clear(&self.dialect, &mut self.conn, projection).await?;
        self.views.cleared(projection, &deleted);
        Ok(deleted.len() as u64)
    }
}
