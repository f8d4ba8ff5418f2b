//! [`Value`]s to and from the `mysql` driver's values: times as `DATETIME` in UTC, whole
//! seconds, with the civil date arithmetic that takes them there and back.

use std::time::{Duration, SystemTime};

use mysql::consts::ColumnType as MyType;

use crate::error::DbError;
use crate::model::schedule::{epoch_secs, from_epoch_secs};
use crate::model::value::Value;

/// The character set number MySQL reports for binary strings (`BLOB`, `VARBINARY`).
const BINARY_CHARSET: u16 = 63;

pub(super) fn to_mysql(v: &Value) -> Result<mysql::Value, DbError> {
    Ok(match v {
        Value::Null => mysql::Value::NULL,
        Value::Int(i) => mysql::Value::Int(*i),
        Value::Float(f) => mysql::Value::Double(*f),
        Value::Text(s) => mysql::Value::Bytes(s.as_bytes().to_vec()),
        Value::Bytes(b) => mysql::Value::Bytes(b.clone()),
        Value::Time(t) => datetime_value(*t)?,
    })
}

/// A time as a `DATETIME` parameter in UTC, whole seconds (rounded down, as the queue's times
/// already are).
fn datetime_value(t: SystemTime) -> Result<mysql::Value, DbError> {
    let (y, m, d, h, mi, s) = datetime_parts(t)?;
    Ok(mysql::Value::Date(y, m, d, h, mi, s, 0))
}

/// A time as the fields of a `DATETIME` in UTC (year, month, day, hour, minute, second), whole
/// seconds; an error outside its years 1..9999.
pub(super) fn datetime_parts(t: SystemTime) -> Result<(u16, u8, u8, u8, u8, u8), DbError> {
    let secs = epoch_secs(t);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    let year = u16::try_from(y)
        .ok()
        .filter(|y| (1..=9999).contains(y))
        .ok_or_else(|| {
            DbError::other(format!(
                "{secs} s from the epoch is outside DATETIME's years 1..9999"
            ))
        })?;
    Ok((
        year,
        m as u8,
        d as u8,
        (rem / 3600) as u8,
        (rem % 3600 / 60) as u8,
        (rem % 60) as u8,
    ))
}

/// A `DATETIME` (UTC) back to a time; `None` for MySQL's zero date.
fn datetime_time(y: u16, m: u8, d: u8, h: u8, mi: u8, s: u8, micros: u32) -> Option<SystemTime> {
    if m == 0 || d == 0 {
        return None;
    }
    let days = days_from_civil(i64::from(y), u32::from(m), u32::from(d));
    let secs = days * 86_400 + i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(s);
    Some(from_epoch_secs(secs) + Duration::from_micros(u64::from(micros)))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // [0, 399]
    let mp = i64::from((m + 9) % 12); // March = 0
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date `z` days after 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32; // [1, 31]
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32; // [1, 12]
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A result value, typed by its column: the binary protocol returns text and blobs alike as
/// bytes, told apart by the column's character set (63 is binary).
pub(super) fn from_mysql(v: mysql::Value, col: &mysql::Column) -> Value {
    match v {
        mysql::Value::NULL => Value::Null,
        mysql::Value::Int(i) => Value::Int(i),
        mysql::Value::UInt(u) => i64::try_from(u)
            .map(Value::Int)
            .unwrap_or(Value::Float(u as f64)),
        mysql::Value::Float(f) => Value::Float(f.into()),
        mysql::Value::Double(f) => Value::Float(f),
        mysql::Value::Date(y, m, d, h, mi, s, us) => {
            datetime_time(y, m, d, h, mi, s, us).map_or(Value::Null, Value::Time)
        }
        mysql::Value::Time(neg, days, h, m, s, us) => {
            // A TIME column (none of ours): its value as text, as MySQL shows it.
            let hours = days * 24 + u32::from(h);
            let frac = if us > 0 {
                format!(".{us:06}")
            } else {
                String::new()
            };
            Value::Text(format!(
                "{}{hours:02}:{m:02}:{s:02}{frac}",
                if neg { "-" } else { "" }
            ))
        }
        mysql::Value::Bytes(b) => match col.column_type() {
            MyType::MYSQL_TYPE_DECIMAL | MyType::MYSQL_TYPE_NEWDECIMAL => {
                match std::str::from_utf8(&b)
                    .ok()
                    .and_then(|s| s.parse::<f64>().ok())
                {
                    Some(f) => Value::Float(f),
                    None => Value::Text(String::from_utf8_lossy(&b).into_owned()),
                }
            }
            MyType::MYSQL_TYPE_JSON => Value::Text(String::from_utf8_lossy(&b).into_owned()),
            _ if col.character_set() == BINARY_CHARSET => Value::Bytes(b),
            _ => match String::from_utf8(b) {
                Ok(s) => Value::Text(s),
                Err(e) => Value::Bytes(e.into_bytes()),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        let cases: [(i64, (i64, u32, u32)); 9] = [
            (0, (1970, 1, 1)),
            (31, (1970, 2, 1)),
            (59, (1970, 3, 1)),
            (365, (1971, 1, 1)),
            (10_956, (1999, 12, 31)),
            (11_016, (2000, 2, 29)),
            (19_782, (2024, 2, 29)),
            (47_540, (2100, 2, 28)),
            (47_541, (2100, 3, 1)),
        ];
        for (days, ymd) in cases {
            assert_eq!(civil_from_days(days), ymd, "{days}");
            assert_eq!(days_from_civil(ymd.0, ymd.1, ymd.2), days, "{ymd:?}");
        }
        // Every day from 1970 to 2100 round-trips and follows the previous one.
        let mut prev = civil_from_days(-1);
        for z in 0..=days_from_civil(2100, 12, 31) {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
            assert!((y, m, d) > prev);
            prev = (y, m, d);
        }
    }

    #[test]
    fn datetime_values() {
        // 2024-02-29 13:45:07 UTC.
        let t = from_epoch_secs(1_709_214_307);
        assert_eq!(
            datetime_value(t).unwrap(),
            mysql::Value::Date(2024, 2, 29, 13, 45, 7, 0)
        );
        assert_eq!(datetime_time(2024, 2, 29, 13, 45, 7, 0), Some(t));
        // Sub-second parts are dropped on the way in, kept on the way out.
        assert_eq!(
            datetime_value(t + Duration::from_millis(999)).unwrap(),
            mysql::Value::Date(2024, 2, 29, 13, 45, 7, 0)
        );
        assert_eq!(
            datetime_time(2024, 2, 29, 13, 45, 7, 5),
            Some(t + Duration::from_micros(5))
        );
        assert_eq!(
            datetime_value(from_epoch_secs(0)).unwrap(),
            mysql::Value::Date(1970, 1, 1, 0, 0, 0, 0)
        );
        assert_eq!(
            datetime_value(from_epoch_secs(4_102_444_799)).unwrap(),
            mysql::Value::Date(2099, 12, 31, 23, 59, 59, 0)
        );
        assert_eq!(datetime_time(0, 0, 0, 0, 0, 0, 0), None);
        assert!(datetime_value(from_epoch_secs(253_402_300_800)).is_err()); // year 10000
        for secs in (0..4_102_444_800i64).step_by(86_399 * 7 + 3_601) {
            let t = from_epoch_secs(secs);
            let mysql::Value::Date(y, mo, d, h, mi, s, us) = datetime_value(t).unwrap() else {
                panic!()
            };
            assert_eq!(datetime_time(y, mo, d, h, mi, s, us), Some(t));
        }
    }
}
