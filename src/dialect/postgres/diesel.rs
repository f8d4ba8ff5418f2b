//! The application's Diesel `PgConnection` as a [`DbConn`] (feature `diesel-postgres`), for
//! publishing in its transaction: the statements of `sql.rs`, each [`Value`] bound with the
//! PostgreSQL type it has in the `postgres` driver's hands (`values.rs`).

use std::time::{SystemTime, UNIX_EPOCH};

use ::diesel::connection::SimpleConnection;
use ::diesel::pg::data_types::PgTimestamp;
use ::diesel::pg::{Pg, PgConnection, PgTypeMetadata};
use ::diesel::serialize::{self, IsNull, Output, ToSql};
use ::diesel::sql_types::{self, BigInt, Binary, Double, HasSqlType, Nullable, Text, Timestamptz};
use ::diesel::RunQueryDsl;

use crate::dialect::diesel::{classify, rows, Id, Phrases, Query};
use crate::dialect::DbConn;
use crate::error::DbError;
use crate::model::value::Value;

/// The application's connection, inside its transaction. Never pooled: broken or not is the
/// application's business.
pub(crate) struct DieselConn<'a>(&'a mut PgConnection);

impl<'a> DieselConn<'a> {
    pub(crate) fn new(conn: &'a mut PgConnection) -> Self {
        DieselConn(conn)
    }
}

/// What PostgreSQL's messages say where Diesel keeps no SQLSTATE: a deadlock, `lock_timeout`
/// and `statement_timeout` (the statement was rolled back); an undefined column, a type the
/// statement cannot assign, an undefined function or operator (as `conn.rs` classifies the
/// driver's codes; an undefined table stays `Other` there and here).
const PHRASES: Phrases = Phrases {
    transient: |m| {
        m.starts_with("deadlock detected")
            || m.starts_with("canceling statement due to lock timeout")
            || m.starts_with("canceling statement due to statement timeout")
    },
    schema: |m| {
        let undefined = |what: &str| m.starts_with(what) && m.ends_with(" does not exist");
        undefined("column ")
            || undefined("function ")
            || m.starts_with("operator does not exist")
            || m.contains(" is of type ")
    },
};

pub(crate) fn fail(e: ::diesel::result::Error) -> DbError {
    classify(e, &PHRASES)
}

/// `sql` with `params` bound.
fn bound<'f>(sql: &str, params: &'f [Value]) -> Query<'f, Pg> {
    let mut q = ::diesel::sql_query(sql).into_boxed::<Pg>();
    for v in params {
        q = match v {
            Value::Null => q.bind::<Nullable<Unknown>, _>(None::<Untyped>),
            Value::Int(i) => q.bind::<BigInt, _>(*i),
            Value::Float(f) => q.bind::<Double, _>(*f),
            Value::Text(s) => q.bind::<Text, _>(s.as_str()),
            Value::Bytes(b) => q.bind::<Binary, _>(b.as_slice()),
            Value::Time(t) => q.bind::<Timestamptz, _>(timestamp(*t)),
        };
    }
    q
}

/// Microseconds since 2000-01-01 UTC, PostgreSQL's timestamp.
fn timestamp(t: SystemTime) -> PgTimestamp {
    const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;
    let unix_micros = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_micros() as i64,
        Err(e) => -(e.duration().as_micros() as i64),
    };
    PgTimestamp(unix_micros - PG_EPOCH_MICROS)
}

/// A parameter of no stated type (OID 0): the server infers it from where it goes, as it does
/// for the `postgres` driver's parameters. Only `NULL` is sent so: it has no bytes whose
/// format could disagree with the inferred type, and a typed `NULL` (text, say) would not be
/// assigned to a column of another type.
#[derive(Debug, Clone, Copy)]
struct Unknown;

impl sql_types::SqlType for Unknown {
    type IsNull = sql_types::is_nullable::NotNull;
}

impl sql_types::SingleValue for Unknown {}

impl HasSqlType<Unknown> for Pg {
    fn metadata(_: &mut Self::MetadataLookup) -> PgTypeMetadata {
        PgTypeMetadata::new(0, 0)
    }
}

/// The value of an [`Unknown`] parameter, only ever bound as `None` (SQL `NULL`).
#[derive(Debug)]
struct Untyped;

impl ToSql<Unknown, Pg> for Untyped {
    fn to_sql<'b>(&'b self, _: &mut Output<'b, '_, Pg>) -> serialize::Result {
        Ok(IsNull::Yes)
    }
}

impl DbConn for DieselConn<'_> {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        let n = bound(sql, params).execute(self.0).map_err(fail)?;
        Ok(n as u64)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        let ids: Vec<Id> = bound(sql, params).load(self.0).map_err(fail)?;
        Ok(rows(ids))
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.0.batch_execute(sql).map_err(fail)
    }

    fn is_broken(&self) -> bool {
        false
    }

    fn set_broken(&mut self, _: bool) {}
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ::diesel::result::{DatabaseErrorKind, Error};

    use super::*;
    use crate::error::DbErrorKind;

    fn kind(diesel: DatabaseErrorKind, message: &str) -> DbErrorKind {
        fail(Error::DatabaseError(diesel, Box::new(message.to_string()))).kind
    }

    #[test]
    fn errors_are_classified_as_the_drivers_codes_are() {
        use DatabaseErrorKind::{
            ClosedConnection, NotNullViolation, SerializationFailure, Unknown,
        };
        let cases = [
            (
                SerializationFailure,
                "could not serialize access",
                DbErrorKind::Transient,
            ),
            (Unknown, "deadlock detected", DbErrorKind::Transient),
            (
                Unknown,
                "canceling statement due to lock timeout",
                DbErrorKind::Transient,
            ),
            (
                Unknown,
                "canceling statement due to statement timeout",
                DbErrorKind::Transient,
            ),
            (
                ClosedConnection,
                "server closed the connection",
                DbErrorKind::ConnectionLost,
            ),
            (Unknown, "column \"n\" does not exist", DbErrorKind::Schema),
            (
                Unknown,
                "column \"n\" is of type bigint but expression is of type text",
                DbErrorKind::Schema,
            ),
            (
                Unknown,
                "operator does not exist: text = bigint",
                DbErrorKind::Schema,
            ),
            (
                Unknown,
                "function f(bigint) does not exist",
                DbErrorKind::Schema,
            ),
            (
                Unknown,
                "relation \"jobs\" does not exist",
                DbErrorKind::Other,
            ),
            (
                NotNullViolation,
                "null value in column \"payload\" violates not-null constraint",
                DbErrorKind::Other,
            ),
        ];
        for (diesel, message, want) in cases {
            assert_eq!(kind(diesel, message), want, "{message}");
        }
    }

    #[test]
    fn times_count_from_2000() {
        let y2k = UNIX_EPOCH + Duration::from_secs(946_684_800);
        assert_eq!(timestamp(y2k).0, 0);
        assert_eq!(
            timestamp(y2k + Duration::from_micros(1_500_000)).0,
            1_500_000
        );
        assert_eq!(timestamp(UNIX_EPOCH).0, -946_684_800_000_000);
        assert_eq!(
            timestamp(UNIX_EPOCH - Duration::from_secs(1)).0,
            -946_684_801_000_000
        );
    }
}
