//! Operator administration contract checks: [`DeadLetters::retry`],
//! [`OutboxInspector::leases`] and [`LeaseAdmin::break_lease`].

use outbox_core::OutboxQueueExt as _;
use outbox_core::{
    DeadLetters, Error, LeaseAdmin, LeaseStore, OutboxInspector, OutboxQueue, OutboxStatus, RetryPolicy, Seq,
};

use super::support::{
    TTL, enqueue, fail_head, is_due, kill_head, now, row, rows, secs, seq, seqs_of, take, take_and_claim,
};
use crate::{Harness, sid};

/// A policy whose first retry is far away (ten minutes).
fn slow_retry() -> RetryPolicy {
    RetryPolicy::new(secs(600), secs(600), 5).expect("valid policy")
}

/// `retry`: a `failed` row becomes `pending` and due now by the store's
/// clock, attempts and error kept; the returned row is the stored one and
/// its stream is due at once.
pub async fn retry_makes_failed_row_due_now<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let failed = fail_head(&f.journal, &s, "w", &slow_retry()).await;
    assert_eq!((failed.status, failed.attempt_count), (OutboxStatus::Failed, 1));
    assert!(!is_due(&f.journal, &s).await, "a failed head waits for its delay");
    let before = now(&f.journal).await;
    let r = f.journal.retry(&s, seq(1)).await.expect("retry");
    let after = now(&f.journal).await;
    assert_eq!(r.status, OutboxStatus::Pending, "a retried row is pending");
    assert_eq!(r.attempt_count, 1, "retry keeps the attempt count");
    assert_eq!(
        r.last_error.as_deref(),
        Some("boom"),
        "retry keeps the last error"
    );
    assert!(
        before <= r.next_attempt_at && r.next_attempt_at <= after,
        "due now: {} not in [{before}, {after}]",
        r.next_attempt_at
    );
    assert_eq!(
        row(&f.journal, &s, 1).await,
        r,
        "the returned row is the stored row"
    );
    assert!(is_due(&f.journal, &s).await, "the stream is due at once");
    let (_, claimed) = take_and_claim(&f.journal, &s, "w", 10).await;
    assert_eq!(
        claimed.len(),
        2,
        "the retried head and the row behind it are claimable"
    );
}

/// `retry`: a `pending` row already due keeps its earlier due time (and
/// stays pending, attempts kept).
pub async fn retry_of_pending_row_keeps_an_earlier_due_time<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 1).await;
    let pending = row(&f.journal, &s, 1).await;
    h.advance(&f.ctx, secs(10)).await;
    let r = f.journal.retry(&s, seq(1)).await.expect("retry");
    assert_eq!(r.status, OutboxStatus::Pending);
    assert_eq!(r.attempt_count, 0);
    assert_eq!(
        r.next_attempt_at, pending.next_attempt_at,
        "an already due row keeps its due time"
    );
    assert!(is_due(&f.journal, &s).await, "the stream stays due");
}

/// `retry`: a `dead` row (pointing at `requeue`) and a `processing` row are
/// `InvalidState`, and nothing changes.
pub async fn retry_of_dead_or_processing_row_is_invalid_state<H: Harness>(h: &H) {
    let f = h.open().await;
    let dead = enqueue(&f.journal, "dead", 1).await;
    kill_head(&f.journal, &dead, "w").await;
    let busy = enqueue(&f.journal, "busy", 1).await;
    let (lease, claimed) = take_and_claim(&f.journal, &busy, "w", 1).await;
    assert_eq!(claimed.len(), 1);
    let before = rows(&f.journal).await;
    let r = f.journal.retry(&dead, seq(1)).await;
    match &r {
        Err(Error::InvalidState(m)) => assert!(m.contains("requeue"), "a dead row points at requeue: {m}"),
        other => panic!("retry of a dead row: {other:?}"),
    }
    let r = f.journal.retry(&busy, seq(1)).await;
    assert!(
        matches!(r, Err(Error::InvalidState(_))),
        "retry of a processing row: {r:?}"
    );
    assert_eq!(rows(&f.journal).await, before, "refused retries change nothing");
    assert_eq!(
        f.journal.lease(&busy).await.unwrap(),
        Some(lease),
        "a refused retry leaves the lease alone"
    );
}

/// `retry`: a missing row is `NotFound`.
pub async fn retry_of_missing_row_is_not_found<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 1).await;
    let r = f.journal.retry(&s, seq(2)).await;
    assert!(matches!(r, Err(Error::NotFound(_))), "missing seq: {r:?}");
    let r = f.journal.retry(&sid("nope"), Seq::FIRST).await;
    assert!(matches!(r, Err(Error::NotFound(_))), "unknown stream: {r:?}");
}

/// `leases`: held leases (expired ones included and marked, released ones
/// left out), ordered by stream, strictly after `after`, at most `limit`.
pub async fn leases_lists_held_leases_by_stream_and_pages<H: Harness>(h: &H) {
    let f = h.open().await;
    let c = take(&f.journal, &sid("c"), "w1").await;
    let a = take(&f.journal, &sid("a"), "w2").await;
    let b = take(&f.journal, &sid("b"), "w1").await;
    let released = take(&f.journal, &sid("bb"), "w3").await;
    assert!(f.journal.release(&released).await.unwrap());
    let all = f.journal.leases(None, 10).await.expect("leases");
    let listed: Vec<_> = all.iter().map(|e| (e.lease.clone(), e.expired)).collect();
    assert_eq!(
        listed,
        vec![(a.clone(), false), (b.clone(), false), (c.clone(), false)],
        "held leases by stream, released ones left out"
    );
    let first = f.journal.leases(None, 2).await.unwrap();
    assert_eq!(first.len(), 2, "at most limit");
    let rest = f.journal.leases(Some(&first[1].lease.stream), 2).await.unwrap();
    assert_eq!(
        rest.iter().map(|e| e.lease.clone()).collect::<Vec<_>>(),
        vec![c.clone()],
        "the next page starts strictly after `after`"
    );
    h.advance(&f.ctx, TTL + secs(1)).await;
    let expired = f.journal.leases(None, 10).await.unwrap();
    assert_eq!(expired.len(), 3, "expired leases are still listed");
    assert!(
        expired.iter().all(|e| e.expired),
        "and marked expired: {expired:?}"
    );
}

/// `break_lease`: frees a held lease and returns it as it was; the old
/// holder's `renew` and `claim` are `LeaseLost`, its `release` frees
/// nothing, and the next `acquire` gets epoch + 1.
pub async fn break_lease_frees_and_keeps_the_epoch<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 1).await;
    let held = take(&f.journal, &s, "a").await;
    let broken = f.journal.break_lease(&s).await.expect("break_lease");
    assert_eq!(broken, Some(held.clone()), "returns the lease as it was");
    assert_eq!(f.journal.lease(&s).await.unwrap(), None, "the lease is free");
    assert!(
        f.journal.leases(None, 10).await.unwrap().is_empty(),
        "and not listed"
    );
    let r = f.journal.renew(&held, TTL).await;
    assert!(
        matches!(r, Err(Error::LeaseLost { .. })),
        "old holder's renew: {r:?}"
    );
    let r = f.journal.claim(&held, 10).await;
    assert!(
        matches!(r, Err(Error::LeaseLost { .. })),
        "old holder's claim: {r:?}"
    );
    assert!(
        !f.journal.release(&held).await.unwrap(),
        "old holder's release frees nothing"
    );
    let next = take(&f.journal, &s, "b").await;
    assert_eq!(next.epoch, held.epoch + 1, "the next acquire gets epoch + 1");
}

/// `break_lease`: an expired lease is broken too (returned as it was).
pub async fn break_lease_of_expired_lease<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let held = take(&f.journal, &s, "a").await;
    h.advance(&f.ctx, TTL + secs(1)).await;
    assert_eq!(f.journal.break_lease(&s).await.unwrap(), Some(held.clone()));
    let again = take(&f.journal, &s, "a").await;
    assert_eq!(
        again.epoch,
        held.epoch + 1,
        "even the same owner gets a new epoch"
    );
}

/// `break_lease`: `None` and no change for a stream never leased or released.
pub async fn break_lease_of_free_stream_is_none<H: Harness>(h: &H) {
    let f = h.open().await;
    assert_eq!(
        f.journal.break_lease(&sid("never")).await.unwrap(),
        None,
        "never leased"
    );
    let s = sid("s");
    let held = take(&f.journal, &s, "a").await;
    assert!(f.journal.release(&held).await.unwrap());
    assert_eq!(f.journal.break_lease(&s).await.unwrap(), None, "released");
    assert_eq!(
        take(&f.journal, &s, "b").await.epoch,
        held.epoch + 1,
        "breaking a free lease does not move the epoch"
    );
}

/// `break_lease`: outbox rows are not touched; the old holder's processing
/// rows are due again at once, a new holder re-claims them and the old
/// holder's `fail` is `LeaseLost` and its `finish` changes nothing.
pub async fn break_lease_makes_processing_rows_due_again<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let (old, claimed) = take_and_claim(&f.journal, &s, "a", 10).await;
    assert_eq!(claimed.len(), 2);
    assert!(!is_due(&f.journal, &s).await, "a leased stream is not due");
    let before = rows(&f.journal).await;
    f.journal.break_lease(&s).await.unwrap().expect("a held lease");
    assert_eq!(rows(&f.journal).await, before, "rows are not touched");
    assert!(is_due(&f.journal, &s).await, "the processing head is due again");
    let (_, again) = take_and_claim(&f.journal, &s, "b", 10).await;
    assert_eq!(
        seqs_of(&again),
        [1],
        "the new holder re-claims the unfinished head, alone"
    );
    let r = f
        .journal
        .fail(&old, seq(1), "late", &RetryPolicy::default())
        .await;
    assert!(
        matches!(r, Err(Error::LeaseLost { .. })),
        "old holder's fail: {r:?}"
    );
    let before = f.journal.list(None, 100).await.unwrap();
    let r = f.journal.complete_and_release(&old, None, true).await;
    assert!(matches!(r, Ok(0)), "old holder's finish is no error: {r:?}");
    assert_eq!(
        f.journal.list(None, 100).await.unwrap(),
        before,
        "old holder's finish changes nothing"
    );
}
