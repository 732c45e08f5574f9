//! What every subcommand gets: the opened databases, the configuration and
//! the application (its own module, so the subcommands and the monitor
//! import it without importing the dispatcher that calls them).

use std::sync::Arc;

use outbox_core::Error;
use outbox_runtime::{Config, Outbox};
use tokio_util::sync::CancellationToken;

use crate::App;
use crate::backend::{CliJournal, CliStore};

/// The opened databases, the configuration and the application of one command.
pub(crate) struct Ctx<'a, J, P> {
    pub(crate) app: &'a App,
    pub(crate) journal: J,
    pub(crate) store: P,
    pub(crate) config: Config,
    /// `outbox work`'s shutdown signal (SIGTERM, Ctrl-C), installed before
    /// the databases are opened so a signal stops a start-up that is still
    /// waiting for the database.
    pub(crate) shutdown: Option<CancellationToken>,
    /// The databases are open read-only (`?mode=ro`, or files this user
    /// cannot write): the command only reads (the monitor offers no action).
    #[cfg_attr(not(feature = "serve"), allow(dead_code))]
    pub(crate) read_only: bool,
}

impl<J: CliJournal, P: CliStore> Ctx<'_, J, P> {
    /// The runtime over the opened databases with the application's
    /// projections (only for the commands that apply events).
    pub(crate) async fn runtime(&self) -> Result<Outbox<J, P>, Error> {
        // A hand-written projection of another backend cannot run here: the
        // worker would complete events it never applied.
        let foreign = self.app.foreign_hand_written(P::BACKEND);
        if !foreign.is_empty() {
            return Err(Error::Config(format!(
                "{} has hand-written projection(s) {} for another backend than these {} databases; \
                 it cannot apply them here, so it applies nothing (register a version for {} too)",
                self.app.name,
                foreign.join(", "),
                P::BACKEND,
                P::BACKEND
            )));
        }
        let mut b = Outbox::builder(self.journal.clone(), self.store.clone())
            .config(self.config.clone())
            .event_types(self.app.event_types.clone());
        // The application's version names the code its consumers run (ADR 0032).
        if let Some(v) = &self.app.version {
            b = b.code_version(v.clone());
        }
        if let Some(w) = self.journal.wake() {
            b = b.wake_source(w);
        }
        if let Some(w) = self.store.progress() {
            b = b.progress_source(w);
        }
        for v in &self.app.views {
            b = b.view_arc(v.clone());
        }
        for p in P::hand_written(self.app) {
            b = b.projection(p);
        }
        for c in &self.app.candidates {
            b = b.candidate_arc(c.clone());
        }
        for s in &self.app.sinks {
            b = b.sink_arc(s.clone());
        }
        for (projection, policy) in &self.app.policies {
            b = b.on_error(projection, *policy);
        }
        b.build().await
    }
}

/// The application's projections on backend `P`: its views, then its
/// hand-written projections for `P`.
pub(crate) fn projections<P: CliStore>(app: &App) -> Vec<Arc<dyn outbox_core::Projection<P::Tx>>> {
    app.views
        .iter()
        .map(|v| outbox_core::view_projection(v.clone()))
        .chain(P::hand_written(app))
        .collect()
}
