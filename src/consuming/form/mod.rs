//! The three ways to hold a claimed row, as strategies over the dialects. Each module's docs give
//! its protocol and the invariant it relies on.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::dialect::{DbConn, ROW_USER_COLUMNS};
use crate::error::{DbError, DbErrorKind, Result};
use crate::model::table::Form;
use crate::model::value::Value;
use crate::runtime::renewer::LeaseCell;
use crate::runtime::Ctx;

pub(crate) mod advisory;
mod except;
mod fair;
pub(crate) mod lease;
mod limit_keys;
mod rates;
pub(crate) mod row_lock;

/// The most candidate rows one claim reads where rows it may not take stay ready: rows of keys
/// in work (advisory lock form, its page doubling from `advisory_scan`) or of keys at a
/// concurrency limit (lease and row lock forms, the page growing fourfold from the batch). A
/// claim reads past them to reach keys with room; past this many it gives up until the next
/// round, bounding a claim's cost when every key is busy.
const SCAN_MAX: usize = 10_000;

/// A row a claim took, before it becomes a [`Delivery`](crate::Delivery).
pub(crate) struct Claimed {
    pub id: i64,
    pub attempt: u32,
    pub payload: Vec<u8>,
    pub values: Vec<Value>,
    /// When the row was due (`run_at`): the queue wait it measures.
    pub due: Option<SystemTime>,
    pub hold: Hold,
    /// Why a value of the row could not be read: the row is dead-lettered with this reason
    /// instead of delivered (its attempt is counted; it would fail every claim again).
    pub unreadable: Option<String>,
    /// Lease and advisory forms: [`Broker::cancel`](crate::Broker::cancel) marked the row
    /// while an earlier claim held it (a process that died with it, or a delivery handed
    /// back). The claim ends it as cancelled instead of delivering it: a cancel that said the
    /// job will not run again holds whatever became of the claim it marked.
    pub cancel_requested: bool,
    /// Its last checkpoint ([`Table::checkpoints`](crate::Table::checkpoints)).
    pub checkpoint: Option<Vec<u8>>,
    /// The trace context of its publish ([`Table::traceparent`](crate::Table::traceparent)).
    pub traceparent: Option<String>,
}

impl Claimed {
    /// A claimed row of `ctx`'s table from its columns; `unreadable` is what the connection
    /// reported for it.
    pub fn new(
        ctx: &Ctx,
        row: Vec<Value>,
        hold: Hold,
        unreadable: Option<String>,
    ) -> Result<Self, DbError> {
        // The lease and advisory forms' rows carry the cancel request before the due time.
        let flagged = !matches!(hold, Hold::RowLock(_));
        let checkpointed = ctx.spec().checkpoint.is_some();
        let (id, attempt, payload, mut values, cancel_requested, due) = split_row(row, flagged)?;
        // After the user columns: the checkpoint, then the trace context (`row_columns`).
        let traceparent = match ctx.spec().traceparent.is_some() {
            true => match values.pop() {
                Some(Value::Text(s)) => Some(s),
                _ => None,
            },
            false => None,
        };
        let checkpoint = match checkpointed {
            true => match values.pop() {
                Some(Value::Null) | None => None,
                Some(v) => Some(v.into_payload()),
            },
            false => None,
        };
        Ok(Claimed {
            id,
            attempt,
            payload,
            values,
            due,
            hold,
            unreadable,
            cancel_requested,
            checkpoint,
            traceparent,
        })
    }
}

/// The reason the connection gave for each row of its last query it could not read fully.
pub(crate) fn unreadable_rows(conn: &mut dyn DbConn, rows: usize) -> Vec<Option<String>> {
    let mut out = vec![None; rows];
    for (row, why) in conn.take_unreadable() {
        if let Some(slot) = out.get_mut(row) {
            slot.get_or_insert(why);
        }
    }
    out
}

/// What holds a claimed row for its delivery.
pub(crate) enum Hold {
    /// The open transaction's connection.
    RowLock(row_lock::RowHold),
    /// The lease token, shared with the renewer.
    Lease(Arc<LeaseCell>),
    /// The key, and the connection whose session holds it (none for in-process keys).
    Advisory(advisory::KeyHold),
}

/// How a delivery is settled.
pub(crate) enum Outcome {
    Ack,
    /// Back in the queue at the time given, no failure recorded.
    Retry(SystemTime),
    /// Dead-lettered with the reason given, no failure recorded.
    Dead(String),
    /// A failure: back in the queue at the time given, its error text kept on the row
    /// (`last_error`, bounded to [`LAST_ERROR_MAX`](crate::LAST_ERROR_MAX)) and counted.
    Failed(SystemTime, String),
    /// A failure of the last attempt: dead-lettered with the reason (first) and the error
    /// kept and counted as [`Outcome::Failed`] does.
    DeadFailed(String, String),
    /// No further attempts: the row ends as an ack ends it, marked cancelled where completed
    /// rows are kept.
    Cancel,
}

impl Outcome {
    pub fn op(&self) -> &'static str {
        match self {
            Outcome::Ack => "ack",
            Outcome::Retry(_) | Outcome::Failed(..) => "retry",
            Outcome::Dead(_) | Outcome::DeadFailed(..) => "dead letter",
            Outcome::Cancel => "cancel",
        }
    }

    /// How the `metrics` feature counts it.
    pub fn meter(&self) -> crate::runtime::meters::Settle {
        use crate::runtime::meters::Settle;
        match self {
            Outcome::Ack => Settle::Ack,
            Outcome::Retry(_) => Settle::Retry { failed: false },
            Outcome::Failed(..) => Settle::Retry { failed: true },
            Outcome::Dead(_) => Settle::Dead { failed: false },
            Outcome::DeadFailed(..) => Settle::Dead { failed: true },
            Outcome::Cancel => Settle::Cancel,
        }
    }

    /// True if the row goes back into the queue.
    pub fn returns(&self) -> bool {
        matches!(self, Outcome::Retry(_) | Outcome::Failed(..))
    }

    /// The dead letter's reason.
    pub fn dead_reason(&self) -> Option<&str> {
        match self {
            Outcome::Dead(reason) | Outcome::DeadFailed(reason, _) => Some(reason),
            _ => None,
        }
    }

    /// The parameters of the form's statement before the id (and after it, the lease token):
    /// the time, the reason (dead letters), then the error text (`NULL`: none) and the
    /// failures it counts.
    pub fn leading_params(&self, now: SystemTime) -> Vec<Value> {
        let error = |e: Option<&String>| match e {
            Some(e) => [
                Value::Text(crate::error::bound_error(e).to_string()),
                Value::Int(1),
            ],
            None => [Value::Null, Value::Int(0)],
        };
        let dead = |reason: &String, e| {
            let mut v = vec![
                Value::Time(crate::model::schedule::floor(now)),
                Value::Text(reason.clone()),
            ];
            v.extend(error(e));
            v
        };
        match self {
            Outcome::Ack | Outcome::Cancel => vec![],
            Outcome::Retry(at) => [vec![Value::Time(*at)], error(None).to_vec()].concat(),
            Outcome::Failed(at, e) => [vec![Value::Time(*at)], error(Some(e)).to_vec()].concat(),
            Outcome::Dead(reason) => dead(reason, None),
            Outcome::DeadFailed(reason, e) => dead(reason, Some(e)),
        }
    }

    /// True if it writes the output the handler set ([`Table::outputs`](crate::Table::outputs)):
    /// the handler's own end of the job (an ack, a dead letter, a cancel). A failure writes
    /// none, on the last attempt too, where it ends the job as a dead letter: the handler did
    /// not finish, as after a drop or a handler timeout, which write none either.
    pub fn writes_output(&self) -> bool {
        matches!(self, Outcome::Ack | Outcome::Dead(_) | Outcome::Cancel)
    }

    /// What it records for the jobs waiting on the row ([`crate::runtime::deps::settled`]):
    /// `None` for a row that goes back into the queue.
    pub fn settled_as(&self) -> Option<&'static str> {
        use crate::dialect::deps::{ACKED, CANCELLED, DEAD};
        match self {
            Outcome::Ack => Some(ACKED),
            Outcome::Dead(_) | Outcome::DeadFailed(..) => Some(DEAD),
            Outcome::Cancel => Some(CANCELLED),
            Outcome::Retry(_) | Outcome::Failed(..) => None,
        }
    }

    pub fn sql<'a>(&self, sql: &'a crate::dialect::TableSql) -> &'a str {
        match self {
            Outcome::Ack => &sql.ack,
            Outcome::Retry(_) | Outcome::Failed(..) => &sql.retry,
            Outcome::Dead(_) | Outcome::DeadFailed(..) => &sql.dead,
            Outcome::Cancel => &sql.cancel_held,
        }
    }
}

/// Claims up to `limit` rows in the table's form; a handler's thread passes its deadline `by`
/// ([`Ctx::claim_conn`]: no connection past it, and where the database allows it at no
/// cost, no lock wait past it either: the claim fails instead, having taken nothing).
pub(crate) fn claim(ctx: &Ctx, limit: usize, by: Option<Instant>) -> Result<Vec<Claimed>> {
    match ctx.spec().form {
        Form::RowLock => row_lock::claim(ctx, by),
        Form::Lease => lease::claim(ctx, limit, by),
        Form::AdvisoryLock => advisory::claim(ctx, limit, by),
    }
}

/// Settles a delivery, writing `output` ([`Table::outputs`](crate::Table::outputs)) if the
/// outcome ends the row. A form that needs a pooled connection for it waits at most `within`
/// for one.
pub(crate) fn settle(
    ctx: &Ctx,
    id: i64,
    hold: Hold,
    outcome: Outcome,
    output: Option<&[u8]>,
    within: Duration,
) -> Result<()> {
    let output = output.filter(|_| ctx.spec().output.is_some() && outcome.writes_output());
    match hold {
        Hold::RowLock(h) => row_lock::settle(ctx, id, h, outcome, output),
        Hold::Lease(cell) => lease::settle(ctx, id, &cell, outcome, output, within),
        Hold::Advisory(key) => advisory::settle(ctx, id, key, outcome, output, within),
    }
}

/// Runs a settlement's one statement, and again (at most twice more, 2 then 4 ms later) if
/// the database rolled it back as transient (chosen as a deadlock victim, or a lock wait that
/// timed out). Under the row's key, or fenced by its lease token, nobody else may take the
/// row, so running it again is safe; on MySQL/MariaDB a settlement deadlocked with another
/// session's claim now and then (their next-key locks), which failed the `ack` and ran the
/// job again. A table with dependencies tries up to six times (2 to 64 ms apart): its
/// settlements take turns on the counts of the jobs waiting on them, and on MariaDB one was
/// seen chosen as a deadlock victim three times running (12 handlers settling one callback's
/// jobs).
pub(crate) fn transient_retried<T>(
    most: u32,
    mut run: impl FnMut() -> Result<T, DbError>,
) -> Result<T, DbError> {
    let mut tries = 0u32;
    loop {
        match run() {
            Err(e) if e.kind == DbErrorKind::Transient && tries < most => {
                tries += 1;
                log::debug!("a settlement was rolled back ({e}); running it again");
                std::thread::sleep(Duration::from_millis(1 << tries));
            }
            done => return done,
        }
    }
}

/// How many times a settlement of `ctx`'s table runs again after a transient rollback
/// ([`transient_retried`]).
pub(crate) fn settle_retries(ctx: &Ctx) -> u32 {
    if ctx.spec().dependencies {
        6
    } else {
        2
    }
}

/// Hands back a row that never reached a handler (claimed ahead, then the subscription
/// closed): claimable again at once, its attempt not spent. Never panics; a connection in an
/// unknown state is discarded.
///
/// Modelled in model/advisory.pml (hand_back), model/lease.pml (hand_back), model/row_lock.pml
/// (hand_back).
pub(crate) fn hand_back(ctx: &Ctx, id: i64, hold: Hold, within: Duration) {
    match hold {
        Hold::RowLock(h) => row_lock::rollback(ctx, h),
        Hold::Lease(cell) => lease::hand_back(ctx, id, &cell, within),
        Hold::Advisory(key) => advisory::hand_back(ctx, id, key, within),
    }
    ctx.queue.wake.notify(1);
}

/// A claimed row's parts: id, attempts, payload, user columns, cancel request, due time.
type RowParts = (i64, u32, Vec<u8>, Vec<Value>, bool, Option<SystemTime>);

/// Splits a claimed row (`id, attempts, payload, user columns[, cancel_requested], run_at`;
/// `flagged`: with the cancel request).
fn split_row(mut row: Vec<Value>, flagged: bool) -> Result<RowParts, DbError> {
    if row.len() <= ROW_USER_COLUMNS + usize::from(flagged) {
        return Err(DbError::other(format!(
            "a claimed row has {} columns",
            row.len()
        )));
    }
    let due = row.pop().and_then(|v| v.as_time());
    let cancel_requested = flagged && row.pop().and_then(|v| v.as_i64()).is_some_and(|v| v != 0);
    let mut it = row.into_iter();
    let id = it
        .next()
        .and_then(|v| v.as_i64())
        .ok_or_else(|| DbError::other("the id is not an integer"))?;
    let attempts = it.next().and_then(|v| v.as_i64()).unwrap_or(0);
    let payload = it.next().map(Value::into_payload).unwrap_or_default();
    Ok((
        id,
        attempts.clamp(0, u32::MAX as i64) as u32,
        payload,
        it.collect(),
        cancel_requested,
        due,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A settlement rolled back as transient runs again, at most twice more; other errors are
    /// not retried.
    #[test]
    fn transient_settlements_run_again() {
        let failing = |kind: DbErrorKind, fails: u32| {
            let mut calls = 0u32;
            let done = transient_retried(2, || {
                calls += 1;
                if calls <= fails {
                    Err(DbError::new(kind, "deadlock"))
                } else {
                    Ok(calls)
                }
            });
            (done.is_ok(), calls)
        };
        assert_eq!(failing(DbErrorKind::Transient, 2), (true, 3));
        assert_eq!(failing(DbErrorKind::Transient, 3), (false, 3));
        assert_eq!(failing(DbErrorKind::Other, 1), (false, 1));
        assert_eq!(failing(DbErrorKind::ConnectionLost, 1), (false, 1));
    }
}
