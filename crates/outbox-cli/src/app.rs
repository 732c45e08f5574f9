//! The application as the `outbox` command sees it.

use std::sync::Arc;

use outbox_core::{EventTypeRegistry, ViewProjection};

/// An application described once for the `outbox` command: its name, its
/// event types and its backend-neutral projections.
///
/// `outbox_cli::run(App::new("bank").event_types(types).view(Balances))` in
/// a binary's `main` gives the application every `outbox` subcommand on its
/// own journal and projections, on SQLite or Postgres (chosen by the URL at
/// run time). The stock `outbox` binary is `App::new("outbox")` with no
/// projections: the commands that need none (report, requeue, requeue-dead,
/// workers, runs, migrate) work on any application's databases and never
/// create or touch projection documents; the others refuse with one line.
#[derive(Clone)]
pub struct App {
    pub(crate) name: String,
    pub(crate) about: Option<String>,
    pub(crate) version: Option<String>,
    pub(crate) event_types: EventTypeRegistry,
    pub(crate) views: Vec<Arc<dyn ViewProjection>>,
    pub(crate) candidates: Vec<Arc<dyn ViewProjection>>,
    pub(crate) partitioner: Option<Arc<dyn outbox_core::Partitioner>>,
    pub(crate) sinks: Vec<Arc<dyn outbox_core::Sink>>,
    /// Each projection's error policy, when not retry (ADR 0032).
    pub(crate) policies: Vec<(String, outbox_core::OnError)>,
    /// Hand-written projections for SQLite.
    #[cfg(feature = "sqlite")]
    pub(crate) sqlite_projections: Vec<Arc<dyn outbox_core::Projection<outbox_sqlite::SqliteTx>>>,
    /// Hand-written projections for Postgres.
    #[cfg(feature = "postgres")]
    pub(crate) postgres_projections: Vec<Arc<dyn outbox_core::Projection<outbox_postgres::PgTx>>>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("name", &self.name)
            .field(
                "views",
                &self.views.iter().map(|v| v.name().as_str()).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl App {
    /// An application called `name` (the binary's name in help and errors),
    /// with no event types and no projections.
    pub fn new(name: impl Into<String>) -> Self {
        App {
            name: name.into(),
            about: None,
            version: None,
            event_types: EventTypeRegistry::new(),
            views: Vec::new(),
            candidates: Vec::new(),
            partitioner: None,
            sinks: Vec::new(),
            policies: Vec::new(),
            #[cfg(feature = "sqlite")]
            sqlite_projections: Vec::new(),
            #[cfg(feature = "postgres")]
            postgres_projections: Vec::new(),
        }
    }

    /// Adds a hand-written projection for SQLite (`Projection<SqliteTx>`,
    /// the escape hatch): the commands apply it, report it and rebuild it
    /// beside the views when the databases are SQLite. On Postgres
    /// databases, the commands that apply events refuse to run rather than
    /// complete events this projection never saw.
    #[cfg(feature = "sqlite")]
    pub fn sqlite_projection(
        mut self,
        projection: Arc<dyn outbox_core::Projection<outbox_sqlite::SqliteTx>>,
    ) -> Self {
        self.sqlite_projections.push(projection);
        self
    }

    /// Adds a hand-written projection for Postgres (`Projection<PgTx>`); see
    /// [`App::sqlite_projection`].
    #[cfg(feature = "postgres")]
    pub fn postgres_projection(
        mut self,
        projection: Arc<dyn outbox_core::Projection<outbox_postgres::PgTx>>,
    ) -> Self {
        self.postgres_projections.push(projection);
        self
    }

    /// Whether it has hand-written projections for any backend.
    pub(crate) fn has_hand_written(&self) -> bool {
        #[cfg(feature = "sqlite")]
        if !self.sqlite_projections.is_empty() {
            return true;
        }
        #[cfg(feature = "postgres")]
        if !self.postgres_projections.is_empty() {
            return true;
        }
        false
    }

    /// The names of the hand-written projections for backends other than
    /// `backend` ("sqlite", "postgres").
    pub(crate) fn foreign_hand_written(&self, backend: &str) -> Vec<String> {
        #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(unused_mut))]
        let mut out = Vec::new();
        #[cfg(feature = "sqlite")]
        if backend != "sqlite" {
            out.extend(self.sqlite_projections.iter().map(|p| p.name().to_string()));
        }
        #[cfg(feature = "postgres")]
        if backend != "postgres" {
            out.extend(self.postgres_projections.iter().map(|p| p.name().to_string()));
        }
        let _ = backend;
        out
    }

    /// Adds a sink (ADR 0023): `outbox work` publishes the journal's events
    /// to it beside the projections, and `outbox replay --sink NAME --from
    /// POSITION` republishes to it on purpose.
    pub fn sink(self, sink: impl outbox_core::Sink + 'static) -> Self {
        self.sink_arc(Arc::new(sink))
    }

    /// [`App::sink`] for a sink that is already shared.
    pub fn sink_arc(mut self, sink: Arc<dyn outbox_core::Sink>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// Divides the journal's streams by `partitioner` instead of CRC-32 of
    /// the stream id (an application keying by tenant, say). Its name is
    /// stored with the journal: every program opening the journal must use
    /// the same one (ADR 0022).
    pub fn partitioner(mut self, partitioner: impl outbox_core::Partitioner + 'static) -> Self {
        self.partitioner = Some(Arc::new(partitioner));
        self
    }

    /// The one-line description shown by `--help`.
    pub fn about(mut self, about: impl Into<String>) -> Self {
        self.about = Some(about.into());
        self
    }

    /// The version shown by `--version` (e.g. `env!("CARGO_PKG_VERSION")`;
    /// default: outbox-cli's), also the code version this binary's
    /// projections and sinks are registered with in the journal (at most 64
    /// bytes; ADR 0032).
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// What a plain error of projection `projection`'s applier asks for
    /// (default: retry); an applier's `ApplyError` decides for itself
    /// (ADR 0032). See `OutboxBuilder::on_error`.
    pub fn on_error(mut self, projection: &str, policy: outbox_core::OnError) -> Self {
        self.policies.push((projection.to_owned(), policy));
        self
    }

    /// The application's event types and their intents.
    pub fn event_types(mut self, types: EventTypeRegistry) -> Self {
        self.event_types = types;
        self
    }

    /// Adds a backend-neutral projection. Order matters for `rebuild --all`.
    pub fn view(self, projection: impl ViewProjection) -> Self {
        self.view_arc(Arc::new(projection))
    }

    /// [`App::view`] for a projection that is already shared.
    pub fn view_arc(mut self, projection: Arc<dyn ViewProjection>) -> Self {
        self.views.push(projection);
        self
    }

    /// Adds a candidate version of a registered projection (the same name,
    /// another [`ViewProjection::version`]): `outbox shadow build` builds it
    /// into a shadow generation, `outbox shadow diff` compares it with the
    /// live code stream by stream, and `outbox promote` swaps its
    /// generation in when the running digests agree. Once it is live, this
    /// program's workers apply the candidate to it (ADR 0021).
    pub fn candidate(self, projection: impl ViewProjection) -> Self {
        self.candidate_arc(Arc::new(projection))
    }

    /// [`App::candidate`] for a projection that is already shared.
    pub fn candidate_arc(mut self, projection: Arc<dyn ViewProjection>) -> Self {
        self.candidates.push(projection);
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The registered projections, in order.
    pub fn views(&self) -> &[Arc<dyn ViewProjection>] {
        &self.views
    }
}
