//! A table description as the registry records it: JSON through a private serde mirror, so
//! [`Table`]'s own shape stays free, and the differences between two descriptions in words.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ColumnType, Form, Isolation, Role, Table, ROLES};

/// The record's format version this release reads, and writes for a table with flow control,
/// dependencies, outputs or checkpoints. A record of a newer format is refused
/// ([`crate::runtime::registry`]); a change that older releases could misread bumps it.
///
/// 3: limits' slot keys and rate limits' window slots are named by what each limit is (its
/// template, and a rate limit's window), not by its place among the table's limits; rate
/// limits' settings are kept by template and window; a concurrency limit keeps the slot space
/// its rows in work may hold (`limits_slots`). A release that reads format 2 would share no slot
/// with this one.
///
/// 4: named queues and job kinds ([`Table::queues`], [`Table::kinds`]): a release that reads
/// format 3 would claim every queue's and every kind's rows, running a handler on jobs that
/// are not its.
pub(crate) const FORMAT: i64 = 4;

/// The format of a record with concurrency or rate limits and no queues or kinds (see
/// [`FORMAT`]'s 3).
const FORMAT_LIMITS: i64 = 3;

/// The format of a record without concurrency limits: what releases before them read, so a
/// table that uses none stays readable by them.
const FORMAT_PLAIN: i64 = 1;

/// The format of a record with fair claims, dependencies, outputs or checkpoints but no limits:
/// nothing of format 3 concerns it, so releases that read format 2 keep reading it.
const FORMAT_NO_LIMITS: i64 = 2;

/// The limits in force by a record's text: each described limit's key and `max`, an operator's
/// setting overriding the described one (`None`: lifted). A record that does not read has
/// none (the registry's checks report it elsewhere).
pub(crate) fn limits_in_force(json: &str) -> Vec<(String, Option<u32>)> {
    let Ok(r) = serde_json::from_str::<Record>(json) else {
        return Vec::new();
    };
    r.concurrency_limits
        .iter()
        .map(|l| (l.key.clone(), r.limit_in_force(l)))
        .collect()
}

/// Each described concurrency limit's key and **slot space** by a record's text: the slots its
/// rows in work may hold, `0..n`, in the forms that take slot keys. A claim takes a slot below
/// the max in force; a lifted limit's rows take one below [`Table::MAX_CONCURRENCY`]; the space
/// is the largest of these any claim may have used since the record was written, so a claim
/// under a lowered max (or one set again after a lift) finds the rows still holding slots
/// above it.
pub(crate) fn limit_slots(json: &str) -> Vec<(String, u32)> {
    let Ok(r) = serde_json::from_str::<Record>(json) else {
        return Vec::new();
    };
    r.concurrency_limits
        .iter()
        .map(|l| (l.key.clone(), r.slot_space(l)))
        .collect()
}

/// The rate limits in force by a record's text: each described rate limit's key, window (ms)
/// and `max`, an operator's setting overriding the described one (`None`: lifted).
pub(crate) fn rates_in_force(json: &str) -> Vec<((String, i64), Option<u32>)> {
    let Ok(r) = serde_json::from_str::<Record>(json) else {
        return Vec::new();
    };
    r.rate_limits
        .iter()
        .map(|l| ((l.key.clone(), window_ms(l.per)), r.rate_in_force(l)))
        .collect()
}

/// A rate limit's window in milliseconds, as [`Table::validate`] counts it.
fn window_ms(per: Duration) -> i64 {
    per.as_millis().max(1) as i64
}

/// `json` with the operator's setting of concurrency limit `key` (`None`: lifted), or why it
/// cannot take one: the record does not read, or describes no such limit. The limit's slot
/// space grows to cover the max it had and the one it gets ([`limit_slots`]).
pub(crate) fn with_limit_set(json: &str, key: &str, max: Option<u32>) -> Result<String, String> {
    let mut r = read_record(json)?;
    let Some(limit) = r.concurrency_limits.iter().find(|l| l.key == key) else {
        let known = r
            .concurrency_limits
            .iter()
            .map(|l| l.key.as_str())
            .collect();
        return Err(no_such("concurrency limit", key, known));
    };
    let space = r.slot_space(limit).max(space_of(max));
    r.limits_set.insert(key.to_string(), max);
    r.keep_space(key, space, max);
    r.limits_version += 1;
    serde_json::to_string(&r).map_err(|e| e.to_string())
}

/// `new` (a description's record, `migrate`'s) with the slot spaces of `old` (the record it
/// replaces) kept for the limits both describe: the rows in work under the old record's maxes
/// still hold their slots.
pub(crate) fn with_slots_kept(old: &str, new: &str) -> String {
    let (Ok(old), Ok(mut r)) = (
        serde_json::from_str::<Record>(old),
        serde_json::from_str::<Record>(new),
    ) else {
        return new.to_string();
    };
    let spaces: Vec<(String, u32, u32)> = r
        .concurrency_limits
        .iter()
        .filter_map(|l| {
            let was = old.concurrency_limits.iter().find(|o| o.key == l.key)?;
            Some((l.key.clone(), old.slot_space(was), l.max))
        })
        .collect();
    for (key, was, max) in spaces {
        r.keep_space(&key, was.max(max), Some(max));
    }
    r.limits_version = old.limits_version + 1;
    serde_json::to_string(&r).unwrap_or_else(|_| new.to_string())
}

/// The slots a max uses: `0..max`, or `0..`[`Table::MAX_CONCURRENCY`] lifted.
fn space_of(max: Option<u32>) -> u32 {
    max.unwrap_or(Table::MAX_CONCURRENCY)
}

/// `json` with the operator's setting of the rate limit of `key` (`None`: lifted), the one of
/// window `per` where given: a key with two windows must name one. Or why it cannot take one.
pub(crate) fn with_rate_set(
    json: &str,
    key: &str,
    per: Option<Duration>,
    max: Option<u32>,
) -> Result<String, String> {
    let mut r = read_record(json)?;
    let of_key: Vec<i64> = r
        .rate_limits
        .iter()
        .filter(|l| l.key == key)
        .map(|l| window_ms(l.per))
        .collect();
    let per_ms = match (per.map(window_ms), of_key.as_slice()) {
        (_, []) => {
            let known = r.rate_limits.iter().map(|l| l.key.as_str()).collect();
            return Err(no_such("rate limit", key, known));
        }
        (None, [one]) => *one,
        (None, many) => {
            let windows: Vec<String> = many.iter().map(|ms| format!("{ms} ms")).collect();
            return Err(format!(
                "the table has {} rate limits of key {key:?} (windows {}): name the window (Broker::set_rate_window, sqlbroker limit --rate --per)",
                many.len(),
                windows.join(", ")
            ));
        }
        (Some(p), found) if found.contains(&p) => p,
        (Some(p), found) => {
            let windows: Vec<String> = found.iter().map(|ms| format!("{ms} ms")).collect();
            return Err(format!(
                "the table's rate limit {key:?} has no window of {p} ms (its windows: {})",
                windows.join(", ")
            ));
        }
    };
    // Written by template and window; a setting an earlier release kept by template alone is
    // replaced.
    r.rates_set.remove(key);
    r.rates_set
        .insert(crate::model::table::RateSpec::setting_key(key, per_ms), max);
    r.limits_version += 1;
    serde_json::to_string(&r).map_err(|e| e.to_string())
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn read_record(json: &str) -> Result<Record, String> {
    serde_json::from_str(json).map_err(|e| format!("the record does not read: {e}"))
}

/// Why a setting names no limit of the table: `known` are its limits' keys.
fn no_such(what: &str, key: &str, mut known: Vec<&str>) -> String {
    known.dedup();
    let known: Vec<String> = known.iter().map(|k| format!("{k:?}")).collect();
    format!(
        "the table has no {what} {key:?} (its {what}s: {})",
        if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        }
    )
}

impl Record {
    /// A concurrency limit's max in force: the operator's setting, else the described one.
    fn limit_in_force(&self, l: &RecordLimit) -> Option<u32> {
        self.limits_set.get(&l.key).copied().unwrap_or(Some(l.max))
    }

    /// A concurrency limit's slot space ([`limit_slots`]).
    fn slot_space(&self, l: &RecordLimit) -> u32 {
        let kept = self.limits_slots.get(&l.key).copied().unwrap_or(0);
        kept.max(space_of(self.limit_in_force(l)))
    }

    /// Keeps `space` as limit `key`'s slot space where its max in force `max` does not cover
    /// it.
    fn keep_space(&mut self, key: &str, space: u32, max: Option<u32>) {
        match space > space_of(max) {
            true => self.limits_slots.insert(key.to_string(), space),
            false => self.limits_slots.remove(key),
        };
    }

    /// A rate limit's max in force: the operator's setting (by template and window; an earlier
    /// release's by template alone, when the key has one window), else the described one.
    fn rate_in_force(&self, l: &RecordRate) -> Option<u32> {
        let ms = window_ms(l.per);
        let by_window = crate::model::table::RateSpec::setting_key(&l.key, ms);
        let one_window = self.rate_limits.iter().filter(|o| o.key == l.key).count() == 1;
        match self.rates_set.get(&by_window) {
            Some(set) => *set,
            None => match self.rates_set.get(&l.key) {
                Some(set) if one_window => *set,
                _ => Some(l.max),
            },
        }
    }
}

/// The JSON shape of a description. Field names are part of the record format.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    name: String,
    /// The form, for people and tools reading the registry; derived from `lease` and
    /// `advisory_lock` on reading.
    form: String,
    columns: Vec<RecordColumn>,
    /// Role renames: the role's default column name -> the column used.
    #[serde(default)]
    renames: BTreeMap<String, String>,
    #[serde(default)]
    lease: Option<Duration>,
    #[serde(default)]
    advisory_lock: Option<String>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    fifo: bool,
    #[serde(default)]
    isolation: Option<String>,
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    dedup: bool,
    #[serde(default)]
    priorities: bool,
    #[serde(default)]
    keep_completed: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    keep_dead: Option<Duration>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    concurrency_limits: Vec<RecordLimit>,
    /// Operators' settings of the limits' `max` ([`crate::Broker::set_concurrency_limit`]):
    /// key -> the max in force, `null` for a limit lifted. Not part of the description: two
    /// descriptions compare without it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    limits_set: BTreeMap<String, Option<u32>>,
    /// The slot space of a limit whose max in force does not cover it ([`limit_slots`]): key ->
    /// slots. Not part of the description.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    limits_slots: BTreeMap<String, u32>,
    /// How many times an operator's setting (or a migration) rewrote the limits: a number
    /// that only grows, so a record's text never repeats one a broker read before (a max set
    /// back to an earlier value is a new text, and what a broker noted under the earlier one
    /// is forgotten). Not part of the description.
    #[serde(default, skip_serializing_if = "is_zero")]
    limits_version: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    rate_limits: Vec<RecordRate>,
    /// Operators' settings of the rate limits' `max` ([`crate::Broker::set_rate_limit`]), as
    /// `limits_set`, by [`RateSpec::setting_key`](crate::model::table::RateSpec::setting_key)
    /// (template and window; an earlier release's by template alone).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    rates_set: BTreeMap<String, Option<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fair: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    dependencies: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    outputs: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    checkpoints: bool,
    /// Not part of the format's bump: a release before it reads the record, publishes rows
    /// without a trace context (the column is nullable) and claims them without reading it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    traceparent: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    queues: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    kinds: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct RecordRate {
    key: String,
    max: u32,
    per: Duration,
}

#[derive(Debug, Serialize, Deserialize)]
struct RecordLimit {
    key: String,
    max: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct RecordColumn {
    name: String,
    #[serde(rename = "type")]
    ty: String,
}

fn type_name(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Text => "text",
        ColumnType::Int => "int",
        ColumnType::Float => "float",
        ColumnType::Bytes => "bytes",
        ColumnType::Time => "time",
    }
}

fn isolation_name(i: Isolation) -> &'static str {
    match i {
        Isolation::ReadCommitted => "read committed",
        Isolation::RepeatableRead => "repeatable read",
        Isolation::Serializable => "serializable",
    }
}

impl Table {
    /// The description as the registry's JSON.
    pub(crate) fn to_record(&self) -> String {
        let renames = ROLES
            .iter()
            .filter_map(|r| {
                let to = self.renames[r.index()].as_ref()?;
                Some((r.default_name().to_string(), to.clone()))
            })
            .collect();
        let record = Record {
            name: self.name.clone(),
            form: self.form().name().to_string(),
            columns: self
                .columns
                .iter()
                .map(|(name, ty)| RecordColumn {
                    name: name.clone(),
                    ty: type_name(*ty).into(),
                })
                .collect(),
            renames,
            lease: self.lease,
            advisory_lock: self.advisory.clone(),
            group: self.group.clone(),
            fifo: self.fifo,
            isolation: self.isolation.map(|i| isolation_name(i).into()),
            max_attempts: self.max_attempts,
            dedup: self.dedup,
            priorities: self.priorities,
            keep_completed: self.keep_completed,
            keep_dead: self.keep_dead,
            concurrency_limits: self
                .limits
                .iter()
                .map(|(key, max)| RecordLimit {
                    key: key.clone(),
                    max: *max,
                })
                .collect(),
            limits_set: BTreeMap::new(),
            limits_slots: BTreeMap::new(),
            limits_version: 0,
            rate_limits: self
                .rates
                .iter()
                .map(|(key, max, per)| RecordRate {
                    key: key.clone(),
                    max: *max,
                    per: *per,
                })
                .collect(),
            rates_set: BTreeMap::new(),
            fair: self.fair.clone(),
            dependencies: self.dependencies,
            outputs: self.outputs,
            checkpoints: self.checkpoints,
            traceparent: self.traceparent,
            queues: self.queues,
            kinds: self.kinds,
        };
        // A struct of strings, numbers and maps with string keys always serialises.
        serde_json::to_string(&record).unwrap_or_default()
    }

    /// The description a record holds, or what is wrong with the record.
    pub(crate) fn from_record(json: &str) -> Result<Table, String> {
        let r: Record =
            serde_json::from_str(json).map_err(|e| format!("the record does not read: {e}"))?;
        let mut t = Table::new(r.name);
        for c in r.columns {
            let ty = match c.ty.as_str() {
                "text" => ColumnType::Text,
                "int" => ColumnType::Int,
                "float" => ColumnType::Float,
                "bytes" => ColumnType::Bytes,
                "time" => ColumnType::Time,
                other => return Err(format!("column {} has an unknown type {other:?}", c.name)),
            };
            t.columns.push((c.name, ty));
        }
        for (role, to) in r.renames {
            let Some(role) = ROLES.iter().find(|x| x.default_name() == role) else {
                return Err(format!("unknown column role {role:?}"));
            };
            t.renames[role.index()] = Some(to);
        }
        t.lease = r.lease;
        t.advisory = r.advisory_lock;
        t.group = r.group;
        t.fifo = r.fifo;
        t.isolation = match r.isolation.as_deref() {
            None => None,
            Some("read committed") => Some(Isolation::ReadCommitted),
            Some("repeatable read") => Some(Isolation::RepeatableRead),
            Some("serializable") => Some(Isolation::Serializable),
            Some(other) => return Err(format!("unknown isolation level {other:?}")),
        };
        t.max_attempts = r.max_attempts;
        t.dedup = r.dedup;
        t.priorities = r.priorities;
        t.keep_completed = r.keep_completed;
        t.keep_dead = r.keep_dead;
        t.limits = r
            .concurrency_limits
            .into_iter()
            .map(|l| (l.key, l.max))
            .collect();
        t.rates = r
            .rate_limits
            .into_iter()
            .map(|l| (l.key, l.max, l.per))
            .collect();
        t.fair = r.fair;
        t.dependencies = r.dependencies;
        t.outputs = r.outputs;
        t.checkpoints = r.checkpoints;
        t.traceparent = r.traceparent;
        t.queues = r.queues;
        t.kinds = r.kinds;
        Ok(t)
    }

    /// The format version of this description's record.
    pub(crate) fn record_format(&self) -> i64 {
        if self.queues || self.kinds {
            FORMAT
        } else if !self.limits.is_empty() || !self.rates.is_empty() {
            FORMAT_LIMITS
        } else if self.fair.is_some() || self.dependencies || self.outputs || self.checkpoints {
            FORMAT_NO_LIMITS
        } else {
            FORMAT_PLAIN
        }
    }

    /// The form in words, with what sets it: `row lock`, `lease 30s`,
    /// `advisory lock "accounts-{account}"`.
    pub(crate) fn form_words(&self) -> String {
        match (self.form(), self.lease, &self.advisory) {
            (Form::Lease, Some(d), _) => format!("lease {d:?}"),
            (Form::AdvisoryLock, _, Some(t)) => format!("advisory lock {t:?}"),
            (form, _, _) => form.name().to_string(),
        }
    }

    /// The form as it runs: a lease in the whole seconds it is written with.
    fn effective_form(&self) -> (Form, u64, Option<&str>) {
        let lease = self.lease.map_or(0, crate::model::schedule::lease_secs);
        (self.form(), lease, self.advisory.as_deref())
    }

    /// How `self` (a description in code) differs from `recorded`, one line each; empty when
    /// they describe the same table. Columns compare by name and type, in any order; options
    /// compare by what they make the queue do, so a description that spells a default out
    /// (`max_attempts(25)`, `READ COMMITTED`) or a lease or retention that rounds to the same
    /// whole seconds is the same table.
    pub(crate) fn differences(&self, recorded: &Table) -> Vec<String> {
        let mut out = Vec::new();
        if self.effective_form() != recorded.effective_form() {
            let (form, was) = (self.form_words(), recorded.form_words());
            out.push(format!("recorded as {was}, described as {form}"));
        }
        for (name, ty) in &recorded.columns {
            match self.columns.iter().find(|(n, _)| n == name) {
                None => out.push(format!(
                    "column {name} ({}) is recorded, not described",
                    type_name(*ty)
                )),
                Some((_, t)) if t != ty => out.push(format!(
                    "column {name} is recorded as {}, described as {}",
                    type_name(*ty),
                    type_name(*t)
                )),
                Some(_) => {}
            }
        }
        for (name, ty) in &self.columns {
            if !recorded.columns.iter().any(|(n, _)| n == name) {
                out.push(format!(
                    "column {name} ({}) is described, not recorded",
                    type_name(*ty)
                ));
            }
        }
        for role in ROLES {
            let (now, then) = (self.role_name(role), recorded.role_name(role));
            if now != then {
                out.push(format!(
                    "the {role:?} column is recorded as {then}, described as {now}"
                ));
            }
        }
        // An option compared as it runs (`same`), shown as given where the two differ.
        let mut option = |what: &str, same: bool, now: String, then: String| {
            if !same {
                out.push(format!("{what} is recorded as {then}, described as {now}"));
            }
        };
        let opt = |v: Option<String>| v.unwrap_or_else(|| "unset".into());
        option(
            "the group column",
            self.group == recorded.group,
            opt(self.group.clone()),
            opt(recorded.group.clone()),
        );
        option(
            "fifo",
            self.fifo == recorded.fifo,
            self.fifo.to_string(),
            recorded.fifo.to_string(),
        );
        let isolation = |t: &Table| t.isolation.unwrap_or(Isolation::ReadCommitted);
        option(
            "isolation",
            isolation(self) == isolation(recorded),
            opt(self.isolation.map(|i| isolation_name(i).into())),
            opt(recorded.isolation.map(|i| isolation_name(i).into())),
        );
        let attempts = |t: &Table| t.max_attempts.unwrap_or(Table::DEFAULT_MAX_ATTEMPTS);
        option(
            "max_attempts",
            attempts(self) == attempts(recorded),
            opt(self.max_attempts.map(|n| n.to_string())),
            opt(recorded.max_attempts.map(|n| n.to_string())),
        );
        option(
            "dedup",
            self.dedup == recorded.dedup,
            self.dedup.to_string(),
            recorded.dedup.to_string(),
        );
        option(
            "priorities",
            self.priorities == recorded.priorities,
            self.priorities.to_string(),
            recorded.priorities.to_string(),
        );
        // Kept for whole seconds, rounded up (`TableSpec::retention_secs`).
        let kept = |t: &Table| {
            t.keep_completed
                .map(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
        };
        option(
            "keep_completed",
            kept(self) == kept(recorded),
            opt(self.keep_completed.map(|d| format!("{d:?}"))),
            opt(recorded.keep_completed.map(|d| format!("{d:?}"))),
        );
        let dead = |t: &Table| {
            t.keep_dead
                .map(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
        };
        option(
            "keep_dead",
            dead(self) == dead(recorded),
            opt(self.keep_dead.map(|d| format!("{d:?}"))),
            opt(recorded.keep_dead.map(|d| format!("{d:?}"))),
        );
        // Limits compare as a set: the order they are given in changes nothing.
        let limits = |t: &Table| {
            let mut l = t.limits.clone();
            l.sort();
            l
        };
        let words = |l: Vec<(String, u32)>| {
            if l.is_empty() {
                return "none".to_string();
            }
            let l: Vec<String> = l.iter().map(|(k, m)| format!("{k:?} max {m}")).collect();
            l.join(", ")
        };
        option(
            "concurrency limits",
            limits(self) == limits(recorded),
            words(limits(self)),
            words(limits(recorded)),
        );
        let rates = |t: &Table| {
            let mut l: Vec<(String, u32, u128)> = t
                .rates
                .iter()
                .map(|(k, m, p)| (k.clone(), *m, p.as_millis()))
                .collect();
            l.sort();
            l
        };
        let rate_words = |l: Vec<(String, u32, u128)>| {
            if l.is_empty() {
                return "none".to_string();
            }
            let l: Vec<String> = l
                .iter()
                .map(|(k, m, p)| format!("{k:?} max {m} per {p} ms"))
                .collect();
            l.join(", ")
        };
        option(
            "rate limits",
            rates(self) == rates(recorded),
            rate_words(rates(self)),
            rate_words(rates(recorded)),
        );
        option(
            "fair",
            self.fair == recorded.fair,
            opt(self.fair.as_ref().map(|k| format!("{k:?}"))),
            opt(recorded.fair.as_ref().map(|k| format!("{k:?}"))),
        );
        option(
            "dependencies",
            self.dependencies == recorded.dependencies,
            self.dependencies.to_string(),
            recorded.dependencies.to_string(),
        );
        for (what, now, then) in [
            ("outputs", self.outputs, recorded.outputs),
            ("checkpoints", self.checkpoints, recorded.checkpoints),
            ("traceparent", self.traceparent, recorded.traceparent),
            ("queues", self.queues, recorded.queues),
            ("kinds", self.kinds, recorded.kinds),
        ] {
            option(what, now == then, now.to_string(), then.to_string());
        }
        out
    }

    /// The column that holds the lease deadline, under its role name.
    pub(crate) fn locked_until_column(&self) -> String {
        self.role_name(Role::LockedUntil)
    }

    /// The column that holds a cancel request (lease and advisory tables), under its role
    /// name.
    pub(crate) fn cancel_requested_column(&self) -> String {
        self.role_name(Role::CancelRequested)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Table {
        Table::new("orders")
            .text_column("account")
            .int_column("n")
            .float_column("f")
            .bytes_column("b")
            .group("customer")
            .fifo()
            .rename(Role::Payload, "body")
            .rename(Role::DeadReason, "why")
            .lease(Duration::from_millis(1500))
            .isolation(Isolation::RepeatableRead)
            .max_attempts(7)
            .dedup()
            .priorities()
            .keep_completed(Duration::from_secs(86_400))
    }

    /// Every option survives the record: the table read back is equal to the one written.
    /// (Fails if a field is left out of the mirror, e.g. `max_attempts`.)
    #[test]
    fn a_description_reads_back_equal() {
        for t in [
            full(),
            Table::new("plain"),
            Table::new("keyed")
                .text_column("k")
                .advisory_lock("acc-{k}\u{e9}{{}}"),
            Table::new("iso").isolation(Isolation::Serializable),
            Table::new("limited")
                .text_column("k")
                .concurrency_limit("{k}", 3)
                .concurrency_limit("", 9),
        ] {
            let json = t.to_record();
            assert_eq!(Table::from_record(&json).unwrap(), t, "{json}");
            assert!(t.differences(&t).is_empty());
        }
        let json = full().to_record();
        assert!(json.contains("\"form\":\"lease\""), "{json}");
        assert!(json.contains("\"renames\":{\"dead_reason\":\"why\",\"payload\":\"body\"}"));
    }

    /// A table with concurrency limits is recorded in format 2, which releases before limits
    /// refuse; one without keeps format 1. Limits compare as a set of key and max, and an
    /// operator's setting is no part of the description.
    #[test]
    fn limits_are_recorded_and_compared() {
        let plain = Table::new("t").text_column("k");
        let limited = plain
            .clone()
            .concurrency_limit("{k}", 2)
            .concurrency_limit("", 5);
        assert_eq!(plain.record_format(), 1);
        assert_eq!(limited.record_format(), 3);
        assert!(!plain.to_record().contains("concurrency_limits"));
        let swapped = plain
            .clone()
            .concurrency_limit("", 5)
            .concurrency_limit("{k}", 2);
        assert!(limited.differences(&swapped).is_empty());
        let other = plain
            .clone()
            .concurrency_limit("{k}", 3)
            .concurrency_limit("", 5);
        assert_eq!(
            other.differences(&limited),
            ["concurrency limits is recorded as \"\" max 5, \"{k}\" max 2, described as \"\" max 5, \"{k}\" max 3"]
        );
        assert_eq!(
            plain.differences(&limited),
            ["concurrency limits is recorded as \"\" max 5, \"{k}\" max 2, described as none"]
        );
        let set = with_limit_set(&limited.to_record(), "{k}", None).unwrap();
        let read = Table::from_record(&set).unwrap();
        assert!(limited.differences(&read).is_empty());
        assert_eq!(
            limits_in_force(&set),
            [("{k}".to_string(), None), (String::new(), Some(5))]
        );
    }

    /// Dependencies are recorded (format 2: an earlier release would settle the table's rows
    /// without releasing the jobs waiting on them), read back and compared.
    #[test]
    fn dependencies_are_recorded_and_compared() {
        let plain = Table::new("t");
        let waits = plain.clone().dependencies();
        assert_eq!((plain.record_format(), waits.record_format()), (1, 2));
        assert!(!plain.to_record().contains("dependencies"));
        let read = Table::from_record(&waits.to_record()).unwrap();
        assert!(read.has_dependencies());
        assert!(waits.differences(&read).is_empty());
        assert_eq!(
            plain.differences(&waits),
            ["dependencies is recorded as true, described as false"]
        );
    }

    /// The trace context column is recorded, read back and compared, in format 1: a release
    /// before it misreads nothing (it publishes without a trace context, into a nullable
    /// column). Fails (`false`) without the field in the record.
    #[test]
    fn traceparent_is_recorded_in_the_plain_format() {
        let plain = Table::new("t");
        let traced = plain.clone().traceparent();
        assert_eq!(traced.record_format(), 1);
        let read = Table::from_record(&traced.to_record()).unwrap();
        assert!(read.has_traceparent());
        assert!(traced.differences(&read).is_empty());
        assert_eq!(
            plain.differences(&traced),
            ["traceparent is recorded as true, described as false"]
        );
        let spec = traced.validate().unwrap();
        assert_eq!(spec.traceparent.as_deref(), Some("traceparent"));
        assert_eq!(plain.validate().unwrap().traceparent, None);
    }

    /// Outputs and checkpoints are recorded (format 2: an earlier release would settle the
    /// table's rows without their outputs), read back and compared.
    #[test]
    fn outputs_and_checkpoints_are_recorded_and_compared() {
        let plain = Table::new("t");
        let both = plain.clone().outputs().checkpoints();
        assert_eq!((plain.record_format(), both.record_format()), (1, 2));
        let read = Table::from_record(&both.to_record()).unwrap();
        assert!(read.has_outputs() && read.has_checkpoints());
        assert!(both.differences(&read).is_empty());
        assert_eq!(
            plain.differences(&both),
            [
                "outputs is recorded as true, described as false",
                "checkpoints is recorded as true, described as false"
            ]
        );
        let spec = both.validate().unwrap();
        assert_eq!(
            (spec.output.as_deref(), spec.checkpoint.as_deref()),
            (Some("output"), Some("checkpoint"))
        );
        assert_eq!(plain.validate().unwrap().output, None);
    }

    /// Rate limits and the fair key are recorded (format 2), read back, compared (rate limits
    /// as a set), and an operator's rate setting is kept apart from the description.
    #[test]
    fn rates_and_fair_are_recorded_and_compared() {
        let second = Duration::from_secs(1);
        let plain = Table::new("t").text_column("k");
        let rated =
            plain
                .clone()
                .rate_limit("{k}", 2, second)
                .rate_limit("", 9, Duration::from_secs(60));
        let fair = plain.clone().fair("{k}");
        assert_eq!(rated.record_format(), 3);
        assert_eq!(fair.record_format(), 2);
        assert!(!plain.to_record().contains("rate_limits"));
        assert!(!plain.to_record().contains("fair"));
        for t in [&rated, &fair] {
            let read = Table::from_record(&t.to_record()).unwrap();
            assert!(
                t.differences(&read).is_empty(),
                "{:?}",
                t.differences(&read)
            );
        }
        let swapped = plain
            .clone()
            .rate_limit("", 9, Duration::from_secs(60))
            .rate_limit("{k}", 2, second);
        assert!(rated.differences(&swapped).is_empty());
        let slower = plain
            .clone()
            .rate_limit("{k}", 2, Duration::from_secs(2))
            .rate_limit("", 9, Duration::from_secs(60));
        assert_eq!(
            slower.differences(&rated),
            [
                "rate limits is recorded as \"\" max 9 per 60000 ms, \"{k}\" max 2 per 1000 ms, \
              described as \"\" max 9 per 60000 ms, \"{k}\" max 2 per 2000 ms"
            ]
        );
        assert_eq!(
            plain.differences(&fair),
            ["fair is recorded as \"{k}\", described as unset"]
        );
        let set = with_rate_set(&rated.to_record(), "{k}", None, Some(7)).unwrap();
        assert!(rated
            .differences(&Table::from_record(&set).unwrap())
            .is_empty());
        assert_eq!(
            rates_in_force(&set),
            [
                (("{k}".to_string(), 1000), Some(7)),
                ((String::new(), 60_000), Some(9))
            ]
        );
        assert!(limits_in_force(&set).is_empty());
        assert!(with_rate_set(&set, "{x}", None, Some(1))
            .unwrap_err()
            .contains("no rate limit \"{x}\""));
        assert!(with_limit_set(&set, "{k}", Some(1))
            .unwrap_err()
            .contains("no concurrency limit \"{k}\""));
    }

    /// Two windows of one key are two limits: each is set by its window, a setting by key alone
    /// is refused as ambiguous, and an earlier release's setting by template is still read
    /// where the key has one window.
    #[test]
    fn two_windows_of_one_key_are_set_apart() {
        let (second, minute) = (Duration::from_secs(1), Duration::from_secs(60));
        let t = Table::new("t")
            .text_column("k")
            .rate_limit("{k}", 10, second)
            .rate_limit("{k}", 100, minute);
        let spec = t.validate().unwrap();
        assert_ne!(spec.rates[0].lim, spec.rates[1].lim);
        let json = t.to_record();
        assert!(with_rate_set(&json, "{k}", None, Some(5))
            .unwrap_err()
            .contains("2 rate limits of key \"{k}\""));
        assert!(
            with_rate_set(&json, "{k}", Some(Duration::from_secs(2)), Some(5))
                .unwrap_err()
                .contains("no window of 2000 ms")
        );
        let set = with_rate_set(&json, "{k}", Some(minute), Some(50)).unwrap();
        assert_eq!(
            rates_in_force(&set),
            [
                (("{k}".to_string(), 1000), Some(10)),
                (("{k}".to_string(), 60_000), Some(50))
            ]
        );
        // A setting as a format-2 record kept it: by template alone.
        let one = Table::new("t")
            .text_column("k")
            .rate_limit("{k}", 10, second)
            .to_record();
        let legacy = one.replace(
            "\"rate_limits\"",
            "\"rates_set\":{\"{k}\":3},\"rate_limits\"",
        );
        assert_eq!(
            rates_in_force(&legacy),
            [(("{k}".to_string(), 1000), Some(3))]
        );
        assert!(Table::new("t")
            .text_column("k")
            .rate_limit("{k}", 10, second)
            .rate_limit("{k}", 20, second)
            .validate()
            .unwrap_err()
            .to_string()
            .contains("given twice"));
    }

    /// A limit's slot space covers every max it had since the record was written: a lowered
    /// max keeps the old one's slots, a lift takes the whole range, a max set again keeps it;
    /// a migration keeps the space of the record it replaces; a raise within the space drops
    /// the note.
    #[test]
    fn the_slot_space_covers_every_max_the_limit_had() {
        let t = Table::new("t")
            .text_column("k")
            .concurrency_limit("{k}", 4)
            .concurrency_limit("", 10);
        let json = t.to_record();
        let space = |j: &str| {
            limit_slots(j)
                .into_iter()
                .map(|(_, n)| n)
                .collect::<Vec<_>>()
        };
        assert_eq!(space(&json), [4, 10]);
        let lowered = with_limit_set(&json, "{k}", Some(2)).unwrap();
        assert_eq!(space(&lowered), [4, 10]);
        let lifted = with_limit_set(&lowered, "{k}", None).unwrap();
        assert_eq!(space(&lifted), [Table::MAX_CONCURRENCY, 10]);
        let again = with_limit_set(&lifted, "{k}", Some(2)).unwrap();
        assert_eq!(space(&again), [Table::MAX_CONCURRENCY, 10]);
        assert_eq!(
            limits_in_force(&again),
            [("{k}".to_string(), Some(2)), (String::new(), Some(10))]
        );
        // `migrate` records the description again: the maxes as described, the space kept.
        let migrated = with_slots_kept(&lowered, &t.to_record());
        assert_eq!(space(&migrated), [4, 10]);
        let smaller = Table::new("t")
            .text_column("k")
            .concurrency_limit("{k}", 1)
            .concurrency_limit("", 10);
        assert_eq!(
            space(&with_slots_kept(&json, &smaller.to_record())),
            [4, 10]
        );
        // A limit both describe keeps its space, whatever else the new description drops.
        let added = Table::new("t").text_column("k").concurrency_limit("{k}", 3);
        assert_eq!(space(&with_slots_kept(&lifted, &added.to_record())), [1000]);
        let raised = with_limit_set(&lowered, "{k}", Some(8)).unwrap();
        assert_eq!(space(&raised), [8, 10]);
        assert!(!raised.contains("limits_slots"));
        // Set back to what it was: a text no broker read before.
        let back = with_limit_set(&raised, "{k}", Some(2)).unwrap();
        let again = with_limit_set(
            &with_limit_set(&back, "{k}", Some(8)).unwrap(),
            "{k}",
            Some(2),
        )
        .unwrap();
        assert_ne!(back, again);
        assert_eq!(limits_in_force(&back), limits_in_force(&again));
    }

    #[test]
    fn unreadable_records_are_refused() {
        assert!(Table::from_record("{")
            .unwrap_err()
            .contains("does not read"));
        let bad_type = r#"{"name":"t","form":"row lock","columns":[{"name":"c","type":"date"}]}"#;
        assert!(Table::from_record(bad_type)
            .unwrap_err()
            .contains("\"date\""));
        let bad_role = r#"{"name":"t","form":"row lock","columns":[],"renames":{"x":"y"}}"#;
        assert!(Table::from_record(bad_role).unwrap_err().contains("role"));
    }

    /// The defect of issue 16: a lease table opened as `Table::new(same)`. Each difference is
    /// named in words.
    #[test]
    fn differences_are_named() {
        let lease = Table::new("jobs")
            .text_column("k")
            .lease(Duration::from_secs(30));
        let plain = Table::new("jobs").text_column("k");
        assert_eq!(
            plain.differences(&lease),
            ["recorded as lease 30s, described as row lock"]
        );
        let other = Table::new("jobs")
            .int_column("k")
            .text_column("extra")
            .lease(Duration::from_secs(30))
            .max_attempts(3)
            .rename(Role::Payload, "body");
        assert_eq!(
            other.differences(&lease),
            [
                "column k is recorded as text, described as int",
                "column extra (text) is described, not recorded",
                "the Payload column is recorded as payload, described as body",
                "max_attempts is recorded as unset, described as 3",
            ]
        );
        // Options compare as they run: a default spelled out, or a lease or retention that
        // rounds to the same whole seconds, is the same table.
        let lease = |d| Table::new("jobs").lease(d);
        let same = [
            (
                lease(Duration::from_secs(30)),
                lease(Duration::from_millis(29_001)),
            ),
            (
                lease(Duration::from_millis(1)),
                lease(Duration::from_secs(1)),
            ),
            (
                Table::new("jobs").max_attempts(Table::DEFAULT_MAX_ATTEMPTS),
                Table::new("jobs"),
            ),
            (
                Table::new("jobs").isolation(Isolation::ReadCommitted),
                Table::new("jobs"),
            ),
            (
                Table::new("jobs").keep_completed(Duration::from_millis(86_399_500)),
                Table::new("jobs").keep_completed(Duration::from_secs(86_400)),
            ),
        ];
        for (a, b) in same {
            assert!(a.differences(&b).is_empty(), "{:?}", a.differences(&b));
            assert!(b.differences(&a).is_empty(), "{:?}", b.differences(&a));
        }
        // ... and what runs differently still differs.
        assert_eq!(
            lease(Duration::from_millis(30_001)).differences(&lease(Duration::from_secs(30))),
            ["recorded as lease 30s, described as lease 30.001s"]
        );
        assert_eq!(
            Table::new("jobs")
                .max_attempts(24)
                .differences(&Table::new("jobs")),
            ["max_attempts is recorded as unset, described as 24"]
        );
        assert_eq!(
            Table::new("jobs")
                .isolation(Isolation::Serializable)
                .differences(&Table::new("jobs")),
            ["isolation is recorded as unset, described as serializable"]
        );
        assert_eq!(
            Table::new("j")
                .keep_completed(Duration::from_millis(1_001))
                .differences(&Table::new("j").keep_completed(Duration::from_secs(1))),
            ["keep_completed is recorded as 1s, described as 1.001s"]
        );
        // Column order does not matter.
        let a = Table::new("t").text_column("x").int_column("y");
        let b = Table::new("t").int_column("y").text_column("x");
        assert!(a.differences(&b).is_empty());
    }
}
