//! `cargo xtask crash [args]`: builds the crash harness (`outbox-crash`, in
//! release, with the runtime's `failpoints` feature through its dependency)
//! and runs its driver, `outbox-crash run [args]`. Postgres rounds get the
//! server of `OUTBOX_TEST_DATABASE_URL`, or a throwaway one started here;
//! sink rounds (`--sinks`) get the `nats-server` binary (installed here when
//! missing) and start servers of their own, and on Postgres a cluster of
//! their own, which they restart. See docs/crash-testing.md.

use std::env;

use anyhow::Result;

use crate::step::{cargo, run};
use crate::{nats, pg};

/// The rounds `cargo xtask ci` runs: a fixed seed, so CI is reproducible.
pub(crate) const CI_ROUNDS: &[&[&str]] = &[
    &["run", "--backend", "sqlite", "--rounds", "20", "--seed", "12"],
    &["run", "--backend", "postgres", "--rounds", "10", "--seed", "12"],
    &[
        "run",
        "--backend",
        "sqlite",
        "--sinks",
        "--rounds",
        "6",
        "--seed",
        "12",
    ],
    // Poison rounds: each waits out a lease TTL per crash, about 10 s a round
    // (these five: about 45 s here).
    &[
        "run",
        "--backend",
        "sqlite",
        "--poison",
        "--rounds",
        "5",
        "--seed",
        "12",
    ],
    &["blue-green", "--kills", "24", "--seed", "12"],
];

/// `cargo xtask crash [args]`: one run of the driver.
pub(crate) fn crash(args: &[String]) -> Result<()> {
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    if args.first() != Some(&"blue-green") {
        args.insert(0, "run");
    }
    crash_runs(&[&args])
}

/// Builds the harness once and runs the driver once per argument list,
/// starting one throwaway Postgres for them if any needs it and
/// `OUTBOX_TEST_DATABASE_URL` is unset, and finding (or installing)
/// `nats-server` if any runs sink rounds.
pub(crate) fn crash_runs(runs: &[&[&str]]) -> Result<()> {
    // The harness's own tests (left out of the workspace's test run, which
    // must not build the runtime with failpoints), on the release build the
    // runs use.
    let mut tests = cargo();
    tests.args(["test", "--release", "--locked", "-p", "outbox-crash"]);
    run("cargo test --release -p outbox-crash", tests)?;
    let mut build = cargo();
    build.args(["build", "--release", "--locked", "-p", "outbox-crash"]);
    run("cargo build --release -p outbox-crash", build)?;
    let sinks = |a: &&[&str]| a.contains(&"--sinks");
    // Sink rounds on Postgres start a cluster of their own (they restart it).
    let wants_pg = runs
        .iter()
        .filter(|a| !sinks(a))
        .any(|a| a.windows(2).any(|w| w == ["--backend", "postgres"]));
    let nats_bin = if runs.iter().any(sinks) {
        Some(nats::binary()?)
    } else {
        None
    };
    let server = if wants_pg && env::var_os("OUTBOX_TEST_DATABASE_URL").is_none_or(|v| v.is_empty()) {
        Some(pg::Server::start()?)
    } else {
        None
    };
    for args in runs {
        // `cargo run` finds the binary wherever the target directory is; it
        // is built already, so this only runs it.
        let mut c = cargo();
        c.args([
            "run",
            "--quiet",
            "--release",
            "--locked",
            "-p",
            "outbox-crash",
            "--",
        ])
        .args(*args);
        if let Some(s) = &server {
            c.env("OUTBOX_TEST_DATABASE_URL", s.url());
        }
        if let Some(bin) = &nats_bin {
            c.env("OUTBOX_TEST_NATS_SERVER", bin);
        }
        run(&format!("outbox-crash {}", args.join(" ")), c)?;
    }
    Ok(())
}
