//! The driver side of the shared statements ([`outbox_sql`]) on SQLite: a
//! [`Conn`] over the driver, the [`Database`] of an open file, and
//! [`execute_all`], several statements sent as one command (the apply's
//! writes).

use outbox_core::Result;
use outbox_sql::{Arg, Conn, Database, Dialect, Row, Tx, Value};
use sqlx::query::Query;
use sqlx::sqlite::SqliteRow;
use sqlx::{AssertSqlSafe, Row as _, Sqlite, SqliteConnection, TypeInfo, ValueRef};

use crate::db::{Db, storage};
use crate::errors::internal;

/// Binds the shared arguments to a query, in order.
pub(crate) fn bind<'q>(
    mut q: Query<'q, Sqlite, <Sqlite as sqlx::Database>::Arguments>,
    args: &[Arg<'_>],
) -> Query<'q, Sqlite, <Sqlite as sqlx::Database>::Arguments> {
    for a in args {
        q = match *a {
            Arg::Int(v) => q.bind(v),
            Arg::OptInt(v) => q.bind(v),
            Arg::Text(t) => q.bind(t.to_owned()),
            Arg::OptText(t) => q.bind(t.map(str::to_owned)),
            Arg::Bool(b) => q.bind(b),
        };
    }
    q
}

/// Binds `args` to `sql`, runs it and returns the rows it changed.
pub(crate) async fn execute(
    conn: &mut SqliteConnection,
    what: &str,
    sql: &str,
    args: &[Arg<'_>],
) -> Result<u64> {
    bind(sqlx::query(AssertSqlSafe(sql.to_owned())), args)
        .execute(conn)
        .await
        .map(|r| r.rows_affected())
        .map_err(|e| storage(what, e))
}

/// Binds `args` to `sql`, runs it and returns its rows.
pub(crate) async fn fetch(
    conn: &mut SqliteConnection,
    what: &str,
    sql: &str,
    args: &[Arg<'_>],
) -> Result<Vec<Row>> {
    let rows = bind(sqlx::query(AssertSqlSafe(sql.to_owned())), args)
        .fetch_all(conn)
        .await
        .map_err(|e| storage(what, e))?;
    rows.iter()
        .map(|r| to_row(r).map_err(|e| storage(what, e)))
        .collect()
}

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

/// A write transaction (or a read-only one: a snapshot).
pub(crate) struct WriteTx(pub(crate) sqlx::Transaction<'static, Sqlite>);

/// A connection from the pool.
pub(crate) struct ReadConn(pub(crate) sqlx::pool::PoolConnection<Sqlite>);

#[outbox_core::async_trait]
impl Conn for WriteTx {
    async fn execute(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        execute(&mut self.0, what, sql, args).await
    }

    async fn fetch(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        fetch(&mut self.0, what, sql, args).await
    }
}

#[outbox_core::async_trait]
impl Tx for WriteTx {
    async fn commit(self: Box<Self>, what: &str) -> Result<()> {
        self.0.commit().await.map_err(|e| storage(what, e))
    }
}

#[outbox_core::async_trait]
impl Conn for ReadConn {
    async fn execute(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        execute(&mut self.0, what, sql, args).await
    }

    async fn fetch(&mut self, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        fetch(&mut self.0, what, sql, args).await
    }
}

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
/// Each statement's numbered placeholders (`?1`, `?2`, ...) become
/// anonymous ones (`?`) with one argument per occurrence: `sqlx` binds
/// anonymous placeholders one after another across the statements of a
/// command, where numbered ones past the first statement would leave
/// gaps it binds wrongly.
pub(crate) async fn execute_all(
    conn: &mut SqliteConnection,
    what: &str,
    statements: &[outbox_sql::Statement<'_>],
) -> Result<Vec<u64>> {
    use futures_util::TryStreamExt as _;
    if let [one] = statements {
        return Ok(vec![execute(conn, one.what, &one.sql, &one.args).await?]);
    }
    if statements.is_empty() {
        return Ok(Vec::new());
    }
    let mut sql = String::new();
    let mut args = Vec::new();
    for st in statements {
        if !sql.is_empty() {
            sql.push_str(";\n");
        }
        anonymize(st, &mut sql, &mut args)?;
    }
    let q = bind(sqlx::query(AssertSqlSafe(sql)), &args);
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
        return Err(internal(format!(
            "{what}: {} statements sent as one reported {} results",
            statements.len(),
            changed.len()
        )));
    }
    Ok(changed)
}

/// Appends the statement's text to `sql` with every `?N` outside quotes
/// turned into `?`, and its `N`th argument to `args` for each.
fn anonymize<'a>(
    st: &outbox_sql::Statement<'a>,
    sql: &mut String,
    args: &mut Vec<outbox_sql::Arg<'a>>,
) -> Result<()> {
    let mut chars = st.sql.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        sql.push(c);
        if c == '\'' {
            quoted = !quoted;
        }
        if c != '?' || quoted || !chars.peek().is_some_and(char::is_ascii_digit) {
            continue;
        }
        let mut n = 0usize;
        while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
            n = n.saturating_mul(10).saturating_add(d as usize);
            chars.next();
        }
        let arg = n
            .checked_sub(1)
            .and_then(|i| st.args.get(i))
            .ok_or_else(|| internal(format!("{}: placeholder ?{n} has no argument", st.what)))?;
        args.push(*arg);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use outbox_sql::{Arg, Statement};
    use sqlx::Connection as _;

    use super::{anonymize, execute_all};

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

    /// Many statements with many placeholders each, some used twice or out
    /// of order: every placeholder gets its own statement's argument (the
    /// running digests are several twelve-argument statements in one
    /// command).
    #[tokio::test]
    async fn many_statements_with_many_placeholders_bind_their_own_arguments() {
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .expect("connect");
        sqlx::raw_sql(
            "CREATE TABLE t (k INTEGER PRIMARY KEY, a INTEGER NOT NULL, b INTEGER NOT NULL, c TEXT NOT NULL)",
        )
        .execute(&mut conn)
        .await
        .expect("create");
        let texts: Vec<String> = (0..6).map(|k| format!("row {k}")).collect();
        let statements: Vec<Statement<'_>> = (0..6i64)
            .map(|k| Statement {
                what: "inserting",
                // ?2 is used twice, and before ?1; ?12 is the text.
                sql: "INSERT INTO t VALUES (?2, ?1 + ?3 + ?4 + ?5 + ?6 + ?7 + ?8 + ?9 + ?10 + ?11, ?2 * 10, ?12)".into(),
                args: (1..=11)
                    .map(|i| Arg::Int(if i == 2 { k } else { 1 }))
                    .chain([Arg::Text(&texts[k as usize])])
                    .collect(),
            })
            .collect();
        let changed = execute_all(&mut conn, "testing", &statements)
            .await
            .expect("execute");
        assert_eq!(changed, [1; 6]);
        let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as("SELECT k, a, b, c FROM t ORDER BY k")
            .fetch_all(&mut conn)
            .await
            .expect("read");
        let want: Vec<(i64, i64, i64, String)> =
            (0..6).map(|k| (k, 10, k * 10, format!("row {k}"))).collect();
        assert_eq!(rows, want);
    }

    /// The dialect's one-row aggregate gives back every row's columns
    /// exactly (the apply reads checkpoints and replaced documents so):
    /// text with quotes, backslashes, control characters and non-ASCII,
    /// integers, `NULL`, and no rows at all.
    #[tokio::test]
    async fn json_group_gives_back_every_row_exactly() {
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .expect("connect");
        sqlx::raw_sql("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
            .execute(&mut conn)
            .await
            .expect("create");
        let texts = [
            Some("{\"a\":\"q\\\"uote\"}".to_owned()),
            Some("tab\tnewline\ncontrol\u{1}back\\slash ü €".to_owned()),
            None,
        ];
        for (k, v) in texts.iter().enumerate() {
            sqlx::query("INSERT INTO t VALUES (?1, ?2)")
                .bind(k as i64 - 1)
                .bind(v.as_deref())
                .execute(&mut conn)
                .await
                .expect("insert");
        }
        let dialect = outbox_sql::Dialect::sqlite("0");
        for (filter, want) in [("k >= -1", 3), ("k > 5", 0)] {
            let sql = format!("SELECT {} FROM t WHERE {filter}", dialect.json_group("k, v"));
            let text: String = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(&mut conn)
                .await
                .expect("aggregate");
            let mut rows: Vec<(i64, Option<String>)> =
                outbox_sql::decode_json("testing", &text).expect("decode");
            rows.sort();
            assert_eq!(rows.len(), want, "{text}");
            for (i, (k, v)) in rows.iter().enumerate() {
                assert_eq!((*k, v), (i as i64 - 1, &texts[i]), "{text}");
            }
        }
        let err = outbox_sql::decode_json::<Vec<(i64, String)>>("reading things", "[[1, null]]")
            .expect_err("a NULL is not text");
        assert!(
            err.to_string().contains("reading things: the rows read back"),
            "{err}"
        );
    }

    #[test]
    fn placeholders_outside_quotes_take_one_argument_each() {
        let st = Statement {
            what: "testing",
            sql: "SELECT ?1, '?2', ?10 WHERE x = ?2 AND y = ?1".into(),
            args: (1..=10).map(Arg::Int).collect(),
        };
        let (mut sql, mut args) = (String::new(), Vec::new());
        anonymize(&st, &mut sql, &mut args).expect("anonymize");
        assert_eq!(sql, "SELECT ?, '?2', ? WHERE x = ? AND y = ?");
        assert_eq!(args, [Arg::Int(1), Arg::Int(10), Arg::Int(2), Arg::Int(1)]);
        let missing = Statement {
            sql: "SELECT ?11".into(),
            ..st
        };
        let err = anonymize(&missing, &mut sql, &mut args).expect_err("no eleventh argument");
        assert!(err.to_string().contains("?11 has no argument"), "{err}");
    }
}
