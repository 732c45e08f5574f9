//! Printing: human text or JSON.

use std::fmt;
use std::io::Write;

use serde::Serialize;

/// Standard output could not be written: its reader is gone (a closed
/// pipe) or its file is full. Commands return it like any other error;
/// the binary exits quietly on a closed pipe and with one line otherwise.
#[derive(Debug)]
pub(crate) struct StdoutFailed(pub(crate) std::io::Error);

impl fmt::Display for StdoutFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot write to standard output: {}", self.0)
    }
}

impl std::error::Error for StdoutFailed {}

impl StdoutFailed {
    /// Whether the reader went away (`| head`, a pager quit): the output
    /// is no longer wanted, which is no failure of the command.
    pub(crate) fn reader_gone(&self) -> bool {
        self.0.kind() == std::io::ErrorKind::BrokenPipe
    }
}

/// Writes one line to stdout (the [`outln!`] macro's body).
pub(crate) fn line(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(|e| StdoutFailed(e).into())
}

/// Prints `value` as pretty JSON on stdout.
pub(crate) fn json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?)
}

/// Prints `value` as one JSON line on stdout.
pub(crate) fn json_line<T: Serialize>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string(value)?)
}

/// Milliseconds as a short human duration.
pub(crate) fn human_ms(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60),
    }
}
