//! Generations of view projections in memory (ADR 0021). Every call holds
//! the store's one lock, which also serializes it with every apply.

use std::sync::Arc;

use outbox_core::spi::{BuildPlan, GenerationMap, comparable_digest, not_building, plan_build, plan_drop};
use outbox_core::{
    Error, GenerationInfo, GenerationStore, ProjectionName, Result, StoredGeneration, StreamBehind,
    SwapCheck, SwapOutcome, generation_storage,
};

use crate::projection::{MemoryProjectionStore, State};

/// The most streams a [`SwapOutcome::Behind`] lists.
const BEHIND_PAGE: usize = 1000;

impl State {
    fn refresh_live(&mut self) -> Result<()> {
        self.live = Arc::new(GenerationMap::from_records(self.generations.values().cloned())?);
        Ok(())
    }
}

impl GenerationStore for MemoryProjectionStore {
    async fn generation(&self, projection: &ProjectionName) -> Result<Option<GenerationInfo>> {
        Ok(self.state.lock().await.generations.get(projection).cloned())
    }

    async fn generations(&self) -> Result<Vec<GenerationInfo>> {
        Ok(self.state.lock().await.generations.values().cloned().collect())
    }

    async fn begin_generation(
        &self,
        projection: &ProjectionName,
        live_version: u32,
        version: u32,
    ) -> Result<GenerationInfo> {
        let now = self.clock.now();
        let mut st = self.state.lock().await;
        let record = st
            .generations
            .entry(projection.clone())
            .or_insert_with(|| GenerationInfo {
                projection: projection.clone(),
                live: 1,
                live_version,
                epoch: 0,
                building: None,
                building_version: None,
                building_position: 0,
                last_generation: 1,
                updated_at: now,
            })
            .clone();
        let BuildPlan::New {
            generation: next,
            storage,
        } = plan_build(&record, version)?
        else {
            return Ok(record);
        };
        st.clear_storage(&storage);
        let r = st
            .generations
            .get_mut(projection)
            .ok_or_else(|| Error::NotFound(format!("generation record of `{projection}`")))?;
        r.building = Some(next);
        r.building_version = Some(version);
        r.building_position = 0;
        r.last_generation = next;
        r.updated_at = now;
        let out = r.clone();
        st.refresh_live()?;
        Ok(out)
    }

    async fn record_build_position(
        &self,
        projection: &ProjectionName,
        generation: u32,
        position: u64,
    ) -> Result<()> {
        let now = self.clock.now();
        let mut st = self.state.lock().await;
        let r = st
            .generations
            .get_mut(projection)
            .filter(|r| r.building == Some(generation))
            .ok_or_else(|| not_building(projection, generation))?;
        r.building_position = position;
        r.updated_at = now;
        Ok(())
    }

    async fn swap_generation(
        &self,
        projection: &ProjectionName,
        generation: u32,
        check: SwapCheck,
    ) -> Result<SwapOutcome> {
        let now = self.clock.now();
        let mut st = self.state.lock().await;
        let record = st
            .generations
            .get(projection)
            .filter(|r| r.building == Some(generation))
            .cloned()
            .ok_or_else(|| not_building(projection, generation))?;
        let live = record.live_storage()?;
        let new = generation_storage(projection, generation)?;
        let (lc, nc) = (st.checkpoints_of(&live), st.checkpoints_of(&new));
        let mut streams: Vec<&outbox_core::StreamId> = lc.keys().chain(nc.keys()).copied().collect();
        streams.sort();
        streams.dedup();
        let behind: Vec<StreamBehind> = streams
            .into_iter()
            .map(|s| {
                (
                    s,
                    lc.get(s).copied().unwrap_or(0),
                    nc.get(s).copied().unwrap_or(0),
                )
            })
            .filter(|(_, l, n)| {
                if check == SwapCheck::CaughtUp {
                    n < l
                } else {
                    n != l
                }
            })
            .take(BEHIND_PAGE)
            .map(|(s, live, building)| StreamBehind {
                stream: s.clone(),
                live,
                building,
            })
            .collect();
        if !behind.is_empty() {
            return Ok(SwapOutcome::Behind { streams: behind });
        }
        if check == SwapCheck::Agrees {
            let a = comparable_digest(&st.digest_of(&live))?;
            let b = comparable_digest(&st.digest_of(&new))?;
            if a != b {
                return Ok(SwapOutcome::Differs { live: a, building: b });
            }
        }
        let r = st
            .generations
            .get_mut(projection)
            .ok_or_else(|| not_building(projection, generation))?;
        r.live = generation;
        r.live_version = r.building_version.unwrap_or(r.live_version);
        r.epoch += 1;
        r.building = None;
        r.building_version = None;
        r.building_position = 0;
        r.updated_at = now;
        // The new generation applied every event, the skipped ones included.
        st.clear_skips(projection);
        st.refresh_live()?;
        Ok(SwapOutcome::Swapped {
            from: record.live,
            to: generation,
            epoch: record.epoch + 1,
        })
    }

    async fn drop_generation(&self, projection: &ProjectionName, generation: u32) -> Result<u64> {
        let now = self.clock.now();
        let mut st = self.state.lock().await;
        let record = st.generations.get(projection);
        let building = record.and_then(|r| r.building);
        let storage = plan_drop(projection, record, generation)?;
        let docs = st.clear_storage(&storage);
        if building == Some(generation)
            && let Some(r) = st.generations.get_mut(projection)
        {
            r.building = None;
            r.building_version = None;
            r.building_position = 0;
            r.updated_at = now;
        }
        Ok(docs)
    }

    async fn stored_generations(&self, projection: &ProjectionName) -> Result<Vec<StoredGeneration>> {
        let st = self.state.lock().await;
        let (live, building, last) = st
            .generations
            .get(projection)
            .map_or((1, None, 1), |r| (r.live, r.building, r.last_generation));
        let mut out = Vec::new();
        for generation in 1..=last {
            let storage = generation_storage(projection, generation)?;
            let cps = st.checkpoints_of(&storage);
            let digest = st.digest_of(&storage);
            let kept = !cps.is_empty() || digest.updated_at.is_some();
            if kept || generation == live || building == Some(generation) {
                out.push(StoredGeneration {
                    generation,
                    streams: cps.len() as u64,
                    events: cps.values().sum(),
                    storage,
                    digest,
                });
            }
        }
        Ok(out)
    }
}
