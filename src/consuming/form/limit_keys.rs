//! The slot keys of concurrency limits ([`Table::concurrency_limit`]) in the forms whose
//! rows are held by a session or a process key (advisory lock, row lock): a key of a limit
//! has `max` slots, lock keys named `sqlbroker-limit:<table>:<limit>:<key>#<slot>` (`<limit>` a
//! hash of the limit's template, [`LimitSpec::id_of`](crate::model::table::LimitSpec::id_of)),
//! and a row runs holding one slot of each of its keys. Whoever holds a slot is one of at most `max`
//! rows of the key in work, across every session; a crash ends the session and frees it.
//! The lease form counts its leased rows instead (`lease.rs`).
//!
//! [`Table::concurrency_limit`]: crate::Table::concurrency_limit

use crate::dialect::keys::{KeySql, SessionKeys};
use crate::dialect::DbConn;
use crate::error::DbError;
use crate::runtime::limits::{slot_prefix, Read};
use crate::runtime::Ctx;

/// The key statements of a table whose rows or slots are held by server sessions.
pub(super) fn key_sql(ctx: &Ctx) -> Option<KeySql<'_>> {
    let sql = &ctx.queue.sql;
    Some(KeySql {
        lock: sql.key_lock.as_deref()?,
        unlock: sql.key_unlock.as_deref()?,
    })
}

/// The mark in a claim's `tried` set of a concurrency limit's key with no free slot: every
/// later row of that key is passed by. (Starts with a NUL, which no lock key holds.)
fn full_marker(limit: usize, key: &str) -> String {
    format!("\0{limit}:{key}")
}

/// True if a claim marked key `key` of limit `limit` full ([`full_marker`]).
pub(super) fn marked_full(
    tried: &std::collections::HashSet<String>,
    limit: usize,
    key: &str,
) -> bool {
    tried.contains(&full_marker(limit, key))
}

/// True if a claim marked one of `limit_keys` full earlier ([`full_marker`]): the row is
/// passed by.
pub(super) fn passed_by(tried: &std::collections::HashSet<String>, limit_keys: &[String]) -> bool {
    limit_keys
        .iter()
        .enumerate()
        .any(|(i, k)| tried.contains(&full_marker(i, k)))
}

/// The slots a row took (`Ok`), or the mark of the full key and the slots taken before it.
pub(super) type Slots<H> = Result<Vec<H>, (String, Vec<H>)>;

/// Takes one free slot of each concurrency limit for a row of `limit_keys` with `try_one`
/// (`Some`: taken). `Err((marker, taken))`: the first limit whose key has no room, and the slots
/// taken before it and of it, which the caller gives back (a process key as it drops, a
/// session's by its unlock).
///
/// A key's slots are `0..max` (a lifted limit's: `0..`[`Table::MAX_CONCURRENCY`]), tried from a
/// point chosen at random so that claims side by side do not all ask for the same first slots;
/// no two rows hold one slot, so at most `max` rows holding slots below the max are in work.
/// Where the limit's slot space reaches past its max (the max was lowered, or set after a lift:
/// rows in work may hold slots above it), a claim also counts the slots held above the max
/// (`held_in(prefix, from, to)`, after taking its own): none, and the key is noted clean until
/// the record changes (once the broker has known the record [`CLAIM_STALE`]: no claim takes a
/// slot by a reading of the record older than that, this one included); some, and the claim counts every slot held of the key, its own
/// included, and gives its slot back if they are more than the max. Of two claims that count,
/// the later sees the earlier's slot: never more than `max`. The slots are counted on `conn`
/// (the session that took them, whose own are counted with the others'), as operators' counts
/// are ([`Dialect::slots_held`](crate::dialect::Dialect::slots_held)).
///
/// [`Table::MAX_CONCURRENCY`]: crate::Table::MAX_CONCURRENCY
/// [`CLAIM_STALE`]: crate::runtime::limits::CLAIM_STALE
///
/// Modelled in model/limits.pml (take_slots).
pub(super) fn take_slots<H>(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    limits: Option<&mut Read>,
    limit_keys: &[String],
    mut try_one: impl FnMut(&mut dyn DbConn, &str) -> Result<Option<H>, DbError>,
) -> Result<Slots<H>, DbError> {
    let held_in = |conn: &mut dyn DbConn, prefix: &str, from: u32, to: u32| {
        let held = ctx
            .queue
            .dialect
            .slots_held(conn, &[prefix.to_string()], from, to)?;
        Ok::<u32, DbError>(held.first().copied().unwrap_or(0))
    };
    let Some(limits) = limits else {
        return Ok(Ok(Vec::new()));
    };
    let spec = ctx.spec();
    let in_force = &ctx.queue.limits;
    if limits.stale() {
        // A claim long under way takes no slot by a record read long ago.
        *limits = in_force.read_with_slots(spec, conn, ctx.queue.dialect.registry().limits)?;
    }
    let limits: &Read = limits;
    let mut held = Vec::with_capacity(limit_keys.len());
    for (i, ((limit, key), max)) in spec
        .limits
        .iter()
        .zip(limit_keys)
        .zip(limits.maxes.iter())
        .enumerate()
    {
        let room = max.unwrap_or(crate::model::table::Table::MAX_CONCURRENCY);
        let space = limits.slots.get(i).copied().unwrap_or(room).max(room);
        let prefix = slot_prefix(&spec.name, &limit.id, key);
        let first = random_below(room);
        let mut got = None;
        for slot in (first..room).chain(0..first) {
            if let Some(h) = try_one(&mut *conn, &format!("{prefix}{slot}"))? {
                got = Some(h);
                break;
            }
        }
        let Some(h) = got else {
            return Ok(Err((full_marker(i, key), held)));
        };
        held.push(h);
        if space > room && !in_force.clean(i, key) {
            if held_in(&mut *conn, &prefix, room, space)? == 0 {
                in_force.found_clean(i, key);
            } else if held_in(&mut *conn, &prefix, 0, space)? > room {
                return Ok(Err((full_marker(i, key), held)));
            }
        }
    }
    Ok(Ok(held))
}

/// A number below `n` (at least 1), different from call to call: where a claim starts trying a
/// key's slots.
fn random_below(n: u32) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    // Each `RandomState` is keyed afresh (per thread, then stepped per call).
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (r % u64::from(n.max(1))) as u32
}

/// Unlocks `names` on the claim's session, the last taken first; false (after a warning) if the
/// session may still hold one: it stays marked broken, is discarded, and the claim ends.
///
/// Modelled in model/advisory.pml (take_missed, settle), model/limits.pml (take_slots, settle).
pub(super) fn unlock_all(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    keys: &mut SessionKeys,
    names: &[String],
) -> bool {
    let Some(sql) = key_sql(ctx) else {
        return false;
    };
    for name in names.iter().rev() {
        if !keys.unlock(conn, &sql, name) {
            log::warn!(
                "table {}: unlocking key {name:?} failed; discarding the session",
                ctx.spec().name
            );
            return false;
        }
    }
    true
}
