//! Lease form.
//!
//! Protocol:
//! 1. Claim: write a deadline `ceil(now) + lease` into `locked_until` of up to `batch` ready
//!    rows whose lease is empty or expired, count their attempts, commit at once (one statement
//!    where the database allows; MySQL: a locking select and one update of the found rows in
//!    one READ COMMITTED transaction). No transaction stays open and no connection is held.
//! 2. The deadline is the delivery token. The renewer thread rewrites it every half lease
//!    (`UPDATE .. WHERE id = ? AND locked_until = <token held>`), one statement per table per
//!    round where the database allows.
//! 3. Settlement names the token it holds: `.. WHERE id = ? AND locked_until = <token>`. Zero
//!    rows changed is [`LeaseLost`](crate::BrokerError::LeaseLost), never a silent success.
//! 4. Drop without settlement clears the lease (fenced the same way), so the row is back at once.
//!
//! Why this is safe: a row is claimable only once its deadline has passed, and a later claim
//! writes a strictly larger deadline (schedule.rs), so a stale holder's token never matches
//! again. Renewal and settlement of one delivery are serialised by its cell's lock, so a
//! settlement always names the token the row holds. Times come from the host's clock, so hosts
//! sharing a table must keep their clocks in step (NTP) to well within a lease.
//!
//! A crash leaves the rows leased until their deadlines pass; the attempt counted at claim stays
//! spent.

use std::sync::Arc;
use std::time::SystemTime;

use super::{split_row, Claimed, Hold, Outcome};
use crate::error::{BrokerError, Result};
use crate::runtime::renewer::LeaseCell;
use crate::runtime::Ctx;
use crate::schedule::{claim_now, lease_token};
use crate::Value;

pub(crate) fn claim(ctx: &Ctx, limit: usize) -> Result<Vec<Claimed>> {
    let q = &ctx.queue;
    let Some(mut conn) = ctx.claim_conn()? else {
        return Ok(Vec::new());
    };
    let now = SystemTime::now();
    let token = lease_token(now, q.spec.lease_secs);
    let rows = q
        .dialect
        .lease_claim(&mut **conn, &q.sql, claim_now(now), limit, token)
        .map_err(q.err("claim"))?;
    // Every row is read before any is booked for renewal, so a row that fails to read leaves
    // no lease renewed for ever behind it (the claimed rows return when their leases expire).
    let rows: Vec<_> = rows
        .into_iter()
        .map(split_row)
        .collect::<Result<_, _>>()
        .map_err(q.err("claim"))?;
    let mut out = Vec::with_capacity(rows.len());
    for (id, attempts, payload, values) in rows {
        let cell = ctx.leases.insert(id, token);
        // The claim counted this attempt.
        out.push(Claimed {
            id,
            attempt: attempts,
            payload,
            values,
            hold: Hold::Lease(cell),
        });
    }
    Ok(out)
}

/// Runs `sql` with `leading` parameters, the id and the token; `Ok(false)` if the token is gone.
fn fenced(
    ctx: &Ctx,
    id: i64,
    cell: &Arc<LeaseCell>,
    op: &'static str,
    sql: &str,
    leading: Vec<Value>,
) -> Result<bool> {
    let q = &ctx.queue;
    // Waits for a renewal of this delivery in progress, then keeps the renewer away.
    let mut state = cell.lock();
    state.done = true;
    let mut params = leading;
    params.push(Value::Int(id));
    params.push(Value::Time(state.token));
    let changed = q
        .conn(op)
        .and_then(|mut conn| conn.execute(sql, &params).map_err(q.err(op)));
    drop(state);
    ctx.leases.remove(cell);
    Ok(changed? > 0)
}

pub(crate) fn settle(ctx: &Ctx, id: i64, cell: &Arc<LeaseCell>, outcome: Outcome) -> Result<()> {
    let sql = outcome.sql(&ctx.queue.sql);
    let leading = outcome.leading_params(SystemTime::now());
    if fenced(ctx, id, cell, outcome.op(), sql, leading)? {
        Ok(())
    } else {
        Err(BrokerError::LeaseLost {
            table: ctx.spec().name.clone(),
            id,
        })
    }
}

/// Clears the lease of an abandoned delivery so the row is claimable at once.
pub(crate) fn release(ctx: &Ctx, id: i64, cell: &Arc<LeaseCell>) {
    match fenced(ctx, id, cell, "release", &ctx.queue.sql.release, Vec::new()) {
        Ok(true) => {}
        Ok(false) => log::debug!(
            "table {}: row {id} was dropped after its lease was lost",
            ctx.spec().name
        ),
        Err(e) => log::warn!(
            "table {}: row {id} returns when its lease expires: {e}",
            ctx.spec().name
        ),
    }
}
