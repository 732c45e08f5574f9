//! `outbox-crash run`: rounds of victims, faults, a clean drain and the check.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_runtime::{Config, FAILPOINTS};

use crate::args::{Args, parse_u64};
use crate::check::{check, read_acks};
use crate::round::{Place, Rng};
use crate::sinks::{BusFigures, Nats};
use crate::victim::Role;

/// The victims' lease TTL: short, so a takeover happens within a round.
const LEASE_TTL_MS: u64 = 1500;
/// How long the clean drain may take before the round fails (liveness only:
/// the check itself never depends on timing).
pub(crate) const DRAIN_LIMIT: Duration = Duration::from_secs(120);
/// How long the fault phase may take before the round fails (liveness).
const FAULT_PHASE_LIMIT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// One round's schedule, all drawn from its seed.
#[derive(Debug)]
struct Plan {
    roles: Vec<Role>,
    appends: Vec<u64>,
    batch_size: u64,
    /// (victim, point, N)
    failpoint: Option<(usize, &'static str, u64)>,
    /// (victim, at ms)
    sigkill: Option<(usize, u64)>,
    /// (victim, at ms, stopped for ms)
    sigstop: Option<(usize, u64, u64)>,
    /// How long the survivors keep working after the appends end, before all are killed.
    tail_ms: u64,
    /// Sink rounds: the round's nats-server SIGKILLed (at ms, down for ms)
    /// and started again on the same port and store.
    nats_kill: Option<(u64, u64)>,
    /// Sink rounds on Postgres: the server stopped with `pg_ctl stop -m
    /// immediate` (at ms, down for ms) and started again.
    pg_restart: Option<(u64, u64)>,
}

fn plan(rng: &mut Rng) -> Plan {
    let n = 2 + rng.below(2) as usize;
    const ROLES: [Role; 4] = [Role::Producer, Role::Inline, Role::Worker, Role::Both];
    let mut roles: Vec<Role> = (0..n).map(|_| ROLES[rng.below(4) as usize]).collect();
    if !roles.iter().any(|r| r.appends()) {
        roles[0] = if rng.chance(1, 2) {
            Role::Both
        } else {
            Role::Producer
        };
    }
    if !roles.iter().any(|r| r.works()) {
        let i = rng.below(n as u64) as usize;
        roles[i] = if roles[i].appends() && roles.iter().filter(|r| r.appends()).count() == 1 {
            Role::Both
        } else {
            Role::Worker
        };
    }
    let appends = roles
        .iter()
        .map(|r| if r.appends() { 10 + rng.below(40) } else { 0 })
        .collect();
    let batch_size = [1, 2, 4, 8, 16][rng.below(5) as usize];
    let failpoint = match rng.below(FAILPOINTS.len() as u64 + 1) as usize {
        i if i < FAILPOINTS.len() => {
            let point = FAILPOINTS[i];
            let fits: Vec<usize> = (0..n)
                .filter(|&v| {
                    if point == "after_append" {
                        roles[v].appends()
                    } else {
                        roles[v].works()
                    }
                })
                .collect();
            let v = fits[rng.below(fits.len() as u64) as usize];
            Some((v, point, 1 + rng.below(4)))
        }
        _ => None,
    };
    let sigkill = rng
        .chance(3, 4)
        .then(|| (rng.below(n as u64) as usize, rng.below(2000)));
    let workers: Vec<usize> = (0..n).filter(|&v| roles[v].works()).collect();
    let sigstop = rng.chance(1, 3).then(|| {
        let v = workers[rng.below(workers.len() as u64) as usize];
        (v, rng.below(1500), 2 * LEASE_TTL_MS + rng.below(1000))
    });
    Plan {
        roles,
        appends,
        batch_size,
        failpoint,
        sigkill,
        sigstop,
        tail_ms: if rng.chance(1, 2) { 0 } else { rng.below(800) },
        nats_kill: None,
        pg_restart: None,
    }
}

/// A sink round's extra faults, drawn after the rest of its plan (so a
/// round's other faults are those of the same seed without `--sinks`).
fn plan_sink_faults(plan: &mut Plan, rng: &mut Rng, backend: Backend, restarts_pg: bool) {
    plan.nats_kill = rng.chance(2, 3).then(|| (rng.below(2000), rng.below(1500)));
    plan.pg_restart = (backend == Backend::Postgres && restarts_pg && rng.chance(1, 2))
        .then(|| (rng.below(2000), rng.below(1000)));
}

fn mix(seed: u64, round: u64) -> u64 {
    Rng(seed ^ round.wrapping_mul(0xa076_1d64_78bd_642f)).next_u64()
}

/// What every run of the driver needs, from its arguments.
pub(crate) struct Setup {
    pub(crate) backend: Backend,
    /// The one round to run (`--round-seed`), or none.
    pub(crate) single: Option<u64>,
    pub(crate) rounds: u64,
    pub(crate) seed: u64,
    /// The Postgres server's URL.
    pub(crate) url: Option<String>,
    /// This program, run again as the victims.
    pub(crate) exe: PathBuf,
    pub(crate) rt: tokio::runtime::Runtime,
    /// `--keep-going`: run every round, failed or not, and report them all.
    pub(crate) keep_going: bool,
    /// `--sinks`: sink rounds.
    pub(crate) sinks: Option<SinkSetup>,
}

/// What sink rounds need beyond the others.
pub(crate) struct SinkSetup {
    /// The `nats-server` binary: each round starts its own.
    nats_bin: PathBuf,
    /// On Postgres, a cluster of the run's own (never the server of
    /// `OUTBOX_TEST_DATABASE_URL`, which may be someone else's), so that
    /// rounds can restart it.
    cluster: Option<outbox_testkit::pg::OwnCluster>,
}

impl Setup {
    /// The seed of round `round`.
    pub(crate) fn round_seed(&self, round: u64) -> u64 {
        self.single.unwrap_or_else(|| mix(self.seed, round))
    }
}

/// The run's setup from the command line of `run`.
pub(crate) fn setup(args: &Args) -> Result<Setup> {
    let backend = match args.req("--backend")? {
        "sqlite" => Backend::Sqlite,
        "postgres" => Backend::Postgres,
        other => bail!("unknown backend {other:?} (sqlite | postgres)"),
    };
    let single = args.get("--round-seed").map(parse_u64).transpose()?;
    let rounds = if single.is_some() {
        1
    } else {
        args.num("--rounds", 20)?
    };
    let seed = crate::args::seed_arg(args)?;
    let sinks = if args.has("--sinks") {
        let nats_bin = crate::sinks::nats_bin()?;
        let cluster = match backend {
            Backend::Postgres => Some(outbox_testkit::pg::OwnCluster::start("crash-sinks").context(
                "sink rounds on Postgres start a cluster of their own: initdb and pg_ctl are missing",
            )?),
            Backend::Sqlite => None,
        };
        Some(SinkSetup { nats_bin, cluster })
    } else {
        None
    };
    let url = match (backend, sinks.as_ref().and_then(|s| s.cluster.as_ref())) {
        (Backend::Postgres, Some(cluster)) => Some(cluster.url()),
        (Backend::Postgres, None) => Some(
            args.get("--url")
                .map(str::to_owned)
                .or_else(|| {
                    std::env::var("OUTBOX_TEST_DATABASE_URL")
                        .ok()
                        .filter(|u| !u.is_empty())
                })
                .context(
                    "postgres needs OUTBOX_TEST_DATABASE_URL (or --url); `cargo xtask crash` starts a server",
                )?,
        ),
        (Backend::Sqlite, _) => None,
    };
    Ok(Setup {
        backend,
        single,
        rounds,
        seed,
        url,
        exe: std::env::current_exe()?,
        rt: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?,
        keep_going: args.has("--keep-going"),
        sinks,
    })
}

/// The rounds of faults (kills and crash points).
pub(crate) fn run_faults(args: &Args, setup: &Setup) -> Result<u8> {
    let Setup {
        backend,
        single,
        rounds,
        seed,
        keep_going,
        ..
    } = *setup;
    let streams = args.num("--streams", 6)?.max(1);
    let kind = if setup.sinks.is_some() {
        ", sink rounds (a JetStream sink in every worker)"
    } else {
        ""
    };
    match single {
        Some(s) => println!("crash: backend {backend:?}{kind}, one round, round seed {s:#x}"),
        None => println!(
            "crash: backend {backend:?}{kind}, {rounds} rounds, seed {seed} (rerun: --seed {seed}), {streams} streams"
        ),
    }
    let mut bus = BusTotals::default();
    let started = Instant::now();
    let mut by_fault: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_outcome: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut failed = Vec::new();
    for round in 0..rounds {
        let round_seed = setup.round_seed(round);
        let t = Instant::now();
        let mut figures = None;
        let r = one_round(setup, streams, round_seed, &mut figures);
        let secs = t.elapsed().as_secs_f64();
        if let Some(f) = &figures {
            bus.add(f);
        }
        let (faults, outcome, detail) = match r {
            Ok(r) => r,
            Err(e) => (vec!["?".into()], "harness-error", format!("{e:#}")),
        };
        for f in &faults {
            *by_fault.entry(f.clone()).or_default() += 1;
        }
        *by_outcome.entry(outcome).or_default() += 1;
        println!(
            "round {round} seed {round_seed:#x} fault {} outcome {outcome} {detail} ({secs:.1} s)",
            faults.join("+")
        );
        if outcome != "ok" {
            failed.push((round, round_seed));
            if !keep_going {
                break;
            }
        }
    }
    println!(
        "\n{} rounds in {:.0} s (seed {seed})",
        by_outcome.values().sum::<u64>(),
        started.elapsed().as_secs_f64()
    );
    println!("| fault | rounds |\n|---|---|");
    for (f, n) in &by_fault {
        println!("| {f} | {n} |");
    }
    println!("\n| outcome | rounds |\n|---|---|");
    for (o, n) in &by_outcome {
        println!("| {o} | {n} |");
    }
    if setup.sinks.is_some() {
        bus.print();
    }
    let flags = if setup.sinks.is_some() { " --sinks" } else { "" };
    Ok(report_failed(&failed, seed, backend, flags))
}

/// The sink figures of a run, over the rounds that reached the bus check.
#[derive(Default)]
struct BusTotals {
    rounds: u64,
    events: u64,
    messages: u64,
    duplicates: u64,
    max_duplicates: u64,
    missing: u64,
    missing_acked: u64,
    order_violations: u64,
    requeued: u64,
}

impl BusTotals {
    fn add(&mut self, f: &BusFigures) {
        self.rounds += 1;
        self.events += f.events;
        self.messages += f.messages;
        self.duplicates += f.duplicates;
        self.max_duplicates = self.max_duplicates.max(f.duplicates);
        self.missing += f.missing;
        self.missing_acked += f.missing_acked;
        self.order_violations += f.order_violations;
        self.requeued += f.requeued;
    }

    fn print(&self) {
        println!(
            "\n| sink | figure |\n|---|---|\n\
             | rounds checked | {} |\n\
             | events in the journals | {} |\n\
             | messages on the bus | {} |\n\
             | duplicates (total) | {} |\n\
             | duplicates (most in one round) | {} |\n\
             | missing (must be 0) | {} ({} acknowledged) |\n\
             | order violations (must be 0) | {} |\n\
             | dead (sink, stream)s requeued by the drain | {} |",
            self.rounds,
            self.events,
            self.messages,
            self.duplicates,
            self.max_duplicates,
            self.missing,
            self.missing_acked,
            self.order_violations,
            self.requeued
        );
    }
}

/// Prints the failed rounds, each with the command that reruns it, and
/// returns the exit code.
pub(crate) fn report_failed(failed: &[(u64, u64)], seed: u64, backend: Backend, flags: &str) -> u8 {
    for (round, round_seed) in failed {
        println!(
            "\nFAILED: round {round} of seed {seed}; rerun the round with `cargo xtask crash --backend {}{flags} --round-seed {round_seed:#x}`",
            backend.name()
        );
    }
    u8::from(!failed.is_empty())
}

/// A round's databases: a temporary directory (the SQLite files, the ack
/// logs and the victims' output) and, on Postgres, three schemas, dropped
/// when the round passes.
pub(crate) struct RoundDir {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) place: Place,
    pub(crate) schemas: Vec<String>,
}

type RoundResult = (Vec<String>, &'static str, String);

/// A round's fresh databases, with the stores created: the oracle, and the
/// poison rounds' extra view when `poison`.
pub(crate) fn new_round(
    rt: &tokio::runtime::Runtime,
    backend: Backend,
    url: Option<&str>,
    seed: u64,
    poison: bool,
) -> Result<RoundDir> {
    let dir = tempfile::Builder::new().prefix("outbox-crash-").tempdir()?;
    let round = match backend {
        Backend::Sqlite => RoundDir {
            place: Place::Sqlite {
                journal: dir.path().join("journal.db"),
                projections: dir.path().join("projections.db"),
            },
            dir,
            schemas: Vec::new(),
        },
        Backend::Postgres => {
            let base = format!("crash_{}_{:x}", std::process::id(), seed & 0xffff_ffff);
            RoundDir {
                place: Place::Postgres {
                    url: url.context("postgres url")?.to_owned(),
                    journal: format!("{base}_j"),
                    projections: format!("{base}_p"),
                },
                dir,
                schemas: vec![
                    format!("{base}_j"),
                    format!("{base}_p"),
                    format!("{base}_j_rebuild"),
                ],
            }
        }
    };
    // Create the stores once, before several processes race to.
    rt.block_on(async {
        with_stores!(&round.place, |j, p, _wake| {
            let mut builder = outbox_runtime::Outbox::builder(j, p)
                .config(Config::producer_only())
                .event_types(outbox_testkit::oracle_registry())
                .view(outbox_testkit::OracleProjection::new("oracle"));
            if poison {
                builder = builder.view(crate::victim::PoisonView::parse("none")?);
            }
            builder.build().await.map(drop).context("create the stores")
        })
    })?;
    Ok(round)
}

fn one_round(
    setup: &Setup,
    streams: u64,
    seed: u64,
    figures: &mut Option<BusFigures>,
) -> Result<RoundResult> {
    let rt = &setup.rt;
    let mut rng = Rng(seed);
    let mut plan = plan(&mut rng);
    if let Some(s) = &setup.sinks {
        plan_sink_faults(&mut plan, &mut rng, setup.backend, s.cluster.is_some());
    }
    let round = new_round(rt, setup.backend, setup.url.as_deref(), seed, false)?;
    let result = match &setup.sinks {
        None => faults_drain_check(rt, &setup.exe, &round, &plan, streams, &mut rng, None),
        Some(s) => Nats::start(&s.nats_bin, round.dir.path()).and_then(|nats| {
            rt.block_on(crate::sinks::create_stream(&nats.url()))?;
            let mut sink = SinkRound {
                nats,
                cluster: s.cluster.as_ref(),
                figures,
            };
            faults_drain_check(rt, &setup.exe, &round, &plan, streams, &mut rng, Some(&mut sink))
        }),
    };
    finish_round(rt, round, matches!(&result, Ok((_, "ok", _))));
    result
}

/// A sink round's moving parts: its nats-server, the run's Postgres cluster
/// (to restart), and where the bus check puts its figures.
struct SinkRound<'a> {
    nats: Nats,
    cluster: Option<&'a outbox_testkit::pg::OwnCluster>,
    figures: &'a mut Option<BusFigures>,
}

/// Runs `f` on the cluster, a panic (pg_ctl failing) turned into an error.
fn on_cluster(
    cluster: &outbox_testkit::pg::OwnCluster,
    what: &str,
    f: fn(&outbox_testkit::pg::OwnCluster),
) -> Result<()> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(cluster)))
        .map_err(|_| anyhow::anyhow!("{what} of the Postgres cluster failed"))
}

/// Drops a passed round's schemas (its directory goes with it), or keeps a
/// failed round for inspection and says where.
pub(crate) fn finish_round(rt: &tokio::runtime::Runtime, round: RoundDir, ok: bool) {
    if ok {
        drop_schemas(rt, &round);
    } else {
        let kept = round.dir.keep();
        eprintln!(
            "round kept for inspection: {} (victim logs, ack logs{})",
            kept.display(),
            if round.schemas.is_empty() {
                ", databases".to_owned()
            } else {
                format!("; schemas {}", round.schemas.join(", "))
            }
        );
    }
}

fn drop_schemas(rt: &tokio::runtime::Runtime, round: &RoundDir) {
    let Place::Postgres { url, .. } = &round.place else {
        return;
    };
    use outbox_postgres::sqlx::{self, Connection, PgConnection};
    rt.block_on(async {
        let Ok(mut conn) = PgConnection::connect(url).await else {
            return;
        };
        for s in &round.schemas {
            // Names built here from a number only.
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA IF EXISTS {s} CASCADE")))
                .execute(&mut conn)
                .await;
        }
        let _ = conn.close().await;
    });
}

pub(crate) struct Victim {
    pub(crate) role: Role,
    pub(crate) child: Child,
    pub(crate) status: Option<ExitStatus>,
    pub(crate) stopped: bool,
}

impl Victim {
    pub(crate) fn new(role: Role, child: Child) -> Victim {
        Victim {
            role,
            child,
            status: None,
            stopped: false,
        }
    }

    pub(crate) fn alive(&mut self) -> bool {
        if self.status.is_none()
            && let Ok(Some(s)) = self.child.try_wait()
        {
            self.status = Some(s);
        }
        self.status.is_none()
    }
}

fn signal(pid: u32, sig: &str) -> Result<()> {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .context("run kill")?
        .success();
    if !ok {
        bail!("kill {sig} {pid} failed");
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn spawn(
    exe: &Path,
    round: &RoundDir,
    role: Role,
    name: &str,
    seed: u64,
    streams: u64,
    appends: u64,
    batch_size: u64,
    crash_at: Option<String>,
    repair: bool,
    nats: Option<&str>,
) -> Result<Child> {
    let mut c = command(
        exe, round, role, name, seed, streams, appends, batch_size, crash_at, repair,
    )?;
    if let Some(url) = nats {
        c.args(["--nats", url]);
    }
    c.spawn().context("spawn a victim")
}

/// A victim's command, its output going to `<name>.log` in the round's
/// directory: the caller may add arguments and variables before it spawns.
#[allow(clippy::too_many_arguments)]
pub(crate) fn command(
    exe: &Path,
    round: &RoundDir,
    role: Role,
    name: &str,
    seed: u64,
    streams: u64,
    appends: u64,
    batch_size: u64,
    crash_at: Option<String>,
    repair: bool,
) -> Result<Command> {
    let out = File::create(round.dir.path().join(format!("{name}.log")))?;
    let (worker, inline) = role.flags();
    let mut c = Command::new(exe);
    c.arg("victim")
        .args(round.place.to_args())
        .args(["--role", role.name()])
        .args(["--seed", &seed.to_string()])
        .args(["--streams", &streams.to_string()])
        .args(["--appends", &appends.to_string()])
        .arg("--ack-log")
        .arg(ack_log(round, name))
        .env(Config::OUTBOX_ENABLED, "true")
        .env(Config::OUTBOX_WORKER_ENABLED, worker.to_string())
        .env(Config::OUTBOX_INLINE_APPLY, inline.to_string())
        .env(Config::OUTBOX_SHADOW_WORKER_ENABLED, "false")
        .env(Config::OUTBOX_LEASE_TTL_MS, LEASE_TTL_MS.to_string())
        .env(Config::OUTBOX_STORE_DEADLINE_MS, "1000")
        .env(Config::OUTBOX_POLL_INTERVAL_MS, "100")
        .env(Config::OUTBOX_HEARTBEAT_INTERVAL_MS, "500")
        .env(Config::OUTBOX_RETRY_BASE_MS, "20")
        .env(Config::OUTBOX_RETRY_CAP_MS, "200")
        .env(Config::OUTBOX_BATCH_SIZE, batch_size.to_string())
        .env(Config::OUTBOX_BATCHES_PER_STREAM, "4")
        .env(Config::OUTBOX_REPAIR_ON_START, repair.to_string())
        .env(
            Config::OUTBOX_WORKER_ID,
            format!("crash-{name}-{:x}", seed & 0xffff_ffff),
        )
        .env_remove("OUTBOX_CRASH_AT")
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    if let Some(at) = crash_at {
        c.env("OUTBOX_CRASH_AT", at);
    }
    Ok(c)
}

pub(crate) fn ack_log(round: &RoundDir, name: &str) -> PathBuf {
    round.dir.path().join(format!("{name}.acks"))
}

fn faults_drain_check(
    rt: &tokio::runtime::Runtime,
    exe: &Path,
    round: &RoundDir,
    plan: &Plan,
    streams: u64,
    rng: &mut Rng,
    mut sink: Option<&mut SinkRound<'_>>,
) -> Result<RoundResult> {
    let nats_url = sink.as_ref().map(|s| s.nats.url());
    let mut victims = Vec::new();
    for (i, &role) in plan.roles.iter().enumerate() {
        let crash_at = plan
            .failpoint
            .filter(|(v, ..)| *v == i)
            .map(|(_, point, n)| format!("{point}:{n}"));
        let child = spawn(
            exe,
            round,
            role,
            &format!("v{i}"),
            rng.next_u64(),
            streams,
            plan.appends[i],
            plan.batch_size,
            crash_at,
            true,
            nats_url.as_deref(),
        )?;
        victims.push(Victim::new(role, child));
    }
    let start = Instant::now();
    let mut faults: Vec<String> = Vec::new();
    let mut killed = plan.sigkill.is_none();
    let mut stop_done = plan.sigstop.is_none();
    let mut tail_until: Option<Duration> = None;
    let mut outages = Outages::new(plan, sink.as_deref());
    loop {
        let now = start.elapsed();
        let ms = now.as_millis() as u64;
        if let Some(s) = sink.as_deref_mut()
            && let Err(e) = outages.step(s, ms, &mut faults)
        {
            kill_all(&mut victims);
            outages.restore(s);
            return Err(e);
        }
        if let Some((v, at)) = plan.sigkill
            && !killed
            && ms >= at
        {
            killed = true;
            if victims[v].alive() {
                victims[v].child.kill()?;
                faults.push("sigkill".into());
            }
        }
        if let Some((v, at, dur)) = plan.sigstop
            && !stop_done
        {
            if !victims[v].stopped && ms >= at {
                if victims[v].alive() {
                    signal(victims[v].child.id(), "-STOP")?;
                    victims[v].stopped = true;
                    faults.push("sigstop-zombie".into());
                } else {
                    stop_done = true;
                }
            } else if victims[v].stopped && ms >= at + dur {
                if victims[v].alive() {
                    signal(victims[v].child.id(), "-CONT")?;
                }
                victims[v].stopped = false;
                stop_done = true;
            }
        }
        let appending = victims
            .iter_mut()
            .any(|v| v.role.appends() && v.role != Role::Both && v.alive())
            || victims
                .iter_mut()
                .enumerate()
                .any(|(i, v)| v.role == Role::Both && v.alive() && !acks_done(round, i, plan));
        if !appending && killed && stop_done && outages.done() {
            let until = *tail_until.get_or_insert(now + Duration::from_millis(plan.tail_ms));
            if now >= until {
                break;
            }
        }
        if now > FAULT_PHASE_LIMIT {
            kill_all(&mut victims);
            if let Some(s) = sink.as_deref_mut() {
                outages.restore(s);
            }
            return Ok((faults, "liveness", "the fault phase did not end in time".into()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    kill_all(&mut victims);
    // What happened to each victim.
    if let Some((v, point, n)) = plan.failpoint {
        use std::os::unix::process::ExitStatusExt;
        let fired = victims[v].status.and_then(|s| s.signal()) == Some(6);
        faults.push(format!("{point}{}", if fired { "" } else { " (not reached)" }));
        let _ = n;
    }
    for (i, v) in victims.iter().enumerate() {
        if let Some(s) = v.status
            && s.code().is_some_and(|c| c != 0)
        {
            return Ok((
                faults,
                "victim-error",
                format!("victim v{i} ({}) exited with {s}", v.role.name()),
            ));
        }
    }
    if faults.is_empty() {
        faults.push("none".into());
    }
    // The clean drain.
    // Half the drains repair first (catching every stream up from the
    // journal and completing its rows, leases or not); the others must wait
    // out the dead workers' leases and claim the rows they left processing.
    let repair = rng.chance(1, 2);
    let mut drain = spawn(
        exe,
        round,
        Role::Drain,
        "drain",
        rng.next_u64(),
        streams,
        0,
        16,
        None,
        repair,
        nats_url.as_deref(),
    )?;
    let t = Instant::now();
    let status = loop {
        if let Some(s) = drain.try_wait()? {
            break s;
        }
        if t.elapsed() > DRAIN_LIMIT {
            let _ = drain.kill();
            let _ = drain.wait();
            return Ok((
                faults,
                "liveness",
                format!("the drain did not finish within {DRAIN_LIMIT:?}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let drain_secs = t.elapsed().as_secs_f64();
    if !status.success() {
        let log = std::fs::read_to_string(round.dir.path().join("drain.log")).unwrap_or_default();
        return Ok((
            faults,
            "drain-failed",
            format!("the drain exited with {status}: {}", log.trim()),
        ));
    }
    let drain_log = std::fs::read_to_string(round.dir.path().join("drain.log")).unwrap_or_default();
    let requeued: u64 = drain_log
        .lines()
        .find_map(|l| l.strip_prefix("sink requeued ")?.parse().ok())
        .unwrap_or(0);
    // The flaky projection's (projection, stream)s the faults left dead.
    let projections_requeued: u64 = drain_log
        .lines()
        .find_map(|l| l.strip_prefix("projections requeued ")?.parse().ok())
        .unwrap_or(0);
    let left = Some(&drain_log)
        .and_then(|log| {
            let mut f = log.lines().next()?.strip_prefix("left ")?.split(' ');
            Some(format!("{} rows left ({} processing)", f.next()?, f.next()?))
        })
        .unwrap_or_else(|| "rows left unknown".into());
    let logs: Vec<PathBuf> = (0..victims.len())
        .map(|i| ack_log(round, &format!("v{i}")))
        .collect();
    let acks = read_acks(&logs)?;
    let roles: Vec<&str> = plan.roles.iter().map(|r| r.name()).collect();
    let v = match rt.block_on(check(&round.place, streams, &acks, true))? {
        Ok(v) => v,
        Err(e) => return Ok((faults, "VIOLATION", format!("[{}]\n{e}", roles.join(",")))),
    };
    let mut detail = format!(
        "[{}] batch {} events {} acked {} unacked {}; {left}, drained{} in {drain_secs:.1} s",
        roles.join(","),
        plan.batch_size,
        v.events,
        v.acked,
        v.events - v.acked,
        if repair { " (repair)" } else { "" }
    );
    if projections_requeued > 0 {
        detail.push_str(&format!(
            "; {projections_requeued} dead flaky (projection, stream)s requeued"
        ));
    }
    if let Some(s) = sink {
        let (mut f, problems) = rt.block_on(crate::sinks::check_bus(
            &round.place,
            &s.nats.url(),
            streams,
            &acks,
        ))?;
        f.requeued = requeued;
        detail.push_str(&format!(
            "; bus {} messages, {} duplicates, {} missing, {} out of order{}",
            f.messages,
            f.duplicates,
            f.missing,
            f.order_violations,
            if requeued > 0 {
                format!(", {requeued} dead sink streams requeued")
            } else {
                String::new()
            }
        ));
        *s.figures = Some(f);
        if !problems.is_empty() {
            return Ok((faults, "VIOLATION", format!("{detail}\n{}", problems.join("\n"))));
        }
    }
    Ok((faults, "ok", detail))
}

/// A sink round's outages, as the fault loop steps through them: the
/// nats-server killed and restarted, the Postgres server stopped
/// (immediate) and started. A restart waits for the server (pg_ctl -w,
/// nats-server listening), which delays the loop's other faults a little:
/// their times are lower bounds, as the loop's are anyway.
struct Outages {
    nats: Option<(u64, u64)>,
    nats_down: bool,
    pg: Option<(u64, u64)>,
    pg_down: bool,
}

impl Outages {
    fn new(plan: &Plan, sink: Option<&SinkRound<'_>>) -> Outages {
        Outages {
            nats: plan.nats_kill.filter(|_| sink.is_some()),
            nats_down: false,
            pg: plan
                .pg_restart
                .filter(|_| sink.is_some_and(|s| s.cluster.is_some())),
            pg_down: false,
        }
    }

    /// Whether every outage is over (the servers are back up).
    fn done(&self) -> bool {
        self.nats.is_none() && self.pg.is_none()
    }

    /// Brings a server that is down back up (best effort) when a round ends
    /// early: the next rounds use the same Postgres cluster.
    fn restore(&mut self, s: &mut SinkRound<'_>) {
        if self.nats.take().is_some() && self.nats_down {
            let _ = s.nats.restart();
        }
        if self.pg.take().is_some()
            && self.pg_down
            && let Some(cluster) = s.cluster
            && let Err(e) = on_cluster(cluster, "the start", |c| c.start_again())
        {
            eprintln!("warning: {e:#}");
        }
    }

    fn step(&mut self, s: &mut SinkRound<'_>, ms: u64, faults: &mut Vec<String>) -> Result<()> {
        if let Some((at, down)) = self.nats {
            if !self.nats_down && ms >= at {
                s.nats.kill();
                self.nats_down = true;
                faults.push("nats-kill".into());
            } else if self.nats_down && ms >= at + down {
                s.nats.restart()?;
                self.nats = None;
            }
        }
        if let (Some((at, down)), Some(cluster)) = (self.pg, s.cluster) {
            if !self.pg_down && ms >= at {
                on_cluster(cluster, "the immediate stop", |c| c.stop_immediate())?;
                self.pg_down = true;
                faults.push("pg-restart".into());
            } else if self.pg_down && ms >= at + down {
                on_cluster(cluster, "the start", |c| c.start_again())?;
                self.pg = None;
            }
        }
        Ok(())
    }
}

/// Whether victim `i` (a `both`) has made all its appends (it then only
/// works, and the round need not wait for it): it says so with a file.
fn acks_done(round: &RoundDir, i: usize, _plan: &Plan) -> bool {
    ack_log(round, &format!("v{i}")).with_extension("done").exists()
}

pub(crate) fn kill_all(victims: &mut [Victim]) {
    for v in victims.iter_mut() {
        if v.alive() {
            let _ = v.child.kill();
        }
        if let Ok(s) = v.child.wait()
            && v.status.is_none()
        {
            v.status = Some(s);
        }
    }
}
