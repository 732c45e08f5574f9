//! `outbox-demo demo`: the whole lifecycle on fresh SQLite files in seconds.

use std::io::{IsTerminal, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use outbox_cli::report::{Digests, Report, build_report, digests, print_report};
use outbox_core::{AppendRequest, Error, ExpectedVersion, NewEvent, OutboxInspector, RetryPolicy, StreamId};
use outbox_runtime::consumers::{projection_exceptions, requeue_dead_projections};
use outbox_runtime::{Config, Outbox};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::domain::{DemoEvent, Faults, event_types, projections};
use outbox_core::typed::DomainEvent;

/// The demo runs on SQLite files only.
type Rt = Outbox<SqliteJournal, SqliteProjectionStore>;

/// `outbox-demo demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Directory for the demo's files (must not exist; default: a new `outbox-demo-<time>` here).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Campaigns (streams).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub campaigns: u64,
    /// Events in all.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    pub events: u64,
    /// Print the final report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The runtime over the demo's stores, with its projections.
async fn build(
    journal: SqliteJournal,
    store: SqliteProjectionStore,
    config: Config,
    faults: &Faults,
) -> Result<Rt, Error> {
    projections(faults)
        .into_iter()
        .fold(
            Outbox::builder(journal, store)
                .config(config)
                .event_types(event_types()),
            |b, p| b.view_arc(p),
        )
        .build()
        .await
}

fn json<T: Serialize>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// splitmix64, so every demo run appends the same history.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const SCENES: [&str; 6] = [
    "the tavern",
    "the crypt",
    "the market",
    "the tower",
    "the road",
    "the keep",
];
const NAMES: [&str; 8] = ["Aria", "Borin", "Cass", "Dain", "Elow", "Fenn", "Gwyn", "Hale"];

/// The events of one campaign, in order.
fn campaign_events(index: u64, count: u64, rng: &mut Rng) -> Vec<DemoEvent> {
    let mut out = Vec::with_capacity(count as usize);
    let name = format!(
        "The {} of {}",
        ["Saga", "Quest", "Siege", "Heist"][(index % 4) as usize],
        NAMES[(index % 8) as usize]
    );
    out.push(DemoEvent::CampaignCreated { name });
    let party = 4u64;
    for i in 0..party {
        let player = format!("player-{i}");
        out.push(DemoEvent::PlayerJoined {
            player: player.clone(),
        });
        let character = NAMES[((index + i) % 8) as usize].to_string();
        out.push(DemoEvent::CharacterCreated { character, player });
    }
    while (out.len() as u64) < count {
        let roll = rng.below(100);
        out.push(if roll < 70 {
            let sides = [4, 6, 8, 12, 20][rng.below(5) as usize];
            DemoEvent::DiceRolled {
                character: NAMES[((index + rng.below(party)) % 8) as usize].to_string(),
                sides,
                result: 1 + rng.below(sides as u64) as i64,
                glitch: None,
                cursed: false,
            }
        } else if roll < 85 {
            DemoEvent::ChatMessage {
                player: Some(format!("player-{}", rng.below(party))),
                text: "well met".into(),
            }
        } else {
            DemoEvent::SceneChanged {
                scene: SCENES[rng.below(6) as usize].into(),
            }
        });
    }
    out
}

/// Marks a few dice rolls faulty: two glitch (fail a few times, then pass),
/// one is cursed (fails until the fix is deployed, so it dead-letters).
fn inject_faults(plan: &mut [(StreamId, Vec<DemoEvent>)]) -> Vec<String> {
    let mut notes = Vec::new();
    let picks = [(7usize, Some(2), false), (42, Some(3), false), (66, None, true)];
    for (campaign, glitch_times, curse) in picks {
        let Some((stream, events)) = plan.get_mut(campaign % plan.len().max(1)) else {
            continue;
        };
        // A roll in the middle of the campaign, so later events queue behind it.
        let middle = events.len() / 2;
        let Some(idx) = events
            .iter()
            .skip(middle)
            .position(|e| matches!(e, DemoEvent::DiceRolled { .. }))
            .map(|i| i + middle)
        else {
            continue;
        };
        if let DemoEvent::DiceRolled { glitch, cursed, .. } = &mut events[idx] {
            *glitch = glitch_times;
            *cursed = curse;
        }
        notes.push(match glitch_times {
            Some(n) => format!("{stream}/{}: fails {n} time(s), then succeeds", idx + 1),
            None => format!("{stream}/{}: cursed, fails until the fix is deployed", idx + 1),
        });
    }
    notes
}

#[derive(Serialize)]
struct DemoSummary {
    dir: String,
    campaigns: u64,
    events: u64,
    append_transactions: u64,
    append_seconds: f64,
    injected: Vec<String>,
    retries_scheduled: u64,
    dead_lettered: u64,
    requeued: u64,
    applied: u64,
    audit_only: u64,
    report: Report,
    digests: Digests,
    verification_store_digest: String,
    verified: bool,
    seconds: f64,
}

fn progress(done: u64, total: u64, tty: bool) {
    let width = 30;
    let filled = (done.min(total) * width / total.max(1)) as usize;
    let bar = format!("{}{}", "#".repeat(filled), ".".repeat(width as usize - filled));
    if tty {
        eprint!("\r  applying [{bar}] {done}/{total}");
        let _ = std::io::stderr().flush();
    } else {
        eprintln!("  applying [{bar}] {done}/{total}");
    }
}

async fn wait_for(
    rt: &Rt,
    total: u64,
    tty: bool,
    mut done: impl AsyncFnMut() -> Result<bool, Error>,
) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last_print = Instant::now();
    loop {
        if done().await? {
            return Ok(());
        }
        if last_print.elapsed() > Duration::from_millis(if tty { 100 } else { 2000 }) {
            progress(rt.metrics().completed_rows, total, tty);
            last_print = Instant::now();
        }
        if Instant::now() > deadline {
            return Err(Error::InvalidState(
                "the demo did not finish within two minutes".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs the demo.
pub async fn demo(a: DemoArgs) -> Result<()> {
    let started = Instant::now();
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            PathBuf::from(format!("outbox-demo-{secs}"))
        }
    };
    std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(|e| {
        Error::invalid(format_args!(
            "cannot create demo directory {}: {e} (pass --dir with a new path)",
            dir.display()
        ))
    })?;
    let dir = dir.canonicalize().context("resolving the demo directory")?;
    let say = |s: String| {
        if !a.json {
            println!("{s}");
        }
    };
    say(format!(
        "outbox demo: tabletop campaigns on embedded SQLite\n  files in {}",
        dir.display()
    ));

    let opts = SqliteOptions::default();
    let journal = SqliteJournal::open(dir.join("journal.db"), opts.clone()).await?;
    let store = SqliteProjectionStore::open(dir.join("projections.db"), opts.clone()).await?;
    let faults = Faults::default();
    let retry = RetryPolicy::new(Duration::from_millis(50), Duration::from_millis(400), 5)?;
    let config = Config::apply_worker()
        .with_retry(retry)
        .with_poll_interval(Duration::from_millis(100))
        .with_lease_ttl(Duration::from_secs(10));
    let rt = build(journal, store, config, &faults).await?;
    say(format!(
        "  mode {}, retry 50ms doubling to 400ms, dead after {} failures (demo settings)",
        rt.mode(),
        retry.dead_letter_after()
    ));

    // The history: `events` spread over `campaigns`, with three faulty rolls.
    let mut rng = Rng(0x5eed);
    let per = (a.events / a.campaigns).max(12);
    let mut typed_plan = Vec::new();
    for c in 0..a.campaigns {
        let stream = StreamId::new(format!("campaign-{c:03}"))?;
        typed_plan.push((stream, campaign_events(c, per, &mut rng)));
    }
    let injected = inject_faults(&mut typed_plan);
    // Encoded once, here: the appends below send the same bytes in chunks.
    let plan = typed_plan
        .into_iter()
        .map(|(s, events)| {
            Ok((
                s,
                events
                    .iter()
                    .map(DomainEvent::to_new_event)
                    .collect::<Result<Vec<_>, Error>>()?,
            ))
        })
        .collect::<Result<Vec<(StreamId, Vec<NewEvent>)>, Error>>()?;
    for note in &injected {
        say(format!("  injected fault: {note}"));
    }
    let total: u64 = plan.iter().map(|(_, e)| e.len() as u64).sum();

    // Start the worker first: it wakes on each append.
    let running = rt.start().await?;
    let appending = Instant::now();
    let chunk = 10usize;
    let mut transactions = 0u64;
    let mut offset = 0usize;
    while offset < per as usize {
        for group in plan.chunks(10) {
            let batch: Vec<AppendRequest> = group
                .iter()
                .filter_map(|(s, events)| {
                    let slice = events.get(offset..(offset + chunk).min(events.len()))?;
                    (!slice.is_empty()).then(|| {
                        AppendRequest::new(s.clone(), ExpectedVersion::Exact(offset as u64), slice.to_vec())
                    })
                })
                .collect();
            if batch.is_empty() {
                continue;
            }
            rt.append_batch(batch).await?;
            transactions += 1;
        }
        offset += chunk;
    }
    let append_seconds = appending.elapsed().as_secs_f64();
    say(format!(
        "  appended {total} events to {} campaigns in {transactions} transactions ({append_seconds:.2}s)",
        a.campaigns
    ));

    let tty = std::io::stderr().is_terminal() && !a.json;
    // Until every row is done and the cursed event is dead for the one
    // projection it fails, the others having applied everything (ADR 0032).
    wait_for(&rt, total, tty, async || {
        let s = rt.journal().summary().await?;
        let (x, _) = projection_exceptions(rt.journal(), None, 0).await?;
        Ok(s.total() == 0 && x.dead >= 1 && x.failed == 0)
    })
    .await?;
    if tty {
        eprintln!();
    }
    let m = rt.metrics();
    // Dead letters as the store has them (what the wait above saw): the
    // worker counts its metric only after the store call returns, so the
    // metric may not have caught up yet.
    let (counts, dead) = projection_exceptions(rt.journal(), Some(outbox_core::SinkStatus::Dead), 10).await?;
    say(format!(
        "  retries scheduled: {}; dead-lettered: {}",
        m.failed, counts.dead
    ));
    for e in &dead {
        say(format!(
            "  dead: {} on {}/{} after {} attempts ({}); only that projection waits on that campaign, \
             every other projection applied every event",
            e.projection,
            e.stream,
            e.seq,
            e.attempt_count,
            e.last_error.as_deref().unwrap_or("")
        ));
    }

    // The promise, checked before the fix: a catch-up replay of the
    // journal into a fresh projection file gives the projections that did
    // not fail the same digests (they applied the cursed campaign too).
    let verify_store = SqliteProjectionStore::open(dir.join("verify-projections.db"), opts).await?;
    let verifier = build(
        rt.journal().clone(),
        verify_store.clone(),
        Config::default(),
        &faults,
    )
    .await?;
    let cancel = CancellationToken::new();
    let failing: std::collections::BTreeSet<&str> = dead.iter().map(|e| e.projection.as_str()).collect();
    for p in verifier.projections().to_vec() {
        if !failing.contains(p.name().as_str()) {
            verifier.replay(p.name().as_str(), None, &cancel).await?;
        }
    }
    let live = digests(rt.store(), rt.projections()).await?;
    let replayed = digests(&verify_store, verifier.projections()).await?;
    let healthy_verified = live
        .projections
        .iter()
        .zip(&replayed.projections)
        .filter(|((name, _), _)| !failing.contains(name.as_str()))
        .all(|(l, r)| l == r);
    say(format!(
        "  before the fix, {} equal a replay: {}",
        live.projections
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| !failing.contains(n))
            .collect::<Vec<_>>()
            .join(", "),
        if healthy_verified { "yes" } else { "NO" }
    ));

    say("  deploying the fix, then `outbox-demo requeue-dead`".into());
    faults.deploy_fix();
    let requeued = requeue_dead_projections(rt.journal(), 100).await?;
    wait_for(&rt, total, tty, async || {
        let (x, _) = projection_exceptions(rt.journal(), None, 0).await?;
        Ok(rt.journal().summary().await?.total() == 0 && x.failed + x.dead == 0)
    })
    .await?;
    if tty {
        progress(total, total, tty);
        eprintln!();
    }
    running.shutdown().await;
    say(format!(
        "  requeued {} projection exception(s); the backlog is empty",
        requeued.len()
    ));

    let report = build_report(rt.journal(), rt.store(), rt.projections(), None, 0, false).await?;
    let digests = digests(rt.store(), rt.projections()).await?;

    // The promise, checked: the rest of the catch-up replay converges on
    // the same digests.
    for p in verifier.projections().to_vec() {
        if failing.contains(p.name().as_str()) {
            verifier.replay(p.name().as_str(), None, &cancel).await?;
        }
    }
    let check = outbox_cli::report::digests(&verify_store, verifier.projections()).await?;
    let verified = check.store == digests.store && healthy_verified;

    let m = rt.metrics();
    let summary = DemoSummary {
        dir: dir.display().to_string(),
        campaigns: a.campaigns,
        events: total,
        append_transactions: transactions,
        append_seconds,
        injected,
        retries_scheduled: m.failed,
        dead_lettered: m.dead_lettered,
        requeued: requeued.len() as u64,
        applied: m.applied,
        audit_only: m.audit_only,
        report,
        digests,
        verification_store_digest: check.store,
        verified,
        seconds: started.elapsed().as_secs_f64(),
    };
    if a.json {
        json(&summary)?;
    } else {
        print_report(&summary.report, None, "outbox-demo")?;
        println!(
            "  applied {} events, {} audit-only checkpointed without projecting",
            summary.applied, summary.audit_only
        );
        println!("  digests:");
        for (name, hex) in &summary.digests.projections {
            println!("    {name:<18} {hex}");
        }
        println!("    {:<18} {}", "(store)", summary.digests.store);
        println!(
            "  verification: catch-up replay into a fresh projection file gives store digest {} ({})",
            summary.verification_store_digest,
            if summary.verification_store_digest == summary.digests.store {
                "identical"
            } else {
                "DIFFERENT"
            }
        );
        println!(
            "  done in {:.1}s; inspect with: outbox-demo --journal {dir}/journal.db --projection-db {dir}/projections.db report",
            summary.seconds,
            dir = dir.display()
        );
    }
    rt.journal().close().await;
    rt.store().close().await;
    verify_store.close().await;
    if !verified {
        return Err(
            Error::InvalidState("replay digests differ from the worker's: this is a bug".into()).into(),
        );
    }
    Ok(())
}
