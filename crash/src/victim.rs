//! `outbox-crash victim`: one process that appends oracle events, runs the
//! apply worker, or both, until it is killed (or finishes its appends), and
//! the final clean drain (`--role drain`).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use outbox_core::{AppendRequest, ExpectedVersion, StreamId, WakeSource};
use outbox_runtime::{Config, JournalBackend, Outbox, ProjectionBackend};
use outbox_testkit::{OracleProjection, add, oracle_registry};

use crate::{Args, Place, Rng, stream_names};

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
}

pub(crate) fn main(args: &Args) -> Result<u8> {
    let place = Place::from_args(args)?;
    let plan = Plan {
        role: Role::parse(args.req("--role")?)?,
        seed: args.num("--seed", 0)?,
        streams: args.num("--streams", 6)?.max(1),
        appends: args.num("--appends", 0)?,
        ack_log: args.get("--ack-log").map(Into::into),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move { with_stores!(&place, |j, p, wake| run(j, p, wake, &plan).await) })
}

async fn run<J: JournalBackend, P: ProjectionBackend>(
    journal: J,
    store: P,
    wake: Arc<dyn WakeSource>,
    plan: &Plan,
) -> Result<u8> {
    let config = Config::from_env().context("configuration")?;
    let mut builder = Outbox::builder(journal, store)
        .config(config)
        .event_types(oracle_registry())
        .view(OracleProjection::new("oracle"));
    if plan.role.works() {
        builder = builder.wake_source(wake);
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
        if let Some(r) = running {
            r.shutdown().await;
        }
        return Ok(0);
    }
    if plan.role.appends() {
        produce(&outbox, plan).await?;
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

/// Appends `plan.appends` batches of oracle events to random streams (one
/// to three streams a batch, one to four events each, `ExpectedVersion::Any`)
/// and logs each acknowledged append to the ack log, fsynced, before the next.
async fn produce<J: JournalBackend, P: ProjectionBackend>(outbox: &Outbox<J, P>, plan: &Plan) -> Result<()> {
    let path = plan.ack_log.as_ref().context("--ack-log is required to append")?;
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("open {}", path.display()))?;
    let names = stream_names(plan.streams);
    let mut rng = Rng(plan.seed);
    for _ in 0..plan.appends {
        let k = 1 + rng.below(plan.streams.min(3));
        let mut picked: Vec<usize> = Vec::new();
        while (picked.len() as u64) < k {
            let i = rng.below(plan.streams) as usize;
            if !picked.contains(&i) {
                picked.push(i);
            }
        }
        let mut values: Vec<Vec<i64>> = Vec::new();
        let mut batch = Vec::new();
        for &i in &picked {
            let v: Vec<i64> = (0..1 + rng.below(4))
                .map(|_| rng.below(101) as i64 - 50)
                .collect();
            let stream = StreamId::new(names[i].as_str())?;
            batch.push(AppendRequest::new(
                stream,
                ExpectedVersion::Any,
                v.iter().map(|x| add(*x)).collect(),
            ));
            values.push(v);
        }
        match outbox.append_batch(batch).await {
            Ok(out) => {
                let mut text = String::new();
                for (a, v) in out.appended.iter().zip(&values) {
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
        let pause = rng.below(20);
        if pause > 0 {
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }
    Ok(())
}
