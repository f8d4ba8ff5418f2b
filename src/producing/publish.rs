//! Publishing: [`Broker::publish`] and [`Broker::publish_batch`] (on a pooled connection) and
//! the transactional publish the driver modules call (on the application's own transaction),
//! sharing the parameters, dedup keys and batches split to the database's parameter limit.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use parking_lot::Mutex;

use crate::broker::Broker;
use crate::dialect::{DbConn, Dialect, TableSql};
use crate::error::{BrokerError, DbError, Result};
use crate::model::table::{Table, TableSpec};
use crate::model::value::Value;
use crate::producing::message::Message;
use crate::runtime::deps;
use crate::runtime::update::{apply, keyed_column, Changes, Updated};
use crate::runtime::{retrying_deadlocks, Queue};

/// Where a publish writes: a table's validated description, its SQL, and its database.
pub(crate) struct Target<'a> {
    pub spec: &'a TableSpec,
    pub sql: &'a TableSql,
    pub dialect: &'a dyn Dialect,
    /// Other tables' waiting statements, for a job named whose row went without a settlement
    /// (its waiting jobs are settled by the publish that finds it).
    pub others: &'a dyn deps::OtherTables,
    /// Other tables a message names ([`Message::after_in`]) are checked against their
    /// records (false where the connection cannot read them: Diesel's).
    pub check_records: bool,
    /// The broker's queue of the table, where the publish is [`Broker::publish`]'s: a message
    /// that replaces a waiting job ([`Message::replace_waiting`]) needs it.
    pub queue: Option<&'a Queue>,
}

impl<'a> Target<'a> {
    /// Where a publish on `q`'s table writes.
    pub fn of(q: &'a Queue) -> Self {
        Target {
            spec: &q.spec,
            sql: &q.sql,
            dialect: &*q.dialect,
            others: q,
            check_records: true,
            queue: Some(q),
        }
    }

    pub(crate) fn err(&self, e: DbError) -> BrokerError {
        e.during("publish", &self.spec.name)
    }
}

/// Publishes one message on `conn`; its id, or [`BrokerError::Duplicate`] when its dedup key
/// is held.
///
/// A message that waits on other jobs runs several statements: the caller runs it in a
/// transaction ([`waits_on_others`]).
pub(crate) fn one(t: &Target<'_>, conn: &mut dyn DbConn, message: Message) -> Result<i64> {
    // Current while the row is made: the trace context a publish fills is this span's.
    #[cfg(feature = "tracing")]
    let span = crate::runtime::trace::send_span(&t.spec.name, 1);
    #[cfg(feature = "tracing")]
    let _entered = span.enter();
    let key = message.dedup_value().map(str::to_owned);
    let replace = message.replaces();
    if replace {
        check_replace(t, &message)?;
    }
    let period = message.unique_period();
    if let Some(d) = period {
        check_unique(t, &message, d)?;
    }
    let parents = message.parents().to_vec();
    let waits = match !waits_on_others(&message) {
        true => None,
        false => Some(read_waits(t, conn, &message, &parents)?),
    };
    let mut params = Vec::with_capacity(t.spec.insert_width());
    message.params_into(t.spec, SystemTime::now(), &mut params)?;
    if let Some(w) = &waits {
        if w.waiting() || w.failed(&t.spec.name).is_some() {
            params[1] = Value::Time(deps::waiting_due());
        }
    }
    let id = match key {
        Some(key) => match (period, t.queue) {
            (Some(d), Some(_)) => unique_keyed(t, conn, &params, key, d)?,
            _ => keyed(t, conn, &params, key, replace)?,
        },
        None => t
            .dialect
            .insert_returning_id(conn, t.sql, &params)
            .map_err(|e| t.err(e))?,
    };
    if let Some(w) = waits {
        w.write(t.spec, t.sql, conn, id).map_err(|e| t.err(e))?;
    }
    #[cfg(feature = "tracing")]
    crate::runtime::trace::record_id(&span, id);
    Ok(id)
}

/// True if `message` waits on other jobs: its publish must run in a transaction.
pub(crate) fn waits_on_others(message: &Message) -> bool {
    !message.parents().is_empty() || message.signal_wait() != (None, None)
}

/// Checks a message that waits on `parents` and reads where they stand, their heads locked.
fn read_waits(
    t: &Target<'_>,
    conn: &mut dyn DbConn,
    message: &Message,
    parents: &[deps::Parent],
) -> Result<deps::Waits> {
    let bad = |reason: String| BrokerError::InvalidMessage {
        table: t.spec.name.clone(),
        reason,
    };
    let (Some(own), true) = (t.sql.waiting.as_ref(), t.spec.dependencies) else {
        return Err(bad(
            "Message::after or after_signal for a table without dependencies (describe it \
             with Table::dependencies)"
                .into(),
        ));
    };
    let signal =
        match message.signal_wait() {
            (None, Some(_)) => return Err(bad(
                "Message::wait_timeout without Message::after_signal: it bounds the wait for a \
                 signal"
                    .into(),
            )),
            (Some(name), timeout) => {
                crate::dialect::signals::check_name(name).map_err(bad)?;
                Some((name, timeout))
            }
            (None, None) => None,
        };
    if message.delay() != std::time::Duration::ZERO || message.due().is_some() {
        return Err(bad(
            "a message that waits on other jobs is due as they settle: it takes no delay".into(),
        ));
    }
    // Other tables' statements, compiled once per process and description, and checked
    // against their records as the broker checks its own tables: a description that says
    // `dependencies()` of a table recorded without them would wait for ever.
    let mut others = Vec::new();
    for p in parents {
        if let Some(table) = p.table.as_deref().filter(|pt| pt.name() != t.spec.name) {
            let c = compiled(t.dialect, table)?;
            if !c.spec.dependencies {
                return Err(bad(format!(
                    "Message::after_in names a job of table {}, which is not described with \
                     Table::dependencies (its settlements would release nothing)",
                    c.spec.name
                )));
            }
            let no_record = || {
                bad(format!(
                    "Message::after_in names a job of table {}, which has no record (made by \
                     Broker::create_table or Broker::migrate): its settlements could not be \
                     known to release anything",
                    c.spec.name
                ))
            };
            if t.check_records && !check_other(t.dialect, conn, &c, table)? {
                return Err(no_record());
            }
            // Its table dropped by hand (its record left): its jobs will never run, they count
            // as cancelled. One dropped by `drop_table` has no record, as one never made.
            let gone = t.check_records && !exists(t, conn, &c.spec.name)?;
            if gone && !has_record(t.dialect, conn, &c.spec.name)? {
                return Err(no_record());
            }
            others.push((c, gone));
        }
    }
    let mut other = others.iter();
    let mut named = Vec::with_capacity(parents.len());
    for p in parents {
        let foreign = p
            .table
            .as_deref()
            .is_some_and(|pt| pt.name() != t.spec.name);
        let (table, waiting, gone) = match foreign.then(|| other.next()).flatten() {
            Some((c, gone)) => match c.sql.waiting.as_ref() {
                Some(w) => (c.spec.name.as_str(), w, *gone),
                None => continue,
            },
            None => (t.spec.name.as_str(), own, false),
        };
        named.push(deps::Named {
            table,
            waiting,
            parent: p,
            gone,
        });
    }
    let mut waits = deps::Waits::read(t.sql, t.others, conn, named).map_err(|e| t.err(e))?;
    if let (Some((name, timeout)), Some(d)) = (signal, t.sql.deps.as_ref()) {
        let read = crate::runtime::signals::read_for_publish(d, conn, &t.spec.name, name)
            .map_err(|e| t.err(e))?;
        waits.add_signal(read, crate::runtime::signals::deadline(timeout));
    }
    Ok(waits)
}

/// True if table `name` exists, read in the publish's transaction.
fn exists(t: &Target<'_>, conn: &mut dyn DbConn, name: &str) -> Result<bool> {
    let rows = conn
        .query(t.dialect.columns_query(), &[Value::Text(name.to_string())])
        .map_err(|e| t.err(e))?;
    Ok(!rows.is_empty())
}

/// True if table `name` has a record (one this release cannot read counts).
fn has_record(dialect: &dyn Dialect, conn: &mut dyn DbConn, name: &str) -> Result<bool> {
    match crate::runtime::registry::open(dialect, conn, name) {
        Ok(found) => Ok(found.is_some()),
        Err(BrokerError::Schema { .. }) => Ok(true),
        Err(e) => Err(e),
    }
}

/// Refuses a message that replaces a waiting job ([`Message::replace_waiting`]) where it cannot:
/// without a dedup key, waiting on other jobs, or outside [`Broker::publish`].
fn check_replace(t: &Target<'_>, message: &Message) -> Result<()> {
    let why = if message.dedup_value().is_none() || t.spec.dedup_key.is_none() {
        "Message::replace_waiting replaces the job holding the message's dedup key: give it \
         one (Message::dedup_key, on a table described with Table::dedup)"
    } else if !message.parents().is_empty() || message.signal_wait().0.is_some() {
        "Message::replace_waiting with Message::after or Message::after_signal: a job that \
         waits on others or on a signal is not replaced"
    } else if t.queue.is_none() {
        "Message::replace_waiting is for Broker::publish, not a group's publish or one \
         inside the application's transaction"
    } else {
        return Ok(());
    };
    Err(BrokerError::InvalidMessage {
        table: t.spec.name.clone(),
        reason: why.into(),
    })
}

/// Refuses a message with a unique period ([`Message::unique_for`]) where it cannot hold.
fn check_unique(t: &Target<'_>, message: &Message, d: std::time::Duration) -> Result<()> {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    let why = if message.dedup_value().is_none() || t.spec.dedup_key.is_none() {
        "Message::unique_for keeps the message's dedup key taken: give it one \
         (Message::dedup_key, on a table described with Table::dedup)"
            .to_string()
    } else if t.spec.completed_at.is_none() || t.spec.retention_secs < secs {
        format!(
            "Message::unique_for({d:?}) counts from the finish of the key's last job, which the \
             table must keep that long: describe it with Table::keep_completed of at least \
             {secs} s"
        )
    } else if t.spec.dead_retention_secs.is_some_and(|r| r < secs) {
        format!(
            "Message::unique_for({d:?}): the table's Table::keep_dead prunes dead letters \
             before the period ends (at least {secs} s)"
        )
    } else if message.replaces() || !message.parents().is_empty() || t.queue.is_none() {
        "Message::unique_for is for Broker::publish, without Message::replace_waiting or \
         Message::after, not a batch, a group's publish or one inside the application's \
         transaction"
            .to_string()
    } else {
        return Ok(());
    };
    Err(BrokerError::InvalidMessage {
        table: t.spec.name.clone(),
        reason: why,
    })
}

/// Unique publishes in this process: every [`SWEEP_EVERY`]th sweeps its table's keys whose
/// job is gone from `sqlbroker_unique`.
static UNIQUE_PUBLISHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How often a unique publish sweeps `sqlbroker_unique` ([`UNIQUE_PUBLISHES`]).
const SWEEP_EVERY: u64 = 64;

/// Publishes a keyed message with a unique period `d` ([`Message::unique_for`]), in a
/// transaction of its own: a [`BrokerError::Duplicate`] while the key's last job published
/// with a period is unfinished or finished less than `d` ago, else as [`keyed`], recording the
/// new job as the key's last in `sqlbroker_unique`. Two such publishes at once meet in the
/// table's unique index, as any two keyed ones: one makes the row, the other is a duplicate.
fn unique_keyed(
    t: &Target<'_>,
    conn: &mut dyn DbConn,
    params: &[Value],
    key: String,
    d: std::time::Duration,
) -> Result<i64> {
    let Some(q) = t.queue else {
        return Err(BrokerError::InvalidMessage {
            table: t.spec.name.clone(),
            reason: "Message::unique_for is for Broker::publish".into(),
        });
    };
    let u = q
        .unique_sql
        .get_or_init(|| t.dialect.syntax().unique_sql(t.spec, t.dialect.database()));
    // Made on first use, outside the transaction (MySQL commits around DDL), once per broker
    // and table (never by a broker that runs no DDL). Two sessions making it at once on
    // PostgreSQL may collide in its catalog: once more.
    if !q.unique_made.load(std::sync::atomic::Ordering::Acquire) {
        if conn.batch(&u.create).is_err() {
            conn.batch(&u.create).map_err(|e| t.err(e))?;
        }
        q.unique_made
            .store(true, std::sync::atomic::Ordering::Release);
    }
    let names = [Value::Text(t.spec.name.clone()), Value::Text(key.clone())];
    let run = |conn: &mut dyn DbConn| -> Result<i64> {
        let now = SystemTime::now();
        let last = conn.query(&u.holder, &names).map_err(|e| t.err(e))?;
        if let Some(h) = last.first().and_then(|r| r.first()?.as_i64()) {
            let row = conn
                .query(&t.sql.job, &[Value::Int(h)])
                .map_err(|e| t.err(e))?;
            // `job`'s fifth column: the finish time (`None` while it is live).
            if let Some(row) = row.into_iter().next() {
                let held = match row.get(4).and_then(Value::as_time) {
                    None => true,
                    Some(finished) => match finished.checked_add(d) {
                        Some(end) => end > now,
                        None => true,
                    },
                };
                if held {
                    return Err(BrokerError::Duplicate {
                        table: t.spec.name.clone(),
                        id: h,
                    });
                }
            }
        }
        let id = keyed(t, conn, params, key.clone(), false)?;
        conn.execute(&u.forget, &names).map_err(|e| t.err(e))?;
        let mut row = names.to_vec();
        row.push(Value::Int(id));
        conn.execute(&u.insert, &row).map_err(|e| t.err(e))?;
        Ok(id)
    };
    let id = retrying_deadlocks(|| in_own_transaction(t, &mut *conn, run))?;
    use std::sync::atomic::Ordering;
    if UNIQUE_PUBLISHES.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
        if let Err(e) = conn.execute(&u.sweep, &names[..1]) {
            log::debug!("sweep of sqlbroker_unique for table {}: {e}", t.spec.name);
        }
    }
    Ok(id)
}

/// What replacing the waiting job holding the key writes ([`Message::replace_waiting`]): what
/// the insert's `params` would have written, but the columns a key reads.
fn replacement(spec: &TableSpec, params: &[Value]) -> Changes {
    let n = spec.columns.len();
    Changes {
        payload: Some(params[0].clone().into_payload()),
        columns: (0..n)
            .filter(|i| keyed_column(spec, *i).is_none())
            .map(|i| (i, params[2 + i].clone()))
            .collect(),
        priority: spec
            .priority
            .as_ref()
            .map(|_| params[2 + n].as_i64().unwrap_or_default() as i16),
        run_at: params[1].as_time(),
    }
}

/// Inserts one keyed message; if an unfinished row holds its key, that row's id as
/// [`BrokerError::Duplicate`]. The insert skips a held key in the database (a unique index),
/// so concurrent producers cannot both insert; the holder is then read by the key. Should the
/// holder finish between the two, the insert is tried again (three times at most). With
/// `replace` ([`Message::replace_waiting`]), a holder not in work is replaced instead, and its
/// id returned.
fn keyed(
    t: &Target<'_>,
    conn: &mut dyn DbConn,
    params: &[Value],
    key: String,
    replace: bool,
) -> Result<i64> {
    let key = [Value::Text(key)];
    for _ in 0..3 {
        let made = t
            .dialect
            .insert_dedup(conn, t.sql, t.spec, 1, params)
            .map_err(|e| t.err(e))?;
        if let Some(id) = made.first() {
            return Ok(*id);
        }
        let holder = conn
            .query(&t.sql.dedup_holder, &key)
            .map_err(|e| t.err(e))?;
        if let Some(id) = holder.first().and_then(|r| r.first()?.as_i64()) {
            if let (true, Some(q)) = (replace, t.queue) {
                match apply(q, conn, id, &replacement(t.spec, params))? {
                    Updated::Done => return Ok(id),
                    // Finished since: the key is free, the insert is tried again.
                    Updated::NotLive => continue,
                    Updated::InWork => {}
                }
            }
            return Err(BrokerError::Duplicate {
                table: t.spec.name.clone(),
                id,
            });
        }
    }
    Err(t.err(DbError::other(
        "the dedup key changed hands three times during the publish",
    )))
}

/// How a batch runs: on its own (in a transaction of its own where it takes more than one
/// statement), or inside the caller's transaction.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Within {
    Own,
    Callers,
}

/// Publishes `messages` with multi-row inserts (`insert(rows)` gives the text for `rows`
/// rows), chunked to the database's parameter limit. All or nothing.
pub(crate) fn many(
    t: &Target<'_>,
    conn: &mut dyn DbConn,
    messages: Vec<Message>,
    within: Within,
    insert: impl Fn(usize) -> Arc<str>,
) -> Result<crate::producing::publish::Published> {
    let count = messages.len();
    if count == 0 {
        return Ok(crate::producing::publish::Published::default());
    }
    if messages
        .iter()
        .any(|m| m.replaces() || m.unique_period().is_some())
    {
        return Err(BrokerError::InvalidMessage {
            table: t.spec.name.clone(),
            reason: "Message::replace_waiting and Message::unique_for are for Broker::publish, \
                     one message at a time, not a batch"
                .into(),
        });
    }
    if messages.iter().any(waits_on_others) {
        return one_by_one(t, conn, messages, within);
    }
    let width = t.spec.insert_width();
    let now = SystemTime::now();
    let mut params = Vec::with_capacity(width * count);
    #[cfg(feature = "tracing")]
    let span = crate::runtime::trace::send_span(&t.spec.name, count);
    #[cfg(feature = "tracing")]
    let _entered = span.enter();
    for m in messages {
        m.params_into(t.spec, now, &mut params)?;
    }
    let rows_per = (t.dialect.max_params() / width).max(1);
    let chunks: Vec<&[Value]> = params.chunks(rows_per * width).collect();
    let dedup = t.spec.dedup_key.is_some();
    let run = |conn: &mut dyn DbConn| -> std::result::Result<usize, DbError> {
        let mut made = 0;
        for chunk in &chunks {
            let rows = chunk.len() / width;
            made += if dedup {
                t.dialect
                    .insert_dedup(conn, t.sql, t.spec, rows, chunk)?
                    .len()
            } else {
                conn.execute(&insert(rows), chunk)?;
                rows
            };
        }
        Ok(made)
    };
    // One statement is atomic by itself; several (or MySQL's one per row for dedup keys) run
    // in one transaction: the caller's, or one of their own.
    let made = if within == Within::Callers || (chunks.len() == 1 && !dedup) {
        run(conn).map_err(|e| t.err(e))?
    } else {
        conn.batch(&t.sql.begin_write).map_err(|e| t.err(e))?;
        match run(conn).and_then(|made| conn.batch("COMMIT").map(|()| made)) {
            Ok(made) => made,
            Err(e) => {
                conn.rollback_or_discard();
                return Err(t.err(e));
            }
        }
    };
    Ok(crate::producing::publish::Published {
        rows: made,
        duplicates: count - made,
    })
}

/// Runs `f` in a write transaction of its own on `conn`: committed if it returns `Ok`, rolled
/// back (or the connection discarded) otherwise.
pub(crate) fn in_own_transaction<T>(
    t: &Target<'_>,
    conn: &mut dyn DbConn,
    f: impl FnOnce(&mut dyn DbConn) -> Result<T>,
) -> Result<T> {
    conn.batch(&t.sql.begin_write).map_err(|e| t.err(e))?;
    match f(conn).and_then(|v| conn.batch("COMMIT").map(|()| v).map_err(|e| t.err(e))) {
        Ok(v) => Ok(v),
        Err(e) => {
            conn.rollback_or_discard();
            Err(e)
        }
    }
}

/// Publishes a batch of which some wait on other jobs, a message at a time, all in one
/// transaction (the caller's, or one of its own).
fn one_by_one(
    t: &Target<'_>,
    conn: &mut dyn DbConn,
    messages: Vec<Message>,
    within: Within,
) -> Result<crate::producing::publish::Published> {
    let run = |conn: &mut dyn DbConn| -> Result<crate::producing::publish::Published> {
        let mut done = crate::producing::publish::Published::default();
        for m in messages.iter().cloned() {
            match one(t, conn, m) {
                Ok(_) => done.rows += 1,
                Err(BrokerError::Duplicate { .. }) => done.duplicates += 1,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    };
    match within {
        Within::Own => retrying_deadlocks(|| in_own_transaction(t, conn, run)),
        Within::Callers => run(conn),
    }
}

/// A table validated and compiled for a database, for publishing outside a broker.
pub(crate) struct Compiled {
    pub spec: TableSpec,
    pub sql: TableSql,
    /// Counts the transactional publishes (the `metrics` feature).
    pub meters: crate::runtime::meters::Meters,
    /// Checked against the table's record, once per process and description, as a broker's
    /// publish is ([`crate::runtime::registry::verify`]).
    pub described: std::sync::atomic::AtomicBool,
}

/// Refuses `table` if its record disagrees with it, as `Broker::publish` does: the first
/// transactional publish of a description in this process reads the record in the caller's
/// transaction (two statements), later ones nothing. `check`: false where the connection
/// cannot read the record's columns (Diesel's, which loads ids only).
fn check_record(
    dialect: &dyn Dialect,
    conn: &mut dyn DbConn,
    c: &Compiled,
    table: &Table,
    check: bool,
) -> Result<()> {
    use std::sync::atomic::Ordering;
    if !check || c.described.load(Ordering::Acquire) {
        return Ok(());
    }
    match crate::runtime::registry::problems_in_transaction(dialect, conn, table)? {
        None => Ok(()),
        Some(problems) if problems.is_empty() => {
            c.described.store(true, Ordering::Release);
            Ok(())
        }
        Some(problems) => Err(crate::error::BrokerError::Schema {
            table: c.spec.name.clone(),
            problems,
        }),
    }
}

/// Checks another table a message names (`table`, compiled as `c`) against its record, as
/// [`check_record`] checks the table published to, in the caller's transaction, once per
/// process and description: false if it has none (or no registry), [`BrokerError::Schema`]
/// naming each difference if it disagrees.
fn check_other(
    dialect: &dyn Dialect,
    conn: &mut dyn DbConn,
    c: &Compiled,
    table: &Table,
) -> Result<bool> {
    use std::sync::atomic::Ordering;
    if c.described.load(Ordering::Acquire) {
        return Ok(true);
    }
    match crate::runtime::registry::problems_in_transaction(dialect, conn, table)? {
        None => Ok(false),
        Some(problems) if problems.is_empty() => {
            c.described.store(true, Ordering::Release);
            Ok(true)
        }
        Some(problems) => Err(BrokerError::Schema {
            table: c.spec.name.clone(),
            problems,
        }),
    }
}

/// `table` validated and compiled for `dialect`, once per process and description.
pub(crate) fn compiled(dialect: &dyn Dialect, table: &Table) -> Result<Arc<Compiled>> {
    type Cache = Mutex<HashMap<(&'static str, Table), Arc<Compiled>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (dialect.database(), table.clone());
    if let Some(c) = cache.lock().get(&key) {
        return Ok(c.clone());
    }
    let spec = table.validate()?;
    let sql = dialect.compile(&spec);
    let meters = crate::runtime::meters::Meters::new(&spec.name);
    let c = Arc::new(Compiled {
        spec,
        sql,
        meters,
        described: Default::default(),
    });
    Ok(cache.lock().entry(key).or_insert(c).clone())
}

/// Publishes one message inside the caller's transaction on `conn` (`check`: against the
/// table's record, see [`check_record`]).
pub(crate) fn in_transaction(
    dialect: &dyn Dialect,
    conn: &mut dyn DbConn,
    table: &Table,
    message: Message,
    check: bool,
) -> Result<i64> {
    let c = compiled(dialect, table)?;
    check_record(dialect, conn, &c, table, check)?;
    let others = deps::Uncached(dialect);
    let t = Target {
        spec: &c.spec,
        sql: &c.sql,
        dialect,
        others: &others,
        check_records: check,
        queue: None,
    };
    let id = one(&t, conn, message)?;
    // Delivered when the caller's transaction commits, not at all if it rolls back.
    dialect
        .announce(conn, t.sql, 1, None)
        .map_err(|e| t.err(e))?;
    c.meters.published(1);
    Ok(id)
}

/// Publishes a batch inside the caller's transaction on `conn` (`check` as
/// [`in_transaction`]'s).
pub(crate) fn batch_in_transaction(
    dialect: &dyn Dialect,
    conn: &mut dyn DbConn,
    table: &Table,
    messages: Vec<Message>,
    check: bool,
) -> Result<crate::producing::publish::Published> {
    let c = compiled(dialect, table)?;
    check_record(dialect, conn, &c, table, check)?;
    let others = deps::Uncached(dialect);
    let t = Target {
        spec: &c.spec,
        sql: &c.sql,
        dialect,
        others: &others,
        check_records: check,
        queue: None,
    };
    let insert = |rows: usize| -> Arc<str> { dialect.insert_many(&c.spec, rows).into() };
    let done = many(&t, conn, messages, Within::Callers, insert)?;
    if done.rows > 0 {
        dialect
            .announce(conn, t.sql, done.rows, None)
            .map_err(|e| t.err(e))?;
    }
    c.meters.published(done.rows);
    Ok(done)
}

/// What [`Broker::publish_batch`] did.
///
/// ```
/// use sqlbroker::{Broker, Message, Table};
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let t = Table::new("jobs").lease(std::time::Duration::from_secs(30)).dedup();
/// broker.create_table(&t)?;
/// let msgs = ["a", "b", "a"].map(|k| Message::new(k.as_bytes().to_vec()).dedup_key(k));
/// let done = broker.publish_batch(&t, msgs)?;
/// assert_eq!((done.rows, done.duplicates), (2, 1));
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Published {
    /// Rows made.
    pub rows: usize,
    /// Messages skipped because an unfinished row, or an earlier message of the batch, held
    /// their dedup key (tables with [`Table::dedup`] only).
    pub duplicates: usize,
}

impl Broker {
    /// Publishes many messages with multi-row inserts (one statement unless the batch exceeds
    /// the database's parameter limit; then several, in one transaction). All or nothing.
    ///
    /// On a table with dedup keys, a message whose key an unfinished row (or an earlier
    /// message of the batch) holds is skipped: [`Published::duplicates`] counts them.
    pub fn publish_batch(
        &self,
        table: &Table,
        messages: impl IntoIterator<Item = Message>,
    ) -> Result<Published> {
        let messages: Vec<Message> = messages.into_iter().collect();
        if messages.is_empty() {
            return Ok(Published::default());
        }
        let q = self.queue(table)?;
        let mut conn = q.conn("publish")?;
        let done = many(&Target::of(&q), &mut *conn, messages, Within::Own, |rows| {
            q.insert_sql(rows)
        })
        .map_err(|e| q.explain_failure(&mut *conn, e))?;
        drop(conn);
        q.meters.published(done.rows);
        if done.rows > 0 {
            self.announce(&q, done.rows);
        }
        Ok(done)
    }
}
