//! The MySQL protocols that take more than one statement, each in one transaction: the lease
//! claim (a locking select, then one update of the ids found), the lease renewal (a locking
//! select of the held ids, then one update of those still holding their token) and the
//! advisory take (an update, then a fetch: no `RETURNING`).

use std::time::SystemTime;

use super::sql::{id_params, id_slots, renew_lock_sql, renew_set_sql, RENEW_BEGIN};
use crate::dialect::{in_transaction, DbConn, TableSql};
use crate::error::DbError;
use crate::schedule::epoch_secs;
use crate::table::TableSpec;
use crate::Value;

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
) -> Result<Vec<Vec<Value>>, DbError> {
    in_transaction(conn, &sql.begin, |conn| {
        let mut rows = conn.query(
            &sql.claim,
            &[Value::Time(now), Value::Time(now), Value::Int(limit as i64)],
        )?;
        if rows.is_empty() {
            return Ok(rows);
        }
        let mut ids = Vec::with_capacity(rows.len());
        for row in &mut rows {
            ids.push(
                row.first()
                    .and_then(Value::as_i64)
                    .ok_or_else(|| DbError::other("the id is not an integer"))?,
            );
            if let Some(Value::Int(a)) = row.get_mut(1) {
                *a += 1;
            }
        }
        let slots = id_slots(ids.len());
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
    let mut ids: Vec<i64> = held.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(ids);
    }
    in_transaction(conn, &RENEW_BEGIN, |conn| {
        let slots = id_slots(ids.len());
        let mut params = Vec::with_capacity(slots);
        id_params(&ids, slots, &mut params);
        let rows = conn.query(&renew_lock_sql(spec, slots), &params)?;
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
            let slots = id_slots(kept.len());
            let mut params = Vec::with_capacity(slots + 1);
            params.push(Value::Time(token));
            id_params(&kept, slots, &mut params);
            conn.execute(&renew_set_sql(spec, slots), &params)?;
        }
        Ok(kept)
    })
}

/// `take` has no `RETURNING` here: run it `(now, id)`, and if it matched the row (it always
/// changes it, counting the attempt), fetch the row as it now is.
pub(super) fn advisory_take(
    conn: &mut dyn DbConn,
    sql: &TableSql,
    now: SystemTime,
    id: i64,
) -> Result<Option<Vec<Value>>, DbError> {
    if conn.execute(&sql.take, &[Value::Time(now), Value::Int(id)])? == 0 {
        return Ok(None);
    }
    Ok(conn
        .query(&sql.fetch, &[Value::Int(id)])?
        .into_iter()
        .next())
}
