//! Jobs that wait for a signal ([`Message::after_signal`]): what a signal does, what a publish
//! that waits for one reads, what the sweeper does past a wait's deadline, and what a delivery
//! and an operator read. Each runs in its caller's transaction, on the rows
//! [`crate::dialect::signals`] describes.
//!
//! Why a job is released exactly once: a signal, a publish that waits for it and the
//! sweeper's timeout all lock the signal's head in `sqlbroker_deps` first. The signal records
//! itself in the head (a latch: a publish after it reads it, and its job waits on nothing
//! for it) and marks the waits with no outcome; the timeout marks one wait only if it has
//! none. So each wait gets one outcome, and it is counted down once, under the job's count's
//! lock, as a settled job counts it down: the statement that takes the count to 0 releases the
//! job, in the same commit.
//!
//! Bounded: a wait goes with its job's settlement (as every wait does). A head that holds no
//! signal is deleted by the sweeper once no job waits for it; a head that holds one is kept
//! [`HEADS_KEPT`] (a day) from the signal, or from the last publish that read it, then
//! deleted by the sweeper once no job waits for it.
//!
//! [`Message::after_signal`]: crate::Message::after_signal
//! [`HEADS_KEPT`]: crate::runtime::deps::HEADS_KEPT

use std::time::{Duration, SystemTime};

use crate::dialect::deps::{DepsSql, ACKED};
use crate::dialect::signals::{head_name, is_signal, name_of, scope, NO_DEADLINE, TIMED_OUT};
use crate::dialect::{DbConn, TableSql};
use crate::error::DbError;
use crate::model::schedule::{floor, millis};
use crate::model::table::TableSpec;
use crate::model::value::Value;
use crate::model::waits::{Signal, SignalWait, WaitingSignal};
use crate::runtime::deps::{statements, waiting_due, Found, OtherTables};

fn text(v: Option<&Value>) -> Option<String> {
    match v {
        Some(Value::Text(s)) => Some(s.clone()),
        Some(Value::Bytes(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

/// Signal `name`'s head key in table `table`: `[parent_table, parent]`.
pub(crate) fn head(table: &str, name: &str) -> [Value; 2] {
    [Value::Text(head_name(name)), Value::Int(scope(table))]
}

/// A deadline `d` from now, in milliseconds (saturating).
pub(crate) fn deadline(d: Option<Duration>) -> i64 {
    match d {
        None => NO_DEADLINE,
        Some(d) => {
            let now = millis(SystemTime::now());
            now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        }
    }
}

/// Sends signal `name` of `spec`'s table with `payload`, on `conn` inside the caller's
/// transaction: records it in its head, unless it was sent before (then nothing changes:
/// 0), and releases each job waiting for it that now waits on nothing. How many it released.
pub(crate) fn signal(
    spec: &TableSpec,
    sql: &TableSql,
    conn: &mut dyn DbConn,
    name: &str,
    payload: &[u8],
) -> Result<u64, DbError> {
    let Some((deps, waiting)) = statements(sql) else {
        return Ok(0);
    };
    let [pt, p] = head(&spec.name, name);
    let at = millis(SystemTime::now());
    conn.execute(&deps.head_touch, &[pt.clone(), p.clone(), Value::Int(at)])?;
    let read = conn.query(&deps.head_read, &[pt.clone(), p.clone()])?;
    if read.first().and_then(|r| text(r.first())).is_some() {
        return Ok(0);
    }
    let payload = Value::Bytes(payload.to_vec());
    // Kept (`settled_only` 1): the head alone tells the jobs published later.
    let settle = [
        pt.clone(),
        p.clone(),
        Value::Text(ACKED.into()),
        Value::Int(at),
        payload.clone(),
        Value::Int(1),
    ];
    conn.execute(&deps.head_settle, &settle)?;
    let children = conn.query(&deps.dependents, &[pt.clone(), p.clone()])?;
    if children.is_empty() {
        return Ok(0);
    }
    conn.execute(
        &deps.mark,
        &[Value::Text(ACKED.into()), pt.clone(), p.clone()],
    )?;
    // Each wait keeps the payload: its job reads it whatever becomes of the head.
    conn.execute(&deps.waits_keep_output, &[payload, pt, p])?;
    let now = Value::Time(floor(SystemTime::now()));
    let latest = Value::Time(waiting_due());
    let mut released = 0;
    for row in children {
        let (Some(child_table), Some(child)) =
            (text(row.first()), row.get(1).and_then(Value::as_i64))
        else {
            continue;
        };
        if child_table != spec.name {
            continue;
        }
        crate::runtime::pause_point("signal.counted", &spec.name);
        released += count_down(deps, waiting, conn, &child_table, child, &now, &latest)?;
    }
    Ok(released)
}

/// Counts job `child` down by one under its count's lock and releases it if that was its last
/// wait: the rows released.
fn count_down(
    deps: &DepsSql,
    waiting: &crate::dialect::deps::WaitingSql,
    conn: &mut dyn DbConn,
    child_table: &str,
    child: i64,
    now: &Value,
    latest: &Value,
) -> Result<u64, DbError> {
    let job = [Value::Text(child_table.to_string()), Value::Int(child)];
    conn.execute(&deps.count_down, &job)?;
    let left = conn.query(&deps.count_read, &job)?;
    let left = left.first().and_then(|r| r.first()).and_then(Value::as_i64);
    if left != Some(0) {
        return Ok(0);
    }
    conn.execute(
        &waiting.release,
        &[now.clone(), Value::Int(child), latest.clone()],
    )
}

/// What a publish reads of signal `name` of table `table`, its head made if missing and
/// locked: `(parent_table, parent, outcome, payload)` of the wait to write (`outcome` `None`:
/// not sent yet).
pub(crate) fn read_for_publish(
    deps: &DepsSql,
    conn: &mut dyn DbConn,
    table: &str,
    name: &str,
) -> Result<(String, i64, Option<String>, Option<Value>), DbError> {
    let [pt, p] = head(table, name);
    let at = millis(SystemTime::now());
    conn.execute(&deps.head_touch, &[pt.clone(), p.clone(), Value::Int(at)])?;
    let read = conn.query(&deps.head_read, &[pt.clone(), p.clone()])?;
    let outcome = read.first().and_then(|r| text(r.first()));
    let payload = match outcome {
        None => None,
        Some(_) => conn
            .query(&deps.head_output, &[pt, p])?
            .into_iter()
            .next()
            .and_then(|r| r.into_iter().next())
            .filter(|v| !matches!(v, Value::Null)),
    };
    Ok((head_name(name), scope(table), outcome, payload))
}

/// A wait's deadline passed (the sweeper read it so): in a transaction of its own under its
/// signal's head's lock, if the wait still has no outcome, it times out and its job is
/// counted down (released if it waited on nothing else). 1 if it timed out.
pub(crate) fn expire(
    deps: &DepsSql,
    others: &dyn OtherTables,
    conn: &mut dyn DbConn,
    wait: [Value; 4],
    now: i64,
) -> Result<usize, DbError> {
    let [pt, p, ct, c] = wait;
    let (Value::Text(child_table), Some(child)) = (&ct, c.as_i64()) else {
        return Ok(0);
    };
    let child_table = child_table.clone();
    conn.batch(&deps.begin_write)?;
    let done = (|| -> Result<usize, DbError> {
        conn.query(&deps.head_read, &[pt.clone(), p.clone()])?;
        let read = conn.query(
            &deps.signals.wait_read,
            &[pt.clone(), p.clone(), ct.clone(), c.clone()],
        )?;
        match read.first() {
            Some(r)
                if text(r.first()).is_none() && r.get(1).and_then(Value::as_i64) <= Some(now) => {}
            // Gone, signalled, or timed out meanwhile.
            _ => return Ok(0),
        }
        crate::runtime::pause_point("signal.expire", &child_table);
        let set = [Value::Text(TIMED_OUT.into()), pt, p, ct, c];
        conn.execute(&deps.wait_set, &set)?;
        let Found::Waiting(waiting) = others.lookup(conn, &child_table)? else {
            return Ok(1);
        };
        let now = Value::Time(floor(SystemTime::now()));
        let latest = Value::Time(waiting_due());
        count_down(deps, &waiting, conn, &child_table, child, &now, &latest)?;
        Ok(1)
    })()
    .and_then(|n| conn.batch("COMMIT").map(|()| n));
    if done.is_err() {
        conn.rollback_or_discard();
    }
    done
}

/// The signal job `id` of `spec`'s table waits for (or waited for, until it settles), if any.
pub(crate) fn signal_of(
    spec: &TableSpec,
    sql: &TableSql,
    conn: &mut dyn DbConn,
    id: i64,
) -> Result<Option<SignalWait>, DbError> {
    let Some((deps, _)) = statements(sql) else {
        return Ok(None);
    };
    let rows = conn.query(
        &deps.parents,
        &[Value::Text(spec.name.clone()), Value::Int(id)],
    )?;
    // `parent_table, parent, settled_only, outcome, output`; the deadline is the wait's `at`,
    // read apart (the listing of parents does not carry it).
    for r in rows {
        let Some(pt) = text(r.first()).filter(|t| is_signal(t)) else {
            continue;
        };
        let parent = r.get(1).and_then(Value::as_i64).unwrap_or(0);
        let outcome = text(r.get(3));
        let name = name_of(&pt).to_string();
        let at = conn
            .query(
                &deps.signals.wait_deadline,
                &[
                    Value::Text(pt.clone()),
                    Value::Int(parent),
                    Value::Text(spec.name.clone()),
                    Value::Int(id),
                ],
            )?
            .first()
            .and_then(|r| r.first().and_then(Value::as_i64))
            .unwrap_or(NO_DEADLINE);
        let deadline = (at != NO_DEADLINE).then(|| {
            SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(at).unwrap_or(0))
        });
        let signal = match outcome.as_deref() {
            Some(ACKED) => {
                let payload = match r.get(4) {
                    Some(Value::Null) | None => Vec::new(),
                    Some(v) => v.clone().into_payload(),
                };
                Some(Signal::new(name.clone(), payload))
            }
            _ => None,
        };
        let timed_out = outcome.as_deref() == Some(TIMED_OUT);
        return Ok(Some(SignalWait::new(name, deadline, signal, timed_out)));
    }
    Ok(None)
}

/// The signals jobs of `spec`'s table wait for, by name, each with how many jobs wait.
pub(crate) fn waited(
    spec: &TableSpec,
    sql: &TableSql,
    conn: &mut dyn DbConn,
) -> Result<Vec<WaitingSignal>, DbError> {
    let Some((deps, _)) = statements(sql) else {
        return Ok(Vec::new());
    };
    let rows = conn.query(
        &deps.signals.waited,
        &[
            Value::Text(spec.name.clone()),
            Value::Int(scope(&spec.name)),
        ],
    )?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            let name = text(r.first())?;
            let jobs = r.get(1).and_then(Value::as_i64).unwrap_or(0);
            Some(WaitingSignal::new(
                name_of(&name).to_string(),
                u64::try_from(jobs).unwrap_or(0),
            ))
        })
        .collect())
}
