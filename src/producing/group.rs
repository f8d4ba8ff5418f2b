//! Publishing related jobs together: [`Broker::publish_group`] runs every publish of a group on
//! one connection in one transaction, so a group of jobs that wait on each other
//! ([`Message::after`]) is in the queue whole or not at all.

use std::sync::Arc;

use crate::broker::Broker;
use crate::dialect::DbConn;
use crate::error::Result;
use crate::model::table::Table;
use crate::producing::message::Message;
use crate::producing::publish::{one, Target};
use crate::runtime::{PooledConn, Queue};

/// The publishes of one [`Broker::publish_group`] call, in its transaction.
pub struct Group<'a> {
    broker: &'a Broker,
    /// The transaction's connection, from the first publish on.
    conn: Option<PooledConn>,
    /// Each table published to, and how many rows (announced after the commit).
    published: Vec<(Arc<Queue>, usize)>,
}

impl std::fmt::Debug for Group<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field(
                "published",
                &self.published.iter().map(|(_, n)| n).sum::<usize>(),
            )
            .finish()
    }
}

impl Group<'_> {
    /// Publishes `message` into `table` inside the group's transaction; its id, which later
    /// messages of the group may wait on ([`Message::after`]). As [`Broker::publish`]
    /// otherwise; an error here rolls back the whole group once the closure returns it.
    pub fn publish(&mut self, table: &Table, message: Message) -> Result<i64> {
        let q = self.broker.queue(table)?;
        if self.conn.is_none() {
            let mut conn = q.conn("publish")?;
            conn.batch(&q.sql.begin_write)
                .map_err(|e| e.during("publish", &q.spec.name))?;
            // Broken until the commit: never pooled mid-transaction.
            conn.mark_broken();
            self.conn = Some(conn);
        }
        let Some(conn) = self.conn.as_mut() else {
            unreachable!("the group's connection was just taken");
        };
        // In the group's transaction: no replacing a waiting job (`Message::replace_waiting`).
        let t = Target {
            queue: None,
            ..Target::of(&q)
        };
        let id = one(&t, &mut **conn, message)?;
        match self.published.iter_mut().find(|(p, _)| Arc::ptr_eq(p, &q)) {
            Some((_, n)) => *n += 1,
            None => self.published.push((q, 1)),
        }
        Ok(id)
    }
}

impl Broker {
    /// Publishes a group of related jobs in one transaction: `f` publishes each with
    /// [`Group::publish`] (into any tables of this broker's database), and the group commits
    /// when `f` returns `Ok`, or is rolled back whole when it returns an error. A job of the
    /// group can wait on one published before it ([`Message::after`]), so a workflow goes
    /// into the queue whole: "charge, then ship, then email".
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("orders").dependencies().lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// let (charge, ship, email) = broker.publish_group(|g| {
    ///     let charge = g.publish(&jobs, Message::new(b"charge".to_vec()))?;
    ///     let ship = g.publish(&jobs, Message::new(b"ship".to_vec()).after(charge))?;
    ///     let email = g.publish(&jobs, Message::new(b"email".to_vec()).after(ship))?;
    ///     Ok((charge, ship, email))
    /// })?;
    /// assert!(charge < ship && ship < email);
    /// assert_eq!(broker.stats(&jobs)?.waiting, 2);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// What `f` returns, or a publish's or the commit's error; nothing of the group is
    /// written then.
    pub fn publish_group<T>(&self, f: impl FnOnce(&mut Group<'_>) -> Result<T>) -> Result<T> {
        let mut group = Group {
            broker: self,
            conn: None,
            published: Vec::new(),
        };
        let out = f(&mut group);
        let Group {
            conn, published, ..
        } = group;
        let Some(mut conn) = conn else {
            return out;
        };
        let table = published.first().map_or("", |(q, _)| q.spec.name.as_str());
        let done = out.and_then(|v| {
            conn.batch("COMMIT")
                .map(|()| v)
                .map_err(|e| e.during("publish", table))
        });
        match &done {
            Ok(_) => {
                conn.set_broken(false);
                drop(conn);
                for (q, rows) in &published {
                    q.meters.published(*rows);
                    self.announce(q, *rows);
                }
            }
            Err(_) => conn.rollback_or_discard(),
        }
        done
    }
}
