//! [`Value`] to and from PostgreSQL's types: each parameter is checked against the type the
//! server gives it, and each result column read by its type.

use std::error::Error as StdError;
use std::time::SystemTime;

use bytes::BytesMut;
use postgres::types::{Format, FromSql, IsNull, ToSql, Type};

use crate::model::value::Value;

type BoxError = Box<dyn StdError + Sync + Send>;

impl ToSql for Value {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        if *ty == Type::UNKNOWN {
            // An unnamed statement's parameter, sent untyped: as text the server reads by the
            // type it gives the parameter.
            return Ok(match text(self) {
                Some(t) => {
                    out.extend_from_slice(t.as_bytes());
                    IsNull::No
                }
                None => IsNull::Yes,
            });
        }
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

    fn encode_format(&self, ty: &Type) -> Format {
        if *ty == Type::UNKNOWN {
            Format::Text
        } else {
            Format::Binary
        }
    }

    postgres::types::to_sql_checked!();
}

/// A value in PostgreSQL's text input format; `None` for `NULL`. Times are UTC with the
/// offset written, in microseconds (what the binary format carries): a `timestamp` column
/// reads the same wall-clock time as from the binary format.
fn text(v: &Value) -> Option<String> {
    Some(match v {
        Value::Null => return None,
        Value::Int(i) => i.to_string(),
        Value::Float(f) if f.is_nan() => "NaN".into(),
        Value::Float(f) if f.is_infinite() => {
            if *f > 0.0 { "Infinity" } else { "-Infinity" }.into()
        }
        Value::Float(f) => format!("{f:?}"),
        Value::Text(s) => s.clone(),
        Value::Bytes(b) => {
            let mut s = String::with_capacity(2 + 2 * b.len());
            s.push_str("\\x");
            for byte in b {
                s.push_str(&format!("{byte:02x}"));
            }
            s
        }
        Value::Time(t) => utc_text(*t),
    })
}

/// `YYYY-MM-DD HH:MM:SS.ffffff+00` for a time (microseconds, rounded down).
fn utc_text(t: SystemTime) -> String {
    let micros: i128 = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_micros() as i128,
        Err(e) => -(e.duration().as_micros() as i128),
    };
    let secs = micros.div_euclid(1_000_000) as i64;
    let frac = micros.rem_euclid(1_000_000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{frac:06}+00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn text_format() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_micros(1_764_613_996_123_456);
        assert_eq!(utc_text(t), "2025-12-01 18:33:16.123456+00");
        assert_eq!(
            utc_text(SystemTime::UNIX_EPOCH),
            "1970-01-01 00:00:00.000000+00"
        );
        let before = SystemTime::UNIX_EPOCH - Duration::from_micros(1);
        assert_eq!(utc_text(before), "1969-12-31 23:59:59.999999+00");
        assert_eq!(
            utc_text(SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29 00:00:00.000000+00"
        );
        assert_eq!(text(&Value::Bytes(vec![0, 255])).unwrap(), "\\x00ff");
        assert_eq!(text(&Value::Float(0.1)).unwrap(), "0.1");
        assert_eq!(text(&Value::Null), None);
    }
}
