//! Lease form.
//!
//! Protocol:
//! 1. Claim: write a deadline `ceil(now) + lease` into `locked_until` of up to `batch` ready
//!    rows whose lease is empty or expired, count their attempts, commit at once (one statement
//!    where the database allows; MySQL: a locking select and one update of the found rows in
//!    one READ COMMITTED transaction). No transaction stays open and no connection is held.
//!    PostgreSQL (no priorities, no FIFO groups): the claim reads on from the subscription's
//!    cursor past the last row claimed ([cursor](crate::runtime::cursor)); where it starts never changes
//!    which rows a claim may take.
//! 2. The deadline is the delivery token. The renewer thread rewrites it every half lease
//!    (`UPDATE .. WHERE id = ? AND locked_until = <token held>`), one statement per table per
//!    round where the database allows.
//!    A renewal whose answer was lost may have committed: its token is tried too (next round,
//!    settlement), but only if it was written before the held token's last second; later, a
//!    claim of the expired row by another could write the very same token (whole seconds),
//!    and matching it would settle that claim's lease. Such a renewal is forgotten: if it had
//!    committed, the delivery learns its lease is lost.
//! 3. Settlement names the token it holds: `.. WHERE id = ? AND locked_until = <token>`. Zero
//!    rows changed is [`LeaseLost`](crate::BrokerError::LeaseLost), never a silent success.
//! 4. A row handed back unhandled (the subscription closed with it queued) has its lease
//!    cleared and its attempt given back (fenced the same way): claimable at once, its next
//!    delivery reads the same attempt. A delivery dropped unsettled by its handler is a failed
//!    attempt: retried after a short delay (the delivery's drop policy).
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
use std::time::{Duration, Instant, SystemTime};

use super::{unreadable_rows, Claimed, Hold, Outcome, SCAN_MAX};
use crate::dialect::{DbConn, ROW_USER_COLUMNS};
use crate::error::{BrokerError, DbError, DbErrorKind, Result};
use crate::model::schedule::{claim_now, lease_alive, lease_token};
use crate::model::value::Value;
use crate::runtime::cursor::{Key, Start};
use crate::runtime::renewer::{LeaseCell, LeaseState};
use crate::runtime::{AckBatch, AckGroup, AckItem, AckResults, Ctx, Queue, ACK_GROUP_MAX};
use parking_lot::MutexGuard;

/// Modelled in model/fifo.pml (heads), model/lease.pml (claim).
pub(crate) fn claim(ctx: &Ctx, limit: usize, by: Option<Instant>) -> Result<Vec<Claimed>> {
    let q = &ctx.queue;
    let Some(mut conn) = ctx.claim_conn_checked(by)? else {
        return Ok(Vec::new());
    };
    let now = SystemTime::now();
    let token = lease_token(now, q.spec.lease_secs);
    if let Some(limited) = &q.sql.limited {
        let rows = claim_limited(ctx, limited, &mut *conn, limit, claim_now(now), token)
            .map_err(q.err("claim"))?;
        return book(ctx, &mut *conn, rows, token);
    }
    // Where the claim starts reading: after the cursor, where the table has one.
    let start = q.sql.claim_from.as_ref().map(|_| ctx.cursor.start());
    let after = start.and_then(|s| s.after);
    let rows = q
        .dialect
        .lease_claim(&mut *conn, &q.sql, claim_now(now), limit, token, after)
        .map_err(q.err("claim"))?;
    if let Some(start) = start {
        // Each row's `run_at` comes last (`row_columns`): the cursor's key.
        let keys: Vec<Option<Key>> = rows
            .iter()
            .map(|r| {
                let run_at = r.last()?.as_system_time()?;
                Some((run_at, r.first()?.as_i64()?))
            })
            .collect();
        ctx.cursor.advance(start, limit, keys.into_iter().flatten());
    }
    book(ctx, &mut *conn, rows, token)
}

/// The claimed `rows` as deliveries, their leases booked for renewal.
///
/// Modelled in model/lease.pml (claim).
fn book(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    rows: Vec<Vec<Value>>,
    token: SystemTime,
) -> Result<Vec<Claimed>> {
    let q = &ctx.queue;
    let unreadable = unreadable_rows(conn, rows.len());
    // Every row is checked before any is booked for renewal, so a row that fails to read leaves
    // no lease renewed for ever behind it (the claimed rows return when their leases expire).
    let ids: Option<Vec<i64>> = rows
        .iter()
        .map(|r| {
            r.first()
                .and_then(Value::as_i64)
                .filter(|_| r.len() >= ROW_USER_COLUMNS)
        })
        .collect();
    let ids =
        ids.ok_or_else(|| q.err("claim")(DbError::other("a claimed row has no integer id")))?;
    let cells = ctx.leases.insert_all(&ids, token);
    let mut out = Vec::with_capacity(rows.len());
    for ((row, cell), unreadable) in rows.into_iter().zip(cells).zip(unreadable) {
        // The claim counted this attempt.
        out.push(Claimed::new(ctx, row, Hold::Lease(cell), unreadable).map_err(q.err("claim"))?);
    }
    Ok(out)
}

/// The lease claim of a table with flow control (concurrency or rate limits, fair claims), in
/// one transaction:
/// 1. counts the rows in work per key (every unfinished row whose lease has not expired) as
///    committed now, and takes candidates in claim order (fair tables: in the fair rotation,
///    [`super::fair`]) whose every key has room by that count (one statement, `SKIP LOCKED`
///    where the database has it), without a turn: claims run side by side. A row with rate
///    limits takes a window slot of each ([`super::rates`]) in this transaction, or is passed
///    by with its key;
/// 2. with concurrency limits, if it took any, waits for **the table's turn** (its record's
///    row, locked until the transaction ends), then counts again: every claim committed
///    before the turn, and its own rows, are in that count;
/// 3. hands back (lease cleared, attempt given back, window slots freed) the rows it took
///    last of any key now over its max, the maxes read from the record it locked; commits.
///
/// Why this is exact: commits of claims that took rows are ordered by the turn, and each
/// checks, before it commits, everything committed before it plus itself. A row's lease ends
/// only by its settlement or expiry, which only lowers the count. A window slot is stamped
/// in the claim's transaction, so it counts exactly when the claim commits.
///
/// A crash of a holder costs what the lease form's crash costs: its rows count as in work
/// until their leases expire, the moment they are claimable again.
///
/// Modelled in model/limits.pml (count_and_choose, turn).
fn claim_limited(
    ctx: &Ctx,
    sql: &crate::dialect::LimitSql,
    conn: &mut dyn DbConn,
    limit: usize,
    now: SystemTime,
    token: SystemTime,
) -> Result<Vec<Vec<Value>>, DbError> {
    let mut rows = claim_limited_once(ctx, sql, conn, limit, now, token)?;
    // Rate limits: a key found short of window slots was passed by; its slots are made now
    // (`top_up`, at the start of a claim) and the claim goes on for the rows it still wants,
    // so a key's first claim is not an empty one (which a drain would take for the end).
    if rows.len() < limit && ctx.queue.flow.has_rate_needs() {
        let more = claim_limited_once(ctx, sql, conn, limit - rows.len(), now, token)?;
        rows.extend(more);
    }
    Ok(rows)
}

/// One limited lease claim: [`claim_limited`] runs it again once when it passed a key by
/// for want of window slots.
fn claim_limited_once(
    ctx: &Ctx,
    sql: &crate::dialect::LimitSql,
    conn: &mut dyn DbConn,
    limit: usize,
    now: SystemTime,
    token: SystemTime,
) -> Result<Vec<Vec<Value>>, DbError> {
    use crate::runtime::limits::InWork;
    use std::collections::{HashMap, HashSet};
    let q = &ctx.queue;
    let spec = &q.spec;
    let limited = !spec.limits.is_empty();
    let registry = q.dialect.registry();
    let count = |conn: &mut dyn DbConn| -> Result<InWork, DbError> {
        let mut work = InWork::new(spec);
        if !limited {
            return Ok(work);
        }
        work.add_counted(spec, &conn.query(&sql.in_work, &[Value::Time(now)])?);
        Ok(work)
    };
    // Window slots the last claims found missing, made before this claim's transaction.
    super::rates::top_up(ctx, conn, &sql.begin);
    let out = crate::dialect::in_transaction(conn, &sql.begin, |conn| {
        // The maxes read last choose the rows, if read a moment ago (by the last claim's turn,
        // which reads them again and decides); else they are read now (SQLite: always, this is
        // the turn). A claim that finds its limits full takes no turn: it reads them each time,
        // and follows a raise made by another process from its next claim.
        let maxes = match q
            .limits
            .last_within(MAXES_FRESH)
            .filter(|_| !sql.turn_at_begin)
        {
            _ if !limited => crate::runtime::limits::Maxes::from([]),
            Some(m) => m,
            None => q.limits.read(spec, conn, registry.limits)?,
        };
        // Likewise the rows in work: as the last turn counted them, if a moment ago (the
        // turn counts again and decides), else counted now. Counting is what a limited claim
        // costs most (PostgreSQL walks the dead index entries of every row acked within a
        // lease's time), so a claim whose hint finds room counts once, in its turn.
        let hint = q
            .limits
            .work_within(MAXES_FRESH)
            .filter(|_| limited && !sql.turn_at_begin);
        // A row the hint finds no room for is judged by a count made now: the hint holds the
        // rows settled since it was counted (the ack that woke this claim, which opened the
        // room, among them).
        let mut hinted = hint.is_some();
        let mut work = match hint {
            Some(w) => w,
            None => count(conn)?,
        };
        // The keys of the rows this claim chose so far: what a count made now adds to.
        let mut mine: Vec<Vec<String>> = Vec::new();
        if hinted && work.table_full(spec, &maxes) {
            hinted = false;
            work = count(conn)?;
        }
        let rate_maxes = super::rates::maxes(ctx, conn)?;
        let mut chosen = Vec::with_capacity(limit);
        // Each row chosen in claim order, with its user columns (the fair rotation's key).
        let mut order: Vec<(i64, Vec<Value>)> = Vec::new();
        let mut stamps: HashMap<i64, Vec<super::rates::Stamp>> = HashMap::new();
        let mut pool = super::rates::Pool::default();
        let mut tried = HashSet::new();
        // PostgreSQL: candidates from the subscription's cursor, past the dead index entries
        // of rows already claimed. It moves only past rows this claim took before the first
        // it passed by, so a row left for a full key is read again by the next claim. (Not
        // with fair claims: their candidates come key by key.)
        let cursor = sql
            .candidates_from
            .as_ref()
            .filter(|_| spec.fair.is_none())
            .map(|from| (from, ctx.cursor.start()));
        let user_at = if cursor.is_some() || spec.fair.is_some() {
            2
        } else {
            1
        };
        let mut before_skip: Vec<Key> = Vec::new();
        let mut skipped = false;
        // The rows read so far (a later page reads the first ones again).
        let mut considered: HashSet<i64> = HashSet::new();
        let mut first = true;
        // Keys found at their max, left out of later pages by their column's value.
        let mut except = super::except::Except::new(&sql.except);
        // Rows chosen past the first page, read without locks: locked by id before the take.
        let mut loose = Vec::new();
        // A page of the batch first (on the servers locked as read): where no limit binds, it
        // is all the claim reads.
        let mut page = limit.clamp(1, SCAN_MAX);
        // On the servers, a fair table without limits has its rotation's first rows locked as
        // read (as the first page of other tables' candidates is): each is this claim's to
        // take. With limits, rows are read unlocked and locked by id once chosen, as before:
        // two claims that locked different rows of one key side by side left the key's order
        // to which of them took its turn first (the later row kept, the earlier handed back).
        let fair_locked = !sql.lock.is_empty() && spec.limits.is_empty() && spec.rates.is_empty();
        let mut fair_scan = match fair_locked {
            true => super::fair::Scan::new(limit).locked(),
            false => super::fair::Scan::new(limit),
        };
        // The limits whose key is the fair key's (or the table's): a fair key at one of them
        // has no row to offer, whatever its rows hold.
        let fair_col = spec.fair.as_ref().map(|f| f.column);
        let covering: Vec<usize> = spec
            .limits
            .iter()
            .enumerate()
            .filter(|(_, l)| {
                fair_col.is_some() && l.template.columns().all(|c| Some(c) == fair_col)
            })
            .map(|(i, _)| i)
            .collect();
        'scan: while !work.table_full(spec, &maxes) {
            let fair = spec.fair.is_some();
            let locked = usize::from(first && !sql.lock.is_empty() && !fair);
            let after = match cursor {
                Some((
                    _,
                    Start {
                        after: Some((run_at, id)),
                        ..
                    },
                )) => Some((run_at, id)),
                _ => None,
            };
            let rows = match except.statement(after.is_some()) {
                Some((stmt, values)) if !fair && !first => {
                    let mut params = vec![Value::Time(now), Value::Time(now)];
                    if let Some((run_at, id)) = after {
                        params.extend([Value::Time(run_at), Value::Int(id)]);
                    }
                    params.extend(values);
                    params.push(Value::Int(page as i64));
                    conn.query(stmt, &params)
                }
                _ => match cursor {
                    _ if fair => {
                        let full = |v: &Value| {
                            let mut user = vec![Value::Null; spec.columns.len()];
                            if let Some(slot) = fair_col.and_then(|c| user.get_mut(c)) {
                                *slot = v.clone();
                            }
                            work.full_at(&maxes, &InWork::keys(spec, &user), &covering)
                                || super::fair::blocked(ctx, &tried, v)
                        };
                        fair_scan.wanting(limit.saturating_sub(chosen.len() + loose.len()));
                        fair_scan.next(ctx, conn, now, &full)
                    }
                    Some((
                        from,
                        Start {
                            after: Some((run_at, id)),
                            ..
                        },
                    )) => conn.query(
                        &from[locked],
                        &[
                            Value::Time(now),
                            Value::Time(now),
                            Value::Time(run_at),
                            Value::Int(id),
                            Value::Int(page as i64),
                        ],
                    ),
                    _ => conn.query(
                        &sql.candidates[locked],
                        &[Value::Time(now), Value::Time(now), Value::Int(page as i64)],
                    ),
                },
            }?;
            first = false;
            let read = rows.len();
            // A later page reads the first rows again: only those not read yet are new.
            let rows = match fair {
                true => rows,
                false => super::except::unread(rows, &mut considered),
            };
            // Rate limits: each row's keys, and how many rows of each key are still to come
            // in view: a key's first row takes the slots of all of them at once.
            let rate_keys: Vec<Vec<String>> = match q.sql.rates.is_some() {
                true => rows
                    .iter()
                    .map(|row| super::rates::keys(ctx, row.get(user_at..).unwrap_or_default()))
                    .collect(),
                false => Vec::new(),
            };
            let mut ahead: HashMap<(usize, &str), usize> = HashMap::new();
            for (i, k) in rate_keys.iter().flat_map(|ks| ks.iter().enumerate()) {
                *ahead.entry((i, k.as_str())).or_default() += 1;
            }
            if !ahead.is_empty() {
                // PostgreSQL: every key's slots in one statement a limit.
                let room = limit.saturating_sub(chosen.len() + loose.len());
                let wants: Vec<(usize, &str, usize)> = ahead
                    .iter()
                    .map(|((i, k), n)| (*i, *k, (*n).min(room)))
                    .collect();
                super::rates::prefill(ctx, conn, &rate_maxes, &tried, &mut pool, &wants)?;
            }
            for (n, row) in rows.iter().enumerate() {
                let rate_keys = rate_keys.get(n);
                for (i, k) in rate_keys.into_iter().flat_map(|ks| ks.iter().enumerate()) {
                    if let Some(c) = ahead.get_mut(&(i, k.as_str())) {
                        *c = c.saturating_sub(1);
                    }
                }
                let Some(id) = row.first().and_then(Value::as_i64) else {
                    continue;
                };
                let user = row.get(user_at..).unwrap_or_default();
                let keys = InWork::keys(spec, user);
                let at = row.get(1).and_then(Value::as_system_time).map(|r| (r, id));
                let room = 'room: {
                    if !work.has_room(&maxes, &keys) {
                        if !hinted {
                            break 'room false;
                        }
                        hinted = false;
                        work = count(conn)?;
                        for k in &mine {
                            work.add(k);
                        }
                        if !work.has_room(&maxes, &keys) {
                            break 'room false;
                        }
                    }
                    if let Some(rate_keys) = rate_keys {
                        if super::rates::passed_by(&tried, rate_keys) {
                            break 'room false;
                        }
                        // This row and those of its key still in view, up to the claim's room.
                        let room = limit.saturating_sub(chosen.len() + loose.len());
                        let want = |i: usize, k: &str| {
                            (ahead.get(&(i, k)).copied().unwrap_or(0) + 1).min(room)
                        };
                        match super::rates::take_pooled(
                            ctx,
                            conn,
                            rate_keys,
                            &rate_maxes,
                            &mut tried,
                            &mut pool,
                            &want,
                        )? {
                            Some(s) => {
                                stamps.insert(id, s);
                            }
                            None => break 'room false,
                        }
                    }
                    true
                };
                if fair {
                    fair_scan.offered(ctx, user, at, room);
                }
                if !room {
                    skipped = true;
                    except.passed(|which| work.full_at(&maxes, &keys, which), user);
                    continue;
                }
                if !skipped {
                    if let Some(run_at) = row.get(1).and_then(Value::as_system_time) {
                        before_skip.push((run_at, id));
                    }
                }
                // Counted now: a row the take then finds gone only leaves this claim short.
                work.add(&keys);
                if limited {
                    mine.push(keys);
                }
                if spec.fair.is_some() {
                    order.push((id, user.to_vec()));
                }
                match locked == 1 || sql.lock.is_empty() || (fair && fair_locked) {
                    true => chosen.push(id),
                    false => loose.push(id),
                }
                if chosen.len() + loose.len() >= limit || work.table_full(spec, &maxes) {
                    break 'scan;
                }
            }
            if fair {
                // The next keys of the rotation, while the claim is short.
                if rows.is_empty() {
                    break;
                }
                continue;
            }
            if read < page || page >= SCAN_MAX {
                break;
            }
            page = (page * 4).min(SCAN_MAX);
        }
        if let Some((_, start)) = cursor {
            // Short of the batch with nothing passed by: the end, from the head next time.
            let asked = if skipped { before_skip.len() } else { limit };
            ctx.cursor.advance(start, asked, before_skip.into_iter());
        }
        chosen.extend(lock_loose(sql, conn, &loose, now)?);
        let mut rows = take_chosen(sql, conn, &chosen, now, token)?;
        if !rows.is_empty() && !sql.turn_at_begin && limited {
            // The turn, then the count that decides.
            let maxes = q.limits.read(spec, conn, registry.limits_locked)?;
            let mut work = count(conn)?;
            let user = |row: &Vec<Value>| -> Vec<String> {
                let cols = row.get(3..3 + spec.columns.len()).unwrap_or_default();
                InWork::keys(spec, cols)
            };
            let mut back = HashSet::new();
            for row in rows.iter().rev() {
                let keys = user(row);
                if work.over(&maxes, &keys) {
                    if let Some(id) = row.first().and_then(Value::as_i64) {
                        conn.execute(&q.sql.unclaim, &[Value::Int(id), Value::Time(token)])?;
                        work.remove(&keys);
                        back.insert(id);
                    }
                }
            }
            q.limits.counted(&work);
            if !back.is_empty() {
                log::debug!(
                    "table {}: a claim handed back {} rows another claim's commit left no room for",
                    spec.name,
                    back.len()
                );
                rows.retain(|r| {
                    !r.first()
                        .and_then(Value::as_i64)
                        .is_some_and(|id| back.contains(&id))
                });
            }
        }
        // Window slots of rows not taken after all go back, in this transaction, with those
        // stamped ahead for rows not chosen; those of rows taken are stamped again if the
        // claim took long to get here (the commit follows). The claim's transaction holds
        // each (locked, or made by it), so none is lost before the commit.
        if !stamps.is_empty() {
            let taken: HashSet<i64> = rows
                .iter()
                .filter_map(|r| r.first().and_then(Value::as_i64))
                .collect();
            let (mut kept, mut back) = (Vec::new(), Vec::new());
            for (id, s) in stamps {
                match taken.contains(&id) {
                    true => kept.extend(s),
                    false => back.extend(s),
                }
            }
            super::rates::give_back(ctx, conn, &back)?;
            if !super::rates::refresh(ctx, conn, &mut kept)? {
                return Err(DbError::new(
                    crate::error::DbErrorKind::Transient,
                    "a rate slot this claim held changed before its commit",
                ));
            }
        }
        pool.give_back(ctx, conn)?;
        let taken: HashSet<i64> = rows
            .iter()
            .filter_map(|r| r.first().and_then(Value::as_i64))
            .collect();
        fair_scan.advance(ctx, &taken);
        if let Some((_, user)) = order.iter().rev().find(|(id, _)| {
            rows.iter()
                .any(|r| r.first().and_then(Value::as_i64) == Some(*id))
        }) {
            super::fair::served(ctx, user);
        }
        Ok(rows)
    });
    super::rates::sweep(ctx, conn);
    out
}

/// How long a limited lease claim chooses by the maxes the last claim's turn read rather than
/// reading the record itself.
const MAXES_FRESH: Duration = Duration::from_millis(50);

/// Locks rows chosen past a claim's first page (servers), by primary key, passing by those
/// another claim holds: the ids of those still claimable.
fn lock_loose(
    sql: &crate::dialect::LimitSql,
    conn: &mut dyn DbConn,
    loose: &[i64],
    now: SystemTime,
) -> Result<Vec<i64>, DbError> {
    if loose.is_empty() {
        return Ok(Vec::new());
    }
    let leading = vec![Value::Time(now), Value::Time(now)];
    let (lock, params) = crate::dialect::for_ids(&sql.lock, leading, loose)?;
    Ok(conn
        .query(lock, &params)?
        .iter()
        .filter(|r| r.get(1).and_then(Value::as_i64) == Some(1))
        .filter_map(|r| r.first().and_then(Value::as_i64))
        .collect())
}

/// Leases the rows `chosen`, returning them: on the servers the rows the candidates' read
/// locked (MySQL: then read); on SQLite those still claimable
/// ([`LimitSql`](crate::dialect::LimitSql)).
///
/// Modelled in model/limits.pml (count_and_choose).
fn take_chosen(
    sql: &crate::dialect::LimitSql,
    conn: &mut dyn DbConn,
    chosen: &[i64],
    now: SystemTime,
    token: SystemTime,
) -> Result<Vec<Vec<Value>>, DbError> {
    use crate::dialect::for_ids;
    if chosen.is_empty() {
        return Ok(Vec::new());
    }
    if sql.take_locked.is_empty() {
        let leading = vec![Value::Time(token), Value::Time(now), Value::Time(now)];
        let (take, params) = for_ids(&sql.take, leading, chosen)?;
        return conn.query(take, &params);
    }
    let (take, params) = for_ids(&sql.take_locked, vec![Value::Time(token)], chosen)?;
    if sql.taken.is_empty() {
        return conn.query(take, &params);
    }
    conn.execute(take, &params)?;
    let (taken, params) = for_ids(&sql.taken, Vec::new(), chosen)?;
    conn.query(taken, &params)
}

/// Runs `sql` with `leading` parameters, the id and the token; `Ok(false)` if the token is gone.
///
/// Modelled in model/lease.pml (settle).
#[allow(clippy::too_many_arguments)]
fn fenced(
    ctx: &Ctx,
    id: i64,
    cell: &Arc<LeaseCell>,
    what: Settling<'_>,
    sql: &str,
    leading: Vec<Value>,
    within: Duration,
) -> Result<bool> {
    // The connection first: while the pool is held, the renewer goes on renewing the lease
    // (its cell unlocked), so a settlement waiting for a connection does not lose it.
    let conn = ctx.queue.conn_within(what.0, within);
    // Waits for a renewal of this delivery in progress, then keeps the renewer away.
    let mut state = cell.lock();
    state.done = true;
    let tokens = tokens_of(&state);
    let changed =
        conn.and_then(|conn| fenced_on(ctx, conn, id, &tokens, what, sql, &leading, within));
    drop(state);
    ctx.leases.remove(cell);
    changed
}

/// What a fenced statement is: the operation's name, the outcome it records for the jobs
/// waiting on the row ([`crate::runtime::deps::settle_in_transaction`]), and the output it
/// writes.
type Settling<'a> = (&'static str, Option<&'a str>, Option<&'a [u8]>);

/// The token held, then the tokens of renewals whose answers were lost: the row holds one of
/// them, if it is still this delivery's.
///
/// Modelled in model/lease.pml (settle_unsure).
fn tokens_of(state: &LeaseState) -> Vec<SystemTime> {
    std::iter::once(state.token)
        .chain(state.unsure.iter().copied())
        .collect()
}

/// Runs `sql` on `conn` fenced by each of `tokens` in turn until one matches; the caller holds
/// the lease's cell (taken after `conn`).
///
/// A lost connection is tried once more on a new one when the statement finishes the row (ack,
/// dead letter, cancel: `settled` names the outcome): fenced by the token, and the row never
/// claimable again, running it twice is safe. If the second run matches no row, the first may
/// have committed before its answer was lost, or the lease may be gone: that cannot be told
/// apart, so the first error stands (at-least-once; see the crate docs on idempotent handlers).
/// A statement that leaves the row in the queue (a retry, a hand-back) is not run again: if
/// the first committed, the row may already be claimed again within the same second, under
/// the same token (`ceil(now) + lease`), and a second run would clear that claim's lease while
/// its handler runs (found by the model, model/README.md, F1). The lost connection stands;
/// the row is retried, or comes back when its lease ends.
///
/// Modelled in model/lease.pml (settle, settle_again, settle_unsure).
#[allow(clippy::too_many_arguments)]
fn fenced_on(
    ctx: &Ctx,
    mut conn: crate::runtime::PooledConn,
    id: i64,
    tokens: &[SystemTime],
    (op, settled, output): Settling<'_>,
    sql: &str,
    leading: &[Value],
    within: Duration,
) -> Result<bool> {
    let q = &ctx.queue;
    let mut lost = None;
    // A renewal whose answer was lost may have written its token: try that one too.
    for token in tokens {
        let mut params = leading.to_vec();
        params.push(Value::Int(id));
        params.push(Value::Time(*token));
        // Fenced by the token: running it again after a transient rollback is safe.
        let run = |conn: &mut dyn DbConn| {
            crate::runtime::deps::settle_in_transaction(
                &ctx.queue, conn, sql, &params, id, settled, output,
            )
        };
        let first = || crate::runtime::injected("lease.fenced", &q.spec.name, || run(&mut *conn));
        match super::transient_retried(super::settle_retries(ctx), first) {
            Ok(0) => {}
            Ok(_) => return Ok(true),
            Err(e) if e.kind == DbErrorKind::ConnectionLost && settled.is_none() => {
                return Err(q.err(op)(e));
            }
            Err(e) if e.kind == DbErrorKind::ConnectionLost && lost.is_none() => {
                drop(conn);
                crate::runtime::pause_point("lease.rerun", &q.spec.name);
                conn = q.conn_within(op, within)?;
                match run(&mut *conn) {
                    Ok(n) if n > 0 => return Ok(true),
                    _ => lost = Some(e),
                }
            }
            Err(e) => return Err(q.err(op)(e)),
        }
    }
    match lost {
        Some(e) => Err(q.err(op)(e)),
        None => Ok(false),
    }
}

/// Modelled in model/fifo.pml (settle), model/lease.pml (settle), model/limits.pml (settle).
pub(crate) fn settle(
    ctx: &Ctx,
    id: i64,
    cell: &Arc<LeaseCell>,
    outcome: Outcome,
    output: Option<&[u8]>,
    within: Duration,
) -> Result<()> {
    // An ack with an output acks alone: its transaction writes it. A table with dependencies
    // settles its acks alone on the servers (each ack's transaction settles its dependents),
    // in groups of their own where the dialect says so ([`Dialect::groups_settlements`]).
    let alone = output.is_some() && ctx.spec().output.is_some();
    let deps = ctx.spec().dependencies;
    let grouped = !deps || ctx.queue.dialect.groups_settlements();
    let held = if matches!(outcome, Outcome::Ack) && !alone && grouped {
        let q = &ctx.queue;
        match deps {
            false => ack(ctx, id, cell, within, &q.acks, &|items| {
                ack_tables(items, within)
            })?,
            true => ack(ctx, id, cell, within, &q.settles, &|items| {
                settle_acks(items, within)
            })?,
        }
    } else {
        let sql = outcome.sql(&ctx.queue.sql);
        let leading = outcome.leading_params(SystemTime::now());
        let settled = outcome.settled_as();
        let what = (outcome.op(), settled, output);
        fenced(ctx, id, cell, what, sql, leading, within)?
    };
    if held {
        Ok(())
    } else {
        Err(lost(ctx, id))
    }
}

fn lost(ctx: &Ctx, id: i64) -> BrokerError {
    BrokerError::LeaseLost {
        table: ctx.spec().name.clone(),
        id,
    }
}

/// An ack, written with the acks of other handlers that arrive meanwhile (group commit: one
/// statement per table, one commit; the tables of one broker share it where the dialect
/// allows). If the grouped write fails, the ack is written alone; if that matches nothing after
/// the group lost its connection, the group may have deleted the row before its answer was
/// lost: the lost connection stands, not `LeaseLost`.
///
/// Modelled in model/lease.pml (settle).
fn ack(
    ctx: &Ctx,
    id: i64,
    cell: &Arc<LeaseCell>,
    within: Duration,
    group: &AckGroup,
    flush: &dyn Fn(Vec<AckItem>) -> AckResults,
) -> Result<bool> {
    let q = &ctx.queue;
    // The cell is locked by the flush once it has its connection ([`lock_cells`]), not here:
    // an ack waiting in the group, or for the pool, keeps its lease renewed.
    let item = AckItem {
        queue: q.clone(),
        id,
        cell: cell.clone(),
    };
    let results = group.run(item, flush, &AckResults::default());
    let mine = results.iter().find(|(key, _)| *key == q.key());
    let done = match mine.map(|(_, part)| part) {
        Some(Ok(deleted)) => Ok(deleted.contains(&id)),
        Some(Err(kind)) => ack_alone(ctx, id, cell, *kind, within),
        // A flush that panicked: no part of it is known to have been written.
        None => ack_alone(ctx, id, cell, DbErrorKind::Other, within),
    };
    ctx.leases.remove(cell);
    done
}

/// The cells of `rows` locked (each after a renewal of it in progress), marked settled so the
/// renewer leaves them alone, and the `(id, token)` pairs a fenced statement names: the token
/// held, then those of renewals whose answers were lost. Taken only with a connection in hand,
/// so no lease waits unrenewed on the pool.
fn lock_cells<'a>(
    rows: impl IntoIterator<Item = (i64, &'a Arc<LeaseCell>)>,
) -> (Vec<MutexGuard<'a, LeaseState>>, Vec<(i64, SystemTime)>) {
    let mut states = Vec::new();
    let mut pairs = Vec::new();
    for (id, cell) in rows {
        let mut state = cell.lock();
        state.done = true;
        pairs.extend(tokens_of(&state).into_iter().map(|t| (id, t)));
        states.push(state);
    }
    (states, pairs)
}

/// One table's part of a flush: its queue and its acks' rows and lease cells.
type TableAcks = (Arc<Queue>, Vec<(i64, Arc<LeaseCell>)>);

/// Writes a group's acks: one table's in its one statement (as before tables shared a group);
/// several tables' in one transaction, a statement per table and one commit (one failure fails
/// them all: each caller then writes its ack alone).
fn ack_tables(items: Vec<AckItem>, within: Duration) -> AckResults {
    let mut tables: Vec<TableAcks> = Vec::new();
    for item in items {
        let at = match tables.iter().position(|(q, _)| Arc::ptr_eq(q, &item.queue)) {
            Some(at) => at,
            None => {
                tables.push((item.queue.clone(), Vec::new()));
                tables.len() - 1
            }
        };
        tables[at].1.push((item.id, item.cell));
    }
    if let [(q, rows)] = &tables[..] {
        let rows = rows.iter().map(|(id, cell)| (*id, cell));
        return Arc::new(vec![(q.key(), write_cells(q, rows, within))]);
    }
    let written = write_tables(&tables, within);
    Arc::new(match written {
        Ok(parts) => parts,
        Err(kind) => tables.iter().map(|(q, _)| (q.key(), Err(kind))).collect(),
    })
}

/// Writes a group of acks of one table with dependencies ([`Queue::settles`]) in one
/// transaction: each ack's fenced delete, then, if it deleted the row, what the settlement
/// does for the jobs waiting on it ([`crate::runtime::deps::settled`]), as an ack alone does
/// in its own transaction. One commit for the group, and the counts of the jobs waiting taken
/// down once per flush rather than by each ack in turn, each holding the count's lock until
/// its own commit: a 10,000-job fan-in into one callback acked one by one ran at 0.08 of a
/// plain table's rate. One failure fails the group: each caller then settles alone.
///
/// Modelled in model/deps.pml (settle_commit): each ack's settlement is the one it makes alone,
/// run in a transaction shared with others.
fn settle_acks(items: Vec<AckItem>, within: Duration) -> AckResults {
    let Some(q) = items.first().map(|i| i.queue.clone()) else {
        return AckResults::default();
    };
    let written = (|| -> std::result::Result<std::collections::HashSet<i64>, DbErrorKind> {
        let mut conn = q
            .conn_within("ack", within)
            .map_err(|_| DbErrorKind::Transient)?;
        let (_held, pairs) = lock_cells(items.iter().map(|i| (i.id, &i.cell)));
        conn.batch(&q.sql.begin_write).map_err(|e| e.kind)?;
        flush_transaction(&mut *conn, |conn| {
            let mut settled = std::collections::HashSet::new();
            // A row's pairs are neighbours: the token held, then the unsure ones; the first
            // that deletes the row settles it.
            for (id, token) in &pairs {
                if settled.contains(id) {
                    continue;
                }
                let params = [Value::Int(*id), Value::Time(*token)];
                let n = crate::runtime::injected("lease.settle_many", &q.spec.name, || {
                    conn.execute(&q.sql.ack, &params)
                })?;
                if n > 0 {
                    let left = crate::runtime::deps::left_by(&q.spec, crate::dialect::deps::ACKED);
                    crate::runtime::deps::settled_with_output(
                        &q.spec,
                        &q.sql,
                        &*q,
                        conn,
                        *id,
                        crate::dialect::deps::ACKED,
                        None,
                        left,
                    )?;
                    settled.insert(*id);
                }
            }
            conn.batch("COMMIT")?;
            Ok(settled)
        })
    })();
    Arc::new(vec![(q.key(), written.map(Arc::new))])
}

/// Several tables' acks in one transaction on a connection of their (one) broker's pool.
fn write_tables(
    tables: &[TableAcks],
    within: Duration,
) -> std::result::Result<Vec<(usize, AckBatch)>, DbErrorKind> {
    let first = &tables[0].0;
    let Some(begin) = first.dialect.shared_acks_begin() else {
        return Err(DbErrorKind::Other);
    };
    let mut conn = first
        .conn_within("ack", within)
        .map_err(|_| DbErrorKind::Transient)?;
    let mut held = Vec::with_capacity(tables.len());
    let mut pairs = Vec::with_capacity(tables.len());
    for (_, rows) in tables {
        let (states, of_table) = lock_cells(rows.iter().map(|(id, cell)| (*id, cell)));
        held.push(states);
        pairs.push(of_table);
    }
    conn.batch(begin).map_err(|e| e.kind)?;
    flush_transaction(&mut *conn, |conn| {
        let mut parts = Vec::with_capacity(tables.len());
        for ((q, _), pairs) in tables.iter().zip(&pairs) {
            let deleted = crate::runtime::injected("lease.ack_many", &q.spec.name, || {
                delete_pairs(q, &mut *conn, pairs)
            })?;
            parts.push((q.key(), Ok(Arc::new(deleted.into_iter().collect()))));
        }
        conn.batch("COMMIT")?;
        Ok(parts)
    })
}

/// Runs a flush's `body` in the transaction open on `conn` (the body commits it), rolling it
/// back if the body fails. A panic inside (a dialect's bug) must not send the connection back
/// to the pool with its transaction open, holding SQLite's write lock and the process's
/// writer lock: rolled back too, then the panic goes on.
fn flush_transaction<T>(
    conn: &mut dyn DbConn,
    body: impl FnOnce(&mut dyn DbConn) -> std::result::Result<T, DbError>,
) -> std::result::Result<T, DbErrorKind> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&mut *conn))) {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => {
            conn.rollback_or_discard();
            Err(e.kind)
        }
        Err(panic) => {
            conn.rollback_or_discard();
            std::panic::resume_unwind(panic)
        }
    }
}

/// The ack of one row after the grouped statement that held it failed with `kind`: fenced,
/// alone. If that matches nothing after the group lost its connection, the group may have
/// deleted the row before its answer was lost: that stands (a lost connection, "may have
/// committed"), not `LeaseLost`, which would say the row is another claim's.
///
/// Modelled in model/lease.pml (settle_again).
fn ack_alone(
    ctx: &Ctx,
    id: i64,
    cell: &Arc<LeaseCell>,
    kind: DbErrorKind,
    within: Duration,
) -> Result<bool> {
    let q = &ctx.queue;
    let conn = q.conn_within("ack", within);
    let (held, pairs) = lock_cells([(id, cell)]);
    let tokens: Vec<SystemTime> = pairs.into_iter().map(|(_, t)| t).collect();
    let alone = conn.and_then(|conn| {
        fenced_on(
            ctx,
            conn,
            id,
            &tokens,
            // Settled as acked: the row is finished, so a lost connection is tried again.
            ("ack", Some(crate::dialect::deps::ACKED), None),
            &q.sql.ack,
            &[],
            within,
        )
    });
    drop(held);
    match alone {
        Ok(false) if kind == DbErrorKind::ConnectionLost => Err(q.err("ack")(DbError::new(
            kind,
            "the connection was lost during a grouped ack: it may have committed",
        ))),
        r => r,
    }
}

/// Acks many deliveries of one subscription in one statement per [`ACK_GROUP_MAX`] (the
/// explicit batch, [`Delivery::ack_all`](crate::Delivery::ack_all)); each result in order.
/// Per row it only reads the tokens under the cell's lock: the statement's pairs are built
/// from them directly, and the book is updated once for the batch.
pub(crate) fn ack_all(
    ctx: &Ctx,
    batch: &[(i64, Arc<LeaseCell>)],
    within: Duration,
) -> Vec<Result<()>> {
    let mut out = Vec::with_capacity(batch.len());
    for rows in batch.chunks(ACK_GROUP_MAX) {
        let cells = rows.iter().map(|(id, cell)| (*id, cell));
        let written = write_cells(&ctx.queue, cells, within);
        for (id, cell) in rows {
            let held = match &written {
                Ok(deleted) => Ok(deleted.contains(id)),
                Err(kind) => ack_alone(ctx, *id, cell, *kind, within),
            };
            out.push(held.and_then(|held| if held { Ok(()) } else { Err(lost(ctx, *id)) }));
        }
    }
    ctx.leases.remove_all(batch.iter().map(|(_, cell)| &**cell));
    out
}

/// Deletes the rows of `rows` that still hold their leases' tokens, in one statement; the ids
/// deleted, or the kind of error the statement met. The cells are locked once the connection
/// is in hand ([`lock_cells`]).
///
/// Modelled in model/lease.pml (settle).
fn write_cells<'a>(
    q: &Queue,
    rows: impl IntoIterator<Item = (i64, &'a Arc<LeaseCell>)>,
    within: Duration,
) -> AckBatch {
    // No connection in time: nothing ran; each caller tries alone.
    let mut conn = q
        .conn_within("ack", within)
        .map_err(|_| DbErrorKind::Transient)?;
    let (_held, pairs) = lock_cells(rows);
    let deleted = crate::runtime::injected("lease.ack_many", &q.spec.name, || {
        delete_pairs(q, &mut *conn, &pairs)
    })
    .map_err(|e| e.kind)?;
    Ok(Arc::new(deleted.into_iter().collect()))
}

/// The statement of [`write_cells`] on `conn`: one pair runs the table's single ack, the
/// cheapest statement for it.
fn delete_pairs(
    q: &Queue,
    conn: &mut dyn DbConn,
    pairs: &[(i64, SystemTime)],
) -> std::result::Result<Vec<i64>, DbError> {
    match pairs {
        [(id, token)] => {
            let params = [Value::Int(*id), Value::Time(*token)];
            let n = conn.execute(&q.sql.ack, &params)?;
            Ok(if n == 0 { vec![] } else { vec![*id] })
        }
        _ => q.dialect.lease_ack_many(conn, &q.spec, &q.sql, pairs),
    }
}

/// Moves the lease's deadline to `until` (a new token), fenced by the token held; `LeaseLost`
/// if the row no longer holds it. The renewer leaves a lease alone while its deadline is past
/// what a renewal would write.
///
/// Modelled in model/lease.pml (extend).
pub(crate) fn extend(
    ctx: &Ctx,
    id: i64,
    cell: &Arc<LeaseCell>,
    until: SystemTime,
) -> Result<SystemTime> {
    let q = &ctx.queue;
    // The connection first, as every settlement (`fenced`): the renewer goes on meanwhile.
    let mut conn = q.conn("extend")?;
    let mut state = cell.lock();
    let until = until.max(state.token);
    let lost = || BrokerError::LeaseLost {
        table: ctx.spec().name.clone(),
        id,
    };
    if state.done {
        return Err(lost());
    }
    // A lease that has ended is not brought back (`lease_alive`).
    let now = SystemTime::now();
    let tokens: Vec<SystemTime> = std::iter::once(state.token)
        .chain(state.unsure.iter().copied())
        .filter(|t| lease_alive(*t, now))
        .collect();
    for token in tokens {
        let params = [Value::Time(until), Value::Int(id), Value::Time(token)];
        if conn
            .execute(&q.sql.extend, &params)
            .map_err(q.err("extend"))?
            > 0
        {
            cell.set_token(&mut state, until);
            state.unsure.clear();
            return Ok(until);
        }
    }
    Err(lost())
}

/// Saves `data` as row `id`'s checkpoint, fenced by the token held (or a renewal's whose
/// answer was lost, which then becomes the token); `LeaseLost` if the row holds none of them.
///
/// Modelled in model/lease.pml (checkpoint).
pub(crate) fn checkpoint(ctx: &Ctx, id: i64, cell: &Arc<LeaseCell>, data: &[u8]) -> Result<()> {
    let q = &ctx.queue;
    let Some(write) = &q.sql.checkpoint_write else {
        return Ok(());
    };
    // The connection first, as every settlement (`fenced`): the renewer goes on meanwhile.
    let mut conn = q.conn("checkpoint")?;
    let mut state = cell.lock();
    if state.done {
        return Err(lost(ctx, id));
    }
    for token in tokens_of(&state) {
        let params = [
            Value::Bytes(data.to_vec()),
            Value::Int(id),
            Value::Time(token),
        ];
        if conn.execute(write, &params).map_err(q.err("checkpoint"))? > 0 {
            cell.set_token(&mut state, token);
            state.unsure.clear();
            return Ok(());
        }
    }
    Err(lost(ctx, id))
}

/// Clears the lease of a row no handler saw and gives back the attempt its claim counted, so
/// the row is claimable at once and its next delivery reads the same attempt.
///
/// Modelled in model/fifo.pml (hand_back), model/lease.pml (hand_back).
pub(crate) fn hand_back(ctx: &Ctx, id: i64, cell: &Arc<LeaseCell>, within: Duration) {
    let sql = &ctx.queue.sql.unclaim;
    match fenced(
        ctx,
        id,
        cell,
        ("hand back", None, None),
        sql,
        Vec::new(),
        within,
    ) {
        Ok(true) => {}
        Ok(false) => log::debug!(
            "table {}: row {id} was handed back after its lease was lost",
            ctx.spec().name
        ),
        Err(e) => log::warn!(
            "table {}: row {id} returns when its lease expires, its attempt spent: {e}",
            ctx.spec().name
        ),
    }
}
