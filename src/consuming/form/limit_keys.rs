//! The slot keys of concurrency limits ([`Table::concurrency_limit`]) in the forms whose
//! rows are held by a session or a process key (advisory lock, row lock): a key of a limit
//! has `max` slots, lock keys named `sqlbroker-limit:<table>:<limit>:<key>#<slot>`, and a row
//! runs holding one slot of each of its keys. Whoever holds a slot is one of at most `max`
//! rows of the key in work, across every session; a crash ends the session and frees it.
//! The lease form counts its leased rows instead (`lease.rs`).
//!
//! [`Table::concurrency_limit`]: crate::Table::concurrency_limit

use crate::dialect::keys::{KeySql, SessionKeys};
use crate::dialect::DbConn;
use crate::error::DbError;
use crate::runtime::limits::slot_prefix;
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
/// (`Some`: taken), trying the slots of a key in turn. `Err((marker, taken))`: the first limit
/// whose key has none free, and the slots taken of the limits before it, which the caller
/// gives back (a process key as it drops, a session's by its unlock). A lifted limit takes
/// none.
///
/// Modelled in model/limits.pml (take_slots).
pub(super) fn take_slots<H>(
    ctx: &Ctx,
    maxes: Option<&[Option<u32>]>,
    limit_keys: &[String],
    mut try_one: impl FnMut(&str) -> Result<Option<H>, DbError>,
) -> Result<Slots<H>, DbError> {
    let Some(maxes) = maxes else {
        return Ok(Ok(Vec::new()));
    };
    let mut held = Vec::with_capacity(limit_keys.len());
    for (i, (key, max)) in limit_keys.iter().zip(maxes).enumerate() {
        let Some(max) = max else { continue };
        let mut got = None;
        for slot in 0..*max {
            let name = format!("{}{slot}", slot_prefix(&ctx.spec().name, i, key));
            if let Some(h) = try_one(&name)? {
                got = Some(h);
                break;
            }
        }
        match got {
            Some(h) => held.push(h),
            None => return Ok(Err((full_marker(i, key), held))),
        }
    }
    Ok(Ok(held))
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
