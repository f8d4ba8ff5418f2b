//! A limited claim's later pages without the keys it found at their max. A claim reads its
//! candidates in claim order, up to 10,000 rows (`SCAN_MAX`); a key at its max whose backlog
//! lies ahead of every other key's rows, longer than that, hid them all: each claim read the
//! busy key's rows, passed them by and gave up, and the other keys ran only as fast as the busy
//! one's room opened (a tenant of ten held at its limit left the other nine 2-7% of their rate
//! alone). For a concurrency limit whose key reads one column, a claim leaves the keys it found
//! at their max out of its later pages by that column's value
//! ([`LimitSql::except`](crate::dialect::LimitSql::except)), or, for the `NULL` key, leaves
//! out the rows whose column is `NULL`. Every form uses it.

use std::collections::HashSet;

use crate::dialect::{except_index, ExceptSql, EXCEPT_CLASSES};
use crate::model::value::Value;

/// The values a claim leaves out, of one column.
pub(super) struct Except<'a> {
    list: &'a [ExceptSql],
    /// The entry chosen by the first key found at its max.
    chosen: Option<usize>,
    values: Vec<Value>,
    /// The `NULL` key is left out too.
    null: bool,
}

impl<'a> Except<'a> {
    pub fn new(list: &'a [ExceptSql]) -> Self {
        Except {
            list,
            chosen: None,
            values: Vec::new(),
            null: false,
        }
    }

    /// A row whose user columns hold `user` was passed by: its value (or the `NULL` key) is
    /// left out if `full` says one of the limits (their indices) of a one-column entry is at
    /// its max for it. One column a claim (the first found), up to `2^(EXCEPT_CLASSES - 1)`
    /// values.
    pub fn passed(&mut self, full: impl Fn(&[usize]) -> bool, user: &[Value]) {
        let most = 1usize << (EXCEPT_CLASSES - 1);
        for (i, e) in self.list.iter().enumerate() {
            if self.chosen.is_some_and(|c| c != i) || !full(&e.limits) {
                continue;
            }
            match user.get(e.column).unwrap_or(&Value::Null) {
                Value::Null => self.null = true,
                v if self.values.len() < most && !self.values.contains(v) => {
                    self.values.push(v.clone())
                }
                _ => {}
            }
            self.chosen = Some(i);
            return;
        }
    }

    /// [`Except::passed`] for the row lock and advisory forms, which mark a key found full
    /// in `tried` ([`marked_full`](super::limit_keys::marked_full)): `keys` are the row's
    /// limit keys, in the table's order of limits.
    pub fn passed_marked(&mut self, tried: &HashSet<String>, keys: &[String], user: &[Value]) {
        use super::limit_keys::marked_full;
        self.passed(
            |which| {
                which
                    .iter()
                    .any(|&i| keys.get(i).is_some_and(|k| marked_full(tried, i, k)))
            },
            user,
        );
    }

    /// The statement of a later page and its values (the last repeated to fill its size
    /// class), if a key was left out; `from` reads after the claim cursor.
    pub fn statement(&self, from: bool) -> Option<(&'a str, Vec<Value>)> {
        let e = self.list.get(self.chosen?)?;
        let (at, padded) = except_index(self.null, self.values.len())?;
        let stmt = match from {
            true => e.candidates_from.as_ref()?.get(at)?,
            false => e.candidates.get(at)?,
        };
        let mut values = self.values.clone();
        if let Some(last) = self.values.last() {
            values.resize(padded, last.clone());
        }
        Some((stmt.as_str(), values))
    }
}

/// The rows of a page not read before (`considered`: the ids read so far, which a later page
/// reads again from the head), in order.
pub(super) fn unread(rows: Vec<Vec<Value>>, considered: &mut HashSet<i64>) -> Vec<Vec<Value>> {
    rows.into_iter()
        .filter(|r| {
            r.first()
                .and_then(Value::as_i64)
                .is_none_or(|id| considered.insert(id))
        })
        .collect()
}
