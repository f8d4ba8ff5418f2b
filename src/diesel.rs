//! Publishing inside the application's own Diesel transactions: the job exists if and only if
//! the application's transaction commits, so it is enqueued atomically with the application's
//! own writes. For `diesel::PgConnection` (feature `diesel-postgres`),
//! `diesel::MysqlConnection` (`diesel-mysql`) and `diesel::SqliteConnection`
//! (`diesel-sqlite`); feature `diesel` is all three. The one place the API shows a Diesel type
//! (the `diesel` crate, 2.x).
//!
//! The same statements, validation and typed errors as the transactional publish of each
//! driver's module ([`postgres`](crate::postgres), [`mysql`](crate::mysql),
//! [`sqlite`](crate::sqlite)), dedup keys included: a held key is
//! [`BrokerError::Duplicate`] naming its holder, and a batch
//! skips held keys ([`Published::duplicates`]). What differs by database:
//!
//! - PostgreSQL: the publish also notifies the table's channel (`pg_notify`), which
//!   PostgreSQL delivers at the commit (not at all on a rollback), so idle subscriptions in
//!   any process wake then. At REPEATABLE READ or SERIALIZABLE, a key committed by another
//!   session after the transaction's snapshot cannot be read from it: the publish fails as a
//!   transient error ([`BrokerError::is_transient`]), and
//!   the same publish in a new transaction names the holder as a `Duplicate`.
//! - MySQL/MariaDB: a key committed after a REPEATABLE READ snapshot is a `Duplicate` naming
//!   that row too (the holder is read with a locking read). Subscribers see the row once the
//!   transaction commits, at their next poll (MySQL cannot notify: within milliseconds while
//!   rows keep arriving, within the poll interval, 250 ms by default, when idle).
//! - SQLite: a deferred transaction that read before another connection published (and
//!   committed) cannot write on its old snapshot: the publish fails as a transient error
//!   (`SQLITE_BUSY`); begin the transaction IMMEDIATE
//!   (`SqliteConnection::immediate_transaction`), or try it again. Brokers on the same file, in
//!   this process or another, see the commit through their change probe within milliseconds.
//!
//! Each call runs in a Diesel transaction of its own, nested in the application's (a
//! savepoint): a publish that fails leaves nothing of itself behind, and the application's
//! transaction goes on (a PostgreSQL transaction whose statement failed would otherwise be
//! aborted). Called outside any transaction, a publish commits on its own, as
//! [`Broker::publish`](crate::Broker::publish) does.
//!
//! ```no_run
//! # #[cfg(feature = "diesel-postgres")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use diesel::{Connection, PgConnection, RunQueryDsl};
//! use sqlbroker::{BrokerError, Message, Table};
//!
//! let mut conn = PgConnection::establish("postgres://postgres@127.0.0.1/test")?;
//! let emails = Table::new("emails").text_column("to");
//! conn.transaction(|conn| {
//!     diesel::sql_query("UPDATE accounts SET welcomed = true WHERE id = 42").execute(conn)?;
//!     let welcome = Message::new(b"welcome".to_vec()).set("to", "a@b.c");
//!     sqlbroker::diesel::publish(conn, &emails, welcome)?;
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })?; // the account update and the job, together
//! # Ok(()) }
//! # #[cfg(not(feature = "diesel-postgres"))]
//! # fn main() {}
//! ```

use ::diesel::result::Error as DieselError;
use ::diesel::Connection;

use crate::error::BrokerError;
use crate::error::DbError;
use crate::error::Result;
use crate::model::table::Table;
use crate::producing::message::Message;
use crate::producing::publish::Published;

/// A Diesel connection a job can be published on: `diesel::PgConnection`,
/// `diesel::MysqlConnection` and `diesel::SqliteConnection`, each with its feature. Sealed:
/// implemented here only.
pub trait PublishConnection: sealed::Sealed {
    /// See [`publish`].
    #[doc(hidden)]
    fn publish_one(&mut self, table: &Table, message: Message) -> Result<i64>;
    /// See [`publish_batch`].
    #[doc(hidden)]
    fn publish_many(&mut self, table: &Table, messages: Vec<Message>) -> Result<Published>;
}

mod sealed {
    pub trait Sealed {}
}

/// Publishes one message on `conn`, in its open transaction; its id. Rolled back with that
/// transaction.
pub fn publish<C: PublishConnection>(conn: &mut C, table: &Table, message: Message) -> Result<i64> {
    conn.publish_one(table, message)
}

/// Publishes many messages on `conn`, in its open transaction (see
/// [`Broker::publish_batch`](crate::Broker::publish_batch)): all or none. Rolled back with
/// that transaction.
pub fn publish_batch<C: PublishConnection>(
    conn: &mut C,
    table: &Table,
    messages: impl IntoIterator<Item = Message>,
) -> Result<Published> {
    conn.publish_many(table, messages.into_iter().collect())
}

/// Why a nested transaction failed: the publish's own error, or Diesel's (the savepoint, its
/// release or rollback).
enum Failed {
    Publish(BrokerError),
    Diesel(DieselError),
}

impl From<DieselError> for Failed {
    fn from(e: DieselError) -> Self {
        Failed::Diesel(e)
    }
}

/// Runs `publish` in a Diesel transaction nested in the application's (a savepoint; a
/// transaction of its own outside any). `fail` classifies Diesel's errors for the database.
fn nested<C: Connection, T>(
    conn: &mut C,
    table: &Table,
    fail: fn(DieselError) -> DbError,
    publish: impl FnOnce(&mut C) -> Result<T>,
) -> Result<T> {
    conn.transaction(|conn| publish(conn).map_err(Failed::Publish))
        .map_err(|e| match e {
            Failed::Publish(e) => e,
            Failed::Diesel(e) => fail(e).during("publish", table.name()),
        })
}

/// One connection type's implementation: the dialect's SQL and its Diesel glue.
macro_rules! publish_connection {
    ($feature:literal, $conn:ty, $dialect:ident) => {
        #[cfg(feature = $feature)]
        #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
        impl sealed::Sealed for $conn {}

        #[cfg(feature = $feature)]
        #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
        impl PublishConnection for $conn {
            fn publish_one(&mut self, table: &Table, message: Message) -> Result<i64> {
                use crate::dialect::$dialect::{diesel as glue, sql_only};
                nested(self, table, glue::fail, |conn| {
                    let mut conn = glue::DieselConn::new(conn);
                    crate::producing::publish::in_transaction(
                        sql_only(),
                        &mut conn,
                        table,
                        message,
                        false,
                    )
                })
            }

            fn publish_many(&mut self, table: &Table, messages: Vec<Message>) -> Result<Published> {
                use crate::dialect::$dialect::{diesel as glue, sql_only};
                nested(self, table, glue::fail, |conn| {
                    let mut conn = glue::DieselConn::new(conn);
                    crate::producing::publish::batch_in_transaction(
                        sql_only(),
                        &mut conn,
                        table,
                        messages,
                        false,
                    )
                })
            }
        }
    };
}

publish_connection!("diesel-postgres", ::diesel::PgConnection, postgres);
publish_connection!("diesel-mysql", ::diesel::MysqlConnection, mysql);
publish_connection!("diesel-sqlite", ::diesel::SqliteConnection, sqlite);
