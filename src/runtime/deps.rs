//! Jobs that wait on other jobs ([`Table::dependencies`]): what a publish that names other jobs
//! does, and what a settlement does for the jobs waiting on the one it settles. Both run in
//! the caller's transaction, so a waiting job is released (or dead-lettered) in the very
//! commit that settles the last job it waits on, and no crash can leave it between the two.
//!
//! Why it cannot be lost: a publish that names job `P` and `P`'s settlement both lock `P`'s
//! head row in `sqlbroker_deps` first (see [`crate::dialect::deps`]). The one that comes second
//! sees what the first committed: the publish finds `P`'s outcome recorded; the settlement
//! finds the new wait. A settlement then counts each waiting job down (in id order) under its
//! count's row lock, so of two settlements of its last two parents, the second waits for the
//! first and takes the count to 0: it releases the job, exactly once.
//!
//! [`Table::dependencies`]: crate::Table::dependencies

use std::sync::Arc;
use std::time::SystemTime;

use crate::dialect::deps::{DepsSql, WaitingSql, ACKED, CANCELLED, DEAD};
use crate::dialect::{DbConn, TableSql};
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

/// How long the outcome of a settled job is kept in its head for publishes that name it later:
/// a day. Past that, a job still in its table tells its own outcome (dead, or kept
/// completed); one gone counts as acked.
pub(crate) const HEADS_KEPT: std::time::Duration = std::time::Duration::from_secs(86_400);

/// Deletes the heads of jobs settled more than [`HEADS_KEPT`] ago, up to 500 a call, one
/// statement each (each locks only its own row, which no settlement holds any more).
pub(crate) fn sweep(sql: &TableSql, conn: &mut dyn DbConn) -> Result<u64, DbError> {
    let Some((deps, _)) = statements(sql) else {
        return Ok(0);
    };
    let before = Value::Int(millis(SystemTime::now()) - HEADS_KEPT.as_millis() as i64);
    let mut swept = 0;
    for row in conn.query(&deps.sweep_pick, std::slice::from_ref(&before))? {
        let (Some(table), Some(id)) = (text(row.first()), row.get(1).and_then(Value::as_i64))
        else {
            continue;
        };
        swept += conn.execute(
            &deps.sweep_one,
            &[Value::Text(table), Value::Int(id), before.clone()],
        )?;
    }
    Ok(swept)
}

/// A table's statements for jobs that wait, if it has them.
pub(crate) fn statements(sql: &TableSql) -> Option<(&DepsSql, &WaitingSql)> {
    Some((sql.deps.as_ref()?, sql.waiting.as_ref()?))
}

/// Where a job named by a publish stands: settled with an outcome, or not yet.
fn outcome_of(
    deps: &DepsSql,
    named: &Named<'_>,
    conn: &mut dyn DbConn,
    at: i64,
) -> Result<Option<String>, DbError> {
    let (table, id) = (
        Value::Text(named.table.to_string()),
        Value::Int(named.parent.id),
    );
    conn.execute(
        &deps.head_touch,
        &[table.clone(), id.clone(), Value::Int(at)],
    )?;
    let recorded = conn.query(&deps.head_read, &[table, id.clone()])?;
    if let Some(outcome) = recorded.first().and_then(|r| text(r.first())) {
        return Ok(Some(outcome));
    }
    // No settlement recorded: the row itself tells (a job settled before its table took
    // part in dependencies, or whose head was swept, has no head outcome).
    let rows = conn.query(&named.waiting.state, &[id])?;
    let Some(row) = rows.first() else {
        // Not in the table: acked and not kept (or never published: not told apart).
        return Ok(Some(ACKED.into()));
    };
    let finished = row.first().is_some_and(|v| !matches!(v, Value::Null));
    let reason = text(row.get(1));
    let completed = row.get(2).is_some_and(|v| !matches!(v, Value::Null));
    Ok(match (finished, completed) {
        (false, _) => None,
        (true, true) if reason.as_deref() == Some("cancelled") => Some(CANCELLED.into()),
        (true, true) => Some(ACKED.into()),
        (true, false) => Some(DEAD.into()),
    })
}

/// How row `id` ended, if it has: what a settlement that sent it back reads, since a cancel
/// request finishes a row its retry or hand-back would send back.
pub(crate) fn finished_as(
    sql: &TableSql,
    conn: &mut dyn DbConn,
    id: i64,
) -> Result<Option<String>, DbError> {
    let Some((_, waiting)) = statements(sql) else {
        return Ok(None);
    };
    let rows = conn.query(&waiting.state, &[Value::Int(id)])?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let finished = row.first().is_some_and(|v| !matches!(v, Value::Null));
    Ok(match (finished, text(row.get(1)).as_deref()) {
        (false, _) => None,
        (true, Some("cancelled")) => Some(CANCELLED.into()),
        (true, _) => Some(DEAD.into()),
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

/// A job named by a publish, where its table's statements are known: its table's name, the
/// statements that read its row, the wait.
pub(crate) struct Named<'a> {
    pub table: &'a str,
    pub waiting: &'a WaitingSql,
    pub parent: &'a Parent,
}

/// What a new job that waits on others is to be, read under their heads' locks.
pub(crate) struct Waits {
    /// Each job waited on: its table, id, `settled_only`, and outcome so far.
    outcomes: Vec<(String, i64, bool, Option<String>)>,
}

impl Waits {
    /// Locks the heads of the `named` jobs (in `(table, id)` order: the order every publish
    /// takes them in) and reads their outcomes, on `conn` inside the publish's transaction.
    pub fn read(
        sql: &TableSql,
        conn: &mut dyn DbConn,
        mut named: Vec<Named<'_>>,
    ) -> Result<Self, DbError> {
        let Some((deps, _)) = statements(sql) else {
            return Ok(Waits {
                outcomes: Vec::new(),
            });
        };
        let at = millis(SystemTime::now());
        named.sort_by(|a, b| (a.table, a.parent.id).cmp(&(b.table, b.parent.id)));
        let mut outcomes: Vec<(String, i64, bool, Option<String>)> =
            Vec::with_capacity(named.len());
        for n in &named {
            // A job named twice is one wait: `after` if either is.
            if let Some(last) = outcomes
                .last_mut()
                .filter(|(t, id, ..)| t == n.table && *id == n.parent.id)
            {
                last.2 &= n.parent.settled_only;
                continue;
            }
            let outcome = outcome_of(deps, n, conn, at)?;
            outcomes.push((
                n.table.to_string(),
                n.parent.id,
                n.parent.settled_only,
                outcome,
            ));
        }
        Ok(Waits { outcomes })
    }

    /// True while a job it waits on has not settled.
    pub fn waiting(&self) -> bool {
        self.outcomes.iter().any(|(.., o)| o.is_none())
    }

    /// Why the new job is dead-lettered at once: a job it waits on with
    /// [`Message::after`](crate::Message::after) settled other than acked.
    pub fn failed(&self, own: &str) -> Option<String> {
        self.outcomes
            .iter()
            .find_map(|(table, id, settled_only, o)| match o.as_deref() {
                Some(o) if !settled_only && o != ACKED => Some(reason(own, table, *id, o)),
                _ => None,
            })
    }

    /// Writes the new job `child`'s waits (inserted with [`waiting_due`] as its due time when
    /// [`Waits::waiting`]) and, if a job it waits on failed, dead-letters it.
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
        for (table, id, settled_only, outcome) in &self.outcomes {
            let params = [
                Value::Text(table.clone()),
                Value::Int(*id),
                Value::Text(spec.name.clone()),
                Value::Int(child),
                Value::Int(i64::from(*settled_only)),
                outcome.clone().map_or(Value::Null, Value::Text),
                Value::Int(at),
            ];
            conn.execute(&deps.wait_insert, &params)?;
        }
        let pending = self.outcomes.iter().filter(|(.., o)| o.is_none()).count();
        if pending > 0 {
            let params = [
                Value::Text(spec.name.clone()),
                Value::Int(child),
                Value::Int(at),
                Value::Int(pending as i64),
            ];
            conn.execute(&deps.count_insert, &params)?;
        }
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

/// A dead letter's reason, in table `own`, for a job whose parent `id` of `table` settled as
/// `outcome` (the table named only when it is another).
fn reason(own: &str, table: &str, id: i64, outcome: &str) -> String {
    let what = match outcome {
        DEAD => "was dead-lettered",
        CANCELLED => "was cancelled",
        _ => "did not succeed",
    };
    match table == own {
        true => format!("job {id} it waits on {what}"),
        false => format!("job {id} of table {table} it waits on {what}"),
    }
}

/// Other tables' waiting statements, by name, read from their records as settlements need
/// them (once per broker and table).
#[derive(Default)]
pub(crate) struct Others(parking_lot::Mutex<std::collections::HashMap<String, Arc<WaitingSql>>>);

impl OtherTables for crate::runtime::Queue {
    fn waiting_of(
        &self,
        conn: &mut dyn DbConn,
        name: &str,
    ) -> Result<Option<Arc<WaitingSql>>, DbError> {
        if let Some(w) = self.others.0.lock().get(name) {
            return Ok(Some(w.clone()));
        }
        let table = crate::runtime::registry::open(&*self.dialect, conn, name)
            .map_err(|e| DbError::other(e.to_string()))?;
        let Some(spec) = table.and_then(|t| t.validate().ok()) else {
            return Ok(None);
        };
        let Some(w) = self.dialect.compile(&spec).waiting.map(Arc::new) else {
            return Ok(None);
        };
        self.others.0.lock().insert(name.to_string(), w.clone());
        Ok(Some(w))
    }
}

/// The waiting statements of the jobs of another table, for a settlement that releases them.
pub(crate) trait OtherTables {
    /// Table `name`'s waiting statements; `None` if it has no record with dependencies.
    fn waiting_of(
        &self,
        conn: &mut dyn DbConn,
        name: &str,
    ) -> Result<Option<Arc<WaitingSql>>, DbError>;
}

/// After the settlement of job `id` of `spec`'s table as `outcome` ([`ACKED`], [`DEAD`],
/// [`CANCELLED`]) with `output`, on `conn` inside the settlement's transaction: records the
/// outcome and output in the job's head, forgets
/// the job's own waits, and releases each job waiting on it that now waits on nothing, or
/// dead-letters it (then does the same for the jobs waiting on that one), in its own table or
/// another (`others`). A table without dependencies does nothing.
pub(crate) fn settled(
    spec: &TableSpec,
    sql: &TableSql,
    others: &dyn OtherTables,
    conn: &mut dyn DbConn,
    id: i64,
    outcome: &str,
    output: Option<Value>,
) -> Result<(), DbError> {
    let (Some(deps), Some(own)) = (sql.deps.as_ref(), sql.waiting.as_ref()) else {
        return Ok(());
    };
    let mut output = Some(output.unwrap_or(Value::Null));
    let now = SystemTime::now();
    let at = millis(now);
    let latest = Value::Time(waiting_due());
    let mut todo = vec![(spec.name.clone(), id, outcome.to_string())];
    while let Some((table, id, outcome)) = todo.pop() {
        let job = [Value::Text(table.clone()), Value::Int(id)];
        let settle = [
            job[0].clone(),
            job[1].clone(),
            Value::Text(outcome.clone()),
            Value::Int(at),
            // The settled job's own; the jobs dead-lettered after it produced nothing.
            output.take().unwrap_or(Value::Null),
        ];
        conn.execute(&deps.head_settle, &settle)?;
        conn.execute(&deps.forget_waits, &job)?;
        let children = conn.query(&deps.dependents, &job)?;
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
            let settled_only = row.get(2).and_then(Value::as_i64).unwrap_or(0) != 0;
            let foreign;
            let waiting: &WaitingSql = if child_table == spec.name {
                own
            } else {
                match others.waiting_of(conn, &child_table)? {
                    Some(w) => {
                        foreign = w;
                        &foreign
                    }
                    None => {
                        log::warn!(
                            "job {child} of table {child_table} waits on job {id} of table \
                             {table}, but its table has no record with dependencies: left \
                             waiting"
                        );
                        continue;
                    }
                }
            };
            // Counted down under its count's lock: the settlements of this child's parents
            // take turns, and the one that takes it to 0 is the last.
            let child_job = [Value::Text(child_table.clone()), Value::Int(child)];
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
                    todo.push((child_table, child, DEAD.to_string()));
                }
                continue;
            }
            let left = conn.query(&deps.count_read, &child_job)?;
            let left = left.first().and_then(|r| r.first()).and_then(Value::as_i64);
            crate::runtime::pause_point("deps.counted", &spec.name);
            if left == Some(0) {
                let params = [Value::Time(floor(now)), Value::Int(child), latest.clone()];
                conn.execute(&waiting.release, &params)?;
            }
        }
    }
    Ok(())
}

/// Runs a settlement's statement `sql` (`params`) of row `id` of `q`'s table on `conn`, the rows
/// it changed. On a table with dependencies, or with an `output` to write
/// ([`Table::outputs`](crate::Table::outputs)), in a transaction of its own with what the
/// outcome does, if it changed the row: the output written to the row ([`settled_with_output`]) and
/// what it does for the jobs waiting on the row ([`settled`]). `settled` is the outcome;
/// `None` for a row sent back, which a cancel request may have finished instead (read back).
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
                (_, Some(o)) => Some(o.to_string()),
                (_, None) => finished_as(&q.sql, conn, id)?,
            };
            if let Some(o) = outcome {
                settled_with_output(&q.spec, &q.sql, q, conn, id, &o, output)?;
            }
            Ok(n)
        })
        .and_then(|n| conn.batch("COMMIT").map(|()| n));
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
    settled(spec, sql, others, conn, id, outcome, output)
}

/// The jobs `id` waits on (until it settles), in id order.
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
                table: text(r.first())?,
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
