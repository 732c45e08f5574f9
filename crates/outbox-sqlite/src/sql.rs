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
