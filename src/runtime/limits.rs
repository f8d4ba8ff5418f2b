//! The concurrency limits in force for a table ([`Table::concurrency_limit`]): the described
//! `max` of each, or an operator's setting recorded in the table's record. Each claim of a
//! limited table reads the record, so a change is followed by the next claim of every broker.
//!
//! [`Table::concurrency_limit`]: crate::Table::concurrency_limit

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::dialect::DbConn;
use crate::error::DbError;
use crate::model::table::record::{limit_slots, limits_in_force, rates_in_force};
use crate::model::table::TableSpec;
use crate::model::value::Value;

/// The `max` in force of each of a table's limits, in the description's order (`None`:
/// lifted).
pub(crate) type Maxes = Arc<[Option<u32>]>;

/// What a record's text says of the limits, parsed once per text.
struct Parsed {
    text: String,
    maxes: Maxes,
    /// Concurrency limits: each one's slot space ([`limit_slots`]), in the description's order.
    slots: Arc<[u32]>,
    /// Concurrency limits: the keys (limit, rendered key) a claim found holding no slot at or
    /// above the max in force, under this text: their claims need not look again
    /// ([`LimitsInForce::clean`]). Bounded: forgotten whole past [`CLEAN_KEPT`].
    clean: HashSet<(usize, String)>,
    /// When this broker first read this text.
    seen_at: Instant,
}

/// The oldest a claim's reading of the record may be when it takes a slot: a claim that read
/// it longer ago reads it again first ([`Read::stale`]). So once a broker has known a record's
/// text this long, no claim of any broker still takes slots by the text before it, and a key
/// found holding no slot above its max then stays so until the text changes.
pub(crate) const CLAIM_STALE: Duration = Duration::from_secs(1);

/// A claim's reading of the concurrency limits: each limit's max in force and slot space, as
/// the record said, and when it was read.
#[derive(Clone)]
pub(crate) struct Read {
    pub maxes: Maxes,
    pub slots: Arc<[u32]>,
    pub at: Instant,
}

impl Read {
    /// True if it was read [`CLAIM_STALE`] ago or more: read it again before taking a slot.
    pub fn stale(&self) -> bool {
        self.at.elapsed() >= CLAIM_STALE
    }
}

/// How many keys' checks a table keeps before it forgets them all and checks again.
const CLEAN_KEPT: usize = 100_000;

/// The limits in force, parsed once per text of the record: the concurrency limits
/// ([`LimitsInForce::default`]) or the rate limits ([`LimitsInForce::rates`]).
#[derive(Default)]
pub(crate) struct LimitsInForce {
    last: Mutex<Option<Parsed>>,
    /// When a record's text was last given ([`LimitsInForce::of`]).
    read_at: Mutex<Option<Instant>>,
    rates: bool,
    /// The rows in work the last lease claim's turn counted (its own rows among them), and
    /// when ([`LimitsInForce::counted`]).
    work: Mutex<Option<(Instant, InWork)>>,
}

impl LimitsInForce {
    /// The rate limits' maxes in force.
    pub fn rates() -> Self {
        LimitsInForce {
            rates: true,
            ..LimitsInForce::default()
        }
    }

    /// The maxes by the record's text `description`: a limit the record does not hold keeps
    /// its described `max`. Limits are matched by what they are (a concurrency limit's
    /// template, a rate limit's template and window), never by their place in the list.
    pub fn of(&self, spec: &TableSpec, description: &str) -> Maxes {
        self.parsed(spec, description, |p| p.maxes.clone())
    }

    /// `read` of the parse of `description`, made now if the text is not the one parsed last
    /// (which also forgets the keys found clean under it).
    fn parsed<T>(&self, spec: &TableSpec, description: &str, read: impl Fn(&Parsed) -> T) -> T {
        *self.read_at.lock() = Some(Instant::now());
        let mut last = self.last.lock();
        if let Some(p) = &*last {
            if p.text == description {
                return read(p);
            }
        }
        let (maxes, slots): (Maxes, Arc<[u32]>) = match self.rates {
            false => {
                let recorded = limits_in_force(description);
                let spaces = limit_slots(description);
                let maxes = spec
                    .limits
                    .iter()
                    .map(|l| {
                        recorded
                            .iter()
                            .find(|(k, _)| *k == l.key)
                            .map_or(Some(l.max), |(_, m)| *m)
                    })
                    .collect();
                let slots = spec
                    .limits
                    .iter()
                    .map(|l| {
                        spaces
                            .iter()
                            .find(|(k, _)| *k == l.key)
                            .map_or(l.max, |(_, n)| *n)
                    })
                    .collect();
                (maxes, slots)
            }
            true => {
                let recorded = rates_in_force(description);
                let maxes = spec
                    .rates
                    .iter()
                    .map(|l| {
                        recorded
                            .iter()
                            .find(|((k, per), _)| *k == l.key && *per == l.per_ms)
                            .map_or(Some(l.max), |(_, m)| *m)
                    })
                    .collect();
                (maxes, Arc::from([]))
            }
        };
        let p = Parsed {
            text: description.to_string(),
            maxes,
            slots,
            clean: HashSet::new(),
            seen_at: Instant::now(),
        };
        let out = read(&p);
        *last = Some(p);
        out
    }

    /// The maxes of the record read last, if it was read less than `fresh` ago: a hint for a
    /// claim that reads them again before it decides. (A claim that finds its limits full
    /// takes no turn, where they are read again: without the age bound, it would go on
    /// choosing by maxes an operator has since raised.)
    pub fn last_within(&self, fresh: Duration) -> Option<Maxes> {
        let read_at = *self.read_at.lock();
        read_at.filter(|at| at.elapsed() < fresh)?;
        self.last.lock().as_ref().map(|p| p.maxes.clone())
    }

    /// Notes what a lease claim's turn counted in work, its own rows among them.
    pub fn counted(&self, work: &InWork) {
        *self.work.lock() = Some((Instant::now(), work.clone()));
    }

    /// What the last turn counted, if it counted less than `fresh` ago: a hint to choose rows
    /// by, for a claim whose turn counts again before it decides.
    pub fn work_within(&self, fresh: Duration) -> Option<InWork> {
        let work = self.work.lock();
        let (at, work) = work.as_ref()?;
        (at.elapsed() < fresh).then(|| work.clone())
    }

    /// The slot spaces of the record read last (the described maxes before any read).
    pub fn last_slots(&self, spec: &TableSpec) -> Arc<[u32]> {
        match self.last.lock().as_ref() {
            Some(p) => p.slots.clone(),
            None => spec.limits.iter().map(|l| l.max).collect(),
        }
    }

    /// True if a claim under the record read last found key `key` of limit `limit` holding no
    /// slot at or above the max in force ([`LimitsInForce::found_clean`]): with every claim
    /// since taking its slots below that max, none will until the record changes.
    pub fn clean(&self, limit: usize, key: &str) -> bool {
        self.last
            .lock()
            .as_ref()
            .is_some_and(|p| p.clean.contains(&(limit, key.to_string())))
    }

    /// Notes that key `key` of limit `limit` holds no slot at or above the max in force of the
    /// record read last: kept only once this broker has known that record twice
    /// [`CLAIM_STALE`] (a claim of another broker that read the record before may take a slot
    /// above the max until then: its reading is at most that old when it takes one, and the
    /// twice covers the time the taking itself takes).
    pub fn found_clean(&self, limit: usize, key: &str) {
        if let Some(p) = self.last.lock().as_mut() {
            if p.seen_at.elapsed() < CLAIM_STALE * 2 {
                return;
            }
            if p.clean.len() >= CLEAN_KEPT {
                p.clean.clear();
            }
            p.clean.insert((limit, key.to_string()));
        }
    }

    /// Reads the table's record on `conn` with `sql` (`(name) -> description`); a table with no
    /// record runs its described limits.
    pub fn read(
        &self,
        spec: &TableSpec,
        conn: &mut dyn DbConn,
        sql: &str,
    ) -> Result<Maxes, DbError> {
        let text = read_record(spec, conn, sql)?;
        Ok(self.of(spec, &text))
    }

    /// Reads the record as [`read`](Self::read) does: the maxes and the slot spaces.
    pub fn read_with_slots(
        &self,
        spec: &TableSpec,
        conn: &mut dyn DbConn,
        sql: &str,
    ) -> Result<Read, DbError> {
        let at = Instant::now();
        let text = read_record(spec, conn, sql)?;
        let (maxes, slots) = self.parsed(spec, &text, |p| (p.maxes.clone(), p.slots.clone()));
        Ok(Read { maxes, slots, at })
    }
}

/// The table's record's text, read on `conn` with `sql`; empty without one.
fn read_record(spec: &TableSpec, conn: &mut dyn DbConn, sql: &str) -> Result<String, DbError> {
    let rows = conn.query(sql, &[Value::Text(spec.name.clone())])?;
    Ok(match rows.first().and_then(|r| r.first()) {
        Some(Value::Text(s)) => s.clone(),
        Some(Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    })
}

/// The name of a concurrency limit's slot keys of `key` but for the slot's number: a key of the
/// limit named `limit` ([`LimitSpec::id`](crate::model::table::LimitSpec)) has its slots
/// `<prefix>0` .. `<prefix>{n-1}` (`n` its slot space), taken by the row lock and advisory lock
/// forms' claims and probed by operators' counts. Named by what the limit is, so two
/// descriptions that list a table's limits in another order share them.
///
/// Modelled in model/limits.pml (take_slots).
pub(crate) fn slot_prefix(table: &str, limit: &str, key: &str) -> String {
    format!("sqlbroker-limit:{table}:{limit}:{key}#")
}

/// Rows in work per key, one map per limit: what a claim counts against the maxes.
#[derive(Clone)]
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

    /// True if one of the limits `which` is at its max for its key among `keys`.
    pub fn full_at(&self, maxes: &[Option<u32>], keys: &[String], which: &[usize]) -> bool {
        which.iter().any(|&i| {
            let (Some(counts), Some(Some(max)), Some(key)) =
                (self.counts.get(i), maxes.get(i), keys.get(i))
            else {
                return false;
            };
            counts.get(key).copied().unwrap_or(0) >= *max
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
        self.add_n(keys, 1);
    }

    /// Counts `n` rows of `keys` in work.
    pub fn add_n(&mut self, keys: &[String], n: u32) {
        for (counts, key) in self.counts.iter_mut().zip(keys) {
            *counts.entry(key.clone()).or_insert(0) += n;
        }
    }

    /// Adds the rows of a count by key read with `LimitSql::in_work` (`count, <user
    /// columns>` each).
    pub fn add_counted(&mut self, spec: &TableSpec, rows: &[Vec<Value>]) {
        for row in rows {
            let n = row.first().and_then(Value::as_i64).unwrap_or(0);
            if n > 0 {
                let keys = InWork::keys(spec, row.get(1..).unwrap_or_default());
                self.add_n(&keys, u32::try_from(n).unwrap_or(u32::MAX));
            }
        }
    }

    /// The rows counted, per key, one map per limit.
    pub fn per_limit(&self) -> &[HashMap<String, u32>] {
        &self.counts
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
