//! A claimed row in the application's hands.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use crate::consuming::form::{self, Claimed, Hold, Outcome};
use crate::dialect::DbConn;
use crate::error::BrokerError;
use crate::error::Result;
use crate::model::schedule::due_at;
use crate::model::value::Value;
use crate::runtime::deferred::Pending;
use crate::runtime::events::Settled;
use crate::runtime::renewer::LeaseCell;
use crate::runtime::Ctx;

/// The error a delivery dropped unsettled leaves on its row (and, on its last attempt, in
/// its dead-letter reason: `"attempt N of max_attempts M failed: <this>"`).
const DROPPED: &str =
    "the delivery was dropped unsettled (a panic, or a handler that did not settle it)";

/// How often a handler timeout looks again at a delivery whose handler is busy on it (inside
/// `in_delivery`), and how often it cancels the statement running there.
const BUSY_RECHECK: Duration = Duration::from_millis(100);
const CANCEL_EVERY: Duration = Duration::from_secs(1);

/// How long a delivery's drop waits for a pooled connection (lease form, SQLite advisory form)
/// before it gives up and leaves the row to its lease: a drop runs on a handler's thread,
/// perhaps while it unwinds, and must not block it for the pool's whole timeout.
const DROP_WAIT: Duration = Duration::from_secs(1);

/// A claimed row, held for its handler until it is settled.
///
/// Settle it with exactly one of [`ack`](Delivery::ack), [`retry`](Delivery::retry),
/// [`retry_after`](Delivery::retry_after), [`fail`](Delivery::fail),
/// [`dead_letter`](Delivery::dead_letter) or [`cancel`](Delivery::cancel); each consumes the
/// delivery.
///
/// Dropping it unsettled (a handler that panicked, or forgot) counts as a failed attempt, in
/// every form: the row is retried after the subscription's
/// [`RetryPolicy`](crate::RetryPolicy) delay (by default 1 s after the first attempt, doubling,
/// at most 10 minutes, jittered), or dead-lettered once the table's
/// [`max_attempts`](crate::Table::max_attempts) are spent (25 unless the table says otherwise),
/// so a poison row cannot loop. The drop
/// never panics and waits at most about a second for a connection; if the row cannot be
/// written then, the database returns it as a crash would (lease: when the lease expires).
///
/// ```
/// use sqlbroker::{Broker, Message, Table};
/// use std::time::Duration;
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let t = Table::new("jobs").text_column("kind").lease(Duration::from_secs(30));
/// broker.create_table(&t)?;
/// broker.publish(&t, Message::new(b"hi".to_vec()).set("kind", "greet"))?;
/// let sub = broker.subscription(&t).start()?;
/// let d = sub.next_delivery().unwrap();
/// assert_eq!((d.payload(), d.attempt()), (&b"hi"[..], 1));
/// match d.get("kind").and_then(|v| v.as_str()) {
///     Some("greet") => d.ack()?,
///     _ => d.retry_after(Duration::from_secs(60))?,
/// }
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[must_use = "a delivery holds its row until it is settled; dropping it counts a failed attempt"]
pub struct Delivery {
    id: i64,
    attempt: u32,
    payload: Vec<u8>,
    values: Vec<Value>,
    /// What holds the row, shared with the handler timeout (which may take it first).
    held: Arc<Held>,
    /// The advisory key (advisory form).
    key: Option<String>,
    /// The lease's token cell (lease form).
    lease: Option<Arc<LeaseCell>>,
    /// When the handler timeout fails the delivery.
    deadline: Option<Instant>,
    /// Handed to the application by the `next_delivery` family. A delivery dropped before that
    /// (the subscription closed with it queued) is handed back unspent.
    handed_out: bool,
    /// When it was handed out (for the handler's time in [`Events`](crate::Events)).
    handed_at: Option<Instant>,
    /// Its handler slot goes back when it drops; false once [`Delivery::ack_all`] has taken
    /// the slot to give back with the rest of its batch.
    owns_slot: bool,
    /// What [`Delivery::set_output`] gave, for the settlement that ends the row.
    output: Mutex<Option<Vec<u8>>>,
    /// The row's last checkpoint: as claimed, then as this delivery saved it.
    checkpoint: Mutex<Option<Vec<u8>>>,
    /// The trace context of the publish ([`Table::traceparent`](crate::Table::traceparent)).
    traceparent: Option<String>,
    ctx: Arc<Ctx>,
}

impl Delivery {
    fn row(&self) -> Row {
        Row {
            id: self.id,
            attempt: self.attempt,
            handed_at: self.handed_at,
        }
    }

    pub(crate) fn new(ctx: Arc<Ctx>, c: Claimed) -> Self {
        let key = match &c.hold {
            Hold::Advisory(k) => Some(k.key.clone()),
            _ => None,
        };
        let lease = match &c.hold {
            Hold::Lease(cell) => Some(cell.clone()),
            _ => None,
        };
        ctx.queue.meters.opened();
        Delivery {
            id: c.id,
            attempt: c.attempt,
            payload: c.payload,
            values: ctx.spec().typed_values(c.values),
            held: Arc::new(Held {
                hold: Mutex::new(Some(c.hold)),
                timed_out: AtomicBool::new(false),
                stuck: AtomicBool::new(false),
                lost: AtomicBool::new(false),
                busy: Mutex::new(0),
            }),
            key,
            lease,
            deadline: None,
            handed_out: false,
            handed_at: None,
            owns_slot: true,
            output: Mutex::new(None),
            checkpoint: Mutex::new(c.checkpoint),
            traceparent: c.traceparent,
            ctx,
        }
    }

    /// The application has it now: a drop from here on is a failed attempt, and the handler
    /// timeout starts.
    pub(crate) fn hand_out(mut self) -> Self {
        self.handed_out = true;
        self.handed_at = Some(Instant::now());
        if let (Some(limit), Some(timer)) = (self.ctx.opts.handler_timeout, &self.ctx.timer) {
            let due = Instant::now() + limit;
            self.deadline = Some(due);
            let mut expiry = Expiry {
                ctx: Arc::downgrade(&self.ctx),
                held: Arc::downgrade(&self.held),
                row: self.row(),
                limit,
                cancelled: None,
            };
            timer.at(due, Box::new(move || expiry.run()));
        }
        if let (Some(after), Some(timer)) = (self.ctx.opts.stuck_after, &self.ctx.timer) {
            let report = StuckReport {
                ctx: Arc::downgrade(&self.ctx),
                held: Arc::downgrade(&self.held),
                id: self.id,
                attempt: self.attempt,
                after,
            };
            timer.at(Instant::now() + after, Box::new(move || report.run()));
        }
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

    /// True on the table's last attempt ([`Table::max_attempts`](crate::Table::max_attempts)):
    /// a failure or a retry of this delivery dead-letters its row ([`Ran`](crate::Ran)
    /// counts it so).
    pub(crate) fn last_attempt(&self) -> bool {
        matches!(
            retry_or_dead(&self.ctx, self.attempt, Duration::ZERO, ""),
            Outcome::Dead(_)
        )
    }

    /// The body.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The payload of every event of a collected job
    /// ([`Message::collect`](crate::Message::collect)), in publish order. A job published
    /// without `collect` reads as one event, its payload. Read from the claimed row: no
    /// statement.
    ///
    /// A collected job's [`payload`](Delivery::payload) is its events framed (a header
    /// starting with a NUL byte, then each event as a 4-byte big-endian length and its
    /// bytes); a payload of your own that starts with that header reads as events too.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Decode`]: the payload starts with the
    /// header but its frames do not add up (a row written by hand).
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("typing").lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// for text in ["h", "he", "hel"] {
    ///     let ms = Duration::from_millis;
    ///     let event = Message::new(text.as_bytes().to_vec()).collect("user-1", ms(500), ms(5_000));
    ///     broker.publish(&jobs, event)?;
    /// }
    /// let sub = broker.subscription(&jobs).start()?;
    /// let d = sub.next_delivery_timeout(Duration::from_secs(10)).expect("due within seconds");
    /// assert_eq!(d.collected()?, [b"h".to_vec(), b"he".to_vec(), b"hel".to_vec()]);
    /// d.ack()?;
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn collected(&self) -> Result<Vec<Vec<u8>>> {
        match crate::model::collect::decode(&self.payload) {
            None => Ok(vec![self.payload.clone()]),
            Some(Ok(events)) => Ok(events),
            Some(Err(why)) => Err(BrokerError::Decode {
                table: self.ctx.spec().name.clone(),
                id: self.id,
                source: why.into(),
            }),
        }
    }

    /// The value of a column of the table's description (`None` for a column it does not
    /// describe; [`Value::Null`] for SQL `NULL`).
    pub fn get(&self, column: &str) -> Option<&Value> {
        self.ctx
            .spec()
            .column_index(column)
            .and_then(|i| self.values.get(i))
    }

    /// The named queue of the row ([`Table::queues`](crate::Table::queues)):
    /// [`DEFAULT_QUEUE`](crate::DEFAULT_QUEUE) on a table without queues. Reads no database.
    pub fn queue(&self) -> &str {
        let spec = self.ctx.spec();
        match spec.queue.and_then(|i| self.values.get(i)) {
            Some(Value::Text(q)) => q,
            _ => crate::model::table::DEFAULT_QUEUE,
        }
    }

    /// The job kind of the row ([`Table::kinds`](crate::Table::kinds)), `None` on a table
    /// without kinds or for a row published without one. Reads no database.
    pub fn kind(&self) -> Option<&str> {
        let spec = self.ctx.spec();
        match spec.kind.and_then(|i| self.values.get(i)) {
            Some(Value::Text(k)) => Some(k),
            _ => None,
        }
    }

    /// The trace context the row was published with, a W3C `traceparent`, on a table described
    /// with [`Table::traceparent`](crate::Table::traceparent): what
    /// [`Message::traceparent`](crate::Message::traceparent) gave, or with the `opentelemetry`
    /// feature the publishing span's. `None` on a table without the column or for a row
    /// published without one. Reads no database.
    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    /// The name of the table the row is in.
    pub fn table(&self) -> &str {
        &self.ctx.spec().name
    }

    /// The advisory key that holds the row (advisory lock form).
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// When the subscription's [`handler_timeout`](crate::SubscriptionBuilder::handler_timeout)
    /// fails this delivery; `None` without a handler timeout.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// True once the handler timeout has failed this delivery: its row is another claim's,
    /// and every settlement returns [`BrokerError::HandlerTimeout`]. Stop working on it.
    pub fn timed_out(&self) -> bool {
        self.held.timed_out.load(Ordering::Acquire)
    }

    /// The error a timed-out delivery answers with.
    fn claim_lost(&self) -> BrokerError {
        BrokerError::ClaimLost {
            table: self.ctx.spec().name.clone(),
            id: self.id,
            why: "the row was finished while a checkpoint committed",
        }
    }

    /// The table's column for `what` (`output`, `checkpoint`) and the bound `data` must fit.
    fn progress_check(
        &self,
        what: &'static str,
        column: Option<&String>,
        data: &[u8],
        max: usize,
    ) -> Result<()> {
        let table = &self.ctx.spec().name;
        if column.is_none() {
            let option = match what {
                "output" => "Table::outputs()",
                _ => "Table::checkpoints()",
            };
            return Err(BrokerError::InvalidTable {
                table: table.clone(),
                reason: format!("its jobs keep no {what}: describe the table with {option}"),
            });
        }
        if data.len() > max {
            return Err(BrokerError::TooLarge {
                table: table.clone(),
                id: self.id,
                what,
                len: data.len(),
                max,
            });
        }
        Ok(())
    }

    /// Records what the job produced, written to the row's output column
    /// ([`Table::outputs`](crate::Table::outputs)) by the settlement that ends it: an ack, a
    /// dead letter or a cancel, in that settlement's transaction and fenced as it is (row lock
    /// form: the delivery's own transaction). A retry, a failure, a handler timeout or a drop
    /// writes none; a later call replaces an earlier one. On a table with dependencies the
    /// jobs waiting on this one read it as [`Dependency::output`](crate::Dependency::output).
    ///
    /// # Errors
    ///
    /// Nothing is recorded on any of these: [`BrokerError::InvalidTable`] for a table without
    /// outputs, [`BrokerError::TooLarge`] past [`OUTPUT_MAX`](crate::OUTPUT_MAX) bytes.
    pub fn set_output(&self, output: &[u8]) -> Result<()> {
        let spec = self.ctx.spec();
        let max = crate::error::OUTPUT_MAX;
        self.progress_check("output", spec.output.as_ref(), output, max)?;
        *self.output.lock() = Some(output.to_vec());
        Ok(())
    }

    /// Saves the job's progress now ([`Table::checkpoints`](crate::Table::checkpoints)),
    /// committed and fenced by the claim, so a later attempt (after a retry, a failure or a
    /// crash) resumes from it with [`last_checkpoint`](Delivery::last_checkpoint).
    ///
    /// - Lease: one statement fenced by the token (`LeaseLost` if the lease was lost).
    /// - Advisory lock: one statement under the row's key, on the session holding it.
    /// - Row lock: the delivery's transaction commits, with the checkpoint and whatever the
    ///   handler wrote in it so far ([`in_delivery`](crate::Delivery)), and a chained
    ///   transaction locks the row again: a checkpoint makes the work before it permanent, as
    ///   a resumed job expects. The commit moves the row's due time 10 s ahead, so if the
    ///   process dies before the next commit the row is claimable 10 s after its last
    ///   checkpoint rather than at once. Needs PostgreSQL 12 or newer (`COMMIT AND CHAIN`).
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidTable`] for a table without checkpoints, [`BrokerError::TooLarge`]
    /// past [`CHECKPOINT_MAX`](crate::CHECKPOINT_MAX) bytes, `HandlerTimeout` once the handler
    /// timeout failed the delivery: nothing is written. [`BrokerError::LeaseLost`] or
    /// [`BrokerError::ClaimLost`]: the row is no longer this delivery's; stop the work.
    pub fn checkpoint(&self, data: &[u8]) -> Result<()> {
        let spec = self.ctx.spec();
        let max = crate::error::CHECKPOINT_MAX;
        self.progress_check("checkpoint", spec.checkpoint.as_ref(), data, max)?;
        // Held for the whole call, as `in_transaction` does.
        let mut hold = self.held.hold.lock();
        if self.held.timed_out.load(Ordering::Acquire) {
            return Err(self.timeout_error());
        }
        let within = self.ctx.queue.pool.connection_timeout();
        match &mut *hold {
            Some(Hold::Lease(cell)) => form::lease::checkpoint(&self.ctx, self.id, cell, data)?,
            Some(Hold::Advisory(key)) => {
                form::advisory::checkpoint(&self.ctx, self.id, key, data, within)?
            }
            Some(Hold::RowLock(row)) => {
                let _busy = match self.deadline {
                    Some(_) => row.conn.session_id().map(|id| Busy::enter(&self.held, id)),
                    None => None,
                };
                let saved = form::row_lock::checkpoint(&self.ctx, self.id, row, data)?;
                drop(_busy);
                if let form::row_lock::Checkpointed::Lost = saved {
                    if let Some(Hold::RowLock(row)) = hold.take() {
                        form::row_lock::rollback(&self.ctx, row);
                    }
                    self.held.lost.store(true, Ordering::Release);
                    return Err(self.claim_lost());
                }
            }
            None if self.held.lost.load(Ordering::Acquire) => return Err(self.claim_lost()),
            None => return Err(self.timeout_error()),
        }
        if self.held.timed_out.load(Ordering::Acquire) {
            return Err(self.timeout_error());
        }
        *self.checkpoint.lock() = Some(data.to_vec());
        Ok(())
    }

    /// The job's last saved checkpoint ([`checkpoint`](Delivery::checkpoint)): as the row held
    /// it when claimed, then as this delivery saved it; `None` if none was saved (or the table
    /// has no checkpoints). Reads no database.
    pub fn last_checkpoint(&self) -> Option<Vec<u8>> {
        self.checkpoint.lock().clone()
    }

    fn timeout_error(&self) -> BrokerError {
        BrokerError::HandlerTimeout {
            table: self.ctx.spec().name.clone(),
            id: self.id,
            after: self.ctx.opts.handler_timeout.unwrap_or_default(),
        }
    }

    /// Row lock form: runs `f` on the delivery's own connection, inside its transaction, under
    /// a savepoint: what `f` writes commits with the ack, atomically, and is undone by a retry,
    /// a dead letter, a drop or a crash. If `f` returns `Err`, its writes are rolled back to the
    /// savepoint at once (the transaction stays usable, so the delivery can still be settled).
    /// `Unsupported` in the other forms (no transaction is open there).
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn in_transaction<C: 'static, T, E>(
        &mut self,
        f: impl FnOnce(&mut C) -> std::result::Result<T, E>,
    ) -> Result<std::result::Result<T, E>> {
        // Held for the whole call: the handler timeout, finding it busy, cancels the statement
        // running on the connection and waits for `f` to return.
        let mut hold = self.held.hold.lock();
        if self.held.timed_out.load(Ordering::Acquire) {
            return Err(self.timeout_error());
        }
        let Some(Hold::RowLock(row)) = &mut *hold else {
            return Err(BrokerError::Unsupported {
                database: self.ctx.queue.dialect.database(),
                what: "transactional completion".into(),
                why: "only a row lock delivery has a transaction open; describe the table with \
                      neither lease nor advisory_lock",
            });
        };
        // The handler timeout may cancel what runs on the session until this call returns
        // (the guard's drop, before the hold's: the session cannot reach a settlement or the
        // pool while a cancel is being sent).
        let _busy = match self.deadline {
            Some(_) => row.conn.session_id().map(|id| Busy::enter(&self.held, id)),
            None => None,
        };
        let out = form::row_lock::in_transaction(&self.ctx, row, f)?;
        if self.held.timed_out.load(Ordering::Acquire) {
            // Past the deadline: whatever `f` did is undone with the failure.
            return Err(self.timeout_error());
        }
        Ok(out)
    }

    /// The jobs this one waited on ([`Message::after`](crate::Message::after),
    /// [`Message::after_settled`](crate::Message::after_settled)), each with its outcome: what a
    /// batch's callback reads to learn how its jobs ended. Empty for a job that waited on
    /// none. Reads them (one statement, only when called).
    ///
    /// ```
    /// use sqlbroker::{Broker, JobOutcome, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("album").dependencies().lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// let a = broker.publish(&jobs, Message::new(b"resize a".to_vec()))?;
    /// let b = broker.publish(&jobs, Message::new(b"resize b".to_vec()))?;
    /// let done = Message::new(b"build album".to_vec()).after_settled(a).after_settled(b);
    /// broker.publish(&jobs, done)?;
    /// let sub = broker.subscription(&jobs).start()?;
    /// sub.next_delivery().unwrap().ack()?;
    /// sub.next_delivery().unwrap().dead_letter("corrupt image")?;
    /// let callback = sub.next_delivery().unwrap();
    /// let outcomes: Vec<_> = callback.waited_on()?.into_iter().map(|d| d.outcome).collect();
    /// assert_eq!(outcomes, [Some(JobOutcome::Acked), Some(JobOutcome::DeadLettered)]);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn waited_on(&self) -> Result<Vec<crate::model::waits::Dependency>> {
        let q = &self.ctx.queue;
        if !q.spec.dependencies {
            return Ok(Vec::new());
        }
        q.retrying("waited on", |conn| {
            crate::runtime::deps::parents_of(&q.spec, &q.sql, conn, self.id)
        })
    }

    /// The signal this job waited for ([`Message::after_signal`](crate::Message::after_signal)),
    /// with the payload [`Broker::signal`](crate::Broker::signal) sent: `None` when its wait
    /// timed out ([`Message::wait_timeout`](crate::Message::wait_timeout)) or it waited for
    /// none. The wait's one outcome, recorded before the job was released, so a signal sent
    /// after the timeout is never seen here. Reads it (one statement, at each call); a read
    /// that fails is logged and taken for `None`: [`Delivery::read_signal`] tells the two apart.
    pub fn signal(&self) -> Option<crate::model::waits::Signal> {
        match self.read_signal() {
            Ok(s) => s,
            Err(e) => {
                log::warn!("job {}: reading the signal it waited for: {e}", self.id);
                None
            }
        }
    }

    /// [`Delivery::signal`], with the database's failure as an error.
    pub fn read_signal(&self) -> Result<Option<crate::model::waits::Signal>> {
        let q = &self.ctx.queue;
        if !q.spec.dependencies {
            return Ok(None);
        }
        let wait = q.retrying("signal", |conn| {
            crate::runtime::signals::signal_of(&q.spec, &q.sql, conn, self.id)
        })?;
        Ok(wait.and_then(|w| w.signal().cloned()))
    }

    /// Whether [`Broker::cancel`](crate::Broker::cancel) asked that this job not run again:
    /// then any end but an ack is its last (a retry or failure finishes it as cancelled), so
    /// a handler may stop early. Reads the row (one statement, only when called; the lease
    /// renewal does not carry it). Lease and advisory lock forms; the row lock form's row
    /// cannot be marked while its delivery holds it: `Ok(false)` there, without a statement.
    pub fn cancel_requested(&self) -> Result<bool> {
        let q = &self.ctx.queue;
        if q.spec.form == crate::model::table::Form::RowLock {
            return Ok(false);
        }
        let rows = q.retrying("cancel requested", |conn| {
            conn.query(&q.sql.job, &[Value::Int(self.id)])
        })?;
        // `job` columns: the cancel request is the eleventh.
        Ok(rows
            .first()
            .and_then(|r| r.get(10))
            .and_then(Value::as_i64)
            .is_some_and(|v| v != 0))
    }

    /// Lease form: the deadline the delivery's lease holds as far as this process knows (it
    /// moves with every renewal and [`extend`](Delivery::extend)); `None` in the other forms.
    /// A deadline in the past means the lease may be lost: the row may be another handler's.
    /// Reads no database, and never waits (not even for a renewal in progress: one that
    /// waits on a server that does not answer moves no deadline); a settlement (or `extend`)
    /// is the definite answer.
    pub fn lease_deadline(&self) -> Option<SystemTime> {
        self.lease.as_ref().map(|cell| cell.deadline())
    }

    /// Lease form: true while [`lease_deadline`](Delivery::lease_deadline) is in the future
    /// and the delivery has not [`timed_out`](Delivery::timed_out); in the other forms, true
    /// until it times out (their rows are held until settled). Never waits: while the
    /// renewals cannot reach the server, it turns false at the deadline of the last renewal
    /// that did, before the row is claimable elsewhere (a claim takes a lease only once its
    /// deadline has passed).
    pub fn lease_held(&self) -> bool {
        let now = SystemTime::now();
        !self.timed_out() && self.lease_deadline().is_none_or(|until| until > now)
    }

    /// Lease form: true if the lease's deadline, as this process knows it, has passed (the
    /// row may be another holder's now). Other forms: false.
    pub(crate) fn lease_expired(&self) -> bool {
        self.lease_deadline()
            .is_some_and(|until| until <= SystemTime::now())
    }

    /// Lease form: pushes the lease's deadline to at least `by` from now (whole seconds,
    /// rounded up), for a known long step; fenced by the token like every settlement, so a
    /// lost lease gives [`BrokerError::LeaseLost`] and changes
    /// nothing. Returns the new deadline. The renewer keeps renewing as usual once the
    /// deadline comes closer than a renewal would put it. Other forms: `Ok(None)`.
    pub fn extend(&self, by: Duration) -> Result<Option<SystemTime>> {
        if self.timed_out() {
            return Err(self.timeout_error());
        }
        match &self.lease {
            Some(cell) => {
                let until = due_at(SystemTime::now(), by);
                form::lease::extend(&self.ctx, self.id, cell, until).map(Some)
            }
            None => Ok(None),
        }
    }

    /// Done: deletes the row (or, on a table that keeps completed rows, marks it completed).
    ///
    /// # Errors
    ///
    /// Nothing is changed on any of these:
    /// - lease form: [`BrokerError::LeaseLost`] if the lease expired and the row may be another
    ///   claim's;
    /// - [`BrokerError::HandlerTimeout`] once the handler timeout failed the delivery;
    /// - [`BrokerError::Database`]: the statement failed (row lock form: the transaction is
    ///   rolled back and the row is back as it was).
    ///
    /// One exception, lease form: a lost connection
    /// ([`DbErrorKind::ConnectionLost`](crate::DbErrorKind::ConnectionLost)) after the ack was
    /// tried again on a new connection and matched nothing: the first try may have committed
    /// before its answer was lost, so the row is either gone or, if not, delivered again once
    /// its lease ends.
    ///
    /// With [`AckMode::Deferred`](crate::AckMode::Deferred), a lease delivery's `ack()`
    /// returns `Ok` once the row is queued for the subscription's next write, before its
    /// commit; what that write meets goes to [`Events`](crate::Events) (see the mode).
    pub fn ack(self) -> Result<()> {
        if self.defer() {
            return Ok(());
        }
        self.settle(Outcome::Ack)
    }

    /// Queues the ack for the subscription's ack thread (deferred acks, a lease delivery not
    /// timed out); false if it must be written here.
    fn defer(&self) -> bool {
        let Some(deferred) = &self.ctx.deferred else {
            return false;
        };
        if self.ctx.spec().dependencies {
            // Its ack settles the jobs waiting on it, in the ack's own transaction.
            return false;
        }
        if self.ctx.spec().output.is_some() && self.output.lock().is_some() {
            // Its output is written in the ack's own transaction.
            return false;
        }
        let mut hold = self.held.hold.lock();
        if self.held.timed_out.load(Ordering::Acquire) {
            return false;
        }
        let cell = match &*hold {
            Some(Hold::Lease(cell)) => cell.clone(),
            _ => return false,
        };
        *hold = None;
        drop(hold);
        deferred.push(Pending {
            ctx: self.ctx.clone(),
            id: self.id,
            attempt: self.attempt,
            cell,
            handed_at: self.handed_at,
            at: Instant::now(),
        });
        true
    }

    /// Acks many deliveries in one call, each result in the order given. Lease deliveries of
    /// one subscription are deleted in one statement and one commit (per 256); the others
    /// are acked one by one, as [`ack`](Delivery::ack) would. Each delivery's result is its
    /// own: `LeaseLost` for a lease that was lost, `HandlerTimeout` for one that timed out,
    /// and, as `ack` reports it, a lost connection ([`DbErrorKind::ConnectionLost`]) for a row
    /// the statement may have deleted before its answer was lost (the rows it certainly did
    /// not delete are acked again alone).
    ///
    /// [`DbErrorKind::ConnectionLost`]: crate::DbErrorKind::ConnectionLost
    /// Take the batch with [`Subscription::next_batch`](crate::Subscription::next_batch).
    ///
    /// ```
    /// use sqlbroker::{Broker, Delivery, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// for i in 0..3u8 {
    ///     broker.publish(&jobs, Message::new(vec![i]))?;
    /// }
    /// let sub = broker.subscription(&jobs).batch_size(3).start()?;
    /// let batch = sub.next_batch(3, Duration::from_secs(5))?;
    /// // ... handle each ...
    /// for r in Delivery::ack_all(batch) {
    ///     r?;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ack_all(batch: impl IntoIterator<Item = Delivery>) -> Vec<Result<()>> {
        let batch: Vec<Delivery> = batch.into_iter().collect();
        let mut out: Vec<Option<Result<()>>> = (0..batch.len()).map(|_| None).collect();
        // Lease deliveries, by subscription: (its context, their indexes, their (id, cell)).
        type Leases<'a> = Vec<(&'a Arc<Ctx>, Vec<usize>, Vec<(i64, Arc<LeaseCell>)>)>;
        let mut leases: Leases<'_> = Vec::new();
        let mut singles = Vec::new();
        for (i, d) in batch.iter().enumerate() {
            let (hold, timed_out) = d.take();
            match hold {
                Some(Hold::Lease(cell))
                    if !timed_out && !d.ctx.spec().dependencies && d.output.lock().is_none() =>
                {
                    match leases.iter_mut().find(|(c, _, _)| Arc::ptr_eq(c, &d.ctx)) {
                        Some((_, at, cells)) => {
                            at.push(i);
                            cells.push((d.id, cell));
                        }
                        None => leases.push((&d.ctx, vec![i], vec![(d.id, cell)])),
                    }
                }
                // Back in place: `ack` settles it (and answers for a timeout) as usual.
                Some(hold) => {
                    *d.held.hold.lock() = Some(hold);
                    singles.push(i);
                }
                None => singles.push(i),
            }
        }
        for (ctx, at, cells) in &leases {
            let within = ctx.queue.pool.connection_timeout();
            let started = Instant::now();
            let results = form::lease::ack_all(ctx, cells, within);
            wake_claimers(ctx, false);
            ctx.queue.meters.settle_took(started.elapsed());
            ctx.settled
                .fetch_add(at.len() as u64, std::sync::atomic::Ordering::Relaxed);
            for (i, r) in at.iter().zip(results) {
                let handed_at = batch[*i].handed_at;
                ctx.queue.meters.settled(
                    crate::runtime::meters::Settle::Ack,
                    handed_at.map(|at| started - at),
                    r.is_ok(),
                    r.as_ref().is_err_and(BrokerError::is_lease_lost),
                );
                if let Some(events) = &ctx.events {
                    let d = &batch[*i];
                    let e = Settled {
                        table: &ctx.spec().name,
                        id: d.id,
                        attempt: d.attempt,
                        handled_for: d.handed_at.map_or(Duration::ZERO, |at| started - at),
                        took: started.elapsed(),
                        reason: None,
                    };
                    match &r {
                        Ok(()) => events.acked(&e),
                        Err(err) if err.is_lease_lost() => events.lease_lost(&e),
                        Err(_) => {}
                    }
                }
                out[*i] = Some(r);
            }
        }
        drop(leases);
        let mut batch: Vec<Option<Delivery>> = batch.into_iter().map(Some).collect();
        for i in singles {
            if let Some(d) = batch[i].take() {
                out[i] = Some(d.ack());
            }
        }
        // The rest drop here, their rows settled. Their handler slots go back together, so the
        // claim they wake finds the whole batch free rather than the first slot of it.
        let mut freed: Vec<(Arc<Ctx>, usize)> = Vec::new();
        for d in batch.iter_mut().flatten() {
            d.owns_slot = false;
            match freed.iter_mut().find(|(c, _)| Arc::ptr_eq(c, &d.ctx)) {
                Some((_, n)) => *n += 1,
                None => freed.push((d.ctx.clone(), 1)),
            }
        }
        drop(batch);
        for (ctx, n) in freed {
            ctx.slots.settled_many(n);
        }
        out.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
    }

    /// Back into the queue for another attempt after the subscription's
    /// [`RetryPolicy`](crate::RetryPolicy) delay for this attempt (by default 1 s after the
    /// first, doubling, at most 10 minutes, jittered), or dead-lettered on the table's last
    /// attempt, as [`retry_after`](Delivery::retry_after). For an attempt due at once, ask for
    /// it: `retry_after(Duration::ZERO)`.
    pub fn retry(self) -> Result<()> {
        let delay = self.ctx.opts.retry.delay(self.attempt);
        self.retry_after(delay)
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

    /// Ends a claimed row whose cancel was requested while an earlier claim held it: the
    /// lease and advisory forms' retry statement finishes a marked row as cancelled whatever
    /// its attempts, so the row is settled by that statement, due now.
    pub(crate) fn end_cancelled(self) -> Result<()> {
        self.settle(Outcome::Retry(SystemTime::now()))
    }

    /// A retry after `delay`, or the dead letter if this was the last attempt.
    fn retry_outcome(&self, delay: Duration, what: &str) -> Outcome {
        retry_or_dead(&self.ctx, self.attempt, delay, what)
    }

    /// The handler failed with `error`: back into the queue after the subscription's
    /// [`RetryPolicy`](crate::RetryPolicy) delay for this attempt, or, on the table's last
    /// attempt ([`Table::max_attempts`](crate::Table::max_attempts)), dead-lettered with the
    /// error's text as the reason.
    pub fn fail(self, error: impl std::fmt::Display) -> Result<()> {
        let outcome = failure(&self.ctx, self.attempt, &error);
        self.settle(outcome)
    }

    /// Out of the queue for good: the row stays in the table with `reason` and the time, where
    /// [`Broker::dead_letters`](crate::Broker::dead_letters) lists it and
    /// [`Broker::requeue_dead`](crate::Broker::requeue_dead) puts it back.
    pub fn dead_letter(self, reason: impl Into<String>) -> Result<()> {
        self.settle(Outcome::Dead(reason.into()))
    }

    /// No further attempts, whatever the attempts left: the row is deleted, or, on a table that
    /// keeps completed rows ([`Table::keep_completed`](crate::Table::keep_completed)), kept as
    /// completed and cancelled (`completed_at` and `dead_at` the server's time, `dead_reason`
    /// `"cancelled"`), where the completed rows list it and no dead-letter tool touches it.
    /// A handler of [`Subscription::run`](crate::Subscription::run) says the same by returning
    /// [`Outcome::Cancel`](crate::Outcome::Cancel).
    ///
    /// Settled as every outcome in its form: lease, fenced by the token (`LeaseLost` if the
    /// lease was lost, changing nothing); row lock, in the delivery's transaction, after the
    /// handler's own SQL is rolled back (as a dead letter does); advisory, under the row's key.
    ///
    /// # Errors
    ///
    /// As [`ack`](Delivery::ack).
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let t = Table::new("jobs").lease(Duration::from_secs(30));
    /// broker.create_table(&t)?;
    /// broker.publish(&t, Message::new(b"obsolete".to_vec()))?;
    /// let sub = broker.subscription(&t).start()?;
    /// sub.next_delivery().unwrap().cancel()?;
    /// assert_eq!(broker.stats(&t)?.ready, 0);
    /// assert!(broker.dead_letters(&t, 10)?.is_empty());
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn cancel(self) -> Result<()> {
        self.settle(Outcome::Cancel)
    }

    /// Settles with `outcome`, unless the handler timeout has failed the delivery: then with
    /// that failure (if the timeout has not written it yet) and `HandlerTimeout`.
    fn settle(self, outcome: Outcome) -> Result<()> {
        let (hold, timed_out) = self.take();
        let Some(hold) = hold else {
            return if timed_out {
                Err(self.timeout_error())
            } else if self.held.lost.load(Ordering::Acquire) {
                Err(self.claim_lost())
            } else {
                Ok(())
            };
        };
        let outcome = if timed_out {
            self.ctx.queue.meters.handler_timeout();
            timeout_failure(&self.ctx, self.attempt)
        } else {
            outcome
        };
        let within = self.ctx.queue.pool.connection_timeout();
        // A failure the timeout wrote is not the handler's end: no output with it.
        let output = match timed_out {
            false => self.output.lock().take(),
            true => None,
        };
        let r = settle_hold(&self.ctx, &self.row(), hold, outcome, output, within);
        if timed_out {
            r.and(Err(self.timeout_error()))
        } else {
            r
        }
    }

    /// The hold, if the handler timeout has not taken it, and whether the delivery timed out;
    /// read together, so the two cannot cross.
    fn take(&self) -> (Option<Hold>, bool) {
        let mut hold = self.held.hold.lock();
        (hold.take(), self.held.timed_out.load(Ordering::Acquire))
    }
}

/// Settles `hold` and wakes the claimers if the row went back into the queue; tells the
/// application's hooks.
fn settle_hold(
    ctx: &Ctx,
    row: &Row,
    hold: Hold,
    outcome: Outcome,
    output: Option<Vec<u8>>,
    within: Duration,
) -> Result<()> {
    let returned = outcome.returns();
    let (started, kind, meter) = (Instant::now(), outcome.op(), outcome.meter());
    #[cfg(feature = "tracing")]
    let _span = tracing::debug_span!(
        "sqlbroker.settle",
        table = %ctx.spec().name,
        id = row.id,
        attempt = row.attempt,
        outcome = kind
    )
    .entered();
    let reason = match &ctx.events {
        Some(_) => outcome.dead_reason().map(str::to_string),
        None => None,
    };
    let r = form::settle(ctx, row.id, hold, outcome, output.as_deref(), within);
    wake_claimers(ctx, returned);
    ctx.settled
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let meters = &ctx.queue.meters;
    meters.settle_took(started.elapsed());
    let lost = r.as_ref().is_err_and(BrokerError::is_lease_lost);
    meters.settled(meter, row.handed_at.map(|at| started - at), r.is_ok(), lost);
    if let Some(events) = &ctx.events {
        let e = Settled {
            table: &ctx.spec().name,
            id: row.id,
            attempt: row.attempt,
            handled_for: row.handed_at.map_or(Duration::ZERO, |at| started - at),
            took: started.elapsed(),
            reason: reason.as_deref(),
        };
        match (&r, kind) {
            (Ok(()), "ack") => events.acked(&e),
            (Ok(()), "retry") => events.retried(&e),
            (Ok(()), "cancel") => events.cancelled(&e),
            (Ok(()), _) => events.dead_lettered(&e),
            (Err(err), _) if err.is_lease_lost() => events.lease_lost(&e),
            (Err(_), _) => {}
        }
    }
    r
}

/// After a settlement: a row back in the queue (`returned`), room made under a concurrency
/// limit, a job waiting on this one released, a FIFO group's next row free: a claimer may take
/// a row now rather than at its next poll.
fn wake_claimers(ctx: &Ctx, returned: bool) {
    let spec = ctx.spec();
    if returned || !spec.limits.is_empty() || spec.dependencies || spec.fifo {
        ctx.queue.wake.notify(1);
    }
}

/// Writes a batch of deferred acks of one subscription (its ack thread's flush): one
/// statement per batch, as `ack_all`; tells the hooks about each row. A row whose ack could
/// not be written is failed with that error as its last error, where the database takes that
/// write (else it returns when its lease ends).
pub(crate) fn write_deferred(batch: &[Pending]) {
    let Some(first) = batch.first() else { return };
    let ctx = &first.ctx;
    let cells: Vec<(i64, Arc<LeaseCell>)> = batch.iter().map(|p| (p.id, p.cell.clone())).collect();
    let within = ctx.queue.pool.connection_timeout();
    let started = Instant::now();
    let results = form::lease::ack_all(ctx, &cells, within);
    wake_claimers(ctx, false);
    ctx.settled
        .fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
    let took = started.elapsed();
    for (p, r) in batch.iter().zip(results) {
        let e = Settled {
            table: &ctx.spec().name,
            id: p.id,
            attempt: p.attempt,
            handled_for: p.handed_at.map_or(Duration::ZERO, |h| p.at - h),
            took,
            reason: None,
        };
        match r {
            Ok(()) => {
                if let Some(events) = &ctx.events {
                    events.acked(&e);
                }
            }
            Err(err) if err.is_lease_lost() => {
                log::warn!(
                    "table {}: row {}: its deferred ack found the lease lost",
                    e.table,
                    p.id
                );
                if let Some(events) = &ctx.events {
                    events.lease_lost(&e);
                }
            }
            Err(err) => deferred_failed(ctx, p, err),
        }
    }
}

/// A deferred ack its write could not make: reported, and the row failed with the error.
fn deferred_failed(ctx: &Ctx, p: &Pending, err: BrokerError) {
    let table = &ctx.spec().name;
    log::warn!(
        "table {table}: row {}: its deferred ack could not be written; delivered again: {err}",
        p.id
    );
    let outcome = failure(
        ctx,
        p.attempt,
        &format_args!("its deferred ack could not be written: {err}"),
    );
    let row = Row {
        id: p.id,
        attempt: p.attempt,
        handed_at: p.handed_at,
    };
    let hold = Hold::Lease(p.cell.clone());
    if let Err(e) = settle_hold(ctx, &row, hold, outcome, None, DROP_WAIT) {
        log::warn!(
            "table {table}: row {}: returns when its lease ends: {e}",
            p.id
        );
    }
    if let Some(events) = &ctx.events {
        events.ack_failed(&crate::runtime::events::AckFailed {
            table,
            id: p.id,
            attempt: p.attempt,
            error: &err,
        });
    }
}

/// Which delivery a settlement is for.
struct Row {
    id: i64,
    attempt: u32,
    handed_at: Option<Instant>,
}

/// A retry after `delay`, or the dead letter if `attempt` was the table's last.
fn retry_or_dead(ctx: &Ctx, attempt: u32, delay: Duration, what: &str) -> Outcome {
    match ctx.spec().max_attempts {
        Some(max) if attempt >= max => {
            Outcome::Dead(format!("attempt {attempt} of max_attempts {max} {what}"))
        }
        _ => Outcome::Retry(due_at(SystemTime::now(), delay)),
    }
}

/// A failed attempt, retried after `delay` (or dead-lettered on the table's last attempt),
/// its `error` kept on the row as its last error.
fn failed_after(ctx: &Ctx, attempt: u32, delay: Duration, error: String) -> Outcome {
    match retry_or_dead(ctx, attempt, delay, &format!("failed: {error}")) {
        Outcome::Retry(at) => Outcome::Failed(at, error),
        Outcome::Dead(reason) => Outcome::DeadFailed(reason, error),
        other => other,
    }
}

/// A failed attempt by the subscription's retry policy.
fn failure(ctx: &Ctx, attempt: u32, error: &dyn std::fmt::Display) -> Outcome {
    let delay = ctx.opts.retry.delay(attempt);
    failed_after(ctx, attempt, delay, error.to_string())
}

/// The failure a handler timeout writes.
fn timeout_failure(ctx: &Ctx, attempt: u32) -> Outcome {
    let limit = ctx.opts.handler_timeout.unwrap_or_default();
    failure(
        ctx,
        attempt,
        &format_args!("the handler timed out after {limit:?}"),
    )
}

/// What a delivery shares with its handler timeout: the hold (taken by whichever of the two
/// settles first), the timed-out flag, and the server session a row lock delivery's handler
/// runs SQL on right now (inside `in_delivery`; 0 otherwise), whose statement the timeout
/// cancels.
///
/// `busy`'s lock is held while a cancel is sent and while the handler leaves `in_delivery`, so
/// the two exclude each other: a cancel goes only to a session still running the handler's
/// SQL, never to one that has moved on to the delivery's settlement or, back in the pool, to
/// another delivery's claim, ack or publish.
struct Held {
    hold: Mutex<Option<Hold>>,
    timed_out: AtomicBool,
    /// Reported stuck ([`SubscriptionBuilder::stuck_after`](crate::SubscriptionBuilder::stuck_after)):
    /// counted in the subscription's stuck handlers until the delivery drops.
    stuck: AtomicBool,
    /// A row lock checkpoint found the row finished: the hold is gone, and a settlement says
    /// so.
    lost: AtomicBool,
    busy: Mutex<u64>,
}

/// A handler inside `in_delivery` on a session: marks it cancellable until dropped (on return
/// or unwind), waiting for a cancel being sent to finish.
struct Busy<'a>(&'a Held);

impl<'a> Busy<'a> {
    fn enter(held: &'a Held, session: u64) -> Self {
        *held.busy.lock() = session;
        Busy(held)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        *self.0.busy.lock() = 0;
    }
}

/// A delivery's report as stuck, run by the subscription's timer `after` it was handed out.
struct StuckReport {
    ctx: Weak<Ctx>,
    held: Weak<Held>,
    id: i64,
    attempt: u32,
    after: Duration,
}

impl StuckReport {
    /// Reports the handler stuck if its delivery is still alive (the handler has it), once.
    fn run(&self) -> Option<Duration> {
        let (ctx, held) = (self.ctx.upgrade()?, self.held.upgrade()?);
        if held.stuck.swap(true, Ordering::AcqRel) {
            return None;
        }
        ctx.marks.stuck(true);
        ctx.queue.meters.stuck(true);
        let timed_out = held.timed_out.load(Ordering::Acquire);
        let table = &ctx.spec().name;
        log::warn!(
            "table {table}: row {}: its handler still runs {:?} after it started{}",
            self.id,
            self.after,
            if timed_out {
                " (its handler timeout already failed the delivery)"
            } else {
                ""
            }
        );
        if let Some(events) = &ctx.events {
            events.stuck(&crate::runtime::events::Stuck {
                table,
                id: self.id,
                attempt: self.attempt,
                running_for: self.after,
                timed_out,
            });
        }
        None
    }
}

/// A delivery's handler timeout, run by the subscription's timer at the deadline.
struct Expiry {
    ctx: Weak<Ctx>,
    held: Weak<Held>,
    row: Row,
    limit: Duration,
    /// When it last cancelled the handler's statement.
    cancelled: Option<Instant>,
}

impl Expiry {
    /// Fails the delivery if it is still held; `Some(delay)` to look again when its handler
    /// is busy on it (inside `in_delivery`: its running statement is cancelled meanwhile).
    fn run(&mut self) -> Option<Duration> {
        // Gone: the delivery was settled (or dropped) in time.
        let (ctx, held) = (self.ctx.upgrade()?, self.held.upgrade()?);
        held.timed_out.store(true, Ordering::Release);
        let Some(mut slot) = held.hold.try_lock() else {
            if self.cancelled.is_none_or(|at| at.elapsed() >= CANCEL_EVERY) {
                self.cancelled = Some(Instant::now());
                cancel(&ctx, &held);
            }
            return Some(BUSY_RECHECK);
        };
        let hold = slot.take()?;
        drop(slot);
        ctx.queue.meters.handler_timeout();
        let outcome = timeout_failure(&ctx, self.row.attempt);
        let id = self.row.id;
        let table = &ctx.spec().name;
        log::warn!(
            "table {table}: row {id}: the handler ran past its timeout of {:?}; {}",
            self.limit,
            if outcome.returns() {
                "failed, to be retried"
            } else {
                "dead-lettered"
            }
        );
        let within = ctx.queue.pool.connection_timeout();
        if let Err(e) = settle_hold(&ctx, &self.row, hold, outcome, None, within) {
            log::warn!("table {table}: row {id}: failing it after its handler timeout: {e}");
        }
        None
    }
}

/// Cancels the statement a row lock delivery's handler runs on its session, from another
/// connection (the delivery's own is busy). Best effort: the timeout looks again soon.
///
/// The connection is taken first (waiting up to a second, during which the handler may leave
/// `in_delivery`); then, under `busy`'s lock, the session is read again and the cancel sent
/// only if the handler is still inside: the session cannot be released meanwhile.
fn cancel(ctx: &Ctx, held: &Held) {
    let q = &ctx.queue;
    if *held.busy.lock() == 0 || q.dialect.cancel_statement(0).is_none() {
        return;
    }
    crate::runtime::pause_point("expiry.cancel", &q.spec.name);
    let done = q.conn_within("cancel", CANCEL_EVERY).and_then(|mut conn| {
        let busy = held.busy.lock();
        match (*busy != 0)
            .then(|| q.dialect.cancel_statement(*busy))
            .flatten()
        {
            Some(sql) => conn.batch(&sql).map_err(q.err("cancel")),
            None => Ok(()),
        }
    });
    if let Err(e) = done {
        log::warn!(
            "table {}: cancelling a timed-out handler's statement: {e}",
            q.spec.name
        );
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if let (Some(hold), _) = self.take() {
            if self.handed_out {
                let outcome = failure(&self.ctx, self.attempt, &DROPPED);
                if let Err(e) = settle_hold(&self.ctx, &self.row(), hold, outcome, None, DROP_WAIT)
                {
                    log::warn!(
                        "table {}: row {} was dropped unsettled: {e}",
                        self.ctx.spec().name,
                        self.id
                    );
                }
            } else {
                form::hand_back(&self.ctx, self.id, hold, DROP_WAIT);
            }
        }
        if self.owns_slot {
            self.ctx.slots.settled();
        }
        // Marked as the report marks it: of the two, only the later sees `true`, so a report
        // racing this drop is either counted here or not made.
        if self.held.stuck.swap(true, Ordering::AcqRel) {
            self.ctx.marks.stuck(false);
            self.ctx.queue.meters.stuck(false);
        }
        self.ctx.queue.meters.closed();
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
