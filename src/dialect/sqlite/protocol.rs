//! The SQLite lease renewal: one statement over the leases held. The claims need no protocol
//! of their own: each is one statement, run by the [`Dialect`](crate::dialect::Dialect)
//! defaults.

use std::time::SystemTime;

use super::sql::{ack_many_sql, renew_params, renew_sql};
use crate::dialect::{fenced_pairs, BySize, DbConn};
use crate::error::DbError;
use crate::model::table::TableSpec;
use crate::model::value::Value;

/// One `UPDATE .. RETURNING` of the rows still holding their tokens. SQLite has no row
/// locks to wait on, and types `VALUES` by the values themselves.
pub(super) fn lease_renew(
    conn: &mut dyn DbConn,
    spec: &TableSpec,
    token: SystemTime,
    held: &[(i64, SystemTime)],
) -> Result<Vec<i64>, DbError> {
    if held.is_empty() {
        return Ok(Vec::new());
    }
    let rows = conn.query(&renew_sql(spec, held.len()), &renew_params(token, held))?;
    Ok(rows
        .iter()
        .filter_map(|r| r.first().and_then(Value::as_i64))
        .collect())
}

/// One `DELETE .. RETURNING` of the rows still holding their tokens: the grouped ack. Padded
/// to a size class (repeating the last pair), so few distinct texts are prepared.
pub(super) fn lease_ack_many(
    conn: &mut dyn DbConn,
    spec: &TableSpec,
    texts: &BySize,
    held: &[(i64, SystemTime)],
) -> Result<Vec<i64>, DbError> {
    fenced_pairs(conn, held, |slots| {
        texts.get(slots, || ack_many_sql(spec, slots))
    })
}
