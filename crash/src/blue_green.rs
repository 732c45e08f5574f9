//! `outbox-crash blue-green`: kills a blue/green rebuild (`outbox-crash
//! rebuild-victim`, a process running `Outbox::rebuild_blue_green`) at
//! random points, again and again, while the live generation keeps taking
//! appends, and checks after every kill that the live generation is exactly
//! what it was (its full digest) and that the build resumes (same
//! generation, position never going back). A victim that finishes swaps a
//! generation in: that generation must equal a fresh rebuild, and the next
//! round builds another. At the end one victim runs to completion and the
//! live generation must equal a fresh rebuild of the whole journal.
//!
//! The kill points: the runtime's generation failpoints (`build_page:N`,
//! `build_position:N`, `before_swap:1`, `after_swap:1`: an abort at that
//! instruction, like `kill -9`) and a plain SIGKILL after a random delay.
//! SQLite files in a temporary directory; every choice comes from the seed,
//! which is printed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use outbox_core::{
    AppendRequest, Digest, ExpectedVersion, GenerationInfo, GenerationStore, ProjectionName, ProjectionStore,
    StreamId,
};
use outbox_runtime::{Config, Outbox};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};
use outbox_testkit::{OracleProjection, add, oracle_registry};
use tokio_util::sync::CancellationToken;

use crate::args::Args;
use crate::round::Rng;

const ORACLE: &str = "oracle";
/// Events per build page (small, so a build has many pages to die in).
const BATCH: u64 = 8;
const STREAMS: u64 = 12;
/// A victim still running after this long is a hang: the round fails.
const PATIENCE: Duration = Duration::from_secs(120);

type Rt = Outbox<SqliteJournal, SqliteProjectionStore>;

/// `outbox-crash blue-green [--kills N] [--seed S]`.
pub(crate) fn run(args: &Args) -> Result<u8> {
    let kills = args.num("--kills", 24)?.max(1);
    let seed = crate::args::seed_arg(args)?;
    println!("blue-green: {kills} kills, seed {seed}");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let result = rt.block_on(drive(dir.path(), kills, seed));
    match result {
        Ok(()) => Ok(0),
        Err(e) => {
            let kept = dir.keep();
            eprintln!(
                "blue-green FAILED (seed {seed}); databases kept in {}",
                kept.display()
            );
            Err(e)
        }
    }
}

async fn open(journal: &Path, projections: &Path) -> Result<Rt> {
    let j = SqliteJournal::open(journal, SqliteOptions::default()).await?;
    let p = SqliteProjectionStore::open(projections, SqliteOptions::default()).await?;
    // Inline apply only: every append applies to the live generation at once.
    Ok(Outbox::builder(j, p)
        .config(Config::default())
        .event_types(oracle_registry())
        .view(OracleProjection::new(ORACLE))
        .build()
        .await?)
}

/// Appends `n` events over the streams, then catches the live generation up
/// (an inline apply that met a swap by the victim is retried by the catch-up).
async fn append(rt: &Rt, rng: &mut Rng, n: u64, next_value: &mut i64) -> Result<()> {
    let mut batch = Vec::new();
    for _ in 0..n {
        let s = StreamId::new(format!("c{:02}", rng.below(STREAMS)))?;
        *next_value += 1;
        batch.push(AppendRequest::new(
            s,
            ExpectedVersion::Any,
            vec![add(*next_value)],
        ));
    }
    rt.append_batch(batch).await?;
    rt.replay(ORACLE, None, &CancellationToken::new()).await?;
    Ok(())
}

async fn live_digest(rt: &Rt) -> Result<Digest> {
    Ok(rt.store().digest(&*rt.projection(ORACLE)?).await?)
}

async fn record(rt: &Rt) -> Result<Option<GenerationInfo>> {
    Ok(rt.store().generation(&ProjectionName::new(ORACLE)?).await?)
}

/// The digest of a fresh in-place rebuild of the whole journal into a new
/// projection database.
async fn fresh_digest(journal: &Path, dir: &Path, n: u32) -> Result<Digest> {
    let path = dir.join(format!("fresh-{n}.db"));
    let rt = open(journal, &path).await?;
    rt.rebuild(ORACLE, &CancellationToken::new()).await?;
    let d = live_digest(&rt).await?;
    rt.journal().close().await;
    rt.store().close().await;
    let _ = std::fs::remove_file(&path);
    Ok(d)
}

/// How one victim run ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// It finished: the build was swapped in.
    Finished,
    /// Killed (a failpoint's abort, or our SIGKILL).
    Killed,
}

fn victim(
    journal: &Path,
    projections: &Path,
    crash_at: Option<&str>,
    kill_after: Option<Duration>,
    log: &Path,
) -> Result<End> {
    let exe = std::env::current_exe().context("the harness's own path")?;
    let out = std::fs::File::create(log)?;
    let mut c = Command::new(exe);
    c.arg("rebuild-victim")
        .arg("--journal")
        .arg(journal)
        .arg("--projections")
        .arg(projections)
        .env_remove("OUTBOX_CRASH_AT")
        .env(Config::OUTBOX_BATCH_SIZE, BATCH.to_string())
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    if let Some(at) = crash_at {
        c.env("OUTBOX_CRASH_AT", at);
    }
    let mut child = c.spawn().context("spawn the rebuild victim")?;
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(if status.success() {
                End::Finished
            } else {
                End::Killed
            });
        }
        if kill_after.is_some_and(|d| start.elapsed() >= d) {
            child.kill()?;
            let status = child.wait()?;
            return Ok(if status.success() {
                End::Finished
            } else {
                End::Killed
            });
        }
        if start.elapsed() > PATIENCE {
            let _ = child.kill();
            bail!(
                "the rebuild victim hung for {PATIENCE:?}; its log: {}",
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

async fn drive(dir: &Path, kills: u64, seed: u64) -> Result<()> {
    let (journal, projections): (PathBuf, PathBuf) = (dir.join("journal.db"), dir.join("projections.db"));
    let rt = open(&journal, &projections).await?;
    let mut rng = Rng(seed);
    let mut value = 0i64;
    append(&rt, &mut rng, 300, &mut value).await?;
    let (mut killed, mut finished, mut round) = (0u64, 0u32, 0u32);
    let mut tally: std::collections::BTreeMap<String, u64> = Default::default();
    while killed < kills {
        round += 1;
        // The live generation moves on between kills: at least three pages.
        let n = 3 * BATCH + rng.below(BATCH);
        append(&rt, &mut rng, n, &mut value).await?;
        let before = record(&rt).await?;
        let digest = live_digest(&rt).await?;
        let position = before.as_ref().map_or(0, |r| r.building_position);
        // Every kind of kill in turn, each with a random count or delay.
        let (crash_at, kill_after, what) = match round % 5 {
            0 => {
                let ms = rng.below(60);
                (None, Some(Duration::from_millis(ms)), format!("sigkill+{ms}ms"))
            }
            1 => (Some("before_swap:1".to_owned()), None, "before_swap:1".to_owned()),
            2 => (Some("after_swap:1".to_owned()), None, "after_swap:1".to_owned()),
            k => {
                let point = if k == 3 { "build_page" } else { "build_position" };
                let at = format!("{point}:{}", 1 + rng.below(3));
                (Some(at.clone()), None, at)
            }
        };
        let log = dir.join(format!("victim-{round}.log"));
        let end = victim(&journal, &projections, crash_at.as_deref(), kill_after, &log)?;
        let after = record(&rt).await?;
        let live_of = |r: &Option<GenerationInfo>| r.as_ref().map_or(1, |r| r.live);
        if live_of(&after) != live_of(&before) {
            // The swap committed (a finished victim, or one killed right after
            // its swap): the new live generation must be a fresh rebuild.
            // Only `after_swap` dies after its swap; the other failpoints
            // are always reached before it (each round adds three pages).
            let expected = match end {
                End::Killed => what.starts_with("after_swap") || what.starts_with("sigkill"),
                End::Finished => what.starts_with("sigkill"),
            };
            ensure!(
                expected,
                "round {round} ({what}): the victim {end:?} and the live generation changed"
            );
            let got = live_digest(&rt).await?;
            let want = fresh_digest(&journal, dir, round).await?;
            ensure!(
                got == want,
                "round {round} ({what}): the swapped-in generation differs from a fresh rebuild"
            );
            finished += 1;
            *tally.entry(format!("{what} (swapped)")).or_default() += 1;
            if end == End::Killed {
                killed += 1;
            }
            continue;
        }
        ensure!(
            end == End::Killed && !what.starts_with("after_swap"),
            "round {round} ({what}): the victim {end:?} without swapping a generation in"
        );
        killed += 1;
        *tally.entry(what.clone()).or_default() += 1;
        ensure!(
            live_digest(&rt).await? == digest,
            "round {round} ({what}): the live generation changed while a killed rebuild built beside it"
        );
        let (b0, b1) = (
            before.as_ref().and_then(|r| r.building),
            after.as_ref().and_then(|r| r.building),
        );
        ensure!(
            b0.is_none() || b0 == b1,
            "round {round} ({what}): the build was not resumed (generation {b0:?} became {b1:?})"
        );
        let p1 = after.as_ref().map_or(0, |r| r.building_position);
        ensure!(
            b0.is_none() || p1 >= position,
            "round {round} ({what}): the build's position went back from {position} to {p1}"
        );
    }
    // One more build, to completion, resuming the last killed one.
    append(&rt, &mut rng, BATCH, &mut value).await?;
    let log = dir.join("victim-final.log");
    let end = victim(&journal, &projections, None, None, &log)?;
    ensure!(
        end == End::Finished,
        "the final rebuild failed; its log: {}",
        log.display()
    );
    let got = live_digest(&rt).await?;
    let want = fresh_digest(&journal, dir, 0).await?;
    ensure!(
        got == want,
        "the final swapped-in generation differs from a fresh rebuild"
    );
    let rec = record(&rt).await?.context("a generation record")?;
    println!(
        "blue-green ok: {killed} kills over {round} rounds ({finished} swaps before the last), live generation {} after the final swap; {tally:?}",
        rec.live
    );
    rt.journal().close().await;
    rt.store().close().await;
    Ok(())
}

/// `outbox-crash rebuild-victim --journal PATH --projections PATH`: one
/// blue/green rebuild of the oracle projection, resumed if one was stopped.
pub(crate) fn victim_main(args: &Args) -> Result<u8> {
    let journal = PathBuf::from(args.req("--journal")?);
    let projections = PathBuf::from(args.req("--projections")?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let j = SqliteJournal::open(&journal, SqliteOptions::default()).await?;
        let p = SqliteProjectionStore::open(&projections, SqliteOptions::default()).await?;
        let outbox = Outbox::builder(j, p)
            .config(Config::from_env()?)
            .event_types(oracle_registry())
            .view(OracleProjection::new(ORACLE))
            .build()
            .await?;
        let swap = outbox
            .rebuild_blue_green(ORACLE, &CancellationToken::new())
            .await?;
        println!("swapped generation {} in (was {})", swap.to, swap.from);
        outbox.journal().close().await;
        outbox.store().close().await;
        Ok(0)
    })
}
