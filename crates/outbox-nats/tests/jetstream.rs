//! The JetStream sink against real `nats-server`s (see
//! `outbox_testkit::nats`): a server killed mid-stream and restarted loses
//! nothing, keeps each stream's order, and a consumer that dedupes by
//! message id sees each `stream:seq` once; a redelivered message id is
//! dropped by JetStream.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{ExpectedVersion, RetryPolicy, Sink, SinkName, SinkStore, StreamId};
use outbox_memory::{MemoryJournal, MemoryProjectionStore};
use outbox_nats::{NatsSink, NatsSinkOptions, Subjects};
use outbox_runtime::{Config, Outbox, TokioClock};
use outbox_testkit::nats::{NatsServer, test_nats_server, test_nats_url};
use outbox_testkit::{OracleProjection, add, oracle_registry, sid};

const STREAMS: usize = 20;
const PER_STREAM: u64 = 50;
const ROUNDS: u64 = 5;

/// The message id of every message of JetStream stream `name`, in the
/// stream's order.
async fn messages(sink: &NatsSink, name: &str) -> Vec<String> {
    let stream = sink
        .jetstream()
        .await
        .expect("connected")
        .get_stream(name)
        .await
        .expect("the stream exists");
    let info = stream.get_info().await.expect("stream info");
    let mut out = Vec::new();
    if info.state.messages == 0 {
        return out;
    }
    for seq in info.state.first_sequence..=info.state.last_sequence {
        let m = stream.get_raw_message(seq).await.expect("a stored message");
        let id = m
            .headers
            .get("Nats-Msg-Id")
            .expect("every message carries its id")
            .as_str()
            .to_owned();
        out.push(id);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_stream_and_restarted_loses_nothing_and_keeps_order() {
    let Some(bin) = test_nats_server() else { return };
    let mut server = NatsServer::start(bin);
    let sink = NatsSink::connect(
        SinkName::new("bus").unwrap(),
        &server.url(),
        NatsSinkOptions::default()
            .with_subjects(Subjects::ByEventType("outbox".into()))
            .with_ack_timeout(Duration::from_millis(500)),
    )
    .await
    .expect("connect");
    sink.ensure_stream("OUTBOX", vec!["outbox.>".into()], Duration::from_secs(120))
        .await
        .expect("stream");
    let clock = Arc::new(TokioClock::default());
    let journal = MemoryJournal::with_clock(clock.clone());
    let rt = Outbox::builder(journal.clone(), MemoryProjectionStore::with_clock(clock))
        .config(
            Config::apply_worker()
                .with_poll_interval(Duration::from_millis(50))
                .with_retry(
                    RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(1), 1000).unwrap(),
                ),
        )
        .event_types(oracle_registry())
        .projection(OracleProjection::new("oracle").shared())
        .sink(sink.clone())
        .build()
        .await
        .expect("runtime");
    let running = rt.start().await.unwrap();
    let streams: Vec<StreamId> = (0..STREAMS).map(|i| sid(&format!("s{i:02}"))).collect();
    let per_round = PER_STREAM / ROUNDS;
    let mut killed_at = None;
    for round in 0..ROUNDS {
        for s in &streams {
            let events = (0..per_round).map(|v| add(v as i64)).collect();
            rt.append(s, ExpectedVersion::Exact(round * per_round), events)
                .await
                .expect("append");
        }
        match round {
            // Mid-stream: some of this round is published, some is not.
            1 => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                server.kill();
                killed_at = Some(Instant::now());
            }
            // Down for a whole round of appends, then back.
            2 => {
                tokio::time::sleep(Duration::from_millis(700)).await;
                server.restart();
            }
            _ => {}
        }
    }
    let restarted = Instant::now();
    let total = STREAMS as u64 * PER_STREAM;
    loop {
        let states = journal.sink_states(sink.name(), &streams).await.unwrap();
        if states.iter().all(|s| s.seq == PER_STREAM) {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(120),
            "not every event was published within 120 s of the restart: {:?}",
            states
                .iter()
                .map(|s| (s.stream.to_string(), s.seq, s.status))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let caught_up = restarted.elapsed();
    running.shutdown().await;

    let ids = messages(&sink, "OUTBOX").await;
    // In order per stream, every event there.
    let mut per_stream: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for id in &ids {
        let (s, seq) = id.rsplit_once(':').expect("stream:seq");
        per_stream
            .entry(s.to_owned())
            .or_default()
            .push(seq.parse().unwrap());
    }
    for s in &streams {
        let got = per_stream.get(s.as_str()).cloned().unwrap_or_default();
        let mut first_seen = Vec::new();
        for seq in got {
            if !first_seen.contains(&seq) {
                first_seen.push(seq);
            }
        }
        assert_eq!(
            first_seen,
            (1..=PER_STREAM).collect::<Vec<_>>(),
            "stream {s}: every event, in order"
        );
    }
    // A consumer that drops repeated message ids sees each event once.
    let mut seen = BTreeSet::new();
    let delivered: Vec<&String> = ids.iter().filter(|id| seen.insert((*id).clone())).collect();
    assert_eq!(delivered.len() as u64, total, "each stream:seq once after dedupe");
    eprintln!(
        "nats-server killed {:?} into the run and restarted; {} messages in the stream for {total} events \
         ({} repeats JetStream kept), all published {caught_up:?} after the restart",
        killed_at.map(|k| k.elapsed()),
        ids.len(),
        ids.len() as u64 - total
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_message_id_is_dropped_by_jetstream() {
    let Some(url) = test_nats_url() else { return };
    // The shared server outlives this test: a stream of this run's own.
    let run = format!(
        "once_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    );
    // Lazy: it connects on first use, as an `outbox_cli::App`'s sink would.
    let sink = NatsSink::lazy(
        SinkName::new("once").unwrap(),
        &url,
        NatsSinkOptions::default().with_subjects(Subjects::Fixed(format!("{run}.events"))),
    )
    .expect("a valid subject");
    let stream_name = run.to_uppercase();
    sink.ensure_stream(&stream_name, vec![format!("{run}.>")], Duration::from_secs(120))
        .await
        .expect("stream");
    let clock = Arc::new(TokioClock::default());
    let journal = MemoryJournal::with_clock(clock.clone());
    let rt = Outbox::builder(journal.clone(), MemoryProjectionStore::with_clock(clock))
        .event_types(oracle_registry())
        .build()
        .await
        .expect("runtime");
    let s = sid("redelivered");
    rt.append(&s, ExpectedVersion::Any, vec![add(1), add(2)])
        .await
        .unwrap();
    let events = journal_events(&journal, &s).await;
    let first = sink.publish(&events).await;
    let again = sink.publish(&events).await;
    assert!(
        first.error.is_none() && again.error.is_none(),
        "{first:?} {again:?}"
    );
    assert_eq!((first.acknowledged, again.acknowledged), (2, 2));
    let ids = messages(&sink, &stream_name).await;
    let ours: Vec<&String> = ids.iter().filter(|i| i.starts_with("redelivered:")).collect();
    assert_eq!(
        ours,
        ["redelivered:1", "redelivered:2"],
        "the second publish was dropped"
    );
}

async fn journal_events(journal: &MemoryJournal, s: &StreamId) -> Vec<outbox_core::Event> {
    use outbox_core::EventJournal;
    journal
        .read_stream(s, outbox_core::Seq::FIRST, 100)
        .await
        .unwrap()
}

/// The lost-message reproduction on Postgres with the JetStream sink
/// (ADR 0030): `quiet:1` takes its global position in a transaction left
/// open, `busy:1` commits after it and a delivery pass runs, then `quiet:1`
/// commits. Both reach JetStream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_committed_after_a_later_one_was_published_reaches_jetstream_on_postgres() {
    use outbox_core::{AppendOptions, AppendRequest};
    use outbox_postgres::{PgJournal, PgOptions, PgProjectionStore};
    let Some(url) = test_nats_url() else { return };
    let Some(pg) = outbox_testkit::pg::test_database_url() else {
        return;
    };
    let run = format!(
        "late_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    );
    let sink = NatsSink::connect(
        SinkName::new("late").unwrap(),
        &url,
        NatsSinkOptions::default().with_subjects(Subjects::Fixed(format!("{run}.events"))),
    )
    .await
    .expect("connect");
    let stream_name = run.to_uppercase();
    sink.ensure_stream(&stream_name, vec![format!("{run}.>")], Duration::from_secs(120))
        .await
        .expect("stream");
    let options = |schema: &str| PgOptions::default().with_schema(schema).with_max_connections(4);
    let journal = PgJournal::connect(&pg, options(&format!("{run}_j")))
        .await
        .expect("journal");
    let store = PgProjectionStore::connect(&pg, options(&format!("{run}_p")))
        .await
        .expect("projections");
    let rt = Outbox::builder(journal.clone(), store)
        .config(
            Config::apply_worker()
                .with_leasing(false)
                .with_repair_on_start(false),
        )
        .event_types(oracle_registry())
        .projection(OracleProjection::new("oracle").shared())
        .sink(sink.clone())
        .build()
        .await
        .expect("runtime");
    let mut t1 = journal.begin().await.unwrap();
    journal
        .append_in(
            &mut t1,
            &[AppendRequest::new(
                sid("quiet"),
                ExpectedVersion::Any,
                vec![add(1)],
            )],
            AppendOptions::enqueue(),
        )
        .await
        .unwrap();
    rt.append(&sid("busy"), ExpectedVersion::Any, vec![add(2)])
        .await
        .unwrap();
    rt.deliver().await.unwrap();
    t1.commit().await.unwrap();
    let want = ["busy:1".to_owned(), "quiet:1".to_owned()];
    // Other tests' transactions on the server may hold the scan back a
    // moment; they never make it skip anything.
    let mut got = Vec::new();
    for _ in 0..3_000 {
        rt.deliver().await.unwrap();
        got = messages(&sink, &stream_name).await;
        got.sort();
        if got == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(got, want, "both events published, each once");
    journal.close().await;
    // The test's schemas, test-generated names only.
    if let Ok(mut conn) =
        <outbox_postgres::sqlx::PgConnection as outbox_postgres::sqlx::Connection>::connect(&pg).await
    {
        for s in [format!("{run}_j"), format!("{run}_p")] {
            let _ = outbox_postgres::sqlx::query(outbox_postgres::sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {s} CASCADE"
            )))
            .execute(&mut conn)
            .await;
        }
    }
}
