//! Issue 16 item 5: a journal file locked by another process for longer
//! than the busy timeout. Every write of the store fails with a *temporary*
//! storage error (never permanent, never a hang), nothing is written, and
//! the same open store writes again once the lock is released: the worker
//! (which retries temporary errors on its next pass) and `start()` (which
//! retries them for `OUTBOX_START_RETRY_MS`) ride it out.
//!
//! A file that is temporarily unreadable (`SQLITE_CANTOPEN`, `SQLITE_IOERR`)
//! is classified temporary too, but cannot be provoked here: the tests run
//! as root, for whom permission bits do not stop reads, and an open store
//! keeps its file descriptors whatever happens to the permissions.

mod common;

use std::time::Duration;

use common::test_options;
use outbox_core::{
    AppendOptions, AppendRequest, EventJournal, EventType, ExpectedVersion, Intent, NewEvent, WorkerRegistry,
};
use outbox_sqlite::SqliteJournal;
use outbox_testkit::sid;
use sqlx::{self, Connection, SqliteConnection};

fn req(stream: &str) -> AppendRequest {
    AppendRequest::new(
        sid(stream),
        ExpectedVersion::Any,
        vec![NewEvent::new(
            EventType::new("e").unwrap(),
            Intent::Apply,
            b"1".to_vec(),
        )],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_locked_past_the_busy_timeout_is_a_temporary_error_and_writes_resume() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let journal = SqliteJournal::open(
        &path,
        test_options()
            .with_create_if_missing(true)
            .with_busy_timeout(Duration::from_millis(50)),
    )
    .await
    .unwrap();
    journal
        .append(&[req("s")], AppendOptions::enqueue())
        .await
        .unwrap();
    // "Another process": its own connection, holding the write lock.
    let mut other = SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("BEGIN EXCLUSIVE").execute(&mut other).await.unwrap();
    // An append (the engine's group commit, rusqlite) ...
    let e = journal
        .append(&[req("s")], AppendOptions::enqueue())
        .await
        .unwrap_err();
    assert!(e.is_temporary(), "busy past the timeout is temporary: {e:?}");
    assert!(!e.to_string().contains('\n'), "{e}");
    // ... and a heartbeat (a sqlx write) both fail temporarily.
    let w = outbox_core::WorkerId::new("w").unwrap();
    let e = journal
        .heartbeat(
            &w,
            "h",
            1,
            outbox_core::Mode::OutboxApplyOnly,
            Duration::from_secs(10),
        )
        .await
        .unwrap_err();
    assert!(e.is_temporary(), "busy past the timeout is temporary: {e:?}");
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    other.close().await.unwrap();
    // The same open store writes again; the failed appends wrote nothing.
    journal
        .append(&[req("s")], AppendOptions::enqueue())
        .await
        .unwrap();
    assert_eq!(journal.stream_version(&sid("s")).await.unwrap(), 2);
    journal
        .heartbeat(
            &w,
            "h",
            1,
            outbox_core::Mode::OutboxApplyOnly,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    journal.close().await;
}
