//! [`Broker::publish`]: one message on the broker's pool. Apart from the rest of publishing
//! (`publish.rs`) because it also routes a collected message to its burst (`collect.rs`),
//! which is itself built on `publish.rs`: this way neither of the two names the other.

use crate::broker::Broker;
use crate::error::Result;
use crate::model::table::Table;
use crate::producing::message::Message;
use crate::producing::publish::{in_own_transaction, one, waits_on_others, Target};
use crate::runtime::retrying_deadlocks;

impl Broker {
    /// Publishes one message and returns the new row's id; it is due at once unless it was
    /// given a delay.
    ///
    /// # Errors
    ///
    /// Nothing is written on any error:
    /// - [`BrokerError::InvalidTable`](crate::BrokerError::InvalidTable) / [`BrokerError::InvalidMessage`](crate::BrokerError::InvalidMessage): the description or the
    ///   message is invalid (a value for a column the table does not describe, a
    ///   [`Message::traceparent`] that is not a valid W3C `traceparent` or is given for a table
    ///   without [`Table::traceparent`]);
    /// - [`BrokerError::Duplicate`](crate::BrokerError::Duplicate), with a dedup key ([`Message::dedup_key`], on a table
    ///   described with [`Table::dedup`]): the id of the unfinished row that holds the key
    ///   (with [`Message::replace_waiting`], a holder not in work is replaced instead and its
    ///   id returned);
    /// - [`BrokerError::Schema`](crate::BrokerError::Schema): the table does not exist (or its columns do not match the
    ///   description);
    /// - [`BrokerError::Database`](crate::BrokerError::Database) / [`BrokerError::Pool`](crate::BrokerError::Pool): the database failed or could not be
    ///   reached ([`BrokerError::is_transient`](crate::BrokerError::is_transient) tells whether to try again). A lost connection
    ///   cannot tell whether the insert committed: publish is not retried for you. A message
    ///   that waits on other jobs ([`Message::after`]) is published in a transaction of its
    ///   own, which runs again (4 times at most) when the database ends it as a deadlock's
    ///   victim (rolled back whole).
    pub fn publish(&self, table: &Table, message: Message) -> Result<i64> {
        let q = self.queue(table)?;
        if message.collecting().is_some() {
            let id = crate::producing::collect::publish(&q, message)?;
            q.meters.published(1);
            self.announce(&q, 1);
            return Ok(id);
        }
        let mut conn = q.conn("publish")?;
        let t = Target::of(&q);
        let id = match waits_on_others(&message) {
            false => one(&t, &mut *conn, message),
            true => retrying_deadlocks(|| {
                in_own_transaction(&t, &mut *conn, |conn| one(&t, conn, message.clone()))
            }),
        }
        .map_err(|e| q.explain_failure(&mut *conn, e))?;
        drop(conn);
        q.meters.published(1);
        self.announce(&q, 1);
        Ok(id)
    }
}
