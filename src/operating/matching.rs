//! The operator's filtered listings and the call that runs a scheduled job now: what an
//! action on every job matching a filter pages through (the dashboard's "cancel all
//! matching"), one bounded page at a time.

use std::time::SystemTime;

use crate::broker::Broker;
use crate::dialect::shared::PageFilter;
use crate::dialect::DbConn;
use crate::error::{BrokerError, DbError, Result};
use crate::model::schedule::claim_now;
use crate::model::table::{ColumnType, Form, Table};
use crate::model::value::Value;
use crate::operating::jobs::{checked, preview_rows, Job, JobState, Page};
use crate::runtime::deps::waiting_due;

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

    /// The column conditions, in the order given.
    pub fn columns(&self) -> &[(String, Value)] {
        &self.columns
    }

    /// The error text asked for.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// True if the filter matches every job.
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty() && self.error.is_none()
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

impl Broker {
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
