//! Test support (feature `test-util`, never in a production build): each
//! test gets schemas of its own on a shared server, dropped when the test
//! ends, pass or fail.
//!
//! ```no_run
//! # async fn t(url: &str) {
//! use outbox_postgres::testing::{DropSchemas, unique_schema};
//! let schema = unique_schema("orders");
//! let _drop = DropSchemas::new(url, [schema.clone()]);
//! // ... connect stores with `PgOptions::default().with_schema(&schema)`
//! # }
//! ```

use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::Connection as _;
use sqlx::postgres::PgConnection;

/// The variable that keeps the schemas for a post-mortem.
pub const KEEP_SCHEMAS_VAR: &str = "OUTBOX_TEST_KEEP_SCHEMAS";

/// A schema name no other test, and no other test process, uses:
/// `t_<tag>_<pid>_<n>_<nanos>`. `tag` is the test's short name (letters,
/// digits and `_`).
///
/// # Panics
///
/// When `tag` makes no valid schema name.
pub fn unique_schema(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!("t_{tag}_{}_{n}_{nanos:x}", std::process::id());
    if let Err(e) = crate::validate_identifier(&name) {
        panic!("unique_schema({tag:?}): {e}");
    }
    name
}

/// Drops its schemas on the server at its URL when dropped, also after a
/// failed assertion, unless [`KEEP_SCHEMAS_VAR`] is set.
///
/// Drop cannot await, so it drops them from a thread of its own, with a
/// runtime of its own. It holds the URL so that its drop never reads the
/// environment for it: a panic there while a failed test unwinds would abort
/// the whole test binary.
#[derive(Debug)]
pub struct DropSchemas {
    url: String,
    schemas: Vec<String>,
}

impl DropSchemas {
    /// Drops `schemas` on the server at `url` when dropped.
    pub fn new(url: &str, schemas: impl IntoIterator<Item = String>) -> Self {
        DropSchemas {
            url: url.to_owned(),
            schemas: schemas.into_iter().collect(),
        }
    }

    /// Drops `schema` too.
    pub fn add(&mut self, schema: String) {
        self.schemas.push(schema);
    }
}

impl Drop for DropSchemas {
    fn drop(&mut self) {
        if std::env::var_os(KEEP_SCHEMAS_VAR).is_some() {
            return;
        }
        let schemas = std::mem::take(&mut self.schemas);
        let url = std::mem::take(&mut self.url);
        if schemas.is_empty() {
            return;
        }
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            rt.block_on(async move {
                let Ok(mut conn) = PgConnection::connect(&url).await else {
                    return;
                };
                let _ = sqlx::query("SET lock_timeout = '10s'").execute(&mut conn).await;
                for s in schemas {
                    // Only names that pass the identifier check reach the SQL.
                    if crate::validate_identifier(&s).is_err() {
                        continue;
                    }
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA IF EXISTS {s} CASCADE")))
                        .execute(&mut conn)
                        .await;
                }
                let _ = conn.close().await;
            });
        })
        .join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_schemas_are_valid_and_distinct() {
        let (a, b) = (unique_schema("x"), unique_schema("x"));
        assert_ne!(a, b);
        assert!(crate::validate_identifier(&a).is_ok(), "{a}");
    }

    #[test]
    #[should_panic(expected = "unique_schema")]
    fn a_tag_that_makes_no_schema_name_is_refused() {
        unique_schema("no-dashes; DROP");
    }
}
