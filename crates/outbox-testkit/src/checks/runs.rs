//! [`RunStore`] contract checks: persisted replay and rebuild runs.

use std::time::Duration;

use outbox_core::{Error, ProjectionName, RunBounds, RunEnd, RunKind, RunProgress, RunState, RunStore, Seq};

use super::support::{owner, secs};
use crate::{Harness, sid};

const TTL: Duration = Duration::from_secs(60);

fn proj(name: &str) -> ProjectionName {
    ProjectionName::new(name).expect("valid projection name")
}

/// `admit_run`: a new queued run with the given fields; ids increase.
pub async fn runs_admit_records_a_queued_run<H: Harness>(h: &H) {
    let f = h.open().await;
    let a = f
        .projections
        .admit_run(RunKind::Rebuild, &proj("p"), None, &owner("w1"), TTL)
        .await
        .unwrap();
    assert_eq!(
        (a.kind, a.state, a.processed, a.until),
        (RunKind::Rebuild, RunState::Queued, 0, None)
    );
    assert_eq!((a.projection.as_str(), a.owner.as_str()), ("p", "w1"));
    assert!(!a.cancel_requested && a.error_code.is_none() && a.last_seq.is_none());
    assert!(
        a.lease_expires_at > a.created_at,
        "the claim expires after admission"
    );
    let b = f
        .projections
        .admit_run(RunKind::CatchUp, &proj("q"), Some(42), &owner("w1"), TTL)
        .await
        .unwrap();
    assert!(b.id > a.id, "ids increase");
    assert_eq!(b.until, Some(42));
}

/// `admit_run`: refused while the projection has an active run with a live
/// claim; nothing changes; other projections are unaffected.
pub async fn runs_one_active_run_per_projection<H: Harness>(h: &H) {
    let f = h.open().await;
    let first = f
        .projections
        .admit_run(RunKind::Rebuild, &proj("p"), None, &owner("w1"), TTL)
        .await
        .unwrap();
    let err = f
        .projections
        .admit_run(RunKind::CatchUp, &proj("p"), None, &owner("w2"), TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidState(_)), "{err}");
    assert!(
        err.to_string().contains(&format!("run {}", first.id)),
        "names the active run: {err}"
    );
    assert_eq!(f.projections.runs(10).await.unwrap().len(), 1, "nothing admitted");
    // Running (not only queued) also blocks.
    f.projections
        .update_run(first.id, &owner("w1"), 0, None, TTL)
        .await
        .unwrap();
    assert!(
        f.projections
            .admit_run(RunKind::Rebuild, &proj("p"), None, &owner("w2"), TTL)
            .await
            .is_err()
    );
    f.projections
        .admit_run(RunKind::Rebuild, &proj("other"), None, &owner("w2"), TTL)
        .await
        .unwrap();
    // Finished runs do not block.
    f.projections
        .finish_run(first.id, &owner("w1"), RunEnd::Completed)
        .await
        .unwrap();
    f.projections
        .admit_run(RunKind::Rebuild, &proj("p"), None, &owner("w2"), TTL)
        .await
        .unwrap();
}

/// `admit_run`: an active run whose claim expired is marked failed
/// (`abandoned`) and no longer blocks.
pub async fn runs_expired_claim_is_abandoned<H: Harness>(h: &H) {
    let f = h.open().await;
    let stale = f
        .projections
        .admit_run(RunKind::Rebuild, &proj("p"), None, &owner("dead"), secs(5))
        .await
        .unwrap();
    h.advance(&f.ctx, secs(6)).await;
    let fresh = f
        .projections
        .admit_run(RunKind::Rebuild, &proj("p"), None, &owner("w2"), TTL)
        .await
        .unwrap();
    assert_eq!(fresh.state, RunState::Queued);
    let old = f.projections.run(stale.id).await.unwrap().expect("still listed");
    assert_eq!(
        (old.state, old.error_code.as_deref()),
        (RunState::Failed, Some("abandoned"))
    );
}

/// `reclaim_run`: the projection's active run is marked failed
/// (`abandoned`) when its owner is not among the live workers and it has
/// been idle long enough, before its claim expires, and the projection
/// admits a new run; a live owner's run, a recently updated run and a
/// projection without an active run are left alone.
pub async fn runs_a_gone_owners_run_is_reclaimed<H: Harness>(h: &H) {
    let f = h.open().await;
    let runs = &f.projections;
    assert_eq!(
        runs.reclaim_run(&proj("p"), &[], secs(5)).await.unwrap(),
        None,
        "no active run"
    );
    let killed = runs
        .admit_run(RunKind::Rebuild, &proj("p"), None, &owner("killed"), TTL)
        .await
        .unwrap();
    runs.update_run(killed.id, &owner("killed"), 3, None, TTL)
        .await
        .unwrap();
    let live = [owner("killed"), owner("w2")];
    h.advance(&f.ctx, secs(6)).await;
    assert_eq!(
        runs.reclaim_run(&proj("p"), &live, secs(5)).await.unwrap(),
        None,
        "a live owner's run stays"
    );
    assert_eq!(
        runs.run(killed.id).await.unwrap().unwrap().state,
        RunState::Running
    );
    assert_eq!(
        runs.reclaim_run(&proj("p"), &[owner("w2")], secs(10))
            .await
            .unwrap(),
        None,
        "a run updated less than `idle` ago stays"
    );
    let gone = runs
        .reclaim_run(&proj("p"), &[owner("w2")], secs(5))
        .await
        .unwrap()
        .expect("the run of a gone owner is reclaimed");
    assert_eq!(
        (gone.id, gone.state, gone.error_code.as_deref(), gone.processed),
        (killed.id, RunState::Failed, Some("abandoned"), 3)
    );
    assert_eq!(runs.run(killed.id).await.unwrap().unwrap(), gone, "as returned");
    let next = runs
        .admit_run(RunKind::Rebuild, &proj("p"), None, &owner("w2"), TTL)
        .await
        .expect("the projection is free");
    assert_eq!(next.state, RunState::Queued);
    // The old owner cannot touch its reclaimed run.
    let err = runs
        .update_run(killed.id, &owner("killed"), 4, None, TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidState(_)), "{err}");
}

/// `admit_run`: refused admissions consume no id: after any number of
/// refusals, the next admitted run's id is the previous one plus one.
pub async fn runs_refused_admissions_consume_no_ids<H: Harness>(h: &H) {
    let f = h.open().await;
    let runs = &f.projections;
    let first = runs
        .admit_run(RunKind::Rebuild, &proj("p"), None, &owner("w1"), TTL)
        .await
        .unwrap();
    for _ in 0..5 {
        runs.admit_run(RunKind::CatchUp, &proj("p"), None, &owner("w2"), TTL)
            .await
            .unwrap_err();
    }
    let other = runs
        .admit_run(RunKind::Rebuild, &proj("q"), None, &owner("w2"), TTL)
        .await
        .unwrap();
    assert_eq!(other.id, first.id + 1, "five refusals consumed no id");
    runs.finish_run(first.id, &owner("w1"), RunEnd::Completed)
        .await
        .unwrap();
    let again = runs
        .admit_run(RunKind::Rebuild, &proj("p"), None, &owner("w2"), TTL)
        .await
        .unwrap();
    assert_eq!(again.id, other.id + 1);
    // Concurrent admissions of one projection: one wins, the rest are
    // refused without consuming ids either.
    let c = proj("c");
    let ws = [owner("c1"), owner("c2"), owner("c3"), owner("c4")];
    let admit = |w| runs.admit_run(RunKind::CatchUp, &c, None, w, TTL);
    let (a, b, c, d) = tokio::join!(admit(&ws[0]), admit(&ws[1]), admit(&ws[2]), admit(&ws[3]));
    let won: Vec<_> = [a, b, c, d].into_iter().filter_map(Result::ok).collect();
    assert_eq!(won.len(), 1, "exactly one concurrent admission wins");
    assert_eq!(won[0].id, again.id + 1);
    let last = runs
        .admit_run(RunKind::Rebuild, &proj("z"), None, &owner("w2"), TTL)
        .await
        .unwrap();
    assert_eq!(last.id, won[0].id + 1, "the concurrent losers consumed no id");
}

/// `update_run`: queued -> running, progress and last event recorded, claim
/// renewed; only the owner of an active run may update it.
pub async fn runs_update_records_progress_for_the_owner_only<H: Harness>(h: &H) {
    let f = h.open().await;
    let r = f
        .projections
        .admit_run(RunKind::CatchUp, &proj("p"), None, &owner("w1"), secs(5))
        .await
        .unwrap();
    h.advance(&f.ctx, secs(3)).await;
    let s = sid("s");
    let u = f
        .projections
        .update_run(r.id, &owner("w1"), 7, Some((&s, Seq::new(4).unwrap())), secs(5))
        .await
        .unwrap();
    assert_eq!((u.state, u.processed), (RunState::Running, 7));
    assert_eq!(
        (u.last_stream.as_ref(), u.last_seq.map(Seq::get)),
        (Some(&s), Some(4))
    );
    assert!(u.lease_expires_at > r.lease_expires_at, "claim renewed");
    let kept = f
        .projections
        .update_run(r.id, &owner("w1"), 9, None, secs(5))
        .await
        .unwrap();
    assert_eq!(
        (kept.processed, kept.last_seq.map(Seq::get)),
        (9, Some(4)),
        "no last event keeps the previous one"
    );
    let err = f
        .projections
        .update_run(r.id, &owner("intruder"), 1, None, secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidState(_)), "{err}");
    f.projections
        .finish_run(r.id, &owner("w1"), RunEnd::Completed)
        .await
        .unwrap();
    assert!(matches!(
        f.projections
            .update_run(r.id, &owner("w1"), 1, None, secs(5))
            .await,
        Err(Error::InvalidState(_))
    ));
}

/// `finish_run`: terminal state with the failure's code and message; a
/// finished run cannot be finished again.
pub async fn runs_finish_records_the_outcome<H: Harness>(h: &H) {
    let f = h.open().await;
    let w = owner("w1");
    for (i, end) in [
        RunEnd::Completed,
        RunEnd::Cancelled,
        RunEnd::Failed {
            code: "apply".into(),
            message: "projection failed on s/3".into(),
        },
    ]
    .into_iter()
    .enumerate()
    {
        let r = f
            .projections
            .admit_run(RunKind::Rebuild, &proj(&format!("p{i}")), None, &w, TTL)
            .await
            .unwrap();
        let want = end.state();
        let done = f.projections.finish_run(r.id, &w, end.clone()).await.unwrap();
        assert_eq!(done.state, want);
        if let RunEnd::Failed { code, message } = end {
            assert_eq!((done.error_code, done.error_message), (Some(code), Some(message)));
        }
        assert!(matches!(
            f.projections.finish_run(r.id, &w, RunEnd::Completed).await,
            Err(Error::InvalidState(_))
        ));
        assert!(matches!(
            f.projections.finish_run(r.id + 1000, &w, RunEnd::Completed).await,
            Err(Error::NotFound(_) | Error::InvalidState(_))
        ));
    }
}

/// `finish_run`: a failure message that holds a NUL (text taken from a
/// payload) is still recorded, the NUL replaced by U+FFFD.
pub async fn runs_finish_records_a_message_with_nul<H: Harness>(h: &H) {
    let f = h.open().await;
    let w = owner("w1");
    let r = f
        .projections
        .admit_run(RunKind::CatchUp, &proj("p"), None, &w, TTL)
        .await
        .unwrap();
    let end = RunEnd::Failed {
        code: "apply".into(),
        message: "bad payload a\0b".into(),
    };
    let done = f.projections.finish_run(r.id, &w, end).await.expect("finish");
    assert_eq!(done.state, RunState::Failed);
    assert_eq!(done.error_message.as_deref(), Some("bad payload a\u{fffd}b"));
    let stored = f.projections.run(r.id).await.unwrap().expect("run");
    assert_eq!(stored.error_message, done.error_message, "stored as returned");
}

/// `cancel_run`: queued runs are cancelled at once, running ones get the
/// flag; finished runs are `InvalidState`, unknown ids `NotFound`.
pub async fn runs_cancel_semantics<H: Harness>(h: &H) {
    let f = h.open().await;
    let w = owner("w1");
    let queued = f
        .projections
        .admit_run(RunKind::Rebuild, &proj("a"), None, &w, TTL)
        .await
        .unwrap();
    let c = f.projections.cancel_run(queued.id).await.unwrap();
    assert_eq!((c.state, c.id), (RunState::Cancelled, queued.id));
    let running = f
        .projections
        .admit_run(RunKind::Rebuild, &proj("b"), None, &w, TTL)
        .await
        .unwrap();
    f.projections
        .update_run(running.id, &w, 0, None, TTL)
        .await
        .unwrap();
    let c = f.projections.cancel_run(running.id).await.unwrap();
    assert_eq!((c.state, c.cancel_requested), (RunState::Running, true));
    let seen = f
        .projections
        .update_run(running.id, &w, 1, None, TTL)
        .await
        .unwrap();
    assert!(
        seen.cancel_requested,
        "the owner sees the request on its next update"
    );
    assert!(matches!(
        f.projections.cancel_run(queued.id).await,
        Err(Error::InvalidState(_))
    ));
    assert!(matches!(
        f.projections.cancel_run(999_999).await,
        Err(Error::NotFound(_))
    ));
}

/// `run` / `runs`: one by id, `None` when unknown; newest first with a limit;
/// a ttl out of range is rejected.
pub async fn runs_listing_and_validation<H: Harness>(h: &H) {
    let f = h.open().await;
    let w = owner("w1");
    let mut ids = Vec::new();
    for i in 0..5 {
        let r = f
            .projections
            .admit_run(RunKind::CatchUp, &proj(&format!("p{i}")), None, &w, TTL)
            .await
            .unwrap();
        ids.push(r.id);
    }
    let listed: Vec<u64> = f
        .projections
        .runs(3)
        .await
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    let want: Vec<u64> = ids.iter().rev().take(3).copied().collect();
    assert_eq!(listed, want, "newest first, limited");
    assert_eq!(
        f.projections
            .run(ids[0])
            .await
            .unwrap()
            .unwrap()
            .projection
            .as_str(),
        "p0"
    );
    assert!(f.projections.run(ids[4] + 100).await.unwrap().is_none());
    let bad = f
        .projections
        .admit_run(RunKind::CatchUp, &proj("z"), None, &w, Duration::ZERO)
        .await;
    assert!(matches!(bad, Err(Error::InvalidInput(_))));
}

/// `prune_runs`: deletes the finished runs (every terminal state) last
/// updated `older_than` or more ago by the store's clock and returns how
/// many; recently finished and active runs stay (an active run whose claim
/// expired too); ids keep increasing after the newest run was pruned.
pub async fn runs_prune_deletes_only_long_finished<H: Harness>(h: &H) {
    let f = h.open().await;
    let p = &f.projections;
    let w = owner("w1");
    let mut old = Vec::new();
    for (i, end) in [
        RunEnd::Completed,
        RunEnd::Cancelled,
        RunEnd::Failed {
            code: "apply".into(),
            message: "boom".into(),
        },
    ]
    .into_iter()
    .enumerate()
    {
        let r = p
            .admit_run(RunKind::Rebuild, &proj(&format!("old{i}")), None, &w, TTL)
            .await
            .unwrap();
        p.finish_run(r.id, &w, end).await.unwrap();
        old.push(r.id);
    }
    let active = p
        .admit_run(RunKind::CatchUp, &proj("active"), None, &w, secs(5))
        .await
        .unwrap();
    assert_eq!(
        p.prune_runs(secs(100)).await.unwrap(),
        0,
        "nothing finished 100 s ago"
    );
    h.advance(&f.ctx, secs(150)).await;
    let recent = p
        .admit_run(RunKind::Rebuild, &proj("recent"), None, &w, TTL)
        .await
        .unwrap();
    p.finish_run(recent.id, &w, RunEnd::Completed).await.unwrap();
    assert_eq!(
        p.prune_runs(secs(100)).await.unwrap(),
        3,
        "the three runs finished 150 s ago, in every terminal state"
    );
    for id in old {
        assert!(p.run(id).await.unwrap().is_none(), "run {id} was pruned");
    }
    let kept = p
        .run(active.id)
        .await
        .unwrap()
        .expect("an active run is never pruned");
    assert!(kept.state.is_active(), "still active though its claim expired");
    assert!(
        p.run(recent.id).await.unwrap().is_some(),
        "finished recently: kept"
    );
    assert_eq!(
        p.prune_runs(secs(100)).await.unwrap(),
        0,
        "pruning again finds nothing"
    );
    h.advance(&f.ctx, secs(150)).await;
    assert_eq!(
        p.prune_runs(Duration::ZERO).await.unwrap(),
        1,
        "the recent run, now old"
    );
    let next = p
        .admit_run(RunKind::Rebuild, &proj("next"), None, &w, TTL)
        .await
        .unwrap();
    assert!(
        next.id > recent.id,
        "ids keep increasing after a prune: {} after {}",
        next.id,
        recent.id
    );
}

/// `admit_bounded_run`: `since` and `until` recorded, no position yet; a
/// rebuild with `since` and an empty range (`since >= until`) are
/// `InvalidInput` and write nothing.
pub async fn runs_bounded_admission_records_since_and_refuses_bad_bounds<H: Harness>(h: &H) {
    let f = h.open().await;
    let bounds = |since, until| RunBounds::new().with_since(since).with_until(until);
    for (kind, b) in [
        (RunKind::Rebuild, bounds(Some(3), None)),
        (RunKind::CatchUp, bounds(Some(9), Some(9))),
        (RunKind::CatchUp, bounds(Some(10), Some(9))),
    ] {
        let r = f
            .projections
            .admit_bounded_run(kind, &proj("p"), b, &owner("w1"), TTL)
            .await;
        assert!(matches!(r, Err(Error::InvalidInput(_))), "{kind} {b:?}: {r:?}");
    }
    assert!(
        f.projections.runs(10).await.unwrap().is_empty(),
        "refused bounds write nothing"
    );
    let r = f
        .projections
        .admit_bounded_run(
            RunKind::CatchUp,
            &proj("p"),
            bounds(Some(3), Some(9)),
            &owner("w1"),
            TTL,
        )
        .await
        .unwrap();
    assert_eq!(
        (r.kind, r.state, r.since, r.until, r.position),
        (RunKind::CatchUp, RunState::Queued, Some(3), Some(9), None)
    );
    assert_eq!(
        f.projections.run(r.id).await.unwrap(),
        Some(r.clone()),
        "read back"
    );
    let plain = f
        .projections
        .admit_run(RunKind::Rebuild, &proj("q"), None, &owner("w1"), TTL)
        .await
        .unwrap();
    assert_eq!((plain.since, plain.until, plain.position), (None, None, None));
}

/// `record_progress`: records the global position committed through,
/// keeps it when none is given (and through `update_run`), and the finished
/// record keeps it.
pub async fn runs_progress_records_the_cursor_position<H: Harness>(h: &H) {
    let f = h.open().await;
    let r = f
        .projections
        .admit_bounded_run(
            RunKind::CatchUp,
            &proj("p"),
            RunBounds::new().with_since(Some(2)),
            &owner("w1"),
            TTL,
        )
        .await
        .unwrap();
    let s = sid("s");
    let progress = |processed, position| RunProgress {
        processed,
        last: Some((&s, Seq::new(processed).unwrap())),
        position,
    };
    let a = f
        .projections
        .record_progress(r.id, &owner("w1"), progress(3, Some(5)), TTL)
        .await
        .unwrap();
    assert_eq!(
        (a.state, a.processed, a.position, a.since),
        (RunState::Running, 3, Some(5), Some(2))
    );
    let kept = f
        .projections
        .record_progress(r.id, &owner("w1"), progress(4, None), TTL)
        .await
        .unwrap();
    assert_eq!(
        (kept.processed, kept.position),
        (4, Some(5)),
        "no position keeps the previous one"
    );
    let kept = f
        .projections
        .update_run(r.id, &owner("w1"), 5, None, TTL)
        .await
        .unwrap();
    assert_eq!(
        (kept.processed, kept.position),
        (5, Some(5)),
        "update_run keeps it too"
    );
    let moved = f
        .projections
        .record_progress(r.id, &owner("w1"), progress(6, Some(12)), TTL)
        .await
        .unwrap();
    assert_eq!(moved.position, Some(12));
    let err = f
        .projections
        .record_progress(r.id, &owner("intruder"), progress(7, Some(20)), TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidState(_)), "{err}");
    let done = f
        .projections
        .finish_run(r.id, &owner("w1"), RunEnd::Cancelled)
        .await
        .unwrap();
    assert_eq!((done.state, done.position), (RunState::Cancelled, Some(12)));
    assert_eq!(
        f.projections.run(r.id).await.unwrap().and_then(|r| r.position),
        Some(12),
        "read back"
    );
}
