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
//!
//! FIFO groups. A row in work leaves no mark in its row here (no transaction stays open, no
//! lease is written): what shows it is a key held by a live session. So every row of a group
//! is worked under one key of the group, which only one session can hold:
//! 1. Candidates are heads only: rows with no unfinished row of their group older (smaller id).
//!    A head in work is still unfinished, so the rows behind it are not candidates at all.
//! 2. The group's key: the row's own key when the template reads no column but the group
//!    (`"orders-{customer}"`: equal groups render equal keys, so the key *is* the group's
//!    lock); otherwise a second key, `sqlbroker-fifo:<table>:<group>`, tried first, then the
//!    row's key. Both are tried without waiting; a group whose key is held elsewhere is
//!    skipped. A `NULL` group is a group of its own and gets no group key.
//! 3. The take re-checks, in its one statement under the keys, that the row is still claimable
//!    and still its group's head: a row of the group committed or requeued after the
//!    candidates were read, with a smaller id, is taken first next time.
//! 4. Settlement runs under the keys, then unlocks them (the group key last).
//!
//! Why this is safe: whoever works a row of a group holds the group's key from before its take
//! until after its settlement commits, so two rows of one group are never in work at once, on
//! any broker or process that shares the keys; and a take only succeeds on the row that is its
//! group's head at that moment. A row committed out of id order behind a row in work waits for
//! the key (it may run after that row, never beside it). A crash ends the session, the
//! database frees both keys, and the head, unfinished with its attempt spent, is the first
//! row of its group claimed again: the group is never stuck.

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

use super::limit_keys::{key_sql, passed_by, take_slots, unlock_all};
use super::{rates, unreadable_rows, Claimed, Hold, Outcome, SCAN_MAX};
use crate::dialect::keys::{ProcessKey, SessionKeys};
use crate::dialect::DbConn;
use crate::error::{DbError, Result};
use crate::model::schedule::claim_now;
use crate::model::value::Value;
use crate::runtime::limits::InWork;
use crate::runtime::{Ctx, PooledConn};

/// A held key: the row's key's text, and what holds it (and, in a FIFO table whose template
/// reads other columns than the group, the group's key).
pub(crate) struct KeyHold {
    pub key: String,
    holder: Holder,
}

// One per delivery, moved a handful of times: the size difference costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Holder {
    /// In the process's registry (SQLite); given back when dropped.
    Process(Vec<ProcessKey>),
    /// By a server session: the connection goes with the delivery. `names` are the lock names
    /// held, in the order taken; `here` marks them held by this broker (a key whose previous
    /// holder's mark was still being cleared has none).
    Session {
        conn: PooledConn,
        keys: SessionKeys,
        names: Vec<String>,
        here: Vec<ProcessKey>,
    },
}

/// The prefix of a FIFO group's own key ([`keys_of`]).
const GROUP_KEY: &str = "sqlbroker-fifo:";

/// The keys a candidate row is taken under, in the order they are tried: in a FIFO table whose
/// key template reads another column than the group, the group's key first (`NULL` groups
/// have none), then the row's key. A group key equal to the row's key is taken once.
///
/// Modelled in model/advisory.pml (key_lock).
fn keys_of(ctx: &Ctx, row_key: &str, user_values: &[Value]) -> Vec<String> {
    let spec = ctx.spec();
    let mut keys = Vec::with_capacity(2);
    if let (Some(_), Some(col), Some(template)) = (spec.fifo_group(), spec.group, &spec.key) {
        match user_values.get(col) {
            None | Some(Value::Null) => {}
            Some(_) if template.reads_only(col) => {}
            Some(v) => {
                let mut key = format!("{GROUP_KEY}{}:", spec.name);
                v.render_into(&mut key);
                if key != row_key {
                    keys.push(key);
                }
            }
        }
    }
    keys.push(row_key.to_string());
    keys
}

/// Modelled in model/advisory.pml (candidates).
pub(crate) fn claim(ctx: &Ctx, limit: usize, by: Option<Instant>) -> Result<Vec<Claimed>> {
    // Where the claim starts reading: after the cursor, where the table has one.
    let start = ctx.queue.sql.advisory_cursor.then(|| ctx.cursor.start());
    let after = start
        .and_then(|s| s.after)
        .map(|(run_at, id)| (Value::Time(run_at), id));
    let out = scan(ctx, limit, by, after)?;
    if let Some(start) = start {
        // A server's claim takes one row (its session holds the key), the process's up to
        // `limit`; fewer ends the pass.
        let asked = if ctx.keys.is_some() { limit } else { 1 };
        let keys = out.iter().filter_map(|c| Some((c.due?, c.id)));
        ctx.cursor.advance(start, asked, keys);
    }
    Ok(out)
}

/// A claim of up to `limit` rows, reading candidates after `after` (`(run_at, id)`), or from
/// the head.
///
/// Modelled in model/advisory.pml (candidates), model/limits.pml (candidates).
fn scan(
    ctx: &Ctx,
    limit: usize,
    by: Option<Instant>,
    mut after: Option<(Value, i64)>,
) -> Result<Vec<Claimed>> {
    let q = &ctx.queue;
    let Some(template) = &q.spec.key else {
        return Ok(Vec::new());
    };
    let Some(mut conn) = ctx.claim_conn_checked(by)? else {
        return Ok(Vec::new());
    };
    let now = claim_now(SystemTime::now());
    // Concurrency limits: the maxes in force and slot spaces, read from the record on each
    // claim.
    let mut limits = match q.spec.limits.is_empty() {
        true => None,
        false => Some(
            q.limits
                .read_with_slots(&q.spec, &mut *conn, q.dialect.registry().limits)
                .map_err(q.err("claim"))?,
        ),
    };
    rates::sweep(ctx, &mut *conn);
    let rate_maxes = rates::maxes(ctx, &mut *conn).map_err(q.err("claim"))?;
    let mut tried = HashSet::new();
    let mut out = Vec::new();
    let mut page = ctx.opts.advisory_scan.min(SCAN_MAX);
    let mut scanned = 0;
    // What this claim took stays taken whatever fails later: a failure after the first row ends
    // the claim with the rows it has (each already holds its key and its counted attempt).
    let partial = |out: Vec<Claimed>, e: DbError| {
        if out.is_empty() {
            return Err(q.err("claim")(e));
        }
        ctx.set_error(q.err("claim")(e));
        Ok(out)
    };
    let mut fair_scan = super::fair::Scan::new(limit.max(16));
    // Keys found at their max, left out of the later pages (`super::except`).
    let mut except = super::except::Except::new(&q.sql.advisory_except);
    loop {
        let fair = q.spec.fair.is_some();
        let rows = match &after {
            // Fair claims: candidates key by key, read on while the claim is short.
            _ if fair => {
                let full = |v: &Value| super::fair::blocked(ctx, &tried, v);
                fair_scan.next(ctx, &mut *conn, now, &full)
            }
            None => conn.query(&q.sql.claim, &[Value::Time(now), Value::Int(page as i64)]),
            Some((run_at, id)) => {
                let mut params = vec![Value::Time(now), run_at.clone()];
                if !q.dialect.syntax().row_compare {
                    params.push(run_at.clone());
                }
                params.push(Value::Int(*id));
                let stmt = match except.statement(true) {
                    Some((stmt, values)) => {
                        params.extend(values);
                        stmt
                    }
                    None => q.sql.claim_after.as_str(),
                };
                params.push(Value::Int(page as i64));
                conn.query(stmt, &params)
            }
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
            let user = &row[2..];
            let key = template.render(user);
            let keys = keys_of(ctx, &key, user);
            if keys.iter().any(|k| tried.contains(k)) {
                continue;
            }
            let limit_keys = InWork::keys(&q.spec, user);
            if passed_by(&tried, &limit_keys) {
                except.passed_marked(&tried, &limit_keys, user);
                continue;
            }
            let rate_keys = rates::keys(ctx, user);
            if rates::passed_by(&tried, &rate_keys) {
                continue;
            }
            let group = q
                .spec
                .fifo_group()
                .and(q.spec.group)
                .map(|g| user.get(g).unwrap_or(&Value::Null));
            match (&ctx.keys, key_sql(ctx)) {
                (Some(registry), _) => {
                    let mut held = Vec::with_capacity(keys.len());
                    for k in &keys {
                        match registry.try_take(k) {
                            Some(h) => held.push(h),
                            None => break,
                        }
                    }
                    if held.len() < keys.len() {
                        // The key refused is in work here; those taken go back as `held` drops.
                        tried.insert(keys[held.len()].clone());
                        continue;
                    }
                    let slots =
                        take_slots(ctx, &mut *conn, limits.as_mut(), &limit_keys, |_, k| {
                            Ok(registry.try_take(k))
                        });
                    match slots {
                        Ok(Ok(slots)) => held.extend(slots),
                        Ok(Err((full, _taken))) => {
                            // The row's keys and the slots taken go back as they drop.
                            tried.insert(full);
                            except.passed_marked(&tried, &limit_keys, user);
                            continue;
                        }
                        Err(e) => return partial(out, e),
                    }
                    let mut stamps =
                        match rates::take(ctx, &mut *conn, &rate_keys, &rate_maxes, &mut tried) {
                            Ok(Some(stamps)) => stamps,
                            // A window is full: the row's keys and slots go back as they drop.
                            Ok(None) => continue,
                            Err(e) => return partial(out, e),
                        };
                    match rates::refresh(ctx, &mut *conn, &mut stamps) {
                        Ok(true) => {}
                        // A window passed meanwhile and another claim took a slot.
                        Ok(false) => {
                            if let Err(e) = rates::give_back(ctx, &mut *conn, &stamps) {
                                return partial(out, e);
                            }
                            continue;
                        }
                        Err(e) => return partial(out, e),
                    }
                    tried.extend(keys);
                    match take(ctx, &mut *conn, now, id, group) {
                        Ok(Some((row, unreadable))) => {
                            // Counted from the take, not before it; a slot another claim took
                            // meanwhile hands the row back (the keys go as `held` drops).
                            match rates::confirm(ctx, &mut *conn, &mut stamps) {
                                Ok(true) => {}
                                Ok(false) => {
                                    let back = conn.execute(&q.sql.unclaim, &[Value::Int(id)]);
                                    let freed = rates::give_back(ctx, &mut *conn, &stamps);
                                    if let Err(e) = back.and(freed) {
                                        return partial(out, e);
                                    }
                                    continue;
                                }
                                Err(e) => return partial(out, e),
                            }
                            let hold = Hold::Advisory(KeyHold {
                                key,
                                holder: Holder::Process(held),
                            });
                            super::fair::served(ctx, user);
                            fair_scan.took(ctx, user);
                            match Claimed::new(ctx, row, hold, unreadable) {
                                Ok(c) => out.push(c),
                                Err(e) => return partial(out, e),
                            }
                        }
                        // Settled meanwhile: the keys go back as `held` drops, the window
                        // slots here.
                        Ok(None) => {
                            if let Err(e) = rates::give_back(ctx, &mut *conn, &stamps) {
                                return partial(out, e);
                            }
                        }
                        Err(e) => return partial(out, e),
                    }
                }
                (None, Some(sql)) => {
                    if let Some(k) = keys.iter().find(|k| q.held_here.is_held(k)) {
                        // One of this broker's deliveries has it: the server would refuse.
                        tried.insert(k.clone());
                        continue;
                    }
                    let names: Vec<String> = keys.iter().map(|k| q.dialect.key_name(k)).collect();
                    let mut session = SessionKeys::default();
                    let mut taken = 0;
                    for name in &names {
                        match session.lock(&mut *conn, &sql, name) {
                            Ok(true) => taken += 1,
                            Ok(false) => break,
                            // The session's keys are unknown: it is discarded, never pooled.
                            Err(e) => return Err(q.err("claim")(e)),
                        }
                    }
                    if taken < names.len() {
                        tried.insert(keys[taken].clone());
                        if !unlock_all(ctx, &mut *conn, &mut session, &names[..taken]) {
                            return Ok(Vec::new());
                        }
                        continue;
                    }
                    let mut names = names;
                    let slots =
                        take_slots(ctx, &mut *conn, limits.as_mut(), &limit_keys, |c, k| {
                            let name = q.dialect.key_name(k);
                            Ok(session.lock(c, &sql, &name)?.then_some(name))
                        });
                    match slots {
                        Ok(Ok(slots)) => names.extend(slots),
                        Ok(Err((full, taken))) => {
                            tried.insert(full);
                            except.passed_marked(&tried, &limit_keys, user);
                            names.extend(taken);
                            if !unlock_all(ctx, &mut *conn, &mut session, &names) {
                                return Ok(Vec::new());
                            }
                            continue;
                        }
                        // The session's keys are unknown: it is discarded, never pooled.
                        Err(e) => return Err(q.err("claim")(e)),
                    }
                    let mut stamps =
                        match rates::take(ctx, &mut *conn, &rate_keys, &rate_maxes, &mut tried) {
                            Ok(Some(stamps)) => stamps,
                            Ok(None) => {
                                if !unlock_all(ctx, &mut *conn, &mut session, &names) {
                                    return Ok(Vec::new());
                                }
                                continue;
                            }
                            // The session's keys are unknown: it is discarded, never pooled.
                            Err(e) => return Err(q.err("claim")(e)),
                        };
                    match rates::refresh(ctx, &mut *conn, &mut stamps) {
                        Ok(true) => {}
                        // A window passed meanwhile and another claim took a slot.
                        Ok(false) => {
                            if rates::give_back(ctx, &mut *conn, &stamps).is_err()
                                || !unlock_all(ctx, &mut *conn, &mut session, &names)
                            {
                                return Ok(Vec::new());
                            }
                            continue;
                        }
                        // The session's keys are unknown: it is discarded, never pooled.
                        Err(e) => return Err(q.err("claim")(e)),
                    }
                    tried.extend(keys.iter().cloned());
                    match take(ctx, &mut *conn, now, id, group) {
                        Ok(Some((row, unreadable))) => {
                            // Counted from the take, not before it; a slot another claim took
                            // meanwhile hands the row back, under the keys still held.
                            match rates::confirm(ctx, &mut *conn, &mut stamps) {
                                Ok(true) => {}
                                Ok(false) => {
                                    if conn.execute(&q.sql.unclaim, &[Value::Int(id)]).is_err()
                                        || rates::give_back(ctx, &mut *conn, &stamps).is_err()
                                        || !unlock_all(ctx, &mut *conn, &mut session, &names)
                                    {
                                        return Ok(Vec::new());
                                    }
                                    continue;
                                }
                                // The session's keys are unknown: it is discarded.
                                Err(e) => return Err(q.err("claim")(e)),
                            }
                            super::fair::served(ctx, user);
                            // The connection holds the keys: it goes with the delivery.
                            let here = keys
                                .iter()
                                .filter_map(|k| q.held_here.try_take(k))
                                .collect();
                            let holder = Holder::Session {
                                conn: conn.into_inner(),
                                keys: session,
                                names,
                                here,
                            };
                            let hold = Hold::Advisory(KeyHold { key, holder });
                            return Claimed::new(ctx, row, hold, unreadable)
                                .map(|c| vec![c])
                                .map_err(q.err("claim"));
                        }
                        Ok(None) => {
                            if rates::give_back(ctx, &mut *conn, &stamps).is_err()
                                || !unlock_all(ctx, &mut *conn, &mut session, &names)
                            {
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
        if fair {
            // The next keys of the rotation, or more rows of keys whose first were in work.
            if found == 0 || out.len() >= limit {
                return Ok(out);
            }
            continue;
        }
        if out.len() >= limit || found < page || scanned >= SCAN_MAX {
            return Ok(out);
        }
        page = (page * 2).min(SCAN_MAX - scanned);
    }
}

/// A taken row, and why a value of it could not be read.
type Taken = (Vec<Value>, Option<String>);

/// Takes row `id` under its keys if it is still claimable (FIFO: still the head of `group`),
/// counting its attempt.
///
/// Modelled in model/advisory.pml (take), model/limits.pml (take).
fn take(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    now: SystemTime,
    id: i64,
    group: Option<&Value>,
) -> Result<Option<Taken>, DbError> {
    let q = &ctx.queue;
    let row = q.dialect.advisory_take(conn, &q.sql, now, id, group)?;
    Ok(row.map(|row| (row, unreadable_rows(conn, 1).pop().flatten())))
}

/// Runs `sql` (`leading` parameters, then the id) under the keys, then unlocks them; with what
/// a `settled` outcome does for the jobs waiting on the row, and the output it writes
/// ([`crate::runtime::deps::settle_in_transaction`]).
///
/// Modelled in model/advisory.pml (settle), model/limits.pml (settle).
fn under_key(
    ctx: &Ctx,
    id: i64,
    hold: KeyHold,
    (op, settled, output): (&'static str, Option<&str>, Option<&[u8]>),
    sql: &str,
    leading: Vec<Value>,
    within: Duration,
) -> Result<()> {
    let q = &ctx.queue;
    let mut params = leading;
    params.push(Value::Int(id));
    let run = |conn: &mut dyn DbConn| {
        crate::runtime::deps::settle_in_transaction(
            &ctx.queue, conn, sql, &params, id, settled, output,
        )
    };
    match hold.holder {
        Holder::Process(held) => {
            let mut conn = q.conn_within(op, within)?;
            let done = super::transient_retried(super::settle_retries(ctx), || run(&mut *conn));
            drop(held);
            done.map(drop).map_err(q.err(op))
        }
        Holder::Session {
            mut conn,
            mut keys,
            names,
            here,
        } => {
            let done = super::transient_retried(super::settle_retries(ctx), || run(&mut *conn));
            unlock_all(ctx, &mut *conn, &mut keys, &names);
            drop(here);
            done.map(drop).map_err(q.err(op))
        }
    }
}

/// Saves `data` as row `id`'s checkpoint, under the key: on the session that holds it (a
/// session that lost it fails the statement), or, for the process's keys, on a pooled
/// connection. `ClaimLost` if the row is gone or finished.
pub(crate) fn checkpoint(
    ctx: &Ctx,
    id: i64,
    hold: &mut KeyHold,
    data: &[u8],
    within: Duration,
) -> Result<()> {
    let q = &ctx.queue;
    let Some(write) = &q.sql.checkpoint_write else {
        return Ok(());
    };
    let params = [Value::Bytes(data.to_vec()), Value::Int(id)];
    let written = match &mut hold.holder {
        Holder::Process(_) => {
            let mut conn = q.conn_within("checkpoint", within)?;
            conn.execute(write, &params)
        }
        Holder::Session { conn, .. } => conn.execute(write, &params),
    };
    match written.map_err(q.err("checkpoint"))? {
        0 => Err(crate::error::BrokerError::ClaimLost {
            table: ctx.spec().name.clone(),
            id,
            why: "the row is gone or finished",
        }),
        _ => Ok(()),
    }
}

/// Modelled in model/advisory.pml (settle).
pub(crate) fn settle(
    ctx: &Ctx,
    id: i64,
    hold: KeyHold,
    outcome: Outcome,
    output: Option<&[u8]>,
    within: Duration,
) -> Result<()> {
    let leading = outcome.leading_params(SystemTime::now());
    under_key(
        ctx,
        id,
        hold,
        (outcome.op(), outcome.settled_as(), output),
        outcome.sql(&ctx.queue.sql),
        leading,
        within,
    )
}

/// Gives back the attempt the take counted, then unlocks: the row is claimable at once and its
/// next delivery reads the same attempt.
///
/// Modelled in model/advisory.pml (hand_back).
pub(crate) fn hand_back(ctx: &Ctx, id: i64, hold: KeyHold, within: Duration) {
    let sql = &ctx.queue.sql.unclaim;
    if let Err(e) = under_key(
        ctx,
        id,
        hold,
        ("hand back", None, None),
        sql,
        Vec::new(),
        within,
    ) {
        log::warn!(
            "table {}: row {id} is back, but its attempt stays spent: {e}",
            ctx.spec().name
        );
    }
}
