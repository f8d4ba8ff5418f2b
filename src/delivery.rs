//! A claimed row in the application's hands.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::dialect::DbConn;
use crate::form::{self, Claimed, Hold, Outcome};
use crate::runtime::Ctx;
use crate::schedule::{drop_delay, due_at};
use crate::{Result, Value};

/// How long a delivery's drop waits for a pooled connection (lease form, SQLite advisory form)
/// before it gives up and leaves the row to its lease: a drop runs on a handler's thread,
/// perhaps while it unwinds, and must not block it for the pool's whole timeout.
const DROP_WAIT: Duration = Duration::from_secs(1);

/// A claimed row, held for its handler until it is settled.
///
/// Settle it with exactly one of [`ack`](Delivery::ack), [`retry`](Delivery::retry),
/// [`retry_after`](Delivery::retry_after) or [`dead_letter`](Delivery::dead_letter); each consumes
/// the delivery.
///
/// Dropping it unsettled (a handler that panicked, or forgot) counts as a failed attempt, in
/// every form: the row is retried after a short delay (1 s after the first attempt, doubling, at
/// most a minute), or dead-lettered once the table's
/// [`max_attempts`](crate::Table::max_attempts) are spent, so a poison row cannot loop. The drop
/// never panics and waits at most about a second for a connection; if the row cannot be
/// written then, the database returns it as a crash would (lease: when the lease expires).
#[must_use = "a delivery holds its row until it is settled; dropping it counts a failed attempt"]
pub struct Delivery {
    id: i64,
    attempt: u32,
    payload: Vec<u8>,
    values: Vec<Value>,
    hold: Option<Hold>,
    /// Handed to the application by the `next_delivery` family. A delivery dropped before that
    /// (the subscription closed with it queued) is handed back unspent.
    handed_out: bool,
    ctx: Arc<Ctx>,
}

impl Delivery {
    pub(crate) fn new(ctx: Arc<Ctx>, c: Claimed) -> Self {
        Delivery {
            id: c.id,
            attempt: c.attempt,
            payload: c.payload,
            values: c.values,
            hold: Some(c.hold),
            handed_out: false,
            ctx,
        }
    }

    /// The application has it now: a drop from here on is a failed attempt.
    pub(crate) fn hand_out(mut self) -> Self {
        self.handed_out = true;
        self
    }

    /// The row's id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Which attempt this is: 1 on the first delivery, in every form.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The body.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The value of a column of the table's description (`None` for a column it does not
    /// describe; [`Value::Null`] for SQL `NULL`).
    pub fn get(&self, column: &str) -> Option<&Value> {
        self.ctx
            .spec()
            .column_index(column)
            .and_then(|i| self.values.get(i))
    }

    /// The name of the table the row is in.
    pub fn table(&self) -> &str {
        &self.ctx.spec().name
    }

    /// The advisory key that holds the row (advisory lock form).
    pub fn key(&self) -> Option<&str> {
        match &self.hold {
            Some(Hold::Advisory(k)) => Some(&k.key),
            _ => None,
        }
    }

    /// Row lock form: runs `f` on the delivery's own connection, inside its transaction, under
    /// a savepoint: what `f` writes commits with the ack, atomically, and is undone by a retry,
    /// a dead letter, a drop or a crash. If `f` returns `Err`, its writes are rolled back to the
    /// savepoint at once (the transaction stays usable, so the delivery can still be settled).
    /// `Unsupported` in the other forms (no transaction is open there).
    pub(crate) fn in_transaction<C: 'static, T, E>(
        &mut self,
        f: impl FnOnce(&mut C) -> std::result::Result<T, E>,
    ) -> Result<std::result::Result<T, E>> {
        let table = self.ctx.spec().name.clone();
        let unsupported = |why| crate::BrokerError::Unsupported {
            database: self.ctx.queue.dialect.database(),
            what: "transactional completion".into(),
            why,
        };
        let Some(Hold::RowLock(conn)) = &mut self.hold else {
            return Err(unsupported(
                "only a row lock delivery has a transaction open; describe the table with neither \
                 lease nor advisory_lock",
            ));
        };
        let err = |e: crate::error::DbError| e.during("transactional completion", &table);
        conn.batch("SAVEPOINT sqlbroker_handler").map_err(err)?;
        let Some(client) = conn.driver().and_then(|d| d.downcast_mut::<C>()) else {
            return Err(unsupported(
                "this delivery's connection is of another database's driver",
            ));
        };
        let out = f(client);
        let end = if out.is_ok() {
            "RELEASE SAVEPOINT sqlbroker_handler"
        } else {
            "ROLLBACK TO SAVEPOINT sqlbroker_handler"
        };
        conn.batch(end).map_err(err)?;
        Ok(out)
    }

    /// Lease form: the deadline the delivery's lease holds as far as this process knows (it
    /// moves with every renewal and [`extend`](Delivery::extend)); `None` in the other forms.
    /// A deadline in the past means the lease may be lost: the row may be another handler's.
    /// Reads no database; a settlement (or `extend`) is the definite answer.
    pub fn lease_deadline(&self) -> Option<SystemTime> {
        match &self.hold {
            Some(Hold::Lease(cell)) => Some(cell.lock().token),
            _ => None,
        }
    }

    /// Lease form: true while [`lease_deadline`](Delivery::lease_deadline) is in the future;
    /// always true in the other forms (their rows are held until settled).
    pub fn lease_held(&self) -> bool {
        let now = SystemTime::now();
        self.lease_deadline().map_or(true, |until| until > now)
    }

    /// Lease form: pushes the lease's deadline to at least `by` from now (whole seconds,
    /// rounded up), for a known long step; fenced by the token like every settlement, so a
    /// lost lease gives [`BrokerError::LeaseLost`](crate::BrokerError::LeaseLost) and changes
    /// nothing. Returns the new deadline. The renewer keeps renewing as usual once the
    /// deadline comes closer than a renewal would put it. Other forms: `Ok(None)`.
    pub fn extend(&self, by: Duration) -> Result<Option<SystemTime>> {
        match &self.hold {
            Some(Hold::Lease(cell)) => {
                let until = due_at(SystemTime::now(), by);
                form::lease::extend(&self.ctx, self.id, cell, until).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Done: deletes the row.
    ///
    /// Lease form: [`BrokerError::LeaseLost`](crate::BrokerError::LeaseLost) if the lease
    /// expired and the row was claimed again; nothing is changed then.
    pub fn ack(self) -> Result<()> {
        self.settle(Outcome::Ack)
    }

    /// Back into the queue for another attempt, due now (see
    /// [`retry_after`](Delivery::retry_after) for the last attempt).
    pub fn retry(self) -> Result<()> {
        self.retry_after(Duration::ZERO)
    }

    /// Back into the queue for another attempt, not claimed before `delay` from now (rounded up
    /// to a whole second). On the table's last attempt ([`Table::max_attempts`]) the row is
    /// dead-lettered instead.
    ///
    /// [`Table::max_attempts`]: crate::Table::max_attempts
    pub fn retry_after(self, delay: Duration) -> Result<()> {
        let outcome = self.retry_outcome(delay, "failed");
        self.settle(outcome)
    }

    /// A retry after `delay`, or the dead letter if this was the last attempt.
    fn retry_outcome(&self, delay: Duration, what: &str) -> Outcome {
        match self.ctx.spec().max_attempts {
            Some(max) if self.attempt >= max => Outcome::Dead(format!(
                "attempt {} of max_attempts {max} {what}",
                self.attempt
            )),
            _ => Outcome::Retry(due_at(SystemTime::now(), delay)),
        }
    }

    /// The handler failed with `error`: back into the queue after the subscription's
    /// [`RetryPolicy`](crate::RetryPolicy) delay for this attempt, or, on the table's last
    /// attempt ([`Table::max_attempts`](crate::Table::max_attempts)), dead-lettered with the
    /// error's text as the reason.
    pub fn fail(self, error: impl std::fmt::Display) -> Result<()> {
        let delay = self.ctx.opts.retry.delay(self.attempt);
        let outcome = self.retry_outcome(delay, &format!("failed: {error}"));
        self.settle(outcome)
    }

    /// Out of the queue for good: the row stays in the table with `reason` and the time, where
    /// [`Broker::dead_letters`](crate::Broker::dead_letters) lists it and
    /// [`Broker::requeue_dead`](crate::Broker::requeue_dead) puts it back.
    pub fn dead_letter(self, reason: impl Into<String>) -> Result<()> {
        self.settle(Outcome::Dead(reason.into()))
    }

    fn settle(mut self, outcome: Outcome) -> Result<()> {
        let returned = !matches!(outcome, Outcome::Ack | Outcome::Dead(_));
        // Always present: the settlers consume the delivery, and only they and Drop take it.
        let Some(hold) = self.hold.take() else {
            return Ok(());
        };
        let within = self.ctx.queue.pool.connection_timeout();
        let r = form::settle(&self.ctx, self.id, hold, outcome, within);
        if returned {
            self.ctx.queue.wake.notify(1);
        }
        r
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if let Some(hold) = self.hold.take() {
            if self.handed_out {
                let what = "was dropped unsettled";
                let outcome = self.retry_outcome(drop_delay(self.attempt), what);
                let (ctx, id) = (&self.ctx, self.id);
                if let Err(e) = form::settle(ctx, id, hold, outcome, DROP_WAIT) {
                    log::warn!(
                        "table {}: row {id} was dropped unsettled: {e}",
                        ctx.spec().name
                    );
                }
            } else {
                form::hand_back(&self.ctx, self.id, hold, DROP_WAIT);
            }
        }
        self.ctx.slots.settled();
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("table", &self.ctx.spec().name)
            .field("id", &self.id)
            .field("attempt", &self.attempt)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}
