//! Generations of a view projection (ADR 0021): a live one that readers and
//! workers use, and at most one being built beside it, swapped in one
//! transaction.
//!
//! Generation 1 is stored under the projection's own name, so a projection
//! that never had another generation is stored exactly as before. Generation
//! `n > 1` is stored under `name@g<n>` ([`generation_storage`]): its own
//! documents, checkpoints and running digest. A projection name that looks
//! like a generation's storage name is refused where projections are
//! registered ([`validate_generation_base`]).

use std::future::Future;

use serde::Serialize;

use crate::{Error, ProjectionName, Result, RunningDigest, StreamId, Timestamp};

/// The suffix that separates a projection's name from a generation number
/// in a storage name.
const MARK: &str = "@g";

/// The largest generation number.
pub const MAX_GENERATION: u32 = 999_999;

/// The name generation `generation` of `projection` is stored under:
/// the name itself for generation 1, `name@g<n>` after it.
///
/// # Errors
/// `InvalidInput` for generation 0 or one above [`MAX_GENERATION`], or a
/// name too long to carry the suffix.
pub fn generation_storage(projection: &ProjectionName, generation: u32) -> Result<ProjectionName> {
    if generation == 0 || generation > MAX_GENERATION {
        return Err(Error::invalid(format_args!(
            "generation {generation} of projection `{projection}` is out of range (1..={MAX_GENERATION})"
        )));
    }
    if generation == 1 {
        return Ok(projection.clone());
    }
    ProjectionName::new(format!("{projection}{MARK}{generation}"))
}

/// Splits a storage name into its projection's name and generation:
/// `("name", n)` for `name@g<n>` (n > 1, no leading zero), `(name, 1)`
/// otherwise.
pub fn split_generation(storage: &str) -> (&str, u32) {
    if let Some(at) = storage.rfind(MARK) {
        let (base, digits) = (&storage[..at], &storage[at + MARK.len()..]);
        let canonical = !digits.is_empty()
            && !digits.starts_with('0')
            && digits.len() <= 6
            && digits.bytes().all(|b| b.is_ascii_digit());
        if canonical
            && !base.is_empty()
            && let Ok(n) = digits.parse::<u32>()
            && n > 1
        {
            return (base, n);
        }
    }
    (storage, 1)
}

/// Refuses a projection name that is some projection's generation storage
/// name (`name@g<n>`): registering it would mix its documents with that
/// generation's.
pub fn validate_generation_base(projection: &ProjectionName) -> Result<()> {
    let (base, generation) = split_generation(projection.as_str());
    if generation > 1 {
        return Err(Error::invalid(format_args!(
            "projection name `{projection}` is reserved: it is how generation {generation} of projection \
             `{base}` is stored (names ending in {MARK}<number> are not allowed)"
        )));
    }
    Ok(())
}

/// One projection's generations, as the projection database records them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GenerationInfo {
    /// The projection.
    pub projection: ProjectionName,
    /// The generation readers and workers use.
    pub live: u32,
    /// The version of the code that built the live generation
    /// ([`ViewProjection::version`](crate::ViewProjection::version)).
    pub live_version: u32,
    /// Raised by every swap: an apply that resolved the live generation
    /// before a swap cannot commit after it.
    pub epoch: u64,
    /// The generation being built, if any.
    pub building: Option<u32>,
    /// The version of the code building it.
    pub building_version: Option<u32>,
    /// The global journal position the build has applied through.
    pub building_position: u64,
    /// The highest generation number ever given out.
    pub last_generation: u32,
    /// When the record last changed (database clock).
    pub updated_at: Timestamp,
}

impl GenerationInfo {
    /// The storage name of the live generation.
    pub fn live_storage(&self) -> Result<ProjectionName> {
        generation_storage(&self.projection, self.live)
    }

    /// The storage name of the generation being built, if any.
    pub fn building_storage(&self) -> Result<Option<ProjectionName>> {
        self.building
            .map(|g| generation_storage(&self.projection, g))
            .transpose()
    }
}

/// What [`GenerationStore::begin_generation`] does with a record, decided
/// once for every adapter ([`plan_build`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildPlan {
    /// The generation being built is of the version asked for: resume it.
    Resume,
    /// Start generation `generation` (stored under `storage`, which is
    /// cleared first).
    New {
        /// The new generation's number.
        generation: u32,
        /// Its storage name.
        storage: ProjectionName,
    },
}

/// Decides [`GenerationStore::begin_generation`] for `record`: resume a
/// build of `version`, refuse one of another version (`InvalidState` naming
/// it and how to drop it), or give out the next number.
pub fn plan_build(record: &GenerationInfo, version: u32) -> Result<BuildPlan> {
    let projection = &record.projection;
    if let Some(building) = record.building {
        if record.building_version == Some(version) {
            return Ok(BuildPlan::Resume);
        }
        return Err(Error::InvalidState(format!(
            "generation {building} of projection `{projection}` is being built by version {}, not {version}: \
             drop it first (`outbox generations drop --projection {projection} --generation {building}`)",
            record.building_version.unwrap_or(0)
        )));
    }
    let generation = record
        .last_generation
        .max(record.live)
        .checked_add(1)
        .ok_or_else(|| Error::invalid("generation numbers are exhausted"))?;
    Ok(BuildPlan::New {
        generation,
        storage: generation_storage(projection, generation)?,
    })
}

/// Checks [`GenerationStore::drop_generation`] of `generation` against the
/// projection's record (`None`: it has none) and returns the storage name to
/// clear: the live generation is `InvalidState`, one never given out
/// `NotFound`.
pub fn plan_drop(
    projection: &ProjectionName,
    record: Option<&GenerationInfo>,
    generation: u32,
) -> Result<ProjectionName> {
    let (live, last) = record.map_or((1, 1), |r| (r.live, r.last_generation));
    if generation == live {
        return Err(Error::InvalidState(format!(
            "generation {generation} of projection `{projection}` is live: it cannot be dropped"
        )));
    }
    if generation == 0 || generation > last {
        return Err(Error::NotFound(format!(
            "generation {generation} of projection `{projection}` (given out: 1..={last})"
        )));
    }
    generation_storage(projection, generation)
}

/// The refusal of a call about a generation that is not being built.
pub fn not_building(projection: &ProjectionName, generation: u32) -> Error {
    Error::InvalidState(format!(
        "generation {generation} of projection `{projection}` is not being built (swapped, dropped, or never begun)"
    ))
}

/// The running digest of `d` for a comparing swap: `InvalidState` when its
/// documents predate running digests.
pub fn comparable_digest(d: &crate::ViewDigest) -> Result<RunningDigest> {
    d.digest.ok_or_else(|| {
        Error::InvalidState(format!(
            "`{}` holds documents older than running digests, so it cannot be compared: \
             rebuild it, or promote with --force",
            d.projection
        ))
    })
}

/// One generation's stored state: what `outbox generations` lists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StoredGeneration {
    /// The generation.
    pub generation: u32,
    /// Where it is stored.
    pub storage: ProjectionName,
    /// Its checkpoints (streams applied).
    pub streams: u64,
    /// The sum of its checkpoints (events applied, audit-only included).
    pub events: u64,
    /// Its running digest, documents and last event
    /// ([`ViewDigest::empty`](crate::ViewDigest::empty) when it has none).
    pub digest: crate::ViewDigest,
}

/// A stream on which the two generations of a swap have not applied the
/// same events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StreamBehind {
    /// The stream.
    pub stream: StreamId,
    /// The live generation's checkpoint.
    pub live: u64,
    /// The new generation's checkpoint.
    pub building: u64,
}

/// What a swap needs before it switches generations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwapCheck {
    /// The new generation has applied at least what the live one has, on
    /// every stream (a blue/green rebuild).
    CaughtUp,
    /// Both have applied exactly the same events on every stream and their
    /// running digests are equal (promoting a shadow version).
    Agrees,
    /// The same checkpoints, digests not compared (`promote --force`).
    AgreesOrForced,
}

/// The outcome of [`GenerationStore::swap_generation`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum SwapOutcome {
    /// The new generation is live; the old one is kept.
    Swapped {
        /// The generation that was live.
        from: u32,
        /// The generation now live.
        to: u32,
        /// The new epoch.
        epoch: u64,
    },
    /// Nothing changed: on these streams (at most a page of them) the
    /// generations' checkpoints differ as the check does not allow. The
    /// caller applies the missing events and asks again.
    Behind {
        /// The streams, in stream order.
        streams: Vec<StreamBehind>,
    },
    /// Nothing changed: the generations applied the same events but their
    /// documents differ.
    Differs {
        /// The live generation's running digest.
        live: RunningDigest,
        /// The new generation's.
        building: RunningDigest,
    },
}

/// The projection database's record of generations (ADR 0021).
///
/// # Contract
/// - `generation` returns the projection's record, `None` when it never had
///   a second generation (then generation 1, its own name, is live).
///   `generations` returns every record, ordered by projection.
/// - `begin_generation` returns the projection's generation being built if
///   it is being built with `version` (a resumed build), and otherwise gives
///   out a new number (one above any given out before), deletes whatever is
///   stored under its storage name, and records it as building with
///   `version`, creating the record (live 1 at `live_version`, epoch 0) if
///   needed. A build with another version is `InvalidState` naming it. After
///   it returns, every apply transaction that commits a checkpoint of the
///   projection is fenced by the record's epoch.
/// - `record_build_position` sets the build's position if `generation` is
///   still the one being built (`InvalidState` otherwise).
/// - `swap_generation` is one transaction that waits for every apply of the
///   projection in progress and holds off new ones: it compares the live and
///   the building generation's checkpoints on every stream and returns
///   [`SwapOutcome::Behind`] (at most 1,000 streams) when they differ as
///   `check` forbids, [`SwapOutcome::Differs`] when `check` is `Agrees` and
///   the running digests differ, and otherwise makes `generation` live (at
///   its building version), raises the epoch and clears the build. An apply
///   transaction that resolved the live generation before the swap and
///   commits after it fails its checkpoint compare-and-set and writes
///   nothing. `generation` not being built is `InvalidState`.
/// - `drop_generation` deletes a generation's documents, checkpoints and
///   running digest and returns how many documents it deleted; dropping the
///   building generation also ends the build. Dropping the live generation
///   is `InvalidState`; a generation never given out is `NotFound`.
/// - `stored_generations` lists, for each of the projection's generations
///   that has checkpoints or a running digest, what is stored, in
///   generation order.
///
/// An optional capability (ADR 0035): the defaults read no records and
/// refuse every write with [`Error::Unsupported`] (no blue/green rebuild;
/// every projection stays in its first generation).
pub trait GenerationStore: Send + Sync {
    /// One projection's record.
    fn generation(
        &self,
        projection: &ProjectionName,
    ) -> impl Future<Output = Result<Option<GenerationInfo>>> + Send {
        let _ = projection;
        async { Ok(None) }
    }

    /// Every record.
    fn generations(&self) -> impl Future<Output = Result<Vec<GenerationInfo>>> + Send {
        async { Ok(Vec::new()) }
    }

    /// Starts (or resumes) building a new generation.
    fn begin_generation(
        &self,
        projection: &ProjectionName,
        live_version: u32,
        version: u32,
    ) -> impl Future<Output = Result<GenerationInfo>> + Send {
        let _ = (projection, live_version, version);
        async { no_generations() }
    }

    /// Records how far the build has read the journal.
    fn record_build_position(
        &self,
        projection: &ProjectionName,
        generation: u32,
        position: u64,
    ) -> impl Future<Output = Result<()>> + Send {
        let _ = (projection, generation, position);
        async { no_generations() }
    }

    /// Makes the building generation live, if `check` allows.
    fn swap_generation(
        &self,
        projection: &ProjectionName,
        generation: u32,
        check: SwapCheck,
    ) -> impl Future<Output = Result<SwapOutcome>> + Send {
        let _ = (projection, generation, check);
        async { no_generations() }
    }

    /// Deletes a generation that is not live.
    fn drop_generation(
        &self,
        projection: &ProjectionName,
        generation: u32,
    ) -> impl Future<Output = Result<u64>> + Send {
        let _ = (projection, generation);
        async { no_generations() }
    }

    /// What each generation of the projection holds.
    fn stored_generations(
        &self,
        projection: &ProjectionName,
    ) -> impl Future<Output = Result<Vec<StoredGeneration>>> + Send {
        let _ = projection;
        async { Ok(Vec::new()) }
    }
}

/// What a [`GenerationStore`] without the capability answers to a write.
fn no_generations<T>() -> Result<T> {
    Err(Error::Unsupported(
        "generations: this projection store builds no second generation of a projection".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ProjectionName {
        ProjectionName::new(s).unwrap()
    }

    #[test]
    fn storage_names_round_trip() {
        let p = name("orders");
        assert_eq!(generation_storage(&p, 1).unwrap(), p);
        let g7 = generation_storage(&p, 7).unwrap();
        assert_eq!(g7.as_str(), "orders@g7");
        assert_eq!(split_generation(g7.as_str()), ("orders", 7));
        assert_eq!(split_generation("orders"), ("orders", 1));
        assert!(generation_storage(&p, 0).is_err());
        assert!(generation_storage(&p, MAX_GENERATION + 1).is_err());
    }

    #[test]
    fn only_canonical_suffixes_are_generations() {
        for plain in ["a@g", "a@g1", "a@g01", "@g2", "a@gx", "a@g1234567", "mail@gmail"] {
            assert_eq!(split_generation(plain), (plain, 1), "{plain}");
            assert!(validate_generation_base(&name(plain)).is_ok(), "{plain}");
        }
        assert_eq!(split_generation("a@g2@g3"), ("a@g2", 3));
        let err = validate_generation_base(&name("orders@g2"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("generation 2 of projection `orders`"), "{err}");
    }
}
