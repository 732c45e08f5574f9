//! Between the engine's driver and the shared types: error mapping, bound
//! arguments and rows.

use std::fmt;

use outbox_core::Error;
use outbox_sql::{Arg, Row, Value};
use rusqlite::ErrorCode;
use rusqlite::types::{ToSqlOutput, ValueRef};

/// Whether the error is SQLite's "database is busy/locked".
pub(crate) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Maps a driver error, the adapter's one mapping (ADR 0038):
/// busy, locked, I/O and a full disk are temporary, everything else is
/// permanent; the message names what was being done.
pub(crate) fn engine_error(context: impl fmt::Display, e: rusqlite::Error) -> Error {
    // By result code (`crate::errors::temporary_code`), never by message.
    let temporary = match &e {
        rusqlite::Error::SqliteFailure(f, _) => crate::errors::temporary_code(f.extended_code),
        _ => matches!(
            e.sqlite_error_code(),
            Some(
                ErrorCode::DatabaseBusy
                    | ErrorCode::DatabaseLocked
                    | ErrorCode::SystemIoFailure
                    | ErrorCode::DiskFull
                    | ErrorCode::CannotOpen
                    | ErrorCode::FileLockingProtocolFailed
            )
        ),
    };
    let message = format!("{context}: {e}");
    if temporary {
        Error::temporary(message, e)
    } else {
        Error::storage(message, e)
    }
}

/// A shared statement's argument, owned so it can cross to the thread.
#[derive(Clone, Debug)]
pub(crate) enum OwnedArg {
    Int(Option<i64>),
    Text(Option<String>),
}

impl OwnedArg {
    pub(crate) fn from_args(args: &[Arg<'_>]) -> Vec<OwnedArg> {
        args.iter()
            .map(|a| match *a {
                Arg::Int(v) => OwnedArg::Int(Some(v)),
                Arg::OptInt(v) => OwnedArg::Int(v),
                Arg::Bool(b) => OwnedArg::Int(Some(i64::from(b))),
                Arg::Text(t) => OwnedArg::Text(Some(t.to_owned())),
                Arg::OptText(t) => OwnedArg::Text(t.map(str::to_owned)),
            })
            .collect()
    }
}

impl rusqlite::ToSql for OwnedArg {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            OwnedArg::Int(Some(v)) => ToSqlOutput::Borrowed(ValueRef::Integer(*v)),
            OwnedArg::Text(Some(t)) => ToSqlOutput::Borrowed(ValueRef::Text(t.as_bytes())),
            OwnedArg::Int(None) | OwnedArg::Text(None) => ToSqlOutput::Borrowed(ValueRef::Null),
        })
    }
}

/// A driver row as shared values, by each value's storage class.
pub(crate) fn to_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    let n = r.as_ref().column_count();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(match r.get_ref(i)? {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(v) => Value::Int(v),
            ValueRef::Real(v) => Value::Real(v),
            ValueRef::Text(t) => Value::Text(
                std::str::from_utf8(t)
                    .map_err(|e| rusqlite::Error::Utf8Error(i, e))?
                    .to_owned(),
            ),
            ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
        });
    }
    Ok(Row(out))
}
