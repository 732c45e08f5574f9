//! `outbox-crash run --poison`: rounds where one or two events kill the
//! worker process that applies them, under a supervisor that restarts it.
//!
//! The promise under test (invariant 19, "blame only the guilty"): an
//! attempt that ends without a result is charged only to a row applied
//! alone whose attempt began, so each poison is `dead` after exactly the
//! dead-letter threshold of attempts, no other row is ever charged or
//! dead-lettered, and every other stream is applied whole while the poisons
//! crash their workers again and again. Then the fix is deployed (the same
//! view, harmless), the dead rows are requeued and drained, and every event
//! must end applied exactly once, with a rebuild's digest, as in every round.
//! See docs/crash-testing.md.

use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use outbox_core::{DeadLetters, OutboxRow, OutboxStatus};
use outbox_runtime::{Config, JournalBackend};

use crate::check::{all_rows, check, isolated, read_acks};
use crate::driver::{
    DRAIN_LIMIT, RoundDir, Setup, Victim, ack_log, command, finish_round, kill_all, new_round, report_failed,
};
use crate::round::{Rng, stream_names};
use crate::victim::{Role, schedule};

/// Consecutive failures that park a row as dead in a poison round
/// (`OUTBOX_DEAD_LETTER_THRESHOLD`): small, so a round needs few crashes.
const THRESHOLD: u32 = 3;
/// The first retry delay (`OUTBOX_RETRY_BASE_MS`). A charged row keeps its
/// `last_error` through its retry, so a bystander charged by mistake stays
/// visible to the supervisor's polls for at least this long even if a
/// retry then applies it; small beside the lease TTL each crash waits out.
const RETRY_BASE_MS: u64 = 100;
/// The longest retry delay (`OUTBOX_RETRY_CAP_MS`).
const RETRY_CAP_MS: u64 = 200;
/// How often the supervisor looks at its workers and at the outbox.
const POLL: Duration = Duration::from_millis(50);
/// How long the poison phase may take before the round fails (liveness
/// only: the verdict never depends on timing).
const PHASE_LIMIT: Duration = Duration::from_secs(240);

/// What a round switches, drawn from its seed; the run's report is by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Setting {
    /// Sweeps on (`OUTBOX_SWEEP_ROWS` at its default) or off (0).
    sweeps: bool,
    /// `OUTBOX_LEASING`.
    leasing: bool,
    /// `OUTBOX_REPAIR_ON_START`, for the workers and the final drain.
    repair: bool,
    /// Concurrent worker processes, each restarted when it dies.
    workers: usize,
    /// A restarted worker keeps its `OUTBOX_WORKER_ID` (a supervisor with
    /// configured ids: the new process takes over the dead one's registry
    /// entry at once, ADR 0029) or gets a new one (the default id).
    same_id: bool,
}

fn on(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

fn ids(same: bool) -> &'static str {
    if same { "same" } else { "new" }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sweeps {} leasing {} repair {} workers {} ids {}",
            on(self.sweeps),
            on(self.leasing),
            on(self.repair),
            self.workers,
            ids(self.same_id)
        )
    }
}

/// One poison round's schedule, all drawn from its seed.
#[derive(Debug)]
struct Plan {
    streams: u64,
    appends: u64,
    producer_seed: u64,
    batch_size: u64,
    /// (stream, seq), each in a stream of its own: a poison behind another
    /// in its stream would never be reached before the fix.
    poisons: Vec<(String, u64)>,
    setting: Setting,
}

fn plan(rng: &mut Rng) -> Plan {
    let streams = 6 + rng.below(15);
    // About four events a stream (a batch touches two streams with two or
    // three events each on average).
    let appends = streams / 2 + rng.below(streams / 2 + 1);
    let producer_seed = rng.next_u64();
    // The producer is the only appender and is never killed, so its
    // schedule says which seqs each stream will have.
    let mut heads = vec![0u64; streams as usize];
    for a in schedule(producer_seed, streams, appends) {
        for (i, v) in &a.picks {
            heads[*i] += v.len() as u64;
        }
    }
    let names = stream_names(streams);
    let mut candidates: Vec<usize> = (0..streams as usize).filter(|&i| heads[i] > 0).collect();
    let mut poisons = Vec::new();
    for _ in 0..1 + rng.below(2) {
        if candidates.is_empty() {
            break;
        }
        let i = candidates.remove(rng.below(candidates.len() as u64) as usize);
        poisons.push((names[i].clone(), 1 + rng.below(heads[i])));
    }
    poisons.sort();
    let batch_size = [1, 2, 4, 8, 16][rng.below(5) as usize];
    let setting = Setting {
        sweeps: rng.chance(1, 2),
        leasing: rng.chance(1, 2),
        repair: rng.chance(1, 2),
        workers: 1 + rng.below(2) as usize,
        same_id: rng.chance(1, 2),
    };
    Plan {
        streams,
        appends,
        producer_seed,
        batch_size,
        poisons,
        setting,
    }
}

/// How one round ended.
struct Outcome {
    outcome: &'static str,
    detail: String,
    /// Per poison (in the plan's order): the crashes it caused until it was dead.
    crashes: Vec<u64>,
    /// Attempts charged to the poisons.
    charged: u64,
    /// Bystander rows seen charged, failed or dead (a violation).
    bystanders: u64,
}

impl Outcome {
    fn failed(outcome: &'static str, detail: String) -> Outcome {
        Outcome {
            outcome,
            detail,
            crashes: Vec::new(),
            charged: 0,
            bystanders: 0,
        }
    }
}

/// Per setting: rounds, of them passed, crashes until dead (one per
/// poison), attempts charged.
#[derive(Default)]
struct Tally {
    rounds: u64,
    ok: u64,
    crashes: Vec<u64>,
    charged: u64,
    bystanders: u64,
}

pub(crate) fn run(setup: &Setup) -> Result<u8> {
    let backend = setup.backend;
    match setup.single {
        Some(s) => println!("crash: poison rounds, backend {backend:?}, one round, round seed {s:#x}"),
        None => println!(
            "crash: poison rounds, backend {backend:?}, {} rounds, seed {} (rerun: --poison --seed {}), dead-letter threshold {THRESHOLD}",
            setup.rounds, setup.seed, setup.seed
        ),
    }
    let started = Instant::now();
    let mut by_setting: BTreeMap<Setting, Tally> = BTreeMap::new();
    let mut by_outcome: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut failed = Vec::new();
    for round in 0..setup.rounds {
        let round_seed = setup.round_seed(round);
        let t = Instant::now();
        let plan = plan(&mut Rng(round_seed));
        let o = one_round(setup, round_seed)
            .unwrap_or_else(|e| Outcome::failed("harness-error", format!("{e:#}")));
        let secs = t.elapsed().as_secs_f64();
        let poisons: Vec<String> = plan.poisons.iter().map(|(s, q)| format!("{s}/{q}")).collect();
        println!(
            "round {round} seed {round_seed:#x} poison {} {} streams {} batch {} outcome {} {} ({secs:.1} s)",
            poisons.join("+"),
            plan.setting,
            plan.streams,
            plan.batch_size,
            o.outcome,
            o.detail
        );
        *by_outcome.entry(o.outcome).or_default() += 1;
        let tally = by_setting.entry(plan.setting).or_default();
        tally.rounds += 1;
        tally.bystanders += o.bystanders;
        if o.outcome == "ok" {
            tally.ok += 1;
            tally.crashes.extend(&o.crashes);
            tally.charged += o.charged;
        } else {
            failed.push((round, round_seed));
            if !setup.keep_going {
                break;
            }
        }
    }
    println!(
        "\n{} poison rounds in {:.0} s (seed {}, threshold {THRESHOLD})",
        by_outcome.values().sum::<u64>(),
        started.elapsed().as_secs_f64(),
        setup.seed
    );
    println!(
        "| sweeps | leasing | repair | workers | ids | rounds | ok | poisons | crashes until dead (min/median/max) | attempts charged | bystanders charged |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (s, t) in &by_setting {
        let mut c = t.crashes.clone();
        c.sort_unstable();
        let spread = match (c.first(), c.get(c.len() / 2), c.last()) {
            (Some(a), Some(m), Some(z)) => format!("{a}/{m}/{z}"),
            _ => "-".into(),
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({} × {THRESHOLD}) | {} |",
            on(s.sweeps),
            on(s.leasing),
            on(s.repair),
            s.workers,
            ids(s.same_id),
            t.rounds,
            t.ok,
            c.len(),
            spread,
            t.charged,
            c.len(),
            t.bystanders
        );
    }
    println!("\n| outcome | rounds |\n|---|---|");
    for (o, n) in &by_outcome {
        println!("| {o} | {n} |");
    }
    Ok(report_failed(&failed, setup.seed, backend, " --poison"))
}

fn one_round(setup: &Setup, seed: u64) -> Result<Outcome> {
    let mut rng = Rng(seed);
    let plan = plan(&mut rng);
    let round = new_round(&setup.rt, setup.backend, setup.url.as_deref(), seed, true)?;
    let result = poison_round(setup, &round, &plan, &mut rng);
    finish_round(&setup.rt, round, matches!(&result, Ok(o) if o.outcome == "ok"));
    result
}

/// A victim of the round: the producer, a worker incarnation or the drain.
#[allow(clippy::too_many_arguments)]
fn spawn(
    setup: &Setup,
    round: &RoundDir,
    plan: &Plan,
    role: Role,
    name: &str,
    seed: u64,
    appends: u64,
    poison: Option<&str>,
    worker_id: Option<&str>,
) -> Result<Child> {
    let s = plan.setting;
    let mut c = command(
        &setup.exe,
        round,
        role,
        name,
        seed,
        plan.streams,
        appends,
        plan.batch_size,
        None,
        s.repair,
    )?;
    c.env(Config::OUTBOX_LEASING, s.leasing.to_string())
        .env(Config::OUTBOX_DEAD_LETTER_THRESHOLD, THRESHOLD.to_string())
        .env(Config::OUTBOX_RETRY_BASE_MS, RETRY_BASE_MS.to_string())
        .env(Config::OUTBOX_RETRY_CAP_MS, RETRY_CAP_MS.to_string());
    if s.sweeps {
        c.env_remove(Config::OUTBOX_SWEEP_ROWS);
    } else {
        c.env(Config::OUTBOX_SWEEP_ROWS, "0");
    }
    if let Some(list) = poison {
        c.args(["--poison", list]);
    }
    if let Some(id) = worker_id {
        c.env(Config::OUTBOX_WORKER_ID, id);
    }
    c.spawn().context("spawn a victim")
}

/// A worker process and the ones that replaced it when it died.
struct Slot {
    victim: Victim,
    /// Its incarnations so far (the current one's number).
    incarnation: u64,
}

fn worker_name(slot: usize, incarnation: u64) -> String {
    format!("w{slot}-{incarnation}")
}

/// The worker id a slot keeps across restarts with `same_id` (otherwise
/// each incarnation's id is its own, from its name).
fn slot_id(plan: &Plan, slot: usize) -> Option<String> {
    plan.setting
        .same_id
        .then(|| format!("crash-w{slot}-{:x}", plan.producer_seed & 0xffff_ffff))
}

/// What the poison phase saw.
struct Phase {
    /// Workers restarted after a crash.
    restarts: u64,
    /// Bystander rows seen charged, failed or dead at any poll (a charge
    /// that a retry then cleared would be gone from the final state).
    bystanders: Vec<OutboxRow>,
}

fn poison_round(setup: &Setup, round: &RoundDir, plan: &Plan, rng: &mut Rng) -> Result<Outcome> {
    let list: Vec<String> = plan.poisons.iter().map(|(s, q)| format!("{s}:{q}")).collect();
    let list = list.join(",");
    let mut producer = Victim::new(
        Role::Producer,
        spawn(
            setup,
            round,
            plan,
            Role::Producer,
            "p",
            plan.producer_seed,
            plan.appends,
            None,
            None,
        )?,
    );
    let mut slots = Vec::new();
    for w in 0..plan.setting.workers {
        let child = spawn(
            setup,
            round,
            plan,
            Role::Worker,
            &worker_name(w, 0),
            rng.next_u64(),
            0,
            Some(&list),
            slot_id(plan, w).as_deref(),
        )?;
        slots.push(Slot {
            victim: Victim::new(Role::Worker, child),
            incarnation: 0,
        });
    }
    // Each poison crashes its worker at most once beside other rows and
    // then exactly the threshold alone; three times that (and some room
    // for slow starts) and the round is crash-looping.
    let bound = u64::from(THRESHOLD) * plan.poisons.len() as u64 * 3 + 20;
    let phase = setup.rt.block_on(async {
        with_stores!(&round.place, |j, store, _wake| {
            supervise(
                &j,
                setup,
                round,
                plan,
                &list,
                &mut producer,
                &mut slots,
                bound,
                rng,
            )
            .await
        })
    });
    let mut all: Vec<Victim> = slots.into_iter().map(|s| s.victim).collect();
    all.push(producer);
    kill_all(&mut all);
    let phase = match phase? {
        Ok(p) => p,
        Err(o) => return Ok(o),
    };
    // A worker may have aborted after the supervisor last looked at it (its
    // peer recorded the attempt): it counts as a crash all the same.
    let aborted = phase.restarts
        + all
            .iter()
            .filter(|v| v.role == Role::Worker && v.status.and_then(|s| s.signal()) == Some(6))
            .count() as u64;
    // Which poison each crash was: the log line the poison view wrote
    // before it aborted. A worker that aborted without one is a failure.
    let mut crashes = vec![0u64; plan.poisons.len()];
    for w in 0..plan.setting.workers {
        for n in 0.. {
            let path = round.dir.path().join(format!("{}.log", worker_name(w, n)));
            let Ok(log) = std::fs::read_to_string(&path) else {
                break;
            };
            for line in log.lines() {
                if let Some(at) = line
                    .strip_prefix("poison ")
                    .and_then(|l| l.strip_suffix(": abort"))
                    && let Some(i) = plan.poisons.iter().position(|(s, q)| format!("{s}/{q}") == at)
                {
                    crashes[i] += 1;
                }
            }
        }
    }
    let total: u64 = crashes.iter().sum();
    if total != aborted {
        return Ok(Outcome::failed(
            "victim-error",
            format!("{aborted} workers aborted, {total} of them on a poison (see the w*.log files)"),
        ));
    }
    let acks = read_acks(&[ack_log(round, "p")])?;
    let isolation = setup.rt.block_on(isolated(
        &round.place,
        plan.streams,
        &acks,
        &plan.poisons,
        THRESHOLD,
    ))?;
    let mut problems = Vec::new();
    if let Err(e) = &isolation {
        problems.push(e.clone());
    }
    for r in &phase.bystanders {
        problems.push(format!("a bystander row was seen charged, failed or dead: {r:?}"));
    }
    for (p, n) in plan.poisons.iter().zip(&crashes) {
        // Its own attempts, plus at most one crash beside other rows before
        // anything showed which row was at fault.
        if !(u64::from(THRESHOLD)..=u64::from(THRESHOLD) + 1).contains(n) {
            problems.push(format!(
                "poison {}/{}: {n} crashes until dead, want {THRESHOLD} of its own plus at most one shared",
                p.0, p.1
            ));
        }
    }
    if !problems.is_empty() {
        return Ok(Outcome {
            bystanders: phase.bystanders.len() as u64,
            ..Outcome::failed("VIOLATION", format!("\n{}", problems.join("\n")))
        });
    }
    let isolation = isolation.map_err(anyhow::Error::msg)?;
    // The fix is deployed: the dead rows are requeued and a worker with the
    // poison view harmless drains everything.
    let requeued = setup.rt.block_on(async {
        with_stores!(&round.place, |j, store, _wake| j
            .requeue_dead(1000)
            .await
            .context("requeue the dead rows"))
    })?;
    if requeued.len() != plan.poisons.len() {
        return Ok(Outcome::failed(
            "VIOLATION",
            format!(
                "requeued {} rows, want the {} poisons: {requeued:?}",
                requeued.len(),
                plan.poisons.len()
            ),
        ));
    }
    let t = Instant::now();
    let mut drain = spawn(
        setup,
        round,
        plan,
        Role::Drain,
        "drain",
        rng.next_u64(),
        0,
        Some("none"),
        None,
    )?;
    let status = loop {
        if let Some(s) = drain.try_wait()? {
            break s;
        }
        if t.elapsed() > DRAIN_LIMIT {
            let _ = drain.kill();
            let _ = drain.wait();
            return Ok(Outcome::failed(
                "liveness",
                format!("the fixed drain did not finish within {DRAIN_LIMIT:?}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let drain_secs = t.elapsed().as_secs_f64();
    if !status.success() {
        let log = std::fs::read_to_string(round.dir.path().join("drain.log")).unwrap_or_default();
        return Ok(Outcome::failed(
            "drain-failed",
            format!("the fixed drain exited with {status}: {}", log.trim()),
        ));
    }
    let verdict = match setup
        .rt
        .block_on(check(&round.place, plan.streams, &acks, false))?
    {
        Ok(v) => v,
        Err(e) => return Ok(Outcome::failed("VIOLATION", format!("after the fix:\n{e}"))),
    };
    let crashes_text: Vec<String> = crashes.iter().map(u64::to_string).collect();
    Ok(Outcome {
        outcome: "ok",
        detail: format!(
            "events {} acked {}; crashes {} ({} restarts), charged {}, {} rows behind; fixed, requeued and drained in {drain_secs:.1} s",
            isolation.events,
            verdict.acked,
            crashes_text.join("+"),
            phase.restarts,
            isolation.charged,
            isolation.behind,
        ),
        crashes,
        charged: isolation.charged,
        bystanders: 0,
    })
}

/// Every row left is dead or waits behind a dead row of its stream: nothing
/// more happens without an operator.
fn settled(rows: &[OutboxRow]) -> bool {
    rows.iter().all(|r| {
        r.status == OutboxStatus::Dead
            || rows
                .iter()
                .any(|d| d.stream == r.stream && d.seq < r.seq && d.status == OutboxStatus::Dead)
    })
}

/// Restarts each worker that dies until the outbox settles (or the round
/// fails on a bound: `Ok(Err(outcome))`), watching every row meanwhile.
#[allow(clippy::too_many_arguments)]
async fn supervise<J: JournalBackend>(
    journal: &J,
    setup: &Setup,
    round: &RoundDir,
    plan: &Plan,
    list: &str,
    producer: &mut Victim,
    slots: &mut [Slot],
    bound: u64,
    rng: &mut Rng,
) -> Result<Result<Phase, Outcome>> {
    let start = Instant::now();
    let mut phase = Phase {
        restarts: 0,
        bystanders: Vec::new(),
    };
    let is_poison = |r: &OutboxRow| {
        plan.poisons
            .iter()
            .any(|(s, q)| r.stream.as_str() == s && r.seq.get() == *q)
    };
    loop {
        for (w, slot) in slots.iter_mut().enumerate() {
            if slot.victim.alive() {
                continue;
            }
            let status = slot.victim.status.context("a dead worker's status")?;
            if status.signal() != Some(6) {
                return Ok(Err(Outcome::failed(
                    "victim-error",
                    format!(
                        "worker {} exited with {status}, not an abort",
                        worker_name(w, slot.incarnation)
                    ),
                )));
            }
            if phase.restarts >= bound {
                return Ok(Err(Outcome::failed(
                    "liveness",
                    format!(
                        "{} crashes and the poisons are not dead (crash loop?)",
                        phase.restarts
                    ),
                )));
            }
            phase.restarts += 1;
            slot.incarnation += 1;
            let child = spawn(
                setup,
                round,
                plan,
                Role::Worker,
                &worker_name(w, slot.incarnation),
                rng.next_u64(),
                0,
                Some(list),
                slot_id(plan, w).as_deref(),
            )?;
            slot.victim = Victim::new(Role::Worker, child);
        }
        let produced = !producer.alive();
        if let Some(s) = producer.status
            && !s.success()
        {
            return Ok(Err(Outcome::failed(
                "victim-error",
                format!("the producer exited with {s}"),
            )));
        }
        let rows = all_rows(journal).await?;
        for r in &rows {
            let charged = r.attempt_count > 0 || r.last_error.is_some() || r.status == OutboxStatus::Dead;
            if charged
                && !is_poison(r)
                && !phase
                    .bystanders
                    .iter()
                    .any(|b| b.stream == r.stream && b.seq == r.seq)
            {
                phase.bystanders.push(r.clone());
            }
        }
        if produced && settled(&rows) {
            return Ok(Ok(phase));
        }
        if start.elapsed() > PHASE_LIMIT {
            return Ok(Err(Outcome::failed(
                "liveness",
                format!(
                    "the poisons are not dead after {PHASE_LIMIT:?} ({} crashes)",
                    phase.restarts
                ),
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}
