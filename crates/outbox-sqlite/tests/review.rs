//! Regression tests from reviewing the adapter against the contracts.

mod common;

use outbox_core::OutboxQueueExt as _;
use std::sync::Arc;

use common::test_options;
use std::time::Duration;

use outbox_core::{
    AppendOptions, AppendRequest, BoxError, ClaimedRun, DigestBuilder, EventJournal, ExpectedVersion,
    OutboxQueue, Partition, PartitionStore, Projection, ProjectionName, ProjectionStore, RetryPolicy, Seq,
    SweepLimits, WorkerId,
};
use outbox_sqlite::SqliteTx;
use outbox_sqlite::{SqliteJournal, SqliteProjectionStore, digest_table};
use outbox_testkit::{add, sid};

/// How the applier misbehaves after writing its row.
#[derive(Clone, Copy)]
enum Sabotage {
    /// A statement that makes SQLite roll the whole transaction back
    /// (`INSERT OR ROLLBACK` on a conflict), its error swallowed.
    RollbackAndSwallow,
    /// The applier commits the store's transaction itself.
    Commit,
    /// None: a well-behaved projection.
    None,
}

struct Saboteur(ProjectionName, Sabotage);

#[outbox_core::async_trait]
impl Projection<SqliteTx> for Saboteur {
    fn name(&self) -> &ProjectionName {
        &self.0
    }
    async fn setup(&self, tx: &mut SqliteTx) -> Result<(), BoxError> {
        tx.run(|conn| conn.execute_batch("CREATE TABLE IF NOT EXISTS written (seq INTEGER PRIMARY KEY)"))
            .await?;
        Ok(())
    }
    async fn apply(&self, tx: &mut SqliteTx, e: &outbox_core::Event) -> Result<(), BoxError> {
        let (seq, sabotage) = (e.seq.as_i64(), self.1);
        tx.run(move |conn| {
            conn.execute("INSERT INTO written (seq) VALUES (?1)", [seq])?;
            match sabotage {
                Sabotage::RollbackAndSwallow => {
                    let r = conn.execute("INSERT OR ROLLBACK INTO written (seq) VALUES (?1)", [seq]);
                    assert!(r.is_err(), "the conflicting insert fails");
                }
                Sabotage::Commit => conn.execute_batch("COMMIT")?,
                Sabotage::None => {}
            }
            Ok(())
        })
        .await?;
        Ok(())
    }
    async fn reset(&self, tx: &mut SqliteTx) -> Result<(), BoxError> {
        let sabotage = self.1;
        tx.run(move |conn| {
            conn.execute_batch("DELETE FROM written")?;
            if let Sabotage::RollbackAndSwallow = sabotage {
                // Make SQLite roll the transaction back, and swallow the error.
                conn.execute_batch("INSERT INTO written (seq) VALUES (-1)")?;
                let r = conn.execute_batch("INSERT OR ROLLBACK INTO written (seq) VALUES (-1)");
                assert!(r.is_err(), "the conflicting insert fails");
            }
            Ok(())
        })
        .await?;
        Ok(())
    }
    async fn digest(&self, tx: &mut SqliteTx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        Ok(digest_table(tx, "written", out).await?)
    }
}

async fn written(store: &SqliteProjectionStore) -> Vec<i64> {
    store
        .read(|conn| {
            conn.prepare("SELECT seq FROM written ORDER BY seq")?
                .query_map([], |r| r.get(0))?
                .collect()
        })
        .await
        .unwrap()
}

/// A checkpoint must never commit without the projection writes of its
/// events: if an applier ends the store's transaction behind its back (SQLite
/// rolled it back, or the applier committed), `apply` fails, the checkpoint
/// stays where it was, and the store stays usable.
async fn apply_survives(sabotage: Sabotage) {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(dir.path().join("j.db"), test_options())
        .await
        .unwrap();
    let store = SqliteProjectionStore::open(dir.path().join("p.db"), test_options())
        .await
        .unwrap();
    let name = ProjectionName::new("saboteur").unwrap();
    let p: Arc<dyn Projection<SqliteTx>> = Arc::new(Saboteur(name.clone(), sabotage));
    store.setup(std::slice::from_ref(&p)).await.unwrap();
    let s = sid("s");
    journal
        .append(
            &[AppendRequest::new(
                s.clone(),
                ExpectedVersion::Any,
                vec![add(1), add(2)],
            )],
            AppendOptions::enqueue(),
        )
        .await
        .unwrap();
    let events = journal.read_stream(&s, Seq::FIRST, 10).await.unwrap();

    let r = store.apply(&s, &events[..1], std::slice::from_ref(&p)).await;
    let cp = store.checkpoint(&name, &s).await.unwrap();
    let rows = written(&store).await;
    match sabotage {
        Sabotage::RollbackAndSwallow => {
            assert!(r.is_err(), "the apply must fail: {r:?}");
            assert_eq!(
                (cp, rows),
                (0, vec![]),
                "no checkpoint without its projection writes"
            );
        }
        Sabotage::None => unreachable!("only saboteurs are tested here"),
        Sabotage::Commit => {
            // The applier's own COMMIT made its row durable; what must not
            // happen is the checkpoint committing outside the transaction.
            assert!(r.is_err(), "the apply must fail: {r:?}");
            assert_eq!(cp, 0, "the checkpoint did not move outside the transaction");
        }
    }

    // The writer connection is still usable afterwards.
    let ok: Arc<dyn Projection<SqliteTx>> = outbox_testkit::OracleProjection::new("oracle").shared();
    store.setup(std::slice::from_ref(&ok)).await.expect("setup after");
    store
        .apply(&s, &events, std::slice::from_ref(&ok))
        .await
        .expect("a later apply works");
    let st = outbox_testkit::read_state(&store, "oracle")
        .await
        .expect("oracle state");
    assert_eq!(st.streams["s"].seqs, [1, 2]);
}

#[tokio::test]
async fn apply_refuses_a_transaction_rolled_back_by_an_applier() {
    apply_survives(Sabotage::RollbackAndSwallow).await;
}

#[tokio::test]
async fn apply_refuses_a_transaction_committed_by_an_applier() {
    apply_survives(Sabotage::Commit).await;
}

/// `reset` clears the projection and its checkpoints in one transaction: if
/// `Projection::reset` made SQLite roll that transaction back, the checkpoints
/// must not be deleted on their own (a replay would then apply every event a
/// second time onto the rows that are still there).
#[tokio::test]
async fn reset_refuses_a_transaction_rolled_back_by_the_projection() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(dir.path().join("j.db"), test_options())
        .await
        .unwrap();
    let store = SqliteProjectionStore::open(dir.path().join("p.db"), test_options())
        .await
        .unwrap();
    let name = ProjectionName::new("saboteur").unwrap();
    let p: Arc<dyn Projection<SqliteTx>> = Arc::new(Saboteur(name.clone(), Sabotage::RollbackAndSwallow));
    store.setup(std::slice::from_ref(&p)).await.unwrap();
    let s = sid("s");
    journal
        .append(
            &[AppendRequest::new(s.clone(), ExpectedVersion::Any, vec![add(1)])],
            AppendOptions::enqueue(),
        )
        .await
        .unwrap();
    let events = journal.read_stream(&s, Seq::FIRST, 10).await.unwrap();
    let good: Arc<dyn Projection<SqliteTx>> = Arc::new(Saboteur(name.clone(), Sabotage::None));
    store
        .apply(&s, &events, std::slice::from_ref(&good))
        .await
        .expect("apply");
    assert_eq!(
        (store.checkpoint(&name, &s).await.unwrap(), written(&store).await),
        (1, vec![1])
    );
    let r = store.reset(p.as_ref()).await;
    assert!(r.is_err(), "the reset must fail: {r:?}");
    assert_eq!(
        (store.checkpoint(&name, &s).await.unwrap(), written(&store).await),
        (1, vec![1]),
        "neither the rows nor the checkpoint were cleared"
    );
    store.reset(good.as_ref()).await.expect("a later reset works");
    assert_eq!(
        (store.checkpoint(&name, &s).await.unwrap(), written(&store).await),
        (0, vec![])
    );
}

/// The journal's writer connection recovers when a caller's transaction from
/// A caller's transaction (`SqliteJournal::transaction`) that SQLite ended
/// by itself (here: `INSERT OR ROLLBACK` on a conflict, error swallowed)
/// fails at its commit, and later writes work instead of failing.
#[tokio::test]
async fn journal_writer_survives_a_transaction_ended_behind_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(dir.path().join("j.db"), test_options())
        .await
        .unwrap();
    let append = || async {
        journal
            .append(
                &[AppendRequest::new(sid("s"), ExpectedVersion::Any, vec![add(1)])],
                AppendOptions::enqueue(),
            )
            .await
    };
    append().await.expect("first append");
    let ended = journal
        .transaction(|tx| {
            let r = tx.conn().execute(
                "INSERT OR ROLLBACK INTO outbox_meta (key, value) VALUES ('role', 'x')",
                [],
            );
            assert!(r.is_err(), "the conflicting insert fails and SQLite rolls back");
            Ok::<(), outbox_core::Error>(())
        })
        .await;
    let err = ended.expect_err("the commit finds no transaction");
    assert!(err.to_string().contains("had already ended"), "{err}");
    append().await.expect("a later append works");
    assert_eq!(journal.stream_version(&sid("s")).await.unwrap(), 2);
}

/// A journal with runs of two events on `good` and on `bad`, whose second
/// event no longer decodes (its stored payload hash is one byte).
async fn journal_with_an_undecodable_run(dir: &std::path::Path) -> SqliteJournal {
    let journal = journal_with_two_events_in(dir, ["good", "bad"]).await;
    journal
        .transaction(|tx| {
            tx.conn()
                .execute(
                    "UPDATE events SET payload_hash = x'00' WHERE stream = 'bad' AND seq = 2",
                    [],
                )
                .expect("damage the hash");
            Ok::<(), outbox_core::Error>(())
        })
        .await
        .unwrap();
    journal
}

/// A journal in `dir` with two events appended to each of `streams`.
async fn journal_with_two_events_in(dir: &std::path::Path, streams: [&str; 2]) -> SqliteJournal {
    let journal = SqliteJournal::open(dir.join("j.db"), test_options())
        .await
        .unwrap();
    for s in streams {
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
    journal
}

/// Checks what a loading claim returned from [`journal_with_an_undecodable_run`].
async fn assert_good_loaded_bad_left_unread(journal: &SqliteJournal, loaded: &[ClaimedRun]) {
    let run = |name: &str| {
        loaded
            .iter()
            .find(|r| r.lease.stream == sid(name))
            .unwrap_or_else(|| panic!("{name} was claimed: {loaded:?}"))
    };
    let good = journal.read_stream(&sid("good"), Seq::FIRST, 10).await.unwrap();
    assert_eq!(good.len(), 2);
    assert_eq!(
        run("good").events.as_ref(),
        Some(&good),
        "the claim read good's run"
    );
    assert_eq!(run("bad").rows.len(), 2, "bad's run is claimed all the same");
    assert_eq!(
        run("bad").events,
        None,
        "bad's run is left to the worker's own read, which records the fault"
    );
}

/// SQLite's sweep claims read the runs' events once the claim has
/// committed; a run whose events do not decode comes back unread instead
/// of failing the claim (which would stop every stream).
#[tokio::test]
async fn sweep_claims_read_their_runs_and_leave_undecodable_ones_unread() {
    let limits = SweepLimits {
        streams: 10,
        per_stream: 10,
        rows: 100,
    };
    let ttl = Duration::from_secs(30);
    let dir = tempfile::tempdir().unwrap();
    let journal = journal_with_an_undecodable_run(dir.path()).await;
    let loaded = journal
        .take(&WorkerId::new("w").unwrap(), ttl, outbox_core::Take::Due(limits))
        .await
        .unwrap();
    assert_good_loaded_bad_left_unread(&journal, &loaded).await;

    let dir = tempfile::tempdir().unwrap();
    let journal = journal_with_an_undecodable_run(dir.path()).await;
    let owner = WorkerId::new("w").unwrap();
    let all: Vec<Partition> = Partition::all(journal.partitioning().count()).collect();
    journal.sync_partitions(&owner, &all, ttl).await.unwrap();
    let loaded = journal
        .claim_and_load_partitioned(&owner, ttl, limits)
        .await
        .unwrap();
    assert_good_loaded_bad_left_unread(&journal, &loaded).await;
}

/// A sweep claim reads only fresh runs: a run with a row that failed before
/// goes alone in the worker, which reads it there, so reading it on the
/// journal's writer thread would be work thrown away.
#[tokio::test]
async fn sweep_claims_leave_retried_runs_unread() {
    let limits = SweepLimits {
        streams: 10,
        per_stream: 10,
        rows: 100,
    };
    let (ttl, owner) = (Duration::from_secs(30), WorkerId::new("w").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let journal = journal_with_two_events_in(dir.path(), ["fresh", "retried"]).await;
    let first = journal
        .take(&owner, ttl, outbox_core::Take::Due(limits))
        .await
        .unwrap();
    assert_eq!(first.len(), 2, "both streams are claimed: {first:?}");
    let policy = RetryPolicy::new(Duration::from_secs(1), Duration::from_secs(1), 10).unwrap();
    for run in &first {
        if run.lease.stream == sid("retried") {
            journal
                .fail(&run.lease, Seq::FIRST, "boom", &policy)
                .await
                .unwrap();
        }
        journal
            .complete_and_release(&run.lease, None, true)
            .await
            .unwrap();
    }
    journal
        .advance_clock_for_tests(Duration::from_secs(60))
        .await
        .unwrap();

    let second = journal
        .take(&owner, ttl, outbox_core::Take::Due(limits))
        .await
        .unwrap();
    let run = |name: &str| {
        second
            .iter()
            .find(|r| r.lease.stream == sid(name))
            .unwrap_or_else(|| panic!("{name} was claimed again: {second:?}"))
    };
    assert_eq!(run("retried").rows[0].attempt_count, 1);
    assert_eq!(run("retried").events, None, "a retried run is left to the worker");
    assert_eq!(
        run("fresh").events.as_ref().map(Vec::len),
        Some(2),
        "a fresh run is read as before"
    );
}
