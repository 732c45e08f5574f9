//! A Postgres server error in the CLI's error line: named once, with its
//! SQLSTATE, without the driver's "at line N" (the server's C source line).
#![cfg(feature = "postgres")]

use std::process::Command;

use outbox_postgres::sqlx::{self, Connection as _};
use outbox_testkit::pg::test_database_url;

#[tokio::test]
async fn a_server_error_is_named_once_without_the_drivers_source_line() {
    let Some(url) = test_database_url() else { return };
    let schema = format!("cli_errors_{}", std::process::id());
    let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
    // A table of the journal's name that is not the journal's: the
    // migration's CREATE TABLE fails on the server.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; \
         CREATE TABLE {schema}.outbox_journal_meta (key text PRIMARY KEY, value text)"
    )))
    .execute(&mut c)
    .await
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args([
            "--journal",
            &url,
            "--projection-db",
            &url,
            "--schema",
            &schema,
            "migrate",
        ])
        .output()
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut c)
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("at line"), "{stderr}");
    assert!(!stderr.contains("error returned from database"), "{stderr}");
    assert_eq!(stderr.matches("already exists").count(), 1, "{stderr}");
    assert_eq!(stderr.matches("SQLSTATE 42P07").count(), 1, "{stderr}");
}
