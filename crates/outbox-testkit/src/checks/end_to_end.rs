//! End-to-end checks over every port together: a small sequential worker,
//! poison events and requeue, zombies, crashes and concurrent appliers.

use std::collections::BTreeMap;
use std::sync::Arc;

use outbox_core::{
    AppendOptions, ApplyOutcome, DeadLetters, Error, EventJournal, ExpectedVersion, LeaseStore,
    OutboxInspector, OutboxQueue, OutboxStatus, ProjectionStore, RetryPolicy, WatermarkStore,
};

use super::support::{
    TTL, adds, all_events, apply_ok, drain, drain_with, expect_sums, is_due, ms, oracle, req, row, secs, seq,
    seqs_of, state, take_and_claim,
};
use crate::{Harness, add, audit, check_history, one, sid};

/// A sequential drain loop (due_streams, acquire, claim, load, apply,
/// complete, release) over interleaved multi-stream batches applies every
/// event exactly once, in order: `check_history` is Ok, the outbox is empty,
/// and checkpoints and watermarks equal the stream heads.
pub async fn drain_loop_applies_every_event_exactly_once<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let projs = one(p.clone());
    let (a, b, c, d) = (sid("a"), sid("b"), sid("c"), sid("d"));
    let any = ExpectedVersion::Any;
    let o = AppendOptions::enqueue();
    f.journal
        .append(&[req(&a, any, adds(&[1, 2])), req(&b, any, adds(&[10]))], o)
        .await
        .unwrap();
    f.journal
        .append(
            &[
                req(&c, any, vec![audit(), add(5)]),
                req(&a, any, vec![audit(), add(3)]),
            ],
            o,
        )
        .await
        .unwrap();
    let drained = drain(&f, &projs, "w1", &RetryPolicy::default()).await;
    assert!(drained.applied_runs >= 3 && drained.failures == 0, "{drained:?}");
    f.journal
        .append(&[req(&b, any, adds(&[20, 30])), req(&d, any, adds(&[-7]))], o)
        .await
        .unwrap();
    f.journal.append(&[req(&c, any, adds(&[6]))], o).await.unwrap();
    drain(&f, &projs, "w2", &RetryPolicy::default()).await;
    let want = expect_sums(&[(&a, 4, 6), (&b, 3, 60), (&c, 3, 11), (&d, 1, -7)]);
    let skipped = BTreeMap::from([("a".to_string(), vec![3]), ("c".to_string(), vec![1])]);
    if let Err(problems) = check_history(&state(h, &f, "p").await, &want, &skipped) {
        panic!("history check failed:\n{problems}");
    }
    assert_eq!(
        f.journal.summary().await.unwrap().total(),
        0,
        "every row completed"
    );
    for head in f.journal.stream_versions(None, 100).await.unwrap() {
        let cp = f.projections.checkpoint(p.name(), &head.stream).await.unwrap();
        assert_eq!(cp, head.version, "{}: checkpoint equals the head", head.stream);
        let wm = f
            .projections
            .watermark(&head.stream)
            .await
            .unwrap()
            .map(|w| w.applied_through);
        assert_eq!(
            wm,
            Some(head.version),
            "{}: watermark equals the head",
            head.stream
        );
    }
}

/// A poison event fails exactly `dead_letter_after` times, then is dead and
/// blocks only its stream (events appended behind it wait); after the fix a
/// requeue applies it and the rest exactly once.
pub async fn poison_event_dead_letters_then_requeue_applies_once<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, faults) = oracle(h, &f, "p").await;
    let projs = one(p.clone());
    // A retry delay far longer than any test run, so a slow machine cannot
    // make a failed row due again inside one drain (only `advance` does).
    let policy = RetryPolicy::new(secs(3_600), secs(3_600), 3).unwrap();
    let s = sid("s");
    let t = sid("t");
    f.journal
        .append(
            &[
                req(&s, ExpectedVersion::Any, adds(&[1, 2, 3])),
                req(&t, ExpectedVersion::Any, adds(&[4])),
            ],
            AppendOptions::enqueue(),
        )
        .await
        .unwrap();
    faults.fail(&s, 2, u32::MAX);
    let mut failures = 0;
    for round in 0..3 {
        failures += drain(&f, &projs, "w", &policy).await.failures;
        assert_eq!(failures, round + 1, "one failure per round");
        h.advance(&f.ctx, secs(3_600)).await;
    }
    let dead = row(&f.journal, &s, 2).await;
    assert_eq!(
        (dead.status, dead.attempt_count),
        (OutboxStatus::Dead, 3),
        "dead after exactly 3 failures"
    );
    assert_eq!(
        row(&f.journal, &s, 3).await.status,
        OutboxStatus::Pending,
        "the row behind waits"
    );
    super::support::append(&f.journal, &s, adds(&[100])).await;
    super::support::append(&f.journal, &t, adds(&[5])).await;
    h.advance(&f.ctx, secs(7_200)).await;
    assert_eq!(
        drain(&f, &projs, "w", &policy).await.failures,
        0,
        "the dead head is never retried"
    );
    assert!(!is_due(&f.journal, &s).await);
    let st = state(h, &f, "p").await;
    assert_eq!(st.streams["s"].seqs, [1], "s stops before the poison event");
    assert_eq!(st.streams["t"].seqs, [1, 2], "t keeps flowing");

    faults.clear();
    let r = f.journal.requeue(&s, seq(2)).await.expect("requeue");
    assert_eq!((r.status, r.attempt_count), (OutboxStatus::Pending, 0));
    drain(&f, &projs, "w", &policy).await;
    let want = expect_sums(&[(&s, 4, 106), (&t, 2, 9)]);
    if let Err(problems) = check_history(&state(h, &f, "p").await, &want, &BTreeMap::new()) {
        panic!("history check failed after requeue:\n{problems}");
    }
    assert_eq!(f.journal.summary().await.unwrap().total(), 0);
}

/// A requeued row that fails again goes through the policy again and is
/// parked again at the threshold (a requeue is not a free pass).
pub async fn requeued_row_that_fails_again_is_parked_again<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, faults) = oracle(h, &f, "p").await;
    let projs = one(p.clone());
    let policy = RetryPolicy::new(ms(10), ms(10), 2).unwrap();
    let s = sid("s");
    super::support::append(&f.journal, &s, adds(&[1, 2])).await;
    faults.fail(&s, 1, u32::MAX);
    for _ in 0..2 {
        drain(&f, &projs, "w", &policy).await;
        h.advance(&f.ctx, ms(10)).await;
    }
    assert_eq!(row(&f.journal, &s, 1).await.status, OutboxStatus::Dead);
    let requeued = f.journal.requeue_dead(10).await.unwrap();
    assert_eq!(seqs_of(&requeued), [1]);
    for _ in 0..2 {
        drain(&f, &projs, "w", &policy).await;
        h.advance(&f.ctx, ms(10)).await;
    }
    let r = row(&f.journal, &s, 1).await;
    assert_eq!(
        (r.status, r.attempt_count),
        (OutboxStatus::Dead, 2),
        "parked again after 2 new failures"
    );
    assert!(
        state(h, &f, "p")
            .await
            .streams
            .get("s")
            .is_none_or(|st| st.seqs.is_empty()),
        "nothing applied"
    );
}

/// A zombie worker (paused past its lease while a new owner finished the
/// work) cannot do harm: its apply is all duplicates, its complete deletes
/// nothing that matters, its fail and claim are `LeaseLost`.
pub async fn zombie_worker_commit_is_harmless<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let projs = one(p.clone());
    let s = sid("s");
    super::support::append(&f.journal, &s, adds(&[1, 2])).await;
    let (zombie, claimed) = take_and_claim(&f.journal, &s, "zombie", 10).await;
    assert_eq!(seqs_of(&claimed), [1, 2]);
    let events = all_events(&f.journal, &s).await;
    h.advance(&f.ctx, TTL + secs(1)).await;
    drain(&f, &projs, "fresh", &RetryPolicy::default()).await;
    super::support::append(&f.journal, &s, adds(&[3])).await;

    let late = apply_ok(&f.projections, &s, &events, &projs).await;
    assert_eq!(
        (late.applied, late.duplicates),
        (0, 2),
        "the zombie's apply is all duplicates"
    );
    assert_eq!(
        f.journal.complete(&s, seq(2)).await.unwrap(),
        0,
        "already completed"
    );
    let r = f
        .journal
        .fail(&zombie, seq(3), "late", &RetryPolicy::default())
        .await;
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "zombie fail: {r:?}");
    let r = f.journal.claim(&zombie, 10).await;
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "zombie claim: {r:?}");
    assert!(
        !f.journal.release(&zombie).await.unwrap(),
        "zombie release frees nothing"
    );
    drain(&f, &projs, "fresh", &RetryPolicy::default()).await;
    if let Err(problems) = check_history(
        &state(h, &f, "p").await,
        &expect_sums(&[(&s, 3, 6)]),
        &BTreeMap::new(),
    ) {
        panic!("history check failed:\n{problems}");
    }
}

/// A worker that crashes after its apply committed and before it completed
/// the rows: once its lease expires the rows are due again, the next worker's
/// apply skips them as duplicates and completes them; nothing is applied twice.
pub async fn crash_between_apply_and_complete_is_recovered<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let projs = one(p.clone());
    let s = sid("s");
    super::support::append(&f.journal, &s, adds(&[1, 2, 3])).await;
    let (_crashed, claimed) = take_and_claim(&f.journal, &s, "crashed", 10).await;
    let events = all_events(&f.journal, &s).await;
    assert_eq!(seqs_of(&claimed), [1, 2, 3]);
    apply_ok(&f.projections, &s, &events, &projs).await;
    assert!(!is_due(&f.journal, &s).await, "leased rows are not due");
    h.advance(&f.ctx, TTL + secs(1)).await;
    assert!(
        is_due(&f.journal, &s).await,
        "due again after the crashed worker's lease expired"
    );
    drain(&f, &projs, "next", &RetryPolicy::default()).await;
    assert_eq!(f.journal.summary().await.unwrap().total(), 0, "rows completed");
    let st = state(h, &f, "p").await;
    assert_eq!(st.ledger.len(), 3, "one ledger row per event: {:?}", st.ledger);
    if let Err(problems) = check_history(&st, &expect_sums(&[(&s, 3, 6)]), &BTreeMap::new()) {
        panic!("history check failed:\n{problems}");
    }
}

/// Concurrent applies of the same run from two projection-store instances on
/// one database commit each event exactly once (one ledger row per seq).
pub async fn concurrent_applies_commit_exactly_once<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let x = Arc::new(h.reopen_projections(&f.ctx).await);
    let y = Arc::new(h.reopen_projections(&f.ctx).await);
    let mut want = Vec::new();
    for i in 0..8 {
        let s = sid(&format!("s{i}"));
        super::support::append(&f.journal, &s, adds(&[1, 2, 3])).await;
        let events = all_events(&f.journal, &s).await;
        let (x, y, px, py) = (x.clone(), y.clone(), one(p.clone()), one(p.clone()));
        let (sx, sy, ex, ey) = (s.clone(), s.clone(), events.clone(), events);
        let tx = tokio::spawn(async move { x.apply(&sx, &ex, &px).await });
        let ty = tokio::spawn(async move { y.apply(&sy, &ey, &py).await });
        let mut applied = 0;
        for r in [tx.await.unwrap(), ty.await.unwrap()] {
            match r {
                Ok(ApplyOutcome::Applied(rep)) => {
                    assert_eq!(
                        rep.applied + rep.duplicates,
                        3,
                        "{s}: every event counted once per call"
                    );
                    applied += rep.applied;
                }
                Err(e) if e.is_temporary() && !matches!(e, Error::Apply { .. }) => {}
                other => {
                    panic!("{s}: concurrent apply should commit or report a temporary error, got {other:?}")
                }
            }
        }
        assert_eq!(applied, 3, "{s}: the two calls together applied each event once");
        want.push((s, 3u64, 6i64));
    }
    let want: Vec<_> = want.iter().map(|(s, n, v)| (s, *n, *v)).collect();
    if let Err(problems) = check_history(&state(h, &f, "p").await, &expect_sums(&want), &BTreeMap::new()) {
        panic!("history check failed:\n{problems}");
    }
}

/// Two workers draining the same outbox at once through two journal and two
/// projection instances apply every event exactly once.
pub async fn two_concurrent_workers_apply_exactly_once<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let mut want = Vec::new();
    for i in 0..6 {
        let s = sid(&format!("s{i}"));
        super::support::append(&f.journal, &s, adds(&[1, 2])).await;
        super::support::append(&f.journal, &s, adds(&[3])).await;
        want.push(s);
    }
    let mut tasks = Vec::new();
    for w in ["w1", "w2"] {
        let j = h.reopen_journal(&f.ctx).await;
        let ps = h.reopen_projections(&f.ctx).await;
        let projs = one(p.clone());
        tasks.push(tokio::spawn(async move {
            drain_with(&j, &ps, &projs, w, &RetryPolicy::default()).await
        }));
    }
    for t in tasks {
        t.await.expect("worker task");
    }
    let want: Vec<_> = want.iter().map(|s| (s, 3u64, 6i64)).collect();
    if let Err(problems) = check_history(&state(h, &f, "p").await, &expect_sums(&want), &BTreeMap::new()) {
        panic!("history check failed:\n{problems}");
    }
    assert_eq!(f.journal.summary().await.unwrap().total(), 0);
}

/// Every path converges: the worker's incremental applies and a rebuild
/// (reset, then one replay of the whole journal) give the same digest.
pub async fn worker_and_rebuild_digests_match<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let projs = one(p.clone());
    for (i, name) in ["x", "y", "x", "z", "y", "x"].iter().enumerate() {
        super::support::append(
            &f.journal,
            &sid(name),
            vec![add(i as i64), audit(), add(-(i as i64) * 3)],
        )
        .await;
        if i % 2 == 1 {
            drain(&f, &projs, "w", &RetryPolicy::default()).await;
        }
    }
    let worker = f.projections.digest(&*p).await.unwrap();
    f.projections.reset(&*p).await.unwrap();
    for head in f.journal.stream_versions(None, 100).await.unwrap() {
        let evs = all_events(&f.journal, &head.stream).await;
        apply_ok(&f.projections, &head.stream, &evs, &projs).await;
    }
    assert_eq!(
        f.projections.digest(&*p).await.unwrap(),
        worker,
        "rebuild converges with the worker"
    );
}
