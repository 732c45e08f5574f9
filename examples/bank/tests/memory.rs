//! The bank's projections on the memory adapter, through the runtime: inline
//! apply and the worker reach the same documents; an overdraft rolls its
//! whole apply transaction back, is retried, dead-lettered, and applied
//! after the fix and a requeue; replay and rebuild keep the digests.

mod common;

use outbox_core::typed::DomainEvent as _;
use std::time::Duration;

use common::{
    SAMPLE_AUDIT_ONLY, SAMPLE_EVENTS, append_sample, check_sample, digests, drain, memory_sample_digests,
    sample_accounts,
};
use outbox_core::{
    AppendOptions, AppendRequest, EventJournal, ExpectedVersion, NewEvent, OutboxInspector, ProjectionName,
    ProjectionStore, RunKind, RunState, Seq, SinkStatus, StreamId,
};
use outbox_example_bank::{
    Account, BALANCES, BankEvent, DAILY_TOTALS, DailyTotals, DayTotals, account, day_totals, event_types,
    register,
};
use outbox_memory::{MemoryJournal, MemoryProjectionStore};
use outbox_runtime::{Config, Outbox, testing};
use tokio_util::sync::CancellationToken;

type Rt = Outbox<MemoryJournal, MemoryProjectionStore>;

async fn runtime(config: Config) -> Rt {
    register(Outbox::builder(
        MemoryJournal::new(),
        MemoryProjectionStore::new(),
    ))
    .config(config)
    .build()
    .await
    .expect("build")
}

fn sid(s: &str) -> StreamId {
    StreamId::new(s).unwrap()
}

fn ev(e: BankEvent) -> NewEvent {
    e.to_new_event().unwrap()
}

fn opened(owner: &str) -> NewEvent {
    ev(BankEvent::AccountOpened { owner: owner.into() })
}

fn deposited(cents: i64, day: &str) -> NewEvent {
    ev(BankEvent::Deposited {
        cents,
        day: day.into(),
    })
}

fn withdrawn(cents: i64, day: &str) -> NewEvent {
    ev(BankEvent::Withdrawn {
        cents,
        day: day.into(),
    })
}

async fn checkpoint(rt: &Rt, projection: &str, stream: &str) -> u64 {
    rt.store()
        .checkpoint(&ProjectionName::new(projection).unwrap(), &sid(stream))
        .await
        .unwrap()
}

#[tokio::test]
async fn the_sample_day_applied_inline() {
    let rt = runtime(Config::default()).await;
    append_sample(&rt).await;
    check_sample(rt.store(), "memory inline").await;
    let m = rt.metrics();
    assert_eq!(
        (m.applied, m.audit_only, m.inline_failed),
        (SAMPLE_EVENTS - SAMPLE_AUDIT_ONLY, SAMPLE_AUDIT_ONLY, 0)
    );
    // No outbox without OUTBOX_ENABLED: nothing queued.
    assert_eq!(rt.journal().summary().await.unwrap().total(), 0);
    // Every projection is checkpointed through the audit-only tail too.
    for p in [BALANCES, DAILY_TOTALS] {
        assert_eq!(checkpoint(&rt, p, "account-carol").await, 3, "{p}");
    }
    assert_eq!(digests(&rt).await, memory_sample_digests().await);
}

#[tokio::test]
async fn the_worker_reaches_the_documents_inline_apply_reaches() {
    let rt = runtime(Config::apply_worker()).await;
    append_sample(&rt).await;
    // Enqueued, not applied: the worker is the only path in this mode.
    let s = rt.journal().summary().await.unwrap();
    assert_eq!((s.pending, s.total()), (SAMPLE_EVENTS, SAMPLE_EVENTS));
    assert_eq!(account(rt.store(), "account-alice").await.unwrap(), None);

    assert_eq!(drain(&rt, "memory worker").await, SAMPLE_EVENTS);
    check_sample(rt.store(), "memory worker").await;

    let inline = runtime(Config::default()).await;
    append_sample(&inline).await;
    assert_eq!(digests(&rt).await, digests(&inline).await);
}

#[tokio::test]
async fn an_overdraft_rolls_the_whole_apply_back() {
    let rt = runtime(Config::default()).await;
    let dave = sid("account-dave");
    let erin = sid("account-erin");
    rt.append(
        &dave,
        ExpectedVersion::NoStream,
        vec![opened("Dave"), deposited(1_000, "2026-03-02")],
    )
    .await
    .unwrap();
    let before = (
        account(rt.store(), "account-dave").await.unwrap(),
        day_totals(rt.store(), "2026-03-02").await.unwrap(),
        day_totals(rt.store(), "2026-03-03").await.unwrap(),
    );
    assert_eq!(
        before.0,
        Some(Account {
            owner: "Dave".into(),
            balance_cents: 1_000,
            last_seq: 2
        })
    );

    // One append, one apply transaction: the deposit that precedes the
    // overdraft in it is rolled back with it, in both projections.
    let outcome = rt
        .append(
            &dave,
            ExpectedVersion::Exact(2),
            vec![deposited(500, "2026-03-03"), withdrawn(5_000, "2026-03-03")],
        )
        .await
        .expect("the events are accepted");
    assert_eq!(outcome.appended[0].last_seq, Seq::new(4).unwrap());
    assert_eq!(outcome.inline_failures.len(), 1, "{outcome:?}");
    let error = &outcome.inline_failures[0].error;
    assert!(
        error.contains("insufficient funds on account-dave/4")
            && error.contains("withdrawing 50.00 from a balance of 15.00 would leave -35.00"),
        "{error}"
    );
    let after = (
        account(rt.store(), "account-dave").await.unwrap(),
        day_totals(rt.store(), "2026-03-02").await.unwrap(),
        day_totals(rt.store(), "2026-03-03").await.unwrap(),
    );
    assert_eq!(after, before, "no partial writes");
    assert_eq!(after.2, DayTotals::default());
    for p in [BALANCES, DAILY_TOTALS] {
        assert_eq!(checkpoint(&rt, p, "account-dave").await, 2, "{p}");
    }
    // The events are durable all the same.
    assert_eq!(rt.journal().stream_version(&dave).await.unwrap(), 4);

    // Other accounts are not held up.
    let outcome = rt
        .append(
            &erin,
            ExpectedVersion::NoStream,
            vec![opened("Erin"), deposited(700, "2026-03-03")],
        )
        .await
        .unwrap();
    assert!(outcome.inline_failures.is_empty(), "{outcome:?}");
    assert_eq!(
        day_totals(rt.store(), "2026-03-03")
            .await
            .unwrap()
            .deposited_cents,
        700
    );
}

#[tokio::test]
async fn an_overdraft_is_retried_dead_lettered_and_applied_after_the_fix() {
    // The testing module's clock and retries: due again once the clock
    // moves by `testing::RETRY`, dead on the third failure.
    let clock = testing::clock();
    let journal = MemoryJournal::with_clock(clock.clone());
    let store = MemoryProjectionStore::with_clock(clock.clone());
    let config = Config::apply_worker().with_retry(testing::fast_retry());
    let rt = register(Outbox::builder(journal.clone(), store.clone()))
        .config(config.clone())
        .build()
        .await
        .unwrap();
    let dave = sid("account-dave");
    rt.append(
        &dave,
        ExpectedVersion::NoStream,
        vec![
            opened("Dave"),
            deposited(1_000, "2026-03-02"),
            withdrawn(1_500, "2026-03-02"),
            deposited(2_000, "2026-03-03"),
        ],
    )
    .await
    .unwrap();
    append_sample(&rt).await;

    // The worker completes every row: the balances projection fails on
    // Dave's overdraft and leaves the shared path on his account alone
    // (ADR 0032), stopping right before it; the daily totals apply it all.
    let tick = rt.tick().await.unwrap();
    assert_eq!(
        (tick.completed, tick.failed, tick.dead_lettered),
        (4 + SAMPLE_EVENTS, 1, 0),
        "{tick:?}"
    );
    for (key, want) in sample_accounts() {
        assert_eq!(account(rt.store(), &key).await.unwrap(), Some(want), "{key}");
    }
    let dave_doc = account(rt.store(), "account-dave").await.unwrap().unwrap();
    assert_eq!((dave_doc.balance_cents, dave_doc.last_seq), (1_000, 2));
    let failing = rt.projection_states(None, 10).await.unwrap();
    assert_eq!(failing.len(), 1, "{failing:?}");
    let state = &failing[0];
    assert_eq!(
        (state.sink.as_str(), state.stream.as_str(), state.seq + 1),
        ("projection:balances", "account-dave", 3)
    );
    assert_eq!((state.status, state.attempt_count), (SinkStatus::Failed, 1));
    assert!(
        state
            .last_error
            .as_deref()
            .unwrap()
            .contains("insufficient funds"),
        "{state:?}"
    );
    let day = day_totals(rt.store(), "2026-03-02").await.unwrap();
    assert_eq!(
        (day.withdrawn_cents, day.withdrawals),
        (2_500 + 1_500, 2),
        "the daily totals went on past the overdraft"
    );

    // Not due before the backoff; retried after it; dead on the third failure.
    let early = rt.tick().await.unwrap();
    assert_eq!((early.caught_up, early.failed), (0, 0), "{early:?}");
    for attempt in 2..=testing::DEAD_LETTER_AFTER {
        clock.advance(testing::RETRY);
        let tick = rt.tick().await.unwrap();
        assert_eq!(
            (tick.caught_up, tick.failed + tick.dead_lettered),
            (0, 1),
            "attempt {attempt}: {tick:?}"
        );
    }
    let dead = testing::dead_letters(&rt).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        (
            dead[0].projection.as_deref(),
            dead[0].stream.as_str(),
            dead[0].seq,
            dead[0].attempt_count
        ),
        (Some(BALANCES), "account-dave", 3, testing::DEAD_LETTER_AFTER)
    );
    // Dead for the balances on Dave's account only, and it stays dead.
    clock.advance(Duration::from_secs(3600));
    assert_eq!(rt.tick().await.unwrap().caught_up, 0);
    assert_eq!(
        account(rt.store(), "account-dave")
            .await
            .unwrap()
            .unwrap()
            .balance_cents,
        1_000
    );

    // The fix: the bank grants overdrafts up to 10.00. Deploy it (a runtime
    // with the new projection code on the same databases), requeue, drain.
    let fixed = Outbox::builder(journal, store)
        .config(config)
        .event_types(event_types())
        .view(outbox_core::typed::typed(
            outbox_example_bank::Balances::new().with_overdraft_limit(1_000),
        ))
        .view(outbox_core::typed::typed(DailyTotals::new()))
        .build()
        .await
        .unwrap();
    let requeued = fixed
        .requeue_projection(&outbox_core::ProjectionName::new(BALANCES).unwrap(), &dave)
        .await
        .unwrap();
    assert_eq!((requeued.status, requeued.attempt_count), (SinkStatus::Failed, 0));
    assert_eq!(
        drain(&fixed, "memory after the fix").await,
        2,
        "the balances caught up on events 3 and 4"
    );
    let dave_doc = account(fixed.store(), "account-dave").await.unwrap().unwrap();
    assert_eq!((dave_doc.balance_cents, dave_doc.last_seq), (1_500, 4));
    let day = day_totals(fixed.store(), "2026-03-02").await.unwrap();
    assert_eq!((day.withdrawn_cents, day.withdrawals), (2_500 + 1_500, 2));
}

#[tokio::test]
async fn replay_and_rebuild_keep_the_digests() {
    let rt = runtime(Config::apply_worker()).await;
    append_sample(&rt).await;
    drain(&rt, "memory").await;
    let want = digests(&rt).await;
    let cancel = CancellationToken::new();

    let replay = rt.replay(BALANCES, None, &cancel).await.unwrap();
    assert_eq!(
        (replay.kind, replay.state),
        (RunKind::CatchUp, RunState::Completed)
    );
    assert_eq!(digests(&rt).await, want, "after replay");

    let rebuild = rt.rebuild(BALANCES, &cancel).await.unwrap();
    assert_eq!(
        (rebuild.kind, rebuild.state),
        (RunKind::Rebuild, RunState::Completed)
    );
    assert_eq!(digests(&rt).await, want, "after rebuild");

    let all = rt.rebuild_all(&cancel).await.unwrap();
    let names: Vec<&str> = all.iter().map(|r| r.projection.as_str()).collect();
    assert_eq!(names, [BALANCES, DAILY_TOTALS]);
    assert!(all.iter().all(|r| r.state == RunState::Completed), "{all:?}");
    assert_eq!(digests(&rt).await, want, "after rebuild --all");
    check_sample(rt.store(), "memory after rebuilds").await;
}

#[tokio::test]
async fn events_the_bank_cannot_apply_are_applier_errors() {
    // Events written around `BankEvent`'s encoding (straight to the
    // journal) still meet the projections' checks when they are applied.
    let rt = runtime(Config::default()).await;
    let types = event_types();
    let raw = |t: &str, payload: &str| types.event(t, payload.as_bytes().to_vec()).unwrap();
    let cases = [
        (
            "account-x1",
            vec![raw("deposited", r#"{"cents":100,"day":"2026-03-02"}"#)],
            "the account was never opened",
        ),
        (
            "account-x2",
            vec![opened("X"), opened("X again")],
            "the account is already open",
        ),
        (
            "account-x3",
            vec![opened("X"), raw("deposited", r#"{"cents":0,"day":"2026-03-02"}"#)],
            "positive number of cents",
        ),
        (
            "account-x4",
            vec![opened("X"), raw("withdrawn", r#"{"cents":1,"day":"March 2"}"#)],
            "YYYY-MM-DD",
        ),
        (
            "account-x5",
            vec![raw("account_opened", r#"{"name":"X"}"#)],
            "does not decode",
        ),
    ];
    for (stream, events, wanted) in cases {
        let n = events.len() as u64;
        rt.journal()
            .append(
                &[AppendRequest::new(sid(stream), ExpectedVersion::NoStream, events)],
                AppendOptions::journal_only(),
            )
            .await
            .unwrap();
        // Gap repair is the path that applies journal-only events.
        let report = rt.repair_gaps().await.unwrap();
        let failure = report
            .failures
            .iter()
            .find(|f| f.stream.as_str() == stream)
            .unwrap_or_else(|| panic!("{stream}: no failure in {report:?}"));
        assert!(failure.error.contains(wanted), "{stream}: {}", failure.error);
        assert_eq!(rt.journal().stream_version(&sid(stream)).await.unwrap(), n);
        assert_eq!(checkpoint(&rt, BALANCES, stream).await, 0, "{stream}");
        assert_eq!(account(rt.store(), stream).await.unwrap(), None, "{stream}");
    }
    // Nothing was applied, so nothing was counted.
    assert_eq!(rt.metrics().applied, 0);
}
