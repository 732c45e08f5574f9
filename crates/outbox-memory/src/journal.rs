//! The in-memory journal database: events, outbox rows, stream leases.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use outbox_core::spi::{
    plan_append, truncate_error, validate_limit, validate_ttl, validate_wanted, worker_id_held,
};
use outbox_core::{ActivityCounts, ActivitySeries, MINUTE_MS, MinuteActivity, validate_activity_minutes};
use outbox_core::{
    AppendOptions, AppendRequest, Appended, ClaimedRun, Clock, DeadLetters, Error, Event, EventJournal,
    EventType, FailureDecision, FailureOutcome, Lease, LeaseAdmin, LeaseEntry, LeaseStore, MAX_PAGE,
    Metadata, OutboxInspector, OutboxQueue, OutboxRow, OutboxStatus, OutboxSummary, PayloadHash, Result,
    RetryPolicy, Seq, StreamId, StreamVersion, SystemClock, Timestamp, UNFINISHED_ATTEMPT, WorkerId,
    WorkerInfo, WorkerRegistry,
};
use outbox_core::{
    Partition, PartitionHandover, PartitionLease, PartitionStatus, PartitionStore, PartitionSync,
    Partitioning, StreamEnd, SweepLimits, Take,
};

/// The in-memory journal: implements [`EventJournal`](outbox_core::EventJournal), [`OutboxQueue`](outbox_core::OutboxQueue) and
/// [`LeaseStore`](outbox_core::LeaseStore) over one mutex-protected state, so every operation is one
/// atomic "transaction". Clones share the state (like two connections to one
/// database); time comes from the injected [`Clock`], which plays the role of
/// the database's clock.
#[derive(Clone, Debug)]
pub struct MemoryJournal {
    state: Arc<Mutex<State>>,
    clock: Arc<dyn Clock>,
    /// The journal's partitioning (a copy is in the state).
    partitioning: Partitioning,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    streams: BTreeMap<StreamId, Vec<Event>>,
    /// Every event as (stream, index in its vector), in global-position
    /// order: position `p` is at `p - 1` (positions start at 1, no holes).
    global: Vec<(StreamId, usize)>,
    next_global: u64,
    outbox: BTreeMap<(StreamId, Seq), OutboxRow>,
    /// Rows whose attempt of their own began (`begin_attempt`), until a
    /// claim or a completion clears the mark (ADR 0029).
    attempts_begun: BTreeSet<(StreamId, Seq)>,
    /// stream -> (head seq, due time or None when the head is dead)
    heads: HashMap<StreamId, (Seq, Option<Timestamp>)>,
    /// (due time, stream) for every head that is not dead: the "index".
    due: BTreeSet<(Timestamp, StreamId)>,
    leases: HashMap<StreamId, LeaseRecord>,
    workers: BTreeMap<WorkerId, WorkerInfo>,
    /// (minute start, worker) -> counts: the activity buckets.
    activity: BTreeMap<(Timestamp, WorkerId), ActivityCounts>,
    /// The journal's partitioning (a stream's partition is computed from it).
    partitioning: Partitioning,
    /// Every partition ever leased.
    partition_leases: BTreeMap<Partition, LeaseRecord>,
    /// Sink checkpoints and cursors.
    pub(crate) sinks: crate::sinks::SinkState,
    /// The consumer registry (ADR 0032), by key.
    pub(crate) consumers: std::collections::BTreeMap<outbox_core::SinkName, outbox_core::ConsumerInfo>,
}

#[derive(Clone, Debug)]
struct LeaseRecord {
    owner: Option<WorkerId>,
    epoch: u64,
    expires_at: Timestamp,
}

impl LeaseRecord {
    fn held_by_other(&self, owner: Option<&WorkerId>, now: Timestamp) -> bool {
        self.owner.is_some() && self.expires_at > now && self.owner.as_ref() != owner
    }
}

impl Default for MemoryJournal {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryJournal {
    /// An empty journal on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock::new()))
    }

    /// An empty journal divided by `partitioning` (by default 16 partitions
    /// by CRC-32), on the system clock.
    pub fn with_partitioning(partitioning: Partitioning) -> Self {
        let mut journal = Self::new();
        journal.lock().partitioning = partitioning.clone();
        journal.partitioning = partitioning;
        journal
    }

    /// An empty journal on `clock` (a [`ManualClock`](outbox_core::ManualClock) in tests).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryJournal {
            state: Arc::new(Mutex::new(State {
                next_global: 1,
                ..State::default()
            })),
            clock,
            partitioning: Partitioning::default(),
        }
    }

    #[cfg(feature = "test-util")]
    /// Test support: flips one byte of the stored payload of `stream`/`seq`
    /// (an empty payload gains a byte), leaving its stored hash as it was, so
    /// reading the event reports [`Error::Corrupt`]. Returns whether the event
    /// exists. Never call it outside tests.
    #[doc(hidden)]
    pub fn corrupt_payload_for_tests(&self, stream: &StreamId, seq: Seq) -> bool {
        let mut st = self.lock();
        let Some(event) = st
            .streams
            .get_mut(stream)
            .and_then(|v| v.get_mut(seq.get() as usize - 1))
        else {
            return false;
        };
        match event.payload.first_mut() {
            Some(b) => *b ^= 0xff,
            None => event.payload.push(0),
        }
        true
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied
        // operation: every mutation is computed first and written last.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Claimed runs with the events of the fresh ones (no row failed
    /// before), as the SQLite journal's claims return them: a retried run
    /// goes alone in the worker, which reads it there, and a run with an
    /// event that does not verify is left unread, for the worker's own read
    /// to record.
    fn loaded(&self, runs: Vec<(Lease, Vec<OutboxRow>)>) -> Vec<ClaimedRun> {
        let st = self.lock();
        let mut runs = ClaimedRun::unloaded(runs);
        for run in &mut runs {
            let (Some(first), true) = (run.rows.first(), run.rows.iter().all(OutboxRow::is_fresh)) else {
                continue;
            };
            let events = st
                .streams
                .get(&run.lease.stream)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let start = usize::try_from(first.seq.get() - 1)
                .unwrap_or(usize::MAX)
                .min(events.len());
            let read: Vec<Event> = events[start..].iter().take(run.rows.len()).cloned().collect();
            run.events = read.iter().all(|e| e.verify().is_ok()).then_some(read);
        }
        runs
    }
}

impl State {
    pub(crate) fn version_of(&self, stream: &StreamId) -> u64 {
        self.streams.get(stream).map_or(0, |v| v.len() as u64)
    }

    fn stream_rows(&self, stream: &StreamId) -> impl Iterator<Item = (&Seq, &OutboxRow)> {
        self.outbox
            .range((stream.clone(), Seq::FIRST)..=(stream.clone(), Seq::MAX))
            .map(|((_, seq), row)| (seq, row))
    }

    /// Recomputes the head entry of `stream` after any change to its rows.
    fn refresh_head(&mut self, stream: &StreamId) {
        if let Some((_, Some(due))) = self.heads.remove(stream) {
            self.due.remove(&(due, stream.clone()));
        }
        let head = self.stream_rows(stream).next().map(|(seq, row)| {
            (
                *seq,
                (row.status != OutboxStatus::Dead).then_some(row.next_attempt_at),
            )
        });
        if let Some((seq, due)) = head {
            if let Some(due) = due {
                self.due.insert((due, stream.clone()));
            }
            self.heads.insert(stream.clone(), (seq, due));
        }
    }

    fn check_lease(&self, lease: &Lease, now: Timestamp) -> Result<()> {
        let record = match lease.partition {
            Some(p) => self.partition_leases.get(&p),
            None => self.leases.get(&lease.stream),
        };
        match record {
            Some(r)
                if r.owner.as_ref() == Some(&lease.owner) && r.epoch == lease.epoch && r.expires_at > now =>
            {
                Ok(())
            }
            _ => Err(lease.lost()),
        }
    }

    /// Whether `stream`'s partition is held (unexpired) by someone other
    /// than `owner` (anyone, when `owner` is `None`).
    fn partition_held_by_other(&self, stream: &StreamId, owner: Option<&WorkerId>, now: Timestamp) -> bool {
        let p = self.partitioning.of(stream);
        self.partition_leases
            .get(&p)
            .is_some_and(|r| r.held_by_other(owner, now))
    }

    /// Holds `stream`'s head (if due at all) out of the due index until
    /// `until`: a stream claimed in a partition is in flight.
    fn hold_head(&mut self, stream: &StreamId, until: Timestamp) {
        if let Some((_, Some(due))) = self.heads.get_mut(stream) {
            let old = std::mem::replace(due, until);
            self.due.remove(&(old, stream.clone()));
            self.due.insert((until, stream.clone()));
        }
    }

    /// The claim of the lease's stream's head run (the lease checked by the
    /// caller). A head applied alone (`alone`, or found `processing`) is
    /// claimed by itself (ADR 0029).
    fn claim_run(&mut self, lease: &Lease, max: usize, now: Timestamp) -> Vec<OutboxRow> {
        let mut seqs = Vec::new();
        let mut expect: Option<u64> = None;
        for (seq, row) in self.stream_rows(&lease.stream).take(max) {
            let contiguous = expect.is_none_or(|e| e == seq.get());
            if !contiguous || row.status == OutboxStatus::Dead || row.next_attempt_at > now {
                break;
            }
            // A row applied alone is claimed by itself (as the head) or not at all.
            let by_itself = row.alone || row.status == OutboxStatus::Processing;
            if by_itself && !seqs.is_empty() {
                break;
            }
            seqs.push(*seq);
            expect = Some(seq.get() + 1);
            if by_itself {
                break;
            }
        }
        let mut out = Vec::with_capacity(seqs.len());
        for seq in seqs {
            let key = (lease.stream.clone(), seq);
            let began = self.attempts_begun.remove(&key);
            if let Some(row) = self.outbox.get_mut(&key) {
                if row.status == OutboxStatus::Processing {
                    if began {
                        // An attempt of its own ended without a result: the
                        // claimer records it (`fail`).
                        row.last_error = Some(UNFINISHED_ATTEMPT.to_owned());
                        row.first_failed_at.get_or_insert(now);
                    }
                    row.alone = true;
                }
                row.status = OutboxStatus::Processing;
                row.updated_at = now;
                out.push(row.clone());
            }
        }
        out
    }

    fn processing_row(&mut self, lease: &Lease, seq: Seq) -> Result<&mut OutboxRow> {
        let row = self
            .outbox
            .get_mut(&(lease.stream.clone(), seq))
            .ok_or_else(|| Error::NotFound(format!("outbox row {}/{seq}", lease.stream)))?;
        if row.status != OutboxStatus::Processing {
            return Err(Error::InvalidState(format!(
                "outbox row {}/{seq} is {}, not processing",
                lease.stream, row.status
            )));
        }
        Ok(row)
    }
}

/// A new row: pending, due `now`, never tried.
fn pending_row(stream: &StreamId, seq: Seq, event_type: &EventType, now: Timestamp) -> OutboxRow {
    OutboxRow {
        stream: stream.clone(),
        seq,
        event_type: event_type.clone(),
        status: OutboxStatus::Pending,
        attempt_count: 0,
        next_attempt_at: now,
        last_error: None,
        updated_at: now,
        first_failed_at: None,
        alone: false,
    }
}

fn sorted_rows<'a>(rows: impl Iterator<Item = &'a OutboxRow>) -> Vec<&'a OutboxRow> {
    let mut v: Vec<&OutboxRow> = rows.collect();
    v.sort_by(|a, b| (a.next_attempt_at, &a.stream, a.seq).cmp(&(b.next_attempt_at, &b.stream, b.seq)));
    v
}

impl EventJournal for MemoryJournal {
    async fn append(&self, batch: &[AppendRequest], options: AppendOptions) -> Result<Vec<Appended>> {
        options.validate(batch)?;
        let now = self.now();
        let mut st = self.lock();
        // Check every request before writing anything: all or nothing.
        plan_append(batch, |s| st.version_of(s))?;
        let mut out = Vec::with_capacity(batch.len());
        for req in batch {
            let first = st.version_of(&req.stream) + 1;
            let first_global = st.next_global;
            for (i, new) in req.events.iter().enumerate() {
                let seq = Seq::new(first + i as u64)?;
                let event = Event {
                    stream: req.stream.clone(),
                    seq,
                    global_position: st.next_global,
                    event_type: new.event_type.clone(),
                    intent: new.intent,
                    payload_hash: PayloadHash::of(&new.payload),
                    decoded: Default::default(),
                    payload: new.payload.clone(),
                    metadata: Metadata {
                        recorded_at: now,
                        correlation_id: new.metadata.correlation_id.clone(),
                        causation_id: new.metadata.causation_id.clone(),
                    },
                };
                st.next_global += 1;
                let index = st.streams.get(&req.stream).map_or(0, Vec::len);
                st.global.push((req.stream.clone(), index));
                if options.enqueues() {
                    st.outbox.insert(
                        (req.stream.clone(), seq),
                        pending_row(&req.stream, seq, &new.event_type, now),
                    );
                }
                st.streams.entry(req.stream.clone()).or_default().push(event);
            }
            if options.enqueues() {
                st.refresh_head(&req.stream);
            }
            out.push(Appended {
                stream: req.stream.clone(),
                first_seq: Seq::new(first)?,
                last_seq: Seq::new(first + req.events.len() as u64 - 1)?,
                first_global_position: first_global,
                recorded_at: now,
            });
        }
        Ok(out)
    }

    async fn load(&self, stream: &StreamId, seq: Seq) -> Result<Event> {
        let st = self.lock();
        let event = st
            .streams
            .get(stream)
            .and_then(|v| v.get(seq.get() as usize - 1))
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("event {stream}/{seq}")))?;
        event.verify()?;
        Ok(event)
    }

    async fn read_stream(&self, stream: &StreamId, from: Seq, limit: usize) -> Result<Vec<Event>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let st = self.lock();
        let events = st.streams.get(stream).map(Vec::as_slice).unwrap_or_default();
        let start = usize::try_from(from.get() - 1)
            .unwrap_or(usize::MAX)
            .min(events.len());
        let out: Vec<Event> = events[start..].iter().take(limit).cloned().collect();
        out.iter().try_for_each(Event::verify)?;
        Ok(out)
    }

    async fn read_global(&self, after: u64, limit: usize) -> Result<Vec<Event>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let st = self.lock();
        let start = usize::try_from(after).unwrap_or(usize::MAX).min(st.global.len());
        let out: Vec<Event> = st.global[start..]
            .iter()
            .take(limit)
            .map(|(stream, i)| st.streams[stream][*i].clone())
            .collect();
        out.iter().try_for_each(Event::verify)?;
        Ok(out)
    }

    async fn stream_version(&self, stream: &StreamId) -> Result<u64> {
        Ok(self.lock().version_of(stream))
    }

    async fn stream_versions(&self, after: Option<&StreamId>, limit: usize) -> Result<Vec<StreamVersion>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let st = self.lock();
        let lower = after.map_or(Bound::Unbounded, |a| Bound::Excluded(a.clone()));
        st.streams
            .range((lower, Bound::Unbounded))
            .take(limit)
            .map(|(s, v)| {
                Ok(StreamVersion {
                    stream: s.clone(),
                    version: v.len() as u64,
                })
            })
            .collect()
    }
}

impl OutboxQueue for MemoryJournal {
    async fn due_streams(&self, limit: usize) -> Result<Vec<StreamId>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let now = self.now();
        let st = self.lock();
        Ok(st
            .due
            .iter()
            .take_while(|(due, _)| *due <= now)
            .filter(|(_, s)| st.leases.get(s).is_none_or(|l| !l.held_by_other(None, now)))
            .filter(|(_, s)| !st.partition_held_by_other(s, None, now))
            .take(limit)
            .map(|(_, s)| s.clone())
            .collect())
    }

    async fn claim(&self, lease: &Lease, max: usize) -> Result<Vec<OutboxRow>> {
        let max = validate_limit(max, MAX_PAGE)?;
        let now = self.now();
        let mut st = self.lock();
        st.check_lease(lease, now)?;
        let rows = st.claim_run(lease, max, now);
        if lease.partition.is_some() && !rows.is_empty() {
            st.hold_head(&lease.stream, lease.expires_at);
        }
        Ok(rows)
    }

    async fn complete(&self, stream: &StreamId, through: Seq) -> Result<u64> {
        let mut st = self.lock();
        let doomed: Vec<Seq> = st
            .stream_rows(stream)
            .take_while(|(s, _)| **s <= through)
            .map(|(s, _)| *s)
            .collect();
        for seq in &doomed {
            st.outbox.remove(&(stream.clone(), *seq));
            st.attempts_begun.remove(&(stream.clone(), *seq));
        }
        st.refresh_head(stream);
        Ok(doomed.len() as u64)
    }

    async fn fail(
        &self,
        lease: &Lease,
        seq: Seq,
        error: &str,
        policy: &RetryPolicy,
    ) -> Result<FailureOutcome> {
        let now = self.now();
        let mut st = self.lock();
        st.check_lease(lease, now)?;
        let row = st.processing_row(lease, seq)?;
        let attempt = row.attempt_count.saturating_add(1);
        row.attempt_count = attempt;
        row.last_error = Some(truncate_error(error).to_owned());
        row.updated_at = now;
        row.first_failed_at.get_or_insert(now);
        let outcome = match policy.decide(attempt) {
            FailureDecision::DeadLetter => {
                row.status = OutboxStatus::Dead;
                row.next_attempt_at = now;
                FailureOutcome::Dead { attempt }
            }
            FailureDecision::Retry(delay) => {
                row.status = OutboxStatus::Failed;
                row.next_attempt_at = now.saturating_add(delay);
                FailureOutcome::Retry {
                    attempt,
                    next_attempt_at: row.next_attempt_at,
                }
            }
        };
        st.refresh_head(&lease.stream);
        Ok(outcome)
    }

    /// A stream's lease and run; or the due streams' leases and runs, then
    /// the events of the fresh runs whose events verify, as the SQLite
    /// journal reads them.
    async fn take(&self, owner: &WorkerId, ttl: Duration, what: Take<'_>) -> Result<Vec<ClaimedRun>> {
        validate_ttl(ttl)?;
        match what {
            Take::Stream { stream, max } => {
                let max = validate_limit(max, MAX_PAGE)?;
                let Some(lease) = self.acquire(stream, owner, ttl).await? else {
                    return Ok(Vec::new());
                };
                let rows = self.claim(&lease, max).await?;
                Ok(vec![ClaimedRun {
                    lease,
                    rows,
                    events: None,
                }])
            }
            Take::Due(limits) => {
                let runs = self.claim_due(owner, ttl, limits).await?;
                Ok(self.loaded(runs))
            }
        }
    }

    async fn complete_and_claim(
        &self,
        lease: &Lease,
        through: Seq,
        max: usize,
    ) -> Result<(u64, Vec<OutboxRow>)> {
        let done = self.complete(&lease.stream, through).await?;
        let rows = outbox_core::spi::unless_lease_lost(self.claim(lease, max).await)?;
        Ok((done, rows))
    }

    async fn finish(&self, ends: &[StreamEnd]) -> Result<u64> {
        let mut done = 0;
        for end in ends {
            if let Some(through) = end.through {
                done += self.complete(&end.lease.stream, through).await?;
            }
            if end.abandon {
                outbox_core::spi::unless_lease_lost(self.abandon(&end.lease))?;
            }
            self.release(&end.lease).await?;
        }
        Ok(done)
    }

    async fn enqueue_catch_up(&self, stream: &StreamId) -> Result<bool> {
        let now = self.now();
        let mut st = self.lock();
        let Some(last) = st.streams.get(stream).and_then(|events| events.last()) else {
            return Ok(false);
        };
        if st.outbox.contains_key(&(stream.clone(), last.seq)) {
            return Ok(false);
        }
        let row = pending_row(stream, last.seq, &last.event_type, now);
        st.outbox.insert((stream.clone(), row.seq), row);
        st.refresh_head(stream);
        Ok(true)
    }

    async fn begin_attempt(&self, lease: &Lease, seq: Seq) -> Result<()> {
        let now = self.now();
        let mut st = self.lock();
        st.check_lease(lease, now)?;
        let row = st.processing_row(lease, seq)?;
        if !row.alone {
            return Err(Error::InvalidState(format!(
                "outbox row {}/{seq} is not applied alone",
                lease.stream
            )));
        }
        st.attempts_begun.insert((lease.stream.clone(), seq));
        Ok(())
    }
}

impl MemoryJournal {
    /// Returns the lease's `processing` rows to `pending` (`finish`'s abandon).
    fn abandon(&self, lease: &Lease) -> Result<u64> {
        let now = self.now();
        let mut st = self.lock();
        st.check_lease(lease, now)?;
        let seqs: Vec<Seq> = st
            .stream_rows(&lease.stream)
            .filter(|(_, r)| r.status == OutboxStatus::Processing)
            .map(|(s, _)| *s)
            .collect();
        for seq in &seqs {
            if let Some(row) = st.outbox.get_mut(&(lease.stream.clone(), *seq)) {
                row.status = OutboxStatus::Pending;
                row.updated_at = now;
            }
        }
        st.refresh_head(&lease.stream);
        Ok(seqs.len() as u64)
    }

    /// Leases the due streams and claims their head runs (a sweep's start).
    async fn claim_due(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        limits: SweepLimits,
    ) -> Result<Vec<(Lease, Vec<OutboxRow>)>> {
        let limits = limits.validated()?;
        let mut taken: Vec<(Lease, Vec<OutboxRow>)> = Vec::new();
        let mut rows = 0;
        let result = async {
            for stream in self.due_streams(limits.streams).await? {
                if rows >= limits.rows {
                    break;
                }
                let max = limits.per_stream.min(limits.rows - rows);
                let Some(lease) = self.acquire(&stream, owner, ttl).await? else {
                    continue;
                };
                let run = self.claim(&lease, max).await?;
                if run.is_empty() {
                    self.release(&lease).await?;
                    continue;
                }
                rows += run.len();
                taken.push((lease, run));
            }
            Ok::<(), Error>(())
        }
        .await;
        if let Err(e) = result {
            // Leave nothing leased: best effort, the error is the news.
            let ends: Vec<StreamEnd> = taken
                .iter()
                .map(|(lease, _)| StreamEnd {
                    lease: lease.clone(),
                    through: None,
                    abandon: true,
                })
                .collect();
            let _ = self.finish(&ends).await;
            return Err(e);
        }
        Ok(taken)
    }
}

impl DeadLetters for MemoryJournal {
    async fn requeue(&self, stream: &StreamId, seq: Seq) -> Result<OutboxRow> {
        let now = self.now();
        let mut st = self.lock();
        let row = st
            .outbox
            .get_mut(&(stream.clone(), seq))
            .ok_or_else(|| Error::NotFound(format!("outbox row {stream}/{seq}")))?;
        if row.status != OutboxStatus::Dead {
            return Err(Error::InvalidState(format!(
                "outbox row {stream}/{seq} is {}, not dead; only dead rows can be requeued",
                row.status
            )));
        }
        revive(row, now);
        let row = row.clone();
        st.refresh_head(stream);
        Ok(row)
    }

    async fn retry(&self, stream: &StreamId, seq: Seq) -> Result<OutboxRow> {
        let now = self.now();
        let mut st = self.lock();
        let row = st
            .outbox
            .get_mut(&(stream.clone(), seq))
            .ok_or_else(|| Error::NotFound(format!("outbox row {stream}/{seq}")))?;
        match row.status {
            OutboxStatus::Dead => {
                return Err(Error::InvalidState(format!(
                    "outbox row {stream}/{seq} is dead; use requeue for dead rows"
                )));
            }
            OutboxStatus::Processing => {
                return Err(Error::InvalidState(format!(
                    "outbox row {stream}/{seq} is processing; a worker holds it"
                )));
            }
            OutboxStatus::Pending | OutboxStatus::Failed => {}
        }
        row.status = OutboxStatus::Pending;
        row.next_attempt_at = row.next_attempt_at.min(now);
        row.updated_at = now;
        let row = row.clone();
        st.refresh_head(stream);
        Ok(row)
    }

    async fn requeue_dead(&self, limit: usize) -> Result<Vec<OutboxRow>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let now = self.now();
        let mut st = self.lock();
        let keys: Vec<(StreamId, Seq)> =
            sorted_rows(st.outbox.values().filter(|r| r.status == OutboxStatus::Dead))
                .into_iter()
                .take(limit)
                .map(|r| (r.stream.clone(), r.seq))
                .collect();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(row) = st.outbox.get_mut(&key) {
                revive(row, now);
                out.push(row.clone());
            }
            st.refresh_head(&key.0);
        }
        Ok(out)
    }
}

impl OutboxInspector for MemoryJournal {
    async fn row(&self, stream: &StreamId, seq: Seq) -> Result<Option<OutboxRow>> {
        Ok(self.lock().outbox.get(&(stream.clone(), seq)).cloned())
    }

    async fn head(&self, stream: &StreamId) -> Result<Option<OutboxRow>> {
        Ok(self.lock().stream_rows(stream).next().map(|(_, r)| r.clone()))
    }

    async fn summary(&self) -> Result<OutboxSummary> {
        let now = self.now();
        let st = self.lock();
        let mut s = OutboxSummary {
            as_of: now,
            ..OutboxSummary::default()
        };
        for row in st.outbox.values() {
            match row.status {
                OutboxStatus::Pending => s.pending += 1,
                OutboxStatus::Processing => s.processing += 1,
                OutboxStatus::Failed => s.failed += 1,
                OutboxStatus::Dead => s.dead += 1,
            }
        }
        s.oldest_retry_eligible = sorted_rows(
            st.outbox
                .values()
                .filter(|r| matches!(r.status, OutboxStatus::Pending | OutboxStatus::Failed)),
        )
        .first()
        .map(|r| (*r).clone());
        s.oldest_applicable_due = st.heads.values().filter_map(|(_, due)| *due).min();
        Ok(s)
    }

    async fn list(&self, status: Option<OutboxStatus>, limit: usize) -> Result<Vec<OutboxRow>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let st = self.lock();
        Ok(sorted_rows(
            st.outbox
                .values()
                .filter(|r| status.is_none_or(|s| r.status == s)),
        )
        .into_iter()
        .take(limit)
        .cloned()
        .collect())
    }

    async fn leases(&self, after: Option<&StreamId>, limit: usize) -> Result<Vec<LeaseEntry>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let now = self.now();
        let st = self.lock();
        let mut held: Vec<LeaseEntry> = st
            .leases
            .iter()
            .filter(|(s, _)| after.is_none_or(|a| *s > a))
            .filter_map(|(s, r)| {
                r.owner.as_ref().map(|owner| LeaseEntry {
                    lease: Lease {
                        stream: s.clone(),
                        owner: owner.clone(),
                        epoch: r.epoch,
                        expires_at: r.expires_at,
                        partition: None,
                    },
                    expired: r.expires_at <= now,
                })
            })
            .collect();
        held.sort_by(|a, b| a.lease.stream.cmp(&b.lease.stream));
        held.truncate(limit);
        Ok(held)
    }

    async fn lease(&self, stream: &StreamId) -> Result<Option<Lease>> {
        let st = self.lock();
        Ok(st.leases.get(stream).and_then(|r| {
            r.owner.as_ref().map(|owner| Lease {
                stream: stream.clone(),
                owner: owner.clone(),
                epoch: r.epoch,
                expires_at: r.expires_at,
                partition: None,
            })
        }))
    }
}

impl LeaseAdmin for MemoryJournal {
    async fn break_lease(&self, stream: &StreamId) -> Result<Option<Lease>> {
        let now = self.now();
        let mut st = self.lock();
        let Some(r) = st.leases.get_mut(stream) else {
            return Ok(None);
        };
        let Some(owner) = r.owner.take() else {
            return Ok(None);
        };
        let before = Lease {
            stream: stream.clone(),
            owner,
            epoch: r.epoch,
            expires_at: r.expires_at,
            partition: None,
        };
        r.expires_at = now;
        Ok(Some(before))
    }
}

fn revive(row: &mut OutboxRow, now: Timestamp) {
    row.status = OutboxStatus::Pending;
    row.attempt_count = 0;
    row.last_error = None;
    row.first_failed_at = None;
    row.alone = false;
    row.next_attempt_at = now;
    row.updated_at = now;
}

impl LeaseStore for MemoryJournal {
    async fn acquire(&self, stream: &StreamId, owner: &WorkerId, ttl: Duration) -> Result<Option<Lease>> {
        validate_ttl(ttl)?;
        let now = self.now();
        let mut st = self.lock();
        let expires_at = now.saturating_add(ttl);
        if st.heads.contains_key(stream) && st.partition_held_by_other(stream, Some(owner), now) {
            return Ok(None);
        }
        let record = match st.leases.get(stream) {
            Some(r) if r.held_by_other(Some(owner), now) => return Ok(None),
            Some(r) if r.owner.as_ref() == Some(owner) && r.expires_at > now => LeaseRecord {
                expires_at,
                ..r.clone()
            },
            Some(r) => LeaseRecord {
                owner: Some(owner.clone()),
                epoch: r.epoch + 1,
                expires_at,
            },
            None => LeaseRecord {
                owner: Some(owner.clone()),
                epoch: 1,
                expires_at,
            },
        };
        st.leases.insert(stream.clone(), record.clone());
        Ok(Some(Lease {
            stream: stream.clone(),
            owner: owner.clone(),
            epoch: record.epoch,
            expires_at,
            partition: None,
        }))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        validate_ttl(ttl)?;
        let now = self.now();
        let mut st = self.lock();
        st.check_lease(lease, now)?;
        let expires_at = now.saturating_add(ttl);
        let record = match lease.partition {
            Some(p) => st.partition_leases.get_mut(&p),
            None => st.leases.get_mut(&lease.stream),
        };
        if let Some(r) = record {
            r.expires_at = expires_at;
        }
        if lease.partition.is_some() {
            st.hold_head(&lease.stream, expires_at);
        }
        Ok(Lease {
            expires_at,
            ..lease.clone()
        })
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        let now = self.now();
        if lease.partition.is_some() {
            // The partition stays held; the stream's head is due again by its rows.
            let mut st = self.lock();
            if st.check_lease(lease, now).is_ok() {
                st.refresh_head(&lease.stream);
            }
            return Ok(false);
        }
        let mut st = self.lock();
        match st.leases.get_mut(&lease.stream) {
            Some(r)
                if r.owner.as_ref() == Some(&lease.owner) && r.epoch == lease.epoch && r.expires_at > now =>
            {
                r.owner = None;
                r.expires_at = now;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

impl WorkerRegistry for MemoryJournal {
    async fn heartbeat(
        &self,
        id: &WorkerId,
        host: &str,
        pid: u32,
        mode: outbox_core::Mode,
        ttl: Duration,
    ) -> Result<WorkerInfo> {
        validate_ttl(ttl)?;
        let now = self.now();
        let mut st = self.lock();
        if let Some(held) = st.workers.get(id)
            && held.expires_at > now
            && (held.host != host || held.pid != pid)
        {
            return Err(worker_id_held(held));
        }
        let started_at = st.workers.get(id).map_or(now, |w| w.started_at);
        let info = WorkerInfo {
            id: id.clone(),
            host: host.to_owned(),
            pid,
            mode,
            started_at,
            last_beat: now,
            expires_at: now.saturating_add(ttl),
        };
        st.workers.insert(id.clone(), info.clone());
        Ok(info)
    }

    async fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let now = self.now();
        Ok(self
            .lock()
            .workers
            .values()
            .filter(|w| w.expires_at > now)
            .cloned()
            .collect())
    }

    async fn deregister(&self, id: &WorkerId) -> Result<bool> {
        Ok(self.lock().workers.remove(id).is_some())
    }

    async fn prune(&self, grace: Duration) -> Result<u64> {
        let cutoff = self.now().saturating_sub(grace);
        let mut st = self.lock();
        let before = st.workers.len();
        st.workers.retain(|_, w| w.expires_at > cutoff);
        st.activity
            .retain(|(minute, _), _| minute.as_millis().saturating_add(MINUTE_MS) > cutoff.as_millis());
        Ok((before - st.workers.len()) as u64)
    }
}

impl outbox_core::ActivityLog for MemoryJournal {
    async fn record_activity(&self, id: &WorkerId, counts: ActivityCounts) -> Result<()> {
        if counts.is_empty() {
            return Ok(());
        }
        let minute = current_minute(self.now());
        let mut st = self.lock();
        let bucket = st.activity.entry((minute, id.clone())).or_default();
        bucket.applied += counts.applied;
        bucket.failed += counts.failed;
        bucket.dead += counts.dead;
        Ok(())
    }

    async fn activity(&self, minutes: u32) -> Result<ActivitySeries> {
        validate_activity_minutes(minutes)?;
        let current = current_minute(self.now());
        let first = current
            .as_millis()
            .saturating_sub((i64::from(minutes) - 1) * MINUTE_MS);
        let mut sums: BTreeMap<Timestamp, ActivityCounts> = BTreeMap::new();
        for ((minute, _), c) in self.lock().activity.iter() {
            if minute.as_millis() >= first && *minute <= current {
                let s = sums.entry(*minute).or_default();
                s.applied += c.applied;
                s.failed += c.failed;
                s.dead += c.dead;
            }
        }
        Ok(ActivitySeries {
            current_minute: current,
            minutes: sums
                .into_iter()
                .map(|(minute, counts)| MinuteActivity { minute, counts })
                .collect(),
        })
    }
}

/// The start of the minute `now` falls in.
fn current_minute(now: Timestamp) -> Timestamp {
    Timestamp::from_millis(now.as_millis().div_euclid(MINUTE_MS) * MINUTE_MS)
}

impl MemoryJournal {
    /// `sync_partitions`, taking the wanted partitions a worker in `from`
    /// holds ([`PartitionHandover`]).
    fn sync_partitions_from(
        &self,
        owner: &WorkerId,
        wanted: &[Partition],
        from: &[WorkerId],
        ttl: Duration,
    ) -> Result<PartitionSync> {
        validate_ttl(ttl)?;
        let wanted = validate_wanted(wanted, self.partitioning.count())?;
        let now = self.now();
        let expires_at = now.saturating_add(ttl);
        let mut st = self.lock();
        let mut out = PartitionSync::default();
        let held_before: Vec<Partition> = st
            .partition_leases
            .iter()
            .filter(|(_, r)| r.owner.as_ref() == Some(owner) && r.expires_at > now)
            .map(|(p, _)| *p)
            .collect();
        for p in &held_before {
            if wanted.binary_search(p).is_err() {
                if let Some(r) = st.partition_leases.get_mut(p) {
                    r.owner = None;
                    r.expires_at = now;
                }
                out.released.push(*p);
            }
        }
        for p in wanted {
            let record = match st.partition_leases.get(&p) {
                Some(r)
                    if r.held_by_other(Some(owner), now)
                        && !r.owner.as_ref().is_some_and(|o| from.contains(o)) =>
                {
                    out.waiting.push(p);
                    continue;
                }
                Some(r) if r.owner.as_ref() == Some(owner) && r.expires_at > now => LeaseRecord {
                    expires_at,
                    ..r.clone()
                },
                Some(r) => LeaseRecord {
                    owner: Some(owner.clone()),
                    epoch: r.epoch + 1,
                    expires_at,
                },
                None => LeaseRecord {
                    owner: Some(owner.clone()),
                    epoch: 1,
                    expires_at,
                },
            };
            if held_before.binary_search(&p).is_err() {
                out.acquired.push(p);
            }
            out.held.push(PartitionLease {
                partition: p,
                owner: owner.clone(),
                epoch: record.epoch,
                expires_at,
            });
            st.partition_leases.insert(p, record);
        }
        out.released.sort();
        Ok(out)
    }
}

impl PartitionHandover for MemoryJournal {
    async fn sync_partitions_taking(
        &self,
        owner: &WorkerId,
        wanted: &[Partition],
        from: &[WorkerId],
        ttl: Duration,
    ) -> Result<PartitionSync> {
        self.sync_partitions_from(owner, wanted, from, ttl)
    }
}

impl PartitionStore for MemoryJournal {
    fn partitioning(&self) -> &Partitioning {
        &self.partitioning
    }

    async fn sync_partitions(
        &self,
        owner: &WorkerId,
        wanted: &[Partition],
        ttl: Duration,
    ) -> Result<PartitionSync> {
        self.sync_partitions_from(owner, wanted, &[], ttl)
    }

    async fn claim_partitioned(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        limits: SweepLimits,
    ) -> Result<Vec<(Lease, Vec<OutboxRow>)>> {
        validate_ttl(ttl)?;
        let limits = limits.validated()?;
        let now = self.now();
        let expires_at = now.saturating_add(ttl);
        let mut st = self.lock();
        let held: BTreeMap<Partition, u64> = st
            .partition_leases
            .iter()
            .filter(|(_, r)| r.owner.as_ref() == Some(owner) && r.expires_at > now)
            .map(|(p, r)| (*p, r.epoch))
            .collect();
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let due: Vec<(StreamId, Partition)> = st
            .due
            .iter()
            .take_while(|(due, _)| *due <= now)
            .filter_map(|(_, s)| {
                let p = st.partitioning.of(s);
                held.contains_key(&p).then(|| (s.clone(), p))
            })
            .filter(|(s, _)| {
                st.leases
                    .get(s)
                    .is_none_or(|l| !l.held_by_other(Some(owner), now))
            })
            .take(limits.streams)
            .collect();
        let mut taken = Vec::new();
        let mut rows = 0;
        for (stream, p) in due {
            if rows >= limits.rows {
                break;
            }
            let lease = Lease::in_partition(stream, owner, p, held[&p], expires_at);
            let run = st.claim_run(&lease, limits.per_stream.min(limits.rows - rows), now);
            if run.is_empty() {
                continue;
            }
            st.hold_head(&lease.stream, expires_at);
            rows += run.len();
            taken.push((lease, run));
        }
        Ok(taken)
    }

    /// The claim, then the events of its fresh runs whose events verify, as
    /// the SQLite journal reads them.
    async fn claim_and_load_partitioned(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        limits: SweepLimits,
    ) -> Result<Vec<ClaimedRun>> {
        let runs = self.claim_partitioned(owner, ttl, limits).await?;
        Ok(self.loaded(runs))
    }

    async fn partitions(&self) -> Result<Vec<PartitionStatus>> {
        let now = self.now();
        let st = self.lock();
        let mut out: Vec<PartitionStatus> = Partition::all(st.partitioning.count())
            .map(|p| {
                let r = st.partition_leases.get(&p);
                PartitionStatus {
                    partition: p,
                    owner: r.and_then(|r| r.owner.clone()),
                    epoch: r.map_or(0, |r| r.epoch),
                    expires_at: r.map(|r| r.expires_at),
                    held: r.is_some_and(|r| r.owner.is_some() && r.expires_at > now),
                    streams: 0,
                    rows: 0,
                    due_rows: 0,
                }
            })
            .collect();
        let mut last: Option<&StreamId> = None;
        for ((stream, _), row) in &st.outbox {
            let s = &mut out[usize::from(st.partitioning.of(stream).get())];
            if last != Some(stream) {
                s.streams += 1;
                last = Some(stream);
            }
            s.rows += 1;
            if matches!(row.status, OutboxStatus::Pending | OutboxStatus::Failed)
                && row.next_attempt_at <= now
            {
                s.due_rows += 1;
            }
        }
        Ok(out)
    }
}
