//! Starting and stopping the runtime's tasks.

use std::time::Duration;

use outbox_core::Result;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};

use crate::gaps::RepairReport;
use crate::outbox::{JournalBackend, Outbox, ProjectionBackend};
use crate::worker::WorkerKind;

/// The tasks a mode runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tasks {
    /// The apply worker.
    pub apply_worker: bool,
    /// The shadow worker.
    pub shadow_worker: bool,
    /// The heartbeat (worker registry and gauges); runs with any worker.
    pub heartbeat: bool,
}

/// Handle to a started runtime. Dropping it does not stop the tasks: call
/// [`Running::shutdown`] (graceful) or [`Running::abort`] (a crash, for tests).
#[must_use = "the tasks keep running until shutdown() is called"]
pub struct Running {
    cancel: CancellationToken,
    tracker: TaskTracker,
    handles: Vec<tokio::task::JoinHandle<()>>,
    tasks: Tasks,
    repair: Option<RepairReport>,
}

impl Running {
    /// The tasks that were started.
    pub fn tasks(&self) -> Tasks {
        self.tasks
    }

    /// What start-up gap repair did, if it ran.
    pub fn repair_report(&self) -> Option<&RepairReport> {
        self.repair.as_ref()
    }

    /// Stops claiming, lets in-flight applies finish (or roll back), abandons
    /// claimed rows, releases leases and deregisters the worker.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// Stops the tasks abruptly, leaving leases to expire: what a crash does.
    pub fn abort(self) {
        self.cancel.cancel();
        for h in &self.handles {
            h.abort();
        }
    }

    /// A token that is cancelled when shutdown begins.
    pub fn cancellation(&self) -> CancellationToken {
        self.cancel.clone()
    }
}

impl<J: JournalBackend, P: ProjectionBackend> Outbox<J, P> {
    /// The tasks this runtime's mode starts.
    pub fn planned_tasks(&self) -> Tasks {
        let mode = self.mode();
        Tasks {
            apply_worker: mode.runs_apply_worker(),
            shadow_worker: mode.runs_shadow_worker(),
            heartbeat: mode.runs_apply_worker() || mode.runs_shadow_worker(),
        }
    }

    /// Runs start-up gap repair (when configured), then spawns the tasks of
    /// the mode: the apply worker or the shadow worker and the heartbeat, or
    /// nothing in the inline modes.
    pub async fn start(&self) -> Result<Running> {
        let repair = if self.config().repair_on_start {
            Some(self.repair_gaps().await?)
        } else {
            None
        };
        let tasks = self.planned_tasks();
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let mut handles = Vec::new();
        let kind = if tasks.apply_worker {
            Some(WorkerKind::Apply)
        } else if tasks.shadow_worker {
            Some(WorkerKind::Shadow)
        } else {
            None
        };
        if let Some(kind) = kind {
            let this = self.clone();
            let token = cancel.clone();
            let span = info_span!("worker", kind = ?kind, id = %self.worker_id());
            handles.push(tracker.spawn(async move { this.work_loop(kind, token).await }.instrument(span)));
        }
        if tasks.heartbeat {
            let this = self.clone();
            let token = cancel.clone();
            handles.push(tracker.spawn(async move { this.heartbeat_loop(token).await }));
        }
        info!(mode = %self.mode(), apply_worker = tasks.apply_worker, shadow_worker = tasks.shadow_worker, "outbox runtime started");
        Ok(Running {
            cancel,
            tracker,
            handles,
            tasks,
            repair,
        })
    }

    async fn heartbeat_loop(&self, cancel: CancellationToken) {
        let interval = self.config().heartbeat_interval;
        let ttl = (interval * 3).max(Duration::from_secs(1));
        let host = crate::host_name();
        loop {
            if let Err(e) = self
                .journal()
                .heartbeat(self.worker_id(), &host, std::process::id(), self.mode(), ttl)
                .await
            {
                warn!(error = %e, "heartbeat failed");
            }
            if let Err(e) = self.refresh_gauges().await {
                warn!(error = %e, "reading queue gauges failed");
            }
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(interval) => {}
            }
        }
        if let Err(e) = self.journal().deregister(self.worker_id()).await {
            warn!(error = %e, "deregistering the worker failed; its entry will age out");
        }
    }
}

/// A token cancelled when the process receives Ctrl-C (SIGINT) or SIGTERM.
///
/// Spawns one small task that waits for the signals (the runtime is the
/// only crate that spawns). Binaries pass the token to [`Outbox::replay`] and
/// friends, or select on it to call [`Running::shutdown`].
pub fn cancel_on_shutdown_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = term => {}
        }
        t.cancel();
    });
    token
}
