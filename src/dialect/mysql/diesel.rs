//! The application's Diesel `MysqlConnection` as a [`DbConn`] (feature `diesel-mysql`), for
//! publishing in its transaction: the statements of `sql.rs`, each [`Value`] bound as the
//! `mysql` driver sends it (`values.rs`: times as a `DATETIME` in UTC).

use ::diesel::connection::SimpleConnection;
use ::diesel::mysql::data_types::{MysqlTime, MysqlTimestampType};
use ::diesel::mysql::{Mysql, MysqlConnection};
use ::diesel::sql_types::{BigInt, Binary, Datetime, Double, Nullable, Text};
use ::diesel::RunQueryDsl;

use super::sql::LAST_INSERT_ID;
use super::values::datetime_parts;
use crate::dialect::diesel::{classify, rows, Id, Phrases, Query};
use crate::dialect::DbConn;
use crate::error::DbError;
use crate::model::value::Value;

/// The application's connection, inside its transaction, and the id its last single-row
/// insert assigned. Never pooled: broken or not is the application's business.
pub(crate) struct DieselConn<'a> {
    conn: &'a mut MysqlConnection,
    last_id: Option<i64>,
}

impl<'a> DieselConn<'a> {
    pub(crate) fn new(conn: &'a mut MysqlConnection) -> Self {
        DieselConn {
            conn,
            last_id: None,
        }
    }
}

/// What MySQL's messages say where Diesel keeps no error code: a lock wait timeout (1205, the
/// statement was rolled back; a deadlock, 1213, is Diesel's serialization failure); an unknown
/// column (1054).
const PHRASES: Phrases = Phrases {
    transient: |m| m.starts_with("Lock wait timeout exceeded"),
    schema: |m| m.starts_with("Unknown column"),
};

pub(crate) fn fail(e: ::diesel::result::Error) -> DbError {
    classify(e, &PHRASES)
}

/// `sql` with `params` bound.
fn bound<'f>(sql: &str, params: &'f [Value]) -> Result<Query<'f, Mysql>, DbError> {
    let mut q = ::diesel::sql_query(sql).into_boxed::<Mysql>();
    for v in params {
        q = match v {
            Value::Null => q.bind::<Nullable<Text>, _>(None::<&str>),
            Value::Int(i) => q.bind::<BigInt, _>(*i),
            Value::Float(f) => q.bind::<Double, _>(*f),
            Value::Text(s) => q.bind::<Text, _>(s.as_str()),
            Value::Bytes(b) => q.bind::<Binary, _>(b.as_slice()),
            Value::Time(t) => {
                let (y, m, d, h, mi, s) = datetime_parts(*t)?;
                let datetime = MysqlTime::new(
                    y.into(),
                    m.into(),
                    d.into(),
                    h.into(),
                    mi.into(),
                    s.into(),
                    0,
                    false,
                    MysqlTimestampType::MYSQL_TIMESTAMP_DATETIME,
                    0,
                );
                q.bind::<Datetime, _>(datetime)
            }
        };
    }
    Ok(q)
}

impl DbConn for DieselConn<'_> {
    /// A single-row insert also asks for the id it assigned (`LAST_INSERT_ID()`): what the
    /// `mysql` driver reports with the insert's answer is a statement of its own here.
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        self.last_id = None;
        let n = bound(sql, params)?.execute(self.conn).map_err(fail)?;
        if n == 1 && sql.starts_with("INSERT") {
            let id: Vec<Id> = ::diesel::sql_query(LAST_INSERT_ID)
                .load(self.conn)
                .map_err(fail)?;
            self.last_id = id.first().and_then(|id| id.0);
        }
        Ok(n as u64)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        let ids: Vec<Id> = bound(sql, params)?.load(self.conn).map_err(fail)?;
        Ok(rows(ids))
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.conn.batch_execute(sql).map_err(fail)
    }

    fn last_insert_id(&self) -> Option<i64> {
        self.last_id
    }

    fn is_broken(&self) -> bool {
        false
    }

    fn set_broken(&mut self, _: bool) {}
}

#[cfg(test)]
mod tests {
    use ::diesel::result::{DatabaseErrorKind, Error};

    use super::*;
    use crate::error::DbErrorKind;

    #[test]
    fn errors_are_classified_as_the_drivers_codes_are() {
        use DatabaseErrorKind::{SerializationFailure, UniqueViolation, Unknown};
        let cases = [
            (
                SerializationFailure,
                "Deadlock found",
                DbErrorKind::Transient,
            ),
            (
                Unknown,
                "Lock wait timeout exceeded; try restarting transaction",
                DbErrorKind::Transient,
            ),
            (
                Unknown,
                "Unknown column 'n' in 'field list'",
                DbErrorKind::Schema,
            ),
            (
                Unknown,
                "Table 'test.jobs' doesn't exist",
                DbErrorKind::Other,
            ),
            (
                UniqueViolation,
                "Duplicate entry 'x' for key 'k'",
                DbErrorKind::Other,
            ),
        ];
        for (diesel, message, want) in cases {
            let unique = matches!(diesel, UniqueViolation);
            let e = fail(Error::DatabaseError(diesel, Box::new(message.to_string())));
            assert_eq!(e.kind, want, "{message}");
            // A held dedup key is told apart from other failures (the insert skips it).
            assert_eq!(
                super::super::conn::is_duplicate_key(&e),
                unique,
                "{message}"
            );
        }
    }
}
