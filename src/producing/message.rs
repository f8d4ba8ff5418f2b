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
    /// The burst it joins ([`Message::collect`]), checked at publish (boxed: a message
    /// that does not collect stays as small as before).
    collect: Option<Box<Collect>>,
}

impl Message {
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
            collect: None,
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
        let column = column.into();
        let value = value.into();
        match self.values.iter_mut().find(|(c, _)| *c == column) {
            Some(slot) => slot.1 = value,
            None => self.values.push((column, value)),
        }
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
        self.collect = Some(Box::new(Collect {
            key: key.into(),
            quiet,
            max_wait,
        }));
        self
    }

    /// The burst set with [`Message::collect`].
    pub(crate) fn collecting(&self) -> Option<&Collect> {
        self.collect.as_deref()
    }

    /// The message as the first event of a new job of its burst: its payload framed, due
    /// `quiet` from now, collected no more.
    pub(crate) fn into_first_event(mut self) -> Self {
        if let Some(c) = self.collect.take() {
            self.payload = crate::model::collect::first(&self.payload);
            self.delay = c.quiet;
        }
        self
    }

    /// The jobs it waits on.
    pub(crate) fn parents(&self) -> &[Parent] {
        &self.parents
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
        if self.collect.is_some() {
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
            out.push(match v {
                // SQLite writes an integral REAL as an integer, which has no -0: every
                // database gets 0.0, so a zero reads back the same everywhere (the pattern
                // compares as `==` does, so it matches -0.0 too).
                Some(Value::Float(0.0)) => Value::Float(0.0),
                // Whole seconds everywhere: MySQL's `DATETIME` would round a fraction, the
                // others keep it.
                Some(Value::Time(t)) => Value::Time(crate::model::schedule::floor(t)),
                v => v.unwrap_or(Value::Null),
            });
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

/// Whether `v` may be written into a column described as `ty`. Each database converts a
/// mismatched value its own way (SQLite keeps `"five"` in an integer column and turns NaN into
/// `NULL`, MySQL rounds 3.5 into an integer column and writes a time as the number
/// 20261130141349, PostgreSQL refuses), so a mismatch is refused before any SQL runs.
fn fits(v: &Value, ty: ColumnType) -> std::result::Result<(), String> {
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
