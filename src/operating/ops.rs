//! The operator's view of a queue: its counts by state ([`Broker::stats`]), dead letters
//! ([`Broker::dead_letters`]: listing, paging, requeue and purge, by id or all) and the completed rows a table keeps
//! ([`Table::keep_completed`]: paging, pruning), in bounded batches, so a table of millions of
//! rows is never locked by one long statement. The `sqlbroker` command line
//! tool (`cli` feature) is built on these.

use std::time::{Duration, SystemTime};

use crate::broker::Broker;
use crate::dialect::DbConn;
use crate::error::{BrokerError, DbError, Result};
use crate::model::schedule;
use crate::model::table::{Form, Table};
use crate::model::value::Value;
use crate::runtime::Queue;

pub(crate) use crate::runtime::retention::BATCH;
use crate::runtime::retention::{in_batches, in_transaction};

/// A table's rows by state, read in one statement ([`Broker::stats`]).
///
/// What each count holds depends on the form, because only the lease form marks a row in
/// work in the row itself:
///
/// | | lease | row lock | advisory lock |
/// |---|---|---|---|
/// | [`ready`](Self::ready) | due, not leased | due, **in work included** | due, **in work included** |
/// | [`scheduled`](Self::scheduled) | not yet due, not leased | not yet due | not yet due |
/// | [`in_flight`](Self::in_flight) | `Some`: leased (`locked_until` in the future) | `None` | `None` |
/// | [`dead`](Self::dead) | dead-lettered | dead-lettered | dead-lettered |
/// | [`completed`](Self::completed) | `Some` with [`Table::keep_completed`], else `None` | same | same |
///
/// Why `None`: a row lock lives in the database's lock manager (PostgreSQL keeps it in the
/// row's header, MySQL in InnoDB's lock table), not in a column, and a plain read sees a
/// locked row as it was before its transaction; counting it would take the locks of every
/// ready row (`FOR UPDATE SKIP LOCKED` and a difference), which would make concurrent claims
/// skip those rows and write to every ready row on PostgreSQL, or read server-specific lock
/// tables (`pg_locks` does not list row locks at all). An advisory lock is on a key, not a
/// row, and keys are shared by tables. So a row lock or advisory row in work is counted in
/// `ready` and `in_flight` is `None`.
///
/// A FIFO table's `ready` counts every due row of a group, though only the head of each
/// group can be claimed. Times are compared with the host's clock, in whole seconds, as the
/// claims compare them. The counts are a snapshot: rows move between states while it is read.
///
/// ```
/// use sqlbroker::{Broker, Message, Table};
/// use std::time::Duration;
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let t = Table::new("jobs").lease(Duration::from_secs(30));
/// broker.create_table(&t)?;
/// broker.publish(&t, Message::new(b"now".to_vec()))?;
/// broker.publish(&t, Message::new(b"later".to_vec()).deliver_after(Duration::from_secs(60)))?;
/// let stats = broker.stats(&t)?;
/// assert_eq!((stats.ready, stats.scheduled, stats.in_flight), (1, 1, Some(0)));
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// The form the description chose (what the counts mean, in the table above).
    pub form: Form,
    /// Rows a claim may take now: not dead-lettered, due (`run_at` not in the future) and, in
    /// the lease form, not leased. In the row lock and advisory lock forms, rows in work too.
    pub ready: u64,
    /// Rows not dead-lettered whose `run_at` is in the future (published with a delay, or
    /// retried with one) and, in the lease form, not leased.
    pub scheduled: u64,
    /// Rows in work. Lease form: `Some` (rows whose lease has not expired, `locked_until` in
    /// the future); row lock and advisory lock forms: `None` (their rows in work cannot be
    /// told apart cheaply and are counted in `ready`).
    pub in_flight: Option<u64>,
    /// Dead-lettered rows (`dead_at` set; on a table that keeps completed rows, not completed).
    pub dead: u64,
    /// Completed rows kept ([`Table::keep_completed`]); `None` on a table that deletes the
    /// rows it acks.
    pub completed: Option<u64>,
    /// How long the oldest ready row has been due (`now - run_at`, whole seconds); `None` when
    /// no row is ready. Row lock and advisory lock forms: rows in work included.
    pub oldest_ready_age: Option<Duration>,
    /// The table is paused ([`Broker::pause`]): its subscriptions claim nothing until it is
    /// resumed. False for a table with no recorded description.
    pub paused: bool,
    /// Tables with concurrency or rate limits ([`Table::concurrency_limit`],
    /// [`Table::rate_limit`]): claimable rows that a limit holds back now (a key at its max,
    /// or a key's window full), counted here and not in `ready`. In the row lock and advisory
    /// lock forms, where `ready` also counts the rows in work, the rows in work of a key at
    /// its max are left in `ready` (exactly with one concurrency limit; several full at once
    /// are an estimate), and those of a full window are counted here. `None` for other
    /// tables.
    pub limited: Option<u64>,
    /// Rows waiting on other jobs to settle ([`Table::dependencies`],
    /// [`Message::after`](crate::Message::after)), counted here and not in `scheduled`; 0 on a
    /// table without dependencies.
    pub waiting: u64,
}

impl QueueStats {
    /// Every row of the table: ready, limited, scheduled, waiting, in flight (where counted),
    /// dead and completed (where kept).
    pub fn total(&self) -> u64 {
        self.ready
            + self.limited.unwrap_or(0)
            + self.scheduled
            + self.waiting
            + self.in_flight.unwrap_or(0)
            + self.dead
            + self.completed.unwrap_or(0)
    }
}

impl Broker {
    /// Dead-lettered rows of `table`, oldest first, at most `limit`.
    pub fn dead_letters(&self, table: &Table, limit: usize) -> Result<Vec<DeadLetter>> {
        let q = self.queue(table)?;
        let limit = [Value::Int(limit.min(i64::MAX as usize) as i64)];
        let rows = q.retrying("dead letters", |conn| conn.query(&q.sql.dead_list, &limit))?;
        Ok(dead_letter_rows(&q, rows))
    }

    /// Puts a dead-lettered row back in the queue, due now, with a fresh attempt count (its next
    /// delivery reads attempt 1), so a row that ran out of [`Table::max_attempts`] gets them all
    /// again. Returns false if no dead-lettered row has that id.
    ///
    /// On a table with [`dependencies`](Table::dependencies), a requeue means for a chain:
    /// - the job is **live again** for the jobs that wait on it: a job published after it
    ///   waits for it as for any job not yet settled (the jobs already dead-lettered through
    ///   it stay dead letters until they are requeued themselves);
    /// - a job that waits on others **waits for them again**, each read as a new publish reads
    ///   it: ready if all have settled as its waits ask, waiting while one has not (a parent
    ///   requeued before it, for one), and never run before a parent it waits on with
    ///   [`Message::after`](crate::Message::after) is acked. One of those still dead-lettered
    ///   (or cancelled) refuses the requeue with [`BrokerError::ParentFailed`], changing
    ///   nothing: requeued, it would be dead-lettered again at once.
    ///
    /// [`BrokerError::ParentFailed`]: crate::BrokerError::ParentFailed
    pub fn requeue_dead(&self, table: &Table, id: i64) -> Result<bool> {
        let q = self.queue(table)?;
        let done = requeue_one(&q, id)?;
        if done {
            self.announce(&q, 1);
        }
        Ok(done)
    }

    /// The table's rows by state: ready, scheduled, in flight (lease form only), dead, and
    /// the age of the oldest ready row, and whether it is paused (a second statement, on the
    /// registry). One statement for the counts (a scan of the table, filtered
    /// aggregates: `COUNT(*) FILTER (..)` on PostgreSQL and SQLite, `COUNT(CASE ..)` on
    /// MySQL), no locks taken. See [`QueueStats`] for exactly what each count holds per form.
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// broker.publish(&jobs, Message::new(b"now".to_vec()))?;
    /// broker.publish(&jobs, Message::new(b"later".to_vec()).deliver_after(Duration::from_secs(3600)))?;
    ///
    /// let stats = broker.stats(&jobs)?;
    /// assert_eq!((stats.ready, stats.scheduled, stats.in_flight, stats.dead), (1, 1, Some(0), 0));
    /// assert!(stats.oldest_ready_age.is_some());
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn stats(&self, table: &Table) -> Result<QueueStats> {
        let q = self.queue(table)?;
        let now = schedule::claim_now(SystemTime::now());
        let params = [Value::Time(now)];
        // A table dropped since this broker checked it (or never made) fails as such
        // (`BrokerError::is_missing_table`), not as a driver's error: a tool listing every
        // recorded table tells a stale record from a failing count by it.
        let rows = q
            .retrying("stats", |conn| conn.query(&q.sql.stats, &params))
            .map_err(|e| match q.conn("stats") {
                Ok(mut conn) => q.explain_failure(&mut *conn, e),
                Err(_) => e,
            })?;
        let row = rows.into_iter().next().unwrap_or_default();
        let count = |i: usize| {
            row.get(i)
                .and_then(Value::as_i64)
                .unwrap_or_default()
                .max(0) as u64
        };
        let oldest = row.get(4).and_then(Value::as_time);
        let paused = crate::runtime::registry::recorded_pause(&q)?;
        let limited = match q.sql.flow_ready.is_some() {
            true => Some(q.retrying("stats", |conn| {
                let (limits, rates) = crate::runtime::usage::maxes_in_force(&q, conn)?;
                Ok(crate::runtime::usage::usage(&q, conn, &limits, &rates)?.held_back)
            })?),
            false => None,
        };
        let waiting = match &q.sql.waiting {
            Some(w) => {
                let latest = [Value::Time(crate::runtime::deps::waiting_due())];
                let rows = q.retrying("stats", |conn| conn.query(&w.count_waiting, &latest))?;
                let n = rows.first().and_then(|r| r.first()).and_then(Value::as_i64);
                n.unwrap_or(0).max(0) as u64
            }
            None => 0,
        };
        Ok(QueueStats {
            form: q.spec.form,
            limited,
            ready: count(0).saturating_sub(limited.unwrap_or(0)),
            scheduled: count(1).saturating_sub(waiting),
            waiting,
            in_flight: (q.spec.form == Form::Lease).then(|| count(2)),
            dead: count(3),
            completed: q.spec.completed_at.is_some().then(|| count(5)),
            oldest_ready_age: oldest.map(|t| now.duration_since(t).unwrap_or_default()),
            paused,
        })
    }

    /// [`stats`](Broker::stats) of each queue of a table described with [`Table::queues`], by
    /// queue name, in one scan. Per queue, `limited` is `None` and `waiting` 0 (rows a limit
    /// holds back are counted in `ready`, rows waiting on other jobs in `scheduled`: both are
    /// the table's, in its [`stats`](Broker::stats)); `paused` is true if the table or the
    /// queue is paused ([`Broker::pause_queue`]). A queue with no row is not listed.
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidTable`] for a table without queues; a database error.
    pub fn queue_stats(&self, table: &Table) -> Result<Vec<(String, QueueStats)>> {
        Ok(self
            .grouped_stats(table, "queue")?
            .into_iter()
            .map(|(q, s)| {
                (
                    q.unwrap_or_else(|| crate::model::table::DEFAULT_QUEUE.into()),
                    s,
                )
            })
            .collect())
    }

    /// [`stats`](Broker::stats) of each job kind of a table described with [`Table::kinds`],
    /// `None` for the rows published with no kind, as [`queue_stats`](Broker::queue_stats)
    /// counts them. A kind with ready rows that no running [`Worker`](crate::Worker) handles
    /// stays ready: this is where it shows.
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidTable`] for a table without kinds; a database error.
    pub fn kind_stats(&self, table: &Table) -> Result<Vec<(Option<String>, QueueStats)>> {
        self.grouped_stats(table, "kind")
    }

    fn grouped_stats(
        &self,
        table: &Table,
        what: &'static str,
    ) -> Result<Vec<(Option<String>, QueueStats)>> {
        let q = self.queue(table)?;
        let sql = match what {
            "queue" => &q.sql.stats_by_queue,
            _ => &q.sql.stats_by_kind,
        };
        let Some(sql) = sql else {
            return Err(BrokerError::InvalidTable {
                table: table.name().to_string(),
                reason: format!("a table without {what}s has no {what} counts (Table::{what}s)"),
            });
        };
        let now = schedule::claim_now(SystemTime::now());
        let rows = q.retrying("stats", |conn| conn.query(sql, &[Value::Time(now)]))?;
        let paused = crate::runtime::registry::recorded_pause(&q)?;
        let paused_queues = match what {
            "queue" => self.paused_queues(table)?,
            _ => Vec::new(),
        };
        let mut out = Vec::new();
        for row in rows {
            let count = |i: usize| {
                row.get(i + 1)
                    .and_then(Value::as_i64)
                    .unwrap_or_default()
                    .max(0) as u64
            };
            let name = match row.first() {
                Some(Value::Text(t)) => Some(t.clone()),
                _ => None,
            };
            let oldest = row.get(5).and_then(Value::as_time);
            let queue_paused = name.as_ref().is_some_and(|n| paused_queues.contains(n));
            out.push((
                name,
                QueueStats {
                    form: q.spec.form,
                    limited: None,
                    ready: count(0),
                    scheduled: count(1),
                    waiting: 0,
                    in_flight: (q.spec.form == Form::Lease).then(|| count(2)),
                    dead: count(3),
                    completed: q.spec.completed_at.is_some().then(|| count(5)),
                    oldest_ready_age: oldest.map(|t| now.duration_since(t).unwrap_or_default()),
                    paused: paused || queue_paused,
                },
            ));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// A page of dead-lettered rows by id: those with an id above `after` (`None`: from the
    /// first), at most `limit`, lowest id first. Pass the last id of a page as `after` to
    /// read the next; a page shorter than `limit` is the last.
    ///
    /// ```
    /// use sqlbroker::{Broker, Table};
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(std::time::Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// let mut after = None;
    /// loop {
    ///     let page = broker.dead_letters_after(&jobs, after, 100)?;
    ///     for d in &page {
    ///         println!("{} {}", d.id, d.reason);
    ///     }
    ///     match page.last() {
    ///         Some(last) if page.len() == 100 => after = Some(last.id),
    ///         _ => break,
    ///     }
    /// }
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn dead_letters_after(
        &self,
        table: &Table,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        let q = self.queue(table)?;
        let params = [
            Value::Int(after.unwrap_or(i64::MIN)),
            Value::Int(limit.min(i64::MAX as usize) as i64),
        ];
        let rows = q.retrying("dead letters", |conn| conn.query(&q.sql.dead_page, &params))?;
        Ok(dead_letter_rows(&q, rows))
    }

    /// Puts every dead-lettered row back in the queue as [`requeue_dead`](Self::requeue_dead)
    /// does one (due now, attempts reset); returns how many. Works through the table by id in
    /// batches of at most 1,000 rows, each its own short statement, so it never holds a long
    /// lock on a large table; rows dead-lettered while it runs, with ids it has passed, stay
    /// dead. Stopped by an error, the batches done stay done.
    ///
    /// On a table with [`dependencies`](Table::dependencies), one by one in id order (each
    /// in a transaction of its own, as [`requeue_dead`](Self::requeue_dead) does one): the
    /// jobs a job waits on in its own table have lower ids, so a failed chain requeued whole
    /// runs in order again (its first job ready, the others waiting, each released by the ack
    /// of the one before). A job waiting on one still dead (another table's, not requeued) is
    /// left dead and not counted.
    pub fn requeue_all_dead(&self, table: &Table) -> Result<u64> {
        let q = self.queue(table)?;
        if q.spec.dependencies {
            let n = requeue_all_waiting(&q)?;
            if n > 0 {
                self.announce(&q, usize::try_from(n).unwrap_or(usize::MAX));
            }
            return Ok(n);
        }
        let n = in_batches(
            &q,
            "requeue all dead",
            &q.sql.dead_bound,
            &[],
            |conn, after, upto| {
                let now = schedule::due_at(SystemTime::now(), Duration::ZERO);
                let params = [Value::Time(now), Value::Int(after), Value::Int(upto)];
                conn.execute(&q.sql.dead_requeue_range, &params)
            },
        )?;
        if n > 0 {
            let rows = usize::try_from(n).unwrap_or(usize::MAX);
            self.announce(&q, rows);
        }
        Ok(n)
    }

    /// Deletes the row `id` if it is dead-lettered; false if no dead-lettered row has that id
    /// (a live row is never deleted).
    ///
    /// On a table with [`dependencies`](Table::dependencies), the purged job's outcome is
    /// recorded in its head in `sqlbroker_deps` (its row no longer tells it), kept a day, so a
    /// job published after it within that day is dead-lettered as before the purge; its own
    /// waits go with it.
    pub fn purge_dead(&self, table: &Table, id: i64) -> Result<bool> {
        let q = self.queue(table)?;
        if let Some((deps, waiting)) = crate::runtime::deps::statements(&q.sql) {
            let at = Value::Int(crate::model::schedule::millis(SystemTime::now()));
            let name = Value::Text(q.spec.name.clone());
            let range = [Value::Int(id.saturating_sub(1)), Value::Int(id)];
            let n = q.retrying("purge dead", |conn| {
                in_transaction(&q, conn, |conn| {
                    let dead = Value::Text(crate::dialect::deps::DEAD.into());
                    let heads = [dead, at.clone(), range[0].clone(), range[1].clone()];
                    conn.execute(&waiting.heads_dead, &heads)?;
                    let n = conn.execute(&q.sql.dead_purge, &[Value::Int(id)])?;
                    // Only a purged job's waits: a live job named by mistake keeps its own.
                    if n > 0 {
                        conn.execute(&deps.forget_waits, &[name.clone(), Value::Int(id)])?;
                    }
                    Ok(n)
                })
            })?;
            return Ok(n > 0);
        }
        let params = [Value::Int(id)];
        let n = q.retrying("purge dead", |conn| {
            conn.execute(&q.sql.dead_purge, &params)
        })?;
        Ok(n > 0)
    }

    /// Deletes every dead-lettered row (and no other); returns how many. In batches of at
    /// most 1,000 rows by id, as [`requeue_all_dead`](Self::requeue_all_dead).
    ///
    /// On a table with [`dependencies`](Table::dependencies), each batch in a transaction
    /// that first records the outcome of the rows it purges in their heads, as
    /// [`purge_dead`](Self::purge_dead) does, and then forgets their waits.
    pub fn purge_all_dead(&self, table: &Table) -> Result<u64> {
        let q = self.queue(table)?;
        let waits = crate::runtime::deps::statements(&q.sql).map(|(_, w)| w);
        let name = Value::Text(q.spec.name.clone());
        in_batches(
            &q,
            "purge all dead",
            &q.sql.dead_bound,
            &[],
            |conn, after, upto| {
                let range = [Value::Int(after), Value::Int(upto)];
                let Some(waiting) = waits else {
                    return conn.execute(&q.sql.dead_purge_range, &range);
                };
                in_transaction(&q, conn, |conn| {
                    let at = crate::model::schedule::millis(SystemTime::now());
                    let dead = Value::Text(crate::dialect::deps::DEAD.into());
                    let heads = [dead, Value::Int(at), range[0].clone(), range[1].clone()];
                    conn.execute(&waiting.heads_dead, &heads)?;
                    let n = conn.execute(&q.sql.dead_purge_range, &range)?;
                    let gone = [name.clone(), range[0].clone(), range[1].clone()];
                    conn.execute(&waiting.forget_gone, &gone)?;
                    Ok(n)
                })
            },
        )
    }

    /// A page of the completed rows a table keeps ([`Table::keep_completed`]): those with an
    /// id above `after` (`None`: from the first), at most `limit`, lowest id first.
    /// [`BrokerError::InvalidTable`] on a table that does
    /// not keep them.
    pub fn completed_after(
        &self,
        table: &Table,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Completed>> {
        let q = self.queue(table)?;
        keeps_completed(&q)?;
        let params = [
            Value::Int(after.unwrap_or(i64::MIN)),
            Value::Int(limit.min(i64::MAX as usize) as i64),
        ];
        let rows = q.retrying("completed", |conn| {
            conn.query(&q.sql.completed_page, &params)
        })?;
        let names: Vec<String> = q.spec.columns.iter().map(|c| c.name.clone()).collect();
        Ok(rows
            .into_iter()
            .map(|row| {
                let mut it = row.into_iter();
                let id = it.next().and_then(|v| v.as_i64()).unwrap_or_default();
                let attempts = it.next().and_then(|v| v.as_i64()).unwrap_or_default();
                let payload = it.next().map(Value::into_payload).unwrap_or_default();
                let completed_at = it
                    .next()
                    .and_then(|v| v.as_time())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                Completed {
                    id,
                    attempts: attempts.clamp(0, u32::MAX as i64) as u32,
                    payload,
                    completed_at,
                    values: names.iter().cloned().zip(q.spec.typed_values(it)).collect(),
                }
            })
            .collect())
    }

    /// Deletes the completed rows kept longer than the table's retention
    /// ([`Table::keep_completed`]): those whose completion time is more than the retention
    /// before now (the host's clock, whole seconds); returns how many. In batches of at most
    /// 1,000 rows by id, each its own statement. The database's elected maintainer
    /// ([`BrokerBuilder::maintenance`](crate::BrokerBuilder::maintenance)) calls the same
    /// prune by itself; this one is for an operator who wants it now (`sqlbroker completed
    /// prune`).
    ///
    /// On a table with [`dependencies`](Table::dependencies), each batch in a transaction that
    /// first records, in their heads (kept a day), that the cancelled rows it prunes were
    /// cancelled: a job published after one within that day is dead-lettered as before.
    /// [`BrokerError::InvalidTable`] on a table that does
    /// not keep completed rows.
    pub fn prune_completed(&self, table: &Table) -> Result<u64> {
        let q = self.queue(table)?;
        keeps_completed(&q)?;
        crate::runtime::retention::prune_completed(&q, SystemTime::now(), &mut || true)
    }
}

/// Requeues dead letter `id` as [`Broker::requeue_dead`] does, waking no one: true if it was
/// requeued.
pub(crate) fn requeue_one(q: &Queue, id: i64) -> Result<bool> {
    if q.spec.dependencies {
        return requeue_waiting(q, id);
    }
    let now = crate::model::schedule::due_at(SystemTime::now(), Duration::ZERO);
    // Only a dead row matches: running it twice changes nothing more.
    let params = [Value::Time(now), Value::Int(id)];
    let n = q.retrying("requeue", |conn| conn.execute(&q.sql.dead_requeue, &params))?;
    Ok(n > 0)
}

/// Requeues dead letter `id` of a table with dependencies ([`Broker::requeue_dead`]), in a
/// transaction of its own: true if it was requeued, false if no dead letter has that id,
/// [`BrokerError::ParentFailed`] (rolled back) if it waits
/// on a job still dead-lettered or cancelled.
fn requeue_waiting(q: &Queue, id: i64) -> Result<bool> {
    use crate::runtime::deps::Requeued;
    let now = schedule::due_at(SystemTime::now(), Duration::ZERO);
    let mut conn = q.conn("requeue")?;
    let run = |conn: &mut dyn DbConn| -> Result<Requeued, DbError> {
        conn.batch(&q.sql.begin_write)?;
        let done =
            crate::runtime::deps::requeue(&q.spec, &q.sql, q, conn, &q.sql.dead_requeue, now, id)?;
        match done {
            Requeued::Done => conn.batch("COMMIT")?,
            _ => conn.batch("ROLLBACK")?,
        }
        Ok(done)
    };
    match run(&mut *conn) {
        Ok(Requeued::Done) => Ok(true),
        Ok(Requeued::NotDead) => Ok(false),
        Ok(Requeued::ParentFailed {
            table,
            parent,
            outcome,
        }) => Err(crate::error::BrokerError::ParentFailed {
            table: q.spec.name.clone(),
            id,
            parent_table: table,
            parent,
            outcome: crate::runtime::deps::ended(&outcome).to_string(),
        }),
        Err(e) => {
            conn.rollback_or_discard();
            Err(q.err("requeue")(e))
        }
    }
}

/// Requeues every dead letter of a table with dependencies, one by one in id order
/// ([`Broker::requeue_all_dead`]); the number requeued. One that waits on a job still dead
/// is left dead.
fn requeue_all_waiting(q: &Queue) -> Result<u64> {
    let Some((_, waiting)) = crate::runtime::deps::statements(&q.sql) else {
        return Ok(0);
    };
    let mut after = i64::MIN;
    let mut total = 0;
    loop {
        let params = [Value::Int(after), Value::Int(BATCH as i64)];
        let ids: Vec<i64> = q
            .retrying("requeue all dead", |conn| {
                conn.query(&waiting.dead_after, &params)
            })?
            .iter()
            .filter_map(|r| r.first()?.as_i64())
            .collect();
        for &id in &ids {
            match requeue_waiting(q, id) {
                Ok(true) => total += 1,
                Ok(false) => {}
                Err(crate::error::BrokerError::ParentFailed { .. }) => {
                    log::info!(
                        "table {}: dead letter {id} left dead: a job it waits on is still dead",
                        q.spec.name
                    );
                }
                Err(e) => return Err(e),
            }
        }
        match ids.last() {
            Some(last) if ids.len() == BATCH => after = *last,
            _ => return Ok(total),
        }
    }
}

/// A completed row a table keeps ([`Broker::completed_after`]).
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct Completed {
    /// The row's id.
    pub id: i64,
    /// Attempts the row used (the row lock form counts an attempt when it is retried, so
    /// there the successful one is not counted).
    pub attempts: u32,
    /// The body.
    pub payload: Vec<u8>,
    /// When it was acked (the database server's clock, whole seconds).
    pub completed_at: SystemTime,
    /// The table's own columns, by name.
    pub values: Vec<(String, Value)>,
}

impl std::fmt::Debug for Completed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completed")
            .field("id", &self.id)
            .field("attempts", &self.attempts)
            .field("payload", &crate::model::value::Payload(&self.payload))
            .field("completed_at", &self.completed_at)
            .field("values", &self.values)
            .finish()
    }
}

impl Completed {
    /// The value of a column of the table's description.
    pub fn get(&self, column: &str) -> Option<&Value> {
        self.values
            .iter()
            .find(|(c, _)| c == column)
            .map(|(_, v)| v)
    }
}

/// Refuses a table that does not keep completed rows.
fn keeps_completed(q: &Queue) -> Result<()> {
    if q.spec.completed_at.is_some() {
        return Ok(());
    }
    Err(crate::error::BrokerError::InvalidTable {
        table: q.spec.name.clone(),
        reason: "the table does not keep completed rows (Table::keep_completed)".into(),
    })
}

/// A dead-lettered row ([`Broker::dead_letters`]).
///
/// ```
/// use sqlbroker::{Broker, Message, Table};
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let t = Table::new("jobs").lease(std::time::Duration::from_secs(30));
/// broker.create_table(&t)?;
/// broker.publish(&t, Message::new(b"bad".to_vec()))?;
/// let sub = broker.subscription(&t).start()?;
/// sub.next_delivery().unwrap().dead_letter("cannot parse")?;
/// let dead = broker.dead_letters(&t, 10)?;
/// assert_eq!((dead[0].payload.as_slice(), dead[0].reason.as_str()), (&b"bad"[..], "cannot parse"));
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The row's id.
    pub id: i64,
    /// Attempts the row used.
    pub attempts: u32,
    /// The body.
    pub payload: Vec<u8>,
    /// When it was dead-lettered (whole seconds).
    pub dead_at: SystemTime,
    /// The reason given to [`Delivery::dead_letter`](crate::Delivery::dead_letter).
    pub reason: String,
    /// The text of the row's last failure, if it had one ([`Job::last_error`](crate::Job::last_error)).
    pub last_error: Option<String>,
    /// Failures the row recorded ([`Job::errors`](crate::Job::errors)).
    pub errors: u32,
    /// The table's own columns, by name.
    pub values: Vec<(String, Value)>,
}

impl std::fmt::Debug for DeadLetter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetter")
            .field("id", &self.id)
            .field("attempts", &self.attempts)
            .field("payload", &crate::model::value::Payload(&self.payload))
            .field("dead_at", &self.dead_at)
            .field("reason", &self.reason)
            .field("last_error", &self.last_error)
            .field("errors", &self.errors)
            .field("values", &self.values)
            .finish()
    }
}

/// Dead letters from rows of the `dead_list` layout.
pub(crate) fn dead_letter_rows(q: &Queue, rows: Vec<Vec<Value>>) -> Vec<DeadLetter> {
    let names: Vec<String> = q.spec.columns.iter().map(|c| c.name.clone()).collect();
    rows.into_iter()
        .map(|row| {
            let mut it = row.into_iter();
            let id = it.next().and_then(|v| v.as_i64()).unwrap_or_default();
            let attempts = it
                .next()
                .and_then(|v| v.as_i64())
                .unwrap_or_default()
                .clamp(0, u32::MAX as i64) as u32;
            let payload = it.next().map(Value::into_payload).unwrap_or_default();
            let dead_at = it
                .next()
                .and_then(|v| v.as_time())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            let reason = match it.next() {
                Some(Value::Text(s)) => s,
                _ => String::new(),
            };
            let last_error = match it.next() {
                Some(Value::Text(s)) => Some(s),
                _ => None,
            };
            let errors = it
                .next()
                .and_then(|v| v.as_i64())
                .unwrap_or_default()
                .clamp(0, u32::MAX as i64) as u32;
            let values = names.iter().cloned().zip(q.spec.typed_values(it)).collect();
            DeadLetter {
                id,
                attempts,
                payload,
                dead_at,
                reason,
                last_error,
                errors,
                values,
            }
        })
        .collect()
}

impl DeadLetter {
    /// The text of the row's last failure (at most [`LAST_ERROR_MAX`](crate::LAST_ERROR_MAX)
    /// characters), if it failed before it was dead-lettered: the reason says why it ended,
    /// this what went wrong last.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// The value of a column of the table's description.
    pub fn get(&self, column: &str) -> Option<&Value> {
        self.values
            .iter()
            .find(|(c, _)| c == column)
            .map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    /// A dead letter's payload shows as a byte string, not a list of numbers.
    #[test]
    fn a_dead_letter_shows_its_payload_as_bytes() {
        let d = super::DeadLetter {
            id: 7,
            attempts: 1,
            payload: b"{\"a\":1}".to_vec(),
            dead_at: std::time::UNIX_EPOCH,
            reason: "bad".into(),
            last_error: None,
            errors: 0,
            values: Vec::new(),
        };
        assert!(
            format!("{d:?}").contains(r#"payload: b"{\"a\":1}""#),
            "{d:?}"
        );
    }
}
