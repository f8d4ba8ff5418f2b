//! Advisory lock form.
//!
//! Protocol:
//! 1. On a pooled connection, select ready rows with the columns their keys are rendered from,
//!    a page at a time in `(run_at, id)` order (pages doubling from `advisory_scan`, at most
//!    10,000 rows a claim, since rows in work stay ready and fill the first pages); lock nothing.
//! 2. For each distinct key, try its lock **without waiting** (PostgreSQL
//!    `pg_try_advisory_lock(hashtextextended(key, 0))`, MySQL `GET_LOCK(name, 0)`, SQLite the
//!    process's key registry); skip a key held elsewhere.
//! 3. With the key held, take the row while it is still claimable (ready and not dead), counting
//!    its attempt. If it is gone, unlock and go on.
//! 4. The delivery keeps the key, and with server-side locks the connection whose session holds
//!    it: one row per claim, since the connection goes with the delivery. Settlement runs on
//!    that connection, then unlocks. A row handed back unhandled (the subscription closed with
//!    it queued) gets its attempt back, then its key is unlocked; a delivery dropped unsettled
//!    by its handler is a failed attempt, retried after a short delay (the drop policy).
//!
//! Why this is safe: a row is only ever worked under its key, one key is held by one session at
//! a time, and the take re-checks the row under the key, so a row settled by the previous holder
//! is not taken again. Keys belong to the database, so two tables with equal keys wait for each
//! other. A crash ends the sessions and the database releases their keys: the rows are back at
//! once, their attempts spent. A session is marked broken while it holds any key or after any
//! lock or unlock of it went wrong ([`SessionKeys`]): the pool discards it (ending the session
//! releases its keys) rather than hand out a session that may hold a key. In-process keys are
//! held by a guard that gives them back when dropped, on every path.
//!
//! PostgreSQL advisory locks belong to the session: use a direct connection or a session-mode
//! pooler. SQLite keys live in the process: two processes on one file may deliver a row twice.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use super::{unreadable_rows, Claimed, Hold, Outcome};
use crate::dialect::DbConn;
use crate::error::{DbError, Result};
use crate::keys::{KeySql, ProcessKey, SessionKeys};
use crate::runtime::{Ctx, PooledConn};
use crate::schedule::claim_now;
use crate::Value;

/// A held key: its text, and what holds it.
pub(crate) struct KeyHold {
    pub key: String,
    holder: Holder,
}

// One per delivery, moved a handful of times: the size difference costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Holder {
    /// In the process's registry (SQLite); given back when dropped.
    Process(ProcessKey),
    /// By a server session: the connection goes with the delivery. `here` marks the key held
    /// by this broker (none if the previous holder's mark was still being cleared).
    Session {
        conn: PooledConn,
        keys: SessionKeys,
        name: String,
        here: Option<ProcessKey>,
    },
}

/// The most candidate rows one claim reads. Rows of keys in work stay ready, so a claim pages
/// past them (doubling the page from `advisory_scan`) to reach other keys; past this many it
/// gives up until the next round, bounding the cost of a claim when every key is busy.
const SCAN_LIMIT: usize = 10_000;

fn key_sql(ctx: &Ctx) -> Option<KeySql<'_>> {
    let sql = &ctx.queue.sql;
    Some(KeySql {
        lock: sql.key_lock.as_deref()?,
        unlock: sql.key_unlock.as_deref()?,
    })
}

pub(crate) fn claim(ctx: &Ctx, limit: usize) -> Result<Vec<Claimed>> {
    let q = &ctx.queue;
    let Some(template) = &q.spec.key else {
        return Ok(Vec::new());
    };
    let Some(mut conn) = ctx.claim_conn()? else {
        return Ok(Vec::new());
    };
    let now = claim_now(SystemTime::now());
    let mut tried = HashSet::new();
    let mut out = Vec::new();
    let mut page = ctx.opts.advisory_scan.min(SCAN_LIMIT);
    let mut scanned = 0;
    let mut after: Option<(Value, i64)> = None;
    // What this claim took stays taken whatever fails later: a failure after the first row ends
    // the claim with the rows it has (each already holds its key and its counted attempt).
    let partial = |out: Vec<Claimed>, e: DbError| {
        if out.is_empty() {
            return Err(q.err("claim")(e));
        }
        ctx.set_error(q.err("claim")(e));
        Ok(out)
    };
    loop {
        let rows = match &after {
            None => conn.query(&q.sql.claim, &[Value::Time(now), Value::Int(page as i64)]),
            Some((run_at, id)) => conn.query(
                &q.sql.claim_after,
                &[
                    Value::Time(now),
                    run_at.clone(),
                    Value::Int(*id),
                    Value::Int(page as i64),
                ],
            ),
        };
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => return partial(out, e),
        };
        let found = rows.len();
        for row in rows {
            if out.len() >= limit {
                return Ok(out);
            }
            let (Some(id), Some(run_at)) = (row.first().and_then(Value::as_i64), row.get(1)) else {
                continue;
            };
            after = Some((run_at.clone(), id));
            let key = template.render(&row[2..]);
            if !tried.insert(key.clone()) {
                continue;
            }
            match (&ctx.keys, key_sql(ctx)) {
                (Some(registry), _) => {
                    let Some(held) = registry.try_take(&key) else {
                        continue;
                    };
                    match take(ctx, &mut *conn, now, id) {
                        Ok(Some((row, unreadable))) => {
                            let hold = Hold::Advisory(KeyHold {
                                key,
                                holder: Holder::Process(held),
                            });
                            match Claimed::new(row, hold, unreadable) {
                                Ok(c) => out.push(c),
                                Err(e) => return partial(out, e),
                            }
                        }
                        // Settled meanwhile: the key goes back as `held` drops.
                        Ok(None) => {}
                        Err(e) => return partial(out, e),
                    }
                }
                (None, Some(sql)) => {
                    if q.held_here.is_held(&key) {
                        // One of this broker's deliveries has it: the server would refuse.
                        continue;
                    }
                    let name = q.dialect.key_name(&key);
                    let mut keys = SessionKeys::default();
                    match keys.lock(&mut *conn, &sql, &name) {
                        Ok(true) => {}
                        Ok(false) => continue,
                        // The session's keys are unknown: it is discarded, never pooled.
                        Err(e) => return Err(q.err("claim")(e)),
                    }
                    match take(ctx, &mut *conn, now, id) {
                        Ok(Some((row, unreadable))) => {
                            // The connection holds the key: it goes with the delivery.
                            let here = q.held_here.try_take(&key);
                            let holder = Holder::Session {
                                conn,
                                keys,
                                name,
                                here,
                            };
                            let hold = Hold::Advisory(KeyHold { key, holder });
                            return Claimed::new(row, hold, unreadable)
                                .map(|c| vec![c])
                                .map_err(q.err("claim"));
                        }
                        Ok(None) => {
                            if !keys.unlock(&mut *conn, &sql, &name) {
                                // The session may still hold the key: it stays marked broken
                                // and is discarded; this claim ends here.
                                log::warn!(
                                    "table {}: unlocking key {key:?} failed; discarding the session",
                                    q.spec.name
                                );
                                return Ok(Vec::new());
                            }
                        }
                        Err(e) => return Err(q.err("claim")(e)),
                    }
                }
                (None, None) => return Ok(Vec::new()),
            }
        }
        scanned += found;
        if out.len() >= limit || found < page || scanned >= SCAN_LIMIT {
            return Ok(out);
        }
        page = (page * 2).min(SCAN_LIMIT - scanned);
    }
}

/// A taken row, and why a value of it could not be read.
type Taken = (Vec<Value>, Option<String>);

/// Takes row `id` under its key if it is still claimable, counting its attempt.
fn take(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    now: SystemTime,
    id: i64,
) -> Result<Option<Taken>, DbError> {
    let q = &ctx.queue;
    let row = q.dialect.advisory_take(conn, &q.sql, now, id)?;
    Ok(row.map(|row| (row, unreadable_rows(conn, 1).pop().flatten())))
}

/// Runs `sql` (`leading` parameters, then the id) under the key, then unlocks it.
fn under_key(
    ctx: &Ctx,
    id: i64,
    hold: KeyHold,
    op: &'static str,
    sql: &str,
    leading: Vec<Value>,
    within: Duration,
) -> Result<()> {
    let q = &ctx.queue;
    let mut params = leading;
    params.push(Value::Int(id));
    match hold.holder {
        Holder::Process(held) => {
            let mut conn = q.conn_within(op, within)?;
            let done = super::transient_retried(|| conn.execute(sql, &params));
            drop(held);
            done.map(drop).map_err(q.err(op))
        }
        Holder::Session {
            mut conn,
            mut keys,
            name,
            here,
        } => {
            let done = super::transient_retried(|| conn.execute(sql, &params));
            if let Some(key_sql) = key_sql(ctx) {
                if !keys.unlock(&mut *conn, &key_sql, &name) {
                    log::warn!(
                        "table {}: unlocking key {:?} failed; discarding the session",
                        q.spec.name,
                        hold.key
                    );
                }
            }
            drop(here);
            done.map(drop).map_err(q.err(op))
        }
    }
}

pub(crate) fn settle(
    ctx: &Ctx,
    id: i64,
    hold: KeyHold,
    outcome: Outcome,
    within: Duration,
) -> Result<()> {
    let leading = outcome.leading_params(SystemTime::now());
    under_key(
        ctx,
        id,
        hold,
        outcome.op(),
        outcome.sql(&ctx.queue.sql),
        leading,
        within,
    )
}

/// Gives back the attempt the take counted, then unlocks: the row is claimable at once and its
/// next delivery reads the same attempt.
pub(crate) fn hand_back(ctx: &Ctx, id: i64, hold: KeyHold, within: Duration) {
    let sql = &ctx.queue.sql.unclaim;
    if let Err(e) = under_key(ctx, id, hold, "hand back", sql, Vec::new(), within) {
        log::warn!(
            "table {}: row {id} is back, but its attempt stays spent: {e}",
            ctx.spec().name
        );
    }
}
