//! The shared cold-path statements ([`outbox_sql`]) on Postgres: a
//! [`Conn`] over the driver and the [`Database`] of an open file.

use outbox_core::Result;
use outbox_sql::{Conn, Database, Dialect, Row, Tx, Value};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row as _, TypeInfo, ValueRef};

use std::sync::Arc;

use crate::db::{Db, storage};

outbox_sql::driver_io!(PgConnection);

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

outbox_sql::driver_conns!(sqlx::Postgres);

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
