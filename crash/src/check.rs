//! The exactly-once check after a round: the journal against the ack logs,
//! the oracle projection against the journal, the outbox empty, and a
//! rebuild's digest against the live one. A poison round is checked twice:
//! [`isolated`] once its poisons are dead (only they were charged, only
//! their streams stopped), then [`check`] after the fix drained them.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use outbox_core::{OutboxInspector, OutboxRow, OutboxStatus, Seq, StreamId};
use outbox_runtime::{Config, JournalBackend, Outbox, ProjectionBackend};
use outbox_testkit::{Expected, OracleProjection, check_history, oracle_registry, read_state, value_of};
use tokio_util::sync::CancellationToken;

use crate::round::{Place, stream_names};

/// `outbox-crash check`: the check alone, on a kept round.
pub(crate) fn main(args: &crate::args::Args) -> Result<u8> {
    let place = Place::from_args(args)?;
    let streams = args.num("--streams", 6)?;
    let dir = args.req("--dir")?;
    let mut logs = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        if path.extension().is_some_and(|x| x == "acks") {
            logs.push(path);
        }
    }
    let acks = read_acks(&logs)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Every round but a poison round runs the flaky projection too.
    match rt.block_on(check(&place, streams, &acks, !args.has("--poison")))? {
        Ok(v) => {
            println!("ok: {} events, {} acknowledged", v.events, v.acked);
            Ok(0)
        }
        Err(e) => {
            println!("VIOLATION:\n{e}");
            Ok(1)
        }
    }
}

/// One acknowledged append of one stream, from a victim's ack log.
#[derive(Clone, Debug)]
pub(crate) struct Ack {
    pub(crate) stream: String,
    pub(crate) first: u64,
    pub(crate) last: u64,
    values: Vec<i64>,
}

/// Reads the ack logs. A last line without its newline is a write the kill
/// interrupted (the append was acknowledged, its log line was not): it is
/// left out, as an append that is not acknowledged.
pub(crate) fn read_acks(paths: &[impl AsRef<Path>]) -> Result<Vec<Ack>> {
    let mut acks = Vec::new();
    for path in paths {
        let path = path.as_ref();
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        let complete = match text.rfind('\n') {
            Some(i) => &text[..=i],
            None => "",
        };
        for line in complete.lines() {
            let parse = || -> Option<Ack> {
                let mut f = line.split(' ');
                let stream = f.next()?.to_owned();
                let first = f.next()?.parse().ok()?;
                let last = f.next()?.parse().ok()?;
                let values: Vec<i64> = f
                    .next()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .ok()?;
                (f.next().is_none() && last >= first && values.len() as u64 == last - first + 1).then_some(
                    Ack {
                        stream,
                        first,
                        last,
                        values,
                    },
                )
            };
            acks.push(parse().with_context(|| format!("{}: malformed ack line {line:?}", path.display()))?);
        }
    }
    Ok(acks)
}

/// What a passing check saw.
#[derive(Clone, Debug)]
pub(crate) struct Verdict {
    /// Events in the journal (all applied exactly once).
    pub(crate) events: u64,
    /// Of them, acknowledged to a producer.
    pub(crate) acked: u64,
}

/// The check. `Ok(Err(..))` is a violation of the promise; `Err` is the
/// harness failing to look.
pub(crate) async fn check(
    place: &Place,
    streams: u64,
    acks: &[Ack],
    flaky: bool,
) -> Result<Result<Verdict, String>> {
    let names: &[&str] = if flaky {
        &["oracle", crate::round::FLAKY]
    } else {
        &["oracle"]
    };
    let live = with_stores!(place, |j, p, _wake| live(j, p, streams, acks, names).await)?;
    let (verdict, expected, digest) = match live {
        Ok(v) => v,
        Err(e) => return Ok(Err(e)),
    };
    let scratch = place.with_projections("rebuild");
    let rebuilt = with_stores!(&scratch, |j, p, _wake| rebuild(j, p, &expected, names).await)?;
    Ok(match rebuilt {
        Ok(d) if d == digest => Ok(verdict),
        Ok(d) => Err(format!(
            "the rebuild's digests {} differ from the live projections' {} (oracle, flaky)",
            d.iter().map(hex).collect::<Vec<_>>().join(", "),
            digest.iter().map(hex).collect::<Vec<_>>().join(", ")
        )),
        Err(e) => Err(format!("rebuild: {e}")),
    })
}

fn hex(d: &[u8; 32]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

async fn oracle_runtime<J: JournalBackend, P: ProjectionBackend>(
    journal: J,
    store: P,
) -> Result<Outbox<J, P>> {
    Outbox::builder(journal, store)
        .config(Config::default())
        .event_types(oracle_registry())
        .view(OracleProjection::new("oracle"))
        .view(OracleProjection::new(crate::round::FLAKY))
        .build()
        .await
        .context("build the checking runtime")
}

type Live = (Verdict, BTreeMap<String, Expected>, Vec<[u8; 32]>);

async fn live<J: JournalBackend, P: ProjectionBackend>(
    journal: J,
    store: P,
    streams: u64,
    acks: &[Ack],
    names: &[&str],
) -> Result<Result<Live, String>> {
    let outbox = oracle_runtime(journal, store).await?;
    let mut problems = Vec::new();
    let summary = outbox.journal().summary().await?;
    if summary.total() != 0 {
        problems.push(format!("the outbox is not empty after the drain: {summary:?}"));
    }
    let contents = contents(&outbox, streams, &mut problems).await?;
    let acked = check_acks(&contents, acks, &mut problems);
    // Every event in the journal applied exactly once, in order.
    let expected: BTreeMap<String, Expected> = contents
        .iter()
        .map(|(s, v)| {
            (
                s.clone(),
                Expected {
                    through: v.len() as u64,
                    sum: v.iter().sum(),
                },
            )
        })
        .collect();
    // The oracle, and the flaky one beside it when the round ran it (ADR 0032).
    for &name in names {
        let state = read_state(outbox.store(), name).await?;
        if let Err(e) = check_history(&state, &expected, &BTreeMap::new()) {
            problems.push(format!("history of {name}:\n{e}"));
        }
    }
    let exceptions = outbox.projection_states(None, 10).await?;
    if !exceptions.is_empty() {
        problems.push(format!("projections left off the shared path: {exceptions:?}"));
    }
    let mut digests = Vec::new();
    for &name in names {
        digests.push(outbox.store().digest(&*outbox.projection(name)?).await?.0);
    }
    if !problems.is_empty() {
        return Ok(Err(problems.join("\n")));
    }
    let events = contents.values().map(|v| v.len() as u64).sum();
    Ok(Ok((Verdict { events, acked }, expected, digests)))
}

/// What the journal holds: every event's value, by stream (appended and
/// acknowledged or not). A seq out of place is a problem.
async fn contents<J: JournalBackend, P: ProjectionBackend>(
    outbox: &Outbox<J, P>,
    streams: u64,
    problems: &mut Vec<String>,
) -> Result<BTreeMap<String, Vec<i64>>> {
    let mut contents: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for name in stream_names(streams) {
        let stream = StreamId::new(name.as_str())?;
        let mut values = Vec::new();
        loop {
            let from = values.len() as u64 + 1;
            let page = outbox
                .journal()
                .read_stream(&stream, Seq::new(from)?, 500)
                .await?;
            if page.is_empty() {
                break;
            }
            for (i, e) in page.iter().enumerate() {
                if e.seq.get() != from + i as u64 {
                    problems.push(format!(
                        "{name}: the journal has seq {} at {}",
                        e.seq,
                        from + i as u64
                    ));
                }
                values.push(value_of(e).map_err(|e| anyhow::anyhow!("{name}: {e}"))?);
            }
        }
        if !values.is_empty() {
            contents.insert(name, values);
        }
    }
    Ok(contents)
}

/// Every acknowledged append is in the journal, with its values; returns
/// the number of acknowledged events.
fn check_acks(contents: &BTreeMap<String, Vec<i64>>, acks: &[Ack], problems: &mut Vec<String>) -> u64 {
    let mut acked = 0;
    for a in acks {
        acked += a.values.len() as u64;
        let have = contents.get(&a.stream).map(Vec::as_slice).unwrap_or_default();
        let got = have.get(a.first as usize - 1..a.last as usize);
        if got != Some(a.values.as_slice()) {
            problems.push(format!(
                "acknowledged append lost or changed: {} seqs {}..={} values {:?}, the journal has {:?}",
                a.stream, a.first, a.last, a.values, got
            ));
        }
    }
    acked
}

/// What [`isolated`] saw.
#[derive(Clone, Debug)]
pub(crate) struct Isolation {
    /// Events in the journal.
    pub(crate) events: u64,
    /// Rows left waiting behind the dead poisons.
    pub(crate) behind: u64,
    /// Attempts charged to the poisons (their `attempt_count`s).
    pub(crate) charged: u64,
}

/// A poison round's first check, once its poisons are dead (every row left
/// is dead or waits behind a dead row). Exact, whatever the timing:
/// - each poison's row is `dead` with `attempt_count == threshold`;
/// - no other row is dead, failed or charged: the only other rows are those
///   behind a poison in its stream, `pending` with no attempt and no error;
/// - every acknowledged append is in the journal;
/// - the oracle applied every other stream whole and each poisoned stream
///   through the event before its poison, exactly once, in order.
pub(crate) async fn isolated(
    place: &Place,
    streams: u64,
    acks: &[Ack],
    poisons: &[(String, u64)],
    threshold: u32,
) -> Result<Result<Isolation, String>> {
    with_stores!(place, |j, p, _wake| isolated_in(
        j, p, streams, acks, poisons, threshold
    )
    .await)
}

async fn isolated_in<J: JournalBackend, P: ProjectionBackend>(
    journal: J,
    store: P,
    streams: u64,
    acks: &[Ack],
    poisons: &[(String, u64)],
    threshold: u32,
) -> Result<Result<Isolation, String>> {
    let outbox = &oracle_runtime(journal, store).await?;
    let mut problems = Vec::new();
    let rows = all_rows(outbox.journal()).await?;
    let poison_at = |stream: &str| poisons.iter().find(|(s, _)| s == stream).map(|(_, q)| *q);
    let mut charged = 0;
    let mut behind = 0;
    for (stream, seq) in poisons {
        match rows
            .iter()
            .find(|r| r.stream.as_str() == stream && r.seq.get() == *seq)
        {
            Some(r) if r.status == OutboxStatus::Dead && r.attempt_count == threshold => {
                charged += u64::from(r.attempt_count);
            }
            Some(r) => problems.push(format!(
                "poison {stream}/{seq}: {:?} after {} attempts, want dead after exactly {threshold}: {r:?}",
                r.status, r.attempt_count
            )),
            None => problems.push(format!(
                "poison {stream}/{seq}: no outbox row (applied, or never appended)"
            )),
        }
    }
    for r in &rows {
        let poison = poison_at(r.stream.as_str());
        if poison == Some(r.seq.get()) {
            continue;
        }
        let waits = poison.is_some_and(|p| r.seq.get() > p)
            && r.status == OutboxStatus::Pending
            && r.attempt_count == 0
            && r.last_error.is_none();
        if waits {
            behind += 1;
        } else {
            problems.push(format!("bystander row charged, dead or left: {r:?}"));
        }
    }
    let contents = contents(outbox, streams, &mut problems).await?;
    check_acks(&contents, acks, &mut problems);
    let mut expected = BTreeMap::new();
    for (s, v) in &contents {
        let through = match poison_at(s) {
            Some(p) if p as usize <= v.len() => p - 1,
            Some(p) => {
                problems.push(format!("poison {s}/{p}: the journal has only {} events", v.len()));
                v.len() as u64
            }
            None => v.len() as u64,
        };
        let sum = v[..through as usize].iter().sum();
        expected.insert(s.clone(), Expected { through, sum });
    }
    let state = read_state(outbox.store(), "oracle").await?;
    if let Err(e) = check_history(&state, &expected, &BTreeMap::new()) {
        problems.push(format!(
            "history (poisoned streams through the event before the poison):\n{e}"
        ));
    }
    if !problems.is_empty() {
        return Ok(Err(problems.join("\n")));
    }
    Ok(Ok(Isolation {
        events: contents.values().map(|v| v.len() as u64).sum(),
        behind,
        charged,
    }))
}

/// Every row of the outbox (a round's outbox is small).
pub(crate) async fn all_rows(inspector: &impl OutboxInspector) -> Result<Vec<OutboxRow>> {
    const ALL: usize = 1_000_000;
    let rows = inspector.list(None, ALL).await?;
    anyhow::ensure!(rows.len() < ALL, "more than {ALL} outbox rows");
    Ok(rows)
}

/// A full rebuild of the oracle and the flaky projection from the journal
/// into the scratch store: their own histories must check, and their
/// digests are returned.
async fn rebuild<J: JournalBackend, P: ProjectionBackend>(
    journal: J,
    scratch: P,
    expected: &BTreeMap<String, Expected>,
    names: &[&str],
) -> Result<Result<Vec<[u8; 32]>, String>> {
    let outbox = oracle_runtime(journal, scratch).await?;
    let mut digests = Vec::new();
    for &name in names {
        outbox.rebuild(name, &CancellationToken::new()).await?;
        let state = read_state(outbox.store(), name).await?;
        if let Err(e) = check_history(&state, expected, &BTreeMap::new()) {
            return Ok(Err(format!("the rebuilt {name}'s history:\n{e}")));
        }
        digests.push(outbox.store().digest(&*outbox.projection(name)?).await?.0);
    }
    Ok(Ok(digests))
}
