//! Operators' counts of flow control, read now without a claim's turn and taking nothing: each
//! concurrency limit's rows in work and the ready rows waiting on it, each rate limit's claims
//! in its window and the ready rows waiting on a full window, and the ready rows some limit
//! holds back ([`QueueStats::limited`]).
//!
//! Rows in work are counted where they are held: the lease form marks them in the table; the
//! row lock and advisory lock forms hold a slot key of each limit in a session (or, SQLite,
//! in the process), probed here by name. Those forms do not tell a row in work from a ready
//! one in the table (their `ready` counts both), so a rate limit's waiting rows include the
//! rows of its full keys in work.
//!
//! [`QueueStats::limited`]: crate::QueueStats::limited

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use crate::dialect::DbConn;
use crate::error::DbError;
use crate::model::schedule::{claim_now, millis};
use crate::model::table::Form;
use crate::model::value::Value;
use crate::runtime::flow::slot_key;
use crate::runtime::limits::{slot_prefix, InWork, Maxes};
use crate::runtime::Queue;

/// How much of each limit is used now, and what waits on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Per concurrency limit, in the description's order: rows in work (every key; a lifted
    /// limit's rows in the row lock and advisory lock forms hold slots too), and ready rows
    /// whose key is at the limit's max.
    pub limits: Vec<(Option<u64>, u64)>,
    /// Per rate limit: the claims in the window ending now (every key), and the ready rows
    /// whose key's window is full.
    pub rates: Vec<(u64, u64)>,
    /// Ready rows held back by at least one limit.
    pub held_back: u64,
}

/// The claimable rows per distinct value of the columns the limits read, as full user rows
/// (the other columns `NULL`), with their count.
fn ready_groups(
    q: &Queue,
    sql: &str,
    conn: &mut dyn DbConn,
    now: SystemTime,
) -> Result<Vec<(Vec<Value>, u64)>, DbError> {
    let spec = &q.spec;
    let cols = spec.flow_columns();
    let times = if spec.form == Form::Lease { 2 } else { 1 };
    let rows = conn.query(sql, &vec![Value::Time(now); times])?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let count = row.last().and_then(Value::as_i64).unwrap_or(0).max(0) as u64;
            let mut user = vec![Value::Null; spec.columns.len()];
            for (v, i) in row.iter().zip(&cols) {
                if let Some(slot) = user.get_mut(*i) {
                    *slot = v.clone();
                }
            }
            (spec.typed_values(user), count)
        })
        .collect())
}

/// The usage of a table's limits, with `limit_maxes` and `rate_maxes` in force (the
/// description's order). All zeros for a table without limits.
pub(crate) fn usage(
    q: &Queue,
    conn: &mut dyn DbConn,
    limit_maxes: &[Option<u32>],
    rate_maxes: &[Option<u32>],
) -> Result<Usage, DbError> {
    let spec = &q.spec;
    let wall = SystemTime::now();
    let now = claim_now(wall);
    let Some(ready_sql) = &q.sql.flow_ready else {
        return Ok(Usage::default());
    };
    let groups = ready_groups(q, ready_sql, conn, now)?;
    let limit_keys: Vec<Vec<String>> = groups.iter().map(|(u, _)| InWork::keys(spec, u)).collect();
    let work = in_work(q, conn, now, limit_maxes, &limit_keys)?;
    let rates = rate_windows(q, conn, wall, rate_maxes)?;

    let mut out = Usage {
        limits: work.totals.clone(),
        rates: rates.iter().map(|r| (r.claimed, 0)).collect(),
        held_back: 0,
    };
    // Per limit and key: the ready rows (in the session forms, those in work too).
    let mut ready: Vec<HashMap<&str, u64>> = vec![HashMap::new(); spec.limits.len()];
    for ((user, count), keys) in groups.iter().zip(&limit_keys) {
        let mut held = false;
        for (i, key) in keys.iter().enumerate() {
            *ready[i].entry(key.as_str()).or_insert(0) += count;
            held |= work.full(i, key);
        }
        for (r, (spec_r, window)) in spec.rates.iter().zip(&rates).enumerate() {
            if window
                .full
                .contains(&slot_key(&spec_r.template.render(user)))
            {
                out.rates[r].1 += count;
                held = true;
            }
        }
        if held {
            out.held_back += count;
        }
    }
    // The session forms' ready rows of a key include its rows in work.
    let session = spec.form != Form::Lease;
    for (i, per_key) in ready.iter().enumerate() {
        out.limits[i].1 = per_key
            .iter()
            .filter(|(k, _)| work.full(i, k))
            .map(|(k, n)| n.saturating_sub(if session { work.of(i, k) } else { 0 }))
            .sum();
    }
    if session {
        // Those rows in work were counted as held back: take out the most any one limit
        // accounts for (exact with one limit; with several full at once, an estimate).
        let in_full = (0..spec.limits.len())
            .map(|i| {
                ready[i]
                    .keys()
                    .filter(|k| work.full(i, k))
                    .map(|k| work.of(i, k))
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0);
        out.held_back = out.held_back.saturating_sub(in_full);
    }
    Ok(out)
}

/// The concurrency limits' rows in work, per limit and key.
struct Work {
    per_key: Vec<HashMap<String, u64>>,
    maxes: Vec<Option<u32>>,
    totals: Vec<(Option<u64>, u64)>,
}

impl Work {
    fn of(&self, limit: usize, key: &str) -> u64 {
        self.per_key[limit].get(key).copied().unwrap_or(0)
    }

    /// True if `key` of `limit` is at its max in force.
    fn full(&self, limit: usize, key: &str) -> bool {
        self.maxes
            .get(limit)
            .copied()
            .flatten()
            .is_some_and(|m| self.of(limit, key) >= u64::from(m))
    }
}

/// Rows in work per limit and key: the leased rows (lease form), else the slot keys held of
/// each key that has ready rows (`keys`: each group's key per limit).
fn in_work(
    q: &Queue,
    conn: &mut dyn DbConn,
    now: SystemTime,
    maxes: &[Option<u32>],
    keys: &[Vec<String>],
) -> Result<Work, DbError> {
    let spec = &q.spec;
    let mut per_key = vec![HashMap::new(); spec.limits.len()];
    match (&q.sql.limited, spec.form) {
        (Some(sql), Form::Lease) if !spec.limits.is_empty() => {
            let mut work = InWork::new(spec);
            work.add_counted(spec, &conn.query(&sql.in_work, &[Value::Time(now)])?);
            for (per_key, counted) in per_key.iter_mut().zip(work.per_limit()) {
                for (key, n) in counted {
                    per_key.insert(key.clone(), u64::from(*n));
                }
            }
        }
        _ => {
            // Every slot the rows in work may hold: below the max, and, after a lowered max
            // or a lift, above it too (the record's slot space, as read with the maxes).
            let slots = q.limits.last_slots(spec);
            for (i, limit) in spec.limits.iter().enumerate() {
                let space = slots.get(i).copied().unwrap_or(limit.max);
                let distinct: Vec<&str> = keys
                    .iter()
                    .map(|k| k[i].as_str())
                    .collect::<HashSet<_>>()
                    .into_iter()
                    .collect();
                let prefixes: Vec<String> = distinct
                    .iter()
                    .map(|key| slot_prefix(&spec.name, &limit.id, key))
                    .collect();
                let held = q.dialect.slots_held(conn, &prefixes, 0, space)?;
                for (key, held) in distinct.into_iter().zip(held) {
                    if held > 0 {
                        per_key[i].insert(key.to_string(), u64::from(held));
                    }
                }
            }
        }
    }
    let totals = per_key
        .iter()
        .map(|m| (Some(m.values().sum()), 0))
        .collect();
    Ok(Work {
        per_key,
        maxes: maxes.to_vec(),
        totals,
    })
}

/// A rate limit's window ending now: the claims in it, and the keys whose window is full.
struct Window {
    claimed: u64,
    full: HashSet<String>,
}

/// Each rate limit's window ending at `wall`, with `maxes` in force.
fn rate_windows(
    q: &Queue,
    conn: &mut dyn DbConn,
    wall: SystemTime,
    maxes: &[Option<u32>],
) -> Result<Vec<Window>, DbError> {
    let Some(sql) = &q.sql.rates else {
        return Ok(Vec::new());
    };
    let at = millis(wall);
    let mut out = Vec::with_capacity(q.spec.rates.len());
    for (r, max) in q.spec.rates.iter().zip(maxes) {
        let since = Value::Int(at - r.per_ms);
        let rows = conn.query(&sql.claimed, &[Value::Int(r.lim), since.clone()])?;
        let n = rows.first().and_then(|r| r.first()).and_then(Value::as_i64);
        let full = match max {
            None => HashSet::new(),
            Some(m) => {
                let m = Value::Int(i64::from(*m));
                conn.query(&sql.full, &[Value::Int(r.lim), since, m.clone(), m])?
                    .into_iter()
                    .filter_map(|row| match row.into_iter().next() {
                        Some(Value::Text(k)) => Some(k),
                        Some(Value::Bytes(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
                        _ => None,
                    })
                    .collect()
            }
        };
        out.push(Window {
            claimed: n.unwrap_or(0).max(0) as u64,
            full,
        });
    }
    Ok(out)
}

/// The maxes in force of the table's concurrency limits and rate limits, read from its record
/// on `conn` (empty for a kind the table has none of).
pub(crate) fn maxes_in_force(q: &Queue, conn: &mut dyn DbConn) -> Result<(Maxes, Maxes), DbError> {
    let sql = q.dialect.registry().limits;
    let limits = match q.spec.limits.is_empty() {
        true => Maxes::from([]),
        false => q.limits.read(&q.spec, conn, sql)?,
    };
    let rates = match q.spec.rates.is_empty() {
        true => Maxes::from([]),
        false => q.flow.rate_maxes.read(&q.spec, conn, sql)?,
    };
    Ok((limits, rates))
}
