//! Rate limits' window slots ([`Table::rate_limit`]), taken by every form's claim for each
//! row it takes: a slot of each of the row's keys, free when stamped at least a window ago,
//! stamped with the claim's time in one statement fenced by that condition
//! ([`crate::dialect::flow::RateSql`]). A key has at most `max` slots, and no slot is
//! taken twice within a window, so no window holds more than `max` claims of a key.
//!
//! [`Table::rate_limit`]: crate::Table::rate_limit

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::dialect::flow::RateSql;
use crate::dialect::DbConn;
use crate::error::DbError;
use crate::model::schedule::millis;
use crate::model::value::Value;
use crate::runtime::limits::Maxes;
use crate::runtime::Ctx;

/// A slot a claim stamped: given back if the row turns out gone.
pub(super) struct Stamp {
    lim: i64,
    key: String,
    slot: i64,
    at: i64,
}

/// The rendered keys of a row's rate limits, one per limit.
pub(super) fn keys(ctx: &Ctx, user: &[Value]) -> Vec<String> {
    ctx.spec()
        .rates
        .iter()
        .map(|r| crate::runtime::flow::slot_key(&r.template.render(user)))
        .collect()
}

/// The mark in a claim's `tried` set of a rate limit's full key. (Starts with a NUL, which no
/// lock key holds.)
fn full_marker(lim: usize, key: &str) -> String {
    format!("\0r{lim}:{key}")
}

/// True if a claim found key `key` of rate limit `lim` (its place) full.
pub(super) fn marked_full(tried: &HashSet<String>, lim: usize, key: &str) -> bool {
    tried.contains(&full_marker(lim, key))
}

/// True if a claim found one of `keys` full earlier: the row is passed by.
pub(super) fn passed_by(tried: &HashSet<String>, keys: &[String]) -> bool {
    keys.iter()
        .enumerate()
        .any(|(i, k)| tried.contains(&full_marker(i, k)))
}

/// The rate limits' maxes in force (`None`: lifted), read from the table's record on `conn`
/// once per claim, so an operator's change ([`Broker::set_rate_limit`]) is followed by the
/// next claim. Empty for a table without rate limits.
///
/// [`Broker::set_rate_limit`]: crate::Broker::set_rate_limit
pub(super) fn maxes(ctx: &Ctx, conn: &mut dyn DbConn) -> Result<Maxes, DbError> {
    let q = &ctx.queue;
    if q.spec.rates.is_empty() {
        return Ok(Maxes::from([]));
    }
    q.flow
        .rate_maxes
        .read(&q.spec, conn, q.dialect.registry().limits)
}

/// Takes a slot of each rate limit for a row of `keys` (from [`keys`]) now, on `conn`, with
/// the `maxes` in force (from [`maxes`]): the slots stamped, or `None` if a limit's key is
/// full. A full key is marked in the claim's `tried` set (its later rows are passed by,
/// [`passed_by`]), the slots stamped for the limits before it are given back, and the moment
/// its window has room is noted
/// ([`FlowState::full_until`](crate::runtime::flow::FlowState::full_until)).
pub(super) fn take(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    keys: &[String],
    maxes: &[Option<u32>],
    tried: &mut HashSet<String>,
) -> Result<Option<Vec<Stamp>>, DbError> {
    let Some(sql) = &ctx.queue.sql.rates else {
        return Ok(Some(Vec::new()));
    };
    let at = millis(SystemTime::now());
    let mut stamps = Vec::with_capacity(keys.len());
    let spec = ctx.spec();
    // The limits in the order of what they are, not of their place in the description: two
    // services that list them otherwise take their slots in one order, so their claims never
    // wait on each other in a circle (a deadlock's second the server takes to see it would
    // come between a stamp and its claim's commit).
    let mut order: Vec<usize> = (0..spec.rates.len()).collect();
    order.sort_by_key(|i| spec.rates[*i].lim);
    for i in order {
        let (Some(rate), Some(key), Some(max)) = (spec.rates.get(i), keys.get(i), maxes.get(i))
        else {
            continue;
        };
        // Lifted: no slot.
        let Some(max) = *max else { continue };
        match take_one(sql, conn, rate.lim, key, max, rate.per_ms, at)? {
            Ok(slot) => stamps.push(Stamp {
                lim: rate.lim,
                key: key.clone(),
                slot,
                at,
            }),
            Err(room_at) => {
                give_back(ctx, conn, &stamps)?;
                let room = UNIX_EPOCH + Duration::from_millis(room_at.max(0) as u64);
                ctx.queue.flow.full_until(room);
                tried.insert(full_marker(i, key));
                return Ok(None);
            }
        }
    }
    Ok(Some(stamps))
}

/// How long before its claim commits a stamp may have been written: older, it is written again
/// ([`refresh`]) just before the commit (lease form) or the row's take (the others).
pub(super) const STAMP_FRESH: Duration = Duration::from_millis(20);

/// Stamps again, with the time now, each of `stamps` written more than [`STAMP_FRESH`] ago (a
/// claim that waited on a lock, a deadlock's detection, a slow statement): a window counts a
/// claim from its stamp, so a stamp long before the claim's commit would let the window that
/// follows hold another claim before the one after the commit should. False if a slot no
/// longer holds its stamp (a window passed while the claim ran, and another claim took it):
/// the row must not be taken.
pub(super) fn refresh(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    stamps: &mut [Stamp],
) -> Result<bool, DbError> {
    let Some(sql) = &ctx.queue.sql.rates else {
        return Ok(true);
    };
    let now = millis(SystemTime::now());
    for s in stamps.iter_mut() {
        if now - s.at <= STAMP_FRESH.as_millis() as i64 {
            continue;
        }
        let params = [
            Value::Int(now),
            Value::Int(s.lim),
            Value::Text(s.key.clone()),
            Value::Int(s.slot),
            Value::Int(s.at),
        ];
        if conn.execute(&sql.restamp, &params)? == 0 {
            return Ok(false);
        }
        s.at = now;
    }
    Ok(true)
}

/// Takes a free slot of limit `lim`'s `key`, or makes one if the key has fewer than `max`:
/// the slot, or (`Err`) the milliseconds at which the key's oldest stamp leaves the window.
fn take_one(
    sql: &RateSql,
    conn: &mut dyn DbConn,
    lim: i64,
    key: &str,
    max: u32,
    per_ms: i64,
    at: i64,
) -> Result<Result<i64, i64>, DbError> {
    let free_before = at - per_ms;
    let (lim_v, key_v, max_v) = (
        Value::Int(lim),
        Value::Text(key.into()),
        Value::Int(max.into()),
    );
    // A few tries: a slot picked may be stamped by another claim before this one stamps it.
    for _ in 0..3 {
        let picked = conn.query(
            &sql.pick,
            &[
                lim_v.clone(),
                key_v.clone(),
                Value::Int(free_before),
                max_v.clone(),
            ],
        )?;
        if let Some(slot) = picked
            .first()
            .and_then(|r| r.first())
            .and_then(Value::as_i64)
        {
            let params = [
                Value::Int(at),
                lim_v.clone(),
                key_v.clone(),
                Value::Int(slot),
                Value::Int(free_before),
            ];
            if conn.execute(&sql.stamp, &params)? > 0 {
                return Ok(Ok(slot));
            }
            continue;
        }
        let usage = conn.query(&sql.usage, &[lim_v.clone(), key_v.clone(), max_v.clone()])?;
        let row = usage.first();
        let count = row
            .and_then(|r| r.first())
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if count >= i64::from(max) {
            let oldest = row
                .and_then(|r| r.get(1))
                .and_then(Value::as_i64)
                .unwrap_or(at);
            return Ok(Err(oldest.saturating_add(per_ms)));
        }
        // Fewer slots than `max`, none free: a new one, the first number missing.
        let have = conn.query(&sql.slots, &[lim_v.clone(), key_v.clone(), max_v.clone()])?;
        let mut slot = 0;
        for n in have
            .iter()
            .filter_map(|r| r.first().and_then(Value::as_i64))
        {
            if n != slot {
                break;
            }
            slot += 1;
        }
        if slot >= i64::from(max) {
            // Made meanwhile by other claims: all `max` exist now.
            continue;
        }
        let params = [
            lim_v.clone(),
            key_v.clone(),
            Value::Int(slot),
            Value::Int(at),
        ];
        if conn.execute(&sql.insert, &params)? > 0 {
            return Ok(Ok(slot));
        }
    }
    // Contended: the next claim tries again.
    Ok(Err(at))
}

/// Gives back slots a claim stamped for a row it did not take (each still holding its stamp).
pub(super) fn give_back(ctx: &Ctx, conn: &mut dyn DbConn, stamps: &[Stamp]) -> Result<(), DbError> {
    let Some(sql) = &ctx.queue.sql.rates else {
        return Ok(());
    };
    for s in stamps {
        let params = [
            Value::Int(s.lim),
            Value::Text(s.key.clone()),
            Value::Int(s.slot),
            Value::Int(s.at),
        ];
        conn.execute(&sql.free, &params)?;
    }
    Ok(())
}

/// Deletes the free slots of the table's rate limits, once a minute per broker (a failure is
/// logged: the next sweep tries again), and any slot a day old. A key's slots are made again as
/// claims need them: the table holds at most `max` rows per key claimed within its window,
/// whatever the rate of claims.
pub(super) fn sweep(ctx: &Ctx, conn: &mut dyn DbConn) {
    let Some(sql) = &ctx.queue.sql.rates else {
        return;
    };
    if !ctx.queue.flow.sweep_due() {
        return;
    }
    let now = millis(SystemTime::now());
    for rate in &ctx.spec().rates {
        let params = [Value::Int(rate.lim), Value::Int(now - rate.per_ms)];
        if let Err(e) = conn.execute(&sql.sweep, &params) {
            log::debug!("table {}: sweeping rate slots: {e}", ctx.spec().name);
            return;
        }
    }
    // Any slot free for the longest window there is, whatever limit it was of: a limit no
    // longer described (or named by an earlier release) keeps no rows.
    let longest = crate::model::table::Table::MAX_RATE_WINDOW.as_millis() as i64;
    if let Err(e) = conn.execute(&sql.sweep_any, &[Value::Int(now - longest)]) {
        log::debug!("table {}: sweeping rate slots: {e}", ctx.spec().name);
    }
}
