//! The shared cold-path statements ([`outbox_sql`]) on SQLite: a
//! [`Conn`] over the driver and the [`Database`] of an open file.

use outbox_core::Result;
use outbox_sql::{Conn, Database, Dialect, Row, Tx, Value};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row as _, SqliteConnection, TypeInfo, ValueRef};

use crate::db::{Db, storage};

outbox_sql::driver_io!(SqliteConnection);

/// A driver row as shared values, by each value's SQLite storage class.
pub(crate) fn to_row(r: &SqliteRow) -> sqlx::Result<Row> {
    let mut out = Vec::with_capacity(r.len());
    for i in 0..r.len() {
        let raw = r.try_get_raw(i)?;
        let v = if raw.is_null() {
            Value::Null
        } else {
            match raw.type_info().name() {
                "INTEGER" | "BOOLEAN" => Value::Int(r.try_get(i)?),
                "TEXT" => Value::Text(r.try_get(i)?),
                "REAL" => Value::Real(r.try_get(i)?),
                _ => Value::Bytes(r.try_get(i)?),
            }
        };
        out.push(v);
    }
    Ok(Row(out))
}

outbox_sql::driver_conns!(sqlx::Sqlite);

#[outbox_core::async_trait]
impl Database for Db {
    fn dialect(&self) -> &Dialect {
        &self.dialect
    }

    async fn begin(&self) -> Result<Box<dyn Tx + '_>> {
        Ok(Box::new(WriteTx(Db::begin(self).await?)))
    }

    async fn read(&self) -> Result<Box<dyn Conn + '_>> {
        Ok(Box::new(ReadConn(Db::read(self).await?)))
    }

    async fn snapshot(&self) -> Result<Box<dyn Tx + '_>> {
        let tx = self
            .reader
            .begin()
            .await
            .map_err(|e| storage(self.context("starting a read transaction"), e))?;
        Ok(Box::new(WriteTx(tx)))
    }
}

/// Sends `statements` as one command, one handoff to the driver's thread
/// instead of one each, and returns the rows each changed, in order.
///
/// Each statement's placeholders (`?1`, `?2`, ...) are renumbered after
/// the arguments of the statements before it; `sqlx` binds numbered
/// placeholders by their number across the statements of one command.
pub(crate) async fn execute_all(
    conn: &mut SqliteConnection,
    what: &str,
    statements: &[outbox_sql::Statement<'_>],
) -> Result<Vec<u64>> {
    use futures_util::TryStreamExt as _;
    if let [one] = statements {
        return Ok(vec![execute(conn, one.what, &one.sql, &one.args).await?]);
    }
    let mut sql = String::new();
    let mut args = Vec::new();
    for st in statements {
        if !sql.is_empty() {
            sql.push_str(";\n");
        }
        renumber(&st.sql, args.len(), &mut sql);
        args.extend_from_slice(&st.args);
    }
    if sql.is_empty() {
        return Ok(Vec::new());
    }
    let q = outbox_sql::bind_args!(sqlx::query(sqlx::AssertSqlSafe(sql)), &args);
    let mut changed = Vec::with_capacity(statements.len());
    // The deprecation is of several statements in one `sqlx` statement,
    // which only the SQLite driver supports: that is the point here (ADR 0015).
    #[allow(deprecated)]
    let mut results = q.fetch_many(conn);
    while let Some(step) = results.try_next().await.map_err(|e| storage(what, e))? {
        if let sqlx::Either::Left(done) = step {
            changed.push(done.rows_affected());
        }
    }
    if changed.len() != statements.len() {
        return Err(outbox_core::Error::Storage {
            message: format!(
                "{what}: {} statements sent as one reported {} results",
                statements.len(),
                changed.len()
            ),
            temporary: false,
            source: None,
        });
    }
    Ok(changed)
}

/// Appends `sql` to `out` with every `?N` placeholder outside quotes
/// raised by `offset`.
fn renumber(sql: &str, offset: usize, out: &mut String) {
    let mut chars = sql.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '\'' {
            quoted = !quoted;
        }
        if c != '?' || quoted || !chars.peek().is_some_and(char::is_ascii_digit) {
            continue;
        }
        let mut n = 0usize;
        while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
            n = n * 10 + d as usize;
            chars.next();
        }
        out.push_str(&(n + offset).to_string());
    }
}

#[cfg(test)]
mod tests {
    use outbox_sql::{Arg, Statement};
    use sqlx::Connection as _;

    use super::{execute_all, renumber};

    /// Several statements sent as one command bind their own arguments and
    /// report their own counts: `sqlx` still runs every statement of a
    /// command (a deprecated behaviour this test would catch it dropping).
    #[tokio::test]
    async fn statements_sent_as_one_command_report_their_own_counts() {
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .expect("connect");
        sqlx::raw_sql("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
            .execute(&mut conn)
            .await
            .expect("create");
        let st = |what, sql: &str, args| Statement {
            what,
            sql: sql.to_owned(),
            args,
        };
        let changed = execute_all(
            &mut conn,
            "testing",
            &[
                st(
                    "inserting",
                    "INSERT INTO t SELECT value, ?2 FROM json_each(?1)",
                    vec![Arg::Text("[1, 2, 3]"), Arg::Text("a")],
                ),
                st(
                    "updating",
                    "UPDATE t SET v = ?1 WHERE k >= ?2",
                    vec![Arg::Text("b"), Arg::Int(2)],
                ),
                st("deleting", "DELETE FROM t WHERE k = ?1", vec![Arg::Int(9)]),
            ],
        )
        .await
        .expect("execute");
        assert_eq!(changed, [3, 2, 0]);
        let rows: Vec<(i64, String)> = sqlx::query_as("SELECT k, v FROM t ORDER BY k")
            .fetch_all(&mut conn)
            .await
            .expect("read");
        assert_eq!(rows, [(1, "a".into()), (2, "b".into()), (3, "b".into())]);
    }

    #[test]
    fn placeholders_outside_quotes_are_raised_by_the_offset() {
        let mut out = String::new();
        renumber("SELECT ?1, '?2', ?10 WHERE x = ?2", 3, &mut out);
        assert_eq!(out, "SELECT ?4, '?2', ?13 WHERE x = ?5");
    }
}
