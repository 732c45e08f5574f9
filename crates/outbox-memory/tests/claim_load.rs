//! The memory journal's loading claims read what the SQLite journal's
//! read: the events of fresh runs, none for a retried run or a run with an
//! event that does not verify.

use outbox_core::OutboxQueueExt as _;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    AppendOptions, AppendRequest, ClaimedRun, EventJournal, ExpectedVersion, LeaseStore, ManualClock,
    OutboxQueue, Partition, PartitionStore, RetryPolicy, Seq, SweepLimits, Timestamp, WorkerId,
};
use outbox_memory::MemoryJournal;
use outbox_testkit::{add, sid};

const LIMITS: SweepLimits = SweepLimits {
    streams: 10,
    per_stream: 10,
    rows: 100,
};
const TTL: Duration = Duration::from_secs(30);

/// A journal with two events on each of `fresh`, `corrupt` (its second
/// event no longer verifies) and `retried` (its first row failed once and
/// is due again).
async fn journal() -> MemoryJournal {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
    let journal = MemoryJournal::with_clock(clock.clone());
    for s in ["fresh", "corrupt", "retried"] {
        journal
            .append(
                &[AppendRequest::new(
                    sid(s),
                    ExpectedVersion::Any,
                    vec![add(1), add(2)],
                )],
                AppendOptions::enqueue(),
            )
            .await
            .unwrap();
    }
    let owner = WorkerId::new("setup").unwrap();
    let policy = RetryPolicy::new(Duration::from_secs(1), Duration::from_secs(1), 10).unwrap();
    for lease in journal
        .take(&owner, TTL, outbox_core::Take::Due(LIMITS))
        .await
        .unwrap()
        .into_iter()
        .map(|run| run.lease)
    {
        if lease.stream == sid("retried") {
            journal.fail(&lease, Seq::FIRST, "boom", &policy).await.unwrap();
        }
        journal.complete_and_release(&lease, None, true).await.unwrap();
        journal.release(&lease).await.unwrap();
    }
    assert!(journal.corrupt_payload_for_tests(&sid("corrupt"), Seq::new(2).unwrap()));
    clock.advance(Duration::from_secs(60));
    journal
}

async fn assert_only_the_fresh_run_read(journal: &MemoryJournal, claimed: &[ClaimedRun]) {
    let run = |name: &str| {
        claimed
            .iter()
            .find(|r| r.lease.stream == sid(name))
            .unwrap_or_else(|| panic!("{name} was claimed: {claimed:?}"))
    };
    let fresh = journal.read_stream(&sid("fresh"), Seq::FIRST, 10).await.unwrap();
    assert_eq!(
        run("fresh").events.as_ref(),
        Some(&fresh),
        "the fresh run is read"
    );
    assert_eq!(
        run("corrupt").events,
        None,
        "left to the worker, which records the fault"
    );
    assert_eq!(run("retried").rows[0].attempt_count, 1);
    assert_eq!(
        run("retried").events,
        None,
        "a retried run goes alone, read there"
    );
}

#[tokio::test]
async fn a_sweep_claim_reads_only_fresh_runs_that_verify() {
    let journal = journal().await;
    let claimed = journal
        .take(&WorkerId::new("w").unwrap(), TTL, outbox_core::Take::Due(LIMITS))
        .await
        .unwrap();
    assert_only_the_fresh_run_read(&journal, &claimed).await;
}

#[tokio::test]
async fn a_partitioned_claim_reads_only_fresh_runs_that_verify() {
    let journal = journal().await;
    let owner = WorkerId::new("w").unwrap();
    let all: Vec<Partition> = Partition::all(journal.partitioning().count()).collect();
    journal.sync_partitions(&owner, &all, TTL).await.unwrap();
    let claimed = journal
        .claim_and_load_partitioned(&owner, TTL, LIMITS)
        .await
        .unwrap();
    assert_only_the_fresh_run_read(&journal, &claimed).await;
}
