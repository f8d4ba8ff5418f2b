//! What a producer publishes.

use std::time::{Duration, SystemTime};

use crate::error::BrokerError;
use crate::error::Result;
use crate::model::collect::Collect;
use crate::model::table::ColumnType;
use crate::model::table::TableSpec;
use crate::model::value::Value;
use crate::runtime::deps::Parent;

/// A message to publish: a binary payload, values for the table's own columns, and an optional
/// delay before it becomes due.
///
/// ```
/// use sqlbroker::Message;
/// use std::time::Duration;
///
/// let m = Message::new(b"{\"cents\":100}".to_vec())
///     .set("account", "a-17")
///     .deliver_after(Duration::from_secs(60));
/// assert_eq!(m.payload(), b"{\"cents\":100}");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use = "a message does nothing until it is published"]
pub struct Message {
    payload: Vec<u8>,
    values: Vec<(String, Value)>,
    delay: Duration,
    /// Set by [`Message::deliver_at`]: due then, not `delay` from the publish.
    at: Option<SystemTime>,
    dedup_key: Option<String>,
    priority: Option<i16>,
    /// The jobs it waits on ([`Message::after`], [`Message::after_settled`]).
    parents: Vec<Parent>,
    /// The W3C trace context ([`Message::traceparent`]), checked at publish.
    traceparent: Option<String>,
    /// The named queue ([`Message::queue`]), checked at publish.
    queue: Option<String>,
    /// The job kind ([`Message::kind`]), checked at publish.
    kind: Option<String>,
    /// The options few messages use (signals, replacing, a unique period, collecting),
    /// boxed: a message that uses none stays small (it is moved into batches and channels).
    rare: Option<Box<Rare>>,
}

/// The options of [`Message`] few messages use, in one box.
#[derive(Debug, Clone, Default, PartialEq)]
struct Rare {
    /// The signal it waits for ([`Message::after_signal`]).
    signal: Option<String>,
    /// How long at most ([`Message::wait_timeout`]).
    wait_timeout: Option<Duration>,
    /// Replaces the waiting job that holds its dedup key ([`Message::replace_waiting`]).
    replace: bool,
    /// The key's period ([`Message::unique_for`]).
    unique_for: Option<Duration>,
    /// The burst it joins ([`Message::collect`]), checked at publish.
    collect: Option<Collect>,
}

impl Message {
    /// The rare options, made on first use.
    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Default::default)
    }

    /// A message with `payload` as its body.
    pub fn new(payload: impl Into<Vec<u8>>) -> Self {
        Message {
            payload: payload.into(),
            values: Vec::new(),
            delay: Duration::ZERO,
            at: None,
            dedup_key: None,
            priority: None,
            parents: Vec::new(),
            traceparent: None,
            queue: None,
            kind: None,
            rare: None,
        }
    }

    /// The named queue the job goes to, on a table described with
    /// [`Table::queues`](crate::Table::queues) (without it, the queue is
    /// [`DEFAULT_QUEUE`](crate::DEFAULT_QUEUE)). A name is 1 to 64 characters of `A-Z a-z 0-9
    /// _ . : -`; another name, or a queue for a table without queues, is refused at publish
    /// ([`BrokerError::InvalidMessage`]), as is a `set` of the queue column to anything
    /// but such a name.
    ///
    /// ```
    /// use sqlbroker::Message;
    ///
    /// let m = Message::new(b"hi".to_vec()).queue("emails").kind("welcome");
    /// # let _ = m;
    /// ```
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        self.queue = Some(name.into());
        self
    }

    /// The job kind, on a table described with [`Table::kinds`](crate::Table::kinds): which
    /// handler of a [`Worker`](crate::Worker) runs it. Names are checked as
    /// [`Message::queue`]'s.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// The trace context the job continues, a
    /// [W3C `traceparent`](https://www.w3.org/TR/trace-context/#traceparent-header)
    /// (`00-<32 hex>-<16 hex>-<2 hex>`, lowercase, neither id all zeros), for a table described
    /// with [`Table::traceparent`](crate::Table::traceparent): written to the row, read by
    /// [`Delivery::traceparent`](crate::Delivery::traceparent). With the `opentelemetry`
    /// feature a publish fills it from the current span when it is not given.
    ///
    /// `publish` refuses the message with [`BrokerError::InvalidMessage`], writing nothing,
    /// when the table has no such column or the value is not a valid `traceparent`.
    ///
    /// ```
    /// use sqlbroker::Message;
    ///
    /// let m = Message::new(b"hi".to_vec())
    ///     .traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    /// # let _ = m;
    /// ```
    pub fn traceparent(mut self, value: &str) -> Self {
        self.traceparent = Some(value.to_owned());
        self
    }

    /// The message's priority, for a table described with [`Table::priorities`]: higher is
    /// claimed first. Default 0.
    ///
    /// [`Table::priorities`]: crate::Table::priorities
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = Some(priority);
        self
    }

    /// The message's dedup key, for a table described with [`Table::dedup`]: while an
    /// unfinished row holds the same key, publishing this message creates no row
    /// ([`BrokerError::Duplicate`] names the row that holds it).
    ///
    /// [`Table::dedup`]: crate::Table::dedup
    pub fn dedup_key(mut self, key: impl Into<String>) -> Self {
        self.dedup_key = Some(key.into());
        self
    }

    /// The key set with [`Message::dedup_key`].
    pub(crate) fn dedup_value(&self) -> Option<&str> {
        self.dedup_key.as_deref()
    }

    /// On a table with dedup keys, when a job that is not in work (scheduled, ready and not
    /// yet claimed, or waiting on other jobs) holds this message's key, that job becomes this
    /// message: its payload, its columns (unset ones `NULL`, as a publish writes them), its
    /// priority and its due time are replaced in one step, and
    /// [`Broker::publish`](crate::Broker::publish) returns its id instead of
    /// [`BrokerError::Duplicate`]. Its id, attempts, errors, dedup key and trace context are
    /// kept, and so are the columns a key reads (the advisory lock's, a limit's, the fair
    /// key's, the FIFO group: changing them could move a job between keys under a claim).
    /// No job holding the key: a new row, as any publish.
    ///
    /// A key held by a job **in work** (claimed, or claimed ahead into a subscription's
    /// buffer; in the advisory form also a job whose key another job of the same advisory key
    /// holds) is left as it is: the publish returns [`BrokerError::Duplicate`] naming it, as
    /// without this option, since the running handler has read the old job already. Whether a
    /// job is in work is decided by the database in the step that replaces it, as
    /// [`Broker::update`](crate::Broker::update) decides it: a claim racing the publish reads
    /// the whole old job or the whole new one.
    ///
    /// Needs a dedup key ([`Message::dedup_key`]), and is for
    /// [`Broker::publish`](crate::Broker::publish) only: a batch, a group's publish, a publish
    /// inside the application's transaction, or a message that waits on other jobs is refused
    /// with [`BrokerError::InvalidMessage`].
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let t = Table::new("search_index").dedup().lease(Duration::from_secs(30));
    /// broker.create_table(&t)?;
    /// let soon = Duration::from_secs(60);
    /// let first = broker.publish(&t, Message::new(b"v1".to_vec()).dedup_key("doc-7").deliver_after(soon))?;
    /// let again = Message::new(b"v2".to_vec()).dedup_key("doc-7").deliver_after(soon);
    /// assert_eq!(broker.publish(&t, again.replace_waiting())?, first);
    /// assert_eq!(broker.job(&t, first)?.unwrap().payload(), b"v2");
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn replace_waiting(mut self) -> Self {
        self.rare().replace = true;
        self
    }

    /// True if set with [`Message::replace_waiting`].
    pub(crate) fn replaces(&self) -> bool {
        self.rare.as_ref().is_some_and(|r| r.replace)
    }

    /// At most one job of this message's dedup key per period `d`: the publish is a
    /// [`BrokerError::Duplicate`] while a job of the key is unfinished (as any keyed publish),
    /// and also while the last job of the key **published with `unique_for`** finished (acked,
    /// dead-lettered or cancelled) less than `d` ago, naming that job. Published every time
    /// with `unique_for(d)`, a key runs at most once per period, as River's and Oban's unique
    /// periods do. The period is the publishing message's (whole seconds, counted from the
    /// finish time the row keeps, `dead_at`); a publish without `unique_for` is held back by an
    /// unfinished job only.
    ///
    /// The finished job must still be there to be counted: the table keeps completed rows
    /// ([`Table::keep_completed`](crate::Table::keep_completed)) at least `d`, and dead
    /// letters ([`Table::keep_dead`](crate::Table::keep_dead)) at least `d` if it prunes them.
    /// An operator who deletes, purges or cancels the finished job frees the key early.
    /// Which job last held a key is kept in `sqlbroker_unique` (made on first use: `CREATE`
    /// rights once), one row per table and key, replaced by the key's next such publish and
    /// deleted once its job is no longer in the table (the publishes sweep it now and then).
    ///
    /// Needs a dedup key on a table that keeps completed rows, for
    /// [`Broker::publish`](crate::Broker::publish) only: anything else is refused with
    /// [`BrokerError::InvalidMessage`].
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let day = Duration::from_secs(86_400);
    /// let t = Table::new("digests").dedup().keep_completed(day).lease(Duration::from_secs(30));
    /// broker.create_table(&t)?;
    /// let daily = || Message::new(b"send".to_vec()).dedup_key("digest:ana").unique_for(day);
    /// let id = broker.publish(&t, daily())?;
    /// let sub = broker.subscription(&t).start()?;
    /// sub.next_delivery().unwrap().ack()?;
    /// // Done, but within the day: still a duplicate.
    /// assert_eq!(broker.publish(&t, daily()).unwrap_err().duplicate_of(), Some(id));
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn unique_for(mut self, d: Duration) -> Self {
        self.rare().unique_for = Some(d);
        self
    }

    /// The period set with [`Message::unique_for`].
    pub(crate) fn unique_period(&self) -> Option<Duration> {
        self.rare.as_ref().and_then(|r| r.unique_for)
    }

    /// Sets the column `column` (a column the table describes) to `value`; unset columns are
    /// `NULL`. Setting a column twice keeps the last value.
    ///
    /// The value must fit the column's described type, the same on every database: text in a
    /// text column, an integer in an integer column, a float (or an integer) in a float column,
    /// bytes in a binary column, `NULL` anywhere. A float column takes no NaN (SQLite would store
    /// it as `NULL`, MySQL refuses it) and no infinity (MySQL refuses it); -0.0 is written as
    /// 0.0 (SQLite cannot keep the sign of a zero). Anything else is refused by `publish` with
    /// [`BrokerError::InvalidMessage`] before any SQL runs, rather than converted differently by
    /// each database.
    pub fn set(mut self, column: impl Into<String>, value: impl Into<Value>) -> Self {
        crate::model::value::set_in(&mut self.values, column.into(), value.into());
        self
    }

    /// Makes the message due `delay` from now (rounded up to the next whole second); it is not
    /// claimed before then.
    pub fn deliver_after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self.at = None;
        self
    }

    /// Makes the message due at `time` (rounded up to the next whole second, and saturating
    /// at 9999-12-31 UTC); it is not claimed before then. A time already past makes it due
    /// at once, in its turn: it does not go ahead of older rows that are due. The last of
    /// `deliver_at` and [`deliver_after`](Message::deliver_after) counts.
    ///
    /// ```
    /// use sqlbroker::Message;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let tomorrow = SystemTime::now() + Duration::from_secs(86_400);
    /// let m = Message::new(b"reminder".to_vec()).deliver_at(tomorrow);
    /// assert_eq!(m.due(), Some(tomorrow));
    /// ```
    pub fn deliver_at(mut self, time: SystemTime) -> Self {
        self.at = Some(time);
        self.delay = Duration::ZERO;
        self
    }

    /// Waits on job `id` of the same table ([`Message::after_in`]: of another): the new row is published now but claimed only once
    /// `id` has been acked. If `id` is dead-lettered or cancelled instead, the new row is
    /// dead-lettered too (its reason names `id`) and never runs. May be given several times
    /// (then it waits on each). A job no longer in the table counts as acked (an acked job is
    /// deleted unless the table keeps completed rows; an id never published is not told
    /// apart); one already dead or cancelled dead-letters the new row at once. Since a job can
    /// only name jobs published before it, no cycle can form.
    ///
    /// The table is described with [`Table::dependencies`](crate::Table::dependencies), and the
    /// message is not delayed ([`BrokerError::InvalidMessage`] otherwise): it is due as its
    /// last job settles.
    ///
    /// ```
    /// use sqlbroker::{Broker, JobState, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("orders").dependencies().lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// let charge = broker.publish(&jobs, Message::new(b"charge".to_vec()))?;
    /// let ship = broker.publish(&jobs, Message::new(b"ship".to_vec()).after(charge))?;
    /// assert_eq!(broker.job(&jobs, ship)?.unwrap().state(), JobState::Waiting);
    /// broker.cancel(&jobs, charge)?;
    /// let ship = broker.job(&jobs, ship)?.unwrap();
    /// assert_eq!(ship.state(), JobState::Dead);
    /// assert_eq!(ship.dead_reason(), Some(format!("job {charge} it waits on was cancelled").as_str()));
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn after(mut self, id: i64) -> Self {
        self.parents.push(Parent {
            id,
            settled_only: false,
            table: None,
        });
        self
    }

    /// As [`Message::after`], for job `id` of another table of the same database, itself
    /// described with [`Table::dependencies`](crate::Table::dependencies) (its settlements
    /// release the jobs waiting on it, in whichever table).
    pub fn after_in(mut self, table: &crate::model::table::Table, id: i64) -> Self {
        self.parents.push(Parent {
            id,
            settled_only: false,
            table: Some(Box::new(table.clone())),
        });
        self
    }

    /// As [`Message::after_settled`], for job `id` of another table of the same database, as
    /// [`Message::after_in`].
    pub fn after_settled_in(mut self, table: &crate::model::table::Table, id: i64) -> Self {
        self.parents.push(Parent {
            id,
            settled_only: true,
            table: Some(Box::new(table.clone())),
        });
        self
    }

    /// Waits on job `id` of the same table whatever its outcome: the new row runs once `id`
    /// has settled (acked, dead-lettered or cancelled), as a batch's callback does. Given for
    /// each job of a batch, the row runs exactly once, after the last of them settles, across
    /// any number of brokers and processes; its handler reads each job's outcome with
    /// [`Delivery::waited_on`](crate::Delivery::waited_on). As [`Message::after`] otherwise.
    pub fn after_settled(mut self, id: i64) -> Self {
        self.parents.push(Parent {
            id,
            settled_only: true,
            table: None,
        });
        self
    }

    /// Waits for signal `name` of its table: the row is published now but claimed only once
    /// [`Broker::signal`](crate::Broker::signal) sends `name` on the table (and, with
    /// [`Message::after`], once those jobs are acked too). A signal is a latch, kept in the
    /// database: sent before the publish, the job waits on nothing for it. The handler reads
    /// the signal's payload with [`Delivery::signal`](crate::Delivery::signal). A name is 1 to
    /// 63 characters of `A-Z a-z 0-9 _ . : -`; a job waits for one signal (a second call
    /// replaces the first name).
    ///
    /// The table is described with [`Table::dependencies`](crate::Table::dependencies), and
    /// the message is not delayed ([`BrokerError::InvalidMessage`] otherwise).
    ///
    /// ```
    /// use sqlbroker::{Broker, JobState, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let orders = Table::new("orders").dependencies().lease(Duration::from_secs(30));
    /// broker.create_table(&orders)?;
    /// let ship = broker.publish(&orders, Message::new(b"ship 7".to_vec()).after_signal("paid:7"))?;
    /// assert_eq!(broker.job(&orders, ship)?.unwrap().state(), JobState::Waiting);
    /// assert_eq!(broker.signal(&orders, "paid:7", b"txn 991")?, 1);
    /// let sub = broker.subscription(&orders).start()?;
    /// let d = sub.next_delivery().unwrap();
    /// assert_eq!(d.signal().unwrap().payload(), b"txn 991");
    /// d.ack()?;
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn after_signal(mut self, name: impl Into<String>) -> Self {
        self.rare().signal = Some(name.into());
        self
    }

    /// Bounds the wait of [`Message::after_signal`]: `d` after the publish, the job stops
    /// waiting for the signal and runs without it ([`Delivery::signal`](crate::Delivery::signal)
    /// is `None`), once the jobs it waits on with [`Message::after`] are acked. The broker's
    /// sweeper of `sqlbroker_deps` ends the wait within a round of its own past `d` (about 2
    /// seconds on a small table). A signal that comes first wins: the wait has one outcome,
    /// which the handler reads. Without `after_signal`, refused at publish
    /// ([`BrokerError::InvalidMessage`]).
    pub fn wait_timeout(mut self, d: Duration) -> Self {
        self.rare().wait_timeout = Some(d);
        self
    }

    /// Collects this event with the others of `key` into one job (debounce-and-collect):
    /// events published with the same key while their job has not been claimed become **one**
    /// job. Each event moves the job's due time to `quiet` after it, but never past `max_wait`
    /// after the key's first event: the job runs once no event came for `quiet`, or at
    /// `max_wait`, whichever is first. Its handler reads every event's payload, in publish
    /// order, with [`Delivery::collected`](crate::Delivery::collected).
    ///
    /// [`Broker::publish`](crate::Broker::publish) returns the id of the job the event went
    /// into. Exact across brokers and processes: the publishes of one key take turns on the
    /// key's row in the database's `sqlbroker_collect` table, and an event joins a job only
    /// if, in that same transaction and under the job's row lock, the job is still not due
    /// by the database's clock (the clock claims read) and has never been claimed; otherwise
    /// it starts the next job. So no event is lost or in two jobs, and an event published
    /// once the job is due or claimed is in the next one. A job holds at most
    /// [`COLLECT_MAX_EVENTS`](crate::COLLECT_MAX_EVENTS) events and
    /// [`COLLECT_MAX_BYTES`](crate::COLLECT_MAX_BYTES) of them: the event that fills it
    /// makes it due at once, one that would not fit starts the next job. The job takes the
    /// first event's column values, queue, kind and priority; a later event adds its payload
    /// only. Due times are whole seconds, as every due time.
    ///
    /// Any table may collect. Refused with [`BrokerError::InvalidMessage`], nothing written:
    /// an empty key (or one over [`COLLECT_KEY_MAX`](crate::COLLECT_KEY_MAX) characters, or
    /// holding a NUL), a zero `quiet`, a `max_wait` shorter than `quiet`, an event over
    /// `COLLECT_MAX_BYTES` less 4, and with a delay, a dedup key or jobs to wait on
    /// ([`Message::after`]); a collected message is published by `Broker::publish` alone
    /// (not in a batch, a group or your own transaction).
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("reindex").lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// let edit = |text: &str| {
    ///     Message::new(text.as_bytes().to_vec()).collect(
    ///         "doc-7",
    ///         Duration::from_secs(2),
    ///         Duration::from_secs(30),
    ///     )
    /// };
    /// let a = broker.publish(&jobs, edit("one"))?;
    /// let b = broker.publish(&jobs, edit("two"))?;
    /// assert_eq!(a, b); // one job for the burst
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn collect(mut self, key: impl Into<String>, quiet: Duration, max_wait: Duration) -> Self {
        self.rare().collect = Some(Collect {
            key: key.into(),
            quiet,
            max_wait,
        });
        self
    }

    /// The burst set with [`Message::collect`].
    pub(crate) fn collecting(&self) -> Option<&Collect> {
        self.rare.as_ref().and_then(|r| r.collect.as_ref())
    }

    /// The message as the first event of a new job of its burst: its payload framed, due
    /// `quiet` from now (now if it fills the job on its own: `full`), collected no more.
    pub(crate) fn into_first_event(mut self, full: bool) -> Self {
        if let Some(c) = self.rare.as_mut().and_then(|r| r.collect.take()) {
            self.payload = crate::model::collect::first(&self.payload);
            self.delay = if full { Duration::ZERO } else { c.quiet };
        }
        self
    }

    /// The jobs it waits on.
    pub(crate) fn parents(&self) -> &[Parent] {
        &self.parents
    }

    /// The signal it waits for, and for how long at most.
    pub(crate) fn signal_wait(&self) -> (Option<&str>, Option<Duration>) {
        match self.rare.as_deref() {
            Some(r) => (r.signal.as_deref(), r.wait_timeout),
            None => (None, None),
        }
    }

    /// The time set with [`Message::deliver_at`], if any.
    pub fn due(&self) -> Option<SystemTime> {
        self.at
    }

    /// The body.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The delay set with [`Message::deliver_after`] (zero after
    /// [`deliver_at`](Message::deliver_at)).
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The insert parameters in the order of the dialects' insert statements:
    /// payload, run_at, every user column in description order, then the priority, the
    /// dedup key and the trace context (tables that have them).
    pub(crate) fn params_into(
        self,
        spec: &TableSpec,
        now: std::time::SystemTime,
        out: &mut Vec<Value>,
    ) -> Result<()> {
        if self.collecting().is_some() {
            return Err(BrokerError::InvalidMessage {
                table: spec.name.clone(),
                reason: "a collected message (Message::collect) is published by \
                         Broker::publish alone, not in a batch, a group or a transaction of \
                         yours"
                    .into(),
            });
        }
        if self.priority.is_some() && spec.priority.is_none() {
            return Err(BrokerError::InvalidMessage {
                table: spec.name.clone(),
                reason: "a priority for a table without priorities (describe it with \
                         Table::priorities)"
                    .into(),
            });
        }
        if let Some(tp) = &self.traceparent {
            let bad = |reason: String| BrokerError::InvalidMessage {
                table: spec.name.clone(),
                reason,
            };
            if spec.traceparent.is_none() {
                return Err(bad(
                    "a traceparent for a table without one (describe it with \
                     Table::traceparent)"
                        .into(),
                ));
            }
            crate::model::trace::parse(tp).map_err(bad)?;
        }
        if self.dedup_key.is_some() && spec.dedup_key.is_none() {
            return Err(BrokerError::InvalidMessage {
                table: spec.name.clone(),
                reason: "a dedup key for a table without dedup keys (describe it with \
                         Table::dedup)"
                    .into(),
            });
        }
        for (c, v) in &self.values {
            let bad = |reason: String| BrokerError::InvalidMessage {
                table: spec.name.clone(),
                reason,
            };
            let Some(i) = spec.column_index(c) else {
                return Err(bad(format!(
                    "{c:?} is not a column of the table description"
                )));
            };
            fits(v, spec.columns[i].ty).map_err(|why| bad(format!("column {c:?}: {why}")))?;
        }
        // The queue and the kind: named by `queue`/`kind`, or by a `set` of their column.
        let mut named: Vec<(usize, Value)> = Vec::new();
        for (what, col, given, default) in [
            (
                "queue",
                spec.queue,
                self.queue,
                Some(crate::model::table::DEFAULT_QUEUE),
            ),
            ("kind", spec.kind, self.kind, None),
        ] {
            let bad = |reason: String| BrokerError::InvalidMessage {
                table: spec.name.clone(),
                reason,
            };
            let Some(col) = col else {
                if given.is_some() {
                    return Err(bad(format!(
                        "a {what} for a table without {what}s (describe it with Table::{what}s)"
                    )));
                }
                continue;
            };
            let set = self
                .values
                .iter()
                .find(|(c, _)| *c == spec.columns[col].name)
                .map(|(_, v)| v.clone());
            let value = match (given, set) {
                (Some(n), _) => Value::Text(n),
                (None, Some(v)) => v,
                (None, None) => default.map_or(Value::Null, |d| Value::Text(d.into())),
            };
            match &value {
                Value::Text(n) => crate::model::table::check_name(what, n).map_err(bad)?,
                Value::Null if default.is_none() => {}
                _ => return Err(bad(format!("the {what} is a name (text)"))),
            }
            named.push((col, value));
        }
        for i in spec.required_columns() {
            let name = &spec.columns[i].name;
            if !self.values.iter().any(|(c, _)| c == name) && !named.iter().any(|(c, _)| *c == i) {
                return Err(BrokerError::InvalidMessage {
                    table: spec.name.clone(),
                    reason: format!(
                        "no value for {name:?}, a column {} reads (set it; Value::Null on \
                         purpose for no value)",
                        spec.reader_of(i)
                    ),
                });
            }
        }
        out.push(Value::Bytes(self.payload));
        let delay = match self.at {
            Some(t) => t.duration_since(now).unwrap_or(Duration::ZERO),
            None => self.delay,
        };
        out.push(Value::Time(crate::model::schedule::due_at(now, delay)));
        let mut values = self.values;
        for (i, col) in spec.columns.iter().enumerate() {
            let v = values
                .iter()
                .position(|(c, _)| *c == col.name)
                .map(|i| values.swap_remove(i).1);
            let v = match named.iter().position(|(c, _)| *c == i) {
                Some(n) => Some(named.swap_remove(n).1),
                None => v,
            };
            out.push(v.map_or(Value::Null, as_written));
        }
        if spec.priority.is_some() {
            out.push(Value::Int(self.priority.unwrap_or(0).into()));
        }
        if spec.dedup_key.is_some() {
            out.push(self.dedup_key.map_or(Value::Null, Value::Text));
        }
        if spec.traceparent.is_some() {
            // With `opentelemetry`, a message that gave none takes the current span's.
            #[cfg(feature = "opentelemetry")]
            let tp = self
                .traceparent
                .or_else(crate::runtime::trace::current_traceparent);
            #[cfg(not(feature = "opentelemetry"))]
            let tp = self.traceparent;
            out.push(tp.map_or(Value::Null, Value::Text));
        }
        Ok(())
    }
}

/// A column's value as the library writes it, by a publish or an update in place.
pub(crate) fn as_written(v: Value) -> Value {
    match v {
        // SQLite writes an integral REAL as an integer, which has no -0: every database gets
        // 0.0, so a zero reads back the same everywhere (the pattern compares as `==` does, so
        // it matches -0.0 too).
        Value::Float(0.0) => Value::Float(0.0),
        // Whole seconds everywhere: MySQL's `DATETIME` would round a fraction, the others
        // keep it.
        Value::Time(t) => Value::Time(crate::model::schedule::floor(t)),
        v => v,
    }
}

/// Whether `v` may be written into a column described as `ty`. Each database converts a
/// mismatched value its own way (SQLite keeps `"five"` in an integer column and turns NaN into
/// `NULL`, MySQL rounds 3.5 into an integer column and writes a time as the number
/// 20261130141349, PostgreSQL refuses), so a mismatch is refused before any SQL runs.
pub(crate) fn fits(v: &Value, ty: ColumnType) -> std::result::Result<(), String> {
    let ok = match (v, ty) {
        (Value::Null, _) => true,
        (Value::Text(_), ColumnType::Text) => true,
        (Value::Int(_), ColumnType::Int | ColumnType::Float) => true,
        (Value::Float(f), ColumnType::Float) => {
            if f.is_nan() {
                return Err(
                    "NaN cannot be stored (SQLite stores it as NULL, MySQL refuses it)".into(),
                );
            }
            if f.is_infinite() {
                return Err("an infinity cannot be stored (MySQL refuses it)".into());
            }
            true
        }
        (Value::Bytes(_), ColumnType::Bytes) => true,
        (Value::Time(t), ColumnType::Time) => {
            let secs = crate::model::schedule::epoch_secs(*t);
            if !(0..=crate::model::schedule::LATEST_SECS).contains(&secs) {
                return Err(
                    "a time outside 1970-01-01 to 9999-12-31 UTC cannot be stored (MySQL's \
                     DATETIME range, kept on every database)"
                        .into(),
                );
            }
            true
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        let what = match v {
            Value::Null => "NULL",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Text(_) => "text",
            Value::Bytes(_) => "bytes",
            Value::Time(_) => "a time",
        };
        let column = match ty {
            ColumnType::Text => "a text",
            ColumnType::Int => "an integer",
            ColumnType::Float => "a float",
            ColumnType::Bytes => "a binary",
            ColumnType::Time => "a time",
        };
        Err(format!("{what} does not fit {column} column"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::table::Table;
    use std::time::{SystemTime, UNIX_EPOCH};

    fn params(m: Message) -> Result<Vec<Value>> {
        let spec = Table::new("t")
            .text_column("s")
            .int_column("i")
            .float_column("f")
            .bytes_column("b")
            .validate()
            .unwrap();
        let mut out = Vec::new();
        m.params_into(&spec, UNIX_EPOCH, &mut out).map(|()| out)
    }

    fn refused(m: Message) -> String {
        match params(m) {
            Err(BrokerError::InvalidMessage { reason, .. }) => reason,
            other => panic!("expected InvalidMessage, got {other:?}"),
        }
    }

    /// A message that leaves out a column the advisory key template reads is refused, naming
    /// it; an explicit NULL is taken. A FIFO group column may be left out (the row is a group
    /// of its own). Fails (`left out`) without the check in `params_into`.
    #[test]
    fn key_columns_must_be_set() {
        let advisory = Table::new("t")
            .text_column("tenant")
            .text_column("note")
            .advisory_lock("acct-{tenant}")
            .validate()
            .unwrap();
        let run = |spec: &TableSpec, m: Message| {
            let mut out = Vec::new();
            m.params_into(spec, UNIX_EPOCH, &mut out)
        };
        let m = || Message::new(Vec::new());
        match run(&advisory, m()) {
            Err(BrokerError::InvalidMessage { reason, .. }) => {
                assert!(reason.contains("\"tenant\""), "{reason}")
            }
            other => panic!("a message that left out \"tenant\" was {other:?}"),
        }
        run(&advisory, m().set("tenant", "a")).unwrap();
        run(&advisory, m().set("tenant", Value::Null)).unwrap();
        // A column no key reads may be left out; so may a FIFO group.
        let fifo = Table::new("t")
            .text_column("customer")
            .group("customer")
            .fifo()
            .validate()
            .unwrap();
        run(&fifo, m()).unwrap();
    }

    /// A trace context goes last of the insert's values on a table with the column (`NULL`
    /// when not given); a table without it, or a malformed value, is refused before any SQL.
    /// Fails (`accepted`) without the checks in `params_into`.
    #[test]
    fn traceparent_is_checked_and_written_last() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let traced = Table::new("t")
            .text_column("s")
            .traceparent()
            .validate()
            .unwrap();
        let run = |spec: &TableSpec, m: Message| {
            let mut out = Vec::new();
            m.params_into(spec, UNIX_EPOCH, &mut out).map(|()| out)
        };
        let out = run(&traced, Message::new(Vec::new()).traceparent(tp)).unwrap();
        assert_eq!((out.len(), &out[3]), (4, &Value::from(tp)));
        assert_eq!(traced.insert_width(), 4);
        let out = run(&traced, Message::new(Vec::new())).unwrap();
        assert_eq!(out[3], Value::Null);
        let reason = |r: Result<Vec<Value>>| match r {
            Err(BrokerError::InvalidMessage { reason, .. }) => reason,
            other => panic!("accepted: {other:?}"),
        };
        let plain = Table::new("t").validate().unwrap();
        assert!(
            reason(run(&plain, Message::new(Vec::new()).traceparent(tp)))
                .contains("Table::traceparent")
        );
        assert!(reason(run(
            &traced,
            Message::new(Vec::new()).traceparent("00-1-2-01")
        ))
        .contains("traceparent \"00-1-2-01\""));
    }

    #[test]
    fn values_must_fit_their_column() {
        let m = || Message::new(Vec::new());
        // What fits, in description order after payload and run_at; unset is NULL.
        let out = params(
            m().set("b", vec![0u8])
                .set("s", "'; DROP TABLE t; --\0")
                .set("i", i64::MIN)
                .set("f", f64::MAX),
        )
        .unwrap();
        assert_eq!(out.len(), 6);
        assert_eq!(out[2], Value::from("'; DROP TABLE t; --\0"));
        assert_eq!(out[3], Value::Int(i64::MIN));
        assert_eq!(out[4], Value::Float(f64::MAX));
        // -0.0 is written as 0.0 (SQLite cannot keep the sign of a zero).
        match params(m().set("f", -0.0)).unwrap()[4] {
            Value::Float(f) => assert_eq!(f.to_bits(), 0.0f64.to_bits()),
            ref other => panic!("{other:?}"),
        }
        assert_eq!(out[5], Value::Bytes(vec![0]));
        params(m().set("f", 3)).unwrap(); // an integer in a float column
        params(m().set("s", Value::Null).set("i", Value::Null)).unwrap();
        assert_eq!(
            params(m()).unwrap()[2..],
            [Value::Null, Value::Null, Value::Null, Value::Null]
        );

        assert!(refused(m().set("s", 5)).contains("an integer does not fit a text column"));
        assert!(refused(m().set("i", "5")).contains("text does not fit an integer column"));
        assert!(refused(m().set("i", 3.5)).contains("a float does not fit an integer column"));
        assert!(refused(m().set("s", vec![0xffu8])).contains("bytes does not fit a text column"));
        assert!(refused(m().set("b", "txt")).contains("text does not fit a binary column"));
        assert!(refused(m().set("i", SystemTime::now())).contains("a time does not fit"));
        assert!(refused(m().set("f", f64::NAN)).contains("NaN"));
        // MySQL cannot hold an infinity: refused on every database alike.
        assert!(refused(m().set("f", f64::INFINITY)).contains("infinity"));
        assert!(refused(m().set("f", f64::NEG_INFINITY)).contains("infinity"));
        // Role columns cannot be set, nor columns named in another case.
        for c in [
            "id", "payload", "attempts", "run_at", "dead_at", "S", "s\0", "s; --",
        ] {
            assert!(refused(m().set(c, 1)).contains("not a column"), "{c:?}");
        }
    }
}
