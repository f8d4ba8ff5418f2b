//! A job changed in place: [`Broker::update`] and [`JobUpdate`]. The change and the decision
//! that no one works the job are one step in the database (`runtime/update.rs`).

use std::time::SystemTime;

use crate::broker::Broker;
use crate::error::{BrokerError, Result};
use crate::model::table::{Table, TableSpec};
use crate::model::value::Value;
use crate::operating::jobs::checked;
use crate::runtime::update::{apply, keyed_column, Changes, Updated};

/// What [`Broker::update`] changes in a job: any of its payload, the values of its table's own
/// columns, its priority and its due time. What is not named is left as it is.
///
/// ```
/// use sqlbroker::JobUpdate;
/// use std::time::{Duration, SystemTime};
///
/// let later = SystemTime::now() + Duration::from_secs(600);
/// let u = JobUpdate::new().payload(b"v2".to_vec()).set("note", "edited").priority(5).run_at(later);
/// assert_eq!(u.new_payload(), Some(&b"v2"[..]));
/// assert_eq!(u.new_priority(), Some(5));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[must_use = "an update does nothing until Broker::update runs it"]
pub struct JobUpdate {
    payload: Option<Vec<u8>>,
    values: Vec<(String, Value)>,
    priority: Option<i16>,
    run_at: Option<SystemTime>,
}

impl JobUpdate {
    /// An update that changes nothing yet ([`Broker::update`] refuses it as it is).
    pub fn new() -> Self {
        Self::default()
    }

    /// The new payload.
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = Some(payload.into());
        self
    }

    /// The new value of the table's own column `column`, checked as
    /// [`Message::set`](crate::Message::set) checks it (setting it twice keeps the last).
    /// A column some key reads (the advisory lock's, a concurrency or rate limit's, the fair
    /// key's, the FIFO group) is refused: a claim that read the job before the change could
    /// take it under its old key while another takes it under the new one.
    pub fn set(mut self, column: impl Into<String>, value: impl Into<Value>) -> Self {
        crate::model::value::set_in(&mut self.values, column.into(), value.into());
        self
    }

    /// The new priority, on a table described with
    /// [`Table::priorities`](crate::Table::priorities).
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = Some(priority);
        self
    }

    /// The new due time, rounded up to the next whole second as
    /// [`Message::deliver_at`](crate::Message::deliver_at) rounds it (a time past makes the
    /// job due at once). A job waiting on other jobs keeps waiting: it becomes due as they
    /// settle, whatever this says.
    pub fn run_at(mut self, time: SystemTime) -> Self {
        self.run_at = Some(time);
        self
    }

    /// The payload it sets, if any.
    pub fn new_payload(&self) -> Option<&[u8]> {
        self.payload.as_deref()
    }

    /// The column values it sets, by name.
    pub fn new_values(&self) -> &[(String, Value)] {
        &self.values
    }

    /// The priority it sets, if any.
    pub fn new_priority(&self) -> Option<i16> {
        self.priority
    }

    /// The due time it sets, if any (as given, before rounding).
    pub fn new_run_at(&self) -> Option<SystemTime> {
        self.run_at
    }

    /// Checks it against the table: what to write, or why not.
    fn changes(&self, spec: &TableSpec, now: SystemTime) -> Result<Changes> {
        let bad = |reason: String| BrokerError::InvalidMessage {
            table: spec.name.clone(),
            reason,
        };
        if self.priority.is_some() && spec.priority.is_none() {
            return Err(bad(
                "a priority for a table without priorities (describe it with \
                 Table::priorities)"
                    .into(),
            ));
        }
        let mut columns = Vec::with_capacity(self.values.len());
        for (c, v) in &self.values {
            let Some(i) = spec.column_index(c) else {
                return Err(bad(format!(
                    "{c:?} is not a column of the table description (the queue's own columns \
                     are not set by an update)"
                )));
            };
            if let Some(reader) = keyed_column(spec, i) {
                return Err(bad(format!(
                    "column {c:?} is read by {reader}: it cannot change in place (a claim may \
                     have read the job under its old key)"
                )));
            }
            crate::producing::message::fits(v, spec.columns[i].ty)
                .map_err(|why| bad(format!("column {c:?}: {why}")))?;
            for (what, role) in [("queue", spec.queue), ("kind", spec.kind)] {
                if role != Some(i) {
                    continue;
                }
                match v {
                    Value::Text(n) => crate::model::table::check_name(what, n).map_err(bad)?,
                    Value::Null if what == "kind" => {}
                    _ => return Err(bad(format!("the {what} is a name (text)"))),
                }
            }
            columns.push((i, crate::producing::message::as_written(v.clone())));
        }
        let changes = Changes {
            payload: self.payload.clone(),
            columns,
            priority: self.priority,
            run_at: self.run_at.map(|t| {
                let delay = t.duration_since(now).unwrap_or_default();
                crate::model::schedule::due_at(now, delay)
            }),
        };
        if changes.is_empty() {
            return Err(bad(
                "an update that changes nothing (give it a payload, a column \
                 value, a priority or a due time)"
                    .into(),
            ));
        }
        Ok(changes)
    }
}

impl Broker {
    /// Changes job `id` in place while no one works it: `true` if it was changed, whole, in
    /// one step; `false`, changing nothing, if it is in work, finished (dead-lettered,
    /// completed, acked) or not there. A job not in work is one that is scheduled, ready
    /// (claimed by no one yet) or waiting on other jobs.
    ///
    /// The database decides "not in work" in the same step as the change, so a claim racing
    /// the update either takes the job first (the update returns `false`) or reads the whole
    /// new job after it: a handler never sees half an update, and a job in work is never
    /// changed. Per form: **lease**, one statement whose condition is that no lease is in force
    /// (a job claimed ahead into a subscription's buffer is leased, so in work); **row lock**,
    /// the row is taken `FOR UPDATE SKIP LOCKED` in the update's transaction, so a row a
    /// delivery holds is passed by at once; **advisory lock**, the update runs under the
    /// job's key, tried without waiting: while that key is held, by this job or by another
    /// job of the same key in work, the update returns `false` (the database cannot tell the
    /// two apart, as [`JobState`](crate::JobState) says).
    ///
    /// A job waiting on other jobs ([`Message::after`](crate::Message::after)) may be
    /// updated; a due time given to it is not used: it stays waiting and becomes due as they
    /// settle.
    ///
    /// # Errors
    ///
    /// Nothing is changed on any error: [`BrokerError::InvalidMessage`] for an update that
    /// changes nothing, a column the description does not have (the queue's own columns, as
    /// `payload` or `attempts`, included), a value that does not fit its column (as
    /// [`Message::set`](crate::Message::set)), a column some key reads ([`JobUpdate::set`]),
    /// or a priority on a table without priorities; [`BrokerError::Schema`] if the table does
    /// not exist or lacks a column of its description; [`BrokerError::Database`] /
    /// [`BrokerError::Pool`] when the database failed.
    ///
    /// ```
    /// use sqlbroker::{Broker, JobUpdate, Message, Table};
    /// use std::time::{Duration, SystemTime};
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let mails = Table::new("mails").text_column("to").lease(Duration::from_secs(30));
    /// broker.create_table(&mails)?;
    /// let later = Message::new(b"draft".to_vec()).set("to", "ana@example.com");
    /// let id = broker.publish(&mails, later.deliver_after(Duration::from_secs(3600)))?;
    ///
    /// let edit = JobUpdate::new().payload(b"final".to_vec()).set("to", "bo@example.com");
    /// assert!(broker.update(&mails, id, edit.run_at(SystemTime::now()))?);
    /// let sub = broker.subscription(&mails).start()?;
    /// let d = sub.next_delivery_timeout(Duration::from_secs(5)).unwrap();
    /// assert_eq!((d.payload(), d.get("to").and_then(|v| v.as_str())), (&b"final"[..], Some("bo@example.com")));
    /// // In work now: an update changes nothing.
    /// assert!(!broker.update(&mails, id, JobUpdate::new().payload(b"late".to_vec()))?);
    /// d.ack()?;
    /// assert!(!broker.update(&mails, id, JobUpdate::new().payload(b"late".to_vec()))?);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn update(&self, table: &Table, id: i64, update: JobUpdate) -> Result<bool> {
        let q = self.queue(table)?;
        let changes = update.changes(&q.spec, SystemTime::now())?;
        checked(&q)?;
        let mut conn = q.conn("update")?;
        let done = apply(&q, &mut *conn, id, &changes)? == Updated::Done;
        drop(conn);
        if done && changes.run_at.is_some() {
            // Due now, perhaps: idle workers look at once rather than at their next poll.
            self.announce(&q, 1);
        }
        Ok(done)
    }
}
