//! The fleet from the terminal: `workers` lists the subscriptions and workers running on the
//! database, in every process, from their heartbeats (`Broker::workers`).

use std::time::SystemTime;

use serde::Serialize;
use sqlbroker::{Broker, WorkerInfo, WorkerTable};

use super::{age, columns, escape, json, say, utc, Result};
use crate::WorkersArgs;

/// One member of `workers --json`: values as they are.
#[derive(Serialize)]
struct WorkerJson<'a> {
    id: &'a str,
    what: &'a str,
    host: &'a str,
    pid: u64,
    tables: Vec<TableJson<'a>>,
    started: String,
    last_seen: String,
    in_work: u64,
    handled: u64,
    stuck: u64,
    last_error: Option<&'a str>,
}

#[derive(Serialize)]
struct TableJson<'a> {
    table: &'a str,
    queues: Option<&'a [String]>,
    kinds: Option<&'a [String]>,
}

/// A table as one cell: `jobs[welcome,invoice]`, `jobs{mail}`, or `jobs` (every queue and
/// kind).
fn table_cell(t: &WorkerTable) -> String {
    let mut out = escape(t.name());
    if let Some(q) = t.queues() {
        let q: Vec<String> = q.iter().map(|s| escape(s)).collect();
        out.push_str(&format!("{{{}}}", q.join(",")));
    }
    if let Some(k) = t.kinds() {
        let k: Vec<String> = k.iter().map(|s| escape(s)).collect();
        out.push_str(&format!("[{}]", k.join(",")));
    }
    out
}

/// `workers`: the running subscriptions and workers, oldest first (with --table, those taking
/// rows of one of the tables named), as text or JSON.
pub(super) fn list(broker: &Broker, args: &WorkersArgs) -> Result {
    let all: Vec<WorkerInfo> = broker
        .workers()?
        .into_iter()
        .filter(|w| {
            args.tables.is_empty()
                || w.tables()
                    .iter()
                    .any(|t| args.tables.iter().any(|n| n == t.name()))
        })
        .collect();
    if args.json {
        let items: Vec<WorkerJson<'_>> = all
            .iter()
            .map(|w| WorkerJson {
                id: w.id(),
                what: w.what(),
                host: w.host(),
                pid: w.pid(),
                tables: w
                    .tables()
                    .iter()
                    .map(|t| TableJson {
                        table: t.name(),
                        queues: t.queues(),
                        kinds: t.kinds(),
                    })
                    .collect(),
                started: utc(w.started()),
                last_seen: utc(w.last_seen()),
                in_work: w.in_work(),
                handled: w.handled(),
                stuck: w.stuck(),
                last_error: w.last_error(),
            })
            .collect();
        return say(format_args!("{}\n", json(&items)));
    }
    if all.is_empty() {
        return say(format_args!("no subscription or worker running\n"));
    }
    let now = SystemTime::now();
    let mut rows = vec![[
        "WHAT",
        "HOST",
        "PID",
        "TABLES",
        "IN_WORK",
        "HANDLED",
        "STUCK",
        "SEEN",
        "STARTED",
        "LAST_ERROR",
    ]
    .map(String::from)
    .to_vec()];
    for w in &all {
        let tables: Vec<String> = w.tables().iter().map(table_cell).collect();
        rows.push(vec![
            escape(w.what()),
            escape(w.host()),
            w.pid().to_string(),
            tables.join(" "),
            w.in_work().to_string(),
            w.handled().to_string(),
            w.stuck().to_string(),
            format!(
                "{} ago",
                age(now.duration_since(w.last_seen()).unwrap_or_default())
            ),
            utc(w.started()),
            w.last_error().map_or_else(|| "-".to_string(), escape),
        ]);
    }
    say(format_args!("{}", columns(&rows)))
}
