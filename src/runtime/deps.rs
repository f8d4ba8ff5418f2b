//! Jobs that wait on other jobs ([`Table::dependencies`]): what a publish that names other jobs
//! does, and what a settlement does for the jobs waiting on the one it settles. Both run in
//! the caller's transaction, so a waiting job is released (or dead-lettered) in the very
//! commit that settles the last job it waits on, and no crash can leave it between the two.
//!
//! Why it cannot be lost: a publish that names job `P` and `P`'s settlement both lock `P`'s
//! head row in `sqlbroker_deps` first (see [`crate::dialect::deps`]). The one that comes second
//! sees what the first committed: the publish finds `P`'s outcome recorded; the settlement
//! finds the new wait. A settlement then locks each waiting job's row (in id order) before it
//! counts what holds the job back, so of two settlements of its last two parents, the second
//! sees the first's mark and releases it: exactly once.
//!
//! [`Table::dependencies`]: crate::Table::dependencies

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

/// Deletes the heads of jobs settled more than [`HEADS_KEPT`] ago.
pub(crate) fn sweep(sql: &TableSql, conn: &mut dyn DbConn) -> Result<u64, DbError> {
    let Some((deps, _)) = statements(sql) else {
        return Ok(0);
    };
    let before = millis(SystemTime::now()) - HEADS_KEPT.as_millis() as i64;
    conn.execute(&deps.sweep, &[Value::Int(before)])
}

/// A table's statements for jobs that wait, if it has them.
pub(crate) fn statements(sql: &TableSql) -> Option<(&DepsSql, &WaitingSql)> {
    Some((sql.deps.as_ref()?, sql.waiting.as_ref()?))
}

/// Where a job named by a publish stands: settled with an outcome, or not yet.
fn outcome_of(
    spec: &TableSpec,
    (deps, waiting): (&DepsSql, &WaitingSql),
    conn: &mut dyn DbConn,
    id: i64,
    at: i64,
) -> Result<Option<String>, DbError> {
    let head = [Value::Text(spec.name.clone()), Value::Int(id)];
    conn.execute(
        &deps.head_touch,
        &[head[0].clone(), head[1].clone(), Value::Int(at)],
    )?;
    let recorded = conn.query(&deps.head_read, &head)?;
    if let Some(outcome) = recorded.first().and_then(|r| text(r.first())) {
        return Ok(Some(outcome));
    }
    // No settlement recorded: the row itself tells (a job settled before its table took
    // part in dependencies, or whose head was swept, has no head outcome).
    let rows = conn.query(&waiting.state, &[Value::Int(id)])?;
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

fn text(v: Option<&Value>) -> Option<String> {
    match v {
        Some(Value::Text(s)) => Some(s.clone()),
        Some(Value::Bytes(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

/// A job a new one waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Parent {
    pub id: i64,
    /// [`Message::after_settled`](crate::Message::after_settled): runs whatever its outcome.
    pub settled_only: bool,
}

/// What a new job that waits on `parents` is to be, read under their heads' locks.
pub(crate) struct Waits {
    outcomes: Vec<(Parent, Option<String>)>,
}

impl Waits {
    /// Locks the heads of `parents` (ascending ids: the order every publish takes them in)
    /// and reads their outcomes, on `conn` inside the publish's transaction.
    pub fn read(
        spec: &TableSpec,
        sql: &TableSql,
        conn: &mut dyn DbConn,
        parents: &[Parent],
    ) -> Result<Self, DbError> {
        let Some(st) = statements(sql) else {
            return Ok(Waits {
                outcomes: Vec::new(),
            });
        };
        let at = millis(SystemTime::now());
        let mut sorted = parents.to_vec();
        sorted.sort_by_key(|p| p.id);
        let mut outcomes = Vec::with_capacity(sorted.len());
        for p in sorted {
            outcomes.push((p, outcome_of(spec, st, conn, p.id, at)?));
        }
        Ok(Waits { outcomes })
    }

    /// True while a job it waits on has not settled.
    pub fn waiting(&self) -> bool {
        self.outcomes.iter().any(|(_, o)| o.is_none())
    }

    /// Why the new job is dead-lettered at once: a job it waits on with
    /// [`Message::after`](crate::Message::after) settled other than acked.
    pub fn failed(&self) -> Option<String> {
        self.outcomes.iter().find_map(|(p, o)| match o.as_deref() {
            Some(o) if !p.settled_only && o != ACKED => Some(reason(p.id, o)),
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
        for (p, outcome) in &self.outcomes {
            let params = [
                Value::Text(spec.name.clone()),
                Value::Int(p.id),
                Value::Text(spec.name.clone()),
                Value::Int(child),
                Value::Int(i64::from(p.settled_only)),
                outcome.clone().map_or(Value::Null, Value::Text),
                Value::Int(at),
            ];
            conn.execute(&deps.wait_insert, &params)?;
        }
        if let Some(why) = self.failed() {
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

/// A dead letter's reason for a job whose parent `id` settled as `outcome`.
fn reason(id: i64, outcome: &str) -> String {
    let what = match outcome {
        DEAD => "was dead-lettered",
        CANCELLED => "was cancelled",
        _ => "did not succeed",
    };
    format!("job {id} it waits on {what}")
}

/// After the settlement of job `id` as `outcome` ([`ACKED`], [`DEAD`], [`CANCELLED`]), on
/// `conn` inside the settlement's transaction: records the outcome, forgets the job's own
/// waits, and releases each job waiting on it that now waits on nothing, or dead-letters it
/// (then does the same for the jobs waiting on that one). A table without dependencies does
/// nothing.
pub(crate) fn settled(
    spec: &TableSpec,
    sql: &TableSql,
    conn: &mut dyn DbConn,
    id: i64,
    outcome: &str,
) -> Result<(), DbError> {
    let Some((deps, waiting)) = statements(sql) else {
        return Ok(());
    };
    let now = SystemTime::now();
    let at = millis(now);
    let table = Value::Text(spec.name.clone());
    let latest = Value::Time(waiting_due());
    let mut todo = vec![(id, outcome.to_string())];
    while let Some((id, outcome)) = todo.pop() {
        let job = [table.clone(), Value::Int(id)];
        let settle = [
            table.clone(),
            Value::Int(id),
            Value::Text(outcome.clone()),
            Value::Int(at),
        ];
        conn.execute(&deps.head_settle, &settle)?;
        conn.execute(&deps.forget_waits, &job)?;
        let children = conn.query(&deps.dependents, &job)?;
        if children.is_empty() {
            continue;
        }
        conn.execute(
            &deps.mark,
            &[Value::Text(outcome.clone()), table.clone(), Value::Int(id)],
        )?;
        for row in children {
            let (Some(child), settled_only) = (
                row.get(1).and_then(Value::as_i64),
                row.get(2).and_then(Value::as_i64).unwrap_or(0) != 0,
            ) else {
                continue;
            };
            // Serialises the settlements of this child's parents: the last one sees every
            // other's mark. A child no longer waiting (cancelled meanwhile) is left alone.
            let locked = conn.query(&waiting.lock_waiting, &[Value::Int(child), latest.clone()])?;
            if locked.is_empty() {
                continue;
            }
            if !settled_only && outcome != ACKED {
                let params = [
                    Value::Time(floor(now)),
                    Value::Text(reason(id, &outcome)),
                    Value::Int(child),
                    latest.clone(),
                ];
                conn.execute(&waiting.dead, &params)?;
                todo.push((child, DEAD.to_string()));
                continue;
            }
            let held = conn.query(&deps.blocking, &[table.clone(), Value::Int(child)])?;
            let held = held.first().and_then(|r| r.first()).and_then(Value::as_i64);
            crate::runtime::pause_point("deps.counted", &spec.name);
            if held.unwrap_or(0) == 0 {
                let params = [Value::Time(floor(now)), Value::Int(child), latest.clone()];
                conn.execute(&waiting.release, &params)?;
            }
        }
    }
    Ok(())
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
                id: r.get(1)?.as_i64()?,
                any_outcome: r.get(2).and_then(Value::as_i64).unwrap_or(0) != 0,
                outcome: text(r.get(3)).and_then(|o| JobOutcome::from_recorded(&o)),
            })
        })
        .collect())
}

/// The jobs waiting on `id` (until each settles), in id order.
pub(crate) fn dependents_of(
    spec: &TableSpec,
    sql: &TableSql,
    conn: &mut dyn DbConn,
    id: i64,
) -> Result<Vec<i64>, DbError> {
    let Some((deps, _)) = statements(sql) else {
        return Ok(Vec::new());
    };
    let rows = conn.query(
        &deps.dependents,
        &[Value::Text(spec.name.clone()), Value::Int(id)],
    )?;
    Ok(rows.iter().filter_map(|r| r.get(1)?.as_i64()).collect())
}
