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
//!    that connection, then unlocks. Drop without settlement just unlocks.
//!
//! Why this is safe: a row is only ever worked under its key, one key is held by one session at
//! a time, and the take re-checks the row under the key, so a row settled by the previous holder
//! is not taken again. Keys belong to the database, so two tables with equal keys wait for each
//! other. A crash ends the sessions and the database releases their keys: the rows are back at
//! once, their attempts spent. A connection whose unlock fails is discarded (ending its session
//! releases the key), never returned to the pool holding a key.
//!
//! PostgreSQL advisory locks belong to the session: use a direct connection or a session-mode
//! pooler. SQLite keys live in the process: two processes on one file may deliver a row twice.

use std::collections::HashSet;
use std::time::SystemTime;

use parking_lot::Mutex;

use super::{split_row, Claimed, Hold, Outcome};
use crate::dialect::DbConn;
use crate::error::{DbError, Result};
use crate::runtime::{Ctx, PooledConn};
use crate::schedule::claim_now;
use crate::Value;

/// Keys in work in this process, for databases without server-side advisory locks.
#[derive(Default)]
pub(crate) struct KeyRegistry {
    held: Mutex<HashSet<String>>,
}

impl KeyRegistry {
    pub fn try_take(&self, key: &str) -> bool {
        let mut held = self.held.lock();
        if held.contains(key) {
            return false;
        }
        held.insert(key.to_string())
    }

    pub fn give_back(&self, key: &str) {
        self.held.lock().remove(key);
    }
}

/// A held key: its name, and the connection holding it (server-side locks).
pub(crate) struct KeyHold {
    pub key: String,
    conn: Option<PooledConn>,
}

/// Runs a key lock or unlock statement; true if it reports success (1).
fn key_query(conn: &mut dyn DbConn, sql: &str, name: &str) -> Result<bool, DbError> {
    let rows = conn.query(sql, &[Value::Text(name.to_string())])?;
    Ok(matches!(
        rows.first().and_then(|r| r.first()),
        Some(Value::Int(1))
    ))
}

/// Unlocks a server-side key; discards the connection if the session may still hold it.
fn unlock_key(ctx: &Ctx, conn: &mut dyn DbConn, key: &str) {
    let q = &ctx.queue;
    let Some(sql) = &q.sql.key_unlock else { return };
    let name = q.dialect.key_name(key);
    match key_query(conn, sql, &name) {
        // Released: the session may be pooled again.
        Ok(true) => conn.set_broken(false),
        Ok(false) => {
            log::warn!(
                "table {}: key {key:?} was not held at unlock; discarding the connection",
                q.spec.name
            );
            conn.mark_broken();
        }
        Err(e) => {
            log::warn!(
                "table {}: unlocking key {key:?} failed ({e}); discarding the connection",
                q.spec.name
            );
            conn.mark_broken();
        }
    }
}

/// The most candidate rows one claim reads. Rows of keys in work stay ready, so a claim pages
/// past them (doubling the page from `advisory_scan`) to reach other keys; past this many it
/// gives up until the next round, bounding the cost of a claim when every key is busy.
const SCAN_LIMIT: usize = 10_000;

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
        }
        .map_err(q.err("claim"))?;
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
            match (&ctx.keys, &q.sql.key_lock) {
                (Some(registry), _) => {
                    if !registry.try_take(&key) {
                        continue;
                    }
                    match take(ctx, &mut **conn, now, id, key.clone(), None) {
                        Ok(Some(c)) => out.push(c),
                        Ok(None) => registry.give_back(&key),
                        Err(e) => {
                            registry.give_back(&key);
                            if out.is_empty() {
                                return Err(q.err("claim")(e));
                            }
                            ctx.set_error(format!("claim on table {}: {e}", q.spec.name));
                            return Ok(out);
                        }
                    }
                }
                (None, Some(lock_sql)) => {
                    let name = q.dialect.key_name(&key);
                    match key_query(&mut **conn, lock_sql, &name) {
                        // Marked broken while it holds the key, until the unlock succeeds: if
                        // anything unwinds meanwhile the pool discards the session, and ending
                        // the session releases the key.
                        Ok(true) => conn.mark_broken(),
                        Ok(false) => continue,
                        Err(e) => {
                            // The lock may or may not have been taken: never pool this session.
                            conn.mark_broken();
                            return Err(q.err("claim")(e));
                        }
                    }
                    let taken = q
                        .dialect
                        .advisory_take(&mut **conn, &q.sql, now, id)
                        .and_then(|row| row.map(split_row).transpose());
                    match taken {
                        Ok(Some((id, attempts, payload, values))) => {
                            // The connection holds the key: it goes with the delivery.
                            let hold = Hold::Advisory(KeyHold {
                                key,
                                conn: Some(conn),
                            });
                            return Ok(vec![Claimed {
                                id,
                                attempt: attempts,
                                payload,
                                values,
                                hold,
                            }]);
                        }
                        Ok(None) => unlock_key(ctx, &mut **conn, &key),
                        Err(e) => {
                            conn.mark_broken();
                            return Err(q.err("claim")(e));
                        }
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

/// Takes a row under its key (in-process keys: the connection is not kept).
fn take(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    now: SystemTime,
    id: i64,
    key: String,
    held_by: Option<PooledConn>,
) -> Result<Option<Claimed>, DbError> {
    let q = &ctx.queue;
    let Some(row) = q.dialect.advisory_take(conn, &q.sql, now, id)? else {
        return Ok(None);
    };
    let (id, attempts, payload, values) = split_row(row)?;
    let hold = Hold::Advisory(KeyHold { key, conn: held_by });
    Ok(Some(Claimed {
        id,
        attempt: attempts,
        payload,
        values,
        hold,
    }))
}

pub(crate) fn settle(ctx: &Ctx, id: i64, hold: KeyHold, outcome: Outcome) -> Result<()> {
    let q = &ctx.queue;
    let KeyHold { key, conn } = hold;
    let mut conn = match conn {
        Some(c) => c,
        None => match q.conn(outcome.op()) {
            Ok(c) => c,
            Err(e) => {
                give_back(ctx, &key);
                return Err(e);
            }
        },
    };
    let mut params = outcome.leading_params(SystemTime::now());
    params.push(Value::Int(id));
    let done = conn.execute(outcome.sql(&q.sql), &params);
    unlock(ctx, &mut conn, &key);
    done.map(|_| ()).map_err(q.err(outcome.op()))
}

/// Drop policy: unlock; the row is claimable again at once.
pub(crate) fn release(ctx: &Ctx, hold: KeyHold) {
    let KeyHold { key, conn } = hold;
    match conn {
        Some(mut c) => unlock(ctx, &mut c, &key),
        None => give_back(ctx, &key),
    }
}

fn unlock(ctx: &Ctx, conn: &mut PooledConn, key: &str) {
    if ctx.keys.is_some() {
        give_back(ctx, key);
    } else {
        unlock_key(ctx, &mut ***conn, key);
    }
}

fn give_back(ctx: &Ctx, key: &str) {
    if let Some(r) = &ctx.keys {
        r.give_back(key);
    }
}
