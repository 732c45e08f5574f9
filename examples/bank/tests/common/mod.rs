//! What the bank's tests share: the sample day's expected documents, a
//! drain loop, digests, and the Postgres test database.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;

use outbox_core::ViewStore;
use outbox_example_bank::{Account, DayTotals, account, accounts, day_totals, register};
use outbox_memory::{MemoryJournal, MemoryProjectionStore};
use outbox_runtime::{Config, JournalBackend, Outbox, ProjectionBackend};

/// Events in [`outbox_example_bank::sample`], and how many are audit-only.
pub const SAMPLE_EVENTS: u64 = 12;
pub const SAMPLE_AUDIT_ONLY: u64 = 2;

fn acct(owner: &str, balance_cents: i64, last_seq: u64) -> Account {
    Account {
        owner: owner.into(),
        balance_cents,
        last_seq,
    }
}

fn totals(deposited_cents: i64, deposits: u64, withdrawn_cents: i64, withdrawals: u64) -> DayTotals {
    DayTotals {
        deposited_cents,
        withdrawn_cents,
        deposits,
        withdrawals,
    }
}

/// `balances` after the sample day, in key order.
pub fn sample_accounts() -> Vec<(String, Account)> {
    vec![
        ("account-alice".into(), acct("Alice", 8_700, 5)),
        ("account-bob".into(), acct("Bob", 500, 4)),
        ("account-carol".into(), acct("Carol", 20_000, 2)),
    ]
}

/// `daily_totals` summed per day after the sample day.
pub fn sample_days() -> Vec<(&'static str, DayTotals)> {
    vec![
        ("2026-03-01", DayTotals::default()),
        ("2026-03-02", totals(15_000, 2, 2_500, 1)),
        ("2026-03-03", totals(21_200, 2, 4_500, 2)),
        ("2026-03-04", DayTotals::default()),
    ]
}

/// Checks that `store` holds exactly the sample day's documents.
pub async fn check_sample<S: ViewStore + ?Sized>(store: &S, backend: &str) {
    assert_eq!(
        accounts(store).await.unwrap(),
        sample_accounts(),
        "{backend}: balances"
    );
    for (day, want) in sample_days() {
        assert_eq!(
            day_totals(store, day).await.unwrap(),
            want,
            "{backend}: daily totals of {day}"
        );
    }
    assert_eq!(account(store, "account-dave").await.unwrap(), None);
}

/// Appends the sample day, one append per request, as the bank's request
/// path would.
pub async fn append_sample<J: JournalBackend, P: ProjectionBackend>(rt: &Outbox<J, P>) {
    for request in outbox_example_bank::sample().unwrap() {
        let outcome = rt.append_batch(vec![request]).await.expect("append");
        assert!(
            outcome.inline_failures.is_empty(),
            "the sample applies cleanly: {:?}",
            outcome.inline_failures
        );
    }
}

/// Worker passes until the outbox is empty and every projection is back on
/// the shared path (`testing::drain`: a failure names the rows and
/// projections left, with their errors), none of them failing on the way.
/// Returns the rows completed plus the events projections caught up on.
pub async fn drain<J: JournalBackend, P: ProjectionBackend>(rt: &Outbox<J, P>, backend: &str) -> u64 {
    let report = outbox_runtime::testing::drain(rt)
        .await
        .unwrap_or_else(|e| panic!("{backend}: {e}"));
    assert_eq!(
        (report.failed, report.dead_lettered, report.storage_errors),
        (0, 0, 0),
        "{backend}: {report:?}"
    );
    report.completed + report.caught_up
}

/// Each registered projection's digest, as hex (what `report --json` prints).
pub async fn digests<J: JournalBackend, P: ProjectionBackend>(rt: &Outbox<J, P>) -> BTreeMap<String, String> {
    outbox_runtime::testing::digests(rt).await.expect("digest")
}

/// The digests of the sample day applied by the worker on the memory adapter:
/// the reference every other backend and the binary must reproduce.
pub async fn memory_sample_digests() -> BTreeMap<String, String> {
    let rt = register(Outbox::builder(
        MemoryJournal::new(),
        MemoryProjectionStore::new(),
    ))
    .config(Config::apply_worker())
    .build()
    .await
    .unwrap();
    append_sample(&rt).await;
    drain(&rt, "memory").await;
    check_sample(rt.store(), "memory").await;
    digests(&rt).await
}

/// The Postgres server for the tests, or `None` after printing one line
/// saying the test is skipped.
pub fn postgres_url(_test: &str) -> Option<String> {
    // One line per test binary when skipped; a failure (never a skip) in CI.
    outbox_testkit::pg::test_database_url()
}
