//! The concurrency limits in force for a table ([`Table::concurrency_limit`]): the described
//! `max` of each, or an operator's setting recorded in the table's record. Each claim of a
//! limited table reads the record, so a change is followed by the next claim of every broker.
//!
//! [`Table::concurrency_limit`]: crate::Table::concurrency_limit

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::dialect::DbConn;
use crate::error::DbError;
use crate::model::table::record::{limits_in_force, rates_in_force};
use crate::model::table::TableSpec;
use crate::model::value::Value;

/// The `max` in force of each of a table's limits, in the description's order (`None`:
/// lifted).
pub(crate) type Maxes = Arc<[Option<u32>]>;

/// The limits in force, parsed once per text of the record: the concurrency limits
/// ([`LimitsInForce::default`]) or the rate limits ([`LimitsInForce::rates`]).
#[derive(Default)]
pub(crate) struct LimitsInForce {
    last: Mutex<Option<(String, Maxes)>>,
    rates: bool,
}

impl LimitsInForce {
    /// The rate limits' maxes in force.
    pub fn rates() -> Self {
        LimitsInForce {
            last: Mutex::default(),
            rates: true,
        }
    }

    /// The maxes by the record's text `description`: a limit the record does not hold keeps
    /// its described `max`.
    pub fn of(&self, spec: &TableSpec, description: &str) -> Maxes {
        let mut last = self.last.lock();
        if let Some((text, maxes)) = &*last {
            if text == description {
                return maxes.clone();
            }
        }
        let (recorded, described): (_, Vec<(&str, u32)>) = match self.rates {
            false => (
                limits_in_force(description),
                spec.limits
                    .iter()
                    .map(|l| (l.key.as_str(), l.max))
                    .collect(),
            ),
            true => (
                rates_in_force(description),
                spec.rates.iter().map(|l| (l.key.as_str(), l.max)).collect(),
            ),
        };
        let maxes: Maxes = described
            .iter()
            .map(|(key, max)| {
                recorded
                    .iter()
                    .find(|(k, _)| k == key)
                    .map_or(Some(*max), |(_, m)| *m)
            })
            .collect();
        *last = Some((description.to_string(), maxes.clone()));
        maxes
    }

    /// The maxes of the record read last, if any: a hint for a claim that reads them again
    /// before it decides.
    pub fn last(&self) -> Option<Maxes> {
        self.last.lock().as_ref().map(|(_, m)| m.clone())
    }

    /// Reads the table's record on `conn` with `sql` (`(name) -> description`); a table with no
    /// record runs its described limits.
    pub fn read(
        &self,
        spec: &TableSpec,
        conn: &mut dyn DbConn,
        sql: &str,
    ) -> Result<Maxes, DbError> {
        let rows = conn.query(sql, &[Value::Text(spec.name.clone())])?;
        let text = match rows.first().and_then(|r| r.first()) {
            Some(Value::Text(s)) => s.clone(),
            Some(Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
            _ => String::new(),
        };
        Ok(self.of(spec, &text))
    }
}

/// The name of a concurrency limit's slot keys of `key` but for the slot's number: a key of
/// limit `limit` (the description's order) has `max` slots, `<prefix>0` .. `<prefix>{max-1}`,
/// taken by the row lock and advisory lock forms' claims and probed by operators' counts.
///
/// Modelled in model/limits.pml (take_slots).
pub(crate) fn slot_prefix(table: &str, limit: usize, key: &str) -> String {
    format!("sqlbroker-limit:{table}:{limit}:{key}#")
}

/// Rows in work per key, one map per limit: what a claim counts against the maxes.
pub(crate) struct InWork {
    counts: Vec<HashMap<String, u32>>,
}

impl InWork {
    pub fn new(spec: &TableSpec) -> Self {
        InWork {
            counts: vec![HashMap::new(); spec.limits.len()],
        }
    }

    /// The keys of a row whose user columns hold `user`, one per limit.
    pub fn keys(spec: &TableSpec, user: &[Value]) -> Vec<String> {
        spec.limits
            .iter()
            .map(|l| l.template.render(user))
            .collect()
    }

    /// True if every limit has room for one more row of `keys`.
    ///
    /// Modelled in model/limits.pml (count_and_choose).
    pub fn has_room(&self, maxes: &[Option<u32>], keys: &[String]) -> bool {
        self.counts
            .iter()
            .zip(maxes)
            .zip(keys)
            .all(|((counts, max), key)| match max {
                None => true,
                Some(m) => counts.get(key).copied().unwrap_or(0) < *m,
            })
    }

    /// True if a limit whose template reads no column (one key for the table) is full: no row
    /// can be claimed.
    pub fn table_full(&self, spec: &TableSpec, maxes: &[Option<u32>]) -> bool {
        spec.limits
            .iter()
            .zip(&self.counts)
            .zip(maxes)
            .any(|((l, counts), max)| {
                l.template.columns().next().is_none()
                    && max.is_some_and(|m| counts.values().sum::<u32>() >= m)
            })
    }

    /// True if a limit's count of one of `keys` is above its max (a row of `keys` counted in
    /// it must go back).
    ///
    /// Modelled in model/limits.pml (turn).
    pub fn over(&self, maxes: &[Option<u32>], keys: &[String]) -> bool {
        self.counts
            .iter()
            .zip(maxes)
            .zip(keys)
            .any(|((counts, max), key)| match max {
                None => false,
                Some(m) => counts.get(key).copied().unwrap_or(0) > *m,
            })
    }

    /// Takes a row of `keys` out of the count.
    pub fn remove(&mut self, keys: &[String]) {
        for (counts, key) in self.counts.iter_mut().zip(keys) {
            if let Some(n) = counts.get_mut(key) {
                *n = n.saturating_sub(1);
            }
        }
    }

    /// Counts a row of `keys` in work.
    pub fn add(&mut self, keys: &[String]) {
        for (counts, key) in self.counts.iter_mut().zip(keys) {
            *counts.entry(key.clone()).or_insert(0) += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::table::Table;

    fn spec() -> TableSpec {
        Table::new("t")
            .text_column("tenant")
            .concurrency_limit("{tenant}", 2)
            .concurrency_limit("", 3)
            .lease(std::time::Duration::from_secs(30))
            .validate()
            .unwrap()
    }

    /// Room is the described max until the record sets another; a lifted limit never binds;
    /// a full table-wide limit stops every key.
    #[test]
    fn room_follows_the_maxes_in_force() {
        let spec = spec();
        let in_force = LimitsInForce::default();
        let described = Table::new("t")
            .text_column("tenant")
            .concurrency_limit("{tenant}", 2)
            .concurrency_limit("", 3)
            .lease(std::time::Duration::from_secs(30))
            .to_record();
        let maxes = in_force.of(&spec, &described);
        assert_eq!(&*maxes, &[Some(2), Some(3)]);
        let mut work = InWork::new(&spec);
        let a = InWork::keys(&spec, &[Value::Text("a".into())]);
        let b = InWork::keys(&spec, &[Value::Text("b".into())]);
        assert_eq!(a, ["a", ""]);
        work.add(&a);
        assert!(work.has_room(&maxes, &a));
        work.add(&a);
        assert!(!work.has_room(&maxes, &a), "two of a are in work");
        assert!(work.has_room(&maxes, &b));
        assert!(!work.table_full(&spec, &maxes));
        work.add(&b);
        assert!(!work.has_room(&maxes, &b), "three in all");
        assert!(work.table_full(&spec, &maxes));
        // The operator lifts the per-tenant limit and raises the table's.
        let set =
            crate::model::table::record::with_limit_set(&described, "{tenant}", None).unwrap();
        let set = crate::model::table::record::with_limit_set(&set, "", Some(5)).unwrap();
        let maxes = in_force.of(&spec, &set);
        assert_eq!(&*maxes, &[None, Some(5)]);
        assert!(work.has_room(&maxes, &a));
        assert!(!work.table_full(&spec, &maxes));
        assert!(
            crate::model::table::record::with_limit_set(&set, "{other}", Some(1))
                .unwrap_err()
                .contains("no concurrency limit \"{other}\"")
        );
    }
}
