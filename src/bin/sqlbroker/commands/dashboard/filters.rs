//! What a listing's filter is and what an action on every job matching it does: the
//! filter read from a query or a form, how it is said (pages, the action log), and the call
//! each bulk verb makes per job. Below both the routes (`web`) and the pages.

use sqlbroker::{Broker, ColumnType, JobFilter, JobState, Table, Value};

use super::http::field;
use crate::commands::utc;

/// Jobs one batch of a bulk action reads (one page of the filtered listing).
pub(crate) const BATCH: usize = 100;
/// The most jobs one bulk action acts on: the operator sends it again for more.
pub(crate) const BULK_MAX: u64 = 1_000;
/// How long one bulk action may run before it stops at the end of a batch.
pub(crate) const BULK_TIME: std::time::Duration = std::time::Duration::from_secs(10);
/// Row lock form: how long "cancel all matching" waits for one job in work (its delivery
/// holds the row) before it leaves that job, reported by id, and goes on.
pub(crate) const ROW_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// The most ids of jobs left in work a bulk cancel's note names.
pub(crate) const BUSY_NAMED: usize = 20;

/// The filter of a table's listing, from a query or a form (`column`, `value`, `error`,
/// `queue`, `kind`): the
/// value typed as the column is (text, integer, float; other columns cannot be filtered),
/// or why it cannot be.
pub(crate) fn filter_of(table: &Table, fields: &[(String, String)]) -> Result<JobFilter, String> {
    let mut filter = JobFilter::new();
    let column = field(fields, "column").unwrap_or_default();
    if !column.is_empty() {
        let value = field(fields, "value").unwrap_or_default();
        let Some(ty) = table.columns().find(|(n, _)| *n == column).map(|(_, t)| t) else {
            return Err(format!("the table has no column {column:?}"));
        };
        let v = match ty {
            ColumnType::Text => Value::Text(value.to_string()),
            ColumnType::Int => Value::Int(
                value
                    .trim()
                    .parse()
                    .map_err(|_| format!("{column} is a whole number: {value:?} is not"))?,
            ),
            ColumnType::Float => Value::Float(
                value
                    .trim()
                    .parse()
                    .map_err(|_| format!("{column} is a number: {value:?} is not"))?,
            ),
            _ => return Err(format!("column {column} cannot be filtered on here")),
        };
        filter = filter.column(column, v);
    }
    let error = field(fields, "error").unwrap_or_default();
    if !error.is_empty() {
        filter = filter.error_contains(error);
    }
    let queue = field(fields, "queue").unwrap_or_default();
    if !queue.is_empty() {
        filter = filter.in_queue(queue);
    }
    let kind = field(fields, "kind").unwrap_or_default();
    if !kind.is_empty() {
        filter = filter.of_kind(kind);
    }
    Ok(filter)
}

/// A filter as the action log and the pages say it.
pub(crate) fn describe(state: JobState, filter: &JobFilter) -> String {
    let mut parts = vec![format!("{} jobs", state.name())];
    for (c, v) in filter.columns() {
        match v {
            Value::Text(t) => parts.push(format!("{c} = {t:?}")),
            v => parts.push(format!("{c} = {}", plain(v))),
        }
    }
    if let Some(q) = filter.queue() {
        parts.push(format!("queue {q:?}"));
    }
    if let Some(k) = filter.kind() {
        parts.push(format!("kind {k:?}"));
    }
    if let Some(e) = filter.error() {
        parts.push(format!("last error contains {e:?}"));
    }
    parts.join(", ")
}

/// An operator's call on one job by id: `true` if it changed the job.
pub(crate) type ByIdCall = fn(&Broker, &Table, i64) -> sqlbroker::Result<bool>;

/// What a bulk verb does to one job of a state: the call, and its past tense.
pub(crate) fn bulk_verb(verb: &str, state: JobState) -> Option<(ByIdCall, &'static str)> {
    Some(match (verb, state) {
        ("retry", JobState::Dead) => (Broker::requeue_dead, "requeued"),
        ("retry", JobState::Scheduled) => (Broker::run_now, "made due now"),
        ("delete", JobState::Dead) => (Broker::purge_dead, "deleted"),
        ("cancel", JobState::Completed) | ("retry" | "delete", _) => return None,
        ("cancel", _) => (Broker::cancel, "cancelled"),
        _ => return None,
    })
}

/// The verbs a bulk action offers on a state's page.
pub(crate) fn bulk_verbs(state: JobState) -> Vec<&'static str> {
    ["retry", "cancel", "delete"]
        .into_iter()
        .filter(|v| bulk_verb(v, state).is_some())
        .collect()
}

/// A value as plain text (a filter as the log says it).
pub(crate) fn plain(v: &Value) -> String {
    match v {
        Value::Null => "NULL".into(),
        Value::Int(n) => n.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Text(s) => s.clone(),
        Value::Time(t) => utc(*t),
        other => format!("{other:?}"),
    }
}
