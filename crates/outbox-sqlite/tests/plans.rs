//! Hot-path statements are index seeks on the bundled SQLite, never scans of
//! the backlog (the schema's indexes are what make that true; this test
//! fails if one goes missing or the planner stops using it).

mod common;

use common::test_options;
use outbox_sqlite::SqliteJournal;
use sqlx::{self, ConnectOptions, sqlite::SqliteConnectOptions};

const HOT: &[(&str, &str)] = &[
    (
        "due_streams",
        "SELECT h.stream FROM outbox_heads h LEFT JOIN stream_leases l ON l.stream = h.stream \
         WHERE h.due_at IS NOT NULL AND h.due_at <= 5 AND (l.owner IS NULL OR l.expires_at <= 5) \
         ORDER BY h.due_at, h.stream LIMIT 10",
    ),
    (
        "due heads of all partitions",
        "SELECT h.stream, h.due_at, h.partition_no, (l.owner IS NULL OR l.owner = 'w' OR l.expires_at <= 5) \
         FROM outbox_heads h INDEXED BY outbox_heads_by_due LEFT JOIN stream_leases l ON l.stream = h.stream \
         WHERE h.due_at IS NOT NULL AND h.due_at <= 5 ORDER BY h.due_at, h.stream LIMIT 40",
    ),
    (
        "claim run",
        "SELECT seq, status, next_attempt_at <= 5 FROM outbox WHERE stream = 'x' ORDER BY seq LIMIT 64",
    ),
    (
        "claim update",
        "UPDATE outbox SET status = 'processing', updated_at = 5 WHERE stream = 'x' AND seq BETWEEN 1 AND 4",
    ),
    (
        "abandon",
        "UPDATE outbox SET status = 'pending', updated_at = 5 \
         WHERE stream = 'x' AND status = 'processing' AND seq < coalesce( \
         (SELECT seq FROM outbox WHERE stream = 'x' AND status = 'pending' ORDER BY seq LIMIT 1), \
         9223372036854775807)",
    ),
    ("complete", "DELETE FROM outbox WHERE stream = 'x' AND seq <= 9"),
    (
        "refresh head",
        "INSERT INTO outbox_heads (stream, head_seq, due_at) SELECT stream, seq, \
         CASE WHEN status = 'dead' THEN NULL ELSE next_attempt_at END FROM outbox WHERE stream = 'x' \
         ORDER BY seq LIMIT 1 ON CONFLICT (stream) DO UPDATE SET head_seq = excluded.head_seq, \
         due_at = excluded.due_at",
    ),
    ("stream version", "SELECT max(seq) FROM events WHERE stream = 'x'"),
    (
        "requeue_dead",
        "SELECT stream, seq FROM outbox WHERE status = 'dead' ORDER BY next_attempt_at, stream, seq LIMIT 5",
    ),
    (
        "read_stream",
        "SELECT * FROM events WHERE stream = 'x' AND seq >= 3 ORDER BY seq LIMIT 10",
    ),
];

/// A new journal file, closed, and a plain connection to it.
async fn fresh_journal() -> (tempfile::TempDir, sqlx::SqliteConnection) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    SqliteJournal::open(&path, test_options())
        .await
        .unwrap()
        .close()
        .await;
    let conn = SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .unwrap();
    (dir, conn)
}

/// Claims and abandons flip `status` between pending and processing, and
/// completions delete processing rows: no index may hold pending or
/// processing rows, or every flip writes index pages besides the row's own
/// (a random page of a large backlog for an index led by the status,
/// migration 0003; an entry per claimed row for one of processing rows,
/// migration 0011).
#[tokio::test]
async fn only_failed_and_dead_rows_are_indexed_by_status() {
    let (_dir, mut conn) = fresh_journal().await;
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'outbox' AND sql IS NOT NULL",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(!indexes.is_empty());
    for (name, sql) in &indexes {
        let partial = sql.contains("WHERE status = 'failed'") || sql.contains("WHERE status = 'dead'");
        assert!(
            partial,
            "index {name} also holds pending or processing rows: {sql}"
        );
    }
}

#[tokio::test]
async fn hot_statements_seek_indexes() {
    let (_dir, mut conn) = fresh_journal().await;
    for (name, sql) in HOT {
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                .fetch_all(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        let steps: Vec<&str> = plan.iter().map(|p| p.3.as_str()).collect();
        // An ordered walk of a partial index holding exactly the rows the
        // statement wants (dead rows for requeue_dead) is not a scan of the
        // backlog.
        let partial = |s: &&&str| s.ends_with("USING COVERING INDEX outbox_dead");
        assert!(
            steps
                .iter()
                .all(|s| (!s.starts_with("SCAN") || partial(&s)) && !s.contains("TEMP B-TREE")),
            "{name} scans or sorts: {steps:?}"
        );
    }
}

/// Listing streams with their versions walks the events' `(stream, seq)`
/// index from one stream to the next: every step on `events` is a seek,
/// never a scan of a stream's events (there is no versions table to read).
#[tokio::test]
async fn listing_stream_versions_seeks_from_stream_to_stream() {
    let (_dir, mut conn) = fresh_journal().await;
    let sql = "WITH RECURSIVE next (stream) AS ( \
         SELECT (SELECT min(stream) FROM events WHERE stream > '') \
         UNION ALL \
         SELECT (SELECT min(stream) FROM events WHERE stream > next.stream) FROM next \
         WHERE next.stream IS NOT NULL LIMIT 10) \
         SELECT stream, (SELECT max(seq) FROM events WHERE stream = next.stream) FROM next \
         WHERE stream IS NOT NULL";
    let plan: Vec<(i64, i64, i64, String)> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
            .fetch_all(&mut conn)
            .await
            .unwrap();
    let on_events: Vec<&str> = plan
        .iter()
        .map(|p| p.3.as_str())
        .filter(|s| s.contains(" events"))
        .collect();
    assert_eq!(on_events.len(), 3, "{plan:?}");
    assert!(
        on_events
            .iter()
            .all(|s| s.starts_with("SEARCH events USING COVERING INDEX")),
        "{on_events:?}"
    );
}
