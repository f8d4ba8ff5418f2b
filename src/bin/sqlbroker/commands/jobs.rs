//! `jobs`, `job` and `cancel`: a page of jobs, one job by id, for operators.

use std::time::SystemTime;

use sqlbroker::{Broker, ColumnType, JobFilter, JobState, Value};

use super::{columns, escape, json, page_end, preview, say, typed, utc, Result};
use crate::{BulkVerbArg, CancelArgs, JobArgs, JobsArgs, SignalArgs, StateArg};

/// The payload bytes a listing shows of each job (read by the database, not the whole).
const PAYLOAD_PREFIX: usize = 60;

/// `jobs`: a page of one state, narrowed by queue, kind and a column's value, as columns or
/// as a JSON array.
pub(super) fn jobs_list(broker: &Broker, args: &JobsArgs) -> Result {
    if let Some(verb) = args.verb {
        return bulk(broker, args, verb);
    }
    let table = args.page.table.open(broker)?;
    let state = state_of(args.state.unwrap_or(StateArg::Ready));
    let filter = filter_of(&table, args)?;
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

/// A state as the flags name it.
fn state_of(state: StateArg) -> JobState {
    match state {
        StateArg::Ready => JobState::Ready,
        StateArg::Scheduled => JobState::Scheduled,
        StateArg::InFlight => JobState::InFlight,
        StateArg::Dead => JobState::Dead,
        StateArg::Completed => JobState::Completed,
    }
}

/// The filter the flags give (queue, kind, a column's value, error text; not the state).
fn filter_of(table: &sqlbroker::Table, args: &JobsArgs) -> Result<JobFilter> {
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
    if let Some(e) = &args.error {
        filter = filter.error_contains(e);
    }
    Ok(filter)
}

/// The jobs one batch of a bulk verb reads (and a progress line says).
const BULK_BATCH: usize = 1_000;

/// `jobs cancel|requeue|delete`: prints how many jobs match, then (with `--yes`) acts on
/// every one in batches by id, one line per batch, and what it skipped; one entry in the
/// action log. Exit 1 if a job was skipped or the run failed part way (it says where to go
/// on from).
fn bulk(broker: &Broker, args: &JobsArgs, verb: BulkVerbArg) -> Result {
    let table = args.page.table.open(broker)?;
    let mut filter = filter_of(&table, args)?;
    if let Some(state) = args.state {
        filter = filter.in_state(state_of(state));
    }
    let what = escape(&filter.to_string());
    let name = escape(table.name());
    let count = broker.count_matching(&table, &filter)?;
    say(format_args!("{count} {what} of table {name} match now\n"))?;
    let word = match verb {
        BulkVerbArg::Cancel => "cancel",
        BulkVerbArg::Requeue => "requeue",
        BulkVerbArg::Delete => "delete",
    };
    if !args.yes {
        return say(format_args!(
            "nothing done: run again with --yes to {word} them\n"
        ));
    }
    let pass = sqlbroker::BulkPass::new()
        .after(args.page.after)
        .limit(usize::MAX)
        .time(std::time::Duration::MAX)
        .batch(BULK_BATCH)
        .row_wait(std::time::Duration::from_secs(args.row_wait))
        .by(&super::actions::who())
        .on_batch(|so_far| {
            let last = so_far.last().map_or("-".into(), |id| id.to_string());
            // Progress only: a closed standard output stops nothing.
            let _ = say(format_args!(
                "batch: {} done, {} skipped, up to job {last}\n",
                so_far.changed(),
                so_far.skipped().len()
            ));
        });
    let r = match verb {
        BulkVerbArg::Cancel => broker.cancel_matching(&table, &filter, &pass)?,
        BulkVerbArg::Requeue => broker.requeue_matching(&table, &filter, &pass)?,
        BulkVerbArg::Delete => broker.delete_matching(&table, &filter, &pass)?,
    };
    let done = match verb {
        BulkVerbArg::Cancel => "cancelled",
        BulkVerbArg::Requeue => "requeued",
        BulkVerbArg::Delete => "deleted",
    };
    say(format_args!(
        "{done} {} of {} read\n",
        r.changed(),
        r.seen()
    ))?;
    for (id, why) in r.skipped() {
        say(format_args!("skipped job {id}: {}\n", why.name()))?;
    }
    if let Some(e) = r.error() {
        let from = r
            .last()
            .map_or(String::new(), |id| format!(" (go on with --after {id})"));
        return Err(format!("stopped: {}{from}", escape(&crate::chain(e))).into());
    }
    if !r.skipped().is_empty() {
        return Err(format!("{} jobs skipped", r.skipped().len()).into());
    }
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
            "abandoned": j.abandoned(),
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
            "waits_for_signal": j.signal_wait().map(|w| serde_json::json!({
                "name": w.name(),
                "state": signal_state(w),
                "deadline": w.deadline().map(utc),
            })),
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
        ("abandoned", j.abandoned().to_string()),
        ("last_error", dash(j.last_error().map(escape))),
        ("dead_reason", dash(j.dead_reason().map(escape))),
        ("published_at", dash(time(j.published_at()))),
        ("due_at", utc(j.due_at())),
        ("finished_at", dash(time(j.finished_at()))),
        ("lease_until", dash(time(j.lease_until()))),
        ("cancel_requested", j.cancel_requested().to_string()),
        ("waits_on", waits_on(table.name(), j.waits_on())),
        ("waits_for_signal", dash(j.signal_wait().map(signal_wait))),
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

/// Where a job's wait for a signal stands, in a word.
pub(super) fn signal_state(w: &sqlbroker::SignalWait) -> &'static str {
    match (w.signal().is_some(), w.timed_out()) {
        (true, _) => "came",
        (false, true) => "timed out",
        (false, false) => "waiting",
    }
}

/// A job's wait for a signal, as `approved:7 (waiting, until 2026-12-07 10:00:00 UTC)`.
pub(super) fn signal_wait(w: &sqlbroker::SignalWait) -> String {
    let until = w
        .deadline()
        .filter(|_| w.waiting())
        .map(|d| format!(", until {}", utc(d)))
        .unwrap_or_default();
    format!("{} ({}{until})", escape(w.name()), signal_state(w))
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

/// `signal`: sends it, says how many jobs it released, and logs it.
pub(super) fn signal(broker: &Broker, args: &SignalArgs) -> Result {
    let table = args.table.open(broker)?;
    let released = broker.signal(&table, &args.name, args.payload.as_bytes())?;
    let detail = format!("signal {:?}", args.name);
    super::logged(broker, "signal", table.name(), &detail, released);
    say(format_args!(
        "signal {} sent on table {}: {released} job(s) released\n",
        escape(&args.name),
        table.name()
    ))
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
