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

use super::{unreadable_rows, Claimed, Hold, Outcome, SCAN_MAX};
use crate::dialect::keys::SessionKeys;
use crate::dialect::{savepoint, DbConn};
use crate::error::{BrokerError, Result};
use crate::model::schedule::claim_now;
use crate::model::value::Value;
use crate::runtime::{ClaimConn, Ctx, PooledConn};

/// Modelled in model/row_lock.pml (claim).
pub(crate) fn claim(ctx: &Ctx, by: Option<Instant>) -> Result<Vec<Claimed>> {
    let q = &ctx.queue;
    let Some(mut conn) = ctx.claim_conn_checked(by)? else {
        return Ok(Vec::new());
    };
    if let Some(limited) = &q.sql.limited {
        return claim_limited(ctx, limited, conn);
    }
    if let (Some(by_id), None) = (&q.sql.row_lock_by_id, &q.sql.fifo) {
        return claim_by_id(ctx, by_id, conn);
    }
    let now = claim_now(SystemTime::now());
    // Marked broken from `BEGIN` until the transaction ends (a commit or rollback clears it):
    // should anything between unwind or return early, the pool discards the session instead of
    // handing it out mid-transaction. (MySQL: `SET TRANSACTION` applies to the session's next
    // transaction, so a half-opened one must not reach the next user either.)
    conn.mark_broken();
    for stmt in &q.sql.begin {
        conn.batch(stmt).map_err(q.err("claim"))?;
    }
    // Where the claim starts reading: after the cursor, where the table has one.
    let start = q.sql.claim_from.as_ref().map(|_| ctx.cursor.start());
    let after = start.and_then(|s| s.after);
    let claimed = q.dialect.row_lock_claim(&mut *conn, &q.sql, now, after);
    let row = match claimed {
        Ok(row) => row,
        Err(e) => {
            conn.rollback_or_discard();
            return Err(q.err("claim")(e));
        }
    };
    if let Some(start) = start {
        // The row's `run_at` comes last (`row_columns`): the cursor's key.
        let key = row
            .as_ref()
            .and_then(|r| Some((r.last()?.as_system_time()?, r.first()?.as_i64()?)));
        ctx.cursor.advance(start, 1, key.into_iter());
    }
    let Some(row) = row else {
        conn.rollback_or_discard();
        return Ok(Vec::new());
    };
    let unreadable = unreadable_rows(&mut *conn, 1).pop().flatten();
    deliver(ctx, conn, row, unreadable, None, Vec::new())
}

/// The claim in two steps (MySQL tables with queues, and views: `TableSql::row_lock_by_id`):
/// candidates in claim order read without locks, then the first that is still claimable
/// locked by id in the claim transaction; a candidate taken or settled meanwhile is rolled
/// back (its transaction ended, so a row the lock found no longer claimable is not held) and
/// the next is tried.
fn claim_by_id(
    ctx: &Ctx,
    (candidates, take): &(String, String),
    mut conn: ClaimConn,
) -> Result<Vec<Claimed>> {
    let q = &ctx.queue;
    let now = claim_now(SystemTime::now());
    let (mut page, mut seen) = (16usize, 0usize);
    loop {
        let rows = conn
            .query(candidates, &[Value::Time(now), Value::Int(page as i64)])
            .map_err(q.err("claim"))?;
        for row in rows.iter().skip(seen) {
            let Some(id) = row.first().and_then(Value::as_i64) else {
                continue;
            };
            // Marked broken until the transaction ends, as in the plain claim.
            conn.mark_broken();
            let locked = (|| {
                for stmt in &q.sql.begin {
                    conn.batch(stmt)?;
                }
                conn.query(take, &[Value::Int(id), Value::Time(now)])
            })();
            match locked {
                Ok(mut found) if !found.is_empty() => {
                    let row = found.swap_remove(0);
                    let unreadable = unreadable_rows(&mut *conn, 1).pop().flatten();
                    return deliver(ctx, conn, row, unreadable, None, Vec::new());
                }
                Ok(_) => conn.rollback_or_discard(),
                Err(e) => {
                    conn.rollback_or_discard();
                    return Err(q.err("claim")(e));
                }
            }
        }
        if rows.len() < page || page >= SCAN_MAX {
            return Ok(Vec::new());
        }
        seen = rows.len();
        page = (page * 4).min(SCAN_MAX);
    }
}

/// The row a claim locked, as a delivery: the connection goes with it, still marked broken
/// while its transaction is open, with the slot keys its session holds (`slots`). The count
/// is taken at settlement, so the row holds the attempts before this one: it reads one more.
///
/// Modelled in model/row_lock.pml (claim).
fn deliver(
    ctx: &Ctx,
    mut conn: ClaimConn,
    mut row: Vec<Value>,
    unreadable: Option<String>,
    slots: Option<(SessionKeys, Vec<String>)>,
    xact_slots: Vec<String>,
) -> Result<Vec<Claimed>> {
    if let Some(Value::Int(a)) = row.get_mut(1) {
        *a = a.saturating_add(1);
    }
    conn.mark_broken();
    let hold = Hold::RowLock(RowHold {
        conn: conn.into_inner(),
        work: false,
        slots,
        xact_slots,
    });
    Claimed::new(ctx, row, hold, unreadable)
        .map(|c| vec![c])
        .map_err(ctx.queue.err("claim"))
}

/// The claim of a table with concurrency limits: candidates in claim order, read without
/// locks; for the first whose keys each have a free slot, the slots are taken on this session
/// (without waiting), then the row is locked by id `FOR UPDATE SKIP LOCKED` if it is still
/// claimable. The delivery holds the transaction and the slots; settlement commits, then
/// unlocks them. A crash ends the session: the row is back and its slots free at once.
fn claim_limited(
    ctx: &Ctx,
    sql: &crate::dialect::LimitSql,
    mut conn: ClaimConn,
) -> Result<Vec<Claimed>> {
    use super::limit_keys::{key_sql, passed_by, take_slots, unlock_all};
    use crate::runtime::limits::InWork;
    let q = &ctx.queue;
    let spec = &q.spec;
    let now = claim_now(SystemTime::now());
    if let Some(slot_lock) = &sql.slot_xact_lock {
        return claim_limited_in_transaction(ctx, sql, conn, slot_lock, now);
    }
    let Some(keys_sql) = key_sql(ctx) else {
        return Ok(Vec::new());
    };
    let mut limits = q
        .limits
        .read_with_slots(spec, &mut *conn, q.dialect.registry().limits)
        .map_err(q.err("claim"))?;
    super::rates::sweep(ctx, &mut *conn);
    let rate_maxes = super::rates::maxes(ctx, &mut *conn).map_err(q.err("claim"))?;
    let mut tried = std::collections::HashSet::new();
    let mut page = 64;
    let mut scan = Pages::new(sql);
    let user_at = if spec.fair.is_some() { 2 } else { 1 };
    let mut fair = super::fair::Scan::new(FAIR_KEYS);
    loop {
        let (rows, read) = scan
            .read(ctx, sql, &mut *conn, now, page, (&mut fair, &tried))
            .map_err(q.err("claim"))?;
        for row in &rows {
            let Some(id) = row.first().and_then(Value::as_i64) else {
                continue;
            };
            let user = row.get(user_at..).unwrap_or_default();
            let keys = InWork::keys(spec, user);
            let rate_keys = super::rates::keys(ctx, user);
            if passed_by(&tried, &keys) || super::rates::passed_by(&tried, &rate_keys) {
                scan.except.passed_marked(&tried, &keys, user);
                continue;
            }
            let mut session = SessionKeys::default();
            let slots = take_slots(ctx, &mut *conn, Some(&mut limits), &keys, |c, k| {
                let name = q.dialect.key_name(k);
                Ok(session.lock(c, &keys_sql, &name)?.then_some(name))
            });
            let names = match slots {
                Ok(Ok(names)) => names,
                Ok(Err((full, taken))) => {
                    tried.insert(full);
                    scan.except.passed_marked(&tried, &keys, user);
                    if !unlock_all(ctx, &mut *conn, &mut session, &taken) {
                        return Ok(Vec::new());
                    }
                    continue;
                }
                // The session's keys are unknown: it is discarded, never pooled.
                Err(e) => return Err(q.err("claim")(e)),
            };
            // The window slots, committed before the row's transaction (stamped again first if
            // taking them took long: a window counts the claim from its stamp).
            let mut stamps =
                match super::rates::take(ctx, &mut *conn, &rate_keys, &rate_maxes, &mut tried) {
                    Ok(Some(stamps)) => stamps,
                    Ok(None) => {
                        if !unlock_all(ctx, &mut *conn, &mut session, &names) {
                            return Ok(Vec::new());
                        }
                        continue;
                    }
                    Err(e) => {
                        unlock_all(ctx, &mut *conn, &mut session, &names);
                        return Err(q.err("claim")(e));
                    }
                };
            match super::rates::refresh(ctx, &mut *conn, &mut stamps) {
                Ok(true) => {}
                Ok(false) => {
                    if super::rates::give_back(ctx, &mut *conn, &stamps).is_err()
                        || !unlock_all(ctx, &mut *conn, &mut session, &names)
                    {
                        return Ok(Vec::new());
                    }
                    continue;
                }
                Err(e) => {
                    unlock_all(ctx, &mut *conn, &mut session, &names);
                    return Err(q.err("claim")(e));
                }
            }
            // Marked broken until the transaction ends, as in the plain claim.
            conn.mark_broken();
            let locked = (|| {
                for stmt in &sql.begin {
                    conn.batch(stmt)?;
                }
                let take = sql.take.first().map_or("", String::as_str);
                conn.query(take, &[Value::Int(id), Value::Time(now)])
            })();
            let row = match locked {
                Ok(mut rows) if !rows.is_empty() => rows.swap_remove(0),
                Ok(_) => {
                    // Taken or settled meanwhile: the slots go back, the next candidate.
                    conn.rollback_or_discard();
                    if super::rates::give_back(ctx, &mut *conn, &stamps).is_err()
                        || !unlock_all(ctx, &mut *conn, &mut session, &names)
                    {
                        return Ok(Vec::new());
                    }
                    continue;
                }
                Err(e) => {
                    conn.rollback_or_discard();
                    unlock_all(ctx, &mut *conn, &mut session, &names);
                    return Err(q.err("claim")(e));
                }
            };
            let unreadable = unreadable_rows(&mut *conn, 1).pop().flatten();
            super::fair::served(ctx, user);
            fair.took(ctx, user);
            // Broken while the transaction is open, whatever the keys say.
            return deliver(
                ctx,
                conn,
                row,
                unreadable,
                Some((session, names)),
                Vec::new(),
            );
        }
        if spec.fair.is_some() {
            // The next keys of the rotation, or more rows of keys whose first were in work.
            if rows.is_empty() {
                return Ok(Vec::new());
            }
            continue;
        }
        if read < page || page >= SCAN_MAX {
            return Ok(Vec::new());
        }
        page = (page * 4).min(SCAN_MAX);
    }
}

/// PostgreSQL: the limited claim with transaction-scoped slot keys, taken inside the claim's
/// transaction, each candidate's under a savepoint (rolled back, with the slots it took, if the
/// row was taken meanwhile or a key is full). The transaction ends them: no unlock, and a
/// transaction pooler (PgBouncer) keeps the session for as long as they are held.
fn claim_limited_in_transaction(
    ctx: &Ctx,
    sql: &crate::dialect::LimitSql,
    mut conn: ClaimConn,
    slot_lock: &str,
    now: SystemTime,
) -> Result<Vec<Claimed>> {
    use super::limit_keys::{passed_by, take_slots};
    use crate::runtime::limits::InWork;
    const SLOT: &str = "SAVEPOINT sqlbroker_slot";
    const NO_SLOT: &str = "ROLLBACK TO SAVEPOINT sqlbroker_slot";
    const KEEP_SLOT: &str = "RELEASE SAVEPOINT sqlbroker_slot";
    let q = &ctx.queue;
    let spec = &q.spec;
    let mut side = None;
    // Marked broken from `BEGIN` until the transaction ends, as in the plain claim.
    conn.mark_broken();
    // The row, and the slot keys its transaction holds.
    type Found = Option<(Vec<Value>, Vec<String>)>;
    let found = (|| -> Result<Found, crate::error::DbError> {
        for stmt in &sql.begin {
            conn.batch(stmt)?;
        }
        let mut limits = q
            .limits
            .read_with_slots(spec, &mut *conn, q.dialect.registry().limits)?;
        let take = sql.take.first().map_or("", String::as_str);
        let rate_maxes = super::rates::maxes(ctx, &mut *conn)?;
        let mut tried = std::collections::HashSet::new();
        let mut page = 64;
        let mut scan = Pages::new(sql);
        let user_at = if spec.fair.is_some() { 2 } else { 1 };
        let mut fair = super::fair::Scan::new(FAIR_KEYS);
        loop {
            let (rows, read) = scan.read(ctx, sql, &mut *conn, now, page, (&mut fair, &tried))?;
            for row in &rows {
                let Some(id) = row.first().and_then(Value::as_i64) else {
                    continue;
                };
                let user = row.get(user_at..).unwrap_or_default();
                let keys = InWork::keys(spec, user);
                let rate_keys = super::rates::keys(ctx, user);
                if passed_by(&tried, &keys) || super::rates::passed_by(&tried, &rate_keys) {
                    scan.except.passed_marked(&tried, &keys, user);
                    continue;
                }
                conn.batch(SLOT)?;
                let slots = take_slots(ctx, &mut *conn, Some(&mut limits), &keys, |c, k| {
                    let name = q.dialect.key_name(k);
                    let got = c.query(slot_lock, &[Value::Text(name.clone())])?;
                    let taken = matches!(got.first().and_then(|r| r.first()), Some(Value::Int(1)));
                    Ok(taken.then_some(name))
                })?;
                let names = match slots {
                    Ok(names) => names,
                    Err((full, _)) => {
                        tried.insert(full);
                        scan.except.passed_marked(&tried, &keys, user);
                        conn.batch(NO_SLOT)?;
                        continue;
                    }
                };
                match conn.query(take, &[Value::Int(id), Value::Time(now)])?.pop() {
                    Some(row) => {
                        // The window slots, committed apart from the row's transaction (on
                        // another connection): a claim counts whatever becomes of it.
                        if !side_rates(ctx, &mut side, &rate_keys, &rate_maxes, &mut tried)? {
                            conn.batch(NO_SLOT)?;
                            continue;
                        }
                        conn.batch(KEEP_SLOT)?;
                        super::fair::served(ctx, user);
                        fair.took(ctx, user);
                        return Ok(Some((row, names)));
                    }
                    None => conn.batch(NO_SLOT)?,
                }
            }
            if spec.fair.is_some() {
                if rows.is_empty() {
                    return Ok(None);
                }
                continue;
            }
            if read < page || page >= SCAN_MAX {
                return Ok(None);
            }
            page = (page * 4).min(SCAN_MAX);
        }
    })();
    let (row, names) = match found {
        Ok(Some(found)) => found,
        Ok(None) => {
            conn.rollback_or_discard();
            return Ok(Vec::new());
        }
        Err(e) => {
            conn.rollback_or_discard();
            return Err(q.err("claim")(e));
        }
    };
    let unreadable = unreadable_rows(&mut *conn, 1).pop().flatten();
    deliver(ctx, conn, row, unreadable, None, names)
}

/// A limited claim's pages of candidates: `id, <user columns>` in claim order, up to `page`,
/// a later page without the rows read already and without the keys found at their max
/// ([`Except`](super::except::Except)); fair tables: `id, run_at, <user columns>` in the fair
/// rotation.
struct Pages<'a> {
    /// The keys found at their max: each row passed by is noted
    /// ([`Except::passed_marked`](super::except::Except::passed_marked)).
    except: super::except::Except<'a>,
    considered: std::collections::HashSet<i64>,
    first: bool,
}

impl<'a> Pages<'a> {
    fn new(sql: &'a crate::dialect::LimitSql) -> Self {
        Pages {
            except: super::except::Except::new(&sql.except),
            considered: std::collections::HashSet::new(),
            first: true,
        }
    }

    /// The next page's new rows, and how many rows the read returned (fewer than `page`: the
    /// end).
    fn read(
        &mut self,
        ctx: &Ctx,
        sql: &crate::dialect::LimitSql,
        conn: &mut dyn crate::dialect::DbConn,
        now: SystemTime,
        page: usize,
        (fair, tried): (&mut super::fair::Scan, &std::collections::HashSet<String>),
    ) -> Result<(Vec<Vec<Value>>, usize), crate::error::DbError> {
        if ctx.spec().fair.is_some() {
            // A row per claim, but the first rows of several keys: some may be in work.
            let full = |v: &Value| super::fair::blocked(ctx, tried, v);
            let rows = fair.next(ctx, conn, now, &full)?;
            let n = rows.len();
            return Ok((rows, n));
        }
        let first = std::mem::replace(&mut self.first, false);
        let rows = match self.except.statement(false) {
            Some((stmt, values)) if !first => {
                let mut params = vec![Value::Time(now)];
                params.extend(values);
                params.push(Value::Int(page as i64));
                conn.query(stmt, &params)?
            }
            _ => conn.query(
                &sql.candidates[0],
                &[Value::Time(now), Value::Int(page as i64)],
            )?,
        };
        let read = rows.len();
        Ok((super::except::unread(rows, &mut self.considered), read))
    }
}

/// The keys a fair row lock claim reads: it takes one row, but the first rows of a key may be
/// in work (locked), so it looks at several keys.
const FAIR_KEYS: usize = 16;

/// PostgreSQL: takes the window slots of a row whose transaction is open on another pooled
/// connection (`side`, kept for the rest of the claim), so they commit whatever becomes of
/// the row's transaction. False: a key is full (marked in `tried`).
fn side_rates(
    ctx: &Ctx,
    side: &mut Option<PooledConn>,
    rate_keys: &[String],
    maxes: &[Option<u32>],
    tried: &mut std::collections::HashSet<String>,
) -> Result<bool, crate::error::DbError> {
    if ctx.queue.sql.rates.is_none() {
        return Ok(true);
    }
    let conn = match side {
        Some(conn) => conn,
        None => {
            let conn = ctx
                .queue
                .conn_within("claim", std::time::Duration::from_secs(1))
                .map_err(|e| {
                    crate::error::DbError::new(crate::error::DbErrorKind::Transient, e.to_string())
                })?;
            side.insert(conn)
        }
    };
    super::rates::sweep(ctx, &mut **conn);
    Ok(super::rates::take(ctx, &mut **conn, rate_keys, maxes, tried)?.is_some())
}

/// Unlocks a delivery's slot keys once its transaction has ended (committed or rolled back);
/// a session that may still hold one stays marked broken and is discarded.
fn free_slots(ctx: &Ctx, conn: &mut PooledConn, slots: Option<(SessionKeys, Vec<String>)>) {
    if let Some((mut session, names)) = slots {
        super::limit_keys::unlock_all(ctx, &mut **conn, &mut session, &names);
    }
}

/// A row lock delivery's transaction.
pub(crate) struct RowHold {
    pub conn: PooledConn,
    /// The handler ran SQL of its own in the transaction, after the savepoint `WORK`: every
    /// outcome but the ack rolls back to it first.
    work: bool,
    /// Tables with concurrency limits: the slot keys the session holds, unlocked once the
    /// transaction ends.
    slots: Option<(SessionKeys, Vec<String>)>,
    /// PostgreSQL behind a transaction pooler: the slot keys the transaction holds (they end
    /// with it), taken again after a checkpoint's commit.
    xact_slots: Vec<String>,
}

/// Runs the outcome's statement and commits; on failure the transaction is rolled back (or the
/// connection discarded): the row is back as it was. Any outcome but the ack first undoes the
/// handler's own SQL, so a retry or dead letter never commits it.
///
/// Modelled in model/row_lock.pml (settle).
pub(crate) fn settle(
    ctx: &Ctx,
    id: i64,
    hold: RowHold,
    outcome: Outcome,
    output: Option<&[u8]>,
) -> Result<()> {
    let q = &ctx.queue;
    let RowHold {
        mut conn,
        work,
        slots,
        ..
    } = hold;
    let mut params = outcome.leading_params(SystemTime::now());
    params.push(Value::Int(id));
    let undo = if work && !matches!(outcome, Outcome::Ack) {
        conn.batch(savepoint::UNDO_WORK)
    } else {
        Ok(())
    };
    // Its output is written, and jobs waiting on the row are released (or dead-lettered), in
    // its transaction.
    let done = undo
        .and_then(|()| conn.execute(outcome.sql(&q.sql), &params))
        .and_then(|_| match outcome.settled_as() {
            Some(o) => crate::runtime::deps::settled_with_output(
                &q.spec,
                &q.sql,
                &**q,
                &mut *conn,
                id,
                o,
                output,
                crate::runtime::deps::left_by(&q.spec, o),
            ),
            None => Ok(()),
        })
        .and_then(|()| conn.batch("COMMIT"));
    match done {
        Ok(()) => {
            conn.set_broken(false);
            free_slots(ctx, &mut conn, slots);
            Ok(())
        }
        Err(e) => {
            conn.rollback_or_discard();
            free_slots(ctx, &mut conn, slots);
            Err(q.err(outcome.op())(e))
        }
    }
}

/// How long a row whose checkpoint committed stays unclaimable if its process dies before the
/// next commit: between the checkpoint's commit and the chained transaction's lock on it, no
/// claim may take it.
pub(crate) const CHECKPOINT_GUARD: std::time::Duration = std::time::Duration::from_secs(10);

/// What a row lock checkpoint left of the hold.
pub(crate) enum Checkpointed {
    /// Saved, and the row is locked again in a chained transaction.
    Held,
    /// The row was finished meanwhile (a cancel between the commit and the lock): the
    /// transaction is rolled back and the delivery holds nothing.
    Lost,
}

/// Saves `data` as row `id`'s checkpoint by committing the delivery's transaction (with the
/// handler's own SQL so far, [`in_transaction`]) and chaining a new one (`COMMIT AND CHAIN`: the
/// same session, isolation and, behind a transaction pooler, server) that locks the row again.
/// The commit moves `run_at` [`CHECKPOINT_GUARD`] ahead, so no claim takes the row in between
/// (and a crash's row is claimable that much later); PostgreSQL's transaction-scoped slot keys
/// are held for the session across the commit. Fenced by the held row: a session that lost
/// its transaction fails the commit, and the checkpoint with it.
///
/// Modelled in model/row_lock.pml (checkpoint, relock).
pub(crate) fn checkpoint(
    ctx: &Ctx,
    id: i64,
    hold: &mut RowHold,
    data: &[u8],
) -> Result<Checkpointed> {
    let q = &ctx.queue;
    let err = q.err("checkpoint");
    let (Some(write), Some(relock)) = (&q.sql.checkpoint_write, &q.sql.relock) else {
        return Ok(Checkpointed::Held);
    };
    let bridge = q
        .sql
        .limited
        .as_ref()
        .and_then(|l| l.slot_bridge.as_ref())
        .filter(|_| !hold.xact_slots.is_empty());
    let slot_lock = q
        .sql
        .limited
        .as_ref()
        .and_then(|l| l.slot_xact_lock.as_ref());
    let guard = crate::model::schedule::due_at(SystemTime::now(), CHECKPOINT_GUARD);
    let conn = &mut hold.conn;
    let names = &hold.xact_slots;
    let run = |conn: &mut PooledConn| -> std::result::Result<bool, crate::error::DbError> {
        if let Some([take, _]) = bridge {
            for name in names {
                conn.query(take, &[Value::Text(name.clone())])?;
            }
        }
        let params = [
            Value::Bytes(data.to_vec()),
            Value::Time(guard),
            Value::Int(id),
        ];
        conn.execute(write, &params)?;
        conn.batch("COMMIT AND CHAIN")?;
        crate::runtime::pause_point("checkpoint.committed", &q.spec.name);
        let held = !conn.query(relock, &[Value::Int(id)])?.is_empty();
        if let (Some([_, let_go]), Some(slot_lock)) = (bridge, slot_lock) {
            for name in names {
                // Held again by the transaction (if it goes on), then no longer by the session.
                if held {
                    conn.query(slot_lock, &[Value::Text(name.clone())])?;
                }
                conn.query(let_go, &[Value::Text(name.clone())])?;
            }
        }
        Ok(held)
    };
    let held = run(conn).map_err(err)?;
    // Committed: the savepoints, and the handler's SQL before them, are behind it.
    hold.work = false;
    Ok(if held {
        Checkpointed::Held
    } else {
        Checkpointed::Lost
    })
}

/// Modelled in model/row_lock.pml (hand_back).
pub(crate) fn rollback(ctx: &Ctx, hold: RowHold) {
    let mut conn = hold.conn;
    conn.rollback_or_discard();
    free_slots(ctx, &mut conn, hold.slots);
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
