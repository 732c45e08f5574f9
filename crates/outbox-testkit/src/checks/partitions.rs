//! [`PartitionStore`] contract checks: partition lease synchronisation,
//! partitioned claims fenced by the partition lease's epoch, exclusion of
//! stream and partition leases, the partition report.

use outbox_core::{
    Error, EventJournal, Lease, LeaseStore, OutboxInspector, OutboxQueue, OutboxRow, Partition,
    PartitionHandover, PartitionStore, RetryPolicy, StreamEnd, StreamId, SweepLimits, UNFINISHED_ATTEMPT,
    WorkerId,
};

use super::support::{TTL, enqueue, ms, now, owner, secs, seq};
use crate::{Fixture, Harness, sid};

const LIMITS: SweepLimits = SweepLimits {
    streams: 64,
    per_stream: 64,
    rows: 512,
};

fn p(n: u16) -> Partition {
    Partition::new(n)
}

/// The first stream named `{prefix}{i}` that lies in `partition`.
fn stream_in<J: PartitionStore>(j: &J, prefix: &str, partition: Partition) -> StreamId {
    (0..100_000)
        .map(|i| sid(&format!("{prefix}{i}")))
        .find(|s| j.partitioning().of(s) == partition)
        .expect("some stream name falls in every partition")
}

/// `sync_partitions`: wanted partitions are acquired (epoch 1, expiry
/// `now + ttl`), kept ones renewed with the same epoch, unwanted ones
/// released (epoch kept); `held` lists the owner's leases by partition.
pub async fn partition_sync_acquires_renews_and_releases<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let a = owner("a");
    let before = now(j).await;
    let first = j.sync_partitions(&a, &[p(1), p(0), p(1)], TTL).await.unwrap();
    assert_eq!(first.acquired, [p(0), p(1)], "duplicates count once, in order");
    assert!(first.released.is_empty() && first.waiting.is_empty());
    assert_eq!(
        first
            .held
            .iter()
            .map(|l| (l.partition, l.epoch))
            .collect::<Vec<_>>(),
        [(p(0), 1), (p(1), 1)]
    );
    assert!(
        first
            .held
            .iter()
            .all(|l| l.owner == a && l.expires_at >= before.saturating_add(TTL)),
        "held for the owner until now + ttl: {:?}",
        first.held
    );
    h.advance(&f.ctx, secs(5)).await;
    let second = j.sync_partitions(&a, &[p(1), p(2)], TTL).await.unwrap();
    assert_eq!(second.acquired, [p(2)], "only p02 is new");
    assert_eq!(second.released, [p(0)], "p00 is not wanted any more");
    let p1 = second
        .held
        .iter()
        .find(|l| l.partition == p(1))
        .expect("p01 held");
    assert_eq!(p1.epoch, 1, "a renewal keeps the epoch");
    assert!(
        p1.expires_at > first.held[1].expires_at,
        "a renewal moves the expiry"
    );
    let report = j.partitions().await.unwrap();
    assert_eq!(
        report.len(),
        usize::from(j.partitioning().count()),
        "every partition reported"
    );
    assert_eq!(
        (report[0].owner.clone(), report[0].epoch, report[0].held),
        (None, 1, false),
        "a released partition keeps its epoch and has no owner"
    );
    assert_eq!((report[1].owner.clone(), report[1].held), (Some(a.clone()), true));
    assert_eq!(
        (report[3].epoch, report[3].held, report[3].expires_at),
        (0, false, None),
        "never leased"
    );
    let again = j.sync_partitions(&a, &[p(0)], TTL).await.unwrap();
    assert_eq!(
        again
            .held
            .iter()
            .map(|l| (l.partition, l.epoch))
            .collect::<Vec<_>>(),
        [(p(0), 2)],
        "re-acquiring a released partition bumps its epoch"
    );
}

/// `sync_partitions`: a partition another owner holds unexpired is
/// `waiting`, and changes hands once it is released (epoch + 1) or its
/// lease expires (epoch + 1).
pub async fn partition_held_by_another_waits_for_release_or_expiry<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let (a, b) = (owner("a"), owner("b"));
    j.sync_partitions(&a, &[p(3), p(4)], TTL).await.unwrap();
    let waiting = j.sync_partitions(&b, &[p(3), p(4)], TTL).await.unwrap();
    assert_eq!(waiting.waiting, [p(3), p(4)], "held by a");
    assert!(waiting.held.is_empty() && waiting.acquired.is_empty());
    let kept = j.sync_partitions(&a, &[p(4)], TTL).await.unwrap();
    assert_eq!(kept.released, [p(3)]);
    let took = j.sync_partitions(&b, &[p(3), p(4)], TTL).await.unwrap();
    assert_eq!(took.acquired, [p(3)], "released: b takes it");
    assert_eq!(took.waiting, [p(4)], "still held by a");
    assert_eq!(took.held[0].epoch, 2, "a change of owner bumps the epoch");
    h.advance(&f.ctx, TTL - secs(1)).await;
    j.sync_partitions(&b, &[p(3)], TTL).await.unwrap();
    let early = j.sync_partitions(&b, &[p(3), p(4)], TTL).await.unwrap();
    assert_eq!(early.waiting, [p(4)], "not expired yet (store's clock)");
    h.advance(&f.ctx, secs(1) + ms(1)).await;
    let late = j.sync_partitions(&b, &[p(3), p(4)], TTL).await.unwrap();
    assert_eq!(late.acquired, [p(4)], "expired: b takes it over");
    let p4 = late.held.iter().find(|l| l.partition == p(4)).unwrap();
    assert_eq!(p4.epoch, 2, "a takeover after expiry bumps the epoch");
}

/// `sync_partitions`: a partition outside the journal or a ttl out of
/// range is `InvalidInput` and nothing changes.
pub async fn partition_sync_rejects_unknown_partitions<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let count = j.partitioning().count();
    let err = j
        .sync_partitions(&owner("a"), &[p(0), p(count)], TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    assert!(
        err.to_string().contains(&p(count).to_string()),
        "names the partition: {err}"
    );
    assert!(
        j.partitions().await.unwrap().iter().all(|s| s.epoch == 0),
        "a refused sync leases nothing"
    );
    let err = j.sync_partitions(&owner("a"), &[p(0)], ms(0)).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
}

/// `claim_partitioned`: only streams in the owner's partitions are claimed,
/// with leases that carry the partition and its epoch; no stream lease is
/// written; nothing is claimed without a partition.
pub async fn partitioned_claim_takes_only_held_partitions<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let a = owner("a");
    let mine = stream_in(j, "m", p(5));
    let other = stream_in(j, "o", p(6));
    enqueue(j, mine.as_str(), 3).await;
    enqueue(j, other.as_str(), 2).await;
    assert!(
        j.claim_partitioned(&a, TTL, LIMITS).await.unwrap().is_empty(),
        "no partition, no claim"
    );
    let sync = j.sync_partitions(&a, &[p(5)], TTL).await.unwrap();
    let taken = j.claim_partitioned(&a, TTL, LIMITS).await.unwrap();
    assert_eq!(taken.len(), 1, "only the stream of p05: {taken:?}");
    let (lease, rows) = &taken[0];
    assert_eq!(lease.stream, mine);
    assert_eq!((lease.partition, lease.epoch), (Some(p(5)), sync.held[0].epoch));
    assert_eq!(rows.iter().map(|r| r.seq.get()).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(j.lease(&mine).await.unwrap(), None, "no stream lease is written");
    assert!(
        j.claim_partitioned(&a, TTL, LIMITS).await.unwrap().is_empty(),
        "claimed rows are not claimed again while the partition is held"
    );
    let limited = {
        let f2 = h.open().await;
        let j2 = &f2.journal;
        for i in 0..3 {
            enqueue(j2, stream_in(j2, &format!("x{i}-"), p(7)).as_str(), 4).await;
        }
        j2.sync_partitions(&a, &[p(7)], TTL).await.unwrap();
        let limits = SweepLimits {
            streams: 2,
            per_stream: 3,
            rows: 5,
        };
        j2.claim_partitioned(&a, TTL, limits).await.unwrap()
    };
    assert_eq!(
        limited.iter().map(|(_, r)| r.len()).collect::<Vec<_>>(),
        [3, 2],
        "at most 2 streams, 3 rows each, 5 in all"
    );
}

/// `sync_partitions_taking` (`PartitionHandover`): a wanted partition that
/// a worker named in `from` holds unexpired is taken over at once (epoch +
/// 1, listed as acquired), and its old holder's claims under it are
/// `LeaseLost` and its partitioned claims stay out of it; a partition held
/// by an owner not named still waits; with nobody named it is
/// `sync_partitions`.
pub async fn partition_handover_takes_only_from_the_named_holders<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let (a, b, c) = (owner("a"), owner("b"), owner("c"));
    let s = stream_in(j, "s", p(3));
    enqueue(j, s.as_str(), 2).await;
    j.sync_partitions(&a, &[p(3), p(4)], TTL).await.unwrap();
    j.sync_partitions(&c, &[p(5)], TTL).await.unwrap();
    let stale = j.claim_partitioned(&a, TTL, LIMITS).await.unwrap()[0].0.clone();
    let alone = j
        .sync_partitions_taking(&b, &[p(3), p(5)], &[], TTL)
        .await
        .unwrap();
    assert!(
        alone.acquired.is_empty() && alone.waiting == [p(3), p(5)],
        "nobody named: nothing taken, {alone:?}"
    );
    let took = j
        .sync_partitions_taking(&b, &[p(3), p(5)], std::slice::from_ref(&a), TTL)
        .await
        .unwrap();
    assert_eq!(took.acquired, [p(3)], "taken from the named holder: {took:?}");
    assert_eq!(took.waiting, [p(5)], "c is not named: p05 waits");
    assert_eq!(
        (took.held.len(), took.held[0].owner.clone(), took.held[0].epoch),
        (1, b.clone(), stale.epoch + 1),
        "held by b, epoch raised"
    );
    let policy = RetryPolicy::default();
    for (what, result) in [
        ("claim", j.claim(&stale, 10).await.map(|_| ())),
        ("fail", j.fail(&stale, seq(1), "boom", &policy).await.map(|_| ())),
        ("renew", j.renew(&stale, TTL).await.map(|_| ())),
    ] {
        assert!(
            matches!(result, Err(Error::LeaseLost { .. })),
            "{what} under a partition handed over must be LeaseLost, got {result:?}"
        );
    }
    let later = stream_in(j, "t", p(3));
    enqueue(j, later.as_str(), 1).await;
    assert!(
        j.claim_partitioned(&a, TTL, LIMITS).await.unwrap().is_empty(),
        "the old holder claims nothing in p03 any more"
    );
    let mine = j.claim_partitioned(&b, TTL, LIMITS).await.unwrap();
    assert_eq!(
        mine.iter().map(|(l, _)| l.stream.clone()).collect::<Vec<_>>(),
        [later],
        "the new holder claims in p03 (s is still in flight under a's claim)"
    );
    let report = j.partitions().await.unwrap();
    let who = |n: usize| (report[n].owner.clone(), report[n].epoch);
    assert_eq!(
        (who(3), who(4), who(5)),
        ((Some(b), 2), (Some(a), 1), (Some(c), 1)),
        "only p03 changed hands"
    );
}

/// `claim_and_load_partitioned`: takes what `claim_partitioned` takes from
/// the same journal, and a run's events, where the claim read them, are
/// what `read_runs` returns for the run.
pub async fn partitioned_claim_and_load_takes_what_the_claim_takes_with_the_runs_events<H: Harness>(h: &H) {
    let a = owner("a");
    let (plain, loading) = (h.open().await, h.open().await);
    for f in [&plain, &loading] {
        let j = &f.journal;
        for i in 0..3 {
            enqueue(j, stream_in(j, &format!("x{i}-"), p(7)).as_str(), 4).await;
        }
        enqueue(j, stream_in(j, "y", p(8)).as_str(), 2).await;
        j.sync_partitions(&a, &[p(7)], TTL).await.unwrap();
    }
    let limits = SweepLimits {
        streams: 2,
        per_stream: 3,
        rows: 5,
    };
    let taken = plain.journal.claim_partitioned(&a, TTL, limits).await.unwrap();
    let loaded = loading
        .journal
        .claim_and_load_partitioned(&a, TTL, limits)
        .await
        .unwrap();
    let runs = |taken: Vec<(Lease, Vec<OutboxRow>)>| {
        taken
            .into_iter()
            .map(|(l, rows)| {
                (
                    l.stream,
                    l.partition,
                    l.epoch,
                    rows.iter().map(|r| (r.seq, r.status)).collect::<Vec<_>>(),
                )
            })
            .collect::<Vec<_>>()
    };
    let as_taken = loaded.iter().map(|r| (r.lease.clone(), r.rows.clone())).collect();
    assert_eq!(runs(as_taken), runs(taken), "the same streams, leases and runs");
    assert_eq!(
        loaded.iter().map(|r| r.rows.len()).collect::<Vec<_>>(),
        [3, 2],
        "at most 2 streams, 3 rows each, 5 in all"
    );
    for run in &loaded {
        if let Some(events) = &run.events {
            let read = loading
                .journal
                .read_runs(&[(run.lease.stream.clone(), run.rows[0].seq, run.rows.len())])
                .await
                .unwrap();
            assert_eq!(
                std::slice::from_ref(events),
                read.as_slice(),
                "{}: the loaded events are the run's",
                run.lease.stream
            );
        }
    }
}

/// `claim_partitioned` takes the oldest due streams of the held partitions,
/// in due order, also when older due streams of other partitions come
/// first in the journal (an adapter that looks at the oldest heads overall
/// first must look further when too few of them are its own).
pub async fn partitioned_claim_takes_the_oldest_due_streams_of_held_partitions<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let a = owner("a");
    for i in 0..6 {
        enqueue(j, stream_in(j, &format!("a{i}-"), p(3)).as_str(), 1).await;
    }
    let mine: Vec<StreamId> = (0..3).map(|i| stream_in(j, &format!("b{i}-"), p(4))).collect();
    for s in &mine {
        enqueue(j, s.as_str(), 1).await;
    }
    j.sync_partitions(&a, &[p(4)], TTL).await.unwrap();
    let limits = |streams| SweepLimits {
        streams,
        per_stream: 1,
        rows: 10,
    };
    let streams = |taken: Vec<(outbox_core::Lease, Vec<outbox_core::OutboxRow>)>| {
        taken.into_iter().map(|(l, _)| l.stream).collect::<Vec<_>>()
    };
    assert_eq!(
        streams(j.claim_partitioned(&a, TTL, limits(2)).await.unwrap()),
        mine[..2],
        "the two oldest due streams of p04"
    );
    assert_eq!(
        streams(j.claim_partitioned(&a, TTL, limits(3)).await.unwrap()),
        mine[2..],
        "then the third, behind six older streams of p03"
    );
}

/// A partitioned claim's lease is current only while its partition's lease
/// is: after a takeover the old holder's `claim`, `fail` and
/// `renew` are `LeaseLost`, and the new holder's claim takes the unfinished
/// row over alone (no attempt counted: the run it was claimed in held two
/// rows, so nobody can tell which one ended it).
pub async fn partitioned_claim_is_fenced_by_the_partition_epoch<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let (a, b) = (owner("a"), owner("b"));
    let s = stream_in(j, "s", p(2));
    enqueue(j, s.as_str(), 2).await;
    j.sync_partitions(&a, &[p(2)], TTL).await.unwrap();
    let taken = j.claim_partitioned(&a, TTL, LIMITS).await.unwrap();
    let stale = taken[0].0.clone();
    let renewed = j
        .renew(&stale, TTL)
        .await
        .expect("the holder renews its partition");
    assert_eq!((renewed.epoch, renewed.partition), (stale.epoch, Some(p(2))));
    h.advance(&f.ctx, TTL + ms(1)).await;
    let took = j.sync_partitions(&b, &[p(2)], TTL).await.unwrap();
    assert_eq!(took.held[0].epoch, stale.epoch + 1, "takeover after expiry");
    let policy = RetryPolicy::default();
    for (what, result) in [
        ("claim", j.claim(&stale, 10).await.map(|_| ())),
        ("fail", j.fail(&stale, seq(1), "boom", &policy).await.map(|_| ())),
        ("renew", j.renew(&stale, TTL).await.map(|_| ())),
    ] {
        assert!(
            matches!(result, Err(Error::LeaseLost { .. })),
            "{what} under a taken-over partition must be LeaseLost, got {result:?}"
        );
    }
    let again = j.claim_partitioned(&b, TTL, LIMITS).await.unwrap();
    assert_eq!(again.len(), 1);
    let head = &again[0].1[0];
    assert_eq!(
        (
            head.seq.get(),
            head.attempt_count,
            head.last_error.as_deref(),
            head.alone
        ),
        (1, 0, None, true),
        "the unfinished row is taken over alone, uncharged"
    );
    // Its own attempt begins and ends without a result: the next holder's
    // claim says so, for it to record.
    j.begin_attempt(&again[0].0, seq(1)).await.unwrap();
    h.advance(&f.ctx, TTL + ms(1)).await;
    j.sync_partitions(&a, &[p(2)], TTL).await.unwrap();
    let third = j.claim_partitioned(&a, TTL, LIMITS).await.unwrap();
    let head = &third[0].1[0];
    assert_eq!(
        (head.seq.get(), head.attempt_count, head.last_error.as_deref()),
        (1, 0, Some(UNFINISHED_ATTEMPT)),
        "an attempt of its own is reported, not counted, by the claim"
    );
    assert!(head.ended_unfinished());
}

/// A journal with stream `s` of three rows in partition 1, which owner
/// `a` holds.
async fn held_stream<H: Harness>(h: &H) -> (Fixture<H>, WorkerId, StreamId) {
    let f = h.open().await;
    let a = owner("a");
    let s = stream_in(&f.journal, "s", p(1));
    enqueue(&f.journal, s.as_str(), 3).await;
    f.journal.sync_partitions(&a, &[p(1)], TTL).await.unwrap();
    (f, a, s)
}

/// Ending a partitioned pass completes its rows and leaves the partition
/// held: `release` of such a lease releases nothing and returns `false`.
pub async fn partitioned_pass_ends_without_releasing_the_partition<H: Harness>(h: &H) {
    let (f, a, _) = held_stream(h).await;
    let j = &f.journal;
    let (lease, rows) = j.claim_partitioned(&a, TTL, LIMITS).await.unwrap().remove(0);
    assert_eq!(rows.len(), 3);
    let done = j
        .finish(&[StreamEnd {
            lease: lease.clone(),
            through: Some(seq(2)),
            abandon: true,
        }])
        .await
        .unwrap();
    assert_eq!(done, 2, "rows 1 and 2 completed");
    let left = j.list(None, 10).await.unwrap();
    assert_eq!(
        left.iter()
            .map(|r| (r.seq.get(), r.status.as_str()))
            .collect::<Vec<_>>(),
        [(3, "pending")],
        "the rest was abandoned"
    );
    assert!(!j.release(&lease).await.unwrap(), "release leaves the partition");
    let report = j.partitions().await.unwrap();
    assert!(report[1].held, "still held by a");
    let next = j.claim_partitioned(&a, TTL, LIMITS).await.unwrap();
    assert_eq!(next.len(), 1, "the holder claims the rest at once");
}

/// A partitioned pass that ends with a plain completion (no abandon)
/// ends the hold on the stream's head: the holder claims the rest at once.
pub async fn partitioned_plain_end_lets_the_rest_be_claimed_at_once<H: Harness>(h: &H) {
    let (f, a, s) = held_stream(h).await;
    let j = &f.journal;
    let two = SweepLimits {
        per_stream: 2,
        ..LIMITS
    };
    let (lease, rows) = j.claim_partitioned(&a, TTL, two).await.unwrap().remove(0);
    assert_eq!(rows.len(), 2);
    let done = j
        .finish(&[StreamEnd {
            lease,
            through: Some(seq(2)),
            abandon: false,
        }])
        .await
        .unwrap();
    assert_eq!(done, 2);
    let next = j.claim_partitioned(&a, TTL, LIMITS).await.unwrap();
    assert_eq!(
        next.iter()
            .map(|(l, r)| (
                l.stream.clone(),
                r.iter().map(|r| r.seq.get()).collect::<Vec<_>>()
            ))
            .collect::<Vec<_>>(),
        [(s, vec![3])],
        "the holder claims the rest at once"
    );
}

/// Stream leases and partition leases exclude each other: `acquire`
/// refuses a stream whose partition another owner holds, `due_streams`
/// omits it, and a partitioned claim skips a stream another owner leased.
pub async fn stream_and_partition_leases_exclude_each_other<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let (a, b) = (owner("a"), owner("b"));
    let s = stream_in(j, "s", p(4));
    let t = stream_in(j, "t", p(4));
    enqueue(j, s.as_str(), 1).await;
    enqueue(j, t.as_str(), 1).await;
    let tl = j
        .acquire(&t, &b, TTL)
        .await
        .unwrap()
        .expect("t is free before p04 is leased");
    j.sync_partitions(&a, &[p(4)], TTL).await.unwrap();
    assert_eq!(
        j.acquire(&s, &b, TTL).await.unwrap(),
        None,
        "s lies in p04, which a holds"
    );
    assert!(j.acquire(&s, &a, TTL).await.unwrap().is_some(), "its holder may");
    let due = j.due_streams(10).await.unwrap();
    assert!(
        !due.contains(&s) && !due.contains(&t),
        "held partitions are not due for others: {due:?}"
    );
    let taken = j.claim_partitioned(&a, TTL, LIMITS).await.unwrap();
    let streams: Vec<&StreamId> = taken.iter().map(|(l, _)| &l.stream).collect();
    assert_eq!(streams, [&s], "t's stream lease belongs to b");
    assert!(j.release(&tl).await.unwrap());
    let taken = j.claim_partitioned(&a, TTL, LIMITS).await.unwrap();
    assert_eq!(taken.len(), 1, "t once b released it");
    assert_eq!(taken[0].0.stream, t);
}

/// `partitions`: streams, rows and due rows per partition.
pub async fn partitions_report_rows_per_partition<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let a = owner("a");
    let s = stream_in(j, "s", p(0));
    let t = stream_in(j, "t", p(0));
    let u = stream_in(j, "u", p(9));
    enqueue(j, s.as_str(), 2).await;
    enqueue(j, t.as_str(), 3).await;
    enqueue(j, u.as_str(), 1).await;
    j.sync_partitions(&a, &[p(9)], TTL).await.unwrap();
    j.claim_partitioned(&a, TTL, LIMITS).await.unwrap();
    let report = j.partitions().await.unwrap();
    let of = |n: usize| (report[n].streams, report[n].rows, report[n].due_rows);
    assert_eq!(of(0), (2, 5, 5), "p00: two streams, five due rows");
    assert_eq!(of(9), (1, 1, 0), "p09: its one row is processing, not due");
    assert_eq!(of(1), (0, 0, 0));
    assert_eq!(
        report.iter().map(|s| s.partition).collect::<Vec<_>>(),
        Partition::all(j.partitioning().count()).collect::<Vec<_>>(),
        "in partition order"
    );
}
