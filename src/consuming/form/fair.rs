//! Fair claims ([`Table::fair`]): a claim's candidates come key by key, in a rotation over the
//! keys of the due rows. The claim reads the next keys after the one this broker served
//! last (wrapping to the first at the end, where the rows whose key is `NULL` take their
//! turn), then the first rows of each, and offers them a row per key per round: the first
//! row of every key, then the second of every key, and so on. Within a key the table's order
//! is kept. Each form takes from these candidates as from its usual ones.
//!
//! [`Table::fair`]: crate::Table::fair

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use super::SCAN_MAX;
use crate::dialect::DbConn;
use crate::error::DbError;
use crate::model::table::Form;
use crate::model::value::Value;
use crate::runtime::cursor::Key;
use crate::runtime::Ctx;

/// How many keys a claim reads at a time once its first read came to nothing it could take:
/// the rotation goes on past keys at their limit without a round trip per key.
const KEYS_ON: usize = 64;

/// One claim's walk through the fair rotation: batches of candidates ([`Scan::next`]), each
/// either the next keys after those this claim was offered, or more rows of keys whose first
/// rows were all in work. A claim walks on until it has what it came for, every key has been
/// offered once, or it has read [`SCAN_MAX`] rows: so a key with room is reached by the claim
/// that finds many keys at their limit before it, not a poll interval per few keys later, and
/// a key's rows past the first few in work are reached too (the row lock and advisory lock
/// forms, whose rows in work stay ready in the table).
pub(super) struct Scan {
    /// Keys wanted from the first read (a fair share of the claim's rows each).
    want: usize,
    /// Per key offered by this claim, by [`id`] (`Null`: the rows whose key is `NULL`): how
    /// it was read.
    keys: HashMap<String, Depth>,
    /// Rows read by this claim.
    read: usize,
    /// The rotation came back to keys already offered: no more new keys.
    round_done: bool,
    /// The first rows are read locked, passing by rows other claims hold ([`Scan::locked`]).
    locked: bool,
    /// Read locked: the rows the claim still wants ([`Scan::wanting`]).
    wanted: usize,
}

/// How a key's rows were read by a claim.
struct Depth {
    /// The key's value.
    value: Value,
    /// The rows its last read asked for (its first rows), and how many came.
    asked: usize,
    got: usize,
    /// The ids read.
    ids: HashSet<i64>,
    /// A row of it was taken ([`Scan::took`]): not read deeper.
    done: bool,
    /// Read after the key's cursor: the claim order positions `(run_at, id)` of the rows this
    /// claim chose of it, in the order offered, before any it passed by ([`Scan::offered`]),
    /// and whether one was passed by.
    chosen: Vec<Key>,
    passed: bool,
}

impl Scan {
    /// A scan for a claim of up to `want` rows.
    pub fn new(want: usize) -> Self {
        Scan {
            want: want.max(1),
            keys: HashMap::new(),
            read: 0,
            round_done: false,
            locked: false,
            wanted: want.max(1),
        }
    }

    /// The claim still wants `n` rows: a locked read asks for no more.
    pub fn wanting(&mut self, n: usize) {
        self.wanted = n;
    }

    /// Reads each key's first rows locked, passing by those another claim holds (`FOR UPDATE
    /// SKIP LOCKED`, the servers' lease claims): the rows it returns are this claim's to take.
    pub fn locked(mut self) -> Self {
        self.locked = true;
        self
    }

    /// Notes what became of a row this scan offered (`user`: its user columns; `at`: its
    /// claim order position): taken, or passed by (a limit or window of its keys had no
    /// room). The key's cursor moves past the rows taken before the first passed by
    /// ([`Scan::advance`]).
    pub fn offered(&mut self, ctx: &Ctx, user: &[Value], at: Option<Key>, taken: bool) {
        if !self.locked {
            return;
        }
        if let Some(d) = key_of(ctx, user).and_then(|k| self.keys.get_mut(&id(&k))) {
            match (taken, at) {
                (true, Some(at)) if !d.passed => d.chosen.push(at),
                (true, _) => {}
                (false, _) => d.passed = true,
            }
        }
    }

    /// Moves each key's cursor past the rows this claim chose of it and holds now (`taken`:
    /// the rows it leased and kept), up to the first it chose and does not hold (handed
    /// back, gone, or lost to a rate window): a row the cursor passed is read again only by
    /// the next read from the head.
    pub fn advance(&self, ctx: &Ctx, taken: &HashSet<i64>) {
        for (key, d) in &self.keys {
            let upto = d
                .chosen
                .iter()
                .take_while(|(_, row)| taken.contains(row))
                .max()
                .copied();
            if let Some(at) = upto {
                ctx.queue.flow.fair_moved(key.clone(), at);
            }
        }
    }

    /// Notes that a row of key `user` (its user columns) was taken: its rows are not read
    /// deeper.
    pub fn took(&mut self, ctx: &Ctx, user: &[Value]) {
        if let Some(d) = key_of(ctx, user).and_then(|k| self.keys.get_mut(&id(&k))) {
            d.done = true;
        }
    }

    /// The next candidates, `id, run_at, <user columns>` each, in the order to take them (a
    /// row of each key in turn); empty when the claim has walked as far as it may. `full(key)`:
    /// a key at a limit whatever its rows (a limit whose key is the fair key's: [`blocked`]):
    /// its rows are not read, first or deeper.
    pub fn next(
        &mut self,
        ctx: &Ctx,
        conn: &mut dyn DbConn,
        now: SystemTime,
        full: &dyn Fn(&Value) -> bool,
    ) -> Result<Vec<Vec<Value>>, DbError> {
        let deeper = self.deeper(ctx, conn, now, full)?;
        if !deeper.is_empty() {
            return Ok(deeper);
        }
        while !self.round_done && self.read < SCAN_MAX {
            let first = self.keys.is_empty();
            let want = if first { self.want } else { KEYS_ON };
            let (keys, wrapped) = next_keys(ctx, conn, want, now)?;
            let fresh: Vec<Value> = keys
                .into_iter()
                .filter(|k| !self.keys.contains_key(&id(k)))
                .collect();
            let null = wrapped && !self.keys.contains_key(&id(&Value::Null));
            if fresh.is_empty() && !null {
                self.round_done = true;
                break;
            }
            // Until a row is taken ([`served`]): the next read, of this claim or the next,
            // reads on past these keys.
            if let Some(last) = fresh.last() {
                ctx.queue.flow.served(Some(last.clone()));
            } else if null {
                ctx.queue.flow.served(None);
            }
            let mut offered: Vec<Value> = fresh;
            if null {
                offered.push(Value::Null);
            }
            for k in &offered {
                self.keys.insert(id(k), Depth::new(k.clone()));
            }
            offered.retain(|k| !full(k));
            if offered.is_empty() {
                continue;
            }
            // Rows per key: a fair share of the claim, and at least two (the first may be in
            // work). Read locked (the lease form's, which reads no row in work): exactly the
            // rows the claim still wants, spread over the keys (one each to the first keys
            // when fewer rows than keys are wanted), since a row locked and not taken is
            // passed by every other claim meanwhile, and by their keys' cursors.
            let asked: Vec<(Value, usize)> = match self.locked {
                true => {
                    let wanted = self.wanted.max(1);
                    offered.truncate(wanted);
                    let n = offered.len();
                    offered
                        .into_iter()
                        .enumerate()
                        .map(|(i, k)| (k, wanted / n + usize::from(i < wanted % n)))
                        .collect()
                }
                false => {
                    let per_key = self.want.div_ceil(offered.len()).max(2);
                    offered.into_iter().map(|k| (k, per_key)).collect()
                }
            };
            let rows = self.heads(ctx, conn, now, &asked)?;
            if !rows.is_empty() {
                return Ok(rows);
            }
        }
        Ok(Vec::new())
    }

    /// More rows of the keys none of whose rows read so far could be taken (in work, or held
    /// back by a limit narrower than the fair key), which may have more (their last read came
    /// back full) and are not at a limit of their own: twice as many as last time.
    fn deeper(
        &mut self,
        ctx: &Ctx,
        conn: &mut dyn DbConn,
        now: SystemTime,
        full: &dyn Fn(&Value) -> bool,
    ) -> Result<Vec<Vec<Value>>, DbError> {
        // Read locked, a key's rows are all claimable and all taken: none to read past (and
        // a deeper read would lock rows the claim may not take).
        if self.read >= SCAN_MAX || self.locked {
            return Ok(Vec::new());
        }
        let asked: Vec<(Value, usize)> = self
            .keys
            .values()
            .filter(|d| !d.done && d.got >= d.asked && d.asked > 0 && !full(&d.value))
            .map(|d| (d.value.clone(), (d.asked * 2).min(SCAN_MAX)))
            .collect();
        if asked.is_empty() {
            return Ok(Vec::new());
        }
        self.heads(ctx, conn, now, &asked)
    }

    /// The first rows of each of `asked` (key, rows), less the rows this claim read before:
    /// interleaved a row per key per round.
    fn heads(
        &mut self,
        ctx: &Ctx,
        conn: &mut dyn DbConn,
        now: SystemTime,
        asked: &[(Value, usize)],
    ) -> Result<Vec<Vec<Value>>, DbError> {
        let q = &ctx.queue;
        let (Some(fair), Some(_)) = (&q.spec.fair, &q.sql.fair) else {
            return Ok(Vec::new());
        };
        let per_cond = if q.spec.form == Form::Lease { 2 } else { 1 };
        let named: Vec<&(Value, usize)> = asked
            .iter()
            .filter(|(k, _)| !matches!(k, Value::Null))
            .collect();
        let null = asked.iter().find(|(k, _)| matches!(k, Value::Null));
        let locked = self.locked;
        let text = q.flow.fair_heads(named.len(), null.is_some(), locked, || {
            q.dialect
                .syntax()
                .fair_heads(&q.spec, named.len(), null.is_some(), locked)
        });
        let syntax = q.dialect.syntax();
        let cursored = crate::dialect::shared::Syntax::fair_cursor(&q.spec, locked);
        // A key's cursor, or the head of its range (before every row: the time columns start
        // at the epoch).
        let cursor = |k: &Value, params: &mut Vec<Value>| {
            if !cursored {
                return;
            }
            let (run_at, row) = q
                .flow
                .fair_cursor(&id(k))
                .unwrap_or((std::time::UNIX_EPOCH, i64::MIN));
            params.push(Value::Time(run_at));
            if !syntax.row_compare {
                params.push(Value::Time(run_at));
            }
            params.push(Value::Int(row));
        };
        let mut params = Vec::new();
        for (k, n) in &named {
            params.push(k.clone());
            cursor(k, &mut params);
            params.extend(vec![Value::Time(now); per_cond]);
            params.push(Value::Int(*n as i64));
        }
        if let Some((k, n)) = null {
            cursor(k, &mut params);
            params.extend(vec![Value::Time(now); per_cond]);
            params.push(Value::Int(*n as i64));
        }
        let rows = conn.query(&text, &params)?;
        self.read += rows.len();
        for (k, n) in asked {
            if let Some(d) = self.keys.get_mut(&id(k)) {
                d.asked = *n;
                d.got = 0;
            }
        }
        // Key by key as read; offered round by round.
        let col = 2 + fair.column;
        let mut by_key: Vec<Vec<Vec<Value>>> = Vec::new();
        let mut last: Option<Value> = None;
        for row in rows {
            let v = row.get(col).cloned().unwrap_or(Value::Null);
            let row_id = row.first().and_then(Value::as_i64).unwrap_or(0);
            let d = self
                .keys
                .entry(id(&v))
                .or_insert_with(|| Depth::new(v.clone()));
            d.got += 1;
            if !d.ids.insert(row_id) {
                continue;
            }
            if by_key.is_empty() || last.as_ref() != Some(&v) {
                by_key.push(Vec::new());
                last = Some(v);
            }
            if let Some(k) = by_key.last_mut() {
                k.push(row);
            }
        }
        if cursored {
            for (k, n) in asked {
                if self.keys.get(&id(k)).is_none_or(|d| d.got < *n) {
                    q.flow.fair_short(&id(k));
                }
            }
        }
        let mut out = Vec::with_capacity(self.want * 2);
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
}

impl Depth {
    fn new(value: Value) -> Self {
        Depth {
            value,
            asked: 0,
            got: 0,
            ids: HashSet::new(),
            done: false,
            chosen: Vec::new(),
            passed: false,
        }
    }
}

/// True if fair key `v` is held back whole by a limit whose key is the fair key's (its template
/// reads no column but the fair key's, or none): a concurrency limit or rate window this claim
/// found full (`tried`, the claim's marks). Reading more of its rows cannot help.
pub(super) fn blocked(ctx: &Ctx, tried: &HashSet<String>, v: &Value) -> bool {
    let spec = ctx.spec();
    let Some(fair) = &spec.fair else {
        return false;
    };
    let covers = |t: &crate::model::table::KeyTemplate| t.columns().all(|c| c == fair.column);
    let mut user = vec![Value::Null; spec.columns.len()];
    if let Some(slot) = user.get_mut(fair.column) {
        *slot = v.clone();
    }
    let limit_keys = crate::runtime::limits::InWork::keys(spec, &user);
    let limited = spec
        .limits
        .iter()
        .zip(&limit_keys)
        .enumerate()
        .any(|(i, (l, k))| covers(&l.template) && super::limit_keys::marked_full(tried, i, k));
    let rate_keys = super::rates::keys(ctx, &user);
    let rated = spec
        .rates
        .iter()
        .zip(&rate_keys)
        .enumerate()
        .any(|(i, (r, k))| covers(&r.template) && super::rates::marked_full(tried, i, k));
    limited || rated
}

/// A key's value as a map key: its type and value (a `Value` holds floats, so it is no `Eq`).
fn id(v: &Value) -> String {
    format!("{v:?}")
}

/// The fair key of a row whose user columns are `user` (`Null` for the `NULL` key).
fn key_of(ctx: &Ctx, user: &[Value]) -> Option<Value> {
    let fair = ctx.spec().fair.as_ref()?;
    Some(user.get(fair.column).cloned().unwrap_or(Value::Null))
}

/// The next `want` keys of the rotation, after the key served last (wrapping to the first), and
/// whether the round ended among them (the `NULL` key's turn).
fn next_keys(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    want: usize,
    now: SystemTime,
) -> Result<(Vec<Value>, bool), DbError> {
    let q = &ctx.queue;
    let Some(sql) = &q.sql.fair else {
        return Ok((Vec::new(), false));
    };
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
    if let Some(rotated) = cached {
        // Every key, read whole a moment ago: the rotation goes on from `after` in it.
        return Ok(rotated);
    }
    let keys = read_all(conn, after, want, &read_keys, q);
    q.flow.fair_keys_read();
    keys
}

/// Reads up to `max` keys after a key (or from the first): [`next_keys`]'s statement.
type ReadKeys<'a> =
    dyn Fn(&mut dyn DbConn, Option<&Value>, usize) -> Result<Vec<Value>, DbError> + 'a;

/// [`next_keys`]'s read from the database.
fn read_all(
    conn: &mut dyn DbConn,
    after: Option<Value>,
    want: usize,
    read_keys: &ReadKeys<'_>,
    q: &crate::runtime::Queue,
) -> Result<(Vec<Value>, bool), DbError> {
    let mut keys = read_keys(conn, after.as_ref(), want)?;
    // Short of `want` keys: the round ends here; the `NULL` key, then the first keys again.
    let wrapped = keys.len() < want;
    if wrapped {
        let first = match after {
            Some(_) => read_keys(conn, None, want - keys.len())?,
            None => Vec::new(),
        };
        // Both reads came up short: these are all the keys there are, the first read's before
        // `after` (in the database's order), then those after it.
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
    Ok((keys, wrapped))
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
