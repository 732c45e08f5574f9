//! The crash harness: `outbox-crash run` kills real worker and producer
//! processes (`outbox-crash victim`) at random moments and at the runtime's
//! named failpoints, on SQLite and on Postgres, and checks after every round
//! that every acknowledged event was applied exactly once, in stream order.
//! Run it with `cargo xtask crash`; see docs/crash-testing.md.

use anyhow::{Result, bail};
use args::Args;

const USAGE: &str = "usage:
  outbox-crash run --backend sqlite|postgres [--rounds N] [--seed S] [--round-seed S] [--streams N] [--keep-going]
      the driver: N rounds (default 20) of fresh databases, 2-3 victims, faults,
      a clean drain and the exactly-once check; --seed picks every round's
      seed (default: from the clock, always printed); --round-seed runs the
      one round a failure printed; --keep-going runs every round and lists
      the failed ones at the end (default: stop at the first).
      Postgres: OUTBOX_TEST_DATABASE_URL.
  outbox-crash run --backend sqlite|postgres --poison [--rounds N] [--seed S] [--round-seed S] [--keep-going]
      poison rounds: one or two events abort the worker that applies them, a
      supervisor restarts it; each poison must be dead after exactly the
      dead-letter threshold of attempts, nothing else charged, every other
      stream applied; then the fix, a requeue, a drain and the exactly-once check
  outbox-crash run --backend sqlite|postgres --sinks [--rounds N] [--seed S] [--round-seed S] [--keep-going]
      sink rounds: the rounds above, with a JetStream sink (outbox-nats) in every
      worker victim and the drain, publishing to a nats-server of the round's own
      that is SIGKILLed and restarted mid-round (on Postgres, a cluster of the
      run's own, stopped -m immediate and restarted in some rounds); then the
      check of the bus: every event at least once, each stream's first copies
      in seq order, the sink's checkpoints at the streams' versions; duplicates
      counted. nats-server: OUTBOX_TEST_NATS_SERVER, PATH or /usr/sbin
  outbox-crash check --backend sqlite|postgres <place> --streams N --dir DIR
      the check alone, on a round that failed and was kept (DIR holds its ack logs)
  outbox-crash victim --backend sqlite|postgres <place> --role R --seed S --streams N --appends N --ack-log PATH [--poison LIST] [--nats URL]
      one process: R is producer | inline | worker | both | drain; --poison
      runs the `poison` view beside the oracle, which aborts the process when
      it applies an event of LIST (stream:seq,...; `none`: never); <place> is
      --journal PATH --projections PATH (sqlite) or --url URL --journal-schema S
      --projection-schema S (postgres); --nats registers the crash rounds' JetStream
      sink (a worker, and the drain, which also waits until the sink has every
      event, requeuing a dead-lettered stream); the runtime's configuration (mode flags,
      lease TTL, worker id) comes from the OUTBOX_* variables the driver sets
  outbox-crash blue-green [--kills N] [--seed S]
      kills a blue/green rebuild N times (default 24) at the generation failpoints
      and at random moments while the live generation takes appends (SQLite): after
      each kill the live generation is unchanged and the build resumes; every swap,
      and the final one, equals a fresh rebuild
  outbox-crash rebuild-victim --journal PATH --projections PATH
      one blue/green rebuild of the oracle projection (the blue-green driver's victim)";

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => run(&Args(args[1..].to_vec())),
        Some("victim") => victim::main(&Args(args[1..].to_vec())),
        Some("check") => check::main(&Args(args[1..].to_vec())),
        Some("blue-green") => blue_green::run(&Args(args[1..].to_vec())),
        Some("rebuild-victim") => blue_green::victim_main(&Args(args[1..].to_vec())),
        Some("-h" | "--help" | "help") | None => {
            println!("{USAGE}");
            Ok(0)
        }
        Some(other) => {
            eprintln!("error: unknown command `{other}`\n\n{USAGE}");
            Ok(2)
        }
    };
    match result {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("outbox-crash: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `run`: the driver's rounds, the poison rounds with `--poison` (both
/// start from the driver's setup; dispatched here so that neither module
/// calls the other).
fn run(args: &Args) -> Result<u8> {
    let setup = driver::setup(args)?;
    if args.has("--poison") {
        if setup.sinks.is_some() {
            bail!("--poison and --sinks are separate kinds of round: give one");
        }
        return poison::run(&setup);
    }
    driver::run_faults(args, &setup)
}

/// Runs `$body` with `$j` (journal), `$p` (projection store) and `$wake`
/// (the journal's wake source) opened at `$place`, then closes both.
macro_rules! with_stores {
    ($place:expr, |$j:ident, $p:ident, $wake:ident| $body:expr) => {
        match $place {
            $crate::round::Place::Sqlite { journal, projections } => {
                let $j = outbox_sqlite::SqliteJournal::open(journal, outbox_sqlite::SqliteOptions::default())
                    .await
                    .context("open the sqlite journal")?;
                let $p = outbox_sqlite::SqliteProjectionStore::open(
                    projections,
                    outbox_sqlite::SqliteOptions::default(),
                )
                .await
                .context("open the sqlite projection store")?;
                let $wake = $j.wake_source();
                let (jc, pc) = ($j.clone(), $p.clone());
                let r = $body;
                jc.close().await;
                pc.close().await;
                r
            }
            $crate::round::Place::Postgres {
                url,
                journal,
                projections,
            } => {
                // As `outbox work` does: a sink round may restart the
                // server while a victim connects (or migrates).
                let never = tokio_util::sync::CancellationToken::new();
                let $j = outbox_runtime::retry_while_unavailable(
                    $crate::round::CONNECT_RETRY,
                    &never,
                    "connect",
                    || outbox_postgres::PgJournal::connect(url, $crate::round::pg_options(journal)),
                )
                .await
                .context("connect the postgres journal")?
                .context("cancelled")?;
                let $p = outbox_runtime::retry_while_unavailable(
                    $crate::round::CONNECT_RETRY,
                    &never,
                    "connect",
                    || {
                        outbox_postgres::PgProjectionStore::connect(
                            url,
                            $crate::round::pg_options(projections),
                        )
                    },
                )
                .await
                .context("connect the postgres projection store")?
                .context("cancelled")?;
                let $wake = $j.wake_source();
                let (jc, pc) = ($j.clone(), $p.clone());
                let r = $body;
                jc.close().await;
                pc.close().await;
                r
            }
        }
    };
}

// After `with_stores!`, which they use.
mod args;
mod blue_green;
mod check;
mod driver;
mod poison;
mod round;
mod sinks;
mod victim;
