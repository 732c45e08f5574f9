//! Files: private modes, and every bad input refused with the file untouched.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::test_options;
use outbox_core::{AppendOptions, AppendRequest, Error, EventJournal, ExpectedVersion};
use outbox_sqlite::{SqliteJournal, SqliteProjectionStore};
use outbox_testkit::{add, sid};
use sqlx::{self, ConnectOptions, sqlite::SqliteConnectOptions};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777
}

fn sidecar(p: &Path, suffix: &str) -> PathBuf {
    PathBuf::from(format!("{}{suffix}", p.display()))
}

async fn append_one(j: &SqliteJournal) {
    j.append(
        &[AppendRequest::new(sid("s"), ExpectedVersion::Any, vec![add(1)])],
        AppendOptions::enqueue(),
    )
    .await
    .expect("append");
}

/// A journal file written and closed (its WAL checkpointed away).
async fn closed_journal(dir: &Path) -> PathBuf {
    let path = dir.join("journal.db");
    let j = SqliteJournal::open(&path, test_options()).await.expect("open");
    append_one(&j).await;
    j.close().await;
    path
}

/// Asserts `result` is refused and the file's bytes did not change.
fn assert_untouched(path: &Path, before: &[u8], what: &str) {
    assert_eq!(
        std::fs::read(path).expect("read"),
        before,
        "{what}: the file changed"
    );
}

#[tokio::test]
async fn new_database_files_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let j = SqliteJournal::open(&path, test_options()).await.unwrap();
    append_one(&j).await;
    assert_eq!(mode(&path), 0o600, "database file");
    for suffix in ["-wal", "-shm"] {
        let side = sidecar(&path, suffix);
        assert!(side.exists(), "{suffix} exists while the store is open");
        assert_eq!(mode(&side), 0o600, "{suffix} file");
    }
    let p = SqliteProjectionStore::open(dir.path().join("p.db"), test_options())
        .await
        .unwrap();
    assert_eq!(mode(p.path()), 0o600, "projection file");
}

#[tokio::test]
async fn create_dirs_creates_private_directories() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a/b/journal.db");
    let j = SqliteJournal::open(&path, test_options().with_create_dirs(true))
        .await
        .unwrap();
    append_one(&j).await;
    assert_eq!(mode(&dir.path().join("a")), 0o700);
    assert_eq!(mode(&dir.path().join("a/b")), 0o700);
    assert_eq!(mode(&path), 0o600);
}

#[tokio::test]
async fn missing_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing/journal.db");
    let err = SqliteJournal::open(&path, test_options()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("does not exist") && msg.contains("journal.db"),
        "{msg}"
    );
    assert!(!dir.path().join("missing").exists(), "nothing created");
}

#[tokio::test]
async fn text_file_is_refused_and_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    let text = b"these are my notes, not a database\n".repeat(200);
    std::fs::write(&path, &text).unwrap();
    for role in ["journal", "projection"] {
        let err = match role {
            "journal" => SqliteJournal::open(&path, test_options())
                .await
                .map(drop)
                .unwrap_err(),
            _ => SqliteProjectionStore::open(&path, test_options())
                .await
                .map(drop)
                .unwrap_err(),
        };
        assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
        assert!(err.to_string().contains("is not a SQLite database"), "{err}");
        assert!(err.to_string().contains("notes.txt"), "{err}");
        assert_untouched(&path, &text, role);
    }
    assert!(!sidecar(&path, "-wal").exists() && !sidecar(&path, "-shm").exists());
    // A short file too.
    std::fs::write(&path, b"x").unwrap();
    assert!(matches!(
        SqliteJournal::open(&path, test_options()).await,
        Err(Error::InvalidInput(_))
    ));
    assert_untouched(&path, b"x", "short file");
}

#[tokio::test]
async fn corrupt_database_body_is_refused_and_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.db");
    // A valid header followed by garbage.
    let mut bytes = b"SQLite format 3\0".to_vec();
    bytes.extend(std::iter::repeat_n(0xA5u8, 8192));
    std::fs::write(&path, &bytes).unwrap();
    let err = SqliteJournal::open(&path, test_options()).await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(_) | Error::Storage { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("bad.db"), "names the file: {err}");
    assert_untouched(&path, &bytes, "corrupt body");
}

#[tokio::test]
async fn read_only_file_is_refused_and_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = closed_journal(dir.path()).await;
    let before = std::fs::read(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    let err = SqliteJournal::open(&path, test_options()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    assert!(err.to_string().contains("read-only"), "{err}");
    assert_untouched(&path, &before, "read-only");
}

/// Opened read-only (`SqliteOptions::read_only`), a closed journal in a
/// read-only directory is read as it is, every write is refused with one
/// line saying so, and nothing is created or changed: no `-wal`, `-shm` or
/// `-turn` file, the same bytes. A journal with a live writer (its `-wal`
/// beside it) is read through its WAL: the reader sees the writer's
/// commits.
#[tokio::test]
async fn a_read_only_open_reads_and_refuses_every_write_without_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = closed_journal(dir.path()).await;
    let before = std::fs::read(&path).unwrap();
    let listing = || {
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let files_before = listing();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o500)).unwrap();
    let ro = test_options().with_create_if_missing(false).with_read_only(true);
    let j = SqliteJournal::open(&path, ro.clone())
        .await
        .expect("read-only open");
    assert_eq!(j.stream_version(&sid("s")).await.unwrap(), 1);
    let err = j
        .append(
            &[AppendRequest::new(sid("s"), ExpectedVersion::Any, vec![add(2)])],
            AppendOptions::enqueue(),
        )
        .await
        .unwrap_err();
    let line = err.to_string();
    assert!(
        line.contains("is open read-only") && !line.contains('\n'),
        "{line}"
    );
    assert!(!err.is_temporary(), "{err:?}");
    j.close().await;
    let p = SqliteProjectionStore::open(dir.path().join("missing.db"), ro.clone()).await;
    assert!(matches!(p, Err(Error::NotFound(_))), "{p:?}");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(listing(), files_before, "a file was created");
    assert_untouched(&path, &before, "read-only open");

    // A live writer: the read-only store sees its commits through the WAL.
    let w = SqliteJournal::open(&path, test_options()).await.unwrap();
    append_one(&w).await;
    let j = SqliteJournal::open(&path, ro)
        .await
        .expect("read-only open beside a writer");
    assert_eq!(j.stream_version(&sid("s")).await.unwrap(), 2);
    append_one(&w).await;
    assert_eq!(
        j.stream_version(&sid("s")).await.unwrap(),
        3,
        "a later commit is seen"
    );
    j.close().await;
    w.close().await;
}

/// A read-only open of a journal whose schema is behind this build is
/// refused as too old (it cannot be migrated), the file untouched.
#[tokio::test]
async fn a_read_only_open_of_an_older_schema_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = closed_journal(dir.path()).await;
    {
        let mut conn = SqliteConnectOptions::new()
            .filename(&path)
            .connect()
            .await
            .unwrap();
        sqlx::query(
            "DELETE FROM _outbox_migrations WHERE version = (SELECT MAX(version) FROM _outbox_migrations)",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        let _ = sqlx::Connection::close(conn).await;
    }
    let before = std::fs::read(&path).unwrap();
    let ro = test_options().with_read_only(true);
    let err = SqliteJournal::open(&path, ro).await.unwrap_err();
    assert!(matches!(err, Error::SchemaTooOld { .. }), "{err:?}");
    assert_untouched(&path, &before, "older schema, read-only");
}

#[tokio::test]
async fn journal_file_is_not_a_projection_store_and_vice_versa() {
    let dir = tempfile::tempdir().unwrap();
    let journal = closed_journal(dir.path()).await;
    let before = std::fs::read(&journal).unwrap();
    let err = SqliteProjectionStore::open(&journal, test_options())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("journal.db") && msg.contains("journal") && msg.contains("projection"),
        "{msg}"
    );
    assert_untouched(&journal, &before, "journal opened as projection");

    let proj = dir.path().join("p.db");
    SqliteProjectionStore::open(&proj, test_options())
        .await
        .unwrap()
        .close()
        .await;
    let before = std::fs::read(&proj).unwrap();
    let err = SqliteJournal::open(&proj, test_options()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    assert!(
        err.to_string().contains("is an outbox projection database"),
        "{err}"
    );
    assert_untouched(&proj, &before, "projection opened as journal");
}

#[tokio::test]
async fn newer_schema_is_refused_and_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = closed_journal(dir.path()).await;
    let mut conn = SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO _outbox_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', 1, x'00', 0)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::Connection::close(conn).await.unwrap();
    let before = std::fs::read(&path).unwrap();
    let err = SqliteJournal::open(&path, test_options()).await.unwrap_err();
    match &err {
        Error::SchemaTooNew {
            found,
            supported,
            database,
        } => {
            assert_eq!(*found, 9999);
            assert_eq!(*supported, 11, "the newest embedded journal migration");
            assert!(database.contains("journal.db"), "{database}");
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert_untouched(&path, &before, "newer schema");
}

/// A journal file as the first release left it: only migration 0001, with
/// its role recorded and some data.
async fn journal_at_0001(dir: &Path) -> PathBuf {
    let migrations = dir.join("migrations-0001");
    std::fs::create_dir(&migrations).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/journal/0001_init.sql"),
        migrations.join("0001_init.sql"),
    )
    .unwrap();
    let mut migrator = sqlx::migrate::Migrator::new(migrations.as_path()).await.unwrap();
    migrator.dangerous_set_table_name("_outbox_migrations");
    let path = dir.join("old.db");
    let mut conn = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .connect()
        .await
        .unwrap();
    migrator.run_direct(None, &mut conn, false).await.unwrap();
    sqlx::query("INSERT INTO outbox_meta (key, value) VALUES ('role', 'journal')")
        .execute(&mut conn)
        .await
        .unwrap();
    // Seven events of 'old' at positions 10, 20, ..., 70 (a fresh table
    // would number them 1 to 7: the migration must copy them, not renumber
    // them), and the stream's version beside them.
    sqlx::query(
        "WITH RECURSIVE n (seq) AS (SELECT 1 UNION ALL SELECT seq + 1 FROM n WHERE seq < 7) \
         INSERT INTO events (global_position, stream, seq, event_type, intent, payload, payload_hash, \
         recorded_at) SELECT seq * 10, 'old', seq, 'e', 'apply', x'7b7d', x'00', 0 FROM n",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query("INSERT INTO streams (stream, head) VALUES ('old', 7)")
        .execute(&mut conn)
        .await
        .unwrap();
    // A row enqueued before partitions existed: the first open gives it one.
    sqlx::query(
        "INSERT INTO outbox (stream, seq, event_type, status, attempt_count, next_attempt_at, updated_at) \
         VALUES ('old', 7, 'e', 'pending', 0, 0, 0)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query("INSERT INTO outbox_heads (stream, head_seq, due_at) VALUES ('old', 7, 0)")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::Connection::close(conn).await.unwrap();
    path
}

#[tokio::test]
async fn a_0001_journal_migrates_forward_on_open() {
    use outbox_core::{Mode, WorkerId, WorkerRegistry};
    let dir = tempfile::tempdir().unwrap();
    let path = journal_at_0001(dir.path()).await;
    let j = SqliteJournal::open(&path, test_options())
        .await
        .expect("an older schema migrates forward");
    assert_eq!(j.stream_version(&sid("old")).await.unwrap(), 7, "data kept");
    let w = WorkerId::new("w").unwrap();
    j.heartbeat(
        &w,
        "host",
        1,
        Mode::OutboxApplyOnly,
        std::time::Duration::from_secs(30),
    )
    .await
    .expect("the worker registry works after the migration");
    assert_eq!(j.workers().await.unwrap().len(), 1);
    append_one(&j).await;
    j.close().await;
    let mut conn = SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .unwrap();
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _outbox_migrations WHERE success ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        versions,
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
        "0002 to 0011 recorded once, after 0001"
    );
    // 0010: the events kept their positions, the next append numbered on
    // from them, and nothing repeats a stream's version any more.
    let positions: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT stream, seq, global_position FROM events ORDER BY global_position")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    let old: Vec<(String, i64, i64)> = (1..=7).map(|i| ("old".to_owned(), i, i * 10)).collect();
    assert_eq!(positions[..7], old[..], "the old events kept their positions");
    assert_eq!(
        positions.len(),
        8,
        "and the new one came after them: {positions:?}"
    );
    assert_eq!(positions[7].2, 71, "{positions:?}");
    let gone: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE name IN ('streams', 'events_lean')")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert!(gone.is_empty(), "{gone:?}");
    // SQLite keeps its (now empty) counter table once 0001 made it.
    let counters: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlite_sequence WHERE name = 'events'")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(counters, 0, "no AUTOINCREMENT counter is kept for the events");
    let expected = i64::from(outbox_core::crc32(b"old") % 16);
    let partitions: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT (SELECT partition_no FROM outbox WHERE stream = 'old'), \
                (SELECT partition_no FROM outbox_heads WHERE stream = 'old')",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        partitions,
        [(expected, expected)],
        "the old row was given its partition"
    );
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'outbox' AND sql IS NOT NULL ORDER BY name",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        indexes,
        ["outbox_dead", "outbox_failed"],
        "0003 replaced the status index, 0011 dropped the processing one"
    );
    sqlx::Connection::close(conn).await.unwrap();
    let again = SqliteJournal::open(&path, test_options())
        .await
        .expect("reopening a migrated file");
    assert_eq!(again.workers().await.unwrap().len(), 1, "the entry persisted");
}

#[tokio::test]
async fn reopening_keeps_the_data_and_migrations_are_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let path = closed_journal(dir.path()).await;
    for _ in 0..2 {
        let j = SqliteJournal::open(&path, test_options()).await.unwrap();
        assert_eq!(j.stream_version(&sid("s")).await.unwrap(), 1);
        j.close().await;
    }
}

#[tokio::test]
async fn urls_open_and_bad_urls_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.db");
    let b = dir.path().join("b.db");
    let j = SqliteJournal::open_url(&format!("sqlite://{}", a.display()), test_options())
        .await
        .unwrap();
    assert_eq!(j.path(), a.canonicalize().unwrap());
    let p = SqliteProjectionStore::open_url(&format!("sqlite:{}", b.display()), test_options())
        .await
        .unwrap();
    assert_eq!(p.path(), b.canonicalize().unwrap());
    for bad in [
        "postgres://x/y",
        "sqlite://",
        "sqlite::memory:",
        "sqlite://x.db?mode=ro",
        "file:x.db",
    ] {
        let err = SqliteJournal::open_url(bad, test_options()).await.unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{bad}: {err:?}");
    }
}

#[tokio::test]
async fn a_directory_is_not_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let err = SqliteJournal::open(dir.path(), test_options()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
}

#[tokio::test]
async fn invalid_options_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    let err = SqliteJournal::open(&path, test_options().with_busy_timeout(std::time::Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(!path.exists(), "nothing created for a bad option");
}

#[tokio::test]
async fn without_create_if_missing_a_missing_or_empty_file_is_not_found_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    let opts = test_options().with_create_if_missing(false);
    let err = SqliteJournal::open(&missing, opts.clone()).await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err}");
    assert!(!missing.exists(), "no file created");
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let err = SqliteProjectionStore::open(&empty, opts).await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err}");
    assert!(err.to_string().contains("is empty"), "{err}");
    assert_eq!(
        std::fs::metadata(&empty).unwrap().len(),
        0,
        "the empty file is left as it was"
    );
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "no -wal or -shm files either: {names:?}");
}

/// Migration 0008 rewrites the message of attempts the old claims counted
/// to the message of a recorded one: both must be the constants' texts.
#[test]
fn the_alone_migration_names_the_unfinished_and_the_recorded_messages() {
    let sql = include_str!("../migrations/journal/0008_alone.sql");
    for text in [outbox_core::UNFINISHED_ATTEMPT, outbox_core::ENDED_WITHOUT_RESULT] {
        assert!(sql.contains(&format!("'{text}'")), "0008 lacks {text:?}");
    }
}

/// The migration record written on open is the one `sqlx`'s migrator
/// wrote and reads (the files' checksums and descriptions): a file
/// migrated here needs nothing from that migrator (an earlier release
/// opening it, or a tool using it), and a file it migrated opens here
/// (`a_0001_journal_migrates_forward_on_open`).
#[tokio::test]
async fn the_migration_record_is_the_one_sqlx_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = closed_journal(dir.path()).await;
    let mut migrator =
        sqlx::migrate::Migrator::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/journal"))
            .await
            .unwrap();
    migrator.dangerous_set_table_name("_outbox_migrations");
    let mut conn = SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .unwrap();
    let records = || "SELECT version, description, checksum FROM _outbox_migrations ORDER BY version";
    let before: Vec<(i64, String, Vec<u8>)> = sqlx::query_as(records()).fetch_all(&mut conn).await.unwrap();
    migrator
        .run_direct(None, &mut conn, false)
        .await
        .expect("sqlx's migrator accepts every checksum and has nothing to apply");
    let after: Vec<(i64, String, Vec<u8>)> = sqlx::query_as(records()).fetch_all(&mut conn).await.unwrap();
    assert_eq!(before, after, "nothing applied again");
    let want: Vec<(i64, String)> = migrator
        .iter()
        .map(|m| (m.version, m.description.to_string()))
        .collect();
    let got: Vec<(i64, String)> = after.into_iter().map(|(v, d, _)| (v, d)).collect();
    assert_eq!(got, want);

    // A record whose checksum differs (the file was migrated by a build
    // whose migration text differed) is refused, the file left as it was.
    sqlx::query("UPDATE _outbox_migrations SET checksum = x'00' WHERE version = 2")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::Connection::close(conn).await.unwrap();
    let before = std::fs::read(&path).unwrap();
    let err = SqliteJournal::open(&path, test_options()).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("migration 2 was previously applied but has been modified"),
        "{err}"
    );
    assert_untouched(&path, &before, "a modified migration");
}
