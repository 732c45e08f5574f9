//! [`OutboxQueue`] contract checks: due streams, claims, failures, dead
//! letters, requeues and inspection.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::spi::truncate_error;
use outbox_core::{
    AppendOptions, DeadLetters, ENDED_WITHOUT_RESULT, Error, EventJournal, ExpectedVersion, FailureOutcome,
    Lease, LeaseStore, MAX_ERROR_LEN, OutboxInspector, OutboxQueue, OutboxQueueExt, OutboxRow, OutboxStatus,
    OutboxSummary, RetryPolicy, Seq, StreamEnd, StreamId, SweepLimits, Take,
};

use super::support::{
    Journal, TTL, adds, assert_due_iff_reached, dead_letter, due, enqueue, fail_head, is_due, kill_head, ms,
    now, owner, req, row, rows, secs, seq, seqs_of, statuses, take, take_and_claim,
};
use crate::{Fixture, Harness, sid};

/// `due_streams`: streams with a due head, oldest due first (not by name).
pub async fn due_streams_returns_due_heads_oldest_first<H: Harness>(h: &H) {
    let f = h.open().await;
    assert!(
        due(&f.journal).await.is_empty(),
        "an empty outbox has nothing due"
    );
    let c = enqueue(&f.journal, "c", 2).await;
    h.advance(&f.ctx, ms(10)).await;
    let a = enqueue(&f.journal, "a", 1).await;
    h.advance(&f.ctx, ms(10)).await;
    let b = enqueue(&f.journal, "b", 3).await;
    assert_eq!(due(&f.journal).await, [c, a, b], "oldest due head first");
}

/// `due_streams`: returns at most `limit` streams, the oldest.
pub async fn due_streams_honours_limit<H: Harness>(h: &H) {
    let f = h.open().await;
    let mut want = Vec::new();
    for name in ["e", "d", "c", "b", "a"] {
        want.push(enqueue(&f.journal, name, 1).await);
        h.advance(&f.ctx, ms(5)).await;
    }
    assert_eq!(
        f.journal.due_streams(2).await.unwrap(),
        want[..2],
        "the two oldest"
    );
    assert_eq!(f.journal.due_streams(100).await.unwrap(), want, "all five");
}

/// `due_streams`: never a stream whose head failed and is not yet due; it
/// becomes due at its `next_attempt_at`.
pub async fn due_streams_excludes_not_yet_due_failed_head<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let t = enqueue(&f.journal, "t", 1).await;
    let failed = fail_head(&f.journal, &s, "w", &RetryPolicy::default()).await;
    assert_eq!(failed.status, OutboxStatus::Failed);
    assert!(
        !is_due(&f.journal, &s).await,
        "a failed head is not due before its next_attempt_at"
    );
    assert!(is_due(&f.journal, &t).await, "other streams stay due");
    h.advance(&f.ctx, secs(1)).await;
    assert!(is_due(&f.journal, &s).await, "due once the 1 s delay passed");
}

/// `due_streams`: never a stream whose head is dead, however late.
pub async fn due_streams_excludes_dead_head<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let t = enqueue(&f.journal, "t", 1).await;
    kill_head(&f.journal, &s, "w").await;
    h.advance(&f.ctx, secs(86_400)).await;
    assert_eq!(due(&f.journal).await, [t], "the dead head's stream is never due");
}

/// `due_streams`: never a stream whose lease another owner holds, even one
/// with pending rows; included again once that lease expires (store clock).
pub async fn due_streams_excludes_leased_stream_until_expiry<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 1).await;
    let t = enqueue(&f.journal, "t", 1).await;
    take(&f.journal, &s, "other").await;
    assert_eq!(
        due(&f.journal).await,
        std::slice::from_ref(&t),
        "a leased stream is not due"
    );
    h.advance(&f.ctx, TTL - secs(1)).await;
    assert!(
        !is_due(&f.journal, &s).await,
        "still leased before the ttl passed"
    );
    h.advance(&f.ctx, secs(2)).await;
    assert_eq!(due(&f.journal).await, [s, t], "due again once the lease expired");
}

/// `due_streams`: a `processing` head whose lease expired is due again (a
/// crashed worker never strands its rows).
pub async fn stale_processing_row_is_due_again<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let (_lease, claimed) = take_and_claim(&f.journal, &s, "crashed", 10).await;
    assert_eq!(seqs_of(&claimed), [1, 2]);
    assert!(!is_due(&f.journal, &s).await, "not due while the lease holds");
    h.advance(&f.ctx, TTL + secs(1)).await;
    assert_eq!(
        row(&f.journal, &s, 1).await.status,
        OutboxStatus::Processing,
        "the row is still processing"
    );
    assert!(
        is_due(&f.journal, &s).await,
        "a processing head whose lease expired is due again"
    );
}

/// `claim`: with a stale epoch (the stream was taken over) is `LeaseLost` and changes nothing.
pub async fn claim_with_stale_epoch_is_lease_lost<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 3).await;
    let old = take(&f.journal, &s, "w").await;
    h.advance(&f.ctx, TTL + secs(1)).await;
    let new = take(&f.journal, &s, "w").await;
    assert!(new.epoch > old.epoch, "a takeover after expiry raises the epoch");
    let before = rows(&f.journal).await;
    let r = f.journal.claim(&old, 10).await;
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "stale epoch: {r:?}");
    assert_eq!(rows(&f.journal).await, before, "a refused claim changes nothing");
}

/// `claim`: a lease naming another owner than the holder is `LeaseLost` and changes nothing.
pub async fn claim_with_other_owner_is_lease_lost<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let held = take(&f.journal, &s, "holder").await;
    let forged = Lease {
        owner: owner("intruder"),
        ..held.clone()
    };
    let before = rows(&f.journal).await;
    let r = f.journal.claim(&forged, 10).await;
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "other owner: {r:?}");
    let r = f
        .journal
        .claim(
            &Lease {
                stream: sid("unleased"),
                ..held
            },
            10,
        )
        .await;
    assert!(
        matches!(r, Err(Error::LeaseLost { .. })),
        "a stream nobody leased: {r:?}"
    );
    assert_eq!(rows(&f.journal).await, before, "a refused claim changes nothing");
}

/// `claim`: an expired lease (even if nobody took over) is `LeaseLost`.
pub async fn claim_with_expired_lease_is_lease_lost<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let lease = take(&f.journal, &s, "w").await;
    h.advance(&f.ctx, TTL + secs(1)).await;
    let before = rows(&f.journal).await;
    let r = f.journal.claim(&lease, 10).await;
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "expired lease: {r:?}");
    assert_eq!(rows(&f.journal).await, before, "a refused claim changes nothing");
}

/// `claim`: a released lease is `LeaseLost`.
pub async fn claim_with_released_lease_is_lease_lost<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let lease = take(&f.journal, &s, "w").await;
    assert!(f.journal.release(&lease).await.unwrap());
    let before = rows(&f.journal).await;
    let r = f.journal.claim(&lease, 10).await;
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "released lease: {r:?}");
    assert_eq!(rows(&f.journal).await, before, "a refused claim changes nothing");
}

/// `claim`: returns the head and the contiguous due rows behind it, at most
/// `max`, in seq order, marked `processing`; the rest stay pending.
pub async fn claim_returns_contiguous_head_run_up_to_max<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 5).await;
    let t = enqueue(&f.journal, "t", 2).await;
    let (_lease, claimed) = take_and_claim(&f.journal, &s, "w", 3).await;
    assert_eq!(seqs_of(&claimed), [1, 2, 3], "head run of at most 3");
    assert!(claimed.iter().all(|r| r.stream == s), "only the lease's stream");
    assert!(
        claimed.iter().all(|r| r.status == OutboxStatus::Processing),
        "returned as processing"
    );
    use OutboxStatus::{Pending, Processing};
    assert_eq!(
        statuses(&f.journal, &s).await,
        [
            (1, Processing),
            (2, Processing),
            (3, Processing),
            (4, Pending),
            (5, Pending)
        ]
    );
    assert_eq!(
        statuses(&f.journal, &t).await,
        [(1, Pending), (2, Pending)],
        "other streams untouched"
    );
}

/// `claim`: empty when the head is dead (rows behind it stay pending).
pub async fn claim_is_empty_when_head_dead<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 3).await;
    kill_head(&f.journal, &s, "w").await;
    h.advance(&f.ctx, secs(3_600)).await;
    let (_lease, claimed) = take_and_claim(&f.journal, &s, "w", 10).await;
    assert!(claimed.is_empty(), "a dead head blocks its stream: {claimed:?}");
    assert_eq!(
        row(&f.journal, &s, 2).await.status,
        OutboxStatus::Pending,
        "rows behind stay pending"
    );
}

/// `claim`: empty when the head failed and is not yet due; the head run once it is.
pub async fn claim_is_empty_when_head_not_due<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 3).await;
    fail_head(&f.journal, &s, "w", &RetryPolicy::default()).await;
    let lease = take(&f.journal, &s, "w").await;
    let claimed = f.journal.claim(&lease, 10).await.unwrap();
    assert!(
        claimed.is_empty(),
        "a failed head that is not due blocks its stream: {claimed:?}"
    );
    assert_eq!(
        row(&f.journal, &s, 2).await.status,
        OutboxStatus::Pending,
        "rows behind stay pending"
    );
    h.advance(&f.ctx, secs(1)).await;
    let claimed = f.journal.claim(&lease, 10).await.unwrap();
    assert_eq!(
        seqs_of(&claimed),
        [1, 2, 3],
        "once due, the failed head and the rows behind it"
    );
    assert_eq!(claimed[0].attempt_count, 1, "claiming keeps the attempt count");
}

/// `claim`: empty for a stream without rows.
pub async fn claim_is_empty_without_rows<H: Harness>(h: &H) {
    let f = h.open().await;
    enqueue(&f.journal, "other", 1).await;
    let (_lease, claimed) = take_and_claim(&f.journal, &sid("s"), "w", 10).await;
    assert!(claimed.is_empty(), "no rows, nothing claimed");
    let s = enqueue(&f.journal, "done", 2).await;
    f.journal.complete(&s, seq(2)).await.unwrap();
    let (_lease, claimed) = take_and_claim(&f.journal, &s, "w", 10).await;
    assert!(claimed.is_empty(), "completed rows are gone");
}

/// `claim`: after the holder's lease expired, a new owner (higher epoch)
/// re-claims the rows still `processing`, one at a time from the head, each
/// alone from then on; none is charged an attempt, since the run they were
/// claimed in held several rows and nobody can tell which ended it
/// (ADR 0029). The old holder is refused.
pub async fn claim_after_takeover_reclaims_processing_rows<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 3).await;
    let (a, first) = take_and_claim(&f.journal, &s, "a", 2).await;
    assert_eq!(seqs_of(&first), [1, 2]);
    assert!(!first[0].alone, "a fresh run is not applied alone");
    h.advance(&f.ctx, TTL + secs(1)).await;
    let (b, second) = take_and_claim(&f.journal, &s, "b", 10).await;
    assert_eq!(b.epoch, a.epoch + 1, "the takeover has the next epoch");
    assert_eq!(seqs_of(&second), [1], "the unfinished head is re-claimed alone");
    assert_eq!(
        (
            second[0].status,
            second[0].attempt_count,
            second[0].last_error.as_deref(),
            second[0].alone
        ),
        (OutboxStatus::Processing, 0, None, true),
        "applied alone from now on, and not counted as an attempt"
    );
    assert!(!second[0].ended_unfinished());
    let r = f.journal.claim(&a, 10).await;
    assert!(
        matches!(r, Err(Error::LeaseLost { .. })),
        "the old holder's claim: {r:?}"
    );
    let r = f
        .journal
        .fail(&a, seq(1), "zombie", &RetryPolicy::default())
        .await;
    assert!(
        matches!(r, Err(Error::LeaseLost { .. })),
        "the old holder's fail: {r:?}"
    );
    let r = f.journal.complete_and_release(&a, None, true).await;
    assert!(matches!(r, Ok(0)), "the old holder's finish is no error: {r:?}");
    use OutboxStatus::{Pending, Processing};
    assert_eq!(
        statuses(&f.journal, &s).await,
        [(1, Processing), (2, Processing), (3, Pending)],
        "the old holder changed nothing"
    );
    f.journal.complete(&s, seq(1)).await.unwrap();
    let next = f.journal.claim(&b, 10).await.unwrap();
    assert_eq!(seqs_of(&next), [2], "the next unfinished row, alone too");
    assert_eq!((next[0].attempt_count, next[0].alone), (0, true));
    f.journal.complete(&s, seq(2)).await.unwrap();
    let last = f.journal.claim(&b, 10).await.unwrap();
    assert_eq!(
        (
            seqs_of(&last),
            last[0].attempt_count,
            last[0].last_error.clone(),
            last[0].alone
        ),
        (vec![3], 0, None, false),
        "a row nobody claimed before is fresh"
    );
}

/// `claim`, `begin_attempt` and `fail`: an attempt is charged only to a
/// row whose attempt of its own began. A row whose apply keeps killing its
/// worker is first a suspect (the claim it shared charged nobody), is then
/// claimed by itself, and each attempt of its own that began and never
/// ended is reported by the next claim and recorded by the claimer's
/// `fail`, once: it is dead at exactly the threshold, with `attempt_count`
/// equal to it. An alone row claimed and never begun is not charged; the
/// row behind is never charged.
pub async fn unfinished_claims_add_up_to_attempts<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let policy = RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(1), 3).unwrap();
    // A shared claim of both rows; the worker dies.
    let (_, claimed) = take_and_claim(&f.journal, &s, "w0", 10).await;
    assert_eq!(seqs_of(&claimed), [1, 2]);
    h.advance(&f.ctx, TTL + secs(1)).await;
    // The suspect, alone and uncharged; claimed and dropped before its
    // attempt began: still nobody's failure.
    let (_, claimed) = take_and_claim(&f.journal, &s, "w1", 10).await;
    assert_eq!(seqs_of(&claimed), [1]);
    assert_eq!((claimed[0].attempt_count, claimed[0].alone), (0, true));
    assert!(!claimed[0].ended_unfinished(), "a suspect's first claim alone");
    h.advance(&f.ctx, TTL + secs(1)).await;
    let (lease, claimed) = take_and_claim(&f.journal, &s, "w2", 10).await;
    assert_eq!(seqs_of(&claimed), [1]);
    assert!(!claimed[0].ended_unfinished(), "its attempt had not begun");
    // Now its attempt begins, and its worker dies.
    f.journal.begin_attempt(&lease, seq(1)).await.unwrap();
    h.advance(&f.ctx, TTL + secs(1)).await;
    let mut last = None;
    for round in 1..=3u32 {
        let who = format!("r{round}");
        let (lease, claimed) = take_and_claim(&f.journal, &s, &who, 10).await;
        assert_eq!(seqs_of(&claimed), [1], "round {round}: the head alone");
        assert!(
            claimed[0].ended_unfinished(),
            "round {round}: the attempt of its own before is reported"
        );
        assert_eq!(
            claimed[0].attempt_count,
            round - 1,
            "round {round}: the claim counts nothing itself"
        );
        let outcome = f
            .journal
            .fail(&lease, seq(1), ENDED_WITHOUT_RESULT, &policy)
            .await
            .unwrap();
        last = Some(outcome);
        if round < 3 {
            assert!(matches!(outcome, FailureOutcome::Retry { attempt, .. } if attempt == round));
            f.journal.release(&lease).await.unwrap();
            h.advance(&f.ctx, secs(1)).await;
            // Claimed again (failed and due): not reported unfinished, since
            // the failure was recorded; it begins and its worker dies once more.
            let (again_lease, again) = take_and_claim(&f.journal, &s, &format!("{who}b"), 10).await;
            assert_eq!(seqs_of(&again), [1]);
            assert!(!again[0].ended_unfinished(), "round {round}: recorded already");
            assert_eq!(again[0].attempt_count, round);
            f.journal.begin_attempt(&again_lease, seq(1)).await.unwrap();
            h.advance(&f.ctx, TTL + secs(1)).await;
        }
    }
    assert_eq!(last, Some(FailureOutcome::Dead { attempt: 3 }));
    let row1 = row(&f.journal, &s, 1).await;
    assert_eq!(
        (row1.status, row1.attempt_count),
        (OutboxStatus::Dead, 3),
        "dead at exactly the threshold of its own attempts"
    );
    let row2 = row(&f.journal, &s, 2).await;
    assert_eq!(
        (
            row2.status,
            row2.attempt_count,
            row2.last_error.as_deref(),
            row2.alone
        ),
        (OutboxStatus::Processing, 0, None, false),
        "the row behind was never claimed again nor charged"
    );
    let back = f.journal.requeue(&s, seq(1)).await.unwrap();
    assert_eq!(
        (back.attempt_count, back.alone, back.last_error.as_deref()),
        (0, false, None),
        "a requeue starts the row afresh"
    );
}

/// `begin_attempt`: needs the current lease (`LeaseLost`), a row that
/// exists (`NotFound`), is `processing` and is applied alone
/// (`InvalidState`); nothing changes when it is refused. A mark followed by
/// a recorded end (`fail`, `finish` with abandon, `complete`) reports
/// nothing later.
pub async fn begin_attempt_marks_only_a_row_applied_alone_under_the_current_lease<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let s = enqueue(j, "s", 2).await;
    let (lease, _) = take_and_claim(j, &s, "a", 10).await;
    let before = rows(j).await;
    for (what, n) in [("fresh", 1), ("fresh behind", 2)] {
        let r = j.begin_attempt(&lease, seq(n)).await;
        assert!(matches!(r, Err(Error::InvalidState(_))), "{what}: {r:?}");
    }
    let r = j.begin_attempt(&lease, seq(9)).await;
    assert!(matches!(r, Err(Error::NotFound(_))), "missing row: {r:?}");
    assert_eq!(rows(j).await, before, "refused marks change nothing");
    // The worker dies; the suspect is claimed alone by the next holder.
    h.advance(&f.ctx, TTL + secs(1)).await;
    let (b, claimed) = take_and_claim(j, &s, "b", 10).await;
    assert!(claimed[0].alone);
    let r = j.begin_attempt(&lease, seq(1)).await;
    assert!(
        matches!(r, Err(Error::LeaseLost { .. })),
        "the old holder's mark: {r:?}"
    );
    j.begin_attempt(&b, seq(1))
        .await
        .expect("the holder marks its alone row");
    // A recorded end: the row is abandoned (a temporary error), then claimed
    // again: nothing is reported.
    j.complete_and_release(&b, None, true).await.unwrap();
    let (b, again) = take_and_claim(j, &s, "b", 10).await;
    assert_eq!(seqs_of(&again), [1]);
    assert!(!again[0].ended_unfinished(), "an abandoned attempt is no failure");
    assert_eq!(again[0].attempt_count, 0);
    let r = j.begin_attempt(&b, seq(2)).await;
    assert!(
        matches!(r, Err(Error::InvalidState(_))),
        "a processing row not alone: {r:?}"
    );
    // A recorded failure: claimed again once due, nothing more is reported.
    j.begin_attempt(&b, seq(1)).await.unwrap();
    let policy = RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(1), 5).unwrap();
    j.fail(&b, seq(1), "boom", &policy).await.unwrap();
    j.release(&b).await.unwrap();
    h.advance(&f.ctx, secs(1)).await;
    let (c, after_fail) = take_and_claim(j, &s, "c", 10).await;
    assert_eq!(seqs_of(&after_fail), [1]);
    assert!(
        !after_fail[0].ended_unfinished(),
        "a recorded failure is not reported again"
    );
    assert_eq!(after_fail[0].attempt_count, 1, "counted once, by fail");
    // A completion: the row is gone with its mark.
    j.begin_attempt(&c, seq(1)).await.unwrap();
    j.complete(&s, seq(1)).await.unwrap();
    let next = j.claim(&c, 10).await.unwrap();
    assert_eq!(seqs_of(&next), [2], "the row behind, as a suspect");
    assert!(!next[0].ended_unfinished());
}

/// `claim`: of two claimers presenting different leases, at most one
/// succeeds, also when they race from two instances on one database.
pub async fn concurrent_claimers_exactly_one_wins<H: Harness>(h: &H) {
    let f = h.open().await;
    let j1 = Arc::new(h.reopen_journal(&f.ctx).await);
    let j2 = Arc::new(h.reopen_journal(&f.ctx).await);
    let streams: Vec<_> = (0..8).map(|i| sid(&format!("s{i}"))).collect();
    for s in &streams {
        enqueue(&f.journal, s.as_str(), 2).await;
    }
    // Race 1: both acquire every stream; exactly one wins each.
    let mut held = Vec::new();
    for s in &streams {
        let (x, y) = (j1.clone(), j2.clone());
        let (sa, sb) = (s.clone(), s.clone());
        let ta = tokio::spawn(async move { x.acquire(&sa, &owner("a"), TTL).await });
        let tb = tokio::spawn(async move { y.acquire(&sb, &owner("b"), TTL).await });
        let (ra, rb) = (
            ta.await.unwrap().expect("acquire a"),
            tb.await.unwrap().expect("acquire b"),
        );
        assert!(
            ra.is_some() != rb.is_some(),
            "{s}: exactly one acquirer wins, got {ra:?} and {rb:?}"
        );
        held.push(ra.or(rb).unwrap());
    }
    // Race 2: after expiry, a new owner takes over; old and new leases claim at once.
    h.advance(&f.ctx, TTL + secs(1)).await;
    for old in held {
        let new = take(&*j2, &old.stream, "c").await;
        let (x, y) = (j1.clone(), j2.clone());
        let new2 = new.clone();
        let tx = tokio::spawn(async move { x.claim(&old, 10).await });
        let ty = tokio::spawn(async move { y.claim(&new2, 10).await });
        let (rx, ry) = (tx.await.unwrap(), ty.await.unwrap());
        assert!(
            matches!(rx, Err(Error::LeaseLost { .. })),
            "{}: the stale lease loses: {rx:?}",
            new.stream
        );
        assert_eq!(seqs_of(&ry.expect("the current lease wins")), [1, 2]);
    }
}

/// Head-of-line blocking: a failed head blocks the rows behind it while
/// other streams keep flowing.
pub async fn failed_head_blocks_its_stream_only<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 3).await;
    let t = enqueue(&f.journal, "t", 2).await;
    fail_head(&f.journal, &s, "w", &RetryPolicy::default()).await;
    assert_eq!(
        due(&f.journal).await,
        std::slice::from_ref(&t),
        "only the other stream is due"
    );
    let (_lease, claimed) = take_and_claim(&f.journal, &t, "w", 10).await;
    assert_eq!(seqs_of(&claimed), [1, 2], "the other stream flows");
    let lease = take(&f.journal, &s, "w").await;
    assert!(
        f.journal.claim(&lease, 10).await.unwrap().is_empty(),
        "rows behind a failed head are not claimable"
    );
}

/// Head-of-line blocking: a dead head blocks the rows behind it for good while
/// other streams keep flowing.
pub async fn dead_head_blocks_its_stream_only<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 3).await;
    kill_head(&f.journal, &s, "w").await;
    let t = enqueue(&f.journal, "t", 2).await;
    h.advance(&f.ctx, secs(86_400)).await;
    assert_eq!(
        due(&f.journal).await,
        std::slice::from_ref(&t),
        "only the other stream is due"
    );
    let (_lease, claimed) = take_and_claim(&f.journal, &t, "w", 10).await;
    assert_eq!(seqs_of(&claimed), [1, 2], "the other stream flows");
    assert_eq!(
        row(&f.journal, &s, 2).await.status,
        OutboxStatus::Pending,
        "rows behind the dead head wait"
    );
}

/// `fail`: increments the attempt count, stores the message, marks the row
/// `failed` and due at `now + policy.delay(attempt)` by the store's clock.
pub async fn fail_records_attempt_error_and_delay<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let policy = RetryPolicy::default();
    let (lease, _) = take_and_claim(&f.journal, &s, "w", 2).await;
    let before = now(&f.journal).await;
    let out = f
        .journal
        .fail(&lease, seq(1), "disk on fire", &policy)
        .await
        .expect("fail");
    let after = now(&f.journal).await;
    let FailureOutcome::Retry {
        attempt,
        next_attempt_at,
    } = out
    else {
        panic!("first failure retries: {out:?}")
    };
    assert_eq!(attempt, 1);
    assert!(
        before.saturating_add(secs(1)) <= next_attempt_at && next_attempt_at <= after.saturating_add(secs(1)),
        "next_attempt_at {next_attempt_at} is not now + 1 s (now in [{before}, {after}])"
    );
    let r = row(&f.journal, &s, 1).await;
    assert_eq!(r.status, OutboxStatus::Failed);
    assert_eq!(r.attempt_count, 1);
    assert_eq!(r.last_error.as_deref(), Some("disk on fire"));
    assert_eq!(
        r.next_attempt_at, next_attempt_at,
        "the row agrees with the outcome"
    );
    assert_eq!(
        r.next_attempt_at,
        r.updated_at.saturating_add(secs(1)),
        "due = time of failure + delay(1)"
    );
    assert_eq!(
        row(&f.journal, &s, 2).await.status,
        OutboxStatus::Processing,
        "other claimed rows stay as they were"
    );
}

/// `fail`: a message longer than `MAX_ERROR_LEN` is cut (at a char boundary).
pub async fn fail_truncates_long_errors<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 1).await;
    let long = format!("x{}", "é".repeat(MAX_ERROR_LEN));
    let (lease, _) = take_and_claim(&f.journal, &s, "w", 1).await;
    f.journal
        .fail(&lease, seq(1), &long, &RetryPolicy::default())
        .await
        .expect("fail");
    let stored = row(&f.journal, &s, 1).await.last_error.expect("error stored");
    assert!(
        stored.len() <= MAX_ERROR_LEN,
        "stored error is {} bytes, over {MAX_ERROR_LEN}",
        stored.len()
    );
    assert_eq!(stored, truncate_error(&long), "cut exactly like truncate_error");
}

/// Fails the head of `s` `attempts` times with `policy`, checking after each
/// retryable failure that the row is due exactly `policy.delay(n)` later.
async fn run_schedule<H: Harness>(h: &H, f: &Fixture<H>, s: &StreamId, policy: &RetryPolicy) {
    let threshold = policy.dead_letter_after();
    for n in 1..=threshold {
        let (lease, claimed) = take_and_claim(&f.journal, s, "w", 1).await;
        assert_eq!(
            seqs_of(&claimed),
            [1],
            "attempt {n}: the head is claimable once due"
        );
        let out = f
            .journal
            .fail(&lease, seq(1), &format!("failure {n}"), policy)
            .await
            .expect("fail");
        assert!(f.journal.release(&lease).await.unwrap());
        let r = row(&f.journal, s, 1).await;
        assert_eq!(r.attempt_count, n, "attempt {n}: attempt count");
        assert_eq!(r.last_error.as_deref(), Some(format!("failure {n}").as_str()));
        if n < threshold {
            let delay = policy.delay(n);
            assert_eq!(
                out,
                FailureOutcome::Retry {
                    attempt: n,
                    next_attempt_at: r.next_attempt_at
                },
                "failure {n} of {threshold} retries"
            );
            assert_eq!(r.status, OutboxStatus::Failed, "attempt {n}: failed, not dead");
            assert_eq!(
                r.next_attempt_at,
                r.updated_at.saturating_add(delay),
                "attempt {n}: due after {delay:?}"
            );
            h.advance(&f.ctx, delay - ms(1)).await;
            assert_due_iff_reached(&f.journal, s, 1, &format!("attempt {n}, 1 ms early")).await;
            h.advance(&f.ctx, ms(1)).await;
            assert_due_iff_reached(&f.journal, s, 1, &format!("attempt {n}, on time")).await;
            assert!(is_due(&f.journal, s).await, "attempt {n}: due after {delay:?}");
        } else {
            assert_eq!(
                out,
                FailureOutcome::Dead { attempt: n },
                "failure {n} reaches the threshold"
            );
            assert_eq!(
                r.status,
                OutboxStatus::Dead,
                "dead at exactly {threshold} failures"
            );
            h.advance(&f.ctx, policy.cap() * 2).await;
            assert!(!is_due(&f.journal, s).await, "a dead row is never due");
        }
    }
}

/// `fail`: the default policy retries after 1, 2, 4, ... 64 s by the store's
/// clock and dead-letters on failure 8, not before.
pub async fn fail_follows_default_schedule_and_dies_at_8<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let policy = RetryPolicy::default();
    assert_eq!(policy.dead_letter_after(), 8);
    run_schedule(h, &f, &s, &policy).await;
    let summary = f.journal.summary().await.unwrap();
    assert_eq!((summary.dead, summary.pending), (1, 1));
}

/// `fail`: a custom policy (250 ms doubling, 600 ms cap, dead after 3) is
/// followed exactly: due 250 ms, then 500 ms later, dead on failure 3.
pub async fn fail_follows_custom_schedule_and_dies_at_3<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 1).await;
    let policy = RetryPolicy::new(ms(250), ms(600), 3).unwrap();
    run_schedule(h, &f, &s, &policy).await;
}

/// `fail`: the capped delay is used once the doubling passes the cap.
pub async fn fail_delay_is_capped<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 1).await;
    let policy = RetryPolicy::new(ms(100), ms(300), 10).unwrap();
    for n in 1..=4u32 {
        let r = fail_head(&f.journal, &s, "w", &policy).await;
        let want = [100, 200, 300, 300][n as usize - 1];
        assert_eq!(
            r.next_attempt_at,
            r.updated_at.saturating_add(ms(want)),
            "attempt {n}: {want} ms"
        );
        h.advance(&f.ctx, ms(want)).await;
    }
}

/// `fail`: requires the current lease; a stale one is `LeaseLost` and changes nothing.
pub async fn fail_requires_current_lease<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 1).await;
    let (lease, _) = take_and_claim(&f.journal, &s, "w", 1).await;
    let forged = Lease {
        epoch: lease.epoch + 1,
        ..lease.clone()
    };
    let before = rows(&f.journal).await;
    let r = f
        .journal
        .fail(&forged, seq(1), "x", &RetryPolicy::default())
        .await;
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "wrong epoch: {r:?}");
    h.advance(&f.ctx, TTL + secs(1)).await;
    let r = f.journal.fail(&lease, seq(1), "x", &RetryPolicy::default()).await;
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "expired lease: {r:?}");
    let r = dead_letter(&f.journal, &lease, seq(1), "x").await;
    assert!(
        matches!(r, Err(Error::LeaseLost { .. })),
        "dead_letter with an expired lease: {r:?}"
    );
    assert_eq!(rows(&f.journal).await, before, "refused calls change nothing");
}

/// `fail`: a row that is not `processing` is `InvalidState`, a missing row
/// `NotFound`; neither changes anything.
pub async fn fail_needs_a_processing_row<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 3).await;
    let (lease, claimed) = take_and_claim(&f.journal, &s, "w", 1).await;
    assert_eq!(seqs_of(&claimed), [1]);
    let p = RetryPolicy::default();
    let before = rows(&f.journal).await;
    let r = f.journal.fail(&lease, seq(2), "x", &p).await;
    assert!(
        matches!(r, Err(Error::InvalidState(_))),
        "fail on a pending row: {r:?}"
    );
    let r = f.journal.fail(&lease, seq(9), "x", &p).await;
    assert!(
        matches!(r, Err(Error::NotFound(_))),
        "fail on a missing row: {r:?}"
    );
    let r = dead_letter(&f.journal, &lease, seq(2), "x").await;
    assert!(
        matches!(r, Err(Error::InvalidState(_))),
        "dead_letter on a pending row: {r:?}"
    );
    let r = dead_letter(&f.journal, &lease, seq(9), "x").await;
    assert!(
        matches!(r, Err(Error::NotFound(_))),
        "dead_letter on a missing row: {r:?}"
    );
    assert_eq!(rows(&f.journal).await, before, "refused calls change nothing");
    f.journal
        .fail(&lease, seq(1), "x", &p)
        .await
        .expect("fail the processing head");
    let before = rows(&f.journal).await;
    let r = f.journal.fail(&lease, seq(1), "x", &p).await;
    assert!(
        matches!(r, Err(Error::InvalidState(_))),
        "fail on a failed row: {r:?}"
    );
    assert_eq!(rows(&f.journal).await, before, "refused calls change nothing");
}

/// `fail` under a threshold of one parks the processing row as `dead` at
/// once, with its message.
pub async fn fail_at_the_threshold_parks_at_once<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let (lease, _) = take_and_claim(&f.journal, &s, "w", 1).await;
    let dead = dead_letter(&f.journal, &lease, seq(1), "poison pill")
        .await
        .expect("dead_letter");
    assert_eq!(dead.status, OutboxStatus::Dead);
    assert_eq!(dead.last_error.as_deref(), Some("poison pill"));
    assert_eq!(
        row(&f.journal, &s, 1).await,
        dead,
        "the returned row is the stored row"
    );
    let summary = f.journal.summary().await.unwrap();
    assert_eq!((summary.dead, summary.pending, summary.processing), (1, 1, 0));
    f.journal.release(&lease).await.unwrap();
    assert!(!is_due(&f.journal, &s).await, "a dead head is not due");
}

/// `finish` with `abandon`: turns the lease's processing rows back to
/// pending (attempt counts unchanged), completes nothing, and releases the
/// lease: they are due at once.
pub async fn finish_abandons_processing_rows_and_frees_the_stream<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 4).await;
    fail_head(&f.journal, &s, "w", &RetryPolicy::default()).await;
    h.advance(&f.ctx, secs(1)).await;
    let (lease, claimed) = take_and_claim(&f.journal, &s, "w", 3).await;
    assert_eq!(seqs_of(&claimed), [1, 2, 3]);
    let summary = f.journal.summary().await.unwrap();
    assert_eq!(
        (summary.processing, summary.pending),
        (3, 1),
        "the summary counts the claimed run as processing"
    );
    let end = StreamEnd {
        lease: lease.clone(),
        through: None,
        abandon: true,
    };
    assert_eq!(
        f.journal.finish(&[end]).await.expect("finish"),
        0,
        "nothing completed"
    );
    let all = rows(&f.journal).await;
    assert!(
        all.iter().all(|r| r.status == OutboxStatus::Pending),
        "all pending again: {all:?}"
    );
    assert_eq!(f.journal.summary().await.unwrap().processing, 0);
    assert_eq!(
        row(&f.journal, &s, 1).await.attempt_count,
        1,
        "attempt count unchanged"
    );
    assert!(is_due(&f.journal, &s).await, "due at once: the lease is released");
}

/// `finish` with `abandon` after a row of the run failed: the processing
/// rows on both sides of it are given back, the failed row stays failed
/// with its attempt, and the rows never claimed stay as they were. Another
/// stream's run, claimed by another worker, is not touched.
pub async fn finish_abandons_the_rows_behind_a_failed_one<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 6).await;
    let bystander = enqueue(&f.journal, "t", 3).await;
    let (lease, claimed) = take_and_claim(&f.journal, &s, "w", 4).await;
    assert_eq!(seqs_of(&claimed), [1, 2, 3, 4]);
    let (_, theirs) = take_and_claim(&f.journal, &bystander, "other", 2).await;
    assert_eq!(seqs_of(&theirs), [1, 2]);
    f.journal
        .fail(&lease, seq(2), "x", &RetryPolicy::default())
        .await
        .expect("fail a row of the run");
    let end = StreamEnd {
        lease: lease.clone(),
        through: None,
        abandon: true,
    };
    f.journal.finish(&[end]).await.expect("finish");
    let mut statuses: Vec<(&str, u64, OutboxStatus)> = rows(&f.journal)
        .await
        .iter()
        .map(|r| {
            let name = if r.stream == s { "s" } else { "t" };
            (name, r.seq.get(), r.status)
        })
        .collect();
    statuses.sort();
    assert_eq!(
        statuses,
        [
            ("s", 1, OutboxStatus::Pending),
            ("s", 2, OutboxStatus::Failed),
            ("s", 3, OutboxStatus::Pending),
            ("s", 4, OutboxStatus::Pending),
            ("s", 5, OutboxStatus::Pending),
            ("s", 6, OutboxStatus::Pending),
            ("t", 1, OutboxStatus::Processing),
            ("t", 2, OutboxStatus::Processing),
            ("t", 3, OutboxStatus::Pending),
        ]
    );
    assert_eq!(row(&f.journal, &s, 2).await.attempt_count, 1);
    assert_eq!(
        f.journal.summary().await.unwrap().processing,
        2,
        "only the bystander's run is still processing"
    );
}

/// `finish` under a lease that is no longer current (another owner's, or
/// expired and taken over) is no error and abandons nothing.
pub async fn finish_under_a_lost_lease_abandons_nothing<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let (lease, _) = take_and_claim(&f.journal, &s, "w", 2).await;
    let before = rows(&f.journal).await;
    let other = Lease {
        owner: owner("other"),
        ..lease.clone()
    };
    let r = f.journal.complete_and_release(&other, None, true).await;
    assert!(matches!(r, Ok(0)), "other owner: {r:?}");
    assert_eq!(
        rows(&f.journal).await,
        before,
        "another owner's finish changes nothing"
    );
    h.advance(&f.ctx, TTL + secs(1)).await;
    let (_, reclaimed) = take_and_claim(&f.journal, &s, "b", 1).await;
    assert_eq!(seqs_of(&reclaimed), [1], "taken over");
    let before = rows(&f.journal).await;
    let r = f.journal.complete_and_release(&lease, None, true).await;
    assert!(matches!(r, Ok(0)), "expired lease: {r:?}");
    assert_eq!(
        rows(&f.journal).await,
        before,
        "the old holder's finish changes nothing"
    );
}

/// `complete`: deletes every row of the stream with seq `<= through`,
/// whatever its status, and returns how many; other streams are untouched.
pub async fn complete_deletes_rows_whatever_status<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 5).await;
    let t = enqueue(&f.journal, "t", 2).await;
    let (lease, _) = take_and_claim(&f.journal, &s, "w", 3).await;
    dead_letter(&f.journal, &lease, seq(1), "dead").await.unwrap();
    f.journal
        .fail(&lease, seq(2), "failed", &RetryPolicy::default())
        .await
        .unwrap();
    use OutboxStatus::{Dead, Failed, Pending, Processing};
    assert_eq!(
        statuses(&f.journal, &s).await,
        [
            (1, Dead),
            (2, Failed),
            (3, Processing),
            (4, Pending),
            (5, Pending)
        ]
    );
    assert_eq!(
        f.journal.complete(&s, seq(4)).await.expect("complete"),
        4,
        "four rows deleted"
    );
    assert_eq!(statuses(&f.journal, &s).await, [(5, Pending)]);
    assert_eq!(
        seqs_of(&rows(&f.journal).await).len(),
        3,
        "t's rows are untouched"
    );
    assert_eq!(statuses(&f.journal, &t).await, [(1, Pending), (2, Pending)]);
}

/// `complete`: idempotent and needs no lease (even while another owner holds one).
pub async fn complete_is_idempotent_and_needs_no_lease<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 3).await;
    take_and_claim(&f.journal, &s, "holder", 10).await;
    assert_eq!(
        f.journal
            .complete(&s, seq(2))
            .await
            .expect("complete without the lease"),
        2
    );
    assert_eq!(
        f.journal.complete(&s, seq(2)).await.expect("complete again"),
        0,
        "idempotent"
    );
    assert_eq!(f.journal.complete(&s, seq(1)).await.expect("complete lower"), 0);
    assert_eq!(
        f.journal
            .complete(&sid("nope"), seq(5))
            .await
            .expect("unknown stream"),
        0
    );
    assert_eq!(seqs_of(&rows(&f.journal).await), [3]);
}

/// `complete`: the row after the completed ones becomes the head and is due.
pub async fn complete_makes_next_head_due<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 3).await;
    let (lease, claimed) = take_and_claim(&f.journal, &s, "w", 1).await;
    assert_eq!(seqs_of(&claimed), [1]);
    f.journal.complete(&s, seq(1)).await.unwrap();
    f.journal.release(&lease).await.unwrap();
    assert!(is_due(&f.journal, &s).await, "the next head is due");
    let (_lease, claimed) = take_and_claim(&f.journal, &s, "w", 10).await;
    assert_eq!(seqs_of(&claimed), [2, 3]);
}

/// `complete_and_claim`: deletes through `through` and claims the next due
/// run under the same lease, marked `processing`.
pub async fn complete_and_claim_completes_then_claims_the_next_run<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 5).await;
    let (lease, claimed) = take_and_claim(&f.journal, &s, "w", 2).await;
    assert_eq!(seqs_of(&claimed), [1, 2]);
    let (done, next) = f.journal.complete_and_claim(&lease, seq(2), 2).await.unwrap();
    assert_eq!(done, 2, "rows 1 and 2 completed");
    assert_eq!(seqs_of(&next), [3, 4], "the next run, at most max");
    use OutboxStatus::{Pending, Processing};
    assert_eq!(
        statuses(&f.journal, &s).await,
        [(3, Processing), (4, Processing), (5, Pending)]
    );
    let (done, next) = f.journal.complete_and_claim(&lease, seq(4), 2).await.unwrap();
    assert_eq!((done, seqs_of(&next)), (2, vec![5]));
    let (done, next) = f.journal.complete_and_claim(&lease, seq(5), 2).await.unwrap();
    assert_eq!(done, 1);
    assert!(next.is_empty(), "nothing left to claim: {next:?}");
    assert!(rows(&f.journal).await.is_empty(), "every row completed");
}

/// `complete_and_claim`: with a lease that is no longer current the
/// completion still happens (it needs no lease) and nothing is claimed.
pub async fn complete_and_claim_with_a_lost_lease_completes_and_claims_nothing<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 4).await;
    let (lease, claimed) = take_and_claim(&f.journal, &s, "w", 2).await;
    assert_eq!(seqs_of(&claimed), [1, 2]);
    assert!(f.journal.release(&lease).await.unwrap());
    let (done, next) = f.journal.complete_and_claim(&lease, seq(2), 2).await.unwrap();
    assert_eq!(done, 2, "the completion stands without a lease");
    assert!(next.is_empty(), "a released lease claims nothing: {next:?}");
    use OutboxStatus::Pending;
    assert_eq!(
        statuses(&f.journal, &s).await,
        [(3, Pending), (4, Pending)],
        "the rows behind stay pending"
    );
}

/// `acquire_and_claim`: takes a free stream's lease and claims its head run
/// in one call; with the lease held by another owner, `None` and nothing
/// changes.
pub async fn acquire_and_claim_takes_the_lease_and_the_head_run<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 4).await;
    let (lease, claimed) = f
        .journal
        .acquire_and_claim(&s, &owner("w"), TTL, 3)
        .await
        .unwrap()
        .expect("a free stream");
    assert_eq!((lease.owner.as_str(), lease.epoch), ("w", 1));
    assert_eq!(seqs_of(&claimed), [1, 2, 3]);
    use OutboxStatus::{Pending, Processing};
    assert_eq!(
        statuses(&f.journal, &s).await,
        [(1, Processing), (2, Processing), (3, Processing), (4, Pending)]
    );
    let before = rows(&f.journal).await;
    let other = f
        .journal
        .acquire_and_claim(&s, &owner("x"), TTL, 3)
        .await
        .unwrap();
    assert!(other.is_none(), "a held lease: {other:?}");
    assert_eq!(rows(&f.journal).await, before, "nothing claimed");
    let renewed = f.journal.renew(&lease, TTL).await;
    assert!(renewed.is_ok(), "the lease is the holder's, current: {renewed:?}");
}

/// `finish` of one pass: completes, returns the rest of the holder's
/// processing rows to pending and frees the stream in one call; with a
/// lease no longer current the completion stands and nothing else changes.
pub async fn complete_and_release_completes_abandons_and_frees_the_stream<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 5).await;
    let (lease, claimed) = take_and_claim(&f.journal, &s, "w", 3).await;
    assert_eq!(seqs_of(&claimed), [1, 2, 3]);
    let done = f
        .journal
        .complete_and_release(&lease, Some(seq(2)), true)
        .await
        .unwrap();
    assert_eq!(done, 2);
    use OutboxStatus::Pending;
    assert_eq!(
        statuses(&f.journal, &s).await,
        [(3, Pending), (4, Pending), (5, Pending)],
        "the unfinished row is pending again"
    );
    assert!(is_due(&f.journal, &s).await, "the stream is free and due");
    let next = take(&f.journal, &s, "x").await;
    assert_eq!(next.epoch, lease.epoch + 1, "the next holder gets the next epoch");
    // The old holder ends its pass late: its completion stands, the rest
    // (abandon, release) changes nothing and is not an error.
    let late = f
        .journal
        .complete_and_release(&lease, Some(seq(3)), true)
        .await
        .unwrap();
    assert_eq!(late, 1, "completion needs no lease");
    assert_eq!(
        f.journal.lease(&s).await.unwrap().map(|l| (l.owner, l.epoch)),
        Some((owner("x"), next.epoch)),
        "the new holder keeps its lease"
    );
    let nothing = f.journal.complete_and_release(&next, None, false).await.unwrap();
    assert_eq!(nothing, 0);
    assert!(f.journal.lease(&s).await.unwrap().is_none(), "released");
}

/// The sweep limits `(streams, per_stream, rows)`.
fn limits(streams: usize, per_stream: usize, rows: usize) -> SweepLimits {
    SweepLimits {
        streams,
        per_stream,
        rows,
    }
}

/// `take` of the due streams for `who` with the checks' TTL, which must
/// succeed: each lease with its run.
async fn sweep<J: Journal>(j: &J, who: &str, l: SweepLimits) -> Vec<(Lease, Vec<OutboxRow>)> {
    j.take(&owner(who), TTL, Take::Due(l))
        .await
        .unwrap_or_else(|e| panic!("take of the due streams for {who} with {l:?} failed: {e}"))
        .into_iter()
        .map(|run| (run.lease, run.rows))
        .collect()
}

/// What a sweep took: each stream with the seqs of its run, in the order returned.
fn swept(taken: &[(Lease, Vec<OutboxRow>)]) -> Vec<(String, Vec<u64>)> {
    taken
        .iter()
        .map(|(lease, run)| (lease.stream.to_string(), seqs_of(run)))
        .collect()
}

/// `take` of the due streams: takes the due streams oldest due first (as
/// `due_streams`, not by name), each with its head run of at most
/// `per_stream` rows, until `streams` streams or `rows` rows in all are
/// taken (the last run is cut to what is left of the rows budget); each
/// lease is the caller's (epoch 1 on a fresh stream) and current, the
/// claimed rows are `processing`, and streams not taken are untouched.
pub async fn take_due_takes_oldest_due_streams_within_the_limits<H: Harness>(h: &H) {
    use OutboxStatus::{Pending, Processing};
    let f = h.open().await;
    let c = enqueue(&f.journal, "c", 3).await;
    h.advance(&f.ctx, ms(10)).await;
    let a = enqueue(&f.journal, "a", 2).await;
    h.advance(&f.ctx, ms(10)).await;
    let b = enqueue(&f.journal, "b", 4).await;
    h.advance(&f.ctx, ms(10)).await;
    let d = enqueue(&f.journal, "d", 1).await;
    let taken = sweep(&f.journal, "w", limits(3, 2, 100)).await;
    assert_eq!(
        swept(&taken),
        [
            ("c".to_owned(), vec![1, 2]),
            ("a".to_owned(), vec![1, 2]),
            ("b".to_owned(), vec![1, 2])
        ],
        "the three oldest due streams, oldest due first, each run cut at per_stream = 2"
    );
    for (lease, run) in &taken {
        assert_eq!(
            (lease.owner.as_str(), lease.epoch),
            ("w", 1),
            "{}: the lease is the caller's, first epoch",
            lease.stream
        );
        assert!(
            run.iter()
                .all(|r| r.stream == lease.stream && r.status == OutboxStatus::Processing),
            "{}: the run is the lease's stream's rows, returned as processing: {run:?}",
            lease.stream
        );
        assert_eq!(
            f.journal.lease(&lease.stream).await.unwrap().as_ref(),
            Some(lease),
            "{}: the returned lease is the stream's current lease",
            lease.stream
        );
        let renewed = f.journal.renew(lease, TTL).await;
        assert!(
            renewed.is_ok(),
            "{}: the lease is current and unexpired: {renewed:?}",
            lease.stream
        );
    }
    assert_eq!(
        statuses(&f.journal, &c).await,
        [(1, Processing), (2, Processing), (3, Pending)],
        "c: its head run claimed, the row behind the cut pending"
    );
    assert_eq!(statuses(&f.journal, &a).await, [(1, Processing), (2, Processing)]);
    assert_eq!(
        statuses(&f.journal, &b).await,
        [(1, Processing), (2, Processing), (3, Pending), (4, Pending)]
    );
    assert_eq!(
        statuses(&f.journal, &d).await,
        [(1, Pending)],
        "d, beyond the streams limit, is not claimed"
    );
    assert!(
        f.journal.lease(&d).await.unwrap().is_none(),
        "d, beyond the streams limit, is not leased"
    );
    assert_eq!(
        due(&f.journal).await,
        [d],
        "only the stream not taken is still due"
    );

    // The rows budget: stops once `rows` rows are taken, the last run cut.
    let f = h.open().await;
    let c = enqueue(&f.journal, "c", 3).await;
    h.advance(&f.ctx, ms(10)).await;
    let a = enqueue(&f.journal, "a", 3).await;
    h.advance(&f.ctx, ms(10)).await;
    let b = enqueue(&f.journal, "b", 3).await;
    let taken = sweep(&f.journal, "w", limits(10, 2, 3)).await;
    assert_eq!(
        swept(&taken),
        [("c".to_owned(), vec![1, 2]), ("a".to_owned(), vec![1])],
        "rows = 3: the oldest stream's run of 2, then the next one's cut to the 1 row left"
    );
    assert_eq!(
        statuses(&f.journal, &a).await,
        [(1, Processing), (2, Pending), (3, Pending)],
        "a: only the row within the rows budget is claimed"
    );
    assert_eq!(
        statuses(&f.journal, &b).await,
        [(1, Pending), (2, Pending), (3, Pending)],
        "b, after the rows budget ran out, is not claimed"
    );
    assert!(
        f.journal.lease(&b).await.unwrap().is_none(),
        "b, after the rows budget ran out, is not leased"
    );
    assert_eq!(
        statuses(&f.journal, &c).await,
        [(1, Processing), (2, Processing), (3, Pending)]
    );
}

/// `take` of the due streams: takes exactly what `take` of the due streams
/// takes from the same journal (streams, runs cut by the limits, leases),
/// and a run's events, where the claim read them, are what `read_runs`
/// returns for the run.
pub async fn take_due_reads_the_runs_events_as_read_runs_does<H: Harness>(h: &H) {
    let (plain, loading) = (h.open().await, h.open().await);
    for f in [&plain, &loading] {
        enqueue(&f.journal, "c", 3).await;
        h.advance(&f.ctx, ms(10)).await;
        enqueue(&f.journal, "a", 4).await;
        h.advance(&f.ctx, ms(10)).await;
        enqueue(&f.journal, "b", 2).await;
    }
    let l = limits(2, 3, 5);
    let taken = sweep(&plain.journal, "w", l).await;
    let loaded = loading
        .journal
        .take(&owner("w"), TTL, Take::Due(l))
        .await
        .unwrap_or_else(|e| panic!("take of the due streams with {l:?} failed: {e}"));
    let as_taken: Vec<(Lease, Vec<OutboxRow>)> =
        loaded.iter().map(|r| (r.lease.clone(), r.rows.clone())).collect();
    assert_eq!(
        swept(&as_taken),
        [("c".to_owned(), vec![1, 2, 3]), ("a".to_owned(), vec![1, 2])],
        "the oldest due streams, within the limits, as `take` of the due streams takes them"
    );
    assert_eq!(swept(&as_taken), swept(&taken));
    for (run, (lease, rows)) in loaded.iter().zip(&taken) {
        let stream = &run.lease.stream;
        assert_eq!(
            (&run.lease.owner, run.lease.epoch, run.lease.partition),
            (&lease.owner, lease.epoch, lease.partition),
            "{stream}: the same lease"
        );
        assert_eq!(
            f_statuses(&run.rows),
            f_statuses(rows),
            "{stream}: the same rows, claimed"
        );
        assert_eq!(
            loading.journal.lease(stream).await.unwrap().as_ref(),
            Some(&run.lease),
            "{stream}: the returned lease is current"
        );
        if let Some(events) = &run.events {
            let read = loading
                .journal
                .read_runs(&[(stream.clone(), run.rows[0].seq, run.rows.len())])
                .await
                .unwrap();
            assert_eq!(
                std::slice::from_ref(events),
                read.as_slice(),
                "{stream}: the loaded events are the run's"
            );
        }
    }
    assert_eq!(
        due(&loading.journal).await,
        [sid("b")],
        "only the stream not taken is due"
    );
}

/// Each row's `(seq, status, attempt_count)`.
fn f_statuses(rows: &[OutboxRow]) -> Vec<(u64, OutboxStatus, u32)> {
    rows.iter()
        .map(|r| (r.seq.get(), r.status, r.attempt_count))
        .collect()
}

/// `take` of the due streams: a stream whose lease another owner holds is
/// skipped and left as it was; never a stream whose head is dead or failed
/// and not yet due (not even leased for a moment: its epoch does not move);
/// the failed head's stream is taken once it is due, attempt count kept.
pub async fn take_due_skips_held_dead_and_not_due_streams<H: Harness>(h: &H) {
    use OutboxStatus::{Dead, Failed, Pending, Processing};
    let f = h.open().await;
    let held = enqueue(&f.journal, "held", 2).await;
    let other = take(&f.journal, &held, "other").await;
    let failed = enqueue(&f.journal, "failed", 2).await;
    fail_head(&f.journal, &failed, "x", &RetryPolicy::default()).await;
    let dead = enqueue(&f.journal, "dead", 2).await;
    kill_head(&f.journal, &dead, "x").await;
    let free = enqueue(&f.journal, "free", 2).await;
    let taken = sweep(&f.journal, "w", limits(10, 10, 100)).await;
    assert_eq!(
        swept(&taken),
        [("free".to_owned(), vec![1, 2])],
        "only the free stream with a due head is taken"
    );
    assert_eq!(
        statuses(&f.journal, &free).await,
        [(1, Processing), (2, Processing)],
        "the free stream's run is claimed"
    );
    assert_eq!(
        f.journal.lease(&held).await.unwrap(),
        Some(other.clone()),
        "the other owner keeps its lease as it was"
    );
    assert_eq!(
        statuses(&f.journal, &held).await,
        [(1, Pending), (2, Pending)],
        "the held stream's rows are not claimed"
    );
    assert_eq!(
        statuses(&f.journal, &failed).await,
        [(1, Failed), (2, Pending)],
        "a failed head that is not due is not claimed"
    );
    assert_eq!(
        statuses(&f.journal, &dead).await,
        [(1, Dead), (2, Pending)],
        "a dead head is not claimed"
    );
    for s in [&failed, &dead] {
        assert!(
            f.journal.lease(s).await.unwrap().is_none(),
            "{s}: a stream that is not due is not leased"
        );
    }
    h.advance(&f.ctx, secs(1)).await;
    let taken = sweep(&f.journal, "w", limits(10, 10, 100)).await;
    assert_eq!(
        swept(&taken),
        [("failed".to_owned(), vec![1, 2])],
        "once due (1 s later) the failed head's stream is taken; the dead one never"
    );
    assert_eq!(
        taken[0].0.epoch, 2,
        "the failed stream's lease: epoch 2 (fail_head held epoch 1; the first sweep did not lease it)"
    );
    assert_eq!(
        taken[0].1[0].attempt_count, 1,
        "claiming a failed head keeps its attempt count"
    );
    assert_eq!(
        statuses(&f.journal, &failed).await,
        [(1, Processing), (2, Processing)]
    );
    assert_eq!(
        statuses(&f.journal, &dead).await,
        [(1, Dead), (2, Pending)],
        "the dead head's stream is still untouched"
    );
    assert_eq!(
        take(&f.journal, &dead, "y").await.epoch,
        2,
        "the dead stream was never leased by a sweep (kill_head held epoch 1)"
    );
    assert_eq!(
        f.journal.lease(&held).await.unwrap(),
        Some(other),
        "the other owner still holds its lease"
    );
}

/// `take` of the due streams: with nothing due it returns nothing and changes
/// nothing; a limit of 0 or a TTL out of range is `InvalidInput` and
/// changes nothing either.
pub async fn take_due_with_nothing_due_or_bad_limits_takes_nothing<H: Harness>(h: &H) {
    let f = h.open().await;
    let taken = sweep(&f.journal, "w", limits(10, 10, 100)).await;
    assert!(taken.is_empty(), "an empty outbox: nothing taken: {taken:?}");
    let s = enqueue(&f.journal, "s", 2).await;
    let held = take(&f.journal, &s, "other").await;
    let before = rows(&f.journal).await;
    let taken = sweep(&f.journal, "w", limits(10, 10, 100)).await;
    assert!(
        taken.is_empty(),
        "the only stream is leased by another owner: nothing taken: {taken:?}"
    );
    assert_eq!(rows(&f.journal).await, before, "nothing due: no row changed");
    assert_eq!(
        f.journal.lease(&s).await.unwrap(),
        Some(held),
        "nothing due: the lease is untouched"
    );
    let t = enqueue(&f.journal, "t", 2).await;
    let before = rows(&f.journal).await;
    for (what, l) in [
        ("streams = 0", limits(0, 10, 100)),
        ("per_stream = 0", limits(10, 0, 100)),
        ("rows = 0", limits(10, 10, 0)),
    ] {
        let r = f.journal.take(&owner("w"), TTL, Take::Due(l)).await;
        assert!(
            matches!(r, Err(Error::InvalidInput(_))),
            "a sweep limit {what} is InvalidInput: {r:?}"
        );
    }
    for ttl in [ms(1), secs(86_401)] {
        let r = f
            .journal
            .take(&owner("w"), ttl, Take::Due(limits(10, 10, 100)))
            .await;
        assert!(
            matches!(r, Err(Error::InvalidInput(_))),
            "a ttl of {ttl:?} is InvalidInput: {r:?}"
        );
    }
    assert_eq!(rows(&f.journal).await, before, "refused sweeps change no row");
    assert!(
        f.journal.lease(&t).await.unwrap().is_none(),
        "refused sweeps lease nothing"
    );
    assert!(is_due(&f.journal, &t).await, "t is still due");
}

/// `take` of the due streams: after a takeover (the holder's lease expired,
/// store clock) a stream whose head is still `processing` is due again and
/// its unfinished head is claimed alone, uncharged (it was claimed beside
/// other rows), as `claim` does; the old holder's lease is lost.
pub async fn take_due_reclaims_an_unfinished_head_alone<H: Harness>(h: &H) {
    use OutboxStatus::Processing;
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 3).await;
    let first = sweep(&f.journal, "a", limits(10, 10, 100)).await;
    assert_eq!(swept(&first), [("s".to_owned(), vec![1, 2, 3])]);
    let old = first[0].0.clone();
    assert!(
        sweep(&f.journal, "b", limits(10, 10, 100)).await.is_empty(),
        "nothing due while a holds the lease"
    );
    // The holder dies: no complete, fail, abandon or release.
    h.advance(&f.ctx, TTL + secs(1)).await;
    let second = sweep(&f.journal, "b", limits(10, 10, 100)).await;
    assert_eq!(
        swept(&second),
        [("s".to_owned(), vec![1])],
        "the unfinished head is claimed alone"
    );
    let (lease, run) = &second[0];
    assert_eq!(
        (lease.owner.as_str(), lease.epoch),
        ("b", old.epoch + 1),
        "the takeover has the next epoch"
    );
    assert_eq!(
        (
            run[0].status,
            run[0].attempt_count,
            run[0].last_error.as_deref(),
            run[0].alone
        ),
        (Processing, 0, None, true),
        "the unfinished head is applied alone, uncharged"
    );
    assert_eq!(
        statuses(&f.journal, &s).await,
        [(1, Processing), (2, Processing), (3, Processing)]
    );
    assert_eq!(
        row(&f.journal, &s, 2).await.attempt_count,
        0,
        "the row behind the unfinished head is not claimed again"
    );
    let r = f.journal.claim(&old, 10).await;
    assert!(
        matches!(r, Err(Error::LeaseLost { .. })),
        "the old holder's lease is lost: {r:?}"
    );
}

/// `take` of the due streams after a sweep's worker died: every stream it
/// held is taken again, each suspect head claimed by itself (a run of one
/// row, applied alone) beside fresh streams, and none is charged an
/// attempt: nobody can tell which stream's row ended the sweep.
pub async fn sweeps_take_suspects_by_themselves_and_charge_none<H: Harness>(h: &H) {
    let f = h.open().await;
    let (s, t) = (
        enqueue(&f.journal, "s", 3).await,
        enqueue(&f.journal, "t", 3).await,
    );
    let first = sweep(&f.journal, "a", limits(10, 10, 100)).await;
    assert_eq!(swept(&first).len(), 2, "one sweep over both streams");
    // The sweep's worker dies: both heads are suspects, neither is charged.
    h.advance(&f.ctx, TTL + secs(1)).await;
    let u = enqueue(&f.journal, "u", 2).await;
    let second = sweep(&f.journal, "b", limits(10, 10, 100)).await;
    let mut got = swept(&second);
    got.sort();
    assert_eq!(
        got,
        [
            ("s".to_owned(), vec![1]),
            ("t".to_owned(), vec![1]),
            ("u".to_owned(), vec![1, 2])
        ],
        "each suspect by itself, the fresh stream whole"
    );
    for (lease, run) in &second {
        let alone = lease.stream != u;
        assert_eq!(
            (run[0].attempt_count, run[0].alone, run[0].last_error.as_deref()),
            (0, alone, None),
            "{}: uncharged",
            lease.stream
        );
    }
    for (stream, n) in [(&s, 2), (&t, 2)] {
        assert_eq!(
            row(&f.journal, stream, n).await.attempt_count,
            0,
            "{stream}: the row behind is not charged either"
        );
    }
}

/// `finish`: `complete_and_release` for each end (through
/// given or not, abandon or not), returning the rows completed in all; a
/// lease no longer current among them fails nothing: its completion stands,
/// its abandon and release change nothing, and the other ends take effect.
pub async fn finish_ends_several_passes<H: Harness>(h: &H) {
    use OutboxStatus::{Pending, Processing};
    let f = h.open().await;
    assert_eq!(
        f.journal.finish(&[]).await.unwrap(),
        0,
        "no ends: nothing completed"
    );
    let s = enqueue(&f.journal, "s", 4).await;
    let t = enqueue(&f.journal, "t", 3).await;
    let u = enqueue(&f.journal, "u", 2).await;
    let v = enqueue(&f.journal, "v", 3).await;
    let mut leases = BTreeMap::new();
    for (stream, want) in [
        (&s, vec![1, 2, 3]),
        (&t, vec![1, 2, 3]),
        (&u, vec![1, 2]),
        (&v, vec![1, 2, 3]),
    ] {
        let (lease, run) = take_and_claim(&f.journal, stream, "w", 3).await;
        assert_eq!(seqs_of(&run), want, "{stream}: set-up claim");
        leases.insert(stream.to_string(), lease);
    }
    // v's pass is lost: its lease released and taken by x.
    assert!(f.journal.release(&leases["v"]).await.unwrap());
    let x = take(&f.journal, &v, "x").await;
    let end = |name: &str, through: Option<u64>, abandon: bool| StreamEnd {
        lease: leases[name].clone(),
        through: through.map(seq),
        abandon,
    };
    let done = f
        .journal
        .finish(&[
            end("s", Some(2), true),
            end("v", Some(1), true),
            end("t", Some(3), false),
            end("u", None, true),
        ])
        .await
        .expect("a lost lease among the ends is not an error");
    assert_eq!(
        done,
        2 + 1 + 3,
        "the rows completed in all, the lost pass's included"
    );
    assert_eq!(
        statuses(&f.journal, &s).await,
        [(3, Pending), (4, Pending)],
        "s: completed through 2, its unfinished row abandoned"
    );
    assert!(
        statuses(&f.journal, &t).await.is_empty(),
        "t: completed through 3"
    );
    assert_eq!(
        statuses(&f.journal, &u).await,
        [(1, Pending), (2, Pending)],
        "u: nothing completed, its claimed rows abandoned"
    );
    assert_eq!(
        statuses(&f.journal, &v).await,
        [(2, Processing), (3, Processing)],
        "v: the lost pass's completion stands, its abandon changes nothing"
    );
    for stream in [&s, &t, &u] {
        assert!(
            f.journal.lease(stream).await.unwrap().is_none(),
            "{stream}: the lease is released"
        );
    }
    assert_eq!(
        f.journal.lease(&v).await.unwrap(),
        Some(x.clone()),
        "v: the lost pass's release changes nothing; x keeps its lease"
    );
    assert_eq!(
        due(&f.journal)
            .await
            .into_iter()
            .filter(|d| d == &s || d == &u)
            .count(),
        2,
        "s and u are free and due again"
    );
    let r = f.journal.renew(&x, TTL).await;
    assert!(r.is_ok(), "x's lease is still current: {r:?}");
}

/// `finish` with plain ends (a completion, no abandon):
/// each stream's head moves to its first row left, due by that row, or goes
/// with its last row, as `complete` leaves it.
pub async fn finish_moves_the_heads_of_completed_streams<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let a = enqueue(j, "a", 3).await;
    let b = enqueue(j, "b", 2).await;
    let mut ends = Vec::new();
    for stream in [&a, &b] {
        let (lease, run) = take_and_claim(j, stream, "w", 2).await;
        assert_eq!(seqs_of(&run), [1, 2], "{stream}: set-up claim");
        ends.push(StreamEnd {
            lease,
            through: Some(seq(2)),
            abandon: false,
        });
    }
    let done = j.finish(&ends).await.expect("ends");
    assert_eq!(done, 4);
    assert_eq!(
        due(j).await,
        std::slice::from_ref(&a),
        "a is due by its row 3; b, with no row left, is not due"
    );
    let (_, run) = take_and_claim(j, &a, "x", 10).await;
    assert_eq!(seqs_of(&run), [3], "a's head is its first row left");
}

/// `requeue`: a dead row becomes pending, attempt count 0, error cleared, due now.
pub async fn requeue_revives_dead_row<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let policy = RetryPolicy::new(ms(10), ms(10), 2).unwrap();
    fail_head(&f.journal, &s, "w", &policy).await;
    h.advance(&f.ctx, ms(10)).await;
    let dead = fail_head(&f.journal, &s, "w", &policy).await;
    assert_eq!((dead.status, dead.attempt_count), (OutboxStatus::Dead, 2));
    h.advance(&f.ctx, secs(60)).await;
    let before = now(&f.journal).await;
    let r = f.journal.requeue(&s, seq(1)).await.expect("requeue");
    assert_eq!(r.status, OutboxStatus::Pending);
    assert_eq!(r.attempt_count, 0, "attempts reset");
    assert_eq!(r.last_error, None, "error cleared");
    assert!(
        r.next_attempt_at >= before && r.next_attempt_at <= now(&f.journal).await,
        "due now"
    );
    assert_eq!(
        row(&f.journal, &s, 1).await,
        r,
        "the returned row is the stored row"
    );
    assert!(is_due(&f.journal, &s).await, "the stream is due again");
}

/// `first_failed_at`: unset on a new row; set by the first failure (a
/// recorded one or an unfinished attempt found by a claim) to the store's
/// clock; kept through later failures, dead-lettering and `retry`; cleared by
/// `requeue`.
pub async fn first_failure_is_kept_through_retries_and_cleared_by_requeue<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let s = enqueue(j, "s", 2).await;
    assert_eq!(
        row(j, &s, 1).await.first_failed_at,
        None,
        "a new row never failed"
    );
    let policy = RetryPolicy::new(ms(10), ms(10), 3).unwrap();
    let before = now(j).await;
    let first = fail_head(j, &s, "w", &policy).await.first_failed_at;
    let after = now(j).await;
    let at = first.expect("the first failure is recorded");
    assert!(
        before <= at && at <= after,
        "{at} is the store's now, in [{before}, {after}]"
    );
    for (i, status) in [(2, OutboxStatus::Failed), (3, OutboxStatus::Dead)] {
        h.advance(&f.ctx, secs(5)).await;
        let r = fail_head(j, &s, "w", &policy).await;
        assert_eq!((r.attempt_count, r.status), (i, status));
        assert_eq!(
            r.first_failed_at, first,
            "failure {i} keeps the first failure's time"
        );
        assert!(r.updated_at > at, "while updated_at moves on");
    }
    let r = j.requeue(&s, seq(1)).await.expect("requeue");
    assert_eq!(r.first_failed_at, None, "a requeue starts the row afresh");
    assert_eq!(row(j, &s, 1).await, r);

    let t = enqueue(j, "t", 1).await;
    let failed = fail_head(j, &t, "w", &RetryPolicy::default()).await;
    let r = j.retry(&t, seq(1)).await.expect("retry");
    assert_eq!(
        r.first_failed_at, failed.first_failed_at,
        "retry now keeps the first failure"
    );

    let u = enqueue(j, "u", 1).await;
    take_and_claim(j, &u, "crashes", 1).await;
    h.advance(&f.ctx, TTL + secs(1)).await;
    let (lease, suspect) = take_and_claim(j, &u, "crashes alone", 1).await;
    assert_eq!(
        suspect[0].first_failed_at, None,
        "a claim that ended before anything showed the row at fault is nobody's failure"
    );
    j.begin_attempt(&lease, seq(1)).await.unwrap();
    h.advance(&f.ctx, TTL + secs(1)).await;
    let before = now(j).await;
    let (_lease, claimed) = take_and_claim(j, &u, "next", 1).await;
    let after = now(j).await;
    let at = claimed[0]
        .first_failed_at
        .expect("an unfinished attempt of its own is a failure");
    assert!(before <= at && at <= after, "{at} in [{before}, {after}]");
    assert_eq!(row(j, &u, 1).await.first_failed_at, Some(at));
}

/// `requeue`: a row that is not dead is `InvalidState`, and nothing changes.
pub async fn requeue_of_live_row_is_invalid_state<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 3).await;
    let (lease, _) = take_and_claim(&f.journal, &s, "w", 2).await;
    f.journal
        .fail(&lease, seq(1), "x", &RetryPolicy::default())
        .await
        .unwrap();
    let before = rows(&f.journal).await;
    for (n, what) in [(1, "failed"), (2, "processing"), (3, "pending")] {
        let r = f.journal.requeue(&s, seq(n)).await;
        assert!(
            matches!(r, Err(Error::InvalidState(_))),
            "requeue of a {what} row: {r:?}"
        );
    }
    assert_eq!(rows(&f.journal).await, before, "refused requeues change nothing");
}

/// `requeue`: a missing row is `NotFound`.
pub async fn requeue_of_missing_row_is_not_found<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 1).await;
    let r = f.journal.requeue(&s, seq(2)).await;
    assert!(matches!(r, Err(Error::NotFound(_))), "missing seq: {r:?}");
    let r = f.journal.requeue(&sid("nope"), Seq::FIRST).await;
    assert!(matches!(r, Err(Error::NotFound(_))), "unknown stream: {r:?}");
    f.journal.complete(&s, seq(1)).await.unwrap();
    let r = f.journal.requeue(&s, seq(1)).await;
    assert!(matches!(r, Err(Error::NotFound(_))), "completed row: {r:?}");
}

/// `requeue_dead`: up to `limit` dead rows, oldest first by
/// (`next_attempt_at`, stream, seq), returned as they now are.
pub async fn requeue_dead_oldest_first_with_limit<H: Harness>(h: &H) {
    let f = h.open().await;
    let (a, b, c) = (
        enqueue(&f.journal, "a", 1).await,
        enqueue(&f.journal, "b", 1).await,
        enqueue(&f.journal, "c", 1).await,
    );
    enqueue(&f.journal, "d", 1).await;
    kill_head(&f.journal, &c, "w").await;
    h.advance(&f.ctx, secs(1)).await;
    kill_head(&f.journal, &b, "w").await;
    h.advance(&f.ctx, secs(1)).await;
    kill_head(&f.journal, &a, "w").await;
    let first = f.journal.requeue_dead(2).await.expect("requeue_dead");
    let names: Vec<&str> = first.iter().map(|r| r.stream.as_str()).collect();
    assert_eq!(names, ["c", "b"], "oldest dead first, at most `limit`");
    for r in &first {
        assert_eq!(
            (r.status, r.attempt_count, r.last_error.as_deref()),
            (OutboxStatus::Pending, 0, None)
        );
        assert_eq!(
            &row(&f.journal, &r.stream, r.seq.get()).await,
            r,
            "returned as they now are"
        );
    }
    assert_eq!(
        row(&f.journal, &a, 1).await.status,
        OutboxStatus::Dead,
        "beyond the limit stays dead"
    );
    let rest = f.journal.requeue_dead(10).await.unwrap();
    assert_eq!(rest.iter().map(|r| r.stream.as_str()).collect::<Vec<_>>(), ["a"]);
    assert!(
        f.journal.requeue_dead(10).await.unwrap().is_empty(),
        "nothing dead is left"
    );
    assert_eq!(due(&f.journal).await.len(), 4, "every stream is due again");
}

/// `requeue_dead`: ties on `next_attempt_at` are broken by stream, then seq.
pub async fn requeue_dead_breaks_ties_by_stream_and_seq<H: Harness>(h: &H) {
    let f = h.open().await;
    let (b, a) = (
        enqueue(&f.journal, "b", 2).await,
        enqueue(&f.journal, "a", 1).await,
    );
    let (lb, _) = take_and_claim(&f.journal, &b, "w", 2).await;
    let (la, _) = take_and_claim(&f.journal, &a, "w", 1).await;
    // The memory clock stands still, so these three die at the same instant.
    dead_letter(&f.journal, &lb, seq(1), "x").await.unwrap();
    dead_letter(&f.journal, &lb, seq(2), "x").await.unwrap();
    dead_letter(&f.journal, &la, seq(1), "x").await.unwrap();
    let mut dead = rows(&f.journal).await;
    dead.sort_by(|x, y| (x.next_attempt_at, &x.stream, x.seq).cmp(&(y.next_attempt_at, &y.stream, y.seq)));
    let want: Vec<(String, u64)> = dead.iter().map(|r| (r.stream.to_string(), r.seq.get())).collect();
    let got: Vec<(String, u64)> = f
        .journal
        .requeue_dead(10)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.stream.to_string(), r.seq.get()))
        .collect();
    assert_eq!(got, want, "ordered by (next_attempt_at, stream, seq)");
}

/// `summary`: counts rows by status; an empty outbox counts zero and names no row.
pub async fn summary_counts_by_status<H: Harness>(h: &H) {
    let f = h.open().await;
    let empty = f.journal.summary().await.unwrap();
    assert_eq!(
        (empty.total(), empty.oldest_retry_eligible.clone()),
        (0, None),
        "empty outbox"
    );
    let s = enqueue(&f.journal, "s", 3).await;
    let t = enqueue(&f.journal, "t", 2).await;
    enqueue(&f.journal, "u", 4).await;
    kill_head(&f.journal, &t, "w").await;
    let (lease, _) = take_and_claim(&f.journal, &s, "w", 2).await;
    f.journal
        .fail(&lease, seq(1), "x", &RetryPolicy::default())
        .await
        .unwrap();
    let sum = f.journal.summary().await.unwrap();
    assert_eq!(
        (sum.pending, sum.processing, sum.failed, sum.dead),
        (1 + 1 + 4, 1, 1, 1),
        "counts by status: {sum:?}"
    );
    assert_eq!(sum.total(), 9);
    for st in OutboxStatus::ALL {
        let n = f.journal.list(Some(st), 100).await.unwrap().len() as u64;
        assert_eq!(sum.count(st), n, "summary and list agree on {st}");
    }
}

/// `summary`: `oldest_applicable_due` is the earliest due time among the
/// head rows a worker may take. Rows behind a dead head or behind a failed
/// head not due yet never count, however old (the headline's worker lag
/// must not grow while the workers are caught up).
pub async fn summary_oldest_applicable_skips_what_failures_hold_back<H: Harness>(h: &H) {
    let f = h.open().await;
    let empty = f.journal.summary().await.unwrap();
    assert_eq!(empty.oldest_applicable_due, None, "nothing queued");
    let dead = enqueue(&f.journal, "dead", 3).await;
    kill_head(&f.journal, &dead, "w").await;
    let failing = enqueue(&f.journal, "failing", 2).await;
    let an_hour = RetryPolicy::new(secs(3600), secs(3600), 8).unwrap();
    fail_head(&f.journal, &failing, "w", &an_hour).await;
    h.advance(&f.ctx, secs(1)).await;
    let s = f.journal.summary().await.unwrap();
    let failed_due = row(&f.journal, &failing, 1).await.next_attempt_at;
    assert!(failed_due > s.as_of, "the failed head is not due yet");
    assert_eq!(
        s.oldest_applicable_due,
        Some(failed_due),
        "only the failed head is applicable, later: {s:?}"
    );
    assert!(
        s.oldest_retry_eligible
            .as_ref()
            .is_some_and(|r| r.next_attempt_at < s.as_of),
        "the rows behind the heads are older: {s:?}"
    );
    let fresh = enqueue(&f.journal, "fresh", 1).await;
    let s = f.journal.summary().await.unwrap();
    let fresh_due = row(&f.journal, &fresh, 1).await.next_attempt_at;
    assert_eq!(s.oldest_applicable_due, Some(fresh_due), "{s:?}");
    let (_lease, claimed) = take_and_claim(&f.journal, &fresh, "w", 10).await;
    assert_eq!(claimed.len(), 1);
    f.journal.complete(&fresh, seq(1)).await.unwrap();
    let s = f.journal.summary().await.unwrap();
    assert_eq!(s.oldest_applicable_due, Some(failed_due), "{s:?}");
}

/// `summary`: names the pending-or-failed row with the earliest
/// `next_attempt_at` (ties by stream, then seq); processing and dead rows never.
pub async fn summary_names_oldest_retry_eligible_row<H: Harness>(h: &H) {
    let f = h.open().await;
    let oldest = |s: OutboxSummary| {
        s.oldest_retry_eligible
            .map(|r| (r.stream.to_string(), r.seq.get()))
    };
    let z = enqueue(&f.journal, "z", 2).await;
    h.advance(&f.ctx, secs(1)).await;
    let (c, d) = (sid("c"), sid("d"));
    f.journal
        .append(
            &[
                req(&c, ExpectedVersion::Any, adds(&[1])),
                req(&d, ExpectedVersion::Any, adds(&[1])),
            ],
            AppendOptions::enqueue(),
        )
        .await
        .unwrap();
    assert_eq!(
        oldest(f.journal.summary().await.unwrap()),
        Some(("z".into(), 1)),
        "the earliest due row"
    );
    let (lease, _) = take_and_claim(&f.journal, &z, "w", 2).await;
    assert_eq!(
        oldest(f.journal.summary().await.unwrap()),
        Some(("c".into(), 1)),
        "processing rows are not eligible; ties broken by stream"
    );
    dead_letter(&f.journal, &lease, seq(1), "x").await.unwrap();
    f.journal.complete(&c, seq(1)).await.unwrap();
    assert_eq!(
        oldest(f.journal.summary().await.unwrap()),
        Some(("d".into(), 1)),
        "dead rows are not eligible"
    );
    f.journal
        .fail(&lease, seq(2), "x", &RetryPolicy::default())
        .await
        .unwrap();
    assert_eq!(
        oldest(f.journal.summary().await.unwrap()),
        Some(("d".into(), 1)),
        "a failed row due later does not beat an earlier pending one"
    );
    f.journal.complete(&d, seq(1)).await.unwrap();
    assert_eq!(
        oldest(f.journal.summary().await.unwrap()),
        Some(("z".into(), 2)),
        "failed rows are eligible"
    );
}

/// `list`: up to `limit` rows, optionally of one status, ordered by
/// (`next_attempt_at`, stream, seq).
pub async fn list_filters_orders_and_limits<H: Harness>(h: &H) {
    let f = h.open().await;
    let key = |rs: Vec<OutboxRow>| {
        rs.iter()
            .map(|r| (r.stream.to_string(), r.seq.get()))
            .collect::<Vec<_>>()
    };
    let p = |s: &str, n: u64| (s.to_string(), n);
    let b = enqueue(&f.journal, "b", 2).await;
    h.advance(&f.ctx, secs(1)).await;
    enqueue(&f.journal, "a", 2).await;
    assert_eq!(
        key(rows(&f.journal).await),
        [p("b", 1), p("b", 2), p("a", 1), p("a", 2)],
        "by time, then seq"
    );
    assert_eq!(
        key(f.journal.list(None, 3).await.unwrap()),
        [p("b", 1), p("b", 2), p("a", 1)],
        "at most `limit`"
    );
    fail_head(&f.journal, &b, "w", &RetryPolicy::default()).await;
    assert_eq!(
        key(f.journal.list(Some(OutboxStatus::Failed), 10).await.unwrap()),
        [p("b", 1)]
    );
    assert_eq!(
        key(f.journal.list(Some(OutboxStatus::Pending), 10).await.unwrap()),
        [p("b", 2), p("a", 1), p("a", 2)],
        "only pending rows, in order"
    );
    assert_eq!(
        key(f.journal.list(Some(OutboxStatus::Pending), 1).await.unwrap()),
        [p("b", 2)]
    );
    assert!(
        f.journal
            .list(Some(OutboxStatus::Dead), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        key(rows(&f.journal).await),
        [p("b", 2), p("a", 1), p("a", 2), p("b", 1)],
        "the failed row moved behind by its next_attempt_at"
    );
}

/// `row`: one row, `None` when there is no such row.
pub async fn row_returns_none_when_missing<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 1).await;
    let r = row(&f.journal, &s, 1).await;
    assert_eq!(
        (r.stream.clone(), r.seq.get(), r.event_type.as_str()),
        (s.clone(), 1, crate::oracle::ORACLE_EVENT)
    );
    assert_eq!(f.journal.row(&s, seq(2)).await.unwrap(), None);
    assert_eq!(f.journal.row(&sid("nope"), seq(1)).await.unwrap(), None);
}

/// `head` and `enqueue_catch_up`: a stream's head is its lowest row, `None`
/// without rows. A catch-up row goes only where the stream's last event has
/// none: after every row was completed (it becomes the head, pending, due,
/// fresh), or behind rows that stop short of the last event (a claim's run
/// stops at the hole before it); never twice, never for a stream without
/// events.
pub async fn enqueue_catch_up_puts_a_row_at_a_last_event_without_one<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    assert!(j.head(&sid("none")).await.unwrap().is_none());
    assert!(
        !j.enqueue_catch_up(&sid("none")).await.unwrap(),
        "no events, no row"
    );
    let s = enqueue(j, "s", 3).await;
    assert_eq!(j.head(&s).await.unwrap().map(|r| r.seq.get()), Some(1));
    assert!(!j.enqueue_catch_up(&s).await.unwrap(), "its last event has a row");
    j.complete(&s, seq(3)).await.unwrap();
    assert!(j.head(&s).await.unwrap().is_none(), "every row completed");
    assert!(j.enqueue_catch_up(&s).await.unwrap());
    let head = j.head(&s).await.unwrap().expect("the catch-up row");
    assert_eq!(
        (
            head.seq.get(),
            head.status,
            head.attempt_count,
            head.alone,
            head.last_error
        ),
        (3, OutboxStatus::Pending, 0, false, None),
        "a fresh pending row at the last event"
    );
    assert!(is_due(j, &s).await, "due at once");
    assert!(!j.enqueue_catch_up(&s).await.unwrap(), "never twice");
    // Rows that stop short of the last event (appended without the outbox).
    let t = enqueue(j, "t", 2).await;
    j.append(
        &[req(&t, ExpectedVersion::Exact(2), adds(&[8, 9]))],
        AppendOptions::journal_only(),
    )
    .await
    .unwrap();
    assert!(j.enqueue_catch_up(&t).await.unwrap(), "the last event had no row");
    let seqs: Vec<u64> = statuses(j, &t).await.into_iter().map(|(n, _)| n).collect();
    assert_eq!(seqs, [1, 2, 4], "rows 1 and 2, and the catch-up row at 4");
    let (_, run) = take_and_claim(j, &t, "w", 10).await;
    assert_eq!(
        seqs_of(&run),
        [1, 2],
        "a run stops at the hole before the catch-up row"
    );
}
