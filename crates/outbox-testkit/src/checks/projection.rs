//! [`ProjectionStore`] contract checks: exactly-once apply, gaps, audit-only
//! events, rollback on applier failure, reset, digest and setup.

use std::sync::Arc;

use outbox_core::{ApplyOutcome, ApplyReport, Error, Event, Projection, ProjectionStore, WatermarkStore};

use super::support::{adds, all_events, applied, apply_ok, oracle, recorded, state};
use crate::{Harness, add, audit, one, sid};

/// `apply`: each new event is applied once and the checkpoint moves to the
/// run's last seq; offering the same run again skips every event as a
/// duplicate (reported in `duplicates`) and writes nothing.
pub async fn apply_is_exactly_once<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let s = sid("s");
    let evs = recorded(&f.journal, &s, adds(&[1, 10, 100])).await;
    let r = apply_ok(&f.projections, &s, &evs, &one(p.clone())).await;
    assert_eq!(
        r,
        ApplyReport {
            through: 3,
            applied: 3,
            duplicates: 0,
            audit_only: 0
        }
    );
    assert_eq!(f.projections.checkpoint(p.name(), &s).await.unwrap(), 3);
    let after_first = state(h, &f, "p").await;
    assert_eq!(after_first.streams["s"].sum, 111);
    assert_eq!(after_first.streams["s"].seqs, [1, 2, 3]);
    let r = apply_ok(&f.projections, &s, &evs, &one(p.clone())).await;
    assert_eq!(
        r,
        ApplyReport {
            through: 3,
            applied: 0,
            duplicates: 3,
            audit_only: 0
        },
        "all duplicates"
    );
    assert_eq!(
        state(h, &f, "p").await,
        after_first,
        "a duplicate run writes nothing (ledger included)"
    );
    let r = apply_ok(&f.projections, &s, &evs[1..2], &one(p.clone())).await;
    assert_eq!(
        (r.applied, r.duplicates),
        (0, 1),
        "a single old event is a duplicate too"
    );
    assert_eq!(
        f.projections.checkpoint(p.name(), &s).await.unwrap(),
        3,
        "duplicates never move the checkpoint back"
    );
}

/// `apply`: a run overlapping the checkpoint applies only its tail.
pub async fn apply_partial_overlap_applies_only_tail<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let s = sid("s");
    let evs = recorded(&f.journal, &s, adds(&[1, 2, 3, 4, 5])).await;
    apply_ok(&f.projections, &s, &evs[..2], &one(p.clone())).await;
    let r = apply_ok(&f.projections, &s, &evs, &one(p.clone())).await;
    assert_eq!(
        r,
        ApplyReport {
            through: 5,
            applied: 3,
            duplicates: 2,
            audit_only: 0
        }
    );
    assert_eq!(
        applied(h, &f, "p", &s).await,
        [1, 2, 3, 4, 5],
        "each seq applied once"
    );
    assert_eq!(state(h, &f, "p").await.streams["s"].sum, 15);
    assert_eq!(f.projections.checkpoint(p.name(), &s).await.unwrap(), 5);
}

/// `apply`: a run starting after `checkpoint + 1` is `ApplyOutcome::Gap`
/// naming the checkpoint and the offered seq, and writes nothing (no
/// projection row, no checkpoint, no watermark).
pub async fn apply_gap_writes_nothing<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let s = sid("s");
    let evs = recorded(&f.journal, &s, adds(&[1, 2, 3, 4])).await;
    match f.projections.apply(&s, &evs[2..], &one(p.clone())).await {
        Ok(ApplyOutcome::Gap(g)) => {
            assert_eq!((g.projection.as_str(), g.stream.clone()), ("p", s.clone()));
            assert_eq!(
                (g.checkpoint, g.offered.get()),
                (0, 3),
                "gap names checkpoint and offered seq"
            );
        }
        other => panic!("a run starting at 3 over checkpoint 0 is a gap, got {other:?}"),
    }
    assert_eq!(f.projections.checkpoint(p.name(), &s).await.unwrap(), 0);
    assert_eq!(state(h, &f, "p").await, Default::default(), "nothing applied");
    assert_eq!(f.projections.watermark(&s).await.unwrap(), None, "no watermark");
    apply_ok(&f.projections, &s, &evs[..1], &one(p.clone())).await;
    let r = f.projections.apply(&s, &evs[2..], &one(p.clone())).await;
    assert!(
        matches!(r, Ok(ApplyOutcome::Gap(ref g)) if g.checkpoint == 1),
        "gap after seq 1: {r:?}"
    );
    assert_eq!(applied(h, &f, "p", &s).await, [1]);
}

/// `apply`: audit-only events advance the checkpoint without calling the
/// applier (the oracle never lists them) and are counted in `audit_only`.
pub async fn apply_audit_only_advances_checkpoint<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let s = sid("s");
    let evs = recorded(&f.journal, &s, vec![audit(), add(5), audit(), audit(), add(7)]).await;
    let r = apply_ok(&f.projections, &s, &evs[..1], &one(p.clone())).await;
    assert_eq!(
        r,
        ApplyReport {
            through: 1,
            applied: 0,
            duplicates: 0,
            audit_only: 1
        }
    );
    assert_eq!(
        f.projections.checkpoint(p.name(), &s).await.unwrap(),
        1,
        "an audit-only head advances"
    );
    assert!(
        applied(h, &f, "p", &s).await.is_empty(),
        "the applier was not called"
    );
    let r = apply_ok(&f.projections, &s, &evs, &one(p.clone())).await;
    assert_eq!(
        r,
        ApplyReport {
            through: 5,
            applied: 2,
            duplicates: 1,
            audit_only: 2
        }
    );
    assert_eq!(applied(h, &f, "p", &s).await, [2, 5], "only the apply events");
    assert_eq!(state(h, &f, "p").await.streams["s"].sum, 12);
    assert_eq!(f.projections.checkpoint(p.name(), &s).await.unwrap(), 5);
    assert_eq!(
        f.projections
            .watermark(&s)
            .await
            .unwrap()
            .map(|w| w.applied_through),
        Some(5)
    );
}

/// `apply`: an applier failure rolls the whole transaction back (no
/// projection write, no checkpoint or watermark move, even for the events
/// before the failing one) and returns `Error::Apply` naming the event.
pub async fn apply_failure_rolls_back_everything<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, faults) = oracle(h, &f, "p").await;
    let s = sid("s");
    let evs = recorded(&f.journal, &s, adds(&[1, 2, 3, 4, 5])).await;
    apply_ok(&f.projections, &s, &evs[..2], &one(p.clone())).await;
    let before = state(h, &f, "p").await;
    faults.fail(&s, 4, 1);
    match f.projections.apply(&s, &evs, &one(p.clone())).await {
        Err(Error::Apply {
            projection,
            stream,
            seq,
            ..
        }) => {
            assert_eq!(
                (projection.as_str(), stream, seq.get()),
                ("p", s.clone(), 4),
                "names the failing event"
            )
        }
        other => panic!("an applier failure is Error::Apply, got {other:?}"),
    }
    assert_eq!(
        f.projections.checkpoint(p.name(), &s).await.unwrap(),
        2,
        "checkpoint unchanged"
    );
    assert_eq!(
        state(h, &f, "p").await,
        before,
        "seq 3 was rolled back with seq 4"
    );
    assert_eq!(
        f.projections
            .watermark(&s)
            .await
            .unwrap()
            .map(|w| w.applied_through),
        Some(2),
        "watermark unchanged"
    );
    let r = apply_ok(&f.projections, &s, &evs, &one(p.clone())).await;
    assert_eq!((r.applied, r.duplicates), (3, 2), "the retry applies the rest");
    assert_eq!(
        applied(h, &f, "p", &s).await,
        [1, 2, 3, 4, 5],
        "each seq exactly once"
    );
}

/// `apply`: several projections in one call, each planned against its own
/// checkpoint; `applied` counts events new to at least one projection.
pub async fn apply_two_projections_with_different_checkpoints<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let (q, _) = oracle(h, &f, "q").await;
    let s = sid("s");
    let evs = recorded(&f.journal, &s, adds(&[1, 2, 3, 4])).await;
    apply_ok(&f.projections, &s, &evs[..2], &one(p.clone())).await;
    let both = vec![p.clone(), q.clone()];
    let r = apply_ok(&f.projections, &s, &evs, &both).await;
    assert_eq!(
        r,
        ApplyReport {
            through: 4,
            applied: 4,
            duplicates: 0,
            audit_only: 0
        }
    );
    assert_eq!(applied(h, &f, "p", &s).await, [1, 2, 3, 4], "p got 3 and 4 once");
    assert_eq!(applied(h, &f, "q", &s).await, [1, 2, 3, 4], "q got everything");
    assert_eq!(f.projections.checkpoint(q.name(), &s).await.unwrap(), 4);
    let r = apply_ok(&f.projections, &s, &evs, &both).await;
    assert_eq!((r.applied, r.duplicates), (0, 4), "duplicates for both");
}

/// `apply`: one transaction for every projection: when one projection has a
/// gap, nothing is written for the others either; when one applier fails,
/// the others roll back too.
pub async fn apply_is_one_transaction_across_projections<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let (q, q_faults) = oracle(h, &f, "q").await;
    let s = sid("s");
    let evs = recorded(&f.journal, &s, adds(&[1, 2, 3, 4])).await;
    apply_ok(&f.projections, &s, &evs[..2], &one(p.clone())).await;
    let both = vec![p.clone(), q.clone()];
    let r = f.projections.apply(&s, &evs[2..], &both).await;
    assert!(
        matches!(r, Ok(ApplyOutcome::Gap(ref g)) if g.projection.as_str() == "q"),
        "q has a gap: {r:?}"
    );
    assert_eq!(
        f.projections.checkpoint(p.name(), &s).await.unwrap(),
        2,
        "p did not move"
    );
    assert_eq!(applied(h, &f, "p", &s).await, [1, 2], "nothing written for p");
    q_faults.fail(&s, 2, 1);
    let r = f.projections.apply(&s, &evs, &both).await;
    assert!(
        matches!(r, Err(Error::Apply { ref projection, .. }) if projection == "q"),
        "q fails: {r:?}"
    );
    assert_eq!(
        f.projections.checkpoint(p.name(), &s).await.unwrap(),
        2,
        "p rolled back with q"
    );
    assert_eq!(applied(h, &f, "p", &s).await, [1, 2]);
    assert!(applied(h, &f, "q", &s).await.is_empty());
    apply_ok(&f.projections, &s, &evs, &both).await;
    assert_eq!(applied(h, &f, "p", &s).await, [1, 2, 3, 4]);
    assert_eq!(applied(h, &f, "q", &s).await, [1, 2, 3, 4]);
}

/// `apply`: a run that is empty, not contiguous or of another stream is
/// `InvalidInput` and writes nothing.
pub async fn apply_rejects_bad_runs<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let (s, t) = (sid("s"), sid("t"));
    let evs = recorded(&f.journal, &s, adds(&[1, 2, 3])).await;
    let other = recorded(&f.journal, &t, adds(&[1])).await;
    let holey = vec![evs[0].clone(), evs[2].clone()];
    let backwards = vec![evs[1].clone(), evs[0].clone()];
    let mixed = vec![evs[0].clone(), other[0].clone()];
    for (what, stream, run) in [
        ("empty", &s, vec![]),
        ("with a hole", &s, holey),
        ("backwards", &s, backwards),
        ("of two streams", &s, mixed),
        ("of another stream", &t, evs.clone()),
    ] {
        let r = f.projections.apply(stream, &run, &one(p.clone())).await;
        assert!(matches!(r, Err(Error::InvalidInput(_))), "a run {what}: {r:?}");
    }
    assert_eq!(state(h, &f, "p").await, Default::default(), "nothing applied");
    assert_eq!(f.projections.checkpoint(p.name(), &s).await.unwrap(), 0);
    assert_eq!(f.projections.checkpoint(p.name(), &t).await.unwrap(), 0);
    assert_eq!(f.projections.watermark(&s).await.unwrap(), None);
}

/// `apply_runs` over these runs, which must succeed.
async fn apply_runs_ok<P: ProjectionStore>(
    p: &P,
    runs: &[&[Event]],
    projs: &[Arc<dyn Projection<P::Tx>>],
) -> Vec<ApplyOutcome> {
    p.apply_runs(runs, projs)
        .await
        .unwrap_or_else(|e| panic!("apply_runs of {} runs failed: {e}", runs.len()))
}

/// `apply_runs`: `apply` for each run of several streams in one call, all
/// committed: each stream's events applied once, its checkpoint and
/// watermark moved to its run's last seq, one `Applied` outcome per run in
/// order (duplicates skipped as `apply` does); no runs is `Ok` and empty.
pub async fn apply_runs_applies_runs_of_several_streams<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let (s, t, u) = (sid("s"), sid("t"), sid("u"));
    let es = recorded(&f.journal, &s, adds(&[1, 2, 3])).await;
    let et = recorded(&f.journal, &t, adds(&[10, 20])).await;
    let eu = recorded(&f.journal, &u, adds(&[100])).await;
    let none = apply_runs_ok(&f.projections, &[], &one(p.clone())).await;
    assert!(none.is_empty(), "no runs: no outcomes: {none:?}");
    assert_eq!(
        state(h, &f, "p").await,
        Default::default(),
        "no runs: nothing applied"
    );
    apply_ok(&f.projections, &s, &es[..1], &one(p.clone())).await;
    let outcomes = apply_runs_ok(&f.projections, &[&es, &et, &eu], &one(p.clone())).await;
    let reports: Vec<_> = outcomes
        .iter()
        .map(|o| match o {
            ApplyOutcome::Applied(r) => (r.through, r.applied, r.duplicates),
            other => panic!("every run applies, got {other:?} in {outcomes:?}"),
        })
        .collect();
    assert_eq!(
        reports,
        [(3, 2, 1), (2, 2, 0), (1, 1, 0)],
        "one Applied per run, in order; s's seq 1 a duplicate"
    );
    for (stream, through, seqs, sum) in [
        (&s, 3, vec![1, 2, 3], 6),
        (&t, 2, vec![1, 2], 30),
        (&u, 1, vec![1], 100),
    ] {
        assert_eq!(
            f.projections.checkpoint(p.name(), stream).await.unwrap(),
            through,
            "{stream}: the checkpoint moved to the run's last seq"
        );
        assert_eq!(
            f.projections
                .watermark(stream)
                .await
                .unwrap()
                .map(|w| w.applied_through),
            Some(through),
            "{stream}: the watermark is raised to the run's last seq"
        );
        assert_eq!(
            applied(h, &f, "p", stream).await,
            seqs,
            "{stream}: each event applied once"
        );
        assert_eq!(
            state(h, &f, "p").await.streams[stream.as_str()].sum,
            sum,
            "{stream}: the projection rows are written"
        );
    }
    let again = apply_runs_ok(&f.projections, &[&et, &es], &one(p.clone())).await;
    assert!(
        again
            .iter()
            .all(|o| matches!(o, ApplyOutcome::Applied(r) if r.applied == 0)),
        "the same runs again are all duplicates: {again:?}"
    );
    assert_eq!(applied(h, &f, "p", &t).await, [1, 2], "t still applied once");
}

/// `apply_runs`: an applier failing on one stream's event commits nothing
/// for any stream (no projection row, no checkpoint or watermark moved, the
/// runs before it included) and is `Error::Apply` naming that stream and seq.
pub async fn apply_runs_failure_commits_nothing_for_any_stream<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, faults) = oracle(h, &f, "p").await;
    let (s, t, u) = (sid("s"), sid("t"), sid("u"));
    let es = recorded(&f.journal, &s, adds(&[1, 2])).await;
    let et = recorded(&f.journal, &t, adds(&[1, 2, 3])).await;
    let eu = recorded(&f.journal, &u, adds(&[1])).await;
    faults.fail(&t, 2, 1);
    match f.projections.apply_runs(&[&es, &et, &eu], &one(p.clone())).await {
        Err(Error::Apply {
            projection,
            stream,
            seq,
            ..
        }) => assert_eq!(
            (projection.as_str(), stream, seq.get()),
            ("p", t.clone(), 2),
            "Error::Apply names the failing projection, stream and seq"
        ),
        other => panic!("an applier failure in apply_runs is Error::Apply, got {other:?}"),
    }
    for stream in [&s, &t, &u] {
        assert_eq!(
            f.projections.checkpoint(p.name(), stream).await.unwrap(),
            0,
            "{stream}: no checkpoint moved (s's run before the failure included)"
        );
        assert_eq!(
            f.projections.watermark(stream).await.unwrap(),
            None,
            "{stream}: no watermark raised"
        );
    }
    assert_eq!(
        state(h, &f, "p").await,
        Default::default(),
        "no projection row committed for any stream"
    );
    let outcomes = apply_runs_ok(&f.projections, &[&es, &et, &eu], &one(p.clone())).await;
    assert_eq!(outcomes.len(), 3, "the retry applies every run: {outcomes:?}");
    assert_eq!(applied(h, &f, "p", &s).await, [1, 2], "s applied once");
    assert_eq!(applied(h, &f, "p", &t).await, [1, 2, 3], "t applied once");
    assert_eq!(applied(h, &f, "p", &u).await, [1], "u applied once");
}

/// `apply_runs`: a run that meets a gap stops the call: the outcomes end
/// with that run's `Gap` (later runs are not attempted) and nothing is
/// committed, the runs before it included.
pub async fn apply_runs_gap_stops_and_commits_nothing<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let (s, t, u) = (sid("s"), sid("t"), sid("u"));
    let es = recorded(&f.journal, &s, adds(&[1, 2])).await;
    let et = recorded(&f.journal, &t, adds(&[1, 2, 3])).await;
    let eu = recorded(&f.journal, &u, adds(&[1])).await;
    let outcomes = apply_runs_ok(&f.projections, &[&es, &et[1..], &eu], &one(p.clone())).await;
    assert_eq!(
        outcomes.len(),
        2,
        "the outcomes end with the gap's run: {outcomes:?}"
    );
    assert!(
        matches!(outcomes[0], ApplyOutcome::Applied(_)),
        "s's run comes first and applies: {outcomes:?}"
    );
    match &outcomes[1] {
        ApplyOutcome::Gap(g) => assert_eq!(
            (
                g.projection.as_str(),
                g.stream.clone(),
                g.checkpoint,
                g.offered.get()
            ),
            ("p", t.clone(), 0, 2),
            "the gap names t, its checkpoint and the offered seq"
        ),
        other => panic!("t's run starting at 2 over checkpoint 0 is a gap, got {other:?}"),
    }
    for stream in [&s, &t, &u] {
        assert_eq!(
            f.projections.checkpoint(p.name(), stream).await.unwrap(),
            0,
            "{stream}: a gap commits nothing, no checkpoint moved"
        );
        assert_eq!(
            f.projections.watermark(stream).await.unwrap(),
            None,
            "{stream}: a gap commits nothing, no watermark"
        );
    }
    assert_eq!(
        state(h, &f, "p").await,
        Default::default(),
        "a gap commits nothing, s's applied run included"
    );
}

/// `apply_runs`: two runs of one stream in a call, an empty run or a run
/// that is not contiguous are `InvalidInput`, and nothing is written.
pub async fn apply_runs_rejects_two_runs_of_one_stream_and_bad_runs<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let (s, t) = (sid("s"), sid("t"));
    let es = recorded(&f.journal, &s, adds(&[1, 2, 3])).await;
    let et = recorded(&f.journal, &t, adds(&[1, 2])).await;
    let holey = [et[0].clone(), et[1].clone(), es[2].clone()];
    let empty: Vec<Event> = Vec::new();
    for (what, runs) in [
        ("two runs of s", vec![&es[..1], &et[..], &es[1..]]),
        ("the same run twice", vec![&es[..], &es[..]]),
        ("an empty run", vec![&es[..], &empty[..]]),
        ("a run mixing two streams", vec![&es[..], &holey[..]]),
    ] {
        let r = f.projections.apply_runs(&runs, &one(p.clone())).await;
        assert!(
            matches!(r, Err(Error::InvalidInput(_))),
            "apply_runs with {what} is InvalidInput: {r:?}"
        );
    }
    assert_eq!(state(h, &f, "p").await, Default::default(), "nothing applied");
    for stream in [&s, &t] {
        assert_eq!(
            f.projections.checkpoint(p.name(), stream).await.unwrap(),
            0,
            "{stream}: no checkpoint moved"
        );
        assert_eq!(
            f.projections.watermark(stream).await.unwrap(),
            None,
            "{stream}: no watermark"
        );
    }
}

/// `checkpoint`: 0 before any apply, per (projection, stream).
pub async fn checkpoint_is_per_projection_and_stream<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let (q, _) = oracle(h, &f, "q").await;
    let (s, t) = (sid("s"), sid("t"));
    assert_eq!(
        f.projections.checkpoint(p.name(), &s).await.unwrap(),
        0,
        "no apply yet"
    );
    let evs = recorded(&f.journal, &s, adds(&[1, 2])).await;
    apply_ok(&f.projections, &s, &evs, &one(p.clone())).await;
    assert_eq!(f.projections.checkpoint(p.name(), &s).await.unwrap(), 2);
    assert_eq!(
        f.projections.checkpoint(q.name(), &s).await.unwrap(),
        0,
        "another projection"
    );
    assert_eq!(
        f.projections.checkpoint(p.name(), &t).await.unwrap(),
        0,
        "another stream"
    );
}

/// `reset`: clears the projection's rows and checkpoints (in one
/// transaction) and leaves other projections alone; events then apply from 1.
pub async fn reset_clears_projection_and_checkpoints<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let (q, _) = oracle(h, &f, "q").await;
    let (s, t) = (sid("s"), sid("t"));
    let es = recorded(&f.journal, &s, adds(&[1, 2])).await;
    let et = recorded(&f.journal, &t, adds(&[3])).await;
    let both = vec![p.clone(), q.clone()];
    apply_ok(&f.projections, &s, &es, &both).await;
    apply_ok(&f.projections, &t, &et, &both).await;
    let q_before = state(h, &f, "q").await;
    f.projections.reset(&*p).await.expect("reset");
    assert_eq!(
        f.projections.checkpoint(p.name(), &s).await.unwrap(),
        0,
        "checkpoints cleared"
    );
    assert_eq!(
        f.projections.checkpoint(p.name(), &t).await.unwrap(),
        0,
        "on every stream"
    );
    assert_eq!(
        state(h, &f, "p").await,
        Default::default(),
        "rows and ledger cleared"
    );
    assert_eq!(state(h, &f, "q").await, q_before, "other projections untouched");
    assert_eq!(f.projections.checkpoint(q.name(), &s).await.unwrap(), 2);
    let r = apply_ok(&f.projections, &s, &es, &one(p.clone())).await;
    assert_eq!(r.applied, 2, "after a reset the events are new again");
    assert_eq!(applied(h, &f, "p", &s).await, [1, 2]);
}

/// `digest`: equal for equal states (on two separate stores), different
/// after a change, and equal again after reset and replay.
pub async fn digest_tracks_state<H: Harness>(h: &H) {
    let f1 = h.open().await;
    let f2 = h.open().await;
    let (p1, _) = oracle(h, &f1, "p").await;
    let (p2, _) = oracle(h, &f2, "p").await;
    let empty = f1.projections.digest(&*p1).await.unwrap();
    assert_eq!(
        empty,
        f2.projections.digest(&*p2).await.unwrap(),
        "two empty projections"
    );
    let s = sid("s");
    let e1 = recorded(&f1.journal, &s, adds(&[4, 5, 6])).await;
    let e2 = recorded(&f2.journal, &s, adds(&[4, 5, 6])).await;
    apply_ok(&f1.projections, &s, &e1, &one(p1.clone())).await;
    apply_ok(&f2.projections, &s, &e2[..1], &one(p2.clone())).await;
    apply_ok(&f2.projections, &s, &e2, &one(p2.clone())).await;
    let d1 = f1.projections.digest(&*p1).await.unwrap();
    assert_ne!(d1, empty, "applying changes the digest");
    assert_eq!(
        d1,
        f2.projections.digest(&*p2).await.unwrap(),
        "the same events in other batches: same digest"
    );
    assert_eq!(
        d1,
        f1.projections.digest(&*p1).await.unwrap(),
        "digest is deterministic"
    );
    let more = recorded(&f1.journal, &s, adds(&[7])).await;
    apply_ok(&f1.projections, &s, &more, &one(p1.clone())).await;
    let d2 = f1.projections.digest(&*p1).await.unwrap();
    assert_ne!(d2, d1, "another event changes the digest");
    f1.projections.reset(&*p1).await.unwrap();
    assert_eq!(
        f1.projections.digest(&*p1).await.unwrap(),
        empty,
        "reset returns to the empty digest"
    );
    let all = all_events(&f1.journal, &s).await;
    apply_ok(&f1.projections, &s, &all, &one(p1.clone())).await;
    assert_eq!(
        f1.projections.digest(&*p1).await.unwrap(),
        d2,
        "replay after reset converges"
    );
}

/// `digest`: covers checkpoints too: an audit-only event changes it.
pub async fn digest_covers_checkpoints<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let s = sid("s");
    let evs = recorded(&f.journal, &s, vec![add(1), audit()]).await;
    apply_ok(&f.projections, &s, &evs[..1], &one(p.clone())).await;
    let d1 = f.projections.digest(&*p).await.unwrap();
    apply_ok(&f.projections, &s, &evs, &one(p.clone())).await;
    assert_eq!(f.projections.checkpoint(p.name(), &s).await.unwrap(), 2);
    assert_ne!(
        f.projections.digest(&*p).await.unwrap(),
        d1,
        "the checkpoint moved, so the digest changes"
    );
}

/// `setup`: idempotent, and a second setup keeps what was applied.
pub async fn setup_is_idempotent<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    f.projections.setup(&one(p.clone())).await.expect("second setup");
    let s = sid("s");
    let evs = recorded(&f.journal, &s, adds(&[1, 2])).await;
    apply_ok(&f.projections, &s, &evs, &one(p.clone())).await;
    let before = state(h, &f, "p").await;
    f.projections
        .setup(&one(p.clone()))
        .await
        .expect("setup after applies");
    let other = h.reopen_projections(&f.ctx).await;
    other
        .setup(&one(p.clone()))
        .await
        .expect("setup from another instance");
    assert_eq!(state(h, &f, "p").await, before, "setup keeps applied state");
    assert_eq!(
        f.projections.checkpoint(p.name(), &s).await.unwrap(),
        2,
        "and checkpoints"
    );
}

/// Stands in for projection `name` and writes a skip record for every event
/// handed to it (what the runtime's skip does for one event).
struct SkipRecorder(outbox_core::ProjectionName);

#[outbox_core::async_trait]
impl<Tx: outbox_core::spi::ApplyTx + 'static> Projection<Tx> for SkipRecorder {
    fn name(&self) -> &outbox_core::ProjectionName {
        &self.0
    }
    async fn apply(&self, tx: &mut Tx, event: &Event) -> Result<(), outbox_core::BoxError> {
        tx.record_skip(&self.0, &event.stream, event.seq, "cannot take it")
            .await?;
        Ok(())
    }
    async fn reset(&self, _: &mut Tx) -> Result<(), outbox_core::BoxError> {
        Ok(())
    }
    async fn digest(
        &self,
        _: &mut Tx,
        _: &mut outbox_core::DigestBuilder,
    ) -> Result<(), outbox_core::BoxError> {
        Ok(())
    }
}

/// A skip record commits with the apply that moves the checkpoint past its
/// event (and rolls back with it); `skipped` lists it; `reapply` runs the
/// applier on the event and takes the record in one transaction, keeps it
/// when the applier fails, and finds nothing the second time.
pub async fn skip_records_commit_with_their_apply_and_reapply_takes_them_once<H: Harness>(h: &H) {
    use outbox_core::SkippedEvents;
    let f = h.open().await;
    let (p, faults) = oracle(h, &f, "p").await;
    let s = sid("s");
    let evs = recorded(&f.journal, &s, adds(&[1, 10, 100])).await;
    apply_ok(&f.projections, &s, &evs[..1], &one(p.clone())).await;
    let skipper: Arc<dyn Projection<crate::TxOf<H>>> = Arc::new(SkipRecorder(p.name().clone()));
    // Rolled back with its apply: a second projection fails in the same transaction.
    let (q, q_faults) = oracle(h, &f, "q").await;
    apply_ok(&f.projections, &s, &evs[..1], &one(q.clone())).await;
    q_faults.fail(&s, 2, u32::MAX);
    let failed = f
        .projections
        .apply(&s, &evs[1..2], &[skipper.clone(), q.clone()])
        .await;
    assert!(matches!(failed, Err(Error::Apply { .. })), "{failed:?}");
    assert!(
        f.projections.skipped(None, 10).await.unwrap().is_empty(),
        "rolled back"
    );
    assert_eq!(f.projections.checkpoint(p.name(), &s).await.unwrap(), 1);
    apply_ok(&f.projections, &s, &evs[1..2], &one(skipper)).await;
    apply_ok(&f.projections, &s, &evs[2..], &one(p.clone())).await;
    assert_eq!(applied(h, &f, "p", &s).await, [1, 3], "2 skipped");
    assert_eq!(f.projections.checkpoint(p.name(), &s).await.unwrap(), 3);
    let listed = f.projections.skipped(Some(p.name()), 10).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (
            listed[0].projection.as_str(),
            listed[0].stream.as_str(),
            listed[0].seq.get()
        ),
        ("p", "s", 2)
    );
    assert_eq!(listed[0].error, "cannot take it");
    let other = outbox_core::ProjectionName::new("q").unwrap();
    assert!(f.projections.skipped(Some(&other), 10).await.unwrap().is_empty());
    // A re-apply whose applier fails keeps the record and writes nothing.
    faults.fail(&s, 2, 1);
    let failed = f.projections.reapply(&evs[1], &p).await;
    assert!(matches!(failed, Err(Error::Apply { .. })), "{failed:?}");
    assert_eq!(f.projections.skipped(None, 10).await.unwrap().len(), 1);
    assert_eq!(applied(h, &f, "p", &s).await, [1, 3]);
    assert!(f.projections.reapply(&evs[1], &p).await.unwrap());
    assert_eq!(
        applied(h, &f, "p", &s).await,
        [1, 3, 2],
        "re-applied after the later events"
    );
    assert_eq!(
        f.projections.checkpoint(p.name(), &s).await.unwrap(),
        3,
        "the checkpoint stays"
    );
    assert!(f.projections.skipped(None, 10).await.unwrap().is_empty());
    assert!(!f.projections.reapply(&evs[1], &p).await.unwrap(), "once");
    assert_eq!(applied(h, &f, "p", &s).await, [1, 3, 2]);
    // Two stores (as two processes) re-applying one skipped event at once:
    // it is applied once.
    let more = recorded(&f.journal, &s, adds(&[1000])).await;
    let skipper: Arc<dyn Projection<crate::TxOf<H>>> = Arc::new(SkipRecorder(p.name().clone()));
    apply_ok(&f.projections, &s, &more, &one(skipper)).await;
    let x = h.reopen_projections(&f.ctx).await;
    let y = h.reopen_projections(&f.ctx).await;
    let (a, b) = tokio::join!(x.reapply(&more[0], &p), y.reapply(&more[0], &p));
    assert!(
        a.unwrap() ^ b.unwrap(),
        "exactly one of two concurrent re-applies applies"
    );
    assert_eq!(applied(h, &f, "p", &s).await, [1, 3, 2, 4]);
    assert!(matches!(
        f.projections.skipped(None, 0).await,
        Err(Error::InvalidInput(_))
    ));
}
