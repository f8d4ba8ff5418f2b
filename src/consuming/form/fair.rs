//! Fair claims ([`Table::fair`]): a claim's candidates come key by key, in a rotation over the
//! keys of the due rows. The claim reads the next keys after the one this broker served
//! last (wrapping to the first at the end, where the rows whose key is `NULL` take their
//! turn), then the first rows of each, and offers them a row per key per round: the first
//! row of every key, then the second of every key, and so on. Within a key the table's order
//! is kept. Each form takes from these candidates as from its usual ones.
//!
//! [`Table::fair`]: crate::Table::fair

use std::time::{Duration, SystemTime};

use crate::dialect::DbConn;
use crate::error::DbError;
use crate::model::table::Form;
use crate::model::value::Value;
use crate::runtime::Ctx;

/// The fair claim's candidates for a claim of up to `want` rows at `now`: `id, run_at,
/// <user columns>` each, in the order to take them. Rows that turn out not to be claimable
/// (in work, a key at its limit) are passed by as usual, so each key offers a few rows more
/// than its share.
pub(super) fn candidates(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    want: usize,
    now: SystemTime,
) -> Result<Vec<Vec<Value>>, DbError> {
    let q = &ctx.queue;
    let (Some(sql), Some(fair)) = (&q.sql.fair, &q.spec.fair) else {
        return Ok(Vec::new());
    };
    let want = want.max(1);
    let times = |n: usize| vec![Value::Time(now); n];
    let per_cond = if q.spec.form == Form::Lease { 2 } else { 1 };
    let read_keys = |conn: &mut dyn DbConn, after: Option<&Value>, max: usize| {
        let mut params = vec![Value::Time(now)];
        if let Some(a) = after {
            params.push(a.clone());
        }
        params.push(Value::Time(now));
        params.push(Value::Int(max as i64));
        let sql = &sql.keys[usize::from(after.is_some())];
        conn.query(sql, &params).map(|rows| {
            rows.into_iter()
                .filter_map(|r| r.into_iter().next())
                .filter(|v| !matches!(v, Value::Null))
                .collect::<Vec<Value>>()
        })
    };
    let after = q.flow.fair_after();
    let cached = q
        .flow
        .fair_keys(KEYS_FRESH)
        .and_then(|all| rotate(&all, after.as_ref(), want));
    let (keys, wrapped) = match cached {
        // Every key, read whole a moment ago: the rotation goes on from `after` in it.
        Some(rotated) => rotated,
        None => {
            let mut keys = read_keys(conn, after.as_ref(), want)?;
            // Short of `want` keys: the round ends here; the `NULL` key, then the first keys
            // again.
            let wrapped = keys.len() < want;
            if wrapped {
                let first = match after {
                    Some(_) => read_keys(conn, None, want - keys.len())?,
                    None => Vec::new(),
                };
                // Both reads came up short: these are all the keys there are, the first
                // read's before `after` (in the database's order), then those after it.
                let every = after.is_none() || first.len() < want - keys.len();
                let mut all: Vec<Value> = first
                    .iter()
                    .filter(|k| !keys.contains(k))
                    .cloned()
                    .collect();
                all.extend(keys.iter().cloned());
                for k in first {
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
                if every {
                    q.flow.all_fair_keys(all);
                }
            }
            (keys, wrapped)
        }
    };
    if keys.is_empty() && !wrapped {
        return Ok(Vec::new());
    }
    // Until a row is taken ([`served`]): the next claim reads on past these keys, rather
    // than the same ones again should none of them have a row to take.
    q.flow.served(keys.last().cloned());
    let branches = keys.len() + usize::from(wrapped);
    // Rows per key: a fair share of the claim, and at least two (the first may be in work).
    let per_key = want.div_ceil(branches).max(2);
    let text = q.flow.fair_heads(keys.len(), wrapped, || {
        q.dialect.syntax().fair_heads(&q.spec, keys.len(), wrapped)
    });
    let mut params = Vec::new();
    for k in &keys {
        params.push(k.clone());
        params.extend(times(per_cond));
        params.push(Value::Int(per_key as i64));
    }
    if wrapped {
        params.extend(times(per_cond));
        params.push(Value::Int(per_key as i64));
    }
    let rows = conn.query(&text, &params)?;
    // Key by key as read; offered round by round.
    let col = 2 + fair.column;
    let mut by_key: Vec<Vec<Vec<Value>>> = Vec::new();
    let mut last: Option<Value> = None;
    for row in rows {
        let v = row.get(col).cloned().unwrap_or(Value::Null);
        if by_key.is_empty() || last.as_ref() != Some(&v) {
            by_key.push(Vec::new());
            last = Some(v);
        }
        if let Some(k) = by_key.last_mut() {
            k.push(row);
        }
    }
    let mut out = Vec::with_capacity(want * 2);
    let mut round = 0;
    loop {
        let mut any = false;
        for k in &mut by_key {
            if let Some(row) = k.get_mut(round) {
                out.push(std::mem::take(row));
                any = true;
            }
        }
        if !any {
            return Ok(out);
        }
        round += 1;
    }
}

/// How long a claim reuses the fair keys read whole by an earlier one instead of reading them
/// again: a key whose first rows appear meanwhile waits at most this long for its first turn.
const KEYS_FRESH: Duration = Duration::from_millis(100);

/// The keys to offer from `all` (every key, in the database's order): those after `after`,
/// then from the first, at most `want`; and whether the round ended among them (the `NULL`
/// key's turn). `None` if `after` is not among them (its rows are gone): read afresh.
fn rotate(all: &[Value], after: Option<&Value>, want: usize) -> Option<(Vec<Value>, bool)> {
    let start = match after {
        Some(a) => all.iter().position(|k| k == a)? + 1,
        None => 0,
    };
    let keys: Vec<Value> = all[start..]
        .iter()
        .chain(&all[..start])
        .take(want)
        .cloned()
        .collect();
    let wrapped = start + keys.len() >= all.len();
    Some((keys, wrapped))
}

/// Notes the key of the last row a claim took (`user`: its user columns): the next claim's
/// rotation starts after it. A `NULL` key ends the round: the next starts from the first key.
pub(super) fn served(ctx: &Ctx, user: &[Value]) {
    let Some(fair) = &ctx.spec().fair else {
        return;
    };
    let key = user
        .get(fair.column)
        .cloned()
        .filter(|v| !matches!(v, Value::Null));
    ctx.queue.flow.served(key);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(v: &[&str]) -> Vec<Value> {
        v.iter().map(|k| Value::Text((*k).into())).collect()
    }

    /// The rotation goes on after the key served last, wraps to the first, and says when the
    /// round ended among the keys offered; a key no longer there means a fresh read.
    #[test]
    fn the_rotation_goes_on_after_the_key_served_last() {
        let all = keys(&["a", "b", "c", "d"]);
        let b = Value::Text("b".into());
        let d = Value::Text("d".into());
        assert_eq!(rotate(&all, None, 2), Some((keys(&["a", "b"]), false)));
        assert_eq!(rotate(&all, Some(&b), 2), Some((keys(&["c", "d"]), true)));
        assert_eq!(
            rotate(&all, Some(&b), 3),
            Some((keys(&["c", "d", "a"]), true))
        );
        assert_eq!(
            rotate(&all, Some(&d), 8),
            Some((keys(&["a", "b", "c", "d"]), true))
        );
        assert_eq!(rotate(&all, Some(&Value::Text("x".into())), 2), None);
    }
}
