//! Issue 16: the error classification (`storage` in src/db.rs), one test per
//! row of the crate docs' table that can be provoked: each error is made to
//! happen for real and must come out temporary or permanent as the table
//! says.
//!
//! Needs `OUTBOX_TEST_DATABASE_URL` for most rows; the connect rows need no
//! server, and the crash row starts a cluster of its own.

mod common;

use std::time::Duration;

use common::{DropSchemas, test_database_url, unique_schema};
use outbox_core::{
    AppendOptions, AppendRequest, Error, EventJournal, EventType, ExpectedVersion, Intent, NewEvent, StreamId,
};
use outbox_postgres::sqlx::{self, Connection, PgConnection};
use outbox_postgres::{PgJournal, PgOptions, storage_error};

fn event() -> NewEvent {
    NewEvent::new(EventType::new("e").unwrap(), Intent::Apply, b"1".to_vec())
}

fn req(stream: &str) -> AppendRequest {
    AppendRequest::new(
        StreamId::new(stream).unwrap(),
        ExpectedVersion::Any,
        vec![event()],
    )
}

fn quick(schema: &str) -> PgOptions {
    PgOptions::default()
        .with_schema(schema)
        .with_max_connections(2)
        .with_acquire_timeout(Duration::from_secs(2))
}

fn assert_temporary(e: &Error, row: &str) {
    assert!(e.is_temporary(), "{row} must be temporary: {e:?}");
    assert!(!e.to_string().contains('\n'), "one line: {e}");
}

/// Row "I/O: connection refused": nothing listens on the port.
#[tokio::test]
async fn connection_refused_is_temporary() {
    let e = PgJournal::connect("postgres://postgres@127.0.0.1:1/postgres", quick("outbox"))
        .await
        .unwrap_err();
    assert_temporary(&e, "connection refused");
}

/// Row "I/O: the socket file is missing" (a Unix-socket server that is down).
#[tokio::test]
async fn a_missing_server_socket_is_temporary() {
    let e = PgJournal::connect(
        "postgres://postgres@localhost/postgres?host=/nonexistent-outbox-socket-dir",
        quick("outbox"),
    )
    .await
    .unwrap_err();
    assert_temporary(&e, "missing socket");
}

/// Rows "08 / 57P01 / I/O mid-transaction": the backend of an open
/// transaction is terminated from another connection (`pg_terminate_backend`,
/// what an operator or a failover does); the next statement of the adapter
/// in that transaction fails temporarily, and the store works again on a
/// fresh connection.
#[tokio::test]
async fn a_backend_terminated_mid_transaction_is_temporary() {
    let Some(url) = test_database_url() else { return };
    let schema = unique_schema("err_term");
    let _drop = DropSchemas::new(&url, [schema.clone()]);
    let journal = PgJournal::connect(&url, quick(&schema)).await.unwrap();
    let mut tx = journal.begin().await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let mut admin = PgConnection::connect(&url).await.unwrap();
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(killed);
    let e = journal
        .append_in(&mut tx, &[req("s")], AppendOptions::enqueue())
        .await
        .unwrap_err();
    assert_temporary(&e, "a terminated backend");
    drop(tx);
    // The dead connection is discarded: the next call gets a fresh one.
    journal
        .append(&[req("s")], AppendOptions::enqueue())
        .await
        .unwrap();
    admin.close().await.unwrap();
    journal.close().await;
}

/// Row "57P01 admin_shutdown" as a database error: a session terminated
/// while it waits in a statement gets the FATAL 57P01 itself.
#[tokio::test]
async fn admin_shutdown_is_temporary() {
    let Some(url) = test_database_url() else { return };
    let mut victim = PgConnection::connect(&url).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut victim)
        .await
        .unwrap();
    let sleeping = tokio::spawn(async move {
        sqlx::query("SELECT pg_sleep(60)")
            .execute(&mut victim)
            .await
            .map(|_| ())
    });
    let mut admin = PgConnection::connect(&url).await.unwrap();
    // Wait until the victim is inside its statement (liveness bound only).
    for _ in 0..600 {
        let active: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state = 'active')",
        )
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .unwrap();
        if active {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    let e = sleeping.await.unwrap().unwrap_err();
    if let sqlx::Error::Database(d) = &e {
        assert_eq!(d.code().as_deref(), Some("57P01"), "{e}");
    }
    assert_temporary(&storage_error("sleeping", e), "admin shutdown");
    admin.close().await.unwrap();
}

/// Row "40001 serialization_failure": two serializable transactions with
/// write skew; the second to commit fails.
#[tokio::test]
async fn serialization_failure_is_temporary() {
    let Some(url) = test_database_url() else { return };
    let schema = unique_schema("err_ser");
    let _drop = DropSchemas::new(&url, [schema.clone()]);
    let mut a = PgConnection::connect(&url).await.unwrap();
    let mut b = PgConnection::connect(&url).await.unwrap();
    for stmt in [
        format!("CREATE SCHEMA {schema}"),
        format!("CREATE TABLE {schema}.t (k int PRIMARY KEY, v int)"),
        format!("INSERT INTO {schema}.t VALUES (1, 0), (2, 0)"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(stmt))
            .execute(&mut a)
            .await
            .unwrap();
    }
    run(&mut a, "BEGIN ISOLATION LEVEL SERIALIZABLE".into())
        .await
        .unwrap();
    run(&mut b, "BEGIN ISOLATION LEVEL SERIALIZABLE".into())
        .await
        .unwrap();
    run(
        &mut a,
        format!("UPDATE {schema}.t SET v = (SELECT sum(v) FROM {schema}.t) + 1 WHERE k = 1"),
    )
    .await
    .unwrap();
    run(
        &mut b,
        format!("UPDATE {schema}.t SET v = (SELECT sum(v) FROM {schema}.t) + 1 WHERE k = 2"),
    )
    .await
    .unwrap();
    run(&mut a, "COMMIT".into()).await.unwrap();
    let e = run(&mut b, "COMMIT".into()).await.unwrap_err();
    let code = match &e {
        sqlx::Error::Database(d) => d.code().map(|c| c.into_owned()),
        _ => None,
    };
    assert_eq!(code.as_deref(), Some("40001"), "{e}");
    assert_temporary(&storage_error("committing", e), "serialization failure");
}

async fn run(c: &mut PgConnection, sql: String) -> Result<(), sqlx::Error> {
    sqlx::query(sqlx::AssertSqlSafe(sql)).execute(c).await.map(|_| ())
}

/// Row "55P03 lock_not_available": a row lock held elsewhere past `lock_timeout`.
#[tokio::test]
async fn lock_not_available_is_temporary() {
    let Some(url) = test_database_url() else { return };
    let schema = unique_schema("err_lock");
    let _drop = DropSchemas::new(&url, [schema.clone()]);
    let mut a = PgConnection::connect(&url).await.unwrap();
    let mut b = PgConnection::connect(&url).await.unwrap();
    for stmt in [
        format!("CREATE SCHEMA {schema}"),
        format!("CREATE TABLE {schema}.t (k int PRIMARY KEY)"),
        format!("INSERT INTO {schema}.t VALUES (1)"),
        "BEGIN".to_owned(),
        format!("SELECT * FROM {schema}.t FOR UPDATE"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(stmt))
            .execute(&mut a)
            .await
            .unwrap();
    }
    sqlx::query("SET lock_timeout = '50ms'")
        .execute(&mut b)
        .await
        .unwrap();
    let e = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT * FROM {schema}.t FOR UPDATE"
    )))
    .execute(&mut b)
    .await
    .unwrap_err();
    let err = storage_error("locking", e);
    // The server's message and SQLSTATE; not sqlx's "at line N" (a line of
    // the server's C source).
    let text = err.to_string();
    assert!(
        text.contains("(SQLSTATE 55P03)") && !text.contains(" at line "),
        "{text}"
    );
    assert_temporary(&err, "lock not available");
    sqlx::query("ROLLBACK").execute(&mut a).await.unwrap();
}

/// Row "53300 too_many_connections": a role whose connection limit is 0.
#[tokio::test]
async fn too_many_connections_is_temporary() {
    let Some(url) = test_database_url() else { return };
    let role = unique_schema("err_role");
    let mut admin = PgConnection::connect(&url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN CONNECTION LIMIT 0"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    let limited = url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    assert_ne!(limited, url, "the test URL names the postgres user");
    // The driver's own error, classified by SQLSTATE.
    let direct = PgConnection::connect(&limited).await.unwrap_err();
    let code = match &direct {
        sqlx::Error::Database(d) => d.code().map(|c| c.into_owned()),
        _ => None,
    };
    // Through the adapter's pool, which retries it until its acquire
    // timeout: a pool timeout, temporary too.
    let e = PgJournal::connect(&limited, quick("outbox")).await.unwrap_err();
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE {role}")))
        .execute(&mut admin)
        .await;
    assert_eq!(code.as_deref(), Some("53300"), "{direct}");
    assert_temporary(&storage_error("connecting", direct), "too many connections");
    assert_temporary(&e, "too many connections (through the pool)");
}

/// Row "pool timed out": every connection of the pool is in use.
#[tokio::test]
async fn a_pool_timeout_is_temporary() {
    let Some(url) = test_database_url() else { return };
    let schema = unique_schema("err_pool");
    let _drop = DropSchemas::new(&url, [schema.clone()]);
    let journal = PgJournal::connect(
        &url,
        quick(&schema)
            .with_max_connections(1)
            .with_acquire_timeout(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let held = journal.begin().await.unwrap();
    let e = journal
        .append(&[req("s")], AppendOptions::enqueue())
        .await
        .unwrap_err();
    assert_temporary(&e, "pool timeout");
    drop(held);
    journal.close().await;
}

/// Permanent rows: the pool closed by the store's own `close`, an unknown
/// database (3D000) and an unknown role (28000).
#[tokio::test]
async fn a_closed_pool_an_unknown_database_and_an_unknown_role_are_permanent() {
    let Some(url) = test_database_url() else { return };
    let schema = unique_schema("err_perm");
    let _drop = DropSchemas::new(&url, [schema.clone()]);
    let journal = PgJournal::connect(&url, quick(&schema)).await.unwrap();
    journal.close().await;
    let e = journal
        .append(&[req("s")], AppendOptions::enqueue())
        .await
        .unwrap_err();
    assert!(!e.is_temporary(), "a closed pool is permanent: {e}");
    let no_db = url.replacen("/postgres?", "/no_such_database_outbox?", 1);
    assert_ne!(no_db, url);
    let e = PgJournal::connect(&no_db, quick("outbox")).await.unwrap_err();
    assert!(!e.is_temporary(), "an unknown database is permanent: {e}");
    let no_role = url.replacen("postgres://postgres@", "postgres://no_such_role_outbox@", 1);
    let e = PgJournal::connect(&no_role, quick("outbox")).await.unwrap_err();
    assert!(!e.is_temporary(), "an unknown role is permanent: {e}");
}

/// Rows "57P02 crash_shutdown / I/O": a backend killed with SIGKILL makes the
/// postmaster end every other session (crash recovery); on a cluster of the
/// test's own, every open transaction fails temporarily and the store works
/// again after recovery.
#[tokio::test]
async fn a_crashed_server_is_temporary_and_the_store_recovers() {
    let Some(cluster) = outbox_testkit::pg::OwnCluster::start("the crash-shutdown row") else {
        return;
    };
    let url = cluster.url();
    let journal = PgJournal::connect(&url, quick("outbox")).await.unwrap();
    let mut tx = journal.begin().await.unwrap();
    let mut victim = PgConnection::connect(&url).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut victim)
        .await
        .unwrap();
    let ok = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -9 of backend {pid}");
    let e = journal
        .append_in(&mut tx, &[req("s")], AppendOptions::enqueue())
        .await
        .unwrap_err();
    assert_temporary(&e, "crash shutdown");
    drop(tx);
    // Recovery takes a moment: retried like a starting process would.
    let mut ok = false;
    for _ in 0..1200 {
        match journal.append(&[req("s")], AppendOptions::enqueue()).await {
            Ok(_) => {
                ok = true;
                break;
            }
            Err(e) if e.is_temporary() => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("permanent after a crash: {e}"),
        }
    }
    assert!(ok, "the store works again after crash recovery");
    assert_eq!(
        journal
            .stream_version(&StreamId::new("s").unwrap())
            .await
            .unwrap(),
        1
    );
    journal.close().await;
}

/// The clock is chosen when a store opens: a store opened without the test
/// clock refuses to move it, and its schema's offset function is the
/// constant the migrations made, even after a test-clock store on another
/// schema moved its own.
#[tokio::test]
async fn a_store_opened_without_the_test_clock_refuses_to_move_it() {
    let Some(url) = outbox_testkit::pg::test_database_url() else {
        return;
    };
    let (plain, testing) = (unique_schema("clock_plain"), unique_schema("clock_test"));
    let _drop = DropSchemas::new(&url, [plain.clone(), testing.clone()]);
    let journal = PgJournal::connect(&url, PgOptions::default().with_schema(&plain))
        .await
        .expect("journal");
    match journal.advance_clock_for_tests(Duration::from_secs(60)).await {
        Err(Error::Config(m)) => assert!(m.contains("with_test_clock"), "{m}"),
        other => panic!("moved a production clock: {other:?}"),
    }
    let moved = PgJournal::connect(&url, PgOptions::default().with_schema(&testing).with_test_clock())
        .await
        .expect("test journal");
    moved
        .advance_clock_for_tests(Duration::from_secs(3_600))
        .await
        .expect("advance");
    let offset = |schema: &str| {
        let sql = format!("SELECT {schema}.outbox_journal_clock_offset_ms()");
        let pool = journal.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
                .fetch_one(&pool)
                .await
                .expect("offset")
        }
    };
    assert_eq!(offset(&plain).await, 0, "the production clock moved");
    assert_eq!(offset(&testing).await, 3_600_000, "the test clock did not move");
    journal.close().await;
    moved.close().await;
}
