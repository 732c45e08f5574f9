//! What an adapter implements for the apply loop: the transaction an apply
//! runs in ([`ApplyTx`], [`ViewStorage`]) and the values they pass.
//! Published through [`spi`](crate::spi), which only re-exports; the
//! modules of this crate that need these import them from here.

use async_trait::async_trait;

use crate::live::GenerationMap;
use crate::{ProjectionName, Result, Seq, StreamId};

/// One checkpoint an apply moves: from the value read to the run's last
/// applied seq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointMove<'a> {
    /// The projection.
    pub projection: &'a ProjectionName,
    /// The checkpoint read at the start of the transaction.
    pub from: u64,
    /// The checkpoint after the run.
    pub to: u64,
}

/// A store's apply transaction, as the shared loop [`apply_in`](crate::spi::apply_in) drives it.
/// Implemented by every adapter's [`ProjectionStore::Tx`](crate::ProjectionStore::Tx).
///
/// # Contract
/// - `checkpoints` returns the checkpoint (0 when none) of each projection on
///   `stream`, in the order given. On a store whose applies of one
///   (projection, stream) can run concurrently it locks them for the rest of
///   the transaction, in a fixed order, so the second apply waits and then
///   reads the first's commit.
/// - `guard` is called once, right before the first applier runs;
///   `check_guard` once after the last. `check_guard` returns
///   `Ok(Some(detail))` when user code ended the store's transaction
///   (committed, rolled back, or swallowed an error after which the database
///   rolled it back); the store then writes nothing more. `Err` is a storage
///   error of the check itself.
/// - `advance` sets each checkpoint from `from` to `to` only where it still
///   is `from` (compare-and-set), raises the stream's watermark to `through`
///   (never lowering it), and returns how many checkpoints it set.
#[async_trait]
pub trait ApplyTx: ViewStorage {
    /// Reads (and locks) the projections' checkpoints on the stream.
    async fn checkpoints(&mut self, stream: &StreamId, projections: &[&ProjectionName]) -> Result<Vec<u64>>;

    /// Marks the transaction before user code runs.
    async fn guard(&mut self) -> Result<()>;

    /// Checks that user code left the transaction open.
    async fn check_guard(&mut self) -> Result<Option<String>>;

    /// Compare-and-sets the checkpoints and raises the watermark.
    async fn advance(&mut self, stream: &StreamId, moves: &[CheckpointMove<'_>], through: u64)
    -> Result<u64>;

    /// `checkpoints` of several streams, one vector per stream in the order
    /// given (a store may read them in one statement). The default calls
    /// `checkpoints` for each.
    async fn checkpoints_of(
        &mut self,
        streams: &[&StreamId],
        projections: &[&ProjectionName],
    ) -> Result<Vec<Vec<u64>>> {
        let mut out = Vec::with_capacity(streams.len());
        for stream in streams {
            out.push(self.checkpoints(stream, projections).await?);
        }
        Ok(out)
    }

    /// Records that `projection` passed over `stream`/`seq` with `error`
    /// ([`OnError::Skip`](crate::OnError::Skip)): inserted or replaced,
    /// stamped with the store's clock. Written with the apply that moves
    /// the checkpoint past the event, so both commit or neither does.
    /// The default, for a store without skip records (ADR 0035), is
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    async fn record_skip(
        &mut self,
        projection: &ProjectionName,
        stream: &StreamId,
        seq: Seq,
        error: &str,
    ) -> Result<()> {
        let _ = (projection, stream, seq, error);
        Err(crate::Error::Unsupported(
            "skips: this projection store keeps no skip records".into(),
        ))
    }

    /// Removes that record and says whether it was there; on a store whose
    /// transactions run concurrently, a second caller waits for the first
    /// and then finds nothing. The default finds none.
    async fn take_skip(&mut self, projection: &ProjectionName, stream: &StreamId, seq: Seq) -> Result<bool> {
        let _ = (projection, stream, seq);
        Ok(false)
    }

    /// `advance` for several streams, returning the checkpoints set in all
    /// (a store may write them in a few statements). The default calls
    /// `advance` for each.
    async fn advance_all(&mut self, advances: &[StreamAdvance<'_>]) -> Result<u64> {
        let mut moved = 0;
        for a in advances {
            moved += self.advance(a.stream, &a.moves, a.through).await?;
        }
        Ok(moved)
    }
}

/// One stream's share of [`ApplyTx::advance_all`]: its checkpoint moves and
/// the seq its watermark rises to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamAdvance<'a> {
    /// The stream.
    pub stream: &'a StreamId,
    /// The checkpoints that move (compare-and-set from `from` to `to`).
    pub moves: Vec<CheckpointMove<'a>>,
    /// The run's last seq: the watermark's new value unless it is higher.
    pub through: u64,
}

/// One stored document of a view, as [`ViewStorage::view_rows`] returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewRow {
    /// The table.
    pub table: String,
    /// The key.
    pub key: String,
    /// The JSON text, exactly as stored.
    pub value: String,
}

/// The document storage of a projection transaction: implemented by every
/// adapter's [`ProjectionStore::Tx`](crate::ProjectionStore::Tx), used
/// through [`ViewTx`](crate::ViewTx) by [`ViewProjection`](crate::ViewProjection)s.
///
/// # Contract
/// - Every call runs inside the store's apply (or reset, or digest)
///   transaction: writes commit or roll back with the checkpoints.
/// - Documents are keyed by (projection, table, key); projections never see
///   each other's documents. Table names and keys arrive validated
///   ([`validate_view_table`](crate::validate_view_table),
///   [`validate_view_key`](crate::validate_view_key)); values are JSON text
///   and are stored and returned byte for byte.
/// - `view_get` returns the stored text or `None`. On an adapter whose
///   applies of different streams run concurrently (Postgres), it first locks
///   the (projection, table, key) for the rest of the transaction, present or
///   not, so a read-modify-write of one document from two streams never loses
///   an update: the second reader waits and reads the first's commit.
/// - `view_put` inserts or replaces the document.
/// - `view_delete` removes it and returns whether it existed.
/// - `view_scan` (which locks nothing) returns up to `limit` documents of one table with key
///   strictly greater than `after`, ordered by key bytewise (Postgres:
///   `COLLATE "C"`).
/// - `view_rows` returns up to `limit` documents of the projection, every
///   table, with (table, key) strictly greater than `after`, ordered by
///   (table, key) bytewise.
/// - `view_clear` deletes every document of the projection and returns how many.
/// - Running digests (ADR 0019): `view_put`, `view_delete` and `view_clear`
///   keep the projection's [`RunningDigest`](crate::RunningDigest) exact in
///   the same transaction: each write adds the new document's hash and
///   removes the hash of the one it replaced or deleted (the document as
///   the write actually found it, also when another transaction changed it
///   concurrently); `view_clear` removes the hashes of the documents it
///   deleted and starts the running digest over (`last_event` none; an
///   untracked one, from documents older than running digests, at zero).
///   The change commits or rolls back with the writes.
/// - `view_applying` says which event is applied to the projection next; the
///   last one of a transaction that changes the projection's running digest
///   becomes its `last_event`. It writes nothing by itself, and a
///   transaction whose writes leave the running digest as it was records
///   nothing.
#[async_trait]
pub trait ViewStorage: Send {
    /// The live generations this transaction resolved at its start (ADR
    /// 0021): the storage name of each projection's live generation and the
    /// epoch its checkpoint compare-and-set is fenced by. The default, for
    /// a store without generations, is empty.
    fn generations(&self) -> &GenerationMap {
        GenerationMap::empty()
    }

    /// The event whose apply the following writes of `projection` belong to.
    fn view_applying(&mut self, projection: &ProjectionName, stream: &StreamId, seq: Seq);

    /// One document.
    async fn view_get(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
    ) -> Result<Option<String>>;

    /// Inserts or replaces one document.
    async fn view_put(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
        value: &str,
    ) -> Result<()>;

    /// Removes one document.
    async fn view_delete(&mut self, projection: &ProjectionName, table: &str, key: &str) -> Result<bool>;

    /// A page of one table, in key order.
    async fn view_scan(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, String)>>;

    /// A page of every table of the projection, in (table, key) order.
    async fn view_rows(
        &mut self,
        projection: &ProjectionName,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<ViewRow>>;

    /// Deletes every document of the projection.
    async fn view_clear(&mut self, projection: &ProjectionName) -> Result<u64>;
}
