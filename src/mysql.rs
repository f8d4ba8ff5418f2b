//! Publishing inside the application's own MySQL/MariaDB transactions: the job exists if and
//! only if the application's transaction commits. The one place the API shows a `mysql` type
//! (the `mysql` crate, at the version this crate depends on).
//!
//! The same validation and typed errors as [`Broker::publish`](crate::Broker::publish), dedup
//! keys included (a held key fails only its own insert: InnoDB rolls back the statement, not
//! the application's transaction). At REPEATABLE READ a key committed by another session
//! after the transaction's snapshot is a `Duplicate` naming that row too: the holder is read
//! with a locking read, which sees past the snapshot and keeps a shared lock on the holder's
//! row until the transaction ends (its ack waits for your commit or rollback). Subscribers
//! see the row once the transaction commits, at
//! their next poll (MySQL cannot notify: within milliseconds while rows keep arriving, within
//! the poll interval, 250 ms by default, when idle).
//!
//! ```no_run
//! use sqlbroker::mysql::driver as mysql; // the `mysql` crate, re-exported
//! use sqlbroker::{Message, Table};
//! use mysql::prelude::Queryable;
//!
//! let mut conn = mysql::Conn::new(mysql::Opts::from_url("mysql://root@127.0.0.1/test")?)?;
//! let emails = Table::new("emails").text_column("to");
//! let mut tx = conn.start_transaction(mysql::TxOpts::default())?;
//! tx.exec_drop("UPDATE accounts SET welcomed = 1 WHERE id = ?", (42,))?;
//! sqlbroker::mysql::publish(&mut tx, &emails, Message::new(b"welcome".to_vec()).set("to", "a@b.c"))?;
//! tx.commit()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

/// The `mysql` crate, at the version these functions take: an application need not name the
/// exact version in its own `Cargo.toml`.
pub use ::mysql as driver;

use crate::dialect::mysql::{sql_only, TxConn};
use crate::error::Result;
use crate::model::table::Table;
use crate::producing::message::Message;
use crate::producing::publish::Published;

/// Publishes one message inside `tx`; its id. Rolled back with `tx`.
pub fn publish(tx: &mut ::mysql::Transaction<'_>, table: &Table, message: Message) -> Result<i64> {
    crate::producing::publish::in_transaction(sql_only(), &mut TxConn(tx), table, message, true)
}

/// Publishes many messages inside `tx` (see [`Broker::publish_batch`](crate::Broker::publish_batch)).
/// Rolled back with `tx`.
pub fn publish_batch(
    tx: &mut ::mysql::Transaction<'_>,
    table: &Table,
    messages: impl IntoIterator<Item = Message>,
) -> Result<Published> {
    crate::producing::publish::batch_in_transaction(
        sql_only(),
        &mut TxConn(tx),
        table,
        messages.into_iter().collect(),
        true,
    )
}

/// Row lock form: runs `f` with the delivery's own `mysql::Conn`, inside the delivery's
/// transaction, under a savepoint: what `f` writes commits atomically with
/// [`Delivery::ack`](crate::Delivery::ack), and is undone by a retry, a dead letter, a drop, or
/// a crash of the process. If `f` returns `Err` its writes are rolled back to the savepoint at
/// once, and the delivery can still be settled.
///
/// Run statements on the connection directly: beginning, committing or rolling back a
/// transaction on it (or DDL, which commits implicitly) would end the delivery's.
/// [`BrokerError::Unsupported`](crate::BrokerError) for a lease or advisory delivery.
pub fn in_delivery<T, E>(
    delivery: &mut crate::consuming::delivery::Delivery,
    f: impl FnOnce(&mut ::mysql::Conn) -> std::result::Result<T, E>,
) -> Result<std::result::Result<T, E>> {
    delivery.in_transaction(f)
}
