//! [`EventJournal`] contract checks.

use outbox_core::{
    AppendOptions, AppendRequest, Error, Event, EventJournal, EventType, ExpectedVersion, Intent, NewEvent,
    OutboxInspector, OutboxStatus, PayloadHash, Seq, StreamVersion,
};

use super::support::{adds, all_events, append, enqueue, join_all, now, req, rows, seq, seqs_of, snapshot};
use crate::{Harness, add, audit, sid, value_of};

/// `append`: seqs are `last + 1, last + 2, ...`, contiguous across calls.
pub async fn append_assigns_contiguous_seqs<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let a = f
        .journal
        .append(
            &[AppendRequest::new(
                s.clone(),
                ExpectedVersion::NoStream,
                vec![add(1), add(2)],
            )],
            AppendOptions::enqueue(),
        )
        .await
        .expect("first append");
    assert_eq!((a[0].first_seq.get(), a[0].last_seq.get()), (1, 2));
    let b = f
        .journal
        .append(
            &[AppendRequest::new(
                s.clone(),
                ExpectedVersion::Exact(2),
                vec![add(3)],
            )],
            AppendOptions::enqueue(),
        )
        .await
        .expect("second append");
    assert_eq!((b[0].first_seq.get(), b[0].last_seq.get()), (3, 3));
    assert_eq!(f.journal.stream_version(&s).await.unwrap(), 3);
    let evs = f.journal.read_stream(&s, Seq::FIRST, 10).await.unwrap();
    let seqs: Vec<u64> = evs.iter().map(|e| e.seq.get()).collect();
    assert_eq!(seqs, [1, 2, 3], "read_stream returns every seq in order");
}

/// `append` with the outbox: one `pending` row per event, due now.
pub async fn append_enqueues_one_pending_row_per_event<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    f.journal
        .append(
            &[AppendRequest::new(
                s.clone(),
                ExpectedVersion::Any,
                vec![add(1), add(2), add(3)],
            )],
            AppendOptions::enqueue(),
        )
        .await
        .unwrap();
    let rows = f.journal.list(None, 100).await.unwrap();
    assert_eq!(rows.len(), 3, "one row per event");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.stream, s);
        assert_eq!(r.seq.get(), i as u64 + 1);
        assert_eq!(r.status, OutboxStatus::Pending);
        assert_eq!(r.attempt_count, 0);
        assert_eq!(r.last_error, None);
    }
    let summary = f.journal.summary().await.unwrap();
    assert_eq!(summary.pending, 3);
    assert!(rows[0].next_attempt_at <= summary.as_of, "new rows are due now");
}

/// `append` without the outbox writes events but no rows.
pub async fn append_without_enqueue_writes_no_rows<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    f.journal
        .append(
            &[AppendRequest::new(s.clone(), ExpectedVersion::Any, vec![add(1)])],
            AppendOptions::journal_only(),
        )
        .await
        .unwrap();
    assert_eq!(f.journal.stream_version(&s).await.unwrap(), 1);
    assert_eq!(f.journal.summary().await.unwrap().total(), 0);
}

/// `append`: an empty batch is `InvalidInput` and writes nothing.
pub async fn append_rejects_empty_batch<H: Harness>(h: &H) {
    let f = h.open().await;
    enqueue(&f.journal, "s", 2).await;
    let before = snapshot(&f.journal).await;
    let r = f.journal.append(&[], AppendOptions::enqueue()).await;
    assert!(matches!(r, Err(Error::InvalidInput(_))), "empty batch: {r:?}");
    assert_eq!(
        snapshot(&f.journal).await,
        before,
        "a rejected append writes nothing"
    );
}

/// `append`: a request with no events is `InvalidInput`, and the valid
/// requests before it in the batch are not written either.
pub async fn append_rejects_request_without_events<H: Harness>(h: &H) {
    let f = h.open().await;
    enqueue(&f.journal, "s", 1).await;
    let before = snapshot(&f.journal).await;
    let batch = [
        req(&sid("ok"), ExpectedVersion::NoStream, adds(&[1])),
        req(&sid("empty"), ExpectedVersion::Any, vec![]),
    ];
    let r = f.journal.append(&batch, AppendOptions::enqueue()).await;
    assert!(
        matches!(r, Err(Error::InvalidInput(_))),
        "request without events: {r:?}"
    );
    assert_eq!(
        snapshot(&f.journal).await,
        before,
        "a rejected append writes nothing"
    );
    assert_eq!(
        f.journal.stream_version(&sid("ok")).await.unwrap(),
        0,
        "the valid request was not written"
    );
}

/// `append`: a payload over the limit is `InvalidInput` and writes nothing.
pub async fn append_rejects_oversized_payload<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 1).await;
    let before = snapshot(&f.journal).await;
    let options = AppendOptions::enqueue().with_max_payload_bytes(4);
    // add(1) is 1 byte, add(12345) is 5 bytes.
    let r = f
        .journal
        .append(&[req(&s, ExpectedVersion::Exact(1), adds(&[1, 12_345]))], options)
        .await;
    assert!(
        matches!(r, Err(Error::InvalidInput(_))),
        "oversized payload: {r:?}"
    );
    assert_eq!(
        snapshot(&f.journal).await,
        before,
        "a rejected append writes nothing"
    );
    let ok = f
        .journal
        .append(&[req(&s, ExpectedVersion::Exact(1), adds(&[1234]))], options)
        .await;
    assert!(ok.is_ok(), "a payload exactly at the limit is accepted: {ok:?}");
}

/// `append`: a batch with more events than allowed is `InvalidInput` and writes nothing.
pub async fn append_rejects_too_many_events<H: Harness>(h: &H) {
    let f = h.open().await;
    enqueue(&f.journal, "s", 1).await;
    let before = snapshot(&f.journal).await;
    let options = AppendOptions::enqueue().with_max_batch_events(2);
    let batch = [
        req(&sid("a"), ExpectedVersion::Any, adds(&[1, 2])),
        req(&sid("b"), ExpectedVersion::Any, adds(&[3])),
    ];
    let r = f.journal.append(&batch, options).await;
    assert!(matches!(r, Err(Error::InvalidInput(_))), "too many events: {r:?}");
    assert_eq!(
        snapshot(&f.journal).await,
        before,
        "a rejected append writes nothing"
    );
}

/// `append`: `NoStream` on a stream with events is `Conflict` (with the
/// stream's actual version) and writes nothing.
pub async fn append_conflict_no_stream_on_existing<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let before = snapshot(&f.journal).await;
    let r = f
        .journal
        .append(
            &[req(&s, ExpectedVersion::NoStream, adds(&[9]))],
            AppendOptions::enqueue(),
        )
        .await;
    match r {
        Err(Error::Conflict { stream, actual, .. }) => {
            assert_eq!(
                (stream, actual),
                (s.clone(), 2),
                "the conflict names the stream and its version"
            )
        }
        other => panic!("NoStream on an existing stream should conflict, got {other:?}"),
    }
    assert_eq!(
        snapshot(&f.journal).await,
        before,
        "a conflicting append writes nothing"
    );
}

/// `append`: `Exact(n)` with the wrong `n` (too low, too high, 0) is `Conflict` and writes nothing.
pub async fn append_conflict_exact_wrong_version<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 3).await;
    let before = snapshot(&f.journal).await;
    for wrong in [0, 2, 4] {
        let r = f
            .journal
            .append(
                &[req(&s, ExpectedVersion::Exact(wrong), adds(&[9]))],
                AppendOptions::enqueue(),
            )
            .await;
        assert!(
            matches!(r, Err(Error::Conflict { actual: 3, .. })),
            "Exact({wrong}) on a stream at 3 should conflict with actual 3, got {r:?}"
        );
    }
    assert_eq!(
        snapshot(&f.journal).await,
        before,
        "conflicting appends write nothing"
    );
    let ok = f
        .journal
        .append(
            &[req(&s, ExpectedVersion::Exact(3), adds(&[9]))],
            AppendOptions::enqueue(),
        )
        .await;
    assert_eq!(ok.expect("Exact(3) matches")[0].first_seq.get(), 4);
}

/// `append`: `Any` always matches; `NoStream` and `Exact(0)` match an empty stream.
pub async fn append_expected_versions_that_match<H: Harness>(h: &H) {
    let f = h.open().await;
    let o = AppendOptions::enqueue();
    let (a, b, c) = (sid("a"), sid("b"), sid("c"));
    f.journal
        .append(&[req(&a, ExpectedVersion::NoStream, adds(&[1]))], o)
        .await
        .expect("NoStream on empty");
    f.journal
        .append(&[req(&b, ExpectedVersion::Exact(0), adds(&[1]))], o)
        .await
        .expect("Exact(0) on empty");
    f.journal
        .append(&[req(&c, ExpectedVersion::Any, adds(&[1]))], o)
        .await
        .expect("Any on empty");
    for i in 0..3 {
        f.journal
            .append(&[req(&a, ExpectedVersion::Any, adds(&[i]))], o)
            .await
            .expect("Any on existing");
    }
    assert_eq!(f.journal.stream_version(&a).await.unwrap(), 4);
    assert_eq!(f.journal.stream_version(&b).await.unwrap(), 1);
    assert_eq!(f.journal.stream_version(&c).await.unwrap(), 1);
}

/// `append`: a multi-request batch is all-or-nothing: when the second request
/// conflicts, the first (to another stream) is not written, event or row.
pub async fn append_batch_is_all_or_nothing<H: Harness>(h: &H) {
    let f = h.open().await;
    let (x, s) = (sid("x"), enqueue(&f.journal, "s", 1).await);
    let before = snapshot(&f.journal).await;
    let batch = [
        req(&x, ExpectedVersion::NoStream, adds(&[1, 2])),
        req(&s, ExpectedVersion::NoStream, adds(&[3])),
    ];
    let r = f.journal.append(&batch, AppendOptions::enqueue()).await;
    assert!(
        matches!(r, Err(Error::Conflict { .. })),
        "second request conflicts: {r:?}"
    );
    assert_eq!(
        f.journal.stream_version(&x).await.unwrap(),
        0,
        "the first request's events were not written"
    );
    assert!(
        f.journal.row(&x, Seq::FIRST).await.unwrap().is_none(),
        "nor its outbox rows"
    );
    assert_eq!(
        snapshot(&f.journal).await,
        before,
        "the failed batch wrote nothing"
    );
}

/// `append` from many callers at once (on SQLite they share one transaction,
/// group commit): each call succeeds or fails on its own expected version,
/// a conflict fails only its own call, and what succeeded is all there,
/// with its outbox rows, contiguous seqs and distinct global positions.
pub async fn concurrent_appends_succeed_or_conflict_one_by_one<H: Harness>(h: &H) {
    let f = h.open().await;
    let hot = sid("hot");
    let cold: Vec<_> = (0..32).map(|i| sid(&format!("cold-{i:02}"))).collect();
    let mut batches = Vec::new();
    for (i, s) in cold.iter().enumerate() {
        batches.push(vec![req(s, ExpectedVersion::NoStream, adds(&[i as i64, 1]))]);
        batches.push(vec![req(
            &hot,
            ExpectedVersion::NoStream,
            adds(&[100 + i as i64]),
        )]);
    }
    let calls = batches
        .iter()
        .map(|b| f.journal.append(b, AppendOptions::enqueue()))
        .collect();
    let results = join_all(calls).await;
    let mut hot_winner = None;
    for (i, (b, r)) in batches.iter().zip(&results).enumerate() {
        match (i % 2, r) {
            (0, Ok(a)) => assert_eq!(
                (a[0].stream.clone(), a[0].first_seq.get(), a[0].last_seq.get()),
                (b[0].stream.clone(), 1, 2),
                "a fresh stream's append"
            ),
            (0, Err(e)) => panic!("the append to {} failed: {e}", b[0].stream),
            (_, Ok(a)) => {
                assert!(
                    hot_winner.is_none(),
                    "two NoStream appends to one stream both succeeded"
                );
                assert_eq!((a[0].first_seq.get(), a[0].last_seq.get()), (1, 1));
                hot_winner = Some(b[0].events[0].payload.clone());
            }
            (_, Err(Error::Conflict { .. })) => {}
            (_, Err(e)) => panic!("a losing NoStream append must be a conflict, got {e}"),
        }
    }
    let winner = hot_winner.expect("one NoStream append to the hot stream succeeds");
    let hot_events = all_events(&f.journal, &hot).await;
    assert_eq!(
        hot_events.len(),
        1,
        "only the winner's event is in the hot stream"
    );
    assert_eq!(hot_events[0].payload, winner, "and it is the winner's");
    let mut positions = Vec::new();
    for (i, s) in cold.iter().enumerate() {
        let evs = all_events(&f.journal, s).await;
        assert_eq!(
            evs.iter()
                .map(|e| (e.seq.get(), value_of(e).expect("an oracle value")))
                .collect::<Vec<_>>(),
            [(1, i as i64), (2, 1)],
            "stream {s} holds its own two events"
        );
        positions.extend(evs.iter().map(|e| e.global_position));
    }
    positions.push(hot_events[0].global_position);
    let n = positions.len();
    positions.sort_unstable();
    positions.dedup();
    assert_eq!(positions.len(), n, "global positions are distinct");
    let rows = rows(&f.journal).await;
    assert_eq!(
        rows.len(),
        32 * 2 + 1,
        "one outbox row per appended event, none for a conflict"
    );
    assert!(rows.iter().all(|r| r.status == OutboxStatus::Pending));
}

/// `append`: requests for the same stream in one batch are applied in order and see each other.
pub async fn append_batch_requests_see_each_other<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let batch = [
        req(&s, ExpectedVersion::NoStream, adds(&[1, 2])),
        req(&s, ExpectedVersion::Exact(2), adds(&[3])),
    ];
    let out = f
        .journal
        .append(&batch, AppendOptions::enqueue())
        .await
        .expect("the second request sees the first");
    assert_eq!(out.len(), 2, "one Appended per request");
    assert_eq!((out[0].first_seq.get(), out[0].last_seq.get()), (1, 2));
    assert_eq!((out[1].first_seq.get(), out[1].last_seq.get()), (3, 3));
    assert_eq!(seqs_of(&rows(&f.journal).await), [1, 2, 3], "one row per event");

    let before = snapshot(&f.journal).await;
    let t = sid("t");
    let batch = [
        req(&t, ExpectedVersion::NoStream, adds(&[1])),
        req(&t, ExpectedVersion::NoStream, adds(&[2])),
    ];
    let r = f.journal.append(&batch, AppendOptions::enqueue()).await;
    assert!(
        matches!(r, Err(Error::Conflict { actual: 1, .. })),
        "the second NoStream sees the first request's event: {r:?}"
    );
    assert_eq!(snapshot(&f.journal).await, before, "and the batch writes nothing");
}

/// `append`: seqs stay contiguous after failed appends (no holes, ever).
pub async fn append_seqs_stay_contiguous_after_failures<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let _ = f
        .journal
        .append(
            &[req(&s, ExpectedVersion::Exact(7), adds(&[1]))],
            AppendOptions::enqueue(),
        )
        .await;
    let big = AppendOptions::enqueue().with_max_payload_bytes(1);
    let _ = f
        .journal
        .append(&[req(&s, ExpectedVersion::Any, adds(&[1, 22]))], big)
        .await;
    let a = append(&f.journal, &s, adds(&[3, 4])).await;
    assert_eq!(
        (a.first_seq.get(), a.last_seq.get()),
        (3, 4),
        "the next seqs follow the last written one"
    );
    let got: Vec<u64> = all_events(&f.journal, &s)
        .await
        .iter()
        .map(|e| e.seq.get())
        .collect();
    assert_eq!(got, [1, 2, 3, 4]);
    assert_eq!(seqs_of(&rows(&f.journal).await), [1, 2, 3, 4]);
}

/// `append`: `global_position` is unique and increasing in append order, across streams.
pub async fn append_global_positions_increase<H: Harness>(h: &H) {
    let f = h.open().await;
    let order = ["b", "a", "b", "c", "a"];
    let mut positions = Vec::new();
    for (i, name) in order.iter().enumerate() {
        let a = append(&f.journal, &sid(name), adds(&[i as i64, 0])).await;
        for (k, n) in (a.first_seq.get()..=a.last_seq.get()).enumerate() {
            let e = f.journal.load(&sid(name), seq(n)).await.expect("load");
            if k == 0 {
                assert_eq!(
                    e.global_position, a.first_global_position,
                    "Appended names the first position"
                );
            }
            positions.push(e.global_position);
        }
    }
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "global positions strictly increase in append order: {positions:?}"
    );
}

/// `append`: `recorded_at` is stamped with the store's clock.
pub async fn append_stamps_recorded_at_with_store_clock<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let before = now(&f.journal).await;
    let a = append(&f.journal, &s, adds(&[1, 2])).await;
    let after = now(&f.journal).await;
    assert!(
        before <= a.recorded_at && a.recorded_at <= after,
        "recorded_at {} not in [{before}, {after}]",
        a.recorded_at
    );
    for e in all_events(&f.journal, &s).await {
        assert_eq!(
            e.metadata.recorded_at, a.recorded_at,
            "events of one append share its recorded_at"
        );
    }
}

/// `load`: returns the event exactly as appended: payload bytes, type,
/// intent, correlation and causation ids, hash, position and time.
pub async fn load_returns_event_as_appended<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let bin = NewEvent::new(
        EventType::new("bin.blob").unwrap(),
        Intent::Apply,
        vec![0u8, 255, 10, 0, 13, 0x80],
    )
    .with_correlation_id("corr-1")
    .with_causation_id("cause-1");
    let empty = NewEvent::new(EventType::new("empty").unwrap(), Intent::Apply, Vec::new())
        .with_correlation_id("corr-1");
    let new = vec![bin, empty, audit(), add(-42)];
    let a = append(&f.journal, &s, new.clone()).await;
    for (i, want) in new.iter().enumerate() {
        let n = i as u64 + 1;
        let e = f.journal.load(&s, seq(n)).await.expect("load");
        assert_eq!(e.stream, s);
        assert_eq!(e.seq.get(), n);
        assert_eq!(e.payload, want.payload, "payload bytes of #{n}");
        assert_eq!(e.event_type, want.event_type, "type of #{n}");
        assert_eq!(e.intent, want.intent, "intent of #{n}");
        assert_eq!(
            e.metadata.correlation_id, want.metadata.correlation_id,
            "correlation id of #{n}"
        );
        assert_eq!(
            e.metadata.causation_id, want.metadata.causation_id,
            "causation id of #{n}"
        );
        assert_eq!(e.metadata.recorded_at, a.recorded_at, "recorded_at of #{n}");
        assert_eq!(e.payload_hash, PayloadHash::of(&want.payload), "hash of #{n}");
        assert!(e.verify().is_ok(), "#{n} verifies");
        assert_eq!(
            e.global_position,
            a.first_global_position + i as u64,
            "positions of one append are consecutive"
        );
        let read = f.journal.read_stream(&s, seq(n), 1).await.expect("read_stream");
        assert_eq!(read, [e], "read_stream returns the same event as load");
    }
}

/// `load`: an unknown stream or a seq past the head is `NotFound`.
pub async fn load_unknown_is_not_found<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let r = f.journal.load(&sid("nope"), Seq::FIRST).await;
    assert!(matches!(r, Err(Error::NotFound(_))), "unknown stream: {r:?}");
    let r = f.journal.load(&s, seq(3)).await;
    assert!(matches!(r, Err(Error::NotFound(_))), "seq past the head: {r:?}");
    assert!(f.journal.load(&s, seq(2)).await.is_ok(), "the head itself loads");
}

/// `load` and `read_stream`: a stored payload that no longer matches its hash
/// is [`Error::Corrupt`] naming the stream and seq (never returned as if it
/// were the event appended); the stream's other events still load.
pub async fn corrupt_payload_is_reported<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 3).await;
    let other = enqueue(&f.journal, "t", 1).await;
    h.corrupt_payload(&f.ctx, &s, seq(2)).await;
    let is_corrupt_at = |r: &Result<_, Error>, n: u64| matches!(r, Err(Error::Corrupt { stream, seq, .. }) if *stream == s && seq.get() == n);
    let r = f.journal.load(&s, seq(2)).await.map(|_| ());
    assert!(is_corrupt_at(&r, 2), "load of the damaged event: {r:?}");
    let r = f.journal.read_stream(&s, Seq::FIRST, 10).await.map(|_| ());
    assert!(is_corrupt_at(&r, 2), "read_stream over the damaged event: {r:?}");
    let r = f.journal.read_stream(&s, seq(2), 1).await.map(|_| ());
    assert!(
        is_corrupt_at(&r, 2),
        "read_stream of just the damaged event: {r:?}"
    );
    assert!(
        f.journal.load(&s, seq(1)).await.is_ok(),
        "an undamaged event of the stream still loads"
    );
    let tail = f.journal.read_stream(&s, seq(3), 10).await;
    assert!(
        tail.as_ref().is_ok_and(|v| v.len() == 1),
        "read_stream past the damaged event still works: {tail:?}"
    );
    assert!(
        f.journal.load(&other, Seq::FIRST).await.is_ok(),
        "other streams are unaffected"
    );
}

/// `read_stream`: up to `limit` events with seq `>= from`, in seq order.
pub async fn read_stream_honours_from_and_limit<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 5).await;
    enqueue(&f.journal, "t", 3).await;
    let seqs = |evs: Vec<Event>| evs.iter().map(|e| e.seq.get()).collect::<Vec<_>>();
    assert_eq!(seqs(f.journal.read_stream(&s, seq(2), 2).await.unwrap()), [2, 3]);
    assert_eq!(seqs(f.journal.read_stream(&s, seq(4), 10).await.unwrap()), [4, 5]);
    assert_eq!(
        seqs(f.journal.read_stream(&s, seq(1), 5).await.unwrap()),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(seqs(f.journal.read_stream(&s, seq(5), 1).await.unwrap()), [5]);
    let vals: Vec<i64> = f
        .journal
        .read_stream(&s, seq(3), 3)
        .await
        .unwrap()
        .iter()
        .map(|e| value_of(e).unwrap())
        .collect();
    assert_eq!(vals, [3, 4, 5], "events belong to the stream asked for");
}

/// `read_runs`: `read_stream` for each request, one vector per request in
/// the order given (an unknown stream or a range past the end is empty).
pub async fn read_runs_reads_each_range_in_order<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 5).await;
    let t = enqueue(&f.journal, "t", 3).await;
    let unknown = sid("nobody");
    let got = f
        .journal
        .read_runs(&[
            (t.clone(), seq(2), 5),
            (s.clone(), seq(1), 2),
            (unknown, seq(1), 3),
            (s.clone(), seq(5), 4),
            (s.clone(), seq(9), 1),
        ])
        .await
        .unwrap();
    let runs: Vec<Vec<(String, u64, i64)>> = got
        .iter()
        .map(|run| {
            run.iter()
                .map(|e| (e.stream.to_string(), e.seq.get(), value_of(e).unwrap()))
                .collect()
        })
        .collect();
    let run = |stream: &str, seqs: &[u64]| -> Vec<(String, u64, i64)> {
        seqs.iter().map(|&q| (stream.to_owned(), q, q as i64)).collect()
    };
    assert_eq!(
        runs,
        [
            run("t", &[2, 3]),
            run("s", &[1, 2]),
            vec![],
            run("s", &[5]),
            vec![]
        ],
        "one run per request, in order, each as read_stream returns it"
    );
    assert!(
        f.journal.read_runs(&[]).await.unwrap().is_empty(),
        "no requests, no runs"
    );
}

/// `read_stream`: empty past the end and for an unknown stream.
pub async fn read_stream_past_end_is_empty<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    assert!(
        f.journal.read_stream(&s, seq(3), 10).await.unwrap().is_empty(),
        "past the end"
    );
    assert!(
        f.journal
            .read_stream(&s, seq(1_000), 10)
            .await
            .unwrap()
            .is_empty(),
        "far past the end"
    );
    assert!(
        f.journal
            .read_stream(&sid("nope"), Seq::FIRST, 10)
            .await
            .unwrap()
            .is_empty(),
        "unknown stream"
    );
}

/// `stream_head`: 0 for a stream with no events, else its last seq
/// (also for journal-only appends).
pub async fn stream_head_tracks_last_seq<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    assert_eq!(f.journal.stream_version(&s).await.unwrap(), 0, "no events yet");
    append(&f.journal, &s, adds(&[1, 2])).await;
    assert_eq!(f.journal.stream_version(&s).await.unwrap(), 2);
    f.journal
        .append(
            &[req(&s, ExpectedVersion::Exact(2), adds(&[3]))],
            AppendOptions::journal_only(),
        )
        .await
        .unwrap();
    assert_eq!(f.journal.stream_version(&s).await.unwrap(), 3);
    assert_eq!(f.journal.stream_version(&sid("other")).await.unwrap(), 0);
}

/// `stream_heads`: pages through every stream with events, by stream id,
/// strictly after `after`, at most `limit` per page.
pub async fn stream_heads_pages_by_stream_id<H: Harness>(h: &H) {
    let f = h.open().await;
    for (name, n) in [("d", 1), ("b", 2), ("e", 3), ("a", 4)] {
        enqueue(&f.journal, name, n).await;
    }
    f.journal
        .append(
            &[req(&sid("c"), ExpectedVersion::Any, adds(&[1]))],
            AppendOptions::journal_only(),
        )
        .await
        .unwrap();
    let page = |v: Vec<StreamVersion>| {
        v.into_iter()
            .map(|h| (h.stream.to_string(), h.version))
            .collect::<Vec<_>>()
    };
    let p1 = page(f.journal.stream_versions(None, 2).await.unwrap());
    assert_eq!(p1, [("a".into(), 4), ("b".into(), 2)]);
    let p2 = page(f.journal.stream_versions(Some(&sid("b")), 2).await.unwrap());
    assert_eq!(
        p2,
        [("c".into(), 1), ("d".into(), 1)],
        "strictly after `b`; journal-only streams count"
    );
    let p3 = page(f.journal.stream_versions(Some(&sid("d")), 2).await.unwrap());
    assert_eq!(p3, [("e".to_string(), 3)]);
    assert!(
        f.journal
            .stream_versions(Some(&sid("e")), 2)
            .await
            .unwrap()
            .is_empty(),
        "past the last stream"
    );
    let between = page(f.journal.stream_versions(Some(&sid("bb")), 10).await.unwrap());
    assert_eq!(
        between.first().map(|p| p.0.as_str()),
        Some("c"),
        "`after` need not be an existing stream"
    );
}

/// `read_global`: every stream's events after a position, in global-position
/// order, paged by `limit`; each as `load` returns it; empty past the end;
/// a damaged payload is `Corrupt` naming its event.
pub async fn read_global_pages_in_global_position_order<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = enqueue(&f.journal, "s", 2).await;
    let t = enqueue(&f.journal, "t", 1).await;
    append(&f.journal, &s, adds(&[3])).await;
    f.journal
        .append(
            &[
                req(&sid("u"), ExpectedVersion::Any, adds(&[1, 2])),
                req(&t, ExpectedVersion::Any, adds(&[2])),
            ],
            AppendOptions::enqueue(),
        )
        .await
        .expect("append a batch of two streams");
    let key = |e: &Event| (e.stream.to_string(), e.seq.get());
    let all = f.journal.read_global(0, 100).await.expect("read_global");
    assert_eq!(
        all.iter().map(key).collect::<Vec<_>>(),
        [
            ("s".to_owned(), 1),
            ("s".to_owned(), 2),
            ("t".to_owned(), 1),
            ("s".to_owned(), 3),
            ("u".to_owned(), 1),
            ("u".to_owned(), 2),
            ("t".to_owned(), 2),
        ],
        "every stream's events, in the order they were appended"
    );
    assert!(
        all.windows(2)
            .all(|w| w[0].global_position < w[1].global_position),
        "in increasing global position"
    );
    for e in &all {
        let loaded = f.journal.load(&e.stream, e.seq).await.expect("load");
        assert_eq!(&loaded, e, "read_global returns the event as load does");
    }
    let mut paged = Vec::new();
    let mut after = 0;
    loop {
        let page = f.journal.read_global(after, 2).await.expect("a page");
        assert!(page.len() <= 2, "at most `limit` events: {}", page.len());
        let Some(last) = page.last() else { break };
        after = last.global_position;
        paged.extend(page);
    }
    assert_eq!(
        paged, all,
        "pages after the last position read add up to the whole"
    );
    let from_middle = f.journal.read_global(all[2].global_position, 100).await.unwrap();
    assert_eq!(from_middle, all[3..], "strictly after `after`");
    assert!(
        f.journal
            .read_global(all[6].global_position, 10)
            .await
            .unwrap()
            .is_empty(),
        "past the end"
    );
    assert!(
        matches!(f.journal.read_global(0, 0).await, Err(Error::InvalidInput(_))),
        "a zero limit is invalid"
    );
    h.corrupt_payload(&f.ctx, &s, seq(3)).await;
    let r = f.journal.read_global(0, 100).await.map(|_| ());
    assert!(
        matches!(&r, Err(Error::Corrupt { stream, seq, .. }) if *stream == s && seq.get() == 3),
        "a read over a damaged event: {r:?}"
    );
    assert_eq!(
        f.journal.read_global(all[3].global_position, 100).await.unwrap(),
        all[4..],
        "a read past the damaged event still works"
    );
}
