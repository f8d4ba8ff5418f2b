//! Rate limits' window slots ([`Table::rate_limit`]), taken by every form's claim for each
//! row it takes: a slot of each of the row's keys, free when stamped at least a window ago,
//! stamped with the claim's time in one statement fenced by that condition
//! ([`crate::dialect::flow::RateSql`]). A key has at most `max` slots, and no slot is
//! taken twice within a window, so no window holds more than `max` claims of a key.
//!
//! [`Table::rate_limit`]: crate::Table::rate_limit

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::dialect::flow::{RateSql, IN_LIST_POW};
use crate::dialect::DbConn;
use crate::error::{DbError, DbErrorKind};
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

/// Slots a claim stamped ahead for rows it has not chosen yet, per limit (its place) and key:
/// a claim taking several rows of a key takes their slots in one go ([`take_pooled`]), and
/// gives back what is left when it ends ([`Pool::give_back`]).
#[derive(Default)]
pub(super) struct Pool {
    spare: HashMap<(usize, String), Vec<Stamp>>,
    /// True if a key short of free slots gets them made by the take itself (a caller that
    /// holds no other locks); false: passed by, made by [`top_up`] before the next claim.
    make: bool,
}

impl Pool {
    /// A pool whose takes make the slots a key lacks themselves.
    fn making() -> Self {
        Pool {
            make: true,
            ..Pool::default()
        }
    }

    /// Gives back every slot left in the pool (each still holding its stamp).
    pub(super) fn give_back(&mut self, ctx: &Ctx, conn: &mut dyn DbConn) -> Result<(), DbError> {
        let left: Vec<Stamp> = self.spare.drain().flat_map(|(_, v)| v).collect();
        give_back(ctx, conn, &left)
    }
}

/// Takes a slot of each rate limit for a row of `keys` (from [`keys`]) now, on `conn`, with
/// the `maxes` in force (from [`maxes`]): the slots stamped, or `None` if a limit's key is
/// full. A full key is marked in the claim's `tried` set (its later rows are passed by,
/// [`passed_by`]), the slots stamped for the limits before it are given back, and the moment
/// its window has room is noted
/// ([`FlowState::full_until`](crate::runtime::flow::FlowState::full_until)). One slot a limit:
/// safe outside a transaction.
pub(super) fn take(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    keys: &[String],
    maxes: &[Option<u32>],
    tried: &mut HashSet<String>,
) -> Result<Option<Vec<Stamp>>, DbError> {
    let mut pool = Pool::making();
    let out = take_pooled(ctx, conn, keys, maxes, tried, &mut pool, &|_, _| 1);
    pool.give_back(ctx, conn)?;
    out
}

/// [`take`] for a claim taking several rows in one transaction (the lease form): a slot comes
/// from `pool` where it holds one of the key's, else `want(limit's place, key)` slots are
/// taken at once (the rows of the key the claim has in view), one for this row and the rest
/// kept in `pool`; a full key's slots stamped for the limits before it go back to `pool`.
/// Slots stamped several at a time rely on the transaction's locks: call within one. A key
/// with no free slot and fewer than its max gets slots made here if the pool says so
/// ([`Pool::make`]), else is passed by for this claim and its slots are made by [`top_up`]
/// before the broker's next one, which comes at once.
pub(super) fn take_pooled(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    keys: &[String],
    maxes: &[Option<u32>],
    tried: &mut HashSet<String>,
    pool: &mut Pool,
    want: &dyn Fn(usize, &str) -> usize,
) -> Result<Option<Vec<Stamp>>, DbError> {
    let Some(sql) = &ctx.queue.sql.rates else {
        return Ok(Some(Vec::new()));
    };
    let at = millis(SystemTime::now());
    let mut stamps: Vec<(usize, Stamp)> = Vec::with_capacity(keys.len());
    let spec = ctx.spec();
    for i in in_lim_order(spec) {
        let (Some(rate), Some(key), Some(max)) = (spec.rates.get(i), keys.get(i), maxes.get(i))
        else {
            continue;
        };
        // Lifted: no slot.
        let Some(max) = *max else { continue };
        let spare = pool.spare.entry((i, key.clone())).or_default();
        if let Some(s) = spare.pop() {
            stamps.push((i, s));
            continue;
        }
        let n = want(i, key).clamp(1, 1 << IN_LIST_POW);
        let slots = Slots {
            sql,
            lim: rate.lim,
            key,
            max,
        };
        let room_at = match slots.take(conn, rate.per_ms, at, n, pool.make)? {
            Took::Slots(slots) => {
                let mut it = slots.into_iter().map(|slot| Stamp {
                    lim: rate.lim,
                    key: key.clone(),
                    slot,
                    at,
                });
                stamps.extend(it.next().map(|s| (i, s)));
                spare.extend(it);
                continue;
            }
            Took::Full(room_at) => room_at,
            Took::Short => {
                // Made before this broker's next claim, which comes at once.
                ctx.queue.flow.rate_need(rate.lim, key, max, n);
                at
            }
        };
        for (j, s) in stamps {
            pool.spare.entry((j, s.key.clone())).or_default().push(s);
        }
        let room = UNIX_EPOCH + Duration::from_millis(room_at.max(0) as u64);
        ctx.queue.flow.full_until(room);
        tried.insert(full_marker(i, key));
        return Ok(None);
    }
    Ok(Some(stamps.into_iter().map(|(_, s)| s).collect()))
}

/// The places of the table's rate limits in the order of what they are, not of their place in
/// the description: two services that list them otherwise take their slots in one order, so
/// their claims never wait on each other in a circle (a deadlock's second the server takes to
/// see it would come between a stamp and its claim's commit).
fn in_lim_order(spec: &crate::model::table::TableSpec) -> Vec<usize> {
    let mut order: Vec<usize> = (0..spec.rates.len()).collect();
    order.sort_by_key(|i| spec.rates[*i].lim);
    order
}

/// Fills `pool` ahead of a claim's rows (PostgreSQL: one statement per limit for every key):
/// `wants` the rows of each limit's key in view (the limit's place, the key, how many). Keys
/// the pool already holds slots of, or the claim found full, are left out; a key that gets
/// fewer than it wants takes the rest as its rows come ([`take_pooled`]: free, full or
/// short). Elsewhere: nothing (each key's first row takes its slots then).
pub(super) fn prefill(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    maxes: &[Option<u32>],
    tried: &HashSet<String>,
    pool: &mut Pool,
    wants: &[(usize, &str, usize)],
) -> Result<(), DbError> {
    let Some(sql) = &ctx.queue.sql.rates else {
        return Ok(());
    };
    let Some(take) = &sql.take_keys else {
        return Ok(());
    };
    let spec = ctx.spec();
    let at = millis(SystemTime::now());
    for i in in_lim_order(spec) {
        let (Some(rate), Some(Some(max))) = (spec.rates.get(i), maxes.get(i)) else {
            continue;
        };
        let asked: Vec<(&str, usize)> = wants
            .iter()
            .filter(|(j, key, n)| {
                *j == i
                    && *n > 0
                    && !tried.contains(&full_marker(i, key))
                    && pool
                        .spare
                        .get(&(i, key.to_string()))
                        .is_none_or(Vec::is_empty)
            })
            .map(|(_, key, n)| (*key, (*n).min(1 << IN_LIST_POW)))
            .collect();
        if asked.is_empty() {
            continue;
        }
        let keys = text_array(asked.iter().map(|(k, _)| *k));
        let counts = format!(
            "{{{}}}",
            asked
                .iter()
                .map(|(_, n)| n.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        let params = [
            Value::Int(at),
            Value::Int(rate.lim),
            Value::Text(keys),
            Value::Text(counts),
            Value::Int(at - rate.per_ms),
            Value::Int(i64::from(*max)),
        ];
        for row in conn.query(take, &params)? {
            let (Some(key), Some(slot)) = (
                row.first().and_then(Value::as_str),
                row.get(1).and_then(Value::as_i64),
            ) else {
                continue;
            };
            pool.spare
                .entry((i, key.to_string()))
                .or_default()
                .push(Stamp {
                    lim: rate.lim,
                    key: key.to_string(),
                    slot,
                    at,
                });
        }
    }
    Ok(())
}

/// PostgreSQL's array literal of `items`, each quoted (`"`, `\` escaped).
fn text_array<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let quoted: Vec<String> = items
        .map(|s| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("{{{}}}", quoted.join(","))
}

/// How long before its claim commits a stamp may have been written: older, it is written again
/// ([`refresh`]) just before the commit (lease form) or the row's take (the others).
pub(super) const STAMP_FRESH: Duration = Duration::from_millis(20);

/// Stamps again, with the time now, each of `stamps` written more than [`STAMP_FRESH`] ago (a
/// claim that waited on a lock, a deadlock's detection, a slow statement): a window counts a
/// claim from its stamp, so a stamp long before the claim's commit would let the window that
/// follows hold another claim before the one after the commit should. False if a slot no
/// longer holds its stamp (a window passed while the claim ran, and another claim took it):
/// the rows must not be taken. Stamps of one key and time go in one statement; where they are
/// several, the claim's transaction holds them (a slot lost is then an error, the claim rolled
/// back).
pub(super) fn refresh(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    stamps: &mut [Stamp],
) -> Result<bool, DbError> {
    let Some(sql) = &ctx.queue.sql.rates else {
        return Ok(true);
    };
    let now = millis(SystemTime::now());
    let stale = |s: &Stamp| now - s.at > STAMP_FRESH.as_millis() as i64;
    let mut groups: HashMap<(i64, String, i64), Vec<i64>> = HashMap::new();
    for s in stamps.iter().filter(|s| stale(s)) {
        groups
            .entry((s.lim, s.key.clone(), s.at))
            .or_default()
            .push(s.slot);
    }
    for ((lim, key, at), slots) in groups {
        let key = key.as_str();
        let head = [
            Value::Int(now),
            Value::Int(lim),
            Value::Text(key.to_string()),
            Value::Int(at),
        ];
        let done = in_lists(conn, &sql.restamp_in, &head, &slots)?;
        if done < slots.len() as u64 {
            if slots.len() == 1 {
                return Ok(false);
            }
            return Err(DbError::new(
                DbErrorKind::Transient,
                "rate slots this claim held changed before its commit",
            ));
        }
        for s in stamps.iter_mut() {
            if (s.lim, s.key.as_str(), s.at) == (lim, key, at) && slots.contains(&s.slot) {
                s.at = now;
            }
        }
    }
    Ok(true)
}

/// After a row's take that ran apart from its slots' stamps (the advisory form): stamps
/// again, with a time read after the take, each stamp written more than [`STAMP_FRESH`]
/// before it, so a window counts the claim from no earlier than its take (a take that waited
/// on a lock or the one writer would otherwise be counted from before the wait, and the slot
/// be free again too early). False if a slot no longer holds its stamp: another claim took
/// it, its stamp having looked a window old, and this row must be handed back unworked.
pub(super) fn confirm(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    stamps: &mut [Stamp],
) -> Result<bool, DbError> {
    refresh(ctx, conn, stamps)
}

/// Runs `texts` (statements listing `2^k` slots after the parameters `head`) over `slots` in
/// parts, each padded to its statement's length by repeating its last slot: the rows changed.
fn in_lists(
    conn: &mut dyn DbConn,
    texts: &[String],
    head: &[Value],
    slots: &[i64],
) -> Result<u64, DbError> {
    let mut slots = slots.to_vec();
    slots.sort_unstable();
    slots.dedup();
    let mut changed = 0;
    for part in slots.chunks(1 << IN_LIST_POW) {
        let k = part.len().next_power_of_two().trailing_zeros() as usize;
        let mut params = head.to_vec();
        params.extend((0..1usize << k).map(|i| Value::Int(part[i.min(part.len() - 1)])));
        changed += conn.execute(&texts[k], &params)?;
    }
    Ok(changed)
}

/// One limit's key's slots, as a claim takes them.
struct Slots<'a> {
    sql: &'a RateSql,
    lim: i64,
    key: &'a str,
    max: u32,
}

/// What a claim found of a key's slots.
enum Took {
    /// The slots stamped (at least one).
    Slots(Vec<i64>),
    /// The key has `max` slots, none free: its window has room at these milliseconds.
    Full(i64),
    /// None free, and fewer than `max` made: slots to make outside the claim's transaction
    /// ([`top_up`]).
    Short,
}

impl Slots<'_> {
    fn key_params(&self) -> [Value; 2] {
        [Value::Int(self.lim), Value::Text(self.key.into())]
    }

    /// Takes up to `n` of the key's oldest free slots, stamped `at`. Where none is free and
    /// the key has fewer than `max`, `make` says whether to make `n` (free) here and take
    /// them (a caller outside a transaction holding other locks) or to report the key
    /// [`Took::Short`].
    fn take(
        &self,
        conn: &mut dyn DbConn,
        per_ms: i64,
        at: i64,
        n: usize,
        make: bool,
    ) -> Result<Took, DbError> {
        let free_before = at - per_ms;
        // A few tries: slots picked or made may be taken by another claim first.
        for _ in 0..3 {
            let got = self.oldest_free(conn, at, free_before, n)?;
            if !got.is_empty() {
                return Ok(Took::Slots(got));
            }
            match self.room(conn, per_ms, at)? {
                Some(room_at) => return Ok(Took::Full(room_at)),
                None if !make => return Ok(Took::Short),
                None => self.make_free(conn, n)?,
            }
        }
        // Contended: the next claim tries again.
        Ok(Took::Full(at))
    }

    /// `None` if the key has fewer than `max` slots; else when its oldest stamp leaves the
    /// window (its slots numbered without gaps, the highest says how many; a count only once
    /// it reaches `max`).
    fn room(&self, conn: &mut dyn DbConn, per_ms: i64, at: i64) -> Result<Option<i64>, DbError> {
        let [lim, key] = self.key_params();
        let max = Value::Int(self.max.into());
        if self.top(conn)? + 1 < i64::from(self.max) {
            return Ok(None);
        }
        let usage = conn.query(&self.sql.usage, &[lim, key, max])?;
        let row = usage.first();
        let count = row
            .and_then(|r| r.first())
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if count < i64::from(self.max) {
            return Ok(None);
        }
        let oldest = row
            .and_then(|r| r.get(1))
            .and_then(Value::as_i64)
            .unwrap_or(at);
        Ok(Some(oldest.saturating_add(per_ms)))
    }

    /// The key's highest slot below `max` (-1: none).
    fn top(&self, conn: &mut dyn DbConn) -> Result<i64, DbError> {
        let [lim, key] = self.key_params();
        Ok(conn
            .query(&self.sql.top, &[lim, key, Value::Int(self.max.into())])?
            .first()
            .and_then(|r| r.first())
            .and_then(Value::as_i64)
            .unwrap_or(-1))
    }

    /// Makes up to `n` free slots: the numbers above the highest, or (all up to `max` made
    /// once; a slot deleted by an earlier release's sweep) the first ones missing.
    fn make_free(&self, conn: &mut dyn DbConn, n: usize) -> Result<(), DbError> {
        let [lim, key] = self.key_params();
        let max = i64::from(self.max);
        let top = self.top(conn)?;
        if top + 1 < max {
            let to = (top + n as i64).min(max - 1);
            let params = [lim, key, Value::Int(top + 1), Value::Int(to)];
            conn.execute(&self.sql.make_free, &params)?;
            return Ok(());
        }
        let have = conn.query(
            &self.sql.slots,
            &[lim.clone(), key.clone(), Value::Int(max)],
        )?;
        let have: HashSet<i64> = have
            .iter()
            .filter_map(|r| r.first().and_then(Value::as_i64))
            .collect();
        for slot in (0..max).filter(|s| !have.contains(s)).take(n) {
            let params = [lim.clone(), key.clone(), Value::Int(slot), Value::Int(0)];
            conn.execute(&self.sql.insert, &params)?;
        }
        Ok(())
    }

    /// Stamps up to `n` of the key's free slots, the oldest first.
    fn oldest_free(
        &self,
        conn: &mut dyn DbConn,
        at: i64,
        free_before: i64,
        n: usize,
    ) -> Result<Vec<i64>, DbError> {
        let [lim, key] = self.key_params();
        let (max, n_v) = (Value::Int(self.max.into()), Value::Int(n as i64));
        let slots = |rows: Vec<Vec<Value>>| -> Vec<i64> {
            rows.iter()
                .filter_map(|r| r.first().and_then(Value::as_i64))
                .collect()
        };
        if let Some(take) = &self.sql.take_oldest {
            let params = [Value::Int(at), lim, key, Value::Int(free_before), max, n_v];
            return Ok(slots(conn.query(take, &params)?));
        }
        let params = [lim.clone(), key.clone(), Value::Int(free_before), max, n_v];
        let picked = slots(conn.query(&self.sql.pick, &params)?);
        if picked.is_empty() {
            return Ok(picked);
        }
        let head = [Value::Int(at), lim, key, Value::Int(free_before)];
        if picked.len() == 1 {
            // Alone, fenced by its freedom: safe outside a transaction too.
            let done = in_lists(conn, &self.sql.stamp_in, &head, &picked)?;
            return Ok(if done == 1 { picked } else { Vec::new() });
        }
        // Several: locked by the pick until the claim's transaction ends.
        if in_lists(conn, &self.sql.stamp_in, &head, &picked)? < picked.len() as u64 {
            return Err(DbError::new(
                DbErrorKind::Transient,
                "rate slots this claim locked changed before it stamped them",
            ));
        }
        Ok(picked)
    }
}

/// Makes the free slots claims of this broker found missing ([`Took::Short`]), on `conn`
/// before a claim begins its own transaction, in one transaction of their own (`begin`, one
/// commit for every key): keys in one order, so two makers wait on each other only until the
/// first commits and never in a circle, and no claim waits on them (claims only stamp slots
/// they find committed and free, passing by locked ones). A failure is logged: the next
/// claim finds the key short again.
pub(super) fn top_up<S: AsRef<str>>(ctx: &Ctx, conn: &mut dyn DbConn, begin: &[S]) {
    let Some(sql) = &ctx.queue.sql.rates else {
        return;
    };
    let needs = ctx.queue.flow.rate_needs();
    if needs.is_empty() {
        return;
    }
    let made = crate::dialect::in_transaction(conn, begin, |conn| {
        for ((lim, key), (max, n)) in &needs {
            let slots = Slots {
                sql,
                lim: *lim,
                key,
                max: *max,
            };
            slots.make_free(conn, (*n).max(TOP_UP_MIN))?;
        }
        Ok(())
    });
    if let Err(e) = made {
        log::debug!("table {}: making rate slots: {e}", ctx.spec().name);
    }
}

/// The fewest free slots [`top_up`] makes for a key at once.
const TOP_UP_MIN: usize = 128;

/// Gives back slots a claim stamped for rows it did not take (each still holding its stamp),
/// those of one key and time in one statement.
pub(super) fn give_back(ctx: &Ctx, conn: &mut dyn DbConn, stamps: &[Stamp]) -> Result<(), DbError> {
    let Some(sql) = &ctx.queue.sql.rates else {
        return Ok(());
    };
    let mut groups: HashMap<(i64, &str, i64), Vec<i64>> = HashMap::new();
    for s in stamps {
        groups
            .entry((s.lim, s.key.as_str(), s.at))
            .or_default()
            .push(s.slot);
    }
    for ((lim, key, at), slots) in groups {
        let head = [
            Value::Int(lim),
            Value::Text(key.to_string()),
            Value::Int(at),
        ];
        in_lists(conn, &sql.free_in, &head, &slots)?;
    }
    Ok(())
}

/// Deletes the slots of the table's rate limits' idle keys (every slot free), once a minute per
/// broker (a failure is logged: the next sweep tries again), and any slot a day old. A key's
/// slots are made again as claims need them: the table holds at most `max` rows per key, and
/// none for a key not claimed within its window, whatever the rate of claims. A busy key's
/// slots stay: numbered without gaps, a new one takes the number above the highest.
pub(super) fn sweep(ctx: &Ctx, conn: &mut dyn DbConn) {
    let Some(sql) = &ctx.queue.sql.rates else {
        return;
    };
    if !ctx.queue.flow.sweep_due() {
        return;
    }
    let now = millis(SystemTime::now());
    for rate in &ctx.spec().rates {
        let before = Value::Int(now - rate.per_ms);
        let params = [
            Value::Int(rate.lim),
            before.clone(),
            Value::Int(rate.lim),
            before,
        ];
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
