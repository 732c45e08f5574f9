//! Command-line definitions (clap).

use clap::{Args, Parser, Subcommand};
use outbox_core::OutboxStatus;

/// Defines each of the command's own variables once, in the shape of
/// `outbox_runtime::ENV_VARS`: `NAME = "default", "meaning";` becomes the
/// constant `NAME` (whose value is its own name) and a row of [`ENV_VARS`].
/// `cargo xtask tidy` reads these lines as text.
macro_rules! env_vars {
    ($($name:ident = $default:literal, $meaning:literal;)*) => {
        $(
            #[doc = concat!("`", stringify!($name), "` (default `", $default, "`): ", $meaning, ".")]
            pub const $name: &str = stringify!($name);
        )*

        /// The environment variables of the `outbox` command itself, as
        /// `(name, default, meaning)` (the runtime's are
        /// `outbox_runtime::ENV_VARS`); the meaning is one line of Markdown.
        ///
        /// The one definition of these variables: [`GlobalArgs`] reads them
        /// (and takes its defaults from here), and the configuration table of
        /// the repository's README is generated from this table by
        /// `cargo xtask tidy --fix`; `cargo xtask tidy` fails when they differ.
        pub const ENV_VARS: &[(&str, &str, &str)] = &[$(($name, $default, $meaning)),*];
    };
}

// One line per variable, kept in this shape (`cargo xtask tidy` parses it).
#[rustfmt::skip]
env_vars! {
    OUTBOX_JOURNAL_URL = "sqlite://outbox-journal.db", "the `outbox` command's journal database (`--journal`)";
    OUTBOX_PROJECTION_URL = "sqlite://outbox-projections.db", "the `outbox` command's projection database (`--projection-db`; `postgres://` URLs work too)";
    OUTBOX_PG_SCHEMA = "outbox", "the `outbox` command's Postgres schema (`--schema`; both stores)";
    OUTBOX_LOG = "warn", "the `outbox` command's log filter (`--log`)";
    OUTBOX_PARTITIONS = "(the journal's)", "the journal's partition count (`--partitions`, 1 to 1024): a new journal is created with it (16 when unset); a journal stored with another count is refused (`outbox partitions resize` repartitions it)";
    OUTBOX_SERVE_TOKEN = "(unset)", "the operator token `outbox serve` asks for before an action (requeue, retry, cancel), at least 16 characters and not guessable (`openssl rand -hex 32`); unset: the pages are read-only. Off loopback it also opens the pages. Read from the environment only, never a flag";
    OUTBOX_SERVE_READ_TOKEN = "(unset)", "a token that opens the pages and `/metrics` of `outbox serve` and `work --metrics-addr` on a non-loopback bind (as Bearer or Basic), but no action; same strength rule. Read from the environment only, never a flag";
    OUTBOX_SERVE_ALLOWED_HOSTS = "", "the `Host` names the monitor and `--metrics-addr` answer to (`--allowed-hosts`, comma-separated, `*` for any); empty: localhost, 127.0.0.1, ::1 and the bound address";
    OUTBOX_SERVE_MAX_CONNECTIONS = "256", "connections the monitor and `--metrics-addr` keep open at most (`--max-connections`); a new one then closes the oldest that has not sent its whole request, or is closed at once when every open one has";
}

/// The default of one of [`ENV_VARS`].
fn default_of(name: &str) -> &'static str {
    ENV_VARS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, default, _)| *default)
        .expect("a variable of ENV_VARS")
}

/// The transactional projection-apply outbox: worker and maintenance.
///
/// Databases: `--journal` / `--projection-db` (or `OUTBOX_JOURNAL_URL` /
/// `OUTBOX_PROJECTION_URL`), as `sqlite://path`, `sqlite:path` or a plain
/// path, or `postgres://...` (both must use the same backend; on Postgres the
/// stores live in `--schema`, and equal URLs share one pool and schema).
/// Defaults: `outbox-journal.db` and `outbox-projections.db` in the current
/// directory. (`--projection NAME` of `replay` and `rebuild` names a
/// projection, not a database.)
///
/// Exit codes: 0 ok, 1 internal error, 2 usage or invalid input, 3 not
/// found, 4 conflict (wrong state, version conflict, a run already active),
/// 5 storage error.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, propagate_version = true, max_term_width = 100)]
pub struct Cli {
    /// The databases and logging.
    #[command(flatten)]
    pub global: GlobalArgs,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The options every subcommand takes: where the databases are, and logging.
#[derive(Clone, Debug, Args)]
pub struct GlobalArgs {
    /// The journal database (events, outbox rows, leases). A `sqlite://`
    /// URL ending in `?mode=ro` is opened read-only (as are files this user
    /// cannot write): the commands that only read (report, row, serve, ...)
    /// run and write nothing; the others refuse.
    #[arg(
        long,
        visible_alias = "journal-db",
        global = true,
        env = OUTBOX_JOURNAL_URL,
        default_value = default_of(OUTBOX_JOURNAL_URL)
    )]
    pub journal: String,

    /// The projection database (checkpoints, watermarks, runs, projection
    /// tables); `?mode=ro` as for --journal.
    // Not `--projection`: that flag of `replay` and `rebuild` names a
    // projection, and one id for both made either overwrite the other.
    #[arg(
        long = "projection-db",
        global = true,
        env = OUTBOX_PROJECTION_URL,
        default_value = default_of(OUTBOX_PROJECTION_URL)
    )]
    pub projection_db: String,

    /// The Postgres schema holding the outbox tables (and the projection
    /// tables) of `postgres://` databases. Ignored for SQLite.
    #[arg(long, global = true, env = OUTBOX_PG_SCHEMA, default_value = default_of(OUTBOX_PG_SCHEMA))]
    pub schema: String,

    /// The journal's partition count (a new journal is created with it, 16
    /// when unset; a journal stored with another count is refused).
    #[arg(long, global = true, env = OUTBOX_PARTITIONS, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub partitions: Option<u16>,

    /// Log filter for diagnostics on stderr (e.g. `info`, `outbox_runtime=debug`).
    /// Default: `warn`.
    #[arg(long, global = true, env = OUTBOX_LOG)]
    pub log: Option<String>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the configured worker (apply or shadow, from OUTBOX_* variables;
    /// the apply worker when none is set).
    Work(WorkArgs),
    /// Queue counts, oldest due row and lag, dead letters, rows, digests
    /// (reads only: runs on read-only databases).
    Report(ReportArgs),
    /// Requeue one dead row (status pending, attempts 0, due now) and every
    /// projection dead-lettered on that event (or one, with --projection).
    Requeue(RequeueArgs),
    /// Requeue up to N dead rows, oldest first by (next attempt, stream, seq),
    /// then up to N dead projection exceptions by (projection, stream).
    RequeueDead(RequeueDeadArgs),
    /// Make one failed or pending row due now (status pending, attempts kept).
    Retry(RetryArgs),
    /// List the stream leases; --break STREAM --yes frees a stuck one.
    Leases(LeasesArgs),
    /// Show one outbox row: status, attempts, next attempt, last error.
    Row(RowArgs),
    /// Catch a projection up from its checkpoints (or every projection with --all).
    Replay(ReplayArgs),
    /// Clear a projection and replay it from the journal's origin (or all, in order).
    Rebuild(RebuildArgs),
    /// List, show or cancel replay and rebuild runs.
    Runs(RunsArgs),
    /// List the generations of view projections; `drop` deletes one that
    /// is not live (ADR 0021).
    Generations(GenerationsArgs),
    /// Build a projection's registered candidate version into a shadow
    /// generation, or compare it with the live code stream by stream.
    Shadow(ShadowArgs),
    /// Swap the generation being built in, only when its running digest
    /// agrees with the live one's (or with --force).
    Promote(PromoteArgs),
    /// List streams whose projections are behind the journal; --repair catches them up.
    Gaps(GapsArgs),
    /// List the workers registered in the journal database.
    Workers(JsonArg),
    /// The journal's partitions: owner, epoch, expiry and rows of each;
    /// `resize` repartitions the journal (ADR 0022).
    Partitions(PartitionsArgs),
    /// The sinks' delivery: streams, failures, dead letters, scan position;
    /// `requeue` retries a dead-lettered stream (ADR 0023).
    Sinks(SinksArgs),
    /// The consumers (projections and sinks) the journal knows, with the
    /// code version and whether a live worker runs each; `retire` removes
    /// one no deployment runs any more (ADR 0032).
    Consumers(ConsumersArgs),
    /// The events projections skipped with a record (an applier's
    /// `ApplyError::skip`); `reapply` applies one now, once (ADR 0032).
    Skipped(SkippedArgs),
    /// Wait until projections have applied an event (read-your-writes):
    /// exit 0 once applied, 4 at once when one is dead there or paused, 5
    /// when the timeout passes first (each names the projection).
    Wait(WaitArgs),
    /// Create the databases if needed and apply schema migrations.
    Migrate(JsonArg),
    /// Recompute view projections' running digests from every document and
    /// compare them with the recorded ones (exit 4 on a difference).
    Verify(VerifyArgs),
    /// The web monitor and Prometheus `/metrics` (127.0.0.1:9464 by default;
    /// actions need OUTBOX_SERVE_TOKEN, and write access: on read-only
    /// databases every action is refused).
    #[cfg(feature = "serve")]
    Serve(ServeArgs),
}

/// `outbox serve`.
#[cfg(feature = "serve")]
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on. Anything but a loopback address needs
    /// OUTBOX_SERVE_TOKEN (start-up refuses otherwise).
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub addr: std::net::SocketAddr,
    /// Streams scanned at most for the projections' checkpoint lag on
    /// `/metrics` and the overview (0: skip it).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub lag_streams: u64,
    /// Milliseconds between two computations of the figures that scan the
    /// streams (the projection lag): one background task computes them,
    /// pages and `/metrics` show the last computation and its time.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub figures_interval_ms: u64,
    /// Outbox rows up to which pages and `/metrics` count the rows by
    /// status on every request (exact; the count walks every row). Past it
    /// they show the counts of the last figures computation, with its time.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(0..=u64::MAX))]
    pub exact_rows: u64,
    /// Blocked streams and rows listed at most per page.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub limit: u64,
    /// The worker lag (milliseconds) over which the overview's health
    /// banner reports the workers behind.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub lag_threshold_ms: u64,
    /// The HTTP front door.
    #[command(flatten)]
    pub http: HttpArgs,
}

/// The HTTP front door of `serve` and `work --metrics-addr`.
#[cfg(feature = "serve")]
#[derive(Debug, Args)]
pub struct HttpArgs {
    /// The `Host` names answered to, comma-separated (`*`: any); by default
    /// localhost, 127.0.0.1, ::1 and the bound address (any IP address on
    /// a 0.0.0.0 or :: bind). Others get 421 (DNS rebinding).
    #[arg(long, env = OUTBOX_SERVE_ALLOWED_HOSTS, default_value = default_of(OUTBOX_SERVE_ALLOWED_HOSTS), hide_default_value = true)]
    pub allowed_hosts: String,
    /// Connections kept open at most; a new one then closes the oldest
    /// that has not sent its whole request, or is closed at once when
    /// every open one has.
    #[arg(long, env = OUTBOX_SERVE_MAX_CONNECTIONS, default_value = default_of(OUTBOX_SERVE_MAX_CONNECTIONS),
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_connections: u64,
    /// Milliseconds a client has to send a request's line and headers
    /// before its connection is closed.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub head_timeout_ms: u64,
    /// Milliseconds a request may take once its head is in (its body, the
    /// page or action, the answer); then 408.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub request_timeout_ms: u64,
    /// Expensive pages (the overview, lists, `/metrics`) served at once;
    /// more get 503 with `Retry-After: 1`.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub max_busy_pages: u64,
}

/// `--json`.
#[derive(Debug, Args)]
pub struct JsonArg {
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

/// `outbox work`.
#[derive(Debug, Args)]
pub struct WorkArgs {
    /// Run one pass, add what it did to the per-minute activity, print it, exit.
    #[arg(long)]
    pub once: bool,
    /// Print one JSON line per tick.
    #[arg(long)]
    pub json: bool,
    /// Compete for every stream with stream leases instead of leasing
    /// partitions (overrides OUTBOX_LEASING; for one worker alone).
    #[arg(long)]
    pub no_leasing: bool,
    /// Idle poll interval in milliseconds (overrides OUTBOX_POLL_INTERVAL_MS).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub interval_ms: Option<u64>,
    /// Rows per claim and per projection transaction (overrides OUTBOX_BATCH_SIZE).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub batch_size: Option<u64>,
    /// Print nothing but errors.
    #[arg(long)]
    pub quiet: bool,
    /// How often a status line is printed, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    pub report_ms: u64,
    /// Serve this worker's counters and the queue gauges as Prometheus
    /// `/metrics` on this address (a loopback one unless OUTBOX_SERVE_TOKEN
    /// or OUTBOX_SERVE_READ_TOKEN is set; off loopback a scrape needs one
    /// of them, as Bearer or Basic).
    #[cfg(feature = "serve")]
    #[arg(long, conflicts_with = "once")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The HTTP front door of `--metrics-addr`.
    #[cfg(feature = "serve")]
    #[command(flatten)]
    pub http: HttpArgs,
}

/// `outbox report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Only rows of this status.
    #[arg(long, value_parser = parse_status)]
    pub status: Option<OutboxStatus>,
    /// Rows listed at most.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub limit: u64,
    /// Skip the projection digests (they read every projection document).
    #[arg(long)]
    pub no_digests: bool,
    /// Streams scanned at most for the projections' checkpoint lag (0: skip it).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub lag_streams: u64,
    /// List the blocked streams instead: every stream whose head row is
    /// failed or dead (first --limit of each status).
    #[arg(long, conflicts_with = "status")]
    pub blocked: bool,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

/// `outbox verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Only this projection (repeatable). Default: the binary's projections
    /// and every projection with a recorded running digest.
    #[arg(long = "projection")]
    pub projections: Vec<String>,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_status(s: &str) -> Result<OutboxStatus, String> {
    s.parse::<OutboxStatus>().map_err(|e| e.to_string())
}

/// `outbox requeue`.
#[derive(Debug, Args)]
pub struct RequeueArgs {
    /// The stream.
    #[arg(long)]
    pub stream: String,
    /// The seq.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub seq: u64,
    /// Only this projection's exception at the stream and seq (by default
    /// the row there, and every projection's exception waiting on it).
    #[arg(long)]
    pub projection: Option<String>,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

/// `outbox row`.
#[derive(Debug, Args)]
pub struct RowArgs {
    /// The stream.
    #[arg(long)]
    pub stream: String,
    /// The seq.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub seq: u64,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

/// `outbox requeue-dead`.
#[derive(Debug, Args)]
pub struct RequeueDeadArgs {
    /// Rows requeued at most.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub limit: u64,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

/// `outbox retry`.
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// The stream.
    #[arg(long)]
    pub stream: String,
    /// The seq.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub seq: u64,
    /// Only this projection's exception at the stream and seq (by default
    /// the row there, and every projection's exception waiting on it).
    #[arg(long)]
    pub projection: Option<String>,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

/// `outbox leases`.
#[derive(Debug, Args)]
pub struct LeasesArgs {
    /// Only this stream's lease.
    #[arg(long, conflicts_with = "break_stream")]
    pub stream: Option<String>,
    /// Leases listed at most (in stream order).
    #[arg(
        long,
        default_value_t = 100,
        conflicts_with = "break_stream",
        value_parser = clap::value_parser!(u64).range(1..=10_000)
    )]
    pub limit: u64,
    /// Free this stream's lease, whoever holds it (epoch kept, so the old
    /// holder's next claim fails). Needs --yes; without it, shows the lease
    /// and changes nothing.
    #[arg(long = "break", value_name = "STREAM")]
    pub break_stream: Option<String>,
    /// Confirm --break.
    #[arg(long, requires = "break_stream")]
    pub yes: bool,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

/// Which projections.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct Which {
    /// One projection.
    #[arg(long)]
    pub projection: Option<String>,
    /// Every projection, in declared order.
    #[arg(long)]
    pub all: bool,
}

/// `outbox replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Which projections.
    #[command(flatten)]
    pub which: Which,
    /// Republish to this sink instead (on purpose: the sink's checkpoints
    /// are left as they are), from the global position given by --from.
    #[arg(long, group = "Which", requires = "from", conflicts_with_all = ["since", "complete_rows"])]
    pub sink: Option<String>,
    /// With --sink: the first global position republished.
    #[arg(long, requires = "sink", value_parser = clap::value_parser!(u64).range(1..))]
    pub from: Option<u64>,
    /// Only events after this global position: the ones at or before it are
    /// taken as already reflected (a stream whose checkpoint is behind its
    /// first event after it is caught up from its checkpoint). Resume a
    /// stopped run with `--since` set to the position `outbox runs` shows.
    #[arg(long)]
    pub since: Option<u64>,
    /// Stop at this global position.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub until: Option<u64>,
    /// Also delete the outbox rows every projection has now applied (dead
    /// ones included). Only against the projection database the live workers
    /// use: rows are theirs, and by default they are left alone.
    #[arg(long)]
    pub complete_rows: bool,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

/// `outbox rebuild`.
#[derive(Debug, Args)]
pub struct RebuildArgs {
    /// Which projections.
    #[command(flatten)]
    pub which: Which,
    /// Build a new generation beside the live one (which keeps serving and
    /// being applied), then swap it in in one transaction; the old one is
    /// kept until `outbox generations drop`. Run it again to resume a build
    /// that was stopped. Needs --projection.
    #[arg(long, conflicts_with = "complete_rows")]
    pub blue_green: bool,
    /// Also delete the outbox rows every projection has now applied (dead
    /// ones included). Only against the projection database the live workers
    /// use: rows are theirs, and by default they are left alone.
    #[arg(long)]
    pub complete_rows: bool,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

/// `outbox generations`.
#[derive(Debug, Args)]
pub struct GenerationsArgs {
    /// Only this projection (with each of its stored generations).
    #[arg(long)]
    pub projection: Option<String>,
    /// `drop`: delete a generation that is not live.
    #[command(subcommand)]
    pub drop: Option<GenerationsAction>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `outbox partitions`.
#[derive(Debug, Args)]
pub struct PartitionsArgs {
    /// `resize`: repartition the journal.
    #[command(subcommand)]
    pub resize: Option<PartitionsAction>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `outbox sinks`.
#[derive(Debug, Args)]
pub struct SinksArgs {
    /// Also list this sink's failing and dead-lettered streams.
    #[arg(long)]
    pub sink: Option<String>,
    /// Streams listed at most with --sink.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub limit: u64,
    /// `requeue` one stream of a sink now, or `rekey` the feed.
    #[command(subcommand)]
    pub action: Option<SinksAction>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `outbox wait`.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// The stream.
    #[arg(long)]
    pub stream: String,
    /// The seq to wait for (an append's last seq on the stream).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub seq: u64,
    /// Only these projections (repeat the flag; default: every projection
    /// of this binary).
    #[arg(long = "projection")]
    pub projections: Vec<String>,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub timeout_ms: u64,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

/// `outbox skipped`.
#[derive(Debug, Args)]
pub struct SkippedArgs {
    /// `reapply` one skipped event.
    #[command(subcommand)]
    pub action: Option<SkippedAction>,
    /// Only this projection's skipped events.
    #[arg(long)]
    pub projection: Option<String>,
    /// List at most this many.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub limit: u64,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `outbox skipped` actions.
#[derive(Debug, Subcommand)]
pub enum SkippedAction {
    /// Apply one skipped event to its projection now (after the stream's
    /// later events, which it has applied) and remove its record, in one
    /// transaction: applied once however often it is asked. The applier's
    /// error, if it fails again, is printed and the record stays.
    Reapply {
        /// The projection that skipped it.
        #[arg(long)]
        projection: String,
        /// The event's stream.
        #[arg(long)]
        stream: String,
        /// The event's seq.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        seq: u64,
    },
}

/// `outbox consumers`.
#[derive(Debug, Args)]
pub struct ConsumersArgs {
    /// `retire` a consumer.
    #[command(subcommand)]
    pub action: Option<ConsumersAction>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `outbox consumers` actions.
#[derive(Debug, Subcommand)]
pub enum ConsumersAction {
    /// Pause a consumer for every stream: no worker applies it; every
    /// worker leaves it a state on each stream whose rows it completes, so
    /// its backlog is kept and reported (workers see it within a heartbeat).
    Pause {
        /// The consumer: a projection's name, or `sink:NAME` for a sink.
        #[arg(long)]
        consumer: String,
    },
    /// Resume a paused consumer: its workers catch it up from its
    /// checkpoints; what failed while it was paused is due at once.
    Resume {
        /// The consumer: a projection's name, or `sink:NAME` for a sink.
        #[arg(long)]
        consumer: String,
    },
    /// Remove a consumer from the registry with every per-stream state kept
    /// for it: workers stop leaving it work. A worker that still runs it
    /// registers it again. A projection's checkpoints and documents stay.
    Retire {
        /// The consumer: a projection's name, or `sink:NAME` for a sink.
        #[arg(long)]
        consumer: String,
        /// Confirm.
        #[arg(long)]
        yes: bool,
    },
}

/// `outbox sinks` actions.
#[derive(Debug, Subcommand)]
pub enum SinksAction {
    /// Make a failing or dead-lettered stream of a sink due now, its attempt
    /// count reset (the next delivery pass publishes from its checkpoint).
    Requeue {
        /// The sink.
        #[arg(long)]
        sink: String,
        /// The stream.
        #[arg(long)]
        stream: String,
    },
    /// After a logical restore into another Postgres server: give the
    /// journal's events and the sinks' scan cursors keys of this server, so
    /// the sinks read the journal again (they refuse keys of another server).
    /// Run it with the workers stopped. Nothing to do on SQLite.
    Rekey,
}

/// `outbox partitions` actions.
#[derive(Debug, Subcommand)]
pub enum PartitionsAction {
    /// Give every stream with outbox rows its partition among COUNT and
    /// store the new count (every worker stopped: refused while any holds
    /// a partition lease).
    Resize {
        /// The new partition count.
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
        count: u16,
        /// Confirm.
        #[arg(long)]
        yes: bool,
    },
}

/// `outbox generations` actions.
#[derive(Debug, Subcommand)]
pub enum GenerationsAction {
    /// Delete one generation's documents, checkpoints and running digest
    /// (the live one is refused; the one being built ends its build).
    Drop {
        /// The projection.
        #[arg(long)]
        projection: String,
        /// The generation number (`outbox generations` lists them).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        generation: u32,
        /// Confirm: the documents are deleted.
        #[arg(long)]
        yes: bool,
    },
}

impl GenerationsAction {
    /// The projection named by the action.
    pub(crate) fn projection(&self) -> &str {
        match self {
            GenerationsAction::Drop { projection, .. } => projection,
        }
    }
}

/// `outbox shadow`.
#[derive(Debug, Args)]
pub struct ShadowArgs {
    /// build or diff.
    #[command(subcommand)]
    pub action: ShadowAction,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `outbox shadow` actions.
#[derive(Debug, Subcommand)]
pub enum ShadowAction {
    /// Build the candidate version into a shadow generation from the
    /// journal (or bring it up to the tail); nothing reads it.
    Build {
        /// The projection.
        #[arg(long)]
        projection: String,
    },
    /// Apply each stream's events to the live code and to the candidate in
    /// memory and list the streams where their documents differ (exit 4).
    Diff {
        /// The projection.
        #[arg(long)]
        projection: String,
        /// Differing streams listed at most.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        limit: u64,
    },
}

/// `outbox promote`.
#[derive(Debug, Args)]
pub struct PromoteArgs {
    /// The projection.
    #[arg(long)]
    pub projection: String,
    /// Swap even when the running digests differ.
    #[arg(long)]
    pub force: bool,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

/// `outbox runs`.
#[derive(Debug, Args)]
pub struct RunsArgs {
    /// list (default), show ID, cancel ID.
    #[command(subcommand)]
    pub action: Option<RunsAction>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `outbox runs` actions.
#[derive(Debug, Subcommand)]
pub enum RunsAction {
    /// Recent runs, newest first.
    List {
        /// Runs listed at most.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        limit: u64,
    },
    /// One run.
    Show {
        /// The run id.
        id: u64,
    },
    /// Ask a run to stop at its next batch boundary (a queued run stops at once).
    Cancel {
        /// The run id.
        id: u64,
    },
}

/// `outbox gaps`.
#[derive(Debug, Args)]
pub struct GapsArgs {
    /// Catch the behind streams up (targeted replay).
    #[arg(long)]
    pub repair: bool,
    /// Also delete the outbox rows every projection has now applied (dead
    /// ones included). Only against the projection database the live workers
    /// use: rows are theirs, and by default they are left alone.
    #[arg(long, requires = "repair")]
    pub complete_rows: bool,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use clap::CommandFactory;

    use super::*;

    #[test]
    fn every_variable_is_read_by_a_flag_with_its_default() {
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        /// Every argument of `cmd` and its subcommands.
        fn all_args(cmd: &clap::Command) -> Vec<clap::Arg> {
            let mut out: Vec<clap::Arg> = cmd.get_arguments().cloned().collect();
            for sub in cmd.get_subcommands() {
                out.extend(all_args(sub));
            }
            out
        }
        let args = all_args(&cmd);
        let reads = |name: &str| {
            args.iter()
                .find(|a| a.get_env() == Some(OsStr::new(name)))
                .cloned()
        };
        for (name, default, _) in ENV_VARS {
            // Read from the environment only (a flag would show in `ps`).
            if *name == OUTBOX_SERVE_TOKEN || *name == OUTBOX_SERVE_READ_TOKEN {
                assert!(reads(name).is_none(), "{name} must not be a flag");
                continue;
            }
            if !cfg!(feature = "serve")
                && [OUTBOX_SERVE_ALLOWED_HOSTS, OUTBOX_SERVE_MAX_CONNECTIONS].contains(name)
            {
                continue;
            }
            let arg = reads(name).unwrap_or_else(|| panic!("no flag reads {name}"));
            // The log filter's default is the application's (`drive`); the
            // partition count's is the journal's own.
            if *name != OUTBOX_LOG && *name != OUTBOX_PARTITIONS {
                assert_eq!(arg.get_default_values(), [OsStr::new(default)], "{name}");
            }
        }
    }
}
