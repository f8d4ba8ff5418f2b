//! One job at a time, for operators: lookup by id ([`Broker::job`]), pages of jobs by state
//! ([`Broker::jobs`]) and cancel ([`Broker::cancel`]), with what each form can see of a row in
//! work.

use std::time::SystemTime;

use crate::broker::Broker;
use crate::dialect::keys::{KeySql, SessionKeys};
use crate::dialect::shared::CANCELLED;
use crate::dialect::DbConn;
#[cfg(doc)]
use crate::error::BrokerError;
use crate::error::{DbError, DbErrorKind, Result};
use crate::model::schedule::claim_now;
use crate::model::table::{Form, Table};
use crate::model::value::Value;
use crate::runtime::update::{under_xact_key, with_key};
use crate::runtime::Queue;

/// Where a job is in its life ([`Job::state`]).
///
/// What [`InFlight`](JobState::InFlight) can see depends on the form, because only the lease
/// form marks a row in work in the row itself:
///
/// | form | a job is in flight when |
/// |---|---|
/// | lease | its lease has not expired (`locked_until` in the future) |
/// | row lock | it is due and another session holds its row lock (a `FOR UPDATE SKIP LOCKED` probe of the row, in a transaction rolled back at once) |
/// | advisory lock | it is due and its key is held by a session (a try-lock of the key released at once; SQLite: this process's keys): **this row or another row of the same key**, which the database cannot tell apart |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JobState {
    /// Waiting for its due time (published with a delay, or retried with one).
    Scheduled,
    /// Due: the next claim may take it.
    Ready,
    /// A handler has it (see the table above for what each form can see).
    InFlight,
    /// Dead-lettered: out of the queue until requeued.
    Dead,
    /// Acked and kept ([`Table::keep_completed`]).
    Completed,
    /// Published, waiting on other jobs to settle ([`Message::after`](crate::Message::after),
    /// [`Message::after_settled`](crate::Message::after_settled)): [`Job::waits_on`] names
    /// them. [`Broker::jobs`] pages these rows with the [`Scheduled`](JobState::Scheduled)
    /// ones (a waiting row is due at the latest time): filter on the state.
    Waiting,
}

impl JobState {
    /// The states in the order [`TableSql::jobs_page`](crate::dialect::TableSql) lists them.
    pub(crate) fn index(self) -> usize {
        match self {
            JobState::Scheduled | JobState::Waiting => 0,
            JobState::Ready => 1,
            JobState::InFlight => 2,
            JobState::Dead => 3,
            JobState::Completed => 4,
        }
    }

    /// A short lowercase name (`scheduled`, `ready`, `in flight`, `dead`, `completed`,
    /// `waiting`).
    pub fn name(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Ready => "ready",
            JobState::InFlight => "in flight",
            JobState::Dead => "dead",
            JobState::Completed => "completed",
            JobState::Waiting => "waiting",
        }
    }
}

/// One job as [`Broker::job`] read it: a snapshot, its state as the form can tell it.
///
/// ```
/// use sqlbroker::{Broker, JobState, Message, Table};
/// use std::time::Duration;
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let jobs = Table::new("jobs").text_column("kind").lease(Duration::from_secs(30));
/// broker.create_table(&jobs)?;
/// let id = broker.publish(&jobs, Message::new(b"hi".to_vec()).set("kind", "greet"))?;
/// let sub = broker.subscription(&jobs).start()?;
/// sub.next_delivery().unwrap().fail("smtp: 421 try again later")?;
///
/// let job = broker.job(&jobs, id)?.expect("still there");
/// assert_eq!(job.state(), JobState::Scheduled); // retried after the policy's delay
/// assert_eq!((job.attempts(), job.errors()), (1, 1));
/// assert_eq!(job.last_error(), Some("smtp: 421 try again later"));
/// assert_eq!(job.get("kind").and_then(|v| v.as_str()), Some("greet"));
/// assert!(broker.job(&jobs, id + 1)?.is_none());
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[derive(Clone, PartialEq)]
pub struct Job {
    id: i64,
    state: JobState,
    attempts: u32,
    errors: u32,
    last_error: Option<String>,
    dead_reason: Option<String>,
    payload: Vec<u8>,
    /// The payload's full length in bytes ([`Broker::jobs_preview`] reads a prefix).
    payload_len: u64,
    due_at: SystemTime,
    published_at: Option<SystemTime>,
    finished_at: Option<SystemTime>,
    lease_until: Option<SystemTime>,
    cancel_requested: bool,
    values: Vec<(String, Value)>,
    /// Its queue (`None`: the default queue) and kind, read from `values` by the role.
    queue: Option<String>,
    kind: Option<String>,
    /// The jobs it waits on ([`Broker::job`] only).
    waits_on: Vec<crate::model::waits::Dependency>,
    /// The signal it waits for ([`Broker::job`] only).
    signal_wait: Option<crate::model::waits::SignalWait>,
    /// The jobs waiting on it ([`Broker::job`] only).
    dependents: Vec<(String, i64)>,
    /// What it produced ([`Broker::job`] only).
    output: Option<Vec<u8>>,
    /// Its last checkpoint ([`Broker::job`] only).
    checkpoint: Option<Vec<u8>>,
    /// The trace context of its publish ([`Broker::job`] only).
    traceparent: Option<String>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("id", &self.id)
            .field("state", &self.state)
            .field("attempts", &self.attempts)
            .field("errors", &self.errors)
            .field("last_error", &self.last_error)
            .field("dead_reason", &self.dead_reason)
            .field("payload", &crate::model::value::Payload(&self.payload))
            .field("payload_len", &self.payload_len)
            .field("due_at", &self.due_at)
            .field("published_at", &self.published_at)
            .field("finished_at", &self.finished_at)
            .field("lease_until", &self.lease_until)
            .field("cancel_requested", &self.cancel_requested)
            .field("values", &self.values)
            .field("queue", &self.queue())
            .field("kind", &self.kind)
            .field("waits_on", &self.waits_on)
            .field("signal_wait", &self.signal_wait)
            .field("dependents", &self.dependents)
            .field(
                "output",
                &self.output.as_deref().map(crate::model::value::Payload),
            )
            .field(
                "checkpoint",
                &self.checkpoint.as_deref().map(crate::model::value::Payload),
            )
            .field("traceparent", &self.traceparent)
            .finish()
    }
}

impl Job {
    /// The row's id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Its queue ([`Table::queues`](crate::Table::queues)): the
    /// [`DEFAULT_QUEUE`](crate::DEFAULT_QUEUE) on a table without queues, and for a row whose
    /// adopted queue column is `NULL`, as [`Delivery::queue`](crate::Delivery::queue) says.
    pub fn queue(&self) -> &str {
        self.queue
            .as_deref()
            .unwrap_or(crate::model::table::DEFAULT_QUEUE)
    }

    /// Its kind ([`Table::kinds`](crate::Table::kinds)), if it was published with one.
    pub fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }

    /// Where it is ([`JobState`]).
    pub fn state(&self) -> JobState {
        self.state
    }

    /// Attempts spent so far (the lease and advisory forms count one at claim, the row lock
    /// form when an attempt is settled: retried, dead-lettered, cancelled, or acked on a table
    /// that keeps completed rows).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Failures recorded: [`Delivery::fail`](crate::Delivery::fail), the runner's failed or
    /// panicking handlers, handler timeouts and deliveries dropped unsettled, and in the lease
    /// form a lease that ran out unsettled (a crash: recorded by the next claim, see
    /// [`abandoned`](Job::abandoned)). A plain [`retry`](crate::Delivery::retry) or
    /// [`dead_letter`](crate::Delivery::dead_letter) is not a failure; in the advisory form a
    /// crash leaves none (it spends an attempt).
    pub fn errors(&self) -> u32 {
        self.errors
    }

    /// The last failure's text (at most [`LAST_ERROR_MAX`](crate::LAST_ERROR_MAX) characters); `None` before the
    /// first. Kept through a dead letter and a requeue.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Its last failure was a claim lost without a settlement (lease form): a claim found the
    /// lease of the attempt before run out, nobody having acked, retried or failed it, and
    /// recorded [`LEASE_RAN_OUT`](crate::LEASE_RAN_OUT). Each such claim counts in
    /// [`errors`](Job::errors); a job whose every attempt ends so (it kills or hangs its
    /// process) is dead-lettered at its [`max_attempts`](crate::Table::max_attempts). True
    /// until a later failure replaces the text, and never for a completed job or one requeued
    /// since (no attempt spent). The row lock form cannot see it (a crash undoes the claim);
    /// the advisory form spends an attempt ([`attempts`](Job::attempts) grows while `errors`
    /// does not).
    pub fn abandoned(&self) -> bool {
        self.last_error.as_deref() == Some(crate::error::LEASE_RAN_OUT)
            && self.state != JobState::Completed
            && self.attempts > 0
    }

    /// Why it was dead-lettered (dead jobs; `"cancelled"` for a job cancelled in work, or
    /// kept completed and cancelled).
    pub fn dead_reason(&self) -> Option<&str> {
        self.dead_reason.as_deref()
    }

    /// The body; from [`Broker::jobs_preview`], only its first bytes
    /// ([`payload_len`](Job::payload_len) tells the whole length).
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The payload's full length in bytes: [`payload`](Job::payload)'s length, except in a
    /// [`Broker::jobs_preview`] listing, which reads only a prefix.
    pub fn payload_len(&self) -> u64 {
        self.payload_len
    }

    /// The value of a column of the table's description.
    pub fn get(&self, column: &str) -> Option<&Value> {
        self.values
            .iter()
            .find(|(c, _)| c == column)
            .map(|(_, v)| v)
    }

    /// The table's own columns, by name.
    pub fn values(&self) -> &[(String, Value)] {
        &self.values
    }

    /// When it is (or was) due: `run_at`, whole seconds, as the publish or the last retry
    /// wrote it from its host's clock: for a job never retried, when it was published plus
    /// its delay.
    pub fn due_at(&self) -> SystemTime {
        self.due_at
    }

    /// When it was published: `created_at`, whole seconds, the database server's clock at the
    /// insert (the column's default, so the publishing host's clock plays no part). `None` for
    /// a row the table cannot date: one published before [`Broker::migrate`] added the column
    /// to a table made by an earlier release, and on SQLite any row published into such a
    /// migrated table (SQLite cannot add the column with its default; a table made by
    /// [`Broker::create_table`] has it).
    pub fn published_at(&self) -> Option<SystemTime> {
        self.published_at
    }

    /// When it was dead-lettered or completed (`dead_at`: the database server's clock for a
    /// completion or cancel, the settling host's for a dead letter); `None` while it is live.
    pub fn finished_at(&self) -> Option<SystemTime> {
        self.finished_at
    }

    /// Lease form: the lease's deadline (`locked_until`; in the past once it expired).
    pub fn lease_until(&self) -> Option<SystemTime> {
        self.lease_until
    }

    /// Lease and advisory forms: [`Broker::cancel`] asked that this job, in work, not run
    /// again.
    pub fn cancel_requested(&self) -> bool {
        self.cancel_requested
    }

    /// The jobs it waits on ([`Message::after`](crate::Message::after),
    /// [`Message::after_settled`](crate::Message::after_settled)), each with its outcome once
    /// settled, until it settles itself (a dead letter keeps them: a requeue waits on them
    /// again). Read by [`Broker::job`]; empty in listings.
    pub fn waits_on(&self) -> &[crate::model::waits::Dependency] {
        &self.waits_on
    }

    /// The signal it waits for ([`Message::after_signal`](crate::Message::after_signal)):
    /// its name, deadline, and whether it came or timed out, until the job settles (a dead
    /// letter keeps it). Read by [`Broker::job`]; `None` in listings.
    pub fn signal_wait(&self) -> Option<&crate::model::waits::SignalWait> {
        self.signal_wait.as_ref()
    }

    /// The jobs waiting on it (until each settles), `(table, id)`. Read by [`Broker::job`];
    /// empty in listings.
    pub fn dependents(&self) -> &[(String, i64)] {
        &self.dependents
    }

    /// What it produced ([`Delivery::set_output`](crate::Delivery::set_output)), on a table
    /// with [`Table::outputs`](crate::Table::outputs): written by the settlement that ended it,
    /// so read where the row is kept (a dead letter, or a completed row of a table that keeps
    /// them). Read by [`Broker::job`]; `None` in listings.
    pub fn output(&self) -> Option<&[u8]> {
        self.output.as_deref()
    }

    /// Its last checkpoint ([`Delivery::checkpoint`](crate::Delivery::checkpoint)), on a table
    /// with [`Table::checkpoints`](crate::Table::checkpoints): where a retried or crashed job
    /// resumes. Read by [`Broker::job`]; `None` in listings.
    pub fn checkpoint(&self) -> Option<&[u8]> {
        self.checkpoint.as_deref()
    }

    /// The trace context it was published with, a W3C `traceparent`
    /// ([`Message::traceparent`](crate::Message::traceparent)), on a table with
    /// [`Table::traceparent`](crate::Table::traceparent); read by [`Broker::job`] only (`None`
    /// in listings).
    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }
}

/// A job of the `job_columns` layout, its state not yet told apart where the form needs a
/// probe (`Ready` stands for "due and live").
fn job_row(q: &Queue, row: Vec<Value>, now: SystemTime) -> Job {
    let mut it = row.into_iter();
    let mut next = || it.next().unwrap_or(Value::Null);
    let int = |v: Value| v.as_i64().unwrap_or_default();
    let text = |v: Value| match v {
        Value::Text(s) => Some(s),
        _ => None,
    };
    let id = int(next());
    let attempts = int(next()).clamp(0, u32::MAX as i64) as u32;
    let payload = next().into_payload();
    let payload_len = payload.len() as u64;
    let due_at = next().as_time().unwrap_or(SystemTime::UNIX_EPOCH);
    let finished_at = next().as_time();
    let dead_reason = text(next());
    let last_error = text(next());
    let errors = int(next()).clamp(0, u32::MAX as i64) as u32;
    let lease_until = next().as_time();
    let completed = next().as_time().is_some();
    let cancel_requested = int(next()) != 0;
    let published_at = next().as_time();
    let mut rest: Vec<Value> = it.collect();
    // `job` reads the output, the checkpoint and the trace context after the user columns;
    // listings do not.
    let mut tail = rest
        .split_off(q.spec.columns.len().min(rest.len()))
        .into_iter();
    let mut bytes = |column: &Option<String>| match column {
        Some(_) => match tail.next() {
            Some(Value::Null) | None => None,
            Some(v) => Some(v.into_payload()),
        },
        None => None,
    };
    let output = bytes(&q.spec.output);
    let checkpoint = bytes(&q.spec.checkpoint);
    let traceparent = match &q.spec.traceparent {
        Some(_) => tail.next().and_then(text),
        None => None,
    };
    let values: Vec<(String, Value)> = q
        .spec
        .columns
        .iter()
        .map(|c| c.name.clone())
        .zip(q.spec.typed_values(rest))
        .collect();
    let role = |i: Option<usize>| match i.and_then(|i| values.get(i)) {
        Some((_, Value::Text(t))) => Some(t.clone()),
        _ => None,
    };
    let (queue, kind) = (role(q.spec.queue), role(q.spec.kind));
    let state = if completed {
        JobState::Completed
    } else if finished_at.is_some() {
        JobState::Dead
    } else if lease_until.is_some_and(|t| t > now) {
        JobState::InFlight
    } else if q.spec.dependencies && due_at == crate::runtime::deps::waiting_due() {
        JobState::Waiting
    } else if due_at > now {
        JobState::Scheduled
    } else {
        JobState::Ready
    };
    Job {
        id,
        state,
        attempts,
        errors,
        last_error,
        dead_reason,
        payload,
        payload_len,
        due_at,
        published_at,
        finished_at,
        lease_until,
        cancel_requested,
        values,
        queue,
        kind,
        waits_on: Vec::new(),
        signal_wait: None,
        dependents: Vec::new(),
        output,
        checkpoint,
        traceparent,
    }
}

/// Tells the due, live jobs of a row lock or advisory table apart: `InFlight` where the
/// form's probe finds the row (row lock) or its key (advisory) held elsewhere.
fn probe(q: &Queue, jobs: &mut [Job]) -> Result<()> {
    let due: Vec<usize> = (0..jobs.len())
        .filter(|i| jobs[*i].state == JobState::Ready)
        .collect();
    if due.is_empty() {
        return Ok(());
    }
    match q.spec.form {
        Form::Lease => Ok(()),
        Form::RowLock => {
            let mut conn = q.conn("job")?;
            // Broken from `BEGIN` until the rollback: never pooled mid-transaction.
            conn.mark_broken();
            let run = |conn: &mut dyn DbConn| -> Result<Vec<bool>, DbError> {
                for stmt in &q.sql.begin {
                    conn.batch(stmt)?;
                }
                due.iter()
                    .map(|i| {
                        let free = conn.query(&q.sql.probe_lock, &[Value::Int(jobs[*i].id)])?;
                        Ok(free.is_empty())
                    })
                    .collect()
            };
            let held = run(&mut *conn);
            conn.rollback_or_discard();
            for (i, held) in due.iter().zip(held.map_err(q.err("job"))?) {
                // A probe that found nothing: locked elsewhere, or gone since the read.
                if held {
                    jobs[*i].state = JobState::InFlight;
                }
            }
            Ok(())
        }
        Form::AdvisoryLock => {
            let Some(template) = &q.spec.key else {
                return Ok(());
            };
            let mut held_keys = std::collections::HashMap::new();
            for i in due {
                let values: Vec<Value> = jobs[i].values.iter().map(|(_, v)| v.clone()).collect();
                let key = template.render(&values);
                let held = match held_keys.get(&key) {
                    Some(h) => *h,
                    None => {
                        let h = key_held(q, &key)?;
                        held_keys.insert(key, h);
                        h
                    }
                };
                if held {
                    jobs[i].state = JobState::InFlight;
                }
            }
            Ok(())
        }
    }
}

/// True if a session (or, SQLite, this process) holds `key`: tried without waiting, and let
/// go at once if taken.
fn key_held(q: &Queue, key: &str) -> Result<bool> {
    if let Some(registry) = q.dialect.process_keys() {
        return Ok(registry.is_held(key));
    }
    if q.held_here.is_held(key) {
        return Ok(true);
    }
    if let Some(xact) = q.dialect.key_xact_lock() {
        let mut conn = q.conn("job")?;
        let taken = under_xact_key(&mut *conn, xact, &q.dialect.key_name(key), |_| Ok(()))
            .map_err(q.err("job"))?;
        return Ok(taken.is_none());
    }
    let (Some(lock), Some(unlock)) = (q.sql.key_lock.as_deref(), q.sql.key_unlock.as_deref())
    else {
        return Ok(false);
    };
    let sql = KeySql { lock, unlock };
    let name = q.dialect.key_name(key);
    let mut conn = q.conn("job")?;
    let mut keys = SessionKeys::default();
    let taken = keys.lock(&mut *conn, &sql, &name).map_err(q.err("job"))?;
    if taken {
        // A failed unlock leaves the session marked broken: the pool discards it.
        keys.unlock(&mut *conn, &sql, &name);
    }
    Ok(!taken)
}

/// The table exists with every column its description needs (else a clear
/// [`BrokerError::Schema`], before any statement meets a missing table or column). A queue
/// the broker remembers as checked ([`registry::verify`](crate::runtime::registry::verify) checked its
/// columns) is not asked again: only a table that did not exist then is.
pub(crate) fn checked(q: &Queue) -> Result<()> {
    if q.described.load(std::sync::atomic::Ordering::Acquire) {
        return Ok(());
    }
    let mut conn = q.conn("schema check")?;
    q.check_schema(&mut *conn)
}

/// Where a page of a listing starts, how long it is, and how much of each payload it reads.
#[derive(Clone, Copy)]
pub(crate) struct Page {
    pub after: Option<i64>,
    pub limit: usize,
    pub payload_prefix: usize,
}

/// Runs a page of [`TableSql::jobs_preview`](crate::dialect::TableSql) (or a filtered one of
/// the same shape) with `nows` times and the filter's `values`: the jobs, each with its
/// payload's full length.
pub(crate) fn preview_rows(
    q: &Queue,
    sql: &str,
    nows: usize,
    values: Vec<Value>,
    page: Page,
) -> Result<Vec<Job>> {
    let now = claim_now(SystemTime::now());
    // SUBSTR counts from 1 and reads at most an INT's worth.
    let mut params = vec![Value::Int(page.payload_prefix.min(i32::MAX as usize) as i64)];
    params.extend(std::iter::repeat_n(Value::Time(now), nows));
    params.extend(values);
    params.push(Value::Int(page.after.unwrap_or(i64::MIN)));
    params.push(Value::Int(page.limit.min(i64::MAX as usize) as i64));
    let rows = q.retrying("jobs", |conn| conn.query(sql, &params))?;
    Ok(rows
        .into_iter()
        .map(|mut row| {
            let len = if row.is_empty() {
                Value::Null
            } else {
                row.remove(0)
            };
            let mut job = job_row(q, row, now);
            job.payload_len = len
                .as_i64()
                .map_or(job.payload.len() as u64, |n| n.max(0) as u64);
            job
        })
        .collect())
}

impl Broker {
    /// The job `id` of `table`, or `None` if no row has that id (acked and deleted, purged,
    /// cancelled, or never there). One statement; in the row lock and advisory forms a due
    /// job is probed to tell [`Ready`](JobState::Ready) from
    /// [`InFlight`](JobState::InFlight) ([`JobState`] says how, per form).
    ///
    /// # Errors
    ///
    /// [`BrokerError::Schema`] if the table does not exist, or lacks a column its description
    /// names (a table made by an earlier release: [`Broker::migrate`]);
    /// [`BrokerError::InvalidTable`] for an invalid description.
    pub fn job(&self, table: &Table, id: i64) -> Result<Option<Job>> {
        let q = self.queue(table)?;
        checked(&q)?;
        let now = claim_now(SystemTime::now());
        let rows = q.retrying("job", |conn| conn.query(&q.sql.job, &[Value::Int(id)]))?;
        let mut jobs: Vec<Job> = rows.into_iter().map(|r| job_row(&q, r, now)).collect();
        probe(&q, &mut jobs)?;
        if let Some(job) = jobs.last_mut().filter(|_| q.spec.dependencies) {
            (job.waits_on, job.dependents, job.signal_wait) = q.retrying("job", |conn| {
                let parents = crate::runtime::deps::parents_of(&q.spec, &q.sql, conn, id)?;
                let children = crate::runtime::deps::dependents_of(&q.spec, &q.sql, conn, id)?;
                let signal = crate::runtime::signals::signal_of(&q.spec, &q.sql, conn, id)?;
                Ok((parents, children, signal))
            })?;
        }
        Ok(jobs.pop())
    }

    /// A page of the jobs of `table` in `state`: those with an id above `after` (`None`: from
    /// the first), at most `limit`, lowest id first (keyset paging: pass the last id of a page
    /// as `after` to read the next; a page shorter than `limit` is the last). Each is as
    /// [`Broker::job`] would read it.
    ///
    /// Row lock and advisory forms: a row in work leaves no mark in the row, so
    /// [`Ready`](JobState::Ready) and [`InFlight`](JobState::InFlight) page the same rows (due
    /// and live), each probed for its [`state`](Job::state): filter on it. A table that does
    /// not keep completed rows has no [`Completed`](JobState::Completed) page (empty).
    ///
    /// ```
    /// use sqlbroker::{Broker, JobState, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// for i in 0..5u8 {
    ///     broker.publish(&jobs, Message::new(vec![i]))?;
    /// }
    /// let (mut after, mut seen) = (None, 0);
    /// loop {
    ///     let page = broker.jobs(&jobs, JobState::Ready, after, 2)?;
    ///     seen += page.len();
    ///     match page.last() {
    ///         Some(last) if page.len() == 2 => after = Some(last.id()),
    ///         _ => break,
    ///     }
    /// }
    /// assert_eq!(seen, 5);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn jobs(
        &self,
        table: &Table,
        state: JobState,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Job>> {
        let q = self.queue(table)?;
        checked(&q)?;
        let Some(Some((sql, nows))) = q.sql.jobs_page.get(state.index()) else {
            return Ok(Vec::new());
        };
        let now = claim_now(SystemTime::now());
        let mut params = vec![Value::Time(now); *nows];
        params.push(Value::Int(after.unwrap_or(i64::MIN)));
        params.push(Value::Int(limit.min(i64::MAX as usize) as i64));
        let rows = q.retrying("jobs", |conn| conn.query(sql, &params))?;
        let mut jobs: Vec<Job> = rows.into_iter().map(|r| job_row(&q, r, now)).collect();
        probe(&q, &mut jobs)?;
        Ok(jobs)
    }

    /// A page of jobs as [`Broker::jobs`] lists them, for a listing that shows a little of
    /// each: every payload cut by the database to its first `payload_prefix` bytes
    /// ([`Job::payload_len`] has its full length), so a page of large payloads costs a few
    /// bytes each; and no probe.
    ///
    /// Without a probe, the row lock and advisory forms cannot tell a due row in work from
    /// one ready (their work leaves no mark in the row): every due, live row comes back
    /// [`Ready`](JobState::Ready), which there means "due: ready or in work", and
    /// [`InFlight`](JobState::InFlight) pages the same rows, also as `Ready`. The probe
    /// [`Broker::jobs`] makes is left out on purpose: it takes each due row's lock
    /// (`FOR UPDATE SKIP LOCKED`) or key, which the claimers want, for as long as the page
    /// takes; [`Broker::job`] probes one row. The lease form sees its rows in work as it
    /// does in [`Broker::jobs`].
    ///
    /// # Errors
    ///
    /// As [`Broker::jobs`].
    ///
    /// ```
    /// use sqlbroker::{Broker, JobState, Message, Table};
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(std::time::Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// broker.publish(&jobs, Message::new(vec![b'x'; 1_000_000]))?;
    ///
    /// let page = broker.jobs_preview(&jobs, JobState::Ready, None, 50, 60)?;
    /// assert_eq!(page[0].payload(), &[b'x'; 60][..]);
    /// assert_eq!(page[0].payload_len(), 1_000_000);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn jobs_preview(
        &self,
        table: &Table,
        state: JobState,
        after: Option<i64>,
        limit: usize,
        payload_prefix: usize,
    ) -> Result<Vec<Job>> {
        let q = self.queue(table)?;
        checked(&q)?;
        let Some(Some((sql, nows))) = q.sql.jobs_preview.get(state.index()) else {
            return Ok(Vec::new());
        };
        let page = Page {
            after,
            limit,
            payload_prefix,
        };
        preview_rows(&q, sql, *nows, Vec::new(), page)
    }

    /// Cancels the job `id`: `true` when it will not run again, `false` if no live or dead
    /// job has that id (unknown, acked, completed: nothing is changed).
    ///
    /// A job that is not in work (ready, scheduled, or dead) is deleted, or, on a table that
    /// keeps completed rows ([`Table::keep_completed`]), kept as completed and cancelled
    /// (`completed_at` and `dead_at` now, `dead_reason` `"cancelled"`). A job in work finishes
    /// its current attempt: an ack completes it as usual; any other end (a retry, a failure,
    /// a handler timeout, a dropped delivery, a dead letter) is its last. Per form:
    ///
    /// - **lease**: the request is written on the row (`cancel_requested`) and the retry
    ///   statement of that delivery finishes the row as cancelled instead (a dead letter with
    ///   reason `"cancelled"`, or completed and cancelled where completed rows are kept). The
    ///   handler can ask [`Delivery::cancel_requested`](crate::Delivery::cancel_requested).
    ///   A row claimed ahead into a subscription's buffer counts as in work: if that
    ///   subscription hands it back unhandled (closed, shut down), the hand-back ends it as
    ///   cancelled; if the process dies holding it, the claim that takes it once its lease
    ///   expires ends it as cancelled instead of running it. Either way no handler starts it
    ///   again.
    /// - **row lock**: its row is locked by the delivery's transaction, so no one can write it
    ///   meanwhile: cancel waits for that delivery to settle (at most the broker's
    ///   [`statement_timeout`](crate::BrokerBuilder::statement_timeout), then a transient
    ///   [`BrokerError::Database`] and nothing changed), then removes the row if it is still
    ///   there. The handler sees nothing.
    /// - **advisory lock**: the request is written on the row (the handler can ask, its
    ///   retry and a hand-back end the row as in the lease form, and a claim that finds the
    ///   request ends the row instead of running it); then, if the row's key is free, the row
    ///   is removed under it at once. If the key is held (the row in work, claimed ahead, or
    ///   another row of that key in work), cancel returns `true` without waiting and the
    ///   request ends the row as above.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Schema`] if the table does not exist or lacks a column of its
    /// description ([`Broker::migrate`]).
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// let id = broker.publish(&jobs, Message::new(b"never mind".to_vec()))?;
    /// assert!(broker.cancel(&jobs, id)?);
    /// assert!(broker.job(&jobs, id)?.is_none());
    /// assert!(!broker.cancel(&jobs, id)?); // gone already
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn cancel(&self, table: &Table, id: i64) -> Result<bool> {
        let q = self.queue(table)?;
        checked(&q)?;
        Ok(match cancel_one(&q, id, Wait::ForTheRow)? {
            Cancelled::Now | Cancelled::Already => true,
            Cancelled::Gone | Cancelled::Busy => false,
        })
    }
}

/// What cancelling one job came to: what a cancel that counts the rows it changed needs to
/// tell apart ([`Broker::cancel_matching`](crate::Broker::cancel_matching)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cancelled {
    /// This call changed the row: removed it (or kept it completed and cancelled), or, in
    /// work, wrote its cancel request.
    Now,
    /// Its cancel was requested already (lease and advisory forms, the row in work): left as
    /// it is, holding anyway.
    Already,
    /// No live or dead job had that id (unknown, acked, completed): nothing changed.
    Gone,
    /// Row lock form, [`Wait::AtMost`]: the row stayed locked by the delivery that holds it
    /// for the whole wait; nothing changed.
    Busy,
}

/// How a row lock cancel waits for the delivery that holds the row.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    /// Until it settles ([`Broker::cancel`]: at most the statement timeout, then an error);
    /// the lease and advisory forms mark a row whether or not it was marked before.
    ForTheRow,
    /// At most this long (a bulk cancel: one job in work must not stop the others), tried
    /// without waiting on the server (`SKIP LOCKED`) until then; then [`Cancelled::Busy`].
    /// The lease and advisory forms mark only a row not marked yet
    /// ([`Cancelled::Already`]).
    AtMost(std::time::Duration),
}

/// Cancels the job `id` of `q`'s table as [`Broker::cancel`] describes, waiting as `wait`
/// says, and tells what that came to.
pub(crate) fn cancel_one(q: &Queue, id: i64, wait: Wait) -> Result<Cancelled> {
    let first = matches!(wait, Wait::AtMost(_));
    match q.spec.form {
        Form::Lease => cancel_lease(q, id, first),
        Form::RowLock => match wait {
            Wait::ForTheRow => cancel_row_lock(q, id),
            Wait::AtMost(limit) => cancel_row_lock_within(q, id, limit),
        },
        Form::AdvisoryLock => cancel_advisory(q, id, first),
    }
}

/// Runs `sql` (`cancel_remove` or `delete_free`, `params`) for row `id` on `conn`: on a table with dependencies, in a
/// transaction with what the cancel does for the jobs waiting on the row.
///
/// Modelled in model/advisory.pml (cancel_remove_dead), model/lease.pml (cancel_remove).
fn remove(
    q: &Queue,
    conn: &mut dyn DbConn,
    sql: &str,
    params: &[Value],
    id: i64,
) -> Result<u64, DbError> {
    crate::runtime::deps::cancel_in_transaction(q, conn, sql, params, id)
}

/// Lease: removes the row if it is not leased, else marks it; between the two a lease may
/// begin or end, so the pair runs again (a few times at most: each round sees a state change).
/// With `first`, only a row not marked yet is marked: a leased row marked before is
/// [`Cancelled::Already`].
///
/// Modelled in model/lease.pml (cancel).
fn cancel_lease(q: &Queue, id: i64, first: bool) -> Result<Cancelled> {
    let mark = match first {
        true => &q.sql.cancel_mark_first,
        false => &q.sql.cancel_mark,
    };
    for _ in 0..8 {
        let now = claim_now(SystemTime::now());
        let params = [Value::Int(id), Value::Time(now)];
        if q.retrying("cancel", |c| {
            remove(q, c, &q.sql.cancel_remove, &params, id)
        })? > 0
        {
            return Ok(Cancelled::Now);
        }
        if q.retrying("cancel", |c| c.execute(mark, &params))? > 0 {
            return Ok(Cancelled::Now);
        }
        let rows = q.retrying("cancel", |c| c.query(&q.sql.job, &[Value::Int(id)]))?;
        match rows.into_iter().next().map(|r| job_row(q, r, now)) {
            None => return Ok(Cancelled::Gone),
            Some(j) if j.state == JobState::Completed => return Ok(Cancelled::Gone),
            // Leased and marked: the mark of `first` left it, the request holds.
            Some(j) if j.cancel_requested && j.state == JobState::InFlight => {
                return Ok(Cancelled::Already)
            }
            Some(_) => {}
        }
    }
    Err(q.err("cancel")(DbError::new(
        DbErrorKind::Transient,
        "the job kept changing between being leased and not: try again",
    )))
}

/// Row lock: waits for the row's lock (its delivery settles), then removes it.
///
/// Modelled in model/row_lock.pml (cancel).
fn cancel_row_lock(q: &Queue, id: i64) -> Result<Cancelled> {
    let mut conn = q.conn("cancel")?;
    conn.mark_broken();
    let run = |conn: &mut dyn DbConn| -> Result<u64, DbError> {
        for stmt in &q.sql.begin {
            conn.batch(stmt)?;
        }
        if conn
            .query(&q.sql.cancel_lock, &[Value::Int(id)])?
            .is_empty()
        {
            return Ok(0);
        }
        remove_cancelled(q, conn, id)
    };
    match run(&mut *conn) {
        Ok(n) => {
            conn.batch("COMMIT").map_err(q.err("cancel"))?;
            conn.set_broken(false);
            Ok(if n > 0 {
                Cancelled::Now
            } else {
                Cancelled::Gone
            })
        }
        Err(e) => {
            conn.rollback_or_discard();
            Err(q.err("cancel")(e))
        }
    }
}

/// Row lock, waiting at most `limit` for the delivery that holds the row: the row is taken
/// `FOR UPDATE SKIP LOCKED` (no wait on the server), and while another session holds it the
/// take is tried again, a little later each time, until `limit` is spent; then
/// [`Cancelled::Busy`], nothing changed. A row taken is removed as
/// [`cancel_row_lock`] removes it, in the same transaction.
/// Removes (or completes as cancelled) row `id`, locked by the caller's transaction on
/// `conn`, and settles the jobs waiting on it as a cancel does: the rows changed.
fn remove_cancelled(q: &Queue, conn: &mut dyn DbConn, id: i64) -> Result<u64, DbError> {
    remove_locked(q, conn, &q.sql.cancel_remove, id)
}

/// Runs `sql` (`cancel_remove` or `delete_free`) on row `id`, locked by the caller's
/// transaction on `conn`, settling the jobs waiting on it as a cancel does.
fn remove_locked(q: &Queue, conn: &mut dyn DbConn, sql: &str, id: i64) -> Result<u64, DbError> {
    let params = [Value::Int(id)];
    crate::runtime::deps::cancel_removal(q, conn, sql, &params, id)
}

fn cancel_row_lock_within(q: &Queue, id: i64, limit: std::time::Duration) -> Result<Cancelled> {
    row_lock_within(q, id, limit, &q.sql.cancel_remove)
}

/// [`cancel_row_lock_within`] with the removal `sql` (`cancel_remove` or `delete_free`).
fn row_lock_within(q: &Queue, id: i64, limit: std::time::Duration, sql: &str) -> Result<Cancelled> {
    let deadline = std::time::Instant::now() + limit;
    let mut pause = std::time::Duration::from_millis(20);
    loop {
        let mut conn = q.conn("cancel")?;
        // Broken from `BEGIN` until the transaction ends: never pooled mid-transaction.
        conn.mark_broken();
        let run = |conn: &mut dyn DbConn| -> Result<Option<u64>, DbError> {
            for stmt in &q.sql.begin {
                conn.batch(stmt)?;
            }
            if conn.query(&q.sql.probe_lock, &[Value::Int(id)])?.is_empty() {
                return Ok(None);
            }
            remove_locked(q, conn, sql, id).map(Some)
        };
        match run(&mut *conn) {
            Ok(Some(n)) => {
                conn.batch("COMMIT").map_err(q.err("cancel"))?;
                conn.set_broken(false);
                return Ok(if n > 0 {
                    Cancelled::Now
                } else {
                    Cancelled::Gone
                });
            }
            Ok(None) => conn.rollback_or_discard(),
            Err(e) => {
                conn.rollback_or_discard();
                return Err(q.err("cancel")(e));
            }
        }
        drop(conn);
        // Not taken: held by a delivery, or gone.
        let rows = q.retrying("cancel", |c| c.query(&q.sql.job, &[Value::Int(id)]))?;
        if rows.is_empty() {
            return Ok(Cancelled::Gone);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(Cancelled::Busy);
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(std::time::Duration::from_millis(250));
    }
}

/// Advisory: marks the row, then removes it under its key if the key is free; if the key is
/// held (the row in work, or another row of that key), the mark stands and ends the row at
/// its next claim, retry or hand-back, as in the lease form: nothing waits for a delivery.
/// With `first`, only a row not marked yet is marked: a live row marked before is
/// [`Cancelled::Already`], unless its removal under the key is done now.
///
/// Modelled in model/advisory.pml (cancel).
fn cancel_advisory(q: &Queue, id: i64, first: bool) -> Result<Cancelled> {
    let now = claim_now(SystemTime::now());
    let rows = q.retrying("cancel", |c| c.query(&q.sql.job, &[Value::Int(id)]))?;
    let Some(job) = rows.into_iter().next().map(|r| job_row(q, r, now)) else {
        return Ok(Cancelled::Gone);
    };
    if job.state == JobState::Completed {
        return Ok(Cancelled::Gone);
    }
    let Some(template) = &q.spec.key else {
        return Ok(Cancelled::Gone);
    };
    let values: Vec<Value> = job.values.iter().map(|(_, v)| v.clone()).collect();
    let key = template.render(&values);
    let params = [Value::Int(id)];
    let mark = match first {
        true => &q.sql.cancel_mark_first,
        false => &q.sql.cancel_mark,
    };
    // What the mark did: `Now` if it wrote the request, `Already` if it was there.
    let marked = if q.retrying("cancel", |c| c.execute(mark, &params))? > 0 {
        Cancelled::Now
    } else {
        // Not live, or (`first`) marked before: read again to tell.
        let rows = q.retrying("cancel", |c| c.query(&q.sql.job, &params))?;
        match rows.into_iter().next().map(|r| job_row(q, r, now)) {
            Some(j) if first && j.finished_at.is_none() && j.cancel_requested => Cancelled::Already,
            _ => {
                // Not live: dead (never claimed, so no key is needed to remove it), or
                // acked or completed since it was read (nothing removed).
                let removed = q.retrying("cancel", |c| {
                    remove(q, c, &q.sql.cancel_remove, &params, id)
                })?;
                return Ok(if removed > 0 {
                    Cancelled::Now
                } else {
                    Cancelled::Gone
                });
            }
        }
    };
    let removed = with_key(q, &key, |conn| {
        if remove(q, conn, &q.sql.cancel_remove, &params, id)? > 0 {
            return Ok(true);
        }
        // Not removed: gone (acked), or completed: by an ack, or cancelled by its retry.
        let row = conn.query(&q.sql.job, &params)?.into_iter().next();
        Ok(row.is_some_and(|r| {
            let j = job_row(q, r, now);
            j.dead_reason.as_deref() == Some(CANCELLED)
        }))
    })?;
    Ok(match removed {
        // Marked before this call: that request decided the row's end, which the removal
        // under the key (or the row's own retry) only carries out.
        Some(true) if matches!(marked, Cancelled::Already) => Cancelled::Already,
        Some(true) => Cancelled::Now,
        // Acked before the removal: the cancel did not hold.
        Some(false) => Cancelled::Gone,
        // Key held: the mark ends the row before any handler starts it again.
        None => marked,
    })
}

/// What deleting one job came to ([`Broker::delete_matching`](crate::Broker::delete_matching)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deleted {
    /// This call deleted the row.
    Now,
    /// The row is in work (lease: leased; row lock: its row held for all of the wait;
    /// advisory: its key held, by this row or another of that key): left as it is.
    InWork,
    /// No row had that id any more: nothing changed.
    Gone,
}

/// Deletes `job` of `q`'s table (read by a page of a bulk delete) unless it is in work: the
/// lease form deletes it only while no lease holds it, the row lock form takes its row
/// without waiting on the server for at most `limit`, the advisory form deletes a live row
/// only under its key, taken without waiting. On a table with dependencies the jobs waiting
/// on it are told as a cancel tells them (a dead letter's own outcome is kept).
pub(crate) fn delete_one(q: &Queue, job: &Job, limit: std::time::Duration) -> Result<Deleted> {
    let id = job.id;
    let del = &q.sql.delete_free;
    match q.spec.form {
        Form::Lease => {
            for _ in 0..8 {
                let now = claim_now(SystemTime::now());
                let params = [Value::Int(id), Value::Time(now)];
                if q.retrying("delete", |c| remove(q, c, del, &params, id))? > 0 {
                    return Ok(Deleted::Now);
                }
                let rows = q.retrying("delete", |c| c.query(&q.sql.job, &[Value::Int(id)]))?;
                match rows.into_iter().next().map(|r| job_row(q, r, now)) {
                    None => return Ok(Deleted::Gone),
                    Some(j) if j.state == JobState::InFlight => return Ok(Deleted::InWork),
                    // Its lease ended between the two: again.
                    Some(_) => {}
                }
            }
            Err(q.err("delete")(DbError::new(
                DbErrorKind::Transient,
                "the job kept changing between being leased and not: try again",
            )))
        }
        Form::RowLock => Ok(match row_lock_within(q, id, limit, del)? {
            Cancelled::Now => Deleted::Now,
            Cancelled::Busy => Deleted::InWork,
            Cancelled::Gone | Cancelled::Already => Deleted::Gone,
        }),
        Form::AdvisoryLock => {
            let params = [Value::Int(id)];
            let gone = |n: u64| if n > 0 { Deleted::Now } else { Deleted::Gone };
            let template = q.spec.key.as_ref().filter(|_| job.finished_at.is_none());
            let Some(template) = template else {
                // Dead or completed: no claim takes it, no key is needed.
                return Ok(gone(
                    q.retrying("delete", |c| remove(q, c, del, &params, id))?,
                ));
            };
            let values: Vec<Value> = job.values.iter().map(|(_, v)| v.clone()).collect();
            let key = template.render(&values);
            Ok(
                match with_key(q, &key, |conn| remove(q, conn, del, &params, id))? {
                    Some(n) => gone(n),
                    None => Deleted::InWork,
                },
            )
        }
    }
}
