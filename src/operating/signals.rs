//! Signals ([`Message::after_signal`](crate::Message::after_signal)): sending one, and the
//! signals a table's jobs wait for, as operators see them.

use crate::broker::Broker;
use crate::dialect::DbConn;
use crate::error::{BrokerError, Result};
use crate::model::table::Table;
use crate::model::waits::WaitingSignal;
use crate::runtime::retrying_deadlocks;

impl Broker {
    /// Sends signal `name` on `table` with `payload`, and releases the jobs waiting for it
    /// ([`Message::after_signal`](crate::Message::after_signal)) that wait on nothing else: how
    /// many it released. In one transaction, across brokers and processes: a job published at
    /// the same instant either sees the signal at its publish (and waits on nothing for it)
    /// or is released by it, never both, never neither (both lock the signal's row in
    /// `sqlbroker_deps` first).
    ///
    /// A signal is a latch, kept in the database a day from when it was sent
    /// or last read by a publish (then swept): a job published meanwhile runs at once. A second
    /// signal of the same name changes nothing and returns 0: the first payload is kept, and
    /// is what every job waiting for the name reads. A job whose wait timed out
    /// ([`Message::wait_timeout`](crate::Message::wait_timeout)) is not counted.
    ///
    /// # Errors
    /// [`BrokerError::InvalidMessage`] for a table without
    /// [`Table::dependencies`](crate::Table::dependencies) or a name that is not 1 to 63
    /// characters of `A-Z a-z 0-9 _ . : -` (nothing changes); [`BrokerError::Database`] /
    /// [`BrokerError::Pool`] as for [`Broker::publish`] (a deadlock's victim is run again, 4
    /// times at most).
    pub fn signal(&self, table: &Table, name: &str, payload: &[u8]) -> Result<u64> {
        let q = self.queue(table)?;
        let bad = |reason: String| BrokerError::InvalidMessage {
            table: q.spec.name.clone(),
            reason,
        };
        if !q.spec.dependencies {
            return Err(bad(
                "Broker::signal on a table without dependencies (describe it with \
                 Table::dependencies)"
                    .into(),
            ));
        }
        crate::dialect::signals::check_name(name).map_err(bad)?;
        let mut conn = q.conn("signal")?;
        let err = |e: crate::error::DbError| e.during("signal", &q.spec.name);
        let released = retrying_deadlocks(|| {
            let conn: &mut dyn DbConn = &mut *conn;
            conn.batch(&q.sql.begin_write).map_err(err)?;
            let done = crate::runtime::signals::signal(&q.spec, &q.sql, conn, name, payload)
                .and_then(|n| conn.batch("COMMIT").map(|()| n));
            if done.is_err() {
                conn.rollback_or_discard();
            }
            done.map_err(err)
        })?;
        drop(conn);
        if released > 0 {
            self.announce(&q, usize::try_from(released).unwrap_or(usize::MAX));
        }
        Ok(released)
    }

    /// The signals jobs of `table` wait for (not come, not timed out), by name, each with how
    /// many jobs wait for it: at most 100 names. Empty for a table without
    /// [`Table::dependencies`](crate::Table::dependencies).
    pub fn waiting_signals(&self, table: &Table) -> Result<Vec<WaitingSignal>> {
        let q = self.queue(table)?;
        if !q.spec.dependencies {
            return Ok(Vec::new());
        }
        q.retrying("waiting signals", |conn| {
            crate::runtime::signals::waited(&q.spec, &q.sql, conn)
        })
    }
}
