//! The consumer registry as this runtime last read it (ADR 0032): which
//! registered projections it does not run and which of its own consumers
//! are paused. A leaf: the `Outbox` holds one, the consumer code fills it.

use std::sync::Arc;

use outbox_core::{ProjectionName, SinkName};

/// The consumer registry as this runtime last read it (ADR 0032).
#[derive(Default)]
pub(crate) struct RegistryView {
    state: std::sync::Mutex<RegistryState>,
}

#[derive(Default)]
struct RegistryState {
    refreshed: Option<tokio::time::Instant>,
    /// Registered projections this runtime does not run: each is left a
    /// state on every stream whose rows it completes.
    unrun: Arc<Vec<ProjectionName>>,
    /// Its own projections that are paused: not applied here.
    paused: Arc<Vec<ProjectionName>>,
    /// Its own sinks that are paused: nothing delivered to them.
    paused_sinks: Arc<Vec<SinkName>>,
}

impl RegistryView {
    /// The registered projections this runtime does not run.
    pub(crate) fn unrun(&self) -> Arc<Vec<ProjectionName>> {
        self.state
            .lock()
            .map(|s| Arc::clone(&s.unrun))
            .unwrap_or_default()
    }

    /// Whether this runtime's sink `sink` is paused.
    pub(crate) fn sink_paused(&self, sink: &SinkName) -> bool {
        self.state.lock().is_ok_and(|s| s.paused_sinks.contains(sink))
    }

    /// Marks this runtime's sink `sink` paused at once (the registry says
    /// so already; other runtimes see it at their next read).
    pub(crate) fn pause_sink_here(&self, sink: &SinkName) {
        if let Ok(mut s) = self.state.lock()
            && !s.paused_sinks.contains(sink)
        {
            let mut list = s.paused_sinks.as_ref().clone();
            list.push(sink.clone());
            s.paused_sinks = Arc::new(list);
        }
    }

    /// This runtime's paused projections.
    pub(crate) fn paused(&self) -> Arc<Vec<ProjectionName>> {
        self.state
            .lock()
            .map(|s| Arc::clone(&s.paused))
            .unwrap_or_default()
    }

    /// Whether the view is older than `every` (or was never read).
    pub(crate) fn due(&self, every: std::time::Duration) -> bool {
        self.state
            .lock()
            .map(|s| s.refreshed.is_none_or(|t| t.elapsed() >= every))
            .unwrap_or(true)
    }

    /// What the registry said at the read just made.
    pub(crate) fn replace(
        &self,
        unrun: Vec<ProjectionName>,
        paused: Vec<ProjectionName>,
        paused_sinks: Vec<SinkName>,
    ) {
        if let Ok(mut s) = self.state.lock() {
            if s.unrun.as_slice() != unrun.as_slice() {
                tracing::info!(unrun = ?unrun, "registered projections this process does not run: it leaves them the work it completes");
            }
            if s.paused.as_slice() != paused.as_slice() {
                tracing::info!(paused = ?paused, "paused projections: not applied here, their work kept for them");
            }
            s.unrun = Arc::new(unrun);
            s.paused = Arc::new(paused);
            s.paused_sinks = Arc::new(paused_sinks);
            s.refreshed = Some(tokio::time::Instant::now());
        }
    }

    /// Marks projection `name` paused here or not at once (the registry
    /// says so already; other runtimes see it at their next read).
    pub(crate) fn set_paused(&self, name: &ProjectionName, paused: bool) {
        if let Ok(mut s) = self.state.lock() {
            let mut list: Vec<ProjectionName> = s.paused.iter().filter(|p| *p != name).cloned().collect();
            if paused {
                list.push(name.clone());
            }
            s.paused = Arc::new(list);
        }
    }
}
