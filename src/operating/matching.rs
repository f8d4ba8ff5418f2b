//! The operator's filtered listings, the call that runs a scheduled job now, and the bulk
//! verbs on every job matching a filter (count, cancel, requeue, delete), one bounded batch
//! by id at a time.

use std::time::{Duration, Instant, SystemTime};

use crate::broker::Broker;
use crate::dialect::shared::PageFilter;
use crate::dialect::DbConn;
use crate::error::{BrokerError, DbError, Result};
use crate::model::schedule::claim_now;
use crate::model::table::{ColumnType, Form, Table};
use crate::model::value::Value;
use crate::operating::jobs::{
    cancel_one, checked, delete_one, preview_rows, Cancelled, Deleted, Job, JobState, Page, Wait,
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
    state: Option<JobState>,
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

    /// Only jobs in `state`, for [`Broker::count_matching`] and the bulk verbs
    /// ([`Broker::cancel_matching`], [`Broker::requeue_matching`],
    /// [`Broker::delete_matching`]); without it they take every state they act on.
    /// [`Broker::jobs_matching`] takes its state as an argument: a filter's own must be the
    /// same. [`Waiting`](JobState::Waiting) jobs are read with the
    /// [`Scheduled`](JobState::Scheduled) ones, as [`Broker::jobs`] pages them.
    #[must_use]
    pub fn in_state(mut self, state: JobState) -> Self {
        self.state = Some(state);
        self
    }

    /// The state asked for ([`in_state`](JobFilter::in_state)).
    pub fn state(&self) -> Option<JobState> {
        self.state
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

    /// True if the filter matches every job (of its state, if it names one).
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

/// How one pass of a bulk verb ([`Broker::cancel_matching`], [`Broker::requeue_matching`],
/// [`Broker::delete_matching`]) runs: where it starts, the most jobs it acts on, the jobs one
/// batch reads, how long it waits for one job in work, how long it runs, who the action log
/// names, and what it is told after each batch. Each bound is what keeps a pass answerable
/// (a dashboard's request): the operator runs the next pass from where this one stopped
/// ([`BulkOutcome::last`]).
///
/// ```
/// use sqlbroker::BulkPass;
/// use std::time::Duration;
///
/// let pass = BulkPass::new()
///     .after(Some(1_000))
///     .limit(500)
///     .row_wait(Duration::from_secs(1))
///     .time(Duration::from_secs(5))
///     .by("ops@10.0.0.7")
///     .on_batch(|so_far| eprintln!("{} changed, up to id {:?}", so_far.changed(), so_far.last()));
/// assert_eq!(pass.limit_jobs(), 500);
/// ```
#[derive(Clone)]
pub struct BulkPass {
    after: Option<i64>,
    limit: usize,
    batch: usize,
    row_wait: Duration,
    time: Duration,
    by: String,
    on_batch: Option<OnBatch>,
}

/// What a pass tells after each batch ([`BulkPass::on_batch`]).
type OnBatch = std::sync::Arc<dyn Fn(&BulkOutcome) + Send + Sync>;

/// The options of a pass of [`Broker::cancel_matching`], before the pass took every bulk
/// verb: now [`BulkPass`].
#[deprecated(
    since = "0.0.0-unreleased",
    note = "renamed BulkPass: it runs every bulk verb"
)]
pub type CancelPass = BulkPass;

impl std::fmt::Debug for BulkPass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BulkPass")
            .field("after", &self.after)
            .field("limit", &self.limit)
            .field("batch", &self.batch)
            .field("row_wait", &self.row_wait)
            .field("time", &self.time)
            .field("by", &self.by)
            .field("on_batch", &self.on_batch.is_some())
            .finish()
    }
}

impl Default for BulkPass {
    fn default() -> Self {
        BulkPass::new()
    }
}

/// The most jobs one batch of a pass reads ([`BulkPass::batch`]).
pub const MAX_BULK_BATCH: usize = 1_000;

impl BulkPass {
    /// From the first matching job, at most 1,000 jobs in batches of 100, 2 s for one job in
    /// work, 10 s in all, recorded as by `"sqlbroker"`.
    pub fn new() -> Self {
        BulkPass {
            after: None,
            limit: 1_000,
            batch: 100,
            row_wait: Duration::from_secs(2),
            time: Duration::from_secs(10),
            by: "sqlbroker".into(),
            on_batch: None,
        }
    }

    /// Only jobs with an id above `after` (`None`: from the first): the last pass's
    /// [`BulkOutcome::last`] goes on where it stopped.
    #[must_use]
    pub fn after(mut self, after: Option<i64>) -> Self {
        self.after = after;
        self
    }

    /// The most jobs the pass acts on (`usize::MAX`: no bound but [`time`](BulkPass::time)).
    #[must_use]
    pub fn limit(mut self, jobs: usize) -> Self {
        self.limit = jobs;
        self
    }

    /// The jobs one batch reads (one statement, by id), at most [`MAX_BULK_BATCH`]; each is
    /// then acted on by id, and [`on_batch`](BulkPass::on_batch) told.
    #[must_use]
    pub fn batch(mut self, jobs: usize) -> Self {
        self.batch = jobs;
        self
    }

    /// How long the pass waits for one job in work before it skips it
    /// ([`SkipReason::InWork`]) and goes on. Only the row lock form waits (the delivery holds
    /// the row; tried without waiting on the server, `SKIP LOCKED`, until then): the lease
    /// and advisory forms never wait for a delivery.
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

    /// Who the action log names for the pass ([`Broker::record_action`]).
    #[must_use]
    pub fn by(mut self, who: &str) -> Self {
        self.by = who.to_string();
        self
    }

    /// Called after each batch with what the pass did so far (a tool's progress).
    #[must_use]
    pub fn on_batch(mut self, f: impl Fn(&BulkOutcome) + Send + Sync + 'static) -> Self {
        self.on_batch = Some(std::sync::Arc::new(f));
        self
    }

    /// The most jobs the pass acts on ([`BulkPass::limit`]).
    pub fn limit_jobs(&self) -> usize {
        self.limit
    }
}

/// Why a pass of a bulk verb left a matching job as it was ([`BulkOutcome::skipped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SkipReason {
    /// In work: row lock form, its delivery held the row for all of
    /// [`BulkPass::row_wait`]; for a delete, also a leased row (lease form) or a live row
    /// whose key is held (advisory form: by this row, or another row of its key). Act on it
    /// on its own, or run a pass again once it is done.
    InWork,
    /// A cancel: its cancel had been asked for by another call between the pass's read and
    /// its cancel; the request holds.
    AlreadyCancelling,
    /// Acked, completed, deleted or (a requeue) requeued by another call between the pass's
    /// read and its act: nothing changed.
    Finished,
    /// It was no longer in a state the verb acts on (a requeue: a scheduled job that became
    /// due or was claimed meanwhile).
    Moved,
    /// A requeue on a table with dependencies: it waits on a job still dead-lettered or
    /// cancelled, so requeued it would end again at once ([`Broker::requeue_dead`]).
    WaitsOnFailed,
}

impl SkipReason {
    /// A short lowercase name (`in work`, `already cancelling`, `finished`, `moved`,
    /// `waits on a failed job`).
    pub fn name(self) -> &'static str {
        match self {
            SkipReason::InWork => "in work",
            SkipReason::AlreadyCancelling => "already cancelling",
            SkipReason::Finished => "finished",
            SkipReason::Moved => "moved",
            SkipReason::WaitsOnFailed => "waits on a failed job",
        }
    }
}

/// What one pass of a bulk verb ([`Broker::cancel_matching`], [`Broker::requeue_matching`],
/// [`Broker::delete_matching`]) did, counting only what it changed.
#[derive(Debug, Clone, Default)]
pub struct BulkOutcome {
    seen: u64,
    changed: u64,
    skipped: Vec<(i64, SkipReason)>,
    last: Option<i64>,
    more: bool,
    error: Option<std::sync::Arc<BrokerError>>,
}

impl BulkOutcome {
    /// Jobs the pass changed: a cancel, removed (or kept completed and cancelled) or, in
    /// work in the lease and advisory forms, asked to cancel (they end at their next retry,
    /// hand-back or claim); a requeue, put back in the queue (a dead letter: due now,
    /// attempts reset; a scheduled job: due now); a delete, deleted.
    pub fn changed(&self) -> u64 {
        self.changed
    }

    /// Jobs the pass looked at: those it changed and those it skipped.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The jobs left as they were, by id, each with why, in id order.
    pub fn skipped(&self) -> &[(i64, SkipReason)] {
        &self.skipped
    }

    /// The last id the pass looked at (or the `after` it started from): the next pass's
    /// [`BulkPass::after`].
    pub fn last(&self) -> Option<i64> {
        self.last
    }

    /// The pass stopped on its limit or its time: more jobs may match after
    /// [`last`](BulkOutcome::last).
    pub fn more(&self) -> bool {
        self.more
    }

    /// What ended the pass early (a database error; or writing its action log entry failed):
    /// the counts are what it did before.
    pub fn error(&self) -> Option<&BrokerError> {
        self.error.as_deref()
    }
}

/// The three bulk verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Cancel,
    Requeue,
    Delete,
}

impl Verb {
    fn name(self) -> &'static str {
        match self {
            Verb::Cancel => "cancel",
            Verb::Requeue => "requeue",
            Verb::Delete => "delete",
        }
    }

    /// The state indexes a pass reads ([`JobState::index`]): the filter's state, or without
    /// one every state the verb acts on; or why the filter's state is refused.
    fn states(self, state: Option<JobState>) -> Result<Vec<usize>> {
        let all: &[usize] = match self {
            Verb::Cancel => &[0, 1, 2, 3],
            Verb::Requeue => &[3, 0],
            Verb::Delete => &[0, 1, 2, 3, 4],
        };
        let Some(state) = state else {
            return Ok(all.to_vec());
        };
        match (self, state) {
            (Verb::Cancel, JobState::Completed) => Err(refused(
                "completed jobs are not cancelled: they are done".into(),
            )),
            (Verb::Requeue, JobState::Dead | JobState::Scheduled)
            | (Verb::Cancel | Verb::Delete, _) => Ok(vec![state.index()]),
            (Verb::Requeue, s) => Err(refused(format!(
                "a requeue acts on dead letters and scheduled jobs, not on {} jobs",
                s.name()
            ))),
        }
    }
}

impl std::fmt::Display for JobFilter {
    /// The filter as the action log says it: `dead jobs, customer = "acme", queue "mail",
    /// last error contains "timed out"` (`jobs` for any state, `every job` for none at all);
    /// text as Rust writes a string, control characters escaped.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = vec![match self.state {
            Some(s) => format!("{} jobs", s.name()),
            None if self.is_empty() => "every job".to_string(),
            None => "jobs".to_string(),
        }];
        for (c, v) in &self.columns {
            match v {
                Value::Text(t) => parts.push(format!("{c} = {t:?}")),
                Value::Int(n) => parts.push(format!("{c} = {n}")),
                Value::Float(x) => parts.push(format!("{c} = {x}")),
                v => parts.push(format!("{c} = {v:?}")),
            }
        }
        if let Some(q) = &self.queue {
            parts.push(format!("queue {q:?}"));
        }
        if let Some(k) = &self.kind {
            parts.push(format!("kind {k:?}"));
        }
        if let Some(e) = &self.error {
            parts.push(format!("last error contains {e:?}"));
        }
        f.write_str(&parts.join(", "))
    }
}

impl Broker {
    /// How many jobs of `table` match `filter` now (its [state](JobFilter::in_state), or any
    /// state): the preview of a bulk verb, one `COUNT(*)` statement, no lock taken. A
    /// snapshot: jobs move while the verb runs. Row lock and advisory forms count their jobs
    /// in work as ready (as [`Broker::stats`] does).
    ///
    /// # Errors
    ///
    /// As [`Broker::jobs_matching`]: [`BrokerError::InvalidOption`] for a filter that does
    /// not fit the table, nothing read.
    ///
    /// ```
    /// use sqlbroker::{Broker, JobFilter, JobState, Message, Table};
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(std::time::Duration::from_secs(30)).text_column("customer");
    /// broker.create_table(&jobs)?;
    /// for who in ["acme", "globex", "acme"] {
    ///     broker.publish(&jobs, Message::new(b"x".to_vec()).set("customer", who))?;
    /// }
    /// let acme = JobFilter::new().column("customer", "acme");
    /// assert_eq!(broker.count_matching(&jobs, &acme)?, 2);
    /// assert_eq!(broker.count_matching(&jobs, &acme.in_state(JobState::Dead))?, 0);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn count_matching(&self, table: &Table, filter: &JobFilter) -> Result<u64> {
        let q = self.queue(table)?;
        let (conds, values) = conditions(&q, filter)?;
        checked(&q)?;
        let states: Vec<usize> = match filter.state {
            Some(s) => vec![s.index()],
            None => vec![0, 1, 2, 3, 4],
        };
        let syntax = q.dialect.syntax();
        let Some((sql, nows)) = syntax.count_states(&q.spec, &states, &conds) else {
            return Ok(0);
        };
        let now = Value::Time(claim_now(SystemTime::now()));
        let mut params = vec![now; nows];
        params.extend(values);
        let rows = q.retrying("count matching", |conn| conn.query(&sql, &params))?;
        let n = rows.first().and_then(|r| r.first()).and_then(Value::as_i64);
        Ok(n.unwrap_or(0).max(0) as u64)
    }

    /// Cancels the jobs of `table` that match `filter` (its [state](JobFilter::in_state), or
    /// every state but completed), one pass of at most [`BulkPass`]'s bounds: each job by
    /// [`Broker::cancel`]'s rules for its form (a job in work finishes its attempt and is not
    /// retried), counting only what it changed ([`BulkOutcome`]), then one entry in the
    /// action log (`cancel all matching`, the filter as [`JobFilter`]'s `Display` says it,
    /// the count). What the operator's "cancel every job matching" runs.
    ///
    /// It reads what is left to do, in batches by id ([`BulkPass::batch`]), each after the
    /// last id acted on: in the lease and advisory forms the jobs in work asked to cancel
    /// before are not read again (a second pass over 1,000 jobs in flight does not mark and
    /// count the same 1,000 again). In the row lock form a job in work holds its row until
    /// its delivery settles: the pass waits for it at most [`BulkPass::row_wait`], then
    /// skips it ([`SkipReason::InWork`]) and goes on, so one job in work does not stop the
    /// others.
    ///
    /// # Errors
    ///
    /// Before anything is changed: [`BrokerError::InvalidOption`] for a filter that does not
    /// fit the table (as [`Broker::jobs_matching`]), the completed state (completed jobs
    /// are not cancelled), or a pass of no job, no time or a batch of none or more than
    /// [`MAX_BULK_BATCH`]; [`BrokerError::Schema`] as [`Broker::jobs`]. A database error
    /// during the pass ends it: the outcome says what it did before, and the error
    /// ([`BulkOutcome::error`]).
    ///
    /// ```
    /// use sqlbroker::{Broker, BulkPass, JobFilter, JobState, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(Duration::from_secs(30)).text_column("customer");
    /// broker.create_table(&jobs)?;
    /// for who in ["acme", "globex", "acme"] {
    ///     broker.publish(&jobs, Message::new(b"x".to_vec()).set("customer", who))?;
    /// }
    /// let acme = JobFilter::new().column("customer", "acme");
    /// assert_eq!(broker.count_matching(&jobs, &acme)?, 2);
    /// let done = broker.cancel_matching(&jobs, &acme, &BulkPass::new().by("ana"))?;
    /// assert_eq!((done.changed(), done.seen(), done.more()), (2, 2, false));
    /// assert_eq!(broker.stats(&jobs)?.ready, 1);
    /// assert_eq!(broker.actions(1)?[0].detail, r#"jobs, customer = "acme""#);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn cancel_matching(
        &self,
        table: &Table,
        filter: &JobFilter,
        pass: &BulkPass,
    ) -> Result<BulkOutcome> {
        self.bulk(table, filter, pass, Verb::Cancel)
    }

    /// Puts the jobs of `table` that match `filter` back in the queue, one pass of at most
    /// [`BulkPass`]'s bounds, in batches by id, then one entry in the action log (`requeue
    /// all matching`). What is requeued, as Oban's and River's retries do:
    ///
    /// - a **dead letter** (any reason: failed out of its attempts, dead-lettered by its
    ///   handler, or cancelled in work) goes back to ready, due now, its attempts reset, as
    ///   [`Broker::requeue_dead`] does one (on a table with dependencies, one waiting on a
    ///   job still dead-lettered or cancelled is skipped, [`SkipReason::WaitsOnFailed`]);
    /// - a **scheduled** job (published with a delay, or waiting out its retry backoff) is
    ///   made due now, its attempts kept, as [`Broker::run_now`] does one.
    ///
    /// Without a state in the filter both are read; a filter naming another state (ready,
    /// in flight, completed, waiting) is refused. Jobs in work are never touched: they are
    /// not in these states (a row lock job in work whose checkpoint moved its due time is
    /// skipped, [`SkipReason::InWork`]). A completed row kept as cancelled
    /// ([`Table::keep_completed`]) is finished and not requeued.
    ///
    /// # Errors
    ///
    /// As [`Broker::cancel_matching`], and [`BrokerError::InvalidOption`] for a state a
    /// requeue does not act on.
    ///
    /// ```
    /// use sqlbroker::{Broker, BulkPass, JobFilter, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(Duration::from_secs(30)).text_column("customer");
    /// broker.create_table(&jobs)?;
    /// broker.publish(&jobs, Message::new(b"x".to_vec()).set("customer", "acme"))?;
    /// let sub = broker.subscription(&jobs).start()?;
    /// sub.next_delivery().unwrap().dead_letter("bad input")?;
    ///
    /// let acme = JobFilter::new().column("customer", "acme");
    /// let done = broker.requeue_matching(&jobs, &acme, &BulkPass::new())?;
    /// assert_eq!(done.changed(), 1);
    /// assert_eq!(sub.next_delivery().unwrap().attempt(), 1);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn requeue_matching(
        &self,
        table: &Table,
        filter: &JobFilter,
        pass: &BulkPass,
    ) -> Result<BulkOutcome> {
        self.bulk(table, filter, pass, Verb::Requeue)
    }

    /// Deletes the jobs of `table` that match `filter` (its [state](JobFilter::in_state), or
    /// any state) and are not in work, one pass of at most [`BulkPass`]'s bounds, in batches
    /// by id, then one entry in the action log (`delete all matching`). Unlike a cancel, the
    /// row goes whatever the table keeps (a completed row too), and a job in work is
    /// skipped ([`SkipReason::InWork`]), never asked to stop: in the lease form a leased
    /// row; in the row lock form a row its delivery held for all of [`BulkPass::row_wait`];
    /// in the advisory form a live row whose key is held (by it, or by another row of that
    /// key in work). On a table with dependencies the jobs waiting on a deleted job are told
    /// as a cancel tells them (a dead letter's outcome is kept).
    ///
    /// # Errors
    ///
    /// As [`Broker::cancel_matching`].
    ///
    /// ```
    /// use sqlbroker::{Broker, BulkPass, JobFilter, JobState, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(Duration::from_secs(30)).text_column("customer");
    /// broker.create_table(&jobs)?;
    /// for who in ["acme", "acme", "globex"] {
    ///     broker.publish(&jobs, Message::new(b"x".to_vec()).set("customer", who))?;
    /// }
    /// let sub = broker.subscription(&jobs).batch_size(1).max_in_flight(1).start()?;
    /// let held = sub.next_delivery().unwrap(); // acme's first, in work
    ///
    /// let acme = JobFilter::new().column("customer", "acme");
    /// let done = broker.delete_matching(&jobs, &acme, &BulkPass::new())?;
    /// assert_eq!(done.changed(), 1);
    /// assert_eq!(done.skipped(), &[(held.id(), sqlbroker::SkipReason::InWork)]);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn delete_matching(
        &self,
        table: &Table,
        filter: &JobFilter,
        pass: &BulkPass,
    ) -> Result<BulkOutcome> {
        self.bulk(table, filter, pass, Verb::Delete)
    }

    /// One pass of `verb` ([`Broker::cancel_matching`]).
    fn bulk(
        &self,
        table: &Table,
        filter: &JobFilter,
        pass: &BulkPass,
        verb: Verb,
    ) -> Result<BulkOutcome> {
        if pass.limit == 0 || pass.time.is_zero() || !(1..=MAX_BULK_BATCH).contains(&pass.batch) {
            return Err(refused(format!(
                "a pass acts on one job at least, in a time above zero, in batches of 1 to \
                 {MAX_BULK_BATCH} jobs"
            )));
        }
        let states = verb.states(filter.state)?;
        let q = self.queue(table)?;
        let (mut conds, values) = conditions(&q, filter)?;
        if verb == Verb::Cancel && q.spec.form != Form::RowLock {
            conds.push(PageFilter::NotCancelRequested);
        }
        checked(&q)?;
        let mut out = BulkOutcome {
            last: pass.after,
            ..BulkOutcome::default()
        };
        let syntax = q.dialect.syntax();
        if let Some((sql, nows)) = syntax.preview_states(&q.spec, &states, &conds) {
            self.bulk_pages(&q, &sql, nows, &values, pass, verb, &mut out);
        }
        if verb == Verb::Requeue && out.changed > 0 {
            self.announce(&q, usize::try_from(out.changed).unwrap_or(usize::MAX));
        }
        let action = format!("{} all matching", verb.name());
        let detail = filter.to_string();
        if let Err(e) = self.record_action(&pass.by, &action, table.name(), &detail, out.changed) {
            out.error.get_or_insert(std::sync::Arc::new(e));
        }
        Ok(out)
    }

    /// The batches of a pass, into `out`: reads a batch after the last id, acts on each job.
    #[allow(clippy::too_many_arguments)]
    fn bulk_pages(
        &self,
        q: &Queue,
        sql: &str,
        nows: usize,
        values: &[Value],
        pass: &BulkPass,
        verb: Verb,
        out: &mut BulkOutcome,
    ) {
        let started = Instant::now();
        'pass: loop {
            let want = pass.batch.min(pass.limit.saturating_sub(out.seen as usize));
            if want == 0 {
                out.more = true;
                break;
            }
            let page = Page {
                after: out.last,
                limit: want,
                payload_prefix: 0,
            };
            let jobs = match preview_rows(q, sql, nows, values.to_vec(), page) {
                Ok(jobs) => jobs,
                Err(e) => {
                    out.error = Some(std::sync::Arc::new(e));
                    break;
                }
            };
            for job in &jobs {
                let left = pass.time.saturating_sub(started.elapsed());
                if left.is_zero() {
                    out.more = true;
                    break 'pass;
                }
                match act(q, job, verb, pass.row_wait.min(left)) {
                    Ok(None) => out.changed += 1,
                    Ok(Some(why)) => out.skipped.push((job.id(), why)),
                    Err(e) => {
                        out.error = Some(std::sync::Arc::new(e));
                        break 'pass;
                    }
                }
                out.seen += 1;
                out.last = Some(job.id());
            }
            if let Some(f) = &pass.on_batch {
                f(out);
            }
            if jobs.len() < want {
                break;
            }
        }
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
        if filter.state.is_some_and(|s| s != state) {
            return Err(refused(format!(
                "the listing is of {} jobs, the filter's state another",
                state.name()
            )));
        }
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
        Ok(make_due(&q, id)? == Some(true))
    }
}

/// Makes the scheduled job `id` due now ([`Broker::run_now`]): `Some(true)` if it was moved,
/// `Some(false)` if it is not scheduled, `None` if (row lock form) a delivery holds its row.
fn make_due(q: &Queue, id: i64) -> Result<Option<bool>> {
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
        return Ok(Some(moved > 0));
    }
    let mut conn = q.conn("run now")?;
    let run = |conn: &mut dyn DbConn| -> std::result::Result<Option<u64>, DbError> {
        conn.batch(&q.sql.begin_write)?;
        if conn.query(&q.sql.probe_lock, &[Value::Int(id)])?.is_empty() {
            return Ok(None);
        }
        conn.execute(&q.sql.make_due, &params).map(Some)
    };
    match run(&mut *conn).and_then(|n| conn.batch("COMMIT").map(|()| n)) {
        Ok(n) => Ok(n.map(|n| n > 0)),
        Err(e) => {
            conn.rollback_or_discard();
            Err(q.err("run now")(e))
        }
    }
}

/// Acts on one job a pass of `verb` read: `None` if it changed it, else why not; a row lock
/// job in work waited for at most `wait`.
fn act(q: &Queue, job: &Job, verb: Verb, wait: Duration) -> Result<Option<SkipReason>> {
    let id = job.id();
    Ok(match verb {
        Verb::Cancel => match cancel_one(q, id, Wait::AtMost(wait))? {
            Cancelled::Now => None,
            Cancelled::Already => Some(SkipReason::AlreadyCancelling),
            Cancelled::Gone => Some(SkipReason::Finished),
            Cancelled::Busy => Some(SkipReason::InWork),
        },
        Verb::Requeue => match job.state() {
            JobState::Dead => match crate::operating::ops::requeue_one(q, id) {
                Ok(true) => None,
                Ok(false) => Some(SkipReason::Finished),
                Err(BrokerError::ParentFailed { .. }) => Some(SkipReason::WaitsOnFailed),
                Err(e) => return Err(e),
            },
            JobState::Scheduled => match make_due(q, id)? {
                Some(true) => None,
                // Row lock: a delivery holds it (a checkpoint moved its due time ahead).
                None => Some(SkipReason::InWork),
                Some(false) => Some(SkipReason::Moved),
            },
            _ => Some(SkipReason::Moved),
        },
        Verb::Delete => match delete_one(q, job, wait)? {
            Deleted::Now => None,
            Deleted::InWork => Some(SkipReason::InWork),
            Deleted::Gone => Some(SkipReason::Finished),
        },
    })
}
