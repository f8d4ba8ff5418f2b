//! Retention: deleting what a table keeps once it is old enough, in bounded batches. The
//! operator's calls (`Broker::prune_completed`, `purge_all_dead`, `requeue_all_dead`) and the
//! elected maintainer ([`crate::runtime::maintainer`]) share these, so a prune by hand and a
//! prune by the maintainer are the same statements.
//!
//! Every batch is one short statement (or, on a table with dependencies, one short
//! transaction) over a primary-key range of at most [`BATCH`] rows: no statement holds a
//! lock a claim waits for longer than that range takes, and claims pass the rows in it by
//! (they are finished: no claim reads them but to skip them).

use std::time::{Duration, SystemTime};

use crate::dialect::DbConn;
use crate::error::{DbError, Result};
use crate::model::schedule;
use crate::model::value::Value;
use crate::runtime::Queue;

/// How many rows one statement of a prune, a purge or a requeue of every dead letter changes
/// at most.
pub(crate) const BATCH: usize = 1_000;

/// Runs `batch(conn, after, upto)` over consecutive id ranges `(after, upto]` holding at most
/// [`BATCH`] rows each, as `bound` `(lead.., after, offset)` finds them, until the last range
/// (open above); returns the rows changed. Each batch is one statement on its own (MySQL
/// sessions run at `READ COMMITTED`, so its range scan reads past rows that row lock
/// deliveries hold instead of waiting for them) and safe to run twice, so a lost connection
/// retries it.
pub(crate) fn in_batches(
    q: &Queue,
    op: &'static str,
    bound: &str,
    lead: &[Value],
    batch: impl Fn(&mut dyn DbConn, i64, i64) -> Result<u64, DbError>,
) -> Result<u64> {
    in_batches_fenced(q, op, bound, lead, &mut || true, batch)
}

/// [`in_batches`], asking `fence` before each batch whether to go on (the maintainer: its
/// term still held); stops, with what was done, when it says no.
pub(crate) fn in_batches_fenced(
    q: &Queue,
    op: &'static str,
    bound: &str,
    lead: &[Value],
    fence: &mut dyn FnMut() -> bool,
    batch: impl Fn(&mut dyn DbConn, i64, i64) -> Result<u64, DbError>,
) -> Result<u64> {
    let mut after = i64::MIN;
    let mut total = 0;
    loop {
        if !fence() {
            return Ok(total);
        }
        let mut params = lead.to_vec();
        params.extend([Value::Int(after), Value::Int(BATCH as i64 - 1)]);
        let bound = q
            .retrying(op, |conn| conn.query(bound, &params))?
            .first()
            .and_then(|r| r.first()?.as_i64());
        let upto = bound.unwrap_or(i64::MAX);
        total += q.retrying(op, |conn| batch(conn, after, upto))?;
        match bound {
            Some(b) => after = b,
            None => return Ok(total),
        }
    }
}

/// Runs `f` on `conn` in a write transaction of `q`'s table: committed if it returns `Ok`,
/// rolled back (or the connection discarded) otherwise.
pub(crate) fn in_transaction<T>(
    q: &Queue,
    conn: &mut dyn DbConn,
    f: impl FnOnce(&mut dyn DbConn) -> Result<T, DbError>,
) -> Result<T, DbError> {
    conn.batch(&q.sql.begin_write)?;
    match f(conn).and_then(|v| conn.batch("COMMIT").map(|()| v)) {
        Ok(v) => Ok(v),
        Err(e) => {
            conn.rollback_or_discard();
            Err(e)
        }
    }
}

/// Deletes the completed rows of `q` (a table that keeps them) completed more than its
/// retention before `now` (whole seconds); how many. On a table with dependencies each batch
/// first records, in their heads (kept a day), that the cancelled rows it prunes were
/// cancelled: a job published after one within that day is dead-lettered as before.
pub(crate) fn prune_completed(
    q: &Queue,
    now: SystemTime,
    fence: &mut dyn FnMut() -> bool,
) -> Result<u64> {
    let now = schedule::claim_now(now);
    let cutoff = now
        .checked_sub(Duration::from_secs(q.spec.retention_secs))
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let lead = [Value::Time(cutoff)];
    let heads = crate::runtime::deps::statements(&q.sql)
        .and_then(|(_, waiting)| waiting.heads_cancelled.as_deref());
    in_batches_fenced(
        q,
        "prune completed",
        &q.sql.completed_bound,
        &lead,
        fence,
        |conn, after, upto| {
            let params = [Value::Time(cutoff), Value::Int(after), Value::Int(upto)];
            let Some(heads) = heads else {
                return conn.execute(&q.sql.completed_prune_range, &params);
            };
            // With dependencies, the cancels it prunes keep their answer in their heads (a
            // day), as a purge's dead letters do: their rows told it until now.
            in_transaction(q, conn, |conn| {
                let at = schedule::millis(SystemTime::now());
                let cancelled = [
                    Value::Int(at),
                    Value::Time(cutoff),
                    Value::Int(after),
                    Value::Int(upto),
                ];
                conn.execute(heads, &cancelled)?;
                conn.execute(&q.sql.completed_prune_range, &params)
            })
        },
    )
}

/// Deletes the dead letters of `q` dead-lettered more than `keep` before `now` (whole
/// seconds); how many. On a table with dependencies each one is deleted in a transaction that
/// first records its outcome in its head (kept a day) and forgets its own waits, as a purge
/// does: the batch's range is the one row, since the head statement names a range of rows
/// and the dead letters younger than `keep` between two old ones are not to be touched.
pub(crate) fn prune_dead(
    q: &Queue,
    keep: Duration,
    now: SystemTime,
    fence: &mut dyn FnMut() -> bool,
) -> Result<u64> {
    let cutoff = schedule::claim_now(now)
        .checked_sub(keep)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let lead = [Value::Time(cutoff)];
    let waits = crate::runtime::deps::statements(&q.sql).map(|(_, w)| w);
    let Some(waiting) = waits else {
        return in_batches_fenced(
            q,
            "prune dead",
            &q.sql.dead_old_bound,
            &lead,
            fence,
            |conn, after, upto| {
                let params = [Value::Time(cutoff), Value::Int(after), Value::Int(upto)];
                conn.execute(&q.sql.dead_old_prune_range, &params)
            },
        );
    };
    let name = Value::Text(q.spec.name.clone());
    let mut total = 0;
    let mut after = i64::MIN;
    loop {
        if !fence() {
            return Ok(total);
        }
        // The next old dead letter, one at a time.
        let params = [Value::Time(cutoff), Value::Int(after), Value::Int(0)];
        let next = q
            .retrying("prune dead", |conn| {
                conn.query(&q.sql.dead_old_bound, &params)
            })?
            .first()
            .and_then(|r| r.first()?.as_i64());
        let Some(id) = next else { return Ok(total) };
        let range = [Value::Int(id - 1), Value::Int(id)];
        total += q.retrying("prune dead", |conn| {
            in_transaction(q, conn, |conn| {
                let at = schedule::millis(SystemTime::now());
                let dead = Value::Text(crate::dialect::deps::DEAD.into());
                let heads = [dead, Value::Int(at), range[0].clone(), range[1].clone()];
                conn.execute(&waiting.heads_dead, &heads)?;
                let old = [Value::Time(cutoff), range[0].clone(), range[1].clone()];
                let n = conn.execute(&q.sql.dead_old_prune_range, &old)?;
                let gone = [name.clone(), range[0].clone(), range[1].clone()];
                conn.execute(&waiting.forget_gone, &gone)?;
                Ok(n)
            })
        })?;
        after = id;
    }
}
