//! The subcommands.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use outbox_core::{
    Digest, DigestBuilder, DigestValue, Error, OutboxRow, OutboxStatus, Projection, ProjectionStore,
    RunRecord, Seq, StreamId, WakeSource, WorkerInfo, select_mode,
};
use outbox_postgres::sqlx::postgres::PgConnectOptions;
use outbox_postgres::{PgJournal, PgOptions, PgProjectionStore};
use outbox_runtime::{Config, JournalBackend, Outbox, ProjectionBackend, StreamLag};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};
use serde::Serialize;
use sqlx::{Connection, PgConnection};
use tokio_util::sync::CancellationToken;

use crate::cli::{Cli, Command, GapsArgs, ReplayArgs, ReportArgs, RunsAction, RunsArgs, WorkArgs};
use crate::domain::{self, Faults};
use crate::output::{human_ms, json, json_line};

/// The journal side of a backend, as the commands use it.
pub(crate) trait CliJournal: JournalBackend + Clone {
    /// Where it is, for `migrate` (a path, or a Postgres schema).
    fn describe(&self) -> String;
    /// Cross-process wake-ups for the worker, when the backend has them.
    fn wake(&self) -> Option<Arc<dyn WakeSource>>;
    /// Closes its connections.
    fn shut(&self) -> impl Future<Output = ()> + Send;
}

/// The projection side of a backend: the demo domain's projections on its
/// connection type.
pub(crate) trait CliStore: ProjectionBackend + Clone {
    /// The demo domain's projections for this store's transaction handle.
    fn domain_projections(faults: &Faults) -> Vec<Arc<dyn Projection<Self::Tx>>>;
    /// Where it is, for `migrate`.
    fn describe(&self) -> String;
    /// Closes its connections.
    fn shut(&self) -> impl Future<Output = ()> + Send;
}

impl CliJournal for SqliteJournal {
    fn describe(&self) -> String {
        self.path().display().to_string()
    }
    fn wake(&self) -> Option<Arc<dyn WakeSource>> {
        None
    }
    async fn shut(&self) {
        self.close().await;
    }
}

impl CliStore for SqliteProjectionStore {
    fn domain_projections(faults: &Faults) -> Vec<Arc<dyn Projection<Self::Tx>>> {
        domain::projections(faults)
    }
    fn describe(&self) -> String {
        self.path().display().to_string()
    }
    async fn shut(&self) {
        self.close().await;
    }
}

impl CliJournal for PgJournal {
    fn describe(&self) -> String {
        format!("postgres schema {}", self.schema())
    }
    fn wake(&self) -> Option<Arc<dyn WakeSource>> {
        Some(self.wake_source())
    }
    async fn shut(&self) {
        self.close().await;
    }
}

impl CliStore for PgProjectionStore {
    fn domain_projections(faults: &Faults) -> Vec<Arc<dyn Projection<Self::Tx>>> {
        domain::projections(faults)
    }
    fn describe(&self) -> String {
        format!("postgres schema {}", self.schema())
    }
    async fn shut(&self) {
        self.close().await;
    }
}

/// The runtime over a journal and a projection store.
pub(crate) type Runtime<J, P> = Outbox<J, P>;

/// A database location parsed from a URL or path.
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A Postgres database: the `postgres://` or `postgresql://` URL as given
    /// (never shown: it may hold a password).
    Postgres(String),
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Sqlite(p) => f.debug_tuple("Sqlite").field(p).finish(),
            Location::Postgres(_) => f.write_str("Postgres(<url not shown>)"),
        }
    }
}

/// Parses a database URL: `postgres://...` / `postgresql://...`,
/// `sqlite://path`, `sqlite:path` or a plain path (SQLite). The one place a
/// backend is chosen from a scheme.
pub fn open_url(url: &str) -> Result<Location, Error> {
    match url.split_once(':') {
        Some(("sqlite", rest)) => {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(Error::invalid(format_args!("database URL {url:?} names no file")));
            }
            Ok(Location::Sqlite(PathBuf::from(path)))
        }
        Some(("postgres" | "postgresql", rest)) if rest.starts_with("//") => {
            Ok(Location::Postgres(url.to_owned()))
        }
        Some(("postgres" | "postgresql", _)) => Err(Error::invalid(
            "a postgres URL must start with postgres:// or postgresql:// (url not shown)",
        )),
        Some((scheme, rest)) if rest.starts_with("//") => Err(Error::invalid(format_args!(
            "unsupported database URL scheme {scheme:?} (use sqlite://path or postgres://...)"
        ))),
        _ if url.is_empty() => Err(Error::invalid("the database URL is empty")),
        _ => Ok(Location::Sqlite(PathBuf::from(url))),
    }
}

/// Opens both SQLite stores. `create` allows creating missing files
/// (migrate, demo); every other command refuses a missing database.
pub(crate) async fn open_sqlite(
    journal_path: PathBuf,
    projection_path: PathBuf,
    create: bool,
) -> Result<(SqliteJournal, SqliteProjectionStore), Error> {
    let opts = SqliteOptions::default().with_create_if_missing(create);
    if journal_path == projection_path {
        return Err(Error::invalid(format_args!(
            "the journal and the projection database must be different files (both are {})",
            journal_path.display()
        )));
    }
    let journal = SqliteJournal::open(&journal_path, opts.clone()).await?;
    match SqliteProjectionStore::open(&projection_path, opts).await {
        Ok(store) => Ok((journal, store)),
        Err(e) => {
            journal.close().await;
            Err(e)
        }
    }
}

fn pg_connect_options(url: &str) -> Result<PgConnectOptions, Error> {
    PgConnectOptions::from_str(url).map_err(|_| {
        Error::invalid("malformed postgres connection url (url not shown; it may contain a password)")
    })
}

/// Refuses a Postgres schema that does not hold the role's outbox tables
/// (every command but `migrate` works on an existing outbox, as on SQLite).
async fn pg_require(connect: &PgConnectOptions, schema: &str, meta: &str, what: &str) -> Result<(), Error> {
    let shown =
        |e: sqlx::Error| Error::temporary(format!("connecting to postgres to check schema {schema}: {e}"), e);
    let mut conn = PgConnection::connect_with(connect).await.map_err(shown)?;
    let found: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(format!("{schema}.{meta}"))
        .fetch_one(&mut conn)
        .await
        .map_err(shown)?;
    let _ = conn.close().await;
    match found {
        Some(_) => Ok(()),
        None => Err(Error::NotFound(format!(
            "postgres schema {schema} holds no outbox {what} (run `outbox migrate` to create it)"
        ))),
    }
}

/// Opens both Postgres stores in `schema`. Equal URLs share one pool and
/// schema (`PgProjectionStore::sharing`); otherwise each store connects on
/// its own. Without `create`, a schema without the outbox tables is refused.
pub(crate) async fn open_postgres(
    journal_url: &str,
    projection_url: &str,
    schema: &str,
    create: bool,
) -> Result<(PgJournal, PgProjectionStore), Error> {
    outbox_postgres::validate_identifier(schema).map_err(|e| Error::Config(format!("--schema: {e}")))?;
    let options = PgOptions::default().with_schema(schema);
    let jc = pg_connect_options(journal_url)?;
    let pc = pg_connect_options(projection_url)?;
    if !create {
        pg_require(&jc, schema, "outbox_journal_meta", "journal").await?;
        pg_require(&pc, schema, "outbox_projection_meta", "projection tables").await?;
    }
    let journal = PgJournal::connect_with(jc, options.clone()).await?;
    let store = if journal_url == projection_url {
        PgProjectionStore::sharing(&journal).await
    } else {
        PgProjectionStore::connect_with(pc, options).await
    };
    match store {
        Ok(store) => Ok((journal, store)),
        Err(e) => {
            journal.close().await;
            Err(e)
        }
    }
}

/// The runtime configuration for the CLI: the OUTBOX_* variables, with the
/// apply worker on when none of the three mode flags is set.
pub(crate) fn config() -> Result<Config, Error> {
    let flags_set = [
        "OUTBOX_ENABLED",
        "OUTBOX_WORKER_ENABLED",
        "OUTBOX_SHADOW_WORKER_ENABLED",
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

pub(crate) async fn build<J: CliJournal, P: CliStore>(
    journal: J,
    store: P,
    config: Config,
    faults: &Faults,
) -> Result<Runtime<J, P>, Error> {
    let wake = journal.wake();
    let mut b = Outbox::builder(journal, store)
        .config(config)
        .event_types(domain::event_types());
    if let Some(w) = wake {
        b = b.wake_source(w);
    }
    for p in P::domain_projections(faults) {
        b = b.projection(p);
    }
    b.build().await
}

/// The opened databases and the configuration of one command.
struct Ctx<J, P> {
    journal: J,
    store: P,
    config: Config,
}

/// The runtime over the opened databases, with the demo's fix deployed.
async fn runtime<J: CliJournal, P: CliStore>(ctx: &Ctx<J, P>) -> Result<Runtime<J, P>, Error> {
    let faults = Faults::default();
    faults.deploy_fix();
    build(
        ctx.journal.clone(),
        ctx.store.clone(),
        ctx.config.clone(),
        &faults,
    )
    .await
}

/// The configuration: the OUTBOX_* variables, and for `work` its flags and
/// the check that the mode runs a worker.
fn command_config(cli: &Cli) -> Result<Config, Error> {
    let mut config = config()?;
    if let Command::Work(a) = &cli.command {
        if let Some(ms) = a.interval_ms {
            config = config.with_poll_interval(Duration::from_millis(ms));
        }
        if let Some(n) = a.batch_size {
            config = config.with_batch_size(n as usize);
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

/// Runs one parsed command line.
///
/// Everything that can be checked without a database (configuration,
/// identifiers) is checked before one is opened, and the databases are
/// closed before returning, on success and on error: the last close
/// checkpoints the WAL and removes the `-wal` and `-shm` files.
pub async fn run(cli: Cli) -> Result<()> {
    if let Command::Demo(a) = &cli.command {
        return crate::demo::demo(a).await;
    }
    let config = command_config(&cli)?;
    if let Command::Requeue(a) = &cli.command {
        StreamId::new(&a.stream)?;
        Seq::new(a.seq)?;
    }
    let create = matches!(cli.command, Command::Migrate(_));
    match (open_url(&cli.journal)?, open_url(&cli.projection_db)?) {
        (Location::Sqlite(j), Location::Sqlite(p)) => {
            let (journal, store) = open_sqlite(j, p, create).await?;
            run_with(&cli, journal, store, config).await
        }
        (Location::Postgres(j), Location::Postgres(p)) => {
            let (journal, store) = open_postgres(&j, &p, &cli.schema, create).await?;
            run_with(&cli, journal, store, config).await
        }
        _ => Err(Error::invalid(
            "the journal and the projection database must use the same backend (both sqlite or both postgres)",
        )
        .into()),
    }
}

/// Runs the command on opened stores, then closes them (on success and on
/// error).
async fn run_with<J: CliJournal, P: CliStore>(cli: &Cli, journal: J, store: P, config: Config) -> Result<()> {
    let ctx = Ctx {
        journal,
        store,
        config,
    };
    let result = dispatch(cli, &ctx).await;
    ctx.journal.shut().await;
    ctx.store.shut().await;
    result
}

async fn dispatch<J: CliJournal, P: CliStore>(cli: &Cli, ctx: &Ctx<J, P>) -> Result<()> {
    match &cli.command {
        Command::Work(a) => work(ctx, a).await,
        Command::Report(a) => report(ctx, a).await,
        Command::Requeue(a) => {
            let stream = StreamId::new(&a.stream)?;
            let seq = Seq::new(a.seq)?;
            let rt = runtime(ctx).await?;
            let row = rt.journal().requeue(&stream, seq).await?;
            if a.json {
                json(&row)
            } else {
                println!(
                    "requeued {}/{} ({}): pending, attempts 0, due now",
                    row.stream, row.seq, row.event_type
                );
                Ok(())
            }
        }
        Command::RequeueDead(a) => {
            let rt = runtime(ctx).await?;
            let rows = rt.journal().requeue_dead(a.limit as usize).await?;
            if a.json {
                json(&rows)
            } else {
                println!("requeued {} dead row(s)", rows.len());
                for r in &rows {
                    println!("  {}/{} {}", r.stream, r.seq, r.event_type);
                }
                Ok(())
            }
        }
        Command::Replay(a) => replay(ctx, a).await,
        Command::Rebuild(a) => {
            let rt = runtime(ctx).await?;
            let cancel = cancel_on_signal();
            let runs = match &a.which.projection {
                Some(p) => vec![rt.rebuild(p, &cancel).await?],
                None => rt.rebuild_all(&cancel).await?,
            };
            print_runs(&runs, a.json)?;
            fail_unless_completed(&runs)
        }
        Command::Runs(a) => runs(ctx, a).await,
        Command::Gaps(a) => gaps(ctx, a).await,
        Command::Workers(a) => {
            let rt = runtime(ctx).await?;
            let workers = rt.journal().workers().await?;
            if a.json {
                json(&workers)
            } else {
                print_workers(&workers);
                Ok(())
            }
        }
        Command::Migrate(a) => {
            let rt = runtime(ctx).await?;
            #[derive(Serialize)]
            struct Migrated<'a> {
                journal: String,
                projection: String,
                projections: Vec<&'a str>,
            }
            let out = Migrated {
                journal: rt.journal().describe(),
                projection: rt.store().describe(),
                projections: rt.projections().iter().map(|p| p.name().as_str()).collect(),
            };
            if a.json {
                json(&out)
            } else {
                println!("journal    {} (migrated)", out.journal);
                println!(
                    "projection {} (migrated; tables of {})",
                    out.projection,
                    out.projections.join(", ")
                );
                Ok(())
            }
        }
        Command::Demo(a) => crate::demo::demo(a).await,
    }
}

/// A token cancelled by Ctrl-C or SIGTERM.
fn cancel_on_signal() -> CancellationToken {
    outbox_runtime::cancel_on_shutdown_signal()
}

async fn work<J: CliJournal, P: CliStore>(ctx: &Ctx<J, P>, a: &WorkArgs) -> Result<()> {
    // The configuration (flags applied, a worker mode) was checked by `run`.
    let rt = runtime(ctx).await?;
    if a.once {
        let tick = rt.tick().await?;
        if a.json {
            json_line(&tick)?;
        } else if !a.quiet {
            println!(
                "{} pass: {} due stream(s), {} claimed, {} completed, {} failed, {} dead-lettered, {} contended",
                rt.mode(),
                tick.due_streams,
                tick.claimed,
                tick.completed,
                tick.failed,
                tick.dead_lettered,
                tick.contended
            );
        }
        return Ok(());
    }
    let running = rt.start().await?;
    if let Some(r) = running.repair_report()
        && !(a.quiet || a.json)
        && r.streams_repaired > 0
    {
        println!(
            "start-up repair: {} stream(s) caught up, {} event(s) applied",
            r.streams_repaired, r.events_applied
        );
    }
    if !a.quiet && !a.json {
        println!("{} worker {} running (Ctrl-C to stop)", rt.mode(), rt.worker_id());
    }
    let cancel = cancel_on_signal();
    let mut every = tokio::time::interval(Duration::from_millis(a.report_ms));
    every.tick().await;
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = every.tick() => {
                let m = rt.metrics();
                if a.json {
                    json_line(&m)?;
                } else if !a.quiet {
                    let g = m.gauges.clone().unwrap_or_default();
                    println!(
                        "applied {} | duplicates {} | failed {} | dead {} | queue: {} pending, {} failed, {} dead | lag {}",
                        m.applied, m.duplicates, m.failed, m.dead_lettered, g.pending, g.failed, g.dead,
                        human_ms(g.oldest_due_age_ms)
                    );
                }
            }
        }
    }
    running.shutdown().await;
    if !a.quiet && !a.json {
        println!("stopped: leases released, nothing left processing");
    }
    Ok(())
}

/// Per-projection digests and the whole store's digest.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Digests {
    pub(crate) projections: Vec<(String, String)>,
    pub(crate) store: String,
}

pub(crate) async fn digests<P: ProjectionStore>(
    store: &P,
    projections: &[Arc<dyn Projection<P::Tx>>],
) -> Result<Digests, Error> {
    let mut out = Vec::new();
    let mut whole = DigestBuilder::new();
    whole.table("projections");
    for p in projections {
        let d: Digest = store.digest(p.as_ref()).await?;
        let hex = d.to_string();
        whole.row(&[DigestValue::Text(p.name().as_str()), DigestValue::Text(&hex)]);
        out.push((p.name().to_string(), hex));
    }
    Ok(Digests {
        projections: out,
        store: whole.finish().to_string(),
    })
}

#[derive(Serialize)]
pub(crate) struct Report {
    pub(crate) as_of: String,
    pub(crate) pending: u64,
    pub(crate) processing: u64,
    pub(crate) failed: u64,
    pub(crate) dead: u64,
    pub(crate) total: u64,
    pub(crate) oldest_retry_eligible: Option<OutboxRow>,
    pub(crate) oldest_due_age_ms: u64,
    pub(crate) rows: Vec<OutboxRow>,
    pub(crate) digests: Option<Digests>,
    pub(crate) workers: Vec<WorkerInfo>,
    pub(crate) active_runs: Vec<RunRecord>,
}

pub(crate) async fn build_report<J: CliJournal, P: CliStore>(
    rt: &Runtime<J, P>,
    status: Option<OutboxStatus>,
    limit: u64,
    with_digests: bool,
) -> Result<Report, Error> {
    let summary = rt.journal().summary().await?;
    let g = rt.refresh_gauges().await?;
    let rows = if limit == 0 {
        Vec::new()
    } else {
        rt.journal().list(status, limit as usize).await?
    };
    let digests = if with_digests {
        Some(digests(rt.store(), rt.projections()).await?)
    } else {
        None
    };
    let active_runs = rt
        .store()
        .runs(50)
        .await?
        .into_iter()
        .filter(|r| r.state.is_active())
        .collect();
    Ok(Report {
        as_of: summary.as_of.to_string(),
        pending: summary.pending,
        processing: summary.processing,
        failed: summary.failed,
        dead: summary.dead,
        total: summary.total(),
        oldest_retry_eligible: summary.oldest_retry_eligible.clone(),
        oldest_due_age_ms: g.oldest_due_age_ms,
        rows,
        digests,
        workers: rt.journal().workers().await?,
        active_runs,
    })
}

pub(crate) fn print_report(r: &Report, status: Option<OutboxStatus>) {
    println!("outbox report at {}", r.as_of);
    println!(
        "  rows: {} pending, {} processing, {} failed, {} dead ({} in all)",
        r.pending, r.processing, r.failed, r.dead, r.total
    );
    match &r.oldest_retry_eligible {
        Some(row) => println!(
            "  oldest retry-eligible: {}/{} {} ({}, attempts {}, due {}) - lag {}",
            row.stream,
            row.seq,
            row.event_type,
            row.status,
            row.attempt_count,
            row.next_attempt_at,
            human_ms(r.oldest_due_age_ms)
        ),
        None => println!("  oldest retry-eligible: none (lag 0)"),
    }
    if r.dead > 0 {
        println!(
            "  dead letters: {} (fix the cause, then `outbox requeue-dead --limit N`)",
            r.dead
        );
    }
    if !r.rows.is_empty() {
        let which = status.map_or("rows".to_string(), |s| format!("{s} rows"));
        println!("  {which} (first {}):", r.rows.len());
        for row in &r.rows {
            let err = row
                .last_error
                .as_deref()
                .map(|e| format!(" - {e}"))
                .unwrap_or_default();
            println!(
                "    {}/{} {} {} attempts={} next={}{}",
                row.stream, row.seq, row.event_type, row.status, row.attempt_count, row.next_attempt_at, err
            );
        }
    }
    if let Some(d) = &r.digests {
        println!("  digests:");
        for (name, hex) in &d.projections {
            println!("    {name:<18} {hex}");
        }
        println!("    {:<18} {}", "(store)", d.store);
    }
    if !r.workers.is_empty() {
        println!("  workers:");
        for w in &r.workers {
            println!(
                "    {} {} pid {} on {}, last beat {}",
                w.id, w.mode, w.pid, w.host, w.last_beat
            );
        }
    }
    for run in &r.active_runs {
        println!(
            "  active run {}: {} {} ({}, {} processed)",
            run.id, run.kind, run.projection, run.state, run.processed
        );
    }
}

async fn report<J: CliJournal, P: CliStore>(ctx: &Ctx<J, P>, a: &ReportArgs) -> Result<()> {
    let rt = runtime(ctx).await?;
    let r = build_report(&rt, a.status, a.limit, !a.no_digests).await?;
    if a.json {
        json(&r)
    } else {
        print_report(&r, a.status);
        Ok(())
    }
}

async fn replay<J: CliJournal, P: CliStore>(ctx: &Ctx<J, P>, a: &ReplayArgs) -> Result<()> {
    let rt = runtime(ctx).await?;
    let cancel = cancel_on_signal();
    let mut runs = Vec::new();
    match &a.which.projection {
        Some(p) => runs.push(rt.replay(p, a.until, &cancel).await?),
        None => {
            let names: Vec<String> = rt.projections().iter().map(|p| p.name().to_string()).collect();
            for p in names {
                let run = rt.replay(&p, a.until, &cancel).await?;
                let stop = run.state != outbox_core::RunState::Completed;
                runs.push(run);
                if stop {
                    break;
                }
            }
        }
    }
    print_runs(&runs, a.json)?;
    fail_unless_completed(&runs)
}

fn fail_unless_completed(runs: &[RunRecord]) -> Result<()> {
    match runs.iter().find(|r| r.state == outbox_core::RunState::Failed) {
        Some(r) => Err(Error::storage(
            format!(
                "run {} ({} {}) failed: {}",
                r.id,
                r.kind,
                r.projection,
                r.error_message.as_deref().unwrap_or("unknown error")
            ),
            std::io::Error::other(r.error_code.clone().unwrap_or_default()),
        )
        .into()),
        None => Ok(()),
    }
}

fn print_runs(runs: &[RunRecord], as_json: bool) -> Result<()> {
    if as_json {
        return json(&runs);
    }
    if runs.is_empty() {
        println!("no runs");
    }
    for r in runs {
        let last = match (&r.last_stream, r.last_seq) {
            (Some(s), Some(q)) => format!(" last {s}/{q}"),
            _ => String::new(),
        };
        let until = r.until.map(|u| format!(" until {u}")).unwrap_or_default();
        let err = r
            .error_message
            .as_deref()
            .map(|m| format!(" error [{}] {m}", r.error_code.as_deref().unwrap_or("")))
            .unwrap_or_default();
        let cancel = if r.cancel_requested && r.state.is_active() {
            " (cancel requested)"
        } else {
            ""
        };
        println!(
            "run {:>4}  {:<9} {:<18} {:<9} processed {}{}{}{}{}  owner {} updated {}",
            r.id, r.kind, r.projection, r.state, r.processed, until, last, err, cancel, r.owner, r.updated_at
        );
    }
    Ok(())
}

async fn runs<J: CliJournal, P: CliStore>(ctx: &Ctx<J, P>, a: &RunsArgs) -> Result<()> {
    let rt = runtime(ctx).await?;
    match a.action.as_ref().unwrap_or(&RunsAction::List { limit: 20 }) {
        RunsAction::List { limit } => print_runs(&rt.store().runs(*limit as usize).await?, a.json),
        RunsAction::Show { id } => {
            let run = rt
                .store()
                .run(*id)
                .await?
                .ok_or_else(|| Error::NotFound(format!("run {id}")))?;
            print_runs(&[run], a.json)
        }
        RunsAction::Cancel { id } => {
            let run = rt.cancel_run(*id).await?;
            print_runs(&[run], a.json)
        }
    }
}

async fn gaps<J: CliJournal, P: CliStore>(ctx: &Ctx<J, P>, a: &GapsArgs) -> Result<()> {
    let rt = runtime(ctx).await?;
    let lags: Vec<StreamLag> = rt.gaps(10_000).await?;
    if !a.repair {
        if a.json {
            return json(&lags);
        }
        if lags.is_empty() {
            println!("no gaps: every projection has applied every stream through its journal head");
        }
        for l in &lags {
            let behind: Vec<String> = l.behind.iter().map(|(p, cp)| format!("{p} at {cp}")).collect();
            println!(
                "{}: head {}, watermark {}, behind: {}",
                l.stream,
                l.head,
                l.watermark,
                behind.join(", ")
            );
        }
        return Ok(());
    }
    let report = rt.repair_gaps().await?;
    if a.json {
        json(&report)?;
    } else {
        println!(
            "repaired {} of {} stream(s): {} event(s) applied ({} watermark(s) were behind)",
            report.streams_repaired, report.streams_scanned, report.events_applied, report.watermark_behind
        );
        for f in &report.failures {
            println!("  could not repair {}: {}", f.stream, f.error);
        }
    }
    if let Some(f) = report.failures.first() {
        return Err(Error::storage(
            format!(
                "{} stream(s) could not be repaired, first {}",
                report.failures.len(),
                f.stream
            ),
            std::io::Error::other(f.error.clone()),
        )
        .into());
    }
    Ok(())
}

fn print_workers(workers: &[WorkerInfo]) {
    if workers.is_empty() {
        println!("no live workers registered");
    }
    for w in workers {
        println!(
            "{}  {}  host {} pid {}  started {}  last beat {}  expires {}",
            w.id, w.mode, w.host, w.pid, w.started_at, w.last_beat, w.expires_at
        );
    }
}
