//! The live generations an apply transaction resolved (ADR 0021): adapter
//! plumbing, re-exported from [`spi`](crate::spi).

use std::collections::BTreeMap;

use crate::{GenerationInfo, ProjectionName, Result};

/// Where one projection's live generation is stored, as a transaction saw
/// it at its start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveGeneration {
    /// The storage name of the live generation.
    pub storage: ProjectionName,
    /// The version of the code that built it.
    pub version: u32,
    /// The record's epoch: the transaction's checkpoint compare-and-set
    /// holds only while the record still has it.
    pub epoch: u64,
}

/// The live generation of every projection that has a generation record,
/// carried by a transaction handle
/// ([`ViewStorage::generations`](crate::spi::ViewStorage::generations)).
/// A projection without a record is stored under its own name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GenerationMap {
    entries: BTreeMap<ProjectionName, LiveGeneration>,
}

static EMPTY: GenerationMap = GenerationMap {
    entries: BTreeMap::new(),
};

impl GenerationMap {
    /// The map of a store without generation records.
    pub fn empty() -> &'static GenerationMap {
        &EMPTY
    }

    /// The map of these records.
    pub fn from_records(records: impl IntoIterator<Item = GenerationInfo>) -> Result<Self> {
        let mut entries = BTreeMap::new();
        for r in records {
            let live = LiveGeneration {
                storage: r.live_storage()?,
                version: r.live_version,
                epoch: r.epoch,
            };
            entries.insert(r.projection, live);
        }
        Ok(Self { entries })
    }

    /// Whether no projection has a record.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The projection's live generation, if it has a record.
    pub fn live(&self, projection: &ProjectionName) -> Option<&LiveGeneration> {
        self.entries.get(projection)
    }

    /// The name the projection's live documents and checkpoints are stored
    /// under: its own unless a record says otherwise.
    pub fn storage<'a>(&'a self, projection: &'a ProjectionName) -> &'a ProjectionName {
        self.entries.get(projection).map_or(projection, |l| &l.storage)
    }

    /// What fences a checkpoint stored under `storage`: the record's
    /// projection and the epoch this transaction expects of it. A storage
    /// name that is no projection's live generation in this map is fenced
    /// by its own (absent) record at epoch 0: a generation being built, or
    /// a projection without generations, or an old generation after a swap
    /// (whose record then has a higher epoch, so the write is refused).
    pub fn fence<'a>(&'a self, storage: &'a ProjectionName) -> (&'a ProjectionName, u64) {
        self.entries
            .iter()
            .find(|(_, l)| &l.storage == storage)
            .map_or((storage, 0), |(p, l)| (p, l.epoch))
    }
}
