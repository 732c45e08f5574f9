//! [`SinkStore`] contract checks: sink checkpoints by compare-and-set,
//! failures with backoff and dead letters per sink, requeue, scan cursors.

use std::time::Duration;

use outbox_core::{
    Error, FailureOutcome, Partition, PartitionStore, RetryPolicy, SinkName, SinkStatus, SinkStore, StreamId,
};

use super::support::{ms, now, seq};
use crate::{Harness, sid};

fn sink(name: &str) -> SinkName {
    SinkName::new(name).unwrap()
}

fn partition_of<J: PartitionStore>(j: &J, s: &StreamId) -> Partition {
    j.partitioning().of(s)
}

/// `advance_sink`: a compare-and-set from the stored seq (absent is 0);
/// `sink_states` reads one state per stream, in order, unknown ones as seq 0.
pub async fn sink_checkpoint_advances_by_compare_and_set<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let (bus, other) = (sink("bus"), sink("audit"));
    let (a, b) = (sid("a"), sid("b"));
    let pa = partition_of(j, &a);
    let states = j.sink_states(&bus, &[b.clone(), a.clone()]).await.unwrap();
    assert_eq!(
        states
            .iter()
            .map(|s| (s.stream.clone(), s.seq, s.status))
            .collect::<Vec<_>>(),
        [(b.clone(), 0, SinkStatus::Ok), (a.clone(), 0, SinkStatus::Ok)],
        "unknown streams read as seq 0, ok, in the order asked"
    );
    assert!(j.advance_sink(&bus, &a, pa, 0, seq(3)).await.unwrap());
    assert!(
        !j.advance_sink(&bus, &a, pa, 0, seq(5)).await.unwrap(),
        "stale from"
    );
    assert!(j.advance_sink(&bus, &a, pa, 3, seq(5)).await.unwrap());
    let err = j.advance_sink(&bus, &a, pa, 5, seq(5)).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    assert_eq!(
        j.sink_states(&bus, std::slice::from_ref(&a)).await.unwrap()[0].seq,
        5
    );
    assert_eq!(
        j.sink_states(&other, std::slice::from_ref(&a)).await.unwrap()[0].seq,
        0,
        "checkpoints are per sink"
    );
}

/// `fail_sink`: only the event after the checkpoint can fail; failures
/// back off by the policy and dead-letter at its threshold; `due_sink_streams`
/// lists failed streams once due, in the partitions asked; a successful
/// advance clears the failure; `requeue_sink` revives a dead stream.
pub async fn sink_failures_back_off_dead_letter_and_requeue<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let bus = sink("bus");
    let s = sid("s");
    let p = partition_of(j, &s);
    let policy = RetryPolicy::new(Duration::from_secs(10), Duration::from_secs(60), 3).unwrap();
    assert!(j.advance_sink(&bus, &s, p, 0, seq(5)).await.unwrap());
    let err = j
        .fail_sink(&bus, &s, p, seq(7), "boom", &policy)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidState(_)),
        "only seq 6 can fail: {err:?}"
    );
    let before = now(j).await;
    let first = j.fail_sink(&bus, &s, p, seq(6), "boom", &policy).await.unwrap();
    match first {
        FailureOutcome::Retry {
            attempt: 1,
            next_attempt_at,
        } => assert!(
            next_attempt_at >= before.saturating_add(Duration::from_secs(10)),
            "{first:?}"
        ),
        other => panic!("a first failure retries: {other:?}"),
    }
    let state = &j.sink_states(&bus, std::slice::from_ref(&s)).await.unwrap()[0];
    assert_eq!(
        (
            state.seq,
            state.status,
            state.attempt_count,
            state.last_error.as_deref()
        ),
        (5, SinkStatus::Failed, 1, Some("boom"))
    );
    assert!(
        j.due_sink_streams(&bus, &[p], 10).await.unwrap().is_empty(),
        "not due yet"
    );
    h.advance(&f.ctx, Duration::from_secs(10) + ms(1)).await;
    let other = Partition::new((p.get() + 1) % j.partitioning().count());
    assert!(
        j.due_sink_streams(&bus, &[other], 10).await.unwrap().is_empty(),
        "only the partitions asked"
    );
    let due = j.due_sink_streams(&bus, &[other, p], 10).await.unwrap();
    assert_eq!(due.iter().map(|d| &d.stream).collect::<Vec<_>>(), [&s]);
    j.fail_sink(&bus, &s, p, seq(6), "again", &policy).await.unwrap();
    let dead = j
        .fail_sink(&bus, &s, p, seq(6), "and again", &policy)
        .await
        .unwrap();
    assert_eq!(dead, FailureOutcome::Dead { attempt: 3 }, "dead at the threshold");
    h.advance(&f.ctx, Duration::from_secs(120)).await;
    assert!(
        j.due_sink_streams(&bus, &[p], 10).await.unwrap().is_empty(),
        "dead is not retried"
    );
    assert_eq!(
        j.sink_streams(&bus, Some(SinkStatus::Dead), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    let revived = j.requeue_sink(&bus, &s).await.unwrap();
    assert_eq!((revived.status, revived.attempt_count), (SinkStatus::Failed, 0));
    assert_eq!(
        j.due_sink_streams(&bus, &[p], 10).await.unwrap().len(),
        1,
        "due at once"
    );
    assert!(j.advance_sink(&bus, &s, p, 5, seq(6)).await.unwrap());
    let ok = &j.sink_states(&bus, std::slice::from_ref(&s)).await.unwrap()[0];
    assert_eq!(
        (ok.seq, ok.status, ok.attempt_count, ok.last_error.clone()),
        (6, SinkStatus::Ok, 0, None),
        "an advance clears the failure"
    );
    let err = j.requeue_sink(&bus, &s).await.unwrap_err();
    assert!(matches!(err, Error::InvalidState(_)), "{err:?}");
    let err = j.requeue_sink(&bus, &sid("never")).await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
}

/// Scan cursors: a compare-and-set per (sink, partition), absent is 0;
/// `sinks` summarises streams, failures and the lowest cursor.
pub async fn sink_cursors_advance_by_compare_and_set<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let bus = sink("bus");
    let (p0, p1) = (Partition::new(0), Partition::new(1));
    assert!(j.sink_cursors(&bus).await.unwrap().is_empty());
    assert!(j.advance_sink_cursor(&bus, p1, 0, 40).await.unwrap());
    assert!(j.advance_sink_cursor(&bus, p0, 0, 25).await.unwrap());
    assert!(
        !j.advance_sink_cursor(&bus, p0, 0, 30).await.unwrap(),
        "stale from"
    );
    assert!(j.advance_sink_cursor(&bus, p0, 25, 30).await.unwrap());
    assert!(matches!(
        j.advance_sink_cursor(&bus, p0, 30, 30).await,
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(j.sink_cursors(&bus).await.unwrap(), [(p0, 30), (p1, 40)]);
    let s = sid("s");
    let ps = partition_of(j, &s);
    j.advance_sink(&bus, &s, ps, 0, seq(2)).await.unwrap();
    let policy = RetryPolicy::default();
    j.fail_sink(&bus, &sid("t"), partition_of(j, &sid("t")), seq(1), "x", &policy)
        .await
        .unwrap();
    let all = j.sinks().await.unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(
        (
            all[0].sink.clone(),
            all[0].streams,
            all[0].failed,
            all[0].dead,
            all[0].position
        ),
        (bus, 2, 1, 0, 30)
    );
}
