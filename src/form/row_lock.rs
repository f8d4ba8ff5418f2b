//! Row lock form.
//!
//! Protocol:
//! 1. On a pooled connection: open a transaction at the table's isolation level (READ COMMITTED
//!    by default) and select one ready row `FOR UPDATE SKIP LOCKED`.
//! 2. The delivery takes the connection with the transaction still open; the row stays locked
//!    while the handler runs.
//! 3. Settlement runs its statement and `COMMIT` on that same connection: the row and its
//!    outcome change in one commit. Retry and dead letter count the attempt in that statement.
//! 4. Drop without settlement: `ROLLBACK`.
//!
//! Why this is safe: the lock is the claim. `SKIP LOCKED` makes a concurrent claim pass over
//! locked rows instead of waiting, and the lock ends only with the transaction, which ends only
//! with the settlement, a rollback, or the session (a crash: the database rolls back, and the
//! row is claimable at once with no attempt spent). A connection whose rollback fails is
//! discarded, never returned to the pool mid-transaction.
//!
//! Cost: one connection per in-flight delivery for the whole handler, and a long transaction
//! holds back PostgreSQL's vacuum horizon while it runs.

use std::time::SystemTime;

use super::{rollback_or_discard, split_row, Claimed, Hold, Outcome};
use crate::error::Result;
use crate::runtime::{Ctx, PooledConn};
use crate::schedule::claim_now;
use crate::Value;

pub(crate) fn claim(ctx: &Ctx) -> Result<Vec<Claimed>> {
    let q = &ctx.queue;
    let Some(mut conn) = ctx.claim_conn()? else {
        return Ok(Vec::new());
    };
    let now = claim_now(SystemTime::now());
    for stmt in &q.sql.begin {
        if let Err(e) = conn.batch(stmt) {
            // A half-opened transaction (MySQL: `SET TRANSACTION` applies to the session's next
            // one) must not reach the next user of this connection.
            conn.mark_broken();
            return Err(q.err("claim")(e));
        }
    }
    let found = conn.query(&q.sql.claim, &[Value::Time(now), Value::Int(1)]);
    let row = match found {
        Ok(rows) => rows.into_iter().next(),
        Err(e) => {
            rollback_or_discard(&mut **conn);
            return Err(q.err("claim")(e));
        }
    };
    let Some(row) = row else {
        rollback_or_discard(&mut **conn);
        return Ok(Vec::new());
    };
    match split_row(row) {
        Ok((id, attempts, payload, values)) => Ok(vec![Claimed {
            id,
            // The count is taken at settlement, so the row holds the attempts before this one.
            attempt: attempts.saturating_add(1),
            payload,
            values,
            hold: Hold::RowLock(conn),
        }]),
        Err(e) => {
            rollback_or_discard(&mut **conn);
            Err(q.err("claim")(e))
        }
    }
}

pub(crate) fn settle(ctx: &Ctx, id: i64, mut conn: PooledConn, outcome: Outcome) -> Result<()> {
    let q = &ctx.queue;
    let mut params = outcome.leading_params(SystemTime::now());
    params.push(Value::Int(id));
    let done = conn
        .execute(outcome.sql(&q.sql), &params)
        .and_then(|_| conn.batch("COMMIT"));
    if let Err(e) = done {
        // The transaction is rolled back (or the connection discarded): the row is back, as it was.
        rollback_or_discard(&mut **conn);
        return Err(q.err(outcome.op())(e));
    }
    Ok(())
}

pub(crate) fn rollback(mut conn: PooledConn) {
    rollback_or_discard(&mut **conn);
}
