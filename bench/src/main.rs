#![allow(missing_docs)]
//! `cargo xtask bench`: the outbox on SQLite against a raw engine loop doing
//! the same work directly through rusqlite, in one run, as a table of ratios.
//!
//! Arguments: `--quick` (small sizes), `--json PATH` (default
//! `target/bench/bench.json`), `--only NAME[,NAME]` (see [`WORKLOADS`]).

mod fixture;
mod pace;
mod pg;
mod raw;
mod raw_lag;
mod report;
mod run;
mod sql_projection;
mod visible;
mod workloads;

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};

use report::Report;
use run::{Ctx, Sizes};

/// The workloads, in run order.
const WORKLOADS: &[&str] = &[
    "append",
    "concurrent",
    "drain",
    "claim",
    "lag",
    "rss",
    "fsyncs",
    "postgres",
    "partitions",
];

const USAGE: &str = "usage: outbox-bench [--quick] [--events N] [--json PATH] [--only NAME[,NAME]]

--events N overrides the events per append and drain round (default 20000,
2000 with --quick)

workloads (--only): append, concurrent, drain, claim, lag, rss, fsyncs, postgres, partitions
outbox-bench --profile-drain STREAMS PER_STREAM BATCH sweeps|per-stream ROUNDS
drains with the outbox only (no raw side, no table), for a profiler
outbox-bench --profile-pg-drain PER_STREAM BATCH sweeps|per-stream ROUNDS [hand-written]
the same on Postgres (OUTBOX_TEST_DATABASE_URL), 100 streams; with
`hand-written`, into the hand-written SQL projection
outbox-bench --profile-pg-append PER_TXN ROUNDS
Postgres appends, the outbox and the plain client loop in turn (ratio per round)
outbox-bench --profile-append PER_TXN EVENTS ROUNDS
appends with the outbox (sampled) and the raw loop in turn (ratio per round)
outbox-bench --profile-concurrent EVENTS ROUNDS
the same for the 64 concurrent appenders
outbox-bench --profile-lag RATE PER_CALL SECONDS ROUNDS
the same for the in-process lag run (prints p50, p99, max)
outbox-bench --profile-lag-across RATE PER_CALL SECONDS ROUNDS
the lag run with the worker in a child process
outbox-bench --profile-lag-raw RATE PER_CALL SECONDS ROUNDS
the raw engine loop's lag run (its worker thread beside the appender)
outbox-bench --profile-pg-lag RATE PER_CALL SECONDS ROUNDS
outbox-bench --profile-pg-lag-across RATE PER_CALL SECONDS ROUNDS
the same two on Postgres (OUTBOX_TEST_DATABASE_URL)

(postgres and the Postgres half of partitions run when OUTBOX_TEST_DATABASE_URL names a server; cargo xtask bench starts one)";

/// Parsed command line.
#[derive(Debug)]
pub(crate) struct Args {
    pub(crate) quick: bool,
    pub(crate) json: PathBuf,
    pub(crate) only: Vec<String>,
    pub(crate) events: Option<u64>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args> {
    let mut out = Args {
        quick: false,
        json: PathBuf::from("target/bench/bench.json"),
        only: WORKLOADS.iter().map(|s| s.to_string()).collect(),
        events: None,
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => out.quick = true,
            "--events" => {
                let n: u64 = args.next().context("--events needs N")?.parse()?;
                if n < 100 || !n.is_multiple_of(100) {
                    bail!("--events must be a multiple of 100");
                }
                out.events = Some(n);
            }
            "--json" => out.json = args.next().context("--json needs a PATH")?.into(),
            "--only" => {
                let list = args.next().context("--only needs NAME[,NAME]")?;
                out.only = list.split(',').map(|s| s.trim().to_string()).collect();
                for name in &out.only {
                    if !WORKLOADS.contains(&name.as_str()) {
                        bail!("unknown workload `{name}`\n\n{USAGE}");
                    }
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument `{other}`\n\n{USAGE}"),
        }
    }
    Ok(out)
}

fn main() -> Result<()> {
    let mut argv = std::env::args().skip(1).peekable();
    if argv.peek().map(String::as_str) == Some(workloads::rss::CHILD_FLAG) {
        argv.next();
        return workloads::rss::child(argv);
    }
    if argv.peek().map(String::as_str) == Some(workloads::lag::CHILD_FLAG) {
        argv.next();
        return workloads::lag::child(argv);
    }
    if argv.peek().map(String::as_str) == Some(pg::lag::CHILD_FLAG) {
        argv.next();
        return pg::lag::child(argv);
    }
    if argv.peek().map(String::as_str) == Some(workloads::drain::PROFILE_FLAG) {
        argv.next();
        return workloads::drain::profile(argv);
    }
    if argv.peek().map(String::as_str) == Some(pg::PROFILE_FLAG) {
        argv.next();
        return pg::profile(argv);
    }
    if argv.peek().map(String::as_str) == Some(pg::PROFILE_APPEND_FLAG) {
        argv.next();
        return pg::profile_append(argv);
    }
    if argv.peek().map(String::as_str) == Some(workloads::lag::PROFILE_FLAG) {
        argv.next();
        return workloads::lag::profile(argv, workloads::lag::ProfileMode::InProcess);
    }
    if argv.peek().map(String::as_str) == Some(workloads::lag::PROFILE_ACROSS_FLAG) {
        argv.next();
        return workloads::lag::profile(argv, workloads::lag::ProfileMode::Across);
    }
    if argv.peek().map(String::as_str) == Some(workloads::lag::PROFILE_RAW_FLAG) {
        argv.next();
        return workloads::lag::profile(argv, workloads::lag::ProfileMode::Raw);
    }
    if argv.peek().map(String::as_str) == Some(pg::lag::PROFILE_FLAG) {
        argv.next();
        return pg::lag::profile(argv, false);
    }
    if argv.peek().map(String::as_str) == Some(pg::lag::PROFILE_ACROSS_FLAG) {
        argv.next();
        return pg::lag::profile(argv, true);
    }
    if argv.peek().map(String::as_str) == Some(workloads::append::PROFILE_FLAG) {
        argv.next();
        return workloads::append::profile(argv);
    }
    if argv.peek().map(String::as_str) == Some(workloads::concurrent::PROFILE_FLAG) {
        argv.next();
        return workloads::concurrent::profile(argv);
    }
    if argv.peek().map(String::as_str) == Some(workloads::fsyncs::CHILD_FLAG) {
        argv.next();
        return workloads::fsyncs::child(argv);
    }
    let args = parse_args(argv)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let mut sizes = Sizes::of(args.quick);
    if let Some(n) = args.events {
        sizes.events = n;
    }
    let tmp = fixture::bench_tmp_root()?;
    eprintln!(
        "outbox-bench: {} run, temp files under {} (SQLite {}, synchronous=FULL, WAL)",
        if args.quick { "quick" } else { "full" },
        tmp.display(),
        rusqlite::version()
    );
    let mut ctx = Ctx {
        sizes,
        tmp,
        rows: Vec::new(),
        raw_append_100: None,
        drain_64: None,
        append_100: None,
        backlogs: Vec::new(),
    };
    let started = std::time::Instant::now();
    for name in WORKLOADS {
        if !args.only.iter().any(|o| o == name) {
            continue;
        }
        let t = std::time::Instant::now();
        eprintln!("\n== {name}");
        match *name {
            "append" => workloads::append::run(&mut ctx).await?,
            "concurrent" => workloads::concurrent::run(&mut ctx).await?,
            "drain" => workloads::drain::run(&mut ctx).await?,
            "claim" => workloads::claim::run(&mut ctx).await?,
            "lag" => workloads::lag::run(&mut ctx).await?,
            "rss" => workloads::rss::run(&mut ctx).await?,
            "fsyncs" => workloads::fsyncs::run(&mut ctx).await?,
            "partitions" => workloads::partitions::run(&mut ctx).await?,
            "postgres" => match std::env::var("OUTBOX_TEST_DATABASE_URL") {
                Ok(url) if !url.is_empty() => pg::run(&mut ctx, &url).await?,
                _ => eprintln!(
                    "   skipped: OUTBOX_TEST_DATABASE_URL is not set (cargo xtask bench starts a server)"
                ),
            },
            _ => unreachable!("checked in parse_args"),
        }
        eprintln!("   ({name}: {:.1} s)", t.elapsed().as_secs_f64());
    }
    let report = Report::new(args.quick, ctx.rows, started.elapsed().as_secs_f64());
    println!("\n{}", report.markdown());
    if let Some(dir) = args.json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    eprintln!("JSON: {}", args.json.display());
    Ok(())
}
