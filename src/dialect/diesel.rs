//! What the three Diesel connections share (features `diesel-postgres`, `diesel-mysql`,
//! `diesel-sqlite`): the statements of a publish run through `diesel::sql_query` with each
//! [`Value`] bound by its SQL type (each database's `diesel.rs` says which), the ids they
//! return read back, and Diesel's errors classified.
//!
//! A publish reads only ids (`RETURNING id`, the dedup key's holder, MySQL's last insert id),
//! so a query here returns the first column of one-column rows as integers, and refuses any
//! other shape rather than misread it.

use ::diesel::deserialize::{self, QueryableByName};
use ::diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use ::diesel::result::{DatabaseErrorKind, Error};
use ::diesel::row::{NamedRow, Row};
use ::diesel::sql_types::{BigInt, Nullable};

use crate::error::{DbError, DbErrorKind};
use crate::model::value::Value;

/// A statement with its parameters bound.
pub(crate) type Query<'f, DB> = BoxedSqlQuery<'f, DB, SqlQuery>;

/// One row of a statement that returns ids: its only column, as an integer.
pub(crate) struct Id(pub Option<i64>);

impl<DB> QueryableByName<DB> for Id
where
    DB: ::diesel::backend::Backend,
    i64: ::diesel::deserialize::FromSql<BigInt, DB>,
{
    fn build<'a>(row: &impl NamedRow<'a, DB>) -> deserialize::Result<Self> {
        if row.field_count() != 1 {
            return Err(format!(
                "a row of {} columns where one id was expected",
                row.field_count()
            )
            .into());
        }
        Ok(Id(Row::get_value::<Nullable<BigInt>, Option<i64>, _>(
            row, 0,
        )?))
    }
}

/// Rows of ids as the queue logic reads rows.
pub(crate) fn rows(ids: Vec<Id>) -> Vec<Vec<Value>> {
    ids.into_iter()
        .map(|Id(id)| vec![id.map_or(Value::Null, Value::Int)])
        .collect()
}

/// What a database's error messages tell of kinds Diesel does not name (it keeps few error
/// codes: PostgreSQL's SQLSTATE and SQLite's result code are reduced to its
/// [`DatabaseErrorKind`]). The servers' English messages: a PostgreSQL server whose
/// `lc_messages` translates them has these errors classified `Other`.
pub(crate) struct Phrases {
    /// The statement or its transaction was rolled back and may be tried again (a deadlock,
    /// a lock wait or statement timeout, SQLite's busy database).
    pub transient: fn(&str) -> bool,
    /// A column the statement needs is missing, or of a type it cannot use.
    pub schema: fn(&str) -> bool,
}

/// A Diesel error as the queue logic classifies errors.
pub(crate) fn classify(e: Error, phrases: &Phrases) -> DbError {
    let kind = match &e {
        Error::DatabaseError(kind, info) => match kind {
            DatabaseErrorKind::SerializationFailure => DbErrorKind::Transient,
            DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand => {
                DbErrorKind::ConnectionLost
            }
            _ => {
                let message = info.message();
                if (phrases.transient)(message) {
                    DbErrorKind::Transient
                } else if (phrases.schema)(message) {
                    DbErrorKind::Schema
                } else {
                    DbErrorKind::Other
                }
            }
        },
        // Diesel's own errors (a broken transaction manager, a value that did not convert):
        // trying again on this connection will not help.
        _ => DbErrorKind::Other,
    };
    DbError::new(kind, e)
}

/// True if `e` is Diesel's report of a unique index violation (MySQL's held dedup key).
#[cfg(feature = "diesel-mysql")]
pub(crate) fn is_unique_violation(e: &DbError) -> bool {
    matches!(
        e.source.downcast_ref::<Error>(),
        Some(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _))
    )
}
