//! [`SinkStore`] contract checks: sink checkpoints by compare-and-set,
//! failures with backoff and dead letters per sink, requeue, scan cursors.

use outbox_core::SinkFeed as _;
use std::time::Duration;

use outbox_core::{
    Error, ExpectedVersion, FailureOutcome, Partition, PartitionStore, RetryPolicy, SinkName, SinkStatus,
    SinkStore, StreamId,
};

use super::support::{adds, append, ms, now, req, seq};
use crate::{Harness, sid};

fn sink(name: &str) -> SinkName {
    SinkName::new(name).unwrap()
}

async fn state_of<J: SinkStore>(j: &J, sink: &SinkName, s: &StreamId) -> outbox_core::SinkStream {
    j.sink_states(sink, std::slice::from_ref(s))
        .await
        .unwrap()
        .remove(0)
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
    assert!(j.advance_sink(&bus, &a, pa, 0, seq(3), false).await.unwrap());
    assert!(
        !j.advance_sink(&bus, &a, pa, 0, seq(5), false).await.unwrap(),
        "stale from"
    );
    assert!(j.advance_sink(&bus, &a, pa, 3, seq(5), false).await.unwrap());
    for (from, to, more) in [(5, 4, false), (5, 5, true)] {
        let err = j
            .advance_sink(&bus, &a, pa, from, seq(to), more)
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidInput(_)),
            "a move from {from} to {to} (more: {more}) is refused: {err:?}"
        );
    }
    assert!(
        j.advance_sink(&bus, &a, pa, 5, seq(5), false).await.unwrap(),
        "a settle (to == from, no more) of the stored seq succeeds"
    );
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

/// `hold_sink` takes an `ok` or unknown (consumer, stream) off the shared
/// path (failed, due now, at the seq given, attempts cleared) and leaves a
/// failed or dead one as it is; a settle at the stream's version makes it
/// `ok` again.
pub async fn hold_sink_marks_only_an_ok_stream<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let key = sink("projection:p");
    let s = sid("held");
    let p = partition_of(j, &s);
    append(j, &s, adds(&[1, 2, 3])).await;
    let held = j.hold_sink(&key, &s, p, 1).await.unwrap();
    assert_eq!(
        (held.seq, held.status, held.attempt_count),
        (1, SinkStatus::Failed, 0),
        "an unknown stream is held at the seq given"
    );
    let due = j.due_sink_streams(&key, &[p], 10).await.unwrap();
    assert_eq!(due.len(), 1, "a held stream is due at once: {due:?}");
    let policy = RetryPolicy::new(Duration::from_secs(10), Duration::from_secs(60), 3).unwrap();
    j.fail_sink(&key, &s, p, seq(2), "boom", &policy).await.unwrap();
    let again = j.hold_sink(&key, &s, p, 0).await.unwrap();
    assert_eq!(
        (again.seq, again.status, again.attempt_count),
        (1, SinkStatus::Failed, 1),
        "a failed stream is left as it is"
    );
    assert!(j.advance_sink(&key, &s, p, 1, seq(3), false).await.unwrap());
    let ok = state_of(j, &key, &s).await;
    assert_eq!(
        ok.status,
        SinkStatus::Ok,
        "at the stream's version it is ok: {ok:?}"
    );
    let rehold = j.hold_sink(&key, &s, p, 2).await.unwrap();
    assert_eq!(
        (rehold.seq, rehold.status, rehold.attempt_count, rehold.last_error),
        (2, SinkStatus::Failed, 0, None),
        "an ok stream is held anew"
    );
    assert!(
        j.advance_sink(&key, &s, p, 2, seq(2), false).await.unwrap(),
        "a settle short of the version succeeds"
    );
    assert_eq!(
        state_of(j, &key, &s).await.status,
        SinkStatus::Failed,
        "but leaves it due: the stream has more"
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
    assert!(j.advance_sink(&bus, &s, p, 0, seq(5), false).await.unwrap());
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
    assert!(j.advance_sink(&bus, &s, p, 5, seq(6), false).await.unwrap());
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
    j.advance_sink(&bus, &s, ps, 0, seq(2), false).await.unwrap();
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

/// Every event a feed reader gets, by `stream:seq`, reading pages from
/// `cursor` until a page brings nothing new.
async fn read_all<J: outbox_core::SinkFeed>(j: &J, cursor: &mut u64, seen: &mut Vec<String>) {
    loop {
        let page = j.read_feed(*cursor, 3).await.expect("read_feed");
        assert!(page.next >= *cursor, "a page's next is never below after");
        for (key, e) in &page.events {
            assert!(*key > *cursor && *key <= page.next, "keys lie in (after, next]");
            seen.push(format!("{}:{}", e.stream, e.seq));
        }
        if page.next == *cursor {
            return;
        }
        *cursor = page.next;
    }
}

/// Reads until every event of `want` was seen. A feed may hold events
/// back while other transactions are open (on Postgres, any writing
/// transaction of the server, other tests' included): that delays them,
/// it never loses them. The bound only turns a lost event into a failure
/// instead of a hang.
async fn read_until<J: outbox_core::SinkFeed>(
    j: &J,
    cursor: &mut u64,
    seen: &mut Vec<String>,
    want: &[String],
) {
    for _ in 0..3_000 {
        read_all(j, cursor, seen).await;
        if want.iter().all(|w| seen.contains(w)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("events never read: want {want:?}, read {seen:?}");
}

/// `read_feed`: an event whose transaction took its global position before
/// a later event committed, and commits after a reader read what was
/// visible, comes in a later page: commit order is not position order
/// (ADR 0030). The reproduction: `quiet` takes position 1 in an
/// open transaction, `busy` commits at position 2, a reader reads (it may
/// or may not get `busy:1` yet: an open transaction may hold the feed
/// back), then `quiet` commits: the reader gets both, each once.
pub async fn read_feed_sees_an_event_that_commits_after_a_later_one_was_read<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let (quiet, busy) = (sid("quiet"), sid("busy"));
    let held = h
        .hold_append(&f.ctx, vec![req(&quiet, ExpectedVersion::Any, adds(&[1]))])
        .await;
    append(j, &busy, adds(&[2])).await;
    let (mut cursor, mut seen) = (0, Vec::new());
    read_all(j, &mut cursor, &mut seen).await;
    assert!(
        seen.is_empty() || seen == ["busy:1"],
        "only committed events are read: {seen:?}"
    );
    held.commit().await;
    let want = ["busy:1".to_owned(), "quiet:1".to_owned()];
    read_until(j, &mut cursor, &mut seen, &want).await;
    let mut got = seen.clone();
    got.sort();
    assert_eq!(got, want, "the late commit is read, and each event once");
    let again = j.read_feed(cursor, 10).await.unwrap();
    assert!(again.events.is_empty(), "nothing more: {:?}", again.events.len());
}

/// `read_feed` with many transactions open at once on many quiet streams,
/// committing in an order unrelated to their positions, between busy
/// appends and reads: the reader ends with every event, each once.
pub async fn read_feed_loses_nothing_to_many_late_commits<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let (mut cursor, mut seen) = (0, Vec::new());
    let mut held = Vec::new();
    let mut want = Vec::new();
    for i in 0..8 {
        let quiet = sid(&format!("quiet-{i}"));
        held.push(
            h.hold_append(&f.ctx, vec![req(&quiet, ExpectedVersion::Any, adds(&[1, 2]))])
                .await,
        );
        want.extend([format!("{quiet}:1"), format!("{quiet}:2")]);
        let busy = sid(&format!("busy-{i}"));
        append(j, &busy, adds(&[i])).await;
        want.push(format!("{busy}:1"));
        read_all(j, &mut cursor, &mut seen).await;
    }
    // Commit in an order unrelated to the positions taken: 3, 7, 0, 5, 1, ...
    let mut order: Vec<usize> = (0..held.len()).map(|i| (i * 3 + 3) % held.len()).collect();
    order.dedup();
    let mut slots: Vec<Option<crate::HeldAppend>> = held.into_iter().map(Some).collect();
    for i in order.into_iter().chain(0..slots.len()) {
        if let Some(a) = slots[i].take() {
            a.commit().await;
            append(j, &sid(&format!("after-{i}")), adds(&[1])).await;
            want.push(format!("after-{i}:1"));
            read_all(j, &mut cursor, &mut seen).await;
        }
    }
    want.sort();
    read_until(j, &mut cursor, &mut seen, &want).await;
    let mut got = seen.clone();
    got.sort();
    got.dedup();
    assert_eq!(got.len(), seen.len(), "no event read twice: {seen:?}");
    assert_eq!(got, want, "every committed event read");
}

/// `advance_sink` with `more`: the stream stays (or becomes) `failed` and
/// due now, its attempt count and error kept; the next advance without
/// `more` makes it `ok` again.
pub async fn advance_sink_with_more_keeps_the_stream_due<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let bus = sink("bus");
    let s = sid("s");
    let p = partition_of(j, &s);
    assert!(j.advance_sink(&bus, &s, p, 0, seq(2), true).await.unwrap());
    let state = j
        .sink_states(&bus, std::slice::from_ref(&s))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (state.seq, state.status, state.attempt_count),
        (2, SinkStatus::Failed, 0)
    );
    let due = j.due_sink_streams(&bus, &[p], 10).await.unwrap();
    assert_eq!(due.len(), 1, "due at once");
    j.fail_sink(&bus, &s, p, seq(3), "bus down", &RetryPolicy::default())
        .await
        .unwrap();
    h.advance(&f.ctx, Duration::from_secs(5)).await;
    assert!(j.advance_sink(&bus, &s, p, 2, seq(4), true).await.unwrap());
    let state = j
        .sink_states(&bus, std::slice::from_ref(&s))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (
            state.seq,
            state.status,
            state.attempt_count,
            state.last_error.as_deref()
        ),
        (4, SinkStatus::Failed, 1, Some("bus down")),
        "the failure record is kept while more follows"
    );
    assert!(j.advance_sink(&bus, &s, p, 4, seq(5), false).await.unwrap());
    let state = j
        .sink_states(&bus, std::slice::from_ref(&s))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (state.seq, state.status, state.attempt_count, state.last_error),
        (5, SinkStatus::Ok, 0, None)
    );
}

/// `advance_sink` without `more` makes a stream `ok` only when it was `ok`
/// or the advance reaches the stream's end. A stream that failed meanwhile
/// (scan cursors may have passed its later events, skipping it) is not made
/// `ok` by a deliverer that read it `ok` before (a stalled or overlapping
/// worker): it stays `failed` and due now, its checkpoint moved, its
/// failure kept; a `dead` one stays dead. At the stream's end it is `ok`.
pub async fn advance_sink_makes_a_failed_stream_ok_only_at_its_end<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let bus = sink("bus");
    let s = sid("s");
    let p = partition_of(j, &s);
    append(j, &s, adds(&[1, 2, 3, 4, 5, 6])).await;
    assert!(j.advance_sink(&bus, &s, p, 0, seq(2), false).await.unwrap());
    let policy = RetryPolicy::new(Duration::from_secs(3600), Duration::from_secs(3600), 3).unwrap();
    j.fail_sink(&bus, &s, p, seq(3), "bus down", &policy)
        .await
        .unwrap();
    // The stale deliverer published 3 and 4 and advances from 2.
    assert!(j.advance_sink(&bus, &s, p, 2, seq(4), false).await.unwrap());
    let st = state_of(j, &bus, &s).await;
    assert_eq!(
        (st.seq, st.status, st.attempt_count, st.last_error.as_deref()),
        (4, SinkStatus::Failed, 1, Some("bus down")),
        "not ok behind the stream's end"
    );
    assert!(st.next_attempt_at <= now(j).await, "due now: {st:?}");
    assert_eq!(j.due_sink_streams(&bus, &[p], 10).await.unwrap().len(), 1);
    // Dead stays dead short of the end.
    for _ in 0..3 {
        j.fail_sink(&bus, &s, p, seq(5), "bus down", &policy)
            .await
            .unwrap();
    }
    assert_eq!(state_of(j, &bus, &s).await.status, SinkStatus::Dead);
    assert!(j.advance_sink(&bus, &s, p, 4, seq(5), false).await.unwrap());
    assert_eq!(
        (
            state_of(j, &bus, &s).await.seq,
            state_of(j, &bus, &s).await.status
        ),
        (5, SinkStatus::Dead)
    );
    // At the end: ok.
    assert!(j.advance_sink(&bus, &s, p, 5, seq(6), false).await.unwrap());
    let st = state_of(j, &bus, &s).await;
    assert_eq!(
        (st.seq, st.status, st.attempt_count, st.last_error),
        (6, SinkStatus::Ok, 0, None)
    );
    // An ok stream stays ok short of its end (the scan delivers it page by page).
    let t = sid("t");
    let pt = partition_of(j, &t);
    append(j, &t, adds(&[1, 2, 3])).await;
    assert!(j.advance_sink(&bus, &t, pt, 0, seq(1), false).await.unwrap());
    assert!(j.advance_sink(&bus, &t, pt, 1, seq(2), false).await.unwrap());
    let st = j
        .sink_states(&bus, std::slice::from_ref(&t))
        .await
        .unwrap()
        .remove(0);
    assert_eq!((st.seq, st.status), (2, SinkStatus::Ok));
}

/// `ConsumerRegistry`: registering sets `first_seen` once and moves
/// `last_seen`, the version and the worker; `consumers` lists by key;
/// `retire_consumer` removes the consumer and its per-stream states; an
/// invalid version is refused and changes nothing.
pub async fn consumers_register_list_and_retire<H: Harness>(h: &H) {
    use outbox_core::{ConsumerKind, ConsumerRegistry, WorkerId};
    let f = h.open().await;
    let j = &f.journal;
    let (a, b) = (
        WorkerId::new("worker-a").unwrap(),
        WorkerId::new("worker-b").unwrap(),
    );
    let roster = sink("projection:roster");
    let bus = sink("bus");
    j.register_consumers(
        &[
            (roster.clone(), ConsumerKind::Projection),
            (bus.clone(), ConsumerKind::Sink),
        ],
        "1.0",
        &a,
    )
    .await
    .unwrap();
    let first = j.consumers().await.unwrap();
    assert_eq!(
        first
            .iter()
            .map(|c| (c.key.as_str(), c.kind, c.version.as_str(), c.last_worker.as_str()))
            .collect::<Vec<_>>(),
        [
            ("bus", ConsumerKind::Sink, "1.0", "worker-a"),
            ("projection:roster", ConsumerKind::Projection, "1.0", "worker-a")
        ],
        "listed by key"
    );
    assert_eq!(first[1].projection(), Some("roster"));
    j.register_consumers(&[(roster.clone(), ConsumerKind::Projection)], "1.1", &b)
        .await
        .unwrap();
    let again = j.consumers().await.unwrap();
    let r = again.iter().find(|c| c.key == roster).unwrap();
    assert_eq!(
        (r.version.as_str(), r.last_worker.as_str(), r.first_seen),
        ("1.1", "worker-b", first[1].first_seen),
        "first_seen is kept"
    );
    assert!(r.last_seen >= first[1].last_seen);
    let err = j
        .register_consumers(&[(roster.clone(), ConsumerKind::Projection)], "bad\nversion", &a)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    assert_eq!(
        j.consumers().await.unwrap(),
        again,
        "a refused version changes nothing"
    );

    let s = sid("retired");
    let p = partition_of(j, &s);
    append(j, &s, adds(&[1, 2])).await;
    j.hold_sink(&roster, &s, p, 0).await.unwrap();
    assert!(j.retire_consumer(&roster).await.unwrap());
    assert_eq!(
        j.consumers()
            .await
            .unwrap()
            .iter()
            .map(|c| c.key.as_str())
            .collect::<Vec<_>>(),
        ["bus"]
    );
    assert_eq!(
        state_of(j, &roster, &s).await.status,
        SinkStatus::Ok,
        "its per-stream states are gone (an unknown state reads as ok at 0)"
    );
    assert!(
        !j.retire_consumer(&roster).await.unwrap(),
        "nothing left to retire"
    );
}
