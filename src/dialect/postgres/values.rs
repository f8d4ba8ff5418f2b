//! [`Value`] to and from PostgreSQL's types: each parameter is checked against the type the
//! server gives it, and each result column read by its type.

use std::error::Error as StdError;
use std::time::SystemTime;

use bytes::BytesMut;
use postgres::types::{FromSql, IsNull, ToSql, Type};

use crate::Value;

type BoxError = Box<dyn StdError + Sync + Send>;

impl ToSql for Value {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(i) => match *ty {
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                Type::INT8 => i.to_sql(ty, out),
                Type::FLOAT8 => (*i as f64).to_sql(ty, out),
                _ => Err(format!("an integer does not fit a {ty} column").into()),
            },
            Value::Float(f) => match *ty {
                Type::FLOAT4 => (*f as f32).to_sql(ty, out),
                Type::FLOAT8 => f.to_sql(ty, out),
                _ => Err(format!("a float does not fit a {ty} column").into()),
            },
            // Each delegate writes its own binary format: check it fits before it writes.
            Value::Text(s) if <&str as ToSql>::accepts(ty) => s.as_str().to_sql(ty, out),
            Value::Bytes(b) if <&[u8] as ToSql>::accepts(ty) => b.as_slice().to_sql(ty, out),
            Value::Time(t) if <SystemTime as ToSql>::accepts(ty) => t.to_sql(ty, out),
            Value::Text(_) | Value::Bytes(_) | Value::Time(_) => {
                let kind = match self {
                    Value::Text(_) => "text",
                    Value::Bytes(_) => "bytes",
                    _ => "a time",
                };
                Err(format!("{kind} does not fit a {ty} column").into())
            }
        }
    }

    fn accepts(_ty: &Type) -> bool {
        // Checked per value in `to_sql`, which names the mismatch.
        true
    }

    postgres::types::to_sql_checked!();
}

impl<'a> FromSql<'a> for Value {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        Ok(match *ty {
            Type::INT2 => Value::Int(i16::from_sql(ty, raw)?.into()),
            Type::INT4 => Value::Int(i32::from_sql(ty, raw)?.into()),
            Type::INT8 => Value::Int(i64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Float(f32::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Value::Float(f64::from_sql(ty, raw)?),
            Type::BOOL => Value::Int(bool::from_sql(ty, raw)?.into()),
            Type::BYTEA => Value::Bytes(raw.to_vec()),
            Type::TIMESTAMPTZ | Type::TIMESTAMP => Value::Time(SystemTime::from_sql(ty, raw)?),
            _ => Value::Text(<&str>::from_sql(ty, raw)?.to_string()),
        })
    }

    fn from_sql_null(_ty: &Type) -> Result<Self, BoxError> {
        Ok(Value::Null)
    }

    fn accepts(ty: &Type) -> bool {
        matches!(
            *ty,
            Type::INT2
                | Type::INT4
                | Type::INT8
                | Type::FLOAT4
                | Type::FLOAT8
                | Type::BOOL
                | Type::BYTEA
                | Type::TIMESTAMPTZ
                | Type::TIMESTAMP
        ) || <&str as FromSql>::accepts(ty)
    }
}
