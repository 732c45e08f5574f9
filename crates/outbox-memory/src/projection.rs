//! The in-memory projection database: tables, checkpoints, watermarks.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use outbox_core::spi::validate_ttl;
use outbox_core::spi::{ApplyTx, CheckpointMove, ViewRow, ViewStorage, all_applied, apply_in, apply_runs_in};
use outbox_core::spi::{GenerationMap, validate_limit, validate_projection_names};
use outbox_core::{
    ApplyOutcome, Clock, Digest, DigestBuilder, DigestValue, Error, Event, MAX_PAGE, Projection,
    ProjectionName, ProjectionStore, Result, Seq, StreamId, SystemClock, Watermark, WatermarkStore,
};
use outbox_core::{DocumentHash, RunningDigest, ViewDigest, ViewDigestCheck};
use outbox_core::{
    RunBounds, RunEnd, RunKind, RunProgress, RunRecord, RunState, RunStore, ViewStore, WorkerId, async_trait,
};
use tokio::sync::{Mutex, OwnedMutexGuard};

/// Projection tables: table name -> key -> value bytes, all ordered.
pub type Tables = BTreeMap<String, BTreeMap<String, Vec<u8>>>;

/// View documents: (projection, table, key) -> JSON text, ordered bytewise.
type Views = BTreeMap<(String, String, String), String>;

/// A skip record's key: (projection, stream, seq).
type SkipKey = (ProjectionName, StreamId, Seq);

#[derive(Debug, Default)]
pub(crate) struct State {
    tables: Tables,
    views: Views,
    checkpoints: BTreeMap<(ProjectionName, StreamId), u64>,
    watermarks: BTreeMap<StreamId, Watermark>,
    runs: BTreeMap<u64, RunRecord>,
    /// Running digests of view projections (absent: no documents, no history).
    digests: BTreeMap<ProjectionName, ViewDigest>,
    /// The last run id handed out (pruning must not let ids repeat).
    last_run_id: u64,
    /// Skip records (ADR 0032): the error and when.
    skipped: BTreeMap<SkipKey, (String, outbox_core::Timestamp)>,
    /// Generation records (ADR 0021) and the live map they make.
    pub(crate) generations: BTreeMap<ProjectionName, outbox_core::GenerationInfo>,
    pub(crate) live: Arc<GenerationMap>,
}

impl State {
    /// The storage name of `projection`'s live generation.
    fn stored<'a>(&'a self, projection: &'a ProjectionName) -> &'a ProjectionName {
        self.live.storage(projection)
    }

    /// Deletes everything stored under `storage`; returns the documents.
    pub(crate) fn clear_storage(&mut self, storage: &ProjectionName) -> u64 {
        let before = self.views.len();
        self.views.retain(|(p, _, _), _| p != storage.as_str());
        self.checkpoints.retain(|(p, _), _| p != storage);
        self.digests.remove(storage);
        (before - self.views.len()) as u64
    }

    /// Deletes the skip records of `projection` (everything is applied again).
    pub(crate) fn clear_skips(&mut self, projection: &ProjectionName) {
        self.skipped.retain(|(p, _, _), _| p != projection);
    }

    /// The checkpoints of `storage`, by stream.
    pub(crate) fn checkpoints_of(&self, storage: &ProjectionName) -> BTreeMap<&StreamId, u64> {
        self.checkpoints
            .iter()
            .filter(|((p, _), _)| p == storage)
            .map(|((_, s), cp)| (s, *cp))
            .collect()
    }

    /// The recorded running digest of `storage`.
    pub(crate) fn digest_of(&self, storage: &ProjectionName) -> ViewDigest {
        self.digests
            .get(storage)
            .cloned()
            .unwrap_or_else(|| ViewDigest::empty(storage))
    }
}

/// The in-memory projection store: implements [`ProjectionStore`] (with
/// [`MemoryTx`] as the transaction handle) and [`WatermarkStore`](outbox_core::WatermarkStore).
///
/// One async mutex serializes transactions, like SQLite's single writer.
/// Clones share the state.
#[derive(Clone, Debug)]
pub struct MemoryProjectionStore {
    pub(crate) state: Arc<Mutex<State>>,
    pub(crate) clock: Arc<dyn Clock>,
}

impl Default for MemoryProjectionStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryProjectionStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock::new()))
    }

    /// An empty store on `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryProjectionStore {
            state: Arc::new(Mutex::new(State::default())),
            clock,
        }
    }

    async fn begin(&self) -> MemoryTx {
        MemoryTx {
            guard: Arc::clone(&self.state).lock_owned().await,
            undo: Vec::new(),
            committed: false,
            now: self.clock.now(),
            last_applied: HashMap::new(),
            touched: BTreeMap::new(),
        }
    }

    /// Runs `f` over the committed tables (for inspection and tests).
    pub async fn read<R>(&self, f: impl FnOnce(&Tables) -> R) -> R {
        f(&self.state.lock().await.tables)
    }
}

/// The transaction handle appliers write through: a view of the projection
/// tables that commits with the checkpoint advance or rolls back entirely
/// (also when the apply future is dropped midway).
#[derive(Debug)]
pub struct MemoryTx {
    guard: OwnedMutexGuard<State>,
    undo: Vec<Undo>,
    committed: bool,
    /// The store's clock when the transaction began (watermark times).
    now: outbox_core::Timestamp,
    /// Per projection, the last event applied to it in this transaction
    /// (`ViewStorage::view_applying`).
    last_applied: HashMap<ProjectionName, (StreamId, Seq)>,
    /// Per projection whose running digest this transaction changed, the
    /// running digest before its first change, and whether its documents
    /// were cleared.
    touched: BTreeMap<ProjectionName, (Option<RunningDigest>, bool)>,
}

/// What rolling back one write restores.
#[derive(Debug)]
enum Undo {
    /// A raw table entry and its previous value.
    Table(String, String, Option<Vec<u8>>),
    /// A view document and its previous text.
    View((String, String, String), Option<String>),
    /// A checkpoint and its previous value (`None`: there was none).
    Checkpoint((ProjectionName, StreamId), Option<u64>),
    /// A watermark and its previous value (`None`: there was none).
    Watermark(StreamId, Option<Watermark>),
    /// A running digest and its previous value (`None`: there was none).
    Digest(ProjectionName, Option<ViewDigest>),
    /// A skip record and its previous value (`None`: there was none).
    Skip(SkipKey, Option<(String, outbox_core::Timestamp)>),
}

impl MemoryTx {
    /// The value at `key` of `table`.
    pub fn get(&self, table: &str, key: &str) -> Option<&[u8]> {
        self.guard.tables.get(table)?.get(key).map(Vec::as_slice)
    }

    /// Sets `key` of `table` to `value`.
    pub fn put(&mut self, table: &str, key: &str, value: impl Into<Vec<u8>>) {
        let old = self
            .guard
            .tables
            .entry(table.to_owned())
            .or_default()
            .insert(key.to_owned(), value.into());
        self.undo.push(Undo::Table(table.to_owned(), key.to_owned(), old));
    }

    /// Removes `key` from `table`; returns whether it was there.
    pub fn delete(&mut self, table: &str, key: &str) -> bool {
        let old = self.guard.tables.get_mut(table).and_then(|t| t.remove(key));
        let existed = old.is_some();
        if existed {
            self.undo.push(Undo::Table(table.to_owned(), key.to_owned(), old));
        }
        existed
    }

    /// Every (key, value) of `table`, in key order.
    pub fn scan(&self, table: &str) -> impl Iterator<Item = (&str, &[u8])> {
        self.guard
            .tables
            .get(table)
            .into_iter()
            .flat_map(|t| t.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
    }

    /// How many keys `table` has.
    pub fn len(&self, table: &str) -> usize {
        self.guard.tables.get(table).map_or(0, BTreeMap::len)
    }

    /// Removes every key of `table`.
    pub fn clear(&mut self, table: &str) {
        let keys: Vec<String> = self.scan(table).map(|(k, _)| k.to_owned()).collect();
        for k in keys {
            self.delete(table, &k);
        }
    }

    /// Commits: each running digest this transaction changed records the
    /// last event applied to its projection and the time; one it changed
    /// back to where it was keeps its previous record.
    fn commit(mut self) {
        let touched = std::mem::take(&mut self.touched);
        for (p, (before, cleared)) in touched {
            let last = self.last_applied.get(&p).cloned();
            let now = self.now;
            let Some(d) = self.guard.digests.get_mut(&p) else {
                continue;
            };
            if cleared {
                d.last_event = last;
                d.updated_at = Some(now);
                continue;
            }
            match (before, d.digest) {
                // Nothing before and nothing now: no record, as before.
                (None, Some(RunningDigest::EMPTY)) => {
                    self.guard.digests.remove(&p);
                }
                (Some(b), Some(n)) if b == n => {}
                _ => {
                    d.last_event = last.or(d.last_event.take());
                    d.updated_at = Some(now);
                }
            }
        }
        self.committed = true;
    }
}

impl Drop for MemoryTx {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        while let Some(undo) = self.undo.pop() {
            match undo {
                Undo::Table(table, key, old) => {
                    let t = self.guard.tables.entry(table).or_default();
                    match old {
                        Some(v) => t.insert(key, v),
                        None => t.remove(&key),
                    };
                }
                Undo::View(key, old) => {
                    match old {
                        Some(v) => self.guard.views.insert(key, v),
                        None => self.guard.views.remove(&key),
                    };
                }
                Undo::Checkpoint(key, old) => {
                    match old {
                        Some(cp) => self.guard.checkpoints.insert(key, cp),
                        None => self.guard.checkpoints.remove(&key),
                    };
                }
                Undo::Watermark(stream, old) => {
                    match old {
                        Some(w) => self.guard.watermarks.insert(stream, w),
                        None => self.guard.watermarks.remove(&stream),
                    };
                }
                Undo::Digest(projection, old) => {
                    match old {
                        Some(d) => self.guard.digests.insert(projection, d),
                        None => self.guard.digests.remove(&projection),
                    };
                }
                Undo::Skip(key, old) => {
                    match old {
                        Some(r) => self.guard.skipped.insert(key, r),
                        None => self.guard.skipped.remove(&key),
                    };
                }
            }
        }
    }
}

impl MemoryTx {
    /// Sets (or removes) one document and keeps its projection's running
    /// digest exact: the old document's hash out, the new one's in.
    fn set_view(
        &mut self,
        projection: &ProjectionName,
        key: (String, String, String),
        value: Option<String>,
    ) -> Option<String> {
        let new_hash = value.as_deref().map(|v| DocumentHash::of(&key.1, &key.2, v));
        let old = match value {
            Some(v) => self.guard.views.insert(key.clone(), v),
            None => self.guard.views.remove(&key),
        };
        let old_hash = old.as_deref().map(|v| DocumentHash::of(&key.1, &key.2, v));
        self.undo.push(Undo::View(key, old.clone()));
        if old_hash != new_hash {
            let before = self.guard.digests.get(projection).cloned();
            self.touched
                .entry(projection.clone())
                .or_insert_with(|| (before.as_ref().and_then(|d| d.digest), false));
            let mut d = before.clone().unwrap_or_else(|| ViewDigest::empty(projection));
            let mut running = d.digest.unwrap_or_default();
            running.replace(old_hash.as_ref(), new_hash.as_ref());
            d.digest = Some(running);
            d.documents = running.documents();
            self.guard.digests.insert(projection.clone(), d);
            self.undo.push(Undo::Digest(projection.clone(), before));
        }
        old
    }
}

#[async_trait]
impl ApplyTx for MemoryTx {
    async fn checkpoints(&mut self, stream: &StreamId, projections: &[&ProjectionName]) -> Result<Vec<u64>> {
        Ok(projections
            .iter()
            .map(|p| {
                let key = ((*p).clone(), stream.clone());
                self.guard.checkpoints.get(&key).copied().unwrap_or(0)
            })
            .collect())
    }

    async fn guard(&mut self) -> Result<()> {
        Ok(())
    }

    async fn check_guard(&mut self) -> Result<Option<String>> {
        // User code holds no handle that could end this transaction.
        Ok(None)
    }

    async fn advance(
        &mut self,
        stream: &StreamId,
        moves: &[CheckpointMove<'_>],
        through: u64,
    ) -> Result<u64> {
        let mut moved = 0;
        for m in moves {
            let key = (m.projection.clone(), stream.clone());
            let before = self.guard.checkpoints.get(&key).copied();
            if before.unwrap_or(0) == m.from {
                self.guard.checkpoints.insert(key.clone(), m.to);
                moved += 1;
                self.undo.push(Undo::Checkpoint(key, before));
            }
        }
        let now = self.now;
        if let Some(old) = raise_watermark(&mut self.guard, stream, through, now) {
            self.undo.push(Undo::Watermark(stream.clone(), old));
        }
        Ok(moved)
    }

    async fn record_skip(
        &mut self,
        projection: &ProjectionName,
        stream: &StreamId,
        seq: Seq,
        error: &str,
    ) -> Result<()> {
        let key = (projection.clone(), stream.clone(), seq);
        let record = (outbox_core::spi::truncate_error(error).to_owned(), self.now);
        let old = self.guard.skipped.insert(key.clone(), record);
        self.undo.push(Undo::Skip(key, old));
        Ok(())
    }

    async fn take_skip(&mut self, projection: &ProjectionName, stream: &StreamId, seq: Seq) -> Result<bool> {
        let key = (projection.clone(), stream.clone(), seq);
        let old = self.guard.skipped.remove(&key);
        let found = old.is_some();
        if found {
            self.undo.push(Undo::Skip(key, old));
        }
        Ok(found)
    }
}

fn view_key(projection: &ProjectionName, table: &str, key: &str) -> (String, String, String) {
    (projection.to_string(), table.to_owned(), key.to_owned())
}

/// Documents of one projection (optionally one table) after `after`, in order.
fn view_range<'a>(
    views: &'a Views,
    projection: &ProjectionName,
    table: Option<&str>,
    after: Option<(&str, &str)>,
) -> impl Iterator<Item = (&'a (String, String, String), &'a String)> {
    let p = projection.to_string();
    let lower = match after {
        Some((t, k)) => Bound::Excluded((p.clone(), t.to_owned(), k.to_owned())),
        None => Bound::Included((p.clone(), table.unwrap_or("").to_owned(), String::new())),
    };
    let table = table.map(str::to_owned);
    views
        .range((lower, Bound::Unbounded))
        .take_while(move |((vp, vt, _), _)| *vp == p && table.as_ref().is_none_or(|t| t == vt))
}

#[async_trait]
impl ViewStorage for MemoryTx {
    fn generations(&self) -> &GenerationMap {
        &self.guard.live
    }

    fn view_applying(&mut self, projection: &ProjectionName, stream: &StreamId, seq: Seq) {
        self.last_applied
            .insert(projection.clone(), (stream.clone(), seq));
    }

    async fn view_get(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
    ) -> Result<Option<String>> {
        Ok(self.guard.views.get(&view_key(projection, table, key)).cloned())
    }

    async fn view_put(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
        value: &str,
    ) -> Result<()> {
        self.set_view(
            projection,
            view_key(projection, table, key),
            Some(value.to_owned()),
        );
        Ok(())
    }

    async fn view_delete(&mut self, projection: &ProjectionName, table: &str, key: &str) -> Result<bool> {
        let key = view_key(projection, table, key);
        if !self.guard.views.contains_key(&key) {
            return Ok(false);
        }
        Ok(self.set_view(projection, key, None).is_some())
    }

    async fn view_scan(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, String)>> {
        Ok(scan_views(&self.guard.views, projection, table, after, limit))
    }

    async fn view_rows(
        &mut self,
        projection: &ProjectionName,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<ViewRow>> {
        Ok(view_range(&self.guard.views, projection, None, after)
            .take(limit)
            .map(|((_, t, k), v)| ViewRow {
                table: t.clone(),
                key: k.clone(),
                value: v.clone(),
            })
            .collect())
    }

    async fn view_clear(&mut self, projection: &ProjectionName) -> Result<u64> {
        let keys: Vec<_> = view_range(&self.guard.views, projection, None, None)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &keys {
            self.set_view(projection, k.clone(), None);
        }
        // The running digest is now empty (each document left it); it
        // starts over with no last event, also when it had none.
        let before = self.guard.digests.get(projection).cloned();
        self.touched
            .entry(projection.clone())
            .or_insert_with(|| (before.as_ref().and_then(|d| d.digest), true))
            .1 = true;
        if before.is_none() {
            self.guard
                .digests
                .insert(projection.clone(), ViewDigest::empty(projection));
            self.undo.push(Undo::Digest(projection.clone(), None));
        }
        Ok(keys.len() as u64)
    }
}

fn scan_views(
    views: &Views,
    projection: &ProjectionName,
    table: &str,
    after: Option<&str>,
    limit: usize,
) -> Vec<(String, String)> {
    view_range(views, projection, Some(table), after.map(|a| (table, a)))
        .take(limit)
        .map(|((_, _, k), v)| (k.clone(), v.clone()))
        .collect()
}

impl ViewStore for MemoryProjectionStore {
    async fn view_get(&self, projection: &ProjectionName, table: &str, key: &str) -> Result<Option<String>> {
        let st = self.state.lock().await;
        Ok(st
            .views
            .get(&view_key(st.stored(projection), table, key))
            .cloned())
    }

    async fn view_scan(
        &self,
        projection: &ProjectionName,
        table: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, String)>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let st = self.state.lock().await;
        Ok(scan_views(&st.views, st.stored(projection), table, after, limit))
    }

    async fn view_digests(&self) -> Result<Vec<ViewDigest>> {
        Ok(self.state.lock().await.digests.values().cloned().collect())
    }

    async fn verify_view_digest(&self, projection: &ProjectionName) -> Result<ViewDigestCheck> {
        let st = self.state.lock().await;
        let projection = st.stored(projection);
        let recorded = st.digest_of(projection);
        let scanned = RunningDigest::of_rows(
            view_range(&st.views, projection, None, None)
                .map(|((_, t, k), v)| (t.as_str(), k.as_str(), v.as_str())),
        );
        Ok(ViewDigestCheck { recorded, scanned })
    }
}

/// Feeds every row of `table` into `out` in key order: the usual body of a
/// memory projection's [`Projection::digest`].
pub fn digest_table(tx: &MemoryTx, table: &str, out: &mut DigestBuilder) {
    out.table(table);
    for (k, v) in tx.scan(table) {
        out.row(&[DigestValue::Text(k), DigestValue::Blob(v)]);
    }
}

impl ProjectionStore for MemoryProjectionStore {
    type Tx = MemoryTx;

    async fn setup(&self, projections: &[Arc<dyn Projection<MemoryTx>>]) -> Result<()> {
        validate_projection_names(projections)?;
        let mut tx = self.begin().await;
        for p in projections {
            p.setup(&mut tx).await.map_err(|e| {
                Error::storage(format_args!("setting up projection `{}` failed", p.name()), e)
            })?;
        }
        tx.commit();
        Ok(())
    }

    async fn apply(
        &self,
        stream: &StreamId,
        events: &[Event],
        projections: &[Arc<dyn Projection<MemoryTx>>],
    ) -> Result<ApplyOutcome> {
        let mut tx = self.begin().await;
        let outcome = apply_in(&mut tx, stream, events, projections).await?;
        if matches!(outcome, ApplyOutcome::Applied(_)) {
            tx.commit();
        }
        Ok(outcome)
    }

    async fn apply_runs(
        &self,
        runs: &[&[Event]],
        projections: &[Arc<dyn Projection<MemoryTx>>],
    ) -> Result<Vec<ApplyOutcome>> {
        let mut tx = self.begin().await;
        let outcomes = apply_runs_in(&mut tx, runs, projections).await?;
        if all_applied(&outcomes, runs.len()) {
            tx.commit();
        }
        Ok(outcomes)
    }

    async fn checkpoint(&self, projection: &ProjectionName, stream: &StreamId) -> Result<u64> {
        let st = self.state.lock().await;
        Ok(st
            .checkpoints
            .get(&(st.stored(projection).clone(), stream.clone()))
            .copied()
            .unwrap_or(0))
    }

    async fn reset(&self, projection: &dyn Projection<MemoryTx>) -> Result<()> {
        let mut tx = self.begin().await;
        projection.reset(&mut tx).await.map_err(|e| {
            Error::storage(
                format_args!("resetting projection `{}` failed", projection.name()),
                e,
            )
        })?;
        let stored = tx.guard.stored(projection.name()).clone();
        tx.guard.checkpoints.retain(|(p, _), _| p != &stored);
        // A rebuild applies every event again: nothing stays skipped.
        tx.guard.clear_skips(projection.name());
        tx.commit();
        Ok(())
    }

    async fn digest(&self, projection: &dyn Projection<MemoryTx>) -> Result<Digest> {
        let mut tx = self.begin().await;
        let mut out = DigestBuilder::new();
        projection.digest(&mut tx, &mut out).await.map_err(|e| {
            Error::storage(
                format_args!("digest of projection `{}` failed", projection.name()),
                e,
            )
        })?;
        out.table("checkpoints");
        let stored = tx.guard.stored(projection.name());
        for ((p, s), cp) in &tx.guard.checkpoints {
            if p == stored {
                out.row(&[DigestValue::Text(s.as_str()), DigestValue::Int(*cp as i64)]);
            }
        }
        Ok(out.finish())
    }
}

/// Raises the stream's watermark to `applied` (never lowers it); returns
/// the previous watermark when it changed (`Some(None)`: there was none).
fn raise_watermark(
    st: &mut State,
    stream: &StreamId,
    applied: u64,
    now: outbox_core::Timestamp,
) -> Option<Option<Watermark>> {
    let old = st.watermarks.get(stream).cloned();
    if old.as_ref().is_some_and(|w| w.applied_through >= applied) {
        return None;
    }
    st.watermarks.insert(
        stream.clone(),
        Watermark {
            stream: stream.clone(),
            applied_through: applied,
            expected_next: applied + 1,
            updated_at: now,
        },
    );
    Some(old)
}

impl outbox_core::SkippedEvents for MemoryProjectionStore {
    async fn skipped(
        &self,
        projection: Option<&ProjectionName>,
        limit: usize,
    ) -> Result<Vec<outbox_core::SkippedEvent>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let st = self.state.lock().await;
        Ok(st
            .skipped
            .iter()
            .filter(|((p, _, _), _)| projection.is_none_or(|want| want == p))
            .take(limit)
            .map(|((p, s, seq), (error, at))| outbox_core::SkippedEvent {
                projection: p.clone(),
                stream: s.clone(),
                seq: *seq,
                error: error.clone(),
                skipped_at: *at,
            })
            .collect())
    }

    async fn reapply(&self, event: &Event, projection: &Arc<dyn Projection<MemoryTx>>) -> Result<bool> {
        let mut tx = self.begin().await;
        let done = outbox_core::spi::reapply_in(&mut tx, event, projection).await?;
        if done {
            tx.commit();
        }
        Ok(done)
    }
}

impl WatermarkStore for MemoryProjectionStore {
    async fn watermark(&self, stream: &StreamId) -> Result<Option<Watermark>> {
        Ok(self.state.lock().await.watermarks.get(stream).cloned())
    }

    async fn watermarks(&self, after: Option<&StreamId>, limit: usize) -> Result<Vec<Watermark>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let st = self.state.lock().await;
        let lower = after.map_or(Bound::Unbounded, |a| Bound::Excluded(a.clone()));
        Ok(st
            .watermarks
            .range((lower, Bound::Unbounded))
            .take(limit)
            .map(|(_, w)| w.clone())
            .collect())
    }
}

fn active_run_conflict(run: &RunRecord) -> Error {
    Error::InvalidState(format!(
        "{} run {} is already {} on projection `{}` (owner {}); wait for it or cancel it with `outbox runs cancel {}`",
        run.kind, run.id, run.state, run.projection, run.owner, run.id
    ))
}

fn owned_active<'a>(st: &'a mut State, id: u64, owner: &WorkerId) -> Result<&'a mut RunRecord> {
    let run = st
        .runs
        .get_mut(&id)
        .ok_or_else(|| Error::NotFound(format!("run {id}")))?;
    if !run.state.is_active() || &run.owner != owner {
        return Err(Error::InvalidState(format!(
            "run {id} is {} and owned by {}; {owner} cannot update it",
            run.state, run.owner
        )));
    }
    Ok(run)
}

/// The message of a run reclaimed because its owner left the worker registry.
const RECLAIMED: &str = "the run's owner is gone from the worker registry";

impl RunStore for MemoryProjectionStore {
    async fn admit_bounded_run(
        &self,
        kind: RunKind,
        projection: &ProjectionName,
        bounds: RunBounds,
        owner: &WorkerId,
        ttl: std::time::Duration,
    ) -> Result<RunRecord> {
        validate_ttl(ttl)?;
        bounds.validate(kind)?;
        let now = self.clock.now();
        let mut st = self.state.lock().await;
        for run in st.runs.values_mut() {
            if &run.projection == projection && run.state.is_active() {
                if run.lease_expires_at > now {
                    return Err(active_run_conflict(run));
                }
                run.state = RunState::Failed;
                run.error_code = Some("abandoned".into());
                run.error_message = Some("the run's owner stopped renewing its claim".into());
                run.updated_at = now;
            }
        }
        st.last_run_id += 1;
        let id = st.last_run_id;
        let run = RunRecord {
            id,
            kind,
            projection: projection.clone(),
            state: RunState::Queued,
            since: bounds.since,
            until: bounds.until,
            position: None,
            processed: 0,
            last_stream: None,
            last_seq: None,
            error_code: None,
            error_message: None,
            cancel_requested: false,
            owner: owner.clone(),
            lease_expires_at: now.saturating_add(ttl),
            created_at: now,
            updated_at: now,
        };
        st.runs.insert(id, run.clone());
        Ok(run)
    }

    async fn reclaim_run(
        &self,
        projection: &ProjectionName,
        live: &[WorkerId],
        idle: std::time::Duration,
    ) -> Result<Option<RunRecord>> {
        let now = self.clock.now();
        let mut st = self.state.lock().await;
        let Some(run) = st
            .runs
            .values_mut()
            .find(|r| &r.projection == projection && r.state.is_active())
        else {
            return Ok(None);
        };
        if live.contains(&run.owner) || run.updated_at > now.saturating_sub(idle) {
            return Ok(None);
        }
        run.state = RunState::Failed;
        run.error_code = Some("abandoned".into());
        run.error_message = Some(RECLAIMED.into());
        run.updated_at = now;
        Ok(Some(run.clone()))
    }

    async fn record_progress(
        &self,
        id: u64,
        owner: &WorkerId,
        progress: RunProgress<'_>,
        ttl: std::time::Duration,
    ) -> Result<RunRecord> {
        let RunProgress {
            processed,
            last,
            position,
        } = progress;
        validate_ttl(ttl)?;
        let now = self.clock.now();
        let mut st = self.state.lock().await;
        let run = owned_active(&mut st, id, owner)?;
        run.state = RunState::Running;
        run.processed = processed;
        if let Some((stream, seq)) = last {
            run.last_stream = Some(stream.clone());
            run.last_seq = Some(seq);
        }
        if position.is_some() {
            run.position = position;
        }
        run.lease_expires_at = now.saturating_add(ttl);
        run.updated_at = now;
        Ok(run.clone())
    }

    async fn finish_run(&self, id: u64, owner: &WorkerId, end: RunEnd) -> Result<RunRecord> {
        let now = self.clock.now();
        let mut st = self.state.lock().await;
        let run = owned_active(&mut st, id, owner)?;
        run.state = end.state();
        if let RunEnd::Failed { code, message } = end {
            run.error_code = Some(code);
            let storable = message.replace('\0', "\u{fffd}");
            run.error_message = Some(outbox_core::spi::truncate_error(&storable).to_owned());
        }
        run.updated_at = now;
        Ok(run.clone())
    }

    async fn cancel_run(&self, id: u64) -> Result<RunRecord> {
        let now = self.clock.now();
        let mut st = self.state.lock().await;
        let run = st
            .runs
            .get_mut(&id)
            .ok_or_else(|| Error::NotFound(format!("run {id}")))?;
        match run.state {
            RunState::Queued => run.state = RunState::Cancelled,
            RunState::Running => run.cancel_requested = true,
            _ => return Err(Error::InvalidState(format!("run {id} is already {}", run.state))),
        }
        run.updated_at = now;
        Ok(run.clone())
    }

    async fn run(&self, id: u64) -> Result<Option<RunRecord>> {
        Ok(self.state.lock().await.runs.get(&id).cloned())
    }

    async fn runs(&self, limit: usize) -> Result<Vec<RunRecord>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        Ok(self
            .state
            .lock()
            .await
            .runs
            .values()
            .rev()
            .take(limit)
            .cloned()
            .collect())
    }

    async fn prune_runs(&self, older_than: std::time::Duration) -> Result<u64> {
        let cutoff = self.clock.now().saturating_sub(older_than);
        let mut st = self.state.lock().await;
        let before = st.runs.len();
        st.runs
            .retain(|_, r| r.state.is_active() || r.updated_at > cutoff);
        Ok((before - st.runs.len()) as u64)
    }
}
