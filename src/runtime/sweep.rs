//! The sweeper of `sqlbroker_deps` (`sqlbroker-sweep`, one thread per broker, started with the
//! broker's first table with dependencies, stopped when the broker is dropped): it keeps the
//! waits' table as small as the jobs that wait, off the handlers' threads.
//!
//! A settlement deletes its job's head itself when nothing waits on it ([`crate::runtime::deps`]
//! has the rule); what is left for the sweeper is bounded by what waits:
//! - the head of a job settled while jobs waited on it, once they have settled too (a head
//!   a publish has just named again stays: the delete compares the head's `at`, which every
//!   publish that names it moves on);
//! - the head of a job dead-lettered or cancelled whose row is gone, a day after;
//! - **orphans**: the head of a job whose row went without a settlement (deleted by hand, or
//!   its table dropped by hand) is settled as its row tells (gone: acked; its table gone:
//!   cancelled), so the jobs waiting on it are released or dead-lettered; the waits of a job
//!   that is gone (deleted by hand, purged) are deleted;
//! - **signals** ([`crate::runtime::signals`]): a wait for a signal past its deadline times
//!   out (its job is counted down, under the signal's head's lock); a signal's head that no
//!   job waits for is deleted, at once if it holds no signal, else [`HEADS_KEPT`] after it was
//!   sent or last read by a publish.
//!
//! Each pass reads at most [`SWEEP_WINDOW`] rows in key order from a cursor that goes round the
//! table and deletes the heads it found unneeded, in statements of up to [`SWEEP_BATCH`]; it
//! reads no job's row for that (a head kept for its own outcome says so itself). One round in
//! [`ORPHANS_EVERY`] also looks for orphans: it reads the rows of the jobs the window's counts
//! and unsettled heads name, one statement per table and [`STATES_BATCH`] jobs, and settles
//! an orphan in a transaction of its own, under its head's lock. The sweeper holds no lock of
//! its own across SQL, and a pooled connection for a pass at a time. A pass that changed
//! something is followed by the next at once (after [`BUSY`]), so the sweep runs as fast as
//! its statements do while there is work; one that found nothing goes on with the round after
//! [`STEP`]; a round that found nothing waits [`IDLE`].

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{Condvar, Mutex};

use crate::dialect::deps::{
    DepsSql, WaitingSql, CANCELLED, STATES_BATCH, SWEEP_BATCH, SWEEP_WINDOW,
};
use crate::dialect::signals::is_signal;
use crate::dialect::{DbConn, Dialect};
use crate::error::DbError;
use crate::model::schedule::millis;
use crate::model::value::Value;
use crate::runtime::deps::{
    row_state, state_of, Found, Left, OtherTables, Others, RowState, Settling, HEADS_KEPT,
};
use crate::runtime::Pool;

/// The pause after a pass that found work.
pub(crate) const BUSY: Duration = Duration::from_millis(5);

/// The pause after a pass that found nothing to do, in the middle of a round of the table.
pub(crate) const STEP: Duration = Duration::from_millis(50);

/// How often a round looks for orphans (reading the rows of the jobs it meets); the rounds
/// between only delete the heads nothing needs.
pub(crate) const ORPHANS_EVERY: Duration = Duration::from_secs(5);

/// The pause after a round of the table that found nothing to do.
pub(crate) const IDLE: Duration = Duration::from_secs(2);

/// Rows younger than this are not checked against their job's row: they were just written
/// by a publish, whose job is there.
const CHECK_AGE: Duration = Duration::from_secs(2);

/// How long a dropped broker waits for its sweeper to stop (it checks between statements).
const STOP_WAIT: Duration = Duration::from_secs(2);

/// The thread's name.
pub(crate) const THREAD: &str = "sqlbroker-sweep";

/// A broker's sweeper: the thread, started once.
#[derive(Default)]
pub(crate) struct Sweeper {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    started: bool,
    stop: bool,
    /// The thread has ended (or never started).
    ended: bool,
}

impl Sweeper {
    /// Starts the thread, once, sweeping the database of `dialect` on connections of `pool`.
    /// A thread that cannot be started is logged (the waits' table then grows until a broker
    /// whose sweeper runs sweeps it).
    pub fn start(&self, dialect: &Arc<dyn Dialect>, pool: &Pool) {
        let mut st = self.shared.state.lock();
        if st.started || st.stop || dialect.deps().is_none() {
            return;
        }
        let (shared, dialect, pool) = (self.shared.clone(), dialect.clone(), pool.clone());
        let spawned = std::thread::Builder::new()
            .name(THREAD.into())
            .spawn(move || run(&shared, &*dialect, &pool));
        match spawned {
            Ok(_) => st.started = true,
            Err(e) => log::warn!("starting the sweeper of sqlbroker_deps: {e}"),
        }
    }

    /// True while its thread runs, asked of the sweeper or, once it is dropped, of what it
    /// leaves.
    #[cfg(test)]
    pub fn running(&self) -> impl Fn() -> bool + Send + 'static {
        let shared = self.shared.clone();
        move || {
            let st = shared.state.lock();
            st.started && !st.ended
        }
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + STOP_WAIT;
        let mut st = self.shared.state.lock();
        st.stop = true;
        self.shared.cv.notify_all();
        while st.started && !st.ended {
            if self.shared.cv.wait_until(&mut st, deadline).timed_out() {
                log::debug!("the sweeper did not stop within {STOP_WAIT:?}");
                break;
            }
        }
    }
}

fn run(shared: &Shared, dialect: &dyn Dialect, pool: &Pool) {
    let stopped = || shared.state.lock().stop;
    if let Some(deps) = dialect.deps() {
        let tables = Others::default();
        let mut cursor = Cursor::default();
        // Something changed in this round of the table.
        let mut round_changed = false;
        // This round looks for orphans, and when the last one that did began.
        let mut orphans = false;
        let mut orphans_at: Option<Instant> = None;
        while !stopped() {
            if cursor.at_start() {
                orphans = orphans_at.is_none_or(|at| at.elapsed() >= ORPHANS_EVERY);
                if orphans {
                    orphans_at = Some(Instant::now());
                }
            }
            let pause = match pool.get_timeout(Duration::from_millis(100)) {
                Err(_) => IDLE,
                Ok(mut conn) => {
                    let now = SystemTime::now();
                    let how = How {
                        now,
                        orphans,
                        stopped: &stopped,
                    };
                    let done = pass(deps, dialect, &tables, &mut *conn, &mut cursor, &how);
                    drop(conn);
                    match done {
                        Ok(p) if p.changed > 0 => {
                            round_changed = true;
                            BUSY
                        }
                        Ok(_) if !cursor.at_start() => STEP,
                        // A round ended: another at once if this one changed something (a
                        // head its waiters' deletion freed), else a rest.
                        Ok(_) if std::mem::take(&mut round_changed) => BUSY,
                        Ok(_) => IDLE,
                        Err(e) => {
                            log::debug!("sweeping sqlbroker_deps: {e}");
                            IDLE
                        }
                    }
                }
            };
            let mut st = shared.state.lock();
            if !st.stop {
                shared.cv.wait_for(&mut st, pause);
            }
        }
    }
    let mut st = shared.state.lock();
    st.ended = true;
    shared.cv.notify_all();
}

/// How a pass runs: the time now (past [`HEADS_KEPT`] a head kept for its own outcome goes),
/// whether it looks for orphans (reading job rows), and what ends it early.
pub(crate) struct How<'a> {
    pub now: SystemTime,
    pub orphans: bool,
    pub stopped: &'a dyn Fn() -> bool,
}

/// Where the next pass reads from: past this key of `sqlbroker_deps` (`None`: from the first).
#[derive(Debug, Clone, Default)]
pub(crate) struct Cursor(Option<(String, i64, String, i64)>);

impl Cursor {
    /// Past `(parent_table, parent, child_table, child)`.
    pub fn past(parent_table: &str, parent: i64, child_table: &str, child: i64) -> Self {
        Cursor(Some((
            parent_table.to_string(),
            parent,
            child_table.to_string(),
            child,
        )))
    }

    /// True at the start of a round.
    pub fn at_start(&self) -> bool {
        self.0.is_none()
    }
}

/// What a pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pass {
    /// Rows read.
    pub read: usize,
    /// Heads deleted, orphans settled and gone jobs' waits deleted.
    pub changed: usize,
}

/// One row of the window.
struct Row {
    parent_table: String,
    parent: i64,
    child_table: String,
    child: i64,
    outcome: Option<String>,
    at: i64,
    /// A head kept for its own outcome (`settled_only` 1: its job's row can no longer tell).
    kept: bool,
}

fn text(v: Option<&Value>) -> Option<String> {
    match v {
        Some(Value::Text(s)) => Some(s.clone()),
        Some(Value::Bytes(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

/// One pass of the sweeper over the window past `cursor` (moved on), as `how` says.
pub(crate) fn pass(
    deps: &DepsSql,
    dialect: &dyn Dialect,
    tables: &Others,
    conn: &mut dyn DbConn,
    cursor: &mut Cursor,
    how: &How<'_>,
) -> Result<Pass, DbError> {
    let rows = match &cursor.0 {
        None => conn.query(&deps.window_first, &[])?,
        Some((pt, p, ct, c)) => {
            let (pt, p, ct, c) = (
                Value::Text(pt.clone()),
                Value::Int(*p),
                Value::Text(ct.clone()),
                Value::Int(*c),
            );
            let params = match deps.window_spelled {
                true => vec![pt.clone(), pt, p.clone(), p, ct.clone(), ct, c],
                false => vec![pt, p, ct, c],
            };
            conn.query(&deps.window, &params)?
        }
    };
    let full = rows.len() >= SWEEP_WINDOW;
    let rows: Vec<Row> = rows
        .into_iter()
        .filter_map(|r| {
            Some(Row {
                parent_table: text(r.first())?,
                parent: r.get(1)?.as_i64()?,
                child_table: text(r.get(2))?,
                child: r.get(3)?.as_i64()?,
                outcome: text(r.get(4)),
                at: r.get(5).and_then(Value::as_i64).unwrap_or(0),
                kept: r.get(6).and_then(Value::as_i64).unwrap_or(0) != 0,
            })
        })
        .collect();
    let sweeper = Sweep {
        deps,
        dialect,
        tables,
        now: millis(how.now),
    };
    // The jobs whose rows this pass reads, at most a statement per table and
    // `STATES_BATCH` of its jobs: the waiting jobs of the counts met, and the jobs of the heads
    // with no outcome (not settled, or gone without a settlement).
    let seen = match how.orphans {
        true => {
            let wanted = rows.iter().filter(|r| sweeper.checked(r)).map(|r| {
                match r.parent_table.is_empty() {
                    true => (r.child_table.as_str(), r.child),
                    false => (r.parent_table.as_str(), r.parent),
                }
            });
            sweeper.look(conn, wanted)
        }
        false => Seen::default(),
    };
    let mut done = Pass::default();
    let mut last = None;
    // Settled heads to delete, as read: `(table, id, at)`.
    let mut doomed: Vec<(String, i64, i64)> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        if (how.stopped)() {
            break;
        }
        let step = if r.parent_table.is_empty() {
            sweeper.count(conn, r, &seen)
        } else if r.child_table.is_empty() {
            let waited = match rows.get(i + 1) {
                Some(n) => Ok(n.parent_table == r.parent_table && n.parent == r.parent),
                None if full => sweeper.waited_on(conn, r),
                None => Ok(false),
            };
            waited.and_then(|waited| match sweeper.head(conn, r, waited, &seen)? {
                Head::Delete => {
                    doomed.push((r.parent_table.clone(), r.parent, r.at));
                    Ok(0)
                }
                Head::Settled(n) => Ok(n),
            })
        } else if is_signal(&r.parent_table) && r.outcome.is_none() && r.at <= sweeper.now {
            let wait = [
                Value::Text(r.parent_table.clone()),
                Value::Int(r.parent),
                Value::Text(r.child_table.clone()),
                Value::Int(r.child),
            ];
            crate::runtime::signals::expire(deps, &sweeper, conn, wait, sweeper.now)
        } else {
            Ok(0)
        };
        match step {
            Ok(n) => done.changed += n,
            Err(e) => log::debug!(
                "sweeping sqlbroker_deps at ({}, {}, {}, {}): {e}",
                r.parent_table,
                r.parent,
                r.child_table,
                r.child
            ),
        }
        done.read += 1;
        last = Some(r);
    }
    for heads in doomed.chunks(SWEEP_BATCH) {
        match sweeper.delete(conn, heads) {
            Ok(n) => done.changed += n,
            Err(e) => log::debug!("sweeping sqlbroker_deps: {e}"),
        }
    }
    *cursor = match last {
        // Round again from the first row once a window ends the table.
        Some(_) if !full && done.read == rows.len() => Cursor::default(),
        Some(r) => Cursor::past(&r.parent_table, r.parent, &r.child_table, r.child),
        None if rows.is_empty() => Cursor::default(),
        None => cursor.clone(),
    };
    Ok(done)
}

/// What the sweeper does with a head.
enum Head {
    /// Nothing needs it: deleted, if it is still as read.
    Delete,
    /// Kept (0), or its job settled (1).
    Settled(usize),
}

/// What a pass needs for each row.
struct Sweep<'a> {
    deps: &'a DepsSql,
    dialect: &'a dyn Dialect,
    tables: &'a Others,
    /// Now, in milliseconds since the epoch.
    now: i64,
}

/// How a job stands, where the sweeper can tell.
#[derive(Debug, Clone, PartialEq)]
enum Job {
    Row(RowState),
    /// Its table is gone (no record, no table): the job counts as cancelled.
    TableGone,
    /// Its table has no record with dependencies (or could not be read): left alone.
    Unknown,
}

/// The jobs a pass read, by table and id.
type Seen = HashMap<(String, i64), Job>;

impl OtherTables for Sweep<'_> {
    fn lookup(&self, conn: &mut dyn DbConn, name: &str) -> Result<Found, DbError> {
        self.tables.lookup(self.dialect, conn, name)
    }

    fn exists(&self, conn: &mut dyn DbConn, name: &str) -> Result<bool, DbError> {
        Sweep::exists(self, conn, name)
    }
}

impl Sweep<'_> {
    /// True if `r` is checked against its job: a count, or a head with no outcome, written
    /// long enough ago (by a publish, whose job was there).
    fn checked(&self, r: &Row) -> bool {
        let kind = r.parent_table.is_empty()
            || (r.child_table.is_empty() && r.outcome.is_none() && !is_signal(&r.parent_table));
        kind && self.now - r.at >= CHECK_AGE.as_millis() as i64
    }

    /// True if table `name` exists.
    fn exists(&self, conn: &mut dyn DbConn, name: &str) -> Result<bool, DbError> {
        let rows = conn.query(self.dialect.columns_query(), &[Value::Text(name.into())])?;
        Ok(!rows.is_empty())
    }

    /// Table `name`'s waiting statements, or how its jobs stand without them.
    fn table(
        &self,
        conn: &mut dyn DbConn,
        name: &str,
    ) -> Result<Result<Arc<WaitingSql>, Job>, DbError> {
        Ok(match self.tables.lookup(self.dialect, conn, name)? {
            Found::Waiting(w) => Ok(w),
            Found::NoRecord if !self.exists(conn, name)? => Err(Job::TableGone),
            Found::NoRecord | Found::NoDependencies => Err(Job::Unknown),
        })
    }

    /// A table's statement failed: dropped (its jobs gone with it), or made again with other
    /// columns (its record is read again next time).
    fn failed(&self, conn: &mut dyn DbConn, name: &str, e: DbError) -> Result<Job, DbError> {
        self.tables.forget(name);
        match self.exists(conn, name)? {
            false => Ok(Job::TableGone),
            true => Err(e),
        }
    }

    /// How the `wanted` jobs stand, by table, in statements of up to [`STATES_BATCH`]; a
    /// table that cannot be read leaves its jobs out (they are looked at next round).
    fn look<'r>(
        &self,
        conn: &mut dyn DbConn,
        wanted: impl Iterator<Item = (&'r str, i64)>,
    ) -> Seen {
        // Each job once: a job both waited on (its head) and waiting (its count) is met twice,
        // and read once (its state is then the same for both rows).
        let mut by_table: HashMap<&str, BTreeSet<i64>> = HashMap::new();
        for (table, id) in wanted {
            by_table.entry(table).or_default().insert(id);
        }
        let mut seen = Seen::new();
        for (table, ids) in by_table {
            let ids: Vec<i64> = ids.into_iter().collect();
            if let Err(e) = self.look_in(conn, table, &ids, &mut seen) {
                log::debug!("sweeping sqlbroker_deps: reading jobs of table {table}: {e}");
            }
        }
        seen
    }

    fn look_in(
        &self,
        conn: &mut dyn DbConn,
        table: &str,
        ids: &[i64],
        seen: &mut Seen,
    ) -> Result<(), DbError> {
        let mut all = |job: Job| {
            for id in ids {
                seen.insert((table.to_string(), *id), job.clone());
            }
        };
        let waiting = match self.table(conn, table)? {
            Ok(w) => w,
            Err(job) => {
                all(job);
                return Ok(());
            }
        };
        let mut found = HashMap::new();
        for chunk in ids.chunks(STATES_BATCH) {
            let last = chunk[chunk.len() - 1];
            let params: Vec<Value> = chunk
                .iter()
                .copied()
                .chain(std::iter::repeat(last))
                .take(STATES_BATCH)
                .map(Value::Int)
                .collect();
            match conn.query(&waiting.states, &params) {
                Ok(rows) => {
                    for mut row in rows {
                        if row.is_empty() {
                            continue;
                        }
                        if let Some(id) = row.remove(0).as_i64() {
                            found.insert(id, state_of(row));
                        }
                    }
                }
                Err(e) => {
                    all(self.failed(conn, table, e)?);
                    return Ok(());
                }
            }
        }
        for id in ids {
            // Not found: gone. A duplicate id would find its row taken by the first (`look`
            // passes each once), and be taken for gone: its waits deleted while it waits.
            let state = found.get(id).cloned().unwrap_or(RowState::Gone);
            seen.insert((table.to_string(), *id), Job::Row(state));
        }
        Ok(())
    }

    /// How job `id` of `table` stands, read alone (under its head's lock).
    fn look_one(&self, conn: &mut dyn DbConn, table: &str, id: i64) -> Result<Job, DbError> {
        let waiting = match self.table(conn, table)? {
            Ok(w) => w,
            Err(job) => return Ok(job),
        };
        // Read inside the settlement's transaction: a statement on a table dropped by hand
        // (its record left) would abort it on PostgreSQL, and `failed`'s check with it, every
        // round. Asked first, the table's absence is an answer.
        if !self.exists(conn, table)? {
            self.tables.forget(table);
            return Ok(Job::TableGone);
        }
        match row_state(&waiting, conn, id) {
            Ok(state) => Ok(Job::Row(state)),
            Err(e) => self.failed(conn, table, e),
        }
    }

    /// True if a job waits on `r`'s job (read when the window ends at its head).
    fn waited_on(&self, conn: &mut dyn DbConn, r: &Row) -> Result<bool, DbError> {
        let job = [Value::Text(r.parent_table.clone()), Value::Int(r.parent)];
        Ok(!conn.query(&self.deps.has_waits, &job)?.is_empty())
    }

    /// A job's count (every job that waits has one): its waits deleted if the job is gone, or
    /// completed without them being forgotten (by hand); a dead letter keeps them.
    fn count(&self, conn: &mut dyn DbConn, r: &Row, seen: &Seen) -> Result<usize, DbError> {
        let gone = match seen.get(&(r.child_table.clone(), r.child)) {
            Some(Job::Row(RowState::Gone) | Job::TableGone) => true,
            Some(Job::Row(state @ RowState::Finished { .. })) => {
                state.left() == Some(Left::Completed)
            }
            Some(Job::Row(RowState::Live) | Job::Unknown) | None => false,
        };
        if !gone {
            return Ok(0);
        }
        let job = [Value::Text(r.child_table.clone()), Value::Int(r.child)];
        Ok(conn.execute(&self.deps.forget_waits, &job)?.min(1) as usize)
    }

    /// A head: deleted if nothing needs it; settled if its job went without a settlement.
    fn head(
        &self,
        conn: &mut dyn DbConn,
        r: &Row,
        waited: bool,
        seen: &Seen,
    ) -> Result<Head, DbError> {
        // A signal's head that holds no signal: needed while a job waits for it (a publish
        // that has just made it is given CHECK_AGE to write its wait).
        if is_signal(&r.parent_table) && r.outcome.is_none() {
            if waited || self.now - r.at < CHECK_AGE.as_millis() as i64 {
                return Ok(Head::Settled(0));
            }
            let params = [
                Value::Text(r.parent_table.clone()),
                Value::Int(r.parent),
                Value::Int(r.at),
            ];
            let n = conn.execute(&self.deps.signals.unhead_unsent, &params)?;
            return Ok(Head::Settled(n.min(1) as usize));
        }
        if r.outcome.is_none() {
            return match seen.get(&(r.parent_table.clone(), r.parent)) {
                Some(Job::Row(RowState::Gone | RowState::Finished { .. }) | Job::TableGone) => {
                    self.orphan(conn, r).map(Head::Settled)
                }
                _ => Ok(Head::Settled(0)),
            };
        }
        if waited {
            return Ok(Head::Settled(0));
        }
        // Its job's row can no longer tell its outcome (a cancel removed it, a purge deleted
        // it): the head alone does, for a day.
        if r.kept && self.now - r.at < HEADS_KEPT.as_millis() as i64 {
            return Ok(Head::Settled(0));
        }
        Ok(Head::Delete)
    }

    /// Deletes `heads` (`(table, id, at)`, at most [`SWEEP_BATCH`]) where they are still as
    /// read, in one statement; how many went.
    fn delete(
        &self,
        conn: &mut dyn DbConn,
        heads: &[(String, i64, i64)],
    ) -> Result<usize, DbError> {
        let Some(last) = heads.last() else {
            return Ok(0);
        };
        let mut params = Vec::with_capacity(3 * SWEEP_BATCH);
        for (table, id, at) in heads
            .iter()
            .chain(std::iter::repeat(last))
            .take(SWEEP_BATCH)
        {
            params.extend([Value::Text(table.clone()), Value::Int(*id), Value::Int(*at)]);
        }
        for (table, ..) in heads {
            crate::runtime::pause_point("deps.sweep", table);
        }
        Ok(conn.execute(&self.deps.sweep_many, &params)? as usize)
    }

    /// A head with no outcome whose job was found gone, or finished, without a settlement: in
    /// a transaction under its head's lock, read again and settled as its row tells (gone
    /// from its table: acked; its table gone: cancelled), so the jobs waiting on it are
    /// released or dead-lettered, as a later publish naming it would be.
    fn orphan(&self, conn: &mut dyn DbConn, r: &Row) -> Result<usize, DbError> {
        let job = [Value::Text(r.parent_table.clone()), Value::Int(r.parent)];
        conn.batch(&self.deps.begin_write)?;
        let settled = (|| -> Result<usize, DbError> {
            let head = conn.query(&self.deps.head_read, &job)?;
            match head.first() {
                Some(h) if text(h.first()).is_none() => {}
                // Deleted, or settled meanwhile.
                _ => return Ok(0),
            }
            let (outcome, left, gone) = match self.look_one(conn, &r.parent_table, r.parent)? {
                Job::Row(state) => match (state.outcome(), state.left()) {
                    (Some(o), Some(left)) => (o, left, None),
                    _ => return Ok(0),
                },
                Job::TableGone => (CANCELLED, Left::Gone, Some(r.parent_table.as_str())),
                Job::Unknown => return Ok(0),
            };
            log::info!(
                "job {} of table {} went without a settlement: settled as {outcome} for the \
                 jobs waiting on it",
                r.parent,
                r.parent_table
            );
            let settling = Settling {
                deps: self.deps,
                own: None,
                others: self,
                gone,
            };
            settling.settle(conn, &r.parent_table, r.parent, outcome, None, left)?;
            Ok(1)
        })()
        .and_then(|n| conn.batch("COMMIT").map(|()| n));
        if settled.is_err() {
            conn.rollback_or_discard();
        }
        settled
    }
}
