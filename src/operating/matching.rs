//! The operator's filtered listings and the call that runs a scheduled job now: what an
//! action on every job matching a filter pages through (the dashboard's "cancel all
//! matching"), one bounded page at a time.

use std::time::{Duration, Instant, SystemTime};

use crate::broker::Broker;
use crate::dialect::shared::PageFilter;
use crate::dialect::DbConn;
use crate::error::{BrokerError, DbError, Result};
use crate::model::schedule::claim_now;
use crate::model::table::{ColumnType, Form, Table};
use crate::model::value::Value;
use crate::operating::jobs::{
    cancel_one, checked, preview_rows, Cancelled, Job, JobState, Page, Wait,
};
use crate::runtime::deps::waiting_due;
use crate::runtime::Queue;

/// The longest error text a [`JobFilter`] searches for, in bytes.
pub const MAX_FILTER_TEXT: usize = 1_000;

/// Which jobs of a state a filtered listing ([`Broker::jobs_matching`]) returns: those whose
/// user columns hold the values given and whose last error holds the text given, all of them
/// (an empty filter matches every job).
///
/// ```
/// use sqlbroker::{JobFilter, Value};
///
/// let filter = JobFilter::new()
///     .column("customer", "acme")
///     .error_contains("timed out");
/// assert!(!filter.is_empty());
/// assert_eq!(filter.columns(), &[("customer".to_string(), Value::Text("acme".into()))]);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobFilter {
    columns: Vec<(String, Value)>,
    error: Option<String>,
    queue: Option<String>,
    kind: Option<String>,
}

impl JobFilter {
    /// A filter that matches every job.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only jobs whose column `name` (a user column of the table's description) equals
    /// `value`, of the column's type (an integer is taken for a float column; `NULL` is
    /// refused: it equals nothing). Text compares byte for byte, as the columns do.
    #[must_use]
    pub fn column(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.columns.push((name.to_string(), value.into()));
        self
    }

    /// Only jobs whose last error holds `text`, byte for byte (case counts), at most
    /// [`MAX_FILTER_TEXT`] bytes. Jobs that never failed have no last error and never match.
    #[must_use]
    pub fn error_contains(mut self, text: &str) -> Self {
        self.error = Some(text.to_string());
        self
    }

    /// Only jobs of the queue `name` of a table with queues ([`Table::queues`]; a row whose
    /// adopted queue column is `NULL` is in the [`DEFAULT_QUEUE`](crate::DEFAULT_QUEUE)), by
    /// the queue's role whatever its column is called. A table without queues is refused.
    #[must_use]
    pub fn in_queue(mut self, name: &str) -> Self {
        self.queue = Some(name.to_string());
        self
    }

    /// Only jobs of kind `name` of a table with kinds ([`Table::kinds`]); a job published
    /// without a kind matches no kind. A table without kinds is refused.
    #[must_use]
    pub fn of_kind(mut self, name: &str) -> Self {
        self.kind = Some(name.to_string());
        self
    }

    /// The column conditions, in the order given.
    pub fn columns(&self) -> &[(String, Value)] {
        &self.columns
    }

    /// The error text asked for.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// The queue asked for ([`in_queue`](JobFilter::in_queue)).
    pub fn queue(&self) -> Option<&str> {
        self.queue.as_deref()
    }

    /// The kind asked for ([`of_kind`](JobFilter::of_kind)).
    pub fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }

    /// True if the filter matches every job.
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
            && self.error.is_none()
            && self.queue.is_none()
            && self.kind.is_none()
    }
}

fn refused(reason: String) -> BrokerError {
    BrokerError::InvalidOption {
        option: "JobFilter",
        reason,
    }
}

/// True if `value` may be compared with a column of type `ty`.
fn fits(ty: ColumnType, value: &Value) -> bool {
    matches!(
        (ty, value),
        (ColumnType::Text, Value::Text(_))
            | (ColumnType::Int, Value::Int(_))
            | (ColumnType::Float, Value::Float(_) | Value::Int(_))
            | (ColumnType::Bytes, Value::Bytes(_))
            | (ColumnType::Time, Value::Time(_))
    )
}

/// `filter`'s conditions on `q`'s table and the values they compare with, in order; or why
/// the filter does not fit the table ([`BrokerError::InvalidOption`]), nothing read.
fn conditions<'q>(q: &'q Queue, filter: &JobFilter) -> Result<(Vec<PageFilter<'q>>, Vec<Value>)> {
    let mut conds = Vec::new();
    let mut values = Vec::new();
    for (name, value) in &filter.columns {
        let Some(column) = q.spec.column_index(name).map(|i| &q.spec.columns[i]) else {
            return Err(refused(format!(
                "table {} has no column {name:?} in its description",
                q.spec.name
            )));
        };
        if !fits(column.ty, value) {
            return Err(refused(format!(
                "column {name:?} is {:?}: {value:?} is not a value of that type",
                column.ty
            )));
        }
        match value {
            Value::Int(n) if column.ty == ColumnType::Float => {
                values.push(Value::Float(*n as f64));
            }
            v => values.push(v.clone()),
        }
        conds.push(PageFilter::Equals(&column.name));
    }
    for (role, wanted, column) in [
        ("queue", &filter.queue, q.spec.queue),
        ("kind", &filter.kind, q.spec.kind),
    ] {
        let Some(name) = wanted else { continue };
        let Some(column) = column.and_then(|i| q.spec.columns.get(i)) else {
            return Err(refused(format!(
                "table {} has no {role}s in its description",
                q.spec.name
            )));
        };
        crate::model::table::check_name(role, name).map_err(refused)?;
        values.push(Value::Text(name.clone()));
        conds.push(if role == "queue" {
            PageFilter::Queue(&column.name)
        } else {
            PageFilter::Equals(&column.name)
        });
    }
    if let Some(text) = &filter.error {
        if text.len() > MAX_FILTER_TEXT {
            return Err(refused(format!(
                "the error text is {} bytes, more than {MAX_FILTER_TEXT}",
                text.len()
            )));
        }
        conds.push(PageFilter::ErrorContains);
        values.push(Value::Text(text.clone()));
    }
    Ok((conds, values))
}

/// How one pass of [`Broker::cancel_matching`] runs: where it starts, the most jobs it acts
/// on, how long it waits for one job's row, and how long it runs. Each bound is what keeps a
/// pass answerable (a dashboard's request): the operator runs the next pass from where this
/// one stopped ([`CancelReport::last`]).
///
/// ```
/// use sqlbroker::CancelPass;
/// use std::time::Duration;
///
/// let pass = CancelPass::new()
///     .after(Some(1_000))
///     .limit(500)
///     .row_wait(Duration::from_secs(1))
///     .time(Duration::from_secs(5));
/// assert_eq!(pass.limit_jobs(), 500);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelPass {
    after: Option<i64>,
    limit: usize,
    row_wait: Duration,
    time: Duration,
}

impl Default for CancelPass {
    fn default() -> Self {
        CancelPass::new()
    }
}

impl CancelPass {
    /// From the first matching job, at most 1,000 jobs, 2 s for one row, 10 s in all.
    pub fn new() -> Self {
        CancelPass {
            after: None,
            limit: 1_000,
            row_wait: Duration::from_secs(2),
            time: Duration::from_secs(10),
        }
    }

    /// Only jobs with an id above `after` (`None`: from the first): the last pass's
    /// [`CancelReport::last`] goes on where it stopped.
    #[must_use]
    pub fn after(mut self, after: Option<i64>) -> Self {
        self.after = after;
        self
    }

    /// The most jobs the pass acts on.
    #[must_use]
    pub fn limit(mut self, jobs: usize) -> Self {
        self.limit = jobs;
        self
    }

    /// Row lock form: how long the pass waits for the delivery that holds one job's row (the
    /// job in work) before it leaves that job as busy ([`CancelReport::busy`]) and goes on.
    /// The other forms never wait for a delivery.
    #[must_use]
    pub fn row_wait(mut self, wait: Duration) -> Self {
        self.row_wait = wait;
        self
    }

    /// How long the pass runs: it starts no job after this, and the job under way waits at
    /// most what is left of it.
    #[must_use]
    pub fn time(mut self, time: Duration) -> Self {
        self.time = time;
        self
    }

    /// The most jobs the pass acts on ([`CancelPass::limit`]).
    pub fn limit_jobs(&self) -> usize {
        self.limit
    }
}

/// What one pass of [`Broker::cancel_matching`] did, counting only what it changed.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct CancelReport {
    /// Jobs the pass looked at: matching, and (lease and advisory forms) not asked to cancel
    /// when read.
    pub seen: u64,
    /// Jobs this pass changed: removed (or kept completed and cancelled), or, in work, asked
    /// to cancel now (they end at their next retry, hand-back or claim).
    pub cancelled: u64,
    /// Jobs whose cancel another call had asked for between the pass's read and its cancel:
    /// left as they were, and not counted as cancelled.
    pub already: u64,
    /// Jobs acked, completed or deleted between the pass's read and its cancel: nothing
    /// changed.
    pub gone: u64,
    /// Row lock form: jobs in work whose row the delivery held for all of
    /// [`CancelPass::row_wait`]: not cancelled (cancel each on its own, or run a pass again
    /// once they are done), by id.
    pub busy: Vec<i64>,
    /// The last id the pass looked at (or the `after` it started from): the next pass's
    /// [`CancelPass::after`].
    pub last: Option<i64>,
    /// The pass stopped on its limit or its time: more jobs may match after
    /// [`last`](CancelReport::last).
    pub more: bool,
    /// What ended the pass early (a database error): the counts are what it did before.
    pub error: Option<BrokerError>,
}

/// Jobs one page of a pass reads.
const CANCEL_PAGE: usize = 100;

impl Broker {
    /// Cancels the jobs of `table` in `state` that match `filter`, one pass of at most
    /// [`CancelPass`]'s bounds: each job by [`Broker::cancel`]'s rules for its form (a job in
    /// work finishes its attempt and is not retried), counting only what it changed
    /// ([`CancelReport`]). What the operator's "cancel every job matching" runs.
    ///
    /// It reads what is left to do: in the lease and advisory forms the jobs in work asked to
    /// cancel before are not read again (a second pass over 1,000 jobs in flight does not
    /// mark and count the same 1,000 again), and a pass goes on after the last id it acted
    /// on, a page of 100 at a time. In the row lock form a job in work holds its row until its
    /// delivery settles: the pass waits for it at most [`CancelPass::row_wait`] (tried without
    /// waiting on the server, `SKIP LOCKED`, until then), then leaves it in
    /// [`CancelReport::busy`] and goes on, so one job in work does not stop the others.
    ///
    /// # Errors
    ///
    /// Before anything is changed: [`BrokerError::InvalidOption`] for a filter that does not
    /// fit the table (as [`Broker::jobs_matching`]), the completed state (completed jobs
    /// are not cancelled), or a pass of no job or no time; [`BrokerError::Schema`] as [`Broker::jobs`]. A database error
    /// during the pass ends it: the report says what it did before, and the error
    /// ([`CancelReport::error`]).
    ///
    /// ```
    /// use sqlbroker::{Broker, CancelPass, JobFilter, JobState, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(Duration::from_secs(30)).text_column("customer");
    /// broker.create_table(&jobs)?;
    /// for who in ["acme", "globex", "acme"] {
    ///     broker.publish(&jobs, Message::new(b"x".to_vec()).set("customer", who))?;
    /// }
    /// let acme = JobFilter::new().column("customer", "acme");
    /// let done = broker.cancel_matching(&jobs, JobState::Ready, &acme, &CancelPass::new())?;
    /// assert_eq!((done.cancelled, done.seen, done.more), (2, 2, false));
    /// assert_eq!(broker.stats(&jobs)?.ready, 1);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn cancel_matching(
        &self,
        table: &Table,
        state: JobState,
        filter: &JobFilter,
        pass: &CancelPass,
    ) -> Result<CancelReport> {
        if state == JobState::Completed {
            return Err(refused(
                "completed jobs are not cancelled: they are done".into(),
            ));
        }
        if pass.limit == 0 || pass.time.is_zero() {
            return Err(refused(
                "a pass of cancel_matching acts on one job at least, in a time above zero".into(),
            ));
        }
        let q = self.queue(table)?;
        let (mut conds, values) = conditions(&q, filter)?;
        if q.spec.form != Form::RowLock {
            conds.push(PageFilter::NotCancelRequested);
        }
        checked(&q)?;
        let mut report = CancelReport {
            last: pass.after,
            ..CancelReport::default()
        };
        let syntax = q.dialect.syntax();
        let Some((sql, nows)) = syntax.preview_page(&q.spec, state.index(), &conds) else {
            return Ok(report);
        };
        let started = Instant::now();
        'pass: loop {
            let want = CANCEL_PAGE.min(pass.limit.saturating_sub(report.seen as usize));
            if want == 0 {
                report.more = true;
                break;
            }
            let page = Page {
                after: report.last,
                limit: want,
                payload_prefix: 0,
            };
            let jobs = match preview_rows(&q, &sql, nows, values.clone(), page) {
                Ok(jobs) => jobs,
                Err(e) => {
                    report.error = Some(e);
                    break;
                }
            };
            for job in &jobs {
                let left = pass.time.saturating_sub(started.elapsed());
                if left.is_zero() {
                    report.more = true;
                    break 'pass;
                }
                match cancel_one(&q, job.id(), Wait::AtMost(pass.row_wait.min(left))) {
                    Ok(Cancelled::Now) => report.cancelled += 1,
                    Ok(Cancelled::Already) => report.already += 1,
                    Ok(Cancelled::Gone) => report.gone += 1,
                    Ok(Cancelled::Busy) => report.busy.push(job.id()),
                    Err(e) => {
                        report.error = Some(e);
                        break 'pass;
                    }
                }
                report.seen += 1;
                report.last = Some(job.id());
            }
            if jobs.len() < want {
                break;
            }
        }
        Ok(report)
    }

    /// A page of the jobs of `table` in `state` that match `filter`, as
    /// [`Broker::jobs_preview`] lists them (each payload cut to its first `payload_prefix`
    /// bytes, no probe: in the row lock and advisory forms a due row in work reads as
    /// ready): those with an id above `after`, at most `limit`, lowest id first. Page with
    /// the last id of a page as `after`, as with [`Broker::jobs`].
    ///
    /// An action on "every job matching" pages through this, a bounded page at a time, and
    /// acts on each job by id ([`Broker::cancel`], [`Broker::requeue_dead`],
    /// [`Broker::purge_dead`], [`Broker::run_now`]), so each keeps the guarantees of its call
    /// (a cancel holds for a job in work or claimed ahead).
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidOption`] if the filter names a column the description does not
    /// have, gives a value of another type than the column's, or an error text longer than
    /// [`MAX_FILTER_TEXT`]: nothing is read. Otherwise as [`Broker::jobs`].
    ///
    /// ```
    /// use sqlbroker::{Broker, JobFilter, JobState, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs")
    ///     .lease(Duration::from_secs(30))
    ///     .text_column("customer");
    /// broker.create_table(&jobs)?;
    /// for who in ["acme", "globex", "acme"] {
    ///     broker.publish(&jobs, Message::new(b"x".to_vec()).set("customer", who))?;
    /// }
    /// let acme = JobFilter::new().column("customer", "acme");
    /// let page = broker.jobs_matching(&jobs, JobState::Ready, &acme, None, 100, 0)?;
    /// assert_eq!(page.len(), 2);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn jobs_matching(
        &self,
        table: &Table,
        state: JobState,
        filter: &JobFilter,
        after: Option<i64>,
        limit: usize,
        payload_prefix: usize,
    ) -> Result<Vec<Job>> {
        let q = self.queue(table)?;
        let (conds, values) = conditions(&q, filter)?;
        checked(&q)?;
        let syntax = q.dialect.syntax();
        let Some((sql, nows)) = syntax.preview_page(&q.spec, state.index(), &conds) else {
            return Ok(Vec::new());
        };
        let page = Page {
            after,
            limit,
            payload_prefix,
        };
        preview_rows(&q, &sql, nows, values, page)
    }

    /// Makes the job `id`, scheduled for later (published with a delay, or waiting out its
    /// retry backoff), due now: `true` if it was moved, `false` if it is not scheduled (ready,
    /// in work, dead, waiting on other jobs, gone). Its attempts and errors are kept. The
    /// operator's "retry now" of a retrying job.
    ///
    /// Never a job in work: in the lease form a leased row is left alone; in the row lock
    /// form the row is read `FOR UPDATE SKIP LOCKED` first, so one a delivery holds is passed
    /// by (`false`) without waiting.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Schema`] if the table does not exist or lacks a column of its
    /// description.
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// let later = Message::new(b"later".to_vec()).deliver_after(Duration::from_secs(3600));
    /// let id = broker.publish(&jobs, later)?;
    /// assert!(broker.run_now(&jobs, id)?);
    /// let sub = broker.subscription(&jobs).start()?;
    /// assert_eq!(sub.next_delivery_timeout(Duration::from_secs(5)).unwrap().id(), id);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn run_now(&self, table: &Table, id: i64) -> Result<bool> {
        let q = self.queue(table)?;
        checked(&q)?;
        let now = Value::Time(claim_now(SystemTime::now()));
        let mut params = vec![
            now.clone(),
            Value::Int(id),
            now.clone(),
            Value::Time(waiting_due()),
        ];
        if q.spec.form == Form::Lease {
            params.push(now);
        }
        if q.spec.form != Form::RowLock {
            let moved = q.retrying("run now", |c| c.execute(&q.sql.make_due, &params))?;
            return Ok(moved > 0);
        }
        let mut conn = q.conn("run now")?;
        let run = |conn: &mut dyn DbConn| -> std::result::Result<u64, DbError> {
            conn.batch(&q.sql.begin_write)?;
            if conn.query(&q.sql.probe_lock, &[Value::Int(id)])?.is_empty() {
                return Ok(0);
            }
            conn.execute(&q.sql.make_due, &params)
        };
        match run(&mut *conn).and_then(|n| conn.batch("COMMIT").map(|()| n)) {
            Ok(n) => Ok(n > 0),
            Err(e) => {
                conn.rollback_or_discard();
                Err(q.err("run now")(e))
            }
        }
    }
}
