//! One projection type, written once with no per-backend code, run by the
//! runtime on memory, SQLite and Postgres over the same seeded random
//! journal: every backend ends with identical per-projection digests, the
//! documents the model predicts, and an oracle history that checks out.
//!
//! The Postgres part needs `OUTBOX_TEST_DATABASE_URL` (`cargo xtask test`
//! provides one), like the runtime's other Postgres tests; without it (outside
//! CI) memory and SQLite are still compared and one line says Postgres was
//! skipped.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_core::{
    BoxError, Digest, Event, ExpectedVersion, NewEvent, ProjectionName, StreamId, ViewProjection, ViewTx,
    async_trait,
};
use outbox_memory::{MemoryJournal, MemoryProjectionStore};
use outbox_postgres::testing::{DropSchemas, unique_schema};
use outbox_postgres::{PgJournal, PgOptions, PgProjectionStore};
use outbox_runtime::{Config, JournalBackend, Outbox, ProjectionBackend};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};
use outbox_testkit::{
    Expected, OracleProjection, Seed, add, audit, check_history, oracle_registry, read_state, sid, value_of,
};
use serde::{Deserialize, Serialize};

const LEDGER: &str = "ledger";
const ORACLE: &str = "oracle";
/// How many recent entries the ledger keeps per stream.
const RECENT: usize = 3;

/// An account per stream: its balance since it was last opened.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Account {
    balance: i64,
    deposits: u64,
    withdrawals: u64,
    opened_at: u64,
}

/// A stream's whole history: every (seq, amount), and how many times a close
/// found an open account.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct History {
    entries: Vec<(u64, i64)>,
    closes: u64,
}

/// Account balances, a per-stream history and the last [`RECENT`] amounts
/// of each stream (one document each, keyed `<stream>/<seq>`). An amount of 0
/// closes the account: its document and its recent entries are deleted, and
/// the next amount opens it again. Written once against [`ViewTx`]; nothing
/// in it knows the backend.
struct Ledger(ProjectionName);

impl Ledger {
    fn new() -> Self {
        Ledger(ProjectionName::new(LEDGER).unwrap())
    }
}

fn recent_key(stream: &str, seq: u64) -> String {
    format!("{stream}/{seq:020}")
}

/// The recent entries of `stream`, oldest first.
async fn recent_of(view: &mut ViewTx<'_>, stream: &str) -> outbox_core::Result<Vec<String>> {
    let prefix = format!("{stream}/");
    let page: Vec<(String, i64)> = view.scan("recent", Some(&prefix), 4 * RECENT).await?;
    Ok(page
        .into_iter()
        .map(|(k, _)| k)
        .take_while(|k| k.starts_with(&prefix))
        .collect())
}

#[async_trait]
impl ViewProjection for Ledger {
    fn name(&self) -> &ProjectionName {
        &self.0
    }

    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError> {
        let amount = value_of(event)?;
        let (stream, seq) = (event.stream.as_str(), event.seq.get());
        if amount == 0 {
            let was_open = view.delete("accounts", stream).await?;
            for key in recent_of(view, stream).await? {
                view.delete("recent", &key).await?;
            }
            view.update("history", stream, |h: &mut History| {
                h.entries.push((seq, 0));
                h.closes += u64::from(was_open);
            })
            .await?;
            return Ok(());
        }
        view.update("accounts", stream, |a: &mut Account| {
            if a.opened_at == 0 {
                a.opened_at = seq;
            }
            a.balance += amount;
            if amount > 0 {
                a.deposits += 1;
            } else {
                a.withdrawals += 1;
            }
        })
        .await?;
        view.update("history", stream, |h: &mut History| h.entries.push((seq, amount)))
            .await?;
        view.put("recent", &recent_key(stream, seq), &amount).await?;
        let recent = recent_of(view, stream).await?;
        for key in &recent[..recent.len().saturating_sub(RECENT)] {
            view.delete("recent", key).await?;
        }
        Ok(())
    }
}

/// What the ledger should hold for one stream, computed without any store.
#[derive(Debug, Default, PartialEq, Eq)]
struct Model {
    account: Option<Account>,
    history: Option<History>,
    recent: Vec<(String, i64)>,
}

/// The journal: appends of 1 to 4 events to streams whose names differ in
/// case, digits and non-ASCII (so key and stream order must be bytewise on
/// every backend), with closes (amount 0) and audit-only events.
struct Plan {
    appends: Vec<(StreamId, Vec<Option<i64>>)>,
}

impl Plan {
    fn random(seed: Seed) -> Plan {
        let streams: Vec<StreamId> = [
            "acct-1", "Acct-2", "acct-10", "acct-9", "acct-é", "ACCT", "口座-1", "a",
        ]
        .iter()
        .map(|s| sid(s))
        .collect();
        let mut rng = seed.rng();
        let appends = (0..150)
            .map(|_| {
                let s = streams[rng.below(streams.len() as u64) as usize].clone();
                let events = (0..1 + rng.below(4))
                    .map(|_| match rng.below(10) {
                        0 => None,
                        1 => Some(0),
                        _ => Some(rng.below(201) as i64 - 100),
                    })
                    .collect();
                (s, events)
            })
            .collect();
        Plan { appends }
    }

    fn events(values: &[Option<i64>]) -> Vec<NewEvent> {
        values.iter().map(|v| v.map_or_else(audit, add)).collect()
    }

    /// Per stream: its events as (seq, amount or `None` for audit-only).
    fn streams(&self) -> BTreeMap<String, Vec<(u64, Option<i64>)>> {
        let mut out: BTreeMap<String, Vec<(u64, Option<i64>)>> = BTreeMap::new();
        for (s, values) in &self.appends {
            let evs = out.entry(s.to_string()).or_default();
            for v in values {
                let seq = evs.len() as u64 + 1;
                evs.push((seq, *v));
            }
        }
        out
    }

    /// The ledger's documents, by the rules of [`Ledger`], in plain Rust.
    fn model(&self) -> BTreeMap<String, Model> {
        let mut out = BTreeMap::new();
        for (stream, evs) in self.streams() {
            let mut m = Model::default();
            for (seq, amount) in evs {
                let Some(amount) = amount else { continue };
                let h = m.history.get_or_insert_with(History::default);
                h.entries.push((seq, amount));
                if amount == 0 {
                    h.closes += u64::from(m.account.take().is_some());
                    m.recent.clear();
                    continue;
                }
                let a = m.account.get_or_insert_with(|| Account {
                    opened_at: seq,
                    ..Account::default()
                });
                a.balance += amount;
                if amount > 0 {
                    a.deposits += 1;
                } else {
                    a.withdrawals += 1;
                }
                m.recent.push((recent_key(&stream, seq), amount));
                if m.recent.len() > RECENT {
                    m.recent.remove(0);
                }
            }
            out.insert(stream, m);
        }
        out
    }

    /// The oracle's expectation and the audit-only seqs it never applies.
    fn oracle(&self) -> (BTreeMap<String, Expected>, BTreeMap<String, Vec<u64>>) {
        let mut expected = BTreeMap::new();
        let mut skipped = BTreeMap::new();
        for (stream, evs) in self.streams() {
            let sum = evs.iter().filter_map(|(_, v)| *v).sum();
            let audits = evs.iter().filter(|(_, v)| v.is_none()).map(|(s, _)| *s).collect();
            expected.insert(
                stream.clone(),
                Expected {
                    through: evs.len() as u64,
                    sum,
                },
            );
            skipped.insert(stream, audits);
        }
        (expected, skipped)
    }
}

/// Builds the runtime (worker mode, so appends only enqueue), appends the
/// plan, drains the outbox with `tick()` and returns each projection's
/// digest, after checking the ledger's documents against the model and the
/// oracle's history.
async fn run<J: JournalBackend, P: ProjectionBackend>(
    backend: &str,
    journal: J,
    store: P,
    plan: &Plan,
    batch_size: usize,
) -> BTreeMap<String, Digest> {
    let rt = Outbox::builder(journal, store)
        .config(Config::apply_worker().with_batch_size(batch_size))
        .event_types(oracle_registry())
        .view(Ledger::new())
        .view(OracleProjection::new(ORACLE))
        .build()
        .await
        .unwrap_or_else(|e| panic!("{backend}: runtime builds: {e}"));
    for (s, values) in &plan.appends {
        rt.append(s, ExpectedVersion::Any, Plan::events(values))
            .await
            .unwrap_or_else(|e| panic!("{backend}: append to {s}: {e}"));
    }
    let mut ticks = 0;
    while rt.journal().summary().await.unwrap().total() > 0 {
        ticks += 1;
        assert!(
            ticks <= 10_000,
            "{backend}: outbox not drained after 10,000 ticks"
        );
        let report = rt.tick().await.unwrap_or_else(|e| panic!("{backend}: tick: {e}"));
        assert_eq!(
            (report.failed, report.dead_lettered),
            (0, 0),
            "{backend}: no apply fails: {report:?}"
        );
    }

    let views = rt.views(LEDGER).unwrap();
    for (stream, want) in plan.model() {
        let account: Option<Account> = views.get("accounts", &stream).await.unwrap();
        let history: Option<History> = views.get("history", &stream).await.unwrap();
        let recent: Vec<(String, i64)> = views
            .scan("recent", Some(&format!("{stream}/")), 100)
            .await
            .unwrap()
            .into_iter()
            .take_while(|(k, _)| k.starts_with(&format!("{stream}/")))
            .collect();
        let got = Model {
            account,
            history,
            recent,
        };
        assert_eq!(got, want, "{backend}: the ledger's documents of {stream}");
    }
    let (expected, skipped) = plan.oracle();
    let state = read_state(rt.store(), ORACLE).await.unwrap();
    if let Err(problems) = check_history(&state, &expected, &skipped) {
        panic!("{backend}: oracle history:\n{problems}");
    }

    let mut digests = BTreeMap::new();
    for p in rt.projections() {
        let d = rt.store().digest(p.as_ref()).await.unwrap();
        digests.insert(p.name().to_string(), d);
    }
    assert_eq!(digests.len(), 2, "{backend}: both projections digested");
    digests
}

/// A journal schema and a projection schema no other test uses, dropped at
/// the end (unless `OUTBOX_TEST_KEEP_SCHEMAS` is set).
struct Schemas {
    url: String,
    journal: String,
    projections: String,
    _drop: DropSchemas,
}

impl Schemas {
    fn new(url: String) -> Schemas {
        let base = unique_schema("rt_backends");
        Schemas {
            journal: format!("{base}_j"),
            projections: format!("{base}_p"),
            _drop: DropSchemas::new(&url, [format!("{base}_j"), format!("{base}_p")]),
            url,
        }
    }

    fn options(schema: &str) -> PgOptions {
        PgOptions::default()
            .with_schema(schema)
            .with_max_connections(4)
            .with_acquire_timeout(Duration::from_secs(20))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_view_projection_gives_identical_digests_on_memory_sqlite_and_postgres() {
    let seed = Seed::pick("one_view_projection_gives_identical_digests_on_memory_sqlite_and_postgres");
    let plan = Plan::random(seed);

    let memory = run(
        "memory",
        MemoryJournal::new(),
        MemoryProjectionStore::new(),
        &plan,
        1,
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    let sqlite = run(
        "sqlite",
        SqliteJournal::open(dir.path().join("journal.db"), SqliteOptions::default())
            .await
            .unwrap(),
        SqliteProjectionStore::open(dir.path().join("projections.db"), SqliteOptions::default())
            .await
            .unwrap(),
        &plan,
        3,
    )
    .await;
    assert_eq!(memory, sqlite, "seed {}: memory vs SQLite digests", seed.0);

    let Some(url) = outbox_testkit::pg::test_database_url() else {
        return;
    };
    let schemas = Schemas::new(url);
    let journal = PgJournal::connect(&schemas.url, Schemas::options(&schemas.journal))
        .await
        .expect("connect journal");
    let store = PgProjectionStore::connect(&schemas.url, Schemas::options(&schemas.projections))
        .await
        .expect("connect projections");
    let postgres = run("postgres", journal.clone(), store.clone(), &plan, 64).await;
    journal.close().await;
    store.close().await;

    assert_eq!(memory, postgres, "seed {}: memory vs Postgres digests", seed.0);
}
