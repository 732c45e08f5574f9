//! The shared cold-path statements ([`outbox_sql`]) on Postgres: a
//! [`Conn`] over the driver and the [`Database`] of an open file.

use outbox_core::Result;
use outbox_sql::{Arg, Conn, Database, Dialect, Row, Tx, Value};
use sqlx::postgres::PgRow;
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, PgConnection, Postgres, Row as _, TypeInfo, ValueRef};

use std::sync::Arc;

use crate::db::{Db, storage};

/// Binds the shared arguments to a query, in order.
pub(crate) fn bind<'q>(
    mut q: Query<'q, Postgres, <Postgres as sqlx::Database>::Arguments>,
    args: &[Arg<'_>],
) -> Query<'q, Postgres, <Postgres as sqlx::Database>::Arguments> {
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
pub(crate) async fn execute(conn: &mut PgConnection, what: &str, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
    bind(sqlx::query(AssertSqlSafe(sql.to_owned())), args)
        .execute(conn)
        .await
        .map(|r| r.rows_affected())
        .map_err(|e| storage(what, e))
}

/// Binds `args` to `sql`, runs it and returns its rows.
pub(crate) async fn fetch(
    conn: &mut PgConnection,
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

/// A driver row as shared values, by each column's Postgres type.
pub(crate) fn to_row(r: &PgRow) -> sqlx::Result<Row> {
    let mut out = Vec::with_capacity(r.len());
    for i in 0..r.len() {
        let raw = r.try_get_raw(i)?;
        let v = if raw.is_null() {
            Value::Null
        } else {
            match raw.type_info().name() {
                "INT8" => Value::Int(r.try_get(i)?),
                "INT4" => Value::Int(i64::from(r.try_get::<i32, _>(i)?)),
                "INT2" => Value::Int(i64::from(r.try_get::<i16, _>(i)?)),
                "BOOL" => Value::Bool(r.try_get(i)?),
                "FLOAT4" => Value::Real(f64::from(r.try_get::<f32, _>(i)?)),
                "FLOAT8" => Value::Real(r.try_get(i)?),
                "BYTEA" => Value::Bytes(r.try_get(i)?),
                "VOID" => Value::Null,
                _ => Value::Text(r.try_get(i)?),
            }
        };
        out.push(v);
    }
    Ok(Row(out))
}

/// A write transaction (or a read-only one: a snapshot).
pub(crate) struct WriteTx(pub(crate) sqlx::Transaction<'static, Postgres>);

/// A connection from the pool.
pub(crate) struct ReadConn(pub(crate) sqlx::pool::PoolConnection<Postgres>);

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

/// One role's view of a schema: the pool and the clock of that role (the
/// journal and the projection store keep their test clock offsets apart,
/// also when they share a schema and a pool).
#[derive(Debug)]
pub(crate) struct RoleDb {
    pub(crate) db: Arc<Db>,
    pub(crate) dialect: Arc<Dialect>,
}

impl RoleDb {
    pub(crate) fn new(db: Arc<Db>, now: &str) -> Self {
        RoleDb {
            db,
            dialect: Arc::new(Dialect::postgres(now)),
        }
    }
}

#[outbox_core::async_trait]
impl Database for RoleDb {
    fn dialect(&self) -> &Dialect {
        &self.dialect
    }

    async fn begin(&self) -> Result<Box<dyn Tx + '_>> {
        Ok(Box::new(WriteTx(self.db.begin().await?)))
    }

    async fn read(&self) -> Result<Box<dyn Conn + '_>> {
        let conn = self
            .db
            .pool
            .acquire()
            .await
            .map_err(|e| storage(self.db.context("acquiring a connection"), e))?;
        Ok(Box::new(ReadConn(conn)))
    }

    async fn snapshot(&self) -> Result<Box<dyn Tx + '_>> {
        let tx = self
            .db
            .pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .await
            .map_err(|e| storage(self.db.context("starting a read transaction"), e))?;
        Ok(Box::new(WriteTx(tx)))
    }
}
