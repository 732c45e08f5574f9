//! The monitor's stored figures (ADR 0036, amendment "pages read stored
//! figures"): what costs a scan per stream (the projections' checkpoint
//! lag) is computed by one background task at a bounded cadence, never by
//! a request. Pages and `/metrics` read the last computation and say when
//! it was made.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use outbox_core::{Error, OutboxSummary, Projection, Timestamp};
use outbox_runtime::JournalBackend;
use tokio_util::sync::CancellationToken;

use crate::backend::CliStore;
use crate::report::{LagReport, projection_lag};

/// One computation's figures.
#[derive(Debug)]
pub(super) struct Computed {
    /// When the computation began, on the database's clock (the figures are
    /// at least as new as this).
    pub as_of: Timestamp,
    /// How long it took.
    pub took: Duration,
    /// The outbox summary read as it began (the counts pages show past
    /// `--exact-rows`, instead of counting every row per request).
    pub summary: OutboxSummary,
    /// The projections' checkpoint lag (`None`: no projection registered,
    /// or `--lag-streams 0`).
    pub lag: Option<LagReport>,
}

/// What a page reads: the last computation, or why there is none yet.
#[derive(Debug, Default)]
struct Last {
    computed: Option<Arc<Computed>>,
    /// The last computation's error, when it failed (the figures before it
    /// are kept).
    error: Option<String>,
}

/// The last computed figures, and the one lock that keeps two computations
/// from running at once.
#[derive(Debug, Default)]
pub(super) struct Figures {
    last: Mutex<Last>,
    /// Held while a computation runs.
    running: tokio::sync::Mutex<()>,
    /// Computations finished (successful or not): the `/metrics` counter,
    /// and what a test counts to show that a request runs none.
    computations: AtomicU64,
}

/// A reading of [`Figures`]: cheap, no I/O.
#[derive(Debug, Clone)]
pub(super) struct Reading {
    pub computed: Option<Arc<Computed>>,
    pub error: Option<String>,
    pub computations: u64,
}

impl Figures {
    /// The last figures (a lock held for a clone of two fields).
    pub(super) fn read(&self) -> Reading {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        Reading {
            computed: last.computed.clone(),
            error: last.error.clone(),
            computations: self.computations.load(Ordering::Acquire),
        }
    }

    /// Computes the figures once and stores them; waits for a computation
    /// already running to finish first (never two at once). A failure is
    /// stored as the last error and returned; the figures before it stay.
    pub(super) async fn compute<J: JournalBackend, P: CliStore>(
        &self,
        journal: &J,
        store: &P,
        projections: &[Arc<dyn Projection<P::Tx>>],
        lag_streams: usize,
    ) -> Result<Arc<Computed>, Error> {
        let _running = self.running.lock().await;
        let started = Instant::now();
        let result: Result<Computed, Error> = async {
            let summary = journal.summary().await?;
            let as_of = summary.as_of;
            let lag = if projections.is_empty() || lag_streams == 0 {
                None
            } else {
                Some(projection_lag(journal, store, projections, lag_streams).await?)
            };
            Ok(Computed {
                as_of,
                took: started.elapsed(),
                summary,
                lag,
            })
        }
        .await;
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        self.computations.fetch_add(1, Ordering::AcqRel);
        match result {
            Ok(c) => {
                let c = Arc::new(c);
                last.computed = Some(c.clone());
                last.error = None;
                Ok(c)
            }
            Err(e) => {
                last.error = Some(e.to_string());
                Err(e)
            }
        }
    }
}

/// The background task: computes the figures, then waits `interval` after
/// each computation (so its cost is bounded by one scan per interval, and
/// one at a time), until `cancel`. Each computation's cost is logged.
pub(super) async fn keep<J: JournalBackend, P: CliStore>(
    figures: Arc<Figures>,
    journal: J,
    store: P,
    projections: Vec<Arc<dyn Projection<P::Tx>>>,
    lag_streams: usize,
    interval: Duration,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        let done = tokio::select! {
            () = cancel.cancelled() => return,
            done = figures.compute(&journal, &store, &projections, lag_streams) => done,
        };
        match done {
            Ok(c) => tracing::debug!(
                took_ms = c.took.as_millis() as u64,
                streams = c.lag.as_ref().map_or(0, |l| l.streams_scanned),
                "monitor figures computed"
            ),
            Err(e) => tracing::warn!("computing the monitor's figures failed (the last ones are kept): {e}"),
        }
    }
}
