//! Publishing inside the application's own SQLite transactions: the job exists if and only if
//! the application's transaction commits. The one place the API shows a `rusqlite` type (the
//! `rusqlite` crate, at the version this crate depends on).
//!
//! The same validation and typed errors as [`Broker::publish`](crate::Broker::publish), dedup
//! keys included. A deferred transaction that read before another connection published (and
//! committed) cannot write on its old snapshot: the publish fails as a transient error
//! (`SQLITE_BUSY`); begin the transaction IMMEDIATE, or try it again, and a held key is a
//! `Duplicate` naming its holder. Subscribers see the row once the transaction commits:
//! brokers on the same file, in this process or another, see the commit through their change
//! probe within milliseconds.
//!
//! ```
//! use sqlbroker::{Broker, Message, Table};
//!
//! let dir = std::env::temp_dir().join(format!("sqlbroker-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let file = dir.join("app.db");
//! let broker = Broker::connect(&format!("sqlite:{}", file.display()))?;
//! let emails = Table::new("emails").text_column("to").lease(std::time::Duration::from_secs(30));
//! broker.create_table(&emails)?;
//!
//! // The `rusqlite` crate, re-exported at the version `publish` takes.
//! use sqlbroker::sqlite::driver::{Connection, TransactionBehavior};
//! let mut conn = Connection::open(&file)?;
//! // Other connections write the file too (the broker's own threads): wait for them, and
//! // begin IMMEDIATE, so the transaction never reads a snapshot another write made stale.
//! conn.busy_timeout(std::time::Duration::from_secs(5))?;
//! let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
//! sqlbroker::sqlite::publish(&tx, &emails, Message::new(b"welcome".to_vec()).set("to", "a@b.c"))?;
//! drop(tx); // rolled back: no job
//! let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
//! sqlbroker::sqlite::publish(&tx, &emails, Message::new(b"welcome".to_vec()).set("to", "a@b.c"))?;
//! tx.commit()?; // one job
//! let sub = broker.subscription(&emails).start()?;
//! sub.next_delivery().unwrap().ack()?;
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

/// The `rusqlite` crate, at the version these functions take: an application need not name
/// the exact version in its own `Cargo.toml`.
pub use ::rusqlite as driver;

use crate::dialect::sqlite::{sql_only, TxConn};
use crate::error::Result;
use crate::model::table::Table;
use crate::producing::message::Message;
use crate::producing::publish::Published;

/// Publishes one message inside `tx`; its id. Rolled back with `tx`.
pub fn publish(tx: &rusqlite::Transaction<'_>, table: &Table, message: Message) -> Result<i64> {
    crate::producing::publish::in_transaction(sql_only(), &mut TxConn(tx), table, message, true)
}

/// Publishes many messages inside `tx` (see [`Broker::publish_batch`](crate::Broker::publish_batch)).
/// Rolled back with `tx`.
pub fn publish_batch(
    tx: &rusqlite::Transaction<'_>,
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
