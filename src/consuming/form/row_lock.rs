//! Row lock form.
//!
//! Protocol:
//! 1. On a pooled connection: open a transaction at the table's isolation level (READ COMMITTED
//!    by default) and select one ready row `FOR UPDATE SKIP LOCKED`.
//! 2. The delivery takes the connection with the transaction still open; the row stays locked
//!    while the handler runs.
//! 3. Settlement runs its statement and `COMMIT` on that same connection: the row and its
//!    outcome change in one commit. Retry and dead letter count the attempt in that statement.
//! 4. A row handed back unhandled (the subscription closed with it queued): `ROLLBACK`, no
//!    attempt spent. A delivery dropped unsettled by its handler (a panic) counts as a failed
//!    attempt: its retry is committed with a short delay (the delivery's drop policy), so a
//!    poison row reaches `max_attempts` instead of looping.
//!
//! Why this is safe: the lock is the claim. `SKIP LOCKED` makes a concurrent claim pass over
//! locked rows instead of waiting, and the lock ends only with the transaction, which ends only
//! with the settlement, a rollback, or the session (a crash: the database rolls back, and the
//! row is claimable at once with no attempt spent). The connection is marked broken from
//! `BEGIN` until a commit or rollback succeeds, so it is never returned to the pool
//! mid-transaction, whatever unwinds.
//!
//! A crash of the whole process spends no attempt here: a payload that kills its process (a
//! segfault, an abort, an out-of-memory kill) is delivered again and again. Work that may do
//! that belongs in the lease form, where the claim counts the attempt.
//!
//! Cost: one connection per in-flight delivery for the whole handler, and a long transaction
//! holds back PostgreSQL's vacuum horizon while it runs.

use std::time::{Instant, SystemTime};

use super::{unreadable_rows, Claimed, Hold, Outcome};
use crate::dialect::{savepoint, DbConn};
use crate::error::{BrokerError, Result};
use crate::model::schedule::claim_now;
use crate::model::value::Value;
use crate::runtime::{Ctx, PooledConn};

pub(crate) fn claim(ctx: &Ctx, by: Option<Instant>) -> Result<Vec<Claimed>> {
    let q = &ctx.queue;
    let Some(mut conn) = ctx.claim_conn(by)? else {
        return Ok(Vec::new());
    };
    let now = claim_now(SystemTime::now());
    // Marked broken from `BEGIN` until the transaction ends (a commit or rollback clears it):
    // should anything between unwind or return early, the pool discards the session instead of
    // handing it out mid-transaction. (MySQL: `SET TRANSACTION` applies to the session's next
    // transaction, so a half-opened one must not reach the next user either.)
    conn.mark_broken();
    for stmt in &q.sql.begin {
        conn.batch(stmt).map_err(q.err("claim"))?;
    }
    let row = match q.dialect.row_lock_claim(&mut *conn, &q.sql, now) {
        Ok(row) => row,
        Err(e) => {
            conn.rollback_or_discard();
            return Err(q.err("claim")(e));
        }
    };
    let Some(mut row) = row else {
        conn.rollback_or_discard();
        return Ok(Vec::new());
    };
    let unreadable = unreadable_rows(&mut *conn, 1).pop().flatten();
    // The count is taken at settlement, so the row holds the attempts before this one.
    if let Some(Value::Int(a)) = row.get_mut(1) {
        *a = a.saturating_add(1);
    }
    // The connection goes with the delivery, still marked broken while its transaction is open.
    let conn = conn.into_inner();
    let hold = Hold::RowLock(RowHold { conn, work: false });
    let taken = Claimed::new(row, hold, unreadable);
    taken.map(|c| vec![c]).map_err(q.err("claim"))
}

/// A row lock delivery's transaction.
pub(crate) struct RowHold {
    pub conn: PooledConn,
    /// The handler ran SQL of its own in the transaction, after the savepoint `WORK`: every
    /// outcome but the ack rolls back to it first.
    work: bool,
}

/// Runs the outcome's statement and commits; on failure the transaction is rolled back (or the
/// connection discarded): the row is back as it was. Any outcome but the ack first undoes the
/// handler's own SQL, so a retry or dead letter never commits it.
pub(crate) fn settle(ctx: &Ctx, id: i64, hold: RowHold, outcome: Outcome) -> Result<()> {
    let q = &ctx.queue;
    let RowHold { mut conn, work } = hold;
    let mut params = outcome.leading_params(SystemTime::now());
    params.push(Value::Int(id));
    let undo = if work && !matches!(outcome, Outcome::Ack) {
        conn.batch(savepoint::UNDO_WORK)
    } else {
        Ok(())
    };
    let done = undo
        .and_then(|()| conn.execute(outcome.sql(&q.sql), &params))
        .and_then(|_| conn.batch("COMMIT"));
    match done {
        Ok(()) => {
            conn.set_broken(false);
            Ok(())
        }
        Err(e) => {
            conn.rollback_or_discard();
            Err(q.err(outcome.op())(e))
        }
    }
}

pub(crate) fn rollback(hold: RowHold) {
    let mut conn = hold.conn;
    conn.rollback_or_discard();
}

/// Runs `f` with the driver's client of the delivery's connection, inside its transaction,
/// under the savepoint `HANDLER` (after `WORK`, set once): `f`'s writes stay in the
/// transaction if it returns `Ok`, are rolled back at once if it returns `Err`. `C` is the
/// driver's client type; another driver's is `Unsupported`.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) fn in_transaction<C: 'static, T, E>(
    ctx: &Ctx,
    hold: &mut RowHold,
    f: impl FnOnce(&mut C) -> std::result::Result<T, E>,
) -> Result<std::result::Result<T, E>> {
    let q = &ctx.queue;
    let err = q.err("transactional completion");
    let unsupported = || BrokerError::Unsupported {
        database: q.dialect.database(),
        what: "transactional completion".into(),
        why: "this delivery's connection is of another database's driver",
    };
    if hold
        .conn
        .driver()
        .and_then(|d| d.downcast_mut::<C>())
        .is_none()
    {
        return Err(unsupported());
    }
    if !hold.work {
        hold.conn.batch(savepoint::WORK).map_err(&err)?;
        hold.work = true;
    }
    hold.conn.batch(savepoint::HANDLER).map_err(&err)?;
    let Some(client) = hold.conn.driver().and_then(|d| d.downcast_mut::<C>()) else {
        return Err(unsupported());
    };
    let out = f(client);
    let end = if out.is_ok() {
        savepoint::KEEP_HANDLER
    } else {
        savepoint::UNDO_HANDLER
    };
    hold.conn.batch(end).map_err(&err)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use crate::model::table::Form;
    use crate::runtime::testing::{ctx, options, Script};

    /// Defect 9: a claim that unwinds between `BEGIN` and handing its connection to the
    /// delivery must not pool the connection mid-transaction (before: it went back to the pool
    /// with the transaction open, and the next user ran inside it).
    #[test]
    fn a_claim_that_panics_mid_transaction_never_pools_its_connection() {
        let script = Arc::new(Script {
            panic_on_query: true,
            ..Script::default()
        });
        let ctx = ctx(&script, Form::RowLock, options(1));
        let unwound =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| super::claim(&ctx, None)));
        assert!(unwound.is_err());
        assert_eq!(script.connects.load(Ordering::SeqCst), 1);
        assert_eq!(script.log.lock().first().map(String::as_str), Some("BEGIN"));
        let _next = ctx.queue.conn("test").unwrap();
        assert_eq!(
            script.connects.load(Ordering::SeqCst),
            2,
            "the connection left mid-transaction was handed out again"
        );
    }
}
