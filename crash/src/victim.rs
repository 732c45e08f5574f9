//! `outbox-crash victim`: one process that appends oracle events, runs the
//! apply worker, or both, until it is killed (or finishes its appends), and
//! the final clean drain (`--role drain`). In a poison round (`--poison`)
//! it also runs the `poison` view, which aborts the process when it applies
//! one of the round's poison events.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use outbox_core::{
    AppendRequest, BoxError, Event, ExpectedVersion, ProjectionName, StreamId, ViewProjection, ViewTx,
    WakeSource, async_trait,
};
use outbox_runtime::{Config, JournalBackend, Outbox, ProjectionBackend};
use outbox_testkit::{OracleProjection, add, oracle_registry};

use crate::args::Args;
use crate::round::{FLAKY, Place, Rng, stream_names};

/// What a victim does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Appends only (producer-only mode).
    Producer,
    /// Appends with inline apply (outbox on, no worker).
    Inline,
    /// Runs the apply worker.
    Worker,
    /// Appends and runs the apply worker.
    Both,
    /// The clean final worker: drains the outbox to empty and exits.
    Drain,
}

impl Role {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Producer => "producer",
            Role::Inline => "inline",
            Role::Worker => "worker",
            Role::Both => "both",
            Role::Drain => "drain",
        }
    }

    fn parse(s: &str) -> Result<Role> {
        Ok(match s {
            "producer" => Role::Producer,
            "inline" => Role::Inline,
            "worker" => Role::Worker,
            "both" => Role::Both,
            "drain" => Role::Drain,
            other => bail!("unknown role {other:?}"),
        })
    }

    pub(crate) fn appends(self) -> bool {
        matches!(self, Role::Producer | Role::Inline | Role::Both)
    }

    pub(crate) fn works(self) -> bool {
        matches!(self, Role::Worker | Role::Both | Role::Drain)
    }

    /// The mode flags, as the variables the driver sets: (`OUTBOX_WORKER_ENABLED`, `OUTBOX_INLINE_APPLY`).
    pub(crate) fn flags(self) -> (bool, bool) {
        match self {
            Role::Producer => (false, false),
            Role::Inline => (false, true),
            Role::Worker | Role::Both | Role::Drain => (true, true),
        }
    }
}

struct Plan {
    role: Role,
    seed: u64,
    streams: u64,
    appends: u64,
    ack_log: Option<std::path::PathBuf>,
    /// A poison round's view: `None` outside one.
    poison: Option<PoisonView>,
    /// A sink round's NATS server (`--nats URL`): the victims that work
    /// publish to it beside the oracle, and the drain waits for the sink.
    nats: Option<String>,
}

/// The name of the poison rounds' extra view.
pub(crate) const POISON_VIEW: &str = "poison";

/// The poison rounds' extra view, beside the oracle: it writes nothing and
/// calls `std::process::abort()` when it applies one of its poison events
/// (stream, seq), as an apply that kills its process. The projection store
/// applies every view of a run in one transaction, so the oracle never
/// commits a poison event either. With no poison events it is "the fix
/// deployed": the same view, harmless.
pub(crate) struct PoisonView {
    name: ProjectionName,
    poisons: Vec<(String, u64)>,
}

impl PoisonView {
    /// `--poison c03:2,c07:4`, or `--poison none` (the fixed code).
    pub(crate) fn parse(list: &str) -> Result<PoisonView> {
        let mut poisons = Vec::new();
        if list != "none" {
            for item in list.split(',') {
                let (stream, seq) = item
                    .split_once(':')
                    .with_context(|| format!("poison {item:?} is not stream:seq"))?;
                poisons.push((stream.to_owned(), crate::args::parse_u64(seq)?));
            }
        }
        Ok(PoisonView {
            name: ProjectionName::new(POISON_VIEW)?,
            poisons,
        })
    }
}

#[async_trait]
impl ViewProjection for PoisonView {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn apply(&self, _view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError> {
        let hit = self
            .poisons
            .iter()
            .any(|(s, q)| event.stream.as_str() == s && event.seq.get() == *q);
        if hit {
            // The driver attributes the crash to this poison by this line
            // (stderr is unbuffered: the line is in the log before the abort).
            eprintln!("poison {}/{}: abort", event.stream, event.seq);
            std::process::abort();
        }
        Ok(())
    }
}

/// Every round's second projection (ADR 0032): an oracle of its own that,
/// in every victim but the drain, fails one apply in five, panics in one in
/// twenty and aborts the process in one in a thousand, at random. The
/// oracle beside it must not be harmed, and it must itself end having
/// applied every event exactly once, in order.
struct Flaky {
    oracle: OracleProjection,
    faulty: bool,
    rng: std::sync::Mutex<Rng>,
}

impl Flaky {
    fn new(faulty: bool) -> Flaky {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id());
        Flaky {
            oracle: OracleProjection::new(FLAKY),
            faulty,
            rng: std::sync::Mutex::new(Rng(seed)),
        }
    }
}

#[async_trait]
impl ViewProjection for Flaky {
    fn name(&self) -> &ProjectionName {
        self.oracle.name()
    }

    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError> {
        if self.faulty {
            let roll = self.rng.lock().map_or(0, |mut r| r.below(1000));
            if roll == 0 {
                eprintln!("flaky {}/{}: abort", event.stream, event.seq);
                std::process::abort();
            }
            if roll < 50 {
                panic!("flaky panics on {}/{}", event.stream, event.seq);
            }
            if roll < 250 {
                return Err(format!("flaky fails on {}/{}", event.stream, event.seq).into());
            }
        }
        self.oracle.apply(view, event).await
    }
}

pub(crate) fn main(args: &Args) -> Result<u8> {
    let place = Place::from_args(args)?;
    let plan = Plan {
        role: Role::parse(args.req("--role")?)?,
        seed: args.num("--seed", 0)?,
        streams: args.num("--streams", 6)?.max(1),
        appends: args.num("--appends", 0)?,
        ack_log: args.get("--ack-log").map(Into::into),
        poison: args.get("--poison").map(PoisonView::parse).transpose()?,
        nats: args.get("--nats").map(str::to_owned),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move { with_stores!(&place, |j, p, wake| run(j, p, wake, plan).await) })
}

async fn run<J: JournalBackend, P: ProjectionBackend>(
    journal: J,
    store: P,
    wake: Arc<dyn WakeSource>,
    mut plan: Plan,
) -> Result<u8> {
    let config = Config::from_env().context("configuration")?;
    let mut builder = Outbox::builder(journal, store)
        .config(config)
        .event_types(oracle_registry())
        .view(OracleProjection::new("oracle"));
    match plan.poison.take() {
        Some(poison) => builder = builder.view(poison),
        // Outside poison rounds (whose process deaths are the point), a
        // projection that fails, panics and aborts beside the oracle.
        None => builder = builder.view(Flaky::new(plan.role != Role::Drain)),
    }
    if plan.role.works() {
        builder = builder.wake_source(wake);
        // Only a worker runs sink loops (ADR 0023): registering the sink in
        // a producer would do nothing.
        if let Some(url) = &plan.nats {
            builder = builder.sink(crate::sinks::victim_sink(url)?);
        }
    }
    let outbox = builder.build().await.context("build the runtime")?;
    if plan.role == Role::Drain {
        // What the faults left: the driver reports it.
        let s = outbox.journal().summary().await?;
        println!("left {} {}", s.total(), s.processing);
    }
    let running = if plan.role.works() {
        // A temporary error at start (a store call past its deadline while a
        // stopped peer held the database) is retried, as a supervisor would.
        let mut tries = 0;
        loop {
            match outbox.start().await {
                Ok(r) => break Some(r),
                Err(e) if e.is_temporary() && tries < 50 => {
                    tries += 1;
                    eprintln!("start: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e).context("start"),
            }
        }
    } else {
        None
    };
    if plan.role == Role::Drain {
        loop {
            match outbox.journal().summary().await {
                Ok(s) if s.dead > 0 => {
                    eprintln!("drain: dead rows: {s:?}");
                    return Ok(3);
                }
                Ok(s) if s.total() == 0 => break,
                Ok(_) => {}
                Err(e) => eprintln!("drain: summary: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Then every projection back on the shared path: the flaky one's
        // exceptions caught up, a dead one requeued as an operator would.
        let mut requeued = 0;
        loop {
            match outbox.projection_states(None, 1000).await {
                Ok(states) if states.is_empty() => break,
                Ok(states) => {
                    for s in states
                        .iter()
                        .filter(|s| s.status == outbox_core::SinkStatus::Dead)
                    {
                        if let Some(p) = outbox_core::consumer_projection(&s.sink) {
                            let name = ProjectionName::new(p)?;
                            if outbox.requeue_projection(&name, &s.stream).await.is_ok() {
                                requeued += 1;
                            }
                        }
                    }
                }
                Err(e) => eprintln!("drain: projection states: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!("projections requeued {requeued}");
        if plan.nats.is_some() {
            drain_sink(&outbox, plan.streams).await;
        }
        if let Some(r) = running {
            r.shutdown().await;
        }
        return Ok(0);
    }
    if plan.role.appends() {
        produce(&outbox, &plan).await?;
        if let Some(log) = &plan.ack_log {
            std::fs::write(log.with_extension("done"), b"")?;
        }
    }
    if running.is_some() {
        // Work until killed.
        std::future::pending::<()>().await;
    }
    Ok(0)
}

/// A sink round's drain, once the outbox is empty: waits until the sink's
/// checkpoint of every stream is at the stream's version. A (sink, stream)
/// that the round's faults dead-lettered (the bus down for longer than the
/// retries last) is requeued, as an operator would with `outbox sinks
/// requeue`; the driver reports how many (`sink requeued N`). The driver
/// bounds the whole drain.
async fn drain_sink<J: JournalBackend, P: ProjectionBackend>(outbox: &Outbox<J, P>, streams: u64) {
    let mut requeued = 0;
    loop {
        match crate::sinks::caught_up(outbox.journal(), streams).await {
            Ok((true, _)) => break,
            Ok((false, dead)) => {
                for s in dead {
                    match crate::sinks::requeue(outbox.journal(), &s).await {
                        Ok(()) => requeued += 1,
                        Err(e) => eprintln!("drain: requeue {s}: {e:#}"),
                    }
                }
            }
            Err(e) => eprintln!("drain: sink states: {e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("sink requeued {requeued}");
}

/// One append of a producer's schedule: (stream index, values) per stream,
/// then a pause before the next.
pub(crate) struct Append {
    pub(crate) picks: Vec<(usize, Vec<i64>)>,
    pause_ms: u64,
}

/// A producer's appends, all drawn from its seed: `appends` batches to
/// random streams (one to three streams a batch, one to four events each,
/// values -50..=50). The driver of a poison round reads it too, to place
/// the poison events on seqs the producer will append.
pub(crate) fn schedule(seed: u64, streams: u64, appends: u64) -> Vec<Append> {
    let mut rng = Rng(seed);
    (0..appends)
        .map(|_| {
            let k = 1 + rng.below(streams.min(3));
            let mut picked: Vec<usize> = Vec::new();
            while (picked.len() as u64) < k {
                let i = rng.below(streams) as usize;
                if !picked.contains(&i) {
                    picked.push(i);
                }
            }
            let picks = picked
                .into_iter()
                .map(|i| {
                    let v: Vec<i64> = (0..1 + rng.below(4))
                        .map(|_| rng.below(101) as i64 - 50)
                        .collect();
                    (i, v)
                })
                .collect();
            Append {
                picks,
                pause_ms: rng.below(20),
            }
        })
        .collect()
}

/// Appends the producer's [`schedule`] with `ExpectedVersion::Any` and logs
/// each acknowledged append to the ack log, fsynced, before the next.
async fn produce<J: JournalBackend, P: ProjectionBackend>(outbox: &Outbox<J, P>, plan: &Plan) -> Result<()> {
    let path = plan.ack_log.as_ref().context("--ack-log is required to append")?;
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("open {}", path.display()))?;
    let names = stream_names(plan.streams);
    for append in schedule(plan.seed, plan.streams, plan.appends) {
        let mut batch = Vec::new();
        for (i, v) in &append.picks {
            let stream = StreamId::new(names[*i].as_str())?;
            batch.push(AppendRequest::new(
                stream,
                ExpectedVersion::Any,
                v.iter().map(|x| add(*x)).collect(),
            ));
        }
        match outbox.append_batch(batch).await {
            Ok(out) => {
                let mut text = String::new();
                for (a, (_, v)) in out.appended.iter().zip(&append.picks) {
                    let v: Vec<String> = v.iter().map(i64::to_string).collect();
                    text.push_str(&format!(
                        "{} {} {} {}\n",
                        a.stream,
                        a.first_seq.get(),
                        a.last_seq.get(),
                        v.join(",")
                    ));
                }
                log.write_all(text.as_bytes())?;
                log.sync_data()?;
            }
            // Not acknowledged: the events may or may not be in the journal.
            Err(e) => eprintln!("append not acknowledged: {e}"),
        }
        if append.pause_ms > 0 {
            tokio::time::sleep(Duration::from_millis(append.pause_ms)).await;
        }
    }
    Ok(())
}
