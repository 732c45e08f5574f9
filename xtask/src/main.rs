//! Project automation. `cargo xtask ci` is the single entry point that CI and
//! people both run.

use std::env;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

mod browser;
mod crash;
mod migrations;
mod nats;
mod package;
mod pg;
mod readme_crate;
mod step;
mod tidy;

use step::{cargo, root, run};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  ci          fmt check, tidy, the migrations check, clippy (warnings
              denied), the core boundary check, docs, the package check,
              the README's crate (readme-crate), every test (starts a throwaway Postgres when needed), and a
              short crash run (20 SQLite and 10 Postgres rounds, 6 SQLite sink
              rounds, 5 SQLite poison rounds, 24 kills of a blue/green rebuild,
              fixed seed)
  tidy [--fix]
              check (as text) that every OUTBOX_* variable is defined once and
              is a row of README.md's configuration table (--fix writes the
              table), and that every conformance check is in for_each_check!
  boundary    check that outbox-core depends on neither tokio nor sqlx
  migrations-check
              check that each adapter's migrations/ equals migrations/<dialect>/
  sync-migrations
              copy migrations/<dialect>/ into crates/outbox-<dialect>/migrations/
  package-check
              cargo package every publishable crate (all together, then each
              with only the crates it builds on, in dependency order) and
              build each package from its .crate file
  test        run every test (starts a throwaway Postgres when needed,
              chromedriver for the web monitor's browser test, installing
              chromium and chromium-driver when missing, and a nats-server
              with JetStream for the sink tests, installing nats-server when
              missing)
  crash [--backend sqlite|postgres] [--poison | --sinks] [--rounds N] [--seed S] [--round-seed S] [--keep-going]
              the crash harness (release, failpoints on): kill -9 and named
              crash points, then the exactly-once check; --poison: events that
              abort the worker applying them, dead after exactly the threshold,
              nothing else charged; --sinks: a JetStream sink in every worker,
              the NATS (and Postgres) server killed and restarted, then the
              at-least-once, in-order check of the bus (docs/crash-testing.md)
  crash blue-green [--kills N] [--seed S]
              kills a blue/green rebuild at random points: the live
              generation unchanged, the build resumable (docs/crash-testing.md)
  readme-crate
              build a crate outside the workspace from the README's marked
              snippets alone and run its test
  pg-shell    start a throwaway Postgres, print its URL, wait for Enter
  bench [--quick] [--json PATH] [--only NAME[,NAME]]
              run outbox-bench (release): the outbox on SQLite against a raw
              engine loop doing the same work; prints a markdown table and
              writes JSON (default target/bench/bench.json). --quick: small
              sizes; --only: append, concurrent, drain, claim, lag, rss";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("tidy") => tidy::run(&args[1..]),
        Some("boundary") => boundary(),
        Some("migrations-check") => migrations::check(),
        Some("sync-migrations") => migrations::sync(),
        Some("package-check") => package::package_check(),
        Some("readme-crate") => readme_crate::readme_crate(),
        Some("test") => test(),
        Some("crash") => crash::crash(&args[1..]),
        Some("pg-shell") => pg_shell(),
        Some("bench") => bench(&args[1..]),
        Some("-h" | "--help" | "help") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => {
            eprintln!("error: unknown command `{other}`\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn ci() -> Result<()> {
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--check"]);
    run("cargo fmt --check", fmt)?;

    tidy::run(&[])?;

    migrations::check()?;

    let mut clippy = cargo();
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ]);
    run("cargo clippy -D warnings", clippy)?;

    boundary()?;

    let mut doc = cargo();
    doc.args(["doc", "--workspace", "--no-deps", "--locked"])
        .env("RUSTDOCFLAGS", "-D warnings");
    run("cargo doc", doc)?;

    // After `cargo doc`: the packages' check reuses its dependency metadata.
    package::package_check()?;

    readme_crate::readme_crate()?;

    test()?;

    // After the tests: a short crash run with a fixed seed.
    crash::crash_runs(crash::CI_ROUNDS)
}

/// `outbox-core` must stay free of I/O runtimes and drivers.
fn boundary() -> Result<()> {
    eprintln!("\n==> boundary: outbox-core has no tokio or sqlx");
    let out = cargo()
        .args([
            "tree",
            "-p",
            "outbox-core",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .output()
        .context("cargo tree")?;
    if !out.status.success() {
        bail!("cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let tree = String::from_utf8(out.stdout)?;
    let offenders: Vec<&str> = tree
        .lines()
        .filter(|l| {
            let name = l.split_whitespace().next().unwrap_or("");
            name == "tokio" || name.starts_with("sqlx") || name == "mio" || name == "libsqlite3-sys"
        })
        .collect();
    if !offenders.is_empty() {
        bail!(
            "outbox-core must not depend on these (normal dependencies): {}",
            offenders.join(", ")
        );
    }
    eprintln!(
        "ok: {} crates in outbox-core's tree, none of them tokio or sqlx",
        tree.lines().count()
    );
    // Test seams stay out of production: no adapter links the testkit.
    for adapter in [
        "outbox-memory",
        "outbox-sqlite",
        "outbox-postgres",
        "outbox-runtime",
        "outbox-cli",
    ] {
        let out = cargo()
            .args([
                "tree", "-p", adapter, "-e", "normal", "--prefix", "none", "--format", "{p}",
            ])
            .output()
            .context("cargo tree")?;
        if !out.status.success() {
            bail!("cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        if String::from_utf8(out.stdout)?
            .lines()
            .any(|l| l.split_whitespace().next() == Some("outbox-testkit"))
        {
            bail!("{adapter} must not depend on outbox-testkit (a test seam) as a normal dependency");
        }
    }
    eprintln!("ok: no adapter, the runtime or the CLI links outbox-testkit");
    Ok(())
}

fn needs_postgres() -> bool {
    root().join("crates/outbox-postgres").exists()
}

/// The test run leaves out the crash harness: it is the one package that
/// turns on the runtime's `failpoints` feature, and with it in the run,
/// Cargo would unify the feature into every test binary's runtime, so the
/// tests would test a build users never get. Its own tests run with the
/// crash runs (`crash::crash_runs`), on their release build.
const NOT_THE_CRASH_HARNESS: [&str; 2] = ["--exclude", "outbox-crash"];

/// Fails unless the test run ([`NOT_THE_CRASH_HARNESS`]) builds the
/// runtime without its `failpoints` feature (`cargo tree -e features`).
fn tests_build_without_failpoints() -> Result<()> {
    eprintln!("\n==> the test run's runtime has no failpoints");
    let out = cargo()
        .args([
            "tree",
            "--workspace",
            "--locked",
            "-e",
            "features,normal,dev,build",
            "-i",
            "outbox-runtime",
            "--prefix",
            "none",
        ])
        .args(NOT_THE_CRASH_HARNESS)
        .output()
        .context("cargo tree")?;
    if !out.status.success() {
        bail!("cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let tree = String::from_utf8(out.stdout)?;
    if let Some(line) = tree.lines().find(|l| l.contains("feature \"failpoints\"")) {
        bail!(
            "the test run builds outbox-runtime with its failpoints feature ({line}): only outbox-crash may turn it on"
        );
    }
    eprintln!(
        "ok: outbox-runtime's features in the test run: {}",
        features_of(&tree, "outbox-runtime").join(", ")
    );
    Ok(())
}

/// The features `cargo tree -e features -i` lists for `package`.
fn features_of(tree: &str, package: &str) -> Vec<String> {
    let prefix = format!("{package} feature \"");
    let mut out: Vec<String> = tree
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix(&prefix)?
                .split('"')
                .next()
                .map(str::to_owned)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn test() -> Result<()> {
    tests_build_without_failpoints()?;
    // An empty URL counts as unset, as in the tests (`outbox_testkit::pg`):
    // the tests always get a server here, never a reason to skip.
    let server = if needs_postgres() && env::var_os("OUTBOX_TEST_DATABASE_URL").is_none_or(|v| v.is_empty()) {
        Some(pg::Server::start()?)
    } else {
        None
    };
    // The web monitor's browser test gets a chromedriver (installed if
    // missing), unless the caller named a WebDriver.
    let driver = if env::var_os("OUTBOX_TEST_WEBDRIVER_URL").is_none_or(|v| v.is_empty()) {
        Some(browser::Driver::start()?)
    } else {
        None
    };
    // The sink tests get a NATS server (installed if missing), unless the
    // caller named one.
    let nats = if env::var_os("OUTBOX_TEST_NATS_URL").is_none_or(|v| v.is_empty()) {
        Some(nats::Server::start()?)
    } else {
        None
    };
    let with_pg = |mut c: Command| {
        if let Some(s) = &server {
            c.env("OUTBOX_TEST_DATABASE_URL", s.url());
        }
        if let Some(n) = &nats {
            c.env("OUTBOX_TEST_NATS_URL", n.url());
            c.env("OUTBOX_TEST_NATS_SERVER", n.bin());
        }
        if let Some(d) = &driver {
            c.env("OUTBOX_TEST_WEBDRIVER_URL", d.url());
        }
        c
    };
    let nextest = cargo()
        .args(["nextest", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    let mut tests = cargo();
    if nextest {
        tests.args(["nextest", "run", "--workspace", "--locked", "--no-fail-fast"]);
        tests.args(NOT_THE_CRASH_HARNESS);
        run("cargo nextest run", with_pg(tests))?;
    } else {
        tests.args([
            "test",
            "--workspace",
            "--locked",
            "--no-fail-fast",
            "--lib",
            "--bins",
            "--tests",
        ]);
        tests.args(NOT_THE_CRASH_HARNESS);
        run("cargo test", with_pg(tests))?;
    }
    let mut doctests = cargo();
    doctests.args(["test", "--workspace", "--locked", "--doc"]);
    doctests.args(NOT_THE_CRASH_HARNESS);
    run("cargo test --doc", with_pg(doctests))?;
    cli_without_sqlite(with_pg(cargo()))
}

/// The CLI as an application on Postgres alone builds it (without its
/// default SQLite backend): it builds with no warning, and its tests pass.
/// The warnings are read from the build's output: denying them through
/// `RUSTFLAGS` would rebuild every dependency.
fn cli_without_sqlite(mut tests: Command) -> Result<()> {
    const FEATURES: [&str; 6] = [
        "-p",
        "outbox-cli",
        "--locked",
        "--no-default-features",
        "--features",
        "serve,postgres",
    ];
    eprintln!("\n==> outbox-cli without SQLite builds without warnings");
    let out = cargo()
        .args(["build", "--all-targets", "--message-format", "short"])
        .args(FEATURES)
        .output()
        .context("cargo build")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("outbox-cli without SQLite does not build:\n{stderr}");
    }
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("warning:")).collect();
    if !warnings.is_empty() {
        bail!(
            "outbox-cli without SQLite builds with warnings:\n{}",
            warnings.join("\n")
        );
    }
    tests.arg("test").args(FEATURES);
    run(
        "cargo test -p outbox-cli --no-default-features --features serve,postgres",
        tests,
    )
}

fn pg_shell() -> Result<()> {
    let server = pg::Server::start()?;
    println!("{}", server.url());
    eprintln!("press Enter to stop the server");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    drop(server);
    Ok(())
}

/// `cargo run --release -p outbox-bench -- [args...]`: the outbox against a
/// raw SQLite engine loop, as a table and a JSON file.
fn bench(extra: &[String]) -> Result<()> {
    let mut b = cargo();
    b.args(["run", "--release", "-p", "outbox-bench", "--"])
        .args(extra);
    // The Postgres workload needs a server: a throwaway one unless the
    // caller named one, or `--only` leaves Postgres out.
    let only = extra
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| extra.get(i + 1));
    let wants_pg = only.is_none_or(|list| list.split(',').any(|w| w.trim() == "postgres"));
    let named = std::env::var("OUTBOX_TEST_DATABASE_URL").is_ok_and(|u| !u.is_empty());
    let _server = if wants_pg && !named {
        // Durable, as production runs (fsync on): the tests' server is not.
        let server = pg::Server::start_with(pg::Durability::Durable)?;
        b.env("OUTBOX_TEST_DATABASE_URL", server.url());
        Some(server)
    } else {
        None
    };
    run("cargo run --release -p outbox-bench", b)
}
