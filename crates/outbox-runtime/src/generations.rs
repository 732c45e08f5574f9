//! Generations of view projections (ADR 0021): blue/green rebuilds, shadow
//! builds of a candidate version, promotion, and the per-stream comparison
//! of two versions.
//!
//! A generation is built from the journal in global-position order, like a
//! catch-up run, into its own storage name, while the live generation keeps
//! serving readers and taking the workers' applies. The build records its
//! position after every page, so a killed build resumes where it stopped
//! (the checkpoints skip what it applied after the last recorded page).
//! The swap is one projection-database transaction that waits for the
//! applies in progress; when the new generation is behind on some stream the
//! store says which, the build applies those events and asks again.

use std::sync::Arc;

use outbox_core::{
    Error, Event, EventJournal, GenerationInfo, GenerationStore, Intent, Projection, ProjectionName,
    ProjectionStore, Result, RunningDigest, StoredGeneration, StreamBehind, StreamId, SwapCheck, SwapOutcome,
    ViewProjection, generation_projection, generation_storage, view_projection,
};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::outbox::{JournalBackend, Outbox, ProjectionBackend};
use crate::replay::by_stream;
use crate::scratch::{Scratch, first_difference};

/// How many times a swap asks again after catching up the streams it was
/// told are behind, before giving up (the live generation keeps moving).
const MAX_SWAP_ROUNDS: u32 = 100;

/// The most differing streams [`Outbox::shadow_diff`] lists by default.
pub const DEFAULT_DIFF_LIMIT: usize = 20;

/// What building a generation did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GenerationBuild {
    /// The projection.
    pub projection: ProjectionName,
    /// The generation built.
    pub generation: u32,
    /// Where it is stored.
    pub storage: ProjectionName,
    /// The version of the code that built it.
    pub version: u32,
    /// The global position the build started from (above 0: a resumed build).
    pub from_position: u64,
    /// The global position it has applied through.
    pub position: u64,
    /// Events this call applied (audit-only ones included).
    pub applied: u64,
    /// Whether it stopped early because it was cancelled.
    pub cancelled: bool,
}

/// What a blue/green rebuild or a promotion did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Swap {
    /// The build (or the catch-up of the shadow generation) before the swap.
    pub build: GenerationBuild,
    /// The generation that was live.
    pub from: u32,
    /// The generation now live.
    pub to: u32,
    /// The generation record's new epoch.
    pub epoch: u64,
    /// How many times the swap was asked for.
    pub rounds: u32,
    /// Events applied between the asks, to bring the generations level.
    pub caught_up: u64,
}

/// One stream on which two versions of a projection disagree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StreamDiff {
    /// The stream.
    pub stream: StreamId,
    /// Its events compared.
    pub events: u64,
    /// How many documents differ.
    pub documents: u64,
    /// The first differing document: table, key, and the live code's and
    /// the candidate's JSON (`None`: absent).
    pub table: String,
    /// Its key.
    pub key: String,
    /// The live code's document.
    pub live: Option<String>,
    /// The candidate's document.
    pub candidate: Option<String>,
    /// An error one of the versions returned on the stream (then the
    /// documents are as of the event before it).
    pub error: Option<String>,
}

/// The report of [`Outbox::shadow_diff`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShadowDiff {
    /// The projection.
    pub projection: ProjectionName,
    /// The live code's version.
    pub live_version: u32,
    /// The candidate's version.
    pub candidate_version: u32,
    /// Streams compared.
    pub streams: u64,
    /// Streams on which the two disagree, in stream order (at most the
    /// limit asked for).
    pub differing: Vec<StreamDiff>,
    /// Whether the comparison stopped at the limit.
    pub truncated: bool,
    /// What each generation of the projection holds: its checkpoints and
    /// running digest (the shadow generation's too, if one is built).
    pub generations: Vec<StoredGeneration>,
    /// The generation record, if the projection has one.
    pub record: Option<GenerationInfo>,
}

impl ShadowDiff {
    /// Whether the two versions agreed on every stream compared.
    pub fn agrees(&self) -> bool {
        self.differing.is_empty()
    }
}

/// Blue/green generations of view projections (ADR 0021): builds a
/// candidate beside the live version, compares them, swaps and drops.
pub(crate) struct Generations<'a, J, P: ProjectionStore> {
    rt: &'a Outbox<J, P>,
}

impl<J: JournalBackend, P: ProjectionBackend> Outbox<J, P> {
    /// The generations service of this runtime.
    pub(crate) fn generations(&self) -> Generations<'_, J, P> {
        Generations { rt: self }
    }

    /// Blue/green rebuild of a view projection (ADR 0021): builds a new
    /// generation from the journal with the registered code while the live
    /// one keeps serving and being applied, catches it up to the tail, and
    /// swaps it in in one transaction. The old generation is kept until
    /// [`outbox_core::GenerationStore::drop_generation`].
    /// A killed rebuild leaves the live generation serving; calling this
    /// again resumes the build from its recorded position.
    ///
    /// # Errors
    /// `NotFound` for an unknown projection, `InvalidInput` for a
    /// hand-written one, `InvalidState` when another version is being built
    /// (a shadow build) or the build cannot catch up, and what the stores
    /// return. A cancelled build returns `Ok` with `build.cancelled` and no
    /// swap (`from == to`).
    pub async fn rebuild_blue_green(&self, projection: &str, cancel: &CancellationToken) -> Result<Swap> {
        self.generations().rebuild_blue_green(projection, cancel).await
    }

    /// Builds (or brings up to the journal's tail) the shadow generation of
    /// `projection` with its registered candidate version, beside the live
    /// one; nothing reads it until [`promote`](Self::promote).
    pub async fn shadow_build(
        &self,
        projection: &str,
        cancel: &CancellationToken,
    ) -> Result<GenerationBuild> {
        self.generations().shadow_build(projection, cancel).await
    }

    /// Promotes the generation being built (a candidate's shadow
    /// generation, or an unfinished blue/green build): brings it to the
    /// journal's tail, levels both generations' checkpoints, and swaps only
    /// when their running digests agree (`force`: whatever they are).
    ///
    /// # Errors
    /// `InvalidState` when nothing is being built, and when the digests
    /// differ, naming the first stream on which the candidate's documents
    /// differ from the live code's; nothing is changed then.
    pub async fn promote(&self, projection: &str, force: bool, cancel: &CancellationToken) -> Result<Swap> {
        self.generations().promote(projection, force, cancel).await
    }

    /// Compares the live code of a view projection with its registered
    /// candidate, stream by stream: each stream's events are applied to
    /// each version in memory (nothing is written) and the documents
    /// compared. Stops after `limit` differing streams. Also returns what
    /// each stored generation holds, so the shadow generation's running
    /// digest can be read beside the live one's.
    pub async fn shadow_diff(&self, projection: &str, limit: usize) -> Result<ShadowDiff> {
        self.generations().shadow_diff(projection, limit).await
    }
}

impl<J: JournalBackend, P: ProjectionBackend> Generations<'_, J, P> {
    /// The registered view projection `name` (its live code).
    fn view_code(&self, name: &str) -> Result<Arc<dyn ViewProjection>> {
        if let Some(v) = self.rt.inner.views.iter().find(|(n, _)| n.as_str() == name) {
            return Ok(Arc::clone(v.1));
        }
        // A `Projection<Tx>` may write tables of its own: one storage name
        // cannot hold a second generation of them.
        self.rt.projection(name)?;
        Err(Error::invalid(format_args!(
            "projection `{name}` is registered as a Projection<Tx> (OutboxBuilder::projection): generations, \
             blue/green rebuilds and shadow versions are for view projections registered with \
             OutboxBuilder::view"
        )))
    }

    /// The registered candidate version of `name`.
    fn candidate_code(&self, name: &str) -> Result<Arc<dyn ViewProjection>> {
        self.view_code(name)?;
        self.rt
            .inner
            .candidates
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, c)| Arc::clone(c))
            .ok_or_else(|| {
                Error::invalid(format_args!(
                    "projection `{name}` has no candidate version registered (OutboxBuilder::candidate)"
                ))
            })
    }

    /// The registered code (live or candidate) of `version`.
    fn code_of_version(&self, name: &str, version: u32) -> Result<Arc<dyn ViewProjection>> {
        let main = self.view_code(name)?;
        let candidate = self.candidate_code(name).ok();
        [Some(main.clone()), candidate.clone()]
            .into_iter()
            .flatten()
            .find(|c| c.version() == version)
            .ok_or_else(|| {
                Error::InvalidState(format!(
                    "the generation of projection `{name}` being built is version {version}, and this program \
                     registers version {}{}: run the program that has that version, or drop the generation",
                    main.version(),
                    candidate
                        .map(|c| format!(" (candidate {})", c.version()))
                        .unwrap_or_default()
                ))
            })
    }

    /// Builds (or resumes building) a new generation of `projection` with
    /// `code`, to the journal's tail.
    async fn build_generation(
        &self,
        projection: &ProjectionName,
        code: Arc<dyn ViewProjection>,
        cancel: &CancellationToken,
    ) -> Result<(GenerationBuild, Vec<Arc<dyn Projection<P::Tx>>>)> {
        let live_version = self.view_code(projection.as_str())?.version();
        let version = code.version();
        let record = self
            .rt
            .inner
            .store
            .begin_generation(projection, live_version, version)
            .await?;
        let generation = record
            .building
            .ok_or_else(|| Error::InvalidState(format!("no generation of `{projection}` is being built")))?;
        let storage = generation_storage(projection, generation)?;
        let one = crate::panic::catch_panics(vec![generation_projection(code, storage.clone())]);
        info!(projection = %projection, generation, version, from = record.building_position,
            "building a generation");
        let mut build = GenerationBuild {
            projection: projection.clone(),
            generation,
            storage,
            version,
            from_position: record.building_position,
            position: record.building_position,
            applied: 0,
            cancelled: false,
        };
        loop {
            if cancel.is_cancelled() {
                build.cancelled = true;
                break;
            }
            let page: Vec<Event> = self
                .rt
                .inner
                .journal
                .read_global(build.position, self.rt.config().batch_size)
                .await?;
            let Some(through) = page.last().map(|e| e.global_position) else {
                break;
            };
            let runs = by_stream(page);
            build.applied += self.rt.replayer().apply_page(None, None, &runs, &one).await?;
            crate::failpoint::failpoint("build_page");
            self.rt
                .inner
                .store
                .record_build_position(projection, generation, through)
                .await?;
            crate::failpoint::failpoint("build_position");
            build.position = through;
        }
        info!(projection = %projection, generation, applied = build.applied, position = build.position,
            cancelled = build.cancelled, "generation built to the journal's tail");
        Ok((build, one))
    }

    /// Asks the store to swap `generation` in until it does (or refuses for
    /// differing digests), catching up the streams it says are behind.
    async fn swap_in(
        &self,
        build: GenerationBuild,
        building: &[Arc<dyn Projection<P::Tx>>],
        check: SwapCheck,
    ) -> Result<std::result::Result<Swap, (RunningDigest, RunningDigest)>> {
        let projection = build.projection.clone();
        let live = [self.rt.projection(projection.as_str())?];
        let mut caught_up = 0;
        for round in 1..=MAX_SWAP_ROUNDS {
            crate::failpoint::failpoint("before_swap");
            match self
                .rt
                .inner
                .store
                .swap_generation(&projection, build.generation, check)
                .await?
            {
                SwapOutcome::Swapped { from, to, epoch } => {
                    crate::failpoint::failpoint("after_swap");
                    info!(projection = %projection, from, to, epoch, rounds = round, caught_up,
                        "generation swapped in");
                    return Ok(Ok(Swap {
                        build,
                        from,
                        to,
                        epoch,
                        rounds: round,
                        caught_up,
                    }));
                }
                SwapOutcome::Differs { live, building } => return Ok(Err((live, building))),
                SwapOutcome::Behind { streams } => {
                    for StreamBehind {
                        stream,
                        live: l,
                        building: b,
                    } in streams
                    {
                        caught_up += if b < l {
                            self.rt
                                .replayer()
                                .catch_up_stream(&stream, b + 1, l, None, building)
                                .await?
                        } else {
                            self.rt
                                .replayer()
                                .catch_up_stream(&stream, l + 1, b, None, &live)
                                .await?
                        };
                    }
                }
            }
        }
        Err(Error::InvalidState(format!(
            "the generations of `{projection}` were still apart after {MAX_SWAP_ROUNDS} rounds of catching up: \
             the live generation moves faster than the build catches up; try again when appends slow down"
        )))
    }

    /// [`Outbox::rebuild_blue_green`]: builds a new generation of the view
    /// projection and swaps it in once caught up.
    pub(crate) async fn rebuild_blue_green(
        &self,
        projection: &str,
        cancel: &CancellationToken,
    ) -> Result<Swap> {
        let code = self.view_code(projection)?;
        let name = code.name().clone();
        self.rt
            .replayer()
            .while_registered(async {
                let (build, one) = self.build_generation(&name, code, cancel).await?;
                if build.cancelled {
                    return Ok(unswapped(build));
                }
                self.swap_in(build, &one, SwapCheck::CaughtUp)
                    .await?
                    .map_err(|_| Error::InvalidState("a blue/green swap compared digests".into()))
            })
            .await
    }

    /// [`Outbox::shadow_build`]: builds the candidate code's generation
    /// beside the live one, without swapping.
    pub(crate) async fn shadow_build(
        &self,
        projection: &str,
        cancel: &CancellationToken,
    ) -> Result<GenerationBuild> {
        let code = self.candidate_code(projection)?;
        let name = code.name().clone();
        self.rt
            .replayer()
            .while_registered(async { Ok(self.build_generation(&name, code, cancel).await?.0) })
            .await
    }

    /// [`Outbox::promote`]: swaps the generation being built in once its
    /// running digest agrees with the live one's (`force`: whatever it is).
    pub(crate) async fn promote(
        &self,
        projection: &str,
        force: bool,
        cancel: &CancellationToken,
    ) -> Result<Swap> {
        let main = self.view_code(projection)?;
        let name = main.name().clone();
        let record = self.rt.inner.store.generation(&name).await?;
        let version = record
            .as_ref()
            .and_then(|r| r.building_version)
            .ok_or_else(|| {
                Error::InvalidState(format!(
                    "no generation of projection `{name}` is being built: `outbox shadow build --projection {name}` \
                     builds the candidate's"
                ))
            })?;
        let code = self.code_of_version(projection, version)?;
        let check = if force {
            SwapCheck::AgreesOrForced
        } else {
            SwapCheck::Agrees
        };
        let swapped = self
            .rt
            .replayer()
            .while_registered(async {
                let (build, one) = self.build_generation(&name, code, cancel).await?;
                if build.cancelled {
                    return Ok(Ok(unswapped(build)));
                }
                self.swap_in(build, &one, check).await
            })
            .await?;
        match swapped {
            Ok(swap) => Ok(swap),
            Err((live, building)) => {
                let first = match self.shadow_diff(projection, 1).await {
                    Ok(d) => d.differing.first().map_or_else(
                        || {
                            "the candidate agrees with the live code stream by stream, so the difference is \
                            across streams"
                                .to_owned()
                        },
                        |s| {
                            format!(
                                "first differing stream `{}` (table {}, key {})",
                                s.stream, s.table, s.key
                            )
                        },
                    ),
                    Err(e) => format!("the per-stream comparison failed: {e}"),
                };
                Err(Error::InvalidState(format!(
                    "refused to promote `{name}`: the shadow generation's running digest {building} differs from \
                     the live one's {live} over the same events; {first}; `outbox shadow diff` lists them, \
                     --force promotes anyway"
                )))
            }
        }
    }

    /// [`Outbox::shadow_diff`]: the live code against its candidate, in
    /// memory, stream by stream, up to `limit` differing streams.
    pub(crate) async fn shadow_diff(&self, projection: &str, limit: usize) -> Result<ShadowDiff> {
        let main = self.view_code(projection)?;
        let candidate = self.candidate_code(projection)?;
        let name = main.name().clone();
        let page = self.rt.config().batch_size.max(1);
        let versions: Versions = [
            crate::panic::catch_panics(vec![view_projection::<Scratch>(Arc::clone(&main))]).remove(0),
            crate::panic::catch_panics(vec![view_projection::<Scratch>(Arc::clone(&candidate))]).remove(0),
        ];
        let mut diff = ShadowDiff {
            projection: name.clone(),
            live_version: main.version(),
            candidate_version: candidate.version(),
            streams: 0,
            differing: Vec::new(),
            truncated: false,
            generations: Vec::new(),
            record: None,
        };
        let mut after: Option<StreamId> = None;
        'streams: loop {
            let streams = self
                .rt
                .inner
                .journal
                .stream_versions(after.as_ref(), page)
                .await?;
            let Some(last) = streams.last() else { break };
            after = Some(last.stream.clone());
            for sv in streams {
                if sv.version == 0 {
                    continue;
                }
                if diff.differing.len() >= limit {
                    diff.truncated = true;
                    break 'streams;
                }
                diff.streams += 1;
                if let Some(d) = self.compare_stream(&sv.stream, &versions).await? {
                    diff.differing.push(d);
                }
            }
        }
        diff.generations = self.rt.inner.store.stored_generations(&name).await?;
        diff.record = self.rt.inner.store.generation(&name).await?;
        Ok(diff)
    }

    /// Applies one stream's events to both versions in memory and compares.
    async fn compare_stream(
        &self,
        stream: &StreamId,
        [live, candidate]: &Versions,
    ) -> Result<Option<StreamDiff>> {
        let (mut a, mut b) = (Scratch::default(), Scratch::default());
        let (mut next, mut events, mut error) = (1u64, 0u64, None);
        'read: loop {
            let page = self
                .rt
                .inner
                .journal
                .read_stream(
                    stream,
                    outbox_core::Seq::new(next)?,
                    self.rt.config().batch_size.max(1),
                )
                .await?;
            let Some(last) = page.last() else { break };
            next = last.seq.get() + 1;
            for e in &page {
                events += 1;
                if e.intent != Intent::Apply {
                    continue;
                }
                let (x, y) = (live.apply(&mut a, e).await, candidate.apply(&mut b, e).await);
                if x.is_err() && y.is_err() {
                    // Both stop here, as a worker would: compare what they left.
                    break 'read;
                }
                if x.is_err() || y.is_err() {
                    let say = |v: &str, r: &std::result::Result<(), outbox_core::BoxError>| {
                        r.as_ref()
                            .err()
                            .map(|err| format!("{v} failed at seq {}: {err}", e.seq))
                    };
                    error = Some(
                        [say("the live code", &x), say("the candidate", &y)]
                            .into_iter()
                            .flatten()
                            .collect::<Vec<_>>()
                            .join("; "),
                    );
                    break 'read;
                }
            }
        }
        let first = first_difference(&a, &b);
        if first.is_none() && error.is_none() {
            return Ok(None);
        }
        let d = first.unwrap_or_default();
        Ok(Some(StreamDiff {
            stream: stream.clone(),
            events,
            documents: d.documents,
            table: d.table,
            key: d.key,
            live: d.left,
            candidate: d.right,
            error,
        }))
    }
}

/// The live code and the candidate, applied to scratch stores.
type Versions = [Arc<dyn Projection<Scratch>>; 2];

/// The report of a build that was cancelled before its swap.
fn unswapped(build: GenerationBuild) -> Swap {
    Swap {
        from: 0,
        to: 0,
        epoch: 0,
        rounds: 0,
        caught_up: 0,
        build,
    }
}
