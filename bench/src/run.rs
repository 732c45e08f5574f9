//! What the workloads share within one run: its sizes and the context
//! they record their rows and reference rates in. A leaf beside main.rs,
//! which runs the workloads.

use std::path::PathBuf;

use crate::report::Row;

/// Sizes of a run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizes {
    /// Events per append and drain round.
    pub(crate) events: u64,
    /// Streams of the "many streams × 2 events" drain.
    pub(crate) many_streams: u64,
    /// Backlog sizes of the claim and RSS workloads.
    pub(crate) backlogs: [u64; 2],
    /// Seconds of the open-loop lag run.
    pub(crate) lag_seconds: u64,
}

impl Sizes {
    /// The sizes of a full run, or of a `--quick` one.
    pub(crate) fn of(quick: bool) -> Self {
        if quick {
            Sizes {
                events: 2_000,
                many_streams: 1_000,
                backlogs: [1_000, 10_000],
                lag_seconds: 2,
            }
        } else {
            Sizes {
                events: 20_000,
                many_streams: 10_000,
                backlogs: [1_000, 1_000_000],
                lag_seconds: 10,
            }
        }
    }
}

/// What the workloads share within one run.
pub(crate) struct Ctx {
    pub(crate) sizes: Sizes,
    pub(crate) tmp: PathBuf,
    pub(crate) rows: Vec<Row>,
    /// The raw engine loop's 100-per-transaction append rate (events/s).
    pub(crate) raw_append_100: Option<f64>,
    /// The outbox's batch-64 drain rate over 100 streams (events/s).
    pub(crate) drain_64: Option<f64>,
    /// The outbox's 100-per-call append rate (events/s).
    pub(crate) append_100: Option<f64>,
    /// Pre-filled outbox backlogs (journal and projection files) by size,
    /// kept from the claim workload for the RSS workload.
    pub(crate) backlogs: Vec<(u64, tempfile::TempDir)>,
}
