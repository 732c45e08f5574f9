//! The embedding API: build the runtime, register projections and event
//! types, append events, run or stop the workers.

use std::collections::BTreeMap;
use std::sync::Arc;

use outbox_core::{
    AppendOptions, AppendRequest, Appended, ApplyOutcome, ApplyReport, DeadLetters, Error, Event,
    EventJournal, EventTypeRegistry, ExpectedVersion, GenerationStore, LeaseStore, Mode, ModeSelection,
    NewEvent, OutboxInspector, OutboxQueue, PartitionStore, Projection, ProjectionName, ProjectionStore,
    Result, RunStore, Seq, Sink, SinkStore, SkippedEvents, StreamId, ViewProjection, ViewReader, ViewStore,
    WakeSource, WatermarkStore, WorkerId, WorkerRegistry, select_mode, validate_generation_base,
    view_projection, view_projection_with_candidate,
};
use serde::Serialize;
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::bounded::{Bounded, Guard};
use crate::config::Config;
use crate::metrics::{Gauges, Metrics, MetricsSnapshot};

/// What a journal adapter must implement for the runtime.
///
/// The capability traits (`SinkFeed`, `ActivityLog`, `PartitionHandover`;
/// ADR 0035) are part of the bound, but an adapter without the capability
/// writes an empty `impl` and takes its defaults: the runtime then refuses
/// sinks, keeps no activity and lets a joining worker wait for its share,
/// and runs everything else.
pub trait JournalBackend:
    EventJournal
    + OutboxQueue
    + DeadLetters
    + OutboxInspector
    + LeaseStore
    + WorkerRegistry
    + PartitionStore
    + outbox_core::PartitionHandover
    + SinkStore
    + outbox_core::ConsumerRegistry
    + outbox_core::SinkFeed
    + outbox_core::ActivityLog
    + 'static
{
}
impl<T> JournalBackend for T where
    T: EventJournal
        + OutboxQueue
        + DeadLetters
        + OutboxInspector
        + LeaseStore
        + WorkerRegistry
        + PartitionStore
        + outbox_core::PartitionHandover
        + SinkStore
        + outbox_core::ConsumerRegistry
        + outbox_core::SinkFeed
        + outbox_core::ActivityLog
        + 'static
{
}

/// What a projection adapter must implement for the runtime. A watermark
/// store is part of the bound, so "a worker without a watermark store" cannot
/// be configured at all.
pub trait ProjectionBackend:
    ProjectionStore + WatermarkStore + ViewStore + RunStore + GenerationStore + SkippedEvents + 'static
{
}
impl<T> ProjectionBackend for T where
    T: ProjectionStore + WatermarkStore + ViewStore + RunStore + GenerationStore + SkippedEvents + 'static
{
}

/// The runtime: one journal, one projection store, the registered
/// projections and event types, and the resolved [`Mode`]. Cheap to clone.
pub struct Outbox<J, P: ProjectionStore> {
    pub(crate) inner: Arc<Inner<J, P>>,
}

impl<J, P: ProjectionStore> Clone for Outbox<J, P> {
    fn clone(&self) -> Self {
        Outbox {
            inner: Arc::clone(&self.inner),
        }
    }
}

pub(crate) struct Inner<J, P: ProjectionStore> {
    /// The adapters, every port call bounded and counted ([`Bounded`]).
    pub(crate) journal: Bounded<J>,
    pub(crate) store: Bounded<P>,
    pub(crate) types: EventTypeRegistry,
    pub(crate) projections: Vec<Arc<dyn Projection<P::Tx>>>,
    /// The backend-neutral projections by name (their generations can be
    /// built, ADR 0021), and the candidate versions registered for them.
    pub(crate) views: BTreeMap<ProjectionName, Arc<dyn ViewProjection>>,
    pub(crate) candidates: BTreeMap<ProjectionName, Arc<dyn ViewProjection>>,
    pub(crate) config: Config,
    pub(crate) mode: Mode,
    pub(crate) worker_id: WorkerId,
    pub(crate) wake: Notify,
    pub(crate) wake_source: Option<Arc<dyn WakeSource>>,
    /// Wakes [`Outbox::wait_for`] when another process applies.
    pub(crate) progress_source: Option<Arc<dyn WakeSource>>,
    pub(crate) metrics: Metrics,
    /// Whether a [`crate::Running`] of this runtime is live (one start at a time).
    pub(crate) started: Arc<std::sync::atomic::AtomicBool>,
    /// Partition leasing (ADR 0022).
    pub(crate) partitions: crate::partitions::PartitionState,
    /// The sinks (ADR 0023) and the wake-up of their delivery loops.
    pub(crate) sinks: Vec<Arc<dyn Sink>>,
    pub(crate) sink_wake: Notify,
    /// Held for writing while the worker applies a row alone (its attempt
    /// marked with `begin_attempt`) and for reading while a sink publishes:
    /// an abort of this process during a marked attempt is that row's doing,
    /// not a sink's (ADR 0029).
    pub(crate) alone_gate: tokio::sync::RwLock<()>,
    /// The consumer registry as this runtime last read it (ADR 0032).
    pub(crate) registry: crate::registry::RegistryView,
    /// The code version its consumers are registered with.
    pub(crate) code_version: String,
    /// Each projection's error policy, when not retry (ADR 0032).
    pub(crate) policies: BTreeMap<String, outbox_core::OnError>,
    /// Bumped after every committed apply: wakes [`Outbox::wait_for`].
    pub(crate) progress: tokio::sync::watch::Sender<u64>,
}

/// A projection as registered, in order.
enum Registered<Tx> {
    View(Arc<dyn ViewProjection>),
    Raw(Arc<dyn Projection<Tx>>),
}

/// Builds an [`Outbox`].
pub struct OutboxBuilder<J, P: ProjectionStore> {
    journal: J,
    store: P,
    types: EventTypeRegistry,
    projections: Vec<Registered<P::Tx>>,
    candidates: Vec<Arc<dyn ViewProjection>>,
    sinks: Vec<Arc<dyn Sink>>,
    config: Config,
    wake_source: Option<Arc<dyn WakeSource>>,
    progress_source: Option<Arc<dyn WakeSource>>,
    code_version: String,
    policies: BTreeMap<String, outbox_core::OnError>,
}

impl<J: JournalBackend, P: ProjectionBackend> OutboxBuilder<J, P> {
    /// The version of the application's code its projections and sinks are
    /// registered with in the journal (ADR 0032; `outbox report` shows it
    /// per consumer). At most 64 bytes; default: none.
    pub fn code_version(mut self, version: impl Into<String>) -> Self {
        self.code_version = version.into();
        self
    }

    /// What a plain error of projection `projection`'s applier asks for
    /// (default: [`OnError::Retry`](outbox_core::OnError::Retry)); an
    /// [`ApplyError`](outbox_core::ApplyError) decides for itself (ADR 0032).
    pub fn on_error(mut self, projection: &str, policy: outbox_core::OnError) -> Self {
        self.policies.insert(projection.to_owned(), policy);
        self
    }

    /// Sets the configuration (default: [`Config::default`], inline apply only).
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Sets the event types and their intents.
    pub fn event_types(mut self, types: EventTypeRegistry) -> Self {
        self.types = types;
        self
    }

    /// Adds a source of cross-process wake-ups (e.g. the Postgres adapter's
    /// LISTEN/NOTIFY listener). Polling stays the fallback.
    pub fn wake_source(mut self, source: Arc<dyn WakeSource>) -> Self {
        self.wake_source = Some(source);
        self
    }

    /// Adds a source of wake-ups when another process commits to the
    /// projection store (e.g. `SqliteProjectionStore::wake_source`):
    /// [`Outbox::wait_for`] then wakes on it instead of reading the
    /// checkpoints again on a backoff.
    pub fn progress_source(mut self, source: Arc<dyn WakeSource>) -> Self {
        self.progress_source = Some(source);
        self
    }

    /// Adds a backend-neutral projection (the usual kind: written once, it
    /// runs on every adapter). Order matters only for rebuild-all.
    pub fn view(self, projection: impl ViewProjection) -> Self {
        self.view_arc(Arc::new(projection))
    }

    /// [`OutboxBuilder::view`] for a projection that is already shared.
    pub fn view_arc(mut self, projection: Arc<dyn ViewProjection>) -> Self {
        self.projections.push(Registered::View(projection));
        self
    }

    /// Adds a candidate version of a registered view projection (same name,
    /// another [`ViewProjection::version`]): it is built into a shadow
    /// generation beside the live one ([`Outbox::shadow_build`]), compared
    /// ([`Outbox::shadow_diff`]) and promoted ([`Outbox::promote`]); once its
    /// generation is live, the workers apply it instead of the registered
    /// version (ADR 0021).
    pub fn candidate(self, projection: impl ViewProjection) -> Self {
        self.candidate_arc(Arc::new(projection))
    }

    /// [`OutboxBuilder::candidate`] for a projection that is already shared.
    pub fn candidate_arc(mut self, projection: Arc<dyn ViewProjection>) -> Self {
        self.candidates.push(projection);
        self
    }

    /// Adds a sink (ADR 0023): the apply worker publishes the journal's
    /// events to it, in stream order, at least once, beside the projections.
    pub fn sink(self, sink: impl Sink + 'static) -> Self {
        self.sink_arc(Arc::new(sink))
    }

    /// [`OutboxBuilder::sink`] for a sink that is already shared.
    pub fn sink_arc(mut self, sink: Arc<dyn Sink>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// Adds a projection written against this backend's transaction handle
    /// (hand-written SQL: the escape hatch). Order matters only for rebuild-all.
    ///
    /// A [`ViewProjection`] belongs in [`OutboxBuilder::view`]; one wrapped
    /// by [`view_projection`] and passed here is recognized and registered
    /// as a view all the same. A view wrapped with its candidate
    /// ([`view_projection_with_candidate`]) is not: registered here it
    /// applies, but the runtime does not know it as a view (no shadow builds
    /// or promotion), and `build` logs a warning saying so (it cannot refuse:
    /// a hand-written projection may write only documents too).
    pub fn projection(mut self, projection: Arc<dyn Projection<P::Tx>>) -> Self {
        self.projections.push(Registered::Raw(projection));
        self
    }

    /// Validates the configuration, resolves the mode (logged once), creates
    /// the projections' tables, and returns the runtime. Nothing is spawned
    /// until [`Outbox::start`].
    pub async fn build(self) -> Result<Outbox<J, P>> {
        self.config.validate()?;
        let ModeSelection {
            mode,
            shadow_overridden,
        } = select_mode(self.config.flags)?;
        if shadow_overridden {
            warn!(
                "both OUTBOX_WORKER_ENABLED and OUTBOX_SHADOW_WORKER_ENABLED are set: the apply worker takes precedence, the shadow worker is disabled"
            );
        }
        let mut views = BTreeMap::new();
        let mut candidates = BTreeMap::new();
        for c in self.candidates {
            if candidates.insert(c.name().clone(), c.clone()).is_some() {
                return Err(Error::Config(format!(
                    "projection `{}` has two candidates registered",
                    c.name()
                )));
            }
        }
        let mut registered = Vec::with_capacity(self.projections.len());
        for r in self.projections {
            // `view_projection(..)` passed to `projection` is a view all the
            // same: known as one, it keeps its reads and blue/green rebuilds.
            let r = match r {
                Registered::Raw(p) => match outbox_core::view_of(&*p) {
                    Some(v) => Registered::View(v),
                    None => Registered::Raw(p),
                },
                view => view,
            };
            registered.push(match r {
                Registered::Raw(p) => {
                    if p.documents_only() {
                        // A view wrapped with a candidate or a generation's
                        // copy passed to `projection`: it applies, but is no
                        // view to the runtime. (A hand-written projection may
                        // write only documents too, so this is not refused.)
                        warn!(
                            projection = %p.name(),
                            "projection writes only documents but was registered with `projection`: \
                             if it is a ViewProjection with a candidate, register it with `view` and \
                             `candidate` to keep view reads, blue/green rebuilds and running digests for it"
                        );
                    }
                    p
                }
                Registered::View(v) => {
                    views.insert(v.name().clone(), Arc::clone(&v));
                    match candidates.get(v.name()) {
                        Some(c) => view_projection_with_candidate(v, Arc::clone(c))
                            .map_err(|e| Error::Config(e.to_string()))?,
                        None => view_projection(v),
                    }
                }
            });
        }
        if let Some(orphan) = candidates.keys().find(|c| !views.contains_key(*c)) {
            return Err(Error::Config(format!(
                "candidate `{orphan}` is not a version of any registered view projection"
            )));
        }
        check_sink_names(&self.sinks)?;
        if !self.sinks.is_empty() {
            // An optional capability (ADR 0035): refused here, not at the
            // first delivery pass.
            // Another error is the store's now, and the delivery loop's to retry.
            if let Err(Error::Unsupported(why)) = self.journal.read_feed(0, 1).await {
                return Err(Error::Config(format!(
                    "sinks are registered, but this journal cannot deliver to them ({why})"
                )));
            }
        }
        outbox_core::validate_code_version(&self.code_version).map_err(|e| Error::Config(e.to_string()))?;
        let mut names = std::collections::BTreeSet::new();
        for p in &registered {
            validate_generation_base(p.name()).map_err(|e| Error::Config(e.to_string()))?;
            outbox_core::projection_consumer(p.name()).map_err(|e| Error::Config(e.to_string()))?;
            if !names.insert(p.name().clone()) {
                return Err(Error::Config(format!(
                    "projection `{}` is registered twice",
                    p.name()
                )));
            }
        }
        if registered.is_empty() && mode.runs_apply_worker() {
            warn!(
                "the apply worker runs with no projections registered: rows will be completed without effect"
            );
        }
        // Every hook of every projection turns a panic into an error.
        let projections = crate::panic::catch_panics(registered);
        // Setup is idempotent (CREATE ... IF NOT EXISTS and the like): a
        // database that is restarting is waited for (`start_retry`).
        let store = &self.store;
        crate::retry_while_unavailable(
            self.config.start_retry,
            &tokio_util::sync::CancellationToken::new(),
            "setting up the projections",
            || store.setup(&projections),
        )
        .await?;
        let worker_id = match self.config.worker_id.clone() {
            Some(id) => id,
            None => generated_worker_id()?,
        };
        info!(mode = %mode, worker = %worker_id, projections = projections.len(), "outbox runtime configured");
        let metrics = Metrics::default();
        let guard = Guard::new(
            self.config.store_deadline(),
            self.config.run_ttl,
            Arc::clone(&metrics.store_calls),
        );
        Ok(Outbox {
            inner: Arc::new(Inner {
                journal: Bounded::new(self.journal, guard.clone()),
                store: Bounded::new(self.store, guard),
                types: self.types,
                projections,
                views,
                candidates,
                config: self.config,
                mode,
                worker_id,
                wake: Notify::new(),
                wake_source: self.wake_source,
                progress_source: self.progress_source,
                metrics,
                started: Arc::default(),
                partitions: crate::partitions::PartitionState::default(),
                sinks: self.sinks,
                sink_wake: Notify::new(),
                alone_gate: tokio::sync::RwLock::new(()),
                registry: crate::registry::RegistryView::default(),
                code_version: self.code_version,
                policies: self.policies,
                progress: tokio::sync::watch::channel(0).0,
            }),
        })
    }
}

fn generated_worker_id() -> Result<WorkerId> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    WorkerId::new(format!(
        "{}-{}-{:08x}{n}",
        crate::host::host_name(),
        std::process::id(),
        nanos
    ))
}

/// An inline apply that did not complete; the events are durable and a
/// worker, `outbox work --once` or gap repair will apply them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InlineFailure {
    /// The stream.
    pub stream: StreamId,
    /// Why.
    pub error: String,
}

/// What an append did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AppendOutcome {
    /// One entry per request, in order.
    pub appended: Vec<Appended>,
    /// Inline applies that failed (always empty in the worker modes).
    pub inline_failures: Vec<InlineFailure>,
}

impl<J: JournalBackend, P: ProjectionBackend> Outbox<J, P> {
    /// A builder over a journal adapter and a projection adapter.
    pub fn builder(journal: J, store: P) -> OutboxBuilder<J, P> {
        OutboxBuilder {
            journal,
            store,
            types: EventTypeRegistry::new(),
            projections: Vec::new(),
            candidates: Vec::new(),
            sinks: Vec::new(),
            config: Config::default(),
            wake_source: None,
            progress_source: None,
            code_version: String::new(),
            policies: BTreeMap::new(),
        }
    }

    /// The resolved mode.
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// This runtime's worker id (the owner on its leases).
    pub fn worker_id(&self) -> &WorkerId {
        &self.inner.worker_id
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The journal adapter.
    pub fn journal(&self) -> &J {
        self.inner.journal.get_ref()
    }

    /// The projection adapter.
    pub fn store(&self) -> &P {
        self.inner.store.get_ref()
    }

    /// The registered projections.
    pub fn projections(&self) -> &[Arc<dyn Projection<P::Tx>>] {
        &self.inner.projections
    }

    /// Reads the documents of the backend-neutral projection `projection`
    /// (the application's query side). The name is validated here; a
    /// projection that is not registered simply has no documents.
    pub fn views(&self, projection: &str) -> Result<ViewReader<'_, P>> {
        Ok(ViewReader::new(
            self.inner.store.get_ref(),
            ProjectionName::new(projection)?,
        ))
    }

    /// The registered event types.
    pub fn event_types(&self) -> &EventTypeRegistry {
        &self.inner.types
    }

    /// A new event of a registered type.
    pub fn event(&self, event_type: &str, payload: impl Into<Vec<u8>>) -> Result<NewEvent> {
        self.inner.types.event(event_type, payload)
    }

    /// Appends typed values ([`DomainEvent`](outbox_core::typed::DomainEvent))
    /// to `stream`: each encoded by its type, with its kind's type name and
    /// intent, as one append. A kind this runtime's registry does not hold
    /// (register `EventTypeRegistry::of::<E>()`) is refused before anything
    /// is written.
    pub async fn append_typed<E: outbox_core::typed::DomainEvent>(
        &self,
        stream: &StreamId,
        expected: ExpectedVersion,
        events: &[E],
    ) -> Result<AppendOutcome> {
        let events = events
            .iter()
            .map(|e| {
                let new = e.to_new_event()?;
                if self.inner.types.intent(&new.event_type)? != new.intent {
                    return Err(Error::Config(format!(
                        "event type `{}` is registered with another intent than its kind's",
                        new.event_type
                    )));
                }
                Ok(new)
            })
            .collect::<Result<Vec<_>>>()?;
        self.append(stream, expected, events).await
    }

    /// Counters and the last gauges.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot(self.inner.mode)
    }

    /// Reads the queue gauges now and stores them in the metrics.
    pub async fn refresh_gauges(&self) -> Result<Gauges> {
        let g = Gauges::from_summary(&self.inner.journal.summary().await?);
        if let Ok(mut slot) = self.inner.metrics.gauges.lock() {
            *slot = Some(g.clone());
        }
        Ok(g)
    }

    /// Appends `events` to one stream. See [`Outbox::append_batch`].
    pub async fn append(
        &self,
        stream: &StreamId,
        expected: ExpectedVersion,
        events: Vec<NewEvent>,
    ) -> Result<AppendOutcome> {
        self.append_batch(vec![AppendRequest::new(stream.clone(), expected, events)])
            .await
    }

    /// Appends a batch (one transaction, many streams), enqueueing outbox
    /// rows when the mode says so, then applies inline when the mode says so.
    ///
    /// Every event type must be registered with the intent the event carries.
    /// An `Ok` means the events are durable; inline-apply failures are
    /// reported in [`AppendOutcome::inline_failures`], never as an error,
    /// because the events are accepted and will be applied by another path.
    pub async fn append_batch(&self, batch: Vec<AppendRequest>) -> Result<AppendOutcome> {
        for req in &batch {
            for e in &req.events {
                let registered = self.inner.types.intent(&e.event_type)?;
                if registered != e.intent {
                    return Err(Error::invalid(format_args!(
                        "event type `{}` is registered as {registered} but the event says {}",
                        e.event_type, e.intent
                    )));
                }
            }
        }
        let mode = self.inner.mode;
        let options = if mode.enqueues() {
            AppendOptions::enqueue()
        } else {
            AppendOptions::journal_only()
        };
        let appended = self.inner.journal.append(&batch, options).await?;
        crate::failpoint::failpoint("after_append");
        if mode.enqueues()
            && self.inner.config.wake_on_append
            && mode.runs_apply_worker() | mode.runs_shadow_worker()
        {
            self.inner.wake.notify_one();
            self.inner.sink_wake.notify_waiters();
        }
        let mut inline_failures = Vec::new();
        if mode.applies_inline() {
            for a in &appended {
                if let Err(e) = self.apply_inline(a).await {
                    warn!(stream = %a.stream, error = %e, "inline apply failed; the events stay for another path");
                    Metrics::add(&self.inner.metrics.inline_failed, 1);
                    inline_failures.push(InlineFailure {
                        stream: a.stream.clone(),
                        error: e.to_string(),
                    });
                }
            }
        }
        Ok(AppendOutcome {
            appended,
            inline_failures,
        })
    }

    async fn apply_inline(&self, a: &Appended) -> Result<()> {
        let n = (a.last_seq.get() - a.first_seq.get() + 1) as usize;
        // Read back what the journal stored, so every path applies the same bytes.
        let events = self.inner.journal.read_stream(&a.stream, a.first_seq, n).await?;
        self.apply_run(&a.stream, &events).await?;
        Metrics::add(&self.inner.metrics.inline_applied, 1);
        if self.inner.mode.inline_deletes_rows() {
            // The projections another process runs keep their share (ADR 0032).
            self.refresh_registry(false).await?;
            self.hold_unrun(&a.stream).await?;
            let n = self.inner.journal.complete(&a.stream, a.last_seq).await?;
            Metrics::add(&self.inner.metrics.completed_rows, n);
        }
        Ok(())
    }

    /// Applies a contiguous run of `stream` exactly once to every projection,
    /// catching a projection up from the journal first when it reports a gap.
    pub(crate) async fn apply_run(&self, stream: &StreamId, events: &[Event]) -> Result<ApplyReport> {
        let inner = &self.inner;
        match inner
            .store
            .apply(stream, events, &self.active_projections())
            .await?
        {
            ApplyOutcome::Applied(r) => {
                self.count(&r);
                Ok(r)
            }
            ApplyOutcome::Gap(gap) => {
                let first = events[0].seq.get();
                Metrics::add(&inner.metrics.caught_up, 1);
                let active = self.active_projections();
                self.catch_up(stream, gap.checkpoint + 1, first - 1, &active)
                    .await?;
                match inner.store.apply(stream, events, &active).await? {
                    ApplyOutcome::Applied(r) => {
                        self.count(&r);
                        Ok(r)
                    }
                    ApplyOutcome::Gap(gap) => Err(Error::InvalidState(format!(
                        "projection `{}` is still behind on {stream} after catching up (checkpoint {}, offered {})",
                        gap.projection, gap.checkpoint, gap.offered
                    ))),
                }
            }
        }
    }

    pub(crate) fn count(&self, r: &ApplyReport) {
        self.inner.progress.send_modify(|n| *n = n.wrapping_add(1));
        let m = &self.inner.metrics;
        Metrics::add(&m.applied, r.applied);
        Metrics::add(&m.duplicates, r.duplicates);
        Metrics::add(&m.audit_only, r.audit_only);
    }

    /// Applies seqs `from..=until` of `stream` from the journal, in batches,
    /// to `projections`. Each batch commits with its checkpoints.
    pub(crate) async fn catch_up(
        &self,
        stream: &StreamId,
        from: u64,
        until: u64,
        projections: &[Arc<dyn Projection<P::Tx>>],
    ) -> Result<u64> {
        let inner = &self.inner;
        let mut next = from;
        let mut applied = 0;
        while next <= until {
            let want = ((until - next + 1) as usize).min(inner.config.batch_size);
            let events = inner.journal.read_stream(stream, Seq::new(next)?, want).await?;
            if events.is_empty() {
                break;
            }
            match inner.store.apply(stream, &events, projections).await? {
                ApplyOutcome::Applied(r) => {
                    self.count(&r);
                    applied += r.applied + r.audit_only;
                }
                ApplyOutcome::Gap(gap) => {
                    // A projection is further behind than the run we were asked
                    // for: widen the run to its checkpoint and go on.
                    if gap.checkpoint + 1 >= next {
                        return Err(Error::InvalidState(format!(
                            "unexpected gap during catch-up: {gap:?}"
                        )));
                    }
                    next = gap.checkpoint + 1;
                    continue;
                }
            }
            next = events[events.len() - 1].seq.get() + 1;
        }
        Ok(applied)
    }
}

/// `InvalidInput` (as a configuration error) when two sinks share a name.
fn check_sink_names(sinks: &[Arc<dyn outbox_core::Sink>]) -> Result<()> {
    let mut names = std::collections::BTreeSet::<&outbox_core::SinkName>::new();
    for s in sinks {
        if outbox_core::consumer_projection(s.name()).is_some() {
            return Err(Error::Config(format!(
                "sink `{}`: names starting with `{}` are the projections' (ADR 0032)",
                s.name(),
                outbox_core::PROJECTION_CONSUMER_PREFIX
            )));
        }
        if !names.insert(s.name()) {
            return Err(Error::Config(format!("sink `{}` is registered twice", s.name())));
        }
    }
    Ok(())
}
