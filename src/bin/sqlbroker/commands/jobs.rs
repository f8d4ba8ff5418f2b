//! `jobs`, `job` and `cancel`: a page of jobs, one job by id, for operators.

use std::time::SystemTime;

use sqlbroker::{Broker, ColumnType, JobFilter, JobState, Value};

use super::{columns, escape, json, page_end, preview, say, typed, utc, Result};
use crate::{CancelArgs, JobArgs, JobsArgs, StateArg};

/// The payload bytes a listing shows of each job (read by the database, not the whole).
const PAYLOAD_PREFIX: usize = 60;

/// `jobs`: a page of one state, narrowed by queue, kind and a column's value, as columns or
/// as a JSON array.
pub(super) fn jobs_list(broker: &Broker, args: &JobsArgs) -> Result {
    let table = args.page.table.open(broker)?;
    let state = match args.state {
        StateArg::Ready => JobState::Ready,
        StateArg::Scheduled => JobState::Scheduled,
        StateArg::InFlight => JobState::InFlight,
        StateArg::Dead => JobState::Dead,
        StateArg::Completed => JobState::Completed,
    };
    let mut filter = JobFilter::new();
    if let Some(q) = &args.queue {
        filter = filter.in_queue(q);
    }
    if let Some(k) = &args.kind {
        filter = filter.of_kind(k);
    }
    if let Some((column, text)) = &args.equals {
        let ty = table
            .columns()
            .find(|(c, _)| c == column)
            .map_or(ColumnType::Text, |(_, ty)| ty);
        filter = filter.column(column, typed(column, text, ty)?);
    }
    let limit = usize::try_from(args.page.limit).unwrap_or(usize::MAX);
    let page = broker.jobs_matching(
        &table,
        state,
        &filter,
        args.page.after,
        limit,
        PAYLOAD_PREFIX,
    )?;
    let what = state.name();
    if args.json {
        let rows: Vec<serde_json::Value> = page
            .iter()
            .map(|j| {
                serde_json::json!({
                    "table": table.name(),
                    "id": j.id(),
                    "state": j.state().name(),
                    "queue": table.has_queues().then(|| j.queue()),
                    "kind": j.kind(),
                    "attempts": j.attempts(),
                    "errors": j.errors(),
                    "last_error": j.last_error(),
                    "due_at": utc(j.due_at()),
                    "payload_len": j.payload_len(),
                    "payload": String::from_utf8_lossy(j.payload()),
                })
            })
            .collect();
        say(format_args!("{}\n", json(&rows)))?;
        page_end(page.len(), limit, page.last().map(|j| j.id()), what);
        return Ok(());
    }
    let mut head = vec!["ID", "STATE"];
    if table.has_queues() {
        head.push("QUEUE");
    }
    if table.has_kinds() {
        head.push("KIND");
    }
    head.extend(["ATTEMPTS", "DUE_AT", "LAST_ERROR", "PAYLOAD"]);
    let mut rows = vec![head.into_iter().map(String::from).collect::<Vec<_>>()];
    for j in &page {
        let mut row = vec![j.id().to_string(), j.state().name().to_string()];
        if table.has_queues() {
            row.push(escape(j.queue()));
        }
        if table.has_kinds() {
            row.push(j.kind().map_or("-".into(), escape));
        }
        row.extend([
            j.attempts().to_string(),
            utc(j.due_at()),
            j.last_error().map_or("-".into(), |e| preview(e.as_bytes())),
            preview(j.payload()),
        ]);
        rows.push(row);
    }
    say(format_args!("{}", columns(&rows)))?;
    page_end(page.len(), limit, page.last().map(|j| j.id()), what);
    Ok(())
}

/// `job`: one job, as text (one `field: value` line each) or as one JSON object.
pub(super) fn job(broker: &Broker, args: &JobArgs) -> Result {
    let table = args.table.open(broker)?;
    let id = args.id.get();
    let Some(j) = broker.job(&table, id)? else {
        return Err(format!("table {}: no job has id {id}", table.name()).into());
    };
    let time = |t: Option<SystemTime>| t.map(utc);
    if args.json {
        let values: serde_json::Map<String, serde_json::Value> = j
            .values()
            .iter()
            .map(|(c, v)| (c.clone(), json_value(v)))
            .collect();
        let out = serde_json::json!({
            "table": table.name(),
            "id": j.id(),
            "state": j.state().name(),
            "attempts": j.attempts(),
            "errors": j.errors(),
            "last_error": j.last_error(),
            "dead_reason": j.dead_reason(),
            "published_at": time(j.published_at()),
            "due_at": utc(j.due_at()),
            "finished_at": time(j.finished_at()),
            "lease_until": time(j.lease_until()),
            "cancel_requested": j.cancel_requested(),
            "waits_on": j.waits_on().iter().map(|d| serde_json::json!({
                "table": d.table,
                "id": d.id,
                "any_outcome": d.any_outcome,
                "outcome": d.outcome.map(outcome_word),
            })).collect::<Vec<_>>(),
            "dependents": j.dependents().iter().map(|(t, id)| serde_json::json!({
                "table": t,
                "id": id,
            })).collect::<Vec<_>>(),
            "payload": String::from_utf8_lossy(j.payload()),
            "output": j.output().map(String::from_utf8_lossy),
            "checkpoint": j.checkpoint().map(String::from_utf8_lossy),
            "traceparent": j.traceparent(),
            "values": values,
        });
        return say(format_args!("{}\n", json(&out)));
    }
    let dash = |s: Option<String>| s.unwrap_or_else(|| "-".into());
    let mut lines = vec![
        ("id", j.id().to_string()),
        ("state", j.state().name().to_string()),
        ("attempts", j.attempts().to_string()),
        ("errors", j.errors().to_string()),
        ("last_error", dash(j.last_error().map(escape))),
        ("dead_reason", dash(j.dead_reason().map(escape))),
        ("published_at", dash(time(j.published_at()))),
        ("due_at", utc(j.due_at())),
        ("finished_at", dash(time(j.finished_at()))),
        ("lease_until", dash(time(j.lease_until()))),
        ("cancel_requested", j.cancel_requested().to_string()),
        ("waits_on", waits_on(table.name(), j.waits_on())),
        ("dependents", jobs(table.name(), j.dependents())),
        ("payload", preview(j.payload())),
    ];
    if table.has_outputs() {
        lines.push(("output", dash(j.output().map(preview))));
    }
    if table.has_checkpoints() {
        lines.push(("checkpoint", dash(j.checkpoint().map(preview))));
    }
    if table.has_traceparent() {
        lines.push(("traceparent", dash(j.traceparent().map(escape))));
    }
    for (c, v) in j.values() {
        lines.push((c.as_str(), escape(&text_value(v))));
    }
    let mut out = String::new();
    for (k, v) in lines {
        out.push_str(&format!("{k}: {v}\n"));
    }
    say(format_args!("{out}"))
}

/// How a job another waits on ended, in words.
pub(super) fn outcome_word(o: sqlbroker::JobOutcome) -> &'static str {
    match o {
        sqlbroker::JobOutcome::Acked => "acked",
        sqlbroker::JobOutcome::DeadLettered => "dead",
        sqlbroker::JobOutcome::Cancelled => "cancelled",
        _ => "settled",
    }
}

/// A job as `12` in table `own`, `other/12` in another (table names are identifiers).
pub(super) fn job_ref(own: &str, table: &str, id: i64) -> String {
    match table == own {
        true => id.to_string(),
        false => format!("{table}/{id}"),
    }
}

/// The jobs a job of table `own` waits on, as `12 (acked), 13 (pending, any outcome)`; `-`
/// for none.
pub(super) fn waits_on(own: &str, deps: &[sqlbroker::Dependency]) -> String {
    if deps.is_empty() {
        return "-".into();
    }
    let each: Vec<String> = deps
        .iter()
        .map(|d| {
            let how = d.outcome.map_or("pending", outcome_word);
            let job = job_ref(own, &d.table, d.id);
            match d.any_outcome {
                true => format!("{job} ({how}, any outcome)"),
                false => format!("{job} ({how})"),
            }
        })
        .collect();
    each.join(", ")
}

/// Jobs as `12, other/13`; `-` for none.
fn jobs(own: &str, jobs: &[(String, i64)]) -> String {
    match jobs.is_empty() {
        true => "-".into(),
        false => jobs
            .iter()
            .map(|(t, id)| job_ref(own, t, *id))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// A column's value in JSON: numbers as numbers, text as text, bytes as lossy UTF-8.
pub(super) fn json_value(v: &Value) -> serde_json::Value {
    match v {
        Value::Null => serde_json::Value::Null,
        Value::Int(n) => (*n).into(),
        Value::Float(f) => (*f).into(),
        Value::Text(s) => s.clone().into(),
        other => text_value(other).into(),
    }
}

/// A column's value as text (`NULL` for SQL null), unescaped but for bytes.
fn text_value(v: &Value) -> String {
    match v {
        Value::Null => "NULL".into(),
        Value::Int(n) => n.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Text(s) => s.clone(),
        Value::Bytes(b) => preview(b),
        Value::Time(t) => utc(*t),
        #[allow(unreachable_patterns)]
        other => format!("{other:?}"),
    }
}

/// `cancel`: says what became of the job; exit 1 if there was none to cancel.
pub(super) fn cancel(broker: &Broker, args: &CancelArgs) -> Result {
    let table = args.table.open(broker)?;
    let id = args.id.get();
    if broker.cancel(&table, id)? {
        super::logged(broker, "cancel", table.name(), &format!("job {id}"), 1);
        say(format_args!("cancelled job {id}\n"))
    } else {
        Err(format!(
            "table {}: no live or dead job has id {id} (unknown, or finished)",
            table.name()
        )
        .into())
    }
}
