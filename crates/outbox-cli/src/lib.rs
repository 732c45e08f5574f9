#![doc = include_str!("../README.md")]

pub mod cli;
mod commands;
mod demo;
pub mod domain;
mod output;

use std::process::ExitCode;

use clap::Parser;
use outbox_core::Error;

pub use commands::{open_url, run};

/// The process exit code for an error.
///
/// | code | meaning |
/// |---|---|
/// | 0 | success |
/// | 1 | internal error |
/// | 2 | usage error or invalid input (bad flag value, malformed id, bad configuration) |
/// | 3 | not found (unknown stream, seq, row, run, projection, database file) |
/// | 4 | conflict (the row is not dead, a run is already active, version conflict) |
/// | 5 | storage error (unreadable or corrupt database, schema newer than this build) |
pub fn exit_code(err: &anyhow::Error) -> u8 {
    match err.downcast_ref::<Error>() {
        Some(Error::InvalidInput(_) | Error::Config(_) | Error::UnknownEventType(_)) => 2,
        Some(Error::NotFound(_)) => 3,
        Some(Error::Conflict { .. } | Error::InvalidState(_) | Error::LeaseLost { .. }) => 4,
        Some(
            Error::Storage { .. } | Error::Corrupt { .. } | Error::SchemaTooNew { .. } | Error::Apply { .. },
        ) => 5,
        _ => 1,
    }
}

/// A clap usage error as one line: its first paragraph (the error and, for
/// missing arguments, their list) without the `error: ` prefix, pointing at
/// `--help`. Clap's own rendering spans several lines with tips and usage.
fn usage_error_line(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let first: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .collect();
    let first = first.join(" ");
    let first = first.strip_prefix("error: ").unwrap_or(&first);
    if first.is_empty() {
        return "invalid command line (see `outbox --help`)".into();
    }
    format!("{first} (see `outbox --help`)")
}

/// Parses the arguments, runs the command, prints a one-line error and
/// returns the exit code. The `outbox` binary's whole `main`.
pub fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            eprintln!("outbox: error: {}", usage_error_line(&e));
            return ExitCode::from(2);
        }
        Err(e) => {
            // --help and --version: on stdout, exit 0.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    let default = if matches!(cli.command, cli::Command::Demo(_)) {
        "error"
    } else {
        "warn"
    };
    let wanted = cli.log.as_deref().unwrap_or(default);
    let filter = match tracing_subscriber::EnvFilter::try_new(wanted) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("outbox: error: invalid log filter {wanted:?}: {e}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outbox: error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let line = format!("{e:#}").replace('\n', " ");
            eprintln!("outbox: error: {line}");
            ExitCode::from(exit_code(&e))
        }
    }
}
