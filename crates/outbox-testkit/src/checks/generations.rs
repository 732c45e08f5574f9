//! `GenerationStore` (ADR 0021): generations of a view projection are built
//! beside the live one, swapped in one step for readers and appliers alike,
//! fenced so an apply that resolved the old generation cannot commit after
//! the swap, and dropped only when not live.

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::{
    ApplyOutcome, BoxError, Error, Event, GenerationStore, Projection, ProjectionName, ProjectionStore,
    RunningDigest, StreamId, SwapCheck, SwapOutcome, ViewProjection, ViewReader, ViewStore, ViewTx,
    generation_projection, generation_storage, view_projection, view_projection_with_candidate,
};

use super::support::{apply_ok, recorded};
use crate::{Fixture, Harness, TxOf, add, one, sid};

/// Counts events per stream and in total, each event worth `factor`.
struct Tally {
    name: ProjectionName,
    version: u32,
    factor: i64,
}

#[async_trait]
impl ViewProjection for Tally {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    fn version(&self) -> u32 {
        self.version
    }

    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError> {
        let f = self.factor;
        view.update("n", event.stream.as_str(), |n: &mut i64| *n += f)
            .await?;
        view.update("total", "all", |n: &mut i64| *n += f).await?;
        Ok(())
    }
}

fn tally(name: &str, version: u32, factor: i64) -> Arc<dyn ViewProjection> {
    Arc::new(Tally {
        name: ProjectionName::new(name).expect("name"),
        version,
        factor,
    })
}

async fn read<H: Harness>(f: &Fixture<H>, name: &ProjectionName, stream: &str) -> Option<i64> {
    ViewReader::new(&f.projections, name.clone())
        .get("n", stream)
        .await
        .expect("read")
}

async fn events<H: Harness>(f: &Fixture<H>, stream: &StreamId, n: usize) -> Vec<Event> {
    recorded(&f.journal, stream, (0..n).map(|i| add(i as i64)).collect()).await
}

fn building<H: Harness>(
    name: &ProjectionName,
    code: &Arc<dyn ViewProjection>,
    g: u32,
) -> Vec<Arc<dyn Projection<TxOf<H>>>> {
    one(generation_projection(
        Arc::clone(code),
        generation_storage(name, g).expect("storage"),
    ))
}

/// A swap moves readers, checkpoints and appliers to the new generation at
/// once; before it, the new generation is invisible. A swap that finds the
/// new generation behind lists the streams and changes nothing. After it,
/// the registered projection applies the code of the live generation's
/// version; the old generation is kept until dropped, the live one cannot
/// be dropped.
pub async fn generation_swap_moves_readers_and_appliers_together<H: Harness>(h: &H) {
    let f = h.open().await;
    let main = tally("tally", 1, 1);
    let candidate = tally("tally", 2, 10);
    let name = main.name().clone();
    let live: Vec<Arc<dyn Projection<TxOf<H>>>> =
        one(view_projection_with_candidate(Arc::clone(&main), Arc::clone(&candidate)).expect("candidate"));
    let a = sid("a");
    let ev = events(&f, &a, 3).await;
    apply_ok(&f.projections, &a, &ev, &live).await;
    assert_eq!(read(&f, &name, "a").await, Some(3), "generation 1 serves");
    assert_eq!(
        f.projections.generation(&name).await.unwrap(),
        None,
        "no record yet"
    );

    let rec = f.projections.begin_generation(&name, 1, 2).await.expect("begin");
    assert_eq!(
        (rec.live, rec.building, rec.building_version),
        (1, Some(2), Some(2))
    );
    assert_eq!((rec.epoch, rec.last_generation), (0, 2));
    let g2 = building::<H>(&name, &candidate, 2);
    apply_ok(&f.projections, &a, &ev[..2], &g2).await;
    assert_eq!(
        read(&f, &name, "a").await,
        Some(3),
        "the build is invisible to readers"
    );

    let out = f
        .projections
        .swap_generation(&name, 2, SwapCheck::CaughtUp)
        .await
        .expect("swap");
    match out {
        SwapOutcome::Behind { streams } => {
            assert_eq!(streams.len(), 1, "{streams:?}");
            assert_eq!(
                (streams[0].stream.as_str(), streams[0].live, streams[0].building),
                ("a", 3, 2)
            );
        }
        other => panic!("a generation behind must not be swapped in: {other:?}"),
    }
    assert_eq!(
        f.projections.generation(&name).await.unwrap().map(|r| r.live),
        Some(1),
        "Behind changes nothing"
    );
    apply_ok(&f.projections, &a, &ev[2..], &g2).await;
    let out = f
        .projections
        .swap_generation(&name, 2, SwapCheck::CaughtUp)
        .await
        .expect("swap");
    assert_eq!(
        out,
        SwapOutcome::Swapped {
            from: 1,
            to: 2,
            epoch: 1
        }
    );
    assert_eq!(
        read(&f, &name, "a").await,
        Some(30),
        "readers see generation 2 at once"
    );
    assert_eq!(
        f.projections.checkpoint(&name, &a).await.unwrap(),
        3,
        "its checkpoints too"
    );
    let rec = f.projections.generation(&name).await.unwrap().expect("record");
    assert_eq!(
        (rec.live, rec.live_version, rec.building, rec.epoch),
        (2, 2, None, 1)
    );

    let more = events(&f, &a, 1).await;
    apply_ok(&f.projections, &a, &more, &live).await;
    assert_eq!(
        read(&f, &name, "a").await,
        Some(40),
        "the registered projection applies the candidate's code to the candidate's generation"
    );
    let stored = f.projections.stored_generations(&name).await.expect("stored");
    let kept: Vec<(u32, u64)> = stored.iter().map(|g| (g.generation, g.events)).collect();
    assert_eq!(kept, vec![(1, 3), (2, 4)], "the old generation is kept as it was");

    let err = f.projections.drop_generation(&name, 2).await.expect_err("live");
    assert!(matches!(err, Error::InvalidState(_)), "{err}");
    let err = f
        .projections
        .drop_generation(&name, 9)
        .await
        .expect_err("never given out");
    assert!(matches!(err, Error::NotFound(_)), "{err}");
    assert_eq!(
        f.projections.drop_generation(&name, 1).await.expect("drop"),
        2,
        "two documents"
    );
    let stored = f.projections.stored_generations(&name).await.expect("stored");
    assert_eq!(stored.iter().map(|g| g.generation).collect::<Vec<_>>(), vec![2]);
    assert_eq!(
        read(&f, &name, "a").await,
        Some(40),
        "dropping the old one leaves the live one"
    );
}

/// The epoch fence: a second store instance (another process) swaps while
/// the first one still has the old live generation resolved. The first
/// one's next apply either fails with a temporary error that writes nothing
/// or applies to the new generation; retried, it applies to the new one.
/// The old generation never changes after the swap.
pub async fn apply_resolved_before_a_swap_cannot_commit_to_the_old_generation<H: Harness>(h: &H) {
    let f = h.open().await;
    let other = h.reopen_projections(&f.ctx).await;
    let main = tally("fenced", 1, 1);
    let name = main.name().clone();
    let live: Vec<Arc<dyn Projection<TxOf<H>>>> = one(view_projection(Arc::clone(&main)));
    let (a, b) = (sid("a"), sid("b"));
    let ea = events(&f, &a, 2).await;
    apply_ok(&f.projections, &a, &ea, &live).await;

    // Another instance builds generation 2 and swaps it in.
    other.begin_generation(&name, 1, 1).await.expect("begin");
    apply_ok(&other, &a, &ea, &building::<H>(&name, &main, 2)).await;
    let out = other
        .swap_generation(&name, 2, SwapCheck::CaughtUp)
        .await
        .expect("swap");
    assert!(matches!(out, SwapOutcome::Swapped { to: 2, .. }), "{out:?}");
    let old = generation_storage(&name, 1).unwrap();
    let before = f.projections.stored_generations(&name).await.expect("stored");

    let eb = events(&f, &b, 1).await;
    let first = f.projections.apply(&b, &eb, &live).await;
    match &first {
        Ok(ApplyOutcome::Applied(_)) => {}
        Err(Error::Storage { temporary: true, .. }) => {
            apply_ok(&f.projections, &b, &eb, &live).await;
        }
        other => panic!("an apply after another instance's swap: {other:?}"),
    }
    let after = f.projections.stored_generations(&name).await.expect("stored");
    let g1 = |s: &[outbox_core::StoredGeneration]| s.iter().find(|g| g.storage == old).cloned();
    assert!(g1(&before).is_some(), "generation 1 is kept");
    assert_eq!(g1(&after), g1(&before), "the old generation is unchanged");
    assert_eq!(
        read(&f, &name, "b").await,
        Some(1),
        "the event reached the live generation"
    );
    assert_eq!(f.projections.checkpoint(&name, &b).await.unwrap(), 1);
}

/// `begin_generation` resumes a build of the same version, refuses another
/// version naming the one being built, never reuses a number, and starts a
/// new generation empty; `record_build_position` moves only the build in
/// progress.
pub async fn begin_generation_resumes_its_version_and_refuses_another<H: Harness>(h: &H) {
    let f = h.open().await;
    let code = tally("resumed", 3, 1);
    let name = code.name().clone();
    let a = sid("a");
    let ev = events(&f, &a, 2).await;
    let first = f.projections.begin_generation(&name, 1, 3).await.expect("begin");
    assert_eq!(first.building, Some(2));
    apply_ok(&f.projections, &a, &ev, &building::<H>(&name, &code, 2)).await;
    f.projections
        .record_build_position(&name, 2, 42)
        .await
        .expect("position");
    let again = f.projections.begin_generation(&name, 1, 3).await.expect("resume");
    assert_eq!(
        (again.building, again.building_position),
        (Some(2), 42),
        "resumed where it was"
    );
    let err = f
        .projections
        .begin_generation(&name, 1, 4)
        .await
        .expect_err("another version");
    assert!(
        matches!(&err, Error::InvalidState(m) if m.contains("version 3")),
        "names the version being built: {err}"
    );
    let err = f
        .projections
        .record_build_position(&name, 3, 1)
        .await
        .expect_err("not building");
    assert!(matches!(err, Error::InvalidState(_)), "{err}");
    assert_eq!(
        f.projections
            .drop_generation(&name, 2)
            .await
            .expect("drop the build"),
        2
    );
    let rec = f.projections.generation(&name).await.unwrap().expect("record");
    assert_eq!((rec.building, rec.live), (None, 1), "dropping the build ends it");
    let next = f
        .projections
        .begin_generation(&name, 1, 4)
        .await
        .expect("a new build");
    assert_eq!(next.building, Some(3), "numbers are never reused");
    let g3 = generation_storage(&name, 3).unwrap();
    assert_eq!(
        f.projections.checkpoint(&g3, &a).await.unwrap(),
        0,
        "a new generation starts empty"
    );
    assert_eq!(
        f.projections
            .view_digests()
            .await
            .unwrap()
            .iter()
            .find(|d| d.projection == g3),
        None
    );
}

/// `SwapCheck::Agrees` swaps only generations that applied the same events
/// with equal running digests: a building generation ahead of the live one
/// is `Behind` too, different documents are `Differs` with both digests and
/// change nothing, and `AgreesOrForced` swaps them anyway.
pub async fn agreeing_swap_compares_checkpoints_and_running_digests<H: Harness>(h: &H) {
    let f = h.open().await;
    let main = tally("agreed", 1, 1);
    let name = main.name().clone();
    let live: Vec<Arc<dyn Projection<TxOf<H>>>> = one(view_projection(Arc::clone(&main)));
    let a = sid("a");
    let ev = events(&f, &a, 3).await;
    apply_ok(&f.projections, &a, &ev[..2], &live).await;

    // The same code: ahead first, then level and equal.
    f.projections.begin_generation(&name, 1, 1).await.expect("begin");
    apply_ok(&f.projections, &a, &ev, &building::<H>(&name, &main, 2)).await;
    match f
        .projections
        .swap_generation(&name, 2, SwapCheck::Agrees)
        .await
        .expect("swap")
    {
        SwapOutcome::Behind { streams } => {
            assert_eq!((streams[0].live, streams[0].building), (2, 3), "{streams:?}")
        }
        other => panic!("a generation ahead is not level: {other:?}"),
    }
    apply_ok(&f.projections, &a, &ev[2..], &live).await;
    let out = f
        .projections
        .swap_generation(&name, 2, SwapCheck::Agrees)
        .await
        .expect("swap");
    assert!(
        matches!(out, SwapOutcome::Swapped { from: 1, to: 2, .. }),
        "{out:?}"
    );

    // Another code: level, but different documents.
    let other = tally("agreed", 2, 7);
    f.projections.begin_generation(&name, 1, 2).await.expect("begin");
    apply_ok(&f.projections, &a, &ev, &building::<H>(&name, &other, 3)).await;
    match f
        .projections
        .swap_generation(&name, 3, SwapCheck::Agrees)
        .await
        .expect("swap")
    {
        SwapOutcome::Differs { live, building } => {
            assert_ne!(live, building);
            assert_ne!(live, RunningDigest::EMPTY);
        }
        other => panic!("different documents must not be promoted: {other:?}"),
    }
    assert_eq!(read(&f, &name, "a").await, Some(3), "nothing changed");
    let out = f
        .projections
        .swap_generation(&name, 3, SwapCheck::AgreesOrForced)
        .await
        .expect("forced");
    assert!(
        matches!(
            out,
            SwapOutcome::Swapped {
                from: 2,
                to: 3,
                epoch: 2
            }
        ),
        "{out:?}"
    );
    assert_eq!(read(&f, &name, "a").await, Some(21), "forced in");
}
