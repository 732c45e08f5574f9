//! Starting and stopping the runtime's tasks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_core::{ActivityLog, Error, Mode, Result, RunStore, WorkerRegistry};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::{Instrument, error, info, info_span, warn};

use crate::config::heartbeat_ttl;
use crate::gaps::RepairReport;
use crate::outbox::{JournalBackend, Outbox, ProjectionBackend};
use crate::panic::CatchUnwind;
use crate::unavailable::retry_while_unavailable;
use crate::worker::WorkerKind;

/// The longest wait before a dead worker loop is restarted.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(60);

/// The heartbeat prunes the worker registry and old finished runs once at
/// start and then every this many beats (5 minutes at the default 5 s interval).
const PRUNE_EVERY_BEATS: u64 = 60;

/// A worker loop that ran this long before it died starts its restart
/// backoff from the beginning again.
const RESTART_RESET_AFTER: Duration = Duration::from_secs(300);

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
    started: Arc<AtomicBool>,
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
        self.started.store(false, Ordering::SeqCst);
    }

    /// Stops the tasks abruptly, leaving leases to expire: what a crash does.
    pub fn abort(self) {
        self.cancel.cancel();
        for h in &self.handles {
            h.abort();
        }
        self.started.store(false, Ordering::SeqCst);
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
    /// nothing in the inline modes and the producer-only mode (which also
    /// skips the repair: it applies nothing).
    ///
    /// A worker first registers (its first heartbeat) and, with partition
    /// leasing, takes its share of the partitions among the live workers of
    /// its mode, including the partitions those workers still hold
    /// ([`PartitionHandover`](outbox_core::PartitionHandover)): when
    /// `start` returns, [`held_partitions`](Outbox::held_partitions) is its
    /// share, whoever held it before. An apply worker's start-up repair
    /// applies nothing (it hands the streams behind the journal to the
    /// worker), and it is left to a worker of the same mode and projections
    /// registered at most one heartbeat TTL before this one
    /// ([`RepairReport::left_to`]): workers started together repair once.
    ///
    /// A runtime starts once at a time: a second `start()` on it (or on a
    /// clone) before the first [`Running`] is shut down or aborted is
    /// [`Error::InvalidState`]. In the worker modes the first heartbeat is
    /// sent before anything is spawned, so a worker id that another live
    /// process holds is refused here (see [`outbox_core::WorkerRegistry`]).
    ///
    /// The worker loop is supervised: if it ends for any reason other than
    /// shutdown (a panic outside a projection, whose panics are already
    /// failures of their rows), it is logged and restarted after a backoff
    /// (the poll interval, doubling up to a minute). The heartbeat runs only
    /// while the supervisor does: if the supervisor itself ends, the
    /// heartbeat stops and deregisters, so the registry never shows a worker
    /// that is not running.
    pub async fn start(&self) -> Result<Running> {
        self.start_until(&CancellationToken::new()).await
    }

    /// [`start`](Self::start) under a cancellation token, such as the one of
    /// [`cancel_on_shutdown_signal`]: start-up repair stops when it is
    /// cancelled (between streams), and so do the tasks (the returned
    /// [`Running`]'s own token is a child of it; still call
    /// [`Running::shutdown`] to wait for them). If it is cancelled before
    /// the tasks are spawned, nothing is spawned or registered: the
    /// [`Running`] has no tasks, its [`repair_report`](Running::repair_report)
    /// says the repair was cancelled, and shutting it down returns at once.
    pub async fn start_until(&self, cancel: &CancellationToken) -> Result<Running> {
        let started = Arc::clone(&self.inner.started);
        if started
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Err(Error::InvalidState(format!(
                "the runtime of worker `{}` is already started: shut the running one down first",
                self.worker_id()
            )));
        }
        match self.start_tasks(Arc::clone(&started), cancel).await {
            Ok(running) => Ok(running),
            Err(e) => {
                started.store(false, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    async fn start_tasks(&self, started: Arc<AtomicBool>, outer: &CancellationToken) -> Result<Running> {
        // Every store call of start-up rides out an unavailable database
        // (a restart, a failover) for `start_retry`; repair is idempotent
        // (catch-ups compare-and-set), so a retry repeats nothing.
        let budget = self.config().start_retry;
        let tasks = self.planned_tasks();
        let cancel = outer.child_token();
        let mut stopped = cancel.is_cancelled();
        // A worker registers and takes its share of the partitions first,
        // so the workers of its mode see it at once: its share is handed
        // over from them, and a start-up repair runs once for workers
        // started together (the first one's).
        let mut registered = false;
        if tasks.heartbeat && !stopped {
            stopped = retry_while_unavailable(budget, outer, "the first heartbeat", || self.beat())
                .await?
                .is_none();
            registered = !stopped;
        }
        let leasing = self.config().leasing && (tasks.apply_worker || tasks.shadow_worker);
        if leasing && !stopped {
            // The worker claims only inside its partitions from its first
            // pass; the first share is taken before it starts.
            self.inner.partitions.set_active(true);
            self.join_partitions_or_warn().await;
        }
        // A producer-only process applies nothing, so it repairs nothing.
        let repair = if self.config().repair_on_start && self.mode() != Mode::ProducerOnly {
            let fleet = registered && self.mode().runs_apply_worker();
            let report = retry_while_unavailable(budget, outer, "start-up repair", || async {
                self.repair_at_start(fleet, outer).await
            })
            .await;
            match report {
                Ok(report) => Some(report.unwrap_or_else(|| RepairReport {
                    cancelled: true,
                    ..RepairReport::default()
                })),
                Err(e) => {
                    if registered {
                        self.leave(leasing).await;
                    }
                    return Err(e);
                }
            }
        } else {
            None
        };
        stopped = stopped || cancel.is_cancelled();
        if stopped && registered {
            // Cancelled during start-up repair: leave no trace of a worker.
            self.leave(leasing).await;
        }
        if stopped {
            info!(mode = %self.mode(), "start cancelled; no task started");
            return Ok(Running {
                cancel,
                tracker: TaskTracker::new(),
                handles: Vec::new(),
                tasks: Tasks {
                    apply_worker: false,
                    shadow_worker: false,
                    heartbeat: false,
                },
                repair,
                started,
            });
        }
        let tracker = TaskTracker::new();
        let mut handles = Vec::new();
        let kind = if tasks.apply_worker {
            Some(WorkerKind::Apply)
        } else if tasks.shadow_worker {
            Some(WorkerKind::Shadow)
        } else {
            None
        };
        let worker_gone = CancellationToken::new();
        if let Some(kind) = kind {
            let this = self.clone();
            let token = cancel.clone();
            let alive = worker_gone.clone().drop_guard();
            let span = info_span!(
                "worker",
                kind = ?kind,
                id = %self.worker_id(),
                otel.kind = "internal",
                messaging.system = "outbox",
            );
            handles.push(
                tracker.spawn(async move { this.supervise(kind, token, alive).await }.instrument(span)),
            );
        }
        if tasks.apply_worker {
            // Sinks publish beside the apply worker (never beside the
            // shadow worker: publishing is an effect).
            for sink in self.inner.sinks.clone() {
                let this = self.clone();
                let token = cancel.clone();
                let span =
                    info_span!("sink", name = %sink.name(), id = %self.worker_id(), otel.kind = "internal");
                handles.push(
                    tracker
                        .spawn(async move { this.delivery().sink_loop(sink, token).await }.instrument(span)),
                );
            }
        }
        if tasks.heartbeat {
            let this = self.clone();
            let token = cancel.clone();
            handles.push(tracker.spawn(async move { this.heartbeat_loop(token, worker_gone).await }));
        }
        info!(mode = %self.mode(), apply_worker = tasks.apply_worker, shadow_worker = tasks.shadow_worker, "outbox runtime started");
        Ok(Running {
            cancel,
            tracker,
            handles,
            tasks,
            repair,
            started,
        })
    }

    /// Start-up repair. An apply worker that registered first looks for a
    /// worker of its mode started just before it ([`fleet_repairer`]): that
    /// one's repair covers the journal, so this one leaves it (once per
    /// fleet, issue 45). Either way it then registers its consumers, so the
    /// workers started after it find them.
    ///
    /// [`fleet_repairer`]: crate::gaps::Repairer::fleet_repairer
    async fn repair_at_start(&self, fleet: bool, cancel: &CancellationToken) -> Result<RepairReport> {
        if !fleet {
            return self.repairer().start_up_repair(cancel).await;
        }
        let first = self.repairer().fleet_repairer().await?;
        self.refresh_registry(true).await?;
        match first {
            Some(first) => {
                info!(by = %first, "start-up repair left to the worker started just before this one");
                Ok(RepairReport {
                    left_to: Some(first),
                    ..RepairReport::default()
                })
            }
            None => self.repairer().start_up_repair(cancel).await,
        }
    }

    /// Gives back what a start that does not go on took: its partitions and
    /// its registry entry.
    async fn leave(&self, leasing: bool) {
        if leasing {
            self.release_partitions().await;
        }
        if let Err(e) = self.inner.journal.deregister(self.worker_id()).await {
            warn!(error = %e, "deregistering the worker failed; its entry will age out");
        }
    }

    /// Runs the worker loop until shutdown, restarting it when it ends
    /// otherwise. `_alive` cancels the heartbeat when this future ends or is
    /// dropped (aborted).
    async fn supervise(&self, kind: WorkerKind, cancel: CancellationToken, _alive: DropGuard) {
        let mut restarts: u32 = 0;
        loop {
            let began = Instant::now();
            let outcome = CatchUnwind::new(self.worker().work_loop(kind, cancel.clone())).await;
            if cancel.is_cancelled() {
                break;
            }
            if began.elapsed() >= RESTART_RESET_AFTER {
                restarts = 0;
            }
            restarts = restarts.saturating_add(1);
            let delay = restart_delay(self.config().poll_interval, restarts);
            let why = match outcome {
                Ok(()) => "returned".to_owned(),
                Err(message) => format!("panicked: {message}"),
            };
            error!(restarts, ?delay, "worker loop {why}; restarting");
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// One registry heartbeat for this process.
    pub(crate) async fn beat(&self) -> Result<()> {
        let ttl = heartbeat_ttl(self.config().heartbeat_interval);
        let host = crate::host::host_name();
        let beat = async || {
            self.inner
                .journal
                .heartbeat(self.worker_id(), &host, std::process::id(), self.mode(), ttl)
                .await
                .map(|_| ())
        };
        match beat().await {
            Err(Error::InvalidState(refused)) => {
                // The id's entry is unexpired and names another process. If
                // that process is gone from this very host (a supervisor
                // restarting a killed worker under a fixed id), its entry
                // is stale: take the id over at once instead of waiting for
                // the entry to expire.
                let workers = self.inner.journal.workers().await?;
                let stale = workers.iter().find(|w| {
                    &w.id == self.worker_id()
                        && w.host == host
                        && w.pid != std::process::id()
                        && !crate::host::process_alive(w.pid)
                });
                let Some(stale) = stale else {
                    return Err(Error::InvalidState(refused));
                };
                info!(
                    worker = %self.worker_id(),
                    pid = stale.pid,
                    "taking the worker id over from a process of this host that no longer exists"
                );
                self.inner.journal.deregister(self.worker_id()).await?;
                beat().await
            }
            other => other,
        }
    }

    /// Adds what this runtime applied, failed and dead-lettered since the
    /// last recording to the journal's per-minute activity (the monitor's
    /// throughput chart), under this runtime's worker id. The heartbeat does
    /// it at every beat and at shutdown; call it after driving
    /// [`tick`](Self::tick) yourself. A failed write keeps the counts for
    /// the next call, so nothing is lost or counted twice.
    pub async fn record_activity(&self) -> Result<()> {
        let metrics = &self.inner.metrics;
        let recorded = metrics.recorded_activity.lock().map(|r| *r).unwrap_or_default();
        let now = metrics.activity();
        let delta = now.since(&recorded);
        if delta.is_empty() {
            return Ok(());
        }
        self.inner
            .journal
            .record_activity(self.worker_id(), delta)
            .await?;
        if let Ok(mut r) = metrics.recorded_activity.lock() {
            *r = now;
        }
        Ok(())
    }

    /// [`record_activity`](Self::record_activity), a failure logged.
    async fn record_activity_or_warn(&self) {
        if let Err(e) = self.record_activity().await {
            warn!(error = %e, "recording the worker's activity failed; the next beat adds it");
        }
    }

    /// Beats every heartbeat interval (the first beat was sent by `start`),
    /// adding the runtime's activity since the last beat to the journal's
    /// per-minute counts, until shutdown or until the worker's supervisor is
    /// gone, then records the last activity and deregisters. At start and every [`PRUNE_EVERY_BEATS`] beats it prunes
    /// registry entries that expired more than
    /// [`Config::registry_retention`](crate::Config::registry_retention) ago
    /// and finished runs older than
    /// [`Config::run_retention`](crate::Config::run_retention).
    async fn heartbeat_loop(&self, cancel: CancellationToken, worker_gone: CancellationToken) {
        let interval = self.config().heartbeat_interval;
        let partitioned = self.inner.partitions.active();
        // Wanted partitions still held by their previous owner: look again
        // soon rather than a whole interval later (as at start, when the
        // other workers have yet to see this one).
        let mut waiting = partitioned;
        let mut beats: u64 = 0;
        loop {
            if beats.is_multiple_of(PRUNE_EVERY_BEATS) {
                match self.inner.journal.prune(self.config().registry_retention).await {
                    Ok(0) => {}
                    Ok(n) => info!(pruned = n, "pruned expired worker registry entries"),
                    Err(e) => warn!(error = %e, "pruning the worker registry failed"),
                }
                match self.inner.store.prune_runs(self.config().run_retention).await {
                    Ok(0) => {}
                    Ok(n) => info!(pruned = n, "pruned old finished runs"),
                    Err(e) => warn!(error = %e, "pruning finished runs failed"),
                }
            }
            if let Err(e) = self.refresh_gauges().await {
                warn!(error = %e, "reading queue gauges failed");
            }
            // Until the next beat, a partitioned worker looks at the
            // registry every `watch`: when a worker of its mode joined or
            // left, or partitions it wants are still held by another, it
            // synchronises at once, so a worker started beside it gets its
            // share within a fraction of a second, not a heartbeat later.
            let next_beat = tokio::time::Instant::now() + if waiting { interval / 4 } else { interval };
            let watch = membership_watch(interval);
            let stop = loop {
                let now = tokio::time::Instant::now();
                if now >= next_beat {
                    break false;
                }
                let nap = if partitioned {
                    watch.min(next_beat - now)
                } else {
                    next_beat - now
                };
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => break true,
                    () = worker_gone.cancelled() => {
                        error!("the worker task is gone; the heartbeat stops");
                        break true;
                    }
                    () = tokio::time::sleep(nap) => {}
                }
                if partitioned && tokio::time::Instant::now() < next_beat {
                    waiting = self.watch_partitions(waiting).await;
                }
            };
            if stop {
                break;
            }
            if let Err(e) = self.beat().await {
                warn!(error = %e, "heartbeat failed");
            }
            if partitioned {
                waiting = self.sync_partitions_or_warn().await;
            }
            self.record_activity_or_warn().await;
            beats += 1;
        }
        if partitioned {
            // Let the worker end its passes under its leases first (bounded:
            // leases expire on their own), then hand the partitions over.
            let _ = tokio::time::timeout(self.config().store_deadline() * 2, worker_gone.cancelled()).await;
            self.release_partitions().await;
        }
        self.record_activity_or_warn().await;
        if let Err(e) = self.inner.journal.deregister(self.worker_id()).await {
            warn!(error = %e, "deregistering the worker failed; its entry will age out");
        }
    }
}

/// How often a partitioned worker looks for workers that joined or left
/// between two beats: a twentieth of the heartbeat interval, between 10 ms
/// and 250 ms (one small registry read each time).
pub(crate) fn membership_watch(interval: Duration) -> Duration {
    (interval / 20).clamp(Duration::from_millis(10), Duration::from_millis(250))
}

/// The wait before the `restarts`-th restart of a dead worker loop: the poll
/// interval, doubling, at most [`MAX_RESTART_DELAY`].
fn restart_delay(poll: Duration, restarts: u32) -> Duration {
    let factor = 1u32 << restarts.saturating_sub(1).min(16);
    poll.saturating_mul(factor).min(MAX_RESTART_DELAY)
}

/// A token cancelled when the process receives Ctrl-C (SIGINT) or SIGTERM.
///
/// Spawns one small task that waits for the signals (the runtime is the
/// only crate that spawns). Binaries pass the token to [`Outbox::replay`] and
/// friends, or select on it to call [`Running::shutdown`].
pub fn cancel_on_shutdown_signal() -> CancellationToken {
    use tokio::signal::unix::{SignalKind, signal};
    let token = CancellationToken::new();
    let t = token.clone();
    // The handlers are installed here, before this returns, so a signal
    // that arrives before the task first runs is not the default (fatal) one.
    let term = signal(SignalKind::terminate()).ok();
    let int = signal(SignalKind::interrupt()).ok();
    tokio::spawn(async move {
        let wait = |s: Option<tokio::signal::unix::Signal>| async move {
            match s {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = wait(term) => {}
            () = wait(int) => {}
        }
        t.cancel();
    });
    token
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_delay_doubles_from_the_poll_interval_up_to_a_minute() {
        let poll = Duration::from_millis(500);
        let got: Vec<Duration> = [1, 2, 3, 8, 9, 1000].map(|n| restart_delay(poll, n)).to_vec();
        let ms = Duration::from_millis;
        assert_eq!(
            got,
            [
                ms(500),
                ms(1000),
                ms(2000),
                ms(64_000).min(MAX_RESTART_DELAY),
                MAX_RESTART_DELAY,
                MAX_RESTART_DELAY
            ]
        );
    }
}
