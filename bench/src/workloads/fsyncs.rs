//! W5: fsyncs per event, counted, not estimated: each case runs in a child
//! process (`--fsync-child CASE SIDE EVENTS`) that prepares its files,
//! says `ready` and waits; `strace -f -c -e trace=fsync,fdatasync` is then
//! attached to it, the child is told to go, and the system calls of the
//! measured part alone (the appends, or the drain of a pre-filled backlog)
//! are counted, for the outbox and for the raw engine loop of the same
//! shape. Needs `strace` (Debian package `strace`); skipped without it.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};

use super::drain::{Shape, label};
use crate::report::{Better, Row};
use crate::run::Ctx;

/// The hidden first argument that makes the binary an fsync child.
pub(crate) const CHILD_FLAG: &str = "--fsync-child";

/// What a case does: append one event per transaction, or drain with the
/// worker in one of its shapes at a batch size.
#[derive(Clone, Copy)]
enum Case {
    Append1,
    Drain(Shape, usize),
}

const CASES: [(&str, Case); 5] = [
    ("append-1", Case::Append1),
    ("drain-stream-1", Case::Drain(Shape::PerStream, 1)),
    ("drain-stream-64", Case::Drain(Shape::PerStream, 64)),
    ("drain-sweep-1", Case::Drain(Shape::Sweeps, 1)),
    ("drain-sweep-64", Case::Drain(Shape::Sweeps, 64)),
];

/// Streams of every case (as the append and drain workloads).
const STREAMS: u64 = 100;

fn describe(case: Case) -> String {
    match case {
        Case::Append1 => format!("append, 1 per txn ({STREAMS} streams)"),
        Case::Drain(shape, batch) => format!("drain, batch {batch} ({STREAMS} streams), {}", label(shape)),
    }
}

pub(crate) async fn run(ctx: &mut Ctx) -> Result<()> {
    if Command::new("strace").arg("-V").output().is_err() {
        eprintln!("   skipped: strace is not installed (apt-get install strace)");
        return Ok(());
    }
    // Enough events for every drain to take several sweeps; strace slows
    // the child, the count does not depend on speed.
    let events = ctx.sizes.events.min(2_000);
    for (name, case) in CASES {
        let (o, r) = (
            count(ctx, name, "outbox", events)?,
            count(ctx, name, "raw", events)?,
        );
        eprintln!("   {name}: outbox {o} fsyncs, raw {r} fsyncs for {events} events");
        ctx.rows.push(
            Row::pair(
                format!("W5 fsyncs per event, {}", describe(case)),
                "fsyncs/event",
                Better::Lower,
                vec![o as f64 / events as f64],
                vec![r as f64 / events as f64],
            )
            .with_note(format!(
                "{events} events; fsync + fdatasync calls counted by strace"
            )),
        );
    }
    Ok(())
}

/// Runs one case's child under strace; the fsync and fdatasync calls of
/// its measured part.
fn count(ctx: &Ctx, name: &str, side: &str, events: u64) -> Result<u64> {
    let out = tempfile::NamedTempFile::new_in(&ctx.tmp)?;
    let mut child = Command::new(std::env::current_exe()?)
        .args([CHILD_FLAG, name, side, &events.to_string()])
        .arg(&ctx.tmp)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the fsync child")?;
    let mut lines = BufReader::new(child.stdout.take().context("child stdout")?);
    let mut line = String::new();
    lines.read_line(&mut line)?;
    ensure!(line.trim() == "ready", "fsync child {name} {side}: {line:?}");
    let mut strace = Command::new("strace")
        .args(["-f", "-qq", "-c", "-e", "trace=fsync,fdatasync", "-o"])
        .arg(out.path())
        .args(["-p", &child.id().to_string()])
        .stderr(Stdio::null())
        .spawn()
        .context("starting strace")?;
    // strace attaches to every thread before it lets them run on; give it
    // a moment (a benchmark, not a test: a late attach only undercounts,
    // and the raw side would undercount the same way).
    std::thread::sleep(Duration::from_millis(500));
    writeln!(child.stdin.as_mut().context("child stdin")?, "go")?;
    let status = child.wait()?;
    strace.wait()?;
    ensure!(status.success(), "fsync child {name} {side} failed");
    let text = std::fs::read_to_string(out.path())?;
    parse_counts(&text)
}

/// The `calls` column of strace's `-c` summary, for fsync and fdatasync.
fn parse_counts(text: &str) -> Result<u64> {
    let mut total = 0;
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if let Some(&syscall) = cols.last()
            && (syscall == "fsync" || syscall == "fdatasync")
        {
            // % time, seconds, usecs/call, calls, [errors,] syscall
            total += cols
                .get(3)
                .context("short strace line")?
                .parse::<u64>()
                .with_context(|| format!("strace line {line:?}"))?;
        }
    }
    Ok(total)
}

/// The child: prepares the case's files under TMP, prints `ready`, waits
/// for a line on stdin, runs the measured part and exits.
pub(crate) fn child(mut args: impl Iterator<Item = String>) -> Result<()> {
    let name = args.next().context("CASE")?;
    let side = args.next().context("SIDE")?;
    let events: u64 = args.next().context("EVENTS")?.parse()?;
    let tmp = std::path::PathBuf::from(args.next().context("TMP")?);
    let case = CASES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, c)| *c)
        .with_context(|| format!("unknown case {name}"))?;
    let gate = || -> Result<()> {
        println!("ready");
        std::io::stdout().flush()?;
        let mut go = String::new();
        std::io::stdin().read_line(&mut go)?;
        Ok(())
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move { run_case(&tmp, case, &side, events, gate).await })
}

async fn run_case(
    tmp: &Path,
    case: Case,
    side: &str,
    events: u64,
    gate: impl FnOnce() -> Result<()> + Send + 'static,
) -> Result<()> {
    let per_stream = events / STREAMS;
    match (case, side) {
        (Case::Append1, "outbox") => super::append::outbox_round(tmp, events, 1, gate).await?,
        (Case::Append1, "raw") => super::append::raw_round(tmp, events, 1, gate)?,
        (Case::Drain(shape, batch), "outbox") => {
            super::drain::outbox_round(tmp, STREAMS, per_stream, batch, shape, gate).await?
        }
        (Case::Drain(shape, batch), "raw") => {
            super::drain::raw_round(tmp, STREAMS, per_stream, batch as i64, shape, gate)?
        }
        (_, other) => bail!("unknown side {other}"),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strace_summaries_are_summed_over_fsync_and_fdatasync() {
        let text = "% time     seconds  usecs/call     calls    errors syscall\n\
                    ------ ----------- ----------- --------- --------- ----------------\n\
                    100.00    0.012345         308        40           fsync\n\
                      0.00    0.000000           0         3         1 fdatasync\n\
                    ------ ----------- ----------- --------- --------- ----------------\n\
                    100.00    0.012345         288        43         1 total\n";
        assert_eq!(parse_counts(text).unwrap(), 43);
        assert_eq!(parse_counts("").unwrap(), 0);
    }
}
