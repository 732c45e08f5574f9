//! The crash between the projection commit and the outbox row delete: the
//! two files cannot commit together, so the worker dies after `apply`
//! committed and before `complete`. After reopening both files, a drain
//! removes the row and nothing is applied twice.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::test_options;
use outbox_core::{
    AppendOptions, AppendRequest, ApplyOutcome, EventJournal, ExpectedVersion, LeaseStore, OutboxInspector,
    OutboxQueue, Projection, ProjectionStore, RetryPolicy, WorkerId,
};
use outbox_sqlite::SqliteTx;
use outbox_sqlite::{SqliteJournal, SqliteProjectionStore};
use outbox_testkit::{Expected, OracleProjection, add, check_history, drain, read_state, sid};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_projection_commit_before_row_delete() {
    let dir = tempfile::tempdir().unwrap();
    let jpath = dir.path().join("journal.db");
    let ppath = dir.path().join("projections.db");
    let oracle: Arc<dyn Projection<SqliteTx>> = OracleProjection::new("oracle").shared();
    let projections = vec![oracle.clone()];
    let s = sid("s");
    let policy = RetryPolicy::default();

    {
        let journal = SqliteJournal::open(&jpath, test_options()).await.unwrap();
        let store = SqliteProjectionStore::open(&ppath, test_options()).await.unwrap();
        store.setup(&projections).await.unwrap();
        journal
            .append(
                &[AppendRequest::new(
                    s.clone(),
                    ExpectedVersion::NoStream,
                    vec![add(1), add(2)],
                )],
                AppendOptions::enqueue(),
            )
            .await
            .unwrap();
        // Apply some events normally.
        let first = WorkerId::new("first").unwrap();
        drain(&journal, &store, &projections, &first, 8, &policy, 10)
            .await
            .unwrap();
        assert_eq!(journal.summary().await.unwrap().total(), 0);

        // One more: claimed, applied and committed to the projection file...
        journal
            .append(
                &[AppendRequest::new(
                    s.clone(),
                    ExpectedVersion::Exact(2),
                    vec![add(4)],
                )],
                AppendOptions::enqueue(),
            )
            .await
            .unwrap();
        let doomed = WorkerId::new("doomed").unwrap();
        let lease = journal
            .acquire(&s, &doomed, Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        let rows = journal.claim(&lease, 8).await.unwrap();
        assert_eq!(rows.len(), 1);
        let events = journal.read_stream(&s, rows[0].seq, 1).await.unwrap();
        let out = store.apply(&s, &events, &projections).await.unwrap();
        assert!(matches!(out, ApplyOutcome::Applied(r) if r.applied == 1));
        // ...and the process dies here: no complete, no release.
        journal.close().await;
        store.close().await;
    }

    // Restart: new instances from the files.
    let journal = SqliteJournal::open(&jpath, test_options()).await.unwrap();
    let store = SqliteProjectionStore::open(&ppath, test_options()).await.unwrap();
    let row = journal
        .row(&s, outbox_core::Seq::new(3).unwrap())
        .await
        .unwrap()
        .expect("row survives the crash");
    assert_eq!(row.status, outbox_core::OutboxStatus::Processing);
    // The dead worker's lease still blocks the stream until it expires.
    assert!(journal.due_streams(10).await.unwrap().is_empty());
    journal
        .advance_clock_for_tests(Duration::from_secs(31))
        .await
        .unwrap();
    assert_eq!(journal.due_streams(10).await.unwrap(), vec![s.clone()]);

    let second = WorkerId::new("second").unwrap();
    let stats = drain(&journal, &store, &projections, &second, 8, &policy, 10)
        .await
        .unwrap();
    assert_eq!(stats.completed, 1, "the stale row is completed");
    assert_eq!(journal.summary().await.unwrap().total(), 0, "the row is removed");

    let state = read_state(&store, "oracle").await.expect("oracle state");
    let expected = BTreeMap::from([(s.to_string(), Expected { through: 3, sum: 7 })]);
    check_history(&state, &expected, &BTreeMap::new()).expect("no double apply");
    assert_eq!(store.checkpoint(oracle.name(), &s).await.unwrap(), 3);
}
