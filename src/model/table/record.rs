//! A table description as the registry records it: JSON through a private serde mirror, so
//! [`Table`]'s own shape stays free, and the differences between two descriptions in words.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ColumnType, Form, Isolation, Role, Table, ROLES};

/// The record's format version this release reads, and writes for a table with concurrency
/// limits. A record of a newer format is refused ([`crate::runtime::registry`]); a change that
/// older releases could misread bumps it.
pub(crate) const FORMAT: i64 = 2;

/// The format of a record without concurrency limits: what releases before them read, so a
/// table that uses none stays readable by them.
const FORMAT_PLAIN: i64 = 1;

/// The limits in force by a record's text: each described limit's key and `max`, an operator's
/// setting overriding the described one (`None`: lifted). A record that does not read has
/// none (the registry's checks report it elsewhere).
pub(crate) fn limits_in_force(json: &str) -> Vec<(String, Option<u32>)> {
    in_force(json, |r| {
        let described = r.concurrency_limits.iter().map(|l| (l.key.clone(), l.max));
        (described.collect(), &r.limits_set)
    })
}

/// Each described limit `pick` gives of the record `json` (key and max), with the setting
/// of its settings map overriding the max.
fn in_force(
    json: &str,
    pick: impl FnOnce(&Record) -> (Vec<(String, u32)>, &BTreeMap<String, Option<u32>>),
) -> Vec<(String, Option<u32>)> {
    let Ok(r) = serde_json::from_str::<Record>(json) else {
        return Vec::new();
    };
    let (described, set) = pick(&r);
    described
        .into_iter()
        .map(|(key, max)| {
            let max = set.get(&key).copied().unwrap_or(Some(max));
            (key, max)
        })
        .collect()
}

/// The rate limits in force by a record's text: each described rate limit's key and `max`, an
/// operator's setting overriding the described one (`None`: lifted).
pub(crate) fn rates_in_force(json: &str) -> Vec<(String, Option<u32>)> {
    in_force(json, |r| {
        let described = r.rate_limits.iter().map(|l| (l.key.clone(), l.max));
        (described.collect(), &r.rates_set)
    })
}

/// `json` with the operator's setting of concurrency limit `key` (`None`: lifted), or why it
/// cannot take one: the record does not read, or describes no such limit.
pub(crate) fn with_limit_set(json: &str, key: &str, max: Option<u32>) -> Result<String, String> {
    with_set(json, "concurrency limit", key, max, |r| {
        (
            r.concurrency_limits.iter().map(|l| l.key.clone()).collect(),
            &mut r.limits_set,
        )
    })
}

/// `json` with the operator's setting of rate limit `key` (`None`: lifted), as
/// [`with_limit_set`].
pub(crate) fn with_rate_set(json: &str, key: &str, max: Option<u32>) -> Result<String, String> {
    with_set(json, "rate limit", key, max, |r| {
        (
            r.rate_limits.iter().map(|l| l.key.clone()).collect(),
            &mut r.rates_set,
        )
    })
}

/// The settings map `pick` gives of the record `json` (with the keys it describes), with
/// `key` set to `max`.
fn with_set(
    json: &str,
    what: &str,
    key: &str,
    max: Option<u32>,
    pick: impl FnOnce(&mut Record) -> (Vec<String>, &mut BTreeMap<String, Option<u32>>),
) -> Result<String, String> {
    let mut r: Record =
        serde_json::from_str(json).map_err(|e| format!("the record does not read: {e}"))?;
    let (known, set) = pick(&mut r);
    if !known.iter().any(|k| k == key) {
        let known: Vec<String> = known.iter().map(|k| format!("{k:?}")).collect();
        return Err(format!(
            "the table has no {what} {key:?} (its {what}s: {})",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ));
    }
    set.insert(key.to_string(), max);
    serde_json::to_string(&r).map_err(|e| e.to_string())
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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    concurrency_limits: Vec<RecordLimit>,
    /// Operators' settings of the limits' `max` ([`crate::Broker::set_concurrency_limit`]):
    /// key -> the max in force, `null` for a limit lifted. Not part of the description: two
    /// descriptions compare without it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    limits_set: BTreeMap<String, Option<u32>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    rate_limits: Vec<RecordRate>,
    /// Operators' settings of the rate limits' `max` ([`crate::Broker::set_rate_limit`]), as
    /// `limits_set`.
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
            concurrency_limits: self
                .limits
                .iter()
                .map(|(key, max)| RecordLimit {
                    key: key.clone(),
                    max: *max,
                })
                .collect(),
            limits_set: BTreeMap::new(),
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
        Ok(t)
    }

    /// The format version of this description's record.
    pub(crate) fn record_format(&self) -> i64 {
        if self.limits.is_empty()
            && self.rates.is_empty()
            && self.fair.is_none()
            && !self.dependencies
            && !self.outputs
            && !self.checkpoints
        {
            FORMAT_PLAIN
        } else {
            FORMAT
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
        assert_eq!(limited.record_format(), 2);
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
        assert_eq!(rated.record_format(), 2);
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
        let set = with_rate_set(&rated.to_record(), "{k}", Some(7)).unwrap();
        assert!(rated
            .differences(&Table::from_record(&set).unwrap())
            .is_empty());
        assert_eq!(
            rates_in_force(&set),
            [("{k}".to_string(), Some(7)), (String::new(), Some(9))]
        );
        assert!(limits_in_force(&set).is_empty());
        assert!(with_rate_set(&set, "{x}", Some(1))
            .unwrap_err()
            .contains("no rate limit \"{x}\""));
        assert!(with_limit_set(&set, "{k}", Some(1))
            .unwrap_err()
            .contains("no concurrency limit \"{k}\""));
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
