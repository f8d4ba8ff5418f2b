//! Draining a table on the calling thread: [`drain`], [`drain_all`] and their options
//! ([`Drain`]).
//!
//! A drain is a subscription started without claim workers: it claims one row at a time on the
//! calling thread (the real claim of the table's form, from the head of the claim order) and
//! settles each by [`Subscription::run`]'s rules ([`outcome::handle`], the one implementation
//! both use). It ends when a claim takes nothing while nothing is in flight: no row is
//! claimable then. [`drain_all`] then makes the jobs scheduled for later due now
//! ([`TableSql::due_later`](crate::dialect::TableSql::due_later)) and drains again, until none
//! is left to make due.
//!
//! [`Subscription::run`]: crate::Subscription::run

use std::time::SystemTime;

use crate::broker::Broker;
use crate::consuming::delivery::Delivery;
use crate::consuming::outcome::{self, Outcome, Ran};
use crate::dialect::DbConn;
use crate::error::{BrokerError, DbError, Result};
use crate::model::retry::RetryPolicy;
use crate::model::schedule::claim_now;
use crate::model::table::{Form, Table};
use crate::model::value::Value;
use crate::runtime::deps::waiting_due;
use crate::runtime::Queue;

/// The most jobs a drain runs unless told otherwise ([`Drain::max_jobs`]).
pub const DEFAULT_MAX_JOBS: usize = 10_000;

/// Runs every job of `table` that is due, one at a time on the calling thread, until none is;
/// what was done, counted. Jobs scheduled for later (a delay, a retry's backoff, a snooze) are
/// left as they are: [`drain_all`] runs those too.
///
/// Each job is settled as [`Subscription::run`](crate::Subscription::run) settles it:
/// `Ok(())` or `Ok(Outcome::Ack)` acks it, another [`Outcome`] dead-letters, retries after a
/// delay or cancels it, and an `Err` or a panic fails it by the retry policy
/// ([`RetryPolicy::default`]; [`Drain::retry_policy`] sets another), dead-lettering it once
/// the table's [`max_attempts`](crate::Table::max_attempts) are spent. A panic is caught and
/// counted (`Ran::panicked`), as in `run`: check the counts.
///
/// It claims with the table's own form and limits: jobs of a paused table, jobs held by
/// another subscription, and jobs a concurrency or rate limit holds back are not run; the
/// last are counted in [`Ran::limited`] when the drain ends (and warned of in the log), and
/// [`Drain::ignore_limits`] runs them. A job a handler publishes and that is due is run by
/// the same drain. At most
/// [`DEFAULT_MAX_JOBS`] jobs run ([`Drain::max_jobs`]); past that the drain stops with
/// [`BrokerError::DrainLimit`].
///
/// # Errors
///
/// What [`SubscriptionBuilder::start`](crate::SubscriptionBuilder::start) refuses (an invalid
/// or missing table, a form the database does not have), a claim that fails, and
/// [`BrokerError::DrainLimit`].
pub fn drain<O, E, F>(broker: &Broker, table: &Table, handler: F) -> Result<Ran>
where
    O: Into<Outcome>,
    E: std::fmt::Display,
    F: FnMut(&Delivery) -> std::result::Result<O, E>,
{
    Drain::new(broker, table).run(handler)
}

/// [`drain`], with the jobs scheduled or retried for later taken as due at once: after each
/// pass the jobs due later are made due now (their `run_at` moved to now) and drained, until
/// none is left. No backoff is slept through, so "fails twice, then succeeds" or
/// "dead-lettered after `max_attempts`" runs in milliseconds; every retry still counts its
/// attempt, so a job that always fails ends dead-lettered after the table's
/// [`max_attempts`](crate::Table::max_attempts).
///
/// Never made due: a job in work (leased, or locked by a row lock delivery), a dead letter, a
/// completed row, and a job waiting on other jobs ([`Message::after`](crate::Message::after):
/// it is released, and then run, when they settle). A job scheduled for the latest time the
/// queue writes (a delay past the year 9999) reads as waiting and is left too.
///
/// Meant for a test's own table: run it while no other subscription works on the table (a
/// row lock delivery between a checkpoint's commit and its next lock may be made due).
///
/// # Errors
///
/// As [`drain`]'s.
pub fn drain_all<O, E, F>(broker: &Broker, table: &Table, handler: F) -> Result<Ran>
where
    O: Into<Outcome>,
    E: std::fmt::Display,
    F: FnMut(&Delivery) -> std::result::Result<O, E>,
{
    Drain::new(broker, table)
        .include_scheduled(true)
        .run(handler)
}

/// A drain with options: [`drain`] and [`drain_all`] are `Drain::new(..).run(..)` and
/// `Drain::new(..).include_scheduled(true).run(..)`.
///
/// ```
/// use sqlbroker::testing::Drain;
/// use sqlbroker::{Broker, Message, Table};
/// use std::time::Duration;
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let jobs = Table::new("jobs").lease(Duration::from_secs(30));
/// broker.create_table(&jobs)?;
/// broker.publish(&jobs, Message::new(b"loop".to_vec()))?;
/// // A handler that publishes a job for every job it runs never drains: the bound stops it.
/// let err = Drain::new(&broker, &jobs)
///     .max_jobs(5)
///     .run(|d| broker.publish(&jobs, Message::new(d.payload().to_vec())).map(drop))
///     .unwrap_err();
/// assert!(matches!(err, sqlbroker::BrokerError::DrainLimit { max_jobs: 5, .. }));
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a drain does nothing until it is run"]
pub struct Drain<'a> {
    broker: &'a Broker,
    table: &'a Table,
    retry: RetryPolicy,
    scheduled: bool,
    max_jobs: usize,
    ignore_limits: bool,
}

impl<'a> Drain<'a> {
    /// A drain of `table`: the due jobs only, the default retry policy, at most
    /// [`DEFAULT_MAX_JOBS`] jobs.
    pub fn new(broker: &'a Broker, table: &'a Table) -> Self {
        Drain {
            broker,
            table,
            retry: RetryPolicy::default(),
            scheduled: false,
            max_jobs: DEFAULT_MAX_JOBS,
            ignore_limits: false,
        }
    }

    /// How a failed job waits before its next attempt, as
    /// [`SubscriptionBuilder::retry_policy`](crate::SubscriptionBuilder::retry_policy): give
    /// the policy of the subscription under test. Default: [`RetryPolicy::default`]. A drain
    /// of the due jobs only leaves a failed job scheduled by it; with
    /// [`include_scheduled`](Drain::include_scheduled) the delay is not waited.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Takes the jobs scheduled or retried for later as due at once ([`drain_all`]). Default:
    /// false ([`drain`]).
    pub fn include_scheduled(mut self, on: bool) -> Self {
        self.scheduled = on;
        self
    }

    /// The most jobs the drain runs (deliveries handed to the handler, retries of one job
    /// included). One more due job found after them stops it with
    /// [`BrokerError::DrainLimit`] (and goes back to the table unspent). Default
    /// [`DEFAULT_MAX_JOBS`]; at least 1 ([`run`](Drain::run) refuses 0 with
    /// [`BrokerError::InvalidOption`]).
    pub fn max_jobs(mut self, n: usize) -> Self {
        self.max_jobs = n;
        self
    }

    /// Runs the jobs a concurrency or rate limit would hold back too: the drain claims as
    /// if the table had no limits (taking no slot and no place in a window, so the limits
    /// the table's other subscriptions see are left as they were). For a test of handlers,
    /// not of the limits. Default: false, and a drain that limits held back says how many
    /// jobs it left ([`Ran::limited`]).
    pub fn ignore_limits(mut self, on: bool) -> Self {
        self.ignore_limits = on;
        self
    }

    /// Runs the drain: see [`drain`] and [`drain_all`].
    ///
    /// # Errors
    ///
    /// As [`drain`]'s, and [`BrokerError::InvalidOption`] for a `max_jobs` of 0.
    pub fn run<O, E, F>(self, mut handler: F) -> Result<Ran>
    where
        O: Into<Outcome>,
        E: std::fmt::Display,
        F: FnMut(&Delivery) -> std::result::Result<O, E>,
    {
        if self.max_jobs == 0 {
            return Err(BrokerError::InvalidOption {
                option: "max_jobs",
                reason: "a drain runs at least one job".into(),
            });
        }
        // The description is checked against the record first, limits and all; a drain that
        // ignores the limits then claims through the same description without them, marked
        // as checked, and forgotten by the broker at the end (so no later use of a
        // description without limits passes unchecked).
        let q = self.broker.queue(self.table)?;
        let limited = !q.spec.limits.is_empty() || !q.spec.rates.is_empty();
        let unlimited;
        let claims = match self.ignore_limits && limited {
            true => {
                unlimited = self.table.clone().without_limits();
                self.broker
                    .compiled(&unlimited)?
                    .described
                    .store(true, std::sync::atomic::Ordering::Release);
                &unlimited
            }
            false => self.table,
        };
        let sub = self
            .broker
            .subscription(claims)
            .retry_policy(self.retry)
            .without_claim_workers()
            .start();
        let sub = match sub {
            Ok(sub) => sub,
            Err(e) => {
                if !std::ptr::eq(claims, self.table) {
                    self.broker.forget(&q.spec.name);
                }
                return Err(e);
            }
        };
        let ran = parking_lot::Mutex::new(Ran::default());
        let mut handled = 0usize;
        let mut pass = || -> Result<()> {
            loop {
                // Every job due now, one claim at a time: the subscription has no claim
                // workers, so what a claim takes is all it holds, and a claim that takes
                // nothing means no job is claimable.
                loop {
                    let (rows, deliveries) = sub.claim_on_caller(1)?;
                    if rows == 0 {
                        break;
                    }
                    for d in deliveries {
                        if handled == self.max_jobs {
                            // `d` was never handed out: dropping it hands its row back unspent.
                            return Err(BrokerError::DrainLimit {
                                table: q.spec.name.clone(),
                                max_jobs: self.max_jobs,
                            });
                        }
                        handled += 1;
                        outcome::handle(d.hand_out(), &mut handler, &ran, &q.spec.name);
                    }
                }
                if !self.scheduled || make_due(&q)? == 0 {
                    return Ok(());
                }
            }
        };
        let done = pass();
        sub.close();
        if !std::ptr::eq(claims, self.table) {
            self.broker.forget(&q.spec.name);
        }
        let mut ran = done.map(|()| ran.into_inner())?;
        if limited && !self.ignore_limits {
            // No claim took a row: any due row a limit counts as held back is left unrun.
            // Said, not left silent (a test would see the jobs "drained").
            let stats = self.broker.stats(self.table)?;
            ran.limited = usize::try_from(stats.limited.unwrap_or(0)).unwrap_or(usize::MAX);
            if ran.limited > 0 {
                log::warn!(
                    "testing::drain of table {}: {} due jobs held back by a concurrency or rate \
                     limit were not run (Drain::ignore_limits runs them)",
                    q.spec.name,
                    ran.limited
                );
            }
        }
        Ok(ran)
    }
}

/// Makes the jobs of `q`'s table scheduled for later due now, in one transaction: the ids
/// [`TableSql::due_later`](crate::dialect::TableSql::due_later) reads, each moved by
/// [`TableSql::make_due`](crate::dialect::TableSql::make_due) if it still qualifies. Returns
/// how many were moved.
fn make_due(q: &Queue) -> Result<u64> {
    let now = Value::Time(claim_now(SystemTime::now()));
    let latest = Value::Time(waiting_due());
    let lease = q.spec.form == Form::Lease;
    let run = |conn: &mut dyn DbConn| -> std::result::Result<u64, DbError> {
        let mut params = vec![now.clone(), latest.clone()];
        if lease {
            params.push(now.clone());
        }
        let mut moved = 0;
        for row in conn.query(&q.sql.due_later, &params)? {
            let Some(id) = row.first().and_then(Value::as_i64) else {
                continue;
            };
            let mut params = vec![now.clone(), Value::Int(id), now.clone(), latest.clone()];
            if lease {
                params.push(now.clone());
            }
            moved += conn.execute(&q.sql.make_due, &params)?;
        }
        Ok(moved)
    };
    let mut conn = q.conn("drain_all")?;
    let done = conn
        .batch(&q.sql.begin_write)
        .and_then(|()| run(&mut *conn))
        .and_then(|moved| conn.batch("COMMIT").map(|()| moved));
    match done {
        Ok(moved) => Ok(moved),
        Err(e) => {
            conn.rollback_or_discard();
            Err(q.err("drain_all")(e))
        }
    }
}
