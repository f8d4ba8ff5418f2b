//! Publishing inside the application's own PostgreSQL transactions: the job exists if and only
//! if the application's transaction commits, so it is enqueued atomically with the
//! application's own writes. The one place the API shows a `postgres` type (the `postgres`
//! crate, at the version this crate depends on).
//!
//! The same validation and typed errors as [`Broker::publish`](crate::Broker::publish), dedup
//! keys included. At REPEATABLE READ or SERIALIZABLE, a key committed by another session after
//! the transaction's snapshot cannot be read from it: the publish fails as a transient error
//! (PostgreSQL's serialization failure; [`BrokerError::is_transient`](crate::BrokerError::is_transient)),
//! the transaction is aborted, and the same publish in a new transaction names the holder as a
//! `Duplicate`. Subscribers see the row once the transaction commits: the publish also
//! notifies the table's channel (`pg_notify`), which PostgreSQL delivers at the commit (not at
//! all on a rollback), so idle subscriptions in any process wake then.
//!
//! ```no_run
//! use sqlbroker::{Message, Table};
//!
//! use sqlbroker::postgres::driver::{Client, NoTls}; // the `postgres` crate, re-exported
//!
//! let mut client = Client::connect("postgres://postgres@127.0.0.1/test", NoTls)?;
//! let emails = Table::new("emails").text_column("to");
//! let mut tx = client.transaction()?;
//! tx.execute("UPDATE accounts SET welcomed = true WHERE id = $1", &[&42i64])?;
//! sqlbroker::postgres::publish(&mut tx, &emails, Message::new(b"welcome".to_vec()).set("to", "a@b.c"))?;
//! tx.commit()?; // the account update and the job, together
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

/// The `postgres` crate, at the version these functions take: an application need not name
/// the exact version in its own `Cargo.toml`.
pub use ::postgres as driver;

use crate::dialect::postgres::{sql_only, TxConn};
use crate::error::Result;
use crate::model::table::Table;
use crate::producing::message::Message;
use crate::producing::publish::Published;

/// Publishes one message inside `tx`; its id. Rolled back with `tx`.
pub fn publish(
    tx: &mut ::postgres::Transaction<'_>,
    table: &Table,
    message: Message,
) -> Result<i64> {
    crate::producing::publish::in_transaction(sql_only(), &mut TxConn(tx), table, message, true)
}

/// Publishes many messages inside `tx` (see [`Broker::publish_batch`](crate::Broker::publish_batch)).
/// Rolled back with `tx`.
pub fn publish_batch(
    tx: &mut ::postgres::Transaction<'_>,
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

/// Row lock form: runs `f` with the delivery's own `postgres::Client`, inside the delivery's
/// transaction, under a savepoint: what `f` writes commits atomically with
/// [`Delivery::ack`](crate::Delivery::ack) (exactly-once effects for database work), and is
/// undone by a retry, a dead letter, a drop, or a crash of the process. If `f` returns `Err`
/// its writes are rolled back to the savepoint at once, and the delivery can still be settled
/// (say, [`fail`](crate::Delivery::fail)ed).
///
/// Run statements on the client directly: beginning, committing or rolling back a transaction
/// on it would end the delivery's. [`BrokerError::Unsupported`](crate::BrokerError) for a
/// lease or advisory delivery (no transaction is open there).
///
/// ```no_run
/// # fn demo(sub: &sqlbroker::Subscription) -> Result<(), Box<dyn std::error::Error>> {
/// let mut d = sub.next_delivery().unwrap();
/// sqlbroker::postgres::in_delivery(&mut d, |client| {
///     client.execute("INSERT INTO ledger (delivery) VALUES ($1)", &[&d_id(42)])
/// })??;
/// d.ack()?; // the ledger row and the ack, in one commit
/// # Ok(()) }
/// # fn d_id(i: i64) -> i64 { i }
/// ```
pub fn in_delivery<T, E>(
    delivery: &mut crate::consuming::delivery::Delivery,
    f: impl FnOnce(&mut ::postgres::Client) -> std::result::Result<T, E>,
) -> Result<std::result::Result<T, E>> {
    delivery.in_transaction(f)
}
