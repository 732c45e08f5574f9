//! The clock a store's statements read is chosen when it opens: SQLite's
//! own, unless a test opens the store with the test clock.

use std::time::Duration;

use outbox_core::{AppendOptions, AppendRequest, Error, EventJournal as _, ExpectedVersion, StreamId};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};
use outbox_testkit::add;

#[tokio::test]
async fn a_store_opened_without_the_test_clock_refuses_to_move_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = SqliteJournal::open(dir.path().join("j.db"), SqliteOptions::default())
        .await
        .expect("journal");
    let store = SqliteProjectionStore::open(dir.path().join("p.db"), SqliteOptions::default())
        .await
        .expect("projections");
    for moved in [
        journal.advance_clock_for_tests(Duration::from_secs(60)).await,
        store.advance_clock_for_tests(Duration::from_secs(60)).await,
    ] {
        match moved {
            Err(Error::Config(m)) => assert!(m.contains("with_test_clock"), "{m}"),
            other => panic!("moved a production clock: {other:?}"),
        }
    }
}

#[tokio::test]
async fn every_instance_with_the_test_clock_sees_it_moved() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("j.db");
    let options = SqliteOptions::default().with_test_clock();
    let first = SqliteJournal::open(&path, options.clone())
        .await
        .expect("journal");
    let second = SqliteJournal::open(&path, options)
        .await
        .expect("second instance");
    first
        .advance_clock_for_tests(Duration::from_secs(3_600))
        .await
        .expect("advance");
    // The second instance's append is recorded at the moved time.
    let appended = second
        .append(
            &[AppendRequest::new(
                StreamId::new("s-1").expect("stream"),
                ExpectedVersion::Any,
                vec![add(1)],
            )],
            AppendOptions::enqueue(),
        )
        .await
        .expect("append");
    let at = appended[0].recorded_at.as_millis();
    assert!(at >= wall_ms() + 3_000_000, "recorded at {at}, not an hour ahead");
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
