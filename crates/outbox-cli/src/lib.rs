#![doc = include_str!("../README.md")]
#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]

/// `println!` that returns an error instead of panicking when stdout is
/// closed (`outbox report | head -1`) or full: see [`output::line`].
macro_rules! outln {
    () => {
        $crate::output::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}

mod app;
mod backend;
pub mod blocked;
pub mod cli;
mod commands;
mod logging;
#[cfg(feature = "serve")]
pub mod metrics;
#[cfg(feature = "otel")]
mod otel;
mod output;
pub mod report;
#[cfg(feature = "serve")]
mod serve;

use std::ffi::OsString;
use std::future::Future;
use std::process::ExitCode;

use outbox_core::Error;

pub use app::App;
pub use backend::Location;
pub use cli::{Cli, Command, GlobalArgs};
pub use commands::execute;

/// The process exit code for an error.
///
/// | code | meaning |
/// |---|---|
/// | 0 | success |
/// | 1 | internal error |
/// | 2 | usage error or invalid input (bad flag value, malformed id, bad configuration, a command this binary cannot run) |
/// | 3 | not found (unknown stream, seq, row, run, projection, database file) |
/// | 4 | conflict (the row is not dead, a run is already active, version conflict) |
/// | 5 | storage error (unreadable or corrupt database, schema newer than this build, or older and not migrated) |
pub fn exit_code(err: &anyhow::Error) -> u8 {
    match err.downcast_ref::<Error>() {
        Some(
            Error::InvalidInput(_) | Error::Config(_) | Error::UnknownEventType(_) | Error::Unsupported(_),
        ) => 2,
        Some(Error::NotFound(_)) => 3,
        Some(Error::Conflict { .. } | Error::InvalidState(_) | Error::LeaseLost { .. }) => 4,
        Some(
            Error::Storage { .. }
            | Error::Corrupt { .. }
            | Error::SchemaTooNew { .. }
            | Error::SchemaTooOld { .. }
            | Error::Apply { .. },
        ) => 5,
        _ => 1,
    }
}

/// A clap usage error as one line: its first paragraph (the error and, for
/// missing arguments, their list) without the `error: ` prefix, pointing at
/// `--help`. Clap's own rendering spans several lines with tips and usage.
fn usage_error_line(bin: &str, e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let first: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .collect();
    let first = first.join(" ");
    let first = first.strip_prefix("error: ").unwrap_or(&first);
    // clap repeats the offending argument: a URL given in the wrong place
    // keeps its password to itself, a control character is shown escaped.
    let first = output::safe(first);
    if first.is_empty() {
        return format!("invalid command line (see `{bin} --help`)");
    }
    format!(
        "{first}{} (see `{bin} --help`)",
        missing_feature(&first, cfg!(feature = "serve"))
    )
}

/// Why a command or flag the docs name is unknown to this build: `serve`
/// and `work --metrics-addr` exist only with the `serve` feature.
fn missing_feature(clap_error: &str, has_serve: bool) -> &'static str {
    let serve_only = clap_error.contains("subcommand 'serve'") || clap_error.contains("'--metrics-addr'");
    if serve_only && !has_serve {
        ": this build has no web monitor or metrics endpoint (build it with the `serve` feature of outbox-cli)"
    } else {
        ""
    }
}

/// Parses a command line of `C` (a clap parser) under the binary name `bin`.
/// `Err` carries the exit code after printing: 2 and a one-line usage error
/// on stderr, or 0 after `--help` / `--version` on stdout.
pub fn parse<C: clap::Parser>(bin: &str, about: Option<&str>, args: Vec<OsString>) -> Result<C, ExitCode> {
    parse_with(bin, about, None, args)
}

fn parse_with<C: clap::Parser>(
    bin: &str,
    about: Option<&str>,
    version: Option<&str>,
    args: Vec<OsString>,
) -> Result<C, ExitCode> {
    let mut command = C::command().name(bin.to_owned()).bin_name(bin.to_owned());
    if let Some(about) = about {
        // `--help` prints the long form: replace both.
        command = command.about(about.to_owned()).long_about(about.to_owned());
    }
    if let Some(version) = version {
        command = command.version(version.to_owned());
    }
    let parsed = command
        .try_get_matches_from(args)
        .and_then(|m| C::from_arg_matches(&m));
    match parsed {
        Ok(c) => Ok(c),
        Err(e) if e.use_stderr() => {
            eprintln!("{bin}: error: {}", usage_error_line(bin, &e));
            Err(ExitCode::from(2))
        }
        Err(e) => {
            // --help and --version: on stdout, exit 0.
            let _ = e.print();
            Err(ExitCode::SUCCESS)
        }
    }
}

/// The log target of the monitor's audit lines.
const AUDIT_TARGET: &str = "outbox::audit";

/// Runs `body` the way the `outbox` binary runs a command: logging on stderr
/// filtered by `log` (else `default_log`), a two-thread tokio runtime, and an
/// error printed as one line `BIN: error: ...` with the [`exit_code`].
pub fn drive<F>(bin: &str, log: Option<&str>, default_log: &str, body: F) -> ExitCode
where
    F: Future<Output = anyhow::Result<()>>,
{
    let wanted = log.unwrap_or(default_log);
    // The monitor's audit lines (every action, every refusal) are printed
    // whatever the level, unless the filter names their target itself.
    let with_audit = if wanted.contains(AUDIT_TARGET) {
        wanted.to_owned()
    } else {
        format!("{wanted},{AUDIT_TARGET}=info")
    };
    let filter = match tracing_subscriber::EnvFilter::try_new(&with_audit) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{bin}: error: invalid log filter {wanted:?}: {e}");
            return ExitCode::from(2);
        }
    };
    #[cfg(feature = "otel")]
    let export = install_subscriber(bin, filter);
    #[cfg(not(feature = "otel"))]
    install_subscriber(filter);
    let code = drive_body(bin, body);
    // The last spans are exported before the process exits, whatever the
    // command's outcome (a graceful shutdown on a signal returns here too).
    #[cfg(feature = "otel")]
    if let Some(export) = export {
        export.shutdown(bin);
    }
    code
}

/// The subscriber on stderr, filtered by `filter`.
#[cfg(not(feature = "otel"))]
fn install_subscriber(filter: tracing_subscriber::EnvFilter) {
    let _ = stderr_subscriber().with_env_filter(filter).try_init();
}

/// The subscriber on stderr, filtered by `filter`, plus the OTLP export of
/// the spans when the environment asks for it (see the `otel` module). The
/// export is kept only if this subscriber became the global one (a process
/// that drives twice, or an application with its own subscriber, exports
/// nothing here).
#[cfg(feature = "otel")]
fn install_subscriber(bin: &str, filter: tracing_subscriber::EnvFilter) -> Option<otel::Export> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::{Layer as _, Registry};

    let Some(export) = otel::Export::from_env(bin) else {
        let _ = stderr_subscriber().with_env_filter(filter).try_init();
        return None;
    };
    // Per-layer filters: `--log` chooses what stderr prints, not what is
    // exported.
    let stderr = tracing_subscriber::fmt::layer()
        .fmt_fields(logging::Fields)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .with_filter(filter);
    let layer = export.layer::<Registry>();
    match Registry::default().with(layer).with(stderr).try_init() {
        Ok(()) => Some(export),
        Err(_) => {
            export.shutdown(bin);
            None
        }
    }
}

/// The stderr format of every command.
fn stderr_subscriber() -> tracing_subscriber::fmt::SubscriberBuilder<
    logging::Fields,
    tracing_subscriber::fmt::format::Format,
    tracing_subscriber::filter::LevelFilter,
    fn() -> std::io::Stderr,
> {
    tracing_subscriber::fmt()
        .fmt_fields(logging::Fields)
        .with_writer(std::io::stderr as fn() -> std::io::Stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
}

/// Runs `body` on a two-thread tokio runtime; the exit code.
fn drive_body<F>(bin: &str, body: F) -> ExitCode
where
    F: Future<Output = anyhow::Result<()>>,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{bin}: error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(body) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e)
            if e.downcast_ref::<output::StdoutFailed>()
                .is_some_and(output::StdoutFailed::reader_gone) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{bin}: error: {}", output::named_for(&error_line(&e), bin));
            ExitCode::from(exit_code(&e))
        }
    }
}

/// An error and its causes as one line, each cause once: a layer that
/// already quotes its source (a storage error naming SQLite's message) is
/// not followed by that source again.
fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let (text, last) = cause_text(cause);
        let text = output::safe(&text.replace('\n', " "));
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        if last {
            break;
        }
    }
    line
}

/// A cause's text for the error line, and whether it says all its own
/// causes do. A Postgres server error is its message and SQLSTATE, as the
/// adapter's own errors quote it (so the line names it once), and ends
/// the line: the driver's text adds "error returned from database", and
/// its source's "at line N", the line of the server's C source that raised
/// it, which reads as a line of the user's.
fn cause_text(cause: &(dyn std::error::Error + 'static)) -> (String, bool) {
    #[cfg(feature = "postgres")]
    if let Some(outbox_postgres::sqlx::Error::Database(d)) = cause.downcast_ref() {
        let text = match d.code() {
            Some(code) => format!("{} (SQLSTATE {code})", d.message()),
            None => d.message().to_owned(),
        };
        return (text, true);
    }
    (cause.to_string(), false)
}

/// The whole `main` of an application's `outbox` binary: parses the process
/// arguments, runs the command on the application's projections, prints a
/// one-line error and returns the exit code.
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     outbox_cli::run(outbox_cli::App::new("outbox"))
/// }
/// ```
pub fn run(app: App) -> ExitCode {
    run_from(app, std::env::args_os().collect())
}

/// [`run`] with the given arguments (the first is the program name).
pub fn run_from(app: App, args: Vec<OsString>) -> ExitCode {
    let cli: Cli = match parse_with(&app.name, app.about.as_deref(), app.version.as_deref(), args) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    run_cli(app, cli)
}

/// Runs an already parsed command line (for binaries that add commands of
/// their own around [`Command`]).
pub fn run_cli(app: App, cli: Cli) -> ExitCode {
    let bin = app.name.clone();
    let log = cli.global.log.clone();
    drive(
        &bin,
        log.as_deref(),
        "warn",
        async move { execute(&app, cli).await },
    )
}

#[cfg(test)]
mod tests {
    use super::missing_feature;

    #[test]
    fn an_error_line_names_each_cause_once() {
        #[derive(Debug)]
        struct Quoting(std::io::Error);
        impl std::fmt::Display for Quoting {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "reading the journal: {}", self.0)
            }
        }
        impl std::error::Error for Quoting {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = || std::io::Error::other("database disk image is malformed");
        let e = anyhow::Error::new(Quoting(io())).context("opening /tmp/j.db");
        assert_eq!(
            super::error_line(&e),
            "opening /tmp/j.db: reading the journal: database disk image is malformed"
        );
        let e = anyhow::Error::new(io()).context("opening /tmp/j.db");
        assert_eq!(
            super::error_line(&e),
            "opening /tmp/j.db: database disk image is malformed"
        );
    }

    #[test]
    fn a_usage_error_shows_no_password_and_no_terminal_control() {
        use clap::Parser;
        for args in [
            &["outbox", "report", "postgres://app:S3cretPW@host/db"][..],
            &[
                "outbox",
                "--partitions",
                "postgres//app:S3cretPW@host/db",
                "report",
            ],
            &["outbox", "report", "\u{1b}[2Jcleared"],
        ] {
            let e = crate::cli::Cli::try_parse_from(args).unwrap_err();
            let line = super::usage_error_line("outbox", &e);
            assert!(!line.contains("S3cretPW") && !line.contains('\u{1b}'), "{line}");
            assert!(
                line.contains("***@host/db") || line.contains("\\u001B[2J"),
                "{line}"
            );
        }
    }

    #[test]
    fn hints_in_an_error_name_the_running_binary() {
        let e = anyhow::Error::new(outbox_core::Error::NotFound(
            "database file /x/journal.db (create it with `outbox migrate`)".into(),
        ));
        let line = crate::output::named_for(&super::error_line(&e), "bankctl");
        assert!(line.contains("(create it with `bankctl migrate`)"), "{line}");
        assert!(!line.contains("`outbox "), "{line}");
        // The stock binary keeps its name; a table name is not a hint.
        let plain = "no outbox tables (`outbox migrate`)";
        assert_eq!(crate::output::named_for(plain, "outbox"), plain);
        assert_eq!(
            crate::output::named_for(plain, "bankctl"),
            "no outbox tables (`bankctl migrate`)"
        );
    }

    #[test]
    fn an_error_line_shows_no_password_and_no_terminal_control() {
        let e = anyhow::anyhow!("connecting to postgres://app:S3cretPW@db.internal/shop failed")
            .context("\u{1b}]0;owned\u{7}opening the journal");
        let line = super::error_line(&e);
        assert!(!line.contains("S3cretPW") && !line.contains('\u{1b}'), "{line}");
        assert_eq!(
            line,
            "\\u001B]0;owned\\u0007opening the journal: connecting to postgres://app:***@db.internal/shop failed"
        );
    }

    #[test]
    fn a_serve_only_command_or_flag_names_the_feature_it_needs() {
        for e in [
            "unrecognized subcommand 'serve'",
            "unexpected argument '--metrics-addr' found",
        ] {
            assert!(missing_feature(e, false).contains("`serve` feature"), "{e}");
            assert_eq!(missing_feature(e, true), "", "{e}");
        }
        assert_eq!(missing_feature("unexpected argument '--nope' found", false), "");
    }
}
