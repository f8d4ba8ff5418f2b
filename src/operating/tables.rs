//! The registry of tables, for operators: a table's recorded description by name
//! ([`Broker::open_table`]), every recorded table ([`Broker::tables`]), and pausing
//! ([`Broker::pause`], [`Broker::resume`]). What the record holds and how it is kept is the
//! runtime's registry.

use crate::broker::Broker;
use crate::dialect::DbConn;
use crate::error::{BrokerError, Result};
use crate::model::table::Table;
use crate::model::value::Value;
use crate::runtime::registry;

/// A recorded table, as [`Broker::tables`] lists it.
///
/// ```
/// use sqlbroker::{Broker, Table};
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// broker.create_table(&Table::new("mails").lease(std::time::Duration::from_secs(30)))?;
/// let all = broker.tables()?;
/// assert_eq!(all[0].table.name(), "mails");
/// assert!(!all[0].paused);
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordedTable {
    /// The description recorded for it.
    pub table: Table,
    /// Whether it is paused ([`Broker::pause`]).
    pub paused: bool,
}

/// A concurrency limit in force ([`Broker::concurrency_limits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConcurrencyLimit {
    /// The key template, as described (`""`: the whole table).
    pub key: String,
    /// The `max` the description gives.
    pub described: u32,
    /// The `max` in force: an operator's setting, else the described one; `None`: lifted.
    pub max: Option<u32>,
    /// Rows in work now that this limit counts (every key): leased rows in the lease form,
    /// the slot keys held in the others (a lifted limit's rows hold slots too). Always `Some`
    /// (`None` was a lifted limit's in earlier releases).
    pub in_work: Option<u64>,
    /// Ready rows whose key of this limit is at its max, waiting on it (always `Some`).
    pub waiting: Option<u64>,
}

/// A rate limit in force ([`Broker::rate_limits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimit {
    /// The key template, as described (`""`: the whole table).
    pub key: String,
    /// The window.
    pub per: std::time::Duration,
    /// The `max` the description gives.
    pub described: u32,
    /// The `max` in force: an operator's setting, else the described one; `None`: lifted.
    pub max: Option<u32>,
    /// Claims in the window ending now, every key of the limit together.
    pub claimed: u64,
    /// Ready rows whose key's window is full now: waiting on this limit (in the row lock and
    /// advisory lock forms, rows in work are counted as ready, as in
    /// [`QueueStats`](crate::QueueStats)).
    pub waiting: u64,
}

impl Broker {
    /// The description of table `name` recorded by [`create_table`](Broker::create_table) or
    /// [`migrate`](Broker::migrate), in this process or any other: what a worker, a tool or a
    /// second service uses instead of describing the table again.
    ///
    /// # Errors
    ///
    /// [`BrokerError::UnknownTable`] if no description of `name` is recorded (a table made
    /// by an earlier release gets one from `migrate`); [`BrokerError::Schema`] if the record
    /// was written by a newer release of sqlbroker, in a format this one does not read.
    ///
    /// ```
    /// use sqlbroker::{Broker, Form, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// broker.create_table(&Table::new("jobs").text_column("kind").lease(Duration::from_secs(30)))?;
    ///
    /// // Elsewhere (another process, the command line): no description repeated.
    /// let jobs = broker.open_table("jobs")?;
    /// assert_eq!(jobs.form(), Form::Lease);
    /// broker.publish(&jobs, Message::new(b"hi".to_vec()).set("kind", "greeting"))?;
    /// assert!(broker.open_table("nope").is_err());
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn open_table(&self, name: &str) -> Result<Table> {
        crate::model::table::check_ident(name, 48).map_err(|reason| BrokerError::InvalidTable {
            table: name.to_string(),
            reason,
        })?;
        let mut conn = self.pooled("open table", name)?;
        let Some(table) = registry::open(self.dialect(), &mut *conn, name)? else {
            return Err(BrokerError::UnknownTable {
                table: name.to_string(),
            });
        };
        table.validate()?;
        Ok(table)
    }

    /// Every recorded table, by name, with its description and pause flag (the command
    /// line's `status` lists them). Records this release cannot read are left out, with a
    /// warning in the log.
    pub fn tables(&self) -> Result<Vec<RecordedTable>> {
        let mut conn = self.pooled("list tables", "")?;
        let tables = registry::list(self.dialect(), &mut *conn)?;
        Ok(tables
            .into_iter()
            .map(|(table, paused)| RecordedTable { table, paused })
            .collect())
    }

    /// Forgets the recorded description of the table `name`, which no longer exists (dropped
    /// by hand, or by a migration tool): its record in `sqlbroker_tables`, its rate limits'
    /// slots table and the rows of `sqlbroker_deps` that name it go, as
    /// [`drop_table`](Broker::drop_table) removes them. A stale record is otherwise listed for
    /// ever ([`Broker::tables`]), a table whose every count fails
    /// ([`BrokerError::is_missing_table`]); the command line's `sqlbroker forget` calls this.
    ///
    /// A table that exists is refused: its record is the one description its rows run by
    /// (to remove both, [`drop_table`](Broker::drop_table)).
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidOption`] if the table exists, [`BrokerError::UnknownTable`] if
    /// no description of `name` is recorded, [`BrokerError::InvalidTable`] for a name that
    /// is not one; nothing is changed then. [`BrokerError::DdlRefused`] on a broker built
    /// with [`manage_schema(false)`](crate::BrokerBuilder::manage_schema) (a rate limits'
    /// slots table is dropped), before anything is read.
    ///
    /// ```
    /// use sqlbroker::{Broker, BrokerError, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// // The table exists: its record stays.
    /// assert!(matches!(broker.forget_table("jobs"), Err(BrokerError::InvalidOption { .. })));
    /// assert!(broker.open_table("jobs").is_ok());
    /// // No record of that name.
    /// assert!(matches!(broker.forget_table("nope"), Err(BrokerError::UnknownTable { .. })));
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn forget_table(&self, name: &str) -> Result<()> {
        crate::model::table::check_ident(name, 48).map_err(|reason| BrokerError::InvalidTable {
            table: name.to_string(),
            reason,
        })?;
        self.may_run_ddl("forget_table", &Table::new(name))?;
        let recorded = {
            let mut conn = self.pooled("forget table", name)?;
            let columns = conn
                .query(
                    self.dialect().columns_query(),
                    &[Value::Text(name.to_string())],
                )
                .map_err(|e| e.during("forget table", name))?;
            if !columns.is_empty() {
                return Err(BrokerError::InvalidOption {
                    option: "forget_table",
                    reason: format!(
                        "table {name} still exists: only the record of a table that is gone is \
                         forgotten (drop_table drops a table and its record)"
                    ),
                });
            }
            registry::open(self.dialect(), &mut *conn, name)?
        };
        let Some(table) = recorded else {
            return Err(BrokerError::UnknownTable {
                table: name.to_string(),
            });
        };
        self.remove_table(&table, false)
    }

    /// Pauses the table: every subscription on it, in any process, stops claiming within
    /// one poll interval (at once in this broker, and in other brokers on PostgreSQL, whose
    /// change feed carries the news), until [`resume`](Broker::resume). Deliveries in hand
    /// finish and settle as usual, and publishes go on. Recorded in the table's registry
    /// row: a subscription started later, or in a process started later, stays paused too.
    /// Pausing a paused table changes nothing. [`QueueStats::paused`](crate::QueueStats::paused)
    /// tells.
    ///
    /// # Errors
    ///
    /// [`BrokerError::UnknownTable`] if the table has no recorded description
    /// ([`Broker::migrate`] records one); nothing is changed then.
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// broker.pause(&jobs)?;
    /// broker.publish(&jobs, Message::new(b"waits".to_vec()))?;
    /// let sub = broker.subscription(&jobs).start()?;
    /// assert!(sub.next_delivery_timeout(Duration::from_millis(300)).is_err());
    /// assert!(broker.stats(&jobs)?.paused);
    /// broker.resume(&jobs)?;
    /// sub.next_delivery_timeout(Duration::from_secs(5)).unwrap().ack()?;
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn pause(&self, table: &Table) -> Result<()> {
        self.set_paused(table, true)
    }

    /// Resumes a paused table ([`pause`](Broker::pause)): its subscriptions claim again
    /// within one poll interval (at once in this broker, and on PostgreSQL in others).
    /// Resuming a table that is not paused changes nothing.
    ///
    /// # Errors
    ///
    /// [`BrokerError::UnknownTable`] if the table has no recorded description.
    pub fn resume(&self, table: &Table) -> Result<()> {
        self.set_paused(table, false)
    }

    /// Sets the `max` of the table's concurrency limit `key` (its template as described,
    /// [`Table::concurrency_limit`]) to `max`, or lifts it (`None`), at run time: recorded in
    /// the table's record, which every claim of the table reads, so every subscription in any
    /// process follows from its next claim. Rows already in work beyond a lowered max finish;
    /// no more start until the key is under it. A later [`migrate`](Broker::migrate) records
    /// the description again, and with it the described maxes.
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidOption`] if `max` is outside `1..=`[`Table::MAX_CONCURRENCY`]
    /// or the table has no limit `key`; [`BrokerError::UnknownTable`] without a record.
    /// Nothing is changed then.
    ///
    /// ```
    /// use sqlbroker::{Broker, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let calls = Table::new("calls")
    ///     .text_column("account")
    ///     .concurrency_limit("{account}", 2)
    ///     .lease(Duration::from_secs(30));
    /// broker.create_table(&calls)?;
    /// broker.set_concurrency_limit(&calls, "{account}", Some(5))?;
    /// assert_eq!(broker.concurrency_limits(&calls)?[0].max, Some(5));
    /// broker.set_concurrency_limit(&calls, "{account}", None)?; // lifted
    /// assert!(broker.set_concurrency_limit(&calls, "{other}", Some(1)).is_err());
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn set_concurrency_limit(&self, table: &Table, key: &str, max: Option<u32>) -> Result<()> {
        let q = self.queue(table)?;
        registry::set_limit(&q, key, max)
    }

    /// Sets the `max` of the table's rate limit `key` (its template as described) at run
    /// time, or lifts it (`None`), as [`set_concurrency_limit`](Broker::set_concurrency_limit)
    /// does for a concurrency limit: recorded in the table's record, followed by every
    /// broker's next claim, undone by a later `migrate`. A lowered max binds fully once the
    /// claims made under the old one are a window old.
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidOption`] for a `max` outside `1..=`[`Table::MAX_RATE`], a key
    /// the table's record describes no rate limit for, or a key with several windows (name one
    /// with [`set_rate_window`](Broker::set_rate_window)), changing nothing;
    /// [`BrokerError::UnknownTable`] for a table without a record.
    ///
    /// ```
    /// use sqlbroker::{Broker, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let calls = Table::new("calls")
    ///     .text_column("account")
    ///     .rate_limit("{account}", 10, Duration::from_secs(1))
    ///     .lease(Duration::from_secs(30));
    /// broker.create_table(&calls)?;
    /// broker.set_rate_limit(&calls, "{account}", Some(5))?;
    /// assert_eq!(broker.rate_limits(&calls)?[0].max, Some(5));
    /// assert!(broker.set_rate_limit(&calls, "{other}", Some(5)).is_err());
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn set_rate_limit(&self, table: &Table, key: &str, max: Option<u32>) -> Result<()> {
        let q = self.queue(table)?;
        registry::set_rate(&q, key, None, max)
    }

    /// Sets the `max` of the table's rate limit of key `key` and window `per` (a key may have
    /// several windows: "10 a second and 100 a minute"), or lifts it (`None`), as
    /// [`set_rate_limit`](Broker::set_rate_limit) does for a key with one window.
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidOption`] for a `max` outside `1..=`[`Table::MAX_RATE`], or a key
    /// and window the table's record describes no rate limit for, changing nothing;
    /// [`BrokerError::UnknownTable`] for a table without a record.
    ///
    /// ```
    /// use sqlbroker::{Broker, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let (second, minute) = (Duration::from_secs(1), Duration::from_secs(60));
    /// let calls = Table::new("calls")
    ///     .text_column("account")
    ///     .rate_limit("{account}", 10, second)
    ///     .rate_limit("{account}", 100, minute)
    ///     .lease(Duration::from_secs(30));
    /// broker.create_table(&calls)?;
    /// broker.set_rate_window(&calls, "{account}", minute, Some(50))?;
    /// assert_eq!(broker.rate_limits(&calls)?[1].max, Some(50));
    /// // Which of the two windows is meant is not told by the key alone.
    /// assert!(broker.set_rate_limit(&calls, "{account}", Some(5)).is_err());
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn set_rate_window(
        &self,
        table: &Table,
        key: &str,
        per: std::time::Duration,
        max: Option<u32>,
    ) -> Result<()> {
        let q = self.queue(table)?;
        registry::set_rate(&q, key, Some(per), max)
    }

    /// The table's rate limits in force: each key template with its window, the `max` its
    /// record holds (an operator's setting, else the described one; `None`: lifted), and the
    /// claims counted in the window ending now (every key of the limit). Empty for a table
    /// without rate limits.
    pub fn rate_limits(&self, table: &Table) -> Result<Vec<RateLimit>> {
        let q = self.queue(table)?;
        let ((_, maxes), usage) = q.retrying("limits", |conn| {
            let maxes = crate::runtime::usage::maxes_in_force(&q, conn)?;
            let usage = crate::runtime::usage::usage(&q, conn, &maxes.0, &maxes.1)?;
            Ok((maxes, usage))
        })?;
        Ok(q.spec
            .rates
            .iter()
            .zip(maxes.iter())
            .zip(usage.rates)
            .map(|((r, max), (claimed, waiting))| RateLimit {
                key: r.key.clone(),
                per: std::time::Duration::from_millis(r.per_ms as u64),
                described: r.max,
                max: *max,
                claimed,
                waiting,
            })
            .collect())
    }

    /// The table's concurrency limits in force: each key template with the `max` its record
    /// holds (an operator's setting, else the described one; `None`: lifted), the rows in
    /// work it counts and the ready rows waiting on it (read now, without the claims' turn:
    /// the lease form counts leased rows, the others probe the slot keys their rows in work
    /// hold). Empty for a table without limits.
    pub fn concurrency_limits(&self, table: &Table) -> Result<Vec<ConcurrencyLimit>> {
        let q = self.queue(table)?;
        let ((maxes, _), usage) = q.retrying("limits", |conn| {
            let maxes = crate::runtime::usage::maxes_in_force(&q, conn)?;
            let usage = crate::runtime::usage::usage(&q, conn, &maxes.0, &maxes.1)?;
            Ok((maxes, usage))
        })?;
        Ok(q.spec
            .limits
            .iter()
            .zip(maxes.iter())
            .enumerate()
            .map(|(i, (l, max))| {
                let (in_work, waiting) = usage.limits.get(i).copied().unwrap_or_default();
                ConcurrencyLimit {
                    key: l.key.clone(),
                    described: l.max,
                    max: *max,
                    in_work,
                    waiting: Some(waiting),
                }
            })
            .collect())
    }

    fn set_paused(&self, table: &Table, paused: bool) -> Result<()> {
        let q = self.queue(table)?;
        registry::set_paused(&q, paused)
    }

    /// Pauses one queue of a table described with [`Table::queues`]: no claim of any broker,
    /// in any process, takes its rows from its next statement on (every claim of a table with
    /// queues reads the paused queues, so it needs no poll); the table's other queues run on,
    /// and deliveries in hand finish. Recorded in the database's `sqlbroker_paused_queues`
    /// (a row per paused queue, deleted by [`resume_queue`](Broker::resume_queue) and by
    /// [`drop_table`](Broker::drop_table)). Pausing a queue twice, or one with no rows,
    /// changes nothing more.
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidTable`] for a table without queues, [`BrokerError::InvalidOption`]
    /// for a bad queue name; nothing is changed then.
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").queues().lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// broker.pause_queue(&jobs, "emails")?;
    /// broker.publish(&jobs, Message::new(b"waits".to_vec()).queue("emails"))?;
    /// broker.publish(&jobs, Message::new(b"runs".to_vec()).queue("images"))?;
    /// let sub = broker.subscription(&jobs).start()?;
    /// let d = sub.next_delivery_timeout(Duration::from_secs(5)).unwrap();
    /// assert_eq!(d.queue(), "images");
    /// d.ack()?;
    /// assert!(sub.next_delivery_timeout(Duration::from_millis(300)).is_err());
    /// assert_eq!(broker.paused_queues(&jobs)?, ["emails"]);
    /// broker.resume_queue(&jobs, "emails")?;
    /// assert_eq!(sub.next_delivery_timeout(Duration::from_secs(5)).unwrap().queue(), "emails");
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn pause_queue(&self, table: &Table, queue: &str) -> Result<()> {
        self.set_queue_paused(table, queue, true)
    }

    /// Resumes a queue paused by [`pause_queue`](Broker::pause_queue): claims take its rows
    /// again from their next statement (this broker's idle subscriptions are woken at once,
    /// on PostgreSQL other brokers' too; elsewhere within their poll interval). Resuming a
    /// queue that is not paused changes nothing.
    ///
    /// # Errors
    ///
    /// As [`pause_queue`](Broker::pause_queue).
    pub fn resume_queue(&self, table: &Table, queue: &str) -> Result<()> {
        self.set_queue_paused(table, queue, false)
    }

    /// The paused queues of a table described with [`Table::queues`], by name.
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidTable`] for a table without queues; a database error.
    pub fn paused_queues(&self, table: &Table) -> Result<Vec<String>> {
        let q = self.queue(table)?;
        let pq = paused_queues_sql(&q, table)?;
        let name = [Value::Text(q.spec.name.clone())];
        let rows = q.retrying("paused queues", |conn| conn.query(&pq.list, &name))?;
        Ok(rows
            .into_iter()
            .filter_map(|r| r.into_iter().next())
            .filter_map(|v| match v {
                Value::Text(t) => Some(t),
                Value::Bytes(b) => String::from_utf8(b).ok(),
                _ => None,
            })
            .collect())
    }

    fn set_queue_paused(&self, table: &Table, queue: &str, paused: bool) -> Result<()> {
        let q = self.queue(table)?;
        let pq = paused_queues_sql(&q, table)?;
        let op = if paused {
            "pause queue"
        } else {
            "resume queue"
        };
        crate::model::table::check_name("queue", queue).map_err(|reason| {
            BrokerError::InvalidOption {
                option: "queue",
                reason,
            }
        })?;
        let (t, n) = (Value::Text(q.spec.name.clone()), Value::Text(queue.into()));
        q.retrying(op, |conn| match paused {
            true => conn.execute(
                &pq.pause,
                &[
                    t.clone(),
                    n.clone(),
                    Value::Time(std::time::SystemTime::now()),
                ],
            ),
            false => conn.execute(&pq.resume, &[t.clone(), n.clone()]),
        })?;
        if !paused {
            registry::announce(&q, op);
        }
        Ok(())
    }
}

/// The paused queues' statements of `q`, or [`BrokerError::InvalidTable`] for a table without
/// queues.
fn paused_queues_sql<'q>(
    q: &'q crate::runtime::Queue,
    table: &Table,
) -> Result<&'q crate::dialect::queues::PausedQueuesSql> {
    q.sql
        .paused_queues
        .as_ref()
        .ok_or_else(|| BrokerError::InvalidTable {
            table: table.name().to_string(),
            reason: "a table without queues has no queue to pause (Table::queues)".into(),
        })
}
