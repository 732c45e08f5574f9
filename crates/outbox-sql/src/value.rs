//! Values bound to statements and read back from rows.

use outbox_core::{Error, Result};

/// A value bound to a statement parameter. The cold paths bind only these.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg<'a> {
    /// An integer (SQL `bigint` / `INTEGER`).
    Int(i64),
    /// An integer or `NULL`.
    OptInt(Option<i64>),
    /// Text.
    Text(&'a str),
    /// Text or `NULL`.
    OptText(Option<&'a str>),
    /// A boolean (`boolean` on Postgres, 0 or 1 on SQLite).
    Bool(bool),
}

/// One column of a row, as read back.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `NULL`.
    Null,
    /// An integer.
    Int(i64),
    /// A boolean (Postgres).
    Bool(bool),
    /// A floating-point number (only in hand-written projections' tables).
    Real(f64),
    /// Text.
    Text(String),
    /// Bytes.
    Bytes(Vec<u8>),
}

/// A row: its columns in `SELECT` order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row(pub Vec<Value>);

fn wrong(i: usize, want: &str, got: &Value) -> Error {
    Error::Storage {
        message: format!("column {i} is not {want}: {got:?}"),
        temporary: false,
        source: None,
    }
}

impl Row {
    fn get(&self, i: usize) -> Result<&Value> {
        self.0.get(i).ok_or_else(|| Error::Storage {
            message: format!("the row has no column {i}"),
            temporary: false,
            source: None,
        })
    }

    /// An integer column (a boolean reads as 0 or 1).
    pub fn int(&self, i: usize) -> Result<i64> {
        match self.get(i)? {
            Value::Int(v) => Ok(*v),
            Value::Bool(b) => Ok(i64::from(*b)),
            other => Err(wrong(i, "an integer", other)),
        }
    }

    /// An integer column that may be `NULL`.
    pub fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        match self.get(i)? {
            Value::Null => Ok(None),
            _ => self.int(i).map(Some),
        }
    }

    /// A boolean column (an integer reads as `!= 0`).
    pub fn bool(&self, i: usize) -> Result<bool> {
        match self.get(i)? {
            Value::Bool(b) => Ok(*b),
            Value::Int(v) => Ok(*v != 0),
            other => Err(wrong(i, "a boolean", other)),
        }
    }

    /// A text column.
    pub fn text(&self, i: usize) -> Result<String> {
        match self.get(i)? {
            Value::Text(t) => Ok(t.clone()),
            other => Err(wrong(i, "text", other)),
        }
    }

    /// A bytes column.
    pub fn bytes(&self, i: usize) -> Result<Vec<u8>> {
        match self.get(i)? {
            Value::Bytes(b) => Ok(b.clone()),
            other => Err(wrong(i, "bytes", other)),
        }
    }

    /// A text column that may be `NULL`.
    pub fn opt_text(&self, i: usize) -> Result<Option<String>> {
        match self.get(i)? {
            Value::Null => Ok(None),
            _ => self.text(i).map(Some),
        }
    }
}

/// The JSON text of `rows` (for instance a slice of tuples of `&str` and
/// integers, each a JSON array) to bind as one parameter and expand with
/// the dialect's `{rows}`: serialized from borrowed values, without
/// building a `serde_json::Value` per row first.
pub fn json_text<T: serde::Serialize + ?Sized>(rows: &T) -> Result<String> {
    serde_json::to_string(rows).map_err(|e| Error::Storage {
        message: format!("encoding statement rows as JSON: {e}"),
        temporary: false,
        source: None,
    })
}

/// [`json_text`] of `rows`, or `None` when there are none (the statement
/// that would take them is then not sent).
pub fn json_text_unless_empty<T: serde::Serialize>(rows: &[T]) -> Result<Option<String>> {
    (!rows.is_empty()).then(|| json_text(rows)).transpose()
}

/// Decodes a JSON text a statement built from its rows (see
/// [`Dialect::json_group`](crate::Dialect::json_group)) into `T` (for
/// instance a `Vec` of tuples, one per row); `what` names the statement
/// in the error.
pub fn decode_json<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| Error::Storage {
        message: format!("{what}: the rows read back are not the JSON expected: {e}"),
        temporary: false,
        source: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getters_convert_and_refuse() {
        let r = Row(vec![
            Value::Int(7),
            Value::Null,
            Value::Bool(true),
            Value::Text("x".into()),
        ]);
        assert_eq!(r.int(0).unwrap(), 7);
        assert_eq!(r.opt_int(1).unwrap(), None);
        assert_eq!(r.int(2).unwrap(), 1);
        assert!(r.bool(2).unwrap());
        assert!(r.bool(0).unwrap());
        assert_eq!(r.text(3).unwrap(), "x");
        assert_eq!(r.opt_text(1).unwrap(), None);
        assert!(r.text(0).is_err());
        assert!(r.int(3).is_err());
        assert!(r.int(9).is_err());
    }
}
