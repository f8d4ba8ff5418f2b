//! Jobs that wait on other jobs ([`Table::dependencies`]): what a publish that names other jobs
//! does, what a settlement does for the jobs waiting on the one it settles, what a requeue does
//! for a job that waits, and what the table of a job gone does for the jobs that waited on it.
//! Each runs in its caller's transaction, so a waiting job is released (or dead-lettered) in
//! the very commit that settles the last job it waits on, and no crash can leave it between
//! the two.
//!
//! Why it cannot be lost: a publish that names job `P` and `P`'s settlement both lock `P`'s
//! head row in `sqlbroker_deps` first (see [`crate::dialect::deps`]). The one that comes second
//! sees what the first committed: the publish finds `P`'s outcome recorded, or its row
//! finished; the settlement finds the new wait. A settlement then counts each waiting job down
//! (in id order) under its count's row lock, so of two settlements of its last two parents,
//! the second waits for the first and takes the count to 0: it releases the job, exactly once.
//!
//! **Where a head is kept** (the rule every path here follows): a job's head is written by the
//! first publish that names it, and by its settlement, which deletes it again in the same
//! transaction when no job waits on it: a settled job's row then tells its outcome to any later
//! publish (gone: acked; dead-lettered: still in its table). A head stays while jobs wait on
//! the job, and, for a job dead-lettered or cancelled whose row is gone (a cancel removes it, a
//! purge deletes it), [`HEADS_KEPT`] after; the broker's sweeper (`runtime::sweep`) deletes the
//! rest, and settles the jobs whose row went without a settlement (deleted by hand, or their
//! table dropped), so no job waits for ever on a row that is gone.
//!
//! [`Table::dependencies`]: crate::Table::dependencies

use std::sync::Arc;
use std::time::SystemTime;

use crate::dialect::deps::{DepsSql, WaitingSql, ACKED, CANCELLED, DEAD, NAMED_MANY, STATES_BATCH};
use crate::dialect::signals::{is_signal, NO_DEADLINE};
use crate::dialect::{DbConn, Dialect, TableSql};
use crate::error::DbError;
use crate::model::schedule::{floor, from_epoch_secs, millis, LATEST_SECS};
use crate::model::table::TableSpec;
use crate::model::value::Value;
use crate::model::waits::{Dependency, JobOutcome};

/// The due time of a job that waits on others: the latest time the queue writes, past every
/// claim's `run_at <= now`.
pub(crate) fn waiting_due() -> SystemTime {
    from_epoch_secs(LATEST_SECS)
}

/// How long the head of a job dead-lettered or cancelled whose row is gone is kept, for the
/// publishes that name it later: a day. Past that it counts as gone from its table (acked).
pub(crate) const HEADS_KEPT: std::time::Duration = std::time::Duration::from_secs(86_400);

/// A table's statements for jobs that wait, if it has them.
pub(crate) fn statements(sql: &TableSql) -> Option<(&DepsSql, &WaitingSql)> {
    Some((sql.deps.as_ref()?, sql.waiting.as_ref()?))
}

/// How a job stands, read from its row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RowState {
    /// In its table and not finished: waiting, queued or in work.
    Live,
    /// Not in its table: acked and not kept, deleted by hand, or never published.
    Gone,
    /// Finished and kept: dead-lettered or cancelled (a dead letter), or, in a table that
    /// keeps them, completed; with what it produced, if its table keeps outputs.
    Finished {
        outcome: &'static str,
        completed: bool,
        output: Option<Value>,
    },
}

impl RowState {
    /// The outcome the row tells a later publish; `None` while it is live.
    pub fn outcome(&self) -> Option<&'static str> {
        match self {
            RowState::Live => None,
            RowState::Gone => Some(ACKED),
            RowState::Finished { outcome, .. } => Some(outcome),
        }
    }

    /// Where the row of a job settled as it tells is left (`None` while it is live).
    pub fn left(&self) -> Option<Left> {
        match self {
            RowState::Live => None,
            RowState::Gone => Some(Left::Gone),
            RowState::Finished {
                completed: true, ..
            } => Some(Left::Completed),
            RowState::Finished { .. } => Some(Left::DeadLetter),
        }
    }
}

/// Where a settled job's row is left: whether it tells a later publish its outcome, and
/// whether the job keeps its own waits (a dead letter does, for its requeue).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    /// Deleted (an ack on a table that does not keep completed rows, a cancel that removed
    /// it): a later publish reads it as acked.
    Gone,
    /// A dead letter (dead-lettered, or cancelled in work), which a requeue may make live.
    DeadLetter,
    /// Completed and kept (acked, or cancelled, on a table that keeps completed rows).
    Completed,
}

/// Job `id` as its row in the table of `waiting` tells it.
pub(crate) fn row_state(
    waiting: &WaitingSql,
    conn: &mut dyn DbConn,
    id: i64,
) -> Result<RowState, DbError> {
    let rows = conn.query(&waiting.state, &[Value::Int(id)])?;
    Ok(match rows.into_iter().next() {
        None => RowState::Gone,
        Some(row) => state_of(row),
    })
}

/// A job's state from its row as `state` reads it (`dead_at, cancelled, completed_at[,
/// output]`): a cancel as the row tells it (completed and cancelled, or a dead letter whose
/// cancel was requested), never a dead letter's reason text, which a handler chooses.
pub(crate) fn state_of(mut row: Vec<Value>) -> RowState {
    let set = |v: Option<&Value>| v.is_some_and(|v| !matches!(v, Value::Null));
    if !set(row.first()) {
        return RowState::Live;
    }
    let cancelled = row.get(1).and_then(Value::as_i64).unwrap_or(0) != 0;
    let completed = set(row.get(2));
    let outcome = match (completed, cancelled) {
        (_, true) => CANCELLED,
        (true, false) => ACKED,
        (false, false) => DEAD,
    };
    let output = match row.len() > 3 {
        true => Some(row.swap_remove(3)).filter(|v| !matches!(v, Value::Null)),
        false => None,
    };
    RowState::Finished {
        outcome,
        completed,
        output,
    }
}

/// How row `id` ended, if it has, and where it is left: what a settlement that sent it back
/// reads, since a cancel request finishes a row its retry or hand-back would send back.
pub(crate) fn finished_as(
    sql: &TableSql,
    conn: &mut dyn DbConn,
    id: i64,
) -> Result<Option<(&'static str, Left)>, DbError> {
    let Some((_, waiting)) = statements(sql) else {
        return Ok(None);
    };
    let state = row_state(waiting, conn, id)?;
    Ok(match (&state, state.left()) {
        (RowState::Finished { outcome, .. }, Some(left)) => Some((outcome, left)),
        _ => None,
    })
}

/// A binary value read back (`NULL`: none).
fn bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::Null => None,
        v => Some(v.into_payload()),
    }
}

fn text(v: Option<&Value>) -> Option<String> {
    match v {
        Some(Value::Text(s)) => Some(s.clone()),
        Some(Value::Bytes(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

/// A job a new one waits on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parent {
    pub id: i64,
    /// [`Message::after_settled`](crate::Message::after_settled): runs whatever its outcome.
    pub settled_only: bool,
    /// Its table, if not the new job's own ([`Message::after_in`](crate::Message::after_in)).
    pub table: Option<Box<crate::model::table::Table>>,
}

/// Another table as its record describes it, for the jobs of one table waiting on another's.
pub(crate) enum Found {
    /// Its record has dependencies: its waiting statements.
    Waiting(Arc<WaitingSql>),
    /// Its record has none (or cannot be read by this release).
    NoDependencies,
    /// It has no record: never made by the library, or dropped.
    NoRecord,
}

/// The waiting statements of the jobs of other tables, read from their records.
pub(crate) trait OtherTables {
    /// Table `name` as its record describes it.
    fn lookup(&self, conn: &mut dyn DbConn, name: &str) -> Result<Found, DbError>;

    /// True if table `name` exists (a record can outlive a table dropped by hand).
    fn exists(&self, conn: &mut dyn DbConn, name: &str) -> Result<bool, DbError>;
}

/// True if table `name` exists on `dialect`'s database, read on `conn`.
pub(crate) fn table_exists(
    dialect: &dyn Dialect,
    conn: &mut dyn DbConn,
    name: &str,
) -> Result<bool, DbError> {
    let rows = conn.query(dialect.columns_query(), &[Value::Text(name.to_string())])?;
    Ok(!rows.is_empty())
}

/// Other tables' waiting statements, by name, read from their records as they are needed
/// (once per holder and table, while the table has them).
#[derive(Default)]
pub(crate) struct Others(parking_lot::Mutex<std::collections::HashMap<String, Arc<WaitingSql>>>);

impl Others {
    /// Table `name` on `dialect`, from the cache or its record.
    pub fn lookup(
        &self,
        dialect: &dyn Dialect,
        conn: &mut dyn DbConn,
        name: &str,
    ) -> Result<Found, DbError> {
        if let Some(w) = self.0.lock().get(name) {
            return Ok(Found::Waiting(w.clone()));
        }
        let found = read_record(dialect, conn, name)?;
        if let Found::Waiting(w) = &found {
            self.0.lock().insert(name.to_string(), w.clone());
        }
        Ok(found)
    }

    /// Forgets table `name` (its statements failed: dropped, or made again).
    pub fn forget(&self, name: &str) {
        self.0.lock().remove(name);
    }
}

/// Table `name`'s record, read on `conn` (no lock, no write: safe inside any transaction).
fn read_record(dialect: &dyn Dialect, conn: &mut dyn DbConn, name: &str) -> Result<Found, DbError> {
    let table = match crate::runtime::registry::open(dialect, conn, name) {
        Ok(Some(t)) => t,
        Ok(None) => return Ok(Found::NoRecord),
        // A record this release cannot read.
        Err(crate::error::BrokerError::Schema { .. }) => return Ok(Found::NoDependencies),
        Err(e) => return Err(DbError::other(e.to_string())),
    };
    let Ok(spec) = table.validate() else {
        return Ok(Found::NoDependencies);
    };
    Ok(match dialect.compile(&spec).waiting {
        Some(w) => Found::Waiting(Arc::new(w)),
        None => Found::NoDependencies,
    })
}

impl OtherTables for crate::runtime::Queue {
    fn lookup(&self, conn: &mut dyn DbConn, name: &str) -> Result<Found, DbError> {
        self.others.lookup(&*self.dialect, conn, name)
    }

    fn exists(&self, conn: &mut dyn DbConn, name: &str) -> Result<bool, DbError> {
        table_exists(&*self.dialect, conn, name)
    }
}

/// Other tables read from their records at each call: a publish inside the application's own
/// transaction, which has no broker to cache them (it needs one only for a job it names whose
/// row went without a settlement).
pub(crate) struct Uncached<'a>(pub &'a dyn Dialect);

impl OtherTables for Uncached<'_> {
    fn lookup(&self, conn: &mut dyn DbConn, name: &str) -> Result<Found, DbError> {
        read_record(self.0, conn, name)
    }

    fn exists(&self, conn: &mut dyn DbConn, name: &str) -> Result<bool, DbError> {
        table_exists(self.0, conn, name)
    }
}

/// What a settlement needs to settle a job and the jobs waiting on it, in whichever table.
pub(crate) struct Settling<'a> {
    pub deps: &'a DepsSql,
    /// A table whose statements are at hand (the settled job's own, usually).
    pub own: Option<(&'a str, &'a WaitingSql)>,
    pub others: &'a dyn OtherTables,
    /// A table gone (dropped): the jobs of it that wait are left to the rows that name it.
    pub gone: Option<&'a str>,
}

impl Settling<'_> {
    /// The waiting statements of table `name`, if its record has them.
    fn waiting(
        &self,
        conn: &mut dyn DbConn,
        name: &str,
    ) -> Result<Option<MaybeOwned<'_>>, DbError> {
        if let Some((_, w)) = self.own.filter(|(own, _)| *own == name) {
            return Ok(Some(MaybeOwned::Borrowed(w)));
        }
        Ok(match self.others.lookup(conn, name)? {
            Found::Waiting(w) => Some(MaybeOwned::Shared(w)),
            Found::NoDependencies | Found::NoRecord => None,
        })
    }

    /// Settles job `id` of `table` as `outcome` ([`ACKED`], [`DEAD`], [`CANCELLED`]) with
    /// `output`, on `conn` inside the caller's transaction: records the outcome in the job's
    /// head, releases each job waiting on it that now waits on nothing, or dead-letters it
    /// (then does the same for the jobs waiting on that one), in whichever table. The job's
    /// own waits are forgotten, but a dead letter's, which a requeue reads again. Its head is
    /// deleted in the same transaction unless jobs wait on it, or the row cannot tell the
    /// outcome any more (`left` [`Left::Gone`], and not acked: a cancel that removed the row).
    ///
    /// Modelled in model/deps.pml (settle_head, count_down, count_read, settle_commit).
    #[allow(clippy::too_many_arguments)]
    pub fn settle(
        &self,
        conn: &mut dyn DbConn,
        table: &str,
        id: i64,
        outcome: &str,
        output: Option<Value>,
        left: Left,
    ) -> Result<(), DbError> {
        let deps = self.deps;
        let mut output = Some(output.unwrap_or(Value::Null));
        let now = SystemTime::now();
        let at = millis(now);
        let latest = Value::Time(waiting_due());
        let mut todo = vec![(table.to_string(), id, outcome.to_string(), left)];
        // Whether each other table met exists (read once per settlement).
        let mut tables: std::collections::HashMap<String, bool> = Default::default();
        while let Some((table, id, outcome, left)) = todo.pop() {
            let job = [Value::Text(table.clone()), Value::Int(id)];
            // Its row can no longer tell: the head does, for a day.
            let untold = left == Left::Gone && outcome != ACKED;
            let settle = [
                job[0].clone(),
                job[1].clone(),
                Value::Text(outcome.clone()),
                Value::Int(at),
                // The settled job's own; the jobs dead-lettered after it produced nothing.
                output.take().unwrap_or(Value::Null),
                Value::Int(i64::from(untold)),
            ];
            conn.execute(&deps.head_settle, &settle)?;
            let children = conn.query(&deps.dependents, &job)?;
            let keep_head = !children.is_empty() || untold;
            // One statement for what the job leaves: its waits (a dead letter keeps them, for
            // a requeue) and its head (unless kept).
            match (left != Left::DeadLetter, keep_head) {
                (true, false) => {
                    let both = [
                        job[0].clone(),
                        job[1].clone(),
                        job[0].clone(),
                        job[1].clone(),
                    ];
                    conn.execute(&deps.forget_all, &both)?
                }
                (true, true) => conn.execute(&deps.forget_waits, &job)?,
                (false, false) => conn.execute(&deps.unhead, &job)?,
                (false, true) => 0,
            };
            if children.is_empty() {
                continue;
            }
            let mark = [Value::Text(outcome.clone()), job[0].clone(), job[1].clone()];
            conn.execute(&deps.mark, &mark)?;
            for row in children {
                let (Some(child_table), Some(child)) =
                    (text(row.first()), row.get(1).and_then(Value::as_i64))
                else {
                    continue;
                };
                if self.gone == Some(child_table.as_str()) {
                    continue;
                }
                let settled_only = row.get(2).and_then(Value::as_i64).unwrap_or(0) != 0;
                let child_job = [Value::Text(child_table.clone()), Value::Int(child)];
                let own = self.own.is_some_and(|(own, _)| own == child_table);
                let exists = match (own, tables.get(&child_table)) {
                    (true, _) => true,
                    (false, Some(known)) => *known,
                    (false, None) => {
                        let known = self.others.exists(conn, &child_table)?;
                        tables.insert(child_table.clone(), known);
                        known
                    }
                };
                if !exists {
                    // Its table is gone (dropped by hand), and the job with it: its waits go.
                    log::info!(
                        "job {child} of table {child_table} waited on job {id} of table \
                         {table}, but its table is gone: its waits deleted"
                    );
                    conn.execute(&deps.forget_waits, &child_job)?;
                    continue;
                }
                let Some(waiting) = self.waiting(conn, &child_table)? else {
                    log::warn!(
                        "job {child} of table {child_table} waits on job {id} of table \
                         {table}, but its table has no record with dependencies: left \
                         waiting"
                    );
                    continue;
                };
                // Counted down under its count's lock: the settlements of this child's parents
                // take turns, and the one that takes it to 0 is the last.
                conn.execute(&deps.count_down, &child_job)?;
                if !settled_only && outcome != ACKED {
                    let params = [
                        Value::Time(floor(now)),
                        Value::Text(reason(&child_table, &table, id, &outcome)),
                        Value::Int(child),
                        latest.clone(),
                    ];
                    // Dead-lettered unless it no longer waits (cancelled, or dead already).
                    if conn.execute(&waiting.dead, &params)? > 0 {
                        todo.push((child_table, child, DEAD.to_string(), Left::DeadLetter));
                    }
                    continue;
                }
                let left = conn.query(&deps.count_read, &child_job)?;
                let left = left.first().and_then(|r| r.first()).and_then(Value::as_i64);
                crate::runtime::pause_point("deps.counted", &table);
                if left == Some(0) {
                    let params = [Value::Time(floor(now)), Value::Int(child), latest.clone()];
                    conn.execute(&waiting.release, &params)?;
                }
            }
        }
        Ok(())
    }
}

/// A table's waiting statements, its own (borrowed) or another's (shared).
enum MaybeOwned<'a> {
    Borrowed(&'a WaitingSql),
    Shared(Arc<WaitingSql>),
}

impl std::ops::Deref for MaybeOwned<'_> {
    type Target = WaitingSql;
    fn deref(&self) -> &WaitingSql {
        match self {
            MaybeOwned::Borrowed(w) => w,
            MaybeOwned::Shared(w) => w,
        }
    }
}

/// A job named by a publish (or read again by a requeue), where its table's statements are
/// known: its table's name, the statements that read its row, the wait.
pub(crate) struct Named<'a> {
    pub table: &'a str,
    pub waiting: &'a WaitingSql,
    pub parent: &'a Parent,
    /// Its table is gone (dropped by hand, its record left): the job counts as cancelled.
    pub gone: bool,
}

/// What a publish reads of one job it names: its outcome (`None`: not settled) and what it
/// produced where its head does not hold it.
type NamedOutcome = (Option<String>, Option<Value>);

/// The largest `k` with `2^k <= n` (`n` at least 1).
fn pow2_at_most(n: usize) -> usize {
    (usize::BITS - 1 - n.max(1).leading_zeros()) as usize
}

/// [`outcome_of`] of a run of jobs of one table (in `(table, id)` order, each once), many to a
/// statement: each head made or touched and locked (in order, as one by one), then read. A
/// job whose head holds an outcome has it (`Some`); a job whose head holds none and whose row
/// is there, not finished, waits (`Some((None, None))`); any other (its row finished or gone,
/// its table gone) is left to [`outcome_of`] (`None`), which settles what must be.
fn read_many(
    deps: &DepsSql,
    chunk: &[(Named<'_>, bool)],
    conn: &mut dyn DbConn,
    at: i64,
) -> Result<Vec<Option<NamedOutcome>>, DbError> {
    let table = chunk[0].0.table;
    let returning = deps.head_read_many.is_empty();
    let mut read = Vec::new();
    let mut rest = chunk;
    while !rest.is_empty() {
        let k = pow2_at_most(rest.len());
        let (these, after) = rest.split_at(1 << k);
        let params: Vec<Value> = these
            .iter()
            .flat_map(|(n, _)| {
                [
                    Value::Text(table.to_string()),
                    Value::Int(n.parent.id),
                    Value::Int(at),
                ]
            })
            .collect();
        match returning {
            true => read.extend(conn.query(&deps.head_touch_many[k], &params)?),
            false => {
                conn.execute(&deps.head_touch_many[k], &params)?;
            }
        }
        rest = after;
    }
    let ids: Vec<i64> = chunk.iter().map(|(n, _)| n.parent.id).collect();
    if !returning {
        let mut params = vec![Value::Text(table.to_string())];
        params.extend((0..NAMED_MANY).map(|i| Value::Int(ids[i.min(ids.len() - 1)])));
        read = conn.query(&deps.head_read_many, &params)?;
    }
    let heads: std::collections::HashMap<i64, Option<String>> = read
        .into_iter()
        .filter_map(|r| Some((r.first()?.as_i64()?, text(r.get(1)))))
        .collect();
    // The rows of the jobs whose heads hold no outcome (not for a table that is gone).
    let open: Vec<i64> = match chunk[0].0.gone {
        true => Vec::new(),
        false => ids
            .iter()
            .copied()
            .filter(|id| heads.get(id).is_some_and(Option::is_none))
            .collect(),
    };
    let mut live = std::collections::HashSet::new();
    let waiting = chunk[0].0.waiting;
    for part in open.chunks(STATES_BATCH) {
        let params: Vec<Value> = (0..STATES_BATCH)
            .map(|i| Value::Int(part[i.min(part.len() - 1)]))
            .collect();
        for row in conn.query(&waiting.states, &params)? {
            // `id, dead_at, ..`: a row there and not finished.
            if let (Some(id), Some(Value::Null)) = (row.first().and_then(Value::as_i64), row.get(1))
            {
                live.insert(id);
            }
        }
    }
    Ok(ids
        .iter()
        .map(|id| match heads.get(id) {
            Some(Some(outcome)) => Some((Some(outcome.clone()), None)),
            Some(None) if live.contains(id) => Some((None, None)),
            _ => None,
        })
        .collect())
}

/// Where a job named by a publish stands, its head locked: settled with an outcome (and what
/// it produced, read from its row where its head has none), or not yet. A head the touch made
/// for a job whose row is finished or gone holds nothing anyone needs: deleted again. If jobs
/// still wait on such a job (its row went without a settlement: deleted by hand), it is
/// settled here, as its row tells, so they and the new job get one answer.
///
/// Modelled in model/deps.pml (publish_read).
fn outcome_of(
    deps: &DepsSql,
    named: &Named<'_>,
    others: &dyn OtherTables,
    conn: &mut dyn DbConn,
    at: i64,
) -> Result<(Option<String>, Option<Value>), DbError> {
    let job = [
        Value::Text(named.table.to_string()),
        Value::Int(named.parent.id),
    ];
    let touch = [job[0].clone(), job[1].clone(), Value::Int(at)];
    conn.execute(&deps.head_touch, &touch)?;
    let recorded = conn.query(&deps.head_read, &job)?;
    if let Some(outcome) = recorded.first().and_then(|r| text(r.first())) {
        return Ok((Some(outcome), None));
    }
    // Its table dropped by hand (its record left): cancelled, for the jobs already waiting on
    // it too, settled here as the sweeper would, so every job named it gets one answer.
    if named.gone {
        if conn.query(&deps.dependents, &job)?.is_empty() {
            conn.execute(&deps.unhead, &job)?;
        } else {
            let settling = Settling {
                deps,
                own: None,
                others,
                gone: Some(named.table),
            };
            settling.settle(
                conn,
                named.table,
                named.parent.id,
                CANCELLED,
                None,
                Left::Gone,
            )?;
        }
        return Ok((Some(CANCELLED.to_string()), None));
    }
    let state = row_state(named.waiting, conn, named.parent.id)?;
    let Some(outcome) = state.outcome() else {
        return Ok((None, None));
    };
    if conn.query(&deps.dependents, &job)?.is_empty() {
        conn.execute(&deps.unhead, &job)?;
    } else {
        log::info!(
            "job {} of table {} went without a settlement ({outcome}, as its row tells): \
             settling the jobs that wait on it",
            named.parent.id,
            named.table
        );
        let settling = Settling {
            deps,
            own: Some((named.table, named.waiting)),
            others,
            gone: None,
        };
        let left = state.left().unwrap_or(Left::Gone);
        settling.settle(conn, named.table, named.parent.id, outcome, None, left)?;
    }
    let output = match state {
        RowState::Finished { output, .. } => output,
        _ => None,
    };
    Ok((Some(outcome.to_string()), output))
}

/// One job waited on: its table, id, `settled_only`, outcome so far, and what it produced
/// where its head does not hold it (read from its row).
type Wait = (String, i64, bool, Option<String>, Option<Value>);

/// What a new job that waits on others is to be, read under their heads' locks.
pub(crate) struct Waits {
    outcomes: Vec<Wait>,
    /// The deadline of its wait for a signal, if it has one, in milliseconds
    /// ([`NO_DEADLINE`] without).
    signal_at: i64,
}

impl Waits {
    /// Locks the heads of the `named` jobs (in `(table, id)` order: the order every publish
    /// takes them in) and reads their outcomes, on `conn` inside the publish's transaction.
    ///
    /// Modelled in model/deps.pml (publish_read).
    pub fn read(
        sql: &TableSql,
        others: &dyn OtherTables,
        conn: &mut dyn DbConn,
        mut named: Vec<Named<'_>>,
    ) -> Result<Self, DbError> {
        let Some((deps, _)) = statements(sql) else {
            return Ok(Waits {
                outcomes: Vec::new(),
                signal_at: NO_DEADLINE,
            });
        };
        let at = millis(SystemTime::now());
        named.sort_by(|a, b| (a.table, a.parent.id).cmp(&(b.table, b.parent.id)));
        // A job named twice is one wait: `after` if either is.
        let mut unique: Vec<(Named<'_>, bool)> = Vec::with_capacity(named.len());
        for n in named {
            match unique.last_mut() {
                Some((last, only)) if last.table == n.table && last.parent.id == n.parent.id => {
                    *only &= n.parent.settled_only;
                }
                _ => {
                    let only = n.parent.settled_only;
                    unique.push((n, only));
                }
            }
        }
        let mut outcomes: Vec<Wait> = Vec::with_capacity(unique.len());
        let mut from = 0;
        while from < unique.len() {
            // A run of jobs of one table, up to NAMED_MANY: their heads touched and read in a
            // few statements (a callback after 10,000 jobs was 40,000 round trips, 4 s on the
            // servers); those the heads leave unsettled and whose rows are not plainly live
            // are read one by one, as always.
            let table = unique[from].0.table;
            let run = unique[from..]
                .iter()
                .take(NAMED_MANY)
                .take_while(|(n, _)| n.table == table)
                .count();
            let chunk = &unique[from..from + run];
            let known = match run {
                1 => vec![None],
                _ => read_many(deps, chunk, conn, at)?,
            };
            for ((n, only), known) in chunk.iter().zip(known) {
                let (outcome, output) = match known {
                    Some(found) => found,
                    None => outcome_of(deps, n, others, conn, at)?,
                };
                outcomes.push((n.table.to_string(), n.parent.id, *only, outcome, output));
            }
            from += run;
        }
        Ok(Waits {
            outcomes,
            signal_at: NO_DEADLINE,
        })
    }

    /// Adds the new job's wait for a signal (`parent_table, parent`: its head), as
    /// [`crate::runtime::signals::read_for_publish`] read it, ending at `deadline` (ms).
    pub fn add_signal(
        &mut self,
        (parent_table, parent, outcome, payload): (String, i64, Option<String>, Option<Value>),
        deadline: i64,
    ) {
        self.outcomes
            .push((parent_table, parent, false, outcome, payload));
        self.signal_at = deadline;
    }

    /// True while a job it waits on has not settled.
    pub fn waiting(&self) -> bool {
        self.outcomes.iter().any(|(_, _, _, o, _)| o.is_none())
    }

    /// Why the new job is dead-lettered at once: a job it waits on with
    /// [`Message::after`](crate::Message::after) settled other than acked.
    pub fn failed(&self, own: &str) -> Option<String> {
        self.outcomes
            .iter()
            .find_map(|(table, id, settled_only, o, _)| match o.as_deref() {
                Some(o) if !settled_only && o != ACKED => Some(reason(own, table, *id, o)),
                _ => None,
            })
    }

    /// Writes the new job `child`'s waits and its count (inserted with [`waiting_due`] as its
    /// due time when [`Waits::waiting`]) and, if a job it waits on failed, dead-letters it.
    ///
    /// Modelled in model/deps.pml (publish_write).
    pub fn write(
        &self,
        spec: &TableSpec,
        sql: &TableSql,
        conn: &mut dyn DbConn,
        child: i64,
    ) -> Result<(), DbError> {
        let Some((deps, waiting)) = statements(sql) else {
            return Ok(());
        };
        let at = millis(SystemTime::now());
        let wait = |(table, id, settled_only, outcome, output): &Wait| {
            [
                Value::Text(table.clone()),
                Value::Int(*id),
                Value::Text(spec.name.clone()),
                Value::Int(child),
                Value::Int(i64::from(*settled_only)),
                outcome.clone().map_or(Value::Null, Value::Text),
                // A wait for a signal holds its deadline.
                Value::Int(match is_signal(table) {
                    true => self.signal_at,
                    false => at,
                }),
                output.clone().unwrap_or(Value::Null),
            ]
        };
        // Many at a time: a statement per power of two in the count.
        let mut rest = &self.outcomes[..];
        while !rest.is_empty() {
            let k = pow2_at_most(rest.len().min(NAMED_MANY));
            let (these, after) = rest.split_at(1 << k);
            let params: Vec<Value> = these.iter().flat_map(wait).collect();
            match k {
                0 => conn.execute(&deps.wait_insert, &params)?,
                _ => conn.execute(&deps.wait_insert_many[k], &params)?,
            };
            rest = after;
        }
        let pending = self.outcomes.iter().filter(|w| w.3.is_none()).count();
        let params = [
            Value::Text(spec.name.clone()),
            Value::Int(child),
            Value::Int(at),
            Value::Int(pending as i64),
        ];
        conn.execute(&deps.count_insert, &params)?;
        if let Some(why) = self.failed(&spec.name) {
            let now = floor(SystemTime::now());
            let params = [
                Value::Time(now),
                Value::Text(why),
                Value::Int(child),
                Value::Time(waiting_due()),
            ];
            conn.execute(&waiting.dead, &params)?;
        }
        Ok(())
    }
}

/// How a job that `outcome` names ended, in words (`was dead-lettered`).
pub(crate) fn ended(outcome: &str) -> &'static str {
    match outcome {
        DEAD => "was dead-lettered",
        CANCELLED => "was cancelled",
        _ => "did not succeed",
    }
}

/// A dead letter's reason, in table `own`, for a job whose parent `id` of `table` settled as
/// `outcome` (the table named only when it is another).
fn reason(own: &str, table: &str, id: i64, outcome: &str) -> String {
    let what = ended(outcome);
    match table == own {
        true => format!("job {id} it waits on {what}"),
        false => format!("job {id} of table {table} it waits on {what}"),
    }
}

/// After the settlement of job `id` of `spec`'s table as `outcome` ([`ACKED`], [`DEAD`],
/// [`CANCELLED`]) with `output`, on `conn` inside the settlement's transaction: what
/// [`Settling::settle`] does, the table's own statements at hand; `left`: where the job's row
/// is left. A table without dependencies does nothing.
#[allow(clippy::too_many_arguments)]
pub(crate) fn settled(
    spec: &TableSpec,
    sql: &TableSql,
    others: &dyn OtherTables,
    conn: &mut dyn DbConn,
    id: i64,
    outcome: &str,
    output: Option<Value>,
    left: Left,
) -> Result<(), DbError> {
    let Some((deps, own)) = statements(sql) else {
        return Ok(());
    };
    let settling = Settling {
        deps,
        own: Some((&spec.name, own)),
        others,
        gone: None,
    };
    settling.settle(conn, &spec.name, id, outcome, output, left)
}

/// Where the row of a job of `spec`'s table that its settlement's own statement ended as
/// `outcome` is left: a dead letter stays; an ack or a cancel deletes it, or completes it on
/// a table that keeps completed rows.
pub(crate) fn left_by(spec: &TableSpec, outcome: &str) -> Left {
    match (outcome, spec.completed_at.is_some()) {
        (DEAD, _) => Left::DeadLetter,
        (_, true) => Left::Completed,
        (_, false) => Left::Gone,
    }
}

/// Runs a settlement's statement `sql` (`params`) of row `id` of `q`'s table on `conn`, the rows
/// it changed. On a table with dependencies, or with an `output` to write
/// ([`Table::outputs`](crate::Table::outputs)), in a transaction of its own with what the
/// outcome does, if it changed the row: the output written to the row ([`settled_with_output`]) and
/// what it does for the jobs waiting on the row ([`settled`]). `settled` is the outcome;
/// `None` for a row sent back, which a cancel request may have finished instead (read back).
///
/// Modelled in model/deps.pml (settle_commit).
pub(crate) fn settle_in_transaction(
    q: &crate::runtime::Queue,
    conn: &mut dyn DbConn,
    sql: &str,
    params: &[Value],
    id: i64,
    outcome: Option<&str>,
    output: Option<&[u8]>,
) -> Result<u64, DbError> {
    let output = output.filter(|_| q.sql.output_write.is_some());
    if !q.spec.dependencies && output.is_none() {
        return conn.execute(sql, params);
    }
    conn.batch(&q.sql.begin_write)?;
    let done = conn
        .execute(sql, params)
        .and_then(|n| {
            let outcome = match (n, outcome) {
                (0, _) => None,
                (_, Some(o)) => Some((o, left_by(&q.spec, o))),
                (_, None) => finished_as(&q.sql, conn, id)?,
            };
            if let Some((o, left)) = outcome {
                settled_with_output(&q.spec, &q.sql, q, conn, id, o, output, left)?;
            }
            Ok(n)
        })
        .and_then(|n| conn.batch("COMMIT").map(|()| n));
    if done.is_err() {
        conn.rollback_or_discard();
    }
    done
}

/// A cancel's removal of row `id` of `q`'s table (`sql`, `params`: the table's
/// `cancel_remove`), on `conn` inside the caller's transaction, and what it does for the jobs
/// waiting on the row: the rows it changed. A live row is settled as cancelled. A dead letter
/// settled already, and its answer stays: its head records the outcome its row told (a day,
/// as a purge's does, with what it produced kept for the jobs its settlement released), and
/// its own waits go (it can no longer be requeued).
pub(crate) fn cancel_removal(
    q: &crate::runtime::Queue,
    conn: &mut dyn DbConn,
    sql: &str,
    params: &[Value],
    id: i64,
) -> Result<u64, DbError> {
    let Some((deps, waiting)) = statements(&q.sql) else {
        return conn.execute(sql, params);
    };
    let before = row_state(waiting, conn, id)?;
    let n = conn.execute(sql, params)?;
    if n == 0 {
        return Ok(0);
    }
    match before {
        RowState::Finished {
            outcome,
            completed: false,
            ..
        } => {
            let job = [Value::Text(q.spec.name.clone()), Value::Int(id)];
            let head = [
                job[0].clone(),
                job[1].clone(),
                Value::Text(outcome.to_string()),
                Value::Int(millis(SystemTime::now())),
                Value::Null,
                Value::Int(1),
            ];
            conn.execute(&deps.head_settle, &head)?;
            conn.execute(&deps.forget_waits, &job)?;
        }
        _ => {
            let left = left_by(&q.spec, CANCELLED);
            settled(&q.spec, &q.sql, q, conn, id, CANCELLED, None, left)?;
        }
    }
    Ok(n)
}

/// [`cancel_removal`] in a transaction of its own on a table with dependencies; else the
/// removal's statement alone.
pub(crate) fn cancel_in_transaction(
    q: &crate::runtime::Queue,
    conn: &mut dyn DbConn,
    sql: &str,
    params: &[Value],
    id: i64,
) -> Result<u64, DbError> {
    if !q.spec.dependencies {
        return conn.execute(sql, params);
    }
    conn.batch(&q.sql.begin_write)?;
    let done =
        cancel_removal(q, conn, sql, params, id).and_then(|n| conn.batch("COMMIT").map(|()| n));
    if done.is_err() {
        conn.rollback_or_discard();
    }
    done
}

/// Writes the output of row `id` ([`Table::outputs`](crate::Table::outputs)), inside the
/// transaction of the settlement that ends it, after that settlement's fenced statement (a row
/// that was deleted is left so); then [`settled`]. The output is copied once, into the write's
/// parameters, and handed on from there to the job's head.
#[allow(clippy::too_many_arguments)]
pub(crate) fn settled_with_output(
    spec: &TableSpec,
    sql: &TableSql,
    others: &dyn OtherTables,
    conn: &mut dyn DbConn,
    id: i64,
    outcome: &str,
    output: Option<&[u8]>,
    left: Left,
) -> Result<(), DbError> {
    let output = match (&sql.output_write, output) {
        (Some(write), Some(output)) => {
            let params = [Value::Bytes(output.to_vec()), Value::Int(id)];
            conn.execute(write, &params)?;
            let [output, _] = params;
            Some(output)
        }
        _ => None,
    };
    settled(spec, sql, others, conn, id, outcome, output, left)
}

/// The jobs `id` waits on (until it settles; a dead letter's, until it is purged), in id
/// order.
pub(crate) fn parents_of(
    spec: &TableSpec,
    sql: &TableSql,
    conn: &mut dyn DbConn,
    id: i64,
) -> Result<Vec<Dependency>, DbError> {
    let Some((deps, _)) = statements(sql) else {
        return Ok(Vec::new());
    };
    let rows = conn.query(
        &deps.parents,
        &[Value::Text(spec.name.clone()), Value::Int(id)],
    )?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            Some(Dependency {
                // A wait for a signal is read by `runtime::signals::signal_of`.
                table: text(r.first()).filter(|t| !is_signal(t))?,
                id: r.get(1)?.as_i64()?,
                any_outcome: r.get(2).and_then(Value::as_i64).unwrap_or(0) != 0,
                outcome: text(r.get(3)).and_then(|o| JobOutcome::from_recorded(&o)),
                output: r.get(4).cloned().and_then(bytes),
            })
        })
        .collect())
}

/// The jobs waiting on `id` (until each settles): `(table, id)` in that order.
pub(crate) fn dependents_of(
    spec: &TableSpec,
    sql: &TableSql,
    conn: &mut dyn DbConn,
    id: i64,
) -> Result<Vec<(String, i64)>, DbError> {
    let Some((deps, _)) = statements(sql) else {
        return Ok(Vec::new());
    };
    let rows = conn.query(
        &deps.all_dependents,
        &[Value::Text(spec.name.clone()), Value::Int(id)],
    )?;
    Ok(rows
        .iter()
        .filter_map(|r| Some((text(r.first())?, r.get(1)?.as_i64()?)))
        .collect())
}

/// What a requeue of one dead letter did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Requeued {
    /// No dead letter has that id.
    NotDead,
    /// Live again: ready, or waiting on the jobs it waits on that have not settled.
    Done,
    /// It waits (`after`) on a job still dead-lettered or cancelled: requeued it would be
    /// dead-lettered again at once. The caller rolls back.
    ParentFailed {
        table: String,
        parent: i64,
        outcome: String,
    },
}

/// Requeues dead letter `id` of `spec`'s table with `requeue` (`(now, id)`, the table's own
/// statement), on `conn` inside the caller's transaction, as a job that waits on others: live
/// again for the jobs that wait on it (its head has no outcome any more, so a publish that
/// names it waits for it); and, if it waits on others, it waits on them again, each read as a
/// publish reads it (under its head's lock): ready if each has settled as its wait asks,
/// waiting while one has not. If one it waits on with `after` is dead or cancelled,
/// [`Requeued::ParentFailed`]: the caller rolls back, and nothing changed.
///
/// Modelled in model/deps.pml (requeue).
pub(crate) fn requeue(
    spec: &TableSpec,
    sql: &TableSql,
    others: &dyn OtherTables,
    conn: &mut dyn DbConn,
    requeue: &str,
    now: SystemTime,
    id: i64,
) -> Result<Requeued, DbError> {
    let Some((deps, own)) = statements(sql) else {
        return Ok(Requeued::NotDead);
    };
    if conn.execute(requeue, &[Value::Time(now), Value::Int(id)])? == 0 {
        return Ok(Requeued::NotDead);
    }
    let at = millis(SystemTime::now());
    let job = [Value::Text(spec.name.clone()), Value::Int(id)];
    // What it produced stays with the jobs its settlement released (an `after_settled`
    // callback not yet run reads it), not with its head, which the requeue resets.
    let kept = conn.query(&deps.head_output, &job)?;
    if let Some(output) = kept
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next())
        .filter(|v| !matches!(v, Value::Null))
    {
        let params = [output, job[0].clone(), job[1].clone()];
        conn.execute(&deps.waits_keep_output, &params)?;
    }
    conn.execute(
        &deps.head_reset,
        &[Value::Int(at), job[0].clone(), job[1].clone()],
    )?;
    let waits = conn.query(&deps.parents, &job)?;
    if waits.is_empty() {
        return Ok(Requeued::Done);
    }
    let mut pending = 0;
    for w in waits {
        let (Some(table), Some(parent)) = (text(w.first()), w.get(1).and_then(Value::as_i64))
        else {
            continue;
        };
        let settled_only = w.get(2).and_then(Value::as_i64).unwrap_or(0) != 0;
        // A wait for a signal keeps its outcome (the signal came, or it timed out); one with
        // none reads the signal's head again, under its lock, as a publish does.
        if is_signal(&table) {
            if text(w.get(3)).is_none() {
                let head = [Value::Text(table.clone()), Value::Int(parent)];
                let touch = [head[0].clone(), head[1].clone(), Value::Int(at)];
                conn.execute(&deps.head_touch, &touch)?;
                let read = conn.query(&deps.head_read, &head)?;
                match read.first().and_then(|r| text(r.first())) {
                    Some(o) => {
                        let set = [
                            Value::Text(o),
                            head[0].clone(),
                            head[1].clone(),
                            job[0].clone(),
                            job[1].clone(),
                        ];
                        conn.execute(&deps.wait_set, &set)?;
                        let out = conn.query(&deps.head_output, &head)?;
                        if let Some(out) = out
                            .into_iter()
                            .next()
                            .and_then(|r| r.into_iter().next())
                            .filter(|v| !matches!(v, Value::Null))
                        {
                            let [pt, p] = head;
                            conn.execute(&deps.waits_keep_output, &[out, pt, p])?;
                        }
                    }
                    None => pending += 1,
                }
            }
            continue;
        }
        let found;
        let waiting: &WaitingSql = match table == spec.name {
            true => own,
            false => match others.lookup(conn, &table)? {
                // Its record left by a table dropped by hand: gone all the same.
                Found::Waiting(w) if others.exists(conn, &table)? => {
                    found = w;
                    &found
                }
                // Its table is gone: its jobs count as cancelled.
                Found::Waiting(_) | Found::NoRecord | Found::NoDependencies => {
                    if !settled_only {
                        return Ok(Requeued::ParentFailed {
                            table,
                            parent,
                            outcome: CANCELLED.into(),
                        });
                    }
                    let set = [
                        Value::Text(CANCELLED.into()),
                        Value::Text(table.clone()),
                        Value::Int(parent),
                        job[0].clone(),
                        job[1].clone(),
                    ];
                    conn.execute(&deps.wait_set, &set)?;
                    continue;
                }
            },
        };
        let p = Parent {
            id: parent,
            settled_only,
            table: None,
        };
        let named = Named {
            table: &table,
            waiting,
            parent: &p,
            gone: false,
        };
        let (outcome, _) = outcome_of(deps, &named, others, conn, at)?;
        match outcome.as_deref() {
            Some(o) if !settled_only && o != ACKED => {
                return Ok(Requeued::ParentFailed {
                    table,
                    parent,
                    outcome: o.to_string(),
                })
            }
            None => pending += 1,
            Some(_) => {}
        }
        let set = [
            outcome.map_or(Value::Null, Value::Text),
            Value::Text(table.clone()),
            Value::Int(parent),
            job[0].clone(),
            job[1].clone(),
        ];
        conn.execute(&deps.wait_set, &set)?;
    }
    conn.execute(&deps.count_forget, &job)?;
    let count = [
        job[0].clone(),
        job[1].clone(),
        Value::Int(at),
        Value::Int(pending),
    ];
    conn.execute(&deps.count_insert, &count)?;
    if pending > 0 {
        let params = [Value::Time(waiting_due()), Value::Int(id)];
        conn.execute(&own.wait_again, &params)?;
    }
    Ok(Requeued::Done)
}

/// After table `table` was dropped, on `conn` inside the caller's transaction: its jobs that
/// jobs of other tables wait on count as cancelled (they will never run), so those are
/// dead-lettered (`after`) or released (`after_settled`); then every row naming the table
/// goes. Its own waiting jobs went with it.
pub(crate) fn dropped(
    deps: &DepsSql,
    others: &dyn OtherTables,
    conn: &mut dyn DbConn,
    table: &str,
) -> Result<(), DbError> {
    let name = Value::Text(table.to_string());
    let jobs = conn.query(&deps.pending_of_table, std::slice::from_ref(&name))?;
    let settling = Settling {
        deps,
        own: None,
        others,
        gone: Some(table),
    };
    for id in jobs
        .iter()
        .filter_map(|r| r.first().and_then(Value::as_i64))
    {
        settling.settle(conn, table, id, CANCELLED, None, Left::Gone)?;
    }
    conn.execute(&deps.forget_table, &[name.clone(), name])?;
    conn.execute(
        &deps.forget_signals,
        &[Value::Int(crate::dialect::signals::scope(table))],
    )?;
    Ok(())
}
