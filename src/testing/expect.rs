//! What was published, for a test to assert: [`published`] lists a table's jobs through the
//! operator's listing ([`Broker::jobs`]), [`Expect`] describes the jobs looked for, and
//! [`assert_published`] / [`assert_not_published`] panic with what the table holds.

use std::fmt::Write as _;

use crate::broker::Broker;
use crate::error::Result;
use crate::model::table::Table;
use crate::model::value::Value;
use crate::operating::jobs::{Job, JobState};

/// Jobs read per page of [`Broker::jobs`].
const PAGE: usize = 500;

/// The most jobs a failed assertion prints.
const SHOWN: usize = 20;

/// The most bytes of a payload a failed assertion prints.
const PAYLOAD_SHOWN: usize = 64;

/// Every job of `table`, lowest id first, whatever its state: scheduled, waiting, ready, in
/// flight, dead, and completed where the table keeps completed rows (an acked job of another
/// table is gone). Each as [`Broker::job`] reads it, read page by page through
/// [`Broker::jobs`]: a job that changes state meanwhile may be missed or read twice (once by
/// id is kept), so read it while nothing works on the table (after a drain, not during one).
///
/// # Errors
///
/// As [`Broker::jobs`]'s.
pub fn published(broker: &Broker, table: &Table) -> Result<Vec<Job>> {
    let mut all = Vec::new();
    // Row lock and advisory forms page the due rows as ready and in flight both: the same
    // rows twice, kept once below.
    for state in [
        JobState::Scheduled,
        JobState::Ready,
        JobState::InFlight,
        JobState::Dead,
        JobState::Completed,
    ] {
        let mut after = None;
        loop {
            let page = broker.jobs(table, state, after, PAGE)?;
            let full = page.len() == PAGE;
            after = page.last().map(Job::id);
            all.extend(page);
            if !full {
                break;
            }
        }
    }
    all.sort_by_key(Job::id);
    all.dedup_by_key(|j| j.id());
    Ok(all)
}

/// The jobs an assertion looks for: every condition given must hold (none given: any job).
///
/// ```
/// use sqlbroker::testing::Expect;
/// use sqlbroker::JobState;
///
/// let welcome = Expect::new()
///     .payload("welcome")
///     .column("to", "ada@example.com")
///     .state(JobState::Ready);
/// assert_eq!(
///     welcome.to_string(),
///     "payload b\"welcome\", to = \"ada@example.com\", state ready"
/// );
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[must_use]
pub struct Expect {
    payload: Option<Vec<u8>>,
    columns: Vec<(String, Value)>,
    state: Option<JobState>,
}

impl Expect {
    /// Any job.
    pub fn new() -> Self {
        Expect::default()
    }

    /// The payload is exactly these bytes.
    pub fn payload(mut self, payload: impl AsRef<[u8]>) -> Self {
        self.payload = Some(payload.as_ref().to_vec());
        self
    }

    /// The column `name` of the table's description holds `value`, compared as the job reads
    /// it ([`Job::get`]): a text column with [`Value::Text`] (`"a"`), an integer one with
    /// [`Value::Int`] (`7`, or `true` as 1), a `NULL` with [`Value::Null`]. A column the table
    /// does not have matches no job. Given again, the same column's last value counts.
    pub fn column(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.columns.retain(|(c, _)| c != name);
        self.columns.push((name.to_string(), value.into()));
        self
    }

    /// The job is in this state ([`Job::state`]: a job waiting on others is
    /// [`JobState::Waiting`], not scheduled).
    pub fn state(mut self, state: JobState) -> Self {
        self.state = Some(state);
        self
    }

    /// True if `job` meets every condition.
    pub fn matches(&self, job: &Job) -> bool {
        self.payload.as_deref().is_none_or(|p| job.payload() == p)
            && self.state.is_none_or(|s| job.state() == s)
            && self
                .columns
                .iter()
                .all(|(c, v)| job.get(c).is_some_and(|found| found == v))
    }
}

/// The conditions, comma-separated, every text escaped (control characters, quotes and
/// non-ASCII bytes of a payload as escapes): `any job` for none.
impl std::fmt::Display for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(p) = &self.payload {
            parts.push(format!("payload {}", bytes(p)));
        }
        for (c, v) in &self.columns {
            parts.push(format!("{} = {}", name(c), value(v)));
        }
        if let Some(s) = self.state {
            parts.push(format!("state {}", s.name()));
        }
        if parts.is_empty() {
            return f.write_str("any job");
        }
        f.write_str(&parts.join(", "))
    }
}

/// Panics unless a job of `table` matches `expect` ([`published`]); returns the jobs that
/// match, lowest id first. The panic's message lists what the table holds (the first 20 jobs,
/// every text escaped).
///
/// ```
/// use sqlbroker::testing::{assert_published, Expect};
/// use sqlbroker::{Broker, Message, Table};
/// use std::time::Duration;
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let emails = Table::new("emails").text_column("to").lease(Duration::from_secs(30));
/// broker.create_table(&emails)?;
/// broker.publish(&emails, Message::new(b"welcome".to_vec()).set("to", "ada@example.com"))?;
///
/// let found = assert_published(&broker, &emails, &Expect::new().column("to", "ada@example.com"));
/// assert_eq!(found[0].payload(), b"welcome");
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
///
/// # Panics
///
/// If no job matches, or the jobs cannot be read.
#[track_caller]
pub fn assert_published(broker: &Broker, table: &Table, expect: &Expect) -> Vec<Job> {
    let jobs = read(broker, table);
    let found: Vec<Job> = jobs.iter().filter(|j| expect.matches(j)).cloned().collect();
    if found.is_empty() {
        panic!(
            "no job of table {} matches: {expect}\n{}",
            name(table.name()),
            listing("the table holds", &jobs)
        );
    }
    found
}

/// Panics if a job of `table` matches `expect` ([`published`]), listing those that do (the
/// first 20, every text escaped).
///
/// # Panics
///
/// If a job matches, or the jobs cannot be read.
#[track_caller]
pub fn assert_not_published(broker: &Broker, table: &Table, expect: &Expect) {
    let jobs = read(broker, table);
    let found: Vec<Job> = jobs.into_iter().filter(|j| expect.matches(j)).collect();
    if !found.is_empty() {
        panic!(
            "{} of table {} {} expected none: {expect}\n{}",
            count(found.len()),
            name(table.name()),
            if found.len() == 1 {
                "matches,"
            } else {
                "match,"
            },
            listing("matching", &found)
        );
    }
}

/// [`published`], or a panic naming the table and the error.
#[track_caller]
fn read(broker: &Broker, table: &Table) -> Vec<Job> {
    match published(broker, table) {
        Ok(jobs) => jobs,
        Err(e) => panic!(
            "reading the jobs of table {}: {}",
            name(table.name()),
            e.to_string().escape_debug()
        ),
    }
}

/// `n job(s)`.
fn count(n: usize) -> String {
    if n == 1 {
        "1 job".into()
    } else {
        format!("{n} jobs")
    }
}

/// `what` and its jobs, one line each, the first [`SHOWN`].
fn listing(what: &str, jobs: &[Job]) -> String {
    if jobs.is_empty() {
        return "the table holds no job".into();
    }
    let mut out = format!("{what} {}:", count(jobs.len()));
    for job in jobs.iter().take(SHOWN) {
        let _ = write!(
            out,
            "\n  #{} {}, attempt {}, payload {}",
            job.id(),
            job.state().name(),
            job.attempts(),
            bytes(job.payload())
        );
        for (c, v) in job.values() {
            let _ = write!(out, ", {} = {}", name(c), value(v));
        }
        if let Some(e) = job.last_error() {
            let _ = write!(out, ", last error {:?}", e);
        }
        if let Some(r) = job.dead_reason() {
            let _ = write!(out, ", dead: {:?}", r);
        }
    }
    if jobs.len() > SHOWN {
        let _ = write!(out, "\n  ... and {} more", jobs.len() - SHOWN);
    }
    out
}

/// A table or column name, escaped as needed (names are checked identifiers, but a table named
/// by the caller is shown as given).
fn name(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    {
        s.to_string()
    } else {
        format!("{s:?}")
    }
}

/// Bytes as a byte string literal, escaped, its first [`PAYLOAD_SHOWN`] bytes.
fn bytes(b: &[u8]) -> String {
    let shown = &b[..b.len().min(PAYLOAD_SHOWN)];
    let mut s = format!("b\"{}\"", shown.escape_ascii());
    if shown.len() < b.len() {
        let _ = write!(s, "... ({} bytes)", b.len());
    }
    s
}

/// A value as a test would write it, escaped: `"text"`, `7`, `1.5`, `b"bytes"`, `NULL`.
fn value(v: &Value) -> String {
    match v {
        Value::Null => "NULL".into(),
        Value::Int(i) => i.to_string(),
        Value::Float(x) => format!("{x:?}"),
        Value::Text(s) => format!("{s:?}"),
        Value::Bytes(b) => bytes(b),
        Value::Time(t) => format!("{t:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expectations_print_escaped() {
        let e = Expect::new()
            .payload(b"a\n\x1b[31m\xff")
            .column("to", "x\"\u{7}")
            .column("n", 7)
            .column("n", 8)
            .column("gone", Value::Null);
        assert_eq!(
            e.to_string(),
            "payload b\"a\\n\\x1b[31m\\xff\", to = \"x\\\"\\u{7}\", n = 8, gone = NULL"
        );
        assert_eq!(Expect::new().to_string(), "any job");
        assert_eq!(name("a\nb"), "\"a\\nb\"");
        assert_eq!(
            bytes(&[b'x'; 70]),
            format!("b\"{}\"... (70 bytes)", "x".repeat(64))
        );
    }
}
