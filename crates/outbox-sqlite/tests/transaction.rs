//! The application's own transaction on the journal file
//! (`SqliteJournal::transaction`): its writes and its appends commit or roll
//! back together, on the journal's one writer connection.

mod common;

use common::test_options;
use outbox_core::{AppendOptions, AppendRequest, Error, EventJournal, ExpectedVersion, OutboxQueue, Result};
use outbox_sqlite::SqliteJournal;
use outbox_sqlite::rusqlite;
use outbox_testkit::{add, sid};

fn one(stream: &str, expected: ExpectedVersion) -> Vec<AppendRequest> {
    vec![AppendRequest::new(sid(stream), expected, vec![add(1)])]
}

fn storage(e: rusqlite::Error) -> Error {
    Error::storage("the application's statement", e)
}

/// A journal with the application's own table `orders`.
async fn journal_with_orders(dir: &std::path::Path) -> SqliteJournal {
    let journal = SqliteJournal::open(dir.join("j.db"), test_options())
        .await
        .expect("open");
    journal
        .transaction(|tx| {
            tx.conn()
                .execute_batch("CREATE TABLE orders (id TEXT PRIMARY KEY)")
                .map_err(storage)
        })
        .await
        .expect("create the application's table");
    journal
}

async fn orders(journal: &SqliteJournal) -> Vec<String> {
    journal
        .transaction(|tx| {
            let mut st = tx
                .conn()
                .prepare("SELECT id FROM orders ORDER BY id")
                .map_err(storage)?;
            st.query_map([], |r| r.get(0))
                .and_then(Iterator::collect)
                .map_err(storage)
        })
        .await
        .expect("read orders")
}

#[tokio::test]
async fn the_applications_writes_and_its_append_commit_together() {
    let dir = tempfile::tempdir().unwrap();
    let journal = journal_with_orders(dir.path()).await;
    let appended = journal
        .transaction(|tx| {
            tx.conn()
                .execute("INSERT INTO orders (id) VALUES ('o-1')", [])
                .map_err(storage)?;
            tx.append(
                &one("order-1", ExpectedVersion::NoStream),
                AppendOptions::enqueue(),
            )
        })
        .await
        .expect("commit");
    assert_eq!(appended[0].last_seq.get(), 1);
    assert_eq!(orders(&journal).await, ["o-1"]);
    assert_eq!(journal.stream_version(&sid("order-1")).await.unwrap(), 1);
    assert_eq!(
        journal.due_streams(10).await.unwrap(),
        [sid("order-1")],
        "enqueued"
    );
}

#[tokio::test]
async fn an_error_or_a_panic_in_the_body_writes_nothing_and_the_journal_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let journal = journal_with_orders(dir.path()).await;
    let failed: Result<()> = journal
        .transaction(|tx| {
            tx.conn()
                .execute("INSERT INTO orders (id) VALUES ('o-1')", [])
                .map_err(storage)?;
            tx.append(&one("order-1", ExpectedVersion::Any), AppendOptions::enqueue())?;
            Err(Error::invalid("the application changed its mind"))
        })
        .await;
    assert!(
        failed.unwrap_err().to_string().contains("changed its mind"),
        "the body's own error comes back"
    );
    let panicked: Result<()> = journal
        .transaction(|tx| {
            tx.append(&one("order-2", ExpectedVersion::Any), AppendOptions::enqueue())?;
            panic!("a bug in the body");
        })
        .await;
    let err = panicked.expect_err("a panic is an error");
    assert!(err.to_string().contains("a bug in the body"), "{err}");
    assert!(orders(&journal).await.is_empty(), "no order committed");
    for s in ["order-1", "order-2"] {
        assert_eq!(
            journal.stream_version(&sid(s)).await.unwrap(),
            0,
            "{s} not appended"
        );
    }
    assert!(
        journal.due_streams(10).await.unwrap().is_empty(),
        "nothing enqueued"
    );
    journal
        .append(&one("after", ExpectedVersion::Any), AppendOptions::enqueue())
        .await
        .expect("the writer goes on");
}

/// A failed append inside the transaction (a version conflict) writes none
/// of its batch, and the rest of the transaction still commits.
#[tokio::test]
async fn a_conflicting_append_leaves_the_transaction_usable() {
    let dir = tempfile::tempdir().unwrap();
    let journal = journal_with_orders(dir.path()).await;
    journal
        .append(&one("taken", ExpectedVersion::Any), AppendOptions::enqueue())
        .await
        .unwrap();
    let conflict = journal
        .transaction(|tx| {
            tx.conn()
                .execute("INSERT INTO orders (id) VALUES ('o-1')", [])
                .map_err(storage)?;
            let batch = vec![
                AppendRequest::new(sid("fresh"), ExpectedVersion::Any, vec![add(1)]),
                AppendRequest::new(sid("taken"), ExpectedVersion::NoStream, vec![add(2)]),
            ];
            let conflict = tx
                .append(&batch, AppendOptions::enqueue())
                .expect_err("taken exists");
            let left: Option<i64> = tx
                .conn()
                .query_row("SELECT max(seq) FROM events WHERE stream = 'fresh'", [], |r| {
                    r.get(0)
                })
                .map_err(storage)?;
            Ok::<_, Error>((conflict, left))
        })
        .await
        .expect("the rest commits");
    assert!(matches!(conflict.0, Error::Conflict { .. }), "{:?}", conflict.0);
    assert_eq!(conflict.1, None, "nothing of the failed batch was written");
    assert_eq!(orders(&journal).await, ["o-1"]);
    assert_eq!(journal.stream_version(&sid("fresh")).await.unwrap(), 0);
    assert_eq!(journal.stream_version(&sid("taken")).await.unwrap(), 1);
}

#[tokio::test]
async fn a_read_only_journal_refuses_a_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let journal = journal_with_orders(dir.path()).await;
    journal.close().await;
    let read_only = SqliteJournal::open(dir.path().join("j.db"), test_options().with_read_only(true))
        .await
        .expect("open read-only");
    let err = read_only
        .transaction(|tx| {
            tx.conn()
                .execute("INSERT INTO orders (id) VALUES ('o-1')", [])
                .map_err(storage)
        })
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("read-only"), "{err}");
}
