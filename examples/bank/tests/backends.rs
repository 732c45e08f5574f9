//! The bank's projections, the same code, on memory, SQLite files and
//! Postgres: a seeded random business (accounts whose ids differ in case,
//! digits and non-ASCII, deposits, withdrawals, audit-only statement views)
//! drained by the worker with different batch sizes, then an overdraft the
//! worker dead-letters and one inline apply that rolls back. Every backend
//! must hold the documents a plain-Rust model predicts, and the same digests.
//!
//! The backends come from `testing::on_every_backend`: Postgres needs
//! `OUTBOX_TEST_DATABASE_URL` (without it, it says so on one line and the
//! test compares memory and SQLite).

mod common;

use outbox_core::typed::DomainEvent as _;
use std::collections::BTreeMap;
use std::time::Duration;

use common::{digests, drain};
use outbox_core::{ExpectedVersion, LeaseAdmin, RetryPolicy, StreamId};
use outbox_example_bank::{Account, BankEvent, DayTotals, accounts, day_totals, register};
use outbox_runtime::open::WithStores;
use outbox_runtime::testing::{self, Backend};
use outbox_runtime::{Config, JournalBackend, Outbox, ProjectionBackend};
use outbox_testkit::Seed;

const ACCOUNTS: [&str; 8] = [
    "acct-1", "Acct-2", "acct-10", "acct-9", "acct-é", "ACCT", "口座-1", "a",
];
const DAYS: [&str; 4] = ["2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04"];
/// The account the worker dead-letters an overdraft of, and the one whose
/// inline apply rolls back.
const OVERDRAWN: &str = "acct-1";
const ROLLED_BACK: &str = "acct-9";

/// What the projections should hold, computed without any store.
#[derive(Clone, Debug, Default)]
struct Model {
    accounts: BTreeMap<String, Account>,
    days: BTreeMap<String, DayTotals>,
    heads: BTreeMap<String, u64>,
}

impl Model {
    /// Records `e` as the next event of `account`, as the projections would
    /// apply it.
    fn apply(&mut self, account: &str, e: &BankEvent) {
        let head = self.heads.entry(account.into()).or_default();
        *head += 1;
        let seq = *head;
        let (cents, day) = match e {
            BankEvent::AccountOpened { owner } => {
                let a = Account {
                    owner: owner.clone(),
                    balance_cents: 0,
                    last_seq: seq,
                };
                self.accounts.insert(account.into(), a);
                return;
            }
            BankEvent::StatementViewed { .. } => return,
            BankEvent::Deposited { cents, day } => (*cents, day),
            BankEvent::Withdrawn { cents, day } => (-*cents, day),
        };
        let a = self.accounts.get_mut(account).expect("opened");
        a.balance_cents += cents;
        a.last_seq = seq;
        let t = self.days.entry(day.clone()).or_default();
        if cents > 0 {
            t.deposited_cents += cents;
            t.deposits += 1;
        } else {
            t.withdrawn_cents -= cents;
            t.withdrawals += 1;
        }
    }

    /// Records `e` as the next event of `account` for the daily totals only:
    /// the balances are off the shared path on that account (ADR 0032).
    fn apply_totals_only(&mut self, account: &str, e: &BankEvent) {
        let saved = self.accounts.get(account).cloned();
        self.apply(account, e);
        if let Some(a) = saved {
            self.accounts.insert(account.into(), a);
        }
    }

    fn balance(&self, account: &str) -> i64 {
        self.accounts.get(account).map_or(0, |a| a.balance_cents)
    }

    fn head(&self, account: &str) -> u64 {
        self.heads.get(account).copied().unwrap_or(0)
    }
}

/// The appends, in order, and the model after them.
struct Plan {
    appends: Vec<(StreamId, ExpectedVersion, Vec<BankEvent>)>,
    model: Model,
}

impl Plan {
    fn random(seed: Seed) -> Plan {
        let mut rng = seed.rng();
        let mut model = Model::default();
        let mut appends = Vec::new();
        // Every account is opened first, then 150 appends of 1 to 4 events.
        let mut order: Vec<usize> = (0..ACCOUNTS.len()).collect();
        order.extend((0..150).map(|_| rng.below(ACCOUNTS.len() as u64) as usize));
        for (n, i) in order.into_iter().enumerate() {
            let account = ACCOUNTS[i];
            let expected = ExpectedVersion::Exact(model.head(account));
            let mut events = Vec::new();
            if n < ACCOUNTS.len() {
                events.push(BankEvent::AccountOpened {
                    owner: format!("owner of {account}"),
                });
                model.apply(account, &events[0]);
            }
            for _ in 0..1 + rng.below(4) {
                let day = DAYS[rng.below(DAYS.len() as u64) as usize].to_string();
                let balance = model.balance(account);
                let e = match rng.below(10) {
                    0 => BankEvent::StatementViewed { by: "auditor".into() },
                    1..=4 if balance > 0 => BankEvent::Withdrawn {
                        cents: 1 + rng.below(balance as u64) as i64,
                        day,
                    },
                    _ => BankEvent::Deposited {
                        cents: 1 + rng.below(50_000) as i64,
                        day,
                    },
                };
                model.apply(account, &e);
                events.push(e);
            }
            appends.push((StreamId::new(account).unwrap(), expected, events));
        }
        Plan { appends, model }
    }
}

fn new_events(events: &[BankEvent]) -> Vec<outbox_core::NewEvent> {
    events.iter().map(|e| e.to_new_event().unwrap()).collect()
}

/// Checks the projections' documents in `store` against `model`.
async fn check<J: JournalBackend, P: ProjectionBackend>(rt: &Outbox<J, P>, model: &Model, backend: &str) {
    let want: Vec<(String, Account)> = model.accounts.clone().into_iter().collect();
    assert_eq!(accounts(rt.store()).await.unwrap(), want, "{backend}: balances");
    for day in DAYS {
        let want = model.days.get(day).cloned().unwrap_or_default();
        assert_eq!(
            day_totals(rt.store(), day).await.unwrap(),
            want,
            "{backend}: totals of {day}"
        );
    }
}

/// Runs the plan on one backend and returns the projections' digests.
async fn run<J, P>(
    backend: &str,
    journal: J,
    store: P,
    plan: &Plan,
    batch_size: usize,
) -> BTreeMap<String, String>
where
    J: JournalBackend + Clone,
    P: ProjectionBackend + Clone,
{
    // The worker mode, dead-lettering at the first failure.
    let retry = RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(1), 1).unwrap();
    let worker = register(Outbox::builder(journal.clone(), store.clone()))
        .config(
            Config::apply_worker()
                .with_batch_size(batch_size)
                .with_retry(retry),
        )
        .build()
        .await
        .unwrap_or_else(|e| panic!("{backend}: build: {e}"));
    for (stream, expected, events) in &plan.appends {
        worker
            .append(stream, *expected, new_events(events))
            .await
            .unwrap_or_else(|e| panic!("{backend}: append to {stream}: {e}"));
    }
    drain(&worker, backend).await;
    let mut model = plan.model.clone();
    check(&worker, &model, backend).await;

    // An overdraft between two deposits: every row is done; the balances
    // are dead on the overdraft (ADR 0032), the daily totals apply all three.
    let day = DAYS[1].to_string();
    let deposit = BankEvent::Deposited {
        cents: 100,
        day: day.clone(),
    };
    let overdraft = BankEvent::Withdrawn {
        cents: model.balance(OVERDRAWN) + 101,
        day: day.clone(),
    };
    let stream = StreamId::new(OVERDRAWN).unwrap();
    let events = [deposit.clone(), overdraft, BankEvent::Deposited { cents: 5, day }];
    worker
        .append(
            &stream,
            ExpectedVersion::Exact(model.head(OVERDRAWN)),
            new_events(&events),
        )
        .await
        .unwrap();
    let tick = worker.tick().await.unwrap();
    assert_eq!(
        (tick.completed, tick.failed, tick.dead_lettered),
        (3, 0, 1),
        "{backend}: {tick:?}"
    );
    let s = worker.journal().summary().await.unwrap();
    assert_eq!(s.total(), 0, "{backend}: {s:?}");
    let dead = &worker
        .projection_states(Some(outbox_core::SinkStatus::Dead), 10)
        .await
        .unwrap()[0];
    assert_eq!(
        (dead.sink.as_str(), dead.stream.as_str(), dead.seq + 1),
        ("projection:balances", OVERDRAWN, model.head(OVERDRAWN) + 2)
    );
    model.apply(OVERDRAWN, &deposit);
    for e in &events[1..] {
        model.apply_totals_only(OVERDRAWN, e);
    }
    assert!(
        dead.last_error
            .as_deref()
            .unwrap_or("")
            .contains("insufficient funds"),
        "{backend}: {dead:?}"
    );

    // Inline apply of a deposit and an overdraft in one append: one
    // transaction, rolled back whole.
    let inline = register(Outbox::builder(journal, store)).build().await.unwrap();
    let stream = StreamId::new(ROLLED_BACK).unwrap();
    let events = [
        BankEvent::Deposited {
            cents: 300,
            day: DAYS[2].into(),
        },
        BankEvent::Withdrawn {
            cents: model.balance(ROLLED_BACK) + 1_000,
            day: DAYS[2].into(),
        },
    ];
    let outcome = inline
        .append(
            &stream,
            ExpectedVersion::Exact(model.head(ROLLED_BACK)),
            new_events(&events),
        )
        .await
        .unwrap();
    assert_eq!(outcome.inline_failures.len(), 1, "{backend}: {outcome:?}");
    check(&inline, &model, backend).await;

    digests(&worker).await
}

/// [`run`] on the stores `on_every_backend` opens, at `batch_size`.
struct OnBackend<'a> {
    plan: &'a Plan,
    batch_size: usize,
}

impl WithStores for OnBackend<'_> {
    type Output = BTreeMap<String, String>;

    async fn with<J, P>(self, journal: J, store: P) -> Self::Output
    where
        J: JournalBackend + LeaseAdmin + Clone,
        P: ProjectionBackend + Clone,
    {
        let backend = format!("batch size {}", self.batch_size);
        run(&backend, journal, store, self.plan, self.batch_size).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backend_holds_what_memory_holds() {
    let seed = Seed::pick("every_backend_holds_what_memory_holds");
    let plan = Plan::random(seed);
    // Memory, SQLite and Postgres are opened in that order; each drains in
    // batches of its own size.
    let mut sizes = [1, 3, 64].into_iter();
    let runs = testing::on_every_backend(|| OnBackend {
        plan: &plan,
        batch_size: sizes.next().unwrap_or(64),
    })
    .await
    .unwrap();
    let (first, want) = &runs[0];
    assert_eq!(*first, Backend::Memory);
    assert!(
        runs.iter().any(|(b, _)| *b == Backend::Sqlite),
        "the bank builds SQLite"
    );
    for (backend, got) in &runs[1..] {
        assert_eq!(got, want, "seed {}: {backend:?} vs memory digests", seed.0);
    }
}
