//! The PostgreSQL lease renewal and grouped lease ack: one statement each over a variable
//! number of leases, padded to a size class. The claims need no protocol of their own: each is one statement, run by the
//! [`Dialect`](crate::dialect::Dialect) defaults.

use std::time::SystemTime;

use super::sql::{ack_many_sql, renew_sql};
use crate::dialect::DbConn;
use crate::dialect::{size_class, BySize};
use crate::error::DbError;
use crate::model::table::TableSpec;
use crate::model::value::Value;

/// One statement: lock the rows still holding their tokens, skipping rows another
/// transaction has locked (they are tried again next round, not waited for), write the new
/// token, return the ids renewed. Each `(id, token)` pair is compared by `id = $n AND
/// locked_until = $m`, so the server types every parameter from the column itself: a
/// `timestamp` column is compared as `timestamp`, whatever the session's `TimeZone`.
pub(super) fn lease_renew(
    conn: &mut dyn DbConn,
    spec: &TableSpec,
    token: SystemTime,
    held: &[(i64, SystemTime)],
) -> Result<Vec<i64>, DbError> {
    let Some(last) = held.last() else {
        return Ok(Vec::new());
    };
    let slots = size_class(held.len());
    let mut params = Vec::with_capacity(1 + 2 * slots);
    params.push(Value::Time(token));
    for (id, tok) in held.iter().chain(std::iter::repeat(last)).take(slots) {
        params.push(Value::Int(*id));
        params.push(Value::Time(*tok));
    }
    let rows = conn.query(&renew_sql(spec, slots), &params)?;
    Ok(rows
        .iter()
        .filter_map(|r| r.first().and_then(Value::as_i64))
        .collect())
}

/// One `DELETE .. RETURNING` of the rows still holding their tokens: the grouped ack. The
/// pairs are grouped by token (the rows of one claim share one), padded to a size class of
/// groups with the last group (deleting a row twice changes nothing).
pub(super) fn lease_ack_many(
    conn: &mut dyn DbConn,
    spec: &TableSpec,
    texts: &BySize,
    held: &[(i64, SystemTime)],
) -> Result<Vec<i64>, DbError> {
    use std::fmt::Write;
    // Each token with its ids as an array literal, `{1,2,3}`.
    let mut groups: Vec<(SystemTime, String)> = Vec::new();
    for (id, tok) in held {
        match groups.iter_mut().find(|(t, _)| t == tok) {
            Some((_, ids)) => {
                let _ = write!(ids, ",{id}");
            }
            None => groups.push((*tok, format!("{{{id}"))),
        }
    }
    for (_, ids) in &mut groups {
        ids.push('}');
    }
    let Some(last) = groups.last().cloned() else {
        return Ok(Vec::new());
    };
    let slots = size_class(groups.len());
    let mut params = Vec::with_capacity(2 * slots);
    for (tok, ids) in groups
        .into_iter()
        .chain(std::iter::repeat(last))
        .take(slots)
    {
        params.push(Value::Time(tok));
        params.push(Value::Text(ids));
    }
    let sql = texts.get(slots, || ack_many_sql(spec, slots));
    let rows = conn.query(&sql, &params)?;
    Ok(rows
        .iter()
        .filter_map(|r| r.first().and_then(Value::as_i64))
        .collect())
}
