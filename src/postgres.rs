//! Publishing inside the application's own PostgreSQL transactions: the job exists if and only
//! if the application's transaction commits, so it is enqueued atomically with the
//! application's own writes. The one place the API shows a `postgres` type (the `postgres`
//! crate, at the version this crate depends on).
//!
//! The same validation and typed errors as [`Broker::publish`](crate::Broker::publish), dedup
//! keys included. Subscribers see the row once the transaction commits: a subscription on
//! another connection finds it at its next claim (its poll interval, 250 ms by default), as it
//! finds rows published by other processes.
//!
//! ```no_run
//! use sqlbroker::{Message, Table};
//!
//! let mut client = postgres::Client::connect("postgres://postgres@127.0.0.1/test", postgres::NoTls)?;
//! let emails = Table::new("emails").text_column("to");
//! let mut tx = client.transaction()?;
//! tx.execute("UPDATE accounts SET welcomed = true WHERE id = $1", &[&42i64])?;
//! sqlbroker::postgres::publish(&mut tx, &emails, Message::new(b"welcome".to_vec()).set("to", "a@b.c"))?;
//! tx.commit()?; // the account update and the job, together
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::dialect::postgres::{sql_only, TxConn};
use crate::{Message, Published, Result, Table};

/// Publishes one message inside `tx`; its id. Rolled back with `tx`.
pub fn publish(
    tx: &mut ::postgres::Transaction<'_>,
    table: &Table,
    message: Message,
) -> Result<i64> {
    crate::publish::in_transaction(sql_only(), &mut TxConn(tx), table, message)
}

/// Publishes many messages inside `tx` (see [`Broker::publish_batch`](crate::Broker::publish_batch)).
/// Rolled back with `tx`.
pub fn publish_batch(
    tx: &mut ::postgres::Transaction<'_>,
    table: &Table,
    messages: Vec<Message>,
) -> Result<Published> {
    crate::publish::batch_in_transaction(sql_only(), &mut TxConn(tx), table, messages)
}
