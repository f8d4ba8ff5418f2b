//! The MySQL protocols that take more than one statement, each in one transaction: the lease
//! claim (a locking select, then one update of the ids found), the lease renewal (a locking
//! select of the held ids, then one update of those still holding their token) and the
//! advisory take (an update, then a fetch: no `RETURNING`).

use std::time::SystemTime;

use super::sql::{ack_lock_sql, ack_many_sql, renew_lock_sql, renew_set_sql, RENEW_BEGIN};
use crate::dialect::{
    for_ids, id_params, in_transaction, size_class, BySize, DbConn, FifoSql, TableSql,
};
use crate::error::{DbError, DbErrorKind};
use crate::model::schedule::epoch_secs;
use crate::model::table::TableSpec;
use crate::model::value::Value;

/// One transaction at the claim isolation: the locking select takes up to `limit` ready rows
/// (`now, now, limit`), one `UPDATE .. WHERE id IN (..)` leases them all, commit. The found
/// rows are locked until the commit, so the update changes exactly them; the rows are
/// returned with their attempts counted.
///
/// One update of all found ids, not one per row: on MariaDB 10.11 here (claims alternating
/// between the two, the update step alone) one update per row cost 2.3-2.8 ms for 10 rows
/// and 7.7-9.2 ms for 50, the single update 1.0-1.4 ms and 1.5-1.6 ms; equal for one row.
pub(super) fn lease_claim(
    conn: &mut dyn DbConn,
    sql: &TableSql,
    now: SystemTime,
    limit: usize,
    token: SystemTime,
    after: Option<(SystemTime, i64)>,
) -> Result<Vec<Vec<Value>>, DbError> {
    in_transaction(conn, &sql.begin, |conn| {
        let mut rows = match (&sql.claim_from, after) {
            (Some(from), Some((run_at, id))) => conn.query(
                from,
                &[
                    Value::Time(now),
                    Value::Time(now),
                    Value::Time(run_at),
                    Value::Time(run_at),
                    Value::Int(id),
                    Value::Int(limit as i64),
                ],
            )?,
            _ => conn.query(
                &sql.claim,
                &[Value::Time(now), Value::Time(now), Value::Int(limit as i64)],
            )?,
        };
        if rows.is_empty() {
            return Ok(rows);
        }
        mark(conn, sql, &mut rows, token)?;
        Ok(rows)
    })
}

/// Locks the held rows by id, keeps those still holding the token this process holds
/// (compared here, so an unchanged value or another claim's equal token cannot fool a row
/// count), writes `token` into them and commits. Returns exactly the ids renewed.
pub(super) fn lease_renew(
    conn: &mut dyn DbConn,
    spec: &TableSpec,
    token: SystemTime,
    held: &[(i64, SystemTime)],
) -> Result<Vec<i64>, DbError> {
    fenced_many(conn, spec, held, renew_lock_sql, |conn, kept| {
        let slots = size_class(kept.len());
        let mut params = Vec::with_capacity(slots + 1);
        params.push(Value::Time(token));
        id_params(kept, slots, &mut params);
        conn.execute(&renew_set_sql(spec, slots), &params)
    })
}

/// The grouped lease ack: no `DELETE .. RETURNING` on MySQL, so one transaction locks the
/// rows, keeps those still holding their tokens, and deletes them; returns the ids deleted.
/// Unlike the renewal it waits for a row another transaction has locked (as a single ack
/// does), bounded by `innodb_lock_wait_timeout`.
pub(super) fn lease_ack_many(
    conn: &mut dyn DbConn,
    spec: &TableSpec,
    texts: &BySize,
    held: &[(i64, SystemTime)],
) -> Result<Vec<i64>, DbError> {
    fenced_many(conn, spec, held, ack_lock_sql, |conn, kept| {
        let slots = size_class(kept.len());
        let mut params = Vec::with_capacity(slots);
        id_params(kept, slots, &mut params);
        conn.execute(&texts.get(slots, || ack_many_sql(spec, slots)), &params)
    })
}

/// In one READ COMMITTED transaction: locks the rows of `held` with `lock_sql(spec, slots)`
/// (`id, locked_until` per row), keeps the ids whose row still holds one of its tokens, runs
/// `write` on them, commits; returns the ids kept.
fn fenced_many(
    conn: &mut dyn DbConn,
    spec: &TableSpec,
    held: &[(i64, SystemTime)],
    lock_sql: fn(&TableSpec, usize) -> String,
    write: impl Fn(&mut dyn DbConn, &[i64]) -> Result<u64, DbError>,
) -> Result<Vec<i64>, DbError> {
    let mut ids: Vec<i64> = held.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(ids);
    }
    in_transaction(conn, &RENEW_BEGIN, |conn| {
        let slots = size_class(ids.len());
        let mut params = Vec::with_capacity(slots);
        id_params(&ids, slots, &mut params);
        let rows = conn.query(&lock_sql(spec, slots), &params)?;
        let mut kept = Vec::with_capacity(rows.len());
        for row in rows {
            let (Some(id), Some(current)) = (
                row.first().and_then(Value::as_i64),
                row.get(1).and_then(Value::as_time),
            ) else {
                continue;
            };
            if held
                .iter()
                .any(|(h, tok)| *h == id && epoch_secs(*tok) == epoch_secs(current))
            {
                kept.push(id);
            }
        }
        if !kept.is_empty() {
            write(conn, &kept)?;
        }
        Ok(kept)
    })
}

/// `take` has no `RETURNING` here: run it `(now, id)` (FIFO: `(now, id, group, group)`), and if
/// it matched the row (it always changes it, counting the attempt), fetch the row as it now is.
pub(super) fn advisory_take(
    conn: &mut dyn DbConn,
    sql: &TableSql,
    now: SystemTime,
    id: i64,
    group: Option<&Value>,
) -> Result<Option<Vec<Value>>, DbError> {
    let mut params = vec![Value::Time(now), Value::Int(id)];
    if let Some(g) = group {
        params.extend([g.clone(), g.clone()]);
    }
    if conn.execute(&sql.take, &params)? == 0 {
        return Ok(None);
    }
    Ok(conn
        .query(&sql.fetch, &[Value::Int(id)])?
        .into_iter()
        .next())
}

/// How many heads a FIFO claim reads at once: enough to pass over groups whose guard fails.
const FIFO_SCAN: i64 = 32;
/// Groups a row lock FIFO claim may find busy (its guard failing) before it gives up the round.
const FIFO_TRIES: usize = 3;

/// The group guard of a locked head: `true` if every unfinished row of its group could be
/// locked at once, the head is the oldest, and (lease) no other row of the group is leased.
/// A `NOWAIT` failure rolls back only the guard's statement: the transaction goes on.
fn guarded(
    conn: &mut dyn DbConn,
    fifo: &FifoSql,
    row: &[Value],
    now: SystemTime,
) -> Result<bool, DbError> {
    let (Some(id), Some(group)) = (row.first().and_then(Value::as_i64), row.get(fifo.group_at))
    else {
        return Ok(false);
    };
    if *group == Value::Null {
        return Ok(true); // a group of its own
    }
    let rows = match conn.query(&fifo.guard, std::slice::from_ref(group)) {
        Ok(rows) => rows,
        Err(e) if e.kind == DbErrorKind::Transient => return Ok(false),
        Err(e) => return Err(e),
    };
    let oldest = rows.first().and_then(|r| r.first()).and_then(Value::as_i64);
    let leased = rows.iter().skip(1).any(|r| {
        r.get(1)
            .and_then(Value::as_time)
            .is_some_and(|until| epoch_secs(until) > epoch_secs(now))
    });
    Ok(oldest == Some(id) && !leased)
}

/// The ids `heads` found: `(now, [now,] k)`.
fn heads(conn: &mut dyn DbConn, fifo: &FifoSql, first: &[Value]) -> Result<Vec<i64>, DbError> {
    let mut params = first.to_vec();
    params.push(Value::Int(FIFO_SCAN));
    let rows = conn.query(&fifo.heads, &params)?;
    Ok(rows.iter().filter_map(|r| r.first()?.as_i64()).collect())
}

/// Row lock FIFO claim, inside the claim's transaction: heads read without locks; each in
/// turn locked by primary key (if still claimable) and its group guarded; a head whose guard
/// fails is let go with the transaction (a rollback, then a new one) and the next tried.
pub(super) fn fifo_row_lock_claim(
    conn: &mut dyn DbConn,
    sql: &TableSql,
    fifo: &FifoSql,
    now: SystemTime,
) -> Result<Option<Vec<Value>>, DbError> {
    let mut busy = 0;
    for id in heads(conn, fifo, &[Value::Time(now)])? {
        let Some(row) = conn
            .query(&fifo.lock_one, &[Value::Int(id), Value::Time(now)])?
            .into_iter()
            .next()
        else {
            continue;
        };
        if guarded(conn, fifo, &row, now)? {
            return Ok(Some(row));
        }
        busy += 1;
        // Let the head go: its lock ends with the transaction.
        conn.batch("ROLLBACK")?;
        if busy >= FIFO_TRIES {
            break;
        }
        for stmt in &sql.begin {
            conn.batch(stmt)?;
        }
    }
    if busy >= FIFO_TRIES {
        // The transaction was let go with the last busy head: open the one the form closes.
        for stmt in &sql.begin {
            conn.batch(stmt)?;
        }
    }
    Ok(None)
}

/// Lease FIFO claim, one transaction: heads read without locks, up to `limit` of them locked
/// by primary key (those still claimable), each kept if its group's guard holds, the kept
/// ones leased. Heads whose guard failed stay locked until the commit, unchanged.
pub(super) fn fifo_lease_claim(
    conn: &mut dyn DbConn,
    sql: &TableSql,
    fifo: &FifoSql,
    now: SystemTime,
    limit: usize,
    token: SystemTime,
) -> Result<Vec<Vec<Value>>, DbError> {
    in_transaction(conn, &sql.begin, |conn| {
        let ids = heads(conn, fifo, &[Value::Time(now), Value::Time(now)])?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let (lock, mut params) = for_ids(&fifo.lock_many, Vec::new(), &ids)?;
        params.extend([Value::Time(now), Value::Time(now), Value::Int(limit as i64)]);
        let mut kept = Vec::new();
        for row in conn.query(lock, &params)? {
            if guarded(conn, fifo, &row, now)? {
                kept.push(row);
            }
        }
        mark(conn, sql, &mut kept, token)?;
        Ok(kept)
    })
}

/// Leases the locked `rows` (one update of their ids, `token` into `locked_until`) and counts
/// their attempts, in the rows too.
fn mark(
    conn: &mut dyn DbConn,
    sql: &TableSql,
    rows: &mut [Vec<Value>],
    token: SystemTime,
) -> Result<(), DbError> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut ids = Vec::with_capacity(rows.len());
    for row in rows.iter_mut() {
        ids.push(
            row.first()
                .and_then(Value::as_i64)
                .ok_or_else(|| DbError::other("the id is not an integer"))?,
        );
        if let Some(Value::Int(a)) = row.get_mut(1) {
            *a += 1;
        }
    }
    let slots = size_class(ids.len());
    let mut params = Vec::with_capacity(slots + 1);
    params.push(Value::Time(token));
    id_params(&ids, slots, &mut params);
    let mark = sql
        .lease_marks
        .get(slots.trailing_zeros() as usize)
        .ok_or_else(|| DbError::other(format!("a lease claim of {slots} rows")))?;
    let marked = conn.execute(mark, &params)?;
    if marked != ids.len() as u64 {
        return Err(DbError::other(format!(
            "the lease claim locked {} rows but marked {marked}",
            ids.len()
        )));
    }
    Ok(())
}
