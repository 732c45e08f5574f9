//! Boilerplate both adapters need around their driver, written once.

use outbox_core::{DigestBuilder, DigestValue};

use crate::{Row, Value};

/// Which database a file or schema holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Events, outbox rows, leases, the worker registry.
    Journal,
    /// Checkpoints, watermarks, runs, projection documents and tables.
    Projection,
}

impl Role {
    /// `journal` or `projection`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Journal => "journal",
            Role::Projection => "projection",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Feeds a table's rows into a digest: `table(name)`, then each row (the
/// usual body of an adapter's `digest_table`).
pub fn digest_rows(out: &mut DigestBuilder, table: &str, rows: &[Row]) {
    out.table(table);
    for row in rows {
        digest_row(out, row);
    }
}

/// Feeds one row into a digest, each value by its kind.
pub fn digest_row(out: &mut DigestBuilder, row: &Row) {
    let values: Vec<DigestValue<'_>> = row
        .0
        .iter()
        .map(|v| match v {
            Value::Null => DigestValue::Null,
            Value::Int(i) => DigestValue::Int(*i),
            Value::Bool(b) => DigestValue::Int(i64::from(*b)),
            Value::Real(r) => DigestValue::Real(*r),
            Value::Text(t) => DigestValue::Text(t),
            Value::Bytes(b) => DigestValue::Blob(b),
        })
        .collect();
    out.row(&values);
}
