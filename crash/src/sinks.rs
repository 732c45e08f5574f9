//! Sink rounds (`outbox-crash run --sinks`): every worker victim also runs
//! a JetStream sink ([`outbox_nats::NatsSink`]) beside the oracle, against a
//! `nats-server` of the round's own that the driver kills and restarts
//! mid-round; after the drain, [`check_bus`] reads back what JetStream
//! stored and checks it against the journal: every event there at least
//! once, each stream's first copies in seq order, the sink's checkpoints at
//! the streams' versions.

use std::collections::{BTreeMap, HashSet};
use std::fs::{File, OpenOptions};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use outbox_core::{EventJournal, SinkName, SinkStatus, SinkStore, StreamId};
use outbox_nats::{NatsSink, NatsSinkOptions, Subjects};

use crate::check::Ack;
use crate::round::{Place, stream_names};

/// The sink's name: the key of its checkpoints and cursors in the journal.
pub(crate) const SINK: &str = "bus";
/// The subject every event is published to (one subject, so the JetStream
/// stream's order is the order of arrival).
const SUBJECT: &str = "crash.events";
/// The JetStream stream capturing it.
const JS_STREAM: &str = "CRASH";
/// The stream's duplicate window: the shortest the server takes (100 ms),
/// so that JetStream stores a redelivery instead of dropping it by message
/// id unless it comes within 100 ms of the copy before it, and the check
/// counts (nearly) the duplicates the sink sent. A longer window would hide
/// them; it could hide neither a loss nor a reordering of first copies.
const DUPLICATE_WINDOW: Duration = Duration::from_millis(100);
/// How long a victim's publish waits for JetStream's acknowledgement: well
/// under the lease TTL (1.5 s), past which the runtime counts a publish as
/// failed anyway.
const ACK_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a started server may take to listen (liveness only).
const LISTEN_LIMIT: Duration = Duration::from_secs(30);

/// The `nats-server` binary: `OUTBOX_TEST_NATS_SERVER` (set by `cargo xtask
/// crash`, which installs the Debian package when it is missing), else on
/// `PATH` or where Debian puts it.
pub(crate) fn nats_bin() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os(outbox_testkit::nats::NATS_SERVER_VAR).filter(|v| !v.is_empty()) {
        return Ok(bin.into());
    }
    ["nats-server", "/usr/sbin/nats-server", "/usr/bin/nats-server"]
        .into_iter()
        .map(PathBuf::from)
        .find(|bin| {
            Command::new(bin)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .context(
            "sink rounds need nats-server (apt-get install nats-server, or `cargo xtask crash --sinks`, \
             which installs it), or OUTBOX_TEST_NATS_SERVER naming the binary",
        )
}

/// A round's own `nats-server`: JetStream on, a loopback port, its store and
/// its log in the round's directory (kept with a failed round). The driver
/// kills it (SIGKILL) and restarts it on the same port and store.
pub(crate) struct Nats {
    bin: PathBuf,
    port: u16,
    store: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Nats {
    /// Starts one in `dir` and waits until it listens.
    pub(crate) fn start(bin: &Path, dir: &Path) -> Result<Nats> {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .context("a free loopback port for nats-server")?
            .port();
        let mut nats = Nats {
            bin: bin.to_owned(),
            port,
            store: dir.join("nats"),
            log: dir.join("nats.log"),
            child: None,
        };
        nats.restart()?;
        Ok(nats)
    }

    pub(crate) fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGKILL, and waits for it to exit: whatever it acknowledged was
    /// written to its store (in the OS's cache), which a killed process
    /// does not lose.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it (again) on the same port and store, and waits until it
    /// listens. A port another process took meanwhile fails the round as a
    /// harness error (the server exits).
    pub(crate) fn restart(&mut self) -> Result<()> {
        self.kill();
        let log: File = OpenOptions::new().create(true).append(true).open(&self.log)?;
        let mut child = Command::new(&self.bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string(), "-sd"])
            .arg(&self.store)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", self.bin.display()))?;
        let t = Instant::now();
        while TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_err() {
            if let Some(s) = child.try_wait()? {
                bail!("nats-server exited with {s} (see nats.log)");
            }
            if t.elapsed() > LISTEN_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "nats-server did not listen on port {} within {LISTEN_LIMIT:?}",
                    self.port
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.child = Some(child);
        Ok(())
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

fn sink_name() -> SinkName {
    SinkName::new(SINK).expect("a valid sink name")
}

/// The sink a victim registers. Lazy: the server may be down when the
/// victim starts; a publish connects (or fails and is retried with the
/// runtime's backoff), and once connected the client reconnects by itself.
pub(crate) fn victim_sink(url: &str) -> Result<NatsSink> {
    Ok(NatsSink::lazy(
        sink_name(),
        url,
        NatsSinkOptions::default()
            .with_subjects(Subjects::Fixed(SUBJECT.into()))
            .with_ack_timeout(ACK_TIMEOUT),
    )?)
}

/// Creates the round's JetStream stream (before any victim starts).
pub(crate) async fn create_stream(url: &str) -> Result<()> {
    let sink = NatsSink::connect(sink_name(), url, NatsSinkOptions::default())
        .await
        .context("connect to the round's nats-server")?;
    sink.ensure_stream(JS_STREAM, vec![SUBJECT.into()], DUPLICATE_WINDOW)
        .await
        .context("create the JetStream stream")?;
    Ok(())
}

/// Whether every (sink, stream) checkpoint is at its stream's version, and
/// the dead ones (the drain requeues them, as an operator would).
pub(crate) async fn caught_up(
    journal: &(impl EventJournal + SinkStore),
    streams: u64,
) -> Result<(bool, Vec<StreamId>)> {
    let ids = stream_ids(streams)?;
    let states = journal.sink_states(&sink_name(), &ids).await?;
    let mut done = true;
    let mut dead = Vec::new();
    for (id, state) in ids.iter().zip(&states) {
        if state.seq != journal.stream_version(id).await? {
            done = false;
        }
        if state.status == SinkStatus::Dead {
            dead.push(id.clone());
        }
    }
    Ok((done, dead))
}

/// Requeues a dead (sink, stream), as `outbox sinks requeue` does.
pub(crate) async fn requeue(journal: &impl SinkStore, stream: &StreamId) -> Result<()> {
    journal.requeue_sink(&sink_name(), stream).await?;
    Ok(())
}

fn stream_ids(streams: u64) -> Result<Vec<StreamId>> {
    stream_names(streams)
        .iter()
        .map(|n| StreamId::new(n.as_str()).map_err(Into::into))
        .collect()
}

/// What the bus held after a round, against the journal.
#[derive(Clone, Debug, Default)]
pub(crate) struct BusFigures {
    /// Events in the journal.
    pub(crate) events: u64,
    /// Messages JetStream stored.
    pub(crate) messages: u64,
    /// Messages beyond the first of their id.
    pub(crate) duplicates: u64,
    /// Events of the journal with no message (acknowledged or not).
    pub(crate) missing: u64,
    /// Of them, acknowledged to a producer.
    pub(crate) missing_acked: u64,
    /// First copies that arrived after the first copy of a later seq of
    /// their stream.
    pub(crate) order_violations: u64,
    /// Dead (sink, stream)s the drain requeued (set by the driver).
    pub(crate) requeued: u64,
}

/// The check of a sink round, after the drain: exact, whatever the timing.
/// `Ok((figures, problems))`: no problem is a pass.
pub(crate) async fn check_bus(
    place: &Place,
    url: &str,
    streams: u64,
    acks: &[Ack],
) -> Result<(BusFigures, Vec<String>)> {
    let ids = messages(url).await?;
    with_stores!(place, |j, _p, _wake| judge(&j, streams, acks, &ids).await)
}

/// Every stored message's id, in the stream's order.
async fn messages(url: &str) -> Result<Vec<String>> {
    let sink = NatsSink::connect(sink_name(), url, NatsSinkOptions::default())
        .await
        .context("connect to read the bus")?;
    let js = sink.jetstream().await?;
    let stream = js.get_stream(JS_STREAM).await.map_err(|e| anyhow!("{e}"))?;
    let info = stream.get_info().await.map_err(|e| anyhow!("{e}"))?;
    let mut out = Vec::new();
    if info.state.messages == 0 {
        return Ok(out);
    }
    // Nothing is ever deleted from the stream (no limits, no consumer), so
    // its sequences are contiguous.
    for seq in info.state.first_sequence..=info.state.last_sequence {
        let m = stream
            .get_raw_message(seq)
            .await
            .map_err(|e| anyhow!("message {seq}: {e}"))?;
        let id = m
            .headers
            .get("Nats-Msg-Id")
            .with_context(|| format!("message {seq} has no Nats-Msg-Id"))?
            .as_str()
            .to_owned();
        out.push(id);
    }
    Ok(out)
}

async fn judge(
    journal: &(impl EventJournal + SinkStore),
    streams: u64,
    acks: &[Ack],
    ids: &[String],
) -> Result<(BusFigures, Vec<String>)> {
    let names = stream_ids(streams)?;
    let mut version = BTreeMap::new();
    for id in &names {
        version.insert(id.as_str().to_owned(), journal.stream_version(id).await?);
    }
    let acked: Vec<(&str, u64, u64)> = acks
        .iter()
        .map(|a| (a.stream.as_str(), a.first, a.last))
        .collect();
    let (f, mut problems) = tally(&version, &acked, ids);
    // The drain delivered until every checkpoint was at its stream's
    // version; nothing since could move one.
    let states = journal.sink_states(&sink_name(), &names).await?;
    for (id, state) in names.iter().zip(&states) {
        let v = version[id.as_str()];
        if state.seq != v || state.status != SinkStatus::Ok {
            problems.push(format!(
                "{id}: the sink's checkpoint is {} ({}), the stream's version {v}",
                state.seq,
                state.status.as_str()
            ));
        }
    }
    Ok((f, problems))
}

/// The bus (`ids`, message ids in arrival order) against the journal
/// (`version` of each stream) and the acknowledged appends (stream, first
/// seq, last seq): every event there at least once, the first copies of
/// each stream in seq order, nothing that is not an event of the journal.
fn tally(
    version: &BTreeMap<String, u64>,
    acked: &[(&str, u64, u64)],
    ids: &[String],
) -> (BusFigures, Vec<String>) {
    let mut problems = Vec::new();
    let mut f = BusFigures {
        messages: ids.len() as u64,
        events: version.values().sum(),
        ..BusFigures::default()
    };
    // First copies per stream, in arrival order.
    let mut seen: HashSet<&str> = HashSet::new();
    let mut first: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for id in ids {
        if !seen.insert(id.as_str()) {
            f.duplicates += 1;
            continue;
        }
        let parsed = id
            .rsplit_once(':')
            .and_then(|(s, q)| Some((s, q.parse::<u64>().ok()?)));
        match parsed {
            Some((s, q)) if q >= 1 && version.get(s).is_some_and(|v| q <= *v) => {
                first.entry(s).or_default().push(q);
            }
            _ => problems.push(format!("message {id:?} names no event of the journal")),
        }
    }
    for (s, v) in version {
        let got = first.get(s.as_str()).map(Vec::as_slice).unwrap_or_default();
        let mut max = 0;
        let mut late = Vec::new();
        for &q in got {
            if q < max {
                late.push(q);
            }
            max = max.max(q);
        }
        if !late.is_empty() {
            f.order_violations += late.len() as u64;
            problems.push(format!(
                "{s}: first copies out of seq order (seqs {late:?} arrived after a later seq); arrival order {got:?}"
            ));
        }
        let missing = *v - got.len() as u64;
        if missing > 0 {
            f.missing += missing;
            let have: HashSet<u64> = got.iter().copied().collect();
            let absent: Vec<u64> = (1..=*v).filter(|q| !have.contains(q)).collect();
            let lost_acked = acked
                .iter()
                .filter(|(a, ..)| a == s)
                .flat_map(|&(_, first, last)| first..=last)
                .filter(|q| !have.contains(q))
                .count() as u64;
            f.missing_acked += lost_acked;
            problems.push(format!(
                "{s}: {missing} events never reached the bus ({lost_acked} of them acknowledged): seqs {absent:?}"
            ));
        }
    }
    (f, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(version: &[(&str, u64)], acked: &[(&str, u64, u64)], ids: &[&str]) -> (BusFigures, Vec<String>) {
        let version = version.iter().map(|(s, v)| ((*s).to_owned(), *v)).collect();
        let ids: Vec<String> = ids.iter().map(|i| (*i).to_owned()).collect();
        tally(&version, acked, &ids)
    }

    #[test]
    fn every_event_once_in_order_interleaved_across_streams_passes() {
        let (f, p) = run(
            &[("a", 2), ("b", 1), ("c", 0)],
            &[("a", 1, 2)],
            &["a:1", "b:1", "a:2"],
        );
        assert!(p.is_empty(), "{p:?}");
        assert_eq!((f.events, f.messages, f.duplicates, f.missing), (3, 3, 0, 0));
    }

    #[test]
    fn duplicates_are_counted_and_allowed_when_first_copies_are_in_order() {
        // A redelivery of 1 and 2 after 3 (a crash before the checkpoint).
        let (f, p) = run(&[("a", 3)], &[], &["a:1", "a:2", "a:1", "a:3", "a:2"]);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!((f.duplicates, f.order_violations), (2, 0));
    }

    #[test]
    fn a_first_copy_after_a_later_seq_is_an_order_violation() {
        let (f, p) = run(&[("a", 3)], &[], &["a:1", "a:3", "a:2", "a:3"]);
        assert_eq!((f.order_violations, f.duplicates, f.missing), (1, 1, 0));
        assert_eq!(p.len(), 1, "{p:?}");
    }

    #[test]
    fn a_missing_event_is_counted_and_named_acknowledged_or_not() {
        let (f, p) = run(&[("a", 4), ("b", 1)], &[("a", 2, 3)], &["a:1", "a:2", "b:1"]);
        assert_eq!((f.missing, f.missing_acked), (2, 1));
        assert!(p[0].contains("seqs [3, 4]"), "{p:?}");
    }

    #[test]
    fn a_message_of_no_journal_event_is_a_problem() {
        let (_, p) = run(&[("a", 1)], &[], &["a:1", "a:2", "z:1", "garbage"]);
        assert_eq!(p.len(), 3, "{p:?}");
    }
}
