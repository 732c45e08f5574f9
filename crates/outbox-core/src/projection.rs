//! Projections: the user's applier, exactly-once planning, digests, watermarks and gaps.

use std::fmt;

use async_trait::async_trait;
use serde::Serialize;
use sha2::{Digest as _, Sha256};

use crate::{BoxError, Error, Event, Intent, ProjectionName, Result, Seq, StreamId, Timestamp};

/// A user's projection: turns events into rows through a transaction handle.
///
/// `Tx` is the adapter's transaction-scoped handle (`MemoryTx`,
/// `sqlx::SqliteConnection`, `sqlx::PgConnection`): everything written
/// through it commits or rolls back together with the checkpoint advance.
///
/// # Contract
/// - `apply` is called at most once per (projection, stream, seq) that
///   commits; it may be called again for an event whose transaction rolled
///   back. It must not commit, roll back or keep the handle.
/// - `apply` must be deterministic in the event: every path (inline, worker,
///   catch-up, rebuild) must produce byte-identical state, which
///   [`Projection::digest`] checks.
/// - `reset` deletes everything this projection wrote (used by rebuild). The
///   store resets the projection's checkpoints in the same transaction.
/// - `digest` feeds every row of every table the projection owns into the
///   builder in a deterministic (primary-key) order.
/// - Errors are returned, never panicked; a returned error rolls back the
///   whole apply transaction and the outbox row is retried by the policy.
#[async_trait]
pub trait Projection<Tx: Send>: Send + Sync {
    /// The projection's name; checkpoints are kept under it.
    fn name(&self) -> &ProjectionName;

    /// Creates the projection's tables if they do not exist. Called by
    /// [`ProjectionStore::setup`](crate::ProjectionStore::setup).
    async fn setup(&self, _tx: &mut Tx) -> Result<(), BoxError> {
        Ok(())
    }

    /// Applies one event (never an [`Intent::AuditOnly`] one).
    async fn apply(&self, tx: &mut Tx, event: &Event) -> Result<(), BoxError>;

    /// Applies a run of one stream's events, in seq order: every event the
    /// projection has not applied yet among those a batch hands it (never
    /// an [`Intent::AuditOnly`] one, so seqs may skip), all in the store's
    /// one transaction. Called only when
    /// [`applies_runs`](Self::applies_runs) says yes; the default calls
    /// [`apply`](Self::apply) for each event.
    ///
    /// Override it (and `applies_runs`) to write a whole run at once: one
    /// closure on SQLite (`SqliteTx::run`: one handoff to the writer thread
    /// instead of one per event), one multi-row statement on Postgres. The
    /// result must be the state `apply` would write event by event (the
    /// digest checks it).
    ///
    /// A failure names the event it belongs to ([`FailedEvent::at`]): the
    /// worker commits the events before it, and the retry policy, the
    /// dead letter or the skip record apply to that event alone. A run
    /// written in one statement that fails must find its event before it
    /// answers: on SQLite a failed statement leaves the transaction usable,
    /// so apply the events one at a time; on Postgres, take a `SAVEPOINT`
    /// before the statement, roll back to it and do the same. A panic
    /// inside a run cannot name its event: it is blamed on the run's first.
    async fn apply_run(&self, tx: &mut Tx, events: &[&Event]) -> Result<(), FailedEvent> {
        for (index, event) in events.iter().enumerate() {
            self.apply(tx, event)
                .await
                .map_err(|source| FailedEvent::at(index, source))?;
        }
        Ok(())
    }

    /// Deletes everything the projection wrote.
    async fn reset(&self, tx: &mut Tx) -> Result<(), BoxError>;

    /// Feeds the projection's state into `out`, in a deterministic order.
    async fn digest(&self, tx: &mut Tx, out: &mut DigestBuilder) -> Result<(), BoxError>;

    /// Whether the worker hands this projection its events a run at a
    /// time ([`apply_run`](Self::apply_run)) rather than one at a time
    /// ([`apply`](Self::apply)). Say yes only with an `apply_run` of your
    /// own.
    fn applies_runs(&self) -> bool {
        false
    }

    /// Whether `apply` writes only documents through the transaction's
    /// view API and never runs statements of its own, so it cannot end the
    /// transaction: the apply then skips its guard against user code doing
    /// so (one savepoint and its release fewer per batch). The
    /// backend-neutral wrapper ([`view_projection`](crate::view_projection))
    /// says yes; a hand-written projection keeps the default `false`.
    fn documents_only(&self) -> bool {
        false
    }

    /// This projection as [`Any`](std::any::Any), so the library can
    /// recognize the wrappers it builds itself: a plain
    /// [`view_projection`](crate::view_projection) is known as a view
    /// however it was registered ([`view_of`](crate::view_of)). A
    /// hand-written projection keeps the default `None`.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

/// A failure of [`Projection::apply_run`]: the event it belongs to (an
/// index into the run handed over) and what went wrong.
#[derive(Debug)]
pub struct FailedEvent {
    /// The failing event's index in the run.
    pub index: usize,
    /// What went wrong; as an `apply` error (a temporary
    /// [`Error::Storage`] is the store's trouble, not the event's).
    pub source: BoxError,
}

impl FailedEvent {
    /// The event at `index` of the run failed with `source`.
    pub fn at(index: usize, source: impl Into<BoxError>) -> Self {
        FailedEvent {
            index,
            source: source.into(),
        }
    }
}

impl fmt::Display for FailedEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "event {} of the run: {}", self.index, self.source)
    }
}

impl std::error::Error for FailedEvent {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}

/// What happens to one batch of a stream's events for one projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProjectionPlan {
    /// How many leading events the projection has already applied (duplicates).
    pub skip: usize,
}

/// A projection's checkpoint is behind the first unapplied event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckpointGap {
    /// The projection.
    pub projection: ProjectionName,
    /// The stream.
    pub stream: StreamId,
    /// The projection's checkpoint (last applied seq, 0 for none).
    pub checkpoint: u64,
    /// The seq that was offered next.
    pub offered: Seq,
}

/// Checks that `events` is a non-empty, contiguous, ascending run of `stream`.
pub fn validate_run(stream: &StreamId, events: &[Event]) -> Result<()> {
    let Some(first) = events.first() else {
        return Err(Error::invalid("apply needs at least one event"));
    };
    for (i, e) in events.iter().enumerate() {
        if &e.stream != stream {
            return Err(Error::invalid(format_args!(
                "event {}/{} offered in a run of stream {stream}",
                e.stream, e.seq
            )));
        }
        if e.seq.get() != first.seq.get() + i as u64 {
            return Err(Error::invalid(format_args!(
                "events offered to apply are not contiguous: {} follows {}",
                e.seq,
                first.seq.get() + i as u64 - 1
            )));
        }
    }
    Ok(())
}

/// The exactly-once decision for one projection whose checkpoint is
/// `checkpoint`, offered the contiguous run `events` (see [`validate_run`]).
///
/// Events at or below the checkpoint are duplicates and skipped; the rest
/// must start exactly at `checkpoint + 1`, or it is a gap.
pub fn plan_apply(
    projection: &ProjectionName,
    checkpoint: u64,
    events: &[Event],
) -> Result<ProjectionPlan, CheckpointGap> {
    let skip = events.iter().take_while(|e| e.seq.get() <= checkpoint).count();
    match events.get(skip) {
        Some(next) if next.seq.get() != checkpoint + 1 => Err(CheckpointGap {
            projection: projection.clone(),
            stream: next.stream.clone(),
            checkpoint,
            offered: next.seq,
        }),
        _ => Ok(ProjectionPlan { skip }),
    }
}

/// What an [`apply`](crate::ProjectionStore::apply) call did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ApplyOutcome {
    /// The transaction committed.
    Applied(ApplyReport),
    /// A projection's checkpoint is behind the run: nothing was written.
    /// Catch the projection up from the journal, then offer the run again.
    Gap(CheckpointGap),
}

/// Counts of one committed apply transaction, per event of the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ApplyReport {
    /// The last seq of the run: every projection's checkpoint is now at least this.
    pub through: u64,
    /// Events newly applied to at least one projection.
    pub applied: u64,
    /// Events every projection had already applied (skipped as duplicates).
    pub duplicates: u64,
    /// Audit-only events newly checkpointed without calling any applier.
    pub audit_only: u64,
}

impl ApplyReport {
    /// Tallies one event given whether any projection was new to it.
    pub fn count(&mut self, event: &Event, new_to_some: bool) {
        self.through = self.through.max(event.seq.get());
        match (new_to_some, event.intent) {
            (false, _) => self.duplicates += 1,
            (true, Intent::Apply) => self.applied += 1,
            (true, Intent::AuditOnly) => self.audit_only += 1,
        }
    }
}

/// A SHA-256 digest over projection state.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(pub [u8; 32]);

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

impl Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One value fed into a [`DigestBuilder`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DigestValue<'a> {
    /// SQL NULL.
    Null,
    /// An integer.
    Int(i64),
    /// A float (hashed by its bit pattern).
    Real(f64),
    /// Text.
    Text(&'a str),
    /// Bytes.
    Blob(&'a [u8]),
}

/// Builds a [`Digest`] from tables and rows. The encoding is unambiguous
/// (tagged, length-prefixed), so different states never collide by framing.
#[derive(Clone, Debug, Default)]
pub struct DigestBuilder {
    hasher: Sha256,
    rows: u64,
}

impl DigestBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    fn bytes(&mut self, tag: u8, b: &[u8]) {
        self.hasher.update([tag]);
        self.hasher.update((b.len() as u64).to_le_bytes());
        self.hasher.update(b);
    }

    /// Starts a table; rows fed after this belong to it.
    pub fn table(&mut self, name: &str) -> &mut Self {
        self.bytes(b'T', name.as_bytes());
        self
    }

    /// Feeds one row.
    pub fn row(&mut self, values: &[DigestValue<'_>]) -> &mut Self {
        self.hasher.update([b'R']);
        self.hasher.update((values.len() as u64).to_le_bytes());
        for v in values {
            match *v {
                DigestValue::Null => self.hasher.update([b'N']),
                DigestValue::Int(i) => self.bytes(b'I', &i.to_le_bytes()),
                DigestValue::Real(r) => self.bytes(b'F', &r.to_bits().to_le_bytes()),
                DigestValue::Text(t) => self.bytes(b'S', t.as_bytes()),
                DigestValue::Blob(b) => self.bytes(b'B', b),
            }
        }
        self.rows += 1;
        self
    }

    /// Rows fed so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The digest.
    pub fn finish(self) -> Digest {
        Digest(self.hasher.finalize().into())
    }
}

/// A stream's projection watermark: the highest seq the apply path committed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Watermark {
    /// The stream.
    pub stream: StreamId,
    /// The highest applied seq.
    pub applied_through: u64,
    /// The seq expected next (`applied_through + 1`).
    pub expected_next: u64,
    /// When it last moved, by the store's clock.
    pub updated_at: Timestamp,
}

/// A stream whose watermark or some projection's checkpoint is behind the
/// journal's version of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StreamLag {
    /// The stream.
    pub stream: StreamId,
    /// The journal's version of it (its last seq).
    pub version: u64,
    /// The stream's watermark (0 when none).
    pub watermark: u64,
    /// Each projection that is behind, with its checkpoint.
    pub behind: Vec<(ProjectionName, u64)>,
}

impl StreamLag {
    /// The lag of `stream` at `version` given its watermark and every
    /// projection's checkpoint, or `None` when nothing is behind.
    pub fn of(
        stream: &StreamId,
        version: u64,
        watermark: u64,
        checkpoints: impl IntoIterator<Item = (ProjectionName, u64)>,
    ) -> Option<StreamLag> {
        let behind: Vec<_> = checkpoints.into_iter().filter(|(_, cp)| *cp < version).collect();
        (watermark < version || !behind.is_empty()).then(|| StreamLag {
            stream: stream.clone(),
            version,
            watermark,
            behind,
        })
    }

    /// The lowest checkpoint of the projections behind (the version when none
    /// is, only the watermark).
    pub fn lowest_checkpoint(&self) -> u64 {
        self.behind
            .iter()
            .map(|(_, cp)| *cp)
            .min()
            .unwrap_or(self.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EventType, Metadata, PayloadHash};

    fn run(stream: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<Event> {
        seqs.map(|s| Event {
            stream: StreamId::new(stream).unwrap(),
            seq: Seq::new(s).unwrap(),
            global_position: s,
            event_type: EventType::new("t").unwrap(),
            intent: Intent::Apply,
            payload: vec![],
            metadata: Metadata {
                recorded_at: Timestamp::EPOCH,
                correlation_id: None,
                causation_id: None,
            },
            payload_hash: PayloadHash::of(&[]),
            decoded: Default::default(),
        })
        .collect()
    }

    #[test]
    fn plan_skips_duplicates_and_reports_gaps() {
        let p = ProjectionName::new("p").unwrap();
        let evs = run("s", 3..=6);
        assert_eq!(plan_apply(&p, 2, &evs).unwrap().skip, 0);
        assert_eq!(plan_apply(&p, 4, &evs).unwrap().skip, 2);
        assert_eq!(plan_apply(&p, 6, &evs).unwrap().skip, 4);
        assert_eq!(plan_apply(&p, 9, &evs).unwrap().skip, 4);
        let gap = plan_apply(&p, 1, &evs).unwrap_err();
        assert_eq!((gap.checkpoint, gap.offered.get()), (1, 3));
    }

    #[test]
    fn runs_must_be_contiguous_and_single_stream() {
        let s = StreamId::new("s").unwrap();
        assert!(validate_run(&s, &[]).is_err());
        assert!(validate_run(&s, &run("s", 1..=3)).is_ok());
        let mut holey = run("s", 1..=3);
        holey.remove(1);
        assert!(validate_run(&s, &holey).is_err());
        assert!(validate_run(&s, &run("t", 1..=1)).is_err());
    }

    #[test]
    fn digest_framing_is_unambiguous() {
        let d = |rows: &[&[DigestValue<'_>]]| {
            let mut b = DigestBuilder::new();
            b.table("t");
            for r in rows {
                b.row(r);
            }
            b.finish()
        };
        use DigestValue::*;
        assert_ne!(d(&[&[Text("ab"), Text("c")]]), d(&[&[Text("a"), Text("bc")]]));
        assert_ne!(d(&[&[Text("1")]]), d(&[&[Int(1)]]));
        assert_ne!(d(&[&[Null]]), d(&[]));
        assert_eq!(d(&[&[Int(1), Blob(b"x")]]), d(&[&[Int(1), Blob(b"x")]]));
    }

    #[test]
    fn stream_lag() {
        let s = StreamId::new("s").unwrap();
        let p = |n: &str| ProjectionName::new(n).unwrap();
        assert_eq!(StreamLag::of(&s, 0, 0, []), None);
        assert_eq!(StreamLag::of(&s, 3, 3, [(p("a"), 3)]), None);
        let lag = StreamLag::of(&s, 5, 3, [(p("a"), 5), (p("b"), 2)]).unwrap();
        assert_eq!(lag.behind, [(p("b"), 2)]);
        assert_eq!(lag.lowest_checkpoint(), 2);
        let lag = StreamLag::of(&s, 5, 3, [(p("a"), 5)]).unwrap();
        assert_eq!((lag.behind.len(), lag.lowest_checkpoint()), (0, 5));
    }
}
