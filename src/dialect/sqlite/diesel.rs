//! The application's Diesel `SqliteConnection` as a [`DbConn`] (feature `diesel-sqlite`), for
//! publishing in its transaction: the statements of `sql.rs`, each [`Value`] bound as
//! `values.rs` stores it (times as `INTEGER` seconds since the Unix epoch). Inside the
//! transaction, SQLite's write lock is the transaction's: the process's writer lock (`conn.rs`)
//! is not taken, as for a `rusqlite` transaction.

use ::diesel::connection::SimpleConnection;
use ::diesel::sql_types::{BigInt, Binary, Double, Nullable, Text};
use ::diesel::sqlite::{Sqlite, SqliteConnection};
use ::diesel::RunQueryDsl;

use crate::dialect::diesel::{classify, rows, Id, Phrases, Query};
use crate::dialect::DbConn;
use crate::error::DbError;
use crate::model::schedule::epoch_secs;
use crate::model::value::Value;

/// The application's connection, inside its transaction. Never pooled: broken or not is the
/// application's business.
pub(crate) struct DieselConn<'a>(&'a mut SqliteConnection);

impl<'a> DieselConn<'a> {
    pub(crate) fn new(conn: &'a mut SqliteConnection) -> Self {
        DieselConn(conn)
    }
}

/// What SQLite's messages say where Diesel keeps no result code: `SQLITE_BUSY` and
/// `SQLITE_LOCKED` (another connection holds the write lock, or the transaction's snapshot is
/// stale); a missing column (as `conn.rs` classifies rusqlite's errors).
const PHRASES: Phrases = Phrases {
    transient: |m| m.starts_with("database is locked") || m.starts_with("database table is locked"),
    schema: |m| m.starts_with("no such column"),
};

pub(crate) fn fail(e: ::diesel::result::Error) -> DbError {
    classify(e, &PHRASES)
}

/// `sql` with `params` bound.
fn bound<'f>(sql: &str, params: &'f [Value]) -> Query<'f, Sqlite> {
    let mut q = ::diesel::sql_query(sql).into_boxed::<Sqlite>();
    for v in params {
        q = match v {
            Value::Null => q.bind::<Nullable<Text>, _>(None::<&str>),
            Value::Int(i) => q.bind::<BigInt, _>(*i),
            Value::Float(f) => q.bind::<Double, _>(*f),
            Value::Text(s) => q.bind::<Text, _>(s.as_str()),
            Value::Bytes(b) => q.bind::<Binary, _>(b.as_slice()),
            Value::Time(t) => q.bind::<BigInt, _>(epoch_secs(*t)),
        };
    }
    q
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
    use ::diesel::result::{DatabaseErrorKind, Error};

    use super::*;
    use crate::error::DbErrorKind;

    #[test]
    fn errors_are_classified_as_the_drivers_codes_are() {
        use DatabaseErrorKind::{UniqueViolation, Unknown};
        let cases = [
            (Unknown, "database is locked", DbErrorKind::Transient),
            (Unknown, "database table is locked", DbErrorKind::Transient),
            (Unknown, "no such column: n", DbErrorKind::Schema),
            (Unknown, "no such table: jobs", DbErrorKind::Other),
            (
                UniqueViolation,
                "UNIQUE constraint failed: t.k",
                DbErrorKind::Other,
            ),
        ];
        for (diesel, message, want) in cases {
            let e = fail(Error::DatabaseError(diesel, Box::new(message.to_string())));
            assert_eq!(e.kind, want, "{message}");
        }
    }
}
