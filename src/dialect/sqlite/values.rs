//! [`Value`] to and from SQLite's values: times as `INTEGER` seconds since the Unix epoch.

use rusqlite::types::{ToSqlOutput, ValueRef};

use crate::model::schedule::epoch_secs;
use crate::model::value::Value;

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Value::Null => ToSqlOutput::Owned(rusqlite::types::Value::Null),
            Value::Int(i) => ToSqlOutput::Owned(rusqlite::types::Value::Integer(*i)),
            Value::Float(f) => ToSqlOutput::Owned(rusqlite::types::Value::Real(*f)),
            Value::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
            Value::Bytes(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
            Value::Time(t) => ToSqlOutput::Owned(rusqlite::types::Value::Integer(epoch_secs(*t))),
        })
    }
}

pub(super) fn from_ref(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(f) => Value::Float(f),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
    }
}
