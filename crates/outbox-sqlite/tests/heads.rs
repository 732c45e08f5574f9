//! The materialized heads stay exact: after every write path (append,
//! claim, complete, fail, dead_letter, abandon, requeue, requeue_dead,
//! release) on random schedules, `outbox_heads` equals the heads recomputed
//! from the outbox rows. Seeded; rerun with `OUTBOX_TEST_SEED`.

mod common;

use outbox_core::OutboxQueueExt as _;
use std::time::Duration;

use common::test_options;
use outbox_core::{
    AppendOptions, AppendRequest, DeadLetters, EventJournal, ExpectedVersion, LeaseStore, OutboxInspector,
    OutboxQueue, OutboxStatus, RetryPolicy, WorkerId,
};
use outbox_sqlite::SqliteJournal;
use outbox_testkit::{Seed, add, stream_ids};
use sqlx::{self, ConnectOptions, SqliteConnection, sqlite::SqliteConnectOptions};

type Head = (String, i64, Option<i64>);

async fn stored_heads(conn: &mut SqliteConnection) -> Vec<Head> {
    sqlx::query_as("SELECT stream, head_seq, due_at FROM outbox_heads ORDER BY stream")
        .fetch_all(&mut *conn)
        .await
        .unwrap()
}

async fn recomputed_heads(conn: &mut SqliteConnection) -> Vec<Head> {
    sqlx::query_as(
        "SELECT o.stream, o.seq, CASE WHEN o.status = 'dead' THEN NULL ELSE o.next_attempt_at END \
         FROM outbox o WHERE o.seq = (SELECT MIN(seq) FROM outbox WHERE stream = o.stream) ORDER BY o.stream",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_match_the_rows_after_every_write_path() {
    let seed = Seed::pick("heads_match_the_rows_after_every_write_path");
    let mut rng = seed.rng();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let j = SqliteJournal::open(&path, test_options()).await.unwrap();
    let mut check = SqliteConnectOptions::new()
        .filename(&path)
        .read_only(true)
        .connect()
        .await
        .unwrap();
    let streams = stream_ids("s", 4);
    let owners = [WorkerId::new("a").unwrap(), WorkerId::new("b").unwrap()];
    let policy = RetryPolicy::default()
        .with_dead_letter_after(3)
        .expect("valid policy");
    let ttl = Duration::from_secs(10);
    for step in 0..400 {
        let s = &streams[rng.below(streams.len() as u64) as usize];
        let who = &owners[rng.below(2) as usize];
        let op = rng.below(10);
        match op {
            0 | 1 => {
                let n = 1 + rng.below(4) as usize;
                j.append(
                    &[AppendRequest::new(
                        s.clone(),
                        ExpectedVersion::Any,
                        (0..n).map(|i| add(i as i64)).collect(),
                    )],
                    AppendOptions::enqueue(),
                )
                .await
                .unwrap();
            }
            2..=5 => {
                let Some(lease) = j.acquire(s, who, ttl).await.unwrap() else {
                    continue;
                };
                let rows = j.claim(&lease, 1 + rng.below(4) as usize).await.unwrap();
                if let Some(last) = rows.last() {
                    match rng.below(5) {
                        0 => {
                            j.complete(s, last.seq).await.unwrap();
                        }
                        1 => {
                            j.fail(&lease, rows[0].seq, "boom", &policy).await.unwrap();
                            j.complete_and_release(&lease, None, true).await.unwrap();
                        }
                        2 => {
                            let at_once = outbox_core::RetryPolicy::new(
                                Duration::from_millis(1),
                                Duration::from_millis(1),
                                1,
                            )
                            .unwrap();
                            j.fail(&lease, last.seq, "poison", &at_once).await.unwrap();
                        }
                        3 => {
                            j.complete_and_release(&lease, None, true).await.unwrap();
                        }
                        _ => {} // crash: rows stay processing
                    }
                }
                if rng.below(2) == 0 {
                    j.release(&lease).await.unwrap();
                }
            }
            6 => {
                let dead = j.list(Some(OutboxStatus::Dead), 10).await.unwrap();
                if let Some(r) = dead.get(rng.below(dead.len().max(1) as u64) as usize) {
                    j.requeue(&r.stream, r.seq).await.unwrap();
                }
            }
            7 => {
                j.requeue_dead(1 + rng.below(3) as usize).await.unwrap();
            }
            8 => {
                let head = j.stream_version(s).await.unwrap();
                if head > 0 {
                    let through = outbox_core::Seq::new(1 + rng.below(head)).unwrap();
                    j.complete(s, through).await.unwrap();
                }
            }
            _ => {
                j.advance_clock_for_tests(Duration::from_millis(rng.below(20_000)))
                    .await
                    .unwrap();
            }
        }
        assert_eq!(
            stored_heads(&mut check).await,
            recomputed_heads(&mut check).await,
            "step {step} (op {op}, seed {})",
            seed.0
        );
    }
}
