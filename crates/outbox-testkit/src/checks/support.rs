//! Helpers shared by the checks: short builders, snapshots of a whole store,
//! a boundary-aware "is it due" assertion and a tiny drain loop.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::OutboxQueueExt as _;
use outbox_core::{
    AppendOptions, AppendRequest, Appended, ApplyOutcome, DeadLetters, Error, Event, EventJournal,
    ExpectedVersion, FailureOutcome, Lease, LeaseStore, MAX_PAGE, NewEvent, OutboxInspector, OutboxQueue,
    OutboxRow, OutboxStatus, Projection, ProjectionStore, RetryPolicy, Seq, StreamId, StreamVersion,
    Timestamp, WorkerId,
};

use crate::oracle::{Faults, OracleProjection, OracleState};
use crate::{Fixture, Harness, TxOf, add, sid};

/// The lease TTL most checks use.
pub(crate) const TTL: Duration = Duration::from_secs(30);

/// A list of projections as `apply` takes it.
pub(crate) type Projs<H> = Vec<Arc<dyn Projection<TxOf<H>>>>;

/// A worker id from a literal.
pub(crate) fn owner(name: &str) -> WorkerId {
    WorkerId::new(name).expect("valid worker id")
}

/// A seq from a number.
pub(crate) fn seq(n: u64) -> Seq {
    Seq::new(n).expect("valid seq")
}

/// Milliseconds.
pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Seconds.
pub(crate) fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// An append request.
pub(crate) fn req(stream: &StreamId, expected: ExpectedVersion, events: Vec<NewEvent>) -> AppendRequest {
    AppendRequest::new(stream.clone(), expected, events)
}

/// Oracle events with these values.
pub(crate) fn adds(values: &[i64]) -> Vec<NewEvent> {
    values.iter().map(|v| add(*v)).collect()
}

/// Appends `events` to `stream` (any version, with the outbox) and returns what it produced.
pub(crate) async fn append<J: Journal>(j: &J, stream: &StreamId, events: Vec<NewEvent>) -> Appended {
    let mut out = j
        .append(
            &[req(stream, ExpectedVersion::Any, events)],
            AppendOptions::enqueue(),
        )
        .await
        .unwrap_or_else(|e| panic!("append to {stream} failed: {e}"));
    assert_eq!(out.len(), 1, "append returns one Appended per request");
    out.remove(0)
}

/// Appends `n` oracle events (values 1..=n) to a stream called `name` and returns its id.
pub(crate) async fn enqueue<J: Journal>(j: &J, name: &str, n: usize) -> StreamId {
    let s = sid(name);
    let values: Vec<i64> = (1..=n as i64).collect();
    append(j, &s, adds(&values)).await;
    s
}

/// Every event of `stream`.
pub(crate) async fn all_events<J: Journal>(j: &J, stream: &StreamId) -> Vec<Event> {
    j.read_stream(stream, Seq::FIRST, MAX_PAGE)
        .await
        .expect("read_stream")
}

/// Appends `events` to `stream` and returns the recorded events of this append.
pub(crate) async fn recorded<J: Journal>(j: &J, stream: &StreamId, events: Vec<NewEvent>) -> Vec<Event> {
    let a = append(j, stream, events).await;
    let n = (a.last_seq.get() - a.first_seq.get() + 1) as usize;
    j.read_stream(stream, a.first_seq, n).await.expect("read_stream")
}

/// One row that must exist.
pub(crate) async fn row<J: Journal>(j: &J, stream: &StreamId, n: u64) -> OutboxRow {
    j.row(stream, seq(n))
        .await
        .expect("row")
        .unwrap_or_else(|| panic!("outbox row {stream}/{n} should exist"))
}

/// Every row, in `list` order.
pub(crate) async fn rows<J: Journal>(j: &J) -> Vec<OutboxRow> {
    j.list(None, MAX_PAGE).await.expect("list")
}

/// The seqs of some rows.
pub(crate) fn seqs_of(rows: &[OutboxRow]) -> Vec<u64> {
    rows.iter().map(|r| r.seq.get()).collect()
}

/// The store's clock, read through `summary`.
pub(crate) async fn now<J: Journal>(j: &J) -> Timestamp {
    j.summary().await.expect("summary").as_of
}

/// Every due stream.
pub(crate) async fn due<J: Journal>(j: &J) -> Vec<StreamId> {
    j.due_streams(MAX_PAGE).await.expect("due_streams")
}

/// Whether `stream` is among the due streams.
pub(crate) async fn is_due<J: Journal>(j: &J, stream: &StreamId) -> bool {
    due(j).await.contains(stream)
}

/// Asserts that `stream` is due exactly when the store's clock has reached
/// the `next_attempt_at` of its row `n` (read from the store now, as a SQL
/// harness's `advance` shifts stored times). The store's clock is read just
/// before and just after `due_streams`; the assertion is made only when both
/// readings are on the same side of the due time (the memory adapter's clock
/// stands still, so there it always is; a SQL clock keeps running, so a
/// reading straddling the due time proves nothing).
pub(crate) async fn assert_due_iff_reached<J: Journal>(j: &J, stream: &StreamId, n: u64, what: &str) {
    let at = row(j, stream, n).await.next_attempt_at;
    let before = now(j).await;
    let is = is_due(j, stream).await;
    let after = now(j).await;
    if after < at {
        assert!(
            !is,
            "{what}: {stream} is due at {after}, before its next_attempt_at {at}"
        );
    } else if before >= at {
        assert!(
            is,
            "{what}: {stream} is not due at {before}, at or after its next_attempt_at {at}"
        );
    }
}

/// Acquires `stream` for `who`, which must succeed.
pub(crate) async fn take<J: Journal>(j: &J, stream: &StreamId, who: &str) -> Lease {
    j.acquire(stream, &owner(who), TTL)
        .await
        .expect("acquire")
        .unwrap_or_else(|| panic!("{who} should be able to acquire {stream}"))
}

/// Acquires `stream` for `who` and claims up to `max` rows.
pub(crate) async fn take_and_claim<J: Journal>(
    j: &J,
    stream: &StreamId,
    who: &str,
    max: usize,
) -> (Lease, Vec<OutboxRow>) {
    let lease = take(j, stream, who).await;
    let rows = j.claim(&lease, max).await.expect("claim with the current lease");
    (lease, rows)
}

/// Claims the head of `stream` for `who`, fails it once with `policy`, and
/// releases the lease. Returns the row as it now is.
pub(crate) async fn fail_head<J: Journal>(
    j: &J,
    stream: &StreamId,
    who: &str,
    policy: &RetryPolicy,
) -> OutboxRow {
    let (lease, claimed) = take_and_claim(j, stream, who, 1).await;
    assert_eq!(claimed.len(), 1, "the head of {stream} should be claimable");
    let head = claimed[0].seq;
    j.fail(&lease, head, "boom", policy).await.expect("fail");
    assert!(
        j.release(&lease).await.expect("release"),
        "the lease is still ours"
    );
    row(j, stream, head.get()).await
}

/// A policy that parks a row as dead at its first failure.
pub(crate) fn dead_at_once() -> RetryPolicy {
    RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(1), 1).expect("valid policy")
}

/// Parks the processing row at `seq` as dead (a failure under
/// [`dead_at_once`]) and returns it as stored.
pub(crate) async fn dead_letter<J: Journal>(
    j: &J,
    lease: &Lease,
    seq: Seq,
    error: &str,
) -> outbox_core::Result<OutboxRow> {
    let outcome = j.fail(lease, seq, error, &dead_at_once()).await?;
    assert!(
        matches!(outcome, FailureOutcome::Dead { .. }),
        "a failure under a threshold of 1 parks the row: {outcome:?}"
    );
    Ok(j.row(&lease.stream, seq).await?.expect("the dead row is kept"))
}

/// Claims the head of `stream` for `who` and dead-letters it, then releases.
pub(crate) async fn kill_head<J: Journal>(j: &J, stream: &StreamId, who: &str) -> OutboxRow {
    let (lease, claimed) = take_and_claim(j, stream, who, 1).await;
    assert_eq!(claimed.len(), 1, "the head of {stream} should be claimable");
    let dead = dead_letter(j, &lease, claimed[0].seq, "poison")
        .await
        .expect("dead_letter");
    assert!(
        j.release(&lease).await.expect("release"),
        "the lease is still ours"
    );
    dead
}

/// Everything observable in a journal database through its ports (minus clocks).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct JournalSnapshot {
    heads: Vec<StreamVersion>,
    events: Vec<Event>,
    rows: Vec<OutboxRow>,
    counts: [u64; 4],
}

/// Takes a [`JournalSnapshot`].
pub(crate) async fn snapshot<J: Journal>(j: &J) -> JournalSnapshot {
    let heads = j.stream_versions(None, MAX_PAGE).await.expect("stream_heads");
    let mut events = Vec::new();
    for h in &heads {
        events.extend(all_events(j, &h.stream).await);
    }
    let s = j.summary().await.expect("summary");
    JournalSnapshot {
        heads,
        events,
        rows: rows(j).await,
        counts: [s.pending, s.processing, s.failed, s.dead],
    }
}

/// Every journal port, as the checks use them.
pub(crate) trait Journal:
    EventJournal + OutboxQueue + DeadLetters + OutboxInspector + LeaseStore + Send + Sync
{
}
impl<T: EventJournal + OutboxQueue + DeadLetters + OutboxInspector + LeaseStore + Send + Sync> Journal for T {}

/// An oracle projection called `name`, set up in the fixture's projection store.
pub(crate) async fn oracle<H: Harness>(
    h: &H,
    f: &Fixture<H>,
    name: &str,
) -> (Arc<dyn Projection<TxOf<H>>>, Faults) {
    let _ = h;
    let p = OracleProjection::new(name);
    let faults = p.faults();
    let p = p.shared();
    f.projections
        .setup(std::slice::from_ref(&p))
        .await
        .expect("setup");
    (p, faults)
}

/// The committed oracle state of projection `name`.
pub(crate) async fn state<H: Harness>(h: &H, f: &Fixture<H>, name: &str) -> OracleState {
    let _ = h;
    crate::oracle::read_state(&f.projections, name)
        .await
        .expect("reading the oracle state")
}

/// The seqs projection `name` applied on `stream`.
pub(crate) async fn applied<H: Harness>(h: &H, f: &Fixture<H>, name: &str, stream: &StreamId) -> Vec<u64> {
    state(h, f, name)
        .await
        .streams
        .get(stream.as_str())
        .map(|s| s.seqs.clone())
        .unwrap_or_default()
}

/// Applies `events` and expects a committed report.
pub(crate) async fn apply_ok<P: ProjectionStore>(
    p: &P,
    stream: &StreamId,
    events: &[Event],
    projs: &[Arc<dyn Projection<P::Tx>>],
) -> outbox_core::ApplyReport {
    match p.apply(stream, events, projs).await {
        Ok(ApplyOutcome::Applied(r)) => r,
        other => panic!("apply of {stream} should commit, got {other:?}"),
    }
}

/// What a drain loop did.
#[derive(Debug, Default)]
pub(crate) struct Drained {
    /// Runs committed.
    pub(crate) applied_runs: u64,
    /// Failures recorded with `fail`.
    pub(crate) failures: u64,
}

/// A minimal sequential worker over the fixture's stores; see [`drain_with`].
pub(crate) async fn drain<H: Harness>(
    f: &Fixture<H>,
    projs: &Projs<H>,
    who: &str,
    policy: &RetryPolicy,
) -> Drained {
    drain_with(&f.journal, &f.projections, projs, who, policy).await
}

/// A minimal sequential worker over the ports: while some stream is due,
/// acquire it, claim its head run, load the events, apply them, complete the
/// rows and release. An applier failure applies the events before the
/// failing one, records the failure on the failing row and abandons the rest.
pub(crate) async fn drain_with<J, P>(
    j: &J,
    ps: &P,
    projs: &[Arc<dyn Projection<P::Tx>>],
    who: &str,
    policy: &RetryPolicy,
) -> Drained
where
    J: EventJournal + OutboxQueue + LeaseStore,
    P: ProjectionStore,
{
    let mut out = Drained::default();
    for _round in 0..1_000 {
        let streams = j.due_streams(16).await.expect("due_streams");
        if streams.is_empty() {
            return out;
        }
        for s in streams {
            let Some(lease) = j.acquire(&s, &owner(who), TTL).await.expect("acquire") else {
                continue;
            };
            let claimed = j.claim(&lease, 64).await.expect("claim");
            let mut events = Vec::new();
            for r in &claimed {
                events.push(j.load(&s, r.seq).await.expect("load a claimed row's event"));
            }
            if let Some(last) = claimed.last() {
                let failed_at = match ps.apply(&s, &events, projs).await {
                    Ok(ApplyOutcome::Applied(_)) => None,
                    Ok(ApplyOutcome::Gap(g)) => panic!("drain never leaves gaps, got {g:?}"),
                    Err(Error::Apply { seq: bad, .. }) => Some(bad),
                    Err(e) => panic!("apply of {s} failed unexpectedly: {e}"),
                };
                match failed_at {
                    None => {
                        out.applied_runs += 1;
                        j.complete(&s, last.seq).await.expect("complete");
                    }
                    Some(bad) => {
                        let first = claimed[0].seq.get();
                        if bad.get() > first {
                            let prefix = &events[..(bad.get() - first) as usize];
                            apply_ok(ps, &s, prefix, projs).await;
                            j.complete(&s, seq(bad.get() - 1)).await.expect("complete");
                        }
                        j.fail(&lease, bad, "applier failed", policy).await.expect("fail");
                        j.complete_and_release(&lease, None, true).await.expect("finish");
                        out.failures += 1;
                    }
                }
            }
            j.release(&lease).await.expect("release");
        }
    }
    panic!("drain did not finish in 1000 rounds");
}

/// The oracle's expectation for streams whose events have these values.
pub(crate) fn expect_sums(streams: &[(&StreamId, u64, i64)]) -> BTreeMap<String, crate::Expected> {
    streams
        .iter()
        .map(|(s, through, sum)| {
            (
                s.to_string(),
                crate::Expected {
                    through: *through,
                    sum: *sum,
                },
            )
        })
        .collect()
}

/// Rows of `stream` with a given status.
pub(crate) async fn statuses<J: Journal>(j: &J, stream: &StreamId) -> Vec<(u64, OutboxStatus)> {
    rows(j)
        .await
        .into_iter()
        .filter(|r| &r.stream == stream)
        .map(|r| (r.seq.get(), r.status))
        .collect::<BTreeMap<_, _>>()
        .into_iter()
        .collect()
}

/// Runs `futures` concurrently on the current task (every one is polled
/// until all are ready) and returns their outputs in order: what many
/// callers sharing one store instance look like to it.
pub(crate) async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|o| o.expect("every future finished"))
        .collect()
}
