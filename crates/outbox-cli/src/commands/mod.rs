//! The subcommands: opening the databases once, then one module per command.

pub(crate) mod ctx;
mod gaps;
mod generations;
mod leases;
mod maintenance;
mod partitions;
mod replay;
mod sinks;
mod skipped;
mod wait;
mod work;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use outbox_core::{Error, Seq, StreamId, select_mode};
use outbox_runtime::{Config, retry_while_unavailable};
use tokio_util::sync::CancellationToken;

use crate::App;
use crate::backend::{Access, CliJournal, CliStore, Location};
use crate::cli::{Cli, Command, PartitionsAction};
use ctx::Ctx;

/// The runtime configuration for the CLI: the OUTBOX_* variables, with the
/// apply worker on when none of the four mode flags is set.
pub(crate) fn config() -> Result<Config, Error> {
    let flags_set = [
        Config::OUTBOX_ENABLED,
        Config::OUTBOX_WORKER_ENABLED,
        Config::OUTBOX_SHADOW_WORKER_ENABLED,
        Config::OUTBOX_INLINE_APPLY,
    ]
    .iter()
    .any(|k| std::env::var_os(k).is_some());
    let config = Config::from_env()?;
    Ok(if flags_set {
        config
    } else {
        config.with_flags(Config::apply_worker().flags)
    })
}

/// The configuration: the OUTBOX_* variables, and for `work` its flags and
/// the check that the mode runs a worker.
fn command_config(command: &Command) -> Result<Config, Error> {
    let mut config = config()?;
    if let Command::Work(a) = command {
        if let Some(ms) = a.interval_ms {
            config = config.with_poll_interval(Duration::from_millis(ms));
        }
        if let Some(n) = a.batch_size {
            config = config.with_batch_size(n as usize);
        }
        if a.no_leasing {
            config = config.with_leasing(false);
        }
        config.validate()?;
        let mode = select_mode(config.flags)?.mode;
        if !(mode.runs_apply_worker() || mode.runs_shadow_worker()) {
            return Err(Error::Config(format!(
                "mode {mode} runs no worker: set OUTBOX_ENABLED=true and OUTBOX_WORKER_ENABLED=true (or OUTBOX_SHADOW_WORKER_ENABLED=true)"
            )));
        }
    }
    Ok(config)
}

/// The command's name if it applies events and so needs projections.
fn applies_events(command: &Command) -> Option<&'static str> {
    match command {
        Command::Work(_) => Some("work"),
        Command::Replay(_) => Some("replay"),
        Command::Rebuild(_) => Some("rebuild"),
        Command::Gaps(_) => Some("gaps"),
        Command::Shadow(_) => Some("shadow"),
        Command::Promote(_) => Some("promote"),
        Command::Skipped(crate::cli::SkippedArgs {
            action: Some(crate::cli::SkippedAction::Reapply { .. }),
            ..
        }) => Some("skipped reapply"),
        _ => None,
    }
}

/// The command's name (as typed) if it may write to the databases; `None`
/// for the commands that only read, which run on databases open read-only.
fn writes(command: &Command) -> Option<&'static str> {
    use crate::cli::{ConsumersArgs, LeasesArgs, RunsAction, RunsArgs, SinksArgs, SkippedArgs};
    Some(match command {
        Command::Report(_) | Command::Row(_) | Command::Workers(_) => return None,
        #[cfg(feature = "serve")]
        Command::Serve(_) => return None,
        Command::Leases(LeasesArgs {
            break_stream: None, ..
        })
        | Command::Partitions(crate::cli::PartitionsArgs { resize: None, .. })
        | Command::Sinks(SinksArgs { action: None, .. })
        | Command::Consumers(ConsumersArgs { action: None, .. })
        | Command::Skipped(SkippedArgs { action: None, .. })
        | Command::Generations(crate::cli::GenerationsArgs { drop: None, .. })
        | Command::Runs(RunsArgs {
            action: None | Some(RunsAction::List { .. } | RunsAction::Show { .. }),
            ..
        }) => return None,
        Command::Work(_) => "work",
        // It builds the runtime, which sets the projections up (writes).
        Command::Wait(_) => "wait",
        Command::Requeue(_) => "requeue",
        Command::RequeueDead(_) => "requeue-dead",
        Command::Retry(_) => "retry",
        Command::Leases(_) => "leases --break",
        Command::Replay(_) => "replay",
        Command::Rebuild(_) => "rebuild",
        Command::Runs(_) => "runs cancel",
        Command::Generations(_) => "generations drop",
        Command::Shadow(_) => "shadow",
        Command::Promote(_) => "promote",
        Command::Gaps(_) => "gaps",
        Command::Partitions(_) => "partitions resize",
        Command::Sinks(_) => "sinks",
        Command::Consumers(_) => "consumers retire",
        Command::Skipped(_) => "skipped reapply",
        Command::Migrate(_) => "migrate",
        Command::Verify(_) => "verify",
    })
}

/// Whether a SQLite database file cannot be written by this process: no
/// write bit on it or on its directory (honoured even for root, who may
/// write anyway), or opening it for writing is refused. Never writes.
fn unwritable(path: &std::path::Path) -> bool {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let no_write_bit = |p: &std::path::Path| std::fs::metadata(p).is_ok_and(|m| m.permissions().readonly());
    no_write_bit(path)
        || no_write_bit(dir)
        || std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
}

/// Runs one parsed command line for `app`.
///
/// Everything that can be checked without a database (configuration,
/// identifiers, whether the binary has projections) is checked before one is
/// opened, and the databases are closed before returning, on success and on
/// error: the last close checkpoints the WAL and removes the `-wal` and
/// `-shm` files. Commands that apply no events never build a runtime, so
/// they write nothing to the projection database.
pub async fn execute(app: &App, cli: Cli) -> Result<()> {
    let sink_replay = matches!(&cli.command, Command::Replay(a) if a.sink.is_some());
    let publishes = sink_replay || (matches!(cli.command, Command::Work(_)) && !app.sinks.is_empty());
    if let Some(name) = applies_events(&cli.command)
        && app.views.is_empty()
        && !app.has_hand_written()
        && !publishes
    {
        return Err(Error::Config(format!(
            "`{} {name}` needs projections and this binary has none: build your application's own \
             binary with outbox_cli::run(App::new(..).view(..)) (see the outbox-cli docs)",
            app.name
        ))
        .into());
    }
    let config = command_config(&cli.command)?;
    match &cli.command {
        Command::Requeue(a) => {
            StreamId::new(&a.stream)?;
            Seq::new(a.seq)?;
        }
        Command::Retry(a) => {
            StreamId::new(&a.stream)?;
            Seq::new(a.seq)?;
        }
        Command::Row(a) => {
            StreamId::new(&a.stream)?;
            Seq::new(a.seq)?;
        }
        Command::Skipped(a) => {
            if let Some(p) = &a.projection {
                outbox_core::ProjectionName::new(p.as_str())?;
            }
            if let Some(crate::cli::SkippedAction::Reapply {
                projection,
                stream,
                seq,
            }) = &a.action
            {
                outbox_core::ProjectionName::new(projection.as_str())?;
                StreamId::new(stream)?;
                Seq::new(*seq)?;
            }
        }
        Command::Leases(a) => {
            for s in [&a.stream, &a.break_stream].into_iter().flatten() {
                StreamId::new(s)?;
            }
        }
        Command::Verify(a) => {
            for p in &a.projections {
                outbox_core::ProjectionName::new(p.as_str())?;
            }
        }
        Command::Rebuild(a) if a.blue_green && a.which.projection.is_none() => {
            return Err(
                Error::invalid("--blue-green rebuilds one projection: name it with --projection").into(),
            );
        }
        Command::Sinks(a) => {
            if let Some(s) = &a.sink {
                outbox_core::SinkName::new(s.as_str())?;
            }
            if let Some(crate::cli::SinksAction::Requeue { sink, stream }) = &a.action {
                outbox_core::SinkName::new(sink.as_str())?;
                StreamId::new(stream.as_str())?;
            }
        }
        Command::Consumers(crate::cli::ConsumersArgs {
            action: Some(crate::cli::ConsumersAction::Retire { consumer, yes }),
            ..
        }) => {
            let key = sinks::consumer_key(consumer)?;
            if !yes {
                return Err(Error::invalid(format_args!(
                    "would remove consumer {key} and every per-stream state kept for it; add --yes to retire it"
                ))
                .into());
            }
        }
        Command::Partitions(crate::cli::PartitionsArgs {
            resize: Some(PartitionsAction::Resize { count, yes: false }),
            ..
        }) => {
            return Err(Error::invalid(format_args!(
                "would give every stream with outbox rows its partition among {count} and store the new count \
                 (every worker must be stopped); add --yes to repartition"
            ))
            .into());
        }
        Command::Generations(a) => {
            for p in [a.projection.as_deref(), a.drop.as_ref().map(|d| d.projection())]
                .into_iter()
                .flatten()
            {
                outbox_core::ProjectionName::new(p)?;
            }
        }
        // A refused bind or a bad token stops before a database is opened.
        #[cfg(feature = "serve")]
        Command::Serve(a) => {
            crate::serve::door(a.addr, &a.http, "the monitor")?;
        }
        #[cfg(feature = "serve")]
        Command::Work(crate::cli::WorkArgs {
            metrics_addr: Some(addr),
            http,
            ..
        }) => {
            crate::serve::door(*addr, http, "metrics")?;
        }
        _ => {}
    }
    let g = &cli.global;
    let (journal_at, journal_ro) = Location::parse_mode(&g.journal)?;
    let (projections_at, projections_ro) = Location::parse_mode(&g.projection_db)?;
    let asked_read_only = journal_ro || projections_ro;
    if asked_read_only && let Some(name) = writes(&cli.command) {
        return Err(Error::invalid(format_args!(
            "`{} {name}` writes to the databases, which are given read-only (?mode=ro): nothing was opened; \
             run it without ?mode=ro as a user that may write them",
            app.name
        ))
        .into());
    }
    // A read-only command opens the SQLite files read-only when asked to,
    // or when this user cannot write them: it never writes either way.
    let read_only = writes(&cli.command).is_none()
        && (asked_read_only
            || [&journal_at, &projections_at]
                .iter()
                .any(|l| matches!(l, Location::Sqlite(p) if unwritable(p))));
    let access = match cli.command {
        Command::Migrate(_) => Access::Create,
        _ if applies_events(&cli.command).is_some() => Access::Migrate,
        _ if read_only => Access::ReadOnly,
        _ => Access::Existing,
    };
    // `work` rides out a database that is unavailable while it starts.
    let shutdown = matches!(cli.command, Command::Work(_)).then(outbox_runtime::cancel_on_shutdown_signal);
    let mut partitions = outbox_core::PartitionOptions {
        count: g.partitions,
        ..outbox_core::PartitionOptions::default()
    };
    if let Some(p) = &app.partitioner {
        partitions.partitioner = Arc::clone(p);
    }
    if let Command::Partitions(crate::cli::PartitionsArgs {
        resize: Some(PartitionsAction::Resize { count, .. }),
        ..
    }) = &cli.command
    {
        partitions.count = Some(*count);
        partitions.repartition = true;
    }
    let open = Open {
        access,
        config,
        shutdown,
        partitions,
    };
    match (journal_at, projections_at) {
        (Location::Sqlite(j), Location::Sqlite(p)) => sqlite(app, &cli, j, p, open).await,
        (Location::Postgres(j), Location::Postgres(p)) => postgres(app, &cli, &j, &p, open).await,
        (Location::Memory, _) | (_, Location::Memory) => Err(Error::invalid(
            "memory: stores live inside one process; the command needs sqlite://path or postgres://...",
        )
        .into()),
        _ => Err(Error::invalid(
            "the journal and the projection database must use the same backend (both sqlite or both postgres)",
        )
        .into()),
    }
}

/// How a command opens its databases.
struct Open {
    access: Access,
    config: Config,
    shutdown: Option<CancellationToken>,
    /// The journal's partitioning as asked for (`resize` repartitions).
    partitions: outbox_core::PartitionOptions,
}

impl Open {
    /// Opens the stores with `open`: once, or for `outbox work` (which has a
    /// shutdown token) retrying temporary errors (a database that is down,
    /// restarting or refusing connections) for `OUTBOX_START_RETRY_MS`.
    /// `None`: a shutdown signal arrived first (an attempt in progress is
    /// dropped at once; nothing was opened).
    async fn stores<T, F, Fut>(&self, open: F) -> Result<Option<T>, Error>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let Some(token) = &self.shutdown else {
            return open().await.map(Some);
        };
        let raced = || async {
            tokio::select! {
                biased;
                () = token.cancelled() => Ok(None),
                r = open() => r.map(Some),
            }
        };
        Ok(
            retry_while_unavailable(self.config.start_retry, token, "opening the databases", raced)
                .await?
                .flatten(),
        )
    }
}

/// What `outbox work` says when a signal stops it before a database opened.
fn stopped_while_opening() -> Result<()> {
    eprintln!("stopped while waiting for the database; no worker was started");
    Ok(())
}

#[cfg(feature = "sqlite")]
async fn sqlite(
    app: &App,
    cli: &Cli,
    journal: std::path::PathBuf,
    projections: std::path::PathBuf,
    open: Open,
) -> Result<()> {
    let opened = open
        .stores(|| {
            crate::backend::open_sqlite(
                journal.clone(),
                projections.clone(),
                open.access,
                open.partitions.clone(),
            )
        })
        .await
        .map_err(|e| read_only_hint(e, open.access))?;
    let Some((journal, store)) = opened else {
        return stopped_while_opening();
    };
    run_with(app, cli, journal, store, open).await
}

/// A schema behind this build on databases open read-only: they cannot be
/// upgraded here, whatever `migrate` the error suggests.
#[cfg(feature = "sqlite")]
fn read_only_hint(e: Error, access: Access) -> anyhow::Error {
    match e {
        e @ Error::SchemaTooOld { .. } if access == Access::ReadOnly => anyhow::Error::new(e).context(
            "the databases are open read-only and are not upgraded: run `outbox migrate` as a user that may \
             write them, then this command again",
        ),
        e => e.into(),
    }
}

#[cfg(not(feature = "sqlite"))]
async fn sqlite(app: &App, _: &Cli, _: std::path::PathBuf, _: std::path::PathBuf, _: Open) -> Result<()> {
    Err(unsupported(app, "sqlite"))
}

#[cfg(feature = "postgres")]
async fn postgres(app: &App, cli: &Cli, journal: &str, projections: &str, open: Open) -> Result<()> {
    let opened = open
        .stores(|| {
            crate::backend::open_postgres(
                journal,
                projections,
                &cli.global.schema,
                open.access,
                open.partitions.clone(),
            )
        })
        .await?;
    let Some((journal, store)) = opened else {
        return stopped_while_opening();
    };
    run_with(app, cli, journal, store, open).await
}

#[cfg(not(feature = "postgres"))]
async fn postgres(app: &App, _: &Cli, _: &str, _: &str, _: Open) -> Result<()> {
    Err(unsupported(app, "postgres"))
}

#[cfg(not(all(feature = "sqlite", feature = "postgres")))]
fn unsupported(app: &App, backend: &str) -> anyhow::Error {
    Error::Config(format!(
        "this build of {} has no {backend} support (enable the `{backend}` feature of outbox-cli)",
        app.name
    ))
    .into()
}

/// Runs the command on opened stores, then closes them (on success and on
/// error).
async fn run_with<J: CliJournal, P: CliStore>(
    app: &App,
    cli: &Cli,
    journal: J,
    store: P,
    open: Open,
) -> Result<()> {
    let ctx = Ctx {
        app,
        journal,
        store,
        config: open.config,
        shutdown: open.shutdown,
        read_only: open.access == Access::ReadOnly,
    };
    let result = dispatch(cli, &ctx).await;
    ctx.journal.shut().await;
    ctx.store.shut().await;
    result
}

async fn dispatch<J: CliJournal, P: CliStore>(cli: &Cli, ctx: &Ctx<'_, J, P>) -> Result<()> {
    match &cli.command {
        Command::Work(a) => work::work(ctx, a).await,
        Command::Report(a) => maintenance::report(ctx, a).await,
        Command::Requeue(a) => maintenance::requeue(ctx, a).await,
        Command::RequeueDead(a) => maintenance::requeue_dead(ctx, a).await,
        Command::Retry(a) => maintenance::retry(ctx, a).await,
        Command::Row(a) => maintenance::row(ctx, a).await,
        Command::Leases(a) => leases::leases(ctx, a).await,
        Command::Workers(a) => maintenance::workers(ctx, a).await,
        Command::Partitions(a) => partitions::partitions(ctx, a).await,
        Command::Sinks(a) => sinks::sinks(ctx, a).await,
        Command::Consumers(a) => sinks::consumers(ctx, a).await,
        Command::Skipped(a) => skipped::skipped(ctx, a).await,
        Command::Wait(a) => wait::wait(ctx, a).await,
        Command::Migrate(a) => maintenance::migrate(ctx, a).await,
        Command::Verify(a) => maintenance::verify(ctx, a).await,
        Command::Replay(a) => replay::replay(ctx, a).await,
        Command::Rebuild(a) => replay::rebuild(ctx, a).await,
        Command::Runs(a) => replay::runs(ctx, a).await,
        Command::Gaps(a) => gaps::gaps(ctx, a).await,
        Command::Generations(a) => generations::generations(ctx, a).await,
        Command::Shadow(a) => generations::shadow(ctx, a).await,
        Command::Promote(a) => generations::promote(ctx, a).await,
        #[cfg(feature = "serve")]
        Command::Serve(a) => crate::serve::serve(ctx, a).await,
    }
}
